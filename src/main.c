/* main.c — the dspark command line: one dispatcher, one file per
 * subcommand in tools/cmd_*.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tools/cli.h"
#include "common.h"
#include "dspark.h"
#include "kernels/cpu/simd.h"
#include "outfile.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    { "generate",   cmd_generate,   "greedy generation (plain, or speculative with -md)" },
    { "bench",      cmd_bench,      "decode / batched-forward / prefill timings, canonical vs fast" },
    { "make-model", cmd_make_model, "write a deterministic random Qwen3/Llama GGUF with a tokenizer" },
    { "inspect",    cmd_inspect,    "print a GGUF file's metadata and tensor table" },
    { "perplexity", cmd_perplexity, "perplexity of a text file over fixed windows" },
    { "convert",    cmd_convert,    "HF safetensors + config.json -> GGUF (targets and DSpark drafters)" },
    { "quantize",   cmd_quantize,   "re-encode a GGUF's 2-D weights (f32, f16, bf16, q8_0)" },
    { "make-drafter", cmd_make_drafter, "write a deterministic random DSpark drafter GGUF for a target" },
    { "diverge",    cmd_diverge,    "batched vs sequential: gate, earliest bitwise divergence, metrics" },
    { "families",   cmd_families,   "per-family isolated A/B and where each lands on the identity chain" },
    { "surface",    cmd_surface,    "speculative run teacher-forced through plain decode: divergence rate" },
    { "sweep",      cmd_sweep,      "canonicalize family by family to a sufficient set, then C_min" },
    { "serve",      cmd_serve,      "OpenAI-compatible HTTP server (completions, chat, SSE, metrics)" },
    { "devices",    cmd_devices,    "the devices this build has and whether each can start here" },
};

static void usage(FILE *f) {
    fprintf(f, "usage: dspark COMMAND [options]   (dspark COMMAND --help for details)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].help);
}

/* A lost write to stdout (a full disk, /dev/full, a closed pipe) is an
 * error for every command and every way out of it: a return from a command
 * is checked below with the command's name; an exit() from inside one
 * (--help, a finished report) is caught here, after its last write. One
 * line, exit status 2, as for any user error. */
static void stdout_at_exit(void) {
    char err[DS_ERRLEN];
    if (ds_out_check_stdout(err, sizeof err)) {
        fprintf(stderr, "dspark: error: %s\n", err);
        _exit(DS_EXIT_USAGE);
    }
}

static int finish(const char *name, int rc) {
    char err[DS_ERRLEN];
    if (ds_out_check_stdout(err, sizeof err)) {
        fprintf(stderr, "dspark%s%s: error: %s\n", name ? " " : "", name ? name : "", err);
        return DS_EXIT_USAGE;
    }
    return rc;
}

int main(int argc, char **argv) {
    atexit(stdout_at_exit);
    if (argc < 2) {
        fprintf(stderr, "dspark: error: no command given (usage: dspark COMMAND [options]; dspark --help lists commands)\n");
        return DS_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dspark %s\n", dspark_version());
        return finish(NULL, 0);
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return finish(NULL, 0);
    }
    /* the SIMD level is decided once for the whole process: refuse a cap
     * nobody can honour before any work is done */
    char err[DS_ERRLEN];
    if (ds_simd_check_env(err, sizeof err)) {
        fprintf(stderr, "dspark: error: %s\n", err);
        return DS_EXIT_USAGE;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            return finish(commands[i].name, commands[i].fn(argc - 1, argv + 1));
        }
    fprintf(stderr, "dspark: error: unknown command '%s' (try dspark --help)\n", argv[1]);
    return DS_EXIT_USAGE;
}
