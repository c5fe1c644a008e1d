/* moe.cu — the mixture-of-experts families on the GPU (qwen3moe / qwen35moe's
 * FFN, layer.c ds_layer_moe_ffn): the router's softmax top-k (moe_route),
 * the weighted sum of a row's k expert outputs (moe_combine) and the gather
 * of the rows into their experts' groups (moe_gather, a copy).
 *
 * moe_route (the family; kernels/cpu/moe_route.c is the reference):
 *   decode     canonical with rows = 1.
 *   canonical  route_row()'s sequence of IEEE operations, one warp per row:
 *              m = the row's max (NaNs skipped), e_i = ds_expf(l_i - m)
 *              (kernels/dsmath.h, the CPU's function), s = e_0 + e_1 + ...
 *              in expert order (one lane, sequentially), p_i = e_i / s
 *              (IEEE division); k selection passes, each the best expert
 *              not yet taken: larger p, ties to the lower expert index, NaN
 *              below every number; weights p_j, or with renormalisation
 *              p_j / (p_j1 + ... + p_jk) summed in selection order.
 *   fast       what a throughput kernel does: the hardware exp (__expf),
 *              the sum in four interleaved partial sums, p_i = e_i * (1 / s),
 *              the renormalisation as a multiply by the reciprocal (the CPU
 *              fast's idea; its own bits, not the CPU fast's).
 * moe_combine (no variants; backend.h): out = w_0 * y_0, then + w_j * y_j
 *   for j = 1..k-1 in rank order, one rounded product and one rounded sum a
 *   term, then the shared expert's sh * ds_sigmoidf(gate) (or the ungated
 *   sh) added last — backend_cpu.c's cpu_moe_combine, one thread per
 *   (row, column).
 *
 * ==== Why the bits match the CPU (or do not) ================================================
 * Softmax: the exponentials are elementwise (any lane may compute e_i: it
 * is ds_expf of the same two floats), the max is order-free except for the
 * sign of a zero maximum — the sequential scan keeps the first element that
 * attains it, and the warp's reduction picks the lowest index among equal
 * values, the same element — and the sum, the one reduction whose order
 * moves bits, runs on one lane in expert order, as on the CPU. Selection:
 * "ranks above" is a strict total order on (p, index) pairs (NaNs included),
 * so the warp's tree of comparisons finds the same unique best expert as the
 * CPU's left-to-right scan. Division and the renormalisation are the same
 * IEEE operations in the same order (__fdiv_rn, __fadd_rn). So CUDA
 * canonical == CPU canonical, ids and weights, memcmp (tests/cuda/
 * test_cuda_ops.c test_moe). fast: __expf and the four partial sums change
 * the last bits of p, and near-tied logits can then pick another expert.
 * Combine: the same products and sums in the same order, per element. */
#include "kernels/cuda/cuda_internal.cuh"

/* ---- the selection order ----------------------------------------------------------- */
/* a ranks above b: larger probability, then lower index; NaN below all
 * (moe_route.c ranks_above). ib < 0: b is no candidate. */
__device__ __forceinline__ bool moe_ranks_above(float a, int ia, float b, int ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return false;
    if (a != a) return b != b && ia < ib;
    if (b != b) return true;
    return a > b || (a == b && ia < ib);
}

/* The warp's best (p, index) among the experts not yet taken (every lane
 * gets it; -1 when none is left, which k <= n excludes). */
__device__ __forceinline__ int moe_warp_best(const float *p, const unsigned char *taken, int n, int lane) {
    float bv = 0.0f;
    int bi = -1;
    for (int i = lane; i < n; i += 32)
        if (!taken[i] && moe_ranks_above(p[i], i, bv, bi)) { bv = p[i]; bi = i; }
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (moe_ranks_above(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    return bi;
}

/* The row's max with NaNs skipped, as the sequential `if (l > m) m = l`
 * from -inf leaves it: the value, and for a zero maximum the sign of the
 * first zero (the lowest index among equal values). */
__device__ __forceinline__ float moe_warp_max(const float *l, int n, int lane) {
    float bv = -INFINITY;
    int bi = -1;
    for (int i = lane; i < n; i += 32) {
        const float v = l[i];
        if (v > bv || (v == bv && bi < 0)) { bv = v; bi = i; }   /* lane order: i rises */
    }
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
    }
    return bv;   /* bi < 0: no number in the row, bv = -inf (the scan's start) */
}

/* ========================================================================
 * moe_route: one warp (a block of 32) per row; shared p[n], the sum, taken[n]
 * ======================================================================== */
template <bool FAST>
__global__ void moe_route_k(int n, int k, int norm, const float *__restrict__ logits, int32_t *__restrict__ ids,
                            float *__restrict__ w) {
    extern __shared__ float moe_smem[];
    dsc_pdl_wait();                               /* dsc_launch: the router's logits */
    dsc_pdl_trigger();
    float *p = moe_smem, *sum = p + n;
    unsigned char *taken = (unsigned char *)(sum + 1);
    const int r = blockIdx.x, lane = threadIdx.x;
    const float *l = logits + (int64_t)r * n;
    int32_t *id = ids + (int64_t)r * k;
    float *wr = w + (int64_t)r * k;

    const float m = moe_warp_max(l, n, lane);
    for (int i = lane; i < n; i += 32) {
        p[i] = FAST ? __expf(l[i] - m) : ds_expf(__fsub_rn(l[i], m));
        taken[i] = 0;
    }
    __syncwarp();
    if (lane == 0) {   /* the one reduction whose order moves bits: one lane, in order */
        if (FAST) {
            float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int i = 0; i < n; i++) s4[i & 3] += p[i];
            *sum = 1.0f / ((s4[0] + s4[1]) + (s4[2] + s4[3]));   /* the reciprocal */
        } else {
            float s = 0.0f;
            for (int i = 0; i < n; i++) s = __fadd_rn(s, p[i]);
            *sum = s;
        }
    }
    __syncwarp();
    const float s = *sum;
    for (int i = lane; i < n; i += 32) p[i] = FAST ? p[i] * s : __fdiv_rn(p[i], s);
    __syncwarp();
    for (int j = 0; j < k; j++) {
        const int b = moe_warp_best(p, taken, n, lane);
        if (lane == 0) {
            const int bb = b < 0 ? 0 : b;         /* k <= n: never none */
            id[j] = bb;
            wr[j] = p[bb];
            taken[bb] = 1;
        }
        __syncwarp();
    }
    if (norm && lane == 0) {   /* summed in selection order */
        float t = 0.0f;
        for (int j = 0; j < k; j++) t = FAST ? t + wr[j] : __fadd_rn(t, wr[j]);
        if (FAST) {
            const float rt = 1.0f / t;
            for (int j = 0; j < k; j++) wr[j] = wr[j] * rt;
        } else {
            for (int j = 0; j < k; j++) wr[j] = __fdiv_rn(wr[j], t);
        }
    }
}

void dsc_moe_route(ds_exec *ex, ds_variant v, int M, int n_expert, int k, int norm, const float *logits,
                   int32_t *ids, float *w) {
    if (M <= 0 || n_expert < 1 || n_expert > DS_MOE_MAX_EXPERT || k < 1 || k > n_expert) return;
    const size_t smem = ((size_t)n_expert + 1) * sizeof(float) + (size_t)n_expert;   /* p, sum, taken */
    /* The route writes ids and w only: a producer's Q8_0 copy of the rows
     * (dsc_q8x: the router's, of the layer's normed input) still stands
     * after it, unless ids or w overlap those rows, and the experts' first
     * matmul (matmul_id on the same rows) reuses it instead of quantizing
     * them again. */
    bool keep = ex->q8x.seq == ex->n_ops && ex->q8x.x;
    if (keep) {
        const uintptr_t qx = (uintptr_t)ex->q8x.x, qe = qx + (size_t)ex->q8x.M * (size_t)ex->q8x.K * sizeof(float);
        const uintptr_t ib = (uintptr_t)ids, wb = (uintptr_t)w, rk = (uintptr_t)M * (uintptr_t)k;
        keep = (ib + rk * sizeof(int32_t) <= qx || ib >= qe) && (wb + rk * sizeof(float) <= qx || wb >= qe);
    }
    if (v == DS_FAST)
        dsc_launch(ex, "moe_route", moe_route_k<true>, dim3((unsigned)M), dim3(32), smem, n_expert, k, norm, logits,
                   ids, w);
    else
        dsc_launch(ex, "moe_route", moe_route_k<false>, dim3((unsigned)M), dim3(32), smem, n_expert, k, norm, logits,
                   ids, w);
    if (keep) ex->q8x.seq = ex->n_ops;
}

/* ========================================================================
 * moe_combine: one thread per (row, column)
 * ======================================================================== */
__global__ void moe_combine_k(int M, int k, int n, const int32_t *__restrict__ slot, const float *__restrict__ w,
                              const float *__restrict__ y, const float *__restrict__ sh_gate,
                              const float *__restrict__ sh, float *__restrict__ out) {
    dsc_pdl_wait();
    dsc_pdl_trigger();
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)M * n) return;
    const int64_t r = t / n, i = t % n;
    const float *wr = w + r * k;
    /* slot NULL: the identity (matmul_id's outputs, in assignment order) */
    const int64_t s0 = slot ? slot[r * k] : r * k;
    float o = __fmul_rn(wr[0], y[s0 * n + i]);
    for (int j = 1; j < k; j++) {
        const int64_t sj = slot ? slot[r * k + j] : r * k + j;
        o = __fadd_rn(o, __fmul_rn(wr[j], y[sj * n + i]));
    }
    if (sh && sh_gate) o = __fadd_rn(o, __fmul_rn(sh[r * n + i], ds_sigmoidf(sh_gate[r])));
    else if (sh) o = __fadd_rn(o, sh[r * n + i]);
    out[t] = o;
}

void dsc_moe_combine(ds_exec *ex, int M, int k, int n, const int32_t *slot, const float *w, const float *y,
                     const float *sh_gate, const float *sh, float *out) {
    if (M <= 0 || k < 1 || n <= 0) return;
    const int64_t total = (int64_t)M * n;
    dsc_launch(ex, "moe_combine", moe_combine_k, dim3(dsc_blocks(total, 256)), dim3(256), 0, M, k, n, slot, w, y,
               sh_gate, sh, out);
}

/* ========================================================================
 * moe_gather: X[slot[i]] = x[i / k], rows of n floats (a copy)
 * ======================================================================== */
template <typename T>
__global__ void moe_gather_k(int64_t total, int k, int64_t nu, const int32_t *__restrict__ slot,
                             const T *__restrict__ x, T *__restrict__ X) {
    dsc_pdl_wait();
    dsc_pdl_trigger();
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t a = t / nu, c = t % nu;     /* assignment a = row * k + rank, unit c */
        X[(int64_t)slot[a] * nu + c] = x[(a / k) * nu + c];
    }
}

void dsc_moe_gather(ds_exec *ex, int M, int k, int n, const int32_t *slot, const float *x, float *X) {
    if (M <= 0 || k < 1 || n <= 0) return;
    const int vec = n % 4 == 0 && !((uintptr_t)x % 16) && !((uintptr_t)X % 16);
    const int64_t nu = vec ? n / 4 : n, total = (int64_t)M * k * nu;
    const unsigned grid = dsc_blocks(total, 256) < 4096 ? dsc_blocks(total, 256) : 4096;
    if (vec)
        dsc_launch(ex, "moe_gather", moe_gather_k<float4>, dim3(grid), dim3(256), 0, total, k, nu, slot,
                   (const float4 *)x, (float4 *)X);
    else
        dsc_launch(ex, "moe_gather", moe_gather_k<float>, dim3(grid), dim3(256), 0, total, k, nu, slot, x, X);
}

/* ========================================================================
 * the experts by id (backend.h moe_id_prepare / matmul_id)
 * ========================================================================
 * A MoE layer whose route stays on the device (layer.c
 * ds_layer_moe_on_device) runs each assignment's expert as decode's GEMV
 * of that expert: matmul_q8_0.cu q8i_kernel (Q8_0) and matmul_dense.cu
 * mmd_staged_id (F32 / F16 / BF16), the M = 1 kernels' own arithmetic with
 * the weight pointers looked up from the assignment's id. What they need
 * from here is each array's table of expert buffers on the device, made
 * once at load: a kernel's arguments cannot hold 2 x 1024 pointers
 * (DS_MOE_MAX_EXPERT), and a table uploaded per call could not be replayed
 * by a recording. Other types (the K quants) decline: those layers keep
 * the host grouping. Opt-in (DSPARK_CUDA_ON=moeid) until it has run on a GPU;
 * DSPARK_CUDA_OFF=moeid declines every array (an A/B of
 * the two paths: the same bits). */
int dsc_moe_id_prepare(ds_backend *be, ds_weight *W, int n_exp, char *err, size_t errlen) {
    const dsc_backend *b = (const dsc_backend *)be->priv;
    if ((b->off & DSC_OFF_MOEID) || n_exp < 1 || !W) return 1;
    dsc_weight *d0 = (dsc_weight *)dsc_w(&W[0]);
    if (!d0) return 1;                             /* not prepared: nothing to point at */
    if (d0->id_tab) return d0->id_n == n_exp ? 0 : 1;
    const uint32_t t = d0->type;
    const bool q8 = t == DS_TYPE_Q8_0, dense = t == DS_TYPE_F32 || t == DS_TYPE_F16 || t == DS_TYPE_BF16;
    if ((!q8 && !dense) || d0->n_in <= 0 || d0->n_out <= 0) return 1;
    /* the staged kernel's rows: whole 16-byte pieces (every model's shapes) */
    if (dense && ((d0->n_in * (t == DS_TYPE_F32 ? 4 : 2)) % 16 || d0->n_in % 4)) return 1;
    for (int e = 0; e < n_exp; e++) {
        const dsc_weight *d = dsc_w(&W[e]);
        if (!d || d->type != t || d->n_in != d0->n_in || d->n_out != d0->n_out || !d->data || (q8 && !d->scale))
            return 1;
    }
    const size_t n_ptr = (size_t)n_exp * (q8 ? 2 : 1);
    void **host = (void **)malloc(n_ptr * sizeof(void *));
    if (!host) { ds_errf(err, errlen, "cuda: out of host memory for an expert table"); return -1; }
    for (int e = 0; e < n_exp; e++) {
        const dsc_weight *d = dsc_w(&W[e]);
        host[e] = d->data;
        if (q8) host[n_exp + e] = d->scale;
    }
    void **tab = NULL;
    cudaError_t ce = cudaMalloc((void **)&tab, n_ptr * sizeof(void *));
    if (ce == cudaSuccess) ce = cudaMemcpy(tab, host, n_ptr * sizeof(void *), cudaMemcpyHostToDevice);
    free(host);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(tab);
        ds_errf(err, errlen, "cuda: expert table of %d experts: %s", n_exp, cudaGetErrorString(ce));
        return -1;
    }
    d0->id_tab = tab;
    d0->id_n = n_exp;
    return 0;
}

void dsc_matmul_id(ds_exec *ex, int n, const ds_weight *const W[], int n_exp, int A, const int32_t *ids, int xk,
                   const float *x, float *const y[]) {
    if (A <= 0) return;
    const dsc_weight *w0[2] = {NULL, NULL};
    bool bad = n < 1 || n > 2 || xk < 1 || A % xk || n_exp < 1 || !ids || !x;
    for (int i = 0; !bad && i < n; i++) {
        w0[i] = dsc_w(W[i]);
        bad = !w0[i] || !w0[i]->id_tab || w0[i]->id_n != n_exp || w0[i]->type != w0[0]->type ||
              w0[i]->n_in != w0[0]->n_in || !y[i];
    }
    if (!bad && w0[0]->type != DS_TYPE_Q8_0) bad = ((uintptr_t)x & 15) != 0;   /* the staged copies */
    if (bad) {
        dsc_note(ex, cudaErrorInvalidValue, "matmul_id on experts moe_id_prepare did not take (or a bad shape)");
        return;
    }
    if (w0[0]->type == DS_TYPE_Q8_0) dsc_matmul_id_q8_0(ex, n, w0, n_exp, A, ids, xk, x, y);
    else
        for (int i = 0; i < n; i++) dsc_matmul_id_dense(ex, w0[i], n_exp, A, ids, xk, x, y[i]);
}
