// The O(N) steps around the attention kernels, one launch each instead of ~25 small PyTorch ops
// (on the H200 each eager op costs the host 20-40 us, so the PyTorch version of these steps
// took longer than the attention kernel itself up to N = 1024):
//   prepare  projection output -> padded q / k / v operand rows, points moved to the global frame
//   finish   attended [o_s | o_p (global)] -> [o_s | o_p in each residue's local frame]
// Elementwise and memory-bound; one thread per output element. The element index is 32-bit
// whenever the count allows (every shape the benchmarks run): with 64-bit indices the divisions
// that split it into (b, h, n, column), emulated in ~70 instructions each, made prepare a
// compute-bound 18 us at N = 1024 on an H100 (thirty-third session).
#include <cuda_fp16.h>

#include "ipa_common.cuh"
#include "ipa_kernels.h"

namespace ipa {
namespace {

constexpr int kFrameThreads = 256;

// p @ R + t (row-vector convention), coordinate dd of point x (3 floats) at residue (R, t).
__device__ __forceinline__ float to_global(const float* x, const float* R, const float* t, int dd) {
  return fmaf(x[0], R[dd], fmaf(x[1], R[3 + dd], x[2] * R[6 + dd])) + t[dd];
}

__device__ __forceinline__ void store(float* p, float x) { *p = x; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void store(__half* p, float x) { *p = __float2half_rn(x); }

// Index: int where total + one grid's stride fits in it (`fits_int`), else long long.
template <typename Index>
__global__ void __launch_bounds__(kFrameThreads) ipa_prepare_kernel(const PrepareArgs a) {
  const int H = a.H, N = a.N, d = a.d;
  const int wq = a.dqp + a.pqp, width = 2 * wq + a.wv;
  const Index total = static_cast<Index>(a.B) * H * N * width;
  const int hd = H * d;
  for (Index e = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index row = e / width;  // (b * H + h) * N + n
    int col = static_cast<int>(e - row * width);
    const int n = static_cast<int>(row % N);
    const Index bh = row / N;
    const int h = static_cast<int>(bh % H), b = static_cast<int>(bh / H);
    const Index bn = static_cast<Index>(b) * N + n;
    const float* x = a.proj + bn * a.features;
    const float* R = a.rot + bn * 9;
    const float* t = a.trans + bn * 3;
    float val = 0.f;
    float* dst;
    if (col < 2 * wq) {  // q or k: [scalar (d), pad to dqp | points (3 qp), pad]
      const bool is_k = col >= wq;
      col -= is_k ? wq : 0;
      dst = (is_k ? a.k : a.q) + row * wq + col;
      if (col < d) {
        val = x[(is_k ? hd : 0) + h * d + col] * (is_k ? 1.f : a.q_scale);
      } else if (col >= a.dqp && col < a.dqp + 3 * a.qp) {
        const int c = col - a.dqp, p = c / 3;
        val = to_global(x + 3 * hd + (is_k ? 3 * H * a.qp : 0) + 3 * (h * a.qp + p), R, t, c % 3);
      }
    } else {  // v: [scalar (d) | points (3 vp) | pad]
      col -= 2 * wq;
      dst = a.v + row * a.wv + col;
      if (col < d) {
        val = x[2 * hd + h * d + col];
      } else if (col < d + 3 * a.vp) {
        const int c = col - d, p = c / 3;
        val = to_global(x + 3 * hd + 6 * H * a.qp + 3 * (h * a.vp + p), R, t, c % 3);
      }
    }
    *dst = val;
  }
}

// Out: float, __nv_bfloat16 or __half (FinishArgs::out_kind).
template <typename Index, typename Out>
__global__ void __launch_bounds__(kFrameThreads) ipa_finish_kernel(const FinishArgs a) {
  const int H = a.H, d = a.d, hd = H * d;
  const int width = hd + 3 * H * a.vp;
  const Index total = static_cast<Index>(a.B) * a.N * width;
  Out* out = static_cast<Out*>(a.out);
  for (Index e = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index bn = e / width;
    const int col = static_cast<int>(e - bn * width);
    const float* row = a.attended + bn * H * a.pitch;
    float val;
    if (col < hd) {
      val = row[(col / d) * a.pitch + col % d];
    } else {  // (g - t) @ R^T: local[dd] = sum_c (g_c - t_c) R[dd][c]
      const int c = col - hd, point = c / 3, dd = c % 3;
      const float* g = row + (point / a.vp) * a.pitch + d + 3 * (point % a.vp);
      const float* R = a.rot + bn * 9 + 3 * dd;
      const float* t = a.trans + bn * 3;
      val = fmaf(g[0] - t[0], R[0], fmaf(g[1] - t[1], R[1], (g[2] - t[2]) * R[2]));
    }
    store(out + e, val);
  }
}

unsigned grid_for(long long total) {
  const long long blocks = (total + kFrameThreads - 1) / kFrameThreads;
  return static_cast<unsigned>(blocks < 65535 * 32 ? (blocks > 0 ? blocks : 1) : 65535 * 32);
}

// Whether a grid-stride loop over `total` elements can count in int: the last index plus one
// stride (at most 65535 * 32 blocks of kFrameThreads threads) stays below INT_MAX.
bool fits_int(long long total) {
  return total + static_cast<long long>(grid_for(total)) * kFrameThreads < 0x7fffffffLL;
}

template <typename Index>
cudaError_t finish_launch_as(const FinishArgs& a, long long total, cudaStream_t stream) {
  switch (a.out_kind) {
    case kFloat32Out:
      ipa_finish_kernel<Index, float><<<grid_for(total), kFrameThreads, 0, stream>>>(a);
      break;
    case kBFloat16Out:
      ipa_finish_kernel<Index, __nv_bfloat16><<<grid_for(total), kFrameThreads, 0, stream>>>(a);
      break;
    case kFloat16Out:
      ipa_finish_kernel<Index, __half><<<grid_for(total), kFrameThreads, 0, stream>>>(a);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t prepare_launch(const PrepareArgs& a, cudaStream_t stream) {
  const long long total = static_cast<long long>(a.B) * a.H * a.N * (2 * (a.dqp + a.pqp) + a.wv);
  if (fits_int(total)) {
    ipa_prepare_kernel<int><<<grid_for(total), kFrameThreads, 0, stream>>>(a);
  } else {
    ipa_prepare_kernel<long long><<<grid_for(total), kFrameThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t finish_launch(const FinishArgs& a, cudaStream_t stream) {
  const long long total = static_cast<long long>(a.B) * a.N * a.H * (a.d + 3 * a.vp);
  return fits_int(total) ? finish_launch_as<int>(a, total, stream)
                         : finish_launch_as<long long>(a, total, stream);
}

}  // namespace ipa
