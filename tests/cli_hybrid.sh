#!/bin/sh
# cli_hybrid.sh — the hybrid recurrent model (qwen35: gated delta net layers
# between gated full-attention layers) through the CLI:
#   - make-model --arch qwen35 is deterministic; greedy and seeded outputs
#     hash to tests/data/golden_hybrid.sha256 (GOLDEN_RECORD=1 rewrites it
#     for a deliberate, documented change);
#   - the same text with 1, 2 and 3 threads, and Q8_0 too;
#   - speculative decoding with a drafter made by make-drafter for it prints
#     exactly what plain decoding prints, greedy and seeded, at several draft
#     widths and with oracle acceptance (whole verify blocks) — the rejected
#     rows' recurrent state rolled back exactly;
#   - diverge finds --fast gdn alone, at the recurrence of the first layer;
#     canonical has no divergence; families names gdn PROVEN_DIFFERENT;
#   - malformed qwen35 files are one line and exit 2;
#   - where llama.cpp is built (/work/peer or $LLAMA_BIN), it loads dspark's
#     file and prints the same greedy text.
set -u
BUILD=${BUILD:-build}
D="$BUILD/dspark"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
. tests/lib_cli.sh   # expect_err
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
MK="--arch qwen35 --n-embd 128 --n-layer 6 --n-head 4 --n-head-kv 2 --head-dim 32 --n-ff 256 --n-vocab 400 --full-attn-interval 3 --seed 5"
$D make-model -o "$T/m.gguf" $MK 2>/dev/null || { echo "FAIL make-model qwen35"; exit 1; }
$D make-model -o "$T/m2.gguf" $MK 2>/dev/null && cmp -s "$T/m.gguf" "$T/m2.gguf" && ok "make-model --arch qwen35 is deterministic" || bad "make-model not deterministic"
$D make-model -o "$T/q.gguf" $MK --type q8_0 2>/dev/null || bad "make-model qwen35 q8_0"
P="The river was quiet in the morning, and the boats waited by the old stone bridge."

# ---- golden hashes ------------------------------------------------------------
out="$T/hashes"
plain_hashes "$out" "$T/m.gguf" "$P"
$D generate -m "$T/q.gguf" -p "$P" -n 48 -t 2 >"$T/qg" 2>/dev/null || bad "generate q8_0"
echo "$(sha256sum <"$T/qg" | cut -c1-64) q8_0_greedy" >>"$out"
golden_check tests/data/golden_hybrid.sha256 "$out" qwen35

# ---- threads ------------------------------------------------------------------
threads_equal qwen35 "$T/m.gguf" "$P"

# ---- speculative == plain -------------------------------------------------------
# taps: the residual stream after a recurrent layer (1), after the first
# full-attention layer (2) and after the last recurrent layer (4)
$D make-drafter -m "$T/m.gguf" -o "$T/d.gguf" --taps 1,2,4 --n-layer 1 --block-size 6 --seed 3 2>/dev/null || bad "make-drafter from the qwen35 target"
spec_widths qwen35 "$T/m.gguf" "$T/d.gguf" "$T/g" "$T/s" "$P"
# oracle acceptance at a partial rate: blocks accepted in part, so the
# recurrent state is rolled back to a row inside the block every round
for r in 1 0.6; do
    $D generate -m "$T/m.gguf" -md "$T/d.gguf" -p "$P" -n 48 -t 2 --oracle-accept rate:$r >"$T/so" 2>"$T/so.err" \
        && cmp -s "$T/g" "$T/so" && ok "oracle acceptance rate $r == plain ($(grep -o 'mean_accepted_len=[0-9.]*' "$T/so.err" | head -1))" \
        || { bad "oracle acceptance rate $r on qwen35"; head -c 400 "$T/so.err"; }
done
$D make-drafter -m "$T/q.gguf" -o "$T/qd.gguf" --n-layer 1 --block-size 6 --seed 3 2>/dev/null || bad "make-drafter (q8_0, default taps)"
$D generate -m "$T/q.gguf" -md "$T/qd.gguf" -p "$P" -n 48 -t 2 --temp 0.8 --seed 9 >"$T/qs" 2>/dev/null \
    && $D generate -m "$T/q.gguf" -p "$P" -n 48 -t 2 --temp 0.8 --seed 9 >"$T/qp" 2>/dev/null \
    && cmp -s "$T/qs" "$T/qp" && ok "q8_0: spec seeded == plain (default taps)" || bad "q8_0 spec seeded != plain"

# ---- diagnostics ----------------------------------------------------------------
$D diverge -m "$T/m.gguf" -p "$P" --block-greedy 8 >"$T/dc" 2>&1 && grep -q '^FIRST_DIVERGENCE NONE' "$T/dc" \
    && ok "qwen35 canonical: FIRST_DIVERGENCE NONE" || { bad "qwen35 canonical diverges"; cat "$T/dc"; }
$D diverge -m "$T/m.gguf" -p "$P" --block-greedy 8 --fast gdn >"$T/df" 2>&1 || bad "diverge --fast gdn exit"
grep -q '^FIRST_DIVERGENCE row=0 layer=0 checkpoint=cp4_attn_heads subobject=gdn_conv' "$T/df" \
    && ok "--fast gdn: $(grep '^FIRST_DIVERGENCE' "$T/df")" || { bad "--fast gdn not found at the recurrence"; cat "$T/df"; }
$D families -m "$T/m.gguf" -p "$P" --block-greedy 6 >"$T/fam" 2>&1 || bad "families qwen35 exit"
grep -q '^FAMILY name=gdn verdict=PROVEN_DIFFERENT .*model_first_divergence=row:0,layer:0,cp4_attn_heads,gdn_conv' "$T/fam" \
    && ok "qwen35 families: gdn PROVEN_DIFFERENT, first divergence at its conv" || { bad "qwen35 families gdn"; grep gdn "$T/fam"; }

# ---- malformed files: one line, exit 2 --------------------------------------------
patch() {   # patch IN OUT PYTHON-EXPR-ON-b (bytes)
    python3 -c "import sys; b=open(sys.argv[1],'rb').read(); b=$3; open(sys.argv[2],'wb').write(b)" "$1" "$2"
}
patch "$T/m.gguf" "$T/b1.gguf" "b.replace(b'qwen35.ssm.state_size', b'qwen35.ssm.state_sXze', 1)"
expect_err "no ssm.state_size" "ssm.state_size" $D generate -m "$T/b1.gguf" -p hi -n 1
patch "$T/m.gguf" "$T/b2.gguf" "b.replace(b'blk.4.ssm_conv1d', b'blk.4.ssm_cXnv1d', 1)"
expect_err "the conv kernel missing" "blk.4.ssm_conv1d" $D generate -m "$T/b2.gguf" -p hi -n 1
patch "$T/m.gguf" "$T/b3.gguf" "b.replace(b'blk.2.attn_q.', b'blk.2.attn_X.', 1)"
expect_err "a gated attention's q missing" "blk.2.attn_q" $D generate -m "$T/b3.gguf" -p hi -n 1
# ssm.time_step_rank's u32 value set to 3: not a multiple of group_count 2
patch "$T/m.gguf" "$T/b4.gguf" "(lambda k: b[:b.index(k)+len(k)+4] + (3).to_bytes(4,'little') + b[b.index(k)+len(k)+8:])(b'ssm.time_step_rank')"
expect_err "value heads not a multiple of key heads" "ssm sizes" $D generate -m "$T/b4.gguf" -p hi -n 1
expect_err "make-model: bad ssm heads" "key heads" $D make-model -o "$T/x.gguf" --arch qwen35 --ssm-groups 3 --ssm-heads 4

# ---- llama.cpp loads the file and agrees (where it is built) -------------------------
llama_agrees qwen35 "$T/m.gguf" "$T/g" "$P"
exit $fail
