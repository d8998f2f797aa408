/*
** ckpt_write.c -- the checkpoint writer: tensor names and metadata keys (their rules, and the
** sets that keep them unique and unnested), host snapshots of every tensor added (each hashed
** as it is taken), and the file written at close.
**
** The writer copies every tensor to the host when it is added (a snapshot; device buffers through
** hq_ctx_memcpy + hq_ctx_sync) and writes the file at close, to a temporary file of its own
** ("<path>.tmp.<pid>.<random>.<host>", created with O_EXCL) renamed over <path>, then fsyncs the
** directory; <path> is the file its symbolic links name, and only a regular or new file is
** replaced (resolve_target). Entries:
**   "<name>"                 a plain tensor (F32, F16, BF16) [rows, cols]
**   "<name>/<buffer name>"   one buffer a qtensor's storage owns ("fc1/data", ...)
** and "__metadata__" (string -> string): "hq_header_xxh3_64" (first), "hq_version",
** "<name>/hq" (ckpt_meta.c), the caller's keys, and "<entry>/xxh3_64" per entry.
*/
#include "config.h"
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The rule for tensor names (docs/checkpoints.md): 1 to CK_MAX_NAME bytes of UTF-8, no control
   characters, no '/' at either end and no empty path component ("a//b"), not "__metadata__". */
static int check_name(const char *name, const char *what) {
  if (!name || !name[0]) return hq_set_error(HQ_EINVAL, "%s: the tensor name is empty", what);
  size_t n = strlen(name);
  if (n > CK_MAX_NAME)
    return hq_set_error(HQ_EINVAL, "%s: the tensor name '%.40s...' is %zu bytes long (at most %d)",
                        what, name, n, CK_MAX_NAME);
  if (!ck_utf8_valid(name))
    return hq_set_error(HQ_EINVAL, "%s: the tensor name '%.200s' is not valid UTF-8", what, name);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)name[i] < 0x20 || name[i] == 0x7F)
      return hq_set_error(HQ_EINVAL, "%s: the tensor name '%.200s' holds a control character (byte "
                          "%zu)", what, name, i);
  if (name[0] == '/' || name[n - 1] == '/' || strstr(name, "//"))
    return hq_set_error(HQ_EINVAL, "%s: the tensor name '%.200s' starts or ends with '/' or holds "
                        "'//' (names are '/'-separated paths of non-empty parts)", what, name);
  if (strcmp(name, "__metadata__") == 0)
    return hq_set_error(HQ_EINVAL, "%s: '__metadata__' is reserved by safetensors", what);
  return HQ_OK;
}

typedef struct wentry {
  char *name;                 /* safetensors key */
  const char *st_dtype;
  int ndim;
  int64_t shape[HQ_MAX_BUFFER_DIMS];
  size_t bytes;
  void *data;                 /* host copy (malloc) */
  XXH64_hash_t sum;           /* of data, taken with the copy */
} wentry;

struct hq_ckpt_writer {
  char *path, *tmp;           /* path as given (messages name it) */
  char *target;               /* the file written: path, or where its symbolic links end */
  char *dir;                  /* target's directory, fsynced after the rename */
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
    return hq_set_error(HQ_EINTERNAL, "checkpoint writer: too many keys in one call");
  char *k = strdup(key);
  if (!k || json_object_set_new(set, key, json_true()) != 0) {
    free(k);
    return hq_set_error(HQ_ENOMEM, "checkpoint writer: out of memory (name set)");
  }
  u->set[u->n] = set;
  u->key[u->n++] = k;
  return HQ_OK;
}

/* The proper '/'-prefixes of s, each passed to fn (stops at the first failure). */
static int each_prefix(const char *s, int (*fn)(void *arg, const char *prefix), void *arg) {
  size_t n = strlen(s);
  char *buf = malloc(n + 1);
  if (!buf) return hq_set_error(HQ_ENOMEM, "checkpoint writer: out of memory");
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

// --- temporary files --------------------------------------------------------------------------

/* This host's name as temporary names carry it: letters, digits, '-' and '_' (anything else
   '_'), at most 32 bytes: a directory shared by several hosts (NFS) holds temporary files of
   processes this host cannot see, and only its own are ever judged stale. */
static void host_tag(char *buf, size_t len) {
  char h[256];
  if (gethostname(h, sizeof h) != 0 || !h[0]) snprintf(h, sizeof h, "localhost");
  h[sizeof h - 1] = '\0';
  size_t i = 0;
  for (; h[i] && i < 32 && i + 1 < len; i++) {
    char ch = h[i];
    buf[i] = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                     ch == '-' ? ch : '_';
  }
  buf[i] = '\0';
}

/* The directory of path (a new string: "." for a bare name) and where its last part starts. */
static char *dir_of(const char *path, const char **base) {
  const char *slash = strrchr(path, '/');
  *base = slash ? slash + 1 : path;
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  char *d = malloc((size_t)(slash - path) + 1);
  if (d) {
    memcpy(d, path, (size_t)(slash - path));
    d[slash - path] = '\0';
  }
  return d;
}

/* The file a save to `path` replaces (a new string into *out): hq_output_target's rule, its
   refusal named as the checkpoint's. */
static int resolve_target(const char *path, char **out) {
  const int rc = hq_output_target(path, out);
  return rc ? ck_error(rc, path, "%s", hq_last_error()) : HQ_OK;
}

/* Whether directory entry `name` is a temporary file of a save to `base` by a process of this
   host (`host`) that no longer exists: "<base>.tmp.<pid>.<8 hex>.<host>". A pid that exists, or
   that this process may not signal (EPERM: it exists), keeps its file. */
static int stale_temporary(const char *name, const char *base, const char *host) {
  const size_t nb = strlen(base);
  if (strncmp(name, base, nb) != 0 || strncmp(name + nb, ".tmp.", 5) != 0) return 0;
  const char *p = name + nb + 5;
  char *end;
  errno = 0;
  long pid = strtol(p, &end, 10);
  if (end == p || *p < '1' || *p > '9' || errno || pid <= 0 || (pid_t)pid != pid || *end != '.')
    return 0;
  p = end + 1;
  for (int i = 0; i < 8; i++, p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
  if (*p != '.' || strcmp(p + 1, host) != 0) return 0;
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Remove the stale temporary files of saves to `base` in `dir` (stale_temporary). Best effort:
   a directory that cannot be listed (but for want of memory) or a file that cannot be removed
   stays as it is, and the save goes on. */
static int remove_stale(const char *path, const char *dir, const char *base, const char *host) {
  DIR *d = opendir(dir);
  if (!d && errno == ENOMEM)
    return ck_error(HQ_ENOMEM, path, "out of memory (listing %.300s)", dir);
  if (!d) return HQ_OK;
  struct dirent *e;
  while ((e = readdir(d)))
    if (stale_temporary(e->d_name, base, host)) unlinkat(dirfd(d), e->d_name, 0);
  closedir(d);
  return HQ_OK;
}

/* Create w->tmp, a new name of the form stale_temporary reads, exclusively (O_EXCL: never a file
   another writer or process has open). */
static int create_temporary(hq_ckpt_writer *w, const char *host) {
  static unsigned long counter;
  for (int attempt = 0; attempt < 64; attempt++) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const unsigned long k = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
    const uint64_t seed[5] = {(uint64_t)getpid(), (uint64_t)k, (uint64_t)ts.tv_sec,
                              (uint64_t)ts.tv_nsec, (uint64_t)(uintptr_t)w};
    const XXH64_hash_t r = XXH3_64bits(seed, sizeof seed);
    char suffix[96];
    snprintf(suffix, sizeof suffix, "%ld.%08lx.%s", (long)getpid(),
             (unsigned long)(r & 0xffffffffu), host);
    free(w->tmp);
    w->tmp = hqt_join(w->target, ".tmp.", suffix);
    if (!w->tmp) return hq_set_error(HQ_ENOMEM, "hq_ckpt_writer_open: out of memory");
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (w->fd >= 0) return HQ_OK;
    if (errno != EEXIST) break;
  }
  return ck_error(HQ_EIO, w->path, "cannot create the temporary file %.300s: %s", w->tmp,
                  strerror(errno));
}

int hq_ckpt_writer_open(const char *path, hq_ckpt_writer **out) {
  if (!out) return hq_set_error(HQ_EINVAL, "hq_ckpt_writer_open: out is NULL");
  *out = NULL;
  if (!path || !path[0]) return hq_set_error(HQ_EINVAL, "hq_ckpt_writer_open: the path is empty");
  hq_ckpt_writer *w = calloc(1, sizeof *w);
  if (!w) return hq_set_error(HQ_ENOMEM, "hq_ckpt_writer_open: out of memory");
  w->fd = -1;
  w->path = strdup(path);
  w->meta = json_object();
  w->names = json_object();
  w->prefixes = json_object();
  const char *base = NULL;
  int rc = w->path ? resolve_target(path, &w->target) : HQ_OK;
  char *dir = w->dir = w->target ? dir_of(w->target, &base) : NULL;
  /* the header's checksum first: its place in the text is fixed (CK_SUM_PREFIX); its digits are
     written at close */
  if (!rc && (!w->path || !dir || !w->meta || !w->names || !w->prefixes ||
              json_object_set_new(w->meta, CK_SUM_HEADER_KEY,
                                  json_string("0000000000000000")) != 0 ||
              json_object_set_new(w->meta, "hq_version", json_string(hq_version())) != 0))
    rc = hq_set_error(HQ_ENOMEM, "hq_ckpt_writer_open: out of memory");
  if (!rc) {
    char host[40];
    host_tag(host, sizeof host);
    rc = remove_stale(path, dir, base, host);
    if (!rc) rc = create_temporary(w, host);
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
  free(w->target);
  free(w->tmp);
  free(w->dir);
  free(w);
}

/* Room for `more` entries (allocated up front: appending cannot fail later). */
static int reserve_entries(hq_ckpt_writer *w, size_t more) {
  if (w->n + more <= w->cap) return HQ_OK;
  size_t cap = w->cap ? w->cap : 16;
  while (cap < w->n + more) {
    if (cap > SIZE_MAX / 2 / sizeof *w->e)
      return hq_set_error(HQ_ENOMEM, "checkpoint writer: out of memory (entry list)");
    cap *= 2;
  }
  wentry *e = malloc(cap * sizeof *e);
  if (!e) return hq_set_error(HQ_ENOMEM, "checkpoint writer: out of memory (%zu entries)", cap);
  if (w->n) memcpy(e, w->e, w->n * sizeof *e);
  free(w->e);
  w->e = e;
  w->cap = cap;
  return HQ_OK;
}

/* A host snapshot of `bytes` bytes at ptr on ctx's device (not yet synchronized). */
static int snapshot(hq_ckpt_writer *w, hq_ctx *ctx, const void *ptr, int device, size_t bytes,
                    const char *entry, void **out) {
  *out = malloc(bytes ? bytes : 1);
  if (!*out)
    return ck_error(HQ_ENOMEM, w->path, "out of memory: %zu bytes for a host copy of '%.200s'",
                    bytes, entry);
  int rc = bytes ? hq_ctx_memcpy(ctx, *out, HQ_DEVICE_HOST, ptr, device, bytes) : HQ_OK;
  if (rc) {
    free(*out);
    *out = NULL;
    return hqt_error_prefix(rc, "checkpoint %.200s: copying '%.200s' to the host", w->path,
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

static void free_new(wentry *e, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(e[i].name);
    free(e[i].data);
  }
}

int hq_ckpt_add_qtensor(hq_ckpt_writer *w, hq_ctx *ctx, const char *name, const hq_qtensor *qt) {
  if (!w || !ctx || !qt) return hq_set_error(HQ_EINVAL, "hq_ckpt_add_qtensor: NULL argument");
  int rc = check_name(name, "hq_ckpt_add_qtensor");
  if (!rc) rc = ck_qtensor_usable(w->path, "hq_ckpt_add_qtensor", name, ctx, qt);
  if (rc) return rc;
  char *meta = NULL, *key = NULL;
  wentry fresh[2 * HQ_MAX_BUFFERS];
  size_t nf = 0;
  uint64_t total = w->data_bytes;
  undo *u = calloc(1, sizeof *u);
  if (!u) return hq_set_error(HQ_ENOMEM, "hq_ckpt_add_qtensor: out of memory");
  rc = claim_name(w, name, "hq_ckpt_add_qtensor", u);
  if (!rc) rc = ck_meta_make(w->path, name, qt, &meta);
  if (!rc) {
    key = hqt_join(name, "/", "hq");
    if (!key) rc = hq_set_error(HQ_ENOMEM, "hq_ckpt_add_qtensor: out of memory");
  }
  /* the buffers each storage owns, rowwise first (a columnwise buffer that is a rowwise one is
     stored once, with the rowwise storage) */
  for (uint32_t dir = HQ_ROWWISE; !rc && dir <= HQ_COLWISE; dir <<= 1) {
    const hq_storage *st = hq_qtensor_storage(qt, dir);
    for (uint32_t i = 0; !rc && st && i < st->nbuf; i++) {
      if (ck_buffer_aliased(qt, dir, i)) continue;
      const hq_buffer *b = hq_storage_cbuf(st, i);
      wentry *e = &fresh[nf];
      memset(e, 0, sizeof *e);
      e->name = hqt_join(name, "/", b->name);
      if (!e->name) {
        rc = hq_set_error(HQ_ENOMEM, "hq_ckpt_add_qtensor: out of memory");
        break;
      }
      nf++;
      e->st_dtype = ck_st_name_of(b->dtype);
      if (!e->st_dtype) {
        rc = ck_error(HQ_EINTERNAL, w->path, "buffer '%s' of '%.200s' has dtype %s, which has no "
                      "safetensors name", b->name, name, hq_dtype_name(b->dtype));
        break;
      }
      e->ndim = b->ndim;
      memcpy(e->shape, b->shape, sizeof e->shape);
      e->bytes = b->bytes;
      rc = add_bytes(w, &total, b->bytes);
      if (!rc) rc = snapshot(w, ctx, b->ptr, st->device, b->bytes, e->name, &e->data);
    }
  }
  if (!rc && nf) rc = hq_ctx_sync(ctx);
  else if (rc && nf) hq_ctx_sync(ctx); /* no copy may still be writing into what is freed */
  for (size_t i = 0; !rc && i < nf; i++) fresh[i].sum = XXH3_64bits(fresh[i].data, fresh[i].bytes);
  /* room for exactly the entries made above, before anything is published */
  if (!rc) rc = reserve_entries(w, nf);
  if (!rc && json_object_set_new(w->meta, key, json_string(meta)) != 0)
    rc = hq_set_error(HQ_ENOMEM, "hq_ckpt_add_qtensor: out of memory (metadata)");
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
  if (!w || !ctx) return hq_set_error(HQ_EINVAL, "hq_ckpt_add_tensor: NULL argument");
  int rc = check_name(name, "hq_ckpt_add_tensor");
  if (rc) return rc;
  hq_tensor t;
  char what[300];
  snprintf(what, sizeof what, "hq_ckpt_add_tensor '%.200s'", name);
  if ((rc = hq_tensor_check(tp, what, &t))) return rc;
  if (t.device != hq_ctx_device(ctx) && t.device != HQ_DEVICE_HOST)
    return ck_error(HQ_EINVAL, w->path, "%s: the tensor is on device %d, the context runs on %d "
                    "(a tensor is on the context's device or on the host)", what, t.device,
                    hq_ctx_device(ctx));
  /* rows * cols <= 2^48 (hq_tensor_check), times at most 4 bytes: no overflow */
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
    e.name = strdup(name);
    if (!e.name) rc = hq_set_error(HQ_ENOMEM, "hq_ckpt_add_tensor: out of memory");
  }
  if (!rc) {
    e.st_dtype = ck_st_name_of(t.dtype);
    e.ndim = 2;
    e.shape[0] = t.rows;
    e.shape[1] = t.cols;
    e.bytes = bytes;
    rc = snapshot(w, ctx, t.data, t.device, bytes, name, &e.data);
    if (!rc) rc = hq_ctx_sync(ctx);
    if (!rc) e.sum = XXH3_64bits(e.data, bytes);
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
  if (!w || !key || !value) return hq_set_error(HQ_EINVAL, "hq_ckpt_add_meta: NULL argument");
  size_t n = strlen(key);
  if (!n || n > CK_MAX_NAME)
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_meta: a key is 1 to %d bytes (this one: %zu)",
                    CK_MAX_NAME, n);
  if (!ck_utf8_valid(key))
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_meta: key '%.200s' is not valid UTF-8", key);
  if (!ck_utf8_valid(value))
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_meta: the value of '%.200s' is not valid "
                    "UTF-8", key);
  if (strcmp(key, "hq_version") == 0 || strcmp(key, CK_SUM_HEADER_KEY) == 0)
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_meta: '%s' is written by hq", key);
  if (json_object_get(w->meta, key))
    return ck_error(HQ_EINVAL, w->path, "hq_ckpt_add_meta: key '%.200s' was already added", key);
  undo u0;
  u0.n = 0;
  prefix_arg a = {w, "hq_ckpt_add_meta", key, &u0};
  int rc = each_prefix(key, meta_prefix_not_name, &a);
  if (!rc) rc = each_prefix(key, prefix_record, &a);
  if (!rc && json_object_set_new(w->meta, key, json_string(value)) != 0)
    rc = hq_set_error(HQ_ENOMEM, "hq_ckpt_add_meta: out of memory");
  if (rc) {
    undo_run(&u0);
    return rc;
  }
  undo_forget(&u0);
  return HQ_OK;
}

/* The JSON header, padded with spaces to a multiple of 8, its checksums filled in: every
   entry's key (added to w->meta, which is freed with the writer), then the header's own. */
static int build_header(hq_ckpt_writer *w, char **out, size_t *len) {
  int bad = 0;
  for (size_t i = 0; !bad && i < w->n; i++) {
    char hex[CK_SUM_HEX + 1], *key = hqt_join(w->e[i].name, "", CK_SUM_SUFFIX);
    ck_sum_hex(w->e[i].sum, hex);
    bad = !key || json_object_set_new(w->meta, key, json_string(hex)) != 0;
    free(key);
  }
  json_t *root = bad ? NULL : json_object();
  bad = !root || ck_jset(root, "__metadata__", json_incref(w->meta)) != 0;
  uint64_t off = 0;
  for (size_t i = 0; !bad && i < w->n; i++) {
    const wentry *e = &w->e[i];
    json_t *o = json_object(), *offs = json_array();
    bad |= !o || !offs;
    bad |= ck_jset(o, "dtype", json_string(e->st_dtype)) != 0;
    bad |= ck_jset(o, "shape", ck_jshape(e->ndim, e->shape)) != 0;
    bad |= ck_jpush(offs, json_integer((json_int_t)off)) != 0;
    off += e->bytes; /* bounded by data_bytes <= 2^63 */
    bad |= ck_jpush(offs, json_integer((json_int_t)off)) != 0;
    if (!bad) {
      bad = ck_jset(o, "data_offsets", offs) != 0;
      offs = NULL;
    }
    json_decref(offs);
    if (bad) json_decref(o);
    else bad = ck_jset(root, e->name, o) != 0;
  }
  size_t n = 0;
  char *p = bad ? NULL : ck_dump_json(root, 7, &n);
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
  const size_t at = sizeof CK_SUM_PREFIX - 1;
  XXH64_hash_t h;
  if (padded < at + CK_SUM_HEX || memcmp(p, CK_SUM_PREFIX, at) != 0) {
    free(p);
    return ck_error(HQ_EINTERNAL, w->path, "the header does not start with its checksum");
  }
  int rc = ck_header_sum(w->path, p, padded, &h);
  if (rc) {
    free(p);
    return rc;
  }
  char hex[CK_SUM_HEX + 1];
  ck_sum_hex(h, hex);
  memcpy(p + at, hex, CK_SUM_HEX);
  *out = p;
  *len = padded;
  return HQ_OK;
}

/* fsync the directory of w->path, so that the rename survives a crash. A file system that
   cannot sync a directory (EINVAL) has nothing more to offer and is not an error. */
static int sync_dir(hq_ckpt_writer *w) {
  int fd = open(w->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = HQ_OK;
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
    rc = ck_error(HQ_EIO, w->path, "written and renamed, but the fsync of its directory %.300s "
                  "failed (%s): it may not survive a crash", w->dir, strerror(errno));
  if (fd >= 0) close(fd);
  return rc;
}

/* What now lies at w->target when it is not a regular file (put there since the open), else
   NULL: the rename must not replace it. */
static const char *replaced_kind(const hq_ckpt_writer *w) {
  struct stat st;
  if (lstat(w->target, &st) != 0 || S_ISREG(st.st_mode)) return NULL;
  return S_ISLNK(st.st_mode) ? "a symbolic link" : hqt_file_kind(st.st_mode);
}

int hq_ckpt_writer_close(hq_ckpt_writer *w) {
  if (!w) return hq_set_error(HQ_EINVAL, "hq_ckpt_writer_close: NULL writer");
  char *hdr = NULL;
  size_t len = 0;
  int rc = build_header(w, &hdr, &len);
  if (!rc) {
    unsigned char n8[8];
    for (int k = 0; k < 8; k++) n8[k] = (unsigned char)((uint64_t)len >> (8 * k));
    rc = ck_write_all(w->fd, n8, sizeof n8, w->path);
  }
  if (!rc) rc = ck_write_all(w->fd, hdr, len, w->path);
  free(hdr);
  for (size_t i = 0; !rc && i < w->n; i++)
    rc = ck_write_all(w->fd, w->e[i].data, w->e[i].bytes, w->path);
  if (!rc && fsync(w->fd) != 0)
    rc = ck_error(HQ_EIO, w->path, "fsync of %.300s failed: %s", w->tmp, strerror(errno));
  if (!rc) {
    int fd = w->fd;
    const char *now = NULL;
    w->fd = -1;
    if (close(fd) != 0) {
      rc = ck_error(HQ_EIO, w->path, "closing %.300s failed: %s", w->tmp, strerror(errno));
      unlink(w->tmp);
    } else if ((now = replaced_kind(w)) != NULL) {
      rc = ck_error(HQ_EIO, w->path, "not a regular file any more (%s): not replaced by %.300s",
                    now, w->tmp);
      unlink(w->tmp);
    } else if (rename(w->tmp, w->target) != 0) {
      rc = ck_error(HQ_EIO, w->path, "renaming %.300s to it failed: %s", w->tmp, strerror(errno));
      unlink(w->tmp);
    } else {
      rc = sync_dir(w);
    }
  }
  hq_ckpt_writer_abort(w); /* closes and removes the temporary file if it is still open */
  return rc;
}
