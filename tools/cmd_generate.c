/* cmd_generate.c — `dspark generate`: greedy text from a prompt.
 *
 * llama.cpp habits: -m -p -f -n -t -c --seed -v. Output goes to stdout as it
 * is produced; a key=value stats line goes to stderr at the end. */
#include "cli.h"
#include "generate.h"
#include "model.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const ds_tokenizer *tok;
    FILE *out;
} printer;

static void print_token(void *user, int32_t token) {
    printer *p = user;
    char buf[256];
    int n = ds_token_to_bytes(p->tok, token, buf, sizeof buf);
    if (n > 0) fwrite(buf, 1, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf), p->out);
    fflush(p->out);
}

static void usage(void) {
    printf("usage: dspark generate -m MODEL.gguf (-p TEXT | -f FILE) [options]\n"
           "  -n N              tokens to generate (default 128)\n"
           "  -c N              context size in tokens (default 2048, capped by the model)\n"
           "  -t N              threads (default 2); output bits do not depend on it\n"
           "  --seed N          sampling seed (greedy ignores it)\n"
           "  --temp T          temperature; only 0 (greedy) is supported yet\n"
           "  --prefill MODE    batch (default) or decode\n"
           "  --kernels SET     canonical (default) or fast, for the batched path\n"
           "  --fast F,..       families to run fast on top of the base set\n"
           "  --canonical F,..  families to run canonical on top of the base set\n"
           "  --echo            print the prompt before the generated text\n"
           "  -v                verbose: model and kernel lines on stderr\n");
}

int cmd_generate(int argc, char **argv) {
    const char *C = "generate";
    const char *model_path = NULL, *prompt = NULL, *prompt_file = NULL;
    long n_predict = 128, n_ctx = 2048, n_threads = 2, seed = 0;
    int verbose = 0, echo = 0;
    float temp = 0.0f;
    ds_prefill_mode prefill = DS_PREFILL_BATCH;
    cli_kernel_flags kf = { 0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) prompt_file = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) n_predict = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) n_ctx = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) n_threads = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--seed")) seed = cli_int(C, a, cli_value(C, argc, argv, &i), 0, 0x7fffffffL);
        else if (!strcmp(a, "--temp")) temp = cli_float(C, a, cli_value(C, argc, argv, &i), 0.0f, 100.0f);
        else if (!strcmp(a, "--prefill")) {
            const char *v = cli_value(C, argc, argv, &i);
            if (!strcmp(v, "batch")) prefill = DS_PREFILL_BATCH;
            else if (!strcmp(v, "decode")) prefill = DS_PREFILL_DECODE;
            else cli_die(C, "--prefill must be batch or decode, got '%s'", v);
        }
        else if (!strcmp(a, "--echo")) echo = 1;
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) verbose = 1;
        else if (cli_kernel_flag(C, argc, argv, &i, &kf)) {}
        else cli_die(C, "unknown flag '%s' (see dspark generate --help)", a);
    }
    (void)seed;
    if (!model_path) cli_die(C, "no model given (-m MODEL.gguf)");
    if (prompt && prompt_file) cli_die(C, "give either -p or -f, not both");
    if (!prompt && !prompt_file) cli_die(C, "no prompt given (-p TEXT or -f FILE)");
    if (temp != 0.0f) cli_die(C, "--temp %g: only greedy decoding (--temp 0) is supported", temp);
    ds_kernel_set ks;
    cli_kernel_set(C, &kf, &ks);

    size_t prompt_len = 0;
    char *file_buf = NULL;
    if (prompt_file) prompt = file_buf = cli_read_file(C, prompt_file, &prompt_len);
    else prompt_len = strlen(prompt);

    char err[DS_ERRLEN];
    ds_model *m = ds_model_load(model_path, err, sizeof err);
    if (!m) { free(file_buf); cli_die(C, "%s: %s", model_path, err); }
    if (!m->tok) { ds_model_free(m); free(file_buf); cli_die(C, "%s has no tokenizer (tokenizer.ggml.model missing)", model_path); }
    if (m->hp.n_ctx_train > 0 && n_ctx > m->hp.n_ctx_train) n_ctx = m->hp.n_ctx_train;

    int32_t *toks = NULL;
    size_t n_toks = 0;
    int add_bos = ds_tokenizer_bos(m->tok) >= 0 && !strcmp(ds_tokenizer_model(m->tok), "llama");
    if (ds_tokenize(m->tok, prompt, prompt_len, add_bos, &toks, &n_toks, err, sizeof err)) {
        ds_model_free(m); free(file_buf);
        cli_die(C, "tokenizer: %s", err);
    }
    if (n_toks == 0) { free(toks); ds_model_free(m); free(file_buf); cli_die(C, "the prompt is empty after tokenization"); }
    if ((long)n_toks >= n_ctx) {
        long nt = (long)n_toks;
        free(toks); ds_model_free(m); free(file_buf);
        cli_die(C, "the prompt has %ld tokens but the context holds %ld (-c); need room for at least one new token", nt, n_ctx);
    }
    ds_ctx *ctx = ds_ctx_new(m, (int)n_ctx, (int)n_threads, err, sizeof err);
    if (!ctx) { free(toks); ds_model_free(m); free(file_buf); cli_die(C, "%s", err); }
    ctx->ks = ks;
    if (verbose) {
        char kbuf[256];
        ds_kernel_set_str(&ks, kbuf, sizeof kbuf);
        fprintf(stderr, "model=%s arch=%s n_layer=%d n_embd=%d n_head=%d n_head_kv=%d n_ff=%d n_vocab=%d weights=%s params=%llu\n",
                model_path, ds_arch_name(m->hp.arch), m->hp.n_layer, m->hp.n_embd, m->hp.n_head, m->hp.n_head_kv,
                m->hp.n_ff, m->hp.n_vocab, ds_type_name(m->weight_type), (unsigned long long)m->n_params);
        fprintf(stderr, "kernels=\"%s\" simd=%s threads=%ld n_ctx=%ld n_prompt=%zu\n", kbuf, ds_simd_path(), n_threads, n_ctx, n_toks);
    }

    printer pr = { m->tok, stdout };
    if (echo) fwrite(prompt, 1, prompt_len, stdout);
    int32_t *out = malloc((size_t)n_predict * sizeof(int32_t));
    ds_gen_opts o = { (int)n_predict, prefill, 1, print_token, &pr };
    ds_gen_stats st;
    int rc = out ? ds_generate_greedy(ctx, toks, (int)n_toks, &o, out, &st, err, sizeof err) : -1;
    if (rc == 0) {
        fputc('\n', stdout);
        fprintf(stderr, "mode=plain n_prompt=%d n_gen=%d stop=%s prefill_s=%.4f decode_s=%.4f prefill_tok_s=%.1f decode_tok_s=%.1f\n",
                st.n_prompt, st.n_gen, st.stop, st.t_prefill, st.t_decode,
                st.t_prefill > 0 ? st.n_prompt / st.t_prefill : 0.0,
                st.t_decode > 0 && st.n_gen > 1 ? (st.n_gen - 1) / st.t_decode : 0.0);
    }
    free(out); free(toks); free(file_buf);
    ds_ctx_free(ctx);
    ds_model_free(m);
    if (rc) cli_die(C, "%s", out ? err : "out of memory");
    return 0;
}
