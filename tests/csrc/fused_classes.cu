// Prints the cuda-fused kernel classes as the C++ sees them, as one JSON object, for
// tests/test_cuda.py to compare with variants/cuda_fused.py: the class ids, kMaxPairDim, each
// class's FusedClassLimits, and the class fused_kernel_class picks for each layer read from stdin
// (one "heads head_dim query_points value_points pair_dim" per line; -1 where no class fits).
// Host code only: no CUDA call, so it runs on a machine without a GPU.
//
//   nvcc -std=c++17 -arch=sm_90 -I variants/csrc -o fused_classes tests/csrc/fused_classes.cu \
//        variants/csrc/ipa_fused.cu variants/csrc/ipa_fused_af2.cu \
//        variants/csrc/ipa_fused_af2_tc.cu variants/csrc/ipa_fused_small_generic.cu \
//        variants/csrc/ipa_frames.cu
//   echo "12 32 4 8 128" | ./fused_classes
#include <cstdio>

#include "ipa_kernels.h"

namespace {

void print_limits(int klass, const char* sep) {
  const ipa::FusedClassLimits l = ipa::fused_class_limits(klass);
  std::printf(
      "  \"%d\": {\"lanes_per_row\": %d, \"queries_per_cta\": %d, \"max_heads\": %d, "
      "\"even_heads\": %s, \"max_dqp\": %d, \"max_pqp\": %d, \"max_wv\": %d, \"exact\": %s, "
      "\"pair_dim\": %d}%s\n",
      klass, l.lanes_per_row, l.queries_per_cta, l.max_heads, l.even_heads ? "true" : "false",
      l.max_dqp, l.max_pqp, l.max_wv, l.exact ? "true" : "false", l.pair_dim, sep);
}

}  // namespace

int main() {
  std::printf("{\"class_ids\": {\"small\": %d, \"generic\": %d, \"af2\": %d},\n",
              ipa::kFusedSmall, ipa::kFusedGeneric, ipa::kFusedAF2);
  std::printf("\"bias_ids\": {\"ffma\": %d, \"mma_pair_rows\": %d, \"mma_head_rows\": %d, "
              "\"tensor_cores\": %d},\n",
              ipa::kFfmaBias, ipa::kMmaPairRows, ipa::kMmaHeadRows, ipa::kTensorCores);
  std::printf("\"max_pair_dim\": %d,\n\"limits\": {\n", ipa::kMaxPairDim);
  print_limits(ipa::kFusedSmall, ",");
  print_limits(ipa::kFusedGeneric, ",");
  print_limits(ipa::kFusedAF2, "");
  std::printf("},\n\"picks\": [");
  int h, d, qp, vp, c, n = 0;
  while (std::scanf("%d %d %d %d %d", &h, &d, &qp, &vp, &c) == 5) {
    std::printf("%s\n  [%d, %d, %d, %d, %d, %d]", n++ ? "," : "", h, d, qp, vp, c,
                ipa::fused_kernel_class(h, d, qp, vp, c));
  }
  std::printf("\n]}\n");
  return 0;
}
