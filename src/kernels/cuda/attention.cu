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
 *   split-KV   (canonical, rows of ATS_SPLIT_MIN = 3 chunks and more, i.e.
 *              past 128 positions; head_dim <= 128) att_split computes every 64-key chunk of
 *              every long row as a work item of its own — many blocks per
 *              row, K and V of a chunk staged in shared memory once for all
 *              the GQA heads and rows of the item — and parks each chunk's
 *              (max, exp-sum, p.V); att_canonical then folds a row's parked
 *              chunks in chunk order. The split size is the definition's
 *              chunk and the fold is its fold, so the bits are exactly the
 *              one-block path's and the CPU's: no count of splits, blocks,
 *              rows or sequences enters the arithmetic (details at
 *              att_split). DSPARK_CUDA_OFF=split keeps every row on the
 *              one-block paths below (A/B: the same bits).
 *   tile       (canonical, prefill: a call of >= 64 rows of one sequence
 *              whose tiles fill half the SMs; head_dim 64 or 128) att_tile: a
 *              block owns 64 queries of one kv head (its GQA heads of
 *              consecutive rows) and walks the chunks in order, K and V
 *              staged one chunk ahead (cp.async), each score, max, exp,
 *              sum, p.V and fold by the definition's own sequence in one
 *              thread's registers; nothing parked, one kernel. The same bits
 *              as the paths below (details at att_tile). Rows of several
 *              sequences (the batch engine's prompt chunks) take it where
 *              the caller gives the runs (ds_rows.runs): each run of >= 64
 *              rows in tiles of its own rows, the other rows on the split
 *              path (att_tile_runs; DSPARK_CUDA_OFF=runs keeps them on
 *              the split path: an A/B, the same bits).
 *              DSPARK_CUDA_OFF=tile: never; DSPARK_CUDA_ON=tile: every
 *              one-sequence call (A/B and tests: the same bits).
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

/* ==========================================================================
 * SPLIT-KV — the chunks of long rows computed by many blocks at once
 * ========================================================================== */
/* The canonical definition cuts a row's prefix into chunks of 64 keys at
 * absolute positions; every quantity of a chunk (its scores, max, exps,
 * exp-sum and p.V) depends on that chunk and the row's query alone, and
 * only the fold links chunks (left to right). So for long rows (at least
 * ATS_SPLIT_MIN chunks) att_split computes every chunk's (max, sum, p.V)
 * as a work item of its own and parks it in device memory (ats_part), and
 * att_canonical then folds the parked chunks in chunk order: the fixed
 * split size is the chunk itself, and the fold is the definition's, so the
 * bits are the CPU's and the short path's whatever the number of blocks,
 * of rows or of sequences in the call (nothing is reordered: no split count
 * or block count appears in any arithmetic).
 *
 * A work item is (up to ATS_R consecutive rows, up to ATS_QG GQA heads of
 * one kv head, one chunk): the chunk's K and V rows (64 x head_dim each)
 * are copied into shared memory once (cp.async) and serve every query of
 * the item — rows that belong to another sequence than the first go in a
 * further pass over their own page table. Blocks take the chunks of their
 * (row group, head group) at a stride of S (chosen to fill the GPU; it
 * moves work, never a bit). Per query and chunk, exactly the CPU's
 * sequence: the 16-lane dot (lane = d mod 16, the head_dim % 16 tail in its
 * lanes, tree 8-4-2-1) times scale, the chunk max (order-free), ds_expf(s -
 * max), the sum of p in key order from +0, p.V per d in key order from +0. */
#define ATS_THREADS 256
#define ATS_QG 4                /* GQA heads per work item                      */
#define ATS_R 8                 /* rows per work item at most                   */
#define ATS_QMAX (ATS_QG * ATS_R)
#define ATS_SPLIT_MIN 3         /* rows of at least this many chunks take the split path */
#define ATS_PART_CAP ((size_t)256 << 20)   /* parked chunks per pass of rows */
#define ATS_FB 16               /* the fold's loads in flight per thread         */
static_assert(ATS_THREADS == 32 * ATT_WARPS, "att_split and att_canonical share the warp count");
static_assert(DS_ROWS_SHORT <= (ATS_SPLIT_MIN - 1) * ATT_CHUNK, "a short call (model.c's graph key) has no split row");

/* Where the chunks of a call's rows are parked: row-head rh = m * n_head + h
 * (m local to the pass), chunk c: p.V at ca[(rh * nch_max + c) * hd], max at
 * cm[rh * nch_max + c], exp-sum at cs[...]. ca == NULL: no split launched. */
typedef struct {
    float *ca, *cm, *cs;
    int    nch_max;
} ats_part;

/* shared memory: K and V rows (pitch floats apart), the queries, the
 * scores / exps [64][pp] */
static inline int ats_pitch(int hd) { return hd % 32 == 0 ? hd + 4 : hd; }
static inline int ats_pp(int nq) { return nq >= 8 ? nq + 4 : 4; }
static inline size_t ats_smem(int hd, int R) {
    return sizeof(float) * ((size_t)2 * ATT_CHUNK * ats_pitch(hd) + (size_t)R * ATS_QG * hd +
                            (size_t)ATT_CHUNK * ats_pp(R * ATS_QG));
}

/* the index of the n-th set bit of x (n < popcount(x)) */
__device__ __forceinline__ int ats_nth_bit(unsigned x, int n) {
    for (int i = 0; i < n; i++) x &= x - 1;
    return __ffs(x) - 1;
}

/* p.V of one chunk for NQ of the item's queries (ubase .. ubase + NQ - 1,
 * those below nqa), column d: per query a chain over the keys in order,
 * 0 + p0*v0 + p1*v1 ..., each product and sum rounded (the CPU's). The
 * queries' chains run side by side; V row j is read once for all. */
template <int NQ>
__device__ __forceinline__ void ats_pv(const float *sV, int pitch, const float *sp, int pp, int ubase, int nqa,
                                       const int *u_cl, const int *u_rh, int clm, int d, float *__restrict__ ca,
                                       int64_t nch_max, int c, int hd) {
    float a[NQ];
    int cl[NQ];
#pragma unroll
    for (int u = 0; u < NQ; u++) {
        a[u] = 0.0f;
        cl[u] = ubase + u < nqa ? u_cl[ubase + u] : 0;
    }
    for (int j = 0; j < clm; j++) {
        const float v = sV[j * pitch + d];
        const float *pj = sp + j * pp + ubase;
#pragma unroll
        for (int u0 = 0; u0 < NQ; u0 += 4) {
            if (ubase + u0 >= nqa) break;          /* uniform over the block */
            const float4 p4 = *reinterpret_cast<const float4 *>(pj + u0);
            const float pv[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (j < cl[u0 + e]) a[u0 + e] = __fadd_rn(a[u0 + e], __fmul_rn(pv[e], v));
        }
    }
#pragma unroll
    for (int u = 0; u < NQ; u++)
        if (ubase + u < nqa) ca[((int64_t)u_rh[ubase + u] * nch_max + c) * hd + d] = a[u];
}

template <int VEC>
__global__ void __launch_bounds__(ATS_THREADS, 3)
att_split(int n_head, int n_kv_head, int hd, int64_t st, float scale, int M, ds_rows rw,
          const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc,
          ats_part pt, int R, int nsub, int S) {
    extern __shared__ __align__(16) float ats_sm[];
    __shared__ int64_t pg[ATT_CHUNK / 16];
    __shared__ int s_L[ATS_R], s_seq[ATS_R];
    __shared__ int u_cl[ATS_QMAX], u_rh[ATS_QMAX], u_slot[ATS_QMAX];
    dsc_pdl_wait();
    dsc_pdl_trigger();
    const int pitch = hd % 32 == 0 ? hd + 4 : hd, pp = R * ATS_QG >= 8 ? R * ATS_QG + 4 : 4;
    float *sK = ats_sm, *sV = sK + ATT_CHUNK * pitch, *sq = sV + ATT_CHUNK * pitch, *sp = sq + R * ATS_QG * hd;
    const int G = n_head / n_kv_head;
    int b = blockIdx.x;
    const int s = b % S;
    b /= S;
    const int hs = b % (n_kv_head * nsub), rg = b / (n_kv_head * nsub);
    const int kvh = hs / nsub, sub = hs % nsub;
    const int h0 = kvh * G + sub * ATS_QG, nq = min(ATS_QG, G - sub * ATS_QG);
    const int r0 = rg * R, nr = min(R, M - r0);
    const int nch_max = pt.nch_max;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, half = lane / 16, l16 = lane & 15;
    if (tid < nr) {
        s_L[tid] = dsc_kv_nvis(rw, r0 + tid);
        s_seq[tid] = rw.seq ? rw.seq[r0 + tid] : 0;
    }
    __syncthreads();
    unsigned act = 0;
    int ncmax = 0;
    for (int i = 0; i < nr; i++) {
        const int L = s_L[i], nch = min((L + ATT_CHUNK - 1) / ATT_CHUNK, nch_max);
        if (L > 0 && nch >= ATS_SPLIT_MIN) {
            act |= 1u << i;
            ncmax = max(ncmax, nch);
        }
    }
    if (s >= ncmax) return;               /* short rows (the one-block path), or no chunk for this block */
    for (int i = tid; i < nr * nq * hd; i += ATS_THREADS) {
        const int slot = i / hd, d = i % hd, rr = slot / nq, k = slot % nq;
        sq[i] = q[((int64_t)(r0 + rr) * n_head + h0 + k) * hd + d];
    }
    __syncthreads();
    const float *kb = kc + (int64_t)kvh * hd, *vb = vc + (int64_t)kvh * hd;
    for (int c = s; c < ncmax; c += S) {
        const int c0 = c * ATT_CHUNK;
        unsigned todo = 0;
        for (int i = 0; i < nr; i++)
            if (((act >> i) & 1) && c0 < s_L[i]) todo |= 1u << i;
        while (todo) {
            /* the rows of one sequence: one copy of the chunk serves them */
            const int sq0 = s_seq[__ffs(todo) - 1];
            unsigned pass = 0;
            int clm = 0;
            for (int i = 0; i < nr; i++)
                if (((todo >> i) & 1) && s_seq[i] == sq0) {
                    pass |= 1u << i;
                    clm = max(clm, min(ATT_CHUNK, s_L[i] - c0));
                }
            todo &= ~pass;
            const int nqa = __popc(pass) * nq;
            if (tid < (clm + 15) / 16) {
                const int32_t *tab = rw.tables + (int64_t)sq0 * rw.max_pages;
                pg[tid] = dsc_kv_at(tab, rw.page_stride, c0 + 16 * tid, 0);
            }
            if (tid < nqa) {
                const int i = ats_nth_bit(pass, tid / nq), k = tid % nq;
                u_slot[tid] = i * nq + k;
                u_cl[tid] = min(ATT_CHUNK, s_L[i] - c0);
                u_rh[tid] = (r0 + i) * n_head + h0 + k;
            }
            __syncthreads();
            /* the chunk's K rows, then its V rows, in flight together */
            const int per = hd / VEC;
            for (int i = tid; i < clm * per; i += ATS_THREADS) {
                const int j = i / per, e = (i % per) * VEC;
                const int64_t off = pg[j >> 4] + (int64_t)(j & 15) * st + e;
                if (VEC == 4) qm_cp16(sK + j * pitch + e, kb + off, 16); else qm_cp4(sK + j * pitch + e, kb + off, 4);
            }
            qm_commit();
            for (int i = tid; i < clm * per; i += ATS_THREADS) {
                const int j = i / per, e = (i % per) * VEC;
                const int64_t off = pg[j >> 4] + (int64_t)(j & 15) * st + e;
                if (VEC == 4) qm_cp16(sV + j * pitch + e, vb + off, 16); else qm_cp4(sV + j * pitch + e, vb + off, 4);
            }
            qm_commit();
            qm_wait<1>();
            __syncthreads();
            /* scores: a warp per query (several warps share a query when
             * there are fewer than 8), its half-warps on keys 4 apart, 4
             * keys each per step; everything below is uniform per warp
             * (the shuffles need all 32 lanes) */
            {
                const int wpq = nqa >= ATT_WARPS ? 1 : ATT_WARPS / nqa, part = warp % wpq;
                for (int u = warp / wpq; u < nqa; u += ATT_WARPS / wpq) {
                    const float *qv = sq + u_slot[u] * hd;
                    const int cl = u_cl[u];
                    float qr[ATT_HD_MAX / 16];
#pragma unroll
                    for (int t = 0; t < ATT_HD_MAX / 16; t++) qr[t] = t * 16 + l16 < hd ? qv[t * 16 + l16] : 0.0f;
                    for (int jb = part * 8; jb < cl; jb += 8 * wpq) {
                        float a[4];
                        const float *kr[4];
#pragma unroll
                        for (int uu = 0; uu < 4; uu++) {
                            const int j = jb + 4 * half + uu;
                            kr[uu] = sK + (j < cl ? j : cl - 1) * pitch;
                            a[uu] = 0.0f;
                        }
#pragma unroll
                        for (int t = 0; t < ATT_HD_MAX / 16; t++) {
                            if (t * 16 >= hd) break;
                            if (t * 16 + l16 < hd)      /* the head_dim % 16 tail: its own lanes */
#pragma unroll
                                for (int uu = 0; uu < 4; uu++)
                                    a[uu] = __fadd_rn(a[uu], __fmul_rn(qr[t], kr[uu][t * 16 + l16]));
                        }
#pragma unroll
                        for (int uu = 0; uu < 4; uu++) {
#pragma unroll
                            for (int o = 8; o >= 1; o /= 2) a[uu] = __fadd_rn(a[uu], __shfl_down_sync(0xffffffffu, a[uu], o, 16));
                            const int j = jb + 4 * half + uu;
                            if (l16 == 0 && j < cl) sp[j * pp + u] = __fmul_rn(a[uu], scale);
                        }
                    }
                }
            }
            __syncthreads();
            /* per query: the chunk max, the exps, the exp-sum in key order */
            for (int u = warp; u < nqa; u += ATT_WARPS) {
                const int cl = u_cl[u];
                float mx = -INFINITY;
                for (int j = lane; j < cl; j += 32) {
                    const float x = sp[j * pp + u];
                    if (x > mx) mx = x;
                }
#pragma unroll
                for (int o = 16; o >= 1; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                for (int j = lane; j < cl; j += 32) sp[j * pp + u] = ds_expf(__fsub_rn(sp[j * pp + u], mx));
                __syncwarp();
                if (lane == 0) {
                    float sum = 0.0f;
                    for (int j = 0; j < cl; j++) sum = __fadd_rn(sum, sp[j * pp + u]);
                    const int64_t pi = (int64_t)u_rh[u] * nch_max + c;
                    pt.cm[pi] = mx;
                    pt.cs[pi] = sum;
                }
            }
            qm_wait<0>();
            __syncthreads();
            /* p.V: column d per thread; with head_dim <= 128 two threads per
             * column, each for half of the queries */
            if (hd <= 128) {
                const int d = tid & 127, ub = (tid >> 7) * (ATS_QMAX / 2);
                if (d < hd && ub < nqa) ats_pv<ATS_QMAX / 2>(sV, pitch, sp, pp, ub, nqa, u_cl, u_rh, clm, d, pt.ca, nch_max, c, hd);
            } else if (tid < hd) {
                ats_pv<ATS_QMAX>(sV, pitch, sp, pp, 0, nqa, u_cl, u_rh, clm, tid, pt.ca, nch_max, c, hd);
            }
            __syncthreads();                      /* shared memory is the next pass's */
        }
    }
}

/* The fold of a split row-head's parked chunks, in chunk order, for column
 * d = threadIdx.x: the definition's m, l, acc recurrence — chunk 0 starts
 * it (m = max_0, l = sum_0, acc = p.V_0), chunk c > 0 does
 *   mn = m > max_c ? m : max_c,  ea = exp(m - mn),  eb = exp(max_c - mn),
 *   l = l * ea + sum_c * eb,  acc = acc * ea + p.V_c * eb,  m = mn.
 * The running max is a function of the chunk maxima alone (never NaN: a
 * chunk max is the largest non-NaN score or -inf), so each chunk's mn, ea
 * and eb are computed in parallel, 256 chunks at a time, by a max-scan (a
 * max in any order is the same value; only the sign of a zero maximum can
 * change, and exp(x - (+0)) = exp(x - (-0)) for every x, the zeros
 * included: ds_expf(+-0) = 1); only the two rounded recurrences of l and
 * acc stay sequential, one mul and one add per chunk. */
__device__ __forceinline__ void ats_fold(const ats_part &pt, int64_t rh, int nch, int hd, float *buf, float &l_out,
                                         float &acc_out) {
    float *ea_s = buf, *eb_s = buf + ATS_THREADS, *cs_s = buf + 2 * ATS_THREADS, *wt = buf + 3 * ATS_THREADS;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, d = tid;
    const float *pcm = pt.cm + rh * pt.nch_max, *pcs = pt.cs + rh * pt.nch_max;
    const float *pca = pt.ca + rh * pt.nch_max * hd;
    float carry = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int t0 = 0; t0 < nch; t0 += ATS_THREADS) {
        const int c = t0 + tid, n = min(ATS_THREADS, nch - t0);
        const float cmv = c < nch ? pcm[c] : -INFINITY;
        /* inclusive max-scan over the tile, then the carry from before it */
        float x = cmv;
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const float y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x = fmaxf(x, y);
        }
        if (lane == 31) wt[warp] = x;
        __syncthreads();
        float before = carry;                      /* max of every chunk before this warp's */
        for (int w = 0; w < warp; w++) before = fmaxf(before, wt[w]);
        const float prev_in = __shfl_up_sync(0xffffffffu, x, 1);
        const float incl = fmaxf(before, x), excl = lane ? fmaxf(before, prev_in) : before;
        if (c < nch) {
            ea_s[tid] = ds_expf(__fsub_rn(excl, incl));
            eb_s[tid] = ds_expf(__fsub_rn(cmv, incl));
            cs_s[tid] = pcs[c];
        }
        if (tid == n - 1) wt[ATT_WARPS] = incl;
        __syncthreads();
        carry = wt[ATT_WARPS];
        if (d < hd) {
            int k = 0;
            if (t0 == 0) {
                l = cs_s[0];
                acc = pca[d];
                k = 1;
            }
            /* the parked p.V rows come in batches of ATS_FB loads in flight
             * (one latency per batch, not per chunk); the chains follow */
            for (; k < n; k += ATS_FB) {
                float v[ATS_FB];
                const int nb = min(ATS_FB, n - k);
#pragma unroll
                for (int i = 0; i < ATS_FB; i++)
                    if (i < nb) v[i] = pca[(int64_t)(t0 + k + i) * hd + d];
#pragma unroll
                for (int i = 0; i < ATS_FB; i++)
                    if (i < nb) {
                        const float ea = ea_s[k + i], eb = eb_s[k + i];
                        l = __fadd_rn(__fmul_rn(l, ea), __fmul_rn(cs_s[k + i], eb));
                        acc = __fadd_rn(__fmul_rn(acc, ea), __fmul_rn(v[i], eb));
                    }
            }
        }
        __syncthreads();                           /* the tile's smem is the next tile's */
    }
    l_out = l;
    acc_out = acc;
}

static_assert(3 * ATS_THREADS + ATT_WARPS + 1 <= ATT_WARPS * ATT_HD_MAX, "the fold's tiles fit in ca");
__global__ void __launch_bounds__(32 * ATT_WARPS)
att_canonical(int n_head, int n_kv_head, int hd, int64_t st, float scale, int M,
              ds_rows rw, const float *__restrict__ q,
              const float *__restrict__ kc, const float *__restrict__ vc, float *__restrict__ out,
              int wide_max, int8_t *__restrict__ oq, float *__restrict__ od, ats_part pt) {
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
    if (pt.ca && min(nch, pt.nch_max) >= ATS_SPLIT_MIN) {
        /* a long row: att_split parked its chunks; fold them */
        float l, a;
        ats_fold(pt, (int64_t)m * n_head + h, min(nch, pt.nch_max), hd, &ca[0][0], l, a);
        att_store(out, e0, hd, __fdiv_rn(a, l), oq, od);
        return;
    }
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

#include "kernels/cuda/attention_tile.cuh"   /* att_tile: the prefill tile path */

/* The tile path's launch: 1 if it ran. Host decision on what every call of
 * one recorded graph shares (model.c's graph_key has M; the shape, the SM
 * count and the switches are the context's, rows.seq == NULL is the rows
 * struct's): canonical, one sequence, head_dim 64 or 128, 16-byte copies
 * possible, and M >= ATT_TILE_ROWS with enough tiles to fill half the SMs —
 * or DSPARK_CUDA_ON=tile: every such call, M = 1 too (a test aid).
 * DSPARK_CUDA_OFF=tile: never (the split and one-block paths; same bits). */
static void att_tile_launch(ds_exec *ex, const ds_attn_shape *s, int M, const ds_rows *r, int64_t tiles, const float *q,
                            const float *kc, const float *vc, float *out, int8_t *oq, float *od, const int32_t *runs,
                            int n_runs) {
    if (s->head_dim == 64)
        dsc_launch(ex, "attention tile", att_tile<64>, dim3((unsigned)tiles), dim3(ATT_TTHREADS), att_tcfg<64>::SMEM,
                   s->n_head, s->n_kv_head, s->kv_stride, s->scale, M, *r, q, kc, vc, out, oq, od, runs, n_runs);
    else
        dsc_launch(ex, "attention tile", att_tile<128>, dim3((unsigned)tiles), dim3(ATT_TTHREADS), att_tcfg<128>::SMEM,
                   s->n_head, s->n_kv_head, s->kv_stride, s->scale, M, *r, q, kc, vc, out, oq, od, runs, n_runs);
}

static int att_tile_run(ds_exec *ex, const ds_attn_shape *s, int M, const ds_rows *r, const float *q,
                        const float *kc, const float *vc, float *out, int8_t *oq, float *od) {
    const dsc_backend *b = dsc_be(ex);
    const int hd = s->head_dim, G = s->n_head / s->n_kv_head;
    const int64_t tiles = ((int64_t)M * G + ATT_TQ - 1) / ATT_TQ * s->n_kv_head;
    if ((b->off & DSC_OFF_TILE) || r->seq || (hd != 64 && hd != 128) || s->kv_stride % 4 || r->page_stride % 4 ||
        ((uintptr_t)kc | (uintptr_t)vc) % 16)
        return 0;
    if (!b->tile_all && (M < ATT_TILE_ROWS || 2 * tiles < b->n_sm)) return 0;
    att_tile_launch(ex, s, M, r, tiles, q, kc, vc, out, oq, od, NULL, 0);
    return 1;
}

/* The split-KV / one-block paths over M rows (r, q, out, oq and od already
 * at the first of them). */
static void att_rows_split(ds_exec *ex, const ds_attn_shape *s, int M, const ds_rows *r, const float *q,
                           const float *kc, const float *vc, float *out, int8_t *oq, float *od) {
    const int64_t K = (int64_t)s->n_head * s->head_dim;
    const unsigned grid = (unsigned)M * (unsigned)s->n_head;
    const int wide = (dsc_be(ex)->off & DSC_OFF_WIDE) ? 0 : ATT_WIDE_MAX;
    const int hd = s->head_dim, G = s->n_head / s->n_kv_head, nsub = (G + ATS_QG - 1) / ATS_QG;
    const int nch_max = (int)(((int64_t)r->max_pages * DS_KV_PAGE + ATT_CHUNK - 1) / ATT_CHUNK);
    /* split-KV only where a row can be long enough; rows are cut into
     * passes whose parked chunks fit ATS_PART_CAP */
    const size_t per_row = (size_t)s->n_head * (size_t)nch_max * ((size_t)hd + 2) * sizeof(float);
    int mp = 0;
    float *part = NULL;
    /* head_dim <= 128 only: the kernel is written for up to 256 (a thread
     * per column, 32 chains), but that instance has not run on a GPU yet */
    /* ... and not where the host knows every row is short (vis_max: no
     * row reaches ATS_SPLIT_MIN chunks, so att_split would only launch
     * and leave — 2.6 us of every layer of a short-context decode step) */
    const bool all_short = r->vis_max > 0 && r->vis_max <= (ATS_SPLIT_MIN - 1) * ATT_CHUNK;
    if (!(dsc_be(ex)->off & DSC_OFF_SPLIT) && !all_short && nch_max >= ATS_SPLIT_MIN && hd <= 128) {
        mp = (int)(ATS_PART_CAP / per_row);
        mp = mp < 1 ? 1 : mp > M ? M : mp;
        if (mp > ATS_R) mp -= mp % ATS_R;
        part = (float *)dsc_scratch(ex, DSC_SLOT_ATT_PART, (size_t)mp * per_row);
    }
    if (!part) {
        dsc_launch(ex, "attention", att_canonical, dim3(grid), dim3(32 * ATT_WARPS), 0, s->n_head, s->n_kv_head,
                   hd, s->kv_stride, s->scale, M, *r, q, kc, vc, out, wide, oq, od, ats_part{NULL, NULL, NULL, 0});
        return;
    }
    const size_t nrh = (size_t)mp * s->n_head * nch_max;
    const ats_part pt = {part, part + nrh * hd, part + nrh * (hd + 1), nch_max};
    const int vec = hd % 4 == 0 && s->kv_stride % 4 == 0 && r->page_stride % 4 == 0 &&
                    ((uintptr_t)kc | (uintptr_t)vc) % 16 == 0;
    const dsc_backend *b = dsc_be(ex);
    for (int m0 = 0; m0 < M; m0 += mp) {
        const int mn = M - m0 < mp ? M - m0 : mp, R = mn < ATS_R ? mn : ATS_R, ng = (mn + R - 1) / R;
        const size_t smem = ats_smem(hd, R);
        /* blocks per SM (registers and shared memory), then S so
         * that the grid is one wave: a second, mostly empty wave
         * would double the time of the longest rows */
        int bps = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, vec ? att_split<4> : att_split<1>, ATS_THREADS,
                                                          smem) != cudaSuccess || bps < 1) {
            (void)cudaGetLastError();
            bps = 1;
        }
        const int units = ng * s->n_kv_head * nsub;
        int S = bps * b->n_sm / units;
        S = S < 1 ? 1 : S > nch_max ? nch_max : S;
        ds_rows rp = *r;
        if (rp.pos) rp.pos += m0;
        if (rp.seq) rp.seq += m0;
        if (rp.n_vis) rp.n_vis += m0;
        const int64_t e0 = (int64_t)m0 * K;
        dsc_launch(ex, "attention split", vec ? att_split<4> : att_split<1>, dim3((unsigned)(units * S)),
                   dim3(ATS_THREADS), smem, s->n_head, s->n_kv_head, hd, s->kv_stride, s->scale, mn, rp,
                   q + e0, kc, vc, pt, R, nsub, S);
        dsc_launch(ex, "attention", att_canonical, dim3((unsigned)mn * (unsigned)s->n_head),
                   dim3(32 * ATT_WARPS), 0, s->n_head, s->n_kv_head, hd, s->kv_stride, s->scale, mn, rp,
                   q + e0, kc, vc, out + e0, wide, oq ? oq + e0 : oq, od ? od + e0 / 32 : od, pt);
    }
}

/* The tile path over rows of several sequences (the batch engine's prompt
 * chunks, ds_rows.runs): every run of at least ATT_TILE_ROWS rows in tiles
 * of its own rows (one launch for all of them), the rows of the other runs
 * through att_rows_split, one call per stretch of consecutive short runs.
 * Which path a row takes moves no bit (each is the definition's sequence
 * per row, test_attention_tile and test_tile_emu). 1 if it ran. The plan
 * reads the host copy of the runs, so it is never made inside a recording
 * (a replay would keep this call's plan for other rows): the engine gives
 * runs only to chunks it does not record, and a capture here declines. */
static int att_tile_runs(ds_exec *ex, const ds_attn_shape *s, int M, const ds_rows *r, const float *q,
                         const float *kc, const float *vc, float *out, int8_t *oq, float *od) {
    const dsc_backend *b = dsc_be(ex);
    const int hd = s->head_dim, G = s->n_head / s->n_kv_head, n = r->n_runs;
    const int32_t *h = r->runs_host;
    if ((b->off & (DSC_OFF_TILE | DSC_OFF_RUNS)) || !r->seq || !r->runs || !h || n < 1 || ex->capturing || (hd != 64 && hd != 128) ||
        s->kv_stride % 4 || r->page_stride % 4 || ((uintptr_t)kc | (uintptr_t)vc) % 16)
        return 0;
    int64_t tiles = 0, next = 0;
    for (int i = 0; i < n; i++) {            /* in row order, covering [0, M): else no plan */
        if (h[2 * i] != next || h[2 * i + 1] < 1) return 0;
        next += h[2 * i + 1];
        if (h[2 * i + 1] >= ATT_TILE_ROWS) tiles += ((int64_t)h[2 * i + 1] * G + ATT_TQ - 1) / ATT_TQ;
    }
    tiles *= s->n_kv_head;
    if (next != M || !tiles || (!b->tile_all && 2 * tiles < b->n_sm)) return 0;
    att_tile_launch(ex, s, M, r, tiles, q, kc, vc, out, oq, od, r->runs, n);
    ex->tile_runs++;
    const int64_t K = (int64_t)s->n_head * hd;
    for (int i = 0; i < n;) {
        if (h[2 * i + 1] >= ATT_TILE_ROWS) { i++; continue; }
        int j = i + 1;
        while (j < n && h[2 * j + 1] < ATT_TILE_ROWS) j++;
        const int m0 = h[2 * i], mn = h[2 * (j - 1)] + h[2 * (j - 1) + 1] - m0;
        ds_rows rp = *r;
        rp.pos += m0;
        rp.seq += m0;
        if (rp.n_vis) rp.n_vis += m0;
        rp.runs = rp.runs_host = NULL;
        rp.n_runs = 0;
        const int64_t e0 = (int64_t)m0 * K;
        att_rows_split(ex, s, mn, &rp, q + e0, kc, vc, out + e0, oq ? oq + e0 : oq, od ? od + e0 / 32 : od);
        i = j;
    }
    return 1;
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
    if (v == DS_FAST) {
        const unsigned grid = (unsigned)M * (unsigned)s->n_head;
        att_fast<<<grid, 32 * ATT_WARPS, 0, ex->st>>>(s->n_head, s->n_kv_head, s->head_dim,
                                                     s->kv_stride, s->scale, M, *r, q,
                                                     kc, vc, out);
        DSC_LAUNCHED(ex, "attention");
        return;
    }
    /* the o projection's Q8_0 input, made here (dsc_q8x) */
    const int64_t K = (int64_t)s->n_head * s->head_dim;
    int8_t *oq = NULL;
    float *od = NULL;
    if (s->head_dim % 32 || !dsc_q8x_reserve(ex, M, K, &oq, &od)) oq = NULL, od = NULL;
    if (!att_tile_run(ex, s, M, r, q, kc, vc, out, oq, od) && !att_tile_runs(ex, s, M, r, q, kc, vc, out, oq, od))
        att_rows_split(ex, s, M, r, q, kc, vc, out, oq, od);
    if (oq) dsc_q8x_publish(ex, out, M, K, oq, od);
}

cudaError_t dsc_attention_init(void) {
    const int bytes = (int)ats_smem(ATT_HD_MAX, ATS_R);
    cudaError_t e = cudaFuncSetAttribute(att_split<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(att_split<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(att_tile<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)att_tcfg<64>::SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(att_tile<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)att_tcfg<128>::SMEM);
    return e;
}
