/* ds4_compress.c — the ds4_compress family: DeepSeek V4's compressor
 * pooling (llama.cpp de3ff81 deepseek4.cpp; docs/DS4-COMPRESSED.md step 3).
 * A compressed attention row is made when a block of r positions completes:
 * per dim i, a softmax over the block's entries of their scores sc_j[i]
 * and the weighted sum of their values kv_j[i]:
 *
 *   out[i] = sum_j e^(sc_j[i]) kv_j[i] / sum_j e^(sc_j[i])
 *
 * over n entries (r = 128: the block's 128 positions; r = 4: 8, the previous
 * block's four first halves then this block's four second halves). An
 * entry whose pointers are NULL is the virtual row of the first CSA block
 * (kv 0, score -inf): it adds nothing and is skipped in both variants.
 *
 *   decode     pool_row(): per dim, the max over the entries, then in entry
 *              order e_j = ds_expf(sc_j - max), the sum and the weighted sum
 *              (each product rounded, then added), one IEEE division.
 *   canonical  pool_row() for every output row, rows split over threads: a
 *              row's result is a function of its own n entries alone, never
 *              of how many rows complete a block in the same call.
 *   fast       what a fused kernel does: one online pass per dim (the
 *              running max rescales the sums when it moves), ds_exp_fast,
 *              fmaf updates, the output multiplied by the reciprocal.
 * Why the bits differ: two passes round e_j against the final max once; the
 * online pass rounds every rescale of the partial sums as the max moves,
 * so its sums are different roundings of the same quantity; fmaf rounds
 * the product and the add once where decode rounds twice; ds_exp_fast is a
 * polynomial that is not ds_expf; x * (1/L) is not x / L. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"
#include "kernels/dsmath.h"

#include <math.h>

typedef struct {
    int n, hd;
    const float *const *kv, *const *sc;
    float *out;
} comp_args;

/* ========================================================================
 * DECODE — the one per-row instruction sequence
 * ======================================================================== */
static void pool_row(const comp_args *a, int r) {
    const float *const *kv = a->kv + (size_t)r * a->n, *const *sc = a->sc + (size_t)r * a->n;
    float *o = a->out + (size_t)r * a->hd;
    for (int i = 0; i < a->hd; i++) {
        float mx = -INFINITY;
        for (int j = 0; j < a->n; j++)
            if (sc[j] && sc[j][i] > mx) mx = sc[j][i];
        float l = 0.0f, acc = 0.0f;
        for (int j = 0; j < a->n; j++) {
            if (!sc[j]) continue;
            const float e = ds_expf(sc[j][i] - mx);
            l = l + e;
            acc = acc + e * kv[j][i];
        }
        o[i] = acc / l;
    }
}

/* ========================================================================
 * CANONICAL — output rows over threads, each through pool_row()
 * ======================================================================== */
static void comp_canon_range(void *arg, int64_t r0, int64_t r1) {
    const comp_args *a = arg;
    for (int64_t r = r0; r < r1; r++) pool_row(a, (int)r);
}

/* ========================================================================
 * FAST — one online pass per dim
 * ======================================================================== */
static void comp_fast_range(void *arg, int64_t r0, int64_t r1) {
    const comp_args *a = arg;
    for (int64_t r = r0; r < r1; r++) {
        const float *const *kv = a->kv + (size_t)r * a->n, *const *sc = a->sc + (size_t)r * a->n;
        float *o = a->out + (size_t)r * a->hd;
        for (int i = 0; i < a->hd; i++) {
            float m = -INFINITY, l = 0.0f, acc = 0.0f;
            for (int j = 0; j < a->n; j++) {
                if (!sc[j]) continue;
                const float s = sc[j][i];
                if (m == -INFINITY) {
                    m = s; l = 1.0f; acc = kv[j][i];
                } else if (s > m) {
                    const float f = ds_exp_fast(m - s);
                    l = fmaf(l, f, 1.0f);
                    acc = fmaf(acc, f, kv[j][i]);
                    m = s;
                } else {
                    const float p = ds_exp_fast(s - m);
                    l = l + p;
                    acc = fmaf(p, kv[j][i], acc);
                }
            }
            o[i] = acc * (1.0f / l);
        }
    }
}

/* ========================================================================
 * entry
 * ======================================================================== */
int ds_ds4_compress(ds_variant v, int rows, int n, int hd, const float *const *kv, const float *const *sc, float *out,
                    ds_pool *pool) {
    if (rows < 0 || n < 1 || hd < 1) return -1;
    for (int64_t j = 0; j < (int64_t)rows * n; j++)
        if (!kv[j] != !sc[j]) return -1;
    comp_args a = {n, hd, kv, sc, out};
    ds_pool_for(pool, rows, 1, v == DS_FAST ? comp_fast_range : comp_canon_range, &a);
    return 0;
}
