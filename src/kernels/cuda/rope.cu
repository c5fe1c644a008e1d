/* rope.cu — RoPE family on the GPU, in place on x[rows][n_heads][head_dim]; row r at
 * position pos[r] (device ints). NEOX pairs (i, i + head_dim/2), NORMAL (2i, 2i+1).
 *
 *   decode     canonical with rows = 1.
 *   canonical  cos and sin from a table computed ON THE HOST, once per
 *              (freq_base, head_dim), by the CPU kernel's own expressions:
 *              inv_i = ds_powf(freq_base, -2i/head_dim), theta = (float)pos *
 *              inv_i, ds_sincosf(theta) — project-owned IEEE sequences
 *              (kernels/dsmath.h), not a C library's. Then the rotation with
 *              the CPU's operations, (x0 c - x1 s, x0 s + x1 c), each product
 *              and sum rounded separately.
 *              The table covers positions [0, DSC_ROPE_POS) (16384: 8 MB at
 *              head_dim 128); a position past it runs the same ds_sincosf on
 *              the device (double arithmetic), so every position has the
 *              CPU's bits.
 *              With rope scaling (rope_ext, ds_rope_yarn) the table is keyed
 *              by the scaling too and holds the CPU's scaled values: theta
 *              divided by pair i's frequency factor, then
 *              ds_rope_yarn_sincos (dsmath.h, the CPU kernel's same call);
 *              the device fallback runs that same sequence.
 *   fast       ggml's recurrence on the device: theta_{i+1} = theta_i * ratio,
 *              ratio = ds_powf(base, -2/head_dim), ds_sincosf (scaled: the
 *              factor's division and ds_rope_yarn_sincos, as the CPU's fast).
 *
 * ==== Why canonical is the CPU's bits ==================================================
 * The only non-basic operations of the CPU kernel (ds_powf, ds_sincosf) are
 * fixed sequences of IEEE operations that compile to the same bits on the
 * host and on the device; what the GPU does per element is a table lookup
 * (or that same sequence) and four products and two sums. The table is keyed
 * by position, which the kernel reads from the device, so a recorded graph
 * stays valid at every position.
 *
 * ==== Why fast differs ==================================================================
 * The repeated multiplication rounds once per step (angles drift in the
 * last bits from i = 2 on); it is the CPU's fast variant's arithmetic. */
#include "kernels/cuda/cuda_internal.cuh"

#include <math.h>
#include <stdlib.h>

/* ---- the host table (one per backend and (freq_base, head_dim, scaling)) -------------- */
static bool rope_same(const dsc_rope_table *t, uint32_t fbits, int head_dim, const ds_rope_yarn *y) {
    if (t->fbits != fbits || t->head_dim != head_dim || t->scaled != (y != NULL)) return false;
    if (!y) return true;
    const ds_rope_yarn *o = &t->y;
    return !memcmp(&o->freq_scale, &y->freq_scale, 4) && !memcmp(&o->ext_factor, &y->ext_factor, 4) &&
           !memcmp(&o->lo, &y->lo, 4) && !memcmp(&o->hi, &y->hi, 4) && !memcmp(&o->mscale, &y->mscale, 4) &&
           o->freq_factors == y->freq_factors;
}

/* pair i's cos/sin at position p by the CPU kernel's expressions (rope.c's
 * rope_theta and rope_cs) */
static void rope_host_cs(int p, float inv, const ds_rope_yarn *y, int i, float *sn, float *cs) {
    float theta = (float)p * inv;
    if (y && y->freq_factors) theta = theta / y->freq_factors[i];
    if (y) ds_rope_yarn_sincos(theta, i, y->freq_scale, y->ext_factor, y->lo, y->hi, y->mscale, sn, cs);
    else ds_sincosf(theta, sn, cs);
}

const dsc_rope_table *dsc_rope_get(ds_exec *ex, float freq_base, int head_dim, const ds_rope_yarn *yarn) {
    dsc_backend *b = dsc_be(ex);
    uint32_t fbits;
    memcpy(&fbits, &freq_base, 4);
    for (int i = 0; i < b->n_rope; i++)
        if (rope_same(&b->rope[i], fbits, head_dim, yarn)) return &b->rope[i];
    if (b->n_rope == DSC_MAX_ROPE) {
        dsc_note(ex, cudaErrorMemoryAllocation, "rope: more than 8 (freq_base, head_dim, scaling) tables");
        return NULL;
    }
    const int half = head_dim / 2;
    const size_t nf = (size_t)2 * DSC_ROPE_POS * (size_t)half;
    float *h = (float *)malloc(nf * sizeof(float) + (size_t)half * sizeof(float));
    if (!h) {
        dsc_note(ex, cudaErrorMemoryAllocation, "rope: host table");
        return NULL;
    }
    float *inv = h + nf;
    for (int i = 0; i < half; i++) inv[i] = ds_powf(freq_base, -2.0f * (float)i / (float)head_dim);
    for (int p = 0; p < DSC_ROPE_POS; p++)
        for (int i = 0; i < half; i++)
            rope_host_cs(p, inv[i], yarn, i, &h[(size_t)DSC_ROPE_POS * half + (size_t)p * half + i], &h[(size_t)p * half + i]);
    dsc_rope_table t;
    memset(&t, 0, sizeof t);
    t.fbits = fbits;
    t.head_dim = head_dim;
    t.scaled = yarn != NULL;
    if (yarn) t.y = *yarn;
    cudaError_t e = cudaMalloc((void **)&t.cs, nf * sizeof(float));
    if (e == cudaSuccess) e = cudaMalloc((void **)&t.inv_freq, (size_t)half * sizeof(float));
    if (e == cudaSuccess && yarn && yarn->freq_factors) e = cudaMalloc((void **)&t.ff, (size_t)half * sizeof(float));
    /* uploaded on the backend's own stream: legal while ex->st is being
     * recorded into a graph, and finished before the table is used */
    if (e == cudaSuccess) e = cudaMemcpyAsync(t.cs, h, nf * sizeof(float), cudaMemcpyHostToDevice, b->aux);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(t.inv_freq, inv, (size_t)half * sizeof(float), cudaMemcpyHostToDevice, b->aux);
    if (e == cudaSuccess && t.ff)
        e = cudaMemcpyAsync(t.ff, yarn->freq_factors, (size_t)half * sizeof(float), cudaMemcpyHostToDevice, b->aux);
    if (e == cudaSuccess) e = cudaStreamSynchronize(b->aux);
    free(h);
    if (e != cudaSuccess) {
        cudaFree(t.cs);
        cudaFree(t.inv_freq);
        cudaFree(t.ff);
        dsc_note(ex, e, "rope: table upload");
        return NULL;
    }
    b->rope[b->n_rope] = t;
    return &b->rope[b->n_rope++];
}

/* what a kernel reads of a table: the device arrays and the scaling */
typedef struct {
    const float *cs, *inv, *ff;
    int scaled;
    float freq_scale, ext_factor, lo, hi, mscale;
} rope_k;

static rope_k rope_k_of(const dsc_rope_table *t) {
    rope_k k = {t->cs, t->inv_freq, t->ff, t->scaled, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f};
    if (t->scaled) {
        k.freq_scale = t->y.freq_scale;
        k.ext_factor = t->y.ext_factor;
        k.lo = t->y.lo;
        k.hi = t->y.hi;
        k.mscale = t->y.mscale;
    }
    return k;
}

/* ---- kernels: one thread per (row, head, pair) ----------------------------------------- */
/* pair i's angle-to-cos/sin past the table: the CPU's sequence (rope.c's
 * rope_cs of theta, theta already divided by any factor) */
__device__ __forceinline__ void rope_scaled_cs(const rope_k &k, float theta, int i, float *s, float *c) {
    if (k.ff) theta = __fdiv_rn(theta, k.ff[i]);
    if (k.scaled) ds_rope_yarn_sincos(theta, i, k.freq_scale, k.ext_factor, k.lo, k.hi, k.mscale, s, c);
    else ds_sincosf(theta, s, c);
}

/* cos and sin of pair i at position p: the host table, or past it the same
 * sequence on the same float angle on the device */
__device__ __forceinline__ void rope_cs(int p, int i, int half, const rope_k &k, float *c, float *s) {
    if (p >= 0 && p < DSC_ROPE_POS) {
        *c = k.cs[(int64_t)p * half + i];
        *s = k.cs[(int64_t)DSC_ROPE_POS * half + (int64_t)p * half + i];
    } else {
        rope_scaled_cs(k, __fmul_rn((float)p, k.inv[i]), i, s, c);
    }
}

__device__ __forceinline__ void rope_pair(float *xh, int i, int half, int neox, float c, float s) {
    float *a = neox ? xh + i : xh + 2 * i;
    float *b = neox ? xh + half + i : xh + 2 * i + 1;
    const float x0 = *a, x1 = *b;
    *a = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    *b = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

__global__ void rope_canonical(int64_t total, int n_heads, int hd, const int *__restrict__ pos,
                               int neox, rope_k k, float *x) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    const int half = hd / 2;
    const int i = (int)(t % half);
    const int64_t rh = t / half;                  /* row * n_heads + head */
    float c, s;
    rope_cs(pos[rh / n_heads], i, half, k, &c, &s);
    rope_pair(x + rh * hd, i, half, neox, c, s);
}

__global__ void rope_fast(int64_t total, int n_heads, int hd, const int *__restrict__ pos,
                          float freq_base, int neox, rope_k k, float *x) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    const int half = hd / 2;
    const int i = (int)(t % half);
    const int64_t rh = t / half;
    const float ratio = ds_powf(freq_base, -2.0f / (float)hd);
    float theta = (float)pos[rh / n_heads];
    for (int q = 0; q < i; q++) theta = __fmul_rn(theta, ratio);
    float s, c;
    rope_scaled_cs(k, theta, i, &s, &c);
    rope_pair(x + rh * hd, i, half, neox, c, s);
}

void dsc_rope_ext(ds_exec *ex, ds_variant v, int rows, int n_heads, int head_dim, const int *pos,
                  float freq_base, ds_rope_mode mode, const ds_rope_yarn *yarn, float *x) {
    if (rows <= 0 || n_heads <= 0 || head_dim < 2) return;
    const int64_t total = (int64_t)rows * n_heads * (head_dim / 2);
    const int neox = mode == DS_ROPE_NEOX;
    if (v == DS_FAST && !yarn) {
        const rope_k k = {NULL, NULL, NULL, 0, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f};
        rope_fast<<<dsc_blocks(total, 256), 256, 0, ex->st>>>(total, n_heads, head_dim, pos, freq_base, neox, k, x);
    } else {
        const dsc_rope_table *t = dsc_rope_get(ex, freq_base, head_dim, yarn);
        if (!t) return;
        if (v == DS_FAST)        /* the table's scaling and device factors, the recurrence's angles */
            rope_fast<<<dsc_blocks(total, 256), 256, 0, ex->st>>>(total, n_heads, head_dim, pos, freq_base, neox,
                                                                 rope_k_of(t), x);
        else
            rope_canonical<<<dsc_blocks(total, 256), 256, 0, ex->st>>>(total, n_heads, head_dim, pos, neox,
                                                                      rope_k_of(t), x);
    }
    DSC_LAUNCHED(ex, "rope");
}

void dsc_rope(ds_exec *ex, ds_variant v, int rows, int n_heads, int head_dim, const int *pos,
              float freq_base, ds_rope_mode mode, float *x) {
    dsc_rope_ext(ex, v, rows, n_heads, head_dim, pos, freq_base, mode, NULL, x);
}

/* ==========================================================================
 * the attention prologue in one launch (backend.h: qk_norm_rope_kv)
 * ==========================================================================
 * One warp per (row, head) of q and k: the canonical per-head RMSNorm scale
 * (dsc_rms_scale_canonical, rmsnorm.cu's), each element (x * scale) * w as
 * rmsnorm writes it, then the canonical rotation of each pair from the same
 * table — the separate launches' operations on the same values in the same
 * order, so the same bits. K heads also go to the cache row pos[r], with
 * this row's V head beside them (kv_write's copy). Decode steps are
 * launch-bound: five launches per layer become one. */
#define QRK_WARPS 4

__global__ void __launch_bounds__(32 * QRK_WARPS)
qk_norm_rope_kv_k(int M, int H, int Hkv, int hd, ds_rows rw, int neox, rope_k rk,
                  const float *__restrict__ qw, const float *__restrict__ kw, float eps,
                  float *q, float *k, const float *__restrict__ v, float *kc, float *vc) {
    dsc_pdl_wait();                              /* dsc_launch */
    dsc_pdl_trigger();
    const int heads = H + Hkv, lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * QRK_WARPS + threadIdx.x / 32;
    if (t >= (int64_t)M * heads) return;
    const int r = (int)(t / heads), h = (int)(t % heads);
    const bool is_k = h >= H;
    const int hk = h - H, kvd = Hkv * hd;
    float *x = is_k ? k + (int64_t)r * kvd + (int64_t)hk * hd : q + ((int64_t)r * H + h) * hd;
    const float *w = is_k ? kw : qw;
    const float scale = w ? dsc_rms_scale_canonical(x, hd, eps, lane) : 1.0f;
    __syncwarp();
    const int half = hd / 2, p = rw.pos[r];
    float *kdst = NULL;
    if (is_k) {
        const int64_t at = dsc_kv_at(dsc_kv_table(rw, r), rw.page_stride, p, kvd);
        kdst = kc + at + (int64_t)hk * hd;
        const float *vs = v + (int64_t)r * kvd + (int64_t)hk * hd;
        float *vd = vc + at + (int64_t)hk * hd;
        for (int i = lane; i < hd; i += 32) vd[i] = vs[i];
    }
    for (int i = lane; i < half; i += 32) {
        const int ia = neox ? i : 2 * i, ib = neox ? half + i : 2 * i + 1;
        float x0 = x[ia], x1 = x[ib];
        if (w) {
            x0 = __fmul_rn(__fmul_rn(x0, scale), w[ia]);
            x1 = __fmul_rn(__fmul_rn(x1, scale), w[ib]);
        }
        float c, s;
        rope_cs(p, i, half, rk, &c, &s);
        const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        const float y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        x[ia] = y0;
        x[ib] = y1;
        if (kdst) {
            kdst[ia] = y0;
            kdst[ib] = y1;
        }
    }
    /* an odd head_dim's last element: normed, never rotated (rope's pairs stop at half) */
    if ((hd & 1) && lane == 0) {
        float xl = x[hd - 1];
        if (w) xl = __fmul_rn(__fmul_rn(xl, scale), w[hd - 1]);
        x[hd - 1] = xl;
        if (kdst) kdst[hd - 1] = xl;
    }
}

void dsc_qk_norm_rope_kv(ds_exec *ex, int M, int n_head, int n_head_kv, int head_dim,
                         const ds_rows *r, float freq_base, ds_rope_mode mode, const float *q_norm,
                         const float *k_norm, float eps, float *q, float *k, const float *v,
                         float *kc, float *vc) {
    if (M <= 0 || n_head < 0 || n_head_kv <= 0 || head_dim < 2) return;
    const int *pos = r->pos;
    if (dsc_be(ex)->off & DSC_OFF_PROLOGUE) {      /* A/B: the separate launches */
        if (q_norm && n_head) dsc_rmsnorm(ex, DS_CANONICAL, M * n_head, head_dim, q, q_norm, eps, q);
        if (k_norm) dsc_rmsnorm(ex, DS_CANONICAL, M * n_head_kv, head_dim, k, k_norm, eps, k);
        if (n_head) dsc_rope(ex, DS_CANONICAL, M, n_head, head_dim, pos, freq_base, mode, q);
        dsc_rope(ex, DS_CANONICAL, M, n_head_kv, head_dim, pos, freq_base, mode, k);
        dsc_kv_write(ex, kc, vc, n_head_kv * head_dim, M, r, k, v);
        return;
    }
    if (r->page != DS_KV_PAGE) {
        dsc_note(ex, cudaErrorInvalidValue, "qk_norm_rope_kv: pages of other than 16 positions");
        return;
    }
    const dsc_rope_table *t = dsc_rope_get(ex, freq_base, head_dim, NULL);   /* plain RoPE only (layer.c) */
    if (!t) return;
    const int64_t warps = (int64_t)M * (n_head + n_head_kv);
    dsc_launch(ex, "qk_norm + rope + kv_write canonical", qk_norm_rope_kv_k, dim3(dsc_blocks(warps, QRK_WARPS)),
               dim3(32 * QRK_WARPS), 0, M, n_head, n_head_kv, head_dim, *r, (int)(mode == DS_ROPE_NEOX),
               rope_k_of(t), q_norm, k_norm, eps, q, k, v, kc, vc);
}
