/*
** cli.h -- what every `hq` command shares: one table-driven option parser, the parsers of the
** values several commands take (shape, device, dtype, integers) and error reporting.
** tools/cli.c depends on libhqcore's public header only; the commands call it, never the reverse.
*/
#ifndef HQ_CLI_H
#define HQ_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "hq/hq.h"

/* Print "hq <cmd>: message" to stderr; returns `status`. */
int cli_fail(int status, const char *cmd, const char *fmt, ...) HQ_PRINTF(3, 4);
/* The message of the last cli_fail (without the "hq CMD: "), for a report that goes on. */
const char *cli_last_failure(void);

// --- values --------------------------------------------------------------------------------------
/* An unsigned integer in decimal digits only ("010" is ten; no sign, blank or 0x), at most
   UINT64_MAX; -1 when it is not one. */
int cli_u64(const char *s, uint64_t *out);

/* A command's option `opt`: "RxC" (both > 0, R * C at most 2^40), "cpu", "cuda" (or "gpu") or
   "cuda:N" (a device ordinal, HQ_DEVICE_HOST for cpu), a dtype: 0, or 2 (a usage error) after
   the message "hq <cmd>: <opt> 'S' is not ...". */
int cli_shape_arg(const char *cmd, const char *opt, const char *s, int64_t *rows, int64_t *cols);
int cli_device_arg(const char *cmd, const char *s, int *device);      /* --device */
int cli_dtype_arg(const char *cmd, const char *s, hq_dtype *dtype);   /* --dtype: f32, bf16, f16 */

// --- options -------------------------------------------------------------------------------------
/* The values of a repeatable option, in the order given. */
#define CLI_LIST_MAX 64
typedef struct cli_list {
  const char *v[CLI_LIST_MAX];
  size_t n;
} cli_list;

typedef enum cli_kind {
  CLI_FLAG, /* takes no value: *(int *)dest = 1 */
  CLI_STR,  /* *(const char **)dest = the value */
  CLI_LIST, /* repeatable: the value is appended to *(cli_list *)dest, at most `max` of them */
  CLI_INT,  /* *(int64_t *)dest = the value, an integer (cli_u64) in [min, max], 0 <= min */
  CLI_CALL  /* call(cmd, option, value): 0, or an exit status after its message */
} cli_kind;

/* One option of a command. Every option but a CLI_LIST one may be given again: the later
   value replaces the earlier, so that a script can append overrides to a list of defaults
   (tests/test_gpu_train.sh passes `--steps 60 ... --steps 1`). */
typedef struct cli_option {
  const char *name; /* "--shape"; given as "--shape VALUE" or "--shape=VALUE" */
  cli_kind kind;
  void *dest;
  int64_t min, max; /* CLI_INT: the accepted range; CLI_LIST: max = the most values */
  int (*call)(const char *cmd, const struct cli_option *o, const char *value); /* CLI_CALL */
} cli_option;

/* --plugin-dir DIR, which every command takes: at most this many */
#define CLI_MAX_DIRS 32
/* Its row of a command's option table: the directories appended to the cli_list *dirs. */
#define CLI_PLUGIN_DIRS(dirs) \
  {.name = "--plugin-dir", .kind = CLI_LIST, .dest = (dirs), .max = CLI_MAX_DIRS}
/* Recipe options that search the --plugin-dir directories `dirs` before a recipe's own
   plugin_dirs (they point into dirs). */
hq_recipe_opts cli_recipe_opts(const cli_list *dirs);

/* The directory of the shipped recipes (recipe.ini, examples/): $HQ_CONF_DIR when set, else
   $(datadir)/hq (compiled in as HQ_RECIPEDIR, or found beside the installed plugin directory
   $(libdir)/hq/formats: the prefix before its lib* component, then share/hq): a new string,
   NULL when out of memory. */
char *cli_recipe_dir(void);

/* The file a recipe argument names (hq train --recipe, hq recipe check, hq quantize and hq bench
   --recipe): the argument itself where that path exists, is absolute or starts with ./ or ../;
   else the shipped recipe of that name, cli_recipe_dir()/ARG, written into buf (CLI_PATH_MAX
   bytes), where one exists -- said on stderr ("hq CMD: recipe ARG: the shipped one, PATH") --,
   so that `recipe.ini` or `examples/mxfp8.ini` names an installed recipe from any directory;
   else the argument (whose open then reports it missing). */
#define CLI_PATH_MAX 4096
const char *cli_recipe_path(const char *cmd, const char *arg, char *buf);

/* Warn (on stderr, "hq CMD: warning: FILE:LINE: ...") about each [role] section with a literal
   layer name and a wildcard tensor type that loses, for the roles of that name and some tensor
   type, to a section with a wildcard name and that literal tensor type -- [role linear:*:lm_head]
   beside [role linear:grad_output:*] leaves lm_head's grad_output to the second -- where the two
   give different formats: the precedence is documented, but a name usually means "this layer
   whatever its tensors". Returns the number of warnings. */
size_t cli_warn_role_traps(const hq_recipe *r, const char *cmd, const char *file);

typedef struct cli_command {
  const char *name;  /* in messages, "hq <name>: ...": "info", "recipe check", "bench --gemm" */
  const char *usage; /* what --help prints: it names every option of opts */
  const cli_option *opts;
  size_t nopts;
  /* an argument that is not an option (a FILE): 0, or an exit status after its message;
     NULL: the command takes none */
  int (*operand)(const char *cmd, const char *arg, void *user);
  void *user;
} cli_command;

/* cli_parse's answer when the command should go on and run. */
#define CLI_RUN (-1)

/* Parse argv[1..argc-1] (argv[0] names the command) against c->opts, in order: --help or -h
   prints the help (c->usage) on stdout, reports on stderr an option of c->opts that the help
   does not name, and returns 0; an unknown option, a missing value, a value given to
   a flag, too many values of a repeatable option or a bad value prints its message and returns
   2; else CLI_RUN. */
int cli_parse(const cli_command *c, int argc, char **argv);

#define CLI_NOPTS(a) (sizeof(a) / sizeof((a)[0]))

// --- output files --------------------------------------------------------------------------------
/* The rule for a file a command writes, given to option `opt`: the path is shorter than PATH_MAX
   (never cut), and libhqtrain's hq_output_target -- the rule of every file hq writes, its
   checkpoints' too -- says which file is written (into *target as a new string when target is
   not NULL) or why none may be. A path that cannot be looked up (a missing directory) passes,
   for the create to say why. 0, or 1 after the message "hq CMD: OPT PATH: ...". */
int cli_output_path(const char *cmd, const char *opt, const char *path, char **target);

/* A file written whole or not at all: written to a temporary file beside the target
   ("<target>.tmp.<pid>.<n>", created exclusively), renamed over it on success and removed on
   any failure, so that the path holds the old file or the new one, never part of one. */
typedef struct cli_out {
  const char *cmd, *opt, *path; /* for messages: the command, its option, the path given */
  char *target;                 /* the file written (cli_output_path) */
  char *tmp;                    /* the temporary file */
  FILE *f;                      /* open on tmp for writing (NULL once closed) */
} cli_out;
/* Check path (cli_output_path) and create the temporary file: 0, or 1 after the message. */
int cli_out_open(const char *cmd, const char *opt, const char *path, cli_out *o);
/* Close the temporary file (when still open), check every write and rename it over the target:
   0, or 1 after the message with the temporary file removed. `ok` 0: a write already failed
   (errno says why). o is freed in both cases. */
int cli_out_commit(cli_out *o, int ok);
/* Remove the temporary file and free o (nothing written at the path). */
void cli_out_abort(cli_out *o);

#endif
