/*
** nvfp4_bf16.cu -- nvfp4.cu's quantize launches and kernels for BF16 sources, a translation unit
** of their own so that they compile beside those of the other dtypes (nvfp4.cu says which
** parts a dtype unit takes).
*/
#define HQ_NVFP4_TU_DT HQ_BF16
#include "nvfp4.cu"
