#!/usr/bin/env bash
# One device call for what was built after the device time ran out (eighth session, issues
# #16 and #17), each stage under its own limit (LIM_TEST, LIM_TRAIN, LIM_BENCH seconds;
# 180 + 120 + 240 s):
#   1. GPU tests of the `triton` forward's options: the key split (`split`, merged by
#      `variants/triton/merge.py`) and fp32 attention dots as 3xTF32 (`fp32_dots`), against
#      the float64 oracle, and the registered Triton variants' own GPU tests;
#   2. the training variants' Inductor test (now judged against the oracle);
#   3. `tests/test_triton.py --sections split breakdown`: the forward replayed as a CUDA graph
#      per split (1-4) and, in fp32, per attention dot mode; then per N the bias kernel used
#      (Triton, 3xTF32 in fp32) against cuBLAS's, and the attention kernel alone.
# Writes gpu-tests.log, train-tests.log, bench.log in $OUT. The numbers decide the defaults
# of `split` and `fp32_dots` (docs/perf-notes.md, eighth session).
#
#   OUT=DIR bash gpu_diagnostics/options_session.sh
source gpu_diagnostics/session_env.sh
timeout -s INT "${LIM_TEST:-180}" python3 -m pytest -q -m gpu tests/test_triton.py \
    -k "3xtf32 or split_keys or (matches_oracle_gpu and triton-fullfuse)" -p no:cacheprovider \
    -rfE --tb=short 2>&1 | tail -30 > "$OUT/gpu-tests.log"
timeout -s INT "${LIM_TRAIN:-120}" python3 -m pytest -q -m gpu tests/test_triton_backward.py \
    -k inductor -p no:cacheprovider -rfE --tb=short 2>&1 | tail -20 > "$OUT/train-tests.log"
timeout -s INT "${LIM_BENCH:-240}" python3 tests/test_triton.py --sections split breakdown \
    --lengths 256 1024 4096 --precisions fp32 bf16 2>&1 | grep -v Warn > "$OUT/bench.log"
tail -3 "$OUT/gpu-tests.log"; tail -3 "$OUT/train-tests.log"; cat "$OUT/bench.log"
exit 0
