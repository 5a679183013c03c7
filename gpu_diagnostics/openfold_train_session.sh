#!/usr/bin/env bash
# One device call for problem openfold's training step (issue #18, deliverable 6): `triton-bias`
# (custom op with the backward of variants/openfold/bias_backward.py) against torch-compile.
# Each stage under its own limit (LIM_TEST, LIM_PROF per profile, LIM_SWEEP seconds;
# 170 + 2 x 60 + 270 s < 10 min):
#   1. the GPU tests of triton-bias's training step in 4 processes (`sharded_pytest`);
#   2. torch.profiler on one training step at N = 4096 in fp32 and bf16 (time per kernel, each
#      autotuned kernel's configs with their times);
#   3. a training sweep of triton-bias and torch-compile: N = 4096 first (issue #18's scaled
#      targets: fp32 <= 17 ms, bf16 <= 8 ms, d z + 1 GiB), then 2048 and 1024, eager, and
#      replayed at N = 1024.
# Writes gpu-tests.log, profile.log, sweep.log, report.md, results.csv, metadata.json and
# gradients.jsonl in $OUT: 7 files, under the device's 8.
#
#   OUT=DIR bash gpu_diagnostics/openfold_train_session.sh
source gpu_diagnostics/session_env.sh
sharded_pytest 4 "${LIM_TEST:-170}" "$OUT/gpu-tests.log" -m gpu tests/test_openfold_triton.py \
    -k "triton_bias or protocol"
for precision in fp32 bf16; do
    timeout -s INT "${LIM_PROF:-60}" python3 gpu_diagnostics/profile_call.py 4096 "$precision" \
        triton-bias --problem openfold --pass forward+backward
done > "$OUT/profile.log" 2>&1
grid=$(mktemp --suffix .toml)
printf '[base]\nproblem = "openfold"\nmodes = ["eager", "graph"]\ngraph_max_length = 1024
seeds = 2\nbudget_s = 0.5\npasses = ["forward+backward"]\n\n[[slice]]\nlength = [4096]\n
[[slice]]\nlength = [2048, 1024]\n' > "$grid"
timeout -s INT "${LIM_SWEEP:-270}" python3 -m harness.cli sweep --grid "$grid" --device cuda \
    -o "$OUT/training" --no-plots --no-progress --variant triton-bias \
    --variant torch-compile > "$OUT/sweep.log" 2>&1
python3 -m harness.cli report "$OUT/training/results.csv" > "$OUT/report.md" 2>&1
mv "$OUT"/training/{results.csv,metadata.json,gradients.jsonl} "$OUT/" 2>/dev/null
rm -rf "$OUT/training"
grep -E "_kernel " "$OUT/profile.log"; head -40 "$OUT/report.md"
exit 0
