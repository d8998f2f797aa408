#!/bin/bash
# check.sh -- hq's test command (the README's second command; .ci/run runs it on CI).
#
# From a clean checkout (autoconf, automake, libtool, pkg-config, libinih-dev and
# libcmocka-dev installed), in build/ (git-ignored):
#   1. make check in build/release, the build scripts/install.sh (the first command) made, when
#      there is one: its objects are reused, only the tests are built. Otherwise build/default:
#      configure with the CUDA choice install.sh would make (HQ_CUDA_ARCH, see
#      scripts/build-args.sh) + make check. Either configuration must have printed no
#      "cannot remove" about the build tree's core/ directory.
#   2. build/asan:    --without-cuda --enable-sanitizers (ASan + UBSan) + make check
#   3. make distcheck from the build of 1 (a VPATH build from the tarball, read-only sources,
#      install/uninstall; CPU only)
# and print the automake totals of 1 and 2 as one line: "N passed, N failed[, N skipped]".
# GPU tests exit 77 (skipped) on a machine without a CUDA device. ccache, when installed,
# compiles 1 and 2 (HQ_CCACHE=no: not). HQ_CHECK_FRESH=1 ignores build/release.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
jobs=$(nproc 2>/dev/null || echo 2)
if [ -f config.status ]; then
  echo "check.sh: this source tree is configured in place; run 'make distclean' first" >&2
  echo "          (check.sh builds out of tree, in build/)" >&2
  exit 2
fi
[ -x configure ] || autoreconf -fi || exit 1
. "$top/scripts/build-args.sh"
hq_build_args || exit 1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

passed=0 failed=0 skipped=0 status=0
run() { # name, configure args... (name release: the existing build/release, not configured)
  local name=$1; shift
  local dir=build/$name
  if [ "$name" = release ]; then
    echo "== release: the build of scripts/install.sh ($(cd "$dir" && ./config.status --config))"
  else
    # core/ made first, as a re-configure finds it (config.status makes it), so that every test
    # program's `rm -f core` meets it
    rm -rf "$dir" && mkdir -p "$dir/core"
    echo "== $name: configure $*"
    (cd "$dir" && "$top/configure" -q "$@" > configure.log 2>&1) || { tail -20 "$dir/configure.log"; status=1; failed=$((failed + 1)); return; }
  fi
  if [ -f "$dir/configure.log" ] && grep -q "cannot remove" "$dir/configure.log"; then
    grep "cannot remove" "$dir/configure.log" | sort | uniq -c
    echo "check.sh: $name: configure printed 'cannot remove': autoconf's rm -f core (stale core" \
      "dumps) met the build tree's core/ directory; configure.ac's rm function should keep it off"
    status=1
    failed=$((failed + 1))
  fi
  echo "== $name: make -j$jobs check"
  (cd "$dir" && make -j"$jobs" check > check.log 2>&1)
  local rc=$?
  grep -E '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR):' "$dir/check.log"
  if [ -f "$dir/test-suite.log" ]; then
    local p f s
    p=$(awk '/^# PASS:/ {print $3}' "$dir/test-suite.log")
    f=$(awk '/^# (FAIL|ERROR|XPASS):/ {n += $3} END {print n + 0}' "$dir/test-suite.log")
    s=$(awk '/^# SKIP:/ {print $3}' "$dir/test-suite.log")
    passed=$((passed + ${p:-0})) failed=$((failed + ${f:-0})) skipped=$((skipped + ${s:-0}))
  fi
  if [ $rc -ne 0 ]; then
    status=1
    [ -f "$dir/test-suite.log" ] && tail -80 "$dir/test-suite.log" || tail -40 "$dir/check.log"
    [ -f "$dir/test-suite.log" ] || failed=$((failed + 1))
  fi
}

echo "== $hq_args_why"
if [ "${HQ_CHECK_FRESH:-0}" != 1 ] && [ -f build/release/Makefile ] && [ -x build/release/config.status ]; then
  first=release
  run release
else
  first=default
  run default "${hq_args[@]}"
fi
asan=(--without-cuda --enable-sanitizers)
for a in "${hq_args[@]}"; do case $a in CC=*) asan+=("$a") ;; esac; done
run asan "${asan[@]}"
if [ -f "build/$first/Makefile" ]; then
  echo "== make distcheck (from build/$first)"
  if ! (cd "build/$first" && make -j"$jobs" distcheck > distcheck.log 2>&1); then
    tail -40 "build/$first/distcheck.log"
    echo "distcheck failed"
    status=1
    failed=$((failed + 1))
  else
    grep -E '^hq-.*archives ready' -A2 "build/$first/distcheck.log" | head -3
  fi
fi
line="$passed passed, $failed failed"
[ $skipped -gt 0 ] && line="$line, $skipped skipped"
echo "$line"
exit $status
