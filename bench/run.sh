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

# ---- kquant types (issue 12) --------------------------------------------------------------
# The same memory-bound shape in every kquant type, and the shipped target
# quantized by `dspark quantize` (q8_0, q4_0, q4_k_m, q6_k), side by side
# with Q8_0: decode tok/s and verify(8)/decode (forward_batch canonical at
# M = 8 over one decode step). Types run interleaved, ROUNDS times, so the
# spread between rounds shows the noise of the shared machine.
ROUNDS=${ROUNDS:-2}
KQ_TYPES=${KQ_TYPES:-"q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k"}
SHIPPED=${SHIPPED:-"q8_0 q4_0 q4_k_m q6_k"}
for type in $KQ_TYPES; do
    [ -f "$T/m-$type.gguf" ] || $D make-model -o "$T/m-$type.gguf" --type $type --n-embd 512 --n-layer 6 --n-head 8 \
        --n-head-kv 4 --n-ff 1536 --n-vocab 8192 --n-ctx 1024 --seed 1
done
for q in $SHIPPED; do $D quantize models/dspark-tiny-f16.gguf "$T/s-$q.gguf" $q 2>/dev/null; done
r=1
while [ $r -le "$ROUNDS" ]; do
    for type in $KQ_TYPES; do
        $D bench -m "$T/m-$type.gguf" -t "$THREADS" --reps "$REPS" --prefix 64 --decode 32 --prefill-len 128 \
            --json "$R/kq-make-$type-r$r.json" >/dev/null
    done
    for q in $SHIPPED; do
        $D bench -m "$T/s-$q.gguf" -t "$THREADS" --reps "$REPS" --prefix 64 --decode 32 --prefill-len 128 \
            --json "$R/kq-shipped-$q-r$r.json" >/dev/null
    done
    r=$((r + 1))
done
python3 - "$R" "$ROUNDS" "$KQ_TYPES" "$SHIPPED" <<'PY' | tee "$R/kquant.txt"
import json, sys, statistics
R, rounds, types, shipped = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
def row(kind, t):
    runs = [json.load(open(f"{R}/kq-{kind}-{t}-r{r}.json")) for r in range(1, rounds + 1)]
    tok = [j["decode_tok_s"] for j in runs]
    v8 = [next(v for v in j["verify"] if v["M"] == 8)["canonical_ms"] / j["decode_ms"] for j in runs]
    pf = [j["prefill_tok_s"] for j in runs]
    spread = (max(tok) - min(tok)) / statistics.median(tok) * 100
    return statistics.median(tok), spread, statistics.median(v8), statistics.median(pf), runs[0]["params"]
for kind, names, title in (("make", types, "make-model 6 x 512, ffn 1536, vocab 8192"),
                           ("shipped", shipped, "shipped dspark-tiny target, quantized by dspark")):
    print(f"== {title} (2 threads, median of {rounds} interleaved rounds) ==")
    print(f"{'type':8} {'decode tok/s':>12} {'spread %':>9} {'vs q8_0':>8} {'verify8/decode':>15} {'prefill tok/s':>14}")
    base = row(kind, "q8_0")[0] if "q8_0" in names else None
    for t in names:
        tok, sp, v8, pf, _ = row(kind, t)
        rel = f"{tok / base:.2f}x" if base else "-"
        print(f"{t:8} {tok:12.1f} {sp:9.1f} {rel:>8} {v8:15.2f} {pf:14.1f}")
PY
