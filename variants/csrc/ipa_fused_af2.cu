// cuda-fused, kernel class `af2`: AlphaFold2's sizes exactly, every width a compile-time constant.
// The dispatch, the split-K combine and the design shared with the other classes: ipa_fused.cu.
//
// Same CTA and tile as the small class (ipa_fused_small_generic.cu: 16 queries x all H heads,
// BN = H/2 keys, z and the head's k/v rows staged by cp.async two tiles ahead, one barrier per
// tile), but the work is mapped so that no lane computes a partial result another lane must
// finish (v1's profile: 334 warp-instructions per (query, key) pair, only 29 % of them FFMA;
// predicated-off chunks, run-time loop bounds, the reduce-scatter of partial biases and per-key
// shuffles made up the rest):
//   bias      lane (p, s, g) computes heads 3g .. 3g+2 of the warp's pairs p and p + 4 over half
//             of the channels (chunks s, s+2, ...): two 16-byte z reads and three weight reads
//             (row pitches padded so that the reads of a quarter-warp hit distinct banks) per
//             24 FFMA, then one shuffle per bias joins the two channel halves;
//   logits    lane (r, t) = (lane / 2, lane % 2) holds the full query row r (q and its points)
//             and scores keys t, t+2, t+4 of the tile: whole dot products, no shuffles;
//   softmax   one shuffle for the row maximum, three to share the probabilities;
//   values    lane (r, t) accumulates half t of [v | value points] over all keys of the tile.
// With a tensor-core bias (kBias, FusedBias of ipa_kernels.h, from `cuda_fused.BF16_BIAS` and
// `FP32_BIAS`) the bias is mma.sync work instead (issue #17), with W_b (fp32 here: the scaled
// weights) as two parts, hi + lo (bf16, or TF32 for fp32 z), from a copy in shared memory laid
// out [head][channel] with a pitch that spreads a fragment's loads over all 32 banks, and fp32
// accumulation:
//   kMmaPairRows  a warp's 8 pairs are rows 0-7 of A (rows 8-15 zero), W_b^T (heads padded to
//                 16, two n-tiles of 8) is B: 8 k-steps x 2 n-tiles x 2 parts = 32 mma per warp
//                 and tile in place of ~400 FFMA per lane; lane (g, u) = (lane / 4, lane % 4)
//                 ends with pair g's biases for heads 8 n + 2 u and 8 n + 2 u + 1;
//   kMmaHeadRows  W_b's 16 padded heads are A's rows and the 8 pairs B's columns (z^T): no zero
//                 rows, 16 mma per warp and tile; lane (g, u) ends with heads g and g + 8 of
//                 pairs 2 u and 2 u + 1. For fp32 z, 3xTF32 (m16n8k8; z split in registers):
//                 48 mma per warp and tile.
// Measured (H100, replayed, 2026-12-06): bf16 N = 4096 FFMA 4.36 ms, pair rows 4.16, head rows
// 3.98 (bf16's default); fp32 3xTF32 5.41 against FFMA's 5.25 (fp32 keeps FFMA).
#include <math.h>

#include "ipa_fused_common.cuh"

namespace ipa {
namespace {

namespace af2 {
constexpr int kD = 32, kPts = 12, kWq = kD + kPts, kWv = 56, kC = 128;  // widths (floats)
constexpr int kQT = 16;         // queries per CTA
constexpr int kHMax = 12;       // heads = warps
constexpr int kKeysPerLane = 3;  // BN = H / 2 <= 6 keys per tile, two lanes per query row
constexpr int kWPitch = kC + 4;  // pair-bias weight rows in shared memory (floats)
template <typename ZT>
__host__ __device__ constexpr int z_pitch() {  // staged z rows (elements): 32 bytes of padding,
  return kC + 32 / static_cast<int>(sizeof(ZT));      // rows 2 bank groups apart (see the bias)
}
// A tensor-core bias: the hi and lo parts of W_b (bf16, or fp32 holding TF32 values), each
// [kMmaHeads][mma_pitch], and the staged z rows at the same pitch. A fragment's lane (g, u) reads
// word 4 g + u (mod 32) of its k-step: rows of kC + 16 bytes (68 words bf16, 132 fp32).
constexpr int kMmaHeads = 16;
template <typename ZT>
__host__ __device__ constexpr int mma_pitch() {
  return kC + 16 / static_cast<int>(sizeof(ZT));
}
// The staged z rows' pitch: the FFMA bias's, or for the tensor-core fragments W_b's (the FFMA
// pitch, 72 words in bf16, would pair the fragment rows g and g + 4 on the same banks).
template <typename ZT>
__host__ __device__ constexpr int staged_z_pitch(bool mma_bias) {
  return mma_bias ? mma_pitch<ZT>() : z_pitch<ZT>();
}
}  // namespace af2

// kBias: the pair bias's form, kFfmaBias or a tensor-core one (kMmaPairRows, kMmaHeadRows).
template <typename ZT, int kBias>
__global__ void __launch_bounds__(af2::kHMax * 32, 1) ipa_fused_af2_kernel(const FusedArgs a) {
  constexpr bool kMmaBias = kBias != kFfmaBias;
  static_assert(kBias != kMmaPairRows || sizeof(ZT) == 2, "the pair-rows form takes bf16 z");
  using namespace af2;
  constexpr int CH = ZChunk<ZT>::kChannels;  // z channels per 16-byte chunk
  constexpr int NCH = kC / CH;               // chunks per z row
  constexpr int ZP = staged_z_pitch<ZT>(kMmaBias);
  constexpr int RPI = 32 / NCH;              // z rows per warp-wide copy
  extern __shared__ __align__(16) unsigned char smem_raw[];

  const int N = a.N, H = a.H;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.z, split = blockIdx.y;
  const int i0 = blockIdx.x * kQT;
  const int BN = H / 2, BNP = BN | 1;
  const int ntiles_all = (N + BN - 1) / BN;
  const int tile_begin = split * a.tiles_per_split;
  const int ntiles = max(0, min(ntiles_all, tile_begin + a.tiles_per_split) - tile_begin);

  float* wb_s = reinterpret_cast<float*>(smem_raw);  // [kHMax][kWPitch], FFMA bias only
  float* sb = wb_s + (kMmaBias ? 0 : kHMax * kWPitch);               // [2][H][kQT][BNP]
  ZT* zw = reinterpret_cast<ZT*>(sb + 2 * H * kQT * BNP) + warp * 2 * 8 * ZP;  // [2][8][ZP]
  float* kvb = reinterpret_cast<float*>(reinterpret_cast<ZT*>(sb + 2 * H * kQT * BNP) +
                                        H * 2 * 8 * ZP);
  float* kvw = kvb + warp * 2 * BN * (kWq + kWv);                     // [2][BN][kWq + kWv]
  // kMmaBias: W_b's parts after the k/v rows, [2][kMmaHeads][ZP] (hi, then lo)
  ZT* wmma_s = reinterpret_cast<ZT*>(kvb + H * 2 * BN * (kWq + kWv));
  const ZT* zg = static_cast<const ZT*>(a.z);
  const size_t head_row0 = (static_cast<size_t>(b) * H + warp) * N;  // warp <-> head

  // Stage tile `tile` into `slot`: the warp's 8 z rows and its head's BN k and v rows (rows past
  // N are zero-filled: finite logits that are masked, zero values). One commit group.
  // Pair p of the warp's 8 in a tile: query wq0 + p, key warp / 2 (query-major pair order).
  // Each lane's copies are fixed for the whole walk (row lane / NCH + RPI * n, chunk lane % NCH),
  // so a tile costs one address step and one cp.async per row (v3's first profile: the copy
  // address arithmetic was a fifth of all instructions).
  const int wq0 = i0 + (warp & 1) * 8, wkey = warp >> 1;
  const int zrows = max(0, min(8, N - wq0));  // the warp's query rows inside N
  const ZT* zsrc0 = zg + ((static_cast<size_t>(b) * N + wq0 + lane / NCH) * N) * kC +
                    (lane % NCH) * CH;
  const size_t zstep = static_cast<size_t>(RPI) * N * kC;
  ZT* zdst0 = zw + (lane / NCH) * ZP + (lane % NCH) * CH;
  static_assert(2 * kKeysPerLane * (kWq / 4) <= 96 && 2 * kKeysPerLane * (kWv / 4) <= 96,
                "k/v rows of a tile: at most three 16-byte chunks per lane");
  auto issue = [&](int tile, int slot) {
    const int j0 = tile * BN;
    const int jj = j0 + wkey;
    const ZT* src = zsrc0 + static_cast<size_t>(jj) * kC;
    ZT* dst = zdst0 + slot * 8 * ZP;
#pragma unroll
    for (int e0 = 0; e0 < 8; e0 += RPI) {
      const bool ok = jj < N && e0 + lane / NCH < zrows;
      cp_async16(dst + e0 * ZP, ok ? src : zg, ok ? 16 : 0);
      src += zstep;
    }
    const int nk = min(BN, N - j0);
    float* kd = kvw + slot * BN * (kWq + kWv);
    float* vd = kd + BN * kWq;
    const float* ks = a.k + (head_row0 + j0) * kWq;
    const float* vs = a.v + (head_row0 + j0) * kWv;
#pragma unroll
    for (int m3 = 0; m3 < 3; ++m3) {
      const int c = lane + 32 * m3;
      if (c < BN * (kWq / 4)) {
        const bool ok = c < nk * (kWq / 4);
        cp_async16(kd + 4 * c, ok ? ks + 4 * c : ks, ok ? 16 : 0);
      }
      if (c < BN * (kWv / 4)) {
        const bool ok = c < nk * (kWv / 4);
        cp_async16(vd + 4 * c, ok ? vs + 4 * c : vs, ok ? 16 : 0);
      }
    }
    cp_async_commit();
  };

  if (ntiles > 0) issue(tile_begin, 0); else cp_async_commit();
  if (ntiles > 1) issue(tile_begin + 1, 1); else cp_async_commit();
  if constexpr (kMmaBias) {
    for (int idx = threadIdx.x; idx < kMmaHeads * kC; idx += blockDim.x) {
      const int hh = idx / kC, ch = idx % kC;
      const float w = hh < H ? a.wb[hh * kC + ch] : 0.f;  // heads >= H: zero weights
      if constexpr (sizeof(ZT) == 2) {
        const __nv_bfloat16 hi = __float2bfloat16_rn(w);
        wmma_s[hh * ZP + ch] = hi;
        wmma_s[(kMmaHeads + hh) * ZP + ch] = __float2bfloat16_rn(w - __bfloat162float(hi));
      } else {
        const float hi = __uint_as_float(to_tf32(w));
        wmma_s[hh * ZP + ch] = hi;
        wmma_s[(kMmaHeads + hh) * ZP + ch] = __uint_as_float(to_tf32(w - hi));
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < kHMax * kC; idx += blockDim.x) {
      const int hh = idx / kC, ch = idx % kC;
      wb_s[hh * kWPitch + ch] = hh < H ? a.wb[hh * kC + ch] : 0.f;  // heads >= H: zero weights
    }
  }

  // Attention state: lane (r, t) holds query row i0 + r whole, half t of its accumulator.
  const int h = warp, r = lane >> 1, t = lane & 1;
  const int i = i0 + r;
  const bool row_valid = i < N;
  float4 qs[kD / 4], qp[kPts / 4], acc[kWv / 8];
  {
    const float* qrow = a.q + (head_row0 + (row_valid ? i : 0)) * kWq;
#pragma unroll
    for (int c = 0; c < kD / 4; ++c) qs[c] = ld_global4(qrow + 4 * c);
#pragma unroll
    for (int c = 0; c < kPts / 4; ++c) qp[c] = ld_global4(qrow + kD + 4 * c);
#pragma unroll
    for (int c = 0; c < kWv / 8; ++c) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const float pwh = a.pw[h];
  float m = -INFINITY, l = 0.f;
  __syncthreads();  // the weights complete

  for (int it = 0; it < ntiles; ++it) {
    const int slot = it & 1;
    const int j0 = (tile_begin + it) * BN;
    cp_async_wait<1>();  // this thread's copies of tile `it` have landed
    __syncwarp();        // ... and every lane's (each warp reads only what it copied)
    float* sbs = sb + slot * H * kQT * BNP;

    // ---- 1. pair bias ----
    if constexpr (kBias == kMmaPairRows) {  // lane (g, u) -> pair g, heads 8 n + 2 u + {0, 1}
      const int g = lane >> 2, u = lane & 3;
      const ZT* zr = zw + slot * 8 * ZP + g * ZP + 2 * u;
      const __nv_bfloat16* wr = wmma_s + g * ZP + 2 * u;
      float bacc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int k0 = 0; k0 < kC; k0 += 16) {
        const uint32_t a_lo = ld_shared_u32(zr + k0), a_hi = ld_shared_u32(zr + k0 + 8);
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int part = 1; part >= 0; --part) {  // W's lo part first: the small products
            const __nv_bfloat16* w = wr + (part * kMmaHeads + 8 * n) * ZP + k0;
            mma_bf16(bacc[n], a_lo, 0u, a_hi, 0u, ld_shared_u32(w), ld_shared_u32(w + 8));
          }
        }
      }
      const int qi = (warp & 1) * 8 + g;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int hd = 8 * n + 2 * u + e;
          if (hd < H) sbs[(hd * kQT + qi) * BNP + wkey] = bacc[n][e];
        }
      }
    } else if constexpr (kBias == kMmaHeadRows) {  // lane (g, u) -> heads g, g + 8 of pairs
      const int g = lane >> 2, u = lane & 3;         // 2 u, 2 u + 1
      float bacc[4] = {0.f, 0.f, 0.f, 0.f};
      if constexpr (sizeof(ZT) == 2) {  // bf16 z exact; W_b hi and lo: 2 mma a k-step
        const ZT* zr = zw + slot * 8 * ZP + g * ZP + 2 * u;  // B: z^T's column g (pair g)
        const ZT* wr = wmma_s + g * ZP + 2 * u;              // A: W_b's rows g, g + 8
#pragma unroll
        for (int k0 = 0; k0 < kC; k0 += 16) {
          const uint32_t b0 = ld_shared_u32(zr + k0), b1 = ld_shared_u32(zr + k0 + 8);
#pragma unroll
          for (int part = 1; part >= 0; --part) {  // W's lo part first: the small products
            const ZT* w = wr + part * kMmaHeads * ZP + k0;
            const ZT* w8 = w + 8 * ZP;
            mma_bf16(bacc, ld_shared_u32(w), ld_shared_u32(w8), ld_shared_u32(w + 8),
                     ld_shared_u32(w8 + 8), b0, b1);
          }
        }
      } else {  // 3xTF32: z split in registers, W_b's parts staged; lo x hi, hi x lo, hi x hi
        const float* zr = zw + slot * 8 * ZP + g * ZP + u;
        const float* wr = wmma_s + g * ZP + u;
#pragma unroll 4
        for (int k0 = 0; k0 < kC; k0 += 8) {
          const float z0 = zr[k0], z1 = zr[k0 + 4];
          const uint32_t zh0 = to_tf32(z0), zh1 = to_tf32(z1);
          const uint32_t zl0 = to_tf32(z0 - __uint_as_float(zh0));
          const uint32_t zl1 = to_tf32(z1 - __uint_as_float(zh1));
          const float* hi = wr + k0;
          const float* lo = hi + kMmaHeads * ZP;
          const uint32_t h0 = __float_as_uint(hi[0]), h1 = __float_as_uint(hi[8 * ZP]);
          const uint32_t h2 = __float_as_uint(hi[4]), h3 = __float_as_uint(hi[8 * ZP + 4]);
          mma_tf32(bacc, __float_as_uint(lo[0]), __float_as_uint(lo[8 * ZP]),
                   __float_as_uint(lo[4]), __float_as_uint(lo[8 * ZP + 4]), zh0, zh1);
          mma_tf32(bacc, h0, h1, h2, h3, zl0, zl1);
          mma_tf32(bacc, h0, h1, h2, h3, zh0, zh1);
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hd = g + 8 * (e >> 1), qi = (warp & 1) * 8 + 2 * u + (e & 1);
        if (hd < H) sbs[(hd * kQT + qi) * BNP + wkey] = bacc[e];
      }
    } else {  // FFMA: lane (p, s, g) -> heads 3g .. 3g+2 of pairs p and p + 4 over the channel
              // chunks s, s+2, s+4, ...; one shuffle per value joins the two halves
      const int p = lane & 3, s = (lane >> 2) & 1, g = lane >> 3;  // a quarter shares g
      const ZT* zr = zw + slot * 8 * ZP + p * ZP;  // rows p and p + 4
      const float* w0 = wb_s + 3 * g * kWPitch;
      float bacc[2][3] = {{0.f, 0.f, 0.f}, {0.f, 0.f, 0.f}};
#pragma unroll 2
      for (int c = s; c < NCH; c += 2) {
        float zf[2][CH];
#pragma unroll
        for (int q2 = 0; q2 < 2; ++q2) {
          const ZT* zc = zr + q2 * 4 * ZP + c * CH;
          if constexpr (CH == 4) {
            const float4 zz = ld_shared4(reinterpret_cast<const float*>(zc));
            zf[q2][0] = zz.x; zf[q2][1] = zz.y; zf[q2][2] = zz.z; zf[q2][3] = zz.w;
          } else {
            unpack_bf16x8(*reinterpret_cast<const uint4*>(zc), zf[q2]);
          }
        }
#pragma unroll
        for (int hh = 0; hh < 3; ++hh) {
#pragma unroll
          for (int e4 = 0; e4 < CH; e4 += 4) {
            const float4 w = ld_shared4(w0 + hh * kWPitch + c * CH + e4);
#pragma unroll
            for (int q2 = 0; q2 < 2; ++q2) {
              float& x = bacc[q2][hh];
              x = fmaf(zf[q2][e4], w.x, x);
              x = fmaf(zf[q2][e4 + 1], w.y, x);
              x = fmaf(zf[q2][e4 + 2], w.z, x);
              x = fmaf(zf[q2][e4 + 3], w.w, x);
            }
          }
        }
      }
      // Lane s = 0 finishes pair p, lane s = 1 pair p + 4 (both add the two halves in the same
      // order, so the sum does not depend on which lane finishes it).
#pragma unroll
      for (int hh = 0; hh < 3; ++hh) {
        const float mine = s ? bacc[0][hh] : bacc[1][hh];  // the half the partner finishes
        const float other = __shfl_xor_sync(0xffffffffu, mine, 4);
        const float own = s ? bacc[1][hh] : bacc[0][hh];
        const float total = s ? other + own : own + other;  // chunk half 0 + half 1
        const int hd = 3 * g + hh;
        const int qi = (warp & 1) * 8 + p + 4 * s;
        if (hd < H) sbs[(hd * kQT + qi) * BNP + wkey] = total;
      }
    }
    __syncthreads();  // biases of every head for this tile are in sbs

    // ---- 2. attention: lane (r, t) scores keys t, t+2, t+4; rows >= BN are clamped, masked ----
    {
      const float* kt = kvw + slot * BN * (kWq + kWv);
      const float* vt = kt + BN * kWq;
      const float* srow = sbs + (h * kQT + r) * BNP;
      float s[kKeysPerLane];
#pragma unroll
      for (int u = 0; u < kKeysPerLane; ++u) {
        const int j = 2 * u + t, jc = min(j, BN - 1);
        const float* kr = kt + jc * kWq;
        float dot0 = 0.f, dot1 = 0.f, dist = 0.f;
#pragma unroll
        for (int c = 0; c < kD / 4; ++c) {
          const float4 kk = ld_shared4(kr + 4 * c);
          float& d = (c & 1) ? dot1 : dot0;
          d = fmaf(qs[c].x, kk.x, d);
          d = fmaf(qs[c].y, kk.y, d);
          d = fmaf(qs[c].z, kk.z, d);
          d = fmaf(qs[c].w, kk.w, d);
        }
#pragma unroll
        for (int c = 0; c < kPts / 4; ++c) {
          const float4 kk = ld_shared4(kr + kD + 4 * c);
          const float dx = qp[c].x - kk.x, dy = qp[c].y - kk.y;
          const float dz = qp[c].z - kk.z, dw = qp[c].w - kk.w;
          dist = fmaf(dx, dx, dist);
          dist = fmaf(dy, dy, dist);
          dist = fmaf(dz, dz, dist);
          dist = fmaf(dw, dw, dist);
        }
        const float sv = srow[jc] + fmaf(pwh, dist, dot0 + dot1);
        s[u] = (j < BN && j0 + j < N) ? sv : -INFINITY;
      }
      // Online softmax in base 2. Key 0 of a tile is always valid, so mn is finite.
      float mt = fmaxf(fmaxf(s[0], s[1]), s[2]);
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
      const float mn = fmaxf(m, mt);
      const float alpha = exp2f(m - mn);  // 0 on the first tile (m = -inf)
      m = mn;
      float pe[kKeysPerLane], po[kKeysPerLane];  // probabilities of keys 2u and 2u + 1
#pragma unroll
      for (int u = 0; u < kKeysPerLane; ++u) {
        const float mine = exp2f(s[u] - mn);
        const float other = __shfl_xor_sync(0xffffffffu, mine, 1);
        pe[u] = t ? other : mine;
        po[u] = t ? mine : other;
      }
      float lt = 0.f;  // summed in key order: the same in both lanes of the row
#pragma unroll
      for (int u = 0; u < kKeysPerLane; ++u) lt = (lt + pe[u]) + po[u];
      l = fmaf(l, alpha, lt);
#pragma unroll
      for (int c = 0; c < kWv / 8; ++c) {
        acc[c].x *= alpha; acc[c].y *= alpha; acc[c].z *= alpha; acc[c].w *= alpha;
      }
      // Two keys at a time (rolled): unrolled, all six v rows would be loaded together and the
      // kernel would spill at the 168-register cap of 384-thread CTAs.
#pragma unroll 1
      for (int u = 0; u < kKeysPerLane; ++u) {
        const float pu[2] = {u == 0 ? pe[0] : (u == 1 ? pe[1] : pe[2]),
                             u == 0 ? po[0] : (u == 1 ? po[1] : po[2])};  // 0 for masked keys
#pragma unroll
        for (int par = 0; par < 2; ++par) {
          const float* vr = vt + min(2 * u + par, BN - 1) * kWv + t * (kWv / 2);
#pragma unroll
          for (int c = 0; c < kWv / 8; ++c) {
            const float4 vv = ld_shared4(vr + 4 * c);
            acc[c].x = fmaf(pu[par], vv.x, acc[c].x);
            acc[c].y = fmaf(pu[par], vv.y, acc[c].y);
            acc[c].z = fmaf(pu[par], vv.z, acc[c].z);
            acc[c].w = fmaf(pu[par], vv.w, acc[c].w);
          }
        }
      }
    }
    __syncwarp();  // every lane is done with this slot's z and k/v before it is refilled
    if (it + 2 < ntiles) issue(tile_begin + it + 2, slot); else cp_async_commit();
  }
  cp_async_wait<0>();

  // ---- epilogue: half t of the row (28 floats, 16-byte aligned) ----
  if (!row_valid) return;
  const size_t row = head_row0 + i;
  if (a.splits == 1) {
    const float inv = 1.f / l;
    float* orow = a.out + ((static_cast<size_t>(b) * N + i) * H + h) * kWv + t * (kWv / 2);
#pragma unroll
    for (int c = 0; c < kWv / 8; ++c)
      *reinterpret_cast<float4*>(orow + 4 * c) =
          make_float4(acc[c].x * inv, acc[c].y * inv, acc[c].z * inv, acc[c].w * inv);
  } else {
    const size_t rows = static_cast<size_t>(a.B) * H * N;
    float* prow = a.part + (split * rows + row) * kWv + t * (kWv / 2);
#pragma unroll
    for (int c = 0; c < kWv / 8; ++c) *reinterpret_cast<float4*>(prow + 4 * c) = acc[c];
    if (t == 0) {
      float* ml = a.part + a.splits * rows * kWv + (split * rows + row) * 2;
      ml[0] = m;
      ml[1] = l;
    }
  }
}

}  // namespace

FusedClassLimits af2_limits() {
  using namespace af2;
  return {1, kQT, kHMax, true, kD, kPts, kWv, true, kC};
}

size_t af2_smem_bytes(int H, int zbytes, int bias) {
  using namespace af2;
  const bool mma_bias = bias != kFfmaBias;
  const int bn = H / 2, bnp = bn | 1;
  const int zpitch = zbytes == 2 ? staged_z_pitch<__nv_bfloat16>(mma_bias)
                                 : staged_z_pitch<float>(mma_bias);
  return 4ull * ((mma_bias ? 0 : kHMax * kWPitch) + 2ull * H * kQT * bnp)  // weights, bias tiles
         + static_cast<size_t>(H) * 2 * 8 * zpitch * zbytes       // z rows: 8 per warp, 2 slots
         + 4ull * H * 2 * bn * (kWq + kWv)                        // k/v rows per head, 2 slots
         + (mma_bias ? 2ull * kMmaHeads * zpitch * zbytes : 0);   // W_b's hi and lo parts
}

FusedKernelFn af2_kernel(bool z_bf16, int bias) {
  if (!z_bf16)
    return bias == kMmaHeadRows ? ipa_fused_af2_kernel<float, kMmaHeadRows>
                                : ipa_fused_af2_kernel<float, kFfmaBias>;
  switch (bias) {
    case kMmaPairRows: return ipa_fused_af2_kernel<__nv_bfloat16, kMmaPairRows>;
    case kMmaHeadRows: return ipa_fused_af2_kernel<__nv_bfloat16, kMmaHeadRows>;
    default: return ipa_fused_af2_kernel<__nv_bfloat16, kFfmaBias>;
  }
}

}  // namespace ipa
