/*
** loader.c -- finding, loading and checking format modules.
**
** Each "*.so" on the search path is opened with dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)
** (modules may hold CUDA state, so they are never unmapped), its single entry symbol is called
** with the core's host table, and the returned ops table is checked: ABI major/minor, struct
** size, name, required operations, option table, uniqueness. A module failing any check is
** rejected with a message naming the file and the reason; loading goes on with the rest.
*/
#include "config.h"
#include "hq_internal.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef HQ_PLUGINDIR
#define HQ_PLUGINDIR "/usr/local/lib/hq/formats"
#endif

#define MAX_OPTIONS 64
#define MAX_CONFIG_SIZE (1u << 20)

typedef struct rejected {
  char *file;
  char *reason;
} rejected;

struct hq_plugins {
  int refs;
  hqi_vec dirs;       /* char * */
  hqi_vec plugins;    /* hq_plugin * */
  hqi_vec rejected;   /* rejected * */
};

const char *hq_plugins_default_dir(void) { return HQ_PLUGINDIR; }

static int reject(hq_plugins *set, const char *file, const char *fmt, ...) HQ_PRINTF(3, 4);
static int reject(hq_plugins *set, const char *file, const char *fmt, ...) {
  char reason[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  rejected *r = calloc(1, sizeof *r);
  if (!r) return hqi_error(HQ_ENOMEM, "out of memory");
  r->file = hqi_strdup(file);
  r->reason = hqi_strdup(reason);
  if (!r->file || !r->reason || hqi_vec_push(&set->rejected, r)) {
    free(r->file);
    free(r->reason);
    free(r);
    return hqi_error(HQ_ENOMEM, "out of memory");
  }
  hqi_log(NULL, 3, "rejected plugin %s: %s", file, reason);
  return HQ_OK;
}

static int valid_name(const char *s) {
  size_t n = 0;
  if (!s) return 0;
  for (; s[n]; n++) {
    char c = s[n];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return 0;
  }
  return n >= 1 && n <= 31;
}

/* Check a module's ops table; on failure write the reason. */
static int check_ops(const hq_format_ops *ops, size_t *n_options, char *why, size_t len) {
  if (!valid_name(ops->name)) {
    snprintf(why, len, "format name %s%s%s is not 1-31 characters of [a-z0-9_]",
             ops->name ? "'" : "", ops->name ? ops->name : "(NULL)", ops->name ? "'" : "");
    return 0;
  }
  struct { const void *fn; const char *field; } required[] = {
      {ops->version, "version"},     {ops->options, "options"},
      {(const void *)ops->configure, "configure"}, {(const void *)ops->layout, "layout"},
      {(const void *)ops->quantize, "quantize"},   {(const void *)ops->dequantize, "dequantize"},
  };
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
    if (!required[i].fn) {
      snprintf(why, len, "format '%s' lacks the required field '%s'", ops->name,
               required[i].field);
      return 0;
    }
  }
  if (!(ops->caps & (HQ_CAP_CPU | HQ_CAP_CUDA))) {
    snprintf(why, len, "format '%s' declares neither HQ_CAP_CPU nor HQ_CAP_CUDA", ops->name);
    return 0;
  }
  if (ops->config_size > MAX_CONFIG_SIZE) {
    snprintf(why, len, "format '%s' asks for %u bytes of configuration (at most %u)", ops->name,
             ops->config_size, MAX_CONFIG_SIZE);
    return 0;
  }
  size_t n = 0;
  for (; ops->options[n].name; n++) {
    char err[256];
    if (n >= MAX_OPTIONS) {
      snprintf(why, len, "format '%s' has more than %d options (missing NULL terminator?)",
               ops->name, MAX_OPTIONS);
      return 0;
    }
    if (hqi_option_check(&ops->options[n], err, sizeof err)) {
      snprintf(why, len, "format '%s' option '%s': %s", ops->name, ops->options[n].name, err);
      return 0;
    }
    for (size_t j = 0; j < n; j++) {
      if (strcmp(ops->options[j].name, ops->options[n].name) == 0) {
        snprintf(why, len, "format '%s' declares option '%s' twice", ops->name,
                 ops->options[n].name);
        return 0;
      }
    }
    if (strcmp(ops->options[n].name, "plugin") == 0) {
      snprintf(why, len, "format '%s' declares option 'plugin', a key the core reserves",
               ops->name);
      return 0;
    }
  }
  *n_options = n;
  return 1;
}

static int load_one(hq_plugins *set, const char *file) {
  char why[768];
  if (strlen(file) >= PATH_MAX) return reject(set, file, "path is longer than PATH_MAX");
  dlerror();
  void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!h) {
    const char *e = dlerror();
    return reject(set, file, "dlopen failed: %s", e ? e : "unknown error");
  }
  union { void *obj; hq_format_entry_fn fn; } entry;
  dlerror();
  entry.obj = dlsym(h, HQ_FORMAT_ENTRY_NAME);
  if (!entry.obj) {
    dlclose(h);
    return reject(set, file, "no entry point %s in the module (is it an hq format?)",
                  HQ_FORMAT_ENTRY_NAME);
  }
  hq_clear_error();
  const hq_format_ops *ops = entry.fn(&hqi_host_api);
  if (!ops) {
    const char *msg = hq_last_error();
    int rc = reject(set, file, "the module refused to load%s%s", msg[0] ? ": " : "", msg);
    dlclose(h);
    return rc;
  }
  if (ops->abi_major != HQ_ABI_MAJOR) {
    dlclose(h);
    return reject(set, file, "built for plugin ABI %u.%u, but this core implements ABI %u.%u "
                  "(major versions must match)", ops->abi_major, ops->abi_minor, HQ_ABI_MAJOR,
                  HQ_ABI_MINOR);
  }
  if (ops->abi_minor > HQ_ABI_MINOR) {
    dlclose(h);
    return reject(set, file, "built for plugin ABI %u.%u, newer than this core's %u.%u "
                  "(upgrade libhqcore)", ops->abi_major, ops->abi_minor, HQ_ABI_MAJOR,
                  HQ_ABI_MINOR);
  }
  if (ops->struct_size < HQ_FORMAT_OPS_V1_0_SIZE) {
    dlclose(h);
    return reject(set, file, "ops table struct_size %u is smaller than ABI 1.0's %zu bytes",
                  ops->struct_size, (size_t)HQ_FORMAT_OPS_V1_0_SIZE);
  }
  hq_plugin *p = calloc(1, sizeof *p);
  if (!p) {
    dlclose(h);
    return hqi_error(HQ_ENOMEM, "out of memory");
  }
  /* Read only what the module declared; later fields stay NULL. */
  size_t n = ops->struct_size < sizeof p->ops ? ops->struct_size : sizeof p->ops;
  memcpy(&p->ops, ops, n);
  if (!check_ops(&p->ops, &p->n_options, why, sizeof why)) {
    free(p);
    dlclose(h);
    return reject(set, file, "%s", why);
  }
  const hq_plugin *dup = hq_plugins_find(set, p->ops.name);
  if (dup) {
    int rc = reject(set, file, "duplicate format name '%s' (already provided by %s)",
                    p->ops.name, dup->file);
    free(p);
    dlclose(h);
    return rc;
  }
  p->file = hqi_strdup(file);
  p->handle = h;
  if (!p->file || hqi_vec_push(&set->plugins, p)) {
    free(p->file);
    free(p);
    dlclose(h);
    return hqi_error(HQ_ENOMEM, "out of memory");
  }
  return HQ_OK;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Load every *.so of one directory, in name order. A missing directory is not an error. */
static int scan_dir(hq_plugins *set, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return HQ_OK;
  hqi_vec files = {0};
  int rc = HQ_OK;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len < 4 || strcmp(e->d_name + len - 3, ".so") != 0) continue;
    char *path = hqi_asprintf("%s/%s", dir, e->d_name);
    if (!path || hqi_vec_push(&files, path)) {
      free(path);
      rc = hqi_error(HQ_ENOMEM, "out of memory");
      break;
    }
  }
  closedir(d);
  if (files.n) qsort(files.v, files.n, sizeof *files.v, cmp_str);
  for (size_t i = 0; i < files.n && rc == HQ_OK; i++) {
    struct stat st;
    if (stat(files.v[i], &st) == 0 && S_ISREG(st.st_mode)) rc = load_one(set, files.v[i]);
  }
  for (size_t i = 0; i < files.n; i++) free(files.v[i]);
  hqi_vec_free(&files);
  return rc;
}

static int add_dir(hq_plugins *set, const char *dir, size_t len) {
  if (len == 0) return HQ_OK; /* never the current directory implicitly */
  char *d = hqi_strndup(dir, len);
  if (!d) return hqi_error(HQ_ENOMEM, "out of memory");
  for (size_t i = 0; i < set->dirs.n; i++) {
    if (strcmp(set->dirs.v[i], d) == 0) {
      free(d);
      return HQ_OK;
    }
  }
  if (hqi_vec_push(&set->dirs, d)) {
    free(d);
    return HQ_ENOMEM;
  }
  return HQ_OK;
}

static int add_path_list(hq_plugins *set, const char *list) {
  while (list && *list) {
    const char *colon = strchr(list, ':');
    size_t len = colon ? (size_t)(colon - list) : strlen(list);
    int rc = add_dir(set, list, len);
    if (rc) return rc;
    list = colon ? colon + 1 : NULL;
  }
  return HQ_OK;
}

int hq_plugins_open(const char *const *dirs, size_t ndirs, unsigned flags, hq_plugins **out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_plugins_open: out is NULL");
  *out = NULL;
  hq_plugins *set = calloc(1, sizeof *set);
  if (!set) return hqi_error(HQ_ENOMEM, "out of memory");
  set->refs = 1;
  int rc = HQ_OK;
  if (!(flags & HQ_PLUGINS_NO_ENV)) rc = add_path_list(set, getenv("HQ_PLUGIN_PATH"));
  for (size_t i = 0; i < ndirs && rc == HQ_OK; i++)
    if (dirs[i]) rc = add_dir(set, dirs[i], strlen(dirs[i]));
  if (rc == HQ_OK && !(flags & HQ_PLUGINS_NO_DEFAULT))
    rc = add_dir(set, HQ_PLUGINDIR, strlen(HQ_PLUGINDIR));
  for (size_t i = 0; i < set->dirs.n && rc == HQ_OK; i++) rc = scan_dir(set, set->dirs.v[i]);
  if (rc) {
    hq_plugins_close(set);
    return rc;
  }
  *out = set;
  return HQ_OK;
}

void hqi_plugins_retain(hq_plugins *set) { __atomic_add_fetch(&set->refs, 1, __ATOMIC_RELAXED); }

void hq_plugins_close(hq_plugins *set) {
  if (!set || __atomic_sub_fetch(&set->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  for (size_t i = 0; i < set->plugins.n; i++) {
    hq_plugin *p = set->plugins.v[i];
    dlclose(p->handle); /* RTLD_NODELETE: the code stays mapped */
    free(p->file);
    free(p);
  }
  for (size_t i = 0; i < set->rejected.n; i++) {
    rejected *r = set->rejected.v[i];
    free(r->file);
    free(r->reason);
    free(r);
  }
  for (size_t i = 0; i < set->dirs.n; i++) free(set->dirs.v[i]);
  hqi_vec_free(&set->plugins);
  hqi_vec_free(&set->rejected);
  hqi_vec_free(&set->dirs);
  free(set);
}

size_t hq_plugins_dir_count(const hq_plugins *set) { return set ? set->dirs.n : 0; }
const char *hq_plugins_dir(const hq_plugins *set, size_t i) {
  return set && i < set->dirs.n ? set->dirs.v[i] : NULL;
}
size_t hq_plugins_count(const hq_plugins *set) { return set ? set->plugins.n : 0; }
const hq_plugin *hq_plugins_get(const hq_plugins *set, size_t i) {
  return set && i < set->plugins.n ? set->plugins.v[i] : NULL;
}

const hq_plugin *hq_plugins_find(const hq_plugins *set, const char *name) {
  if (!set || !name) return NULL;
  for (size_t i = 0; i < set->plugins.n; i++) {
    const hq_plugin *p = set->plugins.v[i];
    if (strcmp(p->ops.name, name) == 0) return p;
  }
  return NULL;
}

size_t hq_plugins_rejected_count(const hq_plugins *set) { return set ? set->rejected.n : 0; }
const char *hq_plugins_rejected_file(const hq_plugins *set, size_t i) {
  return set && i < set->rejected.n ? ((rejected *)set->rejected.v[i])->file : NULL;
}
const char *hq_plugins_rejected_reason(const hq_plugins *set, size_t i) {
  return set && i < set->rejected.n ? ((rejected *)set->rejected.v[i])->reason : NULL;
}

const char *hq_plugin_name(const hq_plugin *p) { return p ? p->ops.name : NULL; }
const char *hq_plugin_version(const hq_plugin *p) { return p ? p->ops.version : NULL; }
const char *hq_plugin_description(const hq_plugin *p) {
  return p && p->ops.description ? p->ops.description : "";
}
const char *hq_plugin_file(const hq_plugin *p) { return p ? p->file : NULL; }
uint64_t hq_plugin_caps(const hq_plugin *p) { return p ? p->ops.caps : 0; }
unsigned hq_plugin_abi_minor(const hq_plugin *p) { return p ? p->ops.abi_minor : 0; }
const hq_option *hq_plugin_options(const hq_plugin *p) { return p ? p->ops.options : NULL; }
