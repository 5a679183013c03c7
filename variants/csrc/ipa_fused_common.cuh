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

// Tensor-core helpers of the af2 kernels (mma.sync, PTX ISA fragment layouts).
// d += A (16 x 16, bf16) B (16 x 8, bf16), fp32, for lane (g, u) = (lane / 4, lane % 4) (PTX
// ISA, mma.m16n8k16 fragments for .bf16): a0 .. a3 hold A's (row, columns) (g, 2u..2u+1),
// (g + 8, 2u..), (g, 2u+8..2u+9), (g + 8, 2u+8..); b0 / b1 B's rows 2u..2u+1 / 2u+8..2u+9 of
// column g; d A B's (g, 2u), (g, 2u + 1), (g + 8, 2u), (g + 8, 2u + 1).
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d += A (16 x 8, tf32) B (8 x 8, tf32), fp32, for lane (g, u) (PTX ISA, mma.m16n8k8 fragments
// for .tf32): a0 .. a3 hold A's (g, u), (g + 8, u), (g, u + 4), (g + 8, u + 4); b0 / b1 B's
// (u, g), (u + 4, g); d as mma_bf16's.
__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d = A B (C = 0), fragments as mma_tf32's: a fresh partial product. The tensor cores round the
// additions of an accumulating mma toward zero (Fasi et al. 2021), so a sum carried through many
// mma in C drifts one way; a partial per key tile, added to the running sum by an FFMA (round to
// nearest), does not.
__device__ __forceinline__ void mma_tf32_fresh(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
}

// x rounded to TF32 (to nearest, ties away), as the bits of an fp32.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ uint32_t ld_shared_u32(const void* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ uint4 ld_shared_u4(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// Four 8 x 8 b16 matrices from shared memory (ldmatrix.x4): lane t gives the address of row t % 8
// of matrix t / 8 (16 bytes); lane (g, u) receives row g, columns 2u..2u+1 of matrix m in r[m].
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Two 8 x 8 b16 matrices (ldmatrix.x2): lanes 0-15 give the addresses as for ldmatrix_x4.
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(s));
}

// TF32 rounding (to nearest, ties away from zero, as cvt.rna.tf32.f32) of finite operands, by
// hand: cvt.rna compiles to a finiteness test and a predicated add of 0x1000, plus a mask where
// the value is used in arithmetic; feeding an mma, nvcc 13.0 leaves the low 13 bits unmasked
// (the tensor cores ignore them), and so do these.
//   tf32_operand  for an mma operand only: the add (the low bits left for the tensor core)
//   tf32_round    the rounded value itself (low bits cleared): the add and a mask
//   split_tf32    3xTF32's parts: hi = tf32_round(x), lo = x - hi (exact in fp32) as an operand
__device__ __forceinline__ uint32_t tf32_operand(float x) { return __float_as_uint(x) + 0x1000u; }
__device__ __forceinline__ uint32_t tf32_round(float x) {
  return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = tf32_round(x);
  lo = tf32_operand(x - __uint_as_float(hi));
}

// d += A B on 3xTF32 from A's and B's hi and lo parts (split_tf32), the small products first.
// kFresh: d = A B (the first product into a zeroed d, `mma_tf32_fresh`), else d += A B.
template <bool kFresh = false>
__device__ __forceinline__ void mma_3xtf32(float (&d)[4], const uint32_t (&ah)[4],
                                           const uint32_t (&al)[4], uint32_t bh0, uint32_t bh1,
                                           uint32_t bl0, uint32_t bl1) {
  if constexpr (kFresh) mma_tf32_fresh(d, al[0], al[1], al[2], al[3], bh0, bh1);
  else mma_tf32(d, al[0], al[1], al[2], al[3], bh0, bh1);
  mma_tf32(d, ah[0], ah[1], ah[2], ah[3], bl0, bl1);
  mma_tf32(d, ah[0], ah[1], ah[2], ah[3], bh0, bh1);
}

// d += A B (mma.m16n8k8 TF32 fragments) from B given as fp32 values, rounded once to TF32 or,
// with kSplit, split for 3xTF32 (mma_3xtf32; A as hi and lo parts). kFresh: d = A B.
template <bool kSplit, bool kFresh = false>
__device__ __forceinline__ void mma_f32(float (&d)[4], const uint32_t (&ah)[4],
                                        const uint32_t (&al)[4], float b0, float b1) {
  if constexpr (kSplit) {
    uint32_t bh0, bl0, bh1, bl1;
    split_tf32(b0, bh0, bl0);
    split_tf32(b1, bh1, bl1);
    mma_3xtf32<kFresh>(d, ah, al, bh0, bh1, bl0, bl1);
  } else if constexpr (kFresh) {
    mma_tf32_fresh(d, ah[0], ah[1], ah[2], ah[3], tf32_operand(b0), tf32_operand(b1));
  } else {
    mma_tf32(d, ah[0], ah[1], ah[2], ah[3], tf32_operand(b0), tf32_operand(b1));
  }
}
// d += A (16 x 8, bf16) B (8 x 8, bf16), fp32 (mma.m16n8k8 for .bf16): a0 / a1 hold A's (g,
// 2u..2u+1) / (g + 8, 2u..2u+1), b0 B's rows 2u..2u+1 of column g; d as mma_bf16's.
__device__ __forceinline__ void mma_bf16_k8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// ldmatrix_x4 transposed (.trans): lane (g, u) receives rows 2u..2u+1 of column g of matrix m in
// r[m] (the B fragment of mma.m16n8k8 .bf16 from a row-major k x n tile).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// One online-softmax step (base 2) of the tensor-core kernels, for a lane's two rows of an m16n8
// logits fragment s (s[0], s[1]: row g, keys 2u, 2u + 1; s[2], s[3]: row g + 8): the rows' maxima
// over the quad (key 0 of a tile is always valid, so they are finite) into m0, m1, the factors
// that rescale what was summed before (0 on the first tile), and the probabilities in the order
// of P's A fragment once a k-step's key order is (2u, 2u + 1) -> (u, u + 4): (g, 2u), (g + 8,
// 2u), (g, 2u + 1), (g + 8, 2u + 1).
// kSlack > 0 (base-2 units): a row's running maximum moves only when a tile's exceeds it by more
// than kSlack (FlashAttention-4's conditional rescaling), so after the first tiles almost every
// factor is exactly 1 and a caller may skip rescaling; probabilities stay below 2^kSlack.
template <int kSlack = 0>
__device__ __forceinline__ void online_softmax_step(const float (&s)[4], float& m0, float& m1,
                                                    float& alpha0, float& alpha1, float (&p)[4]) {
  float mt0 = fmaxf(s[0], s[1]), mt1 = fmaxf(s[2], s[3]);
  mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, 1));
  mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, 1));
  mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, 2));
  mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, 2));
  float mn0, mn1;
  if constexpr (kSlack > 0) {
    mn0 = mt0 > m0 + kSlack ? mt0 : m0;  // m0 = -inf (the first tile) always moves
    mn1 = mt1 > m1 + kSlack ? mt1 : m1;
  } else {
    mn0 = fmaxf(m0, mt0);
    mn1 = fmaxf(m1, mt1);
  }
  alpha0 = exp2f(m0 - mn0);
  alpha1 = exp2f(m1 - mn1);
  m0 = mn0;
  m1 = mn1;
  p[0] = exp2f(s[0] - mn0);
  p[1] = exp2f(s[2] - mn1);
  p[2] = exp2f(s[1] - mn0);
  p[3] = exp2f(s[3] - mn1);
}

using FusedKernelFn = void (*)(const FusedArgs);

// ipa_fused_small_generic.cu; klass is kFusedSmall or kFusedGeneric.
FusedClassLimits small_generic_limits(int klass);
size_t small_generic_smem_bytes(int klass, int H, int C, int zbytes, int wq, int wv);
FusedKernelFn small_generic_kernel(int klass, bool z_bf16);

// ipa_fused_af2.cu.
FusedClassLimits af2_limits();
size_t af2_smem_bytes(int H, int zbytes, int bias);
FusedKernelFn af2_kernel(bool z_bf16, int bias);

// ipa_fused_af2_tc.cu: the af2 class's kTensorCores form: its key tile, its CTA's extra warps
// (the bias warps, after the H attention warps), its shared memory and kernel.
constexpr int kAf2TcKeyTile = 8;
constexpr int kAf2TcBiasWarps = 4;
size_t af2_tc_smem_bytes(int H, bool z_bf16);
FusedKernelFn af2_tc_kernel(bool z_bf16);

}  // namespace ipa
