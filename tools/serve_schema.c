/* serve_schema.c — JSON Schema (response_format json_schema, llama-server's
 * json_schema) to a GBNF grammar for dspark_grammar_new (serve.h has the
 * subset). Every schema node becomes one rule; $ref targets become rules
 * named once, so recursive schemas are recursive rules. The JSON building
 * blocks (value, string, number, whitespace) are the json_object grammar's
 * own rules, so both modes accept the same JSON spelling.
 *
 * Objects. Properties come in schema order; required ones always, optional
 * ones may be left out. For properties p_1..p_n the rule S_i (first / not
 * first) is "p_i and then S_{i+1}" or, when p_i is optional, also "S_{i+1}":
 * 2n small rules instead of 2^n alternatives, and the comma goes exactly
 * between two present members. oneOf is matched as anyOf (a grammar cannot
 * exclude the other branches); everything else is enforced or refused. */
#include "serve.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    sbuf        out;
    int         n_rules;
    const cJSON *root;
    /* $ref targets: the pointer text and the rule made for it */
    char       *ref_name[256];
    int         ref_rule[256];
    const cJSON *ref_node[256];
    int         n_ref, ref_done;
    char       *err;
    size_t      errlen;
    int         failed;
} sctx;

static void fail(sctx *c, const char *path, const char *msg, const char *what) {
    if (c->failed) return;
    c->failed = 1;
    snprintf(c->err, c->errlen, "json_schema at %s: %s%s%.60s%s", path[0] ? path : "/", msg, what ? " '" : "", what ? what : "",
             what ? "'" : "");
}

/* a GBNF literal for bytes s */
static void literal(sbuf *o, const char *s) {
    sbuf_adds(o, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') { sbuf_addf(o, "\\%c", *p); }
        else if (*p < 0x20) sbuf_addf(o, "\\x%02X", *p);
        else sbuf_add(o, (const char *)p, 1);
    }
    sbuf_adds(o, "\"");
}

/* a JSON value as a GBNF literal (its compact spelling) */
static void json_literal(sctx *c, sbuf *o, const cJSON *v) {
    char *s = v ? cJSON_PrintUnformatted(v) : NULL;
    if (!s) { c->failed = 1; snprintf(c->err, c->errlen, "out of memory"); return; }
    literal(o, s);
    free(s);
}

static int new_rule(sctx *c) { return ++c->n_rules; }

static int gen(sctx *c, const cJSON *s, const char *path);

static int ref_rule(sctx *c, const char *ref, const char *path) {
    for (int i = 0; i < c->n_ref; i++)
        if (!strcmp(c->ref_name[i], ref)) return c->ref_rule[i];
    const cJSON *node = NULL;
    if (!strcmp(ref, "#")) node = c->root;
    else if (!strncmp(ref, "#/$defs/", 8)) node = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, "$defs"), ref + 8);
    else if (!strncmp(ref, "#/definitions/", 14))
        node = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, "definitions"), ref + 14);
    if (!node) { fail(c, path, "$ref must point into #/$defs or #/definitions of this schema, not", ref); return -1; }
    if (c->n_ref == 256) { fail(c, path, "too many $ref targets", NULL); return -1; }
    c->ref_name[c->n_ref] = strdup(ref);
    c->ref_node[c->n_ref] = node;
    c->ref_rule[c->n_ref] = new_rule(c);
    if (!c->ref_name[c->n_ref]) { fail(c, path, "out of memory", NULL); return -1; }
    return c->ref_rule[c->n_ref++];
}

static int uint_kw(sctx *c, const cJSON *s, const char *k, long *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 10000 || v->valuedouble != floor(v->valuedouble)) {
        fail(c, path, "must be an integer in [0, 10000]:", k);
        return -1;
    }
    *out = (long)v->valuedouble;
    return 0;
}

/* X{min,max} in GBNF (max < 0: unbounded) */
static void repeat(sbuf *o, const char *x, long min, long max) {
    if (max < 0) sbuf_addf(o, "%s{%ld,}", x, min);
    else sbuf_addf(o, "%s{%ld,%ld}", x, min, max);
}

static int gen_object(sctx *c, const cJSON *s, int r, const char *path) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties"), *req = cJSON_GetObjectItemCaseSensitive(s, "required"),
                *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) { fail(c, path, "'properties' must be an object", NULL); return -1; }
    if (req && !cJSON_IsArray(req)) { fail(c, path, "'required' must be an array", NULL); return -1; }
    const int n = props ? cJSON_GetArraySize(props) : 0;
    for (const cJSON *q = req ? req->child : NULL; q; q = q->next) {
        if (!cJSON_IsString(q) || !cJSON_GetObjectItemCaseSensitive(props, q->valuestring)) {
            fail(c, path, "'required' names a property 'properties' does not define:", cJSON_IsString(q) ? q->valuestring : "?");
            return -1;
        }
    }
    /* extra members: absent means none when properties are given */
    int extra = -1;                                   /* the rule of an extra member's value; -1 none */
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl)) { fail(c, path, "'additionalProperties' must be a boolean or a schema", NULL); return -1; }
    if (!addl ? n == 0 : cJSON_IsTrue(addl)) extra = 0;           /* 0: any value */
    else if (cJSON_IsObject(addl)) {
        char sub[600];
        snprintf(sub, sizeof sub, "%.500s/additionalProperties", path);
        if ((extra = gen(c, addl, sub)) < 0) return -1;
    }
    char xv[32];
    snprintf(xv, sizeof xv, extra > 0 ? "r%d" : "value", extra);
    int *val = calloc((size_t)(n ? n : 1), sizeof *val);
    if (!val) { fail(c, path, "out of memory", NULL); return -1; }
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
        char sub[600];
        snprintf(sub, sizeof sub, "%.400s/properties/%.100s", path, p->string);
        if ((val[i] = gen(c, p, sub)) < 0) { free(val); return -1; }
    }
    /* S_i first / not first: rules base+2i, base+2i+1; i = n ends */
    const int base = c->n_rules + 1;
    c->n_rules += 2 * (n + 1);
    sbuf *o = &c->out;
    i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
        int required = 0;
        for (const cJSON *q = req ? req->child : NULL; q && !required; q = q->next) required = !strcmp(q->valuestring, p->string);
        for (int f = 0; f < 2; f++) {
            sbuf_addf(o, "r%d ::= %s", base + 2 * i + f, f ? "\",\" ws " : "");
            cJSON *ks = cJSON_CreateString(p->string);      /* the name's JSON spelling */
            json_literal(c, o, ks);
            cJSON_Delete(ks);
            sbuf_addf(o, " ws \":\" ws r%d ws r%d", val[i], base + 2 * (i + 1) + 1);
            if (!required) sbuf_addf(o, " | r%d", base + 2 * (i + 1) + f);
            sbuf_adds(o, "\n");
        }
    }
    free(val);
    if (extra >= 0) {
        sbuf_addf(o, "r%d ::= ( string ws \":\" ws %s ws ( \",\" ws string ws \":\" ws %s ws )* )?\n", base + 2 * n, xv, xv);
        sbuf_addf(o, "r%d ::= ( \",\" ws string ws \":\" ws %s ws )*\n", base + 2 * n + 1, xv);
    } else {
        sbuf_addf(o, "r%d ::= \"\"\nr%d ::= \"\"\n", base + 2 * n, base + 2 * n + 1);
    }
    sbuf_addf(o, "r%d ::= \"{\" ws r%d \"}\"\n", r, base);
    return 0;
}

static int gen_array(sctx *c, const cJSON *s, int r, const char *path) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items"), *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    long min = 0, max = -1;
    if (uint_kw(c, s, "minItems", &min, path) || uint_kw(c, s, "maxItems", &max, path)) return -1;
    if (max >= 0 && max < min) { fail(c, path, "maxItems is below minItems", NULL); return -1; }
    char sub[600];
    if (prefix) {
        if (!cJSON_IsArray(prefix) || (items && !cJSON_IsFalse(items)) || cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
            cJSON_GetObjectItemCaseSensitive(s, "maxItems")) {
            fail(c, path, "prefixItems is supported as a fixed tuple only (no items, minItems, maxItems)", NULL);
            return -1;
        }
        const int n = cJSON_GetArraySize(prefix);
        int *ids = calloc((size_t)(n ? n : 1), sizeof *ids), i = 0;
        if (!ids) { fail(c, path, "out of memory", NULL); return -1; }
        for (const cJSON *p = prefix->child; p; p = p->next, i++) {
            snprintf(sub, sizeof sub, "%.500s/prefixItems/%d", path, i);
            if ((ids[i] = gen(c, p, sub)) < 0) { free(ids); return -1; }
        }
        sbuf_addf(&c->out, "r%d ::= \"[\" ws", r);
        for (i = 0; i < n; i++) sbuf_addf(&c->out, "%s r%d ws", i ? " \",\" ws" : "", ids[i]);
        sbuf_adds(&c->out, " \"]\"\n");
        free(ids);
        return 0;
    }
    char it[32] = "value";
    if (items) {
        if (cJSON_IsFalse(items)) { max = 0; }
        else {
            snprintf(sub, sizeof sub, "%.500s/items", path);
            int id = gen(c, items, sub);
            if (id < 0) return -1;
            snprintf(it, sizeof it, "r%d", id);
        }
    }
    sbuf *o = &c->out;
    char more[64];
    snprintf(more, sizeof more, "( \",\" ws %s ws )", it);
    sbuf_addf(o, "r%d ::= \"[\" ws ", r);
    if (max == 0) sbuf_adds(o, "\"]\"\n");
    else {
        if (min == 0) sbuf_adds(o, "( ");
        sbuf_addf(o, "%s ws ", it);
        repeat(o, more, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1);
        sbuf_adds(o, min == 0 ? " )? \"]\"\n" : " \"]\"\n");
    }
    return 0;
}

static int gen_string(sctx *c, const cJSON *s, int r, const char *path) {
    long min = 0, max = -1;
    if (uint_kw(c, s, "minLength", &min, path) || uint_kw(c, s, "maxLength", &max, path)) return -1;
    if (max >= 0 && max < min) { fail(c, path, "maxLength is below minLength", NULL); return -1; }
    sbuf_addf(&c->out, "r%d ::= \"\\\"\" ", r);
    repeat(&c->out, "char", min, max);
    sbuf_adds(&c->out, " \"\\\"\"\n");
    return 0;
}

static const char *const kw_ok[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems", "enum", "const",
    "anyOf", "oneOf", "$ref", "$defs", "definitions", "minLength", "maxLength",
    /* annotations: they describe, never constrain */
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly", NULL,
};

/* the rule for one type name */
static int gen_type(sctx *c, const cJSON *s, const char *type, int r, const char *path) {
    static const char *const simple[][2] = { { "number", "number" }, { "integer", "integer" }, { "boolean", "boolean" }, { "null", "null" } };
    for (size_t k = 0; k < sizeof simple / sizeof simple[0]; k++)
        if (!strcmp(type, simple[k][0])) { sbuf_addf(&c->out, "r%d ::= %s\n", r, simple[k][1]); return 0; }
    if (!strcmp(type, "string")) return gen_string(c, s, r, path);
    if (!strcmp(type, "object")) return gen_object(c, s, r, path);
    if (!strcmp(type, "array")) return gen_array(c, s, r, path);
    fail(c, path, "unknown type", type);
    return -1;
}

/* The rule number for schema s (made now). */
static int gen(sctx *c, const cJSON *s, const char *path) {
    if (c->failed) return -1;
    if (c->n_rules > 20000) { fail(c, path, "the schema is too large", NULL); return -1; }
    const int r = new_rule(c);
    if (cJSON_IsTrue(s)) { sbuf_addf(&c->out, "r%d ::= value\n", r); return r; }
    if (!cJSON_IsObject(s)) { fail(c, path, "a schema must be an object or a boolean", NULL); return -1; }
    if (cJSON_IsFalse(s)) { fail(c, path, "the schema 'false' matches nothing", NULL); return -1; }
    for (const cJSON *k = s->child; k; k = k->next) {
        int ok = 0;
        for (int i = 0; kw_ok[i] && !ok; i++) ok = !strcmp(k->string, kw_ok[i]);
        if (!ok) { fail(c, path, "unsupported keyword (it would not be enforced):", k->string); return -1; }
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref"), *en = cJSON_GetObjectItemCaseSensitive(s, "enum"),
                *cst = cJSON_GetObjectItemCaseSensitive(s, "const"), *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf"),
                *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf"), *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    sbuf *o = &c->out;
    if (ref) {
        if (!cJSON_IsString(ref)) { fail(c, path, "$ref must be a string", NULL); return -1; }
        int t = ref_rule(c, ref->valuestring, path);
        if (t < 0) return -1;
        sbuf_addf(o, "r%d ::= r%d\n", r, t);
        return r;
    }
    if (cst) {
        sbuf_addf(o, "r%d ::= ", r);
        json_literal(c, o, cst);
        sbuf_adds(o, "\n");
        return c->failed ? -1 : r;
    }
    if (en) {
        if (!cJSON_IsArray(en) || !en->child) { fail(c, path, "'enum' must be a non-empty array", NULL); return -1; }
        sbuf_addf(o, "r%d ::= ", r);
        for (const cJSON *v = en->child; v; v = v->next) {
            if (v != en->child) sbuf_adds(o, " | ");
            json_literal(c, o, v);
        }
        sbuf_adds(o, "\n");
        return c->failed ? -1 : r;
    }
    if (any || one) {
        const cJSON *list = any ? any : one;
        if ((any && one) || !cJSON_IsArray(list) || !list->child) { fail(c, path, "anyOf / oneOf must be one non-empty array", NULL); return -1; }
        int ids[64], n = 0;
        for (const cJSON *v = list->child; v; v = v->next) {
            if (n == 64) { fail(c, path, "at most 64 alternatives", NULL); return -1; }
            char sub[600];
            snprintf(sub, sizeof sub, "%.500s/%s/%d", path, any ? "anyOf" : "oneOf", n);
            if ((ids[n++] = gen(c, v, sub)) < 0) return -1;
        }
        sbuf_addf(o, "r%d ::= ", r);
        for (int k = 0; k < n; k++) sbuf_addf(o, "%sr%d", k ? " | " : "", ids[k]);
        sbuf_adds(o, "\n");
        return r;
    }
    if (!ty) {
        /* the keywords say which type: an object, an array, a string, else anything */
        const char *t = cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "additionalProperties") ||
                                cJSON_GetObjectItemCaseSensitive(s, "required")
                            ? "object"
                        : cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "prefixItems") ? "array"
                        : cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength") ? "string"
                                                                                                                                  : NULL;
        if (!t) { sbuf_addf(o, "r%d ::= value\n", r); return r; }
        return gen_type(c, s, t, r, path) ? -1 : r;
    }
    if (cJSON_IsString(ty)) return gen_type(c, s, ty->valuestring, r, path) ? -1 : r;
    if (!cJSON_IsArray(ty) || !ty->child) { fail(c, path, "'type' must be a string or a non-empty array", NULL); return -1; }
    int ids[8], n = 0;
    for (const cJSON *v = ty->child; v; v = v->next) {
        if (!cJSON_IsString(v) || n == 8) { fail(c, path, "'type' lists at most 8 type names", NULL); return -1; }
        ids[n] = new_rule(c);
        if (gen_type(c, s, v->valuestring, ids[n++], path)) return -1;
    }
    sbuf_addf(o, "r%d ::= ", r);
    for (int k = 0; k < n; k++) sbuf_addf(o, "%sr%d", k ? " | " : "", ids[k]);
    sbuf_adds(o, "\n");
    return r;
}

char *schema_to_gbnf(const cJSON *schema, char *err, size_t errlen) {
    sctx c = { .root = schema, .err = err, .errlen = errlen };
    sbuf_adds(&c.out, "root ::= r1\n");
    int top = gen(&c, schema, "");
    /* $ref targets, in the order they were first met (new ones may appear) */
    while (!c.failed && c.ref_done < c.n_ref) {
        const int i = c.ref_done++;
        char path[300];
        snprintf(path, sizeof path, "%.280s", c.ref_name[i] + 1);
        int t = gen(&c, c.ref_node[i], path);
        if (t >= 0) sbuf_addf(&c.out, "r%d ::= r%d\n", c.ref_rule[i], t);
    }
    for (int i = 0; i < c.n_ref; i++) free(c.ref_name[i]);
    if (c.failed || top < 0 || c.out.oom) {
        if (!c.failed) snprintf(err, errlen, "out of memory");
        sbuf_free(&c.out);
        return NULL;
    }
    /* the JSON building blocks: the json_object grammar's rules (after its root) */
    const char *blocks = strstr(dspark_grammar_json_object(), "\nvalue");
    sbuf_adds(&c.out, blocks ? blocks + 1 : "");
    sbuf_adds(&c.out, "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\nboolean ::= \"true\" | \"false\"\nnull ::= \"null\"\n");
    if (c.out.oom) { snprintf(err, errlen, "out of memory"); sbuf_free(&c.out); return NULL; }
    return c.out.p;
}
