/*
** cmd_bench.c -- `hq bench`: quantize throughput of each format, both directions in one call and
** each direction alone, on the CPU (MB/s of input on one core: the CPU reference is single
** threaded) or on a CUDA device (GB/s of the minimal bytes -- input read once, every output
** buffer written once -- and its % of the device-to-device copy bandwidth measured in the same
** run). Medians over --iters runs after warm-up. A benchmark, never a test.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_timer.h"
#include "cli.h"
#include "hq/numerics.h"

static const char usage[] =
    "usage: hq bench [--device cpu|cuda[:N]] [--shape RxC] [--dtype bf16|f16|f32]\n"
    "                [--iters N] [--format 'PLUGIN[ key=value...]']...\n"
    "                [--recipe FILE --role M:T:N] [--json]\n"
    "\n"
    "Time quantize (both directions in one call, rowwise alone, columnwise alone) for each\n"
    "format configuration: by default every stock configuration whose plugin is installed\n"
    "(identity, fp8_tensor, mxfp8, nvfp4 [+rht, +stochastic_rounding, +block_2d],\n"
    "fp8_block [1d, 2d]); --format replaces that list. --recipe/--role times one recipe\n"
    "role's (hybrid) quantizer and reports both / (rowwise + columnwise).\n"
    "CPU: MB/s of input on one core (default 2048x2048 bf16, 5 iterations).\n"
    "CUDA: GB/s of minimal bytes and % of the measured copy bandwidth (default 8192x8192\n"
    "bf16, 50 iterations).\n";

#define CMD "bench"

static const char *default_formats[] = {
    "identity dtype=bf16", "fp8_tensor", "mxfp8", "nvfp4", "nvfp4 rht=true",
    "nvfp4 stochastic_rounding=true", "nvfp4 block_2d=true", "fp8_block block=1d",
    "fp8_block block=2d",
};

typedef struct result {
  double ms[3];          /* both, rowwise, columnwise */
  double bytes_out[3];
  int ok[3];
} result;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median ms of `iters` hq_qtensor_update calls on a tensor made for `usage`. */
static int time_usage(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *x, uint32_t usage,
                      int iters, bench_timer *t, double *ms, double *bytes_out) {
  if (hq_quantizer_set_usage(q, usage)) return -1;
  hq_qtensor *qt = NULL;
  if (hq_make_empty(q, ctx, x->rows, x->cols, x->dtype, &qt)) return -1;
  double *v = calloc((size_t)iters, sizeof *v);
  int rc = v ? 0 : -1;
  for (int i = 0; i < 2 && !rc; i++) rc = hq_qtensor_update(qt, ctx, x);
  for (int i = 0; i < iters && !rc; i++) {
    bench_timer_start(t);
    rc = hq_qtensor_update(qt, ctx, x);
    v[i] = bench_timer_stop(t);
    if (v[i] < 0) rc = -1;
  }
  if (!rc) {
    qsort(v, (size_t)iters, sizeof *v, cmp_double);
    *ms = v[iters / 2];
    *bytes_out = (double)(hq_qtensor_bytes(qt, HQ_ROWWISE) + hq_qtensor_bytes(qt, HQ_COLWISE));
  }
  free(v);
  hq_qtensor_free(qt);
  return rc;
}

/* "nvfp4 rht=true" -> a recipe with one format b used for both directions. */
static int recipe_for(const char *spec, char *out, size_t len, char *label, size_t label_len) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", spec);
  char *save = NULL, *tok = strtok_r(buf, " ,", &save);
  if (!tok) return -1;
  size_t n = (size_t)snprintf(out, len, "[format b]\nplugin = %s\n", tok);
  snprintf(label, label_len, "%s", tok);
  while ((tok = strtok_r(NULL, " ,", &save)) != NULL) {
    char *eq = strchr(tok, '=');
    if (!eq) return -1;
    *eq = '\0';
    n += (size_t)snprintf(out + n, len - n, "%s = %s\n", tok, eq + 1);
    size_t l = strlen(label);
    snprintf(label + l, label_len - l, " %s=%s", tok, eq + 1);
  }
  snprintf(out + n, len - n, "[role *:*:*]\nrowwise = b\ncolumnwise = b\n");
  return 0;
}

int hq_cmd_bench(int argc, char **argv) {
  const char *device_s = "cpu", *shape_s = NULL, *dtype_s = "bf16", *recipe = NULL, *role_s = NULL;
  const char *formats[64];
  size_t nformats = 0;
  uint64_t iters_u = 0;
  int as_json = 0;
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r = 0;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      as_json = 1;
      continue;
    }
    const char *names[] = {"--device", "--shape", "--dtype", "--iters", "--format", "--recipe",
                           "--role"};
    size_t k = 0;
    for (; k < sizeof names / sizeof names[0]; k++)
      if ((r = cli_opt(argc, argv, &i, names[k], &v)) != 0) break;
    if (k == sizeof names / sizeof names[0])
      return cli_fail(2, CMD, "unknown argument '%s' (see `hq bench --help`)", argv[i]);
    if (r < 0) return cli_fail(2, CMD, "%s needs a value", names[k]);
    if (k == 0) device_s = v;
    else if (k == 1) shape_s = v;
    else if (k == 2) dtype_s = v;
    else if (k == 3 && (cli_u64(v, &iters_u) || iters_u < 1 || iters_u > 100000))
      return cli_fail(2, CMD, "--iters '%s' is not an integer in [1, 100000]", v);
    else if (k == 4) {
      if (nformats == 64) return cli_fail(2, CMD, "too many --format options");
      formats[nformats++] = v;
    } else if (k == 5) recipe = v;
    else if (k == 6) role_s = v;
  }
  int device;
  if (cli_device(device_s, &device))
    return cli_fail(2, CMD, "--device '%s' is not cpu, cuda or cuda:N", device_s);
  hq_dtype dtype = hq_dtype_from_name(dtype_s);
  if (dtype != HQ_F32 && dtype != HQ_BF16 && dtype != HQ_F16)
    return cli_fail(2, CMD, "--dtype '%s' is not f32, bf16 or f16", dtype_s);
  if (!!recipe != !!role_s) return cli_fail(2, CMD, "--recipe and --role go together");
  int64_t rows = device >= 0 ? 8192 : 2048, cols = rows;
  if (shape_s && cli_shape(shape_s, &rows, &cols))
    return cli_fail(2, CMD, "--shape '%s' is not RxC with positive R and C", shape_s);
  int iters = iters_u ? (int)iters_u : (device >= 0 ? 50 : 5);
  if (!nformats && !recipe)
    for (size_t i = 0; i < sizeof default_formats / sizeof default_formats[0]; i++)
      formats[nformats++] = default_formats[i];

  char err[256];
  bench_timer *timer = bench_timer_create(device, err, sizeof err);
  if (!timer) return cli_fail(1, CMD, "%s", err);
  hq_ctx_desc desc = {sizeof desc, device, NULL, NULL, NULL, NULL, 1};
  hq_ctx *ctx = NULL;
  if (hq_ctx_create(&desc, &ctx)) {
    bench_timer_destroy(timer);
    return cli_fail(1, CMD, "%s", hq_last_error());
  }
  size_t in_bytes = (size_t)(rows * cols) * hq_dtype_size(dtype);
  hq_tensor x = hq_tensor_2d(NULL, dtype, device, rows, cols);
  void *host = malloc(in_bytes);
  int status = 1;
  if (!host) {
    cli_fail(1, CMD, "out of memory for the %lldx%lld input", (long long)rows, (long long)cols);
    goto out;
  }
  uint64_t s = 88172645463325252ull;
  for (int64_t i = 0; i < rows * cols; i++) {
    double acc = 0;
    for (int k = 0; k < 4; k++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      acc += (double)(s >> 11) * (1.0 / 9007199254740992.0);
    }
    hq_store_hp(host, i, dtype, (float)((acc - 2.0) * 1.7320508));
  }
  if (device >= 0) {
    if (hq_ctx_alloc(ctx, in_bytes, &x.data) ||
        hq_ctx_memcpy(ctx, x.data, device, host, HQ_DEVICE_HOST, in_bytes) || hq_ctx_sync(ctx)) {
      cli_fail(1, CMD, "%s", hq_last_error());
      goto out;
    }
  } else {
    x.data = host;
  }
  double copy_bw = device >= 0 ? bench_copy_bandwidth(device, (size_t)1 << 30, 20) : 0;
  json j;
  if (as_json) {
    json_begin(&j, stdout);
    json_obj(&j);
    json_kstr(&j, "device", device_s);
    json_key(&j, "shape");
    json_arr(&j);
    json_int(&j, rows);
    json_int(&j, cols);
    json_close_arr(&j);
    json_kstr(&j, "dtype", dtype_s);
    json_kint(&j, "iters", iters);
    if (device >= 0) json_knum(&j, "copy_bandwidth_gbs", copy_bw * 1e-9);
    json_key(&j, "results");
    json_arr(&j);
  } else {
    char name[256] = "cpu, one core";
    int arch = 0;
    if (device >= 0 && hq_device_info(device, name, sizeof name, &arch) == HQ_OK)
      snprintf(name + strlen(name), sizeof name - strlen(name), " (sm_%d)", arch);
    printf("hq bench: %s, input %lldx%lld %s (%.1f MiB), median of %d\n", name, (long long)rows,
           (long long)cols, dtype_s, (double)in_bytes / 1048576.0, iters);
    if (device >= 0)
      printf("device-to-device copy (1 GiB, read+write): %.0f GB/s = the 100%% mark\n",
             copy_bw * 1e-9);
    if (device >= 0)
      printf("%-34s %-10s %10s %10s %8s\n", "format", "dirs", "median_ms", "GB/s", "%copy");
    else
      printf("%-34s %-10s %10s %12s\n", "format", "dirs", "median_ms", "input_MB/s");
  }
  size_t nruns = recipe ? 1 : nformats;
  for (size_t f = 0; f < nruns; f++) {
    char text[1024], label[256];
    hq_recipe *r = NULL;
    hq_role role = {"bench", "tensor", "x"};
    char rbuf[512];
    int rc;
    if (recipe) {
      snprintf(label, sizeof label, "%s %s", recipe, role_s);
      rc = hq_role_parse(role_s, rbuf, sizeof rbuf, &role);
      if (!rc) rc = hq_recipe_load(recipe, NULL, &r);
    } else {
      if (recipe_for(formats[f], text, sizeof text, label, sizeof label)) {
        cli_fail(2, CMD, "--format '%s' is not 'PLUGIN[ key=value...]'", formats[f]);
        goto out;
      }
      rc = hq_recipe_parse_string(text, "bench", NULL, &r);
      if (!rc && hq_recipe_error_count(r)) {
        const char *e = hq_recipe_error(r, 0);
        if (strstr(e, "was not found") && f < nformats && nformats ==
            sizeof default_formats / sizeof default_formats[0]) {
          hq_recipe_free(r); /* a stock plugin that is not installed: skip it */
          continue;
        }
        cli_fail(1, CMD, "%s: %s", label, e);
        hq_recipe_free(r);
        goto out;
      }
    }
    hq_quantizer *q = NULL;
    if (rc || hq_quantizer_create(r, &role, &q)) {
      cli_fail(1, CMD, "%s: %s", label, hq_last_error());
      hq_recipe_free(r);
      goto out;
    }
    /* a format without a path on this device is listed, not timed */
    uint64_t need = device >= 0 ? HQ_CAP_CUDA : HQ_CAP_CPU;
    const char *missing = NULL;
    for (uint32_t d = HQ_ROWWISE; d <= HQ_COLWISE; d++) {
      const hq_plugin *p = hq_plugins_find(hq_recipe_plugins(r), hq_quantizer_plugin(q, d));
      if (p && !(hq_plugin_caps(p) & need)) missing = hq_plugin_name(p);
    }
    if (missing) {
      if (as_json) {
        json_obj(&j);
        json_kstr(&j, "format", label);
        json_kstr(&j, "skipped", device >= 0 ? "no CUDA path" : "no CPU path");
        json_close_obj(&j);
      } else {
        printf("%-34s (%s has no %s path: skipped)\n", label, missing,
               device >= 0 ? "CUDA" : "CPU");
      }
      hq_quantizer_free(q);
      hq_recipe_free(r);
      continue;
    }
    result res = {{0}, {0}, {0}};
    const uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
    const char *unames[3] = {"both", "rowwise", "columnwise"};
    for (int u = 0; u < 3; u++) {
      res.ok[u] =
          time_usage(q, ctx, &x, usages[u], iters, timer, &res.ms[u], &res.bytes_out[u]) == 0;
      if (!res.ok[u]) {
        fprintf(stderr, "hq bench: %s %s: %s\n", label, unames[u], hq_last_error());
        continue;
      }
      double gbs = ((double)in_bytes + res.bytes_out[u]) / (res.ms[u] * 1e-3) * 1e-9;
      double mbs = (double)in_bytes / (res.ms[u] * 1e-3) * 1e-6;
      if (as_json) {
        json_obj(&j);
        json_kstr(&j, "format", label);
        json_kstr(&j, "dirs", unames[u]);
        json_knum(&j, "median_ms", res.ms[u]);
        json_knum(&j, "input_mb_per_s", mbs);
        json_knum(&j, "bytes_written", res.bytes_out[u]);
        if (device >= 0) {
          json_knum(&j, "gb_per_s", gbs);
          json_knum(&j, "percent_of_copy", copy_bw > 0 ? 100.0 * gbs * 1e9 / copy_bw : NAN);
        }
        json_close_obj(&j);
      } else if (device >= 0) {
        printf("%-34s %-10s %10.4f %10.1f %7.1f%%\n", u ? "" : label, unames[u], res.ms[u], gbs,
               copy_bw > 0 ? 100.0 * gbs * 1e9 / copy_bw : NAN);
      } else {
        printf("%-34s %-10s %10.2f %12.1f\n", u ? "" : label, unames[u], res.ms[u], mbs);
      }
    }
    if (res.ok[0] && res.ok[1] && res.ok[2] && !as_json)
      printf("%-34s %-10s %10.3f x (rowwise + columnwise alone)\n", "", "ratio",
             res.ms[0] / (res.ms[1] + res.ms[2]));
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
  if (as_json) {
    json_close_arr(&j);
    json_close_obj(&j);
    json_end(&j);
  }
  status = 0;
out:
  if (device >= 0) hq_ctx_free(ctx, x.data);
  free(host);
  hq_ctx_destroy(ctx);
  bench_timer_destroy(timer);
  return status;
}
