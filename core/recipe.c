/*
** recipe.c -- reading a recipe .ini with inih and resolving it into format instances and roles.
**
** Debian's inih (r55) misreads some input silently: lines longer than its 200-byte buffer are
** split and the tail parsed as a new line, section and key names are truncated at 49 bytes, an
** indented line after a key is taken as a continuation of that key, and a repeated key calls the
** handler again. And its handler gets no line numbers. So before inih runs, a pre-scan walks the
** same bytes with inih's own line rules, records each section header and key with its line, and
** reports each of those cases as an error with file:line. inih then parses the text and the k-th
** handler call is matched to the k-th key the pre-scan saw (checked by name).
*/
#include "config.h"
#include "hq_internal.h"

#include <errno.h>
#include <ini.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define INIH_MAX_LINE 198   /* characters per line that inih r55 reads whole (200-byte buffer) */
#define INIH_MAX_NAME 49    /* section / key characters it keeps */
#define MAX_RECIPE_BYTES (16 << 20) /* 16 MiB: far above any real recipe (100k sections fit) */

enum { SEC_NONE, SEC_RECIPE, SEC_FORMAT, SEC_ROLE, SEC_UNKNOWN };

typedef struct kv {
  char *key;
  char *value;     /* set by the inih handler */
  int line;
} kv;

typedef struct section {
  int kind;
  char *arg;       /* format name / role pattern */
  int line;
  hqi_vec kvs;     /* kv * */
} section;

typedef struct fmt_entry {
  char *name;
  int line;              /* 0 for implicit instances */
  hqi_format *f;         /* NULL when it failed to resolve */
} fmt_entry;

typedef struct role_entry {
  hqi_pattern pat;
  char *pattern;
  int line;
  fmt_entry *fmt[2];     /* ROWWISE, COLWISE (NULL: identity, or unresolved) */
  char *fmt_name[2];     /* the names the section gave, NULL when unset */
  int source;
  long shadowed_by;
} role_entry;

struct hq_recipe {
  char *path;            /* as given (for messages) */
  char *dir;             /* directory plugin_dirs are relative to */
  char *name;
  hqi_vec errors;        /* char * "file:line: msg" */
  hqi_vec sections;      /* section * */
  hqi_vec keys;          /* kv *, in file order: what the inih handler must see */
  size_t next_key;       /* handler cursor */
  int inih_unsafe;       /* the pre-scan found a line inih would misread: inih is not run */
  hq_plugins *set;
  hqi_vec formats;       /* fmt_entry * */
  hqi_vec roles;         /* role_entry * */
  fmt_entry *identity;   /* the implicit identity instance, when available */
  fmt_entry **fmt_sorted; /* the first n_fmt_sorted formats sorted by name (find_format) */
  size_t n_fmt_sorted;
  uint32_t unmatched;    /* HQ_UNMATCHED_*: the options' choice, else the [recipe] key's */
  int plugin_dirs_line;  /* the line of [recipe] plugin_dirs, 0 if none */
};

static void add_error(hq_recipe *r, int line, const char *fmt, ...) HQ_PRINTF(3, 4);
static void add_error(hq_recipe *r, int line, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char *e = line > 0 ? hqi_asprintf("%s:%d: %s", r->path, line, msg)
                     : hqi_asprintf("%s: %s", r->path, msg);
  if (e && hqi_vec_push(&r->errors, e)) free(e);
}

/* The line number an error message carries after "path:" (0: none). */
static long error_line(const hq_recipe *r, const char *e) {
  size_t n = strlen(r->path);
  if (strncmp(e, r->path, n) != 0 || e[n] != ':') return 0;
  char *end;
  long v = strtol(e + n + 1, &end, 10);
  return end > e + n + 1 && *end == ':' ? v : 0;
}

typedef struct err_key {
  long line;
  size_t index;
  void *msg;
} err_key;

static int cmp_err(const void *a, const void *b) {
  const err_key *x = a, *y = b;
  if (x->line != y->line) return x->line < y->line ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* List the errors in line order (file-wide ones first), keeping the order within a line. */
static void sort_errors(hq_recipe *r) {
  if (r->errors.n < 2) return;
  err_key *k = malloc(r->errors.n * sizeof *k);
  if (!k) return; /* unsorted, not lost: not an allocation failure that loses anything */
  for (size_t i = 0; i < r->errors.n; i++) {
    k[i].line = error_line(r, r->errors.v[i]);
    k[i].index = i;
    k[i].msg = r->errors.v[i];
  }
  qsort(k, r->errors.n, sizeof *k, cmp_err);
  for (size_t i = 0; i < r->errors.n; i++) r->errors.v[i] = k[i].msg;
  free(k);
}

// --- pre-scan ---------------------------------------------------------------------------------

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

/* inih's find_chars_or_comment: first char of `chars`, or a ';' preceded by whitespace. */
static const char *find_chars_or_comment(const char *s, const char *chars) {
  int was_space = 0;
  while (*s && (!chars || !strchr(chars, *s)) && !(was_space && *s == ';')) {
    was_space = is_space(*s);
    s++;
  }
  return s;
}

static char *trimmed(const char *s, size_t n) {
  while (n && is_space(*s)) s++, n--;
  while (n && is_space(s[n - 1])) n--;
  return hqi_strndup(s, n);
}

static section *new_section(hq_recipe *r, int kind, char *arg, int line) {
  section *s = hqi_calloc(1, sizeof *s);
  if (!s || hqi_vec_push(&r->sections, s)) {
    free(s);
    free(arg);
    return NULL;
  }
  s->kind = kind;
  s->arg = arg;
  s->line = line;
  return s;
}

static void scan_header(hq_recipe *r, const char *start, int line, section **cur) {
  const char *end = find_chars_or_comment(start + 1, "]");
  if (*end != ']') {
    r->inih_unsafe = 1;
    add_error(r, line, "section header has no closing ']'");
    *cur = new_section(r, SEC_UNKNOWN, NULL, line);
    return;
  }
  char *name = trimmed(start + 1, (size_t)(end - start - 1));
  if (!name) return;
  if ((size_t)(end - start - 1) > INIH_MAX_NAME) {
    r->inih_unsafe = 1;
    add_error(r, line, "section name '%s' is longer than %d characters (inih truncates it)",
              name, INIH_MAX_NAME);
  }
  const char *rest = end + 1;
  while (is_space(*rest)) rest++;
  if (*rest && *rest != ';' && strchr(rest, ']') && strncmp(name, "role", 4) == 0) {
    r->inih_unsafe = 1;
    add_error(r, line, "a role pattern cannot hold a '[...]' class: inih ends the section name "
              "at the first ']' (use '*' and '?')");
  } else if (*rest && *rest != ';')
    add_error(r, line, "unexpected text '%s' after the section header", rest);
  if (strcmp(name, "recipe") == 0) {
    free(name);
    *cur = new_section(r, SEC_RECIPE, NULL, line);
  } else if (strncmp(name, "format", 6) == 0 && is_space(name[6])) {
    char *arg = trimmed(name + 7, strlen(name + 7));
    free(name);
    *cur = new_section(r, SEC_FORMAT, arg, line);
  } else if (strncmp(name, "role", 4) == 0 && is_space(name[4])) {
    char *arg = trimmed(name + 5, strlen(name + 5));
    free(name);
    *cur = new_section(r, SEC_ROLE, arg, line);
  } else {
    add_error(r, line, "unknown section [%s]: expected [recipe], [format NAME] or "
              "[role module_type:tensor_type:name]", name);
    free(name);
    *cur = new_section(r, SEC_UNKNOWN, NULL, line);
  }
}

static void scan_key(hq_recipe *r, const char *start, int line, section *cur) {
  const char *end = find_chars_or_comment(start, "=:");
  if (*end != '=' && *end != ':') {
    add_error(r, line, "expected 'key = value', found '%s'", start);
    return;
  }
  char *key = trimmed(start, (size_t)(end - start));
  if (!key) return;
  kv *e = hqi_calloc(1, sizeof *e);
  if (!e || hqi_vec_push(&r->keys, e)) {
    free(e);
    free(key);
    return;
  }
  e->key = key;
  e->line = line;
  /* a key reported here stays out of its section: no follow-on "unknown key" at resolution */
  if (strlen(key) > INIH_MAX_NAME) {
    add_error(r, line, "key '%s' is longer than %d characters (inih truncates it)", key,
              INIH_MAX_NAME);
    return;
  }
  if (key[0] == '\0') {
    add_error(r, line, "empty key before '%c'", *end);
    return;
  }
  if (!cur) {
    add_error(r, line, "key '%s' appears before any section", key);
    return;
  }
  hqi_vec_push(&cur->kvs, e); /* repeats are found after the scan (drop_repeated_keys) */
}

static int cmp_kv(const void *a, const void *b) {
  const kv *x = *(kv *const *)a, *y = *(kv *const *)b;
  int c = strcmp(x->key, y->key);
  return c ? c : (x->line > y->line) - (x->line < y->line);
}

/* A key repeated in a section is an error at the repeat (the first stays): sort a copy of each
   section's keys by (key, line), O(k log k), instead of comparing every pair. */
static void drop_repeated_keys(hq_recipe *r) {
  for (size_t si = 0; si < r->sections.n; si++) {
    section *s = r->sections.v[si];
    if (s->kvs.n < 2) continue;
    kv **v = hqi_malloc(s->kvs.n * sizeof *v);
    if (!v) return; /* counted: the parse fails as a whole */
    memcpy(v, s->kvs.v, s->kvs.n * sizeof *v);
    qsort(v, s->kvs.n, sizeof *v, cmp_kv);
    int any = 0;
    for (size_t i = 1; i < s->kvs.n; i++)
      if (strcmp(v[i]->key, v[i - 1]->key) == 0) {
        size_t f = i - 1;
        while (f > 0 && strcmp(v[f - 1]->key, v[i]->key) == 0) f--;
        add_error(r, v[i]->line, "key '%s' repeated in this section (first at line %d)", v[i]->key,
                  v[f]->line);
        v[i]->value = (char *)v; /* mark (never dereferenced; reset below) */
        any = 1;
      }
    if (any) {
      size_t n = 0;
      for (size_t i = 0; i < s->kvs.n; i++) {
        kv *k = s->kvs.v[i];
        if (k->value == (char *)v) k->value = NULL; /* still owned by r->keys */
        else s->kvs.v[n++] = k;
      }
      s->kvs.n = n;
    }
    free(v);
  }
}

/* Walk the text with inih r55's rules (BOM, comments, continuation, sections, keys). */
static void prescan(hq_recipe *r, const char *text) {
  section *cur = NULL;
  int line = 0;
  const char *prev_key = NULL; /* inih's prev_name: continuation lines follow a key */
  int prev_key_line = 0;
  for (const char *p = text; *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    line++;
    char *buf = hqi_strndup(p, len);
    if (!buf) return;
    p += len + (nl ? 1 : 0);
    if (len > INIH_MAX_LINE) {
      r->inih_unsafe = 1;
      add_error(r, line, "line is %zu characters long; inih reads at most %d per line and would "
                "split it", len, INIH_MAX_LINE);
      free(buf);
      prev_key = NULL;
      continue;
    }
    char *start = buf;
    if (line == 1 && (unsigned char)start[0] == 0xEF && (unsigned char)start[1] == 0xBB &&
        (unsigned char)start[2] == 0xBF)
      start += 3;
    char *lead = start;
    while (is_space(*start)) start++;
    size_t n = strlen(start);
    while (n && is_space(start[n - 1])) start[--n] = '\0';
    if (*start == '\0' || *start == ';' || *start == '#') {
      /* blank or comment */
    } else if (prev_key && start > lead) {
      r->inih_unsafe = 1;
      add_error(r, line, "indented line is read by inih as a continuation of '%s' (line %d); "
                "remove the indentation", prev_key, prev_key_line);
    } else if (*start == '[') {
      scan_header(r, start, line, &cur);
      prev_key = NULL;
    } else {
      size_t before = r->keys.n;
      scan_key(r, start, line, cur);
      if (r->keys.n > before) {
        kv *k = r->keys.v[r->keys.n - 1];
        prev_key = k->key;
        prev_key_line = line;
      }
    }
    free(buf);
  }
}

static int ini_handler_fn(void *user, const char *sec, const char *name, const char *value) {
  (void)sec;
  hq_recipe *r = user;
  if (r->next_key >= r->keys.n) {
    add_error(r, 0, "internal: inih reported key '%s' the pre-scan did not see", name);
    return 0;
  }
  kv *k = r->keys.v[r->next_key++];
  if (strncmp(k->key, name, INIH_MAX_NAME) != 0) {
    add_error(r, k->line, "internal: inih read key '%s' where the pre-scan saw '%s'", name,
              k->key);
    return 0;
  }
  free(k->value);
  k->value = hqi_strdup(value);
  return 1;
}

// --- resolution -------------------------------------------------------------------------------

static kv *find_kv(const section *s, const char *key) {
  for (size_t i = 0; i < s->kvs.n; i++) {
    kv *k = s->kvs.v[i];
    if (strcmp(k->key, key) == 0) return k;
  }
  return NULL;
}

static int cmp_fmt_name(const void *a, const void *b) {
  return strcmp((*(fmt_entry *const *)a)->name, (*(fmt_entry *const *)b)->name);
}

/* The [format] sections by name, O(log n) per lookup (a format named twice is an error found
   when it is added, so names are unique). Implicit formats added later are searched linearly. */
static void index_formats(hq_recipe *r) {
  free(r->fmt_sorted);
  r->n_fmt_sorted = 0;
  r->fmt_sorted = hqi_malloc(r->formats.n * sizeof *r->fmt_sorted);
  if (!r->fmt_sorted) return;
  if (r->formats.n) { /* formats.v is NULL while empty: no memcpy/qsort of a NULL array */
    memcpy(r->fmt_sorted, r->formats.v, r->formats.n * sizeof *r->fmt_sorted);
    qsort(r->fmt_sorted, r->formats.n, sizeof *r->fmt_sorted, cmp_fmt_name);
  }
  r->n_fmt_sorted = r->formats.n;
}

static fmt_entry *find_format(const hq_recipe *r, const char *name) {
  if (r->n_fmt_sorted) {
    size_t lo = 0, hi = r->n_fmt_sorted;
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      int c = strcmp(r->fmt_sorted[mid]->name, name);
      if (c == 0) return r->fmt_sorted[mid];
      if (c < 0) lo = mid + 1;
      else hi = mid;
    }
  }
  for (size_t i = r->n_fmt_sorted; i < r->formats.n; i++) {
    fmt_entry *e = r->formats.v[i];
    if (strcmp(e->name, name) == 0) return e;
  }
  return NULL;
}

static fmt_entry *add_format(hq_recipe *r, const char *name, int line) {
  fmt_entry *e = hqi_calloc(1, sizeof *e);
  if (!e) return NULL;
  e->name = hqi_strdup(name);
  e->line = line;
  if (!e->name || hqi_vec_push(&r->formats, e)) {
    free(e->name);
    free(e);
    return NULL;
  }
  return e;
}

/* Why a plugin name is unavailable: mention a rejected module of that file name, if any. */
static void explain_missing_plugin(hq_recipe *r, int line, const char *what, const char *plugin) {
  for (size_t i = 0; i < hq_plugins_rejected_count(r->set); i++) {
    const char *file = hq_plugins_rejected_file(r->set, i);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    size_t n = strlen(plugin);
    if (strncmp(base, plugin, n) == 0 && strcmp(base + n, ".so") == 0) {
      add_error(r, line, "%s '%s': the module %s was rejected: %s", what, plugin, file,
                hq_plugins_rejected_reason(r->set, i));
      return;
    }
  }
  add_error(r, line, "%s '%s' was not found on the plugin search path (%zu directories; see "
            "`hq info`)", what, plugin, hq_plugins_dir_count(r->set));
}

static int valid_format_name(const char *s) {
  if (!s || !*s) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '_' || *s == '-' || *s == '.'))
      return 0;
  return 1;
}

static void build_format(hq_recipe *r, const section *s) {
  if (!valid_format_name(s->arg)) {
    add_error(r, s->line, "format name '%s' must be letters, digits, '_', '-' or '.'", s->arg);
    return;
  }
  fmt_entry *prev = find_format(r, s->arg);
  if (prev) {
    add_error(r, s->line, "format '%s' is defined twice (first at line %d)", s->arg, prev->line);
    return;
  }
  fmt_entry *e = add_format(r, s->arg, s->line);
  if (!e) return;
  kv *pk = find_kv(s, "plugin");
  if (!pk || !pk->value || !pk->value[0]) {
    add_error(r, s->line, "format '%s' has no 'plugin = NAME' key", s->arg);
    return;
  }
  if (strcmp(s->arg, "identity") == 0 && strcmp(pk->value, "identity") != 0) {
    add_error(r, pk->line, "format 'identity' must use plugin = identity (the name is reserved)");
    return;
  }
  const hq_plugin *p = hq_plugins_find(r->set, pk->value);
  if (!p) {
    explain_missing_plugin(r, pk->line, "plugin", pk->value);
    return;
  }
  const hq_option *opts = hq_plugin_options(p);
  size_t nopt = p->n_options;
  const char **texts = hqi_calloc(nopt + 1, sizeof *texts);
  if (!texts) return;
  int bad = 0;
  for (size_t i = 0; i < s->kvs.n; i++) {
    kv *k = s->kvs.v[i];
    if (k == pk) continue;
    size_t j = 0;
    while (j < nopt && strcmp(opts[j].name, k->key) != 0) j++;
    if (j == nopt) {
      char known[512] = "";
      size_t used = 0;
      for (size_t m = 0; m < nopt && used < sizeof known - 40; m++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", m ? ", " : "",
                                 opts[m].name);
      add_error(r, k->line, "unknown option '%s' for plugin '%s' (it accepts: %s)", k->key,
                pk->value, nopt ? known : "no options");
      bad = 1;
      continue;
    }
    hq_optval v;
    char why[300];
    if (hqi_option_parse(&opts[j], k->value ? k->value : "", &v, why, sizeof why)) {
      add_error(r, k->line, "option '%s' (%s) of format '%s': %s", k->key,
                hq_opt_type_name(opts[j].type), s->arg, why);
      bad = 1;
      continue;
    }
    texts[j] = k->value;
  }
  if (!bad) {
    int rc = hqi_format_create(s->arg, p, r->set, texts, &e->f);
    if (rc) add_error(r, s->line, "format '%s' (plugin %s): %s", s->arg, pk->value,
                      hq_last_error());
  }
  free(texts);
}

/* An instance named by a plugin directly ("rowwise = mxfp8"): that plugin with its defaults. */
/* The implicit instance of plugin `name` with its defaults, made at its first reference (line:
   where an error is reported). A plugin whose configure() rejects its own defaults is that one
   error; later references to it stay silent (the entry exists, unresolved). */
static fmt_entry *implicit_format(hq_recipe *r, const char *name, int line) {
  const hq_plugin *p = hq_plugins_find(r->set, name);
  if (!p) return NULL;
  fmt_entry *e = add_format(r, name, 0);
  if (!e) return NULL;
  if (hqi_format_create(name, p, r->set, NULL, &e->f)) {
    add_error(r, line, "plugin '%s' with its default options: %s", name, hq_last_error());
    return NULL;
  }
  return e;
}

static fmt_entry *resolve_format_ref(hq_recipe *r, const kv *k) {
  fmt_entry *e = find_format(r, k->value);
  if (e) return e->f ? e : NULL; /* its own error was reported at its section */
  if (hq_plugins_find(r->set, k->value)) /* the plugin's defaults (an error is its own) */
    return implicit_format(r, k->value, k->line);
  /* a module file of that name that was rejected: say why */
  for (size_t i = 0; i < hq_plugins_rejected_count(r->set); i++) {
    const char *file = hq_plugins_rejected_file(r->set, i);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    size_t n = strlen(k->value);
    if (strncmp(base, k->value, n) == 0 && strcmp(base + n, ".so") == 0) {
      explain_missing_plugin(r, k->line, "format", k->value);
      return NULL;
    }
  }
  add_error(r, k->line, "unknown format '%s' for %s (no [format %s] section and no plugin of "
            "that name)", k->value, k->key, k->value);
  return NULL;
}

static void build_role(hq_recipe *r, const section *s) {
  role_entry *e = hqi_calloc(1, sizeof *e);
  if (!e) return;
  char why[300];
  if (hqi_pattern_parse(s->arg ? s->arg : "", &e->pat, why, sizeof why)) {
    add_error(r, s->line, "%s", why);
    free(e);
    return;
  }
  e->pattern = hqi_strdup(s->arg);
  e->line = s->line;
  e->shadowed_by = -1;
  if (!e->pattern || hqi_vec_push(&r->roles, e)) {
    hqi_pattern_free(&e->pat);
    free(e->pattern);
    free(e);
    return;
  }
  int set_any = 0;
  for (size_t i = 0; i < s->kvs.n; i++) {
    kv *k = s->kvs.v[i];
    const char *v = k->value ? k->value : "";
    if (strcmp(k->key, "rowwise") == 0 || strcmp(k->key, "columnwise") == 0) {
      int d = k->key[0] == 'r' ? 0 : 1;
      set_any = 1;
      if (!v[0]) {
        add_error(r, k->line, "'%s' needs a format name", k->key);
        continue;
      }
      free(e->fmt_name[d]);
      e->fmt_name[d] = hqi_strdup(v);
      e->fmt[d] = resolve_format_ref(r, k);
    } else if (strcmp(k->key, "columnwise_source") == 0) {
      if (strcmp(v, "original") == 0) e->source = HQ_SOURCE_ORIGINAL;
      else if (strcmp(v, "rowwise_dequantized") == 0) e->source = HQ_SOURCE_ROWWISE_DEQUANTIZED;
      else add_error(r, k->line, "columnwise_source '%s' is not one of original|"
                     "rowwise_dequantized", v);
    } else {
      add_error(r, k->line, "unknown key '%s' in a [role] section (expected rowwise, columnwise, "
                "columnwise_source)", k->key);
    }
  }
  if (!set_any)
    add_error(r, s->line, "role section [role %s] sets neither rowwise nor columnwise", s->arg);
}

static void build_recipe_section(hq_recipe *r, const section *s, int *seen_line,
                                 hqi_vec *dirs) {
  if (*seen_line) {
    add_error(r, s->line, "[recipe] appears twice (first at line %d)", *seen_line);
    return;
  }
  *seen_line = s->line;
  for (size_t i = 0; i < s->kvs.n; i++) {
    kv *k = s->kvs.v[i];
    const char *v = k->value ? k->value : "";
    if (strcmp(k->key, "name") == 0 || strcmp(k->key, "description") == 0) {
      if (k->key[0] == 'n') {
        free(r->name);
        r->name = hqi_strdup(v);
      }
    } else if (strcmp(k->key, "unmatched") == 0) {
      static const char *const words[] = {"identity", "warn", "error"};
      size_t w = 0;
      while (w < 3 && strcmp(v, words[w]) != 0) w++;
      if (w == 3)
        add_error(r, k->line, "unmatched = '%s' is not one of identity|warn|error", v);
      else if (!r->unmatched)
        r->unmatched = HQ_UNMATCHED_IDENTITY + (uint32_t)w;
    } else if (strcmp(k->key, "plugin_dirs") == 0) {
      r->plugin_dirs_line = k->line;
      for (const char *p = v; *p;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        char *d = trimmed(p, len);
        if (d && d[0]) {
          /* relative to the recipe's directory; "." joins to nothing ("fmts", not "./fmts";
             "." itself stays the recipe's directory) */
          char *full = d[0] == '/' ? d
                       : strcmp(d, ".") == 0 ? hqi_strdup(r->dir)
                       : strcmp(r->dir, ".") == 0 ? d
                                                  : hqi_asprintf("%s/%s", r->dir, d);
          if (full != d) free(d);
          if (full && hqi_vec_push(dirs, full)) free(full);
        } else {
          free(d);
        }
        p = colon ? colon + 1 : p + len;
      }
    } else {
      add_error(r, k->line, "unknown key '%s' in [recipe] (expected name, description, "
                "plugin_dirs, unmatched)", k->key);
    }
  }
}

/* Whether section j shadows section a (index i): it matches every role a matches and wins. */
static int shadows(const hq_recipe *r, size_t j, size_t i) {
  const role_entry *a = r->roles.v[i], *b = r->roles.v[j];
  if (i == j || !hqi_pattern_contains(&b->pat, &a->pat)) return 0;
  int c = hqi_pattern_compare(&b->pat, &a->pat);
  return c > 0 || (c == 0 && j > i);
}

static uint32_t glob_mask(const hqi_pattern *p) {
  uint32_t m = 0;
  for (int k = 0; k < 3; k++)
    if (strpbrk(p->part[k], "*?")) m |= 1u << k;
  return m;
}

typedef struct shadow_key {
  char *key;       /* the pattern's parts outside the mask, joined by '\x1f' */
  size_t index;
} shadow_key;

static char *mask_key(const hqi_pattern *p, uint32_t mask) {
  return hqi_asprintf("%s\x1f%s\x1f%s", mask & 1u ? "" : p->part[0], mask & 2u ? "" : p->part[1],
                      mask & 4u ? "" : p->part[2]);
}

static int cmp_shadow_key(const void *a, const void *b) {
  const shadow_key *x = a, *y = b;
  int c = strcmp(x->key, y->key);
  return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* For every role section, the first section (in file order) that matches every role it matches
   and wins over it. A section b can contain a only if every part of b without a glob is equal to
   a's part there: so the sections are grouped by their glob mask (which of the three parts have a
   '*' or '?') and, within a group, sorted by their literal parts. Each section then looks up, in
   each of the 8 groups, only the sections whose literal parts equal its own: O(n log n) for the
   recipes people write (per-layer sections), where comparing every pair was O(n^2). */
static void compute_shadows(hq_recipe *r) {
  const size_t n = r->roles.n;
  for (size_t i = 0; i < n; i++) ((role_entry *)r->roles.v[i])->shadowed_by = -1;
  if (n < 2) return;
  shadow_key *g[8] = {NULL};
  size_t gn[8] = {0};
  int ok = 1;
  for (uint32_t m = 0; m < 8 && ok; m++) {
    g[m] = hqi_calloc(n, sizeof *g[m]);
    if (!g[m]) ok = 0;
  }
  for (size_t i = 0; i < n && ok; i++) {
    const role_entry *e = r->roles.v[i];
    uint32_t m = glob_mask(&e->pat);
    shadow_key *k = &g[m][gn[m]];
    if (!(k->key = mask_key(&e->pat, m))) ok = 0;
    else k->index = i, gn[m]++;
  }
  if (ok)
    for (uint32_t m = 0; m < 8; m++) qsort(g[m], gn[m], sizeof *g[m], cmp_shadow_key);
  for (size_t i = 0; i < n && ok; i++) {
    role_entry *a = r->roles.v[i];
    const uint32_t am = glob_mask(&a->pat);
    long best = -1;
    for (uint32_t m = 0; m < 8 && ok; m++) {
      if ((am & ~m) || !gn[m]) continue; /* a glob part of a cannot fit a literal part of b */
      shadow_key probe = {mask_key(&a->pat, m), 0};
      if (!probe.key) {
        ok = 0;
        break;
      }
      size_t lo = 0, hi = gn[m];
      while (lo < hi) { /* first entry with this key */
        size_t mid = lo + (hi - lo) / 2;
        if (cmp_shadow_key(&g[m][mid], &probe) < 0) lo = mid + 1;
        else hi = mid;
      }
      for (size_t t = lo; t < gn[m] && strcmp(g[m][t].key, probe.key) == 0; t++) {
        size_t j = g[m][t].index;
        if (best >= 0 && j >= (size_t)best) break; /* sorted by index: no earlier one follows */
        if (shadows(r, j, i)) {
          best = (long)j;
          break;
        }
      }
      free(probe.key);
    }
    a->shadowed_by = best;
  }
  for (uint32_t m = 0; m < 8; m++) {
    for (size_t t = 0; t < gn[m]; t++) free(g[m][t].key);
    free(g[m]);
  }
  if (!ok) hqi_oom_note(); /* the parse fails as a whole */
}

static int resolve(hq_recipe *r, const hq_recipe_opts *opts) {
  hqi_vec dirs = {0};
  if (opts && opts->unmatched > HQ_UNMATCHED_ERROR)
    return hqi_error(HQ_EINVAL, "hq_recipe_opts.unmatched = %u is not HQ_UNMATCHED_*",
                     opts->unmatched);
  if (opts && opts->unmatched) r->unmatched = opts->unmatched; /* the key cannot override it */
  int recipe_line = 0;
  for (size_t i = 0; i < r->sections.n; i++) {
    section *s = r->sections.v[i];
    if (s->kind == SEC_RECIPE) build_recipe_section(r, s, &recipe_line, &dirs);
  }
  int rc = HQ_OK;
  if (opts && opts->plugins) { /* the caller's set, shared with its other recipes */
    hqi_plugins_retain(opts->plugins);
    r->set = opts->plugins;
    if (r->plugin_dirs_line)
      add_error(r, r->plugin_dirs_line, "plugin_dirs: this recipe is read against a plugin set "
                "the program already opened (hq_recipe_opts.plugins), which its own directories "
                "cannot join");
  } else {
    hqi_vec all = {0};
    if (opts)
      for (size_t i = 0; i < opts->n_extra_dirs; i++)
        hqi_vec_push(&all, (void *)opts->extra_dirs[i]);
    for (size_t i = 0; i < dirs.n; i++) hqi_vec_push(&all, dirs.v[i]);
    rc = hq_plugins_open((const char *const *)all.v, all.n, opts ? opts->plugin_flags : 0,
                         &r->set);
    hqi_vec_free(&all);
  }
  for (size_t i = 0; i < dirs.n; i++) free(dirs.v[i]);
  hqi_vec_free(&dirs);
  if (rc) return rc;
  for (size_t i = 0; i < r->sections.n; i++) {
    section *s = r->sections.v[i];
    if (s->kind == SEC_FORMAT) build_format(r, s);
  }
  index_formats(r);
  if (!find_format(r, "identity")) r->identity = implicit_format(r, "identity", 0);
  else r->identity = find_format(r, "identity");
  for (size_t i = 0; i < r->sections.n; i++) {
    section *s = r->sections.v[i];
    if (s->kind == SEC_ROLE) build_role(r, s);
  }
  compute_shadows(r);
  return HQ_OK;
}

// --- public API -----------------------------------------------------------------------------

static int parse_text2(const char *text, const char *path, const char *dir,
                       const hq_recipe_opts *opts, hq_recipe **out);

/* A recipe is complete or refused: any allocation that failed during the parse (a key, a
   section, an error message that could not be recorded) makes the whole parse HQ_ENOMEM, never a
   recipe with a silently missing piece. */
static int parse_text(const char *text, const char *path, const char *dir,
                      const hq_recipe_opts *opts, hq_recipe **out) {
  const uint64_t before = hqi_oom_events();
  int rc = parse_text2(text, path, dir, opts, out);
  if (rc == HQ_OK && hqi_oom_events() != before) {
    hq_recipe_free(*out);
    *out = NULL;
    return hqi_error(HQ_ENOMEM, "%s: out of memory while parsing the recipe (nothing was kept)",
                     path);
  }
  if (rc == HQ_ENOMEM) *out = NULL;
  return rc;
}

static int parse_text2(const char *text, const char *path, const char *dir,
                       const hq_recipe_opts *opts, hq_recipe **out) {
  const uint64_t oom0 = hqi_oom_events();
  hq_recipe *r = hqi_calloc(1, sizeof *r);
  if (!r) return hqi_error(HQ_ENOMEM, "out of memory");
  r->path = hqi_strdup(path);
  r->dir = hqi_strdup(dir);
  if (!r->path || !r->dir) {
    hq_recipe_free(r);
    return hqi_error(HQ_ENOMEM, "out of memory");
  }
  hq_recipe_opts o;
  if (opts) {
    /* an older caller's smaller struct: read only its bytes, the rest stays zero */
    int rc = hqi_struct_in(&o, sizeof o, opts, opts->struct_size, HQ_RECIPE_OPTS_SIZE_0_1,
                           "hq_recipe_opts");
    if (rc) {
      hq_recipe_free(r);
      return rc;
    }
    opts = &o;
  }
  if (strlen(text) > MAX_RECIPE_BYTES) {
    add_error(r, 0, "file is larger than %d bytes", MAX_RECIPE_BYTES);
  } else {
    /* Errors inih reads consistently (a repeated key, an unknown section, a key outside a
       section, ...) do not stop the parse: the rest of the file is still resolved, so that every
       error is listed at once. Only lines inih would misread stop it here. */
    prescan(r, text);
    drop_repeated_keys(r);
    if (!r->inih_unsafe) {
      size_t before = r->errors.n;
      int line = ini_parse_string(text, ini_handler_fn, r);
      if (line == -2) hqi_oom_note(); /* inih's own buffer could not be allocated */
      else if (line != 0 && before == 0 && r->errors.n == 0)
        add_error(r, line > 0 ? line : 0, "inih could not parse this line");
      if (r->errors.n == before && r->next_key != r->keys.n) {
        add_error(r, 0, "internal: inih reported %zu keys, the pre-scan saw %zu", r->next_key,
                  r->keys.n);
        r->inih_unsafe = 1;
      }
    }
  }
  if (hqi_oom_events() != oom0) { /* a section or key is missing: resolve nothing */
    hq_recipe_free(r);
    return hqi_error(HQ_ENOMEM, "%s: out of memory while reading the recipe (nothing was kept)",
                     path);
  }
  if (!r->inih_unsafe && strlen(text) <= MAX_RECIPE_BYTES) {
    int rc = resolve(r, opts);
    if (rc) {
      hq_recipe_free(r);
      return rc;
    }
  }
  sort_errors(r);
  *out = r;
  return HQ_OK;
}

static void note_errors(const hq_recipe *r);

int hq_recipe_parse(const char *path, const hq_recipe_opts *opts, hq_recipe **out) {
  if (!path || !out) return hqi_error(HQ_EINVAL, "hq_recipe_parse: NULL argument");
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return hqi_error(HQ_EIO, "%s: cannot open: %s", path, strerror(errno));
  /* fopen opens a directory for reading too; only its reads fail, saying less */
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
    fclose(f);
    return hqi_error(HQ_EIO, "%s: is a directory, not a recipe file", path);
  }
  /* the file's size when it has one (a pipe reads up to the limit) */
  long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (size >= 0) rewind(f);
  size_t cap = size >= 0 && size <= MAX_RECIPE_BYTES ? (size_t)size + 2 : MAX_RECIPE_BYTES + 2;
  char *text = hqi_malloc(cap);
  if (!text) {
    fclose(f);
    return hqi_error(HQ_ENOMEM, "out of memory reading %s (%zu bytes)", path, cap);
  }
  errno = 0;
  size_t n = fread(text, 1, cap - 1, f);
  const int err = ferror(f) ? (errno ? errno : EIO) : 0;
  fclose(f);
  if (err) {
    free(text);
    return hqi_error(HQ_EIO, "%s: read error: %s", path, strerror(err));
  }
  if (size >= 0 && size <= MAX_RECIPE_BYTES && n > (size_t)size) {
    free(text);
    return hqi_error(HQ_EIO, "%s: the file grew while it was read", path);
  }
  text[n] = '\0';
  if (memchr(text, '\0', n)) {
    free(text);
    return hqi_error(HQ_EPARSE, "%s: contains a NUL byte (not a text file)", path);
  }
  char *copy = hqi_strdup(path);
  if (!copy) {
    free(text);
    return hqi_error(HQ_ENOMEM, "out of memory");
  }
  int rc = parse_text(text, path, dirname(copy), opts, out);
  free(copy);
  free(text);
  if (!rc) note_errors(*out);
  return rc;
}

int hq_recipe_parse_string(const char *text, const char *name, const hq_recipe_opts *opts,
                           hq_recipe **out) {
  if (!text || !out) return hqi_error(HQ_EINVAL, "hq_recipe_parse_string: NULL argument");
  *out = NULL;
  int rc = parse_text(text, name ? name : "<string>", ".", opts, out);
  if (!rc) note_errors(*out);
  return rc;
}

/* A parsed recipe with errors: the first error (and how many more) becomes hq_last_error(). */
static void note_errors(const hq_recipe *r) {
  if (r && r->errors.n)
    hqi_error(HQ_EPARSE, "%s%s", (const char *)r->errors.v[0],
              r->errors.n > 1 ? " (and more errors; run `hq recipe check`)" : "");
}

/* hq_recipe_load / hq_recipe_load_string: a recipe with any error is freed and refused. */
static int load_result(int rc, hq_recipe **out) {
  if (rc) return rc;
  if ((*out)->errors.n) {
    note_errors(*out);
    hq_recipe_free(*out);
    *out = NULL;
    return HQ_EPARSE;
  }
  return HQ_OK;
}

int hq_recipe_load(const char *path, const hq_recipe_opts *opts, hq_recipe **out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_recipe_load: out is NULL");
  return load_result(hq_recipe_parse(path, opts, out), out);
}

int hq_recipe_load_string(const char *text, const char *name, const hq_recipe_opts *opts,
                          hq_recipe **out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_recipe_load_string: out is NULL");
  return load_result(hq_recipe_parse_string(text, name, opts, out), out);
}

void hq_recipe_free(hq_recipe *r) {
  if (!r) return;
  for (size_t i = 0; i < r->errors.n; i++) free(r->errors.v[i]);
  for (size_t i = 0; i < r->sections.n; i++) {
    section *s = r->sections.v[i];
    free(s->arg);
    hqi_vec_free(&s->kvs);
    free(s);
  }
  for (size_t i = 0; i < r->keys.n; i++) {
    kv *k = r->keys.v[i];
    free(k->key);
    free(k->value);
    free(k);
  }
  for (size_t i = 0; i < r->formats.n; i++) {
    fmt_entry *e = r->formats.v[i];
    hqi_format_release(e->f);
    free(e->name);
    free(e);
  }
  for (size_t i = 0; i < r->roles.n; i++) {
    role_entry *e = r->roles.v[i];
    hqi_pattern_free(&e->pat);
    free(e->pattern);
    free(e->fmt_name[0]);
    free(e->fmt_name[1]);
    free(e);
  }
  hqi_vec_free(&r->errors);
  hqi_vec_free(&r->sections);
  hqi_vec_free(&r->keys);
  hqi_vec_free(&r->formats);
  free(r->fmt_sorted);
  hqi_vec_free(&r->roles);
  hq_plugins_close(r->set);
  free(r->path);
  free(r->dir);
  free(r->name);
  free(r);
}

size_t hq_recipe_error_count(const hq_recipe *r) { return r ? r->errors.n : 0; }
const char *hq_recipe_error(const hq_recipe *r, size_t i) {
  return r && i < r->errors.n ? r->errors.v[i] : NULL;
}
const char *hq_recipe_path(const hq_recipe *r) { return r ? r->path : NULL; }
const char *hq_recipe_name(const hq_recipe *r) { return r && r->name ? r->name : ""; }
const hq_plugins *hq_recipe_plugins(const hq_recipe *r) { return r ? r->set : NULL; }

size_t hq_recipe_format_count(const hq_recipe *r) { return r ? r->formats.n : 0; }

int hq_recipe_format_info(const hq_recipe *r, size_t i, hq_format_info *out) {
  if (!r || !out || i >= r->formats.n)
    return hqi_error(HQ_EINVAL, "hq_recipe_format_info: no format %zu", i);
  const fmt_entry *e = r->formats.v[i];
  hq_format_info v;
  memset(&v, 0, sizeof v);
  v.struct_size = sizeof v;
  v.name = e->name;
  v.line = e->line;
  if (e->f) {
    v.plugin = e->f->plugin->ops.name;
    v.n_options = e->f->plugin->n_options;
    v.option_names = e->f->plugin->opt_text;
    v.option_values = (const char *const *)e->f->val_text;
  }
  return hqi_struct_out(out, &v, sizeof v, HQ_FORMAT_INFO_SIZE_0_3, "hq_format_info");
}

size_t hq_recipe_role_count(const hq_recipe *r) { return r ? r->roles.n : 0; }
uint32_t hq_recipe_unmatched(const hq_recipe *r) { return r ? r->unmatched : 0; }

int hq_recipe_role_info(const hq_recipe *r, size_t i, hq_role_info *out) {
  if (!r || !out || i >= r->roles.n)
    return hqi_error(HQ_EINVAL, "hq_recipe_role_info: no role section %zu", i);
  const role_entry *e = r->roles.v[i];
  hq_role_info v;
  memset(&v, 0, sizeof v);
  v.struct_size = sizeof v;
  v.pattern = e->pattern;
  v.line = e->line;
  v.rowwise = e->fmt_name[0] ? e->fmt_name[0] : "identity";
  v.columnwise = e->fmt_name[1] ? e->fmt_name[1] : "identity";
  v.columnwise_source = e->source;
  v.shadowed_by = e->shadowed_by;
  return hqi_struct_out(out, &v, sizeof v, HQ_ROLE_INFO_SIZE_0_3, "hq_role_info");
}

long hq_recipe_match(const hq_recipe *r, const hq_role *rolep) {
  hq_role role;
  if (!r || hqi_role_in(rolep, "hq_recipe_match", &role)) return -1;
  long best = -1;
  for (size_t i = 0; i < r->roles.n; i++) {
    role_entry *e = r->roles.v[i];
    if (!hqi_pattern_match(&e->pat, &role)) continue;
    if (best < 0 || hqi_pattern_compare(&e->pat, &((role_entry *)r->roles.v[best])->pat) >= 0)
      best = (long)i; /* >= : ties go to the later section */
  }
  return best;
}

hqi_format *hqi_recipe_format_of(hq_recipe *r, long role_index, uint32_t dir, int *source) {
  *source = HQ_SOURCE_ORIGINAL;
  fmt_entry *e = NULL;
  if (role_index >= 0) {
    role_entry *re = r->roles.v[role_index];
    e = re->fmt[dir == HQ_COLWISE ? 1 : 0];
    *source = re->source;
  }
  if (!e) e = r->identity;
  return e ? e->f : NULL;
}
