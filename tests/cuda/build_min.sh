#!/bin/sh
# Builds build-min/test_cuda_ops from only what it needs (the CPU kernels as
# its reference, the CUDA backend), for GPU machines whose image lacks the
# CLI's libraries (PCRE2, cJSON). `make test-cuda` is the normal way.
# No -Werror: another compiler may warn where this one does not.
set -e
B=${B:-build-min}
NVCC=${NVCC:-nvcc}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v "$NVCC")")")}
mkdir -p "$B"
CF="-std=c11 -D_GNU_SOURCE -O3 -g -Wall -Wextra -Wno-unused-parameter -ffp-contract=off -fno-fast-math -pthread -Isrc -DDS_HAVE_CUDA"
NF="-std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 -O3 -g -fmad=false -prec-div=true -prec-sqrt=true -ftz=false -Xcompiler -ffp-contract=off,-fno-fast-math -Isrc -DDS_HAVE_CUDA"
for f in src/kernels/cpu/*.c src/kernels/registry.c src/threadpool.c; do
    cc $CF -c "$f" -o "$B/$(echo "$f" | tr / _).o" &
done
for f in src/backend_cuda.cu src/kernels/cuda/*.cu; do
    $NVCC $NF -c "$f" -o "$B/$(echo "$f" | tr / _).o" &
done
wait
cc $CF -I"$CUDA_HOME/include" tests/cuda/test_cuda_ops.c "$B"/*.o -o "$B/test_cuda_ops" \
   -L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64" -lcublas -lcudart -lstdc++ -lm -pthread
echo "built $B/test_cuda_ops"
