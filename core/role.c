/*
** role.c -- role patterns "module_type:tensor_type:name" (each part a glob) and their ordering.
*/
#include "config.h"
#include "hq_internal.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int hqi_role_in(const hq_role *role, const char *what, hq_role *out) {
  if (!role) return hqi_error(HQ_EINVAL, "%s: the role is NULL", what);
  int rc = hqi_struct_in(out, sizeof *out, role, role->struct_size, HQ_ROLE_SIZE_0_3, "hq_role");
  return rc ? hqi_error_prefix(rc, "%s", what) : HQ_OK;
}

int hq_role_parse(const char *text, char *buf, size_t buf_len, hq_role *out) {
  if (!text || !buf || !out) return hqi_error(HQ_EINVAL, "hq_role_parse: NULL argument");
  size_t n = strlen(text);
  if (n + 1 > buf_len) return hqi_error(HQ_EINVAL, "role '%s' is too long", text);
  memcpy(buf, text, n + 1);
  char *c1 = strchr(buf, ':');
  char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
  if (!c1 || !c2 || strchr(c2 + 1, ':'))
    return hqi_error(HQ_EINVAL, "role '%s' is not module_type:tensor_type:name", text);
  *c1 = *c2 = '\0';
  out->struct_size = sizeof *out;
  out->module_type = buf;
  out->tensor_type = c1 + 1;
  out->name = c2 + 1;
  return HQ_OK;
}

/* Count '*', '?' and literal characters of one glob part; reject a malformed one. */
static int scan_glob(const char *s, int *stars, int *qmarks, int *lit, char *err,
                     size_t err_len) {
  for (const char *p = s; *p; p++) {
    if (*p == '*') {
      (*stars)++;
    } else if (*p == '?') {
      (*qmarks)++;
    } else if (*p == '[' || *p == ']' || *p == '\\') {
      snprintf(err, err_len, "pattern part '%s' holds '%c': role patterns use only '*' and '?' "
               "wildcards", s, *p);
      return HQ_EPARSE;
    } else {
      (*lit)++;
    }
  }
  return HQ_OK;
}

int hqi_pattern_parse(const char *text, hqi_pattern *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  const char *c1 = strchr(text, ':');
  const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
  if (!c1 || !c2 || strchr(c2 + 1, ':')) {
    snprintf(err, err_len, "role pattern '%s' is not module_type:tensor_type:name", text);
    return HQ_EPARSE;
  }
  out->part[0] = hqi_strndup(text, (size_t)(c1 - text));
  out->part[1] = hqi_strndup(c1 + 1, (size_t)(c2 - c1 - 1));
  out->part[2] = hqi_strdup(c2 + 1);
  if (!out->part[0] || !out->part[1] || !out->part[2]) {
    hqi_pattern_free(out);
    snprintf(err, err_len, "out of memory");
    return HQ_ENOMEM;
  }
  for (int i = 0; i < 3; i++) {
    if (out->part[i][0] == '\0') {
      snprintf(err, err_len, "role pattern '%s' has an empty part (use '*' to match anything)",
               text);
      hqi_pattern_free(out);
      return HQ_EPARSE;
    }
    int rc = scan_glob(out->part[i], &out->stars, &out->qmarks, &out->literals, err, err_len);
    if (rc) {
      hqi_pattern_free(out);
      return rc;
    }
  }
  return HQ_OK;
}

void hqi_pattern_free(hqi_pattern *p) {
  for (int i = 0; i < 3; i++) {
    free(p->part[i]);
    p->part[i] = NULL;
  }
}

int hqi_pattern_match(const hqi_pattern *p, const hq_role *role) {
  const char *s[3] = {role->module_type ? role->module_type : "",
                      role->tensor_type ? role->tensor_type : "", role->name ? role->name : ""};
  for (int i = 0; i < 3; i++)
    if (fnmatch(p->part[i], s[i], 0) != 0) return 0;
  return 1;
}

/* Fewer '*' first, then more literal characters, then fewer '?'. */
int hqi_pattern_compare(const hqi_pattern *a, const hqi_pattern *b) {
  if (a->stars != b->stars) return a->stars < b->stars ? 1 : -1;
  if (a->literals != b->literals) return a->literals > b->literals ? 1 : -1;
  if (a->qmarks != b->qmarks) return a->qmarks < b->qmarks ? 1 : -1;
  return 0;
}

/* outer contains inner, part by part: equal text, outer "*", or inner literal matched by outer. */
int hqi_pattern_contains(const hqi_pattern *outer, const hqi_pattern *inner) {
  for (int i = 0; i < 3; i++) {
    const char *o = outer->part[i], *in = inner->part[i];
    if (strcmp(o, "*") == 0 || strcmp(o, in) == 0) continue;
    if (strpbrk(in, "*?") == NULL && fnmatch(o, in, 0) == 0) continue;
    return 0;
  }
  return 1;
}
