/*
** fused.c -- the "fused_hopper" GEMM provider: the emulated BF16 product with one operand read
** as codes and scales inside a Hopper wgmma kernel (fused_gemm.cu), so that a large operand is
** never written out and read back in BF16. The operand it reads itself is a rowwise storage whose
** descriptor says OCP MX (E4M3 / E5M2 codes, one E8M0 scale per 1x32 block along k; decoded by
** mxfp8_rules.h), NVFP4 (E2M1 codes two a byte, one E4M3 scale per 1x16 block, a per-tensor
** factor apart; nvfp4_rules.h) or MXFP4 / MXFP6 (E2M1 codes two a byte, or E3M2 / E2M3 codes
** four in three bytes, one E8M0 scale per 1x32 block, compact; mx_rules.h), in [M, K] order,
** its scales compact (outer-major) or swizzled;
** the other operand's raw values must be exact in BF16 and have k contiguous in the orientation
** the flags give (A transposed, B not), since the kernel streams it as K-major BF16 tiles.
**
** By default the provider takes a problem only when the other operand is small -- at most
** HQ_FUSED_MAX_OTHER rows along m or n -- because there the unfused path's BF16 copy of the large
** operand costs more than the fused kernel gives up to cuBLASLt's BF16 GEMM -- and the fused
** operand is not tiny (HQ_FUSED_MIN_ELEMS), its grid of output tiles is not small
** (HQ_FUSED_MIN_TILES) and, for an F32 D, k is not short (HQ_FUSED_MIN_K_F32);
** HQ_GEMM_FUSED_ALWAYS lifts all four. The larger operand
** is the one fused when both could be.
*/
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "../builtin.h"
#include "fused_gemm.h"

/* Rows of the other operand up to which the fused path is taken by default
   (docs/performance.md, section 6, has the measurements that placed the crossover here). */
#define HQ_FUSED_MAX_OTHER 2048
/* Elements of the fused operand below which the unfused path is taken by default: there the
   BF16 copy the fused kernel saves is a few hundred KiB, less than the kernel's fixed cost (a
   128 x 256 tile per CTA, so a handful of CTAs, each filling its ring and staging its tile)
   over cuBLASLt's small-tile kernels (docs/performance.md, section 7). */
#ifndef HQ_FUSED_MIN_ELEMS
#define HQ_FUSED_MIN_ELEMS (1 << 20)
#endif
/* The shortest k the fused path is taken for by default when D is F32 (hq train's GEMMs): below
   it the fused kernel's F32 epilogue costs more than the unfused path's dequantize, while with
   a BF16 D the fused kernel stays the faster at every k measured (docs/performance.md). */
#ifndef HQ_FUSED_MIN_K_F32
#define HQ_FUSED_MIN_K_F32 2048
#endif
/* The fewest output tiles (CTAs) the fused path is taken for by default: each CTA makes one
   tile over the whole of k, so a smaller grid leaves most of an H100 SXM's or H200's 132 SMs
   idle while the unfused path's cuBLASLt GEMM splits the work finer; 96 is where the two paths
   measured even (docs/performance.md, "The fused kernel's small grids"). */
#ifndef HQ_FUSED_MIN_TILES
#define HQ_FUSED_MIN_TILES 96
#endif

#ifndef HQ_HAVE_CUDA
int hqi_fused_gemm_supported(const hqi_fused_gemm_args *a) {
  (void)a;
  return 0;
}
int hqi_fused_gemm(const hqi_fused_gemm_args *a) {
  return a->error(HQ_ENOTSUP, "%s: libhqcore was built without CUDA", a->what);
}
#endif

/* Whether a descriptor is an MXFP4 / MXFP6 one: E2M1 / E3M2 / E2M3 codes, E8M0 scales per 1x32. */
static int is_mx(const hq_operand_desc *d) {
  return (d->elem == HQ_E2M1X2 || d->elem == HQ_E3M2X4 || d->elem == HQ_E2M3X4) &&
         d->scale_mode == HQ_SCALE_VEC32_UE8M0 && d->block_k == 32;
}

/* Whether operand x (A when x_is_a) can be the fused one against y, by their kinds alone. */
static int fusable(const hq_gemm_kind *k, int x_is_a) {
  const hq_gemm_operand_kind *x = x_is_a ? &k->a : &k->b, *y = x_is_a ? &k->b : &k->a;
  const hq_operand_desc *d = x->desc;
  if (!d || !(x->flags & HQ_GEMM_OP_RAW) || hq_gemm_emul_dtype(y) != HQ_BF16) return 0;
  /* a storage carrying its BF16 raw values: the unfused path is then one plain BF16 GEMM on
     them, with no dequantize, faster than decoding the codes in the GEMM */
  if (x->flags & HQ_GEMM_OP_RAWCOPY) return 0;
  /* the BF16 operand K-contiguous as the emulated path lays it out: A transposed, B not */
  if (x_is_a ? k->b.trans : !k->a.trans) return 0;
  if (x->dir != HQ_ROWWISE || d->order != HQ_ORDER_MK || d->block_m != 1) return 0;
  if (is_mx(d)) /* MXFP4 / MXFP6: compact scales, no per-tensor factor */
    return d->scale_layout == HQ_SCALE_LAYOUT_OUTER_MAJOR && !(x->flags & HQ_GEMM_OP_FACTOR);
  const int nv = d->elem == HQ_E2M1X2;
  if (nv ? d->scale_mode != HQ_SCALE_VEC16_UE4M3 || d->block_k != 16
         : (d->elem != HQ_E4M3 && d->elem != HQ_E5M2) || d->scale_mode != HQ_SCALE_VEC32_UE8M0 ||
               d->block_k != 32 || (x->flags & HQ_GEMM_OP_FACTOR))
    return 0;
  return d->scale_layout == HQ_SCALE_LAYOUT_OUTER_MAJOR ||
         d->scale_layout == HQ_SCALE_LAYOUT_SWIZZLED;
}

static int accepts(const hq_gemm_host *host, const hq_gemm_kind *k) {
  const hq_host_api *api = host->api;
  if (k->flags & (HQ_GEMM_FORCE_EMULATED | HQ_GEMM_NO_FUSED))
    return api->error(HQ_ENOTSUP, "fused_hopper: the caller asked for no fused path");
  if (k->device < 0 || k->arch != 90)
    return api->error(HQ_ENOTSUP, "fused_hopper: the fused kernel runs on Hopper (sm_90) only");
#ifndef HQ_HAVE_CUDA
  return api->error(HQ_ENOTSUP, "fused_hopper: libhqcore was built without CUDA");
#else
  if (!fusable(k, 1) && !fusable(k, 0))
    return api->error(HQ_ENOTSUP, "fused_hopper: neither operand is a rowwise MXFP8 / NVFP4 / "
                      "MXFP4 / MXFP6 storage against a BF16-exact, K-contiguous other one");
  return HQ_OK;
#endif
}

/* The kernel's arguments for operand x against y: 1 when x's buffers and the problem allow it
   (hqi_fused_gemm_supported), else 0. D and the scalars are filled when it runs. */
static int args_for(const hq_host_api *api, const hq_call *call, const hq_gemm_run *r,
                    int x_is_a, hqi_fused_gemm_args *fa) {
  const hq_gemm_kind *k = r->kind;
  if (!fusable(k, x_is_a)) return 0;
  const hq_gemm_operand *x = x_is_a ? &r->a : &r->b;
  const hq_operand_desc *d = &x->st->desc;
  const int nv = d->elem == HQ_E2M1X2, mx = is_mx(d);
  const int fp6 = mx && !nv;
  const int64_t outer = x_is_a ? r->m : r->n;
  const hq_buffer *data = hq_storage_role(x->st, HQ_ROLE_DATA);
  const hq_buffer *sc = hq_storage_role(x->st, HQ_ROLE_SCALE);
  /* one byte per stored element in both buffers, the codes [outer, k] (FP4: k / 2 bytes; FP6:
     3k / 4), the scales of every row up to a whole 128-row tile (MXFP4 / MXFP6: of every row,
     k / 32 a row) */
  if (!data || !sc || data->ndim != 2 || sc->ndim != 2 || data->shape[0] != outer ||
      data->shape[1] != (fp6 ? r->k / 4 * 3 : nv ? r->k / 2 : r->k) ||
      (nv && r->k % 2) || (fp6 && r->k % 4) ||
      data->bytes != (size_t)(data->shape[0] * data->shape[1]) ||
      sc->bytes != (size_t)(sc->shape[0] * sc->shape[1]) ||
      sc->shape[0] < (mx ? outer : (outer + 127) / 128 * 128) || (mx && sc->shape[1] != r->k / 32))
    return 0;
  memset(fa, 0, sizeof *fa);
  fa->device = call->device;
  fa->arch = k->arch;
  fa->stream = call->stream;
  fa->x = data->ptr;
  fa->xs = sc->ptr;
  fa->xs_ld = sc->shape[1];
  fa->xs_swizzled = d->scale_layout == HQ_SCALE_LAYOUT_SWIZZLED;
  fa->elem = (int)d->elem;
  fa->e8m0 = d->scale_mode == HQ_SCALE_VEC32_UE8M0;
  fa->mx = outer;
  fa->nw = x_is_a ? r->n : r->m;
  fa->k = r->k;
  fa->x_is_m = x_is_a;
  fa->d = r->d->data;
  if (!fa->d) fa->d = (void *)(uintptr_t)256; /* a query: D's alignment is checked when it runs */
  fa->d_dtype = (int)r->d->dtype;
  fa->ldd = r->m;
  fa->what = r->what;
  fa->error = api->error;
  return hqi_fused_gemm_supported(fa);
}

static int run(const hq_gemm_host *host, const hq_call *call, hq_gemm_run *r) {
  const hq_host_api *api = host->api;
  if (r->m <= 0 || r->n <= 0 || r->k <= 0)
    return api->error(HQ_ENOTSUP, "fused_hopper: an empty GEMM is not fused");
  hqi_fused_gemm_args a, b;
  const int can_a = args_for(api, call, r, 1, &a), can_b = args_for(api, call, r, 0, &b);
  /* the larger operand fused; by default only against a small other one */
  int pick = can_a && (!can_b || r->m >= r->n) ? 1 : can_b ? 2 : 0;
  if (!pick)
    return api->error(HQ_ENOTSUP, "fused_hopper: the fused kernel does not take this problem "
                      "(shapes, alignment or k %% 32)");
  const int64_t other = pick == 1 ? r->n : r->m, fused = (pick == 1 ? r->m : r->n) * r->k;
  if (!(r->kind->flags & HQ_GEMM_FUSED_ALWAYS) && other > HQ_FUSED_MAX_OTHER)
    return api->error(HQ_ENOTSUP, "fused_hopper: the other operand has %lld rows, more than %d: "
                      "the unfused path is faster there", (long long)other, HQ_FUSED_MAX_OTHER);
  if (!(r->kind->flags & HQ_GEMM_FUSED_ALWAYS) && fused < HQ_FUSED_MIN_ELEMS)
    return api->error(HQ_ENOTSUP, "fused_hopper: the fused operand has %lld elements, fewer than "
                      "%d: the unfused path is faster there", (long long)fused,
                      HQ_FUSED_MIN_ELEMS);
  const int64_t tiles = hqi_fused_tiles(pick == 1 ? r->m : r->n, other);
  if (!(r->kind->flags & HQ_GEMM_FUSED_ALWAYS) && tiles < HQ_FUSED_MIN_TILES)
    return api->error(HQ_ENOTSUP, "fused_hopper: %lld output tiles of %d x %d, fewer than %d: "
                      "the unfused path is faster there", (long long)tiles, HQI_FUSED_TILE_X,
                      HQI_FUSED_TILE_W, HQ_FUSED_MIN_TILES);
  if (!(r->kind->flags & HQ_GEMM_FUSED_ALWAYS) && r->d->dtype == HQ_F32 &&
      r->k < HQ_FUSED_MIN_K_F32)
    return api->error(HQ_ENOTSUP, "fused_hopper: D is f32 and k is %lld, less than %d: the "
                      "unfused path is faster there", (long long)r->k, HQ_FUSED_MIN_K_F32);
  r->path = HQ_GEMM_PATH_FUSED_BF16;
  r->fused = (uint32_t)pick;
  if (r->flags & HQ_GEMM_QUERY) return HQ_OK;
  const int x_is_a = pick == 1;
  hqi_fused_gemm_args fa = x_is_a ? a : b;
  const hq_gemm_operand *x = x_is_a ? &r->a : &r->b, *y = x_is_a ? &r->b : &r->a;
  const hq_gemm_operand_kind *xk = x_is_a ? &r->kind->a : &r->kind->b;
  float *factors = api->alloc(call, 2 * sizeof(float));
  if (!factors) return api->error(HQ_ENOMEM, "%s: 8 bytes of device memory", r->what);
  /* W's factor times 1 (exact: the factor itself) from its dequantize where its module folds,
     no kernel; X's from its format's tensor_factor(); the kernel multiplies alpha by both, A's
     first, as the emulated path folds them */
  hq_gemm_fold fdy = {factors, NULL, 1.0f, 0};
  const void *w = NULL;
  void *tw = NULL;
  const float *pf = NULL, *px = NULL;
  const hq_gemm_operand_kind *yk = x_is_a ? &r->kind->b : &r->kind->a;
  int rc = hq_gemm_raw_factor(host, call, y, yk, HQ_BF16, &w, &tw, factors, &pf, &fdy);
  if (!rc && (xk->flags & HQ_GEMM_OP_FACTOR) && !(rc = host->factor(call, x, factors + 1)))
    px = factors + 1;
  if (!rc) {
    fa.w = w;
    fa.alpha = r->alpha;
    fa.beta = r->beta;
    fa.factor[0] = x_is_a ? px : pf;
    fa.factor[1] = x_is_a ? pf : px;
    fa.bias = r->bias;
    fa.bias_dtype = (int)r->bias_dtype;
    rc = hqi_fused_gemm(&fa);
  }
  api->free(call, tw);
  api->free(call, factors);
  return rc;
}

static const hq_gemm_provider table = {
    .abi_major = HQ_GEMM_ABI_MAJOR,
    .abi_minor = 0,
    .struct_size = sizeof(hq_gemm_provider),
    .priority = 50,
    .name = "fused_hopper",
    .version = PACKAGE_VERSION,
    .description = "Hopper wgmma kernel reading an MXFP8 / NVFP4 / MXFP4 / MXFP6 operand's codes "
                   "and scales, the other in BF16 (emulated product, no BF16 copy of the large "
                   "operand)",
    .accepts = accepts,
    .run = run,
};

HQ_GEMM_ENTRY(fused_hopper, table)
