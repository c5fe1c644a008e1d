#!/bin/sh
# tests/cuda/moe_cli.sh — the mixture of experts (qwen3moe, qwen35moe's FFN)
# on the device, through the CLI (tests/cuda/run.sh runs it; DSPARK_DEVICE
# picks the device, cuda when unset, so the script dry-runs on the CPU:
#   DSPARK_DEVICE=cpu BUILD=build sh tests/cuda/moe_cli.sh).
# On tests/cli_moe.sh's models (the 2-of-8 Q8_0 and F32 files, the shared
# expert one) and a 8-of-64 one:
#   - generate on the device prints exactly the CPU's text, greedy and
#     seeded, and --dump-logits (a batched prefill's last row, then greedy
#     decode steps) is the CPU's file byte for byte;
#   - tests/data/golden_moe.sha256 reproduced on the device (the CPU's
#     hashes: CUDA canonical == CPU canonical);
#   - the experts by id (matmul_id: decode and M k <= 64, recorded) give the
#     host grouping's logits (DSPARK_CUDA_OFF=moeid) byte for byte;
#   - the canonical property through the CLI: a 150-token prompt's logits
#     dump the same in 512-row and 64-row prefill chunks (DSPARK_CUDA_OFF=
#     chunk) and --prefill decode prints the batched prefill's text;
#   - speculative == plain on the device with a drafter made from the MoE
#     target, greedy and seeded, draft widths 6/3/1, and whole verify blocks
#     (oracle acceptance);
#   - diverge on the device: verify(8) == 8 decodes (FIRST_DIVERGENCE NONE),
#     --fast moe_route alone found at the route; families: moe_route
#     PROVEN_DIFFERENT;
#   - deepseek4 (its gated route, moe_route_ex) is still refused on the
#     device: one line, exit 2.
# Prints PASS/FAIL lines; exit status 1 on any FAIL.
set -u
BUILD=${BUILD:-build}
D="$BUILD/dspark"
DEV=${DSPARK_DEVICE:-cuda}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
. tests/lib_cli.sh   # expect_err
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
MK="--arch qwen3moe --type q8_0 --n-embd 128 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 256 --n-expert 8 --n-expert-used 2 --n-ff-exp 64 --n-vocab 400 --seed 7"
P="The river was quiet in the morning, and the boats waited by the old stone bridge."
$D make-model -o "$T/q8.gguf" $MK 2>/dev/null || { echo "FAIL make-model qwen3moe"; exit 1; }
$D make-model -o "$T/f32.gguf" $MK --type f32 2>/dev/null || { echo "FAIL make-model qwen3moe f32"; exit 1; }
$D make-model -o "$T/sh.gguf" $MK --n-ff-shexp 96 2>/dev/null || { echo "FAIL make-model --n-ff-shexp"; exit 1; }
$D make-model -o "$T/e64.gguf" $MK --n-expert 64 --n-expert-used 8 2>/dev/null || { echo "FAIL make-model 8 of 64"; exit 1; }

# ---- the device's text and logits == the CPU's ------------------------------
for m in q8 f32 sh e64; do
    for mode in greedy seeded; do
        if [ $mode = greedy ]; then S=""; else S="--temp 0.8 --seed 7"; fi
        $D generate --device cpu -m "$T/$m.gguf" -p "$P" -n 48 -t 2 $S >"$T/c" 2>/dev/null || bad "generate $m $mode on cpu"
        $D generate --device "$DEV" -m "$T/$m.gguf" -p "$P" -n 48 -t 2 $S >"$T/g" 2>"$T/g.err" || { bad "generate $m $mode on $DEV"; head -c 300 "$T/g.err"; }
        [ -s "$T/c" ] && cmp -s "$T/c" "$T/g" && ok "$m $mode: $DEV text == cpu text" || bad "$m $mode: $DEV text != cpu text"
    done
    $D generate --device cpu -m "$T/$m.gguf" -p "$P" -n 6 -t 2 --dump-logits "$T/lc" >/dev/null 2>&1 || bad "dump-logits $m cpu"
    $D generate --device "$DEV" -m "$T/$m.gguf" -p "$P" -n 6 -t 2 --dump-logits "$T/lg" >/dev/null 2>&1 || bad "dump-logits $m $DEV"
    [ -s "$T/lc" ] && cmp -s "$T/lc" "$T/lg" && ok "$m: $DEV logits (prefill row + 6 decode steps) == cpu, $(wc -c <"$T/lg") bytes" \
        || bad "$m: $DEV logits != cpu logits"
done

# ---- the golden hashes of tests/cli_moe.sh, on the device -----------------------
out="$T/hashes"
: >"$out"
echo "$(sha256sum <"$T/q8.gguf" | cut -c1-64) model_file" >>"$out"
$D generate --device "$DEV" -m "$T/q8.gguf" -p "$P" -n 48 -t 2 >"$T/g" 2>/dev/null || bad "generate greedy"
echo "$(sha256sum <"$T/g" | cut -c1-64) plain_greedy" >>"$out"
$D generate --device "$DEV" -m "$T/q8.gguf" -p "$P" -n 48 -t 2 --temp 0.8 --seed 7 >"$T/s" 2>/dev/null || bad "generate seeded"
echo "$(sha256sum <"$T/s" | cut -c1-64) plain_t08" >>"$out"
$D generate --device "$DEV" -m "$T/q8.gguf" -p "$P" -n 4 -t 2 --dump-logits "$T/l" >/dev/null 2>&1 || bad "dump-logits"
echo "$(sha256sum <"$T/l" | cut -c1-64) logits" >>"$out"
$D generate --device "$DEV" -m "$T/sh.gguf" -p "$P" -n 48 -t 2 >"$T/shg" 2>/dev/null || bad "generate shared expert"
echo "$(sha256sum <"$T/shg" | cut -c1-64) shared_expert_greedy" >>"$out"
if diff tests/data/golden_moe.sha256 "$out" >"$T/golden.diff"; then
    ok "golden: $(wc -l <"$out") qwen3moe outputs on $DEV bit-identical to tests/data/golden_moe.sha256"
else bad "golden: qwen3moe outputs on $DEV differ from tests/data/golden_moe.sha256:"; cat "$T/golden.diff"; fi

# ---- the canonical property through the CLI ------------------------------------
# a 150-token prompt: one 512-row prefill chunk, or three of 64 (DSPARK_CUDA_OFF=chunk)
PL="$P $P $P $P $P $P $P $P"
$D generate --device "$DEV" -m "$T/e64.gguf" -p "$PL" -n 8 -t 2 --dump-logits "$T/l512" >/dev/null 2>&1 || bad "dump-logits long prompt"
DSPARK_CUDA_OFF=chunk $D generate --device "$DEV" -m "$T/e64.gguf" -p "$PL" -n 8 -t 2 --dump-logits "$T/l64" >/dev/null 2>&1 || bad "dump-logits chunk 64"
$D generate --device cpu -m "$T/e64.gguf" -p "$PL" -n 8 -t 2 --dump-logits "$T/lcpu" >/dev/null 2>&1 || bad "dump-logits long prompt cpu"
[ -s "$T/l512" ] && cmp -s "$T/l512" "$T/l64" && cmp -s "$T/l512" "$T/lcpu" \
    && ok "8 of 64 experts, $(printf '%s' "$PL" | wc -w)-word prompt: logits equal in 512- and 64-row chunks and on the cpu" \
    || bad "long prompt: chunking or the device changes the logits"
$D generate --device "$DEV" -m "$T/e64.gguf" -p "$PL" -n 32 -t 2 >"$T/pb" 2>/dev/null || bad "prefill batch"
$D generate --device "$DEV" -m "$T/e64.gguf" -p "$PL" -n 32 -t 2 --prefill decode >"$T/pd" 2>/dev/null || bad "prefill decode"
[ -s "$T/pb" ] && cmp -s "$T/pb" "$T/pd" && ok "--prefill decode == --prefill batch on $DEV (text)" || bad "--prefill decode != batch on $DEV"

# ---- the experts by id (decode, short verify blocks) == the host grouping -------------
# DSPARK_CUDA_OFF=moeid: every MoE layer downloads the route and groups on
# the host (no recording); with DSPARK_CUDA_ON=moeid (opt-in until a GPU has
# run it) decode and M k <= 64 run matmul_id
if [ "$DEV" != cpu ]; then
    for m in q8 f32 sh e64; do
        DSPARK_CUDA_ON=moeid $D generate --device "$DEV" -m "$T/$m.gguf" -p "$P" -n 12 -t 2 --dump-logits "$T/lid" >/dev/null 2>&1 || bad "dump-logits $m (id)"
        DSPARK_CUDA_OFF=moeid $D generate --device "$DEV" -m "$T/$m.gguf" -p "$P" -n 12 -t 2 --dump-logits "$T/lho" >/dev/null 2>&1 \
            || bad "dump-logits $m (moeid off)"
        [ -s "$T/lid" ] && cmp -s "$T/lid" "$T/lho" \
            && ok "$m on $DEV: experts by id == host grouping (DSPARK_CUDA_OFF=moeid), logits $(wc -c <"$T/lid") bytes" \
            || bad "$m on $DEV: the experts by id change the logits (vs DSPARK_CUDA_OFF=moeid)"
    done
fi

# ---- speculative == plain on the device ------------------------------------------
for m in q8 sh e64; do
    $D make-drafter -m "$T/$m.gguf" -o "$T/$m-d.gguf" --taps 0,2,3 --n-layer 1 --block-size 6 --seed 3 2>/dev/null || bad "make-drafter $m"
    $D generate --device "$DEV" -m "$T/$m.gguf" -p "$P" -n 48 -t 2 >"$T/pg" 2>/dev/null || bad "plain greedy $m"
    $D generate --device "$DEV" -m "$T/$m.gguf" -p "$P" -n 48 -t 2 --temp 0.8 --seed 7 >"$T/ps" 2>/dev/null || bad "plain seeded $m"
    for dm in 6 3 1; do
        $D generate --device "$DEV" -m "$T/$m.gguf" -md "$T/$m-d.gguf" --draft-max $dm -p "$P" -n 48 -t 2 >"$T/sg" 2>"$T/sg.err" \
            && [ -s "$T/pg" ] && cmp -s "$T/pg" "$T/sg" && ok "$m on $DEV: spec greedy == plain (draft-max $dm, $(grep -o 'mean_accepted_len=[0-9.]*' "$T/sg.err"))" \
            || { bad "$m on $DEV: spec greedy != plain (draft-max $dm)"; head -c 300 "$T/sg.err"; }
        $D generate --device "$DEV" -m "$T/$m.gguf" -md "$T/$m-d.gguf" --draft-max $dm -p "$P" -n 48 -t 2 --temp 0.8 --seed 7 >"$T/ss" 2>/dev/null \
            && [ -s "$T/ps" ] && cmp -s "$T/ps" "$T/ss" && ok "$m on $DEV: spec seeded == plain (draft-max $dm)" || bad "$m on $DEV: spec seeded != plain (draft-max $dm)"
    done
    $D generate --device "$DEV" -m "$T/$m.gguf" -md "$T/$m-d.gguf" -p "$P" -n 48 -t 2 --oracle-accept rate:1 >"$T/so" 2>"$T/so.err" \
        && cmp -s "$T/pg" "$T/so" && ok "$m on $DEV: oracle acceptance, full verify blocks == plain ($(grep -o 'mean_accepted_len=[0-9.]*' "$T/so.err" | head -1))" \
        || { bad "$m on $DEV: oracle acceptance != plain"; head -c 300 "$T/so.err"; }
done

# ---- diverge / families on the device ------------------------------------------------
$D diverge --device "$DEV" -m "$T/q8.gguf" -p "$P" --block-greedy 8 >"$T/dc" 2>&1 && grep -q '^FIRST_DIVERGENCE NONE' "$T/dc" \
    && ok "diverge on $DEV: verify(8) == 8 decodes at every checkpoint (FIRST_DIVERGENCE NONE)" || { bad "diverge canonical on $DEV"; cat "$T/dc"; }
$D diverge --device "$DEV" -m "$T/q8.gguf" -p "$P" --block-greedy 8 --fast moe_route >"$T/df" 2>&1 || bad "diverge --fast moe_route exit"
grep -q '^FIRST_DIVERGENCE row=[0-9]* layer=0 checkpoint=cp8_ffn_gate_up subobject=moe_route' "$T/df" \
    && ok "diverge on $DEV --fast moe_route: $(grep '^FIRST_DIVERGENCE' "$T/df")" || { bad "--fast moe_route not found at the route on $DEV"; cat "$T/df"; }
$D families --device "$DEV" -m "$T/q8.gguf" -p "$P" --block-greedy 6 >"$T/fam" 2>&1 || bad "families exit"
grep -q '^FAMILY name=moe_route verdict=PROVEN_DIFFERENT' "$T/fam" \
    && ok "families on $DEV: $(grep '^FAMILY name=moe_route' "$T/fam" | grep -o 'verdict=[^ ]*.*model_first_divergence=[^ ]*')" \
    || { bad "families on $DEV: moe_route not PROVEN_DIFFERENT"; cat "$T/fam"; }

# ---- still refused on a device: deepseek4's gated route ---------------------------------
if [ "$DEV" != cpu ]; then
    $D make-model -o "$T/ds4.gguf" --arch deepseek4 --type q8_0 --n-embd 64 --n-layer 2 --n-head 4 --head-dim 128 --n-rot 32 \
        --q-lora 64 --o-lora 32 --n-expert 8 --n-expert-used 2 --n-ff-exp 64 --n-vocab 400 --n-swa 24 --hc-iters 10 --seed 5 2>/dev/null \
        || bad "make-model deepseek4"
    expect_err "deepseek4 on $DEV refused" "deepseek4" $D generate --device "$DEV" -m "$T/ds4.gguf" -p hi -n 1
fi
exit $fail
