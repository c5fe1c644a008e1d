#!/bin/sh
# tests/cuda/run.sh — `make test-cuda`: the GPU half of the exactness
# proof. Without a CUDA build or a GPU it says so and exits 0.
#   1. the CUDA op harness (every family x variant x type vs the CPU
#      reference; canonical property per op; counter-tests), if built;
#   2. the model-level suites on the GPU (DSPARK_DEVICE=cuda; test_engine: many sequences per batch == each alone; test_spec_batch: speculative rounds of many sequences == plain alone; test_tp: --tp 1 vs 2 vs 4 on the GPU, the dev communicator == the cpu fake): the canonical
#      property (logits, every layer's K/V, taps; M = 1..16 around the
#      chunk boundaries; F32/F16/BF16/Q8_0; Qwen3 and Llama), trained
#      weights, diverge (gate, NONE, each fast family alone found and
#      attributed, CPU-vs-GPU cross mode, the capture arena of same-stream
#      device copies == per-row downloads byte for byte, a bit planted in
#      the device arena caught exactly), speculative == plain (its
#      comparison catches a planted token flip), the drafter (tier1, tier2
#      against the reference, the one-launch head chain == op by op);
#   3. the golden outputs on the GPU (bit-identical to the CPU's where the
#      CUDA canonical kernels match the CPU's bits), and the mixture of
#      experts through the CLI (tests/cuda/moe_cli.sh: text, logits and
#      golden_moe.sha256 == the CPU's, spec == plain, diverge), and tensor
#      parallelism on the one GPU (tests/cuda/tp_cli.sh: --tp 2 == --tp 1);
#   4. the diagnostics through the CLI on the shipped pair with --device
#      cuda (tests/cuda/diag_cli.sh, one line per case): surface canonical =
#      0 and fast > 0, diverge on the drafter's block, families (each fast
#      family alone found at a checkpoint it produces), sweep to C_min.
BUILD=${BUILD:-build}
D="$BUILD/dspark"
# The test programs live in $BUILD/tests, where the CUDA module's search (next
# to the program, ../lib, the library path) does not look: name it.
DSPARK_CUDA_MODULE=${DSPARK_CUDA_MODULE:-$BUILD/libdspark-cuda.so}
export DSPARK_CUDA_MODULE
if ! "$D" devices --require cuda >/dev/null 2>&1; then
    echo "test-cuda: no usable CUDA device here ($("$D" devices 2>&1 | grep cuda || echo "this build has no CUDA backend")); nothing to run"
    echo "0 passed, 0 failed"
    exit 0
fi
"$D" devices
pass=0; fail=0; failed=""
one() {
    name=$1; shift
    start=$(date +%s)
    if "$@" >"$BUILD/tests/cuda_$name.log" 2>&1; then
        pass=$((pass+1)); printf 'PASS %-32s %ss\n' "$name" $(( $(date +%s) - start ))
    else
        fail=$((fail+1)); failed="$failed $name"
        printf 'FAIL %-32s (log: %s)\n' "$name" "$BUILD/tests/cuda_$name.log"
        tail -n 25 "$BUILD/tests/cuda_$name.log" | sed 's/^/    /'
    fi
    grep -E '^(PASS|FAIL|SKIP|INFO)' "$BUILD/tests/cuda_$name.log" | head -60 | sed 's/^/    /'
}
mkdir -p "$BUILD/tests"
for t in "$BUILD"/tests/cuda/test_*; do
    [ -x "$t" ] && one "$(basename "$t")" "$t"
done
# the Q8_0 GEMVs at M <= 8 (q8w, its configurations) == q8v bit for bit on the 8B shapes and tails
[ -x "$BUILD/tests/cuda/bench_gemv" ] && one bench_gemv_check "$BUILD/tests/cuda/bench_gemv" --check
# the prefill attention tile == the split-KV path (outputs and Q8_0 copy) and the CPU on the 8B shape
[ -x "$BUILD/tests/cuda/bench_attn" ] && one bench_attn_check "$BUILD/tests/cuda/bench_attn" --check
for t in test_canonical test_diverge test_models test_spec test_drafter test_engine test_spec_batch; do
    [ -x "$BUILD/tests/$t" ] && one "$t" env DSPARK_DEVICE=cuda "$BUILD/tests/$t"
done
# the engine's recorded verify chunks (DSPARK_ENGINE_GRAPHS=2, off by default): the same bytes
[ -x "$BUILD/tests/test_spec_batch" ] && one test_spec_batch_graphs2 env DSPARK_DEVICE=cuda DSPARK_ENGINE_GRAPHS=2 "$BUILD/tests/test_spec_batch"
# test_engine above runs the attention tile path over several sequences' runs
# (chunks of 512 tiled against chunks of 1 and 7, never tiled); with
# DSPARK_CUDA_OFF=runs every multi-sequence chunk takes the split path: the
# same bytes
[ -x "$BUILD/tests/test_engine" ] && one test_engine_noruns env DSPARK_DEVICE=cuda DSPARK_CUDA_OFF=runs "$BUILD/tests/test_engine"
# the MoE experts by id (opt-in: DSPARK_CUDA_ON=moeid): MoE chunks recorded and
# replayed, every row == alone; decode == batch on the id path
[ -x "$BUILD/tests/test_engine" ] && one test_engine_moeid env DSPARK_DEVICE=cuda DSPARK_CUDA_ON=moeid "$BUILD/tests/test_engine"
[ -x "$BUILD/tests/test_canonical" ] && one test_canonical_moeid env DSPARK_DEVICE=cuda DSPARK_CUDA_ON=moeid "$BUILD/tests/test_canonical"
one cli_golden env DSPARK_DEVICE=cuda BUILD="$BUILD" sh tests/cli_golden.sh
# the mixture of experts on the GPU: CPU bits, golden_moe.sha256, spec == plain, diverge
one moe_cli env DSPARK_DEVICE=cuda BUILD="$BUILD" sh tests/cuda/moe_cli.sh
# tensor parallelism on one GPU (--tp N, the dev communicator): --tp 2 == --tp 1 bytes and
# logits, 4 KV heads at --tp 1/2/4, fast tp_reduce moves bits, diverge --tp 2 NONE
# (--tp ranks on the GPU and rope scaling there are opt-in, DSPARK_CUDA_ON=tp / ropeext,
# until these have passed on a GPU; then the default flips and the refusal check goes)
[ -x "$BUILD/tests/test_tp" ] && one test_tp env DSPARK_DEVICE=cuda DSPARK_CUDA_ON=tp "$BUILD/tests/test_tp"
one tp_cli env DSPARK_DEVICE=cuda DSPARK_CUDA_ON=tp BUILD="$BUILD" sh tests/cuda/tp_cli.sh
one cli_rope env DSPARK_DEVICE=cuda DSPARK_CUDA_ON=ropeext BUILD="$BUILD" sh tests/cli_rope.sh   # rope scaling: CUDA logits == CPU, exactness
one opt_in_default_refused sh -c '"$1" make-model -o "$2" --arch llama --rope-freqs --n-layer 1 >/dev/null 2>&1 &&
    ! "$1" generate --device cuda -m "$2" -p x -n 1 2>"$3" && grep -q "DSPARK_CUDA_ON=ropeext" "$3" &&
    ! "$1" generate --device cuda -m models/dspark-tiny-q8_0.gguf -p x -n 1 --tp 2 2>"$3" && grep -q "DSPARK_CUDA_ON=tp" "$3"' \
    _ "$D" "$BUILD/tests/cuda_ropefreqs.gguf" "$BUILD/tests/cuda_optin.err"
for c in surface_canonical surface_fast diverge_drafter families sweep; do
    one "diag_$c" env DSPARK_DEVICE=cuda BUILD="$BUILD" sh tests/cuda/diag_cli.sh "$c"
done
# an unknown DSPARK_CUDA_OFF name is refused (one line, exit 2), not ignored
one cuda_off_unknown sh -c 'DSPARK_CUDA_OFF=q8x,bogus "$1" generate -m models/dspark-tiny-q8_0.gguf -p x -n 1 --device cuda \
    >/dev/null 2>"$2"; rc=$?; cat "$2"; [ "$rc" -eq 2 ] && grep -q "unknown path .bogus." "$2"' _ "$D" "$BUILD/tests/cuda_off.err"
one cuda_trace_bad sh -c 'DSPARK_CUDA_TRACE=yes "$1" generate -m models/dspark-tiny-q8_0.gguf -p x -n 1 --device cuda \
    >/dev/null 2>"$2"; rc=$?; cat "$2"; [ "$rc" -eq 2 ] && grep -q "DSPARK_CUDA_TRACE: .yes. is neither 0 nor 1" "$2" &&
    DSPARK_CUDA_TRACE=1 "$1" generate -m models/dspark-tiny-q8_0.gguf -p x -n 2 --device cuda 2>&1 >/dev/null | grep -q "^cuda_trace: op=" &&
    ! DSPARK_CUDA_TRACE=0 "$1" generate -m models/dspark-tiny-q8_0.gguf -p x -n 2 --device cuda 2>&1 >/dev/null | grep -q "^cuda_trace"' \
    _ "$D" "$BUILD/tests/cuda_trace.err"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
