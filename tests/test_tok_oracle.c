/* test_tok_oracle.c — dspark's tokenizer gives llama-tokenize's ids, for
 * every tokenizer.ggml.pre name, read from GGUF by the real loader.
 *
 * tests/data/vocab/oracle/ holds a small byte-level BPE vocabulary (base.txt,
 * learnt from the test texts without pre-tokenization so that its merges
 * cross word, digit and script boundaries), the texts (llama.cpp's own test
 * texts, ../ggml-vocab-gpt-2.gguf.inp, and extra.inp) and expected.txt: the
 * ids llama.cpp's llama-tokenize printed for each case, made once by
 * make_oracle.py. A case is a vocabulary variant written as GGUF, a
 * tokenizer.ggml.pre name, and a mode: "special" (llama-tokenize's default:
 * control tokens written in the text are parsed) or "plain"
 * (--no-parse-special). BOS is whatever the file and llama.cpp's per-name
 * defaults say (dspark: ds_tokenizer_add_bos_default).
 *
 * Variants (build_gguf): base; neox — no token for the bytes 0xc0, 0xc1,
 * 0xf5..0xff, as gpt-neox's vocabulary (those bytes never occur in UTF-8);
 * v2 — the same file with GGUF version 2 in its header; addbos —
 * tokenizer.ggml.add_bos_token = true; nobos — no bos/eos keys at all
 * (llama.cpp's defaults: 11); nomerges — no tokenizer.ggml.merges (kimi-k2
 * loads so); raw — base_raw.txt, BPE over raw UTF-8 (U+2581 for spaces,
 * <0xNN> byte fallback) under the names llama.cpp runs that way (sarvam-moe,
 * gemma4, granite-embed-multi-311m); gemma4 — the same vocabulary with
 * tokenizer.ggml.model = "gemma4".
 *
 * Then corrupt files (test_corrupt): each loads to one error line, no crash.
 *
 *   test_tok_oracle                       run every case in expected.txt
 *   test_tok_oracle --names               the pre names dspark accepts
 *   test_tok_oracle --gguf VARIANT PRE OUT   write a case's GGUF (PRE "-": no key)
 */
#include "tokenizer_internal.h"
#include "gguf.h"
#include "testutil.h"
#include "vocab_util.h"

#define DIR "tests/data/vocab/oracle"
#define SEP "\n__ggml_vocab_test__\n"

/* ======================================================================
 * files
 * ====================================================================== */

/* base.txt: the vocabulary (texts in the byte-level alphabet) */
typedef struct {
    char *buf;                     /* owns every string below                  */
    int32_t n_vocab, bos, eos;
    char **tok;                    /* n_vocab                                  */
    int32_t *type;
    char **merge;                  /* "left right", malloc'd each              */
    size_t n_merges;
} base_vocab;

static void base_free(base_vocab *b) {
    for (size_t i = 0; i < b->n_merges; i++) free(b->merge[i]);
    free(b->merge);
    free(b->tok);
    free(b->type);
    free(b->buf);
    memset(b, 0, sizeof *b);
}

static int base_load(base_vocab *b, const char *path, char *err, size_t errlen) {
    memset(b, 0, sizeof *b);
    b->bos = b->eos = -1;
    size_t n, cap = 0;
    if (!(b->buf = slurp(path, &n))) { snprintf(err, errlen, "cannot read %s", path); return -1; }
    for (char *line = strtok(b->buf, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        if (!strncmp(line, "n_vocab ", 8) && !b->tok) {
            b->n_vocab = atoi(line + 8);
            if (b->n_vocab <= 0) break;
            b->tok = calloc((size_t)b->n_vocab, sizeof *b->tok);
            b->type = calloc((size_t)b->n_vocab, sizeof *b->type);
            if (!b->tok || !b->type) break;
        } else if (!strncmp(line, "tok ", 4) && b->tok) {
            char *q = line + 4;
            long id = strtol(q, &q, 10), ty = strtol(q, &q, 10);
            while (*q == ' ') q++;
            if (id < 0 || id >= b->n_vocab || unhex(q) <= 0) break;
            b->tok[id] = q;
            b->type[id] = (int32_t)ty;
        } else if (!strncmp(line, "bos ", 4)) {
            b->bos = atoi(line + 4);
        } else if (!strncmp(line, "eos ", 4)) {
            b->eos = atoi(line + 4);
        } else if (!strncmp(line, "merge ", 6)) {
            char *l = line + 6, *r = strchr(l, ' ');
            if (!r) break;
            *r++ = 0;
            if (unhex(l) <= 0 || unhex(r) <= 0) break;
            if (b->n_merges == cap) {
                cap = cap ? cap * 2 : 1024;
                char **nm = realloc(b->merge, cap * sizeof *nm);
                if (!nm) break;
                b->merge = nm;
            }
            size_t ll = strlen(l), rl = strlen(r);
            char *m = malloc(ll + rl + 2);
            if (!m) break;
            memcpy(m, l, ll);
            m[ll] = ' ';
            memcpy(m + ll + 1, r, rl + 1);
            b->merge[b->n_merges++] = m;
        } else {
            snprintf(err, errlen, "bad line in %s: '%.40s'", path, line);
            return -1;
        }
    }
    for (int32_t i = 0; b->tok && i < b->n_vocab; i++)
        if (!b->tok[i]) { snprintf(err, errlen, "%s: token %d missing", path, i); return -1; }
    if (!b->tok) { snprintf(err, errlen, "%s: no n_vocab", path); return -1; }
    return 0;
}

/* ======================================================================
 * a case's GGUF
 * ====================================================================== */

/* The byte-level text of byte c (a one-character token). */
static void byte_text(int c, char out[8]) {
    uint32_t map[256];
    ds_gpt2_byte_alphabet(map);
    out[ds_utf8_encode(map[c], out)] = 0;
}

/* Write the GGUF of (variant, pre) into *buf / *size (malloc'd). The file is
 * a vocab-only llama model: llama.cpp reads the architecture's hparams even
 * when it loads only the vocabulary. */
static int build_gguf(const base_vocab bv[2], const char *variant, const char *pre, const char *bad, char **buf,
                      size_t *size, char *err, size_t errlen) {
    int neox = !strcmp(variant, "neox"), v2 = !strcmp(variant, "v2");
    int addbos = !strcmp(variant, "addbos"), nobos = !strcmp(variant, "nobos");
    int nomerges = !strcmp(variant, "nomerges"), gemma4 = !strcmp(variant, "gemma4");
    int raw = gemma4 || !strcmp(variant, "raw");
    const base_vocab *b = &bv[raw];
    if (!bad) bad = "";
    if (!neox && !v2 && !addbos && !nobos && !nomerges && !raw && strcmp(variant, "base")) {
        snprintf(err, errlen, "unknown variant '%s'", variant);
        return -1;
    }
    const char **toks = malloc((size_t)b->n_vocab * sizeof *toks);
    int32_t *types = malloc((size_t)b->n_vocab * sizeof *types);
    int32_t n = 0, bos = -1, eos = -1;
    char dropped[13][8];
    for (int i = 0; i < 13; i++) byte_text(i < 2 ? 0xc0 + i : 0xf5 + (i - 2), dropped[i]);
    for (int32_t i = 0; toks && types && i < b->n_vocab; i++) {
        int drop = 0;
        for (int k = 0; neox && k < 13; k++) drop |= !strcmp(b->tok[i], dropped[k]);
        if (drop) continue;
        if (i == b->bos) bos = n;
        if (i == b->eos) eos = n;
        toks[n] = b->tok[i];
        types[n++] = b->type[i];
    }
    gguf_writer *w = gguf_writer_new();
    FILE *mf = NULL;
    int rc = -1;
    const char **merges = malloc((b->n_merges + 1) * sizeof *merges);
    if (!toks || !types || !w || !merges) { snprintf(err, errlen, "out of memory"); goto done; }
    /* the corrupt files of test_corrupt: one thing wrong each */
    memcpy(merges, b->merge, b->n_merges * sizeof *merges);
    if (!strcmp(bad, "merge-form")) merges[0] = "abc";
    if (!strcmp(bad, "bos-range")) bos = n + 5;
    uint64_t n_tok = !strcmp(bad, "empty-tokens") ? 0 : (uint64_t)n;
    uint64_t n_types = !strcmp(bad, "types-short") ? (uint64_t)n - 1 : (uint64_t)n;
    int tokens_ints = !strcmp(bad, "tokens-ints"), no_merges = nomerges || !strcmp(bad, "no-merges");
    int werr = gguf_set_str(w, "general.architecture", "llama") ||
              gguf_set_str(w, "general.name", "dspark tokenizer oracle") ||
              gguf_set_u32(w, "llama.context_length", 256) || gguf_set_u32(w, "llama.embedding_length", 64) ||
              gguf_set_u32(w, "llama.block_count", 1) || gguf_set_u32(w, "llama.feed_forward_length", 128) ||
              gguf_set_u32(w, "llama.attention.head_count", 2) ||
              gguf_set_u32(w, "llama.attention.head_count_kv", 2) ||
              gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f) ||
              gguf_set_str(w, "tokenizer.ggml.model", !strcmp(bad, "model") ? "bert" : gemma4 ? "gemma4" : "gpt2") ||
              (strcmp(pre, "-") && gguf_set_str(w, "tokenizer.ggml.pre", pre)) ||
              (tokens_ints ? gguf_set_arr(w, "tokenizer.ggml.tokens", GGUF_T_I32, types, n_tok)
                           : gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, n_tok)) ||
              gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_I32, types, n_types) ||
              (!no_merges && gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, b->n_merges)) ||
              (!nobos && (gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos) ||
                          gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos))) ||
              (addbos && gguf_set_bool(w, "tokenizer.ggml.add_bos_token", 1));
    if (werr) { snprintf(err, errlen, "%s", gguf_writer_error(w)); goto done; }
    if (!(mf = open_memstream(buf, size))) { snprintf(err, errlen, "open_memstream failed"); goto done; }
    if (gguf_writer_write_fp(w, mf, err, errlen)) goto done;
    if (fclose(mf)) { mf = NULL; snprintf(err, errlen, "writing the GGUF to memory failed"); goto done; }
    mf = NULL;
    /* version 2's layout is version 3's (little-endian): only the header's
     * version field differs */
    if (v2) (*buf)[4] = 2;
    if (!strcmp(bad, "v1")) (*buf)[4] = 1;
    if (!strcmp(bad, "truncated")) *size /= 2;
    rc = 0;
done:
    free(merges);
    if (mf) fclose(mf);
    if (rc && *buf) { free(*buf); *buf = NULL; }
    gguf_writer_free(w);
    free(toks);
    free(types);
    return rc;
}

static ds_tokenizer *load_case(const base_vocab b[2], const char *variant, const char *pre, char *err,
                               size_t errlen) {
    char *buf = NULL;
    size_t size = 0;
    if (build_gguf(b, variant, pre, NULL, &buf, &size, err, errlen)) return NULL;
    gguf_ctx *g = gguf_open_mem(buf, size, err, errlen);
    ds_tokenizer *t = NULL;
    if (g && !strcmp(variant, "v2") && gguf_version(g) != 2) snprintf(err, errlen, "not read as version 2");
    else if (g) t = ds_tokenizer_load(g, err, errlen);
    gguf_close(g);
    free(buf);
    return t;
}

/* ======================================================================
 * comparing
 * ====================================================================== */

typedef struct { const char *p; size_t n; } text_t;

/* Split buf at SEP into texts (pointers into buf); returns the count. */
static size_t split_texts(const char *buf, size_t n, text_t *out, size_t cap, size_t have) {
    const char *p = buf, *end = buf + n;
    while (have < cap) {
        const char *e = strstr(p, SEP);
        if (!e || e > end) e = end;
        out[have++] = (text_t){ p, (size_t)(e - p) };
        if (e == end) break;
        p = e + strlen(SEP);
    }
    return have;
}

/* Number of texts where t's ids differ from the expected lines ("-" = none);
 * with verbose, the first difference is printed. -1 if tokenizing failed. */
static int compare_case(const ds_tokenizer *t, int parse_special, const text_t *tx, size_t nt,
                        char *const *want, const char *label, int verbose) {
    int diff = 0;
    char err[DS_ERRLEN];
    for (size_t i = 0; i < nt; i++) {
        int32_t *ids;
        size_t nid;
        if (ds_tokenize_ex(t, tx[i].p, tx[i].n, ds_tokenizer_add_bos_default(t), parse_special, &ids, &nid, err,
                           sizeof err)) {
            printf("FAIL %s text %zu: %s\n", label, i + 1, err);
            return -1;
        }
        size_t k = 0;
        int ok = 1;
        const char *q = want[i];
        if (strcmp(q, "-")) {
            while (*q) {
                char *e;
                long v = strtol(q, &e, 10);
                if (e == q) { ok = 0; break; }
                if (k >= nid || ids[k] != v) ok = 0;
                k++;
                q = e;
            }
        }
        if (k != nid) ok = 0;
        if (!ok && !diff++ && verbose) {
            printf("FAIL %s text %zu '%.*s': llama.cpp [%s] dspark [", label, i + 1,
                   (int)(tx[i].n > 50 ? 50 : tx[i].n), tx[i].p, want[i]);
            for (size_t j = 0; j < nid; j++) printf("%s%d", j ? " " : "", ids[j]);
            printf("]\n");
        }
        free(ids);
    }
    return diff;
}

/* ======================================================================
 * corrupt files: one clear line each, never a crash
 * ====================================================================== */

static int test_corrupt(const base_vocab b[2]) {
    static const struct { const char *bad, *pre, *want; } cases[] = {
        { "", "klingon", "unsupported tokenizer.ggml.pre 'klingon'" },
        { "", "whitespace", "'whitespace' is not supported" },
        { "model", "qwen2", "unsupported tokenizer.ggml.model 'bert'" },
        { "merge-form", "qwen2", "tokenizer.ggml.merges[0] = 'abc' is not of the form" },
        { "no-merges", "qwen2", "missing tokenizer.ggml.merges" },
        { "types-short", "qwen2", "token_type has" },
        { "tokens-ints", "qwen2", "tokenizer.ggml.tokens is not an array of strings" },
        { "empty-tokens", "qwen2", "tokenizer.ggml.tokens has 0 entries" },
        { "bos-range", "qwen2", "bos_token_id" },
        { "v1", "qwen2", "version 1" },
        { "truncated", "qwen2", "" },
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[DS_ERRLEN] = "", *buf = NULL, name[96];
        size_t size = 0;
        snprintf(name, sizeof name, "corrupt_%s", cases[i].bad[0] ? cases[i].bad : cases[i].pre);
        if (build_gguf(b, "base", cases[i].pre, cases[i].bad, &buf, &size, err, sizeof err)) {
            printf("FAIL %s: cannot write it: %s\n", name, err);
            bad++;
            continue;
        }
        gguf_ctx *g = gguf_open_mem(buf, size, err, sizeof err);
        ds_tokenizer *t = g ? ds_tokenizer_load(g, err, sizeof err) : NULL;
        if (t) { printf("FAIL %s: loaded\n", name); bad++; }
        else if (!err[0] || strchr(err, '\n') || !strstr(err, cases[i].want)) {
            printf("FAIL %s: error '%s' (want one line with '%s')\n", name, err, cases[i].want);
            bad++;
        } else {
            printf("PASS %s: %s\n", name, err);
        }
        ds_tokenizer_free(t);
        gguf_close(g);
        free(buf);
    }
    return bad;
}

/* one case of expected.txt */
typedef struct {
    char variant[16], pre[64], mode[16];
    char **want;                   /* n_texts lines (into the file buffer)     */
    int borrowed;                  /* want is an earlier case's ("= V P M")    */
} oracle_case;

int main(int argc, char **argv) {
    char err[DS_ERRLEN];
    if (argc == 2 && !strcmp(argv[1], "--names")) {
        const char *names[256];
        size_t n = ds_pre_names(names, 256);
        for (size_t i = 0; i < n && i < 256; i++) printf("%s\n", names[i]);
        return 0;
    }
    base_vocab b[2];              /* byte-level (base.txt), raw UTF-8 (base_raw.txt) */
    int lb = base_load(&b[0], DIR "/base.txt", err, sizeof err);
    if (!lb) lb = base_load(&b[1], DIR "/base_raw.txt", err, sizeof err);
    else memset(&b[1], 0, sizeof b[1]);
    if (lb) { printf("FAIL %s\n", err); base_free(&b[0]); base_free(&b[1]); return 1; }
    if (argc == 5 && !strcmp(argv[1], "--gguf")) {
        char *buf = NULL;
        size_t size = 0;
        int rc = build_gguf(b, argv[2], argv[3], NULL, &buf, &size, err, sizeof err);
        FILE *f = rc ? NULL : fopen(argv[4], "wb");
        if (!rc && (!f || fwrite(buf, 1, size, f) != size)) { snprintf(err, sizeof err, "cannot write %s", argv[4]); rc = -1; }
        if (f && fclose(f)) { snprintf(err, sizeof err, "cannot write %s", argv[4]); rc = -1; }
        if (rc) fprintf(stderr, "test_tok_oracle: %s\n", err);
        free(buf);
        base_free(&b[0]);
        base_free(&b[1]);
        return rc ? 1 : 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: test_tok_oracle [--names | --gguf VARIANT PRE OUT]\n");
        base_free(&b[0]);
        base_free(&b[1]);
        return 2;
    }

    size_t n1, n2, ne;
    char *inp = slurp("tests/data/vocab/ggml-vocab-gpt-2.gguf.inp", &n1);
    char *extra = slurp(DIR "/extra.inp", &n2);
    char *exp = slurp(DIR "/expected.txt", &ne);
    text_t tx[256];
    size_t nt = 0;
    if (!inp || !extra || !exp) {
        printf("FAIL cannot read the texts or " DIR "/expected.txt\n");
        free(inp); free(extra); free(exp); base_free(&b[0]); base_free(&b[1]);
        return 1;
    }
    nt = split_texts(inp, n1, tx, 256, 0);
    nt = split_texts(extra, n2, tx, 256, nt);

    /* parse expected.txt: "case V P M" + nt lines, or "case V P M = V2 P2 M2" */
    oracle_case *cases = NULL;
    size_t n_cases = 0, cap = 0, declared = 0;
    int bad = 0;
    char *save = NULL;
    for (char *line = strtok_r(exp, "\n", &save); line && !bad; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        if (!strncmp(line, "texts ", 6)) { declared = (size_t)atol(line + 6); continue; }
        oracle_case c;
        memset(&c, 0, sizeof c);
        char r1[16], r2[64], r3[16];
        int nf = sscanf(line, "case %15s %63s %15s = %15s %63s %15s", c.variant, c.pre, c.mode, r1, r2, r3);
        if (nf != 3 && nf != 6) { printf("FAIL expected.txt: bad line '%.60s'\n", line); bad++; break; }
        if (nf == 6) {
            for (size_t i = 0; i < n_cases && !c.want; i++)
                if (!strcmp(cases[i].variant, r1) && !strcmp(cases[i].pre, r2) && !strcmp(cases[i].mode, r3))
                    c.want = cases[i].want;
            if (!c.want) { printf("FAIL expected.txt: '%s' refers to an unknown case\n", line); bad++; break; }
            c.borrowed = 1;
        } else {
            c.want = malloc(nt * sizeof *c.want);
            if (!c.want) { printf("FAIL out of memory\n"); bad++; break; }
            for (size_t i = 0; c.want && i < nt; i++) {
                c.want[i] = strtok_r(NULL, "\n", &save);
                if (!c.want[i]) { printf("FAIL expected.txt: case '%s' is short\n", line); bad++; break; }
            }
        }
        if (n_cases == cap) {
            cap = cap ? cap * 2 : 64;
            oracle_case *nc = realloc(cases, cap * sizeof *nc);
            if (!nc) { if (!c.borrowed) free(c.want); bad++; break; }
            cases = nc;
        }
        cases[n_cases++] = c;
    }
    if (!bad && declared != nt) { printf("FAIL expected.txt has ids for %zu texts, the folder %zu\n", declared, nt); bad++; }

    /* every case: the real loader on the case's GGUF, both modes */
    size_t n_pass = 0;
    int parse_bad = bad;
    for (size_t i = 0; i < n_cases && !parse_bad; i++) {
        char label[160];
        snprintf(label, sizeof label, "oracle %s %s %s", cases[i].variant, cases[i].pre, cases[i].mode);
        ds_tokenizer *t = load_case(b, cases[i].variant, cases[i].pre, err, sizeof err);
        if (!t) { printf("FAIL %s: %s\n", label, err); bad++; continue; }
        int d = compare_case(t, !strcmp(cases[i].mode, "special"), tx, nt, cases[i].want, label, 1);
        if (d) { if (d > 0) printf("FAIL %s: %d of %zu texts differ\n", label, d, nt); bad++; }
        else n_pass++;
        ds_tokenizer_free(t);
    }
    if (!bad) printf("PASS %zu cases x %zu texts: dspark's ids equal llama-tokenize's\n", n_pass, nt);

    /* coverage: every name dspark accepts has llama.cpp's ids, both modes */
    const char *names[256];
    size_t nn = ds_pre_names(names, 256), missing = 0;
    for (size_t k = 0; k < nn && k < 256; k++) {
        int have = 0;
        for (size_t i = 0; i < n_cases; i++)
            have += !strcmp(cases[i].variant, "base") && !strcmp(cases[i].pre, names[k]);
        if (have != 2 && !(!strcmp(names[k], "gpt2") && have == 0)) {
            printf("FAIL pre '%s' has no llama-tokenize ids in expected.txt (run make_oracle.py expect)\n", names[k]);
            missing++;
        }
    }
    if (!missing) printf("PASS every accepted tokenizer.ggml.pre name but dspark's own 'gpt2' is covered (%zu)\n", nn - 1);
    bad += (int)missing;

    /* counter-tests: the comparison sees a wrong pre-tokenizer and a wrong mode */
    oracle_case *q2 = NULL;
    for (size_t i = 0; i < n_cases; i++)
        if (!strcmp(cases[i].variant, "base") && !strcmp(cases[i].pre, "qwen2") && !strcmp(cases[i].mode, "special"))
            q2 = &cases[i];
    ds_tokenizer *t35 = q2 ? load_case(b, "base", "qwen35", err, sizeof err) : NULL;
    ds_tokenizer *tq2 = q2 ? load_case(b, "base", "qwen2", err, sizeof err) : NULL;
    int d1 = t35 ? compare_case(t35, 1, tx, nt, q2->want, "counter qwen35", 0) : -1;
    int d2 = tq2 ? compare_case(tq2, 0, tx, nt, q2->want, "counter plain", 0) : -1;
    if (d1 > 0) printf("PASS counter-test: qwen35's ids differ from llama.cpp's qwen2 ids on %d of %zu texts\n", d1, nt);
    else { printf("FAIL counter-test: qwen35 passes for qwen2 (%d)\n", d1); bad++; }
    if (d2 > 0) printf("PASS counter-test: without special-token parsing %d of %zu texts differ\n", d2, nt);
    else { printf("FAIL counter-test: the mode makes no difference (%d)\n", d2); bad++; }
    ds_tokenizer_free(t35);
    ds_tokenizer_free(tq2);

    bad += test_corrupt(b);

    for (size_t i = 0; i < n_cases; i++)
        if (!cases[i].borrowed) free(cases[i].want);
    free(cases);
    free(inp);
    free(extra);
    free(exp);
    base_free(&b[0]);
    base_free(&b[1]);
    printf("test_tok_oracle: %s\n", bad ? "FAIL" : "OK");
    return bad ? 1 : 0;
}
