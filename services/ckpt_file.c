/*
** ckpt_file.c -- the safetensors file of a checkpoint: the dtypes, the names' UTF-8, reads and
** writes, the JSON header (built, parsed and verified with jansson, never by hand), and the
** reader: hq_ckpt_open checks the header's checksum before parsing it, then the whole header
** (nothing in it is trusted: sizes, offsets, shapes, dtypes are validated and overflow-checked),
** and entries are read with pread() at load, each hashed as it is read and checked against its
** checksum.
**
** The file (docs/checkpoints.md): an 8-byte little-endian header length N, N bytes of JSON
** (padded with spaces to a multiple of 8), then the tensors' bytes, contiguous, in the order they
** were added.
*/
#include "config.h"
#include "ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Host staging for a device destination: read and copied in chunks of this size. */
#define CK_STAGE_BYTES ((size_t)16 << 20)
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

/* The safetensors dtype an hq dtype is stored as: E8M0 scales and packed E2M1X2 / E3M2X4 /
   E2M3X4 / I4X2 bytes as U8 (the hq dtype is in the metadata). */
const char *ck_st_name_of(hq_dtype t) {
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
  case HQ_E2M1X2:
  case HQ_E3M2X4:
  case HQ_E2M3X4:
  case HQ_I4X2: return "U8";
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
int ck_error(int code, const char *path, const char *fmt, ...) {
  char msg[800];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return hq_set_error(code, "checkpoint %.200s: %s", path ? path : "?", msg);
}

/* Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF): what jansson accepts
   in a string, checked beforehand so that a jansson failure can only mean "out of memory". */
int ck_utf8_valid(const char *str) {
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

/* Write all of buf; HQ_EIO naming the file on failure. */
int ck_write_all(int fd, const void *buf, size_t n, const char *path) {
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

// --- checksums ------------------------------------------------------------------------------

void ck_sum_hex(XXH64_hash_t h, char *out) {
  snprintf(out, CK_SUM_HEX + 1, "%016llx", (unsigned long long)h);
}

int ck_header_sum(const char *path, const char *hdr, size_t len, XXH64_hash_t *out) {
  static const char zeros[CK_SUM_HEX + 1] = "0000000000000000";
  const size_t at = sizeof CK_SUM_PREFIX - 1;
  unsigned char n8[8];
  for (int k = 0; k < 8; k++) n8[k] = (unsigned char)((uint64_t)len >> (8 * k));
  XXH3_state_t *st = XXH3_createState();
  if (!st) return ck_error(HQ_ENOMEM, path, "out of memory (checksum state)");
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, n8, sizeof n8);
  XXH3_64bits_update(st, hdr, at);
  XXH3_64bits_update(st, zeros, CK_SUM_HEX);
  XXH3_64bits_update(st, hdr + at + CK_SUM_HEX, len - at - CK_SUM_HEX);
  *out = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return HQ_OK;
}

/* 16 lowercase hex digits (what ck_sum_hex writes), and nothing else. */
static int sum_text_valid(const char *s, size_t n) {
  if (n != CK_SUM_HEX) return 0;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return 1;
}

/* Where the header text hdr holds its checksum (CK_SUM_PREFIX, 16 digits, '"'): 1 when it does,
   0 when not (no checksum, or one moved by another writer or by corruption). */
static int header_has_sum(const char *hdr, size_t len) {
  const size_t at = sizeof CK_SUM_PREFIX - 1;
  return len > at + CK_SUM_HEX && memcmp(hdr, CK_SUM_PREFIX, at) == 0 &&
         sum_text_valid(hdr + at, CK_SUM_HEX) && hdr[at + CK_SUM_HEX] == '"';
}

/* The header's checksum against its text (before anything in it is parsed or trusted). */
static int verify_header(const char *path, const char *hdr, size_t len) {
  XXH64_hash_t h;
  int rc = ck_header_sum(path, hdr, len, &h);
  if (rc) return rc;
  char want[CK_SUM_HEX + 1];
  ck_sum_hex(h, want);
  const char *rec = hdr + sizeof CK_SUM_PREFIX - 1;
  if (memcmp(want, rec, CK_SUM_HEX) != 0)
    return ck_error(HQ_EPARSE, path, "the header is corrupt: it hashes to xxh3_64 %s, its "
                    "checksum \"" CK_SUM_HEADER_KEY "\" says %.16s (the file changed after hq "
                    "wrote it)", want, rec);
  return HQ_OK;
}

/* After a verified header: every entry has a checksum key of 16 hex digits. Without a verified
   header: a file with no checksum at all is a foreign (or older) file, refused with the way to
   load it; one with entry checksums but no header checksum where hq writes it is corrupt. */
static int check_sum_keys(hq_ckpt *c, int header_summed) {
  const char *key;
  json_t *v;
  if (!header_summed) {
    int any = hq_ckpt_meta(c, CK_SUM_HEADER_KEY) != NULL;
    const size_t ns = strlen(CK_SUM_SUFFIX);
    json_object_foreach(c->meta, key, v) {
      size_t n = strlen(key);
      any |= n > ns && strcmp(key + n - ns, CK_SUM_SUFFIX) == 0;
    }
    if (any)
      return ck_error(HQ_EPARSE, c->path, "the header is corrupt: it has checksums but not the "
                      "header's own at its start (\"" CK_SUM_HEADER_KEY "\", the first "
                      "metadata key hq writes)");
    return ck_error(HQ_ENOTSUP, c->path, "the file has no checksums (written by another tool, "
                    "or by hq before checksums were added), so corruption in it could not be "
                    "detected: to load it anyway, open it with HQ_CKPT_NO_VERIFY "
                    "(hq_ckpt_open_ex), or give hq train --no-verify");
  }
  json_object_foreach(c->root, key, v) {
    if (strcmp(key, "__metadata__") == 0) continue;
    char *sk = hqt_join(key, "", CK_SUM_SUFFIX);
    if (!sk) return ck_error(HQ_ENOMEM, c->path, "out of memory");
    const char *sum = hq_ckpt_meta(c, sk);
    free(sk);
    if (!sum || !sum_text_valid(sum, strlen(sum)))
      return ck_error(HQ_EPARSE, c->path, "entry '%.200s': its checksum \"%.200s" CK_SUM_SUFFIX
                      "\" is missing or not 16 hex digits", key, key);
  }
  return HQ_OK;
}

// --- JSON -------------------------------------------------------------------------------------

/* Helpers that build JSON; a NULL anywhere is out of memory (every string was checked to be
   UTF-8 beforehand), and jansson frees a value it could not insert. */
int ck_jset(json_t *o, const char *key, json_t *v) {
  return o && v ? json_object_set_new(o, key, v) : (json_decref(v), -1);
}
int ck_jpush(json_t *a, json_t *v) {
  return a && v ? json_array_append_new(a, v) : (json_decref(v), -1);
}
json_t *ck_jshape(int ndim, const int64_t *shape) {
  json_t *a = json_array();
  for (int k = 0; a && k < ndim; k++)
    if (ck_jpush(a, json_integer((json_int_t)shape[k]))) {
      json_decref(a);
      return NULL;
    }
  return a;
}

/* JSON text of `v` (compact, keys in insertion order) into a new buffer of *len bytes plus
   `extra` bytes of room, NUL-terminated; NULL when out of memory. json_dumps is not used: under
   an allocation failure it can drop an object key and still return text (jansson ignores the
   status of a key's dump into its growing buffer). json_dumpb into a buffer sized by a first
   pass cannot lose bytes, and reports its own failures (0). */
char *ck_dump_json(const json_t *v, size_t extra, size_t *len) {
  size_t n = json_dumpb(v, NULL, 0, JSON_COMPACT);
  if (!n || n > SIZE_MAX - extra - 1) return NULL;
  char *p = malloc(n + extra + 1);
  if (!p) return NULL;
  if (json_dumpb(v, p, n, JSON_COMPACT) != n) {
    free(p);
    return NULL;
  }
  p[n] = '\0';
  *len = n;
  return p;
}

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
int ck_parse_json(const char *text, size_t len, json_t **out, json_error_t *err) {
  json_t *v;
  int rc = parse_once(text, len, &v, err);
  if (rc) return rc;
  size_t trimmed = len, n = 0;
  while (trimmed && (text[trimmed - 1] == ' ' || text[trimmed - 1] == '\n')) trimmed--;
  char *again = ck_dump_json(v, 0, &n);
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

// --- the reader -------------------------------------------------------------------------------

/* Parse and check entry `name` of the header: an object with a known "dtype", a "shape" of
   non-negative integers whose product times the element size (overflow-checked) is the length of
   "data_offsets" [begin, end], inside the data section. */
static int entry_parse(const char *path, uint64_t data_size, const char *name, json_t *v,
                       ck_entry *out) {
  if (!json_is_object(v))
    return ck_error(HQ_EPARSE, path, "entry '%.200s' is not a JSON object", name);
  json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
  json_t *offs = json_object_get(v, "data_offsets");
  if (!json_is_string(dt))
    return ck_error(HQ_EPARSE, path, "entry '%.200s': \"dtype\" is missing or not a string",
                    name);
  const int st = st_index(json_string_value(dt));
  if (st < 0)
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
  uint64_t es = st_types[st].size;
  if (count > UINT64_MAX / es || count * es != (uint64_t)(e - b))
    return ck_error(HQ_EPARSE, path, "entry '%.200s': shape of %llu %s elements does not fit its "
                    "%lld bytes [%lld, %lld]", name, (unsigned long long)count,
                    st_types[st].name, (long long)(e - b), (long long)b, (long long)e);
  out->st_name = st_types[st].name;
  out->hq = st_types[st].hq;
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
  range *r = calloc(n, sizeof *r);
  c->names = calloc(n ? n : 1, sizeof *c->names);
  if (!r || !c->names) {
    free(r);
    return ck_error(HQ_ENOMEM, c->path, "out of memory (%zu entries)", n);
  }
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
      c->mkeys = calloc(json_object_size(v) ? json_object_size(v) : 1, sizeof *c->mkeys);
      if (!c->mkeys) {
        rc = ck_error(HQ_ENOMEM, c->path, "out of memory (%zu metadata keys)",
                      json_object_size(v));
        break;
      }
      json_object_foreach(v, mk, mv) c->mkeys[c->nmkeys++] = mk;
      continue;
    }
    ck_entry e;
    if ((rc = entry_parse(c->path, c->data_size, key, v, &e))) break;
    c->names[c->nnames++] = key;
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
  free(c->names);
  free(c->mkeys);
  free(c->path);
  free(c);
}

int hq_ckpt_open(const char *path, hq_ckpt **out) { return hq_ckpt_open_ex(path, NULL, out); }

int hq_ckpt_open_ex(const char *path, const hq_ckpt_open_opts *opts, hq_ckpt **out) {
  if (!out) return hq_set_error(HQ_EINVAL, "hq_ckpt_open: out is NULL");
  *out = NULL;
  if (!path || !path[0]) return hq_set_error(HQ_EINVAL, "hq_ckpt_open: the path is empty");
  uint32_t flags = 0;
  if (opts) {
    if (opts->struct_size < HQ_CKPT_OPEN_OPTS_SIZE_0_3)
      return hq_set_error(HQ_EINVAL, "hq_ckpt_open_ex: opts->struct_size %u is smaller than "
                          "the first version's %zu", opts->struct_size,
                          (size_t)HQ_CKPT_OPEN_OPTS_SIZE_0_3);
    flags = opts->flags;
    if (flags & ~HQ_CKPT_NO_VERIFY)
      return hq_set_error(HQ_EINVAL, "hq_ckpt_open_ex: unknown flags 0x%x", flags);
  }
  hq_ckpt *c = calloc(1, sizeof *c);
  if (!c) return hq_set_error(HQ_ENOMEM, "hq_ckpt_open: out of memory");
  c->fd = -1;
  c->verify = !(flags & HQ_CKPT_NO_VERIFY);
  int header_summed = 0;
  char *hdr = NULL;
  int rc = HQ_OK;
  c->path = strdup(path);
  if (!c->path) rc = hq_set_error(HQ_ENOMEM, "hq_ckpt_open: out of memory");
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
    hdr = malloc((size_t)hlen + 1);
    if (!hdr) rc = ck_error(HQ_ENOMEM, path, "out of memory (%llu bytes of header)",
                            (unsigned long long)hlen);
  }
  if (!rc) rc = pread_all(c->fd, hdr, (size_t)hlen, 8, path);
  /* the header's checksum first, so that a corrupt header is reported as such, whatever the
     corruption did to its JSON */
  if (!rc && c->verify && (header_summed = header_has_sum(hdr, (size_t)hlen)))
    rc = verify_header(path, hdr, (size_t)hlen);
  if (!rc) {
    const char *nul = memchr(hdr, '\0', (size_t)hlen);
    if (nul)
      rc = ck_error(HQ_EPARSE, path, "the JSON header holds a NUL byte (header byte %zu)",
                    (size_t)(nul - hdr));
  }
  if (!rc) {
    json_error_t err;
    rc = ck_parse_json(hdr, (size_t)hlen, &c->root, &err);
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
  if (!rc && c->verify) rc = check_sum_keys(c, header_summed);
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

const char *hq_ckpt_meta_key(const hq_ckpt *c, size_t i) {
  return c && i < c->nmkeys ? c->mkeys[i] : NULL;
}

const char *hq_ckpt_entry_name(const hq_ckpt *c, size_t i) {
  return c && i < c->nnames ? c->names[i] : NULL;
}

/* The header entry `name` (not "__metadata__"), parsed; HQ_ENOENT when absent. */
int ck_find_entry(const hq_ckpt *c, const char *name, ck_entry *out) {
  json_t *v = strcmp(name, "__metadata__") ? json_object_get(c->root, name) : NULL;
  if (!v) return HQ_ENOENT;
  return entry_parse(c->path, c->data_size, name, v, out);
}

/* The metadata key of entry `name`'s checksum, into a buffer on the stack (no allocation: a
   load that read some buffers cannot fail for memory here); a name longer than hq writes is
   refused before any byte is read. */
#define CK_SUM_KEY_LEN (2 * CK_MAX_NAME + sizeof CK_SUM_SUFFIX)
static int sum_key(const hq_ckpt *c, const char *name, char sk[CK_SUM_KEY_LEN]) {
  if (strlen(name) >= 2 * CK_MAX_NAME)
    return ck_error(HQ_EPARSE, c->path, "entry '%.200s...': name longer than hq writes", name);
  snprintf(sk, CK_SUM_KEY_LEN, "%s" CK_SUM_SUFFIX, name);
  return HQ_OK;
}

/* Entry `name`'s `bytes`, hashed to h, against the checksum under key sk (present and well
   formed in a file opened with verification: checked at open). */
static int sum_match(const hq_ckpt *c, const char *name, const char *sk, XXH64_hash_t h,
                     uint64_t bytes) {
  const char *want = hq_ckpt_meta(c, sk);
  char got[CK_SUM_HEX + 1];
  ck_sum_hex(h, got);
  if (want && strcmp(got, want) == 0) return HQ_OK;
  return ck_error(HQ_EPARSE, c->path, "entry '%.200s' is corrupt: its %llu bytes hash to "
                  "xxh3_64 %s, the header records %.16s (the file changed after hq wrote it)",
                  name, (unsigned long long)bytes, got, want ? want : "nothing");
}

/* `bytes` of the file from offset off, read through the host buffer stage (`chunk` bytes) a
   piece at a time: each piece hashed into sum (NULL: not) and, with dst, copied to dst on
   `device` (synchronized: the next piece reuses the buffer). */
static int read_staged(hq_ckpt *c, uint64_t off, uint64_t bytes, char *stage, size_t chunk,
                       XXH3_state_t *sum, hq_ctx *ctx, void *dst, int device) {
  int rc = HQ_OK;
  for (uint64_t done = 0; !rc && done < bytes; done += chunk) {
    const size_t n = bytes - done < chunk ? (size_t)(bytes - done) : chunk;
    rc = pread_all(c->fd, stage, n, off + done, c->path);
    if (!rc && sum) XXH3_64bits_update(sum, stage, n);
    if (!rc && dst) rc = hq_ctx_memcpy(ctx, (char *)dst + done, device, stage, HQ_DEVICE_HOST, n);
    if (!rc && dst) rc = hq_ctx_sync(ctx);
  }
  return rc;
}

int ck_read_entry(hq_ckpt *c, hq_ctx *ctx, void *dst, int device, const char *name,
                  const ck_entry *e, XXH3_state_t *sum) {
  const size_t bytes = (size_t)(e->end - e->begin);
  const uint64_t off = c->data_start + e->begin;
  char sk[CK_SUM_KEY_LEN];
  if (c->verify) {
    const int krc = sum_key(c, name, sk);
    if (krc) return krc;
    if (device >= 0) XXH3_64bits_reset(sum);
  }
  int rc = HQ_OK;
  XXH64_hash_t h = 0;
  if (device < 0) {
    rc = pread_all(c->fd, dst, bytes, off, c->path);
    if (!rc && c->verify) h = XXH3_64bits(dst, bytes);
  } else if (bytes) {
    size_t chunk = bytes < CK_STAGE_BYTES ? bytes : CK_STAGE_BYTES;
    char *stage = malloc(chunk);
    if (!stage) rc = ck_error(HQ_ENOMEM, c->path, "out of memory (%zu bytes of staging)", chunk);
    if (!rc)
      rc = read_staged(c, off, bytes, stage, chunk, c->verify ? sum : NULL, ctx, dst, device);
    free(stage);
  }
  if (!rc && c->verify)
    rc = sum_match(c, name, sk, device < 0 ? h : XXH3_64bits_digest(sum), bytes);
  return rc;
}

int hq_ckpt_verify(hq_ckpt *c, uint64_t *bytes) {
  if (bytes) *bytes = 0;
  if (!c) return hq_set_error(HQ_EINVAL, "hq_ckpt_verify: NULL checkpoint");
  if (!c->verify)
    return ck_error(HQ_ENOTSUP, c->path, "hq_ckpt_verify: opened with HQ_CKPT_NO_VERIFY (the file "
                    "may have no checksums): open it with hq_ckpt_open to verify it");
  char *stage = malloc(CK_STAGE_BYTES);
  XXH3_state_t *sum = XXH3_createState();
  int rc = stage && sum ? HQ_OK : ck_error(HQ_ENOMEM, c->path, "hq_ckpt_verify: out of memory");
  for (size_t i = 0; !rc && i < c->nnames; i++) {
    const char *name = c->names[i];
    ck_entry e;
    char sk[CK_SUM_KEY_LEN];
    if ((rc = ck_find_entry(c, name, &e)) || (rc = sum_key(c, name, sk))) break;
    const uint64_t n = e.end - e.begin;
    XXH3_64bits_reset(sum);
    rc = read_staged(c, c->data_start + e.begin, n, stage, CK_STAGE_BYTES, sum, NULL, NULL, 0);
    if (rc || (rc = sum_match(c, name, sk, XXH3_64bits_digest(sum), n))) break;
    if (bytes) *bytes += n;
  }
  free(stage);
  XXH3_freeState(sum);
  return rc;
}

int ck_sum_state(const hq_ckpt *c, int device, XXH3_state_t **out) {
  *out = NULL;
  if (c->verify && device >= 0 && !(*out = XXH3_createState()))
    return ck_error(HQ_ENOMEM, c->path, "out of memory (checksum state)");
  return HQ_OK;
}

int ck_shape_equal(json_t *shape, int ndim, const int64_t *dims) {
  if (json_array_size(shape) != (size_t)ndim) return 0;
  for (int k = 0; k < ndim; k++) {
    json_t *x = json_array_get(shape, (size_t)k);
    if (!json_is_integer(x) || json_integer_value(x) != (json_int_t)dims[k]) return 0;
  }
  return 1;
}

/* "[a, b, ...]" of a JSON shape (integers checked by the caller) into buf. */
const char *ck_shape_text(json_t *shape, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  at += (size_t)snprintf(buf, len, "[");
  for (size_t k = 0; k < json_array_size(shape) && at < len; k++)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", k ? ", " : "",
                           (long long)json_integer_value(json_array_get(shape, k)));
  if (at < len) snprintf(buf + at, len - at, "]");
  return buf;
}
const char *ck_dims_text(int ndim, const int64_t *d, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int k = 0; k < ndim && at < len; k++)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", k ? ", " : "", (long long)d[k]);
  if (at < len) snprintf(buf + at, len - at, "]");
  return buf;
}
