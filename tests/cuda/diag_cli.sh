#!/bin/sh
# tests/cuda/diag_cli.sh CASE — one case of the divergence diagnostics on the
# device, through the CLI on the shipped pair. tests/cuda/run.sh runs each
# case as its own line (`make test-cuda`); DSPARK_DEVICE picks the device
# (cuda when unset), so the same script dry-runs on the CPU:
#   DSPARK_DEVICE=cpu BUILD=build sh tests/cuda/diag_cli.sh families
# Cases:
#   surface_canonical  speculative (canonical kernels, direct commit) vs plain
#                      decode teacher-forced: divergence rate 0
#   surface_fast       the same with --kernels fast: > 0 divergent tokens
#                      (the check can fail, and on the trained pair it does)
#   diverge_drafter    diverge on the drafter's own block: gate PASS, block of
#                      8 rows, FIRST_DIVERGENCE NONE, chain intact
#   families           each family forced fast alone: the two the seed names
#                      on the GPU (matmul_q8_0, attention) are found, and every
#                      first divergence found sits at a checkpoint that family
#                      produces (attributed); families the device has no
#                      kernels for are UNSUPPORTED, never a crash
#   sweep              all-fast -> sufficient set -> C_min -> cost table
# Prints PASS/FAIL lines naming each check; exit status 1 on any FAIL.
set -u
B=${BUILD:-build}
D=$B/dspark
DEV=${DSPARK_DEVICE:-cuda}
TQ=models/dspark-tiny-q8_0.gguf
DR=models/dspark-tiny-drafter-f16.gguf
P="It is a truth universally acknowledged, that"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
for f in "$TQ" "$DR"; do [ -f "$f" ] || { echo "FAIL $f missing (make models)"; exit 1; }; done

case "${1:-}" in
surface_canonical)
    "$D" surface --device "$DEV" -m "$TQ" -md "$DR" --prompts tests/data/prompts.txt -n 96 >"$T/o" 2>&1 || bad "surface canonical exit status"
    if grep -q '^SURFACE_RESULT .* divergent=0 divergence_rate=0.000000 ' "$T/o"; then
        ok "surface --kernels canonical on $DEV: $(grep -o 'tokens=[^ ]* divergent=[^ ]* divergence_rate=[^ ]*' "$T/o")"
    else bad "surface --kernels canonical on $DEV diverged"; cat "$T/o"; fi ;;
surface_fast)
    "$D" surface --device "$DEV" -m "$TQ" -md "$DR" --prompts tests/data/prompts.txt -n 96 --kernels fast >"$T/o" 2>&1 || bad "surface fast exit status"
    if grep -q '^SURFACE_RESULT .* divergent=[1-9]' "$T/o"; then
        ok "surface --kernels fast on $DEV: $(grep -o 'tokens=[^ ]* divergent=[^ ]* divergence_rate=[^ ]*' "$T/o") $(grep -o 'prompts_text_differing=[^ ]*' "$T/o")"
    else bad "surface --kernels fast on $DEV found no divergent token"; cat "$T/o"; fi ;;
diverge_drafter)
    "$D" diverge --device "$DEV" -m "$TQ" -md "$DR" -p "$P" >"$T/o" 2>&1 || bad "diverge -md exit status"
    grep -q '^GATE_RESULT PASS' "$T/o" && ok "diverge on $DEV: non-perturbation gate PASS" || bad "diverge on $DEV: gate"
    grep -q '^BLOCK rows=8 ' "$T/o" && ok "diverge on $DEV: the drafter's block of 8 rows" || bad "diverge on $DEV: block"
    grep -q '^FIRST_DIVERGENCE NONE' "$T/o" && ok "diverge on $DEV: all-canonical $(grep '^FIRST_DIVERGENCE' "$T/o")" || bad "diverge on $DEV: canonical diverged"
    grep -q '^CHAIN .*first_break=NONE' "$T/o" && ok "diverge on $DEV: chain intact" || bad "diverge on $DEV: chain"
    [ "$fail" -eq 0 ] || cat "$T/o" ;;
families)
    "$D" families --device "$DEV" -m "$TQ" -p "$P" --block-greedy 8 >"$T/o" 2>&1 || bad "families exit status"
    # as many FAMILY lines as the registry has families: the CPU's count on the same model
    "$D" families --device cpu -m "$TQ" -p "$P" --block-greedy 8 >"$T/c" 2>&1 || bad "families on cpu exit status"
    nf=$(grep -c '^FAMILY ' "$T/c")
    [ "$nf" -gt 20 ] && [ "$(grep -c '^FAMILY ' "$T/o")" -eq "$nf" ] && ok "families on $DEV: $nf FAMILY lines (as the CPU's: the registry)" || bad "families on $DEV: not the CPU's $nf FAMILY lines"
    # the checkpoints each family's kernels produce (the probes' family bits
    # in src/layer.c and src/model.c): a first divergence elsewhere would be
    # misattributed
    for f in matmul_q8_0 attention rmsnorm rope swiglu residual; do
        case $f in
        matmul_q8_0) site='(cp2_qkv,[qkv]_proj|cp3_kv_write,.*|cp5_attn_out_proj,.*|cp8_ffn_gate_up,.*|cp10_ffn_down,.*|logits,.*)' ;;
        attention)   site='cp4_attn_heads,head_[0-9]+' ;;
        rmsnorm)     site='(cp1_attn_norm,.*|cp2_qkv,[qk]_norm|cp3_kv_write,.*|cp7_ffn_norm,.*|final_norm,.*)' ;;
        rope)        site='(cp2_qkv,[qk]_rope|cp3_kv_write,.*)' ;;
        swiglu)      site='cp9_ffn_act,.*' ;;
        residual)    site='(cp1_attn_norm,.*|cp6_attn_residual,.*|cp7_ffn_norm,.*|cp11_layer_out,.*|final_norm,.*)' ;;
        esac
        line=$(grep "^FAMILY name=$f " "$T/o")
        got=$(echo "$line" | sed -n 's/.* model_first_divergence=\([^ ]*\).*/\1/p')
        if [ -z "$line" ]; then bad "families on $DEV: no line for $f"
        elif [ "$got" = NONE ]; then
            case $f in
            matmul_q8_0|attention) bad "families on $DEV: $f fast alone: no divergence found (the check cannot fail)" ;;
            *) echo "INFO families on $DEV: $f fast alone: no divergence on this block ($(echo "$line" | grep -o 'verdict=[^ ]*'))" ;;
            esac
        elif echo "$got" | grep -Eq "^row:[0-9]+,layer:-?[0-9]+,$site\$"; then
            ok "families on $DEV: $f fast alone found at $got (a checkpoint $f produces)"
        else bad "families on $DEV: $f fast alone first diverges at $got, not a checkpoint $f produces"; fi
    done
    grep '^FAMILY .*verdict=UNSUPPORTED' "$T/o" | sed 's/^FAMILY name=\([^ ]*\) .*/INFO families on '"$DEV"': \1 unsupported on this device/'
    [ "$fail" -eq 0 ] || cat "$T/o" ;;
sweep)
    "$D" sweep --device "$DEV" -m "$TQ" -p "$P" --block-greedy 8 --reps 3 >"$T/o" 2>&1 || bad "sweep exit status"
    grep -q '^SWEEP step=0 .*first_divergence=row' "$T/o" && ok "sweep on $DEV starts all-fast and diverges" || bad "sweep on $DEV: start"
    grep -q 'first_divergence=NONE' "$T/o" && ok "sweep on $DEV reaches a sufficient set" || bad "sweep on $DEV: no sufficient set"
    grep -q '^C_MIN ' "$T/o" && ok "sweep on $DEV: $(grep '^C_MIN' "$T/o")" || bad "sweep on $DEV: no C_MIN"
    grep -q '^COST config=c_min' "$T/o" && ok "sweep on $DEV: cost table" || bad "sweep on $DEV: no cost table"
    [ "$fail" -eq 0 ] || cat "$T/o" ;;
*)
    echo "usage: diag_cli.sh surface_canonical|surface_fast|diverge_drafter|families|sweep" >&2
    exit 2 ;;
esac
exit $fail
