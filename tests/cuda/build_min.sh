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
pids=""
V=$(sed -n 's/^VERSION *:= *//p' Makefile)
CF="-std=c11 -D_GNU_SOURCE -O3 -g -Wall -Wextra -Wno-unused-parameter -ffp-contract=off -fno-fast-math -pthread -Isrc -DDS_HAVE_CUDA -DDSPARK_VERSION_STRING=\"$V\""
NF="-std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 -O3 -g -fmad=false -prec-div=true -prec-sqrt=true -ftz=false -Xcompiler -ffp-contract=off,-fno-fast-math -Isrc -DDS_HAVE_CUDA -DDSPARK_VERSION_STRING=\"$V\""
# (the backend table's helpers, the CPU backend and its sampler, the kquant packer: what the
# harness and the kernels call besides the kernels themselves)
for f in src/kernels/cpu/*.c src/kernels/registry.c src/kernels/kquant.c src/threadpool.c src/backend.c src/backend_cpu.c src/sampler.c; do
    cc $CF -c "$f" -o "$B/$(echo "$f" | tr / _).o" &
    pids="$pids $!"
done
for f in src/backend_cuda.cu src/kernels/cuda/*.cu; do
    $NVCC $NF -c "$f" -o "$B/$(echo "$f" | tr / _).o" &
    pids="$pids $!"
done
# a failed compile in the background must not leave a half-linked harness
fails=0
for j in $pids; do wait "$j" || fails=$((fails + 1)); done
[ "$fails" -eq 0 ] || { echo "build_min.sh: $fails compile(s) failed" >&2; exit 1; }
cc $CF -I"$CUDA_HOME/include" tests/cuda/test_cuda_ops.c "$B"/*.o -o "$B/test_cuda_ops" \
   -L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64" -lcublas -lcudart -lstdc++ -lm -pthread -ldl
echo "built $B/test_cuda_ops"
