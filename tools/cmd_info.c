/*
** cmd_info.c -- `hq info`: version, ABI, plugin search path, formats with their options,
** GEMM providers, rejected modules, devices; or what a checkpoint holds, its checksums verified.
*/
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "buffers.h"
#include "ckpt_desc.h"
#include "cli.h"
#include "commands.h"
#include "json.h"
#include "hq/train.h"

static const char usage[] =
    "usage: hq info [--json] [--shape RxC] [--plugin-dir DIR]...\n"
    "       hq info --checkpoint FILE [--json]\n"
    "\n"
    "Print the version, the plugin ABI, the plugin search path, every format found with its\n"
    "capabilities (cpu, cuda, requant-safe, colwise-only, fused-adam, deq-factor, adam-kdev,\n"
    "rng-dev, deq-row-factor, copy-out, plain-copy: the module's HQ_CAP_* flags), its options\n"
    "(type, default, help) and the buffers of each direction, the GEMM providers in the order a\n"
    "GEMM asks them (built in or loaded from the path), the modules that were rejected and why,\n"
    "and the CUDA devices.\n"
    "  --shape RxC    the sample tensor whose buffers are listed (default 256x256): each\n"
    "                 format with its default options makes both directions of an f32\n"
    "                 [R, C] tensor on the CPU; per buffer: name (as checkpoints name it),\n"
    "                 dtype, shape, bytes, and whether a columnwise buffer is the rowwise\n"
    "                 one (shared). `hq quantize --json` lists them the same way.\n"
    "  --checkpoint FILE  instead: what a safetensors file holds -- every entry (name,\n"
    "                 dtype, shape, bytes), the quantized tensors (shape, each direction's\n"
    "                 format, plugin and options) and the other metadata -- then every\n"
    "                 entry read and checked against its checksum: exit 1 naming the first\n"
    "                 corrupt entry; a file without checksums (another tool's) is listed,\n"
    "                 not verified\n"
    "  --plugin-dir DIR  a directory to search for formats (after $HQ_PLUGIN_PATH)\n";

static void caps_text(uint64_t caps, char *buf, size_t len) {
  buf[0] = '\0';
  const struct { uint64_t bit; const char *name; } names[] = {
      {HQ_CAP_CPU, "cpu"}, {HQ_CAP_CUDA, "cuda"}, {HQ_CAP_REQUANT_SAFE, "requant-safe"},
      {HQ_CAP_COLWISE_ONLY, "colwise-only"}, {HQ_CAP_FUSED_ADAM, "fused-adam"},
      {HQ_CAP_DEQ_FACTOR, "deq-factor"}, {HQ_CAP_ADAM_KDEV, "adam-kdev"},
      {HQ_CAP_RNG_DEV, "rng-dev"}, {HQ_CAP_DEQ_ROW_FACTOR, "deq-row-factor"},
      {HQ_CAP_COPY_OUT, "copy-out"}, {HQ_CAP_PLAIN_COPY, "plain-copy"}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (!(caps & names[i].bit)) continue;
    if (buf[0]) strncat(buf, ",", len - strlen(buf) - 1);
    strncat(buf, names[i].name, len - strlen(buf) - 1);
  }
}

/* A range bound as written in a recipe: integers in full (2^63 - 1, not 9.22337e+18). */
static const char *num_text(double v, hq_opt_type t, char *buf, size_t len) {
  if (t == HQ_OPT_INT && v >= -9.2e18 && v <= 9.2e18) snprintf(buf, len, "%lld", (long long)v);
  else if (t == HQ_OPT_INT && v > 0) snprintf(buf, len, "%lld", (long long)INT64_MAX);
  else snprintf(buf, len, "%.9g", v);
  return buf;
}

/* Both directions of a [rows, cols] f32 tensor made (allocated, not quantized) on the host by
   plugin p with its default options, as one instance; NULL with the reason in err when the
   format refuses. */
static hq_qtensor *sample_tensor(hq_plugins *set, hq_ctx *ctx, const hq_plugin *p, int64_t rows,
                                 int64_t cols, char *err, size_t err_len) {
  hq_format_spec spec = {sizeof spec, hq_plugin_name(p), NULL, 0};
  hq_quantizer *q = NULL;
  hq_qtensor *qt = NULL;
  if (hq_quantizer_create_direct(set, &spec, &spec, HQ_SOURCE_ORIGINAL, &q) ||
      hq_make_empty(q, ctx, rows, cols, HQ_F32, &qt))
    snprintf(err, err_len, "%s", hq_last_error());
  hq_quantizer_free(q);
  return qt;
}


static void option_json(json *j, const hq_option *o) {
  json_obj(j);
  json_kstr(j, "name", o->name);
  json_kstr(j, "type", hq_opt_type_name(o->type));
  json_kstr(j, "default", o->def);
  json_kstr(j, "help", o->help ? o->help : "");
  if (o->type == HQ_OPT_ENUM) {
    json_key(j, "choices");
    json_arr(j);
    const char *p = o->choices;
    while (p && *p) {
      const char *bar = strchr(p, '|');
      size_t n = bar ? (size_t)(bar - p) : strlen(p);
      char buf[64];
      snprintf(buf, sizeof buf, "%.*s", (int)n, p);
      json_str(j, buf);
      p = bar ? bar + 1 : NULL;
    }
    json_close_arr(j);
  }
  if ((o->type == HQ_OPT_INT || o->type == HQ_OPT_FLOAT) && o->min <= o->max) {
    json_knum(j, "min", o->min);
    json_knum(j, "max", o->max);
  }
  json_close_obj(j);
}

typedef struct info_args {
  int json;
  const char *shape, *checkpoint;
  int64_t rows, cols;
  cli_list dirs;
} info_args;

static int parse_args(int argc, char **argv, info_args *a) {
  const cli_option opts[] = {
      {.name = "--json", .kind = CLI_FLAG, .dest = &a->json},
      {.name = "--shape", .kind = CLI_STR, .dest = &a->shape},
      {.name = "--checkpoint", .kind = CLI_STR, .dest = &a->checkpoint},
      CLI_PLUGIN_DIRS(&a->dirs),
  };
  const cli_command c = {"info", usage, opts, CLI_NOPTS(opts), NULL, NULL};
  const int st = cli_parse(&c, argc, argv);
  if (st != CLI_RUN) return st;
  if (a->checkpoint && a->shape)
    return cli_fail(2, "info", "--shape sets the sample tensor of the format listing: it does not "
                    "apply to --checkpoint");
  if (!a->shape) a->shape = "256x256";
  return cli_shape_arg("info", "--shape", a->shape, &a->rows, &a->cols) ? 2 : CLI_RUN;
}

/* One format in the JSON: name, version, file, caps, options, and the sample tensor's buffers
   per direction (or why the format refuses its shape). */
static void plugin_json(json *j, hq_plugins *set, hq_ctx *ctx, const hq_plugin *p, int64_t rows,
                        int64_t cols) {
  char caps[128], err[512];
  caps_text(hq_plugin_caps(p), caps, sizeof caps);
  json_obj(j);
  json_kstr(j, "name", hq_plugin_name(p));
  json_kstr(j, "version", hq_plugin_version(p));
  json_kstr(j, "description", hq_plugin_description(p));
  json_kstr(j, "file", hq_plugin_file(p));
  json_kstr(j, "caps", caps);
  json_key(j, "options");
  json_arr(j);
  for (const hq_option *o = hq_plugin_options(p); o->name; o++) option_json(j, o);
  json_close_arr(j);
  /* the buffers of the sample tensor, as `hq quantize --json` lists them */
  hq_qtensor *qt = sample_tensor(set, ctx, p, rows, cols, err, sizeof err);
  if (qt) {
    json_key(j, "directions");
    json_arr(j);
    for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
      json_obj(j);
      json_kstr(j, "direction", hq_dir_name(dir));
      json_kint(j, "bytes", (int64_t)hq_qtensor_bytes(qt, dir));
      cli_buffers_json(j, qt, dir);
      json_close_obj(j);
    }
    json_close_arr(j);
  } else {
    json_kstr(j, "layout_error", err);
  }
  hq_qtensor_free(qt);
  json_close_obj(j);
}

static void report_json(hq_plugins *set, hq_ctx *ctx, int64_t rows, int64_t cols) {
  json j;
  json_begin(&j, stdout);
  json_obj(&j);
  json_kstr(&j, "version", hq_version());
  json_key(&j, "abi");
  json_obj(&j);
  json_kint(&j, "major", HQ_ABI_MAJOR);
  json_kint(&j, "minor", HQ_ABI_MINOR);
  json_close_obj(&j);
  json_kbool(&j, "cuda", hq_built_with_cuda());
  json_kstr(&j, "default_plugin_dir", hq_plugins_default_dir());
  char *rdir = cli_recipe_dir();
  json_kstr(&j, "recipe_dir", rdir ? rdir : "(out of memory)");
  free(rdir);
  const int64_t shape[2] = {rows, cols};
  json_kints(&j, "sample_shape", shape, 2);
  json_key(&j, "plugin_path");
  json_arr(&j);
  for (size_t i = 0; i < hq_plugins_dir_count(set); i++) json_str(&j, hq_plugins_dir(set, i));
  json_close_arr(&j);
  json_key(&j, "plugins");
  json_arr(&j);
  for (size_t i = 0; i < hq_plugins_count(set); i++)
    plugin_json(&j, set, ctx, hq_plugins_get(set, i), rows, cols);
  json_close_arr(&j);
  json_key(&j, "gemm_providers");
  json_arr(&j);
  for (size_t i = 0; i < hq_plugins_gemm_count(set); i++) {
    hq_gemm_provider_info g = {.struct_size = sizeof g};
    if (hq_plugins_gemm_info(set, i, &g)) continue;
    json_obj(&j);
    json_kstr(&j, "name", g.name);
    json_kstr(&j, "version", g.version);
    json_kint(&j, "priority", g.priority);
    json_kstr(&j, "description", g.description);
    json_kstr(&j, "file", g.file);
    json_close_obj(&j);
  }
  json_close_arr(&j);
  json_key(&j, "rejected");
  json_arr(&j);
  for (size_t i = 0; i < hq_plugins_rejected_count(set); i++) {
    json_obj(&j);
    json_kstr(&j, "file", hq_plugins_rejected_file(set, i));
    json_kstr(&j, "reason", hq_plugins_rejected_reason(set, i));
    json_close_obj(&j);
  }
  json_close_arr(&j);
  json_key(&j, "devices");
  json_arr(&j);
  for (int d = 0, ndev = hq_device_count(); d < ndev; d++) {
    char name[256] = "";
    int arch = 0;
    hq_device_info(d, name, sizeof name, &arch);
    json_obj(&j);
    json_kint(&j, "index", d);
    json_kstr(&j, "name", name);
    json_kint(&j, "arch", arch);
    json_close_obj(&j);
  }
  json_close_arr(&j);
  json_close_obj(&j);
  json_end(&j);
}

/* One format in the text: name, version, caps, description, file, options, sample buffers. */
static void plugin_text(hq_plugins *set, hq_ctx *ctx, const hq_plugin *p, int64_t rows,
                        int64_t cols) {
  char caps[128], err[512];
  caps_text(hq_plugin_caps(p), caps, sizeof caps);
  printf("  %s %s  [%s]\n    %s\n    %s\n", hq_plugin_name(p), hq_plugin_version(p), caps,
         hq_plugin_description(p), hq_plugin_file(p));
  for (const hq_option *o = hq_plugin_options(p); o->name; o++) {
    char type[160], lo[32], hi[32];
    if (o->type == HQ_OPT_ENUM) snprintf(type, sizeof type, "%s", o->choices);
    else if ((o->type == HQ_OPT_INT || o->type == HQ_OPT_FLOAT) && o->min <= o->max)
      snprintf(type, sizeof type, "%s in [%s, %s]", hq_opt_type_name(o->type),
               num_text(o->min, o->type, lo, sizeof lo), num_text(o->max, o->type, hi, sizeof hi));
    else snprintf(type, sizeof type, "%s", hq_opt_type_name(o->type));
    printf("      %-20s %s, default %s\n      %-20s %s\n", o->name, type,
           o->def[0] ? o->def : "\"\"", "", o->help ? o->help : "");
  }
  hq_qtensor *qt = sample_tensor(set, ctx, p, rows, cols, err, sizeof err);
  if (!qt) printf("    buffers of a %lldx%lld tensor: none (%s)\n", (long long)rows,
                  (long long)cols, err);
  for (uint32_t dir = HQ_ROWWISE; qt && dir <= HQ_COLWISE; dir++) {
    printf("    %s buffers of a %lldx%lld tensor (%zu bytes):\n", hq_dir_name(dir), (long long)rows,
           (long long)cols, hq_qtensor_bytes(qt, dir));
    cli_buffers_text(qt, dir, 6);
  }
  hq_qtensor_free(qt);
}

static void report_text(hq_plugins *set, hq_ctx *ctx, int64_t rows, int64_t cols) {
  printf("hq %s, plugin ABI %d.%d, CUDA %s\n", hq_version(), HQ_ABI_MAJOR, HQ_ABI_MINOR,
         hq_built_with_cuda() ? "built in" : "not built");
  char *rdir = cli_recipe_dir();
  printf("\nshipped recipes: %s (recipe.ini, the default; examples/*.ini)\n",
         rdir ? rdir : "(out of memory)");
  free(rdir);
  printf("\nplugin search path:\n");
  for (size_t i = 0; i < hq_plugins_dir_count(set); i++) {
    struct stat st;
    const char *d = hq_plugins_dir(set, i);
    printf("  %s%s\n", d, stat(d, &st) == 0 ? "" : "  (missing)");
  }
  printf("\nformats:\n");
  for (size_t i = 0; i < hq_plugins_count(set); i++)
    plugin_text(set, ctx, hq_plugins_get(set, i), rows, cols);
  if (hq_plugins_count(set) == 0) printf("  (none found)\n");
  printf("\nGEMM providers (asked in this order):\n");
  for (size_t i = 0; i < hq_plugins_gemm_count(set); i++) {
    hq_gemm_provider_info g = {.struct_size = sizeof g};
    if (hq_plugins_gemm_info(set, i, &g)) continue;
    printf("  %s %s  [priority %d]\n    %s\n    %s\n", g.name, g.version, (int)g.priority,
           g.description, g.file);
  }
  if (hq_plugins_rejected_count(set)) {
    printf("\nrejected modules:\n");
    for (size_t i = 0; i < hq_plugins_rejected_count(set); i++)
      printf("  %s: %s\n", hq_plugins_rejected_file(set, i), hq_plugins_rejected_reason(set, i));
  }
  printf("\ndevices:\n  cpu\n");
  for (int d = 0, ndev = hq_device_count(); d < ndev; d++) {
    char name[256] = "";
    int arch = 0;
    hq_device_info(d, name, sizeof name, &arch);
    printf("  cuda:%d  %s (sm_%d)\n", d, name, arch);
  }
}

/* Whether metadata key k ends in suffix s. */
static int key_ends(const char *k, const char *s) {
  const size_t n = strlen(k), m = strlen(s);
  return n >= m && !strcmp(k + n - m, s);
}
/* hq's own bookkeeping (a checksum, not worth listing); a quantized tensor's description (a
   name before the "/hq") */
static int sum_key(const char *k) { return key_ends(k, "xxh3_64"); }
static int qt_key(const char *k) { return strlen(k) > 3 && key_ends(k, "/hq"); }

/* A metadata value on one line of the listing: control characters as \n, \t or \xNN, at most
   200 bytes of it (then "..."). */
static void print_value(const char *v) {
  size_t n = 0;
  for (; *v && n < 200; v++, n++) {
    const unsigned char ch = (unsigned char)*v;
    if (ch == '\n') fputs("\\n", stdout);
    else if (ch == '\t') fputs("\\t", stdout);
    else if (ch < 0x20 || ch == 0x7f) printf("\\x%02x", ch);
    else putchar(ch);
  }
  fputs(*v ? "...\n" : "\n", stdout);
}

/* --checkpoint: the entries, the quantized tensors and the other metadata of FILE, then its
   checksums verified. 0, or 1 (a file that cannot be opened, a corrupt entry). */
static int report_checkpoint(const char *path, int as_json) {
  hq_ckpt *c = NULL;
  int sums;
  if (ckpt_open_any(path, &c, &sums)) return cli_fail(1, "info", "%s", hq_last_error());
  json j;
  uint64_t total = 0;
  size_t n = 0;
  if (as_json) {
    json_begin(&j, stdout);
    json_obj(&j);
    json_kstr(&j, "checkpoint", path);
    json_key(&j, "entries");
    json_arr(&j);
  } else {
    printf("checkpoint %s\n  %-40s %-8s %-20s %12s\n", path, "entry", "dtype", "shape", "bytes");
  }
  for (const char *nm; (nm = hq_ckpt_entry_name(c, n)) != NULL; n++) {
    hq_ckpt_entry_info e = HQ_STRUCT_INIT(hq_ckpt_entry_info);
    const int ok = hq_ckpt_entry(c, nm, &e) == HQ_OK; /* more than 8 dimensions: name only */
    char shape[200] = "?";
    if (ok) ckpt_shape_text(&e, shape, sizeof shape);
    total += ok ? e.bytes : 0;
    if (as_json) {
      json_obj(&j);
      json_kstr(&j, "name", nm);
      if (ok) {
        json_kstr(&j, "dtype", e.st_dtype);
        json_kints(&j, "shape", e.shape, e.ndim);
        json_kint(&j, "bytes", (int64_t)e.bytes);
      }
      json_close_obj(&j);
    } else {
      printf("  %-40s %-8s %-20s %12llu\n", nm, ok ? e.st_dtype : "?", shape,
             (unsigned long long)(ok ? e.bytes : 0));
    }
  }
  if (as_json) {
    json_close_arr(&j);
    json_key(&j, "quantized");
    json_arr(&j);
  } else {
    printf("  %zu entr%s, %llu bytes\n", n, n == 1 ? "y" : "ies", (unsigned long long)total);
  }
  /* a quantized tensor NAME is described by metadata NAME/hq (docs/checkpoints.md, 3) */
  size_t nq = 0;
  const char *k;
  for (size_t i = 0; (k = hq_ckpt_meta_key(c, i)) != NULL; i++) {
    if (!qt_key(k)) continue;
    const size_t kl = strlen(k);
    if (as_json) {
      json_obj(&j);
      json_key(&j, "name");
      char nm[1100];
      snprintf(nm, sizeof nm, "%.*s", (int)(kl - 3), k);
      json_str(&j, nm);
      json_kstr(&j, "metadata", hq_ckpt_meta(c, k));
      json_close_obj(&j);
    } else {
      char d[1024];
      if (!nq) printf("  quantized tensors (hq_ckpt_load_qtensor):\n");
      printf("    %.*s: %s\n", (int)(kl - 3), k,
             ckpt_describe(hq_ckpt_meta(c, k), d, sizeof d) ? "(metadata not readable)" : d);
    }
    nq++;
  }
  if (as_json) {
    json_close_arr(&j);
    json_key(&j, "metadata");
    json_obj(&j);
  }
  for (size_t i = 0; (k = hq_ckpt_meta_key(c, i)) != NULL; i++) {
    if (sum_key(k) || qt_key(k)) continue;
    if (as_json) json_kstr(&j, k, hq_ckpt_meta(c, k));
    else printf("  metadata %s = ", k), print_value(hq_ckpt_meta(c, k));
  }
  uint64_t read = 0;
  int rc = sums ? hq_ckpt_verify(c, &read) : HQ_OK;
  const char *why = rc ? hq_last_error() : NULL;
  if (as_json) {
    json_close_obj(&j);
    json_kstr(&j, "checksums", !sums ? "none" : rc ? "corrupt" : "verified");
    if (why) json_kstr(&j, "error", why);
    json_close_obj(&j);
    json_end(&j);
  } else if (!sums) {
    printf("  checksums: none (a file another tool wrote): not verified\n");
  } else if (!rc) {
    printf("  checksums: every entry verified (%llu bytes read)\n", (unsigned long long)read);
  }
  if (rc) cli_fail(1, "info", "%s", why);
  hq_ckpt_close(c);
  return rc ? 1 : 0;
}

int hq_cmd_info(int argc, char **argv) {
  info_args a = {0};
  const int st = parse_args(argc, argv, &a);
  if (st != CLI_RUN) return st;
  if (a.checkpoint) return report_checkpoint(a.checkpoint, a.json);
  hq_plugins *set = NULL;
  hq_ctx *ctx = NULL;
  if (hq_plugins_open(a.dirs.v, a.dirs.n, 0, &set) || hq_ctx_create(NULL, &ctx)) {
    hq_plugins_close(set);
    return cli_fail(1, "info", "%s", hq_last_error());
  }
  if (a.json) report_json(set, ctx, a.rows, a.cols);
  else report_text(set, ctx, a.rows, a.cols);
  hq_ctx_destroy(ctx);
  hq_plugins_close(set);
  return 0;
}
