/* test_serve_req.c — the OpenAI / llama-server layer of `dspark serve`
 * without HTTP (the server's sources are compiled in: they are part of the
 * dspark binary, not of libdspark):
 *   utf8        incremental repair == whole, every split point
 *   stop        stop_find / stop_hold on strings cut at every byte: the
 *               streamed visible prefix never passes the final cut
 *   errors      every error JSON is valid UTF-8 with its message cut at a
 *               character boundary, whatever bytes the client sent
 *   chat        each family detected from template text and rendered in its
 *               format; the templates the server cannot render are refused
 *   jinja       the template interpreter against jinja2's own output on
 *               templates in each family's style; hostile templates end in
 *               one error line within their limits, never a crash or hang
 *   split       reasoning / content / tool calls out of a reply; a stream
 *               cut at every byte adds up to the non-streamed message
 *   jinja_api   a GGUF-style template through the request layer: tools,
 *               tool messages, tool_calls and reasoning_content replies
 *   schema      JSON Schema -> grammar: instances accepted / refused,
 *               unsupported keywords refused by name
 *   requests    every field: implemented ones read, neutral ones accepted
 *               only at their neutral value, unknown ones refused; hostile
 *               numbers in every float field (5e-324 and friends) give a 400
 *               naming the field, never a value the engine refuses */
#include "../tools/serve_req.c"
#include "../tools/serve_chat.c"
#include "../tools/serve_schema.c"
#include "../tools/jinja.c"
#include "jinja_cases.h"
#include "grammar.h"
#include "gguf.h"
#include "testutil.h"
#include "tokenizer.h"

/* ---- UTF-8 ------------------------------------------------------------------ */
static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int k = utf8_seq((const unsigned char *)s + i, n - i);
        if (k <= 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

static void test_utf8(void) {
    static const char *const cases[] = {
        "plain ascii", "caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac \xf0\x9f\x98\x80", "\xc3", "\xe2\x82", "\xf0\x9f\x98",
        "\xc0\xaf overlong", "\xed\xa0\x80 surrogate", "\xf4\x90\x80\x80 too big", "\xff\xfe stray", "\x80 lone cont",
        "a\xe2\x82" "b", "\xf0\x9f\x98\x80\xf0\x9f", "end\xc3",
    };
    int ok = 1, n = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *s = cases[c];
        size_t len = strlen(s);
        sbuf whole = { 0 };
        sbuf_add(&whole, "", 0);
        CHECK(utf8_take(s, len, 1, &whole) == len, "final take consumes all");
        ok &= valid_utf8(whole.p, whole.len);
        if (c < 2) ok &= whole.len == len && !memcmp(whole.p, s, len);
        for (size_t cut = 0; cut <= len; cut++) {
            sbuf inc = { 0 };
            sbuf_add(&inc, "", 0);
            size_t used = utf8_take(s, cut, 0, &inc);
            used += utf8_take(s + used, len - used, 1, &inc);
            ok &= used == len && inc.len == whole.len && !memcmp(inc.p, whole.p, whole.len);
            sbuf_free(&inc);
            n++;
            size_t k = utf8_clip(s, len, cut);     /* on valid text: never inside a character */
            if (c < 2) ok &= k <= cut && (k == len || ((unsigned char)s[k] & 0xC0) != 0x80);
        }
        sbuf_free(&whole);
    }
    CHECK(ok, "utf8_take: incremental differs from whole, or output not valid UTF-8");
    printf("%s utf8_incremental_equals_whole cases=%d\n", ok ? "PASS" : "FAIL", n);
}

/* ---- stop strings ------------------------------------------------------------- */
static void test_stop(void) {
    char *s1 = strdup("dry"), *s2 = strdup("\n\n"), *s3 = strdup("ab");
    char *strs[] = { s1, s2, s3 };
    size_t lens[] = { 3, 2, 2 };
    stop_set ss = { strs, lens, 3, 3 };
    static const char *const texts[] = { "The river was a dry place", "one\n\ntwo", "xxaab", "no stop here at all", "a", "d" };
    int ok = 1;
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        const char *x = texts[t];
        const size_t n = strlen(x);
        long full = stop_find(&ss, x, n, 0);
        /* token by token (one byte each): the first hit is the whole text's
         * first match, and what a stream shows never passes it */
        long hit = -1;
        size_t shown = 0;
        for (size_t k = 1; k <= n && hit < 0; k++) {
            hit = stop_find(&ss, x, k, k - 1);
            const size_t vis = hit >= 0 ? (size_t)hit : k - stop_hold(&ss, x, k);
            ok &= vis >= shown;
            shown = vis;
            if (full >= 0) ok &= shown <= (size_t)full;
        }
        ok &= hit == full;
    }
    ok &= stop_find(&ss, "The river was a dry place", 25, 0) == 16 && stop_hold(&ss, "abc d", 5) == 1 && stop_hold(&ss, "x\n", 2) == 1;
    CHECK(ok, "stop strings");
    printf("%s stop_strings_streamed_prefix_never_passes_cut\n", ok ? "PASS" : "FAIL");
    free(s1); free(s2); free(s3);
}

/* ---- errors: valid UTF-8 whatever the client sent -------------------------------- */
static void test_errors(void) {
    int ok = 1, n = 0;
    static const char *const hostile[] = { "\xff\xfe", "caf\xc3", "\xe2\x82\xac\xe2\x82", "\x01\x02\n\r\t", "\xed\xa0\x80", "ok" };
    for (size_t h = 0; h < sizeof hostile / sizeof hostile[0]; h++)
        for (int pad = 0; pad < 420; pad += 7) {
            char buf[1024];
            memset(buf, 'x', (size_t)pad);
            snprintf(buf + pad, sizeof buf - (size_t)pad, "%s\xe2\x82\xac", hostile[h]);
            api_error e;
            api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found", "the model '%s' does not exist", buf);
            char *j = api_error_json(&e);
            cJSON *back = j ? cJSON_Parse(j) : NULL;
            ok &= j && valid_utf8(j, strlen(j)) && back && !strchr(e.message, '\n') && valid_utf8(e.message, strlen(e.message));
            cJSON_Delete(back);
            free(j);
            n++;
        }
    CHECK(ok, "error JSON must be valid UTF-8");
    printf("%s error_json_valid_utf8 cases=%d\n", ok ? "PASS" : "FAIL", n);
}

/* ---- chat templates ------------------------------------------------------------------ */
static void test_chat(void) {
    /* template texts with each family's markers (as written in GGUFs) */
    static const struct { const char *tmpl; chat_kind k; } det[] = {
        { "{% for m in messages %}<|im_start|>{{m.role}}\\n{{m.content}}<|im_end|>{% endfor %}", CHAT_CHATML },
        { "<|im_start|>assistant\\n<think>\\n\\n</think>{% if enable_thinking is defined %}", CHAT_QWEN3 },
        { "{{ bos_token }}<|start_header_id|>{{ role }}<|end_header_id|>\\n\\n{{ content }}<|eot_id|>", CHAT_LLAMA3 },
        { "{{ bos_token }}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}{% endif %}", CHAT_LLAMA2 },
        { "{{ bos_token }}[INST] {{ ' [INST] ' + system_message }}", CHAT_MISTRAL_V1 },
        { "{{ bos_token }}[AVAILABLE_TOOLS]{{- '[INST] ' + m }}[/INST]", CHAT_MISTRAL_V3 },
        { "{{ bos_token }}[AVAILABLE_TOOLS]{{ \"[INST]\" + m }}[/INST]", CHAT_MISTRAL_V3_TEKKEN },
        { "{{ bos_token }}[SYSTEM_PROMPT] {{ '[INST] ' + m }}[/INST]", CHAT_MISTRAL_V7 },
        { "{{ bos_token }}<start_of_turn>user\\n{{ first_user_prefix }}<end_of_turn>", CHAT_GEMMA },
        { "### Instruction:\\n{{ m }}\\n### Response:\\n<|EOT|>", CHAT_DEEPSEEK },
        { "{{ bos_token }}{{ 'Assistant: ' + message['content'] + eos_token }}", CHAT_DEEPSEEK2 },
        { "{{ bos_token }}<\xef\xbd\x9cUser\xef\xbd\x9c>{{ c }}<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
          "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", CHAT_DEEPSEEK3 },
        { "<|user|>\\n{{ c }}<|end|>\\n<|assistant|>\\n", CHAT_PHI3 },
        { "<|im_start|>user<|im_sep|>{{ c }}<|im_end|>", CHAT_PHI4 },
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof det / sizeof det[0]; i++) {
        chat_tmpl t;
        int rc = chat_tmpl_init(&t, det[i].tmpl, CHAT_NONE);
        CHECK(!rc && t.kind == det[i].k, "detect %s: got %s (%s)", chat_kind_name(det[i].k), chat_kind_name(t.kind), t.why);
        ok &= !rc && t.kind == det[i].k;
        chat_tmpl_free(&t);
    }
    /* refused: unknown, SmolVLM, Llama-2 with BOS in the history, DeepSeek
     * Coder's default system prompt, a v7 whose spacing is unclear, none */
    static const char *const refuse[] = {
        "Human: {{ c }}", "<|im_start|>User:<end_of_utterance>", "{{ bos_token + '[INST] ' + content.strip() }}",
        "### Instruction: {% if not ns.found %}You are an AI programming assistant{% endif %}<|EOT|>",
        "[SYSTEM_PROMPT]{{ x }}[INST]", NULL,
    };
    for (size_t i = 0; i < sizeof refuse / sizeof refuse[0]; i++) {
        chat_tmpl t;
        int rc = chat_tmpl_init(&t, refuse[i], CHAT_NONE);
        CHECK(rc && t.kind == CHAT_NONE && strstr(t.why, "--chat-template"), "refuse %zu: %s", i, t.why);
        ok &= rc != 0;
        chat_tmpl_free(&t);
    }
    /* rendering: each family's format */
    const chat_msg conv[] = { { "system", "Be brief." }, { "user", "Hi" }, { "assistant", "<think>x</think>\n\nHello." }, { "user", "Bye" } };
    static const struct { chat_kind k; const char *want; int from; } ren[] = {
        { CHAT_CHATML, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>x</think>\n\nHello."
                       "<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", 0 },
        { CHAT_QWEN3, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
                      "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", 0 },
        { CHAT_LLAMA3, "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n<think>x</think>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                       "Bye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", 0 },
        { CHAT_MISTRAL_V3, "[INST] Hi[/INST] <think>x</think>\n\nHello.</s>[INST] Be brief.\n\nBye[/INST]", 0 },
        { CHAT_MISTRAL_V7, "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST] <think>x</think>\n\nHello.</s>[INST] Bye[/INST]", 0 },
        { CHAT_GEMMA, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n<think>x</think>\n\nHello.<end_of_turn>\n"
                      "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n", 0 },
        { CHAT_DEEPSEEK3, "Be brief.<\xef\xbd\x9cUser\xef\xbd\x9c>Hi<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>Hello.<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81"
                          "sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>Bye<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", 0 },
        { CHAT_PHI3, "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n<think>x</think>\n\nHello.<|end|>\n<|user|>\nBye<|end|>\n"
                     "<|assistant|>\n", 0 },
        { CHAT_PLAIN, "Be brief.\n\nUser: Hi\nAssistant: <think>x</think>\n\nHello.\nUser: Bye\nAssistant:", 0 },
    };
    for (size_t i = 0; i < sizeof ren / sizeof ren[0]; i++) {
        chat_tmpl t;
        chat_tmpl_init(&t, NULL, ren[i].k);
        sbuf o = { 0 };
        char why[256];
        int rc = chat_render(&t, conv, 4, 0, &o, why, sizeof why);
        int eq = !rc && o.p && !strcmp(o.p, ren[i].want);
        CHECK(eq, "render %s:\n%s\n--- want ---\n%s", chat_kind_name(ren[i].k), rc ? why : o.p, ren[i].want);
        ok &= eq;
        sbuf_free(&o);
        chat_tmpl_free(&t);
    }
    /* the literals a template adds: Qwen2.5's default system prompt, Llama
     * 3.1's date header, DeepSeek-R1's opening <think> */
    chat_tmpl t;
    sbuf o = { 0 };
    char why[256];
    const chat_msg one[] = { { "user", "Hi" } };
    chat_tmpl_init(&t, "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, a helpful assistant.<|im_end|>\\n' }}{% endif %}<|im_start|>", CHAT_NONE);
    chat_render(&t, one, 1, 1, &o, why, sizeof why);
    int qd = o.p && !strcmp(o.p, "<|im_start|>system\nYou are Qwen, a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                 "<|im_start|>assistant\n");
    CHECK(qd, "qwen2.5 default system: %s", o.p ? o.p : "");
    sbuf_free(&o);
    chat_tmpl_free(&t);
    chat_tmpl_init(&t, "{{- bos_token }}{%- set date_string = \"26 Jul 2024\" %}{{- \"Cutting Knowledge Date: December 2023\\n\" }}"
                       "<|start_header_id|>system<|end_header_id|>", CHAT_NONE);
    chat_render(&t, one, 1, 1, &o, why, sizeof why);
    int l31 = t.kind == CHAT_LLAMA3 && t.bos && o.p &&
              !strcmp(o.p, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                           "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK(l31, "llama 3.1 header: %s", o.p ? o.p : "");
    sbuf_free(&o);
    chat_tmpl_free(&t);
    chat_tmpl_init(&t, "{{ bos_token }}<\xef\xbd\x9cUser\xef\xbd\x9c><\xef\xbd\x9c" "Assistant\xef\xbd\x9c><think>\\n"
                       "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", CHAT_NONE);
    chat_render(&t, one, 1, 1, &o, why, sizeof why);
    int r1 = t.think && o.p && strstr(o.p, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c><think>\n") && o.len == strlen(o.p);
    CHECK(r1, "deepseek r1 think: %s", o.p ? o.p : "");
    sbuf_free(&o);
    chat_tmpl_free(&t);
    /* roles a template refuses */
    chat_tmpl_init(&t, "<start_of_turn>user", CHAT_NONE);        /* Gemma 1/2: no system role */
    const chat_msg sys[] = { { "system", "S" }, { "user", "U" } }, two_users[] = { { "user", "a" }, { "user", "b" } },
                   ends_assistant[] = { { "user", "a" }, { "assistant", "b" } };
    int refused = chat_render(&t, sys, 2, 1, &o, why, sizeof why) && strstr(why, "no system role");
    refused &= chat_render(&t, two_users, 2, 1, &o, why, sizeof why) && strstr(why, "alternate");
    refused &= chat_render(&t, ends_assistant, 2, 1, &o, why, sizeof why) && strstr(why, "end with a user");
    sbuf_free(&o);
    chat_tmpl_free(&t);
    CHECK(refused, "gemma role refusals");
    ok &= qd && l31 && r1 && refused;
    printf("%s chat_templates families=%zu refused=%zu\n", ok ? "PASS" : "FAIL", sizeof det / sizeof det[0], sizeof refuse / sizeof refuse[0]);
}

/* ---- JSON Schema -> grammar ---------------------------------------------------------------- */
static int accepts(const ds_grammar *g, const char *s) {
    ds_gmatch *m = ds_gmatch_new(g);
    int st = ds_gmatch_bytes(m, ds_gmatch_start(m), s, strlen(s));
    int ok = st >= 0 && ds_gmatch_can_end(m, st);
    ds_gmatch_free(m);
    return ok;
}

static void test_schema(void) {
    char e0[256];
    gguf_ctx *gg = gguf_open(tu_shipped_target(), e0, sizeof e0);
    ds_tokenizer *tok = gg ? ds_tokenizer_load(gg, e0, sizeof e0) : NULL;
    CHECK(tok != NULL, "tokenizer: %s", e0);
    if (!tok) { gguf_close(gg); return; }
    static const struct { const char *schema, *yes[3], *no[3]; } cases[] = {
        { "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},\"required\":[\"name\"]}",
          { "{\"name\":\"Ann\",\"age\":31}", "{\"name\":\"B\"}", "{ \"name\" : \"C\" , \"age\" : -2 }" },
          { "{\"age\":3}", "{\"name\":\"A\",\"x\":1}", "{\"name\":\"A\",\"age\":1.5}" } },
        { "{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",3]},\"minItems\":1,\"maxItems\":2}",
          { "[\"red\"]", "[3,\"green\"]", "[ \"red\" , 3 ]" }, { "[]", "[\"blue\"]", "[3,3,3]" } },
        { "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},"
          "{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/node\"}",
          { "{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2e3,\"next\":null}}", NULL }, { "{\"v\":1}", "{\"next\":null,\"v\":1}", NULL } },
        { "{\"type\":[\"string\",\"null\"],\"maxLength\":3}", { "\"abc\"", "null", "\"\"" }, { "\"abcd\"", "1", NULL } },
        { "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}", { "{}", "{\"a\":true,\"b\":false}", NULL }, { "{\"a\":1}", NULL, NULL } },
        { "{\"const\":{\"k\":[1,2]}}", { "{\"k\":[1,2]}", NULL, NULL }, { "{\"k\":[1, 2]}", NULL, NULL } },
        { "{\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":false}", { "[1,\"x\"]", NULL, NULL }, { "[1]", "[\"x\",1]", NULL } },
    };
    int ok = 1;
    char err[300];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cJSON *s = cJSON_Parse(cases[c].schema);
        char *gbnf = schema_to_gbnf(s, err, sizeof err);
        ds_grammar *g = gbnf ? ds_grammar_new(gbnf, strlen(gbnf), tok, err, sizeof err) : NULL;
        CHECK(g != NULL, "schema %zu: %s", c, err);
        for (int k = 0; g && k < 3; k++) {
            if (cases[c].yes[k]) { int a = accepts(g, cases[c].yes[k]); CHECK(a, "schema %zu must accept %s", c, cases[c].yes[k]); ok &= a; }
            if (cases[c].no[k]) { int a = accepts(g, cases[c].no[k]); CHECK(!a, "schema %zu must refuse %s", c, cases[c].no[k]); ok &= !a; }
        }
        ok &= g != NULL;
        ds_grammar_free(g);
        free(gbnf);
        cJSON_Delete(s);
    }
    static const char *const bad[] = { "{\"type\":\"string\",\"pattern\":\"a+\"}", "{\"type\":\"integer\",\"minimum\":0}", "{\"allOf\":[]}",
                                       "{\"$ref\":\"http://x/y\"}", "{\"type\":\"object\",\"required\":[\"x\"]}", "{\"type\":\"wat\"}", "false" };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        cJSON *s = cJSON_Parse(bad[b]);
        char *gbnf = schema_to_gbnf(s, err, sizeof err);
        CHECK(!gbnf && !strncmp(err, "json_schema at ", 15), "bad schema %zu accepted (%s)", b, gbnf ? "grammar made" : err);
        ok &= !gbnf;
        free(gbnf);
        cJSON_Delete(s);
    }
    printf("%s json_schema_to_grammar schemas=%zu refused=%zu\n", ok ? "PASS" : "FAIL", sizeof cases / sizeof cases[0], sizeof bad / sizeof bad[0]);
    ds_tokenizer_free(tok);
    gguf_close(gg);
}

/* ---- requests ------------------------------------------------------------------------------ */
static int parse(const api_limits *L, int chat, const char *body, api_request *r, api_error *e) {
    return api_parse(L, chat, body, strlen(body), r, e);
}

static void test_requests(const dspark_model *m, const dspark_grammar *json) {
    chat_tmpl chat;
    chat_tmpl_init(&chat, NULL, CHAT_CHATML);
    api_limits L = { m, "dspark-tiny", &chat, 512, 64, 8, json, 1 };
    api_request r;
    api_error e;
    /* defaults: OpenAI's temperature 1 and max_tokens 16; no seed: a random one */
    CHECK(!parse(&L, 0, "{\"prompt\": \"The river\"}", &r, &e), "minimal: %s", e.message);
    const uint64_t s1 = r.gp.seed;
    CHECK(r.gp.temperature == 1.0f && r.gp.max_tokens == 16 && r.seed_random && r.gp.speculative == 1 && r.n_prompt == 2 && !r.stream &&
          r.n == 1 && s1 < (1ull << 52), "defaults");
    api_request_free(&r);
    parse(&L, 0, "{\"prompt\": \"The river\"}", &r, &e);
    CHECK(r.gp.seed != s1, "two requests without a seed must get two seeds");
    api_request_free(&r);
    CHECK(!parse(&L, 0, "{\"prompt\": [10, 20, 30], \"max_tokens\": 7, \"temperature\": 0, \"top_k\": 5, \"top_p\": 0.5, "
                        "\"min_p\": 0.1, \"seed\": -42, \"speculative\": false, \"draft_max\": 3, \"ignore_eos\": true, "
                        "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"echo\": true, \"n\": 3, \"best_of\": 3, "
                        "\"stop\": [\"a\", \"\\n\\n\"], \"presence_penalty\": 0.5, \"frequency_penalty\": -1, \"user\": \"u\", "
                        "\"logit_bias\": {\"13\": -100, \"14\": 2.5}, \"cache_prompt\": true, \"typical_p\": 1, \"id_slot\": -1}", &r, &e),
          "all fields: %s", e.message);
    CHECK(r.n_prompt == 3 && r.prompt[2] == 30 && r.gp.max_tokens == 7 && r.gp.temperature == 0 && r.gp.top_k == 5 && r.gp.top_p == 0.5f &&
          r.gp.min_p == 0.1f && r.gp.seed == (uint64_t)-42 && !r.seed_random && !r.gp.speculative && r.gp.draft_max == 3 &&
          !r.gp.stop_at_eog && r.stream && r.include_usage && r.echo && r.echo_text && r.n == 3 && r.stop.n == 2 && r.stop.len[1] == 2 &&
          r.gp.presence_penalty == 0.5f && r.gp.frequency_penalty == -1.0f && r.n_bias == 2 && r.bias[0].token == 13 &&
          r.bias[0].bias == -100.0f && r.gp.logit_bias == r.bias, "fields read");
    api_request_free(&r);
    /* llama-server spellings: n_predict, [[id, false]] bias, n_probs, grammar, json_schema */
    CHECK(!parse(&L, 0, "{\"prompt\": \"x\", \"n_predict\": 40, \"logit_bias\": [[13, false], [\"river\", 1]], \"n_probs\": 4, "
                        "\"grammar\": \"root ::= [a-z]+\"}", &r, &e), "llama-server fields: %s", e.message);
    CHECK(r.gp.max_tokens == 40 && r.n_bias >= 2 && r.bias[0].bias == -INFINITY && r.logprobs && r.top_logprobs == 4 && r.grammar &&
          !strcmp(r.format, "grammar"), "llama-server fields read");
    api_request_free(&r);
    CHECK(!parse(&L, 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"response_format\": {\"type\": \"json_schema\", "
                        "\"json_schema\": {\"name\": \"x\", \"strict\": true, \"schema\": {\"type\": \"object\", \"properties\": "
                        "{\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"]}}}, \"logprobs\": true, \"top_logprobs\": 2}", &r, &e),
          "json_schema: %s", e.message);
    CHECK(r.grammar && !r.grammar_shared && !strcmp(r.format, "json_schema") && r.logprobs && r.top_logprobs == 2 && r.gp.grammar, "schema read");
    api_request_free(&r);
    CHECK(!parse(&L, 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"response_format\": {\"type\": \"json_object\"}}", &r, &e) &&
          r.grammar == json && r.grammar_shared, "json_object uses the shared grammar");
    api_request_free(&r);
    /* chat: default max_tokens is the server's limit; content parts; developer */
    CHECK(!parse(&L, 1, "{\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
                        "[{\"type\": \"text\", \"text\": \"Hi\"}, {\"type\": \"text\", \"text\": \" there\"}]}], \"tools\": [], "
                        "\"tool_choice\": \"none\", \"store\": false, \"metadata\": {\"k\": \"v\"}, \"chat_template_kwargs\": "
                        "{\"enable_thinking\": false}}", &r, &e), "chat: %s", e.message);
    CHECK(r.gp.max_tokens == 64 && r.chat && r.n_prompt > 4, "chat defaults");
    api_request_free(&r);
    /* refused, each with the field named */
    static const struct { int chat; const char *body, *param; int status; } bad[] = {
        { 0, "{\"prompt\": \"x\", \"temperature\": \"hot\"}", "temperature", 400 },
        { 0, "{\"prompt\": \"x\", \"model\": \"other\"}", "model", 404 },
        { 0, "{\"prompt\": \"x\", \"max_tokens\": 65}", "max_tokens", 400 },
        { 0, "{\"prompt\": \"x\", \"mystery\": 1}", "mystery", 400 },
        { 0, "{\"prompt\": \"x\", \"messages\": []}", "messages", 400 },
        { 0, "{\"prompt\": \"x\", \"top_p\": 5e-324}", "top_p", 400 },
        { 0, "{\"prompt\": \"x\", \"top_p\": 1e-46}", "top_p", 400 },
        { 0, "{\"prompt\": \"x\", \"n\": 9}", "n", 400 },
        { 0, "{\"prompt\": \"x\", \"best_of\": 2}", "best_of", 400 },
        { 0, "{\"prompt\": \"x\", \"repeat_penalty\": 1.1}", "repeat_penalty", 400 },
        { 0, "{\"prompt\": \"x\", \"mirostat\": 2}", "mirostat", 400 },
        { 0, "{\"prompt\": \"x\", \"logprobs\": 6}", "logprobs", 400 },
        { 0, "{\"prompt\": \"x\", \"logit_bias\": {\"99999\": 1}}", "logit_bias", 400 },
        { 0, "{\"prompt\": \"x\", \"logit_bias\": {\"13\": 101}}", "logit_bias", 400 },
        { 0, "{\"prompt\": \"x\", \"stop\": [\"\"]}", "stop", 400 },
        { 0, "{\"prompt\": \"x\", \"stop\": 5}", "stop", 400 },
        { 0, "{\"prompt\": \"x\", \"n_predict\": 5, \"max_tokens\": 6}", "n_predict", 400 },
        { 0, "{\"prompt\": \"x\", \"grammar\": \"root ::= root\"}", "grammar", 400 },
        { 0, "{\"prompt\": \"x\", \"grammar\": \"root ::= [a]\", \"ignore_eos\": true}", "ignore_eos", 400 },
        { 0, "{\"prompt\": \"x\", \"presence_penalty\": 2.5}", "presence_penalty", 400 },
        { 0, "{\"prompt\": \"x\", \"seed\": 1e17}", "seed", 400 },
        { 0, "{\"prompt\": \"x\", \"store\": true}", "store", 400 },
        { 0, "{\"prompt\": \"x\", \"id_slot\": 0}", "id_slot", 400 },
        { 0, "{\"prompt\": \"x\", \"top_logprobs\": 2}", "top_logprobs", 400 },
        { 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}]}", "tools", 400 },
        { 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\", "
             "\"json_schema\": {\"schema\": {\"type\": \"string\", \"format\": \"email\"}}}}", "response_format", 400 },
        { 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}", "top_logprobs", 400 },
        { 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}]}", "messages", 400 },
        { 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"y\"}]}", "messages", 400 },
        { 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"reasoning_format\": \"bogus\"}", "reasoning_format", 400 },
        { 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": {\"tools\": 1}}", "chat_template_kwargs", 400 },
        { 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"echo\": true}", "echo", 400 },
    };
    int all = 1;
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        int rc = parse(&L, bad[b].chat, bad[b].body, &r, &e);
        int good = rc && e.status == bad[b].status && !strcmp(e.param, bad[b].param);
        CHECK(good, "bad request %zu (%s): status %d param '%s': %s", b, bad[b].body, e.status, e.param, e.message);
        all &= good;
    }
    printf("%s request_fields_refused cases=%zu\n", all ? "PASS" : "FAIL", sizeof bad / sizeof bad[0]);
    /* every float field, every hostile number: a 400 naming the field or a
     * value the engine takes */
    static const char *const fields[] = { "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty" };
    static const char *const nums[] = { "5e-324", "1e-46", "-0.0", "1e308", "-1e308", "1.0000001", "2.0000001", "-2.0000001", "0", "1" };
    dspark_ctx *ctx = dspark_ctx_new(m, NULL, NULL);
    int hostile = 1, n_ok = 0, n_bad = 0;
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
        for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
            char body[200];
            snprintf(body, sizeof body, "{\"prompt\": \"x\", \"max_tokens\": 1, \"%s\": %s}", fields[f], nums[k]);
            if (parse(&L, 0, body, &r, &e)) {
                hostile &= e.status == 400 && !strcmp(e.param, fields[f]);
                n_bad++;
                continue;
            }
            dspark_error de;
            dspark_status rc = dspark_generate(ctx, r.prompt, r.n_prompt, &r.gp, NULL, NULL, &de);
            CHECK(rc == DSPARK_OK, "%s=%s passed validation but the engine says: %s", fields[f], nums[k], de.message);
            hostile &= rc == DSPARK_OK;
            n_ok++;
            api_request_free(&r);
        }
    dspark_ctx_free(ctx);
    printf("%s hostile_numbers accepted=%d refused=%d\n", hostile ? "PASS" : "FAIL", n_ok, n_bad);
    /* the body is JSON text only */
    static const char *const frames[] = { "\x01{\"prompt\": \"x\"}", "{\"prompt\": \"x\"}\x01", "{\"prompt\": \"a\\u0000b\"}",
                                          "{\"prompt\": \"a\tb\"}", "{\"prompt\": \"x\"} {}", "" };
    int fr = 1;
    for (size_t k = 0; k < sizeof frames / sizeof frames[0]; k++) fr &= parse(&L, 0, frames[k], &r, &e) && e.status == 400;
    CHECK(fr, "framing");
    CHECK(!parse(&L, 0, " \r\n{\"prompt\": \"x\\\\u0000\"}\n ", &r, &e), "an escaped backslash before u0000 is text: %s", e.message);
    api_request_free(&r);
    printf("%s json_body_framing cases=%zu\n", fr ? "PASS" : "FAIL", sizeof frames / sizeof frames[0]);
    chat_tmpl_free(&chat);
}

static void test_responses(const dspark_model *m) {
    chat_tmpl chat;
    chat_tmpl_init(&chat, NULL, CHAT_PLAIN);
    api_limits L = { m, "dspark-tiny", &chat, 512, 64, 8, NULL, 1 };
    api_request r;
    api_error e;
    CHECK(!parse(&L, 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"stream\": true, \"logprobs\": true, \"top_logprobs\": 1, "
                        "\"seed\": 7}", &r, &e), "parse: %s", e.message);
    api_meta meta = { "chatcmpl-1", 1700000000, "dspark-tiny", "canonical" };
    dspark_stats st;
    memset(&st, 0, sizeof st);
    st.n_prompt = 3; st.n_generated = 2; st.stop = "eog"; st.speculative = 1; st.draft_max = 2; st.rounds = 1;
    st.drafted = 2; st.accepted = 1; st.accept_hist[0] = 1; st.mean_accepted_len = 2;
    api_tok toks[2] = { { 13, 0, 2, -0.5f, 1, { 13 }, { -0.5f } }, { 14, 2, 1, -1.25f, 1, { 15 }, { -0.75f } } };
    api_choice c = { 0, "ok\xc3", 3, 3, toks, 2, "stop", &st, 7 };
    char *full = api_response_json(&L, &r, &meta, &c, 1);
    CHECK(full && strstr(full, "\"content\":\"ok\xef\xbf\xbd\"") && strstr(full, "\"finish_reason\":\"stop\"") &&
          strstr(full, "\"completion_tokens\":2,") && strstr(full, "\"seed\":7,") &&
          strstr(full, "\"accept_hist\":[1,0]") && strstr(full, "\"logprob\":-1.25") && strstr(full, "\"top_logprobs\":[{\"token\""),
          "full response: %s", full ? full : "");
    free(full);
    /* a stop string cut: the text ends there, and so do the logprobs */
    api_choice cut = { 0, "okXY", 4, 2, toks, 2, "stop", &st, 7 };
    full = api_response_json(&L, &r, &meta, &cut, 1);
    cJSON *j = full ? cJSON_Parse(full) : NULL;
    const cJSON *lp = j ? cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs") : NULL;
    CHECK(j && strstr(full, "\"content\":\"ok\"") && cJSON_GetArraySize(cJSON_GetObjectItem(lp, "content")) == 1 && strstr(full, "\"stop\":\"stop_string\""),
          "cut response: %s", full ? full : "");
    cJSON_Delete(j);
    free(full);
    sbuf o = { 0 };
    api_stream_delta(&o, &L, &r, &meta, &c, "o", 1, 1, 0, 1);
    api_stream_final(&o, &r, &meta, &c);
    CHECK(o.p && !strncmp(o.p, "data: {", 7) && strstr(o.p, "\"delta\":{\"role\":\"assistant\",\"content\":\"o\"}") &&
          strstr(o.p, "\"object\":\"chat.completion.chunk\"") && strstr(o.p, "\"finish_reason\":\"stop\"") &&
          strstr(o.p, "}\n\ndata: {") && o.len > 2 && !strcmp(o.p + o.len - 2, "\n\n"), "stream events: %s", o.p ? o.p : "");
    sbuf_free(&o);
    api_request_free(&r);
    chat_tmpl_free(&chat);
    PASS("response_shapes");
}

static void test_tokenize(const dspark_model *m) {
    api_limits L = { m, "dspark-tiny", NULL, 512, 64, 8, NULL, 1 };
    api_error e;
    char *t = api_tokenize(&L, "{\"content\": \"The river\", \"with_pieces\": true}", 45, &e);
    CHECK(t && strstr(t, "{\"tokens\":[{\"id\":") && strstr(t, "\"piece\":\" river\""), "tokenize: %s", t ? t : e.message);
    free(t);
    t = api_tokenize(&L, "{\"content\": \"The river\"}", 24, &e);
    cJSON *j = t ? cJSON_Parse(t) : NULL, *toks = j ? cJSON_GetObjectItem(j, "tokens") : NULL;
    char body[200];
    snprintf(body, sizeof body, "{\"tokens\": [%d, %d]}", (int)cJSON_GetArrayItem(toks, 0)->valuedouble, (int)cJSON_GetArrayItem(toks, 1)->valuedouble);
    char *d = api_detokenize(&L, body, strlen(body), &e);
    CHECK(d && !strcmp(d, "{\"content\":\"The river\"}"), "detokenize: %s", d ? d : e.message);
    free(d); free(t); cJSON_Delete(j);
    CHECK(!api_detokenize(&L, "{\"tokens\": [99999]}", 19, &e) && e.status == 400 && !api_tokenize(&L, "{\"text\": \"x\"}", 13, &e) &&
          !strcmp(e.param, "text"), "tokenize errors");
    PASS("tokenize_endpoints");
}


/* ---- Jinja ------------------------------------------------------------------ */
static void test_jinja(void) {
    int ok = 1;
    for (size_t i = 0; i < sizeof jinja_cases / sizeof jinja_cases[0]; i++) {
        char err[400];
        jinja_tmpl *t = jinja_parse(jinja_templates[jinja_cases[i].tmpl], err, sizeof err);
        CHECK(t != NULL, "case %zu: parse: %s", i, err);
        if (!t) { ok = 0; continue; }
        cJSON *vars = cJSON_Parse(jinja_cases[i].vars);
        size_t n = 0;
        char *out = jinja_render(t, vars, 1 << 20, &n, err, sizeof err);
        int good = jinja_cases[i].want ? out && n == strlen(jinja_cases[i].want) && !memcmp(out, jinja_cases[i].want, n)
                                        : !out && strstr(err, jinja_cases[i].raises) != NULL;
        CHECK(good, "case %zu (template %d): got %s%s%s", i, jinja_cases[i].tmpl, out ? "\n" : "error: ", out ? out : err, out ? "<<end" : "");
        ok &= good;
        free(out);
        cJSON_Delete(vars);
        jinja_free(t);
    }
    printf("%s jinja_vs_jinja2 cases=%zu\n", ok ? "PASS" : "FAIL", sizeof jinja_cases / sizeof jinja_cases[0]);

    /* hostile templates: each a parse or render error naming why, bounded in time and memory */
    static const char *const hostile[] = {
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = ns.l + [m, m, i] %}{% endfor %}",
        "{% for i in range(100000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}",
        "{{ range(1000000000) }}", "{{ 'ab' * 3 }}", "{{ 2 ** 100000 }}", "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
        "{% macro g(n) %}{{ g(n) ~ g(n) }}{% endmacro %}{{ g(1) }}", "{% filter upper %}x{% endfilter %}", "{{ x",
        "{% for x in y %}", "{% endif %}", "{% if %}", "{{ 1 / 0 }}", "{{ 5 % 0 }}", "{{ foo(1) }}", "{{ 'a' | bogus }}",
        "{% break %}", "{{ m[1:2:0] }}", "{% set m.x = 1 %}", "{{ 1 < 'a' }}", "{{ 'a' in 3 }}", "{% raw %}x{% endraw %}",
        "{{ raise_exception('no') }}", "{% for a, b in [1, 2] %}{% endfor %}", "{{ 'x'.nomethod() }}", "{{ }}", "{% %}",
        "{# never closed", "{{ '\\u", "{{ (1, }}", "{{ [1,2,3][:::] }}", "{% set x %}y{% endset %}",
    };
    int refused = 0;
    for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++) {
        char err[400] = "";
        jinja_tmpl *t = jinja_parse(hostile[i], err, sizeof err);
        char *out = NULL;
        if (t) {
            cJSON *vars = cJSON_Parse("{\"m\": [{\"role\": \"user\", \"content\": \"0123456789012345678901234567890123456789\"}]}");
            out = jinja_render(t, vars, 1 << 20, NULL, err, sizeof err);
            cJSON_Delete(vars);
            jinja_free(t);
        }
        const int one_line = err[0] && !strchr(err, '\n');
        CHECK(!out && one_line, "hostile %zu (%s): %s", i, hostile[i], out ? "rendered" : err);
        refused += !out && one_line;
        free(out);
    }
    /* nesting past the parser's depth */
    sbuf deep = { 0 };
    for (int i = 0; i < 5000; i++) sbuf_adds(&deep, "{% if 1 %}");
    sbuf_adds(&deep, "{{ ");
    for (int i = 0; i < 5000; i++) sbuf_adds(&deep, "(");
    sbuf_adds(&deep, "1 }}");
    char err[400];
    jinja_tmpl *t = jinja_parse(deep.p, err, sizeof err);
    CHECK(!t && strstr(err, "nested too deeply"), "deep nesting: %s", t ? "parsed" : err);
    jinja_free(t);
    sbuf_free(&deep);
    printf("%s jinja_hostile refused=%d of %zu, nesting bounded\n", refused == (int)(sizeof hostile / sizeof hostile[0]) ? "PASS" : "FAIL",
           refused, sizeof hostile / sizeof hostile[0]);
}

/* ---- the reply's parts ---------------------------------------------------------- */
static void check_split(const char *text, int think_open, int tools, const char *reasoning, const char *content, int n_calls,
                        const char *calls_json) {
    const size_t n = strlen(text);
    chat_split f;
    chat_split_text(text, n, 1, think_open, 1, tools, &f);
    char *cj = f.calls ? cJSON_PrintUnformatted(f.calls) : NULL;
    CHECK(!strcmp(f.reasoning.p, reasoning) && (content ? !f.content_null && !strcmp(f.content.p, content) : f.content_null) &&
          f.n_calls == n_calls && (!calls_json || (cj && !strcmp(cj, calls_json))),
          "split(%s): reasoning '%s' content '%s'%s calls %d %s", text, f.reasoning.p, f.content.p, f.content_null ? " (null)" : "",
          f.n_calls, cj ? cj : "");
    free(cj);
    /* every prefix (a stream cut anywhere) splits into prefixes of the final fields */
    int prefix_ok = 1;
    for (size_t cut = 0; cut <= n; cut++) {
        chat_split p;
        chat_split_text(text, cut, 0, think_open, 1, tools, &p);
        prefix_ok &= p.reasoning.len <= f.reasoning.len && !memcmp(p.reasoning.p, f.reasoning.p, p.reasoning.len) &&
                     p.content.len <= f.content.len && !memcmp(p.content.p, f.content.p, p.content.len) && p.n_calls <= f.n_calls;
        chat_split_free(&p);
    }
    CHECK(prefix_ok, "split(%s): a prefix's split is not a prefix of the final one", text);
    chat_split_free(&f);
}

static void test_split(void) {
    check_split("plain answer\n", 0, 0, "", "plain answer\n", 0, NULL);
    check_split("<think>\nstep 1\n</think>\n\nThe answer.", 0, 0, "step 1", "The answer.", 0, NULL);
    check_split("\n<think>a</think>b", 0, 0, "a", "b", 0, NULL);
    check_split("reasoning only, opened by the prompt\n</think>\n\nDone.", 1, 0, "reasoning only, opened by the prompt", "Done.", 0, NULL);
    check_split("<think>never closed", 0, 0, "never closed", "", 0, NULL);
    check_split("text then <think>x</think> stays", 0, 0, "", "text then <think>x</think> stays", 0, NULL);
    check_split("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", 0, 1, "", NULL, 1,
                "[{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}]");
    check_split("<think>which tool</think>Let me look.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
                "<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"k\\\": 1}\"}</tool_call>\n", 0, 1, "which tool", "Let me look.", 2,
                "[{\"name\":\"a\",\"arguments\":\"{}\"},{\"name\":\"b\",\"arguments\":\"{\\\"k\\\": 1}\"}]");
    check_split("<tool_call>not json</tool_call> after", 0, 1, "", "<tool_call>not json</tool_call> after", 0, NULL);
    check_split("<tool_call>{\"name\": \"a\"} trailing</tool_call>", 0, 1, "", "<tool_call>{\"name\": \"a\"} trailing</tool_call>", 0, NULL);
    check_split("open <tool_call>{\"name\": \"a\"", 0, 1, "", "open <tool_call>{\"name\": \"a\"", 0, NULL);
    check_split("no calls, trailing blanks kept  \n", 0, 1, "", "no calls, trailing blanks kept  \n", 0, NULL);
    check_split("<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>", 0, 0, "", "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>", 0, NULL);
    PASS("reply_split prefixes=every byte");
}

/* ---- a template through the request layer --------------------------------------------------- */
static void test_jinja_api(const dspark_model *m) {
    chat_tmpl chat;
    CHECK(!chat_tmpl_load(&chat, jinja_templates[0], CHAT_NONE, 1, m) && chat.jt && !strcmp(chat_tmpl_source(&chat), "jinja"),
          "load: %s", chat.jinja_why);
    api_limits L = { m, "dspark-tiny", &chat, 512, 64, 8, NULL, 1 };
    api_request r;
    api_error e;
    static const char *const good[] = {
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Oslo?\"}], \"tools\": [{\"type\": \"function\", \"function\": "
        "{\"name\": \"get_weather\", \"description\": \"now\", \"parameters\": {\"type\": \"object\"}}}], \"tool_choice\": \"auto\"}",
        "{\"messages\": [{\"role\": \"developer\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Q\"}]}, "
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": "
        "{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"}], "
        "\"chat_template_kwargs\": {\"enable_thinking\": false}}",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        CHECK(!parse(&L, 1, good[i], &r, &e), "jinja request %zu: %s", i, e.message);
        CHECK(r.n_prompt > 8 && r.tools == (i == 0) && r.reasoning, "jinja request %zu: prompt %d tools %d", i, r.n_prompt, r.tools);
        api_request_free(&r);
    }
    static const struct { const char *body, *param; } bad[] = {
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}]}", "tools" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", "tools" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"required\"}", "tool_choice" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}]}", "messages" },
        { "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": [{\"function\": {\"name\": 3}}]}, "
          "{\"role\": \"user\", \"content\": \"y\"}]}", "messages" },
        { "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", "messages" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": {\"enable_thinking\": 1}}", "chat_template_kwargs" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = parse(&L, 1, bad[i].body, &r, &e);
        CHECK(rc && e.status == 400 && !strcmp(e.param, bad[i].param), "jinja bad %zu: rc %d param '%s': %s", i, rc, e.param, e.message);
        if (!rc) api_request_free(&r);
    }
    /* a reply with reasoning and a call, whole and streamed byte by byte */
    CHECK(!parse(&L, 1, good[0], &r, &e), "parse: %s", e.message);
    r.stream = 1;
    r.ss = calloc(1, sizeof *r.ss);
    api_meta meta = { "chatcmpl-9", 1700000000, "dspark-tiny", "canonical" };
    dspark_stats st;
    memset(&st, 0, sizeof st);
    st.n_generated = 5;
    st.stop = "eog";
    const char *reply = "<think>use the tool</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    api_choice c = { 0, reply, strlen(reply), strlen(reply), NULL, 0, "stop", &st, 1 };
    char *full = api_response_json(&L, &r, &meta, &c, 1);
    cJSON *j = full ? cJSON_Parse(full) : NULL;
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), *msg = cJSON_GetObjectItem(ch, "message");
    const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0), *fn = cJSON_GetObjectItem(call, "function");
    CHECK(j && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason")), "tool_calls") &&
          !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content")), "Checking.") &&
          !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(msg, "reasoning_content")), "use the tool") &&
          !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(call, "type")), "function") &&
          !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(call, "id")), "call_9_0_0") &&
          !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(fn, "name")), "get_weather") &&
          !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(fn, "arguments")), "{\"city\":\"Oslo\"}"),
          "tool-call response: %s", full ? full : "");
    sbuf o = { 0 };
    for (size_t i = 0; i < strlen(reply); i++) api_stream_delta(&o, &L, &r, &meta, &c, reply + i, 1, i == 0, 0, 0);
    api_stream_final(&o, &r, &meta, &c);
    /* the deltas add up to the message */
    sbuf rs = { 0 }, cs = { 0 };
    sbuf_add(&rs, "", 0);
    sbuf_add(&cs, "", 0);
    int n_calls = 0, finish_ok = 0;
    for (char *p = o.p; p && (p = strstr(p, "data: ")); p += 6) {
        char *end = strstr(p, "\n\n");
        cJSON *ev = end ? cJSON_ParseWithLength(p + 6, (size_t)(end - p - 6)) : NULL;
        const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(ev, "choices"), 0), *d = cJSON_GetObjectItem(c0, "delta");
        const char *rp = cJSON_GetStringValue(cJSON_GetObjectItem(d, "reasoning_content")), *cp = cJSON_GetStringValue(cJSON_GetObjectItem(d, "content"));
        if (rp) sbuf_adds(&rs, rp);
        if (cp) sbuf_adds(&cs, cp);
        const cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "tool_calls"), 0);
        if (tc) n_calls += cJSON_GetObjectItem(tc, "index") && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(tc, "function"), "arguments")),
                                                                       "{\"city\":\"Oslo\"}");
        const char *fr = cJSON_GetStringValue(cJSON_GetObjectItem(c0, "finish_reason"));
        if (fr) finish_ok = !strcmp(fr, "tool_calls");
        cJSON_Delete(ev);
    }
    CHECK(!strcmp(rs.p, "use the tool") && !strcmp(cs.p, "Checking.") && n_calls == 1 && finish_ok,
          "stream adds up: reasoning '%s' content '%s' calls %d finish %d", rs.p, cs.p, n_calls, finish_ok);
    sbuf_free(&rs);
    sbuf_free(&cs);
    sbuf_free(&o);
    cJSON_Delete(j);
    free(full);
    api_request_free(&r);
    /* reasoning_format none: the tags stay in the content */
    CHECK(!parse(&L, 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"reasoning_format\": \"none\"}", &r, &e), "parse: %s", e.message);
    api_choice c2 = { 0, "<think>a</think>b", 17, 17, NULL, 0, "stop", &st, 1 };
    full = api_response_json(&L, &r, &meta, &c2, 1);
    CHECK(full && strstr(full, "\"content\":\"<think>a</think>b\"") && !strstr(full, "reasoning_content"), "reasoning none: %s", full ? full : "");
    free(full);
    api_request_free(&r);
    chat_tmpl_free(&chat);
    /* bos_token / eos_token spelled as the vocabulary has them: the
     * Mistral-style template puts eos after each answer, which must
     * tokenize to the EOS id itself */
    chat_tmpl ms;
    CHECK(!chat_tmpl_load(&ms, jinja_templates[2], CHAT_NONE, 1, m) && ms.jt && ms.eos_text && !strcmp(ms.eos_text, "<|endoftext|>"),
          "mistral-style load: %s eos '%s'", ms.jinja_why, ms.eos_text ? ms.eos_text : "(null)");
    api_limits LM = { m, "dspark-tiny", &ms, 512, 64, 8, NULL, 1 };
    CHECK(!parse(&LM, 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, "
                         "{\"role\": \"user\", \"content\": \"c\"}]}", &r, &e), "mistral-style request: %s", e.message);
    int n_eos = 0;
    for (int i = 0; i < r.n_prompt; i++) n_eos += r.prompt[i] == dspark_model_eos(m);
    CHECK(r.n_prompt > 0 && r.prompt[0] == dspark_model_eos(m) && n_eos == 2, "bos + eos as ids: first %d, %d of them",
          r.n_prompt ? r.prompt[0] : -1, n_eos);
    api_request_free(&r);
    CHECK(parse(&LM, 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"c\"}]}", &r, &e) &&
          e.status == 400 && strstr(e.message, "roles must alternate"), "raise_exception -> 400: %s", e.message);
    chat_tmpl_free(&ms);
    /* a template this interpreter refuses: the built-in family stays, and says why */
    chat_tmpl fb;
    chat_tmpl_load(&fb, "{% filter upper %}x{% endfilter %}<|im_start|>{{ messages[0].content }}<|im_end|>", CHAT_NONE, 1, m);
    CHECK(!fb.jt && fb.kind == CHAT_CHATML && strstr(fb.jinja_why, "filter") && !strcmp(chat_tmpl_source(&fb), "builtin"), "fallback: %s", fb.jinja_why);
    chat_tmpl_free(&fb);
    chat_tmpl_load(&fb, jinja_templates[0], CHAT_NONE, 0, m);
    CHECK(!fb.jt && !strcmp(fb.jinja_why, "--no-jinja"), "--no-jinja: %s", fb.jinja_why);
    chat_tmpl_free(&fb);
    PASS("jinja_api tools, tool messages, tool_calls, reasoning_content, stream == whole, fallback");
}

int main(void) {
    test_utf8();
    test_stop();
    test_errors();
    test_chat();
    test_jinja();
    test_split();
    test_schema();
    dspark_model_params mp;
    dspark_model_params_default(&mp);
    mp.model_path = tu_shipped_target();
    mp.drafter_path = "models/dspark-tiny-drafter-f16.gguf";
    dspark_error err;
    dspark_model *m = dspark_model_load(&mp, &err);
    CHECK(m != NULL, "load: %s", err.message);
    if (m) {
        dspark_grammar *json = dspark_grammar_new(m, dspark_grammar_json_object(), strlen(dspark_grammar_json_object()), &err);
        test_requests(m, json);
        test_responses(m);
        test_tokenize(m);
        test_jinja_api(m);
        dspark_grammar_free(json);
        dspark_model_free(m);
    }
    return tu_finish("test_serve_req");
}
