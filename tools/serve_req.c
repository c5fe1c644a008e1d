/* serve_req.c — the OpenAI / llama-server surface of `dspark serve`:
 * request validation, response and server-sent-event JSON, stop strings,
 * the tokenize endpoints, and UTF-8 repair of everything that goes into
 * JSON (a byte-level BPE token may end inside a character; an error may
 * quote a client's bytes).
 *
 * Fields: every field a client may send is in one table below, as
 * implemented or accepted only at its neutral value; anything else is a 400
 * that names it. Where OpenAI and llama-server differ, OpenAI's meaning
 * wins and README.md says so (a `seed` of -1 is a seed, not "random"; the
 * penalties count generated tokens only, not the prompt). */
#include "serve.h"
#include "json_text.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ========================================================================
 * Byte buffers and UTF-8
 * ===================================================================== */

void sbuf_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void sbuf_adds(sbuf *b, const char *s) { sbuf_add(b, s, strlen(s)); }

void sbuf_addf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) { b->oom = 1; return; }
    if ((size_t)n < sizeof tmp) { sbuf_add(b, tmp, (size_t)n); return; }
    char *big = malloc((size_t)n + 1);
    if (!big) { b->oom = 1; return; }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sbuf_add(b, big, (size_t)n);
    free(big);
}

void sbuf_free(sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Length of the well-formed UTF-8 sequence at s (RFC 3629 table: no
 * overlongs, no surrogates, <= U+10FFFF): 1..4; 0 if the bytes present can
 * still become one (more needed); -1 if s[0] starts no valid sequence. */
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned lo = 0x80, hi = 0xBF;                     /* range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return -1;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return 0;
        unsigned b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -1;
    }
    return len;
}

size_t utf8_take(const char *s, size_t n, int final, sbuf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;                              /* run: valid bytes not yet copied */
    while (i + run < n) {
        int k = utf8_seq(u + i + run, n - i - run);
        if (k > 0) { run += (size_t)k; continue; }
        sbuf_add(out, s + i, run);
        i += run;
        run = 0;
        if (k == 0 && !final) return i;                 /* may complete with more bytes */
        sbuf_add(out, "\xEF\xBF\xBD", 3);               /* U+FFFD for one bad byte */
        i++;
    }
    sbuf_add(out, s + i, run);
    return n;
}

char *utf8_dup(const char *s, size_t n) {
    sbuf b = { 0 };
    sbuf_add(&b, "", 0);
    utf8_take(s, n, 1, &b);
    if (b.oom) { sbuf_free(&b); return NULL; }
    return b.p;
}

size_t utf8_clip(const char *s, size_t n, size_t max) {
    if (n <= max) return n;
    size_t k = max;
    /* back off continuation bytes, then the lead byte they belong to */
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    return k;
}

/* ========================================================================
 * Stop strings: exact bytes, across token boundaries
 * ===================================================================== */

long stop_find(const stop_set *ss, const char *text, size_t n, size_t old_n) {
    long best = -1;
    for (int k = 0; k < ss->n; k++) {
        const size_t L = ss->len[k];
        if (L > n) continue;
        /* a new match ends at or after old_n */
        size_t from = old_n + 1 > L ? old_n + 1 - L : 0;
        for (size_t s = from; s + L <= n; s++)
            if (!memcmp(text + s, ss->s[k], L)) {
                if (best < 0 || (long)s < best) best = (long)s;
                break;
            }
    }
    return best;
}

size_t stop_hold(const stop_set *ss, const char *text, size_t n) {
    size_t hold = 0;
    for (int k = 0; k < ss->n; k++)
        for (size_t h = ss->len[k] - 1 < n ? ss->len[k] - 1 : n; h > hold; h--)
            if (!memcmp(text + n - h, ss->s[k], h)) { hold = h; break; }
    return hold;
}

void stop_free(stop_set *ss) {
    for (int k = 0; k < ss->n; k++) free(ss->s[k]);
    free(ss->s);
    free(ss->len);
    memset(ss, 0, sizeof *ss);
}

/* ========================================================================
 * Errors: every message valid UTF-8, one line
 * ===================================================================== */

void api_error_set(api_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1;
    /* a client's bytes quoted in the message: invalid sequences become
     * U+FFFD, control bytes a '?', and the cut never halves a character */
    sbuf b = { 0 };
    sbuf_add(&b, "", 0);
    utf8_take(tmp, len, 1, &b);
    size_t keep = b.oom ? 0 : utf8_clip(b.p, b.len, sizeof e->message - 1);
    for (size_t i = 0; i < keep; i++) e->message[i] = (unsigned char)b.p[i] < 0x20 ? '?' : b.p[i];
    e->message[keep] = 0;
    sbuf_free(&b);
    /* the param and code are ours, but keep them valid too */
    e->param[utf8_clip(e->param, strlen(e->param), sizeof e->param - 1)] = 0;
}

cJSON *api_str(const char *s, size_t n) {
    char *t = utf8_dup(s, n);
    if (!t) return NULL;
    cJSON *j = cJSON_CreateString(t);
    free(t);
    return j;
}

char *api_error_json(const api_error *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    cJSON_AddItemToObject(o, "message", api_str(e->message, strlen(e->message)));
    cJSON_AddStringToObject(o, "type", e->type);
    if (e->param[0]) cJSON_AddItemToObject(o, "param", api_str(e->param, strlen(e->param)));
    else cJSON_AddNullToObject(o, "param");
    if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code); else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

#define BAD(param, ...) api_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define OOM() api_error_set(e, 500, "server_error", NULL, NULL, "out of memory")

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int api_body_check(const char *body, size_t len, api_error *e) {
    char why[300];
    if (ds_json_text_check(body, len, why, sizeof why)) {
        BAD(NULL, "the body is not JSON text: %s%s", why, strstr(why, "U+0000") ? " (send the prompt as token ids to include a NUL)" : "");
        return -1;
    }
    return 0;
}

/* ========================================================================
 * Typed field access: absent or null keeps the default
 * ===================================================================== */

static const cJSON *field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int get_bool(const cJSON *o, const char *k, int *out, api_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) { BAD(k, "'%s' must be a boolean", k); return -1; }
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_num(const cJSON *o, const char *k, double lo, double hi, double *out, api_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) { BAD(k, "'%s' must be a number", k); return -1; }
    if (v->valuedouble < lo || v->valuedouble > hi) { BAD(k, "'%s' %g is out of range [%g, %g]", k, v->valuedouble, lo, hi); return -1; }
    *out = v->valuedouble;
    return 0;
}

/* A number the engine takes as a float: checked after the conversion too,
 * so that what the engine sees is what was validated (5e-324 is > 0 as a
 * double and 0 as a float). open_lo: the lower bound is exclusive. */
static int get_float(const cJSON *o, const char *k, double lo, double hi, int open_lo, float *out, api_error *e) {
    double d = *out;
    if (get_num(o, k, lo, hi, &d, e)) return -1;
    const float f = (float)d;
    if (open_lo && !(f > (float)lo)) {
        BAD(k, "'%s' %g must be > %g (it is %g as the engine's float)", k, d, lo, (double)f);
        return -1;
    }
    if (!(f >= (float)lo && f <= (float)hi)) { BAD(k, "'%s' %g is out of range [%g, %g] as a float", k, d, lo, hi); return -1; }
    *out = f;
    return 0;
}

static int get_int(const cJSON *o, const char *k, double lo, double hi, long long *out, api_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble)) {
        BAD(k, "'%s' must be an integer", k);
        return -1;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) { BAD(k, "'%s' %.0f is out of range [%.0f, %.0f]", k, v->valuedouble, lo, hi); return -1; }
    *out = (long long)v->valuedouble;
    return 0;
}

/* ========================================================================
 * The fields: every name a request may carry
 * ===================================================================== */

enum { W_CMPL = 1, W_CHAT = 2, W_BOTH = 3 };
static const struct { const char *name; int where; } known_fields[] = {
    /* OpenAI, implemented */
    { "model", W_BOTH }, { "prompt", W_CMPL }, { "messages", W_CHAT }, { "stream", W_BOTH }, { "stream_options", W_BOTH },
    { "max_tokens", W_BOTH }, { "max_completion_tokens", W_CHAT }, { "n", W_BOTH }, { "seed", W_BOTH }, { "stop", W_BOTH },
    { "temperature", W_BOTH }, { "top_p", W_BOTH }, { "presence_penalty", W_BOTH }, { "frequency_penalty", W_BOTH },
    { "logit_bias", W_BOTH }, { "logprobs", W_BOTH }, { "top_logprobs", W_CHAT }, { "echo", W_CMPL },
    { "response_format", W_BOTH }, { "user", W_BOTH },
    /* OpenAI, accepted at their neutral value (or informational) */
    { "best_of", W_CMPL }, { "suffix", W_CMPL }, { "tools", W_CHAT }, { "tool_choice", W_CHAT }, { "parallel_tool_calls", W_CHAT },
    { "functions", W_CHAT }, { "function_call", W_CHAT }, { "modalities", W_CHAT }, { "audio", W_CHAT }, { "prediction", W_CHAT },
    { "reasoning_effort", W_CHAT }, { "web_search_options", W_CHAT }, { "verbosity", W_CHAT }, { "metadata", W_BOTH },
    { "store", W_BOTH }, { "service_tier", W_BOTH }, { "prompt_cache_key", W_BOTH }, { "safety_identifier", W_BOTH },
    /* llama-server, implemented */
    { "top_k", W_BOTH }, { "min_p", W_BOTH }, { "n_predict", W_BOTH }, { "ignore_eos", W_BOTH }, { "grammar", W_BOTH },
    { "json_schema", W_BOTH }, { "n_probs", W_BOTH }, { "cache_prompt", W_BOTH }, { "chat_template_kwargs", W_CHAT },
    /* llama-server, accepted at their neutral value */
    { "typical_p", W_BOTH }, { "repeat_penalty", W_BOTH }, { "repeat_last_n", W_BOTH }, { "penalize_nl", W_BOTH },
    { "mirostat", W_BOTH }, { "mirostat_tau", W_BOTH }, { "mirostat_eta", W_BOTH }, { "id_slot", W_BOTH },
    { "dry_multiplier", W_BOTH }, { "xtc_probability", W_BOTH }, { "top_n_sigma", W_BOTH }, { "dynatemp_range", W_BOTH },
    { "min_keep", W_BOTH }, { "post_sampling_probs", W_BOTH }, { "timings_per_token", W_BOTH }, { "return_tokens", W_BOTH },
    { "samplers", W_BOTH }, { "n_keep", W_BOTH }, { "t_max_predict_ms", W_BOTH }, { "reasoning_format", W_CHAT },
    /* dspark's own */
    { "speculative", W_BOTH }, { "draft_max", W_BOTH },
};

static int unknown_fields(const cJSON *o, int chat, api_error *e) {
    const int w = chat ? W_CHAT : W_CMPL;
    for (const cJSON *it = o->child; it; it = it->next) {
        int found = -1;
        for (size_t k = 0; k < sizeof known_fields / sizeof known_fields[0] && found < 0; k++)
            if (!strcmp(it->string, known_fields[k].name)) found = (int)k;
        if (found < 0) {
            BAD(it->string, "unknown field '%.80s' (README.md lists what this server takes)", it->string);
            return -1;
        }
        if (!(known_fields[found].where & w)) {
            BAD(it->string, "'%s' applies to /v1/%s only", it->string, chat ? "completions" : "chat/completions");
            return -1;
        }
    }
    return 0;
}

/* a field that must be absent, null or equal to its neutral value */
typedef enum { NV_NUM, NV_FALSE, NV_EMPTY_ARRAY, NV_EMPTY_STRING, NV_NULL } nv_kind;
static int neutral(const cJSON *o, const char *k, nv_kind kind, double val, const char *what, api_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return 0;
    int ok = 0;
    switch (kind) {
    case NV_NUM: ok = cJSON_IsNumber(v) && v->valuedouble == val; break;
    case NV_FALSE: ok = cJSON_IsFalse(v); break;
    case NV_EMPTY_ARRAY: ok = cJSON_IsArray(v) && !v->child; break;
    case NV_EMPTY_STRING: ok = cJSON_IsString(v) && !v->valuestring[0]; break;
    case NV_NULL: ok = 0; break;
    }
    if (!ok) { BAD(k, "'%s' is not supported by this server (%s)", k, what); return -1; }
    return 0;
}

static int one_of(const cJSON *o, const char *k, const char *const *allowed, const char *what, api_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return 0;
    if (cJSON_IsString(v))
        for (int i = 0; allowed[i]; i++)
            if (!strcmp(v->valuestring, allowed[i])) return 0;
    BAD(k, "'%s' must be %s", k, what);
    return -1;
}

static int a_string(const cJSON *o, const char *k, api_error *e) {
    const cJSON *v = field(o, k);
    if (v && !cJSON_IsString(v)) { BAD(k, "'%s' must be a string", k); return -1; }
    return 0;
}

/* The fields this server does not implement, each only at its neutral value. */
static int neutral_fields(const cJSON *o, const api_request *r, api_error *e) {
    static const char *const none_auto[] = { "none", "auto", NULL }, *const tiers[] = { "auto", "default", NULL },
                             *const rf_none[] = { "none", NULL };
    long long k = 1;
    if (get_int(o, "best_of", 1, 128, &k, e)) return -1;
    if (k != 1 && k != r->n) { BAD("best_of", "'best_of' must be 1 or equal to 'n' (no server-side ranking)"); return -1; }
    if (neutral(o, "suffix", NV_EMPTY_STRING, 0, "no fill-in-the-middle: only \"\"", e) ||
        neutral(o, "tools", NV_EMPTY_ARRAY, 0, "no tool calls: only []", e) ||
        neutral(o, "functions", NV_EMPTY_ARRAY, 0, "no function calls: only []", e) ||
        one_of(o, "tool_choice", none_auto, "\"none\" or \"auto\" (no tools)", e) ||
        one_of(o, "function_call", none_auto, "\"none\" or \"auto\" (no functions)", e) ||
        neutral(o, "audio", NV_NULL, 0, "text only", e) || neutral(o, "prediction", NV_NULL, 0, "no predicted outputs", e) ||
        neutral(o, "reasoning_effort", NV_NULL, 0, "no reasoning effort control", e) ||
        neutral(o, "web_search_options", NV_NULL, 0, "no web search", e) ||
        neutral(o, "verbosity", NV_NULL, 0, "no verbosity control", e) ||
        neutral(o, "store", NV_FALSE, 0, "nothing is stored: only false", e) ||
        one_of(o, "service_tier", tiers, "\"auto\" or \"default\"", e) ||
        a_string(o, "user", e) || a_string(o, "prompt_cache_key", e) || a_string(o, "safety_identifier", e) ||
        neutral(o, "typical_p", NV_NUM, 1, "only 1", e) || neutral(o, "repeat_penalty", NV_NUM, 1, "only 1; use frequency_penalty", e) ||
        neutral(o, "mirostat", NV_NUM, 0, "only 0", e) || neutral(o, "dry_multiplier", NV_NUM, 0, "only 0", e) ||
        neutral(o, "xtc_probability", NV_NUM, 0, "only 0", e) || neutral(o, "dynatemp_range", NV_NUM, 0, "only 0", e) ||
        neutral(o, "min_keep", NV_NUM, 0, "only 0", e) || neutral(o, "id_slot", NV_NUM, -1, "slots are not pinned: only -1", e) ||
        neutral(o, "post_sampling_probs", NV_FALSE, 0, "logprobs are the model's: only false", e) ||
        neutral(o, "timings_per_token", NV_FALSE, 0, "only false; the dspark field has the timings", e) ||
        neutral(o, "return_tokens", NV_FALSE, 0, "only false", e) ||
        neutral(o, "samplers", NV_NULL, 0, "the order is fixed: temperature, top_k, top_p, min_p", e) ||
        neutral(o, "t_max_predict_ms", NV_NUM, 0, "only 0", e) ||
        one_of(o, "reasoning_format", rf_none, "\"none\" (the reply keeps its thinking tags)", e))
        return -1;
    const cJSON *v;
    double d = 0;
    if (get_num(o, "top_n_sigma", -1e9, 0, &d, e)) return -1;
    if (get_num(o, "mirostat_tau", -1e9, 1e9, &d, e) || get_num(o, "mirostat_eta", -1e9, 1e9, &d, e)) return -1;
    if (get_int(o, "repeat_last_n", -1, 1e9, &k, e)) return -1;
    if ((v = field(o, "penalize_nl")) && !cJSON_IsBool(v)) { BAD("penalize_nl", "'penalize_nl' must be a boolean"); return -1; }
    if ((v = field(o, "parallel_tool_calls")) && !cJSON_IsBool(v)) { BAD("parallel_tool_calls", "'parallel_tool_calls' must be a boolean"); return -1; }
    if ((v = field(o, "metadata")) && !cJSON_IsObject(v)) { BAD("metadata", "'metadata' must be an object"); return -1; }
    if ((v = field(o, "modalities")) &&
        !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(v->child) && !strcmp(v->child->valuestring, "text"))) {
        BAD("modalities", "'modalities' must be [\"text\"]");
        return -1;
    }
    k = 0;
    if (get_int(o, "n_keep", -1, 0, &k, e)) return -1;     /* the context never shifts */
    int b = 0;
    if (get_bool(o, "cache_prompt", &b, e)) return -1;     /* speed only: the answer never depends on it */
    return 0;
}

/* ========================================================================
 * Prompts
 * ===================================================================== */

static int tokenize_text(const api_limits *L, const char *text, size_t len, int add_bos, int parse_special, api_request *r,
                         api_error *e) {
    dspark_error de;
    int n = dspark_tokenize(L->model, text, len, add_bos, parse_special, NULL, 0, &de);
    if (n < 0) { BAD(r->chat ? "messages" : "prompt", "%s", de.message); return -1; }
    if (n == 0) { BAD(r->chat ? "messages" : "prompt", "the prompt is empty"); return -1; }
    if (n >= L->n_ctx) {
        api_error_set(e, 400, "invalid_request_error", r->chat ? "messages" : "prompt", "context_length_exceeded",
                      "the prompt has %d tokens but the context holds %d (need room for at least one new token)", n, L->n_ctx);
        return -1;
    }
    r->prompt = malloc((size_t)n * sizeof(int32_t));
    if (!r->prompt) { OOM(); return -1; }
    if (dspark_tokenize(L->model, text, len, add_bos, parse_special, r->prompt, n, &de) != n) {
        api_error_set(e, 500, "server_error", NULL, NULL, "tokenizer: %s", de.message);
        return -1;
    }
    r->n_prompt = n;
    return 0;
}

static int parse_prompt(const api_limits *L, const cJSON *o, api_request *r, api_error *e) {
    const cJSON *p = field(o, "prompt");
    if (!p) { BAD("prompt", "'prompt' is required"); return -1; }
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
    if (cJSON_IsString(p)) {
        size_t len = strlen(p->valuestring);
        if (tokenize_text(L, p->valuestring, len, -1, 1, r, e)) return -1;
        if (r->echo) {
            r->echo_text = malloc(len + 1);
            if (!r->echo_text) { OOM(); return -1; }
            memcpy(r->echo_text, p->valuestring, len + 1);
            r->echo_len = len;
        }
        return 0;
    }
    if (!cJSON_IsArray(p)) { BAD("prompt", "'prompt' must be a string, an array of one string, or an array of token ids"); return -1; }
    int n = cJSON_GetArraySize(p);
    if (n == 0) { BAD("prompt", "the prompt is empty"); return -1; }
    if (!cJSON_IsNumber(p->child)) { BAD("prompt", "one prompt per request: 'prompt' must be a string or an array of token ids"); return -1; }
    if (n >= L->n_ctx) {
        api_error_set(e, 400, "invalid_request_error", "prompt", "context_length_exceeded",
                      "the prompt has %d tokens but the context holds %d (need room for at least one new token)", n, L->n_ctx);
        return -1;
    }
    r->prompt = malloc((size_t)n * sizeof(int32_t));
    if (!r->prompt) { OOM(); return -1; }
    const int V = dspark_model_n_vocab(L->model);
    int i = 0;
    for (const cJSON *t = p->child; t; t = t->next, i++) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= V) {
            BAD("prompt", "prompt token at index %d is not a token id in [0, %d)", i, V);
            return -1;
        }
        r->prompt[i] = (int32_t)t->valuedouble;
    }
    r->n_prompt = n;
    if (r->echo) {
        dspark_error de;
        long len = dspark_detokenize(L->model, r->prompt, n, NULL, 0, &de);
        r->echo_text = len >= 0 ? malloc((size_t)len + 1) : NULL;
        if (!r->echo_text) { OOM(); return -1; }
        dspark_detokenize(L->model, r->prompt, n, r->echo_text, (size_t)len + 1, &de);
        r->echo_len = (size_t)len;
    }
    return 0;
}

/* A message's content: a string, or an array of {"type":"text","text":..}
 * parts, concatenated. Returns a malloc'd string or NULL with e set. */
static char *message_content(const cJSON *m, int idx, api_error *e) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    if (!cJSON_IsArray(c)) { BAD("messages", "messages[%d].content must be a string or an array of text parts", idx); return NULL; }
    sbuf b = { 0 };
    sbuf_add(&b, "", 0);
    for (const cJSON *part = c->child; part; part = part->next) {
        const cJSON *ty = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
        const cJSON *tx = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx)) {
            sbuf_free(&b);
            BAD("messages", "messages[%d].content parts must be {\"type\": \"text\", \"text\": string}", idx);
            return NULL;
        }
        sbuf_adds(&b, tx->valuestring);
    }
    if (b.oom) { sbuf_free(&b); OOM(); return NULL; }
    return b.p;
}

static int parse_messages(const api_limits *L, const cJSON *o, api_request *r, api_error *e) {
    const cJSON *ms = field(o, "messages");
    if (!ms) { BAD("messages", "'messages' is required"); return -1; }
    if (!cJSON_IsArray(ms) || !ms->child) { BAD("messages", "'messages' must be a non-empty array"); return -1; }
    if (L->chat->kind == CHAT_NONE) {
        api_error_set(e, 400, "invalid_request_error", "messages", "chat_template_unsupported", "%s", L->chat->why);
        return -1;
    }
    int think = 1;
    const cJSON *kw = field(o, "chat_template_kwargs");
    if (kw) {
        if (!cJSON_IsObject(kw)) { BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object"); return -1; }
        for (const cJSON *it = kw->child; it; it = it->next)
            if (strcmp(it->string, "enable_thinking")) {
                BAD("chat_template_kwargs", "chat_template_kwargs.%.60s is not supported (only enable_thinking)", it->string);
                return -1;
            }
        if (get_bool(kw, "enable_thinking", &think, e)) return -1;
    }
    int n = cJSON_GetArraySize(ms);
    if (n > 4096) { BAD("messages", "too many messages (%d, at most 4096)", n); return -1; }
    chat_msg *msg = calloc((size_t)n, sizeof *msg);
    char **content = calloc((size_t)n, sizeof *content);
    int rc = -1, i = 0;
    if (!msg || !content) { OOM(); goto out; }
    for (const cJSON *m = ms->child; m; m = m->next, i++) {
        if (!cJSON_IsObject(m)) { BAD("messages", "messages[%d] must be an object", i); goto out; }
        for (const cJSON *it = m->child; it; it = it->next)
            if (strcmp(it->string, "role") && strcmp(it->string, "content") && strcmp(it->string, "name")) {
                BAD("messages", "messages[%d].%.60s is not supported (role, content, name)", i, it->string);
                goto out;
            }
        const cJSON *ro = cJSON_GetObjectItemCaseSensitive(m, "role"), *nm = cJSON_GetObjectItemCaseSensitive(m, "name");
        if (!cJSON_IsString(ro) || (strcmp(ro->valuestring, "system") && strcmp(ro->valuestring, "user") &&
                                    strcmp(ro->valuestring, "assistant") && strcmp(ro->valuestring, "developer"))) {
            BAD("messages", "messages[%d].role must be \"system\", \"developer\", \"user\" or \"assistant\"", i);
            goto out;
        }
        if (nm && !cJSON_IsString(nm)) { BAD("messages", "messages[%d].name must be a string", i); goto out; }
        msg[i].role = !strcmp(ro->valuestring, "developer") ? "system" : ro->valuestring;
        if (!(content[i] = message_content(m, i, e))) goto out;
        msg[i].content = content[i];
    }
    sbuf text = { 0 };
    char why[240];
    if (chat_render(L->chat, msg, n, think, &text, why, sizeof why)) {
        sbuf_free(&text);
        BAD("messages", "%s", why);
        goto out;
    }
    if (text.oom) { sbuf_free(&text); OOM(); goto out; }
    /* BOS is added as the template's bos_token (never twice) */
    rc = tokenize_text(L, text.p, text.len, L->chat->bos, 1, r, e);
    sbuf_free(&text);
out:
    if (content)
        for (int k = 0; k < n; k++) free(content[k]);
    free(content);
    free(msg);
    return rc;
}

/* ========================================================================
 * Sampling extras: stop, logit_bias, logprobs, structured output
 * ===================================================================== */

static int parse_stop(const cJSON *o, api_request *r, api_error *e) {
    const cJSON *v = field(o, "stop");
    if (!v) return 0;
    const int one = cJSON_IsString(v);
    if (!one && !cJSON_IsArray(v)) { BAD("stop", "'stop' must be a string or an array of strings"); return -1; }
    const int n = one ? 1 : cJSON_GetArraySize(v);
    if (n > 16) { BAD("stop", "at most 16 stop sequences (got %d)", n); return -1; }
    r->stop.s = calloc((size_t)(n ? n : 1), sizeof *r->stop.s);
    r->stop.len = calloc((size_t)(n ? n : 1), sizeof *r->stop.len);
    if (!r->stop.s || !r->stop.len) { OOM(); return -1; }
    const cJSON *it = one ? v : v->child;
    for (int k = 0; k < n; k++, it = it->next) {
        if (!cJSON_IsString(it)) { BAD("stop", "stop[%d] must be a string", k); return -1; }
        const size_t len = strlen(it->valuestring);
        if (len == 0 || len > 256) { BAD("stop", "stop sequences must have 1 to 256 bytes (stop[%d] has %zu)", k, len); return -1; }
        if (!(r->stop.s[k] = strdup(it->valuestring))) { OOM(); return -1; }
        r->stop.len[k] = len;
        r->stop.n = k + 1;
        if (len > r->stop.max_len) r->stop.max_len = len;
    }
    return 0;
}

/* OpenAI's {"id": bias} object, or llama-server's [[id, bias|false], ...]
 * (a bias of false bans the token; an id may be a string: each of its
 * tokens gets the bias). */
static int bias_add(const api_limits *L, api_request *r, const cJSON *key, const cJSON *val, int idx, api_error *e) {
    float b;
    if (cJSON_IsFalse(val)) b = -INFINITY;
    else if (cJSON_IsNumber(val) && isfinite(val->valuedouble) && val->valuedouble >= -100 && val->valuedouble <= 100)
        b = (float)val->valuedouble;
    else { BAD("logit_bias", "logit_bias entry %d: the bias must be a number in [-100, 100] (or false)", idx); return -1; }
    const int V = dspark_model_n_vocab(L->model);
    int32_t ids[64];
    int n = 0;
    if (cJSON_IsNumber(key)) {
        if (key->valuedouble != floor(key->valuedouble) || key->valuedouble < 0 || key->valuedouble >= V) {
            BAD("logit_bias", "logit_bias entry %d: %g is not a token id in [0, %d)", idx, key->valuedouble, V);
            return -1;
        }
        ids[n++] = (int32_t)key->valuedouble;
    } else if (cJSON_IsString(key)) {
        dspark_error de;
        n = dspark_tokenize(L->model, key->valuestring, strlen(key->valuestring), 0, 0, ids, 64, &de);
        if (n < 1 || n > 64) { BAD("logit_bias", "logit_bias entry %d: the text must be 1 to 64 tokens", idx); return -1; }
    } else { BAD("logit_bias", "logit_bias entry %d: the key must be a token id or a string", idx); return -1; }
    if (r->n_bias + n > 1024) { BAD("logit_bias", "at most 1024 logit_bias entries"); return -1; }
    dspark_logit_bias *nb = realloc(r->bias, (size_t)(r->n_bias + n) * sizeof *nb);
    if (!nb) { OOM(); return -1; }
    r->bias = nb;
    for (int k = 0; k < n; k++) r->bias[r->n_bias++] = (dspark_logit_bias){ ids[k], b };
    return 0;
}

static int parse_bias(const api_limits *L, const cJSON *o, api_request *r, api_error *e) {
    const cJSON *v = field(o, "logit_bias");
    if (!v) return 0;
    int idx = 0;
    if (cJSON_IsObject(v)) {
        for (const cJSON *it = v->child; it; it = it->next, idx++) {
            /* OpenAI's keys are token ids written as strings */
            char *end;
            const double id = strtod(it->string, &end);
            if (!*it->string || *end || id != floor(id)) {
                BAD("logit_bias", "logit_bias key '%.40s' is not a token id", it->string);
                return -1;
            }
            cJSON *num = cJSON_CreateNumber(id);
            int rc = num ? bias_add(L, r, num, it, idx, e) : (OOM(), -1);
            cJSON_Delete(num);
            if (rc) return -1;
        }
        return 0;
    }
    if (!cJSON_IsArray(v)) { BAD("logit_bias", "'logit_bias' must be an object {\"token id\": bias} or [[id, bias], ...]"); return -1; }
    for (const cJSON *it = v->child; it; it = it->next, idx++) {
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2) { BAD("logit_bias", "logit_bias entry %d must be [id, bias]", idx); return -1; }
        if (bias_add(L, r, it->child, it->child->next, idx, e)) return -1;
    }
    return 0;
}

static int parse_logprobs(const cJSON *o, api_request *r, api_error *e) {
    const cJSON *v = field(o, "logprobs");
    long long k = 0;
    if (r->chat) {
        int on = 0;
        if (get_bool(o, "logprobs", &on, e)) return -1;
        if (get_int(o, "top_logprobs", 0, 20, &k, e)) return -1;
        if (field(o, "top_logprobs") && !on) { BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true"); return -1; }
        r->logprobs = on;
        r->top_logprobs = (int)k;
    } else if (v) {
        /* completions: an integer 0..5, the top count (false / 0 = the
         * chosen token's logprob only is not OpenAI's: false is off) */
        if (cJSON_IsFalse(v)) return 0;
        if (get_int(o, "logprobs", 0, 5, &k, e)) return -1;
        r->logprobs = 1;
        r->top_logprobs = (int)k;
    }
    if (get_int(o, "n_probs", 0, 20, &k, e)) return -1;       /* llama-server's spelling */
    if (field(o, "n_probs") && k > 0) {
        if (v && r->top_logprobs != (int)k) { BAD("n_probs", "'n_probs' and 'logprobs' disagree"); return -1; }
        r->logprobs = 1;
        r->top_logprobs = (int)k;
    }
    if (r->logprobs && r->echo) { BAD("logprobs", "'logprobs' with 'echo' (prompt logprobs) is not supported"); return -1; }
    return 0;
}

/* response_format (OpenAI), json_schema and grammar (llama-server): one
 * constraint at most. */
static int parse_format(const api_limits *L, const cJSON *o, api_request *r, api_error *e) {
    const cJSON *rf = field(o, "response_format"), *js = field(o, "json_schema"), *gr = field(o, "grammar");
    if (!!rf + !!js + !!gr > 1) { BAD("response_format", "give one of 'response_format', 'json_schema' and 'grammar'"); return -1; }
    r->format = "text";
    const cJSON *schema = NULL;
    char *text = NULL;
    if (rf) {
        const cJSON *t = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        if (!cJSON_IsString(t)) { BAD("response_format", "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}"); return -1; }
        for (const cJSON *it = rf->child; it; it = it->next)
            if (strcmp(it->string, "type") && strcmp(it->string, "json_schema") && strcmp(it->string, "schema")) {
                BAD("response_format", "response_format.%.60s is not supported", it->string);
                return -1;
            }
        if (!strcmp(t->valuestring, "text")) return 0;
        if (!strcmp(t->valuestring, "json_object")) {
            r->format = "json_object";
            r->grammar = (dspark_grammar *)L->json_object;
            r->grammar_shared = 1;
            return 0;
        }
        if (strcmp(t->valuestring, "json_schema")) { BAD("response_format", "response_format type '%.40s' is not supported", t->valuestring); return -1; }
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        if (cJSON_IsObject(w)) {
            for (const cJSON *it = w->child; it; it = it->next)
                if (strcmp(it->string, "name") && strcmp(it->string, "schema") && strcmp(it->string, "strict") &&
                    strcmp(it->string, "description")) {
                    BAD("response_format", "response_format.json_schema.%.60s is not supported", it->string);
                    return -1;
                }
            schema = cJSON_GetObjectItemCaseSensitive(w, "schema");
        } else schema = cJSON_GetObjectItemCaseSensitive(rf, "schema");        /* llama-server's short form */
        if (!schema) { BAD("response_format", "response_format json_schema needs json_schema.schema"); return -1; }
    } else if (js) schema = js;
    else if (gr) {
        if (!cJSON_IsString(gr)) { BAD("grammar", "'grammar' must be a string (GBNF)"); return -1; }
        if (!(text = strdup(gr->valuestring))) { OOM(); return -1; }
        r->format = "grammar";
    } else return 0;
    if (schema) {
        char why[300];
        if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema)) { BAD(rf ? "response_format" : "json_schema", "the schema must be an object"); return -1; }
        if (!(text = schema_to_gbnf(schema, why, sizeof why))) { BAD(rf ? "response_format" : "json_schema", "%s", why); return -1; }
        r->format = "json_schema";
    }
    dspark_error de;
    r->grammar = dspark_grammar_new(L->model, text, strlen(text), &de);
    free(text);
    if (!r->grammar) {
        if (de.code == DSPARK_ERR_NOMEM) OOM();
        else BAD(gr ? "grammar" : rf ? "response_format" : "json_schema", "%s", de.message);
        return -1;
    }
    return 0;
}

/* ========================================================================
 * The request
 * ===================================================================== */

void api_request_free(api_request *r) {
    free(r->prompt);
    free(r->echo_text);
    stop_free(&r->stop);
    free(r->bias);
    if (!r->grammar_shared) dspark_grammar_free(r->grammar);
    memset(r, 0, sizeof *r);
}

/* A seed nobody asked for: 52 random bits, so that it prints exactly in
 * JSON and `dspark generate -s` takes it back. */
static uint64_t random_seed(void) {
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
    }
    return s & ((1ull << 52) - 1);       /* seed + choice index stays below 2^53 */
}

int api_parse(const api_limits *L, int chat, const char *body, size_t len, api_request *r, api_error *e) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->n = 1;
    dspark_gen_params_default(&r->gp);
    r->gp.temperature = 1.0f;                          /* OpenAI's default */
    r->gp.max_tokens = chat ? L->max_tokens_limit : 16;
    if (api_body_check(body, len, e)) return -1;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!o) { BAD(NULL, "the body is not valid JSON"); return -1; }
    while (end && (size_t)(end - body) < len && is_ws(*end)) end++;
    int rc = -1;
    if (end && (size_t)(end - body) != len) { BAD(NULL, "the body has bytes after its JSON value"); goto out; }
    if (!cJSON_IsObject(o)) { BAD(NULL, "the body must be a JSON object"); goto out; }
    if (unknown_fields(o, chat, e)) goto out;

    const cJSON *mo = field(o, "model");
    if (mo && !cJSON_IsString(mo)) { BAD("model", "'model' must be a string"); goto out; }
    if (mo && strcmp(mo->valuestring, L->model_id)) {
        api_error_set(e, 404, "invalid_request_error", "model", "model_not_found", "the model '%.100s' does not exist (this server has '%s')",
                      mo->valuestring, L->model_id);
        goto out;
    }
    if (get_bool(o, "stream", &r->stream, e) || get_bool(o, "echo", &r->echo, e)) goto out;
    const cJSON *so = field(o, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) { BAD("stream_options", "'stream_options' must be an object"); goto out; }
        for (const cJSON *it = so->child; it; it = it->next)
            if (strcmp(it->string, "include_usage")) { BAD("stream_options", "stream_options.%.60s is not supported", it->string); goto out; }
        if (get_bool(so, "include_usage", &r->include_usage, e)) goto out;
        if (!r->stream) { BAD("stream_options", "'stream_options' needs 'stream': true"); goto out; }
    }
    long long k = 1;
    if (get_int(o, "n", 1, L->max_n, &k, e)) goto out;
    r->n = (int)k;
    if (neutral_fields(o, r, e)) goto out;

    /* max_tokens (OpenAI), max_completion_tokens (chat), n_predict (llama-server; -1 = the limit) */
    long long mt = -1, np = -2;
    const int lim = L->max_tokens_limit;
    if (get_int(o, "max_tokens", 0, 1e15, &mt, e)) goto out;
    if (chat && mt < 0 && get_int(o, "max_completion_tokens", 0, 1e15, &mt, e)) goto out;
    if (get_int(o, "n_predict", -1, 1e15, &np, e)) goto out;
    if (np != -2) {
        if (np == -1) np = lim;
        if (mt >= 0 && mt != np) { BAD("n_predict", "'n_predict' %lld and 'max_tokens' %lld disagree", np, mt); goto out; }
        mt = np;
    }
    if (mt == 0) { BAD(np != -2 ? "n_predict" : "max_tokens", "'max_tokens' must be >= 1"); goto out; }
    if (mt > lim) { BAD(np != -2 ? "n_predict" : "max_tokens", "'max_tokens' %lld exceeds this server's limit %d", mt, lim); goto out; }
    if (mt > 0) r->gp.max_tokens = (int)mt;

    if (get_float(o, "temperature", 0, 2, 0, &r->gp.temperature, e)) goto out;
    if (get_float(o, "top_p", 0, 1, 1, &r->gp.top_p, e)) goto out;
    if (get_float(o, "min_p", 0, 1, 0, &r->gp.min_p, e)) goto out;
    if (get_float(o, "presence_penalty", -2, 2, 0, &r->gp.presence_penalty, e)) goto out;
    if (get_float(o, "frequency_penalty", -2, 2, 0, &r->gp.frequency_penalty, e)) goto out;
    k = 0;
    if (get_int(o, "top_k", 0, dspark_model_n_vocab(L->model), &k, e)) goto out;
    r->gp.top_k = (int)k;
    /* seed: any integer JSON carries exactly (|x| <= 2^53), taken modulo
     * 2^64 as `dspark generate -s` takes it; none given: a random one */
    k = 0;
    if (get_int(o, "seed", -9007199254740992.0, 9007199254740992.0, &k, e)) goto out;
    r->seed_random = !field(o, "seed");
    r->gp.seed = r->seed_random ? random_seed() : (uint64_t)k;
    int spec = 1, ignore_eos = 0;
    if (get_bool(o, "speculative", &spec, e) || get_bool(o, "ignore_eos", &ignore_eos, e)) goto out;
    r->gp.speculative = spec;
    r->gp.stop_at_eog = !ignore_eos;
    k = 0;
    if (get_int(o, "draft_max", 0, dspark_model_draft_block(L->model), &k, e)) goto out;
    r->gp.draft_max = (int)k;
    if (parse_stop(o, r, e) || parse_bias(L, o, r, e) || parse_logprobs(o, r, e) || parse_format(L, o, r, e)) goto out;
    if (r->grammar && ignore_eos) { BAD("ignore_eos", "'ignore_eos' cannot be combined with a grammar (it ends with the end-of-generation token)"); goto out; }
    r->gp.logit_bias = r->bias;
    r->gp.n_logit_bias = r->n_bias;
    r->gp.grammar = r->grammar;
    r->gp.logprobs = r->logprobs;
    r->gp.top_logprobs = r->top_logprobs;

    rc = chat ? parse_messages(L, o, r, e) : parse_prompt(L, o, r, e);
out:
    cJSON_Delete(o);
    if (rc) api_request_free(r);
    return rc;
}

/* ========================================================================
 * Responses
 * ===================================================================== */

const char *api_finish_reason(const dspark_stats *st, int stop_hit) {
    if (stop_hit) return "stop";
    if (!st->stop) return "length";
    if (!strcmp(st->stop, "eog") || !strcmp(st->stop, "stop")) return "stop";
    /* cut by the drain (or cancelled: nobody waits for that answer):
     * vLLM's name, OpenAI has none */
    if (!strcmp(st->stop, "drain") || !strcmp(st->stop, "cancel")) return "abort";
    return "length";
}

static int stop_hit(const api_choice *c) { return c->cut < c->len; }

static void add_usage(cJSON *root, int n_prompt, long n_gen) {
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(n_prompt + n_gen));
}

/* The `dspark` field: how the answer was made (seed: replay it with this
 * seed and the same parameters, or `dspark generate -s SEED`). */
static void add_dspark(cJSON *parent, const api_request *r, const api_meta *m, const api_choice *c) {
    const dspark_stats *st = c->st;
    cJSON *d = cJSON_AddObjectToObject(parent, "dspark");
    cJSON_AddStringToObject(d, "kernels", m->kernels);
    cJSON_AddBoolToObject(d, "speculative", st->speculative);
    cJSON_AddStringToObject(d, "stop", stop_hit(c) ? "stop_string" : st->stop ? st->stop : "");
    char seed[32];                                   /* exact: a double would round it */
    snprintf(seed, sizeof seed, "%lld", (long long)(int64_t)c->seed);
    cJSON_AddRawToObject(d, "seed", seed);
    cJSON_AddBoolToObject(d, "seed_random", r->seed_random);
    cJSON_AddStringToObject(d, "response_format", r->format ? r->format : "text");
    cJSON_AddNumberToObject(d, "prompt_tokens", st->n_prompt);
    cJSON_AddNumberToObject(d, "cached_tokens", st->n_cached);      /* from the prefix cache */
    cJSON_AddNumberToObject(d, "generated_tokens", st->n_generated);
    cJSON_AddNumberToObject(d, "prefill_s", st->t_prefill_s);
    cJSON_AddNumberToObject(d, "total_s", st->t_total_s);
    cJSON_AddNumberToObject(d, "tok_s", st->tok_s);
    if (st->speculative) {
        cJSON_AddNumberToObject(d, "draft_max", st->draft_max);
        cJSON_AddNumberToObject(d, "rounds", st->rounds);
        cJSON_AddNumberToObject(d, "drafted", (double)st->drafted);
        cJSON_AddNumberToObject(d, "accepted", (double)st->accepted);
        cJSON_AddNumberToObject(d, "mean_accepted_len", st->mean_accepted_len);
        cJSON *h = cJSON_AddArrayToObject(d, "accept_hist");
        for (int i = 0; i < st->draft_max && i < DSPARK_MAX_DRAFT; i++) cJSON_AddItemToArray(h, cJSON_CreateNumber((double)st->accept_hist[i]));
        cJSON_AddNumberToObject(d, "draft_s", st->t_draft_s);
        cJSON_AddNumberToObject(d, "verify_s", st->t_verify_s);
        cJSON_AddNumberToObject(d, "commit_s", st->t_commit_s);
    }
}

static cJSON *new_root(const api_request *r, const api_meta *m, int chunk) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", m->id);
    cJSON_AddStringToObject(root, "object", r->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)m->created);
    cJSON_AddStringToObject(root, "model", m->model_id);
    cJSON_AddStringToObject(root, "system_fingerprint", m->kernels);
    return root;
}

static char *print_free(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

/* a token's text (repaired) and its raw bytes */
static cJSON *tok_str(const api_limits *L, int32_t id, cJSON **bytes) {
    char buf[512];
    int n = dspark_token_to_bytes(L->model, id, buf, sizeof buf);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof buf) n = (int)sizeof buf;
    if (bytes) {
        *bytes = cJSON_CreateArray();
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(*bytes, cJSON_CreateNumber((unsigned char)buf[i]));
    }
    return api_str(buf, (size_t)n);
}

/* Logprobs of tokens t0..t1 of c in the endpoint's shape (NULL item: none asked). */
static cJSON *logprobs_json(const api_limits *L, const api_request *r, const api_choice *c, int t0, int t1) {
    if (!r->logprobs) return cJSON_CreateNull();
    cJSON *lp = cJSON_CreateObject();
    if (r->chat) {
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (int i = t0; i < t1; i++) {
            const api_tok *t = &c->tok[i];
            cJSON *o = cJSON_CreateObject(), *bytes = NULL;
            cJSON_AddItemToObject(o, "token", tok_str(L, t->id, &bytes));
            cJSON_AddNumberToObject(o, "logprob", t->logprob);
            cJSON_AddItemToObject(o, "bytes", bytes);
            cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
            for (int k = 0; k < t->n_top; k++) {
                cJSON *a = cJSON_CreateObject(), *ab = NULL;
                cJSON_AddItemToObject(a, "token", tok_str(L, t->top_id[k], &ab));
                cJSON_AddNumberToObject(a, "logprob", t->top_lp[k]);
                cJSON_AddItemToObject(a, "bytes", ab);
                cJSON_AddItemToArray(top, a);
            }
            cJSON_AddItemToArray(content, o);
        }
        cJSON_AddNullToObject(lp, "refusal");
        return lp;
    }
    cJSON *toks = cJSON_AddArrayToObject(lp, "tokens"), *tlp = cJSON_AddArrayToObject(lp, "token_logprobs"),
          *top = cJSON_AddArrayToObject(lp, "top_logprobs"), *off = cJSON_AddArrayToObject(lp, "text_offset");
    for (int i = t0; i < t1; i++) {
        const api_tok *t = &c->tok[i];
        cJSON_AddItemToArray(toks, tok_str(L, t->id, NULL));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(t->logprob));
        cJSON *d = cJSON_CreateObject();
        for (int k = 0; k < t->n_top; k++) {
            cJSON *s = tok_str(L, t->top_id[k], NULL);
            cJSON_AddNumberToObject(d, s && s->valuestring ? s->valuestring : "", t->top_lp[k]);
            cJSON_Delete(s);
        }
        cJSON_AddItemToArray(top, d);
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(r->echo_len + t->off)));
    }
    return lp;
}

/* The tokens a choice shows: all, or those that start before a stop string. */
static int visible_tokens(const api_choice *c) {
    if (!stop_hit(c)) return c->n_tok;
    int n = 0;
    while (n < c->n_tok && c->tok[n].off < c->cut) n++;
    return n;
}

char *api_response_json(const api_limits *L, const api_request *r, const api_meta *m, const api_choice *c, int n) {
    cJSON *root = new_root(r, m, 0), *ch = cJSON_AddArrayToObject(root, "choices");
    long n_gen = 0;
    for (int k = 0; k < n; k++) {
        sbuf t = { 0 };
        sbuf_add(&t, "", 0);
        if (r->echo) utf8_take(r->echo_text, r->echo_len, 1, &t);
        utf8_take(c[k].text, c[k].cut, 1, &t);
        if (t.oom) { sbuf_free(&t); cJSON_Delete(root); return NULL; }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(ch, o);
        cJSON_AddNumberToObject(o, "index", c[k].index);
        if (r->chat) {
            cJSON *msg = cJSON_AddObjectToObject(o, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            cJSON_AddItemToObject(msg, "content", cJSON_CreateString(t.p));
            cJSON_AddNullToObject(msg, "refusal");
        } else {
            cJSON_AddItemToObject(o, "text", cJSON_CreateString(t.p));
        }
        sbuf_free(&t);
        cJSON_AddItemToObject(o, "logprobs", logprobs_json(L, r, &c[k], 0, visible_tokens(&c[k])));
        cJSON_AddStringToObject(o, "finish_reason", c[k].finish);
        if (n > 1) add_dspark(o, r, m, &c[k]);
        n_gen += c[k].st->n_generated;
    }
    add_usage(root, r->n_prompt, n_gen);
    add_dspark(root, r, m, &c[0]);
    return print_free(root);
}

static void sse(sbuf *out, cJSON *root) {
    char *s = print_free(root);
    if (!s) { out->oom = 1; return; }
    sbuf_adds(out, "data: ");
    sbuf_adds(out, s);
    sbuf_adds(out, "\n\n");
    free(s);
}

void api_stream_delta(sbuf *out, const api_limits *L, const api_request *r, const api_meta *m, const api_choice *c,
                      const char *text, size_t n, int first, int t0, int t1) {
    cJSON *root = new_root(r, m, 1), *ch = cJSON_AddArrayToObject(root, "choices"), *o = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, o);
    cJSON_AddNumberToObject(o, "index", c->index);
    if (r->chat) {
        cJSON *d = cJSON_AddObjectToObject(o, "delta");
        if (first) cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddItemToObject(d, "content", api_str(text, n));
    } else {
        cJSON_AddItemToObject(o, "text", api_str(text, n));
    }
    cJSON_AddItemToObject(o, "logprobs", t1 > t0 ? logprobs_json(L, r, c, t0, t1) : cJSON_CreateNull());
    cJSON_AddNullToObject(o, "finish_reason");
    sse(out, root);
}

void api_stream_final(sbuf *out, const api_request *r, const api_meta *m, const api_choice *c) {
    cJSON *root = new_root(r, m, 1), *ch = cJSON_AddArrayToObject(root, "choices"), *o = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, o);
    cJSON_AddNumberToObject(o, "index", c->index);
    if (r->chat) cJSON_AddObjectToObject(o, "delta");
    else cJSON_AddStringToObject(o, "text", "");
    cJSON_AddNullToObject(o, "logprobs");
    cJSON_AddStringToObject(o, "finish_reason", c->finish);
    add_dspark(root, r, m, c);
    sse(out, root);
}

void api_stream_usage(sbuf *out, const api_request *r, const api_meta *m, const api_choice *c, int n) {
    cJSON *root = new_root(r, m, 1);
    cJSON_AddArrayToObject(root, "choices");
    long n_gen = 0;
    for (int k = 0; k < n; k++) n_gen += c[k].st->n_generated;
    add_usage(root, r->n_prompt, n_gen);
    sse(out, root);
}

/* ========================================================================
 * /tokenize and /detokenize (llama-server's shapes)
 * ===================================================================== */

static cJSON *parse_object(const char *body, size_t len, api_error *e) {
    if (api_body_check(body, len, e)) return NULL;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!o) { BAD(NULL, "the body is not valid JSON"); return NULL; }
    while (end && (size_t)(end - body) < len && is_ws(*end)) end++;
    if ((end && (size_t)(end - body) != len) || !cJSON_IsObject(o)) {
        BAD(NULL, "the body must be one JSON object");
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static int only_fields(const cJSON *o, const char *const *names, api_error *e) {
    for (const cJSON *it = o->child; it; it = it->next) {
        int ok = 0;
        for (int k = 0; names[k] && !ok; k++) ok = !strcmp(it->string, names[k]);
        if (!ok) { BAD(it->string, "unknown field '%.80s'", it->string); return -1; }
    }
    return 0;
}

char *api_tokenize(const api_limits *L, const char *body, size_t len, api_error *e) {
    static const char *const names[] = { "content", "add_special", "parse_special", "with_pieces", NULL };
    cJSON *o = parse_object(body, len, e), *root = NULL;
    if (!o) return NULL;
    int add = 0, special = 1, pieces = 0;
    const cJSON *c = field(o, "content");
    int32_t *ids = NULL;
    if (only_fields(o, names, e) || get_bool(o, "add_special", &add, e) || get_bool(o, "parse_special", &special, e) ||
        get_bool(o, "with_pieces", &pieces, e))
        goto out;
    if (!cJSON_IsString(c)) { BAD("content", "'content' must be a string"); goto out; }
    dspark_error de;
    const size_t n_txt = strlen(c->valuestring);
    int n = dspark_tokenize(L->model, c->valuestring, n_txt, add, special, NULL, 0, &de);
    if (n < 0) { BAD("content", "%s", de.message); goto out; }
    if (n > 0 && !(ids = malloc((size_t)n * sizeof *ids))) { OOM(); goto out; }
    if (n > 0) dspark_tokenize(L->model, c->valuestring, n_txt, add, special, ids, n, &de);
    root = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(root, "tokens");
    for (int i = 0; i < n; i++) {
        if (!pieces) { cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i])); continue; }
        /* a piece that is not valid UTF-8 alone is given as its bytes */
        char buf[512];
        int k = dspark_token_to_bytes(L->model, ids[i], buf, sizeof buf);
        if (k < 0) k = 0;
        if ((size_t)k > sizeof buf) k = (int)sizeof buf;
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "id", ids[i]);
        sbuf chk = { 0 };
        sbuf_add(&chk, "", 0);
        utf8_take(buf, (size_t)k, 1, &chk);
        if (!chk.oom && chk.len == (size_t)k && !memcmp(chk.p, buf, (size_t)k)) cJSON_AddItemToObject(p, "piece", api_str(buf, (size_t)k));
        else {
            cJSON *b = cJSON_AddArrayToObject(p, "piece");
            for (int j = 0; j < k; j++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)buf[j]));
        }
        sbuf_free(&chk);
        cJSON_AddItemToArray(arr, p);
    }
out:
    free(ids);
    cJSON_Delete(o);
    char *s = root ? print_free(root) : NULL;
    if (root && !s) OOM();
    return s;
}

char *api_detokenize(const api_limits *L, const char *body, size_t len, api_error *e) {
    static const char *const names[] = { "tokens", NULL };
    cJSON *o = parse_object(body, len, e), *root = NULL;
    if (!o) return NULL;
    const cJSON *t = field(o, "tokens");
    int32_t *ids = NULL;
    char *txt = NULL;
    if (only_fields(o, names, e)) goto out;
    if (!cJSON_IsArray(t)) { BAD("tokens", "'tokens' must be an array of token ids"); goto out; }
    const int n = cJSON_GetArraySize(t), V = dspark_model_n_vocab(L->model);
    if (n > 0 && !(ids = malloc((size_t)n * sizeof *ids))) { OOM(); goto out; }
    int i = 0;
    for (const cJSON *it = t->child; it; it = it->next, i++) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 || it->valuedouble >= V) {
            BAD("tokens", "tokens[%d] is not a token id in [0, %d)", i, V);
            goto out;
        }
        ids[i] = (int32_t)it->valuedouble;
    }
    dspark_error de;
    long k = dspark_detokenize(L->model, ids, n, NULL, 0, &de);
    if (k < 0 || !(txt = malloc((size_t)k + 1))) { OOM(); goto out; }
    dspark_detokenize(L->model, ids, n, txt, (size_t)k + 1, &de);
    root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "content", api_str(txt, (size_t)k));
out:
    free(ids);
    free(txt);
    cJSON_Delete(o);
    char *s = root ? print_free(root) : NULL;
    if (root && !s) OOM();
    return s;
}
