// Host-side interface of the IPA kernels: plain structs and launchers, no torch types, so that
// the .cu files compile with nvcc alone and the torch binding (ipa_binding.cpp) stays thin.
#pragma once

#include <cuda_runtime_api.h>
#include <stddef.h>

namespace ipa {

// ---------------------------------------------------------------------------------------------
// cuda-fused: flash-style IPA attention with the pair-bias projection fused in.
//
// Operand layouts (all float32, contiguous, prepared by variants/cuda_ext.py):
//   q    (B, H, N, wq)  row = [q * log2(e)/sqrt(d), zero pad to dqp | query points (global), pad]
//   k    (B, H, N, wq)  row = [k, pad to dqp | key points (global), pad];  wq = dqp + pqp
//   v    (B, H, N, wv)  row = [v (d) | value points (global, 3*Vp) | zero pad]
//   z    (B, N, N, C)   pair_repr, float32 or bfloat16 (read once, never copied)
//   wb   (H, C)         pair_bias.weight * log2(e)
//   pw   (H,)           -softplus(head_weights) / 2 * log2(e)
//   out  (B, N, H, dv)  softmax-weighted [v | value points], dv = d + 3*Vp, every element written
//   part (workspace)    split-K partials, used when splits > 1
// ---------------------------------------------------------------------------------------------

enum FusedClass : int {
  kFusedSmall = 0,    // 2 lanes per row, 16 queries per CTA: d <= 32, Qp <= 16, d+3Vp <= 80, even H <= 12
  kFusedGeneric = 1,  // 8 lanes per row, 4 queries per CTA: d <= 128, Qp, Vp <= 16, H <= 16
  kFusedAF2 = 2,      // AlphaFold2's sizes exactly (d 32, Qp 4, Vp 8, pair_dim 128), even H <= 12:
                      // compile-time widths, register-tiled logits, pair bias without reductions
};

// The af2 class's pair bias: FFMA, or on tensor cores (mma.sync; W_b as hi + lo parts) with a
// warp's 8 pairs as the rows of A (bf16 z only; rows 8-15 zero: 32 mma a warp and tile) or W_b's
// 16 padded heads as the rows of A and the pairs as B's columns (bf16: 16 mma; fp32 z: 3xTF32,
// 48 mma of m16n8k8). kTensorCores (ipa_fused_af2_tc.cu) is a kernel of its own: the head-rows
// bias on 4 extra warps, and the attention's q.k (3xTF32) and p.v on TF32 mma (3xTF32 for fp32
// z), 8-key tiles.
enum FusedBias : int {
  kFfmaBias = 0,
  kMmaPairRows = 1,
  kMmaHeadRows = 2,
  kTensorCores = 3,
};

// Whether kernel class `klass` has a kernel for pair-bias form `bias` with z in bf16 (z_bf16) or
// fp32: FFMA everywhere; the tensor-core forms in the af2 class, kMmaPairRows for bf16 z only
// (fused_plan and the binding check it; variants/cuda_fused.py bias_forms mirrors it).
bool fused_bias_fits(int klass, bool z_bf16, int bias);

// Per-class limits, checked by the binding (mirrored in variants/cuda_fused.py, compared
// with these by tests/test_cuda.py).
struct FusedClassLimits {
  int lanes_per_row;  // padded widths are multiples of 4 * lanes_per_row floats
  int queries_per_cta;
  int max_heads;
  bool even_heads;
  int max_dqp, max_pqp, max_wv;
  bool exact;     // the widths must equal max_dqp, max_pqp, max_wv (compile-time sizes)
  int pair_dim;   // the only pair_dim the class takes, 0 = any multiple of 8 <= kMaxPairDim
};
FusedClassLimits fused_class_limits(int klass);

constexpr int kMaxPairDim = 128;

// Whether class `klass` takes these padded operand widths (dqp, pqp = wq - dqp, wv: floats), H
// heads and pair_dim C: every limit of FusedClassLimits, as the binding checks them one by one.
bool fused_class_fits(int klass, int H, int C, int dqp, int pqp, int wv);

// The class cuda-fused runs for a layer: the first of af2, small, generic that fits its widths
// padded to the class's 4 * lanes_per_row floats (variants/cuda_ext.py, Widths.for_lanes), or -1
// when none does. Host only, no CUDA call: tests/csrc/fused_classes.cu prints it without a GPU.
int fused_kernel_class(int H, int head_dim, int query_points, int value_points, int pair_dim);

struct FusedArgs {
  const float* q;
  const float* k;
  const float* v;
  const void* z;
  const float* wb;
  const float* pw;
  float* out;
  float* part;  // workspace: splits*B*H*N*(wv + 2) floats when splits > 1, else unused
  int B, N, H, C;
  int wq, dqp, wv, dv;
  int splits, tiles_per_split;
};

struct FusedPlan {
  int klass;
  bool z_bf16;
  int bias;             // FusedBias: kFfmaBias, or (af2 class) a tensor-core form
  int key_tile;         // keys per tile (8*H / queries-per-CTA; kTensorCores: 8)
  int threads;          // per CTA: 32 per head (kTensorCores: and 4 bias warps)
  int queries_per_cta;
  int splits;           // key-range splits (split-K), >= 1
  int tiles_per_split;  // key tiles per split
  size_t smem_bytes;
  size_t workspace_floats;  // 0 when splits == 1
  int blocks_per_sm;
};

// Choose the key tile, split-K factor (0 = automatic) and shared memory for one call.
// Returns cudaErrorInvalidValue when the shapes do not fit the class.
cudaError_t fused_plan(int klass, bool z_bf16, int B, int N, int H, int C, int wq, int wv,
                       int forced_splits, FusedPlan* plan, int bias = kFfmaBias);

// Launch the fused kernel (and the split-K combine when plan.splits > 1) on `stream`. With
// `finish` (its `attended` = args.out, its pitch = args.dv), the call ends in the finish's output
// too: with 2 splits the partials are merged in the finish's launch (args.out is then not
// written; see finish_launch), with more the combine writes args.out and the finish follows, with
// one the finish follows the kernel.
struct FinishArgs;
cudaError_t fused_launch(const FusedArgs& args, const FusedPlan& plan, cudaStream_t stream,
                         const FinishArgs* finish = nullptr);

// ---------------------------------------------------------------------------------------------
// Problem openfold's cuda-fused (ipa_openfold.cu): the layer's O(N^2) core, z read once, OpenFold's
// sizes exactly (c_hidden 16, 4 query and 8 value points, c_z 128), 1 <= H <= 12. Operands (float32,
// contiguous, prepared by variants/openfold/cuda_fused.py):
//   q     (B, H, N, 28)  rows [q (16) | points (12)], points global, centred per batch element
//   k     (B, H, n_pad, 28) rows as q's (fp32 z), or (bfloat16 z) (B, H, n_pad, 44) rows [k hi
//                        (16) | k lo (16) | points (12)], k's TF32 parts for q.k's 3xTF32; n_pad
//                        = N rounded up to 8, rows past N zero
//   v     (B, H, n_pad, 44) rows [v (16) | value points (24) | 4 zeros], rows past N zero; v
//                        rounded to TF32 when z is bfloat16
//                        (B H n_pad 44 < 2^31)
//   z     (B, N, N, 128) float32 or bfloat16
//   wb    (H, 128)       linear_b.weight * sqrt(1/3) * log2(e)
//   pw    (H,)           the point weight in base 2: -softplus(head_weights) w_c / 2 * log2(e)
//   mask  (B, N)         0 or 1
//   cat   (B, N, cat_pitch) linear_out's input: o into columns [h*16, h*16 + 16), o_pair into
//                        [pair_offset + h*128, + 128); nothing else written
//   o_pt  (B, N, H, 24)  the attention-weighted value points, global frame
// q_scale: sqrt(1 / (3 c_hidden)) * log2(e); inf2: the config's inf * log2(e).
// ---------------------------------------------------------------------------------------------
constexpr int kOpenFoldMaxHeads = 12;
constexpr int kOpenFoldKeyTile = 8;  // keys a tile: k and v come padded to a multiple (n_pad)

struct OpenFoldArgs {
  const float* q;
  const float* k;
  const float* v;
  const void* z;
  const float* wb;
  const float* pw;
  const float* mask;
  float* cat;
  float* o_pt;
  int B, N, H, cat_pitch, pair_offset;
  unsigned attending;  // attention warps on scheduler s in byte s (openfold_roles): warp w
                       // attends iff w / 4 < byte w % 4
  float q_scale, inf2;
  bool pair_halves;  // fp32 z: the pair warps share W_b's loads in pairs (ipa_openfold.cu, kHalves)
};

// Whether the kernel takes a layer of these sizes (host only, no CUDA call).
bool openfold_fits(int H, int c_hidden, int qk_points, int v_points, int c_z);
size_t openfold_smem_bytes(int H, bool z_bf16);
unsigned openfold_roles(int H, bool z_bf16, bool balanced);
cudaError_t openfold_launch(const OpenFoldArgs& args, bool z_bf16, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// cuda-hybrid: attention probabilities only.
//   q, k  (B, H, N, wq)  as above but scaled by 1/sqrt(d) (natural-log units)
//   bias  (B, H, N, N)   pair bias, float32 or bfloat16
//   pw    (H,)           -softplus(head_weights) / 2
//   probs (B, H, N, N)   float32 softmax over keys, every element written
// ---------------------------------------------------------------------------------------------
struct HybridArgs {
  const float* q;
  const float* k;
  const void* bias;
  const float* pw;
  float* probs;
  int B, N, H, wq, dqp;
};

constexpr int kHybridMaxQueryWidth = 256;  // wq limit (head_dim 128 + 3 * 16 points = 176)

cudaError_t hybrid_launch(const HybridArgs& args, bool bias_bf16, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// The O(N) steps around the attention kernels (ipa_frames.cu), contiguous tensors.
//   proj   (B, N, features)  float32, the fused projection [q | k | v | q points | k points |
//                            v points], H*d, H*d, H*d, 3*H*qp, 3*H*qp, 3*H*vp wide, points in
//                            local frames
//   rot (B, N, 3, 3), trans (B, N, 3): frames, p_global = p_local @ R + t, in the inputs' dtype
//                            (frame_kind: float32, bfloat16 or float16; read as float32)
//   prepare -> q, k (B, H, N, dqp + pqp) as in FusedArgs (q scaled by q_scale), v (B, H, N, wv),
//           float32; dqp, pqp and wv multiples of 4
//   finish: attended (B, N, H, pitch) float32 [o_s | o_p (global)] -> out (B, N, H*d + 3*H*vp)
//           [o_s | (o_p - t) @ R^T], every element written, as float32 or the frames' dtype
//           (out_kind: the 16-bit output projection reads it in the input dtype)
// ---------------------------------------------------------------------------------------------
enum ValueKind { kFloat32Values = 0, kBFloat16Values = 1, kFloat16Values = 2 };

struct PrepareArgs {
  const float* proj;
  const void* rot;  // of ValueKind frame_kind's type, as trans
  const void* trans;
  float* q;
  float* k;
  float* v;
  int B, N, H, d, qp, vp, features;
  int dqp, pqp, wv;
  float q_scale;
  int frame_kind;
};

struct FinishArgs {
  const float* attended;
  const void* rot;  // of ValueKind frame_kind's type, as trans
  const void* trans;
  void* out;  // of ValueKind out_kind's type: float32 or frame_kind
  int B, N, H, d, vp, pitch;
  int out_kind, frame_kind;
};

// The split-K partials of a fused call (FusedArgs::part): `splits` blocks of B*H*N rows `wv`
// floats apart, of which the first `dv` are merged, then the (max, sum) pair of every row.
struct SplitPartials {
  const float* part;
  int splits, wv, dv;
};

cudaError_t prepare_launch(const PrepareArgs& args, cudaStream_t stream);
// With `partials`, finish reads no `attended`: one CTA a residue merges its H rows from the
// partials (as the split-K combine does, operation for operation: the same bits) into shared
// memory and writes its output row from there, the combine's launch and round trip saved.
cudaError_t finish_launch(const FinishArgs& args, cudaStream_t stream,
                          const SplitPartials* partials = nullptr);

}  // namespace ipa
