# tests/local.mk -- CMocka tests (make check). GPU tests exit 77 (skip) without a device.
if HQ_TESTS
HQ_TEST_CPPFLAGS = $(AM_CPPFLAGS) $(CMOCKA_CFLAGS)
HQ_TEST_LDADD = core/libhqcore.la $(CMOCKA_LIBS) -lm

check_PROGRAMS += tests/test_numerics_fp8
tests_test_numerics_fp8_SOURCES = tests/test_numerics_fp8.c tests/hq_test.h
tests_test_numerics_fp8_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_numerics_fp8_LDADD = $(HQ_TEST_LDADD)

TESTS += $(check_PROGRAMS)
endif

AM_TESTS_ENVIRONMENT = \
	HQ_PLUGIN_PATH=`echo $(HQ_TEST_PLUGIN_DIRS) | tr ' ' ':'`; export HQ_PLUGIN_PATH; \
	HQ_TEST_SRCDIR='$(abs_top_srcdir)/tests'; export HQ_TEST_SRCDIR; \
	HQ_TEST_FIXTURES='$(abs_top_builddir)/tests/plugins/.libs'; export HQ_TEST_FIXTURES; \
	HQ_BIN='$(abs_top_builddir)/tools/hq'; export HQ_BIN;
