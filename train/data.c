/* train/data.c -- placeholder */
#include "train.h"
typedef int hq_train_data_placeholder;
