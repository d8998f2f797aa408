# tools/local.mk -- the hq command
bin_PROGRAMS += tools/hq
# hq.c only dispatches to the commands (commands.h); the commands use cli.c (options, values,
# errors), json.c, buffers.c, bench_timer.c and bench_spec.c, none of which calls back into a
# command
tools_hq_SOURCES = tools/hq.c tools/commands.h tools/cli.c tools/cli.h tools/json.c tools/json.h \
	tools/buffers.c tools/buffers.h tools/npy.c tools/npy.h tools/cmd_info.c tools/cmd_recipe.c tools/cmd_quantize.c \
	tools/cmd_bench.c tools/bench_gemm.c tools/bench_dist.c tools/bench_timer.c tools/bench_timer.h \
	tools/bench_spec.c tools/bench_spec.h \
	tools/cmd_train.c train/train.h train/device.h train/data.c train/model.c train/loop.c \
	train/checkpoint.c train/ops_cpu.c train/profile.h train/profile.c tools/train_report.c \
	tools/train_report.h train/dist.h train/dist.c train/cast_cuda.h
tools_hq_SOURCES += train/memory.c train/direct.h tools/ckpt_desc.c tools/ckpt_desc.h
tools_hq_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) -DHQ_RECIPEDIR='"$(hqrecipedir)"'
tools_hq_LDADD = services/libhqtrain.la core/libhqcore.la -lm
# hq info --checkpoint reads a quantized tensor's metadata (tools/ckpt_desc.c)
if HAVE_JANSSON
tools_hq_CPPFLAGS += $(JANSSON_CFLAGS)
tools_hq_LDADD += $(JANSSON_LIBS)
endif
# an installed hq finds libhqcore and libhqtrain in any --prefix without ldconfig or LD_LIBRARY_PATH
tools_hq_LDFLAGS = -Wl,-rpath,$(libdir)
# `mpirun -np N hq train` (train/dist.c) when configure found Open MPI
if HAVE_MPI
tools_hq_CPPFLAGS += $(MPI_CFLAGS)
tools_hq_LDADD += $(MPI_LIBS)
endif
EXTRA_DIST += train/ops_cuda.cu train/direct_cuda.cu train/cast_cuda.cu
if HAVE_CUDA
# the trainer's device table for CUDA (train/device.h), compiled by nvcc like the core's kernels;
# the bf16-direct run's GEMMs (train/direct.h) on the cuBLASLt configure found for libhqcore;
# the FP32 <-> BF16 conversions of that run and of the ranks' BF16 reduce-scatter (train/cast_cuda.h)
tools_hq_LDADD += train/ops_cuda.lo train/direct_cuda.lo train/cast_cuda.lo -lcublasLt -lcudart \
	-lstdc++
tools_hq_LDFLAGS += $(CUDA_LDFLAGS)
else
tools_hq_SOURCES += train/direct_none.c
endif
