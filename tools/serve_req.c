/* serve_req.c — the OpenAI-compatible surface of `dspark serve`: request
 * validation (every known field type- and range-checked, unknown fields
 * ignored, as OpenAI clients send extras), chat templates, response and
 * server-sent-event JSON, and UTF-8 repair of token bytes (a byte-level BPE
 * token may end inside a character; JSON strings must be valid UTF-8). */
#include "serve.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ========================================================================
 * Chat templates
 * ===================================================================== */

const char *chat_kind_name(chat_kind k) {
    switch (k) {
    case CHAT_CHATML: return "chatml";
    case CHAT_LLAMA3: return "llama3";
    case CHAT_PLAIN: return "plain";
    default: return "none";
    }
}

chat_kind chat_detect(const char *t) {
    if (!t) return CHAT_NONE;
    if (strstr(t, "<|im_start|>") && strstr(t, "<|im_end|>")) return CHAT_CHATML;
    if (strstr(t, "<|start_header_id|>") && strstr(t, "<|eot_id|>")) return CHAT_LLAMA3;
    return CHAT_NONE;
}

/* The prompt text of a conversation; roles and contents already checked. */
static void chat_render(chat_kind k, const char *const *role, const char *const *content, int n, sbuf *o) {
    for (int i = 0; i < n; i++) {
        switch (k) {
        case CHAT_CHATML:
            sbuf_addf(o, "<|im_start|>%s\n", role[i]);
            sbuf_adds(o, content[i]);
            sbuf_adds(o, "<|im_end|>\n");
            break;
        case CHAT_LLAMA3:
            if (i == 0) sbuf_adds(o, "<|begin_of_text|>");
            sbuf_addf(o, "<|start_header_id|>%s<|end_header_id|>\n\n", role[i]);
            sbuf_adds(o, content[i]);
            sbuf_adds(o, "<|eot_id|>");
            break;
        default:                                        /* plain transcript */
            if (!strcmp(role[i], "system")) { sbuf_adds(o, content[i]); sbuf_adds(o, "\n\n"); break; }
            sbuf_adds(o, !strcmp(role[i], "user") ? "User: " : "Assistant: ");
            sbuf_adds(o, content[i]);
            sbuf_adds(o, "\n");
            break;
        }
    }
    switch (k) {
    case CHAT_CHATML: sbuf_adds(o, "<|im_start|>assistant\n"); break;
    case CHAT_LLAMA3: sbuf_adds(o, "<|start_header_id|>assistant<|end_header_id|>\n\n"); break;
    default: sbuf_adds(o, "Assistant:"); break;
    }
}

/* ========================================================================
 * Errors
 * ===================================================================== */

void api_error_set(api_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *api_error_json(const api_error *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type);
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param); else cJSON_AddNullToObject(o, "param");
    if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code); else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

#define BAD(param, ...) api_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

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

/* Fields OpenAI defines that this server cannot honour: allowed only at
 * their neutral value, so a client never silently gets something else. */
static int neutral_only(const cJSON *o, api_error *e) {
    static const char *const zero[] = { "frequency_penalty", "presence_penalty" };
    for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++) {
        double v = 0;
        if (get_num(o, zero[i], -2, 2, &v, e)) return -1;
        if (v != 0) { BAD(zero[i], "'%s' is not supported (only 0)", zero[i]); return -1; }
    }
    long long n = 1;
    if (get_int(o, "n", 1, 128, &n, e)) return -1;
    if (n != 1) { BAD("n", "'n' must be 1 (one choice per request)"); return -1; }
    if (get_int(o, "best_of", 1, 128, &n, e)) return -1;
    if (n != 1) { BAD("best_of", "'best_of' must be 1"); return -1; }
    const cJSON *v = field(o, "logprobs");
    if (v && !(cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0))) {
        BAD("logprobs", "'logprobs' is not supported");
        return -1;
    }
    if ((v = field(o, "stop")) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0)) {
        if (!cJSON_IsString(v) && !cJSON_IsArray(v)) { BAD("stop", "'stop' must be a string or an array of strings"); return -1; }
        BAD("stop", "stop sequences are not supported");
        return -1;
    }
    if ((v = field(o, "suffix")) && !(cJSON_IsString(v) && !v->valuestring[0])) { BAD("suffix", "'suffix' is not supported"); return -1; }
    if ((v = field(o, "logit_bias")) && !(cJSON_IsObject(v) && !v->child)) { BAD("logit_bias", "'logit_bias' is not supported"); return -1; }
    if ((v = field(o, "tools")) && !(cJSON_IsArray(v) && !v->child)) { BAD("tools", "'tools' is not supported"); return -1; }
    if ((v = field(o, "response_format"))) {
        const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text")) {
            BAD("response_format", "'response_format' must be {\"type\": \"text\"}");
            return -1;
        }
    }
    if ((v = field(o, "user")) && !cJSON_IsString(v)) { BAD("user", "'user' must be a string"); return -1; }
    return 0;
}

/* ========================================================================
 * Prompts
 * ===================================================================== */

static int tokenize_text(const api_limits *L, const char *text, size_t len, int add_bos, api_request *r, api_error *e) {
    dspark_error de;
    int n = dspark_tokenize(L->model, text, len, add_bos, 1, NULL, 0, &de);
    if (n < 0) { BAD("prompt", "%s", de.message); return -1; }
    if (n == 0) { BAD("prompt", "the prompt is empty"); return -1; }
    if (n >= L->n_ctx) {
        api_error_set(e, 400, "invalid_request_error", r->chat ? "messages" : "prompt", "context_length_exceeded",
                      "the prompt has %d tokens but the context holds %d (need room for at least one new token)", n, L->n_ctx);
        return -1;
    }
    r->prompt = malloc((size_t)n * sizeof(int32_t));
    if (!r->prompt) { api_error_set(e, 500, "server_error", NULL, NULL, "out of memory"); return -1; }
    if (dspark_tokenize(L->model, text, len, add_bos, 1, r->prompt, n, &de) != n) {
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
        if (tokenize_text(L, p->valuestring, len, -1, r, e)) return -1;
        if (r->echo) {
            r->echo_text = malloc(len + 1);
            if (!r->echo_text) { api_error_set(e, 500, "server_error", NULL, NULL, "out of memory"); return -1; }
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
    if (!r->prompt) { api_error_set(e, 500, "server_error", NULL, NULL, "out of memory"); return -1; }
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
        if (!r->echo_text) { api_error_set(e, 500, "server_error", NULL, NULL, "out of memory"); return -1; }
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
    if (b.oom) { sbuf_free(&b); api_error_set(e, 500, "server_error", NULL, NULL, "out of memory"); return NULL; }
    return b.p;
}

static int parse_messages(const api_limits *L, const cJSON *o, api_request *r, api_error *e) {
    const cJSON *ms = field(o, "messages");
    if (!ms) { BAD("messages", "'messages' is required"); return -1; }
    if (!cJSON_IsArray(ms) || !ms->child) { BAD("messages", "'messages' must be a non-empty array"); return -1; }
    if (L->chat == CHAT_NONE) {
        api_error_set(e, 400, "invalid_request_error", "messages", "chat_template_unsupported", "%s", L->chat_why);
        return -1;
    }
    int n = cJSON_GetArraySize(ms);
    if (n > 4096) { BAD("messages", "too many messages (%d, at most 4096)", n); return -1; }
    const char **role = calloc((size_t)n, sizeof *role);
    char **content = calloc((size_t)n, sizeof *content);
    int rc = -1, i = 0;
    if (!role || !content) { api_error_set(e, 500, "server_error", NULL, NULL, "out of memory"); goto out; }
    for (const cJSON *m = ms->child; m; m = m->next, i++) {
        const cJSON *ro = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "role") : NULL;
        if (!cJSON_IsObject(m)) { BAD("messages", "messages[%d] must be an object", i); goto out; }
        if (!cJSON_IsString(ro) || (strcmp(ro->valuestring, "system") && strcmp(ro->valuestring, "user") &&
                                    strcmp(ro->valuestring, "assistant") && strcmp(ro->valuestring, "developer"))) {
            BAD("messages", "messages[%d].role must be \"system\", \"developer\", \"user\" or \"assistant\"", i);
            goto out;
        }
        role[i] = !strcmp(ro->valuestring, "developer") ? "system" : ro->valuestring;
        if (!(content[i] = message_content(m, i, e))) goto out;
    }
    sbuf text = { 0 };
    chat_render(L->chat, role, (const char *const *)content, n, &text);
    if (text.oom) { sbuf_free(&text); api_error_set(e, 500, "server_error", NULL, NULL, "out of memory"); goto out; }
    /* the templates that spell out their BOS do so in text */
    rc = tokenize_text(L, text.p, text.len, L->chat == CHAT_LLAMA3 ? 0 : -1, r, e);
    sbuf_free(&text);
out:
    if (content)
        for (int k = 0; k < n; k++) free(content[k]);
    free(content);
    free(role);
    return rc;
}

/* ========================================================================
 * The request
 * ===================================================================== */

void api_request_free(api_request *r) {
    free(r->prompt);
    free(r->echo_text);
    memset(r, 0, sizeof *r);
}

int api_parse(const api_limits *L, int chat, const char *body, size_t len, api_request *r, api_error *e) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    dspark_gen_params_default(&r->gp);
    r->gp.temperature = 1.0f;                          /* OpenAI's default */
    r->gp.max_tokens = chat ? L->max_tokens_limit : 16;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!o) { BAD(NULL, "the body is not valid JSON"); return -1; }
    while (end && (size_t)(end - body) < len && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t')) end++;
    int rc = -1;
    if (end && (size_t)(end - body) != len) { BAD(NULL, "the body has bytes after its JSON value"); goto out; }
    if (!cJSON_IsObject(o)) { BAD(NULL, "the body must be a JSON object"); goto out; }

    const cJSON *mo = field(o, "model");
    if (mo && !cJSON_IsString(mo)) { BAD("model", "'model' must be a string"); goto out; }
    if (mo && strcmp(mo->valuestring, L->model_id)) {
        api_error_set(e, 404, "invalid_request_error", "model", "model_not_found", "the model '%.100s' does not exist (this server has '%s')",
                      mo->valuestring, L->model_id);
        goto out;
    }
    if (get_bool(o, "stream", &r->stream, e) || get_bool(o, "echo", &r->echo, e)) goto out;
    if (chat && r->echo) { BAD("echo", "'echo' applies to /v1/completions only"); goto out; }
    const cJSON *so = field(o, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) { BAD("stream_options", "'stream_options' must be an object"); goto out; }
        if (get_bool(so, "include_usage", &r->include_usage, e)) goto out;
        if (!r->stream) { BAD("stream_options", "'stream_options' needs 'stream': true"); goto out; }
    }
    if (neutral_only(o, e)) goto out;

    long long mt = -1;
    const int lim = L->max_tokens_limit;
    if (get_int(o, "max_tokens", 0, 1e15, &mt, e)) goto out;
    if (chat && mt < 0 && get_int(o, "max_completion_tokens", 0, 1e15, &mt, e)) goto out;
    if (mt == 0) { BAD("max_tokens", "'max_tokens' must be >= 1"); goto out; }
    if (mt > lim) { BAD("max_tokens", "'max_tokens' %lld exceeds this server's limit %d", mt, lim); goto out; }
    if (mt > 0) r->gp.max_tokens = (int)mt;

    double d;
    long long k;
    d = r->gp.temperature;
    if (get_num(o, "temperature", 0, 2, &d, e)) goto out;
    r->gp.temperature = (float)d;
    d = 1;
    if (get_num(o, "top_p", 0, 1, &d, e)) goto out;
    if (!(d > 0)) { BAD("top_p", "'top_p' must be > 0"); goto out; }
    r->gp.top_p = (float)d;
    d = 0;
    if (get_num(o, "min_p", 0, 1, &d, e)) goto out;
    r->gp.min_p = (float)d;
    k = 0;
    if (get_int(o, "top_k", 0, dspark_model_n_vocab(L->model), &k, e)) goto out;
    r->gp.top_k = (int)k;
    k = 0;
    if (get_int(o, "seed", -9007199254740992.0, 9007199254740992.0, &k, e)) goto out;
    r->gp.seed = (uint64_t)k;
    int spec = 1, ignore_eos = 0;
    if (get_bool(o, "speculative", &spec, e) || get_bool(o, "ignore_eos", &ignore_eos, e)) goto out;
    r->gp.speculative = spec;
    r->gp.stop_at_eog = !ignore_eos;
    k = 0;
    if (get_int(o, "draft_max", 0, dspark_model_draft_block(L->model), &k, e)) goto out;
    r->gp.draft_max = (int)k;

    rc = chat ? parse_messages(L, o, r, e) : parse_prompt(L, o, r, e);
out:
    cJSON_Delete(o);
    if (rc) api_request_free(r);
    return rc;
}

/* ========================================================================
 * Responses
 * ===================================================================== */

const char *api_finish_reason(const dspark_stats *st) {
    return st->stop && !strcmp(st->stop, "eog") ? "stop" : "length";
}

static void add_usage(cJSON *root, const dspark_stats *st) {
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", st->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", st->n_generated);
    cJSON_AddNumberToObject(u, "total_tokens", st->n_prompt + st->n_generated);
}

/* The `dspark` field: how the answer was made. */
static void add_dspark(cJSON *root, const api_meta *m, const dspark_stats *st) {
    cJSON *d = cJSON_AddObjectToObject(root, "dspark");
    cJSON_AddStringToObject(d, "kernels", m->kernels);
    cJSON_AddBoolToObject(d, "speculative", st->speculative);
    cJSON_AddStringToObject(d, "stop", st->stop ? st->stop : "");
    cJSON_AddNumberToObject(d, "prompt_tokens", st->n_prompt);
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
    return root;
}

/* A string item from bytes that are valid UTF-8 but not NUL-terminated. */
static cJSON *str_n(const char *s, size_t n) {
    char *t = malloc(n + 1);
    if (!t) return NULL;
    memcpy(t, s, n);
    t[n] = 0;
    cJSON *j = cJSON_CreateString(t);
    free(t);
    return j;
}

static char *print_free(cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

char *api_response_json(const api_request *r, const api_meta *m, const char *text, size_t n, const dspark_stats *st) {
    sbuf t = { 0 };
    sbuf_add(&t, "", 0);
    if (r->echo) utf8_take(r->echo_text, r->echo_len, 1, &t);
    utf8_take(text, n, 1, &t);
    if (t.oom) { sbuf_free(&t); return NULL; }
    cJSON *root = new_root(r, m, 0);
    cJSON *ch = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->chat) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddItemToObject(msg, "content", str_n(t.p, t.len));
    } else {
        cJSON_AddItemToObject(c, "text", str_n(t.p, t.len));
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", api_finish_reason(st));
    add_usage(root, st);
    add_dspark(root, m, st);
    sbuf_free(&t);
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

void api_stream_delta(sbuf *out, const api_request *r, const api_meta *m, const char *text, size_t n, int first) {
    cJSON *root = new_root(r, m, 1);
    cJSON *ch = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (first) cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddItemToObject(d, "content", str_n(text, n));
    } else {
        cJSON_AddItemToObject(c, "text", str_n(text, n));
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    sse(out, root);
}

void api_stream_final(sbuf *out, const api_request *r, const api_meta *m, const dspark_stats *st) {
    cJSON *root = new_root(r, m, 1);
    cJSON *ch = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->chat) cJSON_AddObjectToObject(c, "delta");
    else cJSON_AddStringToObject(c, "text", "");
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", api_finish_reason(st));
    add_dspark(root, m, st);
    sse(out, root);
}

void api_stream_usage(sbuf *out, const api_request *r, const api_meta *m, const dspark_stats *st) {
    cJSON *root = new_root(r, m, 1);
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, st);
    sse(out, root);
}
