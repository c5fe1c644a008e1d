/* argmax.c — greedy token selection.
 *
 * One strategy, used everywhere (decode, verify, drafter): a left-to-right
 * scan with a strict '>' so ties go to the lowest index, and NaN never wins
 * (every comparison with NaN is false, and a NaN is never taken as the
 * first candidate). All-NaN (or n <= 0) returns 0. There is no arithmetic,
 * so there is no fast variant: argmax of identical logits is identical. */
#include "kernels/kernels.h"

int64_t ds_argmax(const float *x, int64_t n) {
    int64_t best = -1;
    float bv = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (v != v) continue;                 /* NaN */
        if (best < 0 || v > bv) { best = i; bv = v; }
    }
    return best < 0 ? 0 : best;
}
