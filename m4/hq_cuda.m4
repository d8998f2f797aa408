# HQ_CHECK_CUDA: --with-cuda[=DIR] / --without-cuda. Default: use CUDA when nvcc is found.
# Sets hq_have_cuda=yes|no and substitutes NVCC, NVCC_GENCODE, CUDA_CPPFLAGS, CUDA_LDFLAGS, CUDA_LIBS.
AC_DEFUN([HQ_CHECK_CUDA], [
AC_ARG_WITH([cuda],
  [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [build the CUDA paths (default: when nvcc is found); DIR is the toolkit root])],
  [], [with_cuda=guess])
AC_ARG_WITH([cuda-arch],
  [AS_HELP_STRING([--with-cuda-arch=native|all|LIST],
    [the GPU architectures the CUDA paths are built for: all (sm_90 and Blackwell, the default),
     native (those of the GPUs nvidia-smi reports), or a comma-separated list of compute
     capabilities (90,100 or 9.0,10.3); NVCC_GENCODE, when set, is used as it is])],
  [], [with_cuda_arch=all])
AC_ARG_VAR([NVCC], [the CUDA compiler])
AC_ARG_VAR([NVCC_GENCODE], [nvcc -gencode flags (default: from --with-cuda-arch; all = sm_90 and sm_100f code (sm_100 where nvcc has no sm_100f), compute_100 PTX)])
AC_ARG_VAR([NVCCFLAGS], [extra nvcc flags, added after the project's])
hq_have_cuda=no
AS_IF([test "x$with_cuda" != xno], [
  hq_cuda_dir=
  AS_CASE([$with_cuda], [yes|guess], [], [hq_cuda_dir=$with_cuda])
  AS_IF([test -z "$hq_cuda_dir" && test -d /usr/local/cuda], [hq_cuda_dir=/usr/local/cuda])
  # NVCC may carry a launcher before the compiler (NVCC="ccache /usr/local/cuda/bin/nvcc"):
  # the compiler is looked up alone and the launcher put back in front of it
  hq_nvcc_launcher=
  AS_CASE([$NVCC], [*" "*], [hq_nvcc_launcher=`echo "$NVCC" | sed 's/ [[^ ]]*$//'`
                             NVCC=`echo "$NVCC" | sed 's/.* //'`])
  AC_PATH_PROG([NVCC], [nvcc], [no], [$hq_cuda_dir/bin:$PATH])
  AS_IF([test "x$NVCC" != xno], [
    AS_IF([test -z "$hq_cuda_dir"], [hq_cuda_dir=`dirname \`dirname $NVCC\``])
    AS_IF([test -n "$hq_nvcc_launcher"], [NVCC="$hq_nvcc_launcher $NVCC"])
    CUDA_CPPFLAGS="-I$hq_cuda_dir/include"
    hq_cuda_libdir=$hq_cuda_dir/lib64
    AS_IF([test -d "$hq_cuda_dir/targets/x86_64-linux/lib"], [hq_cuda_libdir="$hq_cuda_dir/targets/x86_64-linux/lib"])
    CUDA_LDFLAGS="-L$hq_cuda_libdir -Wl,-rpath,$hq_cuda_libdir"
    hq_save_CPPFLAGS=$CPPFLAGS; hq_save_LDFLAGS=$LDFLAGS; hq_save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"; LDFLAGS="$LDFLAGS $CUDA_LDFLAGS"
    hq_cuda_ok=yes
    AC_CHECK_HEADER([cuda_runtime.h], [], [hq_cuda_ok=no])
    AC_CHECK_LIB([cudart], [cudaGetDeviceCount], [:], [hq_cuda_ok=no])
    AC_CHECK_LIB([cublasLt], [cublasLtCreate], [:], [hq_cuda_ok=no])
    CPPFLAGS=$hq_save_CPPFLAGS; LDFLAGS=$hq_save_LDFLAGS; LIBS=$hq_save_LIBS
    AS_IF([test "x$hq_cuda_ok" = xyes], [hq_have_cuda=yes])
  ])
  AS_IF([test "x$hq_have_cuda" = xno && test "x$with_cuda" != xguess],
    [AC_MSG_ERROR([CUDA was requested but nvcc, cuda_runtime.h, libcudart or libcublasLt was not found (NVIDIA's CUDA toolkit; Debian: nvidia-cuda-toolkit)])])
])
AS_IF([test "x$hq_have_cuda" = xyes], [
  AS_IF([test -z "$NVCC_GENCODE"], [
    # The compute capabilities asked for: hq's kernels are written for Hopper (9.0) and
    # Blackwell (10.x); native takes those of the GPUs present and leaves any other out.
    AS_CASE([$with_cuda_arch],
      [all|yes], [hq_caps="90 100"],
      [native], [
        AC_PATH_PROG([NVIDIA_SMI], [nvidia-smi], [no])
        hq_caps=
        AS_IF([test "x$NVIDIA_SMI" != xno],
          [hq_caps=`$NVIDIA_SMI --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | sort -u | tr '\n' ' '`])
        hq_native=
        for hq_c in $hq_caps; do
          AS_CASE([$hq_c], [90|10?], [hq_native="$hq_native $hq_c"],
            [AC_MSG_WARN([a GPU of compute capability $hq_c: hq's CUDA paths are built for 9.0 and 10.x only; left out])])
        done
        hq_caps=$hq_native
        AS_IF([test -z "$hq_caps"],
          [AC_MSG_ERROR([--with-cuda-arch=native: nvidia-smi reports no GPU of compute capability 9.0 or 10.x (give all, a list such as 90,100, or --without-cuda)])])],
      [hq_caps=`echo "$with_cuda_arch" | sed 's/sm_//g; s/\.//g; s/,/ /g'`])
    AC_MSG_CHECKING([the compute capabilities to build for])
    AC_MSG_RESULT([$hq_caps])
    hq_h=no hq_b=no
    for hq_c in $hq_caps; do
      AS_CASE([$hq_c], [90], [hq_h=yes], [10?], [hq_b=yes],
        [AC_MSG_ERROR([--with-cuda-arch: '$hq_c' is not 90 (Hopper) or 100/103 (Blackwell)])])
    done
    NVCC_GENCODE=
    AS_IF([test $hq_h = yes], [NVCC_GENCODE="-gencode arch=compute_90,code=sm_90"])
    AS_IF([test $hq_b = yes], [
      # Blackwell's code as the family-specific sm_100f (B200/GB200 and B300/GB300: sm_100 and
      # sm_103) where nvcc knows it (12.9 and later): its FP4 and E8M0 convert instructions
      # (plugins/common/mx_cvt_cuda.h) exist only there; generic sm_100 code otherwise. Plus
      # compute_100 PTX, which later GPUs compile when they load it.
      AC_MSG_CHECKING([whether $NVCC builds the family-specific target sm_100f])
      hq_b_arch=compute_100; hq_b_code=sm_100
      echo '__global__ void hq_conftest_kernel(void) {}' > conftest.cu
      AS_IF([$NVCC -gencode arch=compute_100f,code=sm_100f -c conftest.cu -o conftest.o >&AS_MESSAGE_LOG_FD 2>&1],
        [hq_b_arch=compute_100f; hq_b_code=sm_100f; AC_MSG_RESULT([yes])], [AC_MSG_RESULT([no])])
      rm -f conftest.cu conftest.o
      NVCC_GENCODE="$NVCC_GENCODE -gencode arch=$hq_b_arch,code=$hq_b_code -gencode arch=compute_100,code=compute_100"])
    NVCC_GENCODE=`echo $NVCC_GENCODE`])
  CUDA_LIBS="-lcublasLt -lcudart -lstdc++"
  AC_DEFINE([HQ_HAVE_CUDA], [1], [Define to 1 when the CUDA paths are built])
], [NVCC=; NVCC_GENCODE=])
AC_MSG_CHECKING([whether to build the CUDA paths])
AC_MSG_RESULT([$hq_have_cuda])
AC_SUBST([CUDA_CPPFLAGS])
AC_SUBST([CUDA_LDFLAGS])
AC_SUBST([CUDA_LIBS])
])
