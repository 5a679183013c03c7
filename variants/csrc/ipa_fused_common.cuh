// What the cuda-fused kernel files share: the z chunk width, and the host hooks through which
// the dispatch (ipa_fused.cu) reaches each kernel class without seeing its code. One .cu per kernel
// class family: ipa_fused_small_generic.cu (the templated kernel behind `small` and `generic`),
// ipa_fused_af2.cu (AlphaFold2's sizes at compile time). Compiles with nvcc alone (no torch).
#pragma once

#include <stddef.h>

#include "ipa_common.cuh"
#include "ipa_kernels.h"

namespace ipa {

template <typename ZT>
struct ZChunk;
template <>
struct ZChunk<float> {
  static constexpr int kChannels = 4;  // channels per 16-byte chunk
};
template <>
struct ZChunk<__nv_bfloat16> {
  static constexpr int kChannels = 8;
};

using FusedKernelFn = void (*)(const FusedArgs);

// ipa_fused_small_generic.cu; klass is kFusedSmall or kFusedGeneric.
FusedClassLimits small_generic_limits(int klass);
size_t small_generic_smem_bytes(int klass, int H, int C, int zbytes, int wq, int wv);
FusedKernelFn small_generic_kernel(int klass, bool z_bf16);

// ipa_fused_af2.cu.
FusedClassLimits af2_limits();
size_t af2_smem_bytes(int H, int zbytes, int bias);
FusedKernelFn af2_kernel(bool z_bf16, int bias);

}  // namespace ipa
