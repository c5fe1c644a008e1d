/* exp_many.h — ds_exp (kernels/dsmath.h) over an array, bit for bit the
 * scalar calls, vectorized where the CPU allows (exp_many.c says why the
 * bits are the same). x and y may be the same array. */
#ifndef DSPARK_EXP_MANY_H
#define DSPARK_EXP_MANY_H

#include <stdint.h>

void ds_exp_many(const double *x, double *y, int64_t n);
/* at a given SIMD level (simd.h; one the CPU lacks runs the portable loop):
 * the test compares every level's bits */
void ds_exp_many_at(int lv, const double *x, double *y, int64_t n);

#endif
