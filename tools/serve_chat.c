/* serve_chat.c — chat templates for `dspark serve` (serve.h).
 *
 * The GGUF's tokenizer.chat_template is Jinja, which dspark does not
 * interpret: it recognises the families people run from marker strings in
 * the template text (llama.cpp's built-in detection), reads the few
 * literals that change the prompt (a default system prompt, Llama 3.1's
 * knowledge-date header, DeepSeek-R1's opening <think>), and renders the
 * family's format itself. What it cannot render faithfully it refuses with
 * a line that says why (and how to force a template), so a chat request
 * never gets a wrong prompt silently. Formats (each family's published
 * prompt format):
 *   chatml    <|im_start|>ROLE\nTEXT<|im_end|>\n ... <|im_start|>assistant\n
 *   qwen3     chatml; earlier assistant turns lose their <think> part; with
 *             enable_thinking false the reply opens with an empty think block
 *   llama3    <|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|> (BOS
 *             first); 3.1+ open with a system turn that carries the
 *             knowledge and today's date lines
 *   llama2    [INST] <<SYS>>\nSYS\n<</SYS>>\n\nTEXT [/INST]ANSWER</s>[INST] ...
 *   mistral-v1/v3/v3-tekken  [INST] TEXT[/INST] ANSWER</s> (spacing per
 *             version), the system prompt before the last user turn
 *   mistral-v7  [SYSTEM_PROMPT] SYS[/SYSTEM_PROMPT][INST] TEXT[/INST] ANSWER</s>
 *   gemma     <start_of_turn>user\nTEXT<end_of_turn>\n<start_of_turn>model\n
 *             (a system prompt only where the template takes one: Gemma 3
 *             puts it before the first user turn)
 *   deepseek  ### Instruction:\nTEXT\n### Response:\n  (coder)
 *   deepseek2 User: TEXT\n\nAssistant:
 *   deepseek3 SYS<｜User｜>TEXT<｜Assistant｜>ANSWER<｜end▁of▁sentence｜>
 *   phi3      <|ROLE|>\nTEXT<|end|>\n ... <|assistant|>\n
 *   phi4      <|im_start|>ROLE<|im_sep|>TEXT<|im_end|> ... <|im_start|>assistant<|im_sep|>
 *   plain     SYSTEM\n\nUser: TEXT\nAssistant: ...\nAssistant:  (--chat-template only) */
#include "serve.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja.h"

static const char *const kind_names[CHAT_KIND_COUNT] = {
    "none", "chatml", "qwen3", "llama3", "llama2", "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7",
    "gemma", "deepseek", "deepseek2", "deepseek3", "phi3", "phi4", "plain",
};

const char *chat_kind_name(chat_kind k) { return k >= 0 && k < CHAT_KIND_COUNT ? kind_names[k] : "none"; }

chat_kind chat_kind_from_name(const char *name) {
    for (int k = 1; k < CHAT_KIND_COUNT; k++)
        if (!strcmp(name, kind_names[k])) return (chat_kind)k;
    return CHAT_NONE;
}

static int has(const char *t, const char *s) { return strstr(t, s) != NULL; }

/* The text of a Jinja string literal that starts right after `prefix` in t
 * and runs to `until` (exclusive): NULL when the span holds template logic
 * (quotes, braces) instead of literal text. Escapes \n \t \' \" \\ resolved. */
static char *literal_after(const char *t, const char *prefix, const char *until) {
    const char *a = strstr(t, prefix);
    if (!a) return NULL;
    a += strlen(prefix);
    const char *b = strstr(a, until);
    if (!b || b <= a) return NULL;
    for (const char *p = a; p < b; p++)
        if (*p == '{' || *p == '}' || ((*p == '\'' || *p == '"') && (p == a || p[-1] != '\\'))) return NULL;
    const size_t span = (size_t)(b - a);
    char *out = span < 4096 ? malloc(span + 1) : NULL, *o = out;
    if (!out) return NULL;
    for (const char *p = a; p < b; p++) {
        if (*p == '\\' && p + 1 < b) {
            p++;
            *o++ = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p;
        } else *o++ = *p;
    }
    *o = 0;
    return out;
}

void chat_tmpl_free(chat_tmpl *t) {
    free(t->default_system);
    free(t->knowledge);
    free(t->date);
    t->default_system = t->knowledge = t->date = NULL;
    jinja_free(t->jt);
    free(t->bos_text);
    free(t->eos_text);
    t->jt = NULL;
    t->bos_text = t->eos_text = NULL;
}

/* Family-level properties once the kind is known. */
static void family(chat_tmpl *t, const char *src) {
    const chat_kind k = t->kind;
    t->system_ok = 1;
    t->alternate = k == CHAT_LLAMA2 || k == CHAT_MISTRAL_V1 || k == CHAT_MISTRAL_V3 || k == CHAT_MISTRAL_V3_TEKKEN || k == CHAT_GEMMA;
    if (k == CHAT_GEMMA) t->system_ok = src ? has(src, "first_user_prefix") : 1;
    if (k == CHAT_LLAMA2 && src) {
        t->system_ok = has(src, "<<SYS>>");
        t->eos_space = has(src, "eos_token + ' '");
    }
    if (!src) {   /* forced by name: the family's plain form */
        t->bos = k == CHAT_LLAMA3 || k == CHAT_LLAMA2 || k == CHAT_MISTRAL_V1 || k == CHAT_MISTRAL_V3 ||
                 k == CHAT_MISTRAL_V3_TEKKEN || k == CHAT_MISTRAL_V7 || k == CHAT_GEMMA || k == CHAT_DEEPSEEK2 || k == CHAT_DEEPSEEK3;
        t->think = k == CHAT_QWEN3;
        return;
    }
    t->bos = has(src, "bos_token");
    t->think = k == CHAT_QWEN3 || (k == CHAT_DEEPSEEK3 && has(src, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c><think>\\n"));
}

int chat_tmpl_init(chat_tmpl *t, const char *src, chat_kind forced) {
    memset(t, 0, sizeof *t);
    if (forced != CHAT_NONE) {
        t->kind = forced;
        family(t, NULL);
        return 0;
    }
    static const char *const force = "; start the server with --chat-template NAME (chatml, qwen3, llama3, llama2, mistral-v1, "
                                     "mistral-v3, mistral-v3-tekken, mistral-v7, gemma, deepseek, deepseek2, deepseek3, phi3, phi4, plain)";
    if (!src) {
        snprintf(t->why, sizeof t->why, "the model has no chat template (tokenizer.chat_template)%s", force);
        return -1;
    }
    chat_kind k = CHAT_NONE;
    const char *refuse = NULL;
    if (has(src, "<|im_start|>")) {
        if (has(src, "<|im_sep|>")) k = CHAT_PHI4;
        else if (has(src, "<end_of_utterance>")) refuse = "the template (SmolVLM) uses <|im_start|> but is not ChatML";
        else k = has(src, "<think>") ? CHAT_QWEN3 : CHAT_CHATML;
    } else if (!strncmp(src, "mistral", 7) || has(src, "[INST]")) {
        if (has(src, "[SYSTEM_PROMPT]")) {
            if (has(src, "'[INST] '") || has(src, "\"[INST] \"")) k = CHAT_MISTRAL_V7;
            else if (has(src, "'[INST]'") || has(src, "\"[INST]\"")) refuse = "the template is Mistral v7-tekken, which this server does not render";
            else refuse = "the template is a Mistral v7 variant whose spacing this server cannot tell";
        } else if (has(src, "' [INST] ' + system_message") || has(src, "[AVAILABLE_TOOLS]")) {
            k = has(src, " [INST]") ? CHAT_MISTRAL_V1 : has(src, "\"[INST]\"") ? CHAT_MISTRAL_V3_TEKKEN : CHAT_MISTRAL_V3;
        } else if (has(src, "bos_token + '[INST]") || has(src, "content.strip()")) {
            refuse = "the template is a Llama-2 variant (BOS inside the history, or stripped messages) this server does not render";
        } else k = CHAT_LLAMA2;
    } else if (has(src, "<|assistant|>") && has(src, "<|end|>")) k = CHAT_PHI3;
    else if (has(src, "<start_of_turn>")) k = CHAT_GEMMA;
    else if (has(src, "### Instruction:") && has(src, "<|EOT|>")) {
        if (has(src, "ns.found") || has(src, "You are an AI programming assistant"))
            refuse = "the template (DeepSeek Coder) adds a default system prompt this server does not render";
        else k = CHAT_DEEPSEEK;
    } else if (has(src, "<|start_header_id|>") && has(src, "<|end_header_id|>")) k = CHAT_LLAMA3;
    else if (has(src, "'Assistant: ' + message['content'] + eos_token")) k = CHAT_DEEPSEEK2;
    else if (has(src, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>") && has(src, "<\xef\xbd\x9c" "User\xef\xbd\x9c>") &&
             has(src, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"))
        k = CHAT_DEEPSEEK3;
    if (refuse || k == CHAT_NONE) {
        snprintf(t->why, sizeof t->why, "%s%s", refuse ? refuse : "the model's chat template is not one this server knows", force);
        return -1;
    }
    t->kind = k;
    family(t, src);
    /* the literals that change the prompt */
    if (k == CHAT_CHATML) t->default_system = literal_after(src, "<|im_start|>system\\n", "<|im_end|>");
    if (k == CHAT_LLAMA3 && has(src, "Cutting Knowledge Date:")) {
        char *line = literal_after(src, "Cutting Knowledge Date:", "\\n");
        if (line) {
            size_t n = strlen(line) + 24;
            t->knowledge = malloc(n);
            if (t->knowledge) snprintf(t->knowledge, n, "Cutting Knowledge Date:%s", line);
            free(line);
        }
        t->date_now = has(src, "strftime_now");
        if (!t->date_now) {
            t->date = literal_after(src, "set date_string = \"", "\"");
            if (!t->date) t->date = literal_after(src, "set date_string = '", "'");
        }
        if (!t->knowledge || (!t->date_now && !t->date)) {
            chat_tmpl_free(t);
            t->kind = CHAT_NONE;
            snprintf(t->why, sizeof t->why, "the template (Llama 3.1+) has a date header this server cannot read%s", force);
            return -1;
        }
    }
    return 0;
}

/* ---- rendering ------------------------------------------------------------- */

static const char *trim_start(const char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    return s;
}
static void add_trimmed(sbuf *o, const char *s) {
    s = trim_start(s);
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r')) n--;
    sbuf_add(o, s, n);
}

/* an assistant turn of the history without its reasoning: the text after
 * the last </think>, leading newlines dropped (Qwen3, DeepSeek-R1) */
static const char *after_think(const char *s) {
    const char *p = s, *q;
    while ((q = strstr(p, "</think>"))) p = q + 8;
    if (p == s) return s;
    while (*p == '\n') p++;
    return p;
}

static int is(const chat_msg *m, const char *role) { return !strcmp(m->role, role); }

/* every message through its role's format (one %s: the content) */
static void per_role(sbuf *o, const chat_msg *m, int n, const char *sys, const char *user, const char *assistant) {
    for (int i = 0; i < n; i++) sbuf_addf(o, is(&m[i], "system") ? sys : is(&m[i], "user") ? user : assistant, m[i].content);
}

int chat_render(const chat_tmpl *t, const chat_msg *m, int n, int enable_thinking, sbuf *o, char *why, size_t wl) {
    if (t->kind == CHAT_NONE) { snprintf(why, wl, "%s", t->why); return -1; }
    if (n < 1 || is(&m[n - 1], "assistant")) {
        snprintf(why, wl, "the conversation must end with a user (or system) message; continuing an assistant message is not supported");
        return -1;
    }
    int n_sys = 0, first_sys = -1;
    for (int i = 0; i < n; i++)
        if (is(&m[i], "system")) { n_sys++; if (first_sys < 0) first_sys = i; }
    if (n_sys && !t->system_ok) {
        snprintf(why, wl, "this model's chat template (%s) has no system role", chat_kind_name(t->kind));
        return -1;
    }
    if (t->alternate) {
        /* the system prompt aside, turns go user, assistant, user, ... (the
         * template raises an exception otherwise) */
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (is(&m[i], "system")) {
                if (i != 0) { snprintf(why, wl, "this model's chat template (%s) takes a system message only first", chat_kind_name(t->kind)); return -1; }
                continue;
            }
            if (is(&m[i], k % 2 ? "assistant" : "user")) { k++; continue; }
            snprintf(why, wl, "this model's chat template (%s) needs the roles to alternate user/assistant/user/...", chat_kind_name(t->kind));
            return -1;
        }
    }
    int last_user = -1;
    for (int i = 0; i < n; i++)
        if (is(&m[i], "user")) last_user = i;
    switch (t->kind) {
    case CHAT_CHATML:
    case CHAT_QWEN3:
        if (t->default_system && first_sys != 0) sbuf_addf(o, "<|im_start|>system\n%s<|im_end|>\n", t->default_system);
        for (int i = 0; i < n; i++) {
            sbuf_addf(o, "<|im_start|>%s\n", m[i].role);
            sbuf_adds(o, t->kind == CHAT_QWEN3 && is(&m[i], "assistant") ? after_think(m[i].content) : m[i].content);
            sbuf_adds(o, "<|im_end|>\n");
        }
        sbuf_adds(o, "<|im_start|>assistant\n");
        if (t->kind == CHAT_QWEN3 && !enable_thinking) sbuf_adds(o, "<think>\n\n</think>\n\n");
        break;
    case CHAT_LLAMA3: {
        int i = 0;
        if (t->knowledge) {   /* 3.1+: the system turn is always there */
            char date[64];
            if (t->date_now) {
                time_t now = time(NULL);
                struct tm tmv;
                localtime_r(&now, &tmv);
                strftime(date, sizeof date, "%d %b %Y", &tmv);
            } else snprintf(date, sizeof date, "%s", t->date);
            sbuf_addf(o, "<|start_header_id|>system<|end_header_id|>\n\n%s\nToday Date: %s\n\n", t->knowledge, date);
            if (first_sys == 0) { add_trimmed(o, m[0].content); i = 1; }
            sbuf_adds(o, "<|eot_id|>");
        }
        for (; i < n; i++) {
            sbuf_addf(o, "<|start_header_id|>%s<|end_header_id|>\n\n", m[i].role);
            add_trimmed(o, m[i].content);
            sbuf_adds(o, "<|eot_id|>");
        }
        sbuf_adds(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    }
    case CHAT_LLAMA2: {
        sbuf_adds(o, "[INST] ");
        int inside = 1;
        for (int i = 0; i < n; i++) {
            if (!inside) { sbuf_adds(o, "[INST] "); inside = 1; }
            if (is(&m[i], "system")) sbuf_addf(o, "<<SYS>>\n%s\n<</SYS>>\n\n", m[i].content);
            else if (is(&m[i], "user")) sbuf_addf(o, "%s [/INST]", m[i].content);
            else { sbuf_addf(o, "%s</s>%s", m[i].content, t->eos_space ? " " : ""); inside = 0; }
        }
        break;
    }
    case CHAT_MISTRAL_V1:
    case CHAT_MISTRAL_V3:
    case CHAT_MISTRAL_V3_TEKKEN: {
        const char *lead = t->kind == CHAT_MISTRAL_V1 ? " " : "", *trail = t->kind == CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
        for (int i = 0; i < n; i++) {
            if (is(&m[i], "system")) continue;
            if (is(&m[i], "user")) {
                sbuf_addf(o, "%s[INST]%s", lead, trail);
                if (first_sys == 0 && i == last_user) sbuf_addf(o, "%s\n\n", m[0].content);   /* before the last user turn */
                sbuf_addf(o, "%s%s[/INST]", m[i].content, lead);
            } else {
                sbuf_adds(o, trail);
                if (t->kind == CHAT_MISTRAL_V3) add_trimmed(o, m[i].content); else sbuf_adds(o, m[i].content);
                sbuf_adds(o, "</s>");
            }
        }
        break;
    }
    case CHAT_MISTRAL_V7:
        per_role(o, m, n, "[SYSTEM_PROMPT] %s[/SYSTEM_PROMPT]", "[INST] %s[/INST]", " %s</s>");
        break;
    case CHAT_GEMMA: {
        const char *sys = first_sys == 0 ? m[0].content : NULL;
        for (int i = first_sys == 0 ? 1 : 0; i < n; i++) {
            const int user = is(&m[i], "user");
            sbuf_addf(o, "<start_of_turn>%s\n", user ? "user" : "model");
            if (user && sys) { add_trimmed(o, sys); sbuf_adds(o, "\n\n"); sys = NULL; }
            add_trimmed(o, m[i].content);
            sbuf_adds(o, "<end_of_turn>\n");
        }
        sbuf_adds(o, "<start_of_turn>model\n");
        break;
    }
    case CHAT_DEEPSEEK:
        per_role(o, m, n, "%s", "### Instruction:\n%s\n", "### Response:\n%s\n<|EOT|>\n");
        sbuf_adds(o, "### Response:\n");
        break;
    case CHAT_DEEPSEEK2:
        per_role(o, m, n, "%s\n\n", "User: %s\n\n", "Assistant: %s<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
        sbuf_adds(o, "Assistant:");
        break;
    case CHAT_DEEPSEEK3: {
        /* the system messages first, joined by blank lines, then the turns */
        int sys_seen = 0;
        for (int i = 0; i < n; i++)
            if (is(&m[i], "system")) { if (sys_seen++) sbuf_adds(o, "\n\n"); sbuf_adds(o, m[i].content); }
        for (int i = 0; i < n; i++) {
            if (is(&m[i], "user")) sbuf_addf(o, "<\xef\xbd\x9c" "User\xef\xbd\x9c>%s", m[i].content);
            else if (is(&m[i], "assistant"))
                sbuf_addf(o, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>%s<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                          after_think(m[i].content));
        }
        sbuf_adds(o, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
        if (t->think) sbuf_adds(o, "<think>\n");
        break;
    }
    case CHAT_PHI3:
        for (int i = 0; i < n; i++) sbuf_addf(o, "<|%s|>\n%s<|end|>\n", m[i].role, m[i].content);
        sbuf_adds(o, "<|assistant|>\n");
        break;
    case CHAT_PHI4:
        for (int i = 0; i < n; i++) sbuf_addf(o, "<|im_start|>%s<|im_sep|>%s<|im_end|>", m[i].role, m[i].content);
        sbuf_adds(o, "<|im_start|>assistant<|im_sep|>");
        break;
    default:                                            /* plain transcript */
        for (int i = 0; i < n; i++) {
            if (is(&m[i], "system")) { sbuf_adds(o, m[i].content); sbuf_adds(o, "\n\n"); continue; }
            sbuf_adds(o, is(&m[i], "user") ? "User: " : "Assistant: ");
            sbuf_adds(o, m[i].content);
            sbuf_adds(o, "\n");
        }
        sbuf_adds(o, "Assistant:");
        break;
    }
    return 0;
}

/* ========================================================================
 * The GGUF's template, interpreted (tools/jinja.h)
 * ===================================================================== */

/* A rendered prompt may be long (a system prompt and a tools list on every
 * request) but not unbounded. */
enum { JINJA_MAX_OUT = 4 << 20 };

/* Stand-ins for bos_token / eos_token whose text the vocabulary does not
 * say: bytes no tokenizer input holds, found and dealt with after rendering. */
#define BOS_MARK "\x01\x02" "dspark-bos" "\x02\x01"
#define EOS_MARK "\x01\x02" "dspark-eos" "\x02\x01"

/* The text of a control token: the spelling among the usual ones that
 * tokenizes (specials parsed) to exactly that id. "" when none does. */
static char *special_text(const dspark_model *m, int32_t id) {
    static const char *const cand[] = {
        "<s>", "</s>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>",
        "<bos>", "<eos>", "<|end|>", "<|startoftext|>", "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "<|EOT|>", "<end_of_turn>", NULL,
    };
    for (int i = 0; id >= 0 && m && cand[i]; i++) {
        int32_t out[4];
        dspark_error e;
        if (dspark_tokenize(m, cand[i], strlen(cand[i]), 0, 1, out, 4, &e) == 1 && out[0] == id) return strdup(cand[i]);
    }
    return strdup("");
}

static int count_of(const char *s, const char *w) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, w)); p += strlen(w)) n++;
    return n;
}

int chat_render_jinja(const chat_tmpl *t, const cJSON *messages, const cJSON *tools, const cJSON *kwargs, sbuf *out, int *add_bos,
                      char *why, size_t wl) {
    if (!t->jt) { snprintf(why, wl, "the chat template is not interpreted"); return -1; }
    cJSON *v = cJSON_CreateObject();
    if (!v) { snprintf(why, wl, "out of memory"); return -1; }
    for (const cJSON *k = kwargs ? kwargs->child : NULL; k; k = k->next)
        cJSON_AddItemToObject(v, k->string, cJSON_Duplicate(k, 1));
    /* the request's own variables win over same-named kwargs */
    static const char *const own[] = { "messages", "tools", "add_generation_prompt", "bos_token", "eos_token", NULL };
    for (int i = 0; own[i]; i++) cJSON_DeleteItemFromObjectCaseSensitive(v, own[i]);
    cJSON_AddItemToObject(v, "messages", cJSON_Duplicate(messages, 1));
    cJSON_AddItemToObject(v, "tools", tools ? cJSON_Duplicate(tools, 1) : cJSON_CreateNull());
    cJSON_AddBoolToObject(v, "add_generation_prompt", 1);
    cJSON_AddStringToObject(v, "bos_token", t->bos_text && t->bos_text[0] ? t->bos_text : BOS_MARK);
    cJSON_AddStringToObject(v, "eos_token", t->eos_text && t->eos_text[0] ? t->eos_text : EOS_MARK);
    size_t n = 0;
    char err[400];
    char *text = jinja_render(t->jt, v, JINJA_MAX_OUT, &n, err, sizeof err);
    cJSON_Delete(v);
    if (!text) { snprintf(why, wl, "%s", err); return -1; }
    size_t skip = 0;
    *add_bos = 0;
    if (strstr(text, EOS_MARK)) {
        snprintf(why, wl, "the chat template writes eos_token, whose text this model's vocabulary does not spell");
        free(text);
        return -1;
    }
    if (strstr(text, BOS_MARK)) {      /* only as the very first thing: then it is the BOS the caller adds */
        if (strncmp(text, BOS_MARK, strlen(BOS_MARK)) || count_of(text, BOS_MARK) != 1) {
            snprintf(why, wl, "the chat template writes bos_token inside the conversation, and this model's vocabulary does not spell it");
            free(text);
            return -1;
        }
        skip = strlen(BOS_MARK);
        *add_bos = 1;
    }
    sbuf_add(out, text + skip, n - skip);
    free(text);
    return 0;
}

const char *chat_tmpl_source(const chat_tmpl *t) { return t->jt ? "jinja" : t->kind != CHAT_NONE ? "builtin" : "none"; }

int chat_tmpl_load(chat_tmpl *t, const char *src, chat_kind forced, int jinja, const dspark_model *m) {
    int rc = chat_tmpl_init(t, src, forced);
    if (forced != CHAT_NONE) { snprintf(t->jinja_why, sizeof t->jinja_why, "--chat-template names a built-in"); return rc; }
    if (!src) { snprintf(t->jinja_why, sizeof t->jinja_why, "the model has no chat template"); return rc; }
    if (!jinja) { snprintf(t->jinja_why, sizeof t->jinja_why, "--no-jinja"); return rc; }
    char err[300];
    jinja_tmpl *jt = jinja_parse(src, err, sizeof err);
    if (!jt) { snprintf(t->jinja_why, sizeof t->jinja_why, "%s", err); return rc; }
    t->jt = jt;
    int32_t bos[2];
    dspark_error de;
    t->bos_text = dspark_tokenize(m, "", 0, 1, 0, bos, 2, &de) == 1 ? special_text(m, bos[0]) : strdup("");
    t->eos_text = special_text(m, dspark_model_eos(m));
    /* a probe conversation: the template must render it (a template that
     * needs what this interpreter lacks fails here, not on a user's request) */
    cJSON *msgs = cJSON_Parse("[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U1\"},"
                              "{\"role\":\"assistant\",\"content\":\"A\"},{\"role\":\"user\",\"content\":\"U2\"}]");
    sbuf probe = { 0 };
    int add_bos = 0;
    char why[300];
    int prc = msgs && t->bos_text && t->eos_text ? chat_render_jinja(t, msgs, NULL, NULL, &probe, &add_bos, why, sizeof why) : -1;
    if (prc && msgs) {      /* a template without a system role (it raises): probe without one */
        cJSON_DeleteItemFromArray(msgs, 0);
        char why2[300];
        sbuf_free(&probe);
        if (!chat_render_jinja(t, msgs, NULL, NULL, &probe, &add_bos, why2, sizeof why2)) prc = 0;
    }
    if (!prc && (probe.oom || !probe.p || !strstr(probe.p, "U2"))) {
        prc = -1;
        snprintf(why, sizeof why, "the template's probe render lacks the last user message");
    }
    if (!msgs || !t->bos_text || !t->eos_text) snprintf(why, sizeof why, "out of memory");
    if (!prc) {
        t->jinja_bos = add_bos;
        t->jinja_why[0] = 0;
        rc = 0;
    } else {
        snprintf(t->jinja_why, sizeof t->jinja_why, "%s", why);
        jinja_free(t->jt);
        t->jt = NULL;
    }
    sbuf_free(&probe);
    cJSON_Delete(msgs);
    return rc;
}

/* ========================================================================
 * The reply's parts: reasoning, content, tool calls
 * ===================================================================== */

static int blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* how many bytes at the end of s[0..n) are a proper prefix of tag */
static size_t partial_tag(const char *s, size_t n, const char *tag) {
    const size_t k = strlen(tag);
    for (size_t l = k - 1 < n ? k - 1 : n; l > 0; l--)
        if (!memcmp(s + n - l, tag, l)) return l;
    return 0;
}

static const char *find(const char *s, size_t n, const char *w) {
    const size_t k = strlen(w);
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == w[0] && !memcmp(s + i, w, k)) return s + i;
    return NULL;
}

/* a tool call's JSON: {"name": string, "arguments": value} -> an entry of calls */
static int add_call(chat_split *o, const char *s, size_t n) {
    while (n && blank(*s)) s++, n--;
    while (n && blank(s[n - 1])) n--;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (j && end) {                                 /* one value, nothing after it */
        while (end < s + n && blank(*end)) end++;
        if (end != s + n) { cJSON_Delete(j); j = NULL; }
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name"), *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    int ok = 0;
    if (cJSON_IsObject(j) && cJSON_IsString(name) && name->valuestring[0]) {
        char *a = !args ? strdup("{}") : cJSON_IsString(args) ? strdup(args->valuestring) : cJSON_PrintUnformatted(args);
        cJSON *c = a ? cJSON_CreateObject() : NULL;
        if (!o->calls) o->calls = cJSON_CreateArray();
        if (c && o->calls) {
            cJSON_AddStringToObject(c, "name", name->valuestring);
            cJSON_AddStringToObject(c, "arguments", a);
            cJSON_AddItemToArray(o->calls, c);
            o->n_calls++;
            ok = 1;
        } else {
            cJSON_Delete(c);
            o->content.oom = 1;
        }
        free(a);
    }
    cJSON_Delete(j);
    return ok;
}

void chat_split_text(const char *text, size_t n, int final, int think_open, int reasoning, int tools, chat_split *o) {
    memset(o, 0, sizeof *o);
    sbuf_add(&o->reasoning, "", 0);
    sbuf_add(&o->content, "", 0);
    size_t p = 0;
    if (reasoning) {
        size_t q = 0, start = 0;
        while (q < n && blank(text[q])) q++;
        int in_think = think_open;
        if (!in_think && n - q >= 7 && !memcmp(text + q, "<think>", 7)) { in_think = 1; start = q + 7; }
        else if (!in_think && !final && (q == n || (n - q < 7 && !memcmp(text + q, "<think>", n - q)))) return;   /* may still open */
        if (in_think) {
            const char *e = find(text + start, n - start, "</think>");
            size_t a = start, b = e ? (size_t)(e - text) : final ? n : n - partial_tag(text + start, n - start, "</think>");
            while (a < b && blank(text[a])) a++;
            while (b > a && blank(text[b - 1])) b--;
            sbuf_add(&o->reasoning, text + a, b - a);
            if (!e) return;
            p = (size_t)(e - text) + 8;
            while (p < n && blank(text[p])) p++;
        }
    }
    if (!tools) {
        sbuf_add(&o->content, text + p, n - p);
        return;
    }
    for (;;) {
        const char *k = find(text + p, n - p, "<tool_call>");
        if (!k) {
            size_t b = final ? n : n - partial_tag(text + p, n - p, "<tool_call>");
            sbuf_add(&o->content, text + p, b - p);
            break;
        }
        const size_t kk = (size_t)(k - text);
        const char *e = find(text + kk + 11, n - kk - 11, "</tool_call>");
        if (!e) {                                   /* open: held, or (final) text */
            sbuf_add(&o->content, text + p, (final ? n : kk) - p);
            break;
        }
        const size_t ee = (size_t)(e - text) + 12;
        if (add_call(o, text + kk + 11, (size_t)(e - text) - kk - 11)) sbuf_add(&o->content, text + p, kk - p);
        else sbuf_add(&o->content, text + p, ee - p);    /* not a call: kept as text */
        p = ee;
    }
    /* trailing blanks may precede a call: held while streaming; dropped
     * when the reply has calls */
    if (!final || o->n_calls)
        while (o->content.len && blank(o->content.p[o->content.len - 1])) o->content.p[--o->content.len] = 0;
    o->content_null = final && o->n_calls && !o->content.len;
}

void chat_split_free(chat_split *s) {
    sbuf_free(&s->reasoning);
    sbuf_free(&s->content);
    cJSON_Delete(s->calls);
    memset(s, 0, sizeof *s);
}
