/* matmul_kq.cu — the kquant matmul families on the GPU (MATMUL_Q4_K, MATMUL_Q5_K,
 * MATMUL_Q6_K, and MATMUL_Q4_0 / MATMUL_Q5_0 through the Q8_0 kernels):
 * y[m][n] = sum_k W[n][k] * x[m][k]. The CPU definitions are in
 * kernels/cpu/matmul_kq.h and matmul_q4_k.c ... matmul_q6_k.c; this file
 * mirrors them. Q4_1 / Q5_1 stay CPU-only (dsc_kq_supported).
 *
 *   decode     dsc_matmul(DS_CANONICAL, W, 1, ...): canonical at M = 1.
 *   canonical  K types: every activation row quantized to Q8_K exactly as
 *              ds_quantize_row_q8_k does (kq8k_quantize below: the same
 *              IEEE division, product, clamp and round-to-nearest-even,
 *              the first largest magnitude picked as the scalar loop
 *              picks it), then per (m, n), super-block by super-block in
 *              order (d, dmin: the weight's fp16 scales as f32, e: the
 *              activation's Q8_K scale):
 *                  I  = sum_j sc_j * sum_{l in j} q_l p_l          (exact;
 *                       Q6_K: q_l - 32)
 *                  Mn = sum_j m_j * sum_{l in j} p_l               (exact; Q4_K/Q5_K)
 *                  acc = fma((float)I, d * e, acc)
 *                  acc = fma(-(float)Mn, dmin * e, acc)            (Q4_K/Q5_K)
 *              y = acc, a NaN stored as the one quiet NaN 0x7fc00000 (the CPU's rule).
 *              Q4_0 / Q5_0: their definition IS Q8_0's with the integer
 *              quant q - 8 / q - 16 (matmul_kq.h: I = sum u p - off sum p
 *              = sum (u - off) p, exact; the same Q8_0 activation
 *              quantization, the same fma(I, d * e, acc) per block), so
 *              prepare stores them in the Q8_0 device layout and the Q8_0
 *              kernels (matmul_q8_0.cu) run them; only the NaN rule is added.
 *   fast       K types: what llama.cpp's mmvq kernels do — the same Q8_K
 *              activations and lane integers, but each lane keeps its own
 *              f32 partial sums over the super-blocks (product rounded, then
 *              added: d*e*I_lane and dmin*e*Mn_lane apart, subtracted at the
 *              end), and the 8 lanes of a row meet in one f32 butterfly
 *              (split-K). Q4_0 / Q5_0: the Q8_0 fast kernel (weights
 *              dequantized on the fly against the f32 activations).
 *
 * ==== Device layout (dsc_kq_upload) =====================================================
 * K types: every super-block repacked to a 16-byte multiple so that all loads
 * are aligned, the integer fields kept packed (the bandwidth is the file's),
 * the fp16 scales turned into their exact f32 values in `scale`:
 *   Q4_K  144 B  [qs 128][scale words 16]          scale: [n][nb][2] = d, dmin
 *   Q5_K  176 B  [qs 128][qh 32][scale words 16]   scale: [n][nb][2] = d, dmin
 *   Q6_K  208 B  [ql 128][qh 64][scales 16, permuted]  scale: [n][nb][1] = d
 * Q4_K/Q5_K scale word g (g = 0..3, the 64-element group) holds the 6-bit
 * (sc, m) pairs of sub-blocks 2g and 2g+1 as bytes sc_2g, sc_2g+1, m_2g,
 * m_2g+1 (unpacked on the host by ggml's get_scale_min_k4 rule). Q6_K byte
 * 8h + 4p + k holds the int8 scale of 16-group 8h + 2k + p (the four a lane
 * needs, in one word). qs / ql / qh are the file's bytes.
 * Q4_0 / Q5_0: int8 [n][n_in] of q - 8 / q - 16 (the Q8_0 layout) and f32
 * [n][n_in / 32] scales; 1 byte per weight instead of 0.56 / 0.69 (the price
 * of running them through the verified Q8_0 kernels).
 *
 * ==== Lanes ===============================================================================
 * A warp holds 4 weight rows, one per group of 8 lanes; the group walks its
 * row super-block by super-block, each lane taking 32 of the 256 elements:
 *   Q4_K/Q5_K lane s = 2g + h: qs bytes 32g + 16h .. +15, i.e. elements
 *             64g + 16h + t (sub-block 2g, low nibbles) and 64g + 32 + 16h + t
 *             (sub-block 2g+1, high nibbles), t = 0..15;
 *   Q6_K      lane s = 4h + c: l = 8c .. 8c+7 of half h, i.e. elements
 *             128h + 32k + l, k = 0..3 (16-groups 8h + 2k + c/2).
 * The lane's dots are exact int32 (dp4a); MT activation rows share every
 * weight load (the tile is read once for all of them).
 *
 * ==== Why canonical is the CPU's bits ===================================================
 * The quantized activations are the same bytes and scales (the same IEEE
 * operations as the scalar C loop, whose result no SIMD level changes). I
 * and Mn are exact integers (|I| < 2^28), so the lanes' dp4a partials and
 * the integer butterfly over 8 lanes give the CPU's values whatever the
 * order. The f32 part is the CPU's epilogue literally: (float)I rounded to
 * nearest, d * e and dmin * e one rounding each, fma, in super-block order
 * — one chain per (m, n) fixed by K alone; every lane of the group runs the
 * same chain on the same values, lane 0 stores it. No M, grid or launch
 * parameter enters the chain, so canonical(M) row m is decode(row m).
 * NaN results are stored as 0x7fc00000 as on the CPU (a GPU's NaN is
 * 0x7fffffff), so malformed blocks with NaN/inf scales compare too.
 *
 * ==== Why fast differs ===================================================================
 * The integer part is the same, the f32 part is not: every lane rounds its
 * own d*e*I_lane product and adds it to its own sum, the mins are a separate
 * sum, and the 8 lane sums meet in a butterfly — many more roundings, in
 * another order. Close to canonical (a few ulps of the row's magnitude),
 * visibly not its bits. */
#include "kernels/cuda/cuda_internal.cuh"

#include <stdlib.h>
#include <string.h>

#define KQ_QNAN_BITS 0x7fc00000u     /* the one NaN the CPU stores (matmul_kq.h) */

/* ---- device layout traits --------------------------------------------------------------- */
static inline int kq_dev_block_bytes(uint32_t t) {
    return t == DS_TYPE_Q4_K ? 144 : t == DS_TYPE_Q5_K ? 176 : t == DS_TYPE_Q6_K ? 208 : 0;
}
static inline int kq_dev_nf(uint32_t t) { return t == DS_TYPE_Q6_K ? 1 : 2; }   /* floats per super-block */
static inline bool kq_is_ktype(uint32_t t) {
    return t == DS_TYPE_Q4_K || t == DS_TYPE_Q5_K || t == DS_TYPE_Q6_K;
}

int dsc_kq_supported(uint32_t t) {
    return kq_is_ktype(t) || t == DS_TYPE_Q4_0 || t == DS_TYPE_Q5_0;
}

/* ==========================================================================
 * weight repacking (host)
 * ========================================================================== */
/* ggml's get_scale_min_k4: the 6-bit (sc, m) of sub-block j from scales[12] */
static void kq_host_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}
static void kq_scale_words(const uint8_t *scales12, uint8_t *out16) {
    for (int g = 0; g < 4; g++) {
        kq_host_scale_min(2 * g, scales12, &out16[4 * g + 0], &out16[4 * g + 2]);
        kq_host_scale_min(2 * g + 1, scales12, &out16[4 * g + 1], &out16[4 * g + 3]);
    }
}

/* One file row -> its device bytes (q) and f32 scales (s). */
static void kq_repack_row(uint32_t t, const void *row, int64_t K, uint8_t *q, float *s) {
    switch (t) {
    case DS_TYPE_Q4_K:
    case DS_TYPE_Q5_K: {              /* the same fields; Q5_K's qh between qs and the scales */
        const int q5 = t == DS_TYPE_Q5_K, bb = q5 ? 176 : 144;
        for (int64_t b = 0; b < K / DS_QK_K; b++, q += bb) {
            const ds_block_q4_K *x4 = q5 ? NULL : (const ds_block_q4_K *)row + b;
            const ds_block_q5_K *x5 = q5 ? (const ds_block_q5_K *)row + b : NULL;
            memcpy(q, q5 ? x5->qs : x4->qs, 128);
            if (q5) memcpy(q + 128, x5->qh, 32);
            kq_scale_words(q5 ? x5->scales : x4->scales, q + bb - 16);
            s[2 * b] = ds_fp16_to_f32(q5 ? x5->d : x4->d);
            s[2 * b + 1] = ds_fp16_to_f32(q5 ? x5->dmin : x4->dmin);
        }
        break;
    }
    case DS_TYPE_Q6_K: {
        const ds_block_q6_K *x = (const ds_block_q6_K *)row;
        for (int64_t b = 0; b < K / DS_QK_K; b++, q += 208) {
            memcpy(q, x[b].ql, 128);
            memcpy(q + 128, x[b].qh, 64);
            for (int h = 0; h < 2; h++)
                for (int p = 0; p < 2; p++)
                    for (int k = 0; k < 4; k++)
                        q[192 + 8 * h + 4 * p + k] = (uint8_t)x[b].scales[8 * h + 2 * k + p];
            s[b] = ds_fp16_to_f32(x[b].d);
        }
        break;
    }
    case DS_TYPE_Q4_0: {                  /* -> Q8_0 layout: int8 q - 8 */
        const ds_block_q4_0 *x = (const ds_block_q4_0 *)row;
        for (int64_t b = 0; b < K / 32; b++, q += 32) {
            for (int l = 0; l < 16; l++) {
                q[l] = (uint8_t)(int8_t)((x[b].qs[l] & 15) - 8);
                q[l + 16] = (uint8_t)(int8_t)((x[b].qs[l] >> 4) - 8);
            }
            s[b] = ds_fp16_to_f32(x[b].d);
        }
        break;
    }
    case DS_TYPE_Q5_0: {                  /* -> Q8_0 layout: int8 q - 16 */
        const ds_block_q5_0 *x = (const ds_block_q5_0 *)row;
        for (int64_t b = 0; b < K / 32; b++, q += 32) {
            uint32_t qh;
            memcpy(&qh, x[b].qh, 4);
            for (int l = 0; l < 16; l++) {
                const int h0 = (int)((qh >> l) & 1) << 4, h1 = (int)((qh >> (l + 16)) & 1) << 4;
                q[l] = (uint8_t)(int8_t)(((x[b].qs[l] & 15) | h0) - 16);
                q[l + 16] = (uint8_t)(int8_t)(((x[b].qs[l] >> 4) | h1) - 16);
            }
            s[b] = ds_fp16_to_f32(x[b].d);
        }
        break;
    }
    default:
        break;
    }
}

#define KQ_STAGE_BYTES (64u << 20)   /* host staging per slab of rows */

cudaError_t dsc_kq_upload(const ds_weight *w, dsc_weight *d) {
    const uint32_t t = w->type;
    const size_t N = (size_t)w->n_out, K = (size_t)w->n_in;
    int ok = 0;
    const size_t rb = (size_t)ds_row_bytes(t, (uint64_t)K, &ok);      /* file bytes per row */
    const bool kt = kq_is_ktype(t);
    const size_t nb = kt ? K / DS_QK_K : K / 32;
    const size_t qrow = kt ? nb * (size_t)kq_dev_block_bytes(t) : K;  /* device bytes per row */
    const size_t frow = kt ? nb * (size_t)kq_dev_nf(t) : nb;         /* f32 scales per row */
    const bool empty = N == 0 || K == 0;
    if (!ok || !dsc_kq_supported(t)) return cudaErrorInvalidValue;
    cudaError_t e = cudaMalloc(&d->data, empty ? 1 : N * qrow);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d->scale, empty ? 1 : N * frow * sizeof(float));
    const size_t per_row = qrow + frow * sizeof(float);
    size_t rows = per_row ? KQ_STAGE_BYTES / per_row : N;
    if (rows < 1) rows = 1;
    if (rows > N) rows = N;
    uint8_t *stage = e == cudaSuccess && !empty ? (uint8_t *)malloc(rows * per_row) : NULL;
    if (e == cudaSuccess && !empty && !stage) e = cudaErrorMemoryAllocation;
    for (size_t r0 = 0; e == cudaSuccess && !empty && r0 < N; r0 += rows) {
        const size_t nr = N - r0 < rows ? N - r0 : rows;
        float *s = (float *)(stage + nr * qrow);        /* qrow is a multiple of 16 */
        for (size_t r = 0; r < nr; r++)
            kq_repack_row(t, (const uint8_t *)w->data + (r0 + r) * rb, (int64_t)K, stage + r * qrow,
                          s + r * frow);
        e = cudaMemcpy((uint8_t *)d->data + r0 * qrow, stage, nr * qrow, cudaMemcpyHostToDevice);
        if (e == cudaSuccess)
            e = cudaMemcpy(d->scale + r0 * frow, s, nr * frow * sizeof(float), cudaMemcpyHostToDevice);
    }
    free(stage);
    return e;
}

/* ==========================================================================
 * host twins of the device intrinsics
 * ==========================================================================
 * The per-lane pieces below (quantizer, lane integers, embed) are
 * __host__ __device__: tests/cuda/test_kq_lanes.cu runs these very functions
 * on the host (no GPU needed) against the CPU definition. The intrinsics
 * they use have exact host twins here (the host code is built without
 * contraction, so a * b is one rounding there too). */
#ifdef __CUDA_ARCH__
#define KQ_UNROLL _Pragma("unroll")
#else
#define KQ_UNROLL
#endif
template <typename V>
__host__ __device__ __forceinline__ V kq_ldg(const V *p) {
#ifdef __CUDA_ARCH__
    return __ldg(p);
#else
    return *p;
#endif
}
__host__ __device__ __forceinline__ int kq_dp4a(int a, int b, int c) {   /* signed bytes */
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int k = 0; k < 4; k++) c += (int)(int8_t)(a >> (8 * k)) * (int)(int8_t)(b >> (8 * k));
    return c;
#endif
}
__host__ __device__ __forceinline__ float kq_fmul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
__host__ __device__ __forceinline__ float kq_fdiv(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
__host__ __device__ __forceinline__ float kq_fadd(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
__host__ __device__ __forceinline__ uint32_t kq_vsub4(uint32_t a, uint32_t b) {   /* bytewise, wrapping */
#ifdef __CUDA_ARCH__
    return __vsub4(a, b);
#else
    uint32_t r = 0;
    for (int k = 0; k < 4; k++) r |= (uint32_t)(uint8_t)((a >> (8 * k)) - (b >> (8 * k))) << (8 * k);
    return r;
#endif
}

/* ==========================================================================
 * activation quantization: ds_quantize_row_q8_k, one warp per super-block
 * ==========================================================================
 * The C loop keeps the FIRST element of largest |x| (strict >, NaN never
 * wins): here each lane finds the first of its 8 consecutive elements, and
 * the butterfly keeps the larger magnitude, on a tie the lower index — the
 * same element. Then, per element, the loop's operations: v = iscale * x
 * (one rounding), NaN -> 0, clamp to [-127, 127], round to nearest even;
 * d = 1 / iscale. An all-zero (or all-NaN) block: q = 0, d = 0. */
#define KQ8_WARPS 4
/* the pieces of one warp's work, __host__ __device__ for test_kq_lanes.cu */
/* lane's candidate: the first of its 8 elements with the largest |x| > 0 */
__host__ __device__ __forceinline__ void kq8k_lane_max(const float xv[8], int lane, float &amax, int &idx) {
    amax = 0.0f;
    idx = 8 * lane;
    KQ_UNROLL
    for (int j = 0; j < 8; j++) {
        const float a = fabsf(xv[j]);
        if (a > amax) { amax = a; idx = 8 * lane + j; }
    }
}
/* two candidates -> the larger magnitude, on a tie the lower index (a total
 * order, so every butterfly order gives the scalar loop's element) */
__host__ __device__ __forceinline__ void kq8k_combine(float oa, int oi, float &amax, int &idx) {
    if (oa > amax || (oa == amax && oi < idx)) { amax = oa; idx = oi; }
}
/* q of one element: v = iscale * x rounded once, NaN -> 0, clamped, rounded to nearest even */
__host__ __device__ __forceinline__ uint32_t kq8k_q(float iscale, float x) {
    float v = kq_fmul(iscale, x);
    v = v != v ? 0.0f : v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
    return (uint32_t)((int)rintf(v) & 0xff);
}

__global__ void __launch_bounds__(32 * KQ8_WARPS)
kq8k_quantize(const float *__restrict__ x, int64_t nsb, int8_t *__restrict__ q, float *__restrict__ d) {
    const int lane = threadIdx.x & 31;
    const int64_t i = (int64_t)blockIdx.x * KQ8_WARPS + threadIdx.x / 32;
    if (i >= nsb) return;                         /* whole warps only: nsb is per warp */
    const float *xp = x + i * DS_QK_K + 8 * lane;     /* scalar loads: x may be unaligned */
    float xv[8];
#pragma unroll
    for (int j = 0; j < 8; j++) xv[j] = __ldg(xp + j);
    float amax;
    int idx;
    kq8k_lane_max(xv, lane, amax, idx);
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) {
        const float oa = __shfl_xor_sync(0xffffffffu, amax, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        kq8k_combine(oa, oi, amax, idx);
    }
    uint2 packed = make_uint2(0u, 0u);
    if (amax == 0.0f) {                           /* warp-uniform: every lane holds the result */
        if (lane == 0) d[i] = 0.0f;
    } else {
        const float iscale = kq_fdiv(-127.0f, x[i * DS_QK_K + idx]);
        uint32_t word[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 8; j++) word[j / 4] |= kq8k_q(iscale, xv[j]) << (8 * (j % 4));
        packed = make_uint2(word[0], word[1]);
        if (lane == 0) d[i] = kq_fdiv(1.0f, iscale);
    }
    *(uint2 *)(q + i * DS_QK_K + 8 * lane) = packed;
}

/* ==========================================================================
 * the lane integers of one super-block
 * ========================================================================== */
/* A lane's share of a weight super-block, loaded ahead of its use. */
struct kq_wlane {
    uint4    q;          /* Q4_K/Q5_K: 16 qs bytes; Q6_K: .x.y ql_a, .z.w ql_b */
    uint4    h;          /* Q5_K: 16 qh bytes;      Q6_K: .x.y qh              */
    uint32_t sw;         /* the lane's scale word                              */
    float    d, dm;      /* d, dmin (Q6_K: dm unused)                          */
};

template <int TYPE>
__host__ __device__ __forceinline__ void kq_load(const uint8_t *__restrict__ blk, const float *__restrict__ f,
                                        int s, kq_wlane &w) {
    if (TYPE == DS_TYPE_Q6_K) {
        const int h = s >> 2, c = s & 3;
        const uint2 a = kq_ldg((const uint2 *)(blk + 64 * h + 8 * c));
        const uint2 b = kq_ldg((const uint2 *)(blk + 64 * h + 32 + 8 * c));
        const uint2 qh = kq_ldg((const uint2 *)(blk + 128 + 32 * h + 8 * c));
        w.q = make_uint4(a.x, a.y, b.x, b.y);
        w.h = make_uint4(qh.x, qh.y, 0u, 0u);
        w.sw = kq_ldg((const uint32_t *)(blk + 192 + 8 * h + 4 * (c >> 1)));
        w.d = kq_ldg(f);
        w.dm = 0.0f;
    } else {
        const int g = s >> 1, hf = s & 1;
        w.q = kq_ldg((const uint4 *)(blk + 32 * g + 16 * hf));
        if (TYPE == DS_TYPE_Q5_K) {
            w.h = kq_ldg((const uint4 *)(blk + 128 + 16 * hf));
            w.sw = kq_ldg((const uint32_t *)(blk + 160 + 4 * g));
        } else {
            w.h = make_uint4(0u, 0u, 0u, 0u);
            w.sw = kq_ldg((const uint32_t *)(blk + 128 + 4 * g));
        }
        w.d = kq_ldg(f);
        w.dm = kq_ldg(f + 1);
    }
}

/* The lane's exact integers against one activation super-block p (256 int8):
 * I (sub-block scales applied, Q6_K's -32 folded in) and Mn (Q4_K/Q5_K). */
template <int TYPE>
__host__ __device__ __forceinline__ void kq_lane_ints(const kq_wlane &w, const int8_t *__restrict__ p, int s,
                                             int &I, int &Mn) {
    if (TYPE == DS_TYPE_Q6_K) {
        const int h = s >> 2, c = s & 3;
        const uint32_t qa[2] = {w.q.x, w.q.y}, qb[2] = {w.q.z, w.q.w}, qh[2] = {w.h.x, w.h.y};
        int dk[4] = {0, 0, 0, 0};
        KQ_UNROLL
        for (int k = 0; k < 4; k++) {
            const uint2 a = kq_ldg((const uint2 *)(p + 128 * h + 32 * k + 8 * c));
            const uint32_t aw[2] = {a.x, a.y};
            KQ_UNROLL
            for (int j = 0; j < 2; j++) {
                const uint32_t lo = k & 1 ? qb[j] : qa[j];          /* k = 0, 2: ql[l]; 1, 3: ql[l + 32] */
                const uint32_t nib = k < 2 ? lo & 0x0f0f0f0fu : (lo >> 4) & 0x0f0f0f0fu;
                const uint32_t u = nib | (((qh[j] >> (2 * k)) & 0x03030303u) << 4);   /* 6-bit q */
                dk[k] = kq_dp4a((int)kq_vsub4(u, 0x20202020u), (int)aw[j], dk[k]);      /* q - 32 */
            }
        }
        I = 0;
        KQ_UNROLL
        for (int k = 0; k < 4; k++) I += (int)(int8_t)(w.sw >> (8 * k)) * dk[k];
        Mn = 0;
    } else {
        const int g = s >> 1, hf = s & 1;
        const uint4 alo = kq_ldg((const uint4 *)(p + 64 * g + 16 * hf));
        const uint4 ahi = kq_ldg((const uint4 *)(p + 64 * g + 32 + 16 * hf));
        const uint32_t qw[4] = {w.q.x, w.q.y, w.q.z, w.q.w}, hw[4] = {w.h.x, w.h.y, w.h.z, w.h.w};
        const uint32_t al[4] = {alo.x, alo.y, alo.z, alo.w}, ah[4] = {ahi.x, ahi.y, ahi.z, ahi.w};
        int dl = 0, dh = 0, sl = 0, sh = 0;
        KQ_UNROLL
        for (int j = 0; j < 4; j++) {
            uint32_t lo = qw[j] & 0x0f0f0f0fu, hi = (qw[j] >> 4) & 0x0f0f0f0fu;
            if (TYPE == DS_TYPE_Q5_K) {                 /* bit 2g / 2g+1 of qh[l] is bit 4 */
                lo |= ((hw[j] >> (2 * g)) & 0x01010101u) << 4;
                hi |= ((hw[j] >> (2 * g + 1)) & 0x01010101u) << 4;
            }
            dl = kq_dp4a((int)lo, (int)al[j], dl);
            dh = kq_dp4a((int)hi, (int)ah[j], dh);
            sl = kq_dp4a(0x01010101, (int)al[j], sl);
            sh = kq_dp4a(0x01010101, (int)ah[j], sh);
        }
        const int sc0 = (int)(w.sw & 0xff), sc1 = (int)((w.sw >> 8) & 0xff);
        const int m0 = (int)((w.sw >> 16) & 0xff), m1 = (int)(w.sw >> 24);
        I = sc0 * dl + sc1 * dh;
        Mn = m0 * sl + m1 * sh;
    }
}

__device__ __forceinline__ float kq_store_value(float v) {
    return v != v ? __uint_as_float(KQ_QNAN_BITS) : v;
}

/* ==========================================================================
 * CANONICAL (= decode) and FAST: one kernel, two epilogues
 * ==========================================================================
 * Block: KQV_WARPS warps x 4 rows. Grid: x = groups of MT activation rows
 * (fastest, so the groups that share a weight tile run together and find it
 * in L2), y = groups of rows. Padding rows repeat row N - 1 and padding
 * activation rows repeat the last one; neither is stored. */
#define KQV_WARPS 4
#define KQV_ROWS (KQV_WARPS * 4)

template <int TYPE, int MT, bool FAST>
__global__ void __launch_bounds__(32 * KQV_WARPS)
kqv_kernel(const uint8_t *__restrict__ wq, const float *__restrict__ wf, int64_t N, int64_t nb,
           int M, const int8_t *__restrict__ xq, const float *__restrict__ xd, float *__restrict__ y) {
    const int BB = TYPE == DS_TYPE_Q4_K ? 144 : TYPE == DS_TYPE_Q5_K ? 176 : 208;
    const int NF = TYPE == DS_TYPE_Q6_K ? 1 : 2;
    const int lane = threadIdx.x & 31, s = lane & 7;
    const int64_t n_raw = ((int64_t)blockIdx.y * KQV_WARPS + threadIdx.x / 32) * 4 + (lane >> 3);
    const int64_t n = n_raw < N ? n_raw : N - 1;
    const int m0 = blockIdx.x * MT, mv = M - m0 < MT ? M - m0 : MT;
    const int64_t K = nb * DS_QK_K;
    const uint8_t *wrow = wq + n * nb * BB;
    const float *frow = wf + n * nb * NF;

    float acc[MT], accm[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i] = accm[i] = 0.0f;

    /* PD super-blocks of weights per step, the next PD loaded while these
     * are used: decode (MT = 1) has few warps per SM, so each keeps 4
     * super-blocks of loads in flight; larger MT have more work per load */
    const int PD = MT == 1 ? 4 : MT == 2 ? 2 : 1;
    kq_wlane nxt[PD];
#pragma unroll
    for (int j = 0; j < PD; j++)
        if (j < nb) kq_load<TYPE>(wrow + j * BB, frow + j * NF, s, nxt[j]);
    for (int64_t b0 = 0; b0 < nb; b0 += PD) {
        kq_wlane cur[PD];
#pragma unroll
        for (int j = 0; j < PD; j++) cur[j] = nxt[j];
#pragma unroll
        for (int j = 0; j < PD; j++)                          /* in flight during the work below */
            if (b0 + PD + j < nb) kq_load<TYPE>(wrow + (b0 + PD + j) * BB, frow + (b0 + PD + j) * NF, s, nxt[j]);
#pragma unroll
        for (int j = 0; j < PD; j++) {
            const int64_t b = b0 + j;
            if (b >= nb) break;                               /* warp-uniform */
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const int64_t mrow = m0 + (i < mv ? i : mv - 1);
                int I, Mn;
                kq_lane_ints<TYPE>(cur[j], xq + mrow * K + b * DS_QK_K, s, I, Mn);
                const float e = __ldg(xd + mrow * nb + b);
                if (!FAST) {
                    /* the exact integers of the row: sum over the group's 8 lanes */
#pragma unroll
                    for (int o = 4; o >= 1; o /= 2) {
                        I += __shfl_xor_sync(0xffffffffu, I, o);
                        if (TYPE != DS_TYPE_Q6_K) Mn += __shfl_xor_sync(0xffffffffu, Mn, o);
                    }
                    /* the CPU epilogue, in super-block order */
                    acc[i] = __fmaf_rn(__int2float_rn(I), __fmul_rn(cur[j].d, e), acc[i]);
                    if (TYPE != DS_TYPE_Q6_K)
                        acc[i] = __fmaf_rn(-__int2float_rn(Mn), __fmul_rn(cur[j].dm, e), acc[i]);
                } else {
                    /* llama.cpp's rounding: per-lane sums of rounded products */
                    acc[i] = __fadd_rn(acc[i], __fmul_rn(__fmul_rn(cur[j].d, e), __int2float_rn(I)));
                    if (TYPE != DS_TYPE_Q6_K)
                        accm[i] = __fadd_rn(accm[i], __fmul_rn(__fmul_rn(cur[j].dm, e), __int2float_rn(Mn)));
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MT; i++) {
        float v = acc[i];
        if (FAST) {
            v = __fsub_rn(v, accm[i]);
#pragma unroll
            for (int o = 4; o >= 1; o /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
        }
        if (s == 0 && n_raw < N && i < mv) y[(int64_t)(m0 + i) * N + n] = kq_store_value(v);
    }
}

template <int TYPE, int MT, bool FAST>
static void kqv_launch(ds_exec *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd,
                       float *y) {
    const int64_t nb = w->n_in / DS_QK_K;
    if ((w->n_out + KQV_ROWS - 1) / KQV_ROWS > 65535) {      /* grid.y's limit: 1M rows */
        dsc_note(ex, cudaErrorInvalidConfiguration, "matmul_kq: more than 1048560 output rows");
        return;
    }
    const dim3 grid((unsigned)((M + MT - 1) / MT), dsc_blocks(w->n_out, KQV_ROWS));
    kqv_kernel<TYPE, MT, FAST><<<grid, 32 * KQV_WARPS, 0, ex->st>>>((const uint8_t *)w->data, w->scale,
                                                                  w->n_out, nb, M, xq, xd, y);
    DSC_LAUNCHED(ex, FAST ? "matmul_kq fast" : "matmul_kq canonical");
}

template <int TYPE, bool FAST>
static void kqv_dispatch(ds_exec *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd,
                         float *y) {
    if (M <= 1) kqv_launch<TYPE, 1, FAST>(ex, w, M, xq, xd, y);
    else if (M <= 2) kqv_launch<TYPE, 2, FAST>(ex, w, M, xq, xd, y);
    else if (M <= 4) kqv_launch<TYPE, 4, FAST>(ex, w, M, xq, xd, y);
    else kqv_launch<TYPE, 8, FAST>(ex, w, M, xq, xd, y);
}

/* NaN -> 0x7fc00000 over y (Q4_0 / Q5_0 through the Q8_0 kernels) */
__global__ void kq_nan_canon(int64_t n, float *y) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = kq_store_value(y[i]);
}

/* ==========================================================================
 * CANONICAL on the tensor cores: batches past 8 rows
 * ==========================================================================
 * The same definition as kqv_kernel, super-block by super-block in order,
 * with the integers from mma.sync s8 x s8 -> s32:
 *   Q4_K / Q5_K  one m16n8k32 per 32-element sub-block j gives D_j =
 *                sum q p exactly (the 4/5-bit quants, unsigned, fit s8);
 *                I = sum_j sc_j D_j (integer multiply-adds); the min term
 *                Mn = sum_j m_j S_j is one more m16n8k32 per sub-block whose
 *                A operand is m_j in every k (so it sums m_j p over the
 *                sub-block), accumulated by the mma itself;
 *   Q6_K         one m16n8k16 per 16-element group, quants q - 32 (s8);
 *                I = sum_g sc_g D_g.
 * Then the CPU's epilogue per super-block, acc = fma((float)I, d * e, acc)
 * (and fma(-(float)Mn, dmin * e, acc)), one chain per output in super-block
 * order, a NaN stored as 0x7fc00000. Integers are exact in any order (the
 * k order inside a sub-block is permuted alike for both operands, lane t
 * taking bytes 8t..8t+7, as in matmul_q8_0_mma.cu's GEMV), so the bits are
 * kqv_kernel's and the CPU's for every M.
 *
 * A block computes 128 weight rows x 16 WM activation rows (warps 4 x WM,
 * warp tiles 32 x 16); one super-block per pipeline stage, three stages of
 * cp.async deep: the weight rows as the device layout stores them (quants,
 * packed scales) in rows padded so the fragment loads fall in distinct
 * banks, the Q8_K activation rows, the f32 d / dmin and e. */
#define KQM_STAGES 3
#define KQM_MI 2
#define KQM_NJ 2

template <int TYPE>
struct kqm_t {
    static constexpr int BB = TYPE == DS_TYPE_Q4_K ? 144 : TYPE == DS_TYPE_Q5_K ? 176 : 208;
    static constexpr int NF = TYPE == DS_TYPE_Q6_K ? 1 : 2;
    /* pitches: 8-byte fragment loads (Q4_K/Q5_K) want rows 8 words apart
     * modulo 32 banks (an odd multiple of 32 bytes), Q6_K's 4-byte ones a
     * pitch of 20 words (its 208 bytes) */
    static constexpr int LDA = TYPE == DS_TYPE_Q4_K ? 160 : TYPE == DS_TYPE_Q5_K ? 224 : 208;
    static constexpr int LDB = TYPE == DS_TYPE_Q6_K ? 272 : 288;
};

template <int TYPE, int WM>
struct kqm_cfg {
    static constexpr int NT = 32 * 4 * WM;
    static constexpr int BN = 16 * KQM_MI * 4, BM = 8 * KQM_NJ * WM;
    static constexpr int A_BYTES = BN * kqm_t<TYPE>::LDA, B_BYTES = BM * kqm_t<TYPE>::LDB;
    static constexpr int WS_BYTES = BN * kqm_t<TYPE>::NF * 4, XS_BYTES = BM * 4;
    static constexpr int STAGE = (A_BYTES + B_BYTES + WS_BYTES + XS_BYTES + 15) / 16 * 16;
    static constexpr int SMEM = KQM_STAGES * STAGE;
};

__device__ __forceinline__ uint32_t kqm_rep(uint32_t byte) { return byte * 0x01010101u; }

template <int TYPE, int WM>
__global__ void __launch_bounds__(32 * 4 * WM)
kqm_kernel(const uint8_t *__restrict__ wq, const float *__restrict__ wf, int64_t N, int64_t nb, int M,
           const int8_t *__restrict__ xq, const float *__restrict__ xd, float *__restrict__ y) {
    using C = kqm_cfg<TYPE, WM>;
    using P = kqm_t<TYPE>;
    extern __shared__ __align__(16) unsigned char kqm_smem[];
    const int64_t n0 = (int64_t)blockIdx.y * C::BN, K = nb * DS_QK_K;
    const int m0 = blockIdx.x * C::BM;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    const int wn = warp % 4, wm = warp / 4, g = lane >> 2, t = lane & 3;

    auto load_stage = [&](int s, int64_t b) {
        unsigned char *st = kqm_smem + s * C::STAGE;
        for (int c = tid; c < C::BN * (P::BB / 16); c += C::NT) {
            const int row = c / (P::BB / 16), piece = c % (P::BB / 16);
            const int64_t n = n0 + row < N ? n0 + row : N - 1;
            qm_cp16(st + row * P::LDA + piece * 16, wq + (n * nb + b) * P::BB + piece * 16, 16);
        }
        for (int c = tid; c < C::BM * 16; c += C::NT) {
            const int row = c / 16, piece = c % 16;
            const int64_t m = m0 + row < M ? m0 + row : M - 1;
            qm_cp16(st + C::A_BYTES + row * P::LDB + piece * 16, xq + m * K + b * DS_QK_K + piece * 16, 16);
        }
        float *Ws = (float *)(st + C::A_BYTES + C::B_BYTES), *Xs = Ws + C::BN * P::NF;
        for (int e = tid; e < C::BN * P::NF; e += C::NT) {
            const int row = e / P::NF, f = e % P::NF;
            const int64_t n = n0 + row < N ? n0 + row : N - 1;
            qm_cp4(Ws + e, wf + (n * nb + b) * P::NF + f, 4);
        }
        for (int e = tid; e < C::BM; e += C::NT) {
            const int64_t m = m0 + e < M ? m0 + e : M - 1;
            qm_cp4(Xs + e, xd + m * nb + b, 4);
        }
    };

    float acc[KQM_MI][KQM_NJ][4];
#pragma unroll
    for (int i = 0; i < KQM_MI; i++)
#pragma unroll
        for (int j = 0; j < KQM_NJ; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;
    dsc_pdl_wait();
    dsc_pdl_trigger();
#pragma unroll
    for (int s = 0; s < KQM_STAGES - 1; s++) {
        if (s < nb) load_stage(s, s);
        qm_commit();
    }
    const int wrow = wn * 16 * KQM_MI + g, xrow = wm * 8 * KQM_NJ + g, xcol = wm * 8 * KQM_NJ + 2 * t;
    for (int64_t b = 0; b < nb; b++) {
        qm_wait<KQM_STAGES - 2>();
        __syncthreads();
        if (b + KQM_STAGES - 1 < nb) load_stage((int)((b + KQM_STAGES - 1) % KQM_STAGES), b + KQM_STAGES - 1);
        qm_commit();
        const unsigned char *st = kqm_smem + (int)(b % KQM_STAGES) * C::STAGE;
        const unsigned char *Bs = st + C::A_BYTES;
        const float *Ws = (const float *)(st + C::A_BYTES + C::B_BYTES), *Xs = Ws + C::BN * P::NF;
        int32_t I[KQM_MI][KQM_NJ][4], Mn[KQM_MI][KQM_NJ][4];
#pragma unroll
        for (int i = 0; i < KQM_MI; i++)
#pragma unroll
            for (int j = 0; j < KQM_NJ; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) I[i][j][q] = Mn[i][j][q] = 0;
        if (TYPE == DS_TYPE_Q6_K) {
#pragma unroll 2
            for (int G = 0; G < 16; G++) {           /* 16-element groups */
                const int h = G >> 3, k = (G & 7) >> 1, hf = G & 1;
                uint32_t a[KQM_MI][2];
                int sc[KQM_MI][2];
#pragma unroll
                for (int i = 0; i < KQM_MI; i++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const unsigned char *ra = st + (wrow + 16 * i + 8 * r) * P::LDA;
                        const uint32_t ql = *(const uint32_t *)(ra + 64 * h + 32 * (k & 1) + 16 * hf + 4 * t);
                        const uint32_t qh = *(const uint32_t *)(ra + 128 + 32 * h + 16 * hf + 4 * t);
                        const uint32_t u = ((k < 2 ? ql : ql >> 4) & 0x0f0f0f0fu) | (((qh >> (2 * k)) & 0x03030303u) << 4);
                        a[i][r] = __vsub4(u, 0x20202020u);                      /* q - 32 */
                        sc[i][r] = (int)(int8_t)ra[192 + 8 * h + 4 * hf + k];
                    }
                uint32_t bv[KQM_NJ];
#pragma unroll
                for (int j = 0; j < KQM_NJ; j++)
                    bv[j] = *(const uint32_t *)(Bs + (xrow + 8 * j) * P::LDB + 16 * G + 4 * t);
                const int32_t zero[4] = {0, 0, 0, 0};
#pragma unroll
                for (int i = 0; i < KQM_MI; i++)
#pragma unroll
                    for (int j = 0; j < KQM_NJ; j++) {
                        int32_t d[4];
                        qm_mma16(d, a[i][0], a[i][1], bv[j], zero);
#pragma unroll
                        for (int q = 0; q < 4; q++) I[i][j][q] += sc[i][q >> 1] * d[q];
                    }
            }
        } else {
#pragma unroll 1
            for (int gp = 0; gp < 4; gp++) {         /* sub-blocks 2gp (low nibbles) and 2gp + 1 (high) */
                uint32_t lo[KQM_MI][4], hi[KQM_MI][4], sw[KQM_MI][2];
#pragma unroll
                for (int i = 0; i < KQM_MI; i++) {
                    uint2 q[2], hb[2];
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const unsigned char *ra = st + (wrow + 16 * i + 8 * r) * P::LDA;
                        q[r] = *(const uint2 *)(ra + 32 * gp + 8 * t);
                        hb[r] = TYPE == DS_TYPE_Q5_K ? *(const uint2 *)(ra + 128 + 8 * t) : make_uint2(0u, 0u);
                        sw[i][r] = *(const uint32_t *)(ra + P::BB - 16 + 4 * gp);   /* sc_2gp, sc_2gp+1, m_2gp, m_2gp+1 */
                    }
                    /* A fragments: {row g k 0-3, row g+8 k 0-3, row g k 4-7, row g+8 k 4-7} of the lane's 8 bytes */
                    const uint32_t w[4] = {q[0].x, q[1].x, q[0].y, q[1].y}, hw[4] = {hb[0].x, hb[1].x, hb[0].y, hb[1].y};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        lo[i][e] = w[e] & 0x0f0f0f0fu;
                        hi[i][e] = (w[e] >> 4) & 0x0f0f0f0fu;
                        if (TYPE == DS_TYPE_Q5_K) {
                            lo[i][e] |= ((hw[e] >> (2 * gp)) & 0x01010101u) << 4;
                            hi[i][e] |= ((hw[e] >> (2 * gp + 1)) & 0x01010101u) << 4;
                        }
                    }
                }
                uint2 bl[KQM_NJ], bh[KQM_NJ];
#pragma unroll
                for (int j = 0; j < KQM_NJ; j++) {
                    const unsigned char *rb = Bs + (xrow + 8 * j) * P::LDB + 64 * gp + 8 * t;
                    bl[j] = *(const uint2 *)rb;
                    bh[j] = *(const uint2 *)(rb + 32);
                }
#pragma unroll
                for (int i = 0; i < KQM_MI; i++) {
                    /* m_j in every k of rows g and g + 8 */
                    const uint32_t mlo[4] = {kqm_rep((sw[i][0] >> 16) & 0xff), kqm_rep((sw[i][1] >> 16) & 0xff),
                                             kqm_rep((sw[i][0] >> 16) & 0xff), kqm_rep((sw[i][1] >> 16) & 0xff)};
                    const uint32_t mhi[4] = {kqm_rep(sw[i][0] >> 24), kqm_rep(sw[i][1] >> 24), kqm_rep(sw[i][0] >> 24),
                                             kqm_rep(sw[i][1] >> 24)};
                    const int sc0[2] = {(int)(sw[i][0] & 0xff), (int)(sw[i][1] & 0xff)};
                    const int sc1[2] = {(int)((sw[i][0] >> 8) & 0xff), (int)((sw[i][1] >> 8) & 0xff)};
#pragma unroll
                    for (int j = 0; j < KQM_NJ; j++) {
                        int32_t dl[4], dh[4];
                        qm_mma(dl, lo[i], bl[j].x, bl[j].y, 0);
                        qm_mma(dh, hi[i], bh[j].x, bh[j].y, 0);
#pragma unroll
                        for (int q = 0; q < 4; q++) I[i][j][q] += sc0[q >> 1] * dl[q] + sc1[q >> 1] * dh[q];
                        qm_mma_acc(Mn[i][j], mlo, bl[j].x, bl[j].y, Mn[i][j]);
                        qm_mma_acc(Mn[i][j], mhi, bh[j].x, bh[j].y, Mn[i][j]);
                    }
                }
            }
        }
        /* the CPU's epilogue of this super-block */
#pragma unroll
        for (int i = 0; i < KQM_MI; i++)
#pragma unroll
            for (int j = 0; j < KQM_NJ; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int r = wrow + 16 * i + 8 * (q >> 1);
                    const float e = Xs[xcol + 8 * j + (q & 1)];
                    acc[i][j][q] = __fmaf_rn(__int2float_rn(I[i][j][q]), __fmul_rn(Ws[r * P::NF], e), acc[i][j][q]);
                    if (TYPE != DS_TYPE_Q6_K)
                        acc[i][j][q] = __fmaf_rn(-__int2float_rn(Mn[i][j][q]), __fmul_rn(Ws[r * P::NF + 1], e), acc[i][j][q]);
                }
    }
    qm_wait<0>();
#pragma unroll
    for (int i = 0; i < KQM_MI; i++)
#pragma unroll
        for (int j = 0; j < KQM_NJ; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int64_t n = n0 + wrow + 16 * i + 8 * (q >> 1);
                const int m = m0 + xcol + 8 * j + (q & 1);
                if (n < N && m < M) y[(int64_t)m * N + n] = kq_store_value(acc[i][j][q]);
            }
}

/* the tile height for M rows (0: the GEMV), by matmul_q8_0_mma.cu's rule:
 * M > 8, the tensor cores not switched off, a grid over half the SMs;
 * DSPARK_CUDA_MMA=16 forces 16, another forced height 32 */
static int kqm_bm(ds_exec *ex, const dsc_weight *w, int M) {
    const dsc_backend *b = dsc_be(ex);
    if (M <= 8 || (b->off & DSC_OFF_MMA)) return 0;
    if (b->mma_bm) return b->mma_bm == 16 ? 16 : 32;
    const int64_t tiles = (w->n_out + 127) / 128, full = (b->n_sm + 1) / 2;
    if (M >= 24 && tiles * ((M + 31) / 32) >= full) return 32;
    if (tiles * ((M + 15) / 16) >= full) return 16;
    return 0;
}

template <int TYPE, int WM>
static void kqm_launch(ds_exec *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd, float *y) {
    using C = kqm_cfg<TYPE, WM>;
    const dim3 grid((unsigned)((M + C::BM - 1) / C::BM), dsc_blocks(w->n_out, C::BN));
    dsc_launch(ex, "matmul_kq canonical (tensor cores)", kqm_kernel<TYPE, WM>, grid, dim3(C::NT), (size_t)C::SMEM,
               (const uint8_t *)w->data, (const float *)w->scale, w->n_out, w->n_in / DS_QK_K, M, xq, xd, y);
}

template <int TYPE>
static cudaError_t kqm_init_type(void) {
    cudaError_t e = cudaFuncSetAttribute(kqm_kernel<TYPE, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, kqm_cfg<TYPE, 1>::SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(kqm_kernel<TYPE, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, kqm_cfg<TYPE, 2>::SMEM);
    return e;
}
cudaError_t dsc_kq_mma_init(void) {
    cudaError_t e = kqm_init_type<DS_TYPE_Q4_K>();
    if (e == cudaSuccess) e = kqm_init_type<DS_TYPE_Q5_K>();
    if (e == cudaSuccess) e = kqm_init_type<DS_TYPE_Q6_K>();
    return e;
}

template <int TYPE>
static bool kqm_run(ds_exec *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd, float *y) {
    const int bm = kqm_bm(ex, w, M);
    if (!bm) return false;
    if (bm == 16) kqm_launch<TYPE, 1>(ex, w, M, xq, xd, y);
    else kqm_launch<TYPE, 2>(ex, w, M, xq, xd, y);
    return true;
}

/* ==========================================================================
 * entry points
 * ========================================================================== */
void dsc_matmul_kq(ds_exec *ex, ds_variant v, const dsc_weight *w, int M, const float *x, float *y) {
    if (M <= 0 || w->n_out <= 0) return;
    const int64_t K = w->n_in, N = w->n_out;
    if (K <= 0) {                                 /* empty sums: +0, as on the CPU */
        dsc_note(ex, cudaMemsetAsync(y, 0, (size_t)M * (size_t)N * sizeof(float), ex->st), "matmul_kq K=0");
        return;
    }
    if (!kq_is_ktype(w->type)) {                  /* Q4_0 / Q5_0 in the Q8_0 layout */
        dsc_matmul_q8_0(ex, v, w, M, x, y);
        const int64_t ny = (int64_t)M * N;
        kq_nan_canon<<<dsc_blocks(ny, 256), 256, 0, ex->st>>>(ny, y);
        DSC_LAUNCHED(ex, "matmul_kq NaN rule");
        return;
    }
    /* both variants multiply the Q8_K activations: quantize them once */
    const int64_t nsb = (int64_t)M * (K / DS_QK_K);
    const size_t qbytes = ((size_t)M * (size_t)K + 255) & ~(size_t)255;
    char *mem = (char *)dsc_scratch(ex, DSC_SLOT_Q8_ACT, qbytes + (size_t)nsb * sizeof(float));
    if (!mem) return;
    int8_t *xq = (int8_t *)mem;
    float *xd = (float *)(mem + qbytes);
    kq8k_quantize<<<dsc_blocks(nsb, KQ8_WARPS), 32 * KQ8_WARPS, 0, ex->st>>>(x, nsb, xq, xd);
    DSC_LAUNCHED(ex, "q8_k quantize");
    const bool fast = v == DS_FAST;
    switch (w->type) {
    case DS_TYPE_Q4_K:
        if (fast) kqv_dispatch<DS_TYPE_Q4_K, true>(ex, w, M, xq, xd, y);
        else if (!kqm_run<DS_TYPE_Q4_K>(ex, w, M, xq, xd, y)) kqv_dispatch<DS_TYPE_Q4_K, false>(ex, w, M, xq, xd, y);
        break;
    case DS_TYPE_Q5_K:
        if (fast) kqv_dispatch<DS_TYPE_Q5_K, true>(ex, w, M, xq, xd, y);
        else if (!kqm_run<DS_TYPE_Q5_K>(ex, w, M, xq, xd, y)) kqv_dispatch<DS_TYPE_Q5_K, false>(ex, w, M, xq, xd, y);
        break;
    default:
        if (fast) kqv_dispatch<DS_TYPE_Q6_K, true>(ex, w, M, xq, xd, y);
        else if (!kqm_run<DS_TYPE_Q6_K>(ex, w, M, xq, xd, y)) kqv_dispatch<DS_TYPE_Q6_K, false>(ex, w, M, xq, xd, y);
        break;
    }
}

/* ==========================================================================
 * embedding rows: ds_row_to_f32's dequantization (kquant.c), the same
 * products in the same order, from the device layout
 * ========================================================================== */
/* element k of row id (host-callable: tests/cuda/test_kq_lanes.cu) */
__host__ __device__ __forceinline__ float kq_embed_value(uint32_t type, const uint8_t *__restrict__ data,
                                                         const float *__restrict__ scale, int64_t n_in,
                                                         int64_t id, int64_t k) {
    float v;
    if (type == DS_TYPE_Q4_0 || type == DS_TYPE_Q5_0) {
        /* Q4_0: (float)(q - 8) * d; Q5_0: (float)(q - 16) * d + 0.0f (-0 -> +0) */
        const float d = scale[id * (n_in / 32) + k / 32];
        v = kq_fmul((float)((const int8_t *)data)[id * n_in + k], d);
        if (type == DS_TYPE_Q5_0) v = kq_fadd(v, 0.0f);
    } else {
        const int64_t nb = n_in / DS_QK_K, b = k / DS_QK_K;
        const int e = (int)(k % DS_QK_K);
        const int BB = type == DS_TYPE_Q4_K ? 144 : type == DS_TYPE_Q5_K ? 176 : 208;
        const uint8_t *blk = data + (id * nb + b) * BB;
        if (type == DS_TYPE_Q6_K) {
            /* (d * sc) * (q - 32), element 128h + 32kk + l */
            const int h = e / 128, kk = (e % 128) / 32, l = e % 32;
            const uint8_t ql = blk[64 * h + l + 32 * (kk & 1)];
            const int nib = kk < 2 ? ql & 15 : ql >> 4;
            const int q = nib | (((blk[128 + 32 * h + l] >> (2 * kk)) & 3) << 4);
            const int sc = (int8_t)blk[192 + 8 * h + 4 * (l / 16) + kk];
            const float d = scale[id * nb + b];
            v = kq_fmul(kq_fmul(d, (float)sc), (float)(q - 32));
        } else {
            /* (d * sc) * q - dmin * m, element 64g + 32hi + l of sub-block 2g + hi */
            const int g = e / 64, hi = (e % 64) / 32, l = e % 32;
            int q = (blk[32 * g + l] >> (4 * hi)) & 15;
            const uint8_t *sw = blk + (type == DS_TYPE_Q5_K ? 160 : 128) + 4 * g;
            if (type == DS_TYPE_Q5_K) q += ((blk[128 + l] >> (2 * g + hi)) & 1) << 4;
            const float d = scale[2 * (id * nb + b)], dmin = scale[2 * (id * nb + b) + 1];
            const float d1 = kq_fmul(d, (float)sw[hi]), m1 = kq_fmul(dmin, (float)sw[2 + hi]);
            v = kq_fadd(kq_fmul(d1, (float)q), -m1);      /* a - b == a + (-b), exactly */
        }
    }
    return v;
}

__global__ void kq_embed_rows(uint32_t type, const uint8_t *__restrict__ data, const float *__restrict__ scale,
                              int64_t n_in, int64_t n_out, const int32_t *__restrict__ ids, int M, float *out) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)M * n_in) return;
    const int m = (int)(t / n_in);
    const int64_t k = t % n_in;
    const int64_t id = ids[m];
    /* the engine validates ids; never read outside */
    out[t] = id < 0 || id >= n_out ? __uint_as_float(KQ_QNAN_BITS) : kq_embed_value(type, data, scale, n_in, id, k);
}

void dsc_embed_kq(ds_exec *ex, const dsc_weight *w, int M, const int32_t *ids, float *out) {
    if (M <= 0 || w->n_in <= 0) return;
    const int64_t total = (int64_t)M * w->n_in;
    kq_embed_rows<<<dsc_blocks(total, 256), 256, 0, ex->st>>>(w->type, (const uint8_t *)w->data, w->scale,
                                                             w->n_in, w->n_out, ids, M, out);
    DSC_LAUNCHED(ex, "embed kq");
}
