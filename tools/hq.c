/*
** hq.c -- the `hq` command: git-style subcommands over libhqcore.
**   hq info | hq recipe check | hq quantize | hq bench | hq train   (each takes --help)
** It only dispatches: the commands live in tools/cmd_*.c, what they share in tools/cli.c.
*/
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "hq/hq.h"

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

/* The subcommands, in the order `hq --help` lists them. */
static const struct {
  const char *name;
  int (*run)(int argc, char **argv);
} commands[] = {
    {"info", hq_cmd_info},   {"recipe", hq_cmd_recipe}, {"quantize", hq_cmd_quantize},
    {"bench", hq_cmd_bench}, {"train", hq_cmd_train},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    if (argc > 2 && strcmp(cmd, "help") == 0) {
      char *sub[] = {argv[2], (char *)"--help", NULL};
      for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[2], commands[i].name)) return commands[i].run(2, sub);
    }
    fputs(usage, stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    printf("hq %s (plugin ABI %d.%d%s)\n", hq_version(), HQ_ABI_MAJOR, HQ_ABI_MINOR,
           hq_built_with_cuda() ? ", CUDA" : "");
    return 0;
  }
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (!strcmp(cmd, commands[i].name)) return commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "hq: '%s' is not a command (see `hq --help`)\n", cmd);
  return 2;
}
