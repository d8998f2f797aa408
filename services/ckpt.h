/*
** ckpt.h -- what the checkpoint files of libhqtrain share (never installed). Checkpoints are
** safetensors files (docs/checkpoints.md); the work is split by job, each file using only those
** below it:
**   ckpt_file.c   the safetensors file: dtypes, names' UTF-8, reads and writes, the JSON header
**                 (parsed, validated, built), the checksums (XXH3_64bits), opening a checkpoint
**                 and reading its entries (verified);
**   ckpt_meta.c   the "<name>/hq" metadata of a quantized tensor: made from a qtensor, parsed,
**                 and its formats checked against a qtensor's (plugin, layout version, options);
**   ckpt_write.c  the writer (names, host snapshots, the file written at close);
**   ckpt_load.c   loading plain and quantized tensors into the caller's.
** Built with jansson only (HQ_HAVE_JANSSON); ckpt_none.c holds the calls without it. Their
** cross-file functions and types are ck_*.
*/
#ifndef HQ_CKPT_H
#define HQ_CKPT_H

#include <jansson.h>
#include <xxhash.h>

#include "svc.h"

/* The largest header read or written: safetensors' own limit (100 MB), so that every file hq
   writes is one the reference reader accepts. */
#define CK_MAX_HEADER 100000000ull
/* Longest tensor name and metadata key, in bytes. */
#define CK_MAX_NAME 1024
/* Version of the "<name>/hq" metadata written here. */
#define CK_META_VERSION 1

/* Checksums (docs/checkpoints.md, 2): XXH3_64bits (seed 0) as 16 lowercase hex digits. The
   header's is the first "__metadata__" key, so that it sits at a fixed place in the text
   (CK_SUM_PREFIX): it covers the 8-byte length and the header with its own 16 digits as '0's.
   Every entry E has "E" CK_SUM_SUFFIX over its bytes. */
#define CK_SUM_HEADER_KEY "hq_header_xxh3_64"
#define CK_SUM_PREFIX "{\"__metadata__\":{\"" CK_SUM_HEADER_KEY "\":\""
#define CK_SUM_SUFFIX "/xxh3_64"
#define CK_SUM_HEX 16

// --- ckpt_file.c: the safetensors file ---------------------------------------------------------

/* "checkpoint <path>: <message>" as the thread's error; returns code. */
int ck_error(int code, const char *path, const char *fmt, ...) HQ_PRINTF(3, 4);
/* Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF). */
int ck_utf8_valid(const char *str);
/* The safetensors dtype an hq dtype is stored as (NULL: none). */
const char *ck_st_name_of(hq_dtype t);
/* Write all of buf; HQ_EIO naming the file on failure. */
int ck_write_all(int fd, const void *buf, size_t n, const char *path);
/* The 16 lowercase hex digits of h into out (17 bytes with the NUL). */
void ck_sum_hex(XXH64_hash_t h, char *out);
/* The checksum of the header text hdr (len bytes, whose first bytes are CK_SUM_PREFIX and 16
   digits) into *out: over the 8-byte length and the header with those digits read as '0's.
   HQ_ENOMEM (message naming path) when xxHash's state cannot be allocated. */
int ck_header_sum(const char *path, const char *hdr, size_t len, XXH64_hash_t *out);

/* JSON builders; a NULL anywhere is out of memory, and jansson frees a value it could not
   insert (0 on success). */
int ck_jset(json_t *o, const char *key, json_t *v);
int ck_jpush(json_t *a, json_t *v);
json_t *ck_jshape(int ndim, const int64_t *shape);
/* Compact JSON text of v in a new NUL-terminated buffer of *len bytes plus `extra` bytes of
   room; NULL when out of memory. */
char *ck_dump_json(const json_t *v, size_t extra, size_t *len);
/* Parse JSON text: HQ_OK, HQ_ENOMEM, or HQ_EPARSE with *err describing the error (a parse
   that lost an allocation is HQ_ENOMEM, never a silently shortened string). */
int ck_parse_json(const char *text, size_t len, json_t **out, json_error_t *err);

struct hq_ckpt {
  char *path;
  int fd;
  uint64_t data_start;        /* 8 + header length */
  uint64_t data_size;         /* bytes after the header */
  json_t *root;               /* the header (validated at open) */
  json_t *meta;               /* "__metadata__" (borrowed from root), or NULL */
  int verify;                 /* checksums verified (not opened with HQ_CKPT_NO_VERIFY) */
  /* the entries' names and the metadata keys in the header's order (borrowed from root), made
     at open: hq_ckpt_entry_name and hq_ckpt_meta_key index them */
  const char **names, **mkeys;
  size_t nnames, nmkeys;
};

/* One entry of the header, as validated. */
typedef struct ck_entry {
  const char *st_name;        /* its safetensors dtype ("F32", "U8", ...) */
  hq_dtype hq;                /* the hq dtype it loads as (HQ_DTYPE_INVALID: none) */
  json_t *shape;              /* borrowed */
  size_t ndim;
  uint64_t begin, end;
} ck_entry;

/* The header entry `name` (not "__metadata__"), parsed; HQ_ENOENT when absent. */
int ck_find_entry(const hq_ckpt *c, const char *name, ck_entry *out);
/* Copy entry `name` (parsed into e) into dst on `device` (the host, or ctx's device through a
   host staging buffer and ctx's stream, synchronized per chunk), verifying its checksum unless
   the file was opened without verification (a mismatch is HQ_EPARSE naming the entry; dst then
   holds the corrupt bytes), with `sum` (ck_sum_state). */
int ck_read_entry(hq_ckpt *c, hq_ctx *ctx, void *dst, int device, const char *name,
                  const ck_entry *e, XXH3_state_t *sum);
/* The hash state ck_read_entry needs to read into `device` through staging (*out NULL for the
   host, which is hashed in one pass, and when c is not verified; free it with
   XXH3_freeState): allocated before a load writes anything. */
int ck_sum_state(const hq_ckpt *c, int device, XXH3_state_t **out);
/* Whether a JSON shape (integers checked at open) equals dims; "[a, b, ...]" texts of a JSON
   shape and of dims into buf. */
int ck_shape_equal(json_t *shape, int ndim, const int64_t *dims);
const char *ck_shape_text(json_t *shape, char *buf, size_t len);
const char *ck_dims_text(int ndim, const int64_t *d, char *buf, size_t len);

// --- ckpt_meta.c: the metadata of a quantized tensor -------------------------------------------

/* A qtensor a checkpoint call (`what`, tensor `name`) can read or fill: not saved (HQ_ESTATE), on
   ctx's device (HQ_EINVAL). */
int ck_qtensor_usable(const char *path, const char *what, const char *name, const hq_ctx *ctx,
                      const hq_qtensor *qt);
/* Whether columnwise buffer i of qt is a rowwise buffer (HQ_BUF_SHARED, the same memory): it is
   stored once, with the rowwise storage. Rowwise buffers are never. */
int ck_buffer_aliased(const hq_qtensor *qt, uint32_t dir, uint32_t i);
/* qt's columnwise_source as the metadata names it: "original" or "rowwise_dequantized". */
const char *ck_source_name(const hq_qtensor *qt);
/* The "<name>/hq" JSON text of qt (a new string); `path` names the file in messages. */
int ck_meta_make(const char *path, const char *name, const hq_qtensor *qt, char **out);

/* A load in progress: the checkpoint, the tensor's name and its metadata key. */
typedef struct ck_load {
  hq_ckpt *c;
  const char *name;
  const char *mkey;           /* "<name>/hq" */
} ck_load;
/* HQ_EPARSE: "tensor '<name>': metadata "<name>/hq" <message>". */
int ck_meta_error(const ck_load *L, const char *fmt, ...) HQ_PRINTF(2, 3);

/* One buffer record of the metadata, checked against its safetensors entry. */
typedef struct ck_mbuf {
  const char *entry, *name;
  uint32_t dir;
  hq_dtype dtype;
  int ndim;
  int64_t shape[HQ_MAX_BUFFER_DIMS];
  ck_entry ce;              /* its safetensors entry */
} ck_mbuf;

/* The parsed top level of the metadata (strings borrowed from `json`; free with
   ck_meta_free). */
typedef struct ck_meta {
  json_t *json;
  int64_t rows, cols;
  uint32_t dirs;              /* the directions present */
  uint32_t usage;             /* the directions hq_qtensor_update refreshes (informative) */
  hq_dtype nominal;           /* f32, f16 or bf16 */
  const char *source;         /* "original" or "rowwise_dequantized" */
} ck_meta;
/* Parse `text` (the value of L->mkey): JSON, an object of version CK_META_VERSION with every
   key docs/checkpoints.md (3) calls required, each of its type and range: role, rows, cols,
   nominal, directions, usage, columnwise_source (formats and buffers: ck_meta_check_formats,
   ck_meta_buffers). HQ_EPARSE / HQ_ENOTSUP / HQ_ENOMEM naming the key. */
int ck_meta_parse(const ck_load *L, const char *text, ck_meta *out);
void ck_meta_free(ck_meta *m);
/* Check the format records of qt's present directions against qt's formats: plugin name,
   layout version, options by name. HQ_EINVAL naming both values. */
int ck_meta_check_formats(const ck_load *L, const ck_meta *m, const hq_qtensor *qt);
/* The "buffers" list, every record checked against its safetensors entry (HQ_EPARSE: the file
   contradicts itself); *out (free it) holds *nout records, in the file's order. */
int ck_meta_buffers(const ck_load *L, const ck_meta *m, ck_mbuf **out, size_t *nout);

#endif /* HQ_CKPT_H */
