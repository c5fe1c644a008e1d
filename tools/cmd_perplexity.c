/* cmd_perplexity.c — `dspark perplexity -f FILE`: perplexity over fixed,
 * non-overlapping windows of -c tokens (no BOS). Token 0 of each window is
 * context only; tokens 1..c-1 are scored given their prefix inside the
 * window. ppl = exp(mean NLL). The same protocol as tools/train's PyTorch
 * reference, so the two numbers can be compared directly.
 *
 * --llamacpp: llama-perplexity's convention instead — the same windows, but
 * only the second half of each is scored (logit rows n_ctx/2 .. n_ctx-2,
 * i.e. tokens n_ctx/2+1 .. n_ctx-1 given their whole window prefix), so the
 * figure is directly comparable with `llama-perplexity -c N`. */
#include "cli.h"
#include "model.h"
#include "kernels/dsmath.h"   /* ds_exp, ds_log: the same figure with every C library */

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A progress line on a terminal (stderr): chunk, running perplexity, ETA.
 * Redrawn in place; nothing when stderr is a file or a pipe. */
static void progress(long ch, long n, double nll, long scored, double elapsed) {
    double eta = ch > 0 ? elapsed / (double)ch * (double)(n - ch) : 0.0;
    fprintf(stderr, "\rperplexity: chunk %ld/%ld running_ppl=%.4f elapsed=%.0fs eta=%.0fs   ", ch, n,
            scored ? ds_exp(nll / scored) : 0.0, elapsed, eta);
    if (ch == n) fputc('\n', stderr);
    fflush(stderr);
}

int cmd_perplexity(int argc, char **argv) {
    const char *C = "perplexity";
    const char *file = NULL;
    long n_chunks = 0, tp = 1;
    int llamacpp = 0;
    cli_model_flags mf;
    cli_model_flags_init(&mf);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: dspark perplexity -m MODEL.gguf -f FILE [-c N] [--chunks N] [-t N] [--kernels canonical|fast]\n"
                   "  -f, --file FILE       the text, cut into non-overlapping windows of -c tokens\n"
                   "  --chunks N            score only the first N windows (default all)\n"
                   "  --llamacpp            llama-perplexity's convention: score only the second half of\n"
                   "                        each window (tokens c/2+1..c-1), so the figure compares with\n"
                   "                        llama.cpp's; default: tokens 1..c-1 of each window\n"
                   "  --tp N                tensor parallelism over N ranks (docs/TP.md): the same figure\n"
                   "  (-c: an explicit value above the model's context length is an error)\n"
                   "On a terminal a progress line with the running perplexity and an ETA goes to stderr;\n"
                   "-v prints one line per window instead.\n");
            cli_model_flags_help(stdout, 0);
            return 0;
        }
        else if (cli_model_flag(C, argc, argv, &i, &mf)) {}
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "--chunks")) n_chunks = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(a, "--llamacpp")) llamacpp = 1;
        else if (!strcmp(a, "--tp")) tp = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 8);
        else cli_die(C, "unknown flag '%s' (see dspark perplexity --help)", a);
    }
    ds_kernel_set ks;
    cli_model_flags_finish(C, &mf, &ks);
    if (mf.prompt) cli_die(C, "-p is not used by perplexity; give the text with -f FILE");
    if (!file) cli_die(C, "no text file given (-f FILE)");
    const char *model_path = mf.model;
    const long n_threads = mf.n_threads;
    const int verbose = mf.verbose;
    long n_ctx = mf.n_ctx;
    size_t len;
    char *text = cli_read_file(C, file, &len);
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load_on(model_path, mf.device, err, sizeof err);
    if (!m) { free(text); cli_die(C, "%s: %s", model_path, err); }
    if (!m->tok) { ds_model_free(m); free(text); cli_die(C, "%s has no tokenizer", model_path); }
    if (!mf.n_ctx_given) n_ctx = cli_ctx_for_model(&mf, m->hp.n_ctx_train);
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
    if (tp > 1 && ds_ctx_set_tp(ctx, (int)tp, err, sizeof err)) {
        free(logits); free(toks); ds_ctx_free(ctx); ds_model_free(m);
        cli_die(C, "%s", err);
    }
    double nll = 0.0;
    long scored = 0;
    double t0 = cli_now();
    const int tty = !verbose && isatty(STDERR_FILENO);
    if (tty) progress(0, n_chunks, 0.0, 0, 0.0);
    for (long ch = 0; ch < n_chunks; ch++) {
        const int32_t *w = toks + (size_t)ch * n_ctx;
        ds_kv_truncate(ctx, 0);
        if (ds_forward_batch(ctx, w, (int)n_ctx, 0, DS_LOGITS_ALL, logits, NULL, err, sizeof err)) {
            free(logits); free(toks); ds_ctx_free(ctx); ds_model_free(m);
            cli_die(C, "%s", err);
        }
        double chunk_nll = 0.0;
        const long first = llamacpp ? n_ctx / 2 : 0;
        for (long t = first; t + 1 < n_ctx; t++) {
            const float *l = logits + (size_t)t * V;
            double mx = l[0];
            for (int v = 1; v < V; v++) if (l[v] > mx) mx = l[v];
            double s = 0.0;
            for (int v = 0; v < V; v++) s += ds_exp((double)l[v] - mx);
            chunk_nll += mx + ds_log(s) - (double)l[w[t + 1]];
        }
        nll += chunk_nll;
        scored += n_ctx - 1 - first;
        if (verbose) fprintf(stderr, "chunk=%ld nll=%.6f running_ppl=%.4f\n", ch, chunk_nll / (double)(n_ctx - 1 - first), ds_exp(nll / scored));
        if (tty) progress(ch + 1, n_chunks, nll, scored, cli_now() - t0);
    }
    double dt = cli_now() - t0;
    printf("ppl=%.6g mean_nll=%.8f n_chunks=%ld n_ctx=%ld%s n_scored=%ld n_tokens_file=%zu seconds=%.2f tok_s=%.1f\n",
           ds_exp(nll / scored), nll / scored, n_chunks, n_ctx, llamacpp ? " convention=llamacpp" : "", scored, n_toks, dt, (double)n_chunks * n_ctx / dt);
    free(logits); free(toks);
    ds_ctx_free(ctx);
    ds_model_free(m);
    return 0;
}
