#!/bin/sh
# cuda.sh — the CUDA engine benchmark (issue: CUDA backend; issue 22), on the
# GPU: the shipped target and make-model models of the Qwen3-0.6B and
# Qwen3-8B shapes (vocab 151936), F16 and Q8_0. Per model: decode tok/s and
# the GB/s that implies (weight bytes read per token), forward_batch at M =
# 1, 2, 4, 8, 16 canonical and fast as a ratio to one decode step, batched
# prefill of each PREFILL length, decode at each DEPTHS prefix (as a ratio to
# the first), and the GPU memory the process used. Medians of REPS (>= 5).
# Last, one line per model against llama.cpp's figures on the same shapes
# (the issue-22 table, H200, llama-bench -ngl 99 -fa 1; the lead runs the
# side-by-side itself at the end): decode and prefill 512 ratios.
# Table on stdout, one JSON per model under bench/results/cuda-*.json.
#   SHAPES="tiny 0.6b 8b"  TYPES="q8_0 f16"  REPS=7  MODELS_DIR=/tmp/dspark-models
#   PREFILL=512,4096  DEPTHS=64,1024,4096,16384,32768 (each shape runs the depths
#   its n_ctx holds: tiny 512, 0.6b 4096, 8b 40960; issue 22's long-context goal:
#   decode at 4k / 16k / 32k within 1.5x / 2x / 3x of decode at 64)
set -eu
B=${BUILD:-build}
D=$B/dspark
R=bench/results
mkdir -p "$R"
REPS=${REPS:-7}
SHAPES=${SHAPES:-"tiny 0.6b 8b"}
TYPES=${TYPES:-"q8_0 f16"}
PREFILL=${PREFILL:-512,4096}
DEPTHS=${DEPTHS:-64,1024,4096,16384,32768}
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
              --head-dim 128 --n-ff 12288 --n-vocab 151936 --n-ctx 40960 --seed 1 >/dev/null ;;
    esac
    echo "$f"
}
# llama.cpp on the H200 (issue 22's table): decode tok/s, prefill 512 tok/s
anchor() {
    case "$1-$2" in
    tiny-q8_0) echo "3614 183000" ;;
    0.6b-q8_0) echo "761 47300" ;;
    0.6b-f16) echo "665 58500" ;;
    8b-q8_0) echo "242 10900" ;;
    *) echo "" ;;
    esac
}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
for s in $SHAPES; do
    for t in $TYPES; do
        f=$(make_shape "$s" "$t")
        echo "== $s $t ($(du -h "$f" | cut -f1)) =="
        dep=$DEPTHS
        case $s in   # what the shape's n_ctx holds (the steps and a margin on top)
        tiny) dep=$(echo "$DEPTHS" | tr ',' '\n' | awk '$1 <= 400' | paste -sd, -) ;;
        0.6b) dep=$(echo "$DEPTHS" | tr ',' '\n' | awk '$1 <= 4000' | paste -sd, -) ;;
        esac
        pre=$PREFILL
        [ "$s" = tiny ] && pre=$(echo "$PREFILL" | tr ',' '\n' | awk '$1 <= 400' | paste -sd, -)
        [ -n "$pre" ] || pre=256
        set -- --device cuda --reps "$REPS" --prefix 64 --decode 64 --prefill-len "$pre" --json "$R/cuda-$s-$t.json"
        [ -n "$dep" ] && set -- "$@" --decode-at "$dep"
        $D bench -m "$f" "$@" | tee "$T/$s-$t.txt"
    done
done
echo "== against llama.cpp (issue 22's H200 figures; ratio > 1: dspark faster) =="
for s in $SHAPES; do
    for t in $TYPES; do
        a=$(anchor "$s" "$t"); [ -n "$a" ] || continue
        dec=$(awk '/^decode:/ {print $5}' "$T/$s-$t.txt")
        p512=$(awk '/^prefill\(512\)/ {print $2}' "$T/$s-$t.txt")
        set -- $a
        printf '%-5s %-5s decode %8s tok/s vs %s = %sx   prefill512 %9s tok/s vs %s = %sx\n' "$s" "$t" "$dec" "$1" \
            "$(awk -v a="$dec" -v b="$1" 'BEGIN { printf "%.2f", a / b }')" "${p512:--}" "$2" \
            "$(awk -v a="${p512:-0}" -v b="$2" 'BEGIN { printf "%.2f", a / b }')"
    done
done
