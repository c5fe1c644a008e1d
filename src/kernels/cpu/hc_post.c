/* hc_post.c — the hc_post family: DeepSeek V4's hyper-connection update
 * after a sub-block (llama.cpp deepseek4's build_hc_post): the new stream
 * dst of a row is the sub-block's output f scaled by post[dst] plus every
 * old stream mixed by comb,
 *   out[dst][i] = f[i] * post[dst] + sum_src res[src][i] * comb[src*hc + dst]
 * (post and comb from the hc_pre family of the same sub-block). This is the
 * seed's "HC tail": the residual the next sub-block reads.
 *
 *   decode     post_row(): per element the hc old values are read first (so
 *              out may be res: the update runs in place), then for each dst
 *              t = f * post, and t = t + res[src] * comb for src = 0, 1, ...
 *              (a rounded product, then an add: llama.cpp's graph order).
 *   canonical  post_row() for every row, rows split over threads.
 *   fast       the fused form a tail kernel writes: the mixed residual by a
 *              fmaf chain from the last stream down, then fmaf(f, post, mix).
 * Why the bits differ: fmaf rounds once where decode rounds each product
 * and each sum; the residual terms are summed in the opposite order and the
 * f * post term comes last instead of first. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"

#include <math.h>

typedef struct {
    int hc, d;
    const float *f, *res, *post, *comb;
    float *out;
} hcq_args;

/* ========================================================================
 * DECODE — the one per-row instruction sequence
 * ======================================================================== */
static void post_row(const hcq_args *a, int64_t r, int fast) {
    const int hc = a->hc, d = a->d;
    const float *f = a->f + (size_t)r * d, *res = a->res + (size_t)r * hc * d;
    const float *post = a->post + (size_t)r * hc, *c = a->comb + (size_t)r * hc * hc;
    float *out = a->out + (size_t)r * hc * d;
    for (int i = 0; i < d; i++) {
        float old[DS_HC_MAX];
        for (int s = 0; s < hc; s++) old[s] = res[(size_t)s * d + i];
        for (int dst = 0; dst < hc; dst++) {
            float t;
            if (fast) {
                t = old[hc - 1] * c[(size_t)(hc - 1) * hc + dst];
                for (int s = hc - 2; s >= 0; s--) t = fmaf(old[s], c[(size_t)s * hc + dst], t);
                t = fmaf(f[i], post[dst], t);
            } else {
                t = f[i] * post[dst];
                for (int s = 0; s < hc; s++) t = t + old[s] * c[(size_t)s * hc + dst];
            }
            out[(size_t)dst * d + i] = t;
        }
    }
}

/* ========================================================================
 * CANONICAL / FAST — rows over threads
 * ======================================================================== */
static void hcq_canon_range(void *arg, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) post_row(arg, r, 0);
}
static void hcq_fast_range(void *arg, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) post_row(arg, r, 1);
}

/* ========================================================================
 * entry
 * ======================================================================== */
int ds_hc_post(ds_variant v, int rows, int hc, int d, const float *f, const float *res, const float *post,
               const float *comb, float *out, ds_pool *pool) {
    if (rows < 0 || hc < 1 || hc > DS_HC_MAX || d < 1) return -1;
    hcq_args a = {hc, d, f, res, post, comb, out};
    ds_pool_for(pool, rows, 1, v == DS_FAST ? hcq_fast_range : hcq_canon_range, &a);
    return 0;
}
