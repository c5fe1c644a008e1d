/* comm.h — the collectives tensor parallelism needs (tp.c, docs/TP.md).
 *
 * A communicator joins N ranks, one per device. One process drives all of
 * them (docs/TP.md says why), so every collective is ONE call that names
 * every rank's buffers and execution context at once:
 *
 *   all_gather      rank r contributes send[r] (count floats); every rank
 *                   receives the concatenation send[0] | send[1] | ... in
 *                   recv[r] (n_ranks * count floats, rank-major). A copy:
 *                   it moves bits and computes none, so the gathered
 *                   activation is bit for bit what one device would hold.
 *   all_reduce_sum  every rank receives recv[r][i] = the sum over ranks of
 *                   send[s][i]. Only the `fast` tp_reduce layout uses it:
 *                   its result depends on the number of ranks (a sum of N
 *                   partial dot products instead of one dot product).
 *
 * Implementations:
 *   cpu   (always) the one-process fake the CPU runs and CI tests: ranks are
 *         sequential on one host, the buffers are host memory, all_gather is
 *         memcpy, all_reduce adds the partials in rank order
 *         (((p0 + p1) + p2) + ...: one rounding per add, no fma), the order
 *         NCCL's ring need not keep — which is exactly why the canonical
 *         layout never reduces across ranks.
 *   dev   (always; comm.c) the ranks share one device and one execution
 *         context (ex[r] all the same: one stream) of any backend — host
 *         memory or not: all_gather is the backend's device-to-device copies
 *         (copy_n) queued on that context, no host round trip; all_reduce
 *         adds in rank order into a device staging buffer with the
 *         backend's `add` op (backend.h: y = a + b, one IEEE add per element,
 *         no fma — the CPU's -ffp-contract=off loop, CUDA's __fadd_rn), so
 *         its bytes are the cpu fake's on every backend. What `--tp N
 *         --device cuda` runs: N ranks on one GPU.
 *   nccl  (make NCCL=1; comm_nccl.c) ncclAllGather / ncclAllReduce on each
 *         rank's CUDA stream, issued inside one ncclGroupStart/End.
 *
 * Both are asynchronous with respect to the host in the same sense as the
 * backend's ops: the collective is ordered after what was queued on each
 * rank's context and before what is queued after it. Buffers are device
 * memory of each rank's device. send may alias recv[r] + r * count (the
 * in-place all-gather); for all_reduce_sum send[r] may equal recv[r]. */
#ifndef DSPARK_COMM_H
#define DSPARK_COMM_H

#include "backend.h"

#define DS_TP_MAX 8              /* ranks of one communicator (one host's GPUs) */

typedef struct ds_comm ds_comm;

typedef struct ds_comm_i {
    const char *name;            /* "cpu", "dev", "nccl"                         */
    void (*destroy)(ds_comm *c);
    /* 0, or -1 with one line (a NCCL error, a too wide all_reduce, dev's
     * ranks on different contexts) */
    int  (*all_gather)(ds_comm *c, ds_exec *const ex[], const float *const send[], float *const recv[],
                       size_t count, char *err, size_t errlen);
    int  (*all_reduce_sum)(ds_comm *c, ds_exec *const ex[], const float *const send[], float *const recv[],
                           size_t count, char *err, size_t errlen);
} ds_comm_i;

struct ds_comm {
    const ds_comm_i *i;
    int   n_ranks;
    void *priv;
};

/* The one-process fake: n ranks (1..DS_TP_MAX) whose buffers are host
 * memory (their contexts' backend must have host_memory). scratch_floats:
 * the widest all_reduce_sum it will be asked for (its staging: the sum is
 * made once, then copied to every rank, so send may alias recv). NULL with
 * one line. */
ds_comm *ds_comm_cpu_new(int n, size_t scratch_floats, char *err, size_t errlen);
void     ds_comm_free(ds_comm *c);

/* n ranks (1..DS_TP_MAX) sharing one device of backend be and one
 * execution context: every collective's ex[r] must be the same context, on
 * be (another is refused in one line: ranks on several devices need a
 * transport that orders their streams, NCCL). scratch_floats: the widest
 * all_reduce_sum (its staging, be's memory). be needs copy and add (every
 * backend dspark has). NULL with one line. */
ds_comm *ds_comm_dev_new(ds_backend *be, int n, size_t scratch_floats, char *err, size_t errlen);

#ifdef DS_HAVE_NCCL
/* NCCL over n GPUs of this host (devices[r]: rank r's CUDA device), one
 * communicator per rank made by ncclCommInitAll; streams[r] is rank r's
 * cudaStream_t (the stream of the context the rank's ops run on), passed as
 * void * so this header stays C without the CUDA headers. */
ds_comm *ds_comm_nccl_new(int n, const int devices[], void *const streams[], char *err, size_t errlen);
#endif

#endif
