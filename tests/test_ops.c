/* test_ops.c — the non-matmul operator families (attention, rmsnorm, rope,
 * swiglu, residual, argmax):
 *   - every variant against a double-precision reference;
 *   - THE CANONICAL PROPERTY: row t of a canonical call of width M (M = 1..16,
 *     prefixes on both sides of every attention chunk boundary) memcmp-equals
 *     the decode call (M = 1) for that row alone;
 *   - THE COUNTER-TEST: each fast variant differs in bits from decode for some
 *     row, so the property check is shown able to fail;
 *   - thread-count invariance (pool NULL vs 1, 2, 3 threads), memcmp.
 * Prints PASS/FAIL lines; exits non-zero on any failure. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"   /* ds_exp_fast, the fast variants' exp */
#include "kernels/dsmath.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int n_pass, n_fail;
static uint64_t canon_digest = 1469598103934665603ull;   /* FNV-1a over canonical outputs */
static void digest(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) { canon_digest ^= b[i]; canon_digest *= 1099511628211ull; }
}

static void result(int ok, const char *name, const char *fmt, ...) {
    if (ok) { printf("PASS %s\n", name); n_pass++; return; }
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    printf("FAIL %s: %s\n", name, why);
    n_fail++;
}

/* ---- deterministic data ------------------------------------------------- */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) {                        /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 23) - 1.0);
}
static float *rand_buf(size_t n, float amp) {
    float *p = malloc(n * sizeof(float));
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    for (size_t i = 0; i < n; i++) p[i] = frand() * amp;
    return p;
}
static float *xalloc(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

#define N_POOLS 4
static ds_pool *pools[N_POOLS];     /* NULL, 1, 2, 3 threads */

/* ======================================================================
 * attention
 * ====================================================================== */
typedef struct { ds_attn_shape s; const char *name; } attn_case;

static void attn_ref(const ds_attn_shape *s, int M, int pos0, int causal, int n_kv,
                     const float *q, const float *k, const float *v, double *out) {
    int hd = s->head_dim, group = s->n_head / s->n_kv_head;
    double *sc = malloc(sizeof(double) * (size_t)(pos0 + M + n_kv + 1));
    for (int m = 0; m < M; m++)
        for (int h = 0; h < s->n_head; h++) {
            int L = causal ? pos0 + m + 1 : n_kv, kvh = h / group;
            const float *qv = q + ((size_t)m * s->n_head + h) * hd;
            double mx = -INFINITY, l = 0;
            for (int j = 0; j < L; j++) {
                const float *kr = k + (size_t)j * s->kv_stride + (size_t)kvh * hd;
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qv[i] * kr[i];
                sc[j] = d * s->scale;
                if (sc[j] > mx) mx = sc[j];
            }
            double *o = out + ((size_t)m * s->n_head + h) * hd;
            for (int i = 0; i < hd; i++) o[i] = 0;
            for (int j = 0; j < L; j++) {
                double p = exp(sc[j] - mx);
                l += p;
                const float *vr = v + (size_t)j * s->kv_stride + (size_t)kvh * hd;
                for (int i = 0; i < hd; i++) o[i] += p * vr[i];
            }
            for (int i = 0; i < hd; i++) o[i] /= l;
        }
    free(sc);
}

/* max over (row, head) of max|o - r| / max|r| */
static double rel_err_rows(const float *o, const double *r, int rows, int n) {
    double worst = 0;
    for (int t = 0; t < rows; t++) {
        double e = 0, mag = 1e-30;
        for (int i = 0; i < n; i++) {
            double d = fabs((double)o[(size_t)t * n + i] - r[(size_t)t * n + i]);
            if (d > e) e = d;
            if (fabs(r[(size_t)t * n + i]) > mag) mag = fabs(r[(size_t)t * n + i]);
        }
        if (e / mag > worst) worst = e / mag;
    }
    return worst;
}

#define T_MAX 200
static const int attn_T[] = { 63, 64, 65, 127, 128, 129, 200 };
#define N_T ((int)(sizeof attn_T / sizeof attn_T[0]))

static void test_attention_case(const attn_case *c) {
    const ds_attn_shape *s = &c->s;
    const int hd = s->head_dim, qrow = s->n_head * hd;
    char name[160];
    float *k = rand_buf((size_t)T_MAX * s->kv_stride, 1.0f);
    float *v = rand_buf((size_t)T_MAX * s->kv_stride, 1.0f);
    float *qall = rand_buf((size_t)T_MAX * qrow, 3.0f);           /* q row p = position p */
    float *single = xalloc((size_t)T_MAX * qrow);
    float *batch = xalloc((size_t)16 * qrow);
    double *ref = malloc(sizeof(double) * (size_t)16 * qrow);

    /* ---- reference accuracy, both variants, both modes */
    for (int var = 0; var < 2; var++)
        for (int causal = 1; causal >= 0; causal--) {
            int M = 7, pos0 = 190, n_kv = 200;
            ds_attention((ds_variant)var, s, M, pos0, causal, n_kv, qall, k, v, batch, NULL);
            attn_ref(s, M, pos0, causal, n_kv, qall, k, v, ref);
            double e = rel_err_rows(batch, ref, M * s->n_head, hd);
            snprintf(name, sizeof name, "attention_ref_%s_%s_%s", c->name,
                     var ? "fast" : "canonical", causal ? "causal" : "noncausal");
            result(e < 1e-4, name, "relative error %.3g >= 1e-4", e);
        }

    /* ---- the canonical property, causal: row m of (M, pos0) == decode at pos0+m */
    int bad = 0, checked = 0, fast_diff_rows = 0, fast_rows = 0;
    char why[256] = "";
    for (int ti = 0; ti < N_T; ti++) {
        int T = attn_T[ti];
        for (int p = 0; p < T; p++)
            ds_attention(DS_CANONICAL, s, 1, p, 1, T, qall + (size_t)p * qrow, k, v,
                         single + (size_t)p * qrow, NULL);
        digest(single, sizeof(float) * (size_t)T * qrow);
        for (int M = 1; M <= 16; M++) {
            int pos0 = T - M;
            for (int pi = 0; pi < N_POOLS; pi++) {
                ds_attention(DS_CANONICAL, s, M, pos0, 1, T, qall + (size_t)pos0 * qrow, k, v,
                             batch, pools[pi]);
                for (int m = 0; m < M; m++, checked++)
                    if (memcmp(batch + (size_t)m * qrow, single + (size_t)(pos0 + m) * qrow,
                               sizeof(float) * qrow)) {
                        if (!bad++) snprintf(why, sizeof why, "T=%d M=%d row %d pool %d differs",
                                             T, M, m, pi);
                    }
            }
            /* counter-test data: the fast kernel against decode */
            ds_attention(DS_FAST, s, M, pos0, 1, T, qall + (size_t)pos0 * qrow, k, v, batch, NULL);
            for (int m = 0; m < M; m++, fast_rows++)
                fast_diff_rows += memcmp(batch + (size_t)m * qrow,
                                         single + (size_t)(pos0 + m) * qrow,
                                         sizeof(float) * qrow) != 0;
        }
    }
    snprintf(name, sizeof name, "attention_canonical_eq_decode_causal_%s", c->name);
    result(!bad, name, "%d of %d rows: first %s", bad, checked, why);
    snprintf(name, sizeof name, "attention_fast_differs_causal_%s", c->name);
    result(fast_diff_rows > 0, name, "fast matched decode bitwise on all %d rows", fast_rows);
    printf("INFO attention %s: fast differs from decode on %d of %d rows\n", c->name,
           fast_diff_rows, fast_rows);

    /* ---- the canonical property, non-causal: row m of M == row m alone */
    bad = 0; checked = 0; fast_diff_rows = 0;
    for (int ti = 0; ti < N_T; ti++) {
        int T = attn_T[ti];
        for (int r = 0; r < 16; r++)
            ds_attention(DS_CANONICAL, s, 1, T - 1, 0, T, qall + (size_t)r * qrow, k, v,
                         single + (size_t)r * qrow, NULL);
        for (int M = 1; M <= 16; M++)
            for (int pi = 0; pi < N_POOLS; pi++) {
                ds_attention(DS_CANONICAL, s, M, T - M, 0, T, qall, k, v, batch, pools[pi]);
                for (int m = 0; m < M; m++, checked++)
                    if (memcmp(batch + (size_t)m * qrow, single + (size_t)m * qrow,
                               sizeof(float) * qrow)) {
                        if (!bad++) snprintf(why, sizeof why, "T=%d M=%d row %d pool %d differs",
                                             T, M, m, pi);
                    }
            }
        ds_attention(DS_FAST, s, 16, T - 16, 0, T, qall, k, v, batch, NULL);
        for (int m = 0; m < 16; m++)
            fast_diff_rows += memcmp(batch + (size_t)m * qrow, single + (size_t)m * qrow,
                                     sizeof(float) * qrow) != 0;
    }
    snprintf(name, sizeof name, "attention_canonical_eq_decode_noncausal_%s", c->name);
    result(!bad, name, "%d of %d rows: first %s", bad, checked, why);
    snprintf(name, sizeof name, "attention_fast_differs_noncausal_%s", c->name);
    result(fast_diff_rows > 0, name, "fast matched decode bitwise on every row");

    /* ---- thread-count invariance of both variants, and out aliasing q */
    for (int var = 0; var < 2; var++) {
        float *b0 = xalloc((size_t)16 * qrow);
        int tbad = 0;
        ds_attention((ds_variant)var, s, 16, 184, 1, 200, qall, k, v, b0, NULL);
        for (int pi = 1; pi < N_POOLS; pi++) {
            ds_attention((ds_variant)var, s, 16, 184, 1, 200, qall, k, v, batch, pools[pi]);
            tbad += memcmp(b0, batch, sizeof(float) * 16 * qrow) != 0;
        }
        memcpy(batch, qall, sizeof(float) * 16 * qrow);             /* in place: out == q */
        ds_attention((ds_variant)var, s, 16, 184, 1, 200, batch, k, v, batch, pools[2]);
        int alias_bad = memcmp(b0, batch, sizeof(float) * 16 * qrow) != 0;
        snprintf(name, sizeof name, "attention_threads_%s_%s", var ? "fast" : "canonical", c->name);
        result(!tbad && !alias_bad, name, "%d pools differ from inline; in-place differs: %d",
               tbad, alias_bad);
        free(b0);
    }
    free(k); free(v); free(qall); free(single); free(batch); free(ref);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* informal timing: M = 8 rows at positions 504..511 (prefixes up to 512) */
static void time_attention(int n_kv_head) {
    ds_attn_shape s = { 8, n_kv_head, 64, n_kv_head * 64, 0.125f };
    int M = 8, pos0 = 504, T = 512, qrow = s.n_head * s.head_dim;
    float *k = rand_buf((size_t)T * s.kv_stride, 1.0f), *v = rand_buf((size_t)T * s.kv_stride, 1.0f);
    float *q = rand_buf((size_t)M * qrow, 3.0f), *o = xalloc((size_t)M * qrow);
    double best[2] = { 1e9, 1e9 };
    for (int rep = 0; rep < 5; rep++)
        for (int var = 0; var < 2; var++) {
            int iters = 20;
            double t0 = now_s();
            for (int it = 0; it < iters; it++)
                ds_attention((ds_variant)var, &s, M, pos0, 1, T, q, k, v, o, NULL);
            double dt = (now_s() - t0) / iters;
            if (dt < best[var]) best[var] = dt;
        }
    printf("INFO attention timing M=8 T=512 n_head=8 n_kv_head=%d head_dim=64 (1 thread): "
           "canonical %.1f us, fast %.1f us, canonical/fast %.2fx\n",
           n_kv_head, best[0] * 1e6, best[1] * 1e6, best[0] / best[1]);
    free(k); free(v); free(q); free(o);
}

/* ======================================================================
 * row-wise families: rmsnorm, rope, swiglu, residual
 * ====================================================================== */
#define ROWS 32

static void test_rmsnorm(int n) {
    char name[128];
    float *x = rand_buf((size_t)ROWS * n, 1.0f), *w = rand_buf(n, 2.0f);
    for (int r = 0; r < ROWS; r++)            /* varied magnitudes per row */
        for (int i = 0; i < n; i++) x[(size_t)r * n + i] *= (float)(1 + r * 3);
    float *single = xalloc((size_t)ROWS * n), *y = xalloc((size_t)ROWS * n);
    double *ref = malloc(sizeof(double) * (size_t)ROWS * n);
    const float eps = 1e-6f;
    for (int r = 0; r < ROWS; r++) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[(size_t)r * n + i] * x[(size_t)r * n + i];
        double sc = 1.0 / sqrt(ss / n + eps);
        for (int i = 0; i < n; i++) ref[(size_t)r * n + i] = x[(size_t)r * n + i] * sc * w[i];
        ds_rmsnorm(DS_CANONICAL, 1, n, x + (size_t)r * n, w, eps, single + (size_t)r * n, NULL);
    }
    for (int var = 0; var < 2; var++) {
        ds_rmsnorm((ds_variant)var, ROWS, n, x, w, eps, y, NULL);
        double e = rel_err_rows(y, ref, ROWS, n);
        snprintf(name, sizeof name, "rmsnorm_ref_%s_n%d", var ? "fast" : "canonical", n);
        result(e < 1e-5, name, "relative error %.3g >= 1e-5", e);
    }
    int bad = 0, fast_diff = 0;
    for (int M = 1; M <= 16; M++) {
        int start = (M * 5) % (ROWS - M + 1);
        for (int pi = 0; pi < N_POOLS; pi++) {
            ds_rmsnorm(DS_CANONICAL, M, n, x + (size_t)start * n, w, eps, y, pools[pi]);
            for (int t = 0; t < M; t++)
                bad += memcmp(y + (size_t)t * n, single + (size_t)(start + t) * n, sizeof(float) * n) != 0;
        }
        ds_rmsnorm(DS_FAST, M, n, x + (size_t)start * n, w, eps, y, NULL);
        for (int t = 0; t < M; t++)
            fast_diff += memcmp(y + (size_t)t * n, single + (size_t)(start + t) * n, sizeof(float) * n) != 0;
    }
    /* in place (QK-norm style) */
    memcpy(y, x, sizeof(float) * ROWS * n);
    ds_rmsnorm(DS_CANONICAL, ROWS, n, y, w, eps, y, pools[3]);
    bad += memcmp(y, single, sizeof(float) * ROWS * n) != 0;
    snprintf(name, sizeof name, "rmsnorm_canonical_eq_decode_n%d", n);
    result(!bad, name, "%d rows differ from the single-row call", bad);
    snprintf(name, sizeof name, "rmsnorm_fast_differs_n%d", n);
    result(fast_diff > 0, name, "fast matched decode bitwise on every row");
    /* fast is thread-invariant too */
    float *y0 = xalloc((size_t)ROWS * n);
    int tbad = 0;
    ds_rmsnorm(DS_FAST, ROWS - 3, n, x, w, eps, y0, NULL);
    for (int pi = 1; pi < N_POOLS; pi++) {
        ds_rmsnorm(DS_FAST, ROWS - 3, n, x, w, eps, y, pools[pi]);
        tbad += memcmp(y0, y, sizeof(float) * (ROWS - 3) * n) != 0;
    }
    snprintf(name, sizeof name, "rmsnorm_threads_fast_n%d", n);
    result(!tbad, name, "%d pools differ", tbad);
    free(x); free(w); free(single); free(y); free(y0); free(ref);
}

/* canonical RoPE through the per-position cos/sin cache (the CPU backend's
 * path) == ds_rope canonical, bit for bit: rows that fill the cache, rows
 * that read it back, and positions outside it */
static void test_rope_cached(int n_heads, int hd, ds_rope_mode mode) {
    enum { R = 12, NPOS = 64 };
    const int row = n_heads * hd;
    int pos[R];
    for (int r = 0; r < R; r++) pos[r] = r < 10 ? 3 * r + 1 : NPOS + r;   /* two past the cache */
    float *x = rand_buf((size_t)R * row, 3.0f), *a = xalloc((size_t)R * row), *b = xalloc((size_t)R * row);
    float *tab = xalloc((size_t)NPOS * hd);
    unsigned char done[NPOS] = {0};
    memcpy(a, x, sizeof(float) * (size_t)R * row);
    ds_rope(DS_CANONICAL, R, n_heads, hd, pos, 10000.0f, mode, a, NULL);
    int bad = 0;
    for (int pass = 0; pass < 2; pass++) {          /* 0: fills the rows, 1: reads them */
        memcpy(b, x, sizeof(float) * (size_t)R * row);
        ds_rope_cached(R, n_heads, hd, pos, 10000.0f, mode, b, tab, done, NPOS, pools[pass % N_POOLS]);
        bad += memcmp(a, b, sizeof(float) * (size_t)R * row) != 0;
    }
    char name[96];
    snprintf(name, sizeof name, "rope_cached_eq_canonical_h%d_hd%d_%s", n_heads, hd, mode == DS_ROPE_NEOX ? "neox" : "normal");
    result(!bad, name, "%d of 2 passes differ from ds_rope canonical", bad);
    free(x); free(a); free(b); free(tab);
}

static void test_rope(int n_heads, int hd, ds_rope_mode mode) {
    char name[128];
    const char *mn = mode == DS_ROPE_NEOX ? "neox" : "normal";
    const int row = n_heads * hd;
    const float base = 1000000.0f;
    float *x = rand_buf((size_t)ROWS * row, 1.0f);
    float *single = xalloc((size_t)ROWS * row), *y = xalloc((size_t)ROWS * row);
    int pos[ROWS];
    for (int r = 0; r < ROWS; r++) pos[r] = r < 16 ? r * 3 : (int)((frand() + 1.0f) * 3000.0f);
    for (int r = 0; r < ROWS; r++) {
        memcpy(single + (size_t)r * row, x + (size_t)r * row, sizeof(float) * row);
        ds_rope(DS_CANONICAL, 1, n_heads, hd, &pos[r], base, mode, single + (size_t)r * row, NULL);
    }
    /* reference on the small positions (float angles are exact enough there) */
    for (int var = 0; var < 2; var++) {
        memcpy(y, x, sizeof(float) * 16 * row);
        ds_rope((ds_variant)var, 16, n_heads, hd, pos, base, mode, y, NULL);
        double worst = 0;
        for (int r = 0; r < 16; r++)
            for (int h = 0; h < n_heads; h++)
                for (int i = 0; i < hd / 2; i++) {
                    int a = mode == DS_ROPE_NEOX ? i : 2 * i, b = mode == DS_ROPE_NEOX ? i + hd / 2 : 2 * i + 1;
                    size_t o = (size_t)r * row + (size_t)h * hd;
                    double th = pos[r] * pow((double)base, -2.0 * i / hd);
                    double x0 = x[o + a], x1 = x[o + b];
                    double r0 = x0 * cos(th) - x1 * sin(th), r1 = x0 * sin(th) + x1 * cos(th);
                    double e = fmax(fabs(y[o + a] - r0), fabs(y[o + b] - r1));
                    if (e > worst) worst = e;
                }
        snprintf(name, sizeof name, "rope_ref_%s_%s_hd%d", var ? "fast" : "canonical", mn, hd);
        result(worst < 2e-5, name, "abs error %.3g >= 2e-5 (|x| <= 1)", worst);
    }
    int bad = 0, fast_diff = 0;
    for (int M = 1; M <= 16; M++) {
        int start = (M * 7) % (ROWS - M + 1);
        for (int pi = 0; pi < N_POOLS; pi++) {
            memcpy(y, x + (size_t)start * row, sizeof(float) * M * row);
            ds_rope(DS_CANONICAL, M, n_heads, hd, pos + start, base, mode, y, pools[pi]);
            for (int t = 0; t < M; t++)
                bad += memcmp(y + (size_t)t * row, single + (size_t)(start + t) * row, sizeof(float) * row) != 0;
        }
        memcpy(y, x + (size_t)start * row, sizeof(float) * M * row);
        ds_rope(DS_FAST, M, n_heads, hd, pos + start, base, mode, y, NULL);
        for (int t = 0; t < M; t++)
            fast_diff += memcmp(y + (size_t)t * row, single + (size_t)(start + t) * row, sizeof(float) * row) != 0;
    }
    snprintf(name, sizeof name, "rope_canonical_eq_decode_%s_hd%d", mn, hd);
    result(!bad, name, "%d rows differ from the single-row call", bad);
    snprintf(name, sizeof name, "rope_fast_differs_%s_hd%d", mn, hd);
    result(fast_diff > 0, name, "fast matched decode bitwise on every row");
    free(x); free(single); free(y);
}

static void test_swiglu(int n) {
    char name[128];
    float *g = rand_buf((size_t)ROWS * n, 8.0f), *u = rand_buf((size_t)ROWS * n, 1.0f);
    float *single = xalloc((size_t)ROWS * n), *y = xalloc((size_t)ROWS * n);
    for (int r = 0; r < ROWS; r++)
        ds_swiglu(DS_CANONICAL, 1, n, g + (size_t)r * n, u + (size_t)r * n, single + (size_t)r * n, NULL);
    for (int var = 0; var < 2; var++) {
        ds_swiglu((ds_variant)var, ROWS, n, g, u, y, NULL);
        double worst = 0;
        for (size_t i = 0; i < (size_t)ROWS * n; i++) {
            double gg = g[i], r = gg / (1.0 + exp(-gg)) * u[i];
            double e = fabs(y[i] - r) / (fabs(r) + 1e-30);
            if (e > worst) worst = e;
        }
        snprintf(name, sizeof name, "swiglu_ref_%s_n%d", var ? "fast" : "canonical", n);
        result(worst < 1e-5, name, "relative error %.3g >= 1e-5", worst);
    }
    int bad = 0, fast_diff = 0;
    for (int M = 1; M <= 16; M++) {
        int start = (M * 3) % (ROWS - M + 1);
        for (int pi = 0; pi < N_POOLS; pi++) {
            ds_swiglu(DS_CANONICAL, M, n, g + (size_t)start * n, u + (size_t)start * n, y, pools[pi]);
            for (int t = 0; t < M; t++)
                bad += memcmp(y + (size_t)t * n, single + (size_t)(start + t) * n, sizeof(float) * n) != 0;
        }
        ds_swiglu(DS_FAST, M, n, g + (size_t)start * n, u + (size_t)start * n, y, NULL);
        for (int t = 0; t < M; t++)
            fast_diff += memcmp(y + (size_t)t * n, single + (size_t)(start + t) * n, sizeof(float) * n) != 0;
    }
    snprintf(name, sizeof name, "swiglu_canonical_eq_decode_n%d", n);
    result(!bad, name, "%d rows differ from the single-row call", bad);
    snprintf(name, sizeof name, "swiglu_fast_differs_n%d", n);
    result(fast_diff > 0, name, "fast matched decode bitwise on every row");
    free(g); free(u); free(single); free(y);
}

static void test_swiglu_extremes(void) {
    const float g[] = { -200.0f, -100.0f, -88.0f, -20.0f, -1e-30f, 0.0f, 1e-30f, 20.0f, 88.0f, 100.0f, 1e30f, NAN };
    const int n = (int)(sizeof g / sizeof g[0]);
    float u[16], y[16];
    for (int i = 0; i < n; i++) u[i] = 1.0f;
    int bad = 0;
    for (int var = 0; var < 2; var++) {
        ds_swiglu((ds_variant)var, 1, n, g, u, y, NULL);
        for (int i = 0; i < n - 1; i++) {
            double r = (double)g[i] / (1.0 + exp(-(double)g[i]));
            if (!(fabs(y[i] - r) <= 1e-6 * fabs(r) + 1e-30)) {
                bad++;
                printf("  swiglu %s g=%g got %g want %g\n", var ? "fast" : "canonical", g[i], y[i], r);
            }
        }
        if (!isnan(y[n - 1])) bad++;
    }
    result(!bad, "swiglu_extremes", "%d extreme inputs wrong", bad);
}

/* canonical SwiGLU == its scalar definition with ds_expf, bit for bit, on
 * every element — whatever SIMD level runs it (cli_simd.sh runs this file
 * under each DSPARK_SIMD): random values, the exp's range edges, specials,
 * and a length that leaves a tail past the 16-lane blocks */
static void test_swiglu_exact(void) {
    const float edge[] = { -200.0f, -104.0f, -103.97f, -89.0f, -88.73f, -88.7f, -20.0f, -1e-30f, -0.0f, 0.0f,
                           1e-30f, 1e-45f, 20.0f, 88.7f, 88.73f, 89.0f, 104.0f, 200.0f, 1e30f, -1e30f,
                           INFINITY, -INFINITY, NAN, -NAN };
    const int ne = (int)(sizeof edge / sizeof edge[0]), n = 1000 + 7;
    float *g = rand_buf((size_t)n, 30.0f), *u = rand_buf((size_t)n, 2.0f), *y = xalloc((size_t)n);
    for (int i = 0; i < ne; i++) { g[37 * i] = edge[i]; u[37 * i + 1] = edge[i]; }
    ds_swiglu(DS_CANONICAL, 1, n, g, u, y, NULL);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const float x = g[i];
        const float want = (x / (1.0f + ds_expf(-x))) * u[i];
        if (memcmp(&want, &y[i], 4)) {
            if (bad < 5) printf("  swiglu exact: g=%g u=%g got %a want %a\n", x, u[i], y[i], want);
            bad++;
        }
    }
    result(!bad, "swiglu_canonical_eq_scalar_definition", "%d of %d elements differ", bad, n);
    free(g); free(u); free(y);
}

static void test_residual(int n) {
    char name[128];
    const float eps = 1e-6f;
    float *x = rand_buf((size_t)ROWS * n, 2.0f), *yv = rand_buf((size_t)ROWS * n, 1.0f);
    float *w = rand_buf(n, 1.5f);
    float *sx = xalloc((size_t)ROWS * n), *sn = xalloc((size_t)ROWS * n);
    float *bx = xalloc((size_t)ROWS * n), *bn = xalloc((size_t)ROWS * n);
    double *ref = malloc(sizeof(double) * (size_t)ROWS * n);
    /* decode: each row alone */
    memcpy(sx, x, sizeof(float) * ROWS * n);
    for (int r = 0; r < ROWS; r++)
        ds_residual(DS_CANONICAL, DS_CANONICAL, 1, n, sx + (size_t)r * n, yv + (size_t)r * n, w, eps,
                    sn + (size_t)r * n, NULL);
    for (int r = 0; r < ROWS; r++) {
        double ss = 0;
        for (int i = 0; i < n; i++) {
            double a = (double)(x[(size_t)r * n + i] + yv[(size_t)r * n + i]);
            ss += a * a;
        }
        double sc = 1.0 / sqrt(ss / n + eps);
        for (int i = 0; i < n; i++)
            ref[(size_t)r * n + i] = (double)(x[(size_t)r * n + i] + yv[(size_t)r * n + i]) * sc * w[i];
    }
    int bad = 0, fast_diff = 0, fast_xbad = 0;
    for (int M = 1; M <= 16; M++) {
        int start = (M * 11) % (ROWS - M + 1);
        for (int pi = 0; pi < N_POOLS; pi++) {
            memcpy(bx, x + (size_t)start * n, sizeof(float) * M * n);
            ds_residual(DS_CANONICAL, DS_CANONICAL, M, n, bx, yv + (size_t)start * n, w, eps, bn, pools[pi]);
            for (int t = 0; t < M; t++) {
                bad += memcmp(bx + (size_t)t * n, sx + (size_t)(start + t) * n, sizeof(float) * n) != 0;
                bad += memcmp(bn + (size_t)t * n, sn + (size_t)(start + t) * n, sizeof(float) * n) != 0;
            }
        }
        memcpy(bx, x + (size_t)start * n, sizeof(float) * M * n);
        ds_residual(DS_FAST, DS_CANONICAL, M, n, bx, yv + (size_t)start * n, w, eps, bn, pools[M % N_POOLS]);
        for (int t = 0; t < M; t++) {
            fast_xbad += memcmp(bx + (size_t)t * n, sx + (size_t)(start + t) * n, sizeof(float) * n) != 0;
            fast_diff += memcmp(bn + (size_t)t * n, sn + (size_t)(start + t) * n, sizeof(float) * n) != 0;
        }
    }
    snprintf(name, sizeof name, "residual_canonical_eq_decode_n%d", n);
    result(!bad, name, "%d row outputs differ from the single-row call", bad);
    snprintf(name, sizeof name, "residual_fast_x_eq_canonical_n%d", n);
    result(!fast_xbad, name, "%d rows of x differ from canonical", fast_xbad);
    snprintf(name, sizeof name, "residual_fast_xnorm_differs_n%d", n);
    result(fast_diff > 0, name, "fast xnorm matched decode bitwise on every row");
    for (int var = 0; var < 2; var++) {
        memcpy(bx, x, sizeof(float) * ROWS * n);
        ds_residual((ds_variant)var, DS_CANONICAL, ROWS, n, bx, yv, w, eps, bn, NULL);
        double e = rel_err_rows(bn, ref, ROWS, n);
        snprintf(name, sizeof name, "residual_ref_%s_n%d", var ? "fast" : "canonical", n);
        result(e < 1e-5, name, "relative error %.3g >= 1e-5", e);
    }
    /* canonical residual with a fast norm == add then ds_rmsnorm(FAST) */
    memcpy(bx, x, sizeof(float) * ROWS * n);
    ds_residual(DS_CANONICAL, DS_FAST, ROWS, n, bx, yv, w, eps, bn, pools[2]);
    ds_rmsnorm(DS_FAST, ROWS, n, sx, w, eps, sn, NULL);
    snprintf(name, sizeof name, "residual_vnorm_fast_is_rmsnorm_fast_n%d", n);
    result(!memcmp(bn, sn, sizeof(float) * ROWS * n) && !memcmp(bx, sx, sizeof(float) * ROWS * n),
           name, "canonical add + fast norm is not ds_rmsnorm(FAST) of the sum");
    free(x); free(yv); free(w); free(sx); free(sn); free(bx); free(bn); free(ref);
}

/* the fast variants' exp: accuracy, and exp(-inf) == +0 exactly (fast
 * attention masks keys past a causal prefix with -inf and relies on it) */
static void test_exp_fast(void) {
    double worst = 0;
    for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
        double r = exp((double)x), e = fabs(ds_exp_fast(x) - r) / r;
        if (e > worst) worst = e;
    }
    float z = ds_exp_fast(-INFINITY), inf = ds_exp_fast(INFINITY), o = ds_exp_fast(0.0f);
    int ok = worst < 1e-6 && z == 0.0f && !signbit(z) && isinf(inf) && o == 1.0f &&
             isnan(ds_exp_fast(NAN)) && ds_exp_fast(-200.0f) == 0.0f;
    result(ok, "exp_fast", "rel err %.3g, exp(-inf)=%g exp(inf)=%g exp(0)=%g", worst, z, inf, o);
}

static void test_argmax(void) {
    const float a1[] = { 1, 3, 3, 2 };
    const float a2[] = { NAN, 1, NAN, 1 };
    const float a3[] = { NAN, NAN, NAN };
    const float a4[] = { -INFINITY, -INFINITY };
    const float a5[] = { NAN, -INFINITY, -5 };
    const float a6[] = { INFINITY, NAN, INFINITY };
    const float a7[] = { -0.0f, 0.0f, -1.0f };
    int ok = ds_argmax(a1, 4) == 1 && ds_argmax(a2, 4) == 1 && ds_argmax(a3, 3) == 0 &&
             ds_argmax(a4, 2) == 0 && ds_argmax(a5, 3) == 2 && ds_argmax(a6, 3) == 0 &&
             ds_argmax(a1, 0) == 0 && ds_argmax(a7, 3) == 0;
    result(ok, "argmax_ties_nan", "wrong index for a tie/NaN/empty case");
    /* long rows take the vector path on AVX-512: it must give the scan's
     * index (written out here) for ties, NaNs, signed zeros, infinities and
     * every tail length */
    static const float pal[8] = { 0.0f, -0.0f, 1.0f, -1.0f, 2.0f, NAN, INFINITY, -INFINITY };
    float row[100];
    uint32_t st = 12345u;
    int bad = 0, runs = 0;
    for (int n = 16; n <= 100; n++)
        for (int rep = 0; rep < 40; rep++, runs++) {
            const int span = 1 + rep % 8;     /* small palettes: many ties and all-NaN rows */
            for (int i = 0; i < n; i++) {
                st = st * 1664525u + 1013904223u;
                /* every third row draws from the NaN / inf end of the palette */
                row[i] = pal[((st >> 24) % (uint32_t)span + (rep % 3 == 2 ? 5u : 0u)) % 8u];
            }
            int64_t ref = -1;
            float bv = 0.0f;
            for (int i = 0; i < n; i++)
                if (row[i] == row[i] && (ref < 0 || row[i] > bv)) { ref = i; bv = row[i]; }
            if (ref < 0) ref = 0;
            bad += ds_argmax(row, n) != ref;
        }
    result(bad == 0, "argmax_vector_path", "%d of %d random rows differ from the scan", bad, runs);
}

/* Rope scaling (ds_rope_ext): the identity scaling (freq_scale 1, ext 0,
 * mscale 1) is ds_rope's exact bits; YaRN against a double-precision
 * reference of llama.cpp's rope_yarn on small positions; canonical ==
 * decode for M = 1..16 and every pool; the fast variant differs; the ramp's
 * ends ds_rope_yarn_dims computes for a known shape (n_rot 32, base 160000,
 * original context 64: pairs 0 .. 4). */
static void test_rope_yarn(int n_heads, int hd, ds_rope_mode mode) {
    char name[128];
    const char *mn = mode == DS_ROPE_NEOX ? "neox" : "normal";
    const int row = n_heads * hd;
    const float base = 160000.0f;
    float *x = rand_buf((size_t)ROWS * row, 1.0f);
    float *a = xalloc((size_t)ROWS * row), *b = xalloc((size_t)ROWS * row), *single = xalloc((size_t)ROWS * row);
    int pos[ROWS];
    for (int r = 0; r < ROWS; r++) pos[r] = r < 16 ? r * 5 - 20 : (int)((frand() + 1.0f) * 3000.0f);
    const ds_rope_yarn id = {1.0f, 0.0f, 0.0f, 0.0f, 1.0f, NULL};
    memcpy(a, x, sizeof(float) * ROWS * row);
    memcpy(b, x, sizeof(float) * ROWS * row);
    ds_rope(DS_CANONICAL, ROWS, n_heads, hd, pos, base, mode, a, NULL);
    ds_rope_ext(DS_CANONICAL, ROWS, n_heads, hd, pos, base, mode, &id, b, NULL);
    snprintf(name, sizeof name, "rope_yarn_identity_eq_rope_%s_hd%d", mn, hd);
    result(!memcmp(a, b, sizeof(float) * ROWS * row), name, "the identity scaling moved bits");
    float dims[2];
    ds_rope_yarn_dims(32, 64, base, 32.0f, 1.0f, dims);
    snprintf(name, sizeof name, "rope_yarn_dims_%s_hd%d", mn, hd);
    result(dims[0] == 0.0f && dims[1] == 4.0f, name, "ramp ends %g .. %g, want 0 .. 4", (double)dims[0], (double)dims[1]);
    const ds_rope_yarn y = {0.25f, 1.0f, 1.0f, 9.0f, 1.0f, NULL};
    /* reference: llama.cpp's rope_yarn in double on the small positions */
    memcpy(a, x, sizeof(float) * 16 * row);
    ds_rope_ext(DS_CANONICAL, 16, n_heads, hd, pos, base, mode, &y, a, NULL);
    double worst = 0;
    for (int r = 0; r < 16; r++)
        for (int h = 0; h < n_heads; h++)
            for (int i = 0; i < hd / 2; i++) {
                const int ia = mode == DS_ROPE_NEOX ? i : 2 * i, ib = mode == DS_ROPE_NEOX ? i + hd / 2 : 2 * i + 1;
                const size_t o = (size_t)r * row + (size_t)h * hd;
                const double te = pos[r] * pow((double)base, -2.0 * i / hd), ti = 0.25 * te;
                double ramp = (i - 1.0) / 8.0;
                ramp = 1.0 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
                const double th = ti * (1 - ramp) + te * ramp;
                const double x0 = x[o + ia], x1 = x[o + ib];
                const double e = fmax(fabs(a[o + ia] - (x0 * cos(th) - x1 * sin(th))),
                                      fabs(a[o + ib] - (x0 * sin(th) + x1 * cos(th))));
                if (e > worst) worst = e;
            }
    snprintf(name, sizeof name, "rope_yarn_ref_%s_hd%d", mn, hd);
    result(worst < 2e-5, name, "abs error %.3g >= 2e-5 (|x| <= 1)", worst);
    for (int r = 0; r < ROWS; r++) {
        memcpy(single + (size_t)r * row, x + (size_t)r * row, sizeof(float) * row);
        ds_rope_ext(DS_CANONICAL, 1, n_heads, hd, &pos[r], base, mode, &y, single + (size_t)r * row, NULL);
    }
    int bad = 0, fast_diff = 0, moved = 0;
    memcpy(b, x, sizeof(float) * ROWS * row);
    ds_rope(DS_CANONICAL, ROWS, n_heads, hd, pos, base, mode, b, NULL);
    moved = memcmp(b, single, sizeof(float) * ROWS * row) != 0;
    for (int M = 1; M <= 16; M++) {
        const int start = (M * 7) % (ROWS - M + 1);
        for (int pi = 0; pi < N_POOLS; pi++) {
            memcpy(a, x + (size_t)start * row, sizeof(float) * M * row);
            ds_rope_ext(DS_CANONICAL, M, n_heads, hd, pos + start, base, mode, &y, a, pools[pi]);
            for (int t = 0; t < M; t++) bad += memcmp(a + (size_t)t * row, single + (size_t)(start + t) * row, sizeof(float) * row) != 0;
        }
        memcpy(a, x + (size_t)start * row, sizeof(float) * M * row);
        ds_rope_ext(DS_FAST, M, n_heads, hd, pos + start, base, mode, &y, a, NULL);
        for (int t = 0; t < M; t++) fast_diff += memcmp(a + (size_t)t * row, single + (size_t)(start + t) * row, sizeof(float) * row) != 0;
    }
    snprintf(name, sizeof name, "rope_yarn_canonical_eq_decode_%s_hd%d", mn, hd);
    result(!bad && moved, name, "%d rows differ from the single-row call (scaling moved the rows: %s)", bad, moved ? "yes" : "no");
    snprintf(name, sizeof name, "rope_yarn_fast_differs_%s_hd%d", mn, hd);
    result(fast_diff > 0, name, "fast matched decode bitwise on every row");
    free(x); free(a); free(b); free(single);
}

/* Frequency factors and the dense architectures' rope scaling (qwen3 /
 * llama files: rope_freqs.weight, rope.scaling linear / yarn): for each
 * scaling — factors alone, linear, yarn, yarn with factors — against a
 * double reference of llama.cpp's ggml_rope_cache_init + rope_yarn (theta
 * / ff, then the ramp mix, cos/sin times mscale); canonical == decode for M =
 * 1..16 on every pool (threads 0..3); the cached path (the CPU backend's,
 * ds_rope_cached_ext) == decode; fast differs; the scaling moved the bits
 * (counter-check); all-ones factors with the identity scaling are plain
 * ds_rope's bits. hd 528: 264 pairs, past one 256-pair block. */
static void test_rope_factors(int n_heads, int hd, ds_rope_mode mode) {
    char name[160];
    const char *mn = mode == DS_ROPE_NEOX ? "neox" : "normal";
    const int row = n_heads * hd, half = hd / 2;
    const float base = 500000.0f;
    float *x = rand_buf((size_t)ROWS * row, 1.0f);
    float *a = xalloc((size_t)ROWS * row), *b = xalloc((size_t)ROWS * row), *single = xalloc((size_t)ROWS * row);
    float *plain = xalloc((size_t)ROWS * row);
    float *ff = xalloc((size_t)half), *ones = xalloc((size_t)half);
    int pos[ROWS];
    for (int r = 0; r < ROWS; r++) pos[r] = r < 16 ? r * 37 : (int)((frand() + 1.0f) * 9000.0f);
    for (int i = 0; i < half; i++) {        /* llama3-like: 1, a smooth band, then 8 */
        const float t = (float)i / (float)half;
        ff[i] = t < 0.3f ? 1.0f : t > 0.6f ? 8.0f : 1.0f + 7.0f * (t - 0.3f) / 0.3f;
        ones[i] = 1.0f;
    }
    memcpy(plain, x, sizeof(float) * ROWS * row);
    ds_rope(DS_CANONICAL, ROWS, n_heads, hd, pos, base, mode, plain, NULL);
    /* all-ones factors, identity scaling: plain bits */
    const ds_rope_yarn id1 = {1.0f, 0.0f, 0.0f, 0.0f, 1.0f, ones};
    memcpy(a, x, sizeof(float) * ROWS * row);
    ds_rope_ext(DS_CANONICAL, ROWS, n_heads, hd, pos, base, mode, &id1, a, pools[2]);
    snprintf(name, sizeof name, "rope_factors_ones_eq_rope_%s_hd%d", mn, hd);
    result(!memcmp(a, plain, sizeof(float) * ROWS * row), name, "all-ones factors moved bits");
    float dims[2];
    ds_rope_yarn_dims(hd, 4096, base, 32.0f, 1.0f, dims);
    const float fs = 1.0f / 4.0f, mag = 1.0f + 0.1f * 1.3862944f;
    const ds_rope_yarn cases[4] = {
        {1.0f, 0.0f, 0.0f, 0.0f, 1.0f, ff},                    /* llama 3.1: factors alone */
        {0.125f, 0.0f, 0.0f, 0.0f, 1.0f, NULL},                /* linear, factor 8 */
        {fs, 1.0f, dims[0], dims[1], mag, NULL},               /* qwen3 yarn, factor 4 */
        {fs, 1.0f, dims[0], dims[1], mag, ff},                 /* yarn with factors */
    };
    const char *cn[4] = {"ff", "linear", "yarn", "yarn_ff"};
    for (int c = 0; c < 4; c++) {
        const ds_rope_yarn *y = &cases[c];
        /* the double reference on the small positions */
        memcpy(a, x, sizeof(float) * 16 * row);
        ds_rope_ext(DS_CANONICAL, 16, n_heads, hd, pos, base, mode, y, a, NULL);
        double worst = 0;
        for (int r = 0; r < 16; r++)
            for (int h = 0; h < n_heads; h++)
                for (int i = 0; i < half; i++) {
                    const int ia = mode == DS_ROPE_NEOX ? i : 2 * i, ib = mode == DS_ROPE_NEOX ? i + half : 2 * i + 1;
                    const size_t o = (size_t)r * row + (size_t)h * hd;
                    double te = pos[r] * pow((double)base, -2.0 * i / hd);
                    if (y->freq_factors) te /= y->freq_factors[i];
                    const double ti = y->freq_scale * te;
                    double th = ti;
                    if (y->ext_factor != 0.0f) {
                        double rr = (i - (double)y->lo) / fmax(0.001, (double)y->hi - y->lo);
                        rr = 1.0 - (rr < 0 ? 0 : rr > 1 ? 1 : rr);
                        th = ti * (1 - rr) + te * rr;
                    }
                    const double x0 = x[o + ia], x1 = x[o + ib], m = y->mscale;
                    const double e = fmax(fabs(a[o + ia] - m * (x0 * cos(th) - x1 * sin(th))),
                                          fabs(a[o + ib] - m * (x0 * sin(th) + x1 * cos(th))));
                    if (e > worst) worst = e;
                }
        snprintf(name, sizeof name, "rope_%s_ref_%s_hd%d", cn[c], mn, hd);
        /* angles up to ~555 rad: a float angle's rounding is ~3e-5 there */
        result(worst < 2e-4, name, "abs error %.3g >= 2e-4 (|x| <= 1)", worst);
        for (int r = 0; r < ROWS; r++) {
            memcpy(single + (size_t)r * row, x + (size_t)r * row, sizeof(float) * row);
            ds_rope_ext(DS_CANONICAL, 1, n_heads, hd, &pos[r], base, mode, y, single + (size_t)r * row, NULL);
        }
        const int moved = memcmp(plain, single, sizeof(float) * ROWS * row) != 0;
        int bad = 0, fast_diff = 0, cbad = 0;
        for (int M = 1; M <= 16; M++) {
            const int start = (M * 7) % (ROWS - M + 1);
            for (int pi = 0; pi < N_POOLS; pi++) {
                memcpy(a, x + (size_t)start * row, sizeof(float) * M * row);
                ds_rope_ext(DS_CANONICAL, M, n_heads, hd, pos + start, base, mode, y, a, pools[pi]);
                for (int t = 0; t < M; t++) bad += memcmp(a + (size_t)t * row, single + (size_t)(start + t) * row, sizeof(float) * row) != 0;
            }
            memcpy(a, x + (size_t)start * row, sizeof(float) * M * row);
            ds_rope_ext(DS_FAST, M, n_heads, hd, pos + start, base, mode, y, a, NULL);
            for (int t = 0; t < M; t++) fast_diff += memcmp(a + (size_t)t * row, single + (size_t)(start + t) * row, sizeof(float) * row) != 0;
        }
        /* the cache: two passes (fill, read), positions inside and past it */
        enum { NPOS = 4096 };
        float *tab = xalloc((size_t)NPOS * hd);
        unsigned char *done = calloc(NPOS, 1);
        for (int pass = 0; pass < 2; pass++) {
            memcpy(b, x, sizeof(float) * ROWS * row);
            ds_rope_cached_ext(ROWS, n_heads, hd, pos, base, mode, y, b, tab, done, NPOS, pools[1 + pass]);
            cbad += memcmp(b, single, sizeof(float) * ROWS * row) != 0;
        }
        free(tab); free(done);
        snprintf(name, sizeof name, "rope_%s_canonical_eq_decode_%s_hd%d", cn[c], mn, hd);
        result(!bad && moved, name, "%d rows differ from the single-row call (the scaling moved the rows: %s)", bad,
               moved ? "yes" : "no");
        snprintf(name, sizeof name, "rope_%s_cached_eq_decode_%s_hd%d", cn[c], mn, hd);
        result(!cbad, name, "%d of 2 cache passes differ from decode", cbad);
        snprintf(name, sizeof name, "rope_%s_fast_differs_%s_hd%d", cn[c], mn, hd);
        result(fast_diff > 0, name, "fast matched decode bitwise on every row");
    }
    /* NULL scaling through ds_rope_ext and the cache: plain ds_rope's bits */
    memcpy(a, x, sizeof(float) * ROWS * row);
    ds_rope_ext(DS_CANONICAL, ROWS, n_heads, hd, pos, base, mode, NULL, a, pools[3]);
    snprintf(name, sizeof name, "rope_ext_null_eq_rope_%s_hd%d", mn, hd);
    result(!memcmp(a, plain, sizeof(float) * ROWS * row), name, "ds_rope_ext(NULL) moved bits");
    free(x); free(a); free(b); free(single); free(plain); free(ff); free(ones);
}

int main(void) {
    pools[0] = NULL;
    for (int i = 1; i < N_POOLS; i++) {
        pools[i] = ds_pool_new(i);
        if (!pools[i]) { printf("FAIL pool_new: %d threads\n", i); return 1; }
    }
    attn_case cases[] = {
        { { 8, 2, 64, 2 * 64, 0.125f }, "gqa8x2_hd64" },
        { { 4, 4, 72, 4 * 72 + 8, 1.0f / sqrtf(72.0f) }, "mha4_hd72_stride" },
        { { 6, 1, 16, 16, 0.25f }, "mqa6_hd16" },
        /* the AVX2 p.V pass over several rows at once (attention.c: rows of
         * one chunk length share it while the queries fit ATTN_PV_Q): two
         * GQA heads per row (two rows a pass), one (four rows a pass) */
        { { 8, 4, 128, 4 * 128, 0.088388f }, "gqa8x4_hd128" },
        { { 4, 4, 32, 4 * 32 + 16, 0.176777f }, "mha4_hd32_stride" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_attention_case(&cases[i]);
    int ns[] = { 64, 72, 100, 2048 };
    for (int i = 0; i < 4; i++) test_rmsnorm(ns[i]);
    test_rope(4, 64, DS_ROPE_NEOX);
    test_rope(4, 64, DS_ROPE_NORMAL);
    test_rope(2, 128, DS_ROPE_NEOX);
    test_rope(2, 128, DS_ROPE_NORMAL);
    test_rope_yarn(4, 64, DS_ROPE_NORMAL);
    test_rope_yarn(2, 32, DS_ROPE_NEOX);
    test_rope_factors(4, 64, DS_ROPE_NORMAL);
    test_rope_factors(2, 128, DS_ROPE_NEOX);
    test_rope_factors(1, 528, DS_ROPE_NEOX);
    test_rope_cached(4, 64, DS_ROPE_NEOX);
    test_rope_cached(2, 128, DS_ROPE_NORMAL);
    test_swiglu(100);
    test_swiglu(4096 + 37);
    test_swiglu_extremes();
    test_swiglu_exact();
    test_residual(100);
    test_residual(1024);
    test_argmax();
    test_exp_fast();
    if (!getenv("DSPARK_SAN")) { time_attention(8); time_attention(2); }
    for (int i = 1; i < N_POOLS; i++) ds_pool_free(pools[i]);
    /* the same on every SIMD path and build (tests/…: compare across builds) */
    printf("INFO canonical attention digest %016llx\n", (unsigned long long)canon_digest);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
