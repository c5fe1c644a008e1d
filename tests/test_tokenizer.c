/* test_tokenizer.c — gpt2 byte-level BPE and llama SPM tokenizers.
 *
 * Vocabularies are made here: the BPE trainer (ds_tokenizer_build_bpe ->
 * gguf writer -> temp file -> gguf_open -> ds_tokenizer_load), hand-made
 * byte-level BPE and SPM vocabularies through the internal spec constructor,
 * and deliberately broken GGUF tokenizer metadata. Prints PASS/FAIL lines and
 * exits non-zero on any failure. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int n_fail;

#define FAILF(name, ...) do { printf("FAIL %s: ", name); printf(__VA_ARGS__); printf("\n"); n_fail++; } while (0)
#define PASS(name) printf("PASS %s\n", name)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* deterministic pseudo-random numbers (tests are reproducible) */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

/* ======================================================================
 * helpers
 * ====================================================================== */

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char buf[512];   /* test-only scratch; single-threaded */
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

/* Training text: English-like sentences, code, numbers, and some CJK and
 * emoji, about `size` bytes, the same on every run. */
static char *make_corpus(size_t size) {
    static const char *const words[] = {
        "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world",
        "speculative", "decoding", "draft", "model", "token", "verify", "batch", "exact",
        "kernel", "tensor", "cache", "layer", "attention", "it's", "we'll", "they're",
        "int", "return", "for", "(i = 0; i < n; i++)", "{", "}", "//", "3.14159", "2024",
        "1000000", "日本語", "中文", "テキスト", "😀", "🚀", "Ünïcödé", "naïve", "Привет",
    };
    size_t nw = sizeof words / sizeof words[0];
    char *s = malloc(size + 64);
    size_t n = 0;
    uint64_t r = 0x9e3779b97f4a7c15ull;
    while (n < size) {
        const char *w = words[rng_next(&r) % nw];
        size_t l = strlen(w);
        memcpy(s + n, w, l);
        n += l;
        uint64_t sep = rng_next(&r) % 16;
        s[n++] = sep == 0 ? '\n' : sep == 1 ? '.' : sep == 2 ? ',' : ' ';
    }
    s[n] = 0;
    return s;
}

static ds_tokenizer *load_file(const char *path, char *err) {
    gguf_ctx *g = gguf_open(path, err, DS_ERRLEN);
    if (!g) return NULL;
    ds_tokenizer *t = ds_tokenizer_load(g, err, DS_ERRLEN);
    gguf_close(g);   /* the tokenizer must not point into the mapping */
    return t;
}

static int write_bpe_file(const char *path, const char *text, size_t len, int32_t n_vocab, char *err) {
    gguf_writer *w = gguf_writer_new();
    int rc = ds_tokenizer_build_bpe(w, text, len, n_vocab, err, DS_ERRLEN);
    if (!rc) rc = gguf_writer_write(w, path, err, DS_ERRLEN);
    gguf_writer_free(w);
    return rc;
}

/* tokenize then concatenate the bytes; 1 if equal to expect */
static int roundtrip(const ds_tokenizer *t, const char *s, size_t n, int parse_special,
                     const char *expect, size_t expect_n, char *why, size_t whylen) {
    int32_t *ids;
    size_t nids;
    char err[DS_ERRLEN];
    if (ds_tokenize_ex(t, s, n, 0, parse_special, &ids, &nids, err, sizeof err)) {
        snprintf(why, whylen, "tokenize failed: %.200s", err);
        return 0;
    }
    char *buf = malloc(expect_n + 16);
    size_t k = 0;
    int ok = 1;
    for (size_t i = 0; i < nids && ok; i++) {
        int l = ds_token_to_bytes(t, ids[i], NULL, 0);
        if (l < 0 || k + (size_t)l > expect_n) { ok = 0; break; }
        ds_token_to_bytes(t, ids[i], buf + k, (size_t)l);
        k += (size_t)l;
    }
    if (ok) ok = k == expect_n && !memcmp(buf, expect, expect_n);
    if (!ok) snprintf(why, whylen, "decoded %zu bytes (of %zu tokens), want %zu bytes", k, nids, expect_n);
    free(buf);
    free(ids);
    return ok;
}

static int tokenize_eq(const ds_tokenizer *t, const char *s, const int32_t *want, size_t nwant,
                       int parse_special, char *why, size_t whylen) {
    int32_t *ids;
    size_t n;
    char err[DS_ERRLEN];
    if (ds_tokenize_ex(t, s, strlen(s), 0, parse_special, &ids, &n, err, sizeof err)) {
        snprintf(why, whylen, "tokenize failed: %.200s", err);
        return 0;
    }
    int ok = n == nwant && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
    if (!ok) {
        int k = snprintf(why, whylen, "got [");
        for (size_t i = 0; i < n && k < (int)whylen - 16; i++) k += snprintf(why + k, whylen - k, "%s%d", i ? " " : "", ids[i]);
        k += snprintf(why + k, whylen - k, "] want [");
        for (size_t i = 0; i < nwant && k < (int)whylen - 16; i++) k += snprintf(why + k, whylen - k, "%s%d", i ? " " : "", want[i]);
        snprintf(why + k, whylen - k, "]");
    }
    free(ids);
    return ok;
}

/* ======================================================================
 * trainer: determinism, speed, GGUF load
 * ====================================================================== */

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}

static ds_tokenizer *test_trainer(const char *corpus, size_t clen) {
    char err[DS_ERRLEN];
    const char *name = "bpe_train_deterministic";
    double t0 = now_s();
    if (write_bpe_file(tmp_path("a.gguf"), corpus, clen, 4096, err)) { FAILF(name, "%s", err); return NULL; }
    double dt = now_s() - t0;
    if (write_bpe_file(tmp_path("b.gguf"), corpus, clen, 4096, err)) { FAILF(name, "%s", err); return NULL; }
    size_t na, nb;
    char *a = read_file(tmp_path("a.gguf"), &na), *b = read_file(tmp_path("b.gguf"), &nb);
    if (!a || !b || na != nb || memcmp(a, b, na)) FAILF(name, "two builds differ (%zu vs %zu bytes)", na, nb);
    else PASS(name);
    free(a); free(b);

    name = "bpe_train_speed";
    /* budget generous enough for sanitizer builds; -O2 takes well under 0.5 s */
    if (dt > 5.0) FAILF(name, "%.3f s for %zu bytes, n_vocab 4096", dt, clen);
    else { printf("PASS %s (%.0f ms for %zu bytes, n_vocab 4096)\n", name, dt * 1e3, clen); }

    name = "bpe_load_gguf";
    ds_tokenizer *t = load_file(tmp_path("a.gguf"), err);
    if (!t) { FAILF(name, "%s", err); return NULL; }
    if (ds_tokenizer_n_vocab(t) != 4096 || strcmp(ds_tokenizer_model(t), "gpt2") ||
        ds_tokenizer_bos(t) != 4094 || ds_tokenizer_eos(t) != 4094 || ds_tokenizer_mask(t) != 4095 ||
        !ds_tokenizer_is_eog(t, 4094) || ds_tokenizer_is_eog(t, 4095) || ds_tokenizer_add_bos_default(t) ||
        ds_tokenizer_token_type(t, 4095) != DS_TOKTYPE_CONTROL || ds_tokenizer_token_type(t, 4096) != -1)
        FAILF(name, "metadata: n_vocab %d bos %d eos %d mask %d", ds_tokenizer_n_vocab(t), ds_tokenizer_bos(t),
              ds_tokenizer_eos(t), ds_tokenizer_mask(t));
    else PASS(name);

    name = "bpe_compresses_training_text";
    int32_t *ids;
    size_t n;
    if (ds_tokenize(t, corpus, clen, 0, &ids, &n, err, sizeof err)) FAILF(name, "%s", err);
    else {
        if (n * 3 > clen) FAILF(name, "%zu tokens for %zu bytes", n, clen);
        else printf("PASS %s (%zu bytes -> %zu tokens)\n", name, clen, n);
        free(ids);
    }

    name = "bpe_small_text_pads_unused";
    gguf_writer *w = gguf_writer_new();
    if (ds_tokenizer_build_bpe(w, "ab ab", 5, 300, err, sizeof err) ||
        gguf_writer_write(w, tmp_path("small.gguf"), err, sizeof err)) FAILF(name, "%s", err);
    else {
        ds_tokenizer *s = load_file(tmp_path("small.gguf"), err);
        char why[256];
        if (!s) FAILF(name, "%s", err);
        else if (ds_tokenizer_n_vocab(s) != 300 || ds_tokenizer_token_type(s, 297) != DS_TOKTYPE_UNUSED ||
                 !roundtrip(s, "ab ab abc", 9, 1, "ab ab abc", 9, why, sizeof why))
            FAILF(name, "n_vocab %d type[297] %d", ds_tokenizer_n_vocab(s), ds_tokenizer_token_type(s, 297));
        else PASS(name);
        ds_tokenizer_free(s);
    }
    gguf_writer_free(w);

    name = "bpe_train_rejects_tiny_vocab";
    w = gguf_writer_new();
    if (!ds_tokenizer_build_bpe(w, "ab", 2, 257, err, sizeof err) || !strstr(err, "257")) FAILF(name, "err '%s'", err);
    else PASS(name);
    gguf_writer_free(w);
    return t;
}

/* ======================================================================
 * round trips
 * ====================================================================== */

static void test_roundtrips(const ds_tokenizer *t, const char *label) {
    char name[128], why[256];
    struct { const char *name; const char *s; size_t n; } cases[] = {
        { "empty", "", 0 },
        { "invalid_ff", "\xff", 1 },
        { "invalid_mixed", "a\xff" "b\x80\x80 c\xc3", 8 },
        { "lone_continuations", "\x80\xbf\x80 x \xbf", 7 },
        { "truncated", "\xe6\x97 \xf0\x9f\x98 \xe2", 8 },
        { "overlong", "\xc0\xaf\xe0\x80\xaf\xf0\x80\x80\xaf \xc1\xbf", 12 },
        { "surrogate_and_big", "\xed\xa0\x80\xf4\x90\x80\x80\xf5\xff", 9 },
        { "newlines_tabs", "a\n\nb\t\tc\r\n \n\t x\n", 16 },
        { "digits", "1234567890123456789 3.14159 0x1f 1,000,000", 42 },
        { "emoji_cjk", "😀🚀 日本語のテキスト 中文 👨‍👩‍👧", 0 },
        { "mixed_scripts", "Hello Привет مرحبا שלום नमस्ते 안녕 Ünïcödé naïve", 0 },
        { "contractions", "it's we'll THEY'RE I'M you'd don't", 0 },
        { "nul_bytes", "a\0b\0\0c", 6 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = cases[i].n ? cases[i].n : strlen(cases[i].s);
        snprintf(name, sizeof name, "%s_roundtrip_%s", label, cases[i].name);
        if (!roundtrip(t, cases[i].s, n, 0, cases[i].s, n, why, sizeof why) ||
            !roundtrip(t, cases[i].s, n, 1, cases[i].s, n, why, sizeof why))
            FAILF(name, "%s", why);
        else PASS(name);
    }

    /* long runs of whitespace */
    char *sp = malloc(3000);
    memset(sp, ' ', 1000);
    memcpy(sp + 1000, "x", 1);
    memset(sp + 1001, '\n', 500);
    memset(sp + 1501, '\t', 500);
    snprintf(name, sizeof name, "%s_roundtrip_1000_spaces", label);
    if (!roundtrip(t, sp, 1000, 1, sp, 1000, why, sizeof why) || !roundtrip(t, sp, 2001, 1, sp, 2001, why, sizeof why))
        FAILF(name, "%s", why);
    else PASS(name);
    free(sp);

    /* 1 MB of random bytes, and 1 MB of random valid-ish text */
    size_t big = 1 << 20;
    char *r = malloc(big);
    uint64_t seed = 12345;
    for (size_t i = 0; i < big; i++) r[i] = (char)(rng_next(&seed) >> 32);
    snprintf(name, sizeof name, "%s_roundtrip_1MB_random_bytes", label);
    double t0 = now_s();
    if (!roundtrip(t, r, big, 0, r, big, why, sizeof why)) FAILF(name, "%s", why);
    else printf("PASS %s (%.0f ms)\n", name, (now_s() - t0) * 1e3);
    static const char *const alpha[] = { "a", "b", "c", " ", "  ", "\n", "1", "é", "日", "😀", "'s", ".", "\xff" };
    size_t k = 0;
    while (k + 8 < big) {
        const char *a = alpha[rng_next(&seed) % (sizeof alpha / sizeof alpha[0])];
        size_t l = strlen(a);
        memcpy(r + k, a, l);
        k += l;
    }
    snprintf(name, sizeof name, "%s_roundtrip_1MB_random_text", label);
    t0 = now_s();
    if (!roundtrip(t, r, k, 1, r, k, why, sizeof why)) FAILF(name, "%s", why);
    else printf("PASS %s (%.0f ms)\n", name, (now_s() - t0) * 1e3);
    /* one huge pre-token: a single 100 KB word exercises the O(n log n) merge */
    memset(r, 'a', 100000);
    snprintf(name, sizeof name, "%s_roundtrip_100KB_word", label);
    if (!roundtrip(t, r, 100000, 1, r, 100000, why, sizeof why)) FAILF(name, "%s", why);
    else PASS(name);
    free(r);
}

/* ======================================================================
 * pre-tokenizer splits
 * ====================================================================== */

typedef struct { char buf[1024]; size_t n; } piece_log;

/* pieces joined with '|' */
static int log_piece(void *ctx, const char *p, size_t n) {
    piece_log *l = ctx;
    if (l->n + n + 2 >= sizeof l->buf) return -1;
    if (l->n) l->buf[l->n++] = '|';
    memcpy(l->buf + l->n, p, n);
    l->n += n;
    l->buf[l->n] = 0;
    return 0;
}

static void test_pretok(void) {
    struct { ds_pre_kind kind; const char *name; const char *in; const char *want; } cases[] = {
        { DS_PRE_LLAMA3, "llama3_digit_groups", "x 1234567 12", "x| |123|456|7| |12" },
        { DS_PRE_QWEN2, "qwen2_single_digits", "x 1234 5", "x| |1|2|3|4| |5" },
        { DS_PRE_GPT2, "gpt2_digit_runs", "x 1234567 12", "x| 1234567| 12" },
        { DS_PRE_GPT2, "gpt2_words", "Hello world, it's  me", "Hello| world|,| it|'s| | me" },
        { DS_PRE_LLAMA3, "llama3_contractions", "IT'S we'LL", "IT|'S| we|'LL" },
        { DS_PRE_QWEN2, "qwen2_newlines", "a\n\n  b", "a|\n\n| | b" },
        { DS_PRE_QWEN2, "qwen2_invalid_bytes_isolated", "ab\xff" "cd\x80", "ab|\xff|cd|\x80" },
        /* contractions are ASCII-only, as in llama.cpp: "'ſt" (long s) is one piece */
        { DS_PRE_QWEN2, "qwen2_ascii_contractions", "'\xc5\xbft", "'\xc5\xbft" },
        /* qwen35: a combining mark (U+0301) stays with its letter; qwen2 splits it off */
        { DS_PRE_QWEN35, "qwen35_marks_join", "cafe\xcc\x81 x", "cafe\xcc\x81| x" },
        { DS_PRE_QWEN2, "qwen2_marks_split", "cafe\xcc\x81 x", "cafe|\xcc\x81| x" },
        /* llama.cpp's default: punctuation runs, gpt-2, digit runs, then threes */
        { DS_PRE_DEFAULT, "default_sequence", "Hello, world!! 123456", "Hello|,| world|!!| |123|456" },
        /* deepseek-llm: U+3000 is whitespace (\s?, before a letter run), not
         * the "　-。" punctuation range: llama.cpp replaces it by \v first */
        { DS_PRE_DEEPSEEK_LLM, "deepseek_llm_ideographic_space", "a\xe3\x80\x80" "b", "a|\xe3\x80\x80" "b" },
        { DS_PRE_DEEPSEEK_LLM, "deepseek_llm_cjk_digits", "\xe4\xbd\xa0\xe5\xa5\xbd 42", "\xe4\xbd\xa0\xe5\xa5\xbd| |42" },
        /* deepseek-coder: letters, punctuation (P only: "=" is a symbol, left in the gap), single digits */
        { DS_PRE_DEEPSEEK_CODER, "deepseek_coder_digits", "x = 123;", "x| = |1|2|3|;" },
        /* starcoder (refact, command-r): digits one by one, then gpt-2 */
        { DS_PRE_STARCODER, "starcoder_digits", "a 12b", "a| |1|2|b" },
        /* falcon: punctuation runs first, then gpt-2, then three-digit groups */
        { DS_PRE_FALCON, "falcon_sequence", "x+=1234", "x|+=|123|4" },
        /* deepseek-v3: up to three digits, CJK runs, then the main pattern */
        { DS_PRE_DEEPSEEK3, "deepseek3_sequence", "ab12345\xe4\xbd\xa0.c", "ab|123|45|\xe4\xbd\xa0|.c" },
        /* kimi-k2: Han runs apart from other letters (kana is not Han), digits in threes */
        { DS_PRE_KIMI_K2, "kimi_k2_han", "\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x81\x8b 12345 It'S",
          "\xe4\xbd\xa0\xe5\xa5\xbd|\xe3\x81\x8b| |123|45| It'S" },
        /* afmoe, tiny_aya: digit runs grouped in threes from the right, the
         * first group with the text before it (later regexes split that) */
        { DS_PRE_AFMOE, "afmoe_digits", "\xe4\xbd\xa0" "a1234567 89x", "\xe4\xbd\xa0|a|1|234|567| |89|x" },
        { DS_PRE_TINY_AYA, "tiny_aya_digits", "x 1234", "x| |1|234" },
        /* superbpe: only number runs and the empty matches split ("ab " stays whole) */
        { DS_PRE_SUPERBPE, "superbpe_empty_matches", "ab 1234567 123456", "ab |1|234|567| |123|456" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[128], err[DS_ERRLEN];
        snprintf(name, sizeof name, "pretok_%s", cases[i].name);
        ds_pretok p;
        piece_log l = { .n = 0 };
        l.buf[0] = 0;
        if (ds_pretok_init(&p, cases[i].kind, err, sizeof err)) { FAILF(name, "%s", err); continue; }
        if (ds_pretok_split(&p, cases[i].in, strlen(cases[i].in), log_piece, &l, err, sizeof err))
            FAILF(name, "%s", err);
        else if (strcmp(l.buf, cases[i].want)) FAILF(name, "got '%s' want '%s'", l.buf, cases[i].want);
        else PASS(name);
        ds_pretok_free(&p);
    }
}

/* ======================================================================
 * hand-made byte-level BPE
 * ====================================================================== */

/* 256 byte tokens (id = byte) then the extra tokens, with merges. */
static ds_tokenizer *hand_bpe(const char *pre, const char *const *extra, int n_extra, const int32_t *extra_types,
                              const char *const *merges, int n_merges, char *err) {
    uint32_t b2cp[256];
    ds_gpt2_byte_alphabet(b2cp);
    int n = 256 + n_extra;
    ds_tok_str *toks = malloc((size_t)n * sizeof *toks);
    int32_t *types = malloc((size_t)n * sizeof *types);
    char (*bytetxt)[4] = malloc(256 * 4);
    for (int b = 0; b < 256; b++) {
        size_t l = ds_utf8_encode(b2cp[b], bytetxt[b]);
        toks[b] = (ds_tok_str){ bytetxt[b], l };
        types[b] = DS_TOKTYPE_NORMAL;
    }
    for (int i = 0; i < n_extra; i++) {
        toks[256 + i] = (ds_tok_str){ extra[i], strlen(extra[i]) };
        types[256 + i] = extra_types ? extra_types[i] : DS_TOKTYPE_NORMAL;
    }
    ds_tok_str *m = malloc(((size_t)n_merges + 1) * sizeof *m);
    for (int i = 0; i < n_merges; i++) m[i] = (ds_tok_str){ merges[i], strlen(merges[i]) };
    ds_tok_spec s;
    ds_tok_spec_init(&s);
    s.model = "gpt2";
    s.pre = pre;
    s.n_vocab = n;
    s.tokens = toks;
    s.types = types;
    s.merges = m;
    s.n_merges = (size_t)n_merges;
    ds_tokenizer *t = ds_tokenizer_from_spec(&s, err, DS_ERRLEN);
    free(toks); free(types); free(bytetxt); free(m);
    return t;
}

static void test_hand_bpe(void) {
    char err[DS_ERRLEN], why[512];
    /* 256 he, 257 ll, 258 llo, 259 hello, 260 Ġhello ("Ġ" = U+0120 = space),
     * 261 lo, 262 <|endoftext|> (control) */
    const char *extra[] = { "he", "ll", "llo", "hello", "\xc4\xa0hello", "lo", "<|endoftext|>" };
    const int32_t types[] = { 1, 1, 1, 1, 1, 1, DS_TOKTYPE_CONTROL };
    /* ranks: "l o" (rank 0) beats "l l" (rank 2), so "llo" = l + lo would be
     * found first — but "lo" + nothing... the rule set below decides */
    const char *merges[] = { "h e", "l l", "ll o", "he llo", "\xc4\xa0 hello", "l o" };
    ds_tokenizer *t = hand_bpe("gpt2", extra, 7, types, merges, 6, err);
    const char *name = "hand_bpe_build";
    if (!t) { FAILF(name, "%s", err); return; }
    PASS(name);

    struct { const char *name; const char *in; int32_t want[8]; size_t n; int special; } cases[] = {
        { "hello_one_token", "hello", { 259 }, 1, 1 },
        { "space_hello", " hello", { 260 }, 1, 1 },
        { "hel", "hel", { 256, 'l' }, 2, 1 },
        /* "llo": l l (rank 1) before l o (rank 5): ll + o -> llo */
        { "rank_order", "llo", { 258 }, 1, 1 },
        /* "lol": only "l o" applies -> lo, l */
        { "lo", "lol", { 261, 'l' }, 2, 1 },
        { "two_words", "hello hello", { 259, 260 }, 2, 1 },
        { "special_literal", "hello<|endoftext|>hello", { 259, 262, 259 }, 3, 1 },
        { "special_off", "<|e", { '<', '|', 'e' }, 3, 0 },
        /* a bare space is the byte token for 0x20 */
        { "byte_space", " ", { ' ' }, 1, 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "hand_bpe_%s", cases[i].name);
        if (!tokenize_eq(t, cases[i].in, cases[i].want, cases[i].n, cases[i].special, why, sizeof why))
            FAILF(nm, "%s", why);
        else PASS(nm);
    }
    name = "hand_bpe_special_parse_default";
    int32_t *ids;
    size_t n;
    if (ds_tokenize(t, "<|endoftext|>", 13, 0, &ids, &n, err, sizeof err)) FAILF(name, "%s", err);
    else {
        if (n != 1 || ids[0] != 262) FAILF(name, "ds_tokenize did not map the literal special token");
        else PASS(name);
        free(ids);
    }
    name = "hand_bpe_empty_gives_non_null";
    if (ds_tokenize(t, "", 0, 0, &ids, &n, err, sizeof err) || n != 0 || !ids) FAILF(name, "n %zu", n);
    else PASS(name);
    free(ids);

    name = "hand_bpe_token_to_bytes";
    char buf[8];
    int l1 = ds_token_to_bytes(t, 260, buf, sizeof buf), l2 = ds_token_to_bytes(t, 262, buf, sizeof buf);
    int l3 = ds_token_to_bytes(t, 263, buf, sizeof buf), l4 = ds_token_to_bytes(t, 260, buf, 2);
    if (l1 != 6 || l2 != 0 || l3 != -1 || l4 != 6 || memcmp(buf, " h", 2)) FAILF(name, "%d %d %d %d", l1, l2, l3, l4);
    else PASS(name);
    ds_tokenizer_free(t);

    /* llama3: ignore_merges emits a pre-token found whole in the vocabulary */
    const char *extra3[] = { "hello" };
    t = hand_bpe("llama3", extra3, 1, NULL, NULL, 0, err);
    name = "hand_bpe_llama3_ignore_merges";
    int32_t want[] = { 256, ' ', 'h', 'e', 'l', 'l', 'o' };
    if (!t) FAILF(name, "%s", err);
    else if (!tokenize_eq(t, "hello hello", want, 7, 1, why, sizeof why)) FAILF(name, "%s", why);
    else PASS(name);
    ds_tokenizer_free(t);

    /* a user-defined token is split out even without parse_special (llama.cpp,
     * Hugging Face tokenizers); a control token is not */
    const char *extra_u[] = { "<ud>", "<|c|>" };
    const int32_t types_u[] = { DS_TOKTYPE_USER_DEFINED, DS_TOKTYPE_CONTROL };
    t = hand_bpe("gpt-2", extra_u, 2, types_u, NULL, 0, err);
    name = "hand_bpe_user_defined_without_parse_special";
    int32_t want_u[] = { 'x', 256, 'y', '<', '|', 'c', '|', '>' };
    if (!t) FAILF(name, "%s", err);
    else if (!tokenize_eq(t, "x<ud>y<|c|>", want_u, 8, 0, why, sizeof why)) FAILF(name, "%s", why);
    else PASS(name);
    ds_tokenizer_free(t);

    name = "hand_bpe_missing_byte_token";
    ds_tok_str one = { "a", 1 };
    ds_tok_spec s;
    ds_tok_spec_init(&s);
    s.model = "gpt2"; s.n_vocab = 1; s.tokens = &one; s.merges = &one; s.n_merges = 0;
    t = ds_tokenizer_from_spec(&s, err, sizeof err);
    if (t || !strstr(err, "byte 0x00")) FAILF(name, "err '%s'", err);
    else PASS(name);
    ds_tokenizer_free(t);

    /* gpt-neox style: no token for 0xc0 and 0xff (bytes valid UTF-8 never has).
     * Such a byte in the text is U+FFFD's bytes, as llama.cpp reads it. */
    {
        uint32_t b2cp[256];
        ds_gpt2_byte_alphabet(b2cp);
        ds_tok_str toks[254];
        char txt[256][4];
        int n = 0;
        for (int b = 0; b < 256; b++) {
            if (b == 0xc0 || b == 0xff) continue;
            size_t l = ds_utf8_encode(b2cp[b], txt[b]);
            toks[n++] = (ds_tok_str){ txt[b], l };
        }
        ds_tok_spec_init(&s);
        s.model = "gpt2"; s.pre = "gpt-2"; s.n_vocab = n; s.tokens = toks; s.merges = toks; s.n_merges = 0;
        name = "hand_bpe_byte_fallback_load";
        t = ds_tokenizer_from_spec(&s, err, sizeof err);
        if (!t) FAILF(name, "%s", err);
        else {
            PASS(name);
            /* ids: byte b < 0xc0 has id b; 0xc1..0xfe have id b - 1 */
            int32_t want_f[] = { 'a', 0xef - 1, 0xbf, 0xbd, 'b', 0xef - 1, 0xbf, 0xbd };
            name = "hand_bpe_byte_fallback_ufffd";
            if (!tokenize_eq(t, "a\xc0" "b\xff", want_f, 8, 0, why, sizeof why)) FAILF(name, "%s", why);
            else PASS(name);
            ds_tokenizer_free(t);
        }
        /* and without the bytes of U+FFFD there is nothing to stand in */
        for (int k = 0; k < n; k++)
            if (toks[k].len == 2 && !memcmp(toks[k].ptr, "\xc3\xaf", 2)) toks[k] = (ds_tok_str){ "zz", 2 };  /* 0xef */
        name = "hand_bpe_byte_fallback_needs_ufffd";
        t = ds_tokenizer_from_spec(&s, err, sizeof err);
        if (t || !strstr(err, "U+FFFD")) FAILF(name, "err '%s'", err);
        else PASS(name);
        ds_tokenizer_free(t);
    }

    name = "pre_refused_custom_splitter";
    ds_pre_kind k;
    if (ds_pre_lookup("whitespace", &k, NULL, NULL) != -2 || ds_pre_lookup("klingon", &k, NULL, NULL) != -1 ||
        ds_pre_lookup("kimi-k2", &k, NULL, NULL) || k != DS_PRE_KIMI_K2 ||
        ds_pre_lookup("qwen35", &k, NULL, NULL) || k != DS_PRE_QWEN35 || ds_pre_lookup(NULL, &k, NULL, NULL) ||
        k != DS_PRE_DEFAULT)
        FAILF(name, "lookup results");
    else PASS(name);
    /* every name compiles */
    const char *names[256];
    size_t nn = ds_pre_names(names, 256);
    int bad = 0;
    for (size_t i = 0; i < nn && i < 256; i++) {
        ds_pretok p;
        if (ds_pre_lookup(names[i], &k, NULL, NULL) || ds_pretok_init(&p, k, err, sizeof err)) {
            FAILF("pre_all_names_compile", "%s: %s", names[i], err);
            bad++;
        } else {
            ds_pretok_free(&p);
        }
    }
    if (!bad) printf("PASS pre_all_names_compile (%zu names)\n", nn);
}

/* Cross-check the heap-based merge against the obvious O(n^2) loop on the
 * trained vocabulary: lowest rank first, leftmost on ties. */
static void test_bpe_vs_naive(const ds_tokenizer *t) {
    const char *name = "bpe_heap_matches_naive";
    uint64_t seed = 777;
    static const char *const parts[] = { "the", "he", "ll", "o", "t", "e", " ", "a", "an", "de", "ing", "日" };
    char text[64], err[DS_ERRLEN];
    for (int iter = 0; iter < 2000; iter++) {
        size_t n = 0;
        int np = 1 + (int)(rng_next(&seed) % 8);
        for (int k = 0; k < np; k++) {
            const char *p = parts[rng_next(&seed) % (sizeof parts / sizeof parts[0])];
            if (n + strlen(p) >= sizeof text) break;
            if (p[0] == ' ' && n) continue;   /* one pre-token: no inner spaces */
            memcpy(text + n, p, strlen(p));
            n += strlen(p);
        }
        int32_t sym[64];
        size_t ns = n;
        for (size_t i = 0; i < n; i++) sym[i] = t->byte_token[(uint8_t)text[i]];
        for (;;) {
            int64_t best = INT64_MAX, v;
            size_t at = 0;
            for (size_t i = 0; i + 1 < ns; i++)
                if (ds_u64map_find(&t->merges, ds_pair_key(sym[i], sym[i + 1]), &v) && (v >> 32) < (best >> 32)) {
                    best = v;
                    at = i;
                }
            if (best == INT64_MAX) break;
            sym[at] = (int32_t)(best & 0xffffffff);
            memmove(sym + at + 1, sym + at + 2, (ns - at - 2) * sizeof *sym);
            ns--;
        }
        ds_i32vec got = {0};
        /* call the piece encoder through the public path: a piece with no
         * inner pre-token boundary tokenizes as one pre-token */
        piece_log l = { .n = 0 };
        ds_pretok_split(&t->pretok, text, n, log_piece, &l, err, sizeof err);
        if (memchr(l.buf, '|', l.n)) continue;   /* the regex split it; skip */
        if (ds_bpe_encode(t, text, n, &got, err, sizeof err) || got.n != ns ||
            memcmp(got.v, sym, ns * sizeof *sym)) {
            FAILF(name, "text '%.*s': %zu tokens vs naive %zu", (int)n, text, got.n, ns);
            free(got.v);
            return;
        }
        free(got.v);
    }
    PASS(name);
}

/* ======================================================================
 * hand-made SPM vocabulary
 * ====================================================================== */

static ds_tokenizer *hand_spm(char *err) {
    /* 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then pieces */
    static const struct { const char *t; float score; } pieces[] = {
        { "\xe2\x96\x81", -1.0f },                 /* 259 ▁       */
        { "h", -2.0f }, { "e", -2.0f }, { "l", -2.0f }, { "o", -2.0f },          /* 260..263 */
        { "w", -2.0f }, { "r", -2.0f }, { "d", -2.0f },                          /* 264..266 */
        { "he", -3.0f }, { "ll", -3.5f }, { "llo", -4.0f }, { "hello", -5.0f },  /* 267..270 */
        { "\xe2\x96\x81hello", -4.5f },            /* 271 ▁hello  */
        { "\xe2\x96\x81w", -6.0f },                /* 272 ▁w      */
        { "or", -3.0f }, { "orld", -5.5f }, { "ld", -3.2f },                     /* 273..275 */
        { "\xe2\x96\x81h", -9.0f },                /* 276 ▁h      */
        { "<0xZZ>", -1.0f },                       /* 277 a normal piece that only looks odd */
    };
    int np = (int)(sizeof pieces / sizeof pieces[0]);
    int n = 259 + np;
    ds_tok_str *toks = malloc((size_t)n * sizeof *toks);
    float *scores = calloc((size_t)n, sizeof *scores);
    int32_t *types = malloc((size_t)n * sizeof *types);
    char (*bt)[8] = malloc(256 * 8);
    toks[0] = (ds_tok_str){ "<unk>", 5 }; types[0] = DS_TOKTYPE_UNKNOWN;
    toks[1] = (ds_tok_str){ "<s>", 3 }; types[1] = DS_TOKTYPE_CONTROL;
    toks[2] = (ds_tok_str){ "</s>", 4 }; types[2] = DS_TOKTYPE_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(bt[b], 8, "<0x%02X>", b);
        toks[3 + b] = (ds_tok_str){ bt[b], 6 };
        types[3 + b] = DS_TOKTYPE_BYTE;
    }
    for (int i = 0; i < np; i++) {
        toks[259 + i] = (ds_tok_str){ pieces[i].t, strlen(pieces[i].t) };
        scores[259 + i] = pieces[i].score;
        types[259 + i] = DS_TOKTYPE_NORMAL;
    }
    ds_tok_spec s;
    ds_tok_spec_init(&s);
    s.model = "llama";
    s.n_vocab = n;
    s.tokens = toks;
    s.scores = scores;
    s.types = types;
    s.bos = 1; s.eos = 2; s.unk = 0; s.add_bos = 1;
    ds_tokenizer *t = ds_tokenizer_from_spec(&s, err, DS_ERRLEN);
    free(toks); free(scores); free(types); free(bt);
    return t;
}

static void test_spm(void) {
    char err[DS_ERRLEN], why[512];
    ds_tokenizer *t = hand_spm(err);
    const char *name = "spm_build";
    if (!t) { FAILF(name, "%s", err); return; }
    PASS(name);
    struct { const char *name; const char *in; int32_t want[12]; size_t n; } cases[] = {
        /* ▁ h e l l o: best scores first: ▁(n/a) he(-3) ll(-3.5) ... → ▁hello */
        { "hello", "hello", { 271 }, 1 },
        /* ▁w(-6) loses to or(-3) then or+ld? "orld" needs or+ld: ld(-3.2) */
        { "hello_world", "hello world", { 271, 272, 274 }, 3 },
        /* é = c3 a9 is not a piece: byte fallback */
        { "byte_fallback", "h\xc3\xa9", { 276, 3 + 0xc3, 3 + 0xa9 }, 3 },
        { "invalid_utf8", "\xff" "e", { 259, 3 + 0xff, 261 }, 3 },
        { "literal_bos", "<s>he", { 1, 259, 267 }, 3 },   /* "▁he" is no piece: ▁ + he */
        { "empty", "", { 0 }, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "spm_%s", cases[i].name);
        if (!tokenize_eq(t, cases[i].in, cases[i].want, cases[i].n, 1, why, sizeof why)) FAILF(nm, "%s", why);
        else PASS(nm);
    }

    name = "spm_add_bos";
    int32_t *ids;
    size_t n;
    if (ds_tokenize(t, "he", 2, 1, &ids, &n, err, sizeof err) || n != 3 || ids[0] != 1) FAILF(name, "n %zu", n);
    else PASS(name);
    free(ids);

    /* round trips: the decoded text is the input with one leading space */
    static const char *const rts[] = { "hello world", "  two  spaces ", "日本 😀 é", "\xff\x80 \xe2\x96", "a\nb\tc" };
    for (size_t i = 0; i < sizeof rts / sizeof rts[0]; i++) {
        char nm[64], want[128];
        snprintf(nm, sizeof nm, "spm_roundtrip_%zu", i);
        size_t l = strlen(rts[i]);
        want[0] = ' ';
        memcpy(want + 1, rts[i], l);
        if (!roundtrip(t, rts[i], l, 1, want, l + 1, why, sizeof why)) FAILF(nm, "%s", why);
        else PASS(nm);
    }
    name = "spm_token_to_bytes";
    char buf[16];
    int a = ds_token_to_bytes(t, 3 + 0x41, buf, sizeof buf);
    int b = ds_token_to_bytes(t, 1, buf + 1, sizeof buf - 1);
    int c = ds_token_to_bytes(t, 271, buf + 1, sizeof buf - 1);
    if (a != 1 || buf[0] != 'A' || b != 0 || c != 6 || memcmp(buf + 1, " hello", 6)) FAILF(name, "%d %d %d", a, b, c);
    else PASS(name);
    ds_tokenizer_free(t);
}

/* ======================================================================
 * bad GGUF tokenizer metadata
 * ====================================================================== */

typedef struct {
    const char *model, *pre;
    int n_tokens, n_types, n_scores;
    int bos;                 /* -1: absent */
    int with_merges;
    int tokens_wrong_type;
} bad_opts;

static const char *write_bad(const bad_opts *o) {
    gguf_writer *w = gguf_writer_new();
    uint32_t b2cp[256];
    ds_gpt2_byte_alphabet(b2cp);
    char txt[256][4];
    const char *toks[300];
    int32_t types[300];
    float scores[300];
    for (int i = 0; i < 300; i++) {
        size_t l = ds_utf8_encode(b2cp[i % 256], txt[i % 256]);
        txt[i % 256][l] = 0;
        toks[i] = i < 256 ? txt[i] : "zz";
        types[i] = 1;
        scores[i] = 0;
    }
    if (o->model) gguf_set_str(w, "tokenizer.ggml.model", o->model);
    if (o->pre) gguf_set_str(w, "tokenizer.ggml.pre", o->pre);
    if (o->tokens_wrong_type) gguf_set_arr(w, "tokenizer.ggml.tokens", GGUF_T_I32, types, 256);
    else if (o->n_tokens) gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)o->n_tokens);
    if (o->n_types) gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_I32, types, (uint64_t)o->n_types);
    if (o->n_scores) gguf_set_arr(w, "tokenizer.ggml.scores", GGUF_T_F32, scores, (uint64_t)o->n_scores);
    if (o->with_merges) {
        const char *m[] = { "a b" };
        gguf_set_arr_str(w, "tokenizer.ggml.merges", m, 1);
    }
    if (o->bos >= 0) gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)o->bos);
    char err[DS_ERRLEN];
    const char *path = tmp_path("bad.gguf");
    if (gguf_writer_write(w, path, err, sizeof err)) printf("note: write failed: %s\n", err);
    gguf_writer_free(w);
    return path;
}

static void test_bad_metadata(void) {
    struct { const char *name; bad_opts o; const char *want; } cases[] = {
        { "ok_gpt2", { "gpt2", "qwen2", 256, 256, 0, 5, 1, 0 }, NULL },
        { "ok_llama", { "llama", NULL, 256, 256, 256, 1, 0, 0 }, NULL },
        { "unknown_model", { "bert", NULL, 256, 256, 0, -1, 1, 0 }, "'bert'" },
        { "missing_model", { NULL, NULL, 256, 256, 0, -1, 1, 0 }, "tokenizer.ggml.model" },
        { "unknown_pre", { "gpt2", "klingon", 256, 256, 0, -1, 1, 0 }, "'klingon'" },
        { "types_length_mismatch", { "gpt2", NULL, 256, 200, 0, -1, 1, 0 }, "token_type" },
        { "scores_length_mismatch", { "llama", NULL, 256, 256, 255, -1, 0, 0 }, "scores" },
        { "bos_out_of_range", { "gpt2", NULL, 256, 256, 0, 256, 1, 0 }, "bos_token_id" },
        { "missing_tokens", { "gpt2", NULL, 0, 0, 0, -1, 1, 0 }, "tokenizer.ggml.tokens" },
        { "tokens_not_strings", { "gpt2", NULL, 0, 0, 0, -1, 1, 1 }, "tokenizer.ggml.tokens" },
        { "gpt2_missing_merges", { "gpt2", NULL, 256, 256, 0, -1, 0, 0 }, "merges" },
        { "gpt2_missing_byte", { "gpt2", NULL, 200, 200, 0, -1, 1, 0 }, "byte 0xc8" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[128], err[DS_ERRLEN] = "";
        snprintf(name, sizeof name, "bad_meta_%s", cases[i].name);
        ds_tokenizer *t = load_file(write_bad(&cases[i].o), err);
        if (!cases[i].want) {
            if (!t) FAILF(name, "unexpected error: %s", err);
            else PASS(name);
        } else if (t) {
            FAILF(name, "loaded, expected an error mentioning %s", cases[i].want);
        } else if (!strstr(err, cases[i].want) || strchr(err, '\n')) {
            FAILF(name, "error '%s' does not mention %s", err, cases[i].want);
        } else {
            printf("PASS %s (%s)\n", name, err);
        }
        ds_tokenizer_free(t);
    }
}

/* ======================================================================
 * main
 * ====================================================================== */

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/dspark_tok_XXXXXX", base && base[0] ? base : "/tmp");
    if (!mkdtemp(tmpdir)) { printf("FAIL setup: mkdtemp\n"); return 1; }

    size_t clen = 100 * 1024;
    char *corpus = make_corpus(clen);
    clen = strlen(corpus);

    test_pretok();
    test_hand_bpe();
    test_spm();
    test_bad_metadata();
    ds_tokenizer *t = test_trainer(corpus, clen);
    if (t) {
        test_roundtrips(t, "bpe_qwen2");
        test_bpe_vs_naive(t);
        const char *name = "bpe_literal_special";
        int32_t *ids;
        size_t n;
        char err[DS_ERRLEN];
        const char *s = "hello<|endoftext|> world<|mask|>";
        if (ds_tokenize(t, s, strlen(s), 1, &ids, &n, err, sizeof err)) FAILF(name, "%s", err);
        else {
            int saw_eot = 0, saw_mask = 0;
            for (size_t i = 1; i < n; i++) { saw_eot += ids[i] == 4094; saw_mask += ids[i] == 4095; }
            if (ids[0] != 4094 || saw_eot != 1 || saw_mask != 1 || ids[n - 1] != 4095)
                FAILF(name, "eot %d mask %d", saw_eot, saw_mask);
            else PASS(name);
            free(ids);
        }
        ds_tokenizer_free(t);
    }
    /* the same vocabulary under the other pre-tokenizers must round-trip too */
    ds_bpe_vocab v;
    char err[DS_ERRLEN];
    if (ds_bpe_train(corpus, clen, 1024, &v, err, sizeof err)) FAILF("bpe_train_1024", "%s", err);
    else {
        static const char *const pres[] = { "gpt2", "llama3" };
        for (int i = 0; i < 2; i++) {
            ds_tok_spec s;
            ds_tok_str *ts, *ms;
            ds_bpe_vocab_spec(&v, &s, &ts, &ms);
            s.pre = pres[i];
            ds_tokenizer *u = ds_tokenizer_from_spec(&s, err, sizeof err);
            if (!u) FAILF(pres[i], "%s", err);
            else { test_roundtrips(u, pres[i]); ds_tokenizer_free(u); }
            free(ts); free(ms);
        }
        ds_bpe_vocab_free(&v);
    }

    /* a tiny alphabet makes many merge paths spell the same string: tokens
     * must stay distinct (ds_tokenizer_find(text(id)) == id) and round-trip */
    {
        const char *name = "bpe_train_abc_unique_tokens";
        size_t n = 200000;
        char *abc = malloc(n);
        uint64_t seed = 99;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rng_next(&seed) % 61;
            abc[i] = r == 60 ? ' ' : (char)('a' + r % 3);
        }
        if (ds_bpe_train(abc, n, 2048, &v, err, sizeof err)) FAILF(name, "%s", err);
        else {
            ds_tok_spec s;
            ds_tok_str *ts, *ms;
            ds_bpe_vocab_spec(&v, &s, &ts, &ms);
            ds_tokenizer *u = ds_tokenizer_from_spec(&s, err, sizeof err);
            char why[256];
            int dup = -1;
            for (int32_t i = 0; u && i < 2048 && dup < 0; i++)
                if (ds_tokenizer_find(u, ts[i].ptr, ts[i].len) != i) dup = i;
            if (!u) FAILF(name, "%s", err);
            else if (dup >= 0) FAILF(name, "token %d '%s' is not unique", dup, ts[dup].ptr);
            else if (!roundtrip(u, abc, n, 1, abc, n, why, sizeof why)) FAILF(name, "%s", why);
            else printf("PASS %s (%zu merges)\n", name, v.n_merges);
            ds_tokenizer_free(u);
            free(ts); free(ms);
            ds_bpe_vocab_free(&v);
        }
        free(abc);
    }

    unlink(tmp_path("a.gguf")); unlink(tmp_path("b.gguf")); unlink(tmp_path("small.gguf")); unlink(tmp_path("bad.gguf"));
    rmdir(tmpdir);
    free(corpus);
    printf("%s: %d failure(s)\n", n_fail ? "FAIL" : "OK", n_fail);
    return n_fail ? 1 : 0;
}
