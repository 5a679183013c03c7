#!/usr/bin/env bash
# One device call for triton-train (issue #16), each stage under its own limit (LIM_TEST,
# LIM_PROF per profile, LIM_BENCH, LIM_SWEEP seconds; 230 + 2 x 70 + 60 + 200):
#   1. its GPU gradient tests in 4 processes (`sharded_pytest`; one process ran past its limit);
#   2. torch.profiler on one fp32 training step at N = 4096 and at N = 1024 (issue #16's
#      1.0 ms cell; the time per kernel, each autotuned kernel's configs with their times);
#   3. the training step and each custom op alone at N = 1024 and 4096 (no baselines);
#   4. a sweep of its training step: N = 4096 first (the cell that ran out of memory on
#      2026-12-04 before the harness freed its oracle's memory between the two processes),
#      then N = 1024 and 256, eager and replayed to N = 1024.
# Writes gpu-tests.log, profile.log, bench.log, sweep.log, report.md, results.csv,
# metadata.json, gradients.jsonl in $OUT: 8 files, the device's limit.
#
#   OUT=DIR bash gpu_diagnostics/train_session.sh
source gpu_diagnostics/session_env.sh
sharded_pytest 4 "${LIM_TEST:-230}" "$OUT/gpu-tests.log" -m gpu tests/test_triton_backward.py \
    -k "triton-train and not fullfuse"
for length in 4096 1024; do
    timeout -s INT "${LIM_PROF:-70}" python3 gpu_diagnostics/profile_call.py "$length" fp32 \
        triton-train
done > "$OUT/profile.log" 2>&1
timeout -s INT "${LIM_BENCH:-60}" python3 tests/test_triton_backward.py --lengths 1024 4096 \
    --precisions fp32 bf16 --variants triton-train --baselines 2>&1 | grep -v Warn \
    > "$OUT/bench.log"
grid=$(mktemp --suffix .toml)
printf '[base]\nmodes = ["eager", "graph"]\ngraph_max_length = 1024\nseeds = 2\nbudget_s = 0.5
passes = ["forward+backward"]\n\n[[slice]]\nlength = [4096]\n\n[[slice]]\nlength = [1024, 256]\n' \
    > "$grid"
timeout -s INT "${LIM_SWEEP:-200}" python3 -m harness.cli sweep --grid "$grid" --device cuda \
    -o "$OUT/training" --no-plots --no-progress --variant triton-train > "$OUT/sweep.log" 2>&1
python3 -m harness.cli report "$OUT/training/results.csv" > "$OUT/report.md" 2>&1
mv "$OUT"/training/{results.csv,metadata.json,gradients.jsonl} "$OUT/" 2>/dev/null
rm -rf "$OUT/training"
cat "$OUT/bench.log"; grep -E "_kernel " "$OUT/profile.log"; head -40 "$OUT/report.md"
exit 0
