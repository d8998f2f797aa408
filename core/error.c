/*
** error.c -- per-thread error messages, status strings, logging, and the host table given to
** every format module.
*/
#include "config.h"
#include "hq_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HQ_ERRBUF 1024

static _Thread_local char errbuf[HQ_ERRBUF];

const char *hq_last_error(void) { return errbuf; }
void hq_clear_error(void) { errbuf[0] = '\0'; }

int hqi_verror(int code, const char *fmt, va_list ap) {
  vsnprintf(errbuf, sizeof errbuf, fmt, ap);
  if (code == HQ_ENOMEM && !strstr(errbuf, "memory")) {
    /* every allocation failure says so, whatever its message names */
    char what[HQ_ERRBUF];
    memcpy(what, errbuf, sizeof what);
    snprintf(errbuf, sizeof errbuf, "out of memory: %.*s", (int)sizeof what - 16, what);
  }
  return code;
}

int hqi_error(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  hqi_verror(code, fmt, ap);
  va_end(ap);
  return code;
}

int hq_set_error(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  hqi_verror(code, fmt, ap);
  va_end(ap);
  return code;
}

int hqi_error_prefix(int code, const char *fmt, ...) {
  char prefix[512], old[HQ_ERRBUF];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, errbuf, sizeof old);
  const char *cause = old[0] ? old : hq_strerror(code);
  size_t n = strlen(prefix);
  if (n > sizeof errbuf - 3) n = sizeof errbuf - 3;
  memcpy(errbuf, prefix, n);
  memcpy(errbuf + n, ": ", 2);
  size_t m = strlen(cause);
  if (m > sizeof errbuf - n - 3) m = sizeof errbuf - n - 3;
  memcpy(errbuf + n + 2, cause, m);
  errbuf[n + 2 + m] = '\0';
  return code;
}

const char *hq_strerror(int status) {
  switch (status) {
  case HQ_OK: return "success";
  case HQ_EINVAL: return "invalid argument";
  case HQ_ENOMEM: return "out of memory";
  case HQ_ENOTSUP: return "not supported";
  case HQ_ESHAPE: return "shape not supported by the format";
  case HQ_EPARSE: return "malformed recipe";
  case HQ_ENOENT: return "not found";
  case HQ_EABI: return "incompatible or broken plugin";
  case HQ_EDEVICE: return "CUDA error";
  case HQ_EIO: return "I/O error";
  case HQ_ESTATE: return "object in the wrong state";
  case HQ_EINTERNAL: return "internal error";
  default: return "unknown status";
  }
}

void hqi_log(const hq_ctx *ctx, int level, const char *fmt, ...) {
  /* nothing to format for: no callback and a level stderr does not show (a per-call message,
     e.g. hq_gemm's path, would otherwise cost its formatting on every call) */
  if (!(ctx && ctx->log) && level > 1) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ctx && ctx->log) ctx->log(ctx->log_user, level, msg);
  else if (level <= 1) fprintf(stderr, "hq: %s: %s\n", level == 0 ? "error" : "warning", msg);
}

// --- the host table handed to format modules ------------------------------------------------

static int host_error(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  hqi_verror(code, fmt, ap);
  va_end(ap);
  return code;
}

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
  void *p = hqi_ctx_alloc_raw(ctx, bytes ? bytes : 1);
  if (!p) hqi_error(HQ_ENOMEM, "host->alloc: %zu bytes on device %d failed", bytes, ctx->device);
  return p;
}

static void host_free(const hq_call *call, void *ptr) {
  hq_ctx *ctx = call ? (hq_ctx *)call->core_private : NULL;
  if (ctx && ptr) hqi_ctx_free_raw(ctx, ptr);
}

static int host_device_arch(int device) { return device < 0 ? 0 : hqi_cuda_arch(device); }

const hq_host_api hqi_host_api = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = HQ_ABI_MINOR,
    .struct_size = sizeof(hq_host_api),
    .core_version = PACKAGE_VERSION,
    .error = host_error,
    .log = host_log,
    .alloc = host_alloc,
    .free = host_free,
    .device_arch = host_device_arch,
    .lt_matmul = hqi_lt_matmul,
};
