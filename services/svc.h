/*
** svc.h -- declarations shared by the files of libhqtrain, the trainer services (services/;
** never installed). libhqtrain is built on libhqcore's public API alone -- hq/hq.h, hq/plugin.h,
** hq/adamw.h -- and reaches no core internal. Every services .c file includes "config.h" and
** then this header first. Its cross-file functions are hqt_*.
*/
#ifndef HQ_SVC_H
#define HQ_SVC_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "hq/train.h"

/* Prepend "<prefix>: " to the thread's last error (its status text when there is none), as the
   core does to a plugin's message; returns code. */
int hqt_error_prefix(int code, const char *fmt, ...) HQ_PRINTF(2, 3);
/* a, sep and b concatenated into a new string (malloc; NULL when out of memory): the entry and
   key names of a checkpoint ("<name>/<buffer>", "<name>/hq"). */
char *hqt_join(const char *a, const char *sep, const char *b);
/* What a file of mode `mode` (struct stat's st_mode) is, for a message: "a directory", "a FIFO",
   "a character device", ... */
const char *hqt_file_kind(unsigned mode);

#endif /* HQ_SVC_H */
