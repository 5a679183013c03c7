// cuda-fused, kernel class `af2`, form kTensorCores (FusedBias of ipa_kernels.h): every product
// of the key loop on tensor cores (issue #17). The af2 kernel of ipa_fused_af2.cu scores keys
// with FFMA, one query row per lane pair: per 6-key tile and warp it issues ~75 16-byte and ~87
// 4-byte shared loads and ~300 FFMA (SASS count, sm_90), and at bf16 N = 4096 it runs a tile in
// ~5800 cycles (H100, 3.98 ms) while its z tile needs ~1900 cycles of DRAM time.
//
// CTA: 16 queries of one batch element, all heads, H + 4 warps; tile: 8 keys (128 pairs).
//   bias warps (the last 4): warp w turns the z rows of queries 4w .. 4w+3 (x 8 keys), staged by
//             cp.async kZStages - 1 tiles ahead, into biases with W_b's 16 padded heads as the A
//             operand (hi and lo parts of the fp32 weight) and one query's 8 keys as an n-tile
//             of B (ldmatrix). bf16 z: mma.m16n8k16, W_b's fragments in registers for the whole
//             walk (64), 64 mma a warp and tile. fp32 z: 3xTF32 on mma.m16n8k8, z split in
//             registers, W_b's parts in shared memory (ldmatrix), 192 mma. They work one tile
//             ahead of the attention warps, into the other half of a double-buffered bias tile,
//             and one barrier a tile hands it over.
//   attention warps (warp h <-> head h): on mma.m16n8k8 TF32, lane (g, u) = (lane / 4, lane % 4):
//     S = Q K^T  16 queries x 8 keys, 4 k-steps. The head dimension is permuted in both operands
//                (k-step s, column u (+4) <-> d = 8u + 2s (+1)), so a lane's K fragments are
//                K[key g][8u .. 8u+7]: two 16-byte loads; Q's fragments stay in registers. 3xTF32
//                for both z dtypes: with q and k rounded to TF32 (relative 2^-11) a logit's error
//                is ~2^-11 sum |q_d k_d|, which made the bf16 rows' rel_l2 1.4e-2 at N = 1000 on
//                an H100 (thirtieth session), 8x the FFMA kernel's.
//     logits     S + bias + point weight x squared distance, the distance computed directly in
//                fp32 for the lane's four (query, key) pairs (g or g+8, 2u or 2u+1).
//     softmax    base 2, online, fp32; row maxima over the quad (two shuffles a row); the row
//                sums add the probabilities as the values are weighted by them (TF32-rounded
//                for bf16 z), so the weights of a row sum to one exactly as used.
//     O += P V   the accumulator fragment of S is P's A fragment once the key order of the
//                k-step is (2u, 2u+1) -> (u, u + 4), which V's rows follow: no shuffles; 7
//                n-tiles over [v | value points] (56 floats).
//              Each tile's P V is a fresh mma partial added to O by an FFMA (the tensor cores round
//              the additions of an accumulating mma toward zero: carried through every tile in
//              C, O drifted, fp32 err/ref 2.92 at N = 1000 on an H100).
//   Points and bias stay fp32 (FFMA). bf16 z: p.v rounds its operands to TF32 (relative 2^-11,
//   ~8x finer than the bf16 the eager bf16 reference computes them in). fp32 z: p.v 3xTF32 (each
//   operand split hi + lo, three mma), fp32-level.
// Shared memory at H = 12: bf16 z: bias tiles 13 KB, z 3 x 34 KB, k/v 2 x 39 KB, query points 9 KB:
// 202 KB; fp32 z: z 2 x 66 KB, k/v 1 x 39 KB, W_b's parts 16.5 KB, query points 9 KB: 209 KB. One
// CTA per SM.
// The design shared with the other classes (split-K and its combine, operand layouts):
// ipa_fused.cu and ipa_kernels.h.
#include <math.h>

#include "ipa_fused_common.cuh"

namespace ipa {
namespace {

namespace af2tc {
constexpr int kD = 32, kPts = 12, kWq = kD + kPts, kWv = 56, kC = 128;  // widths (floats)
constexpr int kQT = 16, kBN = kAf2TcKeyTile, kHMax = 12, kMmaHeads = 16;
constexpr int kPairs = kQT * kBN;            // z rows of a tile
constexpr int kVPitch = kWv + 4;             // floats: rows 2u, 2u+1 of a V fragment on 8 banks each
constexpr int kKvHead = kBN * (kWq + kVPitch);  // floats of one head's k and v rows in a stage
constexpr int kSbPitch = kQT * kBN + 8;      // floats per head in a bias tile (8 banks apart)
constexpr int kThreads = (kHMax + kAf2TcBiasWarps) * 32;
// Per z dtype: tiles staged (z from DRAM, k/v from L2; fp32's z fills the shared memory at 2),
// and the z row pitch (elements): 16 bytes of padding, so the 8 rows of an ldmatrix hit 32 banks.
template <typename ZT>
struct Tc;
template <>
struct Tc<__nv_bfloat16> {
  static constexpr int kZStages = 3, kKvStages = 2, kZPitch = kC + 8;
};
template <>
struct Tc<float> {
  static constexpr int kZStages = 2, kKvStages = 1, kZPitch = kC + 4;
};
template <typename ZT>
__host__ __device__ constexpr size_t smem_bytes(int H) {
  return 4ull * 2 * H * kSbPitch                                   // bias tiles, double-buffered
         + sizeof(ZT) * Tc<ZT>::kZStages * kPairs * Tc<ZT>::kZPitch  // z rows
         + 4ull * Tc<ZT>::kKvStages * H * kKvHead                  // k and v rows per head
         + (sizeof(ZT) == 4 ? 4ull * 2 * kMmaHeads * Tc<ZT>::kZPitch : 0)  // fp32: W_b's parts
         + 4ull * H * kQT * kPts;                                          // the query points
}

}  // namespace af2tc

template <typename ZT>
__global__ void __launch_bounds__(af2tc::kThreads, 1) ipa_fused_af2_tc_kernel(const FusedArgs a) {
  using namespace af2tc;
  constexpr bool kBf16 = sizeof(ZT) == 2;
  constexpr int kZStages = Tc<ZT>::kZStages, kKvStages = Tc<ZT>::kKvStages;
  constexpr int kZPitch = Tc<ZT>::kZPitch;
  constexpr int kChunks = kC * static_cast<int>(sizeof(ZT)) / 16;  // 16-byte chunks of a z row
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int N = a.N, H = a.H;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, u = lane & 3;
  const int b = blockIdx.z, split = blockIdx.y;
  const int i0 = blockIdx.x * kQT;
  const int ntiles_all = (N + kBN - 1) / kBN;
  const int tile_begin = split * a.tiles_per_split;
  const int ntiles = max(0, min(ntiles_all, tile_begin + a.tiles_per_split) - tile_begin);

  float* sb = reinterpret_cast<float*>(smem_raw);  // [2][H][kSbPitch]: (head, query, key)
  ZT* zs = reinterpret_cast<ZT*>(sb + 2 * H * kSbPitch);  // [kZStages][kPairs][kZPitch]
  float* kvs = reinterpret_cast<float*>(zs + kZStages * kPairs * kZPitch);  // [kKvStages][H][kKvHead]
  float* ws = kvs + kKvStages * H * kKvHead;  // (fp32 z: W_b's [hi, lo][kMmaHeads][kZPitch],)
                                              // the query points [H][kQT][kPts]

  if (warp >= H) {  // ================= bias warps =================
    const int bw = warp - H;
    const ZT* zg = static_cast<const ZT*>(a.z);
    // bf16: W_b's A fragments, hi and lo parts, k-step s: rows (heads) g and g + 8, channels
    // 16 s + 2u (+1) and 16 s + 2u + 8 (+1); heads >= H zero. fp32: the parts in shared memory.
    uint32_t wa[kBf16 ? 2 : 1][kBf16 ? kC / 16 : 1][4];
    if constexpr (kBf16) {
#pragma unroll
      for (int s = 0; s < kC / 16; ++s) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int hd = g + 8 * (r & 1), ch = 16 * s + 2 * u + 8 * (r >> 1);
          const float w0 = hd < H ? a.wb[hd * kC + ch] : 0.f;
          const float w1 = hd < H ? a.wb[hd * kC + ch + 1] : 0.f;
          const __nv_bfloat162 hi = __floats2bfloat162_rn(w0, w1);
          const __nv_bfloat162 lo =
              __floats2bfloat162_rn(w0 - __low2float(hi), w1 - __high2float(hi));
          wa[0][s][r] = *reinterpret_cast<const uint32_t*>(&hi);
          wa[1][s][r] = *reinterpret_cast<const uint32_t*>(&lo);
        }
      }
    } else {
      for (int idx = threadIdx.x - 32 * H; idx < kMmaHeads * kC; idx += 32 * kAf2TcBiasWarps) {
        const int hd = idx / kC, ch = idx % kC;
        uint32_t hi, lo;
        split_tf32(hd < H ? a.wb[hd * kC + ch] : 0.f, hi, lo);
        ws[hd * kZPitch + ch] = __uint_as_float(hi);
        ws[(kMmaHeads + hd) * kZPitch + ch] = __uint_as_float(lo);
      }
    }
    // W_b's parts complete (fp32): a CTA-wide barrier, which the attention warps meet after their
    // prologue. With a named barrier of the bias warps alone (`bar.sync 1, 128`, until the
    // thirty-sixth session) racecheck reported the bias slots as races in the fp32 instance, the
    // one that had it; with this barrier the driver's racecheck is clean, at the same speed (H100,
    // replayed fp32 N = 256 0.063 -> 0.062 ms, N = 4096 3.785 -> 3.775).
    if constexpr (!kBf16) __syncthreads();
    // Copies: the warp's 32 rows (query 4 bw + rr / 8, key rr % 8), lane -> chunk lane % kChunks
    // of rows lane / kChunks + (32 / kChunks) m. Rows outside N are zero-filled (zero biases,
    // masked or unused). When the tile's 8 keys and the warp's 4 queries are all inside N (all
    // but the edge tiles, warp-uniform), row m's source is this lane's row of query m / kPerQuery
    // plus a fixed offset, so each copy is one cp.async with immediate offsets: ~70 instructions
    // a tile (SASS) instead of ~400 for fp32's 32 copies of 64-bit address arithmetic and bounds
    // checks. Measured with the k/v copies below (thirty-second session, H100, N = 4096): the
    // kernel's executed instructions -18 % (fp32) / -20 % (bf16), its time only -2.8 % / -0.7 %:
    // the bias warps' 3xTF32 loop, not their copies, sets their pace.
    constexpr int kElems = 16 / static_cast<int>(sizeof(ZT));
    const int chunk = lane % kChunks, crow = lane / kChunks;
    constexpr int kRowStep = 32 / kChunks, kPerQuery = kBN / kRowStep;
    const int q_first = i0 + 4 * bw;
    const bool queries_in = q_first + 3 < N;
    const size_t query_stride = static_cast<size_t>(N) * kC;  // elements from query qi to qi + 1
    const ZT* zlane = zg + (static_cast<size_t>(b) * N + min(q_first, N - 1)) * query_stride +
                      crow * kC + chunk * kElems;  // this lane's first row at key 0
    auto issue_z = [&](int t) {  // tile t of this CTA's walk into stage t % kZStages; one group
      if (t < ntiles) {
        const int j0 = (tile_begin + t) * kBN;
        ZT* dst = zs + ((t % kZStages) * kPairs + 32 * bw + crow) * kZPitch + chunk * kElems;
        if (queries_in && j0 + kBN <= N) {
          const ZT* src = zlane + static_cast<size_t>(j0) * kC;
#pragma unroll
          for (int q = 0; q < 4; ++q, src += query_stride)
#pragma unroll
            for (int m = 0; m < kPerQuery; ++m)
              cp_async16(dst + (kBN * q + kRowStep * m) * kZPitch, src + kRowStep * m * kC, 16);
        } else {
#pragma unroll
          for (int m = 0; m < 32 / kRowStep; ++m) {
            const int rr = crow + kRowStep * m;
            const int qi = i0 + 4 * bw + (rr >> 3), kj = j0 + (rr & 7);
            const bool ok = qi < N && kj < N;
            const ZT* src = zg + ((static_cast<size_t>(b) * N + qi) * N + kj) * kC + chunk * kElems;
            cp_async16(dst + kRowStep * m * kZPitch, ok ? src : zg, ok ? 16 : 0);
          }
        }
      }
      cp_async_commit();
    };
    // The biases of tile t (in stage t % kZStages) into bias slot t & 1: n-tile qq is query
    // 4 bw + qq's 8 keys, the four n-tiles interleaved (four independent accumulator chains).
    // ldmatrix lane -> pair lane % 8 of the n-tile and a 16-byte column block: (lane / 8) of
    // 32 channels (bf16) or of 16 (fp32: blocks 0, 1 are b0, b1 of one k-step, 2, 3 the next).
    auto bias_tile = [&](int t) {
      const ZT* zt = zs + ((t % kZStages) * kPairs + 32 * bw + (lane & 7)) * kZPitch +
                     (lane >> 3) * (16 / sizeof(ZT));
      float acc[4][4] = {};
      if constexpr (kBf16) {
#pragma unroll
        for (int kq = 0; kq < kC / 32; ++kq) {
#pragma unroll
          for (int qq = 0; qq < 4; ++qq) {
            uint32_t zb[4];  // B fragments of k-steps 2 kq (zb[0], zb[1]) and 2 kq + 1 (zb[2], zb[3])
            ldmatrix_x4(zb, zt + qq * 8 * kZPitch + 32 * kq);
#pragma unroll
            for (int s2 = 0; s2 < 2; ++s2) {
              const int s = 2 * kq + s2;
#pragma unroll
              for (int part = 1; part >= 0; --part)  // W's lo part first: the small products
                mma_bf16(acc[qq], wa[part][s][0], wa[part][s][1], wa[part][s][2], wa[part][s][3],
                         zb[2 * s2], zb[2 * s2 + 1]);
            }
          }
        }
      } else {
        // W_b's A fragments by ldmatrix: lane -> head (lane % 8) + 8 ((lane / 8) % 2), columns
        // 4 (lane / 16) .. + 3 of the k-step's 8
        const float* wrow = ws + ((lane & 7) + 8 * ((lane >> 3) & 1)) * kZPitch + 4 * (lane >> 4);
#pragma unroll 2
        for (int kq = 0; kq < kC / 16; ++kq) {  // two k-steps of 8 channels
          uint32_t zb[4][4];
#pragma unroll
          for (int qq = 0; qq < 4; ++qq) ldmatrix_x4(zb[qq], zt + qq * 8 * kZPitch + 16 * kq);
#pragma unroll
          for (int s2 = 0; s2 < 2; ++s2) {
            uint32_t whi[4], wlo[4];
            ldmatrix_x4(whi, wrow + 16 * kq + 8 * s2);
            ldmatrix_x4(wlo, wrow + kMmaHeads * kZPitch + 16 * kq + 8 * s2);
#pragma unroll
            for (int qq = 0; qq < 4; ++qq)
              mma_f32<true>(acc[qq], whi, wlo, __uint_as_float(zb[qq][2 * s2]),
                            __uint_as_float(zb[qq][2 * s2 + 1]));
          }
        }
      }
      float* sbo = sb + (t & 1) * H * kSbPitch + (4 * bw) * kBN + 2 * u;
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {
        if (g < H)
          *reinterpret_cast<float2*>(sbo + g * kSbPitch + qq * kBN) = make_float2(acc[qq][0], acc[qq][1]);
        if (g + 8 < H)
          *reinterpret_cast<float2*>(sbo + (g + 8) * kSbPitch + qq * kBN) =
              make_float2(acc[qq][2], acc[qq][3]);
      }
    };
#pragma unroll 1
    for (int t = 0; t < kZStages; ++t) issue_z(t);
    if (ntiles > 0) {
      cp_async_wait<kZStages - 1>();  // tile 0 landed (this thread's copies) ...
      __syncwarp();                   // ... and the warp's: each warp reads only its own rows
      bias_tile(0);
      __syncwarp();
    }
    issue_z(kZStages);
    __syncthreads();  // bias tile 0 published
#pragma unroll 1
    for (int it = 0; it < ntiles; ++it) {
      if (it + 1 < ntiles) {
        cp_async_wait<kZStages - 1>();
        __syncwarp();
        bias_tile(it + 1);
        __syncwarp();  // the stage is read: refill it
      }
      issue_z(it + 1 + kZStages);
      __syncthreads();  // bias tile it + 1 published; tile it's slot free
    }
    cp_async_wait<0>();
    return;
  }

  // ================= attention warps: warp h <-> head h =================
  const int h = warp;
  const size_t head_row0 = (static_cast<size_t>(b) * H + h) * N;
  auto issue_kv = [&](int t) {  // tile t's k and v rows of head h into stage t % kKvStages
    if (t < ntiles) {
      const int j0 = (tile_begin + t) * kBN;
      const int nk = min(kBN, N - j0);
      float* kd = kvs + ((t % kKvStages) * H + h) * kKvHead;
      float* vd = kd + kBN * kWq;
      const float* ks = a.k + (head_row0 + j0) * kWq;
      const float* vs = a.v + (head_row0 + j0) * kWv;
      constexpr int kKChunks = kBN * kWq / 4, kVChunks = kBN * kWv / 4;  // 16-byte chunks a tile
      if (nk == kBN) {
        // A whole tile (all but the last): chunk c = lane + 32 m at fixed offsets from this
        // lane's first, no bounds checks (~39 instructions instead of ~105; the checked copies'
        // address registers, rewritten while their cp.async still held them, drew ~1/4 of the
        // bf16 attention loop's stall samples, but other warps' issue hid them: see the z copy
        // above for the measured effect). v's shared rows are kVPitch = kWv + 4 floats apart:
        // chunk c lands at 4 c + 4 (c / (kWv / 4)).
#pragma unroll
        for (int m = 0; m < (kKChunks + 31) / 32; ++m)
          if (m < kKChunks / 32 || lane < kKChunks % 32)
            cp_async16(kd + 4 * lane + 128 * m, ks + 4 * lane + 128 * m, 16);
#pragma unroll
        for (int m = 0; m < (kVChunks + 31) / 32; ++m) {
          const int c = lane + 32 * m;
          if (m < kVChunks / 32 || lane < kVChunks % 32)
            cp_async16(vd + 4 * c + 4 * (c / (kWv / 4)), vs + 4 * lane + 128 * m, 16);
        }
      } else {
#pragma unroll
        for (int c = lane; c < kKChunks; c += 32) {  // k rows: contiguous on both sides
          const bool ok = c < nk * (kWq / 4);
          cp_async16(kd + 4 * c, ok ? ks + 4 * c : ks, ok ? 16 : 0);
        }
#pragma unroll
        for (int c = lane; c < kVChunks; c += 32) {  // v rows: pitch kVPitch in shared memory
          const int row = c / (kWv / 4), cc = c % (kWv / 4);
          const bool ok = row < nk;
          cp_async16(vd + row * kVPitch + 4 * cc, ok ? vs + row * kWv + 4 * cc : vs, ok ? 16 : 0);
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll 1
  for (int t = 0; t < kKvStages; ++t) issue_kv(t);

  // Lane (g, u) owns query rows i0 + g and i0 + g + 8 (clamped into N for the loads; rows past N
  // compute finite values that are not stored).
  const int row0 = i0 + g, row1 = i0 + g + 8;
  // Q's A fragments, hi and lo (q.k is 3xTF32 for both z dtypes): (row g | g + 8, d = 8u + 2s |
  // 8u + 2s + 1)
  uint32_t qa[2][kD / 8][4];
  // The query points of this head's 16 rows in shared memory (qps, [kQT][kPts]): in registers
  // they would not fit beside Q's parts under 128.
  float* qps = ws + (kBf16 ? 0 : 2 * kMmaHeads * kZPitch) + h * kQT * kPts;
  {
    const float* q0 = a.q + (head_row0 + min(row0, N - 1)) * kWq;
    const float* q1 = a.q + (head_row0 + min(row1, N - 1)) * kWq;
    float x0[8], x1[8];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float4 f0 = ld_global4(q0 + 8 * u + 4 * c), f1 = ld_global4(q1 + 8 * u + 4 * c);
      x0[4 * c] = f0.x; x0[4 * c + 1] = f0.y; x0[4 * c + 2] = f0.z; x0[4 * c + 3] = f0.w;
      x1[4 * c] = f1.x; x1[4 * c + 1] = f1.y; x1[4 * c + 2] = f1.z; x1[4 * c + 3] = f1.w;
    }
#pragma unroll
    for (int s = 0; s < kD / 8; ++s) {
      const float x[4] = {x0[2 * s], x1[2 * s], x0[2 * s + 1], x1[2 * s + 1]};
#pragma unroll
      for (int r = 0; r < 4; ++r) split_tf32(x[r], qa[0][s][r], qa[1][s][r]);
    }
    if (u < kPts / 4) {  // lane (g, u) copies chunk u of rows g and g + 8
      *reinterpret_cast<float4*>(qps + g * kPts + 4 * u) = ld_global4(q0 + kD + 4 * u);
      *reinterpret_cast<float4*>(qps + (g + 8) * kPts + 4 * u) = ld_global4(q1 + kD + 4 * u);
    }
  }
  const float pwh = a.pw[h];
  float acc[kWv / 8][4];  // O's fragments: (row g | g + 8, column 8 n + 2u (+1))
#pragma unroll
  for (int n = 0; n < kWv / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // per row; l: this lane's keys
  if constexpr (!kBf16) __syncthreads();                     // the bias warps' W_b parts complete
  __syncthreads();  // bias tile 0 published

#pragma unroll 1
  for (int it = 0; it < ntiles; ++it) {
    const int j0 = (tile_begin + it) * kBN;
    cp_async_wait<kKvStages - 1>();
    __syncwarp();
    const float* kt = kvs + ((it % kKvStages) * H + h) * kKvHead;
    const float* vt = kt + kBN * kWq;
    // S = Q K^T: lane (g, u) holds S[g][2u], S[g][2u+1], S[g+8][2u], S[g+8][2u+1]
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    {
      const float4 k0 = ld_shared4(kt + g * kWq + 8 * u), k1 = ld_shared4(kt + g * kWq + 8 * u + 4);
      const float kr[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
#pragma unroll
      for (int st = 0; st < kD / 8; ++st)
        mma_f32<true>(s, qa[0][st], qa[1][st], kr[2 * st], kr[2 * st + 1]);
    }
    // + point weight x squared distance (direct, fp32) + bias; keys past N masked
    {
      float dist[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float* kp = kt + (2 * u + e) * kWq + kD;
#pragma unroll
        for (int c = 0; c < kPts / 4; ++c) {
          const float4 kk = ld_shared4(kp + 4 * c);
          const float kc[4] = {kk.x, kk.y, kk.z, kk.w};
          const float4 f0 = ld_shared4(qps + g * kPts + 4 * c);
          const float4 f1 = ld_shared4(qps + (g + 8) * kPts + 4 * c);
          const float q0c[4] = {f0.x, f0.y, f0.z, f0.w}, q1c[4] = {f1.x, f1.y, f1.z, f1.w};
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            const float d0 = q0c[x] - kc[x], d1 = q1c[x] - kc[x];
            dist[e] = fmaf(d0, d0, dist[e]);
            dist[2 + e] = fmaf(d1, d1, dist[2 + e]);
          }
        }
      }
      const float* sbh = sb + ((it & 1) * H + h) * kSbPitch;
      const float2 b0 = *reinterpret_cast<const float2*>(sbh + g * kBN + 2 * u);
      const float2 b1 = *reinterpret_cast<const float2*>(sbh + (g + 8) * kBN + 2 * u);
      const bool ok0 = j0 + 2 * u < N, ok1 = j0 + 2 * u + 1 < N;
      s[0] = ok0 ? b0.x + fmaf(pwh, dist[0], s[0]) : -INFINITY;
      s[1] = ok1 ? b0.y + fmaf(pwh, dist[1], s[1]) : -INFINITY;
      s[2] = ok0 ? b1.x + fmaf(pwh, dist[2], s[2]) : -INFINITY;
      s[3] = ok1 ? b1.y + fmaf(pwh, dist[3], s[3]) : -INFINITY;
    }
    // online softmax; P's A fragment (bf16 z: rounded to TF32, and summed as rounded; fp32 z:
    // hi + lo, exact)
    float alpha0, alpha1, p[4];
    online_softmax_step(s, m0, m1, alpha0, alpha1, p);
    uint32_t pa[2][4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if constexpr (kBf16) pa[0][r] = pa[1][r] = tf32_round(p[r]);  // summed as rounded
      else split_tf32(p[r], pa[0][r], pa[1][r]);
    }
    if constexpr (kBf16) {
      l0 = fmaf(l0, alpha0, __uint_as_float(pa[0][0]) + __uint_as_float(pa[0][2]));
      l1 = fmaf(l1, alpha1, __uint_as_float(pa[0][1]) + __uint_as_float(pa[0][3]));
    } else {
      l0 = fmaf(l0, alpha0, p[0] + p[2]);
      l1 = fmaf(l1, alpha1, p[1] + p[3]);
    }
    const float* v0 = vt + 2 * u * kVPitch + g;  // B: V[key 2u][8 n + g], V[key 2u + 1][8 n + g]
#pragma unroll
    for (int n = 0; n < kWv / 8; ++n) {  // the tile's P V fresh, then acc alpha + P V (round to nearest)
      float pv[4];
      mma_f32<!kBf16, true>(pv, pa[0], pa[1], v0[8 * n], v0[kVPitch + 8 * n]);
      acc[n][0] = fmaf(acc[n][0], alpha0, pv[0]);
      acc[n][1] = fmaf(acc[n][1], alpha0, pv[1]);
      acc[n][2] = fmaf(acc[n][2], alpha1, pv[2]);
      acc[n][3] = fmaf(acc[n][3], alpha1, pv[3]);
    }
    __syncwarp();  // every lane is done with this stage's k/v rows before they are refilled
    issue_kv(it + kKvStages);
    __syncthreads();  // this bias slot is read; the next tile's is published
  }
  cp_async_wait<0>();

  // ---- epilogue: the row sums over the quad, then (g | g + 8, 8 n + 2u (+1)) ----
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = half ? row1 : row0;
    if (i >= N) continue;
    const float m = half ? m1 : m0, l = half ? l1 : l0;
    const size_t row = head_row0 + i;
    if (a.splits == 1) {
      const float inv = 1.f / l;
      float* orow = a.out + ((static_cast<size_t>(b) * N + i) * H + h) * kWv + 2 * u;
#pragma unroll
      for (int n = 0; n < kWv / 8; ++n)
        *reinterpret_cast<float2*>(orow + 8 * n) =
            make_float2(acc[n][2 * half] * inv, acc[n][2 * half + 1] * inv);
    } else {
      const size_t rows = static_cast<size_t>(a.B) * H * N;
      float* prow = a.part + (split * rows + row) * kWv + 2 * u;
#pragma unroll
      for (int n = 0; n < kWv / 8; ++n)
        *reinterpret_cast<float2*>(prow + 8 * n) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
      if (u == 0) {
        float* ml = a.part + a.splits * rows * kWv + (split * rows + row) * 2;
        ml[0] = m;
        ml[1] = l;
      }
    }
  }
}

}  // namespace

size_t af2_tc_smem_bytes(int H, bool z_bf16) {
  return z_bf16 ? af2tc::smem_bytes<__nv_bfloat16>(H) : af2tc::smem_bytes<float>(H);
}

FusedKernelFn af2_tc_kernel(bool z_bf16) {
  return z_bf16 ? ipa_fused_af2_tc_kernel<__nv_bfloat16> : ipa_fused_af2_tc_kernel<float>;
}

}  // namespace ipa
