/* comm.c — the one-process communicators (comm.h): `cpu`, N ranks on one
 * host, collectives as memcpy and a rank-ordered sum; `dev`, N ranks on one
 * device of any backend, the same collectives as the backend's copies and
 * its add op, queued on the ranks' shared execution context.
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

/* ---- dev: the ranks share one device and one execution context ----------
 * Why its bytes are the cpu fake's: all_gather moves the same bytes (a copy
 * computes nothing); all_reduce_sum makes the same sum in the same order —
 * staging = send[0], then staging = staging + send[s] for s = 1..N-1 with
 * backend.h's add (one rounded IEEE add per element, no fused operation:
 * the CPU's loop under -ffp-contract=off, CUDA's __fadd_rn) — which is the
 * fake's `sum[i] = sum[i] + send[s][i]` float for float. Everything is
 * queued on the one context, so each collective is ordered after the ranks'
 * work before it and before what follows, as comm.h requires, with no
 * synchronisation (a recorded launch sequence may hold it). */
typedef struct {
    ds_backend *be;
    float *sum;                  /* the all-reduce's staging, be's memory */
    size_t cap;
} dev_comm;

static void dev_destroy(ds_comm *c) {
    dev_comm *p = c->priv;
    if (p && p->sum) p->be->i->release(p->be, p->sum);
    free(p);
    free(c);
}

/* every rank's context the same one, on the communicator's backend */
static int dev_one_exec(const ds_comm *c, ds_exec *const ex[], char *err, size_t errlen) {
    const dev_comm *p = c->priv;
    for (int r = 0; r < c->n_ranks; r++)
        if (!ex[r] || ex[r] != ex[0] || ex[r]->be != p->be) {
            ds_errf(err, errlen, "comm dev: rank %d runs on another execution context than rank 0 (ranks on several "
                    "devices need the nccl communicator)", r);
            return -1;
        }
    return 0;
}

static int dev_all_gather(ds_comm *c, ds_exec *const ex[], const float *const send[], float *const recv[], size_t count,
                          char *err, size_t errlen) {
    if (dev_one_exec(c, ex, err, errlen)) return -1;
    /* up to DS_COPY_N_MAX copies an op (one launch on a GPU): no copy's
     * destination overlaps another's source — a destination is rank r's
     * slot s, a source rank s's own slot (or a buffer outside recv) */
    void *dst[DS_COPY_N_MAX];
    const void *src[DS_COPY_N_MAX];
    size_t bytes[DS_COPY_N_MAX];
    int q = 0;
    for (int r = 0; r < c->n_ranks; r++)
        for (int s = 0; s < c->n_ranks; s++) {
            float *d = recv[r] + (size_t)s * count;
            if (d == send[s]) continue;          /* in place: already there */
            dst[q] = d;
            src[q] = send[s];
            bytes[q] = count * sizeof(float);
            if (++q == DS_COPY_N_MAX) { ds_backend_copy_n(ex[r], q, dst, src, bytes); q = 0; }
        }
    if (q) ds_backend_copy_n(ex[0], q, dst, src, bytes);
    return 0;
}

static int dev_all_reduce_sum(ds_comm *c, ds_exec *const ex[], const float *const send[], float *const recv[],
                              size_t count, char *err, size_t errlen) {
    dev_comm *p = c->priv;
    if (dev_one_exec(c, ex, err, errlen)) return -1;
    if (count > p->cap) {
        ds_errf(err, errlen, "comm: all_reduce of %zu floats exceeds the %zu reserved", count, p->cap);
        return -1;
    }
    const ds_backend_i *b = p->be->i;
    /* rank order, one rounding per add: the cpu fake's sum */
    b->copy(ex[0], p->sum, send[0], count * sizeof(float));
    for (int s = 1; s < c->n_ranks; s++) b->add(ex[0], (int64_t)count, p->sum, send[s], p->sum);
    for (int r = 0; r < c->n_ranks; r++) b->copy(ex[r], recv[r], p->sum, count * sizeof(float));
    return 0;
}

static const ds_comm_i dev_comm_i = {
    .name = "dev",
    .destroy = dev_destroy,
    .all_gather = dev_all_gather,
    .all_reduce_sum = dev_all_reduce_sum,
};

ds_comm *ds_comm_dev_new(ds_backend *be, int n, size_t scratch_floats, char *err, size_t errlen) {
    if (n < 1 || n > DS_TP_MAX) {
        ds_errf(err, errlen, "comm: %d ranks (1..%d)", n, DS_TP_MAX);
        return NULL;
    }
    if (!be || !be->i->copy || !be->i->add) {
        ds_errf(err, errlen, "comm dev: the %s backend has no device copy / add op", be ? be->i->name : "(none)");
        return NULL;
    }
    ds_comm *c = calloc(1, sizeof *c);
    dev_comm *p = calloc(1, sizeof *p);
    if (p) {
        p->be = be;
        p->sum = be->i->alloc(be, (scratch_floats ? scratch_floats : 1) * sizeof(float));
    }
    if (!c || !p || !p->sum) {
        if (p && p->sum) be->i->release(be, p->sum);
        free(p);
        free(c);
        ds_errf(err, errlen, "comm dev: out of %s memory for the all_reduce staging", be->i->name);
        return NULL;
    }
    p->cap = scratch_floats;
    c->i = &dev_comm_i;
    c->n_ranks = n;
    c->priv = p;
    return c;
}

void ds_comm_free(ds_comm *c) {
    if (c) c->i->destroy(c);
}
