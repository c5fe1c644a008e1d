/* matmul.cu — the dsc_matmul dispatcher: the weight's prepared device layout
 * (ds_weight.extra, backend_cuda.cu) picks the family file:
 * matmul_dense.cu (F32, F16, BF16), matmul_q8_0.cu or matmul_kq.cu (the
 * kquant types). No f32 reduction ever splits K across threads in a
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
