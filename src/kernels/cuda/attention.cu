/* attention.cu — attention family on the GPU: softmax(q·K^T * scale) · V against
 * the KV cache, which ALREADY holds this call's rows (kv_write first).
 *
 * Row m attends positions [0, n_vis[m]) of its sequence (ds_rows, device
 * memory: position, sequence, visible length, page tables), reading K and V
 * through its page table: a chunk of 64 positions is 4 pages, whose offsets
 * are looked up once per chunk. Everything is read on the device, so a
 * recorded graph replays for any rows; the grid is one block per (row,
 * head) whatever the prefix, and each block loops over the chunks its prefix
 * has. GQA: head h reads kv head h / (n_head / n_kv_head).
 *
 *   decode     canonical at M = 1.
 *   canonical  the CPU's attn_row_head (kernels/cpu/attention.c) for each
 *              (row, head): chunks of DS_ATTN_CHUNK = 64 keys at absolute
 *              boundaries; per chunk the 16-lane dot (lane = d mod 16, the
 *              head_dim % 16 tail only in its lanes, tree 8-4-2-1) times
 *              scale, the chunk max, p = ds_expf(s - max), the sum of p in key
 *              order, p·V accumulated in key order from +0; chunks folded
 *              left to right with the online-softmax rescale; one final
 *              divide. The block's warps compute ATT_WARPS chunks at once
 *              (each chunk alone: its own quantities depend on nothing
 *              else), park their partial results in shared memory, and then
 *              fold them in chunk order — the fold is the only step that
 *              links chunks, and it stays sequential.
 *   fast       one pass in tiles of 128 keys (flash-attention style): a
 *              warp-wide dot (lanes over head_dim, butterfly sum), a running
 *              max rescaled per tile with the hardware __expf, the p·V sums
 *              rescaled in place, a reciprocal at the end.
 *
 * ==== Why canonical is the CPU's bits (when the CPU's exp is ds_expf) ===================
 * Per chunk every quantity is the CPU's sequence of IEEE operations (the
 * max is order-free: equal values, and the sign of a zero maximum cannot
 * change exp(s - max)), and the fold is the CPU's, in the same order. The
 * one ingredient that is not plain IEEE arithmetic is the exponential: the
 * GPU uses ds_expf (kernels/dsmath.h). Today's CPU kernel calls libm expf,
 * so CPU and GPU agree bit for bit only with the CPU on ds_expf too (a
 * separate change, see the report of issue 9); per-backend exactness
 * (canonical M rows == decode) holds either way.
 *
 * ==== Why fast differs ===================================================================
 * Other dot order (32 lanes, butterfly), other chunking (128, rescaled in
 * place), another exp (__expf, ~2 ulp) and a reciprocal multiply. */
#include "kernels/cuda/cuda_internal.cuh"

#define ATT_WARPS 8
#define ATT_HD_MAX 256
#define ATT_CHUNK DS_ATTN_CHUNK
#define ATT_KB 4                /* keys per half-warp whose loads fly together */
#define ATT_WIDE_MAX 16         /* up to this many chunks: all warps on one chunk at a time */

/* ==========================================================================
 * CANONICAL (= decode)
 * ========================================================================== */
/* The scores of keys jj + 2u + half (u < ATT_KB) of the chunk at c0 (cl
 * keys): a half-warp per key, lane l16 = the 16-lane dot's lane, the
 * ATT_KB keys' loads in flight together (one memory latency per batch, not
 * per key; each key's own sum is the CPU's: lane chains over head_dim in
 * order, the head_dim % 16 tail in its lanes, tree 8-4-2-1), times scale,
 * into p[j]. All 32 lanes call it (the shuffles): keys past the chunk
 * compute a duplicate of its last key and are not stored. */
__device__ __forceinline__ void att_scores(const float *__restrict__ kb, int64_t st, const int64_t *pg, int cl, int jj,
                                           int half, int l16, int hd, const float *qs, float scale, float *p) {
    const float *kr[ATT_KB];
    float a[ATT_KB];
#pragma unroll
    for (int u = 0; u < ATT_KB; u++) {
        const int j = jj + 2 * u + half, jc = j < cl ? j : cl - 1;
        kr[u] = kb + pg[jc >> 4] + (int64_t)(jc & 15) * st;
        a[u] = 0.0f;
    }
    int i = 0;
#pragma unroll 4
    for (; i + 16 <= hd; i += 16) {
        const float qx = qs[i + l16];
        float kx[ATT_KB];
#pragma unroll
        for (int u = 0; u < ATT_KB; u++) kx[u] = __ldg(kr[u] + i + l16);
#pragma unroll
        for (int u = 0; u < ATT_KB; u++) a[u] = __fadd_rn(a[u], __fmul_rn(qx, kx[u]));
    }
    if (i + l16 < hd) {
        const float qx = qs[i + l16];
#pragma unroll
        for (int u = 0; u < ATT_KB; u++) a[u] = __fadd_rn(a[u], __fmul_rn(qx, __ldg(kr[u] + i + l16)));
    }
#pragma unroll
    for (int u = 0; u < ATT_KB; u++) {
#pragma unroll
        for (int s = 8; s >= 1; s /= 2) a[u] = __fadd_rn(a[u], __shfl_down_sync(0xffffffffu, a[u], s, 16));
        const int j = jj + 2 * u + half;
        if (j < cl && l16 == 0) p[j] = __fmul_rn(a[u], scale);
    }
}

/* Thread d's output of row-head (m, h): out[e0 + d], e0 = (m * n_head + h) *
 * hd. With oq (dsc_q8x; hd % 32 == 0, so each warp's 32 d's are one block
 * of the row and warps enter whole) the block's Q8_0 copy too. */
static_assert(ATT_HD_MAX == 32 * ATT_WARPS, "one output per thread");
__device__ __forceinline__ void att_store(float *__restrict__ out, int64_t e0, int hd, float v,
                                          int8_t *__restrict__ oq, float *__restrict__ od) {
    const int d = threadIdx.x;
    if (d >= hd) return;
    out[e0 + d] = v;
    if (oq) {
        const float s = dsc_q8_block_warp(v, d & 31, oq + e0 + (d & ~31));
        if ((d & 31) == 0) od[(e0 + d) / 32] = s;
    }
}

__global__ void __launch_bounds__(32 * ATT_WARPS)
att_canonical(int n_head, int n_kv_head, int hd, int64_t st, float scale, int M,
              ds_rows rw, const float *__restrict__ q,
              const float *__restrict__ kc, const float *__restrict__ vc, float *__restrict__ out,
              int wide_max, int8_t *__restrict__ oq, float *__restrict__ od) {
    __shared__ float qs[ATT_HD_MAX];
    __shared__ float ps[ATT_WARPS][ATT_CHUNK];
    __shared__ float ca[ATT_WARPS][ATT_HD_MAX];
    __shared__ float cm[ATT_WARPS], cs[ATT_WARPS];
    __shared__ int64_t pg[ATT_WARPS][ATT_CHUNK / 16];   /* each chunk's 4 page offsets */
    dsc_pdl_wait();                       /* dsc_launch */
    dsc_pdl_trigger();
    const int m = blockIdx.x / n_head, h = blockIdx.x % n_head;
    const int kvh = h / (n_head / n_kv_head);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int L = dsc_kv_nvis(rw, m);
    const int32_t *tab = dsc_kv_table(rw, m);
    const int64_t e0 = ((int64_t)m * n_head + h) * hd;
    const float *qv = q + e0;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qv[d];
    __syncthreads();                      /* q read before out (they may alias) is written */
    if (L <= 0) {
        att_store(out, e0, hd, 0.0f, oq, od);
        return;
    }
    const float *kb = kc + (int64_t)kvh * hd, *vb = vc + (int64_t)kvh * hd;
    const int nch = (L + ATT_CHUNK - 1) / ATT_CHUNK;
    /* the running state, kept by every thread (the scalars redundantly) */
    float m_run = -INFINITY, l_run = 0.0f;
    float acc[ATT_HD_MAX / (32 * ATT_WARPS)];
#pragma unroll
    for (int r = 0; r < ATT_HD_MAX / (32 * ATT_WARPS); r++) acc[r] = 0.0f;
    const int half = lane / 16, l16 = lane & 15;

    if (nch <= wide_max) {
        /* Few chunks (decode at short contexts): one chunk at a
         * time with ALL warps on its keys, instead of a warp per chunk and
         * most warps idle — the same per-chunk quantities (each key's 16-lane
         * sum, the max, ds_expf, the key-order sum, p·V in key order per d)
         * and the same fold, so the same bits; only fewer sequential steps. */
        for (int c = 0; c < nch; c++) {
            const int c0 = c * ATT_CHUNK, cl = min(ATT_CHUNK, L - c0);
            if (threadIdx.x < (cl + 15) / 16) pg[0][threadIdx.x] = dsc_kv_at(tab, rw.page_stride, c0 + 16 * threadIdx.x, 0);
            __syncthreads();
            for (int jj = warp * 2 * ATT_KB; jj < cl; jj += ATT_WARPS * 2 * ATT_KB) {
                att_scores(kb, st, pg[0], cl, jj, half, l16, hd, qs, scale, ps[0]);
            }
            __syncthreads();
            if (warp == 0) {
                float mx = -INFINITY;
                for (int j = lane; j < cl; j += 32) {
                    const float x = ps[0][j];
                    if (x > mx) mx = x;
                }
#pragma unroll
                for (int o = 16; o >= 1; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                __syncwarp();
                for (int j = lane; j < cl; j += 32) ps[0][j] = ds_expf(__fsub_rn(ps[0][j], mx));
                __syncwarp();
                if (lane == 0) {
                    float sum = 0.0f;
                    for (int j = 0; j < cl; j++) sum = __fadd_rn(sum, ps[0][j]);
                    cs[0] = sum;
                    cm[0] = mx;
                }
            }
            __syncthreads();
            const int d = threadIdx.x;
            float ca_d = 0.0f;
            if (d < hd)     /* key order, a page (16 keys) at a time */
                for (int b = 0; 16 * b < cl; b++) {
                    const float *vp = vb + pg[0][b] + d;
                    const float *pb = ps[0] + 16 * b;
                    const int je = min(16, cl - 16 * b);
#pragma unroll 8
                    for (int j = 0; j < je; j++) ca_d = __fadd_rn(ca_d, __fmul_rn(pb[j], __ldg(vp + (int64_t)j * st)));
                }
            const float cmax = cm[0], csum = cs[0];
            if (c == 0) {
                m_run = cmax;
                l_run = csum;
                acc[0] = ca_d;
            } else {
                const float mn = m_run > cmax ? m_run : cmax;
                const float ea = ds_expf(__fsub_rn(m_run, mn)), eb = ds_expf(__fsub_rn(cmax, mn));
                l_run = __fadd_rn(__fmul_rn(l_run, ea), __fmul_rn(csum, eb));
                acc[0] = __fadd_rn(__fmul_rn(acc[0], ea), __fmul_rn(ca_d, eb));
                m_run = mn;
            }
            __syncthreads();                      /* ps / cs / cm reused by the next chunk */
        }
        att_store(out, e0, hd, __fdiv_rn(acc[0], l_run), oq, od);
        return;
    }

    for (int base = 0; base < nch; base += ATT_WARPS) {
        const int c = base + warp;
        if (c < nch) {
            const int c0 = c * ATT_CHUNK, cl = min(ATT_CHUNK, L - c0);
            if (lane < (cl + 15) / 16) pg[warp][lane] = dsc_kv_at(tab, rw.page_stride, c0 + 16 * lane, 0);
            __syncwarp();
            /* scores: this warp alone over its chunk (the loop bound is the
             * same for the whole warp: att_scores needs all 32 lanes) */
            for (int jj = 0; jj < cl; jj += 2 * ATT_KB)
                att_scores(kb, st, pg[warp], cl, jj, half, l16, hd, qs, scale, ps[warp]);
            __syncwarp();
            /* chunk max (NaN never wins; the value is order-free) */
            float mx = -INFINITY;
            for (int j = lane; j < cl; j += 32) {
                const float x = ps[warp][j];
                if (x > mx) mx = x;
            }
#pragma unroll
            for (int o = 16; o >= 1; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            __syncwarp();
            for (int j = lane; j < cl; j += 32) ps[warp][j] = ds_expf(__fsub_rn(ps[warp][j], mx));
            __syncwarp();
            /* the sum in key order, and p·V in key order per d */
            if (lane == 0) {
                float sum = 0.0f;
                for (int j = 0; j < cl; j++) sum = __fadd_rn(sum, ps[warp][j]);
                cs[warp] = sum;
                cm[warp] = mx;
            }
            for (int d = lane; d < hd; d += 32) {
                float a = 0.0f;
                for (int b = 0; 16 * b < cl; b++) {   /* key order, a page at a time */
                    const float *vp = vb + pg[warp][b] + d;
                    const float *pb = ps[warp] + 16 * b;
                    const int je = min(16, cl - 16 * b);
#pragma unroll 8
                    for (int j = 0; j < je; j++) a = __fadd_rn(a, __fmul_rn(pb[j], __ldg(vp + (int64_t)j * st)));
                }
                ca[warp][d] = a;
            }
        }
        __syncthreads();
        /* fold this round's chunks left to right (every thread, its d's) */
        for (int w = 0; w < ATT_WARPS && base + w < nch; w++) {
            const float cmax = cm[w], csum = cs[w];
            if (base + w == 0) {
                m_run = cmax;
                l_run = csum;
#pragma unroll
                for (int r = 0; r < ATT_HD_MAX / (32 * ATT_WARPS); r++) {
                    const int d = threadIdx.x + r * 32 * ATT_WARPS;
                    if (d < hd) acc[r] = ca[w][d];
                }
            } else {
                const float mn = m_run > cmax ? m_run : cmax;
                const float ea = ds_expf(__fsub_rn(m_run, mn)), eb = ds_expf(__fsub_rn(cmax, mn));
                l_run = __fadd_rn(__fmul_rn(l_run, ea), __fmul_rn(csum, eb));
#pragma unroll
                for (int r = 0; r < ATT_HD_MAX / (32 * ATT_WARPS); r++) {
                    const int d = threadIdx.x + r * 32 * ATT_WARPS;
                    if (d < hd) acc[r] = __fadd_rn(__fmul_rn(acc[r], ea), __fmul_rn(ca[w][d], eb));
                }
                m_run = mn;
            }
        }
        __syncthreads();
    }
    att_store(out, e0, hd, __fdiv_rn(acc[0], l_run), oq, od);
}

/* ==========================================================================
 * FAST — one pass, tiles of 128 keys, online softmax rescaled in place
 * ========================================================================== */
#define ATF_TILE 128

__global__ void __launch_bounds__(32 * ATT_WARPS)
att_fast(int n_head, int n_kv_head, int hd, int64_t st, float scale, int M,
         ds_rows rw, const float *__restrict__ q,
         const float *__restrict__ kc, const float *__restrict__ vc, float *__restrict__ out) {
    __shared__ float qs[ATT_HD_MAX];
    __shared__ float ps[ATF_TILE];
    __shared__ float tmax_s;
    const int m = blockIdx.x / n_head, h = blockIdx.x % n_head;
    const int kvh = h / (n_head / n_kv_head);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int L = dsc_kv_nvis(rw, m);
    const int32_t *tab = dsc_kv_table(rw, m);
    const int64_t pst = rw.page_stride;
    const float *qv = q + ((int64_t)m * n_head + h) * hd;
    float *ov = out + ((int64_t)m * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qv[d];
    __syncthreads();
    if (L <= 0) {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) ov[d] = 0.0f;
        return;
    }
    const float *kb = kc + (int64_t)kvh * hd, *vb = vc + (int64_t)kvh * hd;
    float m_run = -INFINITY, l_run = 0.0f;
    float acc[ATT_HD_MAX / (32 * ATT_WARPS)];
#pragma unroll
    for (int r = 0; r < ATT_HD_MAX / (32 * ATT_WARPS); r++) acc[r] = 0.0f;
    for (int t0 = 0; t0 < L; t0 += ATF_TILE) {
        const int tl = min(ATF_TILE, L - t0);
        for (int j = warp; j < tl; j += ATT_WARPS) {
            const float *kr = kb + dsc_kv_at(tab, pst, t0 + j, st);
            float a = 0.0f;
            for (int d = lane; d < hd; d += 32) a = fmaf(qs[d], kr[d], a);
#pragma unroll
            for (int o = 16; o >= 1; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
            if (lane == 0) ps[j] = a * scale;
        }
        __syncthreads();
        if (warp == 0) {
            float mx = -INFINITY;
            for (int j = lane; j < tl; j += 32) mx = fmaxf(mx, ps[j]);
#pragma unroll
            for (int o = 16; o >= 1; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            if (lane == 0) tmax_s = mx;
        }
        __syncthreads();
        const float mn = fmaxf(m_run, tmax_s);
        const float corr = m_run == -INFINITY ? 0.0f : __expf(m_run - mn);
        __syncthreads();
        for (int j = threadIdx.x; j < tl; j += blockDim.x) ps[j] = __expf(ps[j] - mn);
        __syncthreads();
        float tsum = 0.0f;
        for (int j = 0; j < tl; j++) tsum += ps[j];
        l_run = l_run * corr + tsum;
#pragma unroll
        for (int r = 0; r < ATT_HD_MAX / (32 * ATT_WARPS); r++) {
            const int d = threadIdx.x + r * 32 * ATT_WARPS;
            if (d >= hd) continue;
            float a = acc[r] * corr;
            for (int j = 0; j < tl; j++) a = fmaf(ps[j], vb[dsc_kv_at(tab, pst, t0 + j, st) + d], a);
            acc[r] = a;
        }
        m_run = mn;
        __syncthreads();
    }
    const float inv = 1.0f / l_run;
#pragma unroll
    for (int r = 0; r < ATT_HD_MAX / (32 * ATT_WARPS); r++) {
        const int d = threadIdx.x + r * 32 * ATT_WARPS;
        if (d < hd) ov[d] = acc[r] * inv;
    }
}

/* ==========================================================================
 * entry point
 * ========================================================================== */
void dsc_attention(ds_exec *ex, ds_variant v, const ds_attn_shape *s, int M, const ds_rows *r,
                   const float *q, const float *kc, const float *vc, float *out) {
    if (M <= 0 || s->n_head <= 0 || s->n_kv_head <= 0 || s->head_dim <= 0) return;
    if (s->head_dim > ATT_HD_MAX || s->n_head % s->n_kv_head || r->page != DS_KV_PAGE) {
        dsc_note(ex, cudaErrorInvalidValue, "attention: head_dim > 256, n_head not a multiple of n_kv_head, or pages of other than 16 positions");
        return;
    }
    const unsigned grid = (unsigned)M * (unsigned)s->n_head;
    if (v == DS_FAST)
        att_fast<<<grid, 32 * ATT_WARPS, 0, ex->st>>>(s->n_head, s->n_kv_head, s->head_dim,
                                                     s->kv_stride, s->scale, M, *r, q,
                                                     kc, vc, out);
    else {
        /* the o projection's Q8_0 input, made here (dsc_q8x) */
        const int64_t K = (int64_t)s->n_head * s->head_dim;
        int8_t *oq = NULL;
        float *od = NULL;
        if (s->head_dim % 32 || !dsc_q8x_reserve(ex, M, K, &oq, &od)) oq = NULL, od = NULL;
        dsc_launch(ex, "attention", att_canonical, dim3(grid), dim3(32 * ATT_WARPS), 0, s->n_head, s->n_kv_head,
                   s->head_dim, s->kv_stride, s->scale, M, *r, q, kc, vc, out,
                   (dsc_be(ex)->off & DSC_OFF_WIDE) ? 0 : ATT_WIDE_MAX, oq, od);
        if (oq) dsc_q8x_publish(ex, out, M, K, oq, od);
        return;
    }
    DSC_LAUNCHED(ex, "attention");
}
