/* cmd_make_model.c — `dspark make-model`: flags -> ds_make_model(). */
#include "cli.h"
#include "model_make.h"

#include <stdlib.h>
#include <string.h>

/* --compress-ratios 0,4,128,...: llama.cpp's per-layer array; every entry
 * 0, 4 or 128 (the count is checked against --n-layer by make-model). */
static long parse_ratios(const char *C, const char *s, int *out, int cap) {
    long n = 0;
    const char *p = s;
    for (;;) {
        char *end = NULL;
        const long v = strtol(p, &end, 10);
        if (end == p || (v != 0 && v != 4 && v != 128) || (*end && *end != ','))
            cli_die(C, "--compress-ratios takes a comma-separated list of 0, 4 or 128 (one per layer), got '%s'", s);
        if (n == cap) cli_die(C, "--compress-ratios has more than %d entries", cap);
        out[n++] = (int)v;
        if (!*end) break;
        p = end + 1;
    }
    return n;
}

static uint32_t parse_type(const char *C, const char *s) {
    const int t = ds_type_from_name(s);
    if (t < 0) cli_die(C, "--type must be one of " DS_TYPE_NAMES ", got '%s'", s);
    return (uint32_t)t;
}

int cmd_make_model(int argc, char **argv) {
    const char *C = "make-model";
    const char *out = NULL;
    ds_make_model_opts o;
    ds_make_model_defaults(&o);
    int ratios[256];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) {
            printf("usage: dspark make-model -o OUT.gguf [--arch qwen3|qwen3moe|qwen35|deepseek4|llama] [--type TYPE]\n"
                   "       TYPE: " DS_TYPE_NAMES " (K types need n_embd, n_ff and\n"
                   "       n_head*head_dim multiples of 256, the others of 32)\n"
                   "       [--n-embd N] [--n-layer N] [--n-head N] [--n-head-kv N] [--head-dim N] [--n-ff N]\n"
                   "       [--n-vocab N] [--n-ctx N] [--rope-base F] [--norm-eps F] [--seed N]\n"
                   "       qwen3moe: [--n-expert N (8)] [--n-expert-used K (2)] [--n-ff-exp N (128)]\n"
                   "       [--n-ff-shexp N (0)]: a shared expert of width N (qwen35moe's FFN on the qwen3moe\n"
                   "       trunk: dspark loads it, llama.cpp's qwen3moe loader does not)\n"
                   "       (llama.cpp's tensors: ffn_gate_inp, ffn_{gate,up,down}_exps; the router stays F32)\n"
                   "       qwen35 (gated delta net layers, every 4th layer gated full attention):\n"
                   "       [--ssm-conv N (4)] [--ssm-state N (32)] [--ssm-groups N (2)] [--ssm-heads N (4)]\n"
                   "       [--full-attn-interval N (4)] [--n-rot N (head_dim/4)]\n"
                   "       deepseek4 (raw attention layers, one KV head; --head-dim 512, --n-rot 64 by default):\n"
                   "       [--q-lora N (n_embd/2)] [--o-groups N (2)] [--o-lora N (64)] [--hc N (4)]\n"
                   "       [--hc-iters N (20)] [--n-swa N (128)] [--n-hash N (0): the first N layers hash-routed]\n"
                   "       [--swiglu-clamp F (0: none): swiglu_clamp_exp, the experts' SwiGLU input limit]\n"
                   "       [--rope-yarn F (0: none) [--rope-orig-ctx N (n_ctx)]]: rope.scaling yarn (the compressed layers)\n"
                   "       qwen3 / llama rope scaling: [--rope-yarn F [--rope-orig-ctx N (n_ctx)]] or [--rope-linear F];\n"
                   "       llama: [--rope-freqs]: Llama 3.1's rope_freqs.weight (llama3 factors: 8, low 1, high 4, 8192)\n"
                   "       qwen3 / llama: [--untied-output]: an untied output.weight (varied greedy text)\n"
                   "       [--compress-ratios R0,R1,.. (all 0): per layer 0 (raw), 4 (CSA, indexed) or 128 (HCA)]\n"
                   "       [--n-indexer-head N (4)] [--indexer-dim N (head dim)] [--indexer-top-k N (64)]\n"
                   "       and the qwen3moe expert flags (one shared expert)\n");
            return 0;
        }
        else if (!strcmp(a, "-o")) out = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "--arch")) {
            o.arch = cli_value(C, argc, argv, &i);
            if (strcmp(o.arch, "qwen3") && strcmp(o.arch, "llama") && strcmp(o.arch, "qwen3moe") && strcmp(o.arch, "qwen35") &&
                strcmp(o.arch, "deepseek4"))
                cli_die(C, "--arch must be qwen3, qwen3moe, qwen35, deepseek4 or llama, got '%s'", o.arch);
        }
        else if (!strcmp(a, "--type")) o.type = parse_type(C, cli_value(C, argc, argv, &i));
        else if (!strcmp(a, "--n-embd")) o.n_embd = cli_int(C, a, cli_value(C, argc, argv, &i), 32, 16384);
        else if (!strcmp(a, "--n-layer")) o.n_layer = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--n-head")) o.n_head = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--n-head-kv")) o.n_head_kv = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--head-dim")) o.head_dim = cli_int(C, a, cli_value(C, argc, argv, &i), 2, 1024);
        else if (!strcmp(a, "--n-ff")) o.n_ff = cli_int(C, a, cli_value(C, argc, argv, &i), 32, 1 << 17);
        else if (!strcmp(a, "--n-vocab")) o.n_vocab = cli_int(C, a, cli_value(C, argc, argv, &i), 260, 1 << 18);
        else if (!strcmp(a, "--n-ctx")) o.n_ctx = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--rope-base")) o.rope_base = cli_float(C, a, cli_value(C, argc, argv, &i), 2.0f, 1e9f);
        else if (!strcmp(a, "--norm-eps")) o.norm_eps = cli_float(C, a, cli_value(C, argc, argv, &i), 1e-12f, 0.1f);
        else if (!strcmp(a, "--n-expert")) o.n_expert = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--n-expert-used")) o.n_expert_used = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--n-ff-shexp")) o.n_ff_shexp = cli_int(C, a, cli_value(C, argc, argv, &i), 0, 1 << 17);
        else if (!strcmp(a, "--n-ff-exp")) o.n_ff_exp = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 17);
        else if (!strcmp(a, "--ssm-conv")) o.ssm_d_conv = cli_int(C, a, cli_value(C, argc, argv, &i), 2, 16);
        else if (!strcmp(a, "--ssm-state")) o.ssm_d_state = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 512);
        else if (!strcmp(a, "--ssm-groups")) o.ssm_n_group = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--ssm-heads")) o.ssm_dt_rank = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--full-attn-interval")) o.full_attn_interval = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--n-rot")) o.n_rot = cli_int(C, a, cli_value(C, argc, argv, &i), 2, 1024);
        else if (!strcmp(a, "--q-lora")) o.q_lora = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 16);
        else if (!strcmp(a, "--o-groups")) o.o_groups = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--o-lora")) o.o_lora = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 16);
        else if (!strcmp(a, "--hc")) o.hc = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 16);
        else if (!strcmp(a, "--hc-iters")) o.hc_iters = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 100);
        else if (!strcmp(a, "--n-swa")) o.n_swa = cli_int(C, a, cli_value(C, argc, argv, &i), 0, 1 << 20);
        else if (!strcmp(a, "--n-hash")) o.n_hash = cli_int(C, a, cli_value(C, argc, argv, &i), 0, 1 << 20);
        else if (!strcmp(a, "--swiglu-clamp")) o.swiglu_clamp = cli_float(C, a, cli_value(C, argc, argv, &i), 0.0f, 1e6f);
        else if (!strcmp(a, "--rope-yarn")) o.rope_yarn = cli_float(C, a, cli_value(C, argc, argv, &i), 0.0f, 1e6f);
        else if (!strcmp(a, "--rope-orig-ctx")) o.rope_orig_ctx = cli_int(C, a, cli_value(C, argc, argv, &i), 0, 1 << 26);
        else if (!strcmp(a, "--rope-linear")) o.rope_linear = cli_float(C, a, cli_value(C, argc, argv, &i), 0.0f, 1e6f);
        else if (!strcmp(a, "--rope-freqs")) o.rope_freqs = 1;
        else if (!strcmp(a, "--untied-output")) o.untied_output = 1;
        else if (!strcmp(a, "--compress-ratios")) {
            o.n_comp = parse_ratios(C, cli_value(C, argc, argv, &i), ratios, 256);
            o.comp_ratios = ratios;
        }
        else if (!strcmp(a, "--n-indexer-head")) o.n_ih = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--indexer-dim")) o.ihd = cli_int(C, a, cli_value(C, argc, argv, &i), 2, 1024);
        else if (!strcmp(a, "--indexer-top-k")) o.i_top_k = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--seed")) o.seed = cli_int(C, a, cli_value(C, argc, argv, &i), 0, 0x7fffffffL);
        else cli_die(C, "unknown flag '%s' (see dspark make-model --help)", a);
    }
    if (!out) cli_die(C, "no output file given (-o OUT.gguf)");
    if ((o.rope_yarn > 0.0f || o.rope_orig_ctx) && strcmp(o.arch, "deepseek4") && strcmp(o.arch, "qwen3") && strcmp(o.arch, "llama"))
        cli_die(C, "--rope-yarn / --rope-orig-ctx apply to --arch deepseek4, qwen3 or llama only");
    if (o.rope_linear > 0.0f && strcmp(o.arch, "qwen3") && strcmp(o.arch, "llama"))
        cli_die(C, "--rope-linear applies to --arch qwen3 or llama only");
    if (o.rope_linear > 0.0f && o.rope_yarn > 0.0f) cli_die(C, "--rope-linear and --rope-yarn exclude each other");
    if (o.rope_freqs && strcmp(o.arch, "llama")) cli_die(C, "--rope-freqs applies to --arch llama only (llama.cpp's other loaders ignore the tensor)");
    char err[DS_ERRLEN];
    if (ds_make_model(&o, out, err, sizeof err)) cli_die(C, "%s", err);
    fprintf(stderr, "make-model: wrote %s: arch=%s type=%s n_layer=%d n_embd=%d n_vocab=%d seed=%ld\n", out, o.arch,
            ds_type_name(o.type), (int)o.n_layer, (int)o.n_embd, (int)o.n_vocab, (long)o.seed);
    return 0;
}
