/* cmd_perplexity.c — `dspark perplexity -f FILE`: perplexity over fixed,
 * non-overlapping windows of -c tokens (no BOS). Token 0 of each window is
 * context only; tokens 1..c-1 are scored given their prefix inside the
 * window. ppl = exp(mean NLL). The same protocol as tools/train's PyTorch
 * reference, so the two numbers can be compared directly. */
#include "cli.h"
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int cmd_perplexity(int argc, char **argv) {
    const char *C = "perplexity";
    const char *model_path = NULL, *file = NULL;
    long n_ctx = 256, n_chunks = 0, n_threads = 2;
    int verbose = 0;
    cli_kernel_flags kf = { 0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) {
            printf("usage: dspark perplexity -m MODEL.gguf -f FILE [-c 256] [--chunks N] [-t N] [--kernels canonical|fast]\n");
            return 0;
        }
        else if (!strcmp(a, "-m")) model_path = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "-f")) file = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "-c")) n_ctx = cli_int(C, a, cli_value(C, argc, argv, &i), 2, 1 << 20);
        else if (!strcmp(a, "--chunks")) n_chunks = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(a, "-t")) n_threads = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "-v")) verbose = 1;
        else if (cli_kernel_flag(C, argc, argv, &i, &kf)) {}
        else cli_die(C, "unknown flag '%s' (see dspark perplexity --help)", a);
    }
    if (!model_path) cli_die(C, "no model given (-m MODEL.gguf)");
    if (!file) cli_die(C, "no text file given (-f FILE)");
    ds_kernel_set ks;
    cli_kernel_set(C, &kf, &ks);
    size_t len;
    char *text = cli_read_file(C, file, &len);
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load(model_path, err, sizeof err);
    if (!m) { free(text); cli_die(C, "%s: %s", model_path, err); }
    if (!m->tok) { ds_model_free(m); free(text); cli_die(C, "%s has no tokenizer", model_path); }
    if (m->hp.n_ctx_train > 0 && n_ctx > m->hp.n_ctx_train) {
        long lim = m->hp.n_ctx_train;
        ds_model_free(m); free(text);
        cli_die(C, "-c %ld exceeds the model's context length %ld", n_ctx, lim);
    }
    int32_t *toks = NULL;
    size_t n_toks = 0;
    if (ds_tokenize(m->tok, text, len, 0, &toks, &n_toks, err, sizeof err)) {
        ds_model_free(m); free(text);
        cli_die(C, "tokenizer: %s", err);
    }
    free(text);
    long avail = (long)(n_toks / (size_t)n_ctx);
    if (avail < 1) {
        free(toks); ds_model_free(m);
        cli_die(C, "the file has %zu tokens, fewer than one window of -c %ld", n_toks, n_ctx);
    }
    if (n_chunks == 0 || n_chunks > avail) n_chunks = avail;
    ds_ctx *ctx = ds_ctx_new(m, (int)n_ctx, (int)n_threads, err, sizeof err);
    const int V = m->hp.n_vocab;
    float *logits = malloc((size_t)n_ctx * V * sizeof(float));
    if (!ctx || !logits) { free(logits); free(toks); ds_ctx_free(ctx); ds_model_free(m); cli_die(C, "%s", ctx ? "out of memory" : err); }
    ds_ctx_set_kernels(ctx, &(ks));
    double nll = 0.0;
    long scored = 0;
    double t0 = cli_now();
    for (long ch = 0; ch < n_chunks; ch++) {
        const int32_t *w = toks + (size_t)ch * n_ctx;
        ds_kv_truncate(ctx, 0);
        if (ds_forward_batch(ctx, w, (int)n_ctx, 0, DS_LOGITS_ALL, logits, NULL, err, sizeof err)) {
            free(logits); free(toks); ds_ctx_free(ctx); ds_model_free(m);
            cli_die(C, "%s", err);
        }
        double chunk_nll = 0.0;
        for (long t = 0; t + 1 < n_ctx; t++) {
            const float *l = logits + (size_t)t * V;
            double mx = l[0];
            for (int v = 1; v < V; v++) if (l[v] > mx) mx = l[v];
            double s = 0.0;
            for (int v = 0; v < V; v++) s += exp((double)l[v] - mx);
            chunk_nll += mx + log(s) - (double)l[w[t + 1]];
        }
        nll += chunk_nll;
        scored += n_ctx - 1;
        if (verbose) fprintf(stderr, "chunk=%ld nll=%.6f running_ppl=%.4f\n", ch, chunk_nll / (n_ctx - 1), exp(nll / scored));
    }
    double dt = cli_now() - t0;
    printf("ppl=%.6g mean_nll=%.8f n_chunks=%ld n_ctx=%ld n_scored=%ld n_tokens_file=%zu seconds=%.2f tok_s=%.1f\n",
           exp(nll / scored), nll / scored, n_chunks, n_ctx, scored, n_toks, dt, (double)n_chunks * n_ctx / dt);
    free(logits); free(toks);
    ds_ctx_free(ctx);
    ds_model_free(m);
    return 0;
}
