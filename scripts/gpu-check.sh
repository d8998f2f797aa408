#!/bin/bash
# gpu-check.sh -- build hq with CUDA and run `make check` (and optionally `hq bench`) on the lent
# GPU machine, which has nvcc, cuBLASLt and autotools but no libtool, inih or cmocka and no
# network.
#
# Here (a checkout, with apt-get for the two packages):
#     scripts/gpu-check.sh
#   makes the release tarball (make dist) into .devdist/, unpacks inih and cmocka into .devdeps/
#   (both git-ignored) and prints the device tool call to make:
#     carry   [".devdist", ".devdeps"]
#     command bash scripts/gpu-check.sh --on-device [--bench|--peers|--train|--train-ab|--sanitize]
# There (what that command runs): unpack the tarball, ./configure --with-cuda, make -j16,
# make check (GPU tests run for real), copy the logs to $OUT; with --bench also run
# `hq bench --device cuda`; with --peers run it (text, and --json) and the PyTorch peers of
# scripts/bench_peers.py (from the carried tree; HQ_PEERS_ARGS adds its arguments) in the same
# call, outputs in $OUT as bench.txt, bench.json, peers.txt, peers.json, then the hybrid
# check of the stock recipes' hybrid roles (hybrid.txt); with --train run `hq train --device
# cuda` on every shipped recipe, default and wide models (train.json and train_wide.json, which
# `DOCS_TABLES_GPU=DIR scripts/docs-tables.py --only gpu` turns into docs/training.md's table 5b);
# with --sanitize run
# compute-sanitizer (memcheck, racecheck, synccheck) on every GPU test binary instead
# (HQ_SAN_TESTS and HQ_SAN_TOOLS choose; with --quick the named tests are built too).
# HQ_ONLY=test_gpu_X limits the run to that test program (built with make -k, so unfinished
# work elsewhere does not stop it); HQ_BENCH_ARGS gives --bench's hq bench arguments (default
# --all: every stock option that changes a kernel or a layout; e.g. "--format mxfp8").
# HQ_CUDA_ARCH=90 configures for sm_90 alone (a measurement on the H200; the default builds every
# architecture hq supports, as CI does). HQ_TREE_DEFINES="NAME=VALUE ..." compiles the carried
# tree's C and CUDA sources with those switches on (e.g. "HQ_MX_COLS=1 HQ_NVFP4_RQ_STAGES=3"),
# not HQ_DEVDIST_BEFORE's: an A/B of a switch carries the same tarball twice.
# --train-ab (with --quick, and HQ_DEVDIST_BEFORE=.devdist0: an earlier tree's `make dist`
# tarball carried too; or HQ_AB_BEFORE_CPPFLAGS="PLUGIN FLAGS": this tree with that plugin's C
# sources compiled with FLAGS, a compile-time switch, no second build) trains every shipped
# recipe on the default and wide models with both builds and writes train_ab.md, the
# before/after table of docs/performance.md (scripts/train_ab.py; HQ_AB_STEPS_DEFAULT,
# HQ_AB_STEPS_WIDE; HQ_AB_RECIPES, HQ_AB_SIZES and HQ_AB_ROUNDS: which recipes, which sizes,
# how many interleaved rounds).
# Kernel work: --quick builds the library, the stock plugins (HQ_QUICK_PLUGINS="fp8_block mx":
# those alone; on the H200 machine a quick build of fp8_block alone took 35 s, of all six 110-125
# s) and hq only (no make check); `scripts/gpu-check.sh --prebuild` here (same HQ_QUICK_PLUGINS,
# HQ_SAN_TESTS, HQ_CUDA_ARCH, default 90, and HQ_TREE_DEFINES as the device call will have) makes
# that quick build on this machine into .devbuild (one per HQ_DEVDIST: a before/after mode's
# HQ_DEVDIST_BEFORE tree is prebuilt by HQ_DEVDIST=.devdist0 ... --prebuild), and --on-device
# --quick unpacks it instead of building when its stamp matches (carry ".devbuild" too): about
# 1 s of device time in place of 110-175;
# --ab builds each carried .devab/PLUGIN__LABEL.cu (git-ignored) as PLUGIN's source, checks it
# with tests/test_gpu_PLUGIN (but labels matching the regex HQ_AB_NOCHECK) and times the
# variants in turn, one hq bench process each (HQ_AB_ARGS, HQ_AB_ROUNDS rounds; HQ_AB_CMD=train:
# one hq train process each, e.g. HQ_AB_ARGS="--preset wide --steps 300 --recipe ..."), into
# ab.txt, then rebuilds the tree's own source for the modes after it; --ncu profiles one kernel with
# Nsight Compute (HQ_NCU_KERNEL, HQ_NCU_ARGS, HQ_NCU_SKIP) into prof.ncu-rep, details.csv,
# sass.csv and stalls.txt (cycles per issued instruction by warp state, printed too); --mem
# times what each kernel moves (DRAM bytes, L2 sectors, DRAM rate per launch) into mem.txt
# (HQ_MEM_KERNEL, HQ_NCU_ARGS; scripts/ncu_mem.py reads ncu's counters); --step-kernels sums
# each shipped recipe's training step by kernel (Nsight Compute over eager hq train steps,
# HQ_STEP_PRESET, HQ_STEP_STEPS; scripts/ncu_steps.py) into step_kernels.txt; --launch-times
# times given launches of given kernels in hq bench, on this tree and an earlier one
# (HQ_LT_SPECS, HQ_LT_SKIP, HQ_LT_COUNT, HQ_DEVDIST_BEFORE; scripts/ncu_steps.py --launches)
# into launch_times.txt; --lanes traces a replayed step's streams with CUPTI (scripts/
# lane_trace.c, HQ_LANES_RECIPES, HQ_LANES_PRESET, HQ_LANES_STEPS; scripts/lanes.py) into
# lanes.txt. --probe builds nothing
# of hq: it compiles and runs scripts/store_probe.cu (how fast the memory system takes the loads
# and stores of a quantize layout with no encoding) into probe.txt, and stops; --graph-probe
# likewise compiles and runs scripts/graph_nodes.cu (what a replayed CUDA graph pays per kernel,
# allocation, memset and forked node, and a replay started on an idle GPU) into graph_nodes.txt. --mx-pairs
# rebuilds nvfp4 with -DHQ_MX_CVT_PAIRS=1 (the form Blackwell's FP4 convert takes, the software
# rule in the instruction's place: plugins/common/mx_cvt_cuda.h) and runs tests/test_gpu_nvfp4
# with it, then rebuilds it as configured.
set -euo pipefail

# what a prebuilt quick build was made from: the tarball's digest, the plugins, the named tests,
# the architecture and the compile-time switches (a prebuilt tree is used only where all match)
prebuild_stamp() {
  echo "$(sha256sum "$1" | cut -c1-16) plugins=${HQ_QUICK_PLUGINS:-fp8_tensor mxfp8 nvfp4 fp8_block mx}" \
    "tests=${HQ_SAN_TESTS:-} arch=${HQ_CUDA_ARCH:-90} defines=${HQ_TREE_DEFINES:-}"
}

# (run in an unpacked tree) the modules built from plugins/PLUGIN's sources (plugins/mx:
# mxfp4.la and mxfp6.la)
ab_mods() { sed -n 's/^hqplugin_LTLIBRARIES += //p' "plugins/$1/local.mk" 2>/dev/null \
              | grep . || echo "plugins/$1/$1.la"; }
# with test programs named, the test modules they load (tests/wrap: stock modules with a
# capability taken away, e.g. test_gpu_rng_graph's nvfp4_norng), which are small
wrap_mods() { [ -n "${HQ_SAN_TESTS:-}" ] &&
                sed -n 's/^check_LTLIBRARIES += \(tests\/wrap\/.*\)/\1/p' tests/local.mk; }
# the targets of a quick build: the library, HQ_QUICK_PLUGINS' modules, hq, the named tests
quick_targets() {
  echo core/libhqcore.la
  for p in ${HQ_QUICK_PLUGINS:-fp8_tensor mxfp8 nvfp4 fp8_block mx}; do ab_mods "$p"; done
  echo tools/hq
  for t in ${HQ_SAN_TESTS:-}; do echo "tests/$t"; done
  wrap_mods || true
}
# (run in an unpacked tree) configure --with-cuda for HQ_CUDA_ARCH with HQ_TREE_DEFINES' switches
# ("NAME=VALUE ..."), its output into LOG
configure_cuda() { # LOG
  local defs="" d
  for d in ${HQ_TREE_DEFINES:-}; do defs="$defs -D$d"; done
  CPPFLAGS="${CPPFLAGS:-}$defs" NVCCFLAGS="${NVCCFLAGS:-}$defs" \
    ./configure -q --with-cuda ${HQ_CUDA_ARCH:+--with-cuda-arch=$HQ_CUDA_ARCH} > "$1" 2>&1
}
# (run in a configured tree) the quick build with JOBS jobs, its output into LOG
quick_build() { # JOBS LOG
  make core/hq_paths.h > "$2" 2>&1 && make -j"$1" $(quick_targets) >> "$2" 2>&1
}
# where --prebuild packs the tree of the carried folder DIST: .devbuild/DIST without its dot
prebuilt_path() { # DIST
  echo ".devbuild/$(basename "$1" | sed 's/^\.//')"
}

if [ "${1:-}" = "--on-device" ]; then
  shift
  modes=" $* "   # any of --bench, --peers, --train, --train-ab, --sanitize, in one call (peers first, sanitize last)
  root=$PWD
  # hq train's --data where the image has no word list: the one carried in .devdeps (copied
  # there from wamerican)
  words=()
  [ -r /usr/share/dict/words ] || words=(--data "$root/.devdeps/words")
  export PKG_CONFIG_PATH=$root/.devdeps/usr/lib/x86_64-linux-gnu/pkgconfig
  export LD_LIBRARY_PATH=$root/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  out=${OUT:-/tmp/hq-out}
  # one build folder per carried tarball (HQ_DEVDIST), so that runs of different trees on the
  # same warm machine do not replace each other's build
  build=/tmp/hqbuild/${HQ_DEVDIST:-.devdist}
  mkdir -p "$out" "$build"
  # the device tool brings back at most 8 files: keep the summaries (HQ_KEEP) as they are and
  # pack every other log into logs.tgz when the run ends, however it ends
  pack_out() {
    local keep="test-suite.log train.json train_wide.json train_ab.md bench.txt bench.json"
    keep=" ${HQ_KEEP:-$keep peers.txt launch_times.txt lanes.txt} "
    local f rest=()
    for f in $(cd "$out" && ls); do [[ "$keep" == *" $f "* ]] || rest+=("$f"); done
    if [ ${#rest[@]} -gt 0 ]; then
      tar czf "$out/logs.tgz.part" -C "$out" "${rest[@]}" && (cd "$out" && rm -rf "${rest[@]}") \
        && mv "$out/logs.tgz.part" "$out/logs.tgz"
    fi
  }
  trap pack_out EXIT
  nvidia-smi -L || true
  # a probe: scripts/NAME.cu from the carried tree, compiled (nvcc flags after NAME) and run,
  # its output in $out/TXT; no hq build, and the run ends with the probe's status
  probe() { # NAME TXT FLAGS...
    local name=$1 txt=$2 nvcc
    shift 2
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    "$nvcc" -std=c++17 "$@" -o "$build/$name" "$root/scripts/$name.cu" || exit 1
    "$build/$name" | tee "$out/$txt"
    exit "${PIPESTATUS[0]}"
  }
  # the memory system's ceiling for the quantize kernels' layouts
  [[ "$modes" == *" --probe "* ]] && probe store_probe probe.txt -O3 \
    -gencode arch=compute_90a,code=sm_90a -I "$root/plugins/common"
  # what a replayed CUDA graph pays per node of each kind
  [[ "$modes" == *" --graph-probe "* ]] && probe graph_nodes graph_nodes.txt -O2 \
    -gencode arch=compute_90,code=sm_90
  rm -rf "$build"/hq-*/
  # a quick build made here by `gpu-check.sh --prebuild` (same tarball, plugins, tests and
  # architecture) is unpacked in place of building: it saves the build's minutes of device time
  prebuilt=0
  pbt=$root/$(prebuilt_path "${HQ_DEVDIST:-.devdist}")
  if [[ "$modes" == *" --quick "* ]] && [ -f "$pbt.tgz" ]; then
    if [ "$(cat "$pbt.stamp")" = "$(prebuild_stamp "$root"/${HQ_DEVDIST:-.devdist}/hq-*.tar.gz)" ]; then
      tar xzf "$pbt.tgz" -C /tmp/hqbuild && prebuilt=1
    else
      echo "the prebuilt tree in .devbuild is not this tarball's quick build (stamp differs): building"
    fi
  fi
  [ $prebuilt = 1 ] || tar xzf "$root"/${HQ_DEVDIST:-.devdist}/hq-*.tar.gz -C "$build"
  cd "$build"/hq-*/
  # HQ_CUDA_ARCH (e.g. 90) builds for that architecture alone: a measurement on the lent H200
  # needs no Blackwell code, and the build takes less of the session's device time.
  # HQ_TREE_DEFINES ("NAME=VALUE ..."): compile-time switches of this tree's C and CUDA sources
  # (e.g. "HQ_MX_COLS=1"), not of the earlier tree a before/after mode builds beside it
  [ $prebuilt = 1 ] || configure_cuda "$out/configure.log" ||
    { tail -30 "$out/configure.log"; exit 1; }
  rc=0
  if [ $prebuilt = 1 ]; then
    echo "built (quick): the prebuilt tree of .devbuild ($(cut -d' ' -f2- "$pbt.stamp"))"
  elif [[ "$modes" == *" --quick "* ]]; then
    # the library, the stock plugins (HQ_QUICK_PLUGINS: those named, e.g. "fp8_block": nvfp4's
    # and mx's sources take most of the build) and hq only (no tests), for --ab and --ncu
    SECONDS=0
    quick_build 16 "$out/build.log" || { tail -40 "$out/build.log"; exit 1; }
    echo "built (quick) in ${SECONDS} s"
  elif [ -n "${HQ_ONLY:-}" ]; then
    # one test program (HQ_ONLY=test_gpu_mxfp8), built with -k so that work in progress
    # elsewhere in the tree does not stop it
    make -k -j16 > "$out/build.log" 2>&1 || true
    grep -E "error" "$out/build.log" | head -20 || true
    make -k -j8 check TESTS="tests/$HQ_ONLY" > "$out/check.log" 2>&1 || rc=$?
  else
    make -j16 > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
    make -j8 check > "$out/check.log" 2>&1 || rc=$?
  fi
  if [[ "$modes" != *" --quick "* ]]; then
    cp test-suite.log "$out/" 2>/dev/null || true
    for t in tests/test_gpu_*.log; do [ -f "$t" ] && cp "$t" "$out/"; done
    grep -E '^(PASS|FAIL|SKIP|ERROR|XFAIL|XPASS):' "$out/check.log" || true
    grep -E '^# (TOTAL|PASS|SKIP|FAIL|ERROR)' "$out/check.log" || true
    for t in tests/test_gpu_*.log; do [ -f "$t" ] && { echo "--- $t"; tail -15 "$t"; }; done
    [ $rc -eq 0 ] || { echo "make check failed"; tail -60 test-suite.log; exit $rc; }
  fi
  if [[ "$modes" == *" --mx-pairs "* ]]; then
    # nvfp4 built with its Blackwell form of round to nearest (HQ_MX_CVT_PAIRS: a product per
    # element, the FP4 convert on pairs; on this chip the software rule stands in for the
    # instruction), checked by tests/test_gpu_nvfp4, then the tree's own build back
    build_nvfp4() { # NVCCFLAGS for the rebuild of plugins/nvfp4 alone
      rm -f plugins/nvfp4/nvfp4.lo plugins/nvfp4/.libs/nvfp4.o
      make -j16 NVCCFLAGS="$1" plugins/nvfp4/nvfp4.la > "$out/mx-pairs-build.log" 2>&1 \
        || { tail -30 "$out/mx-pairs-build.log"; exit 1; }
    }
    build_nvfp4 -DHQ_MX_CVT_PAIRS=1
    if make check TESTS=tests/test_gpu_nvfp4 check_PROGRAMS=tests/test_gpu_nvfp4 \
         check_LTLIBRARIES= > "$out/mx-pairs-check.log" 2>&1; then
      echo "mx-pairs: tests/test_gpu_nvfp4 passed with -DHQ_MX_CVT_PAIRS=1"
    else
      echo "mx-pairs: tests/test_gpu_nvfp4 FAILED with -DHQ_MX_CVT_PAIRS=1"; rc=1
      cp tests/test_gpu_nvfp4.log "$out/mx-pairs-test.log" 2>/dev/null || true
    fi
    grep -E '^# (PASS|SKIP|FAIL|ERROR)' "$out/mx-pairs-check.log" || true
    build_nvfp4 ""
  fi
  plugins=$(ls -d "$PWD"/plugins/*/.libs | tr '\n' ':')
  if [[ "$modes" == *" --ab "* ]]; then
    # kernel variants side by side: each carried .devab/PLUGIN__LABEL.cu replaces
    # plugins/PLUGIN/PLUGIN.cu (and each .devab/PLUGIN__LABEL--NAME.h the plugin's header
    # NAME.h) in a copy of the built tree, all copies built at once (one nvcc
    # per .cu file would leave most cores idle: MX and NVFP4 variants take over a minute each),
    # then each must pass tests/test_gpu_PLUGIN (HQ_TEST_QUICK=1) in its copy, one at a time
    # (make check-TESTS: the harness alone, not check's `all`; abs_top_builddir / abs_top_srcdir
    # given to make, so that the test loads the copy's modules), and its module is kept; then
    # HQ_AB_ROUNDS rounds (default 2) time every variant in turn, one hq bench process each
    # (HQ_AB_ARGS, default --format PLUGIN; HQ_AB_CMD=train: one hq train process each), into
    # ab.txt after the variants' verdicts (the call's printed output may come back cut; the
    # variants' build and test logs stay in $abdir/log, and only a failed one is copied to
    # $out: the device tool brings back a few files, and ab.txt must be among them). The tree
    # itself is left as built, for the modes after this one (--bench, --sanitize).
    abdir=/tmp/hq-ab; rm -rf "$abdir"; mkdir -p "$abdir" "$abdir/log"
    labels=()
    # each verdict goes to ab.txt as it is made, so that a call cut short by its time limit
    # still brings back how far the variants got
    : > "$out/ab.txt"
    say() { echo "$1"; echo "$1" >> "$out/ab.txt"; }
    SECONDS=0
    nvar=$(ls "$root"/.devab/*__*.cu 2>/dev/null | wc -l)
    jobs_each=$(( 16 / (nvar > 0 ? nvar : 1) ))
    [ "$jobs_each" -ge 2 ] || jobs_each=2
    for v in "$root"/.devab/*__*.cu; do
      [ -f "$v" ] || continue
      b=$(basename "$v" .cu); pl=${b%%__*}; d="$abdir/tree-$b"
      cp -a "$PWD" "$d" && cp "$v" "$d/plugins/$pl/$pl.cu" || { say "variant $b: copy failed"; rc=1; continue; }
      # a variant's own headers: .devab/PLUGIN__LABEL--NAME.h replaces plugins/PLUGIN/NAME.h
      for h in "$root"/.devab/"$b"--*.h; do
        [ -f "$h" ] && cp "$h" "$d/plugins/$pl/${h##*--}"
      done
      (cd "$d" && make -j"$jobs_each" $(ab_mods $pl) tests/test_gpu_$pl \
         > "$abdir/log/$b.build.log" 2>&1; echo $? > "$abdir/log/$b.build.rc") &
    done
    wait
    say "variants built in ${SECONDS} s"
    for v in "$root"/.devab/*__*.cu; do
      [ -f "$v" ] || continue
      b=$(basename "$v" .cu); pl=${b%%__*}; lab=${b#*__}; d="$abdir/tree-$b"
      if [ "$(cat "$abdir/log/$b.build.rc" 2>/dev/null)" != 0 ]; then
        say "variant $b: build failed"; grep -m5 error "$abdir/log/$b.build.log"; rc=1
        cp "$abdir/log/$b.build.log" "$out/ab-$b.build.log"; continue
      fi
      if [ -n "${HQ_AB_NOCHECK:-}" ] && [[ "$lab" =~ $HQ_AB_NOCHECK ]]; then
        say "variant $b: built (not checked: HQ_AB_NOCHECK)"
      elif (cd "$d" && HQ_TEST_QUICK=1 make check-TESTS TESTS=tests/test_gpu_$pl \
              abs_top_builddir="$d" abs_top_srcdir="$d" > "$abdir/log/$b.check.log" 2>&1); then
        say "variant $b: tests/test_gpu_$pl passed"
      else
        say "variant $b: tests/test_gpu_$pl FAILED"; tail -20 "$d/tests/test_gpu_$pl.log"; rc=1
        cp "$abdir/log/$b.check.log" "$out/ab-$b.check.log"
        # the test's own log names the failing case (make check's log only counts it)
        cp "$d/tests/test_gpu_$pl.log" "$out/ab-$b.test.log" 2>/dev/null || true; continue
      fi
      mkdir -p "$abdir/$b"; cp "$d"/plugins/$pl/.libs/*.so "$abdir/$b/"
      labels+=("$b")
    done
    for round in $(seq 1 "${HQ_AB_ROUNDS:-2}"); do
      for b in "${labels[@]}"; do
        pl=${b%%__*}
        path=$(echo "$plugins" | sed "s|$PWD/plugins/$pl/.libs|$abdir/$b|")
        eval set -- "${HQ_AB_ARGS:---format $pl}"
        echo "=== variant $b round $round"
        if [ "${HQ_AB_CMD:-bench}" = train ]; then
          HQ_PLUGIN_PATH=$path ./tools/hq train --device cuda "$@" ${words[@]+"${words[@]}"} 2>&1 \
            | grep -v '^\[' || rc=1
        else
          HQ_PLUGIN_PATH=$path ./tools/hq bench --device cuda "$@" 2>&1 | grep -v '^#' || rc=1
        fi
      done
    done | tee -a "$out/ab.txt"
  fi
  # the earlier tree of a before/after mode (--train-ab, --launch-times): the carried tarball
  # HQ_DEVDIST_BEFORE (an earlier tree's make dist) built --quick in its own folder, its root in
  # $before; from the carried tree's root, where the nested call finds the tarball and .devdeps
  before=
  before_tree() { # MODE (built once for the modes of one call)
    [ -z "$before" ] || return 0
    [ -n "${HQ_DEVDIST_BEFORE:-}" ] || { echo "$1: set HQ_DEVDIST_BEFORE"; exit 2; }
    (cd "$root" && OUT=$out/before HQ_DEVDIST=$HQ_DEVDIST_BEFORE HQ_TREE_DEFINES= \
      bash scripts/gpu-check.sh --on-device --quick) > "$out/before-build.txt" 2>&1 \
      || { tail -20 "$out/before-build.txt"; exit 1; }
    before=$(echo /tmp/hqbuild/$HQ_DEVDIST_BEFORE/hq-*/)
  }
  ncu=
  if [[ "$modes" == *" --ncu "* || "$modes" == *" --mem "* || "$modes" == *" --step-kernels "* ||
        "$modes" == *" --launch-times "* ]]; then
    # Nsight Compute, for --ncu, --mem, --step-kernels and --launch-times: on PATH or in the
    # toolkit's own folder
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
    [ -n "$ncu" ] || { echo "$modes: no ncu on PATH nor in /opt/nvidia/nsight-compute"; rc=1; }
  fi
  if [[ "$modes" == *" --ncu "* ]] && [ -n "$ncu" ] && [ -x tools/hq ]; then
    # one kernel's Nsight Compute profile (clocks left alone): the launch after HQ_NCU_SKIP
    # (default 3) of HQ_NCU_KERNEL (a regex on the mangled name) in hq bench HQ_NCU_ARGS
    # (default --format nvfp4); the details page and the SASS-level source page as CSV beside
    # the report
    eval set -- "${HQ_NCU_ARGS:---format nvfp4}"
    HQ_PLUGIN_PATH=$plugins timeout 300 "$ncu" --clock-control none --set full \
      --import-source no --kernel-name-base mangled --kernel-name "regex:${HQ_NCU_KERNEL}" \
      --launch-skip "${HQ_NCU_SKIP:-3}" --launch-count 1 -f -o "$out/prof" \
      ./tools/hq bench --device cuda --iters 2 --batch 1 "$@" > "$out/ncu.log" 2>&1 || rc=1
    tail -5 "$out/ncu.log"
    "$ncu" -i "$out/prof.ncu-rep" --page details --csv > "$out/details.csv" 2>&1 || rc=1
    "$ncu" -i "$out/prof.ncu-rep" --page source --csv --print-source sass > "$out/sass.csv" \
      2>&1 || true
    # the warp stall reasons (cycles per issued instruction, largest first) from the raw page
    "$ncu" -i "$out/prof.ncu-rep" --page raw --csv 2>/dev/null | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
if len(rows) >= 3:
    got = [(float(v.replace(",", "")), n) for n, v in zip(rows[0], rows[2])
           if "issue_stalled" in n and n.endswith("per_issue_active.ratio")
           and v.replace(",", "").replace(".", "", 1).isdigit()]
    for v, n in sorted(got, reverse=True)[:12]:
        print("stall %-60s %6.2f" % (n.split("issue_stalled_")[1], v))
' | tee "$out/stalls.txt" || true
    k='Duration|Executed Instructions|Issue Slots Busy|Issued Ipc Active|Registers Per Thread'
    k="$k|Achieved Occupancy|Memory Throughput|DRAM Throughput|L2 Cache Throughput|SM Frequency"
    grep -E "\"($k)\"" "$out/details.csv" | cut -d, -f12- | head -20 || true
  fi
  if [[ "$modes" == *" --mem "* ]] && [ -n "$ncu" ] && [ -x tools/hq ]; then
    # what each kernel moves (Nsight Compute counters, clocks left alone): per launch of
    # HQ_MEM_KERNEL (a regex on the mangled name; default the quantize, cast and amax kernels)
    # in hq bench HQ_NCU_ARGS, the first HQ_MEM_COUNT (40) launches: time, DRAM bytes read and
    # written, L2 sectors read and written by the SMs, the DRAM rate; summed up per kernel
    # (the range over its launches) into mem.txt, the raw counters in mem.csv
    eval set -- "${HQ_NCU_ARGS:---format nvfp4}"
    m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
    m=$m,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
    HQ_PLUGIN_PATH=$plugins timeout 400 "$ncu" --clock-control none --csv --metrics "$m" \
      --kernel-name-base mangled --kernel-name "regex:${HQ_MEM_KERNEL:-quantize|cast|amax}" \
      --launch-count "${HQ_MEM_COUNT:-40}" \
      ./tools/hq bench --device cuda --iters 2 --batch 1 "$@" > "$out/mem.csv" 2>&1 || rc=1
    python3 "$root/scripts/ncu_mem.py" "$out/mem.csv" | tee "$out/mem.txt" || rc=1
  fi
  if [[ "$modes" == *" --step-kernels "* ]] && [ -n "$ncu" ] && [ -x tools/hq ]; then
    # where a training step's kernel time goes, per shipped recipe (the BF16 one first): every
    # launch of HQ_STEP_STEPS (6) eager steps of hq train (--cuda-graph off: a replayed graph is
    # one launch to ncu) at --preset HQ_STEP_PRESET (default), timed by Nsight Compute with the
    # clocks at base (its default, so the sums are relative: a captured step at boost clocks
    # runs in less), summed per whole step by scripts/ncu_steps.py into step_kernels.txt. ncu
    # stops after HQ_STEP_LAUNCHES (1500) launches: the final evaluation's thousands of forward
    # launches come after the steps, which ncu_steps.py leaves out, and would take most of the
    # time (about 15 ms a launch profiled). HQ_STEP_DRAM=1 adds each launch's DRAM bytes read,
    # HQ_STEP_CALLS=REGEX lists one step's launches of the kernels it matches (ncu_steps.py --calls)
    mkdir -p "$out/steps"
    set --
    for r in conf/examples/high_precision.ini conf/recipe.ini conf/examples/*.ini; do
      case " $* " in *" $r "*) continue ;; esac
      set -- "$@" "$r"
    done
    labels=()
    for r in "$@"; do
      l=$(basename "$r" .ini)
      HQ_PLUGIN_PATH=$plugins timeout 120 "$ncu" --csv \
        --metrics "gpu__time_duration.sum${HQ_STEP_DRAM:+,dram__bytes_read.sum}" \
        --launch-count "${HQ_STEP_LAUNCHES:-1500}" ./tools/hq train --device cuda \
        --cuda-graph off --baseline none --eval-every 0 \
        --preset "${HQ_STEP_PRESET:-default}" --steps "${HQ_STEP_STEPS:-6}" --recipe "$r" \
        ${words[@]+"${words[@]}"} > "$out/steps/$l.csv" 2>&1 || rc=1
      labels+=("$l=$out/steps/$l.csv")
    done
    python3 "$root/scripts/ncu_steps.py" ${HQ_STEP_CALLS:+--calls "$HQ_STEP_CALLS"} "${labels[@]}" \
      | tee "$out/step_kernels.txt" || rc=1
  fi
  if [[ "$modes" == *" --lanes "* ]] && [ -x tools/hq ]; then
    # a replayed step's streams (CUPTI's activity tracing, clocks left alone; Nsight Compute
    # serializes a graph's nodes): hq train with the graph on under scripts/lane_trace.c
    # (CUDA_INJECTION64_PATH), one process per recipe of HQ_LANES_RECIPES (default the BF16
    # recipe and nvfp4.ini) at --preset HQ_LANES_PRESET (default) for HQ_LANES_STEPS (60) steps;
    # scripts/lanes.py --timeline gives each replay's span, idle time, overlap and streams, and
    # the median replay node by node, into lanes.txt; each recipe's graph as Graphviz dot
    # (--graph-dot) beside its trace, in logs.tgz
    cuda=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
    # (ls fails for the path that is absent: under pipefail the list stands on its own)
    cupti=$(ls "$cuda"/lib64/libcupti.so "$cuda"/extras/CUPTI/lib64/libcupti.so 2>/dev/null \
            | head -1 || true)
    if [ -z "$cupti" ] || ! gcc -shared -fPIC -O2 -I"$cuda/include" \
         -I"$cuda/extras/CUPTI/include" "$root/scripts/lane_trace.c" -L"$(dirname "$cupti")" \
         -lcupti -Wl,-rpath,"$(dirname "$cupti")" -o "$build/lane_trace.so" \
         > "$out/lanes-build.txt" 2>&1; then
      echo "--lanes: no CUPTI under $cuda, or scripts/lane_trace.c did not build:"
      tail -5 "$out/lanes-build.txt"; rc=1
    else
      mkdir -p "$out/lanes"
      : > "$out/lanes.txt"
      for r in ${HQ_LANES_RECIPES:-conf/examples/high_precision.ini conf/examples/nvfp4.ini}; do
        l=$(basename "$r" .ini)
        CUDA_INJECTION64_PATH=$build/lane_trace.so HQ_LANE_TRACE=$out/lanes/$l.csv \
          HQ_PLUGIN_PATH=$plugins timeout 120 ./tools/hq train --device cuda --baseline none \
          --eval-every 0 --preset "${HQ_LANES_PRESET:-default}" --steps "${HQ_LANES_STEPS:-60}" \
          --graph-dot "$out/lanes/$l.dot" --recipe "$r" ${words[@]+"${words[@]}"} \
          > "$out/lanes/$l.log" 2>&1 || rc=1
        python3 "$root/scripts/lanes.py" --names "$l" --timeline "$out/lanes/$l.csv" \
          | tee -a "$out/lanes.txt" || rc=1
      done
    fi
  fi
  if [[ "$modes" == *" --launch-times "* ]] && [ -n "$ncu" ] && [ -x tools/hq ]; then
    # the per-launch times docs/performance.md quotes (Nsight Compute, clocks left alone): for
    # each line "LABEL|KERNEL-REGEX|hq bench arguments" of HQ_LT_SPECS, the HQ_LT_COUNT (5)
    # launches after the first HQ_LT_SKIP (3) of the kernels whose mangled names match, in `hq
    # bench --device cuda ARGUMENTS` (for a quantize: its 1st call makes the plan, the 2nd and
    # 3rd compute their own amaxes, the rest are given them -- the timed calls of hq bench);
    # with HQ_DEVDIST_BEFORE also with that earlier tree, each spec on both trees in turn; the
    # microseconds of each launch in launch_times.txt
    [ -n "${HQ_LT_SPECS:-}" ] || { echo "--launch-times: set HQ_LT_SPECS"; exit 2; }
    here=$PWD
    trees=(after)
    if [ -n "${HQ_DEVDIST_BEFORE:-}" ]; then
      before_tree --launch-times
      trees=(before after)
    fi
    : > "$out/launch_times.txt"
    while IFS='|' read -r label kre args; do
      [ -n "$label" ] || continue
      for v in "${trees[@]}"; do
        d=$here; [ $v = before ] && d=$before
        pp=$(ls -d "$d"/plugins/*/.libs | tr '\n' ':')
        eval set -- "$args"
        (cd "$d" && HQ_PLUGIN_PATH=$pp timeout 120 "$ncu" --clock-control none --csv \
           --metrics gpu__time_duration.sum --kernel-name-base mangled --kernel-name "regex:$kre" \
           --launch-skip "${HQ_LT_SKIP:-3}" --launch-count "${HQ_LT_COUNT:-5}" \
           ./tools/hq bench --device cuda "$@") > "$out/lt.csv" 2>&1 || rc=1
        t=$(python3 "$root/scripts/ncu_steps.py" --launches "$out/lt.csv" 2>&1) || rc=1
        printf '%-40s %-6s %s\n' "$label" "$v" "$t" | tee -a "$out/launch_times.txt"
      done
    done <<< "$HQ_LT_SPECS"
  fi
  if [[ "$modes" == *" --bench "* && "$modes" != *" --peers "* ]] && [ -x tools/hq ]; then
    set -- ${HQ_BENCH_ARGS:---all}
    HQ_PLUGIN_PATH=$plugins ./tools/hq bench --device cuda "$@" \
      | tee "$out/bench.txt"
  fi
  if [[ "$modes" == *" --peers "* ]] && [ -x tools/hq ]; then
    # hq bench (text and --json) and the PyTorch peers of scripts/bench_peers.py in one call, so
    # that hq's speed-up over torch.compile is measured in the same run. The script is not in
    # the tarball: it runs from the carried working tree ($root).
    set -- ${HQ_BENCH_ARGS:-}
    HQ_PLUGIN_PATH=$plugins ./tools/hq bench --device cuda "$@" | tee "$out/bench.txt" || rc=1
    HQ_PLUGIN_PATH=$plugins ./tools/hq bench --device cuda --json "$@" > "$out/bench.json" || rc=1
    timeout "${HQ_PEERS_TIMEOUT:-300}" python3 -u "$root/scripts/bench_peers.py" \
      --json "$out/peers.json" --hq-json "$out/bench.json" ${HQ_PEERS_ARGS:-} \
      | tee "$out/peers.txt" || rc=1
    # the hybrid check (both <= 1.1x rowwise + columnwise alone) on the stock recipes' hybrids:
    # MXFP8 forward + NVFP4 (RHT / 2-D) backward, FP8 forward + BF16 backward
    : > "$out/hybrid.txt"
    for rr in "conf/recipe.ini linear:input:x" "conf/recipe.ini linear:weight:x" \
              "conf/examples/hybrid_fp8_identity.ini linear:input:x"; do
      set -- $rr
      HQ_PLUGIN_PATH=$plugins ./tools/hq bench --device cuda --recipe "$1" --role "$2" 2>&1 \
        | tee -a "$out/hybrid.txt" || rc=1
    done
  fi
  if [[ "$modes" == *" --train "* ]] && [ -x tools/hq ]; then
    # the main job on the GPU: every shipped recipe (and the FP32 baseline) on the default model,
    # then on a wider one (HQ_TRAIN_ARGS: more hq train arguments for both), tables in
    # train.txt and train_wide.txt
    set -- --recipe conf/recipe.ini
    for r in conf/examples/*.ini; do set -- "$@" --recipe "$r"; done
    set -- "$@" ${words[@]+"${words[@]}"}
    # --json documents (train.json, train_wide.json) for docs-tables.py's gpu block, the
    # progress and notes in train.txt and train_wide.txt
    HQ_PLUGIN_PATH=$plugins ./tools/hq train --device cuda "$@" ${HQ_TRAIN_ARGS:-} --json \
      > "$out/train.json" 2> "$out/train.txt" || { rc=1; tail -5 "$out/train.txt"; }
    HQ_PLUGIN_PATH=$plugins ./tools/hq train --device cuda "$@" --preset wide --steps 300 \
      ${HQ_TRAIN_ARGS:-} --json > "$out/train_wide.json" 2> "$out/train_wide.txt" \
      || { rc=1; tail -5 "$out/train_wide.txt"; }
  fi
  if [[ "$modes" == *" --train-ab "* ]] && [ -x tools/hq ]; then
    # before/after throughput: every shipped recipe with the BF16 baseline, default and wide
    # models, graph on, with this build and with the carried tarball HQ_DEVDIST_BEFORE (an
    # earlier tree's make dist, built --quick in its own folder) or this build's variant
    # (HQ_AB_BEFORE_CPPFLAGS), the two builds' runs interleaved per size; train_ab.md is
    # scripts/train_ab.py's table of both
    here=$PWD
    if [ -n "${HQ_AB_BEFORE_CPPFLAGS:-}" ]; then
      # "PLUGIN FLAGS...": before is this build with PLUGIN's C sources recompiled with the
      # preprocessor flags (e.g. "fp8_block -DHQ_FP8B_GEMM_MAX_MNK=0": a switch turned off),
      # its module in a folder of its own, so that no second tree is built
      read -r abp abf <<< "$HQ_AB_BEFORE_CPPFLAGS"
      bdir=/tmp/hqbuild/ab-before-$abp
      rm -rf "$bdir" && mkdir -p "$bdir"
      # the C objects only (automake names them MODULE_la-SOURCE.lo; the CUDA ones stay built)
      c_objs() { rm -f plugins/$abp/*_la-*.lo $(ab_mods "$abp"); }
      { c_objs && make -s CPPFLAGS="$abf" $(ab_mods "$abp") && cp plugins/$abp/.libs/*.so "$bdir/" \
          && c_objs && make -s $(ab_mods "$abp"); } \
        > "$out/before-build.txt" 2>&1 || { tail -20 "$out/before-build.txt"; exit 1; }
      before=$here
    else
      before_tree "--train-ab (or HQ_AB_BEFORE_CPPFLAGS)"
    fi
    # HQ_AB_RECIPES: the recipes (paths from the tree's root; the BF16 one, the baseline, is
    # always run), default every shipped one; HQ_AB_SIZES: default and wide; HQ_AB_ROUNDS
    # rounds, each running every size with both builds, so that the machine's drift falls on
    # both alike (train_ab.py gives each cell the rounds' smallest and largest figures)
    set -- --recipe conf/examples/high_precision.ini
    for r in ${HQ_AB_RECIPES:-conf/recipe.ini conf/examples/*.ini}; do
      [ "$r" = conf/examples/high_precision.ini ] || set -- "$@" --recipe "$r"
    done
    set -- "$@" ${words[@]+"${words[@]}"}
    set -- "$@" --device cuda --eval-every 0 --baseline bf16-baseline --json ${HQ_TRAIN_ARGS:-}
    sizes=${HQ_AB_SIZES:-default wide}
    for round in $(seq 1 "${HQ_AB_ROUNDS:-1}"); do
      for size in $sizes; do
        sz=(--steps ${HQ_AB_STEPS_DEFAULT:-2000})
        [ $size = wide ] && sz=(--preset wide --steps ${HQ_AB_STEPS_WIDE:-300})
        for v in before after; do
          d=$here; [ $v = before ] && d=$before
          f=$out/ab_${size}_${v}_$round
          pp=$(ls -d "$d"/plugins/*/.libs | tr '\n' ':')
          [ $v = before ] && [ -n "${HQ_AB_BEFORE_CPPFLAGS:-}" ] \
            && pp=$(echo "$pp" | sed "s|$d/plugins/$abp/.libs|$bdir|")
          (cd "$d" && HQ_PLUGIN_PATH=$pp ./tools/hq train "$@" "${sz[@]}" > "$f.json" \
             2> "$f.err") || rc=1
        done
      done
    done
    cols=()
    for size in $sizes; do
      for v in before after; do
        cols+=("$size, $v=$(ls "$out"/ab_${size}_${v}_*.json | paste -sd, -)")
      done
    done
    python3 "$root/scripts/train_ab.py" "${cols[@]}" | tee "$out/train_ab.md" || rc=1
  fi
  if [[ "$modes" == *" --sanitize "* ]]; then
    # compute-sanitizer on the GPU tests' real binaries (libtool wraps them in scripts)
    export HQ_PLUGIN_PATH=$plugins HQ_TEST_SRCDIR=$PWD/tests HQ_TEST_FIXTURES=$PWD/tests/plugins/.libs \
      HQ_TEST_WRAP_DIR=$PWD/tests/wrap/.libs
    export LD_LIBRARY_PATH=$PWD/core/.libs:$PWD/services/.libs:$LD_LIBRARY_PATH
    export HQ_TEST_QUICK=1 # tests that honour it run a smaller set of shapes under the tools
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    # HQ_SAN_TESTS: the test programs (default every GPU test, or HQ_ONLY); HQ_SAN_TOOLS: the
    # tools (default memcheck racecheck synccheck)
    tests=${HQ_SAN_TESTS:-${HQ_ONLY:-test_gpu_*}}
    # the sanitizer reports that are not hq's (scripts/sanitizer_filters.sh)
    . "$root/scripts/sanitizer_filters.sh"
    for t in $(for n in $tests; do echo tests/.libs/$n; done); do
      case $t in *lt-*) continue ;; esac
      [ -x "$t" ] || continue
      for tool in ${HQ_SAN_TOOLS:-memcheck racecheck synccheck}; do
        log=$out/$(basename "$t").$tool.log
        if "$san" --tool $tool --error-exitcode 1 "$t" > "$log" 2>&1; then
          echo "compute-sanitizer $tool $(basename "$t"): clean"
        elif lib=$(san_library_races "$tool" "$log"); then
          echo "compute-sanitizer $tool $(basename "$t"): clean in hq's kernels; $lib"
        elif api=$(san_provoked_api_errors "$tool" "$log"); then
          echo "compute-sanitizer $tool $(basename "$t"): clean; $api"
        else
          echo "compute-sanitizer $tool $(basename "$t"): FAILED"; tail -20 "$log"; rc=1
        fi
      done
    done
  fi
  exit $rc
fi

top=$(git rev-parse --show-toplevel)
cd "$top"
# the tarball is made out of tree (build/dist), so the source tree stays unconfigured
[ -x configure ] || autoreconf -fi >/dev/null
# HQ_DEVDIST names the carried folder (default .devdist), so that several people preparing runs
# at once do not overwrite each other's tarball
dd=${HQ_DEVDIST:-.devdist}
bd=build/dist${HQ_DEVDIST:+-$HQ_DEVDIST}
mkdir -p "$bd"
(cd "$bd" && { [ -f Makefile ] || "$top/configure" -q --without-cuda; } && make -s dist >/dev/null)
mkdir -p "$dd"
rm -f "$dd"/hq-*.tar.gz
mv "$bd"/hq-*.tar.gz "$dd"/
if [ ! -d .devdeps/usr/include ]; then
  deps=$top/../shared/tools/device-deps.sh
  [ -x "$deps" ] || deps=/work/shared/tools/device-deps.sh
  bash "$deps" .devdeps
fi
# nor is the word list hq train reads (Debian's wamerican), for --train
[ -f .devdeps/words ] || cp /usr/share/dict/words .devdeps/words 2>/dev/null || true
# jansson and xxHash (checkpoints and their checksums) are not on the device image either:
# unpack Debian's packages beside them
if [ ! -f .devdeps/usr/include/jansson.h ] || [ ! -f .devdeps/usr/include/xxhash.h ]; then
  mkdir -p .devdeps/debs
  (cd .devdeps/debs && apt-get download libjansson4 libjansson-dev libxxhash0 libxxhash-dev 2>/dev/null)
  for d in .devdeps/debs/*.deb; do dpkg -x "$d" .devdeps; done
  rm -rf .devdeps/debs
  sed -i -e 's|^prefix=/usr$|prefix=${pcfiledir}/../../..|' \
    .devdeps/usr/lib/x86_64-linux-gnu/pkgconfig/jansson.pc \
    .devdeps/usr/lib/x86_64-linux-gnu/pkgconfig/libxxhash.pc
fi
# --prebuild: the --quick build made here, at the folder the device builds in, and packed into
# .devbuild (carried with the tarball): this machine's nvcc compiles what the device's would, and
# the device's minutes go to the run. HQ_CUDA_ARCH defaults to 90 here (the lent GPUs' sm_90).
if [ "${1:-}" = "--prebuild" ]; then
  export HQ_CUDA_ARCH=${HQ_CUDA_ARCH:-90}
  pb=/tmp/hqbuild/$dd
  rm -rf "$pb" && mkdir -p "$pb" && tar xzf "$dd"/hq-*.tar.gz -C "$pb"
  (cd "$pb"/hq-*/ && configure_cuda /tmp/hqbuild/prebuild-configure.log &&
     quick_build "$(nproc)" /tmp/hqbuild/prebuild-build.log) ||
    { tail -30 /tmp/hqbuild/prebuild-build.log /tmp/hqbuild/prebuild-configure.log; exit 1; }
  mkdir -p .devbuild
  pbt=$(prebuilt_path "$dd")
  # with its objects and their times, so that a mode that builds more on the device (--ab, a
  # test) rebuilds only what it changes, as in a tree built there
  tar czf "$pbt.tgz" -C /tmp/hqbuild "$dd"
  prebuild_stamp "$dd"/hq-*.tar.gz > "$pbt.stamp"
  echo "prebuilt: $pbt.tgz ($(du -sh "$pbt.tgz" | cut -f1); $(cut -d' ' -f2- "$pbt.stamp"))"
fi
cat <<MSG
ready: $(ls "$dd"/) in $dd and .devdeps/ ($(du -sh .devdeps | cut -f1))
device tool call:
  run  carry   = ["$dd", ".devdeps"]   (with HQ_DEVDIST=$dd set in the command when not .devdist;
                                        add ".devbuild" after --prebuild, for --on-device --quick)
       command = "bash scripts/gpu-check.sh --on-device"  (add --bench, --peers or --sanitize)
MSG
