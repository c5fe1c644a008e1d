/* testutil.h — tiny test harness shared by tests/test_*.c: PASS/FAIL lines,
 * a failure counter, temp directories. */
#ifndef DSPARK_TESTUTIL_H
#define DSPARK_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int tu_failures, tu_passes;

#define CHECK(cond, ...) do { \
    if (cond) { tu_passes++; } \
    else { tu_failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } \
} while (0)

#define PASS(name) printf("PASS %s\n", name)

static inline int tu_finish(const char *suite) {
    printf("%s: %d checks passed, %d failed\n", suite, tu_passes, tu_failures);
    return tu_failures ? 1 : 0;
}

/* The device the model-level suites run on: $DSPARK_DEVICE ("cpu" by
 * default); `make test-cuda` runs them with DSPARK_DEVICE=cuda. */
static inline const char *tu_device(void) {
    const char *d = getenv("DSPARK_DEVICE");
    return d && *d ? d : "cpu";
}

/* The shipped target: the Q8_0 one `make models` makes, else the committed F16. */
static inline const char *tu_shipped_target(void) {
    FILE *f = fopen("models/dspark-tiny-q8_0.gguf", "rb");
    if (f) { fclose(f); return "models/dspark-tiny-q8_0.gguf"; }
    return "models/dspark-tiny-f16.gguf";
}

/* mkdtemp under $TMPDIR or /tmp; caller removes with tu_rmdir */
static inline void tu_tmpdir(char *buf, size_t n) {
    const char *t = getenv("TMPDIR");
    snprintf(buf, n, "%s/dspark-test-XXXXXX", t ? t : "/tmp");
    if (!mkdtemp(buf)) { perror("mkdtemp"); exit(1); }
}
static inline void tu_rmdir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

#endif
