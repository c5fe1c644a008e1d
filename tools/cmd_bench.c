/* cmd_bench.c — `dspark bench`: the engine-core measurements, side by side
 * in one run, reported as medians of --reps repetitions:
 *   decode      ms per token (and tok/s) of sequential decode;
 *   verify M    forward_batch of M rows (M = 1,2,4,8,16) on top of a prefix,
 *               canonical and fast interleaved rep by rep, and their ratio;
 *   prefill     tok/s of a batched prefill of --prefill-len tokens (a comma
 *               list: each length, and its tok/s as a ratio to the first);
 *   depth       (--decode-at P,...) ms per decode step after a prefix of P
 *               positions, each as a ratio to the first depth's (one prefill
 *               per P; each rep's steps start from it again).
 * A table goes to stdout; --json FILE writes the same numbers as JSON. */
#include "cli.h"
#include "model.h"
#include "outfile.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* cmd_bench_profile.c: --profile */
void cmd_bench_profile(ds_ctx *c, const char *drafter_path, const int32_t *toks, int prefix, long reps, float *logits,
                       int round_only);


#define N_WIDTHS 5
static const int k_widths[N_WIDTHS] = { 1, 2, 4, 8, 16 };
#define MAX_LIST 8

/* "A,B,C" -> up to MAX_LIST integers in [lo, hi], each checked (one line, exit 2) */
static int parse_list(const char *C, const char *flag, const char *s, long lo, long hi, long *out) {
    int n = 0;
    const char *p = s;
    for (;;) {
        char item[32];
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len >= sizeof item) cli_die(C, "%s expects a comma-separated list of integers, got '%s'", flag, s);
        if (n == MAX_LIST) cli_die(C, "%s takes at most %d values", flag, MAX_LIST);
        memcpy(item, p, len);
        item[len] = 0;
        out[n++] = cli_int(C, flag, item, lo, hi);
        if (!e) break;
        p = e + 1;
    }
    return n;
}

/* Memory at the end of a run: the process's peak resident set (Linux
 * /proc; -1 elsewhere) and, on a device with its own memory, the device
 * memory in use — total minus free from the backend's describe line, so on
 * a GPU this process has to itself: its weights, KV cache, scratch and the
 * driver's context (-1 on the CPU). */
static void bench_memory(const ds_model *m, double *rss_mib, double *dev_mib) {
    *rss_mib = *dev_mib = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) *rss_mib = (double)kb / 1024.0;
        fclose(f);
    }
    if (m->be->i->host_memory || !m->be->i->describe) return;
    char d[512] = "";
    m->be->i->describe(m->be, d, sizeof d);
    const char *t = strstr(d, "mem_total_mib="), *fr = strstr(d, "mem_free_mib=");
    long long total, free_b;
    if (t && fr && sscanf(t, "mem_total_mib=%lld", &total) == 1 && sscanf(fr, "mem_free_mib=%lld", &free_b) == 1)
        *dev_mib = (double)(total - free_b);
}

int cmd_bench(int argc, char **argv) {
    const char *C = "bench";
    const char *json = NULL, *drafter_path = NULL;
    int profile = 0;
    long tp = 1;
    double tp_step_g = 0, tp_step_b = 0;   /* --tp: all-gathers and bytes a rank receives per decode step */
    long reps = 5, prefix = 64, n_decode = 32, prefill_lens[MAX_LIST] = { 128 }, depths[MAX_LIST];
    int n_prefill = 1, n_depth = 0;
    cli_model_flags mf;
    cli_model_flags_init(&mf);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: dspark bench -m MODEL.gguf [-t N] [--reps N] [--prefix N] [--decode N] [--prefill-len N[,N..]]\n"
                   "       [--decode-at P[,P..]] [--json FILE|-] [--tp N]\n"
                   "  --prefill-len   batched prefill lengths (the first is the headline figure)\n"
                   "  --decode-at     decode steps after prefixes of P positions (decode at depth),\n"
                   "                  each as a ratio to the first\n"
                   "  --tp N          the context's forwards on N tensor-parallel ranks (docs/TP.md;\n"
                   "                  in one process, every rank on the --device); fast includes tp_reduce\n"
                   "  -c is not used: the context is sized from --prefix/--decode/--prefill-len;\n"
                   "  --kernels does not apply: canonical and fast are both measured.\n"
                   "       dspark bench -m MODEL.gguf --profile [-md DRAFTER.gguf] [-t N] [--reps N] [--prefix N]\n"
                   "  --profile   per-op profile of a decode step, an 8-row verify and (with -md) a drafting\n"
                   "              round, and each matmul alone at M = 1..16 (ceilings: build/bench/roofline)\n"
                   "  --profile-round  (with -md) only the speculative round: draft, verify, commit vs a decode step\n");
            cli_model_flags_help(stdout, 0);
            return 0;
        }
        else if (cli_model_flag(C, argc, argv, &i, &mf)) {}
        else if (!strcmp(a, "--reps")) reps = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1000);
        else if (!strcmp(a, "--prefix")) prefix = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 16);
        else if (!strcmp(a, "--decode")) n_decode = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 1 << 16);
        else if (!strcmp(a, "--prefill-len")) n_prefill = parse_list(C, a, cli_value(C, argc, argv, &i), 1, 1 << 16, prefill_lens);
        else if (!strcmp(a, "--decode-at")) n_depth = parse_list(C, a, cli_value(C, argc, argv, &i), 1, 1 << 20, depths);
        else if (!strcmp(a, "--json")) json = cli_value(C, argc, argv, &i);
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--tp")) tp = cli_int(C, a, cli_value(C, argc, argv, &i), 1, 8);
        else if (!strcmp(a, "--profile-round")) profile = 2;
        else if (!strcmp(a, "-md")) drafter_path = cli_value(C, argc, argv, &i);
        else cli_die(C, "unknown flag '%s' (see dspark bench --help)", a);
    }
    cli_model_flags_finish(C, &mf, NULL);
    if (mf.prompt) cli_die(C, "-p is not used by bench (it times fixed pseudo-text)");
    const char *model_path = mf.model;
    const long n_threads = mf.n_threads;
    /* refuse a --json that is the model before spending minutes measuring */
    if (json) {
        char e[DS_ERRLEN];
        if (ds_out_check_inputs(json, &model_path, 1, e, sizeof e)) cli_die(C, "%s", e);
    }
    if (drafter_path && !profile) cli_die(C, "-md is only used with --profile");
    if (profile && (n_depth || n_prefill > 1)) cli_die(C, "--decode-at and a --prefill-len list do not apply to --profile");
    long prefill_len = prefill_lens[0];
    if (profile == 2 && !drafter_path) cli_die(C, "--profile-round needs -md DRAFTER.gguf");
    if (profile && tp > 1) cli_die(C, "--tp does not apply to --profile (it times the one-device ops)");
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load_on(model_path, mf.device, err, sizeof err);
    if (!m) cli_die(C, "%s: %s", model_path, err);
    long need = prefix + n_decode + 16;
    for (int k = 0; k < n_prefill; k++) if (prefill_lens[k] > need) need = prefill_lens[k];
    for (int k = 0; k < n_depth; k++) if (depths[k] + n_decode + 16 > need) need = depths[k] + n_decode + 16;
    if (m->hp.n_ctx_train > 0 && need > m->hp.n_ctx_train) { ds_model_free(m); cli_die(C, "--prefix/--decode/--prefill-len/--decode-at need %ld positions, the model has %d", need, m->hp.n_ctx_train); }
    ds_ctx *c = ds_ctx_new(m, (int)need, (int)n_threads, err, sizeof err);
    if (!c) { ds_model_free(m); cli_die(C, "%s", err); }
    if (tp > 1 && ds_ctx_set_tp(c, (int)tp, err, sizeof err)) { ds_ctx_free(c); ds_model_free(m); cli_die(C, "%s", err); }
    char tp_desc[128];
    ds_ctx_tp_describe(c, tp_desc, sizeof tp_desc);
    const int V = m->hp.n_vocab;
    int32_t *toks = malloc((size_t)need * sizeof(int32_t));
    float *logits = malloc((size_t)16 * V * sizeof(float));
    double *t_dec = malloc((size_t)reps * sizeof(double)), *t_pre = malloc((size_t)reps * MAX_LIST * sizeof(double));
    double *t_dep = malloc((size_t)reps * MAX_LIST * sizeof(double));
    double *t_ver[2][N_WIDTHS];
    for (int v = 0; v < 2; v++) for (int w = 0; w < N_WIDTHS; w++) t_ver[v][w] = malloc((size_t)reps * sizeof(double));
    if (!toks || !logits || !t_dec || !t_pre || !t_dep) cli_die(C, "out of memory");
    for (long i = 0; i < need; i++) toks[i] = (int32_t)((i * 7919 + 13) % V);   /* fixed pseudo-text */
    if (profile) {
        printf("model=%s weights=%s params=%llu threads=%ld simd=%s\n", model_path, ds_type_name(m->weight_type),
               (unsigned long long)m->n_params, n_threads, ds_simd_path());
        cmd_bench_profile(c, drafter_path, toks, (int)prefix, reps, logits, profile == 2);
        for (int v = 0; v < 2; v++) for (int w = 0; w < N_WIDTHS; w++) free(t_ver[v][w]);
        free(t_dec); free(t_pre); free(t_dep); free(toks); free(logits);
        ds_ctx_free(c);
        ds_model_free(m);
        return 0;
    }

    ds_kernel_set canon, fast;
    ds_kernel_set_all(&canon, DS_CANONICAL);
    ds_kernel_set_all(&fast, DS_FAST);
#define CHECK(x) do { if (x) cli_die(C, "%s", err); } while (0)
    /* warm-up: touch every weight once */
    ds_ctx_set_kernels(c, &(canon));
    CHECK(ds_forward_batch(c, toks, (int)prefix, 0, DS_LOGITS_LAST, logits, NULL, err, sizeof err));
    for (long r = 0; r < reps; r++) {
        /* decode: n_decode steps after the prefix */
        ds_ctx_set_kernels(c, &(canon));
        CHECK(ds_kv_truncate(c, (int)prefix));
        double t0 = cli_now();
        long g0, r0c;
        double b0;
        ds_ctx_tp_stats(c, &g0, &r0c, &b0);
        for (long i = 0; i < n_decode; i++) CHECK(ds_decode(c, toks[prefix + i], (int)(prefix + i), logits, NULL, err, sizeof err));
        t_dec[r] = (cli_now() - t0) / (double)n_decode;
        if (r == 0 && tp > 1) {   /* what one decode step moves between the ranks */
            long g1, r1c;
            double b1;
            ds_ctx_tp_stats(c, &g1, &r1c, &b1);
            tp_step_g = (double)(g1 - g0) / (double)n_decode;
            tp_step_b = (b1 - b0) / (double)n_decode;
        }
        /* verify widths, canonical and fast interleaved */
        for (int w = 0; w < N_WIDTHS; w++)
            for (int v = 0; v < 2; v++) {
                ds_ctx_set_kernels(c, v ? &fast : &canon);
                CHECK(ds_kv_truncate(c, (int)prefix));
                t0 = cli_now();
                CHECK(ds_forward_batch(c, toks + prefix, k_widths[w], (int)prefix, DS_LOGITS_ALL, logits, NULL, err, sizeof err));
                t_ver[v][w][r] = cli_now() - t0;
            }
        /* prefill, each length */
        ds_ctx_set_kernels(c, &(canon));
        for (int k = 0; k < n_prefill; k++) {
            ds_kv_truncate(c, 0);
            t0 = cli_now();
            CHECK(ds_forward_batch(c, toks, (int)prefill_lens[k], 0, DS_LOGITS_LAST, logits, NULL, err, sizeof err));
            t_pre[k * reps + r] = cli_now() - t0;
        }
        ds_kv_truncate(c, 0);
        CHECK(ds_forward_batch(c, toks, (int)prefix, 0, DS_LOGITS_LAST, logits, NULL, err, sizeof err));
    }
    /* decode at depth: one prefill of depths[k] positions (untimed), then per
     * rep n_decode steps after it, the cache cut back to the prefix between
     * reps (a 32k-position prefill per rep would cost more than the steps) */
    for (int k = 0; k < n_depth; k++) {
        ds_kv_truncate(c, 0);
        CHECK(ds_forward_batch(c, toks, (int)depths[k], 0, DS_LOGITS_LAST, logits, NULL, err, sizeof err));
        for (long r = 0; r < reps; r++) {
            CHECK(ds_kv_truncate(c, (int)depths[k]));
            const double t0 = cli_now();
            for (long i = 0; i < n_decode; i++)
                CHECK(ds_decode(c, toks[depths[k] + i], (int)(depths[k] + i), logits, NULL, err, sizeof err));
            t_dep[k * reps + r] = (cli_now() - t0) / (double)n_decode;
        }
    }
#undef CHECK
    double dec = cli_median(t_dec, (int)reps), pres[MAX_LIST], deps[MAX_LIST], ver[2][N_WIDTHS];
    for (int k = 0; k < n_prefill; k++) pres[k] = cli_median(t_pre + k * reps, (int)reps);
    for (int k = 0; k < n_depth; k++) deps[k] = cli_median(t_dep + k * reps, (int)reps);
    const double pre = pres[0];
    for (int v = 0; v < 2; v++) for (int w = 0; w < N_WIDTHS; w++) ver[v][w] = cli_median(t_ver[v][w], (int)reps);

    printf("model=%s arch=%s weights=%s params=%llu threads=%ld simd=%s reps=%ld prefix=%ld\n", model_path,
           ds_arch_name(m->hp.arch), ds_type_name(m->weight_type), (unsigned long long)m->n_params, n_threads,
           ds_simd_path(), reps, prefix);
    if (tp > 1)
        printf("tp=%ld %s (one process; the ranks run one after another) decode_step: %.0f all-gathers, %.0f bytes received a rank\n",
               tp, tp_desc, tp_step_g, tp_step_b);
    printf("decode: %.3f ms/token  %.1f tok/s\n", dec * 1e3, 1.0 / dec);
    printf("prefill(%ld): %.1f tok/s (canonical)\n", prefill_len, (double)prefill_len / pre);
    for (int k = 1; k < n_prefill; k++)
        printf("prefill(%ld): %.1f tok/s (canonical), %.3fx prefill(%ld)'s rate\n", prefill_lens[k],
               (double)prefill_lens[k] / pres[k], ((double)prefill_lens[k] / pres[k]) / ((double)prefill_len / pre), prefill_len);
    for (int k = 0; k < n_depth; k++)
        printf("decode_at(%ld): %.3f ms/token  %.1f tok/s  %.3fx the step at %ld\n", depths[k], deps[k] * 1e3, 1.0 / deps[k],
               deps[k] / deps[0], depths[0]);
    printf("%-4s %14s %14s %16s %18s\n", "M", "canonical_ms", "fast_ms", "canonical/fast", "canonical/decode");
    for (int w = 0; w < N_WIDTHS; w++)
        printf("%-4d %14.3f %14.3f %16.3f %18.3f\n", k_widths[w], ver[0][w] * 1e3, ver[1][w] * 1e3, ver[0][w] / ver[1][w], ver[0][w] / dec);
    double rss_mib, dev_mib;
    bench_memory(m, &rss_mib, &dev_mib);
    printf("memory: peak_rss_mib=%.0f", rss_mib);
    if (dev_mib >= 0) printf(" device_used_mib=%.0f", dev_mib);
    printf("\n");
    if (json) {
        cJSON *root = cJSON_CreateObject(), *verj = cJSON_AddArrayToObject(root, "verify");
        cJSON_AddStringToObject(root, "model", model_path);
        cJSON_AddStringToObject(root, "weights", ds_type_name(m->weight_type));
        cJSON_AddNumberToObject(root, "params", (double)m->n_params);
        cJSON_AddNumberToObject(root, "threads", (double)n_threads);
        cJSON_AddStringToObject(root, "simd", ds_simd_path());
        cJSON_AddStringToObject(root, "device", mf.device);
        cJSON_AddNumberToObject(root, "reps", (double)reps);
        cJSON_AddNumberToObject(root, "prefix", (double)prefix);
        if (tp > 1) cJSON_AddNumberToObject(root, "tp", (double)tp);
        cJSON_AddNumberToObject(root, "decode_ms", dec * 1e3);
        cJSON_AddNumberToObject(root, "decode_tok_s", 1.0 / dec);
        cJSON_AddNumberToObject(root, "prefill_len", (double)prefill_len);
        cJSON_AddNumberToObject(root, "prefill_tok_s", (double)prefill_len / pre);
        cJSON *pj = cJSON_AddArrayToObject(root, "prefill"), *dj = cJSON_AddArrayToObject(root, "decode_at");
        for (int k = 0; k < n_prefill; k++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "len", (double)prefill_lens[k]);
            cJSON_AddNumberToObject(o, "tok_s", (double)prefill_lens[k] / pres[k]);
            cJSON_AddItemToArray(pj, o);
        }
        for (int k = 0; k < n_depth; k++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "pos", (double)depths[k]);
            cJSON_AddNumberToObject(o, "ms", deps[k] * 1e3);
            cJSON_AddNumberToObject(o, "over_first", deps[k] / deps[0]);
            cJSON_AddItemToArray(dj, o);
        }
        cJSON_AddNumberToObject(root, "peak_rss_mib", rss_mib);
        if (dev_mib >= 0) cJSON_AddNumberToObject(root, "device_used_mib", dev_mib);
        for (int w = 0; w < N_WIDTHS; w++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "M", k_widths[w]);
            cJSON_AddNumberToObject(o, "canonical_ms", ver[0][w] * 1e3);
            cJSON_AddNumberToObject(o, "fast_ms", ver[1][w] * 1e3);
            cJSON_AddNumberToObject(o, "canonical_over_fast", ver[0][w] / ver[1][w]);
            cJSON_AddNumberToObject(o, "canonical_over_decode", ver[0][w] / dec);
            cJSON_AddItemToArray(verj, o);
        }
        char *text = cJSON_Print(root);
        cJSON_Delete(root);
        if (!text) cli_die(C, "out of memory writing JSON");
        ds_outfile *o = cli_out_open(C, json, &model_path, 1);
        fputs(text, ds_out_fp(o));
        fputc('\n', ds_out_fp(o));
        cJSON_free(text);
        cli_out_commit(C, o);
    }
    for (int v = 0; v < 2; v++) for (int w = 0; w < N_WIDTHS; w++) free(t_ver[v][w]);
    free(t_dec); free(t_pre); free(t_dep); free(toks); free(logits);
    ds_ctx_free(c);
    ds_model_free(m);
    return 0;
}
