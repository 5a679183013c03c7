// cuda-fused: flash-style Invariant Point Attention with the pair-bias projection fused in.
//
// One CTA owns QT = 32/T queries of one batch element for ALL heads (warp w <-> head w), so every
// pair_repr row z[b,i,j,:] is read from device memory exactly once and projected to all H biases
// in registers. Keys are walked in tiles of BN = 8*H/QT keys; per tile:
//   1. bias phase   each warp turns 8 (query, key) pairs of z (staged in shared memory by
//                   cp.async two tiles ahead) into H biases: 8 lanes per pair split the channels,
//                   a reduce-scatter over those lanes leaves each lane a few finished heads;
//   2. barrier      the biases of all heads are in shared memory;
//   3. attention    warp h scores its QT queries against the tile (q.k scaled, minus the
//                   softplus-weighted squared point distance computed DIRECTLY, plus the bias),
//                   then an fp32 online softmax update and one accumulation of the value row
//                   [v | value points] (scalar and point values together).
// T lanes share one query row (each holds a slice of q, query points and the accumulator); the
// logit is completed with log2(T) shuffles. Softmax runs in base 2 (log2(e) folded into q, the
// point weight and the pair-bias weight). No (B,H,N,N) tensor is ever written: extra memory is
// the (B,N,H,d+3Vp) output plus, when the key range is split across CTAs (split-K, to fill the
// GPU at small N), split partials of the same order, O(N).
//
// Kernel classes (template instances; shapes beyond a class's register arrays fall through to
// the next, and padded widths are zero-filled so the chunk loops stay uniform across a warp):
//   small   T=2, 16 queries/CTA, key/value tiles in shared memory (cp.async, double-buffered)
//   generic T=8,  4 queries/CTA, key/value rows read through L1 from global memory
//   af2     AlphaFold2's sizes exactly, its own kernel below (ipa_fused_af2_kernel): the same
//           CTA and tile as `small`, every width a compile-time constant, whole dot products
#include <math.h>

#include <algorithm>

#include "ipa_common.cuh"
#include "ipa_kernels.h"

namespace ipa {
namespace {

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

// Reduce-scatter of V partial sums over the lanes sharing one pair (lane bits MASK, ..., 1).
// While V is even, each exchange halves the values a lane keeps (V/2 shuffles instead of V);
// an odd remainder is finished with a butterfly, after which one lane of each group emits.
// emit(head, value) is called for the heads [base, base + V_final) this lane ends up owning.
template <int V, int MASK>
struct ReduceScatter {
  template <typename Emit>
  __device__ __forceinline__ static void run(const float (&x)[V], int u, int base, bool emitter,
                                             Emit& emit) {
    if constexpr (MASK == 0) {
      if (emitter) {
#pragma unroll
        for (int k = 0; k < V; ++k) emit(base + k, x[k]);
      }
    } else if constexpr (V % 2 == 0) {
      constexpr int HV = V / 2;
      const bool hi = (u & MASK) != 0;
      float y[HV];
#pragma unroll
      for (int k = 0; k < HV; ++k) {
        const float send = hi ? x[k] : x[HV + k];
        const float recv = __shfl_xor_sync(0xffffffffu, send, MASK);
        y[k] = (hi ? x[HV + k] : x[k]) + recv;
      }
      ReduceScatter<HV, MASK / 2>::run(y, u, base + (hi ? HV : 0), emitter, emit);
    } else {
      float y[V];
#pragma unroll
      for (int k = 0; k < V; ++k) y[k] = x[k] + __shfl_xor_sync(0xffffffffu, x[k], MASK);
      ReduceScatter<V, MASK / 2>::run(y, u, base, emitter && (u & MASK) == 0, emit);
    }
  }
};

// Shared memory of one CTA, in bytes (host and device agree through this function).
__host__ __device__ inline size_t fused_smem_bytes(int hmax, int qt, bool kv_smem, int H, int C,
                                                   int zbytes, int wq, int wv) {
  const int bn = 8 * H / qt;
  const int bnp = bn | 1;
  size_t floats = static_cast<size_t>(hmax) * C      // pair-bias weights
                  + 3ull * H * qt * bnp;               // bias tiles (2 slots) + logits
  size_t bytes = floats * 4 + static_cast<size_t>(H) * 2 * 8 * C * zbytes;  // z items, 2 slots
  if (kv_smem) bytes += static_cast<size_t>(H) * 2 * bn * (wq + wv) * 4;     // k/v tiles, 2 slots
  return bytes;
}

template <typename ZT, int T, int NQ, int NP, int NV, int HMAX, int HG, int PL, bool KV_SMEM>
__global__ void __launch_bounds__(HMAX * 32, 1) ipa_fused_kernel(const FusedArgs a) {
  constexpr int QT = 32 / T;                      // queries per CTA = rows per warp
  constexpr int CH = ZChunk<ZT>::kChannels;       // z channels per 16-byte chunk
  constexpr int PS = 32 / PL;                     // pair slots per warp (PL lanes per pair)
  constexpr int PA = 8 / PS;                      // pairs per lane (8 pairs per warp)
  constexpr int ZR = kMaxPairDim / (PL * CH);     // chunk rounds per lane
  extern __shared__ __align__(16) unsigned char smem_raw[];

  const int N = a.N, H = a.H, C = a.C;
  const int wq = a.wq, wv = a.wv, dqp = a.dqp;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.z, split = blockIdx.y;
  const int i0 = blockIdx.x * QT;
  const int BN = 8 * H / QT;  // keys per tile: 8 pairs per warp
  const int BNP = BN | 1;     // odd row pitch: the QT rows of a warp hit distinct banks
  const int ntiles_all = (N + BN - 1) / BN;
  const int tile_begin = split * a.tiles_per_split;
  const int ntiles = max(0, min(ntiles_all, tile_begin + a.tiles_per_split) - tile_begin);
  const int nchunks = C / CH;

  float* wb_s = reinterpret_cast<float*>(smem_raw);  // HMAX*C, laid out for 16-byte lane reads
  float* sb = wb_s + HMAX * C;                       // [2][H][QT][BNP] biases
  float* lg = sb + 2 * H * QT * BNP;                 // [H][QT][BNP] logits of the current tile
  ZT* zb = reinterpret_cast<ZT*>(lg + H * QT * BNP);  // [H][2][8][C] z items
  float* kvb = reinterpret_cast<float*>(zb + H * 2 * 8 * C);  // [H][2][BN][wq + wv]

  ZT* zw = zb + warp * 2 * 8 * C;
  float* kvw = kvb + warp * 2 * BN * (wq + wv);
  const ZT* zg = static_cast<const ZT*>(a.z);

  // Stage tile `tile` into `slot`: this warp's 8 z rows (+ its head's k/v rows). One commit group.
  auto issue = [&](int tile, int slot) {
    const int j0 = tile * BN;
    ZT* zdst = zw + slot * 8 * C;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int pp = warp * 8 + e;
      const int ii = i0 + pp % QT, jj = j0 + pp / QT;
      const bool ok = ii < N && jj < N;
      const ZT* src = zg + (ok ? (static_cast<size_t>(b) * N + ii) * N * C + static_cast<size_t>(jj) * C : 0);
      for (int c = lane; c < nchunks; c += 32) cp_async16(zdst + e * C + c * CH, src + c * CH, ok ? 16 : 0);
    }
    if constexpr (KV_SMEM) {
      const int nk = min(BN, N - j0);
      const size_t row0 = (static_cast<size_t>(b) * H + warp) * N + j0;
      const float* ks = a.k + row0 * wq;
      const float* vs = a.v + row0 * wv;
      float* kd = kvw + slot * BN * (wq + wv);
      float* vd = kd + BN * wq;
      for (int c = lane; c < nk * wq / 4; c += 32) cp_async16(kd + 4 * c, ks + 4 * c, 16);
      for (int c = lane; c < nk * wv / 4; c += 32) cp_async16(vd + 4 * c, vs + 4 * c, 16);
    }
    cp_async_commit();
  };

  // Start the first two tiles' copies, then lay out the pair-bias weights (heads >= H are zero).
  if (ntiles > 0) issue(tile_begin, 0); else cp_async_commit();
  if (ntiles > 1) issue(tile_begin + 1, 1); else cp_async_commit();
  for (int idx = threadIdx.x; idx < HMAX * C; idx += blockDim.x) {
    const int hh = idx / C, ch = idx - hh * C;
    const float w = hh < H ? a.wb[hh * C + ch] : 0.f;
    int dst;
    if constexpr (CH == 4) {
      dst = idx;  // [h][C]: lane u reads chunk u + 8r as one float4, 8 lanes contiguous
    } else {      // two planes (channels 0-3 / 4-7 of each 8-channel chunk): [plane][h][C/8][4]
      dst = ((ch >> 2) & 1) * (HMAX * C / 2) + hh * (C / 2) + (ch >> 3) * 4 + (ch & 3);
    }
    wb_s[dst] = w;
  }

  // Per-row state: warp h owns head h; lanes (r, t) hold slice t of query row i0 + r.
  const int h = warp;
  const int r = lane / T, t = lane % T;
  const int i = i0 + r;
  const bool row_valid = i < N;
  const int nq = dqp / (4 * T), np = (wq - dqp) / (4 * T), nv = wv / (4 * T);
  float4 qs[NQ], qp[NP], acc[NV];
  {
    const float* qrow = a.q + ((static_cast<size_t>(b) * H + h) * N + (row_valid ? i : 0)) * wq;
#pragma unroll
    for (int c = 0; c < NQ; ++c)
      qs[c] = (c < nq && row_valid) ? ld_global4(qrow + 4 * (c * T + t)) : make_float4(0, 0, 0, 0);
#pragma unroll
    for (int c = 0; c < NP; ++c)
      qp[c] = (c < np && row_valid) ? ld_global4(qrow + dqp + 4 * (c * T + t)) : make_float4(0, 0, 0, 0);
#pragma unroll
    for (int c = 0; c < NV; ++c) acc[c] = make_float4(0, 0, 0, 0);
  }
  const float pwh = a.pw[h];
  float m = -INFINITY, l = 0.f;
  __syncthreads();  // wb_s complete

  for (int it = 0; it < ntiles; ++it) {
    const int slot = it & 1;
    const int j0 = (tile_begin + it) * BN;
    const int nk = min(BN, N - j0);
    cp_async_wait<1>();  // this thread's copies of tile `it` have landed
    __syncwarp();        // ... and every lane's (each warp reads only what it copied)
    float* sbs = sb + slot * H * QT * BNP;

    // ---- 1. bias phase: 8 pairs per warp, lane (s, u): pairs s + PS*p2, chunks u + PL*rr ----
    {
      const int s = lane / PL, u = lane % PL;
      const ZT* zs = zw + slot * 8 * C;
      // Heads in groups of HG (one group in the small class): HG*PA accumulators per lane.
      const int hend = HG == HMAX ? HG : H;  // compile-time single group when HG == HMAX
#pragma unroll 1
      for (int g0 = 0; g0 < hend; g0 += HG) {
      float bacc[PA][HG];
#pragma unroll
      for (int p2 = 0; p2 < PA; ++p2)
#pragma unroll
        for (int hh = 0; hh < HG; ++hh) bacc[p2][hh] = 0.f;
#pragma unroll 2  // full unrolling spills at the 128-register cap of 512-thread CTAs
      for (int rr = 0; rr < ZR; ++rr) {
        const int cc = u + PL * rr;
        if (cc < nchunks) {
          float zf[PA][CH];
#pragma unroll
          for (int p2 = 0; p2 < PA; ++p2) {
            const ZT* src = zs + (s + PS * p2) * C + cc * CH;
            if constexpr (CH == 4) {
              const float4 zz = *reinterpret_cast<const float4*>(src);
              zf[p2][0] = zz.x; zf[p2][1] = zz.y; zf[p2][2] = zz.z; zf[p2][3] = zz.w;
            } else {
              unpack_bf16x8(*reinterpret_cast<const uint4*>(src), zf[p2]);
            }
          }
#pragma unroll
          for (int hh = 0; hh < HG; ++hh) {
            float w[CH];
            if constexpr (CH == 4) {
              const float4 w0 = ld_shared4(wb_s + (g0 + hh) * C + cc * 4);
              w[0] = w0.x; w[1] = w0.y; w[2] = w0.z; w[3] = w0.w;
            } else {
              const float4 w0 = ld_shared4(wb_s + (g0 + hh) * (C / 2) + cc * 4);
              const float4 w1 = ld_shared4(wb_s + HMAX * C / 2 + (g0 + hh) * (C / 2) + cc * 4);
              w[0] = w0.x; w[1] = w0.y; w[2] = w0.z; w[3] = w0.w;
              w[4] = w1.x; w[5] = w1.y; w[6] = w1.z; w[7] = w1.w;
            }
#pragma unroll
            for (int p2 = 0; p2 < PA; ++p2)
#pragma unroll
              for (int e = 0; e < CH; ++e) bacc[p2][hh] = fmaf(zf[p2][e], w[e], bacc[p2][hh]);
          }
        }
      }
#pragma unroll
      for (int p2 = 0; p2 < PA; ++p2) {
        const int pp = warp * 8 + s + PS * p2;
        const int qi = pp % QT, kj = pp / QT;
        auto emit = [&](int hh, float val) {
          if (hh < H) sbs[(hh * QT + qi) * BNP + kj] = val;
        };
        ReduceScatter<HG, PL / 2>::run(bacc[p2], u, g0, true, emit);
      }
      }
    }
    __syncthreads();  // biases of every head for this tile are in sbs

    // ---- 2. attention phase: warp h, its QT query rows against the nk keys of the tile ----
    {
      const float* srow = sbs + (h * QT + r) * BNP;
      float* lrow = lg + (h * QT + r) * BNP;
      const float* kt;
      const float* vt;
      if constexpr (KV_SMEM) {
        kt = kvw + slot * BN * (wq + wv);
        vt = kt + BN * wq;
      } else {
        const size_t row0 = (static_cast<size_t>(b) * H + h) * N + j0;
        kt = a.k + row0 * wq;
        vt = a.v + row0 * wv;
      }
      auto kvload = [](const float* p) -> float4 {
        if constexpr (KV_SMEM) return ld_shared4(p);
        else return ld_global4(p);
      };
      float mt = -INFINITY;
      for (int j = 0; j < nk; ++j) {
        const float* kr = kt + j * wq;
        float dot = 0.f, dist = 0.f;
#pragma unroll
        for (int c = 0; c < NQ; ++c) {
          if (c < nq) {
            const float4 kk = kvload(kr + 4 * (c * T + t));
            dot = fmaf(qs[c].x, kk.x, dot);
            dot = fmaf(qs[c].y, kk.y, dot);
            dot = fmaf(qs[c].z, kk.z, dot);
            dot = fmaf(qs[c].w, kk.w, dot);
          }
        }
#pragma unroll
        for (int c = 0; c < NP; ++c) {
          if (c < np) {
            const float4 kk = kvload(kr + dqp + 4 * (c * T + t));
            const float dx = qp[c].x - kk.x, dy = qp[c].y - kk.y;
            const float dz = qp[c].z - kk.z, dw = qp[c].w - kk.w;
            dist = fmaf(dx, dx, dist);
            dist = fmaf(dy, dy, dist);
            dist = fmaf(dz, dz, dist);
            dist = fmaf(dw, dw, dist);
          }
        }
        float part = fmaf(pwh, dist, dot);
#pragma unroll
        for (int msk = 1; msk < T; msk <<= 1) part += __shfl_xor_sync(0xffffffffu, part, msk);
        const float sv = srow[j] + part;  // identical in the T lanes of the row
        mt = fmaxf(mt, sv);
        if (t == 0) lrow[j] = sv;
      }
      __syncwarp();  // logits visible to the row's other lanes
      const float mn = fmaxf(m, mt);
      const float alpha = exp2f(m - mn);  // 0 on the first tile (m = -inf)
      l *= alpha;
#pragma unroll
      for (int c = 0; c < NV; ++c) {
        acc[c].x *= alpha; acc[c].y *= alpha; acc[c].z *= alpha; acc[c].w *= alpha;
      }
      m = mn;
      for (int j = 0; j < nk; ++j) {
        const float pj = exp2f(lrow[j] - m);
        l += pj;
        const float* vr = vt + j * wv;
#pragma unroll
        for (int c = 0; c < NV; ++c) {
          if (c < nv) {
            const float4 vv = kvload(vr + 4 * (c * T + t));
            acc[c].x = fmaf(pj, vv.x, acc[c].x);
            acc[c].y = fmaf(pj, vv.y, acc[c].y);
            acc[c].z = fmaf(pj, vv.z, acc[c].z);
            acc[c].w = fmaf(pj, vv.w, acc[c].w);
          }
        }
      }
    }
    __syncwarp();  // every lane is done with this slot's z, k/v and the logits before reuse
    if (it + 2 < ntiles) issue(tile_begin + it + 2, slot); else cp_async_commit();
  }
  cp_async_wait<0>();

  // ---- epilogue ----
  if (!row_valid) return;
  if (a.splits == 1) {
    const float inv = 1.f / l;
    float* orow = a.out + ((static_cast<size_t>(b) * N + i) * H + h) * a.dv;
#pragma unroll
    for (int c = 0; c < NV; ++c) {
      if (c < nv) {
        const int f = 4 * (c * T + t);
        const float vals[4] = {acc[c].x, acc[c].y, acc[c].z, acc[c].w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (f + e < a.dv) orow[f + e] = vals[e] * inv;
      }
    }
  } else {
    const size_t rows = static_cast<size_t>(a.B) * H * N;
    const size_t row = (static_cast<size_t>(b) * H + h) * N + i;
    float* prow = a.part + (split * rows + row) * wv;
#pragma unroll
    for (int c = 0; c < NV; ++c)
      if (c < nv) *reinterpret_cast<float4*>(prow + 4 * (c * T + t)) = acc[c];
    if (t == 0) {
      float* ml = a.part + a.splits * rows * wv + (split * rows + row) * 2;
      ml[0] = m;
      ml[1] = l;
    }
  }
}

// ---- AF2 class: AlphaFold2's sizes exactly, every width a compile-time constant ----
//
// Same CTA and tile as above (16 queries x all H heads, BN = H/2 keys, z and the head's k/v rows
// staged by cp.async two tiles ahead, one barrier per tile), but the work is mapped so that no
// lane computes a partial result another lane must finish (v1's profile: 334 warp-instructions
// per (query, key) pair, only 29 % of them FFMA; predicated-off chunks, run-time loop bounds,
// the reduce-scatter of partial biases and per-key shuffles made up the rest):
//   bias      lane (p, s, g) computes heads 3g .. 3g+2 of the warp's pairs p and p + 4 over half
//             of the channels (chunks s, s+2, ...): two 16-byte z reads and three weight reads
//             (row pitches padded so that the reads of a quarter-warp hit distinct banks) per
//             24 FFMA, then one shuffle per bias joins the two channel halves;
//   logits    lane (r, t) = (lane / 2, lane % 2) holds the full query row r (q and its points)
//             and scores keys t, t+2, t+4 of the tile: whole dot products, no shuffles;
//   softmax   one shuffle for the row maximum, three to share the probabilities;
//   values    lane (r, t) accumulates half t of [v | value points] over all keys of the tile.
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
}  // namespace af2

__host__ __device__ inline size_t af2_smem_bytes(int H, int zbytes) {
  using namespace af2;
  const int bn = H / 2, bnp = bn | 1;
  const int zpitch = zbytes == 2 ? z_pitch<__nv_bfloat16>() : z_pitch<float>();
  return 4ull * (kHMax * kWPitch + 2ull * H * kQT * bnp)          // weights, bias tiles (2 slots)
         + static_cast<size_t>(H) * 2 * 8 * zpitch * zbytes       // z rows: 8 per warp, 2 slots
         + 4ull * H * 2 * bn * (kWq + kWv);                       // k/v rows per head, 2 slots
}

template <typename ZT>
__global__ void __launch_bounds__(af2::kHMax * 32, 1) ipa_fused_af2_kernel(const FusedArgs a) {
  using namespace af2;
  constexpr int CH = ZChunk<ZT>::kChannels;  // z channels per 16-byte chunk
  constexpr int NCH = kC / CH;               // chunks per z row
  constexpr int ZP = z_pitch<ZT>();
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

  float* wb_s = reinterpret_cast<float*>(smem_raw);                  // [kHMax][kWPitch]
  float* sb = wb_s + kHMax * kWPitch;                                 // [2][H][kQT][BNP]
  ZT* zw = reinterpret_cast<ZT*>(sb + 2 * H * kQT * BNP) + warp * 2 * 8 * ZP;  // [2][8][ZP]
  float* kvb = reinterpret_cast<float*>(reinterpret_cast<ZT*>(sb + 2 * H * kQT * BNP) +
                                        H * 2 * 8 * ZP);
  float* kvw = kvb + warp * 2 * BN * (kWq + kWv);                     // [2][BN][kWq + kWv]
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
  for (int idx = threadIdx.x; idx < kHMax * kC; idx += blockDim.x) {
    const int hh = idx / kC, ch = idx % kC;
    wb_s[hh * kWPitch + ch] = hh < H ? a.wb[hh * kC + ch] : 0.f;  // heads >= H: zero weights
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
  __syncthreads();  // wb_s complete

  for (int it = 0; it < ntiles; ++it) {
    const int slot = it & 1;
    const int j0 = (tile_begin + it) * BN;
    cp_async_wait<1>();  // this thread's copies of tile `it` have landed
    __syncwarp();        // ... and every lane's (each warp reads only what it copied)
    float* sbs = sb + slot * H * kQT * BNP;

    // ---- 1. pair bias: lane (p, s, g) -> heads 3g .. 3g+2 of pairs p and p + 4 over the
    //      channel chunks s, s+2, s+4, ...; one shuffle per value joins the two halves ----
    {
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

// Merge split-K partials: out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s. One warp per row.
__global__ void __launch_bounds__(128) ipa_fused_combine_kernel(const float* __restrict__ part,
                                                                float* __restrict__ out, int splits,
                                                                int B, int N, int H, int wv, int dv) {
  const size_t rows = static_cast<size_t>(B) * H * N;
  const size_t row = static_cast<size_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* ml = part + splits * rows * wv;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, ml[(s * rows + row) * 2]);
  float den = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float ms = ml[(s * rows + row) * 2];
    den += (ms == -INFINITY ? 0.f : exp2f(ms - mx)) * ml[(s * rows + row) * 2 + 1];
  }
  const float inv = 1.f / den;
  const int i = static_cast<int>(row % N);
  const int bh = static_cast<int>(row / N);
  const int h = bh % H, b = bh / H;
  float* orow = out + ((static_cast<size_t>(b) * N + i) * H + h) * dv;
  for (int f = lane; f < dv; f += 32) {
    float num = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float ms = ml[(s * rows + row) * 2];
      const float w = ms == -INFINITY ? 0.f : exp2f(ms - mx);
      num = fmaf(w, part[(s * rows + row) * wv + f], num);
    }
    orow[f] = num * inv;
  }
}

// ---- the shipped instances ----
template <int KLASS>
struct ClassTraits;
template <>
struct ClassTraits<kFusedSmall> {
  static constexpr int T = 2, NQ = 4, NP = 6, NV = 10, HMAX = 12, HG = 12, PL = 8;
  static constexpr bool KV_SMEM = true, EVEN_H = true;
};
template <>
struct ClassTraits<kFusedGeneric> {
  static constexpr int T = 8, NQ = 4, NP = 2, NV = 6, HMAX = 16, HG = 8, PL = 8;
  static constexpr bool KV_SMEM = false, EVEN_H = false;
};

template <int KLASS>
FusedClassLimits limits_of() {
  using Tr = ClassTraits<KLASS>;
  return {Tr::T,  32 / Tr::T, Tr::HMAX, Tr::EVEN_H, Tr::NQ * 4 * Tr::T, Tr::NP * 4 * Tr::T,
          Tr::NV * 4 * Tr::T, false, 0};
}

FusedClassLimits af2_limits() {
  using namespace af2;
  return {1, kQT, kHMax, true, kD, kPts, kWv, true, kC};
}

using KernelFn = void (*)(const FusedArgs);

template <typename ZT, int KLASS>
KernelFn kernel_of() {
  using Tr = ClassTraits<KLASS>;
  return ipa_fused_kernel<ZT, Tr::T, Tr::NQ, Tr::NP, Tr::NV, Tr::HMAX, Tr::HG, Tr::PL, Tr::KV_SMEM>;
}

KernelFn select_kernel(int klass, bool z_bf16) {
  if (klass == kFusedAF2) return z_bf16 ? ipa_fused_af2_kernel<__nv_bfloat16> : ipa_fused_af2_kernel<float>;
  if (klass == kFusedSmall) return z_bf16 ? kernel_of<__nv_bfloat16, kFusedSmall>() : kernel_of<float, kFusedSmall>();
  return z_bf16 ? kernel_of<__nv_bfloat16, kFusedGeneric>() : kernel_of<float, kFusedGeneric>();
}

int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
  return n;
}

}  // namespace

FusedClassLimits fused_class_limits(int klass) {
  if (klass == kFusedAF2) return af2_limits();
  return klass == kFusedSmall ? limits_of<kFusedSmall>() : limits_of<kFusedGeneric>();
}

cudaError_t fused_plan(int klass, bool z_bf16, int B, int N, int H, int C, int wq, int wv,
                       int forced_splits, FusedPlan* plan) {
  if (klass != kFusedSmall && klass != kFusedGeneric && klass != kFusedAF2)
    return cudaErrorInvalidValue;
  const FusedClassLimits lim = fused_class_limits(klass);
  if (B < 1 || N < 1 || H < 1 || H > lim.max_heads || (lim.even_heads && H % 2) || C < 8 ||
      C > kMaxPairDim || C % 8 || wq % (4 * lim.lanes_per_row) || wv % (4 * lim.lanes_per_row) ||
      wv > lim.max_wv || (lim.pair_dim && C != lim.pair_dim) ||
      (lim.exact && (wq != lim.max_dqp + lim.max_pqp || wv != lim.max_wv)))
    return cudaErrorInvalidValue;
  const int qt = lim.queries_per_cta;
  const int bn = 8 * H / qt;
  const int zbytes = z_bf16 ? 2 : 4;
  const size_t smem = klass == kFusedAF2
                          ? af2_smem_bytes(H, zbytes)
                          : fused_smem_bytes(lim.max_heads, qt, klass == kFusedSmall, H, C,
                                             zbytes, wq, wv);
  KernelFn kern = select_kernel(klass, z_bf16);
  int dev = 0, max_optin = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return err;
  if (smem > static_cast<size_t>(max_optin)) return cudaErrorInvalidConfiguration;
  err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  int occ = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, H * 32, smem);
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

  plan->klass = klass;
  plan->z_bf16 = z_bf16;
  plan->key_tile = bn;
  plan->queries_per_cta = qt;
  plan->splits = splits;
  plan->tiles_per_split = tps;
  plan->smem_bytes = smem;
  plan->workspace_floats = splits > 1 ? static_cast<size_t>(splits) * B * H * N * (wv + 2) : 0;
  plan->blocks_per_sm = occ;
  return cudaSuccess;
}

cudaError_t fused_launch(const FusedArgs& args_in, const FusedPlan& plan, cudaStream_t stream) {
  FusedArgs args = args_in;
  args.splits = plan.splits;
  args.tiles_per_split = plan.tiles_per_split;
  const int qt = plan.queries_per_cta;
  const dim3 grid((args.N + qt - 1) / qt, plan.splits, args.B);
  select_kernel(plan.klass, plan.z_bf16)<<<grid, args.H * 32, plan.smem_bytes, stream>>>(args);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || plan.splits == 1) return err;
  const size_t rows = static_cast<size_t>(args.B) * args.H * args.N;
  ipa_fused_combine_kernel<<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(
      args.part, args.out, plan.splits, args.B, args.N, args.H, args.wv, args.dv);
  return cudaGetLastError();
}

}  // namespace ipa
