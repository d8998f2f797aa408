# build-args.sh -- sourced by scripts/install.sh and scripts/check.sh (bash): the configure
# arguments both add for CUDA and ccache, in hq_args (an array), and a line saying why, in
# hq_args_why.
#
# HQ_CUDA_ARCH: native | all | LIST (90,100) | none; unset: native where nvidia-smi reports a
# GPU of compute capability 9.0 or 10.x, none otherwise (also when nvcc is not found). "all"
# builds every CUDA source for sm_90 and Blackwell, as CI does (.ci/run sets it).
# HQ_CCACHE: no to compile without ccache; otherwise ccache is used when it is on PATH.
# HQ_CUDA_BIN: where nvcc is looked for besides PATH (default /usr/local/cuda/bin).
hq_build_args() {
  local bin=${HQ_CUDA_BIN:-/usr/local/cuda/bin} arch=${HQ_CUDA_ARCH:-} caps= c
  [ -d "$bin" ] && case ":$PATH:" in *:"$bin":*) ;; *) PATH=$PATH:$bin ;; esac
  hq_args=()
  if ! command -v nvcc > /dev/null; then
    [ -n "$arch" ] && [ "$arch" != none ] &&
      { echo "HQ_CUDA_ARCH=$arch, but nvcc is not found (PATH, $bin)" >&2; return 1; }
    hq_args_why="CUDA: nvcc not found: the CPU paths only"
    arch=none
  elif [ -z "$arch" ]; then
    caps=$({ nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null || true; } |
      tr -d ' .' | sort -u | tr '\n' ' ')
    for c in $caps; do case $c in 90 | 10?) arch=native ;; esac; done
    if [ "$arch" = native ]; then
      hq_args_why="CUDA: built for this machine's GPUs (compute capability ${caps% }; HQ_CUDA_ARCH=all for every target)"
    else
      arch=none
      hq_args_why="CUDA: nvcc found but no GPU of compute capability 9.0 or 10.x${caps:+ (found: ${caps% })}: the CPU paths only, the quick set-up (HQ_CUDA_ARCH=all builds the CUDA paths for sm_90 and Blackwell)"
    fi
  else
    hq_args_why="CUDA: HQ_CUDA_ARCH=$arch"
  fi
  if [ "$arch" = none ]; then
    hq_args+=(--without-cuda)
  else
    hq_args+=(--with-cuda-arch="$arch")
  fi
  if [ "${HQ_CCACHE:-}" != no ] && command -v ccache > /dev/null; then
    hq_args+=("CC=ccache ${CC:-gcc}")
    [ "$arch" != none ] && hq_args+=("NVCC=ccache $(command -v nvcc)")
    hq_args_why="$hq_args_why; compiling through ccache"
  fi
  return 0
}
