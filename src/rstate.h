/* rstate.h — the recurrent state of hybrid models (qwen35), per sequence.
 *
 * A gated delta net layer carries, instead of K/V rows, one state per
 * sequence: the conv window (the K - 1 latest q|k|v inputs) and the
 * recurrence's S x S matrix per value head. It is not paged: it has the
 * same size at every position, and it cannot be cut at a position the way
 * a K/V table is truncated — a state exists only for the position it was
 * computed at.
 *
 * Rollback of rejected draft rows is checkpoint + replay, double-buffered:
 * each slot holds two states. A forward's run of a sequence's rows [p0, p1]
 * reads the current state (after p0 positions) and writes the state after
 * p1 into the other buffer, which becomes current; the one it read stays as
 * the checkpoint (base = p0), and the run's inputs to every recurrent layer
 * (the raw conv input, alpha and beta rows: C + 2 Hv floats a row) are
 * logged when the run is at most `cap` rows (a verify block). Rolling back
 * to n in (base, p1] replays rows [base, n) from the checkpoint through the
 * same gdn kernels (layer_hybrid.c ds_gdn_replay) into the current buffer:
 * the canonical rows are decode's rows, so the state is bit for bit the one
 * decode has after those tokens. n = base needs no replay at all.
 *
 * Why not keep every row's state (the other way, measured in
 * bench/gdn_rollback.c): a verify of L rows would write L states instead of
 * one — on a Qwen3.5-9B-like layer 8 x 2 MiB of stores per layer per
 * round — and hold L + 1 states per sequence; the checkpoint holds two
 * and logs L input rows (a few KiB), and pays a replay of the accepted rows
 * only when a draft was rejected.
 *
 * Memory is a backend buffer (host memory: the layer computes the state
 * pointers on the host). */
#ifndef DSPARK_RSTATE_H
#define DSPARK_RSTATE_H

#include "backend.h"

typedef struct ds_rstate {
    ds_backend *be;
    int     n_slot;            /* sequence slots                                  */
    int     cap;               /* rows a run may have and still be rolled back into */
    int     n_rec;             /* recurrent layers                                */
    size_t  conv_n, ssm_n;     /* floats per layer: conv window, recurrence state */
    size_t  state_n;           /* floats of one state: n_rec * (conv_n + ssm_n)   */
    size_t  log_row;           /* floats of one logged row of one layer (C + 2 Hv) */
    float  *mem;               /* backend [n_slot][2][state_n]                    */
    float  *log;               /* backend [n_slot][n_rec][cap][log_row]           */
    int    *cur;               /* host [n_slot]: which buffer is current (0, 1)   */
    int    *pos;               /* host [n_slot]: positions the current state has consumed */
    int    *base;              /* host [n_slot]: positions the checkpoint has consumed */
    int    *n_log;             /* host [n_slot]: logged rows from base (-1: none, only base itself) */
    uint8_t *var;              /* host [n_slot]: the gdn variant the logged run used */
    float **ptrs;              /* host [2 * m_max]: a run's per-row state pointers */
    int     m_max;
} ds_rstate;

/* 0, or -1 with one line (nothing allocated then). cap >= 1. */
int  ds_rstate_init(ds_rstate *r, ds_backend *be, int n_slot, int cap, int n_rec, size_t conv_n, size_t ssm_n,
                    size_t log_row, int m_max, char *err, size_t errlen);
void ds_rstate_free(ds_rstate *r);

/* Layer li's conv window in buffer b (0, 1) of slot s; its recurrence state
 * follows conv_n floats later. */
static inline float *ds_rstate_buf(const ds_rstate *r, int s, int b, int li) {
    return r->mem + ((size_t)s * 2 + (size_t)b) * r->state_n + (size_t)li * (r->conv_n + r->ssm_n);
}
static inline float *ds_rstate_cur(const ds_rstate *r, int s, int li) { return ds_rstate_buf(r, s, r->cur[s], li); }
static inline float *ds_rstate_next(const ds_rstate *r, int s, int li) { return ds_rstate_buf(r, s, !r->cur[s], li); }
/* Logged row t (from base) of layer li of slot s. */
static inline float *ds_rstate_log(const ds_rstate *r, int s, int li, int t) {
    return r->log + (((size_t)s * (size_t)r->n_rec + (size_t)li) * (size_t)r->cap + (size_t)t) * r->log_row;
}
/* 1 when the state after n positions (n = 0: the empty one) is there or can
 * be replayed. */
int  ds_rstate_has(const ds_rstate *r, int s, int n);
void ds_rstate_reset(ds_rstate *r, int s);
/* After a forward whose run of slot s covered positions [p0, p1] with the
 * gdn variant v (the layers wrote the state into the next buffer and logged
 * the rows when p1 - p0 < cap): the next buffer becomes current. */
void ds_rstate_commit(ds_rstate *r, int s, int p0, int p1, int v);
/* Slot dst := slot src's current state (src holds n == its pos) or its
 * checkpoint (n == its base). */
int  ds_rstate_copy(ds_rstate *r, ds_exec *ex, int dst, int src, int n, char *err, size_t errlen);

/* A host copy of one slot (both buffers, the log, the bookkeeping):
 * diagnostics' S0. */
typedef struct { float *data; size_t n; int cur, pos, base, n_log, var; } ds_rstate_snap;
int  ds_rstate_save(const ds_rstate *r, ds_exec *ex, int s, ds_rstate_snap *out);
void ds_rstate_load(ds_rstate *r, ds_exec *ex, int s, const ds_rstate_snap *snap);
void ds_rstate_snap_free(ds_rstate_snap *snap);

#endif
