/* serve.h — `dspark serve` internals shared by its files:
 *   tools/cmd_serve.c    HTTP (libmicrohttpd), connections, streaming, drain
 *   tools/serve_gen.c    the generation side (serve_gen.h)
 *   tools/serve_req.c    OpenAI / llama-server request validation, response
 *                        and SSE JSON, stop strings, UTF-8 repair
 *   tools/serve_chat.c   chat templates (detected from the GGUF's template)
 *   tools/serve_schema.c JSON Schema -> GBNF grammar (response_format)
 * Built on the public API only (include/dspark.h): the server is a client of
 * libdspark like any other. */
#ifndef DSPARK_SERVE_H
#define DSPARK_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "dspark.h"

/* ---- a growable byte buffer ------------------------------------------------ */
typedef struct {
    char  *p;
    size_t len, cap;
    int    oom;                     /* sticky: an append failed                 */
} sbuf;
void sbuf_add(sbuf *b, const char *s, size_t n);
void sbuf_adds(sbuf *b, const char *s);
void sbuf_addf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sbuf_free(sbuf *b);

/* Append s[0..n) to out as valid UTF-8: complete sequences are copied, each
 * invalid byte becomes U+FFFD. When !final, a trailing sequence that may
 * still complete is left unconsumed. Returns the bytes consumed. Incremental
 * use (growing input, final on the last call) yields exactly the bytes of a
 * single final call, so a stream and its non-streamed twin carry one text. */
size_t utf8_take(const char *s, size_t n, int final, sbuf *out);
/* s[0..n) as a NUL-terminated, valid UTF-8 string (malloc'd; NULL on OOM). */
char *utf8_dup(const char *s, size_t n);
/* The longest prefix of s[0..n) that is at most max bytes and does not end
 * inside a UTF-8 character. */
size_t utf8_clip(const char *s, size_t n, size_t max);

/* ---- chat templates (serve_chat.c) ---------------------------------------------
 * Detected from the GGUF's tokenizer.chat_template text, as llama.cpp's
 * built-ins are, with the variants that change the prompt (a default system
 * prompt, Llama 3.1's date header, Qwen3's and DeepSeek-R1's thinking
 * tags, Gemma 3's system prefix); a template that matches none is refused
 * (chat requests get a 400 that says so), never rendered as something else. */
typedef enum {
    CHAT_NONE = 0, CHAT_CHATML, CHAT_QWEN3, CHAT_LLAMA3, CHAT_LLAMA2, CHAT_MISTRAL_V1, CHAT_MISTRAL_V3,
    CHAT_MISTRAL_V3_TEKKEN, CHAT_MISTRAL_V7, CHAT_GEMMA, CHAT_DEEPSEEK, CHAT_DEEPSEEK2, CHAT_DEEPSEEK3, CHAT_PHI3,
    CHAT_PHI4, CHAT_PLAIN, CHAT_KIND_COUNT
} chat_kind;

typedef struct {
    chat_kind kind;
    int   bos;                      /* the template starts with bos_token         */
    int   system_ok;                /* 0: the template has no system role         */
    int   alternate;                /* the template requires user/assistant turns */
    int   think;                    /* Qwen3: enable_thinking; DeepSeek-R1: <think> opens the reply */
    int   eos_space;                /* Llama-2 style: a space after each </s>     */
    char *default_system;           /* a system prompt the template adds itself   */
    char *knowledge;                /* Llama 3.1+: "Cutting Knowledge Date: ..."  */
    char *date;                     /* ... its default date_string, or NULL       */
    int   date_now;                 /* ... or today's date (strftime_now)         */
    char  why[400];                 /* CHAT_NONE: why                             */
    /* The GGUF's template interpreted (tools/jinja.h), when it parses and
     * renders a probe conversation; the built-in family above otherwise. */
    struct jinja_tmpl *jt;
    char *bos_text, *eos_text;      /* bos_token / eos_token as the vocabulary spells them ("" unknown) */
    int   jinja_bos;                /* the template starts with bos_token and its text is unknown: BOS is added */
    char  jinja_why[300];           /* why the Jinja template is not used ("" when it is) */
} chat_tmpl;

typedef struct {
    const char *role;               /* "system", "user", "assistant"               */
    const char *content;
} chat_msg;

const char *chat_kind_name(chat_kind k);
/* By name (--chat-template), CHAT_NONE if unknown. */
chat_kind   chat_kind_from_name(const char *name);
/* What a GGUF template is; forced (CHAT_NONE: detect). 0, or -1 with
 * t->why (no template, or one this server cannot render faithfully). */
int  chat_tmpl_init(chat_tmpl *t, const char *gguf_template, chat_kind forced);
/* chat_tmpl_init, then (jinja on, nothing forced, a template present) the
 * template interpreted: parsed, bos/eos spelled from the vocabulary, and a
 * probe conversation rendered; on any failure jinja_why says why and the
 * built-in family stays in charge. 0 when chat requests can be served. */
int  chat_tmpl_load(chat_tmpl *t, const char *gguf_template, chat_kind forced, int jinja, const dspark_model *m);
/* "jinja", "builtin" or "none" */
const char *chat_tmpl_source(const chat_tmpl *t);
/* The prompt of a conversation through the interpreted template: messages
 * (normalised OpenAI messages), tools (or NULL) and extra variables
 * (chat_template_kwargs, or NULL). *add_bos: whether the caller adds BOS.
 * 0, or -1 with why (raise_exception's message, a limit). */
struct cJSON;
int chat_render_jinja(const chat_tmpl *t, const struct cJSON *messages, const struct cJSON *tools, const struct cJSON *kwargs,
                      sbuf *out, int *add_bos, char *why, size_t whylen);

/* ---- the reply's parts (serve_chat.c) ---------------------------------------------
 * llama-server's --reasoning-format deepseek and its Hermes / Qwen tool-call
 * parser: text between <think> and </think> at the start of the reply (or
 * from the start, when the prompt opened the think block) is the
 * reasoning; each <tool_call>{"name": .., "arguments": ..}</tool_call> is a
 * tool call; the rest is the content. Not final (a stream): what could
 * still change (a partial tag, an open call, trailing blanks that a tag may
 * follow) is held back, so every field of a prefix's split is a prefix of
 * the final split's field: a stream's deltas add up to the non-streamed
 * message exactly. */
typedef struct {
    sbuf   reasoning, content;
    struct cJSON *calls;            /* [{"name": s, "arguments": JSON text}], or NULL */
    int    n_calls;
    int    content_null;            /* final, tool calls and blank content: null */
} chat_split;
void chat_split_text(const char *text, size_t n, int final, int think_open, int reasoning, int tools, chat_split *out);
void chat_split_free(chat_split *s);
void chat_tmpl_free(chat_tmpl *t);
/* The prompt text of a conversation that ends with a user message (or a
 * system one), plus the generation prompt. enable_thinking: Qwen3's switch
 * (1 by default). 0, or -1 with why (roles the template refuses). */
int chat_render(const chat_tmpl *t, const chat_msg *m, int n, int enable_thinking, sbuf *out, char *why, size_t whylen);

/* ---- JSON Schema -> grammar (serve_schema.c) --------------------------------------
 * The subset: type (one or a list), properties / required /
 * additionalProperties, items / prefixItems / minItems / maxItems, enum,
 * const, anyOf / oneOf, $ref into $defs / definitions (recursion allowed),
 * minLength / maxLength; annotations (title, description, default,
 * examples, $schema, $id, $comment) are ignored. Any other keyword is
 * refused by name (never silently unenforced). Without additionalProperties
 * an object with properties takes only those (llama.cpp's reading; JSON
 * Schema's default would allow more). Properties appear in schema order,
 * required ones always. */
struct cJSON;
char *schema_to_gbnf(const struct cJSON *schema, char *err, size_t errlen);

/* ---- stop strings (serve_req.c) ----------------------------------------------------- */
typedef struct {
    char  **s;
    size_t *len;
    int     n;
    size_t  max_len;
} stop_set;
/* The start of the earliest stop string in text[0..n), given that none was
 * in text[0..old_n); -1 when there is none. */
long   stop_find(const stop_set *ss, const char *text, size_t n, size_t old_n);
/* How many bytes at the end of text[0..n) could still begin a stop string
 * (a stream holds them back until they cannot). */
size_t stop_hold(const stop_set *ss, const char *text, size_t n);
void   stop_free(stop_set *ss);

/* ---- a validated request ------------------------------------------------------------ */
typedef struct {
    int    status;                  /* HTTP status (400, 404, ...)              */
    char   type[48];                /* OpenAI error type                        */
    char   param[64];               /* the offending field, "" when none        */
    char   code[48];                /* "" or a machine-readable code            */
    char   message[400];            /* valid UTF-8, one line                    */
} api_error;

enum { EP_KIND_COMPLETIONS = 0, EP_KIND_CHAT = 1 };

typedef struct {
    int      chat;                  /* /v1/chat/completions                     */
    int      stream, include_usage, echo;
    int32_t *prompt;                /* owned                                    */
    int      n_prompt;
    char    *echo_text;             /* owned; completions with echo: the prompt */
    size_t   echo_len;
    int      n;                     /* choices; choice k samples with seed + k  */
    int      seed_random;           /* no seed was given: one was drawn         */
    int      logprobs;              /* capture logprobs                         */
    int      top_logprobs;
    stop_set stop;
    dspark_logit_bias *bias;        /* owned, n_bias entries (gp points here)   */
    int      n_bias;
    dspark_grammar *grammar;        /* owned unless it is the server's shared one */
    int      grammar_shared;
    const char *format;             /* "text", "json_object", "json_schema", "grammar" */
    int      reasoning;             /* split <think>..</think> into reasoning_content */
    int      think_open;            /* the prompt ends inside a think block   */
    int      tools;                 /* parse <tool_call> blocks into tool_calls */
    struct api_stream_state *ss;    /* owned: streamed chat, one per choice   */
    dspark_gen_params gp;           /* on_token etc. set by the server          */
} api_request;

typedef struct {
    const dspark_model *model;
    const char *model_id;           /* the name /v1/models lists                */
    const chat_tmpl *chat;          /* the template; kind CHAT_NONE = refuse    */
    int         n_ctx;              /* every context's size                     */
    int         max_tokens_limit;
    int         max_n;              /* largest n                                */
    const dspark_grammar *json_object;   /* compiled once at start           */
    int         reasoning;          /* --reasoning-format: 1 deepseek (default), 0 none */
} api_limits;

/* Parse and validate a request body. 0, or -1 with e filled (status 4xx).
 * Fields the server implements are type- and range-checked; OpenAI and
 * llama-server fields it does not implement are accepted only at their
 * neutral value; unknown fields are refused by name. */
int  api_parse(const api_limits *L, int chat, const char *body, size_t len, api_request *r, api_error *e);
void api_request_free(api_request *r);
void api_error_set(api_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* {"error":{"message":..,"type":..,"param":..,"code":..}} (malloc'd, valid UTF-8) */
char *api_error_json(const api_error *e);
/* The bytes before a JSON body must be JSON whitespace only, as after it;
 * a string holding U+0000 is refused (a C string would end there). 0, or -1
 * with e. */
int  api_body_check(const char *body, size_t len, api_error *e);
/* A JSON string item from bytes (repaired to valid UTF-8). */
struct cJSON *api_str(const char *s, size_t n);

/* ---- responses ------------------------------------------------------------------------- */
typedef struct {
    const char *id;                 /* "cmpl-N" / "chatcmpl-N"                  */
    long long   created;
    const char *model_id;
    const char *kernels;
} api_meta;

/* One token of a choice with what was captured for it. */
typedef struct {
    int32_t  id;
    size_t   off, len;              /* its bytes in the choice's raw text       */
    float    logprob;
    int      n_top;
    int32_t  top_id[20];
    float    top_lp[20];
} api_tok;

/* A choice as it stands: raw generated bytes, the visible end (a stop
 * string cuts there), its tokens, its end. */
typedef struct {
    int            index;
    const char    *text;
    size_t         len;             /* bytes generated                          */
    size_t         cut;             /* visible bytes (== len without a stop)    */
    const api_tok *tok;
    int            n_tok;
    const char    *finish;          /* finish_reason (NULL: still running)      */
    const dspark_stats *st;
    uint64_t       seed;
} api_choice;

/* "stop", "length" or "abort" for how a generation ended (stop_hit: a stop
 * string cut it). */
const char *api_finish_reason(const dspark_stats *st, int stop_hit);
/* The complete (non-streamed) response of n choices; texts valid UTF-8. */
char *api_response_json(const api_limits *L, const api_request *r, const api_meta *m, const api_choice *c, int n);
/* One SSE event "data: {...}\n\n" appended to out: choice c's text piece
 * (with the logprobs of tokens t0..t1), the final chunk of a choice, or the
 * usage chunk. */
void api_stream_delta(sbuf *out, const api_limits *L, const api_request *r, const api_meta *m, const api_choice *c,
                      const char *text, size_t n, int first, int t0, int t1);
void api_stream_final(sbuf *out, const api_request *r, const api_meta *m, const api_choice *c);
void api_stream_usage(sbuf *out, const api_request *r, const api_meta *m, const api_choice *c, int n);

/* ---- the other endpoints' bodies ------------------------------------------------------ */
/* POST /tokenize and /detokenize (llama-server's): 200 body or NULL with e. */
char *api_tokenize(const api_limits *L, const char *body, size_t len, api_error *e);
char *api_detokenize(const api_limits *L, const char *body, size_t len, api_error *e);

#endif
