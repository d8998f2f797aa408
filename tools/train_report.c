/*
** train_report.c -- `hq train --profile`'s table and JSON (train_report.h). Every number is per
** step: the profile's sums over its steps divided by their count.
*/
#include <string.h>

#include "train_report.h"

void train_report_bytes(int64_t bytes, char *buf, size_t n) {
  if (bytes < 0) snprintf(buf, n, "-");
  else if (bytes >= (int64_t)1 << 30) snprintf(buf, n, "%.2f GiB", (double)bytes / (1 << 30));
  else snprintf(buf, n, "%.1f MiB", (double)bytes / (1 << 20));
}

/* the JSON key of a phase: its name with '_' for ' ' */
static void key_of(const char *name, char *out, size_t n) {
  snprintf(out, n, "%s", name);
  for (char *p = out; *p; p++)
    if (*p == ' ') *p = '_';
}

void train_report_profile_text(FILE *f, const char *name, const train_result *r) {
  const train_prof_result *p = &r->prof;
  if (p->steps <= 0) return;
  const double k = 1.0 / (double)p->steps, span = p->span_s * k;
  fprintf(f, "\nprofile of %s: steps %lld..%lld (%lld), per step, %s\n", name,
          (long long)p->first_step, (long long)(p->first_step + p->steps - 1), (long long)p->steps,
          p->gpu ? "GPU time between CUDA events on the context's stream"
                 : "host clock (clock_gettime)");
  fprintf(f, "  %-22s %8s %10s %7s\n", "phase", "calls", "ms", "share");
  for (int i = 0; i < TRAIN_PH_N; i++) {
    if (!p->calls[i]) continue;
    const double ms = 1e3 * p->phase_s[i] * k;
    fprintf(f, "  %-22s %8.4g %10.4f %6.1f%%\n", train_prof_phase_name(i), (double)p->calls[i] * k,
            ms, span > 0 ? 100.0 * p->phase_s[i] * k / span : 0.0);
    if (i != TRAIN_PH_KERNELS) continue;
    /* its parts, indented: they add up to the line above */
    for (int q = 0; q < TRAIN_PK_N; q++)
      if (p->kernel_calls[q])
        fprintf(f, "    %-20s %8.4g %10.4f %6.1f%%\n", train_prof_kernel_name(q),
                (double)p->kernel_calls[q] * k, 1e3 * p->kernel_s[q] * k,
                span > 0 ? 100.0 * p->kernel_s[q] * k / span : 0.0);
  }
  fprintf(f, "  %-22s %8s %10.4f %6.1f%%\n", p->gpu ? "idle (GPU gaps)" : "host overhead", "",
          1e3 * p->other_s * k, span > 0 ? 100.0 * p->other_s * k / span : 0.0);
  fprintf(f, "  %-22s %8s %10.4f %6.1f%%\n", p->gpu ? "step (GPU span)" : "step", "", 1e3 * span,
          100.0);
  if (p->gpu) fprintf(f, "  %-22s %8s %10.4f\n", "step (host wall)", "", 1e3 * p->step_s * k);
  fprintf(f, "  quantize calls per step:");
  for (int q = 0; q < TRAIN_QT_N; q++)
    fprintf(f, "%s %s %.4g", q ? "," : "", train_prof_qt_name(q), (double)p->quantize_calls[q] * k);
  fprintf(f, "\n");
}

void train_report_profile_json(json *j, const train_result *r) {
  const train_prof_result *p = &r->prof;
  json_key(j, "peak_device_bytes");
  if (r->peak_bytes < 0) json_null(j);
  else json_int(j, r->peak_bytes);
  json_key(j, "profile");
  if (p->steps <= 0) {
    json_null(j);
    return;
  }
  const double k = 1.0 / (double)p->steps;
  char key[64];
  json_obj(j);
  json_kstr(j, "timer", p->gpu ? "cuda_events" : "host_clock");
  json_kint(j, "first_step", p->first_step);
  json_kint(j, "steps", p->steps);
  json_knum(j, "step_ms", 1e3 * p->step_s * k);
  json_knum(j, "span_ms", 1e3 * p->span_s * k);
  json_knum(j, p->gpu ? "idle_ms" : "host_overhead_ms", 1e3 * p->other_s * k);
  json_key(j, "phases");
  json_obj(j);
  for (int i = 0; i < TRAIN_PH_N; i++) {
    key_of(train_prof_phase_name(i), key, sizeof key);
    json_key(j, key);
    json_obj(j);
    json_knum(j, "calls", (double)p->calls[i] * k);
    json_knum(j, "ms", 1e3 * p->phase_s[i] * k);
    if (i == TRAIN_PH_KERNELS) {   /* its parts, which add up to it */
      json_key(j, "parts");
      json_obj(j);
      for (int q = 0; q < TRAIN_PK_N; q++) {
        key_of(train_prof_kernel_name(q), key, sizeof key);
        json_key(j, key);
        json_obj(j);
        json_knum(j, "calls", (double)p->kernel_calls[q] * k);
        json_knum(j, "ms", 1e3 * p->kernel_s[q] * k);
        json_close_obj(j);
      }
      json_close_obj(j);
    }
    json_close_obj(j);
  }
  json_close_obj(j);
  json_key(j, "quantize_calls");
  json_obj(j);
  for (int q = 0; q < TRAIN_QT_N; q++) {
    key_of(train_prof_qt_name(q), key, sizeof key);
    json_knum(j, key, (double)p->quantize_calls[q] * k);
  }
  json_close_obj(j);
  json_close_obj(j);
}
