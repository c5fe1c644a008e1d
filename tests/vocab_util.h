/* vocab_util.h — file and hex helpers shared by test_vocab.c and
 * test_tok_oracle.c (header-only, static functions). */
#ifndef DSPARK_TESTS_VOCAB_UTIL_H
#define DSPARK_TESTS_VOCAB_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole file, NUL-terminated (*n without the NUL); NULL if unreadable. */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0, r;
    char *buf = malloc(cap);
    while (buf && (r = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += r;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[len] = 0;
    *n = len;
    return buf;
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Decode lower-case hex in place (NUL-terminated after the bytes); returns
 * the length, or -1 if not hex. */
static long unhex(char *h) {
    size_t n = strlen(h);
    if (n % 2) return -1;
    for (size_t i = 0; i < n; i += 2) {
        int a = hexval(h[i]), b = hexval(h[i + 1]);
        if (a < 0 || b < 0) return -1;
        h[i / 2] = (char)(a * 16 + b);
    }
    h[n / 2] = 0;
    return (long)(n / 2);
}

#endif
