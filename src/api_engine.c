/* api_engine.c — the batch engine's part of include/dspark.h: sequences,
 * batches and the scheduler, over engine.h and scheduler.h. Like api.c it
 * only calls engine functions; errors become dspark_error codes. */
#include "dspark.h"

#include "api_internal.h"
#include "engine.h"
#include "lproc.h"
#include "scheduler.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(DSPARK_STOP == DS_REQ_STOP, "the token callback's stop value is the scheduler's");

struct dspark_engine {
    const dspark_model *dm;
    ds_engine *e;
    ds_sched  *s;
    /* the last batch's outputs */
    float   *logits;             /* [cap][V]                                */
    int32_t *tokens;             /* [cap]                                   */
    int     *lg_row;             /* [cap]: row -> logits slot, -1 none       */
    ds_row  *rows;               /* [cap]                                   */
    ds_sampler *samp;            /* [cap]                                   */
    int      cap, n_last;
    char     kernels[256];
};

#define set_err ds_api_set_err
static void ok_err(dspark_error *e) {
    if (e) { e->code = DSPARK_OK; e->message[0] = 0; }
}

/* ========================================================================
 * The engine
 * ===================================================================== */

void dspark_engine_params_default(dspark_engine_params *p) {
    memset(p, 0, sizeof *p);
    p->n_seq_max = 8;
    p->prefix_cache = 1;
}

/* The positions a sequence may hold when n_ctx is 0: the model's own, at
 * most 2048. */
static int engine_n_ctx(const ds_model *m, int n_ctx) {
    if (n_ctx == 0) n_ctx = m->hp.n_ctx_train > 0 && m->hp.n_ctx_train < 2048 ? m->hp.n_ctx_train : 2048;
    return n_ctx;
}

/* How many full n_ctx sequences half of the memory the model's device can
 * still give holds (KV pages of the target and, with a drafter, of its
 * context rows: what a sequence costs at its longest), 1..64; 8 when the
 * backend cannot say. Pages are committed as sequences grow, so this is a
 * bound on the worst case, not a reservation. */
int dspark_engine_default_seqs(const dspark_model *dm, int n_ctx) {
    if (!dm) return 8;
    const ds_model *m = ds_api_model(dm);
    const ds_drafter *d = ds_api_drafter(dm);
    n_ctx = engine_n_ctx(m, n_ctx);
    const ds_hparams *hp = &m->hp;
    uint64_t per_pos = (uint64_t)ds_hp_kv_layers(hp) * 2u * (uint64_t)ds_hp_kv_row(hp);
    int gamma = 0;
    if (d) {
        int nl = 0, row = 0;
        ds_drafter_kv_shape(d, &nl, &row);
        per_pos += (uint64_t)nl * 2u * (uint64_t)row;
        gamma = ds_drafter_block_size(d);
    }
    const uint64_t pages = ((uint64_t)n_ctx + (uint64_t)gamma + DS_KV_PAGE - 1) / DS_KV_PAGE;
    const uint64_t per_seq = pages * DS_KV_PAGE * per_pos * sizeof(float);
    const uint64_t avail = ds_backend_mem_free(m->be);
    if (!avail || !per_seq) return 8;
    const uint64_t n = avail / 2 / per_seq;
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

dspark_engine *dspark_engine_new(const dspark_model *dm, const dspark_engine_params *p, dspark_error *err) {
    if (!dm || !p) { set_err(err, DSPARK_ERR_INVALID, "engine: no model or parameters given"); return NULL; }
    const ds_model *m = ds_api_model(dm);
    char e2[DS_ERRLEN];
    ds_kernel_set ks;
    if (ds_kernel_set_parse(&ks, p->kernels, p->fast, p->canonical, e2, sizeof e2)) {
        set_err(err, DSPARK_ERR_INVALID, "%s", e2);
        return NULL;
    }
    const int n_ctx = engine_n_ctx(m, p->n_ctx);
    /* DSPARK_DRAFT_PASS=N (1..16, for A/B measurements): sequences per
     * batched drafting pass; 1 runs one drafter forward per sequence (the
     * rounds before ds_draft_many). Unset: the engine's default, 16. No bit
     * depends on it (tests/test_spec_batch.c). */
    int draft_pass = 0;
    const char *dp = getenv("DSPARK_DRAFT_PASS");
    if (dp && *dp) {
        char *end = NULL;
        const long v = strtol(dp, &end, 10);
        if (*end || v < 1 || v > 16) {
            set_err(err, DSPARK_ERR_INVALID, "engine: DSPARK_DRAFT_PASS='%s' is not a number in 1..16", dp);
            return NULL;
        }
        draft_pass = (int)v;
    }
    /* DSPARK_ENGINE_GRAPHS (A/B): 0 records no batch shape, 1 (the
     * default) repeated chunks without drafter rows, 2 those with them too */
    const char *eg = getenv("DSPARK_ENGINE_GRAPHS");
    if (eg && *eg && strcmp(eg, "0") && strcmp(eg, "1") && strcmp(eg, "2")) {
        set_err(err, DSPARK_ERR_INVALID, "engine: DSPARK_ENGINE_GRAPHS='%s' is not 0, 1 or 2", eg);
        return NULL;
    }
    /* the model's drafter, when it has one: requests may then speculate */
    const ds_engine_params ep = {.n_seq_max = p->n_seq_max, .n_ctx = n_ctx, .n_pages = p->n_pages, .m_max = p->batch_rows,
                                 .n_threads = p->n_threads ? p->n_threads : 2,
                                 .drafter = p->no_drafter ? NULL : ds_api_drafter(dm), .draft_pass = draft_pass,
                                 .no_graphs = !eg || !*eg ? 0 : !strcmp(eg, "0") ? 1 : !strcmp(eg, "2") ? -1 : 0};
    dspark_engine *x = calloc(1, sizeof *x);
    if (!x) { set_err(err, DSPARK_ERR_NOMEM, "engine: out of memory"); return NULL; }
    x->dm = dm;
    x->e = ds_engine_new(m, &ep, e2, sizeof e2);
    if (!x->e) {
        set_err(err, strstr(e2, "out of range") ? DSPARK_ERR_INVALID : DSPARK_ERR_NOMEM, "%s", e2);
        free(x);
        return NULL;
    }
    ds_engine_set_kernels(x->e, &ks);
    ds_kernel_set_str(&ks, x->kernels, sizeof x->kernels);
    const ds_sched_params sp = {.max_rows = p->step_rows, .prefill_chunk = p->prefill_chunk, .prefix_cache = p->prefix_cache,
                                .spec_policy = DS_SPEC_AUTO};
    x->s = ds_sched_new(x->e, &sp, e2, sizeof e2);
    if (!x->s) { set_err(err, DSPARK_ERR_NOMEM, "%s", e2); ds_engine_free(x->e); free(x); return NULL; }
    ok_err(err);
    return x;
}

int dspark_engine_n_ctx(const dspark_engine *x) { return ds_engine_n_ctx(x->e); }
int dspark_engine_n_seq_max(const dspark_engine *x) { return ds_engine_seq_slots(x->e); }
const char *dspark_engine_kernels(const dspark_engine *x) { return x->kernels; }

void dspark_engine_free(dspark_engine *x) {
    if (!x) return;
    ds_sched_free(x->s);
    ds_engine_free(x->e);
    free(x->logits); free(x->tokens); free(x->lg_row); free(x->rows); free(x->samp);
    free(x);
}

/* ========================================================================
 * Sequences
 * ===================================================================== */

int dspark_seq_new(dspark_engine *x, dspark_error *err) {
    char e2[DS_ERRLEN];
    const int s = ds_engine_seq_new(x->e, e2, sizeof e2);
    if (s < 0) set_err(err, DSPARK_ERR_NOMEM, "%s", e2); else ok_err(err);
    return s;
}

int dspark_seq_fork(dspark_engine *x, int seq, int n_pos, dspark_error *err) {
    char e2[DS_ERRLEN];
    const int s = ds_engine_seq_fork(x->e, seq, n_pos, e2, sizeof e2);
    if (s < 0) set_err(err, strstr(e2, "slots") ? DSPARK_ERR_NOMEM : DSPARK_ERR_INVALID, "%s", e2); else ok_err(err);
    return s;
}

dspark_status dspark_seq_truncate(dspark_engine *x, int seq, int n_pos, dspark_error *err) {
    char e2[DS_ERRLEN];
    if (ds_engine_seq_truncate(x->e, seq, n_pos, e2, sizeof e2)) { set_err(err, DSPARK_ERR_INVALID, "%s", e2); return DSPARK_ERR_INVALID; }
    ok_err(err);
    return DSPARK_OK;
}

void dspark_seq_free(dspark_engine *x, int seq) { ds_engine_seq_free(x->e, seq); }

int dspark_seq_n_pos(const dspark_engine *x, int seq) {
    const ds_seq *q = ds_engine_seq(x->e, seq);
    return q ? q->n_past : -1;
}

int dspark_seq_reuse_prefix(dspark_engine *x, int seq, const int32_t *tokens, int n) {
    return tokens && n > 0 ? ds_engine_prefix_lookup(x->e, seq, tokens, n, 0) : 0;
}

dspark_status dspark_seq_save(dspark_engine *x, int seq, const char *path, dspark_error *err) {
    char e2[DS_ERRLEN];
    if (!path) { set_err(err, DSPARK_ERR_INVALID, "save: no path"); return DSPARK_ERR_INVALID; }
    if (ds_engine_seq_save(x->e, seq, path, e2, sizeof e2)) {
        const dspark_status c = strstr(e2, "does not exist") ? DSPARK_ERR_INVALID : DSPARK_ERR_LOAD;
        set_err(err, c, "%s", e2);
        return c;
    }
    ok_err(err);
    return DSPARK_OK;
}

int dspark_seq_load(dspark_engine *x, const char *path, dspark_error *err) {
    char e2[DS_ERRLEN];
    if (!path) { set_err(err, DSPARK_ERR_INVALID, "load: no path"); return -1; }
    const int s = ds_engine_seq_load(x->e, path, e2, sizeof e2);
    if (s < 0) set_err(err, DSPARK_ERR_LOAD, "%s", e2); else ok_err(err);
    return s;
}

/* ========================================================================
 * Batches
 * ===================================================================== */

static int grow(dspark_engine *x, int n) {
    if (n <= x->cap) return 0;
    const size_t V = (size_t)ds_api_model(x->dm)->hp.n_vocab;
    float *lg = realloc(x->logits, (size_t)n * V * sizeof(float));
    if (lg) x->logits = lg;
    int32_t *t = realloc(x->tokens, (size_t)n * sizeof *t);
    if (t) x->tokens = t;
    int *lr = realloc(x->lg_row, (size_t)n * sizeof *lr);
    if (lr) x->lg_row = lr;
    ds_row *r = realloc(x->rows, (size_t)n * sizeof *r);
    if (r) x->rows = r;
    ds_sampler *sm = realloc(x->samp, (size_t)n * sizeof *sm);
    if (sm) x->samp = sm;
    if (!lg || !t || !lr || !r || !sm) return -1;
    x->cap = n;
    return 0;
}

dspark_status dspark_decode(dspark_engine *x, const dspark_batch *b, dspark_error *err) {
    x->n_last = 0;
    if (!b || b->n_tokens < 1 || !b->token || !b->pos || !b->seq) {
        set_err(err, DSPARK_ERR_INVALID, "decode: a batch needs n_tokens >= 1 and token, pos, seq arrays");
        return DSPARK_ERR_INVALID;
    }
    if (grow(x, b->n_tokens)) { set_err(err, DSPARK_ERR_NOMEM, "decode: out of memory"); return DSPARK_ERR_NOMEM; }
    int nl = 0;
    for (int i = 0; i < b->n_tokens; i++) {
        const int o = b->output ? b->output[i] : (i == b->n_tokens - 1 ? DSPARK_OUT_LOGITS : 0);
        if (o & ~(DSPARK_OUT_LOGITS | DSPARK_OUT_TOKEN)) {
            set_err(err, DSPARK_ERR_INVALID, "decode: row %d: unknown output %d", i, o);
            return DSPARK_ERR_INVALID;
        }
        const dspark_sampling *sp = b->sampling ? b->sampling[i] : NULL;
        ds_sampler *sm = &x->samp[i];
        memset(sm, 0, sizeof *sm);
        sm->top_p = 1.0f;
        if (sp) {
            if (!(sp->temperature >= 0.0f) || sp->top_k < 0 || !(sp->top_p > 0.0f && sp->top_p <= 1.0f) ||
                !(sp->min_p >= 0.0f && sp->min_p <= 1.0f)) {
                set_err(err, DSPARK_ERR_INVALID, "decode: row %d: sampling out of range", i);
                return DSPARK_ERR_INVALID;
            }
            sm->temp = sp->temperature;
            sm->top_k = sp->top_k;
            sm->top_p = sp->top_p;
            sm->min_p = sp->min_p;
            sm->seed = sp->seed;
        }
        x->rows[i] = (ds_row){b->seq[i], b->pos[i], b->token[i],
                              (uint8_t)(((o & DSPARK_OUT_LOGITS) ? DS_ROW_LOGITS : 0) | ((o & DSPARK_OUT_TOKEN) ? DS_ROW_SELECT : 0)),
                              sp ? sm : NULL};
        x->lg_row[i] = (o & DSPARK_OUT_LOGITS) ? nl++ : -1;
        x->tokens[i] = -1;
    }
    char e2[DS_ERRLEN];
    ds_fwd_out out = {.logits = x->logits, .ids = x->tokens};
    if (ds_engine_forward(x->e, x->rows, b->n_tokens, &out, e2, sizeof e2)) {
        const dspark_status c = strstr(e2, "free pages") ? DSPARK_ERR_NOMEM : DSPARK_ERR_INVALID;
        set_err(err, c, "%s", e2);
        return c;
    }
    x->n_last = b->n_tokens;
    ok_err(err);
    return DSPARK_OK;
}

const float *dspark_get_logits(const dspark_engine *x, int i) {
    if (i < 0 || i >= x->n_last || x->lg_row[i] < 0) return NULL;
    return x->logits + (size_t)x->lg_row[i] * (size_t)ds_api_model(x->dm)->hp.n_vocab;
}

int32_t dspark_get_token(const dspark_engine *x, int i) { return i < 0 || i >= x->n_last ? -1 : x->tokens[i]; }

/* ========================================================================
 * The scheduler
 * ===================================================================== */

/* One request's side of the scheduler: the caller's parameters, its logits
 * processor chain (when it asked for processing), the token bytes. */
typedef struct {
    dspark_engine *x;
    dspark_gen_params p;
    dspark_done_fn legacy_done;          /* dspark_engine_submit's          */
    dspark_engine_callbacks cb;          /* dspark_engine_submit_ex's       */
    ds_lchain *chain;
    int   n_prompt, n_emitted, oom;
    char *piece;
    size_t cap;
} req_cb;

static void req_free(req_cb *c) {
    ds_lchain_free(c->chain);
    free(c->piece);
    free(c);
}

/* The token's bytes (and what the chain captured for it) for the caller,
 * as dspark_generate's on_engine_token gives them. */
static int req_token(void *user, int32_t t) {
    req_cb *c = user;
    const int64_t pos = (int64_t)c->n_prompt + c->n_emitted++;
    if (!c->p.on_token && !c->p.on_token_ex) return 0;
    const ds_tokenizer *tok = ds_api_model(c->x->dm)->tok;
    int n = tok ? ds_token_to_bytes(tok, t, c->piece, c->cap) : 0;
    if (n > 0 && (size_t)n > c->cap) {
        char *nb = realloc(c->piece, (size_t)n);
        if (!nb) { c->oom = 1; return 1; }
        c->piece = nb;
        c->cap = (size_t)n;
        n = ds_token_to_bytes(tok, t, c->piece, c->cap);
    }
    const size_t len = n > 0 ? (size_t)n : 0;
    if (c->p.on_token_ex) {
        dspark_token dt = {t, c->piece, len, pos, NAN, 0, NULL, NULL};
        if (c->chain) ds_lchain_captured(c->chain, pos, &dt.logprob, &dt.n_top, &dt.top_id, &dt.top_logprob);
        return c->p.on_token_ex(c->p.user, &dt);
    }
    return c->p.on_token(c->p.user, t, c->piece, len);
}

static void req_start(void *user) {
    req_cb *c = user;
    if (c->cb.on_start) c->cb.on_start(c->p.user);
}

static void req_done(void *user, const ds_req_result *r) {
    req_cb *c = user;
    dspark_stats st;
    memset(&st, 0, sizeof st);
    st.n_prompt = r->n_prompt;
    st.n_generated = r->n_gen;
    st.n_cached = r->n_cached;
    st.stop = r->stop;
    if (r->t_first > 0) st.t_prefill_s = r->t_first - r->t_queued;
    st.t_total_s = r->t_done - r->t_queued;
    st.prefill_tok_s = st.t_prefill_s > 0 ? r->n_prompt / st.t_prefill_s : 0.0;
    const double t_dec = st.t_total_s - st.t_prefill_s;
    st.tok_s = r->n_gen > 1 && t_dec > 0 ? (r->n_gen - 1) / t_dec : 0.0;
    st.speculative = r->spec;
    st.draft_max = r->draft_max;
    st.rounds = r->rounds;
    st.drafted = r->drafted;
    st.accepted = r->accepted;
    st.mean_accepted_len = r->rounds ? (double)(r->accepted + r->rounds) / r->rounds : 0.0;
    dspark_status rc = DSPARK_OK;
    dspark_error e;
    e.code = DSPARK_OK;
    e.message[0] = 0;
    if (c->oom) {
        rc = DSPARK_ERR_NOMEM;
        set_err(&e, rc, "out of memory for a token's bytes");
    } else if (!strcmp(r->stop, "error")) {
        const char *ce = c->chain ? ds_lchain_error(c->chain) : "";
        if (ce[0]) rc = strstr(ce, "out of memory") ? DSPARK_ERR_NOMEM : DSPARK_ERR_INVALID;
        else if (c->chain) { rc = DSPARK_ERR_INVALID; ce = "the logits processor failed"; }
        else { rc = DSPARK_ERR_INTERNAL; ce = "the engine's step failed"; }
        set_err(&e, rc, "%s", ce);
    }
    if (c->legacy_done) c->legacy_done(c->p.user, rc ? "error" : r->stop, r->n_gen);
    if (c->cb.on_done) c->cb.on_done(c->p.user, rc, rc ? &e : NULL, &st);
    req_free(c);
}

static long submit(dspark_engine *x, const int32_t *prompt, int n_prompt, const dspark_gen_params *p, dspark_done_fn legacy,
                   const dspark_engine_callbacks *cb, dspark_error *err) {
    if (!x || !p || (n_prompt > 0 && !prompt)) { set_err(err, DSPARK_ERR_INVALID, "submit: bad arguments"); return -1; }
    /* the checks dspark_generate makes (the speculative settings are not
     * used: the scheduler decodes plain) */
    dspark_status rc = ds_api_check_params(x->dm, p, 0, err);
    if (rc) return -1;
    req_cb *c = calloc(1, sizeof *c);
    if (!c) { set_err(err, DSPARK_ERR_NOMEM, "submit: out of memory"); return -1; }
    c->x = x;
    c->p = *p;
    c->legacy_done = legacy;
    if (cb) c->cb = *cb;
    c->n_prompt = n_prompt;
    c->chain = ds_api_make_chain(x->dm, p, &rc, err);
    if (rc) { req_free(c); return -1; }
    ds_req_params rp = {.prompt = prompt, .n_prompt = n_prompt, .n_predict = p->max_tokens, .stop_at_eog = p->stop_at_eog,
                        .on_token = req_token, .on_done = req_done, .user = c,
                        .lp = c->chain ? ds_lchain_proc(c->chain) : NULL, .on_start = req_start,
                        .speculative = p->speculative, .draft_max = p->draft_max};
    rp.samp = (ds_sampler){p->temperature, p->top_k, p->top_p, p->seed, p->min_p};
    char e2[DS_ERRLEN];
    const long id = ds_sched_submit(x->s, &rp, e2, sizeof e2);
    if (id < 0) {
        set_err(err, strstr(e2, "context holds") || strstr(e2, "pool holds") ? DSPARK_ERR_CONTEXT
                     : strstr(e2, "out of memory")                          ? DSPARK_ERR_NOMEM
                                                                            : DSPARK_ERR_INVALID,
                "%s", e2);
        req_free(c);
        return -1;
    }
    ok_err(err);
    return id;
}

long dspark_engine_submit(dspark_engine *x, const int32_t *prompt, int n_prompt, const dspark_gen_params *p,
                          dspark_done_fn on_done, dspark_error *err) {
    return submit(x, prompt, n_prompt, p, on_done, NULL, err);
}

long dspark_engine_submit_ex(dspark_engine *x, const int32_t *prompt, int n_prompt, const dspark_gen_params *p,
                             const dspark_engine_callbacks *cb, dspark_error *err) {
    return submit(x, prompt, n_prompt, p, NULL, cb, err);
}

int dspark_engine_cancel(dspark_engine *x, long request) { return ds_sched_cancel(x->s, request); }

int dspark_engine_step(dspark_engine *x, dspark_error *err) {
    char e2[DS_ERRLEN];
    const int rc = ds_sched_step(x->s, e2, sizeof e2);
    if (rc < 0) set_err(err, DSPARK_ERR_INTERNAL, "%s", e2); else ok_err(err);
    return rc;
}

void dspark_engine_get_stats(dspark_engine *x, dspark_engine_stats *st) {
    ds_sched_stats s;
    ds_sched_get_stats(x->s, &s);
    *st = (dspark_engine_stats){s.waiting, s.running, s.last_batch, s.pages_free, s.pages_total,
                                s.steps, s.rows, s.requests_done, s.preemptions, s.prompt_tokens, s.cached_tokens,
                                s.spec_rounds, s.drafted, s.accepted};
}
