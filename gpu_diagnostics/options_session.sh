#!/usr/bin/env bash
# One device call for the `triton` forward's options and defaults (issue #17: the key split,
# fp32 attention dots as 3xTF32 or IEEE, 16-bit point dots as TF32 or 3xBF16) and triton-train,
# whose forward shares the attention kernel and whose backward's fp32 dots are tf32x3 (#16),
# each stage under its own limit (LIM_TEST, LIM_BENCH, LIM_SPLIT, LIM_SWEEP seconds;
# 270 + 60 + 80 + 130 s):
#   1. the GPU tests of every Triton variant against the float64 oracle, in 4 processes
#      (`sharded_pytest`): the registry's (tests/test_variants.py), the forward's options
#      (tests/test_triton.py) and triton-train's gradients (tests/test_triton_backward.py);
#   2. triton-train's training step and custom op alone at N = 1024 and 4096 in fp32;
#   3. `tests/test_triton.py --sections split`: the forward replayed as a CUDA graph per split
#      (1-4 and the default) and per dot form (fp32: attention dots IEEE or 3xTF32; 16-bit:
#      point dots TF32 or 3xBF16, `triton_ipa(half_points=)`);
#   4. a sweep of `triton` along N (256, 1024, 2048, 4096; eager, and replayed to N = 1024).
# Writes gpu-tests.log, train-bench.log, bench.log, sweep.log, report.md, results.csv,
# metadata.json in $OUT: 7 files, under the device's 8.
#
#   OUT=DIR bash gpu_diagnostics/options_session.sh
source gpu_diagnostics/session_env.sh
sharded_pytest 4 "${LIM_TEST:-270}" "$OUT/gpu-tests.log" -m gpu tests/test_triton.py \
    tests/test_variants.py tests/test_triton_backward.py -k triton
timeout -s INT "${LIM_BENCH:-60}" python3 tests/test_triton_backward.py --lengths 1024 4096 \
    --precisions fp32 --variants triton-train --baselines 2>&1 | grep -v Warn \
    > "$OUT/train-bench.log"
timeout -s INT "${LIM_SPLIT:-80}" python3 tests/test_triton.py --sections split \
    --lengths 256 512 1024 2048 4096 --precisions fp32 bf16 2>&1 | grep -v Warn > "$OUT/bench.log"
grid=$(mktemp --suffix .toml)
printf '[base]\nmodes = ["eager", "graph"]\ngraph_max_length = 1024\nseeds = 2\nbudget_s = 0.5\n\n[[slice]]\nlength = [256, 1024, 2048, 4096]\n' > "$grid"
timeout -s INT "${LIM_SWEEP:-130}" python3 -m harness.cli sweep --grid "$grid" --device cuda \
    -o "$OUT/sweep" --no-plots --no-progress --variant triton > "$OUT/sweep.log" 2>&1
timeout -s INT 20 python3 -m harness.cli report "$OUT/sweep/results.csv" > "$OUT/report.md" 2>&1
mv "$OUT/sweep/results.csv" "$OUT/sweep/metadata.json" "$OUT/" 2>/dev/null
rm -rf "$OUT/sweep"
cat "$OUT/train-bench.log"
cat "$OUT/bench.log"
head -70 "$OUT/report.md"
exit 0
