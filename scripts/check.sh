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
#   2b. python: the Python package (python/) built with pip against the build of 1 installed
#      into a staging directory (DESTDIR), and its tests run with pytest
#   3. scripts/fuzz.sh short: the parsers' libFuzzer targets, 10 s each (skipped without clang's
#      libFuzzer; counted as one test)
#   4. make distcheck from the build of 1 (a VPATH build from the tarball, read-only sources,
#      install/uninstall; CPU only)
# and print the totals of 1, 2, 2b and 3 as one line: "N passed, N failed[, N skipped]"
# (automake's and pytest's counts added). GPU tests exit 77 (skipped) on a machine without a
# CUDA device; PyTorch tests are skipped when torch is not importable. The Python is
# $HQ_PYTHON, else the venv scripts/install.sh made (build/venv), else python3. ccache, when
# installed, compiles 1 and 2 (HQ_CCACHE=no: not). HQ_CHECK_FRESH=1 ignores build/release.
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

# The Python tests, against the build of step 1 (build/$1) staged with `make install DESTDIR=`: pkg-config finds
# the staged hqcore.pc (PKG_CONFIG_SYSROOT_DIR puts the staging directory in front of its -I and
# -L), the extension's rpath is the staged library directory and HQ_PLUGIN_PATH names the staged
# format modules. pytest's junit counts join the totals.
run_python() {
  local dir=$top/build/$1 stage=$top/build/$1/py-stage py
  py=${HQ_PYTHON:-}
  [ -z "$py" ] && [ -x "$top/build/venv/bin/python3" ] && py=$top/build/venv/bin/python3
  py=${py:-python3}
  echo "== python: $py -m pytest python/tests"
  [ -f "$dir/Makefile" ] || { echo "python: build/$1 was not built"; failed=$((failed + 1)); status=1; return; }
  if ! "$py" -c 'import cffi, numpy, pytest' 2>/dev/null; then
    echo "python: $py lacks cffi, numpy or pytest (scripts/install.sh installs them)"
    failed=$((failed + 1)) status=1
    return
  fi
  rm -rf "$stage" "$dir/python"
  local pc
  if ! (cd "$dir" && make -s install DESTDIR="$stage" > py-install.log 2>&1) ||
     ! pc=$(dirname "$(find "$stage" -name hqcore.pc | head -1)") ||
     ! PKG_CONFIG_PATH=$pc PKG_CONFIG_SYSROOT_DIR=$stage "$py" -m pip install -q \
         --no-build-isolation --no-deps --target "$dir/python" "$top/python" > "$dir/py-build.log" 2>&1; then
    tail -30 "$dir/py-install.log" "$dir/py-build.log" 2>/dev/null
    echo "python: building the package failed"
    failed=$((failed + 1)) status=1
    return
  fi
  local plugins
  plugins=$(dirname "$(find "$stage" -name 'mxfp8*.so' | head -1)")
  # run from the build directory: `python -m pytest` puts the current directory on sys.path,
  # and the source python/hq (without its compiled extension) must not shadow the built one
  (cd "$dir" && PYTHONPATH="$dir/python" HQ_PLUGIN_PATH="$plugins" "$py" -m pytest -q -rs \
     -p no:cacheprovider --junitxml="$dir/pytest.xml" "$top/python/tests" > "$dir/pytest.log" 2>&1)
  local rc=$?
  tail -15 "$dir/pytest.log"
  local counts
  counts=$("$py" - "$dir/pytest.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    r = ET.parse(sys.argv[1]).getroot()
except Exception:
    print(0, 1, 0); sys.exit()
s = r if r.tag == "testsuite" else r.find("testsuite")
n, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
print(n - f - e - k, f + e, k)
PY
)
  set -- $counts
  passed=$((passed + $1)) failed=$((failed + $2)) skipped=$((skipped + $3))
  [ $rc -eq 0 ] || status=1
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
run_python "$first"
run asan "${asan[@]}"
# the parsers' fuzz targets, 10 s each (docs/reliability.md), where clang can link libFuzzer
echo "== fuzz: scripts/fuzz.sh short"
"$top/scripts/fuzz.sh" short
case $? in
  0) passed=$((passed + 1)) ;;
  77) skipped=$((skipped + 1)) ;;
  *) failed=$((failed + 1)) status=1 ;;
esac
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
