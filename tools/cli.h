/*
** cli.h -- shared pieces of the hq command: subcommand entry points, a streaming JSON writer,
** option parsing helpers and error reporting.
*/
#ifndef HQ_CLI_H
#define HQ_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "hq/hq.h"

/* Subcommands: argc/argv start at the subcommand's own name. Return the process exit status:
   0 success, 1 failure (the error is printed), 2 usage error. */
int hq_cmd_info(int argc, char **argv);
int hq_cmd_recipe(int argc, char **argv);
int hq_cmd_quantize(int argc, char **argv);
int hq_cmd_bench(int argc, char **argv);
int hq_cmd_train(int argc, char **argv);
/* hq bench --gemm (tools/bench_gemm.c): argv as hq_cmd_bench's. */
int hq_bench_gemm(int argc, char **argv);

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

// --- a minimal streaming JSON writer ----------------------------------------------------------
typedef struct json {
  FILE *f;
  int depth;
  int first[32];   /* no element written yet at this depth */
  int after_key;
} json;

void json_begin(json *j, FILE *f);
void json_end(json *j);                              /* final newline */
void json_obj(json *j);                              /* { */
void json_arr(json *j);                              /* [ */
void json_close_obj(json *j);                        /* } */
void json_close_arr(json *j);                        /* ] */
void json_key(json *j, const char *k);
void json_str(json *j, const char *s);
void json_int(json *j, int64_t v);
void json_num(json *j, double v);                    /* non-finite -> null */
void json_bool(json *j, int v);
void json_null(json *j);
/* key + value shortcuts */
void json_kstr(json *j, const char *k, const char *s);
void json_kint(json *j, const char *k, int64_t v);
void json_knum(json *j, const char *k, double v);
void json_kbool(json *j, const char *k, int v);

// --- a quantized tensor's buffers (tools/buffers.c; hq quantize, hq info) ----------------------
/* Whether buffer b of direction dir is the rowwise storage's own memory (shared, not a copy). */
int cli_buffer_shared(const hq_qtensor *qt, uint32_t dir, const hq_buffer *b);
/* "buffers": [{name, dtype, shape, bytes, shared_with_rowwise}, ...] of direction dir. */
void cli_buffers_json(json *j, const hq_qtensor *qt, uint32_t dir);
/* One line per buffer of direction dir on stdout, after `indent` spaces: name, dtype, shape,
   bytes, "(the rowwise buffer)" when shared. */
void cli_buffers_text(const hq_qtensor *qt, uint32_t dir, int indent);

#endif
