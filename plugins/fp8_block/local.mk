# plugins/fp8_block/local.mk -- FP8 block scaling (CPU reference + CUDA kernels)
hqplugin_LTLIBRARIES += plugins/fp8_block/fp8_block.la
plugins_fp8_block_fp8_block_la_SOURCES = plugins/fp8_block/fp8_block_rules.h \
	plugins/fp8_block/fp8_block.c plugins/fp8_block/fp8_block_gemm.h
plugins_fp8_block_fp8_block_la_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS)
plugins_fp8_block_fp8_block_la_LDFLAGS = $(HQ_PLUGIN_LDFLAGS)
EXTRA_DIST += plugins/fp8_block/fp8_block.cu plugins/fp8_block/fp8_block_gemm.cu
if HAVE_CUDA
plugins_fp8_block_fp8_block_la_LIBADD = plugins/fp8_block/fp8_block.lo \
	plugins/fp8_block/fp8_block_gemm.lo $(CUDA_LIBS)
plugins_fp8_block_fp8_block_la_LDFLAGS += $(CUDA_LDFLAGS)
endif
HQ_TEST_PLUGIN_DIRS += $(abs_top_builddir)/plugins/fp8_block/.libs

if HQ_TESTS
check_PROGRAMS += tests/test_fp8_block
tests_test_fp8_block_SOURCES = tests/test_fp8_block.c tests/hq_test.h
tests_test_fp8_block_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_fp8_block_LDADD = $(HQ_TEST_LDADD)

# the CUDA path against the CPU reference, bit for bit (exits 77 without a device)
check_PROGRAMS += tests/test_gpu_fp8_block
tests_test_gpu_fp8_block_SOURCES = tests/test_gpu_fp8_block.c tests/hq_test.h
tests_test_gpu_fp8_block_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_gpu_fp8_block_LDADD = $(HQ_TEST_LDADD)
endif
