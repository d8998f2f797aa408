# plugins/mxfp8/local.mk -- MXFP8 (CPU reference + CUDA kernels)
hqplugin_LTLIBRARIES += plugins/mxfp8/mxfp8.la
plugins_mxfp8_mxfp8_la_SOURCES = plugins/mxfp8/mxfp8_rules.h plugins/mxfp8/mxfp8.c plugins/mxfp8/mxfp8.h
plugins_mxfp8_mxfp8_la_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS)
plugins_mxfp8_mxfp8_la_LDFLAGS = $(HQ_PLUGIN_LDFLAGS)
EXTRA_DIST += plugins/mxfp8/mxfp8.cu
if HAVE_CUDA
plugins_mxfp8_mxfp8_la_LIBADD = plugins/mxfp8/mxfp8.lo $(CUDA_LIBS)
plugins_mxfp8_mxfp8_la_LDFLAGS += $(CUDA_LDFLAGS)
endif
HQ_TEST_PLUGIN_DIRS += $(abs_top_builddir)/plugins/mxfp8/.libs

if HQ_TESTS
check_PROGRAMS += tests/test_mxfp8_numerics
tests_test_mxfp8_numerics_SOURCES = tests/test_mxfp8_numerics.c tests/mxfp8_ref.h tests/hq_test.h
tests_test_mxfp8_numerics_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_mxfp8_numerics_LDADD = $(HQ_TEST_LDADD)

check_PROGRAMS += tests/test_mxfp8
tests_test_mxfp8_SOURCES = tests/test_mxfp8.c tests/mxfp8_ref.h tests/hq_test.h
tests_test_mxfp8_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_mxfp8_LDADD = $(HQ_TEST_LDADD)

# the CUDA path against the CPU reference, bit for bit (exits 77 without a device)
check_PROGRAMS += tests/test_gpu_mxfp8
tests_test_gpu_mxfp8_SOURCES = tests/test_gpu_mxfp8.c tests/hq_test.h
tests_test_gpu_mxfp8_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_gpu_mxfp8_LDADD = $(HQ_TEST_LDADD)
endif
