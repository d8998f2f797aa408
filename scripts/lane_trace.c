/*
** lane_trace.c -- a CUPTI injection library (loaded by the CUDA driver from CUDA_INJECTION64_PATH)
** that records every kernel, memcpy and memset the process runs -- GPU start and end, stream,
** graph and graph node -- and writes them as CSV to $HQ_LANE_TRACE (default lane_trace.csv):
** the timeline of a replayed CUDA graph, whose streams Nsight Compute serializes and CUDA events
** cannot time from inside. scripts/lanes.py reads it; scripts/gpu-check.sh --lanes builds this
** and runs hq train under it. A developer's tool, not part of hq.
*/
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#define TRACE_BUF (8u << 20) /* bytes per activity buffer: CUPTI hands full ones back */

static FILE *out;

static void CUPTIAPI requested(uint8_t **buf, size_t *size, size_t *max_records) {
  *buf = aligned_alloc(8, TRACE_BUF);
  *size = *buf ? TRACE_BUF : 0;
  *max_records = 0;
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                               size_t valid) {
  (void)ctx, (void)stream, (void)size;
  CUpti_Activity *r = NULL;
  while (out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
      fprintf(out, "kernel,%llu,%llu,%u,%u,%llu,%s\n", (unsigned long long)k->start,
              (unsigned long long)k->end, k->streamId, k->graphId,
              (unsigned long long)k->graphNodeId, k->name ? k->name : "?");
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
      fprintf(out, "memcpy,%llu,%llu,%u,%u,%llu,memcpy %llu bytes\n",
              (unsigned long long)m->start, (unsigned long long)m->end, m->streamId, m->graphId,
              (unsigned long long)m->graphNodeId, (unsigned long long)m->bytes);
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
      fprintf(out, "memset,%llu,%llu,%u,%u,%llu,memset %llu bytes\n",
              (unsigned long long)m->start, (unsigned long long)m->end, m->streamId, m->graphId,
              (unsigned long long)m->graphNodeId, (unsigned long long)m->bytes);
    }
  }
  size_t dropped = 0;
  if (out && cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
    fprintf(out, "dropped,0,0,%u,0,0,%zu records\n", stream, dropped);
  free(buf);
}

/* Every buffer handed back before the process ends: at a context's teardown (the driver may go
   before the atexit handlers run) and at exit, whichever comes first does the work. */
static void flush(void) {
  if (!out) return;
  cuptiActivityFlushAll(1);
  fflush(out);
}

static void CUPTIAPI on_resource(void *data, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                                 const void *info) {
  (void)data, (void)info;
  if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
    flush();
}

static void at_exit(void) {
  flush();
  if (out) fclose(out);
  out = NULL;
}

/* The driver's entry point for CUDA_INJECTION64_PATH: 1 when the tracing is on. */
int InitializeInjection(void) {
  const char *path = getenv("HQ_LANE_TRACE");
  out = fopen(path ? path : "lane_trace.csv", "w");
  if (!out) {
    perror("lane_trace: the output file");
    return 0;
  }
  fprintf(out, "kind,start_ns,end_ns,stream,graph,node,name\n");
  CUpti_SubscriberHandle sub;
  if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS ||
      cuptiSubscribe(&sub, on_resource, NULL) != CUPTI_SUCCESS ||
      cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE,
                          CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) != CUPTI_SUCCESS) {
    fprintf(stderr, "lane_trace: CUPTI refused the activity tracing\n");
    fclose(out);
    out = NULL;
    return 0;
  }
  atexit(at_exit);
  return 1;
}
