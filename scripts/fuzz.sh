#!/bin/bash
# fuzz.sh -- libFuzzer with ASan/UBSan on hq's parsers (tests/fuzz/): the checkpoint reader
# (fuzz_ckpt: into every shipped format), the .npy reader (fuzz_npy) and the recipe parser
# (fuzz_recipe).
#   scripts/fuzz.sh check         exit 0 when clang can link -fsanitize=fuzzer (else 77, skip)
#   scripts/fuzz.sh short         build in build/fuzz, run each target 10 s from its seeds
#                                 (tests/fuzz/seeds/<target>/, and fuzz_ckpt's of every format,
#                                 written by tests/fuzz/ckpt_seeds.c into build/fuzz/seeds/):
#                                 what scripts/check.sh runs
#   scripts/fuzz.sh long [SECS]   the same, SECS (default 600) per target, a corpus kept in
#                                 build/fuzz/corpus/<target>/; by hand
# A crash leaves its input in build/fuzz/crash-* and fails (exit 1). Prints the inputs run.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-short}
secs=${2:-600}
[ "$mode" = short ] && secs=10
CC=${FUZZ_CC:-clang}
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' > "$probe/p.c"
if ! "$CC" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>/dev/null; then
  echo "fuzz.sh: $CC cannot link -fsanitize=fuzzer (install clang and libclang-rt-dev): skipped"
  exit 77
fi
[ "$mode" = check ] && exit 0
b=$top/build/fuzz
mkdir -p "$b/core"
if [ ! -f "$b/Makefile" ]; then
  [ -x "$top/configure" ] || (cd "$top" && autoreconf -fi) || exit 1
  (cd "$b" && "$top/configure" -q CC="$CC" CFLAGS="-g -O1 -fsanitize=fuzzer-no-link" \
    --without-cuda --disable-tests --enable-sanitizers --disable-werror > configure.log 2>&1) ||
    { tail -20 "$b/configure.log"; exit 1; }
fi
(cd "$b" && make core/hq_paths.h > build.log 2>&1 && make -j"$(nproc)" core/libhqcore.la \
  services/libhqtrain.la plugins/fp8_tensor/fp8_tensor.la plugins/mxfp8/mxfp8.la \
  plugins/nvfp4/nvfp4.la plugins/fp8_block/fp8_block.la plugins/identity/identity.la \
  plugins/mx/mxfp4.la plugins/mx/mxfp6.la >> build.log 2>&1) || { tail -30 "$b/build.log"; exit 1; }
flags="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$top/core/include -I$b"
libs="-L$b/core/.libs -L$b/services/.libs -Wl,-rpath,$b/core/.libs -Wl,-rpath,$b/services/.libs"
set -e
"$CC" $flags -I"$top/tools" "$top/tests/fuzz/fuzz_npy.c" "$top/tools/npy.c" -o "$b/fuzz_npy"
"$CC" $flags "$top/tests/fuzz/fuzz_recipe.c" $libs -lhqcore -o "$b/fuzz_recipe"
"$CC" $flags "$top/tests/fuzz/fuzz_ckpt.c" $libs -lhqtrain -lhqcore -o "$b/fuzz_ckpt"
"$CC" ${flags/fuzzer,/} "$top/tests/fuzz/ckpt_seeds.c" $libs -lhqtrain -lhqcore -lm \
  -o "$b/ckpt_seeds"
export HQ_PLUGIN_PATH=$b/plugins/fp8_tensor/.libs:$b/plugins/mxfp8/.libs:$b/plugins/nvfp4/.libs:$b/plugins/fp8_block/.libs:$b/plugins/identity/.libs:$b/plugins/mx/.libs
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
rm -rf "$b/seeds" && mkdir -p "$b/seeds/fuzz_ckpt" "$b/seeds/fuzz_npy" "$b/seeds/fuzz_recipe"
"$b/ckpt_seeds" "$b/seeds/fuzz_ckpt"
set +e
status=0
for t in fuzz_ckpt fuzz_npy fuzz_recipe; do
  corpus=$b/corpus/$t
  mkdir -p "$corpus"
  (cd "$b" && ./"$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    "$corpus" "$top/tests/fuzz/seeds/$t" "$b/seeds/$t" > "$t.log" 2>&1)
  rc=$?
  runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$b/$t.log")
  if [ $rc -ne 0 ]; then
    status=1
    echo "fuzz.sh: $t: FAILED after ${runs:-?} inputs (exit $rc): $(grep -m1 'ERROR\|SUMMARY\|deadly' "$b/$t.log")"
    ls "$b"/crash-* "$b"/leak-* "$b"/timeout-* 2>/dev/null | head -3
  else
    echo "fuzz.sh: $t: ${runs:-?} inputs in ${secs} s, no crash"
  fi
done
exit $status
