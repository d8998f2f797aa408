/*
** test_scratch.c -- the rules by which a CUDA context's call scratch takes a kept buffer
** (core/scratch.h; ctx.c's hqi_ctx_scratch_alloc, whose capture on a device test_gpu_graph_step
** checks): a request takes the smallest kept buffer that is free and large enough, never one
** handed out, and none when every free one is too small; a new buffer is kept in the first empty
** slot, else in place of the smallest free, unpinned buffer smaller than it, and is not kept
** when every slot holds a buffer handed out, pinned by a capture, or at least as large. The
** slots are written out by hand here, and every answer is the expected index.
*/
#include <stdint.h>

#include "hq_test.h"
#include "scratch.h"

/* A slot holding a buffer of `bytes` (the address only marks it kept). */
static struct hqi_scratch kept(size_t bytes, int busy, int pinned) {
  struct hqi_scratch s = {(void *)(uintptr_t)(0x1000 + bytes), bytes, busy, pinned};
  return s;
}

static void test_fit(void **state) {
  (void)state;
  struct hqi_scratch s[5] = {kept(4096, 0, 0), kept(256, 0, 0), kept(1024, 1, 0),
                             kept(8, 0, 1), {0}};
  assert_int_equal(hqi_scratch_fit(s, 5, 1), 3);     /* the smallest, pinned or not */
  assert_int_equal(hqi_scratch_fit(s, 5, 8), 3);     /* exactly its size */
  assert_int_equal(hqi_scratch_fit(s, 5, 9), 1);     /* 256 before 4096 */
  assert_int_equal(hqi_scratch_fit(s, 5, 512), 0);   /* 1024 is handed out: 4096 */
  assert_int_equal(hqi_scratch_fit(s, 5, 4096), 0);
  assert_int_equal(hqi_scratch_fit(s, 5, 4097), -1); /* none large enough */
  s[0].busy = 1;
  assert_int_equal(hqi_scratch_fit(s, 5, 512), -1);  /* the only large ones handed out */
  struct hqi_scratch empty[3] = {{0}, {0}, {0}};
  assert_int_equal(hqi_scratch_fit(empty, 3, 1), -1);
  assert_int_equal(hqi_scratch_fit(empty, 0, 1), -1);
}

static void test_slot(void **state) {
  (void)state;
  /* an empty slot first, wherever it lies, though a smaller free buffer comes before it */
  struct hqi_scratch a[4] = {kept(16, 0, 0), kept(32, 1, 0), {0}, kept(64, 0, 0)};
  assert_int_equal(hqi_scratch_slot(a, 4, 1 << 20), 2);
  /* full: the smallest free, unpinned buffer smaller than the new one */
  struct hqi_scratch b[4] = {kept(512, 0, 0), kept(64, 1, 0), kept(32, 0, 1), kept(128, 0, 0)};
  assert_int_equal(hqi_scratch_slot(b, 4, 1024), 3); /* 128: 64 handed out, 32 pinned */
  assert_int_equal(hqi_scratch_slot(b, 4, 256), 3);
  assert_int_equal(hqi_scratch_slot(b, 4, 129), 3);
  assert_int_equal(hqi_scratch_slot(b, 4, 128), -1); /* nothing smaller is free and unpinned */
  assert_int_equal(hqi_scratch_slot(b, 4, 16), -1);
  b[3].busy = 1;
  assert_int_equal(hqi_scratch_slot(b, 4, 1024), 0); /* then 512 */
  b[0].pinned = 1;
  assert_int_equal(hqi_scratch_slot(b, 4, 1024), -1); /* not kept */
  assert_int_equal(hqi_scratch_slot(b, 0, 1024), -1);
}

/* The two together over a step's requests, as ctx.c takes them: an eager step fills the slots,
   a second identical step (a capture's) finds every request kept. */
static void test_steps(void **state) {
  (void)state;
  enum { N = 4 };
  struct hqi_scratch s[N] = {{0}};
  /* each GEMM: two operands and an 8-byte slot, all given back at its end */
  const size_t gemm[3][3] = {{4096, 2048, 8}, {2048, 8192, 8}, {8192, 4096, 8}};
  for (int step = 0; step < 2; step++) {
    int kept_now = 0;
    for (int g = 0; g < 3; g++) {
      int held[3];
      for (int o = 0; o < 3; o++) {
        int f = hqi_scratch_fit(s, N, gemm[g][o]);
        if (f < 0) {
          assert_int_equal(step, 0); /* the second step finds every request kept */
          f = hqi_scratch_slot(s, N, gemm[g][o]);
          if (f >= 0) s[f] = kept(gemm[g][o], 0, 0);
        } else {
          kept_now++;
        }
        if (f >= 0) s[f].busy = 1;
        held[o] = f;
      }
      for (int o = 0; o < 3; o++)
        if (held[o] >= 0) s[held[o]].busy = 0;
    }
    if (step == 1) assert_int_equal(kept_now, 9);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fit),
      cmocka_unit_test(test_slot),
      cmocka_unit_test(test_steps),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
