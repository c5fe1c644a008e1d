/* cmd_surface.c — `dspark surface`: the black-box view of exactness.
 *
 * Generate speculatively with any kernel set and direct commit, then
 * teacher-force the committed stream through plain sequential decode: at
 * every position, is the committed token the one plain decoding would have
 * chosen from the same prefix? Report the divergence rate, a severity
 * histogram of the logit gap (plain logit of its argmax minus plain logit of
 * the committed token), the worst gap, and the first byte where the
 * speculative text differs from plain greedy text. */
#include "cli.h"
#include "drafter.h"
#include "generate.h"
#include "model.h"
#include "spec.h"

#include <stdlib.h>
#include <string.h>

static void usage(void) {
    printf("usage: dspark surface -m TARGET.gguf -md DRAFTER.gguf (-p TEXT | --prompts FILE) [-n 128]\n"
           "       [--kernels canonical|fast] [--fast F,..] [--canonical F,..] [--draft-max N] [-t N] [-c N]\n"
           "--prompts FILE holds one prompt per line. Commit is direct (the verifier's KV rows are kept).\n");
}

/* Bytes of a token sequence, every token whole (malloc-grown *buf). */
static size_t detok(const ds_tokenizer *t, const int32_t *ids, int n, char **buf) {
    size_t cap = 0, len = 0;
    *buf = NULL;
    for (int i = 0; i < n; i++)
        if (cli_append_token(buf, &len, &cap, t, ids[i])) cli_die("surface", "out of memory");
    return len;
}

int cmd_surface(int argc, char **argv) {
    const char *C = "surface";
    const char *drafter_path = NULL, *prompts_file = NULL;
    long n_predict = 128, draft_max = 0;
    cli_model_flags mf;
    cli_model_flags_init(&mf);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); cli_model_flags_help(stdout, 1); return 0; }
        else if (cli_model_flag(C, argc, argv, &i, &mf)) {}
        else if (!strcmp(a, "-md") || !strcmp(a, "--model-draft")) drafter_path = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "--prompts")) prompts_file = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) n_predict = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--draft-max") || !strcmp(a, "--draft")) draft_max = cli_int(C, a, cli_value(C, argc, argv, &i), 1, DS_SPEC_MAX_GAMMA);
        else cli_die(C, "unknown flag '%s' (see dspark surface --help)", a);
    }
    ds_kernel_set ks;
    cli_model_flags_finish(C, &mf, &ks);
    const char *model_path = mf.model, *prompt = mf.prompt;
    const long n_threads = mf.n_threads;
    if (!drafter_path) cli_die(C, "no drafter given (-md DRAFTER.gguf)");
    if (!prompt == !prompts_file) cli_die(C, "give exactly one of -p TEXT and --prompts FILE");

    /* prompts: one per non-empty line */
    char *pbuf = NULL;
    size_t plen = 0;
    if (prompts_file) pbuf = cli_read_file(C, prompts_file, &plen);
    else { pbuf = strdup(prompt); plen = strlen(pbuf); if (!pbuf) cli_die(C, "out of memory"); }
    char *lines[1024];
    int n_lines = 0;
    if (prompts_file) {
        for (char *s = pbuf, *e; s && *s && n_lines < 1024; s = e ? e + 1 : NULL) {
            e = strchr(s, '\n');
            if (e) *e = 0;
            if (*s) lines[n_lines++] = s;
        }
    } else lines[n_lines++] = pbuf;
    if (n_lines == 0) cli_die(C, "%s holds no prompt", prompts_file);

    char err[DS_ERRLEN];
    ds_model *m = ds_model_load_on(model_path, mf.device, err, sizeof err);
    if (!m) cli_die(C, "%s: %s", model_path, err);
    if (!m->tok) cli_die(C, "%s has no tokenizer", model_path);
    ds_drafter *dr = ds_drafter_load(drafter_path, m, err, sizeof err);
    if (!dr) cli_die(C, "%s: %s", drafter_path, err);
    if (draft_max > ds_drafter_block_size(dr)) cli_die(C, "--draft-max %ld exceeds the drafter's block size %d", draft_max, ds_drafter_block_size(dr));
    const long n_ctx = cli_ctx_for_model(&mf, m->hp.n_ctx_train);
    ds_ctx *c = ds_ctx_new(m, (int)n_ctx, (int)n_threads, err, sizeof err);
    if (!c) cli_die(C, "%s", err);
    const int V = m->hp.n_vocab;
    int32_t *spec_out = malloc((size_t)n_predict * sizeof(int32_t)), *plain_out = malloc((size_t)n_predict * sizeof(int32_t));
    float *logits = malloc((size_t)V * sizeof(float));
    if (!spec_out || !plain_out || !logits) cli_die(C, "out of memory");

    char kbuf[256];
    ds_kernel_set_str(&ks, kbuf, sizeof kbuf);
    printf("SURFACE model=%s drafter=%s kernels=\"%s\" commit=direct prompts=%d n_predict=%ld\n", model_path, drafter_path, kbuf, n_lines, n_predict);
    long tot_tokens = 0, tot_div = 0, hist[4] = { 0 }, prompts_differing = 0;
    double worst = 0.0;
    int worst_prompt = -1, worst_pos = -1;
    for (int pi = 0; pi < n_lines; pi++) {
        int32_t *toks = NULL;
        size_t nt = 0;
        if (ds_tokenize(m->tok, lines[pi], strlen(lines[pi]), 0, &toks, &nt, err, sizeof err)) cli_die(C, "tokenizer: %s", err);
        if (nt == 0 || (long)nt + 2 > n_ctx) cli_die(C, "prompt %d is empty or longer than the context", pi);
        /* 1. speculative, kernel set under test, direct commit */
        ds_spec_opts so;
        ds_spec_opts_default(&so);
        so.n_predict = (int)n_predict;
        so.commit = DS_COMMIT_DIRECT;
        so.draft_max = (int)draft_max;
        ds_spec_stats ss;
        ds_ctx_set_kernels(c, &(ks));
        if (ds_spec_generate(c, dr, toks, (int)nt, &so, spec_out, &ss, err, sizeof err)) cli_die(C, "%s", err);
        int n_spec = ss.n_gen;
        /* 2. plain greedy, canonical */
        ds_ctx_set_variant(c, DS_CANONICAL);
        ds_set_taps(c, NULL, 0, err, sizeof err);
        ds_gen_opts go = { (int)n_predict, DS_PREFILL_BATCH, 1, NULL, NULL };
        ds_gen_stats gs;
        if (ds_generate_greedy(c, toks, (int)nt, &go, plain_out, &gs, err, sizeof err)) cli_die(C, "%s", err);
        /* 3. teacher-force the committed stream through plain decode */
        long div = 0;
        int first_div = -1;
        if (ds_prefill(c, toks, (int)nt, DS_PREFILL_BATCH, logits, NULL, err, sizeof err)) cli_die(C, "%s", err);
        for (int i = 0; i < n_spec; i++) {
            int32_t a = (int32_t)ds_argmax(logits, V), t = spec_out[i];
            if (t != a) {
                double gap = (double)logits[a] - (double)logits[t];
                div++;
                if (first_div < 0) first_div = i;
                hist[gap <= 0.1 ? 0 : gap <= 0.5 ? 1 : gap <= 2.0 ? 2 : 3]++;
                if (gap > worst) { worst = gap; worst_prompt = pi; worst_pos = (int)nt + i; }
            }
            if (i + 1 < n_spec && ds_decode(c, t, (int)nt + i, logits, NULL, err, sizeof err)) cli_die(C, "%s", err);
        }
        /* 4. first differing byte against plain greedy text */
        char *sb = NULL, *pb = NULL;
        size_t sl = detok(m->tok, spec_out, n_spec, &sb), pl = detok(m->tok, plain_out, gs.n_gen, &pb);
        long first_byte = -1;
        for (size_t i = 0; i < (sl < pl ? sl : pl); i++) if (sb[i] != pb[i]) { first_byte = (long)i; break; }
        if (first_byte < 0 && sl != pl) first_byte = (long)(sl < pl ? sl : pl);
        if (first_byte >= 0) prompts_differing++;
        printf("SURFACE_PROMPT index=%d n_prompt=%zu n_gen=%d divergent=%ld rate=%.4f first_divergent_token=%d first_byte_diff=%ld mean_accepted_len=%.3f\n",
               pi, nt, n_spec, div, n_spec ? (double)div / n_spec : 0.0, first_div, first_byte, ss.mean_accepted_len);
        tot_tokens += n_spec;
        tot_div += div;
        free(sb); free(pb); free(toks);
    }
    printf("SURFACE_RESULT tokens=%ld divergent=%ld divergence_rate=%.6f gap_le_0.1=%ld gap_le_0.5=%ld gap_le_2.0=%ld gap_gt_2.0=%ld worst_gap=%.6g worst_at=prompt:%d,pos:%d prompts_text_differing=%ld/%d\n",
           tot_tokens, tot_div, tot_tokens ? (double)tot_div / tot_tokens : 0.0, hist[0], hist[1], hist[2], hist[3], worst,
           worst_prompt, worst_pos, prompts_differing, n_lines);
    free(spec_out); free(plain_out); free(logits); free(pbuf);
    ds_ctx_free(c);
    ds_drafter_free(dr);
    ds_model_free(m);
    return 0;
}
