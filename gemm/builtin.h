/*
** gemm/builtin.h -- how a provider of this tree is entered. Compiled into libhqcore
** (-DHQ_GEMM_BUILTIN) it gives the registry (core/provider.c) the internal entry
** hqi_gemm_<name>; built as a module from the same source (the tests' way to hand it a mock
** host), it exports the ABI's one entry function, hq_gemm_provider_v1.
*/
#ifndef HQ_GEMM_BUILTIN_H
#define HQ_GEMM_BUILTIN_H

#include "hq/gemm_provider.h"

#ifdef HQ_GEMM_BUILTIN
#define HQ_GEMM_ENTRY(name, table) HQ_GEMM_DEFINE_AS_(hqi_gemm_##name, table, )
#else
#define HQ_GEMM_ENTRY(name, table) HQ_GEMM_PROVIDER_DEFINE(table)
#endif

#endif
