/* attention_tile.cuh — attention.cu's prefill tile path (att_tile), in a
 * header of its own so that tests/cuda/test_tile_emu.cc can run the same
 * kernel source on the host (threads as fibers, shuffles and barriers
 * emulated) against the CPU's canonical rows without a GPU. It uses only
 * ds_rows, the page addressing (dsc_kv_at, dsc_kv_nvis), cp.async
 * (qm_cp16, qm_commit, qm_wait), dsc_pdl_*, ds_expf, dsc_q8_block_warp,
 * the _rn intrinsics, __shfl_xor_sync and __syncthreads. */
#ifndef DSPARK_ATTENTION_TILE_CUH
#define DSPARK_ATTENTION_TILE_CUH

/* ==========================================================================
 * TILE — prefill: a block owns 64 queries of one kv head and walks the chunks
 * ========================================================================== */
/* For calls of many rows of ONE sequence (a prompt chunk; ds_rows.seq ==
 * NULL, so every row reads page table 0) — or, given the call's sequence
 * runs (ds_rows.runs: the batch engine's chunks), for each run of at least
 * ATT_TILE_ROWS rows, whose tiles then hold rows of that run alone and read
 * its sequence's row of the tables: a block owns a tile of ATT_TQ = 64
 * queries of one kv head — the kv head's GQA heads of consecutive rows,
 * query u = row * G + g, so 16 rows x 4 heads at GQA 4, 64 rows x 1 head at
 * GQA 1 — and walks the chunks 0, 1, ... of the tile's longest prefix in
 * order. Chunk c's K and V rows (64 x head_dim each, through the page
 * table) are staged in shared memory by cp.async one chunk ahead (double
 * buffered: K and V of chunk c + 1 arrive while chunk c is computed) and
 * serve all 64 queries. Per query and chunk every quantity is the
 * definition's (attn_row_head, kernels/cpu/attention.c), each by one
 * thread's own sequence of IEEE operations:
 *   score  the 16 lane chains c_l = 0 + q[l]k[l] + q[l+16]k[l+16] + ... in
 *          order (the head_dim % 16 tail in its lanes: templated head_dim, so
 *          a chain is exactly its elements l + 16i < HD), then the tree
 *          b_l = c_l + c_{l+8}, e_l = b_l + b_{l+4}, f_l = e_l + e_{l+2},
 *          f_0 + f_1 — ds_lanes16_combine, which att_scores does with
 *          shuffles — times scale. A thread evaluates 4 queries x 4 keys,
 *          lane pair by lane pair, so one shared load of q and of k feeds 4
 *          products each.
 *   max    over the keys the query sees (j < its n_vis - c0), order-free;
 *   exp    p = ds_expf(s - max), 0 for keys the query does not see;
 *   sum    of p in key order from +0, and p.V per column in key order from
 *          +0: a thread holds 4 queries x HD/16 columns, and the keys past a
 *          query's prefix are skipped (a predicate, not a multiply by 0, so
 *          no inf or NaN of an unseen V row can enter);
 *   fold   into the query's running (m, l, acc) in registers, att_canonical's
 *          recurrence in its order: chunk 0 sets it, chunk c > 0 does
 *          mn = max(m, cmax), ea = exp(m - mn), eb = exp(cmax - mn),
 *          l = l*ea + sum*eb, acc = acc*ea + pv*eb, m = mn; one final divide.
 * A query's chunks are its own prefix's: a query whose prefix ends before
 * chunk c (shorter rows of the tile) takes no part in it. Nothing is parked
 * and there is no second kernel. So every row's bits are att_canonical's
 * and the CPU's, whatever M, the tile a row falls in, or its neighbours. The
 * output goes through shared memory to warps that store it and write the o
 * projection's Q8_0 copy with dsc_q8_block_warp, as att_store does. */
#define ATT_TQ 64               /* queries per tile                               */
#define ATT_TTHREADS 256        /* 8 warps                                        */
#define ATT_TILE_ROWS 64        /* rows a call needs for the tile path            */
static_assert(ATT_TQ == 64 && ATT_TTHREADS == 256 && ATT_CHUNK == 64, "the thread maps below assume 64 x 64 per chunk");

template <int HD>
struct att_tcfg {
    static constexpr int KP = HD + 4;          /* K / V row pitch: 8 keys of one column in 8 banks */
    static constexpr int QP = ATT_TQ + 4;      /* q, transposed: [HD][QP]                          */
    static constexpr int SP = ATT_TQ + 4;      /* scores / exps: [64 keys][SP]                     */
    static constexpr int OP = HD + 4;          /* the outputs: [64 queries][OP] (over sK)         */
    static constexpr int DG = HD / 16;         /* p.V columns per thread                           */
    static constexpr int KV_F = ATT_CHUNK * KP;
    static constexpr size_t SMEM = sizeof(float) * ((size_t)4 * KV_F + (size_t)HD * QP + (size_t)ATT_CHUNK * SP +
                                                    2 * ATT_TQ);
    static_assert(ATT_TQ * OP <= 2 * KV_F, "the outputs fit in the K buffers");
};

/* b[a][v] = c_l + c_{l+8} for the thread's 4 queries (a) x 4 keys (v):
 * lane l's chain over e = l, l + 16, ... (HD a multiple of 16: HD / 16
 * elements each), then lane l + 8's, from +0, each product and sum rounded */
template <int HD>
__device__ __forceinline__ void att_tpair(const float *sQ, const float *sK, int uq0, int k0, int l, float b[4][4]) {
    using C = att_tcfg<HD>;
    static_assert(HD % 16 == 0, "whole lanes: no head_dim % 16 tail in this kernel");
    float c[2][4][4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int v = 0; v < 4; v++) c[h][a][v] = 0.0f;
#pragma unroll
        for (int i = 0; i < HD / 16; i++) {
            const int e = l + 8 * h + 16 * i;
            const float4 qa = *reinterpret_cast<const float4 *>(sQ + e * C::QP + uq0);
            const float qv[4] = {qa.x, qa.y, qa.z, qa.w};
            float kv[4];
#pragma unroll
            for (int v = 0; v < 4; v++) kv[v] = sK[(k0 + 8 * v) * C::KP + e];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int v = 0; v < 4; v++) c[h][a][v] = __fadd_rn(c[h][a][v], __fmul_rn(qv[a], kv[v]));
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int v = 0; v < 4; v++) b[a][v] = __fadd_rn(c[0][a][v], c[1][a][v]);
}

__device__ __forceinline__ void att_tcopy(float x[4][4], const float y[4][4]) {
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int v = 0; v < 4; v++) x[a][v] = y[a][v];
}
__device__ __forceinline__ void att_tadd(float x[4][4], const float y[4][4]) {
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int v = 0; v < 4; v++) x[a][v] = __fadd_rn(x[a][v], y[a][v]);
}

/* Key j of a chunk into the thread's exp-sums cs[a] and p.V pv[a][d]
 * (column ATT_TCOL(d), below), one rounded product and sum each; PRED: only
 * for the queries that see key j (j < cl[a]) — the chunk's ragged end. */
template <int HD, bool PRED>
__device__ __forceinline__ void att_tpv_key(const float *sS, const float *cV, int j, int uq0, int c0, const int cl[4],
                                            float cs[4], float pv[4][HD / 16]) {
    using C = att_tcfg<HD>;
    const float4 p4 = *reinterpret_cast<const float4 *>(sS + j * C::SP + uq0);
    const float p[4] = {p4.x, p4.y, p4.z, p4.w};
    float vv[C::DG];
#pragma unroll
    for (int d = 0; d < C::DG; d += 4) {
        const float4 v4 = *reinterpret_cast<const float4 *>(cV + j * C::KP + (d >> 2) * 64 + c0);
        vv[d] = v4.x, vv[d + 1] = v4.y, vv[d + 2] = v4.z, vv[d + 3] = v4.w;
    }
#pragma unroll
    for (int a = 0; a < 4; a++)
        if (!PRED || j < cl[a]) {
            cs[a] = __fadd_rn(cs[a], p[a]);
#pragma unroll
            for (int d = 0; d < C::DG; d++) pv[a][d] = __fadd_rn(pv[a][d], __fmul_rn(p[a], vv[d]));
        }
}

/* chunk c's K and V rows into buffer buf: keys at or past cl are zeros (no
 * page of theirs is read); K and V are two commit groups */
template <int HD>
__device__ __forceinline__ void att_tstage(float *sK, float *sV, const float *kb, const float *vb, const int32_t *tab,
                                           int64_t pst, int64_t st, int c0, int cl) {
    using C = att_tcfg<HD>;
    constexpr int PER = HD / 4;
    for (int i = threadIdx.x; i < ATT_CHUNK * PER; i += ATT_TTHREADS) {
        const int j = i / PER, e = (i % PER) * 4;
        const int64_t off = j < cl ? dsc_kv_at(tab, pst, c0 + j, st) + e : 0;
        qm_cp16(sK + j * C::KP + e, kb + off, j < cl ? 16 : 0);
    }
    qm_commit();
    for (int i = threadIdx.x; i < ATT_CHUNK * PER; i += ATT_TTHREADS) {
        const int j = i / PER, e = (i % PER) * 4;
        const int64_t off = j < cl ? dsc_kv_at(tab, pst, c0 + j, st) + e : 0;
        qm_cp16(sV + j * C::KP + e, vb + off, j < cl ? 16 : 0);
    }
    qm_commit();
}

template <int HD>
__global__ void __launch_bounds__(ATT_TTHREADS, 1)
att_tile(int n_head, int n_kv_head, int64_t st, float scale, int M, ds_rows rw, const float *q,
         const float *__restrict__ kc, const float *__restrict__ vc, float *out, int8_t *__restrict__ oq,
         float *__restrict__ od, const int32_t *__restrict__ runs, int n_runs) {
    using C = att_tcfg<HD>;
    extern __shared__ __align__(16) float att_tsm[];
    float *sK = att_tsm, *sV = sK + 2 * C::KV_F, *sQ = sV + 2 * C::KV_F, *sS = sQ + HD * C::QP;
    float *sM = sS + ATT_CHUNK * C::SP;
    int *sL = reinterpret_cast<int *>(sM + ATT_TQ);
    dsc_pdl_wait();
    dsc_pdl_trigger();
    const int G = n_head / n_kv_head, tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    const int kvh = blockIdx.x % n_kv_head;
    int u0, nu;
    const int32_t *tab = rw.tables;                  /* one sequence: table 0 */
    if (!runs) {
        const int ntiles = (M * G + ATT_TQ - 1) / ATT_TQ;
        const int tile = ntiles - 1 - (int)(blockIdx.x / n_kv_head);                  /* longest first */
        u0 = tile * ATT_TQ;
        nu = min(ATT_TQ, M * G - u0);
    } else {
        /* rows of several sequences (ds_rows.runs): the tiles of each run of
         * at least ATT_TILE_ROWS rows, in run order, each run's longest
         * first; a tile's queries are rows of its run alone, so one page
         * table serves its K/V (the other rows are the split path's) */
        int t = (int)(blockIdx.x / n_kv_head), r0 = 0, cnt = 0, nt = 0;
        for (int i = 0; i < n_runs; i++) {
            r0 = runs[2 * i];
            cnt = runs[2 * i + 1];
            if (cnt < ATT_TILE_ROWS) continue;
            nt = (cnt * G + ATT_TQ - 1) / ATT_TQ;
            if (t < nt) break;
            t -= nt;
        }
        u0 = r0 * G + (nt - 1 - t) * ATT_TQ;
        nu = min(ATT_TQ, (r0 + cnt) * G - u0);
        tab = rw.tables + (int64_t)rw.seq[r0] * rw.max_pages;
    }
    /* the tile's queries, transposed, and their prefixes */
    for (int i = tid; i < ATT_TQ * HD; i += ATT_TTHREADS) {
        const int u = i / HD, e = i % HD;
        float x = 0.0f;
        if (u < nu) {
            const int ug = u0 + u, m = ug / G, h = kvh * G + ug % G;
            x = q[((int64_t)m * n_head + h) * HD + e];
        }
        sQ[e * C::QP + u] = x;
    }
    if (tid < ATT_TQ) sL[tid] = tid < nu ? max(dsc_kv_nvis(rw, (u0 + tid) / G), 0) : 0;
    __syncthreads();
    int lmax = 0;
    for (int u = 0; u < ATT_TQ; u++) lmax = max(lmax, sL[u]);
    const int nch = (lmax + ATT_CHUNK - 1) / ATT_CHUNK;
    const float *kb = kc + (int64_t)kvh * HD, *vb = vc + (int64_t)kvh * HD;
    const int64_t pst = rw.page_stride;

    /* the score map: warp = (query block qb of 16, key half kh of 32);
     * lane = (query group of 4, key kg): keys kh*32 + kg + 8v */
    const int s_uq0 = (warp >> 1) * 16 + (lane >> 3) * 4, s_k0 = (warp & 1) * 32 + (lane & 7);
    /* the p.V map: queries 4 * (tid / 16) .. + 3; columns 4 * (tid % 16) ..
     * + 3, and 64 further (HD 128): the 16 threads of a query group read 256
     * contiguous bytes of a V row per float4 load. Column of pv[a][d]:
     * ATT_TCOL(d) */
    const int p_uq0 = (tid >> 4) * 4, p_c0 = (tid & 15) * 4;
#define ATT_TCOL(d) (((d) >> 2) * 64 + p_c0 + ((d) & 3))
    int pL[4];
#pragma unroll
    for (int a = 0; a < 4; a++) pL[a] = sL[p_uq0 + a];
    float m_run[4], l_run[4], acc[4][C::DG];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        m_run[a] = -INFINITY;
        l_run[a] = 0.0f;
#pragma unroll
        for (int d = 0; d < C::DG; d++) acc[a][d] = 0.0f;
    }

    if (nch > 0) att_tstage<HD>(sK, sV, kb, vb, tab, pst, st, 0, min(ATT_CHUNK, lmax));
    for (int c = 0; c < nch; c++) {
        const int c0 = c * ATT_CHUNK, buf = c & 1;
        const float *cK = sK + buf * C::KV_F, *cV = sV + buf * C::KV_F;
        /* the next chunk, into the other buffer (free since the last barrier) */
        if (c + 1 < nch) {
            att_tstage<HD>(sK + (buf ^ 1) * C::KV_F, sV + (buf ^ 1) * C::KV_F, kb, vb, tab, pst, st, c0 + ATT_CHUNK,
                           min(ATT_CHUNK, lmax - c0 - ATT_CHUNK));
        } else {
            qm_commit();
            qm_commit();
        }
        qm_wait<3>();                                 /* this chunk's K */
        __syncthreads();
        /* 1) scores: the lane pairs in the order (0,8) (4,12) -> e_0,
         *    (2,10) (6,14) -> e_2, f_0 = e_0 + e_2; (1,9) (5,13) -> e_1,
         *    (3,11) (7,15) -> e_3, f_1 = e_1 + e_3; f_0 + f_1. A loop that is
         *    not unrolled, so that only one pair's chains are live (unrolled,
         *    the compiler hoists every pair's loads and spills). */
        {
            float f0[4][4] = {}, e[4][4] = {}, t[4][4] = {}, b[4][4];   /* each set before use (p order) */
#pragma unroll 1
            for (int p = 0; p < 8; p++) {
                const int l = (p >> 2) | ((p & 1) << 2) | (p & 2);   /* 0 4 2 6 1 5 3 7 */
                att_tpair<HD>(sQ, cK, s_uq0, s_k0, l, b);
                if (!(p & 1)) {
                    if (p & 2) att_tcopy(t, b);                      /* b_2, b_3 */
                    else att_tcopy(e, b);                            /* b_0, b_1 */
                } else if (!(p & 2)) {
                    att_tadd(e, b);                                  /* e_0, e_1 */
                } else {
                    att_tadd(t, b);                                  /* e_2, e_3 */
                    if (p == 3) {
                        att_tcopy(f0, e);
                        att_tadd(f0, t);                             /* f_0 */
                    } else {
                        att_tadd(e, t);                              /* f_1 */
                    }
                }
            }
            att_tadd(f0, e);                                         /* f_0 + f_1 */
#pragma unroll
            for (int v = 0; v < 4; v++)
                *reinterpret_cast<float4 *>(sS + (s_k0 + 8 * v) * C::SP + s_uq0) =
                    make_float4(__fmul_rn(f0[0][v], scale), __fmul_rn(f0[1][v], scale), __fmul_rn(f0[2][v], scale),
                                __fmul_rn(f0[3][v], scale));
        }
        __syncthreads();
        /* 2) per query (4 threads, keys 4 apart): the max over the keys it
         *    sees, then its exps (0 for the keys it does not see) */
        {
            const int u = tid >> 2, part = tid & 3, cl = min(ATT_CHUNK, sL[u] - c0);
            float mx = -INFINITY;
#pragma unroll 4
            for (int j = part; j < cl; j += 4) {
                const float x = sS[j * C::SP + u];
                if (x > mx) mx = x;
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
#pragma unroll 4
            for (int j = part; j < ATT_CHUNK; j += 4)
                sS[j * C::SP + u] = j < cl ? ds_expf(__fsub_rn(sS[j * C::SP + u], mx)) : 0.0f;
            if (part == 0) sM[u] = mx;
        }
        qm_wait<2>();                                 /* this chunk's V */
        __syncthreads();
        /* 3) the exp-sums and p.V in key order from +0, then the fold */
        {
            int cl[4], jall = ATT_CHUNK, jany = 0;
#pragma unroll
            for (int a = 0; a < 4; a++) {
                cl[a] = max(0, min(ATT_CHUNK, pL[a] - c0));
                jall = min(jall, cl[a]);
                jany = max(jany, cl[a]);
            }
            float pv[4][C::DG], cs[4];
#pragma unroll
            for (int a = 0; a < 4; a++) {
                cs[a] = 0.0f;
#pragma unroll
                for (int d = 0; d < C::DG; d++) pv[a][d] = 0.0f;
            }
            int j = 0;
#pragma unroll 4
            for (; j < jall; j++) att_tpv_key<HD, false>(sS, cV, j, p_uq0, p_c0, cl, cs, pv);  /* every query's */
            for (; j < jany; j++) att_tpv_key<HD, true>(sS, cV, j, p_uq0, p_c0, cl, cs, pv);   /* the ragged end */
#pragma unroll
            for (int a = 0; a < 4; a++) {
                if (cl[a] <= 0) continue;             /* the query's prefix ended before this chunk */
                const float cmax = sM[p_uq0 + a];
                if (c == 0) {
                    m_run[a] = cmax;
                    l_run[a] = cs[a];
#pragma unroll
                    for (int d = 0; d < C::DG; d++) acc[a][d] = pv[a][d];
                } else {
                    const float mn = m_run[a] > cmax ? m_run[a] : cmax;
                    const float ea = ds_expf(__fsub_rn(m_run[a], mn)), eb = ds_expf(__fsub_rn(cmax, mn));
                    l_run[a] = __fadd_rn(__fmul_rn(l_run[a], ea), __fmul_rn(cs[a], eb));
#pragma unroll
                    for (int d = 0; d < C::DG; d++)
                        acc[a][d] = __fadd_rn(__fmul_rn(acc[a][d], ea), __fmul_rn(pv[a][d], eb));
                    m_run[a] = mn;
                }
            }
        }
        __syncthreads();                              /* sS, sM and this buffer are the next chunks' */
    }
    qm_wait<0>();
    /* the outputs: the final divide, through shared memory (over the K
     * buffers, free now) to warps that store 32 columns of one query each
     * and write their Q8_0 block as att_store does */
    float *sO = sK;
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int d = 0; d < C::DG; d++)
            sO[(p_uq0 + a) * C::OP + ATT_TCOL(d)] = pL[a] > 0 ? __fdiv_rn(acc[a][d], l_run[a]) : 0.0f;
#undef ATT_TCOL
    __syncthreads();
    for (int i = warp; i < nu * (HD / 32); i += ATT_TTHREADS / 32) {
        const int u = i / (HD / 32), blk = i % (HD / 32), ug = u0 + u, m = ug / G, h = kvh * G + ug % G;
        const int64_t e0 = ((int64_t)m * n_head + h) * HD + blk * 32;
        const float v = sO[u * C::OP + blk * 32 + lane];
        out[e0 + lane] = v;
        if (oq) {
            const float s = dsc_q8_block_warp(v, lane, oq + e0);
            if (lane == 0) od[e0 / 32] = s;
        }
    }
}

#endif
