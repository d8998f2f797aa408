/*
** host_api.c -- the host table every format module (and, through hq_gemm_host.api, every GEMM
** provider) receives: error messages, logging through the call's context, stream-ordered scratch
** from the context's allocator, the device's architecture, the cuBLASLt runner and the element
** conversions.
*/
#include "config.h"
#include "hq_internal.h"

#include <stdio.h>

/* A plugin's message goes to the logger of the context its call runs on. */
static void host_log(const hq_call *call, int level, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  hqi_log(call ? (const hq_ctx *)call->core_private : NULL, level, "%s", msg);
}

static void *host_alloc(const hq_call *call, size_t bytes) {
  hq_ctx *ctx = call ? (hq_ctx *)call->core_private : NULL;
  if (!ctx) {
    hqi_error(HQ_EINVAL, "host->alloc: the call has no context");
    return NULL;
  }
  if (call->flags & HQ_CALL_UPDATE) {
    hqi_error(HQ_EABI, "host->alloc(%zu bytes) during an update: an update must not allocate "
              "(declare scratch_size and use call->scratch)", bytes);
    return NULL;
  }
  /* on the call's stream: a call may run on the context's side stream (a GEMM's operand pair);
     on the context's own, from the scratch it keeps between calls */
  void *p = hqi_ctx_scratch_alloc(ctx, bytes ? bytes : 1, call->stream);
  if (!p) hqi_error(HQ_ENOMEM, "host->alloc: %zu bytes on device %d failed", bytes, ctx->device);
  return p;
}

static void host_free(const hq_call *call, void *ptr) {
  hq_ctx *ctx = call ? (hq_ctx *)call->core_private : NULL;
  if (ctx && ptr) hqi_ctx_scratch_free(ctx, ptr, call->stream);
}

static int host_device_arch(int device) { return device < 0 ? 0 : hqi_cuda_arch(device); }

static int is_hp(hq_dtype t) { return t == HQ_F32 || t == HQ_F16 || t == HQ_BF16; }

/* host->convert (2.4): the identity format's conversions, through the same code as the core's */
static int host_convert(const hq_call *call, void *dst, hq_dtype dt, const void *src, hq_dtype st,
                        int64_t n) {
  if (!call) return hqi_error(HQ_EINVAL, "host->convert: the call is NULL");
  if (!is_hp(dt) || !is_hp(st))
    return hqi_error(HQ_EINVAL, "host->convert: %s -> %s: both dtypes must be f32, f16 or bf16",
                     hq_dtype_name(st), hq_dtype_name(dt));
  if (n < 0) return hqi_error(HQ_EINVAL, "host->convert: n = %lld is negative", (long long)n);
  if (n > 0 && (!dst || !src)) return hqi_error(HQ_EINVAL, "host->convert: a NULL pointer");
  return hqi_convert(call->device, call->stream, dst, dt, src, st, n);
}

const hq_host_api hqi_host_api = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = HQ_ABI_MINOR,
    .struct_size = sizeof(hq_host_api),
    .core_version = PACKAGE_VERSION,
    .error = hq_set_error, /* a module's message, as the embedder's own */
    .log = host_log,
    .alloc = host_alloc,
    .free = host_free,
    .device_arch = host_device_arch,
    .lt_matmul = hqi_lt_matmul,
    .convert = host_convert,
};
