/*
** buffers.h -- a quantized tensor's buffers as `hq quantize` and `hq info` list them
** (tools/buffers.c).
*/
#ifndef HQ_BUFFERS_H
#define HQ_BUFFERS_H

#include "hq/hq.h"
#include "json.h"

/* "buffers": [{name, dtype, shape, bytes, shared_with_rowwise}, ...] of direction dir. */
void cli_buffers_json(json *j, const hq_qtensor *qt, uint32_t dir);
/* One line per buffer of direction dir on stdout, after `indent` spaces: name, dtype, shape,
   bytes, "(the rowwise buffer)" when shared. */
void cli_buffers_text(const hq_qtensor *qt, uint32_t dir, int indent);

#endif
