/* attn_sinks.c — the attn_sinks family: DeepSeek V4's attention with one
 * sink logit per head and an optional sliding window (llama.cpp's
 * deepseek4 raw attention layers: one KV head of head_dim 512 whose row is
 * both K and V, softmax over the visible positions plus the head's sink).
 *
 * For row m at position p (n_vis = p + 1 visible positions, or the row's
 * own n_vis) and head h: positions j in [lo, n_vis), lo = n_vis - window
 * when a window is set and shorter, else 0; s_j = (q . k_j) * scale; the
 * result is sum_j e^(s_j) v_j / (e^(sink_h) + sum_j e^(s_j)).
 *
 *   decode     attend_row(): the positions in chunks of DS_ATTN_CHUNK at
 *              absolute boundaries (0, 64, 128, ...; the window's start cuts
 *              into the first), scores by ds_dot16 (16 lanes, fixed tree),
 *              per chunk an online softmax (max, ds_expf(s - max), the sum
 *              and the weighted V rows in position order), the chunks folded
 *              left to right (m = max(m, m_c), both sides rescaled by
 *              ds_expf), then the sink folded last, and one IEEE division
 *              per output — attention.c's order, with the sink at the end.
 *   canonical  attend_row() for every (row, head), split over threads by
 *              (row, head): a row's result is a function of its query, its
 *              visible rows and the sink alone, never of M.
 *   fast       what a batched kernel does: one online softmax over the
 *              whole window position by position (no chunks) starting from
 *              the sink, the dot in 4 interleaved partial sums, V updated by
 *              fmaf, and the output multiplied by the reciprocal of the sum.
 * Why the bits differ: the chunked fold rescales each chunk's partial sums
 * once per chunk, the one-pass form once per position; the dot products
 * are associated differently (16-lane tree vs 4 partial sums); fmaf rounds
 * once where canonical rounds the product and the sum; x * (1/L) is not
 * x / L. Each is a legitimate kernel; only attend_row() is decode's.
 *
 * Compressed keys (deepseek4's compressed layers, x != NULL): row m also
 * attends the compressed rows of the blocks b < n_vis / ratio (each K = V,
 * `off` floats into the K row of position b * ratio + ratio - 1). Decode
 * folds them after the window's chunks and before the sink, in block order,
 * in chunks of DS_ATTN_CHUNK blocks from block 0 (a row's own count, never
 * M); fast runs them through the same one-pass update after the window.
 * A CSA layer passes the indexer's selection: only those blocks, in
 * ascending block order. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"
#include "kernels/dsmath.h"

#include <math.h>

typedef struct {
    const ds_attn_shape *s;
    const ds_attn_rows *r;
    int window;
    const ds_attn_extra *x;
    const float *sinks, *q, *kc, *vc;
    float *out;
} sink_args;

/* position j of row m's sequence: its K (or V) row */
static inline const float *kv_row(const ds_attn_rows *r, const ds_attn_shape *s, int m, int j, const float *base) {
    if (!r->tables) return base + (size_t)j * (size_t)s->kv_stride;
    const int sq = r->seq ? r->seq[m] : 0;
    const int32_t pg = r->tables[(size_t)sq * (size_t)r->max_pages + (size_t)(j / r->page)];
    return base + (size_t)pg * (size_t)r->page_stride + (size_t)(j % r->page) * (size_t)s->kv_stride;
}

static inline int row_nvis(const ds_attn_rows *r, int m) { return r->n_vis ? r->n_vis[m] : r->pos[m] + 1; }
static inline int row_lo(int n_vis, int window) { return window > 0 && n_vis > window ? n_vis - window : 0; }

/* extra key e (< n_extra(m)) of row m: block e's compressed row */
static inline int row_nextra(const sink_args *a, int m, int n_vis) {
    return !a->x ? 0 : a->x->sel ? a->x->n_sel[m] : n_vis / a->x->ratio;
}
static inline const float *extra_row(const sink_args *a, int m, int e) {
    const int b = a->x->sel ? a->x->sel[(size_t)m * a->x->sel_stride + e] : e;
    return kv_row(a->r, a->s, m, b * a->x->ratio + a->x->ratio - 1, a->kc) + a->x->off;
}

/* ========================================================================
 * DECODE — the one per-(row, head) instruction sequence
 * ======================================================================== */
typedef struct {
    float run_m, run_l;
    float *o;
} sink_run;

/* one chunk of n keys (k[j] = v[j]: their rows) folded into the run */
static void fold_chunk(const ds_attn_shape *s, const float *qh, const float *const *k, const float *const *v, int n,
                       sink_run *st) {
    const int hd = s->head_dim;
    float acc[DS_ATTN_SINKS_MAX_HD], sc[DS_ATTN_CHUNK];
    float mc = -INFINITY;
    for (int j = 0; j < n; j++) {
        sc[j] = ds_dot16(qh, k[j], hd) * s->scale;
        if (sc[j] > mc) mc = sc[j];
    }
    float lc = 0.0f;
    for (int i = 0; i < hd; i++) acc[i] = 0.0f;
    for (int j = 0; j < n; j++) {
        const float p = ds_expf(sc[j] - mc);
        lc = lc + p;
        for (int i = 0; i < hd; i++) acc[i] = acc[i] + p * v[j][i];
    }
    float *o = st->o;
    if (st->run_m == -INFINITY) {
        st->run_m = mc;
        st->run_l = lc;
        for (int i = 0; i < hd; i++) o[i] = acc[i];
    } else {
        const float mn = mc > st->run_m ? mc : st->run_m;
        const float fa = ds_expf(st->run_m - mn), fb = ds_expf(mc - mn);
        st->run_l = st->run_l * fa + lc * fb;
        for (int i = 0; i < hd; i++) o[i] = o[i] * fa + acc[i] * fb;
        st->run_m = mn;
    }
}

static void attend_row(const sink_args *a, int m, int h) {
    const ds_attn_shape *s = a->s;
    const int hd = s->head_dim, kvh = h / (s->n_head / s->n_kv_head);
    const float *qh = a->q + ((size_t)m * s->n_head + (size_t)h) * (size_t)hd;
    float *o = a->out + ((size_t)m * s->n_head + (size_t)h) * (size_t)hd;
    const int n_vis = row_nvis(a->r, m), lo = row_lo(n_vis, a->window);
    const float *kp[DS_ATTN_CHUNK], *vp[DS_ATTN_CHUNK];
    sink_run st = {-INFINITY, 0.0f, o};
    for (int i = 0; i < hd; i++) o[i] = 0.0f;
    for (int c0 = lo - lo % DS_ATTN_CHUNK; c0 < n_vis; c0 += DS_ATTN_CHUNK) {
        const int j0 = c0 > lo ? c0 : lo, j1 = c0 + DS_ATTN_CHUNK < n_vis ? c0 + DS_ATTN_CHUNK : n_vis;
        for (int j = j0; j < j1; j++) {
            kp[j - j0] = kv_row(a->r, s, m, j, a->kc) + (size_t)kvh * hd;
            vp[j - j0] = kv_row(a->r, s, m, j, a->vc) + (size_t)kvh * hd;
        }
        fold_chunk(s, qh, kp, vp, j1 - j0, &st);
    }
    /* the compressed keys (K = V), in block order, chunks of DS_ATTN_CHUNK
     * blocks after the window's */
    const int nx = row_nextra(a, m, n_vis);
    for (int e0 = 0; e0 < nx; e0 += DS_ATTN_CHUNK) {
        const int e1 = e0 + DS_ATTN_CHUNK < nx ? e0 + DS_ATTN_CHUNK : nx;
        for (int e = e0; e < e1; e++) kp[e - e0] = vp[e - e0] = extra_row(a, m, e);
        fold_chunk(s, qh, kp, vp, e1 - e0, &st);
    }
    /* the sink: one more logit in the denominator, no value */
    const float sk = a->sinks ? a->sinks[h] : -INFINITY;
    const float mn = sk > st.run_m ? sk : st.run_m;
    const float fa = ds_expf(st.run_m - mn);
    const float run_l = st.run_l * fa + ds_expf(sk - mn);
    for (int i = 0; i < hd; i++) o[i] = (o[i] * fa) / run_l;
}

/* ========================================================================
 * CANONICAL — (row, head) pairs over threads, each through attend_row()
 * ======================================================================== */
static void sinks_canon_range(void *arg, int64_t i0, int64_t i1) {
    const sink_args *a = arg;
    for (int64_t i = i0; i < i1; i++) attend_row(a, (int)(i / a->s->n_head), (int)(i % a->s->n_head));
}

/* ========================================================================
 * FAST — one online softmax over the window, from the sink
 * ======================================================================== */
static inline float dot4(const float *a, const float *b, int n) {
    float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n; i++) s4[i & 3] = fmaf(a[i], b[i], s4[i & 3]);
    return (s4[0] + s4[1]) + (s4[2] + s4[3]);
}

/* one key of the one-pass softmax */
static inline void fast_step(const float *qh, const float *k, const float *v, int hd, float scale, float *run_m,
                             float *run_l, float *o) {
    const float sj = dot4(qh, k, hd) * scale;
    if (sj > *run_m) {
        const float f = ds_exp_fast(*run_m - sj);
        *run_l = fmaf(*run_l, f, 1.0f);
        for (int i = 0; i < hd; i++) o[i] = fmaf(o[i], f, v[i]);
        *run_m = sj;
    } else {
        const float p = ds_exp_fast(sj - *run_m);
        *run_l = *run_l + p;
        for (int i = 0; i < hd; i++) o[i] = fmaf(p, v[i], o[i]);
    }
}

static void sinks_fast_range(void *arg, int64_t i0, int64_t i1) {
    const sink_args *a = arg;
    const ds_attn_shape *s = a->s;
    const int hd = s->head_dim;
    for (int64_t it = i0; it < i1; it++) {
        const int m = (int)(it / s->n_head), h = (int)(it % s->n_head), kvh = h / (s->n_head / s->n_kv_head);
        const float *qh = a->q + ((size_t)m * s->n_head + (size_t)h) * (size_t)hd;
        float *o = a->out + ((size_t)m * s->n_head + (size_t)h) * (size_t)hd;
        const int n_vis = row_nvis(a->r, m), lo = row_lo(n_vis, a->window);
        float run_m = a->sinks ? a->sinks[h] : -INFINITY, run_l = a->sinks ? 1.0f : 0.0f;
        for (int i = 0; i < hd; i++) o[i] = 0.0f;
        for (int j = lo; j < n_vis; j++)
            fast_step(qh, kv_row(a->r, s, m, j, a->kc) + (size_t)kvh * hd, kv_row(a->r, s, m, j, a->vc) + (size_t)kvh * hd,
                      hd, s->scale, &run_m, &run_l, o);
        const int nx = row_nextra(a, m, n_vis);
        for (int e = 0; e < nx; e++) {
            const float *kx = extra_row(a, m, e);
            fast_step(qh, kx, kx, hd, s->scale, &run_m, &run_l, o);
        }
        const float r = 1.0f / run_l;
        for (int i = 0; i < hd; i++) o[i] = o[i] * r;
    }
}

/* ========================================================================
 * entry
 * ======================================================================== */
int ds_attn_sinks(ds_variant v, const ds_attn_shape *s, int M, const ds_attn_rows *r, int window,
                  const ds_attn_extra *x, const float *sinks, const float *q, const float *kcache, const float *vcache, float *out, ds_pool *pool) {
    if (M < 0 || s->head_dim < 1 || s->head_dim > DS_ATTN_SINKS_MAX_HD || s->n_kv_head < 1 ||
        s->n_head % s->n_kv_head || window < 0 || (x && (x->ratio < 1 || x->off < 0)))
        return -1;
    sink_args a = {s, r, window, x, sinks, q, kcache, vcache, out};
    const int64_t n = (int64_t)M * s->n_head;
    ds_pool_for(pool, n, 1, v == DS_FAST ? sinks_fast_range : sinks_canon_range, &a);
    return 0;
}
