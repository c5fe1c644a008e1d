/* attention.c — attention family: softmax(q·K^T * scale) · V against the KV
 * cache, which ALREADY holds the rows of the current call.
 *
 * Query row m is at absolute position pos0 + m; causal rows see keys
 * [0, pos0 + m], non-causal rows see [0, n_kv). GQA: query head h reads kv
 * head h / (n_head / n_kv_head). q and out are [M][n_head][head_dim]; out may
 * alias q (each (row, head) reads its q before writing its out).
 *
 *   decode     attn_block(): split-KV over chunks of DS_ATTN_CHUNK keys at
 *              ABSOLUTE boundaries (0, 64, 128, ...). Per chunk: scores with
 *              the 16-lane dot (ds_dot16) times scale, the chunk max,
 *              p = ds_expf(s - chunk_max) (kernels/dsmath.h: the GPU's bits too) summed in key order, p·V accumulated in
 *              key order; chunks folded left to right by the online-softmax
 *              rescale (m, l, acc); one final divide. Every quantity is a
 *              function of the row's own prefix only.
 *   canonical  items of (a group of rows, a kv head, a batch of up to
 *              ATTN_PV_Q of its GQA heads) split over threads, each through
 *              attn_block(), which runs every query of the item through the
 *              decode sequence above and only shares the loads of K and V
 *              between them — decode is canonical with M = 1.
 *   fast       what a batch kernel does: per tile of 8 queries sharing a kv
 *              head (GQA heads x rows), the whole prefix in one pass — all
 *              scores of the tile (dots vectorized across the 8 queries, so
 *              each K row is loaded once per tile), ONE global max, a
 *              vectorized polynomial exp, one sum, then P·V accumulated in key
 *              order in registers with V loads shared by the tile, normalized
 *              by a reciprocal. Different dot order, different max (global vs
 *              per chunk, so no rescale products), different exp and different
 *              normalization: different bits.
 * Both heavy loops are compiled per SIMD level (DS_OPS_DISPATCH); canonical's
 * bits are the same on every level (plain lane arithmetic, no contraction).
 *
 * The cache is paged (ds_attention_rows, kvpool.h): a call's rows may belong
 * to several sequences, each reading its own page table. Work items never
 * span two sequences (runs of rows with one sequence), and a chunk's K/V
 * rows are found 16 positions at a time (a page, or a quarter of a 64-key
 * chunk): only addresses depend on where pages are, never an operation or
 * its order, so a row's bits are its sequence's alone, wherever its pages
 * lie and whoever shares the call. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"
#include "kernels/cpu/expf16.h"
#include "kernels/dsmath.h"

#include <math.h>
#include <stdlib.h>

#define ATTN_STACK_HD 128   /* head_dim up to this keeps its accumulators on the stack */

/* Rows of one sequence in a call: a run. Work items never span runs, so the
 * rows of an item share one sequence's K/V (its page table). */
#define ATTN_RUNS 256       /* runs per pass; a call with more is cut into passes */
typedef struct {
    int m0, n;          /* rows [m0, m0 + n)                                   */
    int rb, ngr;        /* canonical: rows per group, groups                   */
    int lmax;           /* the longest prefix a row of the run sees            */
    int64_t item0;      /* the run's first work item                           */
} attn_run;

typedef struct {
    const ds_attn_shape *s;
    int M;
    const ds_attn_rows *r;
    const float *q, *k, *v;
    float *out;
    ds_pool *pool;      /* for the threads' reserved scratch */
    int qb;             /* canonical: GQA heads per work item (attn_item) */
    int n_runs;
    int64_t items;
    attn_run run[ATTN_RUNS];
} attn_args;

static inline int attn_len(const attn_args *a, int m) { return a->r->n_vis ? a->r->n_vis[m] : a->r->pos[m] + 1; }
static inline int attn_seq(const ds_attn_rows *r, int m) { return r->seq ? r->seq[m] : 0; }

/* Floats from the layer's page-0 rows to position j of sequence seq: its
 * page's start plus its row in the page (kv_stride apart), or j rows into a
 * contiguous cache. Pages are a multiple of 16 positions, so the 16-key
 * blocks below (at multiples of 16) never straddle two pages. */
static inline int64_t attn_kv_off(const ds_attn_rows *r, int seq, int j, int64_t st) {
    if (!r->tables) return (int64_t)j * st;
    return (int64_t)r->tables[(int64_t)seq * r->max_pages + j / r->page] * r->page_stride +
           (int64_t)(j % r->page) * st;
}

/* The run that work item i belongs to (runs are in item order). */
static inline const attn_run *attn_run_of(const attn_args *a, int64_t i) {
    int lo = 0, hi = a->n_runs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (a->run[mid].item0 <= i) lo = mid; else hi = mid - 1;
    }
    return &a->run[lo];
}

/* ========================================================================
 * DECODE — one (query row, head): split-KV with fixed absolute chunks
 * ======================================================================== */
/* acc and cacc are head_dim floats of scratch. The chunking is at absolute
 * positions, so a row's chunks (and therefore its bits) are the same whether
 * it is decoded alone or is row m of a verify batch of any width. */
#define ATTN_INLINE static inline __attribute__((always_inline))

/* GCC vector extensions: lane-wise IEEE ops, lowered to whatever registers
 * the clone has (2 x SSE, 1 x AVX2, ...). x * scalar broadcasts. */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float   v8f  __attribute__((vector_size(32)));
typedef int32_t v8i  __attribute__((vector_size(32)));
typedef float   v16f __attribute__((vector_size(64)));
ATTN_INLINE v16f ld16(const float *p) { v16f v; memcpy(&v, p, sizeof v); return v; }
ATTN_INLINE void st16p(float *p, const v16f *v) { memcpy(p, v, sizeof *v); }

/* One chunk's exp-sums and p.V for nq (<= ATTN_PV_Q) queries that share a kv
 * head (the GQA heads of one row), head_dim = 16 * NV (NV a constant: 4 for
 * head_dim 64, 8 for 128), from each query's exps p[u][]: the accumulators
 * live in vector registers across the keys instead of in memory, where
 * every key's update waited on the previous key's store, and V row j is
 * loaded once for the nq queries — nq * NV independent add chains instead
 * of NV, so the adder's latency is hidden. Query by query, lane by lane the
 * same products and sums in the same key order (x * p then + as separately
 * rounded IEEE operations, no contraction): the same bits as the generic
 * loop, one query at a time. */
#define ATTN_PV_Q 4
ATTN_INLINE void attn_chunk_pv(int NQ, int NV, int cl, const float *const p[], const float *const vblk[], int64_t st,
                               float *const ca[], float csum[]) {
    v16f a[ATTN_PV_Q][8];
    const v16f z = {0};
    float cs[ATTN_PV_Q];
    for (int u = 0; u < NQ; u++) {
        cs[u] = 0.0f;
        for (int w = 0; w < NV; w++) a[u][w] = z;
    }
    for (int j = 0; j < cl; j++) {
        const float *vr = vblk[j >> 4] + (int64_t)(j & 15) * st;
        v16f vv[8];
        for (int w = 0; w < NV; w++) vv[w] = ld16(vr + 16 * w);
        for (int u = 0; u < NQ; u++) {
            cs[u] += p[u][j];
            for (int w = 0; w < NV; w++) a[u][w] += p[u][j] * vv[w];
        }
    }
    for (int u = 0; u < NQ; u++) {
        for (int w = 0; w < NV; w++) st16p(ca[u] + 16 * w, &a[u][w]);
        csum[u] = cs[u];
    }
}

/* ---- 16 keys at a time on AVX-512: the same scores and exps ----------------
 * attn_scores16: sc[j] = ds_dot16(q, k_j, hd) * scale for 16 keys, hd a
 * multiple of 16. Each key's 16 lane accumulators are exactly ds_dot16's
 * (0 + q*k, then + q*k per 16 columns, separately rounded); the fixed combine
 * tree (a[l] += a[l+8], += a[l+4], += a[l+2], a[0] + a[1]) runs for the 16
 * keys at once — each level adds the same lane pairs of the same key, the
 * shuffles only move keys side by side — and one permute puts the keys back
 * in order. attn_exp16: p[j] = ds_expf(x[j] - cmax), ds_expf's operations
 * lane by lane (mul, add, fnmadd = fma(-kf, c, x), exact conversions and
 * exponent-field scaling; n / 2 rounding toward zero as C's) with its three
 * special cases as masks. So every level gives the same bits
 * (tests/cli_simd.sh, cli_golden's raw logits). */
#if DS_X86
#include <immintrin.h>
#define ATTN_TGT512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")))
ATTN_TGT512 static void attn_scores16(const float *qv, const float *k0, int64_t st, int hd, int nk, float scale,
                                      float *sc) {
    /* The 16 keys' chains side by side (the q vector loaded once per 16
     * columns, 16 independent adds in flight): key by key the same
     * 0 + q*k, + q*k, ... as one key at a time, which left the adder's
     * latency exposed on a single chain. hd >= 16 (a positive multiple of
     * 16), so the first step is 0 + q*k too. Keys past nk (a chunk's ragged
     * end) repeat key nk - 1 and are never stored. The key rows are walked
     * by adding the stride (an array of 16 row pointers was built with
     * 64-bit vector multiplies, slower than the dots). */
    const int64_t step = st, last = nk - 1;
    __m512 a[16];
    const __m512 q0 = _mm512_loadu_ps(qv);
    const float *kj = k0;
    for (int j = 0; j < 16; j++, kj += j <= last ? step : 0)
        a[j] = _mm512_add_ps(_mm512_setzero_ps(), _mm512_mul_ps(q0, _mm512_loadu_ps(kj)));
    for (int i = 16; i < hd; i += 16) {
        const __m512 qi = _mm512_loadu_ps(qv + i);
        kj = k0 + i;
        for (int j = 0; j < 16; j++, kj += j <= last ? step : 0)
            a[j] = _mm512_add_ps(a[j], _mm512_mul_ps(qi, _mm512_loadu_ps(kj)));
    }
    __m512 v1[8], v2[4], v3[2];
    for (int p = 0; p < 8; p++)              /* a[l] += a[l+8]: [key 2p | key 2p+1], 8 lanes each */
        v1[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int r = 0; r < 4; r++)              /* a[l] += a[l+4]: keys 4r .. 4r+3, 4 lanes each */
        v2[r] = _mm512_add_ps(_mm512_shuffle_f32x4(v1[2 * r], v1[2 * r + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(v1[2 * r], v1[2 * r + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int t = 0; t < 2; t++) {            /* a[l] += a[l+2]: block c = keys 8t+c, 8t+4+c, 2 lanes each */
        const __m512d x = _mm512_castps_pd(v2[2 * t]), y = _mm512_castps_pd(v2[2 * t + 1]);
        v3[t] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                              _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* a[0] + a[1]: lane 4c + m holds key 4m + c */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(v3[0], v3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(v3[0], v3[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i back = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_mask_storeu_ps(sc, (__mmask16)((1u << nk) - 1u),
                          _mm512_mul_ps(_mm512_permutexvar_ps(back, r), _mm512_set1_ps(scale)));
}


/* The chunk max of sc[0 .. n) (n >= 1), as the scalar scan computes it:
 * cmax = -inf, then cmax = sc[j] wherever sc[j] > cmax, in key order. A
 * NaN never wins a strict > and never wins VMAXPS(x, acc) either (VMAXPS
 * returns its second operand when one is NaN), so both give the largest
 * non-NaN score, or -inf. Lanes and key order can only change which of two
 * EQUAL scores is kept, i.e. the sign of a zero maximum — and no bit
 * downstream depends on that: s - (+0) and s - (-0) are the same number
 * unless s is a zero, and ds_expf(+0) = ds_expf(-0) = 1 (its reduction
 * gives r = +0 for both); the fold's m_run - mn and cmax - mn are likewise
 * a zero (exp 1) or the same nonzero number. */
ATTN_TGT512 static float attn_max16(const float *sc, int n) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m = ninf;
    int j = 0;
    for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(sc + j), m);
    if (j < n) m = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, (__mmask16)((1u << (n - j)) - 1u), sc + j), m);
    return _mm512_reduce_max_ps(m);
}

/* p[j] = ds_expf(sc[j] - cmax) for the first n (<= 16) of 16 lanes; the
 * lanes past n are computed from whatever sc holds there and dropped */
ATTN_TGT512 static void attn_exp16(const float *sc, int n, float cmax, float *p) {
    const __mmask16 k = (__mmask16)((1u << n) - 1u);
    _mm512_mask_storeu_ps(p, k, ds_expf16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sc), _mm512_set1_ps(cmax))));
}

/* ---- 8 keys at a time on AVX2: the same scores, max and exps ----------------
 * attn_scores8: sc[j] = ds_dot16(q, k_j, hd) * scale for up to 8 keys (hd a
 * positive multiple of 16). A key's 16 lane accumulators are two ymm halves,
 * each exactly ds_dot16's lanes (0 + q*k, then + q*k per 16 columns, mul and
 * add separately rounded, the accumulator the first operand); the 8 keys'
 * low halves run first (8 chains side by side), then the high halves, so
 * 8 accumulators and two q vectors fit the 16 registers. The fixed tree then
 * runs for the 8 keys at once: a[l] + a[l+8] is low + high; a[l] + a[l+4],
 * a[l] + a[l+2] and a[0] + a[1] add the same lane pairs of the same key
 * (128-bit permutes and in-lane shuffles only put keys side by side), and
 * one permute puts the keys in order. attn_max8 / attn_exp8: attn_max16's
 * and attn_exp16's arguments at 8 lanes (VMAXPS returns its second operand
 * when one is NaN; ds_expf8 is ds_expf lane by lane). */
#define ATTN_TGT2 __attribute__((target("avx2,fma")))
ATTN_TGT2 static void attn_scores8(const float *qv, const float *k0, int64_t st, int hd, int nk, float scale,
                                   float *sc) {
    const int last = nk - 1;
    __m256 h[2][8];
    for (int half = 0; half < 2; half++) {
        __m256 a[8];
        const __m256 q0 = _mm256_loadu_ps(qv + 8 * half);
        const float *kj = k0 + 8 * half;
        for (int j = 0; j < 8; j++, kj += j <= last ? st : 0)
            a[j] = _mm256_add_ps(_mm256_setzero_ps(), _mm256_mul_ps(q0, _mm256_loadu_ps(kj)));
        for (int i = 16; i < hd; i += 16) {
            const __m256 qi = _mm256_loadu_ps(qv + i + 8 * half);
            kj = k0 + i + 8 * half;
            for (int j = 0; j < 8; j++, kj += j <= last ? st : 0)
                a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(qi, _mm256_loadu_ps(kj)));
        }
        for (int j = 0; j < 8; j++) h[half][j] = a[j];
    }
    __m256 t[8], u[4], v[2];
    for (int j = 0; j < 8; j++) t[j] = _mm256_add_ps(h[0][j], h[1][j]);          /* a[l] += a[l+8] */
    for (int p = 0; p < 4; p++)                                                  /* a[l] += a[l+4] */
        u[p] = _mm256_add_ps(_mm256_permute2f128_ps(t[2 * p], t[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(t[2 * p], t[2 * p + 1], 0x31));
    for (int p = 0; p < 2; p++) {                                                /* a[l] += a[l+2] */
        const __m256d x = _mm256_castps_pd(u[2 * p]), y = _mm256_castps_pd(u[2 * p + 1]);
        v[p] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
    }
    /* a[0] + a[1]: lanes 0..3 keys 0, 2, 4, 6; lanes 4..7 keys 1, 3, 5, 7 */
    const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m256 o = _mm256_mul_ps(_mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)),
                                   _mm256_set1_ps(scale));
    if (nk == 8) {
        _mm256_storeu_ps(sc, o);
    } else {
        float b[8];
        _mm256_storeu_ps(b, o);
        memcpy(sc, b, sizeof(float) * (size_t)nk);
    }
}

ATTN_TGT2 static float attn_max8(const float *sc, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(sc + j), m);
    float b[8];
    _mm256_storeu_ps(b, m);
    float r = -INFINITY;
    for (int l = 0; l < 8; l++) if (b[l] > r) r = b[l];
    for (; j < n; j++) if (sc[j] > r) r = sc[j];
    return r;
}

/* p[j] = ds_expf(sc[j] - cmax) for j < n (<= 8) */
ATTN_TGT2 static void attn_exp8(const float *sc, int n, float cmax, float *p) {
    float b[8] = {0};
    memcpy(b, sc, sizeof(float) * (size_t)n);
    _mm256_storeu_ps(b, ds_expf8(_mm256_sub_ps(_mm256_loadu_ps(b), _mm256_set1_ps(cmax))));
    memcpy(p, b, sizeof(float) * (size_t)n);
}

/* attn_chunk_pv on AVX2: GCC keeps the 64-byte vectors of the generic loop in
 * memory here (every update a store and a reload), so the accumulators are
 * ymm pairs, 16 columns of head_dim per pass over the chunk's keys (up to 4
 * queries x 2 ymm = 8 add chains in registers; V rows re-read from L1 by the
 * later passes). Per (query, column) the same p * v then + in key order, the
 * accumulator and p the first operands as in the generic loop; the exp-sums
 * in key order as there. */
ATTN_TGT2 static void attn_chunk_pv8(int NQ, int hd, int cl, const float *const p[], const float *const vblk[],
                                     int64_t st, float *const ca[], float csum[]) {
    for (int u = 0; u < NQ; u++) {
        float cs = 0.0f;
        for (int j = 0; j < cl; j++) cs += p[u][j];
        csum[u] = cs;
    }
    for (int d0 = 0; d0 < hd; d0 += 16) {
        __m256 a[ATTN_PV_Q][2];
        for (int u = 0; u < NQ; u++) a[u][0] = a[u][1] = _mm256_setzero_ps();
        for (int j = 0; j < cl; j++) {
            const float *vr = vblk[j >> 4] + (int64_t)(j & 15) * st + d0;
            const __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8);
            for (int u = 0; u < NQ; u++) {
                const __m256 pj = _mm256_set1_ps(p[u][j]);
                a[u][0] = _mm256_add_ps(a[u][0], _mm256_mul_ps(pj, v0));
                a[u][1] = _mm256_add_ps(a[u][1], _mm256_mul_ps(pj, v1));
            }
        }
        for (int u = 0; u < NQ; u++) {
            _mm256_storeu_ps(ca[u] + d0, a[u][0]);
            _mm256_storeu_ps(ca[u] + d0 + 8, a[u][1]);
        }
    }
}
#endif

/* Ask for the K and V rows of positions [c0, c1) of one kv head (hd floats
 * each, 16 positions a page or a part of one) to be brought into L2. A
 * decode step reads its K/V about one step after they were last touched,
 * with the whole weight stream in between, so they come from L3 or memory,
 * in rows kv_stride apart that the hardware prefetchers follow poorly.
 * Requested a chunk ahead, they are in flight together: a cold decode's
 * attention ~10% faster at avx2 and avx512 (AMD EPYC Zen 4;
 * bench/results/cpu-s36-verify-m505.txt). Addresses only: no value read,
 * no bit depends on it. */
ATTN_INLINE void attn_prefetch_kv(const float *kb, const float *vb, const ds_attn_rows *rw, int seq, int64_t st,
                                  int hd, int c0, int c1) {
    const size_t bytes = sizeof(float) * (size_t)hd;
    for (int j0 = c0; j0 < c1; j0 += 16) {
        const int64_t off = attn_kv_off(rw, seq, j0, st);
        const int n = ds_imin(16, c1 - j0);
        for (int j = 0; j < n; j++) {
            const char *kr = (const char *)(kb + off + (int64_t)j * st), *vr = (const char *)(vb + off + (int64_t)j * st);
            for (size_t o = 0; o < bytes; o += 64) {
                __builtin_prefetch(kr + o, 0, 2);
                __builtin_prefetch(vr + o, 0, 2);
            }
            __builtin_prefetch(kr + bytes - 1, 0, 2);
            __builtin_prefetch(vr + bytes - 1, 0, 2);
        }
    }
}

/* A block of queries that share a kv head: nr rows (row r of prefix length
 * L[r]) x nq (<= ATTN_PV_Q) of the kv head's GQA heads, query u = r * nq + h
 * at qv[u], its output at out[u]. Each query runs exactly the decode
 * sequence above — per chunk its scores, its max, its exps, its exp-sum and
 * p.V, its fold — and no value of one query enters another's. What the
 * queries share is the memory traffic: chunk by chunk, every 16-key block
 * of K is read from L2 once and scored for all of them from L1, and a
 * chunk's V rows serve a whole row's heads in one pass (attn_chunk_pv) and
 * the block's rows one after the other while they are in L1. acc and cacc
 * are nr * nq * head_dim floats of scratch each. */
#define ATTN_QMAX 16
ATTN_INLINE void attn_block(const ds_attn_shape *s, int nr, const int L[], int nq, const float *const qv[],
                            const float *kb, const float *vb, const ds_attn_rows *rw, int seq,
                            float *const out[], float *acc, float *cacc) {
    const int hd = s->head_dim;
    const int64_t st = s->kv_stride;
    float m_run[ATTN_QMAX], l_run[ATTN_QMAX], csum[ATTN_QMAX];
    float sc[ATTN_QMAX][DS_ATTN_CHUNK], pb[ATTN_QMAX][DS_ATTN_CHUNK];
    const float *pq[ATTN_QMAX];
    float *ca[ATTN_QMAX];
    int Lmax = 0;
    for (int r = 0; r < nr; r++) {
        if (L[r] > Lmax) Lmax = L[r];
        for (int h = 0; h < nq; h++) {
            const int u = r * nq + h;
            m_run[u] = -INFINITY;
            l_run[u] = 0.0f;
            pq[u] = pb[u];
            if (L[r] <= 0) memset(out[u], 0, sizeof(float) * (size_t)hd);
        }
    }
#if DS_X86
    const int v16 = hd % 16 == 0 && ds_simd_level() == DS_LVL_AVX512;
    const int v8 = hd % 16 == 0 && ds_simd_level() == DS_LVL_AVX2;
#endif
    /* the first chunk's K/V now, each next one while this one is computed */
    attn_prefetch_kv(kb, vb, rw, seq, st, hd, 0, ds_imin(DS_ATTN_CHUNK, Lmax));
    for (int c0 = 0; c0 < Lmax; c0 += DS_ATTN_CHUNK) {
        if (c0 + DS_ATTN_CHUNK < Lmax)
            attn_prefetch_kv(kb, vb, rw, seq, st, hd, c0 + DS_ATTN_CHUNK, ds_imin(c0 + 2 * DS_ATTN_CHUNK, Lmax));
        int cl[ATTN_QMAX], clmax = 0;
        for (int r = 0; r < nr; r++) {
            cl[r] = ds_imin(DS_ATTN_CHUNK, L[r] - c0);   /* <= 0: the row is done */
            if (cl[r] > clmax) clmax = cl[r];
        }
        /* the chunk's K and V rows, 16 positions at a time (one page or a
         * part of one: the addresses are the only thing pages change) */
        const float *kblk[DS_ATTN_CHUNK / 16], *vblk[DS_ATTN_CHUNK / 16];
        for (int b = 0; b * 16 < clmax; b++) {
            const int64_t off = attn_kv_off(rw, seq, c0 + 16 * b, st);
            kblk[b] = kb + off;
            vblk[b] = vb + off;
        }
        /* scores, 16 keys at a time where the level allows (the same bits;
         * a ragged end as a partial block of 16), block by block for all
         * the queries (the rows of one kv head are kv_stride apart, a power
         * of two for the usual shapes, so a whole chunk of them competes
         * for a fraction of L1's sets and would not survive a second pass) */
        int j0 = 0;
#if DS_X86
        if (v16)
            for (; j0 < clmax; j0 += 16)
                for (int r = 0; r < nr; r++)
                    for (int h = 0; cl[r] > j0 && h < nq; h++)
                        attn_scores16(qv[r * nq + h], kblk[j0 >> 4], st, hd,
                                      ds_imin(16, cl[r] - j0), s->scale, sc[r * nq + h] + j0);
        if (v8)   /* blocks of 8 keys: a 16-key block's halves, rows 8 apart */
            for (; j0 < clmax; j0 += 8)
                for (int r = 0; r < nr; r++)
                    for (int h = 0; cl[r] > j0 && h < nq; h++)
                        attn_scores8(qv[r * nq + h], kblk[j0 >> 4] + (int64_t)(j0 & 15) * st, st, hd,
                                     ds_imin(8, cl[r] - j0), s->scale, sc[r * nq + h] + j0);
#endif
        for (int r = 0; r < nr; r++)
            for (int h = 0; h < nq; h++) {
                const int u = r * nq + h;
                int j = j0;
                for (; j < cl[r]; j++) sc[u][j] = ds_dot16(qv[u], kblk[j >> 4] + (int64_t)(j & 15) * st, hd) * s->scale;
                if (cl[r] <= 0) continue;
                /* chunk max (strict >, key order; 16 lanes at a time where the
                 * level allows: attn_max16 says why that is the same value) */
                float cmax = -INFINITY;
                j = 0;
#if DS_X86
                if (v16) {
                    cmax = attn_max16(sc[u], cl[r]);
                    j = cl[r];
                }
                if (v8) {
                    cmax = attn_max8(sc[u], cl[r]);
                    j = cl[r];
                }
#endif
                for (; j < cl[r]; j++)
                    if (sc[u][j] > cmax) cmax = sc[u][j];
                /* the chunk's exps; cmax parked in sc[u][0] until the fold */
                j = 0;
#if DS_X86
                if (v16)
                    for (; j < cl[r]; j += 16) attn_exp16(sc[u] + j, ds_imin(16, cl[r] - j), cmax, pb[u] + j);
                if (v8)
                    for (; j < cl[r]; j += 8) attn_exp8(sc[u] + j, ds_imin(8, cl[r] - j), cmax, pb[u] + j);
#endif
                for (; j < cl[r]; j++) pb[u][j] = ds_expf(sc[u][j] - cmax);
                sc[u][0] = cmax;
                /* the first chunk writes acc directly */
                ca[u] = (c0 == 0 ? acc : cacc) + (size_t)u * hd;
            }
        /* exp-sums and p.V for the chunk, a row's heads in one pass */
        for (int r = 0; r < nr; r++) {
            if (cl[r] <= 0) continue;
            const int u0 = r * nq, n = cl[r];
            const float *const *p = pq + u0;
            float *const *c = ca + u0;
            float *cs = csum + u0;
#if DS_X86
            if (v8) {
                /* the next rows of the block with the same chunk length (all
                 * of them but in a causal batch's last, ragged chunk) join
                 * this row's pass while the queries fit ATTN_PV_Q: more
                 * independent add chains per key, and each 16-column strip
                 * of V read once for them (the rows' V lines are kv_stride
                 * apart, a power of two, so they mostly miss L1 on a second
                 * read); query u's sums are its own either way */
                int k = 1;
                while (r + k < nr && cl[r + k] == n && (k + 1) * nq <= ATTN_PV_Q) k++;
                const int NQ = k * nq;
                r += k - 1;
                if (NQ == 4) attn_chunk_pv8(4, hd, n, p, vblk, st, c, cs);
                else if (NQ == 3) attn_chunk_pv8(3, hd, n, p, vblk, st, c, cs);
                else if (NQ == 2) attn_chunk_pv8(2, hd, n, p, vblk, st, c, cs);
                else for (int h = 0; h < NQ; h++) attn_chunk_pv8(1, hd, n, p + h, vblk, st, c + h, cs + h);
                continue;
            }
#endif
            if (hd == 64 && nq == 4) attn_chunk_pv(4, 4, n, p, vblk, st, c, cs);
            else if (hd == 64 && nq == 3) attn_chunk_pv(3, 4, n, p, vblk, st, c, cs);
            else if (hd == 64 && nq == 2) attn_chunk_pv(2, 4, n, p, vblk, st, c, cs);
            else if (hd == 64)
                for (int h = 0; h < nq; h++) attn_chunk_pv(1, 4, n, p + h, vblk, st, c + h, cs + h);
            else if (hd == 128 && nq == 2) attn_chunk_pv(2, 8, n, p, vblk, st, c, cs);
            else if (hd == 128)
                for (int h = 0; h < nq; h++) attn_chunk_pv(1, 8, n, p + h, vblk, st, c + h, cs + h);
            else
                for (int h = 0; h < nq; h++) {
                    float *cu = c[h], sum = 0.0f;
                    for (int d = 0; d < hd; d++) cu[d] = 0.0f;
                    for (int j = 0; j < n; j++) {
                        const float *vr = vblk[j >> 4] + (int64_t)(j & 15) * st;
                        sum += p[h][j];
                        for (int d = 0; d < hd; d++) cu[d] += p[h][j] * vr[d];
                    }
                    cs[h] = sum;
                }
        }
        /* fold the chunk into each query's running state, left to right */
        for (int r = 0; r < nr; r++)
            for (int h = 0; cl[r] > 0 && h < nq; h++) {
                const int u = r * nq + h;
                const float cmax = sc[u][0];
                float *au = acc + (size_t)u * hd;
                const float *cu = cacc + (size_t)u * hd;
                if (c0 == 0) {
                    m_run[u] = cmax;
                    l_run[u] = csum[u];
                } else {
                    const float mn = m_run[u] > cmax ? m_run[u] : cmax;
                    const float ea = ds_expf(m_run[u] - mn), eb = ds_expf(cmax - mn);
                    l_run[u] = l_run[u] * ea + csum[u] * eb;
                    for (int d = 0; d < hd; d++) au[d] = au[d] * ea + cu[d] * eb;
                    m_run[u] = mn;
                }
            }
    }
    for (int r = 0; r < nr; r++)
        for (int h = 0; L[r] > 0 && h < nq; h++) {
            const int u = r * nq + h;
            for (int d = 0; d < hd; d++) out[u][d] = acc[(size_t)u * hd + d] / l_run[u];
        }
}

/* ========================================================================
 * CANONICAL — threads split items of (a group of rows, a kv head, a batch
 * of up to ATTN_PV_Q of its GQA heads); each runs attn_block()
 * ======================================================================== */
/* Item i -> rows [m0, m0 + nr) of one run, kv head, heads [h0, h0 + nq).
 * Within a run items are row-group-major, so with one row and one head per
 * item (rb = qb = 1) item i is the (row, head) pair i = m * n_head + h. */
static inline void attn_item(const attn_args *a, int64_t i, int *m0, int *nr, int *kvh, int *h0, int *nq) {
    const ds_attn_shape *s = a->s;
    const attn_run *ru = attn_run_of(a, i);
    i -= ru->item0;
    const int group = s->n_head / s->n_kv_head, nsub = (group + a->qb - 1) / a->qb;
    const int per_group = s->n_kv_head * nsub, r = (int)(i % per_group);
    *m0 = ru->m0 + (int)(i / per_group) * ru->rb;
    *nr = ds_imin(ru->rb, ru->m0 + ru->n - *m0);
    *kvh = r / nsub;
    *h0 = *kvh * group + (r % nsub) * a->qb;
    *nq = ds_imin(a->qb, (*kvh + 1) * group - *h0);
}

static void attn_canon_range(void *arg, int64_t i0, int64_t i1, int chunk);
DS_OPS_BODY_IDX(attn_canon_range) {
    const attn_args *a = arg;
    const ds_attn_shape *s = a->s;
    const int hd = s->head_dim;
    const size_t need = 2 * (size_t)ATTN_QMAX * (size_t)hd;
    float stack_buf[2 * ATTN_QMAX * ATTN_STACK_HD];
    float *buf = stack_buf, *owned = NULL;
    if (hd > ATTN_STACK_HD) {   /* the thread's reserved scratch, else (standalone) malloc */
        size_t have;
        buf = ds_pool_thread_scratch(a->pool, chunk, &have);
        if (have < sizeof(float) * need) buf = owned = malloc(sizeof(float) * need);
    }
    for (int64_t i = i0; i < i1; i++) {
        int m0, nr, kvh, h0, nq, L[ATTN_QMAX];
        attn_item(a, i, &m0, &nr, &kvh, &h0, &nq);
        const float *qv[ATTN_QMAX];
        float *out[ATTN_QMAX];
        for (int r = 0; r < nr; r++) {
            L[r] = attn_len(a, m0 + r);
            for (int h = 0; h < nq; h++) {
                const int64_t row = (int64_t)(m0 + r) * s->n_head + h0 + h;
                qv[r * nq + h] = a->q + row * hd;
                out[r * nq + h] = a->out + row * hd;
            }
        }
        if (!buf) {   /* cannot compute: make the failure loud, not silent */
            for (int u = 0; u < nr * nq; u++)
                for (int d = 0; d < hd; d++) out[u][d] = NAN;
            continue;
        }
        attn_block(s, nr, L, nq, qv, a->k + (int64_t)kvh * hd, a->v + (int64_t)kvh * hd, a->r,
                   attn_seq(a->r, m0), out, buf, buf + (size_t)ATTN_QMAX * hd);
    }
    free(owned);
}

/* ========================================================================
 * FAST — one pass over the whole prefix per tile of 8 queries of a kv head
 * ======================================================================== */
/* A tile is up to FAST_Q queries that share one kv head: the GQA heads of
 * that kv head for consecutive rows (query index r*group + g). The tile's q
 * vectors are transposed to Qt[d][q] so that every loop below runs across
 * the 8 queries (or across head_dim) and vectorizes without a horizontal
 * reduction; each K and V row is loaded once per tile, not once per query.
 *
 * WHY the bits differ from decode (each alone would suffice):
 *  - dot: q·k accumulated sequentially over d (one accumulator per query),
 *    vs the 16-lane tree;
 *  - softmax: ONE max over the whole prefix, p = exp(s - global_max) — decode
 *    uses exp(s - chunk_max) and rescales by exp(chunk_max - m) per chunk;
 *  - exp: ds_exp_fast polynomial, vs libm expf;
 *  - sum and P·V: over the whole prefix in key order, no per-chunk partial
 *    sums, no rescale products; normalized by a reciprocal multiply, not a
 *    divide. */
#define FAST_Q 8     /* queries per tile: one AVX2 vector, two SSE/NEON vectors */

#define st8(p, v) do { v8f st_tmp_ = (v); st8p((p), &st_tmp_); } while (0)
#define st16(p, v) do { v16f st_tmp_ = (v); st16p((p), &st_tmp_); } while (0)
ATTN_INLINE v8f ld8(const float *p) { v8f v; memcpy(&v, p, sizeof v); return v; }
ATTN_INLINE void st8p(float *p, const v8f *v) { memcpy(p, v, sizeof *v); }

typedef struct {
    float *qt;       /* [head_dim][FAST_Q]              */
    float *S;        /* [lmax][FAST_Q], scores then p    */
    float **op;      /* [FAST_Q] output row per query    */
} attn_tile_scratch;

ATTN_INLINE void attn_fast_tile(const attn_args *a, const attn_run *ru, int kvh, int t0, int nq,
                                int64_t lmax_all, attn_tile_scratch *t) {
    const ds_attn_shape *s = a->s;
    const int hd = s->head_dim, group = s->n_head / s->n_kv_head;
    const int64_t st = s->kv_stride;
    const int seq = attn_seq(a->r, ru->m0);
#define KV(j) attn_kv_off(a->r, seq, (j), st)
    const float *kb = a->k + (int64_t)kvh * hd, *vb = a->v + (int64_t)kvh * hd;
    int len[FAST_Q];
    int lmax = 0;
    float *qt = t->qt, *S = t->S;
    /* gather and transpose the tile's queries; unused slots are zero */
    memset(qt, 0, sizeof(float) * (size_t)hd * FAST_Q);
    for (int u = 0; u < FAST_Q; u++) {
        len[u] = 0;
        t->op[u] = NULL;
        if (u >= nq) continue;
        const int qi = t0 + u, r = ru->m0 + qi / group, g = qi % group;
        const int64_t row = (int64_t)r * s->n_head + (int64_t)kvh * group + g;
        const float *qv = a->q + row * hd;
        for (int d = 0; d < hd; d++) qt[d * FAST_Q + u] = qv[d];
        t->op[u] = a->out + row * hd;
        len[u] = attn_len(a, r) > 0 ? attn_len(a, r) : 0;
        if (len[u] > lmax) lmax = len[u];
    }
    if (lmax > lmax_all) lmax = (int)lmax_all;

    /* 1) scores S[j][u] = (q_u · k_j) * scale for every key of the tile's
     *    longest prefix (all in the cache); one vector holds the 8 queries,
     *    4 keys give 4 independent chains (4 keys at j % 4 == 0 share a page) */
    const v8f zero8 = {0}, scale8 = zero8 + s->scale;
    int j = 0;
    for (; j + 4 <= lmax; j += 4) {
        v8f a0 = zero8, a1 = zero8, a2 = zero8, a3 = zero8;
        const float *k0 = kb + KV(j), *k1 = k0 + st, *k2 = k1 + st, *k3 = k2 + st;
        for (int d = 0; d < hd; d++) {
            const v8f qd = ld8(qt + d * FAST_Q);
            a0 += qd * k0[d];
            a1 += qd * k1[d];
            a2 += qd * k2[d];
            a3 += qd * k3[d];
        }
        st8(S + (int64_t)(j + 0) * FAST_Q, a0 * scale8);
        st8(S + (int64_t)(j + 1) * FAST_Q, a1 * scale8);
        st8(S + (int64_t)(j + 2) * FAST_Q, a2 * scale8);
        st8(S + (int64_t)(j + 3) * FAST_Q, a3 * scale8);
    }
    for (; j < lmax; j++) {
        v8f a0 = zero8;
        const float *k0 = kb + KV(j);
        for (int d = 0; d < hd; d++) a0 += ld8(qt + d * FAST_Q) * k0[d];
        st8(S + (int64_t)j * FAST_Q, a0 * scale8);
    }

    /* 2) one global max per query, exp, one sum — all across the 8 queries.
     *    Keys past a query's own prefix are masked to -inf first (only the
     *    ragged causal tail), so the exp loop is branch-free and vectorizes:
     *    ds_exp_fast(-inf) is exactly +0. */
    float mx[FAST_Q], inv_l[FAST_Q];
    for (int u = 0; u < FAST_Q; u++) {
        const int lim = u < nq ? len[u] : lmax;
        for (j = lim; j < lmax; j++) S[(int64_t)j * FAST_Q + u] = -INFINITY;
    }
    v8f m8 = zero8 - INFINITY;
    for (j = 0; j < lmax; j++) {
        const v8f x = ld8(S + (int64_t)j * FAST_Q);
        const v8i gt = x > m8;
        m8 = (v8f)(((v8i)x & gt) | ((v8i)m8 & ~gt));
    }
    memcpy(mx, &m8, sizeof mx);
    for (int u = 0; u < FAST_Q; u++) if (!(mx[u] > -INFINITY)) mx[u] = 0.0f;
    for (j = 0; j < lmax; j++) {
        float *sp = S + (int64_t)j * FAST_Q;
        for (int u = 0; u < FAST_Q; u++) sp[u] = ds_exp_fast(sp[u] - mx[u]);
    }
    v8f l8 = zero8;
    for (j = 0; j < lmax; j++) l8 += ld8(S + (int64_t)j * FAST_Q);
    float l[FAST_Q];
    memcpy(l, &l8, sizeof l);
    for (int u = 0; u < FAST_Q; u++) inv_l[u] = len[u] > 0 ? 1.0f / l[u] : 0.0f;

    /* 3) P·V in key order, register-blocked: for each block of 16 columns of
     *    head_dim, the tile's 8 accumulators stay in registers over all keys
     *    and V row j is loaded once for the tile. Every (query, d) still sums
     *    p_j * v_j[d] over j in key order. Written straight into out (q was
     *    consumed in step 1, so out may alias q). */
    int d0 = 0;
    for (; d0 + 16 <= hd; d0 += 16) {
        v16f acc[FAST_Q];
        const v16f zero16 = {0};
        for (int u = 0; u < FAST_Q; u++) acc[u] = zero16;
        for (j = 0; j < lmax; j++) {
            const v16f vj = ld16(vb + KV(j) + d0);
            const float *pj = S + (int64_t)j * FAST_Q;
            for (int u = 0; u < FAST_Q; u++) acc[u] += vj * pj[u];
        }
        for (int u = 0; u < nq; u++) st16(t->op[u] + d0, acc[u] * inv_l[u]);
    }
    for (; d0 < hd; d0++) {   /* head_dim % 16 tail, one column at a time */
        v8f acc = zero8;
        for (j = 0; j < lmax; j++) acc += ld8(S + (int64_t)j * FAST_Q) * vb[KV(j) + d0];
        float r[FAST_Q];
        memcpy(r, &acc, sizeof r);
        for (int u = 0; u < nq; u++) t->op[u][d0] = r[u] * inv_l[u];
    }
#undef KV
}

DS_OPS_BODY_IDX(attn_fast_range) {
    const attn_args *a = arg;
    const ds_attn_shape *s = a->s;
    const int hd = s->head_dim, group = s->n_head / s->n_kv_head;
    /* the longest prefix any row of this call sees */
    int64_t lmax_all = 0;
    for (int k = 0; k < a->n_runs; k++) if (a->run[k].lmax > lmax_all) lmax_all = a->run[k].lmax;
    /* the thread's reserved scratch (ds_attention_thread_scratch); a call
     * beyond the reservation (standalone use) allocates once per range */
    size_t nf = (size_t)hd * FAST_Q + (size_t)(lmax_all + 1) * FAST_Q, have;
    float *mem = ds_pool_thread_scratch(a->pool, chunk, &have), *owned = NULL;
    if (have < nf * sizeof(float)) mem = owned = malloc(nf * sizeof(float));
    if (!mem) {   /* out of memory: nothing to compute with; make it loud */
        for (int64_t i = i0; i < i1; i++) {
            const attn_run *ru = attn_run_of(a, i);
            const int tiles = (ru->n * group + FAST_Q - 1) / FAST_Q, li = (int)(i - ru->item0);
            const int kvh = li / tiles, t0 = (li % tiles) * FAST_Q;
            for (int qi = t0; qi < t0 + FAST_Q && qi < ru->n * group; qi++) {
                float *o = a->out + ((int64_t)(ru->m0 + qi / group) * s->n_head + (int64_t)kvh * group + qi % group) * hd;
                for (int d = 0; d < hd; d++) o[d] = NAN;
            }
        }
        return;
    }
    float *op[FAST_Q];
    attn_tile_scratch t = { mem, mem + (size_t)hd * FAST_Q, op };
    for (int64_t i = i0; i < i1; i++) {
        const attn_run *ru = attn_run_of(a, i);
        const int tiles = (ru->n * group + FAST_Q - 1) / FAST_Q, li = (int)(i - ru->item0);
        const int kvh = li / tiles, t0 = (li % tiles) * FAST_Q;
        attn_fast_tile(a, ru, kvh, t0, ds_imin(FAST_Q, ru->n * group - t0), ru->lmax, &t);
    }
    free(owned);
}

size_t ds_attention_thread_scratch(int hd_max, int64_t n_ctx) {
    if (hd_max <= 0 || n_ctx < 0) return 0;
    const size_t fast = ((size_t)hd_max * FAST_Q + (size_t)(n_ctx + 1) * FAST_Q) * sizeof(float);
    const size_t canon = hd_max > ATTN_STACK_HD ? 2 * (size_t)ATTN_QMAX * (size_t)hd_max * sizeof(float) : 0;
    return fast > canon ? fast : canon;
}

DS_OPS_DISPATCH_IDX(attn_canon_range)
DS_OPS_DISPATCH_IDX(attn_fast_range)

/* ========================================================================
 * entry point
 * ======================================================================== */
/* One pass over rows [m0, m1) holding at most ATTN_RUNS runs. */
static void attn_pass(ds_variant v, attn_args *a, int m0, int m1) {
    const ds_attn_shape *s = a->s;
    const int group = s->n_head / s->n_kv_head, nt = a->pool ? ds_pool_threads(a->pool) : 1;
    a->n_runs = 0;
    int64_t lmax = 0;
    for (int m = m0; m < m1;) {
        const int seq = attn_seq(a->r, m);
        int e = m + 1;
        while (e < m1 && attn_seq(a->r, e) == seq) e++;
        attn_run *ru = &a->run[a->n_runs++];
        ru->m0 = m;
        ru->n = e - m;
        ru->lmax = 0;
        for (int k = m; k < e; k++) if (attn_len(a, k) > ru->lmax) ru->lmax = attn_len(a, k);
        if (ru->lmax > lmax) lmax = ru->lmax;
        m = e;
    }
    /* normally a no-op (reserved at context creation); grows once otherwise */
    ds_pool_reserve(a->pool, ds_attention_thread_scratch(s->head_dim, lmax), 0);
    int64_t items = 0;
    if (v == DS_FAST) {
        /* tiles of FAST_Q queries (row-major over (row, GQA head)) per kv
         * head, per run */
        for (int k = 0; k < a->n_runs; k++) {
            a->run[k].item0 = items;
            items += (int64_t)((a->run[k].n * group + FAST_Q - 1) / FAST_Q) * s->n_kv_head;
        }
        ds_pool_for_idx(a->pool, items, 1, attn_fast_range, a);
        return;
    }
    /* Items of up to ATTN_QMAX queries of one kv head, inside one run: its
     * GQA heads in batches of up to ATTN_PV_Q (one pass over V serves a
     * row's batch), rows in groups of ATTN_QMAX / batch (K and V read once
     * from L2 per group), the groups as even as the row count allows. More,
     * smaller groups, then one head per item, while that leaves fewer items
     * than threads (decode with few kv heads on many threads). Each query's
     * bits are the same however the items are cut (attn_block). */
    a->qb = group < ATTN_PV_Q ? group : ATTN_PV_Q;
    for (;;) {
        const int64_t per = (int64_t)s->n_kv_head * ((group + a->qb - 1) / a->qb);
        int64_t ngr_all = 0;
        for (int k = 0; k < a->n_runs; k++) {
            attn_run *ru = &a->run[k];
            ru->rb = ds_imin(ATTN_QMAX / a->qb, ru->n);
            ru->ngr = (ru->n + ru->rb - 1) / ru->rb;
            ngr_all += ru->ngr;
        }
        while (ngr_all * per < nt) {           /* split the run with the largest groups */
            int best = -1;
            for (int k = 0; k < a->n_runs; k++)
                if (a->run[k].rb > 1 && (best < 0 || a->run[k].rb > a->run[best].rb)) best = k;
            if (best < 0) break;
            attn_run *ru = &a->run[best];
            ngr_all -= ru->ngr;
            ru->rb = (ru->n + ru->ngr) / (ru->ngr + 1);
            if (ru->rb < 1) ru->rb = 1;
            ru->ngr = (ru->n + ru->rb - 1) / ru->rb;
            ngr_all += ru->ngr;
        }
        if (ngr_all * per >= nt || a->qb == 1) {
            for (int k = 0; k < a->n_runs; k++) {
                a->run[k].item0 = items;
                items += (int64_t)a->run[k].ngr * per;
            }
            break;
        }
        a->qb = 1;
    }
    ds_pool_for_idx(a->pool, items, 1, attn_canon_range, a);
}

void ds_attention_rows(ds_variant v, const ds_attn_shape *s, int M, const ds_attn_rows *r,
                       const float *q, const float *kcache, const float *vcache, float *out,
                       ds_pool *pool) {
    if (M <= 0 || s->n_head <= 0 || s->n_kv_head <= 0 || s->head_dim <= 0) return;
    attn_args a = { .s = s, .M = M, .r = r, .q = q, .k = kcache, .v = vcache, .out = out, .pool = pool };
    /* passes of at most ATTN_RUNS runs (a row's bits never depend on them) */
    for (int m0 = 0; m0 < M;) {
        int m1 = m0 + 1, runs = 1;
        while (m1 < M && (attn_seq(r, m1) == attn_seq(r, m1 - 1) || runs < ATTN_RUNS)) {
            if (attn_seq(r, m1) != attn_seq(r, m1 - 1)) runs++;
            m1++;
        }
        attn_pass(v, &a, m0, m1);
        m0 = m1;
    }
}

/* The contiguous cache of one sequence: rows at pos0 + m, causal or all
 * seeing [0, n_kv), in slices whose visible lengths fit a stack array. */
void ds_attention(ds_variant v, const ds_attn_shape *s, int M, int pos0, int causal, int n_kv,
                  const float *q, const float *kcache, const float *vcache, float *out,
                  ds_pool *pool) {
    enum { SLICE = 256 };
    int32_t nv[SLICE];
    for (int m0 = 0; m0 < M; m0 += SLICE) {
        const int n = M - m0 < SLICE ? M - m0 : SLICE;
        for (int m = 0; m < n; m++) nv[m] = causal ? pos0 + m0 + m + 1 : n_kv;
        const ds_attn_rows r = { nv, NULL, NULL, NULL, 0, 0, 0 };
        const size_t qo = (size_t)m0 * (size_t)s->n_head * (size_t)s->head_dim;
        ds_attention_rows(v, s, n, &r, q + qo, kcache, vcache, out + qo, pool);
    }
}
