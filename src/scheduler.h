/* scheduler.h — the scheduler above the batch engine (docs/ENGINE.md): it forms
 * each step's batch from the requests' states, the way vLLM's scheduler and
 * llama-server's slots do.
 *
 *   WAITING --admit--> PREFILL --prompt done--> DECODE --stop--> DONE
 *       ^                  |                       |
 *       +----- preempted (pages ran out: recomputed later, same bits) ----+
 *
 * A step: every DECODE request contributes its one row (the token it chose
 * last step), then PREFILL requests their next prompt chunk while the row
 * budget lasts (a long prompt is cut into chunks, so decode rows are never
 * starved), then waiting requests are admitted while sequence slots and
 * pages allow (the prefix cache first: a hit skips the cached pages). One
 * engine forward runs the batch; each row that chose a token hands it to its
 * request. Because every row's bits are its own sequence's alone, a
 * request's output never depends on what shared its steps, on when it was
 * admitted, on chunking or on preemption.
 *
 * Logits processors: a request with a host processor (ds_req_params.lp:
 * penalties, logit_bias, a grammar, logprob capture — lproc.h) has its
 * choosing row return its logits instead of a device-side selection; the
 * step then runs lp->apply, ds_sample and lp->selected on the host, in the
 * order and with the arguments one context's plain generation uses
 * (backend.c select_on_host, generate.c), and lp->accept for each emitted
 * token before on_token. Rows without a processor keep the device-side
 * selection. Processors see the canonical row's bits, so the tokens and the
 * captured logprobs equal ds_generate_ex's alone (tests/test_scheduler.c).
 *
 * Thread safety: submit / cancel / stats from any thread; step from one. */
#ifndef DSPARK_SCHEDULER_H
#define DSPARK_SCHEDULER_H

#include "engine.h"
#include "sampler.h"

typedef struct ds_sched ds_sched;

typedef struct {
    int max_rows;               /* rows per step (the token budget); 0: 512            */
    int max_running;            /* requests in PREFILL / DECODE at once; 0: every slot  */
    int prefill_chunk;          /* prompt rows one request adds per step; 0: max_rows  */
    int prefix_cache;           /* 1: reuse cached full pages of prompts               */
    /* Benchmarks and tests only (NULL in normal use): called after each
     * drafting round with the request's user pointer, the anchor's position
     * and its n drafts, which it may overwrite (an oracle replaying known
     * continuations at a chosen acceptance). The tokens stay plain
     * decoding's whatever it proposes: only acceptance changes. */
    void (*draft_override)(void *req_user, int p, int n, int32_t *ids);
    /* How many drafts the speculating requests verify each step:
     *   DS_SPEC_FIXED  each its draft_max (clamped by budget and context);
     *   DS_SPEC_AUTO   measured: a cap on every request's drafts, chosen per
     *                  batch size (the number of generating requests, in
     *                  powers of two) among 0, 1, 2, 3, 4, 6 and the block
     *                  by the tokens per second each cap gave at that size
     *                  (decayed averages; caps tried twice each, narrowest
     *                  first, while the last came within 10% of the best;
     *                  then the best, a neighbour probed every 16th step).
     *                  When verifying costs more than it brings — a batch
     *                  large enough to be compute-bound — the cap goes to 0:
     *                  plain steps (the drafter's context rows still follow,
     *                  so speculation resumes at once when it pays again).
     * Either way the tokens are plain decoding's. */
    int spec_policy;
} ds_sched_params;
enum { DS_SPEC_FIXED = 0, DS_SPEC_AUTO = 1 };

/* How a request ended, and what it cost. */
typedef struct {
    int    n_prompt, n_gen, n_cached;     /* n_cached: prompt positions from the cache */
    const char *stop;                     /* "length", "eog", "context", "stop", "cancel", "error" */
    double t_queued, t_first, t_done;     /* seconds since submit: admitted (never admitted: the
                                             end), first token (0: none), end */
    int    preemptions;
    int    rounds, drafted, accepted;     /* speculative rounds, drafts verified / accepted */
    int    spec, draft_max;               /* it speculated (drafter rows kept), its width   */
} ds_req_result;

/* on_token's return value that ends the request with stop "stop" (a stop
 * string of the caller's: DSPARK_STOP); any other nonzero value: "cancel". */
#define DS_REQ_STOP 2

typedef struct {
    const int32_t *prompt;      /* copied at submit                                    */
    int   n_prompt;
    int   n_predict;            /* >= 1                                                */
    ds_sampler samp;            /* temp 0: greedy                                      */
    int   stop_at_eog;
    /* Called from the stepping thread: each chosen token, in order (return
     * nonzero to stop the request after it: DS_REQ_STOP gives stop "stop",
     * anything else "cancel"), then once at the end. Either may be NULL. */
    int  (*on_token)(void *user, int32_t token);
    void (*on_done)(void *user, const ds_req_result *r);
    void  *user;
    /* Host logits processor (sampler.h), or NULL: see the header comment.
     * Called from the stepping thread; it must outlive the request (until
     * on_done). A failing apply ends the request with stop "error" (the
     * processor knows why); the other requests run on. */
    const ds_lproc *lp;
    /* Called from the stepping thread when the request is first admitted
     * (its prompt starts), or never (cancelled while queued). May be NULL. */
    void (*on_start)(void *user);
    /* Speculative rounds (an engine with a drafter): each step the drafter
     * proposes draft_max tokens (0: its block size) and the request's rows
     * are the verify block [anchor, d_1..d_ell] in the same forward as every
     * other request's rows; the longest prefix that equals the target's own
     * choices is accepted, plus the target's next token. The tokens are
     * exactly plain decoding's (canonical kernels): only how many come per
     * step changes. Ignored without a drafter. */
    int   speculative;
    int   draft_max;
} ds_req_params;

ds_sched *ds_sched_new(ds_engine *e, const ds_sched_params *p, char *err, size_t errlen);
/* Every request still queued or running ends with stop "cancel" first. */
void      ds_sched_free(ds_sched *s);

/* A request id (> 0), or -1 with err (a prompt that leaves no room in the
 * context for one new token, n_predict < 1, out of memory). */
long ds_sched_submit(ds_sched *s, const ds_req_params *p, char *err, size_t errlen);
/* The request ends at the next step boundary (stop "cancel"), wherever it
 * is: queued, in its prompt, or generating. 0, or -1 for an unknown id. */
int  ds_sched_cancel(ds_sched *s, long id);

/* One step: 1 when it ran a batch, 0 when there was nothing to run, -1 on
 * an engine error (err; every running request then ends with stop
 * "error"). */
int  ds_sched_step(ds_sched *s, char *err, size_t errlen);

typedef struct {
    int  waiting, running;                /* now                                       */
    long steps, rows, requests_done, preemptions;
    long prompt_tokens, cached_tokens;    /* prompt positions computed / reused        */
    long spec_rounds, drafted, accepted;  /* speculative rounds; drafts verified / accepted */
    int  spec_cap;                        /* AUTO: the last step's cap on drafts (-1: none) */
    int  last_batch;                      /* rows in the last step                     */
    int  pages_free, pages_total;
} ds_sched_stats;
void ds_sched_get_stats(ds_sched *s, ds_sched_stats *st);

#endif
