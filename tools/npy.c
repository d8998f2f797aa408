/*
** npy.c -- the .npy header reader of `hq quantize --input` (tools/npy.h), in a file of its own so
** that its fuzz target (tests/fuzz/fuzz_npy.c) links it alone.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

int cli_npy_parse(const char *path, unsigned char *buf, size_t n, hq_tensor *t, size_t *offset,
                    char *err, size_t err_len) {
  if (n < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) return 0; /* not .npy */
  size_t hlen, hstart;
  if (buf[6] == 1) {
    hlen = buf[8] | (size_t)buf[9] << 8;
    hstart = 10;
  } else if (buf[6] == 2 || buf[6] == 3) {
    if (n < 12) goto corrupt;
    hlen = buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    hstart = 12;
  } else {
    snprintf(err, err_len, "%s: unsupported .npy version %u", path, buf[6]);
    return -1;
  }
  if (hstart + hlen > n || hlen > 65536) goto corrupt;
  char *h = malloc(hlen + 1);
  if (!h) goto corrupt;
  memcpy(h, buf + hstart, hlen);
  h[hlen] = '\0';
  char *d = strstr(h, "'descr'"), *fo = strstr(h, "'fortran_order'"), *sh = strstr(h, "'shape'");
  int rc = -1;
  if (!d || !fo || !sh) {
    snprintf(err, err_len, "%s: .npy header lacks descr/fortran_order/shape", path);
  } else if (strstr(fo, "True") && strstr(fo, "True") < strchr(fo, ',')) {
    snprintf(err, err_len, "%s: Fortran-ordered .npy arrays are not supported", path);
  } else {
    char *q = strchr(d + 7, '\'');
    if (q && !strncmp(q, "'<f4'", 5)) t->dtype = HQ_F32;
    else if (q && !strncmp(q, "'<f2'", 5)) t->dtype = HQ_F16;
    else {
      snprintf(err, err_len, "%s: .npy dtype must be '<f4' or '<f2'", path);
      free(h);
      return -1;
    }
    char *p = strchr(sh, '(');
    int64_t dims[16];
    int nd = 0;
    while (p && *++p && *p != ')') {
      char *end;
      errno = 0;
      long long v = strtoll(p, &end, 10);
      if (end == p) break;
      if (nd == 16 || v <= 0 || errno == ERANGE) nd = -1;
      if (nd < 0) break;
      dims[nd++] = v;
      p = strchr(end, ',');
      if (!p) break;
    }
    if (nd <= 0) {
      snprintf(err, err_len, "%s: .npy shape is empty, zero-sized or unreadable", path);
    } else {
      /* the element count, overflow-checked: at most 2^40 (as --shape), so that no size below
         can wrap (a wrapped product would quantize another shape) */
      const int64_t cap = (int64_t)1 << 40;
      int64_t count = 1;
      for (int i = 0; i < nd && count > 0; i++) count = dims[i] > cap / count ? -1 : count * dims[i];
      if (count < 0) {
        char dimtxt[160] = "";
        size_t used = 0;
        for (int i = 0; i < nd && used < sizeof dimtxt - 24; i++)
          used += (size_t)snprintf(dimtxt + used, sizeof dimtxt - used, "%s%lld", i ? ", " : "",
                                   (long long)dims[i]);
        snprintf(err, err_len, "%s: .npy shape (%s) has more than 2^40 elements", path, dimtxt);
      } else {
        t->cols = dims[nd - 1];
        t->rows = count / t->cols;
        *offset = hstart + hlen;
        rc = 1;
      }
    }
  }
  free(h);
  return rc;
corrupt:
  snprintf(err, err_len, "%s: truncated or corrupt .npy header", path);
  return -1;
}
