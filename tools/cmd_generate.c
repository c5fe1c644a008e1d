/* cmd_generate.c — `dspark generate`: text from a prompt, plain or
 * speculative (-md DRAFTER.gguf), greedy or seeded Gumbel-max sampling.
 *
 * llama.cpp habits: -m -md -p -f -n -t -c --seed --temp --top-k --top-p
 * --draft-max --draft-p-min -v. Output goes to stdout as it is produced; a
 * key=value stats line goes to stderr at the end. Speculative output is
 * byte-identical to plain output for the same sampler when every kernel
 * family is canonical (direct commit) or with any kernels (replay commit). */
#include "cli.h"
#include "drafter.h"
#include "oracle.h"
#include "generate.h"
#include "model.h"
#include "outfile.h"
#include "sampler.h"
#include "spec.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const ds_tokenizer *tok;
    FILE *out;
    int failed;           /* errno of a failed write to out: reported at the end */
} printer;

/* Each token whole (however long), flushed as it comes; a failed write is
 * remembered, not ignored. */
static void print_token(void *user, int32_t token) {
    printer *p = user;
    if (p->failed) return;
    if (cli_write_token(p->out, p->tok, token) || fflush(p->out)) p->failed = errno ? errno : EIO;
}

/* The text ends with a newline, flushed before the stats line goes to
 * stderr: with both streams on one pipe or terminal the stats always start
 * on a line of their own. */
static void end_text(printer *p) {
    if (fputc('\n', p->out) == EOF || fflush(p->out)) p->failed = errno ? errno : EIO;
}

/* --dump-block: one line per round with the full drafted block */
static void dump_round(void *user, const ds_spec_round *r) {
    FILE *f = user;
    fprintf(f, "round=%d p=%d anchor=%d n_draft=%d ell=%d accepted=%d bonus=%d drafts=", r->round, r->p, r->anchor,
            r->n_draft, r->ell, r->accepted, r->bonus);
    for (int i = 0; i < r->n_draft; i++) fprintf(f, "%s%d", i ? "," : "", r->ids[i]);
    if (r->conf) {
        fprintf(f, " conf=");
        for (int i = 0; i < r->n_draft; i++) fprintf(f, "%s%.6f", i ? "," : "", r->conf[i]);
    }
    fputc('\n', f);
}

static void usage(void) {
    printf("usage: dspark generate -m MODEL.gguf (-p TEXT | -f FILE) [options]\n"
           "  -f, --file FILE       read the prompt from FILE\n"
           "  -n, --n-predict N     tokens to generate (default 128)\n"
           "  --temp T              temperature (default 0 = greedy); T > 0: Gumbel-max with\n"
           "                        Philox noise keyed on (seed, position, token id)\n"
           "  --top-k K             keep the K most likely tokens (default 0 = off)\n"
           "  --top-p P             nucleus: smallest set with mass >= P, in (0, 1] (default 1 = off)\n"
           "  -s, --seed N          sampling seed (default 0; greedy ignores it): any integer, modulo 2^64\n"
           "                        (dspark serve's dspark.seed replays here)\n"
           "  --min-p P             keep tokens with probability >= P x the best one's, in [0, 1]\n"
           "                        (default 0 = off; llama.cpp's default is 0.05)\n"
           "  --repeat-penalty F    only 1 (off): dspark applies no repetition penalty\n"
           "  --prefill MODE        batch (default) or decode\n"
           "  -np, --parallel N     sequences; only 1 is supported\n"
           "  --echo                print the prompt before the generated text\n"
           "  --tp N                tensor parallelism over N ranks (1..8) in one process, all\n"
           "                        on the --device (CPU or one GPU): column-parallel weights and\n"
           "                        all-gathers, the same bytes as --tp 1 (docs/TP.md);\n"
           "                        --fast tp_reduce: the row-parallel all-reduce layout\n"
           "  --warmup              run the generation once, untimed and unprinted, before the\n"
           "                        one reported (graph recordings and first-touch costs out of\n"
           "                        the figures, as llama-bench's warm-up run; same text)\n");
    cli_model_flags_help(stdout, 1);
    printf("speculative decoding (DSpark block drafter):\n"
           "  -md, --model-draft FILE  drafter GGUF (mainline dflash or legacy dspark layout)\n"
           "  --draft-max, --draft N   drafts kept per round, 1..gamma (default gamma)\n"
           "  --draft-min N     accepted when every round drafts at least N (no --draft-p-min:\n"
           "                    every round drafts --draft-max); otherwise use --draft-max\n"
           "  --draft-p-min P   stop the draft at the first slot with confidence < P\n"
           "                    (needs a confidence head; implies --draft-sched pmin)\n"
           "  --draft-sched S   none | pmin | table (cost-table scheduler, paper Alg. 1) |\n"
           "                    auto (this machine's measured costs and this stream's measured\n"
           "                    acceptance pick each round's width, or a plain step when\n"
           "                    drafting does not pay)\n"
           "  --sps-table FILE  lines 'width seconds_per_pass' for --draft-sched table / auto\n"
           "                    (default: measured at start-up, widths 1..draft-max+1)\n"
           "  --commit MODE     direct (keep the verifier's KV rows, default) or replay\n"
           "                    (re-decode accepted tokens; exact with any kernels)\n"
           "  --draft-wait      wait for each round's drafts before queueing its verify (two\n"
           "                    waits a round instead of one: draft_s and verify_s then time\n"
           "                    the two apart; same tokens)\n"
           "  --dump-block FILE one line per round: the full drafted block, confidences,\n"
           "                    verify width, accepted count (needs --draft-max = gamma)\n"
           "  --oracle-accept SPEC  the oracle-acceptance benchmark: a plain run first (its\n"
           "                    tokens and tok/s), then the speculative run with the drafter\n"
           "                    network run for its cost but its proposals replaced by the plain\n"
           "                    continuation, right for as many slots as SPEC says: FILE (a\n"
           "                    recorded pattern replayed round by round: --dump-block output or\n"
           "                    one count per line) or rate:R (each slot right with probability R)\n"
           "  --dump-logits FILE raw f32 logits (plain mode): the prefill's last row, then\n"
           "                    each greedy decode step's row, n_vocab floats each\n"
           "The text goes to stdout; one key=value stats line goes to stderr after it.\n");
}

/* --dump-logits: the raw logits of a batched prefill's last row and of
 * n_steps greedy decode steps after it, as the engine computed them (the
 * seam's golden test hashes this file). */
static int dump_logits(ds_ctx *ctx, int V, const int32_t *toks, int n_toks, int n_steps, FILE *f,
                       char *err, size_t errlen) {
    float *lg = malloc((size_t)V * sizeof(float));
    if (!lg) { ds_errf(err, errlen, "out of memory"); return -1; }
    int rc = ds_prefill(ctx, toks, n_toks, DS_PREFILL_BATCH, lg, NULL, err, errlen);
    for (int i = 0; rc == 0 && i <= n_steps; i++) {
        if (fwrite(lg, sizeof(float), (size_t)V, f) != (size_t)V) { ds_errf(err, errlen, "write error"); rc = -1; break; }
        if (i == n_steps || n_toks + i >= ds_ctx_n_ctx(ctx)) break;
        rc = ds_decode(ctx, (int32_t)ds_argmax(lg, V), n_toks + i, lg, NULL, err, errlen);
    }
    free(lg);
    return rc;
}

/* Everything that must be freed before exiting on an error (LeakSanitizer
 * checks exit(2) paths too). */
typedef struct {
    char *file_buf;
    int32_t *toks, *out;
    ds_model *m;
    ds_ctx *ctx;
    ds_drafter *dr;
    ds_dctx *keep;              /* --warmup: the drafter context both runs use */
    double *sps;
    int32_t *ref;               /* --oracle-accept: the plain run's tokens */
    ds_oracle orc;
    ds_outfile *dump;
} res_t;

static void res_free(res_t *r) {
    free(r->out); free(r->toks); free(r->file_buf); free(r->sps); free(r->ref);
    ds_oracle_free(&r->orc);
    ds_out_abort(r->dump);      /* on an error path: remove the temp file */
    ds_dctx_free(r->keep);      /* before the drafter and the context it uses */
    if (r->dr) ds_drafter_free(r->dr);
    if (r->ctx) ds_ctx_free(r->ctx);
    if (r->m) ds_model_free(r->m);
    memset(r, 0, sizeof *r);
}

static void die_free(res_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void die_free(res_t *r, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    res_free(r);
    cli_die("generate", "%s", buf);
}

int cmd_generate(int argc, char **argv) {
    const char *C = "generate";
    const char *prompt_file = NULL, *draft_path = NULL;
    const char *sps_path = NULL, *dump_path = NULL, *sched_s = NULL, *logits_path = NULL, *oracle_s = NULL;
    uint64_t seed = 0;
    long n_predict = 128, top_k = 0, draft_max = 0, draft_min = 0, parallel = 1, tp = 1;
    int draft_wait = 0, warmup = 0;
    int echo = 0, have_pmin = 0;
    float temp = 0.0f, top_p = 1.0f, min_p = 0.0f, p_min = 0.0f;
    ds_commit_mode commit = DS_COMMIT_DIRECT;
    ds_prefill_mode prefill = DS_PREFILL_BATCH;
    char err0[DS_ERRLEN];
    cli_model_flags mf;
    cli_model_flags_init(&mf);
    const char *spec_flag = NULL;     /* first speculative-only flag seen */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        else if (cli_model_flag(C, argc, argv, &i, &mf)) {}
        else if (!strcmp(a, "-md") || !strcmp(a, "--model-draft")) draft_path = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) prompt_file = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) n_predict = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(a, "--seed") || !strcmp(a, "-s")) seed = cli_seed(C, a, cli_value(C, argc, argv, &i));
        else if (!strcmp(a, "--temp")) temp = cli_float(C, a, cli_value(C, argc, argv, &i), 0.0f, 100.0f);
        else if (!strcmp(a, "--top-k")) top_k = cli_int(C, a, cli_value(C, argc, argv, &i), 0, 1 << 24);
        else if (!strcmp(a, "--top-p")) {
            const char *v = cli_value(C, argc, argv, &i);
            top_p = cli_float(C, a, v, 0.0f, 1.0f);
            if (!(top_p > 0.0f)) cli_die(C, "--top-p %s is out of range (0, 1]", v);
        }
        /* llama.cpp's repetition penalty is not implemented: its "off"
         * value is accepted, anything else says what to do instead */
        else if (!strcmp(a, "--min-p")) min_p = cli_float(C, a, cli_value(C, argc, argv, &i), 0.0f, 1.0f);
        else if (!strcmp(a, "--repeat-penalty")) {
            const char *v = cli_value(C, argc, argv, &i);
            if (cli_float(C, a, v, 0.0f, 100.0f) != 1.0f)
                cli_die(C, "--repeat-penalty %s: dspark applies no repetition penalty (exact sampling); drop the flag or give 1", v);
        }
        else if (!strcmp(a, "--parallel") || !strcmp(a, "-np")) {
            parallel = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 16);
            if (parallel != 1) cli_die(C, "%s %ld: only one sequence is supported", a, parallel);
        }
        else if (!strcmp(a, "--draft-max") || !strcmp(a, "--draft")) {
            spec_flag = spec_flag ? spec_flag : a;
            draft_max = cli_int(C, a, cli_value(C, argc, argv, &i), 1, DS_SPEC_MAX_GAMMA);
        }
        else if (!strcmp(a, "--draft-min")) {
            spec_flag = spec_flag ? spec_flag : a;
            draft_min = cli_int(C, a, cli_value(C, argc, argv, &i), 0, DS_SPEC_MAX_GAMMA);
        }
        else if (!strcmp(a, "--draft-p-min")) {
            spec_flag = spec_flag ? spec_flag : a;
            p_min = cli_float(C, a, cli_value(C, argc, argv, &i), 0.0f, 1.0f);
            have_pmin = 1;
        }
        else if (!strcmp(a, "--draft-sched")) {
            spec_flag = spec_flag ? spec_flag : a;
            sched_s = cli_value(C, argc, argv, &i);
            if (strcmp(sched_s, "none") && strcmp(sched_s, "pmin") && strcmp(sched_s, "table") && strcmp(sched_s, "auto"))
                cli_die(C, "--draft-sched must be none, pmin, table or auto, got '%s'", sched_s);
        }
        else if (!strcmp(a, "--sps-table")) { spec_flag = spec_flag ? spec_flag : a; sps_path = cli_value(C, argc, argv, &i); }
        else if (!strcmp(a, "--dump-logits")) logits_path = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "--dump-block")) { spec_flag = spec_flag ? spec_flag : a; dump_path = cli_value(C, argc, argv, &i); }
        else if (!strcmp(a, "--draft-wait")) { spec_flag = spec_flag ? spec_flag : a; draft_wait = 1; }
        else if (!strcmp(a, "--oracle-accept")) { spec_flag = spec_flag ? spec_flag : a; oracle_s = cli_value(C, argc, argv, &i); }
        else if (!strcmp(a, "--warmup")) warmup = 1;
        else if (!strcmp(a, "--commit")) {
            spec_flag = spec_flag ? spec_flag : a;
            const char *v = cli_value(C, argc, argv, &i);
            if (!strcmp(v, "direct")) commit = DS_COMMIT_DIRECT;
            else if (!strcmp(v, "replay")) commit = DS_COMMIT_REPLAY;
            else cli_die(C, "--commit must be direct or replay, got '%s'", v);
        }
        else if (!strcmp(a, "--prefill")) {
            const char *v = cli_value(C, argc, argv, &i);
            if (!strcmp(v, "batch")) prefill = DS_PREFILL_BATCH;
            else if (!strcmp(v, "decode")) prefill = DS_PREFILL_DECODE;
            else cli_die(C, "--prefill must be batch or decode, got '%s'", v);
        }
        else if (!strcmp(a, "--echo")) echo = 1;
        else if (!strcmp(a, "--tp") || !strcmp(a, "--tensor-parallel")) tp = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 8);
        else cli_die(C, "unknown flag '%s' (see dspark generate --help)", a);
    }
    ds_kernel_set ks;
    cli_model_flags_finish(C, &mf, &ks);
    const char *model_path = mf.model, *prompt = mf.prompt;
    const long n_threads = mf.n_threads;
    const int verbose = mf.verbose;

    if (prompt && prompt_file) cli_die(C, "give either -p or -f, not both");
    if (!prompt && !prompt_file) cli_die(C, "no prompt given (-p TEXT or -f FILE)");
    if (spec_flag && !draft_path) cli_die(C, "%s needs a drafter (-md DRAFTER.gguf)", spec_flag);
    /* the verify-length scheduler */
    ds_sched_mode sched = have_pmin ? DS_SCHED_PMIN : DS_SCHED_NONE;
    if (sched_s) {
        if (!strcmp(sched_s, "none")) {
            if (have_pmin) cli_die(C, "--draft-p-min conflicts with --draft-sched none");
            sched = DS_SCHED_NONE;
        } else if (!strcmp(sched_s, "pmin")) {
            if (!have_pmin) cli_die(C, "--draft-sched pmin needs --draft-p-min P");
            sched = DS_SCHED_PMIN;
        } else if (!strcmp(sched_s, "auto")) {
            if (have_pmin) cli_die(C, "--draft-p-min conflicts with --draft-sched auto (it measures acceptance instead)");
            sched = DS_SCHED_AUTO;
        } else sched = DS_SCHED_TABLE;
    }
    const int sched_sps = sched == DS_SCHED_TABLE || sched == DS_SCHED_AUTO;
    if (sps_path && !sched_sps) cli_die(C, "--sps-table only applies to --draft-sched table or auto");
    if (draft_min > 0 && sched != DS_SCHED_NONE)
        cli_die(C, "--draft-min %ld: with --draft-p-min or --draft-sched the draft length varies and has no floor; "
                "use --draft-max N instead", draft_min);
    if (draft_min > 0 && draft_max > 0 && draft_min > draft_max)
        cli_die(C, "--draft-min %ld exceeds --draft-max %ld", draft_min, draft_max);
    /* an output must not be one of the inputs (it would truncate them) */
    const char *inputs[] = { model_path, draft_path, prompt_file, sps_path, oracle_s };
    const char *outputs[] = { dump_path, logits_path };
    for (int k = 0; k < 2; k++) {
        char e[DS_ERRLEN];
        if (outputs[k] && ds_out_check_inputs(outputs[k], inputs, oracle_s ? 5 : 4, e, sizeof e)) cli_die(C, "%s", e);
    }
    if (dump_path && logits_path) cli_die(C, "--dump-logits is for plain mode and --dump-block for speculative mode");
    if (warmup && logits_path) cli_die(C, "--warmup times a generation; --dump-logits writes logits and times nothing");

    res_t R = { 0 };
    if (oracle_s && ds_oracle_parse(&R.orc, oracle_s, err0, sizeof err0)) cli_die(C, "%s", err0);
    size_t prompt_len = 0;
    if (prompt_file) prompt = R.file_buf = cli_read_file(C, prompt_file, &prompt_len);
    else prompt_len = strlen(prompt);

    char err[DS_ERRLEN];
    R.m = ds_model_load_on(model_path, mf.device, err, sizeof err);
    if (!R.m) die_free(&R, "%s: %s", model_path, err);
    ds_model *m = R.m;
    if (!m->tok) die_free(&R, "%s has no tokenizer (tokenizer.ggml.model missing)", model_path);
    if (top_k > m->hp.n_vocab) die_free(&R, "--top-k %ld is out of range [0, %d] (the vocabulary)", top_k, m->hp.n_vocab);
    long n_ctx = cli_ctx_for_model(&mf, m->hp.n_ctx_train);

    /* the drafter and its contracts */
    int gamma = 0;
    if (draft_path) {
        R.dr = ds_drafter_load(draft_path, m, err, sizeof err);
        if (!R.dr) die_free(&R, "%s: %s", draft_path, err);
        gamma = ds_drafter_block_size(R.dr);
        if (draft_max > gamma)
            die_free(&R, "--draft-max %ld: n_max inconsistent with the drafter (block size gamma = %d)", draft_max, gamma);
        if (draft_max == 0) draft_max = gamma;
        if (draft_min > draft_max)
            die_free(&R, "--draft-min %ld exceeds the drafts per round (%ld); use --draft-max", draft_min, draft_max);
        if (sched != DS_SCHED_NONE && sched != DS_SCHED_AUTO && !ds_drafter_has_confidence(R.dr))
            die_free(&R, "%s needs a drafter with a confidence head; %s has none",
                     sched == DS_SCHED_TABLE ? "--draft-sched table" : "--draft-p-min", draft_path);
        if (dump_path && draft_max < gamma)
            die_free(&R, "--dump-block writes the full block of %d drafts but --draft-max %ld keeps only a prefix", gamma, draft_max);
    }

    size_t n_toks = 0;
    int add_bos = ds_tokenizer_bos(m->tok) >= 0 && !strcmp(ds_tokenizer_model(m->tok), "llama");
    if (ds_tokenize(m->tok, prompt, prompt_len, add_bos, &R.toks, &n_toks, err, sizeof err))
        die_free(&R, "tokenizer: %s", err);
    if (n_toks == 0) die_free(&R, "the prompt is empty after tokenization");
    if ((long)n_toks >= n_ctx)
        die_free(&R, "the prompt has %zu tokens but the context holds %ld (-c); need room for at least one new token", n_toks, n_ctx);
    R.ctx = ds_ctx_new(m, (int)n_ctx, (int)n_threads, err, sizeof err);
    if (!R.ctx) die_free(&R, "%s", err);
    ds_ctx *ctx = R.ctx;
    ds_ctx_set_kernels(ctx, &(ks));
    /* tensor parallelism (docs/TP.md): N ranks, the same bytes as one */
    if (tp > 1 && ds_ctx_set_tp(ctx, (int)tp, err, sizeof err)) die_free(&R, "%s", err);
    char kbuf[256];
    ds_kernel_set_str(&ks, kbuf, sizeof kbuf);
    if (verbose) {
        fprintf(stderr, "model=%s arch=%s n_layer=%d n_embd=%d n_head=%d n_head_kv=%d n_ff=%d n_vocab=%d weights=%s params=%llu\n",
                model_path, ds_arch_name(m->hp.arch), m->hp.n_layer, m->hp.n_embd, m->hp.n_head, m->hp.n_head_kv,
                m->hp.n_ff, m->hp.n_vocab, ds_type_name(m->weight_type), (unsigned long long)m->n_params);
        if (m->hp.n_expert > 0)
            fprintf(stderr, "moe n_expert=%d n_expert_used=%d n_ff_exp=%d n_ff_shexp=%d router=%s\n", m->hp.n_expert,
                    m->hp.n_expert_used, m->hp.n_ff_exp, m->hp.n_ff_shexp, ds_type_name(m->layers[0].gate_inp.type));
        fprintf(stderr, "kernels=\"%s\" simd=%s threads=%ld n_ctx=%ld n_prompt=%zu\n", kbuf, ds_simd_path(), n_threads, n_ctx, n_toks);
        fprintf(stderr, "device=%s\n", m->be->i->name);
        if (tp > 1) {
            char tpb[128];
            ds_ctx_tp_describe(ctx, tpb, sizeof tpb);
            fprintf(stderr, "tp=%ld %s\n", tp, tpb);
        }
        if (R.dr) fprintf(stderr, "drafter=%s %s\n", draft_path, ds_drafter_describe(R.dr));
    }
    for (char *s = kbuf; *s; s++) if (*s == ' ') *s = '+';   /* one token in the stats line */

    ds_sampler samp = { temp, (int)top_k, top_p, (uint64_t)seed, min_p };
    int n_sps = 0;
    if (R.dr && sched_sps) {
        n_sps = (int)draft_max + 1;
        R.sps = malloc((size_t)n_sps * sizeof(double));
        if (!R.sps) die_free(&R, "out of memory");
        if (sps_path) {
            if (ds_spec_load_sps(sps_path, n_sps, R.sps, err, sizeof err)) die_free(&R, "%s", err);
        } else {
            if (n_sps >= ds_ctx_n_ctx(ctx)) die_free(&R, "the context (%ld) is too small to measure verify widths 1..%d", n_ctx, n_sps);
            if (ds_set_taps(ctx, ds_drafter_tap_layers(R.dr), ds_drafter_n_taps(R.dr), err, sizeof err) ||
                ds_spec_measure_sps(ctx, n_sps, 5, R.sps, err, sizeof err))
                die_free(&R, "SPS measurement: %s", err);
        }
        if (verbose) {
            fprintf(stderr, "sps_table%s:", sps_path ? "" : "(measured)");
            for (int w = 1; w <= n_sps; w++) fprintf(stderr, " %d:%.6f", w, R.sps[w - 1]);
            fputc('\n', stderr);
        }
    }
    if (dump_path) {
        char e[DS_ERRLEN];
        R.dump = ds_out_open(dump_path, e, sizeof e);
        if (!R.dump) die_free(&R, "%s", e);
    }

    printer pr = { m->tok, stdout, 0 };
    if (echo && fwrite(prompt, 1, prompt_len, stdout) != prompt_len) pr.failed = errno ? errno : EIO;
    R.out = malloc((size_t)n_predict * sizeof(int32_t));
    if (!R.out) die_free(&R, "out of memory");
    int rc;
    if (logits_path) {
        if (R.dr) die_free(&R, "--dump-logits is for plain mode (drop -md)");
        /* the same rules as every output (outfile.c): temp + rename */
        R.dump = ds_out_open(logits_path, err, sizeof err);
        if (!R.dump) die_free(&R, "%s", err);
        rc = dump_logits(ctx, m->hp.n_vocab, R.toks, (int)n_toks, (int)n_predict, ds_out_fp(R.dump), err, sizeof err);
        if (rc) die_free(&R, "--dump-logits: %s", err);
        ds_outfile *d = R.dump;
        R.dump = NULL;
        if (ds_out_commit(d, err, sizeof err)) die_free(&R, "--dump-logits: %s", err);
        res_free(&R);
        return 0;
    }
    if (!R.dr) {
        ds_gen_opts o = { (int)n_predict, prefill, 1, print_token, &pr };
        ds_gen_stats st;
        rc = 0;
        if (warmup) {                 /* the same generation, nothing printed */
            ds_gen_opts ow = o;
            ow.on_token = NULL;
            ow.user = NULL;
            rc = ds_generate(ctx, R.toks, (int)n_toks, &ow, &samp, R.out, &st, err, sizeof err);
        }
        if (rc == 0) rc = ds_generate(ctx, R.toks, (int)n_toks, &o, &samp, R.out, &st, err, sizeof err);
        if (rc == 0 && !pr.failed) {
            end_text(&pr);
            fprintf(stderr, "mode=plain n_prompt=%d n_gen=%d stop=%s prefill_s=%.4f decode_s=%.4f prefill_tok_s=%.1f decode_tok_s=%.1f\n",
                    st.n_prompt, st.n_gen, st.stop, st.t_prefill, st.t_decode,
                    st.t_prefill > 0 ? st.n_prompt / st.t_prefill : 0.0,
                    st.t_decode > 0 && st.n_gen > 1 ? (st.n_gen - 1) / st.t_decode : 0.0);
        }
    } else {
        ds_spec_opts o;
        ds_spec_opts_default(&o);
        o.n_predict = (int)n_predict;
        o.prefill = prefill;
        o.stop_at_eog = 1;
        o.samp = samp;
        o.draft_max = (int)draft_max;
        o.sched = sched;
        o.p_min = p_min;
        o.sps_sec = R.sps;
        o.n_sps = n_sps;
        o.commit = commit;
        o.draft_wait = draft_wait;
        o.on_token = print_token;
        o.user = &pr;
        ds_spec_stats st;
        rc = 0;
        ds_gen_stats pst;             /* --oracle-accept: the plain reference run */
        memset(&pst, 0, sizeof pst);
        if (oracle_s) {
            R.ref = malloc((size_t)n_predict * sizeof(int32_t));
            if (!R.ref) die_free(&R, "out of memory");
            ds_gen_opts po = { (int)n_predict, prefill, 1, NULL, NULL };
            if (warmup) rc = ds_generate(ctx, R.toks, (int)n_toks, &po, &samp, R.ref, &pst, err, sizeof err);
            if (rc == 0) rc = ds_generate(ctx, R.toks, (int)n_toks, &po, &samp, R.ref, &pst, err, sizeof err);
            if (rc) die_free(&R, "--oracle-accept: the plain reference run: %s", err);
            R.orc.ref = R.ref;
            R.orc.n_ref = pst.n_gen;
            R.orc.n_prompt = (int)n_toks;
            R.orc.n_vocab = m->hp.n_vocab;
            R.orc.after_end = !strcmp(pst.stop, "eog") && ds_tokenizer_eos(m->tok) >= 0 ? ds_tokenizer_eos(m->tok) : 0;
            o.draft_override = ds_oracle_draft;
            o.override_user = &R.orc;
        }
        if (warmup) {                 /* the same generation, nothing printed; the
                                       * drafter context (its graphs) is kept */
            ds_spec_opts ow = o;
            ow.on_token = NULL;
            ow.user = NULL;
            ow.keep = o.keep = &R.keep;
            rc = ds_spec_generate(ctx, R.dr, R.toks, (int)n_toks, &ow, R.out, &st, err, sizeof err);
        }
        if (R.dump) { o.on_round = dump_round; o.round_user = ds_out_fp(R.dump); }
        R.orc.round = R.orc.planned = 0;          /* the timed run replays the pattern from its start */
        if (rc == 0) rc = ds_spec_generate(ctx, R.dr, R.toks, (int)n_toks, &o, R.out, &st, err, sizeof err);
        if (rc == 0 && R.dump) {      /* the dump is complete: make it visible (or fail) before the stats */
            char e[DS_ERRLEN];
            ds_outfile *d = R.dump;
            R.dump = NULL;
            if (ds_out_commit(d, e, sizeof e)) { fputc('\n', stdout); die_free(&R, "--dump-block: %s", e); }
        }
        if (rc == 0 && !pr.failed) {
            end_text(&pr);
            if (oracle_s) {
                const double ptok = pst.t_decode > 0 && pst.n_gen > 1 ? (pst.n_gen - 1) / pst.t_decode : 0.0;
                const int same = pst.n_gen == st.n_gen && !memcmp(R.ref, R.out, (size_t)st.n_gen * sizeof(int32_t));
                fprintf(stderr, "oracle-acceptance benchmark: the drafter network ran every round for its cost; its "
                        "proposals were replaced by the plain run's continuation, right for the slots %s gives "
                        "(acceptance is the pattern's, not this drafter's)\n", R.orc.label);
                fprintf(stderr, "mode=plain oracle_reference=1 n_prompt=%d n_gen=%d stop=%s prefill_s=%.4f decode_s=%.4f decode_tok_s=%.1f\n",
                        pst.n_prompt, pst.n_gen, pst.stop, pst.t_prefill, pst.t_decode, ptok);
                fprintf(stderr, "mode=spec-oracle oracle=%s pattern_mean_accepted=%.4f planned_accepted=%ld text_equal_plain=%d "
                        "plain_tok_s=%.1f speedup_vs_plain=%.3f ", R.orc.label, ds_oracle_mean(&R.orc, st.draft_max),
                        R.orc.planned, same, ptok, ptok > 0 ? st.tok_s / ptok : 0.0);
            } else {
                fprintf(stderr, "mode=spec ");
            }
            fprintf(stderr, "commit=%s kernels=%s sched=%s gamma=%d draft_max=%d temp=%g n_prompt=%d n_gen=%d stop=%s "
                    "rounds=%d drafted=%ld accepted=%ld mean_accepted_len=%.4f accept_hist=",
                    ds_commit_name(commit), kbuf, ds_sched_name(sched), st.gamma, st.draft_max, temp, st.n_prompt, st.n_gen,
                    st.stop, st.rounds, st.drafted, st.accepted, st.mean_accepted_len);
            for (int k = 0; k < st.draft_max; k++) fprintf(stderr, "%s%ld", k ? "," : "", st.accept_hist[k]);
            fprintf(stderr, " prefill_s=%.4f draft_s=%.4f verify_s=%.4f accept_s=%.4f commit_s=%.4f total_s=%.4f replay_fixups=%ld plain_rounds=%ld queued_rounds=%ld ahead_rounds=%ld tok_s=%.1f\n",
                    st.t_prefill, st.t_draft, st.t_verify, st.t_accept, st.t_commit, st.t_total, st.replay_fixups,
                    st.plain_rounds, st.queued_rounds, st.ahead_rounds, st.tok_s);
            /* AUTO fell back to plain steps where its cost model (this
             * machine's verify, draft and commit timings, this text's
             * acceptance) predicted that drafting loses: one line saying so */
            if (sched == DS_SCHED_AUTO && st.plain_rounds > 0)
                fprintf(stderr, "draft_sched=auto fallback=plain reason=predicted_loss predicted_spec_tok_s=%.1f "
                        "predicted_plain_tok_s=%.1f first_plain_round=%d plain_rounds=%ld rounds=%d\n",
                        st.auto_pred_spec_tok_s, st.auto_pred_plain_tok_s, st.auto_first_plain, st.plain_rounds,
                        st.rounds);
        }
    }
    if (rc) {
        fputc('\n', stdout);   /* the error line starts on a line of its own */
        die_free(&R, "%s", err);
    }
    if (pr.failed) {
        clearerr(stdout);
        die_free(&R, "writing the generated text to standard output failed: %s", strerror(pr.failed));
    }
    res_free(&R);
    return 0;
}
