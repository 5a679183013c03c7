#!/usr/bin/env bash
# One device call for `triton_ipa(overlap=K)` (issue #17, N = 4096 fp32: the bias GEMM, 2.3 ms
# at the memory's pace, and the latency-bound attention kernel, 1.7 ms, run one after the
# other): its GPU tests (two streams, each range's attention waiting for its bias rows), then
# the forward eager and replayed as a CUDA graph with 1, 2, 4 and 8 ranges at N = 1024, 2048
# and 4096 in fp32 and bf16 (`tests/test_triton.py --sections overlap`). Stage limits LIM_TEST,
# LIM_BENCH (seconds; 200 + 330). Writes gpu-tests.log and bench.log in $OUT.
#
#   OUT=DIR bash gpu_diagnostics/overlap_session.sh
source gpu_diagnostics/session_env.sh
timeout -s INT "${LIM_TEST:-200}" python3 -m pytest -q -m gpu tests/test_triton.py \
    -k "overlapped_rows_match" -p no:cacheprovider -rfE --tb=short \
    > "$OUT/gpu-tests.log" 2>&1
timeout -s INT "${LIM_BENCH:-330}" python3 tests/test_triton.py --sections overlap \
    --lengths 1024 2048 4096 --precisions fp32 bf16 2>&1 | grep -v Warn > "$OUT/bench.log"
tail -5 "$OUT/gpu-tests.log"
cat "$OUT/bench.log"
exit 0
