/* rmsnorm.cu — RMSNorm family on the GPU: y = x / sqrt(mean(x^2) + eps) * w per row.
 * y == x is allowed (every element is read before its own slot is written).
 *
 *   decode     canonical with rows = 1.
 *   canonical  the CPU's rmsnorm_row (kernels/cpu/rmsnorm.c): a warp per row;
 *              lanes 0..15 are the 16 lanes of ds_sumsq16 (element i in lane
 *              i mod 16, the n % 16 tail in its own lanes, acc = acc + x*x
 *              rounded twice), the tree 8-4-2-1 through shuffles, then
 *              mean = sum / n, scale = 1 / sqrt(mean + eps) (IEEE division
 *              and square root), y = (x * scale) * w.
 *   fast       a warp per row with 32 interleaved fma partial sums and a
 *              butterfly, rsqrtf, and y = (x * w) * scale.
 *
 * ==== Why canonical is the CPU's bits ==================================================
 * Same operations in the same order on every element and every lane; the
 * division and the square root are correctly rounded on both sides.
 *
 * ==== Why fast differs ==================================================================
 * Another sum order (32 lanes, fused multiply-adds, butterfly), an
 * approximate reciprocal square root, and the weight multiplied first. */
#include "kernels/cuda/cuda_internal.cuh"

#define RMS_WARPS 8

__global__ void rms_canonical(int rows, int n, const float *x, const float *__restrict__ w,
                              float eps, float *y) {
    const int r = blockIdx.x * RMS_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float *xr = x + (int64_t)r * n;
    float *yr = y + (int64_t)r * n;
    const float scale = dsc_rms_scale_canonical(xr, n, eps, lane);
    __syncwarp();
    if (w)
        for (int i = lane; i < n; i += 32) yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
    else
        for (int i = lane; i < n; i += 32) yr[i] = __fmul_rn(xr[i], scale);
}

/* The canonical kernel for decode-sized rows: one block per row. The row is
 * staged in shared memory by all threads at once, then lanes 0..15 of warp
 * 0 run the 16 lane chains from shared memory — the same adds in the same
 * order as dsc_rms_scale_canonical — and every thread writes its outputs.
 * With `add` (the residual family's canonical epilogue fused in one launch)
 * the staged value is x + add, one rounding, also written back to x first.
 *
 * Where the time goes (ncu, 8B decode step, session 34): this launch ran
 * twice a layer at 9.3 us, 17% of the step, for 32 KiB of traffic. Its
 * cost was latency in series: a strided staging loop whose loads could not
 * pass the previous iteration's store to x (one memory round trip per 512
 * elements), then 8 blocks a warp quantized one after another. So: V4
 * rows (n % 4 == 0, 16-byte aligned) stage with every load issued before
 * any store (RMSB_V4 float4 each of x and add per thread, one round trip),
 * and rows past 2048 take 1024 threads, 32 warps for the output blocks.
 * Which thread stages or writes an element moves no bit. */
#define RMSB_MAXN 8192          /* floats staged (32 KiB); longer rows: rms_canonical */
#define RMSB_WPF 16             /* 32-blocks per warp: 8192 / 32 / 16 warps of 512 threads */
#define RMSB_V4 4               /* float4 per thread when staging V4 rows: 8192 / 4 / 512 */
template <bool V4>
__global__ void __launch_bounds__(1024) rms_canonical_block(int n, float *x, const float *__restrict__ add,
                                                            const float *__restrict__ w, float eps, float *y,
                                                            int8_t *__restrict__ q, float *__restrict__ qd) {
    extern __shared__ __align__(16) float rms_row[];
    __shared__ float rms_sc;
    dsc_pdl_wait();                              /* dsc_launch */
    dsc_pdl_trigger();
    const int64_t r = blockIdx.x;
    float *xr = x + r * n;
    float *yr = y + r * n;
    if (V4) {
        /* every load of the row before any store (x is written in place) */
        float4 *x4 = (float4 *)xr, *s4 = (float4 *)rms_row;
        const float4 *a4 = (const float4 *)(add ? add + r * n : NULL);
        const int n4 = n / 4;
        float4 xv[RMSB_V4], av[RMSB_V4];
#pragma unroll
        for (int j = 0; j < RMSB_V4; j++) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i < n4) {
                xv[j] = x4[i];
                if (add) av[j] = __ldg(a4 + i);
            }
        }
#pragma unroll
        for (int j = 0; j < RMSB_V4; j++) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i >= n4) break;
            float4 v = xv[j];
            if (add) {
                v = make_float4(__fadd_rn(v.x, av[j].x), __fadd_rn(v.y, av[j].y), __fadd_rn(v.z, av[j].z),
                                __fadd_rn(v.w, av[j].w));
                x4[i] = v;
            }
            s4[i] = v;
        }
    } else if (add) {
        const float *ar = add + r * n;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = __fadd_rn(xr[i], ar[i]);
            xr[i] = v;
            rms_row[i] = v;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) rms_row[i] = xr[i];
    }
    /* rows of whole 32-blocks write a block per warp (below); this thread's
     * norm weights are loaded now, to arrive during the chains */
    const int nb = n % 32 ? 0 : n / 32, lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    float wreg[RMSB_WPF];
#pragma unroll
    for (int j = 0; j < RMSB_WPF; j++) {
        const int b = warp + j * nw;
        wreg[j] = w && b < nb ? __ldg(w + b * 32 + lane) : 1.0f;
    }
    __syncthreads();
    if (threadIdx.x < 32) {                      /* the chains, from shared memory */
        const float sc = dsc_rms_scale_canonical(rms_row, n, eps, threadIdx.x);
        if (threadIdx.x == 0) rms_sc = sc;
    }
    __syncthreads();
    const float scale = rms_sc;
    if (nb) {
        /* a warp per block of 32 outputs, each lane its element; with the
         * Q8_0 copy (dsc_q8x) the block is quantized as well */
#pragma unroll
        for (int j = 0; j < RMSB_WPF; j++) {
            const int b = warp + j * nw;
            if (b >= nb) break;
            const int i = b * 32 + lane;
            const float v = w ? __fmul_rn(__fmul_rn(rms_row[i], scale), wreg[j]) : __fmul_rn(rms_row[i], scale);
            yr[i] = v;
            if (q) {
                const float d = dsc_q8_block_warp(v, lane, q + r * n + (int64_t)b * 32);
                if (lane == 0) qd[r * nb + b] = d;
            }
        }
        return;
    }
    if (w)
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(rms_row[i], scale), w[i]);
    else
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = __fmul_rn(rms_row[i], scale);
}

/* Canonical rmsnorm of rows x n, optionally after x += add (one launch).
 * Returns 0 when the row is too long for the staged kernel (caller falls back). */
int dsc_rmsnorm_staged(ds_exec *ex, int rows, int n, float *x, const float *add, const float *w,
                       float eps, float *y) {
    if (n > RMSB_MAXN) return 0;
    const int threads = n <= 512 ? 128 : n <= 2048 ? 256 : 1024;
    /* V4: whole float4s, 16-byte aligned rows (RMSB_V4 per thread covers
     * RMSB_MAXN at 512 threads and more) */
    const bool v4 = n % 4 == 0 && n / 4 <= RMSB_V4 * threads &&
                    ((uintptr_t)x | (uintptr_t)(add ? add : x) | (uintptr_t)y) % 16 == 0;
    /* the Q8_0 copy for the matmuls that read y next (not for per-head
     * norms: rows of one head are no matmul's input) */
    int8_t *q = NULL;
    float *qd = NULL;
    if (n < 256 || !dsc_q8x_reserve(ex, rows, n, &q, &qd)) q = NULL;
    dsc_launch(ex, add ? "residual+rmsnorm canonical" : "rmsnorm canonical",
               v4 ? rms_canonical_block<true> : rms_canonical_block<false>, dim3((unsigned)rows), dim3(threads),
               (size_t)n * 4, n, x, add, w, eps, y, q, qd);
    if (q) dsc_q8x_publish(ex, y, rows, n, q, qd);
    return 1;
}

__global__ void rms_fast(int rows, int n, const float *x, const float *__restrict__ w, float eps,
                         float *y) {
    const int r = blockIdx.x * RMS_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float *xr = x + (int64_t)r * n;
    float *yr = y + (int64_t)r * n;
    float a = 0.0f;
    for (int i = lane; i < n; i += 32) a = fmaf(xr[i], xr[i], a);
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
    const float scale = rsqrtf(a / (float)n + eps);
    __syncwarp();
    if (w)
        for (int i = lane; i < n; i += 32) yr[i] = (xr[i] * w[i]) * scale;
    else
        for (int i = lane; i < n; i += 32) yr[i] = xr[i] * scale;
}

void dsc_rmsnorm(ds_exec *ex, ds_variant v, int rows, int n, const float *x, const float *w,
                 float eps, float *y) {
    if (rows <= 0 || n <= 0) return;
    const unsigned grid = dsc_blocks(rows, RMS_WARPS);
    /* the staged kernel notes its own launch (and publishes its Q8_0 copy
     * after it: a second note here would make the copy look stale) */
    if (v != DS_FAST && dsc_rmsnorm_staged(ex, rows, n, (float *)x, NULL, w, eps, y)) return;
    if (v == DS_FAST) rms_fast<<<grid, 32 * RMS_WARPS, 0, ex->st>>>(rows, n, x, w, eps, y);
    else rms_canonical<<<grid, 32 * RMS_WARPS, 0, ex->st>>>(rows, n, x, w, eps, y);
    DSC_LAUNCHED(ex, "rmsnorm");
}
