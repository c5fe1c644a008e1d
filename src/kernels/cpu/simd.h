/* simd.h — fixed-width lane vectors and run-time SIMD levels for the matmul
 * families. Private to src/kernels/cpu.
 *
 * ==== Why GCC vector extensions =============================================
 * A canonical reduction in dspark is a FIXED set of 16 independent lane
 * accumulators. The tiles hold those 16 lanes as chunks of GCC generic
 * vectors in the level's native width: one ds_v16f (AVX-512), two ds_v8f
 * (AVX2) or four ds_v4f (SSE2 / NEON / scalar). Every operation on them is
 * defined lane by lane with IEEE single rounding, so every width computes
 * the same bits. (One 64-byte vector *variable* would give the same bits on
 * AVX2 too, but GCC keeps it in memory there; see matmul_tile.h.) There is
 * no reassociation (never -ffast-math) and no implicit contraction
 * (-ffp-contract=off): the compiler never decides where an FMA goes.
 *
 * ==== Why the canonical lane update is a fused multiply-add ====================
 * The canonical step is acc[l] = fma(w[l], x[l], acc[l]): ONE rounding, the
 * IEEE-754 fusedMultiplyAdd, which every implementation computes to the same
 * bits: VFMADD on AVX2+FMA and AVX-512, FMLA on NEON, and C's fmaf() on the
 * portable level (correctly rounded by the standard; glibc uses the
 * hardware instruction where the CPU has one and an exact software
 * algorithm where not). So the fixed-lane rule still holds: the 16 lanes,
 * the k -> lane map and the combine tree fix every rounding, and FMA
 * changes none of that — it only removes the product's rounding, which
 * halves the floating-point instructions of the compute-bound batched
 * verify and decode (and is more accurate). The FMA is written explicitly
 * (ds_fmaW in matmul_tile.h), never left to contraction, so the canonical
 * sequence does not depend on what the compiler chooses to fuse. The fast
 * variants write `acc + w * x` and let contraction fuse it (DS_FAST_FN,
 * below); they differ from canonical in the lane combine.
 *
 * ==== Run-time levels =========================================================
 * On x86-64 each kernel body is an always-inline function instantiated three
 * times, with target("avx512...") / target("avx2,fma,f16c") / no attribute,
 * and ds_simd_level() (registry.c; cached once, the one static the rules
 * allow) picks the instance. This is GCC function multiversioning done by
 * hand, so the AVX2 instance can require FMA+F16C, the tile shapes and lane
 * widths can be chosen per level, and the weight loaders can use the level's
 * conversion instructions (DS_X86_BUILTINS below). Tile shapes never change
 * bits: every (m, n) output has its own accumulator and the same operation
 * sequence in any tile. */
#ifndef DSPARK_SIMD_H
#define DSPARK_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

#define DS_INLINE static inline __attribute__((always_inline))

/* Every helper taking or returning a vector is always inlined, so the
 * psABI warning about returning 64-byte vectors without AVX-512 never
 * applies. (It fires at call sites too, so it stays off for the including
 * file; only the matmul files and test_matmul include this header.) */
#pragma GCC diagnostic ignored "-Wpsabi"

/* Lane vectors of 16 (one zmm), 8 (one ymm) and 4 (one xmm / NEON q) lanes.
 * A canonical accumulator is always 16 lanes; a tile holds it as 16/W
 * chunks of W lanes, W picked per level (matmul_tile.h says why). */
typedef float    ds_v16f __attribute__((vector_size(64)));
typedef int32_t  ds_v16i __attribute__((vector_size(64)));
typedef uint32_t ds_v16u __attribute__((vector_size(64)));
typedef uint16_t ds_v16h __attribute__((vector_size(32)));
typedef int16_t  ds_v16s __attribute__((vector_size(32)));
typedef int8_t   ds_v16b __attribute__((vector_size(16)));
typedef float    ds_v8f  __attribute__((vector_size(32)));
typedef int32_t  ds_v8i  __attribute__((vector_size(32)));
typedef uint32_t ds_v8u  __attribute__((vector_size(32)));
typedef uint16_t ds_v8h  __attribute__((vector_size(16)));
typedef int16_t  ds_v8s  __attribute__((vector_size(16)));
typedef int8_t   ds_v8b  __attribute__((vector_size(8)));
typedef float    ds_v4f  __attribute__((vector_size(16)));
typedef int32_t  ds_v4i  __attribute__((vector_size(16)));
typedef uint32_t ds_v4u  __attribute__((vector_size(16)));
typedef uint16_t ds_v4h  __attribute__((vector_size(8)));
typedef int16_t  ds_v4s  __attribute__((vector_size(8)));
typedef int8_t   ds_v4b  __attribute__((vector_size(4)));

/* ---- levels ---------------------------------------------------------------- 
 * One enum for both architectures; each uses its own subset, ordered by
 * value: x86-64 portable < avx2 < avx512, AArch64 portable < neon < dotprod
 * (< i8mm, below).
 * On AArch64 "portable" is the base-ISA C (GCC's generic vectors are NEON
 * there too, and the integer dots scalar loops), "neon" the hand-written
 * armv8.0 ASIMD integer dots (SMULL + SADALP), "dotprod" the armv8.2
 * SDOT ones (HWCAP_ASIMDDP). A level of the other architecture is never
 * ds_simd_level_ok, so an x86 branch (lv >= DS_LVL_AVX2) is never taken on
 * AArch64, where those branches are not even compiled. */
enum {
    DS_LVL_PORTABLE = 0, DS_LVL_AVX2 = 1, DS_LVL_AVX512 = 2,
    DS_LVL_NEON = 3, DS_LVL_DOTPROD = 4,
    DS_LVL_AVXVNNI = 5,
    DS_LVL_I8MM = 6,
    DS_LVL_COUNT = 7
};
/* AVXVNNI is AVX2 plus AVX-VNNI (VPDPBUSD on ymm without AVX-512: Intel
 * client cores since Alder Lake, Zen 5's AVX2 paths), between avx2 and
 * avx512 in the x86 order. It is a MATMUL level only: the canonical Q8_0
 * tile reads its own packed layout with VPDPBUSD (matmul_q8_0.c); every
 * other kernel runs the AVX2 code, so ds_simd_level() reports AVX2 there
 * and ds_simd_mm_level() the AVXVNNI level (matmul.c maps it to AVX2 plus
 * ds_mm_ctx.avxvnni). */
/* I8MM is its AArch64 counterpart: dotprod plus the armv8.6 int8 matrix
 * multiply (SMMLA, HWCAP2_I8MM), above dotprod. Also a matmul level only:
 * the canonical Q8_0 tile and the kquant integer parts of two activation
 * rows at a time take SMMLA (ds_mm_ctx.i8mm); everything else is the
 * dotprod code, so ds_simd_level() reports DOTPROD there. */
#define DS_LVL_BASE(lv) ((lv) == DS_LVL_AVXVNNI ? DS_LVL_AVX2 : (lv) == DS_LVL_I8MM ? DS_LVL_DOTPROD : (lv))

/* The level this process uses (registry.c): detected once with
 * __builtin_cpu_supports (x86) / getauxval(AT_HWCAP, AT_HWCAP2) (AArch64),
 * optionally capped by DSPARK_SIMD=portable|avx2|avxvnni|avx512 (x86) or
 * portable|neon|dotprod|i8mm (AArch64) so that the paths can be compared end
 * to end on one machine. */
int ds_simd_level(void);
/* The matmul level: ds_simd_level(), or DS_LVL_AVXVNNI / DS_LVL_I8MM where
 * that is the CPU's (or DSPARK_SIMD's) level; DS_LVL_BASE of it is
 * ds_simd_level(). */
int ds_simd_mm_level(void);
/* Parse a DSPARK_SIMD value: *cap = the level, or DS_LVL_COUNT for NULL/""
 * (no cap); -1 with one line in err for anything else ("AVX2" included). */
int ds_simd_parse(const char *v, int *cap, char *err, size_t errlen);
/* ds_simd_parse(getenv("DSPARK_SIMD")): what the CLI checks at start. */
int ds_simd_check_env(char *err, size_t errlen);
/* 1 if level lv can run on this CPU (tests run every available level). */
int ds_simd_level_ok(int lv);
const char *ds_simd_level_name(int lv);

#if defined(__x86_64__) && defined(__GNUC__)
#define DS_X86 1
#define DS_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define DS_TARGET_AVX2   __attribute__((target("avx2,fma,f16c")))
#else
#define DS_X86 0
#endif

/* ---- x86 conversion instructions in the shared tile bodies -------------------------
 * Two weight conversions have one-instruction forms that GCC's generic
 * vector code does not find: fp16 -> f32 (VCVTPH2PS, F16C / AVX-512F) and
 * int8 -> int32 (VPMOVSXBD; GCC 12 goes through int16 and lane shuffles).
 * Both are exact. VCVTPH2PS equals the software converter for every non-NaN
 * input (subnormals included) and keeps a NaN's sign and payload, but sets
 * the quiet bit of a signalling NaN where the software converter keeps it
 * signalling; the only consumer is a multiply, which quiets a signalling NaN
 * the same way, so the matmul results agree (test_matmul checks all 65536
 * inputs per level). They are emitted through GCC's builtins, whose ISA check
 * runs when a function is expanded, i.e. in the target("avx2,fma,f16c") /
 * target("avx512...") instances the W = 8 / W = 16 loaders are inlined into
 * (the intrinsics' own always_inline wrappers would be refused in the shared
 * default-target tile bodies). That needs the optimizer to have removed the
 * other levels' branches first, hence __OPTIMIZE__; clang checks builtins
 * earlier, so it (and -O0) use the generic code. */
#if DS_X86 && defined(__OPTIMIZE__) && !defined(__clang__)
#define DS_X86_BUILTINS 1
/* GCC declares the builtins of an ISA the command line lacks only once a
 * target pragma enables it; immintrin.h's headers do that. */
#include <immintrin.h>
#else
#define DS_X86_BUILTINS 0
#endif
/* AArch64: the 4-lane FMA is NEON's FMLA (vfmaq_f32), part of the base ISA. */
#if defined(__aarch64__) && defined(__ARM_NEON)
#define DS_NEON_FMA 1
#define DS_ARM 1
#include <arm_neon.h>
#else
#define DS_NEON_FMA 0
#define DS_ARM 0
#endif

#if DS_ARM
/* ---- AArch64 integer dots -----------------------------------------------------
 * acc (4 x int32) += the products of a and b (16 x int8), in some grouping
 * of the 16 products into the 4 lanes: every caller sums the 4 lanes (or
 * lanes of several such vectors) into an exact integer, so the grouping is
 * immaterial. dp = 1: SDOT (armv8.2 dotprod: lane i += the 4 products
 * 4i..4i+3), written as inline assembly with its own .arch line: the
 * intrinsic (vdotq_s32) may only be inlined into functions compiled for
 * +dotprod, and the shared kernel bodies are inlined into the neon and the
 * dotprod instances alike (the branch is a constant after inlining). The
 * .arch line stays in effect for the rest of the file's assembly; that only
 * widens what the assembler accepts (the compiler still emits nothing the
 * file's flags do not allow). The dotprod instances run only where
 * HWCAP_ASIMDDP says SDOT exists.
 * dp = 0: SMULL / SMULL2 (int8 x int8 -> int16, exact: |p| <= 2^14) and
 * SADALP (pairs of int16 added into the int32 lanes, exact). */
DS_INLINE int32x4_t ds_neon_dot16(int32x4_t acc, int8x16_t a, int8x16_t b, int dp) {
    if (dp) {
        __asm__(".arch armv8.2-a+dotprod\n\tsdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
        return acc;
    }
    const int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t p1 = vmull_high_s8(a, b);
    return vpadalq_s16(vpadalq_s16(acc, p0), p1);
}
/* acc (a 2 x 2 int32 matrix, row-major) += A . B^T, where A and B are 2 x 8
 * int8 matrices (bytes 0..7 row 0, bytes 8..15 row 1): SMMLA (armv8.6
 * i8mm), lane 2i + j += sum_{k<8} a[8i + k] * b[8j + k], 8 exact products
 * per lane (|sum| <= 8 * 2^14). Inline assembly with its own .arch line for
 * the reason ds_neon_dot16 gives (armv8.6-a includes dotprod, so the wider
 * line never narrows what an SDOT needs); only the i8mm instances, which
 * run only where HWCAP2_I8MM says SMMLA exists, execute it. */
DS_INLINE int32x4_t ds_neon_mmla(int32x4_t acc, int8x16_t a, int8x16_t b) {
    __asm__(".arch armv8.6-a+i8mm\n\tsmmla %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
}
/* two rows' 16 bytes at byte offset o -> the 2 x 8 operands of SMMLA: rows
 * (r0[o..o+7], r1[o..o+7]) and (r0[o+8..o+15], r1[o+8..o+15]) */
DS_INLINE void ds_neon_zip2x8(int8x16_t r0, int8x16_t r1, int8x16_t *lo, int8x16_t *hi) {
    *lo = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(r0), vreinterpretq_s64_s8(r1)));
    *hi = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(r0), vreinterpretq_s64_s8(r1)));
}
#endif

/* ---- combines (over the 16 lanes of one accumulator, lane order) ---------------- */
/* Canonical: lanes l and l+8, then +4, +2, +1 — the fixed tree. */
DS_INLINE float ds_hsum16_tree(float a[16]) {
    for (int l = 0; l < 8; l++) a[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++) a[l] = a[l] + a[l + 4];
    for (int l = 0; l < 2; l++) a[l] = a[l] + a[l + 2];
    return a[0] + a[1];
}
/* Fast: plain left-to-right lane sum (what a scalar epilogue does). */
DS_INLINE float ds_hsum16_seq(const float a[16]) {
    float s = a[0];
    for (int l = 1; l < 16; l++) s = s + a[l];
    return s;
}

/* ---- contraction for the FAST kernels --------------------------------------
 * The fast instances are compiled with floating-point contraction on
 * (DS_FAST_FN), so `acc + a * b` on whole vectors becomes one vfmadd per
 * register wherever the level has FMA (AVX2, AVX-512, AArch64) and stays a
 * plain mul+add where it does not (portable x86-64: no libm call in the
 * fast path). Canonical instances never get this attribute: the global
 * -ffp-contract=off holds for them and their FMA is explicit (ds_fmaW). */
#define DS_FAST_FN __attribute__((optimize("fp-contract=fast")))

#endif
