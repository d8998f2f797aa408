/* ckpt_desc.h -- the commands' view of a safetensors file (tools/ckpt_desc.c). */
#ifndef HQ_TOOLS_CKPT_DESC_H
#define HQ_TOOLS_CKPT_DESC_H
#include <stddef.h>

#include "hq/train.h"

/* Open FILE, verified where it has hq's checksums (an hq checkpoint) and not otherwise (another
   tool's file, which has none); *summed says which. An hq status, hq_last_error() saying why. */
int ckpt_open_any(const char *path, hq_ckpt **out, int *summed);
/* An entry's shape as "[a, b, ...]" ("[]" for a scalar) into buf. */
void ckpt_shape_text(const hq_ckpt_entry_info *e, char *buf, size_t len);

/* "[rows, cols] nominal; rowwise FORMAT (PLUGIN: options); columnwise ..." into buf from the
   "<name>/hq" JSON text meta: 0, or -1 when it does not parse (or hq has no JSON parser). */
int ckpt_describe(const char *meta, char *buf, size_t len);

#endif
