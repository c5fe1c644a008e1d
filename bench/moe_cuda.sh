#!/bin/sh
# moe_cuda.sh — the mixture of experts on the GPU (issue 26): a
# Qwen3-30B-A3B-shaped qwen3moe file (n_embd 2048, 32 heads, 4 KV heads,
# head_dim 128, 128 experts, 8 used, expert FFN 768, vocab 151936, Q8_0) with
# LAYERS layers (default 8 of the real model's 48, so that make-model writes
# ~6 GB (5.6B parameters), not ~33 GB: per-layer costs scale, the embedding
# and the head are the full model's), and `dspark bench --device cuda` on it: decode tok/s,
# the batched forward at M = 1..16 as a ratio to a decode step (verify(8) is
# the M = 8 row), batched prefill tok/s. With DSPARK_CUDA_ON=moeid (opt-in
# until a GPU has run it), calls of at most 64 assignments
# (M x 8 experts: decode, verify(8)) run the experts by id on the device
# (matmul_id: no host read of the route, recorded as CUDA graphs); wider
# ones download the route's ids once per MoE layer and group on the host.
#   LAYERS=8  REPS=5  PREFILL=512,2048  MODELS_DIR=/tmp/dspark-models
#   AB=1            an A/B of the two paths, interleaved: bench with the
#                   experts by id (DSPARK_CUDA_ON=moeid), then with DSPARK_CUDA_OFF=moeid
#                   (every MoE layer groups on the host, nothing recorded),
#                   ROUNDS times (default 2); JSON per run in
#                   bench/results/moe-cuda-L$LAYERS-{id,host}-R.json
#   CHECK_CPU=1     first: 16 greedy tokens on cuda == on cpu (the exactness
#                   contract on this shape; 0 skips it)
#   LLAMA_BIN=DIR   llama.cpp's build/bin (CUDA build): llama-bench -ngl 99
#                   -fa 1 on the same file, right after dspark's run
# Text on stdout and in bench/results/moe-cuda-L$LAYERS.txt, dspark's JSON in
# bench/results/moe-cuda-L$LAYERS.json.
set -eu
B=${BUILD:-build}
D=$B/dspark
R=bench/results
mkdir -p "$R"
LAYERS=${LAYERS:-8}
REPS=${REPS:-5}
PREFILL=${PREFILL:-512,2048}
MD=${MODELS_DIR:-/tmp/dspark-models}
mkdir -p "$MD"
$D devices --require cuda >/dev/null || { echo "moe_cuda.sh: no usable CUDA device" >&2; exit 2; }
F="$MD/a3b-L$LAYERS-q8_0.gguf"
OUT="$R/moe-cuda-L$LAYERS.txt"
{
    echo "== qwen3moe, Qwen3-30B-A3B layer shape, $LAYERS layers, Q8_0 =="
    $D devices
    echo "host: $(lscpu | sed -n 's/^Model name: *//p') load_average=$(cut -d' ' -f1-3 /proc/loadavg)"
    if [ ! -f "$F" ]; then
        t0=$(date +%s)
        $D make-model -o "$F" --arch qwen3moe --type q8_0 --n-embd 2048 --n-layer "$LAYERS" --n-head 32 --n-head-kv 4 \
            --head-dim 128 --n-ff 6144 --n-expert 128 --n-expert-used 8 --n-ff-exp 768 --n-vocab 151936 --n-ctx 4096 \
            --seed 1 >/dev/null
        echo "make-model: $(( $(date +%s) - t0 )) s"
    fi
    echo "file: $F ($(du -h "$F" | cut -f1))"
    if [ "${CHECK_CPU:-1}" = 1 ]; then
        P="The river was quiet in the morning, and the boats waited by the old stone bridge."
        $D generate --device cuda -m "$F" -p "$P" -n 16 >"$MD/moe-g.cuda" 2>"$MD/moe-g.cuda.err"
        $D generate --device cpu -m "$F" -p "$P" -n 16 >"$MD/moe-g.cpu" 2>/dev/null
        if cmp -s "$MD/moe-g.cuda" "$MD/moe-g.cpu"; then echo "PASS 16 greedy tokens: cuda == cpu"
        else echo "FAIL 16 greedy tokens: cuda != cpu"; fi
        echo "generate (cuda): $(tail -1 "$MD/moe-g.cuda.err")"
    fi
    if [ "${AB:-0}" = 1 ]; then
        for r in $(seq 1 "${ROUNDS:-2}"); do
            echo "== round $r: experts by id (DSPARK_CUDA_ON=moeid) =="
            DSPARK_CUDA_ON=moeid $D bench --device cuda -m "$F" --reps "$REPS" --prefix 64 --decode 64 --prefill-len "$PREFILL" \
                --json "$R/moe-cuda-L$LAYERS-id-$r.json"
            echo "== round $r: host grouping (DSPARK_CUDA_OFF=moeid) =="
            DSPARK_CUDA_OFF=moeid $D bench --device cuda -m "$F" --reps "$REPS" --prefix 64 --decode 64 --prefill-len "$PREFILL" \
                --json "$R/moe-cuda-L$LAYERS-host-$r.json"
        done
    else
        $D bench --device cuda -m "$F" --reps "$REPS" --prefix 64 --decode 64 --prefill-len "$PREFILL" --json "$R/moe-cuda-L$LAYERS.json"
    fi
    if [ -n "${LLAMA_BIN:-}" ] && [ -x "$LLAMA_BIN/llama-bench" ]; then
        echo "== llama.cpp ($LLAMA_BIN), the same file =="
        "$LLAMA_BIN/llama-bench" -m "$F" -ngl 99 -fa 1 -p "$(echo "$PREFILL" | cut -d, -f1)" -n 64 -r "$REPS" 2>/dev/null \
            | grep -E 'model|pp|tg' || echo "llama-bench did not run"
    fi
} 2>&1 | tee "$OUT"
