#!/bin/sh
# cli_ds4.sh — DeepSeek V4 (deepseek4) through the CLI, on the CPU:
#   - make-model --arch deepseek4 is deterministic and the file generates
#     the same text with 1 and 3 threads;
#   - speculative decoding with a drafter made from it prints exactly what
#     plain decoding prints, greedy and seeded, at draft widths 6, 3, 1, and
#     with every draft accepted (whole verify blocks commit);
#   - diverge: canonical -> FIRST_DIVERGENCE NONE; each new family alone
#     fast is found at the site it produces (attn_sinks at the raw heads,
#     hc_pre at its mixed input, hc_post at the streams after the HC tail),
#     the Q8_0 matmul at QA; families prints the seed's names and sites;
#   - HCA compressed attention (compress ratio 128, docs/DS4-COMPRESSED.md)
#     with a 126-token prompt, so that block 0 (positions 0..127) completes
#     inside verify blocks and during decode: spec == plain greedy and
#     seeded at every draft width, threads equal, a 168-token prompt (the
#     block completes inside a prefill chunk) equal with -t 1 and 2; diverge
#     over a verify block across the boundary: FIRST_DIVERGENCE NONE (logits,
#     taps and the widened K/V rows, compressor state included, memcmp) on
#     every SIMD level with the same text, and --fast ds4_compress found at
#     the row that completes the block;
#   - CSA (ratio 4, the lightning indexer picking 3 of up to 50 blocks) on
#     a 4,128 model: the same spec / threads / SIMD / diverge checks, at a
#     verify block inside the first blocks and one across position 127;
#     families proves the ds4_indexer and ds4_compress fast kernels differ;
#   - refusals are one line, exit 2: a ratio other than 0/4/128, a gating function other than sqrtsoftplus; make-model's
#     bad --compress-ratios.
set -u
BUILD=${BUILD:-build}
D="$BUILD/dspark"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
. tests/lib_cli.sh   # expect_err, spec_widths
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
MK="--arch deepseek4 --type q8_0 --n-embd 64 --n-layer 2 --n-head 4 --head-dim 128 --n-rot 32 --q-lora 64 --o-lora 32 --n-expert 8 --n-expert-used 2 --n-ff-exp 64 --n-vocab 400 --n-swa 24 --hc-iters 10 --seed 5"
$D make-model -o "$T/m.gguf" $MK 2>/dev/null || { echo "FAIL make-model deepseek4"; exit 1; }
$D make-model -o "$T/m2.gguf" $MK 2>/dev/null && cmp -s "$T/m.gguf" "$T/m2.gguf" && ok "make-model --arch deepseek4 is deterministic" || bad "make-model deepseek4 not deterministic"
P="The river was quiet in the morning, and the boats waited by the old stone bridge."

plain_hashes "$T/hashes" "$T/m.gguf" "$P"
threads_equal deepseek4 "$T/m.gguf" "$P"

# ---- speculative == plain -----------------------------------------------------
$D make-drafter -m "$T/m.gguf" -o "$T/d.gguf" --n-layer 1 --block-size 6 --seed 3 2>/dev/null || bad "make-drafter from the deepseek4 target"
spec_widths deepseek4 "$T/m.gguf" "$T/d.gguf" "$T/g" "$T/s" "$P"
$D generate -m "$T/m.gguf" -md "$T/d.gguf" -p "$P" -n 48 -t 2 --oracle-accept rate:1 >"$T/so" 2>"$T/so.err" \
    && cmp -s "$T/g" "$T/so" && ok "oracle acceptance: full verify blocks == plain ($(grep -o 'mean_accepted_len=[0-9.]*' "$T/so.err" | head -1))" \
    || { bad "oracle acceptance on deepseek4"; head -c 400 "$T/so.err"; }

# ---- hash-routed layers (hash_layer_count, ffn_gate_tid2eid) ---------------------
$D make-model -o "$T/h.gguf" $MK --n-hash 2 2>/dev/null || bad "make-model --n-hash 2"
$D generate -m "$T/h.gguf" -p "$P" -n 48 -t 2 >"$T/hg" 2>/dev/null && [ -s "$T/hg" ] || bad "generate with hash layers"
$D generate -m "$T/h.gguf" -p "$P" -n 48 -t 1 >"$T/hg1" 2>/dev/null && cmp -s "$T/hg" "$T/hg1" \
    && ok "hash layers: greedy text equal with -t 1, 2" || bad "hash layers: thread count changes the text"
$D make-drafter -m "$T/h.gguf" -o "$T/hd.gguf" --n-layer 1 --block-size 6 --seed 3 2>/dev/null || bad "make-drafter (hash layers)"
$D generate -m "$T/h.gguf" -md "$T/hd.gguf" -p "$P" -n 48 -t 2 --draft-max 3 >"$T/hs" 2>/dev/null && cmp -s "$T/hg" "$T/hs" \
    && ok "hash layers: spec greedy == plain" || bad "hash layers: spec != plain"
# the table is data: quantize copies it as it is, and the quantized file runs
$D quantize "$T/h.gguf" "$T/hq.gguf" q8_0 >/dev/null 2>&1 && $D generate -m "$T/hq.gguf" -p "$P" -n 8 -t 2 >/dev/null 2>&1 \
    && ok "hash layers: quantize keeps the I32 table, the file runs" || bad "hash layers: quantize"
expect_err "more hash layers than layers" "hash layers" $D make-model -o "$T/bad.gguf" $MK --n-hash 3

# exact_under LABEL MODEL STEM: a model variant keeps every exactness property —
# greedy text equal with -t 1, 2 (into STEM.g), spec greedy == plain with a
# drafter made for it, verify(8) == 8 decodes at portable and AVX-512
exact_under() {
    $D generate -m "$2" -p "$P" -n 48 -t 2 >"$3.g" 2>/dev/null && $D generate -m "$2" -p "$P" -n 48 -t 1 >"$3.g1" 2>/dev/null \
        && [ -s "$3.g" ] && cmp -s "$3.g" "$3.g1" && ok "$1: greedy text equal with -t 1, 2" || bad "$1: thread count changes the text"
    $D make-drafter -m "$2" -o "$3.d.gguf" --n-layer 1 --block-size 6 --seed 3 2>/dev/null || bad "make-drafter ($1)"
    $D generate -m "$2" -md "$3.d.gguf" -p "$P" -n 48 -t 2 --draft-max 3 >"$3.s" 2>/dev/null && cmp -s "$3.g" "$3.s" \
        && ok "$1: spec greedy == plain" || bad "$1: spec != plain"
    for lv in portable avx512; do
        env DSPARK_SIMD=$lv $D diverge -m "$2" -p "$P" --block-greedy 8 >"$3.dv" 2>&1 && grep -q '^FIRST_DIVERGENCE NONE' "$3.dv" \
            && ok "$1: verify(8) == 8 decodes (DSPARK_SIMD=$lv)" || { bad "$1 diverges (DSPARK_SIMD=$lv)"; grep -a '^FIRST\|rror' "$3.dv"; }
    done
}

# ---- the SwiGLU clamp (swiglu_clamp_exp / _shexp: llama.cpp's ggml_swiglu_clamp) ---------
# the limit must act (0.5 clamps this random model's gate/up values) and keep every exactness
# property: threads, spec == plain, verify(8) == 8 decodes; llama.cpp agrees on the F32 files
# (bench/results/ds4-swiglu-clamp-llamacpp-s35.txt)
$D make-model -o "$T/k.gguf" $MK --swiglu-clamp 0.5 2>/dev/null || bad "make-model --swiglu-clamp 0.5"
exact_under "SwiGLU clamp" "$T/k.gguf" "$T/k"
[ -s "$T/k.g" ] && ! cmp -s "$T/k.g" "$T/g" \
    && ok "SwiGLU clamp: the limit moves the text" || bad "SwiGLU clamp: no text, or the unclamped model's"
expect_err "a negative SwiGLU clamp" "swiglu-clamp" $D make-model -o "$T/bad.gguf" $MK --swiglu-clamp -1

# ---- rope scaling on the compressed layers (rope.scaling yarn, llama.cpp's rope_yarn) ----
# the compressed layers' RoPE under YaRN (factor 4, original context 64: pairs past the
# ramp interpolated, the first extrapolated): it must move the logits and keep threads,
# spec == plain and verify(8) == 8 decodes; llama.cpp agrees on F32 files
# (bench/results/ds4-yarn-llamacpp-s36.txt)
MKC="$MK --compress-ratios 4,128 --n-indexer-head 2 --indexer-top-k 3"
$D make-model -o "$T/y0.gguf" $MKC 2>/dev/null || bad "make-model (compressed, no rope scaling)"
$D make-model -o "$T/y.gguf" $MKC --rope-yarn 4 --rope-orig-ctx 64 2>/dev/null || bad "make-model --rope-yarn 4"
$D generate -m "$T/y0.gguf" -p "$P" -n 4 --dump-logits "$T/yl0" >/dev/null 2>&1 &&
    $D generate -m "$T/y.gguf" -p "$P" -n 4 --dump-logits "$T/yl" >/dev/null 2>&1 && [ -s "$T/yl" ] && ! cmp -s "$T/yl" "$T/yl0" \
    && ok "rope scaling: yarn moves the logits" || bad "rope scaling: no logits, or the unscaled model's"
exact_under "rope scaling" "$T/y.gguf" "$T/y"
expect_err "--rope-yarn on a qwen3moe model" "deepseek4" $D make-model -o "$T/bad.gguf" --arch qwen3moe --rope-yarn 4

# ---- diagnostics ----------------------------------------------------------------
$D diverge -m "$T/m.gguf" -p "$P" --block-greedy 8 >"$T/dc" 2>&1 && grep -q '^FIRST_DIVERGENCE NONE' "$T/dc" \
    && ok "deepseek4 canonical: FIRST_DIVERGENCE NONE" || { bad "deepseek4 canonical diverges"; cat "$T/dc"; }
for fs in "attn_sinks:cp4_attn_heads subobject=head_" "hc_pre:cp1_attn_norm subobject=hc_pre" \
          "hc_post:cp6_attn_residual subobject=after_attn_hc" "matmul_q8_0:cp2_qkv subobject=qa"; do
    f=${fs%%:*}; want=${fs#*:}
    $D diverge -m "$T/m.gguf" -p "$P" --block-greedy 8 --fast "$f" >"$T/df" 2>&1 || bad "diverge --fast $f exit"
    grep -q "^FIRST_DIVERGENCE row=0 layer=0 checkpoint=$want" "$T/df" \
        && ok "--fast $f: $(grep '^FIRST_DIVERGENCE' "$T/df")" || { bad "--fast $f not found at $want"; grep '^FIRST' "$T/df"; }
done
$D families -m "$T/m.gguf" -p "$P" --block-greedy 6 >"$T/fam" 2>&1 || bad "families deepseek4 exit"
grep -aq '^  SEED FAMILY_Q8_0_BATCH_EXT_VS_SINGLE_MV sites=QA,KV,QB status=PROVEN$' "$T/fam" && grep -aq '^  SEED FAMILY_FLASH_ATTN_BATCH_DIRECT_VS_SINGLE_VEC_REDUCE sites=CP4-HEADS-RAW status=PROVEN' "$T/fam" \
    && grep -aq '^FAMILY name=hc_post verdict=PROVEN_DIFFERENT .*model_first_divergence=row:0,layer:0,cp6_attn_residual,after_attn_hc' "$T/fam" \
    && ok "families in the seed's terms: $(grep -a 'SEED FAMILY_Q8_0' "$T/fam" | sed 's/^ *//')" || { bad "deepseek4 families"; grep -a "SEED\|hc_post" "$T/fam"; }

# ---- HCA compressed attention (ratio 128) -------------------------------------------
# comp_exact LABEL MODEL: a compressed model's exactness on the 126-token
# prompt P3 and the 42-token P: greedy / seeded text with 1-3 threads and
# speculative at every width (and with full verify blocks) == plain; diverge
# over a verify block after each prompt == its decodes, and the text, on
# every SIMD level.
comp_exact() {
    plain_hashes "$T/$1.h" "$2" "$P3"
    threads_equal "$1" "$2" "$P3"
    $D make-drafter -m "$2" -o "$T/$1.d.gguf" --n-layer 1 --block-size 6 --seed 3 2>/dev/null || bad "make-drafter ($1 target)"
    spec_widths "$1" "$2" "$T/$1.d.gguf" "$T/g" "$T/s" "$P3"
    $D generate -m "$2" -md "$T/$1.d.gguf" -p "$P3" -n 48 -t 2 --oracle-accept rate:1 >"$T/co" 2>/dev/null \
        && cmp -s "$T/g" "$T/co" && ok "$1 oracle acceptance: full verify blocks == plain" || bad "$1 oracle acceptance"
    for lv in portable avx2 avxvnni avx512; do
        env DSPARK_SIMD=$lv $D diverge -m "$2" -p "$P" --block-greedy 8 >"$T/dv1" 2>&1 && grep -q '^FIRST_DIVERGENCE NONE' "$T/dv1" \
            && env DSPARK_SIMD=$lv $D diverge -m "$2" -p "$P3" --block-greedy 8 >"$T/dv2" 2>&1 && grep -q '^FIRST_DIVERGENCE NONE' "$T/dv2" \
            && ok "$1 verify(8) == 8 decodes at positions 42.. and 126.. (DSPARK_SIMD=$lv)" \
            || { bad "$1 diverges (DSPARK_SIMD=$lv)"; grep -a '^FIRST\|rror' "$T/dv1" "$T/dv2"; }
        env DSPARK_SIMD=$lv $D generate -m "$2" -p "$P3" -n 48 -t 2 >"$T/cg" 2>/dev/null && cmp -s "$T/g" "$T/cg" \
            && ok "$1 text equal on DSPARK_SIMD=$lv" || bad "$1 text differs on DSPARK_SIMD=$lv"
    done
}
P3="$P $P $P"
$D make-model -o "$T/c.gguf" $MK --compress-ratios 128,0 2>/dev/null || bad "make-model --compress-ratios 128,0"
comp_exact HCA "$T/c.gguf"
$D generate -m "$T/c.gguf" -p "$P3 $P" -n 16 -t 2 >"$T/cl2" 2>/dev/null && $D generate -m "$T/c.gguf" -p "$P3 $P" -n 16 -t 1 >"$T/cl1" 2>/dev/null \
    && [ -s "$T/cl2" ] && cmp -s "$T/cl1" "$T/cl2" && ok "HCA: block completed inside a prefill chunk, -t 1 == -t 2" || bad "HCA prefill"
$D diverge -m "$T/c.gguf" -p "$P3" --block-greedy 8 --fast ds4_compress >"$T/cdf" 2>&1
grep -q '^FIRST_DIVERGENCE row=1 layer=0 checkpoint=cp4_attn_heads' "$T/cdf" \
    && ok "--fast ds4_compress: $(grep '^FIRST_DIVERGENCE' "$T/cdf") (row 1 = position 127 completes block 0)" \
    || { bad "--fast ds4_compress not found at row 1's heads"; grep -a '^FIRST' "$T/cdf"; }
expect_err "make-model: a ratio other than 0/4/128" "compress-ratios" $D make-model -o "$T/bad.gguf" $MK --compress-ratios 0,64
expect_err "make-model: wrong ratio count" "one ratio per layer" $D make-model -o "$T/bad.gguf" $MK --compress-ratios 0,128,0

# ---- CSA compressed attention (ratio 4) with the lightning indexer ---------------------
# top-3 of up to 43 blocks: the selection matters from position 15 on
$D make-model -o "$T/x.gguf" $MK --compress-ratios 4,128 --n-indexer-head 2 --indexer-dim 32 --indexer-top-k 3 2>/dev/null \
    || bad "make-model --compress-ratios 4,128"
comp_exact CSA "$T/x.gguf"
$D diverge -m "$T/x.gguf" -p "$P" --block-greedy 8 --fast ds4_compress >"$T/xdf" 2>&1
# rows 1 and 5 (positions 43, 47) complete blocks; row 0 sees only the prompt's
# blocks, so the first divergence is a later row's heads (the one whose
# top-3 first takes a block pooled in this verify)
grep -q '^FIRST_DIVERGENCE row=[1-7] layer=0 checkpoint=cp4_attn_heads' "$T/xdf" \
    && ok "CSA --fast ds4_compress: $(grep '^FIRST_DIVERGENCE' "$T/xdf")" \
    || { bad "CSA --fast ds4_compress not found at a later row's heads"; grep -a '^FIRST' "$T/xdf"; }
# llama.cpp de3ff81 on an F32 4,128 file, indexer key length 128 (its CPU
# build aborts at load on these Q8_0 files and on an indexer key length of
# 32, and SIGFPEs on a file without a ratio-4 layer): 48 greedy tokens after
# the 126-token prompt (top-3 of up to 43 blocks; HCA block 0 completes in decode)
$D make-model -o "$T/xf.gguf" $(echo "$MK" | sed 's/q8_0/f32/') --compress-ratios 4,128 --n-indexer-head 2 \
    --indexer-top-k 3 2>/dev/null || bad "make-model f32 4,128"
$D generate -m "$T/xf.gguf" -p "$P3" -n 48 -t 2 >"$T/xfg" 2>/dev/null || bad "generate f32 4,128"
LLAMA_BIN=${LLAMA_BIN:-/work/peer-src/build/bin} llama_agrees "deepseek4 CSA+HCA (f32, 4,128)" "$T/xf.gguf" "$T/xfg" "$P3"
$D families -m "$T/x.gguf" -p "$P" --block-greedy 6 >"$T/xfam" 2>&1 || bad "families on the CSA model"
grep -aq '^FAMILY name=ds4_indexer verdict=PROVEN_DIFFERENT' "$T/xfam" && grep -aq '^FAMILY name=ds4_compress verdict=PROVEN_DIFFERENT' "$T/xfam" \
    && ok "families: ds4_indexer and ds4_compress fast kernels differ ($(grep -a 'name=ds4_indexer' "$T/xfam" | grep -o 'mismatch_fraction=[0-9.e-]*'))" \
    || { bad "families ds4_indexer / ds4_compress"; grep -a 'ds4_' "$T/xfam"; }

# ---- refusals: one line, exit 2 ---------------------------------------------------
# a ratio-4 layer patched into a file without its tensors: the missing tensor, one line
python3 - "$T/m.gguf" "$T/b1.gguf" <<'PY'
import sys, struct
b = bytearray(open(sys.argv[1], 'rb').read())
k = b'deepseek4.attention.compress_ratios'
i = b.index(k) + len(k) + 4 + 4 + 8          # value type, element type, count, then the ratios
b[i:i + 4] = struct.pack('<i', 4)            # layer 0: a compressed (CSA) layer
open(sys.argv[2], 'wb').write(b)
PY
expect_err "CSA layer without its compressor tensors" "attn_compressor" $D generate -m "$T/b1.gguf" -p hi -n 1
python3 -c "import sys,struct; b=bytearray(open(sys.argv[1],'rb').read()); k=b'deepseek4.attention.compress_ratios'; i=b.index(k)+len(k)+16; b[i:i+4]=struct.pack('<i',64); open(sys.argv[2],'wb').write(b)" "$T/m.gguf" "$T/b3.gguf"
expect_err "compress ratio 64" "0, 4 and 128" $D generate -m "$T/b3.gguf" -p hi -n 1
python3 -c "import sys; b=open(sys.argv[1],'rb').read(); open(sys.argv[2],'wb').write(b.replace(b'deepseek4.expert_gating_func', b'deepseek4.expert_gating_fXnc', 1))" "$T/m.gguf" "$T/b2.gguf"
expect_err "no gating function" "expert_gating_func" $D generate -m "$T/b2.gguf" -p hi -n 1
exit $fail
