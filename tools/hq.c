/*
** hq.c -- the `hq` command: git-style subcommands over libhqcore.
**   hq info | hq recipe check | hq quantize | hq bench | hq train   (each takes --help)
*/
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char usage[] =
    "usage: hq <command> [options]\n"
    "\n"
    "commands:\n"
    "  info           version, plugin ABI, plugin search path, every format and its options,\n"
    "                 devices (--json)\n"
    "  recipe check   validate a recipe: formats, roles per direction, shadowed sections,\n"
    "                 errors with file:line (--json); exit 0 only when it is valid\n"
    "  quantize       quantize a tensor for a recipe role and report, per direction, the\n"
    "                 format, bytes and error (--json)\n"
    "  bench          quantize throughput of each format on the CPU or a CUDA device\n"
    "  train          train a small character-level language model with one or more recipes\n"
    "                 and compare their losses (the main job)\n"
    "\n"
    "`hq <command> --help` describes a command. Formats are found on $HQ_PLUGIN_PATH\n"
    "(colon-separated), then in the directories given with --plugin-dir DIR (every command\n"
    "takes it, repeatable) and a recipe's [recipe] plugin_dirs, then in the installed plugin\n"
    "directory. The identity format is built in.\n";

int cli_fail(int status, const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "hq %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return status;
}

int cli_opt(int argc, char **argv, int *i, const char *name, const char **val) {
  size_t n = strlen(name);
  const char *a = argv[*i];
  if (strncmp(a, name, n) != 0) return 0;
  if (a[n] == '=') {
    *val = a + n + 1;
    return 1;
  }
  if (a[n] != '\0') return 0;
  if (*i + 1 >= argc) return -1;
  *val = argv[++*i];
  return 1;
}

int cli_u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (!*s || *end || errno || *s == '-') return -1;
  *out = v;
  return 0;
}

int cli_plugin_dir(int argc, char **argv, int *i, cli_dirs *dirs, const char *cmd) {
  const char *v;
  int r = cli_opt(argc, argv, i, "--plugin-dir", &v);
  if (r == 0) return 0;
  if (r < 0) return cli_fail(-1, cmd, "--plugin-dir needs a directory");
  if (dirs->n == CLI_MAX_DIRS) return cli_fail(-1, cmd, "too many --plugin-dir options");
  dirs->v[dirs->n++] = v;
  return 1;
}

int cli_shape(const char *s, int64_t *rows, int64_t *cols) {
  char *end;
  errno = 0;
  long long r = strtoll(s, &end, 10);
  if (end == s || (*end != 'x' && *end != 'X') || errno || r <= 0) return -1;
  const char *c = end + 1;
  long long k = strtoll(c, &end, 10);
  if (end == c || *end || errno || k <= 0) return -1;
  if (r > (1ll << 40) / k) return -1;
  *rows = r;
  *cols = k;
  return 0;
}

int cli_device(const char *s, int *device) {
  if (strcmp(s, "cpu") == 0) {
    *device = HQ_DEVICE_HOST;
    return 0;
  }
  if (strcmp(s, "cuda") == 0 || strcmp(s, "gpu") == 0) {
    *device = 0;
    return 0;
  }
  if (strncmp(s, "cuda:", 5) == 0) {
    uint64_t v;
    if (cli_u64(s + 5, &v) || v > 1024) return -1;
    *device = (int)v;
    return 0;
  }
  return -1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    if (argc > 2 && strcmp(cmd, "help") == 0) {
      char *sub[] = {argv[2], (char *)"--help", NULL};
      if (!strcmp(argv[2], "info")) return hq_cmd_info(2, sub);
      if (!strcmp(argv[2], "recipe")) return hq_cmd_recipe(2, sub);
      if (!strcmp(argv[2], "quantize")) return hq_cmd_quantize(2, sub);
      if (!strcmp(argv[2], "bench")) return hq_cmd_bench(2, sub);
      if (!strcmp(argv[2], "train")) return hq_cmd_train(2, sub);
    }
    fputs(usage, stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    printf("hq %s (plugin ABI %d.%d%s)\n", hq_version(), HQ_ABI_MAJOR, HQ_ABI_MINOR,
           hq_built_with_cuda() ? ", CUDA" : "");
    return 0;
  }
  if (!strcmp(cmd, "info")) return hq_cmd_info(argc - 1, argv + 1);
  if (!strcmp(cmd, "recipe")) return hq_cmd_recipe(argc - 1, argv + 1);
  if (!strcmp(cmd, "quantize")) return hq_cmd_quantize(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench")) return hq_cmd_bench(argc - 1, argv + 1);
  if (!strcmp(cmd, "train")) return hq_cmd_train(argc - 1, argv + 1);
  fprintf(stderr, "hq: '%s' is not a command (see `hq --help`)\n", cmd);
  return 2;
}
