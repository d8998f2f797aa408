#!/bin/sh
# test_train.sh -- placeholder
exit 77
