/* serve.h — `dspark serve` internals shared by tools/cmd_serve.c (HTTP,
 * queue, workers) and tools/serve_req.c (OpenAI request validation, chat
 * templates, response JSON, UTF-8 handling). Built on the public API only
 * (include/dspark.h): the server is a client of libdspark like any other. */
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

/* ---- chat templates --------------------------------------------------------- */
typedef enum { CHAT_NONE = 0, CHAT_CHATML = 1, CHAT_LLAMA3 = 2, CHAT_PLAIN = 3 } chat_kind;
const char *chat_kind_name(chat_kind k);
/* What a GGUF's tokenizer.chat_template is, among the ones the server
 * knows; CHAT_NONE for NULL or an unknown template. */
chat_kind chat_detect(const char *tmpl);

/* ---- a validated request ------------------------------------------------------ */
typedef struct {
    int    status;                  /* HTTP status (400, 404, ...)              */
    char   type[48];                /* OpenAI error type                        */
    char   param[48];               /* the offending field, "" when none        */
    char   code[48];                /* "" or a machine-readable code            */
    char   message[320];
} api_error;

typedef struct {
    int      chat;                  /* /v1/chat/completions                     */
    int      stream, include_usage, echo;
    int32_t *prompt;                /* owned                                    */
    int      n_prompt;
    char    *echo_text;             /* owned; completions with echo: the prompt */
    size_t   echo_len;
    dspark_gen_params gp;           /* on_token/user set by the server          */
} api_request;

typedef struct {
    const dspark_model *model;
    const char *model_id;           /* the name /v1/models lists                */
    chat_kind   chat;               /* resolved template, CHAT_NONE = refuse     */
    const char *chat_why;           /* why there is none (for the 400)          */
    int         n_ctx;              /* every worker context's size              */
    int         max_tokens_limit;
} api_limits;

/* Parse and validate a request body. 0, or -1 with e filled (status 4xx).
 * Unknown fields are ignored; known fields of the wrong type or out of range
 * are errors. */
int  api_parse(const api_limits *L, int chat, const char *body, size_t len, api_request *r, api_error *e);
void api_request_free(api_request *r);
void api_error_set(api_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* {"error":{"message":..,"type":..,"param":..,"code":..}} (malloc'd) */
char *api_error_json(const api_error *e);

/* ---- responses ----------------------------------------------------------------- */
typedef struct {
    const char *id;                 /* "cmpl-N" / "chatcmpl-N"                  */
    long long   created;
    const char *model_id;
    const char *kernels;
} api_meta;

/* "stop" for end-of-generation, "length" otherwise. */
const char *api_finish_reason(const dspark_stats *st);
/* The complete (non-streamed) response; text is valid UTF-8. */
char *api_response_json(const api_request *r, const api_meta *m, const char *text, size_t n, const dspark_stats *st);
/* One SSE event "data: {...}\n\n" appended to out: a text delta (first =
 * the chat role chunk), the final chunk (finish_reason + dspark stats) or
 * the usage chunk. */
void api_stream_delta(sbuf *out, const api_request *r, const api_meta *m, const char *text, size_t n, int first);
void api_stream_final(sbuf *out, const api_request *r, const api_meta *m, const dspark_stats *st);
void api_stream_usage(sbuf *out, const api_request *r, const api_meta *m, const dspark_stats *st);

#endif
