/* serve_gen.h — the generation side of `dspark serve`, behind one narrow
 * interface the HTTP side uses and nothing else:
 *
 *   sgen_submit  a generation (prompt, dspark_gen_params, callbacks) under a
 *                request id; its tokens go to on_token as they are chosen,
 *                then on_done once
 *   sgen_cancel  by id: a queued one is dropped (on_done at once, stop
 *                "cancel"), a running one stops after its current token or
 *                between its prefill's chunks
 *   sgen_drain   take no more work, finish what there is until a deadline,
 *                then cut the rest (stop "drain")
 *   sgen_status / sgen_slots   what the metrics and /slots show
 *
 * Two sides behind it (serve_gen.c). The default is the batch engine: one
 * scheduler thread steps a dspark_engine (docs/ENGINE.md), every running
 * generation a sequence of it, all of them sharing each forward
 * (continuous batching, chunked prompts, the exact prefix cache); a
 * generation's tokens are still a pure function of its request, whatever
 * ran beside it. The other (`--gen ctx`) is one worker thread per
 * dspark_ctx, each generation alone on its context: kept for comparison
 * and for speculative decoding, which the engine's scheduler does not run
 * yet (there a speculative request decodes plain: the same tokens). Either
 * way the HTTP threads only submit, cancel and stream.
 *
 * Callbacks run on the generating thread (on_done may also run on the
 * caller's thread inside sgen_cancel / sgen_drain / sgen_free when the
 * generation never started). Everything gp points to (logit_bias, grammar)
 * and the callbacks' user data must stay valid until on_done. */
#ifndef DSPARK_SERVE_GEN_H
#define DSPARK_SERVE_GEN_H

#include <stdint.h>

#include "dspark.h"

typedef struct sgen sgen;

typedef struct {
    /* one token, in order (dspark_token_ex_fn: 0, DSPARK_STOP or nonzero) */
    int  (*on_token)(void *user, const dspark_token *t);
    /* once, at the end: rc, err (when rc != OK), st (stop "cancel" for a
     * cancelled one, "drain" for one cut by the drain); ran = 0 when it
     * never left the queue */
    void (*on_done)(void *user, dspark_status rc, const dspark_error *err, const dspark_stats *st, int ran);
    /* optional: it left the queue and its prefill starts */
    void (*on_start)(void *user);
    void  *user;
} sgen_cb;

/* rows-per-step histogram buckets (the engine; upper bounds) */
#define SGEN_BATCH_BUCKETS 10
extern const int sgen_batch_le[SGEN_BATCH_BUCKETS];

typedef struct {
    int  slots, busy, queued, max_queue, draining;
    long kv_used, kv_capacity;       /* tokens held by running generations / all contexts */
    /* the engine only (engine = 0: all zero) */
    int  engine;
    int  last_batch, pages_free, pages_total, waiting;
    long steps, rows, preemptions, prompt_tokens, cached_tokens;
    long batch_hist[SGEN_BATCH_BUCKETS + 1];   /* steps by rows; last: above the last bound */
} sgen_stat;

typedef struct {
    int      busy;
    uint64_t id;
    int      n_prompt, n_generated;
    double   running_s;
} sgen_slot;

typedef struct {
    int engine;                  /* 1: the batch engine; 0: one context per slot        */
    int n_slots;                 /* sequences sharing each step / contexts (>= 1)        */
    int max_queue;               /* generations that may wait for a slot                 */
    dspark_ctx_params cp;        /* n_ctx, threads, kernels (both sides)                 */
    /* the engine */
    int step_rows;               /* rows per step (the token budget); 0: 512             */
    int prefill_chunk;           /* prompt rows one generation adds per step; 0: step_rows */
    int prefix_cache;            /* 1: reuse cached prompt pages                         */
    int kv_pages;                /* KV pool pages of 16 positions; 0: n_slots full ones  */
} sgen_params;

/* The generation side on the model (which must outlive the sgen). NULL
 * with err. */
sgen *sgen_new(const dspark_model *m, const sgen_params *p, dspark_error *err);
void  sgen_free(sgen *g);                 /* drains with no time left first */
int   sgen_n_ctx(const sgen *g);
const char *sgen_kernels(const sgen *g);

enum { SGEN_OK = 0, SGEN_FULL = -1, SGEN_DRAINING = -2, SGEN_NOMEM = -3 };
/* Queue a generation (prompt and gp are copied). id must be unique among
 * the live ones and below 2^63. SGEN_OK, or SGEN_FULL / SGEN_DRAINING /
 * SGEN_NOMEM with no callback called. */
int  sgen_submit(sgen *g, uint64_t id, const int32_t *prompt, int n_prompt, const dspark_gen_params *gp, const sgen_cb *cb);
/* Queue n generations at once, all or none (the choices of one request):
 * ids[k], gps[k], cbs[k]. */
int  sgen_submit_n(sgen *g, int n, const uint64_t *ids, const int32_t *prompt, int n_prompt, const dspark_gen_params *gps,
                   const sgen_cb *cbs);
void sgen_cancel(sgen *g, uint64_t id);
/* Stop taking work; wait up to timeout_s for the queue and the running
 * generations to finish, then cut what is left and wait for it. Returns the
 * number of generations cut (0: everything finished). */
int  sgen_drain(sgen *g, double timeout_s);
void sgen_status(sgen *g, sgen_stat *st);
/* The first n slots' state into out (n <= slots). */
void sgen_slots(sgen *g, sgen_slot *out, int n);

#endif
