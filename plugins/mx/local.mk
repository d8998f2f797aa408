# plugins/mx/local.mk -- MXFP4 and MXFP6 (CPU reference + CUDA kernels): two modules built from
# one source (mx.c with -DHQ_MX_FP=4 / 6), which differ only in the element type and its packing
hqplugin_LTLIBRARIES += plugins/mx/mxfp4.la plugins/mx/mxfp6.la
plugins_mx_mxfp4_la_SOURCES = plugins/mx/mx_rules.h plugins/mx/mx.c plugins/mx/mx.h
plugins_mx_mxfp4_la_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS) -DHQ_MX_FP=4
plugins_mx_mxfp4_la_LDFLAGS = $(HQ_PLUGIN_LDFLAGS)
plugins_mx_mxfp6_la_SOURCES = plugins/mx/mx_rules.h plugins/mx/mx.c plugins/mx/mx.h
plugins_mx_mxfp6_la_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS) -DHQ_MX_FP=6
plugins_mx_mxfp6_la_LDFLAGS = $(HQ_PLUGIN_LDFLAGS)
EXTRA_DIST += plugins/mx/mx.cu
# the generators of tests/mx_tables.h (ml_dtypes) and tests/mx_vectors.h (torchao); not run by make
EXTRA_DIST += tests/gen_mx_tables.py tests/gen_mx_vectors.py
if HAVE_CUDA
plugins_mx_mxfp4_la_LIBADD = plugins/mx/mx.lo $(CUDA_LIBS)
plugins_mx_mxfp4_la_LDFLAGS += $(CUDA_LDFLAGS)
plugins_mx_mxfp6_la_LIBADD = plugins/mx/mx.lo $(CUDA_LIBS)
plugins_mx_mxfp6_la_LDFLAGS += $(CUDA_LDFLAGS)
endif
HQ_TEST_PLUGIN_DIRS += $(abs_top_builddir)/plugins/mx/.libs

if HQ_TESTS
# the element and scale codecs and the MX rules against ml_dtypes / torchao tables
check_PROGRAMS += tests/test_mx_numerics
tests_test_mx_numerics_SOURCES = tests/test_mx_numerics.c tests/mx_tables.h tests/hq_test.h
tests_test_mx_numerics_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_mx_numerics_LDADD = $(HQ_TEST_LDADD)

# both plugins through the public API, against torchao's to_mx vectors
check_PROGRAMS += tests/test_mx
tests_test_mx_SOURCES = tests/test_mx.c tests/mx_vectors.h tests/hq_test.h
tests_test_mx_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_mx_LDADD = $(HQ_TEST_LDADD)

# the CUDA path against the CPU reference, bit for bit (exits 77 without a device)
check_PROGRAMS += tests/test_gpu_mx
tests_test_gpu_mx_SOURCES = tests/test_gpu_mx.c tests/hq_test.h
tests_test_gpu_mx_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_gpu_mx_LDADD = $(HQ_TEST_LDADD)
endif
