#!/bin/sh
# Issue 14 from the command line, one check per class of failure:
#   outputs that are inputs are refused (and the input is intact), lost
#   writes fail (/dev/full, stdout), JSON is JSON (cJSON; '-' is stdout; the
#   diverge JSON carries the gate and the chain), tokens and blocks are not
#   truncated, a drafter of block size 256 runs in diverge, a drafter for
#   another vocabulary is refused, DSPARK_SIMD and --device are checked, the
#   stats line starts a line of its own, llama.cpp spellings are handled,
#   and every command agrees on the model-flag defaults.
set -u
D=${BUILD:-build}/dspark
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
. tests/lib_cli.sh   # expect_err
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
sum() { cksum <"$1"; }

$D make-model -o "$T/m.gguf" --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128 --n-vocab 300 --n-ctx 512 --seed 5 2>"$T/mm.err" \
    || { echo "FAIL make-model"; exit 1; }
grep -q "wrote $T/m.gguf" "$T/mm.err" && ok "make-model says what it wrote" || bad "make-model is silent: $(cat "$T/mm.err")"
$D make-model -o "$T/m320.gguf" --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128 --n-vocab 320 --n-ctx 512 --seed 5 2>/dev/null \
    || { echo "FAIL make-model 320"; exit 1; }
$D make-drafter -m "$T/m.gguf" -o "$T/d.gguf" --block-size 4 --seed 2 2>"$T/md.err" || { echo "FAIL make-drafter"; exit 1; }
grep -q "wrote $T/d.gguf" "$T/md.err" && ok "make-drafter says what it wrote" || bad "make-drafter is silent"
$D make-drafter -m "$T/m.gguf" -o "$T/dsp.gguf" --layout dspark --block-size 4 --seed 2 2>/dev/null || { echo "FAIL make-drafter dspark"; exit 1; }
M=$T/m.gguf; DR=$T/d.gguf
ln -s "$M" "$T/m-link.gguf"
m0=$(sum "$M"); d0=$(sum "$DR")

# ---- 1. an output that is an input is refused; the input survives --------
expect_err "dump-block = target"        "refusing"  $D generate -m "$M" -md "$DR" -p hi -n 4 --dump-block "$M"
expect_err "dump-block = drafter"       "refusing"  $D generate -m "$M" -md "$DR" -p hi -n 4 --dump-block "$DR"
expect_err "dump-block = target (link)" "same file" $D generate -m "$M" -md "$DR" -p hi -n 4 --dump-block "$T/m-link.gguf"
expect_err "diverge --json = target"    "refusing"  $D diverge -m "$M" -p hi --block-greedy 2 --json "$M"
expect_err "diverge --svg = drafter"    "refusing"  $D diverge -m "$M" -md "$DR" -p hi --svg "$DR"
expect_err "bench --json = target"      "refusing"  $D bench -m "$M" --json "$T/m-link.gguf"
expect_err "quantize X X"               "refusing"  $D quantize "$M" "$M" f16
expect_err "quantize X link-to-X"       "same file" $D quantize "$M" "$T/m-link.gguf" q8_0
expect_err "make-drafter -o = target"   "refusing"  $D make-drafter -m "$M" -o "$M"
[ "$(sum "$M")" = "$m0" ] && [ "$(sum "$DR")" = "$d0" ] && ok "inputs unchanged" || bad "an input was modified"

# a user's OUT.tmp is never consumed; nothing is left next to the output
echo "mine" >"$T/d.json.tmp"
$D diverge -m "$M" -p hi --block-greedy 2 --json "$T/d.json" >/dev/null 2>&1 || bad "diverge --json"
[ "$(cat "$T/d.json.tmp")" = "mine" ] && ok "pre-existing OUT.tmp untouched" || bad "OUT.tmp was consumed"
[ -z "$(ls "$T" | grep 'tmp\.')" ] && ok "no temp files left" || bad "temp files left: $(ls "$T")"

# ---- 2. lost writes fail ---------------------------------------------------
if [ -w /dev/full ]; then
    for c in "generate -m $M -p hi -n 4" "diverge -m $M -p hi --block-greedy 2" "inspect $M"; do
        $D $c >/dev/full 2>"$T/e"; rc=$?
        [ $rc -ne 0 ] && grep -qi "standard output" "$T/e" && ok "$c > /dev/full fails (rc=$rc)" || bad "$c > /dev/full: rc=$rc"
    done
    expect_err "--json /dev/full"       "No space" $D diverge -m "$M" -p hi --block-greedy 2 --json /dev/full
    expect_err "--svg /dev/full"        "No space" $D diverge -m "$M" -p hi --block-greedy 2 --svg /dev/full
    expect_err "--dump-block /dev/full" "No space" $D generate -m "$M" -md "$DR" -p hi -n 8 --dump-block /dev/full
    expect_err "bench --json /dev/full" "No space" $D bench -m "$M" --reps 1 --prefix 4 --decode 2 --prefill-len 4 --json /dev/full
fi

# ---- 3. JSON through cJSON; '-' is stdout ----------------------------------
q="$T/we\"ird'path.json"
$D bench -m "$M" --reps 1 --prefix 4 --decode 2 --prefill-len 4 --json "$q" -m "$T/m-link.gguf" >/dev/null 2>&1
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["verify"])==5' "$q" 2>/dev/null \
    && ok "bench --json is valid JSON" || bad "bench --json is not valid JSON"
$D diverge -m "$M" -p hi --block-greedy 3 --json - >"$T/dj" 2>/dev/null
[ ! -e ./- ] && ok "diverge --json - writes no file named -" || { bad "a file named - was created"; rm -f ./-; }
tail -n 1 "$T/dj" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["gate"]["result"]=="PASS"; assert d["chain"]["first_break"]=="NONE"; assert d["report"]["diverged_objects"]==0; assert d["block"]["rows"]==3' \
    && ok "diverge JSON has gate, chain, report" || bad "diverge JSON lacks gate/chain/report"

# ---- 4. stats on their own line after the text -----------------------------
$D generate -m "$M" -md "$DR" -p hi -n 12 >"$T/mix" 2>&1
[ "$(grep -c '^mode=spec ' "$T/mix")" = 1 ] && ok "spec stats line starts a line" || bad "stats glued: $(cat "$T/mix")"
$D generate -m "$M" -p hi -n 12 2>&1 | grep -q '^mode=plain ' && ok "plain stats line starts a line" || bad "plain stats glued"

# ---- 5. validation ----------------------------------------------------------
$D make-drafter -m "$M" -o "$T/d256.gguf" --block-size 256 --seed 4 2>/dev/null || bad "make-drafter --block-size 256"
$D diverge -m "$M" -md "$T/d256.gguf" -p hi >"$T/out256" 2>&1 && grep -q "BLOCK rows=257" "$T/out256" \
    && ok "diverge with a block-size-256 drafter" || bad "diverge -md block 256: $(tail -n 2 "$T/out256")"
expect_err "drafter for another vocabulary" "drafter"  $D generate -m "$T/m320.gguf" -md "$DR" -p hi -n 4
expect_err "dspark drafter, other vocab"    "vocab"    $D generate -m "$T/m320.gguf" -md "$T/dsp.gguf" -p hi -n 4
expect_err "control bytes in an error"      "error"    $D generate -m "$(printf 'no\nsuch\033[31m')" -p hi
expect_err "DSPARK_SIMD=AVX2"               "DSPARK_SIMD" env DSPARK_SIMD=AVX2 $D generate -m "$M" -p hi
# an AArch64 level on an x86-64 build (and the x86 ones on AArch64)
case $(uname -m) in
    x86_64) expect_err "DSPARK_SIMD=i8mm on x86-64" "avx512" env DSPARK_SIMD=i8mm $D generate -m "$M" -p hi
            expect_err "DSPARK_SIMD=dotprod on x86-64" "avx512" env DSPARK_SIMD=dotprod $D generate -m "$M" -p hi ;;
    aarch64) expect_err "DSPARK_SIMD=avx2 on AArch64" "i8mm" env DSPARK_SIMD=avx2 $D generate -m "$M" -p hi ;;
esac
expect_err "unknown device"   "unknown device 'gpu' (this build has: cpu" $D generate -m "$M" -p hi --device gpu
expect_err "unknown device (diverge)" "unknown device" $D diverge -m "$M" -p hi --block-greedy 2 -dev tpu
$D generate -m "$M" -p hi -n 4 --device cpu >"$T/dev1" 2>/dev/null && $D generate -m "$M" -p hi -n 4 >"$T/dev0" 2>/dev/null \
    && cmp -s "$T/dev0" "$T/dev1" && ok "--device cpu is the default" || bad "--device cpu"

# ---- 6. llama.cpp spellings -------------------------------------------------
$D generate --help >"$T/help"
for w in " -s, --seed" "default 0" "--min-p" "--repeat-penalty" "--draft-min" "--ctx-size" "--threads" "--model-draft" "--device"; do
    grep -q -- "$w" "$T/help" || bad "generate --help lacks '$w'"
done
$D generate -m "$M" -p hi -n 8 --temp 0.9 -s 7 >"$T/s1" 2>/dev/null
$D generate -m "$M" -p hi -n 8 --temp 0.9 --seed 7 >"$T/s2" 2>/dev/null
cmp -s "$T/s1" "$T/s2" && ok "-s is --seed" || bad "-s differs from --seed"
$D generate -m "$M" -p hi -n 4 --min-p 0 --repeat-penalty 1 >/dev/null 2>&1 && ok "--min-p 0 / --repeat-penalty 1 accepted" || bad "off values refused"
$D generate -m "$M" -p hi -n 16 --temp 1.5 -s 3 --min-p 0.2 >"$T/mp1" 2>/dev/null
$D generate -m "$M" -md "$DR" -p hi -n 16 --temp 1.5 -s 3 --min-p 0.2 >"$T/mp2" 2>/dev/null
[ -s "$T/mp1" ] && cmp -s "$T/mp1" "$T/mp2" && ok "--min-p: speculative == plain" || bad "--min-p spec differs from plain"
expect_err "--min-p 1.5"           "out of range"   $D generate -m "$M" -p hi --min-p 1.5
expect_err "--repeat-penalty 1.1"  "penalty"        $D generate -m "$M" -p hi --repeat-penalty 1.1
$D generate -m "$M" -md "$DR" -p hi -n 4 --draft-min 2 >/dev/null 2>&1 && ok "--draft-min accepted" || bad "--draft-min refused"
expect_err "--draft-min > gamma"   "draft-max"      $D generate -m "$M" -md "$DR" -p hi --draft-min 9
expect_err "--draft-min with p-min" "draft-max"     $D generate -m "$M" -md "$DR" -p hi --draft-min 2 --draft-p-min 0.3
# the engine's drafting-pass switch (A/B aid): refused at start-up, one line, before any port is bound
for v in abc 0 17; do
    expect_err "DSPARK_DRAFT_PASS=$v" "DSPARK_DRAFT_PASS" timeout 20 env DSPARK_DRAFT_PASS=$v $D serve -m "$M" -md "$DR" --port 1
done
# ... and the engine's recording switch (0, 1 or 2)
for v in abc 3 -1; do
    expect_err "DSPARK_ENGINE_GRAPHS=$v" "DSPARK_ENGINE_GRAPHS" timeout 20 env DSPARK_ENGINE_GRAPHS=$v $D serve -m "$M" -md "$DR" --port 1
done

# ---- 7. perplexity shows progress on a terminal, stays quiet in a pipe --------
for i in 1 2 3 4 5 6 7 8; do echo "The river ran past the mill and the old house by the hill, and the rain fell."; done >"$T/text.txt"
if command -v script >/dev/null 2>&1; then
    script -qec "$D perplexity -m $M -f $T/text.txt -c 16" /dev/null >"$T/tty" 2>&1
    grep -q "eta=" "$T/tty" && ok "perplexity progress line on a TTY" || bad "no progress line on a TTY: $(tail -c 200 "$T/tty")"
fi
$D perplexity -m "$M" -f "$T/text.txt" -c 16 >"$T/pp" 2>"$T/pe"
[ ! -s "$T/pe" ] && grep -q '^ppl=' "$T/pp" && ok "perplexity quiet on a pipe" || bad "perplexity stderr on a pipe: $(head -c 200 "$T/pe")"

# ---- 8. one set of model-flag defaults ---------------------------------------
for c in generate bench perplexity diverge families sweep surface; do
    $D $c --help >"$T/h" 2>&1
    grep -q "default 2048" "$T/h" && grep -q -- "--device" "$T/h" || bad "$c --help does not state -c default 2048 / --device"
done
ok "model-flag help checked on 7 commands"
exit $fail
