/* gdn.c — the gated delta net family: qwen35's linear-attention layers
 * (Qwen3.5 / Qwen3-Next "Gated DeltaNet"): a short causal convolution over
 * the q|k|v projection, per-head L2 norms, the gates, and the recurrence
 * whose state replaces a KV cache.
 *
 * Per value head h (key head h % n_k_head, llama.cpp's tiling) the state is
 * an S x S matrix kept as S rows, row j over the key index i. One position:
 *     g   = softplus(alpha_h + dt_bias_h) * a_h      (a = -exp(A_log), from the file)
 *     S_j = S_j * exp(g)                             every row j
 *     d_j = (v_j - S_j . k) * sigmoid(beta_h)
 *     S_j = S_j + k * d_j
 *     o_j = (S_j . q) / sqrt(S)
 * with q, k the L2-normalised conv outputs. A row j of one head is touched
 * only by its own update, so the work splits over (head, row) items and each
 * item walks the call's positions in order: threads split outputs, never a
 * reduction, and never the positions.
 *
 * Why it is a family: the state is a running sum over every earlier
 * position. A batched kernel that reorders it — the chunked (WY) form
 * every fast implementation uses for prefill, or a dot product with other
 * partial sums — gives a state that differs in the last bits, and that
 * difference is carried into every later token of the sequence, not just
 * the row where it was made. So the update has ONE order per position.
 *
 *   decode     one position: conv_row() — acc = 0, acc += x * w for the
 *              K taps oldest first (llama.cpp's ssm_conv order), silu =
 *              x / (1 + ds_expf(-x)); prep_row() — sum of squares in the
 *              16-lane tree (ds_sumsq16), scale = 1 / max(sqrt(sum), eps),
 *              x * scale; g by ds_expf / ds_log, exp(g) by ds_expf, beta
 *              by ds_sigmoidf; core_item() — the update above with the two
 *              dots in the 16-lane tree (ds_dot16) and the axpy as a
 *              rounded product then a rounded add.
 *   canonical  the decode sequence for every position of the call, in
 *              position order, item by item: after row t the state is
 *              bit for bit decode's after the same tokens (the verify's
 *              per-row states, which the rollback keeps, are decode's).
 *   fast       what a throughput kernel does: the decay folded into the
 *              dot (S . k computed on the old row, then times exp(g)),
 *              the new row as one fused multiply-add fmaf(S, exp(g), k*d),
 *              dots in four interleaved partial sums, exp and sigmoid by
 *              the polynomial ds_exp_fast, the conv as an fmaf chain
 *              newest tap first. All accurate; none of it decode's bits.
 *
 * The state in and the per-row states out are host pointers (the layer
 * finds them in the sequence's ring, rstate.h); a row whose state_out is
 * NULL is not kept (the state stays in the item's registers). state_out
 * may alias state_in: an item reads its row of state_in before it writes
 * any row. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"
#include "kernels/dsmath.h"

#include <math.h>

/* ========================================================================
 * DECODE — one position's arithmetic
 * ======================================================================== */

static inline float silu_canon(float x) { return x / (1.0f + ds_expf(-x)); }

/* llama.cpp's softplus threshold: above 20, log(1 + e^x) is x in float */
static inline float softplus_canon(float x) {
    return x > 20.0f ? x : (float)ds_log(1.0 + (double)ds_expf(x));
}

static inline void l2norm_canon(float *x, int n, float eps) {
    const float sum = ds_sumsq16(x, n);
    const float scale = 1.0f / fmaxf(sqrtf(sum), eps);
    for (int i = 0; i < n; i++) x[i] = x[i] * scale;
}

/* ---- fast helpers ------------------------------------------------------- */
static inline float dot4(const float *a, const float *b, int n) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 = fmaf(a[i], b[i], s0);
        s1 = fmaf(a[i + 1], b[i + 1], s1);
        s2 = fmaf(a[i + 2], b[i + 2], s2);
        s3 = fmaf(a[i + 3], b[i + 3], s3);
    }
    for (; i < n; i++) s0 = fmaf(a[i], b[i], s0);
    return (s0 + s1) + (s2 + s3);
}

static inline void l2norm_fast(float *x, int n, float eps) {
    const float sum = dot4(x, x, n);
    const float r = 1.0f / fmaxf(sqrtf(sum), eps);
    for (int i = 0; i < n; i++) x[i] *= r;
}

/* ========================================================================
 * The convolution: items are channels, each walks the call's positions
 * ======================================================================== */
typedef struct {
    const ds_gdn_shape *s;
    int M;
    const float *x, *w, *s_in;
    float *const *s_out;
    float *out;
    int fast;
} conv_args;

static void conv_range(void *arg, int64_t c0, int64_t c1) {
    const conv_args *a = arg;
    const int K = a->s->d_conv, C = a->s->conv_dim, M = a->M;
    for (int64_t c = c0; c < c1; c++) {
        /* the window: the K - 1 inputs before the call, then each row's */
        float win[DS_GDN_MAX_CONV];
        for (int r = 0; r < K - 1; r++) win[r] = a->s_in ? a->s_in[(size_t)r * C + c] : 0.0f;
        const float *wc = a->w + (size_t)c * K;
        for (int m = 0; m < M; m++) {
            win[K - 1] = a->x[(size_t)m * C + c];
            float y;
            if (!a->fast) {
                float acc = 0.0f;
                for (int k = 0; k < K; k++) acc += win[k] * wc[k];
                y = silu_canon(acc);
            } else {
                float acc = 0.0f;
                for (int k = K - 1; k >= 0; k--) acc = fmaf(win[k], wc[k], acc);
                y = acc * (1.0f / (1.0f + ds_exp_fast(-acc)));
            }
            a->out[(size_t)m * C + c] = y;
            for (int r = 0; r < K - 1; r++) win[r] = win[r + 1];
            if (a->s_out[m])
                for (int r = 0; r < K - 1; r++) a->s_out[m][(size_t)r * C + c] = win[r];
        }
    }
}

void ds_gdn_conv(ds_variant v, const ds_gdn_shape *s, int M, const float *x, const float *w, const float *state_in,
                 float *const *state_out, float *out, ds_pool *pool) {
    if (M <= 0 || s->d_conv < 1 || s->d_conv > DS_GDN_MAX_CONV || s->conv_dim <= 0) return;
    conv_args a = {s, M, x, w, state_in, state_out, out, v == DS_FAST};
    ds_pool_for(pool, s->conv_dim, 64, conv_range, &a);
}

/* ========================================================================
 * The recurrence: prep (per row), then the core (per head row, in order)
 * ======================================================================== */
typedef struct {
    const ds_gdn_shape *s;
    int M;
    float *qkv, *alpha, *beta;
    const float *dt_bias, *A;
    const float *s_in;
    float *const *s_out;
    float *out;
    int fast;
} recur_args;

/* Per row: L2 norms of q and k (in place, per key head), alpha -> exp(g),
 * beta -> sigmoid(beta). A row's values depend on that row alone. */
static void prep_range(void *arg, int64_t m0, int64_t m1) {
    const recur_args *a = arg;
    const ds_gdn_shape *s = a->s;
    const int S = s->head_dim, Hk = s->n_k_head, Hv = s->n_v_head;
    for (int64_t m = m0; m < m1; m++) {
        float *row = a->qkv + (size_t)m * s->conv_dim;
        for (int h = 0; h < 2 * Hk; h++) {       /* q heads then k heads */
            if (!a->fast) l2norm_canon(row + (size_t)h * S, S, s->eps);
            else l2norm_fast(row + (size_t)h * S, S, s->eps);
        }
        float *al = a->alpha + (size_t)m * Hv, *be = a->beta + (size_t)m * Hv;
        for (int h = 0; h < Hv; h++) {
            const float t = al[h] + a->dt_bias[h];
            if (!a->fast) {
                const float g = softplus_canon(t) * a->A[h];
                al[h] = ds_expf(g);
                be[h] = ds_sigmoidf(be[h]);
            } else {
                const float sp = t > 20.0f ? t : (float)ds_log(1.0 + (double)ds_exp_fast(t));
                al[h] = ds_exp_fast(sp * a->A[h]);
                be[h] = 1.0f / (1.0f + ds_exp_fast(-be[h]));
            }
        }
    }
}

/* One item = row j of value head h, walked through the call's positions. */
DS_OPS_BODY(core_range) {
    const recur_args *a = arg;
    const ds_gdn_shape *s = a->s;
    const int S = s->head_dim, Hk = s->n_k_head, Hv = s->n_v_head, C = s->conv_dim;
    const float scale = 1.0f / sqrtf((float)S);
    float r[DS_GDN_MAX_HEAD];
    for (int64_t it = i0; it < i1; it++) {
        const int h = (int)(it / S), j = (int)(it % S), hk = h % Hk;
        const size_t soff = ((size_t)h * S + (size_t)j) * S;
        if (a->s_in) memcpy(r, a->s_in + soff, (size_t)S * sizeof(float));
        else memset(r, 0, (size_t)S * sizeof(float));
        for (int m = 0; m < a->M; m++) {
            const float *row = a->qkv + (size_t)m * C;
            const float *q = row + (size_t)hk * S, *k = row + (size_t)(Hk + hk) * S;
            const float vj = row[(size_t)2 * Hk * S + (size_t)h * S + j];
            const float eg = a->alpha[(size_t)m * Hv + h], bt = a->beta[(size_t)m * Hv + h];
            float o;
            if (!a->fast) {
                for (int i = 0; i < S; i++) r[i] = r[i] * eg;
                const float sk = ds_dot16(r, k, S);
                const float dj = (vj - sk) * bt;
                for (int i = 0; i < S; i++) {
                    const float t = k[i] * dj;
                    r[i] = r[i] + t;
                }
                o = ds_dot16(r, q, S) * scale;
            } else {
                const float sk = dot4(r, k, S) * eg;
                const float dj = (vj - sk) * bt;
                for (int i = 0; i < S; i++) r[i] = fmaf(r[i], eg, k[i] * dj);
                o = dot4(r, q, S) * scale;
            }
            a->out[(size_t)m * Hv * S + (size_t)h * S + j] = o;
            if (a->s_out[m]) memcpy(a->s_out[m] + soff, r, (size_t)S * sizeof(float));
        }
    }
}
DS_OPS_DISPATCH(core_range)

/* the fast core is the same walk with fast = 1: one body, two variants
 * (the flag is read per item, so both instances are the dispatched ones) */

int ds_gdn_recur(ds_variant v, const ds_gdn_shape *s, int M, float *qkv, float *alpha, float *beta,
                 const float *dt_bias, const float *A, const float *state_in, float *const *state_out, float *out,
                 ds_pool *pool) {
    if (M <= 0) return 0;
    if (s->head_dim < 1 || s->head_dim > DS_GDN_MAX_HEAD || s->n_k_head < 1 || s->n_v_head < s->n_k_head ||
        s->n_v_head % s->n_k_head || s->conv_dim != (2 * s->n_k_head + s->n_v_head) * s->head_dim)
        return -1;
    recur_args a = {s, M, qkv, alpha, beta, dt_bias, A, state_in, state_out, out, v == DS_FAST};
    ds_pool_for(pool, M, 1, prep_range, &a);
    ds_pool_for(pool, (int64_t)s->n_v_head * s->head_dim, 16, core_range, &a);
    return 0;
}

/* ========================================================================
 * The attention output gate of qwen35's full-attention layers
 * ======================================================================== */
/* x[i] = x[i] * sigmoid(g[i]) (llama.cpp: attention output times the
 * sigmoid of the gate half of the q projection). Elementwise: no order to
 * choose, one expression everywhere, so it has no variants. */
typedef struct { float *x; const float *g; int64_t n; } sgm_args;
#define SGM_BLOCK 4096
static void sgm_range(void *arg, int64_t b0, int64_t b1) {
    const sgm_args *a = arg;
    int64_t e1 = b1 * SGM_BLOCK;
    if (e1 > a->n) e1 = a->n;
    for (int64_t i = b0 * SGM_BLOCK; i < e1; i++) a->x[i] = a->x[i] * ds_sigmoidf(a->g[i]);
}

void ds_sigmoid_mul(int64_t n, float *x, const float *g, ds_pool *pool) {
    if (n <= 0) return;
    sgm_args a = {x, g, n};
    ds_pool_for(pool, (n + SGM_BLOCK - 1) / SGM_BLOCK, 1, sgm_range, &a);
}
