#!/bin/sh
# cuda_spec.sh — speculative decoding on the GPU (issue: exact speculative
# decoding on the GPU): bench/bench_spec.sh's five modes (plain,
# canonical+direct, fast+direct, canonical+replay, the table scheduler) with
# --device cuda, side by side in one run; tok/s, ratio to plain, mean
# accepted length, text == plain. JSON in bench/results/cuda_spec.json.
set -eu
B=${BUILD:-build}
"$B/dspark" devices --require cuda >/dev/null || { echo "cuda_spec.sh: no usable CUDA device" >&2; exit 2; }
EXTRA="--device cuda ${EXTRA:-}" CTX=${CTX:-512} THREADS=${THREADS:-1} sh bench/bench_spec.sh
mv bench/results/spec.json bench/results/cuda_spec.json
