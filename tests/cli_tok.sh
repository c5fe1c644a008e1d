#!/bin/sh
# cli_tok.sh — GGUF versions through the dspark binary: a version 2 file (the
# shipped target with 2 in its header: version 2's layout is version 3's,
# little-endian) runs exactly as the version 3 file does; versions and
# headers dspark cannot read, and a cut file, are one line on stderr and
# exit status 2, never a crash.
BUILD=${BUILD:-build}
. tests/lib_cli.sh
fail=0
T=$(mktemp -d "${TMPDIR:-/tmp}/dspark-tok-XXXXXX")
trap 'rm -rf "$T"' EXIT INT TERM
M=models/dspark-tiny-f16.gguf
D="$BUILD/dspark"

# a copy with the u32 version field (bytes 4..7, little-endian) set to V
with_version() {  # with_version OUT B4 B5 B6 B7 (octal escapes)
    cp "$M" "$1" && printf "$2$3$4$5" | dd of="$1" bs=1 seek=4 conv=notrunc 2>/dev/null
}
with_version "$T/v2.gguf" '\002' '\000' '\000' '\000'
if "$D" inspect "$T/v2.gguf" 2>&1 | head -n 1 | grep -q 'version=2'; then echo "PASS the copy is read as GGUF version 2"
else echo "FAIL the copy is not read as version 2: $("$D" inspect "$T/v2.gguf" 2>&1 | head -c 200)"; fail=1; fi
"$D" generate -m "$M" -p "The quick" -n 24 >"$T/v3.txt" 2>"$T/v3.err" || { echo "FAIL generate (v3): $(head -c 200 "$T/v3.err")"; fail=1; }
"$D" generate -m "$T/v2.gguf" -p "The quick" -n 24 >"$T/v2.txt" 2>"$T/v2.err" || { echo "FAIL generate (v2): $(head -c 200 "$T/v2.err")"; fail=1; }
if [ -s "$T/v3.txt" ] && cmp -s "$T/v3.txt" "$T/v2.txt"; then echo "PASS generate on the version 2 file: the same $(wc -c <"$T/v2.txt") bytes as on version 3"
else echo "FAIL generate on the version 2 file differs from version 3"; fail=1; fi

with_version "$T/v1.gguf" '\001' '\000' '\000' '\000'
expect_err "GGUF version 1" "version 1" "$D" generate -m "$T/v1.gguf" -p x -n 1
with_version "$T/v4.gguf" '\004' '\000' '\000' '\000'
expect_err "GGUF version 4" "version 4" "$D" generate -m "$T/v4.gguf" -p x -n 1
with_version "$T/be.gguf" '\000' '\000' '\000' '\002'
expect_err "big-endian GGUF version 2" "big-endian" "$D" generate -m "$T/be.gguf" -p x -n 1
head -c 20000 "$M" >"$T/cut.gguf"
expect_err "a GGUF cut inside its metadata" "gguf" "$D" generate -m "$T/cut.gguf" -p x -n 1
exit $fail
