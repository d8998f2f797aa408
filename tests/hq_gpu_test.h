/*
** hq_gpu_test.h -- what the GPU tests share: comparing a device quantization with the CPU
** reference byte for byte, and moving a caller's amax pair to and from the device. Include after
** hq_test.h.
*/
#ifndef HQ_GPU_TEST_H
#define HQ_GPU_TEST_H

#include "hq_test.h"

/* Every buffer of direction `dir` of g (on dev's device) equals h's (host), byte for byte; a
   difference fails the test naming the buffer, the byte and both values. */
static inline void hq_gpu_compare_dir(hq_ctx *dev, const hq_qtensor *h, const hq_qtensor *g,
                                      uint32_t dir, const char *what) {
  const hq_storage *sh = hq_qtensor_storage(h, dir), *sg = hq_qtensor_storage(g, dir);
  assert_non_null(sh);
  assert_non_null(sg);
  assert_int_equal(sh->nbuf, sg->nbuf);
  for (uint32_t i = 0; i < sh->nbuf; i++) {
    const hq_buffer *bh = hq_storage_cbuf(sh, i), *bg = hq_storage_cbuf(sg, i);
    size_t n = bh->bytes;
    assert_int_equal(bg->bytes, n);
    if (!n) continue;
    uint8_t *tmp = malloc(n);
    HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, tmp, HQ_DEVICE_HOST, bg->ptr, hq_ctx_device(dev), n));
    HQ_OK_OR_FAIL(hq_ctx_sync(dev));
    if (memcmp(tmp, bh->ptr, n) != 0) {
      size_t k = 0;
      while (((uint8_t *)bh->ptr)[k] == tmp[k]) k++;
      fail_msg("%s: dir %u buffer '%s' differs at byte %zu of %zu: cpu %02x gpu %02x", what, dir,
               bh->name, k, n, ((uint8_t *)bh->ptr)[k], tmp[k]);
    }
    free(tmp);
  }
}

/* The directions of `usage`. */
static inline void hq_gpu_compare_usage(hq_ctx *dev, const hq_qtensor *h, const hq_qtensor *g,
                                        uint32_t usage, const char *what) {
  if (usage & HQ_ROWWISE) hq_gpu_compare_dir(dev, h, g, HQ_ROWWISE, what);
  if (usage & HQ_COLWISE) hq_gpu_compare_dir(dev, h, g, HQ_COLWISE, what);
}

/* Two floats (a rowwise and a columnwise amax) in device memory (free with hq_ctx_free). */
static inline float *hq_gpu_amax_to_dev(hq_ctx *dev, const float a[2]) {
  void *p = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(dev, 2 * sizeof(float), &p));
  HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, p, hq_ctx_device(dev), a, HQ_DEVICE_HOST, 2 * sizeof(float)));
  return p;
}
static inline void hq_gpu_amax_to_host(hq_ctx *dev, const float *p, float out[2]) {
  HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, out, HQ_DEVICE_HOST, p, hq_ctx_device(dev), 2 * sizeof(float)));
  HQ_OK_OR_FAIL(hq_ctx_sync(dev));
}

#endif
