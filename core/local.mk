# core/local.mk -- libhqcore and its public headers
lib_LTLIBRARIES += core/libhqcore.la
hqincludedir = $(includedir)/hq
hqinclude_HEADERS = core/include/hq/hq.h core/include/hq/plugin.h core/include/hq/numerics.h \
	core/include/hq/gemm_provider.h core/include/hq/train.h core/include/hq/adamw.h \
	core/include/hq/dist.h
core_libhqcore_la_SOURCES = core/hq_internal.h core/hqi_cuda.h core/scratch.h core/error.c \
	core/util.c core/device.c core/ctx.c core/host_api.c core/loader.c core/options.c core/format.c \
	core/role.c core/recipe.c core/quantizer.c core/fsdp.c core/forms.c core/gemm.c \
	core/gemm_host.c core/provider.c core/state.c
core_libhqcore_la_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_builddir)/core $(INIH_CFLAGS) $(OPENBLAS_CFLAGS) \
	$(CUDA_CPPFLAGS)
# the built-in identity format (plugins/identity/local.mk) and GEMM providers (gemm/local.mk)
core_libhqcore_la_LIBADD = plugins/identity/libidentity_builtin.la gemm/libhqgemm.la \
	$(INIH_LIBS) $(OPENBLAS_LIBS)
core_libhqcore_la_LDFLAGS = -version-info $(HQCORE_LT_VERSION) -no-undefined \
	-export-symbols-regex '^hq_' $(HQ_SAN_LDFLAGS)
EXTRA_DIST += core/cuda/kernels.cu
if HAVE_CUDA
core_libhqcore_la_LIBADD += core/cuda/kernels.lo -lcudart -lstdc++
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
