#!/bin/sh
# peer_cpu.sh — dspark against llama.cpp's CPU build on the same files, in the
# same run (issue 24): decode tok/s (llama-bench tg, dspark bench decode after
# a 1-token prefix) and prefill tok/s (pp), the two engines interleaved round by
# round so the shared machine's drift hits both alike. Prints the CPU model,
# the SIMD level dspark ran, the load average before and after, per file and
# thread count the medians over ROUNDS and dspark/llama.cpp, and the spread
# (max / min over the rounds) of each side, and each side's CPU share with,
# for one thread, the ratio per CPU-second (below). bench/run.sh calls it.
#
#   LLAMA_BIN=DIR   llama.cpp's build/bin (llama-bench); without it: skipped.
#                   For an AVX2-only comparison on an AVX-512 machine build it
#                   AVX2-only (-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON
#                   -DGGML_FMA=ON -DGGML_F16C=ON, the AVX-512 options off) and
#                   run with DSPARK_SIMD=avx2.
#   FILES="a.gguf b.gguf"  default: the shipped target as Q8_0, Q4_K_M, F16
#                   and the 505 MB make-model Q8_0 shape (made under $TMPDIR)
#   THREADS="1 2" ROUNDS=3 NGEN=64 NPROMPT=512
set -eu
B=${BUILD:-build}
D=$B/dspark
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-"1 2"}
NGEN=${NGEN:-64}
NPROMPT=${NPROMPT:-512}
LB=${LLAMA_BIN:-}
if [ -z "$LB" ] || [ ! -x "$LB/llama-bench" ]; then
    echo "peer_cpu: LLAMA_BIN (llama.cpp's build/bin with llama-bench) not set or not built: skipped"
    exit 0
fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
TMPM=${TMPDIR:-/tmp}/dspark-peer-models
mkdir -p "$TMPM"
if [ -z "${FILES:-}" ]; then
    [ -f "$TMPM/tiny-q4_k_m.gguf" ] || $D quantize models/dspark-tiny-f16.gguf "$TMPM/tiny-q4_k_m.gguf" q4_k_m >/dev/null 2>&1
    [ -f "$TMPM/m505-q8_0.gguf" ] || $D make-model -o "$TMPM/m505-q8_0.gguf" --type q8_0 --n-embd 1024 --n-layer 28 \
        --n-head 16 --n-head-kv 8 --head-dim 128 --n-ff 3072 --n-vocab 32000 --n-ctx 4096 --seed 1 >/dev/null
    FILES="models/dspark-tiny-q8_0.gguf $TMPM/tiny-q4_k_m.gguf models/dspark-tiny-f16.gguf $TMPM/m505-q8_0.gguf"
fi
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "== dspark vs llama.cpp (CPU) =="
simd=$($D generate -m models/dspark-tiny-q8_0.gguf -p x -n 1 -v 2>&1 >/dev/null | sed -n 's/.* simd=\([a-z0-9]*\).*/\1/p' | head -1)
echo "cpu=\"$cpu\" cores=$(nproc) dspark_simd=$simd DSPARK_SIMD=${DSPARK_SIMD:-unset}"
echo "llama_bin=$LB load_before=\"$(cut -d' ' -f1-3 /proc/loadavg)\" rounds=$ROUNDS n_gen=$NGEN n_prompt=$NPROMPT"
# Each process's CPU share, (user + sys) / wall over its whole life (load
# and warm-up included): on a machine shared with other jobs a 1-thread run
# gets a fraction of a core, and not the same fraction for both engines.
# With one thread, tok/s divided by the share estimates the speed on a core
# of its own ("per cpu-s" columns); with more, spinning workers make CPU
# time no measure of work, so the wall-clock ratio is all there is.
timed() { if [ -x /usr/bin/time ]; then /usr/bin/time -f %e,%U,%S -o "$T/tm" "$@"; else "$@"; fi; }
cpu_share() {
    if [ -s "$T/tm" ]; then awk -F, 'END { if ($1 > 0) printf "%.4f\n", ($2 + $3) / $1; else print "nan" }' "$T/tm"
    else echo nan; fi
    rm -f "$T/tm"
}
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for f in $FILES; do
        k=$(basename "$f" .gguf)
        for t in $THREADS; do
            timed $D bench -m "$f" -t "$t" --reps 1 --prefix 1 --decode "$NGEN" --prefill-len "$NPROMPT" >"$T/ds" 2>&1 \
                || { echo "peer_cpu: dspark bench failed on $f"; cat "$T/ds"; exit 1; }
            cpu_share >>"$T/sd.$k.$t"
            sed -n 's/^decode: .*  \([0-9.]*\) tok\/s.*/\1/p' "$T/ds" | head -1 >>"$T/dd.$k.$t"
            sed -n 's/^prefill([0-9]*): \([0-9.]*\) tok\/s.*/\1/p' "$T/ds" | head -1 >>"$T/dp.$k.$t"
            timed "$LB/llama-bench" -m "$f" -t "$t" -r 1 -p "$NPROMPT" -n "$NGEN" -o csv >"$T/lb" 2>/dev/null \
                || { echo "peer_cpu: llama-bench failed on $f"; exit 1; }
            cpu_share >>"$T/sl.$k.$t"
            # csv: the column avg_ts; the pp row has n_gen=0, the tg row n_prompt=0
            python3 - "$T/lb" "$T/ld.$k.$t" "$T/lp.$k.$t" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows:
    out = sys.argv[2] if int(r["n_prompt"]) == 0 else sys.argv[3]
    open(out, "a").write(r["avg_ts"] + "\n")
PY
        done
    done
    r=$((r + 1))
done
echo "load_after=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
python3 - "$T" "$FILES" "$THREADS" <<'PY'
import os, statistics, sys
T, files, threads = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def vals(n):
    return [float(x) for x in open(os.path.join(T, n)).read().split()] if os.path.exists(os.path.join(T, n)) else []
def med_spread(v):
    return (statistics.median(v), max(v) / min(v)) if v and min(v) > 0 else (float("nan"), float("nan"))
print(f"{'file':22} {'t':>2} {'decode dspark':>13} {'llama.cpp':>10} {'ratio':>6} {'spread d,l':>11}   "
      f"{'prefill dspark':>14} {'llama.cpp':>10} {'ratio':>6} {'spread d,l':>11}   "
      f"{'cpu share d,l':>13} {'per cpu-s: decode':>17} {'prefill':>7}")
def per_cpu(a, sa, b, sb):
    # per round: (dspark tok/s / its share) / (llama.cpp tok/s / its share); the median
    r = [(x / p) / (y / q) for x, p, y, q in zip(a, sa, b, sb) if p > 0 and q > 0 and y > 0]
    return statistics.median(r) if r else float("nan")
for f in files:
    k = os.path.basename(f)[:-5]
    for t in threads:
        dd, ds_ = med_spread(vals(f"dd.{k}.{t}")); ld, ls = med_spread(vals(f"ld.{k}.{t}"))
        dp, ps = med_spread(vals(f"dp.{k}.{t}")); lp, lps = med_spread(vals(f"lp.{k}.{t}"))
        sd, sl = vals(f"sd.{k}.{t}"), vals(f"sl.{k}.{t}")
        shares = f"{statistics.median(sd):5.2f},{statistics.median(sl):5.2f}" if sd and sl else "nan"
        if t == "1":
            nd = per_cpu(vals(f"dd.{k}.{t}"), sd, vals(f"ld.{k}.{t}"), sl)
            np_ = per_cpu(vals(f"dp.{k}.{t}"), sd, vals(f"lp.{k}.{t}"), sl)
            norm = f"{nd:17.2f} {np_:7.2f}"
        else:
            norm = f"{'-':>17} {'-':>7}"
        print(f"{k:22} {t:>2} {dd:13.1f} {ld:10.1f} {dd / ld:6.2f} {ds_:5.2f},{ls:5.2f}   "
              f"{dp:14.1f} {lp:10.1f} {dp / lp:6.2f} {ps:5.2f},{lps:5.2f}   {shares:>13} {norm}")
PY
