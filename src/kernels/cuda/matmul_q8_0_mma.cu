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
 * K advances QM_KS blocks (128 bytes of a row) per pipeline stage: every
 * stage's weight rows, activation rows and both scale vectors come in by
 * cp.async, QM_STAGES deep, into shared memory rows padded to 144 bytes
 * (eight ldmatrix row addresses of a matrix then fall in distinct banks);
 * ldmatrix.x4 gives the mma's A fragments (16 rows x 32 bytes) and two
 * n8 tiles' B fragments at once. Rows past N or M repeat the last row and
 * are never stored; blocks past K are zero-filled and never folded. The
 * grid's x is the activation tile (fastest), so the tiles that share a
 * weight tile run together and find it in L2. */
#include "kernels/cuda/cuda_internal.cuh"

#define QM_KS 4                     /* Q8_0 blocks per pipeline stage              */
#define QM_STAGES 3
#define QM_LDB (QM_KS * 32 + 16)    /* shared row pitch in bytes (conflict-free)   */
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
template <int WN, int WM, int MI, int NJ>
struct qm_cfg {
    static constexpr int NT = 32 * WN * WM;                 /* threads              */
    static constexpr int BN = 16 * MI * WN;                 /* weight rows / block  */
    static constexpr int BM = 8 * NJ * WM;                  /* activation rows      */
    static constexpr int A_BYTES = BN * QM_LDB;
    static constexpr int B_BYTES = BM * QM_LDB;
    static constexpr int WS_BYTES = BN * QM_KS * 4;         /* [BN][KS] f32         */
    static constexpr int XS_BYTES = BM * QM_KS * 4;         /* [BM][KS] f32         */
    static constexpr int STAGE = A_BYTES + B_BYTES + WS_BYTES + XS_BYTES;
    static constexpr int SMEM = QM_STAGES * STAGE;
};

/* blocks per SM the register budget is sized for: 8-warp tiles of 64 x 32
 * per warp hold 64 accumulators (one block), the others two or four */
template <int WN, int WM, int MI, int NJ>
struct qm_minb {
    static constexpr int V = MI * NJ >= 16 ? 1 : WN * WM >= 8 ? 2 : NJ >= 4 ? 3 : 4;
};

template <int WN, int WM, int MI, int NJ>
__global__ void __launch_bounds__(32 * WN * WM, (qm_minb<WN, WM, MI, NJ>::V))
qm_kernel(const qm_set set, int64_t K, int M, const int8_t *__restrict__ xq, const float *__restrict__ xd) {
    using C = qm_cfg<WN, WM, MI, NJ>;
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
    const int iters = (int)((nb + QM_KS - 1) / QM_KS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    const int wn = warp % WN, wm = warp / WN;
    const int g = lane >> 2, t = lane & 3;

    /* issue the cp.async copies of stage `it` into buffer s */
    auto load_stage = [&](int s, int it) {
        unsigned char *st = qm_smem + s * C::STAGE;
        unsigned char *As = st, *Bs = st + C::A_BYTES;
        float *Ws = (float *)(st + C::A_BYTES + C::B_BYTES), *Xs = Ws + C::BN * QM_KS;
        const int64_t b0 = (int64_t)it * QM_KS;
        qm_copy_rows<C::NT, QM_KS, QM_LDB>(As, wq, K, n0, N, C::BN, b0, nb, tid);
        qm_copy_rows<C::NT, QM_KS, QM_LDB>(Bs, xq, K, m0, M, C::BM, b0, nb, tid);
        for (int e = tid; e < C::BN * QM_KS; e += C::NT) {
            const int row = e / QM_KS, kb = e % QM_KS;
            const int64_t n = n0 + row < N ? n0 + row : N - 1, b = b0 + kb;
            const float *src = wd + n * nb;
            qm_cp4(Ws + e, b < nb ? src + b : src, b < nb ? 4 : 0);
        }
        for (int e = tid; e < C::BM * QM_KS; e += C::NT) {
            const int row = e / QM_KS, kb = e % QM_KS;
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
    for (int s = 0; s < QM_STAGES - 1; s++) {
        if (s < iters) load_stage(s, s);
        qm_commit();
    }
    /* this lane's ldmatrix row addresses (byte offsets inside a stage) */
    const int lj = lane >> 3, lr = lane & 7;
    const int a_off = (wn * 16 * MI + lr + 8 * (lj & 1)) * QM_LDB + 16 * (lj >> 1);
    const int b_off = C::A_BYTES + (wm * 8 * NJ + 8 * (lj >> 1) + lr) * QM_LDB + 16 * (lj & 1);
    const int wrow = wn * 16 * MI + g, xcol = wm * 8 * NJ + 2 * t;

    for (int it = 0; it < iters; it++) {
        qm_wait<QM_STAGES - 2>();
        __syncthreads();                     /* stage it landed; stage it-1 is free */
        if (it + QM_STAGES - 1 < iters) load_stage((it + QM_STAGES - 1) % QM_STAGES, it + QM_STAGES - 1);
        qm_commit();
        const int s = it % QM_STAGES;
        const unsigned char *st = qm_smem + s * C::STAGE;
        const float *Ws = (const float *)(st + C::A_BYTES + C::B_BYTES), *Xs = Ws + C::BN * QM_KS;
        const unsigned sbase = qm_smem_addr(st);
        const int64_t b0 = (int64_t)it * QM_KS;
        const int kbn = nb - b0 < QM_KS ? (int)(nb - b0) : QM_KS;
        /* the 8-warp 64 x 32 tiles (one block per SM) and the small ones
         * unroll the stage (their registers allow it: loads of block kb + 1
         * issued before block kb's chain); the others would spill */
        constexpr int UNR = qm_minb<WN, WM, MI, NJ>::V == 1 ? 2 : 1;
#pragma unroll UNR
        for (int kb = 0; kb < QM_KS; kb++) {
            if (kb >= kbn) break;                                /* block-uniform */
            uint32_t a[MI][4], b[NJ][2];
#pragma unroll
            for (int i = 0; i < MI; i++)
                qm_ldsm4(sbase + a_off + i * 16 * QM_LDB + kb * 32, a[i][0], a[i][1], a[i][2], a[i][3]);
#pragma unroll
            for (int j = 0; j < NJ; j += 2)
                qm_ldsm4(sbase + b_off + j * 8 * QM_LDB + kb * 32, b[j][0], b[j][1], b[j + 1][0], b[j + 1][1]);
            float ws[MI][2], xs[NJ][2];
#pragma unroll
            for (int i = 0; i < MI; i++) {
                ws[i][0] = Ws[(wrow + 16 * i) * QM_KS + kb];
                ws[i][1] = Ws[(wrow + 16 * i + 8) * QM_KS + kb];
            }
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                xs[j][0] = Xs[(xcol + 8 * j) * QM_KS + kb];
                xs[j][1] = Xs[(xcol + 8 * j + 1) * QM_KS + kb];
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
 * the streaming GEMV: M <= 8 rows (decode, verify, the drafter's block)
 * ==========================================================================
 * Decode is bound by the weight stream, so this kernel is built around it:
 * a block owns 16 weight rows at a time (one m16 tile) and walks K in
 * stages of QP_KC blocks (512 bytes of each row), which cp.async brings
 * into a ring of QP_S shared-memory slots, QP_D stages ahead; the grid is
 * persistent (at most a few blocks per SM), each block taking tile after
 * tile, and the ring runs across tile boundaries, so the loads never stop
 * between tiles. Per stage the 8 warps split its blocks: one mma each (the
 * MT activation rows are the n8 columns, padded), the exact D's go to
 * shared memory, and 16 * MT chain threads fold the PREVIOUS stage's D's in
 * block order while the warps compute this stage's (one barrier a stage).
 * The fold is the definition's, acc = fma(D, d_b * e_b, acc) per block in
 * order, so the bits are the other kernels' for every M.
 *
 * The k order inside a block is permuted the same way for both operands
 * (lane (g, t) takes bytes 8t..8t+7 of its rows as the mma's k = 4t..4t+3
 * and 16+4t..16+4t+3): the integer dot is a sum over all 32 k, exact in any
 * order, and each fragment is then one 8-byte shared load. */
#define QP_KC 16                    /* Q8_0 blocks per stage                        */
#define QP_D 4                      /* stages in flight ahead of the one computed   */
#define QP_S (QP_D + 2)             /* ring slots: + the one computed, + the one folded */
#define QP_LD (QP_KC * 32 + 32)     /* shared row pitch (conflict-free 8-byte loads) */
#define QP_THREADS 256

template <int MT>
struct qp_cfg {
    static constexpr int W_BYTES = 16 * QP_LD;
    static constexpr int X_BYTES = MT * QP_LD;
    static constexpr int WS_BYTES = 16 * QP_KC * 4;         /* [16][KC] f32  */
    static constexpr int XS_BYTES = MT * QP_KC * 4;         /* [MT][KC] f32  */
    static constexpr int SLOT = W_BYTES + X_BYTES + WS_BYTES + XS_BYTES;
    static constexpr int DS = QP_KC * 16 * MT * 4;          /* [KC][16][MT] int32, per buffer */
    static constexpr int SMEM = QP_S * SLOT + 2 * DS;
};

/* where stage i of a block's sequence lives: its ring slot, its K stage
 * (blocks ks * KC ..) and its tile; advanced one stage at a time, so the
 * loop never divides (a 64-bit division per stage and thread measured as
 * the kernel's bottleneck on the H200) */
struct qp_pos {
    int slot, ks;
    unsigned tile;
};
__device__ __forceinline__ void qp_next(qp_pos &p, int n_ks) {
    p.slot = p.slot + 1 == QP_S ? 0 : p.slot + 1;
    if (++p.ks == n_ks) {
        p.ks = 0;
        p.tile += gridDim.x;
    }
}

template <int MT>
__global__ void __launch_bounds__(QP_THREADS, 3)
qp_kernel(const qm_set set, int64_t K, int M, const int8_t *__restrict__ xq, const float *__restrict__ xd,
          unsigned n_tiles) {
    using C = qp_cfg<MT>;
    extern __shared__ __align__(16) unsigned char qp_smem[];
    int32_t *Dsb = (int32_t *)(qp_smem + QP_S * C::SLOT);
    const int64_t nb = K / 32;
    const int n_ks = (int)((nb + QP_KC - 1) / QP_KC);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    const int g = lane >> 2, t = lane & 3;
    /* this block's tiles: blockIdx.x, + gridDim.x, ... */
    const unsigned my_tiles = blockIdx.x < n_tiles ? (n_tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int n_it = (int)my_tiles * n_ks;
    /* (weight, first row) of a tile */
    auto tile_at = [&](unsigned tile, int &wi, int64_t &n0) {
        wi = 0;
#pragma unroll
        for (int i = 1; i < QM_MAXW; i++) wi += tile >= set.blk0[i];
        n0 = (int64_t)(tile - set.blk0[wi]) * 16;
    };
    /* a stage's weight part, then its activation part */
    auto load_w = [&](const qp_pos &p) {
        unsigned char *sl = qp_smem + p.slot * C::SLOT;
        int wi;
        int64_t n0;
        tile_at(p.tile, wi, n0);
        const int8_t *wq = set.wq[wi];
        const float *wd = set.wd[wi];
        const int64_t N = set.N[wi], b0 = (int64_t)p.ks * QP_KC;
        qm_copy_rows<QP_THREADS, QP_KC, QP_LD>(sl, wq, K, n0, N, 16, b0, nb, tid);
        float *Ws = (float *)(sl + C::W_BYTES + C::X_BYTES);          /* [KC][16] */
        for (int e = tid; e < 16 * QP_KC; e += QP_THREADS) {
            const int row = e % 16, kb = e / 16;
            const int64_t n = n0 + row < N ? n0 + row : N - 1, b = b0 + kb;
            const float *src = wd + n * nb;
            qm_cp4(Ws + e, b < nb ? src + b : src, b < nb ? 4 : 0);
        }
    };
    auto load_x = [&](const qp_pos &p) {
        unsigned char *sl = qp_smem + p.slot * C::SLOT;
        const int64_t b0 = (int64_t)p.ks * QP_KC;
        qm_copy_rows<QP_THREADS, QP_KC, QP_LD>(sl + C::W_BYTES, xq, K, 0, M, MT, b0, nb, tid);   /* padding rows repeat the last */
        float *Xs = (float *)(sl + C::W_BYTES + C::X_BYTES + C::WS_BYTES);   /* [KC][MT] */
        for (int e = tid; e < MT * QP_KC; e += QP_THREADS) {
            const int row = e % MT, kb = e / MT;
            const int64_t b = b0 + kb;
            const float *src = xd + (int64_t)(row < M ? row : M - 1) * nb;
            qm_cp4(Xs + e, b < nb ? src + b : src, b < nb ? 4 : 0);
        }
    };
    /* the chain of a stage (threads < 16 MT: weight row r, activation row c) */
    const bool chain = tid < 16 * MT;
    const int cr = tid / MT, cc = tid % MT;
    float acc = 0.0f;
    auto fold = [&](const qp_pos &p, int dbuf) {
        if (!chain) return;
        const unsigned char *sl = qp_smem + p.slot * C::SLOT;
        const float *Ws = (const float *)(sl + C::W_BYTES + C::X_BYTES) + cr;
        const float *Xs = (const float *)(sl + C::W_BYTES + C::X_BYTES + C::WS_BYTES) + cc;
        const int32_t *Ds = Dsb + dbuf * (C::DS / 4) + cr * MT + cc;
        const int64_t b0 = (int64_t)p.ks * QP_KC;
        const int kbn = nb - b0 < QP_KC ? (int)(nb - b0) : QP_KC;
#pragma unroll 4
        for (int kb = 0; kb < kbn; kb++)
            acc = __fmaf_rn(qm_dfloat(Ds[kb * 16 * MT]), __fmul_rn(Ws[kb * 16], Xs[kb * MT]), acc);
        if (p.ks == n_ks - 1) {                       /* the tile's last stage: store */
            int wi;
            int64_t n0;
            tile_at(p.tile, wi, n0);
            if (n0 + cr < set.N[wi] && cc < M) set.y[wi][(int64_t)cc * set.N[wi] + n0 + cr] = acc;
            acc = 0.0f;
        }
    };

    /* weights of the first stages before the wait (they are never written),
     * the activations after it */
    qp_pos ld = {0, 0, blockIdx.x};
    for (int s = 0; s < QP_D; s++, qp_next(ld, n_ks))
        if (s < n_it) load_w(ld);
    dsc_pdl_wait();
    dsc_pdl_trigger();
    ld = {0, 0, blockIdx.x};
    for (int s = 0; s < QP_D; s++, qp_next(ld, n_ks)) {
        if (s < n_it) load_x(ld);
        qm_commit();
    }
    const int xrow = g < MT ? g : MT - 1;            /* padding columns repeat the last row */
    qp_pos cur = {0, 0, blockIdx.x}, prev = cur;     /* ld: stage it + QP_D from here on */
    for (int it = 0; it < n_it; it++) {
        qm_wait<QP_D - 1>();
        __syncthreads();      /* stage it landed; stage it-1's D's are written; it-2's fold is done */
        if (it + QP_D < n_it) {
            load_w(ld);
            load_x(ld);
        }
        qm_commit();
        qp_next(ld, n_ks);
        /* the exact D's of stage it: warp w takes blocks w, w + 8 */
        {
            const unsigned char *sl = qp_smem + cur.slot * C::SLOT;
            int32_t *Ds = Dsb + (it & 1) * (C::DS / 4);
            const int64_t b0 = (int64_t)cur.ks * QP_KC;
            const int kbn = nb - b0 < QP_KC ? (int)(nb - b0) : QP_KC;
#pragma unroll
            for (int kb = warp; kb < QP_KC; kb += QP_THREADS / 32) {
                if (kb >= kbn) break;                                        /* warp-uniform */
                const uint2 w0 = *(const uint2 *)(sl + g * QP_LD + kb * 32 + 8 * t);
                const uint2 w1 = *(const uint2 *)(sl + (g + 8) * QP_LD + kb * 32 + 8 * t);
                const uint2 xv = *(const uint2 *)(sl + C::W_BYTES + xrow * QP_LD + kb * 32 + 8 * t);
                const uint32_t a[4] = {w0.x, w1.x, w0.y, w1.y};
                int32_t d[4];
                qm_mma(d, a, xv.x, xv.y, QM_MAGIC);
                int32_t *dk = Ds + kb * 16 * MT;
                if (2 * t < MT) { dk[g * MT + 2 * t] = d[0]; dk[(g + 8) * MT + 2 * t] = d[2]; }
                if (2 * t + 1 < MT) { dk[g * MT + 2 * t + 1] = d[1]; dk[(g + 8) * MT + 2 * t + 1] = d[3]; }
            }
        }
        if (it > 0) {
            fold(prev, (it - 1) & 1);
            qp_next(prev, n_ks);
        }
        qp_next(cur, n_ks);
    }
    qm_wait<0>();
    __syncthreads();
    if (n_it > 0) fold(prev, (n_it - 1) & 1);
}

/* ==========================================================================
 * host side
 * ========================================================================== */
/* The configurations (warps WN x WM, warp tile 16 MI x 8 NJ):
 *   QM_T128  2 x 4, 64 x 32: 128 x 128, 256 threads   (M >= 128, grid fills the GPU)
 *   QM_T64   4 x 2, 32 x 32: 128 x 64,  256 threads   (M >= 48)
 *   QM_T32   4 x 1, 32 x 32: 128 x 32,  128 threads   (M >= 24)
 *   QM_T16   4 x 1, 32 x 16: 128 x 16,  128 threads
 * Which one runs changes speed only. */
#define QM_T128 2, 4, 4, 4
#define QM_T64 4, 2, 2, 4
#define QM_T32 4, 1, 2, 4
#define QM_T16 4, 1, 2, 2

template <int WN, int WM, int MI, int NJ>
static unsigned qm_grid_y(int n, const dsc_weight *const w[], qm_set *set) {
    using C = qm_cfg<WN, WM, MI, NJ>;
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

template <int WN, int WM, int MI, int NJ>
static int64_t qm_blocks(int n, const dsc_weight *const w[], int M) {
    using C = qm_cfg<WN, WM, MI, NJ>;
    return (int64_t)qm_grid_y<WN, WM, MI, NJ>(n, w, NULL) * ((M + C::BM - 1) / C::BM);
}

template <int WN, int WM, int MI, int NJ>
static void qm_launch(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq, const float *xd,
                      float *const y[]) {
    using C = qm_cfg<WN, WM, MI, NJ>;
    qm_set set;
    memset(&set, 0, sizeof set);
    for (int i = 0; i < n; i++) set.y[i] = y[i];
    const unsigned gy = qm_grid_y<WN, WM, MI, NJ>(n, w, &set);
    const dim3 grid((unsigned)((M + C::BM - 1) / C::BM), gy);
    dsc_launch(ex, "matmul_q8_0 canonical (tensor cores)", qm_kernel<WN, WM, MI, NJ>, grid, dim3(C::NT),
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

/* ---- the streaming GEMV ------------------------------------------------------------- */
/* 1 when M rows of these n weights go through qp_kernel: M <= 8 and
 * switched on (DSPARK_CUDA_ON=stream; off by default, backend_cuda.cu).
 * Same bits as the other kernels. */
int dsc_q8_stream_ok(ds_exec *ex, int n, int M) {
    return M >= 1 && M <= 8 && n >= 1 && n <= QM_MAXW && !(dsc_be(ex)->off & DSC_OFF_STREAM);
}

template <int MT>
static void qp_launch(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq, const float *xd,
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
        tiles += dsc_blocks(w[i]->n_out, 16);
    }
    set.blk0[QM_MAXW] = tiles;
    const dsc_backend *b = dsc_be(ex);
    const int bps = b->qp_bps[MT == 1 ? 0 : MT == 2 ? 1 : MT == 4 ? 2 : 3];
    unsigned grid = (unsigned)(b->n_sm * (bps > 0 ? bps : 1));
    if (grid > tiles) grid = tiles;
    dsc_launch(ex, "matmul_q8_0 canonical (streaming GEMV)", qp_kernel<MT>, dim3(grid), dim3(QP_THREADS),
               (size_t)qp_cfg<MT>::SMEM, set, w[0]->n_in, M, xq, xd, tiles);
}

void dsc_q8_stream(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq, const float *xd,
                   float *const y[]) {
    if (M <= 1) qp_launch<1>(ex, n, w, M, xq, xd, y);
    else if (M <= 2) qp_launch<2>(ex, n, w, M, xq, xd, y);
    else if (M <= 4) qp_launch<4>(ex, n, w, M, xq, xd, y);
    else qp_launch<8>(ex, n, w, M, xq, xd, y);
}

template <int MT>
static cudaError_t qp_init_one(int *bps) {
    cudaError_t e = cudaFuncSetAttribute(qp_kernel<MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, qp_cfg<MT>::SMEM);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(bps, qp_kernel<MT>, QP_THREADS, qp_cfg<MT>::SMEM);
    return e;
}

/* More than 48 KB of shared memory per block: asked once, at start; the
 * streaming GEMV's resident blocks per SM (its persistent grid) with it. */
cudaError_t dsc_q8_mma_init(int qp_bps[4]) {
    cudaError_t e = cudaFuncSetAttribute(qm_kernel<QM_T128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         qm_cfg<QM_T128>::SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(qm_kernel<QM_T64>, cudaFuncAttributeMaxDynamicSharedMemorySize, qm_cfg<QM_T64>::SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(qm_kernel<QM_T32>, cudaFuncAttributeMaxDynamicSharedMemorySize, qm_cfg<QM_T32>::SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(qm_kernel<QM_T16>, cudaFuncAttributeMaxDynamicSharedMemorySize, qm_cfg<QM_T16>::SMEM);
    if (e == cudaSuccess) e = qp_init_one<1>(&qp_bps[0]);
    if (e == cudaSuccess) e = qp_init_one<2>(&qp_bps[1]);
    if (e == cudaSuccess) e = qp_init_one<4>(&qp_bps[2]);
    if (e == cudaSuccess) e = qp_init_one<8>(&qp_bps[3]);
    return e;
}
