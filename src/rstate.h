/* rstate.h — the recurrent state of hybrid models (qwen35), per sequence.
 *
 * A gated delta net layer carries, instead of K/V rows, one state per
 * sequence: the conv window (the K - 1 latest q|k|v inputs) and the
 * recurrence's S x S matrix per value head. It is not paged: it has the
 * same size at every position, and it cannot be cut at a position the way
 * a K/V table is truncated — the state after position p exists only if it
 * was kept when p was computed.
 *
 * So each sequence slot holds a RING of `ring` states: the state after
 * position p lives in ring entry p % ring. A forward keeps, for each run of
 * a sequence's rows [p0, p1], the states after its last `ring` rows (every
 * row of a verify block: ring >= the widest block), and the sequence then
 * holds the states after positions [lo, pos - 1]. Rolling a sequence back
 * to n positions (rejected draft rows) only moves pos: the state after
 * n - 1 is already there, bit for bit the state decode would have after
 * those tokens (the gdn family's canonical rows are decode's rows). No copy,
 * no recompute; the price is ring x the state per sequence
 * (bench/gdn_rollback.c measures it against checkpoint + replay).
 *
 * Memory is a backend buffer (host memory: the layer computes the state
 * pointers of each row on the host). */
#ifndef DSPARK_RSTATE_H
#define DSPARK_RSTATE_H

#include "backend.h"

typedef struct ds_rstate {
    ds_backend *be;
    int     n_slot;            /* sequence slots                                 */
    int     ring;              /* states kept per slot                           */
    int     n_rec;             /* recurrent layers                               */
    size_t  conv_n, ssm_n;     /* floats per layer: conv window, recurrence state */
    size_t  state_n;           /* floats of one state: n_rec * (conv_n + ssm_n)  */
    float  *mem;               /* backend [n_slot][ring][state_n]                */
    int    *pos;               /* host [n_slot]: positions the newest state has consumed */
    int    *lo;                /* host [n_slot]: oldest position whose state is kept */
    float **ptrs;              /* host [2 * m_max]: a run's per-row state pointers */
    int     m_max;
} ds_rstate;

/* 0, or -1 with one line (nothing allocated then). ring >= 2. */
int  ds_rstate_init(ds_rstate *r, ds_backend *be, int n_slot, int ring, int n_rec, size_t conv_n, size_t ssm_n,
                    int m_max, char *err, size_t errlen);
void ds_rstate_free(ds_rstate *r);

/* Layer li's conv window of the state after position p (p >= 0) of slot s;
 * its recurrence state follows conv_n floats later. */
static inline float *ds_rstate_at(const ds_rstate *r, int s, int p, int li) {
    return r->mem + ((size_t)s * (size_t)r->ring + (size_t)(p % r->ring)) * r->state_n +
           (size_t)li * (r->conv_n + r->ssm_n);
}
/* 1 when the state after n positions (n = 0: the empty one) is held. */
int  ds_rstate_has(const ds_rstate *r, int s, int n);
/* Make the state after n positions the newest (n must be held): 0, or -1
 * with one line naming what is held. */
int  ds_rstate_rewind(ds_rstate *r, int s, int n, char *err, size_t errlen);
void ds_rstate_reset(ds_rstate *r, int s);
/* After a forward whose rows of slot s covered positions [p0, p1]. */
void ds_rstate_commit(ds_rstate *r, int s, int p0, int p1);
/* Whether the row at position p of a run ending at p1 keeps its state. */
static inline int ds_rstate_keeps(const ds_rstate *r, int p, int p1) { return p > p1 - r->ring; }
/* Slot dst := the state of slot src after n positions (held by src). */
int  ds_rstate_copy(ds_rstate *r, ds_exec *ex, int dst, int src, int n, char *err, size_t errlen);

/* A host copy of one slot (ring, pos, lo): diagnostics' S0. */
typedef struct { float *data; int pos, lo; size_t n; } ds_rstate_snap;
int  ds_rstate_save(const ds_rstate *r, ds_exec *ex, int s, ds_rstate_snap *out);
void ds_rstate_load(ds_rstate *r, ds_exec *ex, int s, const ds_rstate_snap *snap);
void ds_rstate_snap_free(ds_rstate_snap *snap);

#endif
