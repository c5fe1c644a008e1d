/* cmd_make_drafter.c — `dspark make-drafter`: a deterministic random DSpark
 * drafter GGUF for a given target (flags -> ds_make_drafter()). */
#include "cli.h"
#include "drafter_make.h"
#include "model.h"
#include "outfile.h"

#include <stdlib.h>
#include <string.h>

int cmd_make_drafter(int argc, char **argv);

static uint32_t md_parse_type(const char *C, const char *s) {
    if (!strcmp(s, "f32")) return DS_TYPE_F32;
    if (!strcmp(s, "f16")) return DS_TYPE_F16;
    if (!strcmp(s, "bf16")) return DS_TYPE_BF16;
    if (!strcmp(s, "q8_0")) return DS_TYPE_Q8_0;
    cli_die(C, "--type must be f32, f16, bf16 or q8_0, got '%s'", s);
}

/* "0,1,2" -> ids; dies on anything else */
static int md_parse_taps(const char *C, const char *s, int *taps) {
    int n = 0;
    const char *p = s;
    if (!*p) cli_die(C, "--taps needs a comma-separated list of layer ids, got ''");
    for (;;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',')) cli_die(C, "--taps expects comma-separated integers, got '%s'", s);
        if (n >= DS_MAX_TAPS) cli_die(C, "--taps lists more than %d layers", DS_MAX_TAPS);
        if (v < 0 || v > 100000) cli_die(C, "--taps layer id %ld is out of range", v);
        taps[n++] = (int)v;
        if (!*end) break;
        p = end + 1;
    }
    return n;
}

int cmd_make_drafter(int argc, char **argv) {
    const char *C = "make-drafter";
    const char *model = NULL, *out = NULL;
    ds_make_drafter_opts o;
    ds_make_drafter_defaults(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: dspark make-drafter -m TARGET.gguf -o OUT.gguf [--layout dflash|dspark] [--n-layer N]\n"
                   "       [--block-size N] [--taps 0,1,2] [--markov vanilla|gated|rnn] [--rank N] [--no-confidence]\n"
                   "       [--correction W] [--type f32|f16|bf16|q8_0] [--seed N]\n"
                   "Writes a deterministic random DSpark drafter for TARGET (its trunk shape is the target's;\n"
                   "the embedding and LM head are shared with the target). Taps are HF layer ids (layer outputs).\n");
            return 0;
        }
        else if (!strcmp(a, "-m")) model = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "-o")) out = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "--layout")) {
            o.layout = cli_value(C, argc, argv, &i);
            if (strcmp(o.layout, "dflash") && strcmp(o.layout, "dspark")) cli_die(C, "--layout must be dflash or dspark, got '%s'", o.layout);
        }
        else if (!strcmp(a, "--n-layer")) o.n_layer = (int)cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--block-size")) o.block_size = (int)cli_int(C, a, cli_value(C, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--taps")) o.n_taps = md_parse_taps(C, cli_value(C, argc, argv, &i), o.taps);
        else if (!strcmp(a, "--markov")) {
            o.markov = cli_value(C, argc, argv, &i);
            if (strcmp(o.markov, "vanilla") && strcmp(o.markov, "gated") && strcmp(o.markov, "rnn"))
                cli_die(C, "--markov must be vanilla, gated or rnn, got '%s'", o.markov);
        }
        else if (!strcmp(a, "--rank")) o.rank = (int)cli_int(C, a, cli_value(C, argc, argv, &i), 0, 65536);
        else if (!strcmp(a, "--no-confidence")) o.confidence = 0;
        else if (!strcmp(a, "--correction")) o.correction = (int)cli_int(C, a, cli_value(C, argc, argv, &i), 0, 1 << 20);
        else if (!strcmp(a, "--type")) o.type = md_parse_type(C, cli_value(C, argc, argv, &i));
        else if (!strcmp(a, "--seed")) o.seed = cli_int(C, a, cli_value(C, argc, argv, &i), 0, 0x7fffffffL);
        else cli_die(C, "unknown flag '%s' (see dspark make-drafter --help)", a);
    }
    if (!model) cli_die(C, "no target model given (-m TARGET.gguf)");
    if (!out) cli_die(C, "no output file given (-o OUT.gguf)");
    char err[DS_ERRLEN];
    if (ds_out_check_inputs(out, &model, 1, err, sizeof err)) cli_die(C, "%s", err);
    ds_model *m = ds_model_load(model, err, sizeof err);
    if (!m) cli_die(C, "%s", err);
    int rc = ds_make_drafter(&o, m, out, err, sizeof err);
    ds_model_free(m);
    if (rc) cli_die(C, "%s", strncmp(err, "make-drafter: ", 14) ? err : err + 14);
    fprintf(stderr, "make-drafter: wrote %s: layout=%s block_size=%d n_layer=%d markov=%s type=%s for target %s\n", out,
            o.layout, o.block_size, o.n_layer, o.markov, ds_type_name(o.type), model);
    return 0;
}
