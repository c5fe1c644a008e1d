/* scheduler.c — the scheduler above the batch engine (scheduler.h). One step:
 * finish what was cancelled -> admit -> build the batch (decode rows, then
 * prompt chunks) -> make room (preempt) -> one engine forward -> choose on
 * the host for the rows of requests with a logits processor -> hand each
 * chosen token to its request -> finish what stopped. */
#include "scheduler.h"
#include "drafter.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef enum { RQ_WAITING = 0, RQ_PREFILL = 1, RQ_DECODE = 2 } rq_state;

#define AUTO_BUCKETS 13         /* generating requests 1, 2-3, 4-7, .. 4096  */

typedef struct rq {
    long       id;
    ds_req_params p;
    int32_t   *hist;            /* prompt, then every generated token          */
    int        n_hist, n_gen;
    int        slot;            /* engine sequence, -1 while waiting           */
    int        n_done;          /* positions whose K/V the sequence holds      */
    rq_state   st;
    atomic_int cancelled;
    int        n_cached, preemptions;
    /* speculative rounds (an engine with a drafter and p.speculative) */
    int        spec, draft_max;
    int32_t   *drafts;          /* [gamma]: this step's drafts                 */
    int        ell, row0;       /* this step: drafts verified, first row       */
    int        rounds, drafted, accepted;
    double     t_submit, t_admit, t_first;
    struct rq *next;            /* waiting queue (under mu)                    */
    struct rq *all_next;        /* every live request (under mu)               */
} rq;

struct ds_sched {
    ds_engine *e;
    ds_sched_params p;
    pthread_mutex_t mu;
    rq   *wait_head, *wait_tail, *all;
    long  next_id;
    int   n_waiting;
    rq  **run;                  /* running, in admission order (step thread)   */
    int   n_run, run_cap;
    ds_row  *rows;              /* the step's batch                            */
    rq     **row_rq;
    int32_t *ids;
    int32_t *toks;              /* the step's DRAFTED rows' tokens (ds_fwd_out) */
    int      gamma;             /* the drafter's block size, 0 without one     */
    ds_draft_req *dreq;         /* a step's drafting rounds [max_running]      */
    int32_t *dids;              /* their drafts [max_running][gamma]           */
    /* DS_SPEC_AUTO: per batch-size bucket and cap, decayed tokens/s */
    int      caps[8], n_caps;
    double   rate[AUTO_BUCKETS][8];
    int      tries[AUTO_BUCKETS][8];
    long     auto_steps;
    int      cap, cap_i, bucket;/* this step's cap (-1: none), its index, bucket */
    long     step_tokens;       /* tokens handed out this step                 */
    long     n_recorded;        /* the engine's recorded chunks after the last step */
    float   *lg;                /* host logits of the step's processor rows    */
    int      lg_cap;            /* rows lg holds                               */
    float   *scratch;           /* ds_sample's 2V floats                       */
    ds_sched_stats stats;       /* counters (under mu for readers)             */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ========================================================================
 * Life of a request
 * ===================================================================== */

ds_sched *ds_sched_new(ds_engine *e, const ds_sched_params *p, char *err, size_t errlen) {
    ds_sched *s = calloc(1, sizeof *s);
    if (!s) { ds_errf(err, errlen, "scheduler: out of memory"); return NULL; }
    s->e = e;
    s->p = *p;
    const int slots = ds_engine_seq_slots(e);
    if (s->p.max_rows <= 0) s->p.max_rows = 512;
    if (s->p.max_running <= 0 || s->p.max_running > slots) s->p.max_running = slots;
    if (s->p.prefill_chunk <= 0 || s->p.prefill_chunk > s->p.max_rows) s->p.prefill_chunk = s->p.max_rows;
    if (s->p.max_rows < s->p.max_running) s->p.max_rows = s->p.max_running;   /* every decode row fits */
    s->run_cap = s->p.max_running;
    s->run = calloc((size_t)s->run_cap, sizeof *s->run);
    s->rows = malloc((size_t)s->p.max_rows * sizeof *s->rows);
    s->row_rq = malloc((size_t)s->p.max_rows * sizeof *s->row_rq);
    s->ids = malloc((size_t)s->p.max_rows * sizeof *s->ids);
    s->toks = malloc((size_t)s->p.max_rows * sizeof *s->toks);
    const ds_drafter *d = ds_engine_drafter(e);
    s->gamma = d ? ds_drafter_block_size(d) : 0;
    s->dreq = malloc((size_t)s->run_cap * sizeof *s->dreq);
    s->dids = malloc((size_t)s->run_cap * (size_t)(s->gamma ? s->gamma : 1) * sizeof *s->dids);
    static const int cand[] = {0, 1, 2, 3, 4, 6};
    for (size_t i = 0; i < sizeof cand / sizeof *cand; i++)
        if (cand[i] < s->gamma) s->caps[s->n_caps++] = cand[i];
    if (s->gamma) s->caps[s->n_caps++] = s->gamma;
    s->cap = -1;
    if (!s->run || !s->rows || !s->row_rq || !s->ids || !s->toks || !s->dreq || !s->dids || pthread_mutex_init(&s->mu, NULL)) {
        free(s->run); free(s->rows); free(s->row_rq); free(s->ids); free(s->toks); free(s->dreq); free(s->dids); free(s);
        ds_errf(err, errlen, "scheduler: out of memory");
        return NULL;
    }
    s->next_id = 1;
    return s;
}

/* The request leaves: its pages go back (its full committed pages stay in
 * the prefix cache), the caller hears how it ended, and it is freed. */
static void finish(ds_sched *s, rq *r, const char *stop) {
    if (r->slot >= 0) {
        if (s->p.prefix_cache) ds_engine_prefix_publish(s->e, r->slot);
        ds_engine_seq_free(s->e, r->slot);
        r->slot = -1;
    }
    const double t = now_s();
    const ds_req_result res = {r->p.n_prompt, r->n_gen, r->n_cached, stop, (r->t_admit > 0 ? r->t_admit : t) - r->t_submit,
                               r->t_first > 0 ? r->t_first - r->t_submit : 0, t - r->t_submit, r->preemptions,
                               r->rounds, r->drafted, r->accepted, r->spec, r->draft_max};
    pthread_mutex_lock(&s->mu);
    for (rq **pp = &s->all; *pp; pp = &(*pp)->all_next)
        if (*pp == r) { *pp = r->all_next; break; }
    s->stats.requests_done++;
    pthread_mutex_unlock(&s->mu);
    if (r->p.on_done) r->p.on_done(r->p.user, &res);
    free(r->hist);
    free(r->drafts);
    free(r);
}

void ds_sched_free(ds_sched *s) {
    if (!s) return;
    for (int i = 0; i < s->n_run; i++) finish(s, s->run[i], "cancel");
    while (s->wait_head) {
        rq *r = s->wait_head;
        s->wait_head = r->next;
        finish(s, r, "cancel");
    }
    pthread_mutex_destroy(&s->mu);
    free(s->run); free(s->rows); free(s->row_rq); free(s->ids); free(s->toks); free(s->dreq); free(s->dids); free(s->lg); free(s->scratch);
    free(s);
}

long ds_sched_submit(ds_sched *s, const ds_req_params *p, char *err, size_t errlen) {
    const int n_ctx = ds_engine_n_ctx(s->e);
    if (!p->prompt || p->n_prompt < 1) { ds_errf(err, errlen, "request: the prompt is empty"); return -1; }
    if (p->n_prompt >= n_ctx) {
        ds_errf(err, errlen, "request: the prompt has %d tokens but the context holds %d (need room for at least one new token)",
                p->n_prompt, n_ctx);
        return -1;
    }
    if (p->n_predict < 1) { ds_errf(err, errlen, "request: n_predict must be >= 1 (got %d)", p->n_predict); return -1; }
    /* a prompt the whole pool cannot hold (with its first new token) would
     * never run: refused here, not failed later */
    const int pages = ds_kvpool_n_pages(ds_engine_pool(s->e)), need = (p->n_prompt + 1 + DS_KV_PAGE - 1) / DS_KV_PAGE + 1;
    if (need > pages) {
        ds_errf(err, errlen, "request: the prompt has %d tokens, %d KV pages of %d positions with its first new token, but the pool holds %d",
                p->n_prompt, need, DS_KV_PAGE, pages);
        return -1;
    }
    const int V = ds_engine_model(s->e)->hp.n_vocab;
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= V) {
            ds_errf(err, errlen, "request: token id %d is out of range [0, %d)", p->prompt[i], V);
            return -1;
        }
    /* a request with a host logits processor decodes plain (its rows are
     * chosen on the host, one at a time) */
    const int spec = p->speculative && s->gamma > 0 && !p->lp;
    if (spec && (p->draft_max < 0 || p->draft_max > s->gamma)) {
        ds_errf(err, errlen, "request: draft_max %d is outside 0..%d (the drafter's block size)", p->draft_max, s->gamma);
        return -1;
    }
    rq *r = calloc(1, sizeof *r);
    const size_t cap = (size_t)p->n_prompt + (size_t)(p->n_predict < n_ctx ? p->n_predict : n_ctx) + 1;
    if (r) r->hist = malloc(cap * sizeof *r->hist);
    if (r && spec) r->drafts = malloc((size_t)s->gamma * sizeof *r->drafts);
    if (!r || !r->hist || (spec && !r->drafts)) {
        if (r) { free(r->hist); free(r); }
        ds_errf(err, errlen, "request: out of memory");
        return -1;
    }
    r->spec = spec;
    r->draft_max = spec ? (p->draft_max ? p->draft_max : s->gamma) : 0;
    r->p = *p;
    r->p.prompt = NULL;                 /* the copy below is the request's */
    memcpy(r->hist, p->prompt, (size_t)p->n_prompt * sizeof *r->hist);
    r->n_hist = p->n_prompt;
    r->slot = -1;
    r->t_submit = now_s();
    pthread_mutex_lock(&s->mu);
    r->id = s->next_id++;
    if (s->wait_tail) s->wait_tail->next = r; else s->wait_head = r;
    s->wait_tail = r;
    s->n_waiting++;
    r->all_next = s->all;
    s->all = r;
    const long id = r->id;
    pthread_mutex_unlock(&s->mu);
    return id;
}

int ds_sched_cancel(ds_sched *s, long id) {
    int rc = -1;
    pthread_mutex_lock(&s->mu);
    for (rq *r = s->all; r; r = r->all_next)
        if (r->id == id) { atomic_store(&r->cancelled, 1); rc = 0; break; }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void ds_sched_get_stats(ds_sched *s, ds_sched_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->stats;
    st->waiting = s->n_waiting;
    pthread_mutex_unlock(&s->mu);
    st->running = s->n_run;
    st->pages_free = ds_kvpool_n_free(ds_engine_pool(s->e));
    st->pages_total = ds_kvpool_n_pages(ds_engine_pool(s->e));
}

/* ========================================================================
 * A step
 * ===================================================================== */

static rq *pop_waiting(ds_sched *s) {
    pthread_mutex_lock(&s->mu);
    rq *r = s->wait_head;
    if (r) {
        s->wait_head = r->next;
        if (!s->wait_head) s->wait_tail = NULL;
        r->next = NULL;
        s->n_waiting--;
    }
    pthread_mutex_unlock(&s->mu);
    return r;
}

static void push_waiting_front(ds_sched *s, rq *r) {
    pthread_mutex_lock(&s->mu);
    r->next = s->wait_head;
    s->wait_head = r;
    if (!s->wait_tail) s->wait_tail = r;
    s->n_waiting++;
    pthread_mutex_unlock(&s->mu);
}

static void drop_running(ds_sched *s, int i) {
    memmove(s->run + i, s->run + i + 1, (size_t)(s->n_run - i - 1) * sizeof *s->run);
    s->n_run--;
}

/* Preemption by recompute: the request gives its pages back (its full pages
 * stay in the prefix cache) and waits at the head of the queue; resumed, it
 * computes its prompt and every token it chose so far again — the same bits
 * (canonical rows do not depend on how they are batched or chunked). */
static void preempt(ds_sched *s, int i) {
    rq *r = s->run[i];
    drop_running(s, i);
    if (s->p.prefix_cache) ds_engine_prefix_publish(s->e, r->slot);
    ds_engine_seq_free(s->e, r->slot);
    r->slot = -1;
    r->n_done = 0;
    r->st = RQ_WAITING;
    r->preemptions++;
    pthread_mutex_lock(&s->mu);
    s->stats.preemptions++;
    pthread_mutex_unlock(&s->mu);
    push_waiting_front(s, r);
}

/* Pages a request needs for its next n_rows positions from n_done, with one
 * page to spare for copy-on-write of a shared partial page. */
static int pages_for(const rq *r, int n_rows) {
    const int p0 = r->n_done, p1 = r->n_done + n_rows;
    return (p1 + DS_KV_PAGE - 1) / DS_KV_PAGE - p0 / DS_KV_PAGE + 1;
}

static void admit(ds_sched *s) {
    ds_kvpool *pool = ds_engine_pool(s->e);
    while (s->n_run < s->p.max_running) {
        rq *r = pop_waiting(s);
        if (!r) return;
        if (atomic_load(&r->cancelled)) { finish(s, r, "cancel"); continue; }
        char e2[DS_ERRLEN];
        const int slot = ds_engine_seq_new(s->e, e2, sizeof e2);
        if (slot < 0) { push_waiting_front(s, r); return; }
        r->slot = slot;
        r->n_done = 0;
        if (s->p.prefix_cache) {
            /* a speculating request needs the drafter's rows of the pages too */
            const int hit = ds_engine_prefix_lookup(s->e, slot, r->hist, r->n_hist, r->spec);
            r->n_done = hit;
            if (!r->preemptions) {
                r->n_cached = hit;
                pthread_mutex_lock(&s->mu);
                s->stats.cached_tokens += hit;
                pthread_mutex_unlock(&s->mu);
            }
        }
        /* the whole remaining prompt must fit the free pages, or it waits
         * (running requests are never preempted to admit a new one) */
        if (pages_for(r, r->n_hist - r->n_done + 1) > ds_kvpool_n_free(pool) && s->n_run > 0) {
            ds_engine_seq_free(s->e, slot);
            r->slot = -1;
            push_waiting_front(s, r);
            return;
        }
        r->st = RQ_PREFILL;
        if (!r->preemptions) {
            r->t_admit = now_s();
            if (r->p.on_start) r->p.on_start(r->p.user);
        }
        s->run[s->n_run++] = r;
    }
}

/* One token to request r: an end-of-generation token ends it before it is
 * emitted; the budget or the context after. 1 when r is done (*stop). */
static int emit(ds_sched *s, rq *r, int32_t t, const char **stop) {
    const ds_model *m = ds_engine_model(s->e);
    if (r->p.stop_at_eog && m->tok && ds_tokenizer_is_eog(m->tok, t)) { *stop = "eog"; return 1; }
    /* committed: the processor hears it before the caller (generate.c's order) */
    if (r->p.lp && r->p.lp->accept) r->p.lp->accept(r->p.lp->user, r->n_hist, t);
    r->hist[r->n_hist++] = t;
    r->n_gen++;
    s->step_tokens++;
    if (!r->t_first) r->t_first = now_s();
    const int rc = r->p.on_token ? r->p.on_token(r->p.user, t) : 0;
    if (rc) { *stop = rc == DS_REQ_STOP ? "stop" : "cancel"; return 1; }
    if (r->n_gen >= r->p.n_predict) { *stop = "length"; return 1; }
    if (r->n_hist >= ds_engine_n_ctx(s->e)) { *stop = "context"; return 1; }
    return 0;
}

/* What a row that chooses its request's next token asks the engine for:
 * the device-side selection, or with a processor the logits (the host
 * chooses, choose_on_host). */
static uint8_t choose_want(const rq *r) { return r->p.lp ? DS_ROW_LOGITS : DS_ROW_SELECT; }

/* The batch from the running requests' states: every generating request's
 * rows first — one decode row, or for a speculating request its verify
 * block [anchor, d_1..d_ell] (the drafts are filled in after drafting) —
 * then prompt chunks while the row budget lasts. Returns the rows; *need:
 * pages the batch may take (a spare page per request; a drafting round's
 * block rows reach gamma positions past the anchor). */
static int build(ds_sched *s, int *need) {
    int n = 0, budget = s->p.max_rows, n_dec = 0;
    const int n_ctx = ds_engine_n_ctx(s->e);
    *need = 0;
    for (int i = 0; i < s->n_run; i++) n_dec += s->run[i]->st == RQ_DECODE;
    for (int i = 0; i < s->n_run; i++) {
        rq *r = s->run[i];
        if (r->st != RQ_DECODE) continue;
        n_dec--;                                   /* decode requests after this one */
        const int p = r->n_done;
        int ell = 0;
        if (r->spec) {
            /* drafts: the request's width, the tokens it still wants after
             * the next, the context (p + ell < n_ctx), and the budget less
             * one row for each decode request still to come */
            ell = r->draft_max;
            if (s->cap >= 0 && ell > s->cap) ell = s->cap;
            if (ell > r->p.n_predict - r->n_gen - 1) ell = r->p.n_predict - r->n_gen - 1;
            if (ell > n_ctx - 1 - p) ell = n_ctx - 1 - p;
            if (ell > budget - n_dec - 1) ell = budget - n_dec - 1;
            if (ell < 0) ell = 0;
        }
        r->ell = ell;
        r->row0 = n;
        const uint8_t want = r->spec ? DS_ROW_SELECT | DS_ROW_DCTX : choose_want(r);
        for (int k = 0; k <= ell; k++) {
            s->rows[n] = (ds_row){r->slot, p + k, k ? 0 : r->hist[p], want, &r->p.samp};
            s->row_rq[n++] = r;
        }
        budget -= ell + 1;
        *need += pages_for(r, ell ? (s->gamma > ell + 1 ? s->gamma : ell + 1) : 1) - 1;
    }
    for (int i = 0; i < s->n_run && budget > 0; i++) {
        rq *r = s->run[i];
        if (r->st != RQ_PREFILL) continue;
        int k = r->n_hist - r->n_done;
        if (k > s->p.prefill_chunk) k = s->p.prefill_chunk;
        if (k > budget) k = budget;
        const uint8_t dctx = r->spec ? DS_ROW_DCTX : 0;
        for (int j = 0; j < k; j++) {
            const int pos = r->n_done + j;
            s->rows[n] = (ds_row){r->slot, pos, r->hist[pos], (uint8_t)((pos == r->n_hist - 1 ? choose_want(r) : 0) | dctx),
                                  &r->p.samp};
            s->row_rq[n++] = r;
        }
        budget -= k;
        *need += pages_for(r, k) - 1;
    }
    return n;
}

/* The drafting rounds of the step's speculating requests, in one engine
 * call. Their drafts stay on the device: the verify blocks' rows read them
 * there (DS_ROW_DRAFTED) and the forward's one download brings them back
 * with the target's choices — one wait per step. A draft_override hook
 * (the oracle benchmark, tests) needs them on the host before the verify:
 * then they come back first and go into the rows. */
static int draft(ds_sched *s, char *err, size_t errlen) {
    int nd = 0;
    for (int i = 0; i < s->n_run; i++) {
        rq *r = s->run[i];
        if (r->st != RQ_DECODE || !r->spec || !r->ell) continue;
        s->dreq[nd++] = (ds_draft_req){r->slot, r->hist[r->n_done], r->ell, &r->p.samp};
    }
    if (!nd) return 0;
    if (!s->p.draft_override) {
        if (ds_engine_draft_queue(s->e, nd, s->dreq, err, errlen)) return -1;
        for (int i = 0; i < s->n_run; i++) {
            rq *r = s->run[i];
            if (r->st != RQ_DECODE || !r->spec || !r->ell) continue;
            for (int k = 0; k < r->ell; k++) {
                s->rows[r->row0 + 1 + k].token = 0;
                s->rows[r->row0 + 1 + k].want |= DS_ROW_DRAFTED;
            }
        }
        return 0;
    }
    if (ds_engine_draft(s->e, nd, s->dreq, s->dids, err, errlen)) return -1;
    nd = 0;
    for (int i = 0; i < s->n_run; i++) {
        rq *r = s->run[i];
        if (r->st != RQ_DECODE || !r->spec || !r->ell) continue;
        memcpy(r->drafts, s->dids + (size_t)nd++ * s->gamma, (size_t)r->ell * sizeof *r->drafts);
        if (s->p.draft_override) s->p.draft_override(r->p.user, r->n_done, r->ell, r->drafts);
        for (int k = 0; k < r->ell; k++) s->rows[r->row0 + 1 + k].token = r->drafts[k];
    }
    return 0;
}

static void drop_request(ds_sched *s, rq *r, const char *stop) {
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i] == r) { drop_running(s, i); break; }
    finish(s, r, stop);
}

/* A speculating request's verify block at rows[j0 .. j0 + ell]: row k chose
 * the target's token for position p + k + 1. Accept the longest prefix of
 * drafts equal to those choices, then the target's own next token; the
 * sequence keeps the rows of the anchor and the accepted drafts (the rest
 * are cut: their K/V and drafter rows are rewritten by the next block). */
static int accept_block(ds_sched *s, rq *r, int j0, char *err, size_t errlen) {
    const int p = s->rows[j0].pos, ell = r->ell;
    int a = 0;
    while (a < ell && s->ids[j0 + a] == r->drafts[a]) a++;
    const int32_t bonus = s->ids[j0 + a];
    if (a < ell && ds_engine_seq_truncate(s->e, r->slot, p + a + 1, err, errlen)) return -1;
    r->n_done = p + a + 1;
    if (ell) {
        r->rounds++;
        r->drafted += ell;
        r->accepted += a;
        pthread_mutex_lock(&s->mu);
        s->stats.spec_rounds++;
        s->stats.drafted += ell;
        s->stats.accepted += a;
        pthread_mutex_unlock(&s->mu);
    }
    const char *stop = NULL;
    int done = 0;
    for (int k = 0; k < a && !done; k++) done = emit(s, r, r->drafts[k], &stop);
    if (!done) done = emit(s, r, bonus, &stop);
    if (done) drop_request(s, r, stop);
    return 0;
}

/* DS_SPEC_AUTO: the cap for a step with n_dec generating requests. */
static void auto_choose(ds_sched *s, int n_dec) {
    s->cap = s->cap_i = -1;
    if (s->p.spec_policy != DS_SPEC_AUTO || !s->n_caps || !n_dec) return;
    int b = 0;
    while (b < AUTO_BUCKETS - 1 && (2 << b) <= n_dec) b++;
    s->bucket = b;
    /* exploration, narrowest first: the next cap is tried while the one
     * before it came within 10% of the best so far (wider is dearer; once
     * it stops paying, the wider ones are not worth a trial at this size) */
    int best = -1, top = -1;
    for (int i = 0; i < s->n_caps && best < 0; i++) {
        if (s->tries[b][i] < 2) {
            if (i == 0 || s->rate[b][i - 1] >= 0.9 * s->rate[b][top]) best = i;
            break;
        }
        if (top < 0 || s->rate[b][i] > s->rate[b][top]) top = i;
    }
    if (best < 0) {
        best = 0;
        for (int i = 1; i < s->n_caps && s->tries[b][i]; i++)
            if (s->rate[b][i] > s->rate[b][best]) best = i;
        if (++s->auto_steps % 16 == 0) {                          /* probe a neighbour */
            const int nb = (s->auto_steps / 16) % 2 ? best + 1 : best - 1;
            if (nb >= 0 && nb < s->n_caps) best = nb;
        }
    }
    s->cap_i = best;
    s->cap = s->caps[best];
}

static void auto_update(ds_sched *s, int tokens, double secs) {
    if (s->cap_i < 0 || secs <= 0) return;
    const int b = s->bucket, i = s->cap_i;
    const double r = tokens / secs;
    s->rate[b][i] = s->tries[b][i] ? 0.8 * s->rate[b][i] + 0.2 * r : r;
    s->tries[b][i]++;
}

/* Room for n host logits rows (and ds_sample's scratch). 0, or -1. */
static int lg_reserve(ds_sched *s, int n) {
    const size_t V = (size_t)ds_engine_model(s->e)->hp.n_vocab;
    if (!s->scratch && !(s->scratch = malloc(2 * V * sizeof *s->scratch))) return -1;
    if (n <= s->lg_cap) return 0;
    float *lg = realloc(s->lg, (size_t)n * V * sizeof *lg);
    if (!lg) return -1;
    s->lg = lg;
    s->lg_cap = n;
    return 0;
}

/* The token for position pos of a request with a processor, from its row's
 * logits: exactly one context's host selection (backend.c select_on_host):
 * apply, ds_sample keyed on pos, argmax should the sampler fail, selected.
 * 0, or -1 when the processor failed. */
static int choose_on_host(ds_sched *s, rq *r, float *logits, int64_t pos, int32_t *tok) {
    const ds_lproc *lp = r->p.lp;
    const int V = ds_engine_model(s->e)->hp.n_vocab;
    if (lp->apply(lp->user, pos, NULL, 0, logits, V)) return -1;
    const int32_t t = ds_sample(&r->p.samp, logits, V, pos, s->scratch);
    *tok = t >= 0 ? t : (int32_t)ds_argmax(logits, V);
    if (lp->selected) lp->selected(lp->user, pos, *tok);
    return 0;
}

int ds_sched_step(ds_sched *s, char *err, size_t errlen) {
    /* cancellations of running requests take effect at a step boundary */
    for (int i = 0; i < s->n_run;)
        if (atomic_load(&s->run[i]->cancelled)) {
            rq *r = s->run[i];
            drop_running(s, i);
            finish(s, r, "cancel");
        } else
            i++;
    admit(s);
    if (!s->n_run) return 0;
    ds_kvpool *pool = ds_engine_pool(s->e);
    int n, need, n_dec = 0, n_spec = 0;
    for (int i = 0; i < s->n_run; i++) {
        n_dec += s->run[i]->st == RQ_DECODE;
        n_spec += s->run[i]->st == RQ_DECODE && s->run[i]->spec;
    }
    auto_choose(s, n_spec ? n_dec : 0);
    s->step_tokens = 0;
    const double t_step = now_s();
    /* room: preempt the most recently admitted request until the batch's
     * pages fit */
    while ((n = build(s, &need)) && need > ds_kvpool_n_free(pool) && s->n_run > 1) preempt(s, s->n_run - 1);
    if (need > ds_kvpool_n_free(pool)) {
        /* one request alone has outgrown the pool: the pool is its context
         * (stop "context", as a full context ends a generation) */
        rq *r = s->run[0];
        drop_running(s, 0);
        finish(s, r, "context");
        return 1;
    }
    int n_lg = 0;
    for (int j = 0; j < n; j++) n_lg += (s->rows[j].want & DS_ROW_LOGITS) != 0;
    const int no_lg = n_lg && lg_reserve(s, n_lg);
    if (no_lg) ds_errf(err, errlen, "scheduler: out of memory for %d rows of logits", n_lg);
    ds_fwd_out out = {.logits = n_lg ? s->lg : NULL, .ids = s->ids, .tokens = s->toks};
    if (no_lg || draft(s, err, errlen) || ds_engine_forward(s->e, s->rows, n, &out, err, errlen)) {
        /* one request that cannot fit even alone, or a device fault: the
         * running requests end (stop "error"); the queue stays */
        while (s->n_run) {
            rq *r = s->run[s->n_run - 1];
            drop_running(s, s->n_run - 1);
            finish(s, r, "error");
        }
        return -1;
    }
    long prompt_rows = 0;
    for (int j = 0; j < n; j++) prompt_rows += s->row_rq[j]->st == RQ_PREFILL;
    pthread_mutex_lock(&s->mu);
    s->stats.spec_cap = s->cap;
    s->stats.steps++;
    s->stats.rows += n;
    s->stats.last_batch = n;
    s->stats.prompt_tokens += prompt_rows;
    pthread_mutex_unlock(&s->mu);
    /* each row's request moves on; a chosen token goes to its request (a
     * processor row's is chosen here, from its logits, in row order) */
    float *lg = s->lg;
    for (int j = 0; j < n; j++) {
        rq *r = s->row_rq[j];
        if (r->st == RQ_DECODE && r->spec) {
            const int ell = r->ell;
            if (ell && (s->rows[j + 1].want & DS_ROW_DRAFTED))   /* the drafts it verified */
                memcpy(r->drafts, s->toks + j + 1, (size_t)ell * sizeof *r->drafts);
            if (accept_block(s, r, j, err, errlen)) return -1;
            j += ell;
            continue;
        }
        r->n_done = s->rows[j].pos + 1;
        if (!(s->rows[j].want & (DS_ROW_SELECT | DS_ROW_LOGITS))) continue;
        if (r->st == RQ_PREFILL) {
            r->st = RQ_DECODE;
            if (s->p.prefix_cache) ds_engine_prefix_publish(s->e, r->slot);   /* the prompt, for others */
        }
        const char *stop = NULL;
        int32_t t = s->ids[j];
        if (s->rows[j].want & DS_ROW_LOGITS) {
            const size_t V = (size_t)ds_engine_model(s->e)->hp.n_vocab;
            const int bad = choose_on_host(s, r, lg, (int64_t)s->rows[j].pos + 1, &t);
            lg += V;
            if (bad) {
                drop_request(s, r, "error");
                continue;
            }
        }
        if (emit(s, r, t, &stop)) drop_request(s, r, stop);
    }
    /* a step that recorded a launch sequence paid a one-off cost: its rate
     * would misjudge the cap (AUTO then favours the caps it tried first) */
    long n_rec, n_rep;
    ds_engine_graph_counts(s->e, &n_rec, &n_rep);
    if (n_rec == s->n_recorded) auto_update(s, (int)s->step_tokens, now_s() - t_step);
    s->n_recorded = n_rec;
    return 1;
}
