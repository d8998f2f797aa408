# plugins/nvfp4/local.mk -- the nvfp4 format (see issue: block-scaled formats)
