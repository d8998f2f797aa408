/*
** npy.c -- the .npy header reader of `hq quantize --input` (tools/npy.h), in a file of its own so
** that its fuzz target (tests/fuzz/fuzz_npy.c) links it alone.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

/* The dims of the header's "'shape': (d0, d1, ...)" tuple, text starting after 'shape': their
   count (0 for "()"), -1 when it is not a tuple of decimal integers (a dim left unread must never
   pass for a smaller shape), -2 when a dim is 0 or beyond 64 bits, or there are over 16. */
static int parse_shape(const char *s, int64_t dims[16]) {
  s += strspn(s, " ");
  if (*s++ != ':') return -1;
  s += strspn(s, " ");
  if (*s++ != '(') return -1;
  int nd = 0, bad = 0;
  for (;;) {
    s += strspn(s, " ");
    if (*s == ')') break; /* "()", or after a trailing comma: "(64,)" */
    if (*s < '0' || *s > '9') return -1;
    char *end;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (v <= 0 || errno == ERANGE || nd == 16) bad = 1;
    else dims[nd++] = v;
    if (*end == 'L') end++; /* numpy under Python 2 wrote longs as 64L */
    s = end + strspn(end, " ");
    if (*s == ',') s++;
    else if (*s != ')') return -1;
  }
  return bad ? -2 : nd;
}

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
    int64_t dims[16];
    const int nd = parse_shape(sh + 7, dims);
    const char *v = sh + 7 + strspn(sh + 7, " :"); /* the shape's text, up to its ')' */
    size_t vlen = strcspn(v, ")]}");
    vlen = vlen > 60 ? 60 : vlen + (v[vlen] == ')' || v[vlen] == ']');
    if (nd == -1) {
      snprintf(err, err_len, "%s: .npy header's shape %.*s is malformed (a tuple of decimal "
               "integers expected)", path, (int)vlen, v);
    } else if (nd <= 0) {
      snprintf(err, err_len, "%s: .npy shape %.*s is not 1 to 16 positive dimensions", path,
               (int)vlen, v);
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
