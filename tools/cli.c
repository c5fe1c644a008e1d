/* cli.c — shared flag parsing for the dspark subcommands. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void cli_die(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "dspark %s: error: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
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

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
