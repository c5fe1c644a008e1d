/* residual.cu — residual epilogue family on the GPU: x += y (rows x n), then,
 * if w != NULL, xnorm = rmsnorm(x, w, eps).
 *
 *   decode     canonical with rows = 1.
 *   canonical  the add (one rounding per element, any thread), then the
 *              rmsnorm family's kernel of variant vnorm as a separate
 *              launch — the CPU's two steps (kernels/cpu/residual.c).
 *   fast       one fused warp-per-row pass (vLLM's fused_add_rms_norm): the
 *              add and a 32-lane fma sum of squares together, then
 *              x * (scale * w). Taken when vres is fast and there is a norm
 *              to write (or none asked), as on the CPU.
 *
 * ==== Why the bits match / differ =========================================================
 * x is the same single rounding everywhere; canonical's xnorm is rmsnorm's
 * canonical bits (the CPU's); fast's sum order, rsqrtf and product order
 * differ. */
#include "kernels/cuda/cuda_internal.cuh"

#define RES_WARPS 8

__global__ void res_add(int64_t total, float *x, const float *__restrict__ y) {
    dsc_pdl_wait();                              /* dsc_launch */
    dsc_pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void res_fast(int rows, int n, float *x, const float *__restrict__ y,
                         const float *__restrict__ w, float eps, float *xn) {
    const int r = blockIdx.x * RES_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (r >= rows) return;
    float *xr = x + (int64_t)r * n;
    const float *yr = y + (int64_t)r * n;
    float a = 0.0f;
    for (int i = lane; i < n; i += 32) {
        const float v = xr[i] + yr[i];
        xr[i] = v;
        a = fmaf(v, v, a);
    }
    if (!w) return;
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
    const float scale = rsqrtf(a / (float)n + eps);
    __syncwarp();
    float *xnr = xn + (int64_t)r * n;
    for (int i = lane; i < n; i += 32) xnr[i] = xr[i] * (scale * w[i]);
}

void dsc_residual(ds_exec *ex, ds_variant vres, ds_variant vnorm, int rows, int n, float *x,
                  const float *y, const float *w, float eps, float *xnorm) {
    if (rows <= 0 || n <= 0) return;
    if (vres == DS_FAST && (!w || xnorm)) {
        res_fast<<<dsc_blocks(rows, RES_WARPS), 32 * RES_WARPS, 0, ex->st>>>(rows, n, x, y, w, eps,
                                                                          xnorm);
        DSC_LAUNCHED(ex, "residual fast");
        return;
    }
    /* canonical add + canonical norm: one launch, the same two steps per element */
    if (w && xnorm && vnorm != DS_FAST && dsc_rmsnorm_staged(ex, rows, n, x, y, w, eps, xnorm)) return;
    const int64_t total = (int64_t)rows * n;
    dsc_launch(ex, "residual add", res_add, dim3(dsc_blocks(total, 256)), dim3(256), 0, total, x, y);
    if (w && xnorm) dsc_rmsnorm(ex, vnorm, rows, n, x, w, eps, xnorm);
}
