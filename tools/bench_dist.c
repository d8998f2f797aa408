/*
** bench_dist.c -- `hq bench --dist`: the bandwidth of hq's FSDP gather (hq/dist.h: one collective
** per parameter, every buffer of every direction packed) against the communication library's
** own all-gather of exactly the same total bytes, in the manner of nccl-tests: every sample is a
** barrier, then one timed call; a sample's time is the slowest rank's; medians over --iters after
** --warmup untimed calls. algbw = bytes / time and busbw = algbw * (n-1)/n, as nccl-tests define
** them for an all-gather (bytes: what every rank receives). Run by `mpirun -np N`; rank 0 prints.
** On the CPU through Open MPI (host memory); with --device cuda through NCCL, one GPU per local
** rank, NCCL loaded at run time like services/dist_nccl.c. A benchmark, never a test.
*/
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HQ_HAVE_MPI
#include <mpi.h>
#endif
#if defined(HQ_HAVE_MPI) && defined(HQ_HAVE_NCCL)
#define BENCH_DIST_NCCL 1
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>   /* before hq/dist.h: it declares hq_dist_nccl_create when NCCL's is seen */
#endif
#include "hq/dist.h"
#include "bench_spec.h"
#include "bench_timer.h"
#include "cli.h"
#include "commands.h"
#include "hq/numerics.h"

#define CMD "bench --dist"

static const char usage[] =
    "usage: mpirun -np N hq bench --dist [--device cpu|cuda] [--shape RxC] [--iters N]\n"
    "                [--warmup N] [--format 'PLUGIN[ key=value...]']... [--plugin-dir DIR]...\n"
    "\n"
    "Gather bandwidth of hq's FSDP gather (hq_gather_run: one collective per parameter, every\n"
    "buffer of both directions packed) against the library's own all-gather of the same total\n"
    "bytes (MPI_Allgather on the CPU, ncclAllGather with --device cuda, one GPU per local\n"
    "rank). Each rank holds rows/N rows of a RxC bf16 weight (default 4096x4096), quantized\n"
    "with the shared amax. Default formats: identity bf16, fp8_tensor, mxfp8, nvfp4, fp8_block\n"
    "(1d and 2d). A sample is a barrier then one timed call; its time is the slowest rank's;\n"
    "medians of --iters samples (default 20) after --warmup calls (default 5). algbw = bytes /\n"
    "time, busbw = algbw * (N-1)/N (nccl-tests' all-gather definitions; bytes: what every rank\n"
    "receives); hq% = hq's busbw / the raw call's. Rank 0 prints.\n"
    "Exit status 1 when a format fails (not found, refused, or its gather refusing the shape\n"
    "over N ranks: its row says failed); a default format whose plugin is not installed is\n"
    "skipped.\n";

static const char *stock[] = {"identity dtype=bf16", "fp8_tensor", "mxfp8", "nvfp4",
                              "fp8_block block=1d", "fp8_block block=2d"};

typedef struct dist_args {
  int device;                     /* HQ_DEVICE_HOST, or 0: the local rank's GPU */
  int64_t rows, cols;
  int iters, warmup;
  const char *formats[64];
  size_t nformats;
  int user_formats;               /* formats from --format, not the stock list */
  const char *dirs[16];
  size_t ndirs;
} dist_args;

/* 0 run, 2 usage error (printed), 3 help printed */
static int parse(int argc, char **argv, dist_args *a) {
  a->device = HQ_DEVICE_HOST;
  a->rows = a->cols = 4096;
  a->iters = 20;
  a->warmup = 5;
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    if (!strcmp(o, "--dist")) continue;
    if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
      fputs(usage, stdout);
      return 3;
    }
    if (i + 1 >= argc) return cli_fail(2, CMD, "%s needs a value (or is unknown)\n%s", o, usage);
    const char *v = argv[++i];
    uint64_t n = 0;
    if (!strcmp(o, "--device")) {
      if (!strcmp(v, "cpu")) a->device = HQ_DEVICE_HOST;
      else if (!strcmp(v, "cuda")) a->device = 0;
      else
        return cli_fail(2, CMD, "--device %s: cpu or cuda (under mpirun each rank takes the GPU "
                        "of its local rank)", v);
    } else if (!strcmp(o, "--shape")) {
      if (cli_shape_arg(CMD, "--shape", v, &a->rows, &a->cols)) return 2;
    } else if (!strcmp(o, "--iters") || !strcmp(o, "--warmup")) {
      if (cli_u64(v, &n) || n > 100000 || (n == 0 && o[2] == 'i'))
        return cli_fail(2, CMD, "%s %s: a count (iters 1 to 100000, warmup 0 to 100000)", o, v);
      *(o[2] == 'i' ? &a->iters : &a->warmup) = (int)n;
    } else if (!strcmp(o, "--format")) {
      if (a->nformats == sizeof a->formats / sizeof a->formats[0])
        return cli_fail(2, CMD, "--format: at most %zu", sizeof a->formats / sizeof a->formats[0]);
      a->formats[a->nformats++] = v;
    } else if (!strcmp(o, "--plugin-dir")) {
      if (a->ndirs == sizeof a->dirs / sizeof a->dirs[0])
        return cli_fail(2, CMD, "--plugin-dir: at most %zu", sizeof a->dirs / sizeof a->dirs[0]);
      a->dirs[a->ndirs++] = v;
    } else {
      return cli_fail(2, CMD, "unknown option %s\n%s", o, usage);
    }
  }
  a->user_formats = a->nformats > 0;
  if (!a->nformats) {
    for (size_t f = 0; f < sizeof stock / sizeof stock[0]; f++) a->formats[f] = stock[f];
    a->nformats = sizeof stock / sizeof stock[0];
  }
  return 0;
}

#ifdef HQ_HAVE_MPI

typedef struct dist_run {
  int rank, size, local_rank, local_size;
  hq_plugins *set;
  hq_ctx *ctx;
  hq_dist *hd;
  void *x;                        /* this rank's shard of the input (on the device of ctx) */
#ifdef BENCH_DIST_NCCL
  void *lib;
  ncclResult_t (*get_unique_id)(ncclUniqueId *);
  ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                             cudaStream_t);
  const char *(*error_string)(ncclResult_t);
  ncclComm_t nccl;
#endif
} dist_run;

/* 1 when ok is true on every rank (one collective) */
static int all_ok(int ok) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#ifdef BENCH_DIST_NCCL
static int nccl_setup(const dist_args *a, dist_run *r) {
  (void)a;
  int ok = 1, ngpu = 0;
  cudaError_t e = cudaGetDeviceCount(&ngpu);
  if (e != cudaSuccess) {
    fprintf(stderr, "hq %s: rank %d: cudaGetDeviceCount: %s\n", CMD, r->rank,
            cudaGetErrorString(e));
    ok = 0;
  } else if (ngpu < r->local_size) {
    fprintf(stderr, "hq %s: rank %d: %d ranks on this host but %d GPU%s: --device cuda needs one "
            "GPU per local rank\n", CMD, r->rank, r->local_size, ngpu, ngpu == 1 ? "" : "s");
    ok = 0;
  } else if ((e = cudaSetDevice(r->local_rank)) != cudaSuccess) {
    fprintf(stderr, "hq %s: rank %d: cudaSetDevice(%d): %s\n", CMD, r->rank, r->local_rank,
            cudaGetErrorString(e));
    ok = 0;
  }
  if (ok) {
    r->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    if (!r->lib) r->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    const struct {
      const char *name;
      void **slot;
    } sym[] = {{"ncclGetUniqueId", (void **)&r->get_unique_id},
               {"ncclCommInitRank", (void **)&r->comm_init_rank},
               {"ncclCommDestroy", (void **)&r->comm_destroy},
               {"ncclAllGather", (void **)&r->all_gather},
               {"ncclGetErrorString", (void **)&r->error_string}};
    /* the types of the slots are checked against nccl.h's declarations, without a link-time
       reference to libnccl */
    (void)sizeof(r->get_unique_id == ncclGetUniqueId);
    (void)sizeof(r->comm_init_rank == ncclCommInitRank);
    (void)sizeof(r->comm_destroy == ncclCommDestroy);
    (void)sizeof(r->all_gather == ncclAllGather);
    (void)sizeof(r->error_string == ncclGetErrorString);
    if (!r->lib) {
      fprintf(stderr, "hq %s: rank %d: libnccl.so.2 cannot be loaded: %s\n", CMD, r->rank,
              dlerror());
      ok = 0;
    }
    for (size_t i = 0; ok && i < sizeof sym / sizeof sym[0]; i++)
      if (!(*sym[i].slot = dlsym(r->lib, sym[i].name))) {
        fprintf(stderr, "hq %s: rank %d: libnccl.so.2 has no %s\n", CMD, r->rank, sym[i].name);
        ok = 0;
      }
  }
  if (!all_ok(ok)) return -1;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclResult_t nr = ncclSuccess;
  if (r->rank == 0) nr = r->get_unique_id(&id);
  if (!all_ok(nr == ncclSuccess)) {
    if (nr != ncclSuccess)
      fprintf(stderr, "hq %s: ncclGetUniqueId: %s\n", CMD, r->error_string(nr));
    return -1;
  }
  if (MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
    fprintf(stderr, "hq %s: rank %d: MPI_Bcast of the NCCL id failed\n", CMD, r->rank);
    return -1;
  }
  nr = r->comm_init_rank(&r->nccl, r->size, id, r->rank);
  if (nr != ncclSuccess) {
    fprintf(stderr, "hq %s: rank %d: ncclCommInitRank: %s\n", CMD, r->rank, r->error_string(nr));
    r->nccl = NULL;
  }
  if (!all_ok(nr == ncclSuccess)) return -1;
  if (hq_dist_nccl_create(r->nccl, NULL, &r->hd)) {
    fprintf(stderr, "hq %s: rank %d: %s\n", CMD, r->rank, hq_last_error());
    r->hd = NULL;
  }
  return all_ok(r->hd != NULL) ? 0 : -1;
}
#endif

static int setup(const dist_args *a, dist_run *r) {
  MPI_Comm_rank(MPI_COMM_WORLD, &r->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &r->size);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &r->local_rank);
  MPI_Comm_size(local, &r->local_size);
  MPI_Comm_free(&local);
  if (a->rows % r->size) {
    if (r->rank == 0)
      fprintf(stderr, "hq %s: --shape %lldx%lld: %lld rows do not split evenly over %d ranks\n",
              CMD, (long long)a->rows, (long long)a->cols, (long long)a->rows, r->size);
    return -1;
  }
  int device = HQ_DEVICE_HOST;
  if (a->device != HQ_DEVICE_HOST) {
#ifdef BENCH_DIST_NCCL
    if (nccl_setup(a, r)) return -1;
    device = r->local_rank;
#else
    if (r->rank == 0)
      fprintf(stderr, "hq %s: --device cuda needs NCCL, and this hq was built without it "
              "(configure found no CUDA with nccl.h and libnccl)\n", CMD);
    return -1;
#endif
  }
  int ok = 1;
  hq_ctx_desc desc = {sizeof desc, device, NULL, NULL, NULL, NULL, 1};
  if (hq_plugins_open(a->dirs, a->ndirs, 0, &r->set) || hq_ctx_create(&desc, &r->ctx)) {
    fprintf(stderr, "hq %s: rank %d: %s\n", CMD, r->rank, hq_last_error());
    ok = 0;
  }
  if (ok && device == HQ_DEVICE_HOST && hq_dist_mpi_create(MPI_COMM_WORLD, NULL, &r->hd)) {
    fprintf(stderr, "hq %s: rank %d: %s\n", CMD, r->rank, hq_last_error());
    ok = 0;
  }
  /* this rank's rows of a deterministic weight: uniform values of unit variance, one seed per
     rank, so that the shards differ and the shared amax is a real reduction */
  const int64_t n = a->rows / r->size * a->cols;
  const size_t bytes = (size_t)n * hq_dtype_size(HQ_BF16);
  void *host = ok ? malloc(bytes) : NULL;
  if (ok && !host) {
    fprintf(stderr, "hq %s: rank %d: out of memory for the shard\n", CMD, r->rank);
    ok = 0;
  }
  if (ok) {
    uint64_t s = 88172645463325252ull ^ ((uint64_t)r->rank * 0x9E3779B97F4A7C15ull);
    for (int64_t i = 0; i < n; i++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      hq_store_hp(host, i, HQ_BF16,
                  (float)(((double)(s >> 11) * (1.0 / 9007199254740992.0) - 0.5) * 3.4641016));
    }
    if (device == HQ_DEVICE_HOST) {
      r->x = host;
      host = NULL;
    } else if (hq_ctx_alloc(r->ctx, bytes, &r->x) ||
               hq_ctx_memcpy(r->ctx, r->x, device, host, HQ_DEVICE_HOST, bytes) ||
               hq_ctx_sync(r->ctx)) {
      fprintf(stderr, "hq %s: rank %d: %s\n", CMD, r->rank, hq_last_error());
      ok = 0;
    }
  }
  free(host);
  return all_ok(ok) ? 0 : -1;
}

static void teardown(const dist_args *a, dist_run *r) {
  if (r->x && a->device == HQ_DEVICE_HOST) free(r->x);
  else if (r->x) hq_ctx_free(r->ctx, r->x);
  hq_dist_free(r->hd);
  hq_ctx_destroy(r->ctx);
  hq_plugins_close(r->set);
#ifdef BENCH_DIST_NCCL
  if (r->nccl) (void)r->comm_destroy(r->nccl);
  if (r->lib) dlclose(r->lib);
#endif
}

/* The raw all-gather of count bytes per rank from send into recv: 0, or -1 after the message. */
static int raw_allgather(const dist_args *a, dist_run *r, const void *send, void *recv,
                         size_t count) {
#ifdef BENCH_DIST_NCCL
  if (a->device != HQ_DEVICE_HOST) {
    cudaStream_t stream = (cudaStream_t)hq_ctx_stream(r->ctx);
    ncclResult_t nr = r->all_gather(send, recv, count, ncclUint8, r->nccl, stream);
    if (nr != ncclSuccess) {
      fprintf(stderr, "hq %s: rank %d: ncclAllGather: %s\n", CMD, r->rank, r->error_string(nr));
      return -1;
    }
    cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
      fprintf(stderr, "hq %s: rank %d: cudaStreamSynchronize after ncclAllGather: %s\n", CMD,
              r->rank, cudaGetErrorString(e));
      return -1;
    }
    return 0;
  }
#endif
  (void)a;
  /* MPI counts are int: larger messages go as that many contiguous blocks of 1 KiB */
  MPI_Datatype t = MPI_BYTE;
  size_t n = count;
  if (count > (size_t)1 << 30) {
    MPI_Type_contiguous(1024, MPI_BYTE, &t);
    MPI_Type_commit(&t);
    n = count / 1024;
  }
  const int rc = MPI_Allgather(send, (int)n, t, recv, (int)n, t, MPI_COMM_WORLD);
  if (t != MPI_BYTE) MPI_Type_free(&t);
  if (rc != MPI_SUCCESS) {
    fprintf(stderr, "hq %s: rank %d: MPI_Allgather failed (%d)\n", CMD, r->rank, rc);
    return -1;
  }
  return 0;
}

/* One format: 0 timed, 1 skipped (a stock format whose plugin is not installed), 2 failed (the
   format, or its gather, refused: a row of its own; the reason printed by rank 0), -1 a failure
   that ends the run (printed). */
static int bench_format(const dist_args *a, dist_run *r, const char *spec) {
  char text[1024], label[256];
  if (bench_recipe_text(spec, "b", text, sizeof text, label, sizeof label))
    return r->rank == 0 ? cli_fail(-1, CMD, "--format %s: not of the form 'PLUGIN[ key=value...]'",
                                   spec)
                        : -1;
  const hq_recipe_opts ropts = {.struct_size = sizeof ropts, .plugins = r->set};
  hq_recipe *rec = NULL;
  hq_quantizer *q = NULL;
  hq_qtensor *shard = NULL, *full = NULL;
  hq_gather *g = NULL;
  void *send = NULL, *recv = NULL;
  double *hq_ms = NULL, *raw_ms = NULL;
  int status = -1, ok = 1;
  char why[512] = "";
  const int64_t srows = a->rows / r->size;
  hq_role role = hq_role_of("linear", "weight", "w");
  if (hq_recipe_parse_string(text, "bench", &ropts, &rec)) {
    snprintf(why, sizeof why, "%s", hq_last_error());
  } else if (hq_recipe_error_count(rec)) {
    snprintf(why, sizeof why, "%s", hq_recipe_error(rec, 0));
  } else if (hq_quantizer_create_ex(rec, &role, NULL, &q) ||
             hq_quantizer_set_usage(q, HQ_ROWWISE | HQ_COLWISE)) {
    snprintf(why, sizeof why, "%s", hq_last_error());
  }
  if (!all_ok(!why[0])) { /* the same recipe everywhere: the ranks agree on skipping it */
    const int skip = !a->user_formats && bench_spec_missing(r->set, spec);
    if (r->rank == 0)
      printf("%-22s %s: %s\n", label, skip ? "skipped" : "failed", why[0] ? why : "(another rank)");
    status = skip ? 1 : 2;
    goto out;
  }
  float *amax = NULL;
  hq_tensor xs = hq_tensor_2d(r->x, HQ_BF16, hq_ctx_device(r->ctx), srows, a->cols);
  if (hq_ctx_alloc(r->ctx, 2 * sizeof(float), (void **)&amax)) {
    snprintf(why, sizeof why, "%s", hq_last_error());
  } else {
    hq_quantize_args qa = {.struct_size = sizeof qa, .amax = amax};
    if (hq_dist_amax(r->hd, q, r->ctx, &xs, amax) || hq_quantize_ex(q, r->ctx, &xs, &qa, &shard))
      snprintf(why, sizeof why, "%s", hq_last_error());
    hq_ctx_free(r->ctx, amax);
  }
  if (!all_ok(!why[0])) {
    if (why[0]) fprintf(stderr, "hq %s: rank %d: %s: %s\n", CMD, r->rank, label, why);
    goto out;
  }
  /* hq_gather_create refuses on every rank alike (a shard that splits a scaling block): skip */
  if (hq_gather_create(r->hd, r->ctx, shard, &g)) {
    if (r->rank == 0) printf("%-22s failed: %s\n", label, hq_last_error());
    status = 2;
    goto out;
  }
  hq_gather_info info = {.struct_size = sizeof info};
  if (hq_gather_get_info(g, &info) ||
      hq_make_empty(q, r->ctx, a->rows, a->cols, HQ_BF16, &full)) {
    snprintf(why, sizeof why, "%s", hq_last_error());
    ok = 0;
  }
  /* the raw call moves the same total: wire_bytes split into equal slots (NCCL's slots are equal
     already; MPI's are with equal shards, which setup requires) */
  const size_t count = (size_t)(info.wire_bytes / (uint64_t)r->size);
  hq_ms = calloc((size_t)a->iters, sizeof *hq_ms);
  raw_ms = calloc((size_t)a->iters, sizeof *raw_ms);
  if (ok && (!hq_ms || !raw_ms)) {
    snprintf(why, sizeof why, "out of memory");
    ok = 0;
  }
  if (ok && (hq_ctx_alloc(r->ctx, count ? count : 1, &send) ||
             hq_ctx_alloc(r->ctx, count ? count * (size_t)r->size : 1, &recv))) {
    snprintf(why, sizeof why, "%s", hq_last_error());
    ok = 0;
  }
  if (ok && a->device == HQ_DEVICE_HOST) memset(send, r->rank + 1, count);
  if (!all_ok(ok)) {
    if (!ok) fprintf(stderr, "hq %s: rank %d: %s: %s\n", CMD, r->rank, label, why);
    goto out;
  }
  for (int it = -a->warmup; it < a->iters; it++) {
    for (int which = 0; which < 2; which++) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      int rc = 0;
      if (which == 0) {
        rc = hq_gather_run(g, r->ctx, shard, full);
        if (rc) fprintf(stderr, "hq %s: rank %d: %s: %s\n", CMD, r->rank, label, hq_last_error());
      } else {
        rc = raw_allgather(a, r, send, recv, count);
      }
      double ms = (MPI_Wtime() - t0) * 1e3, slowest = 0;
      /* an error ends the run on every rank: a failed collective leaves the others' unusable */
      if (!all_ok(rc == 0)) goto out;
      MPI_Allreduce(&ms, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it >= 0) (which ? raw_ms : hq_ms)[it] = slowest;
    }
  }
  qsort(hq_ms, (size_t)a->iters, sizeof *hq_ms, cmp_double);
  qsort(raw_ms, (size_t)a->iters, sizeof *raw_ms, cmp_double);
  if (r->rank == 0) {
    const double bytes = (double)info.wire_bytes, f = (double)(r->size - 1) / r->size;
    const double t_hq = hq_ms[a->iters / 2], t_raw = raw_ms[a->iters / 2];
    const double alg_hq = bytes / (t_hq * 1e6), alg_raw = bytes / (t_raw * 1e6);
    printf("%-22s %12.0f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %6.1f %6.3f\n", label, bytes, t_hq,
           alg_hq, alg_hq * f, t_raw, alg_raw, alg_raw * f, 100.0 * alg_hq / alg_raw,
           bytes / (double)info.bf16_bytes);
  }
  status = 0;
out:
  free(hq_ms);
  free(raw_ms);
  if (send) hq_ctx_free(r->ctx, send);
  if (recv) hq_ctx_free(r->ctx, recv);
  hq_gather_free(g);
  hq_qtensor_free(full);
  hq_qtensor_free(shard);
  hq_quantizer_free(q);
  hq_recipe_free(rec);
  return status;
}

int hq_bench_dist(int argc, char **argv) {
  dist_args a;
  memset(&a, 0, sizeof a);
  const int p = parse(argc, argv, &a);
  if (p) return p == 3 ? 0 : p;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited && MPI_Init(NULL, NULL) != MPI_SUCCESS)
    return cli_fail(1, CMD, "MPI_Init failed (run it with mpirun -np N)");
  dist_run r;
  memset(&r, 0, sizeof r);
  int status = 1;
  if (setup(&a, &r)) goto out;
  if (r.rank == 0) {
    printf("hq bench --dist: %d rank%s, %s, weight %lldx%lld bf16 (%lld rows per rank), both "
           "directions; medians of %d samples after %d warm-up calls\n",
           r.size, r.size == 1 ? "" : "s",
           a.device == HQ_DEVICE_HOST ? "CPU through Open MPI (MPI_Allgather)"
                                      : "GPUs through NCCL (ncclAllGather), one per local rank",
           (long long)a.rows, (long long)a.cols, (long long)(a.rows / r.size), a.iters, a.warmup);
    printf("%-22s %12s %8s %8s %8s %8s %8s %8s %6s %6s\n", "format", "bytes", "hq ms", "algbw",
           "busbw", "raw ms", "algbw", "busbw", "hq%", "xbf16");
  }
  size_t failed = 0;
  for (size_t f = 0; f < a.nformats; f++) {
    const int st = bench_format(&a, &r, a.formats[f]);
    if (st < 0) goto out;
    failed += st == 2;
  }
  if (r.rank == 0)
    printf("bytes: what every rank receives; GB/s; busbw = algbw * (n-1)/n; hq%%: hq's bandwidth "
           "/ the raw all-gather's of the same bytes; xbf16: bytes / the bf16 weight's\n");
  status = failed ? 1 : 0;
  if (failed && r.rank == 0)
    cli_fail(1, CMD, "%zu format%s failed (see the table)", failed, failed == 1 ? "" : "s");
out:
  teardown(&a, &r);
  MPI_Finalize();
  return status;
}

#else /* !HQ_HAVE_MPI */

int hq_bench_dist(int argc, char **argv) {
  dist_args a;
  memset(&a, 0, sizeof a);
  const int p = parse(argc, argv, &a);
  if (p) return p == 3 ? 0 : p;
  return cli_fail(1, CMD, "this hq was built without Open MPI (configure found none): install "
                  "openmpi-bin and libopenmpi-dev and rebuild");
}

#endif
