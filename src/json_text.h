/* json_text.h — JSON text from outside the program (an HTTP body, a
 * config.json) read strictly, one rule for all of them (RFC 8259): one
 * value with only JSON whitespace (space, tab, LF, CR) before and after it,
 * no raw control byte inside a string, and no U+0000 escape (cJSON keeps C
 * strings: the rest of such a string would be dropped silently). */
#ifndef DSPARK_JSON_TEXT_H
#define DSPARK_JSON_TEXT_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* 0 when buf[0..n) passes the byte-level rules above, else -1 with one line
 * in why (naming the byte offset). */
int ds_json_text_check(const char *buf, size_t n, char *why, size_t whylen);
/* The value of buf[0..n) (checked, parsed, nothing after it), or NULL with
 * one line. */
cJSON *ds_json_text_parse(const char *buf, size_t n, char *why, size_t whylen);

#endif
