/*
** cmd_recipe.c -- `hq recipe check FILE`: every section resolved, the formats per direction,
** shadowed sections, and the errors with file:line. Exit 0 only for a valid recipe.
*/
#include <stdarg.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "json.h"

static const char usage[] =
    "usage: hq recipe check FILE [--json] [--plugin-dir DIR]...\n"
    "\n"
    "Parse and resolve a recipe: list its format instances (plugin and every option value),\n"
    "each [role] section with the format of each direction and the columnwise source, the\n"
    "sections another section shadows (each also a warning naming both FILE:LINEs: a\n"
    "shadowed section never applies), and every error as FILE:LINE: message; a warning\n"
    "where a section naming a layer loses to one naming a tensor type for some of its roles\n"
    "([role linear:*:lm_head] beside [role linear:grad_output:*]), and the resolved table: the\n"
    "formats of each linear layer's input, weight and grad_output and their sections. Then, for\n"
    "every linear layer the role sections name, the three GEMMs (fprop W.row x X.row, dgrad\n"
    "W.col x dY.row, wgrad X.col x dY.col): the two operand formats and the path on the CPU\n"
    "and, when a GPU is present, on it (native / emulated); a pair that cannot be multiplied\n"
    "(operands transformed differently along k, e.g. RHT on one wgrad operand only) is an\n"
    "error naming the role section's FILE:LINE. A failure of the check itself (e.g. out of\n"
    "memory) is reported as FILE: check incomplete: ... and makes the recipe not valid.\n"
    "A relative FILE that is not here names the shipped recipe of that name (recipe.ini,\n"
    "examples/*.ini: `hq info` says where they are), and a line on stderr says so.\n"
    "Exit status: 0 valid, 1 errors found, 2 bad usage.\n";

/* The module file a format instance of plugin `name` comes from. */
static const char *module_file(const hq_recipe *r, const char *name) {
  const hq_plugin *p = name ? hq_plugins_find(hq_recipe_plugins(r), name) : NULL;
  return p ? hq_plugin_file(p) : NULL;
}

/* The k-th module of the same format name that the loader set aside because `name` was found
   first on the search path (a user's module shadowing an installed one), or NULL. */
static const char *shadowed_file(const hq_recipe *r, const char *name, size_t k) {
  const hq_plugins *set = hq_recipe_plugins(r);
  char needle[96];
  if (!name) return NULL;
  snprintf(needle, sizeof needle, "duplicate format name '%s'", name);
  for (size_t i = 0; i < hq_plugins_rejected_count(set); i++)
    if (strstr(hq_plugins_rejected_reason(set, i), needle) && k-- == 0)
      return hq_plugins_rejected_file(set, i);
  return NULL;
}

static const char *source_name(int s) {
  return s == HQ_SOURCE_ROWWISE_DEQUANTIZED ? "rowwise_dequantized" : "original";
}


// --- the GEMMs of every linear layer the recipe names --------------------------------------------

/* One GEMM of a linear layer: its two operands (role, direction, format) and the path. */
typedef struct lgemm {
  char layer[64];
  const char *gemm;                 /* fprop, dgrad, wgrad */
  const char *tensor[2];            /* input / weight / grad_output of A and B */
  uint32_t dir[2];
  char format[2][32], plugin[2][32];
  int line[2];                      /* the [role] section's line, 0 when unmatched (identity) */
  int possible;
  uint32_t path_host, path_gpu;     /* path_gpu 0 when no GPU was found */
  char why[320];                    /* impossible: the reason; else why not native here */
} lgemm;

#define MAX_LAYERS 64

/* What the check found beyond the recipe's own errors: the linear layers the recipe names, the
   [role] section each of their roles matches, and their GEMMs on the host and on the first GPU
   when there is one. */
typedef struct gemm_check {
  lgemm gemms[MAX_LAYERS * 3];
  char layers[MAX_LAYERS][64];
  int lines[MAX_LAYERS][3]; /* role_line of each tensor of each layer: 0 when unmatched */
  size_t nlayers, ng, gemm_err;
  char gpu_name[128];
  int gpu_arch;
  /* what the check itself failed to do (a context, a format's or a role's description, a layer's
     tensors): each makes the check incomplete, so the recipe is not reported valid */
  char fail[8][320];
  size_t nfail;
} gemm_check;

/* Record and print one failure of the check itself (see gemm_check.fail). */
static void check_failed(gemm_check *g, const char *file, const char *fmt, ...) HQ_PRINTF(3, 4);
static void check_failed(gemm_check *g, const char *file, const char *fmt, ...) {
  char msg[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: check incomplete: %s\n", file, msg);
  if (g->nfail < sizeof g->fail / sizeof g->fail[0])
    snprintf(g->fail[g->nfail], sizeof g->fail[0], "%s", msg);
  g->nfail++;
}

/* The layer names the recipe's linear sections name (a glob part is used as a literal name: it
   matches that section and the less specific ones, as a real layer would). */
static size_t linear_layers(const hq_recipe *r, const char *file, gemm_check *g,
                            char names[][64]) {
  size_t n = 0;
  for (size_t i = 0; i < hq_recipe_role_count(r) && n < MAX_LAYERS; i++) {
    hq_role_info ri = {.struct_size = sizeof ri};
    char buf[256];
    hq_role role;
    if (hq_recipe_role_info(r, i, &ri) || hq_role_parse(ri.pattern, buf, sizeof buf, &role)) {
      check_failed(g, file, "role section %zu: %s", i, hq_last_error());
      continue;
    }
    if (strcmp(role.module_type, "linear") != 0 && !strpbrk(role.module_type, "*?")) continue;
    int dup = 0;
    for (size_t k = 0; k < n; k++) dup |= !strcmp(names[k], role.name);
    if (!dup) snprintf(names[n++], 64, "%.63s", role.name);
  }
  return n;
}

static const char *const k_tensors[3] = {"input", "weight", "grad_output"};

/* The line of the [role] section that role linear:TENSOR:LAYER (tensor k_tensors[t]) matches,
   0 when it matches none. */
static int role_line(const hq_recipe *r, int t, const char *layer) {
  hq_role role = hq_role_of("linear", k_tensors[t], layer);
  long idx = hq_recipe_match(r, &role);
  hq_role_info ri = {.struct_size = sizeof ri};
  return idx >= 0 && !hq_recipe_role_info(r, (size_t)idx, &ri) ? ri.line : 0;
}

/* Quantizers and empty 256x256 qtensors (a shape every stock format accepts) of a layer's three
   roles on ctx. */
static int layer_tensors(hq_recipe *r, hq_ctx *ctx, const char *layer, hq_quantizer *q[3],
                         hq_qtensor *t[3]) {
  for (int i = 0; i < 3; i++) q[i] = NULL, t[i] = NULL;
  for (int i = 0; i < 3; i++) {
    hq_role role = hq_role_of("linear", k_tensors[i], layer);
    if (hq_quantizer_create(r, &role, &q[i]) || hq_make_empty(q[i], ctx, 256, 256, HQ_BF16, &t[i]))
      return 1;
  }
  return 0;
}

static void free_layer(hq_quantizer *q[3], hq_qtensor *t[3]) {
  for (int i = 0; i < 3; i++) {
    hq_qtensor_free(t[i]);
    hq_quantizer_free(q[i]);
  }
}

/* Fill out[0..2] (fprop, dgrad, wgrad) for one layer whose three roles match the [role]
   sections of line[] (role_line); returns the number of impossible GEMMs, or -1 (message in
   hq_last_error()) when the roles cannot even be built. */
static int layer_gemms(hq_recipe *r, hq_ctx *host, hq_ctx *gpu, const char *layer,
                       const int line[3], lgemm out[3], const char *file, gemm_check *gc) {
  /* operand (tensor index, transposed) of A and B for each GEMM: see hq_linear_* */
  static const int ops[3][4] = {{1, 1, 0, 0}, {1, 0, 2, 0}, {0, 0, 2, 1}};
  static const char *const names[3] = {"fprop", "dgrad", "wgrad"};
  hq_quantizer *q[3];
  hq_qtensor *t[3];
  int bad = 0;
  if (layer_tensors(r, host, layer, q, t)) {
    free_layer(q, t);
    return -1;
  }
  hq_quantizer *gq[3] = {NULL, NULL, NULL};
  hq_qtensor *gt[3] = {NULL, NULL, NULL};
  int have_gpu = gpu && !layer_tensors(r, gpu, layer, gq, gt);
  if (gpu && !have_gpu)
    check_failed(gc, file, "linear layer '%s' on GPU 0: %s", layer, hq_last_error());
  for (int g = 0; g < 3; g++) {
    lgemm *o = &out[g];
    memset(o, 0, sizeof *o);
    snprintf(o->layer, sizeof o->layer, "%.63s", layer);
    o->gemm = names[g];
    for (int s = 0; s < 2; s++) {
      int ti = ops[g][2 * s], tr = ops[g][2 * s + 1];
      uint32_t dir = s == 0 ? (tr ? HQ_ROWWISE : HQ_COLWISE) : (tr ? HQ_COLWISE : HQ_ROWWISE);
      o->tensor[s] = k_tensors[ti];
      o->dir[s] = dir;
      o->line[s] = line[ti];
      snprintf(o->format[s], 32, "%s", hq_quantizer_format(q[ti], dir));
      snprintf(o->plugin[s], 32, "%s", hq_quantizer_plugin(q[ti], dir));
    }
    hq_gemm_info info = {.struct_size = sizeof info};
    int rc = hq_gemm_plan(host, hq_operand_q(t[ops[g][0]]), ops[g][1], hq_operand_q(t[ops[g][2]]),
                          ops[g][3], NULL, NULL, &info);
    if (rc == HQ_ENOMEM) { /* the check failed, not the pair */
      check_failed(gc, file, "%s of linear layer '%s': %s", o->gemm, layer, hq_last_error());
      continue;
    }
    if (rc) {
      snprintf(o->why, sizeof o->why, "%s", hq_last_error());
      bad++;
      continue;
    }
    o->possible = 1;
    o->path_host = info.path;
    snprintf(o->why, sizeof o->why, "%s", info.reason);
    if (have_gpu) {
      hq_gemm_info gi = {.struct_size = sizeof gi};
      if (!hq_gemm_plan(gpu, hq_operand_q(gt[ops[g][0]]), ops[g][1], hq_operand_q(gt[ops[g][2]]),
                        ops[g][3], NULL, NULL, &gi)) {
        o->path_gpu = gi.path;
        if (gi.path != HQ_GEMM_PATH_NATIVE) snprintf(o->why, sizeof o->why, "%s", gi.reason);
      } else {
        check_failed(gc, file, "%s of linear layer '%s' on GPU 0: %s", o->gemm, layer,
                     hq_last_error());
      }
    }
  }
  free_layer(gq, gt);
  free_layer(q, t);
  return bad;
}


#define CMD "recipe check"

typedef struct recipe_args {
  int json;
  const char *file;
  cli_list dirs;
} recipe_args;

/* FILE: one recipe at a time. */
static int take_file(const char *cmd, const char *arg, void *user) {
  recipe_args *a = user;
  if (a->file) return cli_fail(2, cmd, "one recipe at a time ('%s' and '%s')", a->file, arg);
  a->file = arg;
  return 0;
}

static int parse_args(int argc, char **argv, recipe_args *a) {
  /* "recipe check ..." is parsed from "check" on; "recipe --help" from "recipe" */
  if (argc >= 2 && strcmp(argv[1], "check") == 0) {
    argc--;
    argv++;
  } else if (argc >= 2 && argv[1][0] != '-') {
    return cli_fail(2, "recipe", "'%s' is not a subcommand: the one is check (see `hq recipe "
                    "--help`)", argv[1]);
  } else if (argc < 2 || (strcmp(argv[1], "--help") != 0 && strcmp(argv[1], "-h") != 0)) {
    fputs(usage, stderr);
    return 2;
  }
  const cli_option opts[] = {
      {.name = "--json", .kind = CLI_FLAG, .dest = &a->json},
      CLI_PLUGIN_DIRS(&a->dirs),
  };
  const cli_command c = {CMD, usage, opts, CLI_NOPTS(opts), take_file, a};
  const int st = cli_parse(&c, argc, argv);
  if (st != CLI_RUN) return st;
  if (!a->file) return cli_fail(2, CMD, "no recipe file given (see --help)");
  static char path[CLI_PATH_MAX];
  a->file = cli_recipe_path(CMD, a->file, path);
  return CLI_RUN;
}

static void check_gemms(hq_recipe *r, const char *file, gemm_check *g) {
  hq_ctx *host = NULL, *gpu = NULL;
  if (hq_ctx_create(NULL, &host)) {
    check_failed(g, file, "host context: %s", hq_last_error());
    host = NULL;
  }
  if (hq_device_count() > 0) {
    hq_ctx_desc d = {sizeof d, 0, NULL, NULL, NULL, NULL, 0};
    if (hq_ctx_create(&d, &gpu)) {
      check_failed(g, file, "GPU 0's context: %s", hq_last_error());
      gpu = NULL;
    } else {
      hq_device_info(0, g->gpu_name, sizeof g->gpu_name, &g->gpu_arch);
    }
  }
  g->nlayers = linear_layers(r, file, g, g->layers);
  for (size_t l = 0; l < g->nlayers; l++)
    for (int t = 0; t < 3; t++) g->lines[l][t] = role_line(r, t, g->layers[l]);
  for (size_t l = 0; host && l < g->nlayers; l++) {
    int bad = layer_gemms(r, host, gpu, g->layers[l], g->lines[l], g->gemms + g->ng, file, g);
    if (bad < 0) {
      check_failed(g, file, "linear layer '%s': %s", g->layers[l], hq_last_error());
      continue;
    }
    for (int k = 0; k < 3; k++)
      if (!g->gemms[g->ng + k].possible) {
        const lgemm *o = &g->gemms[g->ng + k];
        int line = o->line[0] ? o->line[0] : o->line[1];
        fprintf(stderr, "%s:%d: %s of linear layer '%s' is impossible: %s\n", file, line,
                o->gemm, o->layer, o->why);
      }
    g->gemm_err += (size_t)bad;
    g->ng += 3;
  }
  hq_ctx_destroy(gpu);
  hq_ctx_destroy(host);
}

static void formats_json(json *j, const hq_recipe *r, const char *file, gemm_check *g) {
  json_key(j, "formats");
  json_arr(j);
  for (size_t i = 0; i < hq_recipe_format_count(r); i++) {
    hq_format_info fi = {.struct_size = sizeof fi};
    if (hq_recipe_format_info(r, i, &fi)) {
      check_failed(g, file, "format %zu: %s", i, hq_last_error());
      continue;
    }
    json_obj(j);
    json_kstr(j, "name", fi.name);
    if (fi.plugin) json_kstr(j, "plugin", fi.plugin);
    else {
      json_key(j, "plugin");
      json_null(j);
    }
    json_kint(j, "line", fi.line);
    const char *mf = module_file(r, fi.plugin);
    if (mf) json_kstr(j, "file", mf);
    json_key(j, "shadows");
    json_arr(j);
    for (size_t k = 0; shadowed_file(r, fi.plugin, k); k++)
      json_str(j, shadowed_file(r, fi.plugin, k));
    json_close_arr(j);
    json_key(j, "options");
    json_obj(j);
    for (size_t k = 0; k < fi.n_options; k++)
      json_kstr(j, fi.option_names[k], fi.option_values[k]);
    json_close_obj(j);
    json_close_obj(j);
  }
  json_close_arr(j);
}

static void roles_json(json *j, const hq_recipe *r, const char *file, gemm_check *g) {
  json_key(j, "roles");
  json_arr(j);
  for (size_t i = 0; i < hq_recipe_role_count(r); i++) {
    hq_role_info ri = {.struct_size = sizeof ri};
    if (hq_recipe_role_info(r, i, &ri)) {
      check_failed(g, file, "role section %zu: %s", i, hq_last_error());
      continue;
    }
    json_obj(j);
    json_kstr(j, "pattern", ri.pattern);
    json_kint(j, "line", ri.line);
    json_kstr(j, "rowwise", ri.rowwise);
    json_kstr(j, "columnwise", ri.columnwise);
    json_kstr(j, "columnwise_source", source_name(ri.columnwise_source));
    json_key(j, "shadowed_by");
    if (ri.shadowed_by >= 0) {
      hq_role_info sb = {.struct_size = sizeof sb};
      hq_recipe_role_info(r, (size_t)ri.shadowed_by, &sb);
      json_obj(j);
      json_kstr(j, "pattern", sb.pattern);
      json_kint(j, "line", sb.line);
      json_close_obj(j);
    } else {
      json_null(j);
    }
    json_close_obj(j);
  }
  json_close_arr(j);
}

/* The layers the resolved table lists: each linear layer the recipe names, then any other. */
static const char k_other[] = "(any other layer)";
static const char *table_layer(const gemm_check *g, size_t l) {
  return l < g->nlayers ? g->layers[l] : k_other;
}

/* The [role] section role linear:TENSOR:LAYER resolves to (ri filled), or -1 for none. */
static long resolved(const hq_recipe *r, int t, const char *layer, hq_role_info *ri) {
  const hq_role role = hq_role_of("linear", k_tensors[t], layer);
  const long idx = hq_recipe_match(r, &role);
  ri->struct_size = sizeof *ri;
  return idx >= 0 && !hq_recipe_role_info(r, (size_t)idx, ri) ? idx : -1;
}

/* The rows of the table: the named layers, and "any other" unless a layer "*" stands for it. */
static size_t table_rows(const gemm_check *g) {
  for (size_t l = 0; l < g->nlayers; l++)
    if (!strcmp(g->layers[l], "*")) return g->nlayers;
  return g->nlayers + 1;
}

static void layers_text(const hq_recipe *r, const gemm_check *g) {
  printf("\nresolved roles of each linear layer (tensor: rowwise / columnwise, from section):\n");
  for (size_t l = 0; l < table_rows(g); l++) {
    const char *layer = table_layer(g, l);
    printf("  layer %s\n", layer);
    for (int t = 0; t < 3; t++) {
      hq_role_info ri;
      char fmts[80];
      if (resolved(r, t, layer, &ri) < 0) {
        printf("    %-12s identity / identity  (no section matches)\n", k_tensors[t]);
        continue;
      }
      snprintf(fmts, sizeof fmts, "%s / %s", ri.rowwise, ri.columnwise);
      printf("    %-12s %-24s [role %s] line %d\n", k_tensors[t], fmts, ri.pattern, ri.line);
    }
  }
}

static void layers_json(json *j, const hq_recipe *r, const gemm_check *g) {
  json_key(j, "layers");
  json_arr(j);
  for (size_t l = 0; l < table_rows(g); l++) {
    const char *layer = table_layer(g, l);
    json_obj(j);
    json_kstr(j, "layer", layer);
    json_key(j, "roles");
    json_arr(j);
    for (int t = 0; t < 3; t++) {
      hq_role_info ri;
      const int found = resolved(r, t, layer, &ri) >= 0;
      json_obj(j);
      json_kstr(j, "tensor", k_tensors[t]);
      json_kstr(j, "rowwise", found ? ri.rowwise : "identity");
      json_kstr(j, "columnwise", found ? ri.columnwise : "identity");
      if (found) {
        json_kstr(j, "section", ri.pattern);
        json_kint(j, "line", ri.line);
      } else {
        json_key(j, "section");
        json_null(j);
      }
      json_close_obj(j);
    }
    json_close_arr(j);
    json_close_obj(j);
  }
  json_close_arr(j);
}

static void gemms_json(json *j, const gemm_check *g) {
  json_key(j, "gemms");
  json_arr(j);
  for (size_t k = 0; k < g->ng; k++) {
    const lgemm *o = &g->gemms[k];
    json_obj(j);
    json_kstr(j, "layer", o->layer);
    json_kstr(j, "gemm", o->gemm);
    for (int s = 0; s < 2; s++) {
      json_key(j, s ? "b" : "a");
      json_obj(j);
      json_kstr(j, "tensor", o->tensor[s]);
      json_kstr(j, "direction", hq_dir_name(o->dir[s]));
      json_kstr(j, "format", o->format[s]);
      json_kstr(j, "plugin", o->plugin[s]);
      json_kint(j, "line", o->line[s]);
      json_close_obj(j);
    }
    json_kbool(j, "possible", o->possible);
    json_kstr(j, "cpu_path", hq_gemm_path_name(o->path_host));
    if (o->path_gpu) json_kstr(j, "gpu_path", hq_gemm_path_name(o->path_gpu));
    if (g->gpu_arch) json_kint(j, "gpu_arch", g->gpu_arch);
    json_kstr(j, o->possible ? "reason" : "error", o->why);
    json_close_obj(j);
  }
  json_close_arr(j);
}

static void report_json(const hq_recipe *r, const char *file, gemm_check *g) {
  const size_t nerr = hq_recipe_error_count(r);
  json j;
  json_begin(&j, stdout);
  json_obj(&j);
  json_kstr(&j, "file", file);
  json_kstr(&j, "name", hq_recipe_name(r));
  formats_json(&j, r, file, g);
  roles_json(&j, r, file, g);
  if (!nerr) layers_json(&j, r, g);
  gemms_json(&j, g);
  json_key(&j, "errors");
  json_arr(&j);
  for (size_t i = 0; i < nerr; i++) json_str(&j, hq_recipe_error(r, i));
  for (size_t k = 0; k < g->ng; k++)
    if (!g->gemms[k].possible) json_str(&j, g->gemms[k].why);
  for (size_t k = 0; k < g->nfail && k < sizeof g->fail / sizeof g->fail[0]; k++)
    json_str(&j, g->fail[k]);
  json_close_arr(&j);
  /* last: the listings above may meet failures of the check itself */
  json_kbool(&j, "valid", nerr == 0 && g->gemm_err == 0 && g->nfail == 0);
  json_close_obj(&j);
  json_end(&j);
}

static void formats_text(const hq_recipe *r, const char *file, gemm_check *g) {
  if (hq_recipe_format_count(r)) printf("\nformats:\n");
  for (size_t i = 0; i < hq_recipe_format_count(r); i++) {
    hq_format_info fi = {.struct_size = sizeof fi};
    if (hq_recipe_format_info(r, i, &fi)) {
      check_failed(g, file, "format %zu: %s", i, hq_last_error());
      continue;
    }
    if (fi.line) printf("  %-12s plugin %s (line %d)\n", fi.name, fi.plugin ? fi.plugin : "?",
                        fi.line);
    else printf("  %-12s plugin %s (implicit: its defaults)\n", fi.name,
                fi.plugin ? fi.plugin : "?");
    const char *mf = module_file(r, fi.plugin);
    if (mf) printf("      module %s\n", mf);
    for (size_t k = 0; shadowed_file(r, fi.plugin, k); k++)
      fprintf(stderr, "hq recipe check: warning: format '%s' comes from %s, which shadows the "
              "module of the same name %s (earlier on the plugin search path wins)\n",
              fi.name, mf ? mf : "?", shadowed_file(r, fi.plugin, k));
    for (size_t k = 0; k < fi.n_options; k++)
      printf("      %s = %s\n", fi.option_names[k], fi.option_values[k]);
  }
}

static void roles_text(const hq_recipe *r, const char *file, gemm_check *g) {
  if (hq_recipe_role_count(r))
    printf("\nroles (most specific wins; unmatched roles: %s):\n",
           hq_recipe_unmatched(r) == HQ_UNMATCHED_ERROR  ? "an error"
           : hq_recipe_unmatched(r) == HQ_UNMATCHED_WARN ? "identity, with a warning"
                                                         : "identity");
  for (size_t i = 0; i < hq_recipe_role_count(r); i++) {
    hq_role_info ri = {.struct_size = sizeof ri};
    if (hq_recipe_role_info(r, i, &ri)) {
      check_failed(g, file, "role section %zu: %s", i, hq_last_error());
      continue;
    }
    printf("  [role %s] line %d\n      rowwise = %s, columnwise = %s%s%s\n", ri.pattern, ri.line,
           ri.rowwise, ri.columnwise,
           ri.columnwise_source ? ", columnwise_source = " : "",
           ri.columnwise_source ? source_name(ri.columnwise_source) : "");
    if (ri.shadowed_by >= 0) {
      hq_role_info sb = {.struct_size = sizeof sb};
      hq_recipe_role_info(r, (size_t)ri.shadowed_by, &sb);
      printf("      shadowed: [role %s] (line %d) wins for every role this section matches\n",
             sb.pattern, sb.line);
    }
  }
}

static void gemms_text(const gemm_check *g) {
  if (!g->ng) return;
  printf("\nGEMMs of each linear layer (A x B; path on the CPU%s%s%s):\n",
         g->gpu_arch ? ", on " : "", g->gpu_name, g->gpu_arch ? "" : "; on a GPU a pair of one "
         "module runs natively where the module's gemm supports the device, else emulated");
  for (size_t k = 0; k < g->ng; k++) {
    const lgemm *o = &g->gemms[k];
    if (k % 3 == 0) printf("  layer %s\n", o->layer);
    printf("    %-5s %s.%s %s (%s) x %s.%s %s (%s): ", o->gemm, o->tensor[0],
           o->dir[0] == HQ_ROWWISE ? "row" : "col", o->format[0], o->plugin[0], o->tensor[1],
           o->dir[1] == HQ_ROWWISE ? "row" : "col", o->format[1], o->plugin[1]);
    if (!o->possible) printf("IMPOSSIBLE\n");
    else if (o->path_gpu) printf("cpu, %s on sm_%d\n", hq_gemm_path_name(o->path_gpu), g->gpu_arch);
    else printf("cpu\n");
    if (o->why[0] && (o->path_gpu != HQ_GEMM_PATH_NATIVE || !o->possible))
      printf("          %s\n", o->why);
  }
}

/* Warn about the linear roles that match no [role] section while the recipe does not say what
   such roles get (hq_recipe_unmatched): each of the three tensors of every layer the recipe
   names (check_gemms matched them) and of a layer it does not name. */
static void warn_unmatched(const hq_recipe *r, const gemm_check *g) {
  if (hq_recipe_unmatched(r) != HQ_UNMATCHED_UNSET) return;
  for (size_t l = 0; l <= g->nlayers; l++)
    for (int t = 0; t < 3; t++) {
      const char *layer = table_layer(g, l);
      if ((l < g->nlayers ? g->lines[l][t] : role_line(r, t, layer)) == 0)
        fprintf(stderr,
                "hq recipe check: warning: role linear:%s:%s matches no [role] section: both "
                "directions stay in high precision (say `unmatched = identity` in [recipe] if "
                "that is meant)\n",
                k_tensors[t], layer);
    }
}

/* Warn about each shadowed [role] section: it never applies, which is almost always a mistake (a
   pattern written twice, its first section's settings silently dropped). */
static void warn_shadowed(const hq_recipe *r, const char *file) {
  for (size_t i = 0; i < hq_recipe_role_count(r); i++) {
    hq_role_info ri = {.struct_size = sizeof ri}, sb = {.struct_size = sizeof sb};
    if (hq_recipe_role_info(r, i, &ri) || ri.shadowed_by < 0 ||
        hq_recipe_role_info(r, (size_t)ri.shadowed_by, &sb))
      continue;
    const int same = !strcmp(ri.pattern, sb.pattern);
    fprintf(stderr,
            "hq recipe check: warning: %s:%d: [role %s] never applies: [role %s] at %s:%d wins "
            "every role it matches (%s); merge the two sections or delete one\n",
            file, ri.line, ri.pattern, sb.pattern, file, sb.line,
            same ? "the same pattern, written later" : "it is as or more specific");
  }
}

static void report_text(const hq_recipe *r, const char *file, gemm_check *g) {
  const size_t nerr = hq_recipe_error_count(r);
  printf("recipe %s%s%s%s\n", file, hq_recipe_name(r)[0] ? " (" : "", hq_recipe_name(r),
         hq_recipe_name(r)[0] ? ")" : "");
  formats_text(r, file, g);
  roles_text(r, file, g);
  if (!nerr) layers_text(r, g);
  gemms_text(g);
  if (nerr) {
    fprintf(stderr, "\n%zu error%s:\n", nerr, nerr == 1 ? "" : "s");
    for (size_t i = 0; i < nerr; i++) fprintf(stderr, "%s\n", hq_recipe_error(r, i));
  } else if (g->gemm_err) {
    fprintf(stderr, "\n%zu impossible GEMM%s (see above)\n", g->gemm_err,
            g->gemm_err == 1 ? "" : "s");
  } else if (g->nfail) {
    fprintf(stderr, "\nthe check is incomplete: %zu failure%s (see above)\n", g->nfail,
            g->nfail == 1 ? "" : "s");
  } else {
    printf("\nvalid\n");
  }
}

int hq_cmd_recipe(int argc, char **argv) {
  recipe_args a = {0};
  const int st = parse_args(argc, argv, &a);
  if (st != CLI_RUN) return st;
  const hq_recipe_opts o = cli_recipe_opts(&a.dirs);
  hq_recipe *r = NULL;
  if (hq_recipe_parse(a.file, &o, &r)) return cli_fail(1, CMD, "%s", hq_last_error());
  /* large (a few hundred KiB): static, the command runs once per process */
  static gemm_check g;
  memset(&g, 0, sizeof g);
  if (!hq_recipe_error_count(r)) check_gemms(r, a.file, &g);
  if (a.json) report_json(r, a.file, &g);
  else report_text(r, a.file, &g);
  if (!hq_recipe_error_count(r)) {
    warn_unmatched(r, &g);
    warn_shadowed(r, a.file);
    cli_warn_role_traps(r, CMD, a.file);
  }
  const int invalid = hq_recipe_error_count(r) || g.gemm_err || g.nfail;
  hq_recipe_free(r);
  return invalid ? 1 : 0;
}
