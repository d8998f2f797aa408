/*
** util.c -- strings, vectors, aligned host memory, dtype tables, tensor checks, element
** conversion.
*/
#include "config.h"
#include "hq_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hq/numerics.h"

const char *hq_version(void) { return PACKAGE_VERSION; }

/* The name rule every module kind shares: 1-31 characters of [a-z0-9_], so that a name is a
   recipe key, a file name and a checkpoint word alike. 1, or 0 with the reason in why (`kind`
   names what is named, "format" or "GEMM provider"). */
int hqi_name_ok(const char *kind, const char *name, char *why, size_t len) {
  size_t n = 0;
  for (; name && name[n]; n++) {
    const char c = name[n];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) break;
  }
  if (name && !name[n] && n >= 1 && n <= 31) return 1;
  snprintf(why, len, "%s name %s%s%s is not 1-31 characters of [a-z0-9_]", kind,
           name ? "'" : "", name ? name : "(NULL)", name ? "'" : "");
  return 0;
}

/* The version rule every module kind shares: the same major, a required minor no newer than the
   core's. 1 when the module may load; 0 with the reason in why (`abi` names the ABI, "plugin" or
   "GEMM provider"). */
int hqi_abi_compatible(const char *abi, unsigned major, unsigned minor, unsigned core_major,
                       unsigned core_minor, char *why, size_t len) {
  if (major != core_major) {
    snprintf(why, len, "built for %s ABI %u (requires %u.%u), but this core implements %s ABI "
             "%u.%u (major versions must match)", abi, major, major, minor, abi, core_major,
             core_minor);
    return 0;
  }
  if (minor > core_minor) {
    snprintf(why, len, "requires %s ABI %u.%u, newer than this core's %u.%u (upgrade libhqcore)",
             abi, major, minor, core_major, core_minor);
    return 0;
  }
  return 1;
}

/* Allocation failures of this thread, counted by every core allocation helper: a multi-step
   build (a recipe parse) compares the count before and after and refuses a partial result. */
static _Thread_local uint64_t oom_events;
uint64_t hqi_oom_events(void) { return oom_events; }
void hqi_oom_note(void) { oom_events++; }

void *hqi_malloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) oom_events++;
  return p;
}
void *hqi_calloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) oom_events++;
  return p;
}

char *hqi_strdup(const char *s) { return s ? hqi_strndup(s, strlen(s)) : NULL; }

char *hqi_strndup(const char *s, size_t n) {
  if (n == SIZE_MAX) {
    oom_events++;
    return NULL;
  }
  char *d = hqi_malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

char *hqi_asprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  char *s = hqi_malloc((size_t)n + 1);
  if (!s) return NULL;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

int hqi_vec_push(hqi_vec *a, void *p) {
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 8;
    void **v = cap <= SIZE_MAX / sizeof *v ? realloc(a->v, cap * sizeof *v) : NULL;
    if (!v) {
      oom_events++;
      return hqi_error(HQ_ENOMEM, "out of memory (a list of %zu entries)", cap);
    }
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = p;
  return HQ_OK;
}

void hqi_vec_free(hqi_vec *a) {
  free(a->v);
  a->v = NULL;
  a->n = a->cap = 0;
}

void *hqi_host_alloc(size_t bytes) {
  void *p = NULL;
  if (bytes > SIZE_MAX - 63) { /* the round-up below would wrap to a tiny block */
    oom_events++;
    return NULL;
  }
  size_t rounded = (bytes + 63) & ~(size_t)63;
  if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0) {
    oom_events++;
    return NULL;
  }
  return p;
}

void hqi_host_free(void *p) { free(p); }

// --- dtypes ---------------------------------------------------------------------------------

static const struct {
  hq_dtype t;
  const char *name;
  size_t size;
} dtypes[] = {
    {HQ_F32, "f32", 4},   {HQ_F16, "f16", 2},   {HQ_BF16, "bf16", 2},
    {HQ_U8, "u8", 1},     {HQ_E4M3, "e4m3", 1}, {HQ_E5M2, "e5m2", 1},
    {HQ_E8M0, "e8m0", 1}, {HQ_E2M1X2, "e2m1x2", 1}, {HQ_I32, "i32", 4},
    {HQ_I8, "i8", 1},     {HQ_E3M2X4, "e3m2x4", 1}, {HQ_E2M3X4, "e2m3x4", 1},
    {HQ_I4X2, "i4x2", 1},
};

const char *hq_dtype_name(hq_dtype t) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (dtypes[i].t == t) return dtypes[i].name;
  return "invalid";
}

const char *hq_dir_name(uint32_t dir) {
  return dir == HQ_ROWWISE ? "rowwise" : dir == HQ_COLWISE ? "columnwise" : "invalid";
}

hq_dtype hq_dtype_from_name(const char *name) {
  if (!name) return HQ_DTYPE_INVALID;
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (strcmp(dtypes[i].name, name) == 0) return dtypes[i].t;
  return HQ_DTYPE_INVALID;
}

size_t hq_dtype_size(hq_dtype t) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (dtypes[i].t == t) return dtypes[i].size;
  return 0;
}

int hqi_shape_bytes(hq_dtype dtype, int ndim, const int64_t *shape, size_t *bytes) {
  size_t n = hq_dtype_size(dtype);
  if (!n || ndim < 1 || ndim > HQ_MAX_BUFFER_DIMS) return 0;
  for (int k = 0; k < ndim; k++) {
    if (shape[k] < 0 || (shape[k] && n > SIZE_MAX / (size_t)shape[k])) return 0;
    n *= (size_t)shape[k];
  }
  *bytes = n;
  return 1;
}

int hqi_struct_in(void *dst, size_t dst_size, const void *src, size_t src_size, size_t floor,
                  const char *what) {
  memset(dst, 0, dst_size);
  if (src_size < floor)
    return hqi_error(HQ_EINVAL, "%s.struct_size = %zu is smaller than the oldest layout (%zu "
                     "bytes): set it to sizeof(%s)", what, src_size, floor, what);
  memcpy(dst, src, src_size < dst_size ? src_size : dst_size);
  ((uint32_t *)dst)[0] = (uint32_t)dst_size; /* struct_size is the first field of each struct */
  return HQ_OK;
}

int hqi_struct_out(void *dst, const void *src, size_t src_size, size_t floor, const char *what) {
  uint32_t n;
  memcpy(&n, dst, sizeof n); /* struct_size is the first field of each struct */
  if (n < floor)
    return hqi_error(HQ_EINVAL, "%s.struct_size = %u is smaller than the oldest layout (%zu "
                     "bytes): set it to sizeof(%s)", what, n, floor, what);
  if (n > src_size) n = (uint32_t)src_size;
  memcpy(dst, src, n);
  memcpy(dst, &n, sizeof n);
  return HQ_OK;
}

void hqi_elem_get(void *dst, size_t dst_size, const void *base, size_t i, size_t elem_size) {
  memset(dst, 0, dst_size);
  memcpy(dst, (const char *)base + i * elem_size, elem_size < dst_size ? elem_size : dst_size);
}

void hqi_elem_put(void *base, size_t i, size_t elem_size, const void *src, size_t src_size) {
  memcpy((char *)base + i * elem_size, src, elem_size < src_size ? elem_size : src_size);
}

int hqi_tensor_in(const hq_tensor *t, const char *what, hq_tensor *out) {
  if (!t) return hqi_error(HQ_EINVAL, "%s: tensor is NULL", what);
  int rc = hqi_struct_in(out, sizeof *out, t, t->struct_size, HQ_TENSOR_SIZE_2_0, "hq_tensor");
  if (rc) return hqi_error_prefix(rc, "%s", what);
  return hqi_check_tensor(out, what);
}

int hq_tensor_check(const hq_tensor *t, const char *what, hq_tensor *out) {
  if (!out) return hqi_error(HQ_EINVAL, "%s: out is NULL", what ? what : "hq_tensor_check");
  return hqi_tensor_in(t, what ? what : "hq_tensor_check", out);
}

hq_fpenv hq_fpenv_enter(void) { return hqi_fp_enter(); }
void hq_fpenv_leave(hq_fpenv mode) { hqi_fp_leave(mode); }

int hqi_check_shape(int64_t rows, int64_t cols, const char *what) {
  if (rows <= 0 || cols <= 0)
    return hqi_error(HQ_ESHAPE, "%s: shape [%lld, %lld] must be positive", what, (long long)rows,
                     (long long)cols);
  if (rows > HQI_MAX_ELEMENTS / cols)
    return hqi_error(HQ_ESHAPE, "%s: shape [%lld, %lld] has more than 2^%d elements", what,
                     (long long)rows, (long long)cols, HQI_MAX_ELEMENTS_LOG2);
  return HQ_OK;
}

int hqi_check_tensor(const hq_tensor *t, const char *what) {
  if (!t) return hqi_error(HQ_EINVAL, "%s: tensor is NULL", what);
  if (t->dtype != HQ_F32 && t->dtype != HQ_F16 && t->dtype != HQ_BF16)
    return hqi_error(HQ_EINVAL, "%s: dtype %s is not a high-precision type (f32, f16, bf16)",
                     what, hq_dtype_name(t->dtype));
  int rc = hqi_check_shape(t->rows, t->cols, what);
  if (rc) return rc;
  if (!t->data) return hqi_error(HQ_EINVAL, "%s: data pointer is NULL", what);
  /* the alignment rule (hq_tensor in hq/plugin.h): element-aligned, nothing more */
  size_t es = hq_dtype_size(t->dtype);
  if ((uintptr_t)t->data % es != 0)
    return hqi_error(HQ_EINVAL, "%s: data %p is not aligned to its %s element size (%zu bytes): "
                     "hq_tensor data must be element-aligned", what, t->data,
                     hq_dtype_name(t->dtype), es);
  return HQ_OK;
}

int hqi_convert(int device, void *stream, void *dst, int dt, const void *src, int st, int64_t n) {
  if (device != HQ_DEVICE_HOST) return hqi_cuda_convert(stream, dst, dt, src, st, n);
  if (dt == st) {
    if (n > 0) memcpy(dst, src, (size_t)n * hq_dtype_size((hq_dtype)dt));
    return HQ_OK;
  }
  const hqi_fpenv fe = hqi_fp_enter();
  for (int64_t i = 0; i < n; i++) hq_store_hp(dst, i, dt, hq_load_hp(src, i, st));
  hqi_fp_leave(fe);
  return HQ_OK;
}
