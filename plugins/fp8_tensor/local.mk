# plugins/fp8_tensor/local.mk -- per-tensor FP8 (CPU reference + CUDA kernels)
hqplugin_LTLIBRARIES += plugins/fp8_tensor/fp8_tensor.la
plugins_fp8_tensor_fp8_tensor_la_SOURCES = plugins/common/fp8_scale.h plugins/fp8_tensor/fp8_tensor.c \
	plugins/fp8_tensor/fp8_tensor.h plugins/fp8_tensor/fp8_tensor_rules.h
plugins_fp8_tensor_fp8_tensor_la_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS)
plugins_fp8_tensor_fp8_tensor_la_LDFLAGS = $(HQ_PLUGIN_LDFLAGS)
EXTRA_DIST += plugins/fp8_tensor/fp8_tensor.cu
if HAVE_CUDA
plugins_fp8_tensor_fp8_tensor_la_LIBADD = plugins/fp8_tensor/fp8_tensor.lo $(CUDA_LIBS)
plugins_fp8_tensor_fp8_tensor_la_LDFLAGS += $(CUDA_LDFLAGS)
endif
HQ_TEST_PLUGIN_DIRS += $(abs_top_builddir)/plugins/fp8_tensor/.libs
