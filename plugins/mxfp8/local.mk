# plugins/mxfp8/local.mk -- the mxfp8 format (see issue: block-scaled formats)
