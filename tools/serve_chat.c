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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
