#!/bin/sh
# The oracle-acceptance benchmark (`dspark generate -md D --oracle-accept
# SPEC`, tools/oracle.c): bad specs are one line and exit 2; a recorded
# pattern (a real run's --dump-block) replays exactly that run's acceptance
# (accept_hist, accepted, rounds) with plain's text; a file of counts and
# rate:R drive the acceptance they say (rate:1 accepts every verified draft,
# rate:0 none; counts past the block are clamped); the output is labelled.
# Device-agnostic: DSPARK_DEVICE=cuda runs it on the GPU.
set -u
D=${BUILD:-build}/dspark
DEV=${DSPARK_DEVICE:-cpu}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
. tests/lib_cli.sh   # expect_err
$D make-model -o "$T/m.gguf" --n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --n-ff 128 --n-vocab 300 --n-ctx 256 --type q8_0 --seed 5 \
    || { echo "FAIL make-model"; exit 1; }
$D make-drafter -m "$T/m.gguf" -o "$T/d.gguf" --block-size 4 --no-confidence --seed 3 || { echo "FAIL make-drafter"; exit 1; }
G="$D generate -m $T/m.gguf -p hello -n 40 -t 1 --device $DEV"

# ---- errors: one line, exit 2 ----------------------------------------------
expect_err "--oracle-accept without -md"   "needs a drafter"   $G --oracle-accept rate:0.5
expect_err "--oracle-accept rate > 1"      "in \[0, 1\]"       $G -md "$T/d.gguf" --oracle-accept rate:1.5
expect_err "--oracle-accept rate: text"    "in \[0, 1\]"       $G -md "$T/d.gguf" --oracle-accept rate:high
expect_err "--oracle-accept missing file"  "no such file"      $G -md "$T/d.gguf" --oracle-accept "$T/nope"
printf '2\nx\n' > "$T/bad"
expect_err "--oracle-accept bad line"      "bad:2"             $G -md "$T/d.gguf" --oracle-accept "$T/bad"
printf '# nothing\n\n' > "$T/empty"
expect_err "--oracle-accept no rounds"     "no rounds"         $G -md "$T/d.gguf" --oracle-accept "$T/empty"

# ---- a real run, then its pattern replayed ------------------------------------
# an oracle run that accepts something: a rate run's rounds, recorded
$G -md "$T/d.gguf" --oracle-accept rate:0.6 --dump-block "$T/blk" >"$T/o_rate" 2>"$T/e_rate" \
    || { echo "FAIL oracle rate:0.6 run: $(tail -1 "$T/e_rate")"; fail=1; }
$G >"$T/plain" 2>/dev/null || { echo "FAIL plain run"; fail=1; }
expect_err "--oracle-accept is the dump"   "input"             $G -md "$T/d.gguf" --oracle-accept "$T/blk" --dump-block "$T/blk"
$G -md "$T/d.gguf" --oracle-accept "$T/blk" >"$T/o_rep" 2>"$T/e_rep" \
    || { echo "FAIL oracle replay run: $(tail -1 "$T/e_rep")"; fail=1; }
key() { grep '^mode=spec-oracle' "$2" | tr ' ' '\n' | grep "^$1=" | head -1 | cut -d= -f2; }
for k in accept_hist accepted rounds drafted; do
    a=$(key "$k" "$T/e_rate"); b=$(key "$k" "$T/e_rep")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "PASS replay of a recorded run: $k=$b (the run's own)"
    else echo "FAIL replay: $k recorded '$a', replayed '$b'"; fail=1; fi
done
if [ "$(key accepted "$T/e_rep")" = "$(key planned_accepted "$T/e_rep")" ] && [ "$(key accepted "$T/e_rep")" != 0 ]; then
    echo "PASS replay: accepted=$(key accepted "$T/e_rep") = planned_accepted (the pattern's)"
else echo "FAIL replay: accepted=$(key accepted "$T/e_rep") planned=$(key planned_accepted "$T/e_rep")"; fail=1; fi
for f in o_rate o_rep; do
    if cmp -s "$T/plain" "$T/$f"; then echo "PASS $f: text == plain"; else echo "FAIL $f: text differs from plain"; fail=1; fi
done
for f in e_rate e_rep; do
    if [ "$(key text_equal_plain "$T/$f")" = 1 ] && grep -q '^oracle-acceptance benchmark: the drafter network ran' "$T/$f" &&
       grep -q '^mode=plain oracle_reference=1 ' "$T/$f" && [ -n "$(key speedup_vs_plain "$T/$f")" ]; then
        echo "PASS $f: labelled, plain reference and speed-up reported"
    else echo "FAIL $f: labels or keys missing: $(cat "$T/$f")"; fail=1; fi
done

# ---- counts and rates drive the acceptance ------------------------------------
printf '# per round\n9\n0\n2\n' > "$T/counts"          # 9 > the block of 4: clamped
$G -md "$T/d.gguf" --oracle-accept "$T/counts" >/dev/null 2>"$T/e_c" || { echo "FAIL counts run"; fail=1; }
h=$(key accept_hist "$T/e_c"); r=$(key rounds "$T/e_c")
# rounds cycle 4,0,2 accepted: slot 1 is accepted in 2 of every 3 rounds
if [ -n "$h" ] && [ "$(key pattern_mean_accepted "$T/e_c")" = "2.0000" ]; then echo "PASS counts: pattern mean 2.0000 (9 clamped to 4), accept_hist=$h rounds=$r"
else echo "FAIL counts: $(grep '^mode=spec-oracle' "$T/e_c")"; fail=1; fi
$G -md "$T/d.gguf" --oracle-accept rate:1 >/dev/null 2>"$T/e_1" || { echo "FAIL rate:1 run"; fail=1; }
# every round accepts its whole block: 39 tokens after the first in ceil(39 / 5) rounds
# (a recording backend verifies the full block at the end and keeps the budget)
if [ "$(key rounds "$T/e_1")" = 8 ] && [ "$(key accepted "$T/e_1")" = 31 ]; then
    echo "PASS rate:1: every verified draft accepted ($(key accepted "$T/e_1") in $(key rounds "$T/e_1") rounds)"
else echo "FAIL rate:1: $(grep '^mode=spec-oracle' "$T/e_1")"; fail=1; fi
$G -md "$T/d.gguf" --oracle-accept rate:0 >/dev/null 2>"$T/e_0" || { echo "FAIL rate:0 run"; fail=1; }
if [ "$(key accepted "$T/e_0")" = 0 ]; then echo "PASS rate:0: nothing accepted ($(key rounds "$T/e_0") rounds)"
else echo "FAIL rate:0: $(grep '^mode=spec-oracle' "$T/e_0")"; fail=1; fi
exit $fail
