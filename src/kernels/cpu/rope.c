/* rope.c — rotary position embedding family, in place on
 * x[rows][n_heads][head_dim]; row r is at absolute position pos[r].
 *
 *   NEOX   (Qwen3):       pairs (i, i + head_dim/2)
 *   NORMAL (Llama, ggml): pairs (2i, 2i + 1)
 *   theta_i = pos * freq_base^(-2i/head_dim),  i = 0 .. head_dim/2 - 1
 *   (x0, x1) -> (x0*cos - x1*sin, x0*sin + x1*cos)
 *
 *   decode     rope_row(): inv_freq_i = ds_powf(freq_base, -2i/head_dim) by
 *              the one expression rope_inv_freq(), theta = (float)pos *
 *              inv_freq_i, ds_sincosf of that float angle, shared by all heads
 *              of the row (with rope scaling, ds_rope_yarn: theta divided by
 *              pair i's frequency factor, then ds_rope_yarn_sincos's YaRN /
 *              linear sequence, llama.cpp's rope_yarn order). All are
 *              project-owned (kernels/dsmath.h), not the
 *              C library's, so the table — and every output bit downstream —
 *              is the same on every host, and the CUDA backend's host table
 *              and device fallback compute the same values.
 *   canonical  rows split over threads, each through rope_row().
 *   fast       ggml's recurrence: theta_0 = pos, theta_{i+1} = theta_i * ratio
 *              with ratio = ds_powf(freq_base, -2/head_dim) — one pow per row
 *              instead of head_dim/2. The repeated multiplication rounds at
 *              every step, so the angles (and the bits) differ from decode. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"
#include "kernels/dsmath.h"

#define ROPE_BLOCK 256   /* pairs whose cos/sin are tabulated at once (stack) */

typedef struct {
    int n_heads, head_dim;
    const int *pos;
    float freq_base;
    ds_rope_mode mode;
    float *x;
    const ds_rope_yarn *yarn;   /* NULL: plain RoPE */
} rope_args;

/* Rotate pairs [i0, i0+nb) of every head of one row by the tabulated angles. */
static void rope_apply(int n_heads, int hd, ds_rope_mode mode, int i0, int nb,
                       const float *c, const float *s, float *x) {
    int half = hd / 2;
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (int64_t)h * hd;
        if (mode == DS_ROPE_NEOX) {
            float *a = xh + i0, *b = xh + half + i0;
            for (int k = 0; k < nb; k++) {
                float x0 = a[k], x1 = b[k];
                a[k] = x0 * c[k] - x1 * s[k];
                b[k] = x0 * s[k] + x1 * c[k];
            }
        } else {
            float *a = xh + 2 * i0;
            for (int k = 0; k < nb; k++) {
                float x0 = a[2 * k], x1 = a[2 * k + 1];
                a[2 * k]     = x0 * c[k] - x1 * s[k];
                a[2 * k + 1] = x0 * s[k] + x1 * c[k];
            }
        }
    }
}

/* ========================================================================
 * DECODE — the one per-row instruction sequence
 * ======================================================================== */
/* The same expression for every pair, every row, every call: the inverse
 * frequency is a pure function of (freq_base, i, head_dim). */
static inline float rope_inv_freq(float freq_base, int i, int hd) {
    return ds_powf(freq_base, -2.0f * (float)i / (float)hd);
}

/* Pair i's angle at position pos: (float)pos * inv_freq_i, divided by its
 * frequency factor when the scaling carries one (llama.cpp's theta / ff). */
static inline float rope_theta(int pos, float inv, const ds_rope_yarn *y, int i) {
    const float theta = (float)pos * inv;
    return y && y->freq_factors ? theta / y->freq_factors[i] : theta;
}

/* cos/sin of pair i's angle: plain, or scaled (ds_rope_yarn_sincos: the
 * CUDA table's and device fallback's same sequence) */
static inline void rope_cs(const ds_rope_yarn *y, float theta, int i, float *sn, float *cs) {
    if (y) ds_rope_yarn_sincos(theta, i, y->freq_scale, y->ext_factor, y->lo, y->hi, y->mscale, sn, cs);
    else ds_sincosf(theta, sn, cs);
}

static void rope_row(int n_heads, int hd, int pos, float freq_base, ds_rope_mode mode, const ds_rope_yarn *yarn,
                     float *x) {
    float c[ROPE_BLOCK], s[ROPE_BLOCK];
    int half = hd / 2;
    for (int i0 = 0; i0 < half; i0 += ROPE_BLOCK) {
        int nb = ds_imin(ROPE_BLOCK, half - i0);
        for (int k = 0; k < nb; k++) {
            const float theta = rope_theta(pos, rope_inv_freq(freq_base, i0 + k, hd), yarn, i0 + k);
            rope_cs(yarn, theta, i0 + k, &s[k], &c[k]);
        }
        rope_apply(n_heads, hd, mode, i0, nb, c, s, x);
    }
}

/* ========================================================================
 * CANONICAL — threads split rows; every row runs rope_row()
 * ======================================================================== */
static void rope_canon_range(void *arg, int64_t r0, int64_t r1) {
    const rope_args *a = arg;
    int64_t row = (int64_t)a->n_heads * a->head_dim;
    for (int64_t r = r0; r < r1; r++)
        rope_row(a->n_heads, a->head_dim, a->pos[r], a->freq_base, a->mode, a->yarn, a->x + r * row);
}

/* The same rows with the angles' cos/sin cached per position (a decode
 * step evaluates head_dim/2 ds_powf + ds_sincosf per row and layer; the values
 * are a pure function of (freq_base, head_dim, pos), so the cache holds
 * exactly what rope_row would compute). */
typedef struct {
    rope_args a;
    float *tab;
    unsigned char *done;
    int64_t n_pos;
} rope_cached_args;

static void rope_cached_range(void *arg, int64_t r0, int64_t r1) {
    const rope_cached_args *c = arg;
    const rope_args *a = &c->a;
    const int hd = a->head_dim, half = hd / 2;
    const int64_t row = (int64_t)a->n_heads * hd;
    for (int64_t r = r0; r < r1; r++) {
        const int p = a->pos[r];
        if (p < 0 || p >= c->n_pos || half > ROPE_BLOCK) {
            rope_row(a->n_heads, hd, p, a->freq_base, a->mode, a->yarn, a->x + r * row);
            continue;
        }
        float *cs = c->tab + (int64_t)p * hd;
        if (!c->done[p]) {
            for (int k = 0; k < half; k++) {
                const float theta = rope_theta(p, rope_inv_freq(a->freq_base, k, hd), a->yarn, k);
                rope_cs(a->yarn, theta, k, &cs[half + k], &cs[k]);
            }
            c->done[p] = 1;
        }
        rope_apply(a->n_heads, hd, a->mode, 0, half, cs, cs + half, a->x + r * row);
    }
}

void ds_rope_cached_ext(int rows, int n_heads, int head_dim, const int *pos, float freq_base,
                        ds_rope_mode mode, const ds_rope_yarn *yarn, float *x, float *tab, unsigned char *done,
                        int64_t n_pos, ds_pool *pool) {
    if (rows <= 0 || n_heads <= 0 || head_dim < 2) return;
    rope_cached_args c = { { n_heads, head_dim, pos, freq_base, mode, x, yarn }, tab, done, n_pos };
    int64_t grain = ds_grain((int64_t)n_heads * head_dim, 8192);
    ds_pool_for(pool, rows, grain, rope_cached_range, &c);
}

void ds_rope_cached(int rows, int n_heads, int head_dim, const int *pos, float freq_base,
                    ds_rope_mode mode, float *x, float *tab, unsigned char *done, int64_t n_pos,
                    ds_pool *pool) {
    ds_rope_cached_ext(rows, n_heads, head_dim, pos, freq_base, mode, NULL, x, tab, done, n_pos, pool);
}

/* ========================================================================
 * FAST — ggml's angle recurrence (one pow per row)
 * ======================================================================== */
/* WHY the bits differ: theta_i = ((pos * r) * r) * ... * r accumulates one
 * rounding per step, whereas decode computes pos * ds_powf(base, -2i/hd)
 * directly; from i = 2 on the float angles generally disagree in the last
 * bits, and sin/cos pass that on. */
static void rope_fast_row(int n_heads, int hd, int pos, float freq_base, ds_rope_mode mode,
                          const ds_rope_yarn *yarn, float *x) {
    float c[ROPE_BLOCK], s[ROPE_BLOCK];
    int half = hd / 2;
    float ratio = ds_powf(freq_base, -2.0f / (float)hd);
    float theta = (float)pos;
    for (int i0 = 0; i0 < half; i0 += ROPE_BLOCK) {
        int nb = ds_imin(ROPE_BLOCK, half - i0);
        for (int k = 0; k < nb; k++) {
            const float t = yarn && yarn->freq_factors ? theta / yarn->freq_factors[i0 + k] : theta;
            rope_cs(yarn, t, i0 + k, &s[k], &c[k]);
            theta *= ratio;
        }
        rope_apply(n_heads, hd, mode, i0, nb, c, s, x);
    }
}

static void rope_fast_range(void *arg, int64_t r0, int64_t r1) {
    const rope_args *a = arg;
    int64_t row = (int64_t)a->n_heads * a->head_dim;
    for (int64_t r = r0; r < r1; r++)
        rope_fast_row(a->n_heads, a->head_dim, a->pos[r], a->freq_base, a->mode, a->yarn, a->x + r * row);
}

/* ========================================================================
 * entry point
 * ======================================================================== */
void ds_rope_ext(ds_variant v, int rows, int n_heads, int head_dim, const int *pos, float freq_base,
                 ds_rope_mode mode, const ds_rope_yarn *yarn, float *x, ds_pool *pool) {
    if (rows <= 0 || n_heads <= 0 || head_dim < 2) return;
    rope_args a = { n_heads, head_dim, pos, freq_base, mode, x, yarn };
    int64_t grain = ds_grain((int64_t)n_heads * head_dim, 8192);
    ds_pool_for(pool, rows, grain, v == DS_FAST ? rope_fast_range : rope_canon_range, &a);
}

void ds_rope(ds_variant v, int rows, int n_heads, int head_dim, const int *pos,
             float freq_base, ds_rope_mode mode, float *x, ds_pool *pool) {
    ds_rope_ext(v, rows, n_heads, head_dim, pos, freq_base, mode, NULL, x, pool);
}

/* ggml_rope_yarn_corr_dim: the pair index whose wavelength fits n_ctx_orig
 * / beta times in the original context, in double (a load-time constant;
 * the ends are floored / ceiled to whole pairs, so the log's last bits only
 * matter at an exact integer) */
static double rope_corr_dim(int n_dims, int n_ctx_orig, float beta, float base) {
    return (double)n_dims * ds_log((double)n_ctx_orig / ((double)beta * 2.0 * 3.14159265358979323846)) /
           (2.0 * ds_log((double)base));
}

void ds_rope_yarn_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float dims[2]) {
    double lo = rope_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base);
    double hi = rope_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base);
    lo = (double)(int64_t)lo - ((double)(int64_t)lo > lo);            /* floor */
    hi = (double)(int64_t)hi + ((double)(int64_t)hi < hi);            /* ceil  */
    dims[0] = lo < 0.0 ? 0.0f : (float)lo;
    dims[1] = hi > (double)(n_dims - 1) ? (float)(n_dims - 1) : (float)hi;
}
