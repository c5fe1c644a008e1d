/* libm_probe.c — prints the bits of the C library's functions on fixed
 * arguments, one line each. tests/cli_libm.sh runs it with and without
 * libm_shim.so: every line must differ, which proves the shim is in effect
 * (so an unchanged golden hash under it means something). The arguments are
 * volatile so that the compiler cannot fold the calls. */
#define _GNU_SOURCE   /* sincosf */
#include <math.h>
#include <stdio.h>
#include <string.h>

static unsigned fb(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static unsigned long long db(double d) { unsigned long long u; memcpy(&u, &d, 8); return u; }

int main(void) {
    volatile float xf = 0.7f, yf = -0.3125f;
    volatile double xd = 0.7;
    float s, c;
    sincosf(xf, &s, &c);
    printf("sinf %08x\ncosf %08x\nsincosf %08x %08x\n", fb(sinf(xf)), fb(cosf(xf)), fb(s), fb(c));
    printf("powf %08x\nexpf %08x\ntanhf %08x\n", fb(powf(10000.0f, yf)), fb(expf(xf)), fb(tanhf(xf)));
    printf("exp %016llx\nlog %016llx\n", db(exp(xd)), db(log(xd)));
    return 0;
}
