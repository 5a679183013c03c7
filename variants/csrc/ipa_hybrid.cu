// cuda-hybrid: the attention probabilities of IPA in one CUDA kernel; everything else in PyTorch.
//
// probs[b,h,i,j] = softmax_j( q_i.k_j/sqrt(d) - softplus(w_h)/2 * |qp_i - kp_j|^2 + bias[b,h,i,j] )
// with the squared point distance computed directly (no |q|^2 + |k|^2 - 2 q.k expansion, which
// cancels catastrophically at Angstrom-scale coordinates). One CTA owns QB = 8 query rows of one
// (b, h): the query rows sit in shared memory, each thread walks keys j = tid, tid + 256, ...,
// reads k_j once for the 8 rows, writes the raw logits to `probs` and keeps an online
// (max, sum) per row; after a block reduction it rescales its own entries in place (it reads back
// only what it wrote, so no barrier is needed between the passes). The N x N probabilities are
// the point of this variant: it is the straightforward comparison for cuda-fused.
#include <math.h>

#include "ipa_common.cuh"
#include "ipa_kernels.h"

namespace ipa {
namespace {

constexpr int kHybridRows = 8;      // query rows per CTA (k_j reuse)
constexpr int kHybridThreads = 256;
constexpr int kHybridMaxWidth = kHybridMaxQueryWidth;  // floats per query row (wq)

// Merge two online-softmax states (m, l): l counts sum 2^(s - m).
__device__ __forceinline__ void merge_state(float& m, float& l, float mo, float lo) {
  const float mx = fmaxf(m, mo);
  const float a = m == -INFINITY ? 0.f : exp2f(m - mx);
  const float c = mo == -INFINITY ? 0.f : exp2f(mo - mx);
  l = l * a + lo * c;
  m = mx;
}

template <typename BT>
__global__ void __launch_bounds__(kHybridThreads) ipa_hybrid_probs_kernel(const HybridArgs a) {
  // Static, not dynamic: under compute-sanitizer racecheck the hybrid's first launch faulted
  // with the query tile in dynamic smem read as float4 behind the static arrays.
  __shared__ __align__(16) float q_s[kHybridRows * kHybridMaxWidth];
  __shared__ float red_m[kHybridThreads / 32][kHybridRows];
  __shared__ float red_l[kHybridThreads / 32][kHybridRows];
  __shared__ float fin_m[kHybridRows], fin_inv[kHybridRows];

  const int N = a.N, H = a.H, wq = a.wq, dqp = a.dqp;
  const int h = blockIdx.y, b = blockIdx.z;
  const int i0 = blockIdx.x * kHybridRows;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const size_t bh = static_cast<size_t>(b) * H + h;

  for (int idx = tid; idx < kHybridRows * wq; idx += kHybridThreads) {
    const int rr = idx / wq, c = idx - rr * wq;
    q_s[idx] = i0 + rr < N ? a.q[(bh * N + i0 + rr) * wq + c] : 0.f;
  }
  __syncthreads();

  const float pwh = a.pw[h];
  const float* kb = a.k + bh * N * wq;
  const BT* bias = static_cast<const BT*>(a.bias);
  float m[kHybridRows], l[kHybridRows];
#pragma unroll
  for (int rr = 0; rr < kHybridRows; ++rr) { m[rr] = -INFINITY; l[rr] = 0.f; }

  // Pass 1: raw base-2 logits, written once; online (max, sum) per row.
  for (int j = tid; j < N; j += kHybridThreads) {
    const float* kr = kb + static_cast<size_t>(j) * wq;
    float dot[kHybridRows], dist[kHybridRows];
#pragma unroll
    for (int rr = 0; rr < kHybridRows; ++rr) { dot[rr] = 0.f; dist[rr] = 0.f; }
    for (int c = 0; c < dqp; c += 4) {
      const float4 kk = ld_global4(kr + c);
#pragma unroll
      for (int rr = 0; rr < kHybridRows; ++rr) {
        const float4 qq = ld_shared4(q_s + rr * wq + c);
        dot[rr] = fmaf(qq.x, kk.x, dot[rr]);
        dot[rr] = fmaf(qq.y, kk.y, dot[rr]);
        dot[rr] = fmaf(qq.z, kk.z, dot[rr]);
        dot[rr] = fmaf(qq.w, kk.w, dot[rr]);
      }
    }
    for (int c = dqp; c < wq; c += 4) {
      const float4 kk = ld_global4(kr + c);
#pragma unroll
      for (int rr = 0; rr < kHybridRows; ++rr) {
        const float4 qq = ld_shared4(q_s + rr * wq + c);
        const float dx = qq.x - kk.x, dy = qq.y - kk.y, dz = qq.z - kk.z, dw = qq.w - kk.w;
        dist[rr] = fmaf(dx, dx, dist[rr]);
        dist[rr] = fmaf(dy, dy, dist[rr]);
        dist[rr] = fmaf(dz, dz, dist[rr]);
        dist[rr] = fmaf(dw, dw, dist[rr]);
      }
    }
#pragma unroll
    for (int rr = 0; rr < kHybridRows; ++rr) {
      if (i0 + rr < N) {
        const size_t idx = (bh * N + i0 + rr) * N + j;
        const float s = (to_float(bias[idx]) + fmaf(pwh, dist[rr], dot[rr])) * kLog2e;
        a.probs[idx] = s;
        if (s > m[rr]) {
          l[rr] = l[rr] * exp2f(m[rr] - s) + 1.f;  // exp2f(-inf) = 0 on the first key
          m[rr] = s;
        } else {
          l[rr] += exp2f(s - m[rr]);
        }
      }
    }
  }

  // Block reduction of the per-thread states: warps by shuffles, then across warps.
#pragma unroll
  for (int rr = 0; rr < kHybridRows; ++rr) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[rr], off);
      const float lo = __shfl_xor_sync(0xffffffffu, l[rr], off);
      merge_state(m[rr], l[rr], mo, lo);
    }
    if (lane == 0) { red_m[warp][rr] = m[rr]; red_l[warp][rr] = l[rr]; }
  }
  __syncthreads();
  if (tid < kHybridRows) {
    float mm = -INFINITY, ll = 0.f;
    for (int w = 0; w < kHybridThreads / 32; ++w) merge_state(mm, ll, red_m[w][tid], red_l[w][tid]);
    fin_m[tid] = mm;
    fin_inv[tid] = 1.f / ll;
  }
  __syncthreads();

  // Pass 2: each thread normalises the entries it wrote.
#pragma unroll
  for (int rr = 0; rr < kHybridRows; ++rr) {
    if (i0 + rr >= N) continue;
    const float mm = fin_m[rr], inv = fin_inv[rr];
    float* row = a.probs + (bh * N + i0 + rr) * N;
    for (int j = tid; j < N; j += kHybridThreads) row[j] = exp2f(row[j] - mm) * inv;
  }
}

}  // namespace

cudaError_t hybrid_launch(const HybridArgs& a, bool bias_bf16, cudaStream_t stream) {
  const dim3 grid((a.N + kHybridRows - 1) / kHybridRows, a.H, a.B);
  if (a.wq > kHybridMaxWidth || a.wq % 4 || a.dqp % 4) return cudaErrorInvalidValue;
  if (bias_bf16)
    ipa_hybrid_probs_kernel<__nv_bfloat16><<<grid, kHybridThreads, 0, stream>>>(a);
  else
    ipa_hybrid_probs_kernel<float><<<grid, kHybridThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ipa
