/*
** cli.c -- what every `hq` command shares: option parsing helpers and error reporting
** (tools/cli.h).
*/
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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
