/* cmd_serve.c — `dspark serve`: an OpenAI- and llama-server-compatible HTTP
 * server on GNU libmicrohttpd, built on the public API (include/dspark.h).
 *
 * Shape. The generation side is behind serve_gen.h (submit / cancel by id /
 * drain); this file is HTTP only. libmicrohttpd runs its own event loop
 * (epoll) on --http-threads threads, and no handler ever blocks: a request
 * that waits for tokens is suspended (MHD_suspend_connection) and resumed by
 * the generating thread when there is something to send, so a connection
 * costs a socket and a little memory, never a thread.
 *
 * The hazards, each handled as a class:
 *   slow clients   a connection must deliver its request within
 *                  --request-timeout (from its start, or from the end of its
 *                  previous response); a watcher thread shuts down the
 *                  sockets that do not, whatever they trickle. Global and
 *                  per-IP connection limits keep one client from taking them
 *                  all. (bench/serve_conn.sh measures this against the
 *                  thread-per-connection server it replaces.)
 *   disconnects    the watcher polls every connection that is being answered
 *                  for a hang-up (POLLRDHUP), suspended or not; a client that
 *                  leaves cancels its generations, streamed or not, and the
 *                  slot is free after the current token.
 *   SIGTERM/SIGINT stop accepting (MHD_quiesce_daemon), let running and
 *                  queued generations finish for --drain-timeout seconds,
 *                  cut the rest with a proper final chunk (finish_reason
 *                  "abort", then [DONE]) or a 503, and exit 0 only when
 *                  nothing was cut. A second signal cuts at once.
 *   NUL / bytes    a body is JSON and only JSON (serve_req.c): whitespace
 *                  around it, no raw control bytes, no U+0000 in a string.
 *
 * Exactness: a request's answer is a pure function of the request (the
 * sampler is keyed on seed and position, contexts share nothing mutable),
 * so it does not depend on which worker runs it or what runs beside it;
 * tests/cli_serve.sh checks this under load and in a soak. */
#include "cli.h"
#include "serve.h"
#include "serve_gen.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define C "serve"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ========================================================================
 * Metrics
 * ===================================================================== */

enum { EP_COMPLETIONS, EP_CHAT, EP_MODELS, EP_HEALTH, EP_METRICS, EP_TOKENIZE, EP_DETOKENIZE, EP_PROPS, EP_SLOTS, EP_OTHER, EP_COUNT };
static const char *const ep_name[EP_COUNT] = { "completions", "chat_completions", "models", "health", "metrics",
                                               "tokenize", "detokenize", "props", "slots", "other" };
static const int codes[] = { 200, 204, 400, 401, 403, 404, 405, 413, 500, 503 };
#define N_CODES ((int)(sizeof codes / sizeof codes[0]))

/* Prometheus histogram: cumulative buckets at print time */
static const double lat_le[] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120 };
static const double tpot_le[] = { 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1 };
#define N_LAT (sizeof lat_le / sizeof lat_le[0])
#define N_TPOT (sizeof tpot_le / sizeof tpot_le[0])
typedef struct { long b[16]; long n; double sum; } histo;

static void histo_add(histo *h, const double *le, size_t n, double v) {
    for (size_t i = 0; i < n; i++)
        if (v <= le[i]) { h->b[i]++; break; }
    h->n++;
    h->sum += v;
}

typedef struct {
    long   requests[EP_COUNT];
    long   responses[N_CODES + 1];       /* last slot: any other status     */
    long   generations, cancelled, failed, speculative, cut;
    long   prompt_tokens, generated_tokens;
    double prefill_s, generate_s;        /* sums of per-generation seconds  */
    long   rounds, drafted, accepted;
    long   timed_out, conn_open;
    histo  latency, ttft, queue, tpot;
} metrics;

/* ========================================================================
 * Server state
 * ===================================================================== */

typedef struct server server;
typedef struct req req;

/* One TCP connection, from accept to close: what the watcher needs. */
typedef struct {
    int      fd;
    uint64_t serial;
    double   since;                      /* when the current phase began    */
    int      phase;                      /* 0 awaiting a request, 1 its body, 2 answering */
    int      gone;                       /* hung up / shut down already     */
    req     *r;                          /* phase 2: the request answered   */
} conn_track;

struct server {
    dspark_model   *model;
    sgen           *gen;
    chat_tmpl       chat;
    dspark_grammar *json_object;
    api_limits      L;
    const char     *kernels, *api_key, *model_path;
    size_t          max_body;
    double          request_timeout;
    int             verbose, n_slots, engine, speculative;
    char          **cors;                /* allowed origins; "*" = any      */
    int             n_cors;
    atomic_long     next_id;
    atomic_int      draining, active;    /* generation requests alive       */
    pthread_mutex_t mmu;
    metrics         m;
    /* connections (cmu); lock order: cmu before a request's mu, never after */
    pthread_mutex_t cmu;
    conn_track    **conns;
    int             n_conns, cap_conns;
    uint64_t        next_serial;
    int             wake[2];
    pthread_t       watcher;
    int             watcher_up, stop_watcher;
};

static void count_response(server *s, int status) {
    int k = N_CODES;
    for (int i = 0; i < N_CODES; i++) if (codes[i] == status) k = i;
    pthread_mutex_lock(&s->mmu);
    s->m.responses[k]++;
    pthread_mutex_unlock(&s->mmu);
}

/* ========================================================================
 * Requests: n choices, each one generation
 * ===================================================================== */

typedef struct {
    req      *r;
    int       index;
    uint64_t  gid;
    sbuf      text;                      /* raw generated bytes             */
    size_t    cut;                       /* visible bytes (a stop string ends it) */
    api_tok  *tok;
    int       n_tok, cap_tok;
    int       started, done;
    dspark_status rc;
    dspark_error  err;
    dspark_stats  st;
    double    t_first, t_last;
    /* streaming (the connection's thread, under the request's mu) */
    size_t    sent;
    int       t_sent, first_sent, final_sent;
} choice;

struct req {
    server         *s;
    atomic_int      refs;
    pthread_mutex_t mu;
    int             ep;
    api_request     q;
    api_meta        meta;
    char            id[48];
    uint64_t        serial;
    choice         *ch;
    int             n, n_done;
    /* the connection: NULL once it is gone (mu) */
    struct MHD_Connection *conn;
    int             suspended, gone, stream;
    sbuf            out;                 /* SSE bytes not yet handed to MHD */
    size_t          out_off;
    int             done_sent;
    double          t_arrival, t_first;
    int             recorded;
};

static void req_unref(req *r) {
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    for (int k = 0; k < r->n; k++) {
        sbuf_free(&r->ch[k].text);
        free(r->ch[k].tok);
    }
    free(r->ch);
    sbuf_free(&r->out);
    api_request_free(&r->q);
    pthread_mutex_destroy(&r->mu);
    atomic_fetch_sub(&r->s->active, 1);
    free(r);
}

/* under r->mu: let the connection run again (it has something to send) */
static void wake_conn(req *r) {
    if (r->conn && r->suspended) {
        r->suspended = 0;
        MHD_resume_connection(r->conn);
    }
}

static void record(server *s, req *r) {
    const double t = now_s();
    pthread_mutex_lock(&s->mmu);
    metrics *m = &s->m;
    histo_add(&m->latency, lat_le, N_LAT, t - r->t_arrival);
    if (r->t_first > 0) histo_add(&m->ttft, lat_le, N_LAT, r->t_first - r->t_arrival);
    for (int k = 0; k < r->n; k++) {
        const choice *c = &r->ch[k];
        if (!c->started) continue;
        if (c->rc != DSPARK_OK) { m->failed++; continue; }
        m->generations++;
        if (!strcmp(c->st.stop, "cancel")) m->cancelled++;
        if (!strcmp(c->st.stop, "drain")) m->cut++;
        m->prompt_tokens += c->st.n_prompt;
        m->generated_tokens += c->st.n_generated;
        m->prefill_s += c->st.t_prefill_s;
        m->generate_s += c->st.t_total_s - c->st.t_prefill_s;
        if (c->st.n_generated > 1 && c->t_last > c->t_first)
            histo_add(&m->tpot, tpot_le, N_TPOT, (c->t_last - c->t_first) / (c->st.n_generated - 1));
        if (c->st.speculative) {
            m->speculative++;
            m->rounds += c->st.rounds;
            m->drafted += c->st.drafted;
            m->accepted += c->st.accepted;
        }
    }
    pthread_mutex_unlock(&s->mmu);
    if (s->verbose) {
        const choice *c = &r->ch[0];
        fprintf(stderr, "request id=%s endpoint=%s n=%d status=%s n_prompt=%d n_gen=%d stop=%s speculative=%d mean_accepted_len=%.3f "
                        "ttft_s=%.4f total_s=%.4f tok_s=%.1f\n",
                r->id, ep_name[r->ep], r->n, dspark_status_name(c->rc), c->st.n_prompt, c->st.n_generated, c->st.stop ? c->st.stop : "-",
                c->st.speculative, c->st.mean_accepted_len, r->t_first > 0 ? r->t_first - r->t_arrival : 0.0, t - r->t_arrival,
                c->st.tok_s);
    }
}

/* ---- the generation side's callbacks (a worker thread) ---------------------- */

static void gen_start(void *user) {
    choice *c = user;
    req *r = c->r;
    pthread_mutex_lock(&r->s->mmu);
    histo_add(&r->s->m.queue, lat_le, N_LAT, now_s() - r->t_arrival);
    pthread_mutex_unlock(&r->s->mmu);
    pthread_mutex_lock(&r->mu);
    c->started = 1;
    pthread_mutex_unlock(&r->mu);
}

static int gen_token(void *user, const dspark_token *t) {
    choice *c = user;
    req *r = c->r;
    const double now = now_s();
    pthread_mutex_lock(&r->mu);
    const size_t old = c->text.len;
    sbuf_add(&c->text, t->bytes, t->n);
    if (c->n_tok == c->cap_tok) {
        int cap = c->cap_tok ? 2 * c->cap_tok : 64;
        api_tok *nt = realloc(c->tok, (size_t)cap * sizeof *nt);
        if (nt) { c->tok = nt; c->cap_tok = cap; }
    }
    int rc = c->text.oom || c->n_tok == c->cap_tok;       /* out of memory: stop */
    if (!rc) {
        api_tok *k = &c->tok[c->n_tok++];
        k->id = t->id;
        k->off = old;
        k->len = t->n;
        k->logprob = t->logprob;
        k->n_top = t->n_top < 20 ? t->n_top : 20;
        for (int i = 0; i < k->n_top; i++) { k->top_id[i] = t->top_id[i]; k->top_lp[i] = t->top_logprob[i]; }
        /* a stop string ends the text where it starts (OpenAI: not included) */
        const long hit = r->q.stop.n ? stop_find(&r->q.stop, c->text.p, c->text.len, old) : -1;
        c->cut = hit >= 0 ? (size_t)hit : c->text.len;
        if (hit >= 0) rc = DSPARK_STOP;
    }
    if (!c->t_first) c->t_first = now;
    c->t_last = now;
    if (!r->t_first) r->t_first = now;
    if (r->stream) wake_conn(r);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static void gen_done(void *user, dspark_status rc, const dspark_error *err, const dspark_stats *st, int ran) {
    choice *c = user;
    req *r = c->r;
    pthread_mutex_lock(&r->mu);
    c->rc = rc;
    if (rc && err) c->err = *err;
    c->st = *st;
    c->done = 1;
    if (ran) c->started = 1;
    if (c->cut > c->text.len || !r->q.stop.n) c->cut = c->text.len;
    const int all = ++r->n_done == r->n;
    if (all || r->stream) wake_conn(r);
    pthread_mutex_unlock(&r->mu);
    if (all) record(r->s, r);
    req_unref(r);
}

/* the choices that are not done yet get cancelled (their client left) */
static void req_cancel(req *r) {
    uint64_t ids[128];
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (int k = 0; k < r->n; k++)
        if (!r->ch[k].done) ids[n++] = r->ch[k].gid;
    pthread_mutex_unlock(&r->mu);
    for (int k = 0; k < n; k++) sgen_cancel(r->s->gen, ids[k]);
}

static api_choice view(const req *r, const choice *c) {
    return (api_choice){ c->index, c->text.p ? c->text.p : "", c->text.len, c->cut, c->tok, c->n_tok,
                         c->done ? api_finish_reason(&c->st, c->cut < c->text.len) : NULL, &c->st, r->q.gp.seed + (uint64_t)c->index };
}

/* ========================================================================
 * Connections: the watcher (request deadlines, hang-ups)
 * ===================================================================== */

static conn_track *track_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? (conn_track *)ci->socket_context : NULL;
}

static void track_phase(server *s, struct MHD_Connection *c, int phase, req *r) {
    conn_track *t = track_of(c);
    if (!t) return;
    pthread_mutex_lock(&s->cmu);
    t->phase = phase;
    t->since = now_s();
    t->r = phase == 2 ? r : NULL;
    pthread_mutex_unlock(&s->cmu);
    if (phase == 2) { char b = 1; (void)!write(s->wake[1], &b, 1); }
}

static void notify_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_track *t = calloc(1, sizeof *t);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = t;
        if (!t) return;
        t->fd = ci ? ci->connect_fd : -1;
        t->since = now_s();
        pthread_mutex_lock(&s->cmu);
        t->serial = ++s->next_serial;
        if (s->n_conns == s->cap_conns) {
            int cap = s->cap_conns ? 2 * s->cap_conns : 64;
            conn_track **nc = realloc(s->conns, (size_t)cap * sizeof *nc);
            if (nc) { s->conns = nc; s->cap_conns = cap; }
        }
        if (s->n_conns < s->cap_conns) s->conns[s->n_conns++] = t;
        else { free(t); *socket_context = NULL; }
        pthread_mutex_unlock(&s->cmu);
        pthread_mutex_lock(&s->mmu);
        s->m.conn_open++;
        pthread_mutex_unlock(&s->mmu);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        /* called before the socket is closed: the watcher never shuts down
         * a descriptor another connection has been given */
        conn_track *t = *socket_context;
        if (!t) return;
        pthread_mutex_lock(&s->cmu);
        for (int i = 0; i < s->n_conns; i++)
            if (s->conns[i] == t) { s->conns[i] = s->conns[--s->n_conns]; break; }
        pthread_mutex_unlock(&s->cmu);
        free(t);
        *socket_context = NULL;
        pthread_mutex_lock(&s->mmu);
        s->m.conn_open--;
        pthread_mutex_unlock(&s->mmu);
    }
}

static void *watcher_main(void *arg) {
    server *s = arg;
    struct pollfd *pf = NULL;
    uint64_t *serial = NULL;
    int cap = 0;
    for (;;) {
        pthread_mutex_lock(&s->cmu);
        if (s->stop_watcher) { pthread_mutex_unlock(&s->cmu); break; }
        if (cap < s->n_conns + 1) {
            cap = 2 * (s->n_conns + 1);
            struct pollfd *np = realloc(pf, (size_t)cap * sizeof *np);
            uint64_t *ns = realloc(serial, (size_t)cap * sizeof *ns);
            if (np) pf = np;
            if (ns) serial = ns;
            if (!np || !ns) cap = 0;
        }
        int n = 0;
        const double t = now_s();
        long timed_out = 0;
        if (cap) {
            pf[n++] = (struct pollfd){ s->wake[0], POLLIN, 0 };
            for (int i = 0; i < s->n_conns; i++) {
                conn_track *c = s->conns[i];
                if (c->gone || c->fd < 0) continue;
                if (c->phase < 2 && t - c->since > s->request_timeout) {
                    /* too slow to send its request: the connection ends
                     * (MHD sees the socket fail and closes it) */
                    shutdown(c->fd, SHUT_RDWR);
                    c->gone = 1;
                    timed_out++;
                } else if (c->phase == 2) {
                    serial[n] = c->serial;
                    pf[n++] = (struct pollfd){ c->fd, POLLRDHUP, 0 };
                }
            }
        }
        pthread_mutex_unlock(&s->cmu);
        if (timed_out) {
            pthread_mutex_lock(&s->mmu);
            s->m.timed_out += timed_out;
            pthread_mutex_unlock(&s->mmu);
        }
        int rc = poll(pf, (nfds_t)n, 100);
        if (rc <= 0) continue;
        if (pf[0].revents & POLLIN) { char b[64]; (void)!read(s->wake[0], b, sizeof b); }
        /* hung up: cancel what its request is generating, and let MHD see it */
        req *gone[64];
        int n_gone = 0;
        pthread_mutex_lock(&s->cmu);
        for (int k = 1; k < n; k++) {
            if (!(pf[k].revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
            for (int i = 0; i < s->n_conns; i++) {
                conn_track *c = s->conns[i];
                if (c->serial != serial[k] || c->gone) continue;
                c->gone = 1;
                if (c->r && n_gone < 64) { atomic_fetch_add(&c->r->refs, 1); gone[n_gone++] = c->r; }
            }
        }
        pthread_mutex_unlock(&s->cmu);
        for (int k = 0; k < n_gone; k++) {
            req *r = gone[k];
            pthread_mutex_lock(&r->mu);
            r->gone = 1;
            wake_conn(r);
            pthread_mutex_unlock(&r->mu);
            req_cancel(r);
            req_unref(r);
        }
    }
    free(pf);
    free(serial);
    return NULL;
}

/* ========================================================================
 * HTTP helpers: responses, CORS, auth
 * ===================================================================== */

typedef struct {
    int    ep, post, options;
    sbuf   body;
    int    too_big;
    int    answered;                 /* a response was queued already       */
    req   *r;                        /* a generation request in flight      */
    char   origin[256];              /* an allowed Origin to echo, or ""    */
} conn_state;

static void cors_headers(const conn_state *cs, struct MHD_Response *r) {
    if (!cs || !cs->origin[0]) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", cs->origin);
    MHD_add_response_header(r, "Vary", "Origin");
}

static enum MHD_Result send_body(server *s, struct MHD_Connection *c, const conn_state *cs, int status, const char *ctype, char *body) {
    if (!body) { status = 500; body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}"); }
    if (!body) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(body); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 405 && cs) MHD_add_response_header(r, "Allow", cs->post ? "GET, HEAD, OPTIONS" : "POST, OPTIONS");
    if (atomic_load(&s->draining)) MHD_add_response_header(r, "Connection", "close");
    cors_headers(cs, r);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count_response(s, status);
    return ret;
}

static enum MHD_Result send_error(server *s, struct MHD_Connection *c, const conn_state *cs, const api_error *e) {
    return send_body(s, c, cs, e->status, "application/json", api_error_json(e));
}

static enum MHD_Result send_err(server *s, struct MHD_Connection *c, const conn_state *cs, int status, const char *type,
                                const char *code, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result send_err(server *s, struct MHD_Connection *c, const conn_state *cs, int status, const char *type,
                                const char *code, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_error e;
    api_error_set(&e, status, type, NULL, code, "%s", msg);   /* repaired: a URL or method may be any bytes */
    return send_error(s, c, cs, &e);
}

/* Constant-time comparison of the Authorization header with the key. */
static int authorized(const server *s, struct MHD_Connection *c) {
    if (!s->api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    h += 7;
    size_t a = strlen(h), b = strlen(s->api_key);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)h[i] ^ (unsigned char)s->api_key[i];
    return diff == 0;
}

/* The request's Origin when --cors-origins allows it ("" otherwise). */
static void cors_origin(const server *s, struct MHD_Connection *c, conn_state *cs) {
    const char *o = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    cs->origin[0] = 0;
    if (!o || !s->n_cors || strlen(o) >= sizeof cs->origin) return;
    for (int i = 0; i < s->n_cors; i++)
        if (!strcmp(s->cors[i], "*") || !strcmp(s->cors[i], o)) {
            snprintf(cs->origin, sizeof cs->origin, "%s", !strcmp(s->cors[i], "*") ? "*" : o);
            return;
        }
}

/* ========================================================================
 * GET endpoints
 * ===================================================================== */

static char *print_json(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

static char *models_json(const server *s) {
    cJSON *root = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(root, "data"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", s->L.model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "dspark");
    cJSON *d = cJSON_AddObjectToObject(m, "dspark");
    cJSON_AddNumberToObject(d, "n_ctx", s->L.n_ctx);
    cJSON_AddBoolToObject(d, "speculative", s->speculative);
    cJSON_AddStringToObject(d, "gen", s->engine ? "engine" : "ctx");
    cJSON_AddNumberToObject(d, "draft_block", dspark_model_draft_block(s->model));
    cJSON_AddStringToObject(d, "kernels", s->kernels);
    cJSON_AddStringToObject(d, "chat_template", chat_kind_name(s->chat.kind));
    return print_json(root);
}

/* llama-server's /props: what the server runs and its defaults */
static char *props_json(const server *s) {
    cJSON *root = cJSON_CreateObject(), *dg = cJSON_AddObjectToObject(root, "default_generation_settings");
    cJSON_AddNumberToObject(dg, "n_ctx", s->L.n_ctx);
    cJSON *p = cJSON_AddObjectToObject(dg, "params");
    cJSON_AddNumberToObject(p, "temperature", 1);
    cJSON_AddNumberToObject(p, "top_p", 1);
    cJSON_AddNumberToObject(p, "top_k", 0);
    cJSON_AddNumberToObject(p, "min_p", 0);
    cJSON_AddNumberToObject(p, "presence_penalty", 0);
    cJSON_AddNumberToObject(p, "frequency_penalty", 0);
    cJSON_AddNumberToObject(p, "max_tokens", s->L.max_tokens_limit);
    cJSON_AddStringToObject(p, "seed", "random unless given");
    cJSON_AddBoolToObject(p, "speculative", s->speculative);
    cJSON_AddNumberToObject(root, "total_slots", s->n_slots);
    cJSON_AddStringToObject(root, "model_path", s->model_path);
    cJSON_AddStringToObject(root, "model_alias", s->L.model_id);
    const char *t = dspark_model_chat_template(s->model);
    cJSON_AddItemToObject(root, "chat_template", api_str(t ? t : "", t ? strlen(t) : 0));
    cJSON_AddStringToObject(root, "chat_template_kind", chat_kind_name(s->chat.kind));
    cJSON_AddStringToObject(root, "chat_template_source", chat_tmpl_source(&s->chat));
    cJSON_AddNumberToObject(root, "eos_token", dspark_model_eos(s->model));
    char b[64];
    snprintf(b, sizeof b, "dspark %s", dspark_version());
    cJSON_AddStringToObject(root, "build_info", b);
    cJSON_AddStringToObject(root, "kernels", s->kernels);
    cJSON_AddNumberToObject(root, "draft_block", dspark_model_draft_block(s->model));
    cJSON *mod = cJSON_AddObjectToObject(root, "modalities");
    cJSON_AddBoolToObject(mod, "vision", 0);
    cJSON_AddBoolToObject(mod, "audio", 0);
    return print_json(root);
}

static char *slots_json(server *s) {
    sgen_slot *sl = calloc((size_t)s->n_slots, sizeof *sl);
    if (!sl) return NULL;
    sgen_slots(s->gen, sl, s->n_slots);
    cJSON *root = cJSON_CreateArray();
    for (int i = 0; i < s->n_slots; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", i);
        cJSON_AddNumberToObject(o, "n_ctx", s->L.n_ctx);
        cJSON_AddBoolToObject(o, "is_processing", sl[i].busy);
        cJSON_AddNumberToObject(o, "id_task", sl[i].busy ? (double)(sl[i].id >> 8) : -1);
        cJSON_AddNumberToObject(o, "n_prompt_tokens", sl[i].n_prompt);
        cJSON_AddNumberToObject(o, "n_decoded", sl[i].n_generated);
        cJSON_AddNumberToObject(o, "running_s", sl[i].running_s);
        cJSON_AddItemToArray(root, o);
    }
    free(sl);
    return print_json(root);
}

static void histo_text(sbuf *b, const char *name, const char *help, const histo *h, const double *le, size_t n) {
    sbuf_addf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    long cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += h->b[i];
        sbuf_addf(b, "%s_bucket{le=\"%g\"} %ld\n", name, le[i], cum);
    }
    sbuf_addf(b, "%s_bucket{le=\"+Inf\"} %ld\n%s_sum %.6f\n%s_count %ld\n", name, h->n, name, h->sum, name, h->n);
}

static void gauge(sbuf *b, const char *name, const char *help, double v) {
    sbuf_addf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.6g\n", name, help, name, name, v);
}

static void counter(sbuf *b, const char *name, const char *help, double v) {
    sbuf_addf(b, "# HELP %s %s\n# TYPE %s counter\n%s %.6f\n", name, help, name, name, v);
}

/* A Prometheus label value: backslash, double quote and line feed escaped
 * (the text format's only escapes), everything else as it is. */
static void label_value(sbuf *b, const char *v) {
    for (const char *p = v; *p; p++) {
        if (*p == '\\') sbuf_adds(b, "\\\\");
        else if (*p == '"') sbuf_adds(b, "\\\"");
        else if (*p == '\n') sbuf_adds(b, "\\n");
        else sbuf_add(b, p, 1);
    }
}

/* The engine's side: batch sizes, the scheduler's queue, the prefix cache,
 * the KV pages, preemptions. */
static void engine_metrics(sbuf *b, const sgen_stat *st) {
    sbuf_adds(b, "# HELP dspark_batch_rows Engine steps by rows in the step's batch (decode rows and prompt chunks of every "
                 "running generation).\n# TYPE dspark_batch_rows histogram\n");
    long cum = 0;
    for (int i = 0; i < SGEN_BATCH_BUCKETS; i++) {
        cum += st->batch_hist[i];
        sbuf_addf(b, "dspark_batch_rows_bucket{le=\"%d\"} %ld\n", sgen_batch_le[i], cum);
    }
    cum += st->batch_hist[SGEN_BATCH_BUCKETS];
    sbuf_addf(b, "dspark_batch_rows_bucket{le=\"+Inf\"} %ld\ndspark_batch_rows_sum %ld\ndspark_batch_rows_count %ld\n", cum,
              st->rows, st->steps);
    gauge(b, "dspark_batch_rows_last", "Rows in the last engine step.", st->last_batch);
    gauge(b, "dspark_batch_rows_mean", "Rows per engine step, over all steps.", st->steps ? (double)st->rows / (double)st->steps : 0.0);
    counter(b, "dspark_engine_steps_total", "Engine steps (one batched forward each).", (double)st->steps);
    gauge(b, "dspark_engine_running", "Generations in the engine, admitted (prompt or decoding) or waiting for pages.", st->busy);
    gauge(b, "dspark_engine_waiting_pages", "Generations in the engine waiting for KV pages.", st->waiting);
    counter(b, "dspark_engine_preemptions_total", "Generations preempted for pages (recomputed later: the same tokens).",
            (double)st->preemptions);
    counter(b, "dspark_prefix_cache_prompt_tokens_total", "Prompt tokens admitted to the engine.",
            (double)(st->prompt_tokens + st->cached_tokens));
    counter(b, "dspark_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache (not computed).",
            (double)st->cached_tokens);
    gauge(b, "dspark_prefix_cache_hit_ratio", "Cached / admitted prompt tokens.",
          st->prompt_tokens + st->cached_tokens ? (double)st->cached_tokens / (double)(st->prompt_tokens + st->cached_tokens) : 0.0);
    gauge(b, "dspark_kv_pages_used", "KV pool pages held by sequences.", st->pages_total - st->pages_free);
    gauge(b, "dspark_kv_pages_free", "KV pool pages free or evictable (cached prompt pages no sequence holds).", st->pages_free);
}

static char *metrics_text(server *s) {
    pthread_mutex_lock(&s->mmu);
    const metrics m = s->m;
    pthread_mutex_unlock(&s->mmu);
    sgen_stat st;
    sgen_status(s->gen, &st);
    sbuf b = { 0 };
    sbuf_adds(&b, "# HELP dspark_info Server build and configuration.\n# TYPE dspark_info gauge\ndspark_info{version=\"");
    label_value(&b, dspark_version());
    sbuf_adds(&b, "\",model=\"");
    label_value(&b, s->L.model_id);
    sbuf_adds(&b, "\",kernels=\"");
    label_value(&b, s->kernels);
    sbuf_addf(&b, "\",speculative=\"%s\",gen=\"%s\"} 1\n", s->speculative ? "true" : "false", s->engine ? "engine" : "ctx");
    sbuf_adds(&b, "# HELP dspark_requests_total HTTP requests by endpoint.\n# TYPE dspark_requests_total counter\n");
    for (int i = 0; i < EP_COUNT; i++) sbuf_addf(&b, "dspark_requests_total{endpoint=\"%s\"} %ld\n", ep_name[i], m.requests[i]);
    sbuf_adds(&b, "# HELP dspark_responses_total HTTP responses by status code.\n# TYPE dspark_responses_total counter\n");
    for (int i = 0; i < N_CODES; i++) sbuf_addf(&b, "dspark_responses_total{code=\"%d\"} %ld\n", codes[i], m.responses[i]);
    sbuf_addf(&b, "dspark_responses_total{code=\"other\"} %ld\n", m.responses[N_CODES]);
    counter(&b, "dspark_generations_total", "Generations run (a choice of a request each; cancelled ones included).", (double)m.generations);
    counter(&b, "dspark_generations_cancelled_total", "Generations stopped because the client went away.", (double)m.cancelled);
    counter(&b, "dspark_generations_cut_total", "Generations cut by a drain deadline.", (double)m.cut);
    counter(&b, "dspark_generations_failed_total", "Generations that failed in the engine.", (double)m.failed);
    counter(&b, "dspark_prompt_tokens_total", "Prompt tokens processed.", (double)m.prompt_tokens);
    counter(&b, "dspark_generated_tokens_total", "Tokens generated.", (double)m.generated_tokens);
    counter(&b, "dspark_prefill_seconds_total", "Seconds spent in prompt processing.", m.prefill_s);
    counter(&b, "dspark_generate_seconds_total", "Seconds spent generating after the prefill.", m.generate_s);
    gauge(&b, "dspark_tokens_per_second", "Generated tokens per second of generation, over all requests.",
          m.generate_s > 0 ? (double)m.generated_tokens / m.generate_s : 0.0);
    counter(&b, "dspark_spec_rounds_total", "Speculative verify rounds.", (double)m.rounds);
    counter(&b, "dspark_spec_drafted_total", "Draft tokens sent to verification.", (double)m.drafted);
    counter(&b, "dspark_spec_accepted_total", "Draft tokens accepted.", (double)m.accepted);
    gauge(&b, "dspark_spec_acceptance_ratio", "Accepted / drafted over all requests.", m.drafted ? (double)m.accepted / (double)m.drafted : 0.0);
    gauge(&b, "dspark_spec_mean_accepted_length", "Tokens per verify round, bonus included.",
          m.rounds ? (double)(m.accepted + m.rounds) / (double)m.rounds : 0.0);
    histo_text(&b, "dspark_request_duration_seconds", "Generation requests, arrival to the last token.", &m.latency, lat_le, N_LAT);
    histo_text(&b, "dspark_time_to_first_token_seconds", "Generation requests, arrival to the first token.", &m.ttft, lat_le, N_LAT);
    histo_text(&b, "dspark_queue_wait_seconds", "Generations, arrival to the start of their prefill.", &m.queue, lat_le, N_LAT);
    histo_text(&b, "dspark_time_per_output_token_seconds", "Generations, seconds per token after the first.", &m.tpot, tpot_le, N_TPOT);
    if (st.engine) engine_metrics(&b, &st);
    gauge(&b, "dspark_slots_busy", "Slots generating now.", st.busy);
    gauge(&b, "dspark_slots", "Slots (contexts).", st.slots);
    gauge(&b, "dspark_queue_length", "Generations waiting for a slot.", st.queued);
    gauge(&b, "dspark_kv_used_tokens", "KV cache positions held by running generations.", (double)st.kv_used);
    gauge(&b, "dspark_kv_capacity_tokens", "KV cache positions of all slots.", (double)st.kv_capacity);
    gauge(&b, "dspark_kv_usage_ratio", "Used / capacity.", st.kv_capacity ? (double)st.kv_used / (double)st.kv_capacity : 0.0);
    gauge(&b, "dspark_connections_open", "HTTP connections open.", (double)m.conn_open);
    counter(&b, "dspark_connections_timed_out_total", "Connections closed for not sending a request in time.", (double)m.timed_out);
    gauge(&b, "dspark_draining", "1 while the server drains after SIGTERM / SIGINT.", atomic_load(&s->draining));
    if (b.oom) { sbuf_free(&b); return NULL; }
    return b.p;
}

/* ========================================================================
 * Streaming
 * ===================================================================== */

/* Under r->mu: turn what the choices produced into SSE events in r->out.
 * A choice's visible text is what no stop string can still claim (a stream
 * holds those bytes back) and what is whole UTF-8; its tokens' logprobs go
 * with the piece their first byte is in. */
static void stream_produce(req *r) {
    const api_limits *L = &r->s->L;
    for (int k = 0; k < r->n; k++) {
        choice *c = &r->ch[k];
        if (c->final_sent) continue;
        const size_t vis = c->done || c->cut < c->text.len ? c->cut : c->text.len - stop_hold(&r->q.stop, c->text.p, c->text.len);
        const int final = c->done;
        sbuf piece = { 0 };
        sbuf_add(&piece, "", 0);
        if (!c->first_sent && r->q.echo) utf8_take(r->q.echo_text, r->q.echo_len, 1, &piece);
        const size_t used = c->sent < vis ? utf8_take(c->text.p + c->sent, vis - c->sent, final, &piece) : 0;
        c->sent += used;
        const api_choice v = view(r, c);
        int t1 = c->t_sent;
        const int n_vis = final ? (c->cut < c->text.len ? 0 : c->n_tok) : 0;
        while (t1 < c->n_tok && (c->tok[t1].off < c->sent || (final && (t1 < n_vis || c->tok[t1].off < c->cut)))) t1++;
        if (piece.len || t1 > c->t_sent || (!c->first_sent && r->q.chat)) {
            api_stream_delta(&r->out, L, &r->q, &r->meta, &v, piece.p, piece.len, !c->first_sent, c->t_sent, t1);
            c->first_sent = 1;
            c->t_sent = t1;
        }
        if (piece.oom) r->out.oom = 1;
        sbuf_free(&piece);
        if (final) {
            if (c->rc != DSPARK_OK) {
                api_error e;
                api_error_set(&e, 500, "server_error", NULL, NULL, "%s", c->err.message);
                char *s = api_error_json(&e);
                sbuf_adds(&r->out, "data: ");
                sbuf_adds(&r->out, s ? s : "{}");
                sbuf_adds(&r->out, "\n\n");
                free(s);
            } else api_stream_final(&r->out, &r->q, &r->meta, &v);
            c->final_sent = 1;
        }
    }
    if (r->n_done == r->n && !r->done_sent) {
        int all = 1;
        for (int k = 0; k < r->n; k++) all &= r->ch[k].final_sent;
        if (all) {
            if (r->q.include_usage) {
                api_choice v[128];
                for (int k = 0; k < r->n; k++) v[k] = view(r, &r->ch[k]);
                api_stream_usage(&r->out, &r->q, &r->meta, v, r->n);
            }
            sbuf_adds(&r->out, "data: [DONE]\n\n");
            r->done_sent = 1;
        }
    }
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    req *r = cls;
    pthread_mutex_lock(&r->mu);
    ssize_t ret;
    if (r->gone) ret = MHD_CONTENT_READER_END_WITH_ERROR;
    else {
        if (r->out_off == r->out.len) {
            r->out.len = r->out_off = 0;
            stream_produce(r);
        }
        if (r->out.oom) ret = MHD_CONTENT_READER_END_WITH_ERROR;
        else if (r->out_off < r->out.len) {
            size_t n = r->out.len - r->out_off;
            if (n > max) n = max;
            memcpy(buf, r->out.p + r->out_off, n);
            r->out_off += n;
            ret = (ssize_t)n;
        } else if (r->done_sent) ret = MHD_CONTENT_READER_END_OF_STREAM;
        else if (!r->conn) ret = MHD_CONTENT_READER_END_WITH_ERROR;
        else {
            /* nothing to send yet: park the connection until a token comes
             * (the generating thread resumes it) */
            r->suspended = 1;
            MHD_suspend_connection(r->conn);
            ret = 0;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return ret;
}

static void stream_free(void *cls) {
    req *r = cls;
    pthread_mutex_lock(&r->mu);
    const int left = !r->done_sent;
    r->conn = NULL;
    pthread_mutex_unlock(&r->mu);
    if (left) req_cancel(r);                  /* the client went away mid-stream */
    req_unref(r);
}

/* ========================================================================
 * POST endpoints
 * ===================================================================== */

static enum MHD_Result answer_generate(server *s, struct MHD_Connection *c, conn_state *cs) {
    req *r = cs->r;
    pthread_mutex_lock(&r->mu);
    if (r->gone) { pthread_mutex_unlock(&r->mu); return MHD_NO; }
    if (r->n_done < r->n) {                  /* woken early: wait again */
        r->suspended = 1;
        MHD_suspend_connection(c);
        pthread_mutex_unlock(&r->mu);
        return MHD_YES;
    }
    pthread_mutex_unlock(&r->mu);
    cs->answered = 1;
    const choice *bad = NULL;
    int cut = 0;
    for (int k = 0; k < r->n; k++) {
        if (r->ch[k].rc != DSPARK_OK && !bad) bad = &r->ch[k];
        cut |= r->ch[k].st.stop && !strcmp(r->ch[k].st.stop, "drain");
    }
    if (bad) {
        const dspark_status rc = bad->rc;
        return send_err(s, c, cs, rc == DSPARK_ERR_CONTEXT || rc == DSPARK_ERR_INVALID || rc == DSPARK_ERR_UNSUPPORTED ? 400 : 500,
                        rc == DSPARK_ERR_INTERNAL || rc == DSPARK_ERR_NOMEM ? "server_error" : "invalid_request_error", NULL, "%s",
                        bad->err.message);
    }
    if (cut)   /* a non-streamed answer the drain cut is not an answer */
        return send_err(s, c, cs, 503, "server_error", "shutting_down", "the server is shutting down and cut this request (retry)");
    for (int k = 0; k < r->n; k++)
        if (r->ch[k].text.oom) return send_err(s, c, cs, 500, "server_error", NULL, "out of memory");
    api_choice v[128];
    for (int k = 0; k < r->n; k++) v[k] = view(r, &r->ch[k]);
    return send_body(s, c, cs, 200, "application/json", api_response_json(&s->L, &r->q, &r->meta, v, r->n));
}

static enum MHD_Result start_generate(server *s, struct MHD_Connection *c, conn_state *cs) {
    const int chat = cs->ep == EP_CHAT;
    req *r = calloc(1, sizeof *r);
    if (!r) return send_err(s, c, cs, 500, "server_error", NULL, "out of memory");
    api_error e;
    if (api_parse(&s->L, chat, cs->body.p ? cs->body.p : "", cs->body.len, &r->q, &e)) {
        free(r);
        return send_error(s, c, cs, &e);
    }
    r->s = s;
    r->ep = cs->ep;
    r->n = r->q.n;
    r->stream = r->q.stream;
    r->t_arrival = now_s();
    r->ch = calloc((size_t)r->n, sizeof *r->ch);
    pthread_mutex_init(&r->mu, NULL);
    atomic_init(&r->refs, 1);                 /* the connection's */
    atomic_fetch_add(&s->active, 1);
    if (!r->ch) { req_unref(r); return send_err(s, c, cs, 500, "server_error", NULL, "out of memory"); }
    r->serial = (uint64_t)atomic_fetch_add(&s->next_id, 1);
    snprintf(r->id, sizeof r->id, "%s-%llu", chat ? "chatcmpl" : "cmpl", (unsigned long long)r->serial);
    r->meta = (api_meta){ r->id, (long long)time(NULL), s->L.model_id, s->kernels };
    r->conn = c;
    uint64_t ids[128];
    dspark_gen_params gps[128];
    sgen_cb cbs[128];
    for (int k = 0; k < r->n; k++) {
        choice *ch = &r->ch[k];
        ch->r = r;
        ch->index = k;
        ch->gid = ids[k] = r->serial << 8 | (uint64_t)k;
        gps[k] = r->q.gp;
        gps[k].seed = r->q.gp.seed + (uint64_t)k;     /* choice k: seed + k (wraps) */
        cbs[k] = (sgen_cb){ gen_token, gen_done, gen_start, ch };
    }
    atomic_fetch_add(&r->refs, r->n);         /* one per generation */
    const int rc = sgen_submit_n(s->gen, r->n, ids, r->q.prompt, r->q.n_prompt, gps, cbs);
    if (rc != SGEN_OK) {
        atomic_fetch_sub(&r->refs, r->n);
        r->conn = NULL;
        req_unref(r);
        if (rc == SGEN_DRAINING) return send_err(s, c, cs, 503, "server_error", "shutting_down", "the server is shutting down");
        if (rc == SGEN_NOMEM) return send_err(s, c, cs, 500, "server_error", NULL, "out of memory");
        return send_err(s, c, cs, 503, "server_error", "queue_full", "the server is busy (request queue full); retry later");
    }
    cs->r = r;
    atomic_fetch_add(&r->refs, 1);            /* the watcher may see it until the connection ends */
    track_phase(s, c, 2, r);
    if (r->stream) {
        atomic_fetch_add(&r->refs, 1);        /* the response's */
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, r, stream_free);
        if (!resp) { stream_free(r); return MHD_NO; }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        cors_headers(cs, resp);
        cs->answered = 1;
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        count_response(s, 200);
        return ret;
    }
    pthread_mutex_lock(&r->mu);
    if (r->n_done < r->n) {                   /* park until the last choice is done */
        r->suspended = 1;
        MHD_suspend_connection(c);
    }
    pthread_mutex_unlock(&r->mu);
    return MHD_YES;
}

/* ========================================================================
 * The MHD handler
 * ===================================================================== */

static int route(const char *url) {
    static const struct { const char *path; int ep; } routes[] = {
        { "/v1/completions", EP_COMPLETIONS }, { "/completions", EP_COMPLETIONS }, { "/v1/chat/completions", EP_CHAT },
        { "/chat/completions", EP_CHAT }, { "/v1/models", EP_MODELS }, { "/models", EP_MODELS }, { "/health", EP_HEALTH },
        { "/v1/health", EP_HEALTH }, { "/metrics", EP_METRICS }, { "/tokenize", EP_TOKENIZE }, { "/detokenize", EP_DETOKENIZE },
        { "/props", EP_PROPS }, { "/slots", EP_SLOTS },
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) return routes[i].ep;
    return EP_OTHER;
}

static int is_post_ep(int ep) { return ep == EP_COMPLETIONS || ep == EP_CHAT || ep == EP_TOKENIZE || ep == EP_DETOKENIZE; }

static enum MHD_Result preflight(server *s, struct MHD_Connection *c, conn_state *cs) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Allow", is_post_ep(cs->ep) ? "POST, OPTIONS" : "GET, HEAD, OPTIONS");
    if (cs->origin[0]) {
        MHD_add_response_header(r, "Access-Control-Allow-Methods", is_post_ep(cs->ep) ? "POST, OPTIONS" : "GET, HEAD, OPTIONS");
        const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", h && strlen(h) < 512 ? h : "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        cors_headers(cs, r);
    }
    enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    count_response(s, 204);
    return ret;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) {                                   /* first call: headers only */
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        *con_cls = cs;
        cs->ep = route(url);
        cs->post = !strcmp(method, "POST");
        cs->options = !strcmp(method, "OPTIONS");
        cors_origin(s, c, cs);
        pthread_mutex_lock(&s->mmu);
        s->m.requests[cs->ep]++;
        pthread_mutex_unlock(&s->mmu);
        const int post_ep = is_post_ep(cs->ep);
        track_phase(s, c, post_ep && cs->post ? 1 : 2, NULL);
        int status = 0;
        const char *type = "invalid_request_error", *code = NULL;
        char msg[300] = "";
        if (cs->ep == EP_OTHER) {
            status = 404, code = "not_found";
            snprintf(msg, sizeof msg, "no such endpoint: %.40s %.120s", method, url);
        } else if (cs->options) {
            cs->answered = 1;
            return preflight(s, c, cs);
        } else if (post_ep != cs->post || (!post_ep && strcmp(method, "GET") && strcmp(method, "HEAD"))) {
            status = 405, code = "method_not_allowed";
            snprintf(msg, sizeof msg, "%.40s is not allowed on %.120s (use %s)", method, url, post_ep ? "POST" : "GET");
        } else if (cs->ep != EP_HEALTH && !authorized(s, c)) {
            status = 401, type = "authentication_error", code = "invalid_api_key";
            snprintf(msg, sizeof msg, "missing or wrong API key (send 'Authorization: Bearer KEY')");
        } else if (post_ep && atomic_load(&s->draining)) {
            status = 503, type = "server_error", code = "shutting_down";
            snprintf(msg, sizeof msg, "the server is shutting down");
        } else if (post_ep) {
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
            if (cl && strtoull(cl, NULL, 10) > s->max_body) {
                status = 413, code = "request_too_large";
                snprintf(msg, sizeof msg, "the body has %.20s bytes; this server accepts at most %zu", cl, s->max_body);
            }
        }
        if (status) { cs->answered = 1; return send_err(s, c, cs, status, type, code, "%s", msg); }
        if (post_ep) return MHD_YES;             /* wait for the body */
        cs->answered = 1;
        switch (cs->ep) {
        case EP_HEALTH:
            if (atomic_load(&s->draining)) return send_body(s, c, cs, 503, "application/json", strdup("{\"status\":\"draining\"}"));
            return send_body(s, c, cs, 200, "application/json", strdup("{\"status\":\"ok\"}"));
        case EP_MODELS: return send_body(s, c, cs, 200, "application/json", models_json(s));
        case EP_PROPS: return send_body(s, c, cs, 200, "application/json", props_json(s));
        case EP_SLOTS: return send_body(s, c, cs, 200, "application/json", slots_json(s));
        default: return send_body(s, c, cs, 200, "text/plain; version=0.0.4", metrics_text(s));
        }
    }
    if (cs->r && !cs->answered) return answer_generate(s, c, cs);   /* resumed */
    if (cs->answered) { *upload_size = 0; return MHD_YES; }
    if (*upload_size) {                          /* a piece of the body */
        if (!cs->too_big) {
            if (cs->body.len + *upload_size > s->max_body) { cs->too_big = 1; sbuf_free(&cs->body); }
            else sbuf_add(&cs->body, upload, *upload_size);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    track_phase(s, c, 2, NULL);
    if (cs->too_big) {
        cs->answered = 1;
        return send_err(s, c, cs, 413, "invalid_request_error", "request_too_large", "the body exceeds this server's limit of %zu bytes",
                        s->max_body);
    }
    if (cs->body.oom) { cs->answered = 1; return send_err(s, c, cs, 500, "server_error", NULL, "out of memory"); }
    if (cs->ep == EP_TOKENIZE || cs->ep == EP_DETOKENIZE) {
        cs->answered = 1;
        api_error e;
        char *out = cs->ep == EP_TOKENIZE ? api_tokenize(&s->L, cs->body.p ? cs->body.p : "", cs->body.len, &e)
                                          : api_detokenize(&s->L, cs->body.p ? cs->body.p : "", cs->body.len, &e);
        return out ? send_body(s, c, cs, 200, "application/json", out) : send_error(s, c, cs, &e);
    }
    enum MHD_Result ret = start_generate(s, c, cs);
    if (!cs->r) cs->answered = 1;
    return ret;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode tc) {
    server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) return;
    if (cs->r) {
        req *r = cs->r;
        pthread_mutex_lock(&r->mu);
        r->conn = NULL;
        const int left = r->n_done < r->n;
        pthread_mutex_unlock(&r->mu);
        if (left || tc != MHD_REQUEST_TERMINATED_COMPLETED_OK) req_cancel(r);
        conn_track *t = track_of(c);
        pthread_mutex_lock(&s->cmu);
        if (t && t->r == r) t->r = NULL;
        pthread_mutex_unlock(&s->cmu);
        req_unref(r);                            /* the watcher's */
        req_unref(r);                            /* the connection's */
    }
    track_phase(s, c, 0, NULL);                  /* keep-alive: the next request's deadline starts */
    sbuf_free(&cs->body);
    free(cs);
    *con_cls = NULL;
}

/* ========================================================================
 * The command
 * ===================================================================== */

/* MHD's own messages (socket errors, bad HTTP) go to stderr only with -v:
 * without it a failure is reported once, by this command, in one line. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    if (!*(const int *)cls) return;
    fputs("mhd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

static void usage(void) {
    printf("usage: dspark serve -m MODEL.gguf [-md DRAFTER.gguf] [options]\n"
           "  --host ADDR               IPv4 / IPv6 address to bind (default 127.0.0.1; 0.0.0.0 = all)\n"
           "  --port N                  TCP port (default 8080; 0 = any free port, printed at start)\n"
           "  --api-key KEY             require 'Authorization: Bearer KEY' (all but /health and OPTIONS)\n"
           "  --parallel N, -np N       sequences generated at once, sharing each forward (default: as many full\n"
           "                            -c contexts as half the device's free memory holds, 1..64; --gen ctx: contexts, default 1)\n"
           "  --batch N, -b N           rows per engine step: decode rows, then prompt chunks (default 512)\n"
           "  --ubatch N, -ub N         prompt rows one generation adds per step (default: the device's chunk,\n"
           "                            64 on the CPU, 512 on CUDA): decode rows and a cancel never wait\n"
           "                            longer than one such chunk\n"
           "  --no-cache-prompt         do not reuse cached prompt pages (the prefix cache is on by default; the\n"
           "                            answer never depends on it)\n"
           "  --kv-pages N              KV pool pages of 16 positions (default: --parallel full contexts)\n"
           "  --gen engine|ctx          engine (default): the batch engine, continuous batching; ctx: one context\n"
           "                            per slot, each generation alone (runs the drafter: speculative decoding)\n"
           "  -t N                      threads (of the engine, or per context) (default 2)\n"
           "  -c N                      context size per sequence (default min(2048, the model's))\n"
           "  --max-tokens N            largest max_tokens a request may ask (default 512, capped by -c)\n"
           "  --max-n N                 largest n (choices per request, default 8)\n"
           "  --max-body BYTES          largest request body (default 1048576)\n"
           "  --queue N                 generations that may wait for a slot (default 64; more: 503)\n"
           "  --max-connections N       open HTTP connections (default 1024)\n"
           "  --max-connections-per-ip N  of them from one address (default 128)\n"
           "  --request-timeout S       seconds a connection has to send a whole request (default 30)\n"
           "  --idle-timeout S          seconds without progress before a connection is closed (default 600)\n"
           "  --http-threads N          libmicrohttpd event-loop threads (default 2)\n"
           "  --drain-timeout S         on SIGTERM / SIGINT: seconds to finish what runs (default 30)\n"
           "  --cors-origins LIST       origins allowed by CORS, comma-separated, or * (default none)\n"
           "  --chat-template T         auto (default: detected from the GGUF's template), or chatml, qwen3, llama3,\n"
           "                            llama2, mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7, gemma, deepseek,\n"
           "                            deepseek2, deepseek3, phi3, phi4, plain\n"
           "  --jinja / --no-jinja       interpret the GGUF's Jinja template (default), or use the built-in family only\n"
           "  --reasoning-format F      deepseek (default: <think>..</think> -> reasoning_content) or none\n"
           "  --device NAME             cpu (default) or a device this build has\n"
           "  --kernels SET / --fast F,.. / --canonical F,..   kernel set of every context\n"
           "  -v                        log each request on stderr\n"
           "endpoints: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize; GET /v1/models, /health,\n"
           "  /metrics, /props, /slots (also without /v1); OPTIONS on each (CORS preflight)\n");
}

static int split_origins(server *s, const char *list) {
    char *dup = strdup(list);
    if (!dup) return -1;
    for (char *tok = strtok(dup, ","); tok; tok = strtok(NULL, ",")) {
        while (*tok == ' ') tok++;
        if (!*tok) continue;
        char **n = realloc(s->cors, (size_t)(s->n_cors + 1) * sizeof *n);
        if (!n) { free(dup); return -1; }
        s->cors = n;
        if (!(s->cors[s->n_cors] = strdup(tok))) { free(dup); return -1; }
        s->n_cors++;
    }
    free(dup);
    return 0;
}

int cmd_serve(int argc, char **argv) {
    const char *model_path = NULL, *draft_path = NULL, *host = "127.0.0.1", *api_key = NULL, *device = NULL, *cors = NULL;
    const char *tmpl = "auto";
    int jinja = 1, reasoning = 1;
    long port = 8080, parallel = -1, threads = 2, n_ctx = 0, max_tokens = 512, max_body = 1 << 20, queue = 64, max_conn = 1024,
         per_ip = 128, http_threads = 2, max_n = -1, batch = 512, ubatch = 0, kv_pages = 0;
    int engine = 1, cache_prompt = 1;
    float request_timeout = 30, idle_timeout = 600, drain_timeout = 30;
    cli_kernel_flags kf = { 0 };
    int verbose = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        else if (!strcmp(a, "-m")) model_path = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "-md")) draft_path = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "--host")) host = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "--port")) port = cli_int(C, a, cli_value(C, argc, argv, &i), 0, 65535);
        else if (!strcmp(a, "--api-key")) api_key = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "--parallel") || !strcmp(a, "-np")) parallel = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--batch") || !strcmp(a, "-b")) batch = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 65536);
        else if (!strcmp(a, "--ubatch") || !strcmp(a, "-ub")) ubatch = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 65536);
        else if (!strcmp(a, "--kv-pages")) kv_pages = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 26);
        else if (!strcmp(a, "--cache-prompt")) cache_prompt = 1;
        else if (!strcmp(a, "--no-cache-prompt")) cache_prompt = 0;
        else if (!strcmp(a, "--gen")) {
            const char *v = cli_value(C, argc, argv, &i);
            if (!strcmp(v, "engine")) engine = 1;
            else if (!strcmp(v, "ctx")) engine = 0;
            else cli_die(C, "--gen must be engine or ctx; got '%s'", v);
        }
        else if (!strcmp(a, "-t")) threads = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "-c")) n_ctx = cli_int(C, a, cli_value(C, argc, argv, &i), 2, 1 << 24);
        else if (!strcmp(a, "--max-tokens")) max_tokens = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(a, "--max-n")) max_n = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 128);
        else if (!strcmp(a, "--max-body")) max_body = cli_int(C, a, cli_value(C, argc, argv, &i), 64, 1L << 30);
        else if (!strcmp(a, "--queue")) queue = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 100000);
        else if (!strcmp(a, "--max-connections")) max_conn = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 100000);
        else if (!strcmp(a, "--max-connections-per-ip")) per_ip = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 100000);
        else if (!strcmp(a, "--request-timeout")) request_timeout = cli_float(C, a, cli_value(C, argc, argv, &i), 0.1f, 86400.0f);
        else if (!strcmp(a, "--idle-timeout")) idle_timeout = cli_float(C, a, cli_value(C, argc, argv, &i), 1.0f, 86400.0f);
        else if (!strcmp(a, "--http-threads")) http_threads = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 64);
        else if (!strcmp(a, "--drain-timeout")) drain_timeout = cli_float(C, a, cli_value(C, argc, argv, &i), 0.0f, 86400.0f);
        else if (!strcmp(a, "--cors-origins")) cors = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "--chat-template")) tmpl = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "--jinja") || !strcmp(a, "--no-jinja")) jinja = a[2] == 'j';
        else if (!strcmp(a, "--reasoning-format")) {
            const char *v = cli_value(C, argc, argv, &i);
            if (strcmp(v, "deepseek") && strcmp(v, "none") && strcmp(v, "auto")) cli_die(C, "--reasoning-format must be deepseek, auto or none; got '%s'", v);
            reasoning = strcmp(v, "none") != 0;
        }
        else if (!strcmp(a, "--device")) device = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "-v")) verbose = 1;
        else if (cli_kernel_flag(C, argc, argv, &i, &kf)) {}
        else if (!strcmp(a, "--tp") || !strcmp(a, "--tensor-parallel"))   /* docs/TP.md, what remains */
            cli_die(C, "%s: the batch engine has no tensor-parallel plan yet (generate, perplexity, bench and diverge take --tp; docs/TP.md)", a);
        else cli_die(C, "unknown option '%s' (try dspark serve --help)", a);
    }
    if (!model_path) cli_die(C, "no model given (-m MODEL.gguf)");
    if (api_key && !*api_key) cli_die(C, "--api-key must not be empty");
    if (max_n > queue) cli_die(C, "--max-n %ld exceeds --queue %ld (a request's choices queue together)", max_n, queue);
    if (max_n < 0) max_n = queue < 8 ? queue : 8;
    const int parallel_sized = parallel < 0 && engine;   /* after the model is loaded */
    if (parallel < 0) parallel = engine ? 4 : 1;
    if (!engine && parallel > 64) cli_die(C, "--parallel %ld: --gen ctx runs at most 64 contexts", parallel);
    chat_kind forced = CHAT_NONE;
    if (strcmp(tmpl, "auto") && (forced = chat_kind_from_name(tmpl)) == CHAT_NONE)
        cli_die(C, "--chat-template must be auto or one of chatml, qwen3, llama3, llama2, mistral-v1, mistral-v3, mistral-v3-tekken, "
                   "mistral-v7, gemma, deepseek, deepseek2, deepseek3, phi3, phi4, plain; got '%s'", tmpl);
    /* SIGINT / SIGTERM are taken by sigwait at the end, in this thread
     * only: blocked before any thread exists (the contexts' pools and the
     * workers inherit the mask); SIGPIPE is ignored so a vanished client is
     * an error return, not a kill */
    signal(SIGPIPE, SIG_IGN);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    struct addrinfo hints = { 0 }, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;        /* an address, never a DNS lookup */
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%ld", port);
    if (getaddrinfo(host, portstr, &hints, &ai) || !ai) cli_die(C, "--host '%s' is not an IPv4 or IPv6 address", host);

    server *s = calloc(1, sizeof *s);
    if (!s || (cors && split_origins(s, cors))) { freeaddrinfo(ai); cli_die(C, "out of memory"); }
    dspark_error err;
    dspark_model_params mp;
    dspark_model_params_default(&mp);
    mp.model_path = model_path;
    mp.drafter_path = draft_path;
    mp.device = device;
    s->model = dspark_model_load(&mp, &err);
    if (!s->model) { freeaddrinfo(ai); cli_die(C, "%s", err.message); }
    if (parallel_sized) parallel = dspark_engine_default_seqs(s->model, (int)n_ctx);
    /* a prompt chunk as wide as the device's own prefill chunk: on CUDA 512
     * rows (a 64-row chunk of one 8B prompt is 32 attention tiles, under
     * half the SMs, and takes the split path), on the CPU 64 (a decode row
     * waits at most one chunk's time); never above the step's rows */
    if (!ubatch) ubatch = dspark_model_chunk_rows(s->model);
    if (ubatch > batch) ubatch = batch;
    sgen_params gpar = {.engine = engine, .n_slots = (int)parallel, .max_queue = (int)queue, .step_rows = (int)batch, .prefill_chunk = (int)ubatch,
                        .prefix_cache = cache_prompt, .kv_pages = (int)kv_pages};
    dspark_ctx_params_default(&gpar.cp);
    gpar.cp.n_ctx = (int)n_ctx;
    gpar.cp.n_threads = (int)threads;
    gpar.cp.kernels = kf.kernels;
    gpar.cp.fast = kf.fast;
    gpar.cp.canonical = kf.canonical;
    s->n_slots = (int)parallel;
    s->engine = engine;
    s->speculative = dspark_model_has_drafter(s->model);
    s->gen = sgen_new(s->model, &gpar, &err);
    if (!s->gen) { freeaddrinfo(ai); dspark_model_free(s->model); cli_die(C, "%s", err.message); }
    s->json_object = dspark_grammar_new(s->model, dspark_grammar_json_object(), strlen(dspark_grammar_json_object()), &err);
    if (!s->json_object) { freeaddrinfo(ai); sgen_free(s->gen); dspark_model_free(s->model); cli_die(C, "%s", err.message); }
    /* the GGUF's Jinja when it renders, else the built-in family (CHAT_NONE: chat requests get its why) */
    chat_tmpl_load(&s->chat, dspark_model_chat_template(s->model), forced, jinja, s->model);
    s->kernels = sgen_kernels(s->gen);
    s->model_path = model_path;
    s->L = (api_limits){ s->model, dspark_model_name(s->model), &s->chat, sgen_n_ctx(s->gen), 0, (int)max_n, s->json_object, reasoning };
    s->L.max_tokens_limit = (int)(max_tokens < s->L.n_ctx - 1 ? max_tokens : s->L.n_ctx - 1);
    s->api_key = api_key;
    s->verbose = verbose;
    s->max_body = (size_t)max_body;
    s->request_timeout = request_timeout;
    atomic_init(&s->next_id, 1);
    atomic_init(&s->draining, 0);
    atomic_init(&s->active, 0);
    pthread_mutex_init(&s->mmu, NULL);
    pthread_mutex_init(&s->cmu, NULL);

    int rc = 0;
    struct MHD_Daemon *d = NULL;
    if (pipe(s->wake) || pthread_create(&s->watcher, NULL, watcher_main, s)) {
        fprintf(stderr, "dspark serve: error: cannot start the connection watcher\n");
        rc = 1;
    } else {
        s->watcher_up = 1;
        /* one event loop per thread (epoll), no handler blocks: requests
         * that wait are suspended */
        unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
        if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
        d = MHD_start_daemon(flags, 0, NULL, NULL, handler, s,
                             MHD_OPTION_EXTERNAL_LOGGER, mhd_log, &s->verbose,   /* first: else MHD warns */
                             MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                             MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(http_threads > 1 ? http_threads : 0),
                             MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                             MHD_OPTION_NOTIFY_CONNECTION, notify_connection, s,
                             MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conn,
                             MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)per_ip,
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)idle_timeout,
                             MHD_OPTION_END);
        if (!d) {
            fprintf(stderr, "dspark serve: error: cannot listen on %s port %ld (address in use, or not permitted)\n", host, port);
            rc = DS_EXIT_USAGE;
        }
    }
    if (d) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        fprintf(stderr, "dspark serve: listening on http://%s%s%s:%u model=%s gen=%s speculative=%s kernels=\"%s\" parallel=%d "
                        "batch=%ld ubatch=%ld cache_prompt=%d threads=%ld n_ctx=%d max_tokens=%d chat_template=%s auth=%s http_threads=%ld version=%s\n",
                ai->ai_family == AF_INET6 ? "[" : "", host, ai->ai_family == AF_INET6 ? "]" : "", di ? di->port : (unsigned)port,
                s->L.model_id, engine ? "engine" : "ctx", s->speculative ? "yes" : "no", s->kernels, s->n_slots, engine ? batch : 0L, engine ? ubatch : 0L,
                engine ? cache_prompt : 0, threads, s->L.n_ctx, s->L.max_tokens_limit, chat_kind_name(s->chat.kind),
                api_key ? "bearer" : "none", http_threads, dspark_version());
        if (engine && dspark_model_has_drafter(s->model))
            fprintf(stderr, "dspark serve: speculative requests run batched rounds (drafts per step measured per batch size); "
                            "requests with logprobs, penalties, logit_bias or a grammar decode plain (the same tokens)\n");
        fprintf(stderr, "dspark serve: chat_template_source=%s family=%s reasoning_format=%s%s%s%s\n", chat_tmpl_source(&s->chat),
                chat_kind_name(s->chat.kind), reasoning ? "deepseek" : "none", s->chat.jinja_why[0] ? " jinja_unused=\"" : "",
                s->chat.jinja_why, s->chat.jinja_why[0] ? "\"" : "");
        if (!s->chat.jt && s->chat.kind == CHAT_NONE) fprintf(stderr, "dspark serve: chat requests will be refused: %s\n", s->chat.why);
        fflush(stderr);
        int sig = 0;
        sigwait(&sigs, &sig);
        /* the drain: no new connections, no new requests on old ones; what
         * runs or waits may finish until the deadline, then it is cut */
        atomic_store(&s->draining, 1);
        const MHD_socket lsock = MHD_quiesce_daemon(d);
        if (lsock != MHD_INVALID_SOCKET) close(lsock);
        fprintf(stderr, "dspark serve: signal %d, draining (up to %.1f s)\n", sig, (double)drain_timeout);
        fflush(stderr);
        const double t0 = now_s();
        int cut = 0;
        {   /* a second signal cuts at once */
            struct timespec tick = { 0, 50 * 1000 * 1000 };
            for (;;) {
                sgen_stat st;
                sgen_status(s->gen, &st);
                if (!st.busy && !st.queued) break;
                if (now_s() - t0 >= drain_timeout) { cut += sgen_drain(s->gen, 0); break; }
                if (sigtimedwait(&sigs, NULL, &tick) > 0) {
                    fprintf(stderr, "dspark serve: second signal, cutting what runs\n");
                    cut += sgen_drain(s->gen, 0);
                    break;
                }
            }
            cut += sgen_drain(s->gen, 0);     /* nothing left: marks it drained */
        }
        /* the answers go out (final chunks, [DONE], 503s): a short grace */
        for (double t1 = now_s(); atomic_load(&s->active) > 0 && now_s() - t1 < 5.0;) nanosleep(&(struct timespec){ 0, 20 * 1000 * 1000 }, NULL);
        const int left = atomic_load(&s->active);
        fprintf(stderr, "dspark serve: drained in %.2f s: cut=%d unfinished_responses=%d\n", now_s() - t0, cut, left);
        if (cut || left) rc = 1;
    }
    freeaddrinfo(ai);
    if (d) MHD_stop_daemon(d);
    if (s->watcher_up) {
        pthread_mutex_lock(&s->cmu);
        s->stop_watcher = 1;
        pthread_mutex_unlock(&s->cmu);
        char b = 1;
        (void)!write(s->wake[1], &b, 1);
        pthread_join(s->watcher, NULL);
    }
    if (s->wake[0] > 0) { close(s->wake[0]); close(s->wake[1]); }
    sgen_free(s->gen);
    dspark_grammar_free(s->json_object);
    chat_tmpl_free(&s->chat);
    dspark_model_free(s->model);
    for (int i = 0; i < s->n_cors; i++) free(s->cors[i]);
    free(s->cors);
    free(s->conns);
    pthread_mutex_destroy(&s->mmu);
    pthread_mutex_destroy(&s->cmu);
    free(s);
    return rc;
}
