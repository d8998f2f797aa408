/*
** fuzz_npy.c -- libFuzzer target: the .npy header reader of `hq quantize --input`
** (tools/npy.c) on arbitrary bytes; every input is a clean 0, 1 or -1 with a message, and a
** result of 1 describes a shape whose data fits the 2^40-element cap (scripts/fuzz.sh).
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  unsigned char *buf = malloc(size + 1); /* an exact-size copy: ASan sees any read past it */
  if (!buf) return 0;
  if (size) memcpy(buf, data, size);
  hq_tensor t = hq_tensor_2d(NULL, HQ_DTYPE_INVALID, HQ_DEVICE_HOST, 0, 0);
  size_t off = 0;
  char err[512] = "";
  int rc = cli_npy_parse("fuzz.npy", buf, size, &t, &off, err, sizeof err);
  if (rc < 0 && !err[0]) abort();                  /* a refusal always says why */
  if (rc == 1 && (off > size || t.rows < 1 || t.cols < 1 || t.rows > ((int64_t)1 << 40) / t.cols))
    abort();                                       /* a shape the caller could not trust */
  free(buf);
  return 0;
}
