// cuda-fused: flash-style Invariant Point Attention with the pair-bias projection fused in.
// This file: which kernel runs a call (class limits, the class a layer gets), the launch plan
// (shared memory, occupancy, split-K) and the split-K combine. The kernels live one file per
// kernel class family (ipa_fused_common.cuh declares what they export):
//   small   ipa_fused_small_generic.cu  T=2 lanes per query row, 16 queries/CTA, key/value tiles
//                                       in shared memory (cp.async, double-buffered)
//   generic ipa_fused_small_generic.cu  T=8, 4 queries/CTA, key/value rows read through L1
//   af2     ipa_fused_af2.cu            AlphaFold2's sizes exactly: the same CTA and tile as
//                                       `small`, every width a compile-time constant, whole dot
//                                       products per lane, pair bias without reductions
//           ipa_fused_af2_tc.cu         its kTensorCores form: bias warps and the attention
//                                       on tensor cores, 8-key tiles
// A layer runs the first class of af2, small, generic whose limits take its padded widths
// (fused_kernel_class; variants/cuda_fused.py mirrors it and tests/test_cuda.py checks that).
//
// One CTA owns QT queries of one batch element for ALL heads (warp w <-> head w), so every
// pair_repr row z[b,i,j,:] is read from device memory exactly once and projected to all H biases
// in registers. Keys are walked in tiles; per tile the warps turn the tile's z rows into biases
// (staged in shared memory by cp.async two tiles ahead), meet at one barrier, then each warp
// scores its head's queries against the tile (q.k scaled, minus the softplus-weighted squared
// point distance computed DIRECTLY, plus the bias) and runs an fp32 online softmax update and
// one accumulation of the value row [v | value points]. Softmax runs in base 2 (log2(e) folded
// into q, the point weight and the pair-bias weight). No (B,H,N,N) tensor is ever written: extra
// memory is the (B,N,H,d+3Vp) output plus, when the key range is split across CTAs (split-K, to
// fill the GPU at small N), split partials of the same order, O(N).
#include <math.h>

#include <algorithm>

#include "ipa_fused_common.cuh"

namespace ipa {
namespace {

// Merge split-K partials: out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s. One thread per
// output element (row, feature), so a warp reads and writes contiguous features (one warp per row
// with a loop over the features took 9 us at N = 1024, H100, thirty-third session). Int indices:
// a plan splits by itself only when its CTAs do not fill the GPU (B * ceil(N / queries) < the
// SMs' slots), so rows * wv * splits is small; `fused_plan` refuses a forced split past int.
constexpr int kCombineThreads = 256;
// Splits a call given a finish merges in the finish's launch (finish_launch with partials); past
// them the combine, then the plain finish. H100, replayed, default layer (thirty-sixth session):
// merged in finish, 8 splits (N = 256) lost 3 us (fp32 0.063 -> 0.066 ms, bf16 0.040 -> 0.043:
// one CTA a residue re-reads 8 partials a value), 2 splits (N = 1024) gained (fp32 0.287 ->
// 0.281, bf16 0.171 -> 0.171).
constexpr int kFinishMergesUpTo = 2;

__global__ void __launch_bounds__(kCombineThreads) ipa_fused_combine_kernel(
    const float* __restrict__ part, float* __restrict__ out, int splits, int B, int N, int H,
    int wv, int dv) {
  const int rows = B * H * N;
  const int e = blockIdx.x * kCombineThreads + threadIdx.x;
  if (e >= rows * dv) return;
  const int row = e / dv, f = e - row * dv;
  const float* ml = part + splits * rows * wv;
  const float mx = split_max(ml, splits, rows, row);
  float den = 0.f, num = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float w = split_weight(ml, s, rows, row, mx);
    den = fmaf(w, ml[(s * rows + row) * 2 + 1], den);
    num = fmaf(w, part[(s * rows + row) * wv + f], num);
  }
  const int i = row % N, bh = row / N;
  const int h = bh % H, b = bh / H;
  out[((b * N + i) * H + h) * dv + f] = num / den;
}

FusedKernelFn select_kernel(int klass, bool z_bf16, int bias) {
  if (klass == kFusedAF2 && bias == kTensorCores) return af2_tc_kernel(z_bf16);
  if (klass == kFusedAF2) return af2_kernel(z_bf16, bias);
  return small_generic_kernel(klass, z_bf16);
}

int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
  return n;
}

int round_up(int x, int m) { return (x + m - 1) / m * m; }

}  // namespace

FusedClassLimits fused_class_limits(int klass) {
  if (klass == kFusedAF2) return af2_limits();
  return small_generic_limits(klass);
}

bool fused_class_fits(int klass, int H, int C, int dqp, int pqp, int wv) {
  if (klass != kFusedSmall && klass != kFusedGeneric && klass != kFusedAF2) return false;
  const FusedClassLimits lim = fused_class_limits(klass);
  const int width = 4 * lim.lanes_per_row;
  return H >= 1 && H <= lim.max_heads && !(lim.even_heads && H % 2) && C >= 8 &&
         C <= kMaxPairDim && C % 8 == 0 && (!lim.pair_dim || C == lim.pair_dim) && dqp > 0 &&
         dqp % width == 0 && dqp <= lim.max_dqp && pqp % width == 0 && pqp <= lim.max_pqp &&
         wv % width == 0 && wv <= lim.max_wv &&
         (!lim.exact || (dqp == lim.max_dqp && pqp == lim.max_pqp && wv == lim.max_wv));
}

bool fused_bias_fits(int klass, bool z_bf16, int bias) {
  return bias == kFfmaBias ||
         (klass == kFusedAF2 && (bias == kMmaHeadRows || bias == kTensorCores ||
                                 (bias == kMmaPairRows && z_bf16)));
}

int fused_kernel_class(int H, int head_dim, int query_points, int value_points, int pair_dim) {
  for (const int klass : {kFusedAF2, kFusedSmall, kFusedGeneric}) {
    const int width = 4 * fused_class_limits(klass).lanes_per_row;
    if (fused_class_fits(klass, H, pair_dim, round_up(head_dim, width),
                         round_up(3 * query_points, width),
                         round_up(head_dim + 3 * value_points, width)))
      return klass;
  }
  return -1;
}

cudaError_t fused_plan(int klass, bool z_bf16, int B, int N, int H, int C, int wq, int wv,
                       int forced_splits, FusedPlan* plan, int bias) {
  if (klass != kFusedSmall && klass != kFusedGeneric && klass != kFusedAF2)
    return cudaErrorInvalidValue;
  if (!fused_bias_fits(klass, z_bf16, bias)) return cudaErrorInvalidValue;
  const FusedClassLimits lim = fused_class_limits(klass);
  if (B < 1 || N < 1 || H < 1 || H > lim.max_heads || (lim.even_heads && H % 2) || C < 8 ||
      C > kMaxPairDim || C % 8 || wq % (4 * lim.lanes_per_row) || wv % (4 * lim.lanes_per_row) ||
      wv > lim.max_wv || (lim.pair_dim && C != lim.pair_dim) ||
      (lim.exact && (wq != lim.max_dqp + lim.max_pqp || wv != lim.max_wv)))
    return cudaErrorInvalidValue;
  const bool tc = bias == kTensorCores;
  const int qt = lim.queries_per_cta;
  const int bn = tc ? kAf2TcKeyTile : 8 * H / qt;
  const int threads = 32 * (tc ? H + kAf2TcBiasWarps : H);
  const int zbytes = z_bf16 ? 2 : 4;
  const size_t smem = tc                   ? af2_tc_smem_bytes(H, z_bf16)
                      : klass == kFusedAF2 ? af2_smem_bytes(H, zbytes, bias)
                                           : small_generic_smem_bytes(klass, H, C, zbytes, wq, wv);
  FusedKernelFn kern = select_kernel(klass, z_bf16, bias);
  int dev = 0, max_optin = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return err;
  if (smem > static_cast<size_t>(max_optin)) return cudaErrorInvalidConfiguration;
  err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  int occ = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, threads, smem);
  if (err != cudaSuccess) return err;
  if (occ < 1) return cudaErrorInvalidConfiguration;

  const long long qtiles = (N + qt - 1) / qt;
  const int ntiles = (N + bn - 1) / bn;
  const long long ctas = qtiles * B;
  const long long slots = static_cast<long long>(sm_count()) * occ;
  int splits = forced_splits > 0 ? forced_splits
                                 : (ctas >= slots ? 1 : static_cast<int>(slots / ctas));
  splits = std::max(1, std::min(splits, ntiles));
  splits = std::min(splits, 65535);
  const int tps = (ntiles + splits - 1) / splits;
  splits = (ntiles + tps - 1) / tps;  // no empty split
  // the combine's int indices (only a forced split of a large call gets here)
  if (splits > 1 && static_cast<long long>(splits) * B * H * N * (wv + 2) > 0x7fffffffLL)
    return cudaErrorInvalidConfiguration;

  plan->klass = klass;
  plan->z_bf16 = z_bf16;
  plan->bias = bias;
  plan->key_tile = bn;
  plan->threads = threads;
  plan->queries_per_cta = qt;
  plan->splits = splits;
  plan->tiles_per_split = tps;
  plan->smem_bytes = smem;
  plan->workspace_floats = splits > 1 ? static_cast<size_t>(splits) * B * H * N * (wv + 2) : 0;
  plan->blocks_per_sm = occ;
  return cudaSuccess;
}

cudaError_t fused_launch(const FusedArgs& args_in, const FusedPlan& plan, cudaStream_t stream,
                         const FinishArgs* finish) {
  FusedArgs args = args_in;
  args.splits = plan.splits;
  args.tiles_per_split = plan.tiles_per_split;
  const int qt = plan.queries_per_cta;
  const dim3 grid((args.N + qt - 1) / qt, plan.splits, args.B);
  select_kernel(plan.klass, plan.z_bf16, plan.bias)<<<grid, plan.threads, plan.smem_bytes, stream>>>(args);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (finish != nullptr && plan.splits <= kFinishMergesUpTo) {
    const SplitPartials partials{args.part, plan.splits, args.wv, args.dv};
    return finish_launch(*finish, stream, plan.splits > 1 ? &partials : nullptr);
  }
  if (plan.splits > 1) {
    const int elements = args.B * args.H * args.N * args.dv;
    ipa_fused_combine_kernel<<<(elements + kCombineThreads - 1) / kCombineThreads, kCombineThreads,
                               0, stream>>>(args.part, args.out, plan.splits, args.B, args.N,
                                            args.H, args.wv, args.dv);
    err = cudaGetLastError();
  }
  return finish != nullptr && err == cudaSuccess ? finish_launch(*finish, stream, nullptr) : err;
}

}  // namespace ipa
