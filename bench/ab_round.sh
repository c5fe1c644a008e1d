#!/bin/sh
# ab_round.sh OLD_DSPARK NEW_DSPARK — `dspark bench --profile-round` of two
# builds, interleaved (old, new, old, new, ...): a decode step, a draft round
# (with confidences), the selecting verify of gamma + 1 rows and the commit,
# each as a multiple of the same run's decode step, and the round (draft +
# verify + commit) in decode steps = the tokens per round speculation needs
# to break even. With THREADS=1 the profile reads the thread's CPU clock
# (other processes' time slices excluded), so it is the steadiest view a
# shared machine gives. Medians over REPS runs (each run itself a median of
# --reps 21), the new/old ratio and the spread (max/min).
set -eu
A=$1; B=$2
REPS=${REPS:-5}; TH=${THREADS:-1}
Q8=models/dspark-tiny-q8_0.gguf; DR=${DRAFTER:-models/dspark-tiny-drafter-q8_0.gguf}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
echo "# ab_round.sh threads=$TH reps=$REPS drafter=$DR load_before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$REPS"); do
    for side in a b; do
        [ $side = a ] && D=$A || D=$B
        "$D" bench -m $Q8 -md "$DR" --profile-round -t "$TH" --reps 21 2>&1 | sed -n 's/^decode_us=.*$/&/p' | tr ' ' '\n' >"$T/o"
        for k in decode_us draft_round_us draft_over_decode verify_over_decode round_over_decode; do
            sed -n "s/^$k=//p" "$T/o" >>"$T/${k}_$side"
        done
    done
done
med() { sort -g "$1" | awk '{a[NR]=$1} END{if(NR==0){print "nan"; exit} print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
spread() { sort -g "$1" | awk 'NR==1{lo=$1} {hi=$1} END{if(NR==0||lo==0){print "nan"; exit} printf "%.2f", hi/lo}'; }
printf '%-24s %10s %10s %9s %13s\n' metric old new new/old 'spread(o,n)'
for k in decode_us draft_round_us draft_over_decode verify_over_decode round_over_decode; do
    a=$(med "$T/${k}_a"); b=$(med "$T/${k}_b")
    printf '%-24s %10s %10s %9s %6s,%6s\n' "$k" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN{printf (a>0)?"%.3f":"nan", b/a}')" "$(spread "$T/${k}_a")" "$(spread "$T/${k}_b")"
done
echo "# load_after: $(cut -d' ' -f1-3 /proc/loadavg)"
