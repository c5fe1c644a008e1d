/* matmul.cu — the dsc_matmul dispatcher: the weight's prepared device layout
 * (ds_weight.extra, backend_cuda.cu) picks the family file:
 * matmul_dense.cu (F32, F16, BF16), matmul_q8_0.cu or matmul_kq.cu (the
 * kquant types); past 8 rows the Q8_0 and K-type canonical batches run on
 * the tensor cores (matmul_q8_0_mma.cu, matmul_kq.cu's kqm_kernel) with
 * the same bits. No f32 reduction ever splits K across threads in a
 * canonical kernel (exact integer partial sums may); which rows share a
 * launch changes speed, never bits (see the family files). */
#include "kernels/cuda/cuda_internal.cuh"

void dsc_matmul(ds_exec *ex, ds_variant v, const ds_weight *W, int M, const float *x, float *y) {
    const dsc_weight *w = dsc_w(W);
    if (!w) {
        dsc_note(ex, cudaErrorInvalidValue, "matmul on a weight that prepare_weight did not upload");
        return;
    }
    if (w->type == DS_TYPE_Q8_0) dsc_matmul_q8_0(ex, v, w, M, x, y);
    else if (ds_type_is_kq(w->type)) dsc_matmul_kq(ex, v, w, M, x, y);
    else dsc_matmul_dense(ex, v, w, M, x, y);
}

/* Weights sharing their input (q/k/v, gate/up) — backend.h's matmul_multi:
 * Q8_0 canonical quantizes x once and runs one launch for all of them; any
 * other case is the n plain calls. Same bits either way (each output row's
 * chain is the plain call's). */
void dsc_matmul_multi(ds_exec *ex, ds_variant v, int n, const ds_weight *const W[], int M,
                      const float *x, float *const y[]) {
    const dsc_weight *w[4];
    int all = n >= 1 && n <= 4;
    for (int i = 0; all && i < n; i++) all = (w[i] = dsc_w(W[i])) != NULL;
    if (all && dsc_matmul_q8_0_multi(ex, v, n, w, M, x, y)) return;
    for (int i = 0; i < n; i++) dsc_matmul(ex, v, W[i], M, x, y[i]);
}
