/* test_moe_route.c — the moe_route family: canonical rows are the decode row
 * bit for bit (experts and weights, memcmp, M = 1..16, several shapes), and
 * the fast variant does differ — on random rows in the weights' bits, and on
 * near-tied router logits in the experts it picks. */
#include "kernels/kernels.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {          /* xorshift64*, uniform in [-4, 4) */
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (float)((rng * 2685821657736338717ull) >> 40) / (float)(1u << 24) * 8.0f - 4.0f;
}

int main(void) {
    static const int shapes[][2] = { { 8, 2 }, { 60, 4 }, { 128, 8 }, { 64, 1 }, { 16, 16 } };
    float logits[16 * 128], scratch[128], w1[16], wm[16 * 16], wf[16 * 16];
    int32_t id1[16], idm[16 * 16], idf[16 * 16];
    int ok_canon = 1, weights_differ = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int n = shapes[s][0], k = shapes[s][1];
        for (int norm = 0; norm < 2; norm++)
            for (int M = 1; M <= 16; M++) {
                for (int i = 0; i < M * n; i++) logits[i] = frand();
                if (M == 3) logits[5] = NAN;             /* a NaN logit goes last, no crash */
                if (M == 4) logits[1] = logits[2];       /* an exact tie: the lower expert */
                ds_moe_route(DS_CANONICAL, M, n, k, norm, logits, scratch, idm, wm);
                ds_moe_route(DS_FAST, M, n, k, norm, logits, scratch, idf, wf);
                for (int r = 0; r < M; r++) {
                    ds_moe_route(DS_CANONICAL, 1, n, k, norm, logits + r * n, scratch, id1, w1);
                    if (memcmp(id1, idm + r * k, (size_t)k * sizeof *id1) ||
                        memcmp(w1, wm + r * k, (size_t)k * sizeof *w1)) {
                        ok_canon = 0;
                        printf("FAIL canonical row %d of M=%d (n=%d k=%d norm=%d) differs from decode\n", r, M, n,
                               k, norm);
                    }
                    /* the choice is a valid top-k: distinct experts in range */
                    for (int a = 0; a < k; a++) {
                        CHECK(idm[r * k + a] >= 0 && idm[r * k + a] < n, "expert id out of range");
                        for (int b = a + 1; b < k; b++) CHECK(idm[r * k + a] != idm[r * k + b], "expert twice");
                    }
                }
                if (memcmp(wm, wf, (size_t)(M * k) * sizeof *wm)) weights_differ++;
            }
    }
    CHECK(ok_canon, "canonical rows equal decode");
    if (ok_canon) PASS("moe_route canonical == decode (memcmp ids and weights, M = 1..16, 5 shapes, norm on/off)");

    /* ties and order: equal logits pick the lower expert; the weights of a
     * renormalised route sum to 1 within rounding */
    {
        float l[4] = { 1.0f, 2.0f, 2.0f, 0.5f };
        int32_t id[2];
        float w[2];
        ds_moe_route(DS_CANONICAL, 1, 4, 2, 1, l, scratch, id, w);
        CHECK(id[0] == 1 && id[1] == 2 && w[0] == w[1] && w[0] == 0.5f, "tie order / renormalised weights");
        if (id[0] == 1 && id[1] == 2 && w[0] == 0.5f) PASS("moe_route ties go to the lower expert");
        CHECK(ds_moe_route(DS_CANONICAL, 1, 4, 5, 0, l, scratch, id, w) == -1, "k > n_expert refused");
    }

    /* counter-test 1: fast's weights are other bits on random rows */
    CHECK(weights_differ > 0, "fast weights never differed");
    if (weights_differ) printf("PASS moe_route fast weights differ from canonical on %d of 160 batches\n", weights_differ);

    /* counter-test 2: near-ties — two experts whose logits are 1..4 ulp
     * apart; fast's softmax rounds them into another order some of the time */
    int flips = 0, trials = 0;
    for (int t = 0; t < 4000; t++) {
        const int n = 64, k = 2;
        for (int i = 0; i < n; i++) logits[i] = frand() - 6.0f;
        float a = frand() * 0.5f + 2.0f;
        int i0 = (int)(rng % (uint64_t)n), i1 = (i0 + 1 + (int)((rng >> 20) % (uint64_t)(n - 1))) % n;
        float b = a;
        for (int u = 0; u <= t % 4; u++) b = nextafterf(b, INFINITY);
        logits[i0] = a;
        logits[i1] = b;
        ds_moe_route(DS_CANONICAL, 1, n, k, 1, logits, scratch, id1, w1);
        ds_moe_route(DS_FAST, 1, n, k, 1, logits, scratch, idf, wf);
        trials++;
        flips += id1[0] != idf[0] || id1[1] != idf[1];
    }
    CHECK(flips > 0, "no near-tie flip");
    if (flips) printf("PASS moe_route fast picks other experts on %d of %d near-tied rows\n", flips, trials);
    return tu_finish("test_moe_route");
}
