/*
** buffers.c -- a quantized tensor's buffers as `hq quantize` and `hq info` list them: name,
** dtype, shape, bytes, and whether a columnwise buffer is the rowwise storage's own (shared).
** The names are hq/plugin.h's convention, the ones checkpoints use.
*/
#include <string.h>

#include "buffers.h"

/* Whether buffer b of direction dir is the rowwise storage's own memory (shared, not a copy). */
static int buffer_shared(const hq_qtensor *qt, uint32_t dir, const hq_buffer *b) {
  const hq_storage *row = hq_qtensor_storage(qt, HQ_ROWWISE);
  if (dir != HQ_COLWISE || !row || !(b->flags & HQ_BUF_SHARED)) return 0;
  for (uint32_t i = 0; i < row->nbuf; i++)
    if (hq_storage_cbuf(row, i)->ptr == b->ptr) return 1;
  return 0;
}

void cli_buffers_json(json *j, const hq_qtensor *qt, uint32_t dir) {
  const hq_storage *st = hq_qtensor_storage(qt, dir);
  json_key(j, "buffers");
  json_arr(j);
  for (uint32_t i = 0; st && i < st->nbuf; i++) {
    const hq_buffer *b = hq_storage_cbuf(st, i);
    json_obj(j);
    json_kstr(j, "name", b->name);
    json_kstr(j, "dtype", hq_dtype_name(b->dtype));
    json_kints(j, "shape", b->shape, b->ndim);
    json_kint(j, "bytes", (int64_t)b->bytes);
    json_kbool(j, "shared_with_rowwise", buffer_shared(qt, dir, b));
    json_close_obj(j);
  }
  json_close_arr(j);
}

void cli_buffers_text(const hq_qtensor *qt, uint32_t dir, int indent) {
  const hq_storage *st = hq_qtensor_storage(qt, dir);
  for (uint32_t i = 0; st && i < st->nbuf; i++) {
    const hq_buffer *b = hq_storage_cbuf(st, i);
    char shape[96] = "";
    for (int k = 0; k < b->ndim; k++)
      snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", k ? "x" : "",
               (long long)b->shape[k]);
    printf("%*s%-24s %-7s %-16s %10zu%s\n", indent, "", b->name, hq_dtype_name(b->dtype), shape,
           b->bytes, buffer_shared(qt, dir, b) ? "  (the rowwise buffer)" : "");
  }
}
