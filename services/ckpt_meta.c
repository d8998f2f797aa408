/*
** ckpt_meta.c -- the "<name>/hq" metadata of a quantized tensor in a checkpoint: a JSON text
** describing it (schema version, role, shape, nominal dtype, directions, usage, columnwise
** source, per direction the format instance, plugin, plugin version, layout version and every
** option as "key=value", and the buffer list), made from a qtensor through libhqcore's public
** queries, parsed back, and its formats checked against the qtensor a load fills.
**
** Options are compared by name, so that a plugin may append options: one the file lacks (the
** plugin gained it after the file was written) must hold the plugin's default in the qtensor,
** one the file has that the plugin no longer knows is refused, naming it. The layout version
** (hq_format_ops.layout_version) must be the module's: a module whose stored bytes changed
** cannot read an older file's.
*/
#include "config.h"
#include "ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


int ck_qtensor_usable(const char *path, const char *what, const char *name, const hq_ctx *ctx,
                      const hq_qtensor *qt) {
  if (hq_qtensor_is_saved(qt))
    return ck_error(HQ_ESTATE, path, "%s '%.200s': role %.200s is saved (hq_qtensor_save): "
                    "restore it first", what, name, hq_qtensor_role(qt));
  if (hq_ctx_device(ctx) != hq_qtensor_device(qt))
    return ck_error(HQ_EINVAL, path, "%s '%.200s': the context runs on device %d, the tensor "
                    "lives on %d", what, name, hq_ctx_device(ctx), hq_qtensor_device(qt));
  return HQ_OK;
}

int ck_buffer_aliased(const hq_qtensor *qt, uint32_t dir, uint32_t i) {
  const hq_storage *col = hq_qtensor_storage(qt, HQ_COLWISE);
  const hq_storage *row = hq_qtensor_storage(qt, HQ_ROWWISE);
  if (dir != HQ_COLWISE || !col || !row || i >= col->nbuf) return 0;
  const hq_buffer *b = hq_storage_cbuf(col, i);
  if (!(b->flags & HQ_BUF_SHARED) || b->shared_with < 0 || (uint32_t)b->shared_with >= row->nbuf)
    return 0;
  return b->ptr == hq_storage_cbuf(row, (uint32_t)b->shared_with)->ptr;
}

// --- making the metadata ----------------------------------------------------------------------

static json_t *jdirs(uint32_t dirs) {
  json_t *a = json_array();
  for (uint32_t d = HQ_ROWWISE; a && d <= HQ_COLWISE; d <<= 1)
    if ((dirs & d) && ck_jpush(a, json_string(hq_dir_name(d)))) a = (json_decref(a), NULL);
  return a;
}

/* The strings of a qtensor that go into its metadata must be UTF-8 (a safetensors header is). */
static int check_utf8_field(const char *path, const char *name, const char *what,
                            const char *s) {
  if (s && !ck_utf8_valid(s))
    return ck_error(HQ_EINVAL, path, "hq_ckpt_add_qtensor '%.200s': the %s '%.200s' is not "
                    "valid UTF-8 and cannot be stored in a safetensors header", name, what, s);
  return HQ_OK;
}

static int check_utf8_fields(const char *path, const char *name, const hq_qtensor *qt,
                             const hq_format_desc *fd) {
  int rc = check_utf8_field(path, name, "role", hq_qtensor_role(qt));
  for (int d = 0; !rc && d < 2; d++) {
    rc = check_utf8_field(path, name, "format name", fd[d].name);
    if (!rc) rc = check_utf8_field(path, name, "plugin version", fd[d].plugin_version);
    for (size_t i = 0; !rc && i < fd[d].n_options; i++)
      rc = check_utf8_field(path, name, "option value", fd[d].option_values[i]);
  }
  return rc;
}

/* {"format", "plugin", "plugin_version", "layout_version", "options": ["key=value", ...]}: every
   option of the plugin's table, in table order, defaults resolved. NULL when out of memory. */
static json_t *format_json(const hq_format_desc *fd) {
  json_t *o = json_object(), *opts = json_array();
  int bad = !o || !opts;
  bad |= ck_jset(o, "format", json_string(fd->name)) != 0;
  bad |= ck_jset(o, "plugin", json_string(fd->plugin)) != 0;
  bad |= ck_jset(o, "plugin_version", json_string(fd->plugin_version)) != 0;
  bad |= ck_jset(o, "layout_version", json_integer((json_int_t)fd->layout_version)) != 0;
  for (size_t i = 0; !bad && i < fd->n_options; i++) {
    char *t = hqt_join(fd->option_names[i], "=", fd->option_values[i]);
    bad |= !t || ck_jpush(opts, json_string(t)) != 0;
    free(t);
  }
  if (!bad) {
    bad = ck_jset(o, "options", opts) != 0;
    opts = NULL;
  }
  json_decref(opts);
  if (bad) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* The entry a buffer of qt is stored under: its own for an owned buffer, the rowwise buffer's
   for a columnwise buffer that is (still) the rowwise one. */
static char *buffer_entry(const char *name, const hq_qtensor *qt, uint32_t dir, uint32_t i) {
  const hq_buffer *b = hq_storage_cbuf(hq_qtensor_storage(qt, dir), i);
  if (ck_buffer_aliased(qt, dir, i))
    b = hq_storage_cbuf(hq_qtensor_storage(qt, HQ_ROWWISE), (uint32_t)b->shared_with);
  return hqt_join(name, "/", b->name);
}

/* The "buffers" list: every buffer of every present direction, rowwise first. */
static json_t *buffers_json(const char *name, const hq_qtensor *qt) {
  json_t *bufs = json_array();
  int bad = !bufs;
  for (uint32_t dir = HQ_ROWWISE; !bad && dir <= HQ_COLWISE; dir <<= 1) {
    const hq_storage *st = hq_qtensor_storage(qt, dir);
    for (uint32_t i = 0; !bad && st && i < st->nbuf; i++) {
      const hq_buffer *b = hq_storage_cbuf(st, i);
      char *entry = buffer_entry(name, qt, dir, i);
      json_t *bo = json_object();
      bad |= !entry || !bo;
      bad |= ck_jset(bo, "entry", entry ? json_string(entry) : NULL) != 0;
      bad |= ck_jset(bo, "name", json_string(b->name)) != 0;
      bad |= ck_jset(bo, "direction", json_string(hq_dir_name(dir))) != 0;
      bad |= ck_jset(bo, "dtype", json_string(hq_dtype_name(b->dtype))) != 0;
      bad |= ck_jset(bo, "shape", ck_jshape(b->ndim, b->shape)) != 0;
      bad |= ck_jset(bo, "shared", json_boolean(ck_buffer_aliased(qt, dir, i))) != 0;
      free(entry);
      if (bad) json_decref(bo);
      else bad = ck_jpush(bufs, bo) != 0;
    }
  }
  if (bad) {
    json_decref(bufs);
    return NULL;
  }
  return bufs;
}

const char *ck_source_name(const hq_qtensor *qt) {
  return hq_qtensor_columnwise_source(qt) == HQ_SOURCE_ROWWISE_DEQUANTIZED ? "rowwise_dequantized"
                                                                           : "original";
}

int ck_meta_make(const char *path, const char *name, const hq_qtensor *qt, char **out) {
  *out = NULL;
  hq_format_desc fd[2];
  for (int d = 0; d < 2; d++) {
    fd[d].struct_size = sizeof fd[d];
    int rc = hq_qtensor_format_desc(qt, d ? HQ_COLWISE : HQ_ROWWISE, &fd[d]);
    if (rc) return rc;
  }
  int rc = check_utf8_fields(path, name, qt, fd);
  if (rc) return rc;
  json_t *o = json_object(), *fm = json_object();
  int bad = !o || !fm;
  bad |= ck_jset(o, "hq_checkpoint", json_integer(CK_META_VERSION)) != 0;
  bad |= ck_jset(o, "role", json_string(hq_qtensor_role(qt))) != 0;
  bad |= ck_jset(o, "rows", json_integer((json_int_t)hq_qtensor_rows(qt))) != 0;
  bad |= ck_jset(o, "cols", json_integer((json_int_t)hq_qtensor_cols(qt))) != 0;
  bad |= ck_jset(o, "nominal", json_string(hq_dtype_name(hq_qtensor_nominal_dtype(qt)))) != 0;
  bad |= ck_jset(o, "directions", jdirs(hq_qtensor_dirs(qt))) != 0;
  bad |= ck_jset(o, "usage", jdirs(hq_qtensor_usage(qt))) != 0;
  bad |= ck_jset(o, "columnwise_source", json_string(ck_source_name(qt))) != 0;
  for (int d = 0; !bad && d < 2; d++)
    bad |= ck_jset(fm, hq_dir_name(HQ_ROWWISE << d), format_json(&fd[d])) != 0;
  if (!bad) {
    bad = ck_jset(o, "formats", fm) != 0;
    fm = NULL;
  }
  if (!bad) bad = ck_jset(o, "buffers", buffers_json(name, qt)) != 0;
  size_t len;
  if (!bad) *out = ck_dump_json(o, 0, &len);
  json_decref(o);
  json_decref(fm);
  if (!*out)
    return hq_set_error(HQ_ENOMEM, "checkpoint writer: out of memory (metadata of '%.200s')",
                        name);
  return HQ_OK;
}

// --- reading it back --------------------------------------------------------------------------

int ck_meta_error(const ck_load *L, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ck_error(HQ_EPARSE, L->c->path, "tensor '%.200s': metadata \"%.200s\" %s", L->name,
                  L->mkey, msg);
}

static int mget_str(const ck_load *L, json_t *o, const char *key, const char *where,
                    const char **out) {
  json_t *v = json_object_get(o, key);
  if (!json_is_string(v))
    return ck_meta_error(L, "%s: \"%s\" is missing or not a string", where, key);
  *out = json_string_value(v);
  return HQ_OK;
}
static int mget_int(const ck_load *L, json_t *o, const char *key, int64_t *out) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v)) return ck_meta_error(L, "\"%s\" is missing or not an integer", key);
  *out = (int64_t)json_integer_value(v);
  return HQ_OK;
}
/* A list of direction names -> mask. */
/* The direction a metadata word names (hq_dir_name's words), 0 for anything else. */
static uint32_t dir_of(const char *s) {
  for (uint32_t d = HQ_ROWWISE; s && d <= HQ_COLWISE; d <<= 1)
    if (!strcmp(s, hq_dir_name(d))) return d;
  return 0;
}
static int mget_dirs(const ck_load *L, json_t *o, const char *key, uint32_t *out) {
  json_t *v = json_object_get(o, key);
  *out = 0;
  if (!json_is_array(v)) return ck_meta_error(L, "\"%s\" is missing or not an array", key);
  for (size_t i = 0; i < json_array_size(v); i++) {
    const char *s = json_string_value(json_array_get(v, i));
    const uint32_t d = dir_of(s);
    if (!d || (*out & d))
      return ck_meta_error(L, "\"%s\" item %zu is not a new 'rowwise' or 'columnwise'", key, i);
    *out |= d;
  }
  return HQ_OK;
}

int ck_meta_parse(const ck_load *L, const char *text, ck_meta *out) {
  memset(out, 0, sizeof *out);
  json_error_t err;
  int rc = ck_parse_json(text, strlen(text), &out->json, &err);
  if (rc)
    return rc == HQ_ENOMEM
               ? hq_set_error(HQ_ENOMEM, "hq_ckpt_load_qtensor: out of memory (metadata)")
               : ck_meta_error(L, "is not valid JSON: %s", err.text);
  json_t *m = out->json;
  if (!json_is_object(m)) return ck_meta_error(L, "is not a JSON object");
  int64_t version = 0;
  if ((rc = mget_int(L, m, "hq_checkpoint", &version))) return rc;
  if (version != CK_META_VERSION)
    return ck_error(HQ_ENOTSUP, L->c->path, "tensor '%.200s': metadata version %lld (this hq "
                    "reads version %d)", L->name, (long long)version, CK_META_VERSION);
  const char *role = NULL, *nominal = NULL;
  if ((rc = mget_int(L, m, "rows", &out->rows)) || (rc = mget_int(L, m, "cols", &out->cols)) ||
      (rc = mget_dirs(L, m, "directions", &out->dirs)) ||
      (rc = mget_str(L, m, "columnwise_source", "top level", &out->source)) ||
      (rc = mget_str(L, m, "role", "top level", &role)) ||
      (rc = mget_str(L, m, "nominal", "top level", &nominal)) ||
      (rc = mget_dirs(L, m, "usage", &out->usage)))
    return rc;
  if (out->rows < 1 || out->cols < 1)
    return ck_meta_error(L, "\"rows\" and \"cols\" (%lld, %lld) are not positive",
                         (long long)out->rows, (long long)out->cols);
  out->nominal = hq_dtype_from_name(nominal);
  if (out->nominal != HQ_F32 && out->nominal != HQ_F16 && out->nominal != HQ_BF16)
    return ck_meta_error(L, "\"nominal\" is '%.40s', not f32, f16 or bf16", nominal);
  if (!out->dirs) return ck_meta_error(L, "\"directions\" is empty");
  if (strcmp(out->source, "original") != 0 && strcmp(out->source, "rowwise_dequantized") != 0)
    return ck_meta_error(L, "\"columnwise_source\" is '%.40s', not 'original' or "
                         "'rowwise_dequantized'", out->source);
  return HQ_OK;
}

void ck_meta_free(ck_meta *m) {
  json_decref(m->json);
  m->json = NULL;
}

// --- the buffers --------------------------------------------------------------------------------

/* Parse the "buffers" list and check every record against its safetensors entry. */
int ck_meta_buffers(const ck_load *L, const ck_meta *meta, ck_mbuf **out, size_t *nout) {
  json_t *list = json_object_get(meta->json, "buffers");
  if (!json_is_array(list)) return ck_meta_error(L, "\"buffers\" is missing or not an array");
  size_t n = json_array_size(list);
  if (n > 2 * HQ_MAX_BUFFERS)
    return ck_meta_error(L, "lists %zu buffers (at most %d)", n, 2 * HQ_MAX_BUFFERS);
  ck_mbuf *m = calloc(n, sizeof *m);
  if (!m) return hq_set_error(HQ_ENOMEM, "hq_ckpt_load_qtensor: out of memory");
  int rc = HQ_OK;
  for (size_t i = 0; !rc && i < n; i++) {
    json_t *o = json_array_get(list, i);
    char where[40];
    snprintf(where, sizeof where, "buffer %zu", i);
    if (!json_is_object(o)) {
      rc = ck_meta_error(L, "%s is not an object", where);
      break;
    }
    const char *dir = NULL, *dtype = NULL;
    json_t *shared = json_object_get(o, "shared");
    rc = mget_str(L, o, "entry", where, &m[i].entry);
    if (!rc) rc = mget_str(L, o, "name", where, &m[i].name);
    if (!rc) rc = mget_str(L, o, "direction", where, &dir);
    if (!rc) rc = mget_str(L, o, "dtype", where, &dtype);
    if (!rc && !json_is_boolean(shared))
      rc = ck_meta_error(L, "%s: \"shared\" is missing or not true/false", where);
    if (rc) break;
    m[i].dir = dir_of(dir);
    m[i].dtype = hq_dtype_from_name(dtype);
    json_t *shape = json_object_get(o, "shape");
    size_t nd = json_array_size(shape);
    if (!m[i].dir || !m[i].dtype || !json_is_array(shape) || nd < 1 || nd > HQ_MAX_BUFFER_DIMS) {
      rc = ck_meta_error(L, "%s ('%.60s'): bad direction, dtype or shape", where, m[i].name);
      break;
    }
    m[i].ndim = (int)nd;
    for (size_t k = 0; k < nd; k++) {
      json_t *x = json_array_get(shape, k);
      if (!json_is_integer(x) || json_integer_value(x) < 0) {
        rc = ck_meta_error(L, "%s ('%.60s'): shape dimension %zu is not a non-negative integer",
                           where, m[i].name, k);
        break;
      }
      m[i].shape[k] = (int64_t)json_integer_value(x);
    }
    if (rc) break;
    const char *want = ck_st_name_of(m[i].dtype);
    int fr = ck_find_entry(L->c, m[i].entry, &m[i].ce);
    if (fr == HQ_ENOENT)
      rc = ck_error(HQ_EPARSE, L->c->path, "tensor '%.200s': buffer '%.60s' is stored under "
                    "entry '%.200s', which the file does not have", L->name, m[i].name,
                    m[i].entry);
    else if (fr)
      rc = fr;
    else if (!want || strcmp(m[i].ce.st_name, want) != 0 ||
             !ck_shape_equal(m[i].ce.shape, m[i].ndim, m[i].shape)) {
      char a[200], b[200];
      rc = ck_error(HQ_EPARSE, L->c->path, "tensor '%.200s': buffer '%.60s' (%s %s) does not "
                    "match its entry '%.200s' (%s %s)", L->name, m[i].name,
                    hq_dtype_name(m[i].dtype),
                    ck_dims_text(m[i].ndim, m[i].shape, a, sizeof a), m[i].entry,
                    m[i].ce.st_name, ck_shape_text(m[i].ce.shape, b, sizeof b));
    }
  }
  /* "shared": true exactly for a columnwise buffer stored under a rowwise buffer's entry (the
     loader goes by the entries; a flag contradicting them is corruption) */
  for (size_t i = 0; !rc && i < n; i++) {
    int under_rowwise = 0;
    for (size_t k = 0; m[i].dir == HQ_COLWISE && k < n; k++)
      under_rowwise |= m[k].dir == HQ_ROWWISE && strcmp(m[k].entry, m[i].entry) == 0;
    const int flag = json_is_true(json_object_get(json_array_get(list, i), "shared"));
    if (flag != under_rowwise)
      rc = ck_meta_error(L, "buffer %zu ('%.60s'): \"shared\" is %s, but its entry '%.200s' "
                         "is %sa rowwise buffer's", i, m[i].name, flag ? "true" : "false",
                         m[i].entry, under_rowwise ? "" : "not ");
  }
  if (rc) {
    free(m);
    return rc;
  }
  *out = m;
  *nout = n;
  return HQ_OK;
}

// --- the formats --------------------------------------------------------------------------------

/* Index of the option whose name is the first klen bytes of `key` in fd's table, or -1. */
static long option_index(const hq_format_desc *fd, const char *key, size_t klen) {
  for (size_t j = 0; j < fd->n_options; j++)
    if (strlen(fd->option_names[j]) == klen && !strncmp(fd->option_names[j], key, klen))
      return (long)j;
  return -1;
}

/* Index of the "key=value" string of `opts` whose key is `name`, or -1. */
static long saved_index(json_t *opts, const char *name) {
  const size_t n = strlen(name);
  for (size_t i = 0; i < json_array_size(opts); i++) {
    const char *t = json_string_value(json_array_get(opts, i));
    if (!strncmp(t, name, n) && t[n] == '=') return (long)i;
  }
  return -1;
}

/* Every option the file lists, by name: a "key=value" string with a key listed once, that the
   module still has, and whose value is the qtensor's. */
static int check_saved_options(const ck_load *L, const char *dn, json_t *opts,
                               const hq_format_desc *fd) {
  for (size_t i = 0; i < json_array_size(opts); i++) {
    const char *t = json_string_value(json_array_get(opts, i));
    const char *eq = t ? strchr(t, '=') : NULL;
    if (!eq || eq == t)
      return ck_meta_error(L, "%s: option %zu is not a \"key=value\" string", dn, i);
    const size_t klen = (size_t)(eq - t);
    for (size_t k = 0; k < i; k++)
      if (!strncmp(json_string_value(json_array_get(opts, k)), t, klen + 1))
        return ck_meta_error(L, "%s: option '%.*s' is listed twice", dn, (int)klen, t);
    const long j = option_index(fd, t, klen);
    if (j < 0)
      return ck_error(HQ_EINVAL, L->c->path, "tensor '%.200s': %s option '%.150s' of the "
                      "checkpoint is unknown to plugin %s (version %s), which has no option "
                      "'%.*s' (any more)", L->name, dn, t, fd->plugin, fd->plugin_version,
                      (int)klen, t);
    if (strcmp(eq + 1, fd->option_values[j]) != 0)
      return ck_error(HQ_EINVAL, L->c->path, "tensor '%.200s': %s option '%s' differs: "
                      "checkpoint '%.150s', qtensor '%s=%.150s' (plugin %s)", L->name, dn,
                      fd->option_names[j], t, fd->option_names[j], fd->option_values[j],
                      fd->plugin);
  }
  return HQ_OK;
}

/* Every option of the module the file does not list (appended to the plugin after the file was
   written): the file's tensor was made with the option's default, so the qtensor must hold it. */
static int check_new_options(const ck_load *L, const char *dn, json_t *opts,
                             const hq_format_desc *fd) {
  for (size_t j = 0; j < fd->n_options; j++) {
    if (saved_index(opts, fd->option_names[j]) >= 0) continue;
    if (strcmp(fd->option_defaults[j], fd->option_values[j]) != 0)
      return ck_error(HQ_EINVAL, L->c->path, "tensor '%.200s': %s option '%s' is not in the "
                      "checkpoint (written before plugin %s had it: its default '%s=%.150s' "
                      "applies), qtensor '%s=%.150s'", L->name, dn, fd->option_names[j],
                      fd->plugin, fd->option_names[j], fd->option_defaults[j],
                      fd->option_names[j], fd->option_values[j]);
  }
  return HQ_OK;
}

/* Direction dir's format record, well formed (whether the direction is present or not): the
   strings format, plugin, plugin_version, options of "key=value" strings, and layout_version
   (absent from a file written before layout versions were recorded: the first layout). */
static int format_record(const ck_load *L, json_t *formats, uint32_t dir, json_t **rec) {
  const char *dn = hq_dir_name(dir);
  json_t *f = json_object_get(formats, dn);
  if (!json_is_object(f)) return ck_meta_error(L, "\"formats\" has no \"%s\" object", dn);
  const char *text = NULL;
  int rc = mget_str(L, f, "plugin", dn, &text);
  if (!rc) rc = mget_str(L, f, "format", dn, &text);
  if (!rc) rc = mget_str(L, f, "plugin_version", dn, &text);
  if (rc) return rc;
  json_t *opts = json_object_get(f, "options"), *lv = json_object_get(f, "layout_version");
  if (!json_is_array(opts))
    return ck_meta_error(L, "%s: \"options\" is missing or not an array", dn);
  for (size_t i = 0; i < json_array_size(opts); i++)
    if (!json_is_string(json_array_get(opts, i)))
      return ck_meta_error(L, "%s: option %zu is not a string", dn, i);
  if (lv && (!json_is_integer(lv) || json_integer_value(lv) < 1 ||
             json_integer_value(lv) > UINT32_MAX))
    return ck_meta_error(L, "%s: \"layout_version\" is not an integer from 1 to 2^32-1", dn);
  *rec = f;
  return HQ_OK;
}

/* Check direction dir's format record (well formed) against qt's format instance. */
static int check_format(const ck_load *L, json_t *f, const hq_qtensor *qt, uint32_t dir) {
  const char *dn = hq_dir_name(dir);
  const char *plugin = json_string_value(json_object_get(f, "plugin"));
  const char *fname = json_string_value(json_object_get(f, "format"));
  json_t *opts = json_object_get(f, "options"), *lv = json_object_get(f, "layout_version");
  const long long saved_layout = lv ? (long long)json_integer_value(lv) : 1;
  int rc;
  hq_format_desc fd;
  fd.struct_size = sizeof fd;
  if ((rc = hq_qtensor_format_desc(qt, dir, &fd))) return rc;
  if (strcmp(plugin, fd.plugin) != 0)
    return ck_error(HQ_EINVAL, L->c->path, "tensor '%.200s': the %s direction was saved with "
                    "plugin '%.60s' (format '%.60s'), the qtensor's is plugin '%.60s' (format "
                    "'%.60s')", L->name, dn, plugin, fname, fd.plugin, fd.name);
  if (saved_layout != (long long)fd.layout_version)
    return ck_error(HQ_EINVAL, L->c->path, "tensor '%.200s': the %s direction (format '%.60s', "
                    "plugin %s) was saved in layout version %lld, the loaded module (%s version "
                    "%s) stores layout version %u: its bytes cannot be read as they are", L->name,
                    dn, fname, plugin, saved_layout, fd.plugin, fd.plugin_version,
                    fd.layout_version);
  rc = check_saved_options(L, dn, opts, &fd);
  return rc ? rc : check_new_options(L, dn, opts, &fd);
}

int ck_meta_check_formats(const ck_load *L, const ck_meta *m, const hq_qtensor *qt) {
  json_t *formats = json_object_get(m->json, "formats");
  if (!json_is_object(formats)) return ck_meta_error(L, "\"formats\" is missing or not an object");
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1) {
    json_t *f = NULL;
    int rc = format_record(L, formats, dir, &f);
    if (!rc && (hq_qtensor_dirs(qt) & dir)) rc = check_format(L, f, qt, dir);
    if (rc) return rc;
  }
  return HQ_OK;
}
