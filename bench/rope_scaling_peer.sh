#!/bin/sh
# rope_scaling_peer.sh — rope scaling on the dense architectures against
# llama.cpp's CPU build on the same F32 files: make-model writes random llama
# files with Llama 3.1's rope_freqs.weight (--rope-freqs: the llama3
# factors), with linear scaling on top, and qwen3 files with rope.scaling yarn
# (--rope-yarn F --rope-orig-ctx N); both engines decode 48 greedy tokens
# after a prompt of several hundred tokens (the river sentence eight times:
# the positions run far past where the factors and the ramp act); llama's
# output less the prompt must equal dspark's (NUL bytes removed: llama.cpp's
# C strings drop a 0x00 token byte; trailing newlines stripped, and
# llama-completion's " [end of text]"). A line per file, AGREE or DIFFER
# (with the equal prefix), and whether the scaling moved dspark's text
# against the same file without it (the weights are the same: the factors
# and keys take no random draw).
#   LLAMA_BIN=DIR (llama.cpp's build/bin with llama-completion)  OUT=FILE
set -eu
D=${BUILD:-build}/dspark
L=${LLAMA_BIN:?LLAMA_BIN=llama.cpp build/bin}/llama-completion
OUT=${OUT:-bench/results/rope-scaling-llamacpp.txt}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
S="The river was quiet in the morning, and the boats waited by the old stone bridge."
P="$S $S $S $S $S $S $S $S"
ML="--arch llama --type f32 --untied-output --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 32 --n-ff 128 --n-vocab 400 --rope-base 500000"
MQ="--arch qwen3 --type f32 --untied-output --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 32 --n-ff 128 --n-vocab 400"
cmp_one() {   # LABEL MODEL PLAIN_TEXT
    $D generate -m "$2" -p "$P" -n 48 -t 2 >"$T/d.txt" 2>/dev/null
    rc=0; timeout 300 "$L" -m "$2" -p "$P" -n 48 --temp 0 -no-cnv -t 1 --no-warmup >"$T/l.txt" 2>"$T/l.err" || rc=$?
    # llama.cpp twice: on a loaded host its output has been seen to change from run to run
    timeout 300 "$L" -m "$2" -p "$P" -n 48 --temp 0 -no-cnv -t 1 --no-warmup >"$T/l2.txt" 2>/dev/null || rc=$?
    st=$(cmp -s "$T/l.txt" "$T/l2.txt" && echo llama_stable || echo llama_runs_differ)
    res=$(python3 -c '
import sys
lc = open(sys.argv[1], "rb").read(); g = open(sys.argv[2], "rb").read().replace(b"\0", b"").rstrip(b"\n"); p = sys.argv[3].encode()
lc = lc.rstrip(b"\n")
if lc.endswith(b" [end of text]"): lc = lc[:-len(b" [end of text]")]
o = lc[len(p):] if lc.startswith(p) else b""
n = 0
while n < min(len(o), len(g)) and o[n] == g[n]: n += 1
print("AGREE" if lc.startswith(p) and o == g and len(g) > 0 else "DIFFER(first %d of %d bytes equal)" % (n, len(g)))' "$T/l.txt" "$T/d.txt" "$P")
    mv=$(cmp -s "$T/d.txt" "$3" && echo same_text_as_unscaled || echo scaling_moves_text)
    ntok=$($D generate -m "$2" -p "$P" -n 1 -v 2>&1 >/dev/null | grep -o 'n_prompt=[0-9]*' | head -1)
    echo "$1 llama_rc=$rc $st $ntok result=$res $mv bytes=$(wc -c <"$T/d.txt")"
}
{
echo "# dense rope scaling: dspark $(git rev-parse --short HEAD 2>/dev/null) vs llama.cpp ($L), 48 greedy tokens, llama -t 1, dspark -t 2"
echo "# $(date -u) $(lscpu | sed -n 's/^Model name: *//p') load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# llama: make-model $ML --seed S [--rope-freqs] [--rope-linear F]; qwen3: make-model $MQ --seed S --rope-yarn F --rope-orig-ctx N"
echo "# prompt: the river sentence eight times"
for seed in 5 7 11; do
    $D make-model -o "$T/l0.gguf" $ML --seed $seed 2>/dev/null
    $D generate -m "$T/l0.gguf" -p "$P" -n 48 -t 2 >"$T/l0.txt" 2>/dev/null
    cmp_one "seed=$seed llama plain" "$T/l0.gguf" "$T/l0.txt"
    $D make-model -o "$T/lf.gguf" $ML --seed $seed --rope-freqs 2>/dev/null
    cmp_one "seed=$seed llama rope_freqs(llama3)" "$T/lf.gguf" "$T/l0.txt"
    $D make-model -o "$T/ll.gguf" $ML --seed $seed --rope-freqs --rope-linear 2 2>/dev/null
    cmp_one "seed=$seed llama rope_freqs+linear2" "$T/ll.gguf" "$T/l0.txt"
    $D make-model -o "$T/q0.gguf" $MQ --seed $seed 2>/dev/null
    $D generate -m "$T/q0.gguf" -p "$P" -n 48 -t 2 >"$T/q0.txt" 2>/dev/null
    for f in 4:64 8:256; do
        fac=${f%:*}; orig=${f#*:}
        $D make-model -o "$T/qy.gguf" $MQ --seed $seed --rope-yarn $fac --rope-orig-ctx $orig 2>/dev/null
        cmp_one "seed=$seed qwen3 yarn_factor=$fac orig_ctx=$orig" "$T/qy.gguf" "$T/q0.txt"
    done
done
} | tee -a "$OUT"
