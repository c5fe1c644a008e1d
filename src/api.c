/* api.c — include/dspark.h on top of the engine (model.h, drafter.h,
 * generate.h, spec.h). It only calls engine functions and context
 * accessors; it never reaches into ds_ctx, so the backend seam can change
 * what a context is without touching the public API.
 *
 * Thread-safety: a dspark_model is read-only after dspark_model_load (the
 * target's weights, packed weights, tokenizer and the drafter are never
 * written by a forward pass; every mutable buffer — KV caches, scratch, the
 * thread pool, the drafter's KV cache — belongs to a context). A dspark_ctx
 * is used by one thread at a time; its cancel flag is atomic. */
#include "dspark.h"
#include "api_internal.h"

#include "backend.h"
#include "drafter.h"
#include "generate.h"
#include "grammar.h"
#include "lproc.h"
#include "model.h"
#include "sampler.h"
#include "spec.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DSPARK_VERSION_STRING
#error "DSPARK_VERSION_STRING must come from the Makefile (VERSION)"
#endif

const char *dspark_version(void) { return DSPARK_VERSION_STRING; }

/* ========================================================================
 * Errors
 * ===================================================================== */

/* Also api_engine.c's (not exported: libdspark.map keeps ds_* local). */
void ds_api_set_err(dspark_error *e, dspark_status code, const char *fmt, ...) {
    if (!e) return;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}
#define set_err ds_api_set_err

static void clear_err(dspark_error *e) {
    if (!e) return;
    e->code = DSPARK_OK;
    e->message[0] = 0;
}

const char *dspark_status_name(dspark_status s) {
    switch (s) {
    case DSPARK_OK: return "ok";
    case DSPARK_ERR_INVALID: return "invalid";
    case DSPARK_ERR_LOAD: return "load";
    case DSPARK_ERR_NOMEM: return "nomem";
    case DSPARK_ERR_CONTEXT: return "context";
    case DSPARK_ERR_UNSUPPORTED: return "unsupported";
    case DSPARK_ERR_INTERNAL: return "internal";
    }
    return "unknown";
}

/* ========================================================================
 * Models
 * ===================================================================== */

struct dspark_model {
    ds_model   *m;
    ds_drafter *d;               /* NULL without a drafter                  */
    char       *name;
    char       *chat_template;   /* NULL when the GGUF has none             */
};

void dspark_model_params_default(dspark_model_params *p) {
    memset(p, 0, sizeof *p);
}

/* A GGUF string key as a malloc'd C string; NULL when absent. */
static char *gguf_strdup(const gguf_ctx *g, const char *key) {
    gguf_str s;
    if (!g || gguf_get_str(g, key, &s)) return NULL;
    char *r = malloc(s.len + 1);
    if (!r) return NULL;
    memcpy(r, s.ptr, s.len);
    r[s.len] = 0;
    return r;
}

dspark_model *dspark_model_load(const dspark_model_params *p, dspark_error *err) {
    clear_err(err);
    if (!p || !p->model_path || !*p->model_path) {
        set_err(err, DSPARK_ERR_INVALID, "no model path given");
        return NULL;
    }
    char e[DS_ERRLEN];
    const char *device = p->device && *p->device ? p->device : "cpu";
    {   /* a device this build lacks is UNSUPPORTED, not a load failure */
        ds_backend *be = ds_backend_new(device, e, sizeof e);
        if (!be) { set_err(err, DSPARK_ERR_UNSUPPORTED, "%s", e); return NULL; }
        ds_backend_free(be);
    }
    dspark_model *dm = calloc(1, sizeof *dm);
    if (!dm) { set_err(err, DSPARK_ERR_NOMEM, "out of memory"); return NULL; }
    dm->m = ds_model_load_on(p->model_path, device, e, sizeof e);
    if (!dm->m) {
        set_err(err, DSPARK_ERR_LOAD, "%s: %s", p->model_path, e);
        free(dm);
        return NULL;
    }
    if (!dm->m->tok) {
        set_err(err, DSPARK_ERR_LOAD, "%s has no tokenizer (tokenizer.ggml.model missing)", p->model_path);
        dspark_model_free(dm);
        return NULL;
    }
    if (p->drafter_path && *p->drafter_path) {
        dm->d = ds_drafter_load(p->drafter_path, dm->m, e, sizeof e);
        if (!dm->d) {
            set_err(err, DSPARK_ERR_LOAD, "%s: %s", p->drafter_path, e);
            dspark_model_free(dm);
            return NULL;
        }
        if (ds_drafter_block_size(dm->d) > DSPARK_MAX_DRAFT) {
            set_err(err, DSPARK_ERR_UNSUPPORTED, "%s: block size %d exceeds %d", p->drafter_path,
                    ds_drafter_block_size(dm->d), DSPARK_MAX_DRAFT);
            dspark_model_free(dm);
            return NULL;
        }
    }
    dm->name = gguf_strdup(dm->m->gguf, "general.name");
    if (!dm->name) {
        const char *b = strrchr(p->model_path, '/');
        b = b ? b + 1 : p->model_path;
        size_t n = strlen(b);
        if (n > 5 && !strcmp(b + n - 5, ".gguf")) n -= 5;
        dm->name = malloc(n + 1);
        if (dm->name) { memcpy(dm->name, b, n); dm->name[n] = 0; }
    }
    dm->chat_template = gguf_strdup(dm->m->gguf, "tokenizer.chat_template");
    if (!dm->name) {
        set_err(err, DSPARK_ERR_NOMEM, "out of memory");
        dspark_model_free(dm);
        return NULL;
    }
    return dm;
}

void dspark_model_free(dspark_model *dm) {
    if (!dm) return;
    if (dm->d) ds_drafter_free(dm->d);
    if (dm->m) ds_model_free(dm->m);
    free(dm->name);
    free(dm->chat_template);
    free(dm);
}

const char *dspark_model_name(const dspark_model *dm) { return dm->name; }
int dspark_model_n_vocab(const dspark_model *dm) { return dm->m->hp.n_vocab; }
int dspark_model_n_ctx_train(const dspark_model *dm) { return dm->m->hp.n_ctx_train; }
int dspark_model_has_drafter(const dspark_model *dm) { return dm->d != NULL; }
int dspark_model_draft_block(const dspark_model *dm) { return dm->d ? ds_drafter_block_size(dm->d) : 0; }
int dspark_model_chunk_rows(const dspark_model *dm) { return ds_backend_chunk_rows(dm->m->be); }
const char *dspark_model_chat_template(const dspark_model *dm) { return dm->chat_template; }
int32_t dspark_model_eos(const dspark_model *dm) { return ds_tokenizer_eos(dm->m->tok); }
int dspark_model_is_eog(const dspark_model *dm, int32_t t) { return ds_tokenizer_is_eog(dm->m->tok, t); }

/* ========================================================================
 * Tokens
 * ===================================================================== */

int dspark_tokenize(const dspark_model *dm, const char *text, size_t len, int add_bos, int parse_special,
                    int32_t *out, int cap, dspark_error *err) {
    clear_err(err);
    if (!dm || (!text && len) || cap < 0 || (cap > 0 && !out)) {
        set_err(err, DSPARK_ERR_INVALID, "tokenize: bad arguments");
        return -1;
    }
    const ds_tokenizer *t = dm->m->tok;
    /* -1: what `dspark generate` does, so API and CLI tokens agree */
    if (add_bos < 0) add_bos = ds_tokenizer_bos(t) >= 0 && !strcmp(ds_tokenizer_model(t), "llama");
    int32_t *ids = NULL;
    size_t n = 0;
    char e[DS_ERRLEN];
    if (ds_tokenize_ex(t, text ? text : "", len, add_bos != 0, parse_special != 0, &ids, &n, e, sizeof e)) {
        set_err(err, DSPARK_ERR_INVALID, "tokenize: %s", e);
        return -1;
    }
    if (n > (size_t)0x7fffffff) {
        free(ids);
        set_err(err, DSPARK_ERR_INVALID, "tokenize: %zu tokens is too many", n);
        return -1;
    }
    if (cap > 0 && n > 0) memcpy(out, ids, (n < (size_t)cap ? n : (size_t)cap) * sizeof(int32_t));
    free(ids);
    return (int)n;
}

int dspark_token_to_bytes(const dspark_model *dm, int32_t token, char *buf, size_t cap) {
    return ds_token_to_bytes(dm->m->tok, token, buf, cap);
}

long dspark_detokenize(const dspark_model *dm, const int32_t *tokens, int n, char *buf, size_t cap,
                       dspark_error *err) {
    clear_err(err);
    if (!dm || n < 0 || (n > 0 && !tokens) || (cap > 0 && !buf)) {
        set_err(err, DSPARK_ERR_INVALID, "detokenize: bad arguments");
        return -1;
    }
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        size_t room = len < cap ? cap - len : 0;
        int k = ds_token_to_bytes(dm->m->tok, tokens[i], room ? buf + len : NULL, room);
        if (k < 0) {
            set_err(err, DSPARK_ERR_INVALID, "detokenize: token %d is outside the vocabulary [0, %d)", tokens[i],
                    dm->m->hp.n_vocab);
            return -1;
        }
        len += (size_t)k;
    }
    if (len < cap) buf[len] = 0;
    return (long)len;
}

/* ========================================================================
 * Contexts
 * ===================================================================== */

struct dspark_ctx {
    const dspark_model *dm;
    ds_ctx     *c;
    char        kernels[256];
    /* cancellation names a generation: `running` is the id of the one under
     * way (0: none), `cancel` the id to stop (0: none) */
    _Atomic uint64_t running, cancel;
    atomic_int  busy;            /* a dspark_generate is under way              */
    uint64_t    next_id;         /* the context's own ids: top bit set          */
    double     *sps;             /* TABLE scheduler: seconds per verify pass,   */
    int         n_sps;           /*   measured on this context when first used   */
    char       *piece;           /* token bytes for the callback (grown)        */
    size_t      piece_cap;
    ds_dctx    *keep;            /* the drafter context between requests: its   */
                                 /*   recorded graphs and MASK cache made once   */
};

void dspark_ctx_params_default(dspark_ctx_params *p) {
    memset(p, 0, sizeof *p);
}

dspark_ctx *dspark_ctx_new(const dspark_model *dm, const dspark_ctx_params *p, dspark_error *err) {
    clear_err(err);
    if (!dm) { set_err(err, DSPARK_ERR_INVALID, "no model given"); return NULL; }
    dspark_ctx_params def;
    if (!p) { dspark_ctx_params_default(&def); p = &def; }
    const int n_train = dm->m->hp.n_ctx_train;
    int n_ctx = p->n_ctx;
    if (n_ctx == 0) n_ctx = n_train > 0 && n_train < 2048 ? n_train : 2048;
    if (n_ctx < 2 || (n_train > 0 && n_ctx > n_train) || n_ctx > (1 << 24)) {
        set_err(err, DSPARK_ERR_INVALID, "n_ctx %d is out of range [2, %d]", p->n_ctx, n_train > 0 ? n_train : 1 << 24);
        return NULL;
    }
    int n_threads = p->n_threads == 0 ? 2 : p->n_threads;
    if (n_threads < 1 || n_threads > 256) {
        set_err(err, DSPARK_ERR_INVALID, "n_threads %d is out of range [1, 256]", p->n_threads);
        return NULL;
    }
    ds_kernel_set ks;
    char e[DS_ERRLEN];
    if (ds_kernel_set_parse(&ks, p->kernels, p->fast, p->canonical, e, sizeof e)) {
        set_err(err, DSPARK_ERR_INVALID, "%s", e);
        return NULL;
    }
    dspark_ctx *x = calloc(1, sizeof *x);
    if (!x) { set_err(err, DSPARK_ERR_NOMEM, "out of memory"); return NULL; }
    x->dm = dm;
    x->c = ds_ctx_new(dm->m, n_ctx, n_threads, e, sizeof e);
    if (!x->c) {
        set_err(err, strstr(e, "memory") ? DSPARK_ERR_NOMEM : DSPARK_ERR_INVALID, "%s", e);
        free(x);
        return NULL;
    }
    ds_ctx_set_kernels(x->c, &ks);
    ds_kernel_set_str(&ks, x->kernels, sizeof x->kernels);
    atomic_init(&x->running, 0);
    atomic_init(&x->cancel, 0);
    atomic_init(&x->busy, 0);
    return x;
}

void dspark_ctx_free(dspark_ctx *x) {
    if (!x) return;
    ds_dctx_free(x->keep);       /* it uses x->c's execution context and dm's drafter */
    ds_ctx_free(x->c);
    free(x->sps);
    free(x->piece);
    free(x);
}

int dspark_ctx_n_ctx(const dspark_ctx *x) { return ds_ctx_n_ctx(x->c); }
const char *dspark_ctx_kernels(const dspark_ctx *x) { return x->kernels; }
void dspark_ctx_cancel(dspark_ctx *x) {
    /* if the generation ends before the store, the id names nothing that
     * will run again (ids are not reused): a late cancel is lost, never
     * moved to the next generation */
    const uint64_t r = atomic_load(&x->running);
    if (r) atomic_store(&x->cancel, r);
}

void dspark_ctx_cancel_id(dspark_ctx *x, uint64_t id) {
    if (id) atomic_store(&x->cancel, id);
}

/* ========================================================================
 * Grammars
 * ===================================================================== */

struct dspark_grammar {
    const dspark_model *dm;
    ds_grammar *g;
};

dspark_grammar *dspark_grammar_new(const dspark_model *dm, const char *text, size_t len, dspark_error *err) {
    clear_err(err);
    if (!dm || (!text && len)) { set_err(err, DSPARK_ERR_INVALID, "grammar: bad arguments"); return NULL; }
    dspark_grammar *g = calloc(1, sizeof *g);
    if (!g) { set_err(err, DSPARK_ERR_NOMEM, "out of memory"); return NULL; }
    char e[DS_ERRLEN];
    g->dm = dm;
    g->g = ds_grammar_new(text, len, dm->m->tok, e, sizeof e);
    if (!g->g) {
        set_err(err, strstr(e, "out of memory") ? DSPARK_ERR_NOMEM : DSPARK_ERR_INVALID, "%s", e);
        free(g);
        return NULL;
    }
    return g;
}

void dspark_grammar_free(dspark_grammar *g) {
    if (!g) return;
    ds_grammar_free(g->g);
    free(g);
}

const char *dspark_grammar_json_object(void) { return ds_grammar_json_object; }

/* ========================================================================
 * Generation
 * ===================================================================== */

void dspark_gen_params_default(dspark_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->max_tokens = 128;
    p->stop_at_eog = 1;
    p->top_p = 1.0f;
    p->speculative = 1;
    p->sched = DSPARK_SCHED_NONE;
    p->commit = DSPARK_COMMIT_DIRECT;
}

/* The engine's per-token hook, adapted: token bytes (and what the logits
 * chain captured) for the caller, and the ways to stop (the callback's
 * return value, a cancel naming this generation). Both generation loops
 * read their n_predict through the options pointer at every token and stop
 * once n_gen reaches it, so lowering it to the count emitted so far ends the
 * run right after this token, through the loop's own ordinary "length" exit:
 * no half-finished round, and the loop leaves plain decoding's state. */
typedef struct {
    dspark_ctx *x;
    const dspark_gen_params *p;
    int  *n_predict;             /* the live option the loop reads             */
    int   n_prompt;
    int   n_emitted;
    int   stopped;               /* 1: cancel / callback stop                   */
    const char *why;             /* "cancel" or "stop"                          */
    int   oom;
    uint64_t id;                 /* this generation's name                      */
    ds_lchain *chain;            /* NULL when no processing was asked for       */
} emit_ctx;

static int api_cancelled(void *user) {
    const emit_ctx *e = user;
    return atomic_load(&e->x->cancel) == e->id;
}

static void on_engine_token(void *user, int32_t token) {
    emit_ctx *e = user;
    const int64_t pos = (int64_t)e->n_prompt + e->n_emitted;
    e->n_emitted++;
    if ((e->p->on_token || e->p->on_token_ex) && !e->oom) {
        dspark_ctx *x = e->x;
        int n = ds_token_to_bytes(x->dm->m->tok, token, x->piece, x->piece_cap);
        if (n > 0 && (size_t)n > x->piece_cap) {
            char *nb = realloc(x->piece, (size_t)n);
            if (!nb) { e->oom = 1; e->stopped = 1; }
            else {
                x->piece = nb;
                x->piece_cap = (size_t)n;
                n = ds_token_to_bytes(x->dm->m->tok, token, x->piece, x->piece_cap);
            }
        }
        int rc = 0;
        if (e->oom) {}
        else if (e->p->on_token_ex) {
            dspark_token t = { token, x->piece, n > 0 ? (size_t)n : 0, pos, NAN, 0, NULL, NULL };
            if (e->chain) ds_lchain_captured(e->chain, pos, &t.logprob, &t.n_top, &t.top_id, &t.top_logprob);
            rc = e->p->on_token_ex(e->p->user, &t);
        } else rc = e->p->on_token(e->p->user, token, x->piece, n > 0 ? (size_t)n : 0);
        if (rc && !e->stopped) { e->stopped = 1; e->why = rc == DSPARK_STOP ? "stop" : "cancel"; }
    }
    if (!e->stopped && api_cancelled(e)) { e->stopped = 1; e->why = "cancel"; }
    if (e->stopped) *e->n_predict = e->n_emitted;
}

/* The request's parameters checked against the model (shared with
 * api_engine.c's scheduler requests; not exported). */
dspark_status ds_api_check_params(const dspark_model *dm, const dspark_gen_params *p, int use_spec, dspark_error *err) {
    const int V = dm->m->hp.n_vocab;
    if (p->max_tokens < 1) { set_err(err, DSPARK_ERR_INVALID, "max_tokens %d must be >= 1", p->max_tokens); return DSPARK_ERR_INVALID; }
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature)) {
        set_err(err, DSPARK_ERR_INVALID, "temperature %g must be a finite number >= 0", p->temperature);
        return DSPARK_ERR_INVALID;
    }
    if (p->top_k < 0 || p->top_k > V) {
        set_err(err, DSPARK_ERR_INVALID, "top_k %d is out of range [0, %d] (the vocabulary)", p->top_k, V);
        return DSPARK_ERR_INVALID;
    }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        set_err(err, DSPARK_ERR_INVALID, "top_p %g is out of range (0, 1]", p->top_p);
        return DSPARK_ERR_INVALID;
    }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) {
        set_err(err, DSPARK_ERR_INVALID, "min_p %g is out of range [0, 1]", p->min_p);
        return DSPARK_ERR_INVALID;
    }
    if (p->commit != DSPARK_COMMIT_DIRECT && p->commit != DSPARK_COMMIT_REPLAY) {
        set_err(err, DSPARK_ERR_INVALID, "unknown commit mode %d", (int)p->commit);
        return DSPARK_ERR_INVALID;
    }
    if (p->sched != DSPARK_SCHED_NONE && p->sched != DSPARK_SCHED_PMIN && p->sched != DSPARK_SCHED_TABLE &&
        p->sched != DSPARK_SCHED_AUTO) {
        set_err(err, DSPARK_ERR_INVALID, "unknown scheduler %d", (int)p->sched);
        return DSPARK_ERR_INVALID;
    }
    if (!(p->draft_p_min >= 0.0f && p->draft_p_min <= 1.0f)) {
        set_err(err, DSPARK_ERR_INVALID, "draft_p_min %g is out of range [0, 1]", p->draft_p_min);
        return DSPARK_ERR_INVALID;
    }
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f) ||
        !(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f)) {
        set_err(err, DSPARK_ERR_INVALID, "presence_penalty %g / frequency_penalty %g: each must be in [-2, 2]", p->presence_penalty,
                p->frequency_penalty);
        return DSPARK_ERR_INVALID;
    }
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias)) {
        set_err(err, DSPARK_ERR_INVALID, "logit_bias: %d entries and %s", p->n_logit_bias, p->logit_bias ? "a list" : "no list");
        return DSPARK_ERR_INVALID;
    }
    for (int i = 0; i < p->n_logit_bias; i++) {
        const dspark_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= V) {
            set_err(err, DSPARK_ERR_INVALID, "logit_bias: token %d is outside the vocabulary [0, %d)", b->token, V);
            return DSPARK_ERR_INVALID;
        }
        if (!((b->bias >= -100.0f && b->bias <= 100.0f) || b->bias == -INFINITY)) {
            set_err(err, DSPARK_ERR_INVALID, "logit_bias: the bias %g of token %d must be in [-100, 100] or -inf", b->bias, b->token);
            return DSPARK_ERR_INVALID;
        }
    }
    if ((p->logprobs != 0 && p->logprobs != 1) || p->top_logprobs < 0 || p->top_logprobs > DS_LPROC_TOP_MAX) {
        set_err(err, DSPARK_ERR_INVALID, "logprobs %d must be 0 or 1 and top_logprobs %d in [0, %d]", p->logprobs, p->top_logprobs,
                DS_LPROC_TOP_MAX);
        return DSPARK_ERR_INVALID;
    }
    if (p->grammar && p->grammar->dm != dm) {
        set_err(err, DSPARK_ERR_INVALID, "the grammar was compiled for another model");
        return DSPARK_ERR_INVALID;
    }
    if (!use_spec) return DSPARK_OK;
    const ds_drafter *d = dm->d;
    const int gamma = ds_drafter_block_size(d);
    if (p->draft_max < 0 || p->draft_max > gamma) {
        set_err(err, DSPARK_ERR_INVALID, "draft_max %d is out of range [0, %d] (the drafter's block size)", p->draft_max, gamma);
        return DSPARK_ERR_INVALID;
    }
    if (p->sched != DSPARK_SCHED_NONE && p->sched != DSPARK_SCHED_AUTO && !ds_drafter_has_confidence(d)) {
        set_err(err, DSPARK_ERR_UNSUPPORTED, "scheduler '%s' needs a drafter with a confidence head",
                ds_sched_name((ds_sched_mode)p->sched));
        return DSPARK_ERR_UNSUPPORTED;
    }
    return DSPARK_OK;
}

/* TABLE scheduler: seconds per verify pass of widths 1..need, measured once
 * per context (and again when a wider table is needed). */
static dspark_status ensure_sps(dspark_ctx *x, int need, dspark_error *err) {
    if (x->n_sps >= need) return DSPARK_OK;
    if (need >= ds_ctx_n_ctx(x->c)) {
        set_err(err, DSPARK_ERR_INVALID, "the context (%d) is too small to measure verify widths 1..%d", ds_ctx_n_ctx(x->c), need);
        return DSPARK_ERR_INVALID;
    }
    double *s = malloc((size_t)need * sizeof *s);
    if (!s) { set_err(err, DSPARK_ERR_NOMEM, "out of memory"); return DSPARK_ERR_NOMEM; }
    char e[DS_ERRLEN];
    if (ds_set_taps(x->c, ds_drafter_tap_layers(x->dm->d), ds_drafter_n_taps(x->dm->d), e, sizeof e) ||
        ds_spec_measure_sps(x->c, need, 5, s, e, sizeof e)) {
        free(s);
        set_err(err, DSPARK_ERR_INTERNAL, "SPS measurement: %s", e);
        return DSPARK_ERR_INTERNAL;
    }
    free(x->sps);
    x->sps = s;
    x->n_sps = need;
    return DSPARK_OK;
}

/* The chain of logits processors a request asks for (NULL: none asked;
 * shared with api_engine.c, not exported). */
ds_lchain *ds_api_make_chain(const dspark_model *dm, const dspark_gen_params *p, dspark_status *rc, dspark_error *err) {
    *rc = DSPARK_OK;
    if (p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f && !p->n_logit_bias && !p->grammar && !p->logprobs &&
        !p->top_logprobs)
        return NULL;
    ds_lchain_cfg cfg = { p->presence_penalty, p->frequency_penalty, NULL, NULL, p->n_logit_bias, p->grammar ? p->grammar->g : NULL,
                          p->logprobs, p->top_logprobs };
    int32_t *ids = p->n_logit_bias ? malloc((size_t)p->n_logit_bias * sizeof *ids) : NULL;
    float *bias = p->n_logit_bias ? malloc((size_t)p->n_logit_bias * sizeof *bias) : NULL;
    char e[DS_ERRLEN];
    ds_lchain *c = NULL;
    if (p->n_logit_bias && (!ids || !bias)) snprintf(e, sizeof e, "out of memory");
    else {
        for (int i = 0; i < p->n_logit_bias; i++) { ids[i] = p->logit_bias[i].token; bias[i] = p->logit_bias[i].bias; }
        cfg.bias_id = ids;
        cfg.bias = bias;
        c = ds_lchain_new(&cfg, dm->m->hp.n_vocab, e, sizeof e);
    }
    free(ids);
    free(bias);
    if (!c) {
        *rc = strstr(e, "out of memory") ? DSPARK_ERR_NOMEM : DSPARK_ERR_INVALID;
        set_err(err, *rc, "%s", e);
    }
    return c;
}

static dspark_status generate_locked(dspark_ctx *x, uint64_t id, const int32_t *prompt, int n_prompt,
                                     const dspark_gen_params *p, int32_t *out, dspark_stats *st, dspark_error *err) {
    const ds_model *m = x->dm->m;
    const int use_spec = p->speculative && x->dm->d != NULL;
    dspark_status rc = ds_api_check_params(x->dm, p, use_spec, err);
    if (rc) return rc;
    if (n_prompt < 1) { set_err(err, DSPARK_ERR_INVALID, "the prompt is empty"); return DSPARK_ERR_INVALID; }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= m->hp.n_vocab) {
            set_err(err, DSPARK_ERR_INVALID, "prompt token %d at index %d is outside the vocabulary [0, %d)", prompt[i], i,
                    m->hp.n_vocab);
            return DSPARK_ERR_INVALID;
        }
    const int n_ctx = ds_ctx_n_ctx(x->c);
    if (n_prompt >= n_ctx) {
        set_err(err, DSPARK_ERR_CONTEXT, "the prompt has %d tokens but the context holds %d (need room for at least one new token)",
                n_prompt, n_ctx);
        return DSPARK_ERR_CONTEXT;
    }
    uint64_t want = id;
    if (atomic_compare_exchange_strong(&x->cancel, &want, 0)) { st->stop = "cancel"; return DSPARK_OK; }   /* before it started */
    emit_ctx em = { x, p, NULL, n_prompt, 0, 0, "cancel", 0, id, NULL };
    em.chain = ds_api_make_chain(x->dm, p, &rc, err);
    if (rc) return rc;
    int32_t *buf = out ? out : malloc((size_t)p->max_tokens * sizeof(int32_t));
    if (!buf) { ds_lchain_free(em.chain); set_err(err, DSPARK_ERR_NOMEM, "out of memory"); return DSPARK_ERR_NOMEM; }
    const ds_sampler samp = { p->temperature, p->top_k, p->top_p, p->seed, p->min_p };
    const ds_gen_hooks hooks = { em.chain ? ds_lchain_proc(em.chain) : NULL, api_cancelled, &em };
    char e[DS_ERRLEN];
    int erc;
    if (!use_spec) {
        ds_gen_opts o = { p->max_tokens, DS_PREFILL_BATCH, p->stop_at_eog != 0, on_engine_token, &em };
        em.n_predict = &o.n_predict;
        ds_gen_stats gs;
        erc = ds_generate_ex(x->c, prompt, n_prompt, &o, &samp, &hooks, buf, &gs, e, sizeof e);
        if (!erc) {
            st->n_generated = gs.n_gen;
            st->stop = gs.stop;
            st->t_prefill_s = gs.t_prefill;
            st->t_total_s = gs.t_prefill + gs.t_decode;
            st->tok_s = gs.t_decode > 0 && gs.n_gen > 1 ? (gs.n_gen - 1) / gs.t_decode : 0.0;
        }
    } else {
        const int gamma = ds_drafter_block_size(x->dm->d);
        const int draft_max = p->draft_max ? p->draft_max : gamma;
        const int sps = p->sched == DSPARK_SCHED_TABLE || p->sched == DSPARK_SCHED_AUTO;
        if (sps && (rc = ensure_sps(x, draft_max + 1, err))) {
            if (!out) free(buf);
            ds_lchain_free(em.chain);
            return rc;
        }
        ds_spec_opts o;
        ds_spec_opts_default(&o);
        o.n_predict = p->max_tokens;
        o.stop_at_eog = p->stop_at_eog != 0;
        o.samp = samp;
        o.draft_max = draft_max;
        o.sched = (ds_sched_mode)p->sched;
        o.p_min = p->draft_p_min;
        o.sps_sec = sps ? x->sps : NULL;
        o.n_sps = sps ? x->n_sps : 0;
        o.commit = (ds_commit_mode)p->commit;
        o.on_token = on_engine_token;
        o.user = &em;
        o.keep = &x->keep;
        o.hooks = &hooks;
        em.n_predict = &o.n_predict;
        ds_spec_stats ss;
        erc = ds_spec_generate(x->c, x->dm->d, prompt, n_prompt, &o, buf, &ss, e, sizeof e);
        if (!erc) {
            st->n_generated = ss.n_gen;
            st->stop = ss.stop;
            st->t_prefill_s = ss.t_prefill;
            st->t_total_s = ss.t_total;
            st->tok_s = ss.tok_s;
            st->speculative = 1;
            st->draft_max = ss.draft_max;
            st->rounds = ss.rounds;
            st->drafted = ss.drafted;
            st->accepted = ss.accepted;
            st->mean_accepted_len = ss.mean_accepted_len;
            for (int k = 0; k < ss.draft_max && k < DSPARK_MAX_DRAFT; k++) st->accept_hist[k] = ss.accept_hist[k];
            st->t_draft_s = ss.t_draft;
            st->t_verify_s = ss.t_verify;
            st->t_commit_s = ss.t_commit;
        }
    }
    if (!out) free(buf);
    const char *chain_err = em.chain ? ds_lchain_error(em.chain) : "";
    if (erc && chain_err[0]) {      /* the request's constraints cannot be met */
        set_err(err, strstr(chain_err, "out of memory") ? DSPARK_ERR_NOMEM : DSPARK_ERR_INVALID, "%s", chain_err);
        rc = err ? err->code : DSPARK_ERR_INVALID;
    } else if (erc) {
        set_err(err, DSPARK_ERR_INTERNAL, "%s", e);
        rc = DSPARK_ERR_INTERNAL;
    } else if (em.oom) {
        set_err(err, DSPARK_ERR_NOMEM, "out of memory for a token's bytes");
        rc = DSPARK_ERR_NOMEM;
    }
    ds_lchain_free(em.chain);
    if (rc) return rc;
    if (em.stopped) st->stop = em.why;
    st->prefill_tok_s = st->t_prefill_s > 0 ? n_prompt / st->t_prefill_s : 0.0;
    return DSPARK_OK;
}

dspark_status dspark_generate(dspark_ctx *x, const int32_t *prompt, int n_prompt, const dspark_gen_params *p,
                              int32_t *out, dspark_stats *st, dspark_error *err) {
    clear_err(err);
    dspark_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    st->stop = "length";
    if (!x || !p || (n_prompt > 0 && !prompt)) { set_err(err, DSPARK_ERR_INVALID, "generate: bad arguments"); return DSPARK_ERR_INVALID; }
    st->n_prompt = n_prompt;
    /* one generation per context at a time: a second thread is refused, and
     * the running generation never sees it */
    if (atomic_exchange(&x->busy, 1)) {
        set_err(err, DSPARK_ERR_INVALID, "generate: the context is in use by another thread (one generation per context at a time)");
        return DSPARK_ERR_INVALID;
    }
    const uint64_t id = p->id ? p->id : (1ull << 63) | ++x->next_id;
    atomic_store(&x->running, id);
    dspark_status rc = generate_locked(x, id, prompt, n_prompt, p, out, st, err);
    atomic_store(&x->running, 0);
    uint64_t want = id;
    atomic_compare_exchange_strong(&x->cancel, &want, 0);            /* consumed */
    atomic_store(&x->busy, 0);
    return rc;
}

/* The engine's view of a model (api_engine.c; not exported). */
const ds_model *ds_api_model(const dspark_model *dm) { return dm->m; }
const ds_drafter *ds_api_drafter(const dspark_model *dm) { return dm->d; }
