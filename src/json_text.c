/* json_text.c — strict JSON text (json_text.h). */
#include "json_text.h"
#include "common.h"

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int ds_json_text_check(const char *buf, size_t n, char *why, size_t whylen) {
    size_t a = 0, b = n;
    while (a < n && is_ws((unsigned char)buf[a])) a++;
    while (b > a && is_ws((unsigned char)buf[b - 1])) b--;
    if (a == b) { ds_errf(why, whylen, "no JSON value (only whitespace)"); return -1; }
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)buf[i];
        if (!in_str) {
            if (c == '"') in_str = 1;
            else if (c < 0x20 && !is_ws(c)) {
                ds_errf(why, whylen, "a control byte 0x%02X at byte %zu (JSON allows only whitespace outside strings)", c, i);
                return -1;
            }
            continue;
        }
        if (c == '"') in_str = 0;
        else if (c < 0x20) {
            ds_errf(why, whylen, "a raw control byte 0x%02X inside a string at byte %zu (it must be escaped)", c, i);
            return -1;
        } else if (c == '\\' && i + 1 < n) {
            if (buf[i + 1] == 'u' && i + 5 < n && buf[i + 2] == '0' && buf[i + 3] == '0' && buf[i + 4] == '0' && buf[i + 5] == '0') {
                ds_errf(why, whylen, "a string holds U+0000 (\\u0000) at byte %zu, which text cannot carry", i);
                return -1;
            }
            i++;                                       /* the escaped character */
        }
    }
    return 0;
}

cJSON *ds_json_text_parse(const char *buf, size_t n, char *why, size_t whylen) {
    if (ds_json_text_check(buf, n, why, whylen)) return NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    if (!j) {
        const size_t pos = end && end >= buf && (size_t)(end - buf) <= n ? (size_t)(end - buf) : 0;
        int line = 1, col = 1;
        for (size_t i = 0; i < pos; i++) { if (buf[i] == '\n') { line++; col = 1; } else col++; }
        ds_errf(why, whylen, "invalid JSON at byte %zu (line %d, column %d)", pos, line, col);
        return NULL;
    }
    size_t k = end ? (size_t)(end - buf) : n;
    while (k < n && is_ws((unsigned char)buf[k])) k++;
    if (k != n) {
        ds_errf(why, whylen, "bytes after the JSON value at byte %zu", k);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}
