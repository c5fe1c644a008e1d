#!/bin/sh
# The shipped pair end to end through the CLI:
#   - dspark perplexity on the held-out split equals PyTorch's (1e-3 rel);
#   - speculative output == plain output, byte for byte, for every prompt of
#     tests/data/prompts.txt at several --draft-max, greedy and seeded T>0;
#   - surface: canonical kernels give divergence_rate 0; fast kernels with
#     direct commit diverge from plain decoding on some prompt (the check can
#     fail, and on a real model it does).
set -u
B=${BUILD:-build}
D=$B/dspark
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
TQ=models/dspark-tiny-q8_0.gguf
TF=models/dspark-tiny-f16.gguf
DR=models/dspark-tiny-drafter-f16.gguf
fail=0
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
[ -f "$TQ" ] || { echo "FAIL $TQ missing (make models)"; exit 1; }

# perplexity vs PyTorch (fewer chunks under the sanitizers: same protocol, own reference line)
xz -dc data/val.txt.xz > "$T/val.txt"
if [ -z "${DSPARK_SAN:-}" ]; then
    got=$($D perplexity -m "$TF" -f "$T/val.txt" -c 256 --chunks 32 | sed -n 's/^ppl=\([^ ]*\).*/\1/p')
    want=$(sed -n 's/^ppl //p' data/ref_ppl.txt)
    if python3 -c "import sys; g,w=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(g-w)/w<1e-3 else 1)" "$got" "$want"; then
        ok "perplexity dspark=$got pytorch=$want (rel tol 1e-3)"
    else bad "perplexity dspark=$got pytorch=$want"; fi
fi

# speculative == plain on every prompt
n=0; same=0
while IFS= read -r p; do
    [ -n "$p" ] || continue
    n=$((n+1))
    $D generate -m "$TQ" -p "$p" -n 64 >"$T/plain" 2>/dev/null
    for dm in 1 3 7; do
        $D generate -m "$TQ" -md "$DR" --draft-max $dm -p "$p" -n 64 >"$T/spec" 2>"$T/stats"
        if cmp -s "$T/plain" "$T/spec"; then same=$((same+1)); else bad "prompt $n draft-max $dm: speculative output differs from plain"; fi
    done
    $D generate -m "$TQ" -md "$DR" --commit replay -p "$p" -n 64 >"$T/spec" 2>/dev/null
    cmp -s "$T/plain" "$T/spec" && same=$((same+1)) || bad "prompt $n replay differs"
    $D generate -m "$TQ" -p "$p" -n 48 --temp 0.8 --top-p 0.95 --seed $n >"$T/plain_t" 2>/dev/null
    $D generate -m "$TQ" -md "$DR" -p "$p" -n 48 --temp 0.8 --top-p 0.95 --seed $n >"$T/spec_t" 2>/dev/null
    cmp -s "$T/plain_t" "$T/spec_t" && same=$((same+1)) || bad "prompt $n seeded T=0.8: speculative sample differs from plain"
done < tests/data/prompts.txt
[ "$same" -eq $((n*5)) ] && ok "speculative == plain for $n prompts x (draft-max 1,3,7, replay, T=0.8 seeded)"

# surface: canonical 0, fast > 0 on the real model
if [ -z "${DSPARK_SAN:-}" ]; then
    $D surface -m "$TQ" -md "$DR" --prompts tests/data/prompts.txt -n 96 >"$T/sc" 2>&1 || bad "surface canonical exit"
    grep -q '^SURFACE_RESULT .* divergent=0 divergence_rate=0.000000 ' "$T/sc" && ok "surface canonical: $(grep -o 'divergence_rate=[^ ]*' "$T/sc")" || { bad "surface canonical diverged"; cat "$T/sc"; }
    $D surface -m "$TQ" -md "$DR" --prompts tests/data/prompts.txt -n 96 --kernels fast >"$T/sf" 2>&1 || bad "surface fast exit"
    grep -q '^SURFACE_RESULT .* divergent=[1-9]' "$T/sf" && ok "surface fast: $(grep -o 'divergent=[^ ]* divergence_rate=[^ ]*' "$T/sf" | tail -1) $(grep -o 'prompts_text_differing=[^ ]*' "$T/sf")" || { bad "surface fast found no divergence"; cat "$T/sf"; }
fi
# diverge with the drafter's own proposal as the forced block (gamma + 1 rows)
$D diverge -m "$TQ" -md "$DR" -p "It is a truth universally acknowledged, that" >"$T/dv" 2>&1 || bad "diverge -md exit"
grep -q '^BLOCK rows=8 ' "$T/dv" && grep -q '^FIRST_DIVERGENCE NONE' "$T/dv" && ok "diverge -md: drafter block of 8 rows, FIRST_DIVERGENCE NONE" || { bad "diverge -md"; cat "$T/dv"; }
exit $fail
