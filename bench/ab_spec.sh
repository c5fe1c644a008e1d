#!/bin/sh
# ab_spec.sh OLD_DSPARK NEW_DSPARK — the speculative / plain ratio of two
# builds on the shipped pair as `make run` runs it (Q8_0 target, Q8_0
# drafter, canonical + direct, 128 tokens), interleaved per rep (old plain,
# old spec, new plain, new spec, ...) so the shared CPU's drift hits both
# builds alike. Each rep's ratio is spec / plain of the SAME build measured
# back to back; the table shows medians over reps, the new/old ratio of the
# medians and the spread (max/min) of each, plus the load average.
#   THREADS (2) REPS (7) DRAFTER (models/dspark-tiny-drafter-q8_0.gguf)
#   EXTRA: extra flags for the speculative run (e.g. "--draft-sched table")
#   EXTRA_NEW: extra flags for the new build only
set -eu
A=$1; B=$2
REPS=${REPS:-7}; TH=${THREADS:-2}
Q8=models/dspark-tiny-q8_0.gguf; DR=${DRAFTER:-models/dspark-tiny-drafter-q8_0.gguf}
P=${PROMPT:-"It is a truth universally acknowledged, that"}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
echo "# ab_spec.sh threads=$TH reps=$REPS drafter=$DR extra='${EXTRA:-}' extra_new='${EXTRA_NEW:-}' load_before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$REPS"); do
    for side in a b; do
        if [ $side = a ]; then D=$A; X=${EXTRA:-}; else D=$B; X="${EXTRA:-} ${EXTRA_NEW:-}"; fi
        pl=$("$D" generate -m $Q8 -p "$P" -n 128 -t "$TH" 2>&1 >/dev/null | sed -n 's/.*decode_tok_s=\([0-9.]*\).*/\1/p')
        # shellcheck disable=SC2086
        sp=$("$D" generate -m $Q8 -md "$DR" -p "$P" -n 128 -t "$TH" $X 2>&1 >"$T/out_$side" | sed -n 's/.*tok_s=\([0-9.]*\)$/\1/p')
        echo "$pl" >>"$T/plain_$side"; echo "$sp" >>"$T/spec_$side"
        awk -v a="$pl" -v b="$sp" 'BEGIN{printf "%.4f\n", b/a}' >>"$T/ratio_$side"
    done
done
med() { sort -g "$1" | awk '{a[NR]=$1} END{if(NR==0){print "nan"; exit} print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
spread() { sort -g "$1" | awk 'NR==1{lo=$1} {hi=$1} END{if(NR==0||lo==0){print "nan"; exit} printf "%.2f", hi/lo}'; }
printf '%-24s %10s %10s %9s %13s\n' metric old new new/old 'spread(o,n)'
for k in plain spec ratio; do
    case $k in plain) n="plain tok/s";; spec) n="spec tok/s";; ratio) n="spec/plain (per rep)";; esac
    a=$(med "$T/${k}_a"); b=$(med "$T/${k}_b")
    printf '%-24s %10s %10s %9s %6s,%6s\n' "$n" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN{printf (a>0)?"%.3f":"nan", b/a}')" "$(spread "$T/${k}_a")" "$(spread "$T/${k}_b")"
done
cmp -s "$T/out_a" "$T/out_b" && echo "spec text old == new: yes" || echo "spec text old == new: NO"
echo "# load_after: $(cut -d' ' -f1-3 /proc/loadavg)"
