/*
** ckpt_seeds.c -- writes fuzz_ckpt's seeds of every format: DIR/<role name>.safetensors holding
** "t" (F32 [3, 5]) and "q" (a [32, 32] qtensor of the role's format, both directions, quantized
** from fixed values spanning several binades, with a zero and a negative zero). scripts/fuzz.sh
** runs it before the fuzz targets, so the seeds always hold the built plugins' layouts.
**   ckpt_seeds DIR
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_formats.h"
#include "hq/train.h"

static int fail(const char *what) {
  fprintf(stderr, "ckpt_seeds: %s: %s\n", what, hq_last_error());
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: ckpt_seeds DIR\n");
    return 2;
  }
  hq_ctx *ctx = NULL;
  hq_recipe *r = NULL;
  if (hq_ctx_create(NULL, &ctx)) return fail("hq_ctx_create");
  if (hq_recipe_load_string(fuzz_recipe_text, "fuzz", NULL, &r)) return fail("recipe");
  static float x[FUZZ_Q_ROWS * FUZZ_Q_COLS];
  for (int i = 0; i < FUZZ_Q_ROWS * FUZZ_Q_COLS; i++)
    x[i] = (i % 7 - 3) * ldexpf(1.0f + (float)(i % 5) / 8.0f, i % 11 - 5);
  x[1] = 0.0f, x[2] = -0.0f;
  const float tv[15] = {1, -2, 3, 0.5f, -0.25f, 8, 0, 1e-3f, -7, 6, 5, 4, 3, 2, 1};
  hq_tensor src = hq_tensor_2d(x, HQ_F32, HQ_DEVICE_HOST, FUZZ_Q_ROWS, FUZZ_Q_COLS);
  hq_tensor t = hq_tensor_2d((void *)tv, HQ_F32, HQ_DEVICE_HOST, 3, 5);
  for (int f = 0; f < FUZZ_NFORMATS; f++) {
    hq_role role = hq_role_of("linear", "weight", fuzz_role_names[f]);
    hq_quantizer *q = NULL;
    hq_qtensor *qt = NULL;
    hq_ckpt_writer *w = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.safetensors", argv[1], fuzz_role_names[f]);
    if (hq_quantizer_create(r, &role, &q)) return fail(fuzz_role_names[f]);
    if (hq_quantize(q, ctx, &src, &qt)) return fail("hq_quantize");
    if (hq_ckpt_writer_open(path, &w) || hq_ckpt_add_tensor(w, ctx, "t", &t) ||
        hq_ckpt_add_qtensor(w, ctx, "q", qt) || hq_ckpt_writer_close(w))
      return fail(path);
    hq_qtensor_free(qt);
    hq_quantizer_free(q);
  }
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
  return 0;
}
