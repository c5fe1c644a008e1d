#!/bin/sh
# moe_peer.sh — dspark's qwen3moe files in llama.cpp, side by side (issue 26):
# the file dspark's make-model writes must load in llama.cpp (its qwen3moe
# loader: ffn_gate_inp, ffn_{gate,up,down}_exps, expert_count / used /
# feed_forward_length), and both engines' greedy text and speed on it are
# printed together. The texts need not agree token for token (another
# arithmetic, random weights with near ties); the first differing byte is
# reported as INFO. Needs llama.cpp's build/bin (llama-completion,
# llama-bench): ../shared/peers/build.sh builds it.
#
#   LLAMA_BIN=DIR       llama.cpp's build/bin; without it: skipped
#   SHAPE=tiny|a3b      tiny (default): 4 layers, 8 experts, 2 used;
#                       a3b: Qwen3-30B-A3B's layer shape (2048 wide, 128
#                       experts, 8 used, expert FFN 768, vocab 151936) with
#                       LAYERS layers (default 48: the full 30B-A3B, ~32 GB
#                       as Q8_0 — make sure the disk has it)
#   DEVICE=cpu          dspark's device (cpu or cuda);
#                       NGL=99 llama.cpp's -ngl
set -eu
B=${BUILD:-build}
D=$B/dspark
LB=${LLAMA_BIN:-}
if [ -z "$LB" ] || [ ! -x "$LB/llama-completion" ]; then
    echo "moe_peer: LLAMA_BIN (llama.cpp's build/bin with llama-completion) not set or not built: skipped"
    exit 0
fi
SHAPE=${SHAPE:-tiny}
DEVICE=${DEVICE:-cpu}
NGL=${NGL:-0}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
F=${TMPDIR:-/tmp}/dspark-moe-$SHAPE.gguf
if [ ! -f "$F" ]; then
    if [ "$SHAPE" = a3b ]; then
        $D make-model -o "$F" --arch qwen3moe --type q8_0 --n-embd 2048 --n-layer "${LAYERS:-48}" --n-head 32 --n-head-kv 4 \
            --head-dim 128 --n-ff 6144 --n-expert 128 --n-expert-used 8 --n-ff-exp 768 --n-vocab 151936 --n-ctx 4096 --seed 1
    else
        $D make-model -o "$F" --arch qwen3moe --type q8_0 --n-embd 128 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 256 \
            --n-expert 8 --n-expert-used 2 --n-ff-exp 64 --n-vocab 400 --seed 7
    fi
fi
P="The river was quiet in the morning, and the boats waited by the old stone bridge."
echo "== qwen3moe in dspark and llama.cpp: $F ($SHAPE) =="
"$LB/llama-completion" -m "$F" -p "$P" -n 32 --temp 0 --top-k 1 -ngl "$NGL" -no-cnv --no-display-prompt \
    >"$T/lc" 2>"$T/lc.err" || { echo "FAIL llama.cpp does not load or run $F:"; tail -5 "$T/lc.err"; exit 1; }
echo "PASS llama.cpp loads and runs dspark's qwen3moe file ($(grep -o 'n_expert *= *[0-9]*' "$T/lc.err" | head -1), $(grep -o 'n_expert_used *= *[0-9]*' "$T/lc.err" | head -1))"
$D generate --device "$DEVICE" -m "$F" -p "$P" -n 32 >"$T/ds" 2>"$T/ds.err" || { echo "FAIL dspark generate"; cat "$T/ds.err"; exit 1; }
python3 - "$T/lc" "$T/ds" <<'PY'
import sys
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read().rstrip(b"\n")
n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
print("INFO greedy text: llama.cpp %d bytes, dspark %d bytes, equal for the first %d" % (len(a), len(b), n))
PY
echo "INFO dspark: $(tail -1 "$T/ds.err")"
"$LB/llama-bench" -m "$F" -ngl "$NGL" -p 8,512 -n 64 -r 3 2>/dev/null | grep -E 'pp|tg' || true
$D bench --device "$DEVICE" -m "$F" --reps 3 --prefix 1 --decode 64 --prefill-len 512 2>&1 | grep -E '^(decode|prefill)' || true
