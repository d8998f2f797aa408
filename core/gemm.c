/*
** gemm.c -- hq_gemm's dispatch. Each operand is resolved to the direction its transpose flag
** needs; shapes, D, the bias and the transforms are checked; then the GEMM providers
** (hq/gemm_provider.h) are asked in order of priority -- a format module's own gemm op first when
** both operands come from it -- through a per-context cache of their predicates, and the first
** that takes the problem runs it. No product is computed here: the providers in gemm/ do that.
** Also the linear-layer helpers and the mixture-of-experts calls, built on hq_gemm.
**
** Convention (cuBLAS, column-major): A is [A0, A1] row-major, i.e. a column-major A1 x A0 matrix
** with ld = A1; m = transa ? A0 : A1, k = transa ? A1 : A0, n = transb ? B1 : B0; D is row-major
** [n, m] = column-major m x n with ld = m.
*/
#include "config.h"
#include "hq_internal.h"
#include "hq/numerics.h" /* hq_load_hp */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *hq_gemm_path_name(uint32_t path) {
  switch (path) {
  case HQ_GEMM_PATH_NATIVE: return "native";
  case HQ_GEMM_PATH_EMULATED_BF16: return "emulated-bf16";
  case HQ_GEMM_PATH_EMULATED_F32: return "emulated-f32";
  case HQ_GEMM_PATH_CPU: return "cpu";
  case HQ_GEMM_PATH_FUSED_BF16: return "fused-bf16";
  default: return "none";
  }
}

// --- operands ---------------------------------------------------------------------------------

static const char *opname(const hqi_gop *o) {
  return o->qt ? o->qt->role : "high-precision tensor";
}

/* What a format module offers a GEMM, decided by what its table has -- its size (a table of the
   2.1 layout was written against a header that defines HQ_CALL_DEQ_RAW), its operations and its
   caps -- never by the minor it requires, which says only how old a core it runs on. */
static uint32_t module_gemm_flags(const hqi_format *f) {
  const hq_format_ops *o = &f->plugin->ops;
  uint32_t fl = 0;
  if (o->struct_size >= HQ_FORMAT_OPS_SIZE_2_1) fl |= HQ_GEMM_OP_RAW;
  if ((fl & HQ_GEMM_OP_RAW) && o->tensor_factor) fl |= HQ_GEMM_OP_FACTOR;
  if ((fl & HQ_GEMM_OP_FACTOR) && (f->caps & HQ_CAP_DEQ_FACTOR)) fl |= HQ_GEMM_OP_FOLDS;
  if ((fl & HQ_GEMM_OP_RAW) && (f->caps & HQ_CAP_DEQ_ROW_FACTOR)) fl |= HQ_GEMM_OP_ROWF;
  return fl;
}

static int resolve(const hq_ctx *ctx, hq_operand in, int is_a, int trans, const char *what,
                   hqi_gop *o) {
  memset(o, 0, sizeof *o);
  o->label = is_a ? "A" : "B";
  o->what = what;
  o->pub.handle = o;
  o->kind.trans = trans;
  if (!!in.qt == !!in.hp)
    return hqi_error(HQ_EINVAL, "%s: operand %s must be exactly one of a qtensor and a "
                     "high-precision tensor", what, o->label);
  if (in.qt) {
    const hq_qtensor *qt = in.qt;
    if (qt->ctx->device != ctx->device)
      return hqi_error(HQ_EINVAL, "%s: operand %s (role %s) lives on device %d, the context runs "
                       "on %d", what, o->label, qt->role, qt->ctx->device, ctx->device);
    if (qt->saved)
      return hqi_error(HQ_ESTATE, "%s: operand %s (role %s) is saved (restore it first)", what,
                       o->label, qt->role);
    uint32_t dir = is_a ? (trans ? HQ_ROWWISE : HQ_COLWISE) : (trans ? HQ_COLWISE : HQ_ROWWISE);
    int d = dir == HQ_COLWISE;
    if (!qt->d[d].present)
      return hqi_error(HQ_ESTATE, "%s: operand %s (role %s) is used %s, which needs its %s copy, "
                       "but it holds %s (quantize it with that direction in its usage; hq never "
                       "requantizes silently)", what, o->label, qt->role,
                       trans ? "transposed" : "not transposed", hq_dir_name(dir),
                       qt->d[!d].present ? (d ? "only the rowwise copy" : "only the columnwise copy")
                                         : "no copy");
    o->qt = qt;
    o->fmt = qt->fmt[d];
    o->pub.st = &qt->d[d].st;
    o->pub.rows = qt->rows;
    o->pub.cols = qt->cols;
    o->pub.role = qt->role;
    o->kind.dir = dir;
    o->kind.desc = &o->pub.st->desc;
    o->kind.dtype = o->pub.st->desc.elem;
    o->kind.flags = module_gemm_flags(o->fmt);
    const hq_buffer *raw = hq_storage_role(o->pub.st, HQ_ROLE_RAW);
    if (raw && raw->dtype == HQ_BF16 && (o->kind.flags & HQ_GEMM_OP_RAW))
      o->kind.flags |= HQ_GEMM_OP_RAWCOPY; /* a layout fact: the same for every storage of fmt */
    o->kind.format = o->fmt->plugin->ops.name;
    return HQ_OK;
  }
  /* the message's prefix is formatted only on failure (hq_gemm's host time is per call) */
  int rc = hqi_tensor_in(in.hp, is_a ? "operand A" : "operand B", &o->hp);
  if (rc) return hqi_error_prefix(rc, "%s", what);
  if (o->hp.device != ctx->device)
    return hqi_error(HQ_EINVAL, "%s: operand %s is on device %d, the context runs on %d", what,
                     o->label, o->hp.device, ctx->device);
  o->pub.hp = &o->hp;
  o->pub.rows = o->hp.rows;
  o->pub.cols = o->hp.cols;
  o->pub.role = "high-precision tensor";
  o->kind.dtype = o->hp.dtype;
  o->kind.format = hq_dtype_name(o->hp.dtype);
  return HQ_OK;
}

static void copy_name(char *out, size_t n, const char *s) {
  size_t l = strlen(s);
  if (l >= n) l = n - 1;
  memcpy(out, s, l);
  out[l] = '\0';
}

/* Everything hq_gemm and hq_gemm_plan share: operands, shapes, transforms, the kind. */
typedef struct plan {
  hqi_gop a, b;
  hq_tensor d;
  int64_t m, n, k;
  hq_gemm_args args;
  hq_gemm_kind kind;
  const char *what;
  char what_buf[96];
  hq_gemm_info info;
} plan;

static const char *transform_name(uint32_t t) {
  return t == HQ_TRANSFORM_RHT16 ? "rht16" : t ? "other" : "none";
}

static int check_transforms(const plan *p) {
  const hq_operand_desc *da = p->a.kind.desc, *db = p->b.kind.desc;
  uint32_t ta = da ? da->transform : HQ_TRANSFORM_NONE, tb = db ? db->transform : HQ_TRANSFORM_NONE;
  uint64_t pa = da && ta ? da->transform_param : 0, pb = db && tb ? db->transform_param : 0;
  if (ta == tb && pa == pb) return HQ_OK;
  return hqi_error(HQ_EINVAL, "%s: operand A (%s, %s) carries transform %s (parameter 0x%llx) "
                   "along k but operand B (%s, %s) carries %s (parameter 0x%llx): a product of "
                   "differently transformed operands is meaningless; give both the same transform "
                   "(e.g. rht on both wgrad operands) or neither", p->what, opname(&p->a),
                   p->a.kind.dir ? hq_dir_name(p->a.kind.dir) : "high precision",
                   transform_name(ta), (unsigned long long)pa, opname(&p->b),
                   p->b.kind.dir ? hq_dir_name(p->b.kind.dir) : "high precision",
                   transform_name(tb), (unsigned long long)pb);
}

static int check_d(plan *p, const hq_ctx *ctx, const hq_tensor *D) {
  if (!D) {
    p->d = hq_tensor_2d(NULL, HQ_F32, ctx->device, p->n, p->m);
    return HQ_OK;
  }
  int rc = hqi_tensor_in(D, "D", &p->d);
  if (rc) return hqi_error_prefix(rc, "%s", p->what);
  if (p->d.dtype != HQ_F32 && p->d.dtype != HQ_BF16)
    return hqi_error(HQ_EINVAL, "%s: D must be f32 or bf16, not %s", p->what,
                     hq_dtype_name(p->d.dtype));
  if (p->d.device != ctx->device)
    return hqi_error(HQ_EINVAL, "%s: D is on device %d, the context runs on %d", p->what,
                     p->d.device, ctx->device);
  if (p->d.rows != p->n || p->d.cols != p->m)
    return hqi_error(HQ_ESHAPE, "%s: D is [%lld, %lld], the product is [n, m] = [%lld, %lld]",
                     p->what, (long long)p->d.rows, (long long)p->d.cols, (long long)p->n,
                     (long long)p->m);
  return HQ_OK;
}

static int prepare(hq_ctx *ctx, hq_operand A, int transa, hq_operand B, int transb,
                   const hq_tensor *D, const hq_gemm_args *argsp, const char *fn, plan *p) {
  memset(p, 0, sizeof *p);
  if (!ctx) return hqi_error(HQ_EINVAL, "%s: NULL context", fn);
  if (argsp) {
    int rc = hqi_struct_in(&p->args, sizeof p->args, argsp, argsp->struct_size,
                           offsetof(hq_gemm_args, what) + sizeof(const char *), "hq_gemm_args");
    if (rc) return rc;
  }
  if (p->args.what) {
    snprintf(p->what_buf, sizeof p->what_buf, "%s (%s)", fn, p->args.what);
    p->what = p->what_buf;
  } else {
    p->what = fn;
  }
  transa = !!transa;
  transb = !!transb;
  int rc = resolve(ctx, A, 1, transa, p->what, &p->a);
  if (!rc) rc = resolve(ctx, B, 0, transb, p->what, &p->b);
  if (rc) return rc;
  const hq_gemm_operand *a = &p->a.pub, *b = &p->b.pub;
  p->m = transa ? a->rows : a->cols;
  const int64_t ka = transa ? a->cols : a->rows;
  p->n = transb ? b->cols : b->rows;
  const int64_t kb = transb ? b->rows : b->cols;
  if (ka != kb)
    return hqi_error(HQ_ESHAPE, "%s: A [%lld, %lld] (%s) and B [%lld, %lld] (%s) do not agree on "
                     "k: %lld vs %lld", p->what, (long long)a->rows, (long long)a->cols,
                     transa ? "T" : "N", (long long)b->rows, (long long)b->cols,
                     transb ? "T" : "N", (long long)ka, (long long)kb);
  p->k = ka;
  if ((rc = check_d(p, ctx, D))) return rc;
  if (p->args.bias && p->args.bias_dtype != HQ_F32 && p->args.bias_dtype != HQ_BF16)
    return hqi_error(HQ_EINVAL, "%s: bias must be f32 or bf16, not %s", p->what,
                     hq_dtype_name(p->args.bias_dtype));
  if ((rc = check_transforms(p))) return rc;

  p->kind.struct_size = sizeof p->kind;
  p->kind.flags = p->args.flags & (HQ_GEMM_FORCE_EMULATED | HQ_GEMM_FUSED_ALWAYS |
                                   HQ_GEMM_NO_FUSED | HQ_GEMM_FAST_ACCUM);
  p->kind.device = ctx->device;
  p->kind.arch = ctx->arch;
  p->kind.a = p->a.kind;
  p->kind.b = p->b.kind;
  p->kind.d_dtype = p->d.dtype;
  p->info.struct_size = sizeof p->info;
  p->info.m = p->m;
  p->info.n = p->n;
  p->info.k = p->k;
  p->info.dir_a = p->a.kind.dir;
  p->info.dir_b = p->b.kind.dir;
  copy_name(p->info.format_a, sizeof p->info.format_a, p->a.kind.format);
  copy_name(p->info.format_b, sizeof p->info.format_b, p->b.kind.format);
  return HQ_OK;
}

// --- the providers' answers, cached per context --------------------------------------------------

/* What the providers answered for one kind of GEMM, cached per context: the
   candidates in the order they are asked, which ones accepted, and the first refusal's reason
   (the reason hq_gemm_info gives when a provider below it runs). */
typedef struct hqi_gemm_key {
  uint64_t w[4];                  /* format instance ids, directions / dtypes, D's dtype, flags */
  hq_operand_desc a, b;           /* the quantized operands' descriptors (zero: high precision) */
} hqi_gemm_key;
typedef struct hqi_gemm_choice {
  hqi_gemm_key key;               /* compared whole: a hit is the same kind, never a collision */
  uint32_t valid, n;
  const hqi_provider *cand[HQI_GEMM_CANDIDATES];
  uint32_t accepted;              /* bit i: cand[i] accepted */
  int32_t declined;               /* index of the first candidate that declined, -1 */
  char reason[sizeof ((hq_gemm_info *)0)->reason]; /* copied into hq_gemm_info whole */
} hqi_gemm_choice;
#define HQI_GEMM_CACHE 32

/* The key of a kind: the format instances (unique ids: they fix the module and so the set of
   providers), the directions, transposes and dtypes, D's dtype and the flags, and each
   descriptor whole (a layout could depend on the shape). */
static void choice_key(const plan *p, hqi_gemm_key *key) {
  const hq_gemm_kind *k = &p->kind;
  memset(key, 0, sizeof *key);
  key->w[0] = p->a.fmt ? p->a.fmt->id : 0;
  key->w[1] = p->b.fmt ? p->b.fmt->id : 0;
  key->w[2] = (uint64_t)k->a.dir | (uint64_t)k->a.trans << 2 | (uint64_t)k->a.dtype << 3 |
              (uint64_t)k->b.dir << 16 | (uint64_t)k->b.trans << 18 | (uint64_t)k->b.dtype << 19;
  key->w[3] = (uint64_t)k->d_dtype | (uint64_t)k->flags << 8;
  if (k->a.desc) memcpy(&key->a, k->a.desc, sizeof key->a);
  if (k->b.desc) memcpy(&key->b, k->b.desc, sizeof key->b);
}

/* The cache slot of a key: a few multiplies over the words that tell kinds apart most often
   (the whole key is compared on a hit, so the hash only spreads). */
static size_t choice_slot(const hqi_gemm_key *key) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  const uint64_t w[6] = {key->w[0], key->w[1], key->w[2], key->w[3],
                         (uint64_t)key->a.elem << 32 | key->a.scale_mode,
                         (uint64_t)key->b.elem << 32 | key->b.scale_mode};
  for (int i = 0; i < 6; i++) h = (h ^ w[i]) * 0xbf58476d1ce4e5b9ull;
  return (size_t)((h ^ h >> 31) % HQI_GEMM_CACHE);
}

/* Ask every candidate's predicate for p's kind, the candidates in the order hq_gemm asks them
   (hqi_providers_ordered over A's and B's sets). */
static void choice_fill(const plan *p, hqi_gemm_choice *c) {
  c->n = (uint32_t)hqi_providers_ordered(p->a.fmt ? p->a.fmt->set : NULL,
                                         p->b.fmt ? p->b.fmt->set : NULL, c->cand,
                                         HQI_GEMM_CANDIDATES);
  c->accepted = 0;
  c->declined = -1;
  c->reason[0] = '\0';
  for (uint32_t i = 0; i < c->n; i++) {
    hq_clear_error();
    const int rc = hqi_plugin_rc(c->cand[i]->ops.accepts(&hqi_gemm_host, &p->kind),
                                 c->cand[i]->ops.name, "accepts");
    if (rc == HQ_OK) {
      c->accepted |= 1u << i;
    } else if (c->declined < 0) {
      c->declined = (int32_t)i;
      snprintf(c->reason, sizeof c->reason, "%s", hq_last_error()[0] ? hq_last_error()
                                                                     : hq_strerror(rc));
    }
  }
  hq_clear_error();
}

/* The cached answers for p's kind (made on a miss; NULL only when the cache cannot be made). */
static const hqi_gemm_choice *choice_of(hq_ctx *ctx, const plan *p, hqi_gemm_choice *local) {
  hqi_gemm_key key;
  choice_key(p, &key);
  if (!ctx->gemm_cache) ctx->gemm_cache = hqi_calloc(HQI_GEMM_CACHE, sizeof *ctx->gemm_cache);
  hqi_gemm_choice *c = local;
  if (ctx->gemm_cache) {
    c = &ctx->gemm_cache[choice_slot(&key)];
    if (c->valid && !memcmp(&c->key, &key, sizeof key)) return c;
  }
  c->key = key;
  choice_fill(p, c);
  c->valid = 1;
  return c;
}

// --- dispatch ------------------------------------------------------------------------------------

/* A format module's own gemm op (ABI 2.1), when both operands come from one module that has one:
   asked before the providers, for each problem (its answer may depend on the shapes).
   HQ_ENOTSUP when there is none to ask or it declined (its reason then in p->info.reason). */
static int module_gemm(hq_ctx *ctx, plan *p, hq_gemm_run *r) {
  const hqi_format *fa = p->a.fmt, *fb = p->b.fmt;
  if (!fa || !fb || (p->kind.flags & HQ_GEMM_FORCE_EMULATED)) return HQ_ENOTSUP;
  const hq_format_ops *ops = &fa->plugin->ops;
  /* one module: the same name and the same code (two recipes loading one .so count as one) */
  if (ops->struct_size < HQ_FORMAT_OPS_SIZE_2_1 || !ops->gemm ||
      (fa->plugin != fb->plugin && (strcmp(ops->name, fb->plugin->ops.name) != 0 ||
                                    ops->gemm != fb->plugin->ops.gemm)))
    return HQ_ENOTSUP;
  hq_gemm_problem g;
  memset(&g, 0, sizeof g);
  g.struct_size = sizeof g;
  g.flags = r->flags;
  g.a = p->a.pub.st;
  g.b = p->b.pub.st;
  g.cfg_b = fb->cfg;
  g.transa = p->a.kind.trans;
  g.transb = p->b.kind.trans;
  g.m = p->m;
  g.n = p->n;
  g.k = p->k;
  g.d = &p->d;
  g.bias = r->bias;
  g.bias_dtype = r->bias_dtype;
  g.alpha = r->alpha;
  g.beta = r->beta;
  hq_dtype emul = (hq_dtype)0;
  g.emul_out = &emul;
  hq_call call;
  hqi_call_init(ctx, &call, 0, ctx->offset);
  hq_clear_error();
  if (p->kind.flags & HQ_GEMM_FUSED_ALWAYS) {
    /* the caller wants a fused path wherever one can run, after a native one only: a module
       whose product would be emulated is asked first, and then left to the providers -- in a
       plan (itself a query) as in a run, so that the two name the same path */
    g.flags |= HQ_GEMM_QUERY;
    const int q = hqi_plugin_rc(ops->gemm(fa->cfg, &call, &g), ops->name, "gemm");
    if (q == HQ_OK && emul) return HQ_ENOTSUP;
    g.flags = r->flags;
    emul = (hq_dtype)0;
    hq_clear_error();
  }
  int rc = hqi_plugin_rc(ops->gemm(fa->cfg, &call, &g), ops->name, "gemm");
  if (rc == HQ_OK) {
    /* a module's own kernel may multiply raw values (an emulated product) rather than codes */
    r->path = emul == HQ_BF16  ? HQ_GEMM_PATH_EMULATED_BF16
              : emul == HQ_F32 ? HQ_GEMM_PATH_EMULATED_F32
                               : HQ_GEMM_PATH_NATIVE;
    copy_name(p->info.provider, sizeof p->info.provider, ops->name);
    if (emul) { /* why no native path took it: the providers' first refusal, as for the core's
                   own emulated path */
      hqi_gemm_choice local;
      const hqi_gemm_choice *c = choice_of(ctx, p, &local);
      if (c->declined >= 0) memcpy(p->info.reason, c->reason, sizeof p->info.reason);
      else
        snprintf(p->info.reason, sizeof p->info.reason, "module %s multiplies the raw values in "
                 "its own kernel (%s)", ops->name, hq_dtype_name(emul));
    }
  } else if (rc == HQ_ENOTSUP) {
    snprintf(p->info.reason, sizeof p->info.reason, "%s", hq_last_error());
  } else {
    rc = hqi_error_prefix(rc, "%s: module %s, native gemm", p->what, ops->name);
  }
  return rc;
}

/* Run p (or with HQ_GEMM_QUERY in r->flags, ask): the module's own gemm op, then the accepting
   providers in order until one takes it. */
static int dispatch(hq_ctx *ctx, plan *p, hq_gemm_run *r) {
  int rc = module_gemm(ctx, p, r);
  if (rc != HQ_ENOTSUP) return rc;
  hqi_gemm_choice local;
  const hqi_gemm_choice *c = choice_of(ctx, p, &local);
  hq_call call;
  hqi_call_init(ctx, &call, 0, ctx->offset);
  for (uint32_t i = 0; i < c->n; i++) {
    const hqi_provider *pv = c->cand[i];
    if (!(c->accepted & (1u << i))) {
      if ((int32_t)i == c->declined && !p->info.reason[0])
        memcpy(p->info.reason, c->reason, sizeof p->info.reason);
      continue;
    }
    r->path = HQ_GEMM_PATH_NONE;
    r->fused = 0;
    hq_clear_error();
    rc = hqi_plugin_rc(pv->ops.run(&hqi_gemm_host, &call, r), pv->ops.name, "run");
    if (rc == HQ_OK) {
      copy_name(p->info.provider, sizeof p->info.provider, pv->ops.name);
      return HQ_OK;
    }
    if (rc != HQ_ENOTSUP)
      return hqi_error_prefix(rc, "%s: GEMM provider %s", p->what, pv->ops.name);
    if (!p->info.reason[0])
      snprintf(p->info.reason, sizeof p->info.reason, "%s", hq_last_error());
  }
  return hqi_error(HQ_ENOTSUP, "%s: no GEMM provider multiplies %s (%s) by %s (%s) on device %d%s%s",
                   p->what, p->info.format_a, opname(&p->a), p->info.format_b, opname(&p->b),
                   ctx->device, p->info.reason[0] ? ": " : "", p->info.reason);
}

static void run_init(const plan *p, hq_gemm_run *r, float alpha, float beta, uint32_t flags) {
  memset(r, 0, sizeof *r);
  r->struct_size = sizeof *r;
  r->flags = flags;
  r->kind = &p->kind;
  r->a = p->a.pub;
  r->b = p->b.pub;
  r->m = p->m;
  r->n = p->n;
  r->k = p->k;
  r->d = &p->d;
  r->bias = p->args.bias;
  r->bias_dtype = p->args.bias_dtype;
  r->alpha = alpha;
  r->beta = beta;
  r->what = p->what;
  r->amax_d = p->args.amax_d;
}

/* hq_gemm_args.amax_d where the GEMM's epilogue did not make it: one pass over the stored D on
   ctx's stream (a grid-stride kernel) or on the host, max |D| with NaN ignored. */
static int amax_of_d(hq_ctx *ctx, const hq_tensor *d, float *out) {
  const int64_t n = d->rows * d->cols;
  if (ctx->device >= 0) return hqi_cuda_amax(ctx->stream, d->data, d->dtype, n, out);
  float m = 0.0f;
  for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(hq_load_hp(d->data, i, d->dtype)));
  *out = m;
  return HQ_OK;
}

static void info_out(plan *p, const hq_gemm_run *r, hq_gemm_info *out) {
  p->info.path = r->path;
  p->info.fused = r->fused;
  p->info.amax_fused = r->amax_done;
  if (r->path == HQ_GEMM_PATH_NATIVE) p->info.reason[0] = '\0'; /* why native was not taken */
  if (!out) return;
  uint32_t n = out->struct_size;
  if (n < offsetof(hq_gemm_info, path) + sizeof(uint32_t)) return;
  if (n > sizeof p->info) n = sizeof p->info;
  memcpy(out, &p->info, n);
  out->struct_size = n;
}

/* Resolve, then dispatch on ctx's device with the host's floating-point mode hq needs. */
static int gemm_common(hq_ctx *ctx, hq_operand A, int transa, hq_operand B, int transb,
                       const hq_tensor *D, float alpha, float beta, const hq_gemm_args *args,
                       const char *fn, uint32_t flags, hq_gemm_info *info) {
  plan p;
  int rc = prepare(ctx, A, transa, B, transb, D, args, fn, &p);
  if (rc) return rc;
  if (!isfinite(alpha) || !isfinite(beta))
    return hqi_error(HQ_EINVAL, "%s: alpha = %g and beta = %g must be finite", p.what, alpha, beta);
  hq_gemm_run r;
  run_init(&p, &r, alpha, beta, flags);
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  const hqi_fpenv fe = hqi_fp_enter();
  rc = dispatch(ctx, &p, &r);
  if (!rc && r.amax_d && !r.amax_done && !(flags & HQ_GEMM_QUERY))
    rc = amax_of_d(ctx, &p.d, r.amax_d);
  hqi_fp_leave(fe);
  hqi_device_leave(saved);
  if (rc) return rc;
  if (!(flags & HQ_GEMM_QUERY))
    hqi_log(ctx, 3, "%s: %s path (%s), A %s %s x B %s %s, m=%lld n=%lld k=%lld%s%s", p.what,
            hq_gemm_path_name(r.path), p.info.provider, p.info.format_a,
            p.a.kind.dir ? hq_dir_name(p.a.kind.dir) : "(high precision)", p.info.format_b,
            p.b.kind.dir ? hq_dir_name(p.b.kind.dir) : "(high precision)", (long long)p.m,
            (long long)p.n, (long long)p.k, p.info.reason[0] ? "; not native: " : "",
            p.info.reason);
  info_out(&p, &r, info);
  return HQ_OK;
}

int hq_gemm_plan(hq_ctx *ctx, hq_operand A, int transa, hq_operand B, int transb,
                 const hq_tensor *D, const hq_gemm_args *args, hq_gemm_info *info) {
  return gemm_common(ctx, A, transa, B, transb, D, 1.0f, 0.0f, args, "hq_gemm_plan",
                     HQ_GEMM_QUERY, info);
}

int hq_gemm(hq_ctx *ctx, hq_operand A, int transa, hq_operand B, int transb, hq_tensor *D,
            float alpha, float beta, const hq_gemm_args *args, hq_gemm_info *info) {
  if (!D) return hqi_error(HQ_EINVAL, "hq_gemm: D is NULL");
  return gemm_common(ctx, A, transa, B, transb, D, alpha, beta, args, "hq_gemm", 0, info);
}

// --- linear layers ---------------------------------------------------------------------------------

static const char *role_of(hq_operand o) { return o.qt ? o.qt->role : "high precision"; }

int hq_linear_fprop(hq_ctx *ctx, hq_operand x, hq_operand w, const void *bias,
                    hq_dtype bias_dtype, hq_tensor *y, hq_gemm_info *info) {
  char what[160];
  snprintf(what, sizeof what, "fprop: weight %s, input %s", role_of(w), role_of(x));
  hq_gemm_args a = {sizeof a, 0, bias, bias_dtype, 0, what, NULL};
  /* y[tokens, out] = x[tokens, in] * W[out, in]^T: A = W transposed (rowwise), B = x (rowwise) */
  return hq_gemm(ctx, w, 1, x, 0, y, 1.0f, 0.0f, &a, info);
}

int hq_linear_dgrad(hq_ctx *ctx, hq_operand dy, hq_operand w, hq_tensor *dx, hq_gemm_info *info) {
  char what[160];
  snprintf(what, sizeof what, "dgrad: weight %s, grad_output %s", role_of(w), role_of(dy));
  hq_gemm_args a = {sizeof a, 0, NULL, HQ_DTYPE_INVALID, 0, what, NULL};
  /* dx[tokens, in] = dy[tokens, out] * W[out, in]: A = W (columnwise), B = dy (rowwise) */
  return hq_gemm(ctx, w, 0, dy, 0, dx, 1.0f, 0.0f, &a, info);
}

int hq_linear_wgrad(hq_ctx *ctx, hq_operand x, hq_operand dy, hq_tensor *dw, int accumulate,
                    hq_gemm_info *info) {
  char what[160];
  snprintf(what, sizeof what, "wgrad: input %s, grad_output %s", role_of(x), role_of(dy));
  hq_gemm_args a = {sizeof a, 0, NULL, HQ_DTYPE_INVALID, 0, what, NULL};
  /* dW[out, in] = dy^T * x: A = x (columnwise), B = dy transposed (columnwise) */
  return hq_gemm(ctx, x, 0, dy, 1, dw, 1.0f, accumulate ? 1.0f : 0.0f, &a, info);
}

// --- mixture of experts ------------------------------------------------------------------------------

void hq_qtensors_free(hq_qtensor **qts, size_t n) {
  if (!qts) return;
  for (size_t i = 0; i < n; i++) {
    hq_qtensor_free(qts[i]);
    qts[i] = NULL;
  }
}

int hq_quantize_split(hq_quantizer *const *qs, size_t n, hq_ctx *ctx, const hq_tensor *srcp,
                      const int64_t *m_splits, hq_qtensor **out) {
  if (!qs || !ctx || !srcp || !m_splits || !out)
    return hqi_error(HQ_EINVAL, "hq_quantize_split: NULL argument");
  for (size_t i = 0; i < n; i++) out[i] = NULL;
  hq_tensor src;
  int rc = hqi_tensor_in(srcp, "hq_quantize_split: source", &src);
  if (rc) return rc;
  int64_t sum = 0;
  for (size_t i = 0; i < n; i++) {
    if (m_splits[i] < 0 || m_splits[i] > src.rows - sum)
      return hqi_error(HQ_ESHAPE, "hq_quantize_split: m_splits[%zu] = %lld: the splits must be >= 0 "
                       "and sum to the source's %lld rows", i, (long long)m_splits[i],
                       (long long)src.rows);
    sum += m_splits[i];
    if (m_splits[i] && !qs[i])
      return hqi_error(HQ_EINVAL, "hq_quantize_split: expert %zu has %lld rows but no quantizer", i,
                       (long long)m_splits[i]);
  }
  if (sum != src.rows)
    return hqi_error(HQ_ESHAPE, "hq_quantize_split: m_splits sum to %lld, the source has %lld rows",
                     (long long)sum, (long long)src.rows);
  const size_t row_bytes = (size_t)src.cols * hq_dtype_size(src.dtype);
  int64_t row = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    if (!m_splits[i]) continue;
    hq_tensor part = src;
    part.data = (char *)src.data + (size_t)row * row_bytes;
    part.rows = m_splits[i];
    rc = hq_quantize(qs[i], ctx, &part, &out[i]);
    if (rc) rc = hqi_error_prefix(rc, "hq_quantize_split: expert %zu (rows %lld..%lld)", i,
                                  (long long)row, (long long)(row + m_splits[i]));
    row += m_splits[i];
  }
  if (rc) hq_qtensors_free(out, n);
  return rc;
}

int hq_grouped_gemm(hq_ctx *ctx, size_t n, const hq_operand *A, int transa, const hq_operand *B,
                    int transb, hq_tensor *const *D, float alpha, float beta,
                    const hq_gemm_args *args, hq_gemm_info *infos) {
  if (!ctx || (n && (!A || !B || !D))) return hqi_error(HQ_EINVAL, "hq_grouped_gemm: NULL argument");
  uint32_t info_size = infos ? infos[0].struct_size : 0;
  for (size_t i = 0; i < n; i++) {
    int empty_a = !A[i].qt && !A[i].hp, empty_b = !B[i].qt && !B[i].hp;
    hq_gemm_info *info = NULL;
    if (infos) {
      info = (hq_gemm_info *)((char *)infos + i * (info_size ? info_size : sizeof *infos));
      info->struct_size = info_size;
    }
    if (empty_a || empty_b) {
      if (D[i] && D[i]->rows * D[i]->cols != 0)
        return hqi_error(HQ_ESHAPE, "hq_grouped_gemm: group %zu has an empty operand (an expert "
                         "with no rows) but D[%zu] is [%lld, %lld], not empty", i, i,
                         (long long)D[i]->rows, (long long)D[i]->cols);
      if (info && info_size >= offsetof(hq_gemm_info, path) + sizeof(uint32_t))
        info->path = HQ_GEMM_PATH_NONE;
      continue;
    }
    int rc = hq_gemm(ctx, A[i], transa, B[i], transb, D[i], alpha, beta, args, info);
    if (rc) return hqi_error_prefix(rc, "hq_grouped_gemm: group %zu of %zu", i, n);
  }
  return HQ_OK;
}
