/* argmax.cu — greedy selection on the GPU, plus the small lookups that move
 * ids and rows (embedding rows, the drafter's feature sanitisation, KV row
 * writes). No arithmetic that rounds, so there is no fast variant.
 *
 * argmax: one block per row; each thread scans its slice in increasing index
 * order keeping the first maximum it meets (strict >, NaN skipped), then the block combines
 * (value, index) pairs taking the larger value and, on equal values, the
 * lower index — the left-to-right scan's answer (ds_argmax) in any order.
 * All-NaN rows give 0. */
#include "kernels/cuda/cuda_internal.cuh"

#define ARG_THREADS 1024
#define ARG_U 4                 /* float4 loads in flight per thread (vec rows) */

/* Which thread reads which element moves no bit (the pick below is
 * order-free); what matters for speed is that a 152k-entry LM-head row is
 * one block's work: 1024 threads with ARG_U 16-byte loads each in flight
 * per step (one memory latency per 64 KiB, not per 1 KiB as a plain
 * strided scan of 256 threads had: 41 us of every 8B decode step, ncu,
 * session 34). Each thread still visits its elements in increasing index
 * order (i0, i0 + T, ... and x, y, z, w within a float4), so its strict >
 * keeps the first of its maxima. */
__device__ __forceinline__ void arg_scan(float v, int64_t i, float &bv, int64_t &bi) {
    if (v == v && (bi < 0 || v > bv)) { bv = v; bi = i; }
}

__global__ void __launch_bounds__(ARG_THREADS) argmax_rows(int64_t n, const float *__restrict__ x, int32_t *out,
                                                           int vec) {
    __shared__ float sv[ARG_THREADS / 32];
    __shared__ int64_t si[ARG_THREADS / 32];
    dsc_pdl_wait();                               /* dsc_launch */
    dsc_pdl_trigger();
    const float *xr = x + (int64_t)blockIdx.x * n;
    float bv = 0.0f;
    int64_t bi = -1;
    if (vec) {                                    /* n % 4 == 0, rows 16-byte aligned */
        const float4 *x4 = (const float4 *)xr;
        const int64_t n4 = n / 4;
        for (int64_t i0 = threadIdx.x; i0 < n4; i0 += (int64_t)ARG_THREADS * ARG_U) {
            float4 v[ARG_U];
#pragma unroll
            for (int u = 0; u < ARG_U; u++) {
                const int64_t i = i0 + (int64_t)u * ARG_THREADS;
                v[u] = i < n4 ? __ldg(x4 + i) : make_float4(NAN, NAN, NAN, NAN);
            }
#pragma unroll
            for (int u = 0; u < ARG_U; u++) {
                const int64_t e = 4 * (i0 + (int64_t)u * ARG_THREADS);
                arg_scan(v[u].x, e, bv, bi);
                arg_scan(v[u].y, e + 1, bv, bi);
                arg_scan(v[u].z, e + 2, bv, bi);
                arg_scan(v[u].w, e + 3, bv, bi);
            }
        }
    } else {
        for (int64_t i = threadIdx.x; i < n; i += ARG_THREADS) arg_scan(xr[i], i, bv, bi);
    }
    for (int o = 16; o >= 1; o /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        dsc_arg_pick(bv, bi, ov, oi);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARG_THREADS / 32; w++) dsc_arg_pick(bv, bi, sv[w], si[w]);
        out[blockIdx.x] = bi < 0 ? 0 : (int32_t)bi;
    }
}

void dsc_argmax(ds_exec *ex, int rows, int64_t n, const float *x, int32_t *out) {
    if (rows <= 0) return;
    const int vec = n % 4 == 0 && (uintptr_t)x % 16 == 0;
    dsc_launch(ex, "argmax", argmax_rows, dim3((unsigned)rows), dim3(ARG_THREADS), 0, n, x, out, vec);
}

/* ---- embedding rows: out[m] = row ids[m] of E as f32 (exact conversions) ---------------- */
__global__ void embed_rows(uint32_t type, const void *__restrict__ data, const float *__restrict__ scale,
                           int64_t n_in, int64_t n_out, const int32_t *__restrict__ ids, int M,
                           float *out) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)M * n_in) return;
    const int m = (int)(t / n_in);
    const int64_t k = t % n_in;
    int64_t id = ids[m];
    if (id < 0 || id >= n_out) {                  /* the engine validates ids; never read outside */
        out[t] = __int_as_float(0x7fc00000);
        return;
    }
    out[t] = dsc_embed_elem(type, data, scale, n_in, id, k);
}

void dsc_embed(ds_exec *ex, const ds_weight *E, int M, const int32_t *ids, float *out) {
    const dsc_weight *w = dsc_w(E);
    if (M <= 0) return;
    if (!w) {
        dsc_note(ex, cudaErrorInvalidValue, "embed on a weight that prepare_weight did not upload");
        return;
    }
    if (ds_type_is_kq(w->type)) {                 /* the kquant device layouts */
        dsc_embed_kq(ex, w, M, ids, out);
        return;
    }
    const int64_t total = (int64_t)M * w->n_in;
    embed_rows<<<dsc_blocks(total, 256), 256, 0, ex->st>>>(w->type, w->data, w->scale, w->n_in,
                                                          w->n_out, ids, M, out);
    DSC_LAUNCHED(ex, "embed");
}

/* ---- the drafter's feature sanitisation: NaN -> 0, |x| > lim -> +-lim ------------------ */
/* dst = sanitize(src) (src == dst: in place), and with q (dsc_q8x: rows of
 * whole blocks, 256-thread blocks, so a warp is one block of one row) its
 * Q8_0 copy for the matmul that reads it next: the context rows' taps are
 * copied, sanitized and quantized in one launch instead of three. */
__global__ void sanitize_k(int64_t n, const float *src, float *dst, float lim, int8_t *__restrict__ q,
                           float *__restrict__ qd) {
    dsc_pdl_wait();                               /* dsc_launch */
    dsc_pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;                           /* whole warps (n % 32 == 0 with q) */
    float v = src[i];
    if (v != v) v = 0.0f;
    else if (v > lim) v = lim;
    else if (v < -lim) v = -lim;
    dst[i] = v;
    if (q) {
        const float d = dsc_q8_block_warp(v, threadIdx.x & 31, q + (i & ~(int64_t)31));
        if ((threadIdx.x & 31) == 0) qd[i / 32] = d;
    }
}

void dsc_sanitize(ds_exec *ex, int rows, int64_t n, const float *src, float *dst, float lim) {
    if (rows <= 0 || n <= 0) return;
    const int64_t total = (int64_t)rows * n;
    int8_t *q = NULL;
    float *qd = NULL;
    if (!dsc_q8x_reserve(ex, rows, n, &q, &qd)) q = NULL;
    dsc_launch(ex, "sanitize", sanitize_k, dim3(dsc_blocks(total, 256)), dim3(256), 0, total, src, dst, lim, q, qd);
    if (q) dsc_q8x_publish(ex, dst, rows, n, q, qd);
}

/* ---- KV rows at device positions, through the page tables ------------------------------- */
__global__ void kv_write_k(float *kc, float *vc, int row, int M, ds_rows r, const float *__restrict__ k,
                           const float *__restrict__ v) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)M * row) return;
    const int m = (int)(t / row), j = (int)(t % row);
    const int64_t dst = dsc_kv_at(dsc_kv_table(r, m), r.page_stride, r.pos[m], row) + j;
    kc[dst] = k[t];
    vc[dst] = v[t];
}

void dsc_kv_write(ds_exec *ex, float *kc, float *vc, int row, int M, const ds_rows *r,
                  const float *k, const float *v) {
    if (M <= 0 || row <= 0) return;
    if (r->page != DS_KV_PAGE) {
        dsc_note(ex, cudaErrorInvalidValue, "kv_write: pages of other than 16 positions");
        return;
    }
    kv_write_k<<<dsc_blocks((int64_t)M * row, 256), 256, 0, ex->st>>>(kc, vc, row, M, *r, k, v);
    DSC_LAUNCHED(ex, "kv_write");
}
