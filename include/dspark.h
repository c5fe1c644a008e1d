/* dspark.h — the public C API of the dspark engine (libdspark).
 *
 * Speculative decoding with DSpark block drafters whose output is
 * byte-identical to plain decoding: with the default (canonical) kernel set
 * and direct commit, dspark_generate emits exactly the same tokens with and
 * without the drafter, greedy or seeded sampling alike.
 *
 * Objects
 *   dspark_model  a target GGUF (and optionally its drafter), loaded once.
 *                 Read-only after loading: any number of contexts on any
 *                 number of threads may use one model at the same time.
 *   dspark_ctx    one sequence's state: KV caches, thread pool, scratch.
 *                 A context is used by one thread at a time (except
 *                 dspark_ctx_cancel, which any thread may call).
 *
 * Errors: functions that can fail return a dspark_status (or a negative
 * count) and, when `err` is not NULL, fill it with the code and one line of
 * text. The library keeps no global mutable state.
 *
 * Every public symbol starts with dspark_ / DSPARK_. See docs/API.md. */
#ifndef DSPARK_H
#define DSPARK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version ------------------------------------------------------------- */

/* "MAJOR.MINOR.PATCH" of the library (the Makefile's VERSION). The shared
 * library's soname is libdspark.so.MAJOR. */
const char *dspark_version(void);

/* ---- errors -------------------------------------------------------------- */

typedef enum {
    DSPARK_OK = 0,
    DSPARK_ERR_INVALID = 1,      /* a bad argument or option value             */
    DSPARK_ERR_LOAD = 2,         /* a file cannot be read or is not a valid model */
    DSPARK_ERR_NOMEM = 3,        /* out of memory                              */
    DSPARK_ERR_CONTEXT = 4,      /* the prompt does not fit the context        */
    DSPARK_ERR_UNSUPPORTED = 5,  /* unknown device, a feature the model lacks  */
    DSPARK_ERR_INTERNAL = 6      /* the engine failed (a bug: please report)   */
} dspark_status;

typedef struct {
    dspark_status code;
    char message[256];           /* one line, no trailing newline             */
} dspark_error;

/* "ok", "invalid", "load", "nomem", "context", "unsupported", "internal". */
const char *dspark_status_name(dspark_status s);

/* ---- models -------------------------------------------------------------- */

typedef struct dspark_model dspark_model;
typedef struct dspark_ctx dspark_ctx;

typedef struct {
    const char *model_path;      /* target GGUF (Qwen3 / Llama), required      */
    const char *drafter_path;    /* DSpark drafter GGUF, or NULL               */
    const char *device;          /* NULL / "cpu" (default), or another device
                                    this build has ("cuda" in CUDA builds)     */
} dspark_model_params;

void dspark_model_params_default(dspark_model_params *p);

/* NULL on failure (err says why: LOAD, UNSUPPORTED, INVALID, NOMEM). */
dspark_model *dspark_model_load(const dspark_model_params *p, dspark_error *err);
void          dspark_model_free(dspark_model *m);

const char *dspark_model_name(const dspark_model *m);          /* general.name or the file name */
int         dspark_model_n_vocab(const dspark_model *m);
int         dspark_model_n_ctx_train(const dspark_model *m);   /* 0 when the file does not say  */
int         dspark_model_has_drafter(const dspark_model *m);
int         dspark_model_draft_block(const dspark_model *m);   /* drafter block size gamma, 0 if none */
/* Rows per forward the model's device runs a prompt in (64 on the CPU, 512
 * on CUDA): the chunk a prefill takes by default; never changes a bit. */
int         dspark_model_chunk_rows(const dspark_model *m);
/* tokenizer.chat_template of the target GGUF, or NULL. */
const char *dspark_model_chat_template(const dspark_model *m);
int32_t     dspark_model_eos(const dspark_model *m);           /* -1 if none */
int         dspark_model_is_eog(const dspark_model *m, int32_t token);

/* ---- tokens -------------------------------------------------------------- */

/* Text -> token ids. add_bos: 1 / 0, or -1 for what `dspark generate` does
 * (BOS for SentencePiece vocabularies that have one). parse_special: 1 turns
 * control tokens written literally ("<|endoftext|>") into their ids.
 * Returns the token count, which may exceed cap (then only cap ids were
 * written: call again with a larger buffer), or -1 with err. */
int dspark_tokenize(const dspark_model *m, const char *text, size_t len, int add_bos, int parse_special,
                    int32_t *out, int cap, dspark_error *err);

/* The bytes of one token (control tokens: none). Returns the byte count,
 * which may exceed cap (then only cap bytes were written), or -1 for an id
 * outside the vocabulary. */
int dspark_token_to_bytes(const dspark_model *m, int32_t token, char *buf, size_t cap);

/* Token ids -> text: the concatenated bytes, NUL-terminated when cap > the
 * length. Returns the length (may be >= cap: then call again with more), or
 * -1 with err for an id outside the vocabulary. */
long dspark_detokenize(const dspark_model *m, const int32_t *tokens, int n, char *buf, size_t cap,
                       dspark_error *err);

/* ---- contexts ------------------------------------------------------------ */

typedef struct {
    int n_ctx;                   /* KV capacity in tokens; 0 = min(2048, the model's) */
    int n_threads;               /* threads of this context's pool; 0 = 2. Output bits
                                    never depend on it.                        */
    const char *kernels;         /* NULL / "canonical" (default) or "fast"     */
    const char *fast;            /* NULL or "family,..." run fast on top       */
    const char *canonical;       /* NULL or "family,..." run canonical on top  */
} dspark_ctx_params;

void dspark_ctx_params_default(dspark_ctx_params *p);

/* A context owns its KV caches and thread pool; the model must outlive it.
 * NULL on failure (INVALID for a bad n_ctx / threads / kernel name). */
dspark_ctx *dspark_ctx_new(const dspark_model *m, const dspark_ctx_params *p, dspark_error *err);
void        dspark_ctx_free(dspark_ctx *c);
int         dspark_ctx_n_ctx(const dspark_ctx *c);
/* The kernel set as text: "canonical", "fast", or "canonical fast=a,b". */
const char *dspark_ctx_kernels(const dspark_ctx *c);

/* Thread-safe. Stops the generation running on c after its current token
 * (or between the prefill's chunks); when none is running it does nothing:
 * a cancel never reaches a later generation. */
void dspark_ctx_cancel(dspark_ctx *c);
/* Thread-safe. Cancels the generation named id (dspark_gen_params.id) on c:
 * the running one if it has that id, else the one that starts with it next
 * (the context remembers one such pending id; a later call replaces it). */
void dspark_ctx_cancel_id(dspark_ctx *c, uint64_t id);

/* ---- generation ---------------------------------------------------------- */

typedef enum { DSPARK_SCHED_NONE = 0, DSPARK_SCHED_PMIN = 1, DSPARK_SCHED_TABLE = 2, DSPARK_SCHED_AUTO = 3 } dspark_sched;
typedef enum { DSPARK_COMMIT_DIRECT = 0, DSPARK_COMMIT_REPLAY = 1 } dspark_commit;

/* Called once per generated token, in order, as soon as it is chosen.
 * bytes/n: the token's text (may be 0 bytes; may end inside a multi-byte
 * UTF-8 character that the next token completes). Return 0 to continue,
 * DSPARK_STOP to end the generation after this token because a stop
 * condition of the caller's was met (stop "stop": a stop string), any other
 * nonzero value to stop it after this token (stop "cancel"). Either way the
 * context's state is what plain decoding leaves at that token, with and
 * without the drafter. */
typedef int (*dspark_token_fn)(void *user, int32_t token, const char *bytes, size_t n);
#define DSPARK_STOP 2

/* ---- grammars ------------------------------------------------------------ */

/* A grammar (GBNF, llama.cpp's notation: `root ::= ...`, literals, classes,
 * groups, * + ? {m,n}) compiled for a model's vocabulary; generation then
 * only emits text the grammar allows, and an end-of-generation token only
 * where the grammar can end. Read-only: share it between contexts and
 * threads; it must outlive the generations that use it, and its model must
 * outlive it. NULL with err (INVALID: where and what is wrong). */
typedef struct dspark_grammar dspark_grammar;
dspark_grammar *dspark_grammar_new(const dspark_model *m, const char *text, size_t len, dspark_error *err);
void            dspark_grammar_free(dspark_grammar *g);
/* The GBNF text of a JSON object (OpenAI's response_format json_object). */
const char     *dspark_grammar_json_object(void);

/* One generated token with what was captured for it (dspark_gen_params
 * on_token_ex). */
typedef struct {
    int32_t        id;
    const char    *bytes;            /* as dspark_token_fn's bytes / n         */
    size_t         n;
    int64_t        pos;              /* its absolute position                  */
    /* with logprobs > 0: the natural-log probability of id under the model's
     * distribution (log-softmax of the raw logits: before penalties, bias,
     * grammar, temperature and truncation), and the top_logprobs most
     * probable tokens (most probable first, ties: lower id); logprob is NAN
     * and n_top 0 otherwise */
    float          logprob;
    int            n_top;
    const int32_t *top_id;
    const float   *top_logprob;
} dspark_token;
typedef int (*dspark_token_ex_fn)(void *user, const dspark_token *t);

typedef struct {
    int32_t token;
    float   bias;                    /* added to the token's logit: [-100, 100], or -INFINITY (never) */
} dspark_logit_bias;

typedef struct {
    int      max_tokens;         /* >= 1 (default 128)                         */
    int      stop_at_eog;        /* stop at end-of-generation tokens (default 1) */
    /* sampling: temperature 0 = greedy. Else Gumbel-max with Philox noise
     * keyed on (seed, position, token id): a pure function of the logits,
     * so speculative and plain decoding draw the same tokens. */
    float    temperature;        /* >= 0 (default 0)                           */
    int      top_k;              /* 0 = off                                    */
    float    top_p;              /* (0, 1]; 1 = off                            */
    float    min_p;              /* [0, 1]; 0 = off                            */
    uint64_t seed;
    /* speculative decoding (used when the model has a drafter) */
    int      speculative;        /* 1 (default): use the drafter; 0: plain decoding */
    int      draft_max;          /* drafts per round, 1..gamma; 0 = gamma      */
    float    draft_p_min;        /* PMIN threshold in [0, 1]                   */
    dspark_sched  sched;         /* PMIN / TABLE need a confidence head        */
    dspark_commit commit;        /* DIRECT (default) or REPLAY                 */
    /* streaming */
    dspark_token_fn on_token;    /* may be NULL                                */
    void    *user;
    /* logits processing (speculative == plain holds with each: a verify row
     * is processed exactly as the decode row of its position) */
    float    presence_penalty;   /* [-2, 2], OpenAI's: logit -= count * frequency */
    float    frequency_penalty;  /*   + (count > 0) * presence, count = times the token was generated */
    const dspark_logit_bias *logit_bias;     /* n_logit_bias entries, or NULL */
    int      n_logit_bias;
    const dspark_grammar *grammar;           /* NULL: no constraint           */
    int      logprobs;           /* 1: capture each token's logprob             */
    int      top_logprobs;       /* 0..20 most probable tokens with theirs      */
    dspark_token_ex_fn on_token_ex;          /* used instead of on_token when set */
    /* the generation's name for dspark_ctx_cancel_id: 0 = the context names
     * it (ids with the top bit set); caller ids must be below 2^63 */
    uint64_t id;
} dspark_gen_params;

void dspark_gen_params_default(dspark_gen_params *p);

#define DSPARK_MAX_DRAFT 64

typedef struct {
    int    n_prompt;             /* prompt tokens                              */
    int    n_generated;          /* tokens generated                           */
    const char *stop;            /* "length", "eog", "context", "cancel", or
                                    "stop" (the callback returned DSPARK_STOP) */
    double t_prefill_s;          /* prompt processing (+ first token)          */
    double t_total_s;            /* whole generation                           */
    double prefill_tok_s;        /* n_prompt / t_prefill_s                     */
    double tok_s;                /* (n_generated - 1) / (t_total_s - t_prefill_s) */
    /* speculative decoding (zero for plain decoding) */
    int    speculative;          /* 1 when the drafter ran                     */
    int    draft_max;            /* drafts per round                           */
    int    rounds;               /* verify passes                              */
    long   drafted;              /* draft tokens sent to verification          */
    long   accepted;             /* draft tokens accepted                      */
    double mean_accepted_len;    /* (accepted + rounds) / rounds, bonus included */
    long   accept_hist[DSPARK_MAX_DRAFT];   /* [k-1]: rounds that accepted slot k */
    double t_draft_s, t_verify_s, t_commit_s;
    /* the engine's scheduler: prompt tokens reused from the prefix cache
     * (0 from dspark_generate) */
    int    n_cached;
} dspark_stats;

/* Generate from prompt[0..n_prompt) on an emptied context. out (may be
 * NULL) receives the generated ids and must hold p->max_tokens; st (may be
 * NULL) the statistics. Returns DSPARK_OK (also when cancelled: see
 * st->stop), or an error: INVALID (bad params), CONTEXT (the prompt leaves
 * no room for one new token), UNSUPPORTED (speculative settings the
 * drafter cannot honour), NOMEM, INTERNAL. A context used by another
 * thread's dspark_generate at the same time is refused (INVALID) and the
 * running generation is not disturbed. */
dspark_status dspark_generate(dspark_ctx *c, const int32_t *prompt, int n_prompt, const dspark_gen_params *p,
                              int32_t *out, dspark_stats *st, dspark_error *err);

/* ---- many sequences: the batch engine -----------------------------------
 * An engine runs many sequences on one model (docs/ENGINE.md): their KV
 * rows live in one pool of 16-position pages, and one decode call runs rows
 * of any of them — prompts, single tokens, in any mix — each row bit for bit
 * what its sequence alone would get (canonical kernels: a row's arithmetic
 * never depends on the rows beside it). In the style of llama.h's
 * llama_batch / llama_decode / llama_memory_*: sequences are small integer
 * ids; a batch lists (token, position, sequence, what to return) per row;
 * a sequence's rows in one batch are contiguous and at consecutive
 * positions, the first at or below what the sequence holds.
 *
 * On top, a scheduler: submit requests (a prompt and dspark_gen_params,
 * plain decoding), call dspark_engine_step from one thread, and each
 * request streams its tokens through its on_token callback — continuous
 * batching with chunked prompts, an exact prefix cache and preemption; a
 * request's tokens never depend on what ran beside it.
 *
 * An engine is used by one thread at a time, except dspark_engine_submit
 * and dspark_engine_cancel, which any thread may call. */
typedef struct dspark_engine dspark_engine;

typedef struct {
    int n_seq_max;               /* sequences at once (default 8)              */
    int n_ctx;                   /* positions per sequence; 0 = min(2048, the model's) */
    int n_pages;                 /* KV pool pages of 16 positions; 0 = enough for
                                    n_seq_max full sequences                   */
    int batch_rows;              /* rows per internal forward pass; 0 = the device's (64 CPU, 512 CUDA) */
    int step_rows;               /* scheduler: rows per step (token budget); 0 = 512 */
    int prefill_chunk;           /* scheduler: prompt rows one request adds per step
                                    (a cancel reaches it between chunks); 0 = step_rows */
    int prefix_cache;            /* scheduler: 1 (default) reuses cached prompt pages */
    int n_threads;               /* 0 = 2                                      */
    const char *kernels;         /* NULL / "canonical" (default) or "fast"      */
    const char *fast;            /* NULL or "family,..." run fast on top        */
    const char *canonical;       /* NULL or "family,..." run canonical on top   */
    int no_drafter;              /* 1: leave the model's drafter out (no speculative
                                    requests; no drafter rows in the pages)     */
} dspark_engine_params;

void dspark_engine_params_default(dspark_engine_params *p);
dspark_engine *dspark_engine_new(const dspark_model *m, const dspark_engine_params *p, dspark_error *err);
void dspark_engine_free(dspark_engine *e);
int         dspark_engine_n_ctx(const dspark_engine *e);         /* positions per sequence */
int         dspark_engine_n_seq_max(const dspark_engine *e);
/* A server's default n_seq_max for sequences of n_ctx positions (0: the
 * engine's default n_ctx): as many full sequences as half of the memory the
 * model's device still has holds in KV pages, 1..64 (8 when the device
 * cannot say). */
int         dspark_engine_default_seqs(const dspark_model *m, int n_ctx);
/* The kernel set as text, as dspark_ctx_kernels. */
const char *dspark_engine_kernels(const dspark_engine *e);

/* Sequences: new / fork return the id (>= 0) or -1 (err: every slot in use,
 * no pages). fork shares the first n_pos positions (copy-on-write). */
int  dspark_seq_new(dspark_engine *e, dspark_error *err);
int  dspark_seq_fork(dspark_engine *e, int seq, int n_pos, dspark_error *err);
dspark_status dspark_seq_truncate(dspark_engine *e, int seq, int n_pos, dspark_error *err);
void dspark_seq_free(dspark_engine *e, int seq);
int  dspark_seq_n_pos(const dspark_engine *e, int seq);          /* -1: no such sequence */
/* The exact prefix cache, for an empty sequence: reuses the cached pages of
 * the longest full-page prefix of tokens (never the last token: its logits
 * are always computed). Returns the positions reused: decode from there. */
int  dspark_seq_reuse_prefix(dspark_engine *e, int seq, const int32_t *tokens, int n);
/* A sequence's state (ids and every layer's K/V) to a file, and back into a
 * new sequence (its id, or -1: another model's file, a damaged one). */
dspark_status dspark_seq_save(dspark_engine *e, int seq, const char *path, dspark_error *err);
int  dspark_seq_load(dspark_engine *e, const char *path, dspark_error *err);

typedef struct {
    float    temperature;        /* 0 = greedy                                 */
    int      top_k;
    float    top_p;              /* 1 = off                                    */
    float    min_p;
    uint64_t seed;
} dspark_sampling;

enum { DSPARK_OUT_NONE = 0, DSPARK_OUT_LOGITS = 1, DSPARK_OUT_TOKEN = 2 };
typedef struct {
    int n_tokens;
    const int32_t *token, *pos, *seq;
    const int8_t  *output;       /* per row DSPARK_OUT_* bits; NULL: the last row's logits */
    const dspark_sampling *const *sampling;  /* per row for OUT_TOKEN (NULL entries
                                                or NULL: greedy)               */
} dspark_batch;

/* Runs the batch. Nothing runs when a row breaks a rule (INVALID), or when
 * the pool has no pages for it (NOMEM: free or truncate sequences). */
dspark_status dspark_decode(dspark_engine *e, const dspark_batch *b, dspark_error *err);
/* Row i of the last batch: its logits (n_vocab floats, valid until the next
 * decode; NULL when it asked for none) / the token its sampler chose (-1). */
const float *dspark_get_logits(const dspark_engine *e, int i);
int32_t      dspark_get_token(const dspark_engine *e, int i);

/* The scheduler. submit: a request id (> 0) or -1; the request runs in
 * dspark_engine_step calls, streams through p->on_token / on_token_ex
 * (DSPARK_STOP: stop "stop") and ends with on_done. Everything
 * dspark_generate runs on a context runs here too, with the same tokens and
 * logprob bits: the sampler, penalties, logit_bias, a grammar, logprobs /
 * top_logprobs (a request with any of these is chosen on the host from its
 * row's logits). With a drafter (the model's, unless no_drafter) a request
 * with p->speculative and none of those processors runs speculative rounds
 * (draft_max drafts a round, 0: the block; the number verified each step is
 * measured, scheduler.h DS_SPEC_AUTO) whose verify blocks share each step's
 * forward with every other request's rows; its tokens are plain decoding's
 * either way. cancel: it ends at the next step, queued or running. step: 1
 * when it ran a batch, 0 when idle, -1 on an engine error (err). Callbacks
 * run on the thread that steps, with p->user. */
typedef void (*dspark_done_fn)(void *user, const char *stop, int n_generated);
long dspark_engine_submit(dspark_engine *e, const int32_t *prompt, int n_prompt, const dspark_gen_params *p,
                          dspark_done_fn on_done, dspark_error *err);
/* submit with the whole outcome: on_start when the request is admitted
 * (its prompt starts; never for one cancelled while queued), on_done once
 * with DSPARK_OK and the statistics (stop as dspark_generate's; t_prefill_s
 * and t_total_s count from admission, n_cached the prompt tokens the prefix
 * cache gave), or an error (a processor's, e.g. a grammar that allows no
 * token: INVALID; the engine's: INTERNAL). Either may be NULL. */
typedef struct {
    void (*on_start)(void *user);
    void (*on_done)(void *user, dspark_status rc, const dspark_error *err, const dspark_stats *st);
} dspark_engine_callbacks;
long dspark_engine_submit_ex(dspark_engine *e, const int32_t *prompt, int n_prompt, const dspark_gen_params *p,
                             const dspark_engine_callbacks *cb, dspark_error *err);
int  dspark_engine_cancel(dspark_engine *e, long request);
int  dspark_engine_step(dspark_engine *e, dspark_error *err);

typedef struct {
    int  waiting, running, last_batch, pages_free, pages_total;
    long steps, rows, requests_done, preemptions, prompt_tokens, cached_tokens;
    long spec_rounds, drafted, accepted;  /* speculative rounds; drafts verified / accepted */
} dspark_engine_stats;
void dspark_engine_get_stats(dspark_engine *e, dspark_engine_stats *st);

#ifdef __cplusplus
}
#endif

#endif
