/* scheduler.c — the scheduler above the batch engine (scheduler.h). One step:
 * finish what was cancelled -> admit -> build the batch (decode rows, then
 * prompt chunks) -> make room (preempt) -> one engine forward -> choose on
 * the host for the rows of requests with a logits processor -> hand each
 * chosen token to its request -> finish what stopped. */
#include "scheduler.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef enum { RQ_WAITING = 0, RQ_PREFILL = 1, RQ_DECODE = 2 } rq_state;

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
    if (!s->run || !s->rows || !s->row_rq || !s->ids || pthread_mutex_init(&s->mu, NULL)) {
        free(s->run); free(s->rows); free(s->row_rq); free(s->ids); free(s);
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
                               r->t_first > 0 ? r->t_first - r->t_submit : 0, t - r->t_submit, r->preemptions};
    pthread_mutex_lock(&s->mu);
    for (rq **pp = &s->all; *pp; pp = &(*pp)->all_next)
        if (*pp == r) { *pp = r->all_next; break; }
    s->stats.requests_done++;
    pthread_mutex_unlock(&s->mu);
    if (r->p.on_done) r->p.on_done(r->p.user, &res);
    free(r->hist);
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
    free(s->run); free(s->rows); free(s->row_rq); free(s->ids); free(s->lg); free(s->scratch);
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
    rq *r = calloc(1, sizeof *r);
    const size_t cap = (size_t)p->n_prompt + (size_t)(p->n_predict < n_ctx ? p->n_predict : n_ctx) + 1;
    if (r) r->hist = malloc(cap * sizeof *r->hist);
    if (!r || !r->hist) { if (r) free(r); ds_errf(err, errlen, "request: out of memory"); return -1; }
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
            const int hit = ds_engine_prefix_lookup(s->e, slot, r->hist, r->n_hist, 0);
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
 * row first, then prompt chunks while the row budget lasts. Returns the
 * rows; *need: pages the batch may take (a spare page per request). */
static int build(ds_sched *s, int *need) {
    int n = 0, budget = s->p.max_rows;
    *need = 0;
    for (int i = 0; i < s->n_run; i++) {
        rq *r = s->run[i];
        if (r->st != RQ_DECODE) continue;
        /* ---- SPEC HOOK ----------------------------------------------------
         * Speculative decoding plugs in here: a request that asked for it
         * contributes its verify block (the anchor row and its drafts, each
         * a LOGITS / SELECT row, drafted in a drafter batch before this
         * forward) instead of this one decode row, and the hand-out loop in
         * ds_sched_step accepts, commits (direct: the verified rows stay,
         * the rest are truncated) and emits the accepted tokens. Until it is
         * built every request decodes plain here: the same tokens, since
         * speculative == plain. */
        s->rows[n] = (ds_row){r->slot, r->n_done, r->hist[r->n_done], choose_want(r), &r->p.samp};
        s->row_rq[n++] = r;
        budget--;
        *need += pages_for(r, 1) - 1;
    }
    for (int i = 0; i < s->n_run && budget > 0; i++) {
        rq *r = s->run[i];
        if (r->st != RQ_PREFILL) continue;
        int k = r->n_hist - r->n_done;
        if (k > s->p.prefill_chunk) k = s->p.prefill_chunk;
        if (k > budget) k = budget;
        for (int j = 0; j < k; j++) {
            const int pos = r->n_done + j;
            s->rows[n] = (ds_row){r->slot, pos, r->hist[pos], pos == r->n_hist - 1 ? choose_want(r) : 0, &r->p.samp};
            s->row_rq[n++] = r;
        }
        budget -= k;
        *need += pages_for(r, k) - 1;
    }
    return n;
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
    int n, need;
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
    ds_fwd_out out = {.logits = n_lg ? s->lg : NULL, .ids = s->ids};
    if (no_lg || ds_engine_forward(s->e, s->rows, n, &out, err, errlen)) {
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
                for (int i = 0; i < s->n_run; i++)
                    if (s->run[i] == r) { drop_running(s, i); break; }
                finish(s, r, "error");
                continue;
            }
        }
        if (emit(s, r, t, &stop)) {
            for (int i = 0; i < s->n_run; i++)
                if (s->run[i] == r) { drop_running(s, i); break; }
            finish(s, r, stop);
        }
    }
    return 1;
}
