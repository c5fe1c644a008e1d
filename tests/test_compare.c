/* test_compare.c — exhaustive edge cases of the dspark_diag comparator.
 *
 * Every expectation is on raw bits or integers where possible: the
 * comparator exists to see what float == hides, so the test must not use ==
 * on floats either (doubles of known exact values are compared with a
 * bit-level helper). */
#include "dspark_diag.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_pass;

#define CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "  check failed %s:%d: %s\n", __FILE__, __LINE__, #cond); ok = 0; } } while (0)
#define BEGIN(name) { const char *tname_ = name; int ok = 1;
#define END() if (ok) { g_pass++; printf("PASS %s\n", tname_); } \
              else { g_fail++; printf("FAIL %s\n", tname_); } }

static float fb(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint64_t db(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static int deq(double a, double b) { return db(a) == db(b); }           /* bit-equal doubles */
static int near(double a, double b, double tol) { return fabs(a - b) <= tol; }
static int dinf(double d) { return (db(d) & 0x7fffffffffffffffull) == 0x7ff0000000000000ull; }

/* capture a FILE* output into a string */
static char *capture_out(int (*fn)(FILE *, const dsd_metrics *, const char *), const dsd_metrics *m,
                         const char *prefix) {
    FILE *f = tmpfile();
    if (!f) return NULL;
    fn(f, m, prefix);
    long len = ftell(f);
    rewind(f);
    char *s = calloc((size_t)len + 1, 1);
    if (s && fread(s, 1, (size_t)len, f) != (size_t)len) { free(s); s = NULL; }
    fclose(f);
    return s;
}
static int kv_fn(FILE *f, const dsd_metrics *m, const char *p) { return dsd_metrics_print_kv(f, p, m); }
static int json_fn(FILE *f, const dsd_metrics *m, const char *p) { (void)p; return dsd_metrics_json(f, m); }

/* JSON sanity without a parser: balanced {} [] outside strings, no bare
 * nan/inf tokens outside strings */
static int json_sane(const char *s) {
    int depth = 0, in_str = 0;
    for (const char *p = s; *p; p++) {
        if (in_str) {
            if (*p == '\\') { if (p[1]) p++; continue; }
            if (*p == '"') in_str = 0;
            continue;
        }
        if (*p == '"') in_str = 1;
        else if (*p == '{' || *p == '[') depth++;
        else if (*p == '}' || *p == ']') { if (--depth < 0) return 0; }
        else if (!strncmp(p, "nan", 3) || !strncmp(p, "NaN", 3) || !strncmp(p, "inf", 3) ||
                 !strncmp(p, "Infinity", 8)) return 0;
    }
    return depth == 0 && !in_str;
}

int main(void) {
    dsd_metrics m;
    const float min_sub = fb(0x00000001u), neg_min_sub = fb(0x80000001u);
    const float max_fin = fb(0x7f7fffffu), pinf = fb(0x7f800000u), ninf = fb(0xff800000u);

    BEGIN("identical_arrays")
        float a[] = { 1.0f, -2.5f, 0.25f, 1024.0f, 0.0f, -0.0f, min_sub, pinf };
        CHECK(dsd_compare(a, a, 8, &m) == DSD_OK);
        CHECK(m.valid && m.bit_exact && m.n == 8 && m.mismatch_count == 0);
        CHECK(m.first_mismatch == -1 && m.first_diff_bit == -1 && m.max_ulp == 0 && m.max_ulp_index == -1);
        CHECK(deq(m.max_abs, 0.0) && deq(m.max_rel, 0.0) && deq(m.mismatch_fraction, 0.0));
        CHECK(m.delta_pos == 0 && m.delta_neg == 0 && m.delta_zero == 0 && !m.metrics_undefined);
        CHECK(deq(m.rel_l2, 0.0));
    END()

    BEGIN("signed_zero_is_1ulp_mismatch")
        float a = 0.0f, e = -0.0f;
        CHECK(dsd_compare(&a, &e, 1, &m) == DSD_OK);
        CHECK(!m.bit_exact && m.mismatch_count == 1 && m.first_mismatch == 0);
        CHECK(m.first_actual_bits == 0x00000000u && m.first_expected_bits == 0x80000000u);
        CHECK(m.max_ulp == 1 && m.first_diff_bit == 31);
        CHECK(deq(m.max_abs, 0.0) && deq(m.max_rel, 0.0));
        CHECK(m.delta_zero == 1 && m.delta_pos == 0 && m.delta_neg == 0);
        CHECK(!m.metrics_undefined);
    END()

    BEGIN("adjacent_floats_1ulp")
        float a[] = { 1.0f, -1.0f, 3.0e-39f /* subnormal */ };
        float e[] = { nextafterf(1.0f, 2.0f), nextafterf(-1.0f, -2.0f), nextafterf(3.0e-39f, 1.0f) };
        CHECK(dsd_compare(a, e, 3, &m) == DSD_OK);
        CHECK(m.mismatch_count == 3 && m.max_ulp == 1);
        CHECK(m.delta_neg == 2 && m.delta_pos == 1);       /* 1 < 1+, -1 > -1-, sub < sub+ */
        CHECK(m.first_diff_bit == 0);                      /* 0x3f800000 ^ 0x3f800001 */
    END()

    BEGIN("across_zero_ulp")
        /* total order: -min_sub, -0, +0, +min_sub -> 3 steps (see header) */
        float a = neg_min_sub, e = min_sub;
        dsd_compare(&a, &e, 1, &m);
        CHECK(m.max_ulp == 3 && m.delta_neg == 1 && m.first_diff_bit == 31);
        float z = -0.0f;
        dsd_compare(&z, &e, 1, &m);
        CHECK(m.max_ulp == 2);
        float pz = 0.0f;
        dsd_compare(&a, &pz, 1, &m);
        CHECK(m.max_ulp == 2);
        float b = fb(0x80000005u), c = fb(0x00000007u);    /* -5 sub vs +7 sub: 5 + 1 + 7 */
        dsd_compare(&b, &c, 1, &m);
        CHECK(m.max_ulp == 13);
    END()

    BEGIN("subnormals_count")
        float a = fb(0x00000003u), e = fb(0x00800002u);   /* sub 3 vs normal min+2 */
        dsd_compare(&a, &e, 1, &m);
        CHECK(m.max_ulp == 0x00800002u - 3u);
        CHECK(deq(m.max_abs, fabs((double)a - (double)e)));
        float s1 = fb(0x00400000u), s2 = fb(0x00400001u);
        dsd_compare(&s1, &s2, 1, &m);
        CHECK(m.max_ulp == 1 && deq(m.max_abs, ldexp(1.0, -149)) && m.first_diff_bit == 0);
    END()

    BEGIN("max_finite_vs_inf")
        dsd_compare(&max_fin, &pinf, 1, &m);
        CHECK(!m.bit_exact && m.max_ulp == 1 && dinf(m.max_abs) && dinf(m.max_rel));
        CHECK(m.delta_neg == 1 && !m.metrics_undefined && m.first_diff_bit == 23);  /* ^ = 0x00ffffff */
        CHECK(dinf(m.rms_abs));
    END()

    BEGIN("inf_vs_inf")
        dsd_compare(&pinf, &pinf, 1, &m);
        CHECK(m.bit_exact && m.max_ulp == 0);
        dsd_compare(&ninf, &ninf, 1, &m);
        CHECK(m.bit_exact);
        dsd_compare(&pinf, &ninf, 1, &m);
        CHECK(!m.bit_exact && m.delta_pos == 1 && dinf(m.max_abs) && m.first_diff_bit == 31);
        /* keys: +inf = 0xff800000, -inf = ~0xff800000 = 0x007fffff */
        CHECK(m.max_ulp == 0xff800000ull - 0x007fffffull);
        float one = 1.0f;
        dsd_compare(&one, &ninf, 1, &m);
        CHECK(dinf(m.max_abs) && m.max_ulp > 0 && m.max_ulp < 0xffffffffull);
    END()

    BEGIN("nan_same_payload_bit_exact")
        float q = fb(0x7fc00001u), s = fb(0x7f800001u), nq = fb(0xffc12345u);
        float a[] = { q, s, nq, 1.0f }, e[] = { q, s, nq, 1.0f };
        CHECK(dsd_compare(a, e, 4, &m) == DSD_OK);
        CHECK(m.bit_exact && m.mismatch_count == 0 && !m.metrics_undefined && m.nan_mismatches == 0);
        CHECK(deq(m.rel_l2, 0.0) && !isnan(m.cosine) && !isnan(m.rms_abs));
    END()

    BEGIN("nan_different_payload_mismatch_undefined")
        float a[] = { 2.0f, fb(0x7fc00001u), fb(0x7fc00000u), 4.0f };
        float e[] = { 2.0f, fb(0x7fc00002u), 5.0f, 4.5f };
        CHECK(dsd_compare(a, e, 4, &m) == DSD_OK);
        CHECK(!m.bit_exact && m.mismatch_count == 3 && m.nan_mismatches == 2 && m.metrics_undefined);
        CHECK(m.first_mismatch == 1 && m.first_actual_bits == 0x7fc00001u && m.first_expected_bits == 0x7fc00002u);
        CHECK(m.first_diff_bit == 1);
        /* NaN elements are excluded: the only numeric mismatch is 4 vs 4.5 */
        CHECK(deq(m.max_abs, 0.5) && m.delta_zero == 2 && m.delta_neg == 1);
        CHECK(deq(m.p50_abs, 0.5) && deq(m.p99_abs, 0.5));
        CHECK(deq(m.rms_abs, sqrt(0.25 / 2.0)));      /* over the 2 non-NaN elements */
        CHECK(m.delta_pos + m.delta_neg + m.delta_zero == m.mismatch_count);
    END()

    BEGIN("n_zero")
        float a = 1.0f;
        CHECK(dsd_compare(&a, &a, 0, &m) == DSD_OK);
        CHECK(m.valid && m.bit_exact && m.n == 0 && deq(m.mismatch_fraction, 0.0));
        CHECK(deq(m.cosine, 1.0) && deq(m.rel_l2, 0.0));
    END()

    BEGIN("null_inputs_invalid")
        float a = 1.0f;
        CHECK(dsd_compare(NULL, &a, 1, &m) == DSD_ERR_ARG && !m.valid && !m.bit_exact);
        CHECK(dsd_compare(&a, NULL, 1, &m) == DSD_ERR_ARG && !m.valid && !m.bit_exact);
        CHECK(dsd_compare(NULL, NULL, 0, &m) == DSD_ERR_ARG && !m.valid && !m.bit_exact);
        CHECK(dsd_compare(&a, &a, 1, NULL) == DSD_ERR_ARG);
    END()

    BEGIN("first_mismatch_and_diff_bit")
        float a[] = { 1.0f, 2.0f, 3.0f, 5.0f };
        float e[] = { 1.0f, 4.0f, 3.0f, 8.0f };
        dsd_compare(a, e, 4, &m);
        CHECK(m.first_mismatch == 1 && m.mismatch_count == 2);
        CHECK(m.first_actual_bits == 0x40000000u && m.first_expected_bits == 0x40800000u);
        CHECK(m.first_diff_bit == 23);                     /* exponent lsb */
        CHECK(deq(m.max_abs, 3.0) && m.max_ulp_index == 1 && m.max_ulp == 0x800000u);  /* 2 vs 4 is more ULPs than 5 vs 8 */
        CHECK(deq(m.mismatch_fraction, 0.5) && m.delta_neg == 2);
        /* seed-style value: 0xbb9ce2ac vs 0xbb9ce2ad differ in bit 0 */
        float x = fb(0xbb9ce2acu), y = fb(0xbb9ce2adu);
        dsd_compare(&x, &y, 1, &m);
        CHECK(m.first_diff_bit == 0 && m.max_ulp == 1 && m.delta_pos == 1);
        float p = fb(0x3f800000u), q = fb(0x3fc00000u);   /* 1.0 vs 1.5 -> mantissa bit 22 */
        dsd_compare(&p, &q, 1, &m);
        CHECK(m.first_diff_bit == 22 && m.max_ulp == 0x400000u);
    END()

    BEGIN("percentiles_known_distribution")
        /* mismatches with |delta| = 1..100 (shuffled), plus exact elements
         * that must not enter the percentile population */
        enum { N = 150 };
        float a[N], e[N];
        for (int i = 0; i < N; i++) { a[i] = (float)(i * 1000); e[i] = a[i]; }
        for (int k = 1; k <= 100; k++) {
            int idx = (k * 37) % N;                        /* 37 coprime with 150: distinct */
            e[idx] = a[idx] + (float)k;
        }
        CHECK(dsd_compare(a, e, N, &m) == DSD_OK);
        CHECK(m.mismatch_count == 100 && m.percentiles_valid);
        CHECK(deq(m.p50_abs, 50.0) && deq(m.p95_abs, 95.0) && deq(m.p99_abs, 99.0));
        CHECK(deq(m.max_abs, 100.0) && m.delta_neg == 100);
        CHECK(deq(m.mean_abs, 5050.0 / N));
        CHECK(near(m.rms_abs, sqrt(338350.0 / N), 1e-12));
        /* caller scratch gives identical results */
        double scratch[N];
        dsd_metrics m2;
        dsd_compare_ex(a, e, N, &m2, scratch, N);
        CHECK(deq(m2.p50_abs, 50.0) && deq(m2.p95_abs, 95.0) && deq(m2.p99_abs, 99.0));
        /* scratch too small: falls back to malloc, same answer */
        dsd_compare_ex(a, e, N, &m2, scratch, 3);
        CHECK(deq(m2.p95_abs, 95.0));
        /* single mismatch: all percentiles are it */
        float s1 = 1.0f, s2 = 1.25f;
        dsd_compare(&s1, &s2, 1, &m);
        CHECK(deq(m.p50_abs, 0.25) && deq(m.p95_abs, 0.25) && deq(m.p99_abs, 0.25));
        CHECK(deq(m.max_rel, 0.2));
    END()

    BEGIN("cosine_rel_l2_known_vectors")
        float e[] = { 3.0f, 4.0f }, a[] = { 3.0f, 4.5f };
        dsd_compare(a, e, 2, &m);
        CHECK(near(m.rel_l2, 0.1, 1e-15));                  /* 0.5 / 5 */
        double cos_ref = (9.0 + 18.0) / (5.0 * sqrt(9.0 + 20.25));
        CHECK(near(m.cosine, cos_ref, 1e-15));
        float o1[] = { 1.0f, 0.0f }, o2[] = { 0.0f, 1.0f };
        dsd_compare(o1, o2, 2, &m);
        CHECK(near(m.cosine, 0.0, 1e-15) && near(m.rel_l2, sqrt(2.0), 1e-15));
        float n1[] = { 1.0f, -2.0f }, n2[] = { -1.0f, 2.0f };
        dsd_compare(n1, n2, 2, &m);
        CHECK(near(m.cosine, -1.0, 1e-15) && near(m.rel_l2, 2.0, 1e-15));
        float z[] = { 0.0f, 0.0f }, nz[] = { -0.0f, 0.0f };
        dsd_compare(z, nz, 2, &m);
        CHECK(deq(m.cosine, 1.0) && deq(m.rel_l2, 0.0) && m.mismatch_count == 1);
        dsd_compare(o1, z, 2, &m);                          /* expected all zero */
        CHECK(dinf(m.rel_l2) && deq(m.cosine, 0.0));
    END()

    BEGIN("cosine_precision_16ulp_noise")
        /* 16-ULP noise on 4096 elements: 1 - cos must be ~rel_l2^2/2, a number
         * ~1e-12 whose digits a naive dot product would drown in rounding */
        enum { N = 4096 };
        float *a = malloc(N * sizeof *a), *e = malloc(N * sizeof *e);
        uint32_t s = 12345;
        for (int i = 0; i < N; i++) {
            s = s * 1664525u + 1013904223u;
            e[i] = (float)((int)(s >> 8) - (1 << 23)) / (float)(1 << 23);
            uint32_t u; memcpy(&u, &e[i], 4);
            uint32_t v = (i % 3 == 0) ? u + 16 : (i % 3 == 1) ? u : ((u & 0x7fffffffu) >= 16 ? u - 16 : u + 16);
            a[i] = fb(v);
        }
        dsd_compare(a, e, N, &m);
        double pred = 1.0 - m.rel_l2 * m.rel_l2 / 2.0;
        CHECK(m.max_ulp == 16 && m.cosine < 1.0 && 1.0 - pred > 1e-14);
        CHECK(fabs((1.0 - m.cosine) - (1.0 - pred)) < 0.01 * (1.0 - pred));
        CHECK(m.delta_pos + m.delta_neg + m.delta_zero == m.mismatch_count);
        free(a); free(e);
    END()

    BEGIN("kv_and_json_output")
        float a[] = { 1.0f, fb(0x7fc00001u), pinf }, e[] = { 2.0f, fb(0x7fc00002u), 1.0f };
        dsd_compare(a, e, 3, &m);
        char *kv = capture_out(kv_fn, &m, "METRICS");
        static const char head[] = "METRICS valid=1 bit_exact=0 elements=3 mismatch_count=3 ";
        CHECK(kv && !strncmp(kv, head, sizeof head - 1));
        CHECK(kv && strstr(kv, " max_abs=inf ") && strstr(kv, " first_actual_bits=0x3f800000 "));
        CHECK(kv && strstr(kv, " metrics_undefined=1 ") && !strchr(kv, '\n'));
        static const char *keys[] = { "mismatch_fraction=", "first_mismatch_index=", "first_diff_bit=",
            "max_rel=", "max_ulp=", "rms_abs=", "mean_abs=", "p50_abs=", "p95_abs=", "p99_abs=",
            "relative_l2=", "cosine_similarity=", "positive_delta_count=", "negative_delta_count=",
            "zero_delta_count=", "nan_mismatch_count=" };
        for (size_t k = 0; kv && k < sizeof keys / sizeof keys[0]; k++) CHECK(strstr(kv, keys[k]));
        char *js = capture_out(json_fn, &m, NULL);
        CHECK(js && json_sane(js) && strstr(js, "\"max_abs\":null"));
        free(kv); free(js);
    END()

    BEGIN("large_sparse")
        enum { N = 1 << 16 };
        float *a = malloc(N * sizeof *a), *e = malloc(N * sizeof *e);
        for (int i = 0; i < N; i++) { a[i] = (float)((i % 257) - 128) * 0.125f; e[i] = a[i]; }
        e[17] = nextafterf(a[17], 1e9f);
        e[4096] = a[4096] + 4.0f;
        e[N - 1] = -a[N - 1];
        dsd_compare(a, e, N, &m);
        CHECK(m.first_mismatch == 17 && m.mismatch_count == 3 && deq(m.max_abs, 2.0 * fabs((double)a[N - 1])));
        free(a); free(e);
    END()

    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
