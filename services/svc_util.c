/*
** svc_util.c -- the small helpers the files of libhqtrain share: error prefixes, joined names.
*/
#include "config.h"
#include "svc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int hqt_error_prefix(int code, const char *fmt, ...) {
  char prefix[512], cause[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  snprintf(cause, sizeof cause, "%s", hq_last_error()[0] ? hq_last_error() : hq_strerror(code));
  return hq_set_error(code, "%s: %s", prefix, cause);
}

char *hqt_join(const char *a, const char *sep, const char *b) {
  const size_t na = strlen(a), ns = strlen(sep), nb = strlen(b);
  char *p = malloc(na + ns + nb + 1);
  if (!p) return NULL;
  memcpy(p, a, na);
  memcpy(p + na, sep, ns);
  memcpy(p + na + ns, b, nb + 1);
  return p;
}
