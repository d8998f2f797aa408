/*
** scratch.h -- which buffer a context's call scratch takes (ctx.c, hqi_ctx_scratch_alloc): the
** rules over the slots of kept buffers, as pure functions so that tests/test_scratch.c checks
** them on the host; ctx.c does the allocating, freeing and locking.
*/
#ifndef HQ_SCRATCH_H
#define HQ_SCRATCH_H

#include <stddef.h>

/* One slot: a kept buffer (p NULL: empty) */
struct hqi_scratch {
  void *p;
  size_t bytes;
  int busy;   /* handed out and not yet given back */
  int pinned; /* handed out inside a capture: a graph may use it, never evicted */
};

/* The kept buffer a request of `bytes` takes: of those not handed out and at least that large,
   the smallest (best fit, so that a small request leaves the large buffers to large ones);
   -1 when none is. */
static inline int hqi_scratch_fit(const struct hqi_scratch *s, int n, size_t bytes) {
  int fit = -1;
  for (int i = 0; i < n; i++)
    if (s[i].p && !s[i].busy && s[i].bytes >= bytes && (fit < 0 || s[i].bytes < s[fit].bytes))
      fit = i;
  return fit;
}

/* The slot a new buffer of `bytes` is kept in: the first empty one; else the smallest buffer
   neither handed out nor pinned that is smaller than it, which the caller frees (so that the
   slots come to hold the step's largest requests); -1 when none is (the buffer is not kept). */
static inline int hqi_scratch_slot(const struct hqi_scratch *s, int n, size_t bytes) {
  int slot = -1;
  for (int i = 0; i < n; i++) {
    if (!s[i].p) return i;
    if (!s[i].busy && !s[i].pinned && s[i].bytes < bytes &&
        (slot < 0 || s[i].bytes < s[slot].bytes))
      slot = i;
  }
  return slot;
}

#endif /* HQ_SCRATCH_H */
