/*
** hq_alloc_fail.h -- failing allocations on purpose: replaces malloc, calloc, realloc, free,
** memalign, aligned_alloc and posix_memalign of the whole process (the libraries bind to these,
** hence the default visibility) with counting wrappers around glibc's __libc_* allocator. While
** g_armed, allocation number g_fail_at (counted in g_count from 0 since arming) fails with ENOMEM
** and sets g_failed; g_live counts outstanding allocations. Include it in ONE translation unit of a
** test program, and not under AddressSanitizer (which owns malloc): guard the include with
** #if !defined(__SANITIZE_ADDRESS__).
*/
#ifndef HQ_ALLOC_FAIL_H
#define HQ_ALLOC_FAIL_H

#include <errno.h>
#include <stddef.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

static long long g_fail_at = -1; /* index of the allocation to fail while armed */
static long long g_count;        /* allocations since arming */
static long long g_live;         /* outstanding allocations */
static int g_armed, g_failed;

/* exported (the build hides symbols by default): the libraries must bind to these */
#define EXPORT __attribute__((visibility("default")))

static int fail_now(void) {
  if (!g_armed) return 0;
  if (g_count++ == g_fail_at) {
    g_failed = 1;
    errno = ENOMEM; /* as the C library's allocator does */
    return 1;
  }
  return 0;
}

EXPORT void *malloc(size_t n) {
  if (fail_now()) return NULL;
  void *p = __libc_malloc(n);
  if (p) g_live++;
  return p;
}
EXPORT void *calloc(size_t n, size_t s) {
  if (fail_now()) return NULL;
  void *p = __libc_calloc(n, s);
  if (p) g_live++;
  return p;
}
EXPORT void *realloc(void *p, size_t n) {
  if (fail_now()) return NULL;
  void *q = __libc_realloc(p, n);
  if (!p && q) g_live++;
  if (p && !n && !q) g_live--;
  return q;
}
EXPORT void free(void *p) {
  if (p) g_live--;
  __libc_free(p);
}
EXPORT void *memalign(size_t a, size_t n) {
  if (fail_now()) return NULL;
  void *p = __libc_memalign(a, n);
  if (p) g_live++;
  return p;
}
EXPORT void *aligned_alloc(size_t a, size_t n) { return memalign(a, n); }
EXPORT int posix_memalign(void **out, size_t a, size_t n) {
  void *p = memalign(a, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}

#endif
