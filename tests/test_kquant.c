/* test_kquant.c — the kquant types (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K) and their matmul families.
 *
 *   dequant      hand-built blocks (negative mins, negative/extreme/subnormal
 *                scales, int8 scales at -128/127) against values written out
 *                from ggml's formulas, bit for bit
 *   round trip   ds_kq_quantize -> dequantize on random rows: RMS error
 *                bounds per type (and on rows with outliers)
 *   definition   canonical == a scalar reference of the integer definition
 *                (written here from the formats, independently of the
 *                kernels), memcmp, on every SIMD level, M = 1..16, threads 1/3
 *   property     canonical(M) row m == decode(row m), M = 1..16 (memcmp)
 *   counter      fast differs from decode (so the memcmp can fail)
 *   malformed    blocks with NaN / inf / huge scales: the same bits on every
 *                SIMD level, canonical and fast */
#include "kernels/kernels.h"
#include "kernels/cpu/matmul_internal.h"

#include "testutil.h"

#include <math.h>

static const uint32_t kq_types[7] = {DS_TYPE_Q4_0, DS_TYPE_Q4_1, DS_TYPE_Q5_0, DS_TYPE_Q5_1,
                                     DS_TYPE_Q4_K, DS_TYPE_Q5_K, DS_TYPE_Q6_K};

static uint64_t rng = 12345;
static float rnd(void) { return ds_uniform_pm1(&rng); }

static uint16_t h(float f) { return ds_f32_to_fp16(f); }

/* ==========================================================================
 * hand-built blocks
 * ========================================================================== */
static int same_bits(const float *a, const float *b, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (memcmp(a + i, b + i, 4)) {
            printf("  %s: element %d got %.9g want %.9g\n", what, i, a[i], b[i]);
            return 0;
        }
    return 1;
}

static void test_dequant_hand(void) {
    float got[256], want[256];
    /* Q4_0, d = -0.5: element j = low nibble of qs[j], j + 16 = high nibble */
    {
        ds_block_q4_0 b = { h(-0.5f), {0} };
        for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
        for (int j = 0; j < 16; j++) { want[j] = (float)((j - 8) * -0.5); want[j + 16] = (float)((7 - j) * -0.5); }
        ds_row_to_f32(DS_TYPE_Q4_0, &b, 32, got);
        CHECK(same_bits(got, want, 32, "q4_0"), "Q4_0 hand block");
        b.d = 0x7bff;                                           /* 65504, the largest fp16 */
        for (int j = 0; j < 16; j++) { want[j] = (float)((j - 8) * 65504.0); want[j + 16] = (float)((7 - j) * 65504.0); }
        ds_row_to_f32(DS_TYPE_Q4_0, &b, 32, got);
        CHECK(same_bits(got, want, 32, "q4_0 max"), "Q4_0 extreme scale");
        b.d = 0x0001;                                           /* smallest subnormal 2^-24 */
        for (int j = 0; j < 16; j++) { want[j] = (float)((j - 8) * 0x1p-24); want[j + 16] = (float)((7 - j) * 0x1p-24); }
        ds_row_to_f32(DS_TYPE_Q4_0, &b, 32, got);
        CHECK(same_bits(got, want, 32, "q4_0 subnormal"), "Q4_0 subnormal scale");
    }
    /* Q4_1, negative min: x = q * 0.25 - 3 */
    {
        ds_block_q4_1 b = { h(0.25f), h(-3.0f), {0} };
        for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(((j * 7) & 15) | ((j ^ 5) << 4));
        for (int j = 0; j < 16; j++) {
            want[j] = (float)(((j * 7) & 15) * 0.25 - 3.0);
            want[j + 16] = (float)((j ^ 5) * 0.25 - 3.0);
        }
        ds_row_to_f32(DS_TYPE_Q4_1, &b, 32, got);
        CHECK(same_bits(got, want, 32, "q4_1"), "Q4_1 hand block (negative min)");
        b.d = h(1000.0f); b.m = h(-60000.0f);
        for (int j = 0; j < 16; j++) {
            want[j] = (float)(((j * 7) & 15) * (double)ds_fp16_to_f32(b.d) + ds_fp16_to_f32(b.m));
            want[j + 16] = (float)((j ^ 5) * (double)ds_fp16_to_f32(b.d) + ds_fp16_to_f32(b.m));
        }
        ds_row_to_f32(DS_TYPE_Q4_1, &b, 32, got);
        CHECK(same_bits(got, want, 32, "q4_1 big"), "Q4_1 large scale and min");
    }
    /* Q5_0 / Q5_1: bit j of qh is bit 4 of element j */
    {
        const uint32_t qh = 0xA5C3F00Fu;
        ds_block_q5_0 b = { h(0.125f), {0}, {0} };
        memcpy(b.qh, &qh, 4);
        for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)((15 - j) | (j << 4));
        for (int j = 0; j < 16; j++) {
            want[j] = (float)(((15 - j) + 16 * (int)((qh >> j) & 1) - 16) * 0.125);
            want[j + 16] = (float)((j + 16 * (int)((qh >> (j + 16)) & 1) - 16) * 0.125);
        }
        ds_row_to_f32(DS_TYPE_Q5_0, &b, 32, got);
        CHECK(same_bits(got, want, 32, "q5_0"), "Q5_0 hand block");
        ds_block_q5_1 c = { h(-0.75f), h(-2.5f), {0}, {0} };      /* negative d and min */
        memcpy(c.qh, &qh, 4);
        memcpy(c.qs, b.qs, 16);
        for (int j = 0; j < 16; j++) {
            want[j] = (float)(((15 - j) + 16 * (int)((qh >> j) & 1)) * -0.75 - 2.5);
            want[j + 16] = (float)((j + 16 * (int)((qh >> (j + 16)) & 1)) * -0.75 - 2.5);
        }
        ds_row_to_f32(DS_TYPE_Q5_1, &c, 32, got);
        CHECK(same_bits(got, want, 32, "q5_1"), "Q5_1 hand block (negative scale and min)");
    }
    /* Q4_K / Q5_K: 6-bit (sc, m) per sub-block, packed into 12 bytes as ggml
     * does (j < 4: bytes j and j+4; j >= 4: nibbles of byte j+4, top bits in
     * bits 6..7 of bytes j-4 and j) */
    {
        const int sc[8] = {1, 17, 33, 63, 0, 45, 62, 7}, mn[8] = {63, 0, 5, 21, 50, 33, 1, 40};
        uint8_t s12[12] = {0};
        for (int j = 0; j < 4; j++) { s12[j] = (uint8_t)sc[j]; s12[j + 4] = (uint8_t)mn[j]; }
        for (int j = 4; j < 8; j++) {
            s12[j + 4] = (uint8_t)((sc[j] & 15) | ((mn[j] & 15) << 4));
            s12[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            s12[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
        const float dvals[2] = {0.01f, 65504.0f}, mvals[2] = {-0.125f, 3.0f};   /* dmin < 0 and > 0 */
        for (int v = 0; v < 2; v++) {
            ds_block_q4_K b;
            b.d = h(dvals[v]); b.dmin = h(mvals[v]);
            memcpy(b.scales, s12, 12);
            for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)((i * 37 + 11) & 255);
            const double d = ds_fp16_to_f32(b.d), dmin = ds_fp16_to_f32(b.dmin);
            for (int i = 0; i < 256; i++) {
                const int g = i / 64, hi = (i % 64) >= 32, l = i % 32, j = 2 * g + hi;
                const int q = hi ? b.qs[32 * g + l] >> 4 : b.qs[32 * g + l] & 15;
                want[i] = (float)(d * sc[j] * q - dmin * mn[j]);
            }
            ds_row_to_f32(DS_TYPE_Q4_K, &b, 256, got);
            CHECK(same_bits(got, want, 256, "q4_k"), "Q4_K hand block %d (dmin %g)", v, mvals[v]);

            ds_block_q5_K c;
            c.d = b.d; c.dmin = b.dmin;
            memcpy(c.scales, s12, 12);
            memcpy(c.qs, b.qs, 128);
            for (int l = 0; l < 32; l++) c.qh[l] = (uint8_t)(l * 29 + 3);
            for (int i = 0; i < 256; i++) {
                const int g = i / 64, hi = (i % 64) >= 32, l = i % 32, j = 2 * g + hi;
                const int q = (hi ? c.qs[32 * g + l] >> 4 : c.qs[32 * g + l] & 15) + 16 * ((c.qh[l] >> j) & 1);
                want[i] = (float)(d * sc[j] * q - dmin * mn[j]);
            }
            ds_row_to_f32(DS_TYPE_Q5_K, &c, 256, got);
            CHECK(same_bits(got, want, 256, "q5_k"), "Q5_K hand block %d", v);
        }
    }
    /* Q6_K: element i of half hf, position p = i % 128: quarter r = p / 32,
     * l = p % 32; low 4 bits from ql[64 hf + l + 32 (r & 1)] (low nibble for
     * r < 2, high for r >= 2), top 2 bits = bits 2r..2r+1 of qh[32 hf + l];
     * scale index 8 hf + l / 16 + 2 r */
    {
        ds_block_q6_K b;
        for (int i = 0; i < 128; i++) b.ql[i] = (uint8_t)(i * 53 + 7);
        for (int i = 0; i < 64; i++) b.qh[i] = (uint8_t)(i * 97 + 1);
        const int8_t scs[16] = {-128, 127, 1, -1, 64, -64, 3, 100, -100, 0, 5, -7, 33, -33, 12, 127};
        memcpy(b.scales, scs, 16);
        const float dv[2] = {0x1p-14f, -1024.0f};
        for (int v = 0; v < 2; v++) {
            b.d = h(dv[v]);
            const double d = ds_fp16_to_f32(b.d);
            for (int i = 0; i < 256; i++) {
                const int hf = i / 128, p = i % 128, r = p / 32, l = p % 32;
                const uint8_t lo = b.ql[64 * hf + l + 32 * (r & 1)];
                const int q = ((r < 2 ? lo & 15 : lo >> 4) | (((b.qh[32 * hf + l] >> (2 * r)) & 3) << 4)) - 32;
                want[i] = (float)(d * scs[8 * hf + l / 16 + 2 * r] * q);
            }
            ds_row_to_f32(DS_TYPE_Q6_K, &b, 256, got);
            CHECK(same_bits(got, want, 256, "q6_k"), "Q6_K hand block %d (d %g, scales -128..127)", v, dv[v]);
        }
    }
}

/* ==========================================================================
 * quantize -> dequantize
 * ========================================================================== */
static void test_round_trip(void) {
    /* RMS error relative to the RMS of the data, uniform [-1, 1) rows of 1024
     * plus one outlier per 256 (x 8): per-type bounds */
    static const double bound[7] = {0.075, 0.075, 0.040, 0.036, 0.065, 0.033, 0.016};
    const int n = 4096;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    void *q = malloc(n * 2);
    for (int ti = 0; ti < 7; ti++) {
        for (int outl = 0; outl < 2; outl++) {
            for (int i = 0; i < n; i++) x[i] = rnd();
            if (outl) for (int i = 0; i < n; i += 256) x[i + 77] = 8.0f * (i & 256 ? 1 : -1);
            ds_f32_to_type(kq_types[ti], x, n, q);
            ds_row_to_f32(kq_types[ti], q, n, y);
            double e2 = 0, s2 = 0;
            int finite = 1;
            for (int i = 0; i < n; i++) {
                e2 += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
                s2 += (double)x[i] * x[i];
                finite &= isfinite(y[i]);
            }
            const double rel = sqrt(e2 / s2);
            CHECK(finite && rel < bound[ti] * (outl ? 2.2 : 1.0), "%s round trip rel RMS %.4f (bound %.3f) outliers=%d",
                  ds_type_name(kq_types[ti]), rel, bound[ti] * (outl ? 2.2 : 1.0), outl);
            printf("%s round_trip type=%s outliers=%d rel_rms=%.4f\n", finite && rel < bound[ti] * (outl ? 2.2 : 1.0) ? "PASS" : "FAIL",
                   ds_type_name(kq_types[ti]), outl, rel);
        }
        /* an all-zero row stays zero */
        memset(x, 0, n * sizeof(float));
        ds_f32_to_type(kq_types[ti], x, n, q);
        ds_row_to_f32(kq_types[ti], q, n, y);
        int zero = 1;
        for (int i = 0; i < n; i++) zero &= y[i] == 0.0f;
        CHECK(zero, "%s: zero row does not round-trip to zero", ds_type_name(kq_types[ti]));
    }
    free(x); free(y); free(q);
}

/* ==========================================================================
 * a scalar reference of the canonical definition (matmul_kq.h), from the
 * formats: integer quants, integer dots, the f32 epilogue in block order
 * ========================================================================== */
static int is_k(uint32_t t) { return ds_type_block_elems(t) == 256; }

/* integer quants q (weight value = scale-part * q - min-part), per type */
static void ref_quants(uint32_t t, const void *blk, int q[256], int sc[16], int mn[16], float *d, float *dm) {
    float f[256];
    (void)f;
    switch (t) {
    case DS_TYPE_Q4_0: case DS_TYPE_Q4_1: case DS_TYPE_Q5_0: case DS_TYPE_Q5_1: {
        const uint8_t *qs, *qh = NULL;
        if (t == DS_TYPE_Q4_0) { const ds_block_q4_0 *b = blk; qs = b->qs; *d = ds_fp16_to_f32(b->d); }
        else if (t == DS_TYPE_Q4_1) { const ds_block_q4_1 *b = blk; qs = b->qs; *d = ds_fp16_to_f32(b->d); *dm = ds_fp16_to_f32(b->m); }
        else if (t == DS_TYPE_Q5_0) { const ds_block_q5_0 *b = blk; qs = b->qs; qh = b->qh; *d = ds_fp16_to_f32(b->d); }
        else { const ds_block_q5_1 *b = blk; qs = b->qs; qh = b->qh; *d = ds_fp16_to_f32(b->d); *dm = ds_fp16_to_f32(b->m); }
        uint32_t hb = 0;
        if (qh) memcpy(&hb, qh, 4);
        const int off = t == DS_TYPE_Q4_0 ? 8 : t == DS_TYPE_Q5_0 ? 16 : 0;
        for (int j = 0; j < 16; j++) {
            q[j] = (qs[j] & 15) + (int)((hb >> j) & 1) * 16 - off;
            q[j + 16] = (qs[j] >> 4) + (int)((hb >> (j + 16)) & 1) * 16 - off;
        }
        break;
    }
    case DS_TYPE_Q4_K: case DS_TYPE_Q5_K: {
        const uint8_t *qs, *s12, *qh = NULL;
        if (t == DS_TYPE_Q4_K) { const ds_block_q4_K *b = blk; qs = b->qs; s12 = b->scales; *d = ds_fp16_to_f32(b->d); *dm = ds_fp16_to_f32(b->dmin); }
        else { const ds_block_q5_K *b = blk; qs = b->qs; s12 = b->scales; qh = b->qh; *d = ds_fp16_to_f32(b->d); *dm = ds_fp16_to_f32(b->dmin); }
        for (int j = 0; j < 8; j++) {
            sc[j] = j < 4 ? s12[j] & 63 : (s12[j + 4] & 15) | ((s12[j - 4] >> 6) << 4);
            mn[j] = j < 4 ? s12[j + 4] & 63 : (s12[j + 4] >> 4) | ((s12[j] >> 6) << 4);
        }
        for (int i = 0; i < 256; i++) {
            const int g = i / 64, hi = (i % 64) >= 32, l = i % 32;
            q[i] = (hi ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 15) + (qh ? 16 * ((qh[l] >> (2 * g + hi)) & 1) : 0);
        }
        break;
    }
    case DS_TYPE_Q6_K: {
        const ds_block_q6_K *b = blk;
        *d = ds_fp16_to_f32(b->d);
        for (int j = 0; j < 16; j++) sc[j] = b->scales[j];
        for (int i = 0; i < 256; i++) {
            const int hf = i / 128, p = i % 128, r = p / 32, l = p % 32;
            const uint8_t lo = b->ql[64 * hf + l + 32 * (r & 1)];
            q[i] = ((r < 2 ? lo & 15 : lo >> 4) | (((b->qh[32 * hf + l] >> (2 * r)) & 3) << 4)) - 32;
        }
        break;
    }
    default: break;
    }
}

static void ref_matmul(const ds_weight *W, int M, const float *x, float *y) {
    const uint32_t t = W->type;
    const int64_t K = W->n_in, N = W->n_out, QK = (int64_t)ds_type_block_elems(t), nb = K / QK;
    const size_t bb = (size_t)ds_type_block_bytes(t);
    int8_t *p = malloc((size_t)K);
    float *e = malloc((size_t)nb * sizeof(float));
    int16_t *bs = malloc((size_t)nb * 16 * sizeof(int16_t));
    ds_block_q8_0 *q8 = malloc((size_t)(K / 32 + 1) * sizeof(ds_block_q8_0));
    for (int m = 0; m < M; m++) {
        if (is_k(t)) {
            ds_quantize_row_q8_k(x + (size_t)m * K, K, p, e, bs);
        } else {
            ds_quantize_row_q8_0(x + (size_t)m * K, K, q8);
            for (int64_t b = 0; b < nb; b++) {
                memcpy(p + 32 * b, q8[b].qs, 32);
                e[b] = ds_fp16_to_f32(q8[b].d);
            }
        }
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int q[256], sc[16], mn[16];
                float d = 0, dm = 0;
                ref_quants(t, (const char *)W->data + ((size_t)n * (size_t)nb + (size_t)b) * bb, q, sc, mn, &d, &dm);
                const int8_t *pb = p + QK * b;
                int64_t I = 0, Mn = 0, P = 0;
                if (!is_k(t)) {
                    for (int l = 0; l < 32; l++) { I += (int64_t)q[l] * pb[l]; P += pb[l]; }
                } else {
                    const int sub = t == DS_TYPE_Q6_K ? 16 : 32;
                    for (int j = 0; j < 256 / sub; j++) {
                        int64_t D = 0, S = 0;
                        for (int l = 0; l < sub; l++) { D += (int64_t)q[sub * j + l] * pb[sub * j + l]; S += pb[sub * j + l]; }
                        I += sc[j] * D;
                        Mn += (t == DS_TYPE_Q6_K ? 0 : mn[j]) * S;
                    }
                }
                acc = fmaf((float)I, d * e[b], acc);
                if (t == DS_TYPE_Q4_1 || t == DS_TYPE_Q5_1) acc = fmaf(dm, (float)P * e[b], acc);
                if (t == DS_TYPE_Q4_K || t == DS_TYPE_Q5_K) acc = fmaf(-(float)Mn, dm * e[b], acc);
            }
            if (acc != acc) acc = ds_bits_f32(0x7fc00000u);
            y[(size_t)m * N + n] = acc;
        }
    }
    free(p); free(e); free(bs); free(q8);
}

typedef struct { ds_weight w; void *data; } tw;
static tw make_weight(uint32_t t, int64_t k, int64_t n) {
    tw r;
    int ok;
    const size_t rb = (size_t)ds_row_bytes(t, (uint64_t)k, &ok);
    float *tmp = malloc((size_t)(k * n) * sizeof(float));
    for (int64_t i = 0; i < k * n; i++) tmp[i] = rnd();
    r.data = malloc(rb * (size_t)n);
    ds_f32_to_type(t, tmp, k * n, r.data);
    free(tmp);
    r.w = (ds_weight){.type = t, .n_in = k, .n_out = n, .data = r.data};
    return r;
}
static float *make_x(int m, int64_t k) {
    float *x = malloc((size_t)(m * k) * sizeof(float));
    for (int64_t i = 0; i < m * k; i++) x[i] = rnd() * (i % 7 == 0 ? 3.0f : 1.0f);
    return x;
}

static void test_definition_and_property(ds_pool *p1, ds_pool *p3) {
    const int M = 16;
    for (int ti = 0; ti < 7; ti++) {
        const uint32_t t = kq_types[ti];
        const int64_t K = is_k(t) ? 512 : 96, N = 37;
        tw W = make_weight(t, K, N);
        float *x = make_x(M, K);
        float *ref = malloc((size_t)M * N * sizeof(float)), *y = malloc((size_t)M * N * sizeof(float));
        float *dec = malloc((size_t)M * N * sizeof(float));
        ref_matmul(&W.w, M, x, ref);
        int def_ok = 1, levels = 0;
        for (int lv = 0; lv < DS_LVL_COUNT; lv++) {
            if (!ds_simd_level_ok(lv)) continue;
            levels++;
            for (int mm = 1; mm <= M; mm++)
                for (int pi = 0; pi < 2; pi++) {
                    ds_matmul_at_level(lv, DS_CANONICAL, &W.w, mm, x, y, pi ? p3 : p1);
                    def_ok &= !memcmp(y, ref, (size_t)mm * N * sizeof(float));
                }
        }
        CHECK(def_ok, "%s canonical != scalar definition", ds_type_name(t));
        printf("%s canonical %s == scalar integer definition (memcmp) on %d SIMD level(s), M=1..16, threads 1,3\n",
               def_ok ? "PASS" : "FAIL", ds_type_name(t), levels);
        /* property: canonical(M) row m == decode(row m) */
        for (int m = 0; m < M; m++) ds_matmul_decode(&W.w, x + (size_t)m * K, dec + (size_t)m * N, p3);
        int prop = 1;
        for (int mm = 1; mm <= M; mm++) {
            ds_matmul(DS_CANONICAL, &W.w, mm, x, y, p3);
            prop &= !memcmp(y, dec, (size_t)mm * N * sizeof(float));
        }
        CHECK(prop, "%s canonical(M) != decode rows", ds_type_name(t));
        /* counter-test: fast differs from decode, and is close */
        ds_matmul(DS_FAST, &W.w, M, x, y, p3);
        int ndiff = 0;
        double worst = 0;
        for (int i = 0; i < M * N; i++) {
            ndiff += memcmp(y + i, dec + i, 4) != 0;
            worst = fmax(worst, fabs((double)y[i] - dec[i]) / (fabs((double)dec[i]) + 1e-3));
        }
        CHECK(ndiff > 0 && worst < 1e-4, "%s fast: %d differing, worst rel %.3g", ds_type_name(t), ndiff, worst);
        printf("%s matmul_%s property M=1..16 memcmp; counter-test fast differs in %d of %d (max rel %.2g)\n",
               prop && ndiff ? "PASS" : "FAIL", ds_type_name(t), ndiff, M * (int)N, worst);
        /* fast is deterministic across threads and levels too */
        float *y1 = malloc((size_t)M * N * sizeof(float));
        int fdet = 1;
        for (int lv = 0; lv < DS_LVL_COUNT; lv++) {
            if (!ds_simd_level_ok(lv)) continue;
            ds_matmul_at_level(lv, DS_FAST, &W.w, M, x, y1, p1);
            fdet &= !memcmp(y, y1, (size_t)M * N * sizeof(float));
        }
        CHECK(fdet, "%s fast bits depend on level/threads", ds_type_name(t));
        /* and at the few-row counts where the fused blocks run (x86 AVX2 /
         * AVX-512 and AArch64 neon / dotprod: KQ_FUSED_MAX_M,
         * KQ_NEON_FUSED_MAX_M): every level and thread count == portable */
        for (int mm = 1; mm <= 3; mm++) {
            int fdet2 = 1;
            ds_matmul_at_level(DS_LVL_PORTABLE, DS_FAST, &W.w, mm, x, y, p1);
            for (int lv = 0; lv < DS_LVL_COUNT; lv++) {
                if (!ds_simd_level_ok(lv)) continue;
                for (int pi = 0; pi < 2; pi++) {
                    ds_matmul_at_level(lv, DS_FAST, &W.w, mm, x, y1, pi ? p3 : p1);
                    fdet2 &= !memcmp(y, y1, (size_t)mm * N * sizeof(float));
                }
            }
            CHECK(fdet2, "%s fast M=%d bits depend on level/threads", ds_type_name(t), mm);
        }
        free(y1);
        free(W.data); free(x); free(ref); free(y); free(dec);
    }
}

/* ==========================================================================
 * malformed blocks: NaN / inf / huge scales
 * ========================================================================== */
static void poison(uint32_t t, void *data, int64_t nblocks) {
    static const uint16_t bad[4] = {0x7e00, 0x7c00, 0xfc00, 0x7bff};   /* NaN, +inf, -inf, 65504 */
    const size_t bb = (size_t)ds_type_block_bytes(t);
    for (int64_t b = 0; b < nblocks; b += 3) {
        char *blk = (char *)data + (size_t)b * bb;
        const uint16_t v = bad[(b / 3) % 4];
        switch (t) {
        case DS_TYPE_Q6_K: memcpy(blk + 208, &v, 2); break;           /* d is last */
        case DS_TYPE_Q4_1: case DS_TYPE_Q5_1: case DS_TYPE_Q4_K: case DS_TYPE_Q5_K:
            memcpy(blk + ((b / 3) % 2 ? 2 : 0), &v, 2); break;         /* d or m / dmin */
        default: memcpy(blk, &v, 2); break;
        }
    }
}

static void test_malformed(ds_pool *pool) {
    /* M = 1, 2: the fused few-row blocks; 5: the unpacking blocks */
    static const int Ms[3] = {1, 2, 5};
    for (int mi = 0; mi < 3; mi++)
    for (int ti = 0; ti < 7; ti++) {
        const int M = Ms[mi];
        const uint32_t t = kq_types[ti];
        const int64_t K = is_k(t) ? 768 : 160, N = 19;
        tw W = make_weight(t, K, N);
        poison(t, W.data, N * (K / (int64_t)ds_type_block_elems(t)));
        float *x = make_x(M, K);
        /* and one non-finite activation, in the last row (M = 1 keeps its
         * one row finite: the malformed weights alone) */
        if (M > 1) x[(size_t)(M - 1) * (size_t)K + 3] = INFINITY;
        float *y0 = malloc((size_t)M * N * sizeof(float)), *y = malloc((size_t)M * N * sizeof(float));
        float *ref = malloc((size_t)M * N * sizeof(float));
        ref_matmul(&W.w, M, x, ref);
        int ok = 1, levels = 0, nonfinite = 0;
        for (int v = 0; v < 2; v++) {
            int first = 1;
            for (int lv = 0; lv < DS_LVL_COUNT; lv++) {
                if (!ds_simd_level_ok(lv)) continue;
                levels += v == 0;
                ds_matmul_at_level(lv, (ds_variant)v, &W.w, M, x, first ? y0 : y, pool);
                if (!first) ok &= !memcmp(y0, y, (size_t)M * N * sizeof(float));
                first = 0;
            }
            if (v == 0) {
                ok &= !memcmp(y0, ref, (size_t)M * N * sizeof(float));
                for (int i = 0; i < M * N; i++) nonfinite += !isfinite(y0[i]);
            }
        }
        CHECK(ok && nonfinite > 0, "%s malformed blocks: bits differ between levels (or no non-finite output)", ds_type_name(t));
        printf("%s malformed %s M=%d (NaN/inf/65504 scales, inf activation): canonical and fast identical on %d level(s), "
               "%d non-finite outputs\n", ok ? "PASS" : "FAIL", ds_type_name(t), M, levels, nonfinite);
        free(W.data); free(x); free(y0); free(y); free(ref);
    }
}

int main(void) {
    ds_pool *p1 = ds_pool_new(1), *p3 = ds_pool_new(3);
    if (!p1 || !p3) { printf("FAIL pool\n"); return 1; }
    test_dequant_hand();
    test_round_trip();
    test_definition_and_property(p1, p3);
    test_malformed(p3);
    /* registry: every kquant family is named and maps back to its type */
    int reg = 1;
    for (int ti = 0; ti < 7; ti++) {
        const int f = ds_matmul_family(kq_types[ti]);
        reg &= f >= 0 && ds_family_weight_type(f) == (int)kq_types[ti] && ds_family_from_name(ds_family_name(f)) == f;
    }
    CHECK(reg, "registry: kquant families");
    ds_pool_free(p1);
    ds_pool_free(p3);
    return tu_finish("test_kquant");
}
