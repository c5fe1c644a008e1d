/* layer_ds4.c — one DeepSeek V4 layer (llama.cpp's deepseek4 graph) over M
 * rows, on the backend table, for the raw attention layers and the
 * compressed ones (compress ratio 128 HCA, 4 CSA with the lightning indexer:
 * comp_write below, docs/DS4-COMPRESSED.md):
 *
 *   streams x[hc][d] ─ hc_pre(attn) ─ attn_norm ─┬ wq_a ─ q_a_norm ─ wq_b ─ head norm ─ RoPE
 *                                                └ wkv ─ kv_norm ─ RoPE ─ KV write (K = V)
 *     attn_sinks (window, sinks) ─ inverse RoPE ─ wo_a per output group ─ wo_b
 *   x = hc_post(out, x)                           (the seed's "HC tail")
 *   hc_pre(ffn) ─ ffn_norm ─ MoE (sqrtsoftplus route + bias, experts, shared)
 *   x = hc_post(out, x)
 *
 * RoPE touches the last n_rot dims of each head (llama.cpp's
 * rope_set_offset(n_embd_head - n_rot)), in GPT-J pairs (ggml NORM); the
 * attention output is rotated back by the same angles negated. Every step
 * is a family call whose variant comes from var[], so decode (canonical, M =
 * 1) and a canonical batch run the same per-row instruction sequences. */
#include "layer.h"
#include "dspark_diag.h"

#include <math.h>
#include <string.h>

#define FAM(f) (1u << (f))
#define MMF(w) FAM(ds_matmul_family((w)->type))

static int wants(const ds_probe *pr, int layer, int cp) {
    return pr && pr->fn && (!pr->wants || pr->wants(pr->user, layer, cp));
}

static void mm(ds_exec *ex, const uint8_t var[DS_FAM_COUNT], const ds_weight *w, int M, const float *x, float *y) {
    ex->be->i->matmul(ex, (ds_variant)var[ds_matmul_family(w->type)], w, M, x, y);
}

/* A compressed layer's block is at most this many positions (HCA). */
#define DS4_COMP_MAX_RATIO 128

typedef struct {
    float *flat, *mix, *post, *comb, *qr, *gin, *gout, *oa, *rot;
    int *npos;
    /* widened KV rows (s->kv_row > head_dim) only: the compressor state
     * skv / ssc [M][2 hd], the rows written [M][kv_row] (K region, V region),
     * the compressed rows [M][hd] with their block starts and row indices,
     * the pooling's entry pointers [M][DS4_COMP_MAX_RATIO] (kv, score); the
     * indexer's state iskv / issc [M][2 ihd], compressed keys icomp
     * [M][ihd], queries iq [M][n_ih][ihd] (irot: their RoPE staging), head
     * weights iw [M][n_ih], the top-k's scores isc and selection sel
     * [M][top_k], its counts nsel and the visible block counts nblk [M] */
    float *skv, *ssc, *krow, *vrow, *comp, *iskv, *issc, *icomp, *iq, *iw, *irot, *isc;
    int *cpos, *cidx, *sel, *nsel, *nblk;
    const float **kvp, **scp;
} ds4_scratch;

/* floats per row of that widened-row scratch */
static size_t comp_row_floats(const ds_layer_shape *s) {
    const size_t hd = (size_t)s->head_dim, ihd = (size_t)s->idx_dim, nih = (size_t)s->idx_heads;
    return 4 * DS4_COMP_MAX_RATIO + 5 * hd + 2 * (size_t)s->kv_row + 2 + 5 * ihd + nih * ihd + nih +
           nih * (size_t)s->n_rot + 2 * (size_t)s->idx_top_k + 3;
}

static size_t mix_n(const ds_layer_shape *s) { return (size_t)(2 + s->hc) * (size_t)s->hc; }

static ds4_scratch scratch_of(float *base, int m, const ds_layer_shape *s) {
    const size_t M = (size_t)m, hcd = (size_t)s->hc * s->d, gd = (size_t)s->n_head * s->head_dim / (size_t)s->o_groups;
    ds4_scratch r;
    r.flat = base;
    r.mix = r.flat + M * hcd;
    r.post = r.mix + M * mix_n(s);
    r.comb = r.post + M * (size_t)s->hc;
    r.qr = r.comb + M * (size_t)s->hc * s->hc;
    r.gin = r.qr + M * (size_t)s->q_lora;
    r.gout = r.gin + M * gd;
    r.oa = r.gout + M * (size_t)s->o_lora;
    r.rot = r.oa + M * (size_t)s->o_groups * s->o_lora;
    r.npos = (int *)(r.rot + M * (size_t)s->n_head * (size_t)s->n_rot);
    r.skv = r.ssc = r.krow = r.vrow = r.comp = r.iskv = r.issc = r.icomp = r.iq = r.iw = r.irot = r.isc = NULL;
    r.cpos = r.cidx = r.sel = r.nsel = r.nblk = NULL;
    r.kvp = r.scp = NULL;
    if (s->kv_row > s->head_dim) {
        const size_t hd = (size_t)s->head_dim, W = (size_t)s->kv_row;
        float *c = (float *)(r.npos + M);
        c += (size_t)(c - base) % 2;          /* the pointers below: 8-byte aligned */
        r.kvp = (const float **)(void *)c;
        r.scp = r.kvp + M * DS4_COMP_MAX_RATIO;
        r.skv = (float *)(void *)(r.scp + M * DS4_COMP_MAX_RATIO);
        r.ssc = r.skv + M * 2 * hd;
        r.krow = r.ssc + M * 2 * hd;
        r.vrow = r.krow + M * W;
        r.comp = r.vrow + M * W;
        r.cpos = (int *)(r.comp + M * hd);
        r.cidx = r.cpos + M;
        const size_t ihd = (size_t)s->idx_dim, nih = (size_t)s->idx_heads, tk = (size_t)s->idx_top_k;
        r.iskv = (float *)(r.cidx + M);
        r.issc = r.iskv + M * 2 * ihd;
        r.icomp = r.issc + M * 2 * ihd;
        r.iq = r.icomp + M * ihd;
        r.iw = r.iq + M * nih * ihd;
        r.irot = r.iw + M * nih;
        r.isc = r.irot + M * nih * (size_t)s->n_rot;
        r.sel = (int *)(r.isc + M * tk);
        r.nsel = r.sel + M * tk;
        r.nblk = r.nsel + M;
    }
    return r;
}

size_t ds_ds4_scratch_floats(int m_max, const ds_layer_shape *s) {
    const size_t M = (size_t)m_max, hcd = (size_t)s->hc * s->d, gd = (size_t)s->n_head * s->head_dim / (size_t)s->o_groups;
    return M * (hcd + mix_n(s) + (size_t)s->hc + (size_t)s->hc * s->hc + (size_t)s->q_lora + gd + (size_t)s->o_lora +
                (size_t)s->o_groups * s->o_lora + (size_t)s->n_head * s->n_rot + 1) +
           (s->kv_row > s->head_dim ? 1 + M * comp_row_floats(s) : 0);
}

/* The flattened streams normed (no weight), the mix logits by fn, then the
 * hc_pre family: y [M][d], post and comb (the head: y only). */
static void hc_mix(ds_exec *ex, const uint8_t var[DS_FAM_COUNT], const ds_layer_shape *s, int M, const ds_weight *fn,
                   const float *base, const float *scale, const float *x, float *y, const ds4_scratch *t) {
    const ds_backend_i *b = ex->be->i;
    const int hcd = s->hc * s->d;
    b->rmsnorm(ex, (ds_variant)var[DS_FAM_RMSNORM], M, hcd, x, NULL, s->eps, t->flat);
    mm(ex, var, fn, M, t->flat, t->mix);
    b->hc_pre(ex, (ds_variant)var[DS_FAM_HC_PRE], M, s->hc, s->d, (int)fn->n_out, x, t->mix, scale, base, s->hc_eps,
              s->hc_iters, y, t->post, t->comb);
}

/* RoPE on the last n_rot dims of each of `heads` heads of hw floats
 * (positions pos): gathered into rot, rotated as heads of n_rot, put back. */
static void rope_tail(ds_exec *ex, ds_variant v, const ds_layer_shape *s, int M, int heads, int hw, const int *pos,
                      float base, const ds_rope_yarn *yarn, float *x, float *rot) {
    const int nope = hw - s->n_rot;
    const size_t hb = (size_t)hw * sizeof(float), rb = (size_t)s->n_rot * sizeof(float);
    ds_backend_copy2d(ex, rot, rb, x + nope, hb, rb, (size_t)M * heads);
    if (yarn) ex->be->i->rope_ext(ex, v, M, heads, s->n_rot, pos, base, s->rope_mode, yarn, rot);
    else ex->be->i->rope(ex, v, M, heads, s->n_rot, pos, base, s->rope_mode, rot);
    ds_backend_copy2d(ex, x + nope, hb, rot, rb, rb, (size_t)M * heads);
}

/* Row `pos` of sequence seq in a layer's region (host memory). */
static float *row_at(const ds_rows *rw, float *base, int m, int pos, int W) {
    return base + ds_rows_at(rw, rw->tables, rw->seq ? rw->seq[m] : 0, pos, W);
}

/* The nb compressions of one compressor over the completing rows t->cidx
 * (block starts t->cpos): entries from the state rows in `reg` (the K or V
 * region), value at kv_off and score at sc_off floats into a row, each
 * w = c*hw wide; HCA (c = 1): the block's r rows; CSA (c = 2): the previous
 * block's four first halves (none for block 0: virtual entries), then this
 * block's four second halves. Then the norm, RoPE at the block start with
 * the compress base, and the result stored at out_off of the completing
 * row's K row. */
static void compress_blocks(ds_exec *ex, const uint8_t var[DS_FAM_COUNT], const ds_layer_shape *s, const ds_acts *a,
                            int nb, int r, int hw, float *reg, int kv_off, int sc_off, const float *norm, float *kc,
                            int out_off, float *out, const ds4_scratch *t) {
    const ds_backend_i *b = ex->be->i;
    const int W = s->kv_row, n = r == 4 ? 8 : r;
    const ds_rows *rw = a->rows;
    for (int c = 0; c < nb; c++) {
        const int m = t->cidx[c], s0 = t->cpos[c];
        const float **kvp = t->kvp + (size_t)c * n, **scp = t->scp + (size_t)c * n;
        if (r == 4) {
            for (int j = 0; j < 4; j++) {
                const float *pr = s0 >= 4 ? row_at(rw, reg, m, s0 - 4 + j, W) : NULL;
                const float *cu = row_at(rw, reg, m, s0 + j, W);
                kvp[j] = pr ? pr + kv_off : NULL;
                scp[j] = pr ? pr + sc_off : NULL;
                kvp[4 + j] = cu + kv_off + hw;
                scp[4 + j] = cu + sc_off + hw;
            }
        } else {
            for (int j = 0; j < r; j++) {
                const float *row = row_at(rw, reg, m, s0 + j, W);
                kvp[j] = row + kv_off;
                scp[j] = row + sc_off;
            }
        }
    }
    b->ds4_compress(ex, (ds_variant)var[DS_FAM_DS4_COMPRESS], nb, n, hw, t->kvp, t->scp, out);
    b->rmsnorm(ex, (ds_variant)var[DS_FAM_RMSNORM], nb, hw, out, norm, s->eps, out);
    rope_tail(ex, (ds_variant)var[DS_FAM_ROPE], s, nb, 1, hw, t->cpos, s->comp_rope_base, s->comp_yarn, out, t->rot);
    for (int c = 0; c < nb; c++)
        memcpy(row_at(rw, kc, t->cidx[c], rw->pos[t->cidx[c]], W) + out_off, out + (size_t)c * hw,
               (size_t)hw * sizeof(float));
}

/* The widened KV rows of a model with compressed layers (host memory: the
 * loader refuses deepseek4 elsewhere). Every row: K region [K | 0 ...]
 * (CSA: [K | 0 | iskv | issc | 0]), V region [K | 0] (a raw layer) or
 * [skv | ssc] (a compressed one, c hd each). Then each row that completes a
 * block (position p, (p + 1) % r == 0) pools the block's state rows, read
 * back through the page table (earlier rows of this call are already
 * written, as in decode), and stores the compressed row after K in
 * position p's K row (CSA: the indexer's compressed key too). */
static void comp_write(ds_exec *ex, const ds_layer *L, const ds_layer_shape *s, const uint8_t var[DS_FAM_COUNT], int M,
                       ds_acts *a, float *kc, float *vc, const ds4_scratch *t) {
    const ds_backend_i *b = ex->be->i;
    const int hd = s->head_dim, W = s->kv_row, r = L->comp_ratio, c = r == 4 ? 2 : 1, ihd = s->idx_dim;
    const size_t wb = (size_t)W * sizeof(float), hb = (size_t)hd * sizeof(float);
    const ds_rows *rw = a->rows;
    for (int m = 0; m < M; m++) {
        float *kr = t->krow + (size_t)m * W, *vr = t->vrow + (size_t)m * W;
        memset(kr, 0, wb);
        memcpy(kr, a->k + (size_t)m * hd, hb);
        if (r == 4) {
            memcpy(kr + 2 * hd, t->iskv + (size_t)m * 2 * ihd, 2 * (size_t)ihd * sizeof(float));
            memcpy(kr + 2 * hd + 2 * ihd, t->issc + (size_t)m * 2 * ihd, 2 * (size_t)ihd * sizeof(float));
        }
        if (r) {
            memset(vr, 0, wb);
            memcpy(vr, t->skv + (size_t)m * c * hd, (size_t)c * hb);
            memcpy(vr + c * hd, t->ssc + (size_t)m * c * hd, (size_t)c * hb);
        } else {
            memcpy(vr, kr, wb);
        }
    }
    b->kv_write(ex, kc, vc, W, M, rw, t->krow, t->vrow);
    if (!r) return;
    int nb = 0;
    for (int m = 0; m < M; m++) {
        const int p = rw->pos[m];
        if ((p + 1) % r) continue;
        t->cpos[nb] = p + 1 - r;
        t->cidx[nb] = m;
        nb++;
    }
    if (!nb) return;
    compress_blocks(ex, var, s, a, nb, r, hd, vc, 0, c * hd, L->comp_norm, kc, hd, t->comp, t);
    if (r == 4)
        compress_blocks(ex, var, s, a, nb, 4, ihd, kc, 2 * hd, 2 * hd + 2 * ihd, L->idx_norm, kc, 2 * hd + 4 * ihd,
                        t->icomp, t);
}

/* The indexer's key of block b for row m: its compressed key, stored in
 * the K row of the block's last position. */
typedef struct {
    const ds_rows *rw;
    float *kc;
    int W, off;
} idx_keys;
static const float *idx_key(const void *u, int m, int blk) {
    const idx_keys *k = u;
    return row_at(k->rw, k->kc, m, blk * 4 + 3, k->W) + k->off;
}

void ds_layer_ds4_forward(ds_exec *ex, const ds_layer *L, const ds_layer_shape *s, const uint8_t var[DS_FAM_COUNT],
                          int M, int pos0, float *kc, float *vc, ds_acts *a, const ds_probe *pr, int l) {
    const ds_backend_i *b = ex->be->i;
    const int d = s->d, hd = s->head_dim, H = s->n_head, hc = s->hc, G = s->o_groups, ol = s->o_lora;
    const size_t qd = (size_t)H * hd, hcd = (size_t)hc * d, gd = qd / (size_t)G;
    const ds_variant vnorm = (ds_variant)var[DS_FAM_RMSNORM], vrope = (ds_variant)var[DS_FAM_ROPE];
    const ds_variant vpost = (ds_variant)var[DS_FAM_HC_POST];
    const ds4_scratch t = scratch_of(a->rec, M, s);
    const int W = s->kv_row;
    const float base = L->comp_ratio ? s->comp_rope_base : s->rope_base;
    const ds_rope_yarn *yarn = L->comp_ratio ? s->comp_yarn : NULL;   /* raw layers: plain RoPE */
    const unsigned f_mix = FAM(DS_FAM_RMSNORM) | FAM(DS_FAM_HC_PRE) | (l > 0 ? FAM(DS_FAM_HC_POST) : 0);

    /* --- attention sub-block ------------------------------------------------ */
    hc_mix(ex, var, s, M, &L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, a->x, a->o, &t);
    b->rmsnorm(ex, vnorm, M, d, a->o, L->attn_norm, s->eps, a->xn);
    if (wants(pr, l, DSD_CP_ATTN_NORM)) {
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_NORM, DSD_SUB_HC_PRE, f_mix | MMF(&L->hc_attn_fn), a->o, d, d);
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_NORM, DSD_SUB_ALL, f_mix | MMF(&L->hc_attn_fn), a->xn, d, d);
    }
    mm(ex, var, &L->wq_a, M, a->xn, t.qr);
    mm(ex, var, &L->wkv, M, a->xn, a->k);
    if (L->comp_ratio) {   /* the compressor state of every row: a function of its own row */
        const int r = L->comp_ratio, cw = (r == 4 ? 2 : 1) * hd, iw = 2 * s->idx_dim;
        mm(ex, var, &L->comp_kv, M, a->xn, t.skv);
        mm(ex, var, &L->comp_gate, M, a->xn, t.ssc);
        if (r == 4) {
            mm(ex, var, &L->idx_kv, M, a->xn, t.iskv);
            mm(ex, var, &L->idx_gate, M, a->xn, t.issc);
        }
        for (int m = 0; m < M; m++) {
            float *sc = t.ssc + (size_t)m * cw;
            const float *ape = L->comp_ape + (size_t)(a->pos[m] % r) * cw;
            for (int i = 0; i < cw; i++) sc[i] = sc[i] + ape[i];
            if (r != 4) continue;
            sc = t.issc + (size_t)m * iw;
            ape = L->idx_ape + (size_t)(a->pos[m] % 4) * iw;
            for (int i = 0; i < iw; i++) sc[i] = sc[i] + ape[i];
        }
    }
    const int p_qkv = wants(pr, l, DSD_CP_QKV);
    if (p_qkv) {
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_QA, MMF(&L->wq_a), t.qr, (size_t)s->q_lora, (size_t)s->q_lora);
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_KV, MMF(&L->wkv), a->k, (size_t)hd, (size_t)hd);
    }
    b->rmsnorm(ex, vnorm, M, s->q_lora, t.qr, L->q_a_norm, s->eps, t.qr);
    mm(ex, var, &L->wq_b, M, t.qr, a->q);
    if (p_qkv) ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_QB, MMF(&L->wq_b), a->q, qd, qd);
    b->rmsnorm(ex, vnorm, M * H, hd, a->q, NULL, s->eps, a->q);
    b->rmsnorm(ex, vnorm, M, hd, a->k, L->kv_norm, s->eps, a->k);
    rope_tail(ex, vrope, s, M, H, hd, a->pos, base, yarn, a->q, t.rot);
    rope_tail(ex, vrope, s, M, 1, hd, a->pos, base, yarn, a->k, t.rot);
    if (p_qkv) {
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_Q_ROPE, FAM(DS_FAM_ROPE) | FAM(DS_FAM_RMSNORM), a->q, qd, qd);
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_K_ROPE, FAM(DS_FAM_ROPE) | FAM(DS_FAM_RMSNORM), a->k,
                      (size_t)hd, (size_t)hd);
    }
    /* the one KV row is K and V */
    if (W == hd) b->kv_write(ex, kc, vc, hd, M, a->rows, a->k, a->k);
    else comp_write(ex, L, s, var, M, a, kc, vc, &t);
    if (wants(pr, l, DSD_CP_KV_WRITE))
        for (int r = 0; r < M; r++) {
            const float *row = a->k + (size_t)r * hd;
            if (a->tables_host) row = kc + ds_rows_at(a->rows, a->tables_host, 0, pos0 + r, W);
            ds_probe_rows(ex, pr, 1, pos0 + r, l, DSD_CP_KV_WRITE, DSD_SUB_K_CACHE_ROW,
                          FAM(DS_FAM_ROPE) | FAM(DS_FAM_RMSNORM) | MMF(&L->wkv), row, (size_t)hd, (size_t)hd);
        }
    /* a compressed layer: its visible compressed rows join the window's
     * (K = V in the K region; the V region holds the compressor state) */
    const ds_attn_shape as = {H, 1, hd, W, 1.0f / sqrtf((float)hd)};
    ds_attn_extra ax = {.ratio = L->comp_ratio, .off = hd};
    if (L->comp_ratio == 4) {   /* CSA: the lightning indexer picks the blocks */
        const int nih = s->idx_heads, ihd = s->idx_dim;
        mm(ex, var, &L->idx_q_b, M, t.qr, t.iq);
        rope_tail(ex, vrope, s, M, nih, ihd, a->pos, s->comp_rope_base, s->comp_yarn, t.iq, t.irot);
        mm(ex, var, &L->idx_proj, M, a->xn, t.iw);
        const float isc = 1.0f / sqrtf((float)ihd * (float)nih);
        for (int i = 0; i < M * nih; i++) t.iw[i] = t.iw[i] * isc;
        for (int m = 0; m < M; m++) t.nblk[m] = (a->rows->n_vis ? a->rows->n_vis[m] : a->rows->pos[m] + 1) / 4;
        const idx_keys ik = {a->rows, kc, W, 2 * hd + 4 * ihd};
        b->ds4_indexer(ex, (ds_variant)var[DS_FAM_DS4_INDEXER], M, nih, ihd, t.iq, t.iw, t.nblk, idx_key, &ik,
                       s->idx_top_k, t.sel, t.nsel, t.isc);
        ax.sel = t.sel;
        ax.n_sel = t.nsel;
        ax.sel_stride = s->idx_top_k;
    }
    b->attn_sinks(ex, (ds_variant)var[DS_FAM_ATTN_SINKS], &as, M, a->rows, s->n_swa, L->comp_ratio ? &ax : NULL,
                  L->sinks, a->q, kc, L->comp_ratio ? kc : vc, a->att);
    if (wants(pr, l, DSD_CP_ATTN_HEADS))
        for (int r = 0; r < M; r++)
            for (int h = 0; h < H; h++)
                ds_probe_rows(ex, pr, 1, pos0 + r, l, DSD_CP_ATTN_HEADS, (int)DSD_SUB_HEAD(h), FAM(DS_FAM_ATTN_SINKS),
                              a->att + ((size_t)r * H + h) * hd, (size_t)hd, (size_t)hd);
    /* rotate the output back: the same angles at the negated positions
     * (host-memory backends: the loader refuses deepseek4 elsewhere) */
    for (int r = 0; r < M; r++) t.npos[r] = -a->pos[r];
    rope_tail(ex, vrope, s, M, H, hd, t.npos, base, yarn, a->att, t.rot);
    /* the output groups: heads [g H/G, (g+1) H/G) through wo_a[g], then wo_b */
    unsigned f_o = MMF(&L->wo_b);
    for (int g = 0; g < G; g++) {
        ds_backend_copy2d(ex, t.gin, gd * sizeof(float), a->att + (size_t)g * gd, qd * sizeof(float), gd * sizeof(float),
                          (size_t)M);
        mm(ex, var, &L->wo_a[g], M, t.gin, t.gout);
        ds_backend_copy2d(ex, t.oa + (size_t)g * ol, (size_t)G * ol * sizeof(float), t.gout, (size_t)ol * sizeof(float),
                          (size_t)ol * sizeof(float), (size_t)M);
        f_o |= MMF(&L->wo_a[g]);
    }
    mm(ex, var, &L->wo_b, M, t.oa, a->o);
    if (wants(pr, l, DSD_CP_ATTN_OUT_PROJ))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_OUT_PROJ, DSD_SUB_ALL, f_o | FAM(DS_FAM_ROPE), a->o, d, d);
    b->hc_post(ex, vpost, M, hc, d, a->o, a->x, t.post, t.comb, a->x);
    if (wants(pr, l, DSD_CP_ATTN_RESIDUAL))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_RESIDUAL, DSD_SUB_HC_ATTN, FAM(DS_FAM_HC_POST) | FAM(DS_FAM_HC_PRE),
                      a->x, hcd, hcd);

    /* --- MoE sub-block ------------------------------------------------------- */
    hc_mix(ex, var, s, M, &L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, a->x, a->o, &t);
    b->rmsnorm(ex, vnorm, M, d, a->o, L->ffn_norm, s->eps, a->xn);
    if (wants(pr, l, DSD_CP_FFN_NORM)) {
        const unsigned f = FAM(DS_FAM_RMSNORM) | FAM(DS_FAM_HC_PRE) | FAM(DS_FAM_HC_POST) | MMF(&L->hc_ffn_fn);
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_NORM, DSD_SUB_HC_PRE, f, a->o, d, d);
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_NORM, DSD_SUB_ALL, f, a->xn, d, d);
    }
    ds_layer_moe_ffn(ex, L, s, var, M, pos0, a, pr, l);
    b->hc_post(ex, vpost, M, hc, d, a->o, a->x, t.post, t.comb, a->x);
    if (wants(pr, l, DSD_CP_LAYER_OUT))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_LAYER_OUT, DSD_SUB_ALL, FAM(DS_FAM_HC_POST), a->x, hcd, hcd);
}

void ds_ds4_head(ds_exec *ex, const ds_weight *fn, const float *base, const float *scale, const float *out_norm,
                 const ds_layer_shape *s, const uint8_t var[DS_FAM_COUNT], int M, ds_acts *a) {
    const ds4_scratch t = scratch_of(a->rec, M, s);
    hc_mix(ex, var, s, M, fn, base, scale, a->x, a->o, &t);
    ex->be->i->rmsnorm(ex, (ds_variant)var[DS_FAM_RMSNORM], M, s->d, a->o, out_norm, s->eps, a->xn);
}
