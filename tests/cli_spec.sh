#!/bin/sh
# CLI contract of speculative generation (`dspark generate -md`): every user
# error is one line on stderr with exit status 2; `generate -md` prints
# exactly what plain `generate` prints (greedy and seeded sampling, direct
# and replay commit, every --draft-max, p_min and table scheduling); the
# stats line carries the documented keys.
set -u
D=${BUILD:-build}/dspark
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
. tests/lib_cli.sh   # expect_err
$D make-model -o "$T/m.gguf" --n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --n-ff 128 --n-vocab 300 --n-ctx 256 --type q8_0 --seed 5 \
    || { echo "FAIL make-model"; exit 1; }
$D make-drafter -m "$T/m.gguf" -o "$T/d.gguf" --block-size 4 --seed 2 || { echo "FAIL make-drafter"; exit 1; }
$D make-drafter -m "$T/m.gguf" -o "$T/dnc.gguf" --block-size 4 --no-confidence --seed 3 || { echo "FAIL make-drafter --no-confidence"; exit 1; }
G="$D generate -m $T/m.gguf -p hello"

# ---- errors: one line, exit 2 --------------------------------------------
expect_err "--draft-max 0"                "out of range"        $G -md "$T/d.gguf" --draft-max 0
expect_err "--draft-max > gamma"          "n_max inconsistent"  $G -md "$T/d.gguf" --draft-max 5
expect_err "--draft-max non-numeric"      "integer"             $G -md "$T/d.gguf" --draft-max nope
expect_err "--draft-max without -md"      "needs a drafter"     $G --draft-max 2
expect_err "--draft-wait without -md"     "needs a drafter"     $G --draft-wait
expect_err "--warmup with --dump-logits"  "times nothing"       $G --warmup --dump-logits "$T/lg"
expect_err "--parallel 2"                 "only one sequence"   $G -md "$T/d.gguf" --parallel 2
expect_err "--parallel 0"                 "out of range"        $G --parallel 0
expect_err "--dump-block with a prefix"   "prefix"              $G -md "$T/d.gguf" --draft-max 2 --dump-block "$T/blk"
expect_err "--draft-p-min no conf head"   "confidence head"     $G -md "$T/dnc.gguf" --draft-p-min 0.5
expect_err "--draft-sched table no conf"  "confidence head"     $G -md "$T/dnc.gguf" --draft-sched table
expect_err "--draft-p-min out of range"   "out of range"        $G -md "$T/d.gguf" --draft-p-min 1.5
expect_err "--draft-p-min non-numeric"    "number"              $G -md "$T/d.gguf" --draft-p-min high
expect_err "--draft-sched bad"            "draft-sched"         $G -md "$T/d.gguf" --draft-sched greedy
expect_err "--draft-sched pmin no p"      "needs --draft-p-min" $G -md "$T/d.gguf" --draft-sched pmin
expect_err "--draft-sched none + p-min"   "conflicts"           $G -md "$T/d.gguf" --draft-sched none --draft-p-min 0.3
expect_err "--draft-sched auto + p-min"   "conflicts"           $G -md "$T/d.gguf" --draft-sched auto --draft-p-min 0.3
expect_err "--sps-table without table"    "only applies"        $G -md "$T/d.gguf" --sps-table "$T/sps"
expect_err "--sps-table missing file"     "cannot open"         $G -md "$T/d.gguf" --draft-sched table --sps-table "$T/nope"
printf '1 0.01\n2 0.011\n' > "$T/sps_short"
expect_err "--sps-table missing width"    "width 3"             $G -md "$T/d.gguf" --draft-sched table --sps-table "$T/sps_short"
printf '1 0.01\n2 fast\n' > "$T/sps_bad"
expect_err "--sps-table bad value"        "line 2"              $G -md "$T/d.gguf" --draft-sched table --sps-table "$T/sps_bad"
expect_err "--commit bad"                 "direct or replay"    $G -md "$T/d.gguf" --commit lazy
expect_err "--temp negative"              "out of range"        $G --temp -1
expect_err "--temp non-numeric"           "number"              $G --temp warm
expect_err "--top-p 0"                    "out of range"        $G --top-p 0
expect_err "--top-p > 1"                  "out of range"        $G --top-p 1.5
expect_err "--top-k negative"             "out of range"        $G --top-k -3
expect_err "--top-k > vocab"              "vocabulary"          $G --top-k 100000
expect_err "--seed non-numeric"           "integer"             $G --seed abc
expect_err "missing drafter file"         "cannot open\|no such" $G -md "$T/nope.gguf"
head -c 700 "$T/d.gguf" > "$T/dtrunc.gguf"
expect_err "truncated drafter"            "gguf"                $G -md "$T/dtrunc.gguf"
expect_err "drafter as target mismatch"   "drafter\|dflash\|arch\|tensor" $G -md "$T/m.gguf"

# ---- identity: spec output == plain output --------------------------------
P="The river runs"
same() {   # same "description" plain-file spec-args...
    desc=$1; ref=$2; shift 2
    if ! "$@" >"$T/spec_out" 2>"$T/spec_err"; then echo "FAIL $desc: exit $? $(tail -n 1 "$T/spec_err")"; fail=1; return; fi
    if cmp -s "$ref" "$T/spec_out"; then echo "PASS $desc"; else echo "FAIL $desc: output differs from plain"; fail=1; fi
}
$D generate -m "$T/m.gguf" -p "$P" -n 40 >"$T/plain" 2>"$T/plain_err" || { echo "FAIL plain generate"; fail=1; }
grep -q "^mode=plain " "$T/plain_err" && echo "PASS plain stats line kept" || { echo "FAIL plain stats line: $(cat "$T/plain_err")"; fail=1; }
for dm in 1 2 3 4; do
    same "greedy -md direct --draft-max $dm == plain" "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --draft-max $dm
done
grep -q " queued_rounds=[1-9]" "$T/spec_err" && echo "PASS default rounds are queued (verify behind the draft)" || { echo "FAIL no queued rounds: $(tail -n 1 "$T/spec_err")"; fail=1; }
same "greedy -md replay == plain"            "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --commit replay
same "greedy -md p-min 0.5 == plain"         "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --draft-p-min 0.5
same "greedy -md table (measured) == plain"  "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --draft-sched table
printf '# width seconds\n1 0.010\n2 0.0105\n3 0.011\n4 0.0115\n5 0.012\n' > "$T/sps"
same "greedy -md table (file) == plain"      "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --draft-sched table --sps-table "$T/sps"
same "greedy -md no-conf drafter == plain"   "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/dnc.gguf"
same "greedy -md auto (measured) == plain"   "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --draft-sched auto
same "greedy -md auto (file) == plain"       "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --draft-sched auto --sps-table "$T/sps"
same "greedy -md auto no-conf == plain"      "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/dnc.gguf" --draft-sched auto
# a table that prices every verify wider than one row out: AUTO falls back to
# plain steps after its warm-up rounds and says so in one key=value line
printf '1 0.0001\n2 10\n3 10\n4 10\n5 10\n' > "$T/sps_slow"
same "greedy -md auto (wide verify priced out) == plain" "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --draft-sched auto --sps-table "$T/sps_slow"
grep -q "^draft_sched=auto fallback=plain reason=predicted_loss predicted_spec_tok_s=[0-9.]* predicted_plain_tok_s=[0-9.]* first_plain_round=[0-9]* plain_rounds=[1-9][0-9]* rounds=" "$T/spec_err" \
    && echo "PASS auto fallback line: $(grep '^draft_sched=' "$T/spec_err")" || { echo "FAIL no auto fallback line: $(cat "$T/spec_err")"; fail=1; }
same "greedy -md -t 3 == plain"              "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" -t 3
same "greedy -md --draft-wait == plain"      "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --draft-wait
grep -q " queued_rounds=0 " "$T/spec_err" && echo "PASS --draft-wait: no queued rounds" || { echo "FAIL --draft-wait stats: $(tail -n 1 "$T/spec_err")"; fail=1; }
# --warmup: the same generation once before, untimed and unprinted: the same text, one stats line
same "greedy -md --warmup == plain"          "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --warmup
[ "$(grep -c '^mode=spec ' "$T/spec_err")" = 1 ] && echo "PASS --warmup: one stats line" || { echo "FAIL --warmup stats: $(cat "$T/spec_err")"; fail=1; }
same "plain --warmup == plain"               "$T/plain" $D generate -m "$T/m.gguf" -p "$P" -n 40 --warmup
[ "$(grep -c '^mode=plain ' "$T/spec_err")" = 1 ] && echo "PASS plain --warmup: one stats line" || { echo "FAIL plain --warmup stats: $(cat "$T/spec_err")"; fail=1; }
$D generate -m "$T/m.gguf" -p "$P" -n 40 --temp 0.8 --seed 3 >"$T/plain_t" 2>/dev/null
same "seeded -md --warmup --draft-max 2 == plain" "$T/plain_t" $D generate -m "$T/m.gguf" -p "$P" -n 40 --temp 0.8 --seed 3 -md "$T/d.gguf" --draft-max 2 --warmup
$D generate -m "$T/m.gguf" -p "$P" -n 40 --kernels fast >"$T/plain_fast" 2>/dev/null
same "greedy -md fast replay == plain fast"  "$T/plain_fast" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --kernels fast --commit replay
cmp -s "$T/plain" "$T/plain_fast" && echo "INFO plain fast == plain canonical on this tiny model" || echo "INFO plain fast != plain canonical (fast prefill differs)"
for seed in 1 2 3; do
    $D generate -m "$T/m.gguf" -p "$P" -n 40 --temp 0.9 --top-p 0.95 --seed $seed >"$T/plain_s$seed" 2>/dev/null || { echo "FAIL plain sampling"; fail=1; }
    same "sampled seed $seed -md == plain" "$T/plain_s$seed" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --temp 0.9 --top-p 0.95 --seed $seed
    same "sampled seed $seed -md replay p-min == plain" "$T/plain_s$seed" $D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" \
        --temp 0.9 --top-p 0.95 --seed $seed --commit replay --draft-p-min 0.3 --draft-max 3
done
if cmp -s "$T/plain_s1" "$T/plain_s2"; then echo "FAIL seeds 1 and 2 gave identical sampled text"; fail=1; else echo "PASS seeds change sampled text"; fi
# context limit: -c just above the prompt
$D generate -m "$T/m.gguf" -p "$P" -n 40 -c 12 >"$T/plain_c" 2>"$T/plain_c_err"
same "greedy -md -c 12 == plain -c 12" "$T/plain_c" $D generate -m "$T/m.gguf" -p "$P" -n 40 -c 12 -md "$T/d.gguf"
grep -q "stop=context" "$T/spec_err" && echo "PASS spec stops at the context limit" || echo "INFO -c 12 run stopped otherwise: $(tail -n 1 "$T/spec_err")"

# ---- stats line and --dump-block ------------------------------------------
$D generate -m "$T/m.gguf" -p "$P" -n 40 -md "$T/d.gguf" --dump-block "$T/blk" >/dev/null 2>"$T/st" || { echo "FAIL dump run"; fail=1; }
ok=1
for k in mode=spec commit=direct kernels= rounds= drafted= accepted= mean_accepted_len= accept_hist= draft_s= verify_s= commit_s= queued_rounds= ahead_rounds= tok_s=; do
    grep -q -- " *$k" "$T/st" || { ok=0; echo "FAIL stats line lacks $k: $(cat "$T/st")"; }
done
[ $ok = 1 ] && echo "PASS stats line: $(cat "$T/st")" || fail=1
rounds=$(sed -n 's/.* rounds=\([0-9]*\).*/\1/p' "$T/st")
if [ "$(wc -l <"$T/blk")" -eq "$rounds" ] && grep -q "n_draft=4 " "$T/blk"; then echo "PASS --dump-block: one line per round ($rounds), full blocks"
else echo "FAIL --dump-block: $(wc -l <"$T/blk") lines for $rounds rounds"; fail=1; fi
exit $fail
