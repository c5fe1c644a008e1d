/* test_engine.c — the batch engine's contract (engine.h): many sequences'
 * rows in one forward, each bit for bit its sequence alone.
 *
 * The reference for every sequence is a one-sequence context (ds_ctx): its
 * prompt prefilled, then decoded token by token (greedy or seeded), every
 * logits row and every layer's K/V rows kept. The engine then runs N of
 * them (N = 1, 2, 3, 8, 32) under several schedules — all prefills in one
 * batch, chunked prefill (chunks 1, 7, 64, 512), a random schedule whose
 * batches mix prefill chunks and decode rows of a random subset in random
 * order — and every logits row, every chosen token and every K/V row must
 * memcmp-equal the reference. Also: a prefix-cache hit equals a miss, fork
 * plus diverge equals two independent sequences, the pool running out is a
 * clean refusal, malformed rows are refused before anything runs, and the
 * counter-test: with --kernels fast the batched rows differ somewhere. */
#include "engine.h"
#include "generate.h"
#include "model_make.h"
#include "testutil.h"

#define NSEQ_MAX 32
#define GEN 6                   /* tokens generated per sequence          */

static uint64_t rs = 99;
static uint32_t rnd32(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }

typedef struct {
    int n_prompt;
    int32_t toks[400];          /* prompt, then the generated tokens       */
    float *logits;              /* [n_prompt + GEN][V]: row at position p  */
    float *k, *v;               /* every layer's rows [n_layer][n][kvd]    */
    ds_sampler samp;
} ref_seq;

static ds_model *make(const char *dir, uint32_t type, const char *arch) {
    char path[512], err[DS_ERRLEN];
    snprintf(path, sizeof path, "%s/m%u-%s.gguf", dir, type, arch);
    ds_make_model_opts o;
    ds_make_model_defaults(&o);
    o.arch = arch; o.type = type;
    o.n_expert = 8; o.n_expert_used = 3; o.n_ff_exp = 64;     /* qwen3moe: 3 of 8 experts a row */
    o.full_attn_interval = 2;                                  /* qwen35: a recurrent, then an attention layer */
    o.n_embd = 128; o.n_layer = 2; o.n_head = 4; o.n_head_kv = 2; o.head_dim = 32; o.n_ff = 256;
    o.n_vocab = 384; o.n_ctx = 512; o.seed = 11;
    if (!strcmp(arch, "deepseek4")) {   /* partial RoPE, a 24-position window, 4 streams, a hash layer */
        o.n_rot = 16; o.n_swa = 24; o.hc_iters = 10; o.n_hash = 1;
    }
    if (ds_make_model(&o, path, err, sizeof err)) { printf("FAIL make-model: %s\n", err); exit(1); }
    ds_model *m = ds_model_load_on(path, tu_device(), err, sizeof err);
    if (!m) { printf("FAIL load: %s\n", err); exit(1); }
    return m;
}

/* The reference: the sequence alone, prompt prefilled in one batch, then
 * decode; the logits of every position and the K/V of every row. */
static void reference(const ds_model *m, ref_seq *r) {
    char err[DS_ERRLEN];
    const size_t V = (size_t)m->hp.n_vocab, kvd = (size_t)m->hp.n_head_kv * m->hp.head_dim;
    const int n = r->n_prompt + GEN;
    ds_ctx *c = ds_ctx_new(m, 512, 1, err, sizeof err);
    r->logits = malloc((size_t)n * V * sizeof(float));
    r->k = malloc((size_t)ds_hp_kv_layers(&m->hp) * n * kvd * sizeof(float));
    r->v = malloc((size_t)ds_hp_kv_layers(&m->hp) * n * kvd * sizeof(float));
    if (!c || ds_forward_batch(c, r->toks, r->n_prompt, 0, DS_LOGITS_ALL, r->logits, NULL, err, sizeof err)) {
        printf("FAIL reference prefill: %s\n", err);
        exit(1);
    }
    for (int p = r->n_prompt; p < n; p++) {
        r->toks[p] = ds_sample(&r->samp, r->logits + (size_t)(p - 1) * V, (int)V, p, NULL);
        if (p < n && ds_decode(c, r->toks[p], p, r->logits + (size_t)p * V, NULL, err, sizeof err)) {
            printf("FAIL reference decode: %s\n", err);
            exit(1);
        }
    }
    ds_ctx_read_kv(c, 0, n, r->k, r->v);
    ds_ctx_free(c);
}

/* One sequence as the schedules see it: how far it is, where it sits. */
typedef struct { int slot, done; } run_seq;

/* A schedule: every step takes a subset of the sequences, and for each a
 * chunk of its prompt (prefill: `chunk` rows, or a random 1..chunk when
 * chunk < 0) or, once prefilled, one decode row; the engine's selected id
 * must be the reference's token, every logits row the reference's row. */
typedef struct {
    int nseq, chunk;
    int random_subset, random_order;
    ds_variant kernels;
} sched;

/* Returns the number of differing rows (logits, ids or K/V). */
static long run_schedule(const ds_model *m, ref_seq *refs, const sched *sc, ds_engine *e) {
    char err[DS_ERRLEN];
    const size_t V = (size_t)m->hp.n_vocab, kvd = (size_t)m->hp.n_head_kv * m->hp.head_dim;
    run_seq rsq[NSEQ_MAX];
    ds_kernel_set ks;
    ds_kernel_set_all(&ks, sc->kernels);
    ds_engine_set_kernels(e, &ks);
    for (int i = 0; i < sc->nseq; i++) {
        rsq[i].slot = ds_engine_seq_new(e, err, sizeof err);
        rsq[i].done = 0;
        if (rsq[i].slot < 0) { printf("FAIL seq_new: %s\n", err); exit(1); }
    }
    ds_row *rows = malloc(4096 * sizeof *rows);
    int32_t *ids = malloc(4096 * sizeof *ids);
    float *lg = malloc((size_t)4096 * V * sizeof(float));
    long differ = 0;
    int order[NSEQ_MAX];
    for (;;) {
        int live = 0;
        for (int i = 0; i < sc->nseq; i++) live += rsq[i].done < refs[i].n_prompt + GEN;
        if (!live) break;
        for (int i = 0; i < sc->nseq; i++) order[i] = i;
        if (sc->random_order)
            for (int i = sc->nseq - 1; i > 0; i--) { int j = (int)(rnd32() % (unsigned)(i + 1)), x = order[i]; order[i] = order[j]; order[j] = x; }
        int n = 0;
        int took[NSEQ_MAX] = {0};
        for (int oi = 0; oi < sc->nseq; oi++) {
            const int i = order[oi];
            ref_seq *r = &refs[i];
            const int total = r->n_prompt + GEN;
            if (rsq[i].done >= total || (sc->random_subset && rnd32() % 3 == 0)) continue;
            int want = 1;
            if (rsq[i].done < r->n_prompt) {
                const int left = r->n_prompt - rsq[i].done;
                want = sc->chunk > 0 ? sc->chunk : 1 + (int)(rnd32() % (unsigned)-sc->chunk);
                if (want > left) want = left;
            }
            if (n + want > 4096) continue;              /* the step is full */
            for (int k = 0; k < want; k++) {
                const int p = rsq[i].done + k;
                /* the row at p outputs the logits for p (to compare) and
                 * selects the token at p + 1 once past the prompt */
                rows[n] = (ds_row){rsq[i].slot, p, r->toks[p], DS_ROW_LOGITS | (p + 1 >= r->n_prompt ? DS_ROW_SELECT : 0),
                                   &r->samp};
                n++;
            }
            took[i] = want;
        }
        if (!n) continue;
        ds_fwd_out out = {lg, ids, NULL};
        if (ds_engine_forward(e, rows, n, &out, err, sizeof err)) { printf("FAIL forward: %s\n", err); exit(1); }
        for (int j = 0, li = 0; j < n; j++) {
            int i = 0;
            while (rsq[i].slot != rows[j].seq) i++;
            const ref_seq *r = &refs[i];
            differ += memcmp(lg + (size_t)li * V, r->logits + (size_t)rows[j].pos * V, V * sizeof(float)) != 0;
            li++;
            if (rows[j].want & DS_ROW_SELECT) differ += rows[j].pos + 1 < r->n_prompt + GEN && ids[j] != r->toks[rows[j].pos + 1];
        }
        for (int i = 0; i < sc->nseq; i++) rsq[i].done += took[i];
    }
    /* every K/V row of every sequence, through its page table */
    for (int i = 0; i < sc->nseq; i++) {
        const int nrow = refs[i].n_prompt + GEN;
        const size_t nf = (size_t)ds_hp_kv_layers(&m->hp) * nrow * kvd;
        float *k = malloc(nf * sizeof(float)), *v = malloc(nf * sizeof(float));
        ds_seq_read(ds_engine_seq(e, rsq[i].slot), ds_engine_pool(e), ds_engine_exec(e), 0, 0, nrow, k, v);
        differ += memcmp(k, refs[i].k, nf * sizeof(float)) != 0 || memcmp(v, refs[i].v, nf * sizeof(float)) != 0;
        free(k); free(v);
        ds_engine_seq_free(e, rsq[i].slot);
    }
    free(rows); free(ids); free(lg);
    return differ;
}

static void make_refs(const ds_model *m, ref_seq *refs, int n) {
    for (int i = 0; i < n; i++) {
        ref_seq *r = &refs[i];
        memset(r, 0, sizeof *r);
        r->n_prompt = 3 + (int)(rnd32() % (i % 4 == 3 ? 300 : 90));      /* some cross 64 and 128 */
        for (int p = 0; p < r->n_prompt; p++) r->toks[p] = (int32_t)(rnd32() % 383);
        r->samp.temp = i % 2 ? 0.8f : 0.0f;            /* greedy and seeded */
        r->samp.top_p = 1.0f;
        r->samp.seed = 1000 + (uint64_t)i;
        reference(m, r);
    }
}
static void free_refs(ref_seq *refs, int n) {
    for (int i = 0; i < n; i++) { free(refs[i].logits); free(refs[i].k); free(refs[i].v); }
}

/* ---- batch invariance ------------------------------------------------------ */
static void test_invariance(const ds_model *m) {
    char err[DS_ERRLEN];
    static ref_seq refs[NSEQ_MAX];
    make_refs(m, refs, NSEQ_MAX);
    /* DSPARK_ENGINE_GRAPHS=0: the same schedules with nothing recorded (A/B) */
    const char *eg = getenv("DSPARK_ENGINE_GRAPHS");
    const ds_engine_params ep = {.n_seq_max = NSEQ_MAX, .n_ctx = 512, .n_threads = 2, .no_graphs = eg && !strcmp(eg, "0")};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    if (!e) { printf("FAIL engine: %s\n", err); exit(1); }
    static const int ns[] = {1, 2, 3, 8, 32};
    static const int chunks[] = {512, 1, 7, 64, -40};
    long bad = 0, cases = 0;
    for (int a = 0; a < 5; a++)
        for (int c = 0; c < 5; c++) {
            const sched sc = {ns[a], chunks[c], c == 4, c >= 3, DS_CANONICAL};
            long d = run_schedule(m, refs, &sc, e);
            if (d) printf("INFO   n=%d chunk=%d: %ld rows differ\n", ns[a], chunks[c], d);
            bad += d;
            cases++;
        }
    CHECK(bad == 0, "batched rows differ from each sequence alone: %ld", bad);
    /* on a device that records launch sequences, those rows came through
     * recorded and replayed chunks too (else the test proves nothing of them) */
    long n_rec = 0, n_rep = 0;
    ds_engine_graph_counts(e, &n_rec, &n_rep);
    /* a MoE model's chunks are recorded where its layers run the experts by
     * id (matmul_id: chunks of at most 64 assignments) */
    if (m->be->i->graph_begin && !ep.no_graphs && (!m->hp.n_expert || m->layers[0].exp_id)) {
        CHECK(n_rec > 0 && n_rep > 0, "no chunk was recorded (%ld) or replayed (%ld) on %s", n_rec, n_rep, tu_device());
        printf("INFO   recorded chunks=%ld replayed=%ld\n", n_rec, n_rep);
    }
    if (!bad)
        printf("PASS batch_invariance type=%s arch=%s sequences=1,2,3,8,32 chunks=512,1,7,64,random schedules=%ld: logits, ids, K/V == alone\n",
               ds_type_name(m->weight_type), ds_arch_name(m->hp.arch), cases);
    /* the counter-test: the fast set is not batch-invariant (and the test sees it) */
    const sched fast = {8, -40, 1, 1, DS_FAST};
    const long d = run_schedule(m, refs, &fast, e);
    CHECK(d > 0, "counter-test: --kernels fast gave every row the canonical bits");
    if (d > 0) printf("PASS counter_test kernels=fast: %ld rows differ from alone\n", d);
    ds_engine_free(e);
    free_refs(refs, NSEQ_MAX);
}

/* ---- the prefix cache, fork, exhaustion, malformed rows ------------------------ */
static int prefill(ds_engine *e, int s, const int32_t *toks, int p0, int p1, float *last_logits, char *err, size_t errlen) {
    ds_row rows[512];
    for (int p = p0; p < p1; p++) rows[p - p0] = (ds_row){s, p, toks[p], p == p1 - 1 ? DS_ROW_LOGITS : 0, NULL};
    ds_fwd_out out = {last_logits, NULL, NULL};
    return ds_engine_forward(e, rows, p1 - p0, &out, err, errlen);
}

static void test_cache_fork(const ds_model *m) {
    char err[DS_ERRLEN];
    const size_t V = (size_t)m->hp.n_vocab, kvd = (size_t)m->hp.n_head_kv * m->hp.head_dim;
    ref_seq r;
    memset(&r, 0, sizeof r);
    r.n_prompt = 100;
    for (int p = 0; p < 100; p++) r.toks[p] = (int32_t)((p * 37 + 5) % 383);
    reference(m, &r);
    const ds_engine_params ep = {.n_seq_max = 4, .n_ctx = 512, .n_threads = 1};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    float *lg = malloc(V * sizeof(float));
    /* miss: a computes the prompt and publishes its full pages */
    int a = ds_engine_seq_new(e, err, sizeof err);
    CHECK(!prefill(e, a, r.toks, 0, 100, lg, err, sizeof err), "prefill: %s", err);
    ds_engine_prefix_publish(e, a);
    /* hit: b reuses 96 positions (6 pages; the last token is recomputed) */
    int b = ds_engine_seq_new(e, err, sizeof err);
    const int hit = ds_engine_prefix_lookup(e, b, r.toks, 100, 0);
    CHECK(hit == 96, "prefix hit %d positions (want 96)", hit);
    CHECK(!prefill(e, b, r.toks, hit, 100, lg, err, sizeof err), "prefill after the hit: %s", err);
    CHECK(!memcmp(lg, r.logits + 99 * V, V * sizeof(float)), "a prefix-cache hit's logits != the miss's");
    const size_t nf = (size_t)m->hp.n_layer * 100 * kvd;
    float *k = malloc(nf * sizeof(float)), *v = malloc(nf * sizeof(float));
    ds_seq_read(ds_engine_seq(e, b), ds_engine_pool(e), ds_engine_exec(e), 0, 0, 100, k, v);
    int kv_same = 1;                     /* the reference holds 106 rows per layer */
    for (int l = 0; l < m->hp.n_layer; l++)
        kv_same &= !memcmp(k + (size_t)l * 100 * kvd, r.k + (size_t)l * 106 * kvd, 100 * kvd * sizeof(float)) &&
                   !memcmp(v + (size_t)l * 100 * kvd, r.v + (size_t)l * 106 * kvd, 100 * kvd * sizeof(float));
    CHECK(kv_same, "hit K/V != miss K/V");
    /* fork after the prompt, then each goes its own way: both equal
     * independent runs of their own histories */
    int c = ds_engine_seq_fork(e, a, 100, err, sizeof err);
    CHECK(c >= 0, "fork: %s", err);
    int32_t ta[104], tc[104];
    memcpy(ta, r.toks, 100 * sizeof(int32_t));
    memcpy(tc, r.toks, 100 * sizeof(int32_t));
    for (int i = 0; i < 4; i++) { ta[100 + i] = 7 + i; tc[100 + i] = 200 + i; }
    ds_row rows[8];
    for (int i = 0; i < 4; i++) {
        rows[i] = (ds_row){a, 100 + i, ta[100 + i], DS_ROW_LOGITS, NULL};
        rows[4 + i] = (ds_row){c, 100 + i, tc[100 + i], DS_ROW_LOGITS, NULL};
    }
    float *lg8 = malloc(8 * V * sizeof(float));
    ds_fwd_out out = {lg8, NULL, NULL};
    CHECK(!ds_engine_forward(e, rows, 8, &out, err, sizeof err), "forked forward: %s", err);
    int fork_ok = 1;
    for (int w = 0; w < 2; w++) {
        ds_ctx *x = ds_ctx_new(m, 512, 1, err, sizeof err);
        float *ref = malloc(104 * V * sizeof(float));
        ds_forward_batch(x, w ? tc : ta, 104, 0, DS_LOGITS_ALL, ref, NULL, err, sizeof err);
        fork_ok &= !memcmp(lg8 + (size_t)w * 4 * V, ref + 100 * V, 4 * V * sizeof(float));
        free(ref);
        ds_ctx_free(x);
    }
    CHECK(fork_ok, "fork + diverge != two independent sequences");
    /* malformed rows: refused before anything runs */
    ds_row bad1[2] = {{a, 104, 1, 0, NULL}, {a, 106, 1, 0, NULL}};
    CHECK(ds_engine_forward(e, bad1, 2, &out, err, sizeof err) && strstr(err, "does not follow"), "gap refused: %s", err);
    ds_row bad2[1] = {{a, 200, 1, 0, NULL}};
    CHECK(ds_engine_forward(e, bad2, 1, &out, err, sizeof err) && strstr(err, "is not in"), "past the end refused: %s", err);
    ds_row bad3[1] = {{77, 0, 1, 0, NULL}};
    CHECK(ds_engine_forward(e, bad3, 1, &out, err, sizeof err) && strstr(err, "does not exist"), "bad sequence refused: %s", err);
    ds_row bad4[3] = {{a, 104, 1, 0, NULL}, {c, 104, 1, 0, NULL}, {a, 105, 1, 0, NULL}};
    CHECK(ds_engine_forward(e, bad4, 3, &out, err, sizeof err) && strstr(err, "not contiguous"), "split runs refused: %s", err);
    ds_row bad5[1] = {{a, 104, 9999, 0, NULL}};
    CHECK(ds_engine_forward(e, bad5, 1, &out, err, sizeof err) && strstr(err, "out of range"), "bad token refused: %s", err);
    CHECK(ds_engine_seq_truncate(e, a, 500, err, sizeof err) && strstr(err, "is not in"), "truncate past the end: %s", err);
    free(k); free(v); free(lg); free(lg8);
    ds_engine_free(e);
    /* a negative number of sequences per drafting pass: one line, no engine */
    {
        const ds_engine_params badp = {.n_seq_max = 2, .n_ctx = 64, .n_threads = 1, .draft_pass = -1};
        ds_engine *be = ds_engine_new(m, &badp, err, sizeof err);
        CHECK(!be && strstr(err, "drafting pass is negative"), "draft_pass -1 refused: %s", be ? "an engine" : err);
        ds_engine_free(be);
    }
    /* a pool too small: a clean refusal, the sequence unchanged */
    const ds_engine_params small = {.n_seq_max = 2, .n_ctx = 512, .n_pages = 4, .n_threads = 1};
    e = ds_engine_new(m, &small, err, sizeof err);
    a = ds_engine_seq_new(e, err, sizeof err);
    lg = malloc(V * sizeof(float));
    CHECK(ds_engine_forward(e, (ds_row[]){{a, 0, 1, 0, NULL}}, 1, &(ds_fwd_out){lg, NULL, NULL}, err, sizeof err) == 0, "one row: %s", err);
    const int before = ds_engine_seq(e, a)->n_past;
    CHECK(prefill(e, a, r.toks, 1, 100, lg, err, sizeof err) == -1 && strstr(err, "free pages") &&
              ds_engine_seq(e, a)->n_past == before,
          "out of pages: %s", err);
    free(lg);
    ds_engine_free(e);
    free(r.logits); free(r.k); free(r.v);
    PASS("prefix cache hit == miss (logits, K/V), fork + diverge == independent, malformed rows and exhaustion refused");
}

/* ---- hybrid: rollback inside a batch of several sequences -------------------
 * Chunks of 8 rows; two sequences' verify-sized runs in one forward (11 rows:
 * the second run would straddle the chunk boundary and is moved whole), each
 * cut back into its run (checkpoint + replay), then decoded on: every logits
 * row equals the sequence decoded alone. A cut past the checkpoint is refused. */
static void test_hybrid_rollback(const ds_model *m) {
    char err[DS_ERRLEN];
    const size_t V = (size_t)m->hp.n_vocab;
    const ds_engine_params ep = {.n_seq_max = 3, .n_ctx = 128, .m_max = 8, .n_threads = 2};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    ds_ctx *c = ds_ctx_new(m, 128, 1, err, sizeof err);
    if (!e || !c) { printf("FAIL engine/ctx: %s\n", err); exit(1); }
    int32_t toks[2][40];
    for (int q = 0; q < 2; q++)
        for (int p = 0; p < 40; p++) toks[q][p] = (int32_t)((p * 29 + q * 101 + 7) % 383);
    const int cut[2] = {21, 22};           /* keep 20 + 1 and 20 + 2 positions */
    float *lg = malloc(16 * V * sizeof(float)), *ref = malloc(V * sizeof(float));
    int sl[2], bad = 0, rows_cmp = 0;
    for (int q = 0; q < 2; q++) {
        sl[q] = ds_engine_seq_new(e, err, sizeof err);
        ds_row r[20];
        for (int p = 0; p < 20; p++) r[p] = (ds_row){sl[q], p, toks[q][p], 0, NULL};
        if (ds_engine_forward(e, r, 20, NULL, err, sizeof err)) { printf("FAIL prefill: %s\n", err); exit(1); }
    }
    /* the block: 5 rows of sequence 0, 6 of sequence 1, with other tokens
     * than the ones kept after the cut (rejected drafts) */
    ds_row r[11];
    int k = 0;
    for (int p = 20; p < 25; p++) r[k++] = (ds_row){sl[0], p, p < cut[0] ? toks[0][p] : 5, DS_ROW_LOGITS, NULL};
    for (int p = 20; p < 26; p++) r[k++] = (ds_row){sl[1], p, p < cut[1] ? toks[1][p] : 9, DS_ROW_LOGITS, NULL};
    ds_fwd_out out = {lg, NULL, NULL};
    if (ds_engine_forward(e, r, k, &out, err, sizeof err)) { printf("FAIL block: %s\n", err); exit(1); }
    for (int q = 0; q < 2; q++)
        CHECK(ds_engine_seq_truncate(e, sl[q], cut[q], err, sizeof err) == 0, "cut into the block: %s", err);
    /* decode on: 4 rows each, both sequences in every step */
    for (int p = 0; p < 4; p++) {
        ds_row d[2];
        for (int q = 0; q < 2; q++) d[q] = (ds_row){sl[q], cut[q] + p, toks[q][cut[q] + p], DS_ROW_LOGITS, NULL};
        if (ds_engine_forward(e, d, 2, &out, err, sizeof err)) { printf("FAIL decode on: %s\n", err); exit(1); }
        for (int q = 0; q < 2; q++) {
            /* the reference: the sequence alone, one token at a time */
            ds_kv_truncate(c, 0);
            for (int i = 0; i <= cut[q] + p; i++)
                if (ds_decode(c, toks[q][i], i, ref, NULL, err, sizeof err)) { printf("FAIL ref: %s\n", err); exit(1); }
            bad += memcmp(lg + (size_t)q * V, ref, V * sizeof(float)) != 0;
            rows_cmp++;
        }
    }
    CHECK(bad == 0, "hybrid rollback in the engine: %d of %d rows differ from alone", bad, rows_cmp);
    /* a cut past the checkpoint (the decode rows moved it) is refused */
    CHECK(ds_engine_seq_truncate(e, sl[0], 20, err, sizeof err) == -1 && strstr(err, "recurrent state"),
          "a cut past the checkpoint: %s", err);
    if (!bad)
        printf("PASS hybrid_rollback in the engine: 2 sequences' blocks (11 rows, chunks of 8) cut back into, %d rows decoded on == alone; "
               "past the checkpoint refused: %s\n", rows_cmp, err);
    free(lg);
    free(ref);
    ds_ctx_free(c);
    ds_engine_free(e);
}

int main(void) {
    char dir[256];
    tu_tmpdir(dir, sizeof dir);
    /* the mixture of experts last: rows of many sequences choose experts
     * in one grouped pass, each row still its sequence alone */
    /* then the hybrid (qwen35): each sequence's recurrent state runs
     * through its own rows, whatever else shares the step */
    /* and DeepSeek V4 (deepseek4): sinks, a window, hyper-connections */
    static const uint32_t types[] = {DS_TYPE_Q8_0, DS_TYPE_F16, DS_TYPE_Q8_0, DS_TYPE_Q8_0, DS_TYPE_Q8_0};
    static const char *const archs[] = {"qwen3", "qwen3", "qwen3moe", "qwen35", "deepseek4"};
    for (int t = 0; t < 5; t++) {
        if (t >= 3 && strcmp(tu_device(), "cpu")) {   /* qwen3moe runs on CUDA too (moe.cu) */ printf("SKIP batch_invariance arch=%s on %s\n", archs[t], tu_device()); continue; }
        ds_model *m = make(dir, types[t], archs[t]);
        test_invariance(m);
        if (t == 3) test_hybrid_rollback(m);
        if (t == 0) test_cache_fork(m);
        ds_model_free(m);
    }
    tu_rmdir(dir);
    return tu_finish("test_engine");
}
