#!/bin/sh
# ds4_yarn_peer.sh — deepseek4's rope scaling (rope.scaling yarn on the
# compressed layers) against llama.cpp's CPU build on the same F32 files:
# make-model writes a random deepseek4 model with compressed layers and
# --rope-yarn F --rope-orig-ctx N; both engines decode 48 greedy tokens of
# one prompt; llama's output less the prompt must equal dspark's output
# (NUL bytes removed: llama.cpp's C strings drop a 0x00 token byte; trailing
# newlines stripped, and llama-completion's " [end of text]" where the model
# ended the text). A line per file, AGREE or DIFFER, and whether the
# scaling moved dspark's text against the same file without it.
#   LLAMA_BIN=DIR (llama.cpp's build/bin with llama-completion)  OUT=FILE
set -eu
D=${BUILD:-build}/dspark
L=${LLAMA_BIN:?LLAMA_BIN=llama.cpp build/bin}/llama-completion
OUT=${OUT:-bench/results/ds4-yarn-llamacpp.txt}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
P="The river was quiet in the morning, and the boats waited by the old stone bridge. The river was quiet in the morning, and the boats waited by the old stone bridge."
MK="--arch deepseek4 --type f32 --n-embd 64 --n-layer 2 --n-head 4 --head-dim 128 --n-rot 32 --q-lora 64 --o-lora 32 --n-expert 8 --n-expert-used 2 --n-ff-exp 64 --n-vocab 400 --n-swa 24 --hc-iters 10 --n-indexer-head 2 --indexer-top-k 3"
{
echo "# deepseek4 rope scaling (yarn on the compressed layers): dspark $(git rev-parse --short HEAD 2>/dev/null) vs llama.cpp ($L), 48 greedy tokens, llama -t 1, dspark -t 2"
echo "# $(date -u) $(lscpu | sed -n 's/^Model name: *//p') load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# make-model $MK --seed S --compress-ratios R --rope-yarn F --rope-orig-ctx N; prompt: the river sentence twice"
for seed in 5 7; do
for r in 4,128 128,4; do
    $D make-model -o "$T/n.gguf" $MK --seed $seed --compress-ratios $r 2>/dev/null
    $D generate -m "$T/n.gguf" -p "$P" -n 48 -t 2 >"$T/n.txt" 2>/dev/null
    for f in 4:64 16:32; do
        fac=${f%:*}; orig=${f#*:}
        $D make-model -o "$T/y.gguf" $MK --seed $seed --compress-ratios $r --rope-yarn $fac --rope-orig-ctx $orig 2>/dev/null
        $D generate -m "$T/y.gguf" -p "$P" -n 48 -t 2 >"$T/d.txt" 2>/dev/null
        rc=0; timeout 120 "$L" -m "$T/y.gguf" -p "$P" -n 48 --temp 0 -no-cnv -t 1 --no-warmup >"$T/l.txt" 2>"$T/l.err" || rc=$?
        res=$(python3 -c '
import sys
lc = open(sys.argv[1], "rb").read(); g = open(sys.argv[2], "rb").read().replace(b"\0", b"").rstrip(b"\n"); p = sys.argv[3].encode()
lc = lc.rstrip(b"\n")
if lc.endswith(b" [end of text]"): lc = lc[:-len(b" [end of text]")]   # llama-completion marks the end of generation
o = lc[len(p):] if lc.startswith(p) else b""
n = 0
while n < min(len(o), len(g)) and o[n] == g[n]: n += 1
print("AGREE" if lc.startswith(p) and o == g and len(g) > 0 else "DIFFER(first %d of %d bytes equal)" % (n, len(g)))' "$T/l.txt" "$T/d.txt" "$P")
        mv=$(cmp -s "$T/d.txt" "$T/n.txt" && echo same_text_as_unscaled || echo scaling_moves_text)
        echo "seed=$seed ratios=$r yarn_factor=$fac orig_ctx=$orig llama_rc=$rc result=$res $mv bytes=$(wc -c <"$T/d.txt")"
    done
done
done
} | tee -a "$OUT"
