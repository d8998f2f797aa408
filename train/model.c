/* train/model.c -- placeholder */
#include "train.h"
typedef int hq_train_model_placeholder;
