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
#include "backend.h"
#include "kvpool.h"
#include "layer.h"
#include "rstate.h"
#include "sampler.h"

typedef enum { DS_ARCH_QWEN3 = 0, DS_ARCH_LLAMA = 1, DS_ARCH_QWEN3MOE = 2, DS_ARCH_QWEN35 = 3, DS_ARCH_DEEPSEEK4 = 4 } ds_arch;
/* Qwen3, Qwen3-MoE and Qwen3.5's attention layers: NEOX RoPE (qwen35's
 * IMROPE is NEOX when the position's sections are equal, as for text) and
 * per-head QK-norm; Llama: neither. */
static inline int ds_arch_qk_norm(ds_arch a) { return a != DS_ARCH_LLAMA; }
static inline ds_rope_mode ds_arch_rope(ds_arch a) {
    return a == DS_ARCH_LLAMA || a == DS_ARCH_DEEPSEEK4 ? DS_ROPE_NORMAL : DS_ROPE_NEOX;
}

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
    /* mixture of experts (qwen3moe; 0 for dense models): expert_count,
     * expert_used_count, expert_feed_forward_length */
    int     n_expert, n_expert_used, n_ff_exp;
    int     n_ff_shexp;    /* the shared expert's width (0: none; qwen35moe's FFN) */
    /* qwen35 (hybrid): ssm.conv_kernel, ssm.state_size (the head width of
     * the recurrence), ssm.group_count (its key heads), ssm.time_step_rank
     * (its value heads); rope.dimension_count (n_rot, RoPE'd dims of an
     * attention head); n_rec: the gated delta net layers (0: none) */
    int     ssm_d_conv, ssm_d_state, ssm_n_group, ssm_dt_rank;
    int     n_rot, n_rec;
    /* deepseek4 (layer_ds4.c; 0 otherwise): hyper_connection.count (hc
     * streams of n_embd per row), .sinkhorn_iterations, .epsilon; the
     * low-rank Q (attention.q_lora_rank), the output groups
     * (attention.output_group_count x output_lora_rank), the sliding window
     * (attention.sliding_window), the route's expert_weights_scale / _norm */
    int     hc, hc_iters, q_lora, o_groups, o_lora, n_swa, moe_norm;
    float   hc_eps, moe_scale;
    /* deepseek4 compressed attention: layers with a compress ratio (n_comp),
     * their RoPE base, and kv_row: floats per position per layer of the KV
     * pool (0: n_head_kv x head_dim; layer_ds4.c's widened rows) */
    int     n_comp, kv_row;
    float   comp_rope_base;
    /* rope.scaling on the compressed layers (llama.cpp applies YaRN / linear
     * scaling there only): comp_yarn_on 0 for none */
    int          comp_yarn_on;
    ds_rope_yarn comp_yarn;
    /* rope scaling of the whole RoPE of qwen3 / qwen3moe / qwen35 / llama
     * (rope.scaling.type none / linear / yarn with llama.cpp's defaults, and
     * llama's per-pair frequency factors rope_freqs.weight, copied into
     * rope_ff): rope_scaled 0 for plain RoPE */
    int          rope_scaled;
    ds_rope_yarn rope_yarn;
    float        rope_ff[DS_ROPE_FF_MAX];
    /* of which CSA (ratio 4) layers, and attention.indexer.head_count,
     * .key_length, .top_k */
    int     n_csa, idx_heads, idx_dim, idx_top_k;
} ds_hparams;

/* Floats of one row of the residual stream: n_embd, or hc x n_embd for a
 * model with hyper-connections (deepseek4). */
static inline int ds_hp_stream(const ds_hparams *hp) { return hp->hc > 0 ? hp->hc * hp->n_embd : hp->n_embd; }

/* Floats per position per layer of the KV pool: hp->kv_row, or
 * n_head_kv x head_dim. */
static inline int ds_hp_kv_row(const ds_hparams *hp) { return hp->kv_row > 0 ? hp->kv_row : hp->n_head_kv * hp->head_dim; }

/* The layer shape every forward uses (model.c): the hparams' sizes. */
ds_layer_shape ds_hp_layer_shape(const ds_hparams *hp);
/* Floats of ds_acts.rec for m_max rows of this model (0: not hybrid). */
size_t ds_hp_hybrid_scratch(const ds_hparams *hp, int m_max);
/* The recurrent states of a hybrid model for n_slot sequences whose runs
 * of up to cap rows can be rolled back into (rstate.h); 0 and nothing done
 * for other models. */
int ds_hp_rstate_init(const ds_hparams *hp, ds_rstate *r, ds_backend *be, int n_slot, int cap, int m_max,
                      char *err, size_t errlen);

/* The widest n_in of any of the model's matmul weights (the kernels'
 * scratch reservation). */
int64_t ds_hp_k_max(const ds_hparams *hp);

/* Floats of ds_acts.moe for m_max rows of this model (0: dense). */
size_t ds_hp_moe_scratch(const ds_hparams *hp, int m_max);

typedef struct ds_model {
    gguf_ctx     *gguf;          /* owns the mapping every weight points into */
    ds_hparams    hp;
    ds_tokenizer *tok;           /* NULL when the file has no tokenizer       */
    ds_backend   *be;            /* the device the weights were prepared for  */
    ds_weight     tok_embd;      /* [n_vocab][n_embd]                         */
    ds_weight     output;        /* == tok_embd's memory when tied            */
    int           output_tied;
    const float  *output_norm;   /* device f32 (as every norm pointer)        */
    ds_layer     *layers;
    ds_weight    *experts;       /* MoE: every layer's 3 x n_expert expert views */
    /* deepseek4: the output head's hyper-connection mix (output_hc_fn
     * [hc][hc x n_embd], base [hc], scale [1]) and every layer's o_groups
     * views of attn_output_a (owned) */
    ds_weight     hc_head_fn;
    const float  *hc_head_base, *hc_head_scale;
    ds_weight    *views;
    float        *f32_arena;     /* norm weights converted to f32 (owned)     */
    size_t        f32_n;         /* its length in floats                      */
    float        *f32_dev;       /* its device copy (== f32_arena on the CPU) */
    int           weights_prepared;
    uint64_t      n_params;
    uint32_t      weight_type;   /* type of attn_q of layer 0, for reports    */
} ds_model;

/* Load and validate (architecture, hyper-parameters, every tensor's presence,
 * type and shape), then prepare every weight for the device ("cpu", "cuda":
 * ds_backend_new). NULL with one error line on failure. ds_model_load is
 * ds_model_load_on(path, "cpu"). */
ds_model *ds_model_load(const char *path, char *err, size_t errlen);
ds_model *ds_model_load_on(const char *path, const char *device, char *err, size_t errlen);
void      ds_model_free(ds_model *m);
const char *ds_arch_name(ds_arch a);

#define DS_MAX_TAPS 16

/* The context: KV cache, activations and the execution context on the
 * model's device, the kernel set, taps and the probe. Opaque: use the
 * functions below. */
typedef struct ds_ctx ds_ctx;

/* n_threads >= 1. n_ctx in [1, hp.n_ctx_train] (or any positive value when
 * the file's context_length is 0). */
ds_ctx *ds_ctx_new(const ds_model *m, int n_ctx, int n_threads, char *err, size_t errlen);
void    ds_ctx_free(ds_ctx *c);

/* Register the layers whose residual-stream output is returned as taps
 * (HF convention: id L = output of decoder layer L, 0-based). Ids must be in
 * [0, n_layer) and strictly increasing, at most DS_MAX_TAPS. On error the
 * previous list is kept unchanged. n = 0 clears it. */
int ds_set_taps(ds_ctx *c, const int *layers, int n, char *err, size_t errlen);

/* ---- accessors ------------------------------------------------------- */
const ds_model *ds_ctx_model(const ds_ctx *c);
int  ds_ctx_n_ctx(const ds_ctx *c);          /* KV capacity in positions     */
int  ds_ctx_n_past(const ds_ctx *c);         /* valid rows: [0, n_past)      */
int  ds_ctx_n_taps(const ds_ctx *c);
int  ds_ctx_m_max(const ds_ctx *c);          /* rows per internal chunk      */
/* The context's own device buffer of taps (m_max rows), which a forward on
 * a device backend writes before copying them anywhere: a selecting forward
 * given it as taps_dev copies nothing (it holds the last chunk's taps until
 * the next forward). NULL on host-memory backends. */
float *ds_ctx_taps_dev(ds_ctx *c);
void ds_ctx_set_kernels(ds_ctx *c, const ds_kernel_set *ks);   /* batched path */
void ds_ctx_get_kernels(const ds_ctx *c, ds_kernel_set *ks);
void ds_ctx_set_variant(ds_ctx *c, ds_variant v);   /* every family to v     */
const int *ds_ctx_tap_layers(const ds_ctx *c);       /* ds_ctx_n_taps of them */
ds_exec *ds_ctx_exec(ds_ctx *c);             /* shared with a drafter context */
/* Diagnostics' capture hook (layer.h); NULL clears it. Copied. */
void ds_ctx_set_probe(ds_ctx *c, const ds_probe *p);
/* Host copies of KV rows [pos0, pos0+n) of every layer: k, v each
 * [n_layer][n][n_head_kv*head_dim] floats. */
void ds_ctx_read_kv(ds_ctx *c, int pos0, int n, float *k, float *v);

/* Tensor parallelism (tp.h, docs/TP.md): the context's forwards run on n
 * ranks (n = 1: none, the plain path), before its first forward. Every
 * output is bitwise the n = 1 output while tp_reduce is canonical; state
 * snapshots keep every rank's rows, probes see the full rows (tp.h). On
 * any backend: the ranks share the context's device and execution context
 * (host memory: the `cpu` communicator; a device: `dev`; the environment's
 * DSPARK_TP_COMM=cpu|dev overrides, so CI runs dev on the CPU).
 * 0, or -1 with one line (what does not divide, an unsupported model). */
int ds_ctx_set_tp(ds_ctx *c, int n, char *err, size_t errlen);
int ds_ctx_tp(const ds_ctx *c);              /* ranks: 1 without --tp        */
/* "ranks=<device>:0x<n> comm=<cpu|dev>" (tp.h ds_tp_describe) for -v. */
void ds_ctx_tp_describe(const ds_ctx *c, char *buf, size_t n);
/* --tp: collectives issued so far (tp.h ds_tp_stats); zeros without --tp. */
void ds_ctx_tp_stats(const ds_ctx *c, long *gathers, long *reduces, double *bytes);

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

/* Token selection on the device: the forward of ds_decode (decode = 1,
 * M = 1) or ds_forward_batch (decode = 0), but the logits stay on the
 * device and only the token each selected row chooses comes back:
 *   ids[i] = ds_sample(samp, logits of row i, V, pos0 + i + 1)
 * (row i at position pos0 + i chooses the token for the next position;
 * argmax when samp is NULL or temp 0), computed by the backend's argmax /
 * sample ops (ds_backend_select). rows: DS_LOGITS_ALL -> ids[M],
 * DS_LOGITS_LAST -> ids[0] = the last row's, DS_LOGITS_NONE -> none.
 * taps_dev: NULL, or a buffer of the model's backend (ds_model.be) with
 * room for M rows of n_taps*n_embd floats: the taps stay on the device
 * (ds_dctx_append_dev reads them there). On the CPU every result is
 * bitwise the one ds_forward_batch / ds_decode + ds_sample give. */
typedef struct {
    int               decode;     /* 1: the sequential path (M == 1)        */
    int               rows;       /* DS_LOGITS_NONE / LAST / ALL            */
    const ds_sampler *samp;       /* NULL: greedy                           */
    int32_t          *ids;        /* host                                   */
    float            *taps_dev;   /* device, or NULL                        */
    /* A queued draft (ds_draft_queue): rows 1..M-1's tokens are the M - 1
     * ids at draft_dev (device, the same execution context), copied device
     * to device; only tokens[0] is read from the host. They come back into
     * draft_host (host, M - 1) in the same download as the selections, so a
     * speculative round synchronises once. M must fit one batch (m_max). */
    const int32_t    *draft_dev;
    int32_t          *draft_host;
    /* 1: on a backend with started downloads (backend.h download_start),
     * return once the pass and the ids' download are queued; the ids (and
     * draft_host) are valid after ds_forward_collect, and work queued in
     * between runs while the host waits. One batch (M <= m_max) only; on
     * other backends the ids are there at once and collect does nothing. */
    int               defer;
    /* With draft_dev, optionally: the M rows' positions (rows_dev[0..M),
     * equal to pos0..) and tokens (rows_dev[rows_pitch + 0..M), tokens[0]
     * first) are on the device too (ds_dctx_rows_dev): nothing is uploaded,
     * one device copy brings both. NULL: positions and tokens[0] upload. */
    const int32_t    *rows_dev;
    int               rows_pitch;
} ds_select_opts;
int ds_forward_select(ds_ctx *c, const int32_t *tokens, int M, int pos0, const ds_select_opts *o,
                      char *err, size_t errlen);
/* ds_forward_select with a per-row host logits processor (sampler.h
 * ds_lproc; NULL: ds_forward_select). Every selected row goes through
 * lp->apply before ds_sample, on the host, with extra history
 * extra[0..n_extra + i) for row i of a DS_LOGITS_ALL selection and
 * extra[0..n_extra) for the DS_LOGITS_LAST row: a verify passes the drafts
 * d_1..d_{M-1} and n_extra 0; a replayed decode of d_j passes the drafts and
 * n_extra j; plain decoding and the prefill pass none. Refuses a queued
 * draft and deferred ids (the host needs the drafts first). The forward is
 * ds_forward_select's, so the logits have the same bits. */
int ds_forward_select_lp(ds_ctx *c, const int32_t *tokens, int M, int pos0, const ds_select_opts *o, const ds_lproc *lp,
                         const int32_t *extra, int n_extra, char *err, size_t errlen);
/* Waits for a deferred selection's ids (ds_select_opts.defer) and fills
 * its ids / draft_host. 0 (also when nothing is pending), or -1 with err. */
int ds_forward_collect(ds_ctx *c, char *err, size_t errlen);

/* ---- the forward itself, on caller-owned buffers (model.c; the engine and
 * the single-sequence context both run it) --------------------------------
 * M rows whose positions, ids (at a->pos + a->ids_off) and page tables are on
 * the device (a->rows): embed, every layer (K/V into group 0 of pool), taps
 * of the listed layers into `taps` (rows taps_stride floats apart; NULL: none),
 * the final norm into a->xn. pr: a probe or NULL (row r reported at pos0 + r). */
void ds_model_forward(const ds_model *m, ds_exec *ex, ds_acts *a, ds_kvpool *pool, const uint8_t var[DS_FAM_COUNT],
                      int M, int pos0, const int *tap_layers, int n_taps, float *taps, size_t taps_stride,
                      const ds_probe *pr);
/* The LM head over rows [r0, r0 + rows) of a->xn into out (n_vocab floats a row). */
void ds_model_logits(const ds_model *m, ds_exec *ex, const ds_acts *a, const uint8_t var[DS_FAM_COUNT], int r0,
                     int rows, int pos0, float *out, const ds_probe *pr);

/* ---- state snapshot (for diagnostics: restore the true S0) ------------- */
#define DS_STATE_TP_MAX 8  /* == DS_TP_MAX (comm.h; tp.c checks)                */
typedef struct {
    int        n_past;
    ds_kv_snap snap;     /* rows [0, n_past) of every layer, on the device  */
    ds_rstate_snap rs;   /* hybrid models: a host copy of the recurrent states */
    ds_kv_snap tp[DS_STATE_TP_MAX];   /* --tp N: each rank's pool's rows    */
} ds_state;
int  ds_state_save(ds_ctx *c, ds_state *s);
int  ds_state_restore(ds_ctx *c, const ds_state *s);
void ds_state_free(ds_state *s);

/* A hybrid model's recurrent state of sequence seq (a->rs) rolled back to
 * the one after n positions (layer.h ds_gdn_rewind); 0 for other models. */
int ds_model_rs_rewind(const ds_model *m, ds_exec *ex, ds_acts *a, int seq, int n, char *err, size_t errlen);

/* Layers with K/V rows in the pool: every layer but a hybrid model's
 * recurrent ones. */
int ds_hp_kv_layers(const ds_hparams *hp);

/* Bytes of one KV row (one position, all layers, K and V) — for reports. */
size_t ds_kv_row_bytes(const ds_model *m);

#endif
