/* serve_gen.c — serve_gen.h today: a FIFO queue and one worker thread per
 * dspark_ctx. A request's answer is a pure function of the request (the
 * sampler is keyed on seed and position, contexts share nothing mutable), so
 * it does not depend on which worker runs it or what runs beside it.
 *
 * Locking: one mutex over the queue and the slots' running jobs. Callbacks
 * are never called with it held, and a running job is cancelled through its
 * context by id (dspark_ctx_cancel_id), so a cancel that races the end of a
 * generation can only miss it, never stop the next one. */
#include "serve_gen.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct gjob {
    uint64_t id;
    int32_t *prompt;
    int      n_prompt;
    dspark_gen_params gp;
    sgen_cb  cb;
    struct gjob *next;
} gjob;

typedef struct {
    sgen       *g;
    dspark_ctx *ctx;
    pthread_t   th;
    int         started;
    gjob       *job;            /* running (under g->mu)                    */
    atomic_int  n_generated;
    double      t_start;
    int         cut;            /* the drain cut it (under g->mu)           */
} gslot;

struct sgen {
    const dspark_model *m;
    gslot          *slot;
    int             n_slots;
    pthread_mutex_t mu;
    pthread_cond_t  work, idle;
    gjob           *qhead, *qtail;
    int             qlen, qmax, busy, draining, stopping;
    int             n_ctx;
    char            kernels[256];
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

/* on_done for a job that never ran */
static void finish_unrun(gjob *j, const char *stop) {
    dspark_stats st;
    memset(&st, 0, sizeof st);
    st.n_prompt = j->n_prompt;
    st.stop = stop;
    j->cb.on_done(j->cb.user, DSPARK_OK, NULL, &st, 0);
    job_free(j);
}

static int on_token(void *user, const dspark_token *t) {
    gslot *s = user;
    atomic_fetch_add(&s->n_generated, 1);
    gjob *j = s->job;                              /* set before the generation starts */
    return j->cb.on_token ? j->cb.on_token(j->cb.user, t) : 0;
}

static void *worker(void *arg) {
    gslot *s = arg;
    sgen *g = s->g;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->qhead && !g->stopping) pthread_cond_wait(&g->work, &g->mu);
        gjob *j = g->qhead;
        if (!j) { pthread_mutex_unlock(&g->mu); break; }
        g->qhead = j->next;
        if (!g->qhead) g->qtail = NULL;
        g->qlen--;
        g->busy++;
        s->job = j;
        s->cut = 0;
        atomic_store(&s->n_generated, 0);
        s->t_start = now_s();
        pthread_mutex_unlock(&g->mu);

        if (j->cb.on_start) j->cb.on_start(j->cb.user);
        dspark_gen_params gp = j->gp;
        gp.on_token = NULL;
        gp.on_token_ex = on_token;
        gp.user = s;
        gp.id = j->id;
        dspark_stats st;
        dspark_error err;
        dspark_status rc = dspark_generate(s->ctx, j->prompt, j->n_prompt, &gp, NULL, &st, &err);
        pthread_mutex_lock(&g->mu);
        const int cut = s->cut;
        pthread_mutex_unlock(&g->mu);
        if (rc == DSPARK_OK && cut && !strcmp(st.stop, "cancel")) st.stop = "drain";
        j->cb.on_done(j->cb.user, rc, rc ? &err : NULL, &st, 1);
        pthread_mutex_lock(&g->mu);
        s->job = NULL;
        g->busy--;
        pthread_cond_broadcast(&g->idle);
        pthread_mutex_unlock(&g->mu);
        job_free(j);
    }
    return NULL;
}

sgen *sgen_new(const dspark_model *m, const dspark_ctx_params *cp, int n_slots, int max_queue, dspark_error *err) {
    sgen *g = calloc(1, sizeof *g);
    if (!g || n_slots < 1 || !(g->slot = calloc((size_t)n_slots, sizeof *g->slot))) {
        free(g);
        if (err) { err->code = DSPARK_ERR_NOMEM; snprintf(err->message, sizeof err->message, "out of memory"); }
        return NULL;
    }
    g->m = m;
    g->n_slots = n_slots;
    g->qmax = max_queue;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->work, NULL);
    pthread_cond_init(&g->idle, NULL);
    for (int i = 0; i < n_slots; i++) {
        g->slot[i].g = g;
        atomic_init(&g->slot[i].n_generated, 0);
        if (!(g->slot[i].ctx = dspark_ctx_new(m, cp, err))) { sgen_free(g); return NULL; }
    }
    g->n_ctx = dspark_ctx_n_ctx(g->slot[0].ctx);
    snprintf(g->kernels, sizeof g->kernels, "%s", dspark_ctx_kernels(g->slot[0].ctx));
    for (int i = 0; i < n_slots; i++) {
        if (pthread_create(&g->slot[i].th, NULL, worker, &g->slot[i])) {
            if (err) { err->code = DSPARK_ERR_NOMEM; snprintf(err->message, sizeof err->message, "cannot start a worker thread"); }
            sgen_free(g);
            return NULL;
        }
        g->slot[i].started = 1;
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
        memcpy(j->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
        j->n_prompt = n_prompt;
        j->id = ids[k];
        j->gp = gps[k];
        j->cb = cbs[k];
        if (last) last->next = j; else first = j;
        last = j;
    }
    pthread_mutex_lock(&g->mu);
    int rc = g->draining ? SGEN_DRAINING : g->qlen + n > g->qmax ? SGEN_FULL : SGEN_OK;
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
        for (int i = 0; i < g->n_slots; i++)
            if (g->slot[i].job && g->slot[i].job->id == id) dspark_ctx_cancel_id(g->slot[i].ctx, id);
    pthread_mutex_unlock(&g->mu);
    if (found) finish_unrun(found, "cancel");
}

int sgen_drain(sgen *g, double timeout_s) {
    pthread_mutex_lock(&g->mu);
    g->draining = 1;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    double t = (double)dl.tv_sec + 1e-9 * dl.tv_nsec + (timeout_s > 0 ? timeout_s : 0);
    dl.tv_sec = (time_t)t;
    dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
    while ((g->qhead || g->busy) && pthread_cond_timedwait(&g->idle, &g->mu, &dl) == 0) {}
    /* the deadline: cut what is left */
    gjob *q = g->qhead;
    int cut = g->qlen;
    g->qhead = g->qtail = NULL;
    g->qlen = 0;
    for (int i = 0; i < g->n_slots; i++)
        if (g->slot[i].job) {
            g->slot[i].cut = 1;
            dspark_ctx_cancel_id(g->slot[i].ctx, g->slot[i].job->id);
            cut++;
        }
    pthread_mutex_unlock(&g->mu);
    while (q) { gjob *nx = q->next; finish_unrun(q, "drain"); q = nx; }
    pthread_mutex_lock(&g->mu);
    while (g->busy) pthread_cond_wait(&g->idle, &g->mu);
    pthread_mutex_unlock(&g->mu);
    return cut;
}

void sgen_status(sgen *g, sgen_stat *st) {
    pthread_mutex_lock(&g->mu);
    st->slots = g->n_slots;
    st->busy = g->busy;
    st->queued = g->qlen;
    st->max_queue = g->qmax;
    st->draining = g->draining;
    st->kv_used = 0;
    for (int i = 0; i < g->n_slots; i++)
        if (g->slot[i].job) st->kv_used += g->slot[i].job->n_prompt + atomic_load(&g->slot[i].n_generated);
    st->kv_capacity = (long)g->n_slots * g->n_ctx;
    pthread_mutex_unlock(&g->mu);
}

void sgen_slots(sgen *g, sgen_slot *out, int n) {
    const double t = now_s();
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < n && i < g->n_slots; i++) {
        const gjob *j = g->slot[i].job;
        out[i] = (sgen_slot){ j != NULL, j ? j->id : 0, j ? j->n_prompt : 0, j ? atomic_load(&g->slot[i].n_generated) : 0,
                              j ? t - g->slot[i].t_start : 0.0 };
    }
    pthread_mutex_unlock(&g->mu);
}

void sgen_free(sgen *g) {
    if (!g) return;
    int any = 0;
    for (int i = 0; i < g->n_slots; i++) any |= g->slot[i].started;
    if (any) sgen_drain(g, 0);
    pthread_mutex_lock(&g->mu);
    g->stopping = 1;
    pthread_cond_broadcast(&g->work);
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < g->n_slots; i++)
        if (g->slot[i].started) pthread_join(g->slot[i].th, NULL);
    for (int i = 0; i < g->n_slots; i++) dspark_ctx_free(g->slot[i].ctx);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->work);
    pthread_cond_destroy(&g->idle);
    free(g->slot);
    free(g);
}
