/*
** options.c -- parsing recipe values against a module's option table, and checking the table.
*/
#include "config.h"
#include "hq_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *hq_opt_type_name(hq_opt_type t) {
  switch (t) {
  case HQ_OPT_BOOL: return "bool";
  case HQ_OPT_INT: return "int";
  case HQ_OPT_FLOAT: return "float";
  case HQ_OPT_ENUM: return "enum";
  case HQ_OPT_STRING: return "string";
  }
  return "invalid";
}

/* Index of `text` among the '|'-separated choices, or -1. */
static int choice_index(const char *choices, const char *text) {
  size_t tl = strlen(text);
  int idx = 0;
  for (const char *p = choices; p && *p; idx++) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == tl && strncmp(p, text, len) == 0) return idx;
    p = bar ? bar + 1 : NULL;
  }
  return -1;
}

static int ranged(const hq_option *o) { return o->min <= o->max; }

int hqi_option_parse(const hq_option *o, const char *text, hq_optval *out, char *err,
                     size_t err_len) {
  memset(out, 0, sizeof *out);
  if (!text) text = "";
  switch (o->type) {
  case HQ_OPT_BOOL:
    if (!strcasecmp(text, "true") || !strcasecmp(text, "yes") || !strcasecmp(text, "on") ||
        !strcmp(text, "1")) {
      out->i = 1;
      return HQ_OK;
    }
    if (!strcasecmp(text, "false") || !strcasecmp(text, "no") || !strcasecmp(text, "off") ||
        !strcmp(text, "0")) {
      out->i = 0;
      return HQ_OK;
    }
    snprintf(err, err_len, "'%s' is not a bool (true/false, yes/no, on/off, 1/0)", text);
    return HQ_EPARSE;
  case HQ_OPT_INT: {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 0);
    if (!*text || *end || errno) {
      snprintf(err, err_len, "'%s' is not an integer", text);
      return HQ_EPARSE;
    }
    if (ranged(o) && ((double)v < o->min || (double)v > o->max)) {
      snprintf(err, err_len, "%lld is out of range [%.17g, %.17g]", v, o->min, o->max);
      return HQ_EPARSE;
    }
    out->i = v;
    return HQ_OK;
  }
  case HQ_OPT_FLOAT: {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!*text || *end || errno || !isfinite(v)) {
      snprintf(err, err_len, "'%s' is not a finite number", text);
      return HQ_EPARSE;
    }
    if (ranged(o) && (v < o->min || v > o->max)) {
      snprintf(err, err_len, "%s is out of range [%.17g, %.17g]", text, o->min, o->max);
      return HQ_EPARSE;
    }
    out->f = v;
    return HQ_OK;
  }
  case HQ_OPT_ENUM: {
    int i = choice_index(o->choices, text);
    if (i < 0) {
      snprintf(err, err_len, "'%s' is not one of %s", text, o->choices ? o->choices : "(none)");
      return HQ_EPARSE;
    }
    out->i = i;
    return HQ_OK;
  }
  case HQ_OPT_STRING:
    out->s = text;
    return HQ_OK;
  }
  snprintf(err, err_len, "option has an invalid type %d", (int)o->type);
  return HQ_EPARSE;
}

int hqi_option_check(const hq_option *o, char *err, size_t err_len) {
  for (const char *c = o->name; *c; c++) {
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) {
      snprintf(err, err_len, "name is not [a-z0-9_]+");
      return HQ_EABI;
    }
  }
  if (o->name[0] == '\0' || strlen(o->name) > 40) {
    snprintf(err, err_len, "name must be 1-40 characters");
    return HQ_EABI;
  }
  if (o->type < HQ_OPT_BOOL || o->type > HQ_OPT_STRING) {
    snprintf(err, err_len, "invalid type %d", (int)o->type);
    return HQ_EABI;
  }
  if (o->type == HQ_OPT_ENUM && (!o->choices || !o->choices[0])) {
    snprintf(err, err_len, "enum without choices");
    return HQ_EABI;
  }
  if (!o->def) {
    snprintf(err, err_len, "no default value");
    return HQ_EABI;
  }
  hq_optval v;
  char why[200];
  if (hqi_option_parse(o, o->def, &v, why, sizeof why)) {
    snprintf(err, err_len, "invalid default: %s", why);
    return HQ_EABI;
  }
  return HQ_OK;
}

// --- format instances -----------------------------------------------------------------------

int hqi_format_create(const char *name, const hq_plugin *plugin, hq_plugins *set,
                      const char *const *texts, hqi_format **out) {
  *out = NULL;
  const hq_format_ops *ops = &plugin->ops;
  size_t n = plugin->n_options;
  hqi_format *f = hqi_calloc(1, sizeof *f);
  if (!f) return hqi_error(HQ_ENOMEM, "out of memory");
  f->refs = 1;
  f->plugin = plugin;
  f->name = hqi_strdup(name);
  f->vals = hqi_calloc(n + 1, sizeof *f->vals);
  f->val_text = hqi_calloc(n + 1, sizeof *f->val_text);
  f->opt_text = hqi_calloc(2 * n + 1, sizeof *f->opt_text);
  if (ops->config_size) f->cfg = hqi_calloc(1, ops->config_size);
  if (!f->name || !f->vals || !f->val_text || !f->opt_text || (ops->config_size && !f->cfg)) {
    hqi_format_release(f);
    return hqi_error(HQ_ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    const hq_option *o = &ops->options[i];
    const char *t = texts && texts[i] ? texts[i] : o->def;
    f->opt_text[i] = o->name;
    f->opt_text[n + i] = o->def;
    f->val_text[i] = hqi_strdup(t);
    if (!f->val_text[i]) {
      hqi_format_release(f);
      return hqi_error(HQ_ENOMEM, "out of memory");
    }
    char why[300];
    if (hqi_option_parse(o, f->val_text[i], &f->vals[i], why, sizeof why)) {
      hqi_format_release(f);
      return hqi_error(HQ_EPARSE, "option '%s' (%s): %s", o->name, hq_opt_type_name(o->type),
                       why);
    }
  }
  hq_clear_error();
  const hqi_fpenv fe = hqi_fp_enter(); /* constants a module derives from its options */
  int rc = ops->configure(f->cfg, f->vals, &hqi_host_api);
  hqi_fp_leave(fe);
  if (rc) {
    const char *msg = hq_last_error();
    char copy[512];
    snprintf(copy, sizeof copy, "%s", msg[0] ? msg : hq_strerror(rc));
    hqi_format_release(f);
    return hqi_error(rc == HQ_EPARSE ? HQ_EPARSE : HQ_EINVAL, "%s", copy);
  }
  f->caps = ops->instance_caps ? ops->instance_caps(f->cfg) : ops->caps;
  f->set = set;
  hqi_plugins_retain(set);
  *out = f;
  return HQ_OK;
}

hqi_format *hqi_format_retain(hqi_format *f) {
  if (f) __atomic_add_fetch(&f->refs, 1, __ATOMIC_RELAXED);
  return f;
}

void hqi_format_release(hqi_format *f) {
  if (!f || __atomic_sub_fetch(&f->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (f->cfg && f->set && f->plugin->ops.release) f->plugin->ops.release(f->cfg);
  if (f->val_text)
    for (size_t i = 0; i < f->plugin->n_options; i++) free(f->val_text[i]);
  free(f->val_text);
  free(f->opt_text);
  free(f->vals);
  free(f->cfg);
  free(f->name);
  if (f->set) hq_plugins_close(f->set);
  free(f);
}
