#!/usr/bin/env bash
# One device call for the Triton forwards' O(N) work (issue #17, small N): the GPU tests of
# the forward-only Triton variants, `kernel_bench.py simplified` (triton-pairdot per config,
# its O(N) part and the kernels one forward launches), a sweep along N (256, 1024, 2048,
# 4096; eager, and CUDA-graph replay to N = 1024) of triton and triton-pairdot and its report,
# then one training step of triton-train at N = 1024 in fp32 under torch.profiler (issue #16:
# where the replayed step's 2.9 ms go), and last docs/repro/torch_compile_masked_softmax.py
# (issue #18: Inductor's NaN on masked rows in bf16). Each stage runs under its own limit
# (LIM_TEST, LIM_BENCH, LIM_SWEEP, LIM_PROF seconds; 150 + 100 + 230 + 60 + 60 s).
# Writes gpu-tests.log, bench.log, sweep.log, report.md, results.csv, metadata.json,
# train-profile.log, masked-softmax.log in $OUT: 8 files, the device's limit.
#
#   OUT=DIR bash gpu_diagnostics/forward_session.sh
source gpu_diagnostics/session_env.sh
timeout -s INT "${LIM_TEST:-150}" python3 -m pytest -q -m gpu tests/test_variants.py \
    -k "triton and not train" -p no:cacheprovider -rfE --tb=short 2>&1 | tail -30 \
    > "$OUT/gpu-tests.log"
timeout -s INT "${LIM_BENCH:-100}" python3 gpu_diagnostics/kernel_bench.py simplified \
    --lengths 1024 4096 2>&1 | grep -v Warn > "$OUT/bench.log"
grid=$(mktemp --suffix .toml)
printf '[base]\nmodes = ["eager", "graph"]\ngraph_max_length = 1024\nseeds = 2\nbudget_s = 0.5\n\n[[slice]]\nlength = [256, 1024, 2048, 4096]\n' > "$grid"
timeout -s INT "${LIM_SWEEP:-230}" python3 -m harness.cli sweep --grid "$grid" --device cuda \
    -o "$OUT/sweep" --no-plots --no-progress --variant triton --variant triton-pairdot \
    > "$OUT/sweep.log" 2>&1
timeout -s INT 20 python3 -m harness.cli report "$OUT/sweep/results.csv" > "$OUT/report.md" 2>&1
mv "$OUT/sweep/results.csv" "$OUT/sweep/metadata.json" "$OUT/" 2>/dev/null
rm -rf "$OUT/sweep"
timeout -s INT "${LIM_PROF:-60}" python3 gpu_diagnostics/profile_call.py 1024 fp32 triton-train \
    > "$OUT/train-profile.log" 2>&1
timeout -s INT 60 python3 docs/repro/torch_compile_masked_softmax.py > "$OUT/masked-softmax.log" 2>&1
tail -5 "$OUT/gpu-tests.log"
cat "$OUT/bench.log"
head -90 "$OUT/report.md"
head -24 "$OUT/train-profile.log"
cat "$OUT/masked-softmax.log"
exit 0
