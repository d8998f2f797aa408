/* trainer.c -- one linear layer of a trainer, quantized by hq.
**
** y = x W^T with x [T, IN] (input), W [OUT, IN] (weight) and dy [T, OUT] (the output's gradient):
** the three tensors are quantized with the quantizers a recipe gives their roles, then libhqcore
** runs the layer's three GEMMs, each on the copies it needs:
**     fprop  y  = x W^T      dgrad  dx = dy W      wgrad  dW = dy^T x
** Each result is checked against a plain FP32 loop over the dequantized operands (the GEMM must
** compute exactly that, up to the order of the sums), and its distance to the product of the
** unquantized tensors (the recipe's quantization error) is printed. Then one AdamW step
** (libhqtrain, hq/train.h) updates the FP32 master weight from dW and writes the quantized
** weight back: its copies must be those a fresh quantize of the new master gives.
**
**   ./trainer RECIPE     e.g. the installed default recipe:
**                        ./trainer "$(pkg-config --variable=recipedir hqcore)/recipe.ini"
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <hq/train.h> /* hq/hq.h and the trainer services: AdamW, checkpoints */

enum { T = 64, IN = 128, OUT = 96 }; /* multiples of 32: every stock format's blocks fit */

/* On failure: print the call, status and libhqcore's message, and clean up. */
#define CHECK(call)                                                                           \
  do {                                                                                        \
    int rc_ = (call);                                                                         \
    if (rc_) {                                                                                \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, hq_strerror(rc_),     \
              hq_last_error());                                                               \
      goto out;                                                                               \
    }                                                                                         \
  } while (0)

/* c[i][j] = sum_k A(i, k) B(j, k), where A(i, k) = a[i * ai + k * ak], likewise B. */
static void matmul(int m, int n, int k, const float *a, int ai, int ak, const float *b, int bj,
                   int bk, float *c) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int l = 0; l < k; l++) s += a[i * ai + l * ak] * b[j * bj + l * bk];
      c[i * n + j] = s;
    }
}

/* ||got - want|| / ||want|| */
static double rel_error(const float *got, const float *want, int n) {
  double e = 0, w = 0;
  for (int i = 0; i < n; i++) {
    e += (double)(got[i] - want[i]) * (got[i] - want[i]);
    w += (double)want[i] * want[i];
  }
  return sqrt(e / w);
}

static float *random_matrix(int rows, int cols, unsigned *seed) {
  float *v = malloc(sizeof(float) * rows * cols);
  for (int i = 0; v && i < rows * cols; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    v[i] = (float)(*seed >> 8) / 16777216.0f * 2.0f - 1.0f; /* uniform in [-1, 1) */
  }
  return v;
}

/* Dequantize one direction of qt into a new [rows, cols] array. */
static float *dequantized(const hq_qtensor *qt, hq_ctx *ctx, uint32_t dir) {
  int64_t rows = hq_qtensor_rows(qt), cols = hq_qtensor_cols(qt);
  float *v = malloc(sizeof(float) * (size_t)(rows * cols));
  hq_tensor t = hq_tensor_2d(v, HQ_F32, HQ_DEVICE_HOST, rows, cols);
  if (v && hq_dequantize(qt, ctx, dir, &t)) {
    fprintf(stderr, "dequantize: %s\n", hq_last_error());
    free(v);
    v = NULL;
  }
  return v;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s RECIPE\n", argv[0]);
    return 2;
  }
  int status = 1;
  hq_ctx *ctx = NULL;
  hq_recipe *recipe = NULL;
  hq_quantizer *qx = NULL, *qw = NULL, *qdy = NULL;
  hq_qtensor *x = NULL, *w = NULL, *dy = NULL, *fresh = NULL;
  unsigned seed = 1;
  float *xv = random_matrix(T, IN, &seed), *wv = random_matrix(OUT, IN, &seed),
        *dyv = random_matrix(T, OUT, &seed);
  float *y = malloc(sizeof(float) * T * OUT), *dx = malloc(sizeof(float) * T * IN),
        *dw = malloc(sizeof(float) * OUT * IN), *ref = malloc(sizeof(float) * OUT * IN);
  float *a = NULL, *b = NULL; /* dequantized operands */
  float *m = calloc((size_t)OUT * IN, sizeof(float)), *v = calloc((size_t)OUT * IN, sizeof(float));
  if (!xv || !wv || !dyv || !y || !dx || !dw || !ref || !m || !v) {
    fprintf(stderr, "out of memory\n");
    goto out;
  }

  /* 1. a host context; the recipe (its formats are loaded from the plugin search path); one
        quantizer per role of the layer "fc1" */
  hq_ctx_desc cd = {0};
  cd.struct_size = sizeof cd;
  cd.device = HQ_DEVICE_HOST;
  cd.seed = 1234; /* stochastic rounding */
  CHECK(hq_ctx_create(&cd, &ctx));
  CHECK(hq_recipe_load(argv[1], NULL, &recipe));
  hq_role rx = hq_role_of("linear", "input", "fc1"), rw = hq_role_of("linear", "weight", "fc1"),
          rdy = hq_role_of("linear", "grad_output", "fc1");
  CHECK(hq_quantizer_create(recipe, &rx, &qx));
  CHECK(hq_quantizer_create(recipe, &rw, &qw));
  CHECK(hq_quantizer_create(recipe, &rdy, &qdy));
  hq_recipe_free(recipe); /* the quantizers keep their formats */
  recipe = NULL;
  printf("recipe %s\n", argv[1]);
  printf("  input       rowwise %-10s columnwise %s\n", hq_quantizer_plugin(qx, HQ_ROWWISE),
         hq_quantizer_plugin(qx, HQ_COLWISE));
  printf("  weight      rowwise %-10s columnwise %s\n", hq_quantizer_plugin(qw, HQ_ROWWISE),
         hq_quantizer_plugin(qw, HQ_COLWISE));
  printf("  grad_output rowwise %-10s columnwise %s\n", hq_quantizer_plugin(qdy, HQ_ROWWISE),
         hq_quantizer_plugin(qdy, HQ_COLWISE));

  /* 2. quantize: both directions of each tensor */
  hq_tensor tx = hq_tensor_2d(xv, HQ_F32, HQ_DEVICE_HOST, T, IN);
  hq_tensor tw = hq_tensor_2d(wv, HQ_F32, HQ_DEVICE_HOST, OUT, IN);
  hq_tensor tdy = hq_tensor_2d(dyv, HQ_F32, HQ_DEVICE_HOST, T, OUT);
  CHECK(hq_quantize(qx, ctx, &tx, &x));
  CHECK(hq_quantize(qw, ctx, &tw, &w));
  CHECK(hq_quantize(qdy, ctx, &tdy, &dy));

  /* 3. the three GEMMs, F32 outputs on the host */
  hq_tensor ty = hq_tensor_2d(y, HQ_F32, HQ_DEVICE_HOST, T, OUT);
  hq_tensor tdx = hq_tensor_2d(dx, HQ_F32, HQ_DEVICE_HOST, T, IN);
  hq_tensor tdw = hq_tensor_2d(dw, HQ_F32, HQ_DEVICE_HOST, OUT, IN);
  hq_gemm_info info[3]; /* which path each GEMM took */
  for (int i = 0; i < 3; i++) info[i].struct_size = sizeof info[i];
  CHECK(hq_linear_fprop(ctx, hq_operand_q(x), hq_operand_q(w), NULL, HQ_F32, &ty, &info[0]));
  CHECK(hq_linear_dgrad(ctx, hq_operand_q(dy), hq_operand_q(w), &tdx, &info[1]));
  CHECK(hq_linear_wgrad(ctx, hq_operand_q(x), hq_operand_q(dy), &tdw, 0, &info[2]));

  /* 4. check each against FP32 loops: on the copies the GEMM read (dequantized), and on the
        original tensors */
  struct {
    const char *name;
    const hq_qtensor *qa, *qb;
    uint32_t da, db;          /* the directions the GEMM reads */
    const float *va, *vb;     /* the unquantized operands */
    int m, n, k, ai, ak, bj, bk;
    const float *got;
  } g[3] = {
      /* y[t][o] = sum_i x[t][i] W[o][i] */
      {"fprop", x, w, HQ_ROWWISE, HQ_ROWWISE, xv, wv, T, OUT, IN, IN, 1, IN, 1, y},
      /* dx[t][i] = sum_o dy[t][o] W[o][i] */
      {"dgrad", dy, w, HQ_ROWWISE, HQ_COLWISE, dyv, wv, T, IN, OUT, OUT, 1, 1, IN, dx},
      /* dW[o][i] = sum_t dy[t][o] x[t][i] */
      {"wgrad", dy, x, HQ_COLWISE, HQ_COLWISE, dyv, xv, OUT, IN, T, 1, OUT, 1, IN, dw},
  };
  for (int i = 0; i < 3; i++) {
    a = dequantized(g[i].qa, ctx, g[i].da);
    b = dequantized(g[i].qb, ctx, g[i].db);
    if (!a || !b) goto out;
    matmul(g[i].m, g[i].n, g[i].k, a, g[i].ai, g[i].ak, b, g[i].bj, g[i].bk, ref);
    double exact = rel_error(g[i].got, ref, g[i].m * g[i].n);
    matmul(g[i].m, g[i].n, g[i].k, g[i].va, g[i].ai, g[i].ak, g[i].vb, g[i].bj, g[i].bk, ref);
    double quant = rel_error(g[i].got, ref, g[i].m * g[i].n);
    printf("%s %s x %s (%s): %.2e from the dequantized operands, %.4f from FP32\n", g[i].name,
           info[i].format_a, info[i].format_b, hq_gemm_path_name(info[i].path), exact, quant);
    free(a);
    free(b);
    a = b = NULL;
    /* FP32 sums in another order differ by ~1e-6; no 4-bit or 8-bit format is off by 50% */
    if (!(exact < 1e-4) || !(quant < 0.5)) {
      fprintf(stderr, "%s: result out of tolerance\n", g[i].name);
      goto out;
    }
  }

  /* 5. one optimizer step: AdamW on the FP32 master wv with dW, the quantized weight written
        back; both copies equal a fresh quantize of the new master (a weight quantizer without
        stochastic rounding: the same input gives the same bytes) */
  hq_adam adam = {sizeof adam, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, NULL, NULL, 0};
  CHECK(hq_adam_step(ctx, &adam, &tdw, wv, m, v, w));
  CHECK(hq_quantize(qw, ctx, &tw, &fresh));
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE && hq_quantizer_requant_safe(qw); dir <<= 1) {
    a = dequantized(w, ctx, dir);
    b = dequantized(fresh, ctx, dir);
    if (!a || !b) goto out;
    double d = rel_error(a, b, OUT * IN);
    free(a);
    free(b);
    a = b = NULL;
    if (d != 0.0) {
      fprintf(stderr, "adamw: %s copy differs from a fresh quantize (%.2e)\n",
              dir == HQ_ROWWISE ? "rowwise" : "columnwise", d);
      goto out;
    }
  }
  printf("adamw: weight written back, equal to a fresh quantize of the new master\n");
  status = 0;
  printf("ok\n");

out: /* 6. free everything (qtensors before their context) */
  free(a);
  free(b);
  hq_qtensor_free(x);
  hq_qtensor_free(w);
  hq_qtensor_free(dy);
  hq_qtensor_free(fresh);
  hq_quantizer_free(qx);
  hq_quantizer_free(qw);
  hq_quantizer_free(qdy);
  hq_recipe_free(recipe);
  hq_ctx_destroy(ctx);
  free(xv);
  free(wv);
  free(dyv);
  free(y);
  free(dx);
  free(dw);
  free(ref);
  free(m);
  free(v);
  return status;
}
