/* train.h -- placeholder */
#ifndef HQ_TRAIN_H
#define HQ_TRAIN_H
int hq_train_main(int argc, char **argv);
#endif
