# HQ_CHECK_CUDA: --with-cuda[=DIR] / --without-cuda. Default: use CUDA when nvcc is found.
# Sets hq_have_cuda=yes|no and substitutes NVCC, NVCC_GENCODE, CUDA_CPPFLAGS, CUDA_LDFLAGS, CUDA_LIBS.
AC_DEFUN([HQ_CHECK_CUDA], [
AC_ARG_WITH([cuda],
  [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [build the CUDA paths (default: when nvcc is found); DIR is the toolkit root])],
  [], [with_cuda=guess])
AC_ARG_VAR([NVCC], [the CUDA compiler])
AC_ARG_VAR([NVCC_GENCODE], [nvcc -gencode flags (default: sm_90 and sm_100f code (sm_100 where nvcc has no sm_100f), compute_100 PTX)])
AC_ARG_VAR([NVCCFLAGS], [extra nvcc flags, added after the project's])
hq_have_cuda=no
AS_IF([test "x$with_cuda" != xno], [
  hq_cuda_dir=
  AS_CASE([$with_cuda], [yes|guess], [], [hq_cuda_dir=$with_cuda])
  AS_IF([test -z "$hq_cuda_dir" && test -d /usr/local/cuda], [hq_cuda_dir=/usr/local/cuda])
  AC_PATH_PROG([NVCC], [nvcc], [no], [$hq_cuda_dir/bin:$PATH])
  AS_IF([test "x$NVCC" != xno], [
    AS_IF([test -z "$hq_cuda_dir"], [hq_cuda_dir=`dirname \`dirname $NVCC\``])
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
    # Blackwell's code as the family-specific sm_100f (B200/GB200 and B300/GB300: sm_100 and
    # sm_103) where nvcc knows it (12.9 and later): its FP4 and E8M0 convert instructions
    # (plugins/common/mx_cvt_cuda.h) exist only there; generic sm_100 code otherwise.
    AC_MSG_CHECKING([whether $NVCC builds the family-specific target sm_100f])
    hq_b_arch=compute_100; hq_b_code=sm_100
    echo '__global__ void hq_conftest_kernel(void) {}' > conftest.cu
    AS_IF([$NVCC -gencode arch=compute_100f,code=sm_100f -c conftest.cu -o conftest.o >&AS_MESSAGE_LOG_FD 2>&1],
      [hq_b_arch=compute_100f; hq_b_code=sm_100f; AC_MSG_RESULT([yes])], [AC_MSG_RESULT([no])])
    rm -f conftest.cu conftest.o
    NVCC_GENCODE="-gencode arch=compute_90,code=sm_90 -gencode arch=$hq_b_arch,code=$hq_b_code -gencode arch=compute_100,code=compute_100"])
  CUDA_LIBS="-lcublasLt -lcudart -lstdc++"
  AC_DEFINE([HQ_HAVE_CUDA], [1], [Define to 1 when the CUDA paths are built])
], [NVCC=; NVCC_GENCODE=])
AC_MSG_CHECKING([whether to build the CUDA paths])
AC_MSG_RESULT([$hq_have_cuda])
AC_SUBST([CUDA_CPPFLAGS])
AC_SUBST([CUDA_LDFLAGS])
AC_SUBST([CUDA_LIBS])
])
