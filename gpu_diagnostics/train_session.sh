#!/usr/bin/env bash
# One device call for the training variants (issue #16): their GPU tests, the training-step
# benchmark to N = 4096 with each custom op alone, then the `training` preset for triton-train
# and torch-compile, each stage under its own limit (LIM_TEST, LIM_BENCH, LIM_SWEEP seconds).
# Writes gpu-tests.log, bench.log, sweep.log, report.md and the sweep (results.csv,
# metadata.json, gradients.jsonl) in $OUT/training: 7 files, under the device's 8.
#
#   OUT=DIR bash gpu_diagnostics/train_session.sh
source gpu_diagnostics/session_env.sh
timeout -s INT "${LIM_TEST:-200}" python3 -m pytest -q -m gpu tests/test_triton_backward.py \
    -p no:cacheprovider -rfE --tb=short 2>&1 | tail -40 > "$OUT/gpu-tests.log"
timeout -s INT "${LIM_BENCH:-150}" python3 tests/test_triton_backward.py \
    --lengths 1024 2048 4096 --precisions fp32 bf16 2>&1 | grep -v Warn > "$OUT/bench.log"
timeout -s INT "${LIM_SWEEP:-220}" python3 -m harness.cli sweep --preset training --device cuda \
    -o "$OUT/training" --no-plots --no-progress --variant triton-train \
    --variant torch-compile > "$OUT/sweep.log" 2>&1
python3 -m harness.cli report "$OUT/training/results.csv" > "$OUT/report.md" 2>&1
rm -f "$OUT/training/.ipa-bench.lock"
tail -5 "$OUT/gpu-tests.log"; cat "$OUT/bench.log"; head -40 "$OUT/report.md"
