/* test_serve_grammar.c — the grammar engine behind response_format and the
 * `grammar` field (src/grammar.c), on the shipped model's vocabulary:
 *   - GBNF parsing: repetition bounds, classes, escapes, groups; every
 *     malformed grammar refused with one line (left recursion, undefined
 *     rules, bad escapes, unclosed literals);
 *   - the JSON grammar is sound against cJSON (random byte mutations of JSON
 *     texts: whatever the grammar accepts, cJSON parses as an object) and
 *     complete on compact JSON (random documents printed by cJSON are
 *     accepted);
 *   - the token mask (a trie walk with memoized transitions) equals the
 *     brute-force rule "token t is allowed iff its bytes can be consumed" in
 *     every state along real documents, tokens ending inside a UTF-8
 *     character included. */
#include "grammar.h"
#include "gguf.h"
#include "testutil.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>

#define TARGET "models/dspark-tiny-f16.gguf"

static int accepts(ds_gmatch *m, const char *s, size_t n) {
    int st = ds_gmatch_bytes(m, ds_gmatch_start(m), s, n);
    return st >= 0 && ds_gmatch_can_end(m, st);
}

static ds_grammar *compile(const char *text, const ds_tokenizer *tok, char *e, size_t el) {
    return ds_grammar_new(text, strlen(text), tok, e, el);
}

static void test_parse(const ds_tokenizer *tok) {
    char e[256];
    static const struct { const char *g, *yes[4], *no[4]; } cases[] = {
        { "root ::= \"a\"{2,3}", { "aa", "aaa" }, { "", "a", "aaaa" } },
        { "root ::= [a-c]+ \"!\"?", { "a", "cab!", "b" }, { "", "!", "d", "a!!" } },
        { "root ::= ( \"x\" | \"yz\" )* \"end\"\n# a comment\n", { "end", "xyzend", "yzyzxend" }, { "xy", "endx", "" } },
        { "root ::= [^a-z]{2}", { "AB", "12", "\xc3\xa9\xe2\x82\xac" }, { "a1", "A", "ABC" } },
        { "root ::= \"\\u00e9\\n\" . \"\\x41\"", { "\xc3\xa9\nzA", "\xc3\xa9\n\xf0\x9f\x98\x80" "A" }, { "e\nzA", "\xc3\xa9\nA" } },
        { "root ::= item{0,2}\nitem ::= \"<\" root \">\"", { "", "<>", "<<>><>" }, { "<", "<><><>", "<<<>>>>" } },
        { "root ::= \"a\" b\nb ::= \"\" | \"b\" b", { "a", "abbb" }, { "b", "" } },
    };
    int ok = 1;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ds_grammar *g = compile(cases[c].g, tok, e, sizeof e);
        CHECK(g != NULL, "grammar %zu: %s", c, e);
        if (!g) { ok = 0; continue; }
        ds_gmatch *m = ds_gmatch_new(g);
        for (int k = 0; k < 4 && cases[c].yes[k]; k++) {
            int a = accepts(m, cases[c].yes[k], strlen(cases[c].yes[k]));
            CHECK(a, "grammar %zu should accept '%s'", c, cases[c].yes[k]);
            ok &= a;
        }
        for (int k = 0; k < 4 && cases[c].no[k]; k++) {
            int a = accepts(m, cases[c].no[k], strlen(cases[c].no[k]));
            CHECK(!a, "grammar %zu should refuse '%s'", c, cases[c].no[k]);
            ok &= !a;
        }
        ds_gmatch_free(m);
        ds_grammar_free(g);
    }
    printf("%s grammar_language cases=%zu\n", ok ? "PASS" : "FAIL", sizeof cases / sizeof cases[0]);
    static const struct { const char *g, *why; } bad[] = {
        { "root ::= root \"a\" | \"b\"", "left-recursive" },
        { "root ::= x\nx ::= y? root\ny ::= \"a\"", "left-recursive" },
        { "root ::= undefined", "not defined" },
        { "rot ::= \"a\"", "no rule named 'root'" },
        { "root ::= \"abc", "not closed" },
        { "root ::= [abc", "not closed" },
        { "root ::= \"\\q\"", "unknown escape" },
        { "root ::= \"a\"{3,2}", "below the minimum" },
        { "root ::= \"a\"**", "two repetition" },
        { "root ::= \"a\"\nroot ::= \"b\"", "defined twice" },
        { "root = \"a\"", "'::='" },
        { "root ::= \"\\uD800\"", "scalar" },
        { "root ::= ( \"a\"", "not closed" },
        { "root ::= []", "empty character class" },
    };
    int bok = 1;
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        e[0] = 0;
        ds_grammar *g = compile(bad[c].g, tok, e, sizeof e);
        int good = !g && strstr(e, bad[c].why) && !strchr(e, '\n') && !strncmp(e, "grammar: ", 9);
        CHECK(good, "bad grammar %zu: %s", c, g ? "accepted" : e);
        bok &= good;
        ds_grammar_free(g);
    }
    printf("%s grammar_errors cases=%zu\n", bok ? "PASS" : "FAIL", sizeof bad / sizeof bad[0]);
}

/* a deterministic generator (splitmix64) */
static uint64_t rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static cJSON *random_value(uint64_t *s, int depth) {
    int k = (int)(rng(s) % (depth > 3 ? 5 : 7));
    switch (k) {
    case 0: return cJSON_CreateNull();
    case 1: return cJSON_CreateBool(rng(s) & 1);
    case 2: return cJSON_CreateNumber((double)(int64_t)(rng(s) % 2000001) - 1000000.0);
    case 3: return cJSON_CreateNumber((double)(int64_t)(rng(s) % 100000) / 64.0);
    case 4: {
        static const char *const strs[] = { "", "a", "caf\xc3\xa9", "quote \" and \\ back", "tab\there", "\xf0\x9f\x98\x80 smile", "x\ny" };
        return cJSON_CreateString(strs[rng(s) % 7]);
    }
    case 5: {
        cJSON *a = cJSON_CreateArray();
        for (int i = (int)(rng(s) % 4); i > 0; i--) cJSON_AddItemToArray(a, random_value(s, depth + 1));
        return a;
    }
    default: {
        cJSON *o = cJSON_CreateObject();
        char key[16];
        for (int i = (int)(rng(s) % 4); i > 0; i--) {
            snprintf(key, sizeof key, "k%d", (int)(rng(s) % 100));
            cJSON_AddItemToObject(o, key, random_value(s, depth + 1));
        }
        return o;
    }
    }
}

static int json_object_ok(const char *s, size_t n) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    int ok = j && cJSON_IsObject(j) && end == s + n;
    cJSON_Delete(j);
    return ok;
}

static void test_json(const ds_tokenizer *tok) {
    char e[256];
    ds_grammar *g = ds_grammar_new(ds_grammar_json_object, strlen(ds_grammar_json_object), tok, e, sizeof e);
    CHECK(g != NULL, "json grammar: %s", e);
    if (!g) return;
    ds_gmatch *m = ds_gmatch_new(g);
    uint64_t seed = 7;
    int complete = 1, sound = 1, n_docs = 0, n_mut = 0, n_acc = 0;
    for (int d = 0; d < 300; d++) {
        cJSON *o = cJSON_CreateObject();
        for (int i = (int)(rng(&seed) % 5); i > 0; i--) {
            char key[16];
            snprintf(key, sizeof key, "f%d", i);
            cJSON_AddItemToObject(o, key, random_value(&seed, 0));
        }
        char *txt = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        size_t n = strlen(txt);
        n_docs++;
        if (!accepts(m, txt, n)) { complete = 0; printf("  not accepted: %s\n", txt); }
        /* mutations: delete, insert or replace a byte, or cut */
        for (int k = 0; k < 20; k++) {
            char buf[4096];
            size_t len = n < sizeof buf - 2 ? n : sizeof buf - 2;
            memcpy(buf, txt, len);
            size_t at = len ? rng(&seed) % len : 0;
            static const char pool[] = "{}[]\",:0123456789-+.eEtrufalsn \n\t\\\x01\x80\xc3\xa9";
            int op = (int)(rng(&seed) % 4);
            if (op == 0 && len) { memmove(buf + at, buf + at + 1, len - at - 1); len--; }
            else if (op == 1) { memmove(buf + at + 1, buf + at, len - at); buf[at] = pool[rng(&seed) % (sizeof pool - 1)]; len++; }
            else if (op == 2 && len) buf[at] = pool[rng(&seed) % (sizeof pool - 1)];
            else len = at;
            n_mut++;
            if (accepts(m, buf, len)) {
                n_acc++;
                if (!json_object_ok(buf, len)) { sound = 0; printf("  accepted but not JSON: %.*s\n", (int)len, buf); }
            }
        }
        cJSON_free(txt);
    }
    CHECK(complete, "compact JSON objects must be accepted");
    CHECK(sound, "what the grammar accepts must be a JSON object");
    static const char *const refuse[] = { "[1]", "{\"a\":01}", "{\"a\":\"\x01\"}", "{\"a\":1,}", "{\"a\":1} ", "{'a':1}",
                                          "{\"a\":\"\xff\"}", "{\"a\":\"\xc3\"}", "{\"a\":.5}", "{\"a\":tru}" };
    for (size_t k = 0; k < sizeof refuse / sizeof refuse[0]; k++)
        CHECK(!accepts(m, refuse[k], strlen(refuse[k])), "json grammar must refuse %s", refuse[k]);
    const char *fine = "{\n  \"a\": [1, 2.5e-3, true, null, \"\\u00e9 \xc3\xa9\"],\n  \"b\" : {}\n}";
    CHECK(accepts(m, fine, strlen(fine)), "json grammar must accept %s", fine);
    printf("%s grammar_json_sound_and_complete documents=%d mutations=%d accepted_mutations=%d\n",
           complete && sound ? "PASS" : "FAIL", n_docs, n_mut, n_acc);

    /* the mask equals the per-token rule in every state along documents */
    const int V = ds_tokenizer_n_vocab(tok);
    float *lg = malloc((size_t)V * sizeof *lg);
    static const char *const docs[] = {
        "{\"name\": \"caf\xc3\xa9 \xf0\x9f\x98\x80\", \"n\": [1, -2.5, true], \"o\": {\"x\": null}}",
        "{\n \"a\":\"\\\"q\\u0041\"}",
    };
    int same = 1, states = 0;
    for (size_t d = 0; d < sizeof docs / sizeof docs[0]; d++) {
        int st = ds_gmatch_start(m);
        size_t n = strlen(docs[d]);
        for (size_t i = 0; i <= n && st >= 0; i++) {
            for (int t = 0; t < V; t++) lg[t] = 0.0f;
            int allowed = ds_gmatch_mask(m, st, lg, V);
            int count = 0;
            for (int t = 0; t < V; t++) {
                int a = ds_gmatch_allowed(m, st, t);
                count += a;
                if (a != (lg[t] == 0.0f)) { same = 0; if (same == 0 && count < 3) printf("  token %d differs at byte %zu\n", t, i); }
            }
            same &= allowed == count && allowed > 0;
            states++;
            if (i < n) st = ds_gmatch_bytes(m, st, docs[d] + i, 1);
        }
        CHECK(st >= 0 && ds_gmatch_complete(m, st), "document %zu must end the grammar", d);
    }
    CHECK(same, "mask != per-token rule");
    printf("%s grammar_mask_equals_per_token_rule states=%d vocab=%d\n", same ? "PASS" : "FAIL", states, V);
    free(lg);
    ds_gmatch_free(m);
    ds_grammar_free(g);
}

int main(void) {
    char e[256];
    gguf_ctx *gg = gguf_open(TARGET, e, sizeof e);
    CHECK(gg != NULL, "open: %s", e);
    if (!gg) return tu_finish("test_serve_grammar");
    ds_tokenizer *tok = ds_tokenizer_load(gg, e, sizeof e);
    CHECK(tok != NULL, "tokenizer: %s", e);
    if (tok) {
        test_parse(tok);
        test_json(tok);
        ds_tokenizer_free(tok);
    }
    gguf_close(gg);
    return tu_finish("test_serve_grammar");
}
