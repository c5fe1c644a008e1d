/* model.h — the target model: a Qwen3 / Llama dense transformer read from
 * GGUF, its KV cache, and the two ways to run it:
 *
 *   ds_decode()         one token at one position: the sequential path. It
 *                       always uses the decode kernels (canonical at M=1).
 *   ds_forward_batch()  M tokens at positions pos0..pos0+M-1 in one pass:
 *                       prefill and verification of a draft block. Each
 *                       family's kernel is the context's ds_kernel_set choice.
 *
 * With every family canonical, row t of ds_forward_batch is bitwise equal to
 * ds_decode of the same token at the same position from the same state —
 * logits, every layer's KV rows and taps. That is dspark's exactness contract
 * (tests/test_canonical.c proves it and shows the fast set breaking it). */
#ifndef DSPARK_MODEL_H
#define DSPARK_MODEL_H

#include "common.h"
#include "gguf.h"
#include "tokenizer.h"
#include "kernels/kernels.h"

typedef enum { DS_ARCH_QWEN3 = 0, DS_ARCH_LLAMA = 1 } ds_arch;

typedef struct {
    ds_arch arch;
    int     n_vocab;
    int     n_embd;
    int     n_layer;
    int     n_head;
    int     n_head_kv;
    int     head_dim;      /* attention.key_length (== value_length)       */
    int     n_ff;
    int     n_ctx_train;
    float   rope_base;
    float   norm_eps;
} ds_hparams;

typedef struct {
    const float *attn_norm, *attn_q_norm, *attn_k_norm, *ffn_norm; /* f32 views */
    ds_weight wq, wk, wv, wo, w_gate, w_up, w_down;
} ds_layer;

typedef struct ds_model {
    gguf_ctx     *gguf;          /* owns the mapping every weight points into */
    ds_hparams    hp;
    ds_tokenizer *tok;           /* NULL when the file has no tokenizer       */
    ds_weight     tok_embd;      /* [n_vocab][n_embd]                         */
    ds_weight     output;        /* == tok_embd's memory when tied            */
    int           output_tied;
    const float  *output_norm;
    ds_layer     *layers;
    float        *f32_arena;     /* norm weights converted to f32 (owned)     */
    uint64_t      n_params;
    uint32_t      weight_type;   /* type of attn_q of layer 0, for reports    */
    void         *packed_arena;  /* Q8_0 weights pre-repacked for the VNNI
                                    tile (ds_q8_0_pack), owned; NULL if none  */
    size_t        packed_bytes;  /* its size: the memory packing costs       */
} ds_model;

/* Load and validate (architecture, hyper-parameters, every tensor's presence,
 * type and shape). NULL with one error line on failure. */
ds_model *ds_model_load(const char *path, char *err, size_t errlen);
void      ds_model_free(ds_model *m);
const char *ds_arch_name(ds_arch a);

/* ---- probes: the diagnostics' capture hook ------------------------------
 * When set, the forward pass reports each named checkpoint row by row:
 * pos = absolute position of the row, layer = -1 for non-layer objects.
 * The model only calls it; what to copy is the caller's business. The
 * checkpoint / subobject ids are dsd_checkpoint / dsd_subobject values from
 * include/dspark_diag.h. */
typedef void (*ds_probe_fn)(void *user, int pos, int layer, int checkpoint, int subobject,
                            const float *data, size_t n);

#define DS_MAX_TAPS 16

typedef struct ds_ctx {
    const ds_model *m;
    int        n_ctx;            /* KV cache capacity in positions           */
    int        n_past;           /* valid KV rows: positions [0, n_past)     */
    int        m_max;            /* rows per internal batch chunk            */
    ds_pool   *pool;
    int        own_pool;
    ds_kernel_set ks;            /* batched-path kernel choice per family    */
    float     *k_cache, *v_cache;/* [n_layer][n_ctx][n_head_kv*head_dim]     */
    int        tap_layers[DS_MAX_TAPS];
    int        n_taps;
    /* scratch, sized for m_max rows */
    float *x, *xn, *q, *k, *v, *att, *o, *gate, *up, *h;
    int   *pos;
    ds_probe_fn probe;
    void       *probe_user;
} ds_ctx;

/* n_threads >= 1. n_ctx in [1, hp.n_ctx_train] (or any positive value when
 * the file's context_length is 0). */
ds_ctx *ds_ctx_new(const ds_model *m, int n_ctx, int n_threads, char *err, size_t errlen);
void    ds_ctx_free(ds_ctx *c);

/* Register the layers whose residual-stream output is returned as taps
 * (HF convention: id L = output of decoder layer L, 0-based). Ids must be in
 * [0, n_layer) and strictly increasing, at most DS_MAX_TAPS. On error the
 * previous list is kept unchanged. n = 0 clears it. */
int ds_set_taps(ds_ctx *c, const int *layers, int n, char *err, size_t errlen);

/* Drop KV rows at positions >= n_pos (used to discard rejected draft rows). */
int ds_kv_truncate(ds_ctx *c, int n_pos);

enum { DS_LOGITS_NONE = 0, DS_LOGITS_LAST = 1, DS_LOGITS_ALL = 2 };

/* One token at position pos (pos <= n_past; rows >= pos are overwritten).
 * logits: n_vocab floats or NULL; taps: n_taps*n_embd floats or NULL.
 * Returns 0, or -1 with err. */
int ds_decode(ds_ctx *c, int32_t token, int pos, float *logits, float *taps,
              char *err, size_t errlen);

/* M tokens at positions pos0.. (pos0 <= n_past). logits_mode selects rows:
 * ALL -> M*n_vocab floats, LAST -> n_vocab floats, NONE -> logits unused.
 * taps: M*n_taps*n_embd floats (row-major by token) or NULL. */
int ds_forward_batch(ds_ctx *c, const int32_t *tokens, int M, int pos0, int logits_mode,
                     float *logits, float *taps, char *err, size_t errlen);

/* ---- state snapshot (for diagnostics: restore the true S0) ------------- */
typedef struct {
    int    n_past;
    size_t n_floats;     /* per cache */
    float *k, *v;        /* copies of rows [0, n_past) of every layer       */
} ds_state;
int  ds_state_save(const ds_ctx *c, ds_state *s);
int  ds_state_restore(ds_ctx *c, const ds_state *s);
void ds_state_free(ds_state *s);

/* ---- context accessors (ds_ctx is opaque to everything but model.c) ---- */
void ds_ctx_set_kernels(ds_ctx *c, const ds_kernel_set *ks);   /* batched-path kernels */
void ds_ctx_get_kernels(const ds_ctx *c, ds_kernel_set *ks);
int  ds_ctx_n_ctx(const ds_ctx *c);                            /* KV capacity          */
int  ds_ctx_n_past(const ds_ctx *c);                           /* valid KV rows        */
int  ds_ctx_set_n_past(ds_ctx *c, int n_past);                 /* 0, or -1 out of range */

/* Bytes of one KV row (one position, all layers, K and V) — for reports. */
size_t ds_kv_row_bytes(const ds_model *m);

#endif
