/* matmul_q8_0.cu — MATMUL_Q8_0 family on the GPU: y[m][n] = sum_k W[n][k] * x[m][k]
 * with Q8_0 weights (prepare_weight split them into an int8 quant matrix
 * with aligned rows and the f32 values of the fp16 block scales).
 *
 *   decode     dsc_matmul(DS_CANONICAL, W, 1, ...): canonical at M = 1.
 *   canonical  the CPU's int8 definition (kernels/cpu/matmul_q8_0.c): every
 *              activation row quantized to Q8_0 exactly as
 *              ds_quantize_row_q8_0 does (q8_quantize below: the scalar
 *              loop's operations, NaN rules included — or the copy the
 *              rows' producer already made with the same operations,
 *              dsc_q8x), then per (m, n)
 *                  acc = +0
 *                  for b in block order: D = sum of 32 int8 products (exact)
 *                                        acc = fma((float)D, d_b * e_b, acc)
 *              Two phases per tile of 16 blocks: all threads compute the
 *              exact D's of 16 weight rows x 16 blocks x MT rows with dp4a
 *              (any order: integers), then one thread per (m, n) folds them
 *              into its f32 chain in block order. So the block dots are as
 *              parallel as the GPU likes while the one rounding chain keeps
 *              the definition's order.
 *   fast       what an engine ships for batches: the weights dequantized on
 *              the fly (d * q, exact) against the UNQUANTIZED f32
 *              activations, one warp per output with its 32 lanes taking
 *              interleaved blocks (split-K) and a butterfly sum at the end.
 *
 * ==== Why canonical is the CPU's bits ===================================================
 * The quantized activations are the same bytes (same IEEE divisions,
 * products, truncations and fp16 rounding as the scalar C loop); D is an
 * exact integer whatever the summation order, (float)D and d_b * e_b are
 * exact, and the only rounding, the fma into acc, happens once per block in
 * block order — the CPU's sequence on every path (VNNI, AVX2, scalar).
 *
 * ==== Why fast differs ===================================================================
 * No 8-bit rounding of the activations (a ~1e-3 relative change per block)
 * and another summation order (32 interleaved partial sums, then a
 * butterfly): close to canonical, visibly not its bits. */
#include "kernels/cuda/cuda_internal.cuh"

/* ==========================================================================
 * activation quantization (ds_quantize_row_q8_0, scalar form)
 * ========================================================================== */
/* One thread per block. q: int8 [M][K], e: the block scales. */
__global__ void q8_quantize(const float *__restrict__ x, int64_t nblocks, int8_t *__restrict__ q,
                            float *__restrict__ e) {
    dsc_pdl_wait();
    dsc_pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nblocks) return;
    e[i] = dsc_q8_block(x + i * 32, (uint4 *)(q + i * 32));
}

/* ==========================================================================
 * CANONICAL (= decode)
 * ==========================================================================
 * A block owns RB weight rows for one group of MT activation rows and walks
 * K in tiles of TKB = 32 * WK blocks of 32. Its 8 warps form (8 / WK) row
 * groups x WK K-slices: warp (wr, wk) holds R rows, and lane l of it takes
 * block b0 + 32 wk + l of each of those rows (one 32-byte block per lane and
 * row: two 16-byte loads, 32 consecutive blocks per warp and row).
 *
 *   phase 1 (all threads): the exact int32 block dots D of R rows x MT
 *            activation rows (dp4a, any order: integers), written to shared
 *            memory with the block's two scales; then the loads of the NEXT
 *            tile are issued into the same registers, so they fly during...
 *   phase 2 (one thread per (row, activation row) chain): the f32 chain over
 *            the tile's blocks IN BLOCK ORDER, acc = fma((float)D, d*e, acc),
 *            the definition's single rounding per block.
 *
 * The row group index is blockIdx.x (the fastest), so the groups of 8 that
 * make up M > 8 read the same weight tile one after another, from L2.
 *
 * Short rows (K <= 1024: one tile) quantize their own activations (FQ): the
 * block's threads stage the MT x K floats in shared memory (all at once,
 * coalesced), then run dsc_q8_block on the MT x nb blocks there, before
 * phase 1 — the same function on the same floats, so the same bytes as the
 * separate q8_quantize launch, which decode steps of small models cannot
 * afford (they are launch-bound). Staging keeps each thread's work to a few
 * elements: SwiGLU fused in here (swiglu_matmul) costs one element per
 * thread, not the 32 serial ones a thread per block would do. Longer rows
 * keep the separate launch: every block would re-read M x K floats. */
#define Q8V_THREADS 256
#define Q8V_R 4                 /* weight rows per warp (1 for small grids: q8v_launch) */

/* The weights of one launch: dsc_q8_set (cuda_internal.cuh). */
#define Q8V_MAXW DSC_Q8_MAXW
typedef dsc_q8_set q8v_set;

/* The residual epilogue (matmul_res): after every block has written its
 * outputs, the LAST block to finish (a completion count, not a reduction:
 * no value is ever summed through an atomic) runs the residual family's
 * canonical step on the M rows, x += y then rmsnorm(x) * w, exactly as
 * rmsnorm.cu's warp kernel: lanes 0..15 the 16-lane chains and the 8-4-2-1
 * tree, IEEE division and square root, a warp per row. The count returns to
 * 0 for the next launch or replay. */
struct q8v_epi {
    float *x;                   /* the residual stream [M][N], NULL: no epilogue */
    const float *w;             /* the norm's weights [N]                         */
    float eps;
    float *xn;                  /* [M][N]                                         */
    unsigned *count;            /* device counter, 0 between launches             */
};

__device__ __noinline__ void q8v_epilogue(const q8v_epi &e, const float *y, int64_t N, int M) {
    __shared__ unsigned last;
    __threadfence();                               /* this block's y before the count */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(e.count, 1u) == gridDim.x * gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();                               /* every block's y, seen after the count */
    /* a warp per row (rows are independent): lanes 0..15 form x + y in the
     * 16-lane order as they sum its squares, writing x back; the scale goes
     * to all 32 lanes, which then write xn from the x just written */
    const int n = (int)N, lane = threadIdx.x & 31;
    for (int m = threadIdx.x / 32; m < M; m += blockDim.x / 32) {
        float *xr = e.x + (int64_t)m * N;
        const float *yr = y + (int64_t)m * N;
        float a = 0.0f;
        if (lane < 16) {
            int i = 0;
#pragma unroll 4
            for (; i + 16 <= n; i += 16) {
                const float v = __fadd_rn(xr[i + lane], __ldcg(yr + i + lane));
                xr[i + lane] = v;
                a = __fadd_rn(a, __fmul_rn(v, v));
            }
            if (i + lane < n) {
                const float v = __fadd_rn(xr[i + lane], __ldcg(yr + i + lane));
                xr[i + lane] = v;
                a = __fadd_rn(a, __fmul_rn(v, v));
            }
        }
#pragma unroll
        for (int s = 8; s >= 1; s /= 2) a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, s, 16));
        const float sum = __shfl_sync(0xffffffffu, a, 0);
        const float sc = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, (float)n), e.eps)));
        __syncwarp();                              /* x written above, read below */
        float *xnr = e.xn + (int64_t)m * N;
        for (int i = lane; i < n; i += 32) xnr[i] = __fmul_rn(__fmul_rn(xr[i], sc), e.w[i]);
    }
    __syncthreads();
    if (threadIdx.x == 0) *e.count = 0u;
}

#define Q8V_FQ_MAXNB 32           /* FQ: at most one tile of 32 blocks (K <= 1024) */
#define Q8V_SMEM_MAX (96 * 1024)  /* FQ at MT = 8: ~80 KB (dsc_matmul_q8_0_init)      */

template <int MT, bool FQ, int R>
__global__ void __launch_bounds__(Q8V_THREADS)
q8v_kernel(const q8v_set set, int64_t K, int M, int WK, int spread, const int8_t *__restrict__ xq,
           const float *__restrict__ xd, const float *__restrict__ xf, const float *__restrict__ xu,
           float *__restrict__ hout, const q8v_epi epi) {
    extern __shared__ __align__(16) int32_t q8v_smem[];
    int wi = 0;
#pragma unroll
    for (int i = 1; i < Q8V_MAXW; i++) wi += blockIdx.y >= set.blk0[i];
    const int8_t *__restrict__ wq = set.wq[wi];
    const float *__restrict__ wd = set.wd[wi];
    float *__restrict__ y = set.y[wi];
    const int64_t N = set.N[wi];
    const int RB = (8 / WK) * R, TKB = 32 * WK, LD = TKB + 1;
    uint4 *Xq = (uint4 *)q8v_smem;                     /* FQ: [MT][32 blocks][2] quants      */
    /* FQ: Xq, then Xf [MT][K] floats; then the chains' buffers */
    int32_t *Ds = q8v_smem + (FQ ? MT * Q8V_FQ_MAXNB * 8 + MT * (int)K : 0);  /* [RB * MT][LD] */
    float *Ws = (float *)(Ds + RB * MT * LD);          /* [RB][LD]  weight block scales       */
    float *Xs = Ws + RB * LD;                          /* [MT][LD]  activation block scales   */
    const int64_t nb = K / 32;
    const int t = threadIdx.x, warp = t / 32, lane = t & 31;
    const int wk = warp % WK, wr = warp / WK, col = wk * 32 + lane;
    const int m0 = blockIdx.x * MT, mv = M - m0 < MT ? M - m0 : MT;
    const int64_t nbase = (int64_t)(blockIdx.y - set.blk0[wi]) * RB;

    /* phase-1 rows (padding rows repeat the last row; never written) */
    int64_t nr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t n = nbase + wr * R + r;
        nr[r] = n < N ? n : N - 1;
    }
    /* phase-2 role */
    const bool chain = t < RB * MT;
    const int rc = t / MT, mc = t % MT;
    float acc = 0.0f;

    /* the first tile's weights: in flight during the staging below */
    uint4 wv[R][2];
#pragma unroll
    for (int r = 0; r < R; r++) wv[r][0] = wv[r][1] = make_uint4(0, 0, 0, 0);
    if (col < nb) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4 *wp = (const uint4 *)(wq + nr[r] * K + (int64_t)col * 32);
            wv[r][0] = __ldg(wp);
            wv[r][1] = __ldg(wp + 1);
        }
    }
    /* the weights above are in flight; the activations come from the
     * previous kernel (dsc_launch) */
    dsc_pdl_wait();
    dsc_pdl_trigger();
    if (FQ) {
        /* this block's copy of the activations, staged by all threads at
         * once (coalesced; swiglu(gate, up) element by element when xu is
         * given, written to hout by the first row group), then quantized
         * block by block from shared memory */
        float *Xf = (float *)(Xq + MT * Q8V_FQ_MAXNB * 2);  /* [MT][K] */
        const int Ki = (int)K;
        for (int i = t; i < MT * Ki; i += Q8V_THREADS) {
            const int m = i / Ki, j = i % Ki;
            const int64_t g = (int64_t)(m0 + (m < mv ? m : mv - 1)) * K + j;
            float v = xf[g];
            if (xu) {
                v = dsc_swiglu_canonical(v, xu[g]);
                if (hout && blockIdx.y == 0 && m < mv) hout[g] = v;
            }
            Xf[i] = v;
        }
        __syncthreads();
        for (int i = t; i < MT * nb; i += Q8V_THREADS) {
            const int m = i / (int)nb, b = i % (int)nb;
            Xs[m * LD + b] = dsc_q8_block(Xf + (int64_t)m * K + (int64_t)b * 32, Xq + (m * Q8V_FQ_MAXNB + b) * 2);
        }
        __syncthreads();
    }
    for (int64_t b0 = 0; b0 < nb; b0 += TKB) {
        const int64_t b = b0 + col;
        if (MT > 1 && spread) {
            /* phase 1 for short rows (one tile, nb < 32 blocks): the lane-
             * per-block mapping below leaves 32 - nb lanes idle and runs all
             * MT dots on each busy one; here the warp's 32 lanes share the
             * nb x MT (block, activation row) pairs, each taking its block's
             * weights from the lane that loaded them. The same integer dots
             * into the same Ds cells: phase 2, and so the bits, unchanged. */
            const int pairs = (int)nb * MT;
            for (int i0 = 0; i0 < pairs; i0 += 32) {
                const int idx = i0 + lane;
                const bool ok = idx < pairs;
                const int bb = ok ? idx % (int)nb : 0, m = ok ? idx / (int)nb : 0;
                uint4 w[R][2];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    w[r][0] = dsc_shfl_u4(wv[r][0], bb);
                    w[r][1] = dsc_shfl_u4(wv[r][1], bb);
                }
                if (ok) {
                    const int mrow = m0 + (m < mv ? m : mv - 1);
                    uint4 x0, x1;
                    if (FQ) {
                        x0 = Xq[(m * Q8V_FQ_MAXNB + bb) * 2];
                        x1 = Xq[(m * Q8V_FQ_MAXNB + bb) * 2 + 1];
                    } else {
                        const uint4 *xp = (const uint4 *)(xq + (int64_t)mrow * K + (int64_t)bb * 32);
                        x0 = __ldg(xp);
                        x1 = __ldg(xp + 1);
                    }
#pragma unroll
                    for (int r = 0; r < R; r++)
                        Ds[((wr * R + r) * MT + m) * LD + bb] = dsc_dot_q8(w[r][0], w[r][1], x0, x1);
                    if (!FQ && wr == 0) Xs[m * LD + bb] = __ldg(xd + (int64_t)mrow * nb + bb);
                }
            }
            if (b < nb) {
#pragma unroll
                for (int r = 0; r < R; r++) Ws[(wr * R + r) * LD + col] = __ldg(wd + nr[r] * nb + b);
            }
        } else if (b < nb) {
            /* phase 1: exact integer block dots of this tile */
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const int mrow = m0 + (m < mv ? m : mv - 1);
                uint4 x0, x1;
                if (FQ) {
                    x0 = Xq[(m * Q8V_FQ_MAXNB + (int)b) * 2];
                    x1 = Xq[(m * Q8V_FQ_MAXNB + (int)b) * 2 + 1];
                } else {
                    const uint4 *xp = (const uint4 *)(xq + (int64_t)mrow * K + b * 32);
                    x0 = __ldg(xp);
                    x1 = __ldg(xp + 1);
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int D = dsc_dot_q8(wv[r][0], wv[r][1], x0, x1);
                    Ds[((wr * R + r) * MT + m) * LD + col] = D;
                }
                if (!FQ && wr == 0) Xs[m * LD + col] = __ldg(xd + (int64_t)mrow * nb + b);
            }
#pragma unroll
            for (int r = 0; r < R; r++) Ws[(wr * R + r) * LD + col] = __ldg(wd + nr[r] * nb + b);
        }
        /* the next tile's weights: in flight during the chains below */
        const int64_t bn = b + TKB;
        if (bn < nb) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint4 *wp = (const uint4 *)(wq + nr[r] * K + bn * 32);
                wv[r][0] = __ldg(wp);
                wv[r][1] = __ldg(wp + 1);
            }
        }
        __syncthreads();
        /* phase 2: one fma per block, in block order */
        if (chain) {
            const int tb = nb - b0 < TKB ? (int)(nb - b0) : TKB;
            const int32_t *dr = Ds + t * LD;
            const float *wsr = Ws + rc * LD, *xsr = Xs + mc * LD;
#pragma unroll 8
            for (int j = 0; j < tb; j++)
                acc = __fmaf_rn((float)dr[j], __fmul_rn(wsr[j], xsr[j]), acc);
        }
        __syncthreads();
    }
    if (chain && mc < mv && nbase + rc < N) y[(int64_t)(m0 + mc) * N + nbase + rc] = acc;
    if (epi.x) q8v_epilogue(epi, y, N, M);         /* one weight per launch here */
}

template <int MT, int R>
static void q8v_launch_r(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq,
                         const float *xd, const float *xf, const float *xu, float *hout,
                         float *const y[], const q8v_epi &epi) {
    const int64_t K = w[0]->n_in, nb = K / 32;
    /* K-slices per row group: one warp-wide tile for short rows, four (128
     * blocks = 4 KiB of a row per tile) for long ones */
    const int WK = nb <= 32 ? 1 : nb <= 64 ? 2 : 4;
    const int RB = (8 / WK) * R, LD = 32 * WK + 1;
    const bool fq = xq == NULL;
    size_t smem = (size_t)(RB * MT + RB + MT) * LD * 4 +
                  (fq ? (size_t)MT * Q8V_FQ_MAXNB * 32 + (size_t)MT * (size_t)K * 4 : 0);
    q8v_set set;
    memset(&set, 0, sizeof set);
    unsigned blk = 0;
    for (int i = 0; i < Q8V_MAXW; i++) {
        if (i >= n) {                   /* unused: no row group maps here */
            set.blk0[i] = 0xffffffffu;
            continue;
        }
        set.blk0[i] = blk;
        set.wq[i] = (const int8_t *)w[i]->data;
        set.wd[i] = w[i]->scale;
        set.y[i] = y[i];
        set.N[i] = w[i]->n_out;
        blk += dsc_blocks(w[i]->n_out, RB);
    }
    set.blk0[Q8V_MAXW] = blk;
    const dim3 grid((unsigned)((M + MT - 1) / MT), blk);
    /* short rows at several activation rows: the lanes share (block, row)
     * pairs. Opt-in (DSPARK_CUDA_ON=spread): measured slower on the H200
     * (the shuffles and the pair division cost more than the idle lanes) */
    const int spread = MT > 1 && WK == 1 && nb < 32 && !(dsc_be(ex)->off & DSC_OFF_SPREAD);
    if (fq) dsc_launch(ex, "matmul_q8_0 canonical", q8v_kernel<MT, true, R>, grid, dim3(Q8V_THREADS), smem, set, K, M, WK,
                       spread, xq, xd, xf, xu, hout, epi);
    else dsc_launch(ex, "matmul_q8_0 canonical", q8v_kernel<MT, false, R>, grid, dim3(Q8V_THREADS), smem, set, K, M, WK,
                    spread, xq, xd, xf, (const float *)NULL, (float *)NULL, epi);
}

/* Rows per warp: four where the grid is wide enough to fill the GPU, else
 * one (four times the blocks): the small models' projections (the tiny
 * target's 384-row o and down: 12 blocks of 32 rows) left 120 SMs idle and
 * ran each block's chains back to back. Which block computes a row never
 * changes its chain: the same bits either way. */
template <int MT>
static void q8v_launch(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq,
                       const float *xd, const float *xf, const float *xu, float *hout,
                       float *const y[], const q8v_epi &epi) {
    const int64_t nb = w[0]->n_in / 32;
    const int WK = nb <= 32 ? 1 : nb <= 64 ? 2 : 4;
    int64_t blocks = 0;
    for (int i = 0; i < n; i++) blocks += (w[i]->n_out + (8 / WK) * Q8V_R - 1) / ((8 / WK) * Q8V_R);
    blocks *= (M + MT - 1) / MT;
    if (2 * blocks < dsc_be(ex)->n_sm && !(dsc_be(ex)->off & DSC_OFF_NARROW))
        q8v_launch_r<MT, 1>(ex, n, w, M, xq, xd, xf, xu, hout, y, epi);
    else
        q8v_launch_r<MT, Q8V_R>(ex, n, w, M, xq, xd, xf, xu, hout, y, epi);
}

/* ==========================================================================
 * FAST — f32 activations, split-K over the warp's lanes
 * ========================================================================== */
#define Q8F_WARPS 8

template <int MT>
__global__ void __launch_bounds__(32 * Q8F_WARPS)
q8f_kernel(const int8_t *__restrict__ wq, const float *__restrict__ wd, int64_t N, int64_t K,
           int M, const float *__restrict__ x, float *__restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t n_raw = (int64_t)blockIdx.x * Q8F_WARPS + threadIdx.x / 32;
    const int64_t n = n_raw < N ? n_raw : N - 1;
    const int m0 = blockIdx.y * MT, mv = M - m0 < MT ? M - m0 : MT;
    const int64_t nb = K / 32;
    float acc[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i] = 0.0f;
    for (int64_t b = lane; b < nb; b += 32) {
        const uint4 *wp = (const uint4 *)(wq + n * K + b * 32);
        const uint4 w0 = __ldg(wp), w1 = __ldg(wp + 1);
        const uint32_t wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        const float d = __ldg(wd + n * nb + b);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const int mrow = m0 + (i < mv ? i : mv - 1);
            const float4 *xp = (const float4 *)(x + (int64_t)mrow * K + b * 32);
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float4 xv = __ldg(xp + k);
                const uint32_t q = wv[k];
                s = __fmaf_rn((float)(int8_t)(q & 0xff), xv.x, s);
                s = __fmaf_rn((float)(int8_t)((q >> 8) & 0xff), xv.y, s);
                s = __fmaf_rn((float)(int8_t)((q >> 16) & 0xff), xv.z, s);
                s = __fmaf_rn((float)(int8_t)(q >> 24), xv.w, s);
            }
            acc[i] = __fmaf_rn(d, s, acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < MT; i++) {
        float a = acc[i];
#pragma unroll
        for (int o = 16; o >= 1; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0 && n_raw < N && i < mv) y[(int64_t)(m0 + i) * N + n] = a;
    }
}

template <int MT>
static void q8f_launch(ds_exec *ex, const dsc_weight *w, int M, const float *x, float *y) {
    const dim3 grid(dsc_blocks(w->n_out, Q8F_WARPS), (unsigned)((M + MT - 1) / MT));
    q8f_kernel<MT><<<grid, 32 * Q8F_WARPS, 0, ex->st>>>((const int8_t *)w->data, w->scale,
                                                      w->n_out, w->n_in, M, x, y);
    DSC_LAUNCHED(ex, "matmul_q8_0 fast");
}

/* ==========================================================================
 * entry point
 * ========================================================================== */
/* In-kernel quantization pays only where a launch saved is worth more than
 * the staging every block repeats: rows of at most 1024 and a grid of at
 * most one wave (measured on the H200: on the 0.6B shape's 4748-block LM
 * head and in 512-token prefill it cost 30% and 2.8x). */
static bool q8v_fq_ok(ds_exec *ex, int n, const dsc_weight *const w[], int M) {
    const int64_t nb = w[0]->n_in / 32;
    if (nb > Q8V_FQ_MAXNB || (dsc_be(ex)->off & DSC_OFF_FQ)) return false;
    const int RB = 8 * Q8V_R;                      /* WK = 1 below 33 blocks */
    int64_t blocks = 0;
    for (int i = 0; i < n; i++) blocks += (w[i]->n_out + RB - 1) / RB;
    const int MT = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8;
    blocks *= (M + MT - 1) / MT;
    return blocks <= dsc_be(ex)->n_sm;
}

static void q8v_dispatch(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq,
                         const float *xd, const float *xf, const float *xu, float *hout,
                         float *const y[], const q8v_epi &epi) {
    if (M <= 1) q8v_launch<1>(ex, n, w, M, xq, xd, xf, xu, hout, y, epi);
    else if (M <= 2) q8v_launch<2>(ex, n, w, M, xq, xd, xf, xu, hout, y, epi);
    else if (M <= 4) q8v_launch<4>(ex, n, w, M, xq, xd, xf, xu, hout, y, epi);
    else q8v_launch<8>(ex, n, w, M, xq, xd, xf, xu, hout, y, epi);
}

/* ==========================================================================
 * CANONICAL, streamed by warps (M <= 8: decode, verify, the drafter's block)
 * ==========================================================================
 * Decode is bound by the weight stream (8 GB a token on the 8B shape), and
 * q8v_kernel above reaches ~40% of the copy bandwidth (211 tok/s against
 * ~530 for the bytes). The suspects, none measured one by one: each lane's
 * two 16-byte loads of a block are 32 bytes apart (every load instruction
 * touches 32 sectors and uses half of each); a block's threads meet at two
 * barriers per tile, and at M = 1 only 8 of its 256 threads run the tile's
 * 128-fma chains while the rest wait; 32 KB a block in flight. Here every
 * warp works alone (no block barrier at all) on R weight rows:
 *
 *   loads   a group of U segments of 512 bytes of each row: lane l takes the
 *           16 bytes at 512 s + 16 l (one fully coalesced 512-byte request a
 *           row and segment, L1 bypassed), the weight block scales beside
 *           them; U x R x 512 bytes of one warp in flight at once, a warp
 *           per R rows, up to 32 warps an SM (64 registers).
 *   dots    lane 2j + h holds half h of block j of the segment: 4 dp4a per
 *           activation row give a half dot, one xor-shuffle adds the pair's
 *           halves: D, the exact integer block dot (integers: any order).
 *           Lane 2j writes (float)D, lane 2j + 1 the scale product
 *           d_b * e_b (__fmul_rn(d, e), q8v's operand order) to the warp's
 *           shared rows, one row per (weight row, activation row) chain.
 *           FB (a whole block per lane, the 3..8-row configurations):
 *           segments u and u + 1 are taken together, lane 2j + h trades
 *           its half of one for its partner's half of the other (one
 *           16-byte shuffle per row), dots all of block j of segment u + h
 *           (8 dp4a) and writes its ((float)D, d_b * e_b) pair itself.
 *   next    the group's registers are free again: the loads of the next
 *           group are issued into them now, and fly during ...
 *   chain   lane c = r * MT + m (one lane per output of the warp) folds the
 *           group's blocks IN BLOCK ORDER: acc = fma((float)D, d_b * e_b,
 *           acc), one rounding per block, acc from +0, exactly q8v's and
 *           the CPU's sequence.
 *
 * The weights are read in their upload layout (int8 rows of K bytes, rows
 * 16-byte aligned since K % 32 == 0; f32 scales [N][K / 32]); segments past
 * K (the last group, K not a multiple of 512 or of 512 U) load nothing and
 * are never folded (a block is in K iff both of its halves are). Rows past
 * N repeat row N - 1 and are never stored; activation rows past M repeat row
 * M - 1 and are never stored.
 *
 * ==== Why its bits are the canonical bits ===============================================
 * Per output (m, n) the kernel computes, for b = 0, 1, ..., nb - 1 in that
 * order, acc = __fmaf_rn((float)D_b, __fmul_rn(d_b, e_b), acc) from acc =
 * +0, with D_b the exact int32 dot of the weight block and the Q8_0 block of
 * the same activation bytes q8v reads (q8_quantize or the producer's dsc_q8x
 * copy). D_b is an integer (|D_b| <= 2^19: (float)D_b exact) whichever lanes
 * summed it; the chain is one lane's, in block order, across groups. That is
 * q8v_kernel's sequence operation for operation, hence decode's and the
 * CPU's (kernels/cpu/matmul_q8_0.c); R, U, the grid and M choose speed only.
 * DSPARK_CUDA_OFF=gemv runs q8v_kernel instead (an A/B; the same bits). */
#define Q8W_WARPS 4                      /* warps per block (no block barrier: any)   */

/* 16 bytes of a weight row, read once: not kept in L1 (the stream would only
 * evict the activations, which every warp reads) */
__device__ __forceinline__ uint4 q8w_ld16(const int8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
__device__ __forceinline__ float q8w_ldf(const float *p) {
    float v;
    asm volatile("ld.global.nc.L1::no_allocate.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
/* 16 bytes from lane ^ 1 (every lane of the warp calls it) */
__device__ __forceinline__ uint4 q8w_shfl_xor1(uint4 v) {
    return make_uint4(__shfl_xor_sync(0xffffffffu, v.x, 1), __shfl_xor_sync(0xffffffffu, v.y, 1),
                      __shfl_xor_sync(0xffffffffu, v.z, 1), __shfl_xor_sync(0xffffffffu, v.w, 1));
}
/* the exact dot of 16 int8 pairs (integers: any order) */
__device__ __forceinline__ int q8w_dot16(uint4 w, uint4 x) {
    int d = __dp4a((int)w.x, (int)x.x, 0);
    d = __dp4a((int)w.y, (int)x.y, d);
    d = __dp4a((int)w.z, (int)x.z, d);
    return __dp4a((int)w.w, (int)x.w, d);
}

template <int MT, int R, int U>
struct q8w_cfg {
    static constexpr int C = R * MT;           /* chains (outputs) per warp: lanes 0..C-1 */
    static constexpr int PC = 32 * U + 2;      /* floats per chain row: (D, d*e) per block of the group;
                                                  + 2: chain c's row starts in bank 2c (conflict-free
                                                  8-byte reads across the chain lanes) */
    static constexpr int SMEM = Q8W_WARPS * C * PC * 4;
    static_assert(C <= 32, "a chain per lane");
    static_assert(U % 2 == 0, "FB pairs the segments");
    static_assert(SMEM <= 48 * 1024, "static shared memory");
};

/* One warp's R weight rows nbase .. nbase + R - 1 of a weight (wq, wd: its
 * quants and scales, N rows of K) against M <= MT quantized activation rows
 * (xq, xd), into y [M][N]; S: the warp's C * PC floats of shared memory.
 * The whole of the warp GEMV's arithmetic: q8w_kernel runs it for a row
 * group of its weight set, q8i_kernel (matmul_id, below) for an
 * assignment's expert — the same instructions, so the same bits. */
template <int MT, int R, int U, bool FB>
__device__ __forceinline__ void q8w_rows(const int8_t *__restrict__ wq, const float *__restrict__ wd, int64_t N,
                                         int64_t nbase, int64_t K, int M, const int8_t *__restrict__ xq,
                                         const float *__restrict__ xd, float *__restrict__ y, float *S, int lane) {
    using C = q8w_cfg<MT, R, U>;
    const int64_t nb = K / 32, nseg = (K + 511) / 512;

    /* this lane's 16 bytes in each row, its block (2 lanes a block) */
    const int8_t *wrow[R];
    const float *wsrow[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t n = nbase + r < N ? nbase + r : N - 1;
        wrow[r] = wq + n * K + 16 * lane;
        wsrow[r] = wd + n * nb + (lane >> 1);
    }
    uint4 wv[R][U];
    float wsv[R][U];
    /* issue group s0's loads (segments s0 .. s0 + U - 1) */
    auto load = [&](int64_t s0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t seg = s0 + u;
            const bool ok = seg * 512 + 16 * lane < K;       /* => the whole 16 bytes, and the block */
#pragma unroll
            for (int r = 0; r < R; r++) {
                wv[r][u] = ok ? q8w_ld16(wrow[r] + seg * 512) : make_uint4(0, 0, 0, 0);
                if (!FB) {
                    wsv[r][u] = ok ? q8w_ldf(wsrow[r] + seg * 16) : 0.0f;
                } else if (u % 2 == 0) {     /* FB: the scale of this lane's block, in segment seg + h */
                    const int64_t sb = seg + (lane & 1);
                    wsv[r][u] = sb * 512 + 32 * (lane >> 1) < K ? q8w_ldf(wsrow[r] + sb * 16) : 0.0f;
                } else {
                    wsv[r][u] = 0.0f;
                }
            }
        }
    };
    load(0);                    /* weights: never written, so before the wait */
    dsc_pdl_wait();
    dsc_pdl_trigger();

    /* the chain lane's output */
    const int cr = lane / MT, cm = lane % MT;
    float acc = 0.0f;
    const int8_t *xrow[MT];
    const float *xdrow[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        const int64_t mr = m < M ? m : M - 1;
        xrow[m] = xq + mr * K + 16 * lane;
        xdrow[m] = xd + mr * nb + (lane >> 1);
    }
    for (int64_t s0 = 0; s0 < nseg; s0 += U) {
        /* dots of the group: (float)D and d * e per (row, activation row, block) */
        if (FB) {
            /* segments u, u + 1 at once: lane 2j + h trades its half of one
             * segment for its partner's half of the other (one shuffle of 16
             * bytes per row), so it holds all of block j of segment u + h,
             * and dots it whole (8 dp4a per activation row, no shuffle of
             * the dots, (float)D and d * e once per block) */
            const int h = lane & 1, j = lane >> 1;
#pragma unroll
            for (int u = 0; u < U; u += 2) {
                const int64_t sown = s0 + u + h;
                const bool okb = sown * 512 + 32 * j < K;         /* this lane's block is in K */
                uint4 lo[R], hi[R];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const uint4 a = wv[r][u], b = wv[r][u + 1];
                    const uint4 got = q8w_shfl_xor1(h ? a : b);
                    lo[r] = h ? got : a;          /* bytes 0..15 of the block  */
                    hi[r] = h ? b : got;          /* bytes 16..31              */
                }
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const int8_t *xp = xrow[m] - 16 * lane + sown * 512 + 32 * j;
                    const uint4 x0 = okb ? __ldg((const uint4 *)xp) : make_uint4(0, 0, 0, 0);
                    const uint4 x1 = okb ? __ldg((const uint4 *)(xp + 16)) : make_uint4(0, 0, 0, 0);
                    const float xs = okb ? __ldg(xdrow[m] - (lane >> 1) + sown * 16 + j) : 0.0f;
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const int D = dsc_dot_q8(lo[r], hi[r], x0, x1);
                        *(float2 *)(S + (r * MT + m) * C::PC + 2 * ((u + h) * 16 + j)) =
                            make_float2((float)D, __fmul_rn(wsv[r][u], xs));
                    }
                }
            }
        } else {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t seg = s0 + u;
            const bool ok = seg * 512 + 16 * lane < K;
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const uint4 xv = ok ? __ldg((const uint4 *)(xrow[m] + seg * 512)) : make_uint4(0, 0, 0, 0);
                const float xs = ok ? __ldg(xdrow[m] + seg * 16) : 0.0f;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int p = q8w_dot16(wv[r][u], xv);
                    const int D = p + __shfl_xor_sync(0xffffffffu, p, 1);
                    const float v = (lane & 1) ? __fmul_rn(wsv[r][u], xs) : (float)D;
                    S[(r * MT + m) * C::PC + u * 32 + lane] = v;
                }
            }
        }
        }
        /* the next group's loads, into the registers just read */
        if (s0 + U < nseg) load(s0 + U);
        __syncwarp();
        /* the chains: block s0 * 16 + t at (S[2t], S[2t + 1]) of the chain's row, in order */
        if (lane < C::C) {
            const float2 *row = (const float2 *)(S + lane * C::PC);
            const int nv = nb - s0 * 16 < 16 * U ? (int)(nb - s0 * 16) : 16 * U;
#pragma unroll 8
            for (int t = 0; t < nv; t++) {
                const float2 dv = row[t];
                acc = __fmaf_rn(dv.x, dv.y, acc);
            }
        }
        __syncwarp();           /* the rows are read before the next group writes them */
    }
    if (lane < C::C && cm < M && nbase + cr < N) y[(int64_t)cm * N + nbase + cr] = acc;
}

/* MINB: blocks an SM the registers are sized for (8: 32 warps, 64
 * registers, the configurations that fit them without spilling) */
template <int MT, int R, int U, int MINB, bool FB>
__global__ void __launch_bounds__(32 * Q8W_WARPS, MINB)
q8w_kernel(const q8v_set set, int64_t K, int M, const int8_t *__restrict__ xq, const float *__restrict__ xd) {
    using C = q8w_cfg<MT, R, U>;
    __shared__ __align__(16) float q8w_smem[Q8W_WARPS * C::C * C::PC];
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const unsigned g = blockIdx.x * Q8W_WARPS + warp;          /* this warp's row group */
    if (g >= set.blk0[Q8V_MAXW]) return;                      /* whole warps: no barrier below */
    int wi = 0;
#pragma unroll
    for (int i = 1; i < Q8V_MAXW; i++) wi += g >= set.blk0[i];
    q8w_rows<MT, R, U, FB>(set.wq[wi], set.wd[wi], set.N[wi], (int64_t)(g - set.blk0[wi]) * R, K, M, xq, xd,
                           set.y[wi], q8w_smem + warp * (C::C * C::PC), lane);
}

/* ==========================================================================
 * CANONICAL by expert id (backend.h matmul_id: MoE decode and short verify)
 * ==========================================================================
 * Assignment i (blockIdx.x) reads its expert e = ids[i] on the device and
 * runs decode's configuration of the warp GEMV (q8w_dispatch at M = 1:
 * MT = 1, R = 1, U = 4, half a block per lane) on activation row i / xk:
 * q8w_rows, the very instructions of the M = 1 matmul, on that expert's
 * quants and scales. So y[i] is the one-row canonical matmul's bits, which
 * are row i's bits in the host path's grouped matmul of any M (the
 * canonical rows are M-invariant: every Q8_0 canonical kernel computes the
 * same chain). The experts' buffers come from the array's device table
 * (moe.cu dsc_moe_id_prepare: data pointers, then scale pointers); an id
 * outside [0, n_exp) (a device fault upstream) reads expert 0, never past
 * the table. The ids are the route's output, so the wait for the previous
 * kernel comes before the first weight load here, not after it.
 * The assignment is the grid's fastest index: the blocks of one row group
 * of every assignment run side by side, so assignments that chose the same
 * expert (rows of a verify block often do) read its rows at about the same
 * time, the later reads from L2 — memory traffic close to the grouping's
 * one read per distinct expert, without grouping anything. Which block
 * computes a row never changes its chain. */
struct q8i_set {
    const void *const *tab[2];          /* device: [n_exp] quants, then [n_exp] scales */
    float  *y[2];                       /* [A][N[w]]                                    */
    int64_t N[2];
    unsigned blk0[3];                   /* array w's row groups: blk0[w] <= g < blk0[w + 1] */
    int     n_exp, xk;
};

__global__ void __launch_bounds__(32 * Q8W_WARPS, 8)
q8i_kernel(const q8i_set set, int64_t K, const int32_t *__restrict__ ids, const int8_t *__restrict__ xq,
           const float *__restrict__ xd) {
    using C = q8w_cfg<1, 1, 4>;
    __shared__ __align__(16) float q8i_smem[Q8W_WARPS * C::C * C::PC];
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const unsigned g = blockIdx.y * Q8W_WARPS + warp;
    if (g >= set.blk0[2]) return;                             /* whole warps: no barrier below */
    /* the array by selection, not by an index into the arguments (which
     * would copy them to local memory) */
    const bool w1 = g >= set.blk0[1];
    const void *const *tab = w1 ? set.tab[1] : set.tab[0];
    const int64_t N = w1 ? set.N[1] : set.N[0];
    float *y = w1 ? set.y[1] : set.y[0];
    const unsigned g0 = w1 ? set.blk0[1] : 0u;
    const int i = blockIdx.x;
    dsc_pdl_wait();                                           /* the route's ids */
    int e = __ldg(ids + i);
    if (e < 0 || e >= set.n_exp) e = 0;
    const int8_t *wq = (const int8_t *)tab[e];
    const float *wd = (const float *)tab[set.n_exp + e];
    const int64_t r = i / set.xk;
    q8w_rows<1, 1, 4, false>(wq, wd, N, (int64_t)(g - g0), K, 1, xq + r * K, xd + r * (K / 32), y + (int64_t)i * N,
                             q8i_smem + warp * (C::C * C::PC), lane);
}

/* One launch for the n weights (one K): a warp per R rows of each. */
template <int MT, int R, int U, int MINB, bool FB>
static void q8w_launch(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq, const float *xd,
                       float *const y[]) {
    q8v_set set;
    memset(&set, 0, sizeof set);
    unsigned groups = 0;
    for (int i = 0; i < Q8V_MAXW; i++) {
        if (i >= n) {
            set.blk0[i] = 0xffffffffu;
            continue;
        }
        set.blk0[i] = groups;
        set.wq[i] = (const int8_t *)w[i]->data;
        set.wd[i] = w[i]->scale;
        set.y[i] = y[i];
        set.N[i] = w[i]->n_out;
        groups += dsc_blocks(w[i]->n_out, R);
    }
    set.blk0[Q8V_MAXW] = groups;
    dsc_launch(ex, "matmul_q8_0 canonical (warp GEMV)", q8w_kernel<MT, R, U, MINB, FB>, dim3(dsc_blocks(groups, Q8W_WARPS)),
               dim3(32 * Q8W_WARPS), 0, set, w[0]->n_in, M, xq, xd);
}

/* 1 when q8w_kernel takes these quantized rows: M <= 8 and not switched off */
/* One or two activation rows only: on the H200 (bench_gemv, 8B shapes, L2
 * cold; bench/results/cuda-gemv-h200-s31.txt) q8w takes 0.77-0.87x the old
 * kernel's time at M = 1 (the LM head at 95% of the copy bandwidth) and
 * 0.86-0.94x at M = 2 on the large shapes, but at M = 4 and 8 its default
 * configurations were slower than q8v (up to 2x) and the best of the five
 * others won only on some shapes: verify blocks keep q8v. */
static bool q8w_ok(ds_exec *ex, int n, int M) {
    return M >= 1 && M <= 2 && n >= 1 && n <= Q8V_MAXW && !(dsc_be(ex)->off & DSC_OFF_GEMV);
}

/* The configurations (MT, R, U, MINB, FB), chosen from the registers each
 * needs (nvcc -Xptxas -v: none spills) and from what stays in flight, not
 * yet from measurements: at one or two activation rows a row per warp and 4
 * segments (2 KiB of one warp in flight, 32 warps an SM), half a block per
 * lane; at 3..8 rows two rows per warp (the activation words loaded once
 * for both; the chains of both rows in the same instructions), 2 segments,
 * 24 warps an SM, and a whole block per lane (FB: the per-row-and-block
 * work, dot shuffle, conversion, scale product, store, once per block
 * instead of once per half). The same bits in every one
 * (tests/cuda/bench_gemv.cu checks and times the others). */
static void q8w_dispatch(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq, const float *xd,
                         float *const y[]) {
    if (M <= 1) q8w_launch<1, 1, 4, 8, false>(ex, n, w, M, xq, xd, y);
    else if (M <= 2) q8w_launch<2, 1, 4, 8, false>(ex, n, w, M, xq, xd, y);
    else if (M <= 4) q8w_launch<4, 2, 2, 6, true>(ex, n, w, M, xq, xd, y);
    else q8w_launch<8, 2, 2, 6, true>(ex, n, w, M, xq, xd, y);
}

/* ==========================================================================
 * activations quantized by their producer (dsc_q8x, cuda_internal.cuh)
 * ========================================================================== */
/* The slot's layout: M x K quants (rounded up to 256 bytes), then the
 * M x K/32 scales — the layout q8v_run quantizes into itself. */
static char *q8x_slot(ds_exec *ex, int M, int64_t K, int8_t **q, float **d) {
    const size_t qbytes = ((size_t)M * (size_t)K + 255) & ~(size_t)255;
    char *mem = (char *)dsc_scratch(ex, DSC_SLOT_Q8_ACT, qbytes + (size_t)M * (size_t)(K / 32) * sizeof(float));
    if (mem) {
        *q = (int8_t *)mem;
        *d = (float *)(mem + qbytes);
    }
    return mem;
}

int dsc_q8x_reserve(ds_exec *ex, int M, int64_t K, int8_t **q, float **d) {
    const dsc_backend *b = dsc_be(ex);
    if (!b->q8_layout || (b->off & DSC_OFF_Q8X) || M <= 0 || K <= 0 || K % 32) return 0;
    return q8x_slot(ex, M, K, q, d) != NULL;
}

void dsc_q8x_publish(ds_exec *ex, const float *x, int M, int64_t K, const int8_t *q, const float *d) {
    ex->q8x.x = x;
    ex->q8x.M = M;
    ex->q8x.K = K;
    ex->q8x.q = q;
    ex->q8x.d = d;
    ex->q8x.seq = ex->n_ops;
}

static bool q8x_valid(const ds_exec *ex, const float *x, int M, int64_t K) {
    return ex->q8x.x == x && ex->q8x.M == M && ex->q8x.K == K && ex->q8x.seq == ex->n_ops &&
           !(dsc_be(ex)->off & DSC_OFF_Q8X);
}

int ds_exec_cuda_q8x_peek(ds_exec *ex, const float *x, int M, int64_t K, const void **q, const void **d) {
    if (!q8x_valid(ex, x, M, K)) return 0;
    *q = ex->q8x.q;
    *d = ex->q8x.d;
    return 1;
}

/* Canonical: the rows' Q8_0 copy made by their producer when there is one;
 * else quantize them (inside the integer kernel for short rows, else one
 * launch first, whose result later matmuls of the same rows reuse); then
 * one integer launch for all n weights (n = 1: plain matmul; n > 1:
 * matmul_multi, weights of one K). */
static void q8v_run(ds_exec *ex, int n, const dsc_weight *const w[], int M, const float *x,
                    float *const y[], const q8v_epi &epi) {
    const int64_t K = w[0]->n_in, nq = (int64_t)M * (K / 32);
    int8_t *xq = NULL;
    float *xd = NULL;
    /* batches past 8 rows: the tensor cores (matmul_q8_0_mma.cu), the same
     * bits; they need the quantized rows in memory (no in-kernel FQ) and
     * have no residual epilogue */
    const bool st = !epi.x && dsc_q8_stream_ok(ex, n, w, M);
    const int bm = epi.x || st ? 0 : dsc_q8_mma_bm(ex, n, w, M);
    if (q8x_valid(ex, x, M, K)) {
        ex->q8x_hits++;
        xq = (int8_t *)ex->q8x.q;
        xd = (float *)ex->q8x.d;
    } else if (bm || st || !q8v_fq_ok(ex, n, w, M)) {  /* quantize once, for all blocks */
        if (!q8x_slot(ex, M, K, &xq, &xd)) return;
        dsc_launch(ex, "q8_0 quantize", q8_quantize, dim3(dsc_blocks(nq, 128)), dim3(128), 0, x, nq, xq, xd);
    }
    if (bm) dsc_q8_mma(ex, bm, n, w, M, xq, xd, y);
    else if (xq && st) dsc_q8_stream(ex, n, w, M, xq, xd, y);
    else if (xq && !epi.x && q8w_ok(ex, n, M)) q8w_dispatch(ex, n, w, M, xq, xd, y);
    else q8v_dispatch(ex, n, w, M, xq, xd, x, NULL, NULL, y, epi);
    /* the copy stays good for the next matmul of the same rows (the launch
     * above read it, wrote only y) — unless y is x's own buffer */
    bool aliased = false;
    for (int i = 0; i < n; i++) aliased = aliased || y[i] == x;
    if (xq && !epi.x && !aliased) dsc_q8x_publish(ex, x, M, K, xq, xd);
}

void dsc_matmul_q8_0(ds_exec *ex, ds_variant v, const dsc_weight *w, int M, const float *x,
                     float *y) {
    if (M <= 0 || w->n_out <= 0 || w->n_in <= 0) return;
    if (v == DS_FAST && ((uintptr_t)x & 15) == 0) {
        if (M <= 1) q8f_launch<1>(ex, w, M, x, y);
        else if (M <= 2) q8f_launch<2>(ex, w, M, x, y);
        else if (M <= 4) q8f_launch<4>(ex, w, M, x, y);
        else q8f_launch<8>(ex, w, M, x, y);
        return;
    }
    const q8v_epi none = {};
    q8v_run(ex, 1, &w, M, x, &y, none);
}

/* matmul_multi for Q8_0 canonical weights of one K: one quantization of x and
 * one launch. Returns 0 when it does not apply (the caller loops). */
int dsc_matmul_q8_0_multi(ds_exec *ex, ds_variant v, int n, const dsc_weight *const w[], int M,
                          const float *x, float *const y[]) {
    if (v == DS_FAST || n < 1 || n > Q8V_MAXW || M <= 0 || (dsc_be(ex)->off & DSC_OFF_MULTI)) return 0;
    for (int i = 0; i < n; i++)
        if (w[i]->type != DS_TYPE_Q8_0 || w[i]->n_in != w[0]->n_in || w[i]->n_out <= 0 || w[i]->n_in <= 0)
            return 0;
    const q8v_epi none = {};
    q8v_run(ex, n, w, M, x, y, none);
    return 1;
}

/* y = W in, in = x or (up given) swiglu(x, up) written to h; then, with
 * res: res += y, xn = rmsnorm(res) * nw (the epilogue above). Canonical;
 * SwiGLU only for rows short enough for the in-kernel quantization.
 * Returns 0 when it does not apply (nothing issued). */
int dsc_matmul_q8_0_fused(ds_exec *ex, const dsc_weight *w, int M, const float *x, const float *up,
                          float *h, float *y, float *res, const float *nw, float eps, float *xn) {
    if (w->type != DS_TYPE_Q8_0 || M <= 0 || w->n_out <= 0 || w->n_in <= 0) return 0;
    const bool fq_ok = q8v_fq_ok(ex, 1, &w, M);
    /* SwiGLU in front needs the in-kernel quantization of the GEMV; where
     * the tensor cores take the rows the caller runs the two ops */
    if (up && (!fq_ok || dsc_q8_mma_bm(ex, 1, &w, M) || dsc_q8_stream_ok(ex, 1, &w, M))) return 0;
    q8v_epi epi = {};
    if (res) {
        if (!nw || !xn || !ex->count || w->n_out > 8192) return 0;
        epi.x = res; epi.w = nw; epi.eps = eps; epi.xn = xn; epi.count = ex->count;
    }
    if (up) {
        q8v_dispatch(ex, 1, &w, M, NULL, NULL, x, up, h, &y, epi);
        DSC_LAUNCHED(ex, "matmul_q8_0 canonical (swiglu in)");
    } else {
        q8v_run(ex, 1, &w, M, x, &y, epi);
    }
    return 1;
}

/* matmul_id for Q8_0 expert arrays (moe.cu checked them: n <= 2 arrays of
 * one K, each with its device table): the activation rows quantized once
 * (or their producer's copy, dsc_q8x), then one launch for every
 * assignment of every array. */
void dsc_matmul_id_q8_0(ds_exec *ex, int n, const dsc_weight *const w0[], int n_exp, int A, const int32_t *ids, int xk,
                        const float *x, float *const y[]) {
    const int64_t K = w0[0]->n_in;
    const int Mx = A / xk;
    int8_t *xq = NULL;
    float *xd = NULL;
    if (q8x_valid(ex, x, Mx, K)) {
        ex->q8x_hits++;
        xq = (int8_t *)ex->q8x.q;
        xd = (float *)ex->q8x.d;
    } else {
        const int64_t nq = (int64_t)Mx * (K / 32);
        if (!q8x_slot(ex, Mx, K, &xq, &xd)) return;
        dsc_launch(ex, "q8_0 quantize", q8_quantize, dim3(dsc_blocks(nq, 128)), dim3(128), 0, x, nq, xq, xd);
    }
    q8i_set set;
    memset(&set, 0, sizeof set);
    unsigned groups = 0;
    for (int i = 0; i < 2; i++) {
        set.blk0[i] = groups;
        if (i >= n) continue;
        set.tab[i] = (const void *const *)w0[i]->id_tab;
        set.y[i] = y[i];
        set.N[i] = w0[i]->n_out;
        groups += (unsigned)w0[i]->n_out;                 /* R = 1: a warp per row */
    }
    set.blk0[2] = groups;
    set.n_exp = n_exp;
    set.xk = xk;
    dsc_launch(ex, "matmul_q8_0 canonical (by expert id)", q8i_kernel, dim3((unsigned)A, dsc_blocks(groups, Q8W_WARPS)),
               dim3(32 * Q8W_WARPS), 0, set, K, ids, (const int8_t *)xq, (const float *)xd);
    bool aliased = false;
    for (int i = 0; i < n; i++) aliased = aliased || y[i] == x;
    if (!aliased) dsc_q8x_publish(ex, x, Mx, K, xq, xd);
}

/* The in-kernel quantization stages M x K floats: up to 80 KB of shared
 * memory per block at MT = 8, past the 48 KB a launch gets without asking.
 * Asked once, when the backend starts. */
cudaError_t dsc_matmul_q8_0_init(void) {
    const int bytes = Q8V_SMEM_MAX;
    cudaError_t e = cudaFuncSetAttribute(q8v_kernel<1, true, Q8V_R>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(q8v_kernel<2, true, Q8V_R>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(q8v_kernel<4, true, Q8V_R>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(q8v_kernel<8, true, Q8V_R>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(q8v_kernel<1, true, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(q8v_kernel<2, true, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(q8v_kernel<4, true, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(q8v_kernel<8, true, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    return e;
}
