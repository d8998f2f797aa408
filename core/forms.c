/*
** forms.c -- buffer forms (plugin ABI 2.4): a buffer a format moves itself for an FSDP gather or
** a save/restore (plugin.h, "Buffer forms"). Asks the module for a buffer's form and checks it,
** and runs the module's op that writes a form from a buffer (fsdp_extract, save) or a buffer
** from a form (fsdp_assign, restore). fsdp.c and the save/restore of quantizer.c call it; it
** calls neither.
*/
#include "config.h"
#include "hq_internal.h"

#include <stdint.h>
#include <string.h>

static const char *purpose_name(uint32_t purpose) {
  return purpose == HQ_FORM_FSDP ? "FSDP" : "save";
}

int hqi_format_has_forms(const hqi_format *f, uint32_t purpose) {
  const hq_format_ops *ops = &f->plugin->ops;
  /* the loader admits fsdp_extract only with fsdp_assign and buffer_form, save only with
     restore and buffer_form */
  return purpose == HQ_FORM_FSDP ? ops->fsdp_extract != NULL : ops->save != NULL;
}

int hqi_buffer_form(const hqi_format *f, const hq_storage *st, uint32_t i, uint32_t purpose,
                    const char *role, hq_buffer_form *out) {
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  if (!hqi_format_has_forms(f, purpose)) return HQ_OK;
  const hq_format_ops *ops = &f->plugin->ops;
  const hq_buffer *b = hq_storage_cbuf(st, i);
  hq_clear_error();
  int rc = hqi_plugin_rc(ops->buffer_form(f->cfg, &hqi_host_api, st, i, purpose, out), ops->name,
                         "buffer_form");
  if (rc)
    return hqi_error_prefix(rc, "role %s, %s format '%s' (plugin %s), %s form of buffer '%s'",
                            role, hq_dir_name(st->dir), f->name, ops->name,
                            purpose_name(purpose), b->name);
  out->struct_size = sizeof *out; /* what the module may not change */
  out->ptr = NULL;
  if (out->ndim == 0) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    return HQ_OK;
  }
  size_t n = 0;
  int ok = hqi_shape_bytes(out->dtype, out->ndim, out->shape, &n);
  if (ok && purpose == HQ_FORM_FSDP) /* rows along M, whole rows of M per shard */
    ok = out->ndim == 2 && out->m_div >= 1 && st->desc.shard_rows > 0 &&
         st->desc.shard_rows % out->m_div == 0 && out->shape[0] * out->m_div == st->rows &&
         out->shape[1] >= 1;
  if (!ok)
    return hqi_error(HQ_EABI, "role %s, %s format '%s': buffer_form() of plugin %s gave buffer "
                     "'%s' an invalid %s form (dtype %d, ndim %d, shape [%lld, %lld], m_div %d; "
                     "the storage has %lld rows, shard rows %lld)", role, hq_dir_name(st->dir),
                     f->name, ops->name, b->name, purpose_name(purpose), (int)out->dtype,
                     out->ndim, (long long)out->shape[0], (long long)out->shape[1], out->m_div,
                     (long long)st->rows, (long long)st->desc.shard_rows);
  out->bytes = n;
  return HQ_OK;
}

/* One of the four ops on ctx's stream, with the error prefixed by what failed. */
static int run(const hqi_format *f, hq_ctx *ctx, hq_storage *st, uint32_t i,
               const hq_buffer_form *form, uint32_t purpose, int to_form, const char *role) {
  const hq_format_ops *ops = &f->plugin->ops;
  const char *op = purpose == HQ_FORM_FSDP ? (to_form ? "fsdp_extract" : "fsdp_assign")
                                           : (to_form ? "save" : "restore");
  hq_call call;
  hqi_call_init(ctx, &call, 0, 0);
  hq_clear_error();
  const hqi_fpenv fe = hqi_fp_enter();
  int rc;
  if (purpose == HQ_FORM_FSDP)
    rc = to_form ? ops->fsdp_extract(f->cfg, &call, st, i, form)
                 : ops->fsdp_assign(f->cfg, &call, st, i, form);
  else
    rc = to_form ? ops->save(f->cfg, &call, st, i, form) : ops->restore(f->cfg, &call, st, i, form);
  hqi_fp_leave(fe);
  rc = hqi_plugin_rc(rc, ops->name, op);
  if (rc)
    return hqi_error_prefix(rc, "role %s, %s format '%s' (plugin %s), %s of buffer '%s'", role,
                            hq_dir_name(st->dir), f->name, ops->name, op,
                            hq_storage_cbuf(st, i)->name);
  return HQ_OK;
}

int hqi_form_write(const hqi_format *f, hq_ctx *ctx, const hq_storage *st, uint32_t i,
                   const hq_buffer_form *form, uint32_t purpose, const char *role) {
  /* the op takes the storage as const: it reads the buffer and writes the form */
  return run(f, ctx, (hq_storage *)st, i, form, purpose, 1, role);
}

int hqi_form_read(const hqi_format *f, hq_ctx *ctx, hq_storage *st, uint32_t i,
                  const hq_buffer_form *form, uint32_t purpose, const char *role) {
  return run(f, ctx, st, i, form, purpose, 0, role);
}
