/*
** data.c -- the corpus of `hq train`: words from a text file (by default the system word list,
** /usr/share/dict/words from the Debian package wamerican) turned into makemore-style examples.
**
** Vocabulary: 27 tokens, '.' (0) marks the start and the end of a word, 'a'..'z' are 1..26.
** A word of n letters gives n + 1 examples: for each position, the previous C tokens (padded with
** '.' before the word's start) and the token to predict; the last one predicts the closing '.'.
** "emma" with C = 3: "..." -> e, "..e" -> m, ".em" -> m, "emm" -> a, "mma" -> '.'.
** The words are shuffled with the seed and split 90 / 10 into training and held-out words, so no
** held-out word is ever trained on.
*/
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train.h"

#define MAX_FILE_BYTES (256u << 20)
#define MAX_WORD_LETTERS 1000 /* a longer token is no word (the model's context is short) */

// --- random numbers ----------------------------------------------------------------------------

uint64_t train_rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double train_rng_uniform(uint64_t *s) {
  return (double)(train_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

float train_rng_normal(uint64_t *s) {
  double u1 = train_rng_uniform(s), u2 = train_rng_uniform(s);
  if (u1 < 1e-300) u1 = 1e-300;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t train_rng_stream(uint64_t seed, uint64_t purpose) {
  uint64_t s = seed ^ (purpose * 0xD1B54A32D192ED03ull);
  train_rng_next(&s);
  return train_rng_next(&s);
}

// --- loading ------------------------------------------------------------------------------------

typedef struct word {
  const char *s;
  int len;
} word;

static int read_file(const char *path, int is_default, char **out, size_t *n, char *err,
                     size_t err_len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (is_default && errno == ENOENT)
      snprintf(err, err_len,
               "%s: no such file -- the system word list; install the Debian package %s "
               "(apt-get install %s) or give another text file with --data FILE",
               path, TRAIN_DEFAULT_DATA_PACKAGE, TRAIN_DEFAULT_DATA_PACKAGE);
    else
      snprintf(err, err_len, "%s: %s", path, strerror(errno));
    return -1;
  }
  /* fopen opens a directory for reading too; only its reads fail, saying less */
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
    fclose(f);
    snprintf(err, err_len, "%s: is a directory, not a text file", path);
    return -1;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap + 1);
  for (;;) {
    if (!buf) {
      fclose(f);
      snprintf(err, err_len, "%s: out of memory", path);
      return -1;
    }
    errno = 0;
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0) break;
    if (len == cap) {
      if (cap >= MAX_FILE_BYTES) {
        free(buf);
        fclose(f);
        snprintf(err, err_len, "%s: larger than %u MiB", path, MAX_FILE_BYTES >> 20);
        return -1;
      }
      char *nb = realloc(buf, cap * 2 + 1);
      if (!nb) free(buf);
      buf = nb;
      cap *= 2;
    }
  }
  const int bad = ferror(f) ? (errno ? errno : EIO) : 0;
  fclose(f);
  if (bad) {
    free(buf);
    snprintf(err, err_len, "%s: read error: %s", path, strerror(bad));
    return -1;
  }
  buf[len] = '\0';
  *out = buf;
  *n = len;
  return 0;
}

static int is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* Examples of words[0..n) into x, y; returns the count. */
static int64_t make_examples(const word *w, int64_t n, int C, uint8_t *x, uint8_t *y) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) {
    for (int p = 0; p <= w[i].len; p++, k++) {
      for (int c = 0; c < C; c++) {
        int src = p - C + c;   /* position in the word of this context slot */
        x[k * C + c] = src < 0 ? 0 : (uint8_t)(w[i].s[src] - 'a' + 1);
      }
      y[k] = p < w[i].len ? (uint8_t)(w[i].s[p] - 'a' + 1) : 0;
    }
  }
  return k;
}

int train_data_load(train_data *d, const char *path, int is_default, int context, uint64_t seed,
                    char *err, size_t err_len) {
  memset(d, 0, sizeof *d);
  if (context < 1 || context > 256) {
    snprintf(err, err_len, "context %d: must be 1..256", context);
    return -1;
  }
  char *text;
  size_t len;
  if (read_file(path, is_default, &text, &len, err, err_len)) return -1;

  /* words: whitespace-separated tokens of a-z only */
  size_t cap = 1024;
  int64_t n = 0, n_long = 0;
  word *w = malloc(cap * sizeof *w);
  for (size_t i = 0; w && i < len;) {
    while (i < len && is_space(text[i])) i++;
    size_t start = i;
    int ok = 1;
    while (i < len && !is_space(text[i])) {
      if (text[i] < 'a' || text[i] > 'z') ok = 0;
      i++;
    }
    n_long += ok && i - start > MAX_WORD_LETTERS;
    if (i == start || !ok || i - start > MAX_WORD_LETTERS) continue;
    if ((size_t)n == cap) {
      word *nw = realloc(w, 2 * cap * sizeof *w);
      if (!nw) {
        free(w);
        w = NULL;
        break;
      }
      w = nw;
      cap *= 2;
    }
    w[n].s = text + start;
    w[n].len = (int)(i - start);
    n++;
  }
  if (!w) {
    free(text);
    snprintf(err, err_len, "%s: out of memory", path);
    return -1;
  }
  if (n < 2) {
    free(w);
    free(text);
    char more[96] = "";
    if (n_long)
      snprintf(more, sizeof more, "; %lld longer one%s left out", (long long)n_long,
               n_long == 1 ? "" : "s");
    snprintf(err, err_len,
             "%s: %lld word(s) of 1 to %d letters a-z (whitespace-separated, lowercase%s); at "
             "least 2 are needed (one to train on, one held out)",
             path, (long long)n, MAX_WORD_LETTERS, more);
    return -1;
  }

  /* shuffle (Fisher-Yates) and split 90 / 10 */
  uint64_t rng = train_rng_stream(seed, 1);
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(train_rng_next(&rng) % (uint64_t)(i + 1));
    word t = w[i];
    w[i] = w[j];
    w[j] = t;
  }
  int64_t n_eval = n / 10 ? n / 10 : 1;
  int64_t n_train = n - n_eval;
  int64_t ex_train = 0, ex_eval = 0;
  for (int64_t i = 0; i < n; i++) *(i < n_train ? &ex_train : &ex_eval) += w[i].len + 1;

  d->context = context;
  d->n_words = n;
  d->n_train_words = n_train;
  d->n_eval_words = n_eval;
  d->train_x = malloc((size_t)ex_train * (size_t)context);
  d->train_y = malloc((size_t)ex_train);
  d->eval_x = malloc((size_t)ex_eval * (size_t)context);
  d->eval_y = malloc((size_t)ex_eval);
  if (!d->train_x || !d->train_y || !d->eval_x || !d->eval_y) {
    free(w);
    free(text);
    train_data_free(d);
    snprintf(err, err_len, "%s: out of memory for %lld examples", path,
             (long long)(ex_train + ex_eval));
    return -1;
  }
  d->n_train = make_examples(w, n_train, context, d->train_x, d->train_y);
  d->n_eval = make_examples(w + n_train, n_eval, context, d->eval_x, d->eval_y);
  free(w);
  free(text);
  return 0;
}

void train_data_free(train_data *d) {
  free(d->train_x);
  free(d->train_y);
  free(d->eval_x);
  free(d->eval_y);
  memset(d, 0, sizeof *d);
}

void train_data_sample(const train_data *d, uint64_t *rng, int64_t batch, int32_t *x, int32_t *y) {
  const int C = d->context;
  for (int64_t b = 0; b < batch; b++) {
    int64_t k = (int64_t)(train_rng_next(rng) % (uint64_t)d->n_train);
    for (int c = 0; c < C; c++) x[b * C + c] = d->train_x[k * C + c];
    y[b] = d->train_y[k];
  }
}

int64_t train_data_eval_batch(const train_data *d, int64_t first, int64_t batch, int32_t *x,
                              int32_t *y) {
  const int C = d->context;
  int64_t real = 0;
  for (int64_t b = 0; b < batch; b++) {
    int64_t k = first + b;
    int in = k < d->n_eval;
    for (int c = 0; c < C; c++) x[b * C + c] = in ? d->eval_x[k * C + c] : 0;
    y[b] = in ? d->eval_y[k] : 0;
    real += in;
  }
  return real;
}
