/*
** fuzz_ckpt.c -- libFuzzer target: the checkpoint reader (services/ckpt_*.c) on arbitrary bytes
** as a file: opened with and without checksum verification, then the tensors the seeds hold
** loaded ("t": F32 [3, 5]; "q": an fp8_tensor [16, 32] qtensor, both directions). Every call is
** HQ_OK or a refusal with a message; nothing reads outside the file (scripts/fuzz.sh).
*/
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hq/train.h"

static const char k_recipe[] = "[recipe]\nname = fuzz\n[format f8]\nplugin = fp8_tensor\n"
                               "dtype = e4m3\n[role *:*:*]\nrowwise = f8\ncolumnwise = f8\n";
static hq_ctx *g_ctx;
static hq_quantizer *g_q;

static void refusal(int rc) {
  if (rc && !hq_last_error()[0]) abort(); /* a refusal always says why */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_ctx) {
    hq_recipe *r = NULL;
    hq_role role = hq_role_of("linear", "weight", "fc1");
    if (hq_ctx_create(NULL, &g_ctx) || hq_recipe_load_string(k_recipe, "fuzz", NULL, &r) ||
        hq_quantizer_create(r, &role, &g_q)) {
      fprintf(stderr, "fuzz_ckpt: setup: %s (HQ_PLUGIN_PATH?)\n", hq_last_error());
      abort();
    }
    hq_recipe_free(r); /* the quantizer keeps what it needs */
  }
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
    float v[15];
    hq_tensor t = hq_tensor_2d(v, HQ_F32, HQ_DEVICE_HOST, 3, 5);
    refusal(hq_ckpt_load_tensor(c, g_ctx, "t", &t));
    hq_qtensor *qt = NULL;
    if (hq_make_empty(g_q, g_ctx, 16, 32, HQ_F32, &qt) == HQ_OK) {
      refusal(hq_ckpt_load_qtensor(c, g_ctx, "q", qt));
      hq_qtensor_free(qt);
    }
    (void)hq_ckpt_meta(c, "step");
    hq_ckpt_close(c);
  }
  close(fd);
  return 0;
}
