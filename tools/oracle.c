/* oracle.c — the oracle-acceptance benchmark's drafter override (oracle.h). */
#include "oracle.h"
#include "common.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ORACLE_MAX_COUNTS (1 << 20)

void ds_oracle_free(ds_oracle *o) {
    free(o->counts);
    o->counts = NULL;
    o->n_counts = 0;
}

/* One line of a pattern file: "round=... accepted=A ..." (--dump-block) or a
 * lone integer. 1 = a count, 0 = nothing on the line, -1 = malformed. */
static int oracle_line(const char *s, long *v) {
    while (*s == ' ' || *s == '\t') s++;
    if (*s == '#' || *s == '\n' || *s == '\r' || !*s) return 0;
    const char *a = strstr(s, "accepted=");
    const char *num = a ? a + 9 : s;
    if (!isdigit((unsigned char)*num)) return -1;
    char *end;
    errno = 0;
    *v = strtol(num, &end, 10);
    if (errno || *v < 0 || *v > 1000000) return -1;
    if (!a) {                                   /* a lone integer: nothing else */
        while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
        if (*end && *end != '#') return -1;
    }
    return 1;
}

int ds_oracle_parse(ds_oracle *o, const char *spec, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    if (!strncmp(spec, "rate:", 5)) {
        char *end;
        errno = 0;
        const double r = strtod(spec + 5, &end);
        if (errno || end == spec + 5 || *end || !(r >= 0.0 && r <= 1.0)) {
            ds_errf(err, errlen, "--oracle-accept %s: the rate must be a number in [0, 1]", spec);
            return -1;
        }
        o->rate = r;
        snprintf(o->label, sizeof o->label, "rate:%g", r);
        return 0;
    }
    FILE *f = fopen(spec, "r");
    if (!f) {
        ds_errf(err, errlen, "--oracle-accept %s: %s (give a recorded pattern file or rate:R)", spec, strerror(errno));
        return -1;
    }
    char line[4096];
    int cap = 0, lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        long v;
        const int k = oracle_line(line, &v);
        if (k < 0) {
            ds_errf(err, errlen, "--oracle-accept %s:%d: neither a --dump-block line with accepted=N nor a count", spec, lineno);
            rc = -1;
            break;
        }
        if (k == 0) continue;
        if (o->n_counts == ORACLE_MAX_COUNTS) {
            ds_errf(err, errlen, "--oracle-accept %s: more than %d rounds", spec, ORACLE_MAX_COUNTS);
            rc = -1;
            break;
        }
        if (o->n_counts == cap) {
            cap = cap ? 2 * cap : 256;
            int *nc = realloc(o->counts, (size_t)cap * sizeof *nc);
            if (!nc) { ds_errf(err, errlen, "out of memory"); rc = -1; break; }
            o->counts = nc;
        }
        o->counts[o->n_counts++] = (int)v;
    }
    if (rc == 0 && ferror(f)) { ds_errf(err, errlen, "--oracle-accept %s: read error", spec); rc = -1; }
    fclose(f);
    if (rc == 0 && o->n_counts == 0) {
        ds_errf(err, errlen, "--oracle-accept %s: no rounds in the file", spec);
        rc = -1;
    }
    if (rc) { ds_oracle_free(o); return -1; }
    const char *base = strrchr(spec, '/');
    snprintf(o->label, sizeof o->label, "replay:%.80s", base ? base + 1 : spec);
    return 0;
}

double ds_oracle_mean(const ds_oracle *o, int n_draft) {
    if (!o->counts) {                 /* E[prefix] = sum_{k=1..n} r^k */
        double s = 0, p = 1;
        for (int k = 1; k <= n_draft; k++) { p *= o->rate; s += p; }
        return s;
    }
    double s = 0;
    for (int i = 0; i < o->n_counts; i++) s += o->counts[i] < n_draft ? o->counts[i] : n_draft;
    return s / o->n_counts;
}

/* a deterministic uniform in [0, 1) of (position, slot) */
static double oracle_u(int p, int i) {
    uint64_t h = (uint64_t)(uint32_t)p * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)(i + 1) * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 31; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 29; h *= 0x94D049BB133111EBull; h ^= h >> 32;
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

void ds_oracle_draft(void *user, int p, int32_t anchor, int n, int32_t *ids, float *conf) {
    ds_oracle *o = user;
    (void)anchor;
    /* how many of this round's slots are right: the recorded count, or the
     * first slot the rate rejects */
    int right;
    if (o->counts) {
        right = o->counts[o->round % o->n_counts];
    } else {
        right = 0;
        while (right < n && oracle_u(p, right) < o->rate) right++;
    }
    if (right > n) right = n;
    o->round++;
    o->planned += right;
    for (int i = 0; i < n; i++) {
        const long k = (long)p + 1 + i - o->n_prompt;          /* the reference index of position p+1+i */
        const int32_t t = k >= 0 && k < o->n_ref ? o->ref[k] : o->after_end;
        /* a wrong slot proposes another token than the target's (the rest
         * of the block after it is never compared) */
        ids[i] = i < right ? t : (int32_t)(((int64_t)t + 1) % (o->n_vocab > 1 ? o->n_vocab : 1));
        if (conf) conf[i] = i < right ? 1.0f : 0.0f;
    }
}
