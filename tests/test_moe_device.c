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
 * tests/cuda/run.sh runs the same model-level comparisons on the GPU
 * (tests/cuda/moe_cli.sh, test_canonical / test_engine under DSPARK_DEVICE). */
#include "testutil.h"
#include "generate.h"
#include "model.h"
#include "model_make.h"
#include "dspark_diag.h"

#define N_PROMPT 150
#define N_DEC 8

/* ---- the posing device --------------------------------------------------- */
typedef struct {
    ds_backend_i i;                 /* first: the table the model's backend points at */
    const ds_backend_i *cpu;
    long downloads, graph_begins;
    size_t down_bytes;
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
static void pose(ds_model *m, pose_dev *k, int gather) {
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
    m->be->i = &k->i;
}

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

int main(void) {
    char dir[256], err[DS_ERRLEN], path[600];
    tu_tmpdir(dir, sizeof dir);
    int32_t toks[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) toks[i] = (int32_t)((i * 7919 + 13) % 384);
    check_model(dir, "moe-q8-2of8", DS_TYPE_Q8_0, 8, 2, 0, toks);
    check_model(dir, "moe-q8-8of64", DS_TYPE_Q8_0, 64, 8, 0, toks);
    check_model(dir, "moe-f32-shexp", DS_TYPE_F32, 8, 2, 96, toks);

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
