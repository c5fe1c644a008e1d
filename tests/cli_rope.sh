#!/bin/sh
# cli_rope.sh — rope scaling and frequency factors on the dense architectures
# (qwen3, llama), through the CLI on the CPU:
#   - a llama file with Llama 3.1's rope_freqs.weight (make-model
#     --rope-freqs: the llama3 factors), a qwen3 file with rope.scaling yarn
#     (factor 4, original context 64: the ramp is inside the 16 pairs) and
#     a llama file with linear scaling: each moves the logits against the
#     same file without it (the weights are the same: the factors and keys
#     take no random draw) — the counter-check that the scaling is applied;
#   - each keeps the exactness properties: greedy text equal with -t 1, 2,
#     spec greedy == plain with a drafter made for it, verify(8) == 8
#     decodes (diverge: logits, taps and K/V rows memcmp) at a prompt past
#     position 100, on the portable and AVX-512 levels;
#   - diverge --fast rope is found at the q RoPE of layer 0 (the scaled
#     fast variant differs; canonical does not); --tp 2 (tp.c's RoPE) prints
#     the plain text;
#   - make-model's refusals are one line, exit 2.
# DSPARK_DEVICE=cuda (tests/cuda/run.sh) runs the same checks on the GPU and
# adds: each scaled file's logits (prefill and decode steps) on the device are
# the CPU's, byte for byte; --tp is left to the CPU there.
# llama.cpp's agreement on these files: bench/rope_scaling_peer.sh
# (bench/results/rope-scaling-llamacpp-s37.txt).
set -u
BUILD=${BUILD:-build}
DEV=${DSPARK_DEVICE:-cpu}
D0="$BUILD/dspark"
# generate / diverge on the device under test; make-model / make-drafter are device-free
D() { c=$1; shift; case $c in generate|diverge) "$D0" "$c" --device "$DEV" "$@";; *) "$D0" "$c" "$@";; esac; }
D=D
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
. tests/lib_cli.sh   # expect_err
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
P="The river was quiet in the morning, and the boats waited by the old stone bridge."
P3="$P $P $P"
ML="--arch llama --untied-output --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 32 --n-ff 128 --n-vocab 400 --rope-base 500000 --seed 5"
MQ="--arch qwen3 --untied-output --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 32 --n-ff 128 --n-vocab 400 --seed 5"

# moves LABEL PLAIN SCALED: the scaled file's logits and greedy text differ from the plain one's
# (and on a device, its logits are the CPU's bytes)
moves() {
    if [ "$DEV" != cpu ]; then
        "$D0" generate -m "$3" -p "$P3" -n 4 --dump-logits "$T/lc" >/dev/null 2>&1 &&
            $D generate -m "$3" -p "$P3" -n 4 --dump-logits "$T/ld" >/dev/null 2>&1 && [ -s "$T/ld" ] && cmp -s "$T/lc" "$T/ld" \
            && ok "$1: $DEV logits == CPU logits (prefill + 4 steps)" || bad "$1: $DEV logits differ from the CPU's"
    fi
    $D generate -m "$2" -p "$P" -n 4 --dump-logits "$T/l0" >/dev/null 2>&1 &&
        $D generate -m "$3" -p "$P" -n 4 --dump-logits "$T/l1" >/dev/null 2>&1 && [ -s "$T/l1" ] && ! cmp -s "$T/l0" "$T/l1" \
        && ok "$1 moves the logits" || bad "$1: no logits, or the unscaled model's"
    $D generate -m "$2" -p "$P3" -n 48 -t 2 >"$T/t0" 2>/dev/null && $D generate -m "$3" -p "$P3" -n 48 -t 2 >"$T/t1" 2>/dev/null \
        && [ -s "$T/t1" ] && ! cmp -s "$T/t0" "$T/t1" && ok "$1 moves the greedy text" || bad "$1: no text, or the unscaled model's"
}

# exact_under LABEL MODEL STEM: threads, spec == plain, verify(8) == 8 decodes
exact_under() {
    $D generate -m "$2" -p "$P3" -n 48 -t 2 >"$3.g" 2>/dev/null && $D generate -m "$2" -p "$P3" -n 48 -t 1 >"$3.g1" 2>/dev/null \
        && [ -s "$3.g" ] && cmp -s "$3.g" "$3.g1" && ok "$1: greedy text equal with -t 1, 2" || bad "$1: thread count changes the text"
    $D make-drafter -m "$2" -o "$3.d.gguf" --n-layer 1 --block-size 6 --seed 3 2>/dev/null || bad "make-drafter ($1)"
    $D generate -m "$2" -md "$3.d.gguf" -p "$P3" -n 48 -t 2 --draft-max 3 >"$3.s" 2>/dev/null && cmp -s "$3.g" "$3.s" \
        && ok "$1: spec greedy == plain" || bad "$1: spec != plain"
    for lv in portable avx512; do
        env DSPARK_SIMD=$lv "$D0" diverge --device "$DEV" -m "$2" -p "$P3" --block-greedy 8 >"$3.dv" 2>&1 && grep -q '^FIRST_DIVERGENCE NONE' "$3.dv" \
            && ok "$1: verify(8) == 8 decodes (DSPARK_SIMD=$lv)" || { bad "$1 diverges (DSPARK_SIMD=$lv)"; grep -a '^FIRST\|rror' "$3.dv"; }
    done
    $D diverge -m "$2" -p "$P3" --block-greedy 8 --fast rope >"$3.df" 2>&1
    grep -q '^FIRST_DIVERGENCE row=[0-9]* layer=0 checkpoint=cp2_qkv subobject=q_rope' "$3.df" \
        && ok "$1: --fast rope: $(grep '^FIRST_DIVERGENCE' "$3.df")" || { bad "$1: --fast rope not found at the q RoPE"; grep -a '^FIRST\|rror' "$3.df"; }
}

# ---- llama + rope_freqs.weight (Llama 3.1's llama3 factors) -------------------
$D make-model -o "$T/l0.gguf" $ML 2>/dev/null || bad "make-model llama"
$D make-model -o "$T/lf.gguf" $ML --rope-freqs 2>/dev/null || bad "make-model llama --rope-freqs"
$D make-model -o "$T/lf2.gguf" $ML --rope-freqs 2>/dev/null && cmp -s "$T/lf.gguf" "$T/lf2.gguf" \
    && ok "make-model --rope-freqs is deterministic" || bad "make-model --rope-freqs not deterministic"
moves "llama rope_freqs" "$T/l0.gguf" "$T/lf.gguf"
exact_under "llama rope_freqs" "$T/lf.gguf" "$T/lf"

# ---- qwen3 + rope.scaling yarn ---------------------------------------------------
$D make-model -o "$T/q0.gguf" $MQ 2>/dev/null || bad "make-model qwen3"
$D make-model -o "$T/qy.gguf" $MQ --rope-yarn 4 --rope-orig-ctx 64 2>/dev/null || bad "make-model qwen3 --rope-yarn 4"
moves "qwen3 yarn" "$T/q0.gguf" "$T/qy.gguf"
exact_under "qwen3 yarn" "$T/qy.gguf" "$T/qy"

# ---- llama + linear scaling and factors together ---------------------------------
$D make-model -o "$T/ll.gguf" $ML --rope-linear 2 --rope-freqs 2>/dev/null || bad "make-model llama --rope-linear 2 --rope-freqs"
moves "llama linear + rope_freqs (vs rope_freqs alone)" "$T/lf.gguf" "$T/ll.gguf"
$D generate -m "$T/ll.gguf" -p "$P3" -n 32 -t 2 >"$T/llg" 2>/dev/null && $D generate -m "$T/ll.gguf" -p "$P3" -n 32 -t 1 >"$T/llg1" 2>/dev/null \
    && [ -s "$T/llg" ] && cmp -s "$T/llg" "$T/llg1" && ok "llama linear + rope_freqs: greedy text equal with -t 1, 2" || bad "llama linear: thread count changes the text"
$D diverge -m "$T/ll.gguf" -p "$P3" --block-greedy 8 >"$T/lld" 2>&1 && grep -q '^FIRST_DIVERGENCE NONE' "$T/lld" \
    && ok "llama linear + rope_freqs: verify(8) == 8 decodes" || { bad "llama linear diverges"; grep -a '^FIRST\|rror' "$T/lld"; }

# tensor parallelism (tp.c's own RoPE call): --tp 2 on CPU ranks prints the plain text
[ "$DEV" = cpu ] && { "$D0" generate -m "$T/ll.gguf" -p "$P3" -n 32 -t 2 --tp 2 >"$T/llt" 2>/dev/null && cmp -s "$T/llg" "$T/llt" \
    && ok "llama linear + rope_freqs: --tp 2 text == plain" || bad "llama linear + rope_freqs: --tp 2 differs"; }

# ---- refusals ------------------------------------------------------------------------
expect_err "--rope-freqs on a qwen3 model" "llama only" $D make-model -o "$T/bad.gguf" --arch qwen3 --rope-freqs
expect_err "--rope-linear with --rope-yarn" "exclude" $D make-model -o "$T/bad.gguf" --arch llama --rope-linear 2 --rope-yarn 4
expect_err "--rope-yarn on a qwen3moe model" "deepseek4, qwen3 or llama" $D make-model -o "$T/bad.gguf" --arch qwen3moe --rope-yarn 4
exit $fail
