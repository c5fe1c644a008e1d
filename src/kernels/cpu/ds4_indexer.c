/* ds4_indexer.c — the ds4_indexer family: DeepSeek V4's lightning indexer
 * (llama.cpp de3ff81 deepseek4.cpp; docs/DS4-COMPRESSED.md step 6). For a
 * row with n_blk visible compressed blocks, the score of block b is
 *
 *   score_b = sum_h w_h * relu(iq_h . ik_b)      (h over the n_ih heads)
 *
 * and the row keeps the min(top_k, n_blk) best blocks, listed in ascending
 * block order (the order the attention folds them in).
 *
 *   decode     index_row(): each dot by ds_dot16 (16 lanes, fixed tree), the
 *              heads summed in head order (product rounded, then added);
 *              the blocks visited in ascending order into a kept list sorted
 *              by score, a block entering only when strictly better than the
 *              last kept (ties go to the lower block); then the kept indices
 *              sorted ascending.
 *   canonical  index_row() for every row, rows split over threads: a row's
 *              selection is a function of its query, weights and visible
 *              keys alone, never of M.
 *   fast       what a fused kernel does: 4-way interleaved dots with fmaf,
 *              the head sum by fmaf(w, relu, acc); the same selection rule.
 * Why the bits differ: the dots are associated differently (16-lane tree vs
 * 4 partial sums) and fmaf rounds once where decode rounds twice, so two
 * blocks whose scores are within a few ulps can swap places at the top-k
 * edge: the selection — not just a float — differs, which is exactly where
 * batched and sequential indexers would attend different blocks. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"
#include "kernels/dsmath.h"

#include <math.h>

typedef struct {
    int n_ih, ihd, top_k, fast;
    const float *iq, *w;
    const int32_t *n_blk;
    ds_ds4_key_fn key;
    const void *u;
    int32_t *sel, *n_sel;
    float *score;
} idx_args;

static inline float dot4f(const float *a, const float *b, int n) {
    float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n; i++) s4[i & 3] = fmaf(a[i], b[i], s4[i & 3]);
    return (s4[0] + s4[1]) + (s4[2] + s4[3]);
}

/* ========================================================================
 * DECODE — the one per-row instruction sequence (fast: its own dots)
 * ======================================================================== */
static void index_row(const idx_args *a, int m) {
    const int nb = a->n_blk[m], k = nb < a->top_k ? nb : a->top_k;
    const float *iq = a->iq + (size_t)m * a->n_ih * a->ihd, *w = a->w + (size_t)m * a->n_ih;
    int32_t *sel = a->sel + (size_t)m * a->top_k;
    float *sc = a->score + (size_t)m * a->top_k;
    int n = 0;
    for (int b = 0; b < nb && k > 0; b++) {
        const float *ik = a->key(a->u, m, b);
        float s = 0.0f;
        for (int h = 0; h < a->n_ih; h++) {
            const float *q = iq + (size_t)h * a->ihd;
            const float dp = a->fast ? dot4f(q, ik, a->ihd) : ds_dot16(q, ik, a->ihd);
            const float r = dp > 0.0f ? dp : 0.0f;
            s = a->fast ? fmaf(w[h], r, s) : s + w[h] * r;
        }
        if (n == k && !(s > sc[n - 1])) continue;   /* ties: the lower block stays */
        int at = n < k ? n : k - 1;                  /* the slot it takes: behind every score >= s */
        while (at > 0 && !(sc[at - 1] >= s)) {
            sc[at] = sc[at - 1];
            sel[at] = sel[at - 1];
            at--;
        }
        sc[at] = s;
        sel[at] = b;
        if (n < k) n++;
    }
    for (int i = 1; i < n; i++) {                    /* ascending block order */
        const int32_t x = sel[i];
        int j = i;
        while (j > 0 && sel[j - 1] > x) { sel[j] = sel[j - 1]; j--; }
        sel[j] = x;
    }
    a->n_sel[m] = n;
}

static void idx_range(void *arg, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) index_row(arg, (int)r);
}

/* ========================================================================
 * entry
 * ======================================================================== */
int ds_ds4_indexer(ds_variant v, int rows, int n_ih, int ihd, const float *iq, const float *w, const int32_t *n_blk,
                   ds_ds4_key_fn key, const void *u, int top_k, int32_t *sel, int32_t *n_sel, float *score,
                   ds_pool *pool) {
    if (rows < 0 || n_ih < 1 || ihd < 1 || top_k < 1 || !key) return -1;
    idx_args a = {n_ih, ihd, top_k, v == DS_FAST, iq, w, n_blk, key, u, sel, n_sel, score};
    ds_pool_for(pool, rows, 1, idx_range, &a);
    return 0;
}
