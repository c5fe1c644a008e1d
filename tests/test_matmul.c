/* test_matmul.c — the four matmul families, their exactness contract, the
 * conversions they rest on, and the kernel-set registry.
 *
 *   accuracy     every type x variant against a double-precision reference
 *                (canonical Q8_0: with the activation-quantization bound)
 *   canonical    Q8_0 == a scalar reference of its definition (activations
 *                through ds_quantize_row_q8_0, exact int32 block dots, one fma
 *                per block), memcmp, on every SIMD level, both paths (per row
 *                and repacked/tiled), threads 1/3, M = 1..17
 *   canonical    row m of ds_matmul(CANONICAL, M) == ds_matmul_decode(row m),
 *                memcmp, M = 1..16, threads 1/2/3, every type; Q8_0 also on
 *                every SIMD level and both paths
 *   counter      ds_matmul(FAST, M) differs from decode somewhere, M = 2,4,8,16
 *                (so the memcmp above is shown able to fail)
 *   threads      1 vs 2 vs 3 threads bit-identical for both variants
 *   simd levels  canonical bits identical on every SIMD level the CPU has
 *   conversions  Q8_0 quantization by hand, all 65536 fp16/bf16 values through
 *                every lane width's converter, hardware fp16 per level
 *   epilogue     ds_matmul_epi's y == ds_matmul's (memcmp), every column in
 *                one epilogue call, ranges in chunk order, small K split */
#include "kernels/kernels.h"
#include "kernels/cpu/matmul_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static int n_pass, n_fail;
#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (cond) { n_pass++; } else {                                                     \
            n_fail++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__);     \
            printf("\n");                                                                  \
        }                                                                                  \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_u64(void) {                     /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_f(void) { return (float)((double)(rng_u64() >> 11) * 0x1p-53 * 2.0 - 1.0); }

static const uint32_t types[4] = {DS_TYPE_F32, DS_TYPE_F16, DS_TYPE_BF16, DS_TYPE_Q8_0};

/* A weight of type t with n rows of k random values in [-1, 1). */
typedef struct { ds_weight w; void *data; } tw;
static tw make_weight(uint32_t t, int64_t k, int64_t n) {
    tw r;
    int ok;
    size_t rb = (size_t)ds_row_bytes(t, (uint64_t)k, &ok);
    float *tmp = malloc((size_t)(k * n) * sizeof(float) + 1);
    for (int64_t i = 0; i < k * n; i++) tmp[i] = rng_f();
    r.data = malloc(rb * (size_t)n + 1);
    for (int64_t j = 0; j < n; j++)
        ds_f32_to_type(t, tmp + j * k, k, (char *)r.data + rb * (size_t)j);
    free(tmp);
    r.w = (ds_weight){.type = t, .n_in = k, .n_out = n, .data = r.data};
    return r;
}
static float *make_x(int m, int64_t k) {
    float *x = malloc((size_t)(m * k) * sizeof(float) + 1);
    for (int64_t i = 0; i < m * k; i++) x[i] = rng_f();
    return x;
}

/* ==========================================================================
 * accuracy against a double-precision reference
 * ========================================================================== */
static void test_accuracy(ds_pool *pool) {
    static const int64_t Ks_dense[] = {1, 15, 16, 17, 100, 257}, Ks_q8[] = {32, 96, 256};
    static const int64_t Ns[] = {1, 7, 33};
    static const int Ms[] = {1, 3, 5, 8};
    int bad = 0, total = 0;
    double worst = 0;
    for (int ti = 0; ti < 4; ti++) {
        uint32_t t = types[ti];
        const int64_t *Ks = t == DS_TYPE_Q8_0 ? Ks_q8 : Ks_dense;
        int nk = t == DS_TYPE_Q8_0 ? 3 : 6;
        for (int ki = 0; ki < nk; ki++)
            for (int ni = 0; ni < 3; ni++)
                for (int mi = 0; mi < 4; mi++)
                    for (int v = 0; v < 2; v++) {
                        int64_t K = Ks[ki], N = Ns[ni];
                        int M = Ms[mi];
                        tw W = make_weight(t, K, N);
                        float *x = make_x(M, K), *y = malloc((size_t)(M * N) * sizeof(float));
                        float *wf = malloc((size_t)K * sizeof(float)), *xf = malloc((size_t)K * sizeof(float));
                        ds_matmul((ds_variant)v, &W.w, M, x, y, pool);
                        int ok;
                        size_t rb = (size_t)ds_row_bytes(t, (uint64_t)K, &ok);
                        for (int m = 0; m < M; m++) {
                            /* the f32 activation (canonical Q8_0 quantizes it:
                             * its own bound below) */
                            memcpy(xf, x + m * K, (size_t)K * sizeof(float));
                            for (int64_t n = 0; n < N; n++) {
                                ds_row_to_f32(t, (const char *)W.data + rb * (size_t)n, K, wf);
                                double ref = 0, mag = 0;
                                for (int64_t k = 0; k < K; k++) {
                                    ref += (double)wf[k] * xf[k];
                                    mag += fabs((double)wf[k] * xf[k]);
                                }
                                /* recursive-summation bound over a lane chain of
                                 * K/16 adds plus the tree and the scaling steps */
                                double tol = ((double)K / 16 + 8) * 0x1p-23 * mag + 1e-30;
                                if (t == DS_TYPE_Q8_0 && v == DS_CANONICAL) {
                                    /* canonical Q8_0 quantizes the activation: per element
                                     * |x - e*p| <= e/2 (rounding) + 127.5 e (2^-11 + 2^-22)
                                     * (e stored as fp16, p computed with the f32 1/e),
                                     * e = amax/127 of the block: <= 0.57 amax / 127;
                                     * then one rounding per block add */
                                    double qerr = 0;
                                    for (int64_t b0 = 0; b0 < K; b0 += 32) {
                                        double amax = 0, wsum = 0;
                                        for (int64_t k = b0; k < b0 + 32; k++) {
                                            amax = fmax(amax, fabs((double)xf[k]));
                                            wsum += fabs((double)wf[k]);
                                        }
                                        qerr += 0.57 / 127 * amax * wsum;
                                    }
                                    tol = qerr + ((double)K / 32 + 8) * 0x1p-23 * (mag + qerr) + 1e-30;
                                } else if (t == DS_TYPE_Q8_0) {
                                    /* fast Q8_0 on VNNI quantizes the activation with one
                                     * scale per row: |x - e*p| <= e/2 (+ the f32 1/e),
                                     * e = amax/127 of the row (other levels: f32, tighter) */
                                    double amax = 0, wsum = 0;
                                    for (int64_t k = 0; k < K; k++) {
                                        amax = fmax(amax, fabs((double)xf[k]));
                                        wsum += fabs((double)wf[k]);
                                    }
                                    const double qerr = 0.51 / 127 * amax * wsum;
                                    tol = qerr + ((double)K / 16 + 8) * 0x1p-23 * (mag + qerr) + 1e-30;
                                }
                                double err = fabs((double)y[m * N + n] - ref);
                                total++;
                                if (mag > 0 && err / mag > worst) worst = err / mag;
                                if (!(err <= tol)) {
                                    if (bad < 5)
                                        printf("  %s %s K=%lld N=%lld M=%d [%d][%lld]: %.9g vs %.9g\n",
                                               ds_type_name(t), v ? "fast" : "canonical",
                                               (long long)K, (long long)N, M, m, (long long)n,
                                               y[m * N + n], ref);
                                    bad++;
                                }
                            }
                        }
                        free(W.data); free(x); free(y); free(wf); free(xf);
                    }
    }
    CHECK(bad == 0, "accuracy: %d of %d outputs outside the bound", bad, total);
    printf("%s accuracy vs double reference (%d outputs, worst |err|/sum|wx| = %.3g)\n",
           bad ? "FAIL" : "PASS", total, worst);
}

/* ==========================================================================
 * the canonical property, the counter-test and thread invariance
 * ========================================================================== */
static int rows_equal(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* Canonical Q8_0 at level lv through one forced path (DS_Q8_PATH_ROWS: the
 * non-repacked one-row kernels; DS_Q8_PATH_REPACKED: the repacked VNNI /
 * AVX2 2 x 2 tiles; portable has one path), the activations quantized as
 * matmul.c does, the columns in two uneven ranges as two threads might get. */
static void q8_canon_forced(int lv, int path, const ds_weight *W, int M, const float *x, float *y) {
    const int64_t K = W->n_in, nb = K / 32, N = W->n_out;
    ds_block_q8_0 *q = malloc((size_t)(M * nb) * sizeof *q + 1);
    float *d = malloc((size_t)(M * nb) * sizeof(float) + 1);
    int32_t *ns = malloc((size_t)(M * nb) * sizeof(int32_t) + 1);
    for (int m = 0; m < M; m++) ds_quantize_row_q8_0(x + m * K, K, q + m * nb);
    for (int64_t b = 0; b < M * nb; b++) {
        int32_t sum = 0;
        for (int l = 0; l < 32; l++) sum += q[b].qs[l];
        d[b] = ds_fp16_to_f32(q[b].d);
        ns[b] = -128 * sum;
    }
    /* the interleaved copy the tiles read (matmul.c's layout: groups of 8
     * rows, per block 8 x 32 quants, 8 nsum, 8 d) */
    unsigned char *qi = calloc((size_t)((M + 7) / 8) * (size_t)nb, DS_Q8_GROUP_BYTES);
    for (int m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            unsigned char *g = qi + ((size_t)(m / 8) * (size_t)nb + (size_t)b) * DS_Q8_GROUP_BYTES;
            memcpy(g + 32 * (m % 8), q[m * nb + b].qs, 32);
            memcpy(g + 256 + 4 * (m % 8), &ns[m * nb + b], 4);
            memcpy(g + 288 + 4 * (m % 8), &d[m * nb + b], 4);
        }
    int16_t *qw = calloc((size_t)((M + 7) / 8) * (size_t)nb * 256, sizeof(int16_t));
    for (int m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++)
            for (int l = 0; l < 32; l++)
                qw[((size_t)(m / 8) * (size_t)nb + (size_t)b) * 256 + 32 * (m % 8) + l] = q[m * nb + b].qs[l];
    /* a thread's scratch, so the tiles pack per call (with none they fall
     * back to the one-row kernels, tested by scratch = 0) */
    const size_t tb = ds_matmul_thread_scratch(K);
    void *tmp = aligned_alloc(64, (tb + 63) & ~(size_t)63);
    ds_q8_act act = {.q = q, .d = d, .nsum = ns, .qi = qi, .qw = qw};
    ds_mm_ctx c = {.W = W, .M = M, .x = x, .y = y, .level = DS_LVL_BASE(lv), .avxvnni = lv == DS_LVL_AVXVNNI,
                   .i8mm = lv == DS_LVL_I8MM,
                   .xq = &act, .q8_path = path,
                   .tmp = tmp, .tmp_bytes = tb};
    const int64_t split = N < 21 ? N : 21;
    ds_mm_q8_0_canonical(&c, 0, split);
    if (split < N) ds_mm_q8_0_canonical(&c, split, N);
    free(q); free(d); free(ns); free(qi); free(qw); free(tmp);
}

static void test_exactness(ds_pool *pools[4]) {
    for (int tk = 0; tk < 7; tk++) {
        /* dense types twice: K = 259 and 384 (a multiple of 16: no tail) */
        const int ti = tk < 4 ? tk : tk - 4;
        uint32_t t = types[ti];
        if (tk >= 4 && t == DS_TYPE_Q8_0) continue;
        /* K: not a multiple of 16 (dense) / odd block count (Q8_0); N odd and
         * large enough that 2 and 3 threads really split it */
        int64_t K = t == DS_TYPE_Q8_0 ? 288 : tk >= 4 ? 384 : 259, N = 1001;
        tw W = make_weight(t, K, N);
        float *x = make_x(16, K);
        float *dec = malloc((size_t)(16 * N) * sizeof(float));
        float *y = malloc((size_t)(16 * N) * sizeof(float));
        float *y2 = malloc((size_t)(16 * N) * sizeof(float));
        for (int m = 0; m < 16; m++) ds_matmul_decode(&W.w, x + m * K, dec + m * N, pools[1]);

        /* decode itself is thread-count invariant */
        int dec_ok = 1;
        for (int th = 2; th <= 3; th++)
            for (int m = 0; m < 16; m++) {
                ds_matmul_decode(&W.w, x + m * K, y, pools[th]);
                dec_ok &= rows_equal(y, dec + m * N, N);
            }
        CHECK(dec_ok, "%s: decode differs across thread counts", ds_type_name(t));

        /* canonical(M) row m == decode(row m), M = 1..16, threads 1, 2, 3 */
        int canon_bad = 0;
        for (int th = 1; th <= 3; th++)
            for (int M = 1; M <= 16; M++) {
                ds_matmul(DS_CANONICAL, &W.w, M, x, y, pools[th]);
                for (int m = 0; m < M; m++)
                    if (!rows_equal(y + m * N, dec + m * N, N)) {
                        if (canon_bad < 3)
                            printf("  %s canonical M=%d threads=%d row %d != decode\n",
                                   ds_type_name(t), M, th, m);
                        canon_bad++;
                    }
            }
        CHECK(canon_bad == 0, "%s: canonical rows differ from decode", ds_type_name(t));
        printf("%s canonical == decode (memcmp) %s M=1..16 threads 1,2,3 K=%lld N=%lld\n",
               canon_bad ? "FAIL" : "PASS", ds_type_name(t), (long long)K, (long long)N);

        /* counter-test: fast differs from decode somewhere, for each width */
        static const int widths[] = {2, 4, 8, 16};
        for (int wi = 0; wi < 4; wi++) {
            int M = widths[wi];
            ds_matmul(DS_FAST, &W.w, M, x, y, pools[1]);
            int64_t ndiff = 0;
            double dmax = 0, dif = 0, rel;         /* max |fast - decode| / max |decode| */
            for (int64_t i = 0; i < (int64_t)M * N; i++) {
                ndiff += memcmp(&y[i], &dec[i], sizeof(float)) != 0;
                dmax = fmax(dmax, fabs((double)dec[i]));
                dif = fmax(dif, fabs((double)y[i] - dec[i]));
            }
            rel = dif / (dmax + 1e-30);
            CHECK(ndiff > 0, "%s: fast M=%d is bit-identical to decode (counter-test)",
                  ds_type_name(t), M);
            /* Q8_0: fast keeps the f32 activation that canonical rounds to 8
             * bits, so it differs by far more than an ulp somewhere */
            if (t == DS_TYPE_Q8_0)
                CHECK(rel > 1e-5, "Q8_0: fast M=%d within %.3g of decode (expected the "
                      "activation-quantization difference)", M, rel);
            printf("%s counter-test %s fast M=%d differs from decode in %lld of %lld outputs "
                   "(max rel %.3g)\n", ndiff ? "PASS" : "FAIL", ds_type_name(t), M,
                   (long long)ndiff, (long long)(M * N), rel);
        }

        /* thread invariance, both variants, several widths */
        static const int tmw[] = {1, 5, 8, 16};
        int inv_ok = 1;
        for (int v = 0; v < 2; v++)
            for (int wi = 0; wi < 4; wi++) {
                int M = tmw[wi];
                ds_matmul((ds_variant)v, &W.w, M, x, y, pools[1]);
                for (int th = 2; th <= 3; th++) {
                    ds_matmul((ds_variant)v, &W.w, M, x, y2, pools[th]);
                    inv_ok &= rows_equal(y, y2, (int64_t)M * N);
                }
            }
        CHECK(inv_ok, "%s: results depend on the thread count", ds_type_name(t));
        printf("%s thread invariance %s canonical+fast threads 1,2,3\n", inv_ok ? "PASS" : "FAIL",
               ds_type_name(t));

        /* canonical bits identical on every SIMD level this CPU can run */
        int lv_ok = 1, nlv = 0;
        for (int lv = 0; lv < DS_LVL_COUNT; lv++) {
            if (!ds_simd_level_ok(lv)) continue;
            nlv++;
            for (int M = 1; M <= 16; M += t == DS_TYPE_Q8_0 ? 1 : 3) {
                ds_matmul_at_level(lv, DS_CANONICAL, &W.w, M, x, y, pools[2]);
                lv_ok &= rows_equal(y, dec, (int64_t)M * N);
                if (t == DS_TYPE_Q8_0)          /* both paths, forced, at every M */
                    for (int path = DS_Q8_PATH_ROWS; path <= DS_Q8_PATH_REPACKED; path++) {
                        q8_canon_forced(lv, path, &W.w, M, x, y);
                        lv_ok &= rows_equal(y, dec, (int64_t)M * N);
                    }
            }
        }
        CHECK(lv_ok, "%s: canonical bits depend on the SIMD level", ds_type_name(t));
        printf("%s canonical == decode on %d SIMD level(s) %s%s\n", lv_ok ? "PASS" : "FAIL", nlv,
               ds_type_name(t), t == DS_TYPE_Q8_0 ? " (M=1..16, per-row and repacked paths)" : "");

        free(W.data); free(x); free(dec); free(y); free(y2);
    }
}

/* ==========================================================================
 * canonical (= decode) Q8_0 against the scalar definition of its arithmetic
 * (matmul_q8_0.c), through ds_matmul and through each forced path
 * ========================================================================== */
static void test_canonical_q8(ds_pool *pools[4]) {
    static const int64_t Ks[] = {32, 288, 1024, 544};   /* 1, 9, 32, 17 blocks: 16-block groups and tails */
    const int64_t N = 53;                       /* 3 x 16 + 5: tile tails on every level */
    int bad = 0, nlv = 0, runs = 0;
    for (int ki = 0; ki < 4; ki++) {
        const int64_t K = Ks[ki], nb = K / 32;
        tw W = make_weight(DS_TYPE_Q8_0, K, N);
        /* the extreme quant -128 in some weight blocks (any GGUF may hold it) */
        ds_block_q8_0 *wb = W.data;
        for (int64_t i = 0; i < N * nb; i += 7) wb[i].qs[i % 32] = -128;
        const int Mmax = 17;
        float *x = make_x(Mmax, K);
        for (int64_t k = 0; k < 32; k++) x[k] = 0.0f;          /* an all-zero block: e = 0 */
        for (int64_t k = K; k < K + 32 && k < 2 * K; k++) x[k] *= 1e4f;
        for (int64_t k = 2 * K; k < 3 * K; k++) x[k] *= 1e-5f;  /* e an fp16 subnormal */
        for (int64_t k = 3 * K; k < 4 * K; k++) x[k] *= 1e-39f; /* f32 subnormal x: e = 0 */
        float *ref = malloc((size_t)(Mmax * N) * sizeof(float));
        float *y = malloc((size_t)(Mmax * N) * sizeof(float));
        ds_block_q8_0 *xq = malloc((size_t)nb * sizeof *xq);
        for (int m = 0; m < Mmax; m++) {
            ds_quantize_row_q8_0(x + m * K, K, xq);
            for (int64_t n = 0; n < N; n++) {
                const ds_block_q8_0 *w = wb + n * nb;
                float acc = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    int32_t D = 0;
                    for (int l = 0; l < 32; l++) D += (int32_t)w[b].qs[l] * xq[b].qs[l];
                    acc = fmaf((float)D, ds_fp16_to_f32(w[b].d) * ds_fp16_to_f32(xq[b].d), acc);
                }
                ref[m * N + n] = acc;
            }
        }
        for (int lv = 0; lv < DS_LVL_COUNT; lv++) {
            if (!ds_simd_level_ok(lv)) continue;
            if (ki == 0) nlv++;
            for (int M = 1; M <= Mmax; M++) {
                for (int th = 1; th <= 3; th += 2) {
                    ds_matmul_at_level(lv, DS_CANONICAL, &W.w, M, x, y, pools[th]);
                    runs++;
                    if (!rows_equal(y, ref, (int64_t)M * N)) {
                        if (bad < 3)
                            printf("  canonical Q8_0 %s K=%lld M=%d threads=%d != reference\n",
                                   ds_simd_level_name(lv), (long long)K, M, th);
                        bad++;
                    }
                }
                for (int path = DS_Q8_PATH_ROWS; path <= DS_Q8_PATH_REPACKED; path++) {
                    q8_canon_forced(lv, path, &W.w, M, x, y);
                    runs++;
                    if (!rows_equal(y, ref, (int64_t)M * N)) {
                        if (bad < 3)
                            printf("  canonical Q8_0 %s path %d K=%lld M=%d != reference\n",
                                   ds_simd_level_name(lv), path, (long long)K, M);
                        bad++;
                    }
                }
            }
        }
        free(W.data); free(x); free(ref); free(y); free(xq);
    }
    CHECK(bad == 0, "canonical Q8_0 differs from its scalar definition in %d of %d runs", bad, runs);
    printf("%s canonical Q8_0 == scalar int8 x int8 definition (memcmp) on %d SIMD level(s), "
           "K=32,288,1024,544 (x rows incl. fp16-subnormal and zero scales) M=1..17 threads 1,3, per-row and repacked paths\n",
           bad ? "FAIL" : "PASS", nlv);
}

/* ==========================================================================
 * conversions
 * ========================================================================== */
static void test_quantize(void) {
    /* block 0: amax 127 -> d = 1, id = 1, q = roundf(x) (halves away from 0)
     * block 1: all zero -> d = 0, id = 0, q = 0
     * block 2: amax 254 -> d = 2, id = 0.5 */
    float x[96] = {0};
    x[0] = 127.0f; x[1] = -63.5f; x[2] = 0.49f; x[3] = 2.5f; x[4] = -127.0f; x[5] = 0.5f;
    x[64] = 254.0f; x[65] = 3.0f; x[66] = -5.0f; x[67] = 1.0f; x[68] = -1.0f; x[69] = 100.2f;
    ds_block_q8_0 b[3];
    memset(b, 0x55, sizeof b);
    ds_quantize_row_q8_0(x, 96, b);
    int ok = b[0].d == 0x3c00 && b[0].qs[0] == 127 && b[0].qs[1] == -64 && b[0].qs[2] == 0 &&
             b[0].qs[3] == 3 && b[0].qs[4] == -127 && b[0].qs[5] == 1 && b[0].qs[6] == 0;
    ok &= b[1].d == 0;
    for (int j = 0; j < 32; j++) ok &= b[1].qs[j] == 0;
    ok &= b[2].d == 0x4000 && b[2].qs[0] == 127 && b[2].qs[1] == 2 && b[2].qs[2] == -3 &&
          b[2].qs[3] == 1 && b[2].qs[4] == -1 && b[2].qs[5] == 50 && b[2].qs[31] == 0;
    CHECK(ok, "quantize_row_q8_0 hand example");
    /* a d that is not exact in fp16: amax 1 -> d = 1/127 -> fp16 0x2008 */
    float z[32] = {0};
    z[0] = 1.0f; z[1] = 0.5f;
    ds_quantize_row_q8_0(z, 32, b);
    CHECK(b[0].d == ds_f32_to_fp16(1.0f / 127.0f) && b[0].qs[0] == 127 && b[0].qs[1] == 64,
          "quantize_row_q8_0 d=1/127 (d=%04x q=%d,%d)", b[0].d, b[0].qs[0], b[0].qs[1]);
    float back[32];
    ds_row_to_f32(DS_TYPE_Q8_0, b, 32, back);
    CHECK(back[0] == ds_fp16_to_f32(b[0].d) * 127.0f, "Q8_0 row_to_f32 is d*q");
    printf("%s quantize_row_q8_0 hand-checked blocks\n", ok ? "PASS" : "FAIL");

    /* against ggml's reference formula with libm roundf: random blocks of
     * several magnitudes, blocks of exact halves (ties), non-finite inputs */
    int qbad = 0;
    for (int it = 0; it < 4000; it++) {
        float v[32];
        const float scale = it % 4 == 0 ? 1e-3f : it % 4 == 1 ? 1.0f : it % 4 == 2 ? 300.0f : 1e30f;
        for (int j = 0; j < 32; j++) v[j] = rng_f() * scale;
        if (it % 5 == 0) {                                 /* d = 1: every x.5 is a tie */
            v[0] = 127.0f;
            for (int j = 1; j < 32; j++) v[j] = (float)((int)(rng_u64() % 255) - 127) + 0.5f * (float)(j & 1);
        }
        if (it == 7) v[3] = NAN;
        if (it == 11) v[5] = INFINITY;
        ds_block_q8_0 qb;
        ds_quantize_row_q8_0(v, 32, &qb);
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) { float a = fabsf(v[j]); amax = amax > a ? amax : a; }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        qbad += qb.d != ds_f32_to_fp16(d);
        for (int j = 0; j < 32; j++) {
            float q = roundf(v[j] * id);
            q = q != q ? 0.0f : q > 127.0f ? 127.0f : q < -128.0f ? -128.0f : q;
            qbad += qb.qs[j] != (int8_t)q;
        }
    }
    CHECK(qbad == 0, "quantize_row_q8_0 differs from the roundf formula in %d values", qbad);
    printf("%s quantize_row_q8_0 == ggml's roundf formula (4000 blocks, ties, non-finite)\n",
           qbad ? "FAIL" : "PASS");
}

static void test_half_conversions(void) {
    int f16_bad = 0, bf16_bad = 0, lane_bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ds_fp16_to_f32((uint16_t)h);
        uint16_t back = ds_f32_to_fp16(f);
        if (f != f) { if ((back & 0x7c00) != 0x7c00 || !(back & 0x3ff)) f16_bad++; }
        else if (back != h) f16_bad++;
        float g = ds_bf16_to_f32((uint16_t)h);
        uint16_t gb = ds_f32_to_bf16(g);
        if (g != g) { if ((gb & 0x7f80) != 0x7f80 || !(gb & 0x7f)) bf16_bad++; }
        else if (gb != h) bf16_bad++;
    }
    /* the W-lane converters the kernels use (W = 16, 8, 4) == the scalar
     * ones, bit for bit (NaN payloads included) */
    for (uint32_t h0 = 0; h0 < 65536; h0 += 16) {
        uint16_t hs[16];
        for (int l = 0; l < 16; l++) hs[l] = (uint16_t)(h0 + (uint32_t)l);
        float a[3][16], b[3][16];
        ds_v16f a16 = ds_ld16_f16sw(hs), b16 = ds_ld16_bf16(hs);
        memcpy(a[0], &a16, 64); memcpy(b[0], &b16, 64);
        for (int c = 0; c < 2; c++) {
            ds_v8f a8 = ds_ld8_f16sw(hs + 8 * c), b8 = ds_ld8_bf16(hs + 8 * c);
            memcpy(a[1] + 8 * c, &a8, 32); memcpy(b[1] + 8 * c, &b8, 32);
        }
        for (int c = 0; c < 4; c++) {
            ds_v4f a4 = ds_ld4_f16(hs + 4 * c), b4 = ds_ld4_bf16(hs + 4 * c);
            memcpy(a[2] + 4 * c, &a4, 16); memcpy(b[2] + 4 * c, &b4, 16);
        }
        for (int l = 0; l < 16; l++) {
            uint32_t s1 = ds_f32_bits(ds_fp16_to_f32(hs[l])), s2 = ds_f32_bits(ds_bf16_to_f32(hs[l]));
            for (int w = 0; w < 3; w++) {
                /* AArch64's W = 4 fp16 loader is FCVTL, which quiets a
                 * signalling NaN like VCVTPH2PS (test_hw_conversions) */
                const uint32_t want = DS_ARM && w == 2 && ds_fp16_to_f32(hs[l]) != ds_fp16_to_f32(hs[l])
                                          ? s1 | 0x00400000u : s1;
                lane_bad += ds_f32_bits(a[w][l]) != want || ds_f32_bits(b[w][l]) != s2;
            }
        }
    }
    int8_t q[16];
    for (int l = 0; l < 16; l++) q[l] = (int8_t)(l * 17 - 128);
    for (int c = 0; c < 4; c++) {              /* W = 16 and 8: test_hw_conversions */
        ds_v4f qv4 = ds_ld4_q8(q + 4 * c);
        for (int l = 0; l < 4; l++) lane_bad += qv4[l] != (float)q[4 * c + l];
    }
    CHECK(f16_bad == 0, "fp16 round trip: %d values", f16_bad);
    CHECK(bf16_bad == 0, "bf16 round trip: %d values", bf16_bad);
    CHECK(lane_bad == 0, "16-lane converters differ in %d values", lane_bad);
    printf("%s fp16/bf16 round trip of all 65536 values, lane converters bit-exact\n",
           f16_bad || bf16_bad || lane_bad ? "FAIL" : "PASS");

    /* ds_f32_to_type / ds_row_to_f32 agree with the scalar helpers */
    float v[64];
    uint16_t h[64], hb[64];
    float r1[64], r2[64];
    for (int i = 0; i < 64; i++) v[i] = rng_f() * 1000.0f;
    ds_f32_to_type(DS_TYPE_F16, v, 64, h);
    ds_f32_to_type(DS_TYPE_BF16, v, 64, hb);
    ds_row_to_f32(DS_TYPE_F16, h, 64, r1);
    ds_row_to_f32(DS_TYPE_BF16, hb, 64, r2);
    int ok = 1;
    for (int i = 0; i < 64; i++)
        ok &= h[i] == ds_f32_to_fp16(v[i]) && hb[i] == ds_f32_to_bf16(v[i]) &&
              r1[i] == ds_fp16_to_f32(h[i]) && r2[i] == ds_bf16_to_f32(hb[i]);
    CHECK(ok, "f32_to_type/row_to_f32 for F16/BF16");
}

/* The W = 16 / W = 8 loaders at the levels that use them (they may use
 * x86 conversion instructions, so they run in target instances): fp16 via
 * VCVTPH2PS is exact for all non-NaN inputs, and a NaN keeps its sign and
 * payload with the quiet bit set (the software converter keeps a signalling
 * NaN signalling; a multiply quiets it the same way); the scalar scale
 * converter likewise; int8 -> f32 exact for all 256 values. */
#if DS_X86
DS_TARGET_AVX512 static void cvt_avx512(const uint16_t *h, const int8_t *q, float *o) {
    ds_v16f v = ds_ld16_f16(h), w = ds_ld16_q8(q);
    memcpy(o, &v, 64);
    memcpy(o + 32, &w, 64);
    for (int l = 0; l < 16; l++) o[16 + l] = ds_ld16_f16s(h[l]);
}
DS_TARGET_AVX2 static void cvt_avx2(const uint16_t *h, const int8_t *q, float *o) {
    for (int c = 0; c < 2; c++) {
        ds_v8f v = ds_ld8_f16(h + 8 * c), w = ds_ld8_q8(q + 8 * c);
        memcpy(o + 8 * c, &v, 32);
        memcpy(o + 32 + 8 * c, &w, 32);
    }
    for (int l = 0; l < 16; l++) o[16 + l] = ds_ld8_f16s(h[l]);
}
#endif
static void test_hw_conversions(void) {
#if DS_X86
    int bad = 0, nlv = 0;
    for (int lv = DS_LVL_AVX2; lv <= DS_LVL_AVX512; lv++) {
        if (!ds_simd_level_ok(lv)) continue;
        nlv++;
        for (uint32_t h0 = 0; h0 < 65536; h0 += 16) {
            uint16_t hs[16];
            int8_t qs[16];
            float o[48];
            for (int l = 0; l < 16; l++) {
                hs[l] = (uint16_t)(h0 + (uint32_t)l);
                qs[l] = (int8_t)(uint8_t)((h0 >> 4) + (uint32_t)l * 16);   /* all 256 */
            }
            if (lv == DS_LVL_AVX512) cvt_avx512(hs, qs, o); else cvt_avx2(hs, qs, o);
            for (int l = 0; l < 16; l++) {
                bad += o[32 + l] != (float)qs[l];
                float s = ds_fp16_to_f32(hs[l]);
                uint32_t want = ds_f32_bits(s);
                if (s != s) want |= 0x00400000u;                 /* quieted */
                bad += ds_f32_bits(o[l]) != want || ds_f32_bits(o[16 + l]) != want;
            }
        }
    }
    CHECK(bad == 0, "per-level converters differ in %d values", bad);
    printf("%s per-level fp16/int8 -> f32 (x86 instructions %s) on %d level(s), all 65536 / 256 values\n",
           bad ? "FAIL" : "PASS", DS_X86_BUILTINS ? "on" : "off: software", nlv);
#endif
}

/* VCVTPS2PH with round-to-nearest-even == ds_f32_to_fp16 on non-negative
 * non-NaN floats (what the AVX-512 activation quantizer in matmul.c relies
 * on for the blocks' scales d = amax / 127): every exponent at a stride,
 * the rounding ties and overflow edge, the fp16 subnormal range densely.
 * (All 2^31 such values agree; that sweep takes seconds, this one a tenth.) */
#if DS_X86
__attribute__((target("avx512f,f16c"))) static int f16_hw_round(const uint32_t *u, int n) {
    int bad = 0;
    for (int i = 0; i + 16 <= n; i += 16) {
        uint16_t h[16];
        _mm256_storeu_si256((__m256i *)h, _mm512_cvtps_ph(_mm512_castsi512_ps(_mm512_loadu_si512(u + i)),
                                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        for (int l = 0; l < 16; l++) bad += h[l] != ds_f32_to_fp16(ds_bits_f32(u[i + l]));
    }
    return bad;
}
#endif
static void test_f16_round(void) {
#if DS_X86
    if (!ds_simd_level_ok(DS_LVL_AVX512)) return;
    enum { CAP = 1 << 16 };
    uint32_t *u = malloc(CAP * sizeof *u);
    int bad = 0, n = 0, total = 0;
#define F16_ADD(v) do { u[n++] = (v); if (n == CAP) { bad += f16_hw_round(u, n); total += n; n = 0; } } while (0)
    for (uint64_t v = 0; v <= 0x7f800000u; v += 40961) F16_ADD((uint32_t)v);
    for (uint32_t v = 0x477fe000u; v < 0x47800010u; v++) F16_ADD(v);        /* 65504 .. inf */
    for (uint32_t v = 0x33000000u - 64; v < 0x38800000u + 64; v += 7) F16_ADD(v);   /* subnormals */
    for (uint32_t e = 0; e < 255; e++)                                        /* ties, every exponent */
        for (uint32_t m = 0x0ff8u; m < 0x1008u; m++) F16_ADD((e << 23) | m);
    F16_ADD(0x7f800000u);
    while (n % 16) F16_ADD(0u);
    bad += f16_hw_round(u, n);
    total += n;
#undef F16_ADD
    free(u);
    CHECK(bad == 0, "VCVTPS2PH (nearest even) differs from ds_f32_to_fp16 on %d of %d values", bad, total);
    printf("%s VCVTPS2PH (nearest even) == ds_f32_to_fp16 on %d non-negative floats (every exponent, ties, "
           "overflow edge, subnormals)\n", bad ? "FAIL" : "PASS", total);
#endif
}

/* ==========================================================================
 * registry
 * ========================================================================== */
static void test_registry(void) {
    char err[DS_ERRLEN], buf[256];
    ds_kernel_set ks;
    const int fail0 = n_fail;
    int ok = 1;
    for (int f = 0; f < DS_FAM_COUNT; f++) {
        ok &= ds_family_from_name(ds_family_name(f)) == f;
        ok &= strlen(ds_family_describe(f)) > 10;
    }
    ok &= ds_family_from_name("nope") == -1;
    ok &= ds_matmul_family(DS_TYPE_Q8_0) == DS_FAM_MATMUL_Q8_0 &&
          ds_matmul_family(DS_TYPE_BF16) == DS_FAM_MATMUL_BF16 && ds_matmul_family(9) == -1 &&
          ds_matmul_family(DS_TYPE_Q6_K) == DS_FAM_MATMUL_Q6_K && ds_family_weight_type(DS_FAM_MATMUL_Q4_K) == DS_TYPE_Q4_K;
    CHECK(ok, "family names/describe/matmul_family");

    CHECK(ds_kernel_set_parse(&ks, NULL, NULL, NULL, err, sizeof err) == 0, "parse NULL");
    ds_kernel_set_str(&ks, buf, sizeof buf);
    CHECK(strcmp(buf, "canonical") == 0, "str canonical: '%s'", buf);
    CHECK(ds_kernel_set_parse(&ks, "fast", NULL, NULL, err, sizeof err) == 0, "parse fast");
    ds_kernel_set_str(&ks, buf, sizeof buf);
    CHECK(strcmp(buf, "fast") == 0, "str fast: '%s'", buf);
    CHECK(ds_kernel_set_parse(&ks, "canonical", "matmul_q8_0, attention", NULL, err, sizeof err) == 0,
          "parse fast list: %s", err);
    ds_kernel_set_str(&ks, buf, sizeof buf);
    CHECK(strcmp(buf, "canonical fast=matmul_q8_0,attention") == 0, "str: '%s'", buf);
    CHECK(ds_kernel_set_parse(&ks, "fast", "rope", "rope", err, sizeof err) == 0, "parse canon list");
    ds_kernel_set_str(&ks, buf, sizeof buf);
    CHECK(strcmp(buf, "fast canonical=rope") == 0, "str: '%s'", buf);

    ds_kernel_set before = ks;
    CHECK(ds_kernel_set_parse(&ks, "fast", "matmul_f32,xyz", NULL, err, sizeof err) == -1 &&
              strstr(err, "'xyz'") && strstr(err, "known: matmul_f32") &&
              memcmp(&ks, &before, sizeof ks) == 0,
          "unknown family error: '%s'", err);
    CHECK(ds_kernel_set_parse(&ks, "quick", NULL, NULL, err, sizeof err) == -1 &&
              strstr(err, "'quick'"), "bad base error: '%s'", err);
    CHECK(ds_kernel_set_parse(&ks, NULL, "rope,,swiglu", NULL, err, sizeof err) == -1 &&
              strstr(err, "empty"), "empty item error: '%s'", err);
    CHECK(ds_kernel_set_parse(&ks, NULL, NULL, "", err, sizeof err) == -1, "empty list rejected");
    const char *p = ds_simd_path();
    CHECK(!strcmp(p, "avx512") || !strcmp(p, "avx2") || !strcmp(p, "avxvnni") || !strcmp(p, "neon") || !strcmp(p, "dotprod") || !strcmp(p, "i8mm") ||
              !strcmp(p, "portable"),
          "simd path '%s'", p);
    printf("%s registry checks (simd path: %s)\n", n_fail == fail0 ? "PASS" : "FAIL", p);
}

/* Pre-packed weights (ds_weight_pack_at, as the model loader does for the
 * process's level: Q8_0's tiles, Q4_0 / Q5_0's T8 tile at AVX2 / AVX-VNNI;
 * the kquant weights carry a NaN and an inf block scale), for EVERY level
 * this CPU runs: canonical at that
 * level with and without them memcmp-identical for M = 1..16 and 1 / 3
 * threads, decode(packed) == decode(unpacked) == canonical row m, rows read
 * back from the packed copy == the original rows, and a copy packed for
 * another level's layout is ignored (the same bits). N not a multiple of 16
 * (a padded last tile). */
static void test_packed_type(ds_pool *pools[4], uint32_t type, const char *tn) {
    static const int64_t Ks[] = {32, 288, 1024}, Ns[] = {7, 37, 100};
    int bad = 0, runs = 0, nlayouts = 0;
    for (int lv = 0; lv < DS_LVL_COUNT; lv++) {
        if (!ds_simd_level_ok(lv)) continue;
        int used = 0;
        for (int ki = 0; ki < 3; ki++)
            for (int ni = 0; ni < 3; ni++) {
                const int64_t K = Ks[ki], N = Ns[ni];
                const int Mmax = 16;
                tw W = make_weight(type, K, N);
                if (type != DS_TYPE_Q8_0 && N > 5) {
                    /* malformed scales (a NaN and an inf block scale): the
                     * outputs' NaNs are stored as the one quiet NaN on every path */
                    int okb;
                    const size_t rbb = (size_t)ds_row_bytes(type, (uint64_t)K, &okb);
                    const uint16_t nan16 = 0x7e01, inf16 = 0x7c00;
                    memcpy((char *)W.data + 3 * rbb, &nan16, 2);
                    memcpy((char *)W.data + 5 * rbb, &inf16, 2);
                }
                const size_t pb = ds_weight_pack_bytes_at(&W.w, lv);
                if (!pb) {
                    CHECK(ds_weight_pack_at(&W.w, lv, NULL) == -1, "pack refused where packing is unused");
                    free(W.data);
                    continue;
                }
                used = 1;
                void *pk = aligned_alloc(64, (pb + 63) & ~(size_t)63);
                CHECK(pk && ds_weight_pack_at(&W.w, lv, pk) == 0, "ds_weight_pack_at lv=%d K=%lld N=%lld", lv,
                      (long long)K, (long long)N);
                ds_weight Wp = W.w;
                Wp.extra = pk;
                CHECK(ds_weight_is_packed(&Wp) && !ds_weight_is_packed(&W.w), "ds_weight_is_packed");
                /* rows read back from the packed copy alone (the embedding lookup
                 * of a tied head) == the original rows converted (memcmp) */
                {
                    float *ra = malloc((size_t)K * sizeof(float)), *rb2 = malloc((size_t)K * sizeof(float));
                    int row_bad = 0;
                    int ok;
                    const size_t rbytes = (size_t)ds_row_bytes(type, (uint64_t)K, &ok);
                    for (int64_t r = 0; r < N; r++) {
                        ds_row_to_f32(type, (const char *)W.data + (size_t)r * rbytes, K, ra);
                        ds_weight_packed_row(&Wp, r, rb2);
                        row_bad += memcmp(ra, rb2, (size_t)K * sizeof(float)) != 0;
                    }
                    CHECK(row_bad == 0, "ds_weight_packed_row lv=%d K=%lld N=%lld: %d rows differ from the original",
                          lv, (long long)K, (long long)N, row_bad);
                    free(ra); free(rb2);
                }
                float *x = make_x(Mmax, K);
                float *y0 = malloc((size_t)(Mmax * N) * sizeof(float));
                float *y1 = malloc((size_t)(Mmax * N) * sizeof(float));
                float *d0 = malloc((size_t)N * sizeof(float)), *d1 = malloc((size_t)N * sizeof(float));
                for (int M = 1; M <= Mmax; M++)
                    for (int th = 1; th <= 3; th += 2) {
                        ds_matmul_at_level(lv, DS_CANONICAL, &W.w, M, x, y0, pools[th]);
                        ds_matmul_at_level(lv, DS_CANONICAL, &Wp, M, x, y1, pools[th]);
                        runs++;
                        if (memcmp(y0, y1, (size_t)(M * N) * sizeof(float))) {
                            if (bad < 3)
                                printf("  packed %s lv=%d K=%lld N=%lld M=%d threads=%d != unpacked\n", tn, lv,
                                       (long long)K, (long long)N, M, th);
                            bad++;
                        }
                        /* the other levels ignore this level's layout */
                        for (int lv2 = 0; lv2 < DS_LVL_COUNT; lv2++) {
                            if (lv2 == lv || !ds_simd_level_ok(lv2) || M % 5) continue;
                            ds_matmul_at_level(lv2, DS_CANONICAL, &Wp, M, x, y1, pools[th]);
                            runs++;
                            if (memcmp(y0, y1, (size_t)(M * N) * sizeof(float))) {
                                if (bad < 3)
                                    printf("  %s packed for lv=%d, run at lv=%d, K=%lld N=%lld M=%d differs\n", tn, lv,
                                           lv2, (long long)K, (long long)N, M);
                                bad++;
                            }
                        }
                        for (int m = 0; m < M; m++) {
                            ds_matmul_at_level(lv, DS_CANONICAL, &W.w, 1, x + m * K, d0, pools[th]);
                            ds_matmul_at_level(lv, DS_CANONICAL, &Wp, 1, x + m * K, d1, pools[th]);
                            runs++;
                            if (memcmp(d0, d1, (size_t)N * sizeof(float)) ||
                                memcmp(d1, y0 + (size_t)m * N, (size_t)N * sizeof(float))) {
                                if (bad < 3)
                                    printf("  packed %s decode lv=%d K=%lld N=%lld M=%d row %d differs\n", tn, lv,
                                           (long long)K, (long long)N, M, m);
                                bad++;
                            }
                        }
                    }
                free(pk); free(W.data); free(x); free(y0); free(y1); free(d0); free(d1);
            }
        nlayouts += used;
    }
    CHECK(bad == 0, "packed %s differs from unpacked in %d of %d runs", tn, bad, runs);
    printf("%s canonical/decode %s with pre-packed weights == unpacked (memcmp), %d packed level(s), "
           "M=1..16 threads 1,3, %d runs\n", bad ? "FAIL" : "PASS", tn, nlayouts, runs);
}

static void test_packed_q8(ds_pool *pools[4]) {
    test_packed_type(pools, DS_TYPE_Q8_0, "Q8_0");
    /* Q4_0 / Q5_0: the T8 tile of the AVX2 / AVX-VNNI levels (matmul_kq.h) */
    test_packed_type(pools, DS_TYPE_Q4_0, "Q4_0");
    test_packed_type(pools, DS_TYPE_Q5_0, "Q5_0");
}

/* ds_matmul_multi (q/k/v and gate/up in one launch) == the separate calls,
 * every type and variant, widths 1..16, threads 1..3, including a weight
 * whose column count is not a multiple of the 16-column group. */
static void test_multi(ds_pool *pools[4]) {
    const int64_t K = 96, Ns[3] = {48, 21, 37};
    int bad = 0, runs = 0;
    for (int ti = 0; ti < 4; ti++) {
        tw W[3];
        for (int i = 0; i < 3; i++) W[i] = make_weight(types[ti], K, Ns[i]);
        const ds_weight *const Wp[3] = {&W[0].w, &W[1].w, &W[2].w};
        float *x = make_x(16, K), *ya[3], *yb[3];
        for (int i = 0; i < 3; i++) {
            ya[i] = malloc((size_t)(16 * Ns[i]) * sizeof(float));
            yb[i] = malloc((size_t)(16 * Ns[i]) * sizeof(float));
        }
        for (int v = 0; v < 2; v++)
            for (int M = 1; M <= 16; M++)
                for (int th = 0; th < 4; th++) {
                    for (int i = 0; i < 3; i++) ds_matmul((ds_variant)v, Wp[i], M, x, ya[i], pools[th]);
                    ds_matmul_multi((ds_variant)v, 3, Wp, M, x, yb, pools[th]);
                    for (int i = 0; i < 3; i++) {
                        runs++;
                        bad += memcmp(ya[i], yb[i], (size_t)(M * Ns[i]) * sizeof(float)) != 0;
                    }
                }
        for (int i = 0; i < 3; i++) { free(W[i].data); free(ya[i]); free(yb[i]); }
        free(x);
    }
    CHECK(bad == 0, "ds_matmul_multi differs from separate calls in %d of %d outputs", bad, runs);
    printf("%s ds_matmul_multi == separate ds_matmul calls (memcmp), 4 types x 2 variants, M=1..16, "
           "no pool and threads 1..3, %d comparisons\n", bad ? "FAIL" : "PASS", runs);
}

/* ds_matmul_epi: y bitwise ds_matmul's; every column in exactly one
 * epilogue call, called on ranges ordered by chunk, chunk < the threads;
 * a small K is split too. */
typedef struct {
    atomic_int hits[4096];
    int64_t lo[8], hi[8];
    atomic_int bad;
} epi_rec;
static void epi_note(void *arg, int64_t n0, int64_t n1, int chunk) {
    epi_rec *r = arg;
    if (chunk < 0 || chunk >= 8) { atomic_fetch_add(&r->bad, 1); return; }
    r->lo[chunk] = n0;
    r->hi[chunk] = n1;
    for (int64_t i = n0; i < n1; i++) atomic_fetch_add(&r->hits[i], 1);
}
static void test_epi(ds_pool *pools[4]) {
    static const int64_t Ks[] = {32, 384};
    int bad = 0, split = 0;
    for (int ki = 0; ki < 2; ki++)
        for (int ti = 0; ti < 4; ti++) {
            const int64_t K = Ks[ki], N = 4096;
            tw W = make_weight(types[ti], K, N);
            for (int M = 1; M <= 3; M += 2) {
                float *x = make_x(M, K), *y0 = malloc((size_t)M * N * sizeof(float)),
                      *y1 = malloc((size_t)M * N * sizeof(float));
                for (int pi = 0; pi < 4; pi++) {
                    ds_matmul(DS_CANONICAL, &W.w, M, x, y0, pools[pi]);
                    epi_rec *r = calloc(1, sizeof *r);
                    for (int c = 0; c < 8; c++) r->lo[c] = r->hi[c] = -1;
                    ds_matmul_epi(DS_CANONICAL, &W.w, M, x, y1, pools[pi], epi_note, r);
                    bad += memcmp(y0, y1, (size_t)M * N * sizeof(float)) != 0;
                    for (int64_t i = 0; i < N; i++) bad += atomic_load(&r->hits[i]) != 1;
                    int64_t at = 0, used = 0;
                    for (int c = 0; c < 8; c++) {
                        if (r->lo[c] < 0) continue;
                        bad += r->lo[c] != at || c >= ds_pool_threads(pools[pi]);
                        at = r->hi[c];
                        used++;
                    }
                    bad += at != N || atomic_load(&r->bad);
                    split += used > 1;
                    free(r);
                }
                free(x); free(y0); free(y1);
            }
            free(W.data);
        }
    CHECK(bad == 0 && split > 0, "ds_matmul_epi: %d mismatches, %d split calls", bad, split);
    printf("%s ds_matmul_epi == ds_matmul (memcmp), each column in one ordered epilogue range, K=32 and 384 split "
           "over the pool (%d split calls)\n", bad == 0 && split > 0 ? "PASS" : "FAIL", split);
}

int main(void) {
    ds_pool *pools[4] = {NULL, ds_pool_new(1), ds_pool_new(2), ds_pool_new(3)};
    test_half_conversions();
    test_hw_conversions();
    test_f16_round();
    test_quantize();
    test_registry();
    test_accuracy(pools[2]);
    test_exactness(pools);
    test_canonical_q8(pools);
    test_packed_q8(pools);
    test_multi(pools);
    test_epi(pools);
    for (int i = 1; i < 4; i++) ds_pool_free(pools[i]);
    printf("%d checks passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
