/* cmd_diag.c — the diagnostics subcommands, one experiment seen three ways:
 *
 *   dspark diverge   one batched-vs-sequential experiment: gate, then the
 *                    earliest divergence with every comparator metric
 *   dspark families  each family's isolated same-input A/B, and where its
 *                    difference lands on the identity chain
 *   dspark sweep     all-fast -> canonicalize the family behind each first
 *                    divergence -> sufficient set -> reverse ablation -> C_min,
 *                    with a cost table measured side by side
 *
 * Blocks are forced token ids: --tokens, the drafter's proposal (-md), or the
 * model's own greedy continuation (--block-greedy N). */
#include "cli.h"
#include "diag/diag_json.h"
#include "diverge.h"
#include "drafter.h"
#include "generate.h"
#include "model.h"
#include "outfile.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ========================================================================
 * Shared set-up: model, prompt, block
 * ===================================================================== */

typedef struct {
    const char *model_path, *drafter_path, *prompt, *prompt_file, *tokens, *json, *svg, *table;
    long block_greedy, reps;
    long tp;                         /* diverge --tp N: Pass B on N ranks (0: none) */
    int all_families;                /* families: also those the model does not use */
    cli_model_flags mf;
} diag_args;

static void parse_args(const char *C, int argc, char **argv, diag_args *a, void (*usage)(void)) {
    memset(a, 0, sizeof *a);
    cli_model_flags_init(&a->mf);
    a->reps = 5;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) { usage(); cli_model_flags_help(stdout, 1); exit(0); }
        else if (cli_model_flag(C, argc, argv, &i, &a->mf)) {}
        else if (!strcmp(s, "-md") || !strcmp(s, "--model-draft")) a->drafter_path = cli_value(C, argc, argv, &i);
        else if (!strcmp(s, "-f") || !strcmp(s, "--file")) a->prompt_file = cli_value(C, argc, argv, &i);
        else if (!strcmp(s, "--tokens")) a->tokens = cli_value(C, argc, argv, &i);
        else if (!strcmp(s, "--block-greedy")) a->block_greedy = cli_int(C, s, cli_value(C, argc, argv, &i), 1, 64);
        else if (!strcmp(s, "--all-families")) a->all_families = 1;
        else if (!strcmp(s, "--tp")) {
            if (strcmp(C, "diverge")) cli_die(C, "--tp is a diverge flag (Pass B on N ranks)");
            a->tp = cli_int(C, s, cli_value(C, argc, argv, &i), 1, 8);
        }
        else if (!strcmp(s, "--reps")) a->reps = cli_int(C, s, cli_value(C, argc, argv, &i), 1, 1000);
        else if (!strcmp(s, "--json")) a->json = cli_value(C, argc, argv, &i);
        else if (!strcmp(s, "--svg")) a->svg = cli_value(C, argc, argv, &i);
        else if (!strcmp(s, "--table")) a->table = cli_value(C, argc, argv, &i);
        else cli_die(C, "unknown flag '%s' (see dspark %s --help)", s, C);
    }
    cli_model_flags_finish(C, &a->mf, NULL);
    a->model_path = a->mf.model;
    a->prompt = a->mf.prompt;
    /* outputs must not be inputs: checked before minutes of work */
    const char *inputs[] = { a->model_path, a->drafter_path, a->prompt_file };
    char e[DS_ERRLEN];
    if (a->json && ds_out_check_inputs(a->json, inputs, 3, e, sizeof e)) cli_die(C, "--json: %s", e);
    if (a->svg && ds_out_check_inputs(a->svg, inputs, 3, e, sizeof e)) cli_die(C, "--svg: %s", e);
    if (a->json && a->svg && (!strcmp(a->json, a->svg) || ds_out_same_file(a->json, a->svg)))
        cli_die(C, "--json and --svg name the same file '%s'", a->json);
    if (!a->prompt && !a->prompt_file) cli_die(C, "no prompt given (-p TEXT or -f FILE)");
    if (a->prompt && a->prompt_file) cli_die(C, "give either -p or -f, not both");
    int sources = (a->tokens != NULL) + (a->drafter_path != NULL) + (a->block_greedy > 0);
    if (sources == 0) cli_die(C, "no block to force: give --tokens ID,..., -md DRAFTER.gguf or --block-greedy N");
    if (sources > 1) cli_die(C, "give only one of --tokens, -md and --block-greedy");
    if (a->table && strcmp(a->table, "all") && strcmp(a->table, "diverged"))
        cli_die(C, "--table must be all or diverged, got '%s'", a->table);
}

/* Rows of a forced block: the anchor plus the largest drafter block the
 * loader accepts (256), or 256 --tokens ids. */
#define DIAG_MAX_ROWS (1 + 256)

typedef struct {
    ds_model *m;
    ds_ctx *c;
    int32_t *prompt; int n_prompt;
    int32_t block[DIAG_MAX_ROWS]; int M;
} diag_setup;

static void setup(const char *C, const diag_args *a, diag_setup *s) {
    char err[DS_ERRLEN];
    memset(s, 0, sizeof *s);
    s->m = ds_model_load_on(a->model_path, a->mf.device, err, sizeof err);
    if (!s->m) cli_die(C, "%s: %s", a->model_path, err);
    if (!s->m->tok) cli_die(C, "%s has no tokenizer", a->model_path);
    long n_ctx = cli_ctx_for_model(&a->mf, s->m->hp.n_ctx_train);
    s->c = ds_ctx_new(s->m, (int)n_ctx, (int)a->mf.n_threads, err, sizeof err);
    if (!s->c) cli_die(C, "%s", err);
    size_t len = 0;
    char *buf = NULL;
    const char *text = a->prompt;
    if (a->prompt_file) text = buf = cli_read_file(C, a->prompt_file, &len);
    else len = strlen(text);
    size_t n = 0;
    if (ds_tokenize(s->m->tok, text, len, 0, &s->prompt, &n, err, sizeof err)) cli_die(C, "tokenizer: %s", err);
    free(buf);
    if (n == 0) cli_die(C, "the prompt is empty after tokenization");
    s->n_prompt = (int)n;
    const int V = s->m->hp.n_vocab;
    if (a->tokens) {
        const char *p = a->tokens;
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= V) cli_die(C, "--tokens: '%s' is not a token id in [0, %d)", p, V);
            if (s->M >= 256) cli_die(C, "--tokens: at most 256 ids");
            s->block[s->M++] = (int32_t)v;
            p = end;
            if (*p == ',') p++;
            else if (*p) cli_die(C, "--tokens: expected comma-separated ids, got '%s'", p);
        }
    } else {
        /* row 0 is the token plain decoding would emit first (the anchor);
         * the rest is the model's own greedy continuation, or the drafter's
         * proposal from S0 */
        if (!a->drafter_path) {
            int32_t out[64];
            ds_gen_stats st;
            ds_gen_opts go = { (int)a->block_greedy, DS_PREFILL_BATCH, 0, NULL, NULL };
            if (ds_generate_greedy(s->c, s->prompt, s->n_prompt, &go, out, &st, err, sizeof err)) cli_die(C, "%s", err);
            for (int i = 0; i < st.n_gen; i++) s->block[s->M++] = out[i];
        } else {
            /* one prefill gives both the anchor (its last logits) and the
             * tap features the drafter needs for its context rows */
            ds_drafter *dr = ds_drafter_load(a->drafter_path, s->m, err, sizeof err);
            if (!dr) cli_die(C, "%s: %s", a->drafter_path, err);
            int taps_n = ds_drafter_n_taps(dr);
            if (ds_set_taps(s->c, ds_drafter_tap_layers(dr), taps_n, err, sizeof err)) cli_die(C, "%s", err);
            float *taps = malloc((size_t)s->n_prompt * taps_n * s->m->hp.n_embd * sizeof(float));
            float *lg = malloc((size_t)V * sizeof(float));
            ds_dctx *x = ds_dctx_new(dr, ds_ctx_n_ctx(s->c), ds_ctx_exec(s->c), err, sizeof err);
            if (!taps || !lg || !x) cli_die(C, "drafter: %s", x ? "out of memory" : err);
            if (ds_prefill(s->c, s->prompt, s->n_prompt, DS_PREFILL_BATCH, lg, taps, err, sizeof err) ||
                ds_dctx_append(x, taps, s->n_prompt, 0, err, sizeof err))
                cli_die(C, "%s", err);
            s->block[0] = (int32_t)ds_argmax(lg, V);
            int gamma = ds_drafter_block_size(dr);
            if (gamma < 1 || 1 + gamma > DIAG_MAX_ROWS)
                cli_die(C, "%s: block size %d does not fit the %d rows diverge holds", a->drafter_path, gamma, DIAG_MAX_ROWS);
            ds_draft_opts dopt = { NULL, gamma };
            if (ds_draft(x, s->block[0], s->n_prompt, &dopt, s->block + 1, NULL, NULL, err, sizeof err)) cli_die(C, "%s", err);
            s->M = 1 + gamma;
            ds_set_taps(s->c, NULL, 0, err, sizeof err);
            ds_dctx_free(x);
            free(taps); free(lg);
            ds_drafter_free(dr);
        }
    }
    if (s->n_prompt + s->M > ds_ctx_n_ctx(s->c)) cli_die(C, "prompt (%d tokens) + block (%d) exceed the context (-c %d)", s->n_prompt, s->M, ds_ctx_n_ctx(s->c));
}

static void teardown(diag_setup *s) {
    free(s->prompt);
    ds_ctx_free(s->c);
    ds_model_free(s->m);
}

static void print_block(const diag_setup *s) {
    printf("BLOCK rows=%d ids=", s->M);
    for (int i = 0; i < s->M; i++) printf("%s%d", i ? "," : "", s->block[i]);
    printf(" text=\"");
    char *b = NULL;
    size_t n = 0, cap = 0;
    for (int i = 0; i < s->M; i++)      /* every token whole, however long */
        if (cli_append_token(&b, &n, &cap, s->m->tok, s->block[i])) cli_die("diverge", "out of memory");
    for (size_t j = 0; j < n; j++) {
        unsigned char ch = (unsigned char)b[j];
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\x%02x", ch);
        else putchar(ch);
    }
    free(b);
    printf("\"\n");
}

/* The isolated A/B of family f on the model's device: 0, or 1 when the
 * device refuses the family (a weight type it has no kernels for: the
 * kquant types on CUDA; the model then has no such weights, so no pass of
 * it can involve the family). Any other failure ends the command. */
static int family_ab(const char *C, diag_setup *s, int f, ds_family_ab *ab, char *err, size_t errlen) {
    if (!ds_family_ab_run(s->m, ds_ctx_exec(s->c), f, DS_FAST, 16, ab, err, errlen)) return 0;
    if (!strstr(err, "not supported")) cli_die(C, "%s", err);
    return 1;
}

/* Run one experiment; dies if the gate fails (diverge refuses to report). */
static void experiment(const char *C, diag_setup *s, const ds_kernel_set *ks, ds_diverge_result *r, int print_gate) {
    char err[DS_ERRLEN];
    ds_diverge_opts o = { s->prompt, s->n_prompt, s->block, s->M, *ks };
    if (ds_diverge_run(s->c, &o, r, err, sizeof err)) cli_die(C, "%s", err);
    if (print_gate || !(r->gate_control && r->gate_probe)) dsd_gate_print(stdout, r->gate_control, r->gate_probe);
    if (!(r->gate_control && r->gate_probe)) {
        fflush(stdout);
        cli_die(C, "refusing to report: the capture perturbed the batched pass (GATE_RESULT FAIL)");
    }
}

/* ========================================================================
 * dspark diverge
 * ===================================================================== */

static void diverge_usage(void) {
    printf("usage: dspark diverge -m MODEL.gguf (-p TEXT | -f FILE) (--tokens ID,... | -md DRAFTER.gguf | --block-greedy N)\n"
           "       [--kernels canonical|fast] [--fast F,..] [--canonical F,..] [--table all|diverged]\n"
           "       [--json FILE|-] [--svg FILE|-] [-t N] [-c N] [--tp N]\n"
           "Pass A: batched verify of the forced block with capture; restore S0; Pass B: the same ids\n"
           "through sequential decode; report the earliest bitwise divergence.\n"
           "--tp N: Pass B is the same batched block on N tensor-parallel ranks (docs/TP.md), with the\n"
           "same kernels: NONE while tp_reduce is canonical; --fast tp_reduce is found at o_proj.\n");
}

int cmd_diverge(int argc, char **argv) {
    const char *C = "diverge";
    diag_args a;
    parse_args(C, argc, argv, &a, diverge_usage);
    ds_kernel_set ks;
    cli_kernel_set(C, &a.mf.kf, &ks);
    /* the text report goes to stderr when an output is stdout: `| jq` works */
    const int to_stdout = (a.json && !strcmp(a.json, "-")) || (a.svg && !strcmp(a.svg, "-"));
    const int saved = to_stdout ? cli_stdout_to_stderr() : -1;
    if (to_stdout && saved < 0) cli_die(C, "cannot redirect the text report to stderr");
    diag_setup s;
    setup(C, &a, &s);
    char kbuf[256];
    ds_kernel_set_str(&ks, kbuf, sizeof kbuf);
    printf("DIVERGE model=%s kernels=\"%s\" simd=%s prompt_tokens=%d\n", a.model_path, kbuf, ds_simd_path(), s.n_prompt);
    print_block(&s);
    ds_diverge_result r;
    if (a.tp > 0) {
        /* across TP degrees: Pass B on a second context of the same model,
         * its forwards on a.tp ranks, the same kernel set */
        char err[DS_ERRLEN];
        ds_ctx *cb = ds_ctx_new(s.m, ds_ctx_n_ctx(s.c), (int)a.mf.n_threads, err, sizeof err);
        if (!cb || ds_ctx_set_tp(cb, (int)a.tp, err, sizeof err)) cli_die(C, "%s", err);
        printf("TP pass_b_ranks=%ld (the same batched block, kernels as pass A)\n", a.tp);
        ds_diverge_opts o = { s.prompt, s.n_prompt, s.block, s.M, ks };
        if (ds_diverge_cross(s.c, cb, &o, &ks, &r, err, sizeof err)) cli_die(C, "%s", err);
        ds_ctx_free(cb);
        dsd_gate_print(stdout, r.gate_control, r.gate_probe);
        if (!(r.gate_control && r.gate_probe)) {
            fflush(stdout);
            cli_die(C, "refusing to report: the capture perturbed the batched pass (GATE_RESULT FAIL)");
        }
    } else {
        experiment(C, &s, &ks, &r, 1);
    }
    dsd_report_print(stdout, &r.report);
    dsd_chain_print(stdout, r.chain);
    printf("TIMING batch_s=%.6f decode_s=%.6f\n", r.t_batch, r.t_decode);
    if (a.table) dsd_report_print_table(stdout, &r.report, !strcmp(a.table, "diverged"));
    cli_stdout_back(saved);
    if (a.json) {
        /* the whole verdict in one tree: identity of the run, the block,
         * the gate, the identity chain and the per-object report */
        cJSON *j = cJSON_CreateObject(), *blk = cJSON_CreateObject(), *gate = cJSON_CreateObject();
        cJSON *chain = cJSON_CreateObject(), *ids = cJSON_CreateArray();
        if (!j || !blk || !gate || !chain || !ids) cli_die(C, "out of memory building JSON");
        cJSON_AddStringToObject(j, "model", a.model_path);
        cJSON_AddStringToObject(j, "kernels", kbuf);
        cJSON_AddStringToObject(j, "simd", ds_simd_path());
        cJSON_AddStringToObject(j, "device", a.mf.device);
        cJSON_AddNumberToObject(j, "prompt_tokens", s.n_prompt);
        for (int i = 0; i < s.M; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(s.block[i]));
        cJSON_AddNumberToObject(blk, "rows", s.M);
        cJSON_AddItemToObject(blk, "ids", ids);
        cJSON_AddItemToObject(j, "block", blk);
        cJSON_AddStringToObject(gate, "control_a0_vs_a1", r.gate_control ? "PASS" : "FAIL");
        cJSON_AddStringToObject(gate, "probe_a0_vs_a2", r.gate_probe ? "PASS" : "FAIL");
        cJSON_AddStringToObject(gate, "result", r.gate_control && r.gate_probe ? "PASS" : "FAIL");
        cJSON_AddItemToObject(j, "gate", gate);
        int first_break = dsd_chain_print(NULL, r.chain);
        for (int c = 0; c < DSD_CHAIN_COUNT; c++)
            cJSON_AddStringToObject(chain, dsd_chain_name((dsd_chain)c),
                                    r.chain[c] > 0 ? "PASS" : r.chain[c] == 0 ? "FAIL" : "UNTESTED");
        cJSON_AddStringToObject(chain, "first_break", first_break < DSD_CHAIN_COUNT ? dsd_chain_name((dsd_chain)first_break) : "NONE");
        cJSON_AddItemToObject(j, "chain", chain);
        cJSON_AddItemToObject(j, "report", dsd_report_cjson(&r.report));
        ds_outfile *o = cli_out_open(C, a.json, NULL, 0);
        errno = 0;
        int bad = dsd_cjson_write(ds_out_fp(o), j), saved = errno;
        cJSON_Delete(j);
        if (bad) {
            ds_out_abort(o);
            cli_die(C, "writing '%s' failed: %s", a.json, saved ? strerror(saved) : "out of memory");
        }
        cli_out_commit(C, o);
    }
    if (a.svg) {
        ds_outfile *o = cli_out_open(C, a.svg, NULL, 0);
        const dsd_object_result *first = dsd_report_first(&r.report);
        dsd_report_svg(ds_out_fp(o), &r.report, first ? first->key.row : DSD_ALL_ROWS);
        cli_out_commit(C, o);
    }
    ds_diverge_result_free(&r);
    teardown(&s);
    return 0;
}

/* ========================================================================
 * dspark families
 * ===================================================================== */

static void families_usage(void) {
    printf("usage: dspark families -m MODEL.gguf (-p TEXT | -f FILE) (--tokens ID,... | -md DRAFTER.gguf | --block-greedy N)\n"
           "       [-t N] [--all-families]\n"
           "For each family: the isolated same-input A/B (decode kernel vs the fast batched kernel,\n"
           "M = 1..16) and, with only that family fast, where the model's pass stops being identical on\n"
           "the chain operator -> future-visible state -> logits -> greedy token -> bytes.\n"
           "A family the model does not run (a matmul type it has no weight of, moe_route on a dense\n"
           "model) is one line verdict=UNUSED; --all-families tests it anyway (synthetic weights).\n");
}

/* A deepseek4 model's families in the first seed's terms (antirez/ds4's
 * DSpark report): the Q8_0 matmul at the MLA sites, the dk512 attention,
 * the HC tail; NULL for other families and models. */
static const char *seed_family(const ds_model *m, int f) {
    if (m->hp.arch != DS_ARCH_DEEPSEEK4) return NULL;
    if (f == DS_FAM_MATMUL_Q8_0) return "FAMILY_Q8_0_BATCH_EXT_VS_SINGLE_MV";
    if (f == DS_FAM_ATTN_SINKS) return "FAMILY_FLASH_ATTN_BATCH_DIRECT_VS_SINGLE_VEC_REDUCE";
    if (f == DS_FAM_HC_POST) return "FAMILY_Q8_ATTN_OUTPUT_BATCH_F32_HC_SPLIT_VS_SINGLE_F32_FUSED_HC";
    if (f == DS_FAM_HC_PRE) return "FAMILY_HC_PRE_SINKHORN_BATCH_VS_SINGLE";
    return NULL;
}

/* The seed's sites where the pass r diverged: QA, KV, QB (cp2), the raw
 * heads (CP4-HEADS-RAW), the streams after the attention's HC tail
 * (CP4/after_attn_hc, the seed's name for dspark's cp6 object). fam >= 0:
 * only the sites that family produces (the seed's "sites=" of a family);
 * -1: every diverging site. */
static void seed_sites(const ds_diverge_result *r, int fam, char *buf, size_t n) {
    static const struct { uint32_t cp, sub; const char *name; } k[] = {
        {DSD_CP_QKV, DSD_SUB_QA, "QA"}, {DSD_CP_QKV, DSD_SUB_KV, "KV"}, {DSD_CP_QKV, DSD_SUB_QB, "QB"},
        {DSD_CP_ATTN_HEADS, DSD_SUB_HEAD_BASE, "CP4-HEADS-RAW"}, {DSD_CP_ATTN_RESIDUAL, DSD_SUB_HC_ATTN, "CP4/after_attn_hc"},
    };
    buf[0] = 0;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        int hit = 0;
        for (size_t j = 0; j < r->report.n_objects && !hit; j++) {
            const dsd_object_result *o = &r->report.objects[j];
            const int sub_ok = k[i].sub == DSD_SUB_HEAD_BASE ? o->key.sub >= DSD_SUB_HEAD_BASE : o->key.sub == k[i].sub;
            hit = o->diverged && o->key.cp == k[i].cp && sub_ok &&
                  (fam < 0 || (ds_families_for_checkpoint(r, o->key.layer, o->key.cp, o->key.sub) >> fam & 1u));
        }
        if (hit) {
            const size_t l = strlen(buf);
            snprintf(buf + l, n - l, "%s%s", l ? "," : "", k[i].name);
        }
    }
    if (!buf[0]) snprintf(buf, n, "none");
}

static const char *chain_verdict(const int chain[DSD_CHAIN_COUNT]) {
    for (int i = 0; i < DSD_CHAIN_COUNT; i++) if (chain[i] == 0) return dsd_chain_name((dsd_chain)i);
    return "NONE";
}

int cmd_families(int argc, char **argv) {
    const char *C = "families";
    diag_args a;
    parse_args(C, argc, argv, &a, families_usage);
    diag_setup s;
    setup(C, &a, &s);
    char err[DS_ERRLEN];
    print_block(&s);
    for (int f = 0; f < DS_FAM_COUNT; f++) {
        ds_family_ab ab;
        if (!a.all_families && !ds_model_uses_family(s.m, f)) {
            printf("FAMILY name=%s verdict=UNUSED reason=\"the model runs no %s kernel\"\n", ds_family_name(f), ds_family_name(f));
            continue;
        }
        if (family_ab(C, &s, f, &ab, err, sizeof err)) {
            printf("FAMILY name=%s verdict=UNSUPPORTED device=%s reason=\"%s\"\n", ds_family_name(f), a.mf.device, err);
            continue;
        }
        ds_kernel_set ks;
        ds_kernel_set_all(&ks, DS_CANONICAL);
        ks.v[f] = DS_FAST;
        ds_diverge_result r;
        experiment(C, &s, &ks, &r, 0);
        const dsd_object_result *first = dsd_report_first(&r.report);
        char sb[DSD_NAME_MAX];
        printf("FAMILY name=%s verdict=%s widths=1..16 differing_widths=%d%s mismatch_fraction=%.6g max_ulp=%llu max_abs=%.6g rel_l2=%.6g first_break=%s",
               ds_family_name(f), ab.proven_different ? "PROVEN_DIFFERENT" : "IDENTICAL", ab.differing_widths,
               ab.synthetic ? " weight=synthetic" : "", ab.worst.mismatch_fraction, (unsigned long long)ab.worst.max_ulp,
               ab.worst.max_abs, ab.worst.rel_l2, chain_verdict(r.chain));
        if (first) printf(" model_first_divergence=row:%d,layer:%d,%s,%s", first->key.row, first->key.layer,
                          dsd_cp_name(first->key.cp), dsd_sub_name(first->key.sub, sb));
        else printf(" model_first_divergence=NONE");
        printf("\n  ");
        dsd_chain_print(stdout, r.chain);
        const char *sf = seed_family(s.m, f);
        if (sf) {
            char sites[128];
            seed_sites(&r, f, sites, sizeof sites);   /* the sites this family produces */
            printf("  SEED %s sites=%s status=%s\n", sf, sites, ab.proven_different ? "PROVEN" : "IDENTICAL");
        }
        ds_diverge_result_free(&r);
    }
    teardown(&s);
    return 0;
}

/* ========================================================================
 * dspark sweep
 * ===================================================================== */

static void sweep_usage(void) {
    printf("usage: dspark sweep -m MODEL.gguf (-p TEXT | -f FILE) (--tokens ID,... | -md DRAFTER.gguf | --block-greedy N)\n"
           "       [--reps N] [-t N]\n"
           "Start all-fast; repeatedly find the first divergence, attribute it to a family by the isolated\n"
           "A/B at that site, canonicalize it and measure its causal effect; stop at FIRST_DIVERGENCE NONE\n"
           "(a sufficient set), then reverse-ablate to the minimal set C_min and print a cost table.\n");
}

static void progress(int step, int total, const char *what) {
    if (!isatty(STDERR_FILENO)) return;
    int w = 30, fill = total ? step * w / total : w;
    fprintf(stderr, "\r[%.*s%*s] %d/%d %-40s", fill, "##############################", w - fill, "", step, total, what);
    if (step >= total) fputc('\n', stderr);
    fflush(stderr);
}

static void set_names(unsigned mask, char *buf, size_t n) {
    buf[0] = 0;
    for (int f = 0; f < DS_FAM_COUNT; f++)
        if (mask & (1u << f)) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, "%s%s", l ? "," : "", ds_family_name(f));
        }
    if (!buf[0]) snprintf(buf, n, "none");
}

static void ks_from_canonical_mask(ds_kernel_set *ks, unsigned canon) {
    for (int f = 0; f < DS_FAM_COUNT; f++) ks->v[f] = (canon & (1u << f)) ? DS_CANONICAL : DS_FAST;
}

static int cmp_d(const void *x, const void *y) { double a = *(const double *)x, b = *(const double *)y; return (a > b) - (a < b); }

/* Median seconds of one batched verify of the block with kernel set ks
 * (or, replay = 1, of M sequential decodes). */
static double time_verify(diag_setup *s, const ds_kernel_set *ks, int replay, int reps) {
    char err[DS_ERRLEN];
    double t[64];
    if (reps > 64) reps = 64;
    ds_kernel_set saved;
    ds_ctx_get_kernels(s->c, &saved);
    ds_ctx_set_kernels(s->c, ks);
    ds_kv_truncate(s->c, 0);
    ds_forward_batch(s->c, s->prompt, s->n_prompt, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err);
    float *lg = malloc((size_t)s->M * s->m->hp.n_vocab * sizeof(float));
    for (int r = 0; r < reps; r++) {
        ds_kv_truncate(s->c, s->n_prompt);
        double t0 = cli_now();
        if (replay)
            for (int i = 0; i < s->M; i++) ds_decode(s->c, s->block[i], s->n_prompt + i, lg, NULL, err, sizeof err);
        else
            ds_forward_batch(s->c, s->block, s->M, s->n_prompt, DS_LOGITS_ALL, lg, NULL, err, sizeof err);
        t[r] = cli_now() - t0;
    }
    free(lg);
    ds_ctx_set_kernels(s->c, &(saved));
    qsort(t, (size_t)reps, sizeof t[0], cmp_d);
    return reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
}

int cmd_sweep(int argc, char **argv) {
    const char *C = "sweep";
    diag_args a;
    parse_args(C, argc, argv, &a, sweep_usage);
    diag_setup s;
    setup(C, &a, &s);
    char err[DS_ERRLEN], names[256], sb[DSD_NAME_MAX];
    print_block(&s);
    unsigned canon = 0, tested = 0, full = 0, partial = 0;
    ds_kernel_set ks;
    ds_diverge_result r;
    int step = 0, gate_printed = 0;
    for (;;) {
        ks_from_canonical_mask(&ks, canon);
        experiment(C, &s, &ks, &r, !gate_printed);
        gate_printed = 1;
        const dsd_object_result *first = dsd_report_first(&r.report);
        char fd[160];
        if (first) snprintf(fd, sizeof fd, "row:%d,layer:%d,%s,%s", first->key.row, first->key.layer, dsd_cp_name(first->key.cp), dsd_sub_name(first->key.sub, sb));
        else snprintf(fd, sizeof fd, "NONE");
        char pbuf[256];
        set_names(partial, pbuf, sizeof pbuf);
        printf("SWEEP step=%d sources_tested=%d sources_fully_canonicalized=%d partial_causal_families=%s first_divergence=%s\n",
               step, __builtin_popcount(tested), __builtin_popcount(full), pbuf, fd);
        progress(step, step + (first ? 2 : 0), first ? dsd_cp_name(first->key.cp) : "sufficient set found");
        if (!first) { ds_diverge_result_free(&r); break; }
        dsd_key site = first->key;
        dsd_metrics before = first->m;
        /* attribution: candidates at this site that are still fast, each
         * tested in isolation; the first proven different is the source */
        /* only families the model runs: fast kernels it never calls cannot
         * be the source (and their A/Bs would cost time for nothing) */
        unsigned used = 0;
        for (int f = 0; f < DS_FAM_COUNT; f++) used |= (unsigned)ds_model_uses_family(s.m, f) << f;
        unsigned cand = ds_families_for_checkpoint(&r, site.layer, site.cp, site.sub) & ~canon & used;
        if (!cand) cand = used & ~canon;
        int chosen = -1;
        for (int f = 0; f < DS_FAM_COUNT && chosen < 0; f++) {
            if (!(cand & (1u << f))) continue;
            ds_family_ab ab;
            if (family_ab(C, &s, f, &ab, err, sizeof err)) {
                printf("  ATTRIBUTE site=%s candidate=%s isolated_ab=UNSUPPORTED device=%s\n", fd, ds_family_name(f), a.mf.device);
                continue;
            }
            tested |= 1u << f;
            printf("  ATTRIBUTE site=%s candidate=%s isolated_ab=%s\n", fd, ds_family_name(f), ab.proven_different ? "PROVEN_DIFFERENT" : "IDENTICAL");
            if (ab.proven_different) chosen = f;
        }
        if (chosen < 0) for (int f = 0; f < DS_FAM_COUNT; f++) if (cand & (1u << f)) { chosen = f; break; }
        ds_diverge_result_free(&r);
        if (chosen < 0) cli_die(C, "no fast family left to canonicalize but the pass still diverges");
        canon |= 1u << chosen;
        /* causal contribution at the same site */
        ks_from_canonical_mask(&ks, canon);
        experiment(C, &s, &ks, &r, 0);
        const dsd_object_result *after = NULL;
        for (size_t i = 0; i < r.report.n_objects; i++)
            if (!dsd_key_cmp(&r.report.objects[i].key, &site)) { after = &r.report.objects[i]; break; }
        int exact = after && !after->diverged;
        if (exact) full |= 1u << chosen; else partial |= 1u << chosen;
        if (seed_family(s.m, chosen)) {
            char sites[128];
            seed_sites(&r, -1, sites, sizeof sites);
            printf("  SEED %s canonicalized site=%s site_exact=%s seed_sites_still_diverging_in_any_row_or_layer=%s\n", seed_family(s.m, chosen),
                   fd, exact ? "yes" : "no", sites);
        }
        printf("  CANONICALIZE family=%s site_exact=%s mismatch_count=%zu->%zu rms_abs=%.6g->%.6g rel_l2=%.6g->%.6g max_ulp=%llu->%llu\n",
               ds_family_name(chosen), exact ? "yes" : "no", before.mismatch_count, after ? after->m.mismatch_count : 0,
               before.rms_abs, after ? after->m.rms_abs : 0.0, before.rel_l2, after ? after->m.rel_l2 : 0.0,
               (unsigned long long)before.max_ulp, (unsigned long long)(after ? after->m.max_ulp : 0));
        ds_diverge_result_free(&r);
        step++;
    }
    set_names(canon, names, sizeof names);
    printf("SUFFICIENT_SET %s\n", names);

    /* reverse ablation: drop each family in turn, keep the drop if exact */
    unsigned cmin = canon;
    for (int f = 0; f < DS_FAM_COUNT; f++) {
        if (!(canon & (1u << f))) continue;
        ks_from_canonical_mask(&ks, cmin & ~(1u << f));
        experiment(C, &s, &ks, &r, 0);
        int still = dsd_report_first(&r.report) == NULL;
        printf("  ABLATE family=%s drop=%s\n", ds_family_name(f), still ? "kept_dropped(still exact)" : "needed");
        if (still) cmin &= ~(1u << f);
        ds_diverge_result_free(&r);
    }
    set_names(cmin, names, sizeof names);
    printf("C_MIN %s size=%d\n", names, __builtin_popcount(cmin));

    /* cost table, side by side in one run */
    ds_kernel_set all_fast, all_canon, with_cmin;
    ds_kernel_set_all(&all_fast, DS_FAST);
    ds_kernel_set_all(&all_canon, DS_CANONICAL);
    ks_from_canonical_mask(&with_cmin, cmin);
    double t_fast = 0, t_cmin = 0, t_canon = 0, t_replay = 0;
    for (int rep = 0; rep < 3; rep++) {      /* interleave the configurations */
        t_fast += time_verify(&s, &all_fast, 0, (int)a.reps);
        t_cmin += time_verify(&s, &with_cmin, 0, (int)a.reps);
        t_canon += time_verify(&s, &all_canon, 0, (int)a.reps);
        t_replay += time_verify(&s, &all_canon, 1, (int)a.reps);
    }
    printf("COST rows=%d (median ms per verify of the block; ratio vs all-fast)\n", s.M);
    printf("COST config=all_fast ms=%.4f ratio=1.000\n", t_fast / 3 * 1e3);
    printf("COST config=c_min ms=%.4f ratio=%.3f\n", t_cmin / 3 * 1e3, t_cmin / t_fast);
    printf("COST config=all_canonical ms=%.4f ratio=%.3f\n", t_canon / 3 * 1e3, t_canon / t_fast);
    printf("COST config=full_replay ms=%.4f ratio=%.3f (fast verify + %d decodes to commit)\n",
           (t_fast + t_replay) / 3 * 1e3, (t_fast + t_replay) / t_fast, s.M);
    printf("COST config=fast_commit_ceiling ms=%.4f ratio=1.000 (no replay, not exact)\n", t_fast / 3 * 1e3);
    teardown(&s);
    return 0;
}
