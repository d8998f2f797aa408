/*
** npy.h -- the .npy header reader of `hq quantize --input` (tools/npy.c).
*/
#ifndef HQ_NPY_H
#define HQ_NPY_H

#include <stddef.h>

#include "hq/hq.h"

/* Parse the .npy header at the start of buf (n bytes, the whole file; `path` names it in
   messages): 0 when buf is not a .npy file; 1 with t's dtype (f32 or f16), rows (the leading
   dimensions flattened, at most 2^40 elements) and cols set and the data's start in *offset;
   -1 with a message in err when it is a .npy file hq cannot read. Never reads outside buf. */
int cli_npy_parse(const char *path, unsigned char *buf, size_t n, hq_tensor *t, size_t *offset,
                  char *err, size_t err_len);

#endif
