/* tp.h — tensor parallelism whose bits do not depend on the number of
 * ranks (issue 25, docs/TP.md).
 *
 * The plan is column-parallel everywhere: every matmul weight is split by
 * output rows, each rank computes complete dot products over the full K for
 * its slice (the same canonical kernel, hence the same bits as one device
 * computing that output), and an all-gather (a copy) assembles the
 * activation wherever the next op needs all of it:
 *
 *   xn ─ q/k/v (rank r: its KV heads, their query heads) ─ QK-norm ─ RoPE
 *      ─ KV write (its heads' rows, its own pool) ─ attention (its heads)
 *      ─ ALL-GATHER heads ─ o_proj (rows d/N) ─ ALL-GATHER
 *   x += o ; xn = ffn_norm(x)             (replicated: every rank, full rows)
 *   xn ─ gate/up (rows ff/N) ─ SwiGLU ─ ALL-GATHER ─ down (rows d/N)
 *      ─ ALL-GATHER
 *   x += down ; xn = next_norm(x)          (replicated)
 *
 * The `tp_reduce` family picks the layout: canonical is the one above;
 * fast is the classic row-parallel one (o_proj and down split by K: each
 * rank multiplies its heads' / its FFN slice's part of the row, and the N
 * partial sums meet in an all-reduce), two collectives a layer instead of
 * four — and a sum whose rounding depends on N.
 *
 * The embedding, the norms and the LM head run replicated (every rank holds
 * the full residual stream); rank 0's final norm is the context's. Dense
 * qwen3 / llama only: MoE, hybrid and deepseek4 models are refused. */
#ifndef DSPARK_TP_H
#define DSPARK_TP_H

#include "comm.h"
#include "kvpool.h"
#include "model.h"

/* Output rows of a weight slice are a multiple of this: the CPU's widest
 * packed tile (16 rows, matmul_q8_0.c's VNNI layout), so each rank's slice
 * is whole tiles, as a GPU kernel's row blocks would want too. */
#define DS_TP_ROW_ALIGN 16

typedef struct ds_tp ds_tp;

/* Whether model m can run at n ranks (on any backend: the ranks share its
 * one device): 0, or -1 with one line naming what does not divide (KV
 * heads, row slices) or what is not supported. */
int ds_tp_check(const ds_model *m, int n, char *err, size_t errlen);

/* n ranks on the model's device (host memory or not; every rank on it and
 * on the context ex, which they share and run on one after the other),
 * each with its weight slices (views of the loaded weights, prepared for
 * the device: the slices of all ranks together are one more copy of the
 * matmul weights), its KV heads' pool of n_pages pages on the device, and
 * activations for m_max rows on the device. comm (comm.h): "cpu" (host
 * memory only), "dev" (any backend), or NULL / "" for the default — cpu on
 * host memory, dev on a device. NULL with one line. */
ds_tp *ds_tp_new(const ds_model *m, ds_exec *ex, int n, const char *comm, int n_pages, int m_max, char *err,
                 size_t errlen);
void   ds_tp_free(ds_tp *t);
int    ds_tp_ranks(const ds_tp *t);
const char *ds_tp_comm(const ds_tp *t);      /* the communicator's name      */
/* One line for -v / bench: "ranks=<device>:0x<n> comm=<name>" (n ranks on
 * device 0 of the backend, e.g. "ranks=cuda:0x2 comm=dev"). */
void   ds_tp_describe(const ds_tp *t, char *buf, size_t n);

/* Collectives issued since the plan was made (probes' gathers included):
 * all-gathers, all-reduces, and the floats' bytes each rank received from
 * the others (an all-gather of w a rank: (N - 1) w; an all-reduce of n: n,
 * the ring's lower bound per rank). What a GPU run's links carry. */
typedef struct {
    long   gathers, reduces;
    double bytes;
} ds_tp_stats;
ds_tp_stats ds_tp_get_stats(const ds_tp *t);

/* ds_model_forward over the ranks: the rows of a (positions, ids, page
 * tables; their pool page ids are the ranks' page ids too), taps of the
 * listed layers from rank 0's residual stream, the final norm into a->xn.
 * pr (or NULL): the checkpoints ds_layer_forward reports, the same objects
 * with full rows (a rank-sliced one is all-gathered for the probe only; the
 * o_proj and down outputs carry the tp_reduce family's bit).
 * A failed collective, or var[DS_FAM_TP_REDUCE] fast where the K split is
 * not available, is kept and reported by ds_tp_error. */
void ds_tp_forward(ds_tp *t, ds_acts *a, const uint8_t var[DS_FAM_COUNT], int M, int pos0, const int *tap_layers,
                   int n_taps, float *taps, size_t taps_stride, const ds_probe *pr);
/* 0, or -1 with the kept error (cleared). */
int  ds_tp_error(ds_tp *t, char *err, size_t errlen);

/* Host copies of the KV rows [pos0, pos0 + n) of every layer, the ranks'
 * heads put back in head order: the layout of ds_ctx_read_kv. */
void ds_tp_read_kv(ds_tp *t, const ds_seq *seq, int pos0, int n, float *k, float *v);

/* Every rank's rows of the sequence's first n positions (snaps[0..ranks),
 * ds_state.tp), and their restore into the same pages. The snapshot is 0,
 * or -1 out of device memory (nothing kept then). */
int  ds_tp_snapshot(ds_tp *t, const ds_seq *seq, int n, ds_kv_snap snaps[]);
void ds_tp_restore(ds_tp *t, const ds_seq *seq, const ds_kv_snap snaps[]);

#endif
