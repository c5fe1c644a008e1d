#!/bin/sh
# bench/serve.sh — `dspark serve` under 1, 4, 8, 16 concurrent streaming
# clients on the shipped target (models/, Q8_0 when `make models` made it):
# the batch engine (the default, `--gen engine`: one scheduler thread, every
# running request a sequence sharing each forward) against one context per
# slot (`--gen ctx`, each request alone on its context: what `dspark serve`
# was before the engine), plain decoding on both, and the same with the
# drafter (ctx+spec: speculative decoding, the old default with -md),
# interleaved rounds
# (bench/serve_load.py). Results are appended to bench/results/serve-cpu.txt
# with the CPU and the load average (this machine is shared: ratios, not
# absolute times).
#
#   sh bench/serve.sh [ROUNDS] [CONCURRENCY,...]
# Environment: BUILD (build), THREADS (2), CTX_PARALLEL (2: the old default
# shape --parallel 2 -t 1 uses the same two cores), ENGINE_PARALLEL (16),
# OUT (bench/results/serve-cpu.txt), PER, MAX_TOKENS (serve_load.py); SPEC_AB=1:
# engine plain vs engine+drafter, batched drafting passes vs one drafter
# forward per sequence (DSPARK_DRAFT_PASS=1), nothing else.
#
# DEVICE=cuda (the H200): the engine plain and with the drafter (-md, when
# DRAFTER names one or the shipped drafter is the model's; -t THREADS, 8:
# the host threads that sample what the device declines), and, when
# LLAMA_SERVER names llama.cpp's llama-server, that server on the same file
# (-ngl 99 -fa on -np ENGINE_PARALLEL), in the same interleaved rounds.
# MODEL (the shipped target) and DRAFTER ("" for none) pick the files;
# OUT defaults to bench/results/serve-cuda.txt.
set -eu
if [ "${DEVICE:-cpu}" = cuda ]; then
    B=${BUILD:-build}
    ROUNDS=${1:-3}
    CONC=${2:-1,4,16,64}
    EP=${ENGINE_PARALLEL:-64}
    OUT=${OUT:-bench/results/serve-cuda.txt}
    TGT=${MODEL:-models/dspark-tiny-q8_0.gguf}
    DR=${DRAFTER-models/dspark-tiny-drafter-q8_0.gguf}
    mkdir -p "$(dirname "$OUT")"
    {
        echo "==== bench/serve.sh DEVICE=cuda $(date -u +%Y-%m-%dT%H:%M:%SZ) git $(git rev-parse --short HEAD 2>/dev/null || echo -)"
        echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1); cpu: $(nproc) cores"
        echo "model: $TGT; drafter: ${DR:-none}; engine: --device cuda --parallel $EP -t ${THREADS:-8}; peer: ${LLAMA_SERVER:-none} -ngl 99 -fa on -np $EP -c $((EP * 256))"
    } >> "$OUT"
    HT=${THREADS:-8}   # the host threads that sample the rows a device declines (top-p, top-k, min-p)
    set -- "engine=-m $TGT --device cuda --gen engine --parallel $EP -t $HT --queue 1024"
    [ -n "$DR" ] && set -- "$@" "engine+spec=-m $TGT -md $DR --device cuda --gen engine --parallel $EP -t $HT --queue 1024"
    [ -n "${LLAMA_SERVER:-}" ] && set -- "$@" "llama-server=peer:-m $TGT -ngl 99 -fa on -np $EP -c $((EP * 256))"
    DSPARK_BIN=$B/dspark python3 bench/serve_load.py "$OUT" "$ROUNDS" "$CONC" "$@"
    exit $?
fi
B=${BUILD:-build}
ROUNDS=${1:-3}
CONC=${2:-1,4,8,16}
T=${THREADS:-2}
CP=${CTX_PARALLEL:-2}
EP=${ENGINE_PARALLEL:-16}
OUT=${OUT:-bench/results/serve-cpu.txt}
TGT=models/dspark-tiny-q8_0.gguf
[ -f "$TGT" ] || TGT=models/dspark-tiny-f16.gguf
DR=models/dspark-tiny-drafter-q8_0.gguf
[ -f "$DR" ] || DR=models/dspark-tiny-drafter-f16.gguf
mkdir -p "$(dirname "$OUT")"
{
    echo "==== bench/serve.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) git $(git rev-parse --short HEAD 2>/dev/null || echo -)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "model: $TGT (drafter for ctx+spec: $DR); engine: --parallel $EP -t 1 and -t $T (--batch 512 --ubatch 64, prefix cache on); ctx: --parallel $CP -t $((T / CP > 0 ? T / CP : 1))"
} >> "$OUT"
if [ -n "${SPEC_AB:-}" ]; then
    # SPEC_AB=1: the engine plain against the engine with the drafter, its
    # rounds batched (one drafter forward for every drafting sequence of a
    # step, the default) and one drafter forward per sequence
    # (DSPARK_DRAFT_PASS=1), -t T, interleaved
    echo "spec A/B: engine --parallel $EP -t $T plain | -md $DR batched drafting passes | -md $DR DSPARK_DRAFT_PASS=1" >> "$OUT"
    DSPARK_BIN=$B/dspark python3 bench/serve_load.py "$OUT" "$ROUNDS" "$CONC" \
        "engine=-m $TGT --gen engine --parallel $EP -t $T --queue 256" \
        "spec-batch=-m $TGT -md $DR --gen engine --parallel $EP -t $T --queue 256" \
        "spec-seq=DSPARK_DRAFT_PASS=1 -m $TGT -md $DR --gen engine --parallel $EP -t $T --queue 256"
    echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT"
    exit 0
fi
DSPARK_BIN=$B/dspark python3 bench/serve_load.py "$OUT" "$ROUNDS" "$CONC" \
    "ctx=-m $TGT --gen ctx --parallel $CP -t $((T / CP > 0 ? T / CP : 1)) --queue 256" \
    "ctx+spec=-m $TGT -md $DR --gen ctx --parallel $CP -t $((T / CP > 0 ? T / CP : 1)) --queue 256" \
    "engine-t1=-m $TGT --gen engine --parallel $EP -t 1 --queue 256" \
    "engine-t$T=-m $TGT --gen engine --parallel $EP -t $T --queue 256"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT"
