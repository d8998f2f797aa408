# plugins/identity/local.mk -- the high-precision passthrough format
hqplugin_LTLIBRARIES += plugins/identity/identity.la
plugins_identity_identity_la_SOURCES = plugins/identity/identity.c
plugins_identity_identity_la_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS)
plugins_identity_identity_la_LDFLAGS = $(HQ_PLUGIN_LDFLAGS)
HQ_TEST_PLUGIN_DIRS += $(abs_top_builddir)/plugins/identity/.libs
EXTRA_DIST += plugins/identity/identity.cu
if HAVE_CUDA
plugins_identity_identity_la_LIBADD = plugins/identity/identity.lo $(CUDA_LIBS)
plugins_identity_identity_la_LDFLAGS += $(CUDA_LDFLAGS)
endif
