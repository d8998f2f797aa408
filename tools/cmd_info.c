/*
** cmd_info.c -- `hq info`: version, ABI, plugin search path, formats with their options,
** rejected modules, devices.
*/
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static const char usage[] =
    "usage: hq info [--json] [--plugin-dir DIR]...\n"
    "\n"
    "Print the version, the plugin ABI, the plugin search path, every format found with its\n"
    "options (type, default, help), the modules that were rejected and why, and the CUDA\n"
    "devices. --plugin-dir adds a directory to search (after $HQ_PLUGIN_PATH).\n";

static void caps_text(uint64_t caps, char *buf, size_t len) {
  buf[0] = '\0';
  const struct { uint64_t bit; const char *name; } names[] = {
      {HQ_CAP_CPU, "cpu"}, {HQ_CAP_CUDA, "cuda"}, {HQ_CAP_REQUANT_SAFE, "requant-safe"},
      {HQ_CAP_COLWISE_ONLY, "colwise-only"}};
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

int hq_cmd_info(int argc, char **argv) {
  int as_json = 0;
  cli_dirs dirs = {{NULL}, 0};
  for (int i = 1; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (!strcmp(argv[i], "--json")) {
      as_json = 1;
    } else if ((r = cli_plugin_dir(argc, argv, &i, &dirs, "info")) != 0) {
      if (r < 0) return 2;
    } else {
      return cli_fail(2, "info", "unknown argument '%s' (see `hq info --help`)", argv[i]);
    }
  }
  hq_plugins *set = NULL;
  if (hq_plugins_open(dirs.v, dirs.n, 0, &set)) return cli_fail(1, "info", "%s", hq_last_error());
  int ndev = hq_device_count();
  if (as_json) {
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
    json_key(&j, "plugin_path");
    json_arr(&j);
    for (size_t i = 0; i < hq_plugins_dir_count(set); i++) json_str(&j, hq_plugins_dir(set, i));
    json_close_arr(&j);
    json_key(&j, "plugins");
    json_arr(&j);
    for (size_t i = 0; i < hq_plugins_count(set); i++) {
      const hq_plugin *p = hq_plugins_get(set, i);
      char caps[128];
      caps_text(hq_plugin_caps(p), caps, sizeof caps);
      json_obj(&j);
      json_kstr(&j, "name", hq_plugin_name(p));
      json_kstr(&j, "version", hq_plugin_version(p));
      json_kstr(&j, "description", hq_plugin_description(p));
      json_kstr(&j, "file", hq_plugin_file(p));
      json_kstr(&j, "caps", caps);
      json_key(&j, "options");
      json_arr(&j);
      for (const hq_option *o = hq_plugin_options(p); o->name; o++) option_json(&j, o);
      json_close_arr(&j);
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
    for (int d = 0; d < ndev; d++) {
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
  } else {
    printf("hq %s, plugin ABI %d.%d, CUDA %s\n", hq_version(), HQ_ABI_MAJOR, HQ_ABI_MINOR,
           hq_built_with_cuda() ? "built in" : "not built");
    printf("\nplugin search path:\n");
    for (size_t i = 0; i < hq_plugins_dir_count(set); i++) {
      struct stat st;
      const char *d = hq_plugins_dir(set, i);
      printf("  %s%s\n", d, stat(d, &st) == 0 ? "" : "  (missing)");
    }
    printf("\nformats:\n");
    for (size_t i = 0; i < hq_plugins_count(set); i++) {
      const hq_plugin *p = hq_plugins_get(set, i);
      char caps[128];
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
    }
    if (hq_plugins_count(set) == 0) printf("  (none found)\n");
    if (hq_plugins_rejected_count(set)) {
      printf("\nrejected modules:\n");
      for (size_t i = 0; i < hq_plugins_rejected_count(set); i++)
        printf("  %s: %s\n", hq_plugins_rejected_file(set, i), hq_plugins_rejected_reason(set, i));
    }
    printf("\ndevices:\n  cpu\n");
    for (int d = 0; d < ndev; d++) {
      char name[256] = "";
      int arch = 0;
      hq_device_info(d, name, sizeof name, &arch);
      printf("  cuda:%d  %s (sm_%d)\n", d, name, arch);
    }
  }
  hq_plugins_close(set);
  return 0;
}
