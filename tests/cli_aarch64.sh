#!/bin/sh
# cli_aarch64.sh — the same bytes on AArch64 (issue 24 items 3 and 4). CI has
# no ARM machine, so this cross-builds dspark and two kernel suites with
# Debian's gcc-aarch64-linux-gnu (into $BUILD/aarch64, the arm64 libraries
# through Debian multiarch) and runs them under qemu-aarch64 (qemu-user, whose
# default CPU model "max" has the armv8.2 dotprod and the armv8.6 i8mm
# extensions, so the i8mm level is what runs, and test_matmul / test_kquant
# walk portable, neon, dotprod and i8mm):
#   - level detection: the default CPU runs i8mm, -cpu neoverse-n1 (dotprod,
#     no i8mm) dotprod, also with DSPARK_SIMD=i8mm (a cap above the CPU's
#     level), -cpu cortex-a72 (armv8.0) neon; `-v` says so;
#   - test_harden: DSPARK_SIMD takes portable|neon|dotprod|i8mm there and
#     refuses the x86 names;
#   - test_matmul and test_kquant: every canonical path on every AArch64
#     level == the scalar definition and == decode, memcmp (the NEON, SDOT
#     and SMMLA integer dots, the NEON tiles), their counter-tests;
#   - the AArch64 build's `dspark quantize` of the committed F16 target is
#     byte-identical to the x86 one (models/dspark-tiny-q8_0.gguf);
#   - the Q8_0 target and Q4_K / Q5_K / Q6_K targets (quantized here by the
#     x86 $BUILD/dspark): speculative output and raw logits at the neon,
#     dotprod and i8mm levels == the x86 build's (the NEON K-quant blocks and
#     the SMMLA tiles end to end);
#   - tests/cli_golden.sh with the AArch64 dspark: golden outputs equal the
#     hashes recorded on x86 (tests/data/golden.sha256): another ISA, another
#     libm, the same bits. Six of the 30 by default (Q8_0 and F16 targets;
#     plain and speculative, greedy and seeded; raw logits), all 30 with
#     AARCH64_GOLDEN=all (498 s here on a loaded machine: every one matched).
# Without the cross compiler, qemu-aarch64 or the arm64 libraries it prints
# one SKIP line and passes (`make deps` installs all three).
# Under qemu everything runs ~10-30x slower, so this is a small but real set.
BUILD=${BUILD:-build}
CROSS=${CROSS:-aarch64-linux-gnu-gcc}
QEMU=${QEMU:-qemu-aarch64}
missing=""
command -v "$CROSS" >/dev/null 2>&1 || missing="$missing $CROSS"
command -v "$QEMU" >/dev/null 2>&1 || missing="$missing $QEMU"
for lib in libpcre2-8.so libcjson.so libmicrohttpd.so; do
    [ -e "/usr/lib/aarch64-linux-gnu/$lib" ] || missing="$missing $lib:arm64"
done
if [ -n "$missing" ]; then
    echo "SKIP aarch64: not installed:$missing (make deps installs gcc-aarch64-linux-gnu, qemu-user and the arm64 libraries)"
    exit 0
fi
A="$BUILD/aarch64"
mkdir -p "$A"
A=$(cd "$A" && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
start=$(date +%s)
# the same Makefile and flags, another compiler; a command-line BUILD/CC/CUDA
# wins over what the calling make passes down in MAKEFLAGS
if ! make -j2 --no-print-directory BUILD="$A" CC="$CROSS" CUDA=0 OPT=-O3 SAN= \
        "$A/dspark" "$A/tests/test_matmul" "$A/tests/test_kquant" "$A/tests/test_harden" >"$T/build.log" 2>&1; then
    echo "FAIL aarch64_build:"; tail -n 30 "$T/build.log"; exit 1
fi
file_out=$(od -An -tx1 -j18 -N2 "$A/dspark" | tr -d ' ')
if [ "$file_out" = "b700" ]; then echo "PASS aarch64_build: $A/dspark is an AArch64 ELF ($(( $(date +%s) - start ))s)"
else echo "FAIL aarch64_build: $A/dspark has e_machine $file_out, not AArch64 (b7 00)"; exit 1; fi
Q="$QEMU"
lv=$($Q "$A/dspark" generate -m models/dspark-tiny-f16.gguf -p "The river" -n 1 -v 2>&1 >/dev/null |
     sed -n 's/.* simd=\([a-z0-9]*\) .*/\1/p' | head -n 1)
echo "INFO aarch64 level under $QEMU: simd=${lv:-unknown}"
# the run-time choice on CPUs without i8mm / dotprod (qemu's CPU models)
lv_of() { "$@" generate -m models/dspark-tiny-f16.gguf -p "The river" -n 1 -v 2>&1 >/dev/null |
          sed -n 's/.* simd=\([a-z0-9]*\) .*/\1/p' | head -n 1; }
got="$(lv_of $Q -cpu neoverse-n1 "$A/dspark") $(lv_of env DSPARK_SIMD=i8mm $Q -cpu neoverse-n1 "$A/dspark")"
got="$got $(lv_of $Q -cpu cortex-a72 "$A/dspark") $(lv_of env DSPARK_SIMD=dotprod $Q "$A/dspark")"
if [ "$got" = "dotprod dotprod neon dotprod" ]; then
    echo "PASS aarch64_levels: neoverse-n1 (no i8mm) runs dotprod, also under DSPARK_SIMD=i8mm; cortex-a72 neon; DSPARK_SIMD=dotprod caps"
else
    echo "FAIL aarch64_levels: neoverse-n1, the same with DSPARK_SIMD=i8mm, cortex-a72, DSPARK_SIMD=dotprod gave: $got"; fail=1
fi
# where qemu has i8mm the unit tests must have walked it (4 levels)
nlv=3; [ "$lv" = i8mm ] && nlv=4
for t in test_matmul test_kquant; do
    s=$(date +%s)
    if $Q "$A/tests/$t" >"$T/$t.log" 2>&1 && grep -q "on $nlv SIMD level(s)" "$T/$t.log"; then
        echo "PASS aarch64_$t: $(grep -c '^PASS' "$T/$t.log") PASS lines, $(tail -n 1 "$T/$t.log") ($(( $(date +%s) - s ))s)"
    else
        echo "FAIL aarch64_$t:"; grep -v '^PASS' "$T/$t.log" | tail -n 20; fail=1
    fi
done
grep -h 'SIMD level' "$T/test_matmul.log" "$T/test_kquant.log" | head -n 4 | sed 's/^/    /'
# the AArch64 DSPARK_SIMD names (i8mm among them) and the x86 ones refused
if $Q "$A/tests/test_harden" >"$T/test_harden.log" 2>&1; then echo "PASS aarch64_test_harden: $(tail -n 1 "$T/test_harden.log")"
else echo "FAIL aarch64_test_harden:"; grep '^FAIL' "$T/test_harden.log" | head -n 5; fail=1; fi
# the quantizer: the same Q8_0 file as x86's
if $Q "$A/dspark" quantize models/dspark-tiny-f16.gguf "$T/q8.gguf" q8_0 >/dev/null 2>&1 &&
   cmp -s "$T/q8.gguf" models/dspark-tiny-q8_0.gguf; then
    echo "PASS aarch64_quantize: the AArch64 Q8_0 target is byte-identical to x86's"
else
    echo "FAIL aarch64_quantize: the AArch64 Q8_0 target differs from models/dspark-tiny-q8_0.gguf"; fail=1
fi
# the quantized targets end to end (no recorded hashes for the K types: the
# x86 build in $BUILD is the reference). The committed Q8_0 target, and the
# tiny target quantized to Q4_K / Q5_K / Q6_K (8 K-quant FFN-down matmuls
# each; the rows of 384 fall back to Q5_0 / Q5_1 / Q8_0), then a speculative
# greedy run (decode: one row, SDOT / the fused blocks of <= 2 rows; verify
# and prefill: the 4-row and SMMLA tiles, the unpacking blocks) and raw
# logits, at the neon, dotprod and i8mm levels: the same bytes as x86's.
if [ -x "$BUILD/dspark" ]; then
    s=$(date +%s); kq_ok=1; kq_n=0
    for kt in q8_0 q4_k q5_k q6_k; do
        if [ $kt = q8_0 ]; then cp models/dspark-tiny-q8_0.gguf "$T/$kt.gguf"
        elif ! "$BUILD/dspark" quantize models/dspark-tiny-f16.gguf "$T/$kt.gguf" $kt >/dev/null 2>&1; then
            echo "FAIL aarch64_kquant: x86 quantize $kt"; kq_ok=0; continue
        fi
        kq_ref=""
        for kl in x86 neon dotprod i8mm; do
            if [ $kl = x86 ]; then set -- "$BUILD/dspark"; else set -- env DSPARK_SIMD=$kl $Q "$A/dspark"; fi
            "$@" generate -m "$T/$kt.gguf" -md models/dspark-tiny-drafter-f16.gguf -p "The river" -n 24 -t 2 \
                2>/dev/null >"$T/kq_o" || kq_ok=0
            "$@" generate -m "$T/$kt.gguf" -p "In the beginning" -n 4 -t 2 --dump-logits "$T/kq_l" >/dev/null 2>&1 || kq_ok=0
            h="$(sha256sum <"$T/kq_o" | cut -c1-64) $(sha256sum <"$T/kq_l" | cut -c1-64)"
            if [ $kl = x86 ]; then kq_ref=$h
            elif [ "$h" = "$kq_ref" ]; then kq_n=$((kq_n + 1))
            else echo "FAIL aarch64_kquant: $kt at $kl differs from x86"; kq_ok=0; fi
        done
    done
    [ $kq_ok = 1 ] && echo "PASS aarch64_kquant: Q8_0 / Q4_K / Q5_K / Q6_K targets, speculative output and raw logits at neon, dotprod and i8mm == x86 ($kq_n of 12; $(( $(date +%s) - s ))s)"
    [ $kq_ok = 1 ] || fail=1
else
    echo "SKIP aarch64_kquant: no x86 $BUILD/dspark to compare with"
fi
# the golden outputs, through a wrapper that runs the AArch64 dspark
mkdir -p "$T/q"
printf '#!/bin/sh\nexec %s %s/dspark "$@"\n' "$Q" "$A" >"$T/q/dspark"
chmod +x "$T/q/dspark"
s=$(date +%s)
keys="plain_greedy_q8_p1 spec_greedy_q8_p1 spec_t08_q8_p2 logits_q8_p3 plain_t08_f16_p2 logits_f16_p1"
[ "${AARCH64_GOLDEN:-}" = all ] && keys=""
if BUILD="$T/q" GOLDEN_ONLY="$keys" sh tests/cli_golden.sh >"$T/golden.log" 2>&1; then
    echo "PASS aarch64_golden: $(sed -n 's/^PASS golden: \([0-9]*\) .*/\1/p' "$T/golden.log") outputs of the AArch64 build (simd=${lv:-?}) bit-identical to the x86 hashes (${keys:-all}; $(( $(date +%s) - s ))s)"
else
    echo "FAIL aarch64_golden:"; cat "$T/golden.log"; fail=1
fi
echo "aarch64 total $(( $(date +%s) - start ))s"
exit $fail
