/* drafter_forward.c — the DSpark drafter at run time (spec §1.2-§1.7, §2,
 * §3.1): context injection into the drafter's KV cache, the non-causal
 * γ-row block forward, the shared LM head, the Markov chain (vanilla /
 * gated / rnn), the confidence head and the optional correction head.
 *
 * Every kernel call is the canonical variant, so a row's bits depend only on
 * that row's inputs (never on how many rows share the call). Two things
 * follow and the tests check both bitwise: keeping n_keep < γ drafts gives
 * exactly the first n_keep outputs of the full block (the block always runs
 * all γ rows; only the LM head / chain stops early), and the layer-0
 * projections of the MASK rows, which are functions of constant weights,
 * can be computed once per context (ds_dctx_new) and reused every round.
 *
 * Per slot k (position p+k, predicting p+k+1), with h_k the post-output_norm
 * hidden and prev_0 = anchor, prev_{k+1} = the token chosen at slot k:
 *   plain:      z_k = W_lm h_k + B_k(prev_k [, h_k, rnn state])
 *   corrected:  h'_k = h_k + W_down(silu(W_gate in) * W_up in),
 *               in = [RMSNorm_hn(h_k); RMSNorm_en(E[prev_k])]  (eps 1e-6),
 *               z_k = W_lm h'_k + W2 W1[ids_k]  with ids = [anchor, MASK...]
 *               (PrismML graph-corrected order, "markov_deploy_exposure":
 *               the Markov term uses the slot's own input id, so slots >= 1
 *               share one constant MASK bias, cached).
 *   both:       z_k[MASK] = -1e6 (every other logit untouched), then
 *               token = argmax (greedy) or ds_sample(samp, z_k, V, p+k+1);
 *   confidence: c_k = sigmoid(w . [h_k; W1[prev_k]] + b)  (h_k uncorrected).
 * The LM head for the plain variant is one matmul over the kept rows; with a
 * correction head the head input depends on prev_k, so it runs per slot.
 *
 * Everything above runs through the backend table on device buffers: the
 * heads use the small ops (add, fill, gate, sample / argmax, embed) and the
 * chain's ids live on the device (x->toks), so a round uploads the anchor
 * (one int) and downloads the chosen ids and confidences (and logits only
 * when asked). On the CPU those ops are the former host loops, expression
 * for expression: not one output bit moved. */
#include "drafter_internal.h"

#include <stdlib.h>

#define CANON DS_CANONICAL
#define DS_MASK_LOGIT (-1e6f)
#define DS_CORR_EPS 1e-6f
#define DS_FEAT_MAX 65504.0f

/* A bias vector of the drafter's f32 arena, on the device (the arena's
 * device copy has the same layout; on the CPU it is the arena itself). */
static const float *arena_vec(const ds_drafter *d, const float *host) {
    return d->arena_dev + (host - d->arena);
}

/* ---- context -------------------------------------------------------------- */

/* The drafter's float buffers, all on the device (allocated by the
 * backend); the host never reads them except through download(). */
#define DCTX_NBUF 25
static void dctx_slots(ds_dctx *x, float **slot[DCTX_NBUF]) {
    float **s[DCTX_NBUF] = {&x->feat, &x->x, &x->xn, &x->o, &x->q, &x->att, &x->k, &x->v,
                            &x->gate, &x->up, &x->hff, &x->z, &x->bias, &x->samp_scratch,
                            &x->vec, &x->cw, &x->hc, &x->state, &x->mask_x, &x->mask_q,
                            &x->mask_k, &x->mask_v, &x->mask_bias, &x->conf, &x->scal};
    memcpy(slot, s, sizeof s);
}

void ds_dctx_free(ds_dctx *x) {
    if (!x) return;
    ds_backend *be = x->d->be;
    if (!x->own_ex)     /* a shared execution context outlives this one's recordings */
        for (int i = 0; i < x->n_gkeys; i++) be->i->graph_drop(x->ex, x->gkeys[i]);
    float **slot[DCTX_NBUF];
    dctx_slots(x, slot);
    for (int i = 0; i < DCTX_NBUF; i++)
        if (*slot[i]) be->i->release(be, *slot[i]);
    if (x->nvis) be->i->release(be, x->nvis);    /* x->pos and x->toks lie in the same buffer */
    if (x->mbuf) be->i->release(be, x->mbuf);
    free(x->mhost);
    if (x->tables) be->i->release(be, x->tables);
    if (!x->shared) {
        if (x->pool) ds_seq_release(&x->own_seq, x->pool);
        ds_kvpool_free(x->pool);
    }
    free(x->pos_host);
    if (x->own_ex) be->i->exec_free(x->ex);
    free(x);
}

/* Layer-0 projections of M rows whose inputs are embedding rows x0:
 * a = RMSNorm(x0), q/k/v (+ q/k norm), no RoPE. */
static void layer0_proj_rows(const ds_drafter *d, ds_exec *ex, int M, const float *x0, float *a, float *q, float *k,
                             float *v) {
    const ds_backend_i *b = ex->be->i;
    const ds_layer *L = &d->layers[0];
    b->rmsnorm(ex, CANON, M, d->d, x0, L->attn_norm, d->eps, a);
    if (b->matmul_multi && L->wq.type == L->wk.type && L->wq.type == L->wv.type) {  /* one launch, same bits */
        const ds_weight *const w3[3] = {&L->wq, &L->wk, &L->wv};
        float *const y3[3] = {q, k, v};
        b->matmul_multi(ex, CANON, 3, w3, M, a, y3);
    } else {
        b->matmul(ex, CANON, &L->wq, M, a, q);
        b->matmul(ex, CANON, &L->wk, M, a, k);
        b->matmul(ex, CANON, &L->wv, M, a, v);
    }
    if (L->q_norm) {
        b->rmsnorm(ex, CANON, M * d->n_head, d->head_dim, q, L->q_norm, d->eps, q);
        b->rmsnorm(ex, CANON, M * d->n_head_kv, d->head_dim, k, L->k_norm, d->eps, k);
    }
}

/* Pages for positions [p0, p1), and the device copy of the page table
 * brought up to date before the work that reads it. */
static int dctx_prepare(ds_dctx *x, int p0, int p1, char *err, size_t errlen) {
    ds_seq *s = x->seq;
    if (!s) { ds_errf(err, errlen, "drafter context: no sequence bound"); return -1; }
    if (ds_seq_prepare(s, x->pool, x->ex, p0, p1, err, errlen)) return -1;
    if (s->dirty_hi > s->dirty_lo) {
        x->ex->be->i->upload(x->ex, x->tables + s->dirty_lo, s->table + s->dirty_lo,
                             (size_t)(s->dirty_hi - s->dirty_lo) * sizeof(int32_t));
        /* a shared sequence's changed entries stay marked: the engine's own
         * device table needs them too before its next forward */
        if (!x->shared) s->dirty_lo = s->dirty_hi = 0;
    }
    return 0;
}

/* pool NULL: a pool and a sequence of its own (ds_dctx_new); else the
 * rows live in group `group` of pool and ds_dctx_bind names the sequence. */
static ds_dctx *dctx_new(const ds_drafter *d, int n_ctx, ds_exec *ex, ds_kvpool *pool, int group, int n_seq,
                         char *err, size_t errlen) {
    if (!d) { ds_errf(err, errlen, "drafter context: no drafter given"); return NULL; }
    if (ex && ex->be != d->be) {
        ds_errf(err, errlen, "drafter context: the execution context is not on the drafter's device");
        return NULL;
    }
    if (!ds_backend_has_heads(d->be)) {
        ds_errf(err, errlen, "drafter context: the drafter's heads are not implemented on device '%s' yet",
                d->be->i->name);
        return NULL;
    }
    if (n_ctx < 1 || n_ctx > (1 << 24)) {
        ds_errf(err, errlen, "drafter context: n_ctx %d is out of range [1, %d]", n_ctx, 1 << 24);
        return NULL;
    }
    ds_dctx *x = calloc(1, sizeof *x);
    if (!x) { ds_errf(err, errlen, "drafter context: out of memory"); return NULL; }
    ds_backend *be = d->be;
    x->d = d;
    x->ex = ex;
    if (!ex) {   /* none given: a single-threaded one of its own */
        char e3[DS_ERRLEN];
        x->ex = ex = be->i->exec_new(be, 1, e3, sizeof e3);
        if (!ex) { ds_errf(err, errlen, "drafter context: %s", e3); free(x); return NULL; }
        x->own_ex = 1;
    }
    x->n_ctx = n_ctx;
    x->cap = n_ctx + d->gamma;
    /* a shared context drafts up to n_many sequences per pass: its scratch
     * holds their blocks' rows (and their logits: n_many * gamma * V) */
    x->n_many = !pool ? 1 : n_seq < 1 ? 1 : n_seq > DS_DRAFT_MANY_MAX ? DS_DRAFT_MANY_MAX : n_seq;
    x->rows = d->gamma > DS_DRAFT_CHUNK ? d->gamma : DS_DRAFT_CHUNK;
    if (x->n_many * d->gamma > x->rows) x->rows = x->n_many * d->gamma;
    const size_t R = (size_t)x->rows, D = (size_t)d->d, hd = (size_t)d->head_dim;
    const size_t qd = (size_t)d->n_head * hd, kvd = (size_t)d->n_head_kv * hd, V = (size_t)d->V;
    const size_t r = (size_t)d->rank, G = (size_t)d->gamma, w = (size_t)(d->has_corr ? d->corr_w : 0);
    const size_t NM = (size_t)x->n_many;
    const size_t GM = (G > 1 ? G - 1 : 1) * NM;   /* MASK rows: G - 1 copies per sequence of a pass */
    char e2[DS_ERRLEN];
    if (pool) {   /* the engine's: its group must hold this drafter's rows */
        const ds_kvpool_shape *sh = ds_kvpool_shape_of(pool);
        if (group < 0 || group >= sh->n_groups || sh->n_layer[group] != d->n_layer || sh->row[group] != (int)kvd) {
            ds_errf(err, errlen, "drafter context: group %d of the pool does not fit this drafter (%d layers of %zu floats)",
                    group, d->n_layer, kvd);
            ds_dctx_free(x);
            return NULL;
        }
        x->pool = pool;
        x->group = group;
        x->shared = 1;
    } else {
        const ds_kvpool_shape ps = {.n_groups = 1, .n_layer = {d->n_layer}, .row = {(int)kvd},
                                    .n_pages = (x->cap + DS_KV_PAGE - 1) / DS_KV_PAGE};
        x->pool = ds_kvpool_new(be, &ps, e2, sizeof e2);
        if (!x->pool || ds_seq_init(&x->own_seq, x->cap, e2, sizeof e2)) {
            ds_errf(err, errlen, "drafter context: %s", x->pool ? "out of memory" : e2);
            ds_dctx_free(x);
            return NULL;
        }
        x->seq = &x->own_seq;
    }
    const int max_pages = (x->cap + DS_KV_PAGE - 1) / DS_KV_PAGE;
    if (!(x->tables = be->i->alloc(be, (size_t)max_pages * sizeof(int32_t)))) {
        ds_errf(err, errlen, "drafter context: out of memory");
        ds_dctx_free(x);
        return NULL;
    }
    const size_t n[DCTX_NBUF] = {
        R * (size_t)d->n_taps * D, R * D, R * D, R * D,        /* feat x xn o        */
        R * qd, R * qd, R * kvd, R * kvd,                      /* q att k v          */
        R * (size_t)d->n_ff, R * (size_t)d->n_ff, R * (size_t)d->n_ff,       /* gate up hff        */
        NM * G * V, V, 2 * V,                                  /* z bias samp        */
        7 * r + 4 * D + 16, 3 * w + 1, D, r + 1,               /* vec cw hc state    */
        GM * D, GM * qd, GM * kvd, GM * kvd, V,                /* mask x q k v bias  */
        G, 2};                                                 /* conf scal          */
    float **slot[DCTX_NBUF];
    dctx_slots(x, slot);
    int ok = 1;
    for (int i = 0; i < DCTX_NBUF; i++) ok &= (*slot[i] = be->i->alloc(be, n[i] * sizeof(float))) != NULL;
    x->nvis = be->i->alloc(be, (G + R + G + 2) * sizeof(int32_t));
    x->pos = x->nvis ? x->nvis + G : NULL;
    x->toks = x->pos ? (int32_t *)x->pos + R : NULL;
    x->crows = (ds_rows){.pos = x->pos, .tables = x->tables, .max_pages = max_pages, .page = DS_KV_PAGE,
                        .page_stride = ds_kvpool_page_stride(x->pool)};
    x->brows = x->crows;
    x->brows.n_vis = x->nvis;
    x->pos_host = malloc((G + R + 1) * sizeof(int32_t));
    if (x->shared) {
        const size_t nb = 3 * NM * G + (G + 1) * NM;
        x->mbuf = be->i->alloc(be, nb * sizeof(int32_t));
        x->mhost = malloc(nb * sizeof(int32_t));
        ok &= x->mbuf && x->mhost;
    }
    if (!ok || !x->pos || !x->toks || !x->pos_host) {
        ds_errf(err, errlen, "drafter context: out of memory for n_ctx=%d", n_ctx);
        ds_dctx_free(x);
        return NULL;
    }
    /* constants on the device: the MASK id and the confidence bias */
    be->i->upload(ex, x->toks + G + 1, &d->mask_id, sizeof(int32_t));
    be->i->upload(ex, x->scal + 1, &d->conf_b, sizeof(float));
    /* the families' scratch on the (possibly shared) execution context:
     * weights' n_in are the fc's n_taps*d, d, qd and ff; attention spans
     * the context rows plus the block */
    size_t k_max = (size_t)d->n_taps * D;
    if (D > k_max) k_max = D;
    if (qd > k_max) k_max = qd;
    if ((size_t)d->n_ff > k_max) k_max = (size_t)d->n_ff;
    if (be->i->reserve && be->i->reserve(ex, x->rows, (int64_t)k_max, d->head_dim, x->cap, e2, sizeof e2)) {
        ds_errf(err, errlen, "drafter context: %s", e2);
        ds_dctx_free(x);
        return NULL;
    }
    /* MASK-row reuse cache (constant per drafter) */
    be->i->embed(ex, d->embd, 1, x->toks + G + 1, x->mask_x);
    layer0_proj_rows(d, ex, 1, x->mask_x, x->o, x->mask_q, x->mask_k, x->mask_v);
    /* ... repeated for the block's G - 1 MASK rows (of every sequence of a
     * batched pass), so that a round restores them with one copy per
     * buffer instead of one per row */
    for (size_t i = 1; i < GM; i++) {
        be->i->copy(ex, x->mask_x + i * D, x->mask_x, D * sizeof(float));
        be->i->copy(ex, x->mask_q + i * qd, x->mask_q, qd * sizeof(float));
        be->i->copy(ex, x->mask_k + i * kvd, x->mask_k, kvd * sizeof(float));
        be->i->copy(ex, x->mask_v + i * kvd, x->mask_v, kvd * sizeof(float));
    }
    if (d->has_corr && r > 0) {
        be->i->embed(ex, &d->w1, 1, x->toks + G + 1, x->vec);
        be->i->matmul(ex, CANON, &d->w2, 1, x->vec, x->mask_bias);
    }
    /* the one sequence's page table, whole, uploaded once (memory is
     * committed only where rows are written); a shared context's come with
     * each bind */
    if ((!x->shared && dctx_prepare(x, 0, x->cap, e2, sizeof e2)) || be->i->sync(ex, e2, sizeof e2)) {
        ds_errf(err, errlen, "drafter context: %s", e2);
        ds_dctx_free(x);
        return NULL;
    }
    return x;
}

ds_dctx *ds_dctx_new(const ds_drafter *d, int n_ctx, ds_exec *ex, char *err, size_t errlen) {
    return dctx_new(d, n_ctx, ex, NULL, 0, 1, err, errlen);
}

ds_dctx *ds_dctx_new_shared(const ds_drafter *d, int n_ctx, ds_exec *ex, ds_kvpool *pool, int group, int n_seq,
                            char *err, size_t errlen) {
    if (!pool || !ex) { ds_errf(err, errlen, "drafter context: a shared context needs the pool and its execution context"); return NULL; }
    return dctx_new(d, n_ctx, ex, pool, group, n_seq, err, errlen);
}

int ds_dctx_bind(ds_dctx *x, ds_seq *s, char *err, size_t errlen) {
    if (!x->shared) { ds_errf(err, errlen, "drafter context: only a shared context is bound"); return -1; }
    if (!s || !s->table || s->max_pages * DS_KV_PAGE < x->cap) {
        ds_errf(err, errlen, "drafter context: the sequence holds %d positions, the drafter needs %d",
                s && s->table ? s->max_pages * DS_KV_PAGE : 0, x->cap);
        return -1;
    }
    x->seq = s;
    x->len = s->n_dctx;
    /* the whole table: the recorded launch sequences read this context's
     * own device copy, so the address never changes between sequences */
    x->ex->be->i->upload(x->ex, x->tables, s->table, (size_t)((x->cap + DS_KV_PAGE - 1) / DS_KV_PAGE) * sizeof(int32_t));
    return 0;
}

/* graph_begin for a key this context owns: tracked so that ds_dctx_free can
 * drop it. A key that cannot be tracked is not recorded (0: run directly). */
static int dctx_graph_begin(ds_dctx *x, uint64_t key, char *err, size_t errlen) {
    const ds_backend_i *b = x->ex->be->i;
    int known = 0;
    for (int i = 0; i < x->n_gkeys && !known; i++) known = x->gkeys[i] == key;
    if (!known) {
        if (x->n_gkeys == DS_DCTX_MAX_GRAPHS || !b->graph_drop) return 0;
        x->gkeys[x->n_gkeys++] = key;
    }
    return b->graph_begin(x->ex, key, err, errlen);
}

/* Positions p0..p0+M-1 onto the device, unless they are there: a round's
 * upload (draft_enqueue) leaves p..p+rows-1, and the context rows that
 * follow its verify sit at p..p+ell, so a speculative round uploads once. */
static void set_positions(ds_dctx *x, int M, int p0) {
    if (x->pos_p0 == p0 && M <= x->pos_n) return;
    for (int r = 0; r < M; r++) x->pos_host[r] = p0 + r;
    x->ex->be->i->upload(x->ex, x->pos, x->pos_host, (size_t)M * sizeof(int));
    x->pos_p0 = p0;
    x->pos_n = M;
}


int ds_dctx_len(const ds_dctx *x) { return x->len; }

int ds_dctx_truncate(ds_dctx *x, int n_pos) {
    if (!x || n_pos < 0 || n_pos > x->len) return -1;
    x->len = n_pos;
    if (x->shared) x->seq->n_dctx = n_pos;
    return 0;
}

/* ---- context injection (spec §1.3, §1.5 k_ctx / v_ctx, §1.7) ------------ */

/* Context rows (spec §1.3, §1.5): M tap rows (device) -> fc -> hidden_norm
 * -> each layer's K/V, written where rv puts row m (its position, and with
 * rv->seq its sequence's pages). A row's bits are its taps' alone. */
static void ctx_rows_ops(ds_dctx *x, const float *src, int M, const ds_rows *rv) {
    const ds_drafter *d = x->d;
    const ds_backend_i *b = x->ex->be->i;
    const int D = d->d, hd = d->head_dim, Hkv = d->n_head_kv, kvd = Hkv * hd;
    const size_t fw = (size_t)d->n_taps * D;
    /* sanitize (spec §1.2): NaN -> 0, |x| > 65504 -> +-65504; device
     * taps straight from where the verify left them */
    b->sanitize(x->ex, M, (int64_t)fw, src, x->feat, DS_FEAT_MAX);
    /* ctx = RMSNorm_hidden_norm(W_fc feat) */
    b->matmul(x->ex, CANON, &d->fc, M, x->feat, x->x);
    b->rmsnorm(x->ex, CANON, M, D, x->x, d->hidden_norm, d->eps, x->xn);
    for (int l = 0; l < d->n_layer; l++) {
        const ds_layer *L = &d->layers[l];
        /* context rows skip input_layernorm; same W_k / k_norm / W_v */
        if (b->matmul_multi && L->wk.type == L->wv.type) {   /* one launch, same bits */
            const ds_weight *const w2[2] = {&L->wk, &L->wv};
            float *const y2[2] = {x->k, x->v};
            b->matmul_multi(x->ex, CANON, 2, w2, M, x->xn, y2);
        } else {
            b->matmul(x->ex, CANON, &L->wk, M, x->xn, x->k);
            b->matmul(x->ex, CANON, &L->wv, M, x->xn, x->v);
        }
        if (b->qk_norm_rope_kv) {   /* the same three steps in one launch */
            b->qk_norm_rope_kv(x->ex, M, 0, Hkv, hd, rv, d->rope_base, d->rope_mode, NULL,
                               L->k_norm, d->eps, NULL, x->k, x->v, ds_kvpool_k(x->pool, x->group, l),
                               ds_kvpool_v(x->pool, x->group, l));
            continue;
        }
        if (L->k_norm) b->rmsnorm(x->ex, CANON, M * Hkv, hd, x->k, L->k_norm, d->eps, x->k);
        b->rope(x->ex, CANON, M, Hkv, hd, rv->pos, d->rope_base, d->rope_mode, x->k);
        b->kv_write(x->ex, ds_kvpool_k(x->pool, x->group, l), ds_kvpool_v(x->pool, x->group, l), kvd, M, rv, x->k, x->v);
    }
}

/* taps: host rows (on_device = 0, uploaded) or device rows (copied). */
static int dctx_append(ds_dctx *x, const float *taps, int on_device, int n, int pos0, char *err, size_t errlen) {
    if (!x) { ds_errf(err, errlen, "drafter append: no context"); return -1; }
    const ds_drafter *d = x->d;
    if (n < 0) { ds_errf(err, errlen, "drafter append: %d rows (must be >= 0)", n); return -1; }
    if (pos0 != x->len) {
        ds_errf(err, errlen, "drafter append: rows start at position %d but the drafter context holds %d rows (must be equal)", pos0, x->len);
        return -1;
    }
    if ((int64_t)pos0 + n > x->n_ctx) {
        ds_errf(err, errlen, "drafter append: positions %d..%d exceed the drafter context size %d", pos0, pos0 + n - 1, x->n_ctx);
        return -1;
    }
    if (n == 0) return 0;
    if (!taps) { ds_errf(err, errlen, "drafter append: no tap rows given"); return -1; }
    if (x->shared && dctx_prepare(x, pos0, pos0 + n, err, errlen)) return -1;
    const int D = d->d;
    const size_t fw = (size_t)d->n_taps * D;
    for (int done = 0; done < n;) {
        const int M = n - done < DS_DRAFT_CHUNK ? n - done : DS_DRAFT_CHUNK;
        const int p0 = pos0 + done;
        const ds_backend_i *b = x->ex->be->i;
        const float *src = taps + (size_t)done * fw;
        set_positions(x, M, p0);
        if (!on_device) b->upload(x->ex, x->feat, src, (size_t)M * fw * sizeof(float));
        /* Device taps: the chunk is one recorded launch sequence per (context,
         * source rows, M) — every round of the speculative loop appends from
         * the same device buffer, so a handful of recordings serve them all. */
        const int rec = on_device && b->graph_begin && n <= d->gamma + 1;   /* rounds, not prefill */
        int replayed = 0;
        if (rec) {
            uint64_t key = 0x6374786170000000ull;                /* "ctxap" */
            key ^= (uint64_t)(uintptr_t)x * 1099511628211ull;
            key ^= (uint64_t)(uintptr_t)src * 0x9e3779b97f4a7c15ull;
            key ^= (uint64_t)M;
            if ((replayed = dctx_graph_begin(x, key, err, errlen)) < 0) return -1;
        }
        if (replayed) {
            if (b->graph_end(x->ex, err, errlen)) return -1;
            done += M;
            continue;
        }
        ctx_rows_ops(x, on_device ? src : x->feat, M, &x->crows);
        if (rec && b->graph_end(x->ex, err, errlen)) return -1;
        done += M;
    }
    x->len = pos0 + n;
    if (x->shared) x->seq->n_dctx = x->len;
    return 0;
}

int ds_dctx_append_rows(ds_dctx *x, const float *taps_dev, int n, const ds_rows *rows, char *err, size_t errlen) {
    if (!x->shared || !rows || !rows->seq) { ds_errf(err, errlen, "drafter append: rows of many sequences need a shared context"); return -1; }
    if (n < 1) return 0;
    const size_t fw = (size_t)x->d->n_taps * x->d->d;
    for (int done = 0; done < n;) {
        const int M = n - done < DS_DRAFT_CHUNK ? n - done : DS_DRAFT_CHUNK;
        ds_rows rv = *rows;
        rv.pos += done;
        rv.seq += done;
        rv.n_vis = NULL;
        ctx_rows_ops(x, taps_dev + (size_t)done * fw, M, &rv);
        done += M;
    }
    return 0;
}

int ds_dctx_append(ds_dctx *x, const float *taps, int n, int pos0, char *err, size_t errlen) {
    return dctx_append(x, taps, 0, n, pos0, err, errlen);
}

int ds_dctx_append_dev(ds_dctx *x, const float *taps_dev, int n, int pos0, char *err, size_t errlen) {
    return dctx_append(x, taps_dev, 1, n, pos0, err, errlen);
}

/* ---- the block forward (spec §1.4-§1.6) ----------------------------------- */

/* Runs n sequences' block rows [anchor, MASK...] through the trunk: rows
 * [0, n) are the anchors (their ids at `anchors`, device), rows [n, n * γ)
 * the MASK rows, slot by slot; rv and pos give every row its position
 * (p..p+γ-1 of its sequence), sequence and visible length (p + γ: the block
 * is non-causal). n = 1 is ds_draft's one block. Leaves the
 * post-output_norm hidden of every row in x->xn. Block K/V rows go to cache
 * rows p..p+γ-1 (beyond the context length: scratch that the next append or
 * round overwrites; never counted as context). Rows are independent, so
 * the order of rows, and how many sequences share the pass, change no bit. */
static void block_forward(ds_dctx *x, int n, const ds_rows *rv, const int *pos, const int32_t *anchors, int p) {
    const ds_drafter *d = x->d;
    ds_exec *ex = x->ex;
    const ds_backend_i *b = ex->be->i;
    const int G = d->gamma, D = d->d, hd = d->head_dim, H = d->n_head, Hkv = d->n_head_kv;
    const int qd = H * hd, kvd = Hkv * hd, M = n * G;
    const int reuse = !x->no_mask_cache && G > 1;
    const ds_layer_shape shape = {
        .d = D, .n_head = H, .n_head_kv = Hkv, .head_dim = hd, .n_ff = d->n_ff,
        .eps = d->eps, .rope_base = d->rope_base, .rope_mode = d->rope_mode,
    };
    uint8_t var[DS_FAM_COUNT];
    memset(var, CANON, sizeof var);
    ds_acts a = {.x = x->x, .xn = x->xn, .q = x->q, .k = x->k, .v = x->v, .att = x->att,
                 .o = x->o, .gate = x->gate, .up = x->up, .h = x->hff, .pos = pos, .rows = rv};

    b->embed(ex, d->embd, n, anchors, x->x);
    if (reuse) {
        /* the MASK rows' layer-0 input and projections from the per-context
         * cache, in one op (the anchors' rows are computed) */
        const size_t fs = sizeof(float), nm = (size_t)n * (size_t)(G - 1);
        void *const dst[4] = {x->x + (size_t)n * D, x->q + (size_t)n * qd, x->k + (size_t)n * kvd, x->v + (size_t)n * kvd};
        const void *const src[4] = {x->mask_x, x->mask_q, x->mask_k, x->mask_v};
        const size_t bytes[4] = {nm * D * fs, nm * qd * fs, nm * kvd * fs, nm * kvd * fs};
        ds_backend_copy_n(ex, 4, dst, src, bytes);
    } else
        for (int r = n; r < M; r++) b->embed(ex, d->embd, 1, x->toks + G + 1, x->x + (size_t)r * D);
    for (int l = 0; l < d->n_layer; l++) {
        int qkv_ready = 0;
        if (l == 0 && reuse) {
            /* anchors computed; MASK rows copied from the cache above */
            layer0_proj_rows(d, ex, n, x->x, x->xn, x->q, x->k, x->v);
            qkv_ready = 1;
        } else if (l == 0) {
            b->rmsnorm(ex, CANON, M, D, x->x, d->layers[0].attn_norm, d->eps, x->xn);
        }
        const float *next = l + 1 < d->n_layer ? d->layers[l + 1].attn_norm : d->output_norm;
        ds_layer_forward(ex, &d->layers[l], &shape, next, var, M, p, qkv_ready,
                         ds_kvpool_k(x->pool, x->group, l), ds_kvpool_v(x->pool, x->group, l), &a, NULL, l);
    }
}

/* ---- heads (spec §2, §2.5, §3.1) ----------------------------------------- */

int ds_dctx_set_retained(ds_dctx *x, int n_keep, char *err, size_t errlen) {
    if (!x) { ds_errf(err, errlen, "draft: no drafter context"); return -1; }
    if (n_keep < 1 || n_keep > x->d->gamma) {
        ds_errf(err, errlen, "draft: retained depth %d is out of range [1, %d] (the block size)", n_keep, x->d->gamma);
        return -1;
    }
    if (x->retained && x->retained != n_keep) {
        ds_errf(err, errlen, "draft: retained depth %d was fixed at initialisation; %d requested (settings changed after initialisation)",
                x->retained, n_keep);
        return -1;
    }
    x->retained = n_keep;
    return 0;
}

/* One slot of one sequence's head chain (spec §2): the Markov bias from
 * the slot's input id, or the correction head; the MASK logit; the
 * confidence when asked; the chosen id. */
typedef struct {
    const float *h;          /* the slot's hidden row (post output_norm)              */
    float *z;                /* its logits: the LM head's on entry (no correction)    */
    const int32_t *prev;     /* device: the slot's input id (the anchor, then chosen) */
    int32_t *out;            /* device: the id it chooses                             */
    float *conf;             /* device: its confidence, or NULL                       */
    int64_t pos;             /* the position the chosen token is for                  */
} slot_io;

static int head_slot(ds_dctx *x, const ds_sampler *samp, int k, const slot_io *io, char *err, size_t errlen) {
    const ds_drafter *d = x->d;
    const int G = d->gamma, D = d->d, V = d->V, r = d->rank;
    ds_exec *ex = x->ex;
    const ds_backend_i *be = ex->be->i;
    const size_t fs = sizeof(float);
    /* scratch carve-up of x->vec: e[r] | in[max(2r+d, d+r, 2d)] | out[3r] | g[r] */
    float *e = x->vec;
    float *in = e + r;
    float *out = in + 2 * (size_t)r + 2 * (size_t)D;
    float *gv = out + 3 * (size_t)r;
    int32_t *mask_tok = x->toks + G + 1;
    const float *hk = io->h;
    float *zk = io->z;
    const int32_t *prev = io->prev;
    if (r > 0) be->embed(ex, &d->w1, 1, prev, e);            /* e_k = W1[prev_k] */

    if (d->has_corr) {
        /* h'_k = h_k + W_down(silu(W_gate in) * W_up in) */
        const int w = d->corr_w;
        float *cg = x->cw, *cu = cg + w, *ca = cu + w;
        be->rmsnorm(ex, CANON, 1, D, hk, d->corr_hn, DS_CORR_EPS, in);
        be->embed(ex, d->embd, 1, prev, x->hc);
        be->rmsnorm(ex, CANON, 1, D, x->hc, d->corr_en, DS_CORR_EPS, in + D);
        be->matmul(ex, CANON, &d->corr_gate, 1, in, cg);
        be->matmul(ex, CANON, &d->corr_up, 1, in, cu);
        be->swiglu(ex, CANON, 1, w, cg, cu, ca);
        be->matmul(ex, CANON, &d->corr_down, 1, ca, x->o);
        be->add(ex, D, hk, x->o, x->hc);
        be->matmul(ex, CANON, d->head, 1, x->hc, zk);
        if (r > 0) {
            /* deploy exposure: the slot's own input id (anchor, then MASK) */
            const float *b;
            if (k > 0 && !x->no_mask_cache) b = x->mask_bias;
            else {
                be->embed(ex, &d->w1, 1, k == 0 ? prev : mask_tok, gv);
                be->matmul(ex, CANON, &d->w2, 1, gv, x->bias);
                b = x->bias;
            }
            be->add(ex, V, zk, b, zk);
        }
    } else if (r > 0) {
        const float *bsrc = e;
        if (d->markov == DS_MARKOV_GATED) {
            /* g = sigmoid(W_g [h; e] + b_g); B = W2 (g * e) */
            be->copy(ex, in, hk, (size_t)D * fs);
            be->copy(ex, in + D, e, (size_t)r * fs);
            be->matmul(ex, CANON, &d->mgate, 1, in, out);
            be->gate(ex, DS_GATE_SIGMOID_MUL, r, out, arena_vec(d, d->mgate_b), e, NULL, gv);
            bsrc = gv;
        } else if (d->markov == DS_MARKOV_RNN) {
            /* [gamma; cand; o] = W_j [s; e; h] + b_j; s = g s + (1-g) cand; B = W2 tanh(o) */
            be->copy(ex, in, x->state, (size_t)r * fs);
            be->copy(ex, in + r, e, (size_t)r * fs);
            be->copy(ex, in + 2 * r, hk, (size_t)D * fs);
            be->matmul(ex, CANON, &d->mjoint, 1, in, out);
            be->gate(ex, DS_GATE_RNN, r, out, arena_vec(d, d->mjoint_b), NULL, x->state, gv);
            bsrc = gv;
        }
        be->matmul(ex, CANON, &d->w2, 1, bsrc, x->bias);
        be->add(ex, V, zk, x->bias, zk);
    }

    if (x->dbg_unmasked) be->download(ex, x->dbg_unmasked + (size_t)k * V, zk, (size_t)V * fs);
    be->fill(ex, 1, zk + d->mask_id, DS_MASK_LOGIT);

    if (io->conf) {
        /* c_k = sigmoid(w . [h_k; e_k] + b): the logit into scal[0], b = scal[1] */
        be->copy(ex, in, hk, (size_t)D * fs);
        if (d->conf_with_markov) be->copy(ex, in + D, e, (size_t)r * fs);
        be->matmul(ex, CANON, &d->conf_w, 1, in, x->scal);
        be->gate(ex, DS_GATE_SIGMOID, 1, x->scal, x->scal + 1, NULL, NULL, io->conf);
    }

    /* the token for position p+k+1, straight where the next slot reads it */
    return ds_backend_select(ex, samp, 1, V, zk, io->pos, x->samp_scratch, io->out, err, errlen) ? -1 : 0;
}

/* A sequence's whole chain in the backend's one launch, when it has one
 * and the round allows it: greedy, no correction head, a vanilla Markov
 * head or none (the same ops' bits). Slot k's hidden row is h + k * stride
 * rows, its logits z + k * stride rows, its input id toks[k * stride].
 * 0: done; 1: run the slots op by op. */
static int chain_fused(ds_dctx *x, const ds_sampler *samp, int n_keep, const float *h, float *z, int32_t *toks,
                       int stride, int want_conf) {
    const ds_drafter *d = x->d;
    const ds_backend_i *be = x->ex->be->i;
    const int r = d->rank;
    const int greedy = !samp || !(samp->temp > 0.0f);
    const int vanilla = d->markov == DS_MARKOV_VANILLA || (d->markov == DS_MARKOV_NONE && r == 0);
    if (!be->draft_chain || !greedy || !vanilla || d->has_corr || x->dbg_unmasked || x->no_chain) return 1;
    const ds_draft_chain ch = {
        .n_keep = n_keep, .V = d->V, .D = d->d,
        .w1 = r > 0 ? &d->w1 : NULL, .w2 = r > 0 ? &d->w2 : NULL,
        .conf_w = d->has_conf && want_conf ? &d->conf_w : NULL,
        .conf_with_markov = d->conf_with_markov,
        .h = h, .z = z, .toks = toks,
        .mask_id = d->mask_id, .mask_logit = DS_MASK_LOGIT,
        .conf_b = x->scal + 1, .conf_logit = x->scal, .conf = x->conf,
        .bias = x->bias, .in = x->vec + r,     /* head_slot's `in` */
        .stride = stride,
    };
    return be->draft_chain(x->ex, &ch) == 0 ? 0 : 1;
}

/* One round's device work after the uploads: the block forward, then the
 * heads slot by slot, the chosen ids into x->toks[1..n_keep]. Issues ops
 * only (recordable) unless a debug download or T > 0 asks otherwise. */
static int draft_ops(ds_dctx *x, int n_keep, const ds_sampler *samp, int p, int want_conf, char *err,
                     size_t errlen) {
    const ds_drafter *d = x->d;
    const int G = d->gamma, D = d->d, V = d->V, r = d->rank;
    ds_exec *ex = x->ex;
    const ds_backend_i *be = ex->be->i;
    const size_t fs = sizeof(float);

    block_forward(x, 1, &x->brows, x->pos, x->toks, p);
    if (!d->has_corr) {
        /* base logits of every kept row in one LM-head matmul, straight
         * after the output norm (whose Q8_0 copy of x->xn it can then read) */
        be->matmul(ex, CANON, d->head, n_keep, x->xn, x->z);
    }
    /* the heads read the hidden rows where the output norm left them: from
     * here on nothing writes x->xn before the next block */
    if (x->dbg_hidden) be->download(ex, x->dbg_hidden, x->xn, (size_t)G * D * fs);

    if (d->markov == DS_MARKOV_RNN) be->fill(ex, r, x->state, 0.0f);
    if (!chain_fused(x, samp, n_keep, x->xn, x->z, x->toks, 1, want_conf)) return 0;
    for (int k = 0; k < n_keep; k++) {
        const slot_io io = {x->xn + (size_t)k * D, x->z + (size_t)k * V, x->toks + k, x->toks + k + 1,
                            d->has_conf && want_conf ? x->conf + k : NULL, (int64_t)p + k + 1};
        if (head_slot(x, samp, k, &io, err, errlen)) return -1;
    }
    return 0;
}

/* The round's device work, queued: contracts, uploads, the recorded block
 * forward and head chain. Nothing is downloaded and nothing waits. */
static int draft_enqueue(ds_dctx *x, int32_t anchor, int p, const ds_draft_opts *o, int with_conf, char *err,
                         size_t errlen) {
    if (!x) { ds_errf(err, errlen, "draft: no drafter context"); return -1; }
    const ds_drafter *d = x->d;
    const int G = d->gamma, V = d->V;
    const ds_sampler *samp = o ? o->samp : NULL;
    const int n_keep = o ? o->n_keep : G;
    /* every contract is checked before anything is written */
    if (n_keep < 1 || n_keep > G) {
        ds_errf(err, errlen, "draft: n_keep %d is out of range [1, %d] (the block size)", n_keep, G);
        return -1;
    }
    if (x->retained && n_keep != x->retained) {
        ds_errf(err, errlen, "draft: n_keep %d differs from the retained depth %d fixed at initialisation (settings changed after initialisation)",
                n_keep, x->retained);
        return -1;
    }
    if (p != x->len) {
        ds_errf(err, errlen, "draft: anchor position %d must equal the drafter context length %d", p, x->len);
        return -1;
    }
    if (anchor < 0 || anchor >= V) {
        ds_errf(err, errlen, "draft: anchor token %d is out of range [0, %d)", anchor, V);
        return -1;
    }
    if (samp && samp->temp < 0.0f) {
        ds_errf(err, errlen, "draft: sampler temperature %g is negative", samp->temp);
        return -1;
    }
    ds_exec *ex = x->ex;
    const ds_backend_i *be = ex->be->i;
    /* a shared context's pages come as they are needed: the block's rows */
    if (x->shared && dctx_prepare(x, p, p + G, err, errlen)) return -1;

    /* the round's upload: positions p..p+rows-1 (the block's G, the
     * verify's G + 1 and the context rows after it read them) and the
     * anchor (toks[0], right after the rows of positions) at once */
    for (int r = 0; r < G; r++) x->pos_host[r] = p + G;       /* the block is non-causal */
    for (int r = 0; r < x->rows; r++) x->pos_host[G + r] = p + r;
    x->pos_host[G + x->rows] = anchor;
    be->upload(ex, x->nvis, x->pos_host, ((size_t)G + x->rows + 1) * sizeof(int32_t));
    x->pos_p0 = p;
    x->pos_n = x->rows;
    /* Everything from here to the downloads reads the anchor and positions
     * from the device, so a backend that records launch sequences (CUDA
     * graphs) replays one recording per (context, n_keep, confidence):
     * ~150 small launches per round become one. Not recorded: debug
     * downloads, and T > 0 (the sampler takes the position by value). */
    const int greedy = !samp || !(samp->temp > 0.0f);
    const int rec = be->graph_begin && greedy && !x->dbg_hidden && !x->dbg_unmasked;
    int replayed = 0;
    if (rec) {
        uint64_t key = 0x6472616674000000ull;                    /* "draft" */
        key ^= (uint64_t)(uintptr_t)x * 1099511628211ull;
        key ^= ((uint64_t)n_keep << 8) | ((uint64_t)x->no_chain << 2) | ((uint64_t)(with_conf != 0) << 1) |
               (uint64_t)x->no_mask_cache;
        if ((replayed = dctx_graph_begin(x, key, err, errlen)) < 0) return -1;
    }
    if (!replayed && draft_ops(x, n_keep, samp, p, with_conf, err, errlen)) {
        if (rec) (void)be->graph_end(ex, NULL, 0);
        return -1;
    }
    if (rec && be->graph_end(ex, err, errlen)) return -1;
    return 0;
}

int ds_draft_queue(ds_dctx *x, int32_t anchor, int p, const ds_draft_opts *o, const int32_t **ids_dev,
                   char *err, size_t errlen) {
    if (!ids_dev) { ds_errf(err, errlen, "draft: no place for the ids' device address"); return -1; }
    if (draft_enqueue(x, anchor, p, o, 0, err, errlen)) return -1;
    *ids_dev = x->toks + 1;
    return 0;
}

/* ---- many sequences' rounds in one pass (the batch engine's) ------------- */

int ds_dctx_many_max(const ds_dctx *x) { return x && x->shared ? x->n_many : 0; }

static int many_ops(ds_dctx *x, int n, const ds_draft_seq *q, const ds_rows *rv, int32_t *ids, char *err,
                    size_t errlen);

int ds_draft_many(ds_dctx *x, int n, const ds_draft_seq *q, const ds_rows *tables, const int32_t **ids_dev,
                  char *err, size_t errlen) {
    if (!x || !x->shared || !tables || !ids_dev) {
        ds_errf(err, errlen, "draft: rounds of many sequences need a shared context, the tables and a place for the ids");
        return -1;
    }
    const ds_drafter *d = x->d;
    const int G = d->gamma, V = d->V;
    if (n < 1 || n > x->n_many) { ds_errf(err, errlen, "draft: %d sequences in one pass (1..%d)", n, x->n_many); return -1; }
    /* every contract is checked before anything is written */
    for (int i = 0; i < n; i++) {
        const ds_draft_seq *r = &q[i];
        if (r->n_keep < 1 || r->n_keep > G || (i && r->n_keep > q[i - 1].n_keep)) {
            ds_errf(err, errlen, "draft: sequence %d keeps %d drafts (1..%d, none more than the one before)", i, r->n_keep, G);
            return -1;
        }
        if (x->retained && r->n_keep != x->retained) {
            ds_errf(err, errlen, "draft: n_keep %d differs from the retained depth %d fixed at initialisation (settings changed after initialisation)",
                    r->n_keep, x->retained);
            return -1;
        }
        if (r->p < 0 || r->p >= x->n_ctx) { ds_errf(err, errlen, "draft: anchor position %d is outside [0, %d)", r->p, x->n_ctx); return -1; }
        if (r->anchor < 0 || r->anchor >= V) { ds_errf(err, errlen, "draft: anchor token %d is out of range [0, %d)", r->anchor, V); return -1; }
        if (r->samp && r->samp->temp < 0.0f) { ds_errf(err, errlen, "draft: sampler temperature %g is negative", r->samp->temp); return -1; }
    }
    ds_exec *ex = x->ex;
    const ds_backend_i *be = ex->be->i;
    const int M = n * G;
    /* the rows (row k * n + i: slot k of sequence i) and the anchors, in one
     * upload: nvis | pos | seq | ids (slot-major: the anchors, then what
     * each slot chooses) */
    int32_t *h = x->mhost;
    for (int k = 0; k < G; k++)
        for (int i = 0; i < n; i++) {
            const int row = k * n + i;
            h[row] = q[i].p + G;
            h[M + row] = q[i].p + k;
            h[2 * M + row] = q[i].seq;
        }
    for (int i = 0; i < n; i++) h[3 * M + i] = q[i].anchor;
    be->upload(ex, x->mbuf, h, ((size_t)3 * M + (size_t)n) * sizeof(int32_t));
    ds_rows rv = *tables;
    rv.vis_max = 0;                               /* other rows than the caller's: no bound known */
    rv.n_vis = x->mbuf;
    rv.pos = x->mbuf + M;
    rv.seq = x->mbuf + 2 * M;
    int32_t *ids = x->mbuf + 3 * M;
    *ids_dev = ids + n;
    /* From here on every op reads the rows, tables and anchors from the
     * device, so a backend that records launch sequences replays one
     * recording per (context, n, each sequence's n_keep) — the same rule as
     * draft_enqueue's: greedy rounds only (T > 0 takes positions by value). */
    int greedy = 1;
    for (int i = 0; i < n; i++) greedy &= !q[i].samp || !(q[i].samp->temp > 0.0f);
    const int rec = be->graph_begin && greedy && !x->dbg_hidden && !x->dbg_unmasked;
    if (rec) {
        uint64_t key = 0x6d616e7900000000ull;                    /* "many" */
        key ^= (uint64_t)(uintptr_t)x * 1099511628211ull;
        key ^= ((uint64_t)x->no_chain << 2) | (uint64_t)x->no_mask_cache;
        for (int i = 0; i < n; i++) key = (key ^ (uint64_t)(q[i].n_keep + 1)) * 0x100000001b3ull;
        key ^= (uint64_t)n << 40;
        const int replayed = dctx_graph_begin(x, key, err, errlen);
        if (replayed < 0) return -1;
        if (replayed) return be->graph_end(ex, err, errlen) ? -1 : 0;
    }
    if (many_ops(x, n, q, &rv, ids, err, errlen)) {
        if (rec) (void)be->graph_end(ex, NULL, 0);
        return -1;
    }
    return rec && be->graph_end(ex, err, errlen) ? -1 : 0;
}

/* ds_draft_many's device work after its upload: the block forward of every
 * sequence, the LM head, each sequence's chain (its slots n rows apart). */
/* The n sequences' chains of a pass as ONE backend launch (ds_draft_chain
 * n_seq): chain_fused's conditions for every sequence, no confidence.
 * 0: done; 1: the backend declined (or a sequence samples). */
static int chain_many(ds_dctx *x, int n, const ds_draft_seq *q, int32_t *ids) {
    const ds_drafter *d = x->d;
    const ds_backend_i *be = x->ex->be->i;
    const int r = d->rank;
    if (n < 2 || n > DS_CHAIN_SEQ_MAX || !be->draft_chain || d->markov != DS_MARKOV_VANILLA || r < 1 || d->has_corr ||
        x->dbg_unmasked || x->no_chain)
        return 1;
    for (int i = 0; i < n; i++)
        if (q[i].samp && q[i].samp->temp > 0.0f) return 1;
    ds_draft_chain ch = {
        .n_keep = q[0].n_keep, .V = d->V, .D = d->d,
        .w1 = &d->w1, .w2 = &d->w2, .conf_w = NULL, .conf_with_markov = d->conf_with_markov,
        .h = x->xn, .z = x->z, .toks = ids,
        .mask_id = d->mask_id, .mask_logit = DS_MASK_LOGIT,
        .conf_b = x->scal + 1, .conf_logit = x->scal, .conf = x->conf,
        .bias = x->bias, .in = x->vec + r,
        .stride = n, .n_seq = n,
    };
    for (int i = 0; i < n; i++) ch.keep[i] = q[i].n_keep;
    return be->draft_chain(x->ex, &ch) == 0 ? 0 : 1;
}

static int many_ops(ds_dctx *x, int n, const ds_draft_seq *q, const ds_rows *rv, int32_t *ids, char *err,
                    size_t errlen) {
    const ds_drafter *d = x->d;
    const int D = d->d, V = d->V;
    ds_exec *ex = x->ex;
    const ds_backend_i *be = ex->be->i;
    block_forward(x, n, rv, rv->pos, ids, q[0].p);
    /* the LM head over the rows still drafting, slot by slot (sequences of
     * fewer drafts are a suffix); slots that every sequence keeps share one
     * matmul */
    if (!d->has_corr)
        for (int k = 0; k < q[0].n_keep;) {
            int act = 0;
            while (act < n && q[act].n_keep > k) act++;
            int k1 = k + 1;
            if (act == n)
                while (k1 < q[0].n_keep && q[n - 1].n_keep > k1) k1++;
            const int rows_n = act == n ? (k1 - k) * n : act;
            be->matmul(ex, CANON, d->head, rows_n, x->xn + (size_t)k * n * D, x->z + (size_t)k * n * V);
            k = act == n ? k1 : k + 1;
        }
    /* every sequence's chain in one launch where the backend has it (greedy
     * rounds, the heads chain_fused takes), else each sequence's: its slots
     * are n rows apart */
    if (chain_many(x, n, q, ids) == 0) return 0;
    for (int i = 0; i < n; i++) {
        const float *hi = x->xn + (size_t)i * D;
        float *zi = x->z + (size_t)i * V;
        if (d->markov == DS_MARKOV_RNN) be->fill(ex, d->rank, x->state, 0.0f);
        if (!chain_fused(x, q[i].samp, q[i].n_keep, hi, zi, ids + i, n, 0)) continue;
        for (int k = 0; k < q[i].n_keep; k++) {
            const size_t row = (size_t)k * n;
            const slot_io io = {hi + row * D, zi + row * V, ids + row + i, ids + row + n + i, NULL,
                                (int64_t)q[i].p + k + 1};
            if (head_slot(x, q[i].samp, k, &io, err, errlen)) return -1;
        }
    }
    return 0;
}

int ds_dctx_reusable(const ds_dctx *x, const ds_drafter *d, int n_ctx, int n_keep, const ds_exec *ex) {
    return x && x->d == d && x->n_ctx == n_ctx && x->ex == ex && (!x->retained || x->retained == n_keep);
}

const int32_t *ds_dctx_rows_dev(const ds_dctx *x, int *pitch) {
    if (!x || !pitch || x->rows < x->d->gamma + 1) return NULL;   /* no room for p + gamma */
    *pitch = (int)(x->toks - x->pos);
    return x->pos;
}

int ds_draft(ds_dctx *x, int32_t anchor, int p, const ds_draft_opts *o, int32_t *ids, float *confidence,
             float *logits, char *err, size_t errlen) {
    if (draft_enqueue(x, anchor, p, o, confidence != NULL, err, errlen)) return -1;
    const ds_drafter *d = x->d;
    const int V = d->V;
    const int n_keep = o ? o->n_keep : d->gamma;
    ds_exec *ex = x->ex;
    const ds_backend_i *be = ex->be->i;
    const size_t fs = sizeof(float);

    /* the round's downloads: ids, confidences, logits only when asked */
    if (ids) be->download(ex, ids, x->toks + 1, (size_t)n_keep * sizeof(int32_t));
    if (confidence) {
        if (d->has_conf) be->download(ex, confidence, x->conf, (size_t)n_keep * fs);
        else for (int k = 0; k < n_keep; k++) confidence[k] = 1.0f;
    }
    if (logits) be->download(ex, logits, x->z, (size_t)n_keep * V * fs);
    char e2[DS_ERRLEN];
    if (be->sync(ex, e2, sizeof e2)) { ds_errf(err, errlen, "draft: %s", e2); return -1; }
    return 0;
}
