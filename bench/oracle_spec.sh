#!/bin/sh
# oracle_spec.sh — speculative decoding measured at a shape the shipped pair
# does not have (issue 22, item 5): the ORACLE-ACCEPTANCE benchmark.
#   1. the shipped pair's acceptance is recorded: `generate -md --dump-block`
#      on bench_spec.sh's three prompts (the real drafter, the real target);
#   2. a target of SHAPE (make-model, TYPE) and a random drafter of the
#      shipped drafter's structure for it (make-drafter: 2 layers, block 7,
#      three taps, no confidence head — the shipped mode's scheduler reads
#      none) run `generate --oracle-accept PATTERN` on each prompt with that
#      prompt's pattern: a plain run (its tokens, its tok/s), then the
#      speculative run in which the drafter network runs every round for
#      its cost and its proposals are replaced by the plain continuation,
#      right for as many slots as the recorded round said. Draft, verify,
#      accept, commit and transfers are timed for real; the acceptance is
#      the shipped pair's, prompt by prompt, not the random drafter's.
# Medians of REPS runs (each `--warmup`: recordings out of the figures);
# the speed-up is bench_spec.sh's: mean speculative tok/s over the prompts
# against the mean plain tok/s of the same processes.
#   SHAPE=8b|0.6b|m505|tiny  TYPE=q8_0  DEVICE=cuda  N=128  REPS=3  MODELS_DIR=/tmp/dspark-models
#   (on the CPU: DEVICE=cpu THREADS=2; DSPARK_SIMD caps the level)
set -eu
B=${BUILD:-build}
D=$B/dspark
R=bench/results
mkdir -p "$R"
SHAPE=${SHAPE:-8b}
TYPE=${TYPE:-q8_0}
DEVICE=${DEVICE:-cuda}
N=${N:-128}
REPS=${REPS:-3}
TH=${THREADS:-2}
MD=${MODELS_DIR:-/tmp/dspark-models}
mkdir -p "$MD"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
[ -f models/dspark-tiny-q8_0.gguf ] || make BUILD="$B" models >/dev/null
DR=models/dspark-tiny-drafter-q8_0.gguf; [ -f "$DR" ] || DR=models/dspark-tiny-drafter-f16.gguf
cat > "$T/p1" <<'P'
The speculative decoder drafts a block of tokens, and the target model verifies them in one pass.
P
cat > "$T/p2" <<'P'
def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
P
cat > "$T/p3" <<'P'
Once upon a time, in a small village by the sea, there lived an old fisherman who
P
# each prompt's rounds, recorded by the shipped pair
for p in p1 p2 p3; do
    $D generate -m models/dspark-tiny-q8_0.gguf -md "$DR" -f "$T/$p" -n "$N" --device "$DEVICE" \
        --dump-block "$T/$p.blk" >/dev/null 2>"$T/$p.rec"
    echo "recorded $p (shipped pair): $(wc -l < "$T/$p.blk") rounds, $(grep -o 'mean_accepted_len=[0-9.]*' "$T/$p.rec")"
    cp "$T/$p.blk" "$R/oracle-pattern-shipped-$p.txt"
done
case $SHAPE in
tiny) F=models/dspark-tiny-q8_0.gguf ;;
# the 505 MB shape of bench/peer_cpu.sh (issue 24: a memory-bound target on a CPU)
m505) F="$MD/m505-$TYPE.gguf"; [ -f "$F" ] || $D make-model -o "$F" --type "$TYPE" --n-embd 1024 --n-layer 28 --n-head 16 \
          --n-head-kv 8 --head-dim 128 --n-ff 3072 --n-vocab 32000 --n-ctx 4096 --seed 1 >/dev/null ;;
0.6b) F="$MD/0.6b-$TYPE.gguf"; [ -f "$F" ] || $D make-model -o "$F" --type "$TYPE" --n-embd 1024 --n-layer 28 --n-head 16 \
          --n-head-kv 8 --head-dim 128 --n-ff 3072 --n-vocab 151936 --n-ctx 4096 --seed 1 >/dev/null ;;
8b)   F="$MD/8b-$TYPE.gguf"; [ -f "$F" ] || $D make-model -o "$F" --type "$TYPE" --n-embd 4096 --n-layer 36 --n-head 32 \
          --n-head-kv 8 --head-dim 128 --n-ff 12288 --n-vocab 151936 --n-ctx 4096 --seed 1 >/dev/null ;;
*) echo "oracle_spec: SHAPE must be tiny, m505, 0.6b or 8b" >&2; exit 2 ;;
esac
NL=$($D inspect "$F" | awk '/block_count/ {print $NF; exit}')
DF="$MD/$SHAPE-$TYPE-drafter.gguf"
[ -f "$DF" ] || $D make-drafter -m "$F" -o "$DF" --n-layer 2 --block-size 7 --no-confidence --type q8_0 \
    --taps "1,$((NL / 2)),$((NL - 3))" --seed 1 >/dev/null
echo "== oracle-acceptance benchmark: $SHAPE $TYPE target, random drafter $(basename "$DF"), each prompt with its own recorded pattern =="
# per prompt: the median of REPS runs (plain tok/s and speculative tok/s of
# the same process); then bench_spec.sh's convention: the mean over prompts
# of each, and their ratio
kv() { printf '%s\n' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
sp=0; sl=0; sn=0
for p in p1 p2 p3; do
    : > "$T/$p.plain"; : > "$T/$p.spec"
    for r in $(seq 1 "$REPS"); do
        $D generate -m "$F" -md "$DF" -f "$T/$p" -n "$N" -t "$TH" --device "$DEVICE" --warmup --oracle-accept "$T/$p.blk" \
            >/dev/null 2>"$T/run"
        grep '^mode=' "$T/run"
        kv "$(grep '^mode=plain' "$T/run")" decode_tok_s >> "$T/$p.plain"
        kv "$(grep '^mode=spec-oracle' "$T/run")" tok_s >> "$T/$p.spec"
        len=$(kv "$(grep '^mode=spec-oracle' "$T/run")" mean_accepted_len)
    done
    pt=$(median < "$T/$p.plain"); st=$(median < "$T/$p.spec")
    echo "prompt $p: plain $pt tok/s, speculative $st tok/s ($(awk -v a="$st" -v b="$pt" 'BEGIN { printf "%.3f", a / b }')x) at mean accepted length $len"
    sp=$(awk -v a="$sp" -v b="$pt" 'BEGIN { print a + b }'); ss=$(awk -v a="${ss:-0}" -v b="$st" 'BEGIN { print a + b }')
    sl=$(awk -v a="$sl" -v b="$len" 'BEGIN { print a + b }'); sn=$((sn + 1))
done
head -1 "$T/run"
echo "ORACLE-ACCEPTANCE $SHAPE $TYPE: speculative / plain = $(awk -v a="$ss" -v b="$sp" 'BEGIN { printf "%.3f", a / b }') (mean tok/s over the 3 prompts, medians of $REPS; mean accepted length $(awk -v a="$sl" -v n="$sn" 'BEGIN { printf "%.3f", a / n }'), the shipped pair's, replayed)"
