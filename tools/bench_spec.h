/*
** bench_spec.h -- a format configuration of `hq bench` ("PLUGIN[ key=value...]", from --format
** or the stock list): the recipe that makes it, and whether its module is installed.
*/
#ifndef HQ_BENCH_SPEC_H
#define HQ_BENCH_SPEC_H

#include <stddef.h>

#include "hq/hq.h"

/* The recipe of one format configuration, spec "PLUGIN[ key=value...]" (separated by spaces or
   commas: "nvfp4 rht=true"): a [format NAME] of that plugin with those options, both directions
   of every role, into out (1024 bytes hold any spec of up to 255 characters); the label "PLUGIN
   key=value..." into label unless it is NULL. NAME is the bench's own (messages about the
   format name it). 0, or -1 when spec is not of that form. */
int bench_recipe_text(const char *spec, const char *name, char *out, size_t len, char *label,
                      size_t label_len);

/* Whether the module a spec names ("PLUGIN[ key=value...]") is not installed: set has no
   plugin of that name and rejected no file PLUGIN.so (a rejected module is a fault to report,
   not a missing one). identity, built into libhqcore, is never missing. A stock bench row
   whose module is missing is skipped; any other failure fails it. */
int bench_spec_missing(const hq_plugins *set, const char *spec);

#endif
