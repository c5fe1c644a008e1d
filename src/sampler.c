/* sampler.c — deterministic token selection: greedy argmax, or Gumbel-max
 * with Philox-4x32-10 noise keyed on (seed, position, token id).
 *
 * Everything is a pure function of (sampler, logits, pos): no hidden state,
 * so plain decoding, the verifier and the drafter draw identical tokens from
 * identical logits. */
#include "sampler.h"
#include "kernels/kernels.h"
#include "kernels/dsmath.h"
#include "kernels/cpu/exp_many.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- Philox-4x32-10 (Salmon et al., SC'11; Random123 reference layout) --- */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void ds_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += PHILOX_W0; k1 += PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

static inline double u53(uint32_t lo, uint32_t hi) {
    uint64_t x = ((uint64_t)hi << 32) | lo;
    return ((double)(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);    /* strictly in (0,1) */
}

static inline void philox_pair(uint64_t seed, int64_t pos, uint32_t pair, double *u_even, double *u_odd) {
    uint64_t up = (uint64_t)pos;
    const uint32_t ctr[4] = { (uint32_t)up, (uint32_t)(up >> 32), pair, 0 };
    const uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
    uint32_t o[4];
    ds_philox4x32_10(ctr, key, o);
    *u_even = u53(o[0], o[1]);
    *u_odd = u53(o[2], o[3]);
}

double ds_philox_uniform(uint64_t seed, int64_t pos, uint32_t i) {
    double a, b;
    philox_pair(seed, pos, i >> 1, &a, &b);
    return (i & 1) ? b : a;
}

/* Gumbel noise with the project-owned log (kernels/dsmath.h): the same bits
 * with every C library, and on the CUDA backend's sample op */
static inline double gumbel(double u) { return -ds_log(-ds_log(u)); }

/* ---- candidates: (processed logit, id) with a strict total order -------- */
typedef struct {
    float   x;
    int32_t id;
} cand;

/* a before b: larger x first, then lower id */
static inline int cand_before(const cand *a, const cand *b) {
    return a->x > b->x || (a->x == b->x && a->id < b->id);
}
static int cand_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (cand_before(a, b)) return -1;
    if (cand_before(b, a)) return 1;
    return 0;
}

/* Partial selection: afterwards c[0..k) are the k first elements of the
 * order (in some order). Deterministic (median-of-three pivot). */
static void select_k(cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        /* median of three into c[hi] as the pivot */
        if (cand_before(&c[mid], &c[lo])) { cand t = c[mid]; c[mid] = c[lo]; c[lo] = t; }
        if (cand_before(&c[hi], &c[lo])) { cand t = c[hi]; c[hi] = c[lo]; c[lo] = t; }
        if (cand_before(&c[mid], &c[hi])) { cand t = c[mid]; c[mid] = c[hi]; c[hi] = t; }
        cand piv = c[hi];
        int s = lo;
        for (int i = lo; i < hi; i++)
            if (cand_before(&c[i], &piv)) { cand t = c[i]; c[i] = c[s]; c[s] = t; s++; }
        cand t = c[s]; c[s] = c[hi]; c[hi] = t;
        if (s == k - 1 || s == k) return;     /* c[0..s) all precede c[s] */
        if (s < k) lo = s + 1; else hi = s - 1;
    }
}

/* Nucleus over c[0..n): returns the kept count; c[0..kept) are then the
 * kept tokens. Mass is softmax over the n candidates (double). */
static int top_p_keep(cand *c, int n, float top_p) {
    if (n <= 1) return n;
    float m = -INFINITY;
    for (int i = 0; i < n; i++) if (c[i].x > m) m = c[i].x;
    if (m == -INFINITY) return n;
    if (!(top_p > 0.0f)) {                       /* degenerate: the single best token */
        select_k(c, n, 1);
        return 1;
    }
    /* Z in index order; the exponentials a block at a time (ds_exp_many:
     * the same bits as ds_exp, vectorized), the sum one term at a time */
    double Z = 0.0;
    for (int i0 = 0; i0 < n; i0 += 256) {
        double e[256];
        const int bn = n - i0 < 256 ? n - i0 : 256;
        for (int i = 0; i < bn; i++) e[i] = (double)c[i0 + i].x - (double)m;
        ds_exp_many(e, e, bn);
        for (int i = 0; i < bn; i++) Z += e[i];
    }
    const double target = (double)top_p * Z;
    /* Shrink the sort to the tokens with p >= thr*pmax whose mass is safely
     * enough; the sorted prefix that reaches `target` lies inside that set.
     * If rounding leaves it short, widen (thr -> 0 = everything). */
    static const double thr[] = { 1.0 / 16, 1.0 / 256, 1.0 / 65536, 1e-9, 1e-18, 0.0 };
    /* below[t]: ln(thr[t]) less a margin of 1e-6. A token with x - m below
     * it has exp(x - m) < thr[t] * (1 - 1e-6), which ds_exp (within a few
     * ulps of exp) cannot round up to thr[t]: it is not kept, so its
     * ds_exp is skipped — the kept set, its order and its mass are the
     * same, only the ~V calls for the tokens far below the best are saved. */
    static const double below[] = { -2.772589722239781, -5.545178444479562, -11.090355888959125,
                                    -20.723266836946410, -41.446532673892820, -INFINITY };
    for (size_t t = 0; t < sizeof thr / sizeof thr[0]; t++) {
        double lim = thr[t];
        double mass = 0.0;
        int s = 0;
        for (int i = 0; i < n; i++) {
            const double dx = (double)c[i].x - (double)m;
            if (dx < below[t]) continue;
            double p = ds_exp(dx);
            if (p >= lim) { mass += p; cand tmp = c[i]; c[i] = c[s]; c[s] = tmp; s++; }
        }
        if (lim > 0.0 && mass < target * (1.0 + 1e-9) + 1e-300) continue;
        qsort(c, (size_t)s, sizeof *c, cand_cmp);
        double cum = 0.0;
        for (int i = 0; i < s; i++) {
            cum += ds_exp((double)c[i].x - (double)m);
            if (cum >= target) return i + 1;
        }
        if (lim == 0.0) return n;                 /* rounding: keep everything */
    }
    return n;
}

/* min-p over c[0..n): keep the tokens whose probability ratio to the best
 * one, exp(x_i - x_max) in double, is at least min_p. The best token always
 * satisfies it (ratio 1 >= min_p for min_p <= 1). Returns the kept count;
 * c[0..kept) are then the kept tokens (order is irrelevant: the final
 * Gumbel argmax breaks ties by id). */
static int min_p_keep(cand *c, int n, float min_p) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) if (c[i].x > m) m = c[i].x;
    if (m == -INFINITY) return n;
    int s = 0;
    for (int i = 0; i < n; i++)
        if (ds_exp((double)c[i].x - (double)m) >= (double)min_p) { cand t = c[i]; c[i] = c[s]; c[s] = t; s++; }
    return s;
}

int32_t ds_sample(const ds_sampler *s, const float *logits, int V, int64_t pos, float *scratch) {
    if (V <= 0) return -1;
    if (!s || !(s->temp > 0.0f)) return (int32_t)ds_argmax(logits, V);
    const float t = s->temp;                    /* x = logit / t, as documented */
    const int use_k = s->top_k > 0 && s->top_k < V;
    const int use_p = s->top_p < 1.0f;
    const int use_m = s->min_p > 0.0f;          /* off (0): every path below is unchanged */
    int32_t best = -1;
    double best_score = -INFINITY;
    if (!use_k && !use_p && !use_m) {
        /* every token competes: one Philox block per pair of ids. A token
         * whose x is more than G_SPAN below the best x can never win (the
         * noise lies in [-3.62, 37.43] for u in [2^-54, 1 - 2^-54]), so its
         * draw is skipped: the result is unchanged, only faster. */
        const double G_SPAN = 42.0;
        float xmax = -INFINITY;
        for (int i = 0; i < V; i++) {
            float l = logits[i];
            if (l == l && l / t > xmax) xmax = l / t;
        }
        const double lim = (double)xmax - G_SPAN;
        for (int i = 0; i < V; i += 2) {
            int live = 0;
            for (int j = 0; j < 2 && i + j < V; j++) {
                float l = logits[i + j];
                live |= l == l && (double)(l / t) >= lim;
            }
            if (!live) continue;
            double ue, uo;
            philox_pair(s->seed, pos, (uint32_t)i >> 1, &ue, &uo);
            for (int j = 0; j < 2 && i + j < V; j++) {
                float l = logits[i + j];
                if (l != l) continue;                                  /* NaN never wins */
                float x = l / t;
                if (x == -INFINITY || (double)x < lim) continue;
                double sc = (double)x + gumbel(j ? uo : ue);
                if (sc > best_score) { best_score = sc; best = i + j; }
            }
        }
        return best >= 0 ? best : (int32_t)ds_argmax(logits, V);
    }
    cand *c = scratch ? (cand *)(void *)scratch : malloc((size_t)V * sizeof(cand));
    if (!c) return -1;
    for (int i = 0; i < V; i++) {
        float l = logits[i];
        c[i].x = l != l ? -INFINITY : l / t;
        c[i].id = i;
    }
    int n = V;
    if (use_k) { select_k(c, V, s->top_k); n = s->top_k; }
    if (use_p) n = top_p_keep(c, n, s->top_p);
    if (use_m) n = min_p_keep(c, n, s->min_p);
    for (int i = 0; i < n; i++) {
        if (c[i].x == -INFINITY) continue;
        double sc = (double)c[i].x + gumbel(ds_philox_uniform(s->seed, pos, (uint32_t)c[i].id));
        if (sc > best_score || (sc == best_score && c[i].id < best)) { best_score = sc; best = c[i].id; }
    }
    if (!scratch) free(c);
    return best >= 0 ? best : (int32_t)ds_argmax(logits, V);
}
