/*
** format.c -- format instances: one [format] section (or an implicit one) of a recipe, or one
** direction of a direct quantizer: its module, the option values parsed against the module's
** table (options.c) and the configuration the module made of them. Refcounted; an instance keeps
** its plugin set (loader.c) alive.
*/
#include "config.h"
#include "hq_internal.h"

#include <stdio.h>
#include <stdlib.h>

int hqi_format_create(const char *name, const hq_plugin *plugin, hq_plugins *set,
                      const char *const *texts, hqi_format **out) {
  *out = NULL;
  const hq_format_ops *ops = &plugin->ops;
  size_t n = plugin->n_options;
  hqi_format *f = hqi_calloc(1, sizeof *f);
  if (!f) return hqi_error(HQ_ENOMEM, "out of memory");
  static uint64_t next_id;
  f->refs = 1;
  f->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
  f->plugin = plugin;
  f->name = hqi_strdup(name);
  f->vals = hqi_calloc(n + 1, sizeof *f->vals);
  f->val_text = hqi_calloc(n + 1, sizeof *f->val_text);
  if (ops->config_size) f->cfg = hqi_calloc(1, ops->config_size);
  if (!f->name || !f->vals || !f->val_text || (ops->config_size && !f->cfg)) {
    hqi_format_release(f);
    return hqi_error(HQ_ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    const hq_option *o = &ops->options[i];
    const char *t = texts && texts[i] ? texts[i] : o->def;
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
  int rc = hqi_plugin_rc(ops->configure(f->cfg, f->vals, &hqi_host_api), ops->name, "configure");
  hqi_fp_leave(fe);
  if (rc) {
    const char *msg = hq_last_error();
    char copy[512];
    snprintf(copy, sizeof copy, "%s", msg[0] ? msg : hq_strerror(rc));
    hqi_format_release(f);
    /* The module's status is the caller's answer (HQ_ENOMEM is worth a retry, HQ_ENOTSUP names
       an unsupported combination) */
    return hqi_error(rc, "%s", copy);
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
  free(f->vals);
  free(f->cfg);
  free(f->name);
  if (f->set) hq_plugins_close(f->set);
  free(f);
}
