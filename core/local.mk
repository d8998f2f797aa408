# core/local.mk -- libhqcore and its public headers
lib_LTLIBRARIES += core/libhqcore.la
hqincludedir = $(includedir)/hq
hqinclude_HEADERS = core/include/hq/hq.h core/include/hq/plugin.h core/include/hq/numerics.h \
	core/include/hq/train.h core/include/hq/adamw.h
core_libhqcore_la_SOURCES = core/hq_internal.h core/error.c core/util.c core/device.c core/ctx.c \
	core/loader.c core/options.c core/role.c core/recipe.c core/quantizer.c core/fsdp.c \
	core/identity.c core/gemm.c core/state.c core/cuda/fused_gemm.h
core_libhqcore_la_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_builddir)/core $(INIH_CFLAGS) $(OPENBLAS_CFLAGS) \
	$(CUDA_CPPFLAGS)
core_libhqcore_la_LIBADD = $(INIH_LIBS) $(OPENBLAS_LIBS)
core_libhqcore_la_LDFLAGS = -version-info $(HQCORE_LT_VERSION) -no-undefined \
	-export-symbols-regex '^hq_' $(HQ_SAN_LDFLAGS)
EXTRA_DIST += core/cuda/kernels.cu core/cuda/gemm.cu core/cuda/fused_gemm.cu \
	core/cuda/wgmma_m64n256k16.h
if HAVE_CUDA
core_libhqcore_la_LIBADD += core/cuda/kernels.lo core/cuda/gemm.lo core/cuda/fused_gemm.lo \
	-lcublasLt -lcudart -lstdc++
core_libhqcore_la_LDFLAGS += $(CUDA_LDFLAGS)
endif
# The installed plugin directory is compiled into the loader through a generated header that
# is rewritten (only when it changes) whenever configure's answers change.
nodist_core_libhqcore_la_SOURCES = core/hq_paths.h
BUILT_SOURCES = core/hq_paths.h
CLEANFILES += core/hq_paths.h
core/hq_paths.h: Makefile
	$(AM_V_GEN)mkdir -p core && \
	echo '#define HQ_PLUGINDIR "$(hqplugindir)"' > $@.tmp && \
	if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
# The fused GEMM uses Hopper's wgmma and TMA, which exist only in arch-specific sm_90a code: this
# object is built for sm_90a alone (whatever NVCC_GENCODE says), and the core launches it only on
# a device of compute capability 9.0.
core/cuda/fused_gemm.lo: core/cuda/fused_gemm.cu
	$(AM_V_NVCC)$(SHELL) $(top_srcdir)/build-aux/cuda-lt.sh $@ $(NVCC) $(HQ_NVCCFLAGS_ARCHLESS) \
	  -gencode arch=compute_90a,code=sm_90a $(NVCCFLAGS) -c `test -f core/cuda/fused_gemm.cu || echo '$(srcdir)/'`core/cuda/fused_gemm.cu
