/*
** ckpt_desc.c -- the commands' view of a safetensors file: opening it verified where hq wrote
** it, an entry's shape as text, and a quantized tensor's "<name>/hq" metadata (docs/checkpoints.md,
** 3) as one line for `hq info --checkpoint`: shape, nominal dtype, each direction's format,
** plugin and options. Apart from cmd_info.c because jansson's names (json_null, ...) meet the
** tools' JSON writer's.
*/
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "ckpt_desc.h"

int ckpt_open_any(const char *path, hq_ckpt **out, int *summed) {
  hq_ckpt_open_opts o = {.struct_size = sizeof o, .flags = HQ_CKPT_NO_VERIFY};
  *summed = 0;
  int rc = hq_ckpt_open_ex(path, &o, out);
  if (rc || !hq_ckpt_meta(*out, "hq_header_xxh3_64")) return rc;
  /* hq wrote it: again, verified (the header's checksum at open, each entry's as it is read) */
  hq_ckpt_close(*out);
  *out = NULL;
  *summed = 1;
  return hq_ckpt_open(path, out);
}

void ckpt_shape_text(const hq_ckpt_entry_info *e, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int k = 0; k < e->ndim && at < len; k++)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", k ? ", " : "", (long long)e->shape[k]);
  if (at < len) snprintf(buf + at, len - at, "]");
}

#ifdef HQ_HAVE_JANSSON
#include <jansson.h>

int ckpt_describe(const char *meta, char *buf, size_t len) {
  json_error_t err;
  json_t *m = json_loads(meta, JSON_REJECT_DUPLICATES, &err);
  json_t *f = json_object_get(m, "formats");
  if (!m || !json_is_integer(json_object_get(m, "rows")) ||
      !json_is_integer(json_object_get(m, "cols")) || !json_is_object(f)) {
    json_decref(m);
    return -1;
  }
  size_t at = (size_t)snprintf(buf, len, "[%lld, %lld] %s",
                               (long long)json_integer_value(json_object_get(m, "rows")),
                               (long long)json_integer_value(json_object_get(m, "cols")),
                               json_string_value(json_object_get(m, "nominal"))
                                   ? json_string_value(json_object_get(m, "nominal"))
                                   : "?");
  size_t i;
  json_t *d;
  json_array_foreach(json_object_get(m, "directions"), i, d) {
    json_t *fd = json_object_get(f, json_string_value(d) ? json_string_value(d) : "");
    if (at >= len || !json_is_object(fd)) continue;
    const char *fmt = json_string_value(json_object_get(fd, "format"));
    const char *plugin = json_string_value(json_object_get(fd, "plugin"));
    at += (size_t)snprintf(buf + at, len - at, "; %s %s (%s", json_string_value(d),
                           fmt ? fmt : "?", plugin ? plugin : "?");
    size_t k;
    json_t *o;
    json_array_foreach(json_object_get(fd, "options"), k, o) {
      if (at < len && json_string_value(o))
        at += (size_t)snprintf(buf + at, len - at, "%s%s", k ? ", " : ": ", json_string_value(o));
    }
    if (at < len) at += (size_t)snprintf(buf + at, len - at, ")");
  }
  json_decref(m);
  return 0;
}
#else
int ckpt_describe(const char *meta, char *buf, size_t len) {
  (void)meta;
  if (len) buf[0] = '\0';
  return -1;
}
#endif
