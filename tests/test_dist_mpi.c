/*
** test_dist_mpi.c -- the FSDP gather across ranks through Open MPI (hq/dist.h), run by
** tests/test_dist_mpi.sh under `mpirun -np 2` and `-np 4`; every rank runs every test.
**
** gather: for every stock format over its option sets and for hybrids (NVFP4 as one direction,
**   both directions in one gather), each usage: every rank holds a shard of a tensor whose rows
**   are scaled differently (the shared amax matters), of unequal sizes (rank r: 128 or 256 rows),
**   computes the shared amax with hq_dist_amax, quantizes its shard with it, and gathers: the
**   result equals, byte for byte, the whole tensor quantized on one rank with the amax of the
**   whole tensor (hq_quantizer_amax of it: an independent computation of the same value); a
**   second gather into the same tensor too. Per-tensor FP8 with both directions sends the
**   rowwise codes only: the wire bytes are exactly rows * cols (one copy), the columnwise copy
**   rebuilt; any other format sends every direction (rebuilt_dir 0).
** delayed: fp8_tensor delayed scaling, every rank's quantizer bound to its own hq_state: after
**   hq_dist_state_update the ranks' states equal a single rank's state that saw the whole tensor,
**   and the next step's gathered tensor equals that rank's quantization (except the `amax`
**   buffer, which is the local shard's by the gather rules).
** refusals (every rank gets the same status and message): a rank with other columns, another
**   format, other options (another recipe), a shard that splits a 128-row fp8_block tile or a
**   32-row MXFP8 columnwise block (the message names the shard rows and the block), nvfp4 with
**   stochastic rounding (cannot be gathered), a full tensor of the wrong shape.
** timeout: a rank that is late past the 1 s timeout makes the others' gather return HQ_EIO
**   within 4 s (slack for a loaded machine), and the communicator refuses further calls
**   (HQ_ESTATE).
** `wire ROWS COLS RECIPE...` (argv[1]): prints the bytes a weight's gather moves per recipe.
** `die` (argv[1]): the last rank is killed before the gather; every other rank must print
**   "survived: <status>" with HQ_EIO within the timeout (the script checks the lines).
*/
#include <mpi.h>
#include "hq_test.h"
#include "hq/dist.h"

#include <inttypes.h>
#include <signal.h>
#include <unistd.h>

static int g_rank, g_size;
static hq_dist *g_dist;
static hq_ctx *g_ctx;

#define K 160
#define UNIT 128

static int64_t shard_rows_of(int r) { return UNIT * (1 + r % 2); }
static int64_t first_row_of(int r) {
  int64_t a = 0;
  for (int i = 0; i < r; i++) a += shard_rows_of(i);
  return a;
}

/* Rows scaled by powers of two over a wide range, the later rows larger: shards have different
   amaxes. The same values on every rank (same seed). */
static hq_tensor test_input(hq_dtype t, int64_t M, int64_t cols) {
  hq_tensor x = hq_test_tensor(t, M, cols, 7, 1.0f);
  for (int64_t i = 0; i < M; i++) {
    float f = (float)(1 << (i % 5)) * (i >= M / 2 ? 16.0f : 0.125f);
    for (int64_t k = 0; k < cols; k++)
      hq_store_hp(x.data, i * cols + k, t, hq_load_hp(x.data, i * cols + k, t) * f);
  }
  return x;
}

static hq_tensor rows_of(const hq_tensor *x, int64_t r0, int64_t n) {
  return hq_tensor_2d((char *)x->data + (size_t)(r0 * x->cols) * hq_dtype_size(x->dtype),
                      x->dtype, x->device, n, x->cols);
}

#define ROLE "[role linear:weight:*]\nrowwise = r\ncolumnwise = c\n"
#define SAME(body) "[format r]\n" body "[format c]\n" body ROLE
/* one format instance for both directions (what the shipped recipes do): one quantize call */
#define ONE(body) "[format f]\n" body "[role linear:weight:*]\nrowwise = f\ncolumnwise = f\n"

typedef struct gcase {
  const char *name, *recipe;
  int rebuild;                   /* per-tensor FP8 both directions: the columnwise copy rebuilt */
} gcase;

static const gcase cases[] = {
    {"identity", ONE("plugin = identity\n"), 0},
    {"identity bf16", ONE("plugin = identity\ndtype = bf16\n"), 0},
    {"fp8_tensor e4m3", ONE("plugin = fp8_tensor\n"), 1},
    {"fp8_tensor e5m2", ONE("plugin = fp8_tensor\ndtype = e5m2\n"), 1},
    {"fp8_tensor power_2_scales", ONE("plugin = fp8_tensor\npower_2_scales = true\n"), 1},
    {"fp8_tensor amax_epsilon", ONE("plugin = fp8_tensor\namax_epsilon = 1000\n"), 1},
    {"mxfp8", ONE("plugin = mxfp8\n"), 0},
    {"mxfp8 e5m2", ONE("plugin = mxfp8\ndtype = e5m2\n"), 0},
    {"mxfp8 swizzle", ONE("plugin = mxfp8\nswizzle = true\n"), 0},
    {"mxfp8 2d swizzle", ONE("plugin = mxfp8\nblock_2d = true\nswizzle = true\n"), 0},
    {"mxfp8 2d", ONE("plugin = mxfp8\nblock_2d = true\n"), 0},
    {"nvfp4", ONE("plugin = nvfp4\n"), 0},
    {"nvfp4 rht", ONE("plugin = nvfp4\nrht = true\n"), 0},
    {"nvfp4 2d", ONE("plugin = nvfp4\nblock_2d = true\n"), 0},
    {"nvfp4 rht mask", ONE("plugin = nvfp4\nrht = true\nrht_sign_mask = 0x1234\n"), 0},
    {"fp8_block 1d", ONE("plugin = fp8_block\n"), 0},
    {"fp8_block 2d", ONE("plugin = fp8_block\nblock = 2d\n"), 0},
    {"fp8_block e5m2 no p2", ONE("plugin = fp8_block\ndtype = e5m2\npower_2_scales = false\n"), 0},
    {"fp8_block eps", ONE("plugin = fp8_block\namax_epsilon = 0.5\n"), 0},
    /* hybrids: NVFP4 as one direction, and both directions in one gather */
    {"mxfp8 / nvfp4 rht",
     "[format r]\nplugin = mxfp8\n[format c]\nplugin = nvfp4\nrht = true\n" ROLE, 0},
    {"nvfp4 / fp8_tensor",
     "[format r]\nplugin = nvfp4\n[format c]\nplugin = fp8_tensor\n" ROLE, 0},
    {"fp8_tensor / fp8_block 2d",
     "[format r]\nplugin = fp8_tensor\n[format c]\nplugin = fp8_block\nblock = 2d\n" ROLE, 0},
    {"identity / nvfp4 2d",
     "[format r]\nplugin = identity\n[format c]\nplugin = nvfp4\nblock_2d = true\n" ROLE, 0},
    {"fp8_block / mxfp8 swizzle 2d", "[format r]\nplugin = fp8_block\n[format c]\nplugin = "
     "mxfp8\nswizzle = true\nblock_2d = true\n" ROLE, 0},
    /* two instances of equal options: two calls, two scale buffers: both directions sent */
    {"fp8_tensor, two instances", SAME("plugin = fp8_tensor\n"), 0},
    {"fp8_tensor e4m3 / fp8_tensor e5m2",
     "[format r]\nplugin = fp8_tensor\n[format c]\nplugin = fp8_tensor\ndtype = e5m2\n" ROLE, 0},
};

static const uint32_t usages[] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};

static void gather_case(const gcase *c, hq_dtype t, uint32_t usage) {
  char what[160];
  snprintf(what, sizeof what, "%s, %s, usage %u, rank %d of %d", c->name, hq_dtype_name(t), usage,
           g_rank, g_size);
  const int64_t M = first_row_of(g_size);
  hq_tensor x = test_input(t, M, K);
  hq_tensor xs = rows_of(&x, first_row_of(g_rank), shard_rows_of(g_rank));
  hq_recipe *r = hq_test_recipe(c->recipe);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
  float amax[2], whole[2];
  HQ_OK_OR_FAIL(hq_dist_amax(g_dist, q, g_ctx, &xs, amax));
  HQ_OK_OR_FAIL(hq_quantizer_amax(q, g_ctx, &x, whole));
  for (int d = 0; d < 2; d++)
    if (amax[d] != whole[d]) fail_msg("%s: shared amax[%d] %g, the whole tensor's %g", what, d,
                                      (double)amax[d], (double)whole[d]);
  hq_qtensor *shard = hq_test_quantize_ex(q, g_ctx, &xs, amax);
  hq_qtensor *ref = hq_test_quantize_ex(q, g_ctx, &x, whole);
  hq_gather *g = NULL;
  if (hq_gather_create(g_dist, g_ctx, shard, &g)) fail_msg("%s: %s", what, hq_last_error());
  hq_qtensor *full = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(q, g_ctx, M, K, t, &full));
  hq_test_fill_garbage(full);
  if (hq_gather_run(g, g_ctx, shard, full)) fail_msg("%s: %s", what, hq_last_error());
  hq_test_same_qtensors(full, ref, what);
  hq_test_fill_garbage(full);
  if (hq_gather_run(g, g_ctx, shard, full)) fail_msg("%s: %s", what, hq_last_error());
  hq_test_same_qtensors(full, ref, what);
  hq_gather_info info = {.struct_size = sizeof info};
  HQ_OK_OR_FAIL(hq_gather_get_info(g, &info));
  assert_int_equal(info.collectives, 1);
  assert_int_equal(info.rows, M);
  assert_int_equal(info.bf16_bytes, (uint64_t)(M * K * 2));
  if (c->rebuild && usage == HQ_BOTH) {
    /* one FP8 copy on the wire: rows * cols codes, nothing else (entries are 16-aligned and
       every shard's codes are a multiple of 16 bytes) */
    assert_int_equal(info.rebuilt_dir, HQ_COLWISE);
    assert_int_equal(info.wire_bytes, (uint64_t)(M * K));
    assert_int_equal(info.rebuilt_bytes, (uint64_t)(M * K));
  } else if (info.rebuilt_dir || info.rebuilt_bytes) {
    fail_msg("%s: rebuilt direction %u (%" PRIu64 " bytes)", what, info.rebuilt_dir,
             info.rebuilt_bytes);
  }
  hq_gather_free(g);
  hq_qtensor_free(full);
  hq_qtensor_free(ref);
  hq_qtensor_free(shard);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  free(x.data);
}

static void test_gather(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (size_t u = 0; u < sizeof usages / sizeof usages[0]; u++)
      gather_case(&cases[i], HQ_BF16, usages[u]);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    gather_case(&cases[i], HQ_F32, HQ_BOTH);
}

static void test_delayed(void **state) {
  (void)state;
  static const char recipe[] = SAME("plugin = fp8_tensor\nscaling = delayed\namax_history_len = 4\n");
  const int64_t M = first_row_of(g_size);
  hq_tensor x = test_input(HQ_BF16, M, K);
  hq_tensor xs = rows_of(&x, first_row_of(g_rank), shard_rows_of(g_rank));
  hq_recipe *r = hq_test_recipe(recipe);
  hq_state *st = NULL, *st1 = NULL;
  HQ_OK_OR_FAIL(hq_state_create(r, g_ctx, &st));
  HQ_OK_OR_FAIL(hq_state_create(r, g_ctx, &st1));
  hq_role role = hq_role_of("linear", "weight", "w");
  hq_quantizer *q = NULL, *q1 = NULL;
  HQ_OK_OR_FAIL(hq_quantizer_create_ex(r, &role, st, &q));
  HQ_OK_OR_FAIL(hq_quantizer_create_ex(r, &role, st1, &q1));
  for (int step = 0; step < 3; step++) {
    hq_qtensor *shard = NULL, *ref = NULL, *full = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &xs, &shard));
    HQ_OK_OR_FAIL(hq_quantize(q1, g_ctx, &x, &ref));
    hq_gather *g = NULL;
    HQ_OK_OR_FAIL(hq_gather_create(g_dist, g_ctx, shard, &g));
    HQ_OK_OR_FAIL(hq_make_empty(q, g_ctx, M, K, HQ_BF16, &full));
    HQ_OK_OR_FAIL(hq_gather_run(g, g_ctx, shard, full));
    hq_test_same_qtensors_but(full, ref, "delayed scaling", HQ_ROLE_AMAX);
    /* the reduced state equals the single rank's that saw the whole tensor */
    HQ_OK_OR_FAIL(hq_dist_state_update(g_dist, st, g_ctx));
    HQ_OK_OR_FAIL(hq_state_update(st1, g_ctx));
    float *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    HQ_OK_OR_FAIL(hq_state_data(st, &a, &na));
    HQ_OK_OR_FAIL(hq_state_data(st1, &b, &nb));
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof(float));
    hq_gather_free(g);
    hq_qtensor_free(full);
    hq_qtensor_free(ref);
    hq_qtensor_free(shard);
  }
  hq_quantizer_free(q);
  hq_quantizer_free(q1);
  hq_state_free(st);
  hq_state_free(st1);
  hq_recipe_free(r);
  free(x.data);
}

/* Every rank quantizes `recipe` (rank `odd` uses `other` instead when not NULL) over a shard of
   `rows` rows (rank `odd`: `odd_rows`) and `cols` columns (rank `odd`: `odd_cols`); every rank
   must get `expect` and the same message, containing `needle`. */
static void refusal(const char *recipe, const char *other, int odd, int64_t rows, int64_t odd_rows,
                    int64_t cols, int64_t odd_cols, int expect, const char *needle) {
  const int mine = g_rank == odd;
  hq_recipe *r = hq_test_recipe(mine && other ? other : recipe);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_tensor x = test_input(HQ_BF16, mine ? odd_rows : rows, mine ? odd_cols : cols);
  hq_qtensor *shard = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &x, &shard));
  hq_gather *g = NULL;
  int rc = hq_gather_create(g_dist, g_ctx, shard, &g);
  if (rc != expect) fail_msg("rank %d: expected status %d, got %d: %s", g_rank, expect, rc,
                             hq_last_error());
  assert_null(g);
  if (!strstr(hq_last_error(), needle))
    fail_msg("rank %d: '%s' is not in '%s'", g_rank, needle, hq_last_error());
  /* the same message on every rank: rank 0's, compared by every rank */
  char msg[1024] = {0}, root[1024] = {0};
  snprintf(msg, sizeof msg, "%s", hq_last_error());
  memcpy(root, msg, sizeof root);
  MPI_Bcast(root, (int)sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
  assert_string_equal(msg, root);
  hq_qtensor_free(shard);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  free(x.data);
}

static void test_refusals(void **state) {
  (void)state;
  const int last = g_size - 1;
  static const char fp8[] = SAME("plugin = fp8_tensor\n");
  refusal(fp8, NULL, last, 128, 128, K, K + 32, HQ_EINVAL, "ranks disagree on the columns");
  refusal(fp8, SAME("plugin = mxfp8\n"), last, 128, 128, K, K, HQ_EINVAL,
          "ranks disagree on the rowwise format: rank 0 has 'fp8_tensor'");
  refusal(fp8, SAME("plugin = fp8_tensor\ndtype = e5m2\n"), last, 128, 128, K, K, HQ_EINVAL,
          "format's options: rank 0 has 'dtype=e4m3");
  refusal(SAME("plugin = nvfp4\n"), SAME("plugin = nvfp4\nrht = true\n"), 1, 128, 128, K, K,
          HQ_EINVAL, "rowwise format's options");
  char expect[256];
  /* rank 1's shard of 64 rows starts at row 128 and would split a 128-row tile */
  snprintf(expect, sizeof expect, "the shard of rank 1, rows [128, 192) (64 rows), would split a "
           "128-row scaling block of r (fp8_block, rowwise, 128x128 blocks)");
  refusal(SAME("plugin = fp8_block\nblock = 2d\n"), NULL, 1, 128, 64, K, K, HQ_ESHAPE, expect);
  /* rank 1's 64 rows start at row 128: the 128-row columnwise blocks of 1-D fp8_block */
  snprintf(expect, sizeof expect, "the shard of rank 1, rows [128, 192) (64 rows), would split a "
           "128-row scaling block of c (fp8_block, columnwise, 128x1 blocks)");
  refusal("[format r]\nplugin = nvfp4\n[format c]\nplugin = fp8_block\n" ROLE, NULL, 1, 128, 64,
          K, K, HQ_ESHAPE, expect);
  refusal(SAME("plugin = nvfp4\nstochastic_rounding = true\n"), NULL, 0, 128, 128, K, K,
          HQ_ENOTSUP, "rank 0 refuses its shard, rows [0, 128)");
  /* a full tensor that is not the ranks' shards together */
  hq_recipe *r = hq_test_recipe(fp8);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_tensor x = test_input(HQ_BF16, 32, K);
  hq_qtensor *shard = NULL, *full = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &x, &shard));
  hq_gather *g = NULL;
  HQ_OK_OR_FAIL(hq_gather_create(g_dist, g_ctx, shard, &g));
  HQ_OK_OR_FAIL(hq_make_empty(q, g_ctx, 32 * g_size + 1, K, HQ_BF16, &full));
  assert_int_equal(hq_gather_run(g, g_ctx, shard, full), HQ_ESHAPE);
  HQ_ERROR_HAS("the ranks' shards make [");
  hq_gather_free(g);
  hq_qtensor_free(full);
  hq_qtensor_free(shard);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  /* a plan that rebuilds per-tensor FP8's columnwise copy (it extracts the rowwise direction
     alone) run with a shard that holds only the rowwise direction: refused on every rank before
     the collective, not gathered as if the rebuild still applied */
  r = hq_test_recipe(ONE("plugin = fp8_tensor\n"));
  q = hq_test_quantizer(r, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &x, &shard));
  HQ_OK_OR_FAIL(hq_gather_create(g_dist, g_ctx, shard, &g));
  hq_gather_info info = {.struct_size = sizeof info};
  HQ_OK_OR_FAIL(hq_gather_get_info(g, &info));
  assert_int_equal(info.rebuilt_dir, HQ_COLWISE);
  hq_qtensor_free(shard);
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_ROWWISE));
  HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &x, &shard));
  HQ_OK_OR_FAIL(hq_make_empty(q, g_ctx, 32 * g_size, K, HQ_BF16, &full));
  assert_int_equal(hq_gather_run(g, g_ctx, shard, full), HQ_EINVAL);
  HQ_ERROR_HAS("make a new plan");
  hq_gather_free(g);
  hq_qtensor_free(full);
  hq_qtensor_free(shard);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  free(x.data);
}

/* The last rank joins the gather only after the others' timeout: they return HQ_EIO in time,
   then refuse further use; the late rank's collective completes (the others' requests stand). */
static void test_timeout(void **state) {
  (void)state;
  hq_dist_opts o = {.struct_size = sizeof o, .timeout_s = 1.0};
  hq_dist *d = NULL;
  HQ_OK_OR_FAIL(hq_dist_mpi_create(MPI_COMM_WORLD, &o, &d));
  hq_recipe *r = hq_test_recipe(SAME("plugin = mxfp8\n"));
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_tensor x = test_input(HQ_BF16, 64, K);
  hq_qtensor *shard = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &x, &shard));
  hq_gather *g = NULL;
  if (g_rank == g_size - 1) {
    sleep(6); /* well past the others' timeout and its slack, also on a loaded machine */
    HQ_OK_OR_FAIL(hq_gather_create(d, g_ctx, shard, &g));
    hq_gather_free(g);
  } else {
    const double t0 = MPI_Wtime();
    assert_int_equal(hq_gather_create(d, g_ctx, shard, &g), HQ_EIO);
    HQ_ERROR_HAS("no answer from every rank within 1 s");
    const double took = MPI_Wtime() - t0;
    if (took > 4.0) fail_msg("rank %d: the timeout of 1 s took %g s", g_rank, took);
    float a[2];
    assert_int_equal(hq_dist_amax(d, q, g_ctx, &x, a), HQ_ESTATE);
    HQ_ERROR_HAS("failed or timed out");
  }
  MPI_Barrier(MPI_COMM_WORLD); /* progresses the late collective to its end everywhere */
  hq_dist_free(d);
  hq_qtensor_free(shard);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  free(x.data);
}

/* The last rank dies before the gather; the others must come back with HQ_EIO. */
static int die(void) {
  hq_dist_opts o = {.struct_size = sizeof o, .timeout_s = 5.0};
  hq_dist *d = NULL;
  if (hq_dist_mpi_create(MPI_COMM_WORLD, &o, &d)) return 1;
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == g_size - 1) raise(SIGKILL);
  hq_recipe *r = NULL;
  if (hq_recipe_parse_string(SAME("plugin = fp8_tensor\n"), "die.ini", NULL, &r)) return 1;
  hq_role role = hq_role_of("linear", "weight", "w");
  hq_quantizer *q = NULL;
  if (hq_quantizer_create(r, &role, &q)) return 1;
  hq_tensor x = test_input(HQ_BF16, 64, K);
  hq_qtensor *shard = NULL;
  if (hq_quantize(q, g_ctx, &x, &shard)) return 1;
  hq_gather *g = NULL;
  int rc = hq_gather_create(d, g_ctx, shard, &g);
  if (!rc) {
    hq_qtensor *full = NULL;
    rc = hq_make_empty(q, g_ctx, 64 * g_size, K, HQ_BF16, &full);
    if (!rc) rc = hq_gather_run(g, g_ctx, shard, full);
    hq_qtensor_free(full);
  }
  printf("rank %d survived: %s (%d): %s\n", g_rank, rc == HQ_EIO ? "HQ_EIO" : "other", rc,
         hq_last_error());
  fflush(stdout);
  /* the job is broken: leave without MPI_Finalize (mpirun reports the dead rank). mpirun ends
     the job when the first rank leaves so: wait until every survivor has printed its line
     (they time out together, within the timeout's polling of each other). */
  sleep(3);
  _exit(rc == HQ_EIO ? 0 : 1);
}

/* `wire ROWS COLS RECIPE...`: for each recipe, the gather of its linear weight (role
   linear:weight:fc1) of [ROWS, COLS] sharded evenly, one line per recipe from rank 0: the
   message every rank receives against a BF16 all-gather of the same weight (docs/distributed.md
   has the table). */
static int wire(int argc, char **argv) {
  if (argc < 5) return 2;
  const int64_t rows = atoll(argv[2]), cols = atoll(argv[3]);
  if (rows % g_size) return 2;
  for (int i = 4; i < argc; i++)
    for (int u = 0; u < 2; u++) { /* both directions (fprop and dgrad), then the rowwise alone */
      hq_recipe *r = NULL;
      hq_role role = hq_role_of("linear", "weight", "fc1");
      hq_quantizer *q = NULL;
      hq_tensor x = test_input(HQ_F32, rows / g_size, cols);
      hq_qtensor *shard = NULL;
      hq_gather *g = NULL;
      hq_state *st = NULL; /* for delayed scaling */
      float amax[2];
      int rc = hq_recipe_load(argv[i], NULL, &r);
      if (!rc) rc = hq_state_create(r, g_ctx, &st);
      if (!rc) rc = hq_quantizer_create_ex(r, &role, st, &q);
      if (!rc) rc = hq_quantizer_set_usage(q, u ? HQ_ROWWISE : HQ_BOTH);
      if (!rc) rc = hq_dist_amax(g_dist, q, g_ctx, &x, amax);
      if (!rc) {
        hq_quantize_args a = {.struct_size = sizeof a, .amax = amax};
        rc = hq_quantize_ex(q, g_ctx, &x, &a, &shard);
      }
      if (!rc) rc = hq_gather_create(g_dist, g_ctx, shard, &g);
      hq_gather_info info = {.struct_size = sizeof info};
      if (!rc) rc = hq_gather_get_info(g, &info);
      if (rc) {
        fprintf(stderr, "%s: %s\n", argv[i], hq_last_error());
        return 1;
      }
      if (g_rank == 0)
        printf("%-36s %-8s %-8s %-8s %10" PRIu64 " %10" PRIu64 " %6.3f %s\n", argv[i],
               hq_quantizer_format(q, HQ_ROWWISE), hq_quantizer_format(q, HQ_COLWISE),
               u ? "rowwise" : "both", info.wire_bytes, info.bf16_bytes,
               (double)info.wire_bytes / (double)info.bf16_bytes,
               info.rebuilt_dir ? "columnwise rebuilt" : "");
      hq_gather_free(g);
      hq_qtensor_free(shard);
      hq_quantizer_free(q);
      hq_state_free(st);
      hq_recipe_free(r);
      free(x.data);
    }
  return 0;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  /* a failed check on one rank leaves the others waiting in a collective: not for long */
  hq_dist_opts o = {.struct_size = sizeof o, .timeout_s = 60};
  if (hq_ctx_create(NULL, &g_ctx) || hq_dist_mpi_create(MPI_COMM_WORLD, &o, &g_dist)) {
    fprintf(stderr, "rank %d: %s\n", g_rank, hq_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (argc > 1 && !strcmp(argv[1], "die")) return die();
  if (argc > 1 && !strcmp(argv[1], "wire")) {
    int rc = wire(argc, argv);
    hq_dist_free(g_dist);
    hq_ctx_destroy(g_ctx);
    MPI_Finalize();
    return rc;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gather), cmocka_unit_test(test_delayed),
      cmocka_unit_test(test_refusals), cmocka_unit_test(test_timeout)};
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  hq_dist_free(g_dist);
  hq_ctx_destroy(g_ctx);
  MPI_Finalize();
  return any ? 1 : 0;
}
