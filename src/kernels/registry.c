/* registry.c — operator family names, kernel sets (canonical / fast per
 * family), SIMD level detection, and the element conversions every family
 * and tool shares (row -> f32, f32 -> Q8_0 / F16 / BF16). */
#include "kernels/kernels.h"
#include "kernels/cpu/simd.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__aarch64__)
#include <sys/auxv.h>   /* getauxval: the SIMD level on AArch64 */
#include <asm/hwcap.h>
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)   /* Linux's value; older kernel headers lack it */
#endif
#endif

/* ==========================================================================
 * families
 * ========================================================================== */
static const char *const fam_names[DS_FAM_COUNT] = {
    "matmul_f32", "matmul_f16", "matmul_bf16", "matmul_q8_0",
    "matmul_q4_0", "matmul_q4_1", "matmul_q5_0", "matmul_q5_1",
    "matmul_q4_k", "matmul_q5_k", "matmul_q6_k",
    "attention",  "rmsnorm",    "rope",        "swiglu",      "residual",
    "moe_route", "gdn", "attn_sinks", "hc_pre", "hc_post", "ds4_compress", "ds4_indexer",
    "tp_reduce",
};

/* What the fast kernel does differently from canonical (= decode). Kept in
 * step with the comment block at the top of each family's file. */
static const char *const fam_desc[DS_FAM_COUNT] = {
    "fast: register-tiled FMA with K split in two halves (split-K) and a left-to-right lane sum; "
    "canonical: 16 k-lanes, one fused multiply-add per step, fixed 8-4-2-1 tree",
    "fast: f16 weights converted on the fly, FMA with split-K and a left-to-right lane sum; "
    "canonical: 16 k-lanes, one fused multiply-add per step, fixed 8-4-2-1 tree",
    "fast: bf16 weights converted on the fly, FMA with split-K and a left-to-right lane sum; "
    "canonical: 16 k-lanes, one fused multiply-add per step, fixed 8-4-2-1 tree",
    "fast: int8 VNNI on the packed tiles with ONE activation scale per row (convert + FMA "
    "per block, the row scale applied once at the end; other SIMD levels: weights dequantized "
    "to f32, FMA with the unquantized activations, split-K, left-to-right lane sum); "
    "canonical (= decode): "
    "activation rows quantized to Q8_0 (ds_quantize_row_q8_0), exact int8 x int8 block dots "
    "(AVX512-VNNI repacked or per row / AVX2 maddubs / scalar), one f32 fma per block with "
    "d_w*d_x in block order (llama.cpp's q8_0 x q8_0)",
    "fast: activation rows quantized to Q8_0 (Q8_1-style sums for Q4_1), exact int sub-block dots, "
    "then the f32 block updates rounded as llama.cpp's vec_dot does ((I*d)*e, then add) in two interleaved "
    "chains (even/odd blocks), the min terms in a third, added at the end; canonical (= decode): the same integers, one fma chain per output in block order",
    "fast: activation rows quantized to Q8_0 (Q8_1-style sums for Q4_1), exact int sub-block dots, "
    "then the f32 block updates rounded as llama.cpp's vec_dot does ((I*d)*e, then add) in two interleaved "
    "chains (even/odd blocks), the min terms in a third, added at the end; canonical (= decode): the same integers, one fma chain per output in block order",
    "fast: activation rows quantized to Q8_0 (Q8_1-style sums for Q4_1), exact int sub-block dots, "
    "then the f32 block updates rounded as llama.cpp's vec_dot does ((I*d)*e, then add) in two interleaved "
    "chains (even/odd blocks), the min terms in a third, added at the end; canonical (= decode): the same integers, one fma chain per output in block order",
    "fast: activation rows quantized to Q8_0 (Q8_1-style sums for Q5_1), exact int sub-block dots, "
    "then the f32 block updates rounded as llama.cpp's vec_dot does ((I*d)*e, then add) in two interleaved "
    "chains (even/odd blocks), the min terms in a third, added at the end; canonical (= decode): the same integers, one fma chain per output in block order",
    "fast: activation rows quantized to Q8_K (8-bit, f32 scale per 256), exact int sub-block dots "
    "with the 6-bit scales, f32 super-block updates rounded as llama.cpp's vec_dot does ((I*d)*e, then add) "
    "in two interleaved chains with the min terms in a third; "
    "canonical (= decode): the same integers, one fma chain per output in super-block order",
    "fast: activation rows quantized to Q8_K (8-bit, f32 scale per 256), exact int sub-block dots "
    "with the 6-bit scales, f32 super-block updates rounded as llama.cpp's vec_dot does ((I*d)*e, then add) "
    "in two interleaved chains with the min terms in a third; "
    "canonical (= decode): the same integers, one fma chain per output in super-block order",
    "fast: activation rows quantized to Q8_K (8-bit, f32 scale per 256), exact int sub-block dots "
    "with the int8 scales, f32 super-block updates rounded as llama.cpp's vec_dot does ((I*d)*e, then add) "
    "in two interleaved chains; "
    "canonical (= decode): the same integers, one fma chain per output in super-block order",
    "fast: one-pass softmax over the whole prefix with query tiles; canonical: fixed "
    "64-position split-KV chunks at absolute positions, combined left to right",
    "fast: 4-row interleaved sum of squares with 8 accumulators; canonical: 16-lane tree per row",
    "fast: angle by repeated multiplication of the frequency; canonical: powf per pair",
    "fast: polynomial exp approximation; canonical: libm expf",
    "fast: add fused with the next norm's sum of squares; canonical: add then a separate norm",
    "fast: polynomial exp, four interleaved partial sums, reciprocal multiplies (near-tied router "
    "logits pick other experts); canonical: ds_expf, one left-to-right sum, IEEE divisions, ties to the lower expert",
    "fast: decay folded into the state dot, fmaf state update, 4 interleaved partial sums, polynomial exp, "
    "conv as an fmaf chain newest tap first; canonical (= decode): one position at a time in order, 16-lane dots, "
    "rounded product then add, ds_expf",
    "fast: one online softmax over the window from the sink, 4-partial-sum dots, fmaf V updates, reciprocal "
    "multiply; canonical (= decode): 64-position chunks at absolute positions folded left to right, the sink last, "
    "16-lane dots, IEEE division",
    "fast: polynomial exp in the sigmoids and the Sinkhorn softmax, reciprocal multiplies in every normalisation, "
    "fmaf stream sum; canonical (= decode): ds_expf / ds_sigmoidf, sums in index order, IEEE divisions, rounded "
    "product then add per stream",
    "fast: fused tail, fmaf chain over the old streams from the last one, then fmaf(f, post, mix); canonical "
    "(= decode): f * post first, then a rounded product and an add per old stream in stream order",
    "fast: one online softmax pass per dim, polynomial exp, fmaf updates, reciprocal multiply; canonical "
    "(= decode): the max first, then ds_expf, sum and weighted sum in position order, IEEE division",
    "fast: 4-partial-sum fmaf dots and an fmaf head sum (near-tied blocks swap at the top-k edge); canonical "
    "(= decode): 16-lane dots, heads summed in order, top-k with ties to the lower block, ascending block order",
    "fast (--tp N): row-parallel o_proj and down, K split across the N ranks, the N partial dot products summed "
    "by an all-reduce (bits change with N); canonical (= decode, = --tp 1): column-parallel, every output one "
    "complete dot product over K, activations all-gathered (a copy)",
};

const char *ds_family_name(int fam) {
    return fam >= 0 && fam < DS_FAM_COUNT ? fam_names[fam] : "unknown";
}

int ds_family_from_name(const char *name) {
    if (!name) return -1;
    for (int f = 0; f < DS_FAM_COUNT; f++)
        if (strcmp(name, fam_names[f]) == 0) return f;
    return -1;
}

const char *ds_family_describe(int fam) {
    return fam >= 0 && fam < DS_FAM_COUNT ? fam_desc[fam] : "unknown family";
}

int ds_matmul_family(uint32_t weight_type) {
    switch (weight_type) {
    case DS_TYPE_F32: return DS_FAM_MATMUL_F32;
    case DS_TYPE_F16: return DS_FAM_MATMUL_F16;
    case DS_TYPE_BF16: return DS_FAM_MATMUL_BF16;
    case DS_TYPE_Q8_0: return DS_FAM_MATMUL_Q8_0;
    case DS_TYPE_Q4_0: return DS_FAM_MATMUL_Q4_0;
    case DS_TYPE_Q4_1: return DS_FAM_MATMUL_Q4_1;
    case DS_TYPE_Q5_0: return DS_FAM_MATMUL_Q5_0;
    case DS_TYPE_Q5_1: return DS_FAM_MATMUL_Q5_1;
    case DS_TYPE_Q4_K: return DS_FAM_MATMUL_Q4_K;
    case DS_TYPE_Q5_K: return DS_FAM_MATMUL_Q5_K;
    case DS_TYPE_Q6_K: return DS_FAM_MATMUL_Q6_K;
    default: return -1;
    }
}

int ds_family_weight_type(int fam) {
    static const int types[] = { DS_TYPE_F32,  DS_TYPE_F16,  DS_TYPE_BF16, DS_TYPE_Q8_0,
                                 DS_TYPE_Q4_0, DS_TYPE_Q4_1, DS_TYPE_Q5_0, DS_TYPE_Q5_1,
                                 DS_TYPE_Q4_K, DS_TYPE_Q5_K, DS_TYPE_Q6_K };
    return fam >= 0 && fam < (int)(sizeof types / sizeof types[0]) ? types[fam] : -1;
}

/* ==========================================================================
 * kernel sets
 * ========================================================================== */
void ds_kernel_set_all(ds_kernel_set *ks, ds_variant v) {
    for (int f = 0; f < DS_FAM_COUNT; f++) ks->v[f] = (uint8_t)v;
}

static void known_list(char *buf, size_t n) {
    size_t off = 0;
    buf[0] = 0;
    for (int f = 0; f < DS_FAM_COUNT && off < n; f++) {
        int w = snprintf(buf + off, n - off, "%s%s", f ? ", " : "", fam_names[f]);
        if (w < 0) break;
        off += (size_t)w;
    }
}

/* Apply "a,b,c" (spaces around names allowed) with variant v. */
static int apply_list(ds_kernel_set *ks, const char *list, ds_variant v, const char *what,
                      char *err, size_t errlen) {
    if (!list) return 0;
    const char *s = list;
    for (;;) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        const char *a = s, *b = s + len;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        if (a == b) {
            ds_errf(err, errlen, "empty kernel family name in %s list '%s'", what, list);
            return -1;
        }
        char name[64];
        int fam = -1;
        if ((size_t)(b - a) < sizeof name) {
            memcpy(name, a, (size_t)(b - a));
            name[b - a] = 0;
            fam = ds_family_from_name(name);
        }
        if (fam < 0) {
            char known[256];
            known_list(known, sizeof known);
            ds_errf(err, errlen, "unknown kernel family '%.*s' (known: %s)", (int)(b - a), a, known);
            return -1;
        }
        ks->v[fam] = (uint8_t)v;
        if (!e) return 0;
        s = e + 1;
    }
}

int ds_kernel_set_parse(ds_kernel_set *ks, const char *kernels, const char *fast_list,
                        const char *canon_list, char *err, size_t errlen) {
    ds_kernel_set t;
    if (!kernels || strcmp(kernels, "canonical") == 0) {
        ds_kernel_set_all(&t, DS_CANONICAL);
    } else if (strcmp(kernels, "fast") == 0) {
        ds_kernel_set_all(&t, DS_FAST);
    } else {
        ds_errf(err, errlen, "unknown kernel set '%s' (expected canonical or fast)", kernels);
        return -1;
    }
    if (apply_list(&t, fast_list, DS_FAST, "fast", err, errlen)) return -1;
    if (apply_list(&t, canon_list, DS_CANONICAL, "canonical", err, errlen)) return -1;
    *ks = t;
    return 0;
}

void ds_kernel_set_str(const ds_kernel_set *ks, char *buf, size_t n) {
    if (!buf || !n) return;
    int nfast = 0;
    for (int f = 0; f < DS_FAM_COUNT; f++) nfast += ks->v[f] == DS_FAST;
    if (nfast == 0) { snprintf(buf, n, "canonical"); return; }
    if (nfast == DS_FAM_COUNT) { snprintf(buf, n, "fast"); return; }
    /* base = the majority; list the exceptions in family order */
    int base_fast = nfast * 2 > DS_FAM_COUNT;
    size_t off = 0;
    int w = snprintf(buf, n, "%s %s=", base_fast ? "fast" : "canonical",
                     base_fast ? "canonical" : "fast");
    if (w < 0 || (size_t)w >= n) return;
    off = (size_t)w;
    int first = 1;
    for (int f = 0; f < DS_FAM_COUNT; f++) {
        if ((ks->v[f] == DS_FAST) == base_fast) continue;
        w = snprintf(buf + off, n - off, "%s%s", first ? "" : ",", fam_names[f]);
        if (w < 0 || (size_t)w >= n - off) return;
        off += (size_t)w;
        first = 0;
    }
}

/* ==========================================================================
 * SIMD level: detected once (the one cached static the rules allow)
 * ========================================================================== */
static int detect_level(void) {
    int lv = DS_LVL_PORTABLE;
#if DS_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        lv = DS_LVL_AVX2;
    if (lv == DS_LVL_AVX2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        lv = DS_LVL_AVX512;
    if (lv == DS_LVL_AVX2 && __builtin_cpu_supports("avxvnni")) lv = DS_LVL_AVXVNNI;
#elif DS_ARM
    /* ASIMD is part of the AArch64 base ISA (HWCAP_ASIMD is set wherever
     * Linux runs it); SDOT is the armv8.2 dotprod extension */
    const unsigned long hw = getauxval(AT_HWCAP);
    if (hw & HWCAP_ASIMD) lv = DS_LVL_NEON;
    if (lv == DS_LVL_NEON && (hw & HWCAP_ASIMDDP)) lv = DS_LVL_DOTPROD;
    /* SMMLA is the armv8.6 i8mm extension, reported in the second word */
    if (lv == DS_LVL_DOTPROD && (getauxval(AT_HWCAP2) & HWCAP2_I8MM)) lv = DS_LVL_I8MM;
#endif
    return lv;
}

/* the levels of this architecture, in order; a level of the other one is
 * never ok (simd.h) */
#if DS_X86
/* x86 levels in order: portable < avx2 < avxvnni < avx512 (the enum's
 * values are not that order: avxvnni came last) */
static int x86_rank(int lv) {
    return lv == DS_LVL_AVX512 ? 3 : lv == DS_LVL_AVXVNNI ? 2 : lv == DS_LVL_AVX2 ? 1 : 0;
}
#endif

int ds_simd_level_ok(int lv) {
    if (lv == DS_LVL_PORTABLE) return 1;
#if DS_X86
    /* AVX-VNNI is its own CPUID bit: an AVX-512 CPU may lack it */
    if (lv == DS_LVL_AVXVNNI) return x86_rank(detect_level()) >= 1 && __builtin_cpu_supports("avxvnni");
    return (lv == DS_LVL_AVX2 || lv == DS_LVL_AVX512) && x86_rank(lv) <= x86_rank(detect_level());
#elif DS_ARM
    /* portable < neon < dotprod < i8mm: the enum's values are that order */
    return (lv == DS_LVL_NEON || lv == DS_LVL_DOTPROD || lv == DS_LVL_I8MM) && lv <= detect_level();
#else
    return 0;
#endif
}

int ds_simd_parse(const char *v, int *cap, char *err, size_t errlen) {
    *cap = DS_LVL_COUNT;            /* unset or empty: no cap */
    if (!v || !*v) return 0;
#if DS_ARM
    static const char *const names[] = {"portable", "neon", "dotprod", "i8mm"};
    static const int lvs[] = {DS_LVL_PORTABLE, DS_LVL_NEON, DS_LVL_DOTPROD, DS_LVL_I8MM};
    const char *list = "portable, neon, dotprod or i8mm";
#else
    static const char *const names[] = {"portable", "avx2", "avxvnni", "avx512"};
    static const int lvs[] = {DS_LVL_PORTABLE, DS_LVL_AVX2, DS_LVL_AVXVNNI, DS_LVL_AVX512};
    const char *list = "portable, avx2, avxvnni or avx512";
#endif
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (strcmp(v, names[i]) == 0) {
            *cap = lvs[i];
            return 0;
        }
    ds_errf(err, errlen, "DSPARK_SIMD='%.40s' is not a SIMD level of this build (use %s; "
            "names are lower-case)", v, list);
    return -1;
}

int ds_simd_check_env(char *err, size_t errlen) {
    int cap;
    return ds_simd_parse(getenv("DSPARK_SIMD"), &cap, err, errlen);
}

/* The ONE place the SIMD level is decided: every SIMD choice in the CPU
 * kernels (matmul paths, the attention loops, Q8_0 activation quantizing,
 * VNNI packing) asks this function. DSPARK_SIMD caps the level (compare
 * paths end to end on one machine); an unknown value is refused at CLI
 * start (ds_simd_check_env) and ignored by library callers that skip the
 * check. */
int ds_simd_mm_level(void) {
    static atomic_int cached = -1;
    int lv = atomic_load_explicit(&cached, memory_order_relaxed);
    if (lv >= 0) return lv;
    lv = detect_level();
    int cap;
    if (ds_simd_parse(getenv("DSPARK_SIMD"), &cap, NULL, 0) == 0 && cap != DS_LVL_COUNT) {
#if DS_X86
        /* a cap above what the CPU runs leaves the CPU's level; avxvnni on a
         * CPU without AVX-VNNI is avx2 */
        if (!ds_simd_level_ok(cap)) cap = cap == DS_LVL_AVXVNNI ? DS_LVL_AVX2 : lv;
        if (x86_rank(cap) < x86_rank(lv)) lv = cap;
#else
        if (cap < lv) lv = cap;
#endif
    }
    atomic_store_explicit(&cached, lv, memory_order_relaxed);
    return lv;
}
/* every kernel but the matmuls: AVXVNNI runs the AVX2 code, I8MM the dotprod code */
int ds_simd_level(void) { return DS_LVL_BASE(ds_simd_mm_level()); }

const char *ds_simd_level_name(int lv) {
    switch (lv) {
    case DS_LVL_AVX512: return "avx512";
    case DS_LVL_AVX2: return "avx2";
    case DS_LVL_AVXVNNI: return "avxvnni";
    case DS_LVL_NEON: return "neon";
    case DS_LVL_DOTPROD: return "dotprod";
    case DS_LVL_I8MM: return "i8mm";
    default: return "portable";
    }
}

const char *ds_simd_path(void) { return ds_simd_level_name(ds_simd_mm_level()); }

/* ==========================================================================
 * conversions
 * ========================================================================== */
void ds_row_to_f32(uint32_t type, const void *row, int64_t n, float *out) {
    switch (type) {
    case DS_TYPE_F32:
        memcpy(out, row, (size_t)n * sizeof(float));
        break;
    /* memcpy loads: rows come from files (a safetensors buffer, a GGUF of
     * any alignment) and need not be aligned */
    case DS_TYPE_F16: {
        const unsigned char *h = row;
        for (int64_t i = 0; i < n; i++) { uint16_t u; memcpy(&u, h + 2 * i, 2); out[i] = ds_fp16_to_f32(u); }
        break;
    }
    case DS_TYPE_BF16: {
        const unsigned char *h = row;
        for (int64_t i = 0; i < n; i++) { uint16_t u; memcpy(&u, h + 2 * i, 2); out[i] = ds_bf16_to_f32(u); }
        break;
    }
    case DS_TYPE_Q8_0: {
        const unsigned char *b = row;
        for (int64_t i = 0; i < n / DS_QK8_0; i++) {
            ds_block_q8_0 blk;
            memcpy(&blk, b + (size_t)i * sizeof blk, sizeof blk);
            float d = ds_fp16_to_f32(blk.d);
            for (int j = 0; j < DS_QK8_0; j++) out[i * DS_QK8_0 + j] = d * (float)blk.qs[j];
        }
        break;
    }
    default:
        if (ds_type_is_kq(type)) ds_kq_row_to_f32(type, row, n, out);
        else memset(out, 0, (size_t)n * sizeof(float));
        break;
    }
}

/* ggml's quantize_row_q8_0_ref: d = amax/127, id = d ? 1/d : 0,
 * q = roundf(x * id) (halves away from zero), d stored as fp16. Note that q
 * uses the f32 id while the dot uses the fp16-rounded d — exactly as ggml.
 * Non-finite inputs (which ggml leaves undefined) give q = 0 / clamp. */
static void q8_quant_scalar(const float *x, int64_t n, ds_block_q8_0 *out);

#if DS_X86
#include "kernels/cpu/q8_round.h"
/* AVX-512 form of the loop below, same bits: every step is the same IEEE
 * operation per element (mul, compare, truncating convert, exact subtract),
 * and the max of |x| over a NaN-free block is the same value in any order
 * (fabs leaves no -0). A block holding a NaN takes the scalar loop, whose
 * NaN handling depends on the element order. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static void q8_quant_avx512(const float *x, int64_t n, ds_block_q8_0 *out) {
    for (int64_t i = 0; i < n / DS_QK8_0; i++) {
        const float *xb = x + i * DS_QK8_0;
        const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        if ((__mmask16)(_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) |
                        _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q))) {
            q8_quant_scalar(xb, DS_QK8_0, out + i);
            continue;
        }
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[i].d = ds_f32_to_fp16(d);
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q[2] = {ds_q8_round16(x0, vid), ds_q8_round16(x1, vid)};
        _mm_storeu_si128((__m128i *)out[i].qs, _mm512_cvtepi32_epi8(q[0]));
        _mm_storeu_si128((__m128i *)(out[i].qs + 16), _mm512_cvtepi32_epi8(q[1]));
    }
}

/* The same on AVX2, 8 lanes at a time. */
__attribute__((target("avx2"))) static void q8_quant_avx2(const float *x, int64_t n, ds_block_q8_0 *out) {
    for (int64_t i = 0; i < n / DS_QK8_0; i++) {
        const float *xb = x + i * DS_QK8_0;
        __m256 v[4];
        float amax;
        if (ds_q8_block8(xb, v, &amax)) {
            q8_quant_scalar(xb, DS_QK8_0, out + i);
            continue;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[i].d = ds_f32_to_fp16(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++) q[k] = ds_q8_round8(v[k], vid);
        _mm256_storeu_si256((__m256i *)out[i].qs, ds_q8_pack32(q));
    }
}
#endif

void ds_quantize_row_q8_0(const float *x, int64_t n, ds_block_q8_0 *out) {
#if DS_X86
    if (ds_simd_level() >= DS_LVL_AVX512) {
        q8_quant_avx512(x, n, out);
        return;
    }
    if (ds_simd_level() == DS_LVL_AVX2) {
        q8_quant_avx2(x, n, out);
        return;
    }
#endif
    q8_quant_scalar(x, n, out);
}

static void q8_quant_scalar(const float *x, int64_t n, ds_block_q8_0 *out) {
    for (int64_t i = 0; i < n / DS_QK8_0; i++) {
        const float *xb = x + i * DS_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < DS_QK8_0; j++) {
            float v = fabsf(xb[j]);
            amax = amax > v ? amax : v;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[i].d = ds_f32_to_fp16(d);
        /* q = clamp(roundf(v), -128, 127) with NaN -> 0, computed as
         * roundf(clamp(v)) (the same: roundf is monotonic and the bounds are
         * integers) with roundf spelled out — truncate, then step away from
         * zero when the exact remainder is at least one half — so that the
         * loop vectorizes instead of calling libm per element (canonical
         * Q8_0 quantizes every activation row per call). Same bits as roundf on
         * [-128, 127] (test_matmul checks ties and random values). */
        for (int j = 0; j < DS_QK8_0; j++) {
            float v = xb[j] * id;
            v = v != v ? 0.0f : v > 127.0f ? 127.0f : v < -128.0f ? -128.0f : v;
            const int32_t t = (int32_t)v;          /* toward zero, exact */
            const float r = v - (float)t;          /* exact: |v| < 2^23 */
            out[i].qs[j] = (int8_t)(t + (r >= 0.5f) - (r <= -0.5f));
        }
    }
}

void ds_f32_to_type(uint32_t type, const float *x, int64_t n, void *out) {
    switch (type) {
    case DS_TYPE_F32:
        memcpy(out, x, (size_t)n * sizeof(float));
        break;
    case DS_TYPE_F16: {
        uint16_t *h = out;
        for (int64_t i = 0; i < n; i++) h[i] = ds_f32_to_fp16(x[i]);
        break;
    }
    case DS_TYPE_BF16: {
        uint16_t *h = out;
        for (int64_t i = 0; i < n; i++) h[i] = ds_f32_to_bf16(x[i]);
        break;
    }
    case DS_TYPE_Q8_0:
        ds_quantize_row_q8_0(x, n, out);
        break;
    default:
        if (ds_type_is_kq(type)) ds_kq_quantize(type, x, 1, n, out);
        break;
    }
}
