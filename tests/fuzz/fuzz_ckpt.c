/*
** fuzz_ckpt.c -- libFuzzer target: the checkpoint reader (services/ckpt_*.c) on arbitrary bytes
** as a file: opened with and without checksum verification, verified (hq_ckpt_verify), its
** metadata keys listed and every entry described (hq_ckpt_entry), then the tensors the seeds
** hold loaded ("t": F32 [3, 5]; "q": a [32, 32] qtensor of both directions, tried in every
** format of fuzz_formats.h, so a file of one format also meets the others' checks) and every
** direction a load accepted dequantized on the host: a file that passes the checks with hostile
** codes in its buffers (NaN and out-of-range scales, any amax) is still only numbers. Every call
** is HQ_OK or a refusal with a message; nothing reads outside the file or a buffer
** (scripts/fuzz.sh).
*/
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_formats.h"
#include "hq/train.h"

static hq_ctx *g_ctx;
static hq_quantizer *g_q[FUZZ_NFORMATS];

static void refusal(int rc) {
  if (rc && !hq_last_error()[0]) abort(); /* a refusal always says why */
}

static void setup(void) {
  hq_recipe *r = NULL;
  if (hq_ctx_create(NULL, &g_ctx) ||
      hq_recipe_load_string(fuzz_recipe_text, "fuzz", NULL, &r)) {
    fprintf(stderr, "fuzz_ckpt: setup: %s (HQ_PLUGIN_PATH?)\n", hq_last_error());
    abort();
  }
  for (int f = 0; f < FUZZ_NFORMATS; f++) {
    hq_role role = hq_role_of("linear", "weight", fuzz_role_names[f]);
    if (hq_quantizer_create(r, &role, &g_q[f])) {
      fprintf(stderr, "fuzz_ckpt: setup: role %s: %s\n", fuzz_role_names[f], hq_last_error());
      abort();
    }
  }
  hq_recipe_free(r); /* the quantizers keep what they need */
}

/* "q" in format f: loaded, then each direction dequantized (a refusal is allowed). */
static void load_q(hq_ckpt *c, int f) {
  hq_qtensor *qt = NULL;
  if (hq_make_empty(g_q[f], g_ctx, FUZZ_Q_ROWS, FUZZ_Q_COLS, HQ_F32, &qt) != HQ_OK) return;
  int rc = hq_ckpt_load_qtensor(c, g_ctx, "q", qt);
  refusal(rc);
  if (rc == HQ_OK) {
    static float out[FUZZ_Q_ROWS * FUZZ_Q_COLS];
    hq_tensor dst = hq_tensor_2d(out, HQ_F32, HQ_DEVICE_HOST, FUZZ_Q_ROWS, FUZZ_Q_COLS);
    for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1)
      if (hq_qtensor_dirs(qt) & dir) refusal(hq_dequantize(qt, g_ctx, dir, &dst));
  }
  hq_qtensor_free(qt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_ctx) setup();
  int fd = memfd_create("fuzz.safetensors", 0);
  if (fd < 0) return 0;
  if (size && write(fd, data, size) != (ssize_t)size) {
    close(fd);
    return 0;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  for (uint32_t flags = 0; flags <= HQ_CKPT_NO_VERIFY; flags++) {
    hq_ckpt_open_opts o = {.struct_size = sizeof o, .flags = flags};
    hq_ckpt *c = NULL;
    int rc = hq_ckpt_open_ex(path, &o, &c);
    refusal(rc);
    if (rc) continue;
    int vr = hq_ckpt_verify(c, NULL); /* HQ_ENOTSUP when opened unverified */
    refusal(vr);
    for (size_t i = 0; hq_ckpt_meta_key(c, i) && i < 64; i++)
      if (!hq_ckpt_meta(c, hq_ckpt_meta_key(c, i))) abort(); /* every listed key has a value */
    for (size_t i = 0; i < 64; i++) { /* every entry described (a refusal is allowed) */
      const char *nm = hq_ckpt_entry_name(c, i);
      if (!nm) break;
      hq_ckpt_entry_info e = {.struct_size = sizeof e};
      refusal(hq_ckpt_entry(c, nm, &e));
    }
    float v[15];
    hq_tensor t = hq_tensor_2d(v, HQ_F32, HQ_DEVICE_HOST, 3, 5);
    refusal(hq_ckpt_load_tensor(c, g_ctx, "t", &t));
    for (int f = 0; f < FUZZ_NFORMATS; f++) load_q(c, f);
    (void)hq_ckpt_meta(c, "step");
    hq_ckpt_close(c);
  }
  close(fd);
  return 0;
}
