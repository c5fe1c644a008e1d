/* test_noalloc.c — no allocation in the forward (issue 8 item 4).
 *
 * This binary interposes malloc & co. (it defines them; the linker resolves
 * every call in the executable, libdspark.a included, to these) and counts
 * the calls made while `armed`. It proves:
 *   1. every kernel family, both variants, M = 1..16, with the pool's scratch
 *      reserved up front (ds_pool_reserve with ds_kernels_*_scratch), makes
 *      ZERO allocations, from the very first call;
 *   2. the same with the reservation missing: the paths that have no scratch
 *      fall back without allocating (matmul walkers, repacking) or grow the
 *      reservation once, outside the job — and the bits are the same as
 *      with it (memcmp);
 *   3. a steady-state forward of the shipped target (decode, an 8-row
 *      verify, fast and canonical) and a drafting round make zero
 *      allocations.
 * The hooks forward to glibc's __libc_* entry points. Under AddressSanitizer
 * (which owns malloc) the test is skipped. */
#include "testutil.h"
#include "kernels/kernels.h"
#include "model.h"
#include "drafter.h"
#include "sampler.h"
#include "model_make.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define NOALLOC_HOOKS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NOALLOC_HOOKS 0
#endif
#endif
#ifndef NOALLOC_HOOKS
#define NOALLOC_HOOKS 1
#endif

static atomic_int g_armed;
static atomic_long g_count;
static atomic_int g_fail;       /* while set, every allocation fails */

#if NOALLOC_HOOKS
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void  __libc_free(void *);

/* 1 = let the allocation through, 0 = make it fail */
static inline int note(void) {
    if (atomic_load_explicit(&g_armed, memory_order_relaxed)) atomic_fetch_add(&g_count, 1);
    return !atomic_load_explicit(&g_fail, memory_order_relaxed);
}
void *malloc(size_t n) { return note() ? __libc_malloc(n) : NULL; }
void *calloc(size_t a, size_t b) { return note() ? __libc_calloc(a, b) : NULL; }
void *realloc(void *p, size_t n) { return note() ? __libc_realloc(p, n) : NULL; }
void *aligned_alloc(size_t al, size_t n) { return note() ? __libc_memalign(al, n) : NULL; }
void *memalign(size_t al, size_t n) { return note() ? __libc_memalign(al, n) : NULL; }
int posix_memalign(void **out, size_t al, size_t n) {
    if (!note()) return ENOMEM;
    void *p = __libc_memalign(al, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
void free(void *p) { __libc_free(p); }
#endif

static void arm(void) { atomic_store(&g_count, 0); atomic_store(&g_armed, 1); }
static long disarm(void) { atomic_store(&g_armed, 0); return atomic_load(&g_count); }

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* ---- 1 + 2: the kernels ---------------------------------------------------------- */
#define K_IN 320       /* a multiple of 32 and not of 64: tails everywhere */
#define N_OUT 72
#define MMAX 16
#define HD 64
#define NCTX 96

static void kernels(int reserve, float *out_mm, size_t out_n) {
    uint64_t seed = 7;
    static float wf[N_OUT * K_IN], x[MMAX * K_IN], xn[MMAX * K_IN], ymm[MMAX * N_OUT];
    for (size_t i = 0; i < sizeof wf / sizeof wf[0]; i++) wf[i] = frand(&seed);
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = frand(&seed);
    const uint32_t types[4] = {DS_TYPE_F32, DS_TYPE_F16, DS_TYPE_BF16, DS_TYPE_Q8_0};
    void *wd[4];
    ds_weight W[4];
    for (int t = 0; t < 4; t++) {
        int ok;
        size_t rb = (size_t)ds_row_bytes(types[t], K_IN, &ok);
        wd[t] = malloc(rb * N_OUT);
        ds_f32_to_type(types[t], wf, (int64_t)N_OUT * K_IN, wd[t]);
        W[t] = (ds_weight){.type = types[t], .n_in = K_IN, .n_out = N_OUT, .data = wd[t]};
    }
    /* attention inputs: a KV cache of NCTX positions, 4 heads over 2 kv heads */
    const ds_attn_shape as = {4, 2, HD, 2 * HD, 0.125f};
    static float kc[NCTX * 2 * HD], vc[NCTX * 2 * HD], q[MMAX * 4 * HD], att[MMAX * 4 * HD];
    for (size_t i = 0; i < sizeof kc / sizeof kc[0]; i++) { kc[i] = frand(&seed); vc[i] = frand(&seed); }
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) q[i] = frand(&seed);
    static float nw[K_IN];
    for (int i = 0; i < K_IN; i++) nw[i] = 1.0f + 0.1f * frand(&seed);
    int pos[MMAX];
    for (int i = 0; i < MMAX; i++) pos[i] = 40 + i;

    ds_pool *pool = ds_pool_new(2);
    if (reserve)
        CHECK(ds_pool_reserve(pool, ds_kernels_thread_scratch(K_IN, HD, NCTX),
                              ds_kernels_shared_scratch(MMAX, K_IN)) == 0, "reserve");
    size_t o = 0;
    arm();
    for (int t = 0; t < 4; t++)
        for (int v = 0; v < 2; v++)
            for (int M = 1; M <= MMAX; M++) {
                ds_matmul((ds_variant)v, &W[t], M, x, ymm, pool);
                if (o + (size_t)M * N_OUT <= out_n) {
                    memcpy(out_mm + o, ymm, (size_t)M * N_OUT * sizeof(float));
                    o += (size_t)M * N_OUT;
                }
            }
    for (int v = 0; v < 2; v++)
        for (int M = 1; M <= MMAX; M++) {
            ds_attention((ds_variant)v, &as, M, NCTX - MMAX, 1, NCTX - MMAX + M, q, kc, vc, att, pool);
            ds_rmsnorm((ds_variant)v, M, K_IN, x, nw, 1e-6f, xn, pool);
            ds_rope((ds_variant)v, M, 4, HD, pos, 10000.0f, DS_ROPE_NEOX, q, pool);
            ds_swiglu((ds_variant)v, M, K_IN, x, xn, xn, pool);
            ds_residual((ds_variant)v, (ds_variant)v, M, K_IN, xn, x, nw, 1e-6f, xn, pool);
        }
    long n = disarm();
    if (reserve) {
        CHECK(n == 0, "kernels with reserved scratch: %ld allocations (want 0)", n);
    } else {
        /* without a reservation the first sweep does allocate (so the count
         * above is not vacuous): the reservation grows lazily */
        CHECK(n > 0, "first sweep without a reservation: %ld allocations (want > 0)", n);
        /* ... and a second identical sweep allocates nothing */
        arm();
        for (int t = 0; t < 4; t++)
            for (int v = 0; v < 2; v++)
                for (int M = 1; M <= MMAX; M++) ds_matmul((ds_variant)v, &W[t], M, x, ymm, pool);
        for (int v = 0; v < 2; v++)
            for (int M = 1; M <= MMAX; M++)
                ds_attention((ds_variant)v, &as, M, NCTX - MMAX, 1, NCTX - MMAX + M, q, kc, vc, att, pool);
        n = disarm();
        CHECK(n == 0, "kernels after one sweep without a reservation: %ld allocations (want 0)", n);
    }
    ds_pool_free(pool);

    /* out of memory, no pool: canonical Q8_0 has nowhere to quantize the
     * activations and takes the no-memory path — the same bits, no crash */
    static float yref[MMAX * N_OUT];
    for (int M = 1; M <= MMAX; M += 5) {
        ds_matmul(DS_CANONICAL, &W[3], M, x, yref, NULL);
        atomic_store(&g_fail, 1);
        ds_matmul(DS_CANONICAL, &W[3], M, x, ymm, NULL);
        atomic_store(&g_fail, 0);
        CHECK(memcmp(yref, ymm, (size_t)M * N_OUT * sizeof(float)) == 0,
              "canonical Q8_0 M=%d with every allocation failing differs", M);
    }
    for (int t = 0; t < 4; t++) free(wd[t]);
}

/* ---- 3: the shipped target and drafter ------------------------------------------ */
/* tp: the target; dp: a drafter for it or NULL; what: its name in the lines */
static void model_forward(const char *tp, const char *dp, const char *what) {
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load(tp, err, sizeof err);
    if (!m) { printf("SKIP model forward: %s\n", err); return; }
    ds_drafter *d = dp ? ds_drafter_load(dp, m, err, sizeof err) : NULL;
    ds_ctx *c = ds_ctx_new(m, 256, 2, err, sizeof err);
    CHECK(c != NULL, "ctx: %s", err);
    if (!c) { ds_drafter_free(d); ds_model_free(m); return; }
    const int V = m->hp.n_vocab;
    float *logits = malloc((size_t)16 * V * sizeof(float));
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (int32_t)((i * 7919 + 13) % V);
    ds_dctx *x = NULL;
    float *taps = NULL;
    if (d) {
        CHECK(ds_set_taps(c, ds_drafter_tap_layers(d), ds_drafter_n_taps(d), err, sizeof err) == 0, "taps");
        x = ds_dctx_new(d, 256, ds_ctx_exec(c), err, sizeof err);
        taps = malloc((size_t)64 * ds_drafter_n_taps(d) * m->hp.n_embd * sizeof(float));
    }
    ds_kernel_set canon, fast;
    ds_kernel_set_all(&canon, DS_CANONICAL);
    ds_kernel_set_all(&fast, DS_FAST);
    const ds_sampler samp = {.temp = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    int32_t ids[16];
    /* the contexts reserved their scratch at creation: even the FIRST
     * forward of each shape allocates nothing (pass 0), and so does a
     * repeat (pass 1) */
    for (int pass = 0; pass < 2; pass++) {
        arm();
        ds_ctx_set_kernels(c, &canon);
        int rc = ds_kv_truncate(c, 0);
        rc |= ds_forward_batch(c, toks, 32, 0, DS_LOGITS_LAST, logits, taps, err, sizeof err);
        rc |= ds_decode(c, toks[32], 32, logits, NULL, err, sizeof err);
        rc |= ds_forward_batch(c, toks + 33, 8, 33, DS_LOGITS_ALL, logits, NULL, err, sizeof err);
        ds_ctx_set_kernels(c, &fast);
        rc |= ds_kv_truncate(c, 33);
        rc |= ds_forward_batch(c, toks + 33, 8, 33, DS_LOGITS_ALL, logits, NULL, err, sizeof err);
        if (x) {
            rc |= ds_dctx_truncate(x, 0);
            rc |= ds_dctx_append(x, taps, 32, 0, err, sizeof err);
            ds_draft_opts o = {.samp = &samp, .n_keep = ds_drafter_block_size(d)};
            rc |= ds_draft(x, toks[32], 32, &o, ids, NULL, NULL, err, sizeof err);
        }
        long n = disarm();
        CHECK(rc == 0, "forward: %s", err);
        CHECK(n == 0, "%s prefill + decode + verify(8) canonical/fast%s: %ld allocations (want 0)",
              pass ? "repeated" : "first", x ? " + draft round" : "", n);
        if (n == 0)
            printf("PASS %s, %s run: prefill, decode, verify(8) canonical and fast%s: zero allocations\n", what,
                   pass ? "repeated" : "first", x ? ", drafting round" : "");
    }
    free(taps);
    free(logits);
    ds_dctx_free(x);
    ds_ctx_free(c);
    ds_drafter_free(d);
    ds_model_free(m);
}

int main(void) {
#if !NOALLOC_HOOKS
    printf("SKIP test_noalloc: allocation hooks are off under AddressSanitizer\n");
    return 0;
#endif
    /* the hooks must see the library's calls (else every count is vacuously 0) */
    arm();
    void *p = malloc(16);
    ds_pool *probe = ds_pool_new(1);
    long seen = disarm();
    free(p);
    ds_pool_free(probe);
    CHECK(seen >= 2, "hooks count allocations (saw %ld, want >= 2)", seen);

    const size_t out_n = (size_t)4 * 2 * MMAX * (MMAX + 1) / 2 * N_OUT;
    float *a = calloc(out_n, sizeof(float)), *b = calloc(out_n, sizeof(float));
    kernels(1, a, out_n);
    printf("PASS kernels: every family and variant, M = 1..%d, zero allocations with reserved scratch\n", MMAX);
    kernels(0, b, out_n);
    CHECK(memcmp(a, b, out_n * sizeof(float)) == 0, "matmul bits with and without reserved scratch differ");
    printf("PASS kernels without a reservation: same bits, no allocation after the first sweep\n");
    free(a);
    free(b);
    model_forward("models/dspark-tiny-q8_0.gguf", "models/dspark-tiny-drafter-f16.gguf", "shipped target");
    /* the mixture of experts: routing, grouping and the experts' matmuls
     * run in the scratch reserved at context creation too */
    {
        char dir[256], path[300], err[DS_ERRLEN];
        tu_tmpdir(dir, sizeof dir);
        snprintf(path, sizeof path, "%s/moe.gguf", dir);
        ds_make_model_opts o;
        ds_make_model_defaults(&o);
        o.arch = "qwen3moe"; o.type = DS_TYPE_Q8_0;
        o.n_embd = 128; o.n_layer = 2; o.n_head = 4; o.n_head_kv = 2; o.n_ff = 256;
        o.n_expert = 8; o.n_expert_used = 3; o.n_ff_exp = 64; o.n_vocab = 400;
        CHECK(ds_make_model(&o, path, err, sizeof err) == 0, "make-model qwen3moe: %s", err);
        model_forward(path, NULL, "qwen3moe target (3 of 8 experts)");
        /* the hybrid: the gated delta net's conv and recurrence, the
         * per-row state pointers and the gated attention in the scratch and
         * the state ring made at context creation */
        snprintf(path, sizeof path, "%s/hyb.gguf", dir);
        ds_make_model_defaults(&o);
        o.arch = "qwen35"; o.type = DS_TYPE_Q8_0;
        o.n_embd = 128; o.n_layer = 4; o.n_head = 4; o.n_head_kv = 2; o.head_dim = 32; o.n_ff = 256; o.n_vocab = 400;
        CHECK(ds_make_model(&o, path, err, sizeof err) == 0, "make-model qwen35: %s", err);
        model_forward(path, NULL, "qwen35 target (3 recurrent layers, 1 gated attention)");
        tu_rmdir(dir);
    }
    return tu_finish("test_noalloc");
}
