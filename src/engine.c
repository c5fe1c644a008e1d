/* engine.c — many sequences, one forward (engine.h, docs/ENGINE.md).
 *
 * Read top to bottom: the engine and its buffers -> sequences -> the
 * forward (validate, chunk, upload, model forward, logits, selection,
 * downloads). The model's own forward (ds_model_forward in model.c) runs
 * each chunk; the engine only decides which rows go together and where
 * their K/V rows live. */
#include "engine.h"
#include "drafter.h"
#include "outfile.h"
#include "threadpool.h"

#include <errno.h>

#include <stdlib.h>

#define ENGINE_GSEEN 256           /* shapes remembered for the record-on-repeat rule   */
#define ENGINE_GRAPH_ROWS 128     /* chunks of more rows are never recorded: the device
                                     time dwarfs the launches there                   */

struct ds_engine {
    const ds_model *m;
    ds_backend *be;
    ds_exec    *ex;
    ds_kernel_set ks;
    int n_seq_max, n_ctx, m_max, max_pages;
    ds_kvpool *pool;
    ds_seq    *seq;            /* [n_seq_max]                                     */
    uint8_t   *used;           /* [n_seq_max]                                     */
    int        n_used;
    int32_t   *tables;         /* device [n_seq_max][max_pages]                   */
    /* a chunk's rows on the device: positions | ids | sequences, m_max each */
    int32_t   *rowbuf;         /* device [5 * m_max]: pos | ids | seq | runs [m_max][2] */
    int32_t   *rowhost;        /* host staging, the same layout                   */
    ds_rows    rows;
    ds_acts    a;
    float     *logits;         /* backend [m_max][V]                              */
    float     *sel_scratch;    /* backend [2V]                                    */
    int32_t   *sel_ids;        /* backend [m_max]                                 */
    int32_t   *sel_host;       /* host [m_max]                                    */
    /* rows whose sampler the backend declines (sampler.h's truncations on a
     * device): selected on the host after the chunk, all at once — one
     * download, one wait, the rows spread over hpool (a row's choice is
     * its own: which thread makes it changes nothing) */
    ds_pool   *hpool;          /* NULL on host-memory backends                    */
    int       *hrow;           /* [m_max] the chunk's deferred rows               */
    float     *hlog;           /* host [hcap][V]: their logits                    */
    float     *hscr;           /* host [threads][2V]: ds_sample's scratch         */
    int32_t   *hids;           /* [m_max] their choices                           */
    int        hcap;           /* rows hlog holds                                 */
    /* the drafter (params.drafter): its context rows are group 1 of the
     * pool, one shared drafter context serves every sequence in turn, and
     * the forward's taps feed it on the device */
    const ds_drafter *d;
    ds_dctx   *dx;
    int        gamma, seq_cap; /* seq_cap: positions a sequence's table spans     */
    int        draft_pass;     /* sequences per ds_draft_many pass                */
    int        run_plan;       /* runs ds_rows carries in this chunk's forward (0: none) */
    size_t     T;              /* floats of one row's taps                        */
    float     *taps;           /* backend [m_max][T]                              */
    int32_t   *dids;           /* backend [n_seq_max][gamma]: a step's drafts     */
    /* batched drafting: the requests in pass order,
     * a pass's sequences, the drafts as they come back (slot-major per pass) */
    int       *dorder;         /* [n_seq_max]                                     */
    ds_draft_seq *dq;          /* [n_seq_max]                                     */
    int32_t   *dhost;          /* [n_seq_max][gamma]                              */
    /* queued drafts (ds_engine_draft_queue): sequence s's drafts lie in
     * dids at qd_off[s] + k * qd_stride[s] (k < qd_keep[s]; 0: none), for
     * the anchor at position qd_pos[s] — DS_ROW_DRAFTED rows read them there */
    int       *qd_off, *qd_stride, *qd_pos, *qd_keep;   /* [n_seq_max] */
    /* hybrid models (qwen35): each slot's recurrent states (rstate.h), a
     * ring wide enough to roll a verify block back to any of its rows */
    ds_rstate  rs;
    /* recorded batch shapes (a backend with graph_begin): a chunk whose
     * rows all want an output is recorded the second time its shape is
     * seen (gseen: a direct-mapped memory of shapes seen once), then
     * replayed; prompt chunks and first sightings run op by op */
    int        graphs;
    int        graph_dctx;     /* record chunks with drafter rows too (DSPARK_ENGINE_GRAPHS=2) */
    uint64_t   gseen[ENGINE_GSEEN];
    long       n_recorded, n_replayed;   /* chunks recorded / replayed (ds_engine_graph_counts) */
};

/* ========================================================================
 * The engine
 * ===================================================================== */

static void engine_release(ds_engine *e) {
    ds_backend *be = e->be;
    float *bufs[] = {e->a.x, e->a.xn, e->a.q, e->a.k, e->a.v, e->a.att, e->a.o, e->a.gate, e->a.up, e->a.h,
                     e->a.moe, e->a.rec, e->logits, e->sel_scratch};
    if (e->rs.mem) ds_rstate_free(&e->rs);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->i->release(be, bufs[i]);
    if (e->rowbuf) be->i->release(be, e->rowbuf);
    if (e->sel_ids) be->i->release(be, e->sel_ids);
    if (e->tables) be->i->release(be, e->tables);
    if (e->taps) be->i->release(be, e->taps);
    if (e->dids) be->i->release(be, e->dids);
    ds_dctx_free(e->dx);   /* before the pool its rows live in */
    if (e->seq)
        for (int s = 0; s < e->n_seq_max; s++) ds_seq_release(&e->seq[s], e->pool);
    ds_kvpool_free(e->pool);
    if (e->ex) be->i->exec_free(e->ex);
    free(e->seq);
    free(e->used);
    free(e->rowhost);
    free(e->a.moe_host);
    free(e->sel_host);
    ds_pool_free(e->hpool);
    free(e->hrow); free(e->hlog); free(e->hscr); free(e->hids);
    free(e->dorder);
    free(e->dq);
    free(e->dhost);
    free(e->qd_off); free(e->qd_stride); free(e->qd_pos); free(e->qd_keep);
}

ds_engine *ds_engine_new(const ds_model *m, const ds_engine_params *p, char *err, size_t errlen) {
    const ds_hparams *hp = &m->hp;
    const int n_ctx = p->n_ctx, m_max = p->m_max ? p->m_max : ds_backend_chunk_rows(m->be);
    if (p->n_seq_max < 1 || p->n_seq_max > 4096) {
        ds_errf(err, errlen, "engine: %d sequences is out of range (1..4096)", p->n_seq_max);
        return NULL;
    }
    if (n_ctx < 1 || (hp->n_ctx_train > 0 && n_ctx > hp->n_ctx_train) || n_ctx > (1 << 24)) {
        ds_errf(err, errlen, "engine: -c %d is out of range (1..%d)", n_ctx, hp->n_ctx_train > 0 ? hp->n_ctx_train : 1 << 24);
        return NULL;
    }
    if (m_max < 1 || m_max > 8192) { ds_errf(err, errlen, "engine: %d rows per chunk is out of range (1..8192)", m_max); return NULL; }
    if (p->draft_pass < 0) { ds_errf(err, errlen, "engine: %d sequences per drafting pass is negative", p->draft_pass); return NULL; }
    if (p->n_threads < 1 || p->n_threads > 256) { ds_errf(err, errlen, "engine: -t %d is out of range (1..256)", p->n_threads); return NULL; }
    const ds_drafter *dr = p->drafter;
    const int gamma = dr ? ds_drafter_block_size(dr) : 0;
    /* with a drafter a table spans the block rows past the last position */
    const int seq_cap = n_ctx + gamma;
    const int per_seq = (seq_cap + DS_KV_PAGE - 1) / DS_KV_PAGE;
    const int64_t want_pages = p->n_pages ? p->n_pages : (int64_t)p->n_seq_max * per_seq;
    if (want_pages < 1 || want_pages > (1 << 26)) {
        ds_errf(err, errlen, "engine: %lld KV pages is out of range (1..%d)", (long long)want_pages, 1 << 26);
        return NULL;
    }
    ds_engine *e = calloc(1, sizeof *e);
    if (!e) { ds_errf(err, errlen, "engine: out of memory"); return NULL; }
    e->m = m;
    e->be = m->be;
    e->n_seq_max = p->n_seq_max;
    e->n_ctx = n_ctx;
    e->m_max = m_max;
    e->max_pages = per_seq;
    e->seq_cap = seq_cap;
    e->d = dr;
    e->gamma = gamma;
    ds_kernel_set_all(&e->ks, DS_CANONICAL);
    char e2[DS_ERRLEN];
    ds_backend *be = e->be;
    e->ex = be->i->exec_new(be, p->n_threads, e2, sizeof e2);
    if (!e->ex) { ds_errf(err, errlen, "engine: %s", e2); free(e); return NULL; }
    const size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, qd = (size_t)hp->n_head * hp->head_dim;
    ds_kvpool_shape ps = {.n_groups = 1, .n_layer = {ds_hp_kv_layers(hp)}, .row = {ds_hp_kv_row(hp)}, .n_pages = (int)want_pages};
    if (dr) {
        ps.n_groups = 2;
        ds_drafter_kv_shape(dr, &ps.n_layer[1], &ps.row[1]);
    }
    e->pool = ds_kvpool_new(be, &ps, e2, sizeof e2);
    e->seq = calloc((size_t)e->n_seq_max, sizeof *e->seq);
    e->used = calloc((size_t)e->n_seq_max, 1);
    if (!e->pool || !e->seq || !e->used) {
        ds_errf(err, errlen, "engine: %s", e->pool ? "out of memory" : e2);
        engine_release(e);
        free(e);
        return NULL;
    }
    const size_t M = (size_t)m_max, d = (size_t)hp->n_embd, ff = (size_t)hp->n_ff, V = (size_t)hp->n_vocab;
#define DEV(n) be->i->alloc(be, (n) * sizeof(float))
    e->a.x = DEV(M * (size_t)ds_hp_stream(hp)); e->a.xn = DEV(M * d); e->a.o = DEV(M * d);
    e->a.q = DEV(M * qd); e->a.att = DEV(M * qd); e->a.k = DEV(M * kvd); e->a.v = DEV(M * kvd);
    e->a.gate = DEV(M * ff); e->a.up = DEV(M * ff); e->a.h = DEV(M * ff);
    const size_t moe_n = ds_hp_moe_scratch(hp, m_max);     /* MoE layers' scratch (layer.c) */
    if (moe_n) e->a.moe = DEV(moe_n);
    const int moe_h = moe_n && !be->i->host_memory;        /* ... and a device's host staging */
    if (moe_h) e->a.moe_host = calloc(ds_moe_host_words(m_max, hp->n_expert_used), sizeof(int32_t));
    const size_t rec_n = ds_hp_hybrid_scratch(hp, m_max);  /* hybrid layers' scratch (layer.c) */
    if (rec_n) e->a.rec = DEV(rec_n);
    e->logits = DEV(M * V);
    e->sel_scratch = DEV(2 * V);
#undef DEV
    e->tables = be->i->alloc(be, (size_t)e->n_seq_max * e->max_pages * sizeof(int32_t));
    e->rowbuf = be->i->alloc(be, 5 * M * sizeof(int32_t));
    /* the selected ids, then (a chunk with DRAFTED rows) the chunk's tokens:
     * one download brings both */
    e->sel_ids = be->i->alloc(be, 2 * M * sizeof(int32_t));
    e->rowhost = malloc(5 * M * sizeof(int32_t));
    e->sel_host = malloc(2 * M * sizeof(int32_t));
    if (!be->i->host_memory) {
        e->hpool = ds_pool_new(p->n_threads);
        e->hrow = malloc(M * sizeof *e->hrow);
        e->hids = malloc(M * sizeof *e->hids);
        e->hscr = malloc((size_t)p->n_threads * 2 * V * sizeof(float));
    }
    if (dr) {
        e->T = (size_t)ds_drafter_n_taps(dr) * d;
        e->taps = be->i->alloc(be, M * e->T * sizeof(float));
        e->dids = be->i->alloc(be, (size_t)e->n_seq_max * (size_t)gamma * sizeof(int32_t));
        e->dorder = malloc((size_t)e->n_seq_max * sizeof *e->dorder);
        e->dq = malloc((size_t)e->n_seq_max * sizeof *e->dq);
        e->dhost = malloc((size_t)e->n_seq_max * (size_t)gamma * sizeof *e->dhost);
        e->qd_off = calloc((size_t)e->n_seq_max, sizeof(int));
        e->qd_stride = calloc((size_t)e->n_seq_max, sizeof(int));
        e->qd_pos = calloc((size_t)e->n_seq_max, sizeof(int));
        e->qd_keep = calloc((size_t)e->n_seq_max, sizeof(int));
        if (!e->taps || !e->dids || !e->dorder || !e->dq || !e->dhost || !e->qd_off || !e->qd_stride || !e->qd_pos || !e->qd_keep) {
            ds_errf(err, errlen, "engine: out of %s memory for the drafter's buffers", be->i->name);
            engine_release(e);
            free(e);
            return NULL;
        }
    }
    int ok = e->a.x && e->a.xn && e->a.o && e->a.q && e->a.att && e->a.k && e->a.v && e->a.gate && e->a.up &&
             e->a.h && (e->a.moe || !moe_n) && (e->a.moe_host || !moe_h) && (e->a.rec || !rec_n) && e->logits && e->sel_scratch && e->tables && e->rowbuf && e->sel_ids && e->rowhost && e->sel_host &&
             (be->i->host_memory || (e->hpool && e->hrow && e->hids && e->hscr));
    if (ok) {
        e->rows = (ds_rows){.pos = e->rowbuf, .seq = e->rowbuf + 2 * M, .tables = e->tables, .max_pages = e->max_pages,
                            .page = DS_KV_PAGE, .page_stride = ds_kvpool_page_stride(e->pool)};
        e->a.pos = e->rowbuf;
        e->a.ids_off = (int)M;
        e->a.rows = &e->rows;
        /* the families' scratch, once (weights' n_in: d, qd, ff) */
        const int64_t k_max = ds_hp_k_max(hp);
        if (be->i->reserve && be->i->reserve(e->ex, m_max, k_max, hp->head_dim, n_ctx, e2, sizeof e2)) ok = 0;
    }
    if (!ok) {
        ds_errf(err, errlen, "engine: out of %s memory for %d rows per chunk", be->i->name, m_max);
        engine_release(e);
        free(e);
        return NULL;
    }
    /* a verify block is at most gamma + 1 rows: runs that long are logged
     * for a rollback (without a drafter: runs of up to 8 rows, for callers
     * that truncate on their own) */
    if (ds_hp_rstate_init(hp, &e->rs, be, e->n_seq_max, gamma ? gamma + 1 : 8, m_max, e2, sizeof e2)) {
        ds_errf(err, errlen, "engine: %s", e2);
        engine_release(e);
        free(e);
        return NULL;
    }
    if (e->rs.mem) e->a.rs = &e->rs;
    if (dr && !(e->dx = ds_dctx_new_shared(dr, n_ctx, e->ex, e->pool, 1, e->n_seq_max, e2, sizeof e2))) {
        ds_errf(err, errlen, "engine: %s", e2);
        engine_release(e);
        free(e);
        return NULL;
    }
    /* recorded batch shapes: where the backend records, unless switched
     * off; not on hybrid models (a chunk's rows roll recurrent states on
     * the host); on mixture-of-experts models only the chunks whose every
     * MoE layer runs its experts on the device (chunk_key: where the route
     * is grouped on the host, it is read between the layers' launches) */
    e->graphs = be->i->graph_begin && p->no_graphs != 1 && !e->rs.mem && hp->arch != DS_ARCH_DEEPSEEK4;
    e->graph_dctx = p->no_graphs == -1;
    if (dr) {   /* at most what the shared drafter context's buffers hold */
        const int most = ds_dctx_many_max(e->dx);
        e->draft_pass = p->draft_pass && p->draft_pass < most ? p->draft_pass : most;
    }
    return e;
}

void ds_engine_free(ds_engine *e) {
    if (!e) return;
    engine_release(e);
    free(e);
}

const ds_model *ds_engine_model(const ds_engine *e) { return e->m; }
ds_kvpool *ds_engine_pool(ds_engine *e) { return e->pool; }
ds_exec *ds_engine_exec(ds_engine *e) { return e->ex; }
int ds_engine_n_ctx(const ds_engine *e) { return e->n_ctx; }
int ds_engine_m_max(const ds_engine *e) { return e->m_max; }
void ds_engine_set_kernels(ds_engine *e, const ds_kernel_set *ks) { e->ks = *ks; }
const ds_drafter *ds_engine_drafter(const ds_engine *e) { return e->d; }
void ds_engine_graph_counts(const ds_engine *e, long *recorded, long *replayed) {
    *recorded = e->n_recorded;
    *replayed = e->n_replayed;
}

/* ========================================================================
 * Sequences
 * ===================================================================== */

int ds_engine_seq_valid(const ds_engine *e, int s) { return s >= 0 && s < e->n_seq_max && e->used[s]; }
const ds_seq *ds_engine_seq(const ds_engine *e, int s) { return ds_engine_seq_valid(e, s) ? &e->seq[s] : NULL; }
int ds_engine_n_seqs(const ds_engine *e) { return e->n_used; }
int ds_engine_seq_slots(const ds_engine *e) { return e->n_seq_max; }

int ds_engine_seq_new(ds_engine *e, char *err, size_t errlen) {
    for (int s = 0; s < e->n_seq_max; s++) {
        if (e->used[s]) continue;
        if (!e->seq[s].table && ds_seq_init(&e->seq[s], e->seq_cap, err, errlen)) return -1;
        if (e->rs.mem) ds_rstate_reset(&e->rs, s);
        e->used[s] = 1;
        e->n_used++;
        return s;
    }
    ds_errf(err, errlen, "engine: all %d sequence slots are in use", e->n_seq_max);
    return -1;
}

void ds_engine_seq_free(ds_engine *e, int s) {
    if (!ds_engine_seq_valid(e, s)) return;
    ds_seq_clear(&e->seq[s], e->pool);
    e->seq[s].dirty_lo = e->seq[s].dirty_hi = 0;
    if (e->qd_keep) e->qd_keep[s] = 0;
    e->used[s] = 0;
    e->n_used--;
}

int ds_engine_seq_fork(ds_engine *e, int src, int n, char *err, size_t errlen) {
    if (!ds_engine_seq_valid(e, src)) { ds_errf(err, errlen, "fork: sequence %d does not exist", src); return -1; }
    const int s = ds_engine_seq_new(e, err, errlen);
    if (s < 0) return -1;
    if (ds_seq_fork(&e->seq[s], &e->seq[src], e->pool, n, err, errlen) ||
        (e->rs.mem && ds_rstate_copy(&e->rs, e->ex, s, src, n, err, errlen))) {
        ds_engine_seq_free(e, s);
        return -1;
    }
    return s;
}

int ds_engine_seq_truncate(ds_engine *e, int s, int n, char *err, size_t errlen) {
    if (!ds_engine_seq_valid(e, s)) { ds_errf(err, errlen, "truncate: sequence %d does not exist", s); return -1; }
    ds_seq *q = &e->seq[s];
    if (n < 0 || n > q->n_past) {
        ds_errf(err, errlen, "truncate: position %d is not in [0, %d] (what sequence %d holds)", n, q->n_past, s);
        return -1;
    }
    /* a hybrid model's recurrent state goes back with it (to a kept one) */
    if (e->rs.mem && ds_model_rs_rewind(e->m, e->ex, &e->a, s, n, err, errlen)) return -1;
    q->n_past = n;
    if (e->qd_keep && n <= e->qd_pos[s]) e->qd_keep[s] = 0;   /* its anchor is gone */
    if (q->n_dctx > n) q->n_dctx = n;
    if (q->n_tokens > n) q->n_tokens = n;
    return 0;
}

int ds_engine_prefix_lookup(ds_engine *e, int s, const int32_t *ids, int n, int need_dctx) {
    /* a hybrid model's pages hold K/V but not the recurrent state at their
     * end: no prefix is ever reused (the prompt is computed) */
    if (!ds_engine_seq_valid(e, s) || e->seq[s].n_pages || n < 1 || e->rs.mem) return 0;
    return ds_prefix_lookup(e->pool, &e->seq[s], ids, n, need_dctx ? 3u : 1u, (n - 1) / DS_KV_PAGE);
}

void ds_engine_prefix_publish(ds_engine *e, int s) {
    /* group 1 is valid up to the sequence's drafter context rows (kvpool.c) */
    if (ds_engine_seq_valid(e, s) && !e->rs.mem) ds_prefix_publish(e->pool, &e->seq[s], e->d ? 3u : 1u);
}

/* ========================================================================
 * Sequence files
 * ===================================================================== */
/* "DSPKSEQ1", then u32 version, n_layer, row floats, n_vocab, n_past,
 * n_tokens; int32 ids[n_tokens]; per layer K rows then V rows, n_past each. */
static const char seq_magic[8] = {'D', 'S', 'P', 'K', 'S', 'E', 'Q', '1'};

int ds_engine_seq_save(ds_engine *e, int s, const char *path, char *err, size_t errlen) {
    if (!ds_engine_seq_valid(e, s)) { ds_errf(err, errlen, "save: sequence %d does not exist", s); return -1; }
    if (e->rs.mem) { ds_errf(err, errlen, "save: sequence files do not hold a hybrid model's recurrent state yet"); return -1; }
    const ds_seq *q = &e->seq[s];
    const ds_hparams *hp = &e->m->hp;
    const uint32_t row = (uint32_t)ds_hp_kv_row(hp);
    const uint32_t hdr[6] = {1, (uint32_t)hp->n_layer, row, (uint32_t)hp->n_vocab, (uint32_t)q->n_past,
                             (uint32_t)(q->n_tokens < q->n_past ? q->n_tokens : q->n_past)};
    const size_t nf = (size_t)hp->n_layer * (size_t)q->n_past * row;
    float *k = malloc((nf ? nf : 1) * sizeof(float)), *v = malloc((nf ? nf : 1) * sizeof(float));
    if (!k || !v) { free(k); free(v); ds_errf(err, errlen, "save: out of memory"); return -1; }
    ds_seq_read(q, e->pool, e->ex, 0, 0, q->n_past, k, v);
    char e2[DS_ERRLEN];
    ds_outfile *o = ds_out_open(path, e2, sizeof e2);
    if (!o) { free(k); free(v); ds_errf(err, errlen, "save: %s", e2); return -1; }
    FILE *f = ds_out_fp(o);
    int ok = fwrite(seq_magic, 1, 8, f) == 8 && fwrite(hdr, sizeof hdr, 1, f) == 1 &&
             (!hdr[5] || fwrite(q->tokens, sizeof(int32_t), hdr[5], f) == hdr[5]);
    for (int l = 0; ok && l < hp->n_layer; l++) {
        const size_t n = (size_t)q->n_past * row;
        ok = !n || (fwrite(k + (size_t)l * n, sizeof(float), n, f) == n && fwrite(v + (size_t)l * n, sizeof(float), n, f) == n);
    }
    free(k); free(v);
    if (!ok) { ds_out_abort(o); ds_errf(err, errlen, "save: cannot write '%s': %s", path, strerror(errno)); return -1; }
    if (ds_out_commit(o, e2, sizeof e2)) { ds_errf(err, errlen, "save: %s", e2); return -1; }
    return 0;
}

int ds_engine_seq_load(ds_engine *e, const char *path, char *err, size_t errlen) {
    if (e->rs.mem) { ds_errf(err, errlen, "load: sequence files do not hold a hybrid model's recurrent state yet"); return -1; }
    FILE *f = fopen(path, "rb");
    if (!f) { ds_errf(err, errlen, "load: cannot open '%s': %s", path, strerror(errno)); return -1; }
    const ds_hparams *hp = &e->m->hp;
    const uint32_t row = (uint32_t)ds_hp_kv_row(hp);
    char mg[8];
    uint32_t h[6];
    int s = -1;
    float *buf = NULL;
    if (fread(mg, 1, 8, f) != 8 || memcmp(mg, seq_magic, 8) || fread(h, sizeof h, 1, f) != 1) {
        ds_errf(err, errlen, "load: '%s' is not a dspark sequence file", path);
        goto fail;
    }
    if (h[0] != 1 || h[1] != (uint32_t)hp->n_layer || h[2] != row || h[3] != (uint32_t)hp->n_vocab) {
        ds_errf(err, errlen, "load: '%s' is version %u of a model with %u layers, %u floats per row, %u tokens; this one has %d, %u, %d",
                path, h[0], h[1], h[2], h[3], hp->n_layer, row, hp->n_vocab);
        goto fail;
    }
    if (h[4] > (uint32_t)e->n_ctx || h[5] > h[4]) {
        ds_errf(err, errlen, "load: '%s' holds %u positions (%u ids); the context holds %d", path, h[4], h[5], e->n_ctx);
        goto fail;
    }
    /* the size must add up exactly: no truncated or padded files */
    const uint64_t want = 8 + sizeof h + (uint64_t)h[5] * 4 + 2ull * hp->n_layer * h[4] * row * 4;
    if (fseek(f, 0, SEEK_END) || (uint64_t)ftell(f) != want || fseek(f, 8 + (long)sizeof h, SEEK_SET)) {
        ds_errf(err, errlen, "load: '%s' has the wrong size for %u positions", path, h[4]);
        goto fail;
    }
    if ((s = ds_engine_seq_new(e, err, errlen)) < 0) goto fail;
    ds_seq *q = &e->seq[s];
    if (h[5] && fread(q->tokens, sizeof(int32_t), h[5], f) != h[5]) { ds_errf(err, errlen, "load: read error"); goto fail; }
    for (uint32_t i = 0; i < h[5]; i++)
        if (q->tokens[i] < 0 || q->tokens[i] >= hp->n_vocab) { ds_errf(err, errlen, "load: token id %d is out of range", q->tokens[i]); goto fail; }
    if (ds_seq_prepare(q, e->pool, e->ex, 0, (int)h[4], err, errlen)) goto fail;
    buf = malloc((size_t)row * sizeof(float));
    if (!buf) { ds_errf(err, errlen, "load: out of memory"); goto fail; }
    const int64_t ps = ds_kvpool_page_stride(e->pool);
    for (int l = 0; l < hp->n_layer; l++)
        for (int kv = 0; kv < 2; kv++) {
            float *base = kv ? ds_kvpool_v(e->pool, 0, l) : ds_kvpool_k(e->pool, 0, l);
            for (uint32_t p = 0; p < h[4]; p++) {
                if (fread(buf, sizeof(float), row, f) != row) { ds_errf(err, errlen, "load: read error"); goto fail; }
                e->be->i->upload(e->ex, base + (int64_t)q->table[p / DS_KV_PAGE] * ps + (int64_t)(p % DS_KV_PAGE) * row, buf,
                                 (size_t)row * sizeof(float));
            }
        }
    if (q->dirty_hi > q->dirty_lo) {
        e->be->i->upload(e->ex, e->tables + (size_t)s * e->max_pages + q->dirty_lo, q->table + q->dirty_lo,
                         (size_t)(q->dirty_hi - q->dirty_lo) * sizeof(int32_t));
        q->dirty_lo = q->dirty_hi = 0;
    }
    if (e->be->i->sync(e->ex, err, errlen)) goto fail;
    q->n_past = (int)h[4];
    q->n_tokens = (int)h[5];
    free(buf);
    fclose(f);
    return s;
fail:
    free(buf);
    if (s >= 0) ds_engine_seq_free(e, s);
    fclose(f);
    return -1;
}

/* ========================================================================
 * The forward
 * ===================================================================== */

/* Every rule checked before anything runs: sequences exist, a sequence's
 * rows are one contiguous run at consecutive positions starting at or below
 * what it holds and inside its capacity, ids in the vocabulary. */
static int check_rows(const ds_engine *e, const ds_row *rows, int n, char *err, size_t errlen) {
    if (n < 1) { ds_errf(err, errlen, "forward: a batch of %d rows (need at least 1)", n); return -1; }
    const int V = e->m->hp.n_vocab;
    for (int i = 0; i < n; i++) {
        const ds_row *r = &rows[i];
        if (!ds_engine_seq_valid(e, r->seq)) { ds_errf(err, errlen, "forward: row %d: sequence %d does not exist", i, r->seq); return -1; }
        if (r->want & ~(unsigned)(DS_ROW_LOGITS | DS_ROW_SELECT | DS_ROW_DCTX | DS_ROW_DRAFTED)) { ds_errf(err, errlen, "forward: row %d: unknown output %u", i, r->want); return -1; }
        const int first = i == 0 || rows[i - 1].seq != r->seq;
        if (r->want & DS_ROW_DRAFTED) {
            /* its token is draft k of the sequence's queued round: the rows
             * of the block after its anchor */
            const int k = e->qd_keep ? r->pos - e->qd_pos[r->seq] - 1 : -1;
            if (first || k < 0 || k >= e->qd_keep[r->seq]) {
                ds_errf(err, errlen, "forward: row %d: position %d of sequence %d has no queued draft (ds_engine_draft_queue)",
                        i, r->pos, r->seq);
                return -1;
            }
        } else if (r->token < 0 || r->token >= V) {
            ds_errf(err, errlen, "forward: row %d: token id %d is out of range [0, %d)", i, r->token, V);
            return -1;
        }
        if (r->want & DS_ROW_DCTX) {
            if (!e->d) { ds_errf(err, errlen, "forward: row %d: drafter context rows asked for but the engine has no drafter", i); return -1; }
            /* a sequence's drafter rows are its first rows in the batch, and
             * its drafter context reaches the first of them: no gap */
            if (!first && !(rows[i - 1].want & DS_ROW_DCTX)) {
                ds_errf(err, errlen, "forward: row %d: drafter context rows of sequence %d must be its first rows in the batch", i, r->seq);
                return -1;
            }
            if (first && r->pos > e->seq[r->seq].n_dctx) {
                ds_errf(err, errlen, "forward: row %d: drafter context rows start at %d but sequence %d's drafter context holds %d",
                        i, r->pos, r->seq, e->seq[r->seq].n_dctx);
                return -1;
            }
        }
        if (first) {
            for (int j = 0; j < i; j++)
                if (rows[j].seq == r->seq) {
                    ds_errf(err, errlen, "forward: rows of sequence %d are not contiguous (rows %d and %d)", r->seq, j, i);
                    return -1;
                }
            const ds_seq *q = &e->seq[r->seq];
            if (r->pos < 0 || r->pos > q->n_past) {
                ds_errf(err, errlen, "forward: row %d: position %d of sequence %d is not in [0, %d]", i, r->pos, r->seq, q->n_past);
                return -1;
            }
            if (e->rs.mem && !ds_rstate_has(&e->rs, r->seq, r->pos)) {
                ds_errf(err, errlen, "forward: row %d: sequence %d no longer holds the recurrent state at position %d "
                        "(it holds %d, and can go back to %d)", i, r->seq, r->pos, e->rs.pos[r->seq], e->rs.base[r->seq]);
                return -1;
            }
        } else if (r->pos != rows[i - 1].pos + 1) {
            ds_errf(err, errlen, "forward: row %d: position %d does not follow %d in sequence %d", i, r->pos, rows[i - 1].pos, r->seq);
            return -1;
        }
        if (r->pos >= e->n_ctx) {
            ds_errf(err, errlen, "forward: row %d: position %d is past the context size %d", i, r->pos, e->n_ctx);
            return -1;
        }
    }
    return 0;
}

/* Pages for every sequence's rows of a chunk [c0, c1), and the device page
 * tables brought up to date before the chunk reads them. Counted first, so
 * that a pool too small for the chunk changes nothing. */
static int prepare_chunk(ds_engine *e, const ds_row *rows, int c0, int c1, char *err, size_t errlen) {
    for (int i = c0; i < c1;) {
        int j = i + 1;
        while (j < c1 && rows[j].seq == rows[i].seq) j++;
        ds_seq *q = &e->seq[rows[i].seq];
        if (ds_seq_prepare(q, e->pool, e->ex, rows[i].pos, rows[j - 1].pos + 1, err, errlen)) return -1;
        if (q->dirty_hi > q->dirty_lo) {
            e->be->i->upload(e->ex, e->tables + (size_t)rows[i].seq * e->max_pages + q->dirty_lo, q->table + q->dirty_lo,
                             (size_t)(q->dirty_hi - q->dirty_lo) * sizeof(int32_t));
            q->dirty_lo = q->dirty_hi = 0;
        }
        i = j;
    }
    return 0;
}

/* ========================================================================
 * Drafting
 * ===================================================================== */

/* The rounds in passes of up to ds_dctx_many_max sequences (ds_draft_many):
 * the requests sorted by drafts kept, most first (a pass's shorter chains
 * are then a suffix of each slot), each sequence's block pages taken and its
 * table row on the device first. One download for every pass, one wait. */
static int draft_batched(ds_engine *e, int n, const ds_draft_req *dr, int32_t *ids, char *err, size_t errlen) {
    const ds_backend_i *b = e->be->i;
    const int G = e->gamma, per = e->draft_pass;
    for (int k = 0; k < n; k++) e->qd_keep[dr[k].seq] = 0;   /* replaced: none valid until their pass ran */
    for (int k = 0; k < n; k++) {          /* insertion sort: stable, n is small */
        int j = k;
        while (j > 0 && dr[e->dorder[j - 1]].n_keep < dr[k].n_keep) { e->dorder[j] = e->dorder[j - 1]; j--; }
        e->dorder[j] = k;
    }
    for (int c0 = 0; c0 < n; c0 += per) {
        const int cn = n - c0 < per ? n - c0 : per;
        for (int i = 0; i < cn; i++) {
            const ds_draft_req *r = &dr[e->dorder[c0 + i]];
            ds_seq *q = &e->seq[r->seq];
            if (ds_seq_prepare(q, e->pool, e->ex, q->n_past, q->n_past + G, err, errlen)) return -1;
            if (q->dirty_hi > q->dirty_lo) {
                b->upload(e->ex, e->tables + (size_t)r->seq * e->max_pages + q->dirty_lo, q->table + q->dirty_lo,
                          (size_t)(q->dirty_hi - q->dirty_lo) * sizeof(int32_t));
                q->dirty_lo = q->dirty_hi = 0;
            }
            e->dq[i] = (ds_draft_seq){r->seq, q->n_past, r->anchor, r->n_keep, r->samp};
        }
        /* where each sequence's drafts will lie (slot-major per pass: slot
         * j of its sequence i at c0 * G + j * cn + i) */
        for (int i = 0; i < cn; i++) {
            const ds_draft_req *r = &dr[e->dorder[c0 + i]];
            e->qd_off[r->seq] = c0 * G + i;
            e->qd_stride[r->seq] = cn;
            e->qd_pos[r->seq] = e->seq[r->seq].n_past;
        }
        const int32_t *ids_dev = NULL;
        if (ds_draft_many(e->dx, cn, e->dq, &e->rows, &ids_dev, err, errlen)) return -1;
        b->copy(e->ex, e->dids + (size_t)c0 * G, ids_dev, (size_t)cn * G * sizeof(int32_t));
        for (int i = 0; i < cn; i++) e->qd_keep[dr[e->dorder[c0 + i]].seq] = dr[e->dorder[c0 + i]].n_keep;
    }
    if (!ids) return 0;                    /* queued: the drafts stay on the device */
    b->download(e->ex, e->dhost, e->dids, (size_t)n * G * sizeof(int32_t));
    if (b->sync(e->ex, err, errlen)) return -1;
    /* pass c0's ids are slot-major: slot j of its sequence i at c0 * G + j * cn + i */
    for (int c0 = 0; c0 < n; c0 += per) {
        const int cn = n - c0 < per ? n - c0 : per;
        for (int i = 0; i < cn; i++) {
            const int k = e->dorder[c0 + i];
            for (int j = 0; j < dr[k].n_keep; j++) ids[(size_t)k * G + j] = e->dhost[(size_t)c0 * G + (size_t)j * cn + i];
        }
    }
    return 0;
}

static int draft_check(const ds_engine *e, int n, const ds_draft_req *dr, char *err, size_t errlen) {
    if (!e->d) { ds_errf(err, errlen, "draft: the engine has no drafter"); return -1; }
    if (n < 1 || n > e->n_seq_max) { ds_errf(err, errlen, "draft: %d sequences (1..%d)", n, e->n_seq_max); return -1; }
    for (int k = 0; k < n; k++) {
        const ds_draft_req *r = &dr[k];
        if (!ds_engine_seq_valid(e, r->seq)) { ds_errf(err, errlen, "draft: sequence %d does not exist", r->seq); return -1; }
        const ds_seq *q = &e->seq[r->seq];
        if (q->n_dctx != q->n_past || q->n_past >= e->n_ctx) {
            ds_errf(err, errlen, "draft: sequence %d holds %d positions and %d drafter context rows (a round needs equal, below %d)",
                    r->seq, q->n_past, q->n_dctx, e->n_ctx);
            return -1;
        }
        if (r->n_keep < 1 || r->n_keep > e->gamma) { ds_errf(err, errlen, "draft: %d drafts (1..%d)", r->n_keep, e->gamma); return -1; }
        if (r->anchor < 0 || r->anchor >= e->m->hp.n_vocab) { ds_errf(err, errlen, "draft: anchor id %d is out of range", r->anchor); return -1; }
        for (int j = 0; j < k; j++)
            if (dr[j].seq == r->seq) { ds_errf(err, errlen, "draft: sequence %d twice", r->seq); return -1; }
    }
    return 0;
}

int ds_engine_draft(ds_engine *e, int n, const ds_draft_req *dr, int32_t *ids, char *err, size_t errlen) {
    if (draft_check(e, n, dr, err, errlen)) return -1;
    return draft_batched(e, n, dr, ids, err, errlen);
}

int ds_engine_draft_queue(ds_engine *e, int n, const ds_draft_req *dr, char *err, size_t errlen) {
    if (draft_check(e, n, dr, err, errlen)) return -1;
    return draft_batched(e, n, dr, NULL, err, errlen);
}

/* Where the chunk from row c0 ends: m_max rows on, except that on a hybrid
 * model a sequence's run short enough to be rolled back into (a verify
 * block: rstate.h cap) is never cut — its checkpoint is the state before
 * its first row, which a second chunk of the same run would overwrite. It
 * moves to the next chunk whole (which rows share a chunk changes no bit). */
static int chunk_end(const ds_engine *e, const ds_row *rows, int n, int c0) {
    int c1 = c0 + e->m_max < n ? c0 + e->m_max : n;
    if (!e->rs.mem || c1 == n || rows[c1 - 1].seq != rows[c1].seq) return c1;
    int j0 = c1 - 1, j1 = c1;
    while (j0 > c0 && rows[j0 - 1].seq == rows[c1].seq) j0--;
    while (j1 < n && rows[j1].seq == rows[c1].seq) j1++;
    return j0 > c0 && j1 - j0 <= e->rs.cap ? j0 : c1;
}

/* The chunk's deferred rows (e->hrow, chunk-relative; rows = the chunk's
 * first row): their logits in one download per run of adjacent rows, one
 * wait, then ds_sample per row on hpool's threads — each row's choice is
 * ds_sample of its own logits at its own position, as select_on_host
 * would make it one run at a time. */
typedef struct {
    ds_engine *e;
    const ds_row *rows;
    int V;
} host_sel_job;

static void host_sel_rows(void *arg, int64_t k0, int64_t k1, int chunk) {
    const host_sel_job *j = arg;
    ds_engine *e = j->e;
    float *scr = e->hscr + (size_t)chunk * 2 * (size_t)j->V;
    for (int64_t k = k0; k < k1; k++) {
        const ds_row *r = &j->rows[e->hrow[k]];
        const float *row = e->hlog + (size_t)k * (size_t)j->V;
        const int32_t t = ds_sample(r->samp, row, j->V, (int64_t)r->pos + 1, scr);
        e->hids[k] = t >= 0 ? t : (int32_t)ds_argmax(row, j->V);
    }
}

static int host_select(ds_engine *e, const ds_row *rows, int n_host, char *err, size_t errlen) {
    const ds_backend_i *b = e->be->i;
    const size_t V = (size_t)e->m->hp.n_vocab;
    if (n_host > e->hcap) {   /* grown to the most rows a chunk has deferred */
        float *h = realloc(e->hlog, (size_t)n_host * V * sizeof(float));
        if (!h) { ds_errf(err, errlen, "select: out of host memory for %d rows of %zu logits", n_host, V); return -1; }
        e->hlog = h;
        e->hcap = n_host;
    }
    for (int k = 0; k < n_host;) {
        int k1 = k + 1;
        while (k1 < n_host && e->hrow[k1] == e->hrow[k1 - 1] + 1) k1++;
        b->download(e->ex, e->hlog + (size_t)k * V, e->logits + (size_t)e->hrow[k] * V, (size_t)(k1 - k) * V * sizeof(float));
        k = k1;
    }
    if (b->sync(e->ex, err, errlen)) return -1;
    host_sel_job j = {e, rows, (int)V};
    ds_pool_for_idx(e->hpool, n_host, 1, host_sel_rows, &j);
    return 0;
}

/* ========================================================================
 * A chunk's device work, and its recorded launch sequences
 * ===================================================================== */

/* A row whose choice is drawn (seeded sampling) rather than the argmax. */
static int row_sampled(const ds_row *r) { return r->samp && r->samp->temp > 0.0f; }

/* Everything the device does for the chunk's rows that depends only on
 * the chunk's shape (chunk_key): the model forward (with the drafter's
 * taps when a row feeds the drafter), the LM head over each run of rows
 * that want an output, the argmax of every run of greedy rows (rows are
 * independent: one argmax over rows of several requests is each row's
 * own), and the drafter context rows of each run of DCTX rows, whatever
 * sequences they belong to (context rows attend nothing: a row's bits
 * are its taps' alone). No host transfer: it may be recorded.
 *
 * When every row wants an output (the chunks that are recorded), one
 * argmax covers all of them: a seeded row's is overwritten by its sampled
 * choice after this (same stream), a logits-only row's is never read — so
 * which rows are greedy is not part of the recording's shape, and a batch
 * of greedy and seeded requests in any order replays one recording. */
static int chunk_device_ops(ds_engine *e, const ds_row *rows, int cn, const uint8_t var[DS_FAM_COUNT], int any_dctx,
                            char *err, size_t errlen) {
    const ds_backend_i *b = e->be->i;
    const size_t V = (size_t)e->m->hp.n_vocab;
    /* the sequence runs, for this forward only (ds_rows copies made from
     * e->rows later, the drafter's, describe other rows) */
    if (e->run_plan) {
        const size_t M = (size_t)e->m_max;
        e->rows.runs = e->rowbuf + 3 * M;
        e->rows.runs_host = e->rowhost + 3 * M;
        e->rows.n_runs = e->run_plan;
    }
    if (any_dctx)   /* the taps of every row of the chunk, on the device */
        ds_model_forward(e->m, e->ex, &e->a, e->pool, var, cn, rows[0].pos, ds_drafter_tap_layers(e->d),
                         ds_drafter_n_taps(e->d), e->taps, e->T, NULL);
    else
        ds_model_forward(e->m, e->ex, &e->a, e->pool, var, cn, rows[0].pos, NULL, 0, NULL, 0, NULL);
    e->rows.runs = e->rows.runs_host = NULL;
    e->rows.n_runs = 0;
    for (int i = 0; i < cn;) {
        if (!rows[i].want) { i++; continue; }
        int j = i + 1;
        while (j < cn && rows[j].want) j++;
        ds_model_logits(e->m, e->ex, &e->a, var, i, j - i, rows[i].pos, e->logits + (size_t)i * V, NULL);
        i = j;
    }
    int all = 1, any_sel = 0;
    for (int i = 0; i < cn; i++) {
        all &= rows[i].want != 0;
        any_sel |= (rows[i].want & DS_ROW_SELECT) != 0;
    }
    if (all && any_sel) {
        b->argmax(e->ex, cn, (int64_t)V, e->logits, e->sel_ids);
    } else {
        for (int i = 0; i < cn;) {
            if (!(rows[i].want & DS_ROW_SELECT) || row_sampled(&rows[i])) { i++; continue; }
            int j = i + 1;
            while (j < cn && (rows[j].want & DS_ROW_SELECT) && !row_sampled(&rows[j])) j++;
            b->argmax(e->ex, j - i, (int64_t)V, e->logits + (size_t)i * V, e->sel_ids + i);
            i = j;
        }
    }
    for (int i = 0; any_dctx && i < cn;) {
        if (!(rows[i].want & DS_ROW_DCTX)) { i++; continue; }
        int j = i + 1;
        while (j < cn && (rows[j].want & DS_ROW_DCTX)) j++;
        ds_rows rv = e->rows;
        rv.pos += i;
        rv.seq += i;
        if (ds_dctx_append_rows(e->dx, e->taps + (size_t)i * e->T, j - i, &rv, err, errlen)) return -1;
        i = j;
    }
    return 0;
}

/* The key of a chunk's recording, or 0 when it is not to be recorded:
 * FNV-1a over everything that changes which ops chunk_device_ops issues
 * or their arguments — the row count, the variants, whether every row is
 * short (the attention's split pass: backend.h DS_ROWS_SHORT), whether any
 * row feeds the drafter and which rows do (the context-row runs), whether
 * any row selects (a chunk of logits-only rows records no argmax). Only
 * chunks whose every row wants an output (decode and verify rows) are
 * recorded: their selections are one argmax (chunk_device_ops), so a row
 * being greedy or seeded, or wanting logits or a choice, is not in the
 * shape; prompt chunks vary in shape and their device time dwarfs the
 * launches. */
static uint64_t chunk_key(const ds_engine *e, const ds_row *rows, int cn, const uint8_t var[DS_FAM_COUNT], int any_dctx) {
    /* chunks with drafter rows (speculative verify blocks) run op by op:
     * recorded, the H200 ran them no faster and at 4 sequences 7% slower
     * (bench/results/cuda-engine-graphs-h200-s35.txt), while plain decode
     * chunks gain 1.1-1.5x on the shipped target */
    if (cn > ENGINE_GRAPH_ROWS || (any_dctx && !e->graph_dctx)) return 0;
    /* a MoE layer that groups on the host downloads the route mid-chunk */
    if (!ds_layers_moe_on_device(e->be, e->m->layers, e->m->hp.n_layer, var, cn)) return 0;
    int any_sel = 0;   /* whether the recording has the argmax (chunk_device_ops) */
    for (int i = 0; i < cn; i++) {
        if (!(rows[i].want & (DS_ROW_SELECT | DS_ROW_LOGITS))) return 0;
        any_sel |= (rows[i].want & DS_ROW_SELECT) != 0;
    }
    uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(uint32_t)(v)) * 1099511628211ull)
    MIX(0x454e47u); MIX(cn); MIX(any_dctx); MIX(any_sel);
    MIX(e->rows.vis_max > 0 && e->rows.vis_max <= DS_ROWS_SHORT);
    for (int f = 0; f < DS_FAM_COUNT; f++) MIX(var[f]);
    for (int i = 0; any_dctx && i < cn; i++) MIX((rows[i].want & DS_ROW_DCTX) != 0);
#undef MIX
    return h ? h : 1;
}

/* The record-on-repeat rule: 1 when key was seen before (record or
 * replay it), else remember it and run this chunk op by op — a shape seen
 * once (a verify block of an unusual width) costs no recording. */
static int graph_seen(ds_engine *e, uint64_t key) {
    uint64_t *slot = &e->gseen[key % ENGINE_GSEEN];
    if (*slot == key) return 1;
    *slot = key;
    return 0;
}

int ds_engine_forward(ds_engine *e, const ds_row *rows, int n, ds_fwd_out *out, char *err, size_t errlen) {
    if (check_rows(e, rows, n, err, errlen)) return -1;
    int n_logits = 0;
    for (int i = 0; i < n; i++) n_logits += (rows[i].want & DS_ROW_LOGITS) != 0;
    if ((n_logits && (!out || !out->logits))) { ds_errf(err, errlen, "forward: logits asked for but no buffer given"); return -1; }
    const ds_backend_i *b = e->be->i;
    const int host = b->host_memory;
    const size_t V = (size_t)e->m->hp.n_vocab, M = (size_t)e->m_max;
    uint8_t var[DS_FAM_COUNT];
    memcpy(var, e->ks.v, sizeof var);
    float *lg_out = out ? out->logits : NULL;
    /* each sequence's rows start from its recurrent state there (check_rows
     * made sure it is held) */
    for (int i = 0; e->rs.mem && i < n; i++)
        if ((i == 0 || rows[i - 1].seq != rows[i].seq) && ds_model_rs_rewind(e->m, e->ex, &e->a, rows[i].seq, rows[i].pos, err, errlen))
            return -1;
    for (int c0 = 0, c1; c0 < n; c0 = c1) {
        c1 = chunk_end(e, rows, n, c0);
        const int cn = c1 - c0;
        if (prepare_chunk(e, rows, c0, c1, err, errlen)) return -1;
        /* positions, ids and sequences of the chunk in one upload */
        int32_t *hp = e->rowhost;
        e->rows.vis_max = 0;                       /* rows attend [0, pos + 1) */
        /* ... and the chunk's sequence runs (ds_rows.runs), given to the
         * forward when one is long enough for a backend to tile (a prompt
         * chunk: never recorded, chunk_key) */
        int32_t *hr = hp + 3 * M;
        int n_runs = 0, run_max = 0;
        for (int i = 0; i < cn; i++) {
            if (rows[c0 + i].pos + 1 > e->rows.vis_max) e->rows.vis_max = rows[c0 + i].pos + 1;
            hp[i] = rows[c0 + i].pos;
            hp[M + i] = rows[c0 + i].token;
            hp[2 * M + i] = rows[c0 + i].seq;
            if (i == 0 || rows[c0 + i].seq != rows[c0 + i - 1].seq) hr[2 * n_runs++] = i, hr[2 * n_runs - 1] = 0;
            if (++hr[2 * n_runs - 1] > run_max) run_max = hr[2 * n_runs - 1];
        }
        const int give_runs = run_max >= DS_ROWS_RUN_MIN;
        b->upload(e->ex, e->rowbuf, hp, ((give_runs ? 3 * M + 2 * (size_t)n_runs : 2 * M + (size_t)cn)) * sizeof(int32_t));
        /* DRAFTED rows: their tokens from the queued drafts, device to
         * device (one strided copy per sequence's run; no host round trip
         * between drafting and the verify) */
        int n_drafted = 0;
        for (int i = 0; i < cn;) {
            const ds_row *r = &rows[c0 + i];
            if (!(r->want & DS_ROW_DRAFTED)) { i++; continue; }
            int j = i + 1;
            while (j < cn && (rows[c0 + j].want & DS_ROW_DRAFTED) && rows[c0 + j].seq == r->seq) j++;
            const int s = r->seq, k0 = r->pos - e->qd_pos[s] - 1;
            ds_backend_copy2d(e->ex, e->rowbuf + M + i, sizeof(int32_t), e->dids + e->qd_off[s] + (size_t)k0 * e->qd_stride[s],
                              (size_t)e->qd_stride[s] * sizeof(int32_t), sizeof(int32_t), (size_t)(j - i));
            n_drafted += j - i;
            i = j;
        }
        int any_dctx = 0;
        for (int i = c0; i < c1 && !any_dctx; i++) any_dctx = (rows[i].want & DS_ROW_DCTX) != 0;
        /* The chunk's device work — forward, LM head, greedy selection,
         * drafter context rows — as one recorded launch sequence where the
         * backend records (graph_begin) and this shape was seen before
         * (chunk_key says what the recording depends on; the rows' values
         * are in device buffers). A replay runs exactly the ops below. */
        const uint64_t key = e->graphs ? chunk_key(e, rows + c0, cn, var, any_dctx) : 0;
        const int rec = key && graph_seen(e, key);
        int replayed = 0;
        if (rec && (replayed = b->graph_begin(e->ex, key, err, errlen)) < 0) return -1;
        if (rec) ++*(replayed ? &e->n_replayed : &e->n_recorded);
        e->run_plan = !rec && give_runs ? n_runs : 0;
        if (!replayed && chunk_device_ops(e, rows + c0, cn, var, any_dctx, err, errlen)) {
            if (rec) (void)b->graph_end(e->ex, NULL, 0);
            return -1;
        }
        if (rec && b->graph_end(e->ex, err, errlen)) return -1;
        /* sampled selection (it takes each run's position by value, so it
         * is never recorded): one op per run of rows of one sampler at
         * consecutive positions (a row at position p chooses p + 1) */
        int n_sel = 0, n_host = 0;
        for (int i = 0; i < cn;) {
            const ds_row *r = &rows[c0 + i];
            if (!(r->want & DS_ROW_SELECT)) { i++; continue; }
            if (!row_sampled(r)) { n_sel++; i++; continue; }   /* chosen by the device work above */
            int j = i + 1;
            while (j < cn && (rows[c0 + j].want & DS_ROW_SELECT) && rows[c0 + j].samp == r->samp &&
                   rows[c0 + j].pos == rows[c0 + j - 1].pos + 1 && rows[c0 + j].seq == r->seq)
                j++;
            const float *lg = e->logits + (size_t)i * V;
            if (e->hpool && !(b->sample && b->sample(e->ex, r->samp, j - i, (int)V, lg, (int64_t)r->pos + 1,
                                                     e->sel_scratch, e->sel_ids + i) == 0)) {
                for (int k = i; k < j; k++) e->hrow[n_host++] = k;   /* after the chunk, on the host */
            } else if (ds_backend_select(e->ex, r->samp, j - i, (int)V, lg, (int64_t)r->pos + 1, e->sel_scratch,
                                         e->sel_ids + i, err, errlen)) {
                return -1;
            }
            n_sel += j - i;
            i = j;
        }
        if (n_host && host_select(e, rows + c0, n_host, err, errlen)) return -1;
        /* the chunk's tokens ride along with its selections when drafts
         * were queued: the caller learns which drafts it verified */
        if (n_drafted) b->copy(e->ex, e->sel_ids + M, e->rowbuf + M, (size_t)cn * sizeof(int32_t));
        if (n_sel || n_drafted) {
            b->download(e->ex, e->sel_host, e->sel_ids, (n_drafted ? M + (size_t)cn : (size_t)cn) * sizeof(int32_t));
            for (int k = 0; k < n_host; k++) e->sel_host[e->hrow[k]] = e->hids[k];
            for (int i = 0; i < cn; i++)
                if (rows[c0 + i].want & DS_ROW_SELECT) out->ids[c0 + i] = e->sel_host[i];
        }
        for (int i = 0; i < cn; i++)
            if (rows[c0 + i].want & DS_ROW_LOGITS) {
                b->download(e->ex, lg_out, e->logits + (size_t)i * V, V * sizeof(float));
                lg_out += V;
            }
        /* the drafter context rows the device work wrote: each DCTX run of
         * a sequence replaces its rows from the run's first position */
        for (int k = 0; any_dctx && k < cn; k++) {
            if (!(rows[c0 + k].want & DS_ROW_DCTX)) continue;
            ds_seq *q = &e->seq[rows[c0 + k].seq];
            const int first = k == 0 || !(rows[c0 + k - 1].want & DS_ROW_DCTX) || rows[c0 + k - 1].seq != rows[c0 + k].seq;
            if (first && q->n_dctx > rows[c0 + k].pos) q->n_dctx = rows[c0 + k].pos;
            if (q->n_dctx == rows[c0 + k].pos) q->n_dctx++;
        }
        if (!host && b->sync(e->ex, err, errlen)) return -1;
        /* what each sequence now holds: its rows' K/V, and their ids */
        for (int i = c0; i < c1; i++) {
            ds_seq *q = &e->seq[rows[i].seq];
            if (i == c0 || rows[i - 1].seq != rows[i].seq) {
                if (q->n_tokens > rows[i].pos) q->n_tokens = rows[i].pos;
                /* a target row replaces the drafter rows from its position on
                 * (DCTX rows were handled above: they are rewritten) */
                if (!(rows[i].want & DS_ROW_DCTX) && q->n_dctx > rows[i].pos) q->n_dctx = rows[i].pos;
            }
            const int32_t tok = (rows[i].want & DS_ROW_DRAFTED) ? e->sel_host[M + (size_t)(i - c0)] : rows[i].token;
            if ((rows[i].want & DS_ROW_DRAFTED) && out && out->tokens) out->tokens[i] = tok;
            if (q->n_tokens == rows[i].pos) q->tokens[q->n_tokens++] = tok;
            q->n_past = rows[i].pos + 1;
            /* the recurrent states the chunk's run of this sequence kept */
            if (e->rs.mem && (i + 1 == c1 || rows[i + 1].seq != rows[i].seq)) {
                int j = i;
                while (j > c0 && rows[j - 1].seq == rows[i].seq) j--;
                ds_rstate_commit(&e->rs, rows[i].seq, rows[j].pos, rows[i].pos, var[DS_FAM_GDN]);
            }
        }
    }
    return 0;
}
