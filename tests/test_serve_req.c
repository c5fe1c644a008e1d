/* test_serve_req.c — the OpenAI layer of `dspark serve` without HTTP:
 * UTF-8 repair (incremental == whole, for every split point of byte strings
 * with truncated, overlong, surrogate and stray bytes), chat templates,
 * request validation (types, ranges, defaults, token-id prompts, echo) and
 * the shape of responses and stream events. The server's source is compiled
 * in directly (it is part of the dspark binary, not of libdspark). */
#include "../tools/serve_req.c"
#include "testutil.h"

#define TARGET_Q8  "models/dspark-tiny-q8_0.gguf"
#define TARGET_F16 "models/dspark-tiny-f16.gguf"

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
        /* valid UTF-8 out, and unchanged when the input was valid */
        for (size_t i = 0; i < whole.len;) {
            int k = utf8_seq((const unsigned char *)whole.p + i, whole.len - i);
            if (k <= 0) { ok = 0; break; }
            i += (size_t)k;
        }
        if (c < 2) ok &= whole.len == len && !memcmp(whole.p, s, len);
        /* feed it in two pieces split anywhere, and byte by byte */
        for (size_t cut = 0; cut <= len; cut++) {
            sbuf inc = { 0 };
            sbuf_add(&inc, "", 0);
            size_t used = utf8_take(s, cut, 0, &inc);
            used += utf8_take(s + used, len - used, 1, &inc);
            ok &= used == len && inc.len == whole.len && !memcmp(inc.p, whole.p, whole.len);
            sbuf_free(&inc);
            n++;
        }
        sbuf inc = { 0 };
        sbuf_add(&inc, "", 0);
        size_t used = 0;
        for (size_t have = 1; have <= len; have++) used += utf8_take(s + used, have - used, have == len, &inc);
        if (!len) used = utf8_take(s, 0, 1, &inc);
        ok &= used == len && inc.len == whole.len && !memcmp(inc.p, whole.p, whole.len);
        sbuf_free(&inc);
        sbuf_free(&whole);
    }
    CHECK(ok, "utf8_take: incremental differs from whole, or output not valid UTF-8");
    printf("%s utf8_incremental_equals_whole cases=%d\n", ok ? "PASS" : "FAIL", n);
}

static void test_chat(void) {
    CHECK(chat_detect(NULL) == CHAT_NONE, "no template");
    CHECK(chat_detect("{% for m in messages %}<|im_start|>{{m.role}}\n{{m.content}}<|im_end|>{% endfor %}") == CHAT_CHATML, "chatml");
    CHECK(chat_detect("<|start_header_id|>{{ role }}<|end_header_id|>{{ content }}<|eot_id|>") == CHAT_LLAMA3, "llama3");
    CHECK(chat_detect("[INST] {{ content }} [/INST]") == CHAT_NONE, "unknown");
    const char *role[] = { "system", "user", "assistant", "user" }, *content[] = { "Be brief.", "Hi", "Hello.", "Bye" };
    sbuf o = { 0 };
    chat_render(CHAT_CHATML, role, content, 4, &o);
    CHECK(!strcmp(o.p, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
                       "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"), "chatml render: %s", o.p);
    sbuf_free(&o);
    chat_render(CHAT_PLAIN, role, content, 4, &o);
    CHECK(!strcmp(o.p, "Be brief.\n\nUser: Hi\nAssistant: Hello.\nUser: Bye\nAssistant:"), "plain render: %s", o.p);
    sbuf_free(&o);
    PASS("chat_templates");
}

static int parse(const api_limits *L, int chat, const char *body, api_request *r, api_error *e) {
    return api_parse(L, chat, body, strlen(body), r, e);
}

static void test_requests(const dspark_model *m) {
    api_limits L = { m, "dspark-tiny", CHAT_CHATML, "no template", 512, 64 };
    api_request r;
    api_error e;
    /* defaults: OpenAI's temperature 1 and max_tokens 16; seed 0 */
    CHECK(!parse(&L, 0, "{\"prompt\": \"The river\", \"unknown_field\": {\"x\": [1]}}", &r, &e), "minimal: %s", e.message);
    CHECK(r.gp.temperature == 1.0f && r.gp.max_tokens == 16 && r.gp.seed == 0 && r.gp.speculative == 1 && r.n_prompt == 2 &&
          !r.stream, "defaults");
    api_request_free(&r);
    CHECK(!parse(&L, 0, "{\"prompt\": [10, 20, 30], \"max_tokens\": 7, \"temperature\": 0, \"top_k\": 5, \"top_p\": 0.5, "
                        "\"min_p\": 0.1, \"seed\": 42, \"speculative\": false, \"draft_max\": 3, \"ignore_eos\": true, "
                        "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"echo\": true, \"n\": 1, "
                        "\"stop\": null, \"logprobs\": null, \"presence_penalty\": 0, \"user\": \"u\"}", &r, &e),
          "all fields: %s", e.message);
    CHECK(r.n_prompt == 3 && r.prompt[2] == 30 && r.gp.max_tokens == 7 && r.gp.temperature == 0 && r.gp.top_k == 5 &&
          r.gp.top_p == 0.5f && r.gp.min_p == 0.1f && r.gp.seed == 42 && !r.gp.speculative && r.gp.draft_max == 3 &&
          !r.gp.stop_at_eog && r.stream && r.include_usage && r.echo && r.echo_text, "fields read");
    api_request_free(&r);
    /* chat: default max_tokens is the server's limit; content parts */
    CHECK(!parse(&L, 1, "{\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
                        "[{\"type\": \"text\", \"text\": \"Hi\"}, {\"type\": \"text\", \"text\": \" there\"}]}]}", &r, &e),
          "chat: %s", e.message);
    CHECK(r.gp.max_tokens == 64 && r.chat && r.n_prompt > 4, "chat defaults");
    api_request_free(&r);
    /* errors carry status, type and param */
    CHECK(parse(&L, 0, "{\"prompt\": \"x\", \"temperature\": \"hot\"}", &r, &e) && e.status == 400 &&
          !strcmp(e.param, "temperature") && !strcmp(e.type, "invalid_request_error"), "wrong type");
    CHECK(parse(&L, 0, "{\"prompt\": \"x\", \"model\": \"other\"}", &r, &e) && e.status == 404 && !strcmp(e.code, "model_not_found"),
          "model");
    CHECK(parse(&L, 0, "{\"prompt\": \"x\", \"max_tokens\": 65}", &r, &e) && e.status == 400 && strstr(e.message, "limit"), "limit");
    L.chat = CHAT_NONE;
    CHECK(parse(&L, 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", &r, &e) &&
          !strcmp(e.code, "chat_template_unsupported"), "no template");
    char *j = api_error_json(&e);
    CHECK(j && strstr(j, "{\"error\":{\"message\":") && strstr(j, "\"param\":\"messages\""), "error json: %s", j ? j : "");
    free(j);
    PASS("request_validation");
}

static void test_responses(const dspark_model *m) {
    api_limits L = { m, "dspark-tiny", CHAT_PLAIN, "", 512, 64 };
    api_request r;
    api_error e;
    CHECK(!parse(&L, 1, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"stream\": true}", &r, &e), "parse");
    api_meta meta = { "chatcmpl-1", 1700000000, "dspark-tiny", "canonical" };
    dspark_stats st;
    memset(&st, 0, sizeof st);
    st.n_prompt = 3; st.n_generated = 2; st.stop = "eog"; st.speculative = 1; st.draft_max = 2; st.rounds = 1;
    st.drafted = 2; st.accepted = 1; st.accept_hist[0] = 1; st.mean_accepted_len = 2;
    char *full = api_response_json(&r, &meta, "ok\xc3", 3, &st);
    CHECK(full && strstr(full, "\"content\":\"ok\xef\xbf\xbd\"") && strstr(full, "\"finish_reason\":\"stop\"") &&
          strstr(full, "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}") &&
          strstr(full, "\"accept_hist\":[1,0]"), "full response: %s", full ? full : "");
    free(full);
    sbuf o = { 0 };
    api_stream_delta(&o, &r, &meta, "o", 1, 1);
    api_stream_final(&o, &r, &meta, &st);
    CHECK(o.p && !strncmp(o.p, "data: {", 7) && strstr(o.p, "\"delta\":{\"role\":\"assistant\",\"content\":\"o\"}") &&
          strstr(o.p, "\"object\":\"chat.completion.chunk\"") && strstr(o.p, "\"finish_reason\":\"stop\"") &&
          strstr(o.p, "}\n\ndata: {") && o.len > 2 && !strcmp(o.p + o.len - 2, "\n\n"), "stream events: %s", o.p ? o.p : "");
    sbuf_free(&o);
    api_request_free(&r);
    PASS("response_shapes");
}

int main(void) {
    test_utf8();
    test_chat();
    dspark_model_params mp;
    dspark_model_params_default(&mp);
    FILE *f = fopen(TARGET_Q8, "rb");
    mp.model_path = f ? TARGET_Q8 : TARGET_F16;
    if (f) fclose(f);
    mp.drafter_path = "models/dspark-tiny-drafter-f16.gguf";
    dspark_error err;
    dspark_model *m = dspark_model_load(&mp, &err);
    CHECK(m != NULL, "load: %s", err.message);
    if (m) {
        test_requests(m);
        test_responses(m);
        dspark_model_free(m);
    }
    return tu_finish("test_serve_req");
}
