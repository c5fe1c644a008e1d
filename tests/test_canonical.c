/* test_canonical.c — dspark's exactness contract at model level.
 *
 * For every weight type (F32, F16, BF16, Q8_0 and the kquant types Q4_0,
 * Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), every width M = 1..16 and
 * start positions on both sides of the attention chunk boundaries (64, 128):
 * row t of ds_forward_batch in canonical mode is memcmp-identical to
 * ds_decode of the same token at the same position from the same state S0 —
 * logits, every layer's K and V rows, and taps.
 *
 * And the counter-test: with the matmul family fast, and separately the
 * attention family fast, some row differs in bits, so this test is shown to
 * be able to fail. Plus thread-count invariance and greedy generation with
 * batched prefill == all-decode generation. */
#include "testutil.h"
#include "generate.h"
#include "model.h"
#include "model_make.h"

#define N_CTX 200
static const int k_pos0[] = { 0, 5, 50, 60, 63, 64, 120, 127, 150 };
#define N_POS0 (int)(sizeof k_pos0 / sizeof k_pos0[0])
static const int k_taps[] = { 0, 2 };

typedef struct {
    float *logits, *taps, *k, *v;   /* M rows each */
    ds_state st;                     /* hybrid models: the recurrent states after the pass */
} pass_out;

static void kv_rows(ds_ctx *c, int pos0, int M, float *k, float *v) { ds_ctx_read_kv(c, pos0, M, k, v); }

static void pass_alloc(pass_out *p, const ds_model *m, int M) {
    size_t kvd = (size_t)m->hp.n_head_kv * m->hp.head_dim;
    p->logits = malloc((size_t)M * m->hp.n_vocab * sizeof(float));
    p->taps = malloc((size_t)M * 2 * m->hp.n_embd * sizeof(float));
    p->k = malloc((size_t)ds_hp_kv_layers(&m->hp) * M * kvd * sizeof(float));
    p->v = malloc((size_t)ds_hp_kv_layers(&m->hp) * M * kvd * sizeof(float));
    memset(&p->st, 0, sizeof p->st);
}
static void pass_free(pass_out *p) { free(p->logits); free(p->taps); free(p->k); free(p->v); ds_state_free(&p->st); }

/* A hybrid model's recurrent state after a pass (a host copy of the
 * context's state buffers, rstate.h) */
static void grab_state(ds_ctx *c, pass_out *o) {
    if (!ds_ctx_model(c)->hp.n_rec) return;
    ds_state_free(&o->st);
    if (ds_state_save(c, &o->st)) { printf("FAIL state_save\n"); exit(1); }
}

/* Pass A: one batched call. */
static void run_batch(ds_ctx *c, const int32_t *toks, int pos0, int M, pass_out *o) {
    char err[DS_ERRLEN];
    if (ds_forward_batch(c, toks + pos0, M, pos0, DS_LOGITS_ALL, o->logits, o->taps, err, sizeof err)) {
        printf("FAIL forward_batch: %s\n", err);
        exit(1);
    }
    kv_rows(c, pos0, M, o->k, o->v);
    grab_state(c, o);
}
/* Pass B: the same tokens through sequential decode. */
static void run_decode(ds_ctx *c, const int32_t *toks, int pos0, int M, pass_out *o) {
    char err[DS_ERRLEN];
    size_t V = (size_t)ds_ctx_model(c)->hp.n_vocab, T = 2 * (size_t)ds_ctx_model(c)->hp.n_embd;
    for (int r = 0; r < M; r++)
        if (ds_decode(c, toks[pos0 + r], pos0 + r, o->logits + r * V, o->taps + r * T, err, sizeof err)) {
            printf("FAIL decode: %s\n", err);
            exit(1);
        }
    kv_rows(c, pos0, M, o->k, o->v);
    grab_state(c, o);
}

/* Two snapshots' current states (rstate.h: two buffers, the current one
 * named by cur) and positions, memcmp. */
static int same_rstate(const ds_rstate_snap *a, const ds_rstate_snap *b, const ds_model *m) {
    const ds_layer_shape sh = ds_hp_layer_shape(&m->hp);
    const size_t sn = (size_t)m->hp.n_rec * ((size_t)(sh.gdn.d_conv - 1) * sh.gdn.conv_dim +
                                             (size_t)sh.gdn.n_v_head * sh.gdn.head_dim * sh.gdn.head_dim);
    return a->data && b->data && a->pos == b->pos &&
           !memcmp(a->data + (size_t)a->cur * sn, b->data + (size_t)b->cur * sn, sn * sizeof(float));
}

static int same(const pass_out *a, const pass_out *b, const ds_model *m, int M) {
    size_t kvd = (size_t)m->hp.n_head_kv * m->hp.head_dim, nl = (size_t)ds_hp_kv_layers(&m->hp);
    /* the recurrent state after the block: every recurrent layer's conv
     * window and recurrence, and the position it is at */
    const int rs_same = !m->hp.n_rec || same_rstate(&a->st.rs, &b->st.rs, m);
    return !memcmp(a->logits, b->logits, (size_t)M * m->hp.n_vocab * sizeof(float)) &&
           !memcmp(a->taps, b->taps, (size_t)M * 2 * m->hp.n_embd * sizeof(float)) &&
           !memcmp(a->k, b->k, nl * M * kvd * sizeof(float)) &&
           !memcmp(a->v, b->v, nl * M * kvd * sizeof(float)) && rs_same;
}

/* Sweep pos0 x M with kernel set ks; return the number of (pos0, M) cases
 * where the batched pass differs from decode. */
static int sweep(ds_ctx *c, const int32_t *toks, const ds_kernel_set *ks, int m_max) {
    char err[DS_ERRLEN];
    int differing = 0;
    pass_out a, b;
    pass_alloc(&a, ds_ctx_model(c), 16);
    pass_alloc(&b, ds_ctx_model(c), 16);
    for (int pi = 0; pi < N_POS0; pi++) {
        int pos0 = k_pos0[pi];
        ds_ctx_set_kernels(c, ks);
        ds_kv_truncate(c, 0);
        if (pos0 > 0 && ds_forward_batch(c, toks, pos0, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err)) { printf("FAIL prefill: %s\n", err); exit(1); }
        ds_state s0;
        if (ds_state_save(c, &s0)) { printf("FAIL state_save\n"); exit(1); }
        for (int M = 1; M <= m_max; M++) {
            ds_state_restore(c, &s0);
            run_batch(c, toks, pos0, M, &a);
            ds_state_restore(c, &s0);
            run_decode(c, toks, pos0, M, &b);
            if (!same(&a, &b, ds_ctx_model(c), M)) differing++;
        }
        ds_state_free(&s0);
    }
    pass_free(&a);
    pass_free(&b);
    return differing;
}

/* n_expert / n_used / n_ff_shexp: the qwen3moe shape (ignored by the dense archs) */
static ds_model *make_moe(const char *dir, const char *name, uint32_t type, const char *arch, int n_expert, int n_used,
                          int n_ff_shexp) {
    char path[512], err[DS_ERRLEN];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    ds_make_model_opts o;
    ds_make_model_defaults(&o);
    o.arch = arch; o.type = type;
    o.n_expert = n_expert; o.n_expert_used = n_used; o.n_ff_exp = ds_type_block_elems(type) == 256 ? 256 : 64;
    o.n_ff_shexp = n_ff_shexp;
    o.n_embd = 128; o.n_layer = 3; o.n_head = 4; o.n_head_kv = 2; o.head_dim = 32; o.n_ff = 256;
    if (ds_type_block_elems(type) == 256) {     /* K types: rows of whole super-blocks */
        o.n_embd = 256; o.head_dim = 64; o.n_ff = 256;
    }
    o.n_vocab = 384; o.n_ctx = 512; o.seed = 7;
    if (ds_make_model(&o, path, err, sizeof err)) { printf("FAIL make-model: %s\n", err); exit(1); }
    ds_model *m = ds_model_load_on(path, tu_device(), err, sizeof err);
    if (!m) { printf("FAIL load: %s\n", err); exit(1); }
    return m;
}

static ds_model *make(const char *dir, const char *name, uint32_t type, const char *arch) {
    return make_moe(dir, name, type, arch, 8, 2, 0);
}

/* A context with two taps and the all-canonical sweep over M = 1..16: the
 * differing cases (*cp: the context, for the counter-tests). */
static int canonical_sweep(const ds_model *m, const int32_t *toks, ds_ctx **cp) {
    char err[DS_ERRLEN];
    ds_ctx *c = *cp = ds_ctx_new(m, N_CTX, 2, err, sizeof err);
    if (!c) { printf("FAIL ctx: %s\n", err); exit(1); }
    CHECK(ds_set_taps(c, k_taps, 2, err, sizeof err) == 0, "taps: %s", err);
    ds_kernel_set ks;
    ds_kernel_set_all(&ks, DS_CANONICAL);
    return sweep(c, toks, &ks, 16);
}

/* The mixture of experts (qwen3moe): the same property and counter-tests,
 * and moe_route's own: with only the route fast, rows differ. Two shapes:
 * 2 of 8 experts (F32, Q8_0) and 4 of 16 (Q4_K), so that some experts are
 * chosen by several rows of one batch and others by none. */
static void test_moe(const char *dir, const int32_t *toks) {
    /* the last: qwen35moe's FFN, the experts plus a gated shared expert */
    static const struct { uint32_t type; int n_expert, n_used, n_ff_shexp; } cases[] = {
        { DS_TYPE_F32, 8, 2, 0 }, { DS_TYPE_Q8_0, 8, 2, 0 }, { DS_TYPE_Q4_K, 16, 4, 0 }, { DS_TYPE_Q8_0, 8, 2, 96 } };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const uint32_t type = cases[ci].type;
        if (getenv("DSPARK_SAN") && ci == 2) { printf("SKIP canonical_property arch=qwen3moe type=Q4_K under the sanitizers\n"); continue; }
        char name[64];
        snprintf(name, sizeof name, "moe-%s-%zu", ds_type_name(type), ci);
        ds_model *m = make_moe(dir, name, type, "qwen3moe", cases[ci].n_expert, cases[ci].n_used, cases[ci].n_ff_shexp);
        ds_ctx *c;
        int d = canonical_sweep(m, toks, &c);
        ds_kernel_set ks;
        CHECK(d == 0, "qwen3moe %s canonical: %d of %d (pos0, M) cases differ from decode", ds_type_name(type), d, N_POS0 * 16);
        printf("%s canonical_property type=%s arch=qwen3moe experts=%d/%d shared_expert=%d cases=%d differing=%d\n",
               d ? "FAIL" : "PASS", ds_type_name(type), cases[ci].n_used, cases[ci].n_expert, cases[ci].n_ff_shexp,
               N_POS0 * 16, d);
        /* counter-tests: the experts' matmul family fast, then the route alone */
        const int fams[2] = { ds_matmul_family(type), DS_FAM_MOE_ROUTE };
        for (int fi = 0; fi < 2; fi++) {
            ds_kernel_set_all(&ks, DS_CANONICAL);
            ks.v[fams[fi]] = DS_FAST;
            d = sweep(c, toks, &ks, 8);
            CHECK(d > 0, "qwen3moe: fast %s never differed from decode", ds_family_name(fams[fi]));
            printf("%s counter_test arch=qwen3moe family=%s differing=%d\n", d > 0 ? "PASS" : "FAIL", ds_family_name(fams[fi]), d);
        }
        ds_ctx_free(c);
        ds_model_free(m);
    }
}

/* The hybrid (qwen35): gated delta net layers (every layer but each 3rd,
 * here) and gated full attention. The property now includes the recurrent
 * state: after a batched block of M rows (M = 1..16) it is decode's after
 * the same tokens (memcmp of every recurrent layer's conv window and
 * recurrence). Counter-tests: the gdn family alone fast, and the weights'
 * matmul family fast. Then the rollback: a 12-row verify cut back to each
 * of its rows (checkpoint + replay) holds decode's state there (memcmp),
 * and decoding on from there is the decode-only sequence bit for bit. */
static void test_hybrid(const char *dir, const int32_t *toks) {
    static const uint32_t types[] = {DS_TYPE_F32, DS_TYPE_Q8_0};
    char err[DS_ERRLEN];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        char path[512];
        snprintf(path, sizeof path, "%s/hyb-%s.gguf", dir, ds_type_name(types[ti]));
        ds_make_model_opts o;
        ds_make_model_defaults(&o);
        o.arch = "qwen35"; o.type = types[ti];
        o.n_embd = 128; o.n_layer = 3; o.n_head = 4; o.n_head_kv = 2; o.head_dim = 32; o.n_ff = 256;
        o.n_vocab = 384; o.n_ctx = 512; o.seed = 9; o.full_attn_interval = 3;
        if (ds_make_model(&o, path, err, sizeof err)) { printf("FAIL make-model: %s\n", err); exit(1); }
        ds_model *m = ds_model_load_on(path, tu_device(), err, sizeof err);
        if (!m) { printf("FAIL load: %s\n", err); exit(1); }
        ds_ctx *c;
        int d = canonical_sweep(m, toks, &c);
        CHECK(d == 0, "qwen35 %s canonical: %d of %d (pos0, M) cases differ from decode", ds_type_name(types[ti]), d, N_POS0 * 16);
        printf("%s canonical_property type=%s arch=qwen35 recurrent_layers=%d cases=%d differing=%d (logits, taps, K/V, recurrent states)\n",
               d ? "FAIL" : "PASS", ds_type_name(types[ti]), m->hp.n_rec, N_POS0 * 16, d);
        const int fams[2] = { DS_FAM_GDN, ds_matmul_family(types[ti]) };
        for (int fi = 0; fi < 2; fi++) {
            ds_kernel_set ks;
            ds_kernel_set_all(&ks, DS_CANONICAL);
            ks.v[fams[fi]] = DS_FAST;
            d = sweep(c, toks, &ks, 8);
            CHECK(d > 0, "qwen35: fast %s never differed from decode", ds_family_name(fams[fi]));
            printf("%s counter_test arch=qwen35 family=%s differing=%d\n", d > 0 ? "PASS" : "FAIL", ds_family_name(fams[fi]), d);
        }
        /* rollback: prefill 40, verify 12 rows, cut back to 40 + j + 1, decode 6 more;
         * the reference decodes 40 + j + 1 + 6 tokens one by one */
        ds_kernel_set canon;
        ds_kernel_set_all(&canon, DS_CANONICAL);
        ds_ctx_set_kernels(c, &canon);
        const size_t V = (size_t)m->hp.n_vocab;
        float *la = malloc(12 * V * sizeof(float)), *lb = malloc(V * sizeof(float)), *lr = malloc(V * sizeof(float));
        int bad = 0, cuts = 0, st_bad = 0;
        ds_ctx *cr = ds_ctx_new(m, N_CTX, 1, err, sizeof err);
        for (int j = 0; j < 12; j++) {
            ds_kv_truncate(c, 0);
            if (ds_forward_batch(c, toks, 40, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err) ||
                ds_forward_batch(c, toks + 40, 12, 40, DS_LOGITS_ALL, la, NULL, err, sizeof err)) { printf("FAIL %s\n", err); exit(1); }
            CHECK(ds_kv_truncate(c, 40 + j + 1) == 0, "rollback to %d refused", 40 + j + 1);
            ds_kv_truncate(cr, 0);
            for (int p = 0; p < 40 + j + 1; p++)
                if (ds_decode(cr, toks[p], p, lr, NULL, err, sizeof err)) { printf("FAIL %s\n", err); exit(1); }
            bad += memcmp(la + (size_t)j * V, lr, V * sizeof(float)) != 0;
            /* the rolled-back (replayed) state is decode's after those tokens */
            ds_state sa, sb;
            if (ds_state_save(c, &sa) || ds_state_save(cr, &sb)) { printf("FAIL state_save\n"); exit(1); }
            st_bad += !same_rstate(&sa.rs, &sb.rs, m);
            ds_state_free(&sa);
            ds_state_free(&sb);
            for (int p = 40 + j + 1; p < 40 + j + 7; p++) {
                const int32_t t = (int32_t)((p * 7 + 3) % 383);   /* other tokens than the block's */
                if (ds_decode(c, t, p, lb, NULL, err, sizeof err) || ds_decode(cr, t, p, lr, NULL, err, sizeof err)) {
                    printf("FAIL %s\n", err);
                    exit(1);
                }
                bad += memcmp(lb, lr, V * sizeof(float)) != 0;
            }
            cuts++;
        }
        CHECK(bad == 0, "qwen35: %d logits rows after a rollback differ from decode-only", bad);
        CHECK(st_bad == 0, "qwen35: %d rolled-back recurrent states differ from decode's", st_bad);
        printf("%s rollback arch=qwen35 type=%s cuts=%d rows=%d differing=%d states_differing=%d (verify 12, cut back to each row "
               "by checkpoint + replay, state memcmp decode's, decode 6 on)\n",
               bad || st_bad ? "FAIL" : "PASS", ds_type_name(types[ti]), cuts, cuts * 7, bad, st_bad);
        /* a rollback past the checkpoint is refused, not wrong */
        ds_kv_truncate(c, 0);
        if (ds_forward_batch(c, toks, 100, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err)) { printf("FAIL %s\n", err); exit(1); }
        CHECK(ds_kv_truncate(c, 50) == -1, "a rollback past the kept states was accepted");
        CHECK(ds_decode(c, toks[50], 50, lb, NULL, err, sizeof err) == -1 && strstr(err, "recurrent state"),
              "a decode at a position whose state is gone: %s", err);
        printf("PASS rollback past the checkpoint refused: %s\n", err);
        free(la); free(lb); free(lr);
        ds_ctx_free(cr);
        ds_ctx_free(c);
        ds_model_free(m);
    }
}

/* DeepSeek V4 (deepseek4): low-rank Q, one KV head (K = V), sinks and a
 * 40-position window (so positions 50..166 attend a window that starts
 * inside a chunk), output groups, 4 hyper-connection streams with 20
 * Sinkhorn iterations, the sqrtsoftplus MoE with its bias and a shared
 * expert (the first layer hash-routed: its experts by token id). The property (logits, taps = the streams' mean, K/V rows) for
 * M = 1..16, then a counter-test per new family and for the route and
 * the weights' matmul family: each alone fast makes rows differ. */
static void test_ds4(const char *dir, const int32_t *toks) {
    static const uint32_t types[] = {DS_TYPE_Q8_0, DS_TYPE_F32};
    char err[DS_ERRLEN];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        char path[512];
        snprintf(path, sizeof path, "%s/ds4-%s.gguf", dir, ds_type_name(types[ti]));
        ds_make_model_opts o;
        ds_make_model_defaults(&o);
        o.arch = "deepseek4"; o.type = types[ti];
        o.n_embd = 64; o.n_layer = 3; o.n_head = 4; o.head_dim = 64; o.n_rot = 16; o.q_lora = 64; o.o_groups = 2;
        o.o_lora = 32; o.hc = 4; o.hc_iters = 20; o.n_swa = 40; o.n_expert = 8; o.n_expert_used = 2; o.n_ff_exp = 64;
        o.n_vocab = 384; o.n_ctx = 512; o.seed = 11;
        o.n_hash = 1;                            /* layer 0 routes by token id (a hash layer), 1 and 2 select */
        if (ds_make_model(&o, path, err, sizeof err)) { printf("FAIL make-model: %s\n", err); exit(1); }
        ds_model *m = ds_model_load_on(path, tu_device(), err, sizeof err);
        if (!m) { printf("FAIL load: %s\n", err); exit(1); }
        ds_ctx *c;
        int d = canonical_sweep(m, toks, &c);
        CHECK(d == 0, "deepseek4 %s canonical: %d of %d (pos0, M) cases differ from decode", ds_type_name(types[ti]), d, N_POS0 * 16);
        printf("%s canonical_property type=%s arch=deepseek4 hc=%d window=%d hash_layers=%d cases=%d differing=%d (logits, taps, K/V)\n",
               d ? "FAIL" : "PASS", ds_type_name(types[ti]), m->hp.hc, m->hp.n_swa, m->layers[0].tid2eid != NULL, N_POS0 * 16, d);
        const int fams[5] = {DS_FAM_ATTN_SINKS, DS_FAM_HC_PRE, DS_FAM_HC_POST, DS_FAM_MOE_ROUTE, ds_matmul_family(types[ti])};
        /* the families' counter-tests on the F32 model: on Q8_0 a last-bit
         * change in the attention output rarely survives the activation
         * quantization of wo_a (none did here), so there only the matmul */
        for (int fi = ti ? 0 : 4; fi < 5; fi++) {
            ds_kernel_set ks;
            ds_kernel_set_all(&ks, DS_CANONICAL);
            ks.v[fams[fi]] = DS_FAST;
            d = sweep(c, toks, &ks, 4);
            CHECK(d > 0, "deepseek4: fast %s never differed from decode", ds_family_name(fams[fi]));
            printf("%s counter_test arch=deepseek4 family=%s differing=%d\n", d > 0 ? "PASS" : "FAIL", ds_family_name(fams[fi]), d);
        }
        ds_ctx_free(c);
        ds_model_free(m);
    }
}

int main(void) {
    char dir[256], err[DS_ERRLEN];
    tu_tmpdir(dir, sizeof dir);
    int32_t toks[N_CTX];
    for (int i = 0; i < N_CTX; i++) toks[i] = (int32_t)((i * 131 + 17) % 383);

    static const uint32_t types[] = { DS_TYPE_F32,  DS_TYPE_F16,  DS_TYPE_BF16, DS_TYPE_Q8_0,
                                      DS_TYPE_Q4_0, DS_TYPE_Q4_1, DS_TYPE_Q5_0, DS_TYPE_Q5_1,
                                      DS_TYPE_Q4_K, DS_TYPE_Q5_K, DS_TYPE_Q6_K };
    for (int ti = 0; ti < (int)(sizeof types / sizeof types[0]); ti++) {
        const char *arch = ti == 1 || ti == 5 || ti == 9 ? "llama" : "qwen3";   /* cover both architectures */
        /* Q4_1 / Q5_1: CPU only so far (the CUDA backend refuses them; its other
         * kquant types are src/kernels/cuda/matmul_kq.cu) */
        if ((types[ti] == DS_TYPE_Q4_1 || types[ti] == DS_TYPE_Q5_1) && strcmp(tu_device(), "cpu")) {
            printf("SKIP canonical_property type=%s on device %s\n", ds_type_name(types[ti]), tu_device());
            continue;
        }
        /* under the sanitizers one legacy and one K type stand for the seven
         * kquant families (the same engine; the plain run covers all seven) */
        if (getenv("DSPARK_SAN") && ds_type_is_kq(types[ti]) && types[ti] != DS_TYPE_Q4_1 && types[ti] != DS_TYPE_Q6_K) {
            printf("SKIP canonical_property type=%s under the sanitizers\n", ds_type_name(types[ti]));
            continue;
        }
        ds_model *m = make(dir, ds_type_name(types[ti]), types[ti], arch);
        ds_ctx *c;
        int d = canonical_sweep(m, toks, &c);
        ds_kernel_set ks;
        CHECK(d == 0, "%s/%s canonical: %d of %d (pos0, M) cases differ from decode", ds_type_name(types[ti]), arch, d, N_POS0 * 16);
        printf("%s canonical_property type=%s arch=%s cases=%d differing=%d\n", d ? "FAIL" : "PASS", ds_type_name(types[ti]), arch, N_POS0 * 16, d);

        /* counter-test 1: the matmul family of this weight type fast */
        ds_kernel_set_all(&ks, DS_CANONICAL);
        ks.v[ds_matmul_family(types[ti])] = DS_FAST;
        d = sweep(c, toks, &ks, 8);
        CHECK(d > 0, "%s: fast %s never differed from decode (the check could not fail)", ds_type_name(types[ti]), ds_family_name(ds_matmul_family(types[ti])));
        printf("%s counter_test family=%s differing=%d\n", d > 0 ? "PASS" : "FAIL", ds_family_name(ds_matmul_family(types[ti])), d);

        /* counter-test 2: attention fast (differs once a prefix spans chunks) */
        if (ti == 0) {
            ds_kernel_set_all(&ks, DS_CANONICAL);
            ks.v[DS_FAM_ATTENTION] = DS_FAST;
            d = sweep(c, toks, &ks, 8);
            CHECK(d > 0, "fast attention never differed from decode");
            printf("%s counter_test family=attention differing=%d\n", d > 0 ? "PASS" : "FAIL", d);
        }
        ds_ctx_free(c);
        ds_model_free(m);
    }

    test_moe(dir, toks);   /* the CPU and CUDA (moe.cu) */
    if (!strcmp(tu_device(), "cpu")) test_hybrid(dir, toks);
    else printf("SKIP canonical_property arch=qwen35 on device %s (no gated delta net kernels there yet)\n", tu_device());
    if (!strcmp(tu_device(), "cpu")) test_ds4(dir, toks);
    else printf("SKIP canonical_property arch=deepseek4 on device %s (no attn_sinks / hc kernels there yet)\n", tu_device());

    /* thread-count invariance: canonical and fast, 1 vs 2 vs 3 threads */
    {
        ds_model *m = make(dir, "threads", DS_TYPE_Q8_0, "qwen3");
        const int M = 12, pos0 = 60;
        float *ref[2] = { NULL, NULL };
        int ok = 1;
        for (int nt = 1; nt <= 3; nt++) {
            ds_ctx *c = ds_ctx_new(m, N_CTX, nt, err, sizeof err);
            for (int v = 0; v < 2; v++) {
                ds_ctx_set_variant(c, v ? DS_FAST : DS_CANONICAL);
                ds_kv_truncate(c, 0);
                float *lg = malloc((size_t)(pos0 + M) * m->hp.n_vocab * sizeof(float));
                ds_forward_batch(c, toks, pos0 + M, 0, DS_LOGITS_ALL, lg, NULL, err, sizeof err);
                if (!ref[v]) ref[v] = lg;
                else { ok &= !memcmp(ref[v], lg, (size_t)(pos0 + M) * m->hp.n_vocab * sizeof(float)); free(lg); }
            }
            ds_ctx_free(c);
        }
        CHECK(ok, "outputs depend on the thread count");
        printf("%s thread_invariance threads=1,2,3 variants=canonical,fast\n", ok ? "PASS" : "FAIL");
        free(ref[0]); free(ref[1]);

        /* greedy generation: batched prefill == all-decode */
        ds_ctx *c = ds_ctx_new(m, N_CTX, 2, err, sizeof err);
        int32_t out_a[48], out_b[48];
        ds_gen_stats st;
        ds_gen_opts o = { 48, DS_PREFILL_BATCH, 0, NULL, NULL };
        CHECK(ds_generate_greedy(c, toks, 70, &o, out_a, &st, err, sizeof err) == 0, "gen: %s", err);
        int na = st.n_gen;
        o.prefill = DS_PREFILL_DECODE;
        CHECK(ds_generate_greedy(c, toks, 70, &o, out_b, &st, err, sizeof err) == 0, "gen: %s", err);
        int g_ok = na == st.n_gen && !memcmp(out_a, out_b, (size_t)na * sizeof(int32_t));
        CHECK(g_ok, "greedy output with batched prefill differs from all-decode");
        printf("%s greedy_batched_prefill_equals_decode n_gen=%d\n", g_ok ? "PASS" : "FAIL", na);
        ds_ctx_free(c);
        ds_model_free(m);
    }
    tu_rmdir(dir);
    return tu_finish("test_canonical");
}
