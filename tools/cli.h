/* cli.h — what every dspark subcommand shares: flag parsing helpers that
 * turn bad input into one clear line and exit status 2, and the common
 * options (-m -t -c -v --kernels --fast --canonical). */
#ifndef DSPARK_CLI_H
#define DSPARK_CLI_H

#include <stdint.h>
#include <stdio.h>
#include "kernels/kernels.h"

#define DS_EXIT_USAGE 2

/* Print "dspark CMD: error: ..." and exit(2). */
void cli_die(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* Parse an integer flag value in [lo, hi]; dies with a clear line otherwise. */
long  cli_int(const char *cmd, const char *flag, const char *s, long lo, long hi);
float cli_float(const char *cmd, const char *flag, const char *s, float lo, float hi);
/* A sampling seed: any integer in [-2^63, 2^64 - 1], taken modulo 2^64 (a
 * negative one as its two's complement). The server takes the same seeds
 * (those JSON carries exactly, |seed| <= 2^53) the same way, so every
 * answer it gives can be replayed with `dspark generate -s`. */
uint64_t cli_seed(const char *cmd, const char *flag, const char *s);
/* The value after argv[*i] (advancing *i), or die "FLAG needs a value". */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);

/* Read a whole file into a NUL-terminated malloc'd buffer; dies on error. */
char *cli_read_file(const char *cmd, const char *path, size_t *len);

/* Kernel-set flags gathered while parsing, resolved by cli_kernel_set(). */
typedef struct {
    const char *kernels, *fast, *canonical;
} cli_kernel_flags;
/* Handle --kernels/--fast/--canonical at argv[*i]; 1 if consumed. */
int  cli_kernel_flag(const char *cmd, int argc, char **argv, int *i, cli_kernel_flags *kf);
void cli_kernel_set(const char *cmd, const cli_kernel_flags *kf, ds_kernel_set *ks);

/* ---- the model flags, one parser and one set of defaults for generate,
 * bench, perplexity, diverge/families/sweep and surface:
 *   -m/--model FILE  -p/--prompt TEXT  -t/--threads N (2)  -c/--ctx-size N
 *   (2048, capped by the model's context length)  -v/--verbose
 *   --device/-dev NAME (cpu)  --kernels/--fast/--canonical */
#define CLI_THREADS_DEFAULT 2
#define CLI_N_CTX_DEFAULT 2048
typedef struct {
    const char *model, *prompt, *device;
    long n_threads, n_ctx;
    int n_ctx_given;          /* -c was on the command line */
    int verbose;
    cli_kernel_flags kf;
} cli_model_flags;
void cli_model_flags_init(cli_model_flags *mf);
/* Handle one of the flags above at argv[*i]; 1 if consumed. */
int  cli_model_flag(const char *cmd, int argc, char **argv, int *i, cli_model_flags *mf);
/* After parsing: -m given, the device known to this build (else one line,
 * exit 2), the kernel set parsed into *ks (may be NULL). */
void cli_model_flags_finish(const char *cmd, const cli_model_flags *mf, ds_kernel_set *ks);
/* The help lines for the flags above (prompt_too: include -p). */
void cli_model_flags_help(FILE *f, int prompt_too);
/* -c capped by the model's trained context (0 = unknown: not capped). */
long cli_ctx_for_model(const cli_model_flags *mf, int n_ctx_train);

/* ---- outputs (src/outfile.h): refuse an output that is one of the inputs,
 * temp file + rename, every write checked. Each dies with one line. */
struct ds_outfile;
struct ds_outfile *cli_out_open(const char *cmd, const char *path, const char *const *inputs, size_t n_inputs);
void cli_out_commit(const char *cmd, struct ds_outfile *o);

/* Write one token's bytes whole (however long the token is); -1 on a write
 * error. */
struct ds_tokenizer;
int cli_write_token(FILE *f, const struct ds_tokenizer *tok, int32_t id);
/* The same into a malloc-grown buffer (*buf, *len, *cap); -1 out of memory. */
int cli_append_token(char **buf, size_t *len, size_t *cap, const struct ds_tokenizer *tok, int32_t id);

/* A command whose machine-readable output goes to stdout (--json -, --svg -)
 * writes its text report to stderr: cli_stdout_to_stderr sends what is
 * printed to stdout there (returns the saved descriptor, or -1), and
 * cli_stdout_back(saved) restores stdout before the output is written. */
int  cli_stdout_to_stderr(void);
void cli_stdout_back(int saved);

/* Median of v[0..n) (n >= 1; sorts v in place). */
double cli_median(double *v, int n);

/* Monotonic seconds. */
double cli_now(void);

/* Subcommands (tools/cmd_*.c). */
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_make_model(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_make_drafter(int argc, char **argv);
int cmd_diverge(int argc, char **argv);
int cmd_families(int argc, char **argv);
int cmd_sweep(int argc, char **argv);
int cmd_surface(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_devices(int argc, char **argv);

#endif
