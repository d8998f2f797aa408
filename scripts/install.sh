#!/bin/bash
# install.sh -- the README's first command: install what hq needs (Debian/Ubuntu packages),
# build it out of tree (build/release), install it (default prefix /usr/local; PREFIX=... to
# change) and run the main job with the installed default recipe.
#
# Works on a fresh clone as root (a container: no sudo needed) or as a user with sudo. The
# source tree stays unconfigured, so the second command, scripts/check.sh, runs right after it
# in the same tree (and tests this build/release instead of building another).
#
# CUDA (nvcc found on PATH or in /usr/local/cuda/bin): HQ_CUDA_ARCH chooses the GPU
# architectures, as configure's --with-cuda-arch: native, all (sm_90 and Blackwell), a list
# (90,100), or none (the CPU paths only). Unset, it is native where nvidia-smi reports a GPU of
# compute capability 9.0 or 10.x, and none otherwise: on a machine without such a GPU the CUDA
# paths could not run, and building them for every target costs most of the set-up time (CI
# asks for all: .ci/run). ccache, when installed, compiles C and CUDA (HQ_CCACHE=no: not).
#
# Open MPI (openmpi-bin, libopenmpi-dev) gives the FSDP gather its MPI backend and the MPI tests
# their mpirun, NCCL (with the CUDA toolkit) its NCCL backend.
# A later run reuses build/release when it was configured with the same arguments, and
# configures it again when not (tests/test_install.sh).
# Then it installs the Python package (python/, docs/python.md) with pip, built against the hq
# just installed: into the system's python3 (pip's user site when that is not writable) or,
# where the system Python is externally managed (PEP 668: Debian 12, Ubuntu 23.04 and later) or
# HQ_VENV names a directory, into a venv it creates there (default build/venv, with the
# system's site packages visible). PyTorch is optional and large (the PyPI wheel pulls the CUDA
# libraries, about 3 GB): HQ_WITH_TORCH=1 installs it too (.ci/run sets it).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
prefix=${PREFIX:-/usr/local}
sudo=
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install.sh: not root and no sudo: run as root" >&2; exit 1; }
  sudo=sudo
fi
pkgs="autoconf automake libtool pkg-config make gcc libinih-dev libcmocka-dev libopenblas-dev libjansson-dev libxxhash-dev wamerican openmpi-bin libopenmpi-dev"
missing=
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "== installing:$missing"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
. "$top/scripts/build-args.sh"
[ -x configure ] || autoreconf -fi
mkdir -p build/release
cd build/release
# Reuse build/release only when its configuration was made with exactly these arguments:
# config.status --config lists them (autoconf quotes them, drops -q, and appends precious
# variables set in the environment, such as CC=...). Anything else -- another PREFIX, a
# configuration of another origin, CC set now or then -- reconfigures: a stale prefix would
# install into the first run's directory and bake its plugin directory into libhqcore.
args=(--prefix="$prefix")
hq_build_args
args+=("${hq_args[@]}")
echo "== $hq_args_why"
want=$(printf '%s\n' "${args[@]}")
have=
if [ -f Makefile ] && [ -x config.status ]; then
  have=$(eval "printf '%s\n' $(./config.status --config)") || have=
fi
if [ -n "$have" ] && [ "$have" = "$want" ]; then
  echo "== reusing build/release (configured with ${args[*]})"
else
  echo "== configure ${args[*]}"
  # configure.log: scripts/check.sh checks it as it checks the configurations it makes itself
  "$top/configure" -q "${args[@]}" > configure.log 2>&1 || { tail -20 configure.log; exit 1; }
  cat configure.log
fi
echo "== make"
make -s -j"$(nproc 2>/dev/null || echo 2)" >/dev/null
echo "== make install"
$sudo make -s install >/dev/null
$sudo ldconfig 2>/dev/null || true
if [ -d "$top/python" ]; then
  py=python3
  command -v python3 >/dev/null || {
    $sudo apt-get install -y -qq --no-install-recommends python3 >/dev/null; }
  # pip builds the extension: it needs Python.h and, for a venv, the venv module
  if ! python3 -c 'import os, sysconfig, venv, ensurepip; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null; then
    echo "== installing: python3-dev python3-venv python3-pip"
    $sudo apt-get install -y -qq --no-install-recommends python3-dev python3-venv python3-pip >/dev/null
  fi
  managed=$(python3 -c 'import os, sysconfig; print(os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED")))')
  if [ -n "${HQ_VENV:-}" ] || [ "$managed" = True ]; then
    venv=${HQ_VENV:-$top/build/venv}
    [ -x "$venv/bin/python3" ] || python3 -m venv --system-site-packages "$venv"
    py=$venv/bin/python3
    where="the venv $venv (activate it: . $venv/bin/activate)"
  else
    where="the system Python, $(command -v python3)"
  fi
  echo "== python package: pip install into $where"
  "$py" -m pip install -q --disable-pip-version-check "setuptools>=70.1" cffi numpy pytest ml_dtypes
  if [ "${HQ_WITH_TORCH:-0}" = 1 ]; then
    echo "== pip install torch (HQ_WITH_TORCH=1)"
    "$py" -m pip install -q --disable-pip-version-check torch
  fi
  # built against the hq just installed: its hqcore.pc first on pkg-config's path
  PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" \
    "$py" -m pip install -q --disable-pip-version-check --no-build-isolation --force-reinstall \
    --no-deps "$top/python"
  "$py" -c 'import hq; print("   import hq: hq %s, formats %s" % (hq.version(), ", ".join(f["name"] for f in hq.info()["formats"])))'
fi
hq=$prefix/bin/hq
# OpenBLAS picks its sgemm kernel by CPU model, and its kernels sum in different orders, so a
# quantized recipe's held-out loss moves in the third decimal from one CPU model to another. The
# README's figures are those of its AVX2 kernels, which every x86-64 CPU with AVX2 and FMA runs:
# the main job asks for them there (unless OPENBLAS_CORETYPE is set), so that its table is the
# README's on any such machine. HQ_CPUINFO: where the CPU flags are read (a test's fake).
blas=()
cpuinfo=${HQ_CPUINFO:-/proc/cpuinfo}
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx2 "$cpuinfo" 2>/dev/null &&
   grep -qw fma "$cpuinfo" 2>/dev/null; then
  blas=(OPENBLAS_CORETYPE=Haswell)
fi
echo "== $hq train   (the main job: the default recipe and an FP32 baseline, on the CPU)"
[ ${#blas[@]} -eq 0 ] || echo "   with ${blas[0]}: the AVX2 kernels of OpenBLAS, whose losses the README shows"
env ${blas[@]+"${blas[@]}"} "$hq" train
