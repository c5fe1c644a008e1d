/* diverge.c — batched-vs-sequential experiments (see diverge.h). */
#include "diverge.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ========================================================================
 * Probe adapter: model checkpoints -> capture arena, rows relative to S0
 * ===================================================================== */

typedef struct {
    dsd_capture *cap;
    int          pos0;
    ds_diverge_result *r;          /* family map, filled as checkpoints arrive */
} probe_ctx;

/* Slot of (layer, cp, sub) in the result's family map: layers -1..n-1,
 * named subobjects, and one slot for every per-head object. */
static long fam_slot(const ds_diverge_result *r, int layer, uint32_t cp, uint32_t sub) {
    if (layer < -1 || layer >= r->fam_layers || cp >= DSD_CP_COUNT) return -1;
    const uint32_t s = sub >= DSD_SUB_HEAD_BASE ? DSD_SUB_NAMED_COUNT : sub;
    if (s > DSD_SUB_NAMED_COUNT) return -1;
    return ((long)(layer + 1) * DSD_CP_COUNT + (long)cp) * (DSD_SUB_NAMED_COUNT + 1) + (long)s;
}

static void probe_to_capture(void *user, int pos, int layer, int cp, int sub, unsigned fams,
                             const float *data, size_t n) {
    probe_ctx *p = user;
    const long i = fam_slot(p->r, layer, (uint32_t)cp, (uint32_t)sub);
    if (i >= 0) p->r->fam_map[i] |= fams;
    /* the status is recorded in the capture's stats; dsd_report reports it */
    (void)dsd_capture_put(p->cap, pos - p->pos0, layer, (uint32_t)cp, (uint32_t)sub, data, n);
}

/* The forward asks before copying: every checkpoint is wanted here (the
 * capture's own filter decides what is stored). */
static int probe_wants_all(void *user, int layer, int cp) { return 1; }

unsigned ds_families_for_checkpoint(const ds_diverge_result *r, int layer, uint32_t cp, uint32_t sub) {
    const long i = r->fam_map ? fam_slot(r, layer, cp, sub) : -1;
    return i >= 0 ? r->fam_map[i] : 0;
}

/* Everything a pass leaves that the future can see, plus its logits. */
typedef struct {
    float *logits, *taps, *k, *v;
    size_t n_logits, n_taps, n_kv;
} pass_out;

static int pass_alloc(pass_out *p, const ds_ctx *c, int M) {
    const ds_hparams *hp = &ds_ctx_model(c)->hp;
    p->n_logits = (size_t)M * hp->n_vocab;
    p->n_taps = (size_t)M * ds_ctx_n_taps(c) * hp->n_embd;
    p->n_kv = (size_t)ds_hp_kv_layers(hp) * M * (size_t)ds_hp_kv_row(hp);
    p->logits = malloc(p->n_logits * sizeof(float));
    p->taps = malloc((p->n_taps + 1) * sizeof(float));
    p->k = malloc(p->n_kv * sizeof(float));
    p->v = malloc(p->n_kv * sizeof(float));
    return p->logits && p->taps && p->k && p->v ? 0 : -1;
}
static void pass_free(pass_out *p) { free(p->logits); free(p->taps); free(p->k); free(p->v); }

static void grab_kv(ds_ctx *c, int pos0, int M, pass_out *p) {
    ds_ctx_read_kv(c, pos0, M, p->k, p->v);
}

static int same_state(const pass_out *a, const pass_out *b) {
    return !memcmp(a->k, b->k, a->n_kv * sizeof(float)) && !memcmp(a->v, b->v, a->n_kv * sizeof(float)) &&
           !memcmp(a->taps, b->taps, a->n_taps * sizeof(float));
}
static int same_logits(const pass_out *a, const pass_out *b) {
    return !memcmp(a->logits, b->logits, a->n_logits * sizeof(float));
}

static int batch_pass(ds_ctx *c, const ds_diverge_opts *o, pass_out *p, char *err, size_t errlen) {
    ds_ctx_set_kernels(c, &o->ks);
    if (ds_forward_batch(c, o->block, o->M, o->n_prompt, DS_LOGITS_ALL, p->logits, p->taps, err, errlen)) return -1;
    grab_kv(c, o->n_prompt, o->M, p);
    return 0;
}

static int decode_pass(ds_ctx *c, const ds_diverge_opts *o, pass_out *p, char *err, size_t errlen) {
    const ds_hparams *hp = &ds_ctx_model(c)->hp;
    const size_t V = (size_t)hp->n_vocab, T = (size_t)ds_ctx_n_taps(c) * hp->n_embd;
    for (int r = 0; r < o->M; r++)
        if (ds_decode(c, o->block[r], o->n_prompt + r, p->logits + r * V, p->taps + r * T, err, errlen)) return -1;
    grab_kv(c, o->n_prompt, o->M, p);
    return 0;
}

/* families' ds4_indexer A/B: row m's block keys in the rows of in1 */
typedef struct {
    const float *base;
    size_t stride, off;
    int ihd;
} ab_keys;
static const float *ab_key(const void *u, int m, int blk) {
    const ab_keys *k = u;
    return k->base + (size_t)m * k->stride + k->off + (size_t)blk * (size_t)k->ihd;
}

/* Arena sized for every checkpoint object of M rows. */
static dsd_capture *capture_for(const ds_ctx *c, int M) {
    const ds_hparams *hp = &ds_ctx_model(c)->hp;
    size_t qd = (size_t)hp->n_head * hp->head_dim, kvd = (size_t)hp->n_head_kv * hp->head_dim;
    size_t per_layer = 6 * (size_t)hp->n_embd + 3 * qd + 6 * kvd + 3 * (size_t)hp->n_ff + qd;
    size_t floats = (size_t)M * ((size_t)hp->n_layer * per_layer + (size_t)hp->n_vocab + 4 * (size_t)hp->n_embd);
    size_t entries = (size_t)M * ((size_t)hp->n_layer * (24 + (size_t)hp->n_head) + 16);
    return dsd_capture_new(floats * sizeof(float) + 4096, entries);
}

void ds_diverge_arena_size(const ds_ctx *c, int M, size_t *floats, size_t *rows) {
    const ds_hparams *hp = &ds_ctx_model(c)->hp;
    const size_t d = (size_t)hp->n_embd, qd = (size_t)hp->n_head * hp->head_dim;
    const size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, taps = (size_t)ds_ctx_n_taps(c);
    /* per layer and row, as ds_layer_forward reports them: attn_norm,
     * out_proj, attn_residual, ffn_norm, down, layer_out (d); q proj, norm,
     * rope, heads (qd); k, v proj, k norm, k rope, K and V rows (kvd);
     * gate, up, act (ff) — 19 objects plus one per head; after the stack
     * the final norm, the logits and the taps */
    const size_t per_layer = 6 * d + 4 * qd + 6 * kvd + 3 * (size_t)hp->n_ff;
    *floats = (size_t)M * ((size_t)hp->n_layer * per_layer + (size_t)hp->n_vocab + (1 + taps) * d);
    *rows = (size_t)M * ((size_t)hp->n_layer * (19 + (size_t)hp->n_head) + 2 + taps);
}

/* The arena of one side of the experiment, when its path takes one. */
static int arena_for(ds_ctx *c, const ds_diverge_opts *o, ds_capture_path path, ds_probe_arena *a,
                     char *err, size_t errlen) {
    ds_backend *be = ds_ctx_exec(c)->be;
    if (path == DS_CAPTURE_DIRECT || (path == DS_CAPTURE_AUTO && be->i->host_memory)) return 0;
    size_t floats, rows;
    ds_diverge_arena_size(c, o->M, &floats, &rows);
    return ds_probe_arena_init(a, be, floats, rows, err, errlen);
}

/* ========================================================================
 * The experiment
 * ===================================================================== */

/* Pass B on context cb: the same ids forced through sequential decode
 * (ksb == NULL: the classic experiment), or batched with kernel set *ksb
 * (the cross-configuration mode). */
static int pass_b(ds_ctx *cb, const ds_diverge_opts *o, const ds_kernel_set *ksb, pass_out *p,
                  char *err, size_t errlen) {
    if (!ksb) return decode_pass(cb, o, p, err, errlen);
    ds_diverge_opts ob = *o;
    ob.ks = *ksb;
    return batch_pass(cb, &ob, p, err, errlen);
}

/* S0 on one context: canonical prefill of the prompt, snapshot. */
static int make_s0(ds_ctx *c, const ds_diverge_opts *o, ds_state *s0, char *err, size_t errlen) {
    ds_kernel_set canon;
    ds_kernel_set_all(&canon, DS_CANONICAL);
    ds_ctx_set_kernels(c, &canon);
    ds_ctx_set_probe(c, NULL);
    ds_kv_truncate(c, 0);
    if (ds_forward_batch(c, o->prompt, o->n_prompt, 0, DS_LOGITS_NONE, NULL, NULL, err, errlen)) return -1;
    if (ds_state_save(c, s0)) { ds_errf(err, errlen, "diverge: out of memory saving S0"); return -1; }
    return 0;
}

/* The experiment: Pass A (batched, o->ks, with the gate) on ca; Pass B on
 * cb (decode, or batched with *ksb). ca == cb for the classic form. */
static int diverge_core(ds_ctx *ca, ds_ctx *cb, const ds_diverge_opts *o, const ds_kernel_set *ksb,
                        ds_capture_path path, ds_diverge_result *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    for (int i = 0; i < DSD_CHAIN_COUNT; i++) r->chain[i] = -1;
    r->first_token_mismatch_row = -1;
    if (o->M < 1 || o->n_prompt < 1) { ds_errf(err, errlen, "diverge: need a prompt and at least one block token"); return -1; }
    ds_ctx *cs[2] = { ca, cb };
    for (int i = 0; i < 2; i++)
        if (o->n_prompt + o->M > ds_ctx_n_ctx(cs[i])) {
            ds_errf(err, errlen, "diverge: prompt (%d) + block (%d) exceed the context (%d)", o->n_prompt, o->M, ds_ctx_n_ctx(cs[i]));
            return -1;
        }
    const ds_model *m = ds_ctx_model(ca);
    if (cb != ca) {
        const ds_hparams *ha = &m->hp, *hb = &ds_ctx_model(cb)->hp;
        if (ha->n_layer != hb->n_layer || ha->n_embd != hb->n_embd || ha->n_vocab != hb->n_vocab ||
            ha->n_head != hb->n_head || ha->n_head_kv != hb->n_head_kv || ha->head_dim != hb->head_dim ||
            ha->n_ff != hb->n_ff || ds_ctx_n_taps(ca) != ds_ctx_n_taps(cb)) {
            ds_errf(err, errlen, "diverge: the two configurations run models of different shapes");
            return -1;
        }
    }
    r->fam_layers = m->hp.n_layer;
    r->fam_map = calloc((size_t)(m->hp.n_layer + 1) * DSD_CP_COUNT * (DSD_SUB_NAMED_COUNT + 1), sizeof(unsigned));
    if (!r->fam_map) { ds_errf(err, errlen, "diverge: out of memory"); return -1; }
    ds_kernel_set saved_a, saved_b;
    ds_ctx_get_kernels(ca, &saved_a);
    ds_ctx_get_kernels(cb, &saved_b);
    pass_out a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, b = { 0 };
    dsd_capture *cap_h = NULL, *cap_a = NULL, *cap_b = NULL;
    ds_state s0 = { 0 }, s0b = { 0 };
    ds_state *sb = cb == ca ? &s0 : &s0b;
    /* Arenas, one per device: the probed passes run one after another and
     * each is flushed before the next, so two sides on one device share. */
    ds_probe_arena arena_a = { 0 }, arena_b = { 0 };
    ds_probe_arena *ar_a = NULL, *ar_b = NULL;
    int rc = -1;

    /* S0: the true state — canonical prefill of the prompt (on each side) */
    if (make_s0(ca, o, &s0, err, errlen)) goto done;
    if (cb != ca && make_s0(cb, o, &s0b, err, errlen)) goto done;

    if (pass_alloc(&a0, ca, o->M) || pass_alloc(&a1, ca, o->M) || pass_alloc(&a2, ca, o->M) || pass_alloc(&b, cb, o->M) ||
        !(cap_h = capture_for(ca, o->M)) || !(cap_a = capture_for(ca, o->M)) || !(cap_b = capture_for(cb, o->M))) {
        ds_errf(err, errlen, "diverge: out of memory for the capture arenas");
        goto done;
    }
    if (arena_for(ca, o, path, &arena_a, err, errlen)) goto done;
    ar_a = arena_a.dev ? &arena_a : NULL;
    if (ds_ctx_exec(cb)->be == ds_ctx_exec(ca)->be) ar_b = ar_a;
    else {
        if (arena_for(cb, o, path, &arena_b, err, errlen)) goto done;
        ar_b = arena_b.dev ? &arena_b : NULL;
    }
    r->capture_arena = ar_a != NULL || ar_b != NULL;
    probe_ctx ph = { cap_h, o->n_prompt, r }, pa = { cap_a, o->n_prompt, r }, pb = { cap_b, o->n_prompt, r };
    ds_probe pr = { .wants = probe_wants_all, .fn = probe_to_capture, .user = &ph, .arena = ar_a };

    /* A0: no probe */
    double t0 = now_s();
    if (batch_pass(ca, o, &a0, err, errlen)) goto done;
    r->t_batch = now_s() - t0;
    ds_state_restore(ca, &s0);
    /* A1: hooks armed, nothing copied */
    dsd_capture_arm(cap_h, DSD_CAP_HOOKS);
    ds_ctx_set_probe(ca, &pr);
    if (batch_pass(ca, o, &a1, err, errlen) || ds_probe_flush(ds_ctx_exec(ca), &pr, err, errlen)) goto done;
    ds_state_restore(ca, &s0);
    /* A2: full copies — this is Pass A */
    dsd_capture_arm(cap_a, DSD_CAP_COPY);
    pr.user = &pa;
    ds_ctx_set_probe(ca, &pr);
    if (batch_pass(ca, o, &a2, err, errlen) || ds_probe_flush(ds_ctx_exec(ca), &pr, err, errlen)) goto done;
    ds_ctx_set_probe(ca, NULL);
    ds_state_restore(ca, &s0);
    r->gate_control = same_state(&a0, &a1) && same_logits(&a0, &a1);
    r->gate_probe = same_state(&a0, &a2) && same_logits(&a0, &a2);

    /* Pass B: the same ids on the other configuration, captured */
    dsd_capture_arm(cap_b, DSD_CAP_COPY);
    pr.user = &pb;
    pr.arena = ar_b;
    ds_ctx_set_probe(cb, &pr);
    if (pass_b(cb, o, ksb, &b, err, errlen) || ds_probe_flush(ds_ctx_exec(cb), &pr, err, errlen)) goto done;
    ds_ctx_set_probe(cb, NULL);
    ds_state_restore(cb, sb);
    /* an unprobed Pass B, for timing only */
    t0 = now_s();
    if (pass_b(cb, o, ksb, &a1, err, errlen)) goto done;
    r->t_decode = now_s() - t0;

    dsd_capture_finalize(cap_a);
    dsd_capture_finalize(cap_b);
    if (dsd_diff(cap_a, cap_b, &r->report) != DSD_OK) { ds_errf(err, errlen, "diverge: diff failed (out of memory)"); goto done; }

    /* the chain, from operators to bytes */
    int op_ok = 1;
    for (size_t i = 0; i < r->report.n_objects; i++)
        if (r->report.objects[i].diverged && dsd_cp_chain(r->report.objects[i].key.cp) == DSD_CHAIN_OPERATOR) op_ok = 0;
    r->chain[DSD_CHAIN_OPERATOR] = op_ok && dsd_report_identical(&r->report) ? 1 : op_ok;
    r->chain[DSD_CHAIN_STATE] = same_state(&a2, &b);
    r->chain[DSD_CHAIN_LOGITS] = same_logits(&a2, &b);
    const int V = m->hp.n_vocab;
    int greedy_ok = 1;
    for (int row = 0; row < o->M; row++)
        if (ds_argmax(a2.logits + (size_t)row * V, V) != ds_argmax(b.logits + (size_t)row * V, V)) {
            greedy_ok = 0;
            r->first_token_mismatch_row = row;
            break;
        }
    r->chain[DSD_CHAIN_GREEDY_TOKEN] = greedy_ok;
    /* bytes follow from tokens for a forced block of one step */
    r->chain[DSD_CHAIN_BYTES] = greedy_ok;
    rc = 0;
done:
    if (rc) { dsd_report_free(&r->report); free(r->fam_map); r->fam_map = NULL; }
    ds_ctx_set_probe(ca, NULL);
    ds_ctx_set_probe(cb, NULL);
    if (s0.snap.be) { ds_state_restore(ca, &s0); ds_state_free(&s0); }
    if (s0b.snap.be) { ds_state_restore(cb, &s0b); ds_state_free(&s0b); }
    ds_ctx_set_kernels(ca, &saved_a);
    ds_ctx_set_kernels(cb, &saved_b);
    pass_free(&a0); pass_free(&a1); pass_free(&a2); pass_free(&b);
    dsd_capture_free(cap_h); dsd_capture_free(cap_a); dsd_capture_free(cap_b);
    r->capture_downloads = arena_a.downloads + arena_b.downloads;
    r->capture_early = arena_a.early + arena_b.early;
    ds_probe_arena_free(&arena_a);
    ds_probe_arena_free(&arena_b);
    return rc;
}

int ds_diverge_run(ds_ctx *c, const ds_diverge_opts *o, ds_diverge_result *r, char *err, size_t errlen) {
    return diverge_core(c, c, o, NULL, DS_CAPTURE_AUTO, r, err, errlen);
}

int ds_diverge_run_path(ds_ctx *c, const ds_diverge_opts *o, ds_capture_path path, ds_diverge_result *r,
                        char *err, size_t errlen) {
    if (path != DS_CAPTURE_AUTO && path != DS_CAPTURE_ARENA && path != DS_CAPTURE_DIRECT) {
        memset(r, 0, sizeof *r);          /* freeable, as after any failed run */
        ds_errf(err, errlen, "diverge: capture path %d is not AUTO, ARENA or DIRECT", (int)path);
        return -1;
    }
    return diverge_core(c, c, o, NULL, path, r, err, errlen);
}

int ds_diverge_cross(ds_ctx *ca, ds_ctx *cb, const ds_diverge_opts *o, const ds_kernel_set *ksb,
                     ds_diverge_result *r, char *err, size_t errlen) {
    return diverge_core(ca, cb, o, ksb, DS_CAPTURE_AUTO, r, err, errlen);
}

void ds_diverge_result_free(ds_diverge_result *r) {
    dsd_report_free(&r->report);
    free(r->fam_map);
    r->fam_map = NULL;
}

/* ========================================================================
 * Isolated same-input A/B per family
 * ===================================================================== */

static void fill(float *x, size_t n, uint64_t seed, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = ds_uniform_pm1(&seed) * scale;
}

/* Find a weight of the given type in the model (largest input first). */
static const ds_weight *model_weight_of_type(const ds_model *m, uint32_t type) {
    for (int l = 0; l < m->hp.n_layer; l++) {
        const ds_layer *L = &m->layers[l];
        if (L->n_expert > 0 || L->recur) {   /* MoE: attention, router, experts in order; qwen35's mixer */
            const ds_weight *w;
            for (int i = 0; (w = ds_layer_weight((ds_layer *)L, i)); i++) if (w->type == type) return w;
            continue;
        }
        const ds_weight *ws[] = { &L->w_gate, &L->wq, &L->w_down, &L->wo, &L->wk, &L->wv, &L->w_up };
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) if (ws[i]->type == type) return ws[i];
    }
    if (m->output.type == type) return &m->output;
    return NULL;
}

int ds_model_uses_family(const ds_model *m, int fam) {
    if (fam < 0 || fam >= DS_FAM_COUNT) return 0;
    if (fam == DS_FAM_MOE_ROUTE) return m->hp.n_expert > 0;
    if (fam == DS_FAM_GDN) return m->hp.n_rec > 0;
    if (fam == DS_FAM_ATTN_SINKS || fam == DS_FAM_HC_PRE || fam == DS_FAM_HC_POST) return m->hp.arch == DS_ARCH_DEEPSEEK4;
    if (fam == DS_FAM_DS4_COMPRESS) return m->hp.n_comp > 0;
    if (fam == DS_FAM_DS4_INDEXER) return m->hp.n_csa > 0;
    if (fam == DS_FAM_TP_REDUCE) return 0;   /* a context without --tp runs no rank layout */
    if (m->hp.arch == DS_ARCH_DEEPSEEK4 && (fam == DS_FAM_ATTENTION || fam == DS_FAM_SWIGLU || fam == DS_FAM_RESIDUAL))
        return fam == DS_FAM_SWIGLU;     /* deepseek4 attends with attn_sinks and adds by hc_post */
    const int t = ds_family_weight_type(fam);
    if (t < 0) return 1;                 /* attention, norms, RoPE, SwiGLU, residual: every model */
    return model_weight_of_type(m, (uint32_t)t) != NULL;
}

/* The A/B runs on the context's device through the backend table, on
 * device buffers: the decode kernel row by row (canonical at M = 1) against
 * the variant under test over all M rows, compared on the host. */
typedef struct {
    ds_exec *ex;
    const ds_backend_i *b;
    float *dev[7];                          /* in1 in2 ref got w tmp: device   */
    int   *dpos;
} ab_dev;

static void ab_free(ab_dev *a) {
    for (int i = 0; i < 7; i++) if (a->dev[i]) a->b->release(a->ex->be, a->dev[i]);
    if (a->dpos) a->b->release(a->ex->be, a->dpos);
}

/* The gdn family's A/B (host memory): rows of [raw q|k|v, alpha, beta]
 * through the conv and the recurrence one row at a time from a zero state
 * (the decode kernel, its states carried in place) against all M rows in
 * one call of variant v; ref / got: the recurrence outputs. */
static int gdn_ab(const ds_backend_i *b, ds_exec *ex, const ds_gdn_shape *gs, ds_variant v, int M, const float *in,
                  float *ref, float *got, char *err, size_t errlen) {
    const size_t C = (size_t)gs->conv_dim, Hv = (size_t)gs->n_v_head, S = (size_t)gs->head_dim, vd = Hv * S;
    const size_t row = C + 2 * Hv, cs = (size_t)(gs->d_conv - 1) * C, ss = Hv * S * S;
    float *x = malloc(((size_t)M * (C + 2 * Hv) + C + 2 * Hv + 2 * (cs + ss)) * sizeof(float));
    float *w = malloc((C * (size_t)gs->d_conv + 2 * Hv) * sizeof(float));
    float **ptr = malloc(2 * (size_t)M * sizeof(float *));
    if (!x || !w || !ptr) { free(x); free(w); free(ptr); ds_errf(err, errlen, "families: out of memory"); return -1; }
    float *xc = x + (size_t)M * C, *al = xc + C, *be = al + Hv, *st = be + Hv;
    fill(w, C * (size_t)gs->d_conv, 77, 0.5f);
    float *dt = w + C * (size_t)gs->d_conv, *A = dt + Hv;
    for (size_t h = 0; h < Hv; h++) { dt[h] = 0.1f * (float)h; A[h] = -0.5f - 0.1f * (float)h; }
    for (int side = 0; side < 2; side++) {
        float *out = side ? got : ref;
        memset(st, 0, 2 * (cs + ss) * sizeof(float));
        if (!side) {   /* decode: one row a call, the state updated in place */
            for (int r = 0; r < M; r++) {
                const float *ir = in + (size_t)r * row;
                float *co[1] = {st}, *so[1] = {st + cs};
                b->gdn_conv(ex, DS_CANONICAL, gs, 1, ir, w, r ? st : NULL, co, xc);
                memcpy(al, ir + C, 2 * Hv * sizeof(float));
                b->gdn_recur(ex, DS_CANONICAL, gs, 1, xc, al, be, dt, A, r ? st + cs : NULL, so, out + (size_t)r * vd);
            }
        } else {       /* the batched call: M rows, the last state kept */
            float *X = x;
            float *AL = malloc(2 * (size_t)M * Hv * sizeof(float));
            float *XCb = malloc((size_t)M * C * sizeof(float));
            if (!AL || !XCb) { free(AL); free(XCb); free(x); free(w); free(ptr); ds_errf(err, errlen, "families: out of memory"); return -1; }
            for (int r = 0; r < M; r++) {
                memcpy(X + (size_t)r * C, in + (size_t)r * row, C * sizeof(float));
                memcpy(AL + (size_t)r * Hv, in + (size_t)r * row + C, Hv * sizeof(float));
                memcpy(AL + (size_t)(M + r) * Hv, in + (size_t)r * row + C + Hv, Hv * sizeof(float));
            }
            for (int r = 0; r < M; r++) ptr[r] = ptr[M + r] = NULL;
            ptr[M - 1] = st;
            ptr[2 * M - 1] = st + cs;
            b->gdn_conv(ex, v, gs, M, X, w, NULL, ptr, XCb);
            b->gdn_recur(ex, v, gs, M, XCb, AL, AL + (size_t)M * Hv, dt, A, NULL, ptr + M, out);
            free(AL);
            free(XCb);
        }
    }
    free(x);
    free(w);
    free(ptr);
    return 0;
}

int ds_family_ab_run(const ds_model *m, ds_exec *ex, int fam, ds_variant v, int m_max,
                     ds_family_ab *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    out->family = fam;
    out->variant = v;
    out->worst.first_mismatch = -1;
    if (!ex || ex->be != m->be) {
        ds_errf(err, errlen, "families: the execution context is not on the model's device");
        return -1;
    }
    const ds_backend_i *b = ex->be->i;
    const ds_hparams *hp = &m->hp;
    const int d = hp->n_embd, hd = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv, ff = hp->n_ff;
    int K = d, N = d;
    ds_weight synth = { 0 };
    void *synth_data = NULL;
    const ds_weight *W = NULL;
    const int is_mm = ds_family_weight_type(fam) >= 0;
    if (is_mm) {
        uint32_t t = (uint32_t)ds_family_weight_type(fam);
        W = model_weight_of_type(m, t);
        if (!W) {
            /* synthetic weight at the model's FFN shape, prepared on the device */
            const int blk = (int)ds_type_block_elems(t);
            K = d - d % blk ? d - d % blk : blk;
            N = ff;
            int ok;
            uint64_t rb = ds_row_bytes(t, (uint64_t)K, &ok);
            float *f = malloc((size_t)K * N * sizeof(float));
            synth_data = malloc(rb * (uint64_t)N);
            if (!f || !synth_data) { free(f); free(synth_data); ds_errf(err, errlen, "families: out of memory"); return -1; }
            fill(f, (size_t)K * N, 99, 0.1f);
            ds_f32_to_type(t, f, (int64_t)K * N, synth_data);
            free(f);
            synth = (ds_weight){ t, K, N, synth_data, NULL };
            if (b->prepare_weight(ex->be, &synth, DS_USE_MATMUL, err, errlen)) { free(synth_data); return -1; }
            W = &synth;
            out->synthetic = 1;
        }
        K = (int)W->n_in;
        N = (int)W->n_out;
    }
    /* tp_reduce: the layout of an o_proj-shaped F32 matmul [d][K] over two
     * ranks. ref: the whole weight (decode, = --tp 1); canonical: the two
     * ranks' row halves (complete dot products) put side by side, as the
     * all-gather does; fast: the two K halves (row-parallel), the partial
     * sums added in rank order, as the all-reduce does. */
    ds_weight tpw[4];                       /* rows 0, rows 1, K half 0, K half 1 */
    float *tp_data = NULL;
    int tp_n = 0;
    memset(tpw, 0, sizeof tpw);
    if (fam == DS_FAM_TP_REDUCE) {
        if (!b->add) {
            ds_errf(err, errlen, "families: the %s device has no add kernel (tp_reduce's rank-order sum)", b->name);
            return -1;
        }
        K = d - d % 64 ? d - d % 64 : 64;
        N = d - d % 2;
        const size_t kn = (size_t)K * N, h = (size_t)K / 2;
        tp_data = malloc(2 * kn * sizeof(float));
        if (!tp_data) { ds_errf(err, errlen, "families: out of memory"); return -1; }
        fill(tp_data, kn, 98, 0.1f);
        float *kh = tp_data + kn;                /* the K halves, each [N][K/2] */
        for (size_t r = 0; r < (size_t)N; r++)
            for (size_t i = 0; i < (size_t)K; i++) kh[(i < h ? 0 : kn / 2) + r * h + i % h] = tp_data[r * K + i];
        synth = (ds_weight){ DS_TYPE_F32, K, N, tp_data, NULL };
        tpw[0] = (ds_weight){ DS_TYPE_F32, K, N / 2, tp_data, NULL };
        tpw[1] = (ds_weight){ DS_TYPE_F32, K, N / 2, tp_data + (size_t)(N / 2) * K, NULL };
        tpw[2] = (ds_weight){ DS_TYPE_F32, K / 2, N, kh, NULL };
        tpw[3] = (ds_weight){ DS_TYPE_F32, K / 2, N, kh + kn / 2, NULL };
        if (b->prepare_weight(ex->be, &synth, DS_USE_MATMUL, err, errlen)) { free(tp_data); return -1; }
        for (; tp_n < 4; tp_n++)
            if (b->prepare_weight(ex->be, &tpw[tp_n], DS_USE_MATMUL, err, errlen)) {
                b->release_weight(ex->be, &synth);
                for (int i = 0; i < tp_n; i++) b->release_weight(ex->be, &tpw[i]);
                free(tp_data);
                return -1;
            }
        W = &synth;
        out->synthetic = 1;
    }
    /* buffer sizes: the largest object any family touches, m_max rows */
    const int n_kv = 160;                     /* cache positions for attention: spans two chunks */
    size_t row_in = (size_t)(is_mm || W ? K : (fam == DS_FAM_SWIGLU ? ff : (fam == DS_FAM_ATTENTION || fam == DS_FAM_ROPE ? H * hd : d)));
    size_t row_out = (size_t)(is_mm || W ? N : (fam == DS_FAM_SWIGLU ? ff : (fam == DS_FAM_ATTENTION || fam == DS_FAM_ROPE ? H * hd : d)));
    /* moe_route: the model's router shape (a 64-expert, top-8 one for a
     * dense model); in: logits (room for the route's 2k), out: k weights
     * then the k expert ids as floats */
    const int n_exp = hp->n_expert > 0 ? hp->n_expert : 64, k_exp = hp->n_expert > 0 ? hp->n_expert_used : 8;
    if (fam == DS_FAM_MOE_ROUTE) {
        if (!b->moe_route) {
            ds_errf(err, errlen, "families: the %s device has no moe_route kernel", b->name);
            return -1;
        }
        row_in = 2 * (size_t)n_exp;
        row_out = 2 * (size_t)k_exp;
    }
    /* gdn: the model's recurrent shape (a small synthetic one for a model
     * without); out: the recurrence's output rows */
    ds_gdn_shape gs = ds_hp_layer_shape(hp).gdn;
    if (hp->n_rec <= 0) gs = (ds_gdn_shape){.n_k_head = 2, .n_v_head = 4, .head_dim = 32, .d_conv = 4, .conv_dim = 8 * 32,
                                            .eps = hp->norm_eps};
    if (fam == DS_FAM_GDN) {
        if (!b->gdn_conv || !b->gdn_recur || !b->host_memory) {
            ds_errf(err, errlen, "families: the %s device has no gdn kernel", b->name);
            return -1;
        }
        row_in = (size_t)gs.conv_dim + 2 * (size_t)gs.n_v_head;
        row_out = (size_t)gs.n_v_head * gs.head_dim;
    }
    /* deepseek4's families: the model's shapes (a 4-stream, 64-wide one for
     * another model); attn_sinks: the attention's rows with sinks and the
     * model's window; hc_pre: in x [hc][d], mixes in in2, out y [d]; hc_post:
     * in res [hc][d], f / post / comb in in2, out [hc][d] */
    const int hcn = hp->hc > 0 ? hp->hc : 4, hdd = hp->hc > 0 ? d : 64, mixn = (2 + hcn) * hcn;
    if (fam == DS_FAM_ATTN_SINKS || fam == DS_FAM_HC_PRE || fam == DS_FAM_HC_POST) {
        if (!b->attn_sinks || !b->hc_pre || !b->hc_post) {
            ds_errf(err, errlen, "families: the %s device has no %s kernel", b->name, ds_family_name(fam));
            return -1;
        }
        if (fam == DS_FAM_ATTN_SINKS) row_in = row_out = (size_t)H * hd;
        else row_in = (size_t)hcn * hdd + (size_t)mixn;
        if (fam == DS_FAM_HC_PRE) row_out = (size_t)hdd;
        if (fam == DS_FAM_HC_POST) row_out = (size_t)hcn * hdd;
    }
    /* ds4_compress: one HCA block a row, DS4_AB_N entries of hd values then
     * DS4_AB_N of scores in in1; out the pooled row (host-memory devices) */
    enum { DS4_AB_N = 128 };
    if (fam == DS_FAM_DS4_COMPRESS) {
        if (!b->ds4_compress || !b->host_memory) {
            ds_errf(err, errlen, "families: the %s device has no ds4_compress kernel", b->name);
            return -1;
        }
        row_in = 2 * (size_t)DS4_AB_N * hd;
        row_out = (size_t)hd;
    }
    /* ds4_indexer: a row's queries [nih][ihd], head weights [nih] and
     * DS4_AB_N block keys [ihd] in in1; out its kept scores then its
     * selection (as floats) */
    const int ab_nih = hp->idx_heads > 0 ? hp->idx_heads : 4, ab_ihd = hp->idx_dim > 0 ? hp->idx_dim : 64;
    const int ab_tk = hp->idx_top_k > 0 && hp->idx_top_k < 16 ? hp->idx_top_k : 16;
    if (fam == DS_FAM_DS4_INDEXER) {
        if (!b->ds4_indexer || !b->host_memory) {
            ds_errf(err, errlen, "families: the %s device has no ds4_indexer kernel", b->name);
            return -1;
        }
        row_in = (size_t)ab_nih * ab_ihd + (size_t)ab_nih + (size_t)DS4_AB_N * ab_ihd;
        row_out = 2 * (size_t)ab_tk;
    }
    size_t cache = (size_t)n_kv * Hkv * hd;
    size_t wn = (size_t)(d > hd ? d : hd);
    if (wn < (size_t)mixn + 3 || wn < (size_t)H) wn = (size_t)(mixn + 3 > H ? mixn + 3 : H);
    const size_t n[7] = { (size_t)m_max * row_in, (size_t)m_max * row_in + 2 * cache, (size_t)m_max * row_out,
                          (size_t)m_max * row_out, wn, (size_t)m_max * row_in + 1, 0 };
    float *in1 = malloc(n[0] * sizeof(float)), *in2 = malloc(n[1] * sizeof(float));
    float *ref = malloc(n[2] * sizeof(float)), *got = malloc(n[3] * sizeof(float));
    float *w = malloc(wn * sizeof(float));
    int *pos = malloc((size_t)m_max * sizeof(int));
    ab_dev a = { .ex = ex, .b = b };
    int ok = in1 && in2 && ref && got && w && pos;
    for (int i = 0; i < 6 && ok; i++) ok = (a.dev[i] = b->alloc(ex->be, n[i] * sizeof(float))) != NULL;
    /* positions, then an identity page table for the contiguous cache below
     * (page i = positions 16i..16i+15: the rows are where they always were) */
    enum { AB_PAGES = 16 };
    if (ok) ok = (a.dpos = b->alloc(ex->be, ((size_t)m_max + AB_PAGES) * sizeof(int))) != NULL;
    int rc = -1;
    if (!ok) { ds_errf(err, errlen, "families: out of memory"); goto done; }
    float *d_in1 = a.dev[0], *d_in2 = a.dev[1], *d_ref = a.dev[2], *d_got = a.dev[3], *d_w = a.dev[4], *d_tmp = a.dev[5];
    fill(w, wn, 5, 0.5f);
    for (size_t i = 0; i < wn; i++) w[i] += 1.0f;
    b->upload(ex, d_w, w, wn * sizeof(float));
    {
        int32_t idt[AB_PAGES];
        for (int i = 0; i < AB_PAGES; i++) idt[i] = i;
        b->upload(ex, a.dpos + m_max, idt, sizeof idt);
    }
    const ds_rows rw = {.pos = a.dpos, .tables = a.dpos + m_max, .max_pages = AB_PAGES, .page = DS_KV_PAGE,
                        .page_stride = (int64_t)DS_KV_PAGE * Hkv * hd};
    double worst_frac = -1.0;
    for (int M = 1; M <= m_max; M++) {
        fill(in1, (size_t)M * row_in, 1000 + (uint64_t)M, fam == DS_FAM_SWIGLU ? 4.0f : 1.0f);
        fill(in2, (size_t)M * row_in + 2 * cache, 2000 + (uint64_t)M, 1.0f);
        for (int r = 0; r < M; r++) pos[r] = n_kv - M + r;
        if (fam == DS_FAM_MOE_ROUTE)   /* a near-tie at the top of every row: where expert choices flip */
            for (int r = 0; r < M; r++) {
                float *lr = in1 + (size_t)r * n_exp;      /* rows of n_exp logits, back to back */
                int i0 = 0;
                for (int i = 1; i < n_exp; i++) if (lr[i] > lr[i0]) i0 = i;
                lr[(i0 + 1 + r) % n_exp] = nextafterf(lr[i0], (r & 1) ? INFINITY : -INFINITY);
            }
        b->upload(ex, d_in1, in1, (size_t)M * row_in * sizeof(float));
        b->upload(ex, d_in2, in2, ((size_t)M * row_in + 2 * cache) * sizeof(float));
        b->upload(ex, a.dpos, pos, (size_t)M * sizeof(int));
        /* reference: the decode kernel row by row; got: the batched variant */
        switch (fam) {
        case DS_FAM_MATMUL_F32: case DS_FAM_MATMUL_F16: case DS_FAM_MATMUL_BF16: case DS_FAM_MATMUL_Q8_0:
        case DS_FAM_MATMUL_Q4_0: case DS_FAM_MATMUL_Q4_1: case DS_FAM_MATMUL_Q5_0: case DS_FAM_MATMUL_Q5_1:
        case DS_FAM_MATMUL_Q4_K: case DS_FAM_MATMUL_Q5_K: case DS_FAM_MATMUL_Q6_K:
            for (int r = 0; r < M; r++) b->matmul(ex, DS_CANONICAL, W, 1, d_in1 + (size_t)r * K, d_ref + (size_t)r * N);
            b->matmul(ex, v, W, M, d_in1, d_got);
            break;
        case DS_FAM_ATTENTION: {
            ds_attn_shape s = { H, Hkv, hd, Hkv * hd, 1.0f / sqrtf((float)hd) };
            const float *kc = d_in2 + (size_t)M * row_in, *vc = kc + cache;
            for (int r = 0; r < M; r++) {
                ds_rows one = rw;
                one.pos = a.dpos + r;
                b->attention(ex, DS_CANONICAL, &s, 1, &one, d_in1 + (size_t)r * H * hd, kc, vc, d_ref + (size_t)r * H * hd);
            }
            b->attention(ex, v, &s, M, &rw, d_in1, kc, vc, d_got);
            break;
        }
        case DS_FAM_RMSNORM:
            for (int r = 0; r < M; r++) b->rmsnorm(ex, DS_CANONICAL, 1, d, d_in1 + (size_t)r * d, d_w, hp->norm_eps, d_ref + (size_t)r * d);
            b->rmsnorm(ex, v, M, d, d_in1, d_w, hp->norm_eps, d_got);
            break;
        case DS_FAM_ROPE: {
            ds_rope_mode mode = ds_arch_rope(hp->arch);
            b->copy(ex, d_ref, d_in1, (size_t)M * row_in * sizeof(float));
            b->copy(ex, d_got, d_in1, (size_t)M * row_in * sizeof(float));
            const ds_rope_yarn *ry = hp->rope_scaled ? &hp->rope_yarn : NULL;   /* the model's rope scaling */
            for (int r = 0; r < M; r++) {
                float *dr = d_ref + (size_t)r * H * hd;
                if (ry) b->rope_ext(ex, DS_CANONICAL, 1, H, hd, a.dpos + r, hp->rope_base, mode, ry, dr);
                else b->rope(ex, DS_CANONICAL, 1, H, hd, a.dpos + r, hp->rope_base, mode, dr);
            }
            if (ry) b->rope_ext(ex, v, M, H, hd, a.dpos, hp->rope_base, mode, ry, d_got);
            else b->rope(ex, v, M, H, hd, a.dpos, hp->rope_base, mode, d_got);
            break;
        }
        case DS_FAM_SWIGLU:
            for (int r = 0; r < M; r++) b->swiglu(ex, DS_CANONICAL, 1, ff, d_in1 + (size_t)r * ff, d_in2 + (size_t)r * ff, d_ref + (size_t)r * ff);
            b->swiglu(ex, v, M, ff, d_in1, d_in2, d_got);
            break;
        case DS_FAM_RESIDUAL:
            /* compare the epilogue's norm output: that is where it shows */
            b->copy(ex, d_tmp, d_in1, (size_t)M * d * sizeof(float));
            for (int r = 0; r < M; r++)
                b->residual(ex, DS_CANONICAL, DS_CANONICAL, 1, d, d_tmp + (size_t)r * d, d_in2 + (size_t)r * d, d_w, hp->norm_eps, d_ref + (size_t)r * d);
            b->copy(ex, d_tmp, d_in1, (size_t)M * d * sizeof(float));
            b->residual(ex, v, DS_CANONICAL, M, d, d_tmp, d_in2, d_w, hp->norm_eps, d_got);
            break;
        case DS_FAM_MOE_ROUTE: {
            /* ids and weights of both runs, then the rows rebuilt as
             * [weights, ids as floats] in d_ref / d_got for the comparison */
            const size_t kk = (size_t)k_exp;
            int32_t *ids_dev = (int32_t *)d_tmp;
            for (int r = 0; r < M; r++)
                b->moe_route(ex, DS_CANONICAL, 1, n_exp, k_exp, 1, d_in1 + (size_t)r * n_exp, ids_dev + (size_t)r * kk,
                             d_ref + (size_t)r * kk);
            b->moe_route(ex, v, M, n_exp, k_exp, 1, d_in1, ids_dev + (size_t)M * kk, d_got);
            int32_t *idh = malloc(2 * (size_t)M * kk * sizeof(int32_t));
            float *wh = malloc(2 * (size_t)M * kk * sizeof(float));
            if (!idh || !wh) { free(idh); free(wh); ds_errf(err, errlen, "families: out of memory"); goto done; }
            b->download(ex, idh, ids_dev, 2 * (size_t)M * kk * sizeof(int32_t));
            b->download(ex, wh, d_ref, (size_t)M * kk * sizeof(float));
            b->download(ex, wh + (size_t)M * kk, d_got, (size_t)M * kk * sizeof(float));
            for (int side = 0; side < 2; side++) {
                float *dst = side ? got : ref;
                for (int r = 0; r < M; r++)
                    for (size_t j = 0; j < kk; j++) {
                        dst[(size_t)r * 2 * kk + j] = wh[(size_t)side * M * kk + (size_t)r * kk + j];
                        dst[(size_t)r * 2 * kk + kk + j] = (float)idh[(size_t)side * M * kk + (size_t)r * kk + j];
                    }
                b->upload(ex, side ? d_got : d_ref, dst, (size_t)M * 2 * kk * sizeof(float));
            }
            free(idh);
            free(wh);
            break;
        }
        case DS_FAM_ATTN_SINKS: {
            ds_attn_shape s = { H, Hkv, hd, Hkv * hd, 1.0f / sqrtf((float)hd) };
            const float *kc = d_in2 + (size_t)M * row_in, *vc = kc + cache;
            for (int r = 0; r < M; r++) {
                ds_rows one = rw;
                one.pos = a.dpos + r;
                b->attn_sinks(ex, DS_CANONICAL, &s, 1, &one, hp->n_swa, NULL, d_w, d_in1 + (size_t)r * H * hd, kc, vc,
                              d_ref + (size_t)r * H * hd);
            }
            b->attn_sinks(ex, v, &s, M, &rw, hp->n_swa, NULL, d_w, d_in1, kc, vc, d_got);
            break;
        }
        case DS_FAM_DS4_COMPRESS: {
            const size_t nn = DS4_AB_N, hw = (size_t)hd;
            const float **pk = malloc(2 * (size_t)M * nn * sizeof *pk);
            if (!pk) { ds_errf(err, errlen, "families: out of memory"); goto done; }
            const float **ps = pk + (size_t)M * nn;
            for (size_t r = 0; r < (size_t)M; r++)
                for (size_t j = 0; j < nn; j++) {
                    pk[r * nn + j] = d_in1 + r * row_in + j * hw;
                    ps[r * nn + j] = d_in1 + r * row_in + (nn + j) * hw;
                }
            for (int r = 0; r < M; r++)
                b->ds4_compress(ex, DS_CANONICAL, 1, (int)nn, hd, pk + (size_t)r * nn, ps + (size_t)r * nn, d_ref + (size_t)r * hw);
            b->ds4_compress(ex, v, M, (int)nn, hd, pk, ps, d_got);
            free(pk);
            break;
        }
        case DS_FAM_DS4_INDEXER: {
            const size_t qn = (size_t)ab_nih * ab_ihd, tk = (size_t)ab_tk;
            int32_t *ib = malloc(4 * (size_t)M * sizeof(int32_t) + 2 * (size_t)M * tk * sizeof(int32_t));
            float *sc = malloc(2 * (size_t)M * tk * sizeof(float));
            if (!ib || !sc) { free(ib); free(sc); ds_errf(err, errlen, "families: out of memory"); goto done; }
            int32_t *nblk = ib, *nsel = ib + M, *sel = ib + 2 * (size_t)M + 2 * (size_t)M;
            for (int r = 0; r < M; r++) nblk[r] = DS4_AB_N;
            for (int side = 0; side < 2; side++) {
                float *dst = side ? d_got : d_ref;
                int32_t *sl = sel + (size_t)side * M * tk;
                float *scs = sc + (size_t)side * M * tk;
                for (int r = 0; r < M; r++) {
                    ab_keys k = {d_in1 + (size_t)r * row_in, row_in, qn + (size_t)ab_nih, ab_ihd};
                    if (side == 0)
                        b->ds4_indexer(ex, DS_CANONICAL, 1, ab_nih, ab_ihd, k.base, k.base + qn, nblk + r, ab_key, &k,
                                       ab_tk, sl + (size_t)r * tk, nsel + r, scs + (size_t)r * tk);
                }
                if (side == 1) {
                    ab_keys k = {d_in1, row_in, qn + (size_t)ab_nih, ab_ihd};
                    /* the batch: every row's queries / weights are strided in in1; run row by row
                     * through the M-row entry with a per-row key view */
                    float *q = malloc((size_t)M * (qn + (size_t)ab_nih) * sizeof(float));
                    if (!q) { free(ib); free(sc); ds_errf(err, errlen, "families: out of memory"); goto done; }
                    for (int r = 0; r < M; r++) {
                        memcpy(q + (size_t)r * qn, d_in1 + (size_t)r * row_in, qn * sizeof(float));
                        memcpy(q + (size_t)M * qn + (size_t)r * ab_nih, d_in1 + (size_t)r * row_in + qn,
                               (size_t)ab_nih * sizeof(float));
                    }
                    b->ds4_indexer(ex, v, M, ab_nih, ab_ihd, q, q + (size_t)M * qn, nblk, ab_key, &k, ab_tk, sl,
                                   nsel + M, scs);
                    free(q);
                }
                for (int r = 0; r < M; r++)
                    for (size_t j = 0; j < tk; j++) {
                        dst[(size_t)r * row_out + j] = scs[(size_t)r * tk + j];
                        dst[(size_t)r * row_out + tk + j] = (float)sl[(size_t)r * tk + j];
                    }
            }
            free(ib);
            free(sc);
            break;
        }
        case DS_FAM_HC_PRE: {
            /* x: in1 as [M][hc][d]; mixes: in2 as [M][n_mix]; scale and
             * base: the weight vector; post / comb: d_tmp */
            const float *sc = d_w, *bs = d_w + 3;
            float *post = d_tmp, *comb = d_tmp + (size_t)M * hcn;
            for (int r = 0; r < M; r++)
                b->hc_pre(ex, DS_CANONICAL, 1, hcn, hdd, mixn, d_in1 + (size_t)r * hcn * hdd, d_in2 + (size_t)r * mixn, sc, bs,
                          1e-6f, hp->hc_iters > 0 ? hp->hc_iters : 20, d_ref + (size_t)r * hdd, post, comb);
            b->hc_pre(ex, v, M, hcn, hdd, mixn, d_in1, d_in2, sc, bs, 1e-6f, hp->hc_iters > 0 ? hp->hc_iters : 20, d_got,
                      post, comb);
            break;
        }
        case DS_FAM_HC_POST: {
            /* res: in1 [M][hc d]; f [M][d], post [M][hc], comb [M][hc hc] from in2 */
            const float *f = d_in2, *post = d_in2 + (size_t)M * hdd, *comb = post + (size_t)M * hcn;
            for (int r = 0; r < M; r++)
                b->hc_post(ex, DS_CANONICAL, 1, hcn, hdd, f + (size_t)r * hdd, d_in1 + (size_t)r * hcn * hdd,
                           post + (size_t)r * hcn, comb + (size_t)r * hcn * hcn, d_ref + (size_t)r * row_out);
            b->hc_post(ex, v, M, hcn, hdd, f, d_in1, post, comb, d_got);
            break;
        }
        case DS_FAM_TP_REDUCE: {
            const size_t hb = (size_t)(K / 2) * sizeof(float), nb = (size_t)(N / 2) * sizeof(float);
            for (int r = 0; r < M; r++)
                b->matmul(ex, DS_CANONICAL, W, 1, d_in1 + (size_t)r * K, d_ref + (size_t)r * N);
            if (v == DS_CANONICAL) {        /* each rank its rows, gathered side by side */
                for (int k = 0; k < 2; k++) {
                    b->matmul(ex, DS_CANONICAL, &tpw[k], M, d_in1, d_tmp);
                    ds_backend_copy2d(ex, d_got + (size_t)k * (N / 2), (size_t)N * sizeof(float), d_tmp, nb, nb, (size_t)M);
                }
            } else {                        /* each rank its K half, the partials summed rank 0 + rank 1 */
                ds_backend_copy2d(ex, d_tmp, hb, d_in1, 2 * hb, hb, (size_t)M);
                ds_backend_copy2d(ex, d_tmp + (size_t)M * (K / 2), hb, d_in1 + K / 2, 2 * hb, hb, (size_t)M);
                b->matmul(ex, DS_CANONICAL, &tpw[2], M, d_tmp, d_got);
                b->matmul(ex, DS_CANONICAL, &tpw[3], M, d_tmp + (size_t)M * (K / 2), d_in2);
                b->add(ex, (int64_t)M * N, d_got, d_in2, d_got);
            }
            break;
        }
        case DS_FAM_GDN:
            if (gdn_ab(b, ex, &gs, v, M, in1, ref, got, err, errlen)) goto done;
            b->upload(ex, d_ref, ref, (size_t)M * row_out * sizeof(float));
            b->upload(ex, d_got, got, (size_t)M * row_out * sizeof(float));
            break;
        default:
            ds_errf(err, errlen, "families: unknown family %d", fam);
            goto done;
        }
        b->download(ex, ref, d_ref, (size_t)M * row_out * sizeof(float));
        b->download(ex, got, d_got, (size_t)M * row_out * sizeof(float));
        if (b->sync(ex, err, errlen)) goto done;
        dsd_metrics mt;
        dsd_compare(got, ref, (size_t)M * row_out, &mt);
        if (!mt.bit_exact) {
            out->proven_different = 1;
            out->differing_widths++;
        }
        if (mt.mismatch_fraction > worst_frac) { worst_frac = mt.mismatch_fraction; out->worst = mt; }
    }
    rc = 0;
done:
    ab_free(&a);
    if (synth_data || tp_data) b->release_weight(ex->be, &synth);
    for (int i = 0; i < tp_n; i++) b->release_weight(ex->be, &tpw[i]);
    free(tp_data);
    free(in1); free(in2); free(ref); free(got); free(w); free(pos); free(synth_data);
    return rc;
}
