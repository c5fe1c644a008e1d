/* test_dsmath.c — the project-owned math of kernels/dsmath.h (issue 22 item 6,
 * issue 24 item 4): accuracy against the C library's double functions (a
 * reference only; the functions under test never call it), special values,
 * and a digest of their bits over fixed inputs, pinned here, so that every
 * build (x86 levels, the aarch64 cross build under qemu, the CUDA host side)
 * is held to the same bytes.
 *
 *   DSMATH_SWEEP=N   sweep every N-th float instead of the default stride
 *                    (DSMATH_SWEEP=1: all 2^31 non-negative floats; minutes) */
#include "kernels/dsmath.h"
#include "kernels/cpu/exp_many.h"
#include "kernels/cpu/simd.h"
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

static float f_of(uint32_t u) { return ds_math_bits2f(u); }
static uint32_t bits_of(float f) { return ds_math_f2bits(f); }

/* distance in ulps between two floats of the same sign (or both zero) */
static int64_t ulp_dist(float a, float b) {
    int64_t ia = (int32_t)bits_of(a), ib = (int32_t)bits_of(b);
    if (ia < 0) ia = (int64_t)INT32_MIN - ia;
    if (ib < 0) ib = (int64_t)INT32_MIN - ib;
    return ia > ib ? ia - ib : ib - ia;
}

static uint32_t sweep_stride(uint32_t dflt) {
    const char *s = getenv("DSMATH_SWEEP");
    long v = s ? strtol(s, NULL, 10) : 0;
    return v > 0 ? (uint32_t)v : dflt;
}

/* ---- sin / cos ----------------------------------------------------------------- */
/* every stride-th non-negative finite float, both reduction paths: the float
 * results against sin / cos of the exact double argument rounded once */
static void test_sincos_sweep(void) {
    const uint32_t stride = sweep_stride(251);
    uint64_t n = 0, off = 0, off_big = 0;
    int64_t worst = 0;
    float worst_x = 0;
    for (uint64_t u = 1; u < 0x7f800000u; u += stride) {
        const float x = f_of((uint32_t)u);
        float s, c;
        ds_sincosf(x, &s, &c);
        const float rs = (float)sin((double)x), rc = (float)cos((double)x);
        n++;
        if (bits_of(s) != bits_of(rs) || bits_of(c) != bits_of(rc)) {
            if (x >= 16777216.0f) off_big++; else off++;
            int64_t d = ulp_dist(s, rs) > ulp_dist(c, rc) ? ulp_dist(s, rs) : ulp_dist(c, rc);
            if (d > worst) { worst = d; worst_x = x; }
        }
        /* odd / even symmetry, exactly */
        float sn, cn;
        ds_sincosf(-x, &sn, &cn);
        if (bits_of(sn) != (bits_of(s) ^ 0x80000000u) || bits_of(cn) != bits_of(c)) {
            CHECK(0, "sincos(-x) is not (-sin x, cos x) at x=%a", x);
            return;
        }
    }
    /* a double argument rounded once can differ from the correctly rounded
     * float only at a near-tie; none is expected at this density */
    CHECK(worst <= 1 && off + off_big <= n / 1000000, "sincos: %llu + %llu of %llu floats differ from the rounded double "
          "(worst %lld ulp at %a)", (unsigned long long)off, (unsigned long long)off_big, (unsigned long long)n,
          (long long)worst, worst_x);
    printf("PASS dsmath_sincos_sweep floats=%llu stride=%u differing=%llu+%llu worst_ulp=%lld\n",
           (unsigned long long)n, stride, (unsigned long long)off, (unsigned long long)off_big, (long long)worst);
}

/* RoPE's own angles: every position below 65536 times every inverse
 * frequency of a few (freq_base, head_dim) pairs */
static void test_sincos_rope_angles(void) {
    static const float bases[] = { 10000.0f, 1000000.0f, 500000.0f };
    static const int hds[] = { 64, 128 };
    uint64_t n = 0, off = 0;
    for (int bi = 0; bi < 3; bi++)
        for (int hi = 0; hi < 2; hi++)
            for (int i = 0; i < hds[hi] / 2; i += 3) {
                const float inv = ds_powf(bases[bi], -2.0f * (float)i / (float)hds[hi]);
                for (int p = 0; p < 65536; p += 7) {
                    const float th = (float)p * inv;
                    float s, c;
                    ds_sincosf(th, &s, &c);
                    n++;
                    if (ulp_dist(s, (float)sin((double)th)) > 1 || ulp_dist(c, (float)cos((double)th)) > 1) {
                        CHECK(0, "sincos(%a) = (%a, %a), more than 1 ulp off", th, s, c);
                        return;
                    }
                    off += bits_of(s) != bits_of((float)sin((double)th)) || bits_of(c) != bits_of((float)cos((double)th));
                }
            }
    CHECK(off <= n / 1000000, "sincos on RoPE angles: %llu of %llu differ", (unsigned long long)off, (unsigned long long)n);
    printf("PASS dsmath_sincos_rope_angles angles=%llu differing=%llu\n", (unsigned long long)n, (unsigned long long)off);
}

static void test_sincos_special(void) {
    float s, c;
    ds_sincosf(0.0f, &s, &c);
    CHECK(bits_of(s) == 0u && c == 1.0f, "sincos(+0)");
    ds_sincosf(-0.0f, &s, &c);
    CHECK(bits_of(s) == 0x80000000u && c == 1.0f, "sincos(-0) must keep the sign of zero");
    ds_sincosf(INFINITY, &s, &c);
    CHECK(isnan(s) && isnan(c), "sincos(inf) is NaN");
    ds_sincosf(-INFINITY, &s, &c);
    CHECK(isnan(s) && isnan(c), "sincos(-inf) is NaN");
    ds_sincosf(NAN, &s, &c);
    CHECK(isnan(s) && isnan(c), "sincos(NaN) is NaN");
    ds_sincosf(f_of(1u), &s, &c);                          /* least subnormal */
    CHECK(bits_of(s) == 1u && c == 1.0f, "sincos(2^-149)");
    ds_sincosf(FLT_MAX, &s, &c);
    CHECK(bits_of(s) == bits_of((float)sin((double)FLT_MAX)) && bits_of(c) == bits_of((float)cos((double)FLT_MAX)),
          "sincos(FLT_MAX) = (%a, %a)", s, c);
    /* the floats nearest a multiple of pi/2 below 2^24 and above (the
     * reductions' hard cases): still the rounded double */
    static const float hard[] = { 1.57079637f, 3.14159274f, 4.71238899f, 6.28318548f, 16331238.0f, 16367173.0f,
                                  0x1.1e1452p+42f, 0x1.c4a9c6p+100f };
    for (size_t i = 0; i < sizeof hard / sizeof hard[0]; i++) {
        ds_sincosf(hard[i], &s, &c);
        CHECK(ulp_dist(s, (float)sin((double)hard[i])) <= 1 && ulp_dist(c, (float)cos((double)hard[i])) <= 1,
              "sincos(%a) = (%a, %a), libm's double rounded (%a, %a)", hard[i], s, c, (float)sin((double)hard[i]),
              (float)cos((double)hard[i]));
    }
    PASS("dsmath_sincos_special");
}

/* ---- pow (RoPE's inverse frequencies) -------------------------------------------- */
static void test_powf(void) {
    static const float bases[] = { 10000.0f, 1000000.0f, 500000.0f, 75000.0f, 2.0f, 1.5f, 0.25f, 1e30f, 1e-30f };
    static const int hds[] = { 32, 64, 80, 96, 128, 256 };
    int n = 0, off = 0;
    for (size_t bi = 0; bi < sizeof bases / sizeof bases[0]; bi++)
        for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
            for (int i = 0; i <= hds[hi]; i++) {
                const float e = -2.0f * (float)i / (float)hds[hi];
                const float r = ds_powf(bases[bi], e), ref = (float)pow((double)bases[bi], (double)e);
                n++;
                off += bits_of(r) != bits_of(ref);
                if (ulp_dist(r, ref) > 1) {
                    CHECK(0, "ds_powf(%g, %a) = %a, pow gives %a", bases[bi], e, r, ref);
                    return;
                }
            }
    CHECK(off == 0, "ds_powf: %d of %d differ from the rounded double pow", off, n);
    CHECK(ds_powf(1.0f, 123.0f) == 1.0f && ds_powf(7.0f, 0.0f) == 1.0f && ds_powf(2.0f, 10.0f) == 1024.0f &&
              ds_powf(2.0f, -149.0f) == f_of(1u) && ds_powf(2.0f, -151.0f) == 0.0f && isinf(ds_powf(2.0f, 128.0f)),
          "ds_powf exact cases");
    CHECK(isnan(ds_powf(-2.0f, 2.0f)) && isnan(ds_powf(0.0f, 1.0f)) && isnan(ds_powf(NAN, 1.0f)) &&
              isnan(ds_powf(2.0f, NAN)) && isinf(ds_powf(INFINITY, 0.5f)) && ds_powf(INFINITY, -0.5f) == 0.0f,
          "ds_powf special values");
    printf("PASS dsmath_powf cases=%d differing=%d\n", n, off);
}

/* ---- tanh and the sigmoid ------------------------------------------------------------- */
static void test_tanhf(void) {
    const uint32_t stride = sweep_stride(61);
    uint64_t n = 0, off = 0;
    for (uint64_t u = 0; u <= 0x41400000u; u += stride) {      /* [0, 12] */
        const float x = f_of((uint32_t)u);
        const float t = ds_tanhf(x), ref = (float)tanh((double)x);
        n++;
        off += bits_of(t) != bits_of(ref);
        if (ulp_dist(t, ref) > 1 || bits_of(ds_tanhf(-x)) != (bits_of(t) ^ 0x80000000u)) {
            CHECK(0, "ds_tanhf(%a) = %a, tanh gives %a (or tanh(-x) != -tanh(x))", x, t, ref);
            return;
        }
    }
    CHECK(off <= n / 1000000, "ds_tanhf: %llu of %llu differ", (unsigned long long)off, (unsigned long long)n);
    CHECK(ds_tanhf(INFINITY) == 1.0f && ds_tanhf(-INFINITY) == -1.0f && isnan(ds_tanhf(NAN)) &&
              bits_of(ds_tanhf(-0.0f)) == 0x80000000u && ds_tanhf(100.0f) == 1.0f,
          "ds_tanhf special values");
    printf("PASS dsmath_tanhf floats=%llu stride=%u differing=%llu\n", (unsigned long long)n, stride,
           (unsigned long long)off);
}

static void test_sigmoidf(void) {
    int bad = 0;
    for (float t = -30.0f; t <= 30.0f; t += 0.00731f) {
        const double ref = 1.0 / (1.0 + exp(-(double)t));
        const float s = ds_sigmoidf(t);
        if (fabs((double)s - ref) > 4.0 * ref * FLT_EPSILON) bad++;
    }
    CHECK(bad == 0, "ds_sigmoidf: %d values more than 4 ulp from the reference", bad);
    CHECK(ds_sigmoidf(INFINITY) == 1.0f && ds_sigmoidf(-INFINITY) == 0.0f && isnan(ds_sigmoidf(NAN)) &&
              ds_sigmoidf(0.0f) == 0.5f,
          "ds_sigmoidf special values");
    PASS("dsmath_sigmoidf");
}

/* ---- double exp and log ----------------------------------------------------------------- */
static uint64_t xs64(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}
static int64_t ulp_dist_d(double a, double b) {
    int64_t ia = (int64_t)ds_math_d2bits(a), ib = (int64_t)ds_math_d2bits(b);
    if (ia < 0) ia = INT64_MIN - ia;
    if (ib < 0) ib = INT64_MIN - ib;
    return ia > ib ? ia - ib : ib - ia;
}

static void test_exp_log(void) {
    uint64_t st = 0x9E3779B97F4A7C15ull;
    int64_t we = 0, wl = 0;
    double wex = 0, wlx = 0;
    for (int i = 0; i < 2000000; i++) {
        /* exp: uniform over its finite range; log: random bit patterns of
         * positive doubles (every binade, subnormals included) */
        const double xe = ((double)(xs64(&st) >> 11) / 9007199254740992.0) * 1450.0 - 740.0;
        const int64_t de = ulp_dist_d(ds_exp(xe), exp(xe));
        if (de > we) { we = de; wex = xe; }
        const double xl = ds_math_bits2d(xs64(&st) & 0x7fefffffffffffffull);
        const int64_t dl = ulp_dist_d(ds_log(xl), log(xl));
        if (dl > wl) { wl = dl; wlx = xl; }
    }
    /* near 1, where log's cancellation would show */
    for (int i = -20000; i <= 20000; i++) {
        const double x = 1.0 + (double)i * 0x1p-40;
        const int64_t dl = ulp_dist_d(ds_log(x), log(x));
        if (dl > wl) { wl = dl; wlx = x; }
    }
    /* subnormal results of exp are compared absolutely (one ulp of 2^-1074) */
    CHECK(we <= 2, "ds_exp: %lld ulp at %a", (long long)we, wex);
    CHECK(wl <= 2, "ds_log: %lld ulp at %a", (long long)wl, wlx);
    CHECK(ds_exp(0.0) == 1.0 && isinf(ds_exp(710.0)) && ds_exp(-746.0) == 0.0 && ds_exp(-INFINITY) == 0.0 &&
              isinf(ds_exp(INFINITY)) && isnan(ds_exp(NAN)) && ds_exp(-745.0) == ds_math_bits2d(1u),
          "ds_exp special values");
    CHECK(ds_log(1.0) == 0.0 && isinf(ds_log(0.0)) && ds_log(0.0) < 0 && isnan(ds_log(-1.0)) && isnan(ds_log(NAN)) &&
              isinf(ds_log(INFINITY)) && ulp_dist_d(ds_log(ds_math_bits2d(1u)), log(ds_math_bits2d(1u))) <= 1 &&
              ulp_dist_d(ds_log(2.0), 0x1.62e42fefa39efp-1) == 0,
          "ds_log special values");
    printf("PASS dsmath_exp_log samples=2000000 exp_worst_ulp=%lld log_worst_ulp=%lld\n", (long long)we, (long long)wl);
}

/* ---- the bits, pinned ---------------------------------------------------------------------
 * FNV-1a over the results on fixed inputs. The constant below was recorded
 * on x86-64; the aarch64 build (under qemu-aarch64 in make test) and every
 * SIMD level must print it too. A change here is a change of output bits. */
#define DSMATH_DIGEST 0x20e5801865573193ull
static void fnv(uint64_t *h, uint32_t v) {
    for (int i = 0; i < 4; i++) { *h ^= (v >> (8 * i)) & 0xffu; *h *= 0x100000001b3ull; }
}
static void test_digest(void) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t u = 0; u < 0x7f800000u; u += 65521) {
        const float x = f_of(u);
        float s, c;
        ds_sincosf(x, &s, &c);
        fnv(&h, bits_of(s)); fnv(&h, bits_of(c));
        fnv(&h, bits_of(ds_tanhf(x > 20.0f ? x * 1e-7f : x)));
        fnv(&h, bits_of(ds_sigmoidf(x > 100.0f ? -x * 1e-37f : -x)));
        fnv(&h, bits_of(ds_expf(x > 100.0f ? -x * 1e-37f : -x)));
        fnv(&h, bits_of(ds_powf(10000.0f, -(float)(u % 257) / 128.0f)));
        const double d = (double)x;
        const uint64_t le = ds_math_d2bits(ds_log(d)), ee = ds_math_d2bits(ds_exp(-d * 1e-30));
        fnv(&h, (uint32_t)le); fnv(&h, (uint32_t)(le >> 32));
        fnv(&h, (uint32_t)ee); fnv(&h, (uint32_t)(ee >> 32));
    }
    CHECK(h == DSMATH_DIGEST, "dsmath digest %016llx, recorded %016llx: the functions' bits changed",
          (unsigned long long)h, (unsigned long long)DSMATH_DIGEST);
    printf("%s dsmath_digest %016llx\n", h == DSMATH_DIGEST ? "PASS" : "FAIL", (unsigned long long)h);
}

/* ds_exp_many at every level == ds_exp per element: a sweep over the
 * sampler's range (x - max in [-800, 0]), the whole double range's
 * exponents, the thresholds' neighbours and the special values, at
 * lengths that leave every tail (n % 8 = 0..7). */
static void test_exp_many(void) {
    enum { N = 40000 };
    static double x[N], y[N];
    uint64_t r = 12345;
    for (int i = 0; i < N; i++) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        const double u = (double)(r >> 11) / 9007199254740992.0;
        if (i < 20000) x[i] = -800.0 * u;                                  /* the sampler's range */
        else if (i < 36000) x[i] = (u - 0.5) * 1500.0;                     /* both overflow edges */
        else {
            uint64_t b = r;                                                /* any bits: NaNs, subnormals, huge */
            memcpy(&x[i], &b, sizeof b);
        }
    }
    static const double special[] = {0.0, -0.0, 1.0, -1.0, 709.782712893384, 709.7827128933841, 709.78271289338397,
                                     -745.1332191019412, -745.13321910194122, -745.1332191019411, -708.4, -708.39641853226408,
                                     -1022.0 * 0.6931471805599453, 1e-300, -1e-300, 4.9e-324, INFINITY, -INFINITY, NAN, -NAN};
    memcpy(x, special, sizeof special);
    int bad = 0, levels = 0;
    for (int lv = 0; lv < DS_LVL_COUNT; lv++) {
        if (!ds_simd_level_ok(lv)) continue;
        levels++;
        for (int n = N - 7; n <= N; n++) {
            ds_exp_many_at(lv, x, y, n);
            for (int i = 0; i < n; i++) {
                const double w = ds_exp(x[i]);
                if (memcmp(&w, &y[i], sizeof w) && !(w != w && y[i] != y[i])) {
                    if (bad++ < 5) printf("  level %s: ds_exp_many(%.17g) = %.17g, ds_exp = %.17g\n", ds_simd_level_name(lv), x[i], y[i], w);
                }
            }
        }
    }
    CHECK(bad == 0, "ds_exp_many differs from ds_exp in %d elements", bad);
    if (!bad) printf("PASS exp_many levels=%d values=%d: every element == ds_exp's bits (tails 0..7)\n", levels, N);
}

int main(void) {
    test_exp_many();
    test_sincos_special();
    test_sincos_sweep();
    test_sincos_rope_angles();
    test_powf();
    test_tanhf();
    test_sigmoidf();
    test_exp_log();
    test_digest();
    return tu_finish("test_dsmath");
}
