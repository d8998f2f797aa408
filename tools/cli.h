/*
** cli.h -- what every `hq` command shares: option parsing helpers and error reporting.
** tools/cli.c depends on libhqcore's public header only; the commands call it, never the reverse.
*/
#ifndef HQ_CLI_H
#define HQ_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "hq/hq.h"

/* Print "hq <cmd>: message" to stderr; returns `status`. */
int cli_fail(int status, const char *cmd, const char *fmt, ...) HQ_PRINTF(3, 4);

/* "--name=value" or "--name value": if argv[*i] is option `name`, store its value in *val and
   return 1 (advancing *i past a separate value); return -1 when the value is missing. */
int cli_opt(int argc, char **argv, int *i, const char *name, const char **val);
/* Parse "RxC" into rows and cols (both > 0). */
int cli_shape(const char *s, int64_t *rows, int64_t *cols);
/* Parse "cpu", "cuda" or "cuda:N" into a device ordinal (HQ_DEVICE_HOST for cpu). */
int cli_device(const char *s, int *device);
int cli_u64(const char *s, uint64_t *out);

/* Extra plugin directories from repeated --plugin-dir options. */
#define CLI_MAX_DIRS 32
typedef struct cli_dirs {
  const char *v[CLI_MAX_DIRS];
  size_t n;
} cli_dirs;
/* If argv[*i] is --plugin-dir, record its value: 1 consumed, 0 not this option, -1 error
   (printed, naming `cmd`). */
int cli_plugin_dir(int argc, char **argv, int *i, cli_dirs *dirs, const char *cmd);

#endif
