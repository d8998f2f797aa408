/*
** test_checkpoint.c -- safetensors checkpoints (services/ckpt_*.c, docs/checkpoints.md).
**
**   - round trips of quantized tensors of every stock format (fp8_tensor, mxfp8 incl. swizzle and
**     2-D, nvfp4 incl. RHT, 2-D, swizzle and stochastic rounding, fp8_block 1d/2d, identity), a
**     hybrid, a rowwise_dequantized hybrid, columnwise-only and rowwise-only tensors, and plain
**     f32 / f16 / bf16 tensors: byte-equal after loading into fresh qtensors;
**   - a columnwise buffer shared with the rowwise storage in one tensor and a private copy in the
**     other (after a one-direction update), both ways;
**   - the file read back with jansson here, against expectations written by hand: the 8-byte
**     length, header padded with spaces to a multiple of 8, safetensors dtype names, shapes,
**     contiguous offsets in insertion order, the "<name>/hq" metadata;
**   - refused loads (other format, options, shape, directions, missing tensor, plain vs
**     quantized) with the status and a message naming file, tensor and both values, and
**     nothing written into the qtensor; the writer's name rules;
**   - plugin versions (tests/wrap/fp8_tensor_next.c): a file written before the plugin appended
**     an option loads (the option at its default), a non-default value or an option the plugin
**     no longer has is refused naming it, and a layout version other than the module's is
**     refused naming tensor, format, plugin and both versions;
**   - hostile files: every truncation of a small valid file, bad header lengths, offsets out of
**     range / overlapping / reversed / with holes, shapes that do not fit or overflow, unknown
**     dtypes, non-object JSON, deep nesting, NUL bytes, inconsistent "<name>/hq" metadata, and
**     2000 seeded random mutations: a clean error or a correct load, never a crash (run it in
**     the ASan/UBSan build);
**   - checksums (issue 46): one bit flipped in every entry and in every header byte in turn, each
**     refused naming the entry (the tensor) or the header; a file without checksums refused by
**     default and loaded with HQ_CKPT_NO_VERIFY;
**   - two writers of one path (one failing on a full disk), saves killed by SIGKILL and by
**     SIGXFSZ mid-write (their temporary files removed by the next save, a live process's kept),
**     a full disk (a 256 KiB tmpfs when mount works, a file size limit always): the file at the
**     path is never damaged;
**   - every required key of "<name>/hq" removed and given a wrong value: refused naming it;
**   - allocation failures injected one at a time into a save and a load (not under ASan);
**   - Python's safetensors (when python3 can import safetensors and numpy) reads the files.
*/
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hq_test.h"

#ifndef HQ_TEST_JANSSON
int main(void) {
  printf("test_checkpoint: built without jansson: checkpoints are not built (skipped)\n");
  return HQ_TEST_SKIP;
}
#else

#include <jansson.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <xxhash.h>

// --- allocation failures (malloc replaced; not with AddressSanitizer) ----------------------

#if !defined(__SANITIZE_ADDRESS__)
#define HQ_TEST_OOM 1
#include "hq_alloc_fail.h"
#endif

// --- fixtures -----------------------------------------------------------------------------

static hq_ctx *g_ctx;
static hq_plugins *g_set;
static char g_dir[512];

static const char *tpath(const char *name) {
  static char buf[8][1024];
  static int k;
  k = (k + 1) % 8;
  snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
  return buf[k];
}

/* A quantizer with one spec per direction ("plugin" or "plugin:opt=v,opt=v"; NULL: identity). */
static hq_quantizer *mkq(const char *row, const char *col, int source, uint32_t usage) {
  char buf[2][256];
  const char *opts[2][8];
  hq_format_spec spec[2];
  const char *text[2] = {row, col};
  for (int d = 0; d < 2; d++) {
    memset(&spec[d], 0, sizeof spec[d]);
    spec[d].struct_size = sizeof spec[d];
    if (!text[d]) continue;
    snprintf(buf[d], sizeof buf[d], "%s", text[d]);
    char *colon = strchr(buf[d], ':');
    spec[d].plugin = buf[d];
    spec[d].options = opts[d];
    if (colon) {
      *colon = '\0';
      for (char *p = colon + 1; p && *p && spec[d].n_options < 8;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        opts[d][spec[d].n_options++] = p;
        p = comma ? comma + 1 : NULL;
      }
    }
  }
  hq_quantizer *q = NULL;
  HQ_OK_OR_FAIL(hq_quantizer_create_direct(g_set, row ? &spec[0] : NULL, col ? &spec[1] : NULL,
                                           source, &q));
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
  return q;
}

/* "columnwise_<x>" for a shared columnwise buffer x: the name it has once the storage owns it. */
static void canon(uint32_t dir, const char *name, char *buf, size_t len) {
  if (dir == HQ_COLWISE && strncmp(name, "columnwise_", 11) != 0)
    snprintf(buf, len, "columnwise_%s", name);
  else
    snprintf(buf, len, "%s", name);
}

/* Every direction of a and b: same buffers (up to the shared/private naming), same bytes. */
static void assert_same_qt(const hq_qtensor *a, const hq_qtensor *b, const char *what) {
  assert_int_equal(hq_qtensor_dirs(a), hq_qtensor_dirs(b));
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *sa = hq_qtensor_storage(a, dir), *sb = hq_qtensor_storage(b, dir);
    if (!sa) continue;
    assert_int_equal(sa->nbuf, sb->nbuf);
    for (uint32_t i = 0; i < sa->nbuf; i++) {
      const hq_buffer *ba = hq_storage_cbuf(sa, i), *bb = hq_storage_cbuf(sb, i);
      char na[64], nb[64];
      canon(dir, ba->name, na, sizeof na);
      canon(dir, bb->name, nb, sizeof nb);
      assert_string_equal(na, nb);
      assert_int_equal(ba->dtype, bb->dtype);
      assert_int_equal(ba->bytes, bb->bytes);
      if (memcmp(ba->ptr, bb->ptr, ba->bytes) != 0)
        fail_msg("%s: %s buffer '%s' differs after the round trip", what,
                 dir == HQ_ROWWISE ? "rowwise" : "columnwise", ba->name);
    }
  }
}

/* A copy of every byte of qt's buffers (to see that a refused load wrote nothing). */
typedef struct snap {
  size_t n;
  unsigned char *bytes;
} snap;
static snap take_snap(const hq_qtensor *qt) {
  snap s = {0, NULL};
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *st = hq_qtensor_storage(qt, dir);
    for (uint32_t i = 0; st && i < st->nbuf; i++) s.n += hq_storage_cbuf(st, i)->bytes;
  }
  s.bytes = malloc(s.n ? s.n : 1);
  size_t at = 0;
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *st = hq_qtensor_storage(qt, dir);
    for (uint32_t i = 0; st && i < st->nbuf; i++) {
      const hq_buffer *b = hq_storage_cbuf(st, i);
      memcpy(s.bytes + at, b->ptr, b->bytes);
      at += b->bytes;
    }
  }
  return s;
}
static int same_snap(const hq_qtensor *qt, const snap *s) {
  snap t = take_snap(qt);
  int same = t.n == s->n && memcmp(t.bytes, s->bytes, t.n) == 0;
  free(t.bytes);
  return same;
}

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot read %s", path);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *p = malloc((size_t)len + 1);
  if (len && fread(p, 1, (size_t)len, f) != (size_t)len) fail_msg("short read of %s", path);
  fclose(f);
  *n = (size_t)len;
  return p;
}
static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) fail_msg("cannot write %s", path);
  if (n && fwrite(p, 1, n, f) != n) fail_msg("short write of %s", path);
  fclose(f);
}
static int exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}
/* Whether g_dir holds a file whose name starts with `prefix` (temporary files). */
static int dir_has_prefix(const char *prefix) {
  DIR *d = opendir(g_dir);
  struct dirent *e;
  int found = 0;
  while (d && (e = readdir(d)))
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) found = 1;
  if (d) closedir(d);
  return found;
}

/* A safetensors file from raw header text (not padded) and data bytes. */
static void write_st(const char *path, const char *header, const void *data, size_t n) {
  size_t h = strlen(header);
  unsigned char *buf = malloc(8 + h + n + 1);
  for (int k = 0; k < 8; k++) buf[k] = (unsigned char)((uint64_t)h >> (8 * k));
  memcpy(buf + 8, header, h);
  if (n) memcpy(buf + 8 + h, data, n);
  write_file(path, buf, 8 + h + n);
  free(buf);
}

/* Open without verifying checksums: the hand-made (foreign) files of the hostile tests. */
static int open_nv(const char *path, hq_ckpt **ck) {
  hq_ckpt_open_opts o = {.struct_size = sizeof o, .flags = HQ_CKPT_NO_VERIFY};
  return hq_ckpt_open_ex(path, &o, ck);
}

/* Where hq writes the header's checksum: the first metadata key (docs/checkpoints.md, 2). */
#define SUM_PREFIX "{\"__metadata__\":{\"hq_header_xxh3_64\":\""

/* The header checksum of file bytes p (n >= 8 + header), computed here from the rule in the
   docs: XXH3_64bits of the 8-byte length and the header, its own 16 digits read as '0's. */
static uint64_t header_sum(const unsigned char *p) {
  uint64_t h = 0;
  for (int k = 0; k < 8; k++) h |= (uint64_t)p[k] << (8 * k);
  unsigned char *c = malloc(8 + (size_t)h);
  memcpy(c, p, 8 + (size_t)h);
  assert_memory_equal(c + 8, SUM_PREFIX, strlen(SUM_PREFIX));
  memset(c + 8 + strlen(SUM_PREFIX), '0', 16);
  uint64_t sum = XXH3_64bits(c, 8 + (size_t)h);
  free(c);
  return sum;
}

/* Rewrite the header checksum of the file at path (after an edit of its header). */
static void resign(const char *path) {
  size_t n;
  unsigned char *p = read_file(path, &n);
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)header_sum(p));
  memcpy(p + 8 + strlen(SUM_PREFIX), hex, 16);
  write_file(path, p, n);
  free(p);
}

/* The header of a checkpoint file, parsed with jansson (fails the test on any format error). */
static json_t *read_header(const char *path, size_t *hlen, size_t *file_size) {
  size_t n;
  unsigned char *p = read_file(path, &n);
  assert_true(n >= 8);
  uint64_t h = 0;
  for (int k = 0; k < 8; k++) h |= (uint64_t)p[k] << (8 * k);
  assert_true(h <= n - 8);
  json_error_t err;
  json_t *root = json_loadb((const char *)p + 8, (size_t)h, JSON_REJECT_DUPLICATES, &err);
  if (!root) fail_msg("%s: header does not parse: %s", path, err.text);
  /* padding: spaces only, and the data starts 8-aligned */
  size_t end = (size_t)h;
  while (end && p[8 + end - 1] == ' ') end--;
  assert_int_equal(p[8 + end - 1], '}');
  free(p);
  *hlen = (size_t)h;
  *file_size = n;
  return root;
}

static const char *st_dtype(hq_dtype t) {
  switch (t) {
  case HQ_F32: return "F32";
  case HQ_F16: return "F16";
  case HQ_BF16: return "BF16";
  case HQ_E4M3: return "F8_E4M3";
  case HQ_E5M2: return "F8_E5M2";
  case HQ_E8M0:
  case HQ_E2M1X2:
  case HQ_E3M2X4:
  case HQ_E2M3X4:
  case HQ_U8: return "U8";
  case HQ_I8: return "I8";
  case HQ_I32: return "I32";
  default: return "?";
  }
}

/* The data section of `root` is exactly the entries, contiguous, in the header's key order. */
static void check_layout(json_t *root, size_t hlen, size_t file_size) {
  assert_int_equal(hlen % 8, 0);
  uint64_t at = 0;
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (!strcmp(key, "__metadata__")) continue;
    json_t *offs = json_object_get(v, "data_offsets");
    assert_int_equal(json_array_size(offs), 2);
    assert_int_equal(json_integer_value(json_array_get(offs, 0)), at);
    at = (uint64_t)json_integer_value(json_array_get(offs, 1));
  }
  assert_int_equal(8 + hlen + at, file_size);
}

static void check_entry(json_t *root, const char *name, const char *dtype, int ndim,
                        const int64_t *shape) {
  json_t *e = json_object_get(root, name);
  if (!e) fail_msg("no entry '%s'", name);
  assert_string_equal(json_string_value(json_object_get(e, "dtype")), dtype);
  json_t *s = json_object_get(e, "shape");
  if (ndim >= 0) {
    assert_int_equal(json_array_size(s), ndim);
    for (int k = 0; k < ndim; k++) assert_int_equal(json_integer_value(json_array_get(s, k)), shape[k]);
  }
}

// --- round trips ----------------------------------------------------------------------------

typedef struct cfg {
  const char *name;          /* tensor name in the file */
  const char *row, *col;     /* specs (NULL: identity) */
  int source;
  uint32_t usage;
  int64_t rows, cols;
  hq_dtype src_dtype;
} cfg;

static const cfg k_cfgs[] = {
    {"fp8_tensor", "fp8_tensor", "fp8_tensor", 0, HQ_BOTH, 128, 256, HQ_F32},
    {"fp8_tensor_e5m2", "fp8_tensor:dtype=e5m2,power_2_scales=true",
     "fp8_tensor:dtype=e5m2,power_2_scales=true", 0, HQ_BOTH, 96, 160, HQ_BF16},
    {"mxfp8", "mxfp8", "mxfp8", 0, HQ_BOTH, 128, 256, HQ_F32},
    {"mxfp8_swizzle", "mxfp8:swizzle=true", "mxfp8:swizzle=true", 0, HQ_BOTH, 128, 256, HQ_BF16},
    {"mxfp8_2d", "mxfp8:block_2d=true", "mxfp8:block_2d=true", 0, HQ_BOTH, 64, 128, HQ_F32},
    {"nvfp4", "nvfp4", "nvfp4", 0, HQ_BOTH, 128, 256, HQ_F32},
    {"nvfp4_rht", "nvfp4:rht=true", "nvfp4:rht=true", 0, HQ_BOTH, 128, 256, HQ_BF16},
    {"nvfp4_2d", "nvfp4:block_2d=true", "nvfp4:block_2d=true", 0, HQ_BOTH, 64, 128, HQ_F32},
    {"nvfp4_sr_swizzle", "nvfp4:stochastic_rounding=true,swizzle=true",
     "nvfp4:stochastic_rounding=true,swizzle=true", 0, HQ_BOTH, 128, 128, HQ_F32},
    {"nvfp4_row", "nvfp4:global_scale=row", "nvfp4:global_scale=row", 0, HQ_BOTH, 128, 256,
     HQ_BF16},
    {"nvfp4_ue5m3", "nvfp4:scale_dtype=ue5m3", "nvfp4:scale_dtype=ue5m3,rht=true", 0, HQ_BOTH,
     64, 128, HQ_F32},
    {"nvfp4_ue5m3_none", "nvfp4:scale_dtype=ue5m3,global_scale=none,swizzle=true",
     "nvfp4:scale_dtype=ue5m3,global_scale=none,stochastic_rounding=true", 0, HQ_BOTH, 64, 96,
     HQ_F32},
    {"hybrid.nvrow_mx", "nvfp4:global_scale=row,scale_dtype=ue5m3", "mxfp8", 0, HQ_BOTH, 64,
     128, HQ_BF16},
    {"fp8_block_1d", "fp8_block", "fp8_block", 0, HQ_BOTH, 128, 256, HQ_F32},
    {"fp8_block_2d", "fp8_block:block=2d", "fp8_block:block=2d", 0, HQ_BOTH, 200, 300, HQ_BF16},
    {"identity_bf16", NULL, NULL, 0, HQ_BOTH, 33, 65, HQ_BF16},
    {"identity_f32_row", NULL, NULL, 0, HQ_ROWWISE, 17, 9, HQ_F32},
    {"hybrid.mx_nv", "mxfp8", "nvfp4:rht=true", 0, HQ_BOTH, 128, 256, HQ_BF16},
    {"hybrid.deq", "fp8_tensor", "mxfp8", HQ_SOURCE_ROWWISE_DEQUANTIZED, HQ_BOTH, 64, 64, HQ_F32},
    {"colwise_only.fp8", "fp8_tensor", "fp8_tensor", 0, HQ_COLWISE, 64, 96, HQ_F32},
    {"colwise_only.nvfp4", "nvfp4", "nvfp4", 0, HQ_COLWISE, 64, 96, HQ_F32},
    {"rowwise_only.mxfp8", "mxfp8", "mxfp8", 0, HQ_ROWWISE, 64, 96, HQ_F32},
};
#define N_CFGS (sizeof k_cfgs / sizeof k_cfgs[0])

static hq_qtensor *quantize_cfg(const cfg *c, uint64_t seed) {
  hq_quantizer *q = mkq(c->row, c->col, c->source, c->usage);
  hq_tensor x = hq_test_tensor(c->src_dtype, c->rows, c->cols, seed, 3.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &x, &qt));
  free(x.data);
  hq_quantizer_free(q);
  return qt;
}
static hq_qtensor *empty_cfg(const cfg *c) {
  hq_quantizer *q = mkq(c->row, c->col, c->source, c->usage);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(q, g_ctx, c->rows, c->cols, c->src_dtype, &qt));
  hq_quantizer_free(q);
  return qt;
}

static void test_round_trip(void **state) {
  (void)state;
  const char *path = tpath("all.safetensors");
  hq_qtensor *orig[N_CFGS];
  hq_ckpt_writer *w = NULL;
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(path, &w));
  for (size_t i = 0; i < N_CFGS; i++) {
    orig[i] = quantize_cfg(&k_cfgs[i], 100 + i);
    HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, k_cfgs[i].name, orig[i]));
  }
  hq_tensor pf = hq_test_tensor(HQ_F32, 7, 13, 1, 1.0f), pb = hq_test_tensor(HQ_BF16, 5, 9, 2, 1.0f);
  hq_tensor ph = hq_test_tensor(HQ_F16, 3, 4, 3, 1.0f);
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "adam/m", &pf));
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "master.bf16", &pb));
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "half", &ph));
  HQ_OK_OR_FAIL(hq_ckpt_add_meta(w, "step", "42"));
  HQ_OK_OR_FAIL(hq_ckpt_add_meta(w, "train/rng_offset", "123456789"));
  /* the writer holds a snapshot: changing the source now does not change the file */
  const float keep = ((float *)pf.data)[0];
  ((float *)pf.data)[0] = 1234.5f;
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  ((float *)pf.data)[0] = keep;
  assert_false(dir_has_prefix("all.safetensors.tmp."));

  hq_ckpt *c = NULL;
  HQ_OK_OR_FAIL(hq_ckpt_open(path, &c));
  assert_string_equal(hq_ckpt_meta(c, "step"), "42");
  assert_string_equal(hq_ckpt_meta(c, "train/rng_offset"), "123456789");
  assert_string_equal(hq_ckpt_meta(c, "hq_version"), hq_version());
  assert_null(hq_ckpt_meta(c, "nope"));
  for (size_t i = 0; i < N_CFGS; i++) {
    hq_qtensor *qt = empty_cfg(&k_cfgs[i]);
    HQ_OK_OR_FAIL(hq_ckpt_load_qtensor(c, g_ctx, k_cfgs[i].name, qt));
    assert_same_qt(orig[i], qt, k_cfgs[i].name);
    /* and the values: dequantized, both directions equal */
    for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
      if (!(hq_qtensor_dirs(qt) & dir)) continue;
      hq_tensor a = hq_test_empty(HQ_F32, k_cfgs[i].rows, k_cfgs[i].cols);
      hq_tensor b = hq_test_empty(HQ_F32, k_cfgs[i].rows, k_cfgs[i].cols);
      HQ_OK_OR_FAIL(hq_dequantize(orig[i], g_ctx, dir, &a));
      HQ_OK_OR_FAIL(hq_dequantize(qt, g_ctx, dir, &b));
      assert_memory_equal(a.data, b.data, (size_t)(a.rows * a.cols) * 4);
      free(a.data);
      free(b.data);
    }
    hq_qtensor_free(qt);
  }
  hq_tensor lf = hq_test_empty(HQ_F32, 7, 13), lb = hq_test_empty(HQ_BF16, 5, 9);
  hq_tensor lh = hq_test_empty(HQ_F16, 3, 4);
  HQ_OK_OR_FAIL(hq_ckpt_load_tensor(c, g_ctx, "adam/m", &lf));
  HQ_OK_OR_FAIL(hq_ckpt_load_tensor(c, g_ctx, "master.bf16", &lb));
  HQ_OK_OR_FAIL(hq_ckpt_load_tensor(c, g_ctx, "half", &lh));
  assert_memory_equal(lf.data, pf.data, 7 * 13 * 4);
  assert_memory_equal(lb.data, pb.data, 5 * 9 * 2);
  assert_memory_equal(lh.data, ph.data, 3 * 4 * 2);
  hq_ckpt_close(c);

  /* the same calls write the same bytes (deterministic) */
  const char *path2 = tpath("all2.safetensors");
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(path2, &w));
  for (size_t i = 0; i < N_CFGS; i++)
    HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, k_cfgs[i].name, orig[i]));
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "adam/m", &pf));
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "master.bf16", &pb));
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "half", &ph));
  HQ_OK_OR_FAIL(hq_ckpt_add_meta(w, "step", "42"));
  HQ_OK_OR_FAIL(hq_ckpt_add_meta(w, "train/rng_offset", "123456789"));
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  size_t n1, n2;
  unsigned char *f1 = read_file(path, &n1), *f2 = read_file(path2, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(f1, f2, n1);
  free(f1);
  free(f2);

  for (size_t i = 0; i < N_CFGS; i++) hq_qtensor_free(orig[i]);
  free(pf.data);
  free(pb.data);
  free(ph.data);
  free(lf.data);
  free(lb.data);
  free(lh.data);
}

/* The header, read here with jansson, against expectations written by hand. */
static void test_header_content(void **state) {
  (void)state;
  const char *path = tpath("all.safetensors"); /* written by test_round_trip */
  size_t hlen, size;
  json_t *root = read_header(path, &hlen, &size);
  check_layout(root, hlen, size);
  /* __metadata__ first, string -> string */
  const char *first = json_object_iter_key(json_object_iter(root));
  assert_string_equal(first, "__metadata__");
  json_t *meta = json_object_get(root, "__metadata__");
  const char *key;
  json_t *v;
  json_object_foreach(meta, key, v) assert_true(json_is_string(v));
  assert_string_equal(json_string_value(json_object_get(meta, "hq_version")), hq_version());
  assert_string_equal(json_string_value(json_object_get(meta, "step")), "42");

  /* fp8_tensor, both directions from one call: the columnwise storage shares scale_inv and amax
     with the rowwise one, so they are stored once */
  const int64_t rc[2] = {128, 256}, cr[2] = {256, 128}, one[1] = {1};
  check_entry(root, "fp8_tensor/data", "F8_E4M3", 2, rc);
  check_entry(root, "fp8_tensor/scale_inv", "F32", 1, one);
  check_entry(root, "fp8_tensor/amax", "F32", 1, one);
  check_entry(root, "fp8_tensor/columnwise_data", "F8_E4M3", 2, cr);
  assert_null(json_object_get(root, "fp8_tensor/columnwise_scale_inv"));
  assert_null(json_object_get(root, "fp8_tensor/columnwise_amax"));
  const int64_t e5[2] = {96, 160};
  check_entry(root, "fp8_tensor_e5m2/data", "F8_E5M2", 2, e5);
  /* mxfp8: FP8 data, E8M0 scales stored as U8 */
  check_entry(root, "mxfp8/data", "F8_E4M3", 2, rc);
  check_entry(root, "mxfp8/scale_inv", "U8", -1, NULL);
  check_entry(root, "mxfp8/columnwise_scale_inv", "U8", -1, NULL);
  /* nvfp4: packed E2M1 bytes as U8 [rows, cols/2], E4M3 block scales, an F32 amax */
  const int64_t half[2] = {128, 128};
  check_entry(root, "nvfp4/data", "U8", 2, half);
  check_entry(root, "nvfp4/scale_inv", "F8_E4M3", -1, NULL);
  check_entry(root, "nvfp4/amax", "F32", 1, one);
  /* fp8_block: F32 block scales */
  check_entry(root, "fp8_block_2d/scale_inv", "F32", -1, NULL);
  /* identity: the data in the source dtype, shared between the directions (stored once) */
  const int64_t id[2] = {33, 65};
  check_entry(root, "identity_bf16/data", "BF16", 2, id);
  assert_null(json_object_get(root, "identity_bf16/columnwise_data"));
  /* columnwise-only: the columnwise storage owns all its buffers */
  check_entry(root, "colwise_only.fp8/columnwise_scale_inv", "F32", 1, one);
  assert_null(json_object_get(root, "colwise_only.fp8/data"));
  /* plain tensors */
  const int64_t pf[2] = {7, 13}, pb[2] = {5, 9}, ph[2] = {3, 4};
  check_entry(root, "adam/m", "F32", 2, pf);
  check_entry(root, "master.bf16", "BF16", 2, pb);
  check_entry(root, "half", "F16", 2, ph);
  assert_null(json_object_get(meta, "adam/m/hq"));

  /* the entries of every quantized tensor are its storages' buffers, as the API lists them */
  for (size_t i = 0; i < N_CFGS; i++) {
    hq_qtensor *qt = quantize_cfg(&k_cfgs[i], 100 + i);
    for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
      const hq_storage *st = hq_qtensor_storage(qt, dir);
      for (uint32_t b = 0; st && b < st->nbuf; b++) {
        const hq_buffer *buf = hq_storage_cbuf(st, b);
        if (dir == HQ_COLWISE && (buf->flags & HQ_BUF_SHARED) && hq_qtensor_storage(qt, HQ_ROWWISE))
          continue; /* stored with the rowwise storage */
        char name[256];
        snprintf(name, sizeof name, "%s/%s", k_cfgs[i].name, buf->name);
        check_entry(root, name, st_dtype(buf->dtype), buf->ndim, buf->shape);
      }
    }
    hq_qtensor_free(qt);
  }

  /* "<name>/hq" of fp8_tensor, field by field */
  json_error_t err;
  json_t *m = json_loads(json_string_value(json_object_get(meta, "fp8_tensor/hq")), 0, &err);
  if (!m) fail_msg("fp8_tensor/hq: %s", err.text);
  assert_int_equal(json_integer_value(json_object_get(m, "hq_checkpoint")), 1);
  assert_string_equal(json_string_value(json_object_get(m, "role")), "(direct)");
  assert_int_equal(json_integer_value(json_object_get(m, "rows")), 128);
  assert_int_equal(json_integer_value(json_object_get(m, "cols")), 256);
  assert_string_equal(json_string_value(json_object_get(m, "nominal")), "f32");
  assert_string_equal(json_string_value(json_object_get(m, "columnwise_source")), "original");
  json_t *dirs = json_object_get(m, "directions");
  assert_int_equal(json_array_size(dirs), 2);
  assert_string_equal(json_string_value(json_array_get(dirs, 0)), "rowwise");
  assert_string_equal(json_string_value(json_array_get(dirs, 1)), "columnwise");
  assert_int_equal(json_array_size(json_object_get(m, "usage")), 2);
  json_t *fr = json_object_get(json_object_get(m, "formats"), "rowwise");
  assert_string_equal(json_string_value(json_object_get(fr, "plugin")), "fp8_tensor");
  assert_string_equal(json_string_value(json_object_get(fr, "format")), "fp8_tensor");
  const hq_plugin *p = hq_plugins_find(g_set, "fp8_tensor");
  assert_string_equal(json_string_value(json_object_get(fr, "plugin_version")),
                      hq_plugin_version(p));
  /* the options in table order, defaults resolved */
  json_t *opts = json_object_get(fr, "options");
  const hq_option *o = hq_plugin_options(p);
  size_t no = 0;
  for (; o[no].name; no++) {
    char want[128];
    snprintf(want, sizeof want, "%s=%s", o[no].name, o[no].def);
    assert_string_equal(json_string_value(json_array_get(opts, no)), want);
  }
  assert_int_equal(json_array_size(opts), no);
  static const struct {
    const char *entry, *name, *dir, *dtype;
    int shared;
  } want[] = {
      {"fp8_tensor/data", "data", "rowwise", "e4m3", 0},
      {"fp8_tensor/scale_inv", "scale_inv", "rowwise", "f32", 0},
      {"fp8_tensor/amax", "amax", "rowwise", "f32", 0},
      {"fp8_tensor/columnwise_data", "columnwise_data", "columnwise", "e4m3", 0},
      {"fp8_tensor/scale_inv", "scale_inv", "columnwise", "f32", 1},
      {"fp8_tensor/amax", "amax", "columnwise", "f32", 1},
  };
  json_t *bufs = json_object_get(m, "buffers");
  assert_int_equal(json_array_size(bufs), 6);
  for (size_t i = 0; i < 6; i++) {
    json_t *b = json_array_get(bufs, i);
    assert_string_equal(json_string_value(json_object_get(b, "entry")), want[i].entry);
    assert_string_equal(json_string_value(json_object_get(b, "name")), want[i].name);
    assert_string_equal(json_string_value(json_object_get(b, "direction")), want[i].dir);
    assert_string_equal(json_string_value(json_object_get(b, "dtype")), want[i].dtype);
    assert_int_equal(json_is_true(json_object_get(b, "shared")), want[i].shared);
  }
  json_decref(m);

  /* nvfp4 with RHT on a hybrid: the options as given, the hq dtypes of U8-stored buffers */
  m = json_loads(json_string_value(json_object_get(meta, "hybrid.mx_nv/hq")), 0, &err);
  if (!m) fail_msg("hybrid.mx_nv/hq: %s", err.text);
  json_t *fc = json_object_get(json_object_get(m, "formats"), "columnwise");
  assert_string_equal(json_string_value(json_object_get(fc, "plugin")), "nvfp4");
  assert_string_equal(json_string_value(json_array_get(json_object_get(fc, "options"), 0)),
                      "rht=true");
  assert_string_equal(json_string_value(json_object_get(json_object_get(json_object_get(m,
                      "formats"), "rowwise"), "plugin")), "mxfp8");
  assert_string_equal(json_string_value(json_object_get(m, "nominal")), "bf16");
  int saw_e8m0 = 0, saw_fp4 = 0;
  bufs = json_object_get(m, "buffers");
  for (size_t i = 0; i < json_array_size(bufs); i++) {
    const char *dt = json_string_value(json_object_get(json_array_get(bufs, i), "dtype"));
    saw_e8m0 += !strcmp(dt, "e8m0");
    saw_fp4 += !strcmp(dt, "e2m1x2");
  }
  assert_int_equal(saw_e8m0, 1);
  assert_int_equal(saw_fp4, 1);
  json_decref(m);
  m = json_loads(json_string_value(json_object_get(meta, "colwise_only.fp8/hq")), 0, &err);
  assert_non_null(m);
  assert_int_equal(json_array_size(json_object_get(m, "directions")), 1);
  assert_string_equal(json_string_value(json_array_get(json_object_get(m, "directions"), 0)),
                      "columnwise");
  json_decref(m);
  m = json_loads(json_string_value(json_object_get(meta, "hybrid.deq/hq")), 0, &err);
  assert_string_equal(json_string_value(json_object_get(m, "columnwise_source")),
                      "rowwise_dequantized");
  json_decref(m);
  json_decref(root);
}

/* A columnwise buffer shared with the rowwise storage on one side and a private copy (after a
   one-direction update) on the other, both ways round. */
static void test_shared_private(void **state) {
  (void)state;
  const cfg *c = &k_cfgs[0]; /* fp8_tensor, both directions, shared scale_inv and amax */
  hq_qtensor *a = quantize_cfg(c, 7);
  hq_tensor y = hq_test_tensor(HQ_F32, c->rows, c->cols, 8, 50.0f);
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(a, HQ_ROWWISE));
  HQ_OK_OR_FAIL(hq_qtensor_update(a, g_ctx, &y)); /* rowwise only: the columnwise scale is kept */
  const hq_storage *ca = hq_qtensor_storage(a, HQ_COLWISE);
  assert_string_equal(hq_storage_cbuf(ca, 1)->name, "columnwise_scale_inv");
  const char *path = tpath("private.safetensors");
  hq_ckpt_writer *w;
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(path, &w));
  HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, "w", a));
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  size_t hlen, size;
  json_t *root = read_header(path, &hlen, &size);
  check_layout(root, hlen, size);
  const int64_t one[1] = {1};
  check_entry(root, "w/columnwise_scale_inv", "F32", 1, one);
  check_entry(root, "w/columnwise_amax", "F32", 1, one);
  json_decref(root);

  hq_ckpt *ck;
  HQ_OK_OR_FAIL(hq_ckpt_open(path, &ck));
  hq_qtensor *b = empty_cfg(c); /* shared, as made */
  assert_string_equal(hq_storage_cbuf(hq_qtensor_storage(b, HQ_COLWISE), 1)->name, "scale_inv");
  HQ_OK_OR_FAIL(hq_ckpt_load_qtensor(ck, g_ctx, "w", b));
  const hq_storage *cb = hq_qtensor_storage(b, HQ_COLWISE);
  assert_string_equal(hq_storage_cbuf(cb, 1)->name, "columnwise_scale_inv");
  assert_ptr_not_equal(hq_storage_cbuf(cb, 1)->ptr,
                       hq_storage_cbuf(hq_qtensor_storage(b, HQ_ROWWISE), 1)->ptr);
  assert_same_qt(a, b, "private -> shared");
  /* a later update of both directions shares again, and equals a fresh quantize */
  HQ_OK_OR_FAIL(hq_qtensor_update(b, g_ctx, &y));
  hq_ckpt_close(ck);

  /* shared in the file, private in the destination */
  hq_qtensor *s = quantize_cfg(c, 9);
  const char *path2 = tpath("shared.safetensors");
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(path2, &w));
  HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, "w", s));
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  hq_qtensor *d = empty_cfg(c);
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(d, HQ_ROWWISE));
  HQ_OK_OR_FAIL(hq_qtensor_update(d, g_ctx, &y)); /* unshares */
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(d, HQ_BOTH));
  assert_string_equal(hq_storage_cbuf(hq_qtensor_storage(d, HQ_COLWISE), 1)->name,
                      "columnwise_scale_inv");
  HQ_OK_OR_FAIL(hq_ckpt_open(path2, &ck));
  HQ_OK_OR_FAIL(hq_ckpt_load_qtensor(ck, g_ctx, "w", d));
  assert_same_qt(s, d, "shared -> private");
  hq_ckpt_close(ck);

  hq_qtensor_free(a);
  hq_qtensor_free(b);
  hq_qtensor_free(s);
  hq_qtensor_free(d);
  free(y.data);
}

// --- refusals ----------------------------------------------------------------------------

static void write_one(const char *path, const cfg *c, hq_qtensor **out) {
  hq_qtensor *qt = quantize_cfg(c, 5);
  hq_ckpt_writer *w;
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(path, &w));
  HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, "layer.w", qt));
  hq_tensor t = hq_test_tensor(HQ_F32, 4, 6, 1, 1.0f);
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "opt.m", &t));
  free(t.data);
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  if (out) *out = qt;
  else hq_qtensor_free(qt);
}

/* Load `name` into a qtensor made for `c` that already holds data: expect `status`, messages
   naming each of `needles`, and no byte of the qtensor changed. */
static void refuse(hq_ckpt *ck, const char *name, const cfg *c, int status,
                   const char *const *needles) {
  hq_qtensor *qt = quantize_cfg(c, 77);
  snap s = take_snap(qt);
  int rc = hq_ckpt_load_qtensor(ck, g_ctx, name, qt);
  if (rc != status)
    fail_msg("load of '%s' into %s: status %d, want %d (%s)", name, c->name, rc, status,
             hq_last_error());
  for (size_t i = 0; needles && needles[i]; i++) HQ_ERROR_HAS(needles[i]);
  assert_true(same_snap(qt, &s));
  free(s.bytes);
  hq_qtensor_free(qt);
}

static void test_mismatch(void **state) {
  (void)state;
  const char *path = tpath("mismatch.safetensors");
  const cfg saved = {"mx", "mxfp8", "mxfp8", 0, HQ_BOTH, 64, 128, HQ_F32};
  write_one(path, &saved, NULL);
  hq_ckpt *ck;
  HQ_OK_OR_FAIL(hq_ckpt_open(path, &ck));
  /* the matching one loads */
  hq_qtensor *ok = empty_cfg(&saved);
  HQ_OK_OR_FAIL(hq_ckpt_load_qtensor(ck, g_ctx, "layer.w", ok));
  hq_qtensor_free(ok);

  const cfg other_format = {"f8", "fp8_tensor", "fp8_tensor", 0, HQ_BOTH, 64, 128, HQ_F32};
  const char *n1[] = {path, "layer.w", "mxfp8", "fp8_tensor", NULL};
  refuse(ck, "layer.w", &other_format, HQ_EINVAL, n1);

  const cfg other_opt = {"mx5", "mxfp8:dtype=e5m2", "mxfp8:dtype=e5m2", 0, HQ_BOTH, 64, 128, HQ_F32};
  const char *n2[] = {path, "layer.w", "dtype=e4m3", "dtype=e5m2", "rowwise", NULL};
  refuse(ck, "layer.w", &other_opt, HQ_EINVAL, n2);

  const cfg other_col = {"mxsw", "mxfp8", "mxfp8:swizzle=true", 0, HQ_BOTH, 64, 128, HQ_F32};
  const char *n3[] = {"columnwise", "swizzle=false", "swizzle=true", NULL};
  refuse(ck, "layer.w", &other_col, HQ_EINVAL, n3);

  const cfg other_shape = {"mxs", "mxfp8", "mxfp8", 0, HQ_BOTH, 128, 64, HQ_F32};
  const char *n4[] = {path, "layer.w", "[64, 128]", "[128, 64]", NULL};
  refuse(ck, "layer.w", &other_shape, HQ_EINVAL, n4);

  const cfg other_dirs = {"mxr", "mxfp8", "mxfp8", 0, HQ_ROWWISE, 64, 128, HQ_F32};
  const char *n5[] = {"directions differ", "rowwise+columnwise", NULL};
  refuse(ck, "layer.w", &other_dirs, HQ_EINVAL, n5);

  const cfg other_hybrid = {"mxnv", "mxfp8", "nvfp4", 0, HQ_BOTH, 64, 128, HQ_F32};
  const char *n6[] = {"columnwise", "mxfp8", "nvfp4", NULL};
  refuse(ck, "layer.w", &other_hybrid, HQ_EINVAL, n6);

  const char *n7[] = {path, "missing.w", NULL};
  refuse(ck, "missing.w", &saved, HQ_ENOENT, n7);

  const char *n8[] = {"plain tensor", NULL};
  refuse(ck, "opt.m", &saved, HQ_EINVAL, n8);
  const char *n9[] = {"layer.w/data", "not a quantized tensor", NULL};
  refuse(ck, "layer.w/data", &saved, HQ_EINVAL, n9); /* entries are not quantized tensors */

  /* plain tensors: dtype, shape, missing, quantized */
  hq_tensor t = hq_test_empty(HQ_BF16, 4, 6);
  assert_int_equal(hq_ckpt_load_tensor(ck, g_ctx, "opt.m", &t), HQ_EINVAL);
  HQ_ERROR_HAS("F32 [4, 6]");
  HQ_ERROR_HAS("BF16 [4, 6]");
  free(t.data);
  t = hq_test_empty(HQ_F32, 6, 4);
  assert_int_equal(hq_ckpt_load_tensor(ck, g_ctx, "opt.m", &t), HQ_EINVAL);
  HQ_ERROR_HAS("[6, 4]");
  for (int i = 0; i < 24; i++) assert_true(((float *)t.data)[i] == 0.0f);
  assert_int_equal(hq_ckpt_load_tensor(ck, g_ctx, "nothing", &t), HQ_ENOENT);
  HQ_ERROR_HAS("nothing");
  assert_int_equal(hq_ckpt_load_tensor(ck, g_ctx, "layer.w", &t), HQ_EINVAL);
  HQ_ERROR_HAS("hq_ckpt_load_qtensor");
  assert_int_equal(hq_ckpt_load_tensor(ck, g_ctx, "__metadata__", &t), HQ_ENOENT);
  free(t.data);

  /* a saved (offloaded) qtensor is refused both ways */
  hq_qtensor *qs = empty_cfg(&saved);
  hq_saved_buffer sv[8];
  size_t n;
  HQ_OK_OR_FAIL(hq_qtensor_save(qs, sv, 8, sizeof sv[0], &n));
  assert_int_equal(hq_ckpt_load_qtensor(ck, g_ctx, "layer.w", qs), HQ_ESTATE);
  hq_ckpt_writer *w;
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(tpath("saved.safetensors"), &w));
  assert_int_equal(hq_ckpt_add_qtensor(w, g_ctx, "x", qs), HQ_ESTATE);
  HQ_ERROR_HAS("restore");
  hq_ckpt_writer_abort(w);
  assert_false(exists(tpath("saved.safetensors")));
  assert_false(dir_has_prefix("saved.safetensors"));
  HQ_OK_OR_FAIL(hq_qtensor_restore(qs, sv, n, sizeof sv[0]));
  hq_qtensor_free(qs);
  hq_ckpt_close(ck);

  /* NULL arguments */
  assert_int_equal(hq_ckpt_open(NULL, &ck), HQ_EINVAL);
  assert_int_equal(hq_ckpt_open(tpath("does-not-exist"), &ck), HQ_ENOENT);
  assert_null(ck);
  assert_int_equal(hq_ckpt_writer_open(NULL, &w), HQ_EINVAL);
  assert_int_equal(hq_ckpt_writer_close(NULL), HQ_EINVAL);
  hq_ckpt_writer_abort(NULL);
  hq_ckpt_close(NULL);
  assert_null(hq_ckpt_meta(NULL, "x"));
}

/* nvfp4's global_scale and scale_dtype are stored and compared by name like every option: a
   row-scaled checkpoint does not load into a per-tensor quantizer, nor E4M3 into UE5M3. */
static void test_nvfp4_options_mismatch(void **state) {
  (void)state;
  const char *path = tpath("nvopts.safetensors");
  const cfg nv_row = {"nvr", "nvfp4:global_scale=row", "mxfp8", 0, HQ_BOTH, 64, 128, HQ_F32};
  write_one(path, &nv_row, NULL);
  hq_ckpt *ck;
  HQ_OK_OR_FAIL(hq_ckpt_open(path, &ck));
  hq_qtensor *ok = empty_cfg(&nv_row);
  HQ_OK_OR_FAIL(hq_ckpt_load_qtensor(ck, g_ctx, "layer.w", ok));
  hq_qtensor_free(ok);
  const cfg nv_tensor = {"nvt", "nvfp4", "mxfp8", 0, HQ_BOTH, 64, 128, HQ_F32};
  const char *n1[] = {"layer.w", "global_scale=row", "global_scale=tensor", "rowwise", NULL};
  refuse(ck, "layer.w", &nv_tensor, HQ_EINVAL, n1);
  const cfg nv_ue = {"nvu", "nvfp4:global_scale=row,scale_dtype=ue5m3", "mxfp8", 0, HQ_BOTH, 64,
                     128, HQ_F32};
  const char *n2[] = {"layer.w", "scale_dtype=e4m3", "scale_dtype=ue5m3", NULL};
  refuse(ck, "layer.w", &nv_ue, HQ_EINVAL, n2);
  hq_ckpt_close(ck);
}

static void test_writer_rules(void **state) {
  (void)state;
  const char *path = tpath("rules.safetensors");
  hq_ckpt_writer *w;
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(path, &w));
  hq_tensor t = hq_test_tensor(HQ_F32, 2, 3, 1, 1.0f);
  char longname[1100];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  const char *bad[] = {"", "/a", "a/", "a//b", "__metadata__", "bad\xff", "tab\there",
                       "\xc0\xaf", "\xed\xa0\x80", longname};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = hq_ckpt_add_tensor(w, g_ctx, bad[i], &t);
    if (rc != HQ_EINVAL) fail_msg("name %zu accepted (%d)", i, rc);
  }
  assert_int_equal(hq_ckpt_add_tensor(w, g_ctx, NULL, &t), HQ_EINVAL);
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "a/b", &t));
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "ü/é", &t)); /* UTF-8 is fine */
  assert_int_equal(hq_ckpt_add_tensor(w, g_ctx, "a/b", &t), HQ_EINVAL);
  HQ_ERROR_HAS("already");
  assert_int_equal(hq_ckpt_add_tensor(w, g_ctx, "a", &t), HQ_EINVAL); /* a/b lies under it */
  assert_int_equal(hq_ckpt_add_tensor(w, g_ctx, "a/b/c", &t), HQ_EINVAL);
  HQ_ERROR_HAS("lies under");
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "a/bc", &t));
  hq_qtensor *qt = quantize_cfg(&k_cfgs[0], 3);
  HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, "q", qt));
  assert_int_equal(hq_ckpt_add_tensor(w, g_ctx, "q/data", &t), HQ_EINVAL);
  assert_int_equal(hq_ckpt_add_qtensor(w, g_ctx, "q", qt), HQ_EINVAL);
  assert_int_equal(hq_ckpt_add_meta(w, "q/hq", "x"), HQ_EINVAL);
  assert_int_equal(hq_ckpt_add_meta(w, "q/mine", "x"), HQ_EINVAL);
  HQ_ERROR_HAS("lies under");
  assert_int_equal(hq_ckpt_add_meta(w, "hq_version", "x"), HQ_EINVAL);
  HQ_OK_OR_FAIL(hq_ckpt_add_meta(w, "run/seed", "1"));
  assert_int_equal(hq_ckpt_add_meta(w, "run/seed", "2"), HQ_EINVAL);
  assert_int_equal(hq_ckpt_add_tensor(w, g_ctx, "run", &t), HQ_EINVAL); /* run/seed is a key */
  assert_int_equal(hq_ckpt_add_meta(w, "", "x"), HQ_EINVAL);
  assert_int_equal(hq_ckpt_add_meta(w, "k", "bad\xff"), HQ_EINVAL);
  /* a wrong tensor: no change to the writer */
  hq_tensor bad_t = t;
  bad_t.dtype = HQ_E4M3;
  assert_int_equal(hq_ckpt_add_tensor(w, g_ctx, "x", &bad_t), HQ_EINVAL);
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "x", &t)); /* the failed add did not take "x" */
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  hq_ckpt *ck;
  HQ_OK_OR_FAIL(hq_ckpt_open(path, &ck));
  hq_tensor l = hq_test_empty(HQ_F32, 2, 3);
  HQ_OK_OR_FAIL(hq_ckpt_load_tensor(ck, g_ctx, "ü/é", &l));
  assert_memory_equal(l.data, t.data, 24);
  assert_string_equal(hq_ckpt_meta(ck, "run/seed"), "1");
  hq_ckpt_close(ck);
  free(l.data);

  /* I/O: a directory that does not exist; a directory at the path (refused at open, no temporary
     file: the rename onto it would fail) */
  assert_int_equal(hq_ckpt_writer_open(tpath("no/such/dir.safetensors"), &w), HQ_EIO);
  assert_null(w);
  const char *dpath = tpath("a_directory");
  mkdir(dpath, 0755);
  assert_int_equal(hq_ckpt_writer_open(dpath, &w), HQ_EIO);
  HQ_ERROR_HAS("not a regular file (a directory)");
  assert_null(w);
  assert_false(dir_has_prefix("a_directory.tmp"));
  rmdir(dpath);
  /* an empty checkpoint is a valid file */
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(tpath("empty.safetensors"), &w));
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  HQ_OK_OR_FAIL(hq_ckpt_open(tpath("empty.safetensors"), &ck));
  assert_string_equal(hq_ckpt_meta(ck, "hq_version"), hq_version());
  hq_ckpt_close(ck);
  hq_qtensor_free(qt);
  free(t.data);
}

// --- hostile files -------------------------------------------------------------------------

/* The small valid file of the hostile tests: an fp8_tensor and an nvfp4 qtensor, a plain f32
   tensor and metadata. */
static const cfg k_small[] = {
    {"f8", "fp8_tensor", "fp8_tensor", 0, HQ_BOTH, 16, 32, HQ_F32},
    {"nv", "nvfp4", "nvfp4", 0, HQ_ROWWISE, 16, 32, HQ_F32},
};
static void write_small(const char *path) {
  hq_ckpt_writer *w;
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(path, &w));
  for (int i = 0; i < 2; i++) {
    hq_qtensor *qt = quantize_cfg(&k_small[i], 11 + (uint64_t)i);
    HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, k_small[i].name, qt));
    hq_qtensor_free(qt);
  }
  hq_tensor t = hq_test_tensor(HQ_F32, 3, 5, 4, 1.0f);
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "p", &t));
  free(t.data);
  HQ_OK_OR_FAIL(hq_ckpt_add_meta(w, "step", "7"));
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
}

static int known_status(int rc) {
  return rc == HQ_EPARSE || rc == HQ_EIO || rc == HQ_EINVAL || rc == HQ_ENOENT ||
         rc == HQ_ENOTSUP || rc == HQ_ESHAPE;
}

/* Open `path` and try to load everything the small file holds: each call either succeeds or
   fails cleanly with a message. Returns the open status. */
static int try_everything(const char *path, hq_qtensor **dst) {
  hq_ckpt *ck = NULL;
  int rc = open_nv(path, &ck);
  if (rc) {
    if (!known_status(rc)) fail_msg("open: unexpected status %d (%s)", rc, hq_last_error());
    assert_true(hq_last_error()[0] != '\0');
    assert_null(ck);
    return rc;
  }
  for (int i = 0; i < 2; i++) {
    int r = hq_ckpt_load_qtensor(ck, g_ctx, k_small[i].name, dst[i]);
    if (r && !known_status(r)) fail_msg("load: unexpected status %d (%s)", r, hq_last_error());
    if (r) assert_true(hq_last_error()[0] != '\0');
  }
  hq_tensor t = hq_test_empty(HQ_F32, 3, 5);
  int r = hq_ckpt_load_tensor(ck, g_ctx, "p", &t);
  if (r && !known_status(r)) fail_msg("load p: unexpected status %d", r);
  free(t.data);
  (void)hq_ckpt_meta(ck, "step");
  (void)hq_ckpt_meta(ck, "f8/hq");
  hq_ckpt_close(ck);
  return HQ_OK;
}

static void test_truncated(void **state) {
  (void)state;
  const char *path = tpath("small.safetensors"), *cut = tpath("cut.safetensors");
  write_small(path);
  size_t n;
  unsigned char *p = read_file(path, &n);
  hq_qtensor *dst[2] = {empty_cfg(&k_small[0]), empty_cfg(&k_small[1])};
  assert_int_equal(try_everything(path, dst), HQ_OK);
  for (size_t len = 0; len < n; len++) {
    write_file(cut, p, len);
    int rc = try_everything(cut, dst);
    if (rc != HQ_EPARSE) fail_msg("a file cut to %zu of %zu bytes: status %d (%s)", len, n, rc,
                                  hq_last_error());
  }
  /* one byte too many: trailing bytes belong to no entry */
  unsigned char *q = malloc(n + 1);
  memcpy(q, p, n);
  q[n] = 0;
  write_file(cut, q, n + 1);
  assert_int_equal(try_everything(cut, dst), HQ_EPARSE);
  HQ_ERROR_HAS("trailing");
  free(q);
  free(p);
  hq_qtensor_free(dst[0]);
  hq_qtensor_free(dst[1]);
}

/* A file of header text `h` and `n` data bytes must fail to open with `status`, the message
   holding `needle`. */
static void bad_file(const char *h, size_t n, int status, const char *needle) {
  const char *path = tpath("bad.safetensors");
  unsigned char data[256] = {0};
  assert_true(n <= sizeof data);
  write_st(path, h, data, n);
  hq_ckpt *ck = NULL;
  int rc = open_nv(path, &ck);
  if (rc != status) fail_msg("header %.120s: status %d, want %d (%s)", h, rc, status,
                             hq_last_error());
  assert_null(ck);
  if (needle) HQ_ERROR_HAS(needle);
  HQ_ERROR_HAS(path);
}

static void test_hostile_headers(void **state) {
  (void)state;
  const char *path = tpath("bad.safetensors");
  /* a minimal valid file, then one thing wrong at a time */
  write_st(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "12345678", 8);
  hq_ckpt *ck = NULL;
  HQ_OK_OR_FAIL(open_nv(path, &ck));
  assert_null(hq_ckpt_meta(ck, "hq_version")); /* no __metadata__: allowed */
  hq_ckpt_close(ck);

  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,9]}}", 8, HQ_EPARSE,
           "data_offsets [0, 9]");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, HQ_EPARSE,
           "not a range");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, HQ_EPARSE,
           "not a range");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, HQ_EPARSE,
           "does not fit");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8, HQ_EPARSE,
           "overlap");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, HQ_EPARSE,
           "hole");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, HQ_EPARSE,
           "trailing");
  bad_file("{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, HQ_EPARSE,
           "unknown dtype");
  bad_file("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, HQ_EPARSE, "dtype");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, HQ_EPARSE,
           "non-negative");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, HQ_EPARSE,
           "non-negative");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, HQ_EPARSE,
           "shape");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 8, HQ_EPARSE,
           "two integers");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, HQ_EPARSE, "data_offsets");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551615]}}",
           8, HQ_EPARSE, "malformed");
  /* huge shape products: the count overflows 64 bits; or fits but the bytes do not */
  bad_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}",
           8, HQ_EPARSE, "overflows");
  bad_file("{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}",
           8, HQ_EPARSE, "does not fit");
  bad_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807,9223372036854775807,"
           "9223372036854775807],\"data_offsets\":[0,8]}}", 8, HQ_EPARSE, "overflows");
  /* a zero dimension makes any other dimension harmless: 0 bytes */
  write_st(path, "{\"z\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807,0],\"data_offsets\":"
           "[0,0]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "12345678", 8);
  HQ_OK_OR_FAIL(open_nv(path, &ck));
  hq_ckpt_close(ck);
  /* not an object; entries that are not objects; metadata that is not string -> string */
  bad_file("[]", 0, HQ_EPARSE, "not a JSON object");
  bad_file("1", 0, HQ_EPARSE, "malformed");
  bad_file("", 0, HQ_EPARSE, "malformed");
  bad_file("{\"a\":[1,2]}", 0, HQ_EPARSE, "not a JSON object");
  bad_file("{\"__metadata__\":[]}", 0, HQ_EPARSE, "__metadata__");
  bad_file("{\"__metadata__\":{\"k\":1}}", 0, HQ_EPARSE, "not a string");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{\"dtype\":"
           "\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, HQ_EPARSE, "malformed");
  bad_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 8, HQ_EPARSE,
           "malformed");
  bad_file("{\"k\":\"\xff\"}", 0, HQ_EPARSE, "malformed"); /* not UTF-8 */
  /* NUL bytes inside the header */
  {
    char h[] = "{\"__metadata__\":{\"k\":\"a\"}}";
    h[21] = '\0'; /* inside the value */
    unsigned char buf[64];
    size_t hl = sizeof h - 1;
    for (int k = 0; k < 8; k++) buf[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    memcpy(buf + 8, h, hl);
    write_file(path, buf, 8 + hl);
    assert_int_equal(open_nv(path, &ck), HQ_EPARSE);
    HQ_ERROR_HAS("NUL");
  }
  /* deeply nested JSON: jansson's depth limit, an error not a stack overflow */
  {
    size_t depth = 200000;
    char *h = malloc(2 * depth + 16);
    strcpy(h, "{\"a\":");
    size_t at = strlen(h);
    for (size_t i = 0; i < depth; i++) h[at++] = '[';
    for (size_t i = 0; i < depth; i++) h[at++] = ']';
    h[at++] = '}';
    h[at] = '\0';
    write_st(path, h, NULL, 0);
    free(h);
    assert_int_equal(open_nv(path, &ck), HQ_EPARSE);
  }
  /* header lengths: larger than the file, larger than any safetensors header, 2^64 - 1 */
  {
    unsigned char buf[16] = {0};
    uint64_t lens[] = {9, 100000001ull, UINT64_MAX, (uint64_t)1 << 63};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
      for (int k = 0; k < 8; k++) buf[k] = (unsigned char)(lens[i] >> (8 * k));
      memcpy(buf + 8, "{}      ", 8);
      write_file(path, buf, 16);
      assert_int_equal(open_nv(path, &ck), HQ_EPARSE);
      HQ_ERROR_HAS("header length");
    }
    write_file(path, buf, 5);
    assert_int_equal(open_nv(path, &ck), HQ_EPARSE);
    HQ_ERROR_HAS("shorter than");
  }
  /* not a regular file */
  assert_int_equal(open_nv(g_dir, &ck), HQ_EIO);
  HQ_ERROR_HAS("regular");
}

/* The real checkpoint of one fp8_tensor [16, 32] qtensor "q" (both directions) with its
   "q/hq" metadata replaced by `hq_json`: open works, the load says what is wrong. */
static void bad_meta(const char *hq_json, int status, const char *needle) {
  const char *real = tpath("real.safetensors"), *path = tpath("meta.safetensors");
  size_t n;
  unsigned char *p = read_file(real, &n);
  uint64_t hlen = 0;
  for (int k = 0; k < 8; k++) hlen |= (uint64_t)p[k] << (8 * k);
  json_error_t err;
  json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, 0, &err);
  assert_non_null(root);
  json_object_set_new(json_object_get(root, "__metadata__"), "q/hq", json_string(hq_json));
  char *h = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  write_st(path, h, p + 8 + hlen, n - 8 - (size_t)hlen);
  resign(path); /* an edit the checksums cannot see: what the metadata checks must catch */
  free(h);
  free(p);
  hq_ckpt *ck;
  HQ_OK_OR_FAIL(hq_ckpt_open(path, &ck));
  hq_qtensor *qt = quantize_cfg(&k_small[0], 3);
  snap s = take_snap(qt);
  int rc = hq_ckpt_load_qtensor(ck, g_ctx, "q", qt);
  if (rc != status) fail_msg("metadata %.200s: status %d, want %d (%s)", hq_json, rc, status,
                             hq_last_error());
  if (needle) HQ_ERROR_HAS(needle);
  if (rc) assert_true(same_snap(qt, &s));
  free(s.bytes);
  hq_qtensor_free(qt);
  hq_ckpt_close(ck);
}

static void test_hostile_meta(void **state) {
  (void)state;
  /* the real metadata of an fp8_tensor [16, 32], but over a file that lacks entries */
  hq_qtensor *qt = quantize_cfg(&k_small[0], 3);
  hq_ckpt_writer *w;
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(tpath("real.safetensors"), &w));
  HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, "q", qt));
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  hq_qtensor_free(qt);
  hq_ckpt *ck;
  HQ_OK_OR_FAIL(hq_ckpt_open(tpath("real.safetensors"), &ck));
  char *real = strdup(hq_ckpt_meta(ck, "q/hq"));
  hq_ckpt_close(ck);
  bad_meta(real, HQ_OK, NULL); /* the control: unchanged, it loads */

  bad_meta("not json", HQ_EPARSE, "not valid JSON");
  bad_meta("[1]", HQ_EPARSE, "not a JSON object");
  bad_meta("{}", HQ_EPARSE, "hq_checkpoint");
  bad_meta("{\"hq_checkpoint\":2}", HQ_ENOTSUP, "version 2");
  bad_meta("{\"hq_checkpoint\":1,\"rows\":16,\"cols\":32,\"directions\":[\"rowwise\","
           "\"rowwise\"],\"columnwise_source\":\"original\"}", HQ_EPARSE, "directions");
  bad_meta("{\"hq_checkpoint\":1,\"rows\":16,\"cols\":32,\"directions\":[\"sideways\"],"
           "\"columnwise_source\":\"original\"}", HQ_EPARSE, "directions");
  bad_meta("{\"hq_checkpoint\":1,\"rows\":\"16\",\"cols\":32}", HQ_EPARSE, "rows");
  bad_meta("{\"hq_checkpoint\":1,\"rows\":16,\"cols\":32,\"directions\":[\"rowwise\","
           "\"columnwise\"],\"columnwise_source\":\"original\",\"role\":\"r\",\"nominal\":"
           "\"f32\",\"usage\":[]}", HQ_EPARSE, "formats");

  /* edit the real metadata: a buffer that claims another dtype or shape than its entry */
  json_error_t err;
  json_t *m = json_loads(real, 0, &err);
  json_t *bufs = json_object_get(m, "buffers");
  json_t *b0 = json_array_get(bufs, 0);
  json_object_set_new(b0, "dtype", json_string("e5m2"));
  char *t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EPARSE, "does not match its entry");
  free(t);
  json_object_set_new(b0, "dtype", json_string("e4m3"));
  json_object_set_new(b0, "shape", json_pack("[i,i]", 32, 16));
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EPARSE, "does not match its entry");
  free(t);
  json_object_set_new(b0, "shape", json_pack("[i,i]", 16, 32));
  json_object_set_new(b0, "entry", json_string("__metadata__"));
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EPARSE, "does not have");
  free(t);
  json_object_set_new(b0, "entry", json_string("q/nothing"));
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EPARSE, "q/nothing");
  free(t);
  /* a buffer under another name, or an option changed */
  json_object_set_new(b0, "entry", json_string("q/data"));
  json_object_set_new(b0, "name", json_string("payload"));
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EINVAL, "payload");
  free(t);
  json_object_set_new(b0, "name", json_string("data"));
  json_t *o0 = json_array_get(json_object_get(json_object_get(json_object_get(m, "formats"),
                                                              "rowwise"), "options"), 0);
  char keep[128];
  snprintf(keep, sizeof keep, "%s", json_string_value(o0));
  json_string_set(o0, "dtype=e5m2");
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EINVAL, "dtype=e5m2");
  free(t);
  json_string_set(o0, keep);
  json_array_append_new(json_object_get(json_object_get(json_object_get(m, "formats"),
                                                        "rowwise"), "options"),
                        json_string("extra=1"));
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EINVAL, "extra=1");
  free(t);
  json_t *ropts = json_object_get(json_object_get(json_object_get(m, "formats"), "rowwise"),
                                  "options");
  json_array_remove(ropts, json_array_size(ropts) - 1);
  json_object_set_new(b0, "entry", json_string("q/data"));
  json_array_append_new(bufs, json_pack("{s:s,s:s,s:s,s:s,s:[i,i],s:b}", "entry", "q/data", "name",
                                        "x", "direction", "rowwise", "dtype", "e4m3", "shape",
                                        16, 32, "shared", 0));
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EINVAL, "more rowwise buffers");
  free(t);
  for (int i = 0; i < 40; i++) json_array_append(bufs, b0);
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EPARSE, "buffers");
  free(t);
  json_decref(m);
  free(real);
}

/* 2000 seeded mutations of the small valid file: a clean error or a correct load. */
static void test_fuzz(void **state) {
  (void)state;
  const char *path = tpath("small.safetensors"), *mut = tpath("mut.safetensors");
  write_small(path);
  size_t n;
  unsigned char *p = read_file(path, &n);
  uint64_t hlen = 0;
  for (int k = 0; k < 8; k++) hlen |= (uint64_t)p[k] << (8 * k);
  unsigned char *q = malloc(n + 64);
  hq_qtensor *dst[2] = {empty_cfg(&k_small[0]), empty_cfg(&k_small[1])};
  uint64_t seed = 0x5eed1234abcdull;
  int opened = 0;
  static const char *const tokens[] = {"-1", "0", "18446744073709551616", "[]", "{}", "\"",
                                       "9223372036854775807", "1e9", "null", "\\u0000", ",",
                                       "U8", "F64", "columnwise"};
  for (int it = 0; it < 2000; it++) {
    memcpy(q, p, n);
    size_t len = n;
    int edits = 1 + (int)(hq_test_rand(&seed) % 4);
    for (int e = 0; e < edits; e++) {
      uint64_t r = hq_test_rand(&seed);
      /* three quarters of the edits in the header (length bytes included) */
      size_t span = (r & 3) ? (size_t)(8 + hlen) : len;
      size_t at = (size_t)((r >> 8) % span);
      switch ((r >> 40) % 5) {
      case 0: q[at] ^= (unsigned char)(1u << ((r >> 32) % 8)); break;
      case 1: q[at] = (unsigned char)(r >> 48); break;
      case 2: q[at] = "0123456789[]{}\",:-. "[(r >> 48) % 20]; break;
      case 3: { /* overwrite with a token */
        const char *t = tokens[(r >> 48) % (sizeof tokens / sizeof tokens[0])];
        size_t tl = strlen(t);
        if (at + tl <= len) memcpy(q + at, t, tl);
        break;
      }
      default: /* truncate or extend */
        if ((r >> 50) & 1) len = at;
        else {
          size_t more = (size_t)((r >> 52) % 64);
          if (len + more > n + 64) more = n + 64 - len;
          memset(q + len, 0, more);
          len += more;
        }
      }
    }
    write_file(mut, q, len);
    if (try_everything(mut, dst) == HQ_OK) opened++;
  }
  printf("fuzz: 2000 mutations, %d opened (each load a clean error or a correct load)\n", opened);
  free(p);
  free(q);
  hq_qtensor_free(dst[0]);
  hq_qtensor_free(dst[1]);
}

// --- checksums (issue 46, 1) -----------------------------------------------------------------

static void save_as(const char *path, const char *name, const hq_qtensor *qt);

/* Load all three tensors of the small file at `path` (opened with `flags`): a mask of those
   that failed (1 f8, 2 nv, 4 p); the last failure's status and message in *st, msg. */
static int load_small(const char *path, uint32_t flags, int *st, char *msg, size_t len) {
  hq_ckpt_open_opts o = {.struct_size = sizeof o, .flags = flags};
  hq_ckpt *ck;
  int rc = hq_ckpt_open_ex(path, &o, &ck);
  if (rc) fail_msg("open %s: %d (%s)", path, rc, hq_last_error());
  int failed = 0;
  for (int i = 0; i < 3; i++) {
    hq_qtensor *qt = i < 2 ? empty_cfg(&k_small[i]) : NULL;
    hq_tensor t = hq_test_empty(HQ_F32, 3, 5);
    rc = i < 2 ? hq_ckpt_load_qtensor(ck, g_ctx, k_small[i].name, qt)
               : hq_ckpt_load_tensor(ck, g_ctx, "p", &t);
    if (rc) {
      failed |= 1 << i;
      *st = rc;
      snprintf(msg, len, "%s", hq_last_error());
    }
    hq_qtensor_free(qt);
    free(t.data);
  }
  hq_ckpt_close(ck);
  return failed;
}

/* One bit flipped in every entry in turn: the file opens (its header is intact) and the load
   of the tensor owning the entry is refused naming the entry and the tensor; the others load.
   One bit flipped in every byte of the length and the header in turn: refused at open. */
static void test_bit_flips(void **state) {
  (void)state;
  const char *path = tpath("small.safetensors"), *bad = tpath("flipped.safetensors");
  write_small(path);
  char msg[1024];
  int st = 0;
  assert_int_equal(load_small(path, 0, &st, msg, sizeof msg), 0);
  size_t n, hlen, fsz;
  unsigned char *p = read_file(path, &n);
  json_t *root = read_header(path, &hlen, &fsz);
  /* the checksum keys hq writes: the header's first, then one per entry */
  json_t *meta = json_object_get(root, "__metadata__");
  assert_memory_equal(p + 8, SUM_PREFIX, strlen(SUM_PREFIX));
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)header_sum(p));
  assert_string_equal(json_string_value(json_object_get(meta, "hq_header_xxh3_64")), hex);
  const char *key;
  json_t *v;
  int entries = 0;
  json_object_foreach(root, key, v) {
    if (!strcmp(key, "__metadata__")) continue;
    size_t b = (size_t)json_integer_value(json_array_get(json_object_get(v, "data_offsets"), 0));
    size_t e = (size_t)json_integer_value(json_array_get(json_object_get(v, "data_offsets"), 1));
    char sk[300], want[17];
    snprintf(sk, sizeof sk, "%s/xxh3_64", key);
    snprintf(want, sizeof want, "%016llx",
             (unsigned long long)XXH3_64bits(p + 8 + hlen + b, e - b));
    assert_string_equal(json_string_value(json_object_get(meta, sk)), want);
    /* the owner: "f8", "nv" or "p" */
    const int owner = !strncmp(key, "f8/", 3) ? 1 : !strncmp(key, "nv/", 3) ? 2 : 4;
    unsigned char *q = malloc(n);
    memcpy(q, p, n);
    q[8 + hlen + b + (e - b) / 2] ^= (unsigned char)(1u << (entries % 8));
    write_file(bad, q, n);
    free(q);
    assert_int_equal(load_small(bad, 0, &st, msg, sizeof msg), owner);
    assert_int_equal(st, HQ_EPARSE);
    char needle[300];
    snprintf(needle, sizeof needle, "entry '%s' is corrupt", key);
    if (!strstr(msg, needle)) fail_msg("flip in '%s': message '%s'", key, msg);
    snprintf(needle, sizeof needle, "'%s'", owner == 1 ? "f8" : owner == 2 ? "nv" : "p");
    if (!strstr(msg, needle)) fail_msg("flip in '%s': message '%s' names no tensor", key, msg);
    /* without verification, the corrupt bytes load (what HQ_CKPT_NO_VERIFY means) */
    assert_int_equal(load_small(bad, HQ_CKPT_NO_VERIFY, &st, msg, sizeof msg), 0);
    entries++;
  }
  assert_int_equal(entries, 8); /* f8: data, scale_inv, amax, columnwise_data; nv's 3; p */
  /* every byte of the length and the header, one bit each */
  int corrupt_msg = 0;
  for (size_t at = 0; at < 8 + hlen; at++) {
    unsigned char *q = malloc(n);
    memcpy(q, p, n);
    q[at] ^= (unsigned char)(1u << (at % 8));
    write_file(bad, q, n);
    free(q);
    hq_ckpt *ck = NULL;
    int rc = hq_ckpt_open(bad, &ck);
    if (rc != HQ_EPARSE) fail_msg("flip in header byte %zu: status %d (%s)", at, rc,
                                  rc ? hq_last_error() : "opened");
    /* past the checksum's own place, the checksum is what refuses it */
    if (at >= 8 + strlen(SUM_PREFIX) + 17) {
      HQ_ERROR_HAS("the header is corrupt");
      corrupt_msg++;
    }
  }
  assert_int_equal(corrupt_msg, (int)(hlen - strlen(SUM_PREFIX) - 17));
  printf("bit flips: %d entries, %zu header bytes: each refused\n", entries, 8 + hlen);
  json_decref(root);
  free(p);
}

/* A file without checksums (another tool's, or an older hq's): refused by default, saying how
   to load it; loaded with HQ_CKPT_NO_VERIFY. Options are checked. */
static void test_foreign_file(void **state) {
  (void)state;
  const char *path = tpath("small.safetensors"), *bare = tpath("bare.safetensors");
  write_small(path);
  size_t n, hlen, fsz;
  unsigned char *p = read_file(path, &n);
  json_t *root = read_header(path, &hlen, &fsz);
  json_t *meta = json_object_get(root, "__metadata__");
  json_object_del(meta, "hq_header_xxh3_64");
  const char *key;
  json_t *v;
  void *tmp;
  json_object_foreach_safe(meta, tmp, key, v) {
    if (strlen(key) > 8 && !strcmp(key + strlen(key) - 8, "/xxh3_64")) json_object_del(meta, key);
  }
  char *h = json_dumps(root, JSON_COMPACT);
  write_st(bare, h, p + 8 + hlen, n - 8 - hlen);
  free(h);
  hq_ckpt *ck = NULL;
  assert_int_equal(hq_ckpt_open(bare, &ck), HQ_ENOTSUP);
  assert_null(ck);
  HQ_ERROR_HAS("has no checksums");
  HQ_ERROR_HAS("HQ_CKPT_NO_VERIFY");
  HQ_ERROR_HAS("--no-verify");
  char msg[1024];
  int st = 0;
  assert_int_equal(load_small(bare, HQ_CKPT_NO_VERIFY, &st, msg, sizeof msg), 0);
  /* entry checksums without the header's where hq writes it: corrupt, not foreign */
  json_object_set_new(meta, "p/xxh3_64", json_string("0123456789abcdef"));
  h = json_dumps(root, JSON_COMPACT);
  write_st(bare, h, p + 8 + hlen, n - 8 - hlen);
  free(h);
  assert_int_equal(hq_ckpt_open(bare, &ck), HQ_EPARSE);
  HQ_ERROR_HAS("has checksums but not the header's");
  /* the options */
  hq_ckpt_open_opts o = {.struct_size = 4, .flags = 0};
  assert_int_equal(hq_ckpt_open_ex(path, &o, &ck), HQ_EINVAL);
  o.struct_size = sizeof o;
  o.flags = 2;
  assert_int_equal(hq_ckpt_open_ex(path, &o, &ck), HQ_EINVAL);
  HQ_ERROR_HAS("unknown flags");
  HQ_OK_OR_FAIL(hq_ckpt_open_ex(path, NULL, &ck));
  hq_ckpt_close(ck);
  /* hq's own keys cannot be added by the caller */
  hq_ckpt_writer *w;
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(tpath("keys.safetensors"), &w));
  assert_int_equal(hq_ckpt_add_meta(w, "hq_header_xxh3_64", "0"), HQ_EINVAL);
  hq_ckpt_writer_abort(w);
  json_decref(root);
  free(p);
}

/* Another tool's file (hand-made here: no hq metadata, no checksums): hq_ckpt_entry and
   hq_ckpt_entry_name describe its entries, and hq_ckpt_load_tensor takes a 3-D stack, a vector
   and a scalar flattened as numpy's C-order reshape (rows = all dimensions but the last). */
static void test_foreign_entries(void **state) {
  (void)state;
  const char *path = tpath("foreign.safetensors");
  float v[2 * 3 * 4 + 5 + 1];
  for (int i = 0; i < 30; i++) v[i] = (float)i - 7.5f;
  char h[600];
  snprintf(h, sizeof h,
           "{\"__metadata__\":{\"format\":\"pt\"},"
           "\"stack\":{\"dtype\":\"F32\",\"shape\":[2,3,4],\"data_offsets\":[0,96]},"
           "\"vec\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[96,116]},"
           "\"one\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[116,120]},"
           "\"ids\":{\"dtype\":\"I64\",\"shape\":[1,1,1,1,1,1,1,1,1],"
           "\"data_offsets\":[120,128]}}");
  unsigned char data[128] = {0};
  memcpy(data, v, 120);
  write_st(path, h, data, sizeof data);
  hq_ckpt *ck = NULL;
  HQ_OK_OR_FAIL(open_nv(path, &ck));
  /* the names in the header's order, then NULL */
  const char *want[] = {"stack", "vec", "one", "ids"};
  for (size_t i = 0; i < 4; i++) assert_string_equal(hq_ckpt_entry_name(ck, i), want[i]);
  assert_null(hq_ckpt_entry_name(ck, 4));
  assert_null(hq_ckpt_entry_name(NULL, 0));
  hq_ckpt_entry_info e = HQ_STRUCT_INIT(hq_ckpt_entry_info);
  HQ_OK_OR_FAIL(hq_ckpt_entry(ck, "stack", &e));
  assert_string_equal(e.st_dtype, "F32");
  assert_int_equal(e.dtype, HQ_F32);
  assert_int_equal(e.ndim, 3);
  assert_true(e.shape[0] == 2 && e.shape[1] == 3 && e.shape[2] == 4 && e.bytes == 96);
  HQ_OK_OR_FAIL(hq_ckpt_entry(ck, "one", &e));
  assert_true(e.ndim == 0 && e.bytes == 4);
  assert_int_equal(hq_ckpt_entry(ck, "ids", &e), HQ_ENOTSUP); /* 9 dimensions */
  HQ_ERROR_HAS("9 dimensions");
  assert_int_equal(hq_ckpt_entry(ck, "nope", &e), HQ_ENOENT);
  HQ_ERROR_HAS("'nope': no such entry");
  assert_int_equal(hq_ckpt_entry(ck, "__metadata__", &e), HQ_ENOENT);
  hq_ckpt_entry_info small = {.struct_size = 4};
  assert_int_equal(hq_ckpt_entry(ck, "stack", &small), HQ_EINVAL);
  HQ_ERROR_HAS("struct_size");
  /* a caller of an older, shorter struct gets its part only (here: up to bytes, the floor) */
  struct {
    hq_ckpt_entry_info e;
    uint64_t guard;
  } older = {.guard = 0x5a5a5a5a5a5a5a5au};
  older.e.struct_size = (uint32_t)HQ_CKPT_ENTRY_INFO_SIZE_0_3;
  HQ_OK_OR_FAIL(hq_ckpt_entry(ck, "vec", &older.e));
  assert_true(older.e.ndim == 1 && older.e.shape[0] == 5 && older.e.bytes == 20);
  assert_true(older.guard == 0x5a5a5a5a5a5a5a5au);
  /* flattened loads: [2, 3, 4] as [6, 4], [5] as [1, 5], a scalar as [1, 1]; other shapes are
     refused naming both */
  float got[24];
  hq_tensor t = hq_tensor_2d(got, HQ_F32, HQ_DEVICE_HOST, 6, 4);
  HQ_OK_OR_FAIL(hq_ckpt_load_tensor(ck, g_ctx, "stack", &t));
  assert_memory_equal(got, v, 96);
  t = hq_tensor_2d(got, HQ_F32, HQ_DEVICE_HOST, 1, 5);
  HQ_OK_OR_FAIL(hq_ckpt_load_tensor(ck, g_ctx, "vec", &t));
  assert_memory_equal(got, v + 24, 20);
  t = hq_tensor_2d(got, HQ_F32, HQ_DEVICE_HOST, 1, 1);
  HQ_OK_OR_FAIL(hq_ckpt_load_tensor(ck, g_ctx, "one", &t));
  assert_true(got[0] == v[29]);
  t = hq_tensor_2d(got, HQ_F32, HQ_DEVICE_HOST, 2, 12);
  assert_int_equal(hq_ckpt_load_tensor(ck, g_ctx, "stack", &t), HQ_EINVAL);
  HQ_ERROR_HAS("[2, 3, 4]");
  t = hq_tensor_2d(got, HQ_F32, HQ_DEVICE_HOST, 5, 1);
  assert_int_equal(hq_ckpt_load_tensor(ck, g_ctx, "vec", &t), HQ_EINVAL);
  hq_ckpt_close(ck);
  /* a quantized tensor's name is no entry; the error says where its buffers are */
  const char *qpath = tpath("small.safetensors");
  write_small(qpath);
  HQ_OK_OR_FAIL(hq_ckpt_open(qpath, &ck));
  const char *q0 = hq_ckpt_entry_name(ck, 0);
  assert_non_null(q0);
  char qname[256];
  snprintf(qname, sizeof qname, "%.*s", (int)(strchr(q0, '/') - q0), q0);
  assert_int_equal(hq_ckpt_entry(ck, qname, &e), HQ_ENOENT);
  HQ_ERROR_HAS("a quantized tensor");
  HQ_OK_OR_FAIL(hq_ckpt_entry(ck, q0, &e));
  hq_ckpt_close(ck);
}

/* hq_ckpt_verify reads every entry against its checksum: all of the data section on a good
   file; a flipped bit in the last entry is that entry named (no load needed to find it); a file
   opened unverified is refused. hq_ckpt_meta_key lists the metadata in the file's order. */
static void test_verify(void **state) {
  (void)state;
  const char *path = tpath("verify.safetensors");
  write_small(path);
  size_t hlen, fsz;
  json_t *root = read_header(path, &hlen, &fsz);
  json_decref(root);
  hq_ckpt *ck = NULL;
  HQ_OK_OR_FAIL(hq_ckpt_open(path, &ck));
  uint64_t read = 1;
  HQ_OK_OR_FAIL(hq_ckpt_verify(ck, &read));
  assert_int_equal(read, fsz - 8 - hlen);
  HQ_OK_OR_FAIL(hq_ckpt_verify(ck, NULL));
  /* the metadata keys: the header's checksum first (section 2), step, each tensor's "/hq" */
  assert_string_equal(hq_ckpt_meta_key(ck, 0), "hq_header_xxh3_64");
  int step = 0, f8 = 0, nv = 0;
  size_t i = 0;
  for (const char *k; (k = hq_ckpt_meta_key(ck, i)) != NULL; i++) {
    step += !strcmp(k, "step");
    f8 += !strcmp(k, "f8/hq");
    nv += !strcmp(k, "nv/hq");
    assert_non_null(hq_ckpt_meta(ck, k));
  }
  assert_true(step == 1 && f8 == 1 && nv == 1);
  assert_null(hq_ckpt_meta_key(NULL, 0));
  hq_ckpt_close(ck);
  /* the last byte of the file belongs to the last entry added, "p" */
  size_t n;
  unsigned char *p = read_file(path, &n);
  p[n - 1] ^= 0x01;
  write_file(path, p, n);
  free(p);
  HQ_OK_OR_FAIL(hq_ckpt_open(path, &ck)); /* the header is intact */
  assert_int_equal(hq_ckpt_verify(ck, &read), HQ_EPARSE);
  HQ_ERROR_HAS("entry 'p' is corrupt");
  assert_true(read < fsz - 8 - hlen);
  hq_ckpt_close(ck);
  HQ_OK_OR_FAIL(open_nv(path, &ck));
  assert_int_equal(hq_ckpt_verify(ck, &read), HQ_ENOTSUP);
  HQ_ERROR_HAS("HQ_CKPT_NO_VERIFY");
  assert_int_equal(read, 0);
  hq_ckpt_close(ck);
  assert_int_equal(hq_ckpt_verify(NULL, NULL), HQ_EINVAL);
}

// --- temporary files, crashes, a full disk (issue 46, 2 and 3) ------------------------------

/* The number of files in g_dir whose name starts with `prefix`. */
static int count_prefix(const char *prefix) {
  DIR *d = opendir(g_dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d))) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  if (d) closedir(d);
  return n;
}

/* A writer of `path` holding one F32 [rows, cols] tensor "t" of values from `seed`. */
static hq_ckpt_writer *writer_of(const char *path, int64_t rows, int64_t cols, uint64_t seed) {
  hq_ckpt_writer *w;
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(path, &w));
  hq_tensor t = hq_test_tensor(HQ_F32, rows, cols, seed, 1.0f);
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "t", &t));
  free(t.data);
  return w;
}

/* The file at path holds "t" [rows, cols] of values from `seed`, verified. */
static void holds(const char *path, int64_t rows, int64_t cols, uint64_t seed) {
  hq_ckpt *ck;
  HQ_OK_OR_FAIL(hq_ckpt_open(path, &ck));
  hq_tensor t = hq_test_empty(HQ_F32, rows, cols);
  hq_tensor x = hq_test_tensor(HQ_F32, rows, cols, seed, 1.0f);
  HQ_OK_OR_FAIL(hq_ckpt_load_tensor(ck, g_ctx, "t", &t));
  assert_memory_equal(t.data, x.data, (size_t)(rows * cols) * 4);
  free(t.data);
  free(x.data);
  hq_ckpt_close(ck);
}

/* Run fn with the file size limit at `bytes` and SIGXFSZ ignored: a write past it fails with
   EFBIG, as on a full disk (no root needed). */
static int with_size_limit(rlim_t bytes, int (*fn)(void *), void *arg) {
  struct rlimit old, lim;
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = bytes;
  void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  int rc = fn(arg);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, prev);
  return rc;
}
static int close_writer(void *w) { return hq_ckpt_writer_close(w); }

/* Two writers of one path in one process: each has a temporary file of its own, so the one that
   fails (here on a full disk) never touches the file the other one wrote; with both succeeding,
   the last close wins, whole. */
static void test_two_writers(void **state) {
  (void)state;
  const char *path = tpath("two.safetensors");
  hq_ckpt_writer *a = writer_of(path, 4, 8, 1), *b = writer_of(path, 256, 256, 2);
  assert_int_equal(count_prefix("two.safetensors.tmp."), 2);
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(a));
  holds(path, 4, 8, 1);
  /* b (256 KiB) meets a 64 KiB disk: it fails, a's file stays whole */
  assert_int_equal(with_size_limit(65536, close_writer, b), HQ_EIO);
  HQ_ERROR_HAS("File too large");
  holds(path, 4, 8, 1);
  assert_int_equal(count_prefix("two.safetensors.tmp."), 0);
  /* both succeed, in the other order: the last close's file */
  a = writer_of(path, 4, 8, 3);
  b = writer_of(path, 8, 4, 4);
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(b));
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(a));
  holds(path, 4, 8, 3);
  assert_int_equal(count_prefix("two.safetensors.tmp."), 0);
}

/* A path that names a FIFO or a directory is refused at open (the rename would replace it), also
   through a symbolic link, and one that becomes a FIFO before close is left alone; a link is
   followed: the file it names is written, beside it the temporary file, and the link stays. */
static void test_not_regular(void **state) {
  (void)state;
  hq_ckpt_writer *w = NULL;
  const char *fifo = tpath("fifo.st"), *dir = tpath("dir.st"), *lf = tpath("lf.st");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(mkdir(dir, 0700), 0);
  assert_int_equal(symlink("fifo.st", lf), 0);
  assert_int_equal(hq_ckpt_writer_open(fifo, &w), HQ_EIO);
  HQ_ERROR_HAS("not a regular file (a FIFO)");
  assert_int_equal(hq_ckpt_writer_open(dir, &w), HQ_EIO);
  HQ_ERROR_HAS("not a regular file (a directory)");
  assert_int_equal(hq_ckpt_writer_open(lf, &w), HQ_EIO);
  HQ_ERROR_HAS("not a regular file (a FIFO, the link's target");
  assert_null(w);
  /* a link to a file, and a dangling one into a directory: the targets are written */
  const char *link = tpath("link.st"), *target = tpath("target.st"), *dl = tpath("dangling.st");
  assert_int_equal(symlink("target.st", link), 0);
  assert_int_equal(symlink("dir.st/new.st", dl), 0);
  for (int k = 0; k < 2; k++) {   /* a new file, then one replaced */
    HQ_OK_OR_FAIL(hq_ckpt_writer_close(writer_of(link, 4, 8, 5 + (uint64_t)k)));
    holds(target, 4, 8, 5 + (uint64_t)k);
  }
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(writer_of(dl, 4, 8, 7)));
  holds(tpath("dir.st/new.st"), 4, 8, 7);
  struct stat st;
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  assert_int_equal(lstat(dl, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  assert_int_equal(count_prefix("link.st.tmp.") + count_prefix("target.st.tmp."), 0);
  /* a FIFO made at the path while the writer is open: close refuses to replace it */
  const char *late = tpath("late.st");
  w = writer_of(late, 4, 8, 1);
  assert_int_equal(mkfifo(late, 0600), 0);
  assert_int_equal(hq_ckpt_writer_close(w), HQ_EIO);
  HQ_ERROR_HAS("not a regular file any more (a FIFO)");
  assert_int_equal(lstat(late, &st), 0);
  assert_true(S_ISFIFO(st.st_mode));
  assert_int_equal(count_prefix("late.st.tmp."), 0);
}

/* hq_output_target, the rule itself: a new name and a regular file are their own targets; a
   chain of links (relative, absolute) ends at the file it names; a FIFO, through a link too, is
   refused with its kind; a loop of links stops after 40. */
static void test_output_target(void **state) {
  (void)state;
  char *t = NULL;
  const char *nw = tpath("ot_new.st"), *reg = tpath("ot_reg.st");
  HQ_OK_OR_FAIL(hq_output_target(nw, &t));
  assert_string_equal(t, nw);
  free(t);
  hq_test_write_file(reg, NULL);
  HQ_OK_OR_FAIL(hq_output_target(reg, &t));
  assert_string_equal(t, reg);
  free(t);
  const char *l1 = tpath("ot_l1"), *l2 = tpath("ot_l2");
  assert_int_equal(symlink("ot_l2", l1), 0);  /* relative: to the link's directory */
  assert_int_equal(symlink(reg, l2), 0);      /* absolute */
  HQ_OK_OR_FAIL(hq_output_target(l1, &t));
  assert_string_equal(t, reg);
  free(t);
  const char *fifo = tpath("ot_fifo"), *lf = tpath("ot_lf");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(symlink("ot_fifo", lf), 0);
  assert_int_equal(hq_output_target(fifo, &t), HQ_EIO);
  assert_null(t);
  HQ_ERROR_HAS("not a regular file (a FIFO): hq writes its output only to a regular file");
  assert_int_equal(hq_output_target(lf, &t), HQ_EIO);
  HQ_ERROR_HAS("not a regular file (a FIFO, the link's target");
  const char *la = tpath("ot_la"), *lb = tpath("ot_lb");
  assert_int_equal(symlink("ot_lb", la), 0);
  assert_int_equal(symlink("ot_la", lb), 0);
  assert_int_equal(hq_output_target(la, &t), HQ_EIO);
  HQ_ERROR_HAS("more than 40 symbolic links to follow");
  assert_null(t);
}

/* A child that saves "t" [rows, cols] to path and dies in the middle: killed (SIGKILL) after
   adding, before close, or by SIGXFSZ while it writes (a file size limit below the file's).
   Returns its pid; its temporary file remains. */
static pid_t dying_saver(const char *path, int64_t rows, int64_t cols, int how) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    hq_ckpt_writer *w = NULL;
    hq_tensor t = hq_test_tensor(HQ_F32, rows, cols, 9, 1.0f);
    if (hq_ckpt_writer_open(path, &w) || hq_ckpt_add_tensor(w, g_ctx, "t", &t)) _exit(3);
    if (how == SIGXFSZ) {
      struct rlimit lim = {1 << 20, 1 << 20};
      setrlimit(RLIMIT_FSIZE, &lim);
      hq_ckpt_writer_close(w); /* killed at the first byte past 1 MiB */
      _exit(4);
    }
    if (write(fds[1], "r", 1) != 1) _exit(5);
    for (;;) pause(); /* killed here, or alive until the test kills it */
  }
  close(fds[1]);
  char c;
  if (how != SIGXFSZ) assert_int_equal(read(fds[0], &c, 1), 1);
  close(fds[0]);
  if (how == SIGKILL) kill(pid, SIGKILL);
  if (how) {
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFSIGNALED(ws));
    assert_int_equal(WTERMSIG(ws), how);
  }
  return pid;
}

/* The temporary files of saves killed mid-way (kill -9, SIGXFSZ in the middle of the write) are
   removed by the next save to that path; a live process's is kept; the file is never touched. */
static void test_killed_saves(void **state) {
  (void)state;
  const char *path = tpath("killed.safetensors");
  hq_ckpt_writer *w = writer_of(path, 4, 8, 1);
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  pid_t live = dying_saver(path, 4, 8, 0);
  pid_t k1 = dying_saver(path, 4, 8, SIGKILL);
  char pre[3][128];
  snprintf(pre[0], sizeof pre[0], "killed.safetensors.tmp.%ld.", (long)k1);
  snprintf(pre[2], sizeof pre[2], "killed.safetensors.tmp.%ld.", (long)live);
  assert_int_equal(count_prefix(pre[0]), 1);
  assert_int_equal(count_prefix(pre[2]), 1);
  /* another save, killed in the middle of its write: its open removed k1's file */
  pid_t k2 = dying_saver(path, 1024, 1024, SIGXFSZ); /* 4 MiB: cut at 1 MiB */
  snprintf(pre[1], sizeof pre[1], "killed.safetensors.tmp.%ld.", (long)k2);
  assert_int_equal(count_prefix(pre[0]), 0);
  assert_int_equal(count_prefix(pre[1]), 1);
  assert_int_equal(count_prefix(pre[2]), 1);
  holds(path, 4, 8, 1); /* the killed saves never reached the file */
  /* the next save removes the dead one's file, keeps the live one's */
  w = writer_of(path, 4, 8, 2);
  assert_int_equal(count_prefix(pre[1]), 0);
  assert_int_equal(count_prefix(pre[2]), 1);
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  holds(path, 4, 8, 2);
  /* a file of another path, or a name hq does not write, is never touched */
  write_file(tpath("other.safetensors.tmp.999999999.0000abcd.x"), "x", 1);
  write_file(tpath("killed.safetensors.tmp.notapid"), "x", 1);
  kill(live, SIGKILL);
  waitpid(live, NULL, 0);
  w = writer_of(path, 4, 8, 3);
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  assert_int_equal(count_prefix("killed.safetensors.tmp."), 1); /* the "notapid" one */
  assert_true(exists(tpath("other.safetensors.tmp.999999999.0000abcd.x")));
  holds(path, 4, 8, 3);
}

/* A full disk: a tiny tmpfs when this process may mount one (root), and a file size limit
   always: the save fails with HQ_EIO naming the cause, the old file is whole, no temporary
   file remains. */
static void test_full_disk(void **state) {
  (void)state;
  const char *path = tpath("full.safetensors");
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(writer_of(path, 4, 8, 1)));
  hq_ckpt_writer *w = writer_of(path, 512, 512, 2); /* 1 MiB */
  assert_int_equal(with_size_limit(300000, close_writer, w), HQ_EIO);
  holds(path, 4, 8, 1);
  assert_int_equal(count_prefix("full.safetensors.tmp."), 0);
  char mnt[600];
  snprintf(mnt, sizeof mnt, "%s/tiny", g_dir);
  assert_int_equal(mkdir(mnt, 0700), 0);
  if (mount("tmpfs", mnt, "tmpfs", 0, "size=256k") != 0) {
    printf("full disk: no tmpfs (mount: %s): the file size limit stood in\n", strerror(errno));
    rmdir(mnt);
    return;
  }
  char tpathb[700];
  snprintf(tpathb, sizeof tpathb, "%s/c.safetensors", mnt);
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(writer_of(tpathb, 4, 8, 1)));
  w = writer_of(tpathb, 512, 512, 2);
  assert_int_equal(hq_ckpt_writer_close(w), HQ_EIO);
  HQ_ERROR_HAS("No space left on device");
  holds(tpathb, 4, 8, 1);
  DIR *d = opendir(mnt);
  struct dirent *e;
  int files = 0;
  while ((e = readdir(d))) files += e->d_name[0] != '.';
  closedir(d);
  assert_int_equal(files, 1);
  printf("full disk: a 256 KiB tmpfs refused a 1 MiB save, the old file whole\n");
  assert_int_equal(umount(mnt), 0);
  rmdir(mnt);
}

// --- required metadata keys (issue 46, 9) ---------------------------------------------------

/* real.safetensors: one fp8_tensor [16, 32] qtensor "q" (both directions), as bad_meta edits
   it; its "q/hq" metadata parsed (json_decref it). */
static json_t *real_meta(void) {
  hq_qtensor *qt = quantize_cfg(&k_small[0], 3);
  save_as(tpath("real.safetensors"), "q", qt);
  hq_qtensor_free(qt);
  hq_ckpt *ck;
  HQ_OK_OR_FAIL(hq_ckpt_open(tpath("real.safetensors"), &ck));
  json_error_t err;
  json_t *m = json_loads(hq_ckpt_meta(ck, "q/hq"), 0, &err);
  hq_ckpt_close(ck);
  assert_non_null(m);
  return m;
}

/* Every key docs/checkpoints.md (3) calls required, removed and then given a wrong value, in
   turn: refused naming the key and the tensor (the header re-signed, so the checks, not the
   checksums, refuse it). */
static void test_required_keys(void **state) {
  (void)state;
  json_t *m = real_meta();
  json_error_t err;
  static const struct {
    const char *path[3]; /* the key: top level, formats.<dir>.<key>, buffers[i].<key> */
    const char *bad;     /* a wrong value (JSON) */
    int status;
    const char *needle;
  } keys[] = {
      {{"hq_checkpoint"}, "\"1\"", HQ_EPARSE, "\"hq_checkpoint\""},
      {{"role"}, "7", HQ_EPARSE, "\"role\""},
      {{"rows"}, "0", HQ_EPARSE, "\"rows\""},
      {{"cols"}, "\"32\"", HQ_EPARSE, "\"cols\""},
      {{"nominal"}, "\"e4m3\"", HQ_EPARSE, "\"nominal\""},
      {{"nominal"}, "\"f16\"", HQ_EINVAL, "nominal dtype differs: checkpoint f16, qtensor f32"},
      {{"directions"}, "[]", HQ_EPARSE, "\"directions\""},
      {{"usage"}, "[\"up\"]", HQ_EPARSE, "\"usage\""},
      {{"columnwise_source"}, "\"copied\"", HQ_EPARSE, "\"columnwise_source\""},
      {{"formats"}, "[]", HQ_EPARSE, "\"formats\""},
      {{"formats", "rowwise", "format"}, "1", HQ_EPARSE, "\"format\""},
      {{"formats", "rowwise", "plugin"}, "null", HQ_EPARSE, "\"plugin\""},
      {{"formats", "rowwise", "plugin_version"}, "2", HQ_EPARSE, "\"plugin_version\""},
      {{"formats", "rowwise", "options"}, "{}", HQ_EPARSE, "\"options\""},
      {{"formats", "columnwise", "plugin_version"}, "[]", HQ_EPARSE, "\"plugin_version\""},
      {{"buffers"}, "{}", HQ_EPARSE, "\"buffers\""},
      {{"buffers", "0", "entry"}, "5", HQ_EPARSE, "\"entry\""},
      {{"buffers", "0", "name"}, "5", HQ_EPARSE, "\"name\""},
      {{"buffers", "0", "direction"}, "\"up\"", HQ_EPARSE, "bad direction"},
      {{"buffers", "0", "dtype"}, "\"f99\"", HQ_EPARSE, "bad direction, dtype"},
      {{"buffers", "0", "shape"}, "[-1]", HQ_EPARSE, "shape"},
      {{"buffers", "0", "shared"}, "true", HQ_EPARSE, "\"shared\" is true"},
      {{"buffers", "4", "shared"}, "false", HQ_EPARSE, "\"shared\" is false"},
      {{"buffers", "1", "shared"}, "\"no\"", HQ_EPARSE, "\"shared\""},
  };
  int tried = 0;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    for (int removed = 0; removed < 2; removed++) {
      json_t *c = json_deep_copy(m), *o = c;
      int depth = keys[i].path[2] ? 3 : keys[i].path[1] ? 2 : 1;
      for (int k = 0; k < depth - 1; k++)
        o = json_is_array(o) ? json_array_get(o, (size_t)atoi(keys[i].path[k]))
                             : json_object_get(o, keys[i].path[k]);
      const char *last = keys[i].path[depth - 1];
      if (!removed) {
        /* the key removed: "missing" */
        if (!json_object_get(o, last)) fail_msg("metadata has no key %s", last);
        json_object_del(o, last);
      } else {
        json_object_set_new(o, last, json_loads(keys[i].bad, JSON_DECODE_ANY, &err));
      }
      char *t = json_dumps(c, JSON_COMPACT);
      const int status = removed ? keys[i].status : HQ_EPARSE;
      char needle[200];
      snprintf(needle, sizeof needle, "%s", removed ? keys[i].needle : last);
      bad_meta(t, status, needle);
      HQ_ERROR_HAS("tensor 'q'");
      free(t);
      json_decref(c);
      tried++;
    }
  }
  printf("required keys: %d corruptions, each refused naming the key and the tensor\n", tried);
  json_decref(m);
}

// --- plugin versions: appended options, layout versions (bug 6) -------------------------------

/* A plugin set holding a later version of fp8_tensor (tests/wrap/fp8_tensor_next.c), built into
   tests/wrap/<sub> beside $HQ_TEST_WRAP_DIR; the fixture loads the stock module itself from
   $HQ_PLUGIN_PATH. */
static hq_plugins *later_set(const char *sub) {
  const char *wrap = getenv("HQ_TEST_WRAP_DIR");
  if (!wrap) fail_msg("HQ_TEST_WRAP_DIR is not set (make check sets it to tests/wrap/.libs)");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/../%s/.libs", wrap, sub);
  const char *dirs[1] = {dir};
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(dirs, 1, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT, &set));
  const hq_plugin *p = hq_plugins_find(set, "fp8_tensor");
  if (!p) fail_msg("no fp8_tensor in %s", dir);
  return set;
}

/* An fp8_tensor [64, 128] qtensor, both directions, of `set` with options (NULL: defaults):
   quantized from a seeded source, or empty. */
static hq_qtensor *f8_of(hq_plugins *set, const char *opt, int quantize) {
  const char *opts[1] = {opt};
  hq_format_spec f = {sizeof f, "fp8_tensor", opt ? opts : NULL, opt ? 1u : 0u};
  hq_quantizer *q = NULL;
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantizer_create_direct(set, &f, &f, HQ_SOURCE_ORIGINAL, &q));
  if (quantize) {
    hq_tensor x = hq_test_tensor(HQ_F32, 64, 128, 41, 3.0f);
    HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &x, &qt));
    free(x.data);
  } else {
    HQ_OK_OR_FAIL(hq_make_empty(q, g_ctx, 64, 128, HQ_F32, &qt));
  }
  hq_quantizer_free(q);
  return qt;
}

static void save_as(const char *path, const char *name, const hq_qtensor *qt) {
  hq_ckpt_writer *w;
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(path, &w));
  HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, name, qt));
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
}

/* Load `name` of `path` into qt: expect `status`, messages naming each of `needles`, and on a
   refusal no byte of qt changed. */
static void load_expect(const char *path, const char *name, hq_qtensor *qt, int status,
                        const char *const *needles) {
  hq_ckpt *ck;
  HQ_OK_OR_FAIL(hq_ckpt_open(path, &ck));
  snap s = take_snap(qt);
  int rc = hq_ckpt_load_qtensor(ck, g_ctx, name, qt);
  if (rc != status)
    fail_msg("load of '%s' from %s: status %d, want %d (%s)", name, path, rc, status,
             hq_last_error());
  for (size_t i = 0; needles && needles[i]; i++) HQ_ERROR_HAS(needles[i]);
  if (rc) assert_true(same_snap(qt, &s));
  free(s.bytes);
  hq_ckpt_close(ck);
}

/* A file written by the later module of `set`: refused by the stock module (HQ_EINVAL naming each
   of `needles`), loaded by its own. */
static void later_file(hq_plugins *set, const char *path, const char *const *needles) {
  hq_qtensor *later = f8_of(set, NULL, 1);
  save_as(path, "w", later);
  hq_qtensor *d = f8_of(g_set, NULL, 0);
  load_expect(path, "w", d, HQ_EINVAL, needles);
  hq_qtensor_free(d);
  d = f8_of(set, NULL, 0);
  load_expect(path, "w", d, HQ_OK, NULL);
  assert_same_qt(later, d, "the later module's own file");
  hq_qtensor_free(d);
  hq_qtensor_free(later);
}

/* A checkpoint written by fp8_tensor before it had the option "bump" loads into the later
   module, whose "bump" then reads as its default; a qtensor with another "bump" is refused, and
   so is a checkpoint holding an option the loading module no longer has. */
static void test_appended_option(void **state) {
  (void)state;
  const char *old = tpath("old_plugin.safetensors"), *newer = tpath("new_plugin.safetensors");
  hq_plugins *next = later_set("next");
  hq_qtensor *orig = f8_of(g_set, NULL, 1);
  save_as(old, "w", orig);

  hq_qtensor *d = f8_of(next, NULL, 0);
  load_expect(old, "w", d, HQ_OK, NULL);
  assert_same_qt(orig, d, "a file of the plugin before its option was appended");
  hq_qtensor_free(d);
  d = f8_of(next, "bump=true", 0);
  const char *n1[] = {old, "tensor 'w'", "rowwise", "'bump'", "bump=false", "bump=true", NULL};
  load_expect(old, "w", d, HQ_EINVAL, n1);
  hq_qtensor_free(d);

  /* the other way: a file of the later module, holding "bump=false", into the stock one */
  const char *n2[] = {newer, "tensor 'w'", "bump=false", "fp8_tensor", "no option 'bump'", NULL};
  later_file(next, newer, n2);
  hq_qtensor_free(orig);
  hq_plugins_close(next);
}

/* A module whose layout version is not the one a direction was saved with refuses the file:
   HQ_EINVAL naming the tensor, the format, the plugin, the file's and the module's version. */
static void test_layout_version(void **state) {
  (void)state;
  const char *v1 = tpath("layout1.safetensors"), *v2 = tpath("layout2.safetensors");
  hq_plugins *relayout = later_set("relayout");
  hq_qtensor *orig = f8_of(g_set, NULL, 1);
  save_as(v1, "w", orig);
  hq_qtensor *d = f8_of(relayout, NULL, 0);
  const char *n1[] = {v1, "tensor 'w'", "rowwise direction (format 'fp8_tensor', plugin "
                      "fp8_tensor) was saved in layout version 1", "stores layout version 2",
                      NULL};
  load_expect(v1, "w", d, HQ_EINVAL, n1);
  hq_qtensor_free(d);

  /* the file records 2; the stock module stores 1 */
  const char *n2[] = {v2, "saved in layout version 2", "stores layout version 1", NULL};
  later_file(relayout, v2, n2);
  hq_qtensor_free(orig);
  hq_plugins_close(relayout);

  /* the recorded version, field by field: 1 for the stock module; a file without it (written
     before layout versions were recorded) reads as 1; anything but an integer >= 1 is malformed;
     an option listed twice too */
  json_t *m = real_meta();
  json_t *fr = json_object_get(json_object_get(m, "formats"), "rowwise");
  json_t *fc = json_object_get(json_object_get(m, "formats"), "columnwise");
  assert_int_equal(json_integer_value(json_object_get(fr, "layout_version")), 1);
  assert_int_equal(json_integer_value(json_object_get(fc, "layout_version")), 1);
  json_object_del(fr, "layout_version");
  json_object_del(fc, "layout_version");
  char *t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_OK, NULL);
  free(t);
  json_object_set_new(fr, "layout_version", json_string("1"));
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EPARSE, "layout_version");
  free(t);
  json_object_set_new(fr, "layout_version", json_integer(0));
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EPARSE, "layout_version");
  free(t);
  json_object_set_new(fr, "layout_version", json_integer(3));
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EINVAL, "saved in layout version 3");
  free(t);
  json_object_set_new(fr, "layout_version", json_integer(1));
  json_array_append_new(json_object_get(fr, "options"), json_string("dtype=e4m3"));
  t = json_dumps(m, JSON_COMPACT);
  bad_meta(t, HQ_EPARSE, "option 'dtype' is listed twice");
  free(t);
  json_decref(m);
}

// --- allocation failures ------------------------------------------------------------------

#ifdef HQ_TEST_OOM
static hq_qtensor *g_oom_qt[2];
static hq_tensor g_oom_t;

/* One save: open, two qtensors (one with a private columnwise copy), a tensor, a key, close. */
static int op_save(const char *path) {
  hq_ckpt_writer *w = NULL;
  int rc = hq_ckpt_writer_open(path, &w);
  if (rc) return rc;
  if (!rc) rc = hq_ckpt_add_qtensor(w, g_ctx, "a", g_oom_qt[0]);
  if (!rc) rc = hq_ckpt_add_qtensor(w, g_ctx, "b/c", g_oom_qt[1]);
  if (!rc) rc = hq_ckpt_add_tensor(w, g_ctx, "m", &g_oom_t);
  if (!rc) rc = hq_ckpt_add_meta(w, "step", "3");
  if (rc) {
    hq_ckpt_writer_abort(w);
    return rc;
  }
  return hq_ckpt_writer_close(w);
}

/* One load: open, both qtensors (the first into a shared destination: a private copy is made),
   the tensor, a key. */
static int op_load(const char *path, hq_qtensor **dst, hq_tensor *t) {
  hq_ckpt *ck = NULL;
  int rc = hq_ckpt_open(path, &ck);
  if (rc) return rc;
  rc = hq_ckpt_load_qtensor(ck, g_ctx, "a", dst[0]);
  if (!rc) rc = hq_ckpt_load_qtensor(ck, g_ctx, "b/c", dst[1]);
  if (!rc) rc = hq_ckpt_load_tensor(ck, g_ctx, "m", t);
  if (!rc && strcmp(hq_ckpt_meta(ck, "step"), "3") != 0) rc = HQ_EINTERNAL;
  hq_ckpt_close(ck);
  return rc;
}

static void test_oom(void **state) {
  (void)state;
  const cfg *c0 = &k_cfgs[0], *c1 = &k_cfgs[13]; /* fp8_tensor (private copy); the hybrid */
  g_oom_qt[0] = quantize_cfg(c0, 1);
  hq_tensor y = hq_test_tensor(HQ_F32, c0->rows, c0->cols, 2, 9.0f);
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(g_oom_qt[0], HQ_ROWWISE));
  HQ_OK_OR_FAIL(hq_qtensor_update(g_oom_qt[0], g_ctx, &y));
  free(y.data);
  g_oom_qt[1] = quantize_cfg(c1, 2);
  g_oom_t = hq_test_tensor(HQ_BF16, 6, 10, 3, 1.0f);
  const char *path = tpath("oom.safetensors");
  char tmpname[64];
  snprintf(tmpname, sizeof tmpname, "oom.safetensors.tmp.");

  /* saves */
  long long runs = 0;
  for (long long k = 0;; k++, runs++) {
    unlink(path);
    long long live0 = g_live;
    g_count = 0;
    g_failed = 0;
    g_fail_at = k;
    g_armed = 1;
    int rc = op_save(path);
    g_armed = 0;
    if (!g_failed) {
      HQ_OK_OR_FAIL(rc);
      break;
    }
    if (rc != HQ_ENOMEM) fail_msg("save, allocation %lld failed: status %d (%s)", k, rc,
                                  hq_last_error());
    HQ_ERROR_HAS("memory");
    if (g_live != live0) fail_msg("save, allocation %lld failed: %lld blocks leaked", k,
                                  g_live - live0);
    assert_false(exists(path));
    assert_false(dir_has_prefix(tmpname));
  }
  printf("oom: a save makes %lld allocations; each failure is a clean HQ_ENOMEM\n", runs);
  /* loads, into destinations that already hold other data: a failed load changes nothing */
  hq_qtensor *dst[2] = {quantize_cfg(c0, 5), quantize_cfg(c1, 6)};
  hq_tensor t = hq_test_empty(HQ_BF16, 6, 10);
  runs = 0;
  for (long long k = 0;; k++, runs++) {
    hq_qtensor_free(dst[0]);
    dst[0] = quantize_cfg(c0, 5); /* shared again */
    snap s0 = take_snap(dst[0]), s1 = take_snap(dst[1]);
    long long live0 = g_live;
    g_count = 0;
    g_failed = 0;
    g_fail_at = k;
    g_armed = 1;
    int rc = op_load(path, dst, &t);
    g_armed = 0;
    if (!g_failed) {
      HQ_OK_OR_FAIL(rc);
      free(s0.bytes);
      free(s1.bytes);
      break;
    }
    if (rc != HQ_ENOMEM) fail_msg("load, allocation %lld failed: status %d (%s)", k, rc,
                                  hq_last_error());
    HQ_ERROR_HAS("memory");
    /* the qtensor a failure hit is unchanged (the other one may have loaded) */
    int same0 = same_snap(dst[0], &s0), same1 = same_snap(dst[1], &s1);
    assert_true(same0 || same1 || !"a failed load changed a qtensor");
    (void)same1;
    /* the private columnwise copies a successful load of "a" made belong to dst[0] */
    long long priv = 0;
    const hq_storage *cs = hq_qtensor_storage(dst[0], HQ_COLWISE);
    for (uint32_t i = 0; i < cs->nbuf; i++)
      priv += (hq_storage_cbuf(cs, i)->flags & HQ_BUF_SHARED) &&
              !strncmp(hq_storage_cbuf(cs, i)->name, "columnwise_", 11);
    if (priv) assert_false(same0);
    if (g_live != live0 + priv)
      fail_msg("load, allocation %lld failed: %lld blocks leaked", k, g_live - live0 - priv);
    free(s0.bytes);
    free(s1.bytes);
  }
  printf("oom: a load makes %lld allocations; each failure is a clean HQ_ENOMEM\n", runs);
  assert_same_qt(g_oom_qt[0], dst[0], "oom load a");
  assert_same_qt(g_oom_qt[1], dst[1], "oom load b/c");
  assert_memory_equal(t.data, g_oom_t.data, 6 * 10 * 2);
  hq_qtensor_free(dst[0]);
  hq_qtensor_free(dst[1]);
  hq_qtensor_free(g_oom_qt[0]);
  hq_qtensor_free(g_oom_qt[1]);
  free(t.data);
  free(g_oom_t.data);
}
#endif

// --- Python's safetensors -----------------------------------------------------------------

static const char *k_py =
    "import json, sys\n"
    "import numpy as np\n"
    "from safetensors import deserialize, safe_open\n"
    "from safetensors.numpy import load_file\n"
    "path, exp_path, np_path = sys.argv[1:4]\n"
    "exp = json.load(open(exp_path))\n"
    "items = dict(deserialize(open(path, 'rb').read()))\n"
    "assert sorted(items) == sorted(exp['entries']), (sorted(items), sorted(exp['entries']))\n"
    "for name, e in exp['entries'].items():\n"
    "    it = items[name]\n"
    "    assert it['dtype'] == e['dtype'], (name, it['dtype'], e['dtype'])\n"
    "    assert list(it['shape']) == e['shape'], (name, it['shape'], e['shape'])\n"
    "    assert bytes(it['data']).hex() == e['hex'], name\n"
    "with safe_open(path, framework='np') as f:\n"
    "    md = f.metadata()\n"
    "    assert md['hq_version'] == exp['hq_version']\n"
    "    for q in exp['qtensors']:\n"
    "        m = json.loads(md[q + '/hq'])\n"
    "        assert m['rows'] == exp['qtensors'][q][0] and m['cols'] == exp['qtensors'][q][1]\n"
    "    for name, e in exp['entries'].items():\n"
    "        s = f.get_slice(name)\n"
    "        assert s.get_dtype() == e['dtype'] and list(s.get_shape()) == e['shape'], name\n"
    "    sums = 'not checked (no xxhash module)'\n"
    "    try:\n"
    "        import xxhash\n"
    "    except ImportError:\n"
    "        xxhash = None\n"
    "    if xxhash:\n"
    "        for name in items:\n"
    "            got = xxhash.xxh3_64_hexdigest(bytes(items[name]['data']))\n"
    "            assert got == md[name + '/xxh3_64'], (name, got, md[name + '/xxh3_64'])\n"
    "        sums = 'every checksum equal to python xxhash ' + xxhash.VERSION + \"'s\"\n"
    "arrs = load_file(np_path)\n"
    "for name, e in exp['np'].items():\n"
    "    a = arrs[name]\n"
    "    assert str(a.dtype) == e['dtype'], (name, str(a.dtype))\n"
    "    assert list(a.shape) == e['shape'], name\n"
    "    assert a.tobytes().hex() == e['hex'], name\n"
    "print('python safetensors %s: %d entries, %d numpy arrays read and checked; %s' % (\n"
    "    __import__('safetensors').__version__, len(items), len(arrs), sums))\n";

static json_t *hex_of(const void *p, size_t n) {
  char *h = malloc(2 * n + 1);
  for (size_t i = 0; i < n; i++) sprintf(h + 2 * i, "%02x", ((const unsigned char *)p)[i]);
  h[2 * n] = '\0';
  json_t *s = json_string(h);
  free(h);
  return s;
}

static void expect_entry(json_t *entries, const char *name, const char *dtype, int ndim,
                         const int64_t *shape, const void *p, size_t n) {
  json_t *sh = json_array();
  for (int k = 0; k < ndim; k++) json_array_append_new(sh, json_integer(shape[k]));
  json_object_set_new(entries, name, json_pack("{s:s,s:o,s:o}", "dtype", dtype, "shape", sh,
                                               "hex", hex_of(p, n)));
}

static void test_python(void **state) {
  (void)state;
  if (system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") != 0) {
    printf("python: skipped (python3 cannot import safetensors and numpy)\n");
    return;
  }
  const char *path = tpath("py.safetensors"), *np_path = tpath("py_np.safetensors");
  const char *exp_path = tpath("py_expect.json"), *script = tpath("check.py");
  json_t *exp = json_object(), *entries = json_object(), *qts = json_object(), *np = json_object();
  /* FP8 (e4m3 and e5m2), MXFP8 (E8M0 as U8), NVFP4 (packed U8, E4M3 scales), plain tensors */
  const cfg cs[] = {
      {"fp8", "fp8_tensor", "fp8_tensor", 0, HQ_BOTH, 16, 32, HQ_F32},
      {"fp8.e5m2", "fp8_tensor:dtype=e5m2", "fp8_tensor:dtype=e5m2", 0, HQ_ROWWISE, 8, 16, HQ_F32},
      {"mx", "mxfp8", "mxfp8", 0, HQ_BOTH, 32, 64, HQ_BF16},
      {"nv", "nvfp4", "nvfp4:rht=true", 0, HQ_BOTH, 16, 32, HQ_F32},
  };
  hq_ckpt_writer *w;
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(path, &w));
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    hq_qtensor *qt = quantize_cfg(&cs[i], 40 + i);
    HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, cs[i].name, qt));
    json_object_set_new(qts, cs[i].name, json_pack("[I,I]", (json_int_t)cs[i].rows,
                                                   (json_int_t)cs[i].cols));
    for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
      const hq_storage *st = hq_qtensor_storage(qt, dir);
      for (uint32_t b = 0; st && b < st->nbuf; b++) {
        const hq_buffer *buf = hq_storage_cbuf(st, b);
        if (dir == HQ_COLWISE && (buf->flags & HQ_BUF_SHARED)) continue;
        char name[128];
        snprintf(name, sizeof name, "%s/%s", cs[i].name, buf->name);
        expect_entry(entries, name, st_dtype(buf->dtype), buf->ndim, buf->shape, buf->ptr,
                     buf->bytes);
      }
    }
    hq_qtensor_free(qt);
  }
  hq_tensor pf = hq_test_tensor(HQ_F32, 3, 5, 1, 1.0f), pb = hq_test_tensor(HQ_BF16, 2, 4, 2, 1.0f);
  hq_tensor ph = hq_test_tensor(HQ_F16, 2, 3, 3, 1.0f);
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "adam.v", &pf));
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "master", &pb));
  const int64_t s35[2] = {3, 5}, s24[2] = {2, 4}, s23[2] = {2, 3};
  expect_entry(entries, "adam.v", "F32", 2, s35, pf.data, 60);
  expect_entry(entries, "master", "BF16", 2, s24, pb.data, 16);
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  /* a second file of numpy dtypes only (numpy has no bf16 or fp8): plain f32 / f16 tensors and
     an identity-format qtensor */
  HQ_OK_OR_FAIL(hq_ckpt_writer_open(np_path, &w));
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "adam.v", &pf));
  HQ_OK_OR_FAIL(hq_ckpt_add_tensor(w, g_ctx, "h", &ph));
  const cfg idc = {"id", NULL, NULL, 0, HQ_BOTH, 4, 4, HQ_F32};
  hq_qtensor *idq = quantize_cfg(&idc, 9);
  HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, "id", idq));
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  expect_entry(np, "adam.v", "float32", 2, s35, pf.data, 60);
  expect_entry(np, "h", "float16", 2, s23, ph.data, 12);
  const int64_t s44[2] = {4, 4};
  expect_entry(np, "id/data", "float32", 2, s44,
               hq_storage_cbuf(hq_qtensor_storage(idq, HQ_ROWWISE), 0)->ptr, 64);
  hq_qtensor_free(idq);
  json_object_set_new(exp, "entries", entries);
  json_object_set_new(exp, "qtensors", qts);
  json_object_set_new(exp, "np", np);
  json_object_set_new(exp, "hq_version", json_string(hq_version()));
  assert_int_equal(json_dump_file(exp, exp_path, 0), 0);
  json_decref(exp);
  write_file(script, k_py, strlen(k_py));
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "python3 '%s' '%s' '%s' '%s'", script, path, exp_path, np_path);
  fflush(stdout);
  int rc = system(cmd);
  if (rc != 0) fail_msg("python's safetensors rejected the checkpoint (%d): %s", rc, cmd);
  free(pf.data);
  free(pb.data);
  free(ph.data);
}

static void rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[1100];
  while (d && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (unlink(p) != 0) rmdir(p);
  }
  if (d) closedir(d);
  rmdir(dir);
}

int main(void) {
  if (hq_ckpt_writer_open(NULL, NULL) == HQ_ENOTSUP) {
    printf("test_checkpoint: libhqtrain was built without checkpoints (skipped)\n");
    return HQ_TEST_SKIP;
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/hq_ckpt_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return 1;
  }
  if (hq_ctx_create(NULL, &g_ctx) || hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &g_set)) {
    fprintf(stderr, "%s\n", hq_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),   cmocka_unit_test(test_header_content),
      cmocka_unit_test(test_shared_private), cmocka_unit_test(test_mismatch),
      cmocka_unit_test(test_nvfp4_options_mismatch),
      cmocka_unit_test(test_writer_rules), cmocka_unit_test(test_truncated),
      cmocka_unit_test(test_hostile_headers), cmocka_unit_test(test_hostile_meta),
      cmocka_unit_test(test_fuzz),        cmocka_unit_test(test_appended_option),
      cmocka_unit_test(test_layout_version),
      cmocka_unit_test(test_bit_flips),   cmocka_unit_test(test_foreign_file),
      cmocka_unit_test(test_foreign_entries), cmocka_unit_test(test_verify),
      cmocka_unit_test(test_two_writers), cmocka_unit_test(test_not_regular),
      cmocka_unit_test(test_output_target),
      cmocka_unit_test(test_killed_saves),
      cmocka_unit_test(test_full_disk),   cmocka_unit_test(test_required_keys),
#ifdef HQ_TEST_OOM
      cmocka_unit_test(test_oom),
#endif
      cmocka_unit_test(test_python),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
#ifndef HQ_TEST_OOM
  printf("oom: skipped (AddressSanitizer owns the allocator)\n");
#endif
  hq_plugins_close(g_set);
  hq_ctx_destroy(g_ctx);
  rm_tree(g_dir);
  return rc;
}
#endif
