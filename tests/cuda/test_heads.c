/* test_heads.c — the drafter's head ops and device selection (backend.h:
 * add, fill, gate, sample, plus argmax through ds_backend_select) on a
 * device backend against the CPU backend, bit for bit.
 *
 *   build/tests/cuda/test_heads [device]     (default "cuda")
 *
 * Without that device (no CUDA build, no GPU) it says so and passes. Checks:
 *   - add and fill: every output bit equal (one IEEE addition; a store);
 *   - gate, each kind, on 2^20 inputs swept over the range that matters
 *     (|t| <= 40, plus zeros, subnormals, infinities, NaN): every output
 *     and state bit equal (both sides run ds_sigmoidf / ds_tanhf of
 *     kernels/dsmath.h; NaN payloads aside), the mismatch count printed;
 *   - sample: Gumbel-max ids for V = 300 and 151936, several temperatures,
 *     seeds and positions (also beyond 2^32), rows with NaN, -inf, the MASK
 *     logit and all-NaN rows: every id equal;
 *   - greedy selection (temp 0) equals the CPU's argmax, and a top-k /
 *     top-p / min-p sampler is either run or declined (-1) with the host
 *     fallback (ds_backend_select) giving the CPU's ids. */
#include "testutil.h"
#include "backend.h"
#include "sampler.h"

#include <math.h>

typedef struct {
    ds_backend *be;
    ds_exec *ex;
} dev;

static void *to_dev(dev *d, const void *h, size_t bytes) {
    void *p = d->be->i->alloc(d->be, bytes ? bytes : 1);
    if (!p) { printf("FAIL out of %s memory (%zu bytes)\n", d->be->i->name, bytes); exit(1); }
    if (bytes) d->be->i->upload(d->ex, p, h, bytes);
    return p;
}
static void from_dev(dev *d, void *h, const void *p, size_t bytes) { d->be->i->download(d->ex, h, p, bytes); }
static void drop(dev *d, void *p) { d->be->i->release(d->be, p); }

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next32(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float unif(float lo, float hi) { return lo + (hi - lo) * (float)(next32() >> 8) / 16777216.0f; }
static float bits2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* distance in units in the last place (sign-magnitude folded onto a line) */
static int64_t ulp_dist(float a, float b) {
    int32_t x, y;
    memcpy(&x, &a, 4); memcpy(&y, &b, 4);
    if (x < 0) x = INT32_MIN - x;
    if (y < 0) y = INT32_MIN - y;
    int64_t d = (int64_t)x - y;
    return d < 0 ? -d : d;
}
/* max ulp distance over n floats; NaN must meet NaN (INT64_MAX otherwise) */
static int64_t max_ulp(const float *a, const float *b, size_t n) {
    int64_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] != a[i] || b[i] != b[i]) { if (!(a[i] != a[i] && b[i] != b[i])) return INT64_MAX; continue; }
        int64_t d = ulp_dist(a[i], b[i]);
        if (d > m) m = d;
    }
    return m;
}

/* count of differing 32-bit words */
static long diff_words(const void *a, const void *b, size_t n) {
    const uint32_t *x = a, *y = b;
    long c = 0;
    for (size_t i = 0; i < n; i++) c += x[i] != y[i];
    return c;
}

int main(int argc, char **argv) {
    char err[DS_ERRLEN];
    const char *name = argc > 1 ? argv[1] : "cuda";
    dev c = {0}, g = {0};
    c.be = ds_backend_new("cpu", err, sizeof err);
    g.be = ds_backend_new(name, err, sizeof err);
    if (!g.be) {
        printf("SKIP test_heads: %s\n", err);
        ds_backend_free(c.be);
        return tu_finish("test_heads");
    }
    if (!ds_backend_has_heads(g.be)) {
        printf("FAIL device '%s' has no head ops in its table (add/fill/gate/sample)\n", name);
        return 1;
    }
    c.ex = c.be->i->exec_new(c.be, 1, err, sizeof err);
    g.ex = g.be->i->exec_new(g.be, 1, err, sizeof err);
    if (!c.ex || !g.ex) { printf("FAIL exec: %s\n", err); return 1; }

    /* ---- add, fill ---- */
    {
        const size_t n = 100003;
        float *a = malloc(n * 4), *b = malloc(n * 4), *yc = malloc(n * 4), *yg = malloc(n * 4);
        for (size_t i = 0; i < n; i++) { a[i] = bits2f(next32()); b[i] = unif(-1e3f, 1e3f); }
        a[0] = NAN; a[1] = INFINITY; b[1] = -INFINITY; a[2] = bits2f(1); b[2] = bits2f(0x80000001u);
        c.be->i->add(c.ex, (int64_t)n, a, b, yc);
        float *da = to_dev(&g, a, n * 4), *db = to_dev(&g, b, n * 4);
        g.be->i->add(g.ex, (int64_t)n, da, db, da);                /* in place, as the drafter uses it */
        from_dev(&g, yg, da, n * 4);
        /* IEEE 754 leaves NaN payloads to the implementation (x86 keeps the
         * first operand's, the GPU returns the canonical NaN): equal when
         * both are NaN, bit for bit otherwise */
        long add_diff = 0;
        for (size_t i = 0; i < n; i++) add_diff += !(yc[i] != yc[i] && yg[i] != yg[i]) && diff_words(&yc[i], &yg[i], 1);
        CHECK(add_diff == 0, "add: %ld of %zu outputs differ", add_diff, n);
        g.be->i->fill(g.ex, 7, da + 5, -1e6f);
        from_dev(&g, yg, da, n * 4);
        int ok = 1;
        for (size_t i = 0; i < 20; i++)
            ok &= (i >= 5 && i < 12) ? yg[i] == -1e6f : ((yg[i] != yg[i] && yc[i] != yc[i]) || !diff_words(&yg[i], &yc[i], 1));
        CHECK(ok, "fill: wrong range written");
        drop(&g, da); drop(&g, db);
        free(a); free(b); free(yc); free(yg);
        printf("PASS add_fill n=%zu\n", n);
    }

    /* ---- gate: each kind, the CPU's against the device's, bit for bit
     * (both run kernels/dsmath.h; max_ulp is printed for a failure) ---- */
    {
        const int n = 1 << 20;
        float *a = malloc(3 * (size_t)n * 4), *b = malloc(3 * (size_t)n * 4), *e = malloc((size_t)n * 4);
        float *s0 = malloc((size_t)n * 4), *sc = malloc((size_t)n * 4), *sg = malloc((size_t)n * 4);
        float *yc = malloc((size_t)n * 4), *yg = malloc((size_t)n * 4);
        for (int i = 0; i < 3 * n; i++) { a[i] = unif(-40.0f, 40.0f); b[i] = unif(-2.0f, 2.0f); }
        for (int i = 0; i < n; i++) { e[i] = unif(-3.0f, 3.0f); s0[i] = unif(-1.0f, 1.0f); }
        const float special[] = { 0.0f, -0.0f, bits2f(1), bits2f(0x80000001u), INFINITY, -INFINITY, NAN,
                                  88.7f, -88.7f, 104.0f, -104.0f, 9.0f, -9.0f };
        for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
            a[i] = special[i]; b[i] = 0.0f;
            a[n + i] = special[i]; b[n + i] = 0.0f;
            a[2 * n + i] = special[i]; b[2 * n + i] = 0.0f;
        }
        float *da = to_dev(&g, a, 3 * (size_t)n * 4), *db = to_dev(&g, b, 3 * (size_t)n * 4);
        float *de = to_dev(&g, e, (size_t)n * 4), *ds = to_dev(&g, s0, (size_t)n * 4);
        float *dy = g.be->i->alloc(g.be, (size_t)n * 4);
        static const char *const kn[] = { "sigmoid", "sigmoid_mul", "rnn" };
        for (int k = 0; k < 3; k++) {
            memcpy(sc, s0, (size_t)n * 4);
            g.be->i->upload(g.ex, ds, s0, (size_t)n * 4);
            c.be->i->gate(c.ex, (ds_gate_kind)k, n, a, b, e, sc, yc);
            g.be->i->gate(g.ex, (ds_gate_kind)k, n, da, db, de, ds, dy);
            from_dev(&g, yg, dy, (size_t)n * 4);
            from_dev(&g, sg, ds, (size_t)n * 4);
            long dy_ = diff_words(yc, yg, (size_t)n), ds_ = k == 2 ? diff_words(sc, sg, (size_t)n) : 0;
            /* NaN payloads may differ; count them as equal when both are NaN */
            for (int i = 0; i < n; i++) if (yc[i] != yc[i] && yg[i] != yg[i] && memcmp(&yc[i], &yg[i], 4)) dy_--;
            /* the same project-owned functions on both sides (issue 22 item 6):
             * bit for bit, the rnn state too */
            for (int i = 0; k == 2 && i < n; i++) if (sc[i] != sc[i] && sg[i] != sg[i] && memcmp(&sc[i], &sg[i], 4)) ds_--;
            const int64_t mu = max_ulp(yc, yg, (size_t)n);
            const int ok = dy_ == 0 && ds_ == 0;
            printf("%s gate_%s n=%d y_mismatch=%ld s_mismatch=%ld max_ulp=%lld\n", ok ? "PASS" : "FAIL", kn[k], n,
                   dy_, ds_, (long long)mu);
            CHECK(ok, "gate %s: %ld + %ld mismatches in %d (max %lld ulp)", kn[k], dy_, ds_, n, (long long)mu);
        }
        drop(&g, da); drop(&g, db); drop(&g, de); drop(&g, ds); drop(&g, dy);
        free(a); free(b); free(e); free(s0); free(sc); free(sg); free(yc); free(yg);
    }

    /* ---- sample and greedy selection ---- */
    {
        static const int Vs[] = { 300, 151936 };
        static const float temps[] = { 0.0f, 0.3f, 0.8f, 1.5f };
        static const uint64_t seeds[] = { 0, 7, 12345, 0xFFFFFFFF00000001ull };
        static const int64_t poss[] = { 0, 1, 517, (int64_t)1 << 33 };
        const int rows = 8;
        long runs = 0, bad = 0, declined = 0;
        for (int vi = 0; vi < 2; vi++) {
            const int V = Vs[vi];
            float *x = malloc((size_t)rows * V * 4);
            float *scratch = malloc(2 * (size_t)V * 4);
            for (int r = 0; r < rows; r++)
                for (int i = 0; i < V; i++) {
                    float v = 3.0f * (unif(-1, 1) + unif(-1, 1) + unif(-1, 1));
                    if (r == 1 && i % 97 == 0) v = NAN;
                    if (r == 2 && i % 5 == 0) v = -INFINITY;
                    if (r == 3) v = (float)(i % 4);                 /* ties everywhere */
                    if (r == 4) v = NAN;                            /* all NaN: argmax fallback */
                    if (r == 5 && i == V - 1) v = -1e6f;            /* MASK suppression */
                    if (r == 6 && i == 3) v = 80.0f;                /* one dominant logit */
                    x[(size_t)r * V + i] = v;
                }
            float *dx = to_dev(&g, x, (size_t)rows * V * 4), *dsc = g.be->i->alloc(g.be, 2 * (size_t)V * 4);
            int32_t *dout = g.be->i->alloc(g.be, rows * sizeof(int32_t));
            int32_t idc[8], idg[8];
            for (int ti = 0; ti < 4; ti++)
                for (int si = 0; si < 4; si++)
                    for (int pi = 0; pi < 4; pi++) {
                        ds_sampler s = { temps[ti], 0, 1.0f, seeds[si], 0.0f };
                        for (int r = 0; r < rows; r++) idc[r] = ds_sample(&s, x + (size_t)r * V, V, poss[pi] + r, scratch);
                        if (ds_backend_select(g.ex, &s, rows, V, dx, poss[pi], dsc, dout, err, sizeof err)) {
                            printf("FAIL select: %s\n", err); return 1;
                        }
                        from_dev(&g, idg, dout, sizeof idg);
                        runs++;
                        if (memcmp(idc, idg, sizeof idc)) {
                            if (++bad <= 3)
                                printf("INFO   sample differs: V=%d temp=%g seed=%llu pos=%lld\n", V, temps[ti],
                                       (unsigned long long)seeds[si], (long long)poss[pi]);
                        }
                    }
            /* top-k / top-p / min-p: run or declined; through ds_backend_select always the CPU's ids */
            const ds_sampler filt[3] = { { 0.8f, 40, 0.9f, 99, 0.0f }, { 0.8f, 0, 0.7f, 98, 0.0f }, { 0.8f, 0, 1.0f, 97, 0.05f } };
            for (int fi = 0; fi < 3; fi++) {
                declined += g.be->i->sample(g.ex, &filt[fi], rows, V, dx, 11, dsc, dout) != 0;
                for (int r = 0; r < rows; r++) idc[r] = ds_sample(&filt[fi], x + (size_t)r * V, V, 11 + r, scratch);
                if (ds_backend_select(g.ex, &filt[fi], rows, V, dx, 11, dsc, dout, err, sizeof err)) { printf("FAIL select: %s\n", err); return 1; }
                from_dev(&g, idg, dout, sizeof idg);
                runs++;
                bad += memcmp(idc, idg, sizeof idc) != 0;
            }
            drop(&g, dx); drop(&g, dsc); drop(&g, dout);
            free(x); free(scratch);
        }
        CHECK(bad == 0, "sample: %ld of %ld selections differ from the CPU", bad, runs);
        printf("%s sample runs=%ld differ=%ld topk_declined=%ld\n", bad ? "FAIL" : "PASS", runs, bad, declined);
    }
    if (g.be->i->sync(g.ex, err, sizeof err)) CHECK(0, "device error: %s", err);
    g.be->i->exec_free(g.ex);
    c.be->i->exec_free(c.ex);
    ds_backend_free(g.be);
    ds_backend_free(c.be);
    return tu_finish("test_heads");
}
