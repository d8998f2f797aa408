/*
** svc_util.c -- the small helpers the files of libhqtrain share: error prefixes, joined names;
** and hq_output_target, the rule every file hq writes follows (checkpoints here, the hq
** command's .npy and .png files).
*/
#include "config.h"
#include "svc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int hqt_error_prefix(int code, const char *fmt, ...) {
  char prefix[512], cause[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  snprintf(cause, sizeof cause, "%s", hq_last_error()[0] ? hq_last_error() : hq_strerror(code));
  return hq_set_error(code, "%s: %s", prefix, cause);
}

char *hqt_join(const char *a, const char *sep, const char *b) {
  const size_t na = strlen(a), ns = strlen(sep), nb = strlen(b);
  char *p = malloc(na + ns + nb + 1);
  if (!p) return NULL;
  memcpy(p, a, na);
  memcpy(p + na, sep, ns);
  memcpy(p + na + ns, b, nb + 1);
  return p;
}

const char *hqt_file_kind(unsigned mode) {
  const mode_t m = (mode_t)mode;
  return S_ISDIR(m)    ? "a directory"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISFIFO(m) ? "a FIFO"
         : S_ISSOCK(m) ? "a socket"
                       : "a file of another kind";
}

/* The symbolic link at `link` read into a new string (NULL, errno set, on failure). */
static char *read_link(const char *link, off_t size) {
  size_t len = size > 0 ? (size_t)size + 1 : 256;
  for (char *buf = NULL;; len *= 2) {
    char *p = realloc(buf, len);
    if (!p) {
      free(buf);
      return NULL;
    }
    buf = p;
    const ssize_t n = readlink(link, buf, len);
    if (n < 0) {
      free(buf);
      return NULL;
    }
    if ((size_t)n < len) {
      buf[n] = '\0';
      return buf;
    }
  }
}

int hq_output_target(const char *path, char **target) {
  *target = NULL;
  char *cur = path ? strdup(path) : NULL;
  if (!path) return hq_set_error(HQ_EINVAL, "hq_output_target: no path");
  for (int hops = 0; cur; hops++) {
    struct stat st;
    if (lstat(cur, &st) != 0) {
      const int e = errno;
      if (e != ENAMETOOLONG) break; /* a name that does not exist yet: the file to create */
      free(cur);
      return hq_set_error(HQ_EIO, "%s", strerror(e));
    }
    if (S_ISREG(st.st_mode)) break;
    const int linked = strcmp(cur, path) != 0;
    int rc = HQ_OK;
    /* a rename over a device, a FIFO or a socket would replace it by the file */
    if (!S_ISLNK(st.st_mode))
      rc = hq_set_error(HQ_EIO, "not a regular file (%s%s%.300s): hq writes its output only to "
                        "a regular file or a new one", hqt_file_kind(st.st_mode),
                        linked ? ", the link's target " : "", linked ? cur : "");
    else if (hops == 40)
      rc = hq_set_error(HQ_EIO, "more than 40 symbolic links to follow");
    char *link = rc ? NULL : read_link(cur, st.st_size);
    if (!rc && !link)
      rc = errno == ENOMEM ? hq_set_error(HQ_ENOMEM, "out of memory")
                           : hq_set_error(HQ_EIO, "reading the link %.300s: %s", cur,
                                          strerror(errno));
    char *next = link;
    const char *slash = strrchr(cur, '/');
    if (!rc && link[0] != '/' && slash) { /* relative to the link's directory */
      const size_t d = (size_t)(slash - cur) + 1;
      if ((next = malloc(d + strlen(link) + 1))) {
        memcpy(next, cur, d);
        strcpy(next + d, link);
      }
      free(link);
      if (!next) rc = hq_set_error(HQ_ENOMEM, "out of memory");
    }
    free(cur);
    if (rc) return rc;
    cur = next;
  }
  if (!cur) return hq_set_error(HQ_ENOMEM, "out of memory");
  *target = cur;
  return HQ_OK;
}
