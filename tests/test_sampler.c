/* test_sampler.c — the deterministic sampler (src/sampler.h).
 *
 * Philox-4x32-10 known-answer vectors (Random123 tests/kat_vectors) and an
 * independent re-implementation; the (seed, pos, i) -> uniform mapping;
 * determinism; greedy limits (temp 0, temp -> 0, top-k 1); empirical
 * frequencies vs softmax; top-k / top-p kept sets including ties. */
#include "testutil.h"
#include "sampler.h"
#include "kernels/kernels.h"

#include <math.h>
#include <time.h>

/* Independent Philox-4x32-10, written differently on purpose: the key is
 * bumped before rounds 2..10 (Random123's own order), 64-bit products split
 * with shifts on a uint64 array. */
static void philox_ref(const uint32_t in[4], const uint32_t k[2], uint32_t out[4]) {
    uint32_t x[4] = { in[0], in[1], in[2], in[3] };
    uint32_t key[2] = { k[0], k[1] };
    for (int round = 0; round < 10; round++) {
        if (round > 0) { key[0] += 0x9E3779B9u; key[1] += 0xBB67AE85u; }
        uint64_t prod[2] = { (uint64_t)0xD2511F53u * x[0], (uint64_t)0xCD9E8D57u * x[2] };
        uint32_t y[4];
        y[0] = (uint32_t)(prod[1] >> 32) ^ x[1] ^ key[0];
        y[1] = (uint32_t)(prod[1] & 0xffffffffu);
        y[2] = (uint32_t)(prod[0] >> 32) ^ x[3] ^ key[1];
        y[3] = (uint32_t)(prod[0] & 0xffffffffu);
        memcpy(x, y, sizeof x);
    }
    memcpy(out, x, sizeof x);
}

static uint64_t rng_state = 0x1234567887654321ull;
static uint32_t rnd32(void) {       /* xorshift64* for test inputs */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static void test_kat(void) {
    static const uint32_t kat[3][10] = {
        { 0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 },
        { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
          0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd },
        { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
          0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 },
    };
    int ok = 1;
    for (int t = 0; t < 3; t++) {
        uint32_t o[4], r[4];
        ds_philox4x32_10(kat[t], kat[t] + 4, o);
        philox_ref(kat[t], kat[t] + 4, r);
        for (int j = 0; j < 4; j++) {
            CHECK(o[j] == kat[t][6 + j], "KAT %d word %d: got %08x want %08x", t, j, o[j], kat[t][6 + j]);
            CHECK(r[j] == kat[t][6 + j], "reference KAT %d word %d: got %08x want %08x", t, j, r[j], kat[t][6 + j]);
            ok &= o[j] == kat[t][6 + j] && r[j] == kat[t][6 + j];
        }
    }
    printf("%s philox4x32_10_kat vectors=3\n", ok ? "PASS" : "FAIL");
    int same = 1;
    for (int t = 0; t < 10000; t++) {
        uint32_t c[4] = { rnd32(), rnd32(), rnd32(), rnd32() }, k[2] = { rnd32(), rnd32() }, a[4], b[4];
        ds_philox4x32_10(c, k, a);
        philox_ref(c, k, b);
        same &= !memcmp(a, b, sizeof a);
    }
    CHECK(same, "philox differs from the independent implementation");
    printf("%s philox_matches_reference n=10000\n", same ? "PASS" : "FAIL");

    /* the uniform mapping, recomputed from the documented layout */
    int um = 1, in01 = 1;
    for (int t = 0; t < 5000; t++) {
        uint64_t seed = ((uint64_t)rnd32() << 32) | rnd32();
        int64_t pos = (int64_t)(rnd32() % 100000) + (t & 1 ? ((int64_t)1 << 33) : 0);
        uint32_t i = rnd32() % 200000;
        uint32_t c[4] = { (uint32_t)pos, (uint32_t)((uint64_t)pos >> 32), i >> 1, 0 }, k[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) }, o[4];
        philox_ref(c, k, o);
        uint64_t x = (i & 1) ? ((uint64_t)o[3] << 32 | o[2]) : ((uint64_t)o[1] << 32 | o[0]);
        double want = ((double)(x >> 11) + 0.5) / 9007199254740992.0;
        double got = ds_philox_uniform(seed, pos, i);
        um &= got == want;
        in01 &= got > 0.0 && got < 1.0;
    }
    CHECK(um, "ds_philox_uniform does not follow the documented (seed, pos, i) layout");
    CHECK(in01, "uniform outside (0,1)");
    printf("%s philox_uniform_layout n=5000 open_interval=%d\n", um ? "PASS" : "FAIL", in01);
}

static void rand_logits(float *l, int V, float scale) {
    for (int i = 0; i < V; i++) l[i] = scale * ((float)(rnd32() % 20001) / 10000.0f - 1.0f);
}

static void test_determinism_and_greedy(void) {
    const int V = 1000;
    float *l = malloc(V * sizeof(float)), *scr = malloc(2 * V * sizeof(float));
    int det = 1, g0 = 1, gt = 1, k1 = 1, p0 = 1;
    for (int t = 0; t < 300; t++) {
        rand_logits(l, V, 8.0f);
        int64_t am = ds_argmax(l, V);
        ds_sampler s = { 0.8f, t % 3 ? 50 : 0, t % 2 ? 0.9f : 1.0f, 42 + (uint64_t)t, 0.0f };
        int32_t a = ds_sample(&s, l, V, t, scr), b = ds_sample(&s, l, V, t, NULL), c = ds_sample(&s, l, V, t, scr);
        det &= a == b && b == c && a >= 0 && a < V;
        ds_sampler g = { 0.0f, 0, 1.0f, 7, 0.0f };
        g0 &= ds_sample(&g, l, V, t, scr) == am;
        int tied = 0;
        for (int i = 0; i < V; i++) tied += l[i] == l[am];
        ds_sampler tiny = { 1e-6f, 0, 1.0f, (uint64_t)t, 0.0f };
        if (tied == 1) gt &= ds_sample(&tiny, l, V, t, NULL) == am;     /* a tied max may go either way */
        ds_sampler k = { 1.0f, 1, 1.0f, (uint64_t)t * 3, 0.0f };
        k1 &= ds_sample(&k, l, V, t, scr) == am;
        ds_sampler pz = { 1.0f, 0, 1e-7f, (uint64_t)t, 0.0f };
        p0 &= ds_sample(&pz, l, V, t, scr) == am;
    }
    CHECK(det, "same inputs gave different tokens (or scratch vs internal allocation differs)");
    CHECK(g0, "temp 0 is not argmax");
    CHECK(gt, "temp 1e-6 is not argmax");
    CHECK(k1, "top-k 1 is not argmax");
    CHECK(p0, "top-p ~0 is not argmax");
    printf("%s sampler_determinism_and_greedy_limits det=%d temp0=%d temp1e-6=%d topk1=%d topp0=%d\n",
           det && g0 && gt && k1 && p0 ? "PASS" : "FAIL", det, g0, gt, k1, p0);

    /* greedy ties go to the lowest id; NaN never wins */
    float tie[6] = { 1, 3, 2, 3, NAN, 3 };
    ds_sampler g = { 0.0f, 0, 1.0f, 0, 0.0f };
    CHECK(ds_sample(&g, tie, 6, 0, NULL) == 1, "greedy tie not to the lowest id");
    int nan_ok = 1;
    float nl[4] = { NAN, 0.0f, NAN, 0.0f };
    for (int t = 0; t < 200; t++) {
        ds_sampler s = { 1.0f, t % 2 ? 3 : 0, t % 3 ? 0.95f : 1.0f, 5, 0.0f };
        int32_t x = ds_sample(&s, nl, 4, t, NULL);
        nan_ok &= x == 1 || x == 3;
    }
    CHECK(nan_ok, "a NaN logit was sampled");
    printf("%s greedy_ties_lowest_id_and_nan_never_wins\n", nan_ok ? "PASS" : "FAIL");

    /* the seed and the position both matter */
    int diff_seed = 0, diff_pos = 0;
    rand_logits(l, V, 1.0f);
    for (int t = 0; t < 100; t++) {
        ds_sampler a = { 1.0f, 0, 1.0f, 1, 0.0f }, b = { 1.0f, 0, 1.0f, 2, 0.0f };
        diff_seed += ds_sample(&a, l, V, t, NULL) != ds_sample(&b, l, V, t, NULL);
        diff_pos += ds_sample(&a, l, V, t, NULL) != ds_sample(&a, l, V, t + 1000, NULL);
    }
    CHECK(diff_seed > 50 && diff_pos > 50, "seed/position do not change the draw (%d, %d of 100)", diff_seed, diff_pos);
    printf("%s seed_and_position_matter diff_seed=%d diff_pos=%d of 100\n", diff_seed > 50 && diff_pos > 50 ? "PASS" : "FAIL", diff_seed, diff_pos);
    free(l); free(scr);
}

/* empirical frequencies over N positions vs the expected distribution */
static int freq_check(const char *name, const float *l, int V, ds_sampler s, const double *expect, int N) {
    long cnt[16] = { 0 };
    for (int t = 0; t < N; t++) {
        int32_t x = ds_sample(&s, l, V, t, NULL);
        if (x >= 0 && x < V) cnt[x]++;
    }
    int ok = 1;
    double worst = 0.0;
    for (int i = 0; i < V; i++) {
        double f = (double)cnt[i] / N, sd = sqrt(expect[i] * (1 - expect[i]) / N);
        double z = sd > 0 ? fabs(f - expect[i]) / sd : (cnt[i] ? 1e9 : 0.0);
        if (z > worst) worst = z;
        if (z > 5.0) ok = 0;                       /* 5 sigma: never flaky, still sharp */
    }
    CHECK(ok, "%s: frequencies off softmax (worst %.1f sigma)", name, worst);
    printf("%s distribution_%s N=%d worst_z=%.2f\n", ok ? "PASS" : "FAIL", name, N, worst);
    return ok;
}

static void test_distribution(void) {
    const int V = 8, N = 200000;
    const float l[8] = { 1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f, 2.2f, -0.3f };
    double e[8];
    /* plain softmax at T = 0.7 */
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(l[i] / 0.7);
    for (int i = 0; i < V; i++) e[i] = exp(l[i] / 0.7) / z;
    freq_check("temp0.7", l, V, (ds_sampler){ 0.7f, 0, 1.0f, 11, 0.0f }, e, N);
    /* top-k 3 at T = 1: ids 6, 1, 4 */
    z = exp(2.2) + exp(2.0) + exp(1.5);
    for (int i = 0; i < V; i++) e[i] = 0;
    e[6] = exp(2.2) / z; e[1] = exp(2.0) / z; e[4] = exp(1.5) / z;
    freq_check("topk3", l, V, (ds_sampler){ 1.0f, 3, 1.0f, 12, 0.0f }, e, N);
    /* top-p: probabilities 0.5, 0.3, 0.15, 0.05 (log-space logits) */
    const float lp[4] = { logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f) };
    double ep[4];
    ep[0] = 0; ep[1] = 0.5 / 0.8; ep[2] = 0; ep[3] = 0.3 / 0.8;
    freq_check("topp0.7", lp, 4, (ds_sampler){ 1.0f, 0, 0.7f, 13, 0.0f }, ep, N);
    ep[0] = 0.15 / 0.95; ep[1] = 0.5 / 0.95; ep[2] = 0; ep[3] = 0.3 / 0.95;
    freq_check("topp0.9", lp, 4, (ds_sampler){ 1.0f, 0, 0.9f, 14, 0.0f }, ep, N);
    ep[0] = 0.15; ep[1] = 0.5; ep[2] = 0.05; ep[3] = 0.3;
    freq_check("topp0.99", lp, 4, (ds_sampler){ 1.0f, 0, 0.99f, 15, 0.0f }, ep, N);
    /* top-p after temperature: T = 2 flattens to sqrt probabilities */
    double q[4], qs = 0;
    const double pr[4] = { 0.15, 0.5, 0.05, 0.3 };
    for (int i = 0; i < 4; i++) { q[i] = sqrt(pr[i]); qs += q[i]; }
    /* sorted: id1 .4394, id3 .3404, id0 .2636, id2 .1517 (of qs); top_p 0.7 keeps ids 1,3,0 */
    for (int i = 0; i < 4; i++) ep[i] = 0;
    double kept = q[1] + q[3] + q[0];
    ep[1] = q[1] / kept; ep[3] = q[3] / kept; ep[0] = q[0] / kept;
    (void)qs;
    freq_check("temp2_topp0.7", lp, 4, (ds_sampler){ 2.0f, 0, 0.7f, 16, 0.0f }, ep, N);

    /* ties: equal logits, top-k 2 keeps ids {0,1}; top-p 0.5 keeps {0,1} */
    const float eq[6] = { 1, 1, 1, 1, 1, 1 };
    double et[6] = { 0.5, 0.5, 0, 0, 0, 0 };
    freq_check("topk2_ties", eq, 6, (ds_sampler){ 1.0f, 2, 1.0f, 17, 0.0f }, et, 50000);
    const float eq4[4] = { 1, 1, 1, 1 };
    double et4[4] = { 0.5, 0.5, 0, 0 };
    freq_check("topp0.5_ties", eq4, 4, (ds_sampler){ 1.0f, 0, 0.5f, 18, 0.0f }, et4, 50000);
    /* top-k then top-p: k=3 of {6,1,4}, then p 0.5 of that: id6 alone has .41 -> {6,1} */
    double p6 = exp(2.2), p1 = exp(2.0);
    for (int i = 0; i < V; i++) e[i] = 0;
    e[6] = p6 / (p6 + p1); e[1] = p1 / (p6 + p1);
    freq_check("topk3_topp0.5", l, V, (ds_sampler){ 1.0f, 3, 0.5f, 19, 0.0f }, e, N);
    /* min-p 0.5 on probabilities 0.5, 0.3, 0.15, 0.05: keeps p >= 0.25 -> ids 1, 3 */
    ep[0] = 0; ep[1] = 0.5 / 0.8; ep[2] = 0; ep[3] = 0.3 / 0.8;
    freq_check("minp0.5", lp, 4, (ds_sampler){ 1.0f, 0, 1.0f, 20, 0.5f }, ep, N);
    /* min-p 0.25: 0.15/0.5 = 0.3 >= 0.25 keeps id 0 too */
    ep[0] = 0.15 / 0.95; ep[1] = 0.5 / 0.95; ep[2] = 0; ep[3] = 0.3 / 0.95;
    freq_check("minp0.25", lp, 4, (ds_sampler){ 1.0f, 0, 1.0f, 21, 0.25f }, ep, N);
}

/* The definition, written the slow obvious way: sort everything, cut top-k,
 * cut top-p on the sorted prefix, Gumbel-max over what is left. */
typedef struct { float x; int id; } rc_t;
static int rc_cmp(const void *a, const void *b) {
    const rc_t *p = a, *q = b;
    if (p->x != q->x) return p->x > q->x ? -1 : 1;
    return p->id - q->id;
}
static int32_t ref_sample(const ds_sampler *s, const float *l, int V, int64_t pos) {
    rc_t *c = malloc((size_t)V * sizeof *c);
    for (int i = 0; i < V; i++) { c[i].x = l[i] / s->temp; c[i].id = i; }
    qsort(c, (size_t)V, sizeof *c, rc_cmp);
    int n = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    if (s->top_p < 1.0f) {
        double Z = 0, cum = 0;
        for (int i = 0; i < n; i++) Z += exp((double)c[i].x - c[0].x);
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += exp((double)c[i].x - c[0].x);
            if (cum >= (double)s->top_p * Z) { keep = i + 1; break; }
        }
        n = keep;
    }
    if (s->min_p > 0.0f) {                     /* c[0] is the best kept token */
        int keep = 0;
        for (int i = 0; i < n; i++)
            if (exp((double)c[i].x - c[0].x) >= (double)s->min_p) keep = i + 1;
        n = keep;
    }
    int32_t best = -1;
    double bs = -INFINITY;
    for (int i = 0; i < n; i++) {
        double sc = (double)c[i].x - log(-log(ds_philox_uniform(s->seed, pos, (uint32_t)c[i].id)));
        if (sc > bs || (sc == bs && c[i].id < best)) { bs = sc; best = c[i].id; }
    }
    free(c);
    return best;
}

static void test_against_definition(void) {
    const int V = 3000;
    float *l = malloc(V * sizeof(float));
    int ok = 1, n = 0;
    static const float scales[] = { 1.0f, 10.0f, 100.0f };
    static const ds_sampler cfg[] = {
        { 1.0f, 0, 1.0f, 3, 0.0f }, { 0.7f, 0, 1.0f, 4, 0.0f }, { 1.0f, 40, 1.0f, 5, 0.0f }, { 1.0f, 0, 0.9f, 6, 0.0f },
        { 0.5f, 0, 0.5f, 7, 0.0f }, { 1.3f, 100, 0.95f, 8, 0.0f }, { 1.0f, 2999, 0.999f, 9, 0.0f },
        { 1.0f, 0, 1.0f, 10, 0.05f }, { 0.7f, 0, 1.0f, 11, 0.3f }, { 1.0f, 40, 0.9f, 12, 0.1f }, { 1.0f, 0, 1.0f, 13, 1.0f },
    };
    for (int si = 0; si < 3; si++)
        for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++)
            for (int t = 0; t < 12; t++) {
                rand_logits(l, V, scales[si]);
                int32_t a = ds_sample(&cfg[ci], l, V, 1000 + t, NULL), b = ref_sample(&cfg[ci], l, V, 1000 + t);
                ok &= a == b;
                n++;
            }
    CHECK(ok, "ds_sample differs from the slow definition (pruning / partial sort)");
    printf("%s sample_equals_definition cases=%d (logit scales 1,10,100; top-k, top-p, min-p, pruning)\n", ok ? "PASS" : "FAIL", n);
    free(l);
}

static void test_speed(void) {
    const int V = 151936;
    float *l = malloc((size_t)V * sizeof(float)), *scr = malloc(2 * (size_t)V * sizeof(float));
    rand_logits(l, V, 10.0f);
    struct timespec a, b;
    const char *names[3] = { "full", "topk40", "topp0.9" };
    ds_sampler ss[3] = { { 1.0f, 0, 1.0f, 1, 0.0f }, { 1.0f, 40, 1.0f, 1, 0.0f }, { 1.0f, 0, 0.9f, 1, 0.0f } };
    for (int k = 0; k < 3; k++) {
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int t = 0; t < 20; t++) (void)ds_sample(&ss[k], l, V, t, scr);
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("INFO sample_time V=%d %s ms=%.3f\n", V, names[k], ((b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6) / 20);
    }
    free(l); free(scr);
}

int main(void) {
    test_kat();
    test_determinism_and_greedy();
    test_distribution();
    test_against_definition();
    test_speed();
    return tu_finish("test_sampler");
}
