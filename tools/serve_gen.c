/* serve_gen.c — serve_gen.h: the generation side of `dspark serve`, on the
 * batch engine (the default) or on one context per slot (`--gen ctx`).
 *
 * The engine. One scheduler thread steps a dspark_engine (include/dspark.h:
 * dspark_engine_submit_ex / step / cancel), and every generation the HTTP
 * side submits becomes a request of its scheduler. Running generations are
 * sequences of one KV page pool and share each forward; a prompt is cut
 * into chunks under the step's row budget, so decode rows are never
 * starved; full prompt pages are reused by later requests (the exact prefix
 * cache). Because every row's bits are its own sequence's alone (canonical
 * kernels), a generation's tokens and logprobs are what it gets alone,
 * whatever shared its steps.
 *
 * One context per slot. A worker thread per dspark_ctx takes the next
 * queued generation and runs dspark_generate on it alone (with the drafter
 * when the model has one: speculative decoding, which the engine's
 * scheduler does not run yet; there a speculative request decodes plain,
 * with the same tokens).
 *
 * Common to both: generations wait in this file's FIFO until a slot is
 * free (at most n_slots run at once: inside the engine, or on a worker), so
 * that a queued one is cancelled or cut at once and the queue limit counts
 * exactly what waits. HTTP threads submit, cancel and read the status under
 * mu; callbacks run on the generating thread and never with mu held. A
 * cancel names its generation (the engine's request id, or the context's
 * generation id; neither is reused), so one that races a generation's end
 * can only miss it, never stop another. */
#include "serve_gen.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const int sgen_batch_le[SGEN_BATCH_BUCKETS] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};

typedef struct gjob {
    sgen    *g;
    uint64_t id;
    int32_t *prompt;
    int      n_prompt;
    dspark_gen_params gp;        /* the caller's, with our token callback    */
    sgen_cb  cb;
    int      slot;               /* one context per slot: its worker         */
    long     req;                /* the engine's request id (0: not yet; mu) */
    int      cancel, cut;        /* a cancel / the drain asked (mu)          */
    int      started;            /* its prompt started (generating thread)   */
    atomic_int n_generated;
    _Atomic double t_start;
    struct gjob *next;           /* the FIFO, or the running list (mu)       */
} gjob;

typedef struct {
    sgen       *g;
    dspark_ctx *ctx;
    pthread_t   th;
    int         started;
} gworker;

struct sgen {
    int  engine;
    dspark_engine *e;            /* the engine and its stepping thread       */
    pthread_t th;
    int  th_up;
    dspark_engine_stats es;      /* after the last step (mu)                 */
    long batch_hist[SGEN_BATCH_BUCKETS + 1];
    gworker *w;                  /* one context per slot: n_slots workers    */
    int  n_slots, n_ctx;
    char kernels[256];
    pthread_mutex_t mu;
    pthread_cond_t  work, idle;
    gjob *qhead, *qtail;         /* waiting for a slot                       */
    gjob *run;                   /* running, in the order they started       */
    int   qlen, qmax, n_run, draining, stopping;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void job_free(gjob *j) {
    if (!j) return;
    free(j->prompt);
    free(j);
}

/* on_done for a job that never started */
static void finish_unrun(gjob *j, const char *stop) {
    dspark_stats st;
    memset(&st, 0, sizeof st);
    st.n_prompt = j->n_prompt;
    st.stop = stop;
    j->cb.on_done(j->cb.user, DSPARK_OK, NULL, &st, 0);
    job_free(j);
}

/* ========================================================================
 * The queue and the running list (mu held)
 * ===================================================================== */

static gjob *queue_pop(sgen *g) {
    gjob *j = g->qhead;
    if (!j) return NULL;
    g->qhead = j->next;
    if (!g->qhead) g->qtail = NULL;
    g->qlen--;
    j->next = NULL;
    return j;
}

static void run_add(sgen *g, gjob *j) {
    gjob **pp = &g->run;
    while (*pp) pp = &(*pp)->next;
    *pp = j;
    g->n_run++;
}

static void run_remove(sgen *g, gjob *j) {
    for (gjob **pp = &g->run; *pp; pp = &(*pp)->next)
        if (*pp == j) { *pp = j->next; break; }
    j->next = NULL;
    g->n_run--;
    pthread_cond_broadcast(&g->idle);
}

/* A running generation stops at its next token (or prompt chunk). */
static void cancel_running(sgen *g, gjob *j) {
    if (!g->engine) dspark_ctx_cancel_id(g->w[j->slot].ctx, j->id);
    else if (j->req) dspark_engine_cancel(g->e, j->req);   /* else: when it is handed over */
}

/* ========================================================================
 * A generation's callbacks (the generating thread)
 * ===================================================================== */

static int job_token(void *user, const dspark_token *t) {
    gjob *j = user;
    atomic_fetch_add(&j->n_generated, 1);
    return j->cb.on_token ? j->cb.on_token(j->cb.user, t) : 0;
}

static void job_start(void *user) {
    gjob *j = user;
    j->started = 1;
    atomic_store(&j->t_start, now_s());
    if (j->cb.on_start) j->cb.on_start(j->cb.user);
}

static void job_done(void *user, dspark_status rc, const dspark_error *err, const dspark_stats *st) {
    gjob *j = user;
    sgen *g = j->g;
    pthread_mutex_lock(&g->mu);
    const int cut = j->cut;
    pthread_mutex_unlock(&g->mu);
    dspark_stats s2 = *st;
    if (rc == DSPARK_OK && cut && !strcmp(s2.stop, "cancel")) s2.stop = "drain";
    j->cb.on_done(j->cb.user, rc, rc ? err : NULL, &s2, j->started);
    pthread_mutex_lock(&g->mu);
    run_remove(g, j);
    pthread_mutex_unlock(&g->mu);
    job_free(j);
}

static const dspark_engine_callbacks job_cbs = {job_start, job_done};

/* ========================================================================
 * The engine's stepping thread
 * ===================================================================== */

/* Queued jobs into the engine while sequence slots allow (mu held on entry
 * and exit; dropped around each submit). */
static void hand_over(sgen *g) {
    while (g->qhead && g->n_run < g->n_slots) {
        gjob *j = queue_pop(g);
        run_add(g, j);
        pthread_mutex_unlock(&g->mu);
        dspark_error err;
        const long id = dspark_engine_submit_ex(g->e, j->prompt, j->n_prompt, &j->gp, &job_cbs, &err);
        if (id < 0) {
            /* refused (a prompt too long for the context, bad parameters):
             * a generation that failed */
            dspark_stats st;
            memset(&st, 0, sizeof st);
            st.n_prompt = j->n_prompt;
            st.stop = "error";
            j->started = 1;
            job_done(j, err.code ? err.code : DSPARK_ERR_INTERNAL, &err, &st);
            pthread_mutex_lock(&g->mu);
            continue;
        }
        free(j->prompt);                              /* the scheduler has its copy */
        j->prompt = NULL;
        pthread_mutex_lock(&g->mu);
        j->req = id;
        if (j->cancel || j->cut) dspark_engine_cancel(g->e, id);   /* asked while it was handed over */
    }
}

static void *stepper(void *arg) {
    sgen *g = arg;
    int idle = 1;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (idle && !g->qhead && !g->stopping) pthread_cond_wait(&g->work, &g->mu);
        if (idle && !g->qhead && g->stopping) { pthread_mutex_unlock(&g->mu); break; }
        hand_over(g);
        pthread_mutex_unlock(&g->mu);
        dspark_error err;
        const int rc = dspark_engine_step(g->e, &err);
        if (rc < 0) fprintf(stderr, "dspark serve: engine step failed (its running generations end with an error): %s\n", err.message);
        dspark_engine_stats es;
        dspark_engine_get_stats(g->e, &es);
        pthread_mutex_lock(&g->mu);
        g->es = es;
        if (rc > 0) {
            int k = 0;
            while (k < SGEN_BATCH_BUCKETS && es.last_batch > sgen_batch_le[k]) k++;
            g->batch_hist[k]++;
        }
        pthread_mutex_unlock(&g->mu);
        idle = rc == 0;
    }
    return NULL;
}

/* ========================================================================
 * One context per slot: the workers
 * ===================================================================== */

static void *worker(void *arg) {
    gworker *w = arg;
    sgen *g = w->g;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->qhead && !g->stopping) pthread_cond_wait(&g->work, &g->mu);
        gjob *j = queue_pop(g);
        if (!j) { pthread_mutex_unlock(&g->mu); break; }
        j->slot = (int)(w - g->w);
        run_add(g, j);
        pthread_mutex_unlock(&g->mu);
        job_start(j);
        dspark_gen_params gp = j->gp;
        gp.id = j->id;
        dspark_stats st;
        dspark_error err;
        const dspark_status rc = dspark_generate(w->ctx, j->prompt, j->n_prompt, &gp, NULL, &st, &err);
        job_done(j, rc, &err, &st);
    }
    return NULL;
}

/* ========================================================================
 * The interface
 * ===================================================================== */

static void set_error(dspark_error *err, dspark_status code, const char *msg) {
    if (!err) return;
    err->code = code;
    snprintf(err->message, sizeof err->message, "%s", msg);
}

sgen *sgen_new(const dspark_model *m, const sgen_params *p, dspark_error *err) {
    if (p->n_slots < 1) { set_error(err, DSPARK_ERR_INVALID, "serve: at least one slot"); return NULL; }
    sgen *g = calloc(1, sizeof *g);
    if (!g || (!p->engine && !(g->w = calloc((size_t)p->n_slots, sizeof *g->w)))) {
        free(g);
        set_error(err, DSPARK_ERR_NOMEM, "out of memory");
        return NULL;
    }
    g->engine = p->engine;
    g->n_slots = p->n_slots;
    g->qmax = p->max_queue;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->work, NULL);
    pthread_cond_init(&g->idle, NULL);
    if (g->engine) {
        dspark_engine_params ep;
        dspark_engine_params_default(&ep);
        ep.n_seq_max = p->n_slots;
        ep.n_ctx = p->cp.n_ctx;
        ep.n_pages = p->kv_pages;
        ep.step_rows = p->step_rows;
        ep.prefill_chunk = p->prefill_chunk;
        ep.prefix_cache = p->prefix_cache;
        ep.n_threads = p->cp.n_threads;
        ep.kernels = p->cp.kernels;
        ep.fast = p->cp.fast;
        ep.canonical = p->cp.canonical;
        if (!(g->e = dspark_engine_new(m, &ep, err))) { sgen_free(g); return NULL; }
        g->n_ctx = dspark_engine_n_ctx(g->e);
        snprintf(g->kernels, sizeof g->kernels, "%s", dspark_engine_kernels(g->e));
        if (pthread_create(&g->th, NULL, stepper, g)) {
            set_error(err, DSPARK_ERR_NOMEM, "cannot start the scheduler thread");
            sgen_free(g);
            return NULL;
        }
        g->th_up = 1;
        return g;
    }
    for (int i = 0; i < p->n_slots; i++) {
        g->w[i].g = g;
        if (!(g->w[i].ctx = dspark_ctx_new(m, &p->cp, err))) { sgen_free(g); return NULL; }
    }
    g->n_ctx = dspark_ctx_n_ctx(g->w[0].ctx);
    snprintf(g->kernels, sizeof g->kernels, "%s", dspark_ctx_kernels(g->w[0].ctx));
    for (int i = 0; i < p->n_slots; i++) {
        if (pthread_create(&g->w[i].th, NULL, worker, &g->w[i])) {
            set_error(err, DSPARK_ERR_NOMEM, "cannot start a worker thread");
            sgen_free(g);
            return NULL;
        }
        g->w[i].started = 1;
        g->th_up = 1;
    }
    return g;
}

int sgen_n_ctx(const sgen *g) { return g->n_ctx; }
const char *sgen_kernels(const sgen *g) { return g->kernels; }

int sgen_submit_n(sgen *g, int n, const uint64_t *ids, const int32_t *prompt, int n_prompt, const dspark_gen_params *gps,
                  const sgen_cb *cbs) {
    gjob *first = NULL, *last = NULL;
    for (int k = 0; k < n; k++) {
        gjob *j = calloc(1, sizeof *j);
        if (j) j->prompt = malloc((size_t)(n_prompt > 0 ? n_prompt : 1) * sizeof *j->prompt);
        if (!j || !j->prompt) {
            job_free(j);
            while (first) { gjob *nx = first->next; job_free(first); first = nx; }
            return SGEN_NOMEM;
        }
        if (n_prompt > 0) memcpy(j->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
        j->g = g;
        j->n_prompt = n_prompt;
        j->id = ids[k];
        j->gp = gps[k];
        j->gp.on_token = NULL;
        j->gp.on_token_ex = job_token;
        j->gp.user = j;
        j->cb = cbs[k];
        atomic_init(&j->n_generated, 0);
        atomic_init(&j->t_start, 0.0);
        if (last) last->next = j; else first = j;
        last = j;
    }
    pthread_mutex_lock(&g->mu);
    const int rc = g->draining ? SGEN_DRAINING : g->qlen + n > g->qmax ? SGEN_FULL : SGEN_OK;
    if (rc == SGEN_OK && first) {
        if (g->qtail) g->qtail->next = first; else g->qhead = first;
        g->qtail = last;
        g->qlen += n;
        pthread_cond_broadcast(&g->work);
        first = NULL;
    }
    pthread_mutex_unlock(&g->mu);
    while (first) { gjob *nx = first->next; job_free(first); first = nx; }
    return rc;
}

int sgen_submit(sgen *g, uint64_t id, const int32_t *prompt, int n_prompt, const dspark_gen_params *gp, const sgen_cb *cb) {
    return sgen_submit_n(g, 1, &id, prompt, n_prompt, gp, cb);
}

void sgen_cancel(sgen *g, uint64_t id) {
    gjob *found = NULL;
    pthread_mutex_lock(&g->mu);
    for (gjob **pp = &g->qhead, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next)
        if ((*pp)->id == id) {
            found = *pp;
            *pp = found->next;
            if (g->qtail == found) g->qtail = prev;
            g->qlen--;
            break;
        }
    if (!found)
        for (gjob *j = g->run; j; j = j->next)
            if (j->id == id) {
                j->cancel = 1;
                cancel_running(g, j);
            }
    pthread_mutex_unlock(&g->mu);
    if (found) finish_unrun(found, "cancel");
}

int sgen_drain(sgen *g, double timeout_s) {
    pthread_mutex_lock(&g->mu);
    g->draining = 1;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    const double t = (double)dl.tv_sec + 1e-9 * dl.tv_nsec + (timeout_s > 0 ? timeout_s : 0);
    dl.tv_sec = (time_t)t;
    dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
    while ((g->qhead || g->n_run) && pthread_cond_timedwait(&g->idle, &g->mu, &dl) == 0) {}
    /* the deadline: cut what is left */
    gjob *q = g->qhead;
    int cut = g->qlen;
    g->qhead = g->qtail = NULL;
    g->qlen = 0;
    for (gjob *j = g->run; j; j = j->next) {
        j->cut = 1;
        cancel_running(g, j);
        cut++;
    }
    pthread_mutex_unlock(&g->mu);
    while (q) { gjob *nx = q->next; finish_unrun(q, "drain"); q = nx; }
    pthread_mutex_lock(&g->mu);
    while (g->n_run) pthread_cond_wait(&g->idle, &g->mu);
    pthread_mutex_unlock(&g->mu);
    return cut;
}

void sgen_status(sgen *g, sgen_stat *st) {
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&g->mu);
    st->engine = g->engine;
    st->slots = g->n_slots;
    st->busy = g->n_run;
    st->queued = g->qlen;
    st->max_queue = g->qmax;
    st->draining = g->draining;
    for (const gjob *j = g->run; j; j = j->next) st->kv_used += j->n_prompt + atomic_load(&j->n_generated);
    st->kv_capacity = (long)g->n_slots * g->n_ctx;
    const dspark_engine_stats es = g->es;
    memcpy(st->batch_hist, g->batch_hist, sizeof st->batch_hist);
    pthread_mutex_unlock(&g->mu);
    if (!g->engine) return;
    st->waiting = es.waiting;
    st->last_batch = es.last_batch;
    st->pages_free = es.pages_free;
    st->pages_total = es.pages_total;
    st->steps = es.steps;
    st->rows = es.rows;
    st->preemptions = es.preemptions;
    st->prompt_tokens = es.prompt_tokens;
    st->cached_tokens = es.cached_tokens;
    /* the pool's positions: pages held by sequences (cached prompt pages
     * no sequence holds count as free: they are evicted on demand) */
    st->kv_used = (long)(es.pages_total - es.pages_free) * 16;
    st->kv_capacity = (long)es.pages_total * 16;
}

void sgen_slots(sgen *g, sgen_slot *out, int n) {
    const double t = now_s();
    memset(out, 0, (size_t)(n > 0 ? n : 0) * sizeof *out);
    pthread_mutex_lock(&g->mu);
    int k = 0;
    for (const gjob *j = g->run; j; j = j->next, k++) {
        const int i = g->engine ? k : j->slot;           /* the engine: in the order they started */
        if (i >= n) continue;
        const double t0 = atomic_load(&j->t_start);
        out[i] = (sgen_slot){1, j->id, j->n_prompt, atomic_load(&j->n_generated), t0 > 0 ? t - t0 : 0.0};
    }
    pthread_mutex_unlock(&g->mu);
}

void sgen_free(sgen *g) {
    if (!g) return;
    if (g->th_up) sgen_drain(g, 0);
    pthread_mutex_lock(&g->mu);
    g->stopping = 1;
    pthread_cond_broadcast(&g->work);
    pthread_mutex_unlock(&g->mu);
    if (g->engine && g->th_up) pthread_join(g->th, NULL);
    for (int i = 0; !g->engine && i < g->n_slots; i++)
        if (g->w[i].started) pthread_join(g->w[i].th, NULL);
    dspark_engine_free(g->e);
    for (int i = 0; !g->engine && i < g->n_slots; i++) dspark_ctx_free(g->w[i].ctx);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->work);
    pthread_cond_destroy(&g->idle);
    free(g->w);
    free(g);
}
