/* rmsnorm.c — RMSNorm family: y = x / sqrt(mean(x^2) + eps) * w, per row.
 *
 * Used for the layer norms (rows = tokens, n = n_embd) and for QK-norm
 * (rows = tokens x heads, n = head_dim), usually in place (y == x is allowed:
 * every element is read before its own slot is written).
 *
 *   decode     rmsnorm_row(): 16-lane sum of squares, fixed combine tree,
 *              mean, scale = 1/sqrtf(mean + eps), y = (x * scale) * w.
 *   canonical  rows split over threads, each row through rmsnorm_row() —
 *              decode is literally canonical with rows = 1.
 *   fast       rows in groups of 4 with 8 accumulators each and the weight
 *              multiplied in first: (x * w) * scale. Different sum order and
 *              different product order, so the bits differ from decode. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"

#include <math.h>

typedef struct {
    int n;
    const float *x, *w;
    float eps;
    float *y;
} rms_args;

/* ========================================================================
 * DECODE — the one per-row instruction sequence
 * ======================================================================== */
/* The sum of squares is ds_sumsq16 (lane = i mod 16, fixed tree), so the
 * result depends only on n and the row's values. */
static void rmsnorm_row(int n, const float *x, const float *w, float eps, float *y) {
    float sum = ds_sumsq16(x, n);
    float mean = sum / (float)n;
    float scale = 1.0f / sqrtf(mean + eps);
    if (w) {
        for (int i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
    } else {
        for (int i = 0; i < n; i++) y[i] = x[i] * scale;
    }
}

/* ========================================================================
 * CANONICAL — threads split rows; every row runs rmsnorm_row()
 * ======================================================================== */
static void rms_canon_range(void *arg, int64_t r0, int64_t r1) {
    const rms_args *a = arg;
    for (int64_t r = r0; r < r1; r++)
        rmsnorm_row(a->n, a->x + r * a->n, a->w, a->eps, a->y + r * a->n);
}

/* ========================================================================
 * FAST — what a throughput kernel does: 4 rows at a time, 8 accumulators
 * ======================================================================== */
/* WHY the bits differ: the sum of squares uses 8 lanes (i mod 8) and a
 * (0+4,1+5,2+6,3+7) -> pairs -> one combine, i.e. a different association
 * than the 16-lane tree; the output multiplies the weight before the scale.
 * Both are legitimate choices for a kernel tuned for batches (4 rows share
 * every w load); neither is the decode kernel's order. */
#define RMS_FAST_ROWS 4
#define RMS_FAST_LANES 8

static void rms_fast_group(int nr, int n, const float *x, const float *w, float eps, float *y) {
    float acc[RMS_FAST_ROWS][RMS_FAST_LANES];
    memset(acc, 0, sizeof acc);
    int i = 0;
    for (; i + RMS_FAST_LANES <= n; i += RMS_FAST_LANES)
        for (int r = 0; r < nr; r++)
            for (int l = 0; l < RMS_FAST_LANES; l++) {
                float v = x[(int64_t)r * n + i + l];
                acc[r][l] += v * v;
            }
    for (int r = 0; r < nr; r++)
        for (int l = 0; i + l < n; l++) {
            float v = x[(int64_t)r * n + i + l];
            acc[r][l] += v * v;
        }
    float scale[RMS_FAST_ROWS];
    for (int r = 0; r < nr; r++) {
        float *a = acc[r];
        float s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
        scale[r] = 1.0f / sqrtf(s / (float)n + eps);
    }
    for (int r = 0; r < nr; r++) {
        const float *xr = x + (int64_t)r * n;
        float *yr = y + (int64_t)r * n;
        float sc = scale[r];
        if (w) {
            for (int k = 0; k < n; k++) yr[k] = (xr[k] * w[k]) * sc;
        } else {
            for (int k = 0; k < n; k++) yr[k] = xr[k] * sc;
        }
    }
}

typedef struct {
    rms_args a;
    int rows;
} rms_fast_args;

static void rms_fast_range(void *arg, int64_t g0, int64_t g1) {
    const rms_fast_args *fa = arg;
    const rms_args *a = &fa->a;
    for (int64_t g = g0; g < g1; g++) {
        int64_t r0 = g * RMS_FAST_ROWS;
        int nr = (int)((fa->rows - r0) < RMS_FAST_ROWS ? (fa->rows - r0) : RMS_FAST_ROWS);
        rms_fast_group(nr, a->n, a->x + r0 * a->n, a->w, a->eps, a->y + r0 * a->n);
    }
}

/* ========================================================================
 * entry point
 * ======================================================================== */
void ds_rmsnorm(ds_variant v, int rows, int n, const float *x, const float *w, float eps,
                float *y, ds_pool *pool) {
    if (rows <= 0 || n <= 0) return;
    if (v == DS_FAST) {
        rms_fast_args fa = { { n, x, w, eps, y }, rows };
        int64_t groups = ((int64_t)rows + RMS_FAST_ROWS - 1) / RMS_FAST_ROWS;
        ds_pool_for(pool, groups, ds_grain((int64_t)n * RMS_FAST_ROWS, 16384), rms_fast_range, &fa);
        return;
    }
    rms_args a = { n, x, w, eps, y };
    ds_pool_for(pool, rows, ds_grain(n, 16384), rms_canon_range, &a);
}
