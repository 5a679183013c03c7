// Problem openfold's `cuda-fused` (issue #18): the O(N^2) core of OpenFold's IPA (SPEC-openfold.md
// steps 3-8 and 11) in one kernel that reads z once and writes nothing N x N. The pair bias (before
// the softmax) and the pair values o_pair = sum_j a_ij z_ij (after it) come from the same staged
// z tile. Every product runs on tensor cores (mma.sync), the design of cuda-fused's af2
// kTensorCores kernel (ipa_fused_af2_tc.cu) with the pair values added.
//
// Why this shape. o_pair is H x c_z fp32 per query row: 16 (padded) x 128 = 2048 floats, 64
// registers a lane for one query in one warp. The register file (64 Ki words an SM) holds that for
// 8 queries and leaves half for the rest, so a CTA owns 8 queries (kQT) of one batch element,
// all heads, and walks the keys in tiles of 8 (kBN), 64 pairs a tile:
//   pair warps (8, one a query): the pair bias of tile t + 1, D (16 heads x 8 keys) = W_b (16 x
//     c_z) z_i^T (c_z x 8), W_b's hi and lo parts from shared memory by ldmatrix; and the pair
//     values of tile t - 1, D (16 heads x c_z) = alpha D + P (16 heads x 8 keys) z_i (8 x c_z),
//     16 accumulator n-tiles (64 registers) for the whole walk. bf16 z: mma.m16n8k16 (bias) and
//     mma.m16n8k8 with P rounded to bf16 (the eager bf16 reference rounds a too) and z by
//     ldmatrix.trans; fp32 z: 3xTF32 on mma.m16n8k8 for both.
//   attention warps (ceil(H / 2), heads 2w and 2w + 1 stacked): the rows of an m16 fragment are
//     (head 2w, query g) for g < 8 and (head 2w + 1, query g - 8) for g >= 8; each product is two
//     mma with the same A, one with each head's B, of which D keeps that head's rows (so no A
//     register holds a zero). S = Q K^T on mma.m16n8k8 3xTF32 (head dimension permuted: k-step
//     s, column u (+4) <-> d = 4u + 2s (+1), so a lane's K fragment is one 16-byte load; k's
//     TF32 parts split by the host), + bias + point weight x squared distance (direct, fp32) +
//     the mask term, online softmax in base 2 with conditional rescaling (kRescaleSlack), O += P
//     [v | v_pts] (5 n-tiles): the value points 3xTF32 in every dtype, v TF32 for bf16 z (rounded
//     by the host) and 3xTF32 for fp32; P and the rescale factors go to shared memory for the
//     pair warps.
// One barrier a tile: the pair warps write tile t + 1's bias and read tile t - 1's P while the
// attention warps read tile t's bias and write tile t's P (both double-buffered). z is staged by
// cp.async in 4 stages (t - 1 and t for the pair values, t + 1 for the bias, t + 2 in flight); k
// and v rows in 2 (host-padded to whole tiles, so a tile's rows are copied without bounds checks).
// Query points sit in shared memory: registers (128 a thread at 14 warps) are the limit.
//
// Deviations from the reference (none changes the function): linear_b's bias is dropped (constant
// per (h, i): the softmax cancels it); the mask adds m_i * inf * (m_j - 1) (the SPEC's
// inf * (m_i m_j - 1) less a shift uniform over a masked query row's keys, as the Triton kernels
// do); points are fp32, centred per batch element. Limits: OpenFold's sizes exactly (c_hidden 16,
// 4 query and 8 value points, c_z 128), 1 <= H <= 12. No split-K: a grid of ceil(N / 8) x B CTAs,
// one per SM, so N below ~1000 (B = 1) leaves SMs idle.
#include <math.h>

#include <algorithm>

#include "ipa_fused_common.cuh"

namespace ipa {
namespace {

namespace of {
constexpr int kC = 16, kP3 = 12, kWq = kC + kP3, kVP3 = 24, kWv = kC + kVP3, kCz = 128;
constexpr int kQT = 8, kBN = kOpenFoldKeyTile, kMmaHeads = 16;
constexpr int kPairWarps = kQT;
constexpr int kThreads = (kOpenFoldMaxHeads / 2 + kPairWarps) * 32;
// Registers: 128 a thread (__launch_bounds__(448, 1)). Not 65536 / 448 = 146: an SM's four
// sub-partitions hold 16 Ki registers each and take the warps in turn, so 14 warps place 4 on
// one of them (__maxnreg__(144) compiled, and the H100 refused the launch: too many resources).
constexpr int kTilePitch = kQT * kBN + 8;  // floats per head in a bias or P tile: 8 banks apart
constexpr int kVPitch = kWv + 4;           // rows 2u, 2u + 1 of a V fragment on distinct banks
constexpr int kZStages = 4, kKvStages = 2;
// The running maxima move only by more than 8 (base 2): most tiles' rescale factors are exactly 1,
// and the pair warps then skip the 64 multiplies of o_pair's rescaling (bf16 z).
constexpr int kRescaleSlack = 8;
// z rows padded by 16 bytes (bf16: ldmatrix rows on distinct banks; fp32: the pair values'
// scalar loads of (key u, channel g) on 32 banks); W_b's parts, padded likewise for ldmatrix.
template <typename ZT>
struct Pitch;
// k rows (kK floats): bf16 z [k hi | k lo | k points], q.k's 3xTF32 parts split by the host;
// fp32 z [k | k points], split in the kernel (the host's split does not fit: 12 KB more at H = 12).
template <>
struct Pitch<__nv_bfloat16> {
  static constexpr int kZ = kCz + 8, kW = kCz + 8, kK = 2 * kC + kP3;
};
template <>
struct Pitch<float> {
  static constexpr int kZ = kCz + 8, kW = kCz + 4, kK = kWq;
};
template <typename ZT>
constexpr int kKvHead = kBN * (Pitch<ZT>::kK + kVPitch);  // one head's k and v rows

template <typename ZT>
__host__ __device__ constexpr size_t smem_bytes(int H) {
  return 4ull * H * (4 * kTilePitch + 3 * kQT + kQT * kP3)          // bias, P, alpha, sums, q points
         + sizeof(ZT) * kZStages * kQT * kBN * Pitch<ZT>::kZ          // z rows
         + 4ull * kKvStages * H * kKvHead<ZT>                         // k and v rows
         + sizeof(ZT) * 2 * kMmaHeads * Pitch<ZT>::kW;                // W_b's hi and lo parts
}

// Warp w attends iff w / 4 < its scheduler's count, byte w % 4 of `attending` (openfold_roles);
// roles numbered in warp order. Sets warp (the attention index, else -1) and qq (the pair index,
// else -1).
__device__ __forceinline__ void assign_roles(int w, unsigned attending, int& warp, int& qq) {
  int n_att = 0;  // attention warps below w: on scheduler s, min(its count, warps below w there)
#pragma unroll
  for (int s = 0; s < 4; ++s)
    n_att += min(static_cast<int>((attending >> (8 * s)) & 0xffu), max(w - s + 3, 0) / 4);
  const bool attends = w / 4 < static_cast<int>((attending >> (8 * (w % 4))) & 0xffu);
  warp = attends ? n_att : -1;
  qq = attends ? -1 : w - n_att;
}

// sm_90's 227 KB of shared memory a block, at the most heads (CI compiles every source with nvcc)
static_assert(smem_bytes<float>(kOpenFoldMaxHeads) <= 227 * 1024, "fp32 shared memory");
static_assert(smem_bytes<__nv_bfloat16>(kOpenFoldMaxHeads) <= 227 * 1024, "bf16 shared memory");

// threadIdx.x read anew (volatile: what derives from it is recomputed after a loop rather than
// kept live across it).
__device__ __forceinline__ int fresh_tid() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
  return tid;
}

__device__ __forceinline__ int fresh_block() {  // blockIdx.x, likewise
  int block;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(block));
  return block;
}

// Named barrier 1 + p of the two pair warps 2p, 2p + 1 (barrier 0 is __syncthreads'); immediate
// ids, so that ptxas counts the five barriers used rather than all sixteen.
__device__ __forceinline__ void pair_barrier(int p) {
  switch (p) {
    case 0:
      asm volatile("bar.sync 1, 64;\n" ::: "memory");
      break;
    case 1:
      asm volatile("bar.sync 2, 64;\n" ::: "memory");
      break;
    case 2:
      asm volatile("bar.sync 3, 64;\n" ::: "memory");
      break;
    default:
      asm volatile("bar.sync 4, 64;\n" ::: "memory");
      break;
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float2 p) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(p.x, p.y);
  return *reinterpret_cast<const uint32_t*>(&h);
}
}  // namespace of

// kHalves (fp32 z, OpenFoldArgs::pair_halves): the pair warps work in pairs (2p, 2p + 1) on the
// bias. Warp 2p + e copies channel half e of both queries' z rows and computes both queries'
// partial biases over it, so each loads half of W_b's parts a tile (the thirty-second session's
// profile: every pair warp re-reading all of W_b, 16 KB a tile, was 48 % of the shared-memory
// wavefronts); a named barrier a pair then hands each warp its partner's partial for its own query.
template <typename ZT, bool kHalves>
__global__ void __launch_bounds__(of::kThreads, 1) ipa_openfold_kernel(const OpenFoldArgs a) {
  using namespace of;
  constexpr bool kBf16 = sizeof(ZT) == 2;
  static_assert(!(kBf16 && kHalves),
                "pair halves: fp32 z only (bf16 keeps W_b in registers' reach)");
  constexpr int kZPitch = Pitch<ZT>::kZ, kWPitch = Pitch<ZT>::kW;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int N = a.N, H = a.H;
  const int lane = threadIdx.x & 31;
  // role: attention warp `warp` (0 .. ceil(H / 2) - 1) or pair warp `qq` (0 .. kPairWarps - 1)
  int warp, qq;
  assign_roles(threadIdx.x >> 5, a.attending, warp, qq);
  const int g = lane >> 2, u = lane & 3;
  const int b = blockIdx.y, i0 = blockIdx.x * kQT;
  const int ntiles = (N + kBN - 1) / kBN;

  float* sb = reinterpret_cast<float*>(smem_raw);  // [2][H][kTilePitch] biases (head, query, key)
  float* sp = sb + 2 * H * kTilePitch;             // [2][H][kTilePitch] probabilities
  float* salpha = sp + 2 * H * kTilePitch;         // [2][H][kQT] the tile's rescale factors
  float* sl = salpha + 2 * H * kQT;                // [H][kQT] the rows' final sums
  float* sqp = sl + H * kQT;                       // [H][kQT][kP3] the query points
  ZT* zs = reinterpret_cast<ZT*>(sqp + H * kQT * kP3);  // [kZStages][kQT * kBN][kZPitch]
  float* kvs = reinterpret_cast<float*>(zs + kZStages * kQT * kBN * kZPitch);  // [stage][H][..]
  ZT* wsm = reinterpret_cast<ZT*>(kvs + kKvStages * H * kKvHead<ZT>);  // [hi, lo][16][kWPitch]

  // W_b's parts (heads >= H zero): bf16 hi + lo for bf16 z, TF32 hi + lo for fp32 z
  for (int idx = threadIdx.x; idx < kMmaHeads * kCz; idx += blockDim.x) {
    const int hd = idx / kCz, ch = idx % kCz;
    const float w = hd < H ? a.wb[hd * kCz + ch] : 0.f;
    if constexpr (kBf16) {
      const __nv_bfloat16 hi = __float2bfloat16_rn(w);
      wsm[hd * kWPitch + ch] = hi;
      wsm[(kMmaHeads + hd) * kWPitch + ch] = __float2bfloat16_rn(w - __bfloat162float(hi));
    } else {
      uint32_t hi, lo;
      split_tf32(w, hi, lo);
      wsm[hd * kWPitch + ch] = __uint_as_float(hi);
      wsm[(kMmaHeads + hd) * kWPitch + ch] = __uint_as_float(lo);
    }
  }
  __syncthreads();

  if (warp < 0) {  // ================= pair warps: warp <-> query i0 + qq =================
    const int qi = i0 + qq;
    const bool q_ok = qi < N;
    constexpr int kChunks = kCz * static_cast<int>(sizeof(ZT)) / 16;  // 16-byte chunks of a z row
    constexpr int kPerChunk = 16 / static_cast<int>(sizeof(ZT));
    // The z rows this warp copies (and alone reads in its bias): its own query's whole rows, or
    // with kHalves channel half `half` of both queries of its pair (first query `q_first`).
    constexpr int kCopyQueries = kHalves ? 2 : 1;
    constexpr int kCopyChunks = kHalves ? kChunks / 2 : kChunks;
    constexpr int kRowsPerPass = 32 / kCopyChunks;  // z rows one pass of the warp's copies covers
    const int half = qq & 1, q_first = kHalves ? qq - half : qq;
    // This lane's chunks of a tile: rows lane / kCopyChunks + kRowsPerPass m, column block
    // lane % kCopyChunks (of the half); source and shared offsets of m = 0 fixed for the walk.
    const int zr = lane / kCopyChunks;
    const int zc = (kHalves ? half * (kCz / 2) : 0) + (lane % kCopyChunks) * kPerChunk;
    // the first query's rows (its index clamped for the loads); the second's (kHalves) follow
    // at N * kCz, and are read only when that query is inside N (then the first is not clamped)
    const ZT* zsrc = static_cast<const ZT*>(a.z) +
                     (static_cast<size_t>(b) * N + min(i0 + q_first, N - 1)) * N * kCz + zr * kCz +
                     zc;
    auto stage_rows = [&](int t) { return zs + ((t % kZStages) * kQT * kBN + qq * kBN) * kZPitch; };
    auto issue_z = [&](int t) {  // the warp's z rows of tile t; one group, empty past the end
      if (t < ntiles) {
        const int j0 = t * kBN;
#pragma unroll
        for (int e = 0; e < kCopyQueries; ++e) {
          const bool copy_ok = i0 + q_first + e < N;
          const ZT* src = zsrc + (static_cast<size_t>(e) * N + j0) * kCz;
          ZT* dst = zs + ((t % kZStages) * kQT * kBN + (q_first + e) * kBN + zr) * kZPitch + zc;
          if (copy_ok && j0 + kBN <= N) {  // warp-uniform: every row there
#pragma unroll
            for (int m = 0; m < kBN / kRowsPerPass; ++m)
              cp_async16(dst + kRowsPerPass * m * kZPitch, src + kRowsPerPass * m * kCz, 16);
          } else {  // rows past N (and a query past N) zero-filled
#pragma unroll
            for (int m = 0; m < kBN / kRowsPerPass; ++m) {
              const bool ok = copy_ok && j0 + zr + kRowsPerPass * m < N;
              cp_async16(dst + kRowsPerPass * m * kZPitch, ok ? src + kRowsPerPass * m * kCz : a.z,
                         ok ? 16 : 0);
            }
          }
        }
      }
      cp_async_commit();
    };
    // ldmatrix addresses: z row (key) lane % 8, 16-byte column block lane / 8; W_b: head
    // (lane % 8) + 8 ((lane / 8) % 2), column block lane / 16 (A fragments, rows = heads)
    const int zoff = (lane & 7) * kZPitch + (lane >> 3) * kPerChunk;
    const ZT* wrow = wsm + ((lane & 7) + 8 * ((lane >> 3) & 1)) * kWPitch + (lane >> 4) * kPerChunk;
    // The biases of tile t into slot t & 1: D (head g | g + 8, key 2u, 2u + 1).
    auto bias_tile = [&](int t) {
      const ZT* zt = stage_rows(t) + zoff;
      float acc[4][4] = {};  // independent chains, summed at the end
      if constexpr (kBf16) {
#pragma unroll
        for (int kq = 0; kq < kCz / 32; ++kq) {
          uint32_t zb[4];  // B of k-steps 2 kq (zb[0], zb[1]) and 2 kq + 1 (zb[2], zb[3])
          ldmatrix_x4(zb, zt + 32 * kq);
#pragma unroll
          for (int s2 = 0; s2 < 2; ++s2) {
            uint32_t wh[4], wl[4];
            ldmatrix_x4(wh, wrow + 32 * kq + 16 * s2);
            ldmatrix_x4(wl, wrow + kMmaHeads * kWPitch + 32 * kq + 16 * s2);
            float(&d)[4] = acc[2 * (kq & 1) + s2];
            mma_bf16(d, wl[0], wl[1], wl[2], wl[3], zb[2 * s2], zb[2 * s2 + 1]);
            mma_bf16(d, wh[0], wh[1], wh[2], wh[3], zb[2 * s2], zb[2 * s2 + 1]);
          }
        }
      } else {
#pragma unroll 2
        for (int kq = 0; kq < kCz / 16; ++kq) {  // two k-steps of 8 channels
          uint32_t zb[4];
          ldmatrix_x4(zb, zt + 16 * kq);
#pragma unroll
          for (int s2 = 0; s2 < 2; ++s2) {
            uint32_t wh[4], wl[4];
            ldmatrix_x4(wh, wrow + 16 * kq + 8 * s2);
            ldmatrix_x4(wl, wrow + kMmaHeads * kWPitch + 16 * kq + 8 * s2);
            mma_f32<true>(acc[2 * (kq & 1) + s2], wh, wl, __uint_as_float(zb[2 * s2]),
                          __uint_as_float(zb[2 * s2 + 1]));
          }
        }
      }
      float* sbo = sb + (t & 1) * H * kTilePitch + qq * kBN + 2 * u;
      if (g < H)
        *reinterpret_cast<float2*>(sbo + g * kTilePitch) =
            make_float2(acc[0][0] + acc[1][0] + acc[2][0] + acc[3][0],
                        acc[0][1] + acc[1][1] + acc[2][1] + acc[3][1]);
      if (g + 8 < H)
        *reinterpret_cast<float2*>(sbo + (g + 8) * kTilePitch) =
            make_float2(acc[0][2] + acc[1][2] + acc[2][2] + acc[3][2],
                        acc[0][3] + acc[1][3] + acc[2][3] + acc[3][3]);
    };
    // kHalves: tile t's bias of this warp's query = its partial over this warp's channel half +
    // its partner's, handed over in the query's own bias slot (the partner stores there, a named
    // barrier a pair, this warp adds). The same 3xTF32 products as bias_tile's fp32 form; z's B
    // fragments one k-step and query at a time (ldmatrix.x2), for registers.
    auto bias_halves = [&](int t) {
      const ZT* zt = zs + ((t % kZStages) * kQT * kBN + q_first * kBN) * kZPitch + zoff;
      float acc[2][2][4] = {};  // [query of the pair][k-step parity]: independent chains
#pragma unroll
      for (int k = 0; k < kCz / 32; ++k) {
        const int kq = half * (kCz / 32) + k;  // 16 channels: two k-steps of 8
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2) {
          uint32_t wh[4], wl[4];
          ldmatrix_x4(wh, wrow + 16 * kq + 8 * s2);
          ldmatrix_x4(wl, wrow + kMmaHeads * kWPitch + 16 * kq + 8 * s2);
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            uint32_t zb[2];
            ldmatrix_x2(zb, zt + e * kBN * kZPitch + 16 * kq + 8 * s2);
            mma_f32<true>(acc[e][s2], wh, wl, __uint_as_float(zb[0]), __uint_as_float(zb[1]));
          }
        }
      }
      float own[4], other[4];  // selects, not a register array indexed at run time
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float p0 = acc[0][0][r] + acc[0][1][r], p1 = acc[1][0][r] + acc[1][1][r];
        own[r] = half ? p1 : p0;
        other[r] = half ? p0 : p1;
      }
      float* slot = sb + (t & 1) * H * kTilePitch + 2 * u;
      float* theirs = slot + (qq ^ 1) * kBN;  // the partner's query: this warp's partial of it
      if (g < H)
        *reinterpret_cast<float2*>(theirs + g * kTilePitch) = make_float2(other[0], other[1]);
      if (g + 8 < H)
        *reinterpret_cast<float2*>(theirs + (g + 8) * kTilePitch) = make_float2(other[2], other[3]);
      pair_barrier(qq >> 1);
      float* mine = slot + qq * kBN;
      if (g < H) {
        float2* p = reinterpret_cast<float2*>(mine + g * kTilePitch);
        const float2 o = *p;
        *p = make_float2(own[0] + o.x, own[1] + o.y);
      }
      if (g + 8 < H) {
        float2* p = reinterpret_cast<float2*>(mine + (g + 8) * kTilePitch);
        const float2 o = *p;
        *p = make_float2(own[2] + o.x, own[3] + o.y);
      }
    };
    float op[kCz / 8][4];  // o_pair: (head g | g + 8, channel 8 n + 2u (+1))
#pragma unroll
    for (int n = 0; n < kCz / 8; ++n) op[n][0] = op[n][1] = op[n][2] = op[n][3] = 0.f;
    // The pair values of tile t: op = alpha op + P z, P from slot t & 1 (zero for heads >= H).
    auto pair_values = [&](int t) {
      const float* ps = sp + (t & 1) * H * kTilePitch + qq * kBN;
      const float* al = salpha + (t & 1) * H * kQT + qq;
      const float alpha0 = g < H ? al[g * kQT] : 1.f, alpha1 = g + 8 < H ? al[(g + 8) * kQT] : 1.f;
      const ZT* zt = stage_rows(t);
      if constexpr (kBf16) {
        // A: P (head g | g + 8, keys 2u, 2u + 1) as bf16 pairs; B: z (keys 2u, 2u + 1, channel
        // 8 n + g) by ldmatrix.trans, four n-tiles a load
        const float2 zero = make_float2(0.f, 0.f);
        const uint32_t a0 = pack_bf16(g < H ? *reinterpret_cast<const float2*>(ps + g * kTilePitch + 2 * u) : zero);
        const uint32_t a1 =
            pack_bf16(g + 8 < H ? *reinterpret_cast<const float2*>(ps + (g + 8) * kTilePitch + 2 * u) : zero);
        if (__any_sync(0xffffffffu, alpha0 != 1.f || alpha1 != 1.f)) {  // warp-uniform, rare
#pragma unroll
          for (int n = 0; n < kCz / 8; ++n) {
            op[n][0] *= alpha0;
            op[n][1] *= alpha0;
            op[n][2] *= alpha1;
            op[n][3] *= alpha1;
          }
        }
#pragma unroll
        for (int j = 0; j < kCz / 32; ++j) {
          uint32_t zb[4];
          ldmatrix_x4_trans(zb, zt + zoff + 32 * j);
#pragma unroll
          for (int m = 0; m < 4; ++m) mma_bf16_k8(op[4 * j + m], a0, a1, zb[m]);
        }
      } else {
        // A: P (head g | g + 8, key u | u + 4), split; B: z (key u | u + 4, channel 8 n + g)
        const float pv[4] = {g < H ? ps[g * kTilePitch + u] : 0.f,
                             g + 8 < H ? ps[(g + 8) * kTilePitch + u] : 0.f,
                             g < H ? ps[g * kTilePitch + u + 4] : 0.f,
                             g + 8 < H ? ps[(g + 8) * kTilePitch + u + 4] : 0.f};
        uint32_t ah[4], alo[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) split_tf32(pv[r], ah[r], alo[r]);
        const ZT* z0 = zt + u * kZPitch + g;
#pragma unroll
        for (int n = 0; n < kCz / 8; ++n) {  // fresh, then op alpha + P z (round to nearest)
          float pz[4];
          mma_f32<true, true>(pz, ah, alo, z0[8 * n], z0[4 * kZPitch + 8 * n]);
          op[n][0] = fmaf(op[n][0], alpha0, pz[0]);
          op[n][1] = fmaf(op[n][1], alpha0, pz[1]);
          op[n][2] = fmaf(op[n][2], alpha1, pz[2]);
          op[n][3] = fmaf(op[n][3], alpha1, pz[3]);
        }
      }
    };

    if constexpr (kHalves) {
      // A stage is refilled only after a CTA barrier: its rows are read by both warps of a pair
      // (the bias by halves, the pair values by query). Tile t + 2 is issued as iteration t
      // begins, past the barrier that ended tile t - 2's pair values (a tile's work, ~5 us at
      // N = 2048, is far longer than the copy's latency).
      issue_z(0);
      issue_z(1);
      cp_async_wait<1>();
      __syncwarp();
      bias_halves(0);
      __syncthreads();  // bias tile 0 published
#pragma unroll 1
      for (int t = 0; t <= ntiles; ++t) {
        issue_z(t + 2);  // stage (t + 2) % 4 = (t - 2) % 4
        if (t + 1 < ntiles) {
          cp_async_wait<1>();  // tile t + 1 landed (this thread's copies) ...
          __syncwarp();        // ... and the warp's: each warp's bias reads only its own copies
          bias_halves(t + 1);
        }
        if (t >= 1) pair_values(t - 1);
        __syncthreads();  // bias t + 1 published and P t read; after the last, the row sums written
      }
    } else {
      issue_z(0);
      issue_z(1);
      issue_z(2);
      cp_async_wait<2>();
      __syncwarp();
      bias_tile(0);
      __syncthreads();  // bias tile 0 published
#pragma unroll 1
      for (int t = 0; t <= ntiles; ++t) {
        if (t + 1 < ntiles) {
          cp_async_wait<1>();  // tile t + 1 landed (this thread's copies) ...
          __syncwarp();        // ... and the warp's: each warp reads only its own query's rows
          bias_tile(t + 1);
        }
        if (t >= 1) pair_values(t - 1);
        __syncwarp();     // tile t - 1's stage is read: refill it
        issue_z(t + 3);   // stage (t + 3) % 4 = (t - 1) % 4
        __syncthreads();  // bias t + 1 published and P t read; after the last, the row sums written
      }
    }
    cp_async_wait<0>();
    if (!q_ok) return;
    const float l0 = g < H ? sl[g * kQT + qq] : 1.f, l1 = g + 8 < H ? sl[(g + 8) * kQT + qq] : 1.f;
    const float inv0 = 1.f / l0, inv1 = 1.f / l1;
    float* orow = a.cat + (static_cast<size_t>(b) * N + qi) * a.cat_pitch + a.pair_offset + 2 * u;
#pragma unroll
    for (int n = 0; n < kCz / 8; ++n) {
      if (g < H)
        *reinterpret_cast<float2*>(orow + g * kCz + 8 * n) = make_float2(op[n][0] * inv0, op[n][1] * inv0);
      if (g + 8 < H)
        *reinterpret_cast<float2*>(orow + (g + 8) * kCz + 8 * n) =
            make_float2(op[n][2] * inv1, op[n][3] * inv1);
    }
    return;
  }

  // ============ attention warps: rows g <-> (head ha, query g), g + 8 <-> (head hb, query g) ============
  int ha = 2 * warp, hb = 2 * warp + 1;
  const bool hb_ok = hb < H;
  const int hbx = hb_ok ? hb : ha;  // an odd H's last warp reads head ha's rows for hb (A rows zero)
  // The k/v copies. The host pads k and v to n_pad = 8 ntiles rows (zeros), so a tile's 8 rows
  // of one head are contiguous in global memory and land as they are: k 88 16-byte chunks (bf16
  // z) or 56 (fp32), v 88; this lane copies chunks lane, lane + 32 and lane + 64 of each where
  // they exist (below lane 24 for the last). Offsets in floats (openfold_launch takes
  // B H n_pad kVPitch < 2^31).
  constexpr int kWk = Pitch<ZT>::kK, kHead = kKvHead<ZT>;
  constexpr int kKChunks = kBN * kWk / 4;
  static_assert(kBN * kVPitch / 4 == 88 && (kKChunks == 88 || kKChunks == 56), "the copies below");
  const bool tail_lane = lane < 24;
  const int n_pad = ntiles * kBN;
  const int krows = (b * H + ha) * n_pad * kWk + 4 * lane, vrows = (b * H + ha) * n_pad * kVPitch + 4 * lane;
  auto issue_kv = [&](int t) {  // tile t's k and v rows of heads ha and hb into stage t % 2
    if (t < ntiles) {
      float* stage = kvs + (t % kKvStages) * H * kHead + ha * kHead + 4 * lane;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (e && !hb_ok) break;
        const float* kg = a.k + krows + (e * n_pad + t * kBN) * kWk;
        const float* vg = a.v + vrows + (e * n_pad + t * kBN) * kVPitch;
        float* ks = stage + e * kHead;
        float* vs = ks + kBN * kWk;
        cp_async16(ks, kg, 16);
        cp_async16(vs, vg, 16);
        cp_async16(vs + 128, vg + 128, 16);
        if (kKChunks > 64 || tail_lane) cp_async16(ks + 128, kg + 128, 16);
        if (tail_lane) {
          if constexpr (kKChunks > 64) cp_async16(ks + 256, kg + 256, 16);
          cp_async16(vs + 256, vg + 256, 16);
        }
      }
    }
    cp_async_commit();
  };
  issue_kv(0);
  issue_kv(1);

  const int iq = min(i0 + g, N - 1);  // this lane's query (clamped for the loads)
  // Q's A fragments, [part][k-step s]: rows g = (head ha, query g), g + 8 = (head hb, query g);
  // column u <-> d = 4u + 2s, u + 4 <-> 4u + 2s + 1. Each product with K is two mma, one with head
  // ha's keys (rows g of D kept) and one with hb's (rows g + 8 kept): half of each D is discarded
  // rather than half of each A zero, so no register holds a zero. Hi and lo parts: q.k is 3xTF32
  // for both z dtypes (cuda-fused's af2 kernel measured 8x the error with q and k rounded to TF32).
  uint32_t qf[2][2][4];
  // the query points of both rows, to shared memory (registers are this kernel's limit)
  const float* sqa = sqp + (ha * kQT + g) * kP3;
  const float* sqb = sqp + (hbx * kQT + g) * kP3;
  {
    const float* ra = a.q + ((static_cast<size_t>(b) * H + ha) * N + iq) * kWq;
    const float* rb = a.q + ((static_cast<size_t>(b) * H + hbx) * N + iq) * kWq;
    const float4 fa = ld_global4(ra + 4 * u), fb = ld_global4(rb + 4 * u);
    const float xa[4] = {fa.x * a.q_scale, fa.y * a.q_scale, fa.z * a.q_scale, fa.w * a.q_scale};
    const float xb[4] = {fb.x * a.q_scale, fb.y * a.q_scale, fb.z * a.q_scale, fb.w * a.q_scale};
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {  // c: column u (d = 4u + 2s) or u + 4 (d + 1)
        split_tf32(xa[2 * s + c], qf[0][s][2 * c], qf[1][s][2 * c]);
        split_tf32(hb_ok ? xb[2 * s + c] : 0.f, qf[0][s][2 * c + 1], qf[1][s][2 * c + 1]);
      }
    }
    if (u < kP3 / 4) {
      *reinterpret_cast<float4*>(const_cast<float*>(sqa) + 4 * u) = ld_global4(ra + kC + 4 * u);
      if (hb_ok) *reinterpret_cast<float4*>(const_cast<float*>(sqb) + 4 * u) = ld_global4(rb + kC + 4 * u);
    }
    __syncwarp();  // each warp reads only its own heads' points
  }
  const float pwa = a.pw[ha], pwb = a.pw[hbx];
  const float* mask_b = a.mask + static_cast<size_t>(b) * N;
  const float mi_inf = mask_b[iq] * a.inf2;  // m_i * inf (base 2): the key mask's factor
  float acc[kWv / 8][4];  // O: (row g | g + 8, column 8 n + 2u (+1)) of [v | v_pts]
#pragma unroll
  for (int n = 0; n < kWv / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g, g + 8; l: this lane's keys
  __syncthreads();  // bias tile 0 published

#pragma unroll 1
  for (int t = 0; t < ntiles; ++t) {
    const int j0 = t * kBN;
    cp_async_wait<kKvStages - 1>();
    __syncwarp();
    const float* ksa = kvs + ((t % kKvStages) * H + ha) * kHead;
    const float* ksb = kvs + ((t % kKvStages) * H + hbx) * kHead;
    const float* kpa = ksa + kWk - kP3;  // the k points: the last 12 of each row
    const float* kpb = ksb + kWk - kP3;
    const float* vsa = ksa + kBN * kWk;
    const float* vsb = ksb + kBN * kWk;
    // S = Q K^T: s[0], s[1] = (ha, g, keys 2u, 2u + 1); s[2], s[3] = (hb, g, keys 2u, 2u + 1)
    float s[4];
    {
      float da[4], db[4];  // Q K_ha^T, Q K_hb^T
      if constexpr (kBf16) {  // k's parts from the host
        const uint4 kha = ld_shared_u4(ksa + g * kWk + 4 * u), kla = ld_shared_u4(ksa + g * kWk + kC + 4 * u);
        const uint4 khb = ld_shared_u4(ksb + g * kWk + 4 * u), klb = ld_shared_u4(ksb + g * kWk + kC + 4 * u);
        mma_3xtf32<true>(da, qf[0][0], qf[1][0], kha.x, kha.y, kla.x, kla.y);
        mma_3xtf32<true>(db, qf[0][0], qf[1][0], khb.x, khb.y, klb.x, klb.y);
        mma_3xtf32(da, qf[0][1], qf[1][1], kha.z, kha.w, kla.z, kla.w);
        mma_3xtf32(db, qf[0][1], qf[1][1], khb.z, khb.w, klb.z, klb.w);
      } else {  // split here, one k-step at a time (registers)
        const float4 ka = ld_shared4(ksa + g * kWk + 4 * u), kb = ld_shared4(ksb + g * kWk + 4 * u);
        mma_f32<true, true>(da, qf[0][0], qf[1][0], ka.x, ka.y);
        mma_f32<true, true>(db, qf[0][0], qf[1][0], kb.x, kb.y);
        mma_f32<true>(da, qf[0][1], qf[1][1], ka.z, ka.w);
        mma_f32<true>(db, qf[0][1], qf[1][1], kb.z, kb.w);
      }
      s[0] = da[0], s[1] = da[1], s[2] = db[2], s[3] = db[3];
    }
    {
      float dist[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int c = 0; c < kP3 / 4; ++c) {
        const float4 qa4 = ld_shared4(sqa + 4 * c), qb4 = ld_shared4(sqb + 4 * c);
        const float pa[4] = {qa4.x, qa4.y, qa4.z, qa4.w}, pb[4] = {qb4.x, qb4.y, qb4.z, qb4.w};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float4 ka = ld_shared4(kpa + (2 * u + e) * kWk + 4 * c);
          const float4 kb = ld_shared4(kpb + (2 * u + e) * kWk + 4 * c);
          const float ca[4] = {ka.x, ka.y, ka.z, ka.w}, cb[4] = {kb.x, kb.y, kb.z, kb.w};
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            const float da = pa[x] - ca[x], db = pb[x] - cb[x];
            dist[e] = fmaf(da, da, dist[e]);
            dist[2 + e] = fmaf(db, db, dist[2 + e]);
          }
        }
      }
      const float* sbt = sb + (t & 1) * H * kTilePitch + g * kBN + 2 * u;
      const float2 ba = *reinterpret_cast<const float2*>(sbt + ha * kTilePitch);
      const float2 bb = hb_ok ? *reinterpret_cast<const float2*>(sbt + hb * kTilePitch) : make_float2(0.f, 0.f);
      const bool ok0 = j0 + 2 * u < N, ok1 = j0 + 2 * u + 1 < N;
      const float mt0 = ok0 ? mi_inf * (mask_b[j0 + 2 * u] - 1.f) : 0.f;
      const float mt1 = ok1 ? mi_inf * (mask_b[j0 + 2 * u + 1] - 1.f) : 0.f;
      s[0] = ok0 ? ba.x + mt0 + fmaf(pwa, dist[0], s[0]) : -INFINITY;
      s[1] = ok1 ? ba.y + mt1 + fmaf(pwa, dist[1], s[1]) : -INFINITY;
      s[2] = ok0 ? bb.x + mt0 + fmaf(pwb, dist[2], s[2]) : -INFINITY;
      s[3] = ok1 ? bb.y + mt1 + fmaf(pwb, dist[3], s[3]) : -INFINITY;
    }
    // online softmax; P's A fragment: p = (ha, 2u), (hb, 2u), (ha, 2u + 1), (hb, 2u + 1), as hi
    // and lo parts (bf16 z's v columns take the hi part alone).
    float alpha0, alpha1, p[4];
    online_softmax_step<kRescaleSlack>(s, m0, m1, alpha0, alpha1, p);
    uint32_t pf[2][4];  // P's A fragment [part], rows as Q's: two mma a product, as for S
#pragma unroll
    for (int r = 0; r < 4; ++r) split_tf32(p[r], pf[0][r], pf[1][r]);
    l0 = fmaf(l0, alpha0, p[0] + p[2]);
    l1 = fmaf(l1, alpha1, p[1] + p[3]);
    // P and the rescale factors for the pair warps (slot t & 1)
    {
      float* pst = sp + (t & 1) * H * kTilePitch + g * kBN + 2 * u;
      *reinterpret_cast<float2*>(pst + ha * kTilePitch) = make_float2(p[0], p[2]);
      if (hb_ok) *reinterpret_cast<float2*>(pst + hb * kTilePitch) = make_float2(p[1], p[3]);
      if (u == 0) {
        float* al = salpha + (t & 1) * H * kQT + g;
        al[ha * kQT] = alpha0;
        if (hb_ok) al[hb * kQT] = alpha1;
      }
    }
    // O += P [v | v_pts]: B = V (key 2u | 2u + 1, column 8 n + g), one mma per head
    const float* va = vsa + 2 * u * kVPitch + g;
    const float* vb = vsb + 2 * u * kVPitch + g;
#pragma unroll
    for (int n = 0; n < kWv / 8; ++n) {  // the tile's P V fresh, then acc alpha + P V (round to nearest)
      float pva[4], pvb[4];
      if (kBf16 && n < kC / 8) {  // bf16 z, the v columns: TF32, v rounded by the host
        mma_tf32_fresh(pva, pf[0][0], pf[0][1], pf[0][2], pf[0][3], __float_as_uint(va[8 * n]),
                       __float_as_uint(va[kVPitch + 8 * n]));
        mma_tf32_fresh(pvb, pf[0][0], pf[0][1], pf[0][2], pf[0][3], __float_as_uint(vb[8 * n]),
                       __float_as_uint(vb[kVPitch + 8 * n]));
      } else {  // the value points (every dtype) and fp32 z's v columns: 3xTF32
        mma_f32<true, true>(pva, pf[0], pf[1], va[8 * n], va[kVPitch + 8 * n]);
        mma_f32<true, true>(pvb, pf[0], pf[1], vb[8 * n], vb[kVPitch + 8 * n]);
      }
      acc[n][0] = fmaf(acc[n][0], alpha0, pva[0]);
      acc[n][1] = fmaf(acc[n][1], alpha0, pva[1]);
      acc[n][2] = fmaf(acc[n][2], alpha1, pvb[2]);
      acc[n][3] = fmaf(acc[n][3], alpha1, pvb[3]);
    }
    __syncwarp();  // every lane is done with this stage's k/v rows before they are refilled
    issue_kv(t + kKvStages);
    __syncthreads();  // this bias slot read, P published; the next tile's bias published
  }
  cp_async_wait<0>();
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  // The tail's indices: with kHalves, recomputed from threadIdx and blockIdx (kept live across the
  // walk at 128 registers, they spilled in that instance).
  int i = i0 + g;
  float* sl_t = sl;
  if constexpr (kHalves) {
    int warp_t, qq_t;
    const int tid = fresh_tid();
    assign_roles(tid >> 5, a.attending, warp_t, qq_t);
    ha = 2 * warp_t;
    hb = ha + 1;
    i = fresh_block() * kQT + ((tid & 31) >> 2);
    sl_t = reinterpret_cast<float*>(smem_raw) + 4 * H * kTilePitch + 2 * H * kQT;
  }
  if (u == 0) {
    sl_t[ha * kQT + g] = l0;
    if (hb_ok) sl_t[hb * kQT + g] = l1;
  }
  __syncthreads();  // the row sums published (the pair warps' last step)
  if (i >= N) return;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (half && !hb_ok) break;
    const int h = half ? hb : ha;
    const float inv = 1.f / (half ? l1 : l0);
    float* orow = a.cat + (static_cast<size_t>(b) * N + i) * a.cat_pitch + h * kC + 2 * u;
    float* prow = a.o_pt + ((static_cast<size_t>(b) * N + i) * H + h) * kVP3 + 2 * u;
#pragma unroll
    for (int n = 0; n < kWv / 8; ++n) {
      const float2 o = make_float2(acc[n][2 * half] * inv, acc[n][2 * half + 1] * inv);
      if (n < kC / 8)
        *reinterpret_cast<float2*>(orow + 8 * n) = o;
      else
        *reinterpret_cast<float2*>(prow + 8 * (n - kC / 8)) = o;
    }
  }
}

}  // namespace

bool openfold_fits(int H, int c_hidden, int qk_points, int v_points, int c_z) {
  return H >= 1 && H <= kOpenFoldMaxHeads && c_hidden == of::kC && 3 * qk_points == of::kP3 &&
         3 * v_points == of::kVP3 && c_z == of::kCz;
}

size_t openfold_smem_bytes(int H, bool z_bf16) {
  return z_bf16 ? of::smem_bytes<__nv_bfloat16>(H) : of::smem_bytes<float>(H);
}

// The warps' roles (OpenFoldArgs::attending). An SM's four sub-partitions (schedulers) take a
// CTA's warps by index mod 4, and the kernel is issue-bound on its busiest one, so with `balanced`
// the attention warps are dealt to even out the schedulers' instructions a tile: of every split of
// them over the schedulers, the one whose busiest scheduler has the fewest (ties: the first found),
// counting the SASS instructions a tile of each role (thirty-first session: attention 507 bf16 /
// 563 fp32, pair ~255 / ~815). Otherwise warps 0 .. ceil(H / 2) - 1 attend. Returns the attention
// warps on each scheduler s in byte s (OpenFoldArgs::attending).
unsigned openfold_roles(int H, bool z_bf16, bool balanced) {
  const int att = (H + 1) / 2, total = att + of::kPairWarps;
  int slots[4], attending[4];
  for (int s = 0; s < 4; ++s) {
    slots[s] = (total - s + 3) / 4;
    attending[s] = (att - s + 3) / 4;  // in order
  }
  if (balanced) {
    const long att_cost = z_bf16 ? 507 : 563, pair_cost = z_bf16 ? 255 : 815;
    long best = -1;
    for (int a0 = 0; a0 <= slots[0]; ++a0)
      for (int a1 = 0; a1 <= slots[1]; ++a1)
        for (int a2 = 0; a2 <= slots[2]; ++a2) {
          const int a3 = att - a0 - a1 - a2;
          if (a3 < 0 || a3 > slots[3]) continue;
          const int split[4] = {a0, a1, a2, a3};
          long busiest = 0;
          for (int s = 0; s < 4; ++s)
            busiest = std::max(busiest, split[s] * att_cost + (slots[s] - split[s]) * pair_cost);
          if (best < 0 || busiest < best) {
            best = busiest;
            for (int s = 0; s < 4; ++s) attending[s] = split[s];
          }
        }
  }
  unsigned packed = 0;
  for (int s = 0; s < 4; ++s) packed |= static_cast<unsigned>(attending[s]) << (8 * s);
  return packed;
}

cudaError_t openfold_launch(const OpenFoldArgs& a, bool z_bf16, cudaStream_t stream) {
  const long long n_pad = (a.N + of::kBN - 1) / of::kBN * of::kBN;
  if (a.B < 1 || a.B > 65535 || a.N < 1 || a.H < 1 || a.H > kOpenFoldMaxHeads ||
      a.B * a.H * n_pad * of::kVPitch >= (1ll << 31))
    return cudaErrorInvalidValue;
  if (z_bf16 && a.pair_halves) return cudaErrorInvalidValue;
  const auto kern = z_bf16          ? ipa_openfold_kernel<__nv_bfloat16, false>
                    : a.pair_halves ? ipa_openfold_kernel<float, true>
                                    : ipa_openfold_kernel<float, false>;
  const size_t smem = openfold_smem_bytes(a.H, z_bf16);
  cudaError_t err =
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid((a.N + of::kQT - 1) / of::kQT, a.B);
  const int threads = ((a.H + 1) / 2 + of::kPairWarps) * 32;
  kern<<<grid, threads, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ipa
