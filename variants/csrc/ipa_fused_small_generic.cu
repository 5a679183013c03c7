// cuda-fused, kernel classes `small` and `generic`: one templated kernel (ipa_fused_kernel), two
// instances (ClassTraits below). The design they share with the af2 class, the dispatch and the
// split-K combine: ipa_fused.cu.
//
// Per key tile of BN = 8*H/QT keys:
//   1. bias phase   each warp turns 8 (query, key) pairs of z (staged in shared memory by
//                   cp.async two tiles ahead) into H biases: 8 lanes per pair split the channels,
//                   a reduce-scatter over those lanes leaves each lane a few finished heads;
//   2. barrier      the biases of all heads are in shared memory;
//   3. attention    warp h scores its QT queries against the tile (q.k scaled, minus the
//                   softplus-weighted squared point distance computed DIRECTLY, plus the bias),
//                   then an fp32 online softmax update and one accumulation of the value row
//                   [v | value points] (scalar and point values together).
// T lanes share one query row (each holds a slice of q, query points and the accumulator); the
// logit is completed with log2(T) shuffles. Padded widths are zero-filled so the chunk loops
// stay uniform across a warp; shapes beyond a class's register arrays fall through to the next:
//   small   T=2, 16 queries/CTA, key/value tiles in shared memory (cp.async, double-buffered)
//   generic T=8,  4 queries/CTA, key/value rows read through L1 from global memory
#include <math.h>

#include "ipa_fused_common.cuh"

namespace ipa {
namespace {

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

template <typename ZT, int KLASS>
FusedKernelFn kernel_of() {
  using Tr = ClassTraits<KLASS>;
  return ipa_fused_kernel<ZT, Tr::T, Tr::NQ, Tr::NP, Tr::NV, Tr::HMAX, Tr::HG, Tr::PL, Tr::KV_SMEM>;
}

}  // namespace

FusedClassLimits small_generic_limits(int klass) {
  return klass == kFusedSmall ? limits_of<kFusedSmall>() : limits_of<kFusedGeneric>();
}

size_t small_generic_smem_bytes(int klass, int H, int C, int zbytes, int wq, int wv) {
  const FusedClassLimits lim = small_generic_limits(klass);
  return fused_smem_bytes(lim.max_heads, lim.queries_per_cta, klass == kFusedSmall, H, C, zbytes,
                          wq, wv);
}

FusedKernelFn small_generic_kernel(int klass, bool z_bf16) {
  if (klass == kFusedSmall)
    return z_bf16 ? kernel_of<__nv_bfloat16, kFusedSmall>() : kernel_of<float, kFusedSmall>();
  return z_bf16 ? kernel_of<__nv_bfloat16, kFusedGeneric>() : kernel_of<float, kFusedGeneric>();
}

}  // namespace ipa
