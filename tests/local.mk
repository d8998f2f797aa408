# tests/local.mk -- CMocka tests (make check). GPU tests exit 77 (skip) without a device.
if HQ_TESTS
HQ_TEST_CPPFLAGS = $(AM_CPPFLAGS) $(CMOCKA_CFLAGS) -I$(top_srcdir)/plugins/common \
	-I$(top_srcdir)/plugins/mxfp8 -I$(top_srcdir)/plugins/nvfp4 -I$(top_srcdir)/plugins/fp8_block \
	-I$(top_srcdir)/plugins/fp8_tensor
HQ_TEST_LDADD = services/libhqtrain.la core/libhqcore.la $(CMOCKA_LIBS) -lm

# Fixture modules for the loader tests: built (as shared modules, hence -rpath) only for make check.
HQ_FIXTURE_LDFLAGS = -module -avoid-version -shared -rpath /nowhere -no-undefined $(HQ_SAN_LDFLAGS)
check_LTLIBRARIES += tests/plugins/good.la
tests_plugins_good_la_SOURCES = tests/plugins/fixture.c
tests_plugins_good_la_CPPFLAGS = $(AM_CPPFLAGS) 
tests_plugins_good_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
# (in a folder of its own: the loader tests count what tests/plugins/ holds)
check_LTLIBRARIES += tests/plugins/wide/wide_options.la
tests_plugins_wide_wide_options_la_SOURCES = tests/plugins/fixture.c
tests_plugins_wide_wide_options_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_WIDE_OPTIONS
tests_plugins_wide_wide_options_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/good_dup.la
tests_plugins_good_dup_la_SOURCES = tests/plugins/fixture.c
tests_plugins_good_dup_la_CPPFLAGS = $(AM_CPPFLAGS) 
tests_plugins_good_dup_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/bad_major.la
tests_plugins_bad_major_la_SOURCES = tests/plugins/fixture.c
tests_plugins_bad_major_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_BAD_MAJOR
tests_plugins_bad_major_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/newer_minor.la
tests_plugins_newer_minor_la_SOURCES = tests/plugins/fixture.c
tests_plugins_newer_minor_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_NEWER_MINOR
tests_plugins_newer_minor_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/small_struct.la
tests_plugins_small_struct_la_SOURCES = tests/plugins/fixture.c
tests_plugins_small_struct_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_SMALL_STRUCT
tests_plugins_small_struct_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/no_entry.la
tests_plugins_no_entry_la_SOURCES = tests/plugins/fixture.c
tests_plugins_no_entry_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_NO_ENTRY
tests_plugins_no_entry_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/missing_op.la
tests_plugins_missing_op_la_SOURCES = tests/plugins/fixture.c
tests_plugins_missing_op_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_MISSING_OP
tests_plugins_missing_op_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/bad_option.la
tests_plugins_bad_option_la_SOURCES = tests/plugins/fixture.c
tests_plugins_bad_option_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_BAD_OPTION
tests_plugins_bad_option_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/refuses.la
tests_plugins_refuses_la_SOURCES = tests/plugins/fixture.c
tests_plugins_refuses_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_REFUSES
tests_plugins_refuses_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/bad_name.la
tests_plugins_bad_name_la_SOURCES = tests/plugins/fixture.c
tests_plugins_bad_name_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_BAD_NAME
tests_plugins_bad_name_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/v1_entry.la
tests_plugins_v1_entry_la_SOURCES = tests/plugins/fixture.c
tests_plugins_v1_entry_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_V1_ENTRY
tests_plugins_v1_entry_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/identity.la
tests_plugins_identity_la_SOURCES = tests/plugins/fixture.c
tests_plugins_identity_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_IDENTITY
tests_plugins_identity_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/bad_default.la
tests_plugins_bad_default_la_SOURCES = tests/plugins/fixture.c
tests_plugins_bad_default_la_CPPFLAGS = $(AM_CPPFLAGS) -DFIXTURE_BAD_DEFAULT
tests_plugins_bad_default_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)

# A third-party-style format module (per-tensor INT8) for the conformance test, in a folder of its
# own, apart from the loader fixtures whose counts the loader tests check.
check_LTLIBRARIES += tests/plugins/third_party/int8_tensor.la
tests_plugins_third_party_int8_tensor_la_SOURCES = tests/plugins/third_party/int8_tensor.c
tests_plugins_third_party_int8_tensor_la_CPPFLAGS = $(AM_CPPFLAGS)
tests_plugins_third_party_int8_tensor_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
# The cublaslt GEMM provider built as a module from its own source (without -DHQ_GEMM_BUILTIN it
# exports hq_gemm_provider_v1), so that test_gemm_cublaslt hands it a mock host; in a folder of
# its own, which no plugin search path names.
check_LTLIBRARIES += tests/plugins/cublaslt/cublaslt.la
tests_plugins_cublaslt_cublaslt_la_SOURCES = gemm/cublaslt/cublaslt.c
tests_plugins_cublaslt_cublaslt_la_CPPFLAGS = $(AM_CPPFLAGS)
tests_plugins_cublaslt_cublaslt_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)

# GEMM provider fixtures (test_gemm_providers), one source built once per module: valid ones in
# providers/, each broken one in providers_bad/ (folders of their own: the loader tests count
# what tests/plugins/ holds).
check_LTLIBRARIES += tests/plugins/providers/test_gemm.la
tests_plugins_providers_test_gemm_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_test_gemm_la_CPPFLAGS = $(AM_CPPFLAGS)
tests_plugins_providers_test_gemm_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers/test_gemm_low.la
tests_plugins_providers_test_gemm_low_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_test_gemm_low_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_LOW
tests_plugins_providers_test_gemm_low_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers_bad/bad_major.la
tests_plugins_providers_bad_bad_major_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_bad_bad_major_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_BAD_MAJOR
tests_plugins_providers_bad_bad_major_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers_bad/newer_minor.la
tests_plugins_providers_bad_newer_minor_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_bad_newer_minor_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_NEWER_MINOR
tests_plugins_providers_bad_newer_minor_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers_bad/small_table.la
tests_plugins_providers_bad_small_table_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_bad_small_table_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_SMALL_TABLE
tests_plugins_providers_bad_small_table_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers_bad/no_accepts.la
tests_plugins_providers_bad_no_accepts_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_bad_no_accepts_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_NO_ACCEPTS
tests_plugins_providers_bad_no_accepts_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers_bad/no_run.la
tests_plugins_providers_bad_no_run_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_bad_no_run_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_NO_RUN
tests_plugins_providers_bad_no_run_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers_bad/no_version.la
tests_plugins_providers_bad_no_version_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_bad_no_version_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_NO_VERSION
tests_plugins_providers_bad_no_version_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers_bad/bad_name.la
tests_plugins_providers_bad_bad_name_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_bad_bad_name_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_BAD_NAME
tests_plugins_providers_bad_bad_name_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers_bad/builtin_name.la
tests_plugins_providers_bad_builtin_name_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_bad_builtin_name_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_BUILTIN_NAME
tests_plugins_providers_bad_builtin_name_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers_bad/dup_a.la
tests_plugins_providers_bad_dup_a_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_bad_dup_a_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_DUP
tests_plugins_providers_bad_dup_a_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers_bad/dup_b.la
tests_plugins_providers_bad_dup_b_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_bad_dup_b_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_DUP
tests_plugins_providers_bad_dup_b_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/providers_bad/no_entry.la
tests_plugins_providers_bad_no_entry_la_SOURCES = tests/plugins/gemm_fixture.c
tests_plugins_providers_bad_no_entry_la_CPPFLAGS = $(AM_CPPFLAGS) -DGEMM_FIXTURE_NO_ENTRY
tests_plugins_providers_bad_no_entry_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
# A format module with the 2.1 table that requires ABI 2.0 (review bug 7), in a folder of its own.
check_LTLIBRARIES += tests/plugins/minor0/raw_factor.la
tests_plugins_minor0_raw_factor_la_SOURCES = tests/plugins/raw_factor.c tests/plugins/int_codes.h
tests_plugins_minor0_raw_factor_la_CPPFLAGS = $(AM_CPPFLAGS)
tests_plugins_minor0_raw_factor_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)

# A format module offering dequantize_pair (ABI 2.6), in a folder of its own.
check_LTLIBRARIES += tests/plugins/pair/pair.la
tests_plugins_pair_pair_la_SOURCES = tests/plugins/pair_fixture.c tests/plugins/int_codes.h
tests_plugins_pair_pair_la_CPPFLAGS = $(AM_CPPFLAGS)
tests_plugins_pair_pair_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)

# Buffer-form fixtures (ABI 2.4, test_forms), in a folder of their own: one valid module, one whose
# table is too short to show its ops, four malformed op sets the loader rejects.
check_LTLIBRARIES += tests/plugins/forms/forms.la
tests_plugins_forms_forms_la_SOURCES = tests/plugins/forms/forms.c
tests_plugins_forms_forms_la_CPPFLAGS = $(AM_CPPFLAGS)
tests_plugins_forms_forms_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/forms/forms_short.la
tests_plugins_forms_forms_short_la_SOURCES = tests/plugins/forms/forms.c
tests_plugins_forms_forms_short_la_CPPFLAGS = $(AM_CPPFLAGS) -DFORMS_SHORT
tests_plugins_forms_forms_short_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/forms/forms_half_fsdp.la
tests_plugins_forms_forms_half_fsdp_la_SOURCES = tests/plugins/forms/forms.c
tests_plugins_forms_forms_half_fsdp_la_CPPFLAGS = $(AM_CPPFLAGS) -DFORMS_HALF_FSDP
tests_plugins_forms_forms_half_fsdp_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/forms/forms_half_save.la
tests_plugins_forms_forms_half_save_la_SOURCES = tests/plugins/forms/forms.c
tests_plugins_forms_forms_half_save_la_CPPFLAGS = $(AM_CPPFLAGS) -DFORMS_HALF_SAVE
tests_plugins_forms_forms_half_save_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/forms/forms_undescribed.la
tests_plugins_forms_forms_undescribed_la_SOURCES = tests/plugins/forms/forms.c
tests_plugins_forms_forms_undescribed_la_CPPFLAGS = $(AM_CPPFLAGS) -DFORMS_UNDESCRIBED
tests_plugins_forms_forms_undescribed_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/plugins/forms/forms_unused.la
tests_plugins_forms_forms_unused_la_SOURCES = tests/plugins/forms/forms.c
tests_plugins_forms_forms_unused_la_CPPFLAGS = $(AM_CPPFLAGS) -DFORMS_UNUSED
tests_plugins_forms_forms_unused_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)

# A module wrapping fp8_tensor without HQ_CAP_DEQ_FACTOR (test_gpu_gemm), in a folder of its own.
check_LTLIBRARIES += tests/wrap/fp8_tensor_nofold.la
tests_wrap_fp8_tensor_nofold_la_SOURCES = tests/wrap/fp8_tensor_nofold.c \
	tests/wrap/stock_module.h tests/hq_wrap.h
tests_wrap_fp8_tensor_nofold_la_CPPFLAGS = $(AM_CPPFLAGS)
tests_wrap_fp8_tensor_nofold_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
# A module wrapping fp8_tensor with a gemm op that reports an emulated product
# (test_gemm_providers), beside it.
check_LTLIBRARIES += tests/wrap/fp8_tensor_owngemm.la
tests_wrap_fp8_tensor_owngemm_la_SOURCES = tests/wrap/owngemm.c tests/wrap/stock_module.h \
	tests/hq_wrap.h
tests_wrap_fp8_tensor_owngemm_la_CPPFLAGS = $(AM_CPPFLAGS)
tests_wrap_fp8_tensor_owngemm_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
# A module wrapping mxfp8 without HQ_CAP_ADAM_KDEV (test_gpu_graph_step), beside it.
check_LTLIBRARIES += tests/wrap/mxfp8_nokdev.la
tests_wrap_mxfp8_nokdev_la_SOURCES = tests/wrap/mxfp8_nokdev.c tests/wrap/stock_module.h \
	tests/hq_wrap.h
tests_wrap_mxfp8_nokdev_la_CPPFLAGS = $(AM_CPPFLAGS)
tests_wrap_mxfp8_nokdev_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
# A module wrapping nvfp4 without dequantize_pair (test_gpu_graph_step), beside them.
check_LTLIBRARIES += tests/wrap/nvfp4_nopair.la
tests_wrap_nvfp4_nopair_la_SOURCES = tests/wrap/nopair.c tests/wrap/stock_module.h tests/hq_wrap.h
tests_wrap_nvfp4_nopair_la_CPPFLAGS = $(AM_CPPFLAGS) -DWRAP_STOCK='"nvfp4"'
tests_wrap_nvfp4_nopair_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
# A module wrapping nvfp4 without HQ_CAP_RNG_DEV (test_gpu_rng_graph), in a folder of its own.
check_LTLIBRARIES += tests/wrap/norng/nvfp4_norng.la
tests_wrap_norng_nvfp4_norng_la_SOURCES = tests/wrap/nvfp4_norng.c tests/wrap/stock_module.h \
	tests/hq_wrap.h
tests_wrap_norng_nvfp4_norng_la_CPPFLAGS = $(AM_CPPFLAGS)
tests_wrap_norng_nvfp4_norng_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
# Later versions of fp8_tensor, named fp8_tensor (test_checkpoint, bug 6), a folder each: one
# with an option appended, one whose layout version changed.
check_LTLIBRARIES += tests/wrap/next/fp8_tensor_next.la
tests_wrap_next_fp8_tensor_next_la_SOURCES = tests/wrap/fp8_tensor_next.c \
	tests/wrap/stock_module.h
tests_wrap_next_fp8_tensor_next_la_CPPFLAGS = $(AM_CPPFLAGS) -DWRAP_APPEND_OPTION
tests_wrap_next_fp8_tensor_next_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)
check_LTLIBRARIES += tests/wrap/relayout/fp8_tensor_relayout.la
tests_wrap_relayout_fp8_tensor_relayout_la_SOURCES = tests/wrap/fp8_tensor_next.c \
	tests/wrap/stock_module.h
tests_wrap_relayout_fp8_tensor_relayout_la_CPPFLAGS = $(AM_CPPFLAGS) -DWRAP_LAYOUT=2
tests_wrap_relayout_fp8_tensor_relayout_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)

# The identity module (plugins/identity/identity.la) under the name identity_module, so that a set
# holds it beside the built-in (test_identity), in a folder of its own.
check_LTLIBRARIES += tests/identity/identity_module.la
tests_identity_identity_module_la_SOURCES = tests/identity/identity_module.c tests/hq_wrap.h
tests_identity_identity_module_la_CPPFLAGS = $(AM_CPPFLAGS)
tests_identity_identity_module_la_LDFLAGS = $(HQ_FIXTURE_LDFLAGS)

check_PROGRAMS += tests/test_scratch
tests_test_scratch_SOURCES = tests/test_scratch.c tests/hq_test.h
tests_test_scratch_CPPFLAGS = $(HQ_TEST_CPPFLAGS) -I$(top_srcdir)/core
tests_test_scratch_LDADD = $(HQ_TEST_LDADD)
check_PROGRAMS += tests/test_numerics_fp8
tests_test_numerics_fp8_SOURCES = tests/test_numerics_fp8.c tests/hq_test.h
tests_test_numerics_fp8_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_numerics_fp8_LDADD = $(HQ_TEST_LDADD)
check_PROGRAMS += tests/test_loader
tests_test_loader_SOURCES = tests/test_loader.c tests/hq_test.h
tests_test_loader_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_loader_LDADD = $(HQ_TEST_LDADD)
check_PROGRAMS += tests/test_identity
tests_test_identity_SOURCES = tests/test_identity.c tests/hq_test.h
tests_test_identity_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_identity_LDADD = $(HQ_TEST_LDADD)
check_PROGRAMS += tests/test_alias
tests_test_alias_SOURCES = tests/test_alias.c tests/hq_test.h
tests_test_alias_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_alias_LDADD = $(HQ_TEST_LDADD)
check_PROGRAMS += tests/test_recipe
tests_test_recipe_SOURCES = tests/test_recipe.c tests/hq_test.h
tests_test_recipe_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_recipe_LDADD = $(HQ_TEST_LDADD)
check_PROGRAMS += tests/test_fp8_tensor
tests_test_fp8_tensor_SOURCES = tests/test_fp8_tensor.c tests/hq_test.h
tests_test_fp8_tensor_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_fp8_tensor_LDADD = $(HQ_TEST_LDADD)
check_PROGRAMS += tests/test_hybrid
tests_test_hybrid_SOURCES = tests/test_hybrid.c tests/hq_test.h tests/copy_out.h
tests_test_hybrid_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_hybrid_LDADD = $(HQ_TEST_LDADD)
check_PROGRAMS += tests/test_abi
tests_test_abi_SOURCES = tests/test_abi.c tests/hq_test.h
tests_test_abi_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_abi_LDADD = $(HQ_TEST_LDADD)
check_PROGRAMS += tests/test_fsdp
tests_test_fsdp_SOURCES = tests/test_fsdp.c tests/hq_test.h
tests_test_fsdp_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_fsdp_LDADD = $(HQ_TEST_LDADD)
# buffer forms (ABI 2.4): the loader's op-set checks, the core calling a module's FSDP and
# save/restore ops, the checks it keeps
check_PROGRAMS += tests/test_forms
tests_test_forms_SOURCES = tests/test_forms.c tests/hq_test.h
tests_test_forms_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_forms_LDADD = $(HQ_TEST_LDADD)
check_PROGRAMS += tests/test_gpu_fp8_tensor
tests_test_gpu_fp8_tensor_SOURCES = tests/test_gpu_fp8_tensor.c tests/hq_test.h \
	tests/copy_out.h tests/hq_gpu_test.h
tests_test_gpu_fp8_tensor_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_gpu_fp8_tensor_LDADD = $(HQ_TEST_LDADD)

# the format contract on every module of the test plugin path and the third-party fixture
check_PROGRAMS += tests/test_conformance
tests_test_conformance_SOURCES = tests/test_conformance.c tests/hq_test.h
tests_test_conformance_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_conformance_LDADD = $(HQ_TEST_LDADD)

# GEMMs: host path against an F64 reference, every format pair, hybrids, linear helpers
check_PROGRAMS += tests/test_gemm
tests_test_gemm_SOURCES = tests/test_gemm.c tests/hq_test.h
tests_test_gemm_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_gemm_LDADD = $(HQ_TEST_LDADD)

# the cublaslt GEMM provider as a module with a mock host: its predicate per architecture and
# the cuBLASLt calls it makes for every stock format's storages (nothing runs on a GPU)
check_PROGRAMS += tests/test_gemm_cublaslt
tests_test_gemm_cublaslt_SOURCES = tests/test_gemm_cublaslt.c tests/hq_test.h
tests_test_gemm_cublaslt_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_gemm_cublaslt_LDADD = $(HQ_TEST_LDADD)

# GEMM providers as modules: listing, dispatch by priority, the predicate cache, declines, the
# loader's rejections; what a format module offers a GEMM (review bug 7)
check_PROGRAMS += tests/test_gemm_providers
tests_test_gemm_providers_SOURCES = tests/test_gemm_providers.c tests/hq_test.h \
	tests/plugins/gemm_fixture.h
tests_test_gemm_providers_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_gemm_providers_LDADD = $(HQ_TEST_LDADD)

# the optimizer: AdamW on FP32 masters, the write-back, train/eval alternation
check_PROGRAMS += tests/test_optim
tests_test_optim_SOURCES = tests/test_optim.c tests/hq_test.h
tests_test_optim_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_optim_LDADD = $(HQ_TEST_LDADD)

# hq's pool counts: the refusals in every build (the counts themselves: test_gpu_core)
check_PROGRAMS += tests/test_mem_stats
tests_test_mem_stats_SOURCES = tests/test_mem_stats.c tests/hq_test.h
tests_test_mem_stats_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_mem_stats_LDADD = $(HQ_TEST_LDADD)

# checkpoints: safetensors round trips, hostile files, Python's safetensors reader when present
check_PROGRAMS += tests/test_checkpoint
tests_test_checkpoint_SOURCES = tests/test_checkpoint.c tests/hq_test.h
if HAVE_JANSSON
# the test reads the files' JSON headers itself (jansson) to check them independently
tests_test_checkpoint_CPPFLAGS = $(HQ_TEST_CPPFLAGS) $(JANSSON_CFLAGS) $(XXHASH_CFLAGS) -DHQ_TEST_JANSSON
tests_test_checkpoint_LDADD = $(HQ_TEST_LDADD) $(JANSSON_LIBS) $(XXHASH_LIBS)
else
tests_test_checkpoint_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_checkpoint_LDADD = $(HQ_TEST_LDADD)
endif

# the public functions libhqtrain is built on (qtensor queries, format descriptions, unshare,
# the fused write-back's refusals, errors, tensor checks, the floating-point mode)
check_PROGRAMS += tests/test_services_api
tests_test_services_api_SOURCES = tests/test_services_api.c tests/hq_test.h
tests_test_services_api_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_services_api_LDADD = $(HQ_TEST_LDADD)

# allocation failures injected one at a time (replaces malloc; skips under AddressSanitizer)
check_PROGRAMS += tests/test_oom
tests_test_oom_SOURCES = tests/test_oom.c tests/hq_test.h
tests_test_oom_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_oom_LDADD = $(HQ_TEST_LDADD)

# hq.h's struct init macros, compiled warning-free under -Wall -Wextra -Werror in every build
check_PROGRAMS += tests/test_struct_init
tests_test_struct_init_SOURCES = tests/test_struct_init.c tests/hq_test.h
tests_test_struct_init_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_struct_init_CFLAGS = $(AM_CFLAGS) -Wall -Wextra -Werror
tests_test_struct_init_LDADD = $(HQ_TEST_LDADD)

# `hq recipe check` under allocation failures injected one at a time (the command linked in)
check_PROGRAMS += tests/test_recipe_check_oom
tests_test_recipe_check_oom_SOURCES = tests/test_recipe_check_oom.c tests/hq_test.h \
	tools/cmd_recipe.c tools/cli.c tools/json.c
tests_test_recipe_check_oom_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_recipe_check_oom_LDADD = $(HQ_TEST_LDADD)

# hq bench's format configurations: a stock module missing (skipped) or rejected (failed)
check_PROGRAMS += tests/test_bench_spec
tests_test_bench_spec_SOURCES = tests/test_bench_spec.c tests/hq_test.h tools/bench_spec.c \
	tools/bench_spec.h
tests_test_bench_spec_CPPFLAGS = $(HQ_TEST_CPPFLAGS) -I$(top_srcdir)/tools
tests_test_bench_spec_LDADD = $(HQ_TEST_LDADD)

# delayed scaling: the update rule, one state buffer for many quantizers, hybrids, recipes
check_PROGRAMS += tests/test_delayed
tests_test_delayed_SOURCES = tests/test_delayed.c tests/hq_test.h
tests_test_delayed_CPPFLAGS = $(HQ_TEST_CPPFLAGS)
tests_test_delayed_LDADD = $(HQ_TEST_LDADD)

if HAVE_CUDA
# GEMMs on a GPU: native cuBLASLt and emulated paths against the host path and an F64 reference
check_PROGRAMS += tests/test_gpu_gemm
tests_test_gpu_gemm_SOURCES = tests/test_gpu_gemm.c tests/hq_test.h tests/hq_gpu_test.h
tests_test_gpu_gemm_CPPFLAGS = $(HQ_TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_gpu_gemm_LDADD = $(HQ_TEST_LDADD) -lcudart
tests_test_gpu_gemm_LDFLAGS = $(CUDA_LDFLAGS)

# the core's CUDA contract (streams, graph capture, devices); calls the CUDA runtime itself
check_PROGRAMS += tests/test_gpu_core
tests_test_gpu_core_SOURCES = tests/test_gpu_core.c tests/hq_test.h
tests_test_gpu_core_CPPFLAGS = $(HQ_TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_gpu_core_LDADD = $(HQ_TEST_LDADD) -lcudart
tests_test_gpu_core_LDFLAGS = $(CUDA_LDFLAGS)
check_PROGRAMS += tests/test_gpu_graph_step
tests_test_gpu_graph_step_SOURCES = tests/test_gpu_graph_step.c tests/hq_test.h tests/hq_gpu_test.h
tests_test_gpu_graph_step_CPPFLAGS = $(HQ_TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_gpu_graph_step_LDADD = $(HQ_TEST_LDADD) -lcudart
tests_test_gpu_graph_step_LDFLAGS = $(CUDA_LDFLAGS)
# stochastic rounding captured in a CUDA graph: each replay draws the step set before it (ABI 2.6)
check_PROGRAMS += tests/test_gpu_rng_graph
tests_test_gpu_rng_graph_SOURCES = tests/test_gpu_rng_graph.c tests/hq_test.h tests/hq_gpu_test.h
tests_test_gpu_rng_graph_CPPFLAGS = $(HQ_TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_gpu_rng_graph_LDADD = $(HQ_TEST_LDADD) -lcudart
tests_test_gpu_rng_graph_LDFLAGS = $(CUDA_LDFLAGS)
# the runner's autotune (HQ_GEMM_AUTOTUNE=1): tuned plans against F64, repeated calls bit for
# bit, a first call under graph capture
check_PROGRAMS += tests/test_gpu_autotune
tests_test_gpu_autotune_SOURCES = tests/test_gpu_autotune.c tests/hq_test.h tests/hq_gpu_test.h
tests_test_gpu_autotune_CPPFLAGS = $(HQ_TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_gpu_autotune_LDADD = $(HQ_TEST_LDADD) -lcudart
tests_test_gpu_autotune_LDFLAGS = $(CUDA_LDFLAGS)
# the trainer's CUDA kernels (train/ops_cuda.cu) against host references in double, their fused
# amaxes against max |x| and hq_quantizer_amax
check_PROGRAMS += tests/test_gpu_train_ops
tests_test_gpu_train_ops_SOURCES = tests/test_gpu_train_ops.c tests/hq_test.h tests/hq_gpu_test.h \
	train/device.h
tests_test_gpu_train_ops_CPPFLAGS = $(HQ_TEST_CPPFLAGS) $(CUDA_CPPFLAGS) -I$(top_srcdir)/train
tests_test_gpu_train_ops_LDADD = $(HQ_TEST_LDADD) train/ops_cuda.lo -lcudart -lstdc++
tests_test_gpu_train_ops_LDFLAGS = $(CUDA_LDFLAGS)
# the MX COLS kernels' body run on the host as a warp of 32 threads against mx.c, byte for byte
# (no GPU needed: it runs wherever CUDA is configured, CI included)
check_PROGRAMS += tests/test_mx_cols_host
tests_test_mx_cols_host_SOURCES = tests/mx_cols_ref.c
tests_test_mx_cols_host_CPPFLAGS = $(HQ_PLUGIN_CPPFLAGS) -I$(top_srcdir)/plugins/mx -DHQ_MX_FP=6
tests_test_mx_cols_host_LDADD = tests/test_mx_cols_host.lo -lcudart -lstdc++ -lpthread -lm
tests_test_mx_cols_host_LDFLAGS = $(CUDA_LDFLAGS)
# only its host code runs: device code for one virtual architecture (PTX, no ptxas) is enough,
# which keeps every target's kernels out of make check's build
tests/test_mx_cols_host.lo: tests/test_mx_cols_host.cu
	$(AM_V_NVCC)$(SHELL) $(top_srcdir)/build-aux/cuda-lt.sh $@ $(NVCC) $(HQ_NVCCFLAGS_ARCHLESS) \
	  -gencode arch=compute_90,code=compute_90 $(NVCCFLAGS) -c $<
# --grad-dtype bf16's conversions on the GPU (train/cast_cuda.cu) against the CPU path's rounding
# and a reference, bit for bit
check_PROGRAMS += tests/test_gpu_dist_bf16
tests_test_gpu_dist_bf16_SOURCES = tests/test_gpu_dist_bf16.c tests/hq_test.h tests/hq_gpu_test.h \
	train/cast_cuda.h
tests_test_gpu_dist_bf16_CPPFLAGS = $(HQ_TEST_CPPFLAGS) $(CUDA_CPPFLAGS) -I$(top_srcdir)/train
tests_test_gpu_dist_bf16_LDADD = $(HQ_TEST_LDADD) train/cast_cuda.lo -lcudart -lstdc++
tests_test_gpu_dist_bf16_LDFLAGS = $(CUDA_LDFLAGS)
# a trainer linked with the static CUDA runtime, passing its stream to libhqcore (shared runtime)
check_PROGRAMS += tests/test_gpu_static_rt
tests_test_gpu_static_rt_SOURCES = tests/test_gpu_static_rt.c tests/hq_test.h
tests_test_gpu_static_rt_CPPFLAGS = $(HQ_TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_gpu_static_rt_LDADD = $(HQ_TEST_LDADD) -lcudart_static -ldl -lrt -lpthread
# its runtime stays its own: none of the archive's symbols is exported to libhqcore
tests_test_gpu_static_rt_LDFLAGS = $(CUDA_LDFLAGS) -Wl,--exclude-libs,libcudart_static.a
endif

# the FSDP gather across ranks (hq/dist.h): a program every rank of `mpirun -np N` runs, driven
# by tests/test_dist_mpi.sh. Not in check_PROGRAMS (it runs under mpirun only): built before the
# script's log, cleaned by hand.
EXTRA_PROGRAMS = tests/test_dist_mpi
tests_test_dist_mpi_SOURCES = tests/test_dist_mpi.c tests/hq_test.h
tests_test_dist_mpi_CPPFLAGS = $(HQ_TEST_CPPFLAGS) $(MPI_CFLAGS)
tests_test_dist_mpi_LDADD = $(HQ_TEST_LDADD) $(MPI_LIBS)
# the same over NCCL, one GPU per rank (skips without a GPU per rank)
EXTRA_PROGRAMS += tests/test_dist_nccl
tests_test_dist_nccl_SOURCES = tests/test_dist_nccl.c tests/hq_test.h tests/hq_gpu_test.h
tests_test_dist_nccl_CPPFLAGS = $(HQ_TEST_CPPFLAGS) $(MPI_CFLAGS) $(CUDA_CPPFLAGS)
tests_test_dist_nccl_LDADD = $(HQ_TEST_LDADD) $(MPI_LIBS) -lnccl -lcudart
tests_test_dist_nccl_LDFLAGS = $(CUDA_LDFLAGS)
CLEANFILES += tests/test_dist_mpi$(EXEEXT) tests/test_dist_nccl$(EXEEXT)
HQ_DIST_TESTS = tests/test_dist_mpi$(EXEEXT)
if HAVE_NCCL
HQ_DIST_TESTS += tests/test_dist_nccl$(EXEEXT)
endif
if HAVE_MPI
tests/test_dist_mpi.log tests/test_bench_dist.log: $(HQ_DIST_TESTS)
endif

TESTS += $(check_PROGRAMS) tests/test_dist_mpi.sh tests/test_bench_dist.sh tests/test_train_dist.sh tests/test_train_dist_nccl.sh tests/test_cli.sh tests/test_train.sh tests/test_gpu_train.sh \
	tests/test_install.sh tests/test_ckpt_resume.sh tests/test_docs_tables.sh
# hq train --profile and --preset
TESTS += tests/test_train_profile.sh
# hq train --baseline bf16-direct: its options, and on a GPU its run against the identity recipe
TESTS += tests/test_train_direct.sh tests/test_gpu_train_direct.sh
# hq train --cuda-graph on against off: the same bits (the CPU: the kept qtensors; a GPU: the
# captured step)
TESTS += tests/test_train_graph.sh tests/test_gpu_train_graph.sh
# scripts/train_ab.py, the before/after tables of docs/performance.md
TESTS += tests/test_train_ab.sh
endif
# scripts/ncu_steps.py, the kernel sums per step of docs/performance.md (needs no hq)
TESTS += tests/test_ncu_steps.sh
EXTRA_DIST += tests/test_ncu_steps.sh scripts/ncu_steps.py
# scripts/lanes.py, a replayed graph's streams from scripts/lane_trace.c's CUPTI trace
TESTS += tests/test_lanes.sh
EXTRA_DIST += tests/test_lanes.sh scripts/lanes.py scripts/lane_trace.c
# the source of tests/test_mx_cols_host (built by the .cu rule where CUDA is configured)
EXTRA_DIST += tests/test_mx_cols_host.cu
# scripts/sanitizer_filters.sh, which failed sanitizer runs gpu-check.sh counts as clean
TESTS += tests/test_sanitizer_filters.sh
EXTRA_DIST += tests/test_sanitizer_filters.sh scripts/sanitizer_filters.sh
EXTRA_DIST += tests/test_train_profile.sh tests/test_train_direct.sh tests/test_gpu_train_direct.sh
EXTRA_DIST += tests/test_train_graph.sh tests/test_gpu_train_graph.sh tests/train_graph.sh
TEST_EXTENSIONS = .sh
SH_LOG_COMPILER = $(SHELL)
EXTRA_DIST += tests/test_docs_tables.sh scripts/docs-tables.py tests/test_train_ab.sh scripts/train_ab.py
EXTRA_DIST += tests/test_dist_mpi.sh tests/test_bench_dist.sh tests/test_train_dist.sh tests/test_train_dist_nccl.sh tests/mpirun_env.sh tests/lsan_mpi.supp tests/test_cli.sh tests/test_train.sh tests/test_gpu_train.sh tests/test_install.sh tests/test_ckpt_resume.sh tests/train_corpus.sh tests/fp8_ref.h tests/hq_gpu_test.h tests/hq_alloc_fail.h

AM_TESTS_ENVIRONMENT = \
	HQ_PLUGIN_PATH=`echo $(HQ_TEST_PLUGIN_DIRS) | tr ' ' ':'`; export HQ_PLUGIN_PATH; \
	HQ_TEST_SRCDIR='$(abs_top_srcdir)/tests'; export HQ_TEST_SRCDIR; \
	HQ_TEST_FIXTURES='$(abs_top_builddir)/tests/plugins/.libs'; export HQ_TEST_FIXTURES; \
	HQ_TEST_FIXTURE_ROOT='$(abs_top_builddir)/tests/plugins'; export HQ_TEST_FIXTURE_ROOT; \
	HQ_TEST_WRAP_DIR='$(abs_top_builddir)/tests/wrap/.libs'; export HQ_TEST_WRAP_DIR; \
	HQ_TEST_FORMS='$(abs_top_builddir)/tests/plugins/forms/.libs'; export HQ_TEST_FORMS; \
	HQ_TEST_THIRD_PARTY='$(abs_top_builddir)/tests/plugins/third_party/.libs'; \
	export HQ_TEST_THIRD_PARTY; \
	HQ_TEST_IDENTITY_SO='$(abs_top_builddir)/plugins/identity/.libs/identity.so'; \
	export HQ_TEST_IDENTITY_SO; \
	HQ_TEST_IDENTITY_DIR='$(abs_top_builddir)/tests/identity/.libs'; export HQ_TEST_IDENTITY_DIR; \
	HQ_CONF_DIR='$(abs_top_srcdir)/conf'; export HQ_CONF_DIR; \
	HQ_BIN='$(abs_top_builddir)/tools/hq'; export HQ_BIN; \
	HQ_MPIRUN='$(MPIRUN)'; export HQ_MPIRUN; \
	HQ_TEST_DIST_MPI='$(abs_top_builddir)/tests/test_dist_mpi$(EXEEXT)'; export HQ_TEST_DIST_MPI; \
	HQ_TEST_DIST_NCCL='$(abs_top_builddir)/tests/test_dist_nccl$(EXEEXT)'; export HQ_TEST_DIST_NCCL;

# The parsers' libFuzzer targets and their seeds, built and run by scripts/fuzz.sh (clang), not by
# make check (docs/reliability.md)
EXTRA_DIST += scripts/fuzz.sh docs/reliability.md tests/fuzz/fuzz_ckpt.c tests/fuzz/fuzz_npy.c \
	tests/fuzz/fuzz_recipe.c tests/fuzz/fuzz_formats.h tests/fuzz/ckpt_seeds.c \
	tests/fuzz/seeds/fuzz_ckpt/q_and_t.safetensors \
	tests/fuzz/seeds/fuzz_ckpt/q_and_t_bare.safetensors tests/fuzz/seeds/fuzz_ckpt/t.safetensors \
	tests/fuzz/seeds/fuzz_npy/f16_4.npy tests/fuzz/seeds/fuzz_npy/f32_2x2x2.npy \
	tests/fuzz/seeds/fuzz_npy/f32_2x3.npy tests/fuzz/seeds/fuzz_recipe/fp8_current.ini \
	tests/fuzz/seeds/fuzz_recipe/fp8_delayed.ini tests/fuzz/seeds/fuzz_recipe/mxfp8.ini \
	tests/fuzz/seeds/fuzz_recipe/nvfp4.ini
