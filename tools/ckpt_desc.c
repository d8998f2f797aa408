/*
** ckpt_desc.c -- a quantized tensor's "<name>/hq" metadata (docs/checkpoints.md, 3) as one line
** for `hq info --checkpoint`: shape, nominal dtype, each direction's format, plugin and options.
** Apart from cmd_info.c because jansson's names (json_null, ...) meet the tools' JSON writer's.
*/
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "ckpt_desc.h"

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
