#!/bin/sh
# cuda.sh — the CUDA engine benchmark (issue: CUDA backend), on the GPU:
# the shipped target and make-model models of the Qwen3-0.6B and Qwen3-8B
# shapes (vocab 151936), F16 and Q8_0. Per model: decode tok/s and the GB/s
# that implies (weight bytes read per token), forward_batch at M = 1, 2, 4,
# 8, 16 canonical and fast as a ratio to one decode step, prefill of 512
# tokens, and the GPU memory the process used. Medians of REPS (>= 5).
# Table on stdout, one JSON per model under bench/results/cuda-*.json.
#   SHAPES="tiny 0.6b 8b"  TYPES="q8_0 f16"  REPS=7  MODELS_DIR=/tmp/dspark-models
set -eu
B=${BUILD:-build}
D=$B/dspark
R=bench/results
mkdir -p "$R"
REPS=${REPS:-7}
SHAPES=${SHAPES:-"tiny 0.6b 8b"}
TYPES=${TYPES:-"q8_0 f16"}
MD=${MODELS_DIR:-/tmp/dspark-models}
mkdir -p "$MD"
$D devices --require cuda >/dev/null || { echo "cuda.sh: no usable CUDA device" >&2; exit 2; }
$D devices
make_shape() {   # shape type -> path
    s=$1; t=$2; f="$MD/$s-$t.gguf"
    case $s in
    tiny) if [ "$t" = q8_0 ]; then f=models/dspark-tiny-q8_0.gguf; else f=models/dspark-tiny-f16.gguf; fi ;;
    0.6b) [ -f "$f" ] || $D make-model -o "$f" --type "$t" --n-embd 1024 --n-layer 28 --n-head 16 --n-head-kv 8 \
              --head-dim 128 --n-ff 3072 --n-vocab 151936 --n-ctx 4096 --seed 1 >/dev/null ;;
    8b)   [ -f "$f" ] || $D make-model -o "$f" --type "$t" --n-embd 4096 --n-layer 36 --n-head 32 --n-head-kv 8 \
              --head-dim 128 --n-ff 12288 --n-vocab 151936 --n-ctx 4096 --seed 1 >/dev/null ;;
    esac
    echo "$f"
}
for s in $SHAPES; do
    for t in $TYPES; do
        f=$(make_shape "$s" "$t")
        echo "== $s $t ($(du -h "$f" | cut -f1)) =="
        $D bench -m "$f" --device cuda --reps "$REPS" --prefix 64 --decode 64 --prefill-len 512 \
            --json "$R/cuda-$s-$t.json"
    done
done
