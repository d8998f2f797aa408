/* train/loop.c -- placeholder */
#include <stdio.h>
#include "train.h"
int hq_train_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fputs("hq train: not written yet\n", stderr);
  return 1;
}
