// Device helpers shared by the IPA kernels: asynchronous copies, 16-byte loads, bf16 unpacking,
// the split-K merge's steps.
// Compiles with nvcc alone (no torch headers), so CI can check every kernel with ptxas.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace ipa {

constexpr float kLog2e = 1.4426950408889634f;

// 16-byte global -> shared copy that bypasses L1 (cp.async.cg). With src_bytes == 0 nothing is
// read and the 16 destination bytes are zero-filled: how tails are handled.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most `PENDING` of this thread's committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

__device__ __forceinline__ float4 ld_global4(const float* p) {
  return __ldg(reinterpret_cast<const float4*>(p));
}

__device__ __forceinline__ float4 ld_shared4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

// Eight bf16 values packed in 16 bytes -> eight floats (exact: bf16 is the top half of a float).
__device__ __forceinline__ void unpack_bf16x8(const uint4 r, float (&f)[8]) {
  f[0] = __uint_as_float(r.x << 16);
  f[1] = __uint_as_float(r.x & 0xffff0000u);
  f[2] = __uint_as_float(r.y << 16);
  f[3] = __uint_as_float(r.y & 0xffff0000u);
  f[4] = __uint_as_float(r.z << 16);
  f[5] = __uint_as_float(r.z & 0xffff0000u);
  f[6] = __uint_as_float(r.w << 16);
  f[7] = __uint_as_float(r.w & 0xffff0000u);
}

__device__ __forceinline__ float to_float(const float x) { return x; }
__device__ __forceinline__ float to_float(const __nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(const __half x) { return __half2float(x); }

// The split-K merge of one output row (FusedArgs::part's layout: `ml` holds each split's
// (max, sum) pair of every row, `rows` rows a split): out = sum_s w_s acc_s / sum_s w_s l_s with
// w_s = 2^(m_s - max_s m_s). The combine and the merging finish both build it from these steps,
// in the same order, so both give the same bits.
__device__ __forceinline__ float split_max(const float* ml, int splits, int rows, int row) {
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, ml[(s * rows + row) * 2]);
  return mx;
}

__device__ __forceinline__ float split_weight(const float* ml, int s, int rows, int row, float mx) {
  const float ms = ml[(s * rows + row) * 2];
  return ms == -INFINITY ? 0.f : exp2f(ms - mx);
}

}  // namespace ipa
