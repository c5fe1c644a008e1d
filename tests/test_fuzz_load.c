/* test_fuzz_load.c — a bounded-time mutation fuzzer over the two loader
 * paths a user feeds files to, run in every `make test` (and again under
 * ASan/UBSan with float-cast-overflow in test-san):
 *
 *   target:  mutated model file  -> ds_model_load -> context -> a few tokens
 *   drafter: good target + mutated drafter file -> ds_drafter_load ->
 *            a short speculative run
 *   moe:     mutated qwen3moe file (expert keys, 3-D expert tensors, the
 *            router) -> ds_model_load -> context -> a few tokens
 *
 * Mutations aim where loaders go wrong: every scalar metadata value and
 * every tensor-directory field (dims, type, offset) is set to boundary
 * values (0, 1, 2^30, 2^31, 2^32-1, huge floats, NaN), plus random byte
 * flips and truncations. The contract: no crash, no sanitizer report, and a
 * refusal is one non-empty line. Deterministic mutation stream; the run
 * stops at DSPARK_FUZZ_ITERS iterations or DSPARK_FUZZ_SECONDS seconds per
 * path, whichever comes first (defaults 1000 / 6 s), so it fits the
 * make-test budget on two cores. tests/fuzz_gguf.c is the libFuzzer harness
 * for longer, coverage-guided runs of the reader alone. */
#include "testutil.h"
#include "drafter.h"
#include "drafter_make.h"
#include "generate.h"
#include "gguf.h"
#include "model.h"
#include "model_make.h"
#include "spec.h"

#include <math.h>
#include <time.h>

typedef struct { size_t off; int width; int is_float; } field;   /* a mutable number in the file */

typedef struct {
    uint8_t *seed; size_t n;
    field *f; size_t nf;
} corpus;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static void add_field(corpus *c, size_t off, int width, int is_float) {
    c->f = realloc(c->f, (c->nf + 1) * sizeof *c->f);
    c->f[c->nf++] = (field){ off, width, is_float };
}

/* Every scalar metadata value and every tensor-directory number, located
 * through the reader's own pointers into the buffer. */
static void index_fields(corpus *c) {
    char err[DS_ERRLEN];
    gguf_ctx *g = gguf_open_mem(c->seed, c->n, err, sizeof err);
    if (!g) { printf("seed does not parse: %s\n", err); exit(1); }
    for (uint64_t i = 0; i < gguf_n_kv(g); i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        size_t v = (size_t)((const uint8_t *)kv->key.ptr - c->seed) + kv->key.len + 4;
        switch (kv->type) {
        case GGUF_T_U32: case GGUF_T_I32: add_field(c, v, 4, 0); break;
        case GGUF_T_U64: case GGUF_T_I64: add_field(c, v, 8, 0); break;
        case GGUF_T_F32: add_field(c, v, 4, 1); break;
        case GGUF_T_ARRAY: add_field(c, v + 4, 8, 0); break;      /* the element count */
        case GGUF_T_STRING: add_field(c, v, 8, 0); break;         /* the length */
        default: break;
        }
    }
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        size_t nl = strlen(t->name);
        /* the directory entry: u64 len, name, u32 n_dims, u64 ne[], u32 type, u64 offset */
        for (size_t p = 24; p + 8 + nl <= c->n; p++) {
            uint64_t len;
            memcpy(&len, c->seed + p, 8);
            if (len != nl || memcmp(c->seed + p + 8, t->name, nl)) continue;
            size_t q = p + 8 + nl;
            add_field(c, q, 4, 0);
            for (uint32_t d = 0; d < t->n_dims; d++) add_field(c, q + 4 + 8 * d, 8, 0);
            add_field(c, q + 4 + 8 * t->n_dims, 4, 0);
            add_field(c, q + 8 + 8 * t->n_dims, 8, 0);
            break;
        }
    }
    gguf_close(g);
}

static void mutate(const corpus *c, uint8_t *buf, size_t *n, uint64_t *rng) {
    static const uint64_t ints[] = { 0, 1, 2, 3, 31, 33, 255, 256, 257, 1u << 16, 1u << 30, (1u << 30) + 1,
                                     1ull << 31, 0xffffffffull, 1ull << 32, 1ull << 62, ~0ull };
    static const float flts[] = { 0.0f, -1.0f, 1e-30f, 1e30f, 3.4e38f, INFINITY, NAN, 1e-45f };
    memcpy(buf, c->seed, c->n);
    *n = c->n;
    int k = 1 + (int)(ds_splitmix64(rng) % 3);
    for (int m = 0; m < k; m++) {
        uint64_t r = ds_splitmix64(rng);
        switch (r % 8) {
        case 0: case 1: case 2: case 3: {             /* a number field to a boundary value */
            const field *f = &c->f[(r >> 8) % c->nf];
            if (f->is_float) {
                float v = flts[(r >> 32) % (sizeof flts / sizeof *flts)];
                memcpy(buf + f->off, &v, 4);
            } else {
                uint64_t v = ints[(r >> 32) % (sizeof ints / sizeof *ints)];
                memcpy(buf + f->off, &v, (size_t)f->width);
            }
            break;
        }
        case 4: case 5: {                             /* a few random bytes in the header region */
            size_t lim = c->n < 65536 ? c->n : 65536;
            buf[(r >> 8) % lim] = (uint8_t)(r >> 40);
            break;
        }
        case 6:                                       /* truncation */
            *n = (size_t)((r >> 8) % c->n);
            break;
        default: {                                    /* a number field += small delta */
            const field *f = &c->f[(r >> 8) % c->nf];
            uint32_t v;
            memcpy(&v, buf + f->off, 4);
            v += (uint32_t)((r >> 40) % 5) - 2;
            memcpy(buf + f->off, &v, 4);
            break;
        }
        }
    }
}

static void write_file(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) { printf("cannot write %s\n", path); exit(1); }
    fclose(f);
}

static int one_line(const char *err) { return err[0] && !strchr(err, '\n'); }

static long env_long(const char *k, long def) {
    const char *v = getenv(k);
    return v && *v ? strtol(v, NULL, 10) : def;
}

int main(void) {
    char dir[256], tpath[400], dpath[400], mpath[400], epath[400], err[DS_ERRLEN];
    tu_tmpdir(dir, sizeof dir);
    snprintf(tpath, sizeof tpath, "%s/t.gguf", dir);
    snprintf(dpath, sizeof dpath, "%s/d.gguf", dir);
    snprintf(mpath, sizeof mpath, "%s/mut.gguf", dir);
    snprintf(epath, sizeof epath, "%s/moe.gguf", dir);
    const long iters = env_long("DSPARK_FUZZ_ITERS", 1000);
    const double secs = (double)env_long("DSPARK_FUZZ_SECONDS", 6);

    ds_make_model_opts mo;
    ds_make_model_defaults(&mo);
    mo.n_embd = 64; mo.n_layer = 2; mo.n_head = 4; mo.n_head_kv = 2; mo.n_ff = 96; mo.n_vocab = 280; mo.n_ctx = 64;
    mo.type = DS_TYPE_Q8_0;
    CHECK(ds_make_model(&mo, tpath, err, sizeof err) == 0, "make target: %s", err);
    mo.arch = "qwen3moe"; mo.n_expert = 4; mo.n_expert_used = 2; mo.n_ff_exp = 32;
    CHECK(ds_make_model(&mo, epath, err, sizeof err) == 0, "make qwen3moe target: %s", err);
    ds_model *target = ds_model_load(tpath, err, sizeof err);
    CHECK(target != NULL, "target: %s", err);
    if (!target) return tu_finish("test_fuzz_load");
    ds_make_drafter_opts dopt;
    ds_make_drafter_defaults(&dopt);
    dopt.n_layer = 1; dopt.block_size = 4;
    CHECK(ds_make_drafter(&dopt, target, dpath, err, sizeof err) == 0, "make drafter: %s", err);

    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    CHECK(ds_tokenize(target->tok, "hello world", 11, 0, &prompt, &n_prompt, err, sizeof err) == 0 && n_prompt > 0,
          "tokenize: %s", err);

    uint64_t rng = 0x5eed;
    for (int path = 0; path < 3; path++) {      /* target, drafter, qwen3moe target */
        corpus c = { 0 };
        c.seed = read_all(path == 0 ? tpath : path == 1 ? dpath : epath, &c.n);
        index_fields(&c);
        uint8_t *buf = malloc(c.n);
        long loaded = 0, refused = 0, bad_err = 0, it;
        double t0 = now_s();
        for (it = 0; it < iters && now_s() - t0 < secs; it++) {
            size_t n;
            mutate(&c, buf, &n, &rng);
            write_file(mpath, buf, n);
            err[0] = 0;
            if (path != 1) {
                ds_model *m = ds_model_load(mpath, err, sizeof err);
                if (!m) { refused++; bad_err += !one_line(err); continue; }
                loaded++;
                ds_ctx *x = ds_ctx_new(m, 32, 1, err, sizeof err);
                if (x && m->tok) {
                    int32_t out[3];
                    ds_gen_stats st;
                    ds_gen_opts go = { 3, DS_PREFILL_BATCH, 0, NULL, NULL };
                    /* ids from the good tokenizer may exceed a mutated vocabulary: a refusal is fine */
                    if (ds_generate_greedy(x, prompt, (int)n_prompt, &go, out, &st, err, sizeof err)) bad_err += !one_line(err);
                }
                ds_ctx_free(x);
                ds_model_free(m);
            } else {
                ds_drafter *d = ds_drafter_load(mpath, target, err, sizeof err);
                if (!d) { refused++; bad_err += !one_line(err); continue; }
                loaded++;
                ds_ctx *x = ds_ctx_new(target, 32, 1, err, sizeof err);
                if (x) {
                    ds_spec_opts so;
                    ds_spec_opts_default(&so);
                    so.n_predict = 4;
                    int32_t out[4];
                    ds_spec_stats st;
                    if (ds_spec_generate(x, d, prompt, (int)n_prompt, &so, out, &st, err, sizeof err)) bad_err += !one_line(err);
                }
                ds_ctx_free(x);
                ds_drafter_free(d);
            }
        }
        printf("%s path: %ld iterations in %.1fs, %ld loaded and ran, %ld refused, %ld malformed error lines\n",
               path == 1 ? "drafter" : path == 2 ? "qwen3moe target" : "target", it, now_s() - t0, loaded, refused, bad_err);
        CHECK(bad_err == 0, "%ld refusals were not one non-empty line", bad_err);
        CHECK(refused > 0 && loaded > 0, "the mutations must both break and keep the file (refused %ld, loaded %ld)",
              refused, loaded);
        free(buf); free(c.seed); free(c.f);
    }
    free(prompt);
    ds_model_free(target);
    tu_rmdir(dir);
    return tu_finish("test_fuzz_load");
}
