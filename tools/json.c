/*
** json.c -- a streaming JSON writer for `hq ... --json` (strings escaped per RFC 8259).
*/
#include <math.h>

#include "json.h"

void json_begin(json *j, FILE *f) {
  j->f = f;
  j->depth = 0;
  j->first[0] = 1;
  j->after_key = 0;
}

void json_end(json *j) { fputc('\n', j->f); }

/* Separator before a value or key at the current depth. */
static void sep(json *j) {
  if (j->after_key) {
    j->after_key = 0;
    return;
  }
  if (!j->first[j->depth]) fputc(',', j->f);
  j->first[j->depth] = 0;
}

static void open_(json *j, char c) {
  sep(j);
  fputc(c, j->f);
  if (j->depth < 31) j->depth++;
  j->first[j->depth] = 1;
}

void json_obj(json *j) { open_(j, '{'); }
void json_arr(json *j) { open_(j, '['); }
void json_close_obj(json *j) {
  fputc('}', j->f);
  if (j->depth > 0) j->depth--;
}
void json_close_arr(json *j) {
  fputc(']', j->f);
  if (j->depth > 0) j->depth--;
}

static void write_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\n': fputs("\\n", f); break;
    case '\r': fputs("\\r", f); break;
    case '\t': fputs("\\t", f); break;
    default:
      if (*p < 0x20) fprintf(f, "\\u%04x", *p);
      else fputc(*p, f);
    }
  }
  fputc('"', f);
}

void json_key(json *j, const char *k) {
  sep(j);
  write_string(j->f, k);
  fputc(':', j->f);
  j->after_key = 1;
}

void json_str(json *j, const char *s) {
  sep(j);
  write_string(j->f, s);
}

void json_int(json *j, int64_t v) {
  sep(j);
  fprintf(j->f, "%lld", (long long)v);
}

void json_num(json *j, double v) {
  sep(j);
  /* integers in full (an INT option's 2^63 - 1 bound, not 9.22337204e+18) */
  if (isfinite(v) && fabs(v) < 9.2e18 && v == (double)(long long)v)
    fprintf(j->f, "%lld", (long long)v);
  else if (isfinite(v) && fabs(v) >= 9.2e18 && fabs(v) <= 9.3e18)
    fprintf(j->f, "%s9223372036854775807", v < 0 ? "-" : "");
  else if (isfinite(v))
    fprintf(j->f, "%.9g", v);
  else fputs("null", j->f);
}

void json_bool(json *j, int v) {
  sep(j);
  fputs(v ? "true" : "false", j->f);
}

void json_null(json *j) {
  sep(j);
  fputs("null", j->f);
}

void json_kstr(json *j, const char *k, const char *s) { json_key(j, k); json_str(j, s); }
void json_kstr_or_null(json *j, const char *k, const char *s) {
  json_key(j, k);
  if (s && s[0]) json_str(j, s);
  else json_null(j);
}
void json_kint(json *j, const char *k, int64_t v) { json_key(j, k); json_int(j, v); }
void json_knum(json *j, const char *k, double v) { json_key(j, k); json_num(j, v); }
void json_kbool(json *j, const char *k, int v) { json_key(j, k); json_bool(j, v); }

void json_kints(json *j, const char *k, const int64_t *v, int n) {
  json_key(j, k);
  json_arr(j);
  for (int i = 0; i < n; i++) json_int(j, v[i]);
  json_close_arr(j);
}
