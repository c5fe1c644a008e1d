/* grammar.c — GBNF-subset grammars compiled to flat rules, and the
 * hash-consed set-of-stacks matcher that masks the vocabulary (grammar.h).
 *
 * Representation. Each rule is a list of alternatives; each alternative is a
 * run of elements in one array ending with an END element. An element is a
 * character class (code point ranges) or a reference to a rule. A parse
 * position is a stack: the element to match next and, below it, where to go
 * on when its alternative ends. Stacks are persistent lists of nodes
 * (element, parent node), hash-consed so that an equal stack is one node id;
 * a grammar state is a sorted set of nodes whose top is a character class
 * (node 0 stands for the empty stack: the grammar may end) plus up to three
 * bytes of a pending UTF-8 character; sets and states are hash-consed too.
 * Transitions (state, byte) -> state and token masks per state are memoized,
 * so a state seen again costs one lookup.
 *
 * Why the bits of the output cannot depend on anything but the history: a
 * state id is assigned in the order states are first met, but what a state
 * *is* (its node set and pending bytes) is a function of the bytes consumed,
 * and masks and transitions are functions of what a state is. The ids never
 * reach a logit. */
#include "grammar.h"
#include "common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ========================================================================
 * Compiled grammar
 * ===================================================================== */

enum { GE_END = 0, GE_CHAR = 1, GE_RULE = 2 };
typedef struct { uint32_t lo, hi; } crange;
typedef struct { int type, a, b; } gel;   /* CHAR: ranges rg[a .. a+b); RULE: rule a */

#define G_MAX_ELEMENTS (1 << 22)
#define G_MAX_REPEAT 10000
#define G_MAX_DEPTH 4096           /* stack depth of a parse position        */
#define G_MAX_NODES (1 << 23)      /* hash-consed stack nodes per matcher    */
#define G_TOKEN_MAX_BYTES 4096

struct ds_grammar {
    gel    *el;   int n_el;
    crange *rg;   int n_rg;
    int    *alt;  int n_alt;        /* start element of each alternative      */
    int    *r_alt0, *r_nalt;        /* per rule: its alternatives             */
    int     n_rule, root;
    /* vocabulary */
    int      V;
    uint8_t *kind;                  /* 0 bytes, 1 end of generation, 2 no bytes */
    size_t  *tb_off;                /* token t's bytes: tb[tb_off[t] .. tb_off[t+1]) */
    char    *tb;
    /* byte trie of the tokens with bytes: node 0 is the root; a node's
     * children are t_child[t_c0 .. t_c0 + t_nc), its tokens t_tok[t_t0 .. +t_nt) */
    int     *t_c0, *t_nc, *t_t0, *t_nt;
    uint8_t *t_byte;
    int      n_tnode;
    int32_t *t_tok;                 /* token ids sorted by their bytes        */
};

int ds_grammar_n_rules(const ds_grammar *g) { return g->n_rule; }

void ds_grammar_free(ds_grammar *g) {
    if (!g) return;
    free(g->el); free(g->rg); free(g->alt); free(g->r_alt0); free(g->r_nalt);
    free(g->kind); free(g->tb_off); free(g->tb);
    free(g->t_c0); free(g->t_nc); free(g->t_t0); free(g->t_nt); free(g->t_byte); free(g->t_tok);
    free(g);
}

/* ========================================================================
 * Parser: text -> rules of alternatives of element sequences
 * ===================================================================== */

typedef struct { gel *e; int n, cap; } gseq;
typedef struct { gseq *a; int n, cap; } galts;

typedef struct {
    const char *s;
    size_t      n, i;
    char       *err;
    size_t      errlen;
    int         failed;
    galts      *rules;
    char      **names;
    int        *defined;
    int         n_rules, cap_rules;
    crange     *rg;
    int         n_rg, cap_rg;
    long        n_el;               /* elements so far (a bound on the size)  */
} gparser;

static void gp_fail(gparser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void gp_fail(gparser *p, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = 1;
    int line = 1, col = 1;
    for (size_t k = 0; k < p->i && k < p->n; k++) {
        if (p->s[k] == '\n') { line++; col = 1; } else col++;
    }
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ds_errf(p->err, p->errlen, "grammar: line %d column %d: %s", line, col, msg);
}

static int grow(void **ptr, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 8;
    while (c < need) {
        if (c > (1 << 28)) return -1;
        c *= 2;
    }
    void *q = realloc(*ptr, (size_t)c * elem);
    if (!q) return -1;
    *ptr = q;
    *cap = c;
    return 0;
}

/* Grow k parallel arrays (*arr[i], elements of size[i]) to hold `need`,
 * doubling from *cap (at least `first`). 0, or -1 out of memory (the arrays
 * grown so far keep their contents). */
static int grow_all(int k, void **const arr[], const size_t size[], int *cap, int need, int first) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : first;
    while (c < need) {
        if (c > (1 << 28)) return -1;
        c *= 2;
    }
    for (int i = 0; i < k; i++) {
        void *q = realloc(*arr[i], (size_t)c * size[i]);
        if (!q) return -1;
        *arr[i] = q;
    }
    *cap = c;
    return 0;
}

static void seq_add(gparser *p, gseq *q, gel e) {
    if (p->failed) return;
    if (++p->n_el > G_MAX_ELEMENTS) { gp_fail(p, "the grammar expands to more than %d elements", G_MAX_ELEMENTS); return; }
    if (grow((void **)&q->e, &q->cap, q->n + 1, sizeof *q->e)) { gp_fail(p, "out of memory"); return; }
    q->e[q->n++] = e;
}

static gseq *alts_new(gparser *p, int rule) {
    galts *r = &p->rules[rule];
    if (grow((void **)&r->a, &r->cap, r->n + 1, sizeof *r->a)) { gp_fail(p, "out of memory"); return NULL; }
    gseq *q = &r->a[r->n++];
    memset(q, 0, sizeof *q);
    return q;
}

static int rule_add(gparser *p, const char *name, size_t len) {
    if (grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof *p->rules)) { gp_fail(p, "out of memory"); return -1; }
    char **nn = realloc(p->names, (size_t)(p->n_rules + 1) * sizeof *nn);
    if (nn) p->names = nn;
    int *dd = nn ? realloc(p->defined, (size_t)(p->n_rules + 1) * sizeof *dd) : NULL;
    if (dd) p->defined = dd;
    char *s = dd ? malloc(len + 1) : NULL;
    if (!s) { gp_fail(p, "out of memory"); return -1; }
    memcpy(s, name, len);
    s[len] = 0;
    int id = p->n_rules++;
    memset(&p->rules[id], 0, sizeof p->rules[id]);
    p->names[id] = s;
    p->defined[id] = 0;
    return id;
}

static int rule_find(gparser *p, const char *name, size_t len) {
    for (int r = 0; r < p->n_rules; r++)
        if (strlen(p->names[r]) == len && !memcmp(p->names[r], name, len)) return r;
    return rule_add(p, name, len);
}

/* a rule of the parser's own (groups, repetitions): a name no text can use */
static int rule_synth(gparser *p, int parent) {
    char buf[96];
    int k = snprintf(buf, sizeof buf, "%.60s~%d", parent >= 0 ? p->names[parent] : "", p->n_rules);
    int id = rule_add(p, buf, (size_t)k);
    if (id >= 0) p->defined[id] = 1;
    return id;
}

static int is_name_char(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }

/* whitespace, newlines and # comments */
static void skip_space(gparser *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->i++;
        else if (c == '#') { while (p->i < p->n && p->s[p->i] != '\n') p->i++; }
        else break;
    }
}

/* at `name ::=`: where the next rule begins */
static int at_rule_start(const gparser *p) {
    size_t k = p->i;
    if (k >= p->n || !is_name_char((unsigned char)p->s[k])) return 0;
    while (k < p->n && is_name_char((unsigned char)p->s[k])) k++;
    while (k < p->n && (p->s[k] == ' ' || p->s[k] == '\t')) k++;
    return k + 3 <= p->n && !memcmp(p->s + k, "::=", 3);
}

/* One UTF-8 character of the grammar text (the text itself must be valid). */
static uint32_t read_utf8(gparser *p) {
    const unsigned char *u = (const unsigned char *)p->s + p->i;
    size_t left = p->n - p->i;
    uint32_t c = u[0];
    int len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!len || (size_t)len > left) { gp_fail(p, "the grammar text is not valid UTF-8"); return 0; }
    if (len == 1) { p->i++; return c; }
    c &= 0x7Fu >> len;
    for (int k = 1; k < len; k++) {
        if ((u[k] & 0xC0) != 0x80) { gp_fail(p, "the grammar text is not valid UTF-8"); return 0; }
        c = (c << 6) | (u[k] & 0x3F);
    }
    static const uint32_t min[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (c < min[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) { gp_fail(p, "the grammar text is not valid UTF-8"); return 0; }
    p->i += (size_t)len;
    return c;
}

static uint32_t read_hex(gparser *p, int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        if (p->i >= p->n) { gp_fail(p, "a \\x / \\u escape needs %d hex digits", digits); return 0; }
        char c = p->s[p->i++];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) { gp_fail(p, "a \\x / \\u escape needs %d hex digits", digits); return 0; }
        v = v * 16 + (uint32_t)d;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { gp_fail(p, "escape U+%X is not a Unicode scalar value", v); return 0; }
    return v;
}

/* A character inside a literal or a class (escapes resolved). */
static uint32_t read_char(gparser *p) {
    if (p->i >= p->n) { gp_fail(p, "unexpected end of the grammar"); return 0; }
    if (p->s[p->i] != '\\') return read_utf8(p);
    p->i++;
    if (p->i >= p->n) { gp_fail(p, "unexpected end after '\\'"); return 0; }
    char c = p->s[p->i++];
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '0': return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '/': return (uint32_t)c;
    case 'x': return read_hex(p, 2);
    case 'u': return read_hex(p, 4);
    case 'U': return read_hex(p, 8);
    default: p->i--; gp_fail(p, "unknown escape '\\%c'", c); return 0;
    }
}

static int range_add(gparser *p, uint32_t lo, uint32_t hi) {
    if (grow((void **)&p->rg, &p->cap_rg, p->n_rg + 1, sizeof *p->rg)) { gp_fail(p, "out of memory"); return -1; }
    p->rg[p->n_rg++] = (crange){ lo, hi };
    return 0;
}

static int crange_cmp(const void *a, const void *b) {
    const crange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

/* [lo, hi] without the surrogates (no characters of UTF-8) */
static void range_add_scalar(gparser *p, uint32_t lo, uint32_t hi) {
    if (lo < 0xD800 && hi >= 0xD800) {
        range_add(p, lo, 0xD7FF);
        if (hi > 0xDFFF) range_add(p, 0xE000, hi);
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
        if (hi > 0xDFFF) range_add(p, 0xE000, hi);
    } else range_add(p, lo, hi);
}

/* Sort and merge rg[start..), complement it when negated (within the
 * Unicode scalar values), and return a CHAR element over the result. */
static gel class_finish(gparser *p, int start, int negated) {
    int n = p->n_rg - start;
    qsort(p->rg + start, (size_t)n, sizeof *p->rg, crange_cmp);
    int m = 0;
    for (int k = 0; k < n; k++) {
        crange r = p->rg[start + k];
        if (m && r.lo <= p->rg[start + m - 1].hi + 1) {
            if (r.hi > p->rg[start + m - 1].hi) p->rg[start + m - 1].hi = r.hi;
        } else p->rg[start + m++] = r;
    }
    p->n_rg = start + m;
    if (negated) {
        crange *pos = malloc((size_t)(m ? m : 1) * sizeof *pos);
        if (!pos) { gp_fail(p, "out of memory"); return (gel){ GE_CHAR, start, 0 }; }
        memcpy(pos, p->rg + start, (size_t)m * sizeof *pos);
        p->n_rg = start;
        uint32_t from = 0;                       /* the gaps between the ranges */
        int open = 1;
        for (int k = 0; k < m; k++) {
            if (pos[k].lo > from) range_add_scalar(p, from, pos[k].lo - 1);
            if (pos[k].hi >= 0x10FFFF) { open = 0; break; }
            from = pos[k].hi + 1;
        }
        if (open && from <= 0x10FFFF) range_add_scalar(p, from, 0x10FFFF);
        free(pos);
    }
    return (gel){ GE_CHAR, start, p->n_rg - start };
}

static void parse_alternatives(gparser *p, int rule, int depth);

/* Wrap q->e[from..) into a rule of its own (unless it is one reference
 * already) and return that rule. */
static int item_rule(gparser *p, gseq *q, int from, int parent) {
    if (q->n - from == 1 && q->e[from].type == GE_RULE) {
        q->n = from;
        return q->e[from].a;
    }
    int r = rule_synth(p, parent);
    if (r < 0) return -1;
    gseq *a = alts_new(p, r);
    if (!a) return -1;
    for (int k = from; k < q->n; k++) seq_add(p, a, q->e[k]);
    q->n = from;
    return r;
}

/* x* as a rule R ::= x R | (empty) */
static int star_rule(gparser *p, int x, int parent) {
    int r = rule_synth(p, parent);
    if (r < 0) return -1;
    gseq *a = alts_new(p, r);
    if (!a) return -1;
    seq_add(p, a, (gel){ GE_RULE, x, 0 });
    seq_add(p, a, (gel){ GE_RULE, r, 0 });
    if (!alts_new(p, r)) return -1;
    return r;
}

/* The postfix operator after an item that occupies q->e[from..). */
static void parse_postfix(gparser *p, gseq *q, int from, int parent) {
    if (p->i >= p->n) return;
    char c = p->s[p->i];
    long m, n;
    if (c == '*') { m = 0; n = -1; p->i++; }
    else if (c == '+') { m = 1; n = -1; p->i++; }
    else if (c == '?') { m = 0; n = 1; p->i++; }
    else if (c == '{') {
        p->i++;
        char *end;
        const char *b = p->s + p->i;
        m = strtol(b, &end, 10);
        if (end == b || m < 0) { gp_fail(p, "a repetition {m,n} needs a count"); return; }
        p->i += (size_t)(end - b);
        n = m;
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            b = p->s + p->i;
            n = strtol(b, &end, 10);
            if (end == b) n = -1;
            else if (n < m) { gp_fail(p, "repetition {%ld,%ld}: the maximum is below the minimum", m, n); return; }
            p->i += (size_t)(end - b);
        }
        if (p->i >= p->n || p->s[p->i] != '}') { gp_fail(p, "a repetition needs '}'"); return; }
        p->i++;
        if (m > G_MAX_REPEAT || n > G_MAX_REPEAT) { gp_fail(p, "repetitions are limited to %d", G_MAX_REPEAT); return; }
    } else return;
    if (q->n == from) { gp_fail(p, "a repetition needs something to repeat"); return; }
    int x = item_rule(p, q, from, parent);
    if (x < 0 || p->failed) return;
    for (long k = 0; k < m; k++) seq_add(p, q, (gel){ GE_RULE, x, 0 });
    if (n < 0) {
        int s = star_rule(p, x, parent);
        if (s >= 0) seq_add(p, q, (gel){ GE_RULE, s, 0 });
    } else if (n > m) {
        /* up to n - m more: O_1 ::= x O_2 | (empty), ..., O_k ::= x | (empty) */
        int prev = -1;
        for (long k = 0; k < n - m && !p->failed; k++) {
            int o = rule_synth(p, parent);
            if (o < 0) return;
            gseq *a = alts_new(p, o);
            if (!a) return;
            seq_add(p, a, (gel){ GE_RULE, x, 0 });
            if (prev >= 0) seq_add(p, a, (gel){ GE_RULE, prev, 0 });
            if (!alts_new(p, o)) return;
            prev = o;
        }
        if (prev >= 0) seq_add(p, q, (gel){ GE_RULE, prev, 0 });
    }
    if (p->i < p->n && (p->s[p->i] == '*' || p->s[p->i] == '+' || p->s[p->i] == '?' || p->s[p->i] == '{'))
        gp_fail(p, "two repetition operators in a row (use a group)");
}

static void parse_sequence(gparser *p, gseq *q, int rule, int depth) {
    for (;;) {
        skip_space(p);
        if (p->failed || p->i >= p->n) return;
        char c = p->s[p->i];
        if (c == '|' || c == ')') return;
        if (depth == 0 && at_rule_start(p)) return;
        int from = q->n;
        if (c == '"') {
            p->i++;
            while (!p->failed && p->i < p->n && p->s[p->i] != '"') {
                uint32_t cp = read_char(p);
                int at = p->n_rg;
                if (range_add(p, cp, cp)) return;
                seq_add(p, q, (gel){ GE_CHAR, at, 1 });
            }
            if (p->i >= p->n) { gp_fail(p, "a literal is not closed with '\"'"); return; }
            p->i++;
        } else if (c == '[') {
            p->i++;
            int negated = p->i < p->n && p->s[p->i] == '^';
            if (negated) p->i++;
            int start = p->n_rg;
            while (!p->failed && p->i < p->n && p->s[p->i] != ']') {
                uint32_t lo = read_char(p), hi = lo;
                if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
                    p->i++;
                    hi = read_char(p);
                    if (hi < lo) { gp_fail(p, "class range U+%X-U+%X is backwards", lo, hi); return; }
                }
                if (range_add(p, lo, hi)) return;
            }
            if (p->i >= p->n) { gp_fail(p, "a character class is not closed with ']'"); return; }
            p->i++;
            if (p->n_rg == start && !negated) { gp_fail(p, "an empty character class matches nothing"); return; }
            seq_add(p, q, class_finish(p, start, negated));
        } else if (c == '.') {
            p->i++;
            int at = p->n_rg;
            range_add(p, 0, 0xD7FF);
            range_add(p, 0xE000, 0x10FFFF);
            seq_add(p, q, (gel){ GE_CHAR, at, 2 });
        } else if (c == '(') {
            p->i++;
            int r = rule_synth(p, rule);
            if (r < 0) return;
            parse_alternatives(p, r, depth + 1);
            skip_space(p);
            if (p->failed) return;
            if (p->i >= p->n || p->s[p->i] != ')') { gp_fail(p, "a group is not closed with ')'"); return; }
            p->i++;
            seq_add(p, q, (gel){ GE_RULE, r, 0 });
        } else if (is_name_char((unsigned char)c)) {
            size_t b = p->i;
            while (p->i < p->n && is_name_char((unsigned char)p->s[p->i])) p->i++;
            int r = rule_find(p, p->s + b, p->i - b);
            if (r < 0) return;
            seq_add(p, q, (gel){ GE_RULE, r, 0 });
        } else {
            gp_fail(p, "unexpected character '%c'", c >= 0x20 && c < 0x7f ? c : '?');
            return;
        }
        parse_postfix(p, q, from, rule);
    }
}

static void parse_alternatives(gparser *p, int rule, int depth) {
    if (depth > 200) { gp_fail(p, "groups nested deeper than 200"); return; }
    for (;;) {
        gseq *q = alts_new(p, rule);
        if (!q) return;
        /* q may move when rules are added: parse into a local one */
        gseq local = { 0 };
        parse_sequence(p, &local, rule, depth);
        q = &p->rules[rule].a[p->rules[rule].n - 1];
        *q = local;
        skip_space(p);
        if (p->failed || p->i >= p->n || p->s[p->i] != '|') return;
        p->i++;
    }
}

/* ---- checks: every rule defined, root present, no left recursion ------- */

/* nullable[r]: rule r can match the empty string */
static void compute_nullable(const gparser *p, int *nullable) {
    memset(nullable, 0, (size_t)p->n_rules * sizeof *nullable);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < p->n_rules; r++) {
            if (nullable[r]) continue;
            for (int a = 0; a < p->rules[r].n && !nullable[r]; a++) {
                const gseq *q = &p->rules[r].a[a];
                int all = 1;
                for (int k = 0; k < q->n && all; k++) all = q->e[k].type == GE_RULE && nullable[q->e[k].a];
                if (all) { nullable[r] = 1; changed = 1; }
            }
        }
    }
}

/* A rule that can reach itself in a leftmost position (through nullable
 * prefixes) can never be matched from the left: refuse it. DFS with colors. */
static int left_recursive(const gparser *p, const int *nullable, int r, int *color) {
    color[r] = 1;
    for (int a = 0; a < p->rules[r].n; a++) {
        const gseq *q = &p->rules[r].a[a];
        for (int k = 0; k < q->n; k++) {
            if (q->e[k].type != GE_RULE) break;
            int t = q->e[k].a;
            if (color[t] == 1) return t;
            if (color[t] == 0) {
                int x = left_recursive(p, nullable, t, color);
                if (x >= 0) return x;
            }
            if (!nullable[t]) break;
        }
    }
    color[r] = 2;
    return -1;
}

static void parser_free(gparser *p) {
    for (int r = 0; r < p->n_rules; r++) {
        for (int a = 0; a < p->rules[r].n; a++) free(p->rules[r].a[a].e);
        free(p->rules[r].a);
        free(p->names[r]);
    }
    free(p->rules); free(p->names); free(p->defined); free(p->rg);
}

/* ========================================================================
 * The vocabulary: token bytes and their trie
 * ===================================================================== */

typedef struct { const ds_grammar *g; } tokcmp_ctx;

static int tok_cmp(const void *a, const void *b, void *ctx) {
    const ds_grammar *g = ((const tokcmp_ctx *)ctx)->g;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = g->tb_off[x + 1] - g->tb_off[x], ly = g->tb_off[y + 1] - g->tb_off[y];
    int c = memcmp(g->tb + g->tb_off[x], g->tb + g->tb_off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Children of the node holding sorted tokens [lo, hi) that share `depth`
 * bytes: the tokens of exactly that length end here (they sort first); the
 * rest are grouped by their next byte. Breadth first, so a node's children
 * are contiguous. */
static int build_trie(ds_grammar *g, int n_sorted) {
    int cap = 0, *lo = NULL, *hi = NULL, *dep = NULL;
    void **const arr[] = { (void **)&lo, (void **)&hi, (void **)&dep, (void **)&g->t_c0, (void **)&g->t_nc, (void **)&g->t_t0,
                           (void **)&g->t_nt, (void **)&g->t_byte };
    const size_t size[] = { sizeof *lo, sizeof *hi, sizeof *dep, sizeof *g->t_c0, sizeof *g->t_nc, sizeof *g->t_t0,
                            sizeof *g->t_nt, sizeof *g->t_byte };
    if (grow_all(8, arr, size, &cap, 1, 1024)) goto oom;
    int n = 1;
    lo[0] = 0; hi[0] = n_sorted; dep[0] = 0; g->t_byte[0] = 0;
    for (int v = 0; v < n; v++) {
        int a = lo[v], b = hi[v], d = dep[v];
        int t = a;
        while (t < b && (int)(g->tb_off[g->t_tok[t] + 1] - g->tb_off[g->t_tok[t]]) == d) t++;
        g->t_t0[v] = a;
        g->t_nt[v] = t - a;
        g->t_c0[v] = n;
        g->t_nc[v] = 0;
        while (t < b) {
            unsigned char c = (unsigned char)g->tb[g->tb_off[g->t_tok[t]] + (size_t)d];
            int e = t;
            while (e < b && (unsigned char)g->tb[g->tb_off[g->t_tok[e]] + (size_t)d] == c) e++;
            if (grow_all(8, arr, size, &cap, n + 1, 1024)) goto oom;
            lo[n] = t; hi[n] = e; dep[n] = d + 1; g->t_byte[n] = c;
            n++;
            g->t_nc[v]++;
            t = e;
        }
    }
    g->n_tnode = n;
    free(lo); free(hi); free(dep);
    return 0;
oom:
    free(lo); free(hi); free(dep);
    return -1;
}

static int load_vocab(ds_grammar *g, const ds_tokenizer *tok) {
    const int V = ds_tokenizer_n_vocab(tok);
    g->V = V;
    g->kind = malloc((size_t)V);
    g->tb_off = malloc(((size_t)V + 1) * sizeof *g->tb_off);
    g->t_tok = malloc((size_t)V * sizeof *g->t_tok);
    char *buf = malloc(G_TOKEN_MAX_BYTES);
    if (!g->kind || !g->tb_off || !g->t_tok || !buf) { free(buf); return -1; }
    size_t total = 0, cap = 1 << 16;
    g->tb = malloc(cap);
    if (!g->tb) { free(buf); return -1; }
    int n_sorted = 0;
    for (int t = 0; t < V; t++) {
        int k = ds_token_to_bytes(tok, t, buf, G_TOKEN_MAX_BYTES);
        if (k < 0 || k > G_TOKEN_MAX_BYTES) k = 0;      /* longer than any real token: never allowed */
        g->tb_off[t] = total;
        g->kind[t] = ds_tokenizer_is_eog(tok, t) ? 1 : k == 0 ? 2 : 0;
        if (g->kind[t] == 1) k = 0;                       /* an EOG has no bytes to match */
        if (total + (size_t)k > cap) {
            while (total + (size_t)k > cap) cap *= 2;
            char *q = realloc(g->tb, cap);
            if (!q) { free(buf); return -1; }
            g->tb = q;
        }
        memcpy(g->tb + total, buf, (size_t)k);
        total += (size_t)k;
        if (k > 0) g->t_tok[n_sorted++] = t;
    }
    g->tb_off[V] = total;
    free(buf);
    tokcmp_ctx cx = { g };
    qsort_r(g->t_tok, (size_t)n_sorted, sizeof *g->t_tok, tok_cmp, &cx);
    return build_trie(g, n_sorted);
}

ds_grammar *ds_grammar_new(const char *text, size_t len, const ds_tokenizer *tok, char *err, size_t errlen) {
    gparser p = { 0 };
    p.s = text ? text : "";
    p.n = text ? len : 0;
    p.err = err;
    p.errlen = errlen;
    for (;;) {
        skip_space(&p);
        if (p.failed || p.i >= p.n) break;
        size_t b = p.i;
        while (p.i < p.n && is_name_char((unsigned char)p.s[p.i])) p.i++;
        if (p.i == b) { gp_fail(&p, "a rule must start with a name"); break; }
        size_t nl = p.i - b;
        while (p.i < p.n && (p.s[p.i] == ' ' || p.s[p.i] == '\t')) p.i++;
        if (p.i + 3 > p.n || memcmp(p.s + p.i, "::=", 3)) { gp_fail(&p, "expected '::=' after the rule name"); break; }
        p.i += 3;
        int r = rule_find(&p, p.s + b, nl);
        if (r < 0) break;
        if (p.defined[r]) { p.i = b; gp_fail(&p, "rule '%s' is defined twice", p.names[r]); break; }
        p.defined[r] = 1;
        parse_alternatives(&p, r, 0);
        skip_space(&p);
        if (!p.failed && p.i < p.n && !at_rule_start(&p)) gp_fail(&p, "unexpected '%c'", p.s[p.i]);
    }
    int root = -1;
    for (int r = 0; r < p.n_rules && !p.failed; r++) {
        if (!p.defined[r]) gp_fail(&p, "rule '%s' is used but not defined", p.names[r]);
        if (!strcmp(p.names[r], "root")) root = r;
    }
    if (!p.failed && root < 0) gp_fail(&p, "no rule named 'root'");
    if (!p.failed) {
        int *nullable = malloc((size_t)p.n_rules * sizeof *nullable), *color = calloc((size_t)p.n_rules, sizeof *color);
        if (!nullable || !color) gp_fail(&p, "out of memory");
        else {
            compute_nullable(&p, nullable);
            for (int r = 0; r < p.n_rules && !p.failed; r++) {
                int x = color[r] ? -1 : left_recursive(&p, nullable, r, color);
                if (x >= 0) {
                    const char *nm = p.names[x];
                    const char *t = strchr(nm, '~');
                    ds_errf(err, errlen, "grammar: rule '%.*s' is left-recursive (it can start with itself); rewrite it",
                            t ? (int)(t - nm) : (int)strlen(nm), nm);
                    p.failed = 1;
                }
            }
        }
        free(nullable);
        free(color);
    }
    ds_grammar *g = p.failed ? NULL : calloc(1, sizeof *g);
    if (!p.failed && !g) ds_errf(err, errlen, "grammar: out of memory");
    if (g) {   /* flatten */
        int n_alt = 0, n_el = 0;
        for (int r = 0; r < p.n_rules; r++) {
            n_alt += p.rules[r].n;
            for (int a = 0; a < p.rules[r].n; a++) n_el += p.rules[r].a[a].n + 1;
        }
        g->el = malloc((size_t)(n_el + 1) * sizeof *g->el);
        g->alt = malloc((size_t)(n_alt + 1) * sizeof *g->alt);
        g->r_alt0 = malloc((size_t)p.n_rules * sizeof *g->r_alt0);
        g->r_nalt = malloc((size_t)p.n_rules * sizeof *g->r_nalt);
        g->rg = p.rg;
        g->n_rg = p.n_rg;
        p.rg = NULL;
        if (!g->el || !g->alt || !g->r_alt0 || !g->r_nalt) {
            ds_errf(err, errlen, "grammar: out of memory");
            ds_grammar_free(g);
            g = NULL;
        } else {
            int e = 0, al = 0;
            for (int r = 0; r < p.n_rules; r++) {
                g->r_alt0[r] = al;
                g->r_nalt[r] = p.rules[r].n;
                for (int a = 0; a < p.rules[r].n; a++) {
                    g->alt[al++] = e;
                    for (int k = 0; k < p.rules[r].a[a].n; k++) g->el[e++] = p.rules[r].a[a].e[k];
                    g->el[e++] = (gel){ GE_END, 0, 0 };
                }
            }
            g->n_el = e;
            g->n_alt = al;
            g->n_rule = p.n_rules;
            g->root = root;
            if (load_vocab(g, tok)) {
                ds_errf(err, errlen, "grammar: out of memory for the vocabulary");
                ds_grammar_free(g);
                g = NULL;
            }
        }
    }
    parser_free(&p);
    return g;
}

/* ========================================================================
 * Matcher: hash-consed stacks, node sets and states
 * ===================================================================== */

/* open-addressing map from a 64-bit key to an int (>= 0) */
typedef struct { uint64_t *k; int32_t *v; size_t cap, n; } imap;

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

static int imap_grow(imap *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *k = malloc(cap * sizeof *k);
    int32_t *v = malloc(cap * sizeof *v);
    if (!k || !v) { free(k); free(v); return -1; }
    for (size_t i = 0; i < cap; i++) v[i] = -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->v[i] >= 0) {
            size_t h = mix64(m->k[i]) & (cap - 1);
            while (v[h] >= 0) h = (h + 1) & (cap - 1);
            k[h] = m->k[i];
            v[h] = m->v[i];
        }
    free(m->k); free(m->v);
    m->k = k; m->v = v; m->cap = cap;
    return 0;
}

/* the slot of key (its value < 0 when absent) */
static size_t imap_slot(const imap *m, uint64_t key) {
    size_t h = mix64(key) & (m->cap - 1);
    while (m->v[h] >= 0 && m->k[h] != key) h = (h + 1) & (m->cap - 1);
    return h;
}

static int32_t imap_get(const imap *m, uint64_t key) {
    if (!m->cap) return -1;
    return m->v[imap_slot(m, key)];
}

static int imap_put(imap *m, uint64_t key, int32_t val) {
    if ((m->n + 1) * 2 > m->cap && imap_grow(m)) return -1;
    size_t h = imap_slot(m, key);
    if (m->v[h] < 0) m->n++;
    m->k[h] = key;
    m->v[h] = val;
    return 0;
}

static void imap_free(imap *m) { free(m->k); free(m->v); memset(m, 0, sizeof *m); }

#define MASK_CACHE 16

struct ds_gmatch {
    const ds_grammar *g;
    /* stack nodes: (element, parent); node 0 = the empty stack */
    int32_t *n_el, *n_par, *n_depth;
    uint32_t *n_mark;
    int n_node, cap_node;
    imap node_map;
    /* node sets: members in set_pool[set_off .. set_off + set_len), sorted */
    int32_t *set_pool; size_t pool_n, pool_cap;
    size_t *set_off; int32_t *set_len; uint64_t *set_hash;
    int n_set, cap_set;
    imap set_map;                   /* hash -> first set id with it           */
    int32_t *set_next;              /* ... then the next one with that hash   */
    /* states: a set and the bytes of a pending UTF-8 character */
    int32_t *st_set; uint32_t *st_pb; uint8_t *st_pn;
    int n_st, cap_st;
    imap st_map, trans;
    /* token masks of recent states */
    int32_t mask_state[MASK_CACHE];
    uint8_t *mask_bits[MASK_CACHE];
    int mask_next;
    /* scratch */
    int32_t *work, *out; int cap_work, cap_out, n_out;
    uint32_t mark;
    int start;
    char error[160];
    int oom;
};

const char *ds_gmatch_error(const ds_gmatch *m) { return m->error; }

static void gm_fail(ds_gmatch *m, const char *msg) {
    if (!m->oom) snprintf(m->error, sizeof m->error, "%s", msg);
    m->oom = 1;
}

static int node_get(ds_gmatch *m, int el, int par) {
    const uint64_t key = ((uint64_t)(uint32_t)el << 32) | (uint32_t)(par + 1);
    int32_t id = imap_get(&m->node_map, key);
    if (id >= 0) return id;
    if (m->n_node >= G_MAX_NODES) { gm_fail(m, "grammar: the matcher's state grew past its limit"); return -1; }
    int d = par >= 0 ? m->n_depth[par] + 1 : 1;
    if (d > G_MAX_DEPTH) { gm_fail(m, "grammar: nesting deeper than the matcher's limit"); return -1; }
    if (m->n_node >= m->cap_node) {
        void **const arr[] = { (void **)&m->n_el, (void **)&m->n_par, (void **)&m->n_depth, (void **)&m->n_mark };
        const size_t size[] = { sizeof *m->n_el, sizeof *m->n_par, sizeof *m->n_depth, sizeof *m->n_mark };
        const int old = m->cap_node;
        if (grow_all(4, arr, size, &m->cap_node, m->n_node + 1, 1024)) { gm_fail(m, "grammar: out of memory"); return -1; }
        for (int i = old; i < m->cap_node; i++) m->n_mark[i] = 0;
    }
    id = m->n_node++;
    m->n_el[id] = el;
    m->n_par[id] = par;
    m->n_depth[id] = d;
    if (imap_put(&m->node_map, key, id)) { gm_fail(m, "grammar: out of memory"); return -1; }
    return id;
}

static int push_int(ds_gmatch *m, int32_t **a, int *cap, int n, int32_t v) {
    if (n >= *cap) {
        int c = *cap ? *cap * 2 : 256;
        int32_t *q = realloc(*a, (size_t)c * sizeof *q);
        if (!q) { gm_fail(m, "grammar: out of memory"); return -1; }
        *a = q;
        *cap = c;
    }
    (*a)[n] = v;
    return 0;
}

/* Expand position (el, par) into the character-class positions it can be
 * at without consuming input, appended to m->out (deduplicated with the
 * current mark). Each visited position is a node, marked once. */
static void expand(ds_gmatch *m, int el, int par) {
    const ds_grammar *g = m->g;
    int nw = 0;
    int first = node_get(m, el, par);
    if (first < 0) return;
    if (push_int(m, &m->work, &m->cap_work, nw++, first)) return;
    while (nw > 0 && !m->oom) {
        int id = m->work[--nw];
        if (m->n_mark[id] == m->mark) continue;
        m->n_mark[id] = m->mark;
        if (id == 0) { if (!push_int(m, &m->out, &m->cap_out, m->n_out, 0)) m->n_out++; continue; }
        const gel *e = &g->el[m->n_el[id]];
        const int p = m->n_par[id];
        if (e->type == GE_CHAR) {
            if (!push_int(m, &m->out, &m->cap_out, m->n_out, id)) m->n_out++;
        } else if (e->type == GE_END) {
            /* the alternative is done: go on where the parent says */
            int next = p < 0 ? 0 : p;
            if (push_int(m, &m->work, &m->cap_work, nw++, next)) return;
        } else {
            /* a rule: each alternative, continuing after the reference (the
             * parent itself when the reference ends its alternative) */
            int cont = g->el[m->n_el[id] + 1].type == GE_END ? p : node_get(m, m->n_el[id] + 1, p);
            if (m->oom) return;
            for (int a = 0; a < g->r_nalt[e->a]; a++) {
                int child = node_get(m, g->alt[g->r_alt0[e->a] + a], cont);
                if (child < 0 || push_int(m, &m->work, &m->cap_work, nw++, child)) return;
            }
        }
    }
}

static int i32_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The set id of m->out[0..n_out) (sorted and deduplicated already). */
static int set_intern(ds_gmatch *m) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < m->n_out; i++) h = (h ^ (uint32_t)m->out[i]) * 1099511628211ull;
    h ^= (uint64_t)m->n_out << 40;
    for (int32_t s = imap_get(&m->set_map, h); s >= 0; s = m->set_next[s])
        if (m->set_len[s] == m->n_out && !memcmp(m->set_pool + m->set_off[s], m->out, (size_t)m->n_out * sizeof *m->out))
            return s;
    {
        void **const arr[] = { (void **)&m->set_off, (void **)&m->set_len, (void **)&m->set_hash, (void **)&m->set_next };
        const size_t size[] = { sizeof *m->set_off, sizeof *m->set_len, sizeof *m->set_hash, sizeof *m->set_next };
        if (grow_all(4, arr, size, &m->cap_set, m->n_set + 1, 256)) { gm_fail(m, "grammar: out of memory"); return -1; }
    }
    if (m->pool_n + (size_t)m->n_out > m->pool_cap) {
        size_t cap = m->pool_cap ? m->pool_cap : 4096;
        while (cap < m->pool_n + (size_t)m->n_out) cap *= 2;
        int32_t *q = realloc(m->set_pool, cap * sizeof *q);
        if (!q) { gm_fail(m, "grammar: out of memory"); return -1; }
        m->set_pool = q;
        m->pool_cap = cap;
    }
    int s = m->n_set++;
    m->set_off[s] = m->pool_n;
    m->set_len[s] = m->n_out;
    m->set_hash[s] = h;
    memcpy(m->set_pool + m->pool_n, m->out, (size_t)m->n_out * sizeof *m->out);
    m->pool_n += (size_t)m->n_out;
    m->set_next[s] = imap_get(&m->set_map, h);
    if (imap_put(&m->set_map, h, s)) { gm_fail(m, "grammar: out of memory"); return -1; }
    return s;
}

static void out_finish(ds_gmatch *m) {
    qsort(m->out, (size_t)m->n_out, sizeof *m->out, i32_cmp);
    int k = 0;
    for (int i = 0; i < m->n_out; i++)
        if (!k || m->out[k - 1] != m->out[i]) m->out[k++] = m->out[i];
    m->n_out = k;
}

static int class_has(const ds_grammar *g, const gel *e, uint32_t lo, uint32_t hi) {
    for (int r = 0; r < e->b; r++) {
        const crange *c = &g->rg[e->a + r];
        if (c->lo <= hi && lo <= c->hi) return 1;
    }
    return 0;
}

/* The set after consuming code point cp from set s (-1: empty, -2: error). */
static int set_advance(ds_gmatch *m, int s, uint32_t cp) {
    m->mark++;
    m->n_out = 0;
    const int32_t *mem = m->set_pool + m->set_off[s];
    const int n = m->set_len[s];
    for (int i = 0; i < n && !m->oom; i++) {
        int id = mem[i];
        if (id == 0) continue;
        const gel *e = &m->g->el[m->n_el[id]];
        if (class_has(m->g, e, cp, cp)) expand(m, m->n_el[id] + 1, m->n_par[id]);
        mem = m->set_pool + m->set_off[s];     /* the pool may have moved */
    }
    if (m->oom) return -2;
    if (!m->n_out) return -1;
    out_finish(m);
    int r = set_intern(m);
    return r < 0 ? -2 : r;
}

/* any member of set s matches some code point in [lo, hi] */
static int set_can(const ds_gmatch *m, int s, uint32_t lo, uint32_t hi) {
    const int32_t *mem = m->set_pool + m->set_off[s];
    for (int i = 0; i < m->set_len[s]; i++)
        if (mem[i] && class_has(m->g, &m->g->el[m->n_el[mem[i]]], lo, hi)) return 1;
    return 0;
}

static int state_intern(ds_gmatch *m, int set, uint32_t pb, int pn) {
    /* the pending bytes (at most 3) and their count pack into the low 26 bits */
    const uint64_t key = ((uint64_t)(uint32_t)set << 32) | ((uint64_t)pb << 2) | (uint64_t)pn;
    int32_t id = imap_get(&m->st_map, key);
    if (id >= 0) return id;
    {
        void **const arr[] = { (void **)&m->st_set, (void **)&m->st_pb, (void **)&m->st_pn };
        const size_t size[] = { sizeof *m->st_set, sizeof *m->st_pb, sizeof *m->st_pn };
        if (grow_all(3, arr, size, &m->cap_st, m->n_st + 1, 256)) { gm_fail(m, "grammar: out of memory"); return -2; }
    }
    id = m->n_st++;
    m->st_set[id] = set;
    m->st_pb[id] = pb;
    m->st_pn[id] = (uint8_t)pn;
    if (imap_put(&m->st_map, key, id)) { gm_fail(m, "grammar: out of memory"); return -2; }
    return id;
}

/* UTF-8 (RFC 3629): the length a lead byte starts (0: not a lead), and the
 * range of its second byte. */
static int utf8_lead(unsigned b, unsigned *lo2, unsigned *hi2) {
    *lo2 = 0x80; *hi2 = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) { if (b == 0xE0) *lo2 = 0xA0; if (b == 0xED) *hi2 = 0x9F; return 3; }
    if (b >= 0xF0 && b <= 0xF4) { if (b == 0xF0) *lo2 = 0x90; if (b == 0xF4) *hi2 = 0x8F; return 4; }
    return 0;
}

/* The code points a pending sequence pb[0..pn) of total length L can still
 * become. */
static void utf8_span(const unsigned char *pb, int pn, int L, uint32_t *lo, uint32_t *hi) {
    uint32_t a = pb[0] & (0x7Fu >> L), b = a;
    unsigned lo2, hi2;
    utf8_lead(pb[0], &lo2, &hi2);
    for (int k = 1; k < L; k++) {
        unsigned mn = k == 1 ? lo2 : 0x80, mx = k == 1 ? hi2 : 0xBF;
        unsigned x = k < pn ? pb[k] : mn, y = k < pn ? pb[k] : mx;
        a = (a << 6) | (x & 0x3F);
        b = (b << 6) | (y & 0x3F);
    }
    *lo = a;
    *hi = b;
}

static int state_step(ds_gmatch *m, int s, unsigned char byte) {
    const uint64_t tk = ((uint64_t)(uint32_t)s << 8) | byte;
    int32_t t = imap_get(&m->trans, tk);
    if (t >= 0) return t - 1;                    /* stored + 1: 0 = dead */
    const int set = m->st_set[s], pn = m->st_pn[s];
    unsigned char pb[4];
    for (int k = 0; k < pn; k++) pb[k] = (unsigned char)(m->st_pb[s] >> (8 * k));
    int next;
    unsigned lo2, hi2;
    if (pn == 0) {
        if (byte < 0x80) {
            int ns = set_advance(m, set, byte);
            next = ns == -2 ? -2 : ns < 0 ? DS_GSTATE_DEAD : state_intern(m, ns, 0, 0);
        } else {
            int L = utf8_lead(byte, &lo2, &hi2);
            uint32_t lo, hi;
            pb[0] = byte;
            if (!L) next = DS_GSTATE_DEAD;
            else {
                utf8_span(pb, 1, L, &lo, &hi);
                next = set_can(m, set, lo, hi) ? state_intern(m, set, byte, 1) : DS_GSTATE_DEAD;
            }
        }
    } else {
        int L = utf8_lead(pb[0], &lo2, &hi2);
        unsigned mn = pn == 1 ? lo2 : 0x80, mx = pn == 1 ? hi2 : 0xBF;
        if (byte < mn || byte > mx) next = DS_GSTATE_DEAD;
        else {
            pb[pn] = byte;
            uint32_t lo, hi;
            utf8_span(pb, pn + 1, L, &lo, &hi);
            if (pn + 1 == L) {
                int ns = set_advance(m, set, lo);
                next = ns == -2 ? -2 : ns < 0 ? DS_GSTATE_DEAD : state_intern(m, ns, 0, 0);
            } else if (!set_can(m, set, lo, hi)) next = DS_GSTATE_DEAD;
            else {
                uint32_t packed = 0;
                for (int k = 0; k <= pn; k++) packed |= (uint32_t)pb[k] << (8 * k);
                next = state_intern(m, set, packed, pn + 1);
            }
        }
    }
    if (next == -2) return -2;
    if (imap_put(&m->trans, tk, next + 1)) { gm_fail(m, "grammar: out of memory"); return -2; }
    return next;
}

ds_gmatch *ds_gmatch_new(const ds_grammar *g) {
    ds_gmatch *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = g;
    for (int i = 0; i < MASK_CACHE; i++) m->mask_state[i] = -1;
    /* node 0: the empty stack (reached when root's alternative ends) */
    if (node_get(m, -1, -2) != 0) { ds_gmatch_free(m); return NULL; }
    m->mark = 1;
    m->n_out = 0;
    for (int a = 0; a < g->r_nalt[g->root] && !m->oom; a++) expand(m, g->alt[g->r_alt0[g->root] + a], -1);
    if (m->oom) { ds_gmatch_free(m); return NULL; }
    out_finish(m);
    int set = set_intern(m);
    m->start = set < 0 ? -1 : state_intern(m, set, 0, 0);
    if (m->start < 0) { ds_gmatch_free(m); return NULL; }
    return m;
}

void ds_gmatch_free(ds_gmatch *m) {
    if (!m) return;
    free(m->n_el); free(m->n_par); free(m->n_depth); free(m->n_mark);
    imap_free(&m->node_map);
    free(m->set_pool); free(m->set_off); free(m->set_len); free(m->set_hash); free(m->set_next);
    imap_free(&m->set_map);
    free(m->st_set); free(m->st_pb); free(m->st_pn);
    imap_free(&m->st_map);
    imap_free(&m->trans);
    for (int i = 0; i < MASK_CACHE; i++) free(m->mask_bits[i]);
    free(m->work); free(m->out);
    free(m);
}

int ds_gmatch_start(ds_gmatch *m) { return m->start; }

int ds_gmatch_bytes(ds_gmatch *m, int s, const char *bytes, size_t n) {
    if (m->oom) return -2;
    for (size_t i = 0; i < n && s >= 0; i++) s = state_step(m, s, (unsigned char)bytes[i]);
    return s;
}

int ds_gmatch_token(ds_gmatch *m, int s, int32_t t) {
    const ds_grammar *g = m->g;
    if (s < 0) return s;
    if (t < 0 || t >= g->V) return DS_GSTATE_DEAD;
    if (g->kind[t] == 1) return s;
    if (g->kind[t] == 2) return DS_GSTATE_DEAD;
    return ds_gmatch_bytes(m, s, g->tb + g->tb_off[t], g->tb_off[t + 1] - g->tb_off[t]);
}

int ds_gmatch_can_end(const ds_gmatch *m, int s) {
    if (s < 0 || m->st_pn[s]) return 0;
    const int set = m->st_set[s];
    return m->set_len[set] > 0 && m->set_pool[m->set_off[set]] == 0;   /* sorted: node 0 first */
}

int ds_gmatch_complete(const ds_gmatch *m, int s) {
    return ds_gmatch_can_end(m, s) && m->set_len[m->st_set[s]] == 1;
}

/* The allowed-token bitmap of state s (cached for the last MASK_CACHE states). */
static const uint8_t *state_mask(ds_gmatch *m, int s) {
    for (int i = 0; i < MASK_CACHE; i++)
        if (m->mask_state[i] == s) return m->mask_bits[i];
    const ds_grammar *g = m->g;
    int slot = m->mask_next;
    m->mask_next = (m->mask_next + 1) % MASK_CACHE;
    m->mask_state[slot] = -1;
    if (!m->mask_bits[slot] && !(m->mask_bits[slot] = malloc(((size_t)g->V + 7) / 8))) {
        gm_fail(m, "grammar: out of memory");
        return NULL;
    }
    uint8_t *bits = m->mask_bits[slot];
    memset(bits, 0, ((size_t)g->V + 7) / 8);
    if (ds_gmatch_can_end(m, s))
        for (int t = 0; t < g->V; t++)
            if (g->kind[t] == 1) bits[t >> 3] |= (uint8_t)(1u << (t & 7));
    /* walk the trie: a token is allowed iff the walk reaches its node alive */
    int32_t *stk = NULL;
    int cap = 0, n = 0;
    if (push_int(m, &stk, &cap, n, 0) || push_int(m, &stk, &cap, n + 1, s)) { free(stk); return NULL; }
    n = 2;
    while (n > 0 && !m->oom) {
        int st = stk[--n], node = stk[--n];
        for (int k = 0; k < g->t_nt[node]; k++) {
            int32_t t = g->t_tok[g->t_t0[node] + k];
            bits[t >> 3] |= (uint8_t)(1u << (t & 7));
        }
        for (int c = 0; c < g->t_nc[node]; c++) {
            int child = g->t_c0[node] + c;
            int ns = state_step(m, st, g->t_byte[child]);
            if (ns == -2) break;
            if (ns < 0) continue;
            if (push_int(m, &stk, &cap, n, child) || push_int(m, &stk, &cap, n + 1, ns)) break;
            n += 2;
        }
    }
    free(stk);
    if (m->oom) return NULL;
    m->mask_state[slot] = s;
    return bits;
}

int ds_gmatch_mask(ds_gmatch *m, int s, float *logits, int V) {
    if (s < 0 || V != m->g->V) { if (s < 0) return 0; gm_fail(m, "grammar: vocabulary size mismatch"); return -1; }
    const uint8_t *bits = state_mask(m, s);
    if (!bits) return -1;
    int allowed = 0;
    for (int t = 0; t < V; t++) {
        if (bits[t >> 3] & (1u << (t & 7))) allowed++;
        else logits[t] = -INFINITY;
    }
    return allowed;
}

int ds_gmatch_allowed(ds_gmatch *m, int s, int32_t t) {
    if (s < 0 || t < 0 || t >= m->g->V) return 0;
    if (m->g->kind[t] == 1) return ds_gmatch_can_end(m, s);
    return ds_gmatch_token(m, s, t) >= 0;
}

/* ========================================================================
 * The JSON grammar (response_format json_object)
 * ===================================================================== */

const char ds_grammar_json_object[] =
    "# JSON (RFC 8259) with an object at the top\n"
    "root    ::= object\n"
    "value   ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object  ::= \"{\" ws ( member ( \",\" ws member )* )? \"}\"\n"
    "member  ::= string ws \":\" ws value ws\n"
    "array   ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string  ::= \"\\\"\" char* \"\\\"\"\n"
    "char    ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "number  ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,4} )?\n"
    "# whitespace between tokens: none, a space, or a newline and an indent\n"
    "ws      ::= ( \" \" | \"\\n\" [ \\t]{0,20} )?\n";
