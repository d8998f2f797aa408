# plugins/fp8_block/local.mk -- FP8 block scaling, DeepSeek-V3 style (CPU reference; CUDA later)
hqplugin_LTLIBRARIES += plugins/fp8_block/fp8_block.la
plugins_fp8_block_fp8_block_la_SOURCES = plugins/fp8_block/fp8_block_rules.h plugins/fp8_block/fp8_block.c
plugins_fp8_block_fp8_block_la_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS)
plugins_fp8_block_fp8_block_la_LDFLAGS = $(HQ_PLUGIN_LDFLAGS)
HQ_TEST_PLUGIN_DIRS += $(abs_top_builddir)/plugins/fp8_block/.libs

if HQ_TESTS
check_PROGRAMS += tests/test_fp8_block
tests_test_fp8_block_SOURCES = tests/test_fp8_block.c tests/hq_test.h
tests_test_fp8_block_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_fp8_block_LDADD = $(HQ_TEST_LDADD)
endif
