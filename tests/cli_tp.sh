#!/bin/sh
# cli_tp.sh — `dspark generate --tp N` (issue 25, docs/TP.md) end to end on
# CPU ranks:
#   - the shipped pair at --tp 2: plain and speculative, greedy and seeded
#     (T=0.8), byte for byte the recorded golden outputs of one device
#     (tests/data/golden.sha256), and the verbose line says tp=2;
#   - a random qwen3 model with 4 KV heads: --dump-logits at --tp 1, 2, 4
#     identical (memcmp), and --fast tp_reduce (the row-parallel all-reduce
#     layout) NOT identical at --tp 2 and 4 — the counter-test that shows the
#     comparison sees a layout that moves bits; the shipped F16 target too;
#   - dspark diverge --tp N (Pass B on N ranks): NONE while canonical, and
#     the fast layout's first divergence at layer 0's o_proj;
#   - the dev communicator (DSPARK_TP_COMM=dev: the collectives as the
#     backend's copies and add op, what --device cuda --tp N runs) on the
#     CPU: the golden hashes and logits at --tp 2, -v says comm=dev, the 4-KV
#     -head logits at --tp 2, 4 == --tp 1 and their --fast tp_reduce logits
#     == the cpu fake's bit for bit (the same rank-ordered sum), diverge NONE
#     and the fast layout found at o_proj;
#   - refusals, one line each and exit 2: N that does not divide the KV
#     heads, N out of range, a MoE model, fast tp_reduce where K does not
#     split into whole blocks, an unknown DSPARK_TP_COMM.
set -u
BUILD=${BUILD:-build}
D="$BUILD/dspark"
. tests/lib_cli.sh
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
Q8=models/dspark-tiny-q8_0.gguf; F16=models/dspark-tiny-f16.gguf; DR=models/dspark-tiny-drafter-f16.gguf
P="It is a truth universally acknowledged, that"
G=tests/data/golden.sha256

# --- the shipped pair at --tp 2 against the recorded one-device outputs ------
check() {   # KEY CMD...: sha256 of CMD's stdout == the golden line KEY
    key=$1; shift
    "$@" >"$T/o" 2>"$T/e" || { bad "$key: exit $? ($(tail -n 1 "$T/e"))"; return; }
    h=$(sha256sum <"$T/o" | cut -c1-64)
    grep -q "^$h $key\$" "$G" && ok "--tp 2 $key == golden ($(echo "$h" | cut -c1-12))" || bad "--tp 2 $key differs from golden"
}
check plain_greedy_q8_p1 "$D" generate -m "$Q8" -p "$P" -n 48 -t 2 --tp 2
check spec_greedy_q8_p1  "$D" generate -m "$Q8" -md "$DR" -p "$P" -n 48 -t 2 --tp 2
check plain_t08_f16_p1   "$D" generate -m "$F16" -p "$P" -n 48 -t 2 --temp 0.8 --seed 7 --tp 2
check spec_t08_f16_p1    "$D" generate -m "$F16" -md "$DR" -p "$P" -n 48 -t 1 --temp 0.8 --seed 7 --tp 2
"$D" generate -m "$Q8" -p "$P" -n 4 -t 2 --tp 2 --dump-logits "$T/lq" >/dev/null 2>&1 && \
    grep -q "^$(sha256sum <"$T/lq" | cut -c1-64) logits_q8_p1\$" "$G" && ok "--tp 2 logits_q8_p1 (raw f32 logits) == golden" \
    || bad "--tp 2 logits_q8_p1 differs from golden"
"$D" generate -m "$Q8" -p "$P" -n 2 -t 1 --tp 2 -v 2>&1 >/dev/null | grep -q '^tp=2 ' && ok "-v reports tp=2" || bad "-v tp line"

# every kernel fast at --tp 2 (tp_reduce included): the logits move (with the fast Q8_0
# matmul's unquantized activations the partial sums' last bits are no longer absorbed), and speculative --commit replay still equals plain with the
# same kernels
"$D" generate -m "$Q8" -p "$P" -n 48 -t 2 --tp 2 --kernels fast >"$T/pf" 2>/dev/null || bad "plain fast --tp 2"
"$D" generate -m "$Q8" -md "$DR" -p "$P" -n 48 -t 2 --tp 2 --kernels fast --commit replay >"$T/sf2" 2>/dev/null || bad "spec replay fast --tp 2"
# (the logits, not the text: on an AVX2 host the fast kernels' greedy text for this prompt
# happens to be the canonical one, while their raw logits always move)
"$D" generate -m "$Q8" -p "$P" -n 4 -t 2 --tp 2 --kernels fast --dump-logits "$T/lqf" >/dev/null 2>&1 || bad "dump-logits fast --tp 2"
[ -s "$T/lqf" ] && ! grep -q "^$(sha256sum <"$T/lqf" | cut -c1-64) logits_q8_p1\$" "$G" \
    && ok "--kernels fast --tp 2: the raw logits differ from the one-device canonical ones" \
    || bad "--kernels fast --tp 2 gave the canonical logits"
cmp -s "$T/pf" "$T/sf2" && [ -s "$T/pf" ] && ok "--tp 2 --kernels fast: speculative --commit replay == plain" || bad "spec replay fast --tp 2 != plain"

# perplexity: the same mean NLL to the last printed digit (the logits are the same bits)
xz -dc data/val.txt.xz 2>/dev/null | head -c 40000 >"$T/val.txt"
for n in 1 2; do "$D" perplexity -m "$Q8" -f "$T/val.txt" -c 128 --chunks 3 -t 2 --tp $n 2>/dev/null | cut -d' ' -f1-5 >"$T/ppl$n"; done
[ -s "$T/ppl1" ] && cmp -s "$T/ppl1" "$T/ppl2" && ok "perplexity --tp 2 == --tp 1 ($(cat "$T/ppl2"))" || bad "perplexity --tp 2: $(cat "$T/ppl2") vs $(cat "$T/ppl1")"

# --- 4 KV heads: --tp 1, 2, 4 -----------------------------------------------
"$D" make-model -o "$T/m4.gguf" --type f16 --n-embd 256 --n-layer 3 --n-head 8 --n-head-kv 4 --head-dim 32 --n-ff 512 \
    --n-vocab 400 --seed 5 >/dev/null 2>&1 || { echo "FAIL make-model"; exit 1; }
PR="The river was quiet in the morning, and the boats waited by the old stone bridge."
for n in 1 2 4; do
    "$D" generate -m "$T/m4.gguf" -p "$PR" -n 6 -t 2 --tp $n --dump-logits "$T/l$n" >/dev/null 2>&1 || bad "dump-logits --tp $n"
done
cmp -s "$T/l1" "$T/l2" && cmp -s "$T/l1" "$T/l4" && [ -s "$T/l1" ] && ok "4 KV heads: logits at --tp 1, 2, 4 identical ($(wc -c <"$T/l1") bytes)" \
    || bad "4 KV heads: logits differ across --tp"
for n in 2 4; do
    "$D" generate -m "$T/m4.gguf" -p "$PR" -n 6 -t 2 --tp $n --fast tp_reduce --dump-logits "$T/f$n" >/dev/null 2>&1 || bad "fast --tp $n"
    cmp -s "$T/l1" "$T/f$n" && bad "--fast tp_reduce at --tp $n gave the canonical logits (counter-test blind)" \
        || ok "--fast tp_reduce at --tp $n: logits differ from --tp 1 (row-parallel partial sums)"
done
"$D" generate -m "$F16" -p "$P" -n 4 -t 2 --tp 2 --fast tp_reduce --dump-logits "$T/sf" >/dev/null 2>&1 || bad "shipped fast"
"$D" generate -m "$F16" -p "$P" -n 4 -t 2 --dump-logits "$T/s1" >/dev/null 2>&1 || bad "shipped tp 1"
cmp -s "$T/s1" "$T/sf" && bad "shipped F16: fast tp_reduce at --tp 2 did not move a bit" || ok "shipped F16: --fast tp_reduce at --tp 2 moves logits"

# every other family fast, tp_reduce canonical: today's CPU fast kernels compute an output
# from its own weight row too, so --tp does not move their bits either (reported, not
# required: the contract promises it for canonical kernels only)
"$D" generate -m "$T/m4.gguf" -p "$PR" -n 4 -t 2 --kernels fast --dump-logits "$T/kf1" >/dev/null 2>&1
"$D" generate -m "$T/m4.gguf" -p "$PR" -n 4 -t 2 --tp 4 --kernels fast --canonical tp_reduce --dump-logits "$T/kf4" >/dev/null 2>&1
cmp -s "$T/kf1" "$T/kf4" && echo "NOTE --kernels fast --canonical tp_reduce: --tp 4 logits == --tp 1 (4 KV heads, F16)" \
    || echo "NOTE --kernels fast --canonical tp_reduce: --tp 4 logits differ from --tp 1 (a fast kernel depends on its weight's rows)"

# --- diverge across TP degrees: Pass A at --tp 1, Pass B the same block on N ranks
"$D" diverge -m "$F16" -p "$PR" --block-greedy 8 -t 2 --tp 2 >"$T/d2" 2>&1 || bad "diverge --tp 2 exit"
grep -q '^FIRST_DIVERGENCE NONE compared_objects=' "$T/d2" && grep -q 'missing_in_a=0 missing_in_b=0' "$T/d2" \
    && grep -q '^CHAIN .*first_break=NONE' "$T/d2" && ok "diverge --tp 2 (shipped F16): NONE, every checkpoint object on both sides" \
    || { bad "diverge --tp 2 canonical"; cat "$T/d2"; }
"$D" diverge -m "$T/m4.gguf" -p "$PR" --block-greedy 8 -t 2 --tp 4 >"$T/d4" 2>&1 && grep -q '^FIRST_DIVERGENCE NONE' "$T/d4" \
    && ok "diverge --tp 4 (4 KV heads): NONE" || { bad "diverge --tp 4 canonical"; cat "$T/d4"; }
"$D" diverge -m "$F16" -p "$PR" --block-greedy 8 -t 2 --tp 2 --fast tp_reduce >"$T/df" 2>&1 || bad "diverge --fast tp_reduce exit"
grep -q '^FIRST_DIVERGENCE row=0 layer=0 checkpoint=cp5_attn_out_proj ' "$T/df" \
    && ok "diverge --tp 2 --fast tp_reduce: $(grep '^FIRST_DIVERGENCE' "$T/df" | cut -d' ' -f1-5)" || { bad "fast tp_reduce not found at o_proj"; cat "$T/df"; }
expect_err "diverge --tp 3" "KV heads" "$D" diverge -m "$Q8" -p "$PR" --block-greedy 4 --tp 3
expect_err "families --tp" "diverge flag" "$D" families -m "$Q8" -p "$PR" --block-greedy 4 --tp 2

# --- the dev communicator on the CPU (the GPU's code path) ---------------------
check plain_greedy_q8_p1 env DSPARK_TP_COMM=dev "$D" generate -m "$Q8" -p "$P" -n 48 -t 2 --tp 2
check spec_t08_f16_p1    env DSPARK_TP_COMM=dev "$D" generate -m "$F16" -md "$DR" -p "$P" -n 48 -t 1 --temp 0.8 --seed 7 --tp 2
DSPARK_TP_COMM=dev "$D" generate -m "$Q8" -p "$P" -n 4 -t 2 --tp 2 --dump-logits "$T/lqd" >/dev/null 2>&1 && \
    grep -q "^$(sha256sum <"$T/lqd" | cut -c1-64) logits_q8_p1\$" "$G" && ok "comm=dev --tp 2 logits_q8_p1 == golden" \
    || bad "comm=dev --tp 2 logits_q8_p1 differs from golden"
v=$(DSPARK_TP_COMM=dev "$D" generate -m "$Q8" -p "$P" -n 2 -t 1 --tp 2 -v 2>&1 >/dev/null | grep '^tp=')
[ "$v" = "tp=2 ranks=cpu:0x2 comm=dev" ] && ok "-v: $v" || bad "-v with comm=dev: '$v'"
v=$("$D" generate -m "$Q8" -p "$P" -n 2 -t 1 --tp 2 -v 2>&1 >/dev/null | grep '^tp=')
[ "$v" = "tp=2 ranks=cpu:0x2 comm=cpu" ] && ok "-v (default on the CPU): $v" || bad "-v default: '$v'"
for n in 2 4; do
    DSPARK_TP_COMM=dev "$D" generate -m "$T/m4.gguf" -p "$PR" -n 6 -t 2 --tp $n --dump-logits "$T/ld$n" >/dev/null 2>&1 || bad "dev dump-logits --tp $n"
    DSPARK_TP_COMM=dev "$D" generate -m "$T/m4.gguf" -p "$PR" -n 6 -t 2 --tp $n --fast tp_reduce --dump-logits "$T/fd$n" >/dev/null 2>&1 \
        || bad "dev fast --tp $n"
    cmp -s "$T/l1" "$T/ld$n" && [ -s "$T/l1" ] && ok "comm=dev 4 KV heads: --tp $n logits == --tp 1" || bad "comm=dev --tp $n logits differ from --tp 1"
    cmp -s "$T/f$n" "$T/fd$n" && [ -s "$T/f$n" ] && ! cmp -s "$T/l1" "$T/fd$n" \
        && ok "comm=dev --fast tp_reduce --tp $n: logits == the cpu fake's (the rank-ordered sum), != canonical" \
        || bad "comm=dev --fast tp_reduce --tp $n: not the cpu fake's logits (or canonical)"
done
DSPARK_TP_COMM=dev "$D" diverge -m "$F16" -p "$PR" --block-greedy 8 -t 2 --tp 2 >"$T/dd2" 2>&1 && grep -q '^FIRST_DIVERGENCE NONE compared_objects=' "$T/dd2" \
    && ok "comm=dev diverge --tp 2: NONE" || { bad "comm=dev diverge --tp 2"; cat "$T/dd2"; }
DSPARK_TP_COMM=dev "$D" diverge -m "$F16" -p "$PR" --block-greedy 8 -t 2 --tp 2 --fast tp_reduce >"$T/ddf" 2>&1
grep -q '^FIRST_DIVERGENCE row=0 layer=0 checkpoint=cp5_attn_out_proj ' "$T/ddf" && ok "comm=dev diverge --tp 2 --fast tp_reduce: found at o_proj" \
    || { bad "comm=dev fast tp_reduce not found at o_proj"; cat "$T/ddf"; }
expect_err "DSPARK_TP_COMM=bogus" "neither cpu nor dev" env DSPARK_TP_COMM=bogus "$D" generate -m "$Q8" -p "$P" -n 4 --tp 2

# --- refusals ------------------------------------------------------------------
expect_err "--tp 3 on 2 KV heads" "KV heads" "$D" generate -m "$Q8" -p "$P" -n 4 --tp 3
expect_err "--tp 4 on 2 KV heads" "KV heads" "$D" generate -m "$Q8" -p "$P" -n 4 --tp 4
expect_err "--tp 0" "out of range" "$D" generate -m "$Q8" -p "$P" -n 4 --tp 0
expect_err "--tp 9" "out of range" "$D" generate -m "$Q8" -p "$P" -n 4 --tp 9
expect_err "--tp x" "integer" "$D" generate -m "$Q8" -p "$P" -n 4 --tp x
expect_err "serve --tp" "no tensor-parallel plan" "$D" serve -m "$Q8" --tp 2
"$D" make-model -o "$T/moe.gguf" --arch qwen3moe --type q8_0 --n-embd 128 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 256 \
    --n-expert 8 --n-expert-used 2 --n-ff-exp 64 --n-vocab 400 --seed 3 >/dev/null 2>&1 || bad "make-model moe"
expect_err "--tp 2 on a MoE model" "tensor-parallel" "$D" generate -m "$T/moe.gguf" -p "$P" -n 4 --tp 2
"$D" make-model -o "$T/k.gguf" --type q4_k --n-embd 256 --n-layer 2 --n-head 8 --n-head-kv 4 --head-dim 32 --n-ff 512 \
    --n-vocab 400 --seed 5 >/dev/null 2>&1 || bad "make-model q4_k"
expect_err "--fast tp_reduce without whole Q4_K blocks in K/N" "whole blocks" \
    "$D" generate -m "$T/k.gguf" -p "$PR" -n 4 --tp 2 --fast tp_reduce
"$D" generate -m "$T/k.gguf" -p "$PR" -n 4 -t 2 --tp 2 --dump-logits "$T/k2" >/dev/null 2>&1 && \
    "$D" generate -m "$T/k.gguf" -p "$PR" -n 4 -t 2 --dump-logits "$T/k1" >/dev/null 2>&1 && cmp -s "$T/k1" "$T/k2" \
    && ok "Q4_K: canonical --tp 2 logits identical to --tp 1" || bad "Q4_K canonical --tp 2"
exit $fail
