/* comm_nccl.c — the NCCL communicator (comm.h), built with make NCCL=1
 * (nccl.h and libnccl.so.2 from the CUDA toolkit's NCCL package; without
 * them this file compiles to nothing).
 *
 * One process, N GPUs: ncclCommInitAll makes one communicator per device,
 * and every collective is issued for all ranks inside one
 * ncclGroupStart / ncclGroupEnd — the way NCCL requires a single thread to
 * drive several devices (without the group, the first rank's call would
 * wait for ranks the thread has not reached yet). Each rank's call goes on
 * that rank's stream, so it is ordered after the rank's kernels and before
 * its next ones, and a stream capture of each rank's stream (the decode and
 * verify CUDA graphs) records it as a graph node (NCCL >= 2.9).
 *
 * The all-gather is a copy on every transport NCCL picks (NVLink, PCIe,
 * shared memory), so the canonical layout's bits do not depend on it; the
 * all-reduce's order is NCCL's (ring or tree by size), which is one more
 * reason the fast tp_reduce layout is the one that moves bits. */
#ifdef DS_HAVE_NCCL
#include "comm.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>

typedef struct {
    ncclComm_t   comm[DS_TP_MAX];
    cudaStream_t stream[DS_TP_MAX];
    int          dev[DS_TP_MAX];
} nccl_comm;

static void nccl_destroy(ds_comm *c) {
    nccl_comm *p = c->priv;
    if (p)
        for (int r = 0; r < c->n_ranks; r++)
            if (p->comm[r]) ncclCommDestroy(p->comm[r]);
    free(p);
    free(c);
}

static int nccl_fail(ncclResult_t rc, const char *what, char *err, size_t errlen) {
    ds_errf(err, errlen, "nccl: %s: %s", what, ncclGetErrorString(rc));
    return -1;
}

static int nccl_all_gather(ds_comm *c, ds_exec *const ex[], const float *const send[], float *const recv[],
                           size_t count, char *err, size_t errlen) {
    (void)ex;                    /* the streams were bound at creation */
    nccl_comm *p = c->priv;
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl_fail(rc, "ncclGroupStart", err, errlen);
    for (int r = 0; r < c->n_ranks; r++) {
        rc = ncclAllGather(send[r], recv[r], count, ncclFloat32, p->comm[r], p->stream[r]);
        if (rc != ncclSuccess) {
            (void)ncclGroupEnd();
            return nccl_fail(rc, "ncclAllGather", err, errlen);
        }
    }
    rc = ncclGroupEnd();
    return rc == ncclSuccess ? 0 : nccl_fail(rc, "ncclGroupEnd", err, errlen);
}

static int nccl_all_reduce_sum(ds_comm *c, ds_exec *const ex[], const float *const send[], float *const recv[],
                               size_t count, char *err, size_t errlen) {
    (void)ex;
    nccl_comm *p = c->priv;
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl_fail(rc, "ncclGroupStart", err, errlen);
    for (int r = 0; r < c->n_ranks; r++) {
        rc = ncclAllReduce(send[r], recv[r], count, ncclFloat32, ncclSum, p->comm[r], p->stream[r]);
        if (rc != ncclSuccess) {
            (void)ncclGroupEnd();
            return nccl_fail(rc, "ncclAllReduce", err, errlen);
        }
    }
    rc = ncclGroupEnd();
    return rc == ncclSuccess ? 0 : nccl_fail(rc, "ncclGroupEnd", err, errlen);
}

static const ds_comm_i nccl_comm_i = {
    .name = "nccl",
    .destroy = nccl_destroy,
    .all_gather = nccl_all_gather,
    .all_reduce_sum = nccl_all_reduce_sum,
};

ds_comm *ds_comm_nccl_new(int n, const int devices[], void *const streams[], char *err, size_t errlen) {
    if (n < 1 || n > DS_TP_MAX) {
        ds_errf(err, errlen, "nccl: %d ranks (1..%d)", n, DS_TP_MAX);
        return NULL;
    }
    int have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess) have = 0;
    for (int r = 0; r < n; r++)
        if (devices[r] < 0 || devices[r] >= have) {
            ds_errf(err, errlen, "--tp %d needs GPU %d but this host has %d", n, devices[r], have);
            return NULL;
        }
    ds_comm *c = calloc(1, sizeof *c);
    nccl_comm *p = calloc(1, sizeof *p);
    if (!c || !p) {
        free(p);
        free(c);
        ds_errf(err, errlen, "nccl: out of memory");
        return NULL;
    }
    for (int r = 0; r < n; r++) {
        p->dev[r] = devices[r];
        p->stream[r] = (cudaStream_t)streams[r];
    }
    c->i = &nccl_comm_i;
    c->n_ranks = n;
    c->priv = p;
    ncclResult_t rc = ncclCommInitAll(p->comm, n, p->dev);
    if (rc != ncclSuccess) {
        for (int r = 0; r < n; r++) p->comm[r] = NULL;   /* InitAll leaves none on failure */
        nccl_destroy(c);
        nccl_fail(rc, "ncclCommInitAll", err, errlen);
        return NULL;
    }
    return c;
}
#else
/* ISO C wants a translation unit to declare something. */
typedef int ds_comm_nccl_not_built;
#endif
