/*
** provider.c -- the GEMM providers a GEMM may ask (hq/gemm_provider.h): the ones compiled into
** libhqcore from gemm/ (checked once, like a loaded module) and the checks every provider table
** passes, whether it comes from there or from a module the loader found.
*/
#include "config.h"
#include "hq_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The built-in providers' entries (gemm/<name>/, compiled with HQ_GEMM_BUILTIN). */
const hq_gemm_provider *hqi_gemm_cublaslt(const hq_gemm_host *host);
const hq_gemm_provider *hqi_gemm_fused_hopper(const hq_gemm_host *host);
const hq_gemm_provider *hqi_gemm_emulated(const hq_gemm_host *host);

/* The smallest table of ABI 1.0: everything up to run. */
#define PROVIDER_SIZE_1_0 (offsetof(hq_gemm_provider, run) + sizeof(void (*)(void)))

static int valid_name(const char *s) {
  size_t n = 0;
  if (!s) return 0;
  for (; s[n]; n++) {
    const char c = s[n];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return 0;
  }
  return n >= 1 && n <= 31;
}

int hqi_provider_check(const hq_gemm_provider *t, hqi_provider *out, char *why, size_t len) {
  memset(out, 0, sizeof *out);
  if (t->abi_major != HQ_GEMM_ABI_MAJOR) {
    snprintf(why, len, "built for GEMM provider ABI %u (requires %u.%u), but this core "
             "implements %u.%u (major versions must match)", t->abi_major, t->abi_major,
             t->abi_minor, HQ_GEMM_ABI_MAJOR, HQ_GEMM_ABI_MINOR);
    return 0;
  }
  if (t->abi_minor > HQ_GEMM_ABI_MINOR) {
    snprintf(why, len, "requires GEMM provider ABI %u.%u, newer than this core's %u.%u "
             "(upgrade libhqcore)", t->abi_major, t->abi_minor, HQ_GEMM_ABI_MAJOR,
             HQ_GEMM_ABI_MINOR);
    return 0;
  }
  if (t->struct_size < PROVIDER_SIZE_1_0) {
    snprintf(why, len, "provider table struct_size %u is smaller than ABI 1.0's %zu bytes",
             t->struct_size, (size_t)PROVIDER_SIZE_1_0);
    return 0;
  }
  /* read only what the provider declared; later fields stay zero */
  memcpy(&out->ops, t, t->struct_size < sizeof out->ops ? t->struct_size : sizeof out->ops);
  const hq_gemm_provider *o = &out->ops;
  if (!valid_name(o->name)) {
    snprintf(why, len, "GEMM provider name %s%s%s is not 1-31 characters of [a-z0-9_]",
             o->name ? "'" : "", o->name ? o->name : "(NULL)", o->name ? "'" : "");
    return 0;
  }
  const char *missing = !o->version ? "version" : !o->accepts ? "accepts" : !o->run ? "run" : NULL;
  if (missing) {
    snprintf(why, len, "GEMM provider '%s' lacks the required field '%s'", o->name, missing);
    return 0;
  }
  return 1;
}

static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;
static hqi_provider builtin[3];
static const hqi_provider *builtin_list[3];
static size_t n_builtin;

static void builtin_init(void) {
  const hq_gemm_provider *(*const entries[])(const hq_gemm_host *) = {
      hqi_gemm_cublaslt, hqi_gemm_fused_hopper, hqi_gemm_emulated};
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
    const hq_gemm_provider *t = entries[i](&hqi_gemm_host);
    char why[256];
    /* a built-in table that fails its check is a bug of this tree, which the loader's tests and
       hq info would show: it is left out rather than trusted */
    if (!t || !hqi_provider_check(t, &builtin[n_builtin], why, sizeof why)) {
      hqi_log(NULL, 0, "built-in GEMM provider %zu refused: %s", i, t ? why : "no table");
      continue;
    }
    builtin[n_builtin].file = (char *)HQI_BUILTIN_FILE;
    builtin_list[n_builtin] = &builtin[n_builtin];
    n_builtin++;
  }
}

size_t hqi_providers_builtin(const hqi_provider *const **out) {
  pthread_once(&builtin_once, builtin_init);
  *out = builtin_list;
  return n_builtin;
}

/* Provider i of the list hq_gemm asks for formats of `set`: the set's and the built-in ones,
   by priority (ties: the set's first, in load order, then the built-in ones in theirs). */
static const hqi_provider *nth(const hq_plugins *set, size_t i) {
  const hqi_provider *const *b, *const *l = NULL;
  const size_t nb = hqi_providers_builtin(&b), nl = set ? hqi_plugins_providers(set, &l) : 0;
  const hqi_provider *all[64];
  size_t n = 0;
  for (size_t j = 0; j < nl && n < 64; j++) all[n++] = l[j];
  for (size_t j = 0; j < nb && n < 64; j++) all[n++] = b[j];
  for (size_t j = 1; j < n; j++) /* stable insertion sort by descending priority */
    for (size_t q = j; q > 0 && all[q]->ops.priority > all[q - 1]->ops.priority; q--) {
      const hqi_provider *t = all[q];
      all[q] = all[q - 1];
      all[q - 1] = t;
    }
  return i < n ? all[i] : NULL;
}

size_t hq_plugins_gemm_count(const hq_plugins *set) {
  const hqi_provider *const *b, *const *l;
  return hqi_providers_builtin(&b) + (set ? hqi_plugins_providers(set, &l) : 0);
}

int hq_plugins_gemm_info(const hq_plugins *set, size_t i, hq_gemm_provider_info *out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_plugins_gemm_info: out is NULL");
  const size_t floor = offsetof(hq_gemm_provider_info, file) + sizeof(const char *);
  if (out->struct_size < floor)
    return hqi_error(HQ_EINVAL, "hq_plugins_gemm_info: struct_size %u is smaller than %zu",
                     out->struct_size, floor);
  const hqi_provider *p = nth(set, i);
  if (!p)
    return hqi_error(HQ_ENOENT, "hq_plugins_gemm_info: there are %zu GEMM providers, not %zu",
                     hq_plugins_gemm_count(set), i + 1);
  hq_gemm_provider_info v;
  memset(&v, 0, sizeof v);
  v.struct_size = out->struct_size < sizeof v ? out->struct_size : (uint32_t)sizeof v;
  v.priority = p->ops.priority;
  v.name = p->ops.name;
  v.version = p->ops.version;
  v.description = p->ops.description ? p->ops.description : "";
  v.file = p->file;
  memcpy(out, &v, v.struct_size);
  return HQ_OK;
}
