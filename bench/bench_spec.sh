#!/bin/sh
# Speculative decoding benchmark: plain decode vs speculative decoding
# (canonical/direct, fast/direct, canonical/replay, and canonical/direct with
# the cost-table scheduler on a start-up SPS measurement) on one target + drafter
# pair, several prompts, medians of REPS (>= 5) runs per prompt and mode.
# Reports decode tok/s, mean accepted length (a+1 per round, bonus included),
# the per-round time breakdown (draft / verify / accept / commit, ms), the
# speed ratio to plain side by side, and whether each mode's text equals the
# plain text. Table on stdout, JSON in bench/results/spec.json.
#
#   TARGET=... DRAFTER=...   the pair (default: the shipped pair models/dspark-tiny-q8_0.gguf +
#                            models/dspark-tiny-drafter-q8_0.gguf (make models; else the
#                            F16 drafter), else a
#                            generated random ~25M Q8_0 pair)
#   REPS=5 N=128 THREADS=2 CTX=2048 EXTRA="--temp 0.8 --seed 1"
#   WARMUP=1 (default): every run is `generate --warmup` (the same generation
#   once before the timed one, as llama-bench's warm-up: CUDA graph
#   recordings and first touches out of the figures, in every mode alike);
#   WARMUP=0: cold runs, the recordings inside the decode time
# Uses only `dspark generate` and its stats lines.
set -eu
B=${BUILD:-build}
D=$B/dspark
R=bench/results
mkdir -p "$R"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
REPS=${REPS:-5}
N=${N:-128}
THREADS=${THREADS:-2}
CTX=${CTX:-2048}
EXTRA=${EXTRA:-}
WARMUP=${WARMUP:-1}
case $WARMUP in 0|1) ;; *) echo "bench_spec: WARMUP must be 0 or 1, got '$WARMUP'" >&2; exit 2;; esac
WU=; [ "$WARMUP" = 1 ] && WU=--warmup
[ "$REPS" -ge 5 ] || { echo "bench_spec: REPS must be >= 5" >&2; exit 2; }

TARGET=${TARGET:-}
DRAFTER=${DRAFTER:-}
if [ -z "$TARGET" ] && [ -f models/dspark-tiny-q8_0.gguf ] && [ -f models/dspark-tiny-drafter-q8_0.gguf ]; then
    TARGET=models/dspark-tiny-q8_0.gguf; DRAFTER=models/dspark-tiny-drafter-q8_0.gguf
elif [ -z "$TARGET" ] && [ -f models/dspark-tiny-q8_0.gguf ] && [ -f models/dspark-tiny-drafter-f16.gguf ]; then
    TARGET=models/dspark-tiny-q8_0.gguf; DRAFTER=models/dspark-tiny-drafter-f16.gguf
fi
if [ -z "$TARGET" ] || [ -z "$DRAFTER" ]; then
    echo "bench_spec: no pair given and none shipped under models/: generating a random pair" >&2
    $D make-model -o "$T/target.gguf" --type q8_0 --n-embd 512 --n-layer 6 --n-head 8 --n-head-kv 4 \
        --n-ff 1536 --n-vocab 8192 --n-ctx 2048 --seed 1 >/dev/null
    $D make-drafter -m "$T/target.gguf" -o "$T/drafter.gguf" --block-size 7 --seed 1 >/dev/null
    TARGET=$T/target.gguf; DRAFTER=$T/drafter.gguf
fi

cat > "$T/p1" <<'EOF'
The speculative decoder drafts a block of tokens, and the target model verifies them in one pass.
EOF
cat > "$T/p2" <<'EOF'
def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
EOF
cat > "$T/p3" <<'EOF'
Once upon a time, in a small village by the sea, there lived an old fisherman who
EOF
PROMPTS="p1 p2 p3"

MODES=${MODES:-"plain spec_canon_direct spec_fast_direct spec_canon_replay spec_canon_table"}
mode_args() {
    case $1 in
    plain)             echo "--kernels canonical" ;;
    spec_canon_direct) echo "-md $DRAFTER --kernels canonical --commit direct" ;;
    spec_fast_direct)  echo "-md $DRAFTER --kernels fast --commit direct" ;;
    spec_canon_replay) echo "-md $DRAFTER --kernels canonical --commit replay" ;;
    spec_canon_table)  echo "-md $DRAFTER --kernels canonical --commit direct --draft-sched table" ;;
    esac
}
# value of key=VALUE in a stats line
kv() { printf '%s\n' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo "bench_spec: target=$TARGET drafter=$DRAFTER threads=$THREADS n=$N reps=$REPS warmup=$WARMUP extra='$EXTRA'" >&2
RAN=""
for m in $MODES; do
    ok=1
    for p in $PROMPTS; do
        : > "$T/$m.$p.stats"
        r=0
        while [ $r -lt "$REPS" ] && [ $ok = 1 ]; do
            # shellcheck disable=SC2046
            if ! $D generate -m "$TARGET" -f "$T/$p" -n "$N" -c "$CTX" -t "$THREADS" $(mode_args $m) $WU $EXTRA \
                >"$T/$m.$p.out" 2>"$T/$m.$p.err"; then
                echo "bench_spec: $m skipped: $(tail -n 1 "$T/$m.$p.err")" >&2
                [ "$m" = plain ] && exit 1
                ok=0
            fi
            tail -n 1 "$T/$m.$p.err" >> "$T/$m.$p.stats"
            r=$((r + 1))
        done
    done
    [ $ok = 1 ] && RAN="$RAN $m"
done
MODES=$RAN

# per (mode, prompt): medians; then the mean over prompts
json="$R/spec.json"
{
    printf '{\n  "bench": "spec",\n  "target": "%s",\n  "drafter": "%s",\n  "threads": %s,\n  "n_predict": %s,\n  "reps": %s,\n  "warmup": %s,\n  "extra": "%s",\n  "modes": {\n' \
        "$TARGET" "$DRAFTER" "$THREADS" "$N" "$REPS" "$WARMUP" "$EXTRA"
} > "$json"
printf '\n%-18s %9s %7s %9s %8s %8s %8s %8s %8s %s\n' mode tok_s ratio mean_len rounds draft_ms verify_ms accept_ms commit_ms same_text
first_mode=1
plain_mean=0
for m in $MODES; do
    sum_tok=0; sum_len=0; sum_rounds=0; sum_d=0; sum_v=0; sum_a=0; sum_c=0; same_all=yes; np=0
    prompts_json=""
    for p in $PROMPTS; do
        S="$T/$m.$p.stats"
        if [ "$m" = plain ]; then
            tok=$(while read -r l; do kv "$l" decode_tok_s; done < "$S" | median)
            len=1; rounds=0; dms=0; vms=0; ams=0; cms=0
        else
            tok=$(while read -r l; do kv "$l" tok_s; done < "$S" | median)
            l1=$(head -n 1 "$S")
            len=$(kv "$l1" mean_accepted_len); rounds=$(kv "$l1" rounds)
            dms=$(while read -r l; do r=$(kv "$l" rounds); v=$(kv "$l" draft_s); awk -v v="$v" -v r="$r" 'BEGIN { print (r > 0 ? 1000 * v / r : 0) }'; done < "$S" | median)
            vms=$(while read -r l; do r=$(kv "$l" rounds); v=$(kv "$l" verify_s); awk -v v="$v" -v r="$r" 'BEGIN { print (r > 0 ? 1000 * v / r : 0) }'; done < "$S" | median)
            ams=$(while read -r l; do r=$(kv "$l" rounds); v=$(kv "$l" accept_s); awk -v v="$v" -v r="$r" 'BEGIN { print (r > 0 ? 1000 * v / r : 0) }'; done < "$S" | median)
            cms=$(while read -r l; do r=$(kv "$l" rounds); v=$(kv "$l" commit_s); awk -v v="$v" -v r="$r" 'BEGIN { print (r > 0 ? 1000 * v / r : 0) }'; done < "$S" | median)
        fi
        same=yes
        cmp -s "$T/$m.$p.out" "$T/plain.$p.out" || { same=no; same_all=no; }
        sum_tok=$(awk -v a="$sum_tok" -v b="$tok" 'BEGIN { print a + b }')
        sum_len=$(awk -v a="$sum_len" -v b="$len" 'BEGIN { print a + b }')
        sum_rounds=$((sum_rounds + rounds))
        sum_d=$(awk -v a="$sum_d" -v b="$dms" 'BEGIN { print a + b }')
        sum_v=$(awk -v a="$sum_v" -v b="$vms" 'BEGIN { print a + b }')
        sum_a=$(awk -v a="$sum_a" -v b="$ams" 'BEGIN { print a + b }')
        sum_c=$(awk -v a="$sum_c" -v b="$cms" 'BEGIN { print a + b }')
        np=$((np + 1))
        [ -n "$prompts_json" ] && prompts_json="$prompts_json, "
        prompts_json="$prompts_json\"$p\": { \"tok_s_median\": $tok, \"mean_accepted_len\": $len, \"rounds\": $rounds, \"draft_ms_per_round\": $dms, \"verify_ms_per_round\": $vms, \"accept_ms_per_round\": $ams, \"commit_ms_per_round\": $cms, \"same_text_as_plain\": \"$same\" }"
    done
    mean_tok=$(awk -v a="$sum_tok" -v n="$np" 'BEGIN { printf "%.1f", a / n }')
    [ "$m" = plain ] && plain_mean=$mean_tok
    ratio=$(awk -v a="$mean_tok" -v b="$plain_mean" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }')
    f() { awk -v a="$1" -v n="$np" 'BEGIN { printf "%.3f", a / n }'; }
    printf '%-18s %9s %7s %9s %8s %8s %8s %8s %8s %s\n' "$m" "$mean_tok" "$ratio" "$(f "$sum_len")" "$sum_rounds" \
        "$(f "$sum_d")" "$(f "$sum_v")" "$(f "$sum_a")" "$(f "$sum_c")" "$same_all"
    [ $first_mode = 1 ] || printf ',\n' >> "$json"
    first_mode=0
    printf '    "%s": { "args": "%s", "tok_s_mean_of_medians": %s, "ratio_to_plain": %s, "mean_accepted_len": %s, "draft_ms_per_round": %s, "verify_ms_per_round": %s, "accept_ms_per_round": %s, "commit_ms_per_round": %s, "same_text_as_plain": "%s",\n      "prompts": { %s } }' \
        "$m" "$(mode_args $m)" "$mean_tok" "$ratio" "$(f "$sum_len")" "$(f "$sum_d")" "$(f "$sum_v")" "$(f "$sum_a")" "$(f "$sum_c")" "$same_all" "$prompts_json" >> "$json"
done
printf '\n  }\n}\n' >> "$json"
echo "(tok_s: mean over prompts of the median decode tok/s after prefill; ratio: vs plain; mean_len: accepted+1 per round; ms: per round; same_text: output == plain output for every prompt)"
echo "wrote $json"
