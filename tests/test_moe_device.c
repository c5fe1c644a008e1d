/* test_moe_device.c — the MoE layer's device path, proven on the CPU.
 *
 * On a device backend (CUDA) ds_layer_moe_ffn cannot read the route's ids in
 * place: it downloads them once per MoE layer into the context's host
 * staging (ds_acts.moe_host), groups there, uploads the slots and gathers
 * the rows with the backend's moe_gather; model.c records no launch
 * sequence for a MoE model (a download cannot be captured). Here the CPU
 * backend's own table poses as such a device (host_memory = 0, a graph
 * recorder that runs its ops directly, counted downloads, a host moe_gather
 * that reads the uploaded slots), so that path runs on this machine, and:
 *   - its logits are the host path's bit for bit (memcmp): a 150-token
 *     batched prefill in 64-row chunks (every row's logits), then 8 decode
 *     steps; 2 of 8 experts Q8_0, 8 of 64 Q8_0, F32 with a shared expert;
 *     with the gather op and without it (one copy per assignment);
 *   - probed (the diagnostics' checkpoints, the route's probe rows built
 *     from downloaded weights and ids): every reported row == the host's;
 *   - graph_begin is never called for a MoE model, and is for a dense one
 *     (so the count could fail);
 *   - a prefill without logits downloads exactly the route's ids: one
 *     download of n * k int32 per MoE layer and chunk.
 * (those with the posing table's matmul_id removed: every layer groups on
 * the host). Then the device-side path (backend.h matmul_id, the CPU's
 * reference behind a counter; layer.c ds_layer_moe_on_device), on Q8_0
 * 2-of-8 and 8-of-64, F32 with a shared expert and F16 4-of-16 models:
 *   - M = 1..16 rows after a prefix, 3 token sequences: the logits are the
 *     host path's rows bit for bit (memcmp; the first differing row, column
 *     and both values when not), matmul_id called exactly where M k <= 64
 *     (2 calls a layer) and never past it, no download in an id forward;
 *   - decode steps == the batch's rows; a decode step is recorded
 *     (graph_begin), a host-grouped forward is not;
 *   - counter-checks: a matmul_id on each assignment's neighbouring expert,
 *     one on the neighbouring row, and (float models) the fast moe_route
 *     change the logits.
 * tests/cuda/run.sh runs the same model-level comparisons on the GPU
 * (tests/cuda/moe_cli.sh, test_canonical / test_engine under DSPARK_DEVICE). */
#include "testutil.h"
#include "generate.h"
#include "model.h"
#include "model_make.h"
#include "dspark_diag.h"
#include "engine.h"

#define N_PROMPT 150
#define N_DEC 8

/* ---- the posing device --------------------------------------------------- */
typedef struct {
    ds_backend_i i;                 /* first: the table the model's backend points at */
    const ds_backend_i *cpu;
    long downloads, graph_begins, id_calls;
    size_t down_bytes;
    int id_shift;                   /* the sabotaged matmul_id: expert ids[i] + shift */
} pose_dev;

static pose_dev *pose_of(ds_exec *ex) { return (pose_dev *)(void *)ex->be->i; }
static void pose_download(ds_exec *ex, void *dst, const void *src, size_t b) {
    pose_dev *k = pose_of(ex);
    k->downloads++;
    k->down_bytes += b;
    k->cpu->download(ex, dst, src, b);
}
static int pose_graph_begin(ds_exec *ex, uint64_t key, char *err, size_t errlen) {
    (void)key; (void)err; (void)errlen;
    pose_of(ex)->graph_begins++;
    return 0;                       /* "recording": the ops run directly */
}
static int pose_graph_end(ds_exec *ex, char *err, size_t errlen) { (void)ex; (void)err; (void)errlen; return 0; }
/* backend.h moe_gather: X[slot[i]] = x[i / k], reading the slots the layer uploaded */
static void pose_gather(ds_exec *ex, int M, int k, int n, const int32_t *slot, const float *x, float *X) {
    (void)ex;
    for (int i = 0; i < M * k; i++) memcpy(X + (size_t)slot[i] * n, x + (size_t)(i / k) * n, (size_t)n * sizeof(float));
}
/* backend.h matmul_id: the CPU's reference, counted */
static void pose_matmul_id(ds_exec *ex, int n, const ds_weight *const W[], int n_exp, int A, const int32_t *ids, int xk,
                           const float *x, float *const y[]) {
    pose_dev *k = pose_of(ex);
    k->id_calls++;
    k->cpu->matmul_id(ex, n, W, n_exp, A, ids, xk, x, y);
}
/* ... sabotaged: every assignment runs the expert after its own (the
 * counter-check: a wrong expert must show in the logits) */
static void pose_matmul_id_bad(ds_exec *ex, int n, const ds_weight *const W[], int n_exp, int A, const int32_t *ids,
                               int xk, const float *x, float *const y[]) {
    pose_dev *k = pose_of(ex);
    k->id_calls++;
    int32_t *wrong = malloc((size_t)A * sizeof *wrong);
    if (!wrong) { printf("FAIL out of memory\n"); exit(1); }
    for (int i = 0; i < A; i++) wrong[i] = (ids[i] + k->id_shift) % n_exp;
    k->cpu->matmul_id(ex, n, W, n_exp, A, wrong, xk, x, y);
    free(wrong);
}
/* ... or every assignment reading its row's neighbour (i / xk + 1, mod the rows) */
static void pose_matmul_id_row(ds_exec *ex, int n, const ds_weight *const W[], int n_exp, int A, const int32_t *ids,
                               int xk, const float *x, float *const y[]) {
    pose_dev *k = pose_of(ex);
    k->id_calls++;
    const int rows = A / xk;
    for (int i = 0; i < A; i++) {
        const int r = (i / xk + 1) % rows;
        float *yi[2] = {NULL, NULL};
        for (int w = 0; w < n; w++) yi[w] = y[w] + (size_t)i * (size_t)W[w][0].n_out;
        k->cpu->matmul_id(ex, n, W, n_exp, 1, ids + i, 1, x + (size_t)r * (size_t)W[0][0].n_in, yi);
    }
}
/* id: 0 no matmul_id (every MoE layer groups on the host), 1 the CPU's,
 * 2 the sabotaged one */
static void pose_id(ds_model *m, pose_dev *k, int gather, int id) {
    memset(k, 0, sizeof *k);
    k->cpu = m->be->i;
    k->i = *m->be->i;
    k->i.host_memory = 0;
    k->i.download = pose_download;
    k->i.download_start = NULL;     /* downloads are immediate here */
    k->i.download_finish = NULL;
    k->i.graph_begin = pose_graph_begin;
    k->i.graph_end = pose_graph_end;
    k->i.graph_drop = NULL;
    k->i.moe_gather = gather ? pose_gather : NULL;
    k->i.matmul_id = id == 1 ? pose_matmul_id : id == 2 ? pose_matmul_id_bad : NULL;
    k->id_shift = 1;
    m->be->i = &k->i;
}
static void pose(ds_model *m, pose_dev *k, int gather) { pose_id(m, k, gather, 0); }

/* ---- a probe that keeps every reported row --------------------------------- */
typedef struct {
    unsigned char *buf;
    size_t len, cap;
    long rows, route_rows;
} capture;
static int cap_wants(void *u, int layer, int cp) { (void)u; (void)layer; (void)cp; return 1; }
static void cap_put(capture *c, const void *p, size_t n) {
    if (c->len + n > c->cap) {
        c->cap = (c->len + n) * 2;
        c->buf = realloc(c->buf, c->cap);
        if (!c->buf) { printf("FAIL out of memory\n"); exit(1); }
    }
    memcpy(c->buf + c->len, p, n);
    c->len += n;
}
static void cap_fn(void *u, int pos, int layer, int cp, int sub, unsigned fams, const float *data, size_t n) {
    capture *c = u;
    const int hdr[4] = {pos, layer, cp, sub};
    cap_put(c, hdr, sizeof hdr);
    cap_put(c, &fams, sizeof fams);
    cap_put(c, &n, sizeof n);
    cap_put(c, data, n * sizeof(float));
    c->rows++;
    c->route_rows += cp == DSD_CP_FFN_GATE_UP && sub == DSD_SUB_MOE_ROUTE;
}

/* ---- one model ---------------------------------------------------------------- */
static ds_model *make(const char *dir, const char *name, const char *arch, uint32_t type, int E, int k, int shexp,
                      char *path, size_t pn) {
    char err[DS_ERRLEN];
    snprintf(path, pn, "%s/%s.gguf", dir, name);
    ds_make_model_opts o;
    ds_make_model_defaults(&o);
    o.arch = arch; o.type = type;
    o.n_expert = E; o.n_expert_used = k; o.n_ff_exp = 64; o.n_ff_shexp = shexp;
    o.n_embd = 128; o.n_layer = 3; o.n_head = 4; o.n_head_kv = 2; o.head_dim = 32; o.n_ff = 256;
    o.n_vocab = 384; o.n_ctx = 512; o.seed = 5;
    if (ds_make_model(&o, path, err, sizeof err)) { printf("FAIL make-model: %s\n", err); exit(1); }
    ds_model *m = ds_model_load_on(path, "cpu", err, sizeof err);
    if (!m) { printf("FAIL load: %s\n", err); exit(1); }
    return m;
}

/* prefill (all rows' logits) + N_DEC greedy decode steps: logits into lg */
static void run(ds_ctx *c, const int32_t *toks, int V, float *lg) {
    char err[DS_ERRLEN];
    ds_kv_truncate(c, 0);
    if (ds_forward_batch(c, toks, N_PROMPT, 0, DS_LOGITS_ALL, lg, NULL, err, sizeof err)) {
        printf("FAIL forward_batch: %s\n", err);
        exit(1);
    }
    float *row = lg + (size_t)(N_PROMPT - 1) * V;
    for (int s = 0; s < N_DEC; s++) {
        float *next = lg + (size_t)(N_PROMPT + s) * V;
        if (ds_decode(c, (int32_t)ds_argmax(row, V), N_PROMPT + s, next, NULL, err, sizeof err)) {
            printf("FAIL decode: %s\n", err);
            exit(1);
        }
        row = next;
    }
}

static void check_model(const char *dir, const char *name, uint32_t type, int E, int k, int shexp, const int32_t *toks) {
    char err[DS_ERRLEN], path[600];
    ds_model *mh = make(dir, name, "qwen3moe", type, E, k, shexp, path, sizeof path);
    const int V = mh->hp.n_vocab, L = mh->hp.n_layer;
    const size_t nl = (size_t)(N_PROMPT + N_DEC) * V;
    float *ref = malloc(nl * sizeof(float)), *got = malloc(nl * sizeof(float));
    ds_ctx *ch = ds_ctx_new(mh, 256, 1, err, sizeof err);
    CHECK(ch != NULL, "ctx: %s", err);
    run(ch, toks, V, ref);
    capture cref = {0};
    {   /* the host's probed rows of a 20-row block */
        const ds_probe p = {cap_wants, cap_fn, &cref, NULL, NULL};
        ds_ctx_set_probe(ch, &p);
        ds_kv_truncate(ch, 0);
        CHECK(ds_forward_batch(ch, toks, 20, 0, DS_LOGITS_LAST, got, NULL, err, sizeof err) == 0, "probed: %s", err);
        ds_ctx_set_probe(ch, NULL);
    }
    for (int gather = 1; gather >= 0; gather--) {
        ds_model *md = ds_model_load_on(path, "cpu", err, sizeof err);
        CHECK(md != NULL, "load: %s", err);
        pose_dev pd;
        pose(md, &pd, gather);
        ds_ctx *cd = ds_ctx_new(md, 256, 1, err, sizeof err);
        CHECK(cd != NULL, "ctx on the posing device: %s", err);
        memset(got, 0, nl * sizeof(float));
        run(cd, toks, V, got);
        const int same = !memcmp(ref, got, nl * sizeof(float));
        CHECK(same, "%s (gather %s): the device path's logits != the host path's", name, gather ? "op" : "copies");
        CHECK(pd.graph_begins == 0, "%s: %ld graph recordings of a MoE model (a download cannot be recorded)", name,
              pd.graph_begins);
        /* a prefill without logits: the ids' downloads alone */
        ds_kv_truncate(cd, 0);
        pd.downloads = 0;
        pd.down_bytes = 0;
        CHECK(ds_forward_batch(cd, toks, N_PROMPT, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
        const long chunks = (N_PROMPT + 63) / 64;
        const int dl_ok = pd.downloads == L * chunks && pd.down_bytes == (size_t)L * N_PROMPT * k * sizeof(int32_t);
        CHECK(dl_ok, "%s: prefill downloaded %ld times, %zu bytes (want %ld, %zu: the ids, once per MoE layer and chunk)",
              name, pd.downloads, pd.down_bytes, L * chunks, (size_t)L * N_PROMPT * k * sizeof(int32_t));
        const long pre_dl = pd.downloads;
        const size_t pre_bytes = pd.down_bytes;
        /* probed: every row the host reported, the same bytes */
        capture cgot = {0};
        const ds_probe p = {cap_wants, cap_fn, &cgot, NULL, NULL};
        ds_ctx_set_probe(cd, &p);
        ds_kv_truncate(cd, 0);
        CHECK(ds_forward_batch(cd, toks, 20, 0, DS_LOGITS_LAST, got, NULL, err, sizeof err) == 0, "probed: %s", err);
        const int pr_ok = cgot.len == cref.len && !memcmp(cgot.buf, cref.buf, cref.len) && cref.route_rows == 20 * L;
        CHECK(pr_ok, "%s: probed rows differ (%ld rows, %ld route rows; host %ld, %ld)", name, cgot.rows, cgot.route_rows,
              cref.rows, cref.route_rows);
        printf("%s moe_device_path model=%s experts=%d/%d shared_expert=%d gather=%s logits_rows=%d identical=%s "
               "graph_recordings=%ld prefill_downloads=%ld bytes=%zu probed_rows=%ld route_rows=%ld identical=%s\n",
               same && dl_ok && pr_ok && pd.graph_begins == 0 ? "PASS" : "FAIL", name, k, E, shexp,
               gather ? "op" : "copies", N_PROMPT + N_DEC, same ? "yes" : "no", pd.graph_begins, pre_dl,
               pre_bytes, cgot.rows, cgot.route_rows, pr_ok ? "yes" : "no");
        free(cgot.buf);
        ds_ctx_free(cd);
        md->be->i = pd.cpu;         /* its own table back before the model frees its backend */
        ds_model_free(md);
    }
    free(cref.buf);
    free(ref);
    free(got);
    ds_ctx_free(ch);
    ds_model_free(mh);
}

/* ---- the device-side expert path (matmul_id) ------------------------------------ */
#define ID_TOK 40
#define ID_MMAX 16

/* The first float whose bits differ, or -1. */
static long first_diff(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float))) return (long)i;
    return -1;
}

/* On the posing device with matmul_id (the CPU's reference, counted), for
 * several token sequences and prefixes: a forward of M = 1..ID_MMAX rows
 * after a prefix is the host path's rows bit for bit (the reference: one
 * batched pass on the plain CPU, where the layers group on the host), with
 * matmul_id called exactly where M k <= DS_MOE_ID_MAX (2 calls a layer:
 * gate and up together, then down) and not at all past it, and no
 * download in an id-path forward; decode steps are the batch's rows; the
 * decode steps are recorded (graph_begin), a host-grouped forward is not.
 * Counter-checks: a matmul_id that runs each assignment's neighbouring
 * expert, and the fast moe_route, change the logits. */
static void check_id(const char *dir, const char *name, uint32_t type, int E, int k, int shexp) {
    char err[DS_ERRLEN], path[600];
    ds_model *mh = make(dir, name, "qwen3moe", type, E, k, shexp, path, sizeof path);
    const int V = mh->hp.n_vocab, L = mh->hp.n_layer;
    ds_ctx *ch = ds_ctx_new(mh, 256, 1, err, sizeof err);
    CHECK(ch != NULL, "ctx: %s", err);
    ds_model *md = ds_model_load_on(path, "cpu", err, sizeof err);
    CHECK(md != NULL, "load: %s", err);
    pose_dev pd;
    pose_id(md, &pd, 1, 1);
    ds_ctx *cd = ds_ctx_new(md, 256, 1, err, sizeof err);
    CHECK(cd != NULL, "ctx on the posing device: %s", err);
    float *ref = malloc((size_t)ID_TOK * V * sizeof(float)), *got = malloc((size_t)ID_MMAX * V * sizeof(float));
    int32_t toks[ID_TOK];
    int n_same = 0, n_runs = 0, calls_ok = 1, dl_ok = 1, dec_ok = 1, id_runs = 0, host_runs = 0;
    for (int seed = 0; seed < 3; seed++) {
        for (int i = 0; i < ID_TOK; i++) toks[i] = (int32_t)((i * 7919 + 13 + seed * 104729) % V);
        ds_kv_truncate(ch, 0);
        CHECK(ds_forward_batch(ch, toks, ID_TOK, 0, DS_LOGITS_ALL, ref, NULL, err, sizeof err) == 0, "ref: %s", err);
        const int P = 3 + 7 * seed;          /* 3, 10, 17: prefix rows before the M */
        for (int M = 1; M <= ID_MMAX; M++) {
            const int on_dev = M * k <= DS_MOE_ID_MAX;
            ds_kv_truncate(cd, 0);
            if (ds_forward_batch(cd, toks, P, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err)) {
                printf("FAIL prefix: %s\n", err);
                exit(1);
            }
            pd.id_calls = 0;
            memset(got, 0, (size_t)M * V * sizeof(float));
            if (ds_forward_batch(cd, toks + P, M, P, DS_LOGITS_ALL, got, NULL, err, sizeof err)) {
                printf("FAIL forward: %s\n", err);
                exit(1);
            }
            const long dif = first_diff(got, ref + (size_t)P * V, (size_t)M * V);
            n_runs++;
            if (dif < 0) n_same++;
            else
                printf("FAIL %s seed %d M=%d (%s path): logits differ first at row %ld column %ld: %.9g, host path %.9g\n",
                       name, seed, M, on_dev ? "id" : "host", dif / V, dif % V, (double)got[dif],
                       (double)ref[(size_t)P * V + dif]);
            const long want_calls = on_dev ? 2L * L : 0;
            if (pd.id_calls != want_calls) {
                calls_ok = 0;
                printf("FAIL %s seed %d M=%d: %ld matmul_id calls, want %ld\n", name, seed, M, pd.id_calls, want_calls);
            }
            id_runs += on_dev;
            host_runs += !on_dev;
            /* the same rows without logits: an id-path forward downloads nothing */
            ds_kv_truncate(cd, P);
            pd.downloads = 0;
            if (ds_forward_batch(cd, toks + P, M, P, DS_LOGITS_NONE, NULL, NULL, err, sizeof err)) {
                printf("FAIL forward: %s\n", err);
                exit(1);
            }
            if (pd.downloads != (on_dev ? 0 : L)) {
                dl_ok = 0;
                printf("FAIL %s seed %d M=%d: %ld downloads, want %d\n", name, seed, M, pd.downloads, on_dev ? 0 : L);
            }
        }
        /* decode steps after the prefix: the batch's rows */
        ds_kv_truncate(cd, P);
        for (int t = 0; t < 6; t++) {
            if (ds_decode(cd, toks[P + t], P + t, got, NULL, err, sizeof err)) {
                printf("FAIL decode: %s\n", err);
                exit(1);
            }
            const long dif = first_diff(got, ref + (size_t)(P + t) * V, (size_t)V);
            if (dif >= 0) {
                dec_ok = 0;
                printf("FAIL %s seed %d decode at %d: column %ld: %.9g, batch row %.9g\n", name, seed, P + t, dif,
                       (double)got[dif], (double)ref[(size_t)(P + t) * V + dif]);
            }
        }
    }
    CHECK(n_same == n_runs, "%s: %d of %d id-path forwards differ from the host path", name, n_runs - n_same, n_runs);
    CHECK(calls_ok, "%s: matmul_id calls not where M k <= %d", name, DS_MOE_ID_MAX);
    CHECK(dl_ok, "%s: downloads in the id path", name);
    CHECK(dec_ok, "%s: decode != batch rows on the id path", name);
    CHECK(id_runs > 0, "%s: no forward took the id path", name);
    /* recordings: a decode step is recorded (every MoE layer on the device),
     * a host-grouped forward is not */
    ds_kv_truncate(cd, 1);
    pd.graph_begins = 0;
    CHECK(ds_decode(cd, toks[1], 1, got, NULL, err, sizeof err) == 0, "decode: %s", err);
    const long rec_dec = pd.graph_begins;
    long rec_host = -1;
    if (ID_MMAX * k > DS_MOE_ID_MAX) {
        ds_kv_truncate(cd, 0);
        pd.graph_begins = 0;
        CHECK(ds_forward_batch(cd, toks, ID_MMAX, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err) == 0, "fwd: %s", err);
        rec_host = pd.graph_begins;
    }
    CHECK(rec_dec == 1 && rec_host <= 0, "%s: recordings: decode %ld (want 1), host-grouped forward %ld (want 0)", name,
          rec_dec, rec_host);
    /* counter-check 1: the neighbouring expert */
    pd.i.matmul_id = pose_matmul_id_bad;
    ds_kv_truncate(cd, 0);
    pd.id_calls = 0;
    CHECK(ds_forward_batch(cd, toks, 4, 0, DS_LOGITS_ALL, got, NULL, err, sizeof err) == 0, "fwd: %s", err);
    const int bad_differs = pd.id_calls > 0 && first_diff(got, ref, (size_t)4 * V) >= 0;
    CHECK(bad_differs, "%s: a matmul_id on the wrong experts gave the same logits (%ld calls): the check is blind", name,
          pd.id_calls);
    /* counter-check 2: the neighbouring row */
    pd.i.matmul_id = pose_matmul_id_row;
    ds_kv_truncate(cd, 0);
    pd.id_calls = 0;
    CHECK(ds_forward_batch(cd, toks, 4, 0, DS_LOGITS_ALL, got, NULL, err, sizeof err) == 0, "fwd: %s", err);
    const int row_differs = pd.id_calls > 0 && first_diff(got, ref, (size_t)4 * V) >= 0;
    CHECK(row_differs, "%s: a matmul_id on the wrong rows gave the same logits (%ld calls): the check is blind", name,
          pd.id_calls);
    pd.i.matmul_id = pose_matmul_id;
    /* counter-check 3: the fast route (the id path still runs: it takes any
     * route). Float models only: the last bit of a weight that the fast
     * route moves vanishes in a Q8_0 model's 8-bit activations (measured:
     * no logit of 32 rows changed), so there it could not show. */
    ds_kernel_set ks, ks0;
    ds_ctx_get_kernels(cd, &ks0);
    ks = ks0;
    ks.v[DS_FAM_MOE_ROUTE] = DS_FAST;
    ds_ctx_set_kernels(cd, &ks);
    /* the widest id-path forward (a weight's last bit moved by the fast
     * route can vanish in a Q8_0 model's 8-bit activations: more rows) */
    const int mf = DS_MOE_ID_MAX / k < ID_MMAX ? DS_MOE_ID_MAX / k : ID_MMAX;
    ds_kv_truncate(cd, 0);
    pd.id_calls = 0;
    CHECK(ds_forward_batch(cd, toks, mf, 0, DS_LOGITS_ALL, got, NULL, err, sizeof err) == 0, "fwd: %s", err);
    const int fast_differs = type == DS_TYPE_Q8_0 || (pd.id_calls > 0 && first_diff(got, ref, (size_t)mf * V) >= 0);
    CHECK(fast_differs, "%s: the fast moe_route gave the canonical logits (%ld matmul_id calls)", name, pd.id_calls);
    ds_ctx_set_kernels(cd, &ks0);
    printf("%s moe_id_path model=%s experts=%d/%d shared_expert=%d forwards=%d (id %d, host %d) identical=%d "
           "decode_eq_batch=%s recorded_decode=%ld recorded_host=%ld wrong_experts_differ=%s wrong_rows_differ=%s "
           "fast_route_differs=%s\n",
           n_same == n_runs && calls_ok && dl_ok && dec_ok && bad_differs && row_differs && fast_differs && rec_dec == 1 &&
                   rec_host <= 0 ? "PASS" : "FAIL",
           name, k, E, shexp, n_runs, id_runs, host_runs, n_same, dec_ok ? "yes" : "no", rec_dec, rec_host,
           bad_differs ? "yes" : "no", row_differs ? "yes" : "no",
           type == DS_TYPE_Q8_0 ? "n/a" : fast_differs ? "yes" : "no");
    free(ref);
    free(got);
    ds_ctx_free(cd);
    md->be->i = pd.cpu;
    ds_model_free(md);
    ds_ctx_free(ch);
    ds_model_free(mh);
}

/* The engine (many sequences a forward) on the posing device: 3 sequences'
 * prompts, then 6 steps of one row each (a chunk of 3 rows: 3 k <= 64
 * assignments, the id path), with matmul_id and without it: the logits of
 * every step == the host engine's (plain CPU), and the repeated step chunks
 * are recorded with matmul_id (engine.c chunk_key: all but the first, which
 * is run op by op when first seen), never without it (every MoE layer then
 * reads the route on the host). */
#define EN_SEQ 3
#define EN_STEPS 6
static int engine_run(const ds_model *m, float *lg, long *rec, long *rep) {
    char err[DS_ERRLEN];
    const int V = m->hp.n_vocab;
    const ds_engine_params ep = {.n_seq_max = EN_SEQ, .n_ctx = 256, .n_threads = 1};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    if (!e) { printf("FAIL engine: %s\n", err); exit(1); }
    int sq[EN_SEQ];
    ds_row rows[64];
    for (int s = 0; s < EN_SEQ; s++) {
        sq[s] = ds_engine_seq_new(e, err, sizeof err);
        if (sq[s] < 0) { printf("FAIL seq_new: %s\n", err); exit(1); }
        const int np = 9 + 4 * s;
        for (int p = 0; p < np; p++) rows[p] = (ds_row){sq[s], p, (int32_t)((p * 31 + 7 * s + 3) % V), 0, NULL};
        ds_fwd_out out = {NULL, NULL, NULL};
        if (ds_engine_forward(e, rows, np, &out, err, sizeof err)) { printf("FAIL prompt: %s\n", err); exit(1); }
    }
    for (int t = 0; t < EN_STEPS; t++) {
        for (int s = 0; s < EN_SEQ; s++)
            rows[s] = (ds_row){sq[s], 9 + 4 * s + t, (int32_t)((t * 53 + 11 * s + 1) % V), DS_ROW_LOGITS, NULL};
        ds_fwd_out out = {lg + (size_t)t * EN_SEQ * V, NULL, NULL};
        if (ds_engine_forward(e, rows, EN_SEQ, &out, err, sizeof err)) { printf("FAIL step: %s\n", err); exit(1); }
    }
    ds_engine_graph_counts(e, rec, rep);
    ds_engine_free(e);
    return 0;
}

static void check_engine(const char *dir) {
    char err[DS_ERRLEN], path[600];
    ds_model *mh = make(dir, "en-q8-3of16", "qwen3moe", DS_TYPE_Q8_0, 16, 3, 0, path, sizeof path);
    const int V = mh->hp.n_vocab;
    const size_t nl = (size_t)EN_STEPS * EN_SEQ * V;
    float *ref = malloc(nl * sizeof(float)), *got = malloc(nl * sizeof(float));
    long rec = 0, rep = 0;
    engine_run(mh, ref, &rec, &rep);
    for (int id = 1; id >= 0; id--) {
        ds_model *md = ds_model_load_on(path, "cpu", err, sizeof err);
        CHECK(md != NULL, "load: %s", err);
        pose_dev pd;
        pose_id(md, &pd, 1, id);
        memset(got, 0, nl * sizeof(float));
        engine_run(md, got, &rec, &rep);
        const long dif = first_diff(got, ref, nl);
        CHECK(dif < 0, "engine (matmul_id %s): step logits differ first at step %ld sequence %ld column %ld: %.9g, host %.9g",
              id ? "on" : "off", dif / ((long)EN_SEQ * V), dif / V % EN_SEQ, dif % V, dif < 0 ? 0.0 : (double)got[dif],
              dif < 0 ? 0.0 : (double)ref[dif]);
        /* (the posing recorder runs the ops each time: nothing is replayed) */
        const int rec_ok = id ? rec == EN_STEPS - 1 && pd.id_calls > 0 : rec == 0 && rep == 0 && pd.id_calls == 0;
        CHECK(rec_ok, "engine (matmul_id %s): %ld recorded, %ld replayed chunks, %ld matmul_id calls", id ? "on" : "off",
              rec, rep, pd.id_calls);
        printf("%s moe_engine matmul_id=%s steps=%d sequences=%d identical=%s recorded=%ld replayed=%ld id_calls=%ld\n",
               dif < 0 && rec_ok ? "PASS" : "FAIL", id ? "on" : "off", EN_STEPS, EN_SEQ, dif < 0 ? "yes" : "no", rec, rep,
               pd.id_calls);
        md->be->i = pd.cpu;
        ds_model_free(md);
    }
    free(ref);
    free(got);
    ds_model_free(mh);
}

int main(void) {
    char dir[256], err[DS_ERRLEN], path[600];
    tu_tmpdir(dir, sizeof dir);
    int32_t toks[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) toks[i] = (int32_t)((i * 7919 + 13) % 384);
    check_model(dir, "moe-q8-2of8", DS_TYPE_Q8_0, 8, 2, 0, toks);
    check_model(dir, "moe-q8-8of64", DS_TYPE_Q8_0, 64, 8, 0, toks);
    check_model(dir, "moe-f32-shexp", DS_TYPE_F32, 8, 2, 96, toks);
    check_id(dir, "id-q8-2of8", DS_TYPE_Q8_0, 8, 2, 0);
    check_id(dir, "id-q8-8of64", DS_TYPE_Q8_0, 64, 8, 0);
    check_id(dir, "id-f32-shexp", DS_TYPE_F32, 8, 2, 96);
    check_id(dir, "id-f16-4of16", DS_TYPE_F16, 16, 4, 0);
    check_engine(dir);

    /* a dense model on the same posing device is recorded: the count above can fail */
    ds_model *m = make(dir, "dense", "qwen3", DS_TYPE_Q8_0, 0, 0, 0, path, sizeof path);
    pose_dev pd;
    pose(m, &pd, 1);
    ds_ctx *c = ds_ctx_new(m, 256, 1, err, sizeof err);
    CHECK(c != NULL, "ctx: %s", err);
    float *lg = malloc((size_t)m->hp.n_vocab * sizeof(float));
    CHECK(ds_forward_batch(c, toks, 20, 0, DS_LOGITS_LAST, lg, NULL, err, sizeof err) == 0, "dense: %s", err);
    CHECK(pd.graph_begins > 0, "a dense model on a recording device was not recorded (the MoE check could not fail)");
    printf("%s dense model on the posing device: graph_recordings=%ld (> 0)\n", pd.graph_begins > 0 ? "PASS" : "FAIL",
           pd.graph_begins);
    free(lg);
    ds_ctx_free(c);
    m->be->i = pd.cpu;
    ds_model_free(m);
    tu_rmdir(dir);
    return tu_finish("test_moe_device");
}
