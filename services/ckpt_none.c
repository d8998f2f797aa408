/*
** ckpt_none.c -- the checkpoint calls of a libhqtrain built without jansson (configure found no
** libjansson-dev): each says so with HQ_ENOTSUP.
*/
#include "config.h"
#include "svc.h"

static int no_ckpt(void) {
  return hq_set_error(HQ_ENOTSUP, "checkpoints are not built in this libhqtrain (configure found "
                      "no jansson: install the Debian package libjansson-dev and rebuild)");
}

int hq_ckpt_writer_open(const char *path, hq_ckpt_writer **out) {
  (void)path;
  if (out) *out = NULL;
  return no_ckpt();
}
int hq_ckpt_add_qtensor(hq_ckpt_writer *w, hq_ctx *ctx, const char *name, const hq_qtensor *qt) {
  (void)w;
  (void)ctx;
  (void)name;
  (void)qt;
  return no_ckpt();
}
int hq_ckpt_add_tensor(hq_ckpt_writer *w, hq_ctx *ctx, const char *name, const hq_tensor *t) {
  (void)w;
  (void)ctx;
  (void)name;
  (void)t;
  return no_ckpt();
}
int hq_ckpt_add_meta(hq_ckpt_writer *w, const char *key, const char *value) {
  (void)w;
  (void)key;
  (void)value;
  return no_ckpt();
}
int hq_ckpt_writer_close(hq_ckpt_writer *w) {
  (void)w;
  return no_ckpt();
}
void hq_ckpt_writer_abort(hq_ckpt_writer *w) { (void)w; }
int hq_ckpt_open(const char *path, hq_ckpt **out) {
  (void)path;
  if (out) *out = NULL;
  return no_ckpt();
}
int hq_ckpt_open_ex(const char *path, const hq_ckpt_open_opts *opts, hq_ckpt **out) {
  (void)path;
  (void)opts;
  if (out) *out = NULL;
  return no_ckpt();
}
void hq_ckpt_close(hq_ckpt *c) { (void)c; }
const char *hq_ckpt_meta(const hq_ckpt *c, const char *key) {
  (void)c;
  (void)key;
  return NULL;
}
int hq_ckpt_load_qtensor(hq_ckpt *c, hq_ctx *ctx, const char *name, hq_qtensor *qt) {
  (void)c;
  (void)ctx;
  (void)name;
  (void)qt;
  return no_ckpt();
}
int hq_ckpt_entry(const hq_ckpt *c, const char *name, hq_ckpt_entry_info *out) {
  (void)c;
  (void)name;
  (void)out;
  return no_ckpt();
}
const char *hq_ckpt_entry_name(const hq_ckpt *c, size_t i) {
  (void)c;
  (void)i;
  return NULL;
}
const char *hq_ckpt_meta_key(const hq_ckpt *c, size_t i) {
  (void)c;
  (void)i;
  return NULL;
}
int hq_ckpt_verify(hq_ckpt *c, uint64_t *bytes) {
  (void)c;
  if (bytes) *bytes = 0;
  return no_ckpt();
}
int hq_ckpt_load_tensor(hq_ckpt *c, hq_ctx *ctx, const char *name, hq_tensor *t) {
  (void)c;
  (void)ctx;
  (void)name;
  (void)t;
  return no_ckpt();
}
