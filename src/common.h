/* common.h — small shared vocabulary of dspark: tensor types, half-float
 * conversions, overflow-checked arithmetic and error-string helpers.
 *
 * Everything here is pure and stateless; no file owns global mutable state. */
#ifndef DSPARK_COMMON_H
#define DSPARK_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdarg.h>
#include <string.h>

/* ---- tensor element types: the numeric ids are ggml's, so GGUF files move
 * both ways with llama.cpp. Only the types dspark computes with are
 * accepted by the loader; any other id is "unsupported tensor type". */
typedef enum {
    DS_TYPE_F32  = 0,
    DS_TYPE_F16  = 1,
    DS_TYPE_Q4_0 = 2,
    DS_TYPE_Q4_1 = 3,
    DS_TYPE_Q5_0 = 6,
    DS_TYPE_Q5_1 = 7,
    DS_TYPE_Q8_0 = 8,
    DS_TYPE_Q4_K = 12,
    DS_TYPE_Q5_K = 13,
    DS_TYPE_Q6_K = 14,
    DS_TYPE_BF16 = 30,
    DS_TYPE_I32  = 26,   /* data, never a weight: ds_type_i32_table says which tensors */
} ds_type;

#define DS_QK8_0 32                 /* elements per Q8_0 block               */
typedef struct {
    uint16_t d;                     /* fp16 scale                            */
    int8_t   qs[DS_QK8_0];          /* quants: x = d * q                     */
} ds_block_q8_0;                    /* 34 bytes, ggml's block_q8_0 layout    */

/* ---- ggml's other block layouts, byte for byte (ggml-common.h). Element
 * order inside a block is ggml's: the low nibbles of qs[] are elements
 * 0..15, the high nibbles 16..31 (legacy types); the K types run in
 * 64-element groups (low nibbles 32, then high nibbles 32). kquant.c holds
 * the dequantization (ds_row_to_f32) and the quantizers. */
#define DS_QK4 32                   /* Q4_0 / Q4_1 / Q5_0 / Q5_1 block       */
#define DS_QK_K 256                 /* K-type super-block                    */
typedef struct { uint16_t d; uint8_t qs[16]; } ds_block_q4_0;               /* x = d*(q-8)          18 B */
typedef struct { uint16_t d, m; uint8_t qs[16]; } ds_block_q4_1;            /* x = d*q + m          20 B */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } ds_block_q5_0;/* x = d*(q-16)         22 B */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } ds_block_q5_1; /* x = d*q + m      24 B */
typedef struct {                    /* 8 sub-blocks of 32: x = d*sc*q - dmin*m, sc/m 6-bit   144 B */
    uint16_t d, dmin;
    uint8_t  scales[12];
    uint8_t  qs[128];
} ds_block_q4_K;
typedef struct {                    /* as Q4_K with a 5th bit per quant in qh      176 B */
    uint16_t d, dmin;
    uint8_t  scales[12];
    uint8_t  qh[32];
    uint8_t  qs[128];
} ds_block_q5_K;
typedef struct {                    /* 16 sub-blocks of 16: x = d*sc*(q-32), sc int8   210 B */
    uint8_t  ql[128];
    uint8_t  qh[64];
    int8_t   scales[16];
    uint16_t d;
} ds_block_q6_K;

/* I32 tensors are integer tables, not weights: the only one dspark reads is
 * deepseek4's hash-layer expert table (blk.N.ffn_gate_tid2eid.weight). The
 * GGUF reader and writer take I32 for such names only, so no weight path
 * (matmul, embedding, norm conversion) ever meets the type. */
static inline int ds_type_i32_table(const char *name) {
    const char *suf = ".ffn_gate_tid2eid.weight";
    const size_t n = strlen(name), m = strlen(suf);
    return n > m && !strncmp(name, "blk.", 4) && !strcmp(name + n - m, suf);
}

/* 1 if t is a type dspark supports. */
static inline int ds_type_valid(uint32_t t) {
    switch (t) {
    case DS_TYPE_F32: case DS_TYPE_F16: case DS_TYPE_BF16: case DS_TYPE_Q8_0:
    case DS_TYPE_Q4_0: case DS_TYPE_Q4_1: case DS_TYPE_Q5_0: case DS_TYPE_Q5_1:
    case DS_TYPE_Q4_K: case DS_TYPE_Q5_K: case DS_TYPE_Q6_K:
        return 1;
    default:
        return 0;
    }
}
static inline const char *ds_type_name(uint32_t t) {
    switch (t) {
    case DS_TYPE_F32: return "F32";
    case DS_TYPE_F16: return "F16";
    case DS_TYPE_Q8_0: return "Q8_0";
    case DS_TYPE_BF16: return "BF16";
    case DS_TYPE_Q4_0: return "Q4_0";
    case DS_TYPE_Q4_1: return "Q4_1";
    case DS_TYPE_Q5_0: return "Q5_0";
    case DS_TYPE_Q5_1: return "Q5_1";
    case DS_TYPE_Q4_K: return "Q4_K";
    case DS_TYPE_Q5_K: return "Q5_K";
    case DS_TYPE_Q6_K: return "Q6_K";
    case DS_TYPE_I32: return "I32";
    default: return "unknown";
    }
}
/* 1 for the block-quantized types other than Q8_0 (the kquant families). */
static inline int ds_type_is_kq(uint32_t t) {
    return t == DS_TYPE_Q4_0 || t == DS_TYPE_Q4_1 || t == DS_TYPE_Q5_0 || t == DS_TYPE_Q5_1 ||
           t == DS_TYPE_Q4_K || t == DS_TYPE_Q5_K || t == DS_TYPE_Q6_K;
}
/* "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k",
 * "q5_k", "q6_k" (case-insensitive) -> the type; -1 if unknown. */
static inline int ds_type_from_name(const char *s) {
    static const struct { const char *n; int t; } k[] = {
        {"f32", DS_TYPE_F32}, {"f16", DS_TYPE_F16}, {"bf16", DS_TYPE_BF16}, {"q8_0", DS_TYPE_Q8_0},
        {"q4_0", DS_TYPE_Q4_0}, {"q4_1", DS_TYPE_Q4_1}, {"q5_0", DS_TYPE_Q5_0}, {"q5_1", DS_TYPE_Q5_1},
        {"q4_k", DS_TYPE_Q4_K}, {"q5_k", DS_TYPE_Q5_K}, {"q6_k", DS_TYPE_Q6_K},
    };
    for (size_t i = 0; s && i < sizeof k / sizeof k[0]; i++) {
        size_t j = 0;
        while (k[i].n[j] && s[j] && (s[j] >= 'A' && s[j] <= 'Z' ? s[j] + 32 : s[j]) == k[i].n[j]) j++;
        if (!k[i].n[j] && !s[j]) return k[i].t;
    }
    return -1;
}
#define DS_TYPE_NAMES "f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q5_k|q6_k"

/* elements per block and bytes per block */
static inline uint64_t ds_type_block_elems(uint32_t t) {
    switch (t) {
    case DS_TYPE_Q8_0: case DS_TYPE_Q4_0: case DS_TYPE_Q4_1: case DS_TYPE_Q5_0: case DS_TYPE_Q5_1:
        return 32;
    case DS_TYPE_Q4_K: case DS_TYPE_Q5_K: case DS_TYPE_Q6_K:
        return DS_QK_K;
    default:
        return 1;
    }
}
static inline uint64_t ds_type_block_bytes(uint32_t t) {
    switch (t) {
    case DS_TYPE_F32: case DS_TYPE_I32: return 4;
    case DS_TYPE_F16: case DS_TYPE_BF16: return 2;
    case DS_TYPE_Q8_0: return sizeof(ds_block_q8_0);
    case DS_TYPE_Q4_0: return sizeof(ds_block_q4_0);
    case DS_TYPE_Q4_1: return sizeof(ds_block_q4_1);
    case DS_TYPE_Q5_0: return sizeof(ds_block_q5_0);
    case DS_TYPE_Q5_1: return sizeof(ds_block_q5_1);
    case DS_TYPE_Q4_K: return sizeof(ds_block_q4_K);
    case DS_TYPE_Q5_K: return sizeof(ds_block_q5_K);
    case DS_TYPE_Q6_K: return sizeof(ds_block_q6_K);
    default: return 0;
    }
}

/* ---- overflow-checked arithmetic: return 1 on overflow ---- */
static inline int ds_mul_ovf(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out); }
static inline int ds_add_ovf(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_add_overflow(a, b, out); }

/* Bytes of a row of n elements of type t; 0 with *ok=0 if n is not a whole
 * number of blocks or the size overflows. */
static inline uint64_t ds_row_bytes(uint32_t t, uint64_t n, int *ok) {
    uint64_t be = ds_type_block_elems(t), bb = ds_type_block_bytes(t), r;
    *ok = 0;
    if (bb == 0 || n % be) return 0;
    if (ds_mul_ovf(n / be, bb, &r)) return 0;
    *ok = 1;
    return r;
}

/* ---- half-precision conversions, bit-exact and portable (no F16C needed).
 * Round-to-nearest-even on the way down; NaN stays NaN. */
static inline float ds_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t ds_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float ds_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0) return ds_bits_f32(sign);
        /* subnormal: value = man * 2^-24 (exact in f32) */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    if (exp == 31) return ds_bits_f32(sign | 0x7f800000u | (man << 13));
    return ds_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}
static inline uint16_t ds_f32_to_fp16(float f) {
    uint32_t x = ds_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);          /* overflow -> inf */
    if (ax < 0x38800000u) {                                           /* subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign;                  /* < 2^-25 -> 0 (ties to even) */
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e;                                     /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t e = (ax >> 23) - 112, m = ax & 0x7fffff;
    uint32_t q = (e << 10) | (m >> 13), rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
    return (uint16_t)(sign | q);
}
static inline float ds_bf16_to_f32(uint16_t h) { return ds_bits_f32((uint32_t)h << 16); }
static inline uint16_t ds_f32_to_bf16(float f) {
    uint32_t x = ds_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---- deterministic pseudo-random numbers for generated weights and test
 * inputs: splitmix64 over a caller-owned state, and a uniform float in
 * [-1, 1) built from its top 24 bits (exact in f32). */
static inline uint64_t ds_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline float ds_uniform_pm1(uint64_t *state) {
    return (float)((ds_splitmix64(state) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* ---- error strings: every fallible API takes (char *err, size_t errlen)
 * and writes one human line without a trailing newline.
 *
 * Messages quote file bytes (architecture names, tokenizer models, config
 * strings, dtypes...), so the line is made safe in one place: every C0
 * control byte, DEL and every C1 control (U+0080..U+009F, bytes C2 80..9F)
 * becomes '?'. A newline or an escape sequence in a file can then neither
 * split the error into several lines nor drive the terminal. */
static inline void ds_sanitize_line(char *s) {
    for (unsigned char *p = (unsigned char *)s; *p; p++) {
        if (*p < 0x20 || *p == 0x7f) *p = '?';
        else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) { p[0] = '?'; p[1] = '?'; p++; }
    }
}
static inline void ds_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void ds_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    ds_sanitize_line(err);
}

#define DS_ERRLEN 512

#endif
