/*
** fsdp.c -- the FSDP buffer protocol: which bytes of a shard's storages an all-gather moves,
** and how the gathered bytes become the full tensor's storages. Driven entirely by the rules each
** buffer carries (hq_buffer.gather, m_div) and the storages' shard-row multiple
** (hq_operand_desc.shard_rows): the core knows no format.
**
**   HQ_GATHER_ROWS  dim 0 runs along M: the first ceil(M_shard/m_div) rows of the buffer are
**                   sent as they are (a prefix: no copy); the full buffer receives the
**                   concatenation and zeros in its padding rows.
**   HQ_GATHER_COLS  dim 1 runs along M (a transposed copy): the first ceil(M_shard/m_div)
**                   columns are sent transposed (M-major, a staging copy the shard owns until
**                   hq_fsdp_release), concatenated along dim 0 and transposed back; padding
**                   columns are zero.
**   HQ_GATHER_SAME  not sent: equal on every shard (per-tensor scale, amax); copied from the
**                   local shard.
**   HQ_GATHER_NEVER refused, before any communication.
** A format that moves a buffer itself (plugin ABI 2.4, forms.c) gives it an FSDP form instead:
** its fsdp_extract writes the shard's form into staging, the form is listed in the buffer's
** place, and its fsdp_assign rebuilds the full buffer from the gathered form; the buffer's own
** rule is then not used.
*/
#include "config.h"
#include "hq_internal.h"

#include <stdlib.h>
#include <string.h>

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

int64_t hq_qtensor_shard_rows(const hq_qtensor *qt) {
  if (!qt || !hq_qtensor_dirs(qt)) return 0;
  int64_t l = 1;
  for (int d = 0; d < 2; d++) {
    if (!qt->d[d].present) continue;
    int64_t s = qt->d[d].st.desc.shard_rows;
    if (s <= 0) return 0;
    l = l / gcd64(l, s) * s;
  }
  return l;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The M entries of buffer b of a storage of M rows, along its M dimension. */
static int64_t m_entries(const hq_buffer *b, int64_t M) { return ceil_div(M, b->m_div); }

static int64_t elem_bytes(const hq_buffer *b) { return (int64_t)hq_dtype_size(b->dtype); }

/* Staging regions start at multiples of this (what a format's kernel may load as vectors). */
#define STAGE_ALIGN 256u
static size_t stage_round(size_t n) { return (n + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN; }

/* The forms of one storage's buffers (ndim 0: the buffer goes by its gather rule). */
typedef struct dir_forms {
  hq_buffer_form form[HQ_MAX_BUFFERS];
} dir_forms;

/* Check that qt can be extracted; count the entries and the staging bytes of the directions in
   `dirs` (every present direction is checked, so that a refusal does not depend on `dirs`); fill
   the forms. */
static int plan(const hq_qtensor *qt, uint32_t dirs, size_t *count, size_t *staging,
                const char *what, dir_forms forms[2]) {
  *count = 0;
  *staging = 0;
  memset(forms, 0, 2 * sizeof *forms);
  if (qt->saved) return hqi_error(HQ_ESTATE, "%s: role %s is saved", what, qt->role);
  if (!hq_qtensor_dirs(qt)) return hqi_error(HQ_ENOENT, "%s: role %s holds no direction", what,
                                            qt->role);
  for (int d = 0; d < 2; d++) {
    const hqi_qdir *q = &qt->d[d];
    if (!q->present) continue;
    const hqi_format *f = qt->fmt[d];
    int64_t sr = q->st.desc.shard_rows;
    if (sr <= 0)
      return hqi_error(HQ_ENOTSUP, "%s: role %s, %s format '%s' (plugin %s): this storage cannot "
                       "be sharded (its layout gives no shard-row multiple, e.g. stochastic "
                       "rounding draws by block position)", what, qt->role, hq_dir_name(d + 1u),
                       f->name, f->plugin->ops.name);
    if (qt->rows % sr)
      return hqi_error(HQ_ESHAPE, "%s: role %s, %s format '%s': the shard's %lld rows are not a "
                       "multiple of %lld (a block would straddle two shards)", what, qt->role,
                       hq_dir_name(d + 1u), f->name, (long long)qt->rows, (long long)sr);
    for (uint32_t i = 0; i < q->st.nbuf; i++) {
      const hq_buffer *b = hq_storage_cbuf(&q->st, i);
      if (!q->owned[i]) continue;
      hq_buffer_form *fm = &forms[d].form[i];
      int rc = hqi_buffer_form(f, &q->st, i, HQ_FORM_FSDP, qt->role, fm);
      if (rc) return rc;
      const int listed = (dirs & q->st.dir) != 0;
      if (fm->ndim) {
        if (!listed) continue;
        (*count)++;
        *staging += stage_round(fm->bytes);
        continue;
      }
      if (b->gather == HQ_GATHER_NEVER)
        return hqi_error(HQ_ENOTSUP, "%s: role %s, %s format '%s' (plugin %s): buffer '%s' "
                         "cannot be gathered%s", what, qt->role, hq_dir_name(d + 1u), f->name,
                         f->plugin->ops.name, b->name,
                         q->st.desc.scale_layout == HQ_SCALE_LAYOUT_SWIZZLED
                             ? " (swizzled scales: use the compact layout, swizzle = false)"
                             : "");
      if (b->gather == HQ_GATHER_SAME) continue;
      int64_t dim = b->gather == HQ_GATHER_ROWS ? b->shape[0] : b->shape[1];
      if (m_entries(b, qt->rows) > dim)
        return hqi_error(HQ_EABI, "%s: role %s: buffer '%s' has %lld entries along M, fewer "
                         "than the %lld its rule needs", what, qt->role, b->name, (long long)dim,
                         (long long)m_entries(b, qt->rows));
      if (!listed) continue;
      (*count)++;
      if (b->gather == HQ_GATHER_COLS)
        *staging += stage_round((size_t)(m_entries(b, qt->rows) * b->shape[0] * elem_bytes(b)));
    }
  }
  return HQ_OK;
}

void hq_fsdp_release(hq_qtensor *shard) {
  if (!shard || !shard->fsdp_staging) return;
  if (hqi_qtensor_owner_frees(shard)) hq_clear_error(); /* a dead device: the free fails alike */
  hqi_ctx_free_raw(shard->ctx, shard->fsdp_staging);
  shard->fsdp_staging = NULL;
}

/* The host transpose goes tile by tile so that the rows read and the rows written stay in cache
   while a tile is done: element by element across the whole matrix, every byte written lands
   on another cache line. 64 x 64 tiles of up to 8-byte elements are 32 KiB each way. */
#define TILE 64

#define TRANSPOSE_TILE(T, r0, r1, c0, c1)                                                      \
  for (int64_t c = c0; c < c1; c++) {                                                          \
    T *restrict d_ = (T *)dst + c * dld;                                                       \
    const T *restrict s_ = (const T *)src + c;                                                 \
    for (int64_t r = r0; r < r1; r++) d_[r] = s_[r * sld];                                     \
  }

#define TRANSPOSE_TILES(T)                                                                     \
  for (int64_t r0 = 0; r0 < rows; r0 += TILE)                                                  \
    for (int64_t c0 = 0; c0 < cols; c0 += TILE) {                                              \
      const int64_t r1 = r0 + TILE < rows ? r0 + TILE : rows;                                  \
      const int64_t c1 = c0 + TILE < cols ? c0 + TILE : cols;                                  \
      TRANSPOSE_TILE(T, r0, r1, c0, c1)                                                        \
    }

#ifdef __SSE2__
#include <emmintrin.h>
/* A 16 x 16 block of bytes transposed in registers: four rounds of interleaving pairs of rows
   (bytes, then 2-, 4- and 8-byte units) turn 16 row loads into 16 column stores. */
static void transpose16_u8(uint8_t *dst, int64_t dld, const uint8_t *src, int64_t sld) {
  __m128i x[16], y[16];
  for (int i = 0; i < 16; i++) x[i] = _mm_loadu_si128((const __m128i *)(src + i * sld));
  for (int i = 0; i < 8; i++) {
    y[2 * i] = _mm_unpacklo_epi8(x[2 * i], x[2 * i + 1]);
    y[2 * i + 1] = _mm_unpackhi_epi8(x[2 * i], x[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < 2; k++) {
      x[4 * i + 2 * k] = _mm_unpacklo_epi16(y[4 * i + k], y[4 * i + k + 2]);
      x[4 * i + 2 * k + 1] = _mm_unpackhi_epi16(y[4 * i + k], y[4 * i + k + 2]);
    }
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 4; k++) {
      y[8 * i + 2 * k] = _mm_unpacklo_epi32(x[8 * i + k], x[8 * i + k + 4]);
      y[8 * i + 2 * k + 1] = _mm_unpackhi_epi32(x[8 * i + k], x[8 * i + k + 4]);
    }
  for (int k = 0; k < 8; k++) {
    x[2 * k] = _mm_unpacklo_epi64(y[k], y[k + 8]);
    x[2 * k + 1] = _mm_unpackhi_epi64(y[k], y[k + 8]);
  }
  for (int j = 0; j < 16; j++) _mm_storeu_si128((__m128i *)(dst + j * dld), x[j]);
}
#endif

static void transpose_u8(uint8_t *dst, int64_t dld, const uint8_t *src, int64_t sld, int64_t rows,
                         int64_t cols) {
#ifdef __SSE2__
  const int64_t rows16 = rows / 16 * 16, cols16 = cols / 16 * 16;
  for (int64_t r0 = 0; r0 < rows16; r0 += TILE)
    for (int64_t c0 = 0; c0 < cols16; c0 += TILE) {
      const int64_t r1 = r0 + TILE < rows16 ? r0 + TILE : rows16;
      const int64_t c1 = c0 + TILE < cols16 ? c0 + TILE : cols16;
      for (int64_t r = r0; r < r1; r += 16)
        for (int64_t c = c0; c < c1; c += 16)
          transpose16_u8(dst + c * dld + r, dld, src + r * sld + c, sld);
    }
  /* the edges that do not fill a 16 x 16 block */
  TRANSPOSE_TILE(uint8_t, 0, rows16, cols16, cols)
  TRANSPOSE_TILE(uint8_t, rows16, rows, 0, cols)
#else
  TRANSPOSE_TILES(uint8_t)
#endif
}

static void transpose_host(void *dst, int64_t dld, const void *src, int64_t sld, int64_t rows,
                           int64_t cols, int64_t es) {
  switch (es) {
  case 1: transpose_u8(dst, dld, src, sld, rows, cols); return;
  case 2: TRANSPOSE_TILES(uint16_t) return;
  case 4: TRANSPOSE_TILES(uint32_t) return;
  case 8: TRANSPOSE_TILES(uint64_t) return;
  default:
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        memcpy((char *)dst + (c * dld + r) * es, (const char *)src + (r * sld + c) * es,
               (size_t)es);
  }
}

/* dst[c][r] = src[r][c] for a [rows, cols] block of es-byte elements (leading dims in elements). */
static int transpose(hq_ctx *ctx, void *dst, int64_t dld, const void *src, int64_t sld,
                     int64_t rows, int64_t cols, int64_t es) {
  if (ctx->device >= 0)
    return hqi_cuda_transpose(ctx->stream, dst, dld, src, sld, rows, cols, (int)es);
  transpose_host(dst, dld, src, sld, rows, cols, es);
  return HQ_OK;
}

/* A copy within the context's device (or the host). */
static int copy_on_device(hq_ctx *ctx, void *dst, const void *src, size_t bytes) {
  return hq_ctx_memcpy(ctx, dst, ctx->device, src, ctx->device, bytes);
}

int hq_fsdp_extract(hq_qtensor *shard, hq_ctx *ctx, hq_fsdp_buffer *out, size_t cap,
                    size_t elem_size, size_t *n) {
  return hq_fsdp_extract_dirs(shard, ctx, HQ_BOTH, out, cap, elem_size, n);
}

int hq_fsdp_extract_dirs(hq_qtensor *shard, hq_ctx *ctx, uint32_t dirs, hq_fsdp_buffer *out,
                         size_t cap, size_t elem_size, size_t *n) {
  if (!shard || !ctx || !n || (!out && cap))
    return hqi_error(HQ_EINVAL, "hq_fsdp_extract: NULL argument");
  if (!dirs || (dirs & ~(uint32_t)HQ_BOTH))
    return hqi_error(HQ_EINVAL, "hq_fsdp_extract_dirs: dirs 0x%x is not HQ_ROWWISE, HQ_COLWISE "
                     "or both", dirs);
  if (cap && elem_size < HQ_FSDP_BUFFER_SIZE_0_2)
    return hqi_error(HQ_EINVAL, "hq_fsdp_extract: elem_size %zu is smaller than the oldest "
                     "hq_fsdp_buffer (%zu bytes)", elem_size, (size_t)HQ_FSDP_BUFFER_SIZE_0_2);
  if (ctx->device != shard->ctx->device)
    return hqi_error(HQ_EINVAL, "hq_fsdp_extract: the context runs on device %d, the shard lives "
                     "on %d", ctx->device, shard->ctx->device);
  if (shard->aliased) /* its data is the caller's source, not a buffer hq may move */
    return hqi_error(HQ_ESTATE, "hq_fsdp_extract: role %s borrows its source's memory (made "
                     "with HQ_QUANTIZE_ALIAS)", shard->role);
  size_t count, staging;
  dir_forms forms[2];
  int rc = plan(shard, dirs, &count, &staging, "hq_fsdp_extract", forms);
  *n = count;
  if (rc) return rc;
  if (cap < count)
    return hqi_error(HQ_EINVAL, "hq_fsdp_extract: role %s needs %zu entries, %zu given",
                     shard->role, count, cap);
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  hq_fsdp_release(shard);
  if (staging) {
    shard->fsdp_staging = hqi_ctx_alloc_raw(shard->ctx, staging);
    if (!shard->fsdp_staging)
      rc = hqi_error(HQ_ENOMEM, "hq_fsdp_extract: %zu bytes of staging on device %d", staging,
                     ctx->device);
    else
      rc = hqi_qtensor_foreign_alloc(shard, ctx);
  }
  char *stage = shard->fsdp_staging;
  size_t k = 0;
  for (int d = 0; d < 2 && !rc; d++) {
    hqi_qdir *q = &shard->d[d];
    if (!q->present || !(dirs & q->st.dir)) continue;
    for (uint32_t i = 0; i < q->st.nbuf && !rc; i++) {
      hq_buffer *b = HQ_STORAGE_BUF(&q->st, i);
      if (!q->owned[i] || (b->gather == HQ_GATHER_SAME && !forms[d].form[i].ndim)) continue;
      hq_fsdp_buffer e;
      memset(&e, 0, sizeof e);
      e.struct_size = (uint32_t)(elem_size < sizeof e ? elem_size : sizeof e);
      e.dir = q->st.dir;
      e.name = b->name;
      e.dtype = b->dtype;
      e.device = ctx->device;
      e.rows = m_entries(b, shard->rows);
      const int64_t es = elem_bytes(b);
      hq_buffer_form *fm = &forms[d].form[i];
      if (fm->ndim) { /* the format writes the matrix itself */
        e.dtype = fm->dtype;
        e.rows = fm->shape[0];
        e.row_bytes = fm->shape[1] * (int64_t)hq_dtype_size(fm->dtype);
        e.ptr = fm->ptr = stage;
        rc = hqi_form_write(shard->fmt[d], ctx, &q->st, i, fm, HQ_FORM_FSDP, shard->role);
        stage += stage_round(fm->bytes);
      } else if (b->gather == HQ_GATHER_ROWS) {
        e.row_bytes = (int64_t)(b->bytes / (size_t)b->shape[0]);
        e.ptr = b->ptr;
      } else {
        e.row_bytes = b->shape[0] * es;
        e.ptr = stage;
        rc = transpose(ctx, stage, b->shape[0], b->ptr, b->shape[1], b->shape[0], e.rows, es);
        stage += stage_round((size_t)(e.rows * e.row_bytes));
      }
      hqi_elem_put(out, k++, elem_size, &e, sizeof e);
    }
  }
  const int mk = hqi_qtensor_mark_use(shard, ctx);
  if (!rc) rc = mk;
  if (rc) hq_fsdp_release(shard);
  hqi_device_leave(saved);
  return rc;
}

int hq_fsdp_assign(hq_qtensor *full, hq_ctx *ctx, const hq_qtensor *shard,
                   const hq_fsdp_buffer *gathered, size_t n, size_t elem_size) {
  if (!full || !ctx || !shard || (!gathered && n))
    return hqi_error(HQ_EINVAL, "hq_fsdp_assign: NULL argument");
  if (n && elem_size < HQ_FSDP_BUFFER_SIZE_0_2)
    return hqi_error(HQ_EINVAL, "hq_fsdp_assign: elem_size %zu is smaller than the oldest "
                     "hq_fsdp_buffer (%zu bytes)", elem_size, (size_t)HQ_FSDP_BUFFER_SIZE_0_2);
  if (ctx->device != full->ctx->device || ctx->device != shard->ctx->device)
    return hqi_error(HQ_EINVAL, "hq_fsdp_assign: the context, the full tensor and the shard must "
                     "be on one device (%d, %d, %d)", ctx->device, full->ctx->device,
                     shard->ctx->device);
  if (full->aliased || shard->aliased)
    return hqi_error(HQ_ESTATE, "hq_fsdp_assign: role %s borrows its source's memory (made with "
                     "HQ_QUANTIZE_ALIAS)", full->aliased ? full->role : shard->role);
  if (hq_qtensor_dirs(full) != hq_qtensor_dirs(shard) || full->cols != shard->cols)
    return hqi_error(HQ_EINVAL, "hq_fsdp_assign: role %s: the full tensor (directions 0x%x, %lld "
                     "columns) does not match the shard (0x%x, %lld)", full->role,
                     hq_qtensor_dirs(full), (long long)full->cols, hq_qtensor_dirs(shard),
                     (long long)shard->cols);
  for (int d = 0; d < 2; d++)
    if (full->d[d].present &&
        (full->fmt[d]->plugin != shard->fmt[d]->plugin ||
         strcmp(full->fmt[d]->name, shard->fmt[d]->name) != 0))
      return hqi_error(HQ_EINVAL, "hq_fsdp_assign: role %s: the %s formats differ ('%s' full, "
                       "'%s' shard)", full->role, hq_dir_name(d + 1u), full->fmt[d]->name,
                       shard->fmt[d]->name);
  size_t count, staging;
  dir_forms forms[2];
  int rc = plan(full, HQ_BOTH, &count, &staging, "hq_fsdp_assign", forms);
  if (rc) return rc;
  if (n != count)
    return hqi_error(HQ_EINVAL, "hq_fsdp_assign: role %s expects %zu gathered buffers, %zu given",
                     full->role, count, n);
  /* check every entry before writing anything */
  for (int pass = 0; pass < 2; pass++) {
    size_t k = 0;
    int saved = -1;
    if (pass == 1 && (rc = hqi_device_enter(ctx->device, &saved))) return rc;
    for (int d = 0; d < 2 && !rc; d++) {
      hqi_qdir *q = &full->d[d];
      const hqi_qdir *sq = &shard->d[d];
      if (!q->present) continue;
      for (uint32_t i = 0; i < q->st.nbuf && !rc; i++) {
        hq_buffer *b = HQ_STORAGE_BUF(&q->st, i);
        if (!q->owned[i]) continue;
        hq_buffer_form *fm = &forms[d].form[i];
        if (b->gather == HQ_GATHER_SAME && !fm->ndim) {
          const hq_buffer *sb = i < sq->st.nbuf ? hq_storage_cbuf(&sq->st, i) : NULL;
          if (pass == 0 && (!sb || !sb->ptr || strcmp(sb->name, b->name) != 0 ||
                            sb->bytes != b->bytes))
            return hqi_error(HQ_EINVAL, "hq_fsdp_assign: role %s: the shard has no buffer '%s' "
                             "of %zu bytes to copy", full->role, b->name, b->bytes);
          if (pass == 1) rc = copy_on_device(ctx, b->ptr, sb->ptr, b->bytes);
          continue;
        }
        hq_fsdp_buffer e;
        hqi_elem_get(&e, sizeof e, gathered, k, elem_size);
        const int64_t es = elem_bytes(b);
        const int64_t rows = fm->ndim ? fm->shape[0] : m_entries(b, full->rows);
        const int64_t row_bytes = fm->ndim ? fm->shape[1] * (int64_t)hq_dtype_size(fm->dtype)
                                  : b->gather == HQ_GATHER_ROWS
                                      ? (int64_t)(b->bytes / (size_t)b->shape[0])
                                      : b->shape[0] * es;
        if (pass == 0) {
          if (!e.ptr || e.dir != q->st.dir || !e.name || strcmp(e.name, b->name) != 0 ||
              e.rows != rows || e.row_bytes != row_bytes || e.device != ctx->device)
            return hqi_error(HQ_EINVAL, "hq_fsdp_assign: role %s: gathered entry %zu (%s '%s', "
                             "%lld rows of %lld bytes, device %d) is not the %s buffer '%s' of the "
                             "full tensor (%lld rows of %lld bytes, device %d)", full->role, k,
                             hq_dir_name(e.dir), e.name ? e.name : "?", (long long)e.rows,
                             (long long)e.row_bytes, e.device, hq_dir_name(q->st.dir), b->name,
                             (long long)rows, (long long)row_bytes, ctx->device);
        } else if (fm->ndim) { /* the format rebuilds the buffer from its gathered form */
          fm->ptr = e.ptr;
          rc = hqi_form_read(full->fmt[d], ctx, &q->st, i, fm, HQ_FORM_FSDP, full->role);
        } else if (b->gather == HQ_GATHER_ROWS) {
          size_t used = (size_t)(rows * row_bytes);
          /* a gather may have received the rows in place (e.ptr is the buffer, as
             hq_fsdp_extract of the full tensor lists it): nothing to copy then */
          if (e.ptr != b->ptr) rc = copy_on_device(ctx, b->ptr, e.ptr, used);
          if (!rc) rc = hqi_ctx_memset(ctx, (char *)b->ptr + used, 0, b->bytes - used);
        } else {
          /* the transpose fills columns [0, rows) of every row; the padding columns after them
             are zeroed: on a device by one memset first (one call, not one per row), on the
             host row by row, so that the bytes the transpose writes are written once */
          const int64_t pad = b->shape[1] - rows;
          if (ctx->device >= 0 && pad) rc = hqi_ctx_memset(ctx, b->ptr, 0, b->bytes);
          if (!rc) rc = transpose(ctx, b->ptr, b->shape[1], e.ptr, b->shape[0], rows, b->shape[0], es);
          for (int64_t r = 0; r < b->shape[0] && !rc && ctx->device < 0 && pad; r++)
            memset((char *)b->ptr + (r * b->shape[1] + rows) * es, 0, (size_t)(pad * es));
        }
        k++;
      }
    }
    if (pass == 1) {
      const int mk = hqi_qtensor_mark_use(full, ctx);
      if (!rc) rc = mk;
      hqi_device_leave(saved);
    }
  }
  return rc;
}
