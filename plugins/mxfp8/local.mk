# plugins/mxfp8/local.mk -- MXFP8 (CPU reference; CUDA kernels are a later issue)
hqplugin_LTLIBRARIES += plugins/mxfp8/mxfp8.la
plugins_mxfp8_mxfp8_la_SOURCES = plugins/mxfp8/mxfp8.c plugins/mxfp8/mxfp8.h
plugins_mxfp8_mxfp8_la_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS)
plugins_mxfp8_mxfp8_la_LDFLAGS = $(HQ_PLUGIN_LDFLAGS)
HQ_TEST_PLUGIN_DIRS += $(abs_top_builddir)/plugins/mxfp8/.libs
