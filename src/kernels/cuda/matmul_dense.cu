/* matmul_dense.cu — MATMUL_F32 / MATMUL_F16 / MATMUL_BF16 families on the GPU:
 * y[m][n] = sum_k W[n][k] * x[m][k], weights as stored in the file.
 *
 *   decode     dsc_matmul(DS_CANONICAL, W, 1, ...): the canonical kernel
 *              below at M = 1 (one row group of one row).
 *   canonical  the CPU's definition (kernels/cpu/matmul_internal.h), lane for
 *              lane: for every (m, n) 16 lane accumulators (lane = k mod 16)
 *              starting at +0, acc[l] = fma(w[k+l], x[k+l], acc[l]) for every
 *              16-element step in k order (w converted to f32 exactly), the
 *              K % 16 tail as one more step with +0 operands in the missing
 *              lanes, then the tree (l, l+8) -> (l, l+4) -> (l, l+2) -> (l, l+1).
 *              Two kernels run it. mmd_staged (rows of whole 16-byte pieces,
 *              i.e. almost every model): one thread per lane chain, the
 *              block's weight rows and activation segments streamed through
 *              shared memory by asynchronous copies, four stages deep.
 *              mmd_canonical (the rest): a thread owns LPT consecutive lanes
 *              of one output, 16/LPT neighbouring threads own the 16 lanes.
 *              Both end in the same tree through warp shuffles, and both load
 *              each weight row once for MT activation rows (a multi-row
 *              matrix-vector product); more rows are further row groups
 *              (grid.x) of the same kernel, which read the same weights right
 *              after their neighbours, from L2.
 *   fast       cuBLAS: cublasGemmEx with the activations converted to the
 *              weight type (F16 / BF16; F32 stays F32) and f32 accumulation.
 *
 * ==== Why canonical is the CPU's bits ===================================================
 * Each (m, n) runs exactly the CPU's sequence of IEEE operations: the same
 * 16 lane chains of fused multiply-adds in the same k order, the same tail,
 * the same combine tree. What is parallel on the GPU (the outputs, the 16
 * lanes, the rows of a group) is independent in that definition. Nothing
 * depends on M, the row group, the block or the stream. F16 -> f32 is exact
 * (common.h's integer formula in mmd_canonical, the hardware conversion in
 * mmd_staged: the same value for every non-NaN half), BF16 is a shift.
 *
 * ==== Why fast differs ===================================================================
 * cuBLAS picks its own tiling, split-K and reduction order by shape, and the
 * F16 / BF16 path rounds the activations to the weight type before the
 * products: close to canonical (within the usual 1e-3), not its bits. */
#include "kernels/cuda/cuda_internal.cuh"

#include <cuda_fp16.h>
#include <cuda_bf16.h>

/* ==========================================================================
 * CANONICAL (= decode)
 * ========================================================================== */
#define MMD_THREADS 64
#define MMD_U 4                                  /* 16-element steps loaded ahead  */
#define MMD_SEG 2048                             /* bytes of a row prefetched at once */

template <int TYPE> struct mmd_traits;           /* TYPE: ds_type                     */
template <> struct mmd_traits<DS_TYPE_F32>  { enum { ES = 4, LPT = 4 }; };
/* F16 / BF16: one lane chain per thread (16 threads per output). This
 * register kernel only runs rows that are not whole 16-byte pieces (the
 * staged kernel below takes the rest). */
template <> struct mmd_traits<DS_TYPE_F16>  { enum { ES = 2, LPT = 1 }; };
template <> struct mmd_traits<DS_TYPE_BF16> { enum { ES = 2, LPT = 1 }; };

/* LPT weights of a row starting at element k, as f32 (exact). VEC: the row
 * is 16-byte aligned and the LPT elements are in range; else element-wise
 * with +0 past K (the tail step). */
template <int TYPE, bool VEC>
__device__ __forceinline__ void mmd_load_w(const char *row, int64_t k, int64_t K, float *w) {
    constexpr int LPT = mmd_traits<TYPE>::LPT;
    if (VEC) {
        const uint4 v = __ldg((const uint4 *)(row + k * mmd_traits<TYPE>::ES));
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
        if (TYPE == DS_TYPE_F32) {
#pragma unroll
            for (int l = 0; l < 4; l++) w[l] = __uint_as_float(u[l]);
        } else {
#pragma unroll
            for (int l = 0; l < 4; l++) {
                const uint32_t lo = u[l] & 0xffffu, hi = u[l] >> 16;
                w[2 * l]     = TYPE == DS_TYPE_F16 ? dsc_fp16_to_f32(lo) : dsc_bf16_to_f32(lo);
                w[2 * l + 1] = TYPE == DS_TYPE_F16 ? dsc_fp16_to_f32(hi) : dsc_bf16_to_f32(hi);
            }
        }
    } else {
#pragma unroll
        for (int l = 0; l < LPT; l++) {
            if (k + l >= K) { w[l] = 0.0f; continue; }
            if (TYPE == DS_TYPE_F32) w[l] = __ldg((const float *)row + k + l);
            else {
                const uint32_t h = __ldg((const unsigned short *)row + k + l);
                w[l] = TYPE == DS_TYPE_F16 ? dsc_fp16_to_f32(h) : dsc_bf16_to_f32(h);
            }
        }
    }
}
template <int LPT, bool VEC>
__device__ __forceinline__ void mmd_load_x(const float *xr, int64_t k, int64_t K, float *xv) {
    if (VEC) {
#pragma unroll
        for (int l = 0; l < LPT; l += 4) {
            const float4 v = __ldg((const float4 *)(xr + k + l));
            xv[l] = v.x; xv[l + 1] = v.y; xv[l + 2] = v.z; xv[l + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int l = 0; l < LPT; l++) xv[l] = k + l < K ? __ldg(xr + k + l) : 0.0f;
    }
}

/* The 16-lane tree over the TPN threads that own one output: lanes are
 * g * LPT + j; step s adds lane l + s into lane l for l < s. The sum ends in
 * thread g = 0, lane 0. */
template <int LPT>
__device__ __forceinline__ float mmd_tree(float *a, int g) {
    constexpr int TPN = 16 / LPT;
#pragma unroll
    for (int s = 8; s >= 1; s /= 2) {
        if (s >= LPT) {
            const int d = s / LPT;
#pragma unroll
            for (int j = 0; j < LPT; j++) {
                const float o = __shfl_down_sync(0xffffffffu, a[j], d, TPN);
                if (g < d) a[j] = __fadd_rn(a[j], o);
            }
        } else {
#pragma unroll
            for (int j = 0; j < s; j++) a[j] = __fadd_rn(a[j], a[j + s]);
        }
    }
    return a[0];
}

/* The LPT weights of one 16-byte word as f32 (exact). */
template <int TYPE>
__device__ __forceinline__ void mmd_cvt_w(const uint4 v, float *w) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
    if (TYPE == DS_TYPE_F32) {
#pragma unroll
        for (int l = 0; l < 4; l++) w[l] = __uint_as_float(u[l]);
    } else {
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint32_t lo = u[l] & 0xffffu, hi = u[l] >> 16;
            w[2 * l]     = TYPE == DS_TYPE_F16 ? dsc_fp16_to_f32(lo) : dsc_bf16_to_f32(lo);
            w[2 * l + 1] = TYPE == DS_TYPE_F16 ? dsc_fp16_to_f32(hi) : dsc_bf16_to_f32(hi);
        }
    }
}

/* One block: NPB outputs x the MT rows of row group blockIdx.x (the fastest
 * index, so that the groups of a large M read one weight tile back to back,
 * the later ones from L2). Few threads per block and U 16-byte weight words
 * in flight per thread: a row's 16 lane chains are sequential over K, so the
 * only parallelism is across outputs, and each thread must keep many bytes
 * in flight for the grid to cover the memory latency. The words stay raw in
 * registers until their step (4 registers each), then convert. */
template <int TYPE, int MT, bool VEC>
__global__ void __launch_bounds__(MMD_THREADS)
mmd_canonical(const char *__restrict__ W, int64_t N, int64_t K, int M,
              const float *__restrict__ x, float *__restrict__ y) {
    constexpr int LPT = mmd_traits<TYPE>::LPT, TPN = 16 / LPT, NPB = MMD_THREADS / TPN;
    constexpr int ES = mmd_traits<TYPE>::ES;
    constexpr int U = VEC ? (MT == 1 ? 16 : 8) : (LPT == 1 ? 16 : MMD_U);   /* 16-element steps per batch */
    const int g = threadIdx.x % TPN;
    const int64_t n_raw = (int64_t)blockIdx.y * NPB + threadIdx.x / TPN;
    const int64_t n = n_raw < N ? n_raw : N - 1;          /* padding threads repeat a row */
    const int m0 = blockIdx.x * MT, mv = M - m0 < MT ? M - m0 : MT;
    const char *row = W + n * K * ES;
    const float *xr[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) xr[i] = x + (int64_t)(m0 + (i < mv ? i : mv - 1)) * K;

    float acc[MT][LPT];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < LPT; j++) acc[i][j] = 0.0f;

    const int64_t Kf = K & ~(int64_t)15;
    const int64_t lane0 = (int64_t)g * LPT;
    const int64_t rbytes = (Kf * ES) & ~(int64_t)15;
    if (VEC && g == 0) dsc_prefetch_l2(row, (uint32_t)min((int64_t)2 * MMD_SEG, rbytes));
    for (int64_t k0 = 0; k0 < Kf; k0 += 16 * U) {
        /* L2 prefetch hints, two segments ahead of the loads */
        static_assert(MMD_SEG % (16 * U * ES) == 0, "a batch never straddles a prefetch segment");
        if (VEC && g == 0 && (k0 * ES) % MMD_SEG == 0) {
            const int64_t off = k0 * ES + 2 * MMD_SEG;
            if (off < rbytes) dsc_prefetch_l2(row + off, (uint32_t)min((int64_t)MMD_SEG, rbytes - off));
        }
        if (VEC) {
            uint4 raw[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (k0 + 16 * u < Kf) raw[u] = __ldg((const uint4 *)(row + (k0 + 16 * u + lane0) * ES));
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (k0 + 16 * u >= Kf) break;
                float w[LPT];
                mmd_cvt_w<TYPE>(raw[u], w);
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    float xv[LPT];
                    mmd_load_x<LPT, true>(xr[i], k0 + 16 * u + lane0, K, xv);
#pragma unroll
                    for (int j = 0; j < LPT; j++) acc[i][j] = __fmaf_rn(w[j], xv[j], acc[i][j]);
                }
            }
        } else {
            float w[U][LPT];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (k0 + 16 * u < Kf) mmd_load_w<TYPE, false>(row, k0 + 16 * u + lane0, K, w[u]);
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (k0 + 16 * u >= Kf) break;
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    float xv[LPT];
                    mmd_load_x<LPT, false>(xr[i], k0 + 16 * u + lane0, K, xv);
#pragma unroll
                    for (int j = 0; j < LPT; j++) acc[i][j] = __fmaf_rn(w[u][j], xv[j], acc[i][j]);
                }
            }
        }
    }
    if (Kf < K) {                                 /* the tail: +0 past K (one more step) */
        float w[LPT];
        mmd_load_w<TYPE, false>(row, Kf + lane0, K, w);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            float xv[LPT];
            mmd_load_x<LPT, false>(xr[i], Kf + lane0, K, xv);
#pragma unroll
            for (int j = 0; j < LPT; j++) acc[i][j] = __fmaf_rn(w[j], xv[j], acc[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < MT; i++) {
        const float r = mmd_tree<LPT>(acc[i], g);
        if (g == 0 && n_raw < N && i < mv) y[(int64_t)(m0 + i) * N + n] = r;
    }
}

template <int TYPE, int MT>
static void mmd_launch_mt(ds_exec *ex, const dsc_weight *w, int M, const float *x, float *y) {
    constexpr int TPN = 16 / mmd_traits<TYPE>::LPT, NPB = MMD_THREADS / TPN;
    const dim3 grid((unsigned)((M + MT - 1) / MT), dsc_blocks(w->n_out, NPB));
    /* 16-byte loads need 16-byte aligned rows and whole steps */
    constexpr bool can_vec = mmd_traits<TYPE>::LPT * mmd_traits<TYPE>::ES == 16;   /* 16-byte words */
    const bool vec = can_vec && w->n_in % 16 == 0 && ((uintptr_t)x & 15) == 0;
    if constexpr (can_vec) {
        if (vec) {
            mmd_canonical<TYPE, MT, true><<<grid, MMD_THREADS, 0, ex->st>>>(
                (const char *)w->data, w->n_out, w->n_in, M, x, y);
            DSC_LAUNCHED(ex, "matmul canonical");
            return;
        }
    }
    if (!vec)
        mmd_canonical<TYPE, MT, false><<<grid, MMD_THREADS, 0, ex->st>>>(
            (const char *)w->data, w->n_out, w->n_in, M, x, y);
    DSC_LAUNCHED(ex, "matmul canonical");
}

template <int TYPE>
static void mmd_launch(ds_exec *ex, const dsc_weight *w, int M, const float *x, float *y) {
    /* row group width: the smallest of 1, 2, 4, 8 that holds M (M > 8: groups of 8) */
    if (M <= 1) mmd_launch_mt<TYPE, 1>(ex, w, M, x, y);
    else if (M <= 2) mmd_launch_mt<TYPE, 2>(ex, w, M, x, y);
    else if (M <= 4) mmd_launch_mt<TYPE, 4>(ex, w, M, x, y);
    else mmd_launch_mt<TYPE, 8>(ex, w, M, x, y);
}

/* ==========================================================================
 * CANONICAL, staged: the same chains with the weights streamed through
 * shared memory (rows whose byte length is a multiple of 16)
 * ==========================================================================
 * The kernel above keeps each thread's next weights in registers, and a
 * thread can only hold a few hundred bytes: at decode shapes the grid had
 * too few bytes in flight to cover the memory latency (0.2-0.6 TB/s). Here
 * a block of MMS_ROWS outputs x 16 lanes (one thread per lane chain) copies
 * its rows' next segments into shared memory with asynchronous 16-byte
 * copies, MMS_STAGES - 1 segments ahead of the one it computes — tens of KB
 * in flight per block whatever the chains do — and the activation rows'
 * matching segments with them (read from L2 step by step, each step of a
 * chain would wait a full L2 latency: the loads of a thread cannot run
 * ahead of its own fused multiply-adds). Each thread then runs its
 * chain over the segment from shared memory: lane l of output r takes
 * elements k = 16 s + l in step order, exactly the definition's chain (the
 * K % 16 tail as one more step with +0 operands in the missing lanes), and
 * the 16 lanes end in the same 8-4-2-1 tree. So the bits are the kernel
 * above's and the CPU's. */
#include <cuda_pipeline.h>

#define MMS_ROWS 8                               /* outputs per block                 */
#define MMS_THREADS (16 * MMS_ROWS)              /* one thread per (output, lane)     */
#define MMS_SEG 1024                             /* bytes of a row per stage          */
#define MMS_STAGES 4

/* One staged weight as f32. F16: the hardware conversion, exact for every
 * finite and infinite value like common.h's formula; a NaN weight may come
 * out with another payload, which cannot show: the fused multiply-add it
 * enters returns the GPU's one canonical NaN either way. (No branches: the
 * step loop below keeps its loads ahead of its chain.) */
template <int TYPE>
__device__ __forceinline__ float mms_w(const unsigned char *p) {
    if (TYPE == DS_TYPE_F32) return *(const float *)p;
    const unsigned short h = *(const unsigned short *)p;
    return TYPE == DS_TYPE_F16 ? __half2float(__ushort_as_half(h)) : dsc_bf16_to_f32(h);
}

/* One block's MMS_ROWS outputs n0 .. of W (N rows of K) for the MT rows m0 ..
 * of x (M rows): mmd_staged runs it for its row group, mmd_staged_id
 * (matmul_id, below) for an assignment's expert — the same instructions. */
template <int TYPE, int MT>
__device__ __forceinline__ void mms_rows(const char *__restrict__ W, int64_t N, int64_t K, int M,
                                         const float *__restrict__ x, float *__restrict__ y, int64_t n0, int m0) {
    constexpr int ES = mmd_traits<TYPE>::ES;
    constexpr int SE = MMS_SEG / ES;              /* elements per segment (whole steps) */
    constexpr int RB = MMS_SEG + 16 * ES;         /* a staged row, padded: the two rows a
                                                     warp reads sit in different banks */
    constexpr int CPR = MMS_SEG / 16;             /* 16-byte copies per row and stage   */
    constexpr int SB = MMS_ROWS * RB + MT * SE * 4;   /* a stage: the weights, then x   */
    static_assert(SE % 16 == 0, "segments of whole steps");
    extern __shared__ __align__(16) unsigned char mms_smem[];
    const int t = threadIdx.x, r = t / 16, l = t % 16;
    const int mv = M - m0 < MT ? M - m0 : MT;
    const int64_t rowb = K * ES, nseg = (K + SE - 1) / SE;

    /* segment `seg` of the block's rows into stage buffer `st` (padding
     * outputs repeat the last row; pieces past the row are not copied and
     * never read) */
    const float *xr[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) xr[i] = x + (int64_t)(m0 + (i < mv ? i : mv - 1)) * K;
    auto stage_w = [&](int64_t seg, int st) {
        unsigned char *dst = mms_smem + (size_t)st * SB;
        const int64_t off0 = seg * MMS_SEG;
        for (int c = t; c < MMS_ROWS * CPR; c += MMS_THREADS) {
            const int rr = c / CPR, pc = c % CPR;
            const int64_t off = off0 + (int64_t)pc * 16;
            if (off >= rowb) continue;
            const int64_t n = n0 + rr < N ? n0 + rr : N - 1;
            __pipeline_memcpy_async(dst + rr * RB + pc * 16, W + n * rowb + off, 16);
        }
    };
    /* x's segment: MT rows x SE floats in 16-byte pieces (K % 4 == 0 and x
     * 16-byte aligned: the launch checks), pieces past K left out */
    auto stage_x = [&](int64_t seg, int st) {
        float *dst = (float *)(mms_smem + (size_t)st * SB + MMS_ROWS * RB);
        const int64_t k0 = seg * SE;
        for (int c = t; c < MT * (SE / 4); c += MMS_THREADS) {
            const int i = c / (SE / 4), p = c % (SE / 4);
            if (k0 + 4 * p >= K) continue;
            __pipeline_memcpy_async(dst + i * SE + 4 * p, xr[i] + k0 + 4 * p, 16);
        }
    };
    float acc[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i] = 0.0f;

    /* the first segments' weights fly before the wait; x comes from the
     * previous kernel (dsc_launch), so its copies start after it */
#pragma unroll
    for (int s = 0; s < MMS_STAGES - 1; s++)
        if (s < nseg) stage_w(s, s);
    dsc_pdl_wait();
    dsc_pdl_trigger();
#pragma unroll
    for (int s = 0; s < MMS_STAGES - 1; s++) {   /* group s: all of segment s */
        if (s < nseg) stage_x(s, s);
        __pipeline_commit();
    }
    for (int64_t seg = 0; seg < nseg; seg++) {
        const int64_t sn = seg + MMS_STAGES - 1;
        if (sn < nseg) {
            stage_w(sn, (int)(sn % MMS_STAGES));
            stage_x(sn, (int)(sn % MMS_STAGES));
        }
        __pipeline_commit();
        __pipeline_wait_prior(MMS_STAGES - 1);    /* segment seg has landed */
        __syncthreads();
        const unsigned char *row = mms_smem + (size_t)(seg % MMS_STAGES) * SB + r * RB;
        const float *xs = (const float *)(mms_smem + (size_t)(seg % MMS_STAGES) * SB + MMS_ROWS * RB);
        const int64_t k0 = seg * SE;
        const int64_t left = K - k0;
        const int full = (int)((left < SE ? left : SE) / 16);
#pragma unroll 8
        for (int st = 0; st < full; st++) {
            const int kk = st * 16 + l;
            const float wv = mms_w<TYPE>(row + kk * ES);
#pragma unroll
            for (int i = 0; i < MT; i++) acc[i] = __fmaf_rn(wv, xs[i * SE + kk], acc[i]);
        }
        if (left < SE && left % 16) {             /* the tail step: +0 past K */
            const int kk = full * 16 + l;
            const bool in = kk < left;
            const float wv = in ? mms_w<TYPE>(row + kk * ES) : 0.0f;
#pragma unroll
            for (int i = 0; i < MT; i++) acc[i] = __fmaf_rn(wv, in ? xs[i * SE + kk] : 0.0f, acc[i]);
        }
        __syncthreads();                          /* this buffer is staged into next */
    }
    const int64_t n = n0 + r;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        float a[1] = {acc[i]};
        const float v = mmd_tree<1>(a, l);
        if (l == 0 && n < N && i < mv) y[(int64_t)(m0 + i) * N + n] = v;
    }
}

template <int TYPE, int MT>
__global__ void __launch_bounds__(MMS_THREADS)
mmd_staged(const char *__restrict__ W, int64_t N, int64_t K, int M, const float *__restrict__ x,
           float *__restrict__ y) {
    mms_rows<TYPE, MT>(W, N, K, M, x, y, (int64_t)blockIdx.y * MMS_ROWS, blockIdx.x * MT);
}

/* matmul_id (backend.h) on dense experts: assignment i = blockIdx.x reads
 * its expert e = ids[i] on the device (outside [0, n_exp): expert 0) and
 * runs the staged kernel's one-row configuration — decode's, mms_launch at
 * M = 1 — on activation row i / xk: the M = 1 matmul's instructions, so
 * its bits, which are row i's bits of the grouped matmul of any M. The
 * weights depend on the ids, so the wait for the previous kernel (the
 * route) comes first here. tab: the array's device table of row pointers
 * (moe.cu dsc_moe_id_prepare). The assignment is the grid's fastest index
 * (matmul_q8_0.cu q8i_kernel says why: repeated experts from L2). */
template <int TYPE>
__global__ void __launch_bounds__(MMS_THREADS)
mmd_staged_id(const void *const *__restrict__ tab, int n_exp, int xk, int64_t N, int64_t K,
              const int32_t *__restrict__ ids, const float *__restrict__ x, float *__restrict__ y) {
    dsc_pdl_wait();
    const int i = blockIdx.x;
    int e = __ldg(ids + i);
    if (e < 0 || e >= n_exp) e = 0;
    mms_rows<TYPE, 1>((const char *)tab[e], N, K, 1, x + (int64_t)(i / xk) * K, y + (int64_t)i * N,
                      (int64_t)blockIdx.y * MMS_ROWS, 0);
}

static size_t mms_smem_bytes(int type, int mt) {
    const int es = type == DS_TYPE_F32 ? 4 : 2;
    return (size_t)MMS_STAGES * ((size_t)MMS_ROWS * (MMS_SEG + 16 * es) + (size_t)mt * (MMS_SEG / es) * 4);
}

template <int TYPE, int MT>
static void mms_launch_mt(ds_exec *ex, const dsc_weight *w, int M, const float *x, float *y) {
    const dim3 grid((unsigned)((M + MT - 1) / MT), dsc_blocks(w->n_out, MMS_ROWS));
    dsc_launch(ex, "matmul canonical (staged)", mmd_staged<TYPE, MT>, grid, dim3(MMS_THREADS), mms_smem_bytes(TYPE, MT),
               (const char *)w->data, w->n_out, w->n_in, M, x, y);
}

template <int TYPE>
static void mms_launch(ds_exec *ex, const dsc_weight *w, int M, const float *x, float *y) {
    if (M <= 1) mms_launch_mt<TYPE, 1>(ex, w, M, x, y);
    else if (M <= 2) mms_launch_mt<TYPE, 2>(ex, w, M, x, y);
    else if (M <= 4) mms_launch_mt<TYPE, 4>(ex, w, M, x, y);
    else mms_launch_mt<TYPE, 8>(ex, w, M, x, y);
}

template <int TYPE>
static cudaError_t mms_init_type(void) {
    const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
    cudaError_t e = cudaFuncSetAttribute(mmd_staged<TYPE, 1>, a, (int)mms_smem_bytes(TYPE, 1));
    if (e == cudaSuccess) e = cudaFuncSetAttribute(mmd_staged<TYPE, 2>, a, (int)mms_smem_bytes(TYPE, 2));
    if (e == cudaSuccess) e = cudaFuncSetAttribute(mmd_staged<TYPE, 4>, a, (int)mms_smem_bytes(TYPE, 4));
    if (e == cudaSuccess) e = cudaFuncSetAttribute(mmd_staged<TYPE, 8>, a, (int)mms_smem_bytes(TYPE, 8));
    if (e == cudaSuccess) e = cudaFuncSetAttribute(mmd_staged_id<TYPE>, a, (int)mms_smem_bytes(TYPE, 1));
    return e;
}

/* The staged kernel's shared memory (up to ~97 KB at 8 rows of x), past the
 * 48 KB a launch gets without asking: allowed once when the backend starts. */
cudaError_t dsc_matmul_dense_init(void) {
    cudaError_t e = mms_init_type<DS_TYPE_F32>();
    if (e == cudaSuccess) e = mms_init_type<DS_TYPE_F16>();
    if (e == cudaSuccess) e = mms_init_type<DS_TYPE_BF16>();
    return e;
}

__global__ void mmd_zero(float *y, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.0f;
}

/* ==========================================================================
 * FAST — cuBLAS
 * ========================================================================== */
__global__ void mmd_to_half(const float *x, int64_t n, __half *h) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = __float2half_rn(x[i]);
}
__global__ void mmd_to_bf16(const float *x, int64_t n, __nv_bfloat16 *h) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = __float2bfloat16_rn(x[i]);
}

static void mmd_fast(ds_exec *ex, const dsc_weight *w, int M, const float *x, float *y) {
    const int64_t N = w->n_out, K = w->n_in, n = (int64_t)M * K;
    const float one = 1.0f, zero = 0.0f;
    const void *B = x;
    cudaDataType_t t = CUDA_R_32F;
    if (w->type != DS_TYPE_F32) {
        void *h = dsc_scratch(ex, DSC_SLOT_HALF_X, (size_t)n * 2);
        if (!h) return;
        if (w->type == DS_TYPE_F16) {
            mmd_to_half<<<dsc_blocks(n, 256), 256, 0, ex->st>>>(x, n, (__half *)h);
            t = CUDA_R_16F;
        } else {
            mmd_to_bf16<<<dsc_blocks(n, 256), 256, 0, ex->st>>>(x, n, (__nv_bfloat16 *)h);
            t = CUDA_R_16BF;
        }
        DSC_LAUNCHED(ex, "matmul fast convert");
        B = h;
    }
    /* column-major: y^T (N x M) = W^T' (N x K, stored K x N) * x^T (K x M) */
    const cublasStatus_t s =
        cublasGemmEx(ex->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, M, (int)K, &one, w->data, t,
                     (int)K, B, t, (int)K, &zero, y, CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS && !ex->err) {
        ex->err = 1;
        snprintf(ex->errmsg, sizeof ex->errmsg, "cuda: cublasGemmEx failed (status %d)", (int)s);
    }
}

/* ==========================================================================
 * entry point
 * ========================================================================== */
void dsc_matmul_dense(ds_exec *ex, ds_variant v, const dsc_weight *w, int M, const float *x,
                      float *y) {
    if (M <= 0 || w->n_out <= 0) return;
    if (w->n_in == 0) {                         /* empty sums: +0 everywhere */
        const int64_t n = (int64_t)M * w->n_out;
        mmd_zero<<<dsc_blocks(n, 256), 256, 0, ex->st>>>(y, n);
        DSC_LAUNCHED(ex, "matmul zero");
        return;
    }
    if (v == DS_FAST && w->n_in <= INT32_MAX && w->n_out <= INT32_MAX) {
        mmd_fast(ex, w, M, x, y);
        return;
    }
    /* rows of whole 16-byte pieces (and 16-byte aligned: the allocation
     * is) stream through shared memory; others take the register kernel */
    const int es = w->type == DS_TYPE_F32 ? 4 : 2;
    const bool staged = (w->n_in * es) % 16 == 0 && w->n_in % 4 == 0 && ((uintptr_t)x & 15) == 0 &&
                        !(dsc_be(ex)->off & DSC_OFF_STAGED);
    switch (w->type) {
    case DS_TYPE_F32: staged ? mms_launch<DS_TYPE_F32>(ex, w, M, x, y) : mmd_launch<DS_TYPE_F32>(ex, w, M, x, y); break;
    case DS_TYPE_F16: staged ? mms_launch<DS_TYPE_F16>(ex, w, M, x, y) : mmd_launch<DS_TYPE_F16>(ex, w, M, x, y); break;
    case DS_TYPE_BF16: staged ? mms_launch<DS_TYPE_BF16>(ex, w, M, x, y) : mmd_launch<DS_TYPE_BF16>(ex, w, M, x, y); break;
    default: break;
    }
}

/* matmul_id for one dense expert array (moe.cu checked it: the staged
 * kernel's rows, x 16-byte aligned): one launch, assignments x row blocks. */
void dsc_matmul_id_dense(ds_exec *ex, const dsc_weight *w0, int n_exp, int A, const int32_t *ids, int xk,
                         const float *x, float *y) {
    const dim3 grid((unsigned)A, dsc_blocks(w0->n_out, MMS_ROWS));
    const void *const *tab = (const void *const *)w0->id_tab;
    switch (w0->type) {
    case DS_TYPE_F32:
        dsc_launch(ex, "matmul canonical (staged, by expert id)", mmd_staged_id<DS_TYPE_F32>, grid, dim3(MMS_THREADS),
                   mms_smem_bytes(DS_TYPE_F32, 1), tab, n_exp, xk, w0->n_out, w0->n_in, ids, x, y);
        break;
    case DS_TYPE_F16:
        dsc_launch(ex, "matmul canonical (staged, by expert id)", mmd_staged_id<DS_TYPE_F16>, grid, dim3(MMS_THREADS),
                   mms_smem_bytes(DS_TYPE_F16, 1), tab, n_exp, xk, w0->n_out, w0->n_in, ids, x, y);
        break;
    case DS_TYPE_BF16:
        dsc_launch(ex, "matmul canonical (staged, by expert id)", mmd_staged_id<DS_TYPE_BF16>, grid, dim3(MMS_THREADS),
                   mms_smem_bytes(DS_TYPE_BF16, 1), tab, n_exp, xk, w0->n_out, w0->n_in, ids, x, y);
        break;
    default: break;
    }
}
