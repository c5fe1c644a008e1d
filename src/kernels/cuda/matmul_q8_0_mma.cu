/* matmul_q8_0_mma.cu — MATMUL_Q8_0 canonical on the tensor cores, for the
 * batches that make a matmul compute-bound: prefill chunks, wide verify
 * blocks, many sequences' rows in one step (the batch engine). The same
 * definition as matmul_q8_0.cu's GEMV and the CPU's (kernels/cpu/
 * matmul_q8_0.c), for every M:
 *
 *     acc = +0
 *     for b in block order:  D   = sum_{l<32} q[32b + l] * p[32b + l]   (int32, exact)
 *                            acc = fma((float)D, d_b * e_b, acc)        (one rounding)
 *
 * with p / e the activation row's Q8_0 quants and scales (the bytes the
 * GEMV path quantizes: q8_quantize or the producer's dsc_q8x copy).
 *
 * ==== Why the tensor cores give the definition's bits ====================================
 * One mma.sync m16n8k32 s8 x s8 -> s32 has k = 32 = one Q8_0 block: each of
 * its 16 x 8 outputs is the exact integer dot of one weight row's block
 * with one activation row's block, D. (The accumulator input C is the
 * constant 0x4B400000, so the instruction returns 0x4B400000 + D: an exact
 * integer add, |D| <= 32 * 128 * 128 = 2^19.) Reinterpreted as a float that
 * is 1.5 * 2^23 + D exactly (the low mantissa bits hold 2^22 + D), and
 * subtracting 1.5 * 2^23 gives D exactly — (float)D with two full-rate
 * operations instead of a quarter-rate conversion. The thread that holds an
 * output element in the mma's C fragment owns that output for the whole K
 * loop, and the loop visits the blocks in order: acc = fma(D, d_b * e_b,
 * acc) per block, in block order, one rounding each — the GEMV's and the
 * CPU's sequence (d_b * e_b is exact: two 11-bit significands). So row m of
 * any M is decode's row m: tile shape, which block or warp owns an output,
 * the pipeline depth and M choose nothing but speed.
 *
 * ==== Tiles ===============================================================================
 * A block computes BN weight rows x BM activation rows; its warps form a
 * WN x WM grid of warp tiles of 16 MI weight rows x 8 NJ activation rows.
 * K advances KS blocks (32 KS bytes of a row) per pipeline stage: every
 * stage's weight rows, activation rows and both scale vectors come in by
 * cp.async, ST stages deep, into shared memory rows padded by 16 bytes
 * (eight ldmatrix row addresses of a matrix then fall in distinct banks);
 * ldmatrix.x4 gives the mma's A fragments (16 rows x 32 bytes) and two
 * n8 tiles' B fragments at once. Rows past N or M repeat the last row and
 * are never stored; blocks past K are zero-filled and never folded. The
 * grid's x is the activation tile (fastest), so the tiles that share a
 * weight tile run together and find it in L2. */
#include "kernels/cuda/cuda_internal.cuh"

#define QM_KS 4                     /* Q8_0 blocks per pipeline stage (tiles < 128)  */
#define QM_STAGES 3                 /* ... and stages in flight                      */
#define QM_MAGIC 0x4B400000         /* 1.5 * 2^23 as float bits                    */
#define QM_MAXW DSC_Q8_MAXW
typedef dsc_q8_set qm_set;          /* the weights of one launch (cuda_internal.cuh) */

/* rows [r0, r0 + rows) of an int8 matrix [lim][K] (rows past lim repeat
 * row lim - 1), blocks [b0, b0 + KS) of each (blocks past nb zero-filled),
 * to shared rows of pitch LD: 16-byte copies, consecutive threads along a row */
template <int NT, int KS, int LD>
__device__ __forceinline__ void qm_copy_rows(unsigned char *dst, const int8_t *src, int64_t K, int64_t r0, int64_t lim,
                                             int rows, int64_t b0, int64_t nb, int tid) {
    for (int c = tid; c < rows * KS * 2; c += NT) {
        const int row = c / (KS * 2), piece = c % (KS * 2);
        const int64_t r = r0 + row < lim ? r0 + row : lim - 1, b = b0 + piece / 2;
        const int8_t *s = src + r * K;
        const bool ok = b < nb;
        qm_cp16(dst + row * LD + piece * 16, ok ? s + b * 32 + (piece & 1) * 16 : s, ok ? 16 : 0);
    }
}
/* (float)D from the mma's 0x4B400000 + D: exact for |D| < 2^22 */
__device__ __forceinline__ float qm_dfloat(int32_t v) {
    return __fsub_rn(__int_as_float(v), 12582912.0f);
}

/* ==========================================================================
 * the kernel
 * ========================================================================== */
template <int WN, int WM, int MI, int NJ, int KS, int ST>
struct qm_cfg {
    static constexpr int NT = 32 * WN * WM;                 /* threads              */
    static constexpr int BN = 16 * MI * WN;                 /* weight rows / block  */
    static constexpr int BM = 8 * NJ * WM;                  /* activation rows      */
    static constexpr int LDB = KS * 32 + 16;                /* shared row pitch (conflict-free) */
    static constexpr int A_BYTES = BN * LDB;
    static constexpr int B_BYTES = BM * LDB;
    static constexpr int WS_BYTES = BN * KS * 4;         /* [BN][KS] f32         */
    static constexpr int XS_BYTES = BM * KS * 4;         /* [BM][KS] f32         */
    static constexpr int STAGE = A_BYTES + B_BYTES + WS_BYTES + XS_BYTES;
    static constexpr int SMEM = ST * STAGE;
};

/* blocks per SM the register budget is sized for: 8-warp tiles of 64 x 32
 * per warp hold 64 accumulators (one block), the others two or four */
template <int WN, int WM, int MI, int NJ, int KS, int ST>
struct qm_minb {
    static constexpr int V = MI * NJ >= 16 ? 1 : WN * WM >= 8 ? 2 : NJ >= 4 ? 3 : 4;
};

template <int WN, int WM, int MI, int NJ, int KS, int ST>
__global__ void __launch_bounds__(32 * WN * WM, (qm_minb<WN, WM, MI, NJ, KS, ST>::V))
qm_kernel(const qm_set set, int64_t K, int M, const int8_t *__restrict__ xq, const float *__restrict__ xd) {
    using C = qm_cfg<WN, WM, MI, NJ, KS, ST>;
    extern __shared__ __align__(16) unsigned char qm_smem[];
    int wi = 0;
#pragma unroll
    for (int i = 1; i < QM_MAXW; i++) wi += blockIdx.y >= set.blk0[i];
    const int8_t *__restrict__ wq = set.wq[wi];
    const float *__restrict__ wd = set.wd[wi];
    const int64_t N = set.N[wi];
    const int64_t n0 = (int64_t)(blockIdx.y - set.blk0[wi]) * C::BN;
    const int m0 = blockIdx.x * C::BM;
    const int64_t nb = K / 32;
    const int iters = (int)((nb + KS - 1) / KS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    const int wn = warp % WN, wm = warp / WN;
    const int g = lane >> 2, t = lane & 3;

    /* issue the cp.async copies of stage `it` into buffer s */
    /* The common stage (the tile inside N and M, all KS blocks inside K)
     * with each thread's part of every address worked out once: a thread
     * copies the same 16-byte piece of rows prow + k RS at every stage (and
     * the same scale of rows srow + k SRS), so a copy costs a pointer step
     * instead of divisions and clamps — those integer operations share the
     * FMA pipe with the fold, and ncu found the tile issue-bound
     * (bench/results/cuda-tiles-h200-s33.txt). The general path below
     * writes the same bytes to the same places. */
    constexpr int PR = 2 * KS;                   /* 16-byte pieces per row and stage */
    constexpr bool FAST = C::NT % PR == 0 && C::NT % KS == 0;
    constexpr int RS = FAST ? C::NT / PR : 1, SRS = FAST ? C::NT / KS : 1;
    const int prow = tid / PR, ppc = tid % PR, srow = tid / KS, skb = tid % KS;
    const bool full = FAST && n0 + C::BN <= N && m0 + C::BM <= M;
    const int8_t *const a_src = full ? wq + (n0 + prow) * K + ppc * 16 : wq;
    const int8_t *const b_src = full ? xq + (int64_t)(m0 + prow) * K + ppc * 16 : xq;
    const float *const w_src = full ? wd + (n0 + srow) * nb + skb : wd;
    const float *const x_src = full ? xd + (int64_t)(m0 + srow) * nb + skb : xd;

    auto load_stage = [&](int s, int it) {
        unsigned char *st = qm_smem + s * C::STAGE;
        unsigned char *As = st, *Bs = st + C::A_BYTES;
        float *Ws = (float *)(st + C::A_BYTES + C::B_BYTES), *Xs = Ws + C::BN * KS;
        const int64_t b0 = (int64_t)it * KS;
        if (FAST && full && b0 + KS <= nb) {     /* block-uniform */
            const int64_t ko = b0 * 32;
#pragma unroll
            for (int k = 0; k < (C::BN + RS - 1) / RS; k++)
                if (C::BN % RS == 0 || prow + k * RS < C::BN)
                    qm_cp16(As + (prow + k * RS) * C::LDB + ppc * 16, a_src + (int64_t)k * RS * K + ko, 16);
#pragma unroll
            for (int k = 0; k < (C::BM + RS - 1) / RS; k++)
                if (C::BM % RS == 0 || prow + k * RS < C::BM)
                    qm_cp16(Bs + (prow + k * RS) * C::LDB + ppc * 16, b_src + (int64_t)k * RS * K + ko, 16);
#pragma unroll
            for (int k = 0; k < (C::BN + SRS - 1) / SRS; k++)
                if (C::BN % SRS == 0 || srow + k * SRS < C::BN)
                    qm_cp4(Ws + (srow + k * SRS) * KS + skb, w_src + (int64_t)k * SRS * nb + b0, 4);
#pragma unroll
            for (int k = 0; k < (C::BM + SRS - 1) / SRS; k++)
                if (C::BM % SRS == 0 || srow + k * SRS < C::BM)
                    qm_cp4(Xs + (srow + k * SRS) * KS + skb, x_src + (int64_t)k * SRS * nb + b0, 4);
            return;
        }
        qm_copy_rows<C::NT, KS, C::LDB>(As, wq, K, n0, N, C::BN, b0, nb, tid);
        qm_copy_rows<C::NT, KS, C::LDB>(Bs, xq, K, m0, M, C::BM, b0, nb, tid);
        for (int e = tid; e < C::BN * KS; e += C::NT) {
            const int row = e / KS, kb = e % KS;
            const int64_t n = n0 + row < N ? n0 + row : N - 1, b = b0 + kb;
            const float *src = wd + n * nb;
            qm_cp4(Ws + e, b < nb ? src + b : src, b < nb ? 4 : 0);
        }
        for (int e = tid; e < C::BM * KS; e += C::NT) {
            const int row = e / KS, kb = e % KS;
            const int64_t m = m0 + row < M ? m0 + row : M - 1, b = b0 + kb;
            const float *src = xd + m * nb;
            qm_cp4(Xs + e, b < nb ? src + b : src, b < nb ? 4 : 0);
        }
    };

    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;

    /* the activations (and their Q8_0 copy) come from the previous kernel */
    dsc_pdl_wait();
    dsc_pdl_trigger();
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < iters) load_stage(s, s);
        qm_commit();
    }
    /* this lane's ldmatrix row addresses (byte offsets inside a stage) */
    const int lj = lane >> 3, lr = lane & 7;
    const int a_off = (wn * 16 * MI + lr + 8 * (lj & 1)) * C::LDB + 16 * (lj >> 1);
    const int b_off = C::A_BYTES + (wm * 8 * NJ + 8 * (lj >> 1) + lr) * C::LDB + 16 * (lj & 1);
    const int wrow = wn * 16 * MI + g, xcol = wm * 8 * NJ + 2 * t;

    for (int it = 0; it < iters; it++) {
        qm_wait<ST - 2>();
        __syncthreads();                     /* stage it landed; stage it-1 is free */
        if (it + ST - 1 < iters) load_stage((it + ST - 1) % ST, it + ST - 1);
        qm_commit();
        const int s = it % ST;
        const unsigned char *st = qm_smem + s * C::STAGE;
        const float *Ws = (const float *)(st + C::A_BYTES + C::B_BYTES), *Xs = Ws + C::BN * KS;
        const unsigned sbase = qm_smem_addr(st);
        const int64_t b0 = (int64_t)it * KS;
        const int kbn = nb - b0 < KS ? (int)(nb - b0) : KS;
        /* the 8-warp 64 x 32 tiles (one block per SM) and the small ones
         * unroll the stage (their registers allow it: loads of block kb + 1
         * issued before block kb's chain); the others would spill */
        constexpr int UNR = qm_minb<WN, WM, MI, NJ, KS, ST>::V == 1 ? 2 : 1;
#pragma unroll UNR
        for (int kb = 0; kb < KS; kb++) {
            if (kb >= kbn) break;                                /* block-uniform */
            uint32_t a[MI][4], b[NJ][2];
#pragma unroll
            for (int i = 0; i < MI; i++)
                qm_ldsm4(sbase + a_off + i * 16 * C::LDB + kb * 32, a[i][0], a[i][1], a[i][2], a[i][3]);
#pragma unroll
            for (int j = 0; j < NJ; j += 2)
                qm_ldsm4(sbase + b_off + j * 8 * C::LDB + kb * 32, b[j][0], b[j][1], b[j + 1][0], b[j + 1][1]);
            float ws[MI][2], xs[NJ][2];
#pragma unroll
            for (int i = 0; i < MI; i++) {
                ws[i][0] = Ws[(wrow + 16 * i) * KS + kb];
                ws[i][1] = Ws[(wrow + 16 * i + 8) * KS + kb];
            }
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                xs[j][0] = Xs[(xcol + 8 * j) * KS + kb];
                xs[j][1] = Xs[(xcol + 8 * j + 1) * KS + kb];
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    int32_t d[4];
                    qm_mma(d, a[i], b[j][0], b[j][1], QM_MAGIC);
                    /* c0: (row g, col 2t), c1: (g, 2t+1), c2: (g+8, 2t), c3: (g+8, 2t+1) */
#pragma unroll
                    for (int q = 0; q < 4; q++)
                        acc[i][j][q] = __fmaf_rn(qm_dfloat(d[q]), __fmul_rn(ws[i][q >> 1], xs[j][q & 1]), acc[i][j][q]);
                }
        }
    }
    qm_wait<0>();                            /* nothing in flight at exit */
    float *__restrict__ y = set.y[wi];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int64_t n = n0 + wrow + 16 * i + 8 * (q >> 1);
                const int m = m0 + xcol + 8 * j + (q & 1);
                if (n < N && m < M) y[(int64_t)m * N + n] = acc[i][j][q];
            }
}

/* ==========================================================================
 * the warp-streamed tensor-core GEMV: M <= 16 rows (decode, verify blocks,
 * the drafter's block, a step of up to 16 sequences)
 * ==========================================================================
 * Bound by the weight stream, so built around it. Every warp owns one tile
 * of 8 weight rows alone, for the whole of K, with no block barrier: its
 * own ring of QT_D shared-memory slots, filled by cp.async (16-byte copies,
 * L1 bypassed; a warp instruction copies 512 contiguous bytes of two rows)
 * QT_D - 1 stages of QT_KC blocks ahead of the one it computes, so a warp
 * keeps (QT_D - 1) * QT_KC * 256 bytes in flight and the SM a dozen warps'
 * worth. Per block one mma.sync m16n8k32 with the ACTIVATIONS as the m16
 * operand (up to 16 rows; rows past M repeat the last one, never stored)
 * and the tile's 8 weight rows as the n8 one: the 16 x 8 exact integer
 * dots D of that block. The lane that holds an output in the C fragment
 * (activation row g or g + 8, weight row 2t or 2t + 1) folds it:
 *
 *     acc = fma((float)D, d_b * e_b, acc)     block by block, in block order
 *
 * from +0 — the definition's chain, so the bits of every other Q8_0 kernel
 * (q8v, q8w, the tiles above, the CPU's) for every M, whatever the stage
 * size, ring depth or warps per block.
 *
 * The k order inside a block is permuted the same way for both operands:
 * lane (g, t) gives bytes 8t..8t+3 as the mma's k = 4t..4t+3 and bytes
 * 8t+4..8t+7 as k = 16+4t..16+4t+3 — one 8-byte load of a weight row from
 * shared memory and one of an activation row (from L1: every warp of the
 * SM reads the same few KB) per lane and block. The integer dot is a sum of
 * all 32 products, exact in any order. */
#define QT_WARPS 4                  /* warps per block (each its own tile and ring) */

template <bool M16, int KC>
struct qt_cfg {
    static constexpr int MR = M16 ? 16 : 8;           /* activation rows a slot holds */
    static constexpr int LD = KC * 32 + 32;           /* row pitch: a row 8 banks past the last */
    static constexpr int W_BYTES = 8 * LD;
    static constexpr int X_BYTES = MR * LD;
    static constexpr int WS_BYTES = KC * 8 * 4;       /* weight scales [KC][8] f32 */
    static constexpr int SLOT = W_BYTES + X_BYTES + WS_BYTES + KC * MR * 4;   /* + activation scales [KC][MR] */
};

template <bool M16, int KC, int D>
__global__ void __launch_bounds__(32 * QT_WARPS)
qt_kernel(const qm_set set, int64_t K, int M, const int8_t *__restrict__ xq, const float *__restrict__ xd,
          unsigned n_tiles) {
    using C = qt_cfg<M16, KC>;
    constexpr int MR = C::MR;
    extern __shared__ __align__(16) unsigned char qt_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const unsigned tile = blockIdx.x * QT_WARPS + warp;
    if (tile >= n_tiles) return;                      /* warp-uniform; no barrier below */
    int wi = 0;
#pragma unroll
    for (int i = 1; i < QM_MAXW; i++) wi += tile >= set.blk0[i];
    const int8_t *__restrict__ wq = set.wq[wi];
    const float *__restrict__ wd = set.wd[wi];
    const int64_t N = set.N[wi], n0 = (int64_t)(tile - set.blk0[wi]) * 8;
    const int64_t nb = K / 32;
    const int n_ks = (int)((nb + KC - 1) / KC);
    unsigned char *ring = qt_smem + warp * D * C::SLOT;

    /* stage ks (blocks ks * KC ..) of the tile's 8 weight rows and their
     * scales into its slot (rows past N repeat row N - 1, blocks past nb are
     * zero-filled) ... */
    auto load_w = [&](int ks) {
        unsigned char *sl = ring + (ks % D) * C::SLOT;
        const int64_t b0 = (int64_t)ks * KC;
#pragma unroll
        for (int c = lane; c < 8 * KC * 2; c += 32) {
            const int row = c / (KC * 2), piece = c % (KC * 2);
            const int64_t r = n0 + row < N ? n0 + row : N - 1, b = b0 + piece / 2;
            const int8_t *src = wq + r * K;
            const bool ok = b < nb;
            qm_cp16(sl + row * C::LD + piece * 16, ok ? src + b * 32 + (piece & 1) * 16 : src, ok ? 16 : 0);
        }
        float *ws = (float *)(sl + C::W_BYTES + C::X_BYTES);
#pragma unroll
        for (int e = lane; e < 8 * KC; e += 32) {
            const int row = e % 8, kb = e / 8;
            const int64_t r = n0 + row < N ? n0 + row : N - 1, b = b0 + kb;
            const float *src = wd + r * nb;
            qm_cp4(ws + e, b < nb ? src + b : src, b < nb ? 4 : 0);
        }
    };
    /* ... and of the M activation rows and theirs: the activations come
     * through the ring too, so no stage waits for an L1 miss */
    auto load_x = [&](int ks) {
        unsigned char *sl = ring + (ks % D) * C::SLOT;
        const int64_t b0 = (int64_t)ks * KC;
#pragma unroll
        for (int c = lane; c < MR * KC * 2; c += 32) {
            const int row = c / (KC * 2), piece = c % (KC * 2);
            const int64_t b = b0 + piece / 2;
            const int8_t *src = xq + (int64_t)row * K;
            const bool ok = b < nb;
            if (row < M)
                qm_cp16(sl + C::W_BYTES + row * C::LD + piece * 16, ok ? src + b * 32 + (piece & 1) * 16 : src,
                        ok ? 16 : 0);
        }
        float *xs = (float *)(sl + C::W_BYTES + C::X_BYTES + C::WS_BYTES);
#pragma unroll
        for (int e = lane; e < MR * KC; e += 32) {
            const int row = e % MR, kb = e / MR;
            const int64_t b = b0 + kb;
            const float *src = xd + (int64_t)row * nb;
            if (row < M) qm_cp4(xs + e, b < nb ? src + b : src, b < nb ? 4 : 0);
        }
    };

    /* the weights are never written: their first stages load before the
     * wait for the kernel that produces the activations */
#pragma unroll 1
    for (int s = 0; s < D - 1 && s < n_ks; s++) load_w(s);
    dsc_pdl_wait();
    dsc_pdl_trigger();
#pragma unroll 1
    for (int s = 0; s < D - 1; s++) {
        if (s < n_ks) load_x(s);
        qm_commit();
    }
    /* activation rows past M repeat row M - 1 (never stored) */
    const int r0 = g < M ? g : M - 1, r1 = g + 8 < M ? g + 8 : M - 1;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int ks = 0; ks < n_ks; ks++) {
        /* refill the slot computed last iteration (every lane is past it) */
        if (ks + D - 1 < n_ks) {
            load_w(ks + D - 1);
            load_x(ks + D - 1);
        }
        qm_commit();
        qm_wait<D - 1>();                             /* this lane's copies of stage ks landed */
        __syncwarp();                                 /* ... and every other lane's */
        const unsigned char *sl = ring + (ks % D) * C::SLOT;
        const float *ws = (const float *)(sl + C::W_BYTES + C::X_BYTES);
        const float *xs = ws + KC * 8;
        const int64_t b0 = (int64_t)ks * KC;
        const int kbn = nb - b0 < KC ? (int)(nb - b0) : KC;
#pragma unroll
        for (int kb = 0; kb < KC; kb++) {
            if (kb >= kbn) break;                     /* warp-uniform */
            const uint2 wv = *(const uint2 *)(sl + g * C::LD + kb * 32 + 8 * t);
            const uint2 xa = *(const uint2 *)(sl + C::W_BYTES + r0 * C::LD + kb * 32 + 8 * t);
            const uint2 xb = M16 ? *(const uint2 *)(sl + C::W_BYTES + r1 * C::LD + kb * 32 + 8 * t)
                                 : make_uint2(0u, 0u);
            const float2 d2 = *(const float2 *)(ws + kb * 8 + 2 * t);
            const float ea = xs[kb * MR + r0], eb = M16 ? xs[kb * MR + r1] : 0.0f;
            const uint32_t a[4] = {xa.x, xb.x, xa.y, xb.y};
            int32_t d[4];
            qm_mma(d, a, wv.x, wv.y, QM_MAGIC);
            /* d0: (row g, weight 2t), d1: (g, 2t+1), d2: (g+8, 2t), d3: (g+8, 2t+1) */
            acc[0] = __fmaf_rn(qm_dfloat(d[0]), __fmul_rn(d2.x, ea), acc[0]);
            acc[1] = __fmaf_rn(qm_dfloat(d[1]), __fmul_rn(d2.y, ea), acc[1]);
            if (M16) {
                acc[2] = __fmaf_rn(qm_dfloat(d[2]), __fmul_rn(d2.x, eb), acc[2]);
                acc[3] = __fmaf_rn(qm_dfloat(d[3]), __fmul_rn(d2.y, eb), acc[3]);
            }
        }
        __syncwarp();                                 /* the slot is read: the next refill may land */
    }
    qm_wait<0>();
    float *__restrict__ y = set.y[wi];
    const int64_t n = n0 + 2 * t;
    if (g < M) {
        if (n < N) y[(int64_t)g * N + n] = acc[0];
        if (n + 1 < N) y[(int64_t)g * N + n + 1] = acc[1];
    }
    if (M16 && g + 8 < M) {
        if (n < N) y[(int64_t)(g + 8) * N + n] = acc[2];
        if (n + 1 < N) y[(int64_t)(g + 8) * N + n + 1] = acc[3];
    }
}

/* ==========================================================================
 * host side
 * ========================================================================== */
/* The configurations (warps WN x WM, warp tile 16 MI x 8 NJ):
 *   QM_T128  2 x 4, 64 x 32: 128 x 128, 256 threads   (M >= 128, grid fills the GPU),
 *            stages of 8 blocks, 2 deep: one barrier per 8 blocks (bench_gemv
 *            --tiles, 8B shapes at M = 512 and 2048: 0.93-0.96x the time of
 *            4-block stages 3 deep; deeper pipelines were slower, 1.02-1.31x:
 *            the tile is issue-bound, not waiting for memory —
 *            bench/results/cuda-tiles-h200-s33.txt)
 *   QM_T64   4 x 2, 32 x 32: 128 x 64,  256 threads   (M >= 48)
 *   QM_T32   4 x 1, 32 x 32: 128 x 32,  128 threads   (M >= 24)
 *   QM_T16   4 x 1, 32 x 16: 128 x 16,  128 threads
 * Which one runs changes speed only. */
#define QM_T128 2, 4, 4, 4, 8, 2
#define QM_T64 4, 2, 2, 4, QM_KS, QM_STAGES
#define QM_T32 4, 1, 2, 4, QM_KS, QM_STAGES
#define QM_T16 4, 1, 2, 2, QM_KS, QM_STAGES

template <int WN, int WM, int MI, int NJ, int KS, int ST>
static unsigned qm_grid_y(int n, const dsc_weight *const w[], qm_set *set) {
    using C = qm_cfg<WN, WM, MI, NJ, KS, ST>;
    unsigned blk = 0;
    for (int i = 0; i < QM_MAXW; i++) {
        if (i >= n) {
            if (set) set->blk0[i] = 0xffffffffu;
            continue;
        }
        if (set) {
            set->blk0[i] = blk;
            set->wq[i] = (const int8_t *)w[i]->data;
            set->wd[i] = w[i]->scale;
            set->N[i] = w[i]->n_out;
        }
        blk += dsc_blocks(w[i]->n_out, C::BN);
    }
    if (set) set->blk0[QM_MAXW] = blk;
    return blk;
}

template <int WN, int WM, int MI, int NJ, int KS, int ST>
static int64_t qm_blocks(int n, const dsc_weight *const w[], int M) {
    using C = qm_cfg<WN, WM, MI, NJ, KS, ST>;
    return (int64_t)qm_grid_y<WN, WM, MI, NJ, KS, ST>(n, w, NULL) * ((M + C::BM - 1) / C::BM);
}

template <int WN, int WM, int MI, int NJ, int KS, int ST>
static void qm_launch(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq, const float *xd,
                      float *const y[]) {
    using C = qm_cfg<WN, WM, MI, NJ, KS, ST>;
    qm_set set;
    memset(&set, 0, sizeof set);
    for (int i = 0; i < n; i++) set.y[i] = y[i];
    const unsigned gy = qm_grid_y<WN, WM, MI, NJ, KS, ST>(n, w, &set);
    const dim3 grid((unsigned)((M + C::BM - 1) / C::BM), gy);
    dsc_launch(ex, "matmul_q8_0 canonical (tensor cores)", qm_kernel<WN, WM, MI, NJ, KS, ST>, grid, dim3(C::NT),
               (size_t)C::SMEM, set, w[0]->n_in, M, xq, xd);
}

/* The tensor-core path's tile height for M rows of n weights of one K, or 0
 * when the GEMV should run instead: M <= 8 (its rows share one weight read
 * there; here 8-row tiles would idle the tensor cores and the grid),
 * switched off (DSPARK_CUDA_OFF=mma), or a grid too small to fill the GPU
 * (few weight rows: the GEMV splits K among a block's warps, these tiles do
 * not). dsc_be(ex)->mma_bm forces a tile height (DSPARK_CUDA_MMA=16|32|64|128,
 * an A/B aid). Either kernel gives the same bits. */
int dsc_q8_mma_bm(ds_exec *ex, int n, const dsc_weight *const w[], int M) {
    const dsc_backend *b = dsc_be(ex);
    if (M <= 8 || n < 1 || n > QM_MAXW || (b->off & DSC_OFF_MMA)) return 0;
    if (b->mma_bm) return b->mma_bm;
    /* the first of 128, 64, 32, 16 rows whose grid has a block for every
     * other SM: fewer wave the GEMV through (run s1's tables: tile 16 with 96
     * blocks beat the GEMV at M = 16, with 32 it lost 2-4x) */
    const int64_t full = (b->n_sm + 1) / 2;
    if (M >= 128 && qm_blocks<QM_T128>(n, w, M) >= full) return 128;
    if (M >= 48 && qm_blocks<QM_T64>(n, w, M) >= full) return 64;
    if (M >= 24 && qm_blocks<QM_T32>(n, w, M) >= full) return 32;
    if (qm_blocks<QM_T16>(n, w, M) >= full) return 16;
    return 0;
}

/* y[i] = W_i x for the quantized rows (xq, xd) with tile height bm */
void dsc_q8_mma(ds_exec *ex, int bm, int n, const dsc_weight *const w[], int M, const int8_t *xq,
                const float *xd, float *const y[]) {
    switch (bm) {
    case 128: qm_launch<QM_T128>(ex, n, w, M, xq, xd, y); break;
    case 64: qm_launch<QM_T64>(ex, n, w, M, xq, xd, y); break;
    case 32: qm_launch<QM_T32>(ex, n, w, M, xq, xd, y); break;
    default: qm_launch<QM_T16>(ex, n, w, M, xq, xd, y); break;
    }
}

/* ---- the warp-streamed tensor-core GEMV ---------------------------------------------- */
/* 1 when M rows of these n weights go through qt_kernel. Where it is the
 * faster kernel on the H200 (tests/cuda/bench_gemv.cu, the 8B shapes, L2
 * cold; bench/results/cuda-qt-h200-s33.txt), against what would run instead:
 *   M = 9..16  fewer than 16384 weight rows (q/k/v, o, down: 0.34-0.41x
 *              the 16-row tile's time, k/v 0.38x); gate/up (24576 rows
 *              fused) and the LM head fill the tiles' grid (qt 1.08x, 2.1x);
 *   M = 5..8   4096 rows or more (o 0.94x q8v, down 0.90x, the LM head
 *              0.76x; k/v alone 1.3x);
 *   M = 3, 4   the LM head (0.79x); the layer shapes 1.0-1.09x;
 *   M = 1, 2   never: q8w streams them at up to 97% of the copy bandwidth.
 * DSPARK_CUDA_OFF=stream: never; DSPARK_CUDA_ON=stream: every M <= 16 (an
 * A/B aid, as DSPARK_CUDA_MMA forces a tile). The same bits whichever runs. */
int dsc_q8_stream_ok(ds_exec *ex, int n, const dsc_weight *const w[], int M) {
    const dsc_backend *b = dsc_be(ex);
    if (M < 1 || M > 16 || n < 1 || n > QM_MAXW || (b->off & DSC_OFF_STREAM)) return 0;
    if (b->stream_all) return 1;
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += w[i]->n_out;
    if (M > 8) return rows < 16384;
    if (M > 4) return rows >= 4096;
    if (M > 2) return rows >= 32768;
    return 0;
}

template <bool M16, int KC, int D>
void dsc_q8_stream_cfg(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq, const float *xd,
                       float *const y[]) {
    qm_set set;
    memset(&set, 0, sizeof set);
    unsigned tiles = 0;
    for (int i = 0; i < QM_MAXW; i++) {
        if (i >= n) { set.blk0[i] = 0xffffffffu; continue; }
        set.blk0[i] = tiles;
        set.wq[i] = (const int8_t *)w[i]->data;
        set.wd[i] = w[i]->scale;
        set.N[i] = w[i]->n_out;
        set.y[i] = y[i];
        tiles += dsc_blocks(w[i]->n_out, 8);
    }
    set.blk0[QM_MAXW] = tiles;
    dsc_launch(ex, "matmul_q8_0 canonical (tensor-core warp GEMV)", qt_kernel<M16, KC, D>,
               dim3(dsc_blocks(tiles, QT_WARPS)), dim3(32 * QT_WARPS), (size_t)(QT_WARPS * D * qt_cfg<M16, KC>::SLOT),
               set, w[0]->n_in, M, xq, xd, tiles);
}

/* stages of 8 blocks (2 KiB of a tile), 4 slots: 6 KiB in flight per warp
 * (the fastest of the five bench_gemv times on most 8B shapes) */
#define QT_KC 8
#define QT_D 4
void dsc_q8_stream(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq, const float *xd,
                   float *const y[]) {
    if (M <= 8) dsc_q8_stream_cfg<false, QT_KC, QT_D>(ex, n, w, M, xq, xd, y);
    else dsc_q8_stream_cfg<true, QT_KC, QT_D>(ex, n, w, M, xq, xd, y);
}

/* every configuration bench_gemv times, each asked for its shared memory once */
template <bool M16, int KC, int D>
static cudaError_t qt_init_one(void) {
    return cudaFuncSetAttribute(qt_kernel<M16, KC, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                QT_WARPS * D * qt_cfg<M16, KC>::SLOT);
}
#define QT_CONFIGS(X) X(4, 8) X(4, 12) X(8, 6) X(2, 16) X(8, 4)

/* More than 48 KB of shared memory per block: asked once, at start. */
cudaError_t dsc_q8_mma_init(void) {
    cudaError_t e = cudaFuncSetAttribute(qm_kernel<QM_T128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         qm_cfg<QM_T128>::SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(qm_kernel<QM_T64>, cudaFuncAttributeMaxDynamicSharedMemorySize, qm_cfg<QM_T64>::SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(qm_kernel<QM_T32>, cudaFuncAttributeMaxDynamicSharedMemorySize, qm_cfg<QM_T32>::SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(qm_kernel<QM_T16>, cudaFuncAttributeMaxDynamicSharedMemorySize, qm_cfg<QM_T16>::SMEM);
#define QT_INIT(KC, D)                                            \
    if (e == cudaSuccess) e = qt_init_one<false, KC, D>();       \
    if (e == cudaSuccess) e = qt_init_one<true, KC, D>();
    QT_CONFIGS(QT_INIT)
#undef QT_INIT
    return e;
}
