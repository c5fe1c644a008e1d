/* comm.c — the one-process communicator fake (comm.h): N ranks on one
 * host, collectives as copies and a rank-ordered sum.
 *
 * Why it is a fair stand-in for NCCL in the tests: the canonical tensor
 * parallel layout only ever all-gathers, and an all-gather is a copy on
 * any transport — NCCL's ring or NVLink moves the same bytes memcpy
 * moves. So a CPU run at TP = N has exactly the bits a GPU run at TP = N
 * has on the GPU's kernels, and the TP-invariance tests that pass here
 * test the partition, not the transport. The all-reduce is different in
 * kind: its result is a sum whose order is the transport's business (NCCL
 * picks ring or tree by size); the fake fixes one order, rank order, and
 * the fast tp_reduce layout that uses it is the family that breaks TP
 * invariance either way. */
#include "comm.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    float *sum;                  /* the all-reduce's staging              */
    size_t cap;                  /* its floats                            */
} cpu_comm;

static void cpu_destroy(ds_comm *c) {
    cpu_comm *p = c->priv;
    if (p) free(p->sum);
    free(p);
    free(c);
}

static int cpu_all_gather(ds_comm *c, ds_exec *const ex[], const float *const send[], float *const recv[],
                          size_t count, char *err, size_t errlen) {
    (void)ex; (void)err; (void)errlen;
    const size_t b = count * sizeof(float);
    for (int r = 0; r < c->n_ranks; r++)
        for (int s = 0; s < c->n_ranks; s++) {
            float *dst = recv[r] + (size_t)s * count;
            if (dst != send[s]) memmove(dst, send[s], b);   /* in place: already there */
        }
    return 0;
}

static int cpu_all_reduce_sum(ds_comm *c, ds_exec *const ex[], const float *const send[], float *const recv[],
                              size_t count, char *err, size_t errlen) {
    (void)ex;
    cpu_comm *p = c->priv;
    if (count > p->cap) {
        ds_errf(err, errlen, "comm: all_reduce of %zu floats exceeds the %zu reserved", count, p->cap);
        return -1;
    }
    /* rank order, one rounding per add (the fake's fixed order; see above) */
    memcpy(p->sum, send[0], count * sizeof(float));
    for (int s = 1; s < c->n_ranks; s++)
        for (size_t i = 0; i < count; i++) p->sum[i] = p->sum[i] + send[s][i];
    for (int r = 0; r < c->n_ranks; r++) memcpy(recv[r], p->sum, count * sizeof(float));
    return 0;
}

static const ds_comm_i cpu_comm_i = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .all_gather = cpu_all_gather,
    .all_reduce_sum = cpu_all_reduce_sum,
};

ds_comm *ds_comm_cpu_new(int n, size_t scratch_floats, char *err, size_t errlen) {
    if (n < 1 || n > DS_TP_MAX) {
        ds_errf(err, errlen, "comm: %d ranks (1..%d)", n, DS_TP_MAX);
        return NULL;
    }
    ds_comm *c = calloc(1, sizeof *c);
    cpu_comm *p = calloc(1, sizeof *p);
    if (p) p->sum = malloc((scratch_floats ? scratch_floats : 1) * sizeof(float));
    if (!c || !p || !p->sum) {
        if (p) free(p->sum);
        free(p);
        free(c);
        ds_errf(err, errlen, "comm: out of memory");
        return NULL;
    }
    p->cap = scratch_floats;
    c->i = &cpu_comm_i;
    c->n_ranks = n;
    c->priv = p;
    return c;
}

void ds_comm_free(ds_comm *c) {
    if (c) c->i->destroy(c);
}
