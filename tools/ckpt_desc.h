/* ckpt_desc.h -- a quantized tensor's checkpoint metadata as one line (tools/ckpt_desc.c). */
#ifndef HQ_TOOLS_CKPT_DESC_H
#define HQ_TOOLS_CKPT_DESC_H
#include <stddef.h>

/* "[rows, cols] nominal; rowwise FORMAT (PLUGIN: options); columnwise ..." into buf from the
   "<name>/hq" JSON text meta: 0, or -1 when it does not parse (or hq has no JSON parser). */
int ckpt_describe(const char *meta, char *buf, size_t len);

#endif
