/*
** cli.c -- the option parser and value parsers every `hq` command uses (tools/cli.h).
*/
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "hq/train.h"

// --- recipes ------------------------------------------------------------------------------------

char *cli_recipe_dir(void) {
  const char *conf = getenv("HQ_CONF_DIR");
  if (conf && *conf) return strdup(conf);
#ifdef HQ_RECIPEDIR
  return strdup(HQ_RECIPEDIR);
#else
  char *dir = strdup(hq_plugins_default_dir());
  if (!dir) return NULL;
  char *cut = NULL;
  for (char *p = strstr(dir, "/lib"); p; p = strstr(p + 1, "/lib")) cut = p;
  if (cut) *cut = '\0';
  const char *prefix = cut ? dir : "/usr/local";
  const size_t n = strlen(prefix) + sizeof "/share/hq";
  char *out = malloc(n);
  if (out) snprintf(out, n, "%s/share/hq", prefix);
  free(dir);
  return out;
#endif
}

const char *cli_recipe_path(const char *cmd, const char *arg, char *buf) {
  struct stat st;
  if (stat(arg, &st) == 0 || arg[0] == '/' || !strncmp(arg, "./", 2) || !strncmp(arg, "../", 3))
    return arg;
  char *dir = cli_recipe_dir();
  const int n = dir ? snprintf(buf, CLI_PATH_MAX, "%s/%s", dir, arg) : -1;
  free(dir);
  if (n < 0 || n >= CLI_PATH_MAX || stat(buf, &st) != 0) return arg;
  fprintf(stderr, "hq %s: recipe %s: the shipped one, %s\n", cmd, arg, buf);
  return buf;
}

static int has_glob(const char *s) { return strpbrk(s, "*?[") != NULL; }

/* A section's pattern split into its parts, with the counts the precedence compares (fewer '*',
   then more literal characters, then fewer '?': docs/recipes.md section 4.1). */
typedef struct section {
  hq_role_info ri;
  char buf[256];
  hq_role role;
  int stars, literals, qmarks;
} section;

static int section_get(const hq_recipe *r, size_t i, section *s) {
  memset(s, 0, sizeof *s);
  s->ri.struct_size = sizeof s->ri;
  if (hq_recipe_role_info(r, i, &s->ri) ||
      hq_role_parse(s->ri.pattern, s->buf, sizeof s->buf, &s->role))
    return -1;
  for (const char *p = s->ri.pattern; *p; p++) {
    if (*p == ':') continue;
    s->stars += *p == '*';
    s->qmarks += *p == '?';
    s->literals += *p != '*' && *p != '?';
  }
  return 0;
}

/* The one literal part of two (the first one's when both are wildcards), or NULL when two
   literals differ or a wildcard does not match the other's literal. */
static const char *meet(const char *a, const char *b) {
  if (!has_glob(a)) return !has_glob(b) ? (strcmp(a, b) ? NULL : a) : fnmatch(b, a, 0) ? NULL : a;
  if (!has_glob(b)) return fnmatch(a, b, 0) ? NULL : b;
  return a;
}

size_t cli_warn_role_traps(const hq_recipe *r, const char *cmd, const char *file) {
  size_t n = 0;
  const size_t count = hq_recipe_role_count(r);
  for (size_t i = 0; i < count; i++) {
    section a, b;
    if (section_get(r, i, &a) || has_glob(a.role.name) || !has_glob(a.role.tensor_type)) continue;
    for (size_t j = 0; j < count; j++) {
      if (j == i || section_get(r, j, &b) || !has_glob(b.role.name) ||
          has_glob(b.role.tensor_type))
        continue;
      const char *m = meet(a.role.module_type, b.role.module_type);
      const char *t = meet(a.role.tensor_type, b.role.tensor_type);
      const char *nm = meet(a.role.name, b.role.name);
      if (!m || !t || !nm) continue;
      const hq_role role = hq_role_of(m, t, nm);
      if (hq_recipe_match(r, &role) != (long)j) continue;
      if (!strcmp(a.ri.rowwise, b.ri.rowwise) && !strcmp(a.ri.columnwise, b.ri.columnwise) &&
          a.ri.columnwise_source == b.ri.columnwise_source)
        continue;
      const char *why = b.stars != a.stars         ? "fewer *"
                        : b.literals != a.literals ? "more literal characters"
                        : b.qmarks != a.qmarks     ? "fewer ?"
                                                   : "as specific, and later in the file";
      fprintf(stderr,
              "hq %s: warning: %s:%d: [role %s] does not apply to %s:%s:%s: [role %s] (line %d) "
              "wins there (%s) with rowwise = %s, columnwise = %s instead of %s, %s; add "
              "[role %s:%s:%s] if %s's %s is meant to follow line %d\n",
              cmd, file, a.ri.line, a.ri.pattern, m, t, nm, b.ri.pattern, b.ri.line, why,
              b.ri.rowwise, b.ri.columnwise, a.ri.rowwise, a.ri.columnwise, m, t, nm, nm, t,
              a.ri.line);
      n++;
    }
  }
  return n;
}

static char last_failure[1024]; /* its start: a long message is printed whole, kept cut */

int cli_fail(int status, const char *cmd, const char *fmt, ...) {
  va_list ap, copy;
  fprintf(stderr, "hq %s: ", cmd);
  va_start(ap, fmt);
  va_copy(copy, ap);
  vfprintf(stderr, fmt, ap);
  vsnprintf(last_failure, sizeof last_failure, fmt, copy);
  va_end(copy);
  va_end(ap);
  fputc('\n', stderr);
  return status;
}

const char *cli_last_failure(void) { return last_failure; }

// --- values --------------------------------------------------------------------------------------

int cli_u64(const char *s, uint64_t *out) {
  char *end;
  /* digits only: strtoull would also take leading blanks, a sign (" -1" wraps) */
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end || errno) return -1;
  *out = v;
  return 0;
}

/* "RxC" into rows and cols (both > 0, R * C at most 2^40); -1 when it is not one, -2 when it is
   one above the cap. */
static int parse_shape(const char *s, int64_t *rows, int64_t *cols) {
  char *end;
  errno = 0;
  long long r = strtoll(s, &end, 10);
  if (end == s || (*end != 'x' && *end != 'X') || errno || r <= 0) return -1;
  const char *c = end + 1;
  long long k = strtoll(c, &end, 10);
  if (end == c || *end || errno || k <= 0) return -1;
  if (r > (1ll << 40) / k) return -2;
  *rows = r;
  *cols = k;
  return 0;
}

/* "cpu", "cuda" (or "gpu") or "cuda:N" into a device ordinal (HQ_DEVICE_HOST for cpu). */
static int parse_device(const char *s, int *device) {
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

int cli_shape_arg(const char *cmd, const char *opt, const char *s, int64_t *rows, int64_t *cols) {
  const int rc = parse_shape(s, rows, cols);
  /* the cap keeps every byte count below it far from overflow (int64 sizes, * 16 bytes) */
  if (rc == -2)
    return cli_fail(2, cmd, "%s '%s' has more than 2^40 (1099511627776) elements, the cap on a "
                    "tensor's size", opt, s);
  if (rc) return cli_fail(2, cmd, "%s '%s' is not RxC with positive R and C", opt, s);
  return 0;
}

int cli_device_arg(const char *cmd, const char *s, int *device) {
  if (parse_device(s, device))
    return cli_fail(2, cmd, "--device '%s' is not cpu, cuda or cuda:N", s);
  return 0;
}

int cli_dtype_arg(const char *cmd, const char *s, hq_dtype *dtype) {
  *dtype = hq_dtype_from_name(s);
  if (*dtype != HQ_F32 && *dtype != HQ_BF16 && *dtype != HQ_F16)
    return cli_fail(2, cmd, "--dtype '%s' is not f32, bf16 or f16", s);
  return 0;
}

// --- options -------------------------------------------------------------------------------------

hq_recipe_opts cli_recipe_opts(const cli_list *dirs) {
  hq_recipe_opts o = {.struct_size = sizeof o, .extra_dirs = dirs->v, .n_extra_dirs = dirs->n};
  return o;
}

/* Whether `text` names option `name` as a word of its own ("--checkpoint" is not named by
   "--checkpoint-every"). */
static int names_option(const char *text, const char *name) {
  const size_t n = strlen(name);
  for (const char *p = strstr(text, name); p; p = strstr(p + 1, name)) {
    const char after = p[n];
    if (!(after == '-' || (after >= 'a' && after <= 'z') || (after >= '0' && after <= '9')))
      return 1;
  }
  return 0;
}

/* The command's --help: its usage text. An option of the table that the text does not name is
   reported on stderr: the help and the parser drifted apart (tests/test_cli.sh checks that no
   command reports one, and that the parser knows every option the help names). */
static void print_help(const cli_command *c, FILE *f) {
  fputs(c->usage, f);
  for (size_t i = 0; i < c->nopts; i++)
    if (!names_option(c->usage, c->opts[i].name))
      cli_fail(0, c->name, "internal: --help does not name %s", c->opts[i].name);
}

/* The option of c named by the first n characters of arg, or NULL. */
static const cli_option *find_option(const cli_command *c, const char *arg, size_t n) {
  for (size_t i = 0; i < c->nopts; i++)
    if (strlen(c->opts[i].name) == n && strncmp(c->opts[i].name, arg, n) == 0) return &c->opts[i];
  return NULL;
}

/* Store the value v of option o: 0, or 2 after the message. */
static int set_value(const cli_command *c, const cli_option *o, const char *v) {
  switch (o->kind) {
  case CLI_FLAG: break; /* never: a flag takes no value */
  case CLI_STR: *(const char **)o->dest = v; break;
  case CLI_LIST: {
    cli_list *l = o->dest;
    const size_t most = o->max < CLI_LIST_MAX ? (size_t)o->max : CLI_LIST_MAX;
    if (l->n == most) return cli_fail(2, c->name, "at most %zu %s options", most, o->name);
    l->v[l->n++] = v;
    break;
  }
  case CLI_INT: {
    uint64_t u;
    if (cli_u64(v, &u) || u < (uint64_t)o->min || u > (uint64_t)o->max)
      return cli_fail(2, c->name, "%s '%s' is not an integer in [%lld, %lld]", o->name, v,
                      (long long)o->min, (long long)o->max);
    *(int64_t *)o->dest = (int64_t)u;
    break;
  }
  case CLI_CALL: return o->call(c->name, o, v);
  }
  return 0;
}

int cli_parse(const cli_command *c, int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      print_help(c, stdout);
      return 0;
    }
    if (a[0] != '-' || a[1] == '\0') { /* an operand ("-" is one: a file name) */
      if (!c->operand)
        return cli_fail(2, c->name, "unknown argument '%s' (see `hq %s --help`)", a, c->name);
      const int st = c->operand(c->name, a, c->user);
      if (st) return st;
      continue;
    }
    const char *eq = strchr(a, '=');
    const size_t n = eq ? (size_t)(eq - a) : strlen(a);
    const cli_option *o = find_option(c, a, n);
    if (!o)
      return cli_fail(2, c->name, "unknown option '%.*s' (see `hq %s --help`)", (int)n, a,
                      c->name);
    if (o->kind == CLI_FLAG) {
      if (eq) return cli_fail(2, c->name, "%s takes no value ('%s')", o->name, a);
      *(int *)o->dest = 1;
      continue;
    }
    const char *v;
    if (eq) v = eq + 1;
    else if (i + 1 < argc) v = argv[++i];
    else return cli_fail(2, c->name, "%s needs a value", o->name);
    const int st = set_value(c, o, v);
    if (st) return st;
  }
  return CLI_RUN;
}

// --- output files --------------------------------------------------------------------------------

int cli_output_path(const char *cmd, const char *opt, const char *path, char **target) {
  if (target) *target = NULL;
  const size_t n = strlen(path);
  if (n >= PATH_MAX)
    return cli_fail(1, cmd, "%s %.60s...: the path is %zu bytes long, more than the system takes "
                    "(PATH_MAX %d, the NUL included)", opt, path, n, PATH_MAX);
  char *t = NULL;
  if (hq_output_target(path, &t)) return cli_fail(1, cmd, "%s %s: %s", opt, path, hq_last_error());
  if (target) *target = t;
  else free(t);
  return 0;
}

int cli_out_open(const char *cmd, const char *opt, const char *path, cli_out *o) {
  memset(o, 0, sizeof *o);
  o->cmd = cmd, o->opt = opt, o->path = path;
  if (cli_output_path(cmd, opt, path, &o->target)) return 1;
  const size_t len = strlen(o->target) + 64;
  if (!(o->tmp = malloc(len))) {
    cli_out_abort(o);
    return cli_fail(1, cmd, "out of memory");
  }
  static unsigned counter;
  const char *slash = strrchr(o->target, '/');
  const int dir_len = slash ? (int)(slash - o->target) + 1 : 0;
  int fd = -1, short_name = 0;
  for (int attempt = 0; fd < 0 && attempt < 100; attempt++) {
    /* a file name near NAME_MAX has no room for the suffix: then a short name in its directory */
    if (short_name)
      snprintf(o->tmp, len, "%.*s.hq-tmp.%ld.%u", dir_len, o->target, (long)getpid(), counter++);
    else snprintf(o->tmp, len, "%s.tmp.%ld.%u", o->target, (long)getpid(), counter++);
    fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno == ENAMETOOLONG && !short_name) short_name = 1;
    else if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0 || !(o->f = fdopen(fd, "wb"))) {
    const int e = errno;
    if (fd >= 0) {
      close(fd);
      unlink(o->tmp);
    }
    cli_fail(1, cmd, "%s %s: cannot create (its temporary file %s): %s", opt, path, o->tmp,
             strerror(e));
    free(o->tmp);
    o->tmp = NULL;
    cli_out_abort(o);
    return 1;
  }
  return 0;
}

int cli_out_commit(cli_out *o, int ok) {
  int e = ok ? 0 : errno;
  if (o->f) {
    if (ok && (fflush(o->f) != 0 || fsync(fileno(o->f)) != 0)) ok = 0, e = errno;
    if (fclose(o->f) != 0 && ok) ok = 0, e = errno;
    o->f = NULL;
  }
  if (ok && rename(o->tmp, o->target) != 0) ok = 0, e = errno;
  if (ok) {
    free(o->tmp);
    o->tmp = NULL;
    cli_out_abort(o);
    return 0;
  }
  cli_fail(1, o->cmd, "%s %s: write error: %s (nothing written there)", o->opt, o->path,
           e ? strerror(e) : "unknown");
  cli_out_abort(o);
  return 1;
}

void cli_out_abort(cli_out *o) {
  if (o->f) fclose(o->f);
  if (o->tmp) unlink(o->tmp);
  free(o->tmp);
  free(o->target);
  memset(o, 0, sizeof *o);
}
