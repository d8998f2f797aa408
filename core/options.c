/*
** options.c -- parsing recipe values against a module's option table, and checking the table.
*/
#include "config.h"
#include "hq_internal.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *hq_opt_type_name(hq_opt_type t) {
  switch (t) {
  case HQ_OPT_BOOL: return "bool";
  case HQ_OPT_INT: return "int";
  case HQ_OPT_FLOAT: return "float";
  case HQ_OPT_ENUM: return "enum";
  case HQ_OPT_STRING: return "string";
  }
  return "invalid";
}

/* Index of `text` among the '|'-separated choices, or -1. */
static int choice_index(const char *choices, const char *text) {
  size_t tl = strlen(text);
  int idx = 0;
  for (const char *p = choices; p && *p; idx++) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == tl && strncmp(p, text, len) == 0) return idx;
    p = bar ? bar + 1 : NULL;
  }
  return -1;
}

static int ranged(const hq_option *o) { return o->min <= o->max; }

/* An option's range bound as a recipe writes it: an int option's in full (9223372036854775807,
   not 9.2233720368547758e+18). */
static const char *bound_text(const hq_option *o, double v, char *buf, size_t len) {
  if (o->type == HQ_OPT_INT && v >= -9.2e18 && v <= 9.2e18)
    snprintf(buf, len, "%lld", (long long)v);
  else if (o->type == HQ_OPT_INT)
    snprintf(buf, len, "%s", v > 0 ? "9223372036854775807" : "-9223372036854775808");
  else
    snprintf(buf, len, "%.17g", v);
  return buf;
}

/* Option o's range as "[min, max]": its own, or an int option's 64-bit limits when it has none. */
static void range_text(const hq_option *o, char *buf, size_t len) {
  char lo[32], hi[32];
  if (!ranged(o))
    snprintf(buf, len, "[-9223372036854775808, 9223372036854775807] (64-bit)");
  else
    snprintf(buf, len, "[%s, %s]", bound_text(o, o->min, lo, sizeof lo),
             bound_text(o, o->max, hi, sizeof hi));
}

int hqi_option_parse(const hq_option *o, const char *text, hq_optval *out, char *err,
                     size_t err_len) {
  memset(out, 0, sizeof *out);
  if (!text) text = "";
  switch (o->type) {
  case HQ_OPT_BOOL:
    if (!strcasecmp(text, "true") || !strcasecmp(text, "yes") || !strcasecmp(text, "on") ||
        !strcmp(text, "1")) {
      out->i = 1;
      return HQ_OK;
    }
    if (!strcasecmp(text, "false") || !strcasecmp(text, "no") || !strcasecmp(text, "off") ||
        !strcmp(text, "0")) {
      out->i = 0;
      return HQ_OK;
    }
    snprintf(err, err_len, "'%s' is not a bool (true/false, yes/no, on/off, 1/0)", text);
    return HQ_EPARSE;
  case HQ_OPT_INT: {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 0);
    char range[96];
    range_text(o, range, sizeof range);
    /* an integer strtoll cannot hold is still an integer: the range is what is wrong */
    if (*text && !*end && errno == ERANGE) {
      snprintf(err, err_len, "'%s' is out of range %s", text, range);
      return HQ_EPARSE;
    }
    if (!*text || *end || errno) {
      const int octal = text[0] == '0' && strspn(text, "0123456789") == strlen(text);
      snprintf(err, err_len, "'%s' is not an integer%s", text,
               octal ? " (a leading 0 reads as octal: digits 0-7)" : "");
      return HQ_EPARSE;
    }
    if (ranged(o) && ((double)v < o->min || (double)v > o->max)) {
      snprintf(err, err_len, "%lld is out of range %s", v, range);
      return HQ_EPARSE;
    }
    out->i = v;
    return HQ_OK;
  }
  case HQ_OPT_FLOAT: {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    /* strtod's ERANGE below DBL_MIN: finite, but too small to hold as a normal double */
    if (*text && !*end && errno == ERANGE && fabs(v) < DBL_MIN) {
      snprintf(err, err_len, "'%s' is too small: its magnitude is below the smallest normal "
               "double (2.2250738585072014e-308); write 0 for zero", text);
      return HQ_EPARSE;
    }
    if (!*text || *end || errno || !isfinite(v)) {
      snprintf(err, err_len, "'%s' is not a finite number", text);
      return HQ_EPARSE;
    }
    if (ranged(o) && (v < o->min || v > o->max)) {
      snprintf(err, err_len, "%s is out of range [%.17g, %.17g]", text, o->min, o->max);
      return HQ_EPARSE;
    }
    out->f = v;
    return HQ_OK;
  }
  case HQ_OPT_ENUM: {
    int i = choice_index(o->choices, text);
    if (i < 0) {
      snprintf(err, err_len, "'%s' is not one of %s", text, o->choices ? o->choices : "(none)");
      return HQ_EPARSE;
    }
    out->i = i;
    return HQ_OK;
  }
  case HQ_OPT_STRING:
    out->s = text;
    return HQ_OK;
  }
  snprintf(err, err_len, "option has an invalid type %d", (int)o->type);
  return HQ_EPARSE;
}

int hqi_option_check(const hq_option *o, char *err, size_t err_len) {
  for (const char *c = o->name; *c; c++) {
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) {
      snprintf(err, err_len, "name is not [a-z0-9_]+");
      return HQ_EABI;
    }
  }
  if (o->name[0] == '\0' || strlen(o->name) > 40) {
    snprintf(err, err_len, "name must be 1-40 characters");
    return HQ_EABI;
  }
  if (o->type < HQ_OPT_BOOL || o->type > HQ_OPT_STRING) {
    snprintf(err, err_len, "invalid type %d", (int)o->type);
    return HQ_EABI;
  }
  if (o->type == HQ_OPT_ENUM && (!o->choices || !o->choices[0])) {
    snprintf(err, err_len, "enum without choices");
    return HQ_EABI;
  }
  if (!o->def) {
    snprintf(err, err_len, "no default value");
    return HQ_EABI;
  }
  hq_optval v;
  char why[200];
  if (hqi_option_parse(o, o->def, &v, why, sizeof why)) {
    snprintf(err, err_len, "invalid default: %s", why);
    return HQ_EABI;
  }
  return HQ_OK;
}
