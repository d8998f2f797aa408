# plugins/fp8_block/local.mk -- the fp8_block format (see issue: block-scaled formats)
