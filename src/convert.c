/* convert.c — HF safetensors + config.json -> GGUF (see convert.h).
 *
 * ---- target mapping (arch = qwen3 | llama) -------------------------------
 * config.json                    GGUF key
 *   hidden_size                  {arch}.embedding_length
 *   intermediate_size            {arch}.feed_forward_length
 *   num_hidden_layers            {arch}.block_count
 *   num_attention_heads          {arch}.attention.head_count
 *   num_key_value_heads (=heads) {arch}.attention.head_count_kv
 *   head_dim (=hidden/heads)     {arch}.attention.key_length, .value_length,
 *                                {arch}.rope.dimension_count
 *   rms_norm_eps (1e-6)          {arch}.attention.layer_norm_rms_epsilon
 *   rope_theta (10000)           {arch}.rope.freq_base
 *   max_position_embeddings      {arch}.context_length (0 if absent)
 *   vocab_size                   {arch}.vocab_size
 *   tie_word_embeddings (false)  lm_head skipped when true
 *   (also general.architecture, general.name, general.file_type)
 *
 * HF tensor                                   GGUF tensor          HF shape
 *   model.embed_tokens.weight                 token_embd.weight    [V, d]
 *   model.norm.weight                         output_norm.weight   [d]
 *   lm_head.weight (skipped if tied/absent)   output.weight        [V, d]
 *   model.layers.N.input_layernorm.weight     blk.N.attn_norm.weight    [d]
 *   model.layers.N.self_attn.q_proj.weight    blk.N.attn_q.weight       [H*hd, d]
 *   model.layers.N.self_attn.k_proj.weight    blk.N.attn_k.weight       [Hkv*hd, d]
 *   model.layers.N.self_attn.v_proj.weight    blk.N.attn_v.weight       [Hkv*hd, d]
 *   model.layers.N.self_attn.o_proj.weight    blk.N.attn_output.weight  [d, H*hd]
 *   model.layers.N.self_attn.q_norm.weight    blk.N.attn_q_norm.weight  [hd]  (qwen3)
 *   model.layers.N.self_attn.k_norm.weight    blk.N.attn_k_norm.weight  [hd]  (qwen3)
 *   model.layers.N.post_attention_layernorm   blk.N.ffn_norm.weight     [d]
 *   model.layers.N.mlp.gate_proj.weight       blk.N.ffn_gate.weight     [ffn, d]
 *   model.layers.N.mlp.up_proj.weight         blk.N.ffn_up.weight       [ffn, d]
 *   model.layers.N.mlp.down_proj.weight       blk.N.ffn_down.weight     [d, ffn]
 * "*.rotary_emb.inv_freq" buffers of old checkpoints are ignored.
 *
 * HF [out, in] row-major is ggml ne = {in, out}: the bytes are in the same
 * order, only the dimension list is reversed.
 *
 * Llama q/k permutation. HF Llama applies RoPE with rotate_half: within a
 * head, element i is paired with element i + hd/2. ggml's NORMAL rope (which
 * dspark uses for arch "llama", as llama.cpp does) pairs adjacent elements
 * 2i, 2i+1. Like llama.cpp's convert_hf_to_gguf.py we permute the ROWS of
 * attn_q (n_head heads) and attn_k (n_head_kv heads):
 *   W.reshape(n_head, 2, hd/2, in).swapaxes(1, 2).reshape(out, in)
 * i.e. GGUF row  h*hd + 2*i + j  = HF row  h*hd + j*hd/2 + i  (j in {0,1}).
 * Qwen3 uses NEOX rope (rotate_half pairs) and is not permuted. Since
 * q_norm/k_norm would need the same permutation, they are Qwen3-only.
 *
 * ---- drafter mapping (DeepSpec layout) --------------------------------------
 * config.json (on top of the target fields above, which describe the draft
 * trunk: num_hidden_layers = draft layers):
 *   block_size (req.), target_layer_ids (req., HF ids, -1 = embeddings),
 *   mask_token_id (req.), markov_rank (else from markov_w1's shape, else 0),
 *   markov_head_type (vanilla|gated|rnn, default vanilla),
 *   target_hidden_size (default hidden_size),
 *   confidence head: present iff confidence_head.proj.weight exists, unless
 *     a bool use_confidence_head / confidence_head / has_confidence_head says
 *     otherwise; confidence_head_with_markov (bool) or inferred from the
 *     shape ([1, d+r] = with Markov, [1, d] = without),
 *   hidden correction: bool hidden_correction, or presence of
 *     hidden_correction.gate_proj.weight; width
 *     hidden_correction_intermediate_size or gate_proj's rows.
 *
 * HF tensor                          layout dflash            layout dspark                     HF shape
 *   fc.weight                        fc.weight                dspark.fc.weight                  [d, m*dt]
 *   hidden_norm.weight               enc.output_norm.weight   dspark.hidden_norm.weight         [d]
 *   norm.weight                      output_norm.weight       output_norm.weight                [d]
 *   layers.N.<as target, without "model.">  blk.N.*          blk.N.*
 *   markov_head.markov_w1.weight     markov_w1.weight         dspark.markov_head_a.weight       [V, r]
 *   markov_head.markov_w2.weight     markov_w2.weight         dspark.markov_head_b.weight       [V, r]
 *   markov_head.gate_proj.weight     markov_gate.weight       dspark.markov_gate.weight         [r, d+r]   (gated)
 *   markov_head.gate_proj.bias       markov_gate.bias         dspark.markov_gate.bias           [r]        (gated)
 *   markov_head.joint_proj.weight    markov_joint.weight      dspark.markov_joint.weight        [3r, 2r+d] (rnn)
 *   markov_head.joint_proj.bias      markov_joint.bias        dspark.markov_joint.bias          [3r]       (rnn)
 *   confidence_head.proj.weight      conf_proj.weight         dspark.confidence_head.weight     [1, d(+r)]
 *   confidence_head.proj.bias (opt.) conf_proj.bias           dspark.confidence_head.bias       [1]
 *   hidden_correction.hidden_norm.weight  correction_hidden_norm.weight  dspark.correction_hidden_norm.weight [d]
 *   hidden_correction.embed_norm.weight   correction_embed_norm.weight   dspark.correction_embed_norm.weight  [d]
 *   hidden_correction.gate_proj.weight    correction_gate.weight         dspark.correction_gate.weight        [w, 2d]
 *   hidden_correction.up_proj.weight      correction_up.weight           dspark.correction_up.weight          [w, 2d]
 *   hidden_correction.down_proj.weight    correction_down.weight         dspark.correction_down.weight        [d, w]
 *   embed_tokens.weight, lm_head.weight   (validated [V, d], not written: shared with the target)
 * (markov_gate / markov_joint / correction_* in the dflash layout are dspark's
 * names: mainline llama.cpp defines no tensors for them.)
 *
 * dflash keys: general.architecture = "dflash", dflash.block_size,
 *   dflash.target_layers (u32[], HF ids + 1), dflash.target_hidden_size,
 *   dflash.sample_from_anchor = "true" (string), dflash.has_confidence_head,
 *   dflash.attention.causal = false, tokenizer.ggml.mask_token_id,
 *   dflash.markov_rank, dflash.markov_head_type (when r > 0),
 *   dflash.confidence_head_with_markov, dflash.hidden_correction and
 *   dflash.correction_size (when a correction head exists), and the standard
 *   dflash.* hyper-parameter keys of the target table.
 * dspark keys: general.architecture = "dspark", dspark.dspark.block_size,
 *   .mask_token_id, .target_layers (u32[], HF ids, NOT +1; -1 is rejected),
 *   .markov_rank, .confidence_head, .confidence_head_with_markov,
 *   .hidden_correction, .correction_size, dspark.markov_head_type, and the
 *   standard dspark.* hyper-parameter keys; tokenizer.ggml.model = "none"
 *   when no tokenizer is copied.
 */
#include "convert.h"
#include "json_text.h"

#include "drafter.h"
#include "gguf.h"
#include "kernels/kernels.h"
#include "model.h"
#include "outfile.h"
#include "safetensors.h"
#include "tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

/* Every count in config.json is held to the target loader's bound. */
#define CONV_MAX_COUNT (1u << 30)

void ds_convert_opts_init(ds_convert_opts *o) {
    memset(o, 0, sizeof *o);
    o->type = DS_TYPE_F16;
}

static void logln(const ds_convert_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logln(const ds_convert_opts *o, const char *fmt, ...) {
    if (!o->log) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("convert: ", o->log);
    vfprintf(o->log, fmt, ap);
    fputc('\n', o->log);
    va_end(ap);
}

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

/* ---- config.json ------------------------------------------------------------ */
typedef struct {
    cJSON *root;
    char   path[64];    /* "config.json" for messages */
} cfg_t;

static cJSON *read_json(const char *path, const char *label, char *err, size_t errlen) {
    FILE *fp = fopen(path, "rb");
    if (!fp) { ds_errf(err, errlen, "%s: cannot open %s: %s", label, path, strerror(errno)); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (!b) break;
        if (n + 1 >= cap) {
            if (cap >= (1u << 28)) { free(b); b = NULL; break; }
            char *nb = realloc(b, cap * 2);
            if (!nb) { free(b); b = NULL; break; }
            b = nb; cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - 1 - n, fp);
        n += r;
        if (!r) break;
    }
    fclose(fp);
    if (!b) { ds_errf(err, errlen, "%s: too large or out of memory", label); return NULL; }
    char why[DS_ERRLEN];
    cJSON *j = ds_json_text_parse(b, n, why, sizeof why);   /* one value, nothing after it */
    if (!j) {
        ds_errf(err, errlen, "%s: %s", label, why);
    } else if (!cJSON_IsObject(j)) {
        ds_errf(err, errlen, "%s: top level is not a JSON object", label);
        cJSON_Delete(j);
        j = NULL;
    }
    free(b);
    return j;
}

/* -1 absent (or JSON null), -2 bad value, 0 ok */
static int cfg_int(const cfg_t *c, const char *key, int64_t lo, int64_t hi, int64_t *out, char *err, size_t errlen) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!j || cJSON_IsNull(j)) return -1;
    double d = cJSON_IsNumber(j) ? j->valuedouble : -1e300;
    /* range first, then integrality: casting an out-of-range double to an
     * integer is undefined behaviour (UBSan float-cast-overflow) */
    if (!cJSON_IsNumber(j) || !(d >= (double)lo && d <= (double)hi) || d != floor(d)) {
        ds_errf(err, errlen, "%s: key '%s' must be an integer in [%lld, %lld]", c->path, key, (long long)lo, (long long)hi);
        return -2;
    }
    *out = (int64_t)d;
    return 0;
}
static int cfg_u32(const cfg_t *c, const char *key, int required, uint32_t def, uint32_t min,
                   uint32_t *out, char *err, size_t errlen) {
    int64_t v;
    /* the loader's bound for every count (model.c get_u32_req): accepting
     * more here would only produce a file dspark then refuses to load */
    int r = cfg_int(c, key, min, CONV_MAX_COUNT, &v, err, errlen);
    if (r == -2) return -1;
    if (r == -1) {
        if (required) { ds_errf(err, errlen, "%s: missing required key '%s'", c->path, key); return -1; }
        *out = def;
        return 0;
    }
    *out = (uint32_t)v;
    return 0;
}
/* A number in the open interval (lo, hi): the ranges the loaders accept. */
static int cfg_float(const cfg_t *c, const char *key, float def, double lo, double hi, float *out, char *err, size_t errlen) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!j || cJSON_IsNull(j)) { *out = def; return 0; }
    if (!cJSON_IsNumber(j) || !(j->valuedouble > lo && j->valuedouble < hi) ||
        !((float)j->valuedouble > (float)lo && (float)j->valuedouble < (float)hi)) {
        ds_errf(err, errlen, "%s: key '%s' must be a number in (%g, %g) (what dspark loads)", c->path, key, lo, hi);
        return -1;
    }
    *out = (float)j->valuedouble;
    return 0;
}
/* -1 absent, 0/1 value, -2 wrong type (error written) */
static int cfg_bool(const cfg_t *c, const char *key, char *err, size_t errlen) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!j || cJSON_IsNull(j)) return -1;
    if (!cJSON_IsBool(j)) { ds_errf(err, errlen, "%s: key '%s' must be true or false", c->path, key); return -2; }
    return cJSON_IsTrue(j) ? 1 : 0;
}
static const char *cfg_str(const cfg_t *c, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

/* ---- hyper-parameters --------------------------------------------------- */
typedef struct {
    const char *arch;          /* "qwen3" | "llama" (trunk flavour)            */
    uint32_t d, ffn, n_layer, n_head, n_head_kv, hd, n_ctx, n_vocab;
    float    eps, rope_theta;
    int      tied;
    /* drafter */
    uint32_t block_size, mask_token_id, markov_rank, target_hidden, corr_size, n_target_layers;
    int32_t  target_layers[64];
    const char *markov_type;   /* vanilla | gated | rnn                        */
    int      has_conf, conf_with_markov, has_corr;
} hparams_t;

static int contains_ci(const char *s, const char *sub) {
    size_t n = strlen(sub);
    for (; *s; s++)
        if (!strncasecmp(s, sub, n)) return 1;
    return 0;
}

static int detect_arch(const cfg_t *c, hparams_t *hp, char *err, size_t errlen) {
    const char *mt = cfg_str(c, "model_type");
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(c->root, "architectures");
    const char *a0 = cJSON_IsArray(archs) && cJSON_IsString(cJSON_GetArrayItem(archs, 0))
                     ? cJSON_GetArrayItem(archs, 0)->valuestring : NULL;
    if (mt && !strcmp(mt, "qwen3")) hp->arch = "qwen3";
    else if (mt && !strcmp(mt, "llama")) hp->arch = "llama";
    else if (!mt && a0 && contains_ci(a0, "qwen3") && !contains_ci(a0, "moe")) hp->arch = "qwen3";
    else if (!mt && a0 && !strncmp(a0, "Llama", 5)) hp->arch = "llama";
    else {
        ds_errf(err, errlen, "%s: unsupported model_type '%s' (architectures[0] '%s'); supported: qwen3, llama",
                c->path, mt ? mt : "(none)", a0 ? a0 : "(none)");
        return -1;
    }
    return 0;
}

static int read_trunk_hparams(const cfg_t *c, hparams_t *hp, char *err, size_t errlen) {
    if (detect_arch(c, hp, err, errlen)) return -1;
    if (cfg_u32(c, "hidden_size", 1, 0, 1, &hp->d, err, errlen) ||
        cfg_u32(c, "intermediate_size", 1, 0, 1, &hp->ffn, err, errlen) ||
        cfg_u32(c, "num_hidden_layers", 1, 0, 1, &hp->n_layer, err, errlen) ||
        cfg_u32(c, "num_attention_heads", 1, 0, 1, &hp->n_head, err, errlen) ||
        cfg_u32(c, "vocab_size", 1, 0, 1, &hp->n_vocab, err, errlen) ||
        cfg_u32(c, "num_key_value_heads", 0, hp->n_head, 1, &hp->n_head_kv, err, errlen) ||
        cfg_u32(c, "max_position_embeddings", 0, 0, 0, &hp->n_ctx, err, errlen))
        return -1;
    if (hp->d % hp->n_head && !cJSON_GetObjectItemCaseSensitive(c->root, "head_dim")) {
        ds_errf(err, errlen, "%s: hidden_size %u is not a multiple of num_attention_heads %u and head_dim is absent",
                c->path, hp->d, hp->n_head);
        return -1;
    }
    if (cfg_u32(c, "head_dim", 0, hp->d / hp->n_head, 1, &hp->hd, err, errlen)) return -1;
    if (hp->n_head % hp->n_head_kv) {
        ds_errf(err, errlen, "%s: num_attention_heads %u is not a multiple of num_key_value_heads %u",
                c->path, hp->n_head, hp->n_head_kv);
        return -1;
    }
    if (hp->hd % 2) {
        ds_errf(err, errlen, "%s: head_dim %u must be even for RoPE", c->path, hp->hd);
        return -1;
    }
    if ((uint64_t)hp->n_head * hp->hd > UINT32_MAX) {
        ds_errf(err, errlen, "%s: num_attention_heads * head_dim overflows", c->path);
        return -1;
    }
    if (cfg_float(c, "rms_norm_eps", 1e-6f, 0.0, 1.0, &hp->eps, err, errlen) ||
        cfg_float(c, "rope_theta", 10000.0f, 1.0, 1e12, &hp->rope_theta, err, errlen))
        return -1;
    int t = cfg_bool(c, "tie_word_embeddings", err, errlen);
    if (t == -2) return -1;
    hp->tied = t == 1;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(c->root, "rope_scaling");
    if (rs && !cJSON_IsNull(rs)) {
        const char *rt = NULL;
        if (cJSON_IsObject(rs)) {
            const cJSON *j = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
            if (!cJSON_IsString(j)) j = cJSON_GetObjectItemCaseSensitive(rs, "type");
            if (cJSON_IsString(j)) rt = j->valuestring;
        }
        if (!rt || strcmp(rt, "default")) {
            ds_errf(err, errlen, "%s: rope_scaling (type '%s') is not supported; dspark implements plain RoPE only",
                    c->path, rt ? rt : "?");
            return -1;
        }
    }
    const cJSON *hact = cJSON_GetObjectItemCaseSensitive(c->root, "hidden_act");
    if (cJSON_IsString(hact) && strcmp(hact->valuestring, "silu")) {
        ds_errf(err, errlen, "%s: hidden_act '%s' is not supported (silu only)", c->path, hact->valuestring);
        return -1;
    }
    int ab = cfg_bool(c, "attention_bias", err, errlen);
    if (ab == -2) return -1;
    if (ab == 1) {
        ds_errf(err, errlen, "%s: attention_bias = true is not supported", c->path);
        return -1;
    }
    return 0;
}

/* ---- expected tensors ----------------------------------------------------- */
enum { J_MATRIX = 0, J_F32 = 1 };
typedef struct {
    char     hf[192];
    char     gg[192];
    uint32_t n_dims;
    uint64_t shape[2];       /* HF order                                        */
    int      f32;            /* always F32                                      */
    uint32_t permute_heads;  /* >0: llama q/k row permutation with this many heads */
    uint32_t hd;
    int      optional;
    int      no_write;       /* validate only                                   */
    const ds_st_tensor *src;
} job_t;

typedef struct {
    job_t *v;
    size_t n, cap;
    int    oom;
} jobs_t;

static job_t *job_add(jobs_t *J, const char *gg, int f32, uint32_t n_dims, uint64_t s0, uint64_t s1,
                      const char *hf_fmt, ...) __attribute__((format(printf, 7, 8)));
static job_t *job_add(jobs_t *J, const char *gg, int f32, uint32_t n_dims, uint64_t s0, uint64_t s1,
                      const char *hf_fmt, ...) {
    if (J->n == J->cap) {
        size_t nc = J->cap ? J->cap * 2 : 64;
        job_t *nv = realloc(J->v, nc * sizeof *nv);
        if (!nv) { J->oom = 1; return NULL; }
        J->v = nv;
        J->cap = nc;
    }
    job_t *j = &J->v[J->n++];
    memset(j, 0, sizeof *j);
    va_list ap;
    va_start(ap, hf_fmt);
    vsnprintf(j->hf, sizeof j->hf, hf_fmt, ap);
    va_end(ap);
    snprintf(j->gg, sizeof j->gg, "%s", gg ? gg : "");
    j->f32 = f32;
    j->n_dims = n_dims;
    j->shape[0] = s0;
    j->shape[1] = s1;
    return j;
}

/* The transformer layers; prefix "model.layers." (target) or "layers." (drafter). */
static void add_layers(jobs_t *J, const hparams_t *hp, const char *prefix, int permute, int qk_norm) {
    uint64_t d = hp->d, qd = (uint64_t)hp->n_head * hp->hd, kd = (uint64_t)hp->n_head_kv * hp->hd;
    char gg[192];
    for (uint32_t l = 0; l < hp->n_layer; l++) {
#define GG(s) (snprintf(gg, sizeof gg, "blk.%u." s, l), gg)
        job_add(J, GG("attn_norm.weight"), 1, 1, d, 0, "%s%u.input_layernorm.weight", prefix, l);
        job_t *q = job_add(J, GG("attn_q.weight"), 0, 2, qd, d, "%s%u.self_attn.q_proj.weight", prefix, l);
        job_t *k = job_add(J, GG("attn_k.weight"), 0, 2, kd, d, "%s%u.self_attn.k_proj.weight", prefix, l);
        if (permute && q && k) {
            q->permute_heads = hp->n_head; q->hd = hp->hd;
            k->permute_heads = hp->n_head_kv; k->hd = hp->hd;
        }
        job_add(J, GG("attn_v.weight"), 0, 2, kd, d, "%s%u.self_attn.v_proj.weight", prefix, l);
        job_add(J, GG("attn_output.weight"), 0, 2, d, qd, "%s%u.self_attn.o_proj.weight", prefix, l);
        if (qk_norm) {
            job_add(J, GG("attn_q_norm.weight"), 1, 1, hp->hd, 0, "%s%u.self_attn.q_norm.weight", prefix, l);
            job_add(J, GG("attn_k_norm.weight"), 1, 1, hp->hd, 0, "%s%u.self_attn.k_norm.weight", prefix, l);
        }
        job_add(J, GG("ffn_norm.weight"), 1, 1, d, 0, "%s%u.post_attention_layernorm.weight", prefix, l);
        job_add(J, GG("ffn_gate.weight"), 0, 2, hp->ffn, d, "%s%u.mlp.gate_proj.weight", prefix, l);
        job_add(J, GG("ffn_up.weight"), 0, 2, hp->ffn, d, "%s%u.mlp.up_proj.weight", prefix, l);
        job_add(J, GG("ffn_down.weight"), 0, 2, d, hp->ffn, "%s%u.mlp.down_proj.weight", prefix, l);
#undef GG
    }
}

static void build_target_jobs(jobs_t *J, const hparams_t *hp) {
    int is_llama = !strcmp(hp->arch, "llama");
    job_add(J, "token_embd.weight", 0, 2, hp->n_vocab, hp->d, "model.embed_tokens.weight");
    add_layers(J, hp, "model.layers.", is_llama, !is_llama);
    job_add(J, "output_norm.weight", 1, 1, hp->d, 0, "model.norm.weight");
    job_t *o = job_add(J, "output.weight", 0, 2, hp->n_vocab, hp->d, "lm_head.weight");
    if (o) { o->optional = 1; o->no_write = hp->tied; }
}

static void build_drafter_jobs(jobs_t *J, const hparams_t *hp, int dspark) {
    uint64_t d = hp->d, r = hp->markov_rank, V = hp->n_vocab;
    const char *P = dspark ? "dspark." : "";
    char gg[192];
#define N(dfl, dsp) (snprintf(gg, sizeof gg, "%s", dspark ? (dsp) : (dfl)), gg)
    job_add(J, N("fc.weight", "dspark.fc.weight"), 0, 2, d, (uint64_t)hp->n_target_layers * hp->target_hidden, "fc.weight");
    job_add(J, N("enc.output_norm.weight", "dspark.hidden_norm.weight"), 1, 1, d, 0, "hidden_norm.weight");
    add_layers(J, hp, "layers.", 0, 1);
    job_add(J, "output_norm.weight", 1, 1, d, 0, "norm.weight");
    if (r) {
        job_add(J, N("markov_w1.weight", "dspark.markov_head_a.weight"), 0, 2, V, r, "markov_head.markov_w1.weight");
        job_add(J, N("markov_w2.weight", "dspark.markov_head_b.weight"), 0, 2, V, r, "markov_head.markov_w2.weight");
        /* gated / rnn extras: dflash names markov_gate.* / markov_joint.*,
         * dspark names dspark.markov_gate.* / dspark.markov_joint.* */
        if (!strcmp(hp->markov_type, "gated")) {
            snprintf(gg, sizeof gg, "%smarkov_gate.weight", P);
            job_add(J, gg, 0, 2, r, d + r, "markov_head.gate_proj.weight");
            snprintf(gg, sizeof gg, "%smarkov_gate.bias", P);
            job_add(J, gg, 1, 1, r, 0, "markov_head.gate_proj.bias");
        } else if (!strcmp(hp->markov_type, "rnn")) {
            snprintf(gg, sizeof gg, "%smarkov_joint.weight", P);
            job_add(J, gg, 0, 2, 3 * r, 2 * r + d, "markov_head.joint_proj.weight");
            snprintf(gg, sizeof gg, "%smarkov_joint.bias", P);
            job_add(J, gg, 1, 1, 3 * r, 0, "markov_head.joint_proj.bias");
        }
    }
    if (hp->has_conf) {
        uint64_t in = d + (hp->conf_with_markov ? r : 0);
        job_add(J, N("conf_proj.weight", "dspark.confidence_head.weight"), 1, 2, 1, in, "confidence_head.proj.weight");
        job_t *b = job_add(J, N("conf_proj.bias", "dspark.confidence_head.bias"), 1, 1, 1, 0, "confidence_head.proj.bias");
        if (b) b->optional = 1;
    }
    if (hp->has_corr) {
        uint64_t w = hp->corr_size;
        snprintf(gg, sizeof gg, "%scorrection_hidden_norm.weight", P);
        job_add(J, gg, 1, 1, d, 0, "hidden_correction.hidden_norm.weight");
        snprintf(gg, sizeof gg, "%scorrection_embed_norm.weight", P);
        job_add(J, gg, 1, 1, d, 0, "hidden_correction.embed_norm.weight");
        snprintf(gg, sizeof gg, "%scorrection_gate.weight", P);
        job_add(J, gg, 0, 2, w, 2 * d, "hidden_correction.gate_proj.weight");
        snprintf(gg, sizeof gg, "%scorrection_up.weight", P);
        job_add(J, gg, 0, 2, w, 2 * d, "hidden_correction.up_proj.weight");
        snprintf(gg, sizeof gg, "%scorrection_down.weight", P);
        job_add(J, gg, 0, 2, d, w, "hidden_correction.down_proj.weight");
    }
    /* copies of the target's embedding / LM head: validated, never written */
    job_t *e = job_add(J, "", 0, 2, V, d, "embed_tokens.weight");
    if (e) { e->optional = 1; e->no_write = 1; }
    job_t *h = job_add(J, "", 0, 2, V, d, "lm_head.weight");
    if (h) { h->optional = 1; h->no_write = 1; }
#undef N
}

static int read_drafter_hparams(const cfg_t *c, const ds_st_set *st, hparams_t *hp, char *err, size_t errlen) {
    if (read_trunk_hparams(c, hp, err, errlen)) return -1;
    if (strcmp(hp->arch, "qwen3")) {
        ds_errf(err, errlen, "%s: drafter trunk model_type '%s' is not supported (qwen3 only)", c->path, hp->arch);
        return -1;
    }
    if (cfg_u32(c, "block_size", 1, 0, 1, &hp->block_size, err, errlen) ||
        cfg_u32(c, "mask_token_id", 1, 0, 0, &hp->mask_token_id, err, errlen) ||
        cfg_u32(c, "target_hidden_size", 0, hp->d, 1, &hp->target_hidden, err, errlen))
        return -1;
    /* the drafter loader's bounds (drafter.c), refused here rather than
     * written into a file nothing loads */
    if (hp->n_layer > 4096 || hp->d > (1u << 20) || hp->n_head > 4096 || hp->n_head_kv > 4096 ||
        hp->block_size > 256) {
        ds_errf(err, errlen, "%s: drafter shape out of range (num_hidden_layers %u <= 4096, hidden_size %u <= 1048576, "
                "heads %u/%u <= 4096, block_size %u <= 256)", c->path, hp->n_layer, hp->d, hp->n_head, hp->n_head_kv,
                hp->block_size);
        return -1;
    }
    if (hp->mask_token_id >= hp->n_vocab) {
        ds_errf(err, errlen, "%s: mask_token_id %u is outside the vocabulary (vocab_size %u)", c->path,
                hp->mask_token_id, hp->n_vocab);
        return -1;
    }
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(c->root, "target_layer_ids");
    if (!tl) {
        ds_errf(err, errlen, "%s: missing required key 'target_layer_ids'", c->path);
        return -1;
    }
    int n = cJSON_IsArray(tl) ? cJSON_GetArraySize(tl) : -1;
    if (n < 1 || n > 64) {
        ds_errf(err, errlen, "%s: 'target_layer_ids' must be an array of 1..64 layer ids", c->path);
        return -1;
    }
    int i = 0;
    for (const cJSON *e = tl->child; e; e = e->next, i++) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -2;
        if (!cJSON_IsNumber(e) || !(v >= -1 && v <= 1e6) || v != floor(v) ||
            (i && (int32_t)v <= hp->target_layers[i - 1])) {
            ds_errf(err, errlen, "%s: target_layer_ids[%d] must be an integer >= -1, strictly increasing", c->path, i);
            return -1;
        }
        hp->target_layers[i] = (int32_t)v;
    }
    hp->n_target_layers = (uint32_t)n;

    /* Markov head */
    const ds_st_tensor *w1 = ds_st_set_find(st, "markov_head.markov_w1.weight");
    int64_t rv;
    int r = cfg_int(c, "markov_rank", 0, 1 << 20, &rv, err, errlen);
    if (r == -2) return -1;
    if (r == 0) hp->markov_rank = (uint32_t)rv;
    else hp->markov_rank = w1 && w1->n_dims == 2 ? (uint32_t)w1->shape[1] : 0;
    hp->markov_type = "vanilla";
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(c->root, "markov_head_type");
    if (mt && !cJSON_IsNull(mt)) {
        if (!cJSON_IsString(mt) || (strcmp(mt->valuestring, "vanilla") && strcmp(mt->valuestring, "gated") &&
                                    strcmp(mt->valuestring, "rnn"))) {
            ds_errf(err, errlen, "%s: markov_head_type must be \"vanilla\", \"gated\" or \"rnn\"", c->path);
            return -1;
        }
        hp->markov_type = mt->valuestring;
    }

    /* confidence head */
    const ds_st_tensor *cw = ds_st_set_find(st, "confidence_head.proj.weight");
    hp->has_conf = cw != NULL;
    static const char *const conf_keys[] = {"use_confidence_head", "has_confidence_head", "confidence_head"};
    for (size_t k = 0; k < sizeof conf_keys / sizeof *conf_keys; k++) {
        int b = cfg_bool(c, conf_keys[k], err, errlen);
        if (b == -2) return -1;
        if (b >= 0) { hp->has_conf = b; break; }
    }
    int wm = cfg_bool(c, "confidence_head_with_markov", err, errlen);
    if (wm == -2) return -1;
    if (wm >= 0) hp->conf_with_markov = wm && hp->markov_rank > 0;
    else hp->conf_with_markov = hp->markov_rank > 0 &&
                                !(cw && cw->n_dims == 2 && cw->shape[1] == hp->d);

    /* hidden correction */
    const ds_st_tensor *cg = ds_st_set_find(st, "hidden_correction.gate_proj.weight");
    int hc = cfg_bool(c, "hidden_correction", err, errlen);
    if (hc == -2) return -1;
    hp->has_corr = hc >= 0 ? hc : cg != NULL;
    if (cfg_u32(c, "hidden_correction_intermediate_size", 0,
                cg && cg->n_dims == 2 ? (uint32_t)cg->shape[0] : hp->d, 1, &hp->corr_size, err, errlen))
        return -1;
    return 0;
}

/* ---- validation --------------------------------------------------------------- */
static int is_ignored(const char *name) {
    size_t n = strlen(name);
    static const char suf[] = "rotary_emb.inv_freq";
    return n >= sizeof suf - 1 && !strcmp(name + n - (sizeof suf - 1), suf);
}

static int validate(jobs_t *J, const ds_st_set *st, const char *what, char *err, size_t errlen) {
    char a[128], b[128];
    /* shapes and dtypes first, in mapping order */
    for (size_t i = 0; i < J->n; i++) {
        job_t *j = &J->v[i];
        j->src = ds_st_set_find(st, j->hf);
        if (!j->src) continue;
        int ok = j->src->n_dims == j->n_dims;
        for (uint32_t k = 0; ok && k < j->n_dims; k++) ok = j->src->shape[k] == j->shape[k];
        if (!ok) {
            ds_st_shape_str(j->src->shape, j->src->n_dims, a, sizeof a);
            ds_st_shape_str(j->shape, j->n_dims, b, sizeof b);
            ds_errf(err, errlen, "tensor '%s' has shape %s, expected %s", j->hf, a, b);
            return -1;
        }
        if (j->src->dtype != DS_ST_F32 && j->src->dtype != DS_ST_F16 && j->src->dtype != DS_ST_BF16) {
            ds_errf(err, errlen, "tensor '%s' has dtype %s; supported: F32, F16, BF16", j->hf,
                    ds_st_dtype_name(j->src->dtype));
            return -1;
        }
    }
    /* missing */
    size_t n_missing = 0, off = 0;
    for (size_t i = 0; i < J->n; i++) {
        job_t *j = &J->v[i];
        if (j->src || j->optional) continue;
        if (n_missing++ == 0) {
            ds_st_shape_str(j->shape, j->n_dims, b, sizeof b);
            off = (size_t)snprintf(err, errlen, "missing tensor '%s' (expected shape %s)", j->hf, b);
        } else if (n_missing <= 8 && off < errlen) {
            off += (size_t)snprintf(err + off, errlen - off, "%s'%s'", n_missing == 2 ? "; also missing: " : ", ", j->hf);
        }
    }
    if (n_missing) {
        if (n_missing > 8 && off < errlen) snprintf(err + off, errlen - off, ", ... (%zu missing in all)", n_missing);
        return -1;
    }
    /* extra / unknown */
    size_t n_extra = 0;
    for (size_t i = 0; i < ds_st_set_count(st); i++) {
        const ds_st_tensor *t = ds_st_set_at(st, i);
        int used = is_ignored(t->name);
        for (size_t k = 0; !used && k < J->n; k++) used = J->v[k].src == t;
        if (used) continue;
        if (n_extra++ == 0) {
            ds_st_shape_str(t->shape, t->n_dims, a, sizeof a);
            off = (size_t)snprintf(err, errlen, "unexpected tensor '%s' (shape %s) is not part of the %s mapping",
                                   t->name, a, what);
        } else if (n_extra <= 8 && off < errlen) {
            off += (size_t)snprintf(err + off, errlen - off, "%s'%s'", n_extra == 2 ? "; also: " : ", ", t->name);
        }
    }
    if (n_extra) {
        if (n_extra > 8 && off < errlen) snprintf(err + off, errlen - off, ", ... (%zu unexpected in all)", n_extra);
        return -1;
    }
    return 0;
}

/* ---- tensor writing ------------------------------------------------------------- */
static int emit(gguf_writer *w, const job_t *j, const ds_convert_opts *o, char *err, size_t errlen) {
    const ds_st_tensor *s = j->src;
    uint64_t ne[2], rows, ne0;
    uint32_t nd = j->n_dims;
    if (nd == 1) { ne[0] = j->shape[0]; ne[1] = 1; }
    else { ne[0] = j->shape[1]; ne[1] = j->shape[0]; }
    ne0 = ne[0];
    rows = nd == 1 ? 1 : ne[1];
    uint32_t t = j->f32 ? DS_TYPE_F32 : o->type;
    if (t == DS_TYPE_Q8_0 && ne0 % DS_QK8_0) {
        logln(o, "%s: row length %llu is not a multiple of %d, written as F16 instead of Q8_0",
              j->gg, (unsigned long long)ne0, DS_QK8_0);
        t = DS_TYPE_F16;
    }
    int ok;
    uint64_t rb = ds_row_bytes(t, ne0, &ok), total;
    if (!ok || ds_mul_ovf(rb, rows, &total) || total > SIZE_MAX || ne0 > SIZE_MAX / sizeof(float)) {
        ds_errf(err, errlen, "tensor '%s': size overflows", j->hf);
        return -1;
    }
    uint8_t *buf = malloc(total ? (size_t)total : 1);
    float *row = malloc((size_t)(ne0 ? ne0 : 1) * sizeof *row);
    if (!buf || !row) {
        free(buf); free(row);
        ds_errf(err, errlen, "tensor '%s': out of memory (%llu bytes)", j->hf, (unsigned long long)total);
        return -1;
    }
    uint64_t half = j->hd / 2;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t src = r;
        if (j->permute_heads) {
            /* GGUF row h*hd + 2i + jj  <-  HF row h*hd + jj*hd/2 + i */
            uint64_t h = r / j->hd, rem = r % j->hd, i = rem / 2, jj = rem % 2;
            src = h * j->hd + jj * half + i;
        }
        ds_st_read_f32(s, src * ne0, ne0, row);
        ds_f32_to_type(t, row, (int64_t)ne0, buf + r * rb);
    }
    free(row);
    int rc = gguf_add_tensor(w, j->gg, t, nd, ne, buf, total);
    free(buf);
    if (rc) {
        ds_errf(err, errlen, "%s", gguf_writer_error(w));
        return -1;
    }
    return 0;
}

/* ---- tokenizer ------------------------------------------------------------------ */
/* tokens (and types / scores when given) padded to n_vocab entries. */
static int pad_tokenizer(gguf_writer *w, const gguf_kv *toks, const gguf_kv *types, const gguf_kv *scores,
                         uint32_t n_vocab, char *err, size_t errlen) {
    const uint64_t n0 = toks->arr_n;
    char **str = calloc(n_vocab, sizeof *str);
    int32_t *ty = types ? malloc((size_t)n_vocab * sizeof *ty) : NULL;
    float *sc = scores ? malloc((size_t)n_vocab * sizeof *sc) : NULL;
    int rc = -1;
    if (!str || (types && !ty) || (scores && !sc)) { ds_errf(err, errlen, "out of memory padding the vocabulary"); goto out; }
    for (uint64_t i = 0; i < n_vocab; i++) {
        if (i < n0) {
            gguf_str t;
            if (gguf_arr_str(toks, i, &t)) { ds_errf(err, errlen, "tokenizer token %llu is unreadable", (unsigned long long)i); goto out; }
            str[i] = strndup(t.ptr, (size_t)t.len);
        } else {
            str[i] = malloc(32);
            if (str[i]) snprintf(str[i], 32, "<|unused_pad_%llu|>", (unsigned long long)(i - n0));
        }
        if (!str[i]) { ds_errf(err, errlen, "out of memory padding the vocabulary"); goto out; }
        if (ty) {
            if (i < n0) memcpy(&ty[i], types->arr_data + i * 4, 4);
            else ty[i] = DS_TOKTYPE_UNUSED;
        }
        if (sc) {
            if (i < n0) memcpy(&sc[i], scores->arr_data + i * 4, 4);
            else sc[i] = -1e30f;
        }
    }
    if (gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)str, n_vocab) ||
        (ty && gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_I32, ty, n_vocab)) ||
        (sc && gguf_set_arr(w, "tokenizer.ggml.scores", GGUF_T_F32, sc, n_vocab))) {
        ds_errf(err, errlen, "writing the padded tokenizer: %s", gguf_writer_error(w));
        goto out;
    }
    rc = 0;
out:
    if (str) for (uint32_t i = 0; i < n_vocab; i++) free(str[i]);
    free(str); free(ty); free(sc);
    return rc;
}

/* Copy every tokenizer.* key of src: the skip list is every other key's
 * first dotted component (plus extra_skip), handed to gguf_copy_kv. */
static int copy_tokenizer(gguf_writer *w, const char *path, const hparams_t *hp, const char *extra_skip,
                          const ds_convert_opts *o, char *err, size_t errlen) {
    char e2[DS_ERRLEN];
    gguf_ctx *g = gguf_open(path, e2, sizeof e2);
    if (!g) { ds_errf(err, errlen, "tokenizer source: %s", e2); return -1; }
    uint64_t n = gguf_n_kv(g);
    char **skip = calloc((size_t)n + 5, sizeof *skip);
    size_t ns = 0, n_tok = 0;
    int rc = -1;
    if (!skip) { ds_errf(err, errlen, "out of memory"); goto out; }
    for (uint64_t i = 0; i < n; i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        if (kv->key.len >= 10 && !memcmp(kv->key.ptr, "tokenizer.", 10)) { n_tok++; continue; }
        const char *dot = memchr(kv->key.ptr, '.', (size_t)kv->key.len);
        size_t plen = dot ? (size_t)(dot - kv->key.ptr) + 1 : (size_t)kv->key.len;
        int dup = 0;
        for (size_t k = 0; k < ns && !dup; k++) dup = strlen(skip[k]) == plen && !memcmp(skip[k], kv->key.ptr, plen);
        if (dup) continue;
        skip[ns] = strndup(kv->key.ptr, plen);
        if (!skip[ns]) { ds_errf(err, errlen, "out of memory"); goto out; }
        ns++;
    }
    if (!n_tok) {
        ds_errf(err, errlen, "%s has no tokenizer.* keys", path);
        goto out;
    }
    if (extra_skip) {
        skip[ns] = strdup(extra_skip);
        if (!skip[ns]) { ds_errf(err, errlen, "out of memory"); goto out; }
        ns++;
    }
    const gguf_kv *toks = gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (toks && toks->type == GGUF_T_ARRAY && toks->arr_n > hp->n_vocab) {
        ds_errf(err, errlen, "tokenizer in %s has %llu tokens but vocab_size is %u", path,
                (unsigned long long)toks->arr_n, hp->n_vocab);
        goto out;
    }
    /* Fewer tokens than embedding rows (a donor tokenizer for a model with
     * a padded vocabulary): llama.cpp requires one token per row, so the
     * list is padded with unused placeholders, and the per-token arrays
     * that come with it (types, scores) with UNUSED / a score no merge
     * reaches. */
    const gguf_kv *ttype = gguf_find_kv(g, "tokenizer.ggml.token_type");
    const gguf_kv *tscore = gguf_find_kv(g, "tokenizer.ggml.scores");
    const int pad = toks && toks->type == GGUF_T_ARRAY && toks->arr_type == GGUF_T_STRING && toks->arr_n < hp->n_vocab;
    const int pad_type = pad && ttype && ttype->type == GGUF_T_ARRAY && ttype->arr_type == GGUF_T_I32 &&
                         ttype->arr_n == toks->arr_n;
    const int pad_score = pad && tscore && tscore->type == GGUF_T_ARRAY && tscore->arr_type == GGUF_T_F32 &&
                          tscore->arr_n == toks->arr_n;
    if (pad) {
        const char *k3[3] = {"tokenizer.ggml.tokens", pad_type ? "tokenizer.ggml.token_type" : NULL,
                             pad_score ? "tokenizer.ggml.scores" : NULL};
        for (int i = 0; i < 3; i++)
            if (k3[i]) {
                skip[ns] = strdup(k3[i]);
                if (!skip[ns]) { ds_errf(err, errlen, "out of memory"); goto out; }
                ns++;
            }
    }
    if (gguf_copy_kv(w, g, (const char *const *)skip)) {
        ds_errf(err, errlen, "copying tokenizer from %s: %s", path, gguf_writer_error(w));
        goto out;
    }
    if (pad && pad_tokenizer(w, toks, pad_type ? ttype : NULL, pad_score ? tscore : NULL, hp->n_vocab, err, errlen))
        goto out;
    if (pad)
        logln(o, "tokenizer: %llu tokens padded to vocab_size %u with <|unused_pad_N|>",
              (unsigned long long)toks->arr_n, hp->n_vocab);
    logln(o, "tokenizer: %zu tokenizer.* keys from %s", n_tok, path);
    rc = 0;
out:
    if (skip) for (size_t k = 0; k < ns; k++) free(skip[k]);
    free(skip);
    gguf_close(g);
    return rc;
}

/* ---- keys -------------------------------------------------------------------------- */

#define K(buf, pfx, s) (snprintf(buf, sizeof buf, "%s" s, pfx), buf)

static int write_hparams(gguf_writer *w, const char *P, const hparams_t *hp) {
    char k[160];
    int r = 0;
    r |= gguf_set_u32(w, K(k, P, "block_count"), hp->n_layer);
    r |= gguf_set_u32(w, K(k, P, "context_length"), hp->n_ctx);
    r |= gguf_set_u32(w, K(k, P, "embedding_length"), hp->d);
    r |= gguf_set_u32(w, K(k, P, "feed_forward_length"), hp->ffn);
    r |= gguf_set_u32(w, K(k, P, "attention.head_count"), hp->n_head);
    r |= gguf_set_u32(w, K(k, P, "attention.head_count_kv"), hp->n_head_kv);
    r |= gguf_set_u32(w, K(k, P, "attention.key_length"), hp->hd);
    r |= gguf_set_u32(w, K(k, P, "attention.value_length"), hp->hd);
    r |= gguf_set_u32(w, K(k, P, "rope.dimension_count"), hp->hd);
    r |= gguf_set_f32(w, K(k, P, "rope.freq_base"), hp->rope_theta);
    r |= gguf_set_f32(w, K(k, P, "attention.layer_norm_rms_epsilon"), hp->eps);
    r |= gguf_set_u32(w, K(k, P, "vocab_size"), hp->n_vocab);
    return r ? -1 : 0;
}

static int write_drafter_keys(gguf_writer *w, const hparams_t *hp, int dspark) {
    char k[160];
    int r = 0;
    uint32_t tl[64];
    if (!dspark) {
        const char *P = "dflash.";
        for (uint32_t i = 0; i < hp->n_target_layers; i++) tl[i] = (uint32_t)(hp->target_layers[i] + 1);
        r |= gguf_set_u32(w, K(k, P, "block_size"), hp->block_size);
        r |= gguf_set_arr(w, K(k, P, "target_layers"), GGUF_T_U32, tl, hp->n_target_layers);
        r |= gguf_set_u32(w, K(k, P, "target_hidden_size"), hp->target_hidden);
        r |= gguf_set_str(w, K(k, P, "sample_from_anchor"), "true");
        r |= gguf_set_bool(w, K(k, P, "has_confidence_head"), hp->has_conf);
        r |= gguf_set_bool(w, K(k, P, "confidence_head_with_markov"), hp->has_conf && hp->conf_with_markov);
        r |= gguf_set_bool(w, K(k, P, "attention.causal"), 0);
        r |= gguf_set_u32(w, K(k, P, "markov_rank"), hp->markov_rank);
        if (hp->markov_rank) r |= gguf_set_str(w, K(k, P, "markov_head_type"), hp->markov_type);
        if (hp->has_corr) {
            r |= gguf_set_bool(w, K(k, P, "hidden_correction"), 1);
            r |= gguf_set_u32(w, K(k, P, "correction_size"), hp->corr_size);
        }
        r |= gguf_set_u32(w, "tokenizer.ggml.mask_token_id", hp->mask_token_id);
    } else {
        const char *P = "dspark.dspark.";
        for (uint32_t i = 0; i < hp->n_target_layers; i++) tl[i] = (uint32_t)hp->target_layers[i];
        r |= gguf_set_u32(w, K(k, P, "block_size"), hp->block_size);
        r |= gguf_set_u32(w, K(k, P, "mask_token_id"), hp->mask_token_id);
        r |= gguf_set_arr(w, K(k, P, "target_layers"), GGUF_T_U32, tl, hp->n_target_layers);
        r |= gguf_set_u32(w, K(k, P, "target_hidden_size"), hp->target_hidden);
        r |= gguf_set_u32(w, K(k, P, "markov_rank"), hp->markov_rank);
        r |= gguf_set_bool(w, K(k, P, "confidence_head"), hp->has_conf);
        r |= gguf_set_bool(w, K(k, P, "confidence_head_with_markov"), hp->has_conf && hp->conf_with_markov);
        r |= gguf_set_bool(w, K(k, P, "hidden_correction"), hp->has_corr);
        r |= gguf_set_u32(w, K(k, P, "correction_size"), hp->has_corr ? hp->corr_size : 0);
        if (hp->markov_rank) r |= gguf_set_str(w, "dspark.markov_head_type", hp->markov_type);
    }
    return r ? -1 : 0;
}

static const char *type_name_lc(uint32_t t) {
    switch (t) {
    case DS_TYPE_F32: return "f32";
    case DS_TYPE_F16: return "f16";
    case DS_TYPE_BF16: return "bf16";
    case DS_TYPE_Q8_0: return "q8_0";
    default: return "?";
    }
}

/* ---- entry point -------------------------------------------------------------------- */
/* Load what was written with the runtime loader. A target loads on its own;
 * a drafter needs its target, so it is loaded when --tokenizer-from names a
 * loadable target (the usual call); otherwise the drafter's own checks in
 * read_drafter_hparams stand in. */
static int verify_loads(const char *path, int drafter, const char *target_path, char *err, size_t errlen) {
    if (!drafter) {
        ds_model *m = ds_model_load(path, err, errlen);
        if (!m) return -1;
        ds_model_free(m);
        return 0;
    }
    if (!target_path) return 0;
    char e2[DS_ERRLEN];
    ds_model *t = ds_model_load(target_path, e2, sizeof e2);
    if (!t) return 0;                    /* a tokenizer-only file: nothing to pair with */
    ds_drafter *d = ds_drafter_load(path, t, err, errlen);
    ds_drafter_free(d);
    ds_model_free(t);
    return d ? 0 : -1;
}

int ds_convert(const ds_convert_opts *o, char *err, size_t errlen) {
    int rc = -1;
    cfg_t cfg = {.root = NULL};
    ds_st_set *st = NULL;
    jobs_t J = {0};
    gguf_writer *w = NULL;
    char *cfg_path = NULL, *tok_default = NULL, *name_buf = NULL;
    ds_outfile *of = NULL;
    hparams_t hp;
    memset(&hp, 0, sizeof hp);

    if (!o || !o->in_dir || !o->out_path) { ds_errf(err, errlen, "input directory and output path are required"); return -1; }
    if (o->type != DS_TYPE_F32 && o->type != DS_TYPE_F16 && o->type != DS_TYPE_BF16 && o->type != DS_TYPE_Q8_0) {
        ds_errf(err, errlen, "unsupported output type %u", o->type);
        return -1;
    }
    snprintf(cfg.path, sizeof cfg.path, "config.json");
    cfg_path = path_join(o->in_dir, "config.json");
    if (!cfg_path) { ds_errf(err, errlen, "out of memory"); goto out; }
    cfg.root = read_json(cfg_path, "config.json", err, errlen);
    if (!cfg.root) goto out;
    st = ds_st_open_dir(o->in_dir, err, errlen);
    if (!st) goto out;

    ds_conv_kind kind = o->kind;
    if (kind == DS_CONV_KIND_AUTO)
        kind = (cJSON_GetObjectItemCaseSensitive(cfg.root, "block_size") ||
                cJSON_GetObjectItemCaseSensitive(cfg.root, "target_layer_ids") ||
                ds_st_set_find(st, "fc.weight")) ? DS_CONV_KIND_DRAFTER : DS_CONV_KIND_TARGET;
    int drafter = kind == DS_CONV_KIND_DRAFTER;
    int dspark = drafter && o->layout == DS_CONV_LAYOUT_DSPARK;
    if (!drafter && o->layout != DS_CONV_LAYOUT_DEFAULT) {
        ds_errf(err, errlen, "--layout applies to drafters only (this checkpoint converts as a target)");
        goto out;
    }

    if (drafter ? read_drafter_hparams(&cfg, st, &hp, err, errlen) : read_trunk_hparams(&cfg, &hp, err, errlen))
        goto out;
    if (dspark)
        for (uint32_t i = 0; i < hp.n_target_layers; i++)
            if (hp.target_layers[i] < 0) {
                ds_errf(err, errlen, "config.json: target_layer_ids contains -1, which the dspark layout (u32 HF ids) cannot store; use --layout dflash");
                goto out;
            }
    /* validate counts against the checkpoint before anything is sized by
     * them: every layer holds at least 9 tensors (q, k, v, o, gate, up,
     * down and two norms) */
    if ((uint64_t)hp.n_layer * 9 > ds_st_set_count(st)) {
        ds_errf(err, errlen, "config.json: num_hidden_layers %u needs at least %llu tensors, the checkpoint has %zu",
                hp.n_layer, (unsigned long long)hp.n_layer * 9, ds_st_set_count(st));
        goto out;
    }
    const char *arch = drafter ? (dspark ? "dspark" : "dflash") : hp.arch;
    if (drafter) build_drafter_jobs(&J, &hp, dspark);
    else build_target_jobs(&J, &hp);
    if (J.oom) { ds_errf(err, errlen, "out of memory"); goto out; }
    char what[64];
    snprintf(what, sizeof what, "%s %s", drafter ? "DSpark drafter" : hp.arch, drafter ? "(DeepSpec)" : "target");
    if (validate(&J, st, what, err, errlen)) goto out;

    /* tokenizer source */
    const char *tok = o->tokenizer_from;
    if (!tok) {
        tok_default = path_join(o->in_dir, "tokenizer.gguf");
        if (!tok_default) { ds_errf(err, errlen, "out of memory"); goto out; }
        if (!access(tok_default, F_OK)) tok = tok_default;
    }
    if (!tok && !drafter) {
        ds_errf(err, errlen, "no tokenizer: pass --tokenizer-from TARGET.gguf (or put tokenizer.gguf in %s)", o->in_dir);
        goto out;
    }
    /* the output must be none of the inputs: config.json, the index, every
     * shard, the tokenizer source */
    {
        char *idx = path_join(o->in_dir, "model.safetensors.index.json");
        if (!idx) { ds_errf(err, errlen, "out of memory"); goto out; }
        const char *ins[] = { cfg_path, idx, tok };
        int bad = ds_out_check_inputs(o->out_path, ins, 3, err, errlen);
        free(idx);
        if (bad) goto out;
        const char *last = NULL;
        for (size_t i = 0; i < ds_st_set_count(st); i++) {
            const char *f = ds_st_set_at(st, i)->file;
            if (f == last) continue;
            last = f;
            if (ds_out_check_inputs(o->out_path, &f, 1, err, errlen)) goto out;
        }
    }

    /* general.name */
    const char *name = o->name;
    if (!name) {
        const char *np = cfg_str(&cfg, "_name_or_path");
        const char *src = np && *np ? np : o->in_dir;
        name_buf = strdup(src);
        if (!name_buf) { ds_errf(err, errlen, "out of memory"); goto out; }
        size_t l = strlen(name_buf);
        while (l > 1 && name_buf[l - 1] == '/') name_buf[--l] = 0;
        const char *slash = strrchr(name_buf, '/');
        name = slash && slash[1] ? slash + 1 : name_buf;
    }

    w = gguf_writer_new();
    if (!w) { ds_errf(err, errlen, "out of memory"); goto out; }
    char P[32];
    snprintf(P, sizeof P, "%s.", arch);
    if (gguf_set_str(w, "general.architecture", arch) || gguf_set_str(w, "general.name", name) ||
        gguf_set_u32(w, "general.file_type", gguf_llama_ftype(o->type)) ||
        gguf_set_u32(w, "general.quantization_version", GGUF_QUANTIZATION_VERSION) || write_hparams(w, P, &hp) ||
        (drafter && write_drafter_keys(w, &hp, dspark))) {
        ds_errf(err, errlen, "%s", gguf_writer_error(w));
        goto out;
    }
    if (tok) {
        if (copy_tokenizer(w, tok, &hp, drafter && !dspark ? "tokenizer.ggml.mask_token_id" : NULL, o, err, errlen))
            goto out;
    } else {
        logln(o, "no tokenizer copied (drafters share the target's)");
        if (dspark && gguf_set_str(w, "tokenizer.ggml.model", "none")) {
            ds_errf(err, errlen, "%s", gguf_writer_error(w));
            goto out;
        }
    }

    logln(o, "%s: %s, %zu source tensors in %zu file(s) -> %s (%s)", o->in_dir,
          drafter ? (dspark ? "drafter, dspark layout" : "drafter, dflash layout") : hp.arch,
          ds_st_set_count(st), ds_st_set_n_files(st), o->out_path, type_name_lc(o->type));
    size_t n_written = 0;
    for (size_t i = 0; i < J.n; i++) {
        const job_t *j = &J.v[i];
        if (!j->src) {
            if (!strcmp(j->hf, "lm_head.weight") && !drafter)
                logln(o, "lm_head.weight absent: no output.weight written (the runtime ties it to token_embd)");
            continue;
        }
        if (j->no_write) {
            logln(o, "%s: validated, not written (%s)", j->hf, drafter ? "shared with the target" : "tied to token_embd");
            continue;
        }
        if (emit(w, j, o, err, errlen)) goto out;
        n_written++;
    }
    for (size_t i = 0; i < ds_st_set_count(st); i++)
        if (is_ignored(ds_st_set_at(st, i)->name)) logln(o, "%s: ignored", ds_st_set_at(st, i)->name);

    /* written to a temp file next to the target, re-read by the loader
     * that will run it, and only then renamed over the target: convert
     * refuses whatever dspark would refuse to load */
    char e2[DS_ERRLEN];
    of = ds_out_open(o->out_path, e2, sizeof e2);
    if (!of) { ds_errf(err, errlen, "%s", e2); goto out; }
    if (gguf_writer_write_fp(w, ds_out_fp(of), e2, sizeof e2)) {
        ds_errf(err, errlen, "writing %s: %s", o->out_path, e2);
        goto out;
    }
    if (ds_out_tmp_path(of) && verify_loads(ds_out_tmp_path(of), drafter, o->tokenizer_from, e2, sizeof e2)) {
        ds_errf(err, errlen, "the converted file would not load: %s", e2);
        goto out;
    }
    if (ds_out_commit(of, e2, sizeof e2)) {
        of = NULL;
        ds_errf(err, errlen, "%s", e2);
        goto out;
    }
    of = NULL;
    logln(o, "wrote %s: %zu tensors", o->out_path, n_written);
    rc = 0;
out:
    ds_out_abort(of);
    gguf_writer_free(w);
    free(J.v);
    ds_st_set_close(st);
    cJSON_Delete(cfg.root);
    free(cfg_path);
    free(tok_default);
    free(name_buf);
    return rc;
}
