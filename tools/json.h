/*
** json.h -- a minimal streaming JSON writer for `hq ... --json` (tools/json.c): compact output,
** keys in the order written, strings escaped per RFC 8259.
*/
#ifndef HQ_JSON_H
#define HQ_JSON_H

#include <stdint.h>
#include <stdio.h>

typedef struct json {
  FILE *f;
  int depth;
  int first[32];   /* no element written yet at this depth */
  int after_key;
} json;

void json_begin(json *j, FILE *f);
void json_end(json *j);                              /* final newline */
void json_obj(json *j);                              /* { */
void json_arr(json *j);                              /* [ */
void json_close_obj(json *j);                        /* } */
void json_close_arr(json *j);                        /* ] */
void json_key(json *j, const char *k);
void json_str(json *j, const char *s);
void json_int(json *j, int64_t v);
void json_num(json *j, double v);                    /* non-finite -> null */
void json_bool(json *j, int v);
void json_null(json *j);
/* key + value shortcuts */
void json_kstr(json *j, const char *k, const char *s);
void json_kstr_or_null(json *j, const char *k, const char *s); /* null where s is NULL or "" */
void json_kint(json *j, const char *k, int64_t v);
void json_knum(json *j, const char *k, double v);
void json_kbool(json *j, const char *k, int v);
void json_kints(json *j, const char *k, const int64_t *v, int n); /* [v[0], ..., v[n-1]] */

#endif
