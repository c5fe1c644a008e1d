/* residual.c — residual epilogue family: x += y (rows x n), then, if
 * w != NULL, xnorm = rmsnorm(x, w, eps) — the next sub-block's input norm.
 *
 *   decode     the add (elementwise, blocks of elements over threads), then
 *              ds_rmsnorm(vnorm, ...) exactly as a separate operator.
 *   canonical  the same two steps for rows x n — decode is rows = 1. The norm
 *              step's bits are therefore rmsnorm's canonical bits.
 *   fast       vLLM's fused_add_rms_norm: one pass per row that adds and
 *              accumulates the sum of squares in the fused loop's own order
 *              (4 accumulators, lane = i mod 4), then the scale pass. x is
 *              bitwise the same as canonical (x[i] + y[i] is one rounding
 *              either way); xnorm differs because the sum order does.
 * vnorm is consulted only on the canonical path. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"

#include <math.h>

#define RES_BLOCK 4096

typedef struct {
    int n;
    int64_t total;
    float *x;
    const float *y, *w;
    float eps;
    float *xnorm;
} res_args;

/* ========================================================================
 * DECODE / CANONICAL — add, then the rmsnorm operator
 * ======================================================================== */
/* Elementwise: one rounding per element, so any split of the elements over
 * threads gives the same bits; blocks let a single decode row use every
 * thread. */
static void res_add_range(void *arg, int64_t b0, int64_t b1) {
    const res_args *a = arg;
    int64_t e0 = b0 * RES_BLOCK, e1 = b1 * RES_BLOCK;
    if (e1 > a->total) e1 = a->total;
    float *x = a->x;
    const float *y = a->y;
    for (int64_t i = e0; i < e1; i++) x[i] += y[i];
}

/* ========================================================================
 * FAST — fused add + sum of squares per row (vLLM fused_add_rms_norm)
 * ======================================================================== */
/* WHY the bits differ: the sum of squares is accumulated inside the add loop
 * in 4 lanes (i mod 4) combined as (l0+l1)+(l2+l3), not by rmsnorm's 16-lane
 * tree, and the output is x * (scale * w[i]) rather than (x * scale) * w[i].
 * The add itself is the same single rounding, so x matches canonical. */
#define RES_FAST_LANES 4

static void res_fast_row(int n, float *x, const float *y, const float *w, float eps,
                         float *xn) {
    float acc[RES_FAST_LANES] = {0};
    int i = 0;
    for (; i + RES_FAST_LANES <= n; i += RES_FAST_LANES)
        for (int l = 0; l < RES_FAST_LANES; l++) {
            float v = x[i + l] + y[i + l];
            x[i + l] = v;
            acc[l] += v * v;
        }
    for (int l = 0; i + l < n; l++) {
        float v = x[i + l] + y[i + l];
        x[i + l] = v;
        acc[l] += v * v;
    }
    if (!w) return;
    float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    float scale = 1.0f / sqrtf(sum / (float)n + eps);
    for (int k = 0; k < n; k++) xn[k] = x[k] * (scale * w[k]);
}

static void res_fast_range(void *arg, int64_t r0, int64_t r1) {
    const res_args *a = arg;
    int n = a->n;
    for (int64_t r = r0; r < r1; r++)
        res_fast_row(n, a->x + r * n, a->y + r * n, a->w, a->eps,
                     a->xnorm ? a->xnorm + r * n : NULL);
}

/* ========================================================================
 * entry point
 * ======================================================================== */
void ds_residual(ds_variant vres, ds_variant vnorm, int rows, int n, float *x, const float *y,
                 const float *w, float eps, float *xnorm, ds_pool *pool) {
    if (rows <= 0 || n <= 0) return;
    res_args a = { n, (int64_t)rows * n, x, y, w, eps, xnorm };
    if (vres == DS_FAST && (!w || xnorm)) {
        ds_pool_for(pool, rows, ds_grain(n, 16384), res_fast_range, &a);
        return;
    }
    int64_t blocks = (a.total + RES_BLOCK - 1) / RES_BLOCK;
    ds_pool_for(pool, blocks, 1, res_add_range, &a);
    if (w && xnorm) ds_rmsnorm(vnorm, rows, n, x, w, eps, xnorm, pool);
}
