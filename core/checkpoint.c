/*
** checkpoint.c -- safetensors checkpoints: quantized tensors (every present direction, every
** buffer, the formats, plugin versions and options) and plain high-precision tensors.
**
** The file (docs/checkpoints.md): an 8-byte little-endian header length N, N bytes of JSON
** (padded with spaces to a multiple of 8), then the tensors' bytes, contiguous, in the order they
** were added. The JSON header is read and written with jansson, never by hand. Entries:
**   "<name>"                 a plain tensor (F32, F16, BF16) [rows, cols]
**   "<name>/<buffer name>"   one buffer a qtensor's storage owns ("fc1/data", ...)
** and "__metadata__" (string -> string): "hq_version", "<name>/hq" (a JSON text describing the
** qtensor) and the caller's keys.
**
** The writer copies every tensor to the host when it is added (a snapshot; device buffers through
** hq_ctx_memcpy + hq_ctx_sync) and writes the file at close, to "<path>.tmp.<pid>" renamed over
** <path>. The reader checks the whole header at open (nothing in it is trusted: sizes, offsets,
** shapes, dtypes are validated and overflow-checked) and reads tensors with pread() at load.
*/
#include "config.h"
#include "hq_internal.h"

#ifndef HQ_HAVE_JANSSON

static int no_ckpt(void) {
  return hqi_error(HQ_ENOTSUP, "checkpoints are not built in this libhqcore (configure found no "
                   "jansson: install the Debian package libjansson-dev and rebuild)");
}
int hq_ckpt_writer_open(const char *path, hq_ckpt_writer **out) {
  (void)path;
  if (out) *out = NULL;
  return no_ckpt();
}
int hq_ckpt_add_qtensor(hq_ckpt_writer *w, hq_ctx *ctx, const char *name, const hq_qtensor *qt) {
  (void)w;
  (void)ctx;
  (void)name;
  (void)qt;
  return no_ckpt();
}
int hq_ckpt_add_tensor(hq_ckpt_writer *w, hq_ctx *ctx, const char *name, const hq_tensor *t) {
  (void)w;
  (void)ctx;
  (void)name;
  (void)t;
  return no_ckpt();
}
int hq_ckpt_add_meta(hq_ckpt_writer *w, const char *key, const char *value) {
  (void)w;
  (void)key;
  (void)value;
  return no_ckpt();
}
int hq_ckpt_writer_close(hq_ckpt_writer *w) {
  (void)w;
  return no_ckpt();
}
void hq_ckpt_writer_abort(hq_ckpt_writer *w) { (void)w; }
int hq_ckpt_open(const char *path, hq_ckpt **out) {
  (void)path;
  if (out) *out = NULL;
  return no_ckpt();
}
void hq_ckpt_close(hq_ckpt *c) { (void)c; }
const char *hq_ckpt_meta(const hq_ckpt *c, const char *key) {
  (void)c;
  (void)key;
  return NULL;
}
int hq_ckpt_load_qtensor(hq_ckpt *c, hq_ctx *ctx, const char *name, hq_qtensor *qt) {
  (void)c;
  (void)ctx;
  (void)name;
  (void)qt;
  return no_ckpt();
}
int hq_ckpt_load_tensor(hq_ckpt *c, hq_ctx *ctx, const char *name, hq_tensor *t) {
  (void)c;
  (void)ctx;
  (void)name;
  (void)t;
  return no_ckpt();
}

#else /* HQ_HAVE_JANSSON */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

/* The largest header read or written: safetensors' own limit (100 MB), so that every file hq
   writes is one the reference reader accepts. */
#define CK_MAX_HEADER 100000000ull
/* Longest tensor name and metadata key, in bytes. */
#define CK_MAX_NAME 1024
/* Host staging for a device destination: read and copied in chunks of this size. */
#define CK_STAGE_BYTES ((size_t)16 << 20)
/* Version of the "<name>/hq" metadata written here. */
#define CK_META_VERSION 1
/* Flags of every JSON parse: a key given twice is an error, not "the last one wins". */
#define CK_JSON_FLAGS JSON_REJECT_DUPLICATES

// --- dtypes -----------------------------------------------------------------------------------

/* The safetensors dtypes the reader knows (element sizes for the shape/bytes check), and the hq
   dtype each one loads as (0: readable, but no hq tensor or buffer has it). */
static const struct {
  const char *name;
  size_t size;
  hq_dtype hq;
} st_types[] = {
    {"BOOL", 1, HQ_DTYPE_INVALID}, {"U8", 1, HQ_U8},           {"I8", 1, HQ_I8},
    {"F8_E4M3", 1, HQ_E4M3},       {"F8_E5M2", 1, HQ_E5M2},    {"F8_E8M0", 1, HQ_DTYPE_INVALID},
    {"I16", 2, HQ_DTYPE_INVALID},  {"U16", 2, HQ_DTYPE_INVALID}, {"F16", 2, HQ_F16},
    {"BF16", 2, HQ_BF16},          {"I32", 4, HQ_I32},         {"U32", 4, HQ_DTYPE_INVALID},
    {"F32", 4, HQ_F32},            {"F64", 8, HQ_DTYPE_INVALID}, {"I64", 8, HQ_DTYPE_INVALID},
    {"U64", 8, HQ_DTYPE_INVALID},  {"C64", 8, HQ_DTYPE_INVALID},
};
#define N_ST_TYPES (sizeof st_types / sizeof st_types[0])

/* The safetensors dtype an hq dtype is stored as: E8M0 scales and packed E2M1X2 bytes as U8 (the
   hq dtype is in the metadata). */
static const char *st_name_of(hq_dtype t) {
  switch (t) {
  case HQ_F32: return "F32";
  case HQ_F16: return "F16";
  case HQ_BF16: return "BF16";
  case HQ_U8: return "U8";
  case HQ_I8: return "I8";
  case HQ_I32: return "I32";
  case HQ_E4M3: return "F8_E4M3";
  case HQ_E5M2: return "F8_E5M2";
  case HQ_E8M0: return "U8";
  case HQ_E2M1X2: return "U8";
  default: return NULL;
  }
}

static int st_index(const char *name) {
  for (size_t i = 0; i < N_ST_TYPES; i++)
    if (strcmp(st_types[i].name, name) == 0) return (int)i;
  return -1;
}

// --- small helpers ----------------------------------------------------------------------------

/* "checkpoint <path>: <message>" as the thread's error; returns code. */
static int ck_error(int code, const char *path, const char *fmt, ...) HQ_PRINTF(3, 4);
static int ck_error(int code, const char *path, const char *fmt, ...) {
  char msg[800];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return hqi_error(code, "checkpoint %.200s: %s", path ? path : "?", msg);
}

/* Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF): what jansson accepts
   in a string, checked beforehand so that a jansson failure can only mean "out of memory". */
static int utf8_valid(const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  while (*s) {
    unsigned c = *s;
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      s++;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return 0;
    }
    s++;
    for (int k = 0; k < n; k++, s++) {
      if (*s < lo || *s > hi) return 0;
      lo = 0x80;
      hi = 0xBF;
    }
  }
  return 1;
}

/* The rule for tensor names (docs/checkpoints.md): 1 to CK_MAX_NAME bytes of UTF-8, no control
   characters, no '/' at either end and no empty path component ("a//b"), not "__metadata__". */
static int check_name(const char *name, const char *what) {
  if (!name || !name[0]) return hqi_error(HQ_EINVAL, "%s: the tensor name is empty", what);
  size_t n = strlen(name);
  if (n > CK_MAX_NAME)
    return hqi_error(HQ_EINVAL, "%s: the tensor name '%.40s...' is %zu bytes long (at most %d)",
                     what, name, n, CK_MAX_NAME);
  if (!utf8_valid(name))
    return hqi_error(HQ_EINVAL, "%s: the tensor name '%.200s' is not valid UTF-8", what, name);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)name[i] < 0x20 || name[i] == 0x7F)
      return hqi_error(HQ_EINVAL, "%s: the tensor name '%.200s' holds a control character (byte "
                       "%zu)", what, name, i);
  if (name[0] == '/' || name[n - 1] == '/' || strstr(name, "//"))
    return hqi_error(HQ_EINVAL, "%s: the tensor name '%.200s' starts or ends with '/' or holds "
                     "'//' (names are '/'-separated paths of non-empty parts)", what, name);
  if (strcmp(name, "__metadata__") == 0)
    return hqi_error(HQ_EINVAL, "%s: '__metadata__' is reserved by safetensors", what);
  return HQ_OK;
}

/* Write all of buf; HQ_EIO naming the file on failure. */
static int write_all(int fd, const void *buf, size_t n, const char *path) {
  const char *p = buf;
  while (n) {
    size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
    ssize_t k = write(fd, p, chunk);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return ck_error(HQ_EIO, path, "write failed: %s", k < 0 ? strerror(errno) : "no progress");
    p += k;
    n -= (size_t)k;
  }
  return HQ_OK;
}

/* Read exactly n bytes at off; a short read is HQ_EIO (the file shrank since it was opened). */
static int pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path) {
  char *p = buf;
  while (n) {
    size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
    if (off > (uint64_t)INT64_MAX) return ck_error(HQ_EIO, path, "offset %llu is out of range",
                                                   (unsigned long long)off);
    ssize_t k = pread(fd, p, chunk, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return ck_error(HQ_EIO, path, "read failed: %s", strerror(errno));
    if (k == 0)
      return ck_error(HQ_EIO, path, "the file ended at byte %llu while %zu more bytes were "
                      "expected (was it truncated after it was opened?)",
                      (unsigned long long)off, n);
    p += k;
    n -= (size_t)k;
    off += (uint64_t)k;
  }
  return HQ_OK;
}

static const char *dir_name(uint32_t dir) { return HQI_DIR_NAME(dir); }

// --- the writer -------------------------------------------------------------------------------

typedef struct wentry {
  char *name;                 /* safetensors key */
  const char *st_dtype;
  int ndim;
  int64_t shape[HQ_MAX_BUFFER_DIMS];
  size_t bytes;
  void *data;                 /* host copy (hqi_malloc) */
} wentry;

struct hq_ckpt_writer {
  char *path, *tmp;
  int fd;                     /* the temporary file, created at open */
  wentry *e;
  size_t n, cap;
  uint64_t data_bytes;
  json_t *meta;               /* "__metadata__": key -> string, in the order added */
  json_t *names;              /* tensor names added (a set) */
  json_t *prefixes;           /* every proper '/'-prefix of a name or metadata key added */
};

/* Keys inserted into a set by one call, removed again if the call fails. */
typedef struct undo {
  json_t *set[2 * (CK_MAX_NAME / 2 + 2)];
  char *key[2 * (CK_MAX_NAME / 2 + 2)];
  size_t n;
} undo;

static void undo_run(undo *u) {
  while (u->n) {
    u->n--;
    json_object_del(u->set[u->n], u->key[u->n]);
    free(u->key[u->n]);
  }
}
static void undo_forget(undo *u) {
  while (u->n) free(u->key[--u->n]);
}

/* Add key to set unless present; remembered in u. HQ_ENOMEM on failure. */
static int set_add(json_t *set, const char *key, undo *u) {
  if (json_object_get(set, key)) return HQ_OK;
  if (u->n == sizeof u->key / sizeof u->key[0])
    return hqi_error(HQ_EINTERNAL, "checkpoint writer: too many keys in one call");
  char *k = hqi_strdup(key);
  if (!k || json_object_set_new(set, key, json_true()) != 0) {
    free(k);
    return hqi_error(HQ_ENOMEM, "checkpoint writer: out of memory (name set)");
  }
  u->set[u->n] = set;
  u->key[u->n++] = k;
  return HQ_OK;
}

/* The proper '/'-prefixes of s, each passed to fn (stops at the first failure). */
static int each_prefix(const char *s, int (*fn)(void *arg, const char *prefix), void *arg) {
  size_t n = strlen(s);
  char *buf = hqi_malloc(n + 1);
  if (!buf) return hqi_error(HQ_ENOMEM, "checkpoint writer: out of memory");
  int rc = HQ_OK;
  for (size_t i = 1; !rc && i < n; i++)
    if (s[i] == '/') {
      memcpy(buf, s, i);
      buf[i] = '\0';
      rc = fn(arg, buf);
    }
  free(buf);
  return rc;
}

typedef struct prefix_arg {
  hq_ckpt_writer *w;
  const char *what, *full;
  undo *u;
} prefix_arg;

static int prefix_not_name(void *argp, const char *prefix) {
  prefix_arg *a = argp;
  if (json_object_get(a->w->names, prefix))
    return ck_error(HQ_EINVAL, a->w->path, "%s: '%.200s' lies under tensor '%.200s', already "
                    "added (the entries and metadata of a tensor are '<name>/...')", a->what,
                    a->full, prefix);
  return HQ_OK;
}
static int prefix_record(void *argp, const char *prefix) {
  prefix_arg *a = argp;
  return set_add(a->w->prefixes, prefix, a->u);
}

/* Check that tensor name `name` is free, then record it (and its prefixes) in u. */
static int claim_name(hq_ckpt_writer *w, const char *name, const char *what, undo *u) {
  int rc = check_name(name, what);
  if (rc) return rc;
  if (json_object_get(w->names, name))
    return ck_error(HQ_EINVAL, w->path, "%s: tensor '%.200s' is already in the checkpoint", what,
                    name);
  if (json_object_get(w->prefixes, name))
    return ck_error(HQ_EINVAL, w->path, "%s: '%.200s/...' is already a tensor or metadata key of "
                    "the checkpoint: '%.200s' cannot be a tensor name too", what, name, name);
  prefix_arg a = {w, what, name, u};
  if ((rc = each_prefix(name, prefix_not_name, &a))) return rc;
  if ((rc = set_add(w->names, name, u))) return rc;
  return each_prefix(name, prefix_record, &a);
}

int hq_ckpt_writer_open(const char *path, hq_ckpt_writer **out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_ckpt_writer_open: out is NULL");
  *out = NULL;
  if (!path || !path[0]) return hqi_error(HQ_EINVAL, "hq_ckpt_writer_open: the path is empty");
  hq_ckpt_writer *w = hqi_calloc(1, sizeof *w);
  if (!w) return hqi_error(HQ_ENOMEM, "hq_ckpt_writer_open: out of memory");
  w->fd = -1;
  w->path = hqi_strdup(path);
  w->tmp = hqi_asprintf("%s.tmp.%ld", path, (long)getpid());
  w->meta = json_object();
  w->names = json_object();
  w->prefixes = json_object();
  int rc = HQ_OK;
  if (!w->path || !w->tmp || !w->meta || !w->names || !w->prefixes ||
      json_object_set_new(w->meta, "hq_version", json_string(hq_version())) != 0)
    rc = hqi_error(HQ_ENOMEM, "hq_ckpt_writer_open: out of memory");
  if (!rc) {
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (w->fd < 0)
      rc = ck_error(HQ_EIO, path, "cannot create the temporary file %.300s: %s", w->tmp,
                    strerror(errno));
  }
  if (rc) {
    hq_ckpt_writer_abort(w);
    return rc;
  }
  *out = w;
  return HQ_OK;
}

void hq_ckpt_writer_abort(hq_ckpt_writer *w) {
  if (!w) return;
  if (w->fd >= 0) {
    close(w->fd);
    unlink(w->tmp);
  }
  for (size_t i = 0; i < w->n; i++) {
    free(w->e[i].name);
    free(w->e[i].data);
  }
  free(w->e);
  json_decref(w->meta);
  json_decref(w->names);
  json_decref(w->prefixes);
  free(w->path);
  free(w->tmp);
  free(w);
}

/* Room for `more` entries (allocated up front: appending cannot fail later). */
static int reserve_entries(hq_ckpt_writer *w, size_t more) {
  if (w->n + more <= w->cap) return HQ_OK;
  size_t cap = w->cap ? w->cap : 16;
  while (cap < w->n + more) {
    if (cap > SIZE_MAX / 2 / sizeof *w->e)
      return hqi_error(HQ_ENOMEM, "checkpoint writer: out of memory (entry list)");
    cap *= 2;
  }
  wentry *e = hqi_malloc(cap * sizeof *e);
  if (!e) return hqi_error(HQ_ENOMEM, "checkpoint writer: out of memory (%zu entries)", cap);
  if (w->n) memcpy(e, w->e, w->n * sizeof *e);
  free(w->e);
  w->e = e;
  w->cap = cap;
  return HQ_OK;
}

/* A host snapshot of `bytes` bytes at ptr on ctx's device (not yet synchronized). */
static int snapshot(hq_ckpt_writer *w, hq_ctx *ctx, const void *ptr, int device, size_t bytes,
                    const char *entry, void **out) {
  *out = hqi_malloc(bytes ? bytes : 1);
  if (!*out)
    return ck_error(HQ_ENOMEM, w->path, "out of memory: %zu bytes for a host copy of '%.200s'",
                    bytes, entry);
  int rc = bytes ? hq_ctx_memcpy(ctx, *out, HQ_DEVICE_HOST, ptr, device, bytes) : HQ_OK;
  if (rc) {
    free(*out);
    *out = NULL;
    return hqi_error_prefix(rc, "checkpoint %.200s: copying '%.200s' to the host", w->path,
                            entry);
  }
  return HQ_OK;
}

static int add_bytes(hq_ckpt_writer *w, uint64_t *total, size_t bytes) {
  if ((uint64_t)bytes > UINT64_MAX - *total || *total + bytes > (uint64_t)INT64_MAX)
    return ck_error(HQ_EINVAL, w->path, "the tensors add up to more than 2^63 bytes");
  *total += bytes;
  return HQ_OK;
}

/* Helpers that build JSON; a NULL anywhere is out of memory (every string was checked to be
   UTF-8 beforehand), and jansson frees a value it could not insert. */
static int jset(json_t *o, const char *key, json_t *v) {
  return o && v ? json_object_set_new(o, key, v) : (json_decref(v), -1);
}
static int jpush(json_t *a, json_t *v) {
  return a && v ? json_array_append_new(a, v) : (json_decref(v), -1);
}
static json_t *jshape(int ndim, const int64_t *shape) {
  json_t *a = json_array();
  for (int k = 0; a && k < ndim; k++)
    if (jpush(a, json_integer((json_int_t)shape[k]))) {
      json_decref(a);
      return NULL;
    }
  return a;
}
static json_t *jdirs(uint32_t dirs) {
  json_t *a = json_array();
  if (a && (dirs & HQ_ROWWISE) && jpush(a, json_string("rowwise"))) a = (json_decref(a), NULL);
  if (a && (dirs & HQ_COLWISE) && jpush(a, json_string("columnwise"))) a = (json_decref(a), NULL);
  return a;
}

/* JSON text of `v` (compact, keys in insertion order) into a new buffer of *len bytes plus
   `extra` bytes of room, NUL-terminated; NULL when out of memory. json_dumps is not used: under
   an allocation failure it can drop an object key and still return text (jansson ignores the
   status of a key's dump into its growing buffer). json_dumpb into a buffer sized by a first
   pass cannot lose bytes, and reports its own failures (0). */
static char *dump_json(const json_t *v, size_t extra, size_t *len) {
  size_t n = json_dumpb(v, NULL, 0, JSON_COMPACT);
  if (!n || n > SIZE_MAX - extra - 1) return NULL;
  char *p = hqi_malloc(n + extra + 1);
  if (!p) return NULL;
  if (json_dumpb(v, p, n, JSON_COMPACT) != n) {
    free(p);
    return NULL;
  }
  p[n] = '\0';
  *len = n;
  return p;
}

/* "key=value" of option i of format f. */
static char *option_text(const hqi_format *f, size_t i) {
  return hqi_asprintf("%s=%s", f->plugin->ops.options[i].name,
                      f->val_text[i] ? f->val_text[i] : "");
}

/* The strings of a qtensor that go into its metadata must be UTF-8 (a safetensors header is). */
static int check_utf8_field(hq_ckpt_writer *w, const char *name, const char *what,
                            const char *s) {
  if (s && !utf8_valid(s))
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_qtensor '%.200s': the %s '%.200s' is not "
                    "valid UTF-8 and cannot be stored in a safetensors header", name, what, s);
  return HQ_OK;
}

static json_t *format_json(const hqi_format *f, int *rc) {
  json_t *o = json_object(), *opts = json_array();
  int bad = !o || !opts;
  bad |= jset(o, "format", json_string(f->name)) != 0;
  bad |= jset(o, "plugin", json_string(f->plugin->ops.name)) != 0;
  bad |= jset(o, "plugin_version", json_string(f->plugin->ops.version ? f->plugin->ops.version
                                                                      : "")) != 0;
  for (size_t i = 0; !bad && i < f->plugin->n_options; i++) {
    char *t = option_text(f, i);
    bad |= !t || jpush(opts, json_string(t)) != 0;
    free(t);
  }
  if (!bad) {
    bad = jset(o, "options", opts) != 0;
    opts = NULL;
  }
  json_decref(opts);
  if (bad) {
    json_decref(o);
    *rc = hqi_error(HQ_ENOMEM, "checkpoint writer: out of memory (metadata)");
    return NULL;
  }
  return o;
}

/* The entry a buffer of qt is stored under: its own for an owned buffer, the rowwise buffer's
   for a columnwise buffer that is (still) the rowwise one. */
static char *buffer_entry(const char *name, const hq_qtensor *qt, int d, uint32_t i) {
  const hqi_qdir *q = &qt->d[d];
  const hq_buffer *b = hq_storage_cbuf(&q->st, i);
  if (!q->owned[i] && d == 1)
    b = hq_storage_cbuf(&qt->d[0].st, (uint32_t)b->shared_with);
  return hqi_asprintf("%s/%s", name, b->name);
}

static int qtensor_meta(hq_ckpt_writer *w, const char *name, const hq_qtensor *qt, char **out) {
  int rc = HQ_OK;
  *out = NULL;
  rc = check_utf8_field(w, name, "role", qt->role);
  for (int d = 0; !rc && d < 2; d++) {
    const hqi_format *f = qt->fmt[d];
    rc = check_utf8_field(w, name, "format name", f->name);
    if (!rc) rc = check_utf8_field(w, name, "plugin version", f->plugin->ops.version);
    for (size_t i = 0; !rc && i < f->plugin->n_options; i++)
      rc = check_utf8_field(w, name, "option value", f->val_text[i]);
  }
  if (rc) return rc;
  json_t *o = json_object(), *fm = json_object(), *bufs = json_array();
  int bad = !o || !fm || !bufs;
  bad |= jset(o, "hq_checkpoint", json_integer(CK_META_VERSION)) != 0;
  bad |= jset(o, "role", json_string(qt->role)) != 0;
  bad |= jset(o, "rows", json_integer((json_int_t)qt->rows)) != 0;
  bad |= jset(o, "cols", json_integer((json_int_t)qt->cols)) != 0;
  bad |= jset(o, "nominal", json_string(hq_dtype_name(qt->nominal))) != 0;
  bad |= jset(o, "directions", jdirs(hq_qtensor_dirs(qt))) != 0;
  bad |= jset(o, "usage", jdirs(qt->usage)) != 0;
  bad |= jset(o, "columnwise_source", json_string(qt->source == HQ_SOURCE_ROWWISE_DEQUANTIZED
                                                      ? "rowwise_dequantized"
                                                      : "original")) != 0;
  for (int d = 0; !bad && d < 2; d++) {
    json_t *f = format_json(qt->fmt[d], &rc);
    if (!f) break;
    bad |= jset(fm, d ? "columnwise" : "rowwise", f) != 0;
  }
  if (rc) bad = 1;
  if (!bad) {
    bad = jset(o, "formats", fm) != 0;
    fm = NULL;
  }
  for (int d = 0; !bad && d < 2; d++) {
    const hqi_qdir *q = &qt->d[d];
    for (uint32_t i = 0; !bad && q->present && i < q->st.nbuf; i++) {
      const hq_buffer *b = hq_storage_cbuf(&q->st, i);
      char *entry = buffer_entry(name, qt, d, i);
      json_t *bo = json_object();
      bad |= !entry || !bo;
      bad |= jset(bo, "entry", entry ? json_string(entry) : NULL) != 0;
      bad |= jset(bo, "name", json_string(b->name)) != 0;
      bad |= jset(bo, "direction", json_string(dir_name(q->st.dir))) != 0;
      bad |= jset(bo, "dtype", json_string(hq_dtype_name(b->dtype))) != 0;
      bad |= jset(bo, "shape", jshape(b->ndim, b->shape)) != 0;
      bad |= jset(bo, "shared", json_boolean(!q->owned[i])) != 0;
      free(entry);
      if (bad) json_decref(bo);
      else bad = jpush(bufs, bo) != 0;
    }
  }
  if (!bad) {
    bad = jset(o, "buffers", bufs) != 0;
    bufs = NULL;
  }
  size_t len;
  if (!bad) *out = dump_json(o, 0, &len);
  json_decref(o);
  json_decref(fm);
  json_decref(bufs);
  if (!*out) return rc ? rc : hqi_error(HQ_ENOMEM, "checkpoint writer: out of memory (metadata "
                                                    "of '%.200s')", name);
  return HQ_OK;
}

static void free_new(wentry *e, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(e[i].name);
    free(e[i].data);
  }
}

int hq_ckpt_add_qtensor(hq_ckpt_writer *w, hq_ctx *ctx, const char *name, const hq_qtensor *qt) {
  if (!w || !ctx || !qt) return hqi_error(HQ_EINVAL, "hq_ckpt_add_qtensor: NULL argument");
  int rc = check_name(name, "hq_ckpt_add_qtensor");
  if (rc) return rc;
  if (qt->saved)
    return ck_error(HQ_ESTATE, w->path, "hq_ckpt_add_qtensor '%.200s': role %.200s is saved "
                    "(hq_qtensor_save): restore it first", name, qt->role);
  if (ctx->device != qt->ctx->device)
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_qtensor '%.200s': the context runs on device "
                    "%d, the tensor lives on %d", name, ctx->device, qt->ctx->device);
  size_t nb = hq_qtensor_saved_count(qt);
  char *meta = NULL, *key = NULL;
  wentry fresh[2 * HQ_MAX_BUFFERS];
  size_t nf = 0;
  uint64_t total = w->data_bytes;
  undo *u = hqi_calloc(1, sizeof *u);
  if (!u) return hqi_error(HQ_ENOMEM, "hq_ckpt_add_qtensor: out of memory");
  rc = claim_name(w, name, "hq_ckpt_add_qtensor", u);
  if (!rc) rc = reserve_entries(w, nb);
  if (!rc) rc = qtensor_meta(w, name, qt, &meta);
  if (!rc) {
    key = hqi_asprintf("%s/hq", name);
    if (!key) rc = hqi_error(HQ_ENOMEM, "hq_ckpt_add_qtensor: out of memory");
  }
  int saved_dev = 0, entered = 0;
  if (!rc && !(rc = hqi_device_enter(ctx->device, &saved_dev))) entered = 1;
  for (int d = 0; !rc && d < 2; d++) {
    const hqi_qdir *q = &qt->d[d];
    for (uint32_t i = 0; !rc && q->present && i < q->st.nbuf; i++) {
      if (!q->owned[i]) continue;
      const hq_buffer *b = hq_storage_cbuf(&q->st, i);
      wentry *e = &fresh[nf];
      memset(e, 0, sizeof *e);
      e->name = hqi_asprintf("%s/%s", name, b->name);
      if (!e->name) {
        rc = hqi_error(HQ_ENOMEM, "hq_ckpt_add_qtensor: out of memory");
        break;
      }
      nf++;
      e->st_dtype = st_name_of(b->dtype);
      if (!e->st_dtype) {
        rc = ck_error(HQ_EINTERNAL, w->path, "buffer '%s' of '%.200s' has dtype %s, which has no "
                      "safetensors name", b->name, name, hq_dtype_name(b->dtype));
        break;
      }
      e->ndim = b->ndim;
      memcpy(e->shape, b->shape, sizeof e->shape);
      e->bytes = b->bytes;
      rc = add_bytes(w, &total, b->bytes);
      if (!rc) rc = snapshot(w, ctx, b->ptr, q->st.device, b->bytes, e->name, &e->data);
    }
  }
  if (!rc && nf) rc = hq_ctx_sync(ctx);
  else if (rc && nf) hq_ctx_sync(ctx); /* no copy may still be writing into what is freed */
  if (entered) hqi_device_leave(saved_dev);
  if (!rc && json_object_set_new(w->meta, key, json_string(meta)) != 0)
    rc = hqi_error(HQ_ENOMEM, "hq_ckpt_add_qtensor: out of memory (metadata)");
  free(key);
  free(meta);
  if (rc) {
    free_new(fresh, nf);
    undo_run(u);
    free(u);
    return rc;
  }
  undo_forget(u);
  free(u);
  memcpy(w->e + w->n, fresh, nf * sizeof *fresh);
  w->n += nf;
  w->data_bytes = total;
  return HQ_OK;
}

int hq_ckpt_add_tensor(hq_ckpt_writer *w, hq_ctx *ctx, const char *name, const hq_tensor *tp) {
  if (!w || !ctx) return hqi_error(HQ_EINVAL, "hq_ckpt_add_tensor: NULL argument");
  int rc = check_name(name, "hq_ckpt_add_tensor");
  if (rc) return rc;
  hq_tensor t;
  char what[300];
  snprintf(what, sizeof what, "hq_ckpt_add_tensor '%.200s'", name);
  if ((rc = hqi_tensor_in(tp, what, &t))) return rc;
  if (t.device != ctx->device && t.device != HQ_DEVICE_HOST)
    return ck_error(HQ_EINVAL, w->path, "%s: the tensor is on device %d, the context runs on %d "
                    "(a tensor is on the context's device or on the host)", what, t.device,
                    ctx->device);
  /* rows * cols <= 2^48 (hqi_check_shape), times at most 4 bytes: no overflow */
  size_t bytes = (size_t)t.rows * (size_t)t.cols * hq_dtype_size(t.dtype);
  uint64_t total = w->data_bytes;
  undo u0;
  u0.n = 0;
  wentry e;
  memset(&e, 0, sizeof e);
  rc = claim_name(w, name, "hq_ckpt_add_tensor", &u0);
  if (!rc) rc = reserve_entries(w, 1);
  if (!rc) rc = add_bytes(w, &total, bytes);
  if (!rc) {
    e.name = hqi_strdup(name);
    if (!e.name) rc = hqi_error(HQ_ENOMEM, "hq_ckpt_add_tensor: out of memory");
  }
  if (!rc) {
    e.st_dtype = st_name_of(t.dtype);
    e.ndim = 2;
    e.shape[0] = t.rows;
    e.shape[1] = t.cols;
    e.bytes = bytes;
    int saved_dev;
    rc = hqi_device_enter(ctx->device, &saved_dev);
    if (!rc) {
      rc = snapshot(w, ctx, t.data, t.device, bytes, name, &e.data);
      if (!rc) rc = hq_ctx_sync(ctx);
      hqi_device_leave(saved_dev);
    }
  }
  if (rc) {
    free_new(&e, 1);
    undo_run(&u0);
    return rc;
  }
  undo_forget(&u0);
  w->e[w->n++] = e;
  w->data_bytes = total;
  return HQ_OK;
}

static int meta_prefix_not_name(void *argp, const char *prefix) {
  prefix_arg *a = argp;
  if (json_object_get(a->w->names, prefix))
    return ck_error(HQ_EINVAL, a->w->path, "hq_ckpt_add_meta: key '%.200s' lies under tensor "
                    "'%.200s' (keys '<tensor name>/...' are hq's)", a->full, prefix);
  return HQ_OK;
}

int hq_ckpt_add_meta(hq_ckpt_writer *w, const char *key, const char *value) {
  if (!w || !key || !value) return hqi_error(HQ_EINVAL, "hq_ckpt_add_meta: NULL argument");
  size_t n = strlen(key);
  if (!n || n > CK_MAX_NAME)
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_meta: a key is 1 to %d bytes (this one: %zu)",
                    CK_MAX_NAME, n);
  if (!utf8_valid(key))
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_meta: key '%.200s' is not valid UTF-8", key);
  if (!utf8_valid(value))
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_meta: the value of '%.200s' is not valid "
                    "UTF-8", key);
  if (strcmp(key, "hq_version") == 0)
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_meta: 'hq_version' is written by hq");
  if (json_object_get(w->meta, key))
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_meta: key '%.200s' was already added", key);
  undo u0;
  u0.n = 0;
  prefix_arg a = {w, "hq_ckpt_add_meta", key, &u0};
  int rc = each_prefix(key, meta_prefix_not_name, &a);
  if (!rc) rc = each_prefix(key, prefix_record, &a);
  if (!rc && json_object_set_new(w->meta, key, json_string(value)) != 0)
    rc = hqi_error(HQ_ENOMEM, "hq_ckpt_add_meta: out of memory");
  if (rc) {
    undo_run(&u0);
    return rc;
  }
  undo_forget(&u0);
  return HQ_OK;
}

/* The JSON header, padded with spaces to a multiple of 8. */
static int build_header(hq_ckpt_writer *w, char **out, size_t *len) {
  json_t *root = json_object();
  int bad = !root || jset(root, "__metadata__", json_incref(w->meta)) != 0;
  uint64_t off = 0;
  for (size_t i = 0; !bad && i < w->n; i++) {
    const wentry *e = &w->e[i];
    json_t *o = json_object(), *offs = json_array();
    bad |= !o || !offs;
    bad |= jset(o, "dtype", json_string(e->st_dtype)) != 0;
    bad |= jset(o, "shape", jshape(e->ndim, e->shape)) != 0;
    bad |= jpush(offs, json_integer((json_int_t)off)) != 0;
    off += e->bytes; /* bounded by data_bytes <= 2^63 */
    bad |= jpush(offs, json_integer((json_int_t)off)) != 0;
    if (!bad) {
      bad = jset(o, "data_offsets", offs) != 0;
      offs = NULL;
    }
    json_decref(offs);
    if (bad) json_decref(o);
    else bad = jset(root, e->name, o) != 0;
  }
  size_t n = 0;
  char *p = bad ? NULL : dump_json(root, 7, &n);
  json_decref(root);
  if (!p) return ck_error(HQ_ENOMEM, w->path, "out of memory (the JSON header)");
  size_t padded = n + (8 - n % 8) % 8;
  if (padded > CK_MAX_HEADER) {
    free(p);
    return ck_error(HQ_EINVAL, w->path, "the JSON header would be %zu bytes, more than the %llu "
                    "safetensors readers accept (too much metadata?)", padded,
                    (unsigned long long)CK_MAX_HEADER);
  }
  memset(p + n, ' ', padded - n);
  *out = p;
  *len = padded;
  return HQ_OK;
}

int hq_ckpt_writer_close(hq_ckpt_writer *w) {
  if (!w) return hqi_error(HQ_EINVAL, "hq_ckpt_writer_close: NULL writer");
  char *hdr = NULL;
  size_t len = 0;
  int rc = build_header(w, &hdr, &len);
  if (!rc) {
    unsigned char n8[8];
    for (int k = 0; k < 8; k++) n8[k] = (unsigned char)((uint64_t)len >> (8 * k));
    rc = write_all(w->fd, n8, sizeof n8, w->path);
  }
  if (!rc) rc = write_all(w->fd, hdr, len, w->path);
  free(hdr);
  for (size_t i = 0; !rc && i < w->n; i++) rc = write_all(w->fd, w->e[i].data, w->e[i].bytes, w->path);
  if (!rc && fsync(w->fd) != 0)
    rc = ck_error(HQ_EIO, w->path, "fsync of %.300s failed: %s", w->tmp, strerror(errno));
  if (!rc) {
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
      rc = ck_error(HQ_EIO, w->path, "closing %.300s failed: %s", w->tmp, strerror(errno));
      unlink(w->tmp);
    } else if (rename(w->tmp, w->path) != 0) {
      rc = ck_error(HQ_EIO, w->path, "renaming %.300s to it failed: %s", w->tmp, strerror(errno));
      unlink(w->tmp);
    }
  }
  hq_ckpt_writer_abort(w); /* closes and removes the temporary file if it is still open */
  return rc;
}

// --- the reader -------------------------------------------------------------------------------

/* One jansson parse: HQ_OK, HQ_ENOMEM (an allocation failure it reported), or HQ_EPARSE. */
static int parse_once(const char *text, size_t len, json_t **out, json_error_t *err) {
  memset(err, 0, sizeof *err);
  int saved_errno = errno;
  errno = 0;
  json_t *v = json_loadb(text, len, CK_JSON_FLAGS, err);
  int oom = errno == ENOMEM;
  errno = saved_errno;
  *out = NULL;
  if (oom || (!v && (json_error_code(err) == json_error_out_of_memory || !err->text[0]))) {
    json_decref(v);
    return HQ_ENOMEM;
  }
  if (!v) return HQ_EPARSE;
  *out = v;
  return HQ_OK;
}

/* Parse JSON text: HQ_OK, HQ_ENOMEM, or HQ_EPARSE with *err describing the error.
   jansson's parser does not always report an allocation failure: its lexer drops a byte it could
   not append to a token and goes on (a key or a string comes out one byte short), and an early
   failure returns NULL with an empty message. So the result is verified: dumped again, it must
   give the text back (it does, byte for byte, for every header and metadata text hq writes:
   jansson's compact form); text formatted otherwise (another writer) is parsed a second time and
   both trees must be equal. An allocation failure seen anywhere is HQ_ENOMEM, never a silently
   shortened string. */
static int parse_json(const char *text, size_t len, json_t **out, json_error_t *err) {
  json_t *v;
  int rc = parse_once(text, len, &v, err);
  if (rc) return rc;
  size_t trimmed = len, n = 0;
  while (trimmed && (text[trimmed - 1] == ' ' || text[trimmed - 1] == '\n')) trimmed--;
  char *again = dump_json(v, 0, &n);
  if (!again) {
    json_decref(v);
    return HQ_ENOMEM;
  }
  int same = n == trimmed && memcmp(again, text, n) == 0;
  free(again);
  if (!same) {
    json_t *w;
    json_error_t err2;
    rc = parse_once(text, len, &w, &err2);
    if (!rc && !json_equal(v, w)) rc = HQ_ENOMEM;
    json_decref(w);
    if (rc) {
      json_decref(v);
      return HQ_ENOMEM; /* two parses of the same text disagree: one lost an allocation */
    }
  }
  *out = v;
  return HQ_OK;
}

struct hq_ckpt {
  char *path;
  int fd;
  uint64_t data_start;        /* 8 + header length */
  uint64_t data_size;         /* bytes after the header */
  json_t *root;               /* the header (validated at open) */
  json_t *meta;               /* "__metadata__" (borrowed from root), or NULL */
};

/* One entry of the header, as validated. */
typedef struct centry {
  int st;                     /* index into st_types */
  json_t *shape;              /* borrowed */
  size_t ndim;
  uint64_t begin, end;
} centry;

/* Parse and check entry `name` of the header: an object with a known "dtype", a "shape" of
   non-negative integers whose product times the element size (overflow-checked) is the length of
   "data_offsets" [begin, end], inside the data section. */
static int entry_parse(const char *path, uint64_t data_size, const char *name, json_t *v,
                       centry *out) {
  if (!json_is_object(v))
    return ck_error(HQ_EPARSE, path, "entry '%.200s' is not a JSON object", name);
  json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
  json_t *offs = json_object_get(v, "data_offsets");
  if (!json_is_string(dt))
    return ck_error(HQ_EPARSE, path, "entry '%.200s': \"dtype\" is missing or not a string",
                    name);
  out->st = st_index(json_string_value(dt));
  if (out->st < 0)
    return ck_error(HQ_EPARSE, path, "entry '%.200s': unknown dtype '%.40s'", name,
                    json_string_value(dt));
  if (!json_is_array(shape))
    return ck_error(HQ_EPARSE, path, "entry '%.200s': \"shape\" is missing or not an array",
                    name);
  if (!json_is_array(offs) || json_array_size(offs) != 2 ||
      !json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)))
    return ck_error(HQ_EPARSE, path, "entry '%.200s': \"data_offsets\" is not an array of two "
                    "integers", name);
  json_int_t b = json_integer_value(json_array_get(offs, 0));
  json_int_t e = json_integer_value(json_array_get(offs, 1));
  if (b < 0 || e < b || (uint64_t)e > data_size)
    return ck_error(HQ_EPARSE, path, "entry '%.200s': data_offsets [%lld, %lld] are not a range "
                    "inside the %llu-byte data section", name, (long long)b, (long long)e,
                    (unsigned long long)data_size);
  size_t nd = json_array_size(shape);
  uint64_t count = 1;
  int zero = 0;
  for (size_t k = 0; k < nd; k++) {
    json_t *x = json_array_get(shape, k);
    if (!json_is_integer(x) || json_integer_value(x) < 0)
      return ck_error(HQ_EPARSE, path, "entry '%.200s': shape dimension %zu is not a "
                      "non-negative integer", name, k);
    zero |= json_integer_value(x) == 0;
  }
  for (size_t k = 0; !zero && k < nd; k++) {
    uint64_t x = (uint64_t)json_integer_value(json_array_get(shape, k));
    if (count > UINT64_MAX / x)
      return ck_error(HQ_EPARSE, path, "entry '%.200s': the shape's element count overflows 64 "
                      "bits", name);
    count *= x;
  }
  if (zero) count = 0;
  uint64_t es = st_types[out->st].size;
  if (count > UINT64_MAX / es || count * es != (uint64_t)(e - b))
    return ck_error(HQ_EPARSE, path, "entry '%.200s': shape of %llu %s elements does not fit its "
                    "%lld bytes [%lld, %lld]", name, (unsigned long long)count,
                    st_types[out->st].name, (long long)(e - b), (long long)b, (long long)e);
  out->shape = shape;
  out->ndim = nd;
  out->begin = (uint64_t)b;
  out->end = (uint64_t)e;
  return HQ_OK;
}

typedef struct range {
  uint64_t begin, end;
  const char *name;
} range;

static int range_cmp(const void *a, const void *b) {
  const range *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

/* Validate the parsed header: an object; "__metadata__" an object of strings; every other key a
   valid entry; the ranges, sorted, tile the data section exactly (no overlap, no hole: the
   safetensors rule). */
static int validate(hq_ckpt *c) {
  if (!json_is_object(c->root))
    return ck_error(HQ_EPARSE, c->path, "the header is not a JSON object");
  size_t n = json_object_size(c->root);
  range *r = hqi_calloc(n, sizeof *r);
  if (!r) return ck_error(HQ_ENOMEM, c->path, "out of memory (%zu entries)", n);
  size_t nr = 0;
  int rc = HQ_OK;
  const char *key;
  json_t *v;
  json_object_foreach(c->root, key, v) {
    if (strcmp(key, "__metadata__") == 0) {
      if (!json_is_object(v)) {
        rc = ck_error(HQ_EPARSE, c->path, "\"__metadata__\" is not a JSON object");
        break;
      }
      const char *mk;
      json_t *mv;
      json_object_foreach(v, mk, mv) {
        if (!json_is_string(mv)) {
          rc = ck_error(HQ_EPARSE, c->path, "\"__metadata__\" value of '%.200s' is not a string",
                        mk);
          break;
        }
      }
      if (rc) break;
      c->meta = v;
      continue;
    }
    centry e;
    if ((rc = entry_parse(c->path, c->data_size, key, v, &e))) break;
    r[nr].begin = e.begin;
    r[nr].end = e.end;
    r[nr].name = key;
    nr++;
  }
  if (!rc) {
    qsort(r, nr, sizeof *r, range_cmp);
    uint64_t at = 0;
    for (size_t i = 0; !rc && i < nr; i++) {
      if (r[i].begin < at)
        rc = ck_error(HQ_EPARSE, c->path, "entries '%.200s' and '%.200s' overlap (bytes [%llu, "
                      "%llu) and [%llu, %llu))", r[i - 1].name, r[i].name,
                      (unsigned long long)r[i - 1].begin, (unsigned long long)r[i - 1].end,
                      (unsigned long long)r[i].begin, (unsigned long long)r[i].end);
      else if (r[i].begin > at)
        rc = ck_error(HQ_EPARSE, c->path, "bytes [%llu, %llu) of the data section belong to no "
                      "entry (a hole before '%.200s')", (unsigned long long)at,
                      (unsigned long long)r[i].begin, r[i].name);
      else
        at = r[i].end;
    }
    if (!rc && at != c->data_size)
      rc = ck_error(HQ_EPARSE, c->path, "the entries cover %llu bytes of the %llu-byte data "
                    "section (truncated entries, or trailing bytes)", (unsigned long long)at,
                    (unsigned long long)c->data_size);
  }
  free(r);
  return rc;
}

void hq_ckpt_close(hq_ckpt *c) {
  if (!c) return;
  if (c->fd >= 0) close(c->fd);
  json_decref(c->root);
  free(c->path);
  free(c);
}

int hq_ckpt_open(const char *path, hq_ckpt **out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_ckpt_open: out is NULL");
  *out = NULL;
  if (!path || !path[0]) return hqi_error(HQ_EINVAL, "hq_ckpt_open: the path is empty");
  hq_ckpt *c = hqi_calloc(1, sizeof *c);
  if (!c) return hqi_error(HQ_ENOMEM, "hq_ckpt_open: out of memory");
  c->fd = -1;
  char *hdr = NULL;
  int rc = HQ_OK;
  c->path = hqi_strdup(path);
  if (!c->path) rc = hqi_error(HQ_ENOMEM, "hq_ckpt_open: out of memory");
  if (!rc) {
    c->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (c->fd < 0)
      rc = ck_error(errno == ENOENT ? HQ_ENOENT : HQ_EIO, path, "cannot open: %s",
                    strerror(errno));
  }
  struct stat st;
  memset(&st, 0, sizeof st);
  if (!rc && fstat(c->fd, &st) != 0)
    rc = ck_error(HQ_EIO, path, "fstat failed: %s", strerror(errno));
  if (!rc && !S_ISREG(st.st_mode)) rc = ck_error(HQ_EIO, path, "not a regular file");
  uint64_t size = rc ? 0 : (uint64_t)st.st_size, hlen = 0;
  if (!rc && size < 8)
    rc = ck_error(HQ_EPARSE, path, "the file is %llu bytes long, shorter than the 8-byte header "
                  "length (truncated, or not a safetensors file)", (unsigned long long)size);
  if (!rc) {
    unsigned char n8[8];
    rc = pread_all(c->fd, n8, 8, 0, path);
    for (int k = 0; !rc && k < 8; k++) hlen |= (uint64_t)n8[k] << (8 * k);
  }
  if (!rc && hlen > CK_MAX_HEADER)
    rc = ck_error(HQ_EPARSE, path, "the header length is %llu bytes, more than the %llu a "
                  "safetensors header may have (not a safetensors file?)",
                  (unsigned long long)hlen, (unsigned long long)CK_MAX_HEADER);
  if (!rc && hlen > size - 8)
    rc = ck_error(HQ_EPARSE, path, "the header length is %llu bytes but the file has only %llu "
                  "after it (truncated?)", (unsigned long long)hlen,
                  (unsigned long long)(size - 8));
  if (!rc) {
    hdr = hqi_malloc((size_t)hlen + 1);
    if (!hdr) rc = ck_error(HQ_ENOMEM, path, "out of memory (%llu bytes of header)",
                            (unsigned long long)hlen);
  }
  if (!rc) rc = pread_all(c->fd, hdr, (size_t)hlen, 8, path);
  if (!rc) {
    const char *nul = memchr(hdr, '\0', (size_t)hlen);
    if (nul)
      rc = ck_error(HQ_EPARSE, path, "the JSON header holds a NUL byte (header byte %zu)",
                    (size_t)(nul - hdr));
  }
  if (!rc) {
    json_error_t err;
    rc = parse_json(hdr, (size_t)hlen, &c->root, &err);
    if (rc == HQ_ENOMEM)
      rc = ck_error(HQ_ENOMEM, path, "out of memory while parsing the JSON header");
    else if (rc)
      rc = ck_error(HQ_EPARSE, path, "the JSON header is malformed: %s (line %d, column %d, "
                    "header byte %d)", err.text, err.line, err.column, err.position);
  }
  free(hdr);
  if (!rc) {
    c->data_start = 8 + hlen;
    c->data_size = size - 8 - hlen;
    rc = validate(c);
  }
  if (rc) {
    hq_ckpt_close(c);
    return rc;
  }
  *out = c;
  return HQ_OK;
}

const char *hq_ckpt_meta(const hq_ckpt *c, const char *key) {
  if (!c || !key || !c->meta) return NULL;
  return json_string_value(json_object_get(c->meta, key));
}

/* The header entry `name` (not "__metadata__"), parsed; HQ_ENOENT when absent. */
static int find_entry(const hq_ckpt *c, const char *name, centry *out) {
  json_t *v = strcmp(name, "__metadata__") ? json_object_get(c->root, name) : NULL;
  if (!v) return HQ_ENOENT;
  return entry_parse(c->path, c->data_size, name, v, out);
}

/* Copy `bytes` bytes of the data section at `off` into dst on ctx's device. */
static int read_into(hq_ckpt *c, hq_ctx *ctx, void *dst, int device, uint64_t off, size_t bytes) {
  if (!bytes) return HQ_OK;
  if (device < 0) return pread_all(c->fd, dst, bytes, c->data_start + off, c->path);
  size_t chunk = bytes < CK_STAGE_BYTES ? bytes : CK_STAGE_BYTES;
  char *stage = hqi_malloc(chunk);
  if (!stage) return ck_error(HQ_ENOMEM, c->path, "out of memory (%zu bytes of staging)", chunk);
  int rc = HQ_OK;
  for (size_t done = 0; !rc && done < bytes; done += chunk) {
    size_t n = bytes - done < chunk ? bytes - done : chunk;
    rc = pread_all(c->fd, stage, n, c->data_start + off + done, c->path);
    if (!rc) rc = hq_ctx_memcpy(ctx, (char *)dst + done, device, stage, HQ_DEVICE_HOST, n);
    if (!rc) rc = hq_ctx_sync(ctx); /* the staging buffer is reused */
  }
  free(stage);
  return rc;
}

static int shape_equal(json_t *shape, int ndim, const int64_t *dims) {
  if (json_array_size(shape) != (size_t)ndim) return 0;
  for (int k = 0; k < ndim; k++) {
    json_t *x = json_array_get(shape, (size_t)k);
    if (!json_is_integer(x) || json_integer_value(x) != (json_int_t)dims[k]) return 0;
  }
  return 1;
}

/* "[a, b, ...]" of a JSON shape (integers checked by the caller) into buf. */
static const char *shape_text(json_t *shape, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  at += (size_t)snprintf(buf, len, "[");
  for (size_t k = 0; k < json_array_size(shape) && at < len; k++)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", k ? ", " : "",
                           (long long)json_integer_value(json_array_get(shape, k)));
  if (at < len) snprintf(buf + at, len - at, "]");
  return buf;
}
static const char *dims_text(int ndim, const int64_t *d, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int k = 0; k < ndim && at < len; k++)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", k ? ", " : "", (long long)d[k]);
  if (at < len) snprintf(buf + at, len - at, "]");
  return buf;
}

int hq_ckpt_load_tensor(hq_ckpt *c, hq_ctx *ctx, const char *name, hq_tensor *tp) {
  if (!c || !ctx || !name) return hqi_error(HQ_EINVAL, "hq_ckpt_load_tensor: NULL argument");
  hq_tensor t;
  char what[300];
  snprintf(what, sizeof what, "hq_ckpt_load_tensor '%.200s'", name);
  int rc = hqi_tensor_in(tp, what, &t);
  if (rc) return rc;
  if (t.device != ctx->device && t.device != HQ_DEVICE_HOST)
    return ck_error(HQ_EINVAL, c->path, "%s: the tensor is on device %d, the context runs on %d "
                    "(a tensor is on the context's device or on the host)", what, t.device,
                    ctx->device);
  centry e;
  rc = find_entry(c, name, &e);
  if (rc == HQ_ENOENT) {
    char *key = hqi_asprintf("%s/hq", name);
    if (!key) return hqi_error(HQ_ENOMEM, "hq_ckpt_load_tensor: out of memory");
    int quant = hq_ckpt_meta(c, key) != NULL;
    free(key);
    return ck_error(quant ? HQ_EINVAL : HQ_ENOENT, c->path, "%s: %s", what,
                    quant ? "it is a quantized tensor (load it with hq_ckpt_load_qtensor)"
                          : "no such tensor");
  }
  if (rc) return rc;
  const int64_t dims[2] = {t.rows, t.cols};
  char a[200], b[200];
  if (st_types[e.st].hq != t.dtype || !shape_equal(e.shape, 2, dims))
    return ck_error(HQ_EINVAL, c->path, "%s: the checkpoint holds %s %s, the destination is %s "
                    "%s", what, st_types[e.st].name, shape_text(e.shape, a, sizeof a),
                    st_name_of(t.dtype), dims_text(2, dims, b, sizeof b));
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  rc = read_into(c, ctx, t.data, t.device, e.begin, (size_t)(e.end - e.begin));
  hqi_device_leave(saved);
  if (rc) return hqi_error_prefix(rc, "%s", what);
  return HQ_OK;
}

// --- loading a quantized tensor ---------------------------------------------------------------

/* The parsed "<name>/hq" metadata of one buffer. */
typedef struct mbuf {
  const char *entry, *name;
  uint32_t dir;
  hq_dtype dtype;
  int ndim;
  int64_t shape[HQ_MAX_BUFFER_DIMS];
  centry ce;                  /* its safetensors entry */
} mbuf;

typedef struct loadctx {
  hq_ckpt *c;
  const char *name;
  const char *mkey;           /* "<name>/hq" */
} loadctx;

static int meta_error(const loadctx *L, const char *fmt, ...) HQ_PRINTF(2, 3);
static int meta_error(const loadctx *L, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ck_error(HQ_EPARSE, L->c->path, "tensor '%.200s': metadata \"%.200s\" %s", L->name,
                  L->mkey, msg);
}

static int mget_str(const loadctx *L, json_t *o, const char *key, const char *where,
                    const char **out) {
  json_t *v = json_object_get(o, key);
  if (!json_is_string(v)) return meta_error(L, "%s: \"%s\" is missing or not a string", where, key);
  *out = json_string_value(v);
  return HQ_OK;
}
static int mget_int(const loadctx *L, json_t *o, const char *key, int64_t *out) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v)) return meta_error(L, "\"%s\" is missing or not an integer", key);
  *out = (int64_t)json_integer_value(v);
  return HQ_OK;
}
/* A list of direction names -> mask. */
static int mget_dirs(const loadctx *L, json_t *o, const char *key, uint32_t *out) {
  json_t *v = json_object_get(o, key);
  *out = 0;
  if (!json_is_array(v)) return meta_error(L, "\"%s\" is missing or not an array", key);
  for (size_t i = 0; i < json_array_size(v); i++) {
    const char *s = json_string_value(json_array_get(v, i));
    uint32_t d = !s ? 0 : !strcmp(s, "rowwise") ? HQ_ROWWISE : !strcmp(s, "columnwise") ? HQ_COLWISE : 0;
    if (!d || (*out & d)) return meta_error(L, "\"%s\" item %zu is not a new 'rowwise' or "
                                            "'columnwise'", key, i);
    *out |= d;
  }
  return HQ_OK;
}
static const char *dirs_text(uint32_t d) {
  return d == HQ_BOTH ? "rowwise+columnwise" : d == HQ_ROWWISE ? "rowwise"
                                             : d == HQ_COLWISE ? "columnwise" : "none";
}

/* Check direction d's format record against qt's format (plugin name and options). */
static int check_format(const loadctx *L, json_t *formats, hq_qtensor *qt, int d) {
  const char *dn = d ? "columnwise" : "rowwise";
  json_t *f = json_object_get(formats, dn);
  if (!json_is_object(f)) return meta_error(L, "\"formats\" has no \"%s\" object", dn);
  const char *plugin = NULL, *fname = NULL;
  int rc = mget_str(L, f, "plugin", dn, &plugin);
  if (!rc) rc = mget_str(L, f, "format", dn, &fname);
  if (rc) return rc;
  json_t *opts = json_object_get(f, "options");
  if (!json_is_array(opts)) return meta_error(L, "%s: \"options\" is missing or not an array", dn);
  const hqi_format *qf = qt->fmt[d];
  if (strcmp(plugin, qf->plugin->ops.name) != 0)
    return ck_error(HQ_EINVAL, L->c->path, "tensor '%.200s': the %s direction was saved with "
                    "plugin '%.60s' (format '%.60s'), the qtensor's is plugin '%.60s' (format "
                    "'%.60s')", L->name, dn, plugin, fname, qf->plugin->ops.name, qf->name);
  size_t n = json_array_size(opts);
  for (size_t i = 0; i < n; i++)
    if (!json_is_string(json_array_get(opts, i)))
      return meta_error(L, "%s: option %zu is not a string", dn, i);
  for (size_t i = 0; i < n || i < qf->plugin->n_options; i++) {
    const char *saved = i < n ? json_string_value(json_array_get(opts, i)) : NULL;
    char *mine = i < qf->plugin->n_options ? option_text(qf, i) : NULL;
    if (i < qf->plugin->n_options && !mine)
      return hqi_error(HQ_ENOMEM, "hq_ckpt_load_qtensor: out of memory");
    int same = saved && mine && strcmp(saved, mine) == 0;
    if (!same) {
      const char *key = mine ? qf->plugin->ops.options[i].name : NULL;
      rc = ck_error(HQ_EINVAL, L->c->path, "tensor '%.200s': %s option %zu%s%s%s differs: "
                    "checkpoint '%.150s', qtensor '%.150s' (plugin %s)", L->name, dn, i,
                    key ? " ('" : "", key ? key : "", key ? "')" : "",
                    saved ? saved : "(none)", mine ? mine : "(none)", plugin);
      free(mine);
      return rc;
    }
    free(mine);
  }
  return HQ_OK;
}

/* Parse the "buffers" list and check every record against its safetensors entry. */
static int parse_buffers(const loadctx *L, json_t *list, mbuf **out, size_t *nout) {
  if (!json_is_array(list)) return meta_error(L, "\"buffers\" is missing or not an array");
  size_t n = json_array_size(list);
  if (n > 2 * HQ_MAX_BUFFERS) return meta_error(L, "lists %zu buffers (at most %d)", n,
                                                2 * HQ_MAX_BUFFERS);
  mbuf *m = hqi_calloc(n, sizeof *m);
  if (!m) return hqi_error(HQ_ENOMEM, "hq_ckpt_load_qtensor: out of memory");
  int rc = HQ_OK;
  for (size_t i = 0; !rc && i < n; i++) {
    json_t *o = json_array_get(list, i);
    char where[40];
    snprintf(where, sizeof where, "buffer %zu", i);
    if (!json_is_object(o)) {
      rc = meta_error(L, "%s is not an object", where);
      break;
    }
    const char *dir = NULL, *dtype = NULL;
    rc = mget_str(L, o, "entry", where, &m[i].entry);
    if (!rc) rc = mget_str(L, o, "name", where, &m[i].name);
    if (!rc) rc = mget_str(L, o, "direction", where, &dir);
    if (!rc) rc = mget_str(L, o, "dtype", where, &dtype);
    if (rc) break;
    m[i].dir = !strcmp(dir, "rowwise") ? HQ_ROWWISE : !strcmp(dir, "columnwise") ? HQ_COLWISE : 0;
    m[i].dtype = hq_dtype_from_name(dtype);
    json_t *shape = json_object_get(o, "shape");
    size_t nd = json_array_size(shape);
    if (!m[i].dir || !m[i].dtype || !json_is_array(shape) || nd < 1 || nd > HQ_MAX_BUFFER_DIMS) {
      rc = meta_error(L, "%s ('%.60s'): bad direction, dtype or shape", where, m[i].name);
      break;
    }
    m[i].ndim = (int)nd;
    for (size_t k = 0; k < nd; k++) {
      json_t *x = json_array_get(shape, k);
      if (!json_is_integer(x) || json_integer_value(x) < 0) {
        rc = meta_error(L, "%s ('%.60s'): shape dimension %zu is not a non-negative integer",
                        where, m[i].name, k);
        break;
      }
      m[i].shape[k] = (int64_t)json_integer_value(x);
    }
    if (rc) break;
    int fr = find_entry(L->c, m[i].entry, &m[i].ce);
    if (fr == HQ_ENOENT)
      rc = ck_error(HQ_EPARSE, L->c->path, "tensor '%.200s': buffer '%.60s' is stored under "
                    "entry '%.200s', which the file does not have", L->name, m[i].name,
                    m[i].entry);
    else if (fr)
      rc = fr;
    else if (strcmp(st_types[m[i].ce.st].name, st_name_of(m[i].dtype) ? st_name_of(m[i].dtype)
                                                                      : "") != 0 ||
             !shape_equal(m[i].ce.shape, m[i].ndim, m[i].shape)) {
      char a[200], b[200];
      rc = ck_error(HQ_EPARSE, L->c->path, "tensor '%.200s': buffer '%.60s' (%s %s) does not match "
                    "its entry '%.200s' (%s %s)", L->name, m[i].name, hq_dtype_name(m[i].dtype),
                    dims_text(m[i].ndim, m[i].shape, a, sizeof a), m[i].entry,
                    st_types[m[i].ce.st].name, shape_text(m[i].ce.shape, b, sizeof b));
    }
  }
  if (rc) {
    free(m);
    return rc;
  }
  *out = m;
  *nout = n;
  return HQ_OK;
}

/* "columnwise_<x>" for a columnwise buffer named x (a shared one keeps the rowwise name): the
   name the buffer has when the columnwise storage owns it. */
static void own_name(uint32_t dir, const char *name, char *buf, size_t len) {
  if (dir == HQ_COLWISE && strncmp(name, "columnwise_", 11) != 0)
    snprintf(buf, len, "columnwise_%s", name);
  else
    snprintf(buf, len, "%s", name);
}

int hq_ckpt_load_qtensor(hq_ckpt *c, hq_ctx *ctx, const char *name, hq_qtensor *qt) {
  if (!c || !ctx || !name || !qt) return hqi_error(HQ_EINVAL, "hq_ckpt_load_qtensor: NULL argument");
  if (qt->saved)
    return ck_error(HQ_ESTATE, c->path, "hq_ckpt_load_qtensor '%.200s': role %.200s is saved "
                    "(hq_qtensor_save): restore it first", name, qt->role);
  if (ctx->device != qt->ctx->device)
    return ck_error(HQ_EINVAL, c->path, "hq_ckpt_load_qtensor '%.200s': the context runs on "
                    "device %d, the tensor lives on %d", name, ctx->device, qt->ctx->device);
  char *mkey = hqi_asprintf("%s/hq", name);
  if (!mkey) return hqi_error(HQ_ENOMEM, "hq_ckpt_load_qtensor: out of memory");
  loadctx L = {c, name, mkey};
  json_t *m = NULL;
  mbuf *bufs = NULL;
  size_t nbufs = 0;
  void *fresh[HQ_MAX_BUFFERS] = {0};   /* private columnwise copies to make */
  int rc = HQ_OK;
  const char *text = hq_ckpt_meta(c, mkey);
  if (!text) {
    centry e;
    int plain = find_entry(c, name, &e) == HQ_OK;
    rc = ck_error(plain ? HQ_EINVAL : HQ_ENOENT, c->path, "hq_ckpt_load_qtensor '%.200s': %s",
                  name, plain ? "an entry of the file, but not a quantized tensor (no \"<name>/hq\" "
                                "metadata): a plain tensor (hq_ckpt_load_tensor loads it) or one "
                                "buffer of a quantized tensor"
                              : "no quantized tensor of that name (no \"<name>/hq\" metadata)");
    goto done;
  }
  json_error_t err;
  rc = parse_json(text, strlen(text), &m, &err);
  if (rc) {
    rc = rc == HQ_ENOMEM ? hqi_error(HQ_ENOMEM, "hq_ckpt_load_qtensor: out of memory (metadata)")
                         : meta_error(&L, "is not valid JSON: %s", err.text);
    goto done;
  }
  if (!json_is_object(m)) {
    rc = meta_error(&L, "is not a JSON object");
    goto done;
  }
  int64_t version = 0, rows = 0, cols = 0;
  uint32_t dirs = 0;
  const char *source = NULL;
  if ((rc = mget_int(&L, m, "hq_checkpoint", &version))) goto done;
  if (version != CK_META_VERSION) {
    rc = ck_error(HQ_ENOTSUP, c->path, "tensor '%.200s': metadata version %lld (this hq reads "
                  "version %d)", name, (long long)version, CK_META_VERSION);
    goto done;
  }
  if ((rc = mget_int(&L, m, "rows", &rows)) || (rc = mget_int(&L, m, "cols", &cols)) ||
      (rc = mget_dirs(&L, m, "directions", &dirs)) ||
      (rc = mget_str(&L, m, "columnwise_source", "top level", &source)))
    goto done;
  /* the checks against the qtensor: shape, directions, source, formats, buffers */
  if (rows != qt->rows || cols != qt->cols) {
    rc = ck_error(HQ_EINVAL, c->path, "tensor '%.200s': shape differs: checkpoint [%lld, %lld], "
                  "qtensor [%lld, %lld]", name, (long long)rows, (long long)cols,
                  (long long)qt->rows, (long long)qt->cols);
    goto done;
  }
  uint32_t have = hq_qtensor_dirs(qt);
  if (dirs != have) {
    rc = ck_error(HQ_EINVAL, c->path, "tensor '%.200s': directions differ: checkpoint %s, qtensor "
                  "%s (make the qtensor with the saved usage)", name, dirs_text(dirs),
                  dirs_text(have));
    goto done;
  }
  const char *mysource = qt->source == HQ_SOURCE_ROWWISE_DEQUANTIZED ? "rowwise_dequantized"
                                                                     : "original";
  if ((dirs & HQ_COLWISE) && strcmp(source, mysource) != 0) {
    rc = ck_error(HQ_EINVAL, c->path, "tensor '%.200s': columnwise_source differs: checkpoint "
                  "'%.40s', qtensor '%s'", name, source, mysource);
    goto done;
  }
  json_t *formats = json_object_get(m, "formats");
  if (!json_is_object(formats)) {
    rc = meta_error(&L, "\"formats\" is missing or not an object");
    goto done;
  }
  for (int d = 0; d < 2; d++)
    if (qt->d[d].present && (rc = check_format(&L, formats, qt, d))) goto done;
  if ((rc = parse_buffers(&L, json_object_get(m, "buffers"), &bufs, &nbufs))) goto done;
  /* match the records, per direction in order, with the qtensor's buffers */
  const mbuf *rec[2][HQ_MAX_BUFFERS];
  uint32_t nrec[2] = {0, 0};
  for (size_t i = 0; i < nbufs; i++) {
    int d = bufs[i].dir == HQ_COLWISE;
    if (!qt->d[d].present || nrec[d] >= qt->d[d].st.nbuf) {
      rc = ck_error(HQ_EINVAL, c->path, "tensor '%.200s': the checkpoint has more %s buffers than "
                    "the qtensor's %u (at '%.60s')", name, dir_name(bufs[i].dir),
                    qt->d[d].present ? qt->d[d].st.nbuf : 0u, bufs[i].name);
      goto done;
    }
    rec[d][nrec[d]++] = &bufs[i];
  }
  for (int d = 0; d < 2; d++) {
    const hqi_qdir *q = &qt->d[d];
    if (!q->present) continue;
    if (nrec[d] != q->st.nbuf) {
      rc = ck_error(HQ_EINVAL, c->path, "tensor '%.200s': the checkpoint has %u %s buffers, the "
                    "qtensor %u (first missing: '%s')", name, nrec[d], dir_name(q->st.dir),
                    q->st.nbuf, hq_storage_cbuf(&q->st, nrec[d])->name);
      goto done;
    }
    for (uint32_t i = 0; i < q->st.nbuf; i++) {
      const hq_buffer *b = hq_storage_cbuf(&q->st, i);
      const mbuf *r = rec[d][i];
      char na[64], nb[64], sa[200], sb[200];
      own_name(q->st.dir, r->name, na, sizeof na);
      own_name(q->st.dir, b->name, nb, sizeof nb);
      size_t es = hq_dtype_size(r->dtype), bytes = es;
      for (int k = 0; k < r->ndim; k++) {
        size_t x = (size_t)r->shape[k];
        bytes = x && bytes > SIZE_MAX / x ? SIZE_MAX : bytes * x;
      }
      if (strcmp(na, nb) != 0)
        rc = ck_error(HQ_EINVAL, c->path, "tensor '%.200s': %s buffer %u differs: checkpoint "
                      "'%.60s', qtensor '%s'", name, dir_name(q->st.dir), i, r->name, b->name);
      else if (r->dtype != b->dtype)
        rc = ck_error(HQ_EINVAL, c->path, "tensor '%.200s': buffer '%s' (%s) dtype differs: "
                      "checkpoint %s, qtensor %s", name, b->name, dir_name(q->st.dir),
                      hq_dtype_name(r->dtype), hq_dtype_name(b->dtype));
      else if (r->ndim != b->ndim || memcmp(r->shape, b->shape, (size_t)b->ndim * sizeof(int64_t)) ||
               bytes != b->bytes)
        rc = ck_error(HQ_EINVAL, c->path, "tensor '%.200s': buffer '%s' (%s) differs in size: "
                      "checkpoint %s %s (%zu bytes), qtensor %s %s (%zu bytes)", name, b->name,
                      dir_name(q->st.dir), hq_dtype_name(r->dtype),
                      dims_text(r->ndim, r->shape, sa, sizeof sa), bytes,
                      hq_dtype_name(b->dtype), dims_text(b->ndim, b->shape, sb, sizeof sb),
                      b->bytes);
      if (rc) goto done;
    }
  }
  /* A columnwise buffer the qtensor shares with its rowwise storage, saved as a copy of its own
     (the saved tensor had refreshed one direction alone): the qtensor gets a private buffer,
     allocated here before anything is written (as hq_qtensor_update would make it). */
  hqi_qdir *col = &qt->d[1];
  for (uint32_t i = 0; col->present && qt->d[0].present && i < col->st.nbuf; i++) {
    if (col->owned[i]) continue;
    const hq_buffer *b = hq_storage_cbuf(&col->st, i);
    if (b->shared_with < 0 || (uint32_t)b->shared_with >= nrec[0]) {
      rc = hqi_error(HQ_EINTERNAL, "hq_ckpt_load_qtensor: shared buffer '%s' points nowhere",
                     b->name);
      goto done;
    }
    if (strcmp(rec[1][i]->entry, rec[0][b->shared_with]->entry) == 0) continue;
    fresh[i] = hqi_ctx_alloc_raw(qt->ctx, b->bytes ? b->bytes : 1);
    if (!fresh[i]) {
      rc = ck_error(HQ_ENOMEM, c->path, "tensor '%.200s': out of memory: %zu bytes on device %d "
                    "for a private columnwise copy of '%s'", name, b->bytes, qt->ctx->device,
                    b->name);
      goto done;
    }
  }
  /* every check passed: link the private copies, then read */
  for (uint32_t i = 0; i < HQ_MAX_BUFFERS; i++) {
    if (!fresh[i]) continue;
    hq_buffer *b = HQ_STORAGE_BUF(&col->st, i);
    snprintf(col->own_name[i], sizeof col->own_name[i], "columnwise_%s", b->name);
    b->name = col->own_name[i];
    b->ptr = fresh[i];
    col->owned[i] = 1;
    fresh[i] = NULL;
  }
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) goto done;
  for (int d = 0; !rc && d < 2; d++) {
    const hqi_qdir *q = &qt->d[d];
    for (uint32_t i = 0; !rc && q->present && i < q->st.nbuf; i++) {
      if (!q->owned[i]) continue;
      const hq_buffer *b = hq_storage_cbuf(&q->st, i);
      const mbuf *r = rec[d][i];
      rc = read_into(c, ctx, b->ptr, q->st.device, r->ce.begin, b->bytes);
      if (rc)
        hqi_error_prefix(rc, "hq_ckpt_load_qtensor '%.200s': buffer '%s' (the qtensor's contents "
                         "are now undefined)", name, b->name);
    }
  }
  hqi_device_leave(saved);
done:
  for (uint32_t i = 0; i < HQ_MAX_BUFFERS; i++)
    if (fresh[i]) hqi_ctx_free_raw(qt->ctx, fresh[i]);
  free(bufs);
  json_decref(m);
  free(mkey);
  return rc;
}

#endif /* HQ_HAVE_JANSSON */
