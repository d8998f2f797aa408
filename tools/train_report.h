/*
** train_report.h -- what `hq train --profile` prints (tools/train_report.c): the per-phase table
** of a run and the same numbers in --json, and the peak device memory of a run.
*/
#ifndef HQ_TRAIN_REPORT_H
#define HQ_TRAIN_REPORT_H

#include <stdio.h>

#include "../train/train.h"
#include "json.h"

/* The profile table of run `name` (nothing when r->prof.steps is 0). */
void train_report_profile_text(FILE *f, const char *name, const train_result *r);
/* "profile": {...} (null when not profiled) and "peak_device_bytes" (null on the host). */
void train_report_profile_json(json *j, const train_result *r);
/* "1.23 GiB", "-" when unknown (bytes < 0) */
void train_report_bytes(int64_t bytes, char *buf, size_t n);

#endif
