/* hc_pre.c — the hc_pre family: DeepSeek V4's hyper-connection mixing in
 * front of a sub-block (llama.cpp deepseek4's build_hc_pre / build_hc_head).
 *
 * The residual stream of a row is hc streams of d floats. The layer first
 * norms the flattened streams (rmsnorm family) and projects them with
 * hc_*_fn (a matmul family) into n_mix mixing logits; this family turns
 * those logits into the mixing weights and the sub-block's input:
 *   pre[h]  = sigmoid(mix[h] * scale[0] + base[h]) + eps
 *   post[h] = 2 * sigmoid(mix[hc + h] * scale[1] + base[hc + h])
 *   comb    = Sinkhorn(mix[2hc + src*hc + dst] * scale[2] + base[...]):
 *             a softmax over dst for each src, + eps, a column
 *             normalisation (over src, + eps in the sum), then iters - 1
 *             times a row (over dst) and a column normalisation
 *   y[i]    = pre[0] x[0][i] + pre[1] x[1][i] + ... (stream order)
 * With n_mix == hc (the output head) only pre and y are made (scale[0]).
 *
 *   decode     hc_row(): ds_sigmoidf, ds_expf; every sum in index order
 *              with the eps added last; IEEE divisions; the y sum a
 *              rounded product then an add per stream, in stream order.
 *   canonical  hc_row() for every row, rows split over threads: a row's
 *              weights and output depend on its own logits and streams.
 *   fast       the polynomial exp in the sigmoids and the softmax, each
 *              normalisation as a multiply by the reciprocal of its sum,
 *              and y accumulated by fmaf.
 * Why the bits differ: ds_exp_fast is not ds_expf (a different polynomial);
 * x * (1/s) is not x / s; fmaf rounds once where decode rounds twice. The
 * Sinkhorn iterations amplify a last-bit difference in comb into its
 * neighbours, which is why this is a family of its own and not a detail of
 * the matmul in front of it. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"
#include "kernels/dsmath.h"

#include <math.h>

typedef struct {
    int hc, d, n_mix, iters;
    const float *x, *mix, *scale, *base;
    float eps;
    float *y, *post, *comb;
} hcp_args;

static inline float sig_fast(float t) { return 1.0f / (1.0f + ds_exp_fast(-t)); }

/* ========================================================================
 * DECODE — the one per-row instruction sequence (fast: the same steps
 * with the fast primitives, selected by `fast`)
 * ======================================================================== */
static void hc_row(const hcp_args *a, int64_t r, int fast) {
    const int hc = a->hc, d = a->d;
    const float *mx = a->mix + (size_t)r * (size_t)a->n_mix, *x = a->x + (size_t)r * (size_t)hc * (size_t)d;
    float pre[DS_HC_MAX];
    for (int h = 0; h < hc; h++) {
        const float t = mx[h] * a->scale[0] + a->base[h];
        pre[h] = (fast ? sig_fast(t) : ds_sigmoidf(t)) + a->eps;
    }
    if (a->n_mix > hc) {
        float *post = a->post + (size_t)r * hc, *c = a->comb + (size_t)r * hc * hc;
        for (int h = 0; h < hc; h++) {
            const float t = mx[hc + h] * a->scale[1] + a->base[hc + h];
            post[h] = 2.0f * (fast ? sig_fast(t) : ds_sigmoidf(t));
        }
        for (int i = 0; i < hc * hc; i++) c[i] = mx[2 * hc + i] * a->scale[2] + a->base[2 * hc + i];
        /* softmax over dst (the fast index) for each src, then + eps */
        for (int src = 0; src < hc; src++) {
            float *cr = c + (size_t)src * hc, m = -INFINITY, s = 0.0f;
            for (int dst = 0; dst < hc; dst++) if (cr[dst] > m) m = cr[dst];
            for (int dst = 0; dst < hc; dst++) {
                cr[dst] = fast ? ds_exp_fast(cr[dst] - m) : ds_expf(cr[dst] - m);
                s = s + cr[dst];
            }
            const float rs = 1.0f / s;
            for (int dst = 0; dst < hc; dst++) cr[dst] = (fast ? cr[dst] * rs : cr[dst] / s) + a->eps;
        }
        for (int it = 0; it < a->iters; it++) {
            if (it > 0)   /* rows: over dst, for each src */
                for (int src = 0; src < hc; src++) {
                    float *cr = c + (size_t)src * hc, s = 0.0f;
                    for (int dst = 0; dst < hc; dst++) s = s + cr[dst];
                    s = s + a->eps;
                    const float rs = 1.0f / s;
                    for (int dst = 0; dst < hc; dst++) cr[dst] = fast ? cr[dst] * rs : cr[dst] / s;
                }
            /* columns: over src, for each dst */
            for (int dst = 0; dst < hc; dst++) {
                float s = 0.0f;
                for (int src = 0; src < hc; src++) s = s + c[(size_t)src * hc + dst];
                s = s + a->eps;
                const float rs = 1.0f / s;
                for (int src = 0; src < hc; src++)
                    c[(size_t)src * hc + dst] = fast ? c[(size_t)src * hc + dst] * rs : c[(size_t)src * hc + dst] / s;
            }
        }
    }
    float *y = a->y + (size_t)r * (size_t)d;
    if (fast) {
        for (int i = 0; i < d; i++) {
            float t = x[i] * pre[0];
            for (int h = 1; h < hc; h++) t = fmaf(x[(size_t)h * d + i], pre[h], t);
            y[i] = t;
        }
    } else {
        for (int i = 0; i < d; i++) {
            float t = x[i] * pre[0];
            for (int h = 1; h < hc; h++) t = t + x[(size_t)h * d + i] * pre[h];
            y[i] = t;
        }
    }
}

/* ========================================================================
 * CANONICAL / FAST — rows over threads
 * ======================================================================== */
static void hcp_canon_range(void *arg, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) hc_row(arg, r, 0);
}
static void hcp_fast_range(void *arg, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) hc_row(arg, r, 1);
}

/* ========================================================================
 * entry
 * ======================================================================== */
int ds_hc_pre(ds_variant v, int rows, int hc, int d, int n_mix, const float *x, const float *mix, const float *scale,
              const float *base, float eps, int iters, float *y, float *post, float *comb, ds_pool *pool) {
    if (rows < 0 || hc < 1 || hc > DS_HC_MAX || d < 1 || (n_mix != hc && n_mix != (2 + hc) * hc) || iters < 1 ||
        (n_mix > hc && (!post || !comb)))
        return -1;
    hcp_args a = {hc, d, n_mix, iters, x, mix, scale, base, eps, y, post, comb};
    ds_pool_for(pool, rows, 1, v == DS_FAST ? hcp_fast_range : hcp_canon_range, &a);
    return 0;
}
