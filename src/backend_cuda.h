/* backend_cuda.h — what C code (tests, benchmarks) may know about the CUDA
 * backend beyond the function table of backend.h. Only with DS_HAVE_CUDA. */
#ifndef DSPARK_BACKEND_CUDA_H
#define DSPARK_BACKEND_CUDA_H

#include "backend.h"

/* Positions the canonical RoPE table covers (kernels/cuda/rope.cu): below
 * it the GPU's cos/sin are the host C library's bits. */
#define DS_CUDA_ROPE_POS 40960   /* Qwen3's longest context; past it: the device's sincosf */

/* The exec's cudaStream_t (as void *, so that C callers need no CUDA
 * headers), for timing with CUDA events on the same stream. */
void *ds_exec_cuda_stream(ds_exec *ex);

/* How many Q8_0 canonical matmuls of this exec read the Q8_0 copy their
 * input's producer made (kernels/cuda/cuda_internal.cuh: dsc_q8x) instead
 * of quantizing it themselves. */
unsigned long long ds_exec_cuda_q8x_hits(ds_exec *ex);

/* How many attention calls of this exec ran rows of several sequences on
 * the tile path (kernels/cuda/attention.cu att_tile_runs: ds_rows.runs). */
unsigned long long ds_exec_cuda_tile_runs(ds_exec *ex);

/* That copy of rows x (M x K), while it is valid: device pointers to its
 * quants (int8 [M][K]) and block scales (f32 [M][K / 32]); 0 when there is
 * none. For tests, which compare its bytes with the CPU's quantization. */
int ds_exec_cuda_q8x_peek(ds_exec *ex, const float *x, int M, int64_t K, const void **q, const void **d);

#endif
