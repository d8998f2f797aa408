# conf/local.mk -- the default recipe and examples, installed to $(datadir)/hq
dist_hqrecipe_DATA += conf/recipe.ini
hqexampledir = $(hqrecipedir)/examples
dist_hqexample_DATA = conf/examples/fp8_current.ini conf/examples/fp8_current_hybrid.ini \
	conf/examples/fp8_block.ini conf/examples/high_precision.ini \
	conf/examples/hybrid_fp8_identity.ini conf/examples/fp8_delayed.ini \
	conf/examples/mxfp8.ini conf/examples/nvfp4.ini \
	conf/examples/nvfp4_rowscaled_mxfp8.ini conf/examples/mxfp4.ini conf/examples/mxfp6.ini \
	conf/examples/nvfp4_ue5m3.ini
