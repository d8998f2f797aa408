/*
** provider.c -- the GEMM providers compiled into libhqcore from gemm/ (checked once, like a
** loaded module) and the checks every provider table passes, whether it comes from there or from
** a module the loader found (loader.c keeps those, per set).
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

int hqi_provider_check(const hq_gemm_provider *t, hqi_provider *out, char *why, size_t len) {
  memset(out, 0, sizeof *out);
  if (!hqi_abi_compatible("GEMM provider", t->abi_major, t->abi_minor, HQ_GEMM_ABI_MAJOR,
                          HQ_GEMM_ABI_MINOR, why, len))
    return 0;
  if (t->struct_size < PROVIDER_SIZE_1_0) {
    snprintf(why, len, "provider table struct_size %u is smaller than ABI 1.0's %zu bytes",
             t->struct_size, (size_t)PROVIDER_SIZE_1_0);
    return 0;
  }
  /* read only what the provider declared; later fields stay zero */
  memcpy(&out->ops, t, t->struct_size < sizeof out->ops ? t->struct_size : sizeof out->ops);
  const hq_gemm_provider *o = &out->ops;
  if (!hqi_name_ok("GEMM provider", o->name, why, len)) return 0;
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
