/* swiglu.cu — SwiGLU family on the GPU: out = silu(gate) * up, elementwise.
 *
 *   decode     canonical with rows = 1.
 *   canonical  out = (g / (1 + ds_expf(-g))) * up: one IEEE division, the
 *              project-owned exp (kernels/dsmath.h), one product.
 *   fast       __expf (the hardware approximation) and a fast division.
 *
 * ==== Why the bits match the CPU (or do not) ================================================
 * Elementwise, no reduction: only the exponential decides. The CPU's
 * canonical kernel (kernels/cpu/swiglu.c) calls libm expf today, which no GPU
 * reproduces; with the CPU on ds_expf (a separate change, issue 9's report)
 * the two are the same function of the input bits. */
#include "kernels/cuda/cuda_internal.cuh"

/* With q (dsc_q8x; rows of whole blocks, so every warp is one block of one
 * row, 256-thread blocks): the warp's 32 outputs quantized as well. */
__global__ void swiglu_canonical(int64_t total, const float *__restrict__ g,
                                 const float *__restrict__ u, float *o, int8_t *__restrict__ q,
                                 float *__restrict__ qd) {
    dsc_pdl_wait();                               /* dsc_launch */
    dsc_pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;                       /* whole warps (total % 32 == 0 with q) */
    const float v = dsc_swiglu_canonical(g[i], u[i]);
    o[i] = v;
    if (q) {
        const float d = dsc_q8_block_warp(v, threadIdx.x & 31, q + (i & ~(int64_t)31));
        if ((threadIdx.x & 31) == 0) qd[i / 32] = d;
    }
}

__global__ void swiglu_fast(int64_t total, const float *__restrict__ g,
                            const float *__restrict__ u, float *o) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const float x = g[i];
    o[i] = __fdividef(x, 1.0f + __expf(-x)) * u[i];
}

void dsc_swiglu(ds_exec *ex, ds_variant v, int rows, int n, const float *gate, const float *up,
                float *out) {
    if (rows <= 0 || n <= 0) return;
    const int64_t total = (int64_t)rows * n;
    if (v == DS_FAST) {
        swiglu_fast<<<dsc_blocks(total, 256), 256, 0, ex->st>>>(total, gate, up, out);
        DSC_LAUNCHED(ex, "swiglu");
        return;
    }
    int8_t *q = NULL;                             /* the down projection's Q8_0 input */
    float *qd = NULL;
    if (!dsc_q8x_reserve(ex, rows, n, &q, &qd)) q = NULL;
    dsc_launch(ex, "swiglu", swiglu_canonical, dim3(dsc_blocks(total, 256)), dim3(256), 0, total, gate, up, out, q, qd);
    if (q) dsc_q8x_publish(ex, out, rows, n, q, qd);
}

/* SwiGLU then a matmul of its output (backend.h: swiglu_matmul): Q8_0
 * canonical rows short enough to be quantized inside the integer kernel
 * compute h there, from gate and up, with the same canonical element (and
 * write it, as the separate launch would). Else the two calls. */
int dsc_swiglu_matmul(ds_exec *ex, ds_variant vsw, ds_variant vmm, const ds_weight *W, int M,
                      const float *gate, const float *up, float *h, float *y) {
    const dsc_weight *w = dsc_w(W);
    /* M <= 2 only: every block of the down projection recomputes the M x K
     * SwiGLU elements, which past two rows costs more than the launch it
     * saves (measured on the H200: verify(8) slower) */
    if (M <= 0 || M > 2 || !w || vsw == DS_FAST || vmm == DS_FAST || (dsc_be(ex)->off & DSC_OFF_SWIGLU)) return 1;
    return dsc_matmul_q8_0_fused(ex, w, M, gate, up, h, y, NULL, NULL, 0.0f, NULL) ? 0 : 1;
}

/* backend.h's matmul_res: the matmul (SwiGLU in front when asked, as
 * above), then the residual epilogue in the same launch (matmul_q8_0.cu).
 * Canonical variants only; declined otherwise. */
int dsc_matmul_res(ds_exec *ex, const ds_matmul_res *a) {
    const dsc_weight *w = dsc_w(a->W);
    if (!w || a->M <= 0 || a->vmm == DS_FAST || a->vres == DS_FAST || a->vnorm == DS_FAST ||
        (dsc_be(ex)->off & DSC_OFF_EPILOGUE))
        return 1;
    if (a->up && (a->vsw == DS_FAST || a->M > 2 || (dsc_be(ex)->off & DSC_OFF_SWIGLU))) return 1;
    return dsc_matmul_q8_0_fused(ex, w, a->M, a->x, a->up, a->h, a->y, a->res, a->norm_w, a->eps, a->xnorm) ? 0 : 1;
}
