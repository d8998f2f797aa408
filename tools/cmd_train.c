/* cmd_train.c -- `hq train`: placeholder */
#include "cli.h"
#include "../train/train.h"
int hq_cmd_train(int argc, char **argv) { return hq_train_main(argc, argv); }
