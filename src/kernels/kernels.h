/* kernels.h — dspark's operator families and their three arithmetic variants.
 *
 * Every operator family has:
 *   decode     the kernel sequential decode (one row) uses;
 *   canonical  the batched kernel whose per-row arithmetic is bit-for-bit the
 *              decode kernel's — decode IS its M=1 case (same function);
 *   fast       the batched kernel a performance engineer would write, with its
 *              own reduction order; its bits differ from decode.
 * A ds_kernel_set picks canonical or fast per family for batched calls. The
 * decode path always calls the canonical function with M=1.
 *
 * All activations are f32, row-major, rows contiguous. Weights are ggml
 * layout: n_out rows of n_in elements (ne[0]=n_in, ne[1]=n_out). */
#ifndef DSPARK_KERNELS_H
#define DSPARK_KERNELS_H

#include "common.h"
#include "threadpool.h"

/* ---- families and the registry ---------------------------------------- */
typedef enum {
    DS_FAM_MATMUL_F32 = 0,
    DS_FAM_MATMUL_F16,
    DS_FAM_MATMUL_BF16,
    DS_FAM_MATMUL_Q8_0,
    DS_FAM_MATMUL_Q4_0,     /* the kquant families (matmul_kq.c): ggml's   */
    DS_FAM_MATMUL_Q4_1,     /* legacy and K block types                    */
    DS_FAM_MATMUL_Q5_0,
    DS_FAM_MATMUL_Q5_1,
    DS_FAM_MATMUL_Q4_K,
    DS_FAM_MATMUL_Q5_K,
    DS_FAM_MATMUL_Q6_K,
    DS_FAM_ATTENTION,
    DS_FAM_RMSNORM,
    DS_FAM_ROPE,
    DS_FAM_SWIGLU,
    DS_FAM_RESIDUAL,
    DS_FAM_MOE_ROUTE,       /* mixture-of-experts routing (moe_route.c)    */
    DS_FAM_GDN,             /* qwen35's gated delta net recurrence (gdn.c) */
    DS_FAM_ATTN_SINKS,      /* deepseek4's attention with sink logits (attn_sinks.c) */
    DS_FAM_HC_PRE,          /* deepseek4's hyper-connection mixing (hc_pre.c)        */
    DS_FAM_HC_POST,         /* deepseek4's hyper-connection update (hc_post.c)       */
    DS_FAM_DS4_COMPRESS,    /* deepseek4's compressor pooling (ds4_compress.c)       */
    DS_FAM_DS4_INDEXER,     /* deepseek4's lightning indexer (ds4_indexer.c)         */
    DS_FAM_TP_REDUCE,       /* tensor parallelism's layout across ranks (tp.c): the
                               fast one sums partial dot products across ranks     */
    DS_FAM_COUNT
} ds_family;

typedef enum { DS_CANONICAL = 0, DS_FAST = 1 } ds_variant;

typedef struct { uint8_t v[DS_FAM_COUNT]; } ds_kernel_set;

/* "matmul_f32", "matmul_f16", "matmul_bf16", "matmul_q8_0", "matmul_q4_0",
 * ..., "matmul_q6_k", "attention", "rmsnorm", "rope", "swiglu", "residual",
 * "moe_route", "gdn", "attn_sinks", "hc_pre", "hc_post", "ds4_compress", "ds4_indexer",
 * "tp_reduce" —
 * the one name used in CLI, code and reports. */
const char *ds_family_name(int fam);
int  ds_family_from_name(const char *name);          /* -1 if unknown */
/* One line on what differs between the family's fast and canonical kernels. */
const char *ds_family_describe(int fam);
void ds_kernel_set_all(ds_kernel_set *ks, ds_variant v);
/* kernels: NULL or "canonical" or "fast" (the base); fast_list / canon_list:
 * NULL or comma-separated family names applied on top, in that order.
 * Returns 0, or -1 with one error line naming the bad value. */
int  ds_kernel_set_parse(ds_kernel_set *ks, const char *kernels, const char *fast_list,
                         const char *canon_list, char *err, size_t errlen);
/* "canonical", "fast", or "canonical fast=a,b" — for logs and reports. */
void ds_kernel_set_str(const ds_kernel_set *ks, char *buf, size_t n);
int  ds_matmul_family(uint32_t weight_type);          /* DS_FAM_MATMUL_* */
/* The weight type a matmul family multiplies; -1 for non-matmul families. */
int  ds_family_weight_type(int fam);

/* Which SIMD path the process picked at run time: "avx512", "avx2", "neon"
 * or "portable". Canonical and decode always share the path, so the
 * canonical property holds on each. */
const char *ds_simd_path(void);

/* ---- weights ------------------------------------------------------------ */
typedef struct {
    uint32_t    type;      /* ds_type                                    */
    int64_t     n_in;      /* K: elements per row (multiple of 32 for Q8_0) */
    int64_t     n_out;     /* N: rows                                    */
    const void *data;      /* n_out rows, each ds_row_bytes(type, n_in)  */
    /* Backend-private, made once at load by the backend's prepare_weight
     * (backend.h), NULL when none: on the CPU, weights pre-packed by
     * ds_weight_pack into the tile layout of the SIMD level (64-byte
     * aligned; the canonical kernels read it instead of repacking per call,
     * with bit-identical results, matmul_q8_0.c); on CUDA, the device copy.
     * data stays required on the host (embedding rows, other levels). */
    const void *extra;
} ds_weight;

/* Pre-packed weights: a CPU-private copy of a matmul weight in the layout the
 * canonical tile of the run-time SIMD level reads (matmul_q8_0.c: Q8_0 in
 * 16-row AVX512-VNNI tiles or 8-row AVX2 / NEON tiles), made once at load by
 * the CPU backend's prepare_weight and kept in W->extra; the kernels read it
 * instead of repacking per call, with bit-identical results.
 * ds_weight_pack_bytes: the bytes ds_weight_pack writes for W, or 0 when
 * packing is not used (type, shape or level without a packed layout) — then
 * leave W->extra NULL. ds_weight_pack: writes it into dst (64-byte aligned,
 * ds_weight_pack_bytes(W) bytes); returns 0, or -1 if packing is not used.
 * ds_weight_is_packed: W->extra is such a copy. */
size_t ds_weight_pack_bytes(const ds_weight *W);
int    ds_weight_pack(const ds_weight *W, void *dst);
int    ds_weight_is_packed(const ds_weight *W);
/* Row `row` of a packed weight converted to f32 from the packed copy alone:
 * bit for bit ds_row_to_f32 of the original row, so the original may be
 * paged out once packed (a tied head's embedding lookup reads this). */
void   ds_weight_packed_row(const ds_weight *W, int64_t row, float *out);

/* Dequantize/convert one row of n elements of any supported type to f32. */
void ds_row_to_f32(uint32_t type, const void *row, int64_t n, float *out);
/* Quantize n f32 values (n % 32 == 0) to Q8_0 blocks (ggml's rounding). */
void ds_quantize_row_q8_0(const float *x, int64_t n, ds_block_q8_0 *out);
/* ggml's dequantization of one row of the kquant types (kquant.c); n is a
 * multiple of the type's block. ds_row_to_f32 calls it. */
void ds_kq_row_to_f32(uint32_t type, const void *row, int64_t n, float *out);
/* Quantize rows of n_per_row f32 values to a kquant type (kquant.c: ggml's
 * reference rounding for Q4_0..Q5_1, a least-squares search for the K
 * types' scales and mins). n_per_row must be a multiple of the block. */
void ds_kq_quantize(uint32_t type, const float *x, int64_t nrows, int64_t n_per_row, void *out);
/* Convert a whole f32 matrix to the given type (make-model, convert). */
void ds_f32_to_type(uint32_t type, const float *x, int64_t n, void *out);

/* ---- matmul: y[m][n] = sum_k W[n][k] * x[m][k], m < M ------------------- */
void ds_matmul(ds_variant v, const ds_weight *W, int M, const float *x, float *y, ds_pool *pool);
/* y[i] = W[i] x for n weights of one type and n_in on the same activations
 * (q/k/v, gate/up): one activation quantization and one pool hand-off for
 * all of them; bit for bit the n separate ds_matmul calls. */
void ds_matmul_multi(ds_variant v, int n, const ds_weight *const W[], int M, const float *x,
                     float *const y[], ds_pool *pool);
/* ds_matmul, and after the thread that computed columns [n0, n1) of y (all
 * M rows) has written them, epi(arg, n0, n1, chunk) on that same thread:
 * the columns' consumer runs while they are hot and in parallel, without a
 * second hand-off. Each column is in exactly one call; the ranges of one
 * call are ordered by chunk (chunk t's columns precede chunk t + 1's), and
 * chunk < the pool's thread count (0 when run inline). y is the same bits as
 * ds_matmul's. Small weights are split over the threads too (the epilogue
 * is work). */
typedef void (*ds_mm_epi_fn)(void *arg, int64_t n0, int64_t n1, int chunk);
void ds_matmul_epi(ds_variant v, const ds_weight *W, int M, const float *x, float *y, ds_pool *pool,
                   ds_mm_epi_fn epi, void *arg);
/* The decode kernel: exactly ds_matmul(DS_CANONICAL, W, 1, ...). */
void ds_matmul_decode(const ds_weight *W, const float *x, float *y, ds_pool *pool);

/* ---- attention ------------------------------------------------------------
 * Query rows m = 0..M-1 at absolute positions pos0+m. The KV cache for this
 * layer holds f32 rows [position][n_kv_head][head_dim] with stride kv_stride
 * floats per position, and ALREADY contains the new rows (write K/V first).
 * causal=1: row m attends to positions [0, pos0+m]; causal=0: every row
 * attends to positions [0, n_kv) (the drafter's non-causal block).
 * GQA: query head h uses kv head h / (n_head / n_kv_head).
 * canonical/decode: split-KV over chunks of DS_ATTN_CHUNK positions at
 * absolute boundaries (0, S, 2S, ...), online softmax per chunk, chunks
 * combined left to right — a row's result depends only on its own prefix.
 * q: [M][n_head][head_dim]; out: [M][n_head][head_dim]. */
#define DS_ATTN_CHUNK 64
/* deepseek4's compressed keys (attn_sinks only; docs/DS4-COMPRESSED.md):
 * besides its window a row attends the compressed rows of the blocks
 * b < n_vis / ratio, block b's row stored at position b * ratio + ratio - 1,
 * `off` floats into that position's K row (K = V). */
typedef struct {
    int ratio, off;
    /* CSA: row m attends only blocks sel[m * sel_stride + i], i < n_sel[m]
     * (ascending); NULL: every visible block (HCA) */
    const int32_t *sel, *n_sel;
    int sel_stride;
} ds_attn_extra;
typedef struct {
    int   n_head, n_kv_head, head_dim;
    int   kv_stride;       /* floats between consecutive positions         */
    float scale;           /* usually 1/sqrt(head_dim)                     */
} ds_attn_shape;
void ds_attention(ds_variant v, const ds_attn_shape *s, int M, int pos0, int causal, int n_kv,
                  const float *q, const float *kcache, const float *vcache, float *out,
                  ds_pool *pool);
/* The same over rows of several sequences whose KV rows live in pages
 * (kvpool.h): row m attends positions [0, n_vis[m]) of sequence seq[m],
 * position j at row j % page of page tables[seq[m] * max_pages + j / page],
 * a page's rows page_stride floats after the previous page's (kcache,
 * vcache: page 0 of this layer). tables NULL: one contiguous cache (position
 * j at row j, seq unused). page is a multiple of 16. A row's result is the
 * contiguous call's bits for the same rows: the arithmetic walks positions
 * in the same 64-position chunks; only the addresses change. */
typedef struct ds_attn_rows {
    const int32_t *n_vis;      /* [M] (NULL: pos[m] + 1)                */
    const int32_t *pos;        /* [M] (read only when n_vis is NULL)    */
    const int32_t *seq;        /* [M] (NULL: every row sequence 0)      */
    const int32_t *tables;     /* [n_seq][max_pages] or NULL            */
    int     max_pages, page;
    int64_t page_stride;       /* floats                               */
} ds_attn_rows;
void ds_attention_rows(ds_variant v, const ds_attn_shape *s, int M, const ds_attn_rows *r,
                       const float *q, const float *kcache, const float *vcache, float *out,
                       ds_pool *pool);

/* ---- RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, per row of n ------------
 * Used for layer norms (rows = tokens) and QK-norm (rows = tokens x heads). */
void ds_rmsnorm(ds_variant v, int rows, int n, const float *x, const float *w, float eps,
                float *y, ds_pool *pool);

/* ---- RoPE, in place on x[rows][n_heads][head_dim]; row r at position pos[r].
 * NEOX (Qwen3): pairs (i, i + head_dim/2); NORMAL (Llama, ggml): (2i, 2i+1).
 * theta_i = pos * freq_base^(-2i/head_dim). */
typedef enum { DS_ROPE_NORMAL = 0, DS_ROPE_NEOX = 2 } ds_rope_mode;
void ds_rope(ds_variant v, int rows, int n_heads, int head_dim, const int *pos,
             float freq_base, ds_rope_mode mode, float *x, ds_pool *pool);
/* YaRN and linear rope scaling (rope.scaling.type; llama.cpp's rope_yarn,
 * which deepseek4 applies on its compressed layers): pair i's angle mixes
 * theta_interp = freq_scale * theta and theta itself, by ramp_i * ext_factor
 * with ramp_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1) (ext_factor
 * 0: linear scaling, theta_interp alone); cos and sin are then multiplied by
 * mscale. freq_scale 1, ext_factor 0, mscale 1 and no freq_factors is
 * ds_rope's exact bits. The qwen3 / llama / qwen3moe / qwen35 layers take it
 * for their whole RoPE (rope.scaling.*, rope_freqs.weight), deepseek4 on its
 * compressed layers. */
#define DS_ROPE_FF_MAX 256   /* frequency factors a model may carry (head_dim <= 512) */
typedef struct ds_rope_yarn {
    float freq_scale, ext_factor, lo, hi, mscale;
    /* per-pair frequency divisors (rope_freqs.weight, Llama 3.1's llama3
     * factors; llama.cpp's ggml_rope_ext freq_factors): pair i's angle is
     * ((float)pos * inv_freq_i) / freq_factors[i] before the scaling above;
     * NULL for none. head_dim/2 finite values > 0, owned by the caller. */
    const float *freq_factors;
} ds_rope_yarn;
/* The ramp's ends for n_dims rotated dims (ggml_rope_yarn_corr_dims: the
 * pair indices whose wavelength crosses n_ctx_orig / beta), with the
 * project's log (kernels/dsmath.h), not the C library's. */
void ds_rope_yarn_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float dims[2]);
void ds_rope_ext(ds_variant v, int rows, int n_heads, int head_dim, const int *pos, float freq_base,
                 ds_rope_mode mode, const ds_rope_yarn *yarn, float *x, ds_pool *pool);
/* Canonical RoPE with the per-position cos/sin cached: tab holds n_pos rows
 * of head_dim/2 cos then head_dim/2 sin, done[p] != 0 once row p is filled
 * (by the same expressions decode evaluates, on first use of position p;
 * rows of one call must have distinct positions). Same bits as
 * ds_rope(DS_CANONICAL, ...); positions outside [0, n_pos) are computed. */
void ds_rope_cached(int rows, int n_heads, int head_dim, const int *pos, float freq_base,
                    ds_rope_mode mode, float *x, float *tab, unsigned char *done, int64_t n_pos,
                    ds_pool *pool);
/* The same with rope scaling (yarn may be NULL): same bits as
 * ds_rope_ext(DS_CANONICAL, ...); a table is valid for one (freq_base,
 * head_dim, scaling) only. */
void ds_rope_cached_ext(int rows, int n_heads, int head_dim, const int *pos, float freq_base,
                        ds_rope_mode mode, const ds_rope_yarn *yarn, float *x, float *tab, unsigned char *done,
                        int64_t n_pos, ds_pool *pool);

/* ---- SwiGLU: out = silu(gate) * up, elementwise over rows x n ------------ */
/* deepseek4's SwiGLU clamp (llama.cpp's ggml_swiglu_clamp), before the
 * SwiGLU: gate[i] = min(gate[i], limit), up[i] = clamp(up[i], -limit,
 * limit), in place over n floats. Exact (a comparison picks an operand,
 * nothing is rounded), so no variants; a NaN passes through. */
void ds_swiglu_limit(int64_t n, float limit, float *gate, float *up);
void ds_swiglu(ds_variant v, int rows, int n, const float *gate, const float *up, float *out,
               ds_pool *pool);

/* ---- MoE router (moe_route.c): per row, softmax over n_expert router
 * logits, the k largest probabilities (ties to the lower expert, NaN last)
 * and their weights, renormalised to sum 1 when norm. ids / weights: rows x k.
 * scratch: n_expert floats. Decode is canonical at rows = 1; a row's experts
 * and weights depend on its logits alone. 0, or -1 on bad sizes. The family
 * is DS_FAM_MOE_ROUTE in the kernel sets (--fast moe_route). n_expert is at
 * most DS_MOE_MAX_EXPERT (the backends' scratch is sized by it). */
#define DS_MOE_MAX_EXPERT 1024
int ds_moe_route(ds_variant v, int rows, int n_expert, int k, int norm, const float *logits, float *scratch,
                 int32_t *ids, float *weights);
/* The route with a gating function (deepseek4, llama.cpp's build_moe_ffn):
 * func DS_MOE_SOFTMAX is ds_moe_route; DS_MOE_SQRT_SOFTPLUS scores each
 * expert p_i = sqrt(softplus(l_i)) (softplus(x) = x above 20, else
 * log(1 + e^x), in double: ds_exp / ds_log), selects the k best of p_i +
 * bias_i (bias NULL: none) — or takes fixed[row][0..k) as the experts (a
 * hash layer; NULL: select) — and weighs them with the unbiased p, divided
 * by max(sum, 6.103515625e-5) when norm, then times scale unless scale is 0
 * or 1. scratch: 2 * n_expert floats. */
enum { DS_MOE_SOFTMAX = 0, DS_MOE_SQRT_SOFTPLUS = 1 };
typedef struct {
    int func, norm;
    float scale;
    const float *bias;
    const int32_t *fixed;
} ds_moe_gating;
int ds_moe_route_ex(ds_variant v, int rows, int n_expert, int k, const ds_moe_gating *g, const float *logits,
                    float *scratch, int32_t *ids, float *weights);
/* The weighted sum of each row's k expert outputs (moe_route.c; backend.h
 * moe_combine has the definition): out[r] = w[r][0] y[slot[r][0]] + ... in
 * rank order, one product and one sum a term, then the shared expert
 * (sh_gate: sh * ds_sigmoidf(gate); NULL: + sh; sh NULL: none). slot NULL:
 * the identity, y's row r * k + j. */
void ds_moe_combine(int M, int k, int n, const int32_t *slot, const float *w, const float *y, const float *sh_gate,
                    const float *sh, float *out);

/* ---- gated delta net (gdn.c): qwen35's linear-attention layers ----------
 * conv: out[m][c] = silu(sum_k w[c][k] * xin[m + k][c]) over the K taps,
 * xin = the K - 1 rows of state_in (oldest first; NULL: zeros) then x's
 * M rows ([M][conv_dim]); w: [conv_dim][K]. state_out[m] (NULL: not kept):
 * where the K - 1 inputs ending at row m go, the conv state after row m.
 * recur: from the conv output rows qkv ([M][conv_dim] = q heads | k heads |
 * v heads, each head_dim wide), alpha / beta logits ([M][n_v_head]),
 * dt_bias and A ([n_v_head]): q and k L2-normalised in place, alpha
 * becomes exp(g) and beta sigmoid(beta) in place, and the state
 * ([n_v_head][head_dim][head_dim], row j over the key index; state_in NULL:
 * zeros) runs through the M positions in order; out: [M][n_v_head *
 * head_dim]; state_out[m] (NULL: not kept) receives the state after row m
 * (the last row's must be kept). Decode is canonical at M = 1 and after
 * row m of a canonical call the state is decode's after the same rows.
 * The family is DS_FAM_GDN (--fast gdn). 0, or -1 on bad shapes. */
#define DS_GDN_MAX_CONV 16
#define DS_GDN_MAX_HEAD 512
typedef struct {
    int   n_k_head, n_v_head, head_dim;
    int   d_conv, conv_dim;          /* conv_dim = (2 n_k_head + n_v_head) head_dim */
    float eps;                       /* the L2 norms' floor                         */
} ds_gdn_shape;
void ds_gdn_conv(ds_variant v, const ds_gdn_shape *s, int M, const float *x, const float *w, const float *state_in,
                 float *const *state_out, float *out, ds_pool *pool);
int  ds_gdn_recur(ds_variant v, const ds_gdn_shape *s, int M, float *qkv, float *alpha, float *beta,
                  const float *dt_bias, const float *A, const float *state_in, float *const *state_out, float *out,
                  ds_pool *pool);
/* x[i] *= sigmoid(g[i]) for i < n (qwen35's gated attention output). */
void ds_sigmoid_mul(int64_t n, float *x, const float *g, ds_pool *pool);

/* ---- deepseek4 (attn_sinks.c, hc_pre.c, hc_post.c) ----------------------
 * ds_attn_sinks: attention over the rows of r (ds_attention_rows' paging)
 * whose softmax also counts sinks[h] (one logit per head, no value; NULL:
 * none) and, with window > 0, only the last `window` visible positions,
 * plus x's compressed keys (NULL: none; deepseek4's compressed layers);
 * DS_ATTN_CHUNK chunks folded left to right, the sink last (attn_sinks.c).
 * head_dim <= DS_ATTN_SINKS_MAX_HD. 0, or -1 on bad shapes.
 * ds_hc_pre: the hyper-connection weights from n_mix mixing logits a row
 * (n_mix = hc: pre only, the output head; (2 + hc) hc: pre, post [rows][hc]
 * and the Sinkhorn-normalised comb [rows][hc][hc], src-major) and
 * y[rows][d] = sum_h pre[h] x[h]; x: [rows][hc][d] (hc_pre.c).
 * ds_hc_post: out[rows][hc][d] = f * post[dst] + sum_src res[src] *
 * comb[src][dst]; out may be res (hc_post.c). hc <= DS_HC_MAX. */
#define DS_ATTN_SINKS_MAX_HD 1024
#define DS_HC_MAX 16
int ds_attn_sinks(ds_variant v, const ds_attn_shape *s, int M, const ds_attn_rows *r, int window,
                  const ds_attn_extra *x, const float *sinks,
                  const float *q, const float *kcache, const float *vcache, float *out, ds_pool *pool);
/* ds_ds4_compress: out[rows][hd], row r the per-dim softmax pooling of its
 * n entries kv[r*n + j], sc[r*n + j] (hd floats each; both NULL: a virtual
 * entry, skipped) (ds4_compress.c). 0, or -1 on bad shapes. */
int ds_ds4_compress(ds_variant v, int rows, int n, int hd, const float *const *kv, const float *const *sc, float *out,
                    ds_pool *pool);
/* ds_ds4_indexer: per row m, the scores sum_h w[m][h] relu(iq[m][h] .
 * key(u, m, b)) of its n_blk[m] blocks (iq [rows][n_ih][ihd], w
 * [rows][n_ih]), the min(top_k, n_blk[m]) best kept (ties to the lower
 * block) into sel [rows][top_k] in ascending block order, their count in
 * n_sel[m]; score: [rows][top_k] scratch (ds4_indexer.c). 0, or -1. */
typedef const float *(*ds_ds4_key_fn)(const void *u, int row, int block);
int ds_ds4_indexer(ds_variant v, int rows, int n_ih, int ihd, const float *iq, const float *w, const int32_t *n_blk,
                   ds_ds4_key_fn key, const void *u, int top_k, int32_t *sel, int32_t *n_sel, float *score,
                   ds_pool *pool);
int ds_hc_pre(ds_variant v, int rows, int hc, int d, int n_mix, const float *x, const float *mix, const float *scale,
              const float *base, float eps, int iters, float *y, float *post, float *comb, ds_pool *pool);
int ds_hc_post(ds_variant v, int rows, int hc, int d, const float *f, const float *res, const float *post,
               const float *comb, float *out, ds_pool *pool);

/* ---- residual epilogue: x += y (rows x n), then, if w != NULL,
 * xnorm = rmsnorm(x, w, eps) (the next sub-block's norm).
 * canonical: the add, then ds_rmsnorm(vnorm, ...) exactly as a separate op.
 * fast: one fused pass (add + sum of squares, vLLM's fused_add_rms_norm)
 * whose sum-of-squares order is the fused loop's own. x is bitwise the same
 * in both; the norm output is where the fast variant shows. */
void ds_residual(ds_variant vres, ds_variant vnorm, int rows, int n, float *x, const float *y,
                 const float *w, float eps, float *xnorm, ds_pool *pool);

/* ---- scratch: reserved once, never allocated in a forward -----------------
 * The per-thread and shared bytes the kernels take from the pool's reserved
 * scratch (ds_pool_reserve) so that no call with M <= m_max rows, weights of
 * n_in <= k_max, head_dim <= hd_max and attention over at most n_ctx
 * positions allocates. A call whose shape exceeds the reservation (or one
 * without a pool) still works: it takes a slower path with the same bits,
 * or, for the standalone API only, allocates. */
size_t ds_kernels_thread_scratch(int64_t k_max, int hd_max, int64_t n_ctx);
size_t ds_kernels_shared_scratch(int m_max, int64_t k_max);
/* The matmul and attention shares of ds_kernels_thread_scratch. */
size_t ds_matmul_thread_scratch(int64_t k_max);
size_t ds_attention_thread_scratch(int hd_max, int64_t n_ctx);

/* ---- argmax with ties to the lowest index (NaN never wins) --------------- */
int64_t ds_argmax(const float *x, int64_t n);

#endif
