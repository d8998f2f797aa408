# gemm/local.mk -- the GEMM providers compiled into libhqcore (hq/gemm_provider.h): cublaslt/
# (cuBLASLt's native GEMMs, and the runner every provider and format calls through
# hq_host_api.lt_matmul), fused_hopper/ (the Hopper kernel that decodes MXFP8 / NVFP4 in the
# GEMM) and emulated/ (raw values, then one BF16 / F32 GEMM or a CPU sgemm). Each is written
# against the provider ABI alone and entered through gemm/builtin.h.
noinst_LTLIBRARIES += gemm/libhqgemm.la
gemm_libhqgemm_la_SOURCES = gemm/builtin.h gemm/cublaslt/lt_names.h gemm/cublaslt/cublaslt.c \
	gemm/emulated/emulated.c gemm/fused_hopper/fused.c gemm/fused_hopper/fused_gemm.h
gemm_libhqgemm_la_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core -DHQ_GEMM_BUILTIN \
	$(OPENBLAS_CFLAGS)
gemm_libhqgemm_la_LIBADD = $(OPENBLAS_LIBS)
EXTRA_DIST += gemm/cublaslt/runner.cu gemm/fused_hopper/fused_gemm.cu \
	gemm/fused_hopper/wgmma_m64n256k16.h
if HAVE_CUDA
gemm_libhqgemm_la_LIBADD += gemm/cublaslt/runner.lo gemm/fused_hopper/fused_gemm.lo -lcublasLt
else
gemm_libhqgemm_la_SOURCES += gemm/cublaslt/runner_none.c
endif
# The fused kernel uses Hopper's wgmma and TMA, which exist only in arch-specific sm_90a code: it
# is built for sm_90a alone (whatever NVCC_GENCODE says), and the provider launches it only on a
# device of compute capability 9.0. It decodes with the formats' own rules headers.
gemm/fused_hopper/fused_gemm.lo: gemm/fused_hopper/fused_gemm.cu
	$(AM_V_NVCC)$(SHELL) $(top_srcdir)/build-aux/cuda-lt.sh $@ $(NVCC) $(HQ_NVCCFLAGS_ARCHLESS) \
	  -I$(top_srcdir)/plugins -gencode arch=compute_90a,code=sm_90a $(NVCCFLAGS) -c \
	  `test -f gemm/fused_hopper/fused_gemm.cu || echo '$(srcdir)/'`gemm/fused_hopper/fused_gemm.cu
