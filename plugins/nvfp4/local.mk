# plugins/nvfp4/local.mk -- NVFP4 (CPU reference; CUDA kernels are a later issue)

if HQ_TESTS
# the NVFP4 rules of hq/numerics.h, against independent references
check_PROGRAMS += tests/test_nvfp4_numerics
tests_test_nvfp4_numerics_SOURCES = tests/test_nvfp4_numerics.c tests/hq_test.h
tests_test_nvfp4_numerics_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_nvfp4_numerics_LDADD = $(HQ_TEST_LDADD)
endif
