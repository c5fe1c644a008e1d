/* moe_route.c — the mixture-of-experts router family: router logits in,
 * each row's k experts and their weights out (qwen3moe / qwen35moe's FFN:
 * softmax gating, top-k, optional renormalisation of the k weights), and
 * the combine of a row's k expert outputs (ds_moe_combine, at the end: no
 * variants, the CPU backend's moe_combine and the CUDA kernel's reference).
 *
 * Why it is a family: the expert choice is a discrete function of floats.
 * Two router logits a few ulp apart are exactly where a batched and a
 * sequential run pick different experts when their softmax is computed
 * differently — and a different expert is a different FFN, not a last-bit
 * difference. So the whole route (softmax, selection, weights) must be one
 * function of the row alone.
 *
 *   decode     route_row(): m = the row's max (NaNs skipped), e_i =
 *              ds_expf(l_i - m) (kernels/dsmath.h: the same bits on every
 *              device), s = e_0 + e_1 + ... in expert order, p_i = e_i / s
 *              (IEEE division); the k largest p_i, one pass each, ties to the
 *              lower expert index, NaN below every number; weights p_j, or
 *              with renormalisation p_j / (p_j1 + ... + p_jk) summed in
 *              selection order.
 *   canonical  route_row() for every row: a row's experts and weights depend
 *              on its logits alone, never on M, its neighbours or threads.
 *   fast       what a throughput kernel does: the polynomial exp
 *              (ds_exp_fast), the sum in four interleaved partial sums,
 *              p_i = e_i * (1 / s), selection on those p, and the
 *              renormalisation as a multiply by the reciprocal. Logits a few
 *              ulp apart (or equal probabilities after rounding) can then
 *              order differently than in decode: the expert flips that
 *              `--fast moe_route` shows in the diagnostics.
 * With a gating function (ds_moe_route_ex, deepseek4's sqrtsoftplus):
 *   decode     route_row_sp(): p_i = sqrtf(softplus(l_i)) with softplus in
 *              double (ds_exp, ds_log, rounded once to float), selection on
 *              p_i + bias_i as above (or the hash layer's fixed experts),
 *              weights the unbiased p, the sum in selection order clamped
 *              below at 6.103515625e-5, IEEE divisions, then the scale.
 *   canonical  route_row_sp() for every row.
 *   fast       softplus from ds_exp_fast in float, the renormalisation and
 *              the scale as one multiply by scale / sum: near-tied scores can
 *              order differently and every weight's last bits move.
 * The matmuls around the route (router logits, the experts' gate/up/down)
 * are matmul families; grouping the rows by expert only decides which rows
 * share a weight read, each row's arithmetic is the decode matmul's. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"
#include "kernels/dsmath.h"

#include <math.h>

/* a ranks above b: larger probability, then lower index; NaN below all */
static inline int ranks_above(float a, int ia, float b, int ib) {
    if (isnan(a)) return isnan(b) && ia < ib;
    if (isnan(b)) return 1;
    return a > b || (a == b && ia < ib);
}

/* k passes over the row: pass j takes the best expert not yet taken (k is
 * small: 8 of 128 for Qwen3-30B-A3B, so k*n compares beat a sort). */
static void select_topk(int n, int k, const float *p, int32_t *ids, float *w) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            int taken = 0;
            for (int q = 0; q < j && !taken; q++) taken = ids[q] == i;
            if (taken) continue;
            if (best < 0 || ranks_above(p[i], i, p[best], best)) best = i;
        }
        ids[j] = best;
        w[j] = p[best];
    }
}

/* ========================================================================
 * DECODE — the one per-row instruction sequence
 * ======================================================================== */
static void route_row(int n, int k, int norm, const float *l, float *p, int32_t *ids, float *w) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (l[i] > m) m = l[i];
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        p[i] = ds_expf(l[i] - m);
        s += p[i];
    }
    for (int i = 0; i < n; i++) p[i] = p[i] / s;
    select_topk(n, k, p, ids, w);
    if (norm) {
        float t = 0.0f;
        for (int j = 0; j < k; j++) t += w[j];
        for (int j = 0; j < k; j++) w[j] = w[j] / t;
    }
}

/* ========================================================================
 * FAST — its own exp, sum order and reciprocals
 * ======================================================================== */
static void route_row_fast(int n, int k, int norm, const float *l, float *p, int32_t *ids, float *w) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (l[i] > m) m = l[i];
    float s4[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    for (int i = 0; i < n; i++) {
        p[i] = ds_exp_fast(l[i] - m);
        s4[i & 3] += p[i];
    }
    const float r = 1.0f / ((s4[0] + s4[1]) + (s4[2] + s4[3]));
    for (int i = 0; i < n; i++) p[i] = p[i] * r;
    select_topk(n, k, p, ids, w);
    if (norm) {
        float t = 0.0f;
        for (int j = 0; j < k; j++) t += w[j];
        const float rt = 1.0f / t;
        for (int j = 0; j < k; j++) w[j] = w[j] * rt;
    }
}

/* ========================================================================
 * sqrtsoftplus gating (deepseek4): DECODE and FAST
 * ======================================================================== */
static void route_row_sp(int n, int k, const ds_moe_gating *g, const float *l, const int32_t *fixed, float *p,
                         float *sel, int32_t *ids, float *w, int fast) {
    for (int i = 0; i < n; i++) {
        const float x = l[i];
        float sp;
        if (x > 20.0f) sp = x;
        else if (fast) sp = (float)ds_log((double)(1.0f + ds_exp_fast(x)));
        else sp = (float)ds_log(1.0 + ds_exp((double)x));
        p[i] = sqrtf(sp);
        sel[i] = g->bias ? p[i] + g->bias[i] : p[i];
    }
    if (fixed) {
        for (int j = 0; j < k; j++) ids[j] = fixed[j] >= 0 && fixed[j] < n ? fixed[j] : 0;
    } else {
        select_topk(n, k, sel, ids, w);
    }
    for (int j = 0; j < k; j++) w[j] = p[ids[j]];
    float t = 1.0f;
    if (g->norm) {
        t = 0.0f;
        for (int j = 0; j < k; j++) t += w[j];
        if (!(t >= 6.103515625e-5f)) t = 6.103515625e-5f;
    }
    const int scaled = g->scale != 0.0f && g->scale != 1.0f;
    if (fast) {
        const float f = (scaled ? g->scale : 1.0f) / t;
        for (int j = 0; j < k; j++) w[j] = w[j] * f;
        return;
    }
    if (g->norm)
        for (int j = 0; j < k; j++) w[j] = w[j] / t;
    if (scaled)
        for (int j = 0; j < k; j++) w[j] = w[j] * g->scale;
}

/* ========================================================================
 * entry
 * ======================================================================== */
int ds_moe_route(ds_variant v, int rows, int n_expert, int k, int norm, const float *logits, float *scratch,
                 int32_t *ids, float *weights) {
    if (rows < 0 || n_expert < 1 || k < 1 || k > n_expert || !scratch) return -1;
    for (int r = 0; r < rows; r++) {
        const float *l = logits + (size_t)r * (size_t)n_expert;
        int32_t *id = ids + (size_t)r * (size_t)k;
        float *w = weights + (size_t)r * (size_t)k;
        if (v == DS_FAST) route_row_fast(n_expert, k, norm, l, scratch, id, w);
        else route_row(n_expert, k, norm, l, scratch, id, w);
    }
    return 0;
}

int ds_moe_route_ex(ds_variant v, int rows, int n_expert, int k, const ds_moe_gating *g, const float *logits,
                    float *scratch, int32_t *ids, float *weights) {
    if (!g || g->func == DS_MOE_SOFTMAX)
        return g && (g->bias || g->fixed || (g->scale != 0.0f && g->scale != 1.0f))
                   ? -1 : ds_moe_route(v, rows, n_expert, k, g ? g->norm : 1, logits, scratch, ids, weights);
    if (g->func != DS_MOE_SQRT_SOFTPLUS || rows < 0 || n_expert < 1 || k < 1 || k > n_expert || !scratch) return -1;
    for (int r = 0; r < rows; r++)
        route_row_sp(n_expert, k, g, logits + (size_t)r * (size_t)n_expert, g->fixed ? g->fixed + (size_t)r * k : NULL,
                     scratch, scratch + n_expert, ids + (size_t)r * (size_t)k, weights + (size_t)r * (size_t)k,
                     v == DS_FAST);
    return 0;
}

/* ========================================================================
 * combine: a row's k expert outputs in rank order (backend.h moe_combine)
 * ======================================================================== */
/* No variants: one rounded product and one rounded sum a term, in the order
 * the route ranked the experts, then the shared expert (gated by
 * ds_sigmoidf, or ungated) added last. The CPU backend's moe_combine, and
 * the reference the CUDA kernel (kernels/cuda/moe.cu) is held to. */
void ds_moe_combine(int M, int k, int n, const int32_t *slot, const float *w, const float *y, const float *sh_gate,
                    const float *sh, float *out) {
    for (int r = 0; r < M; r++) {
        float *o = out + (size_t)r * n;
        const float *y0 = y + (slot ? (size_t)slot[(size_t)r * k] : (size_t)r * k) * n;
        const float w0 = w[(size_t)r * k];
        for (int i = 0; i < n; i++) o[i] = w0 * y0[i];
        for (int j = 1; j < k; j++) {
            const float *yj = y + (slot ? (size_t)slot[(size_t)r * k + j] : (size_t)r * k + j) * n;
            const float wj = w[(size_t)r * k + j];
            for (int i = 0; i < n; i++) {
                const float t = wj * yj[i];
                o[i] = o[i] + t;
            }
        }
        if (sh && sh_gate) {
            const float s = ds_sigmoidf(sh_gate[r]);
            const float *shr = sh + (size_t)r * n;
            for (int i = 0; i < n; i++) {
                const float t = shr[i] * s;
                o[i] = o[i] + t;
            }
        } else if (sh) {
            const float *shr = sh + (size_t)r * n;
            for (int i = 0; i < n; i++) o[i] = o[i] + shr[i];
        }
    }
}
