/*
** error.c -- per-thread error messages, status strings and logging.
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

int hqi_plugin_rc(int rc, const char *module, const char *op) {
  if (rc >= HQ_OK && rc <= HQ_EINTERNAL) return rc;
  char copy[HQ_ERRBUF]; /* the whole message: hqi_error's own buffer cuts what does not fit */
  snprintf(copy, sizeof copy, "%s", hq_last_error());
  return hqi_error(HQ_EINTERNAL, "plugin %s: %s() returned %d, which is not an hq_status%s%s",
                   module, op, rc, copy[0] ? ": " : "", copy);
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
