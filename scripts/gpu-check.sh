#!/bin/bash
# gpu-check.sh -- build hq with CUDA and run `make check` (and optionally `hq bench`) on the lent
# GPU machine, which has nvcc, cuBLASLt and autotools but no libtool, inih or cmocka and no
# network.
#
# Here (a configured checkout, with apt-get for the two packages):
#     scripts/gpu-check.sh
#   makes the release tarball (make dist) into .devdist/, unpacks inih and cmocka into .devdeps/
#   (both git-ignored) and prints the device tool call to make:
#     carry   [".devdist", ".devdeps"]
#     command bash scripts/gpu-check.sh --on-device [--bench]
# There (what that command runs): unpack the tarball, ./configure --with-cuda, make -j16,
# make check (GPU tests run for real), copy the logs to $OUT; with --bench also run
# `hq bench --device cuda`.
set -euo pipefail

if [ "${1:-}" = "--on-device" ]; then
  shift
  root=$PWD
  export PKG_CONFIG_PATH=$root/.devdeps/usr/lib/x86_64-linux-gnu/pkgconfig
  export LD_LIBRARY_PATH=$root/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  out=${OUT:-/tmp/hq-out}
  mkdir -p "$out" /tmp/hqbuild
  nvidia-smi -L || true
  tar xzf "$root"/.devdist/hq-*.tar.gz -C /tmp/hqbuild
  cd /tmp/hqbuild/hq-*/
  ./configure -q --with-cuda > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  make -j16 > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  rc=0
  make -j8 check > "$out/check.log" 2>&1 || rc=$?
  cp test-suite.log "$out/" 2>/dev/null || true
  for t in tests/test_gpu_*.log; do [ -f "$t" ] && cp "$t" "$out/"; done
  grep -E '^(PASS|FAIL|SKIP|ERROR|XFAIL|XPASS):' "$out/check.log" || true
  grep -E '^# (TOTAL|PASS|SKIP|FAIL|ERROR)' "$out/check.log" || true
  for t in tests/test_gpu_*.log; do [ -f "$t" ] && { echo "--- $t"; tail -15 "$t"; }; done
  [ $rc -eq 0 ] || { echo "make check failed"; tail -60 test-suite.log; exit $rc; }
  if [ "${1:-}" = "--bench" ] && [ -x tools/hq ]; then
    HQ_PLUGIN_PATH=$(ls -d "$PWD"/plugins/*/.libs | tr '\n' ':') ./tools/hq bench --device cuda \
      | tee "$out/bench.txt"
  fi
  exit 0
fi

top=$(git rev-parse --show-toplevel)
cd "$top"
if [ ! -f Makefile ]; then
  autoreconf -fi >/dev/null
  ./configure -q
fi
make -s dist >/dev/null
mkdir -p .devdist
rm -f .devdist/hq-*.tar.gz
mv hq-*.tar.gz .devdist/
if [ ! -d .devdeps/usr/include ]; then
  deps=$top/../shared/tools/device-deps.sh
  [ -x "$deps" ] || deps=/work/shared/tools/device-deps.sh
  bash "$deps" .devdeps
fi
cat <<MSG
ready: $(ls .devdist/) and .devdeps/ ($(du -sh .devdeps | cut -f1))
device tool call:
  run  carry   = [".devdist", ".devdeps"]
       command = "bash scripts/gpu-check.sh --on-device"      (add --bench for hq bench)
MSG
