/* compare.c — exact IEEE-754 binary32 comparator for dspark_diag.
 *
 * Equality is decided on raw bits, never with == on floats: the point of the
 * diagnostics is to see differences that float equality hides (+0 vs -0, NaN
 * payloads) and to never be fooled by a compiler that assumes finite math.
 * Classification (NaN / inf / zero) is done on the bit patterns for the same
 * reason. The metrics are computed in double with compensated sums so that a
 * cosine of 0.99999999999998823 is a measurement, not rounding noise. */
#if defined(__FAST_MATH__)
#error "src/diag/compare.c must not be built with -ffast-math: NaN/inf handling and compensated sums depend on strict IEEE semantics"
#endif

#include "dspark_diag.h"
#include "diag/diag_json.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if FLT_RADIX != 2 || FLT_MANT_DIG != 24 || FLT_MAX_EXP != 128
#error "dspark_diag requires IEEE-754 binary32 float"
#endif
_Static_assert(sizeof(float) == sizeof(uint32_t), "float must be 32 bits");
_Static_assert(sizeof(double) == sizeof(uint64_t), "double must be 64 bits");

/* ---------------------------------------------------------------------
 * bit-level helpers
 * ------------------------------------------------------------------- */
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline uint64_t f64_bits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static inline double f64_from_bits(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }

static inline int bits_nan(uint32_t u)  { return (u & 0x7fffffffu) > 0x7f800000u; }
static inline int bits_inf(uint32_t u)  { return (u & 0x7fffffffu) == 0x7f800000u; }
static inline int bits_zero(uint32_t u) { return (u & 0x7fffffffu) == 0; }
static inline int d_nonfinite(double d) { return (f64_bits(d) & 0x7ff0000000000000ull) == 0x7ff0000000000000ull; }
static inline int d_is_inf(double d)    { return (f64_bits(d) & 0x7fffffffffffffffull) == 0x7ff0000000000000ull; }

#define D_INF f64_from_bits(0x7ff0000000000000ull)
#define D_NAN f64_from_bits(0x7ff8000000000000ull)

/* Monotone map from float bits to an unsigned key in the total order
 * -NaN.. < -inf < ... < -0 < +0 < ... < +inf < +NaN..: negatives are
 * bit-inverted (larger magnitude -> smaller key), positives get the top bit.
 * Adjacent representable values differ by exactly 1, which makes |key a -
 * key e| the ULP distance, including across zero and through subnormals. */
static inline uint32_t order_key(uint32_t u) { return (u & 0x80000000u) ? ~u : (u | 0x80000000u); }

/* Neumaier compensated sum: the norms feed rel_l2 and cosine, whose useful
 * digits sit 1e-14 below 1; a plain double sum over 10^5 elements would bury
 * them. Infinities short-circuit (the compensation term would become NaN). */
typedef struct { double s, c; } ksum;
static inline void ksum_add(ksum *k, double x) {
    double t = k->s + x;
    if (fabs(k->s) >= fabs(x)) k->c += (k->s - t) + x;
    else k->c += (x - t) + k->s;
    k->s = t;
}
static inline double ksum_get(const ksum *k) { return d_is_inf(k->s) ? k->s : k->s + k->c; }

/* ascending order of non-negative doubles (|delta| never is NaN or -0 here):
 * their bit patterns order like the values, so compare integers. */
static int cmp_nonneg_double(const void *pa, const void *pb) {
    uint64_t a = f64_bits(*(const double *)pa), b = f64_bits(*(const double *)pb);
    return (a > b) - (a < b);
}

/* |a - e| of a non-NaN mismatch, with the infinity conventions of the header */
static inline double abs_delta(float a, float e, uint32_t ua, uint32_t ue) {
    if (bits_inf(ua) || bits_inf(ue)) return D_INF; /* bits differ, so never inf - same inf */
    return fabs((double)a - (double)e);
}

/* nearest-rank percentile of sorted v[0..k-1], p in percent */
static double pct_nearest_rank(const double *v, size_t k, unsigned p) {
    size_t r = (size_t)(((unsigned long long)k * p + 99) / 100);
    if (r < 1) r = 1;
    if (r > k) r = k;
    return v[r - 1];
}

static void metrics_init(dsd_metrics *m, size_t n) {
    memset(m, 0, sizeof *m);
    m->n = n;
    m->first_mismatch = -1;
    m->first_diff_bit = -1;
    m->max_ulp_index = -1;
    m->percentiles_valid = 1;
}

/* =====================================================================
 * dsd_compare_ex
 * =================================================================== */
int dsd_compare_ex(const float *actual, const float *expected, size_t n, dsd_metrics *m,
                   double *scratch, size_t scratch_len) {
    if (!m) return DSD_ERR_ARG;
    metrics_init(m, n);
    if (!actual || !expected) {
        /* invalid input is never "exact": a NULL capture must not pass a gate */
        m->p50_abs = m->p95_abs = m->p99_abs = D_NAN;
        m->rel_l2 = m->cosine = D_NAN;
        m->percentiles_valid = 0;
        return DSD_ERR_ARG;
    }
    m->valid = 1;

    ksum s_dd = {0, 0}, s_d = {0, 0}, s_aa = {0, 0}, s_ee = {0, 0};
    size_t n_numeric = 0;       /* elements with no NaN on either side */
    size_t k_numeric = 0;       /* non-NaN mismatches (percentile population) */

    for (size_t i = 0; i < n; i++) {
        uint32_t ua = f32_bits(actual[i]), ue = f32_bits(expected[i]);
        int nan_a = bits_nan(ua), nan_e = bits_nan(ue);
        if (ua == ue) {
            if (nan_a) continue;                  /* equal NaNs: exact, no numbers */
            double a = actual[i];
            n_numeric++;
            ksum_add(&s_aa, a * a);
            ksum_add(&s_ee, a * a);
            continue;
        }
        /* mismatch */
        if (m->mismatch_count++ == 0) {
            m->first_mismatch = (int64_t)i;
            /* memcpy, not assignment: keeps a signalling NaN's bits intact */
            memcpy(&m->first_actual, &ua, 4);
            memcpy(&m->first_expected, &ue, 4);
            m->first_actual_bits = ua;
            m->first_expected_bits = ue;
            m->first_diff_bit = 31 - __builtin_clz(ua ^ ue);
        }
        if (nan_a || nan_e) {
            /* no numeric delta exists: counted, excluded from the statistics */
            m->nan_mismatches++;
            m->delta_zero++;
            continue;
        }
        uint32_t ka = order_key(ua), ke = order_key(ue);
        if (bits_zero(ua) && bits_zero(ue)) m->delta_zero++;   /* +0 vs -0 */
        else if (ka > ke) m->delta_pos++;
        else m->delta_neg++;

        uint64_t ulp = ka > ke ? (uint64_t)(ka - ke) : (uint64_t)(ke - ka);
        if (ulp > m->max_ulp) { m->max_ulp = ulp; m->max_ulp_index = (int64_t)i; }

        float af = actual[i], ef = expected[i];
        double d = abs_delta(af, ef, ua, ue);
        double rel;
        if (bits_inf(ua) || bits_inf(ue)) rel = D_INF;
        else {
            double den = fmax(fabs((double)af), fabs((double)ef));
            rel = den > 0.0 ? d / den : 0.0;
        }
        if (d > m->max_abs) m->max_abs = d;
        if (rel > m->max_rel) m->max_rel = rel;

        n_numeric++;
        k_numeric++;
        ksum_add(&s_dd, d * d);
        ksum_add(&s_d, d);
        ksum_add(&s_aa, (double)af * (double)af);
        ksum_add(&s_ee, (double)ef * (double)ef);
    }

    m->bit_exact = m->mismatch_count == 0;
    m->metrics_undefined = m->nan_mismatches > 0;
    m->mismatch_fraction = n ? (double)m->mismatch_count / (double)n : 0.0;

    double dd = ksum_get(&s_dd), aa = ksum_get(&s_aa), ee = ksum_get(&s_ee);
    if (n_numeric) {
        m->rms_abs = sqrt(dd / (double)n_numeric);
        m->mean_abs = ksum_get(&s_d) / (double)n_numeric;
    }
    /* relative L2 with the zero-reference conventions of the header */
    if (ee > 0.0) m->rel_l2 = sqrt(dd) / sqrt(ee);
    else m->rel_l2 = dd > 0.0 ? D_INF : 0.0;
    /* cosine by the law of cosines, <a,e> = (|a|^2 + |e|^2 - |a-e|^2) / 2:
     * the rounding errors of |a|^2 and |e|^2 cancel to first order, so 1 - cos
     * stays accurate when it is ~1e-14 (a direct dot product would not). */
    if (aa > 0.0 && ee > 0.0) {
        double c = ((aa + ee) - dd) / (2.0 * sqrt(aa) * sqrt(ee));
        if (!d_nonfinite(c)) { if (c > 1.0) c = 1.0; if (c < -1.0) c = -1.0; }
        m->cosine = c;
    } else {
        m->cosine = (aa > 0.0 || ee > 0.0) ? 0.0 : 1.0;
    }

    /* exact percentiles: sort the |delta| of the non-NaN mismatches */
    if (k_numeric) {
        double *buf = scratch && scratch_len >= k_numeric ? scratch : NULL;
        int owned = 0;
        if (!buf) { buf = malloc(k_numeric * sizeof *buf); owned = 1; }
        if (!buf) {
            m->percentiles_valid = 0;
            m->p50_abs = m->p95_abs = m->p99_abs = D_NAN;
        } else {
            size_t k = 0;
            for (size_t i = 0; i < n && k < k_numeric; i++) {
                uint32_t ua = f32_bits(actual[i]), ue = f32_bits(expected[i]);
                if (ua == ue || bits_nan(ua) || bits_nan(ue)) continue;
                buf[k++] = abs_delta(actual[i], expected[i], ua, ue);
            }
            qsort(buf, k, sizeof *buf, cmp_nonneg_double);
            m->p50_abs = pct_nearest_rank(buf, k, 50);
            m->p95_abs = pct_nearest_rank(buf, k, 95);
            m->p99_abs = pct_nearest_rank(buf, k, 99);
            if (owned) free(buf);
        }
    }
    return DSD_OK;
}

int dsd_compare(const float *actual, const float *expected, size_t n, dsd_metrics *m) {
    return dsd_compare_ex(actual, expected, n, m, NULL, 0);
}

/* =====================================================================
 * printing
 * =================================================================== */
/* printf's spelling of NaN varies ("nan", "-nan"); pin it so logs diff cleanly */
static void put_double(FILE *f, double d) {
    uint64_t u = f64_bits(d);
    if ((u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull) fputs("nan", f);
    else if (d_is_inf(d)) fputs((u >> 63) ? "-inf" : "inf", f);
    else fprintf(f, "%.17g", d);
}
static void put_float(FILE *f, float x) {
    uint32_t u = f32_bits(x);
    if (bits_nan(u)) fputs("nan", f);
    else if (bits_inf(u)) fputs((u >> 31) ? "-inf" : "inf", f);
    else fprintf(f, "%.9g", (double)x);
}
int dsd_metrics_print_kv(FILE *f, const char *prefix, const dsd_metrics *m) {
    if (!f || !m) return DSD_ERR_ARG;
    if (prefix && *prefix) fprintf(f, "%s ", prefix);
    fprintf(f, "valid=%d bit_exact=%d elements=%zu mismatch_count=%zu mismatch_fraction=",
            m->valid, m->bit_exact, m->n, m->mismatch_count);
    put_double(f, m->mismatch_fraction);
    fprintf(f, " first_mismatch_index=%lld first_actual=", (long long)m->first_mismatch);
    put_float(f, m->first_actual);
    fputs(" first_expected=", f);
    put_float(f, m->first_expected);
    fprintf(f, " first_actual_bits=0x%08x first_expected_bits=0x%08x first_diff_bit=%d max_abs=",
            m->first_actual_bits, m->first_expected_bits, m->first_diff_bit);
    put_double(f, m->max_abs);
    fputs(" max_rel=", f);
    put_double(f, m->max_rel);
    fprintf(f, " max_ulp=%llu max_ulp_index=%lld rms_abs=", (unsigned long long)m->max_ulp,
            (long long)m->max_ulp_index);
    put_double(f, m->rms_abs);
    fputs(" mean_abs=", f); put_double(f, m->mean_abs);
    fputs(" p50_abs=", f); put_double(f, m->p50_abs);
    fputs(" p95_abs=", f); put_double(f, m->p95_abs);
    fputs(" p99_abs=", f); put_double(f, m->p99_abs);
    fputs(" relative_l2=", f); put_double(f, m->rel_l2);
    fputs(" cosine_similarity=", f); put_double(f, m->cosine);
    fprintf(f, " positive_delta_count=%zu negative_delta_count=%zu zero_delta_count=%zu"
               " nan_mismatch_count=%zu metrics_undefined=%d percentiles_valid=%d",
            m->delta_pos, m->delta_neg, m->delta_zero, m->nan_mismatches,
            m->metrics_undefined, m->percentiles_valid);
    return ferror(f) ? DSD_ERR_IO : DSD_OK;
}

/* JSON through cJSON (every JSON dspark writes is built as a tree, so no
 * string can break the syntax); non-finite values are null. */
static void add_num(cJSON *o, const char *k, double d) {
    if (d_nonfinite(d)) cJSON_AddNullToObject(o, k);
    else cJSON_AddNumberToObject(o, k, d);
}
static void add_f32(cJSON *o, const char *k, float x) {
    if (bits_nan(f32_bits(x)) || bits_inf(f32_bits(x))) cJSON_AddNullToObject(o, k);
    else cJSON_AddNumberToObject(o, k, (double)x);
}

cJSON *dsd_metrics_cjson(const dsd_metrics *m) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    char hex[16];
    cJSON_AddBoolToObject(o, "valid", m->valid);
    cJSON_AddBoolToObject(o, "bit_exact", m->bit_exact);
    cJSON_AddNumberToObject(o, "elements", (double)m->n);
    cJSON_AddNumberToObject(o, "mismatch_count", (double)m->mismatch_count);
    add_num(o, "mismatch_fraction", m->mismatch_fraction);
    cJSON_AddNumberToObject(o, "first_mismatch_index", (double)m->first_mismatch);
    add_f32(o, "first_actual", m->first_actual);
    add_f32(o, "first_expected", m->first_expected);
    /* bits as strings: JSON readers differ on 32-bit hex, strings round-trip */
    snprintf(hex, sizeof hex, "0x%08x", m->first_actual_bits);
    cJSON_AddStringToObject(o, "first_actual_bits", hex);
    snprintf(hex, sizeof hex, "0x%08x", m->first_expected_bits);
    cJSON_AddStringToObject(o, "first_expected_bits", hex);
    cJSON_AddNumberToObject(o, "first_diff_bit", m->first_diff_bit);
    add_num(o, "max_abs", m->max_abs);
    add_num(o, "max_rel", m->max_rel);
    cJSON_AddNumberToObject(o, "max_ulp", (double)m->max_ulp);
    cJSON_AddNumberToObject(o, "max_ulp_index", (double)m->max_ulp_index);
    add_num(o, "rms_abs", m->rms_abs);
    add_num(o, "mean_abs", m->mean_abs);
    add_num(o, "p50_abs", m->p50_abs);
    add_num(o, "p95_abs", m->p95_abs);
    add_num(o, "p99_abs", m->p99_abs);
    add_num(o, "relative_l2", m->rel_l2);
    add_num(o, "cosine_similarity", m->cosine);
    cJSON_AddNumberToObject(o, "positive_delta_count", (double)m->delta_pos);
    cJSON_AddNumberToObject(o, "negative_delta_count", (double)m->delta_neg);
    cJSON_AddNumberToObject(o, "zero_delta_count", (double)m->delta_zero);
    cJSON_AddNumberToObject(o, "nan_mismatch_count", (double)m->nan_mismatches);
    cJSON_AddBoolToObject(o, "metrics_undefined", m->metrics_undefined);
    cJSON_AddBoolToObject(o, "percentiles_valid", m->percentiles_valid);
    return o;
}

int dsd_cjson_write(FILE *f, const cJSON *tree) {
    char *s = tree ? cJSON_PrintUnformatted(tree) : NULL;
    if (!s) return DSD_ERR_IO;
    int bad = fputs(s, f) == EOF || fputc('\n', f) == EOF;
    cJSON_free(s);
    return bad || ferror(f) ? DSD_ERR_IO : DSD_OK;
}

int dsd_metrics_json(FILE *f, const dsd_metrics *m) {
    if (!f || !m) return DSD_ERR_ARG;
    cJSON *o = dsd_metrics_cjson(m);
    int rc = dsd_cjson_write(f, o);
    cJSON_Delete(o);
    return rc;
}
