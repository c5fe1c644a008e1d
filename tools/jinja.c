/* jinja.c — the chat-template Jinja subset (jinja.h).
 *
 * Three stages. The lexer cuts the source into text and tags, applying
 * whitespace control ({%- -%}) and HF's trim_blocks / lstrip_blocks, and
 * each tag into tokens. A recursive-descent parser (depth-bounded) builds a
 * tree of statement and expression nodes. The evaluator walks it with
 * values that are cJSON nodes: the caller's variables are borrowed, every
 * value made during a render goes to an arena freed when the render ends
 * (nothing is freed earlier, so no value a variable holds can dangle). */
#include "jinja.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    MAX_DEPTH = 96,                 /* statement + expression nesting          */
    MAX_ITER = 200000,              /* loop iterations per render              */
    MAX_STEPS = 4000000,            /* evaluation steps per render             */
    MAX_ITEMS = 100000,             /* a list made by the template             */
    MAX_ARENA_BYTES = 64 << 20,     /* every string made, together             */
};

/* ========================================================================
 * The tree
 * ===================================================================== */

typedef enum {
    /* statements */
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_BREAK, S_CONTINUE, S_BLOCK, S_MACRO,
    /* expressions */
    E_LIT, E_VAR, E_ATTR, E_INDEX, E_SLICE, E_CALL, E_FILTER, E_TEST, E_BIN, E_NOT, E_NEG, E_AND, E_OR, E_COND,
    E_LIST, E_DICT,
} nkind;

typedef struct node node;
struct node {
    nkind  k;
    int    op;                      /* E_BIN: operator; E_TEST: negated        */
    int    line;
    char  *s;                       /* text, name, attribute, filter, test     */
    size_t n;                       /* S_TEXT: bytes                           */
    char  *s2;                      /* S_FOR: second variable; S_SET: attribute */
    cJSON *lit;                     /* E_LIT                                   */
    node **kid;                     /* operands / body statements              */
    int    nk;
    char **kw;                      /* E_CALL/E_FILTER: keyword names (NULL: positional) */
    node  *a, *b, *c, *d;           /* if: cond/body/else; for: iter/body/else/filter */
};

struct jinja_tmpl { node *root; };

static void node_free(node *x) {
    if (!x) return;
    free(x->s);
    free(x->s2);
    cJSON_Delete(x->lit);
    for (int i = 0; i < x->nk; i++) {
        node_free(x->kid[i]);
        if (x->kw) free(x->kw[i]);
    }
    free(x->kid);
    free(x->kw);
    node_free(x->a);
    node_free(x->b);
    node_free(x->c);
    node_free(x->d);
    free(x);
}

void jinja_free(jinja_tmpl *t) {
    if (!t) return;
    node_free(t->root);
    free(t);
}

/* ========================================================================
 * Lexing
 * ===================================================================== */

typedef enum { T_END, T_NAME, T_NUM, T_STR, T_OP } ttype;
typedef struct { ttype t; const char *p; int n; int line; } token;

typedef enum { C_TEXT, C_EXPR, C_STMT } ckind;
typedef struct {
    ckind  k;
    const char *p;
    size_t n;
    int    line;
} chunk;

typedef struct {
    const char *src;
    chunk *ch;
    int    nch, cap;
    int    pos;                     /* the parser's chunk                      */
    token *tk;                      /* the current tag's tokens                */
    int    ntk, tcap, ti;
    int    depth;
    char  *err;
    size_t errlen;
    int    failed;
} parser;

static void perr(parser *P, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void perr(parser *P, int line, const char *fmt, ...) {
    if (P->failed) return;
    P->failed = 1;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(P->err, P->errlen, "template line %d: %s", line, msg);
}

static int line_of(const char *src, const char *p) {
    int l = 1;
    for (const char *q = src; q < p; q++) l += *q == '\n';
    return l;
}

static int add_chunk(parser *P, ckind k, const char *p, size_t n) {
    if (P->nch == P->cap) {
        int nc = P->cap ? P->cap * 2 : 64;
        chunk *c = realloc(P->ch, (size_t)nc * sizeof *c);
        if (!c) { perr(P, 0, "out of memory"); return -1; }
        P->ch = c;
        P->cap = nc;
    }
    P->ch[P->nch++] = (chunk){ k, p, n, line_of(P->src, p) };
    return 0;
}

/* the end of a tag opened at p (after "{{" / "{%" / "{#"): the position of
 * its closer, strings skipped; NULL when unterminated */
static const char *tag_end(const char *p, char close) {
    if (close == '#') {
        const char *e = strstr(p, "#}");
        return e;
    }
    for (; *p; p++) {
        if (*p == '\'' || *p == '"') {
            const char q = *p++;
            while (*p && *p != q) p += (*p == '\\' && p[1]) ? 2 : 1;
            if (!*p) return NULL;
        } else if (*p == close && p[1] == '}') return p;
    }
    return NULL;
}

static int is_sp(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int lex(parser *P) {
    const char *s = P->src, *text = s;
    /* Jinja drops one newline at the very end (keep_trailing_newline off) */
    const size_t srclen = strlen(s);
    const char *src_end = s + srclen - (srclen && s[srclen - 1] == '\n');
    int trim_next = 0;              /* the previous tag ended with "-": strip the text's start */
    int trim_nl = 0;                /* trim_blocks: drop one newline after a block tag */
    for (;;) {
        const char *o = text;
        while ((o = strchr(o, '{')) && o[1] != '{' && o[1] != '%' && o[1] != '#') o++;
        if (o && o >= src_end) o = NULL;
        const char *tend = o ? o : src_end;
        /* the text chunk [text, tend) */
        const char *a = text, *b = tend;
        if (trim_next) while (a < b && is_sp(*a)) a++;
        else if (trim_nl) {
            if (a < b && *a == '\n') a++;
            else if (a + 1 < b && a[0] == '\r' && a[1] == '\n') a += 2;
        }
        if (o) {
            const char sig = o[2];
            if (sig == '-') while (b > a && is_sp(b[-1])) b--;
            else if ((o[1] == '%' || o[1] == '#') && sig != '+') {   /* lstrip_blocks */
                const char *q = b;
                while (q > a && (q[-1] == ' ' || q[-1] == '\t')) q--;
                if (q == P->src || (q > P->src && q[-1] == '\n')) b = q;
            }
        }
        if (b > a && add_chunk(P, C_TEXT, a, (size_t)(b - a))) return -1;
        if (!o) return 0;
        const char kind = o[1], close = kind == '{' ? '}' : kind;
        const char *in = o + 2;
        if (*in == '-' || *in == '+') in++;
        const char *e = tag_end(in, close);
        if (!e) { perr(P, line_of(s, o), "a tag opened here is never closed"); return -1; }
        const char *ie = e;
        trim_next = e > in && e[-1] == '-';
        if (trim_next) ie--;
        trim_nl = kind != '{' && !trim_next;
        if (kind != '#' && add_chunk(P, kind == '{' ? C_EXPR : C_STMT, in, (size_t)(ie - in))) return -1;
        text = e + 2;
    }
}

static int tokenize_tag(parser *P, const chunk *c) {
    P->ntk = P->ti = 0;
    const char *p = c->p, *end = c->p + c->n;
    for (;;) {
        while (p < end && is_sp(*p)) p++;
        if (P->ntk == P->tcap) {
            int nc = P->tcap ? P->tcap * 2 : 32;
            token *t = realloc(P->tk, (size_t)nc * sizeof *t);
            if (!t) { perr(P, c->line, "out of memory"); return -1; }
            P->tk = t;
            P->tcap = nc;
        }
        token *t = &P->tk[P->ntk++];
        t->line = c->line;
        t->p = p;
        if (p >= end) { t->t = T_END; t->n = 0; return 0; }
        const char ch = *p;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
            while (p < end && ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_')) p++;
            t->t = T_NAME;
        } else if (ch >= '0' && ch <= '9') {
            while (p < end && ((*p >= '0' && *p <= '9') || *p == '.' || *p == '_')) p++;
            t->t = T_NUM;
        } else if (ch == '\'' || ch == '"') {
            p++;
            while (p < end && *p != ch) p += (*p == '\\' && p + 1 < end) ? 2 : 1;
            if (p >= end) { perr(P, c->line, "an unterminated string"); return -1; }
            p++;
            t->t = T_STR;
        } else {
            static const char *const two[] = { "==", "!=", "<=", ">=", "//", "**", NULL };
            t->t = T_OP;
            int k2 = 0;
            for (int i = 0; two[i]; i++)
                if (p + 1 < end && p[0] == two[i][0] && p[1] == two[i][1]) k2 = 1;
            if (k2) p += 2;
            else if (strchr("()[]{}.,:|~+-*/%<>=", ch)) p++;
            else { perr(P, c->line, "unexpected character '%c'", ch); return -1; }
        }
        t->n = (int)(p - t->p);
    }
}

/* ========================================================================
 * Parsing
 * ===================================================================== */

static token *cur(parser *P) { return &P->tk[P->ti]; }
static int tis(parser *P, ttype t, const char *s) {
    const token *k = cur(P);
    return k->t == t && (!s || ((int)strlen(s) == k->n && !memcmp(k->p, s, (size_t)k->n)));
}
static int accept(parser *P, ttype t, const char *s) {
    if (!tis(P, t, s)) return 0;
    P->ti++;
    return 1;
}
static int expect(parser *P, ttype t, const char *s) {
    if (accept(P, t, s)) return 1;
    const token *k = cur(P);
    perr(P, k->line, "expected '%s', found '%.*s'", s ? s : t == T_NAME ? "a name" : "?", k->n ? k->n : 5, k->n ? k->p : "(end)");
    return 0;
}
static char *tok_dup(const token *t) {
    char *s = malloc((size_t)t->n + 1);
    if (s) { memcpy(s, t->p, (size_t)t->n); s[t->n] = 0; }
    return s;
}

static node *mk(parser *P, nkind k) {
    node *x = calloc(1, sizeof *x);
    if (!x) { perr(P, 0, "out of memory"); return NULL; }
    x->k = k;
    x->line = P->ntk ? cur(P)->line : 0;
    return x;
}
static int add_kid(parser *P, node *x, node *kid, char *kw) {
    node **k = realloc(x->kid, (size_t)(x->nk + 1) * sizeof *k);
    char **w = realloc(x->kw, (size_t)(x->nk + 1) * sizeof *w);
    if (k) x->kid = k;
    if (w) x->kw = w;
    if (!k || !w) { node_free(kid); free(kw); perr(P, 0, "out of memory"); return -1; }
    x->kid[x->nk] = kid;
    x->kw[x->nk++] = kw;
    return 0;
}

/* a string literal's value: Python escapes \n \t \r \\ \' \" \0 \xHH \uHHHH */
static cJSON *str_lit(parser *P, const token *t) {
    const char *p = t->p + 1, *e = t->p + t->n - 1;
    char *s = malloc((size_t)(e - p) * 3 + 1), *o = s;
    if (!s) { perr(P, t->line, "out of memory"); return NULL; }
    while (p < e) {
        if (*p != '\\' || p + 1 >= e) { *o++ = *p++; continue; }
        p++;
        const char c = *p++;
        unsigned v = 0;
        int hex = c == 'x' ? 2 : c == 'u' ? 4 : 0;
        if (hex) {
            for (int i = 0; i < hex && p < e; i++, p++) {
                const char h = *p;
                v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 0);
            }
            if (v < 0x80) *o++ = (char)v;
            else if (v < 0x800) { *o++ = (char)(0xC0 | (v >> 6)); *o++ = (char)(0x80 | (v & 63)); }
            else { *o++ = (char)(0xE0 | (v >> 12)); *o++ = (char)(0x80 | ((v >> 6) & 63)); *o++ = (char)(0x80 | (v & 63)); }
            continue;
        }
        *o++ = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == '0' ? '\0' : c;
    }
    *o = 0;
    cJSON *j = cJSON_CreateString(s);
    free(s);
    if (!j) perr(P, t->line, "out of memory");
    return j;
}

static node *expr(parser *P);

/* call arguments "(a, b, k=v)" into x's kids (the opening paren is consumed) */
static int call_args(parser *P, node *x) {
    if (accept(P, T_OP, ")")) return 0;
    for (;;) {
        char *kw = NULL;
        if (cur(P)->t == T_NAME && P->ti + 1 < P->ntk && P->tk[P->ti + 1].t == T_OP && P->tk[P->ti + 1].n == 1 &&
            P->tk[P->ti + 1].p[0] == '=') {
            kw = tok_dup(cur(P));
            P->ti += 2;
        }
        node *v = expr(P);
        if (!v) { free(kw); return -1; }
        if (add_kid(P, x, v, kw)) return -1;
        if (accept(P, T_OP, ")")) return 0;
        if (!expect(P, T_OP, ",")) return -1;
    }
}

static node *primary(parser *P) {
    token *t = cur(P);
    node *x = NULL;
    if (t->t == T_STR) {
        if (!(x = mk(P, E_LIT)) || !(x->lit = str_lit(P, t))) { node_free(x); return NULL; }
        P->ti++;
        while (cur(P)->t == T_STR) {        /* adjacent literals concatenate */
            cJSON *more = str_lit(P, cur(P));
            if (!more) { node_free(x); return NULL; }
            size_t a = strlen(x->lit->valuestring), b = strlen(more->valuestring);
            char *s = malloc(a + b + 1);
            if (s) { memcpy(s, x->lit->valuestring, a); memcpy(s + a, more->valuestring, b + 1); }
            cJSON_Delete(more);
            cJSON *j = s ? cJSON_CreateString(s) : NULL;
            free(s);
            if (!j) { perr(P, t->line, "out of memory"); node_free(x); return NULL; }
            cJSON_Delete(x->lit);
            x->lit = j;
            P->ti++;
        }
    } else if (t->t == T_NUM) {
        char buf[64];
        int n = 0;
        for (int i = 0; i < t->n && n < 63; i++)
            if (t->p[i] != '_') buf[n++] = t->p[i];
        buf[n] = 0;
        char *end;
        double v = strtod(buf, &end);
        if (*end) { perr(P, t->line, "a bad number '%s'", buf); return NULL; }
        if (!(x = mk(P, E_LIT)) || !(x->lit = cJSON_CreateNumber(v))) { node_free(x); return NULL; }
        P->ti++;
    } else if (t->t == T_NAME) {
        if (tis(P, T_NAME, "true") || tis(P, T_NAME, "True") || tis(P, T_NAME, "false") || tis(P, T_NAME, "False")) {
            if (!(x = mk(P, E_LIT)) || !(x->lit = cJSON_CreateBool(t->p[0] == 't' || t->p[0] == 'T'))) { node_free(x); return NULL; }
        } else if (tis(P, T_NAME, "none") || tis(P, T_NAME, "None")) {
            if (!(x = mk(P, E_LIT)) || !(x->lit = cJSON_CreateNull())) { node_free(x); return NULL; }
        } else {
            if (!(x = mk(P, E_VAR)) || !(x->s = tok_dup(t))) { node_free(x); return NULL; }
        }
        P->ti++;
    } else if (accept(P, T_OP, "(")) {
        x = expr(P);
        if (x && tis(P, T_OP, ",")) {       /* a tuple: a list */
            node *l = mk(P, E_LIST);
            if (!l || add_kid(P, l, x, NULL)) { node_free(l); return NULL; }
            x = l;
            while (accept(P, T_OP, ",") && !tis(P, T_OP, ")")) {
                node *v = expr(P);
                if (!v || add_kid(P, x, v, NULL)) { node_free(x); return NULL; }
            }
        }
        if (x && !expect(P, T_OP, ")")) { node_free(x); return NULL; }
    } else if (accept(P, T_OP, "[")) {
        if (!(x = mk(P, E_LIST))) return NULL;
        while (!accept(P, T_OP, "]")) {
            node *v = expr(P);
            if (!v || add_kid(P, x, v, NULL)) { node_free(x); return NULL; }
            if (!tis(P, T_OP, "]") && !expect(P, T_OP, ",")) { node_free(x); return NULL; }
        }
    } else if (accept(P, T_OP, "{")) {
        if (!(x = mk(P, E_DICT))) return NULL;
        while (!accept(P, T_OP, "}")) {
            node *k = expr(P);
            if (!k || add_kid(P, x, k, NULL) || !expect(P, T_OP, ":")) { node_free(x); return NULL; }
            node *v = expr(P);
            if (!v || add_kid(P, x, v, NULL)) { node_free(x); return NULL; }
            if (!tis(P, T_OP, "}") && !expect(P, T_OP, ",")) { node_free(x); return NULL; }
        }
    } else {
        perr(P, t->line, "unexpected '%.*s'", t->n ? t->n : 5, t->n ? t->p : "(end)");
    }
    return x;
}

static node *postfix(parser *P, node *x) {
    while (x && !P->failed) {
        if (accept(P, T_OP, ".")) {
            node *a = mk(P, E_ATTR);
            if (!a) { node_free(x); return NULL; }
            a->a = x;
            x = a;
            if (cur(P)->t != T_NAME && cur(P)->t != T_NUM) { expect(P, T_NAME, NULL); node_free(x); return NULL; }
            if (!(x->s = tok_dup(cur(P)))) { node_free(x); return NULL; }
            P->ti++;
        } else if (accept(P, T_OP, "[")) {
            node *ix = mk(P, E_INDEX);
            if (!ix) { node_free(x); return NULL; }
            ix->a = x;
            x = ix;
            node *parts[3] = { 0 };
            int np = 0, colon = 0;
            for (;;) {
                if (tis(P, T_OP, ":")) { P->ti++; colon = 1; if (++np > 2) break; continue; }
                if (tis(P, T_OP, "]")) break;
                if (parts[np]) { expect(P, T_OP, "]"); break; }
                if (!(parts[np] = expr(P))) break;
            }
            if (P->failed || np > 2 || !expect(P, T_OP, "]")) {
                if (np > 2) perr(P, x->line, "a slice has at most three parts");
                for (int i = 0; i < 3; i++) node_free(parts[i]);
                node_free(x);
                return NULL;
            }
            if (colon) { x->k = E_SLICE; x->b = parts[0]; x->c = parts[1]; x->d = parts[2]; }
            else if (!parts[0]) { perr(P, x->line, "an empty index"); node_free(x); return NULL; }
            else x->b = parts[0];
        } else if (accept(P, T_OP, "(")) {
            node *c = mk(P, E_CALL);
            if (!c) { node_free(x); return NULL; }
            c->a = x;
            x = c;
            if (call_args(P, x)) { node_free(x); return NULL; }
        } else break;
    }
    return x;
}

/* filters and tests after a unary operand */
static node *filters(parser *P, node *x) {
    while (x && !P->failed) {
        if (accept(P, T_OP, "|")) {
            node *f = mk(P, E_FILTER);
            if (!f) { node_free(x); return NULL; }
            f->a = x;
            x = f;
            if (cur(P)->t != T_NAME) { expect(P, T_NAME, NULL); node_free(x); return NULL; }
            x->s = tok_dup(cur(P));
            P->ti++;
            if (accept(P, T_OP, "(") && call_args(P, x)) { node_free(x); return NULL; }
        } else if (accept(P, T_NAME, "is")) {
            node *t = mk(P, E_TEST);
            if (!t) { node_free(x); return NULL; }
            t->a = x;
            x = t;
            x->op = accept(P, T_NAME, "not");
            if (cur(P)->t != T_NAME) { expect(P, T_NAME, NULL); node_free(x); return NULL; }
            x->s = tok_dup(cur(P));
            P->ti++;
            if (accept(P, T_OP, "(")) {
                if (call_args(P, x)) { node_free(x); return NULL; }
            } else if (cur(P)->t == T_STR || cur(P)->t == T_NUM) {   /* "is equalto 'x'" */
                node *v = primary(P);
                if (!v || add_kid(P, x, v, NULL)) { node_free(x); return NULL; }
            }
        } else break;
    }
    return x;
}

/* Jinja's order: a sign binds tighter than the filters after it
 * (-3 | abs is abs(-3)) */
static node *unary_f(parser *P, int with_filters) {
    if (++P->depth > MAX_DEPTH) { perr(P, cur(P)->line, "nested too deeply"); return NULL; }
    node *x;
    if (accept(P, T_OP, "-")) {
        x = mk(P, E_NEG);
        if (x && !(x->a = unary_f(P, 0))) { node_free(x); x = NULL; }
    } else if (accept(P, T_OP, "+")) {
        x = unary_f(P, 0);
    } else {
        x = postfix(P, primary(P));
    }
    if (with_filters) x = filters(P, x);
    P->depth--;
    return x;
}
static node *unary(parser *P) { return unary_f(P, 1); }

enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CAT, OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE, OP_IN, OP_NOTIN };

static node *bin(parser *P, int op, node *a, node *b) {
    if (!a || !b) { node_free(a); node_free(b); return NULL; }
    node *x = mk(P, E_BIN);
    if (!x) { node_free(a); node_free(b); return NULL; }
    x->op = op;
    x->a = a;
    x->b = b;
    return x;
}

static node *e_pow(parser *P) {
    node *x = unary(P);
    while (x && accept(P, T_OP, "**")) x = bin(P, OP_POW, x, unary(P));
    return x;
}
static node *e_mul(parser *P) {
    node *x = e_pow(P);
    for (;;) {
        int op = tis(P, T_OP, "*") ? OP_MUL : tis(P, T_OP, "/") ? OP_DIV : tis(P, T_OP, "//") ? OP_FLOORDIV : tis(P, T_OP, "%") ? OP_MOD : 0;
        if (!x || !op) return x;
        P->ti++;
        x = bin(P, op, x, e_pow(P));
    }
}
static node *e_cat(parser *P) {
    node *x = e_mul(P);
    while (x && accept(P, T_OP, "~")) x = bin(P, OP_CAT, x, e_mul(P));
    return x;
}
static node *e_add(parser *P) {
    node *x = e_cat(P);
    for (;;) {
        int op = tis(P, T_OP, "+") ? OP_ADD : tis(P, T_OP, "-") ? OP_SUB : 0;
        if (!x || !op) return x;
        P->ti++;
        x = bin(P, op, x, e_cat(P));
    }
}
static node *e_cmp(parser *P) {
    node *x = e_add(P);
    for (;;) {
        int op = tis(P, T_OP, "==") ? OP_EQ : tis(P, T_OP, "!=") ? OP_NE : tis(P, T_OP, "<") ? OP_LT : tis(P, T_OP, ">") ? OP_GT
               : tis(P, T_OP, "<=") ? OP_LE : tis(P, T_OP, ">=") ? OP_GE : tis(P, T_NAME, "in") ? OP_IN : 0;
        if (!op && tis(P, T_NAME, "not") && P->ti + 1 < P->ntk && P->tk[P->ti + 1].t == T_NAME && P->tk[P->ti + 1].n == 2 &&
            !memcmp(P->tk[P->ti + 1].p, "in", 2)) {
            op = OP_NOTIN;
            P->ti++;
        }
        if (!x || !op) return x;
        P->ti++;
        x = bin(P, op, x, e_add(P));
    }
}
static node *e_not(parser *P) {
    if (accept(P, T_NAME, "not")) {
        if (++P->depth > MAX_DEPTH) { perr(P, cur(P)->line, "nested too deeply"); return NULL; }
        node *x = mk(P, E_NOT);
        if (x && !(x->a = e_not(P))) { node_free(x); x = NULL; }
        P->depth--;
        return x;
    }
    return e_cmp(P);
}
static node *e_and(parser *P) {
    node *x = e_not(P);
    while (x && accept(P, T_NAME, "and")) {
        node *y = bin(P, 0, x, e_not(P));
        if (y) y->k = E_AND;
        x = y;
    }
    return x;
}
static node *e_or(parser *P) {
    node *x = e_and(P);
    while (x && accept(P, T_NAME, "or")) {
        node *y = bin(P, 0, x, e_and(P));
        if (y) y->k = E_OR;
        x = y;
    }
    return x;
}
static node *expr(parser *P) {
    if (++P->depth > MAX_DEPTH) { perr(P, cur(P)->line, "nested too deeply"); return NULL; }
    node *x = e_or(P);
    if (x && accept(P, T_NAME, "if")) {
        node *c = mk(P, E_COND);
        if (!c) { node_free(x); x = NULL; }
        else {
            c->b = x;
            x = c;
            if (!(x->a = e_or(P))) { node_free(x); x = NULL; }
            else if (accept(P, T_NAME, "else") && !(x->c = expr(P))) { node_free(x); x = NULL; }
        }
    }
    P->depth--;
    return x;
}

/* the whole tag must be used */
static int tag_done(parser *P) {
    if (cur(P)->t == T_END) return 1;
    perr(P, cur(P)->line, "unexpected '%.*s' in a tag", cur(P)->n, cur(P)->p);
    return 0;
}

/* Statements until one of the end words (NULL-terminated) opens a tag; the
 * word found is left as the current tag (P->pos at it, tokens loaded). */
static node *block(parser *P, const char *const *ends, int *which);

static node *stmt_tag(parser *P) {
    const token *t = cur(P);
    const int line = t->line;
    if (accept(P, T_NAME, "if")) {
        node *x = mk(P, S_IF);
        if (!x || !(x->a = expr(P)) || !tag_done(P)) { node_free(x); return NULL; }
        static const char *const ends[] = { "elif", "else", "endif", NULL };
        int w;
        if (!(x->b = block(P, ends, &w))) { node_free(x); return NULL; }
        node *tail = x;
        while (w == 0) {                    /* elif: a nested if in the else */
            node *y = mk(P, S_IF);
            P->ti++;
            if (!y || !(y->a = expr(P)) || !tag_done(P)) { node_free(y); node_free(x); return NULL; }
            tail->c = y;
            tail = y;
            if (!(y->b = block(P, ends, &w))) { node_free(x); return NULL; }
        }
        if (w == 1) {
            static const char *const end1[] = { "endif", NULL };
            P->ti++;
            if (!tag_done(P) || !(tail->c = block(P, end1, &w))) { node_free(x); return NULL; }
        }
        P->ti++;
        if (!tag_done(P)) { node_free(x); return NULL; }
        return x;
    }
    if (accept(P, T_NAME, "for")) {
        node *x = mk(P, S_FOR);
        if (!x) return NULL;
        if (cur(P)->t != T_NAME) { expect(P, T_NAME, NULL); node_free(x); return NULL; }
        x->s = tok_dup(cur(P));
        P->ti++;
        if (accept(P, T_OP, ",")) {
            if (cur(P)->t != T_NAME) { expect(P, T_NAME, NULL); node_free(x); return NULL; }
            x->s2 = tok_dup(cur(P));
            P->ti++;
        }
        if (!expect(P, T_NAME, "in") || !(x->a = e_or(P))) { node_free(x); return NULL; }
        if (accept(P, T_NAME, "if") && !(x->d = e_or(P))) { node_free(x); return NULL; }
        if (accept(P, T_NAME, "recursive")) { perr(P, line, "recursive loops are not supported"); node_free(x); return NULL; }
        if (!tag_done(P)) { node_free(x); return NULL; }
        static const char *const ends[] = { "else", "endfor", NULL };
        int w;
        if (!(x->b = block(P, ends, &w))) { node_free(x); return NULL; }
        if (w == 0) {
            static const char *const end1[] = { "endfor", NULL };
            P->ti++;
            if (!tag_done(P) || !(x->c = block(P, end1, &w))) { node_free(x); return NULL; }
        }
        P->ti++;
        if (!tag_done(P)) { node_free(x); return NULL; }
        return x;
    }
    if (accept(P, T_NAME, "set")) {
        node *x = mk(P, S_SET);
        if (!x) return NULL;
        if (cur(P)->t != T_NAME) { expect(P, T_NAME, NULL); node_free(x); return NULL; }
        x->s = tok_dup(cur(P));
        P->ti++;
        if (accept(P, T_OP, ".")) {
            if (cur(P)->t != T_NAME) { expect(P, T_NAME, NULL); node_free(x); return NULL; }
            x->s2 = tok_dup(cur(P));
            P->ti++;
        }
        if (!tis(P, T_OP, "=")) { perr(P, line, "only '{%% set name = value %%}' is supported (no block set, no tuple targets)"); node_free(x); return NULL; }
        P->ti++;
        if (!(x->a = expr(P)) || !tag_done(P)) { node_free(x); return NULL; }
        return x;
    }
    if (accept(P, T_NAME, "break") || accept(P, T_NAME, "continue")) {
        node *x = mk(P, t->p[0] == 'b' ? S_BREAK : S_CONTINUE);
        if (x && !tag_done(P)) { node_free(x); return NULL; }
        return x;
    }
    if (accept(P, T_NAME, "macro")) {          /* {% macro name(a, b=default) %}: kid[i] the defaults, kw[i] the names */
        node *x = mk(P, S_MACRO);
        if (!x) return NULL;
        if (cur(P)->t != T_NAME) { expect(P, T_NAME, NULL); node_free(x); return NULL; }
        x->s = tok_dup(cur(P));
        P->ti++;
        if (!expect(P, T_OP, "(")) { node_free(x); return NULL; }
        while (!accept(P, T_OP, ")")) {
            if (cur(P)->t != T_NAME) { expect(P, T_NAME, NULL); node_free(x); return NULL; }
            char *name = tok_dup(cur(P));
            P->ti++;
            node *def = NULL;
            if (accept(P, T_OP, "=") && !(def = expr(P))) { free(name); node_free(x); return NULL; }
            if (!def && !(def = mk(P, E_LIT))) { free(name); node_free(x); return NULL; }   /* no default: an E_LIT without lit */
            if (add_kid(P, x, def, name)) { node_free(x); return NULL; }
            if (!tis(P, T_OP, ")") && !expect(P, T_OP, ",")) { node_free(x); return NULL; }
        }
        static const char *const ends[] = { "endmacro", NULL };
        int w;
        if (!tag_done(P) || !(x->b = block(P, ends, &w))) { node_free(x); return NULL; }
        P->ti++;
        if (cur(P)->t == T_NAME) P->ti++;     /* {% endmacro name %} */
        if (!tag_done(P)) { node_free(x); return NULL; }
        return x;
    }
    if (accept(P, T_NAME, "generation")) {     /* transformers' assistant-mask marker: renders its body */
        node *x = mk(P, S_BLOCK);
        static const char *const ends[] = { "endgeneration", NULL };
        int w;
        if (!x || !tag_done(P) || !(x->b = block(P, ends, &w))) { node_free(x); return NULL; }
        P->ti++;
        if (!tag_done(P)) { node_free(x); return NULL; }
        return x;
    }
    perr(P, line, "the tag '%.*s' is not supported", t->n ? t->n : 5, t->n ? t->p : "(empty)");
    return NULL;
}

static node *block(parser *P, const char *const *ends, int *which) {
    if (++P->depth > MAX_DEPTH) { perr(P, P->pos < P->nch ? P->ch[P->pos].line : 0, "nested too deeply"); return NULL; }
    node *b = mk(P, S_BLOCK);
    if (!b) return NULL;
    const int open_line = P->pos > 0 ? P->ch[P->pos - 1].line : 1;
    *which = -1;
    while (!P->failed) {
        if (P->pos >= P->nch) {
            if (ends) {
                int last = 0;
                while (ends[last + 1]) last++;
                perr(P, open_line, "a block opened here is never closed (expected {%% %s %%})", ends[last]);
                break;
            }
            P->depth--;
            return b;
        }
        const chunk *c = &P->ch[P->pos++];
        node *s = NULL;
        if (c->k == C_TEXT) {
            if ((s = mk(P, S_TEXT)) && (s->s = malloc(c->n + 1))) {
                memcpy(s->s, c->p, c->n);
                s->s[c->n] = 0;
                s->n = c->n;
            } else if (s) { node_free(s); s = NULL; perr(P, c->line, "out of memory"); }
        } else {
            if (tokenize_tag(P, c)) break;
            if (c->k == C_EXPR) {
                if ((s = mk(P, S_OUT)) && (!(s->a = expr(P)) || !tag_done(P))) { node_free(s); s = NULL; }
            } else {
                for (int i = 0; ends && ends[i]; i++)
                    if (tis(P, T_NAME, ends[i])) { *which = i; P->depth--; return b; }
                if (cur(P)->t == T_NAME && (tis(P, T_NAME, "endif") || tis(P, T_NAME, "endfor") || tis(P, T_NAME, "elif") ||
                                            tis(P, T_NAME, "else") || tis(P, T_NAME, "endgeneration") || tis(P, T_NAME, "endmacro"))) {
                    perr(P, c->line, "'%.*s' without its opening tag", cur(P)->n, cur(P)->p);
                    break;
                }
                s = stmt_tag(P);
            }
        }
        if (!s || add_kid(P, b, s, NULL)) break;
    }
    node_free(b);
    return NULL;
}

jinja_tmpl *jinja_parse(const char *src, char *err, size_t errlen) {
    parser P = { .src = src, .err = err, .errlen = errlen };
    if (errlen) err[0] = 0;
    jinja_tmpl *t = NULL;
    if (!lex(&P)) {
        int w;
        node *root = block(&P, NULL, &w);
        if (root && (t = malloc(sizeof *t))) t->root = root;
        else { node_free(root); if (!P.failed) perr(&P, 0, "out of memory"); }
    }
    free(P.ch);
    free(P.tk);
    return t;
}

/* ========================================================================
 * Evaluation
 * ===================================================================== */

typedef struct { const char *name; const cJSON *v; } binding;

/* a type bit cJSON leaves alone (its own flags are 256 and 512): set on the
 * namespaces a render makes, the only objects `set ns.attr` may write */
#define NS_MARK (1 << 12)

typedef struct {
    const cJSON *globals;
    cJSON  *undef;                  /* the one Undefined                       */
    cJSON **arena;
    int     narena, arena_cap;
    size_t  arena_bytes;
    binding *vars;
    int     nvars, vars_cap;
    const node *macro[64];          /* the macros defined so far              */
    int     nmacro;
    char   *out;
    size_t  len, cap, max_out;
    long    steps, iters;
    int     depth;
    char   *err;
    size_t  errlen;
    int     failed;
} ctx;

static void rerr(ctx *C, const node *x, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void rerr(ctx *C, const node *x, const char *fmt, ...) {
    if (C->failed) return;
    C->failed = 1;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (x) snprintf(C->err, C->errlen, "template line %d: %s", x->line, msg);
    else snprintf(C->err, C->errlen, "%s", msg);
}

static const cJSON *keep(ctx *C, cJSON *v) {
    if (!v) { rerr(C, NULL, "out of memory"); return NULL; }
    if (C->narena == C->arena_cap) {
        int nc = C->arena_cap ? C->arena_cap * 2 : 256;
        cJSON **a = realloc(C->arena, (size_t)nc * sizeof *a);
        if (!a) { cJSON_Delete(v); rerr(C, NULL, "out of memory"); return NULL; }
        C->arena = a;
        C->arena_cap = nc;
    }
    C->arena[C->narena++] = v;
    return v;
}

static const cJSON *mk_strn(ctx *C, const node *x, const char *s, size_t n) {
    if (n > C->max_out || C->arena_bytes + n > MAX_ARENA_BYTES) { rerr(C, x, "a string grew past the limit (%zu bytes)", C->max_out); return NULL; }
    C->arena_bytes += n;
    char *b = malloc(n + 1);
    if (!b) { rerr(C, x, "out of memory"); return NULL; }
    memcpy(b, s, n);
    b[n] = 0;
    cJSON *j = cJSON_CreateString(b);
    free(b);
    return keep(C, j);
}
static const cJSON *mk_str(ctx *C, const node *x, const char *s) { return mk_strn(C, x, s, strlen(s)); }
static const cJSON *mk_num(ctx *C, double v) { return keep(C, cJSON_CreateNumber(v)); }
static const cJSON *mk_bool(ctx *C, int v) { return keep(C, cJSON_CreateBool(v)); }

static int is_undef(const cJSON *v) { return !v || (v->type & 0xFF) == cJSON_Invalid; }
static int truthy(const cJSON *v) {
    if (is_undef(v) || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if (cJSON_IsTrue(v)) return 1;
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    if (cJSON_IsString(v)) return v->valuestring[0] != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    return 0;
}
static const char *type_name(const cJSON *v) {
    return is_undef(v) ? "undefined" : cJSON_IsNull(v) ? "none" : cJSON_IsBool(v) ? "boolean" : cJSON_IsNumber(v) ? "number"
         : cJSON_IsString(v) ? "string" : cJSON_IsArray(v) ? "list" : "mapping";
}

/* ---- numbers without libm (the binary imports none of it: tests/cli_libm.sh) ---- */

static int is_fin(double v) { return v == v && v - v == 0; }
static double floor_(double v) {
    if (!is_fin(v) || v > 9e15 || v < -9e15) return v;
    double t = (double)(long long)v;
    return t > v ? t - 1 : t;
}

/* ---- Python-style printing: str() and json.dumps ---------------------------- */

typedef struct { char *p; size_t len, cap; int oom; size_t max; } buf;
static void b_add(buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n > b->max) { b->oom = 2; return; }
    if (b->len + n + 1 > b->cap) {
        size_t nc = (b->cap ? b->cap * 2 : 64);
        while (nc < b->len + n + 1) nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
static void b_adds(buf *b, const char *s) { b_add(b, s, strlen(s)); }

static void num_text(double v, char *s, size_t n) {
    if (is_fin(v) && v < 1e15 && v > -1e15 && v == (double)(long long)v) snprintf(s, n, "%lld", (long long)v);
    else if (!is_fin(v)) snprintf(s, n, "%s", v != v ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
    else {
        snprintf(s, n, "%.17g", v);                 /* shortest that reads back, as Python's repr */
        for (int p = 1; p < 17; p++) {
            char t[40];
            snprintf(t, sizeof t, "%.*g", p, v);
            if (strtod(t, NULL) == v) { snprintf(s, n, "%s", t); break; }
        }
    }
}

static void json_str(buf *b, const char *s) {
    b_add(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[8];
        switch (*p) {
        case '"': b_add(b, "\\\"", 2); break;
        case '\\': b_add(b, "\\\\", 2); break;
        case '\n': b_add(b, "\\n", 2); break;
        case '\r': b_add(b, "\\r", 2); break;
        case '\t': b_add(b, "\\t", 2); break;
        case '\b': b_add(b, "\\b", 2); break;
        case '\f': b_add(b, "\\f", 2); break;
        default:
            if (*p < 0x20) { snprintf(e, sizeof e, "\\u%04x", *p); b_adds(b, e); }
            else b_add(b, (const char *)p, 1);
        }
    }
    b_add(b, "\"", 1);
}

static void newline(buf *b, int indent, int level) {
    b_add(b, "\n", 1);
    for (int i = 0; i < indent * level && !b->oom; i++) b_add(b, " ", 1);
}

/* json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: none) */
static void json_dump(buf *b, const cJSON *v, int indent, int level) {
    if (level > 200) { b->oom = 2; return; }
    char t[40];
    if (is_undef(v) || cJSON_IsNull(v)) b_adds(b, "null");
    else if (cJSON_IsTrue(v)) b_adds(b, "true");
    else if (cJSON_IsFalse(v)) b_adds(b, "false");
    else if (cJSON_IsNumber(v)) { num_text(v->valuedouble, t, sizeof t); b_adds(b, t); }
    else if (cJSON_IsString(v)) json_str(b, v->valuestring);
    else {
        const int obj = cJSON_IsObject(v);
        b_add(b, obj ? "{" : "[", 1);
        for (const cJSON *c = v->child; c && !b->oom; c = c->next) {
            if (indent >= 0) newline(b, indent, level + 1);
            if (obj) { json_str(b, c->string ? c->string : ""); b_adds(b, ": "); }
            json_dump(b, c, indent, level + 1);
            if (c->next) b_adds(b, indent >= 0 ? "," : ", ");
        }
        if (indent >= 0 && v->child) newline(b, indent, level);
        b_add(b, obj ? "}" : "]", 1);
    }
}

/* str(v) as Jinja prints it */
static void py_str(buf *b, const cJSON *v, int level) {
    char t[40];
    if (is_undef(v)) return;
    if (cJSON_IsNull(v)) b_adds(b, "None");
    else if (cJSON_IsTrue(v)) b_adds(b, "True");
    else if (cJSON_IsFalse(v)) b_adds(b, "False");
    else if (cJSON_IsNumber(v)) { num_text(v->valuedouble, t, sizeof t); b_adds(b, t); }
    else if (cJSON_IsString(v)) b_adds(b, v->valuestring);
    else {
        /* repr of a list / dict: strings quoted with ' */
        if (level > 200) { b->oom = 2; return; }
        const int obj = cJSON_IsObject(v);
        b_add(b, obj ? "{" : "[", 1);
        for (const cJSON *c = v->child; c && !b->oom; c = c->next) {
            if (obj) { b_adds(b, "'"); b_adds(b, c->string ? c->string : ""); b_adds(b, "': "); }
            if (cJSON_IsString(c)) { b_adds(b, "'"); b_adds(b, c->valuestring); b_adds(b, "'"); }
            else py_str(b, c, level + 1);
            if (c->next) b_adds(b, ", ");
        }
        b_add(b, obj ? "}" : "]", 1);
    }
}

static const cJSON *to_str(ctx *C, const node *x, const cJSON *v) {
    if (cJSON_IsString(v)) return v;
    buf b = { .max = C->max_out };
    b_add(&b, "", 0);
    py_str(&b, v, 0);
    if (b.oom) { free(b.p); rerr(C, x, b.oom == 2 ? "a string grew past the limit" : "out of memory"); return NULL; }
    const cJSON *s = mk_strn(C, x, b.p, b.len);
    free(b.p);
    return s;
}

/* ---- variables ------------------------------------------------------------------- */

static const cJSON *lookup(ctx *C, const char *name) {
    for (int i = C->nvars - 1; i >= 0; i--)
        if (C->vars[i].name && !strcmp(C->vars[i].name, name)) return C->vars[i].v;
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(C->globals, name);
    return g ? g : C->undef;
}
/* bind in the innermost frame (frames are separated by name NULL) */
static int bind(ctx *C, const char *name, const cJSON *v) {
    for (int i = C->nvars - 1; name && i >= 0 && C->vars[i].name; i--)
        if (!strcmp(C->vars[i].name, name)) { C->vars[i].v = v; return 0; }
    if (C->nvars == C->vars_cap) {
        int nc = C->vars_cap ? C->vars_cap * 2 : 64;
        binding *b = realloc(C->vars, (size_t)nc * sizeof *b);
        if (!b) { rerr(C, NULL, "out of memory"); return -1; }
        C->vars = b;
        C->vars_cap = nc;
    }
    C->vars[C->nvars++] = (binding){ name, v };
    return 0;
}

static int emit(ctx *C, const node *x, const char *s, size_t n) {
    if (C->len + n > C->max_out) { rerr(C, x, "the output grew past the limit (%zu bytes)", C->max_out); return -1; }
    if (C->len + n + 1 > C->cap) {
        size_t nc = C->cap ? C->cap * 2 : 1024;
        while (nc < C->len + n + 1) nc *= 2;
        char *p = realloc(C->out, nc);
        if (!p) { rerr(C, x, "out of memory"); return -1; }
        C->out = p;
        C->cap = nc;
    }
    memcpy(C->out + C->len, s, n);
    C->len += n;
    C->out[C->len] = 0;
    return 0;
}

/* ---- operators ---------------------------------------------------------------------- */

static const cJSON *eval(ctx *C, const node *x);

static int num_of(ctx *C, const node *x, const cJSON *v, double *d) {
    if (cJSON_IsNumber(v)) { *d = v->valuedouble; return 0; }
    if (cJSON_IsBool(v)) { *d = cJSON_IsTrue(v); return 0; }
    rerr(C, x, "a number was expected, not %s", type_name(v));
    return -1;
}

static int equal(const cJSON *a, const cJSON *b) {
    if (is_undef(a) || is_undef(b)) return is_undef(a) && is_undef(b);
    if (cJSON_IsNumber(a) && cJSON_IsBool(b)) return a->valuedouble == cJSON_IsTrue(b);
    if (cJSON_IsBool(a) && cJSON_IsNumber(b)) return b->valuedouble == cJSON_IsTrue(a);
    return cJSON_Compare(a, b, 1);
}

/* "x in y" */
static int contains(ctx *C, const node *x, const cJSON *item, const cJSON *in) {
    if (cJSON_IsString(in)) {
        if (!cJSON_IsString(item)) { rerr(C, x, "'in <string>' needs a string on the left, not %s", type_name(item)); return -1; }
        return strstr(in->valuestring, item->valuestring) != NULL;
    }
    if (cJSON_IsArray(in)) {
        for (const cJSON *c = in->child; c; c = c->next)
            if (equal(item, c)) return 1;
        return 0;
    }
    if (cJSON_IsObject(in)) return cJSON_IsString(item) && cJSON_GetObjectItemCaseSensitive(in, item->valuestring) != NULL;
    if (is_undef(in) || cJSON_IsNull(in)) { rerr(C, x, "'in' on %s", type_name(in)); return -1; }
    rerr(C, x, "'in' needs a string, list or mapping, not %s", type_name(in));
    return -1;
}

/* a deep copy, charged to the arena's byte budget (a template copying a
 * large input in a loop meets the limit, not the machine's memory) */
static size_t weigh(const cJSON *v, int level) {
    size_t w = 64 + (v->string ? strlen(v->string) : 0) + (cJSON_IsString(v) ? strlen(v->valuestring) : 0);
    if (level < 256)
        for (const cJSON *c = v->child; c; c = c->next) w += weigh(c, level + 1);
    return w;
}
static cJSON *dupv(ctx *C, const node *x, const cJSON *v) {
    const size_t w = weigh(v, 0);
    if (C->arena_bytes + w > MAX_ARENA_BYTES) { rerr(C, x, "the template copied more than %d MB", MAX_ARENA_BYTES >> 20); return NULL; }
    C->arena_bytes += w;
    cJSON *d = cJSON_Duplicate(v, 1);
    if (!d) rerr(C, x, "out of memory");
    return d;
}

static const cJSON *list_dup(ctx *C, const cJSON *a) {
    cJSON *l = cJSON_CreateArray();
    if (!keep(C, l)) return NULL;
    int n = 0;
    for (const cJSON *c = a ? a->child : NULL; c; c = c->next, n++) {
        cJSON *d = dupv(C, NULL, c);
        if (!d) { rerr(C, NULL, "out of memory"); return NULL; }
        cJSON_AddItemToArray(l, d);
    }
    return l;
}

static const cJSON *binop(ctx *C, const node *x, int op, const cJSON *a, const cJSON *b) {
    double p, q;
    switch (op) {
    case OP_CAT: {
        const cJSON *s = to_str(C, x, a), *t = s ? to_str(C, x, b) : NULL;
        if (!t) return NULL;
        size_t n1 = strlen(s->valuestring), n2 = strlen(t->valuestring);
        if (n1 + n2 > C->max_out) { rerr(C, x, "a string grew past the limit (%zu bytes)", C->max_out); return NULL; }
        char *m = malloc(n1 + n2 + 1);
        if (!m) { rerr(C, x, "out of memory"); return NULL; }
        memcpy(m, s->valuestring, n1);
        memcpy(m + n1, t->valuestring, n2 + 1);
        const cJSON *r = mk_strn(C, x, m, n1 + n2);
        free(m);
        return r;
    }
    case OP_ADD:
        if (cJSON_IsString(a) && cJSON_IsString(b)) return binop(C, x, OP_CAT, a, b);
        if (cJSON_IsArray(a) && cJSON_IsArray(b)) {
            if (cJSON_GetArraySize(a) + cJSON_GetArraySize(b) > MAX_ITEMS) { rerr(C, x, "a list grew past %d items", MAX_ITEMS); return NULL; }
            cJSON *l = (cJSON *)list_dup(C, a);
            if (!l) return NULL;
            for (const cJSON *c = b->child; c; c = c->next) {
                cJSON *d = dupv(C, NULL, c);
                if (!d) { rerr(C, x, "out of memory"); return NULL; }
                cJSON_AddItemToArray(l, d);
            }
            return l;
        }
        if (num_of(C, x, a, &p) || num_of(C, x, b, &q)) return NULL;
        return mk_num(C, p + q);
    case OP_SUB: case OP_MUL: case OP_DIV: case OP_FLOORDIV: case OP_MOD: case OP_POW:
        if (num_of(C, x, a, &p) || num_of(C, x, b, &q)) return NULL;
        if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && q == 0) { rerr(C, x, "division by zero"); return NULL; }
        if (op == OP_SUB) return mk_num(C, p - q);
        if (op == OP_MUL) return mk_num(C, p * q);
        if (op == OP_DIV) return mk_num(C, p / q);
        if (op == OP_FLOORDIV) return mk_num(C, floor_(p / q));
        if (op == OP_MOD) return mk_num(C, p - q * floor_(p / q));          /* Python's sign: the divisor's */
        if (q != floor_(q) || q < 0 || q > 64) { rerr(C, x, "** takes a whole exponent 0..64"); return NULL; }
        double r = 1;
        for (int i = 0; i < (int)q; i++) r *= p;
        return mk_num(C, r);
    case OP_EQ: return mk_bool(C, equal(a, b));
    case OP_NE: return mk_bool(C, !equal(a, b));
    case OP_LT: case OP_GT: case OP_LE: case OP_GE: {
        int c;
        if (cJSON_IsString(a) && cJSON_IsString(b)) c = strcmp(a->valuestring, b->valuestring);
        else {
            if (num_of(C, x, a, &p) || num_of(C, x, b, &q)) return NULL;
            c = p < q ? -1 : p > q;
        }
        return mk_bool(C, op == OP_LT ? c < 0 : op == OP_GT ? c > 0 : op == OP_LE ? c <= 0 : c >= 0);
    }
    case OP_IN: case OP_NOTIN: {
        int r = contains(C, x, a, b);
        if (r < 0) return NULL;
        return mk_bool(C, op == OP_IN ? r : !r);
    }
    }
    rerr(C, x, "an unknown operator");
    return NULL;
}

/* ---- strings ------------------------------------------------------------------------- */

static int in_set(char c, const char *chars) { return chars ? strchr(chars, c) != NULL && c : is_sp(c) || c == '\v' || c == '\f'; }
static const cJSON *strip(ctx *C, const node *x, const cJSON *s, int left, int right, const char *chars) {
    const char *p = s->valuestring;
    size_t n = strlen(p);
    size_t a = 0;
    if (left) while (a < n && in_set(p[a], chars)) a++;
    if (right) while (n > a && in_set(p[n - 1], chars)) n--;
    return mk_strn(C, x, p + a, n - a);
}

static const cJSON *split(ctx *C, const node *x, const cJSON *s, const cJSON *sep) {
    cJSON *l = cJSON_CreateArray();
    if (!keep(C, l)) return NULL;
    const char *p = s->valuestring;
    int n = 0;
    if (!sep || cJSON_IsNull(sep)) {                   /* on runs of whitespace */
        for (;;) {
            while (*p && in_set(*p, NULL)) p++;
            if (!*p) break;
            const char *e = p;
            while (*e && !in_set(*e, NULL)) e++;
            char *m = malloc((size_t)(e - p) + 1);
            if (!m) { rerr(C, x, "out of memory"); return NULL; }
            memcpy(m, p, (size_t)(e - p));
            m[e - p] = 0;
            cJSON *w = cJSON_CreateString(m);
            free(m);
            if (!w) { rerr(C, x, "out of memory"); return NULL; }
            cJSON_AddItemToArray(l, w);
            p = e;
            if (++n > MAX_ITEMS) { rerr(C, x, "a list grew past %d items", MAX_ITEMS); return NULL; }
        }
        return l;
    }
    if (!cJSON_IsString(sep) || !sep->valuestring[0]) { rerr(C, x, "split() needs a non-empty string separator"); return NULL; }
    const size_t k = strlen(sep->valuestring);
    for (;;) {
        const char *e = strstr(p, sep->valuestring);
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        char *m = malloc(len + 1);
        if (!m) { rerr(C, x, "out of memory"); return NULL; }
        memcpy(m, p, len);
        m[len] = 0;
        cJSON *w = cJSON_CreateString(m);
        free(m);
        if (!w) { rerr(C, x, "out of memory"); return NULL; }
        cJSON_AddItemToArray(l, w);
        if (++n > MAX_ITEMS) { rerr(C, x, "a list grew past %d items", MAX_ITEMS); return NULL; }
        if (!e) break;
        p = e + k;
    }
    return l;
}

static const cJSON *replace(ctx *C, const node *x, const cJSON *s, const cJSON *from, const cJSON *to) {
    if (!cJSON_IsString(from) || !cJSON_IsString(to) || !from->valuestring[0]) { rerr(C, x, "replace() needs two strings, the first non-empty"); return NULL; }
    buf b = { .max = C->max_out };
    b_add(&b, "", 0);
    const char *p = s->valuestring, *e;
    const size_t k = strlen(from->valuestring);
    while ((e = strstr(p, from->valuestring)) && !b.oom) {
        b_add(&b, p, (size_t)(e - p));
        b_adds(&b, to->valuestring);
        p = e + k;
    }
    b_adds(&b, p);
    if (b.oom) { free(b.p); rerr(C, x, "a string grew past the limit"); return NULL; }
    const cJSON *r = mk_strn(C, x, b.p, b.len);
    free(b.p);
    return r;
}

static const cJSON *case_map(ctx *C, const node *x, const cJSON *s, int mode) {   /* 0 lower, 1 upper, 2 title, 3 capitalize */
    const cJSON *r = mk_str(C, x, s->valuestring);
    if (!r) return NULL;
    int start = 1;
    for (char *p = r->valuestring; *p; p++) {
        const char c = *p;
        const int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        int up = mode == 1 || ((mode == 2 || mode == 3) && start);
        if (mode == 3 && p != r->valuestring) up = 0;
        if (up && c >= 'a' && c <= 'z') *p = (char)(c - 32);
        else if (!up && mode != 1 && c >= 'A' && c <= 'Z') *p = (char)(c + 32);
        start = !alpha;
    }
    return r;
}

/* ---- calls, filters, tests -------------------------------------------------------------- */

typedef struct {
    const cJSON *pos[8];
    int npos;
    const char *kwn[8];
    const cJSON *kwv[8];
    int nkw;
} args;

static int eval_args(ctx *C, const node *x, args *A) {
    memset(A, 0, sizeof *A);
    for (int i = 0; i < x->nk; i++) {
        const cJSON *v = eval(C, x->kid[i]);
        if (!v) return -1;
        if (x->kw && x->kw[i]) {
            if (A->nkw == 8) { rerr(C, x, "too many arguments"); return -1; }
            A->kwn[A->nkw] = x->kw[i];
            A->kwv[A->nkw++] = v;
        } else {
            if (A->npos == 8) { rerr(C, x, "too many arguments"); return -1; }
            A->pos[A->npos++] = v;
        }
    }
    return 0;
}
static const cJSON *kwarg(const args *A, const char *name, int pos) {
    for (int i = 0; i < A->nkw; i++)
        if (!strcmp(A->kwn[i], name)) return A->kwv[i];
    return pos >= 0 && pos < A->npos && pos < 8 ? A->pos[pos] : NULL;
}

static const cJSON *tojson(ctx *C, const node *x, const cJSON *v, const args *A) {
    const cJSON *ind = kwarg(A, "indent", 0);
    int indent = -1;
    if (ind && !cJSON_IsNull(ind)) {
        if (!cJSON_IsNumber(ind) || ind->valuedouble < 0 || ind->valuedouble > 16) { rerr(C, x, "tojson(indent=) takes 0..16"); return NULL; }
        indent = (int)ind->valuedouble;
    }
    buf b = { .max = C->max_out };
    b_add(&b, "", 0);
    json_dump(&b, v, indent, 0);
    if (b.oom) { free(b.p); rerr(C, x, b.oom == 2 ? "tojson output grew past the limit" : "out of memory"); return NULL; }
    const cJSON *r = mk_strn(C, x, b.p, b.len);
    free(b.p);
    return r;
}

static int test(ctx *C, const node *x, const char *name, const cJSON *v, const args *A, int *res) {
    if (!strcmp(name, "defined")) *res = !is_undef(v);
    else if (!strcmp(name, "undefined")) *res = is_undef(v);
    else if (!strcmp(name, "none")) *res = cJSON_IsNull(v);
    else if (!strcmp(name, "string")) *res = cJSON_IsString(v);
    else if (!strcmp(name, "number")) *res = cJSON_IsNumber(v);
    else if (!strcmp(name, "integer")) *res = cJSON_IsNumber(v) && v->valuedouble == floor_(v->valuedouble);
    else if (!strcmp(name, "boolean")) *res = cJSON_IsBool(v);
    else if (!strcmp(name, "true")) *res = cJSON_IsTrue(v);
    else if (!strcmp(name, "false")) *res = cJSON_IsFalse(v);
    else if (!strcmp(name, "mapping")) *res = cJSON_IsObject(v);
    else if (!strcmp(name, "sequence")) *res = cJSON_IsArray(v) || cJSON_IsString(v);
    else if (!strcmp(name, "iterable")) *res = cJSON_IsArray(v) || cJSON_IsString(v) || cJSON_IsObject(v);
    else if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        double d;
        if (num_of(C, x, v, &d)) return -1;
        *res = ((long long)d % 2 != 0) == (name[0] == 'o');
    } else if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==")) {
        if (A->npos < 1) { rerr(C, x, "the test '%s' needs a value", name); return -1; }
        *res = equal(v, A->pos[0]);
    } else if (!strcmp(name, "divisibleby")) {
        double d, q;
        if (A->npos < 1 || num_of(C, x, v, &d) || num_of(C, x, A->pos[0], &q)) { if (!C->failed) rerr(C, x, "divisibleby needs numbers"); return -1; }
        if (q == 0) { rerr(C, x, "divisibleby(0)"); return -1; }
        *res = d - q * floor_(d / q) == 0;
    } else if (!strcmp(name, "ne") || !strcmp(name, "!=")) {
        if (A->npos < 1) { rerr(C, x, "the test '%s' needs a value", name); return -1; }
        *res = !equal(v, A->pos[0]);
    } else if (!strcmp(name, "in")) {
        if (A->npos < 1) { rerr(C, x, "the test 'in' needs a value"); return -1; }
        int r = contains(C, x, v, A->pos[0]);
        if (r < 0) return -1;
        *res = r;
    } else { rerr(C, x, "the test '%s' is not supported", name); return -1; }
    return 0;
}

/* the item of v at key (a string) or index, or Undefined */
static const cJSON *item(ctx *C, const cJSON *v, const cJSON *key) {
    if (cJSON_IsObject(v) && cJSON_IsString(key)) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(v, key->valuestring);
        return r ? r : C->undef;
    }
    if ((cJSON_IsArray(v) || cJSON_IsString(v)) && cJSON_IsNumber(key)) {
        long long i = (long long)key->valuedouble;
        const long long n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : (long long)strlen(v->valuestring);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return C->undef;
        if (cJSON_IsArray(v)) return cJSON_GetArrayItem(v, (int)i);
        return mk_strn(C, NULL, v->valuestring + i, 1);
    }
    return C->undef;
}

static const cJSON *select_attr(ctx *C, const node *x, const cJSON *v, const args *A, int reject) {
    if (!cJSON_IsArray(v)) { rerr(C, x, "selectattr/rejectattr need a list, not %s", type_name(v)); return NULL; }
    if (A->npos < 1 || !cJSON_IsString(A->pos[0])) { rerr(C, x, "selectattr/rejectattr need an attribute name"); return NULL; }
    cJSON *l = cJSON_CreateArray();
    if (!keep(C, l)) return NULL;
    for (const cJSON *c = v->child; c; c = c->next) {
        if (++C->steps > MAX_STEPS) { rerr(C, x, "the template ran past %d steps", MAX_STEPS); return NULL; }
        const cJSON *a = item(C, c, A->pos[0]);
        int ok;
        if (A->npos >= 2) {
            if (!cJSON_IsString(A->pos[1])) { rerr(C, x, "selectattr's test must be a name"); return NULL; }
            args T = { .npos = A->npos - 2 };
            for (int i = 2; i < A->npos; i++) T.pos[i - 2] = A->pos[i];
            if (test(C, x, A->pos[1]->valuestring, a, &T, &ok)) return NULL;
        } else ok = truthy(a);
        if (ok != reject) {
            cJSON *d = dupv(C, NULL, c);
            if (!d) { rerr(C, x, "out of memory"); return NULL; }
            cJSON_AddItemToArray(l, d);
        }
    }
    return l;
}

/* select / reject: the items that pass a test (by name, with its arguments), or are truthy */
static const cJSON *select_items(ctx *C, const node *x, const cJSON *v, const args *A, int reject) {
    if (!cJSON_IsArray(v)) { rerr(C, x, "select/reject need a list, not %s", type_name(v)); return NULL; }
    if (A->npos >= 1 && !cJSON_IsString(A->pos[0])) { rerr(C, x, "select/reject take a test name"); return NULL; }
    cJSON *l = cJSON_CreateArray();
    if (!keep(C, l)) return NULL;
    for (const cJSON *c = v->child; c; c = c->next) {
        if (++C->steps > MAX_STEPS) { rerr(C, x, "the template ran past %d steps", MAX_STEPS); return NULL; }
        int ok;
        if (A->npos >= 1) {
            args T = { .npos = A->npos - 1 };
            for (int i = 1; i < A->npos; i++) T.pos[i - 1] = A->pos[i];
            if (test(C, x, A->pos[0]->valuestring, c, &T, &ok)) return NULL;
        } else ok = truthy(c);
        if (ok != reject) {
            cJSON *d = dupv(C, x, c);
            if (!d) return NULL;
            cJSON_AddItemToArray(l, d);
        }
    }
    return l;
}

static const cJSON *dict_view(ctx *C, const node *x, const cJSON *v, int what) {   /* 0 items, 1 keys, 2 values */
    if (!cJSON_IsObject(v)) { rerr(C, x, "items/keys/values need a mapping, not %s", type_name(v)); return NULL; }
    cJSON *l = cJSON_CreateArray();
    if (!keep(C, l)) return NULL;
    for (const cJSON *c = v->child; c; c = c->next) {
        cJSON *e = what == 1 ? cJSON_CreateString(c->string ? c->string : "") : what == 2 ? dupv(C, NULL, c) : cJSON_CreateArray();
        if (!e) { rerr(C, x, "out of memory"); return NULL; }
        if (what == 0) {
            cJSON_AddItemToArray(e, cJSON_CreateString(c->string ? c->string : ""));
            cJSON_AddItemToArray(e, dupv(C, NULL, c));
        }
        cJSON_AddItemToArray(l, e);
    }
    return l;
}

static const cJSON *filter(ctx *C, const node *x, const char *f, const cJSON *v, const args *A) {
    if (!strcmp(f, "trim") || !strcmp(f, "strip")) {
        if (!cJSON_IsString(v)) { if (!(v = to_str(C, x, v))) return NULL; }
        const cJSON *ch = kwarg(A, "chars", 0);
        return strip(C, x, v, 1, 1, cJSON_IsString(ch) ? ch->valuestring : NULL);
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (cJSON_IsString(v)) {       /* characters, not bytes */
            long n = 0;
            for (const unsigned char *p = (const unsigned char *)v->valuestring; *p; p++) n += (*p & 0xC0) != 0x80;
            return mk_num(C, (double)n);
        }
        if (cJSON_IsArray(v) || cJSON_IsObject(v)) return mk_num(C, cJSON_GetArraySize(v));
        rerr(C, x, "length of %s", type_name(v));
        return NULL;
    }
    if (!strcmp(f, "tojson")) return tojson(C, x, v, A);
    if (!strcmp(f, "string")) return to_str(C, x, v);
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") || !strcmp(f, "capitalize")) {
        if (!(v = to_str(C, x, v))) return NULL;
        return case_map(C, x, v, f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 't' ? 2 : 3);
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        const cJSON *def = kwarg(A, "default_value", 0), *b = kwarg(A, "boolean", 1);
        const int use = is_undef(v) || (b && truthy(b) && !truthy(v));
        return use ? (def ? def : mk_str(C, x, "")) : v;
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        if (!cJSON_IsArray(v) && !cJSON_IsString(v)) { rerr(C, x, "%s of %s", f, type_name(v)); return NULL; }
        const cJSON *ix = mk_num(C, f[0] == 'f' ? 0 : -1);
        return ix ? item(C, v, ix) : NULL;
    }
    if (!strcmp(f, "list")) {
        if (cJSON_IsArray(v)) return v;
        if (cJSON_IsObject(v)) return dict_view(C, x, v, 1);
        rerr(C, x, "list of %s", type_name(v));
        return NULL;
    }
    if (!strcmp(f, "items") || !strcmp(f, "keys") || !strcmp(f, "values")) return dict_view(C, x, v, f[0] == 'i' ? 0 : f[0] == 'k' ? 1 : 2);
    if (!strcmp(f, "int")) {
        double d = 0;
        if (cJSON_IsString(v)) d = strtod(v->valuestring, NULL);
        else if (num_of(C, x, v, &d)) return NULL;
        return mk_num(C, is_fin(d) && d < 9e15 && d > -9e15 ? (double)(long long)d : 0);
    }
    if (!strcmp(f, "join")) {
        if (!cJSON_IsArray(v)) { rerr(C, x, "join of %s", type_name(v)); return NULL; }
        const cJSON *sep = kwarg(A, "d", 0);
        if (sep && !cJSON_IsString(sep)) { rerr(C, x, "join's separator must be a string"); return NULL; }
        buf b = { .max = C->max_out };
        b_add(&b, "", 0);
        for (const cJSON *c = v->child; c && !b.oom; c = c->next) {
            const cJSON *s = to_str(C, x, c);
            if (!s) { free(b.p); return NULL; }
            b_adds(&b, s->valuestring);
            if (c->next && sep) b_adds(&b, sep->valuestring);
        }
        if (b.oom) { free(b.p); rerr(C, x, "a string grew past the limit"); return NULL; }
        const cJSON *r = mk_strn(C, x, b.p, b.len);
        free(b.p);
        return r;
    }
    if (!strcmp(f, "replace")) {
        if (!cJSON_IsString(v) || A->npos < 2) { rerr(C, x, "replace needs a string and two arguments"); return NULL; }
        return replace(C, x, v, A->pos[0], A->pos[1]);
    }
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) return select_attr(C, x, v, A, f[0] == 'r');
    if (!strcmp(f, "select") || !strcmp(f, "reject")) return select_items(C, x, v, A, f[0] == 'r');
    if (!strcmp(f, "safe") || !strcmp(f, "e") || !strcmp(f, "escape")) {
        if (f[0] == 's') return v;
        rerr(C, x, "the filter '%s' is not supported (chat templates are not HTML)", f);
        return NULL;
    }
    if (!strcmp(f, "abs")) {
        double d;
        if (num_of(C, x, v, &d)) return NULL;
        return mk_num(C, d < 0 ? -d : d);
    }
    if (!strcmp(f, "map")) {
        const cJSON *at = kwarg(A, "attribute", -1);
        if (!cJSON_IsArray(v) || !cJSON_IsString(at)) { rerr(C, x, "only map(attribute='name') on a list is supported"); return NULL; }
        cJSON *l = cJSON_CreateArray();
        if (!keep(C, l)) return NULL;
        for (const cJSON *c = v->child; c; c = c->next) {
            const cJSON *a = item(C, c, at);
            cJSON *d = is_undef(a) ? cJSON_CreateNull() : dupv(C, NULL, a);
            if (!d) { rerr(C, x, "out of memory"); return NULL; }
            cJSON_AddItemToArray(l, d);
        }
        return l;
    }
    rerr(C, x, "the filter '%s' is not supported", f);
    return NULL;
}

/* obj.name(args): the methods of strings and dicts templates use */
static const cJSON *method(ctx *C, const node *x, const cJSON *o, const char *m, const args *A) {
    if (cJSON_IsString(o)) {
        const cJSON *a0 = A->npos ? A->pos[0] : NULL;
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
            if (a0 && !cJSON_IsString(a0) && !cJSON_IsNull(a0)) { rerr(C, x, "%s() takes a string", m); return NULL; }
            return strip(C, x, o, m[0] != 'r', m[0] != 'l', cJSON_IsString(a0) ? a0->valuestring : NULL);
        }
        if (!strcmp(m, "split")) return split(C, x, o, a0);
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            if (!cJSON_IsString(a0)) { rerr(C, x, "%s() takes a string", m); return NULL; }
            const size_t n = strlen(o->valuestring), k = strlen(a0->valuestring);
            const int r = k <= n && !memcmp(o->valuestring + (m[0] == 's' ? 0 : n - k), a0->valuestring, k);
            return mk_bool(C, r);
        }
        if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize"))
            return case_map(C, x, o, m[0] == 'l' ? 0 : m[0] == 'u' ? 1 : m[0] == 't' ? 2 : 3);
        if (!strcmp(m, "replace")) {
            if (A->npos < 2) { rerr(C, x, "replace() takes two strings"); return NULL; }
            return replace(C, x, o, A->pos[0], A->pos[1]);
        }
        if (!strcmp(m, "find")) {
            if (!cJSON_IsString(a0)) { rerr(C, x, "find() takes a string"); return NULL; }
            const char *p = strstr(o->valuestring, a0->valuestring);
            return mk_num(C, p ? (double)(p - o->valuestring) : -1);
        }
    }
    if (cJSON_IsObject(o)) {
        if (!strcmp(m, "items")) return dict_view(C, x, o, 0);
        if (!strcmp(m, "keys")) return dict_view(C, x, o, 1);
        if (!strcmp(m, "values")) return dict_view(C, x, o, 2);
        if (!strcmp(m, "get")) {
            if (A->npos < 1) { rerr(C, x, "get() takes a key"); return NULL; }
            const cJSON *r = item(C, o, A->pos[0]);
            return is_undef(r) ? (A->npos > 1 ? A->pos[1] : keep(C, cJSON_CreateNull())) : r;
        }
    }
    rerr(C, x, "%s has no method '%s' here", type_name(o), m);
    return NULL;
}

static int exec(ctx *C, const node *x);

/* a macro call: its body rendered into a string of its own, the
 * parameters bound in a frame of their own */
static const cJSON *call_macro(ctx *C, const node *x, const node *mac, const args *A) {
    if (A->npos > mac->nk) { rerr(C, x, "the macro '%s' takes %d arguments", mac->s, mac->nk); return NULL; }
    const int mark = C->nvars;
    if (bind(C, NULL, NULL)) return NULL;
    for (int i = 0; i < mac->nk; i++) {
        const cJSON *v = i < A->npos ? A->pos[i] : NULL;
        for (int k = 0; k < A->nkw && !v; k++)
            if (!strcmp(A->kwn[k], mac->kw[i])) v = A->kwv[k];
        if (!v) v = mac->kid[i]->lit ? mac->kid[i]->lit : mac->kid[i]->k == E_LIT ? C->undef : eval(C, mac->kid[i]);
        if (!v || bind(C, mac->kw[i], v)) { C->nvars = mark; return NULL; }
    }
    char *out = C->out;
    const size_t len = C->len, cap = C->cap;
    C->out = NULL;
    C->len = C->cap = 0;
    int rc = emit(C, x, "", 0) ? -1 : exec(C, mac->b);
    char *body = C->out;
    const size_t blen = C->len;
    C->out = out;
    C->len = len;
    C->cap = cap;
    C->nvars = mark;
    const cJSON *r = rc == 0 ? mk_strn(C, x, body, blen) : NULL;
    if (rc > 0) rerr(C, x, "break or continue outside a loop");
    free(body);
    return r;
}

static const cJSON *call(ctx *C, const node *x) {
    args A;
    if (eval_args(C, x, &A)) return NULL;
    const node *f = x->a;
    for (int i = C->nmacro - 1; f->k == E_VAR && i >= 0; i--)
        if (!strcmp(C->macro[i]->s, f->s)) return call_macro(C, x, C->macro[i], &A);
    if (f->k == E_ATTR) {
        const cJSON *o = eval(C, f->a);
        return o ? method(C, x, o, f->s, &A) : NULL;
    }
    if (f->k != E_VAR) { rerr(C, x, "only named functions and methods can be called"); return NULL; }
    const char *n = f->s;
    if (!strcmp(n, "raise_exception")) {
        const cJSON *m = A.npos ? to_str(C, x, A.pos[0]) : NULL;
        rerr(C, NULL, "the chat template refused the conversation: %.240s", m ? m->valuestring : "(no message)");
        return NULL;
    }
    if (!strcmp(n, "namespace")) {
        cJSON *o = cJSON_CreateObject();
        if (!keep(C, o)) return NULL;
        o->type |= NS_MARK;
        for (int i = 0; i < A.nkw; i++) {
            cJSON *d = dupv(C, NULL, A.kwv[i]);
            if (!d) { rerr(C, x, "out of memory"); return NULL; }
            cJSON_AddItemToObject(o, A.kwn[i], d);
        }
        return o;
    }
    if (!strcmp(n, "range")) {
        double a = 0, b = 0, s = 1;
        if (A.npos < 1 || A.npos > 3) { rerr(C, x, "range() takes 1 to 3 numbers"); return NULL; }
        if (A.npos == 1 ? num_of(C, x, A.pos[0], &b) : (num_of(C, x, A.pos[0], &a) || num_of(C, x, A.pos[1], &b))) return NULL;
        if (A.npos == 3 && num_of(C, x, A.pos[2], &s)) return NULL;
        if (s == 0) { rerr(C, x, "range() step must not be zero"); return NULL; }
        if ((b - a) / s > MAX_ITEMS) { rerr(C, x, "range() past %d items", MAX_ITEMS); return NULL; }
        cJSON *l = cJSON_CreateArray();
        if (!keep(C, l)) return NULL;
        for (double v = a; s > 0 ? v < b : v > b; v += s) cJSON_AddItemToArray(l, cJSON_CreateNumber(v));
        return l;
    }
    if (!strcmp(n, "strftime_now")) {
        if (A.npos != 1 || !cJSON_IsString(A.pos[0])) { rerr(C, x, "strftime_now() takes a format string"); return NULL; }
        char out[256];
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t k = strftime(out, sizeof out, A.pos[0]->valuestring, &tmv);
        return mk_strn(C, x, out, k);
    }
    rerr(C, x, "the function '%s' is not supported", n);
    return NULL;
}

static const cJSON *slice(ctx *C, const node *x, const cJSON *v) {
    double s[3] = { 0, 0, 1 };
    int given[3] = { 0 };
    const node *part[3] = { x->b, x->c, x->d };
    for (int i = 0; i < 3; i++)
        if (part[i]) {
            const cJSON *p = eval(C, part[i]);
            if (!p) return NULL;
            if (cJSON_IsNull(p)) continue;
            if (num_of(C, x, p, &s[i])) return NULL;
            given[i] = 1;
        }
    const int str = cJSON_IsString(v);
    if (!str && !cJSON_IsArray(v)) { rerr(C, x, "slicing %s", type_name(v)); return NULL; }
    const long long n = str ? (long long)strlen(v->valuestring) : cJSON_GetArraySize(v);
    const long long step = (long long)s[2];
    if (step == 0) { rerr(C, x, "a slice step must not be zero"); return NULL; }
    long long a, b;
    if (step > 0) {
        a = given[0] ? (long long)s[0] : 0;
        b = given[1] ? (long long)s[1] : n;
        a = a < 0 ? a + n : a;
        b = b < 0 ? b + n : b;
        a = a < 0 ? 0 : a > n ? n : a;
        b = b < 0 ? 0 : b > n ? n : b;
    } else {
        a = given[0] ? (long long)s[0] : n - 1;
        b = given[1] ? (long long)s[1] : -n - 1;
        a = a < 0 ? a + n : a;
        b = b < 0 ? b + n : b;
        a = a < -1 ? -1 : a > n - 1 ? n - 1 : a;
        b = b < -1 ? -1 : b > n - 1 ? n - 1 : b;
    }
    if (str) {
        buf bb = { .max = C->max_out };
        b_add(&bb, "", 0);
        for (long long i = a; step > 0 ? i < b : i > b; i += step) b_add(&bb, v->valuestring + i, 1);
        const cJSON *r = bb.oom ? NULL : mk_strn(C, x, bb.p, bb.len);
        if (bb.oom) rerr(C, x, "out of memory");
        free(bb.p);
        return r;
    }
    cJSON *l = cJSON_CreateArray();
    if (!keep(C, l)) return NULL;
    const cJSON **items = n ? malloc((size_t)n * sizeof *items) : NULL;
    if (n && !items) { rerr(C, x, "out of memory"); return NULL; }
    long long k = 0;
    for (const cJSON *c = v->child; c && k < n; c = c->next) items[k++] = c;
    for (long long i = a; step > 0 ? i < b : i > b; i += step) {
        cJSON *d = dupv(C, NULL, items[i]);
        if (!d) { free(items); rerr(C, x, "out of memory"); return NULL; }
        cJSON_AddItemToArray(l, d);
    }
    free(items);
    return l;
}

static const cJSON *eval(ctx *C, const node *x) {
    if (C->failed) return NULL;
    if (++C->steps > MAX_STEPS) { rerr(C, x, "the template ran past %d steps", MAX_STEPS); return NULL; }
    const cJSON *a, *b;
    switch (x->k) {
    case E_LIT: return x->lit;
    case E_VAR: return lookup(C, x->s);
    case E_ATTR:
        if (!(a = eval(C, x->a))) return NULL;
        if (cJSON_IsObject(a)) {
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(a, x->s);
            return r ? r : C->undef;
        }
        if (x->s[0] >= '0' && x->s[0] <= '9') {   /* x.0 */
            const cJSON *ix = mk_num(C, atof(x->s));
            return ix ? item(C, a, ix) : NULL;
        }
        return C->undef;
    case E_INDEX:
        if (!(a = eval(C, x->a)) || !(b = eval(C, x->b))) return NULL;
        return item(C, a, b);
    case E_SLICE:
        if (!(a = eval(C, x->a))) return NULL;
        return slice(C, x, a);
    case E_CALL: return call(C, x);
    case E_FILTER: {
        if (!(a = eval(C, x->a))) return NULL;
        args A;
        if (eval_args(C, x, &A)) return NULL;
        return filter(C, x, x->s, a, &A);
    }
    case E_TEST: {
        if (!(a = eval(C, x->a))) return NULL;
        args A;
        int r;
        if (eval_args(C, x, &A) || test(C, x, x->s, a, &A, &r)) return NULL;
        return mk_bool(C, x->op ? !r : r);
    }
    case E_BIN:
        if (!(a = eval(C, x->a)) || !(b = eval(C, x->b))) return NULL;
        return binop(C, x, x->op, a, b);
    case E_NOT:
        if (!(a = eval(C, x->a))) return NULL;
        return mk_bool(C, !truthy(a));
    case E_NEG: {
        double d;
        if (!(a = eval(C, x->a)) || num_of(C, x, a, &d)) return NULL;
        return mk_num(C, -d);
    }
    case E_AND:
        if (!(a = eval(C, x->a))) return NULL;
        return truthy(a) ? eval(C, x->b) : a;
    case E_OR:
        if (!(a = eval(C, x->a))) return NULL;
        return truthy(a) ? a : eval(C, x->b);
    case E_COND:
        if (!(a = eval(C, x->a))) return NULL;
        return truthy(a) ? eval(C, x->b) : x->c ? eval(C, x->c) : C->undef;
    case E_LIST: {
        cJSON *l = cJSON_CreateArray();
        if (!keep(C, l)) return NULL;
        for (int i = 0; i < x->nk; i++) {
            const cJSON *v = eval(C, x->kid[i]);
            cJSON *d = v ? dupv(C, NULL, v) : NULL;
            if (!d) { if (v) rerr(C, x, "out of memory"); return NULL; }
            cJSON_AddItemToArray(l, d);
        }
        return l;
    }
    case E_DICT: {
        cJSON *o = cJSON_CreateObject();
        if (!keep(C, o)) return NULL;
        for (int i = 0; i + 1 < x->nk; i += 2) {
            const cJSON *k = eval(C, x->kid[i]), *v = k ? eval(C, x->kid[i + 1]) : NULL;
            if (!v) return NULL;
            if (!cJSON_IsString(k)) { rerr(C, x, "dict keys must be strings"); return NULL; }
            cJSON *d = dupv(C, NULL, v);
            if (!d) { rerr(C, x, "out of memory"); return NULL; }
            cJSON_AddItemToObject(o, k->valuestring, d);
        }
        return o;
    }
    default: break;
    }
    rerr(C, x, "not an expression");
    return NULL;
}

/* ---- statements ------------------------------------------------------------------------- */

enum { X_OK = 0, X_ERR = -1, X_BREAK = 1, X_CONTINUE = 2 };

static int exec(ctx *C, const node *x);

static int exec_for(ctx *C, const node *x) {
    const cJSON *it = eval(C, x->a);
    if (!it) return X_ERR;
    if (cJSON_IsObject(it)) { if (!(it = dict_view(C, x, it, 1))) return X_ERR; }
    else if (cJSON_IsString(it)) {            /* characters */
        cJSON *l = cJSON_CreateArray();
        if (!keep(C, l)) return X_ERR;
        for (const char *p = it->valuestring; *p;) {
            int k = 1;
            while (p[k] && ((unsigned char)p[k] & 0xC0) == 0x80) k++;
            char ch[8] = { 0 };
            memcpy(ch, p, (size_t)(k < 7 ? k : 7));
            cJSON_AddItemToArray(l, cJSON_CreateString(ch));
            p += k;
        }
        it = l;
    } else if (is_undef(it) || cJSON_IsNull(it)) it = NULL;
    else if (!cJSON_IsArray(it)) { rerr(C, x, "cannot loop over %s", type_name(it)); return X_ERR; }
    /* the items that pass the loop's filter: filtered first, as Jinja does, so loop.* count them */
    const cJSON **items = NULL;
    int n = 0;
    const int total = it ? cJSON_GetArraySize(it) : 0;
    if (total) {
        if (!(items = malloc((size_t)total * sizeof *items))) { rerr(C, x, "out of memory"); return X_ERR; }
        const int mark = C->nvars;
        for (const cJSON *c = it->child; c; c = c->next) {
            if (x->d) {
                if (bind(C, NULL, NULL) || bind(C, x->s, c)) { free(items); return X_ERR; }
                const cJSON *ok = eval(C, x->d);
                C->nvars = mark;
                if (!ok) { free(items); return X_ERR; }
                if (!truthy(ok)) continue;
            }
            items[n++] = c;
        }
    }
    int rc = X_OK;
    for (int i = 0; i < n && rc == X_OK; i++) {
        if (++C->iters > MAX_ITER) { rerr(C, x, "loops ran past %d iterations", MAX_ITER); rc = X_ERR; break; }
        const int mark = C->nvars;
        cJSON *loop = cJSON_CreateObject();
        if (!keep(C, loop)) { rc = X_ERR; break; }
        cJSON_AddNumberToObject(loop, "index0", i);
        cJSON_AddNumberToObject(loop, "index", i + 1);
        cJSON_AddNumberToObject(loop, "revindex", n - i);
        cJSON_AddNumberToObject(loop, "revindex0", n - i - 1);
        cJSON_AddBoolToObject(loop, "first", i == 0);
        cJSON_AddBoolToObject(loop, "last", i == n - 1);
        cJSON_AddNumberToObject(loop, "length", n);
        if (i > 0) cJSON_AddItemToObject(loop, "previtem", dupv(C, NULL, items[i - 1]));
        if (i + 1 < n) cJSON_AddItemToObject(loop, "nextitem", dupv(C, NULL, items[i + 1]));
        if (bind(C, NULL, NULL) || bind(C, "loop", loop)) { rc = X_ERR; break; }
        if (x->s2) {
            if (!cJSON_IsArray(items[i]) || cJSON_GetArraySize(items[i]) != 2) { rerr(C, x, "cannot unpack %s into two names", type_name(items[i])); rc = X_ERR; break; }
            if (bind(C, x->s, items[i]->child) || bind(C, x->s2, items[i]->child->next)) { rc = X_ERR; break; }
        } else if (bind(C, x->s, items[i])) { rc = X_ERR; break; }
        rc = exec(C, x->b);
        C->nvars = mark;
        if (rc == X_CONTINUE) rc = X_OK;
    }
    free(items);
    if (rc == X_BREAK) rc = X_OK;
    if (rc == X_OK && n == 0 && x->c) rc = exec(C, x->c);
    return rc;
}

static int exec(ctx *C, const node *x) {
    if (C->failed) return X_ERR;
    if (++C->steps > MAX_STEPS) { rerr(C, x, "the template ran past %d steps", MAX_STEPS); return X_ERR; }
    if (++C->depth > MAX_DEPTH * 2) { rerr(C, x, "nested too deeply"); return X_ERR; }
    int rc = X_OK;
    switch (x->k) {
    case S_TEXT: rc = emit(C, x, x->s, x->n); break;
    case S_OUT: {
        const cJSON *v = eval(C, x->a);
        if (v && !is_undef(v) && !(v = to_str(C, x, v))) v = NULL;
        if (!v) rc = X_ERR;
        else if (!is_undef(v)) rc = emit(C, x, v->valuestring, strlen(v->valuestring));
        break;
    }
    case S_IF: {
        const cJSON *c = eval(C, x->a);
        if (!c) rc = X_ERR;
        else if (truthy(c)) rc = exec(C, x->b);
        else if (x->c) rc = exec(C, x->c);
        break;
    }
    case S_FOR: rc = exec_for(C, x); break;
    case S_SET: {
        const cJSON *v = eval(C, x->a);
        if (!v) { rc = X_ERR; break; }
        if (x->s2) {
            const cJSON *ns = lookup(C, x->s);
            if (!cJSON_IsObject(ns)) { rerr(C, x, "'%s' is not a namespace", x->s); rc = X_ERR; break; }
            /* only namespaces made by this render carry the mark: a caller's variable is never written */
            if (!(ns->type & NS_MARK)) { rerr(C, x, "'%s' is not a namespace", x->s); rc = X_ERR; break; }
            cJSON *d = dupv(C, NULL, v);
            if (!d) { rerr(C, x, "out of memory"); rc = X_ERR; break; }
            cJSON *old = cJSON_DetachItemFromObjectCaseSensitive((cJSON *)ns, x->s2);
            if (old && !keep(C, old)) { cJSON_Delete(d); rc = X_ERR; break; }   /* values bound to it stay alive */
            cJSON_AddItemToObject((cJSON *)ns, x->s2, d);
        } else if (bind(C, x->s, v)) rc = X_ERR;
        break;
    }
    case S_MACRO:
        if (C->nmacro == 64) { rerr(C, x, "more than 64 macros"); rc = X_ERR; break; }
        C->macro[C->nmacro++] = x;
        break;
    case S_BREAK: rc = X_BREAK; break;
    case S_CONTINUE: rc = X_CONTINUE; break;
    case S_BLOCK:
        if (x->b) { rc = exec(C, x->b); break; }
        for (int i = 0; i < x->nk && rc == X_OK; i++) rc = exec(C, x->kid[i]);
        break;
    default: rerr(C, x, "not a statement"); rc = X_ERR;
    }
    C->depth--;
    if (C->failed) rc = X_ERR;
    return rc;
}

char *jinja_render(const jinja_tmpl *t, const cJSON *vars, size_t max_out, size_t *len, char *err, size_t errlen) {
    ctx C = { .globals = vars, .max_out = max_out, .err = err, .errlen = errlen };
    if (errlen) err[0] = 0;
    C.undef = cJSON_CreateNull();
    if (!C.undef) { snprintf(err, errlen, "out of memory"); return NULL; }
    C.undef->type = cJSON_Invalid;
    int rc = emit(&C, NULL, "", 0) ? X_ERR : exec(&C, t->root);
    if (rc == X_BREAK || rc == X_CONTINUE) { rerr(&C, NULL, "break or continue outside a loop"); rc = X_ERR; }
    for (int i = 0; i < C.narena; i++) cJSON_Delete(C.arena[i]);
    free(C.arena);
    free(C.vars);
    cJSON_Delete(C.undef);
    if (rc != X_OK) { free(C.out); return NULL; }
    if (len) *len = C.len;
    return C.out;
}
