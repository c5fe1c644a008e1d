/* tp.c — the tensor-parallel plan and its forward (tp.h, docs/TP.md).
 *
 * Why the bits do not depend on N (the canonical tp_reduce layout): every
 * output of every matmul is one complete dot product over the full K,
 * computed by the canonical kernel on the weight's own row — a rank's slice
 * holds whole rows, and a canonical output's bits are a function of its row
 * and the input row alone (threads split outputs, never reductions, and the
 * packed tiles' last-tile padding never reaches a real row). Attention,
 * QK-norm and RoPE are per head; SwiGLU is elementwise; the norms and the
 * residual run on the full rows on every rank. What crosses ranks is only
 * ever copied (all_gather). So rank r's slice of every activation is the
 * TP = 1 activation's slice, bit for bit, for every N that divides.
 *
 * Why the fast layout's bits differ: o_proj and down split by K make each
 * output the sum of N partial dot products (each a canonical chain over
 * K / N), added in the communicator's order — a different rounding
 * sequence from the single chain over K, changing with N.
 *
 * Execution: the ranks' ops are issued phase by phase (all ranks' work up
 * to a collective, the collective for all ranks at once, the next phase),
 * the shape a single thread driving N devices needs (comm.h). Each rank
 * names its own backend and execution context (tp_rank.be / .ex) and every
 * op, buffer, weight slice and KV pool of a rank goes through them — no
 * host pointer into an activation, no host read of device memory, so the
 * same plan runs on host memory (the `cpu` fake) and on a device (the `dev`
 * communicator: N ranks on one GPU). Today every rank's be / ex is the
 * model's backend and the context's one execution context: the ranks share
 * it and run one after the other; one backend and context per GPU is the
 * multi-GPU step (docs/TP.md). */
#include "tp.h"
#include "dspark_diag.h"

#include <math.h>
#include <stdio.h>   /* snprintf */
#include <stdlib.h>
#include <string.h>

typedef struct {
    /* column slices: rows of the full weight (views of its data, prepared) */
    ds_weight wq, wk, wv, wo, w_gate, w_up, w_down;
    /* the fast layout's K slices of o_proj and down (copies: a K range of
     * every row is not contiguous), or n_out == 0 when not available */
    ds_weight wo_k, w_down_k;
    void *wo_k_data, *w_down_k_data;
} tp_layer;

typedef struct {
    ds_backend *be;              /* the device the rank's memory lives on    */
    ds_exec    *ex;              /* the context its ops are queued on        */
    tp_layer  *L;                /* [n_layer]                               */
    ds_kvpool *pool;             /* its KV heads' rows                      */
    ds_rows    rows;             /* the call's rows with this pool's stride */
    /* x, xn, o: full rows [m][d]; q / att [m][qd_r]; k, v [m][kvd_r];
     * gate, up, h [m][ff_r]; part: a matmul's slice [m][d_r] or a fast
     * partial sum [m][d]; full: a gathered [m][max(qd, ff)]; stage: a
     * collective's rank-major receive buffer [m][max(qd, ff, d)] */
    float *x, *xn, *o, *q, *k, *v, *att, *gate, *up, *h, *part, *full, *stage;
} tp_rank;

struct ds_tp {
    const ds_model *m;
    ds_exec   *ex;               /* the context's (rank 0's): probes, taps    */
    ds_comm   *comm;
    int        n, m_max;
    int        hr, hkvr;         /* heads, KV heads per rank                 */
    int        fast_ok;          /* the K slices exist                       */
    char       fast_why[160];    /* why not                                   */
    tp_rank    rk[DS_TP_MAX];
    float     *kv_tmp;           /* ds_tp_read_kv: one position of one rank  */
    ds_tp_stats st;              /* collectives issued so far                */
    int        failed;
    char       err[DS_ERRLEN];
};

/* ========================================================================
 * The plan: what divides, and each rank's slices
 * ===================================================================== */

int ds_tp_check(const ds_model *m, int n, char *err, size_t errlen) {
    const ds_hparams *hp = &m->hp;
    if (n < 1 || n > DS_TP_MAX) {
        ds_errf(err, errlen, "--tp %d is out of range (1..%d)", n, DS_TP_MAX);
        return -1;
    }
    if (n > 1 && !ds_backend_path_on(m->be, "tp")) {
        ds_errf(err, errlen, "--tp %d on %s has not run on a GPU yet (DSPARK_CUDA_ON=tp to try it; --device cpu)", n,
                m->be->i->name);
        return -1;
    }
    if (hp->arch != DS_ARCH_QWEN3 && hp->arch != DS_ARCH_LLAMA) {
        ds_errf(err, errlen, "--tp %d: %s models have no tensor-parallel layout (dense qwen3 / llama only)", n,
                ds_arch_name(hp->arch));
        return -1;
    }
    if (hp->n_expert > 0 || hp->n_rec > 0 || hp->hc > 0) {
        ds_errf(err, errlen, "--tp %d: mixture-of-experts, hybrid and hyper-connection layers have no tensor-parallel layout",
                n);
        return -1;
    }
    if (hp->n_head_kv % n) {
        ds_errf(err, errlen, "--tp %d does not divide the %d KV heads (a rank owns whole KV heads and their query heads)", n,
                hp->n_head_kv);
        return -1;
    }
    /* every slice whole tiles of DS_TP_ROW_ALIGN rows (q/k/v by heads;
     * o_proj and down by n_embd, gate and up by n_ff) */
    const int hd = hp->head_dim;
    const struct { const char *what; int rows; } sl[] = {
        {"the query heads' rows", hp->n_head * hd}, {"the KV heads' rows", hp->n_head_kv * hd},
        {"n_embd (o_proj and down rows)", hp->n_embd}, {"n_ff (gate and up rows)", hp->n_ff},
    };
    for (size_t i = 0; i < sizeof sl / sizeof sl[0]; i++)
        if (sl[i].rows % n || (sl[i].rows / n) % DS_TP_ROW_ALIGN) {
            ds_errf(err, errlen, "--tp %d: %s, %d, do not split into %d slices of a multiple of %d rows", n, sl[i].what,
                    sl[i].rows, n, DS_TP_ROW_ALIGN);
            return -1;
        }
    return 0;
}

/* Rows [r0, r0 + rows) of W as a weight of its own, prepared for the device. */
static int slice_rows(ds_backend *be, const ds_weight *W, int64_t r0, int64_t rows, ds_weight *out, char *err,
                      size_t errlen) {
    int ok;
    const uint64_t rb = ds_row_bytes(W->type, (uint64_t)W->n_in, &ok);
    *out = (ds_weight){W->type, W->n_in, rows, (const unsigned char *)W->data + (uint64_t)r0 * rb, NULL};
    return be->i->prepare_weight(be, out, DS_USE_MATMUL, err, errlen);
}

/* Columns [k0, k0 + kn) of every row of W (k0, kn whole blocks of the
 * type) copied into *data and prepared. W->data is the loaded file's host
 * bytes on every backend (a device's prepare_weight uploads from them; the
 * mapping lives as long as the model), so this copy is host to host. */
static int slice_cols(ds_backend *be, const ds_weight *W, int64_t k0, int64_t kn, ds_weight *out, void **data,
                      char *err, size_t errlen) {
    int ok;
    const uint64_t rb = ds_row_bytes(W->type, (uint64_t)W->n_in, &ok), off = ds_row_bytes(W->type, (uint64_t)k0, &ok),
                   nb = ds_row_bytes(W->type, (uint64_t)kn, &ok);
    unsigned char *d = malloc(nb * (uint64_t)W->n_out);
    if (!d) { ds_errf(err, errlen, "--tp: out of memory for a K slice"); return -1; }
    for (int64_t r = 0; r < W->n_out; r++) memcpy(d + (uint64_t)r * nb, (const unsigned char *)W->data + (uint64_t)r * rb + off, nb);
    *data = d;
    *out = (ds_weight){W->type, kn, W->n_out, d, NULL};
    return be->i->prepare_weight(be, out, DS_USE_MATMUL, err, errlen);
}

static ds_weight *layer_w(tp_layer *L, int i) {
    ds_weight *const w[9] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->wo_k, &L->w_down_k};
    return i < 9 ? w[i] : NULL;
}

void ds_tp_free(ds_tp *t) {
    if (!t) return;
    for (int r = 0; r < t->n; r++) {
        tp_rank *k = &t->rk[r];
        ds_backend *be = k->be;
        if (!be) continue;
        if (k->L) {
            for (int l = 0; l < t->m->hp.n_layer; l++) {
                ds_weight *w;
                for (int i = 0; (w = layer_w(&k->L[l], i)); i++)
                    if (w->extra) be->i->release_weight(be, w);
                free(k->L[l].wo_k_data);
                free(k->L[l].w_down_k_data);
            }
            free(k->L);
        }
        float *bufs[] = {k->x, k->xn, k->o, k->q, k->k, k->v, k->att, k->gate, k->up, k->h, k->part, k->full, k->stage};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) be->i->release(be, bufs[i]);
        ds_kvpool_free(k->pool);
    }
    ds_comm_free(t->comm);
    free(t->kv_tmp);
    free(t);
}

int ds_tp_ranks(const ds_tp *t) { return t->n; }
const char *ds_tp_comm(const ds_tp *t) { return t->comm->i->name; }

void ds_tp_describe(const ds_tp *t, char *buf, size_t n) {
    /* every rank on the model's device (device 0 of its backend) today */
    snprintf(buf, n, "ranks=%s:0x%d comm=%s", t->rk[0].be->i->name, t->n, t->comm->i->name);
}
ds_tp_stats ds_tp_get_stats(const ds_tp *t) { return t->st; }

ds_tp *ds_tp_new(const ds_model *m, ds_exec *ex, int n, const char *comm, int n_pages, int m_max, char *err,
                 size_t errlen) {
    if (ds_tp_check(m, n, err, errlen)) return NULL;
    const int host = m->be->i->host_memory;
    if (!comm || !*comm) comm = host ? "cpu" : "dev";
    if (strcmp(comm, "cpu") && strcmp(comm, "dev")) {
        ds_errf(err, errlen, "--tp: unknown communicator '%s' (cpu, dev)", comm);
        return NULL;
    }
    if (!strcmp(comm, "cpu") && !host) {
        ds_errf(err, errlen, "--tp: the cpu communicator needs host memory; %s buffers are device memory (use dev)",
                m->be->i->name);
        return NULL;
    }
    if (ex->be != m->be) {
        ds_errf(err, errlen, "--tp: the execution context is not on the model's %s backend", m->be->i->name);
        return NULL;
    }
    const ds_hparams *hp = &m->hp;
    ds_backend *be = m->be;
    ds_tp *t = calloc(1, sizeof *t);
    if (!t) { ds_errf(err, errlen, "--tp: out of memory"); return NULL; }
    t->m = m;
    t->ex = ex;
    t->n = n;
    t->m_max = m_max;
    t->hr = hp->n_head / n;
    t->hkvr = hp->n_head_kv / n;
    const int hd = hp->head_dim, d = hp->n_embd, ff = hp->n_ff;
    const size_t M = (size_t)m_max, qd = (size_t)hp->n_head * hd, qr = (size_t)t->hr * hd, kvr = (size_t)t->hkvr * hd;
    const size_t dr = (size_t)d / n, ffr = (size_t)ff / n;
    size_t wide = qd > (size_t)ff ? qd : (size_t)ff;
    const size_t stage = wide > (size_t)d ? wide : (size_t)d;
    char e2[DS_ERRLEN];
    t->comm = !strcmp(comm, "cpu") ? ds_comm_cpu_new(n, M * (size_t)d, e2, sizeof e2)
                                   : ds_comm_dev_new(be, n, M * (size_t)d, e2, sizeof e2);
    t->kv_tmp = malloc((size_t)ds_hp_kv_layers(hp) * kvr * 2 * sizeof(float));
    if (!t->comm || !t->kv_tmp) {
        ds_errf(err, errlen, "--tp: %s", t->comm ? "out of memory" : e2);
        ds_tp_free(t);
        return NULL;
    }
    /* the fast layout splits o_proj's and down's K: whole blocks of their
     * types per rank, or it is not available (the canonical one still is) */
    t->fast_ok = 1;
    for (int l = 0; l < hp->n_layer && t->fast_ok; l++) {
        const ds_layer *L = &m->layers[l];
        const int64_t bo = (int64_t)ds_type_block_elems(L->wo.type), bd = (int64_t)ds_type_block_elems(L->w_down.type);
        if ((int64_t)qr % bo || (int64_t)ffr % bd) {
            t->fast_ok = 0;
            snprintf(t->fast_why, sizeof t->fast_why,
                     "the fast tp_reduce layout at --tp %d needs K slices of whole blocks (o_proj %zu of %s, down %zu of %s)", n,
                     qr, ds_type_name(L->wo.type), ffr, ds_type_name(L->w_down.type));
        }
    }
    const ds_kvpool_shape ps = {.n_groups = 1, .n_layer = {ds_hp_kv_layers(hp)}, .row = {(int)kvr}, .n_pages = n_pages};
    for (int r = 0; r < n; r++) {
        tp_rank *k = &t->rk[r];
        /* the rank's device and context: the model's, shared (one per GPU
         * is the multi-GPU step); everything below is allocated through it */
        k->be = be;
        k->ex = ex;
        k->L = calloc((size_t)hp->n_layer, sizeof *k->L);
        k->pool = ds_kvpool_new(k->be, &ps, e2, sizeof e2);
        if (!k->L || !k->pool) {
            ds_errf(err, errlen, "--tp: %s", k->L ? e2 : "out of memory");
            ds_tp_free(t);
            return NULL;
        }
        for (int l = 0; l < hp->n_layer; l++) {
            const ds_layer *L = &m->layers[l];
            tp_layer *s = &k->L[l];
            if (slice_rows(k->be, &L->wq, (int64_t)(r * qr), (int64_t)qr, &s->wq, e2, sizeof e2) ||
                slice_rows(k->be, &L->wk, (int64_t)(r * kvr), (int64_t)kvr, &s->wk, e2, sizeof e2) ||
                slice_rows(k->be, &L->wv, (int64_t)(r * kvr), (int64_t)kvr, &s->wv, e2, sizeof e2) ||
                slice_rows(k->be, &L->wo, (int64_t)(r * dr), (int64_t)dr, &s->wo, e2, sizeof e2) ||
                slice_rows(k->be, &L->w_gate, (int64_t)(r * ffr), (int64_t)ffr, &s->w_gate, e2, sizeof e2) ||
                slice_rows(k->be, &L->w_up, (int64_t)(r * ffr), (int64_t)ffr, &s->w_up, e2, sizeof e2) ||
                slice_rows(k->be, &L->w_down, (int64_t)(r * dr), (int64_t)dr, &s->w_down, e2, sizeof e2) ||
                (t->fast_ok &&
                 (slice_cols(k->be, &L->wo, (int64_t)(r * qr), (int64_t)qr, &s->wo_k, &s->wo_k_data, e2, sizeof e2) ||
                  slice_cols(k->be, &L->w_down, (int64_t)(r * ffr), (int64_t)ffr, &s->w_down_k, &s->w_down_k_data, e2,
                             sizeof e2)))) {
                ds_errf(err, errlen, "--tp: %s", e2);
                ds_tp_free(t);
                return NULL;
            }
        }
#define DEV(nf) k->be->i->alloc(k->be, (nf) * sizeof(float))
        k->x = DEV(M * d); k->xn = DEV(M * d); k->o = DEV(M * d);
        k->q = DEV(M * qr); k->att = DEV(M * qr); k->k = DEV(M * kvr); k->v = DEV(M * kvr);
        k->gate = DEV(M * ffr); k->up = DEV(M * ffr); k->h = DEV(M * ffr);
        k->part = DEV(M * d); k->full = DEV(M * wide); k->stage = DEV(M * stage);
#undef DEV
        if (!k->x || !k->xn || !k->o || !k->q || !k->att || !k->k || !k->v || !k->gate || !k->up || !k->h || !k->part ||
            !k->full || !k->stage) {
            ds_errf(err, errlen, "--tp: out of %s memory for %d ranks", k->be->i->name, n);
            ds_tp_free(t);
            return NULL;
        }
    }
    return t;
}

int ds_tp_error(ds_tp *t, char *err, size_t errlen) {
    if (!t->failed) return 0;
    ds_errf(err, errlen, "%s", t->err);
    t->failed = 0;
    return -1;
}

/* ========================================================================
 * Collectives on activations
 * ===================================================================== */

/* Every rank's [M][w] slice (src of rank r, at column r * w) gathered into
 * its full [M][N w] rows at dst. A single row is already rank-major, so it
 * is gathered in place; M rows go through the rank-major staging and are
 * put in row order with one strided copy per source rank. */
static void gather_rows(ds_tp *t, int M, size_t w, float *(*src)(tp_rank *), float *(*dst)(tp_rank *)) {
    if (t->failed) return;
    ds_exec *ex[DS_TP_MAX];
    const float *send[DS_TP_MAX];
    float *recv[DS_TP_MAX];
    for (int r = 0; r < t->n; r++) {
        ex[r] = t->rk[r].ex;
        send[r] = src(&t->rk[r]);
        recv[r] = M == 1 ? dst(&t->rk[r]) : t->rk[r].stage;
    }
    if (t->comm->i->all_gather(t->comm, ex, send, recv, (size_t)M * w, t->err, sizeof t->err)) {
        t->failed = 1;
        return;
    }
    t->st.gathers++;
    t->st.bytes += (double)M * (double)w * (double)(t->n - 1) * sizeof(float);
    if (M == 1) return;
    const size_t wb = w * sizeof(float);
    for (int r = 0; r < t->n; r++)
        for (int s = 0; s < t->n; s++)
            ds_backend_copy2d(t->rk[r].ex, dst(&t->rk[r]) + (size_t)s * w, (size_t)t->n * wb, t->rk[r].stage + (size_t)s * M * w, wb,
                              wb, (size_t)M);
}

/* The fast layout: every rank's partial [M][n] sums in part, reduced into o. */
static void reduce_rows(ds_tp *t, int M, size_t n) {
    if (t->failed) return;
    ds_exec *ex[DS_TP_MAX];
    const float *send[DS_TP_MAX];
    float *recv[DS_TP_MAX];
    for (int r = 0; r < t->n; r++) {
        ex[r] = t->rk[r].ex;
        send[r] = t->rk[r].part;
        recv[r] = t->rk[r].o;
    }
    if (t->comm->i->all_reduce_sum(t->comm, ex, send, recv, (size_t)M * n, t->err, sizeof t->err)) {
        t->failed = 1;
        return;
    }
    t->st.reduces++;
    t->st.bytes += (double)M * (double)n * sizeof(float);
}

static float *b_att(tp_rank *k) { return k->att; }
static float *b_h(tp_rank *k) { return k->h; }
static float *b_part(tp_rank *k) { return k->part; }
static float *b_full(tp_rank *k) { return k->full; }
static float *b_o(tp_rank *k) { return k->o; }

/* ========================================================================
 * The forward
 * ===================================================================== */

static int wants(const ds_probe *pr, int layer, int cp) {
    return pr && pr->fn && (!pr->wants || pr->wants(pr->user, layer, cp));
}

#define FAM(f) (1u << (f))

/* A probe of a rank-sliced activation (w floats a row per rank): gathered
 * into the ranks' `full` scratch (a copy: nothing the pass computes reads
 * it before it is next written) and reported from rank 0 as the full rows
 * ds_layer_forward reports. */
static void probe_sliced(ds_tp *t, const ds_probe *pr, int M, int pos0, int l, int cp, int sub, unsigned fams,
                         float *(*src)(tp_rank *), size_t w) {
    gather_rows(t, M, w, src, b_full);
    const size_t n = w * (size_t)t->n;
    ds_probe_rows(t->ex, pr, M, pos0, l, cp, sub, fams, t->rk[0].full, n, n);
}

static float *b_q(tp_rank *k) { return k->q; }
static float *b_k(tp_rank *k) { return k->k; }
static float *b_v(tp_rank *k) { return k->v; }
static float *b_gate(tp_rank *k) { return k->gate; }
static float *b_up(tp_rank *k) { return k->up; }

/* The projection back to n_embd into every rank's o (o_proj: down = 0;
 * down_proj: 1). Canonical: each rank's rows of the weight over the whole
 * input (`full`, gathered before), then the all-gather of the slices; fast
 * (tp_reduce): each rank's K columns over its own slice of the input (att
 * or h), the partial sums all-reduced. */
static void project_out(ds_tp *t, const uint8_t var[DS_FAM_COUNT], int M, int l, int down, int fast, size_t dr, int d) {
    for (int r = 0; r < t->n; r++) {
        tp_rank *k = &t->rk[r];
        const tp_layer *S = &k->L[l];
        const ds_weight *w = fast ? (down ? &S->w_down_k : &S->wo_k) : (down ? &S->w_down : &S->wo);
        const float *x = fast ? (down ? k->h : k->att) : k->full;
        k->be->i->matmul(k->ex, (ds_variant)var[ds_matmul_family(w->type)], w, M, x, k->part);
    }
    if (fast) reduce_rows(t, M, (size_t)d);
    else gather_rows(t, M, dr, b_part, b_o);
}

#define RB(r) (t->rk[r].be->i)   /* rank r's backend table */
#define RX(r) (t->rk[r].ex)      /* rank r's execution context */

/* One dense layer over the ranks: the phases between the collectives (the
 * probes at the checkpoints ds_layer_forward reports, in its order). */
static void tp_layer_forward(ds_tp *t, int l, const float *next_norm, const uint8_t var[DS_FAM_COUNT], int M, int pos0,
                             const int *pos, int fast, const ds_probe *pr) {
    const ds_model *m = t->m;
    const ds_hparams *hp = &m->hp;
    const ds_layer *L = &m->layers[l];
    ds_exec *ex = t->ex;   /* the probes' (rank 0's); each rank's ops go to RX(r) */
    const int d = hp->n_embd, hd = hp->head_dim, n = t->n, H = hp->n_head;
    const size_t qr = (size_t)t->hr * hd, kvr = (size_t)t->hkvr * hd, dr = (size_t)d / n, ffr = (size_t)hp->n_ff / n;
    const size_t ff = ffr * n;
    const float eps = hp->norm_eps;
    const ds_variant vnorm = (ds_variant)var[DS_FAM_RMSNORM], vrope = (ds_variant)var[DS_FAM_ROPE];
    const ds_variant vres = (ds_variant)var[DS_FAM_RESIDUAL], vsw = (ds_variant)var[DS_FAM_SWIGLU];
    const ds_rope_mode mode = ds_arch_rope(hp->arch);
    tp_rank *r0 = &t->rk[0];
#define MMF(w) FAM(ds_matmul_family((w)->type))
    const unsigned f_qkv = MMF(&L->wq) | MMF(&L->wk) | MMF(&L->wv);
    const unsigned f_tp = FAM(DS_FAM_TP_REDUCE);

    if (wants(pr, l, DSD_CP_ATTN_NORM))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_NORM, DSD_SUB_ALL, FAM(DS_FAM_RMSNORM) | (l > 0 ? FAM(DS_FAM_RESIDUAL) : 0),
                      r0->xn, d, d);
    /* --- attention over each rank's heads ------------------------------------ */
    for (int r = 0; r < n; r++) {
        tp_rank *k = &t->rk[r];
        const ds_weight *const w3[3] = {&k->L[l].wq, &k->L[l].wk, &k->L[l].wv};
        float *const y3[3] = {k->q, k->k, k->v};
        ds_layer_mm_shared(k->ex, var, 3, w3, M, k->xn, y3);
    }
    const int p_qkv = wants(pr, l, DSD_CP_QKV);
    if (p_qkv) {
        probe_sliced(t, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_Q_PROJ, MMF(&L->wq), b_q, qr);
        probe_sliced(t, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_K_PROJ, MMF(&L->wk), b_k, kvr);
        probe_sliced(t, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_V_PROJ, MMF(&L->wv), b_v, kvr);
    }
    if (L->q_norm) {   /* per-head RMSNorm: a head's rows are the TP = 1 rows */
        for (int r = 0; r < n; r++) {
            RB(r)->rmsnorm(RX(r), vnorm, M * t->hr, hd, t->rk[r].q, L->q_norm, eps, t->rk[r].q);
            RB(r)->rmsnorm(RX(r), vnorm, M * t->hkvr, hd, t->rk[r].k, L->k_norm, eps, t->rk[r].k);
        }
        if (p_qkv) {
            probe_sliced(t, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_Q_NORM, FAM(DS_FAM_RMSNORM), b_q, qr);
            probe_sliced(t, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_K_NORM, FAM(DS_FAM_RMSNORM), b_k, kvr);
        }
    }
    for (int r = 0; r < n; r++) {
        if (hp->rope_scaled) {   /* the model's rope scaling (layer.c's rope_rows) */
            RB(r)->rope_ext(RX(r), vrope, M, t->hr, hd, pos, hp->rope_base, mode, &hp->rope_yarn, t->rk[r].q);
            RB(r)->rope_ext(RX(r), vrope, M, t->hkvr, hd, pos, hp->rope_base, mode, &hp->rope_yarn, t->rk[r].k);
        } else {
            RB(r)->rope(RX(r), vrope, M, t->hr, hd, pos, hp->rope_base, mode, t->rk[r].q);
            RB(r)->rope(RX(r), vrope, M, t->hkvr, hd, pos, hp->rope_base, mode, t->rk[r].k);
        }
    }
    if (p_qkv) {
        probe_sliced(t, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_Q_ROPE, FAM(DS_FAM_ROPE), b_q, qr);
        probe_sliced(t, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_K_ROPE, FAM(DS_FAM_ROPE), b_k, kvr);
    }
    for (int r = 0; r < n; r++) {
        tp_rank *k = &t->rk[r];
        RB(r)->kv_write(RX(r), ds_kvpool_k(k->pool, 0, l), ds_kvpool_v(k->pool, 0, l), t->hkvr * hd, M, &k->rows, k->k, k->v);
    }
    if (wants(pr, l, DSD_CP_KV_WRITE)) {
        /* the rows just written, every K row then every V row (the rank
         * slices of the cache rows are these rows, copied) */
        const unsigned f = FAM(DS_FAM_ROPE) | FAM(DS_FAM_RMSNORM) | f_qkv;
        for (int kv = 0; kv < 2; kv++) {
            gather_rows(t, M, kvr, kv ? b_v : b_k, b_full);
            for (int r = 0; r < M; r++)
                ds_probe_rows(ex, pr, 1, pos0 + r, l, DSD_CP_KV_WRITE, kv ? DSD_SUB_V_CACHE_ROW : DSD_SUB_K_CACHE_ROW, f,
                              r0->full + (size_t)r * kvr * n, kvr * n, kvr * n);
        }
    }
    for (int r = 0; r < n; r++) {
        tp_rank *k = &t->rk[r];
        /* the rank's heads only: head h' of the rank is head r * hr + h' of
         * the model, and its KV head h' / (hr / hkvr) the model's matching one */
        ds_attn_shape as = {t->hr, t->hkvr, hd, t->hkvr * hd, 1.0f / sqrtf((float)hd)};
        RB(r)->attention(RX(r), (ds_variant)var[DS_FAM_ATTENTION], &as, M, &k->rows, k->q, ds_kvpool_k(k->pool, 0, l),
                     ds_kvpool_v(k->pool, 0, l), k->att);
    }
    const int p_heads = wants(pr, l, DSD_CP_ATTN_HEADS);
    if (!fast || p_heads) gather_rows(t, M, qr, b_att, b_full);   /* every head's output, head order */
    if (p_heads)
        for (int r = 0; r < M; r++)
            for (int h = 0; h < H; h++)
                ds_probe_rows(ex, pr, 1, pos0 + r, l, DSD_CP_ATTN_HEADS, (int)DSD_SUB_HEAD(h), FAM(DS_FAM_ATTENTION),
                              r0->full + ((size_t)r * H + h) * hd, hd, hd);
    project_out(t, var, M, l, 0, fast, dr, d);
    if (wants(pr, l, DSD_CP_ATTN_OUT_PROJ))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_OUT_PROJ, DSD_SUB_ALL, MMF(&L->wo) | f_tp, r0->o, d, d);
    for (int r = 0; r < n; r++)
        RB(r)->residual(RX(r), vres, vnorm, M, d, t->rk[r].x, t->rk[r].o, L->ffn_norm, eps, t->rk[r].xn);
    if (wants(pr, l, DSD_CP_ATTN_RESIDUAL))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_RESIDUAL, DSD_SUB_ALL, FAM(DS_FAM_RESIDUAL), r0->x, d, d);
    if (wants(pr, l, DSD_CP_FFN_NORM))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_NORM, DSD_SUB_ALL, FAM(DS_FAM_RESIDUAL) | FAM(DS_FAM_RMSNORM), r0->xn, d,
                      d);

    /* --- SwiGLU FFN over each rank's slice of n_ff --------------------------- */
    for (int r = 0; r < n; r++) {
        tp_rank *k = &t->rk[r];
        const ds_weight *const w2[2] = {&k->L[l].w_gate, &k->L[l].w_up};
        float *const y2[2] = {k->gate, k->up};
        ds_layer_mm_shared(k->ex, var, 2, w2, M, k->xn, y2);
    }
    if (wants(pr, l, DSD_CP_FFN_GATE_UP)) {
        probe_sliced(t, pr, M, pos0, l, DSD_CP_FFN_GATE_UP, DSD_SUB_FFN_GATE, MMF(&L->w_gate), b_gate, ffr);
        probe_sliced(t, pr, M, pos0, l, DSD_CP_FFN_GATE_UP, DSD_SUB_FFN_UP, MMF(&L->w_up), b_up, ffr);
    }
    for (int r = 0; r < n; r++) RB(r)->swiglu(RX(r), vsw, M, (int)ffr, t->rk[r].gate, t->rk[r].up, t->rk[r].h);
    const int p_act = wants(pr, l, DSD_CP_FFN_ACT);
    if (!fast || p_act) gather_rows(t, M, ffr, b_h, b_full);
    if (p_act) ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_ACT, DSD_SUB_ALL, FAM(DS_FAM_SWIGLU), r0->full, ff, ff);
    project_out(t, var, M, l, 1, fast, dr, d);
    if (wants(pr, l, DSD_CP_FFN_DOWN))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_DOWN, DSD_SUB_ALL, MMF(&L->w_down) | f_tp, r0->o, d, d);
    for (int r = 0; r < n; r++)
        RB(r)->residual(RX(r), vres, vnorm, M, d, t->rk[r].x, t->rk[r].o, next_norm, eps, t->rk[r].xn);
    if (wants(pr, l, DSD_CP_LAYER_OUT))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_LAYER_OUT, DSD_SUB_ALL, FAM(DS_FAM_RESIDUAL), r0->x, d, d);
#undef MMF
}
#undef RB
#undef RX

void ds_tp_forward(ds_tp *t, ds_acts *a, const uint8_t var[DS_FAM_COUNT], int M, int pos0, const int *tap_layers,
                   int n_taps, float *taps, size_t taps_stride, const ds_probe *pr) {
    const ds_model *m = t->m;
    const ds_hparams *hp = &m->hp;
    ds_exec *ex = t->ex;             /* rank 0's: taps, probes, the head's rows */
    const ds_backend_i *b = ex->be->i;
    const int d = hp->n_embd;
    const int fast = var[DS_FAM_TP_REDUCE] == DS_FAST;
    if (t->failed) return;
    if (fast && !t->fast_ok) {
        snprintf(t->err, sizeof t->err, "%s", t->fast_why);
        t->failed = 1;
        return;
    }
    const int32_t *ids = a->pos + a->ids_off;
    for (int r = 0; r < t->n; r++) {
        tp_rank *k = &t->rk[r];
        /* the call's rows (positions, page tables, visibility) with this
         * rank's pool: the page ids are the context's, the stride its own */
        k->rows = *a->rows;
        k->rows.page_stride = ds_kvpool_page_stride(k->pool);
        k->be->i->embed(k->ex, &m->tok_embd, M, ids, k->x);
        k->be->i->rmsnorm(k->ex, (ds_variant)var[DS_FAM_RMSNORM], M, d, k->x, m->layers[0].attn_norm, hp->norm_eps, k->xn);
    }
    int tap_i = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        const float *next_norm = l + 1 < hp->n_layer ? m->layers[l + 1].attn_norm : m->output_norm;
        tp_layer_forward(t, l, next_norm, var, M, pos0, a->pos, fast, pr);
        if (tap_i < n_taps && tap_layers[tap_i] == l) {
            if (taps)   /* every rank holds the same residual stream: rank 0's */
                ds_backend_copy2d(ex, taps + (size_t)tap_i * d, taps_stride * sizeof(float), t->rk[0].x,
                                  (size_t)d * sizeof(float), (size_t)d * sizeof(float), (size_t)M);
            if (wants(pr, l, DSD_CP_TAP))
                ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_TAP, DSD_SUB_ALL, FAM(DS_FAM_RESIDUAL), t->rk[0].x, d, d);
            tap_i++;
        }
    }
    /* the final norm's rows for the LM head (replicated: rank 0's) */
    b->copy(ex, a->xn, t->rk[0].xn, (size_t)M * d * sizeof(float));
    if (wants(pr, DSD_LAYER_POST, DSD_CP_FINAL_NORM))
        ds_probe_rows(ex, pr, M, pos0, DSD_LAYER_POST, DSD_CP_FINAL_NORM, DSD_SUB_ALL,
                      FAM(DS_FAM_RESIDUAL) | FAM(DS_FAM_RMSNORM), a->xn, d, d);
}

_Static_assert(DS_STATE_TP_MAX == DS_TP_MAX, "ds_state holds one snapshot per rank");

int ds_tp_snapshot(ds_tp *t, const ds_seq *seq, int n, ds_kv_snap snaps[]) {
    for (int r = 0; r < t->n; r++)
        if (ds_seq_snapshot(seq, t->rk[r].pool, t->rk[r].ex, n, &snaps[r])) {
            for (int i = 0; i <= r; i++) ds_kv_snap_free(&snaps[i]);
            return -1;
        }
    return 0;
}

void ds_tp_restore(ds_tp *t, const ds_seq *seq, const ds_kv_snap snaps[]) {
    for (int r = 0; r < t->n; r++) {
        const ds_kv_snap *s = &snaps[r];
        const int64_t ps = ds_kvpool_page_stride(t->rk[r].pool);
        /* into the same page ids (the context's one sequence owns its pages
         * for good: its table does not change) */
        for (int i = 0; i < s->n_pages; i++)
            t->rk[r].be->i->copy(t->rk[r].ex, ds_kvpool_page_base(t->rk[r].pool, seq->table[i]), s->data + (int64_t)i * ps,
                               (size_t)ps * sizeof(float));
    }
}

void ds_tp_read_kv(ds_tp *t, const ds_seq *seq, int pos0, int n, float *k, float *v) {
    const ds_hparams *hp = &t->m->hp;
    const int nl = ds_hp_kv_layers(hp);
    const size_t kvr = (size_t)t->hkvr * hp->head_dim, kvd = kvr * (size_t)t->n;
    float *tk = t->kv_tmp, *tv = tk + (size_t)nl * kvr;
    for (int r = 0; r < t->n; r++)
        for (int j = 0; j < n; j++) {   /* one position at a time: kv_tmp holds one */
            ds_seq_read(seq, t->rk[r].pool, t->rk[r].ex, 0, pos0 + j, 1, tk, tv);
            for (int l = 0; l < nl; l++) {
                const size_t at = ((size_t)l * n + j) * kvd + (size_t)r * kvr;
                memcpy(k + at, tk + (size_t)l * kvr, kvr * sizeof(float));
                memcpy(v + at, tv + (size_t)l * kvr, kvr * sizeof(float));
            }
        }
}
