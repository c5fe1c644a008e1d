#!/bin/sh
# cli_moe.sh — the mixture of experts (qwen3moe) through the CLI:
#   - make-model --arch qwen3moe is deterministic, and its outputs (greedy,
#     seeded, the raw logits of a batched prefill + decode steps) hash to the
#     values recorded in tests/data/golden_moe.sha256 (the engine's MoE bits:
#     a change that moves one fails here; GOLDEN_RECORD=1 rewrites the file
#     for a deliberate, documented change);
#   - the same text with 1 and 3 threads;
#   - speculative decoding with a drafter made from the MoE target (its taps
#     from the MoE layers) prints exactly what plain decoding prints, greedy
#     and seeded, at several draft widths;
#   - quantize re-encodes the 3-D expert stacks (the router stays F32) and the
#     result runs;
#   - the shared expert (qwen35moe's FFN, --n-ff-shexp) hashes, and spec == plain on it;
#   - malformed MoE files are one line and exit 2.
set -u
BUILD=${BUILD:-build}
D="$BUILD/dspark"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
. tests/lib_cli.sh   # expect_err
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
MK="--arch qwen3moe --type q8_0 --n-embd 128 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 256 --n-expert 8 --n-expert-used 2 --n-ff-exp 64 --n-vocab 400 --seed 7"
$D make-model -o "$T/m.gguf" $MK 2>/dev/null || { echo "FAIL make-model qwen3moe"; exit 1; }
$D make-model -o "$T/m2.gguf" $MK 2>/dev/null && cmp -s "$T/m.gguf" "$T/m2.gguf" && ok "make-model --arch qwen3moe is deterministic" || bad "make-model not deterministic"
P="The river was quiet in the morning, and the boats waited by the old stone bridge."

# ---- golden hashes --------------------------------------------------------
out="$T/hashes"
plain_hashes "$out" "$T/m.gguf" "$P"
$D generate -m "$T/m.gguf" -p "$P" -n 4 -t 2 --dump-logits "$T/l" >/dev/null 2>&1 || bad "dump-logits"
echo "$(sha256sum <"$T/l" | cut -c1-64) logits" >>"$out"
# qwen35moe's FFN on the qwen3moe trunk: the experts plus a gated shared expert
$D make-model -o "$T/sh.gguf" $MK --n-ff-shexp 96 2>/dev/null || bad "make-model --n-ff-shexp"
$D generate -m "$T/sh.gguf" -p "$P" -n 48 -t 2 >"$T/shg" 2>/dev/null || bad "generate shared expert"
echo "$(sha256sum <"$T/shg" | cut -c1-64) shared_expert_greedy" >>"$out"
golden_check tests/data/golden_moe.sha256 "$out" qwen3moe

# ---- threads --------------------------------------------------------------
threads_equal qwen3moe "$T/m.gguf" "$P"

# ---- speculative == plain on the MoE target --------------------------------
$D make-drafter -m "$T/m.gguf" -o "$T/d.gguf" --taps 0,2,3 --n-layer 1 --block-size 6 --seed 3 2>/dev/null || bad "make-drafter from the MoE target"
spec_widths qwen3moe "$T/m.gguf" "$T/d.gguf" "$T/g" "$T/s" "$P"
# the oracle drafter: every draft accepted, so whole verify blocks commit
$D generate -m "$T/m.gguf" -md "$T/d.gguf" -p "$P" -n 48 -t 2 --oracle-accept rate:1 >"$T/so" 2>"$T/so.err" \
    && cmp -s "$T/g" "$T/so" && ok "oracle acceptance: full verify blocks == plain ($(grep -o 'mean_accepted_len=[0-9.]*' "$T/so.err" | head -1))" \
    || { bad "oracle acceptance on qwen3moe"; head -c 400 "$T/so.err"; }

$D make-drafter -m "$T/sh.gguf" -o "$T/shd.gguf" --n-layer 1 --block-size 6 --seed 3 2>/dev/null || bad "make-drafter (shared expert)"
$D generate -m "$T/sh.gguf" -md "$T/shd.gguf" -p "$P" -n 48 -t 2 --oracle-accept rate:1 >"$T/shs" 2>/dev/null \
    && cmp -s "$T/shg" "$T/shs" && ok "shared expert: spec (oracle acceptance, full blocks) == plain" || bad "shared expert spec != plain"

# ---- quantize ---------------------------------------------------------------
$D make-model -o "$T/f.gguf" --arch qwen3moe --n-embd 256 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 256 --n-expert 4 --n-expert-used 2 --n-ff-exp 256 --n-vocab 400 --seed 2 2>/dev/null || bad "make-model f32 moe"
$D quantize "$T/f.gguf" "$T/q.gguf" q4_k_m 2>/dev/null || bad "quantize q4_k_m"
$D inspect "$T/q.gguf" >"$T/qi" 2>&1
grep -q 'blk.0.ffn_gate_exps.weight *Q4_K *256 x 256 x 4' "$T/qi" && grep -q 'blk.0.ffn_gate_inp.weight *F32' "$T/qi" \
    && ok "quantize: 3-D expert stacks re-encoded (Q4_K), router left F32" || { bad "quantize of the experts"; grep blk.0 "$T/qi"; }
$D generate -m "$T/q.gguf" -p "$P" -n 8 >/dev/null 2>&1 && ok "the quantized MoE runs" || bad "quantized MoE run"

# ---- malformed files: one line, exit 2 --------------------------------------
patch() {   # patch IN OUT PYTHON-EXPR-ON-b (bytes)
    python3 -c "import sys; b=open(sys.argv[1],'rb').read(); b=$3; open(sys.argv[2],'wb').write(b)" "$1" "$2"
}
patch "$T/m.gguf" "$T/b1.gguf" "b.replace(b'qwen3moe.expert_count', b'qwen3moe.expert_cXunt', 1)"
expect_err "no expert_count" "expert_count" $D generate -m "$T/b1.gguf" -p hi -n 1
# expert_used_count's u32 value (after the key and its type) set to 9 > 8
patch "$T/m.gguf" "$T/b2.gguf" "(lambda k: b[:b.index(k)+len(k)+4] + (9).to_bytes(4,'little') + b[b.index(k)+len(k)+8:])(b'expert_used_count')"
expect_err "expert_used_count > expert_count" "out of range" $D generate -m "$T/b2.gguf" -p hi -n 1
patch "$T/m.gguf" "$T/b3.gguf" "b.replace(b'blk.2.ffn_down_exps', b'blk.2.ffn_dXwn_exps', 1)"
expect_err "an expert tensor missing" "blk.2.ffn_down_exps" $D generate -m "$T/b3.gguf" -p hi -n 1
patch "$T/m.gguf" "$T/b4.gguf" "b.replace(b'blk.1.ffn_gate_inp', b'blk.1.ffn_gate_iXp', 1)"
expect_err "the router missing" "blk.1.ffn_gate_inp" $D generate -m "$T/b4.gguf" -p hi -n 1
patch "$T/sh.gguf" "$T/b5.gguf" "b.replace(b'blk.1.ffn_down_shexp', b'blk.1.ffn_dXwn_shexp', 1)"
expect_err "a shared-expert tensor missing" "blk.1.ffn_down_shexp" $D generate -m "$T/b5.gguf" -p hi -n 1
expect_err "make-model: used > experts" "experts" $D make-model -o "$T/x.gguf" --arch qwen3moe --n-expert 4 --n-expert-used 5

# ---- llama.cpp loads the file and agrees (where it is built) -------------------------
# (the plain qwen3moe file; llama.cpp's qwen3moe loader refuses the shared-expert one)
llama_agrees qwen3moe "$T/m.gguf" "$T/g" "$P"
exit $fail
