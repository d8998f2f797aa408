# conf/local.mk
