# services/local.mk -- libhqtrain, the trainer services: AdamW with the quantized write-back and
# safetensors checkpoints, built on libhqcore's public API alone (hq/train.h declares them; the
# headers are installed with libhqcore's in core/local.mk).
lib_LTLIBRARIES += services/libhqtrain.la
services_libhqtrain_la_SOURCES = services/svc.h services/svc_util.c services/adamw.c \
	services/adamw_cuda.h services/dist_impl.h services/dist.c
services_libhqtrain_la_CPPFLAGS = $(AM_CPPFLAGS)
services_libhqtrain_la_LIBADD = core/libhqcore.la -lm
services_libhqtrain_la_LDFLAGS = -version-info $(HQTRAIN_LT_VERSION) -no-undefined \
	-export-symbols-regex '^hq_' $(HQ_SAN_LDFLAGS)
# checkpoints need jansson (the JSON header); without it every hq_ckpt_* call is HQ_ENOTSUP
if HAVE_JANSSON
services_libhqtrain_la_SOURCES += services/ckpt.h services/ckpt_file.c services/ckpt_meta.c \
	services/ckpt_write.c services/ckpt_load.c
services_libhqtrain_la_CPPFLAGS += $(JANSSON_CFLAGS) $(XXHASH_CFLAGS)
services_libhqtrain_la_LIBADD += $(JANSSON_LIBS) $(XXHASH_LIBS)
else
services_libhqtrain_la_SOURCES += services/ckpt_none.c
endif
EXTRA_DIST += services/adamw_cuda.cu
if HAVE_CUDA
services_libhqtrain_la_CPPFLAGS += $(CUDA_CPPFLAGS)
services_libhqtrain_la_LIBADD += services/adamw_cuda.lo -lcudart -lstdc++
services_libhqtrain_la_LDFLAGS += $(CUDA_LDFLAGS)
endif
# the FSDP gather's backends (hq/dist.h), each compiled when configure finds its library
if HAVE_MPI
services_libhqtrain_la_SOURCES += services/dist_mpi.c
services_libhqtrain_la_CPPFLAGS += $(MPI_CFLAGS)
services_libhqtrain_la_LIBADD += $(MPI_LIBS)
endif
if HAVE_NCCL
# NCCL itself is loaded at run time (dist_nccl.c says why): only its header is needed here
services_libhqtrain_la_SOURCES += services/dist_nccl.c
endif
