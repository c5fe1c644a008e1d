#!/bin/sh
# Engine-core benchmark (issue: engine core): a ~25M-parameter Qwen3 shape made
# by make-model, Q8_0 and F32, 2 threads: decode tok/s, forward_batch time for
# M = 1,2,4,8,16 in fast and canonical modes and their ratio, prefill tok/s.
# Medians of >= 5 runs; a table on stdout and JSON under bench/results/.
set -eu
B=${BUILD:-build}
D=$B/dspark
R=bench/results
mkdir -p "$R"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
REPS=${REPS:-7}
THREADS=${THREADS:-2}
for type in q8_0 f32; do
    # 25.1M parameters: 6 layers, d=512, ffn=1536, GQA 8/4, vocab 8192 (tied)
    $D make-model -o "$T/m-$type.gguf" --type $type --n-embd 512 --n-layer 6 --n-head 8 --n-head-kv 4 \
        --n-ff 1536 --n-vocab 8192 --n-ctx 1024 --seed 1
    echo "== $type =="
    $D bench -m "$T/m-$type.gguf" -t "$THREADS" --reps "$REPS" --prefix 64 --decode 32 --prefill-len 128 \
        --json "$R/engine-$type.json"
done
