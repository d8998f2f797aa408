# plugins/identity/local.mk -- the identity format (high-precision passthrough): one source,
# identity.c (with its kernel identity.cu), built two ways as SQLite builds an extension with and
# without SQLITE_CORE.
#
# Into libhqcore, as the built-in format every plugin set holds: a convenience library compiled
# with HQ_FORMAT_BUILTIN naming the internal entry function the loader registers.
noinst_LTLIBRARIES += plugins/identity/libidentity_builtin.la
plugins_identity_libidentity_builtin_la_SOURCES = plugins/identity/identity.c \
	plugins/identity/identity.h
plugins_identity_libidentity_builtin_la_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS) \
	-DHQ_FORMAT_BUILTIN=hqi_identity_module
# As a module (exporting hq_format_module_v2 only, linking no libhqcore): built for make check,
# where test_identity loads it and compares it with the built-in; never installed, since the
# loader rejects a module named identity beside the built-in one.
check_LTLIBRARIES += plugins/identity/identity.la
plugins_identity_identity_la_SOURCES = plugins/identity/identity.c plugins/identity/identity.h
plugins_identity_identity_la_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS)
plugins_identity_identity_la_LDFLAGS = $(HQ_PLUGIN_LDFLAGS) -rpath /nowhere
EXTRA_DIST += plugins/identity/identity.cu
if HAVE_CUDA
plugins_identity_libidentity_builtin_la_LIBADD = plugins/identity/identity.lo
plugins_identity_identity_la_LIBADD = plugins/identity/identity.lo $(CUDA_LIBS)
plugins_identity_identity_la_LDFLAGS += $(CUDA_LDFLAGS)
endif
