/* libm_shim.c — an LD_PRELOAD library that moves the C library's
 * transcendental functions by one ulp (towards +inf; NaN and inf results
 * stay), standing in for "another C library" (musl, macOS, another glibc):
 * tests/cli_libm.sh runs the golden outputs under it and they must not
 * change, because no function in the arithmetic is libm's (kernels/dsmath.h).
 *
 * Moved: the functions issue 24 names (sinf cosf powf expf tanhf exp log)
 * plus the ones a compiler may turn them into or a kernel could reach for
 * (sincosf, sin, cos, sincos, pow, tanh, logf, exp2f, exp2, log2f, expm1f,
 * log1pf). Not moved: fma, fmaf, sqrt, sqrtf — IEEE-754 defines them as
 * correctly rounded, so every conforming library returns the same bits, and
 * the engine uses them as basic operations. The real function is looked up
 * per call with dlsym(RTLD_NEXT) (no state in the library). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>

static float movef(float r) { return isfinite(r) ? nextafterf(r, INFINITY) : r; }
static double moved(double r) { return isfinite(r) ? nextafter(r, INFINITY) : r; }

#define SHIM_F1(name)                                   \
    float name(float x) {                               \
        float (*real)(float);                           \
        *(void **)&real = dlsym(RTLD_NEXT, #name);      \
        return movef(real(x));                          \
    }
#define SHIM_D1(name)                                   \
    double name(double x) {                             \
        double (*real)(double);                         \
        *(void **)&real = dlsym(RTLD_NEXT, #name);      \
        return moved(real(x));                          \
    }

SHIM_F1(sinf)
SHIM_F1(cosf)
SHIM_F1(expf)
SHIM_F1(tanhf)
SHIM_F1(logf)
SHIM_F1(exp2f)
SHIM_F1(log2f)
SHIM_F1(expm1f)
SHIM_F1(log1pf)
SHIM_D1(sin)
SHIM_D1(cos)
SHIM_D1(exp)
SHIM_D1(log)
SHIM_D1(tanh)
SHIM_D1(exp2)

float powf(float x, float y) {
    float (*real)(float, float);
    *(void **)&real = dlsym(RTLD_NEXT, "powf");
    return movef(real(x, y));
}
double pow(double x, double y) {
    double (*real)(double, double);
    *(void **)&real = dlsym(RTLD_NEXT, "pow");
    return moved(real(x, y));
}
void sincosf(float x, float *s, float *c) {
    void (*real)(float, float *, float *);
    *(void **)&real = dlsym(RTLD_NEXT, "sincosf");
    real(x, s, c);
    *s = movef(*s);
    *c = movef(*c);
}
void sincos(double x, double *s, double *c) {
    void (*real)(double, double *, double *);
    *(void **)&real = dlsym(RTLD_NEXT, "sincos");
    real(x, s, c);
    *s = moved(*s);
    *c = moved(*c);
}
