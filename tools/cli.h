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
int cmd_devices(int argc, char **argv);

#endif
