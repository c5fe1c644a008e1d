/* test_convert.c — `dspark convert`: tiny HF checkpoints written here in C
 * (a small safetensors writer + config.json via cJSON) are converted and
 * read back with gguf_open; keys, shapes and data are checked bit-exactly
 * (F32 memcmp, F16/BF16 against ds_f32_to_fp16/bf16, Q8_0 against
 * ds_quantize_row_q8_0). Error cases check that the message names the
 * problem. The CLI (tools/cmd_convert.c) is compiled in for exit codes.
 * Everything lives in a mkdtemp directory removed at the end. */
/* test paths are built from a short mkdtemp root; truncation is impossible */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#include "convert.h"
#include "gguf.h"
#include "kernels/kernels.h"
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tools/cmd_convert.c"

typedef struct { int fails; int checks; } tc_t;

#define EXPECT(tc, cond, ...) do { (tc)->checks++; if (!(cond)) { (tc)->fails++; \
    printf("  check failed (%s:%d): ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

/* ---- synthetic checkpoints ------------------------------------------------ */
typedef struct {
    char     name[128];
    char     dtype[8];         /* F32 | F16 | BF16 | anything (raw bytes)     */
    uint32_t nd;
    uint64_t shape[2];
    uint64_t n;
    float   *vals;             /* values as decoded from the stored dtype     */
    uint8_t *bytes;
    size_t   nbytes;
    int      shard;            /* for sharded writes                          */
} tt_t;

typedef struct { tt_t *t; int n, cap; } tset_t;

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static tt_t *tset_add(tset_t *S, const char *name, const char *dtype, uint32_t nd, uint64_t s0, uint64_t s1, uint64_t seed) {
    if (S->n == S->cap) {
        S->cap = S->cap ? S->cap * 2 : 64;
        S->t = realloc(S->t, (size_t)S->cap * sizeof *S->t);
        if (!S->t) abort();
    }
    tt_t *t = &S->t[S->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->nd = nd;
    t->shape[0] = s0;
    t->shape[1] = s1;
    t->n = nd == 1 ? s0 : s0 * s1;
    size_t es = !strcmp(dtype, "F32") || !strcmp(dtype, "I32") ? 4 : 2;
    t->nbytes = (size_t)t->n * es;
    t->vals = malloc((size_t)t->n * sizeof(float) + 1);
    t->bytes = malloc(t->nbytes + 1);
    if (!t->vals || !t->bytes) abort();
    uint64_t st = seed * 7919 + 17;
    for (uint64_t i = 0; i < t->n; i++) {
        float v = (float)((double)(rng_next(&st) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        if (i % 97 == 5) v *= 1e-6f;                       /* some small values */
        if (!strcmp(dtype, "F32") || !strcmp(dtype, "I32")) {
            memcpy(t->bytes + i * 4, &v, 4);
            t->vals[i] = v;
        } else if (!strcmp(dtype, "F16")) {
            uint16_t h = ds_f32_to_fp16(v);
            memcpy(t->bytes + i * 2, &h, 2);
            t->vals[i] = ds_fp16_to_f32(h);
        } else {
            uint16_t h = ds_f32_to_bf16(v);
            memcpy(t->bytes + i * 2, &h, 2);
            t->vals[i] = ds_bf16_to_f32(h);
        }
    }
    return t;
}

static tt_t *tset_find(tset_t *S, const char *name) {
    for (int i = 0; i < S->n; i++)
        if (!strcmp(S->t[i].name, name)) return &S->t[i];
    return NULL;
}
static void tset_remove(tset_t *S, const char *name) {
    tt_t *t = tset_find(S, name);
    if (!t) abort();
    free(t->vals); free(t->bytes);
    *t = S->t[--S->n];
}
static void tset_free(tset_t *S) {
    for (int i = 0; i < S->n; i++) { free(S->t[i].vals); free(S->t[i].bytes); }
    free(S->t);
    memset(S, 0, sizeof *S);
}

/* Write the tensors of S with shard == shard (or all if shard < 0). */
static int write_st(const char *path, const tset_t *S, int shard) {
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t off = 0;
    for (int i = 0; i < S->n; i++) {
        const tt_t *t = &S->t[i];
        if (shard >= 0 && t->shard != shard) continue;
        cJSON *e = cJSON_AddObjectToObject(h, t->name);
        cJSON_AddStringToObject(e, "dtype", t->dtype);
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (uint32_t k = 0; k < t->nd; k++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[k]));
        cJSON *of = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hl = strlen(js), pad = (8 - hl % 8) % 8;
    FILE *f = fopen(path, "wb");
    if (!f) { free(js); return -1; }
    uint64_t L = hl + pad;
    uint8_t lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)(L >> (8 * i));
    fwrite(lb, 1, 8, f);
    fwrite(js, 1, hl, f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    for (int i = 0; i < S->n; i++)
        if (shard < 0 || S->t[i].shard == shard) fwrite(S->t[i].bytes, 1, S->t[i].nbytes, f);
    free(js);
    return fclose(f);
}

/* Raw file: 8-byte length (declared), header text, then `data` zero bytes. */
static int write_raw_st(const char *path, uint64_t declared_len, const char *header, size_t data) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint8_t lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)(declared_len >> (8 * i));
    fwrite(lb, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data; i++) fputc(0, f);
    return fclose(f);
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}
static int write_json(const char *path, const cJSON *j) {
    char *s = cJSON_Print(j);
    int r = write_text(path, s);
    free(s);
    return r;
}

typedef struct {
    const char *arch;      /* qwen3 | llama */
    uint32_t d, H, Hkv, hd, ffn, V, L;
    int tied, lm_head;
} shape_t;

static cJSON *make_config(const shape_t *s) {
    cJSON *c = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(!strcmp(s->arch, "qwen3") ? "Qwen3ForCausalLM" : "LlamaForCausalLM"));
    cJSON_AddStringToObject(c, "model_type", s->arch);
    cJSON_AddNumberToObject(c, "hidden_size", s->d);
    cJSON_AddNumberToObject(c, "intermediate_size", s->ffn);
    cJSON_AddNumberToObject(c, "num_hidden_layers", s->L);
    cJSON_AddNumberToObject(c, "num_attention_heads", s->H);
    cJSON_AddNumberToObject(c, "num_key_value_heads", s->Hkv);
    if (!strcmp(s->arch, "qwen3")) cJSON_AddNumberToObject(c, "head_dim", s->hd);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-5);
    cJSON_AddNumberToObject(c, "rope_theta", 500000.0);
    cJSON_AddNumberToObject(c, "max_position_embeddings", 4096);
    cJSON_AddNumberToObject(c, "vocab_size", s->V);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", s->tied);
    cJSON_AddNullToObject(c, "rope_scaling");
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddStringToObject(c, "torch_dtype", "bfloat16");
    return c;
}

static void add_layers(tset_t *S, const shape_t *s, const char *pfx, const char *dt, int qk_norm, uint64_t *seed) {
    char n[160];
    uint64_t qd = (uint64_t)s->H * s->hd, kd = (uint64_t)s->Hkv * s->hd;
    for (uint32_t l = 0; l < s->L; l++) {
#define NM(x) (snprintf(n, sizeof n, "%s%u." x, pfx, l), n)
        tset_add(S, NM("input_layernorm.weight"), dt, 1, s->d, 0, (*seed)++);
        tset_add(S, NM("self_attn.q_proj.weight"), dt, 2, qd, s->d, (*seed)++);
        tset_add(S, NM("self_attn.k_proj.weight"), dt, 2, kd, s->d, (*seed)++);
        tset_add(S, NM("self_attn.v_proj.weight"), dt, 2, kd, s->d, (*seed)++);
        tset_add(S, NM("self_attn.o_proj.weight"), dt, 2, s->d, qd, (*seed)++);
        if (qk_norm) {
            tset_add(S, NM("self_attn.q_norm.weight"), dt, 1, s->hd, 0, (*seed)++);
            tset_add(S, NM("self_attn.k_norm.weight"), dt, 1, s->hd, 0, (*seed)++);
        }
        tset_add(S, NM("post_attention_layernorm.weight"), dt, 1, s->d, 0, (*seed)++);
        tset_add(S, NM("mlp.gate_proj.weight"), dt, 2, s->ffn, s->d, (*seed)++);
        tset_add(S, NM("mlp.up_proj.weight"), dt, 2, s->ffn, s->d, (*seed)++);
        tset_add(S, NM("mlp.down_proj.weight"), dt, 2, s->d, s->ffn, (*seed)++);
#undef NM
    }
}

static void make_target(tset_t *S, const shape_t *s, const char *dt) {
    uint64_t seed = 1;
    tset_add(S, "model.embed_tokens.weight", dt, 2, s->V, s->d, seed++);
    add_layers(S, s, "model.layers.", dt, !strcmp(s->arch, "qwen3"), &seed);
    tset_add(S, "model.norm.weight", dt, 1, s->d, 0, seed++);
    if (s->lm_head) tset_add(S, "lm_head.weight", dt, 2, s->V, s->d, seed++);
}

static char *pj(const char *a, const char *b) {
    char *p = malloc(strlen(a) + strlen(b) + 2);
    sprintf(p, "%s/%s", a, b);
    return p;
}

/* A dir with config.json + model.safetensors. */
static void write_ckpt(const char *dir, const cJSON *cfg, const tset_t *S) {
    mkdir(dir, 0755);
    char *c = pj(dir, "config.json"), *m = pj(dir, "model.safetensors");
    if (write_json(c, cfg) || write_st(m, S, -1)) { printf("cannot write %s\n", dir); abort(); }
    free(c); free(m);
}

/* A small tokenizer GGUF with non-tokenizer keys that must not be copied. */
static int write_tokenizer(const char *path, uint32_t n_tok) {
    gguf_writer *w = gguf_writer_new();
    char **toks = malloc(n_tok * sizeof *toks);
    int32_t *types = malloc(n_tok * sizeof *types);
    float *scores = malloc(n_tok * sizeof *scores);
    for (uint32_t i = 0; i < n_tok; i++) {
        toks[i] = malloc(16);
        snprintf(toks[i], 16, "tok%u", i);
        types[i] = 1;
        scores[i] = -(float)i;
    }
    int r = 0;
    /* per-token arrays of the list's length: padded with it when the
     * model's vocabulary is longer */
    r |= gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_I32, types, n_tok);
    r |= gguf_set_arr(w, "tokenizer.ggml.scores", GGUF_T_F32, scores, n_tok);
    free(types);
    free(scores);
    r |= gguf_set_str(w, "general.architecture", "qwen3");
    r |= gguf_set_str(w, "general.name", "tokenizer-donor");
    r |= gguf_set_u32(w, "qwen3.block_count", 99);
    /* a loadable tokenizer (SentencePiece needs no merges): convert now
     * re-loads what it writes with the runtime loader */
    r |= gguf_set_str(w, "tokenizer.ggml.model", "llama");
    r |= gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, n_tok);
    r |= gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    char err[DS_ERRLEN];
    if (!r) r = gguf_writer_write(w, path, err, sizeof err);
    for (uint32_t i = 0; i < n_tok; i++) free(toks[i]);
    free(toks);
    gguf_writer_free(w);
    return r;
}

/* ---- checks on the output ------------------------------------------------------ */
static void check_u32(tc_t *tc, gguf_ctx *g, const char *key, uint32_t want) {
    uint32_t v = 0;
    int r = gguf_get_u32(g, key, &v);
    EXPECT(tc, r == 0 && v == want, "key %s = %u (rc %d), want %u", key, v, r, want);
}
static void check_f32(tc_t *tc, gguf_ctx *g, const char *key, float want) {
    float v = 0;
    int r = gguf_get_f32(g, key, &v);
    EXPECT(tc, r == 0 && v == want, "key %s = %g (rc %d), want %g", key, v, r, want);
}
static void check_str(tc_t *tc, gguf_ctx *g, const char *key, const char *want) {
    gguf_str s = {0};
    int r = gguf_get_str(g, key, &s);
    EXPECT(tc, r == 0 && gguf_str_eq(s, want), "key %s (rc %d) != '%s'", key, r, want);
}
static void check_bool(tc_t *tc, gguf_ctx *g, const char *key, int want) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    EXPECT(tc, kv && kv->type == GGUF_T_BOOL && kv->v.b == want, "key %s: bool %d wanted", key, want);
}
static void check_u32_arr(tc_t *tc, gguf_ctx *g, const char *key, const uint32_t *want, uint64_t n) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    int ok = kv && kv->type == GGUF_T_ARRAY && kv->arr_type == GGUF_T_U32 && kv->arr_n == n;
    for (uint64_t i = 0; ok && i < n; i++) {
        int64_t v;
        ok = !gguf_arr_i64(kv, i, &v) && v == (int64_t)want[i];
    }
    EXPECT(tc, ok, "key %s: u32 array mismatch", key);
}

/* Compare GGUF tensor gg against source tensor src converted to `type`
 * (row permutation for llama q/k when permute_heads > 0). */
static void check_tensor(tc_t *tc, gguf_ctx *g, const char *gg, uint32_t type, const tt_t *src,
                         uint32_t permute_heads, uint32_t hd) {
    const gguf_tensor *t = gguf_find_tensor(g, gg);
    EXPECT(tc, t != NULL, "tensor %s missing from output", gg);
    if (!t || !src) return;
    uint64_t ne0 = src->nd == 1 ? src->shape[0] : src->shape[1], rows = src->nd == 1 ? 1 : src->shape[0];
    if (type == DS_TYPE_Q8_0 && ne0 % 32) type = DS_TYPE_F16;   /* the converter's documented fallback */
    EXPECT(tc, t->type == type, "tensor %s type %s, want %s", gg, ds_type_name(t->type), ds_type_name(type));
    EXPECT(tc, t->n_dims == src->nd && t->ne[0] == ne0 && (src->nd == 1 || t->ne[1] == rows),
           "tensor %s: ne {%llu, %llu} n_dims %u, want {%llu, %llu}", gg, (unsigned long long)t->ne[0],
           (unsigned long long)t->ne[1], t->n_dims, (unsigned long long)ne0, (unsigned long long)rows);
    if (t->type != type) return;
    int ok;
    uint64_t rb = ds_row_bytes(type, ne0, &ok);
    EXPECT(tc, t->nbytes == rb * rows, "tensor %s: nbytes", gg);
    if (t->nbytes != rb * rows) return;
    uint8_t *exp = malloc(rb);
    int bad_row = -1;
    for (uint64_t r = 0; r < rows && bad_row < 0; r++) {
        uint64_t s = r;
        if (permute_heads) {
            uint64_t h = r / hd, rem = r % hd;
            s = h * hd + (rem % 2) * (hd / 2) + rem / 2;
        }
        const float *x = src->vals + s * ne0;
        for (uint64_t i = 0; i < ne0; i++) {
            if (type == DS_TYPE_F32) memcpy(exp + 4 * i, &x[i], 4);
            else if (type == DS_TYPE_F16) { uint16_t h = ds_f32_to_fp16(x[i]); memcpy(exp + 2 * i, &h, 2); }
            else if (type == DS_TYPE_BF16) { uint16_t h = ds_f32_to_bf16(x[i]); memcpy(exp + 2 * i, &h, 2); }
        }
        if (type == DS_TYPE_Q8_0) ds_quantize_row_q8_0(x, (int64_t)ne0, (ds_block_q8_0 *)exp);
        if (memcmp(exp, (const uint8_t *)t->data + r * rb, rb)) bad_row = (int)r;
    }
    EXPECT(tc, bad_row < 0, "tensor %s: data differs at row %d", gg, bad_row);
    free(exp);
}

static void check_ntensors(tc_t *tc, gguf_ctx *g, uint64_t want) {
    EXPECT(tc, gguf_n_tensors(g) == want, "output has %llu tensors, want %llu",
           (unsigned long long)gguf_n_tensors(g), (unsigned long long)want);
}

/* Check every layer tensor of a target/drafter trunk. */
static void check_layers(tc_t *tc, gguf_ctx *g, tset_t *S, const shape_t *s, const char *pfx, uint32_t type,
                         int qk_norm, int permute) {
    static const struct { const char *hf, *gg; int norm; } M[] = {
        {"input_layernorm.weight", "attn_norm.weight", 1},
        {"self_attn.q_proj.weight", "attn_q.weight", 0},
        {"self_attn.k_proj.weight", "attn_k.weight", 0},
        {"self_attn.v_proj.weight", "attn_v.weight", 0},
        {"self_attn.o_proj.weight", "attn_output.weight", 0},
        {"self_attn.q_norm.weight", "attn_q_norm.weight", 1},
        {"self_attn.k_norm.weight", "attn_k_norm.weight", 1},
        {"post_attention_layernorm.weight", "ffn_norm.weight", 1},
        {"mlp.gate_proj.weight", "ffn_gate.weight", 0},
        {"mlp.up_proj.weight", "ffn_up.weight", 0},
        {"mlp.down_proj.weight", "ffn_down.weight", 0},
    };
    char hf[160], gg[160];
    for (uint32_t l = 0; l < s->L; l++)
        for (size_t i = 0; i < sizeof M / sizeof *M; i++) {
            if (!qk_norm && strstr(M[i].hf, "_norm.weight") && strstr(M[i].hf, "self_attn")) continue;
            snprintf(hf, sizeof hf, "%s%u.%s", pfx, l, M[i].hf);
            snprintf(gg, sizeof gg, "blk.%u.%s", l, M[i].gg);
            uint32_t t = M[i].norm ? DS_TYPE_F32 : type;
            const tt_t *src = tset_find(S, hf);
            uint32_t ph = 0;
            if (permute && !strcmp(M[i].gg, "attn_q.weight")) ph = s->H;
            if (permute && !strcmp(M[i].gg, "attn_k.weight")) ph = s->Hkv;
            check_tensor(tc, g, gg, t, src, ph, s->hd);
        }
}

static void check_trunk_keys(tc_t *tc, gguf_ctx *g, const char *arch, const shape_t *s) {
    char k[128];
#define KK(x) (snprintf(k, sizeof k, "%s." x, arch), k)
    check_str(tc, g, "general.architecture", arch);
    check_u32(tc, g, KK("block_count"), s->L);
    check_u32(tc, g, KK("context_length"), 4096);
    check_u32(tc, g, KK("embedding_length"), s->d);
    check_u32(tc, g, KK("feed_forward_length"), s->ffn);
    check_u32(tc, g, KK("attention.head_count"), s->H);
    check_u32(tc, g, KK("attention.head_count_kv"), s->Hkv);
    check_u32(tc, g, KK("attention.key_length"), s->hd);
    check_u32(tc, g, KK("attention.value_length"), s->hd);
    check_f32(tc, g, KK("rope.freq_base"), 500000.0f);
    check_f32(tc, g, KK("attention.layer_norm_rms_epsilon"), 1e-5f);
    check_u32(tc, g, KK("vocab_size"), s->V);
#undef KK
}

/* ---- test context ------------------------------------------------------------------ */
typedef struct {
    char root[256];
    int  passed, failed;
    int  checks;
} suite_t;

static void report(suite_t *su, const char *name, tc_t *tc) {
    su->checks += tc->checks;
    if (tc->fails) { su->failed++; printf("FAIL %s (%d of %d checks failed)\n", name, tc->fails, tc->checks); }
    else { su->passed++; printf("PASS %s (%d checks)\n", name, tc->checks); }
    fflush(stdout);
}

static int do_convert(const char *in, const char *out, uint32_t type, ds_conv_kind kind, ds_conv_layout layout,
                      const char *tok, FILE *log, char *err, size_t errlen) {
    ds_convert_opts o;
    ds_convert_opts_init(&o);
    o.in_dir = in; o.out_path = out; o.type = type; o.kind = kind; o.layout = layout;
    o.tokenizer_from = tok; o.log = log;
    err[0] = 0;
    return ds_convert(&o, err, errlen);
}

static const shape_t QWEN = {"qwen3", 64, 4, 2, 16, 96, 128, 2, 0, 1};
static const shape_t LLAMA = {"llama", 64, 4, 2, 16, 80, 100, 2, 1, 0};

/* ---- qwen3 target: f32 (exact), bf16 source -> f16, q8_0 ------------------------- */
static void test_qwen3(suite_t *su) {
    static const struct { const char *src; uint32_t type; const char *name; } V[] = {
        {"F32", DS_TYPE_F32, "qwen3_f32_to_f32"},
        {"BF16", DS_TYPE_F16, "qwen3_bf16_to_f16"},
        {"F16", DS_TYPE_BF16, "qwen3_f16_to_bf16"},
        {"F32", DS_TYPE_Q8_0, "qwen3_f32_to_q8_0"},
    };
    for (size_t vi = 0; vi < sizeof V / sizeof *V; vi++) {
        tc_t tc = {0};
        tset_t S = {0};
        make_target(&S, &QWEN, V[vi].src);
        cJSON *cfg = make_config(&QWEN);
        char dir[320], out[320], tok[320], err[1024];
        snprintf(dir, sizeof dir, "%s/%s", su->root, V[vi].name);
        snprintf(out, sizeof out, "%s/%s.gguf", su->root, V[vi].name);
        snprintf(tok, sizeof tok, "%s/tokenizer.gguf", dir);
        write_ckpt(dir, cfg, &S);
        EXPECT(&tc, write_tokenizer(tok, 120) == 0, "tokenizer write");   /* picked up from DIR */
        int rc = do_convert(dir, out, V[vi].type, DS_CONV_KIND_AUTO, DS_CONV_LAYOUT_DEFAULT, NULL, NULL, err, sizeof err);
        EXPECT(&tc, rc == 0, "convert failed: %s", err);
        gguf_ctx *g = rc ? NULL : gguf_open(out, err, sizeof err);
        EXPECT(&tc, rc || g, "gguf_open: %s", err);
        if (g) {
            check_trunk_keys(&tc, g, "qwen3", &QWEN);
            check_str(&tc, g, "tokenizer.ggml.model", "llama");
            check_u32(&tc, g, "tokenizer.ggml.bos_token_id", 1);
            const gguf_kv *tk = gguf_find_kv(g, "tokenizer.ggml.tokens");
            /* 120 donor tokens, vocab_size 128: padded to one token per row
             * (llama.cpp requires it), types and scores with them */
            EXPECT(&tc, tk && tk->arr_n == 128, "tokenizer.ggml.tokens padded to vocab_size (%llu)",
                   tk ? (unsigned long long)tk->arr_n : 0ull);
            gguf_str t0 = {0}, t8 = {0};
            EXPECT(&tc, tk && !gguf_arr_str(tk, 119, &t0) && t0.len == 6 && !memcmp(t0.ptr, "tok119", 6) &&
                            !gguf_arr_str(tk, 127, &t8) && t8.len == 16 && !memcmp(t8.ptr, "<|unused_pad_7|>", 16),
                   "padded tokens: the donor's, then <|unused_pad_N|>");
            const gguf_kv *ty = gguf_find_kv(g, "tokenizer.ggml.token_type");
            const gguf_kv *sc = gguf_find_kv(g, "tokenizer.ggml.scores");
            int32_t ty0 = 0, ty8 = 0;
            if (ty && ty->arr_n == 128) { memcpy(&ty0, ty->arr_data + 119 * 4, 4); memcpy(&ty8, ty->arr_data + 127 * 4, 4); }
            EXPECT(&tc, ty && ty->arr_n == 128 && ty0 == 1 && ty8 == 5, "token_type padded with UNUSED (5)");
            EXPECT(&tc, sc && sc->arr_n == 128, "scores padded");
            uint32_t bc = 0;
            gguf_get_u32(g, "qwen3.block_count", &bc);
            EXPECT(&tc, bc == 2, "donor's qwen3.block_count must not be copied (got %u)", bc);
            check_tensor(&tc, g, "token_embd.weight", V[vi].type, tset_find(&S, "model.embed_tokens.weight"), 0, 0);
            check_tensor(&tc, g, "output_norm.weight", DS_TYPE_F32, tset_find(&S, "model.norm.weight"), 0, 0);
            check_tensor(&tc, g, "output.weight", V[vi].type, tset_find(&S, "lm_head.weight"), 0, 0);
            check_layers(&tc, g, &S, &QWEN, "model.layers.", V[vi].type, 1, 0);
            check_ntensors(&tc, g, 3 + 11 * QWEN.L);
            gguf_close(g);
        }
        cJSON_Delete(cfg);
        tset_free(&S);
        report(su, V[vi].name, &tc);
    }
}

/* ---- llama target: q/k permutation (exact, f32), tied, q8_0 with F16 fallback ------- */
static void test_llama(suite_t *su) {
    for (int q8 = 0; q8 < 2; q8++) {
        tc_t tc = {0};
        tset_t S = {0};
        make_target(&S, &LLAMA, q8 ? "BF16" : "F32");
        cJSON *cfg = make_config(&LLAMA);
        const char *name = q8 ? "llama_bf16_to_q8_0" : "llama_f32_permute";
        char dir[320], out[320], tok[320], err[1024];
        snprintf(dir, sizeof dir, "%s/%s", su->root, name);
        snprintf(out, sizeof out, "%s/%s.gguf", su->root, name);
        snprintf(tok, sizeof tok, "%s/donor.gguf", su->root);
        write_ckpt(dir, cfg, &S);
        EXPECT(&tc, write_tokenizer(tok, 100) == 0, "tokenizer write");
        char *logbuf = NULL;
        size_t loglen = 0;
        FILE *log = open_memstream(&logbuf, &loglen);
        int rc = do_convert(dir, out, q8 ? DS_TYPE_Q8_0 : DS_TYPE_F32, DS_CONV_KIND_TARGET, DS_CONV_LAYOUT_DEFAULT,
                            tok, log, err, sizeof err);
        fclose(log);
        EXPECT(&tc, rc == 0, "convert failed: %s", err);
        if (q8) EXPECT(&tc, logbuf && strstr(logbuf, "blk.0.ffn_down.weight: row length 80 is not a multiple of 32, written as F16"),
                       "Q8_0 fallback log line missing: %s", logbuf ? logbuf : "");
        gguf_ctx *g = rc ? NULL : gguf_open(out, err, sizeof err);
        EXPECT(&tc, rc || g, "gguf_open: %s", err);
        if (g) {
            check_trunk_keys(&tc, g, "llama", &LLAMA);
            EXPECT(&tc, gguf_find_tensor(g, "output.weight") == NULL, "tied: no output.weight");
            check_tensor(&tc, g, "token_embd.weight", q8 ? DS_TYPE_Q8_0 : DS_TYPE_F32,
                         tset_find(&S, "model.embed_tokens.weight"), 0, 0);
            check_layers(&tc, g, &S, &LLAMA, "model.layers.", q8 ? DS_TYPE_Q8_0 : DS_TYPE_F32, 0, 1);
            check_ntensors(&tc, g, 2 + 9 * LLAMA.L);
            if (!q8) {
                /* spot check of the permutation by hand: head 1 of attn_k (hd 16):
                 * GGUF row 16 + 2*3 + 1 = 23 is HF row 16 + 8 + 3 = 27; row 22 is HF row 19 */
                const gguf_tensor *t = gguf_find_tensor(g, "blk.1.attn_k.weight");
                const tt_t *s = tset_find(&S, "model.layers.1.self_attn.k_proj.weight");
                EXPECT(&tc, t && !memcmp((const float *)t->data + 23 * 64, s->vals + 27 * 64, 64 * 4) &&
                            !memcmp((const float *)t->data + 22 * 64, s->vals + 19 * 64, 64 * 4),
                       "attn_k rows 22/23 are HF rows 19/27");
                /* v is not permuted */
                t = gguf_find_tensor(g, "blk.1.attn_v.weight");
                s = tset_find(&S, "model.layers.1.self_attn.v_proj.weight");
                EXPECT(&tc, t && !memcmp(t->data, s->vals, s->n * 4), "attn_v unpermuted");
            }
            gguf_close(g);
        }
        free(logbuf);
        cJSON_Delete(cfg);
        tset_free(&S);
        report(su, name, &tc);
    }
}

/* ---- sharded checkpoint with an index -------------------------------------------- */
static void test_sharded(suite_t *su) {
    tc_t tc = {0};
    tset_t S = {0};
    make_target(&S, &QWEN, "F16");
    cJSON *cfg = make_config(&QWEN);
    char dir[320], out[320], err[1024];
    snprintf(dir, sizeof dir, "%s/sharded", su->root);
    snprintf(out, sizeof out, "%s/sharded.gguf", su->root);
    mkdir(dir, 0755);
    const char *shards[3] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                             "model-00003-of-00003.safetensors"};
    cJSON *idx = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(idx, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", 12345);
    cJSON *wm = cJSON_AddObjectToObject(idx, "weight_map");
    for (int i = 0; i < S.n; i++) {
        S.t[i].shard = i % 3;
        cJSON_AddStringToObject(wm, S.t[i].name, shards[i % 3]);
    }
    for (int k = 0; k < 3; k++) {
        char *p = pj(dir, shards[k]);
        EXPECT(&tc, write_st(p, &S, k) == 0, "write shard");
        free(p);
    }
    char *ip = pj(dir, "model.safetensors.index.json"), *cp = pj(dir, "config.json"), *tp = pj(dir, "tokenizer.gguf");
    write_json(ip, idx);
    write_json(cp, cfg);
    write_tokenizer(tp, 128);
    int rc = do_convert(dir, out, DS_TYPE_F16, DS_CONV_KIND_AUTO, DS_CONV_LAYOUT_DEFAULT, NULL, NULL, err, sizeof err);
    EXPECT(&tc, rc == 0, "convert failed: %s", err);
    gguf_ctx *g = rc ? NULL : gguf_open(out, err, sizeof err);
    if (g) {
        check_trunk_keys(&tc, g, "qwen3", &QWEN);
        check_layers(&tc, g, &S, &QWEN, "model.layers.", DS_TYPE_F16, 1, 0);
        /* F16 -> F16 is the identity on the bytes */
        const gguf_tensor *t = gguf_find_tensor(g, "token_embd.weight");
        const tt_t *s = tset_find(&S, "model.embed_tokens.weight");
        EXPECT(&tc, t && t->nbytes == s->nbytes && !memcmp(t->data, s->bytes, s->nbytes), "F16 bytes preserved");
        check_ntensors(&tc, g, 3 + 11 * QWEN.L);
        gguf_close(g);
    }
    report(su, "sharded_index_f16", &tc);

    /* error: a shard named by the index is missing */
    tc_t tc2 = {0};
    char *p3 = pj(dir, shards[2]);
    unlink(p3);
    rc = do_convert(dir, out, DS_TYPE_F16, DS_CONV_KIND_AUTO, DS_CONV_LAYOUT_DEFAULT, NULL, NULL, err, sizeof err);
    EXPECT(&tc2, rc != 0 && strstr(err, "model-00003-of-00003.safetensors") && strstr(err, "missing"), "err: %s", err);
    report(su, "err_shard_missing", &tc2);

    /* error: broken index JSON */
    tc_t tc3 = {0};
    write_text(ip, "{\"metadata\": {}, \"weight_map\": {\"a\": \"b\",, }}");
    rc = do_convert(dir, out, DS_TYPE_F16, DS_CONV_KIND_AUTO, DS_CONV_LAYOUT_DEFAULT, NULL, NULL, err, sizeof err);
    EXPECT(&tc3, rc != 0 && strstr(err, "model.safetensors.index.json") && strstr(err, "invalid JSON at byte 42 (line 1, column 43)"),
           "err: %s", err);
    report(su, "err_broken_index_json", &tc3);

    free(p3); free(ip); free(cp); free(tp);
    cJSON_Delete(idx);
    cJSON_Delete(cfg);
    tset_free(&S);
}

/* ---- drafters ------------------------------------------------------------------- */
typedef struct {
    const char *markov_type;
    uint32_t r, corr;
    int conf, conf_bias;
    int tl[4], n_tl;
} dcfg_t;

static const shape_t DRAFT = {"qwen3", 64, 4, 2, 16, 96, 128, 2, 0, 0};

static void make_drafter(tset_t *S, cJSON **cfg_out, const dcfg_t *dc, const char *dt) {
    uint64_t seed = 1000;
    uint64_t d = DRAFT.d, r = dc->r, V = DRAFT.V;
    tset_add(S, "fc.weight", dt, 2, d, (uint64_t)dc->n_tl * d, seed++);
    tset_add(S, "hidden_norm.weight", dt, 1, d, 0, seed++);
    add_layers(S, &DRAFT, "layers.", dt, 1, &seed);
    tset_add(S, "norm.weight", dt, 1, d, 0, seed++);
    tset_add(S, "markov_head.markov_w1.weight", dt, 2, V, r, seed++);
    tset_add(S, "markov_head.markov_w2.weight", dt, 2, V, r, seed++);
    if (!strcmp(dc->markov_type, "gated")) {
        tset_add(S, "markov_head.gate_proj.weight", dt, 2, r, d + r, seed++);
        tset_add(S, "markov_head.gate_proj.bias", dt, 1, r, 0, seed++);
    } else if (!strcmp(dc->markov_type, "rnn")) {
        tset_add(S, "markov_head.joint_proj.weight", dt, 2, 3 * r, 2 * r + d, seed++);
        tset_add(S, "markov_head.joint_proj.bias", dt, 1, 3 * r, 0, seed++);
    }
    if (dc->conf) {
        tset_add(S, "confidence_head.proj.weight", dt, 2, 1, d + r, seed++);
        if (dc->conf_bias) tset_add(S, "confidence_head.proj.bias", dt, 1, 1, 0, seed++);
    }
    if (dc->corr) {
        tset_add(S, "hidden_correction.hidden_norm.weight", dt, 1, d, 0, seed++);
        tset_add(S, "hidden_correction.embed_norm.weight", dt, 1, d, 0, seed++);
        tset_add(S, "hidden_correction.gate_proj.weight", dt, 2, dc->corr, 2 * d, seed++);
        tset_add(S, "hidden_correction.up_proj.weight", dt, 2, dc->corr, 2 * d, seed++);
        tset_add(S, "hidden_correction.down_proj.weight", dt, 2, d, dc->corr, seed++);
    }
    tset_add(S, "embed_tokens.weight", dt, 2, V, d, seed++);   /* shared copy: not written */
    cJSON *c = make_config(&DRAFT);
    cJSON_AddNumberToObject(c, "block_size", 7);
    cJSON *tl = cJSON_AddArrayToObject(c, "target_layer_ids");
    for (int i = 0; i < dc->n_tl; i++) cJSON_AddItemToArray(tl, cJSON_CreateNumber(dc->tl[i]));
    cJSON_AddNumberToObject(c, "mask_token_id", 120);
    cJSON_AddNumberToObject(c, "markov_rank", r);
    cJSON_AddStringToObject(c, "markov_head_type", dc->markov_type);
    *cfg_out = c;
}

static void test_drafters(suite_t *su) {
    static const dcfg_t DC[3] = {
        {"vanilla", 32, 0, 1, 1, {1, 3}, 2},
        {"rnn", 16, 48, 0, 0, {-1, 2, 5}, 3},
        {"gated", 32, 64, 1, 0, {0, 2}, 2},
    };
    for (int di = 0; di < 3; di++) {
        const dcfg_t *dc = &DC[di];
        tset_t S = {0};
        cJSON *cfg;
        make_drafter(&S, &cfg, dc, di == 0 ? "BF16" : di == 1 ? "F32" : "F16");
        char dir[320], err[1024];
        snprintf(dir, sizeof dir, "%s/drafter%d", su->root, di);
        write_ckpt(dir, cfg, &S);
        for (int lay = 0; lay < 2; lay++) {
            tc_t tc = {0};
            char out[320], name[64];
            int dsp = lay == 1;
            snprintf(name, sizeof name, "drafter_%s_%s", dc->markov_type, dsp ? "dspark" : "dflash");
            snprintf(out, sizeof out, "%s/%s.gguf", su->root, name);
            uint32_t type = di == 0 ? DS_TYPE_F32 : di == 1 ? DS_TYPE_Q8_0 : DS_TYPE_F16;
            int rc = do_convert(dir, out, type, DS_CONV_KIND_AUTO, dsp ? DS_CONV_LAYOUT_DSPARK : DS_CONV_LAYOUT_DFLASH,
                                NULL, NULL, err, sizeof err);
            if (dsp && di == 1) {
                /* target_layer_ids contains -1: not representable in dspark */
                EXPECT(&tc, rc != 0 && strstr(err, "-1") && strstr(err, "dspark"), "err: %s", err);
                report(su, "err_dspark_layout_minus1", &tc);
                continue;
            }
            EXPECT(&tc, rc == 0, "convert failed: %s", err);
            gguf_ctx *g = rc ? NULL : gguf_open(out, err, sizeof err);
            if (g) {
                const char *A = dsp ? "dspark" : "dflash";
                check_trunk_keys(&tc, g, A, &DRAFT);
                uint32_t tl[4];
                for (int i = 0; i < dc->n_tl; i++) tl[i] = (uint32_t)(dc->tl[i] + (dsp ? 0 : 1));
                if (dsp) {
                    check_u32(&tc, g, "dspark.dspark.block_size", 7);
                    check_u32(&tc, g, "dspark.dspark.mask_token_id", 120);
                    check_u32_arr(&tc, g, "dspark.dspark.target_layers", tl, (uint64_t)dc->n_tl);
                    check_u32(&tc, g, "dspark.dspark.markov_rank", dc->r);
                    check_bool(&tc, g, "dspark.dspark.confidence_head", dc->conf);
                    check_bool(&tc, g, "dspark.dspark.confidence_head_with_markov", dc->conf);
                    check_bool(&tc, g, "dspark.dspark.hidden_correction", dc->corr > 0);
                    check_u32(&tc, g, "dspark.dspark.correction_size", dc->corr);
                    check_str(&tc, g, "dspark.markov_head_type", dc->markov_type);
                    check_str(&tc, g, "tokenizer.ggml.model", "none");
                } else {
                    check_u32(&tc, g, "dflash.block_size", 7);
                    check_u32_arr(&tc, g, "dflash.target_layers", tl, (uint64_t)dc->n_tl);
                    check_u32(&tc, g, "dflash.target_hidden_size", DRAFT.d);
                    check_str(&tc, g, "dflash.sample_from_anchor", "true");
                    check_bool(&tc, g, "dflash.has_confidence_head", dc->conf);
                    check_bool(&tc, g, "dflash.attention.causal", 0);
                    check_u32(&tc, g, "tokenizer.ggml.mask_token_id", 120);
                    check_str(&tc, g, "dflash.markov_head_type", dc->markov_type);
                    check_u32(&tc, g, "dflash.markov_rank", dc->r);
                }
                uint32_t mt = type, m1t = type;
                const char *P = dsp ? "dspark." : "";
                char n1[96];
#define GN(dfl, dsps) (dsp ? (dsps) : (dfl))
                check_tensor(&tc, g, GN("fc.weight", "dspark.fc.weight"), mt, tset_find(&S, "fc.weight"), 0, 0);
                check_tensor(&tc, g, GN("enc.output_norm.weight", "dspark.hidden_norm.weight"), DS_TYPE_F32,
                             tset_find(&S, "hidden_norm.weight"), 0, 0);
                check_tensor(&tc, g, "output_norm.weight", DS_TYPE_F32, tset_find(&S, "norm.weight"), 0, 0);
                check_layers(&tc, g, &S, &DRAFT, "layers.", type, 1, 0);
                check_tensor(&tc, g, GN("markov_w1.weight", "dspark.markov_head_a.weight"), m1t,
                             tset_find(&S, "markov_head.markov_w1.weight"), 0, 0);
                check_tensor(&tc, g, GN("markov_w2.weight", "dspark.markov_head_b.weight"), m1t,
                             tset_find(&S, "markov_head.markov_w2.weight"), 0, 0);
                uint64_t nt = 3 + 11 * DRAFT.L + 2;
                if (dc->conf) {
                    check_tensor(&tc, g, GN("conf_proj.weight", "dspark.confidence_head.weight"), DS_TYPE_F32,
                                 tset_find(&S, "confidence_head.proj.weight"), 0, 0);
                    if (dc->conf_bias) {
                        check_tensor(&tc, g, GN("conf_proj.bias", "dspark.confidence_head.bias"), DS_TYPE_F32,
                                     tset_find(&S, "confidence_head.proj.bias"), 0, 0);
                        nt++;
                    } else {
                        EXPECT(&tc, !gguf_find_tensor(g, GN("conf_proj.bias", "dspark.confidence_head.bias")),
                               "no confidence bias");
                    }
                    nt++;
                }
                if (!strcmp(dc->markov_type, "gated")) {
                    snprintf(n1, sizeof n1, "%smarkov_gate.weight", P);
                    check_tensor(&tc, g, n1, mt, tset_find(&S, "markov_head.gate_proj.weight"), 0, 0);
                    snprintf(n1, sizeof n1, "%smarkov_gate.bias", P);
                    check_tensor(&tc, g, n1, DS_TYPE_F32, tset_find(&S, "markov_head.gate_proj.bias"), 0, 0);
                    nt += 2;
                }
                if (!strcmp(dc->markov_type, "rnn")) {
                    snprintf(n1, sizeof n1, "%smarkov_joint.weight", P);
                    check_tensor(&tc, g, n1, mt, tset_find(&S, "markov_head.joint_proj.weight"), 0, 0);
                    snprintf(n1, sizeof n1, "%smarkov_joint.bias", P);
                    check_tensor(&tc, g, n1, DS_TYPE_F32, tset_find(&S, "markov_head.joint_proj.bias"), 0, 0);
                    nt += 2;
                }
                if (dc->corr) {
                    static const char *const C[5][2] = {
                        {"hidden_correction.hidden_norm.weight", "correction_hidden_norm.weight"},
                        {"hidden_correction.embed_norm.weight", "correction_embed_norm.weight"},
                        {"hidden_correction.gate_proj.weight", "correction_gate.weight"},
                        {"hidden_correction.up_proj.weight", "correction_up.weight"},
                        {"hidden_correction.down_proj.weight", "correction_down.weight"},
                    };
                    for (int k = 0; k < 5; k++) {
                        snprintf(n1, sizeof n1, "%s%s", P, C[k][1]);
                        uint32_t ct = k < 2 ? DS_TYPE_F32 : mt;
                        check_tensor(&tc, g, n1, ct, tset_find(&S, C[k][0]), 0, 0);
                    }
                    check_u32(&tc, g, dsp ? "dspark.dspark.correction_size" : "dflash.correction_size", dc->corr);
                    nt += 5;
                }
#undef GN
                EXPECT(&tc, !gguf_find_tensor(g, "token_embd.weight") && !gguf_find_tensor(g, "embed_tokens.weight"),
                       "embeddings must not be written");
                check_ntensors(&tc, g, nt);
                gguf_close(g);
            }
            report(su, name, &tc);
        }
        cJSON_Delete(cfg);
        tset_free(&S);
    }
}

/* ---- error cases on a valid qwen3 base ------------------------------------------- */
static void err_case(suite_t *su, const char *name, const char *dir, const char *want1, const char *want2) {
    tc_t tc = {0};
    char out[320], err[1024], tok[320];
    snprintf(out, sizeof out, "%s/%s.gguf", su->root, name);
    snprintf(tok, sizeof tok, "%s/donor.gguf", su->root);
    int rc = do_convert(dir, out, DS_TYPE_F32, DS_CONV_KIND_AUTO, DS_CONV_LAYOUT_DEFAULT, tok, NULL, err, sizeof err);
    EXPECT(&tc, rc != 0, "conversion should fail");
    EXPECT(&tc, strstr(err, want1) != NULL, "error '%s' lacks '%s'", err, want1);
    if (want2) EXPECT(&tc, strstr(err, want2) != NULL, "error '%s' lacks '%s'", err, want2);
    EXPECT(&tc, access(out, F_OK) != 0, "no output file on failure");
    char tmp[340];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    EXPECT(&tc, access(tmp, F_OK) != 0, "no temp file on failure");
    printf("  %s: %s\n", name, err);
    report(su, name, &tc);
}

static void test_errors(suite_t *su) {
    char dir[320], *p;
    cJSON *cfg = make_config(&QWEN);
    /* missing tensor */
    {
        tset_t S = {0};
        make_target(&S, &QWEN, "F32");
        tset_remove(&S, "model.layers.1.mlp.up_proj.weight");
        snprintf(dir, sizeof dir, "%s/e_missing", su->root);
        write_ckpt(dir, cfg, &S);
        err_case(su, "err_missing_tensor", dir, "missing tensor 'model.layers.1.mlp.up_proj.weight'", "[96, 64]");
        tset_free(&S);
    }
    /* extra tensor */
    {
        tset_t S = {0};
        make_target(&S, &QWEN, "F32");
        tset_add(&S, "model.layers.0.self_attn.q_proj.bias", "F32", 1, 64, 0, 5);
        snprintf(dir, sizeof dir, "%s/e_extra", su->root);
        write_ckpt(dir, cfg, &S);
        err_case(su, "err_extra_tensor", dir, "unexpected tensor 'model.layers.0.self_attn.q_proj.bias'", NULL);
        tset_free(&S);
    }
    /* mis-shaped tensor */
    {
        tset_t S = {0};
        make_target(&S, &QWEN, "F32");
        tset_remove(&S, "model.layers.1.self_attn.k_proj.weight");
        tset_add(&S, "model.layers.1.self_attn.k_proj.weight", "F32", 2, 64, 64, 6);
        snprintf(dir, sizeof dir, "%s/e_shape", su->root);
        write_ckpt(dir, cfg, &S);
        err_case(su, "err_misshaped_tensor", dir,
                 "tensor 'model.layers.1.self_attn.k_proj.weight' has shape [64, 64], expected [32, 64]", NULL);
        tset_free(&S);
    }
    /* unsupported dtype */
    {
        tset_t S = {0};
        make_target(&S, &QWEN, "F32");
        tset_remove(&S, "model.norm.weight");
        tset_add(&S, "model.norm.weight", "I32", 1, 64, 0, 7);
        snprintf(dir, sizeof dir, "%s/e_dtype", su->root);
        write_ckpt(dir, cfg, &S);
        err_case(su, "err_int_dtype", dir, "'model.norm.weight' has dtype I32", NULL);
        tset_free(&S);
    }
    /* broken config JSON */
    {
        tset_t S = {0};
        make_target(&S, &QWEN, "F32");
        snprintf(dir, sizeof dir, "%s/e_config", su->root);
        write_ckpt(dir, cfg, &S);
        p = pj(dir, "config.json");
        write_text(p, "{\n  \"hidden_size\": 64,\n  \"vocab_size\": ,\n}\n");
        free(p);
        err_case(su, "err_broken_config_json", dir, "config.json: invalid JSON at byte", "line 3");
        /* missing required key */
        cJSON *c2 = make_config(&QWEN);
        cJSON_DeleteItemFromObject(c2, "intermediate_size");
        p = pj(dir, "config.json");
        write_json(p, c2);
        free(p);
        cJSON_Delete(c2);
        err_case(su, "err_config_missing_key", dir, "missing required key 'intermediate_size'", NULL);
        tset_free(&S);
    }
    /* no tokenizer for a target */
    {
        tc_t tc = {0};
        tset_t S = {0};
        make_target(&S, &QWEN, "F32");
        snprintf(dir, sizeof dir, "%s/e_notok", su->root);
        write_ckpt(dir, cfg, &S);
        char out[320], err[1024];
        snprintf(out, sizeof out, "%s/e_notok.gguf", su->root);
        int rc = do_convert(dir, out, DS_TYPE_F32, DS_CONV_KIND_AUTO, DS_CONV_LAYOUT_DEFAULT, NULL, NULL, err, sizeof err);
        EXPECT(&tc, rc != 0 && strstr(err, "no tokenizer: pass --tokenizer-from"), "err: %s", err);
        report(su, "err_no_tokenizer", &tc);
        tset_free(&S);
    }
    /* raw safetensors corruption */
    struct { const char *name; uint64_t decl; const char *hdr; size_t data; const char *w1, *w2; } R[] = {
        {"err_truncated_header", 4096, "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 16,
         "truncated safetensors header", "4096"},
        {"err_offsets_beyond_file", 0, "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [64], \"data_offsets\": [0, 256]}}", 100,
         "'model.norm.weight': data_offsets [0, 256] out of range", "100 bytes"},
        {"err_offsets_vs_shape", 0, "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [64], \"data_offsets\": [0, 128]}}", 256,
         "'model.norm.weight'", "needs 256"},
        {"err_unknown_dtype", 0, "{\"model.norm.weight\": {\"dtype\": \"Q4\", \"shape\": [64], \"data_offsets\": [0, 32]}}", 32,
         "'model.norm.weight' has unknown dtype 'Q4'", NULL},
        {"err_broken_header_json", 0, "{\"model.norm.weight\": {\"dtype\": \"F32\" \"shape\": [64]}}", 0,
         "invalid safetensors header JSON", "byte"},
        /* a space-padded header declared one byte short: the JSON still
         * parses, but every tensor would be read one byte off */
        {"err_header_one_byte_short", 81, "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [64], \"data_offsets\": [0, 256]}}  ", 256,
         "cover 256 bytes but the data section is 257", NULL},
        {"err_tensors_overlap", 0, "{\"a\": {\"dtype\": \"F32\", \"shape\": [64], \"data_offsets\": [0, 256]}, "
         "\"b\": {\"dtype\": \"F32\", \"shape\": [64], \"data_offsets\": [128, 384]}}", 384, "overlaps", NULL},
    };
    for (size_t i = 0; i < sizeof R / sizeof *R; i++) {
        snprintf(dir, sizeof dir, "%s/e_raw%zu", su->root, i);
        mkdir(dir, 0755);
        p = pj(dir, "config.json");
        write_json(p, cfg);
        free(p);
        p = pj(dir, "model.safetensors");
        write_raw_st(p, R[i].decl ? R[i].decl : strlen(R[i].hdr), R[i].hdr, R[i].data);
        free(p);
        err_case(su, R[i].name, dir, R[i].w1, R[i].w2);
    }
    /* numbers the loader would refuse are refused at conversion (and none
     * reaches an out-of-range float -> int cast) */
    {
        struct { const char *name, *key; double v; const char *want; } C[] = {
            {"err_layers_2p31", "num_hidden_layers", 2147483648.0, "'num_hidden_layers' must be an integer in [1, 1073741824]"},
            {"err_layers_vs_tensors", "num_hidden_layers", 1000, "num_hidden_layers 1000 needs at least 9000 tensors"},
            {"err_rope_theta_huge", "rope_theta", 1e300, "'rope_theta' must be a number in"},
            {"err_eps_tiny", "rms_norm_eps", 1e-300, "'rms_norm_eps' must be a number in"},
            {"err_ctx_2p31", "max_position_embeddings", 2147483648.0, "'max_position_embeddings' must be an integer"},
            {"err_hidden_1e300", "hidden_size", 1e300, "'hidden_size' must be an integer"},
        };
        tset_t S = {0};
        make_target(&S, &QWEN, "F32");
        for (size_t i = 0; i < sizeof C / sizeof *C; i++) {
            cJSON *c2 = make_config(&QWEN);
            cJSON_DeleteItemFromObject(c2, C[i].key);
            cJSON_AddNumberToObject(c2, C[i].key, C[i].v);
            snprintf(dir, sizeof dir, "%s/e_num%zu", su->root, i);
            write_ckpt(dir, c2, &S);
            cJSON_Delete(c2);
            err_case(su, C[i].name, dir, C[i].want, NULL);
        }
        tset_free(&S);
    }
    /* an output that is an input is refused, and the input is untouched */
    {
        tc_t tc = {0};
        tset_t S = {0};
        make_target(&S, &QWEN, "F32");
        snprintf(dir, sizeof dir, "%s/e_inout", su->root);
        write_ckpt(dir, cfg, &S);
        char tok[320], err[1024];
        snprintf(tok, sizeof tok, "%s/donor.gguf", su->root);
        const char *names[] = { "config.json", "model.safetensors" };
        for (int i = 0; i < 2; i++) {
            char *in = pj(dir, names[i]);
            struct stat before, after;
            stat(in, &before);
            int rc = do_convert(dir, in, DS_TYPE_F32, DS_CONV_KIND_AUTO, DS_CONV_LAYOUT_DEFAULT, tok, NULL, err, sizeof err);
            stat(in, &after);
            EXPECT(&tc, rc != 0 && strstr(err, "refusing to write"), "--out %s: %s", names[i], rc ? err : "accepted");
            EXPECT(&tc, before.st_size == after.st_size && before.st_ino == after.st_ino, "%s was modified", names[i]);
            free(in);
        }
        /* the tokenizer source too, through a symlink */
        char link[340];
        snprintf(link, sizeof link, "%s/tok_link.gguf", su->root);
        EXPECT(&tc, symlink(tok, link) == 0, "symlink %s: cannot make it", link);
        int rc = do_convert(dir, link, DS_TYPE_F32, DS_CONV_KIND_AUTO, DS_CONV_LAYOUT_DEFAULT, tok, NULL, err, sizeof err);
        EXPECT(&tc, rc != 0 && strstr(err, "same file as the input"), "--out symlink to the tokenizer: %s", rc ? err : "accepted");
        report(su, "err_output_is_input", &tc);
        tset_free(&S);
    }
    /* reader robustness: every prefix of a valid file fails cleanly (no crash) */
    {
        tc_t tc = {0};
        tset_t S = {0};
        tset_add(&S, "x", "F32", 2, 3, 5, 1);
        tset_add(&S, "y", "BF16", 1, 7, 0, 2);
        char path[320];
        snprintf(path, sizeof path, "%s/small.safetensors", su->root);
        write_st(path, &S, -1);
        FILE *f = fopen(path, "rb");
        uint8_t buf[4096];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        char err[512];
        ds_st_file *full = ds_st_open_mem(buf, n, "small", err, sizeof err);
        EXPECT(&tc, full && ds_st_n_tensors(full) == 2, "full file parses: %s", err);
        if (full) {
            const ds_st_tensor *y = ds_st_find(full, "y");
            float v[7];
            EXPECT(&tc, y && !ds_st_read_f32(y, 0, 7, v) && !memcmp(v, tset_find(&S, "y")->vals, sizeof v), "bf16 read");
        }
        ds_st_close(full);
        int crashes_or_accepts = 0;
        for (size_t k = 0; k < n; k++) {
            ds_st_file *t = ds_st_open_mem(buf, k, "prefix", err, sizeof err);
            if (t) { crashes_or_accepts++; ds_st_close(t); }
        }
        EXPECT(&tc, crashes_or_accepts == 0, "%d truncated prefixes were accepted", crashes_or_accepts);
        tset_free(&S);
        report(su, "reader_truncations", &tc);
    }
    cJSON_Delete(cfg);
}

/* ---- CLI exit codes ---------------------------------------------------------------- */
static int run_cli(int n, const char **args) {
    char *argv[16];
    for (int i = 0; i < n; i++) argv[i] = (char *)args[i];
    argv[n] = NULL;
    return cmd_convert(n, argv);
}

static void test_cli(suite_t *su) {
    tc_t tc = {0};
    char in[320], out[320], tok[320], bad[320];
    snprintf(in, sizeof in, "%s/qwen3_f32_to_f32", su->root);
    snprintf(out, sizeof out, "%s/cli.gguf", su->root);
    snprintf(tok, sizeof tok, "%s/donor.gguf", su->root);
    snprintf(bad, sizeof bad, "%s/e_missing", su->root);
    const char *a1[] = {"convert"};
    EXPECT(&tc, run_cli(1, a1) == 2, "no args -> 2");
    const char *a2[] = {"convert", "--in", in, "--out", out, "--type", "q4"};
    EXPECT(&tc, run_cli(7, a2) == 2, "bad --type -> 2");
    const char *a3[] = {"convert", "--in", in, "--out"};
    EXPECT(&tc, run_cli(4, a3) == 2, "missing value -> 2");
    const char *a4[] = {"convert", "--in", in, "--out", out, "--bogus"};
    EXPECT(&tc, run_cli(6, a4) == 2, "unknown flag -> 2");
    const char *a5[] = {"convert", "--in", in, "--out", out, "--kind", "target", "--layout", "dspark"};
    EXPECT(&tc, run_cli(9, a5) == 2, "--layout with target -> 2");
    const char *a6[] = {"convert", "--in", bad, "--out", out, "--tokenizer-from", tok, "--quiet"};
    EXPECT(&tc, run_cli(8, a6) == 2, "conversion error -> 2");
    EXPECT(&tc, access(out, F_OK) != 0, "no output after failure");
    const char *a7[] = {"convert", "--in", in, "--out", out, "--type", "bf16", "--tokenizer-from", tok,
                        "--name", "tiny", "--quiet"};
    EXPECT(&tc, run_cli(12, a7) == 0, "success -> 0");
    char err[512];
    gguf_ctx *g = gguf_open(out, err, sizeof err);
    EXPECT(&tc, g != NULL, "cli output opens: %s", err);
    if (g) {
        check_str(&tc, g, "general.name", "tiny");
        const gguf_tensor *t = gguf_find_tensor(g, "blk.0.attn_q.weight");
        EXPECT(&tc, t && t->type == DS_TYPE_BF16, "bf16 weights");
        gguf_close(g);
    }
    report(su, "cli_exit_codes", &tc);
}

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

int main(void) {
    suite_t su = {0};
    snprintf(su.root, sizeof su.root, "/tmp/dspark_test_convert_XXXXXX");
    if (!mkdtemp(su.root)) { perror("mkdtemp"); return 1; }
    char tok[320];
    snprintf(tok, sizeof tok, "%s/donor.gguf", su.root);
    if (write_tokenizer(tok, 100)) { printf("FAIL cannot write donor tokenizer\n"); return 1; }
    test_qwen3(&su);
    test_llama(&su);
    test_sharded(&su);
    test_drafters(&su);
    test_errors(&su);
    test_cli(&su);
    nftw(su.root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    printf("%d passed, %d failed (%d checks)\n", su.passed, su.failed, su.checks);
    return su.failed ? 1 : 0;
}
