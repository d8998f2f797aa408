/*
** bench_spec.c -- see bench_spec.h.
*/
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "bench_spec.h"

int bench_recipe_text(const char *spec, const char *name, char *out, size_t len, char *label,
                      size_t label_len) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", spec);
  char *save = NULL, *tok = strtok_r(buf, " ,", &save);
  if (!tok) return -1;
  size_t n = (size_t)snprintf(out, len, "[format %s]\nplugin = %s\n", name, tok);
  if (label) snprintf(label, label_len, "%s", tok);
  while ((tok = strtok_r(NULL, " ,", &save)) != NULL) {
    char *eq = strchr(tok, '=');
    if (!eq) return -1;
    *eq = '\0';
    n += (size_t)snprintf(out + n, len - n, "%s = %s\n", tok, eq + 1);
    if (label) {
      size_t l = strlen(label);
      snprintf(label + l, label_len - l, " %s=%s", tok, eq + 1);
    }
  }
  snprintf(out + n, len - n, "[role *:*:*]\nrowwise = %s\ncolumnwise = %s\n", name, name);
  return 0;
}

int bench_spec_missing(const hq_plugins *set, const char *spec) {
  spec += strspn(spec, " ,"); /* as bench_recipe_text reads it */
  const size_t n = strcspn(spec, " ,");
  char name[256];
  if (n == 0 || n >= sizeof name) return 0;
  memcpy(name, spec, n);
  name[n] = '\0';
  if (!strcmp(name, "identity") || hq_plugins_find(set, name)) return 0;
  for (size_t i = 0; i < hq_plugins_rejected_count(set); i++) {
    const char *file = hq_plugins_rejected_file(set, i), *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (!strncmp(base, name, n) && !strcmp(base + n, ".so")) return 0;
  }
  return 1;
}
