/*
** cmd_quantize.c -- `hq quantize`: quantize a tensor (random or from a file) for one recipe role,
** dequantize every direction, report format, bytes, relative RMS error, max abs error, SQNR.
*/
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffers.h"
#include "cli.h"
#include "commands.h"
#include "json.h"
#include "hq/numerics.h"

static const char usage[] =
    "usage: hq quantize --recipe FILE --role MODULE:TENSOR:NAME\n"
    "                   (--random RxC [--seed S] [--scale X] | --input FILE [--shape RxC])\n"
    "                   [--dtype f32|bf16|f16] [--device cpu|cuda[:N]] [--json]\n"
    "                   [--output FILE.npy] [--finite-only] [--plugin-dir DIR]...\n"
    "\n"
    "Quantize one tensor with the quantizer the recipe gives the role (both directions),\n"
    "dequantize each direction and print per direction: format, plugin, bytes, bits per\n"
    "element, relative RMS error, max abs error and SQNR, then the direction's buffers (name,\n"
    "dtype, shape, bytes; a columnwise buffer that is the rowwise one says so).\n"
    "  --recipe FILE  the recipe (.ini) to read\n"
    "  --role M:T:N   the tensor's role: module_type:tensor_type:name (linear:weight:fc1)\n"
    "  --random RxC   N(0, X^2) data (X = --scale, default 1) from a seeded generator\n"
    "                 (--seed, default 1; also the stochastic rounding seed), stored in\n"
    "                 --dtype (default f32)\n"
    "  --input FILE   a .npy file (float32 or float16, C order, any rank: the leading\n"
    "                 dimensions are flattened into rows), or raw little-endian values of\n"
    "                 --dtype with --shape RxC\n"
    "  --device D     cpu (default), cuda or cuda:N: where the quantize runs\n"
    "  --json         print the report as one JSON document\n"
    "  --output FILE.npy  write each direction's dequantized tensor as a .npy file (f32,\n"
    "                 shape [rows, cols], C order; numpy.load reads it): the rowwise one\n"
    "                 to FILE.npy, the columnwise one to FILE.columnwise.npy (.npy is\n"
    "                 appended to FILE when missing). The quantized buffers themselves\n"
    "                 will be written by the checkpoint support (safetensors), not here.\n"
    "  --finite-only  refuse an input holding NaN or Inf (exit 1, naming the count and the\n"
    "                 first position) instead of quantizing it by each format's rule; without\n"
    "                 it the report counts them (docs/formats.md, NaN, Inf and zero)\n"
    "  --plugin-dir DIR  a directory to search for formats (repeatable)\n";

#define CMD "quantize"

/* xorshift64* + sum of uniforms: deterministic N(0,1)-like values, same on every machine */
static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

static float rng_normal(uint64_t *s) {
  double acc = 0;
  for (int i = 0; i < 12; i++) acc += (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
  return (float)(acc - 6.0);
}

/* Write rows x cols f32 values as a .npy file: version 1.0, C order, the host's byte order
   ('<f4' on little-endian), header padded to a multiple of 64 bytes as numpy writes it. */
static int write_npy(const char *path, const float *v, int64_t rows, int64_t cols) {
  const uint16_t one = 1;
  char h[160];
  int n = snprintf(h, sizeof h,
                   "{'descr': '%cf4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                   *(const char *)&one ? '<' : '>', (long long)rows, (long long)cols);
  size_t hlen = (size_t)n + 1; /* + the final newline */
  hlen += (64 - (10 + hlen) % 64) % 64;
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                           (unsigned char)(hlen >> 8)};
  FILE *f = fopen(path, "wb");
  if (!f) return cli_fail(1, CMD, "%s: cannot create: %s", path, strerror(errno));
  size_t count = (size_t)(rows * cols);
  int ok = fwrite(pre, 1, sizeof pre, f) == sizeof pre && fputs(h, f) >= 0 &&
           fprintf(f, "%*s\n", (int)(hlen - 1 - (size_t)n), "") >= 0 &&
           fwrite(v, sizeof(float), count, f) == count;
  if (fclose(f) != 0) ok = 0;
  if (!ok) return cli_fail(1, CMD, "%s: write error: %s", path, strerror(errno));
  return 0;
}

/* Parse a .npy header; on success the data starts at *offset. */
static int read_npy(const char *path, unsigned char *buf, size_t n, hq_tensor *t, size_t *offset,
                    char *err, size_t err_len) {
  if (n < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) return 0; /* not .npy */
  size_t hlen, hstart;
  if (buf[6] == 1) {
    hlen = buf[8] | (size_t)buf[9] << 8;
    hstart = 10;
  } else if (buf[6] == 2 || buf[6] == 3) {
    if (n < 12) goto corrupt;
    hlen = buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    hstart = 12;
  } else {
    snprintf(err, err_len, "%s: unsupported .npy version %u", path, buf[6]);
    return -1;
  }
  if (hstart + hlen > n || hlen > 65536) goto corrupt;
  char *h = malloc(hlen + 1);
  if (!h) goto corrupt;
  memcpy(h, buf + hstart, hlen);
  h[hlen] = '\0';
  char *d = strstr(h, "'descr'"), *fo = strstr(h, "'fortran_order'"), *sh = strstr(h, "'shape'");
  int rc = -1;
  if (!d || !fo || !sh) {
    snprintf(err, err_len, "%s: .npy header lacks descr/fortran_order/shape", path);
  } else if (strstr(fo, "True") && strstr(fo, "True") < strchr(fo, ',')) {
    snprintf(err, err_len, "%s: Fortran-ordered .npy arrays are not supported", path);
  } else {
    char *q = strchr(d + 7, '\'');
    if (q && !strncmp(q, "'<f4'", 5)) t->dtype = HQ_F32;
    else if (q && !strncmp(q, "'<f2'", 5)) t->dtype = HQ_F16;
    else {
      snprintf(err, err_len, "%s: .npy dtype must be '<f4' or '<f2'", path);
      free(h);
      return -1;
    }
    char *p = strchr(sh, '(');
    int64_t dims[16];
    int nd = 0;
    while (p && *++p && *p != ')') {
      char *end;
      errno = 0;
      long long v = strtoll(p, &end, 10);
      if (end == p) break;
      if (nd == 16 || v <= 0 || errno == ERANGE) nd = -1;
      if (nd < 0) break;
      dims[nd++] = v;
      p = strchr(end, ',');
      if (!p) break;
    }
    if (nd <= 0) {
      snprintf(err, err_len, "%s: .npy shape is empty, zero-sized or unreadable", path);
    } else {
      /* the element count, overflow-checked: at most 2^40 (as --shape), so that no size below
         can wrap (a wrapped product would quantize another shape) */
      const int64_t cap = (int64_t)1 << 40;
      int64_t count = 1;
      for (int i = 0; i < nd && count > 0; i++) count = dims[i] > cap / count ? -1 : count * dims[i];
      if (count < 0) {
        char dimtxt[160] = "";
        size_t used = 0;
        for (int i = 0; i < nd && used < sizeof dimtxt - 24; i++)
          used += (size_t)snprintf(dimtxt + used, sizeof dimtxt - used, "%s%lld", i ? ", " : "",
                                   (long long)dims[i]);
        snprintf(err, err_len, "%s: .npy shape (%s) has more than 2^40 elements", path, dimtxt);
      } else {
        t->cols = dims[nd - 1];
        t->rows = count / t->cols;
        *offset = hstart + hlen;
        rc = 1;
      }
    }
  }
  free(h);
  return rc;
corrupt:
  snprintf(err, err_len, "%s: truncated or corrupt .npy header", path);
  return -1;
}

static int load_input(const char *path, const char *shape, hq_dtype dtype, hq_tensor *t) {
  FILE *f = fopen(path, "rb");
  if (!f) return cli_fail(1, CMD, "%s: cannot open: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (size < 0) {
    fclose(f);
    return cli_fail(1, CMD, "%s: cannot read its size", path);
  }
  unsigned char *buf = malloc((size_t)size + 1);
  if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
    fclose(f);
    free(buf);
    return cli_fail(1, CMD, "%s: read error", path);
  }
  fclose(f);
  char err[512];
  size_t off = 0;
  *t = hq_tensor_2d(NULL, HQ_DTYPE_INVALID, HQ_DEVICE_HOST, 0, 0);
  int npy = read_npy(path, buf, (size_t)size, t, &off, err, sizeof err);
  if (npy < 0) {
    free(buf);
    return cli_fail(1, CMD, "%s", err);
  }
  if (!npy) {
    if (!shape) {
      free(buf);
      return cli_fail(1, CMD, "%s is not a .npy file: give --shape RxC (and --dtype) for raw "
                      "values", path);
    }
    if (cli_shape(shape, &t->rows, &t->cols)) {
      free(buf);
      return cli_fail(2, CMD, "--shape '%s' is not RxC with positive R and C", shape);
    }
    t->dtype = dtype;
  }
  size_t need = (size_t)(t->rows * t->cols) * hq_dtype_size(t->dtype);
  if ((size_t)size - off != need) {
    free(buf);
    return cli_fail(1, CMD, "%s: holds %zu data bytes, the shape %lldx%lld of %s needs %zu", path,
                    (size_t)size - off, (long long)t->rows, (long long)t->cols,
                    hq_dtype_name(t->dtype), need);
  }
  t->data = malloc(need);
  if (!t->data) {
    free(buf);
    return cli_fail(1, CMD, "out of memory");
  }
  memcpy(t->data, buf + off, need);
  t->device = HQ_DEVICE_HOST;
  free(buf);
  return 0;
}

typedef struct stats {
  double rel_rms, max_abs, sqnr_db;
  int64_t nonfinite;
} stats;

static stats compare(const hq_tensor *x, const float *d) {
  double sx = 0, se = 0, mx = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < x->rows * x->cols; i++) {
    double a = hq_load_hp(x->data, i, x->dtype), b = d[i];
    if (!isfinite(a) || !isfinite(b)) {
      bad++;
      continue;
    }
    double e = a - b;
    sx += a * a;
    se += e * e;
    if (fabs(e) > mx) mx = fabs(e);
  }
  stats s = {sx > 0 ? sqrt(se / sx) : (se > 0 ? INFINITY : 0), mx,
             se > 0 ? 10 * log10(sx / se) : INFINITY, bad};
  return s;
}

int hq_cmd_quantize(int argc, char **argv) {
  const char *recipe = NULL, *role_text = NULL, *random = NULL, *input = NULL, *shape = NULL;
  const char *dtype_s = "f32", *device_s = "cpu", *output = NULL;
  cli_dirs dirs = {{NULL}, 0};
  uint64_t seed = 1;
  double scale = 1.0;
  int as_json = 0, finite_only = 0;
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      as_json = 1;
      continue;
    }
    if (!strcmp(argv[i], "--finite-only")) {
      finite_only = 1;
      continue;
    }
    if ((r = cli_plugin_dir(argc, argv, &i, &dirs, CMD)) != 0) {
      if (r < 0) return 2;
      continue;
    }
    const char *names[] = {"--recipe", "--role", "--random", "--input", "--shape", "--dtype",
                           "--device", "--seed", "--scale", "--output"};
    size_t k = 0;
    for (; k < sizeof names / sizeof names[0]; k++)
      if ((r = cli_opt(argc, argv, &i, names[k], &v)) != 0) break;
    if (k == sizeof names / sizeof names[0])
      return cli_fail(2, CMD, "unknown argument '%s' (see `hq quantize --help`)", argv[i]);
    if (r < 0) return cli_fail(2, CMD, "%s needs a value", names[k]);
    switch (k) {
    case 0: recipe = v; break;
    case 1: role_text = v; break;
    case 2: random = v; break;
    case 3: input = v; break;
    case 4: shape = v; break;
    case 5: dtype_s = v; break;
    case 6: device_s = v; break;
    case 7:
      if (cli_u64(v, &seed)) return cli_fail(2, CMD, "--seed '%s' is not an integer", v);
      break;
    case 8: {
      char *end;
      scale = strtod(v, &end);
      if (*end || !isfinite(scale) || scale <= 0)
        return cli_fail(2, CMD, "--scale '%s' is not a positive number", v);
      break;
    }
    case 9:
      if (!*v) return cli_fail(2, CMD, "--output needs a file name");
      output = v;
      break;
    }
  }
  if (!recipe || !role_text) return cli_fail(2, CMD, "--recipe and --role are required");
  if (!!random == !!input) return cli_fail(2, CMD, "give exactly one of --random and --input");
  hq_dtype dtype = hq_dtype_from_name(dtype_s);
  if (dtype != HQ_F32 && dtype != HQ_BF16 && dtype != HQ_F16)
    return cli_fail(2, CMD, "--dtype '%s' is not f32, bf16 or f16", dtype_s);
  int device;
  if (cli_device(device_s, &device))
    return cli_fail(2, CMD, "--device '%s' is not cpu, cuda or cuda:N", device_s);
  char rbuf[512];
  hq_role role;
  if (hq_role_parse(role_text, rbuf, sizeof rbuf, &role))
    return cli_fail(2, CMD, "%s", hq_last_error());

  hq_tensor x = hq_tensor_2d(NULL, dtype, HQ_DEVICE_HOST, 0, 0);
  if (random) {
    if (cli_shape(random, &x.rows, &x.cols))
      return cli_fail(2, CMD, "--random '%s' is not RxC with positive R and C", random);
    x.dtype = dtype;
    x.device = HQ_DEVICE_HOST;
    x.data = malloc((size_t)(x.rows * x.cols) * hq_dtype_size(dtype));
    if (!x.data) return cli_fail(1, CMD, "out of memory for %s", random);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < x.rows * x.cols; i++)
      hq_store_hp(x.data, i, dtype, (float)(rng_normal(&s) * scale));
  } else if (load_input(input, shape, dtype, &x)) {
    return 1;
  }

  /* --output: FILE.npy (rowwise) and FILE.columnwise.npy; paths[dir - 1] */
  char *paths[2] = {NULL, NULL};
  if (output) {
    size_t n = strlen(output);
    if (n >= 4 && !strcmp(output + n - 4, ".npy")) n -= 4;
    for (int d = 0; d < 2; d++) {
      const char *ext = d ? ".columnwise.npy" : ".npy";
      paths[d] = malloc(n + strlen(ext) + 1);
      if (!paths[d]) {
        free(paths[0]);
        free(x.data);
        return cli_fail(1, CMD, "out of memory");
      }
      snprintf(paths[d], n + strlen(ext) + 1, "%.*s%s", (int)n, output, ext);
    }
  }

  int status = 1;
  hq_recipe_opts o = {sizeof o, 0, dirs.v, dirs.n};
  hq_recipe *r = NULL;
  hq_quantizer *q = NULL;
  hq_ctx *ctx = NULL;
  hq_state *st = NULL; /* the recipe's scaling state (delayed scaling: scale 1 at the first step) */
  hq_qtensor *qt = NULL;
  hq_tensor xd = x, dd = hq_tensor_2d(NULL, HQ_F32, device, x.rows, x.cols);
  float *deq = malloc(sizeof(float) * (size_t)(x.rows * x.cols));
  hq_ctx_desc desc = {sizeof desc, device, NULL, NULL, NULL, NULL, seed};
  if (!deq) {
    cli_fail(1, CMD, "out of memory");
    goto out;
  }
  if (hq_recipe_load(recipe, &o, &r) || hq_ctx_create(&desc, &ctx) ||
      hq_state_create(r, ctx, &st) || hq_quantizer_create_ex(r, &role, st, &q)) {
    cli_fail(1, CMD, "%s", hq_last_error());
    goto out;
  }
  dd.dtype = HQ_F32;
  dd.device = device;
  dd.rows = x.rows;
  dd.cols = x.cols;
  dd.data = deq;
  if (device >= 0) {
    size_t bx = (size_t)(x.rows * x.cols) * hq_dtype_size(x.dtype);
    if (hq_ctx_alloc(ctx, bx, &xd.data) ||
        hq_ctx_alloc(ctx, sizeof(float) * (size_t)(x.rows * x.cols), &dd.data) ||
        hq_ctx_memcpy(ctx, xd.data, device, x.data, HQ_DEVICE_HOST, bx)) {
      cli_fail(1, CMD, "%s", hq_last_error());
      goto out;
    }
    xd.device = device;
  }
  int64_t nonfinite = 0, first_nonfinite = -1;
  if (hq_tensor_nonfinite(ctx, &xd, &nonfinite, &first_nonfinite)) {
    cli_fail(1, CMD, "%s", hq_last_error());
    goto out;
  }
  hq_quantize_args qargs = {sizeof qargs, finite_only ? HQ_QUANTIZE_FINITE_ONLY : 0u, NULL};
  if (hq_quantize_ex(q, ctx, &xd, &qargs, &qt)) {
    cli_fail(1, CMD, "%s", hq_last_error());
    goto out;
  }
  json j;
  if (as_json) {
    json_begin(&j, stdout);
    json_obj(&j);
    json_kstr(&j, "recipe", recipe);
    json_kstr(&j, "role", role_text);
    json_key(&j, "shape");
    json_arr(&j);
    json_int(&j, x.rows);
    json_int(&j, x.cols);
    json_close_arr(&j);
    json_kstr(&j, "dtype", hq_dtype_name(x.dtype));
    json_kstr(&j, "device", device_s);
    json_kint(&j, "nonfinite_inputs", nonfinite);
    json_kbool(&j, "fused", hq_quantizer_fused(q));
    json_key(&j, "directions");
    json_arr(&j);
  } else {
    printf("role %s -> %s, shape %lldx%lld %s on %s\n", role_text, recipe, (long long)x.rows,
           (long long)x.cols, hq_dtype_name(x.dtype), device_s);
    if (nonfinite)
      printf("input holds %lld NaN/Inf value%s, the first at [%lld, %lld]: quantized by each "
             "format's rule (docs/formats.md; --finite-only refuses them)\n",
             (long long)nonfinite, nonfinite == 1 ? "" : "s",
             (long long)(first_nonfinite / x.cols), (long long)(first_nonfinite % x.cols));
    printf("%-10s %-12s %-11s %12s %8s %12s %12s %9s\n", "direction", "format", "plugin",
           "bytes", "bits/el", "rel_rms", "max_abs", "sqnr_db");
  }
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    if (hq_dequantize(qt, ctx, dir, &dd) ||
        (device >= 0 && (hq_ctx_memcpy(ctx, deq, HQ_DEVICE_HOST, dd.data, device,
                                       sizeof(float) * (size_t)(x.rows * x.cols)) ||
                         hq_ctx_sync(ctx)))) {
      cli_fail(1, CMD, "%s", hq_last_error());
      goto out;
    }
    stats s = compare(&x, deq);
    const char *path = paths[dir - 1];
    if (path && write_npy(path, deq, x.rows, x.cols)) goto out;
    size_t bytes = hq_qtensor_bytes(qt, dir);
    double bpe = 8.0 * (double)bytes / (double)(x.rows * x.cols);
    const char *dname = dir == HQ_ROWWISE ? "rowwise" : "columnwise";
    if (as_json) {
      json_obj(&j);
      json_kstr(&j, "direction", dname);
      json_kstr(&j, "format", hq_qtensor_format(qt, dir));
      json_kstr(&j, "plugin", hq_quantizer_plugin(q, dir));
      json_kint(&j, "bytes", (int64_t)bytes);
      json_knum(&j, "bits_per_element", bpe);
      json_knum(&j, "rel_rms_error", s.rel_rms);
      json_knum(&j, "max_abs_error", s.max_abs);
      json_knum(&j, "sqnr_db", s.sqnr_db);
      json_kint(&j, "nonfinite", s.nonfinite);
      /* the storage's buffers as a checkpoint would name them; a columnwise buffer that IS the
         rowwise one (made by the same call) says so and counts once, in the rowwise bytes */
      cli_buffers_json(&j, qt, dir);
      if (output) json_kstr(&j, "output", path);
      json_close_obj(&j);
    } else {
      printf("%-10s %-12s %-11s %12zu %8.3f %12.6g %12.6g %9.3f\n", dname,
             hq_qtensor_format(qt, dir), hq_quantizer_plugin(q, dir), bytes, bpe, s.rel_rms,
             s.max_abs, s.sqnr_db);
      if (s.nonfinite) printf("%-10s (%lld non-finite elements left out of the statistics)\n", "",
                              (long long)s.nonfinite);
      cli_buffers_text(qt, dir, 13);
      if (output) printf("%-10s   dequantized -> %s (f32, %lldx%lld)\n", "", path,
                         (long long)x.rows, (long long)x.cols);
    }
  }
  if (as_json) {
    json_close_arr(&j);
    json_close_obj(&j);
    json_end(&j);
  }
  status = 0;
out:
  hq_qtensor_free(qt);
  if (ctx && device >= 0) {
    hq_ctx_free(ctx, xd.data);
    hq_ctx_free(ctx, dd.data);
  }
  hq_quantizer_free(q);
  hq_state_free(st);
  hq_ctx_destroy(ctx);
  hq_recipe_free(r);
  free(deq);
  free(x.data);
  free(paths[0]);
  free(paths[1]);
  return status;
}
