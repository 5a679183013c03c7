// The O(N) steps around the attention kernels, one launch each instead of ~25 small PyTorch ops
// (on the H200 each eager op costs the host 20-40 us, so the PyTorch version of these steps
// took longer than the attention kernel itself up to N = 1024):
//   prepare  projection output -> padded q / k / v operand rows, points moved to the global frame
//   finish   attended [o_s | o_p (global)] -> [o_s | o_p in each residue's local frame]; or, in
//            the launch that follows a split fused call, the same from the split partials, merged
//            in shared memory: the combine kernel's launch and its output's round trip saved
// Both read the frames in the inputs' dtype (no cast launches for bf16 / fp16 inputs) and compute
// in float32. Latency-bound, not bandwidth-bound, at the sizes that matter: with one output
// element a thread, prepare ran 1.4 M threads in ~5 waves of dependent loads (index, projection,
// frame) and took 15 us at N = 1024 on an H100 for ~10 MB of traffic (thirty-third session). So a
// thread owns four consecutive columns of one row: its loads are independent of each other, the
// frame is read once for the four, and prepare's stores are 16 bytes. The element index is
// 32-bit whenever the count allows (64-bit divisions are emulated in ~70 instructions each).
#include "ipa_common.cuh"
#include "ipa_kernels.h"

namespace ipa {
namespace {

constexpr int kFrameThreads = 256;

__device__ __forceinline__ void store(float* p, float x) { *p = x; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void store(__half* p, float x) { *p = __float2half_rn(x); }

// The frame (R, t) of residue bn, in float32.
template <typename Frame, typename Index>
__device__ __forceinline__ void load_frame(const void* rot, const void* trans, Index bn,
                                           float (&R)[9], float (&t)[3]) {
  const Frame* r = static_cast<const Frame*>(rot) + bn * 9;
  const Frame* tr = static_cast<const Frame*>(trans) + bn * 3;
#pragma unroll
  for (int i = 0; i < 9; ++i) R[i] = to_float(r[i]);
#pragma unroll
  for (int i = 0; i < 3; ++i) t[i] = to_float(tr[i]);
}

// Coordinate dd of p @ R + t (row-vector convention) for point x (3 floats) at residue (R, t).
// All three are computed and one selected: indexing R by dd would put R in local memory.
__device__ __forceinline__ float to_global(const float* x, const float (&R)[9], const float (&t)[3],
                                           int dd) {
  float g[3];
#pragma unroll
  for (int c = 0; c < 3; ++c) g[c] = fmaf(x[0], R[c], fmaf(x[1], R[3 + c], x[2] * R[6 + c])) + t[c];
  return dd == 0 ? g[0] : dd == 1 ? g[1] : g[2];
}

// Coordinate dd of (p - t) @ R^T, point p (3 floats, global frame) back to residue (R, t)'s frame.
__device__ __forceinline__ float to_local(const float* p, const float (&R)[9], const float (&t)[3],
                                          int dd) {
  float l[3];
#pragma unroll
  for (int r = 0; r < 3; ++r)
    l[r] = fmaf(p[0] - t[0], R[3 * r], fmaf(p[1] - t[1], R[3 * r + 1], (p[2] - t[2]) * R[3 * r + 2]));
  return dd == 0 ? l[0] : dd == 1 ? l[1] : l[2];
}

// Index: int where total + one grid's stride fits in it (`fits_int`), else long long.
// Thread e: row (b * H + h) * N + n of the three operands' concatenated columns [q | k | v]
// (2 wq + wv wide, every part a multiple of 4), columns 4 c .. 4 c + 3 of it.
template <typename Index, typename Frame>
__global__ void __launch_bounds__(kFrameThreads) ipa_prepare_kernel(const PrepareArgs a) {
  const int H = a.H, N = a.N, d = a.d;
  const int wq = a.dqp + a.pqp, chunks = (2 * wq + a.wv) / 4;
  const Index total = static_cast<Index>(a.B) * H * N * chunks;
  const int hd = H * d;
  for (Index e = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index row = e / chunks;
    int col = 4 * static_cast<int>(e - row * chunks);
    const int n = static_cast<int>(row % N);
    const Index bh = row / N;
    const int h = static_cast<int>(bh % H), b = static_cast<int>(bh / H);
    const Index bn = static_cast<Index>(b) * N + n;
    const float* x = a.proj + bn * a.features;
    float R[9], t[3];
    float val[4];
    float* dst;
    if (col < 2 * wq) {  // q or k: [scalar (d), pad to dqp | points (3 qp), pad]
      const bool is_k = col >= wq;
      col -= is_k ? wq : 0;
      dst = (is_k ? a.k : a.q) + row * wq + col;
      const int pts_end = a.dqp + 3 * a.qp;
      if (col + 4 > a.dqp && col < pts_end) load_frame<Frame>(a.rot, a.trans, bn, R, t);
      const float* xp = x + 3 * hd + (is_k ? 3 * H * a.qp : 0) + 3 * h * a.qp;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = col + j;
        val[j] = 0.f;
        if (c < d) {
          val[j] = x[(is_k ? hd : 0) + h * d + c] * (is_k ? 1.f : a.q_scale);
        } else if (c >= a.dqp && c < pts_end) {
          const int pc = c - a.dqp;
          val[j] = to_global(xp + 3 * (pc / 3), R, t, pc % 3);
        }
      }
    } else {  // v: [scalar (d) | points (3 vp) | pad]
      col -= 2 * wq;
      dst = a.v + row * a.wv + col;
      const int pts_end = d + 3 * a.vp;
      if (col + 4 > d && col < pts_end) load_frame<Frame>(a.rot, a.trans, bn, R, t);
      const float* xp = x + 3 * hd + 6 * H * a.qp + 3 * h * a.vp;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = col + j;
        val[j] = 0.f;
        if (c < d) {
          val[j] = x[2 * hd + h * d + c];
        } else if (c < pts_end) {
          const int pc = c - d;
          val[j] = to_global(xp + 3 * (pc / 3), R, t, pc % 3);
        }
      }
    }
    *reinterpret_cast<float4*>(dst) = make_float4(val[0], val[1], val[2], val[3]);
  }
}

// Column cc of finish's output row [o_s (H d) | local value points (3 H vp)] from the residue's
// attended row (H heads `pitch` floats apart: [o_s (d) | o_p (global, 3 vp)]) and frame.
__device__ __forceinline__ float finish_column(const float* row, int pitch, int cc, int H, int d,
                                               int vp, const float (&R)[9], const float (&t)[3]) {
  const int hd = H * d;
  if (cc < hd) return row[(cc / d) * pitch + cc % d];
  const int c = cc - hd, point = c / 3;
  return to_local(row + (point / vp) * pitch + d + 3 * (point % vp), R, t, c % 3);
}

// Thread e: residue bn, columns 4 c .. 4 c + 3 (those below the width) of its output row
// [o_s (H d) | local value points (3 H vp)], written as Out.
template <typename Index, typename Out, typename Frame>
__global__ void __launch_bounds__(kFrameThreads) ipa_finish_kernel(const FinishArgs a) {
  const int H = a.H, d = a.d, hd = H * d;
  const int width = hd + 3 * H * a.vp, chunks = (width + 3) / 4;
  const Index total = static_cast<Index>(a.B) * a.N * chunks;
  Out* out = static_cast<Out*>(a.out);
  for (Index e = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index bn = e / chunks;
    const int col = 4 * static_cast<int>(e - bn * chunks);
    const float* row = a.attended + bn * H * a.pitch;
    float R[9], t[3];
    if (col + 4 > hd) load_frame<Frame>(a.rot, a.trans, bn, R, t);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int cc = col + j;
      if (cc >= width) break;
      store(out + bn * width + cc, finish_column(row, a.pitch, cc, H, d, a.vp, R, t));
    }
  }
}

// One CTA per residue bn (b N + n), `finish` with the split-K merge in front (SplitPartials;
// named ipa_fused_* as cuda-fused's kernels are, which the sanitizer tests select by name): its
// H rows merged into shared memory, [head][dv], then its output row written from there as
// ipa_finish_kernel writes it. Int indices: a call splits only when its CTAs do not fill the GPU,
// and `fused_plan` keeps splits * rows * (wv + 2) below INT_MAX.
constexpr int kMergeThreads = 128;

size_t merge_smem_bytes(const FinishArgs& a, const SplitPartials& p) {
  return sizeof(float) * (static_cast<size_t>(a.H) * p.dv + 2 * a.H);
}

template <typename Out, typename Frame>
__global__ void __launch_bounds__(kMergeThreads)
    ipa_fused_merge_finish_kernel(const FinishArgs a, const SplitPartials p) {
  extern __shared__ float merged[];  // H * dv merged features, then each head's max and sum
  float* head_max = merged + a.H * p.dv;
  float* head_sum = head_max + a.H;
  const int H = a.H, d = a.d, hd = H * d, dv = p.dv;
  const int bn = blockIdx.x, b = bn / a.N, n = bn - b * a.N;
  const int rows = a.B * H * a.N;
  const float* ml = p.part + p.splits * rows * p.wv;
  float R[9], t[3];
  load_frame<Frame>(a.rot, a.trans, bn, R, t);
  for (int h = threadIdx.x; h < H; h += kMergeThreads) {
    const int row = (b * H + h) * a.N + n;
    const float mx = split_max(ml, p.splits, rows, row);
    float den = 0.f;
    for (int s = 0; s < p.splits; ++s)
      den = fmaf(split_weight(ml, s, rows, row, mx), ml[(s * rows + row) * 2 + 1], den);
    head_max[h] = mx;
    head_sum[h] = den;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < H * dv; e += kMergeThreads) {
    const int h = e / dv, f = e - h * dv;
    const int row = (b * H + h) * a.N + n;
    float num = 0.f;
    for (int s = 0; s < p.splits; ++s)
      num = fmaf(split_weight(ml, s, rows, row, head_max[h]), p.part[(s * rows + row) * p.wv + f],
                 num);
    merged[e] = num / head_sum[h];
  }
  __syncthreads();
  const int width = hd + 3 * H * a.vp;
  Out* out = static_cast<Out*>(a.out) + static_cast<size_t>(bn) * width;
  for (int cc = threadIdx.x; cc < width; cc += kMergeThreads)
    store(out + cc, finish_column(merged, dv, cc, H, d, a.vp, R, t));
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

template <typename Frame>
cudaError_t prepare_as(const PrepareArgs& a, long long total, cudaStream_t stream) {
  if (fits_int(total)) {
    ipa_prepare_kernel<int, Frame><<<grid_for(total), kFrameThreads, 0, stream>>>(a);
  } else {
    ipa_prepare_kernel<long long, Frame><<<grid_for(total), kFrameThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <typename Out, typename Frame>
cudaError_t finish_as(const FinishArgs& a, const SplitPartials* partials, long long total,
                      cudaStream_t stream) {
  if (partials != nullptr) {
    ipa_fused_merge_finish_kernel<Out, Frame>
        <<<a.B * a.N, kMergeThreads, merge_smem_bytes(a, *partials), stream>>>(a, *partials);
  } else if (fits_int(total)) {
    ipa_finish_kernel<int, Out, Frame><<<grid_for(total), kFrameThreads, 0, stream>>>(a);
  } else {
    ipa_finish_kernel<long long, Out, Frame><<<grid_for(total), kFrameThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t prepare_launch(const PrepareArgs& a, cudaStream_t stream) {
  if (a.dqp % 4 || a.pqp % 4 || a.wv % 4) return cudaErrorInvalidValue;
  const long long total = static_cast<long long>(a.B) * a.H * a.N * ((2 * (a.dqp + a.pqp) + a.wv) / 4);
  switch (a.frame_kind) {
    case kFloat32Values: return prepare_as<float>(a, total, stream);
    case kBFloat16Values: return prepare_as<__nv_bfloat16>(a, total, stream);
    case kFloat16Values: return prepare_as<__half>(a, total, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t finish_launch(const FinishArgs& a, cudaStream_t stream, const SplitPartials* partials) {
  if (partials != nullptr && (partials->splits < 2 || partials->dv < a.d + 3 * a.vp ||
                              merge_smem_bytes(a, *partials) > 48 * 1024))
    return cudaErrorInvalidValue;
  const long long total = static_cast<long long>(a.B) * a.N * ((a.H * (a.d + 3 * a.vp) + 3) / 4);
  // out: float32, or the frames' 16-bit dtype (the inputs')
  if (a.out_kind == kFloat32Values) {
    switch (a.frame_kind) {
      case kFloat32Values:
        return finish_as<float, float>(a, partials, total, stream);
      case kBFloat16Values:
        return finish_as<float, __nv_bfloat16>(a, partials, total, stream);
      case kFloat16Values:
        return finish_as<float, __half>(a, partials, total, stream);
      default: return cudaErrorInvalidValue;
    }
  }
  if (a.out_kind != a.frame_kind) return cudaErrorInvalidValue;
  switch (a.frame_kind) {
    case kBFloat16Values:
      return finish_as<__nv_bfloat16, __nv_bfloat16>(a, partials, total, stream);
    case kFloat16Values:
      return finish_as<__half, __half>(a, partials, total, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace ipa
