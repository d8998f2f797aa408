/*
** cmd_quantize.c -- `hq quantize`: quantize a tensor (random or from a file) for one recipe role,
** dequantize every direction, report format, bytes, relative RMS error, max abs error, SQNR;
** optionally save the quantized tensor as a checkpoint (safetensors).
*/
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "buffers.h"
#include "ckpt_desc.h"
#include "cli.h"
#include "commands.h"
#include "json.h"
#include "npy.h"
#include "hq/numerics.h"
#include "hq/train.h"

static const char usage[] =
    "usage: hq quantize --recipe FILE --role MODULE:TENSOR:NAME\n"
    "                   (--random RxC [--scale X] [--dtype f32|bf16|f16] | --input FILE.npy |\n"
    "                    --input FILE --shape RxC [--dtype f32|bf16|f16] |\n"
    "                    --input FILE.safetensors (--tensor NAME | --all))\n"
    "                   [--seed S] [--device cpu|cuda[:N]] [--json]\n"
    "                   [--output FILE.npy] [--save FILE.safetensors [--name NAME]]\n"
    "                   [--finite-only] [--plugin-dir DIR]...\n"
    "\n"
    "Quantize one tensor with the quantizer the recipe gives the role (both directions),\n"
    "dequantize each direction and print per direction: format, plugin, bytes, bits per\n"
    "element, relative RMS error, max abs error and SQNR, then the direction's buffers (name,\n"
    "dtype, shape, bytes; a columnwise buffer that is the rowwise one says so).\n"
    "  --recipe FILE  the recipe (.ini) to read (a relative FILE that is not here: the\n"
    "                 shipped recipe of that name, e.g. recipe.ini or examples/mxfp8.ini)\n"
    "  --role M:T:N   the tensor's role: module_type:tensor_type:name (linear:weight:fc1),\n"
    "                 no part empty, as in a [role] section; a role no section matches stays\n"
    "                 in high precision, with a warning unless the recipe says `unmatched`\n"
    "  --random RxC   N(0, X^2) data (X = --scale, default 1) from a seeded generator,\n"
    "                 stored in --dtype (default f32); its values reach 6 X, so X must be\n"
    "                 a normal number of --dtype and 6 X finite there (f32: X in\n"
    "                 [1.2e-38, 5.6e37])\n"
    "  --seed S       the seed of --random's generator and of stochastic rounding, with\n"
    "                 --input too (default 1)\n"
    "  --input FILE   a .npy file (float32 or float16, C order, any rank: the leading\n"
    "                 dimensions are flattened into rows), raw little-endian values of\n"
    "                 --dtype (default f32) with --shape RxC, or a safetensors file (a\n"
    "                 model's weights, an hq checkpoint) with --tensor; --shape and --dtype\n"
    "                 are refused with a .npy or safetensors file, which gives its own, and\n"
    "                 --scale (--random's) with any --input\n"
    "  --tensor NAME  the entry of a safetensors --input to quantize (F32, F16 or BF16, any\n"
    "                 rank: the leading dimensions are flattened into rows); without it the\n"
    "                 error lists the file's entries\n"
    "  --all          every entry of a safetensors --input of two or more dimensions and\n"
    "                 dtype F32, F16 or BF16 (a model's weights), each with the role --role\n"
    "                 gives with the entry's name for its NAME (--role linear:weight:*, so\n"
    "                 the recipe's [role] globs choose each tensor's formats): a line per\n"
    "                 tensor and direction (format, bits per element, errors), and with\n"
    "                 --save every quantized tensor in one file under its entry's name;\n"
    "                 exit 1 after the table when a tensor could not be quantized\n"
    "  --device D     cpu (default), cuda or cuda:N: where the quantize runs\n"
    "  --json         print the report as one JSON document\n"
    "  --output FILE.npy  write each direction's dequantized tensor as a .npy file (f32,\n"
    "                 shape [rows, cols], C order; numpy.load reads it): the rowwise one\n"
    "                 to FILE.npy, the columnwise one to FILE.columnwise.npy (.npy is\n"
    "                 appended to FILE when missing)\n"
    "  --save FILE    write the quantized tensor itself (every direction's buffers and the\n"
    "                 metadata that names its format, plugin and options) as a safetensors\n"
    "                 checkpoint: hq_ckpt_load_qtensor loads it into a qtensor of the same\n"
    "                 recipe and role, other tools read its entries (docs/checkpoints.md)\n"
    "  --name NAME    the tensor's name in --save's file (default: the role's name, e.g.\n"
    "                 fc1, or \"tensor\" when it has none); its buffers are NAME/data, ...\n"
    "  --finite-only  refuse an input holding NaN or Inf (exit 1, naming the count and the\n"
    "                 first position) instead of quantizing it by each format's rule; without\n"
    "                 it the report counts them (docs/formats.md, NaN, Inf and zero)\n"
    "  --plugin-dir DIR  a directory to search for formats (repeatable)\n"
    "\n"
    "--output's and --save's files are written whole or not at all (to a temporary file beside\n"
    "each, renamed over it; a failed write leaves the path as it was); a symbolic link is\n"
    "followed to the file it names, and a path that is a device, FIFO, socket or directory\n"
    "is refused before any work.\n";

#define CMD "quantize"

/* xorshift64* + sum of uniforms: deterministic N(0,1)-like values, same on every machine */
static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* rng_normal's values lie in [-RNG_MAX, RNG_MAX) (twelve uniforms in [0, 1), less 6) */
#define RNG_MAX 6.0

static float rng_normal(uint64_t *s) {
  double acc = 0;
  for (int i = 0; i < 12; i++) acc += (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
  return (float)(acc - 6.0);
}

/* Write rows x cols f32 values as a .npy file: version 1.0, C order, the host's byte order
   ('<f4' on little-endian), header padded to a multiple of 64 bytes as numpy writes it; whole
   or not at all (cli_out: a failed write leaves no part of a file at the path). */
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
  cli_out o;
  if (cli_out_open(CMD, "--output", path, &o)) return 1;
  FILE *f = o.f;
  size_t count = (size_t)(rows * cols);
  int ok = fwrite(pre, 1, sizeof pre, f) == sizeof pre && fputs(h, f) >= 0 &&
           fprintf(f, "%*s\n", (int)(hlen - 1 - (size_t)n), "") >= 0 &&
           fwrite(v, sizeof(float), count, f) == count;
  return cli_out_commit(&o, ok);
}

/* Whether hq quantize takes elements of dtype d (F32, F16, BF16). */
static int quantizable(hq_dtype d) { return d == HQ_F32 || d == HQ_F16 || d == HQ_BF16; }

/* A safetensors file's entries, as "NAME [shape] DTYPE, ..." (at most 8, then how many more). */
static void entry_list(const hq_ckpt *c, char *buf, size_t len) {
  size_t at = 0, n = 0;
  buf[0] = '\0';
  for (const char *nm; (nm = hq_ckpt_entry_name(c, n)) != NULL; n++) {
    if (n >= 8) continue;
    hq_ckpt_entry_info e = HQ_STRUCT_INIT(hq_ckpt_entry_info);
    if (hq_ckpt_entry(c, nm, &e) || at >= len) continue;
    char shape[200];
    ckpt_shape_text(&e, shape, sizeof shape);
    at += (size_t)snprintf(buf + at, len - at, "%s'%.80s' %s %s", n ? ", " : "", nm, shape,
                           e.st_dtype);
  }
  if (n > 8 && at < len) snprintf(buf + at, len - at, " and %zu more", n - 8);
  if (!n) snprintf(buf, len, "no entry");
}

/* Entry `name` of the safetensors file c (opened from `path`) into t (host, its own dtype and
   flattened shape); load_safetensors opens the file for it, verified where it has hq's
   checksums (ckpt_open_any). */
static int load_entry(hq_ckpt *c, const char *path, const char *name, hq_tensor *t) {
  hq_ctx *ctx = NULL;
  char list[1024];
  int rc = 1;
  hq_ckpt_entry_info e = HQ_STRUCT_INIT(hq_ckpt_entry_info);
  if (!name) {
    entry_list(c, list, sizeof list);
    cli_fail(1, CMD, "%s is a safetensors file: give --tensor NAME, one of its entries: %s", path,
             list);
  } else if (hq_ckpt_entry(c, name, &e)) {
    char why[512]; /* entry_list's calls may set the last error again */
    snprintf(why, sizeof why, "%s", hq_last_error());
    entry_list(c, list, sizeof list);
    cli_fail(1, CMD, "%s (the file holds %s)", why, list);
  } else if (!quantizable(e.dtype)) {
    cli_fail(1, CMD, "%s: entry '%s' holds %s elements; hq quantize takes F32, F16 or BF16", path,
             name, e.st_dtype);
  } else {
    int64_t rows = 1;
    for (int k = 0; k + 1 < e.ndim; k++) rows *= e.shape[k];
    *t = hq_tensor_2d(NULL, e.dtype, HQ_DEVICE_HOST, rows, e.ndim ? e.shape[e.ndim - 1] : 1);
    if (!rows || !t->cols)
      cli_fail(1, CMD, "%s: entry '%s' holds no element", path, name);
    else if (!(t->data = malloc((size_t)e.bytes)))
      cli_fail(1, CMD, "out of memory for the %llu bytes of '%s'", (unsigned long long)e.bytes,
               name);
    else if (hq_ctx_create(NULL, &ctx) || hq_ckpt_load_tensor(c, ctx, name, t))
      cli_fail(1, CMD, "%s", hq_last_error());
    else
      rc = 0;
    if (rc) {
      free(t->data);
      t->data = NULL;
    }
  }
  hq_ctx_destroy(ctx);
  return rc;
}
static int load_safetensors(const char *path, const char *name, hq_tensor *t) {
  hq_ckpt *c = NULL;
  int summed;
  if (ckpt_open_any(path, &c, &summed)) return cli_fail(1, CMD, "%s", hq_last_error());
  const int rc = load_entry(c, path, name, t);
  hq_ckpt_close(c);
  return rc;
}

/* --input PATH: a .npy file (then no --shape or --dtype: dtype_s is NULL unless given) or raw
   values of dtype (default f32) in --shape. */
static int load_input(const char *path, const char *shape, const char *dtype_s, hq_dtype dtype,
                      hq_tensor *t) {
  FILE *f = fopen(path, "rb");
  if (!f) return cli_fail(1, CMD, "%s: cannot open: %s", path, strerror(errno));
  /* fopen opens a directory for reading too; only the reads fail, and then say less */
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
    fclose(f);
    return cli_fail(1, CMD, "%s: is a directory, not a .npy or raw file", path);
  }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (size < 0) {
    fclose(f);
    return cli_fail(1, CMD, "%s: cannot read its size", path);
  }
  unsigned char *buf = malloc((size_t)size + 1);
  if (!buf) {
    fclose(f);
    return cli_fail(1, CMD, "%s: out of memory for its %ld bytes", path, size);
  }
  errno = 0;
  if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
    const int e = ferror(f) ? errno : 0;
    fclose(f);
    free(buf);
    return cli_fail(1, CMD, "%s: read error: %s", path, e ? strerror(e) : "shorter than its size");
  }
  fclose(f);
  char err[512];
  size_t off = 0;
  *t = hq_tensor_2d(NULL, HQ_DTYPE_INVALID, HQ_DEVICE_HOST, 0, 0);
  int npy = cli_npy_parse(path, buf, (size_t)size, t, &off, err, sizeof err);
  if (npy < 0) {
    free(buf);
    return cli_fail(1, CMD, "%s", err);
  }
  if (npy && (shape || dtype_s)) { /* the file's own, not the option's, would be used */
    free(buf);
    if (shape)
      return cli_fail(2, CMD, "--shape does not apply to --input %s: a .npy file gives its own "
                      "shape (%lldx%lld)", path, (long long)t->rows, (long long)t->cols);
    return cli_fail(2, CMD, "--dtype does not apply to --input %s: a .npy file gives its own "
                    "dtype (%s)", path, hq_dtype_name(t->dtype));
  }
  if (!npy) {
    if (!shape) {
      free(buf);
      return cli_fail(1, CMD, "%s is not a .npy file: give --shape RxC (and --dtype) for raw "
                      "values", path);
    }
    if (cli_shape_arg(CMD, "--shape", shape, &t->rows, &t->cols)) {
      free(buf);
      return 2;
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

/* The error statistics over the elements where the input and the dequantized value are both
   finite; with none such (an all-NaN input) they are undefined (NAN), never a perfect 0 / inf. */
typedef struct stats {
  double rel_rms, max_abs, sqnr_db;
  int64_t nonfinite, nan_input;
  int defined;
} stats;

static stats compare(const hq_tensor *x, const float *d) {
  double sx = 0, se = 0, mx = 0;
  int64_t bad = 0, nan_in = 0;
  const int64_t n = x->rows * x->cols;
  for (int64_t i = 0; i < n; i++) {
    double a = hq_load_hp(x->data, i, x->dtype), b = d[i];
    nan_in += isnan(a);
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
             se > 0 ? 10 * log10(sx / se) : INFINITY, bad, nan_in, bad < n};
  if (!s.defined) s.rel_rms = s.max_abs = s.sqnr_db = NAN;
  return s;
}

typedef struct quantize_args {
  const char *recipe, *role_text, *random, *input, *shape, *dtype_s, *device_s, *output;
  const char *save, *name; /* --save's file and the tensor's name in it */
  const char *tensor;      /* --tensor: the entry of a safetensors --input */
  int all;                 /* --all: every entry of it */
  hq_ckpt *ck;             /* --all: that file, opened once for every entry */
  uint64_t seed;
  struct {
    double v; /* 0: no --scale */
    const char *text;
  } scale;
  int json, finite_only;
  cli_list dirs;
  hq_dtype dtype;
  int device;
  hq_role role;
  char role_buf[512];
} quantize_args;

static int set_seed(const char *cmd, const cli_option *o, const char *v) {
  if (cli_u64(v, o->dest)) return cli_fail(2, cmd, "--seed '%s' is not an integer", v);
  return 0;
}

static int set_scale(const char *cmd, const cli_option *o, const char *v) {
  char *end;
  quantize_args *a = o->dest;
  a->scale.v = strtod(v, &end);
  a->scale.text = v;
  if (*end || !isfinite(a->scale.v) || a->scale.v <= 0)
    return cli_fail(2, cmd, "--scale '%s' is not a positive number", v);
  return 0;
}

/* --scale X within what --random's values, up to RNG_MAX X, can be in `dtype`: X itself normal
   (a smaller one makes the values zeros or subnormals) and RNG_MAX X finite. 0, or 2 after the
   message. */
static int check_scale(const quantize_args *a) {
  const double min_normal = a->dtype == HQ_F16 ? 6.103515625e-05 : 1.1754943508222875e-38;
  const double max = hq_hp_max((int)a->dtype);
  if (a->scale.v >= min_normal && a->scale.v * RNG_MAX <= max) return 0;
  return cli_fail(2, CMD, "--scale '%s' is outside [%.8g, %.8g] for --dtype %s: --random's values "
                  "(|x| up to %g X) would %s", a->scale.text, min_normal, max / RNG_MAX,
                  hq_dtype_name(a->dtype), RNG_MAX,
                  a->scale.v < min_normal ? "be mostly zeros or subnormal numbers"
                                          : "overflow to Inf");
}

/* Whether --input is a safetensors file: --tensor or --all names an entry of one, else by its
   name, so that a large file is never read whole to find out. */
static int st_input(const quantize_args *a) {
  const size_t n = a->input ? strlen(a->input) : 0, e = strlen(".safetensors");
  return a->tensor || a->all || (n > e && !strcmp(a->input + n - e, ".safetensors"));
}

static int parse_args(int argc, char **argv, quantize_args *a) {
  const cli_option opts[] = {
      {.name = "--recipe", .kind = CLI_STR, .dest = &a->recipe},
      {.name = "--role", .kind = CLI_STR, .dest = &a->role_text},
      {.name = "--random", .kind = CLI_STR, .dest = &a->random},
      {.name = "--seed", .kind = CLI_CALL, .dest = &a->seed, .call = set_seed},
      {.name = "--scale", .kind = CLI_CALL, .dest = a, .call = set_scale},
      {.name = "--input", .kind = CLI_STR, .dest = &a->input},
      {.name = "--shape", .kind = CLI_STR, .dest = &a->shape},
      {.name = "--tensor", .kind = CLI_STR, .dest = &a->tensor},
      {.name = "--all", .kind = CLI_FLAG, .dest = &a->all},
      {.name = "--dtype", .kind = CLI_STR, .dest = &a->dtype_s},
      {.name = "--device", .kind = CLI_STR, .dest = &a->device_s},
      {.name = "--json", .kind = CLI_FLAG, .dest = &a->json},
      {.name = "--output", .kind = CLI_STR, .dest = &a->output},
      {.name = "--save", .kind = CLI_STR, .dest = &a->save},
      {.name = "--name", .kind = CLI_STR, .dest = &a->name},
      {.name = "--finite-only", .kind = CLI_FLAG, .dest = &a->finite_only},
      CLI_PLUGIN_DIRS(&a->dirs),
  };
  const cli_command c = {CMD, usage, opts, CLI_NOPTS(opts), NULL, NULL};
  const int st = cli_parse(&c, argc, argv);
  if (st != CLI_RUN) return st;
  if (a->output && !*a->output) return cli_fail(2, CMD, "--output needs a file name");
  if (a->save && !*a->save) return cli_fail(2, CMD, "--save needs a file name");
  if (a->name && !a->save) return cli_fail(2, CMD, "--name names the tensor in --save's file: "
                                              "give --save too");
  if (!a->recipe || !a->role_text) return cli_fail(2, CMD, "--recipe and --role are required");
  static char recipe_path[CLI_PATH_MAX];
  a->recipe = cli_recipe_path(CMD, a->recipe, recipe_path);
  if (!!a->random == !!a->input)
    return cli_fail(2, CMD, "give exactly one of --random and --input");
  /* an option the others make meaningless is refused, never silently dropped */
  if (a->random && a->tensor)
    return cli_fail(2, CMD, "--tensor names an entry of a safetensors --input: it does not "
                    "apply to --random");
  if (a->random && a->all)
    return cli_fail(2, CMD, "--all quantizes every entry of a safetensors --input: it does not "
                    "apply to --random");
  if (a->random && a->shape)
    return cli_fail(2, CMD, "--shape gives a raw --input file's shape: it does not apply to "
                    "--random, whose RxC is the shape");
  if (a->input && a->scale.v > 0)
    return cli_fail(2, CMD, "--scale scales --random's values: it does not apply to --input");
  if (a->tensor && a->shape)
    return cli_fail(2, CMD, "--tensor names an entry of a safetensors --input (whose shape the "
                    "file gives: no --shape)");
  if (a->all && (a->shape || a->tensor || a->output || a->name))
    return cli_fail(2, CMD, "--all quantizes every entry of a safetensors --input (no --shape, "
                    "--tensor, --output or --name)");
  if (st_input(a) && (a->shape || a->dtype_s))
    return cli_fail(2, CMD, "%s does not apply to a safetensors --input: the file gives each "
                    "entry's %s", a->shape ? "--shape" : "--dtype", a->shape ? "shape" : "dtype");
  if ((a->dtype_s && cli_dtype_arg(CMD, a->dtype_s, &a->dtype)) ||
      cli_device_arg(CMD, a->device_s, &a->device) || (a->scale.v > 0 && check_scale(a)))
    return 2;
  if (hq_role_parse(a->role_text, a->role_buf, sizeof a->role_buf, &a->role))
    return cli_fail(2, CMD, "%s", hq_last_error());
  /* the rules of a recipe's [role] patterns, so that --role names only what a section can */
  const char *parts[3] = {a->role.module_type, a->role.tensor_type, a->role.name};
  for (int i = 0; i < 3; i++) {
    const char *bad = strpbrk(parts[i], "[]\\");
    if (!*parts[i])
      return cli_fail(2, CMD, "--role '%s' has an empty part (use '*' to match anything)",
                      a->role_text);
    if (bad)
      return cli_fail(2, CMD, "--role '%s': part '%s' holds '%c': role patterns use only '*' "
                      "and '?' wildcards", a->role_text, parts[i], *bad);
  }
  if (a->all && strcmp(a->role.name ? a->role.name : "", "*") != 0)
    return cli_fail(2, CMD, "--all: give --role MODULE:TENSOR:* (each entry's name takes the *), "
                    "not %s", a->role_text);
  if (a->save && !a->name) a->name = a->role.name && *a->role.name ? a->role.name : "tensor";
  return CLI_RUN;
}

/* The input on the host: --random's seeded values or the --input file. 0, or the exit status
   after the message. */
static int make_input(const quantize_args *a, hq_tensor *x) {
  *x = hq_tensor_2d(NULL, a->dtype, HQ_DEVICE_HOST, 0, 0);
  if (a->input) {
    if (a->ck) return load_entry(a->ck, a->input, a->tensor, x);
    if (st_input(a)) return load_safetensors(a->input, a->tensor, x);
    return load_input(a->input, a->shape, a->dtype_s, a->dtype, x);
  }
  if (cli_shape_arg(CMD, "--random", a->random, &x->rows, &x->cols)) return 2;
  x->data = malloc((size_t)(x->rows * x->cols) * hq_dtype_size(a->dtype));
  if (!x->data) return cli_fail(1, CMD, "out of memory for %s", a->random);
  uint64_t s = a->seed * 0x9E3779B97F4A7C15ull + 1;
  const double scale = a->scale.v > 0 ? a->scale.v : 1.0;
  for (int64_t i = 0; i < x->rows * x->cols; i++)
    hq_store_hp(x->data, i, a->dtype, (float)(rng_normal(&s) * scale));
  return 0;
}

/* --output FILE[.npy]: FILE.npy (rowwise) and FILE.columnwise.npy into paths[dir - 1]. */
static int output_paths(const char *output, char *paths[2]) {
  size_t n = strlen(output);
  if (n >= 4 && !strcmp(output + n - 4, ".npy")) n -= 4;
  for (int d = 0; d < 2; d++) {
    const char *ext = d ? ".columnwise.npy" : ".npy";
    paths[d] = malloc(n + strlen(ext) + 1);
    if (!paths[d]) return cli_fail(1, CMD, "out of memory");
    snprintf(paths[d], n + strlen(ext) + 1, "%.*s%s", (int)n, output, ext);
  }
  return 0;
}

/* One quantize of the input and what its report needs. */
typedef struct qrun {
  hq_tensor x;            /* the input, on the host */
  hq_tensor xd;           /* the input where the quantize runs (x itself on the CPU) */
  hq_tensor dd;           /* a direction dequantized, f32, where the quantize runs */
  float *deq;             /* the same on the host */
  void *dev_in, *dev_out; /* on a CUDA device: the input and the dequantized copy there */
  char *paths[2];         /* --output's files, rowwise and columnwise */
  hq_recipe *r;
  hq_ctx *ctx;
  hq_state *st;           /* the recipe's scaling state (delayed scaling: scale 1 at step 0) */
  hq_quantizer *q;
  hq_qtensor *qt;
  int64_t nonfinite, first_nonfinite;
} qrun;

/* Load the recipe, make the quantizer, put the input where it runs, count its non-finite
   values and quantize it: 0, or 1 after the message. */
static int quantize_input(const quantize_args *a, qrun *u) {
  const int64_t n = u->x.rows * u->x.cols;
  const hq_recipe_opts o = cli_recipe_opts(&a->dirs);
  hq_ctx_desc desc = {sizeof desc, a->device, NULL, NULL, NULL, NULL, a->seed};
  u->xd = u->x;
  u->dd = hq_tensor_2d(NULL, HQ_F32, a->device, u->x.rows, u->x.cols);
  u->deq = malloc(sizeof(float) * (size_t)n);
  if (!u->deq) return cli_fail(1, CMD, "out of memory");
  u->dd.data = u->deq;
  if (hq_recipe_load(a->recipe, &o, &u->r)) return cli_fail(1, CMD, "%s", hq_last_error());
  /* a mistyped role gets identity without a word otherwise (hq train and recipe check warn too) */
  if (hq_recipe_unmatched(u->r) == HQ_UNMATCHED_UNSET && hq_recipe_match(u->r, &a->role) < 0)
    fprintf(stderr, "hq quantize: warning: recipe %s: role %s matches no [role] section: both "
            "directions stay in high precision (say `unmatched = identity` in [recipe] if that "
            "is meant)\n", a->recipe, a->role_text);
  if (hq_ctx_create(&desc, &u->ctx) || hq_state_create(u->r, u->ctx, &u->st) ||
      hq_quantizer_create_ex(u->r, &a->role, u->st, &u->q))
    return cli_fail(1, CMD, "%s", hq_last_error());
  if (a->device >= 0) {
    size_t bx = (size_t)n * hq_dtype_size(u->x.dtype);
    if (hq_ctx_alloc(u->ctx, bx, &u->dev_in) ||
        hq_ctx_alloc(u->ctx, sizeof(float) * (size_t)n, &u->dev_out) ||
        hq_ctx_memcpy(u->ctx, u->dev_in, a->device, u->x.data, HQ_DEVICE_HOST, bx))
      return cli_fail(1, CMD, "%s", hq_last_error());
    u->xd.data = u->dev_in;
    u->xd.device = a->device;
    u->dd.data = u->dev_out;
  }
  hq_quantize_args qargs = {.struct_size = sizeof qargs,
                            .flags = a->finite_only ? HQ_QUANTIZE_FINITE_ONLY : 0u};
  if (hq_tensor_nonfinite(u->ctx, &u->xd, &u->nonfinite, &u->first_nonfinite) ||
      hq_quantize_ex(u->q, u->ctx, &u->xd, &qargs, &u->qt))
    return cli_fail(1, CMD, "%s", hq_last_error());
  return 0;
}

/* --save: the quantized tensor as a checkpoint of one qtensor (the writer checks the name and
   writes the file atomically). 0, or 1 after the message. */
static int save_qtensor(const quantize_args *a, qrun *u) {
  hq_ckpt_writer *w = NULL;
  if (hq_ckpt_writer_open(a->save, &w)) return cli_fail(1, CMD, "--save: %s", hq_last_error());
  if (hq_ckpt_add_qtensor(w, u->ctx, a->name, u->qt)) {
    hq_ckpt_writer_abort(w);
    return cli_fail(1, CMD, "--save %s: %s", a->save, hq_last_error());
  }
  if (hq_ckpt_writer_close(w)) return cli_fail(1, CMD, "--save: %s", hq_last_error());
  return 0;
}

static void qrun_free(qrun *u) {
  hq_qtensor_free(u->qt);
  if (u->dev_in) hq_ctx_free(u->ctx, u->dev_in);
  if (u->dev_out) hq_ctx_free(u->ctx, u->dev_out);
  hq_quantizer_free(u->q);
  hq_state_free(u->st);
  hq_ctx_destroy(u->ctx);
  hq_recipe_free(u->r);
  free(u->deq);
  free(u->x.data);
  free(u->paths[0]);
  free(u->paths[1]);
}

/* The report's start: the JSON document up to its "directions" array, or the text's header. */
static void report_head(const quantize_args *a, const qrun *u, json *j) {
  const hq_tensor *x = &u->x;
  if (a->json) {
    json_begin(j, stdout);
    json_obj(j);
    json_kstr(j, "recipe", a->recipe);
    json_kstr(j, "role", a->role_text);
    const int64_t shape[2] = {x->rows, x->cols};
    json_kints(j, "shape", shape, 2);
    json_kstr(j, "dtype", hq_dtype_name(x->dtype));
    json_kstr(j, "device", a->device_s);
    json_kint(j, "nonfinite_inputs", u->nonfinite);
    json_kbool(j, "fused", hq_quantizer_fused(u->q));
    if (a->save) {
      json_key(j, "saved");
      json_obj(j);
      json_kstr(j, "path", a->save);
      json_kstr(j, "name", a->name);
      json_close_obj(j);
    }
    json_key(j, "directions");
    json_arr(j);
    return;
  }
  printf("role %s -> %s, shape %lldx%lld %s on %s\n", a->role_text, a->recipe, (long long)x->rows,
         (long long)x->cols, hq_dtype_name(x->dtype), a->device_s);
  if (u->nonfinite)
    printf("input holds %lld NaN/Inf value%s, the first at [%lld, %lld]: quantized by each "
           "format's rule (docs/formats.md; --finite-only refuses them)\n",
           (long long)u->nonfinite, u->nonfinite == 1 ? "" : "s",
           (long long)(u->first_nonfinite / x->cols), (long long)(u->first_nonfinite % x->cols));
  if (a->save) printf("saved as '%s' in %s (safetensors)\n", a->name, a->save);
  printf("%-10s %-12s %-11s %12s %8s %12s %12s %9s\n", "direction", "format", "plugin", "bytes",
         "bits/el", "rel_rms", "max_abs", "sqnr_db");
}

/* One direction dequantized (into u->deq on the host) and compared with the input: 0, or 1
   after the message. */
static int direction_stats(const quantize_args *a, qrun *u, uint32_t dir, stats *s) {
  const hq_tensor *x = &u->x;
  const size_t deq_bytes = sizeof(float) * (size_t)(x->rows * x->cols);
  if (hq_dequantize(u->qt, u->ctx, dir, &u->dd) ||
      (a->device >= 0 &&
       (hq_ctx_memcpy(u->ctx, u->deq, HQ_DEVICE_HOST, u->dd.data, a->device, deq_bytes) ||
        hq_ctx_sync(u->ctx))))
    return cli_fail(1, CMD, "%s", hq_last_error());
  *s = compare(x, u->deq);
  return 0;
}

/* One direction: dequantize it, compare it with the input, write --output's file, report it.
   0, or 1 after the message. */
static int report_direction(const quantize_args *a, qrun *u, uint32_t dir, json *j) {
  const hq_tensor *x = &u->x;
  stats s;
  if (direction_stats(a, u, dir, &s)) return 1;
  const char *path = u->paths[dir - 1];
  if (path && write_npy(path, u->deq, x->rows, x->cols)) return 1;
  size_t bytes = hq_qtensor_bytes(u->qt, dir);
  double bpe = 8.0 * (double)bytes / (double)(x->rows * x->cols);
  const char *dname = hq_dir_name(dir);
  if (a->json) {
    json_obj(j);
    json_kstr(j, "direction", dname);
    json_kstr(j, "format", hq_qtensor_format(u->qt, dir));
    json_kstr(j, "plugin", hq_quantizer_plugin(u->q, dir));
    json_kint(j, "bytes", (int64_t)bytes);
    json_knum(j, "bits_per_element", bpe);
    json_knum(j, "rel_rms_error", s.rel_rms);
    json_knum(j, "max_abs_error", s.max_abs);
    json_knum(j, "sqnr_db", s.sqnr_db);
    json_kint(j, "nonfinite", s.nonfinite);
    json_kint(j, "nan_inputs", s.nan_input);
    json_kbool(j, "statistics_defined", s.defined);
    /* the storage's buffers as a checkpoint would name them; a columnwise buffer that IS the
       rowwise one (made by the same call) says so and counts once, in the rowwise bytes */
    cli_buffers_json(j, u->qt, dir);
    if (path) json_kstr(j, "output", path);
    json_close_obj(j);
    return 0;
  }
  printf("%-10s %-12s %-11s %12zu %8.3f %12.6g %12.6g %9.3f\n", dname,
         hq_qtensor_format(u->qt, dir), hq_quantizer_plugin(u->q, dir), bytes, bpe, s.rel_rms,
         s.max_abs, s.sqnr_db);
  if (!s.defined)
    printf("%-10s (statistics undefined: all %lld elements are non-finite, %lld of them NaN in "
           "the input)\n", "", (long long)s.nonfinite, (long long)s.nan_input);
  else if (s.nonfinite)
    printf("%-10s (%lld non-finite elements left out of the statistics)\n", "",
           (long long)s.nonfinite);
  cli_buffers_text(u->qt, dir, 13);
  if (path) printf("%-10s   dequantized -> %s (f32, %lldx%lld)\n", "", path, (long long)x->rows,
                   (long long)x->cols);
  return 0;
}

/* --all: the entries of the --input file that hold a tensor to quantize (two or more
   dimensions, F32 / F16 / BF16), in the header's order, and the others with why not. */
typedef struct all_entry {
  const char *name;    /* the file's (valid while it is open) */
  const char *skipped; /* NULL: quantized */
} all_entry;

static int all_entries(const hq_ckpt *c, all_entry **out, size_t *n) {
  *out = NULL;
  *n = 0;
  size_t cnt = 0;
  while (hq_ckpt_entry_name(c, cnt)) cnt++;
  all_entry *v = calloc(cnt ? cnt : 1, sizeof *v);
  if (!v) return cli_fail(1, CMD, "out of memory");
  for (size_t i = 0; i < cnt; i++) {
    hq_ckpt_entry_info e = HQ_STRUCT_INIT(hq_ckpt_entry_info);
    v[i].name = hq_ckpt_entry_name(c, i);
    if (hq_ckpt_entry(c, v[i].name, &e)) v[i].skipped = "more than 8 dimensions";
    else if (!quantizable(e.dtype))
      v[i].skipped = "not F32, F16 or BF16";
    else if (e.ndim < 2) v[i].skipped = "fewer than 2 dimensions";
  }
  *out = v;
  *n = cnt;
  return 0;
}

/* --all: each entry quantized with its role, a line per direction (or the entry's error); --save
   adds every quantized tensor to one writer. */
static int quantize_all(const quantize_args *a0) {
  all_entry *ents;
  size_t nents, done = 0, failed = 0;
  hq_ckpt *ck = NULL;
  int summed;
  if (ckpt_open_any(a0->input, &ck, &summed)) return cli_fail(1, CMD, "%s", hq_last_error());
  if (all_entries(ck, &ents, &nents)) {
    hq_ckpt_close(ck);
    return 1;
  }
  size_t n = nents; /* the entries to go through: none when --save cannot start */
  hq_ckpt_writer *w = NULL;
  if (a0->save && hq_ckpt_writer_open(a0->save, &w)) {
    cli_fail(1, CMD, "--save: %s", hq_last_error());
    n = 0, failed = 1;
  }
  json j;
  if (a0->json) {
    json_begin(&j, stdout);
    json_obj(&j);
    json_kstr(&j, "recipe", a0->recipe);
    json_kstr(&j, "role", a0->role_text);
    json_kstr(&j, "input", a0->input);
    json_key(&j, "tensors");
    json_arr(&j);
  } else if (n) {
    printf("%s, role %s -> %s\n%-36s %-14s %-10s %-10s %-10s %8s %12s %9s\n", a0->input,
           a0->role_text, a0->recipe, "tensor", "shape", "direction", "format", "plugin",
           "bits/el", "rel_rms", "sqnr_db");
  }
  uint64_t in_bytes = 0, out_bytes = 0;
  for (size_t i = 0; i < n; i++) {
    if (ents[i].skipped) {
      if (a0->json) {
        json_obj(&j);
        json_kstr(&j, "name", ents[i].name);
        json_kstr(&j, "skipped", ents[i].skipped);
        json_close_obj(&j);
      }
      continue;
    }
    quantize_args a = *a0;
    char rb[1200];
    snprintf(rb, sizeof rb, "%s:%s:%s", a0->role.module_type, a0->role.tensor_type,
             ents[i].name);
    a.role = hq_role_of(a0->role.module_type, a0->role.tensor_type, ents[i].name);
    a.role_text = rb;
    a.tensor = ents[i].name;
    a.ck = ck;
    a.json = 0;
    qrun u;
    memset(&u, 0, sizeof u);
    stats s[2];
    char why[600] = "";
    /* an entry's error goes to stderr and into its line; the table goes on */
    int rc = make_input(&a, &u.x);
    if (!rc) rc = quantize_input(&a, &u);
    for (uint32_t dir = HQ_ROWWISE; !rc && dir <= HQ_COLWISE; dir++)
      rc = direction_stats(&a, &u, dir, &s[dir - 1]);
    if (!rc && w && hq_ckpt_add_qtensor(w, u.ctx, ents[i].name, u.qt))
      rc = cli_fail(1, CMD, "--save: %s", hq_last_error());
    if (rc) snprintf(why, sizeof why, "%s", cli_last_failure());
    char shape[64];
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)u.x.rows, (long long)u.x.cols);
    if (a0->json) {
      json_obj(&j);
      json_kstr(&j, "name", ents[i].name);
      const int64_t sh[2] = {u.x.rows, u.x.cols};
      json_kints(&j, "shape", sh, 2);
      if (rc) json_kstr(&j, "error", why);
    } else if (rc) {
      printf("%-36s %-14s %s\n", ents[i].name, shape, why[0] ? why : "(failed)");
    }
    if (!rc) {
      if (a0->json) {
        json_key(&j, "directions");
        json_arr(&j);
      }
      in_bytes += (uint64_t)(u.x.rows * u.x.cols) * hq_dtype_size(u.x.dtype);
      for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
        const size_t bytes = hq_qtensor_bytes(u.qt, dir);
        const double bpe = 8.0 * (double)bytes / (double)(u.x.rows * u.x.cols);
        const stats *t = &s[dir - 1];
        out_bytes += bytes;
        if (a0->json) {
          json_obj(&j);
          json_kstr(&j, "direction", hq_dir_name(dir));
          json_kstr(&j, "format", hq_qtensor_format(u.qt, dir));
          json_kstr(&j, "plugin", hq_quantizer_plugin(u.q, dir));
          json_kint(&j, "bytes", (int64_t)bytes);
          json_knum(&j, "bits_per_element", bpe);
          json_knum(&j, "rel_rms_error", t->rel_rms);
          json_knum(&j, "sqnr_db", t->sqnr_db);
          json_close_obj(&j);
        } else {
          printf("%-36s %-14s %-10s %-10s %-10s %8.3f %12.6g %9.3f\n",
                 dir == HQ_ROWWISE ? ents[i].name : "", dir == HQ_ROWWISE ? shape : "",
                 hq_dir_name(dir), hq_qtensor_format(u.qt, dir), hq_quantizer_plugin(u.q, dir),
                 bpe, t->rel_rms, t->sqnr_db);
        }
      }
      if (a0->json) json_close_arr(&j);
      done++;
    }
    if (a0->json) json_close_obj(&j);
    failed += rc != 0;
    qrun_free(&u);
  }
  if (w && (failed ? (hq_ckpt_writer_abort(w), 0) : hq_ckpt_writer_close(w)))
    failed += cli_fail(1, CMD, "--save: %s", hq_last_error());
  if (a0->json) {
    json_close_arr(&j);
    if (w && !failed) {
      json_key(&j, "saved");
      json_obj(&j);
      json_kstr(&j, "path", a0->save);
      json_close_obj(&j);
    }
    json_kint(&j, "quantized", (int64_t)done);
    json_kint(&j, "failed", (int64_t)failed);
    json_close_obj(&j);
    json_end(&j);
  } else if (n) {
    printf("%zu tensor%s quantized (%llu bytes -> %llu, both directions), %zu failed, %zu "
           "skipped (1-D, or not F32 / F16 / BF16)%s%s\n", done, done == 1 ? "" : "s",
           (unsigned long long)in_bytes, (unsigned long long)out_bytes, failed,
           n - done - failed, w && !failed ? "; saved in " : "",
           w && !failed ? a0->save : "");
  }
  free(ents);
  hq_ckpt_close(ck);
  if (failed && w)
    fprintf(stderr, "hq quantize: --save: %s not written (%zu tensor%s failed)\n", a0->save,
            failed, failed == 1 ? "" : "s");
  return failed ? 1 : 0;
}

int hq_cmd_quantize(int argc, char **argv) {
  quantize_args a = {.device_s = "cpu", .seed = 1, .dtype = HQ_F32};
  int st = parse_args(argc, argv, &a);
  if (st != CLI_RUN) return st;
  /* every output path checked before any work (the writers apply the same rule again) */
  if (a.save && cli_output_path(CMD, "--save", a.save, NULL)) return 1;
  if (a.all) return quantize_all(&a);
  qrun u;
  memset(&u, 0, sizeof u);
  if (a.output && (output_paths(a.output, u.paths) ||
                   cli_output_path(CMD, "--output", u.paths[0], NULL) ||
                   cli_output_path(CMD, "--output", u.paths[1], NULL))) {
    qrun_free(&u);
    return 1;
  }
  if ((st = make_input(&a, &u.x)) != 0) {
    qrun_free(&u);
    return st;
  }
  if (quantize_input(&a, &u) || (a.save && save_qtensor(&a, &u))) {
    qrun_free(&u);
    return 1;
  }
  json j;
  report_head(&a, &u, &j);
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++)
    if (report_direction(&a, &u, dir, &j)) {
      qrun_free(&u);
      return 1;
    }
  if (a.json) {
    json_close_arr(&j);
    json_close_obj(&j);
    json_end(&j);
  }
  qrun_free(&u);
  return 0;
}
