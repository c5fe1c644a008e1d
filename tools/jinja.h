/* jinja.h — a small, bounded interpreter for the Jinja subset that chat
 * templates (tokenizer.chat_template) are written in.
 *
 * What it takes: text, {{ expr }}, {% if/elif/else %}, {% for a[, b] in x
 * [if c] %} (loop.index0/index/first/last/length/revindex/previtem/
 * nextitem) with its {% else %}, {% set x = .. %}, {% set ns.attr = .. %}
 * with namespace(), {% break %} / {% continue %}, {% macro %} (called as a
 * function; recursion bounded), {% generation %} (a no-op), comments,
 * {%- -%} whitespace control, and the environment HF renders with:
 * trim_blocks and lstrip_blocks. Expressions: literals (strings, numbers,
 * true/false/none in both spellings, lists, dicts), variables, .attr /
 * [index] / [a:b:c], + - * / // % ** ~, comparisons, and/or/not, in / not
 * in, a if c else b; tests: defined, undefined, none, string, number,
 * integer, boolean, true, false, mapping, sequence, iterable, odd, even,
 * divisibleby, equalto/eq, ne, in; filters: trim, length, count, tojson,
 * join, upper, lower, title, capitalize, first, last, default, list,
 * string, int, abs, items, keys, values, replace, select, reject,
 * selectattr, rejectattr, map(attribute=), safe; the string methods
 * templates call (strip, lstrip, rstrip, split, startswith, endswith,
 * upper, lower, title, capitalize, replace, find), dict items / keys /
 * values / get, and the globals range, namespace, raise_exception,
 * strftime_now.
 *
 * Anything else is a parse error naming it: a template this cannot
 * interpret is refused whole, never rendered partly. A hostile template
 * cannot crash or hang it: nesting, loop iterations, evaluation steps,
 * string sizes and the output are all bounded, and every value it makes is
 * owned by the render's arena. tojson prints as transformers' does
 * (json.dumps: ", " and ": " separators, non-ASCII kept, optional indent). */
#ifndef DSPARK_JINJA_H
#define DSPARK_JINJA_H

#include <stddef.h>

struct cJSON;
typedef struct jinja_tmpl jinja_tmpl;

/* NULL with err ("line N: why") when the text is not in the subset. */
jinja_tmpl *jinja_parse(const char *src, char *err, size_t errlen);
void        jinja_free(jinja_tmpl *t);
/* Render with the variables of ctx (a cJSON object). The output (malloc'd,
 * NUL-terminated, *len bytes) or NULL with err (a raise_exception's message,
 * a type error, a limit). max_out bounds the output and every string made. */
char *jinja_render(const jinja_tmpl *t, const struct cJSON *ctx, size_t max_out, size_t *len, char *err, size_t errlen);

#endif
