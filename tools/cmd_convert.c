/* cmd_convert.c — `dspark convert`: HF safetensors checkpoint -> GGUF.
 *
 *   dspark convert --in DIR --out FILE.gguf [--type f32|f16|bf16|q8_0]
 *                  [--kind target|drafter] [--layout dflash|dspark]
 *                  [--tokenizer-from TARGET.gguf] [--name NAME] [--quiet]
 *
 * Exit status: 0 converted, 2 on any error (a bad flag or a checkpoint that
 * cannot be converted: both are the user's input). Every error is one line on
 * stderr, "dspark convert: error: ..."; progress notes and the closing
 * "wrote FILE" line go to stdout. The mapping itself lives in src/convert.c.
 * (Self-contained: test_convert includes this file without tools/cli.c.) */
#include "cli.h"
#include "convert.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One sanitised error line; returns the exit status 2. */
static int conv_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int conv_fail(const char *fmt, ...) {
    char line[DS_ERRLEN * 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    ds_sanitize_line(line);
    fflush(stdout);
    fprintf(stderr, "dspark convert: error: %s\n", line);
    return DS_EXIT_USAGE;
}

static void convert_usage(FILE *f) {
    fputs("usage: dspark convert --in DIR --out FILE.gguf [--type f32|f16|bf16|q8_0]\n"
          "                      [--kind target|drafter] [--layout dflash|dspark]\n"
          "                      [--tokenizer-from TARGET.gguf] [--name NAME] [--quiet]\n"
          "  DIR holds config.json and model.safetensors (or shards + model.safetensors.index.json);\n"
          "  source dtypes F32/F16/BF16. --type applies to 2-D weights (default f16); norms and\n"
          "  biases stay f32; q8_0 rows whose length is not a multiple of 32 fall back to f16.\n"
          "  --kind defaults to drafter when config.json has block_size/target_layer_ids.\n"
          "  --layout (drafters): dflash (llama.cpp mainline, default) or dspark (PrismML legacy).\n"
          "  The tokenizer is copied from --tokenizer-from, else DIR/tokenizer.gguf; targets need one.\n",
          f);
}

int cmd_convert(int argc, char **argv) {
    ds_convert_opts o;
    ds_convert_opts_init(&o);
    int quiet = 0;
    /* argv[0] is "convert" (or the program name); options follow */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { convert_usage(stdout); return 0; }
        if (!strcmp(a, "--quiet")) { quiet = 1; continue; }
        int takes = !strcmp(a, "--in") || !strcmp(a, "--out") || !strcmp(a, "--type") || !strcmp(a, "--kind") ||
                    !strcmp(a, "--layout") || !strcmp(a, "--tokenizer-from") || !strcmp(a, "--name");
        if (!takes) {
            return conv_fail("unknown argument '%s' (see dspark convert --help)", a);
        }
        if (!v) {
            return conv_fail("%s needs a value", a);
        }
        i++;
        if (!strcmp(a, "--in")) o.in_dir = v;
        else if (!strcmp(a, "--out")) o.out_path = v;
        else if (!strcmp(a, "--tokenizer-from")) o.tokenizer_from = v;
        else if (!strcmp(a, "--name")) o.name = v;
        else if (!strcmp(a, "--type")) {
            if (!strcmp(v, "f32")) o.type = DS_TYPE_F32;
            else if (!strcmp(v, "f16")) o.type = DS_TYPE_F16;
            else if (!strcmp(v, "bf16")) o.type = DS_TYPE_BF16;
            else if (!strcmp(v, "q8_0")) o.type = DS_TYPE_Q8_0;
            else { return conv_fail("--type must be f32, f16, bf16 or q8_0 (got '%s')", v); }
        } else if (!strcmp(a, "--kind")) {
            if (!strcmp(v, "target")) o.kind = DS_CONV_KIND_TARGET;
            else if (!strcmp(v, "drafter")) o.kind = DS_CONV_KIND_DRAFTER;
            else { return conv_fail("--kind must be target or drafter (got '%s')", v); }
        } else if (!strcmp(a, "--layout")) {
            if (!strcmp(v, "dflash")) o.layout = DS_CONV_LAYOUT_DFLASH;
            else if (!strcmp(v, "dspark")) o.layout = DS_CONV_LAYOUT_DSPARK;
            else { return conv_fail("--layout must be dflash or dspark (got '%s')", v); }
        }
    }
    if (!o.in_dir || !o.out_path) {
        return conv_fail("--in DIR and --out FILE.gguf are required (see dspark convert --help)");
    }
    if (o.kind == DS_CONV_KIND_TARGET && o.layout != DS_CONV_LAYOUT_DEFAULT) {
        return conv_fail("--layout applies to --kind drafter only");
    }
    o.log = quiet ? NULL : stdout;
    char err[DS_ERRLEN * 2];
    if (ds_convert(&o, err, sizeof err)) return conv_fail("%s", err);
    if (fflush(stdout) || ferror(stdout)) return conv_fail("writing the progress notes to standard output failed");
    return 0;
}
