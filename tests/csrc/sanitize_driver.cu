// Drives the IPA kernels with no torch in the process: the target for compute-sanitizer
// (tests/test_cuda.py::test_compute_sanitizer_clean). Small and ragged shapes (tails in the
// query and the key tiles), every kernel class, float32 and bfloat16 z, one split and forced
// split-K; problem openfold's kernel with masked residues and an odd head count. Operands are
// random: the sanitizer checks accesses, the other GPU tests check values.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -lineinfo -I variants/csrc -o driver \
//        tests/csrc/sanitize_driver.cu variants/csrc/*.cu
//   compute-sanitizer --tool racecheck ./driver fused      (or: hybrid, openfold)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "ipa_kernels.h"

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(2);
  }
}

int round_up(int x, int m) { return (x + m - 1) / m * m; }

std::mt19937 rng(7);

template <typename T>
T* upload(const std::vector<T>& host) {
  T* dev = nullptr;
  check(cudaMalloc(&dev, host.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
        "cudaMemcpy");
  return dev;
}

template <typename T>
T* upload_random(size_t n, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<T> host(n);
  for (auto& x : host) x = static_cast<T>(dist(rng));
  return upload(host);
}

float* device_floats(size_t n) {
  float* dev = nullptr;
  check(cudaMalloc(&dev, (n ? n : 1) * sizeof(float)), "cudaMalloc");
  return dev;
}

struct Shape {
  int B, N, H, C, d, Qp, Vp;
};

// Operand widths as variants/cuda_ext.py's Widths.for_lanes makes them.
struct Widths {
  int dqp, pqp, wv, dv;
  Widths(const Shape& s, int lanes)
      : dqp(round_up(s.d, 4 * lanes)), pqp(round_up(3 * s.Qp, 4 * lanes)),
        wv(round_up(s.d + 3 * s.Vp, 4 * lanes)), dv(s.d + 3 * s.Vp) {}
};

void run_fused(const Shape& s, int klass, bool z_bf16, int splits, int bias = ipa::kFfmaBias) {
  const ipa::FusedClassLimits lim = ipa::fused_class_limits(klass);
  const Widths w(s, lim.lanes_per_row);
  const int wq = w.dqp + w.pqp;
  const size_t rows = static_cast<size_t>(s.B) * s.H * s.N;
  const size_t zn = static_cast<size_t>(s.B) * s.N * s.N * s.C;
  ipa::FusedPlan plan;
  check(ipa::fused_plan(klass, z_bf16, s.B, s.N, s.H, s.C, wq, w.wv, splits, &plan, bias),
        "fused_plan");
  ipa::FusedArgs a{};
  a.q = upload_random<float>(rows * wq, 1.f);
  a.k = upload_random<float>(rows * wq, 1.f);
  a.v = upload_random<float>(rows * w.wv, 1.f);
  a.z = z_bf16 ? static_cast<const void*>(upload_random<__nv_bfloat16>(zn, 1.f))
               : static_cast<const void*>(upload_random<float>(zn, 1.f));
  a.wb = upload_random<float>(static_cast<size_t>(s.H) * s.C, 0.1f);
  a.pw = upload_random<float>(s.H, 0.1f);
  a.out = device_floats(static_cast<size_t>(s.B) * s.N * s.H * w.dv);
  a.part = device_floats(plan.workspace_floats);
  a.B = s.B, a.N = s.N, a.H = s.H, a.C = s.C;
  a.wq = wq, a.dqp = w.dqp, a.wv = w.wv, a.dv = w.dv;
  check(ipa::fused_launch(a, plan, nullptr), "fused_launch");
  check(cudaDeviceSynchronize(), "fused kernel");
  std::printf("fused klass=%d bias=%d z_bf16=%d B=%d N=%d H=%d splits=%d: ok\n", klass, bias,
              z_bf16, s.B, s.N, s.H, plan.splits);
  // the same call ending in the finish: merging the partials (2 splits) or after the combine
  if (plan.splits > 1) {
    const size_t residues = static_cast<size_t>(s.B) * s.N;
    ipa::FinishArgs f{};
    f.attended = a.out;
    f.rot = upload_random<float>(residues * 9, 1.f);
    f.trans = upload_random<float>(residues * 3, 1.f);
    f.out = device_floats(residues * s.H * w.dv);
    f.B = s.B, f.N = s.N, f.H = s.H, f.d = s.d, f.vp = s.Vp, f.pitch = w.dv;
    f.out_kind = f.frame_kind = ipa::kFloat32Values;
    check(ipa::fused_launch(a, plan, nullptr, &f), "fused_launch with finish");
    check(cudaDeviceSynchronize(), "fused kernel and finish");
    std::printf("  with the finish (%s): ok\n", plan.splits == 2 ? "merging" : "after the combine");
    for (const void* p : {f.rot, f.trans, static_cast<const void*>(f.out)})
      check(cudaFree(const_cast<void*>(p)), "cudaFree");
  }
  for (const void* p : {static_cast<const void*>(a.q), static_cast<const void*>(a.k),
                        static_cast<const void*>(a.v), a.z, static_cast<const void*>(a.wb),
                        static_cast<const void*>(a.pw), static_cast<const void*>(a.out),
                        static_cast<const void*>(a.part)})
    check(cudaFree(const_cast<void*>(p)), "cudaFree");
}

void run_hybrid(const Shape& s, bool bias_bf16) {
  const Widths w(s, 1);
  const int wq = w.dqp + w.pqp;
  const size_t rows = static_cast<size_t>(s.B) * s.H * s.N;
  const size_t nn = rows * s.N;
  ipa::HybridArgs a{};
  a.q = upload_random<float>(rows * wq, 1.f);
  a.k = upload_random<float>(rows * wq, 1.f);
  a.bias = bias_bf16 ? static_cast<const void*>(upload_random<__nv_bfloat16>(nn, 1.f))
                     : static_cast<const void*>(upload_random<float>(nn, 1.f));
  a.pw = upload_random<float>(s.H, 0.1f);
  a.probs = device_floats(nn);
  a.B = s.B, a.N = s.N, a.H = s.H, a.wq = wq, a.dqp = w.dqp;
  check(ipa::hybrid_launch(a, bias_bf16, nullptr), "hybrid_launch");
  check(cudaDeviceSynchronize(), "hybrid kernel");
  std::printf("hybrid bias_bf16=%d B=%d N=%d H=%d: ok\n", bias_bf16, s.B, s.N, s.H);
  for (const void* p : {static_cast<const void*>(a.q), static_cast<const void*>(a.k), a.bias,
                        static_cast<const void*>(a.pw), static_cast<const void*>(a.probs)})
    check(cudaFree(const_cast<void*>(p)), "cudaFree");
}

// Problem openfold's kernel at OpenFold's sizes (c_hidden 16, 4 / 8 points, c_z 128), operands
// as variants/openfold/cuda_fused.py lays them out: k and v padded to whole key tiles, linear_out's
// input `cat` with o first and o_pair last, a residue mask with every third residue masked.
void run_openfold(int B, int N, int H, bool z_bf16, bool pair_halves = false) {
  constexpr int kC = 128, kWq = 28, kWv = 44, kPv = 8;
  const int n_pad = round_up(N, ipa::kOpenFoldKeyTile), wk = z_bf16 ? 44 : kWq;
  const int features = H * (16 + 4 * kPv + kC);  // [o | the points' columns | o_pair]
  std::vector<float> mask(static_cast<size_t>(B) * N);
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = i % 3 == 2 ? 0.f : 1.f;
  ipa::OpenFoldArgs a{};
  a.q = upload_random<float>(static_cast<size_t>(B) * H * N * kWq, 1.f);
  a.k = upload_random<float>(static_cast<size_t>(B) * H * n_pad * wk, 1.f);
  a.v = upload_random<float>(static_cast<size_t>(B) * H * n_pad * kWv, 1.f);
  const size_t zn = static_cast<size_t>(B) * N * N * kC;
  a.z = z_bf16 ? static_cast<const void*>(upload_random<__nv_bfloat16>(zn, 1.f))
               : static_cast<const void*>(upload_random<float>(zn, 1.f));
  a.wb = upload_random<float>(static_cast<size_t>(H) * kC, 0.1f);
  a.pw = upload_random<float>(H, 0.1f);
  a.mask = upload(mask);
  a.cat = device_floats(static_cast<size_t>(B) * N * features);
  a.o_pt = device_floats(static_cast<size_t>(B) * N * H * 3 * kPv);
  a.B = B, a.N = N, a.H = H, a.cat_pitch = features, a.pair_offset = features - H * kC;
  a.attending = ipa::openfold_roles(H, z_bf16, true);
  a.pair_halves = pair_halves;
  a.q_scale = 0.25f;
  a.inf2 = 1e5f * 1.4426950408889634f;
  check(ipa::openfold_launch(a, z_bf16, nullptr), "openfold_launch");
  check(cudaDeviceSynchronize(), "openfold kernel");
  std::printf("openfold z_bf16=%d pair_halves=%d B=%d N=%d H=%d: ok\n", z_bf16, pair_halves, B, N,
              H);
  for (const void* p : {static_cast<const void*>(a.q), static_cast<const void*>(a.k),
                        static_cast<const void*>(a.v), a.z, static_cast<const void*>(a.wb),
                        static_cast<const void*>(a.pw), static_cast<const void*>(a.mask),
                        static_cast<const void*>(a.cat), static_cast<const void*>(a.o_pt)})
    check(cudaFree(const_cast<void*>(p)), "cudaFree");
}

}  // namespace

int main(int argc, char** argv) {
  const char* which = argc == 2 ? argv[1] : "";
  if (std::strcmp(which, "fused") && std::strcmp(which, "hybrid") &&
      std::strcmp(which, "openfold")) {
    std::fprintf(stderr, "usage: %s fused|hybrid|openfold\n", argv[0]);
    return 1;
  }
  const bool fused = std::strcmp(which, "fused") == 0;
  for (const int n : {16, 37}) {
    for (const bool bf16 : {false, true}) {
      const Shape base{2, n, 12, 128, 32, 4, 8};  // AlphaFold2's sizes
      if (std::strcmp(which, "openfold") == 0) {
        run_openfold(2, n, 12, bf16);
        run_openfold(2, n, 5, bf16);  // an odd head: an attention warp's second head unused
        if (!bf16) {                  // the pair warps sharing W_b's loads (named barriers a pair)
          run_openfold(2, n, 12, false, true);
          run_openfold(2, n, 5, false, true);
        }
        continue;
      }
      if (!fused) {
        run_hybrid(base, bf16);
        run_hybrid(Shape{2, n, 3, 72, 24, 16, 16}, bf16);
        continue;
      }
      for (const int klass : {ipa::kFusedAF2, ipa::kFusedSmall}) {
        run_fused(base, klass, bf16, 1);
        run_fused(base, klass, bf16, 3);
      }
      run_fused(Shape{2, n, 10, 128, 32, 4, 8}, ipa::kFusedAF2, bf16, 1);  // key tile of 5
      // the af2 class's tensor-core forms (kMmaPairRows: bf16 z only)
      for (const int bias : {ipa::kMmaPairRows, ipa::kMmaHeadRows, ipa::kTensorCores}) {
        if (!bf16 && bias == ipa::kMmaPairRows) continue;
        run_fused(base, ipa::kFusedAF2, bf16, 1, bias);
        run_fused(Shape{2, n, 10, 128, 32, 4, 8}, ipa::kFusedAF2, bf16, 2, bias);  // merging finish
      }
      run_fused(base, ipa::kFusedGeneric, bf16, 1);
      run_fused(Shape{2, n, 16, 128, 32, 4, 8}, ipa::kFusedGeneric, bf16, 3);
    }
  }
  std::printf("sanitize driver done\n");
  return 0;
}
