# plugins/nvfp4/local.mk -- NVFP4 (CPU reference + CUDA kernels)
hqplugin_LTLIBRARIES += plugins/nvfp4/nvfp4.la
plugins_nvfp4_nvfp4_la_SOURCES = plugins/nvfp4/nvfp4_rules.h plugins/nvfp4/nvfp4.c plugins/nvfp4/nvfp4.h
plugins_nvfp4_nvfp4_la_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS)
plugins_nvfp4_nvfp4_la_LDFLAGS = $(HQ_PLUGIN_LDFLAGS)
EXTRA_DIST += plugins/nvfp4/nvfp4.cu plugins/nvfp4/nvfp4_f16.cu plugins/nvfp4/nvfp4_bf16.cu \
	plugins/nvfp4/nvfp4_gemm.cu
if HAVE_CUDA
plugins_nvfp4_nvfp4_la_LIBADD = plugins/nvfp4/nvfp4.lo plugins/nvfp4/nvfp4_f16.lo \
	plugins/nvfp4/nvfp4_bf16.lo plugins/nvfp4/nvfp4_gemm.lo $(CUDA_LIBS)
plugins_nvfp4_nvfp4_la_LDFLAGS += $(CUDA_LDFLAGS)
endif
HQ_TEST_PLUGIN_DIRS += $(abs_top_builddir)/plugins/nvfp4/.libs

if HQ_TESTS
# the NVFP4 rules (plugins/nvfp4/nvfp4_rules.h), against independent references
check_PROGRAMS += tests/test_nvfp4_numerics
tests_test_nvfp4_numerics_SOURCES = tests/test_nvfp4_numerics.c tests/hq_test.h
tests_test_nvfp4_numerics_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_nvfp4_numerics_LDADD = $(HQ_TEST_LDADD)

# the plugin through the public API (recipes, quantizers, storages)
check_PROGRAMS += tests/test_nvfp4
tests_test_nvfp4_SOURCES = tests/test_nvfp4.c tests/hq_test.h
tests_test_nvfp4_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_nvfp4_LDADD = $(HQ_TEST_LDADD)

# the CUDA path against the CPU reference, bit for bit (exits 77 without a device)
check_PROGRAMS += tests/test_gpu_nvfp4
tests_test_gpu_nvfp4_SOURCES = tests/test_gpu_nvfp4.c tests/hq_test.h
tests_test_gpu_nvfp4_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_gpu_nvfp4_LDADD = $(HQ_TEST_LDADD)
endif
