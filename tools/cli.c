/* cli.c — shared flag parsing for the dspark subcommands. */
#include "cli.h"
#include "device.h"
#include "outfile.h"
#include "tokenizer.h"

#include <errno.h>
#include <stdio_ext.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

void cli_die(const char *cmd, const char *fmt, ...) {
    /* one line whatever the arguments hold (file bytes, user strings):
     * formatted first, then control bytes replaced (common.h) */
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    ds_sanitize_line(line);
    /* what was printed so far comes first; if stdout cannot take it, this
     * line is the one report (the exit-time check must not add another) */
    if (fflush(stdout) || ferror(stdout)) {
        __fpurge(stdout);
        clearerr(stdout);
    }
    fprintf(stderr, "dspark %s: error: %s\n", cmd, line);
    exit(DS_EXIT_USAGE);
}

long cli_int(const char *cmd, const char *flag, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) cli_die(cmd, "%s expects an integer, got '%s'", flag, s);
    if (v < lo || v > hi) cli_die(cmd, "%s %ld is out of range [%ld, %ld]", flag, v, lo, hi);
    return v;
}

uint64_t cli_seed(const char *cmd, const char *flag, const char *s) {
    char *end;
    errno = 0;
    uint64_t v;
    if (*s == '-') v = (uint64_t)strtoll(s, &end, 10);            /* two's complement: modulo 2^64 */
    else v = (uint64_t)strtoull(s, &end, 10);
    if (errno || end == s || *end || (*s != '-' && (*s < '0' || *s > '9')))
        cli_die(cmd, "%s expects an integer in [-9223372036854775808, 18446744073709551615], got '%s'", flag, s);
    return v;
}

float cli_float(const char *cmd, const char *flag, const char *s, float lo, float hi) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || isnan(v)) cli_die(cmd, "%s expects a number, got '%s'", flag, s);
    if (v < lo || v > hi) cli_die(cmd, "%s %g is out of range [%g, %g]", flag, v, lo, hi);
    return v;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) cli_die(cmd, "%s needs a value", argv[*i]);
    return argv[++*i];
}

char *cli_read_file(const char *cmd, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) cli_die(cmd, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) cli_die(cmd, "out of memory reading '%s'", path);
    for (;;) {
        if (n + 1 >= cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); fclose(f); cli_die(cmd, "out of memory reading '%s'", path); }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); cli_die(cmd, "error reading '%s'", path); }
    buf[n] = 0;
    /* Text only: a compressed file read as text would be tokenized as
     * bytes and "work" — a perplexity of 10^6, a prompt of noise — so it
     * is refused with the tool that opens it. */
    static const struct { const char *magic; size_t n; const char *what, *tool; } packed[] = {
        {"\xfd" "7zXZ", 6, "xz", "xz -dc"}, {"\x1f\x8b", 2, "gzip", "gzip -dc"},
        {"\x28\xb5\x2f\xfd", 4, "zstd", "zstd -dc"}, {"BZh", 3, "bzip2", "bzip2 -dc"},
    };
    for (size_t i = 0; i < sizeof packed / sizeof packed[0]; i++)
        if (n >= packed[i].n && !memcmp(buf, packed[i].magic, packed[i].n) &&
            (i != 3 || (n > 3 && buf[3] >= '1' && buf[3] <= '9'))) {
            free(buf);
            cli_die(cmd, "'%s' is %s-compressed, not text: decompress it first (%s '%s' > FILE)", path,
                    packed[i].what, packed[i].tool, path);
        }
    const char *nul = memchr(buf, 0, n);
    if (nul) {
        const size_t at = (size_t)(nul - buf);
        free(buf);
        cli_die(cmd, "'%s' is not text (a NUL byte at offset %zu)", path, at);
    }
    *len = n;
    return buf;
}

int cli_kernel_flag(const char *cmd, int argc, char **argv, int *i, cli_kernel_flags *kf) {
    const char *a = argv[*i];
    if (!strcmp(a, "--kernels")) { kf->kernels = cli_value(cmd, argc, argv, i); return 1; }
    if (!strcmp(a, "--fast")) { kf->fast = cli_value(cmd, argc, argv, i); return 1; }
    if (!strcmp(a, "--canonical")) { kf->canonical = cli_value(cmd, argc, argv, i); return 1; }
    return 0;
}

void cli_kernel_set(const char *cmd, const cli_kernel_flags *kf, ds_kernel_set *ks) {
    char err[256];
    if (ds_kernel_set_parse(ks, kf->kernels, kf->fast, kf->canonical, err, sizeof err))
        cli_die(cmd, "%s", err);
}

/* ========================================================================
 * Model flags
 * ===================================================================== */

void cli_model_flags_init(cli_model_flags *mf) {
    memset(mf, 0, sizeof *mf);
    mf->device = "cpu";
    mf->n_threads = CLI_THREADS_DEFAULT;
    mf->n_ctx = CLI_N_CTX_DEFAULT;
}

int cli_model_flag(const char *cmd, int argc, char **argv, int *i, cli_model_flags *mf) {
    const char *a = argv[*i];
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) mf->model = cli_value(cmd, argc, argv, i);
    else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) mf->prompt = cli_value(cmd, argc, argv, i);
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) mf->n_threads = cli_int(cmd, a, cli_value(cmd, argc, argv, i), 1, 256);
    else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        mf->n_ctx = cli_int(cmd, a, cli_value(cmd, argc, argv, i), 2, 1 << 24);
        mf->n_ctx_given = 1;
    }
    else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) mf->verbose = 1;
    else if (!strcmp(a, "--device") || !strcmp(a, "-dev")) mf->device = cli_value(cmd, argc, argv, i);
    else return cli_kernel_flag(cmd, argc, argv, i, &mf->kf);
    return 1;
}

void cli_model_flags_finish(const char *cmd, const cli_model_flags *mf, ds_kernel_set *ks) {
    if (!ds_device_known(mf->device))
        cli_die(cmd, "unknown device '%s' (this build has: %s)", mf->device, ds_device_list());
    if (!mf->model) cli_die(cmd, "no model given (-m MODEL.gguf)");
    if (ks) cli_kernel_set(cmd, &mf->kf, ks);
}

void cli_model_flags_help(FILE *f, int prompt_too) {
    fprintf(f, "model flags (shared by generate, bench, perplexity, diverge, families, sweep, surface):\n"
               "  -m, --model FILE      model GGUF\n");
    if (prompt_too) fprintf(f, "  -p, --prompt TEXT     prompt text\n");
    fprintf(f, "  -t, --threads N       threads (default %d); output bits do not depend on it\n"
               "  -c, --ctx-size N      context size in tokens (default %d, capped by the model)\n"
               "  -v, --verbose         model and kernel lines on stderr\n"
               "  --device, -dev NAME   compute device (default cpu; this build has: %s)\n"
               "  --kernels SET         canonical (default) or fast, for the batched path\n"
               "  --fast F,..           families to run fast on top of the base set\n"
               "  --canonical F,..      families to run canonical on top of the base set\n",
            CLI_THREADS_DEFAULT, CLI_N_CTX_DEFAULT, ds_device_list());
}

long cli_ctx_for_model(const cli_model_flags *mf, int n_ctx_train) {
    return n_ctx_train > 0 && mf->n_ctx > n_ctx_train ? n_ctx_train : mf->n_ctx;
}

/* ========================================================================
 * Outputs and token bytes
 * ===================================================================== */

ds_outfile *cli_out_open(const char *cmd, const char *path, const char *const *inputs, size_t n_inputs) {
    char err[DS_ERRLEN];
    if (ds_out_check_inputs(path, inputs, n_inputs, err, sizeof err)) cli_die(cmd, "%s", err);
    ds_outfile *o = ds_out_open(path, err, sizeof err);
    if (!o) cli_die(cmd, "%s", err);
    return o;
}

void cli_out_commit(const char *cmd, ds_outfile *o) {
    char err[DS_ERRLEN];
    if (ds_out_commit(o, err, sizeof err)) cli_die(cmd, "%s", err);
}

/* Tokens are usually short: a stack buffer, and the heap only for the rare
 * long one (the loader accepts any length). */
static const char *token_bytes(const ds_tokenizer *tok, int32_t id, char *small, size_t cap, char **heap, int *n) {
    *heap = NULL;
    *n = ds_token_to_bytes(tok, id, small, cap);
    if (*n <= 0) return small;
    if ((size_t)*n <= cap) return small;
    *heap = malloc((size_t)*n);
    if (!*heap) { *n = -2; return NULL; }
    ds_token_to_bytes(tok, id, *heap, (size_t)*n);
    return *heap;
}

int cli_write_token(FILE *f, const ds_tokenizer *tok, int32_t id) {
    char small[256], *heap;
    int n;
    const char *b = token_bytes(tok, id, small, sizeof small, &heap, &n);
    int rc = 0;
    if (n == -2) rc = -1;
    else if (n > 0 && fwrite(b, 1, (size_t)n, f) != (size_t)n) rc = -1;
    free(heap);
    return rc;
}

int cli_append_token(char **buf, size_t *len, size_t *cap, const ds_tokenizer *tok, int32_t id) {
    char small[256], *heap;
    int n;
    const char *b = token_bytes(tok, id, small, sizeof small, &heap, &n);
    if (n == -2) return -1;
    if (n > 0) {
        if (*len + (size_t)n + 1 > *cap) {
            size_t nc = 2 * (*len + (size_t)n + 1);
            char *nb = realloc(*buf, nc);
            if (!nb) { free(heap); return -1; }
            *buf = nb;
            *cap = nc;
        }
        memcpy(*buf + *len, b, (size_t)n);
        *len += (size_t)n;
        (*buf)[*len] = 0;
    }
    free(heap);
    return 0;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
double cli_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int cli_stdout_to_stderr(void) {
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    if (saved < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
        if (saved >= 0) close(saved);
        return -1;
    }
    return saved;
}

void cli_stdout_back(int saved) {
    if (saved < 0) return;
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
}
