/*
** cmd_recipe.c -- `hq recipe check FILE`: every section resolved, the formats per direction,
** shadowed sections, and the errors with file:line. Exit 0 only for a valid recipe.
*/
#include <string.h>

#include "cli.h"

static const char usage[] =
    "usage: hq recipe check FILE [--json] [--plugin-dir DIR]...\n"
    "\n"
    "Parse and resolve a recipe: list its format instances (plugin and every option value),\n"
    "each [role] section with the format of each direction and the columnwise source, the\n"
    "sections another section shadows, and every error as FILE:LINE: message.\n"
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

int hq_cmd_recipe(int argc, char **argv) {
  int as_json = 0;
  const char *file = NULL;
  cli_dirs dirs = {{NULL}, 0};
  if (argc < 2 || (strcmp(argv[1], "check") != 0 && strcmp(argv[1], "--help") != 0 &&
                   strcmp(argv[1], "-h") != 0)) {
    fputs(usage, stderr);
    return 2;
  }
  for (int i = 1; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (i == 1) {
      continue; /* "check" */
    } else if (!strcmp(argv[i], "--json")) {
      as_json = 1;
    } else if ((r = cli_plugin_dir(argc, argv, &i, &dirs, "recipe check")) != 0) {
      if (r < 0) return 2;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_fail(2, "recipe check", "unknown option '%s'", argv[i]);
    } else if (!file) {
      file = argv[i];
    } else {
      return cli_fail(2, "recipe check", "one recipe at a time ('%s' and '%s')", file, argv[i]);
    }
  }
  if (!file) return cli_fail(2, "recipe check", "no recipe file given (see --help)");
  hq_recipe_opts o = {sizeof o, 0, dirs.v, dirs.n};
  hq_recipe *r = NULL;
  if (hq_recipe_parse(file, &o, &r)) return cli_fail(1, "recipe check", "%s", hq_last_error());
  size_t nerr = hq_recipe_error_count(r);
  if (as_json) {
    json j;
    json_begin(&j, stdout);
    json_obj(&j);
    json_kstr(&j, "file", file);
    json_kstr(&j, "name", hq_recipe_name(r));
    json_kbool(&j, "valid", nerr == 0);
    json_key(&j, "formats");
    json_arr(&j);
    for (size_t i = 0; i < hq_recipe_format_count(r); i++) {
      hq_format_info fi;
      if (hq_recipe_format_info(r, i, &fi)) continue;
      json_obj(&j);
      json_kstr(&j, "name", fi.name);
      if (fi.plugin) json_kstr(&j, "plugin", fi.plugin);
      else {
        json_key(&j, "plugin");
        json_null(&j);
      }
      json_kint(&j, "line", fi.line);
      const char *mf = module_file(r, fi.plugin);
      if (mf) json_kstr(&j, "file", mf);
      json_key(&j, "shadows");
      json_arr(&j);
      for (size_t k = 0; shadowed_file(r, fi.plugin, k); k++)
        json_str(&j, shadowed_file(r, fi.plugin, k));
      json_close_arr(&j);
      json_key(&j, "options");
      json_obj(&j);
      for (size_t k = 0; k < fi.n_options; k++)
        json_kstr(&j, fi.option_names[k], fi.option_values[k]);
      json_close_obj(&j);
      json_close_obj(&j);
    }
    json_close_arr(&j);
    json_key(&j, "roles");
    json_arr(&j);
    for (size_t i = 0; i < hq_recipe_role_count(r); i++) {
      hq_role_info ri;
      if (hq_recipe_role_info(r, i, &ri)) continue;
      json_obj(&j);
      json_kstr(&j, "pattern", ri.pattern);
      json_kint(&j, "line", ri.line);
      json_kstr(&j, "rowwise", ri.rowwise);
      json_kstr(&j, "columnwise", ri.columnwise);
      json_kstr(&j, "columnwise_source", source_name(ri.columnwise_source));
      json_key(&j, "shadowed_by");
      if (ri.shadowed_by >= 0) {
        hq_role_info sb;
        hq_recipe_role_info(r, (size_t)ri.shadowed_by, &sb);
        json_obj(&j);
        json_kstr(&j, "pattern", sb.pattern);
        json_kint(&j, "line", sb.line);
        json_close_obj(&j);
      } else {
        json_null(&j);
      }
      json_close_obj(&j);
    }
    json_close_arr(&j);
    json_key(&j, "errors");
    json_arr(&j);
    for (size_t i = 0; i < nerr; i++) json_str(&j, hq_recipe_error(r, i));
    json_close_arr(&j);
    json_close_obj(&j);
    json_end(&j);
  } else {
    printf("recipe %s%s%s%s\n", file, hq_recipe_name(r)[0] ? " (" : "", hq_recipe_name(r),
           hq_recipe_name(r)[0] ? ")" : "");
    if (hq_recipe_format_count(r)) printf("\nformats:\n");
    for (size_t i = 0; i < hq_recipe_format_count(r); i++) {
      hq_format_info fi;
      if (hq_recipe_format_info(r, i, &fi)) continue;
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
    if (hq_recipe_role_count(r))
      printf("\nroles (most specific wins; unmatched roles: identity):\n");
    for (size_t i = 0; i < hq_recipe_role_count(r); i++) {
      hq_role_info ri;
      if (hq_recipe_role_info(r, i, &ri)) continue;
      printf("  [role %s] line %d\n      rowwise = %s, columnwise = %s%s%s\n", ri.pattern, ri.line,
             ri.rowwise, ri.columnwise,
             ri.columnwise_source ? ", columnwise_source = " : "",
             ri.columnwise_source ? source_name(ri.columnwise_source) : "");
      if (ri.shadowed_by >= 0) {
        hq_role_info sb;
        hq_recipe_role_info(r, (size_t)ri.shadowed_by, &sb);
        printf("      shadowed: [role %s] (line %d) wins for every role this section matches\n",
               sb.pattern, sb.line);
      }
    }
    if (nerr) {
      fprintf(stderr, "\n%zu error%s:\n", nerr, nerr == 1 ? "" : "s");
      for (size_t i = 0; i < nerr; i++) fprintf(stderr, "%s\n", hq_recipe_error(r, i));
    } else {
      printf("\nvalid\n");
    }
  }
  hq_recipe_free(r);
  return nerr ? 1 : 0;
}
