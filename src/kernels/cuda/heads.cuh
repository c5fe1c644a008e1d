/* heads.cuh — the drafter's head ops and device-side token selection on the
 * GPU (src/kernels/cuda/heads.cu): the CUDA implementations of backend.h's
 * add / fill / gate / sample. Each has exactly the table's signature, so
 * wiring them into backend_cuda.cu's ds_backend_i is one line per op:
 *
 *     .add = dsc_add, .fill = dsc_fill, .gate = dsc_gate, .sample = dsc_sample,
 *
 * (or, in a positional initialiser, these four names in this order after
 * the graph hooks). Private to the CUDA backend. */
#ifndef DSPARK_CUDA_HEADS_CUH
#define DSPARK_CUDA_HEADS_CUH

#include "kernels/cuda/cuda_internal.cuh"

/* The stream of an execution context: the CUDA backend's context keeps it
 * as `st`. Where that context becomes a struct embedding the seam's ds_exec
 * header (backend.h), cuda_internal.cuh defines this macro to reach it. */
#ifndef DSC_EXEC_STREAM
#define DSC_EXEC_STREAM(ex) ((ex)->st)
#endif

void dsc_add(ds_exec *ex, int64_t n, const float *a, const float *b, float *y);
void dsc_fill(ds_exec *ex, int64_t n, float *x, float v);
void dsc_gate(ds_exec *ex, ds_gate_kind kind, int n, const float *a, const float *b, const float *e,
              float *s, float *y);
int  dsc_draft_chain(ds_exec *ex, const ds_draft_chain *c);
int  dsc_sample(ds_exec *ex, const ds_sampler *smp, int rows, int n, const float *x, int64_t pos0,
                float *scratch, int32_t *out);

#endif
