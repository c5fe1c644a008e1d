#!/bin/sh
# The diagnostics CLI end to end on a generated model: diverge (canonical ->
# NONE, one family fast -> a named first divergence), its JSON and SVG,
# families, and sweep down to C_min.
set -u
D=${BUILD:-build}/dspark
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
$D make-model -o "$T/m.gguf" --type q8_0 --n-embd 128 --n-layer 3 --n-head 4 --n-head-kv 2 --n-ff 256 --n-vocab 400 --seed 3 || exit 1
P="The river was quiet in the morning, and the boats waited by the old stone bridge while she counted the coins twice and wrote the number in the book."

$D diverge -m "$T/m.gguf" -p "$P" --block-greedy 8 --json "$T/r.json" --svg "$T/r.svg" >"$T/canon" 2>&1 || bad "diverge canonical exit"
grep -q '^GATE_RESULT PASS' "$T/canon" && ok "gate passes" || bad "gate"
grep -q '^FIRST_DIVERGENCE NONE compared_objects=' "$T/canon" && ok "canonical: FIRST_DIVERGENCE NONE" || { bad "canonical diverged"; cat "$T/canon"; }
grep -q '^CHAIN .*first_break=NONE' "$T/canon" && ok "chain intact" || bad "chain"
python3 -m json.tool "$T/r.json" >/dev/null 2>&1 && ok "json parses" || bad "json"
python3 -c "import xml.etree.ElementTree as E,sys; E.parse(sys.argv[1])" "$T/r.svg" 2>/dev/null && ok "svg parses" || bad "svg"

$D diverge -m "$T/m.gguf" -p "$P" --block-greedy 8 --fast matmul_q8_0 --table diverged >"$T/fast" 2>&1 || bad "diverge fast exit"
grep -q '^FIRST_DIVERGENCE row=[0-9]* layer=[0-9-]* checkpoint=' "$T/fast" && ok "fast matmul: $(grep '^FIRST_DIVERGENCE' "$T/fast")" || { bad "fast matmul not detected"; cat "$T/fast"; }
grep -q '^METRICS ' "$T/fast" && ok "metrics line" || bad "metrics"

$D diverge -m "$T/m.gguf" -p "$P" --tokens 1,2,3,4 >"$T/tok" 2>&1 && grep -q 'BLOCK rows=4 ids=1,2,3,4' "$T/tok" && ok "--tokens block" || bad "--tokens"
$D diverge -m "$T/m.gguf" -p "$P" --tokens 1,x >"$T/e1" 2>&1; [ $? -eq 2 ] && ok "bad --tokens rejected: $(cat "$T/e1")" || bad "bad --tokens"
$D diverge -m "$T/m.gguf" -p "$P" >"$T/e2" 2>&1; [ $? -eq 2 ] && ok "missing block source rejected" || bad "no block source"

$D families -m "$T/m.gguf" -p "$P" --block-greedy 6 >"$T/fam" 2>&1 || bad "families exit"
[ "$(grep -c '^FAMILY ' "$T/fam")" -eq 24 ] && ok "families: 24 FAMILY lines (tp_reduce among them)" || { bad "families lines"; cat "$T/fam"; }
for f in matmul_f16 matmul_q4_0 matmul_q6_k moe_route gdn attn_sinks hc_pre hc_post; do      # not run by a dense Q8_0 model (its norms are F32 vectors)
    grep -q "^FAMILY name=$f verdict=UNUSED" "$T/fam" || bad "$f not UNUSED"
done && ok "families the model does not run: verdict=UNUSED (no A/B, no experiment)"
grep -q '^FAMILY name=matmul_q8_0 verdict=PROVEN_DIFFERENT' "$T/fam" && ok "matmul_q8_0 PROVEN_DIFFERENT" || bad "matmul_q8_0 verdict"
$D families -m "$T/m.gguf" -p "$P" --block-greedy 6 --all-families >"$T/fama" 2>&1 || bad "families --all-families exit"
for f in q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k; do       # the kquant families, on synthetic weights
    grep -q "^FAMILY name=matmul_$f verdict=PROVEN_DIFFERENT" "$T/fama" || bad "matmul_$f verdict"
done && ok "--all-families: kquant families PROVEN_DIFFERENT (synthetic weights)"
grep -q '^FAMILY name=moe_route verdict=PROVEN_DIFFERENT' "$T/fama" && ok "--all-families: moe_route PROVEN_DIFFERENT (a synthetic 64-expert router)" || bad "moe_route synthetic"
grep -q '^FAMILY name=gdn verdict=PROVEN_DIFFERENT' "$T/fama" && ok "--all-families: gdn PROVEN_DIFFERENT (a synthetic gated delta net)" || bad "gdn synthetic"
for f in ds4_compress ds4_indexer; do
    grep -q "^FAMILY name=$f verdict=PROVEN_DIFFERENT" "$T/fama" && ok "--all-families: $f PROVEN_DIFFERENT (synthetic blocks)" || bad "$f synthetic"
done
# tp_reduce: no rank layout runs without --tp (UNUSED); its isolated A/B
# (two ranks' K halves summed vs complete dot products) proves the fast one
grep -q '^FAMILY name=tp_reduce verdict=UNUSED' "$T/fam" && ok "tp_reduce UNUSED without --tp" || bad "tp_reduce not UNUSED"
grep -q '^FAMILY name=tp_reduce verdict=PROVEN_DIFFERENT' "$T/fama" && ok "--all-families: tp_reduce PROVEN_DIFFERENT (row-parallel partial sums)" || bad "tp_reduce synthetic"

# the mixture of experts: the route's fast variant alone is found at the route
$D make-model -o "$T/moe.gguf" --arch qwen3moe --type q8_0 --n-embd 128 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 256 \
    --n-expert 8 --n-expert-used 2 --n-ff-exp 64 --n-vocab 400 --seed 3 || exit 1
$D diverge -m "$T/moe.gguf" -p "$P" --block-greedy 8 >"$T/mc" 2>&1 && grep -q '^FIRST_DIVERGENCE NONE' "$T/mc" \
    && ok "qwen3moe canonical: FIRST_DIVERGENCE NONE" || { bad "qwen3moe canonical"; cat "$T/mc"; }
$D diverge -m "$T/moe.gguf" -p "$P" --block-greedy 8 --fast moe_route >"$T/mf" 2>&1 || bad "diverge --fast moe_route exit"
grep -q '^FIRST_DIVERGENCE row=[0-9]* layer=0 checkpoint=cp8_ffn_gate_up subobject=moe_route' "$T/mf" \
    && ok "--fast moe_route: $(grep '^FIRST_DIVERGENCE' "$T/mf")" || { bad "--fast moe_route not found at the route"; cat "$T/mf"; }
$D families -m "$T/moe.gguf" -p "$P" --block-greedy 6 >"$T/mfam" 2>&1 || bad "families qwen3moe exit"
grep -q '^FAMILY name=moe_route verdict=PROVEN_DIFFERENT .*model_first_divergence=row:[0-9]*,layer:0,cp8_ffn_gate_up,moe_route' "$T/mfam" \
    && ok "qwen3moe families: moe_route PROVEN_DIFFERENT, first divergence at its route" || { bad "qwen3moe families moe_route"; cat "$T/mfam"; }
grep -q '^FAMILY name=matmul_q4_0 verdict=UNUSED' "$T/mfam" && ok "qwen3moe families: unused matmul types UNUSED" || bad "qwen3moe UNUSED"
$D sweep -m "$T/moe.gguf" -p "$P" --block-greedy 6 --reps 3 >"$T/msw" 2>&1 || bad "sweep qwen3moe exit"
grep -q 'first_divergence=.*cp8_ffn_gate_up,moe_route' "$T/msw" && grep -q '^C_MIN .*moe_route' "$T/msw" \
    && ok "qwen3moe sweep: the route found and kept ($(grep '^C_MIN' "$T/msw"))" || { bad "qwen3moe sweep"; cat "$T/msw"; }

$D sweep -m "$T/m.gguf" -p "$P" --block-greedy 6 --reps 3 >"$T/sweep" 2>&1 || { bad "sweep exit"; cat "$T/sweep"; }
grep -q '^SWEEP step=0 sources_tested=0 sources_fully_canonicalized=0 partial_causal_families=none first_divergence=row' "$T/sweep" && ok "sweep starts all-fast and diverges" || bad "sweep start"
grep -q 'first_divergence=NONE' "$T/sweep" && ok "sweep reaches a sufficient set" || bad "sweep sufficient"
grep -q '^C_MIN ' "$T/sweep" && ok "$(grep '^C_MIN' "$T/sweep")" || bad "C_MIN"
grep -q '^COST config=c_min' "$T/sweep" && ok "cost table" || bad "cost table"
exit $fail
