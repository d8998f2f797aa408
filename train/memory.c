/*
** memory.c -- what a training run will allocate, estimated before it allocates anything, and the
** memory the machine (or the container) has for it, so that `hq train` refuses a run that cannot
** fit instead of being killed by the OOM killer hours later (docs/training.md, 7).
**
** The estimate counts every buffer train_model_create allocates (model.c), the quantized copies
** at their largest (both directions in F32, which no stock format exceeds), the temporaries of a
** GEMM on the CPU path (each operand dequantized to F32) and of a quantize, the host copy a
** checkpoint save makes, and a fixed allowance for the process itself (code, plugins, the BLAS
** library's buffers). It is an upper bound for the stock formats, not an exact count.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train.h"

/* The process before the model: the executable, libhqcore and its plugins, OpenBLAS's thread
   buffers and the C library's arenas. */
#define TRAIN_MEM_PROCESS ((uint64_t)64 << 20)

void train_memory_estimate(const train_config *cfg, int n_results, train_memory *out) {
  const train_model_cfg *c = &cfg->model;
  const uint64_t B = (uint64_t)c->batch, f = sizeof(float);
  uint64_t in = (uint64_t)c->context * (uint64_t)c->embed, params = 0, acts = 0, qacts = 0;
  uint64_t widest = (uint64_t)c->vocab_pad, biggest_w = (uint64_t)TRAIN_VOCAB * (uint64_t)c->embed;
  uint64_t gemm = 0, weights = 0;
  for (int i = 0; i <= c->layers; i++) {
    const uint64_t out_w = i < c->layers ? (uint64_t)c->hidden : (uint64_t)c->vocab_pad;
    const uint64_t w = in * out_w;
    weights += w;
    params += 4 * (w + out_w) * f;           /* master, gradient, Adam m and v; the same for b */
    acts += B * (in + out_w) * f;            /* x (kept for the backward pass) and y */
    qacts += 2 * B * in * f;                 /* the quantized input kept for wgrad, both dirs */
    if (w > biggest_w) biggest_w = w;
    if (in > widest) widest = in;
    if (out_w > widest) widest = out_w;
    /* a GEMM on the CPU path dequantizes both operands to F32: the weight and an activation
       (fprop, dgrad) or two activations (wgrad) */
    const uint64_t g = (w > B * out_w ? w : B * out_w) + B * in + B * out_w;
    if (g * f > gemm) gemm = g * f;
    in = out_w;
  }
  const uint64_t emb = 4 * (uint64_t)TRAIN_VOCAB * (uint64_t)c->embed * f;
  const uint64_t qweights = 2 * weights * f;                    /* both directions, F32 at most */
  const uint64_t fixed = B * (uint64_t)c->context * 4 + B * 4   /* tokens, targets */
                         + B * (uint64_t)c->vocab_pad * f       /* dlogits */
                         + 2 * B * widest * f                   /* the gradients flowing down */
                         + (uint64_t)(c->layers + 1) * 4 * f;   /* the fused amaxes */
  /* the device table's scratch: the CUDA table's, the larger (the CPU's is none) */
  const train_device_ops *dops = train_cuda_ops();
  const uint64_t scratch =
      dops ? dops->scratch_bytes((int64_t)B, c->context, c->embed, (int64_t)widest) : 0;
  /* a quantize holds the source's F32 copy (RHT, stochastic rounding) and the gradient's
     quantized copy, both directions, lives through a layer's backward pass */
  const uint64_t quant = biggest_w * f + 2 * B * widest * f;
  const uint64_t model = params + emb + qweights + acts + qacts + fixed + scratch;
  /* a checkpoint save copies every saved buffer to the host before writing: the masters,
     moments and quantized weights; --verify-resume then reads two checkpoints back */
  const uint64_t ckpt = (params * 3) / 4 + emb * 3 / 4 + qweights;
  uint64_t saves = 0;
  if (cfg->ckpt_path) saves = ckpt;
  if (cfg->verify_resume) saves = 2 * ckpt;
  /* the curves of every finished run (every step's loss, the evals) */
  const uint64_t results =
      (uint64_t)n_results * ((uint64_t)cfg->steps + 8) * sizeof(train_point) * 2;
  memset(out, 0, sizeof *out);
  out->model = model;
  out->work = gemm + quant;
  out->checkpoint = saves;
  if (cfg->device == HQ_DEVICE_HOST) {
    out->host = TRAIN_MEM_PROCESS + model + gemm + quant + saves + results;
  } else {
    /* on a GPU the model and the GEMMs' temporaries are device memory; the host keeps the
       initial weights' staging buffer, the checkpoint copies and the curves */
    out->device = model + gemm + quant;
    out->host = TRAIN_MEM_PROCESS + biggest_w * f + saves + results;
  }
}

/* A number of bytes from a file holding one (cgroup's "max" and unreadable files: 0). */
static uint64_t read_u64(const char *path) {
  FILE *fp = fopen(path, "r");
  if (!fp) return 0;
  char buf[64] = "";
  const int ok = fgets(buf, sizeof buf, fp) != NULL;
  fclose(fp);
  if (!ok || buf[0] < '0' || buf[0] > '9') return 0;
  return strtoull(buf, NULL, 10);
}

/* "MemAvailable:" of /proc/meminfo in bytes, 0 when absent. */
static uint64_t meminfo_available(void) {
  FILE *fp = fopen("/proc/meminfo", "r");
  if (!fp) return 0;
  char line[256];
  uint64_t kb = 0;
  while (fgets(line, sizeof line, fp))
    if (sscanf(line, "MemAvailable: %llu kB", (unsigned long long *)&kb) == 1) break;
  fclose(fp);
  return kb * 1024;
}

/* A size with an optional K, M, G or T suffix (powers of 1024): 0 when not one. */
static uint64_t parse_size(const char *s) {
  char *end;
  const double v = strtod(s, &end);
  if (end == s || !(v > 0)) return 0;
  double m = 1;
  switch (*end) {
  case 'K': case 'k': m = 1024.0; end++; break;
  case 'M': case 'm': m = 1048576.0; end++; break;
  case 'G': case 'g': m = 1073741824.0; end++; break;
  case 'T': case 't': m = 1099511627776.0; end++; break;
  default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  return *end ? 0 : (uint64_t)(v * m);
}

/* The cgroup's inactive file pages (memory.stat), at most `used`. */
static uint64_t inactive_file(int v1, uint64_t used) {
  FILE *fp = fopen(v1 ? "/sys/fs/cgroup/memory/memory.stat" : "/sys/fs/cgroup/memory.stat", "r");
  if (!fp) return 0;
  char line[256];
  unsigned long long v = 0;
  const char *key = v1 ? "total_inactive_file %llu" : "inactive_file %llu";
  while (fgets(line, sizeof line, fp))
    if (sscanf(line, key, &v) == 1) break;
  fclose(fp);
  return v < used ? v : used;
}

int train_memory_available(int device, uint64_t *bytes, char *source, size_t source_len) {
  const char *env = getenv(device == HQ_DEVICE_HOST ? "HQ_TRAIN_HOST_MEMORY"
                                                     : "HQ_TRAIN_DEVICE_MEMORY");
  if (env && *env) {   /* pretend a smaller machine (tests), or trust the user */
    *bytes = parse_size(env);
    snprintf(source, source_len, "%s=%s", device == HQ_DEVICE_HOST ? "HQ_TRAIN_HOST_MEMORY"
                                                                  : "HQ_TRAIN_DEVICE_MEMORY",
             env);
    return *bytes ? 0 : -1;
  }
  if (device != HQ_DEVICE_HOST) {
    uint64_t total;
    if (train_cuda_mem_info(device, bytes, &total)) return -1;
    snprintf(source, source_len, "free on CUDA device %d of %.1f GiB", device,
             (double)total / 1073741824.0);
    return 0;
  }
  uint64_t avail = meminfo_available();
  snprintf(source, source_len, "MemAvailable");
  if (!avail) {   /* no /proc: the free pages */
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) avail = (uint64_t)pages * (uint64_t)page;
    snprintf(source, source_len, "free pages");
  }
  /* a container is limited by its cgroup, whatever the machine has: v2, then v1 (whose "no
     limit" is a huge number, larger than any MemAvailable) */
  static const char *const limits[][2] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (int i = 0; i < 2; i++) {
    const uint64_t limit = read_u64(limits[i][0]);
    uint64_t used = read_u64(limits[i][1]);
    if (!limit) continue;
    used -= inactive_file(i, used);   /* clean page cache the kernel reclaims before killing */
    const uint64_t left = limit > used ? limit - used : 0;
    if (!avail || left < avail) {
      avail = left;
      snprintf(source, source_len, "the cgroup's limit %s of %.1f GiB less its %.1f GiB in use",
               limits[i][0], (double)limit / 1073741824.0, (double)used / 1073741824.0);
    }
    break;
  }
  *bytes = avail;
  return avail ? 0 : -1;
}
