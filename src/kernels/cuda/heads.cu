/* heads.cu — the drafter's heads and token selection on the GPU: backend.h's
 * add, fill, gate and sample ops (the table's arithmetic, spelled with the
 * _rn intrinsics), so that a speculative round keeps logits, the Markov
 * state and the chain's ids on the device and moves only ids to the host.
 *
 *   add     y = a + b                         elementwise, one rounding
 *   fill    x = v                             (MASK suppression, zero state)
 *   gate    sigmoid / sigmoid * e / the rnn update, elementwise
 *   sample  seeded Gumbel-max, one block per row, Philox-4x32-10 keyed on
 *           (seed, position, id) exactly as src/sampler.c
 *
 * None of these has a reduction whose rounding depends on an order: add,
 * fill and gate are elementwise, and sample's block reduction is a maximum
 * under a total order ((score, -id), NaN excluded), which every combine tree
 * answers identically. No atomics. There is no fast variant: the heads run
 * canonical in the drafter (drafter_forward.c), as on the CPU.
 *
 * ==== Why the bits match the CPU (or do not) ================================================
 * add and fill: identical (one IEEE addition; a store).
 *
 * gate: identical. Both sides call ds_sigmoidf (1 / (1 + ds_expf(-t))) and
 * ds_tanhf from kernels/dsmath.h: fixed sequences of IEEE operations (the
 * tanh in double, rounded once), compiled for the host and the device alike.
 * Until issue 22's item 6 the CPU used glibc's expf / tanhf and this file
 * exp / tanh in double, which differed in the last bit on ~2.6e-4 of the
 * sigmoids and ~14% of the tanhs (never by more than 2 ulp); now the gated /
 * rnn Markov heads and the confidence agree bit for bit.
 *
 * sample: the integer part (Philox, the 53-bit uniform, the pair layout,
 * the 42-logit skip window, the tie rule), the float division x = l / t and
 * the Gumbel noise -ds_log(-ds_log(u)) (kernels/dsmath.h, the sampler's own
 * double log) are bit-identical to sampler.c, so CPU and GPU sample the same
 * tokens from the same logits. top-k / top-p / min-p are
 * not implemented here: the op declines them and ds_backend_select selects
 * on the host from downloaded logits (the documented slow path). */
#include "kernels/cuda/heads.cuh"

#include <math.h>

/* ---- add, fill ----------------------------------------------------------------------- */

__global__ void add_k(int64_t n, const float *a, const float *b, float *y) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(a[i], b[i]);       /* y may alias a or b: one read each first */
}

void dsc_add(ds_exec *ex, int64_t n, const float *a, const float *b, float *y) {
    if (n <= 0) return;
    add_k<<<dsc_blocks(n, 256), 256, 0, DSC_EXEC_STREAM(ex)>>>(n, a, b, y);
    DSC_LAUNCHED(ex, "add");
}

__global__ void fill_k(int64_t n, float *x, float v) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

void dsc_fill(ds_exec *ex, int64_t n, float *x, float v) {
    if (n <= 0) return;
    fill_k<<<dsc_blocks(n, 256), 256, 0, DSC_EXEC_STREAM(ex)>>>(n, x, v);
    DSC_LAUNCHED(ex, "fill");
}

/* ---- gate ---------------------------------------------------------------------------- */

/* the CPU's gate functions (kernels/dsmath.h; the header says why) */
__device__ __forceinline__ float heads_tanhf(float t) { return ds_tanhf(t); }
__device__ __forceinline__ float heads_sigmoidf(float t) { return ds_sigmoidf(t); }

__global__ void gate_k(int kind, int n, const float *__restrict__ a, const float *__restrict__ b,
                       const float *__restrict__ e, float *s, float *y) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    if (kind == DS_GATE_SIGMOID) {
        y[j] = heads_sigmoidf(__fadd_rn(a[j], b[j]));
    } else if (kind == DS_GATE_SIGMOID_MUL) {
        y[j] = __fmul_rn(heads_sigmoidf(__fadd_rn(a[j], b[j])), e[j]);
    } else {   /* DS_GATE_RNN: s = g s + (1 - g) c, y = tanh(o), two products and a sum */
        const float g = heads_sigmoidf(__fadd_rn(a[j], b[j]));
        const float c = heads_tanhf(__fadd_rn(a[n + j], b[n + j]));
        s[j] = __fadd_rn(__fmul_rn(g, s[j]), __fmul_rn(__fsub_rn(1.0f, g), c));
        y[j] = heads_tanhf(__fadd_rn(a[2 * n + j], b[2 * n + j]));
    }
}

void dsc_gate(ds_exec *ex, ds_gate_kind kind, int n, const float *a, const float *b, const float *e,
              float *s, float *y) {
    if (n <= 0) return;
    gate_k<<<dsc_blocks(n, 128), 128, 0, DSC_EXEC_STREAM(ex)>>>((int)kind, n, a, b, e, s, y);
    DSC_LAUNCHED(ex, "gate");
}

/* ---- sample: Gumbel-max with Philox-4x32-10 ------------------------------------------ */

#define SMP_THREADS 256
#define SMP_G_SPAN 42.0          /* sampler.c's skip window: noise lies in [-3.62, 37.43] */

/* Random123's Philox-4x32-10, as ds_philox4x32_10 (integer arithmetic only) */
__device__ __forceinline__ void heads_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                             uint32_t k0, uint32_t k1, uint32_t out[4]) {
    for (int r = 0; r < 10; r++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* the top 53 bits plus one half, times 2^-53: exact in double, in (0, 1) */
__device__ __forceinline__ double heads_u53(uint32_t lo, uint32_t hi) {
    const uint64_t x = ((uint64_t)hi << 32) | lo;
    return __dmul_rn(__dadd_rn((double)(x >> 11), 0.5), 1.0 / 9007199254740992.0);
}

__device__ __forceinline__ double heads_gumbel(double u) { return -ds_log(-ds_log(u)); }

/* (score, id) with a total order: larger score first, then lower id; id < 0 = none */
__device__ __forceinline__ void smp_pick(double &bs, int &bi, double s, int i) {
    if (i < 0) return;
    if (bi < 0 || s > bs || (s == bs && i < bi)) { bs = s; bi = i; }
}
/* argmax's order: larger value, then lower index (NaN never enters) */
__device__ __forceinline__ void arg_pick2(float &bv, int &bi, float v, int i) {
    if (i < 0) return;
    if (bi < 0 || v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
}

__global__ void sample_rows(int n, const float *__restrict__ x, float temp, uint32_t k0, uint32_t k1,
                            int64_t pos0, int32_t *out) {
    __shared__ float  s_xmax[SMP_THREADS / 32];
    __shared__ float  s_av[SMP_THREADS / 32];
    __shared__ int    s_ai[SMP_THREADS / 32];
    __shared__ double s_bs[SMP_THREADS / 32];
    __shared__ int    s_bi[SMP_THREADS / 32];
    __shared__ double s_lim;
    __shared__ int    s_arg;
    const float *xr = x + (int64_t)blockIdx.x * n;
    const uint64_t up = (uint64_t)(pos0 + (int64_t)blockIdx.x);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;

    /* pass 1: the largest x = l / t (NaN skipped) and the argmax fallback */
    float xmax = -INFINITY, av = 0.0f;
    int ai = -1;
    for (int i = threadIdx.x; i < n; i += SMP_THREADS) {
        const float l = xr[i];
        if (l != l) continue;
        const float q = __fdiv_rn(l, temp);
        if (q > xmax) xmax = q;
        arg_pick2(av, ai, l, i);
    }
    for (int o = 16; o >= 1; o /= 2) {
        const float ox = __shfl_xor_sync(0xffffffffu, xmax, o);
        const float ov = __shfl_xor_sync(0xffffffffu, av, o);
        const int oi = __shfl_xor_sync(0xffffffffu, ai, o);
        if (ox > xmax) xmax = ox;
        arg_pick2(av, ai, ov, oi);
    }
    if (lane == 0) { s_xmax[warp] = xmax; s_av[warp] = av; s_ai[warp] = ai; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SMP_THREADS / 32; w++) {
            if (s_xmax[w] > xmax) xmax = s_xmax[w];
            arg_pick2(av, ai, s_av[w], s_ai[w]);
        }
        s_lim = __dsub_rn((double)xmax, SMP_G_SPAN);
        s_arg = ai < 0 ? 0 : ai;
    }
    __syncthreads();
    const double lim = s_lim;

    /* pass 2: one Philox block per pair of ids, drawn only for a live pair */
    double bs = -INFINITY;
    int bi = -1;
    for (int q = threadIdx.x; 2 * q < n; q += SMP_THREADS) {
        const int i = 2 * q;
        int live = 0;
        for (int j = 0; j < 2 && i + j < n; j++) {
            const float l = xr[i + j];
            live |= l == l && (double)__fdiv_rn(l, temp) >= lim;
        }
        if (!live) continue;
        uint32_t r[4];
        heads_philox((uint32_t)up, (uint32_t)(up >> 32), (uint32_t)q, 0u, k0, k1, r);
        for (int j = 0; j < 2 && i + j < n; j++) {
            const float l = xr[i + j];
            if (l != l) continue;                                        /* NaN never wins */
            const float xq = __fdiv_rn(l, temp);
            if (xq == -INFINITY || (double)xq < lim) continue;
            const double u = j ? heads_u53(r[2], r[3]) : heads_u53(r[0], r[1]);
            const double sc = __dadd_rn((double)xq, heads_gumbel(u));
            if (sc > -INFINITY) smp_pick(bs, bi, sc, i + j);  /* sampler.c: sc > best, best from -inf */
        }
    }
    for (int o = 16; o >= 1; o /= 2) {
        const double os = __shfl_xor_sync(0xffffffffu, bs, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        smp_pick(bs, bi, os, oi);
    }
    if (lane == 0) { s_bs[warp] = bs; s_bi[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SMP_THREADS / 32; w++) smp_pick(bs, bi, s_bs[w], s_bi[w]);
        out[blockIdx.x] = bi >= 0 ? bi : s_arg;                        /* sampler.c's fallback */
    }
}

int dsc_sample(ds_exec *ex, const ds_sampler *smp, int rows, int n, const float *x, int64_t pos0,
               float *scratch, int32_t *out) {
    (void)scratch;                                /* one pass per row needs none */
    if (rows <= 0 || n <= 0) return 0;
    if (!smp || !(smp->temp > 0.0f)) {            /* ds_sample's greedy rule */
        dsc_argmax(ex, rows, n, x, out);
        return 0;
    }
    if ((smp->top_k > 0 && smp->top_k < n) || smp->top_p < 1.0f || smp->min_p > 0.0f)
        return -1;                                /* filters: the host fallback (sampler.c's rules) */
    sample_rows<<<rows, SMP_THREADS, 0, DSC_EXEC_STREAM(ex)>>>(n, x, smp->temp, (uint32_t)smp->seed,
                                                  (uint32_t)(smp->seed >> 32), pos0, out);
    DSC_LAUNCHED(ex, "sample");
    return 0;
}

/* ==========================================================================
 * the drafter's head chain in one launch (backend.h: draft_chain)
 * ==========================================================================
 * A round's sequential part: per slot, the Markov bias of the token chosen
 * at the previous slot, MASK suppression, the confidence, the argmax that
 * picks the next token. Issued op by op that is ~10 launches per slot, each
 * tiny; here ONE launch walks the slots. Every value is the op-by-op value:
 *   e        dsc_embed_elem (embed's conversion)
 *   W2 e     Q8_0 canonical: e quantized by dsc_q8_block, per output the
 *            exact int block dots, acc = fma((float)D, w_d * e_d, acc) in
 *            block order from +0 (matmul_q8_0.cu's chain)
 *   z + b    one __fadd_rn (add)            z[mask] = mask_logit (fill)
 *   conf     the same Q8_0 chain over [h_k; e], then heads_sigmoidf(l + b)
 *   argmax   strict > per thread in index order, dsc_arg_pick across
 *            threads and blocks (argmax_rows' rule: the first maximum, NaN
 *            never wins — a total order, so any combine tree answers alike)
 * Declined (the engine issues the ops): non-Q8_0 W2 / confidence weights,
 * rank > 1024, a confidence row > 4096, more than CH_KEEP_MAX slots.
 *
 * The vocabulary is split over CH_BLOCKS-ish blocks (one SM each), not one:
 * a single block streamed W2 (V x rank int8) through one SM per slot and
 * took 62 us for the shipped drafter's seven slots, a third of the whole
 * draft round (ncu, bench/results/cuda-ncu-h200.txt). Each block writes its
 * range's first maximum to partials[k][block], then a grid barrier; every
 * block then combines all partials (the same answer everywhere, so the next
 * slot needs no second barrier) and block 0 stores the token. The barrier is
 * a counter in device memory that the last block out resets to 0, so the
 * launch is the same every replay; the grid never exceeds the SM count, so
 * every block is resident (a block of this size fits any SM) and the spin
 * cannot starve a block that has not started. The counter is no reduction:
 * it orders, it never sums a value. Partials are read through L2 (__ldcg):
 * L1 is not coherent across blocks. */
#define CH_THREADS 256
#define CH_R_MAX 1024
#define CH_KC_MAX 4096
#define CH_KEEP_MAX DSC_CHAIN_KEEP

struct ch_args {
    int n_keep, V, D, r, kc, conf_with_markov;
    uint32_t w1_type;
    const void *w1;
    const float *w1_scale;
    int64_t w1_rows;
    const int8_t *w2;
    const float *w2_scale;
    const int8_t *cw;
    const float *cw_scale;
    const float *h;
    float *z;
    int32_t *toks;
    int32_t mask_id;
    float mask_logit;
    const float *conf_b;
    float *conf_logit, *conf;
    int per_block;                 /* vocabulary entries per block          */
    int64_t sd;                    /* rows (and ids) from one slot to the next */
    unsigned *sync;                /* [2]: barrier arrivals, blocks done     */
    float *pv;                     /* [CH_KEEP_MAX][gridDim.x] partial max   */
    long long *pi;                 /*                          its index     */
};

__device__ __forceinline__ void ch_grid_barrier(unsigned *arrivals, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();                       /* this block's partial before its arrival */
        atomicAdd(arrivals, 1u);
        while (*(volatile unsigned *)arrivals < target) {
        }
        __threadfence();
    }
    __syncthreads();
}

/* The end of a launch that used ch_grid_barrier: the last block out leaves
 * the counters at 0 for the next launch (every block has passed every
 * barrier once all have counted themselves here), so a recorded launch
 * replays unchanged. */
__device__ __forceinline__ void ch_grid_done(unsigned *sync, int nblk) {
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(sync + 1, 1u) == (unsigned)nblk - 1) {
            sync[0] = 0;
            sync[1] = 0;
            __threadfence();
        }
    }
}

__global__ void __launch_bounds__(CH_THREADS) draft_chain_k(const ch_args a) {
    __shared__ float e[CH_R_MAX];
    __shared__ float in[CH_KC_MAX];
    __shared__ __align__(16) uint4 xq[2 * (CH_KC_MAX / 32)];
    __shared__ float xs[CH_KC_MAX / 32];
    __shared__ int dots[CH_KC_MAX / 32];
    __shared__ float av[CH_THREADS / 32];
    __shared__ long long ai[CH_THREADS / 32];
    __shared__ int32_t next;
    const int t = threadIdx.x, lane = t & 31, warp = t / 32, nblk = gridDim.x;
    const int nbr = a.r / 32, nbc = a.kc / 32;
    const int64_t n0 = (int64_t)blockIdx.x * a.per_block;
    const int64_t n1 = n0 + a.per_block < a.V ? n0 + a.per_block : a.V;
    int64_t prev = a.toks[0];
    /* The common shape (a rank-32 Markov head, an entry per thread): this
     * thread's W2 row and scale do not depend on the slot, so they are
     * loaded once, and the next slot's logit is loaded before the barrier —
     * a slot's critical path keeps only the loads that need its token. */
    const int64_t n_own = n0 + t;
    const bool own = a.w2 && nbr == 1 && a.per_block <= CH_THREADS && n_own < n1;
    uint4 w0 = make_uint4(0, 0, 0, 0), w1 = w0;
    float ws = 0.0f, znext = 0.0f;
    if (own) {
        const uint4 *wr = (const uint4 *)(a.w2 + n_own * a.r);
        w0 = __ldg(wr);
        w1 = __ldg(wr + 1);
        ws = __ldg(a.w2_scale + n_own);
        znext = a.z[n_own];
    }
    for (int k = 0; k < a.n_keep; k++) {
        float *zk = a.z + (int64_t)k * a.sd * a.V;
        if (a.w2) {
            /* e = W1[prev] */
            for (int j = t; j < a.r; j += CH_THREADS)
                e[j] = prev < 0 || prev >= a.w1_rows ? __int_as_float(0x7fc00000)
                                                     : dsc_embed_elem(a.w1_type, a.w1, a.w1_scale, a.r, prev, j);
            __syncthreads();
            for (int b = t; b < nbr; b += CH_THREADS) xs[b] = dsc_q8_block(e + 32 * b, xq + 2 * b);
            __syncthreads();
        }
        /* z_k (+ W2 e), MASK, and this thread's first maximum in its range */
        float bv = 0.0f;
        int64_t bi = -1;
        if (own) {                                 /* the same operations as the loop below */
            const int D = dsc_dot_q8(w0, w1, xq[0], xq[1]);
            float zv = __fadd_rn(znext, __fmaf_rn((float)D, __fmul_rn(ws, xs[0]), 0.0f));
            if (n_own == a.mask_id) zv = a.mask_logit;
            zk[n_own] = zv;
            if (zv == zv) { bv = zv; bi = n_own; }
            if (k + 1 < a.n_keep) znext = zk[a.sd * a.V + n_own];
        }
        for (int64_t n = n0 + t; !own && n < n1; n += CH_THREADS) {
            float zv = zk[n];
            if (a.w2) {
                float acc = 0.0f;
                const uint4 *wr = (const uint4 *)(a.w2 + n * a.r);
                for (int b = 0; b < nbr; b++) {
                    const int D = dsc_dot_q8(__ldg(wr + 2 * b), __ldg(wr + 2 * b + 1), xq[2 * b], xq[2 * b + 1]);
                    acc = __fmaf_rn((float)D, __fmul_rn(__ldg(a.w2_scale + n * nbr + b), xs[b]), acc);
                }
                zv = __fadd_rn(zv, acc);
            }
            if (n == a.mask_id) zv = a.mask_logit;
            zk[n] = zv;
            if (zv == zv && (bi < 0 || zv > bv)) { bv = zv; bi = n; }
        }
        for (int o = 16; o >= 1; o /= 2) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            dsc_arg_pick(bv, bi, ov, oi);
        }
        if (lane == 0) { av[warp] = bv; ai[warp] = bi; }
        __syncthreads();
        if (t == 0) {
            for (int w = 1; w < CH_THREADS / 32; w++) dsc_arg_pick(bv, bi, av[w], ai[w]);
            a.pv[k * nblk + blockIdx.x] = bv;
            a.pi[k * nblk + blockIdx.x] = bi;
        }
        /* the confidence (block 0, while the others wait at the barrier):
         * [h_k; e] quantized, one Q8_0 chain, the sigmoid */
        if (a.cw && blockIdx.x == 0) {
            for (int j = t; j < a.kc; j += CH_THREADS)
                in[j] = j < a.D ? a.h[(int64_t)k * a.sd * a.D + j] : e[j - a.D];
            __syncthreads();                   /* xq / xs reused below */
            for (int b = t; b < nbc; b += CH_THREADS) xs[b] = dsc_q8_block(in + 32 * b, xq + 2 * b);
            __syncthreads();
            for (int b = t; b < nbc; b += CH_THREADS) {
                const uint4 *wp = (const uint4 *)(a.cw + (int64_t)b * 32);
                dots[b] = dsc_dot_q8(__ldg(wp), __ldg(wp + 1), xq[2 * b], xq[2 * b + 1]);
            }
            __syncthreads();
            if (t == 0) {
                float acc = 0.0f;
                for (int b = 0; b < nbc; b++) acc = __fmaf_rn((float)dots[b], __fmul_rn(__ldg(a.cw_scale + b), xs[b]), acc);
                a.conf_logit[0] = acc;
                a.conf[k] = heads_sigmoidf(__fadd_rn(acc, a.conf_b[0]));
            }
        }
        ch_grid_barrier(a.sync, (unsigned)nblk * (unsigned)(k + 1));
        /* every block: the first maximum over all partials -> the next token */
        if (warp == 0) {
            float v = 0.0f;
            int64_t i = -1;
            for (int b = lane; b < nblk; b += 32)
                dsc_arg_pick(v, i, __ldcg(a.pv + k * nblk + b), (int64_t)__ldcg(a.pi + k * nblk + b));
            for (int o = 16; o >= 1; o /= 2) {
                const float ov = __shfl_xor_sync(0xffffffffu, v, o);
                const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
                dsc_arg_pick(v, i, ov, oi);
            }
            if (lane == 0) {
                next = i < 0 ? 0 : (int32_t)i;
                if (blockIdx.x == 0) a.toks[(int64_t)(k + 1) * a.sd] = next;
            }
        }
        __syncthreads();
        prev = next;
    }
    ch_grid_done(a.sync, nblk);
}

/* ---- many sequences' chains in one launch (ds_draft_chain.n_seq > 1) -----
 * A batched drafting pass (ds_draft_many) has up to 16 sequences' chains;
 * launched one after another each pays the launch, its slots' grid
 * barriers and a full read of W2 per slot. Here one launch walks the slots
 * once for all of them: per slot, every sequence still drafting embeds its
 * previous token and quantizes it (dsc_q8_block), each thread reads its
 * vocabulary entries' W2 rows ONCE and applies them to every sequence's
 * activation, each sequence keeps its own first maximum, and one grid
 * barrier serves all. Per sequence and entry the value is the single
 * chain's: acc = fma((float)D, w_scale * e_scale, acc) over the rank's
 * blocks in order, z + acc, the MASK logit, and the first maximum (NaN
 * never wins) — dsc_arg_pick's total order, so the combine tree is free.
 * Partials are double-buffered by slot parity: a block writes slot k + 2's
 * only after barrier k + 1, which every block reaches after reading slot
 * k's. Declined (the per-sequence launches run): no Markov head, rank >
 * CHM_R_MAX, a confidence head, more than DS_CHAIN_SEQ_MAX sequences. */
#define CHM_R_MAX 256

struct chm_args {
    int n_seq, keep[DS_CHAIN_SEQ_MAX], V, r;
    uint32_t w1_type;
    const void *w1;
    const float *w1_scale;
    int64_t w1_rows;
    const int8_t *w2;
    const float *w2_scale;
    float *z;
    int32_t *toks;
    int64_t sd;
    int32_t mask_id;
    float mask_logit;
    int per_block;
    unsigned *sync;
    float *pv;                     /* [2][n_seq][gridDim.x] */
    long long *pi;
};

__global__ void __launch_bounds__(CH_THREADS) draft_chain_many_k(const chm_args a) {
    __shared__ float e[DS_CHAIN_SEQ_MAX * CHM_R_MAX];
    __shared__ __align__(16) uint4 xq[DS_CHAIN_SEQ_MAX * 2 * (CHM_R_MAX / 32)];
    __shared__ float xs[DS_CHAIN_SEQ_MAX * (CHM_R_MAX / 32)];
    __shared__ float av[CH_THREADS / 32][DS_CHAIN_SEQ_MAX];
    __shared__ long long ai[CH_THREADS / 32][DS_CHAIN_SEQ_MAX];
    __shared__ int32_t prev[DS_CHAIN_SEQ_MAX];
    const int t = threadIdx.x, lane = t & 31, warp = t / 32, nblk = gridDim.x;
    const int nbr = a.r / 32;
    const int64_t n0 = (int64_t)blockIdx.x * a.per_block;
    const int64_t n1 = n0 + a.per_block < a.V ? n0 + a.per_block : a.V;
    if (t < a.n_seq) prev[t] = a.toks[t];
    __syncthreads();
    for (int k = 0; k < a.keep[0]; k++) {
        int na = 0;                                /* sequences still drafting: a prefix */
        while (na < a.n_seq && a.keep[na] > k) na++;
        /* e_s = W1[prev_s], then its Q8_0 blocks */
        for (int i = t; i < na * a.r; i += CH_THREADS) {
            const int s = i / a.r, j = i - s * a.r;
            const int64_t p = prev[s];
            e[i] = p < 0 || p >= a.w1_rows ? __int_as_float(0x7fc00000) : dsc_embed_elem(a.w1_type, a.w1, a.w1_scale, a.r, p, j);
        }
        __syncthreads();
        for (int i = t; i < na * nbr; i += CH_THREADS) xs[i] = dsc_q8_block(e + 32 * i, xq + 2 * i);
        __syncthreads();
        float bv[DS_CHAIN_SEQ_MAX];
        long long bi[DS_CHAIN_SEQ_MAX];
#pragma unroll
        for (int s = 0; s < DS_CHAIN_SEQ_MAX; s++) { bv[s] = 0.0f; bi[s] = -1; }
        for (int64_t n = n0 + t; n < n1; n += CH_THREADS) {
            const uint4 *wr = (const uint4 *)(a.w2 + n * a.r);
#pragma unroll
            for (int s = 0; s < DS_CHAIN_SEQ_MAX; s++) {
                if (s >= na) continue;
                float *zs = a.z + ((int64_t)k * a.sd + s) * a.V;
                float acc = 0.0f;
                for (int b = 0; b < nbr; b++) {
                    const int D = dsc_dot_q8(__ldg(wr + 2 * b), __ldg(wr + 2 * b + 1), xq[2 * (s * nbr + b)],
                                             xq[2 * (s * nbr + b) + 1]);
                    acc = __fmaf_rn((float)D, __fmul_rn(__ldg(a.w2_scale + n * nbr + b), xs[s * nbr + b]), acc);
                }
                float zv = __fadd_rn(zs[n], acc);
                if (n == a.mask_id) zv = a.mask_logit;
                zs[n] = zv;
                if (zv == zv && (bi[s] < 0 || zv > bv[s])) { bv[s] = zv; bi[s] = n; }
            }
        }
#pragma unroll
        for (int s = 0; s < DS_CHAIN_SEQ_MAX; s++) {
            if (s >= na) continue;
            float v = bv[s];
            int64_t i = bi[s];
            for (int o = 16; o >= 1; o /= 2) {
                const float ov = __shfl_xor_sync(0xffffffffu, v, o);
                const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
                dsc_arg_pick(v, i, ov, oi);
            }
            if (lane == 0) { av[warp][s] = v; ai[warp][s] = i; }
        }
        __syncthreads();
        const int buf = k & 1;
        if (t < na) {
            float v = av[0][t];
            int64_t i = ai[0][t];
            for (int w = 1; w < CH_THREADS / 32; w++) dsc_arg_pick(v, i, av[w][t], ai[w][t]);
            a.pv[((int64_t)buf * a.n_seq + t) * nblk + blockIdx.x] = v;
            a.pi[((int64_t)buf * a.n_seq + t) * nblk + blockIdx.x] = i;
        }
        ch_grid_barrier(a.sync, (unsigned)nblk * (unsigned)(k + 1));
        /* every block: each sequence's first maximum over all partials */
        for (int s = warp; s < na; s += CH_THREADS / 32) {
            float v = 0.0f;
            int64_t i = -1;
            for (int b = lane; b < nblk; b += 32)
                dsc_arg_pick(v, i, __ldcg(a.pv + ((int64_t)buf * a.n_seq + s) * nblk + b),
                             (int64_t)__ldcg(a.pi + ((int64_t)buf * a.n_seq + s) * nblk + b));
            for (int o = 16; o >= 1; o /= 2) {
                const float ov = __shfl_xor_sync(0xffffffffu, v, o);
                const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
                dsc_arg_pick(v, i, ov, oi);
            }
            if (lane == 0) {
                const int32_t nx = i < 0 ? 0 : (int32_t)i;
                prev[s] = nx;
                if (blockIdx.x == 0) a.toks[(int64_t)(k + 1) * a.sd + s] = nx;
            }
        }
        __syncthreads();
    }
    ch_grid_done(a.sync, nblk);
}

static int draft_chain_many(ds_exec *ex, const ds_draft_chain *c, const dsc_weight *w1, const dsc_weight *w2) {
    if (c->n_seq > DS_CHAIN_SEQ_MAX || !w2 || c->conf_w || c->stride < c->n_seq) return 1;
    const int r = (int)w2->n_in;
    if (w2->type != DS_TYPE_Q8_0 || r % 32 || r > CHM_R_MAX || w2->n_out != c->V || w1->n_in != r) return 1;
    if (w1->type != DS_TYPE_F32 && w1->type != DS_TYPE_F16 && w1->type != DS_TYPE_BF16 && w1->type != DS_TYPE_Q8_0) return 1;
    for (int i = 0; i < c->n_seq; i++)
        if (c->keep[i] < 1 || c->keep[i] > CH_KEEP_MAX || (i && c->keep[i] > c->keep[i - 1])) return 1;
    int nblk = (c->V + CH_THREADS - 1) / CH_THREADS;
    const int n_sm = dsc_be(ex)->n_sm > 0 ? dsc_be(ex)->n_sm : 1;
    if (nblk > n_sm) nblk = n_sm;
    if (nblk > DSC_CHAIN_BLOCKS) nblk = DSC_CHAIN_BLOCKS;
    /* the partials' two buffers fit where the single chain keeps its slots' */
    if ((size_t)2 * c->n_seq * nblk > (size_t)CH_KEEP_MAX * DSC_CHAIN_BLOCKS) return 1;
    chm_args a;
    a.n_seq = c->n_seq;
    for (int i = 0; i < DS_CHAIN_SEQ_MAX; i++) a.keep[i] = i < c->n_seq ? c->keep[i] : 0;
    a.V = c->V; a.r = r;
    a.w1_type = w1->type; a.w1 = w1->data; a.w1_scale = w1->scale; a.w1_rows = w1->n_out;
    a.w2 = (const int8_t *)w2->data; a.w2_scale = w2->scale;
    a.z = c->z; a.toks = c->toks; a.sd = c->stride;
    a.mask_id = c->mask_id; a.mask_logit = c->mask_logit;
    a.per_block = (c->V + nblk - 1) / nblk;
    a.sync = ex->chain_sync;
    a.pv = (float *)(ex->chain_sync + 4);
    a.pi = (long long *)(a.pv + CH_KEEP_MAX * DSC_CHAIN_BLOCKS);
    draft_chain_many_k<<<nblk, CH_THREADS, 0, DSC_EXEC_STREAM(ex)>>>(a);
    DSC_LAUNCHED(ex, "draft chain (many)");
    return 0;
}

int dsc_draft_chain(ds_exec *ex, const ds_draft_chain *c) {
    const dsc_weight *w1 = c->w1 ? dsc_w(c->w1) : NULL, *w2 = c->w2 ? dsc_w(c->w2) : NULL;
    const dsc_weight *cw = c->conf_w ? dsc_w(c->conf_w) : NULL;
    if ((c->w1 && !w1) || (c->w2 && !w2) || (c->conf_w && !cw) || (!w1) != (!w2)) return 1;
    if (c->n_keep < 1 || c->n_keep > CH_KEEP_MAX || c->V < 1 || c->D < 1 || (dsc_be(ex)->off & DSC_OFF_CHAIN))
        return 1;
    if (!ex->chain_sync) return 1;
    if (c->n_seq > 1) return draft_chain_many(ex, c, w1, w2);
    if (w1 && w1->type != DS_TYPE_F32 && w1->type != DS_TYPE_F16 && w1->type != DS_TYPE_BF16 &&
        w1->type != DS_TYPE_Q8_0)
        return 1;                                  /* dsc_embed_elem's layouts only */
    const int r = w2 ? (int)w2->n_in : 0;
    if (w2 && (w2->type != DS_TYPE_Q8_0 || r % 32 || r > CH_R_MAX || w2->n_out != c->V || w1->n_in != r)) return 1;
    const int kc = cw ? (int)cw->n_in : 0;
    if (cw && (cw->type != DS_TYPE_Q8_0 || kc % 32 || kc > CH_KC_MAX || cw->n_out != 1 ||
               kc != c->D + (c->conf_with_markov ? r : 0)))
        return 1;
    /* blocks: a thread per entry up to the SM count (every block resident) */
    int nblk = (c->V + CH_THREADS - 1) / CH_THREADS;
    const int n_sm = dsc_be(ex)->n_sm > 0 ? dsc_be(ex)->n_sm : 1;
    if (nblk > n_sm) nblk = n_sm;
    if (nblk > DSC_CHAIN_BLOCKS) nblk = DSC_CHAIN_BLOCKS;
    ch_args a;
    a.n_keep = c->n_keep; a.V = c->V; a.D = c->D; a.r = r; a.kc = kc; a.conf_with_markov = c->conf_with_markov;
    a.w1_type = w1 ? w1->type : 0; a.w1 = w1 ? w1->data : NULL; a.w1_scale = w1 ? w1->scale : NULL;
    a.w1_rows = w1 ? w1->n_out : 0;
    a.w2 = w2 ? (const int8_t *)w2->data : NULL; a.w2_scale = w2 ? w2->scale : NULL;
    a.cw = cw ? (const int8_t *)cw->data : NULL; a.cw_scale = cw ? cw->scale : NULL;
    a.h = c->h; a.z = c->z; a.toks = c->toks; a.mask_id = c->mask_id; a.mask_logit = c->mask_logit;
    a.conf_b = c->conf_b; a.conf_logit = c->conf_logit; a.conf = c->conf;
    a.per_block = (c->V + nblk - 1) / nblk;
    a.sd = c->stride > 1 ? c->stride : 1;   /* a batched round's slot-major rows */
    a.sync = ex->chain_sync;
    a.pv = (float *)(ex->chain_sync + 4);
    a.pi = (long long *)(a.pv + CH_KEEP_MAX * DSC_CHAIN_BLOCKS);
    draft_chain_k<<<nblk, CH_THREADS, 0, DSC_EXEC_STREAM(ex)>>>(a);
    DSC_LAUNCHED(ex, "draft chain");
    return 0;
}
