#!/usr/bin/env bash
# One device call for the twenty-third session's two changes (docs/perf-notes.md):
# 1. `triton`'s fp32 projections as 3xTF32 Triton GEMMs (`variants/triton/linear.py`): their
#    GPU tests and the variant's fp32 oracle tests (LIM_TEST); an A/B of CUDA-graph replays,
#    `pipeline.LINEAR_3XTF32` off and on, at N = 256, 1024, 4096 (LIM_AB each); the kernels of
#    the fp32 forward at N = 1024 (LIM_PROF);
# 2. the timing's busy host (`TimingPolicy.host_spin_ms`): its GPU test, `--host-states` at
#    N = 256 and 1024 in bf16 (LIM_HOST each), and a sweep of `triton`'s forward at N = 256 and
#    1024, eager and replayed, fp32 and bf16 (LIM_SWEEP), whose eager rows now time a busy host.
# Writes each stage's log and summary.md under $OUT.
#
#   OUT=DIR bash gpu_diagnostics/projections_session.sh
source gpu_diagnostics/session_env.sh
timeout -s INT "${LIM_TEST:-150}" python3 -m pytest -q -p no:cacheprovider -m gpu -rfEpxX \
    tests/test_triton.py tests/test_integrity.py \
    -k "linear_3xtf32 or (test_matches_oracle_gpu and triton-fp32) or busy_host or tiny_launches" \
    > "$OUT/gpu-tests.log" 2>&1
for n in 256 1024 4096; do
    timeout -s INT "${LIM_AB:-60}" python3 gpu_diagnostics/profile_call.py "$n" fp32 triton \
        --pass forward --ab variants.triton.pipeline:LINEAR_3XTF32 --latency --graph \
        > "$OUT/ab-linear-$n.log" 2>&1
done
timeout -s INT "${LIM_PROF:-30}" python3 gpu_diagnostics/profile_call.py 1024 fp32 triton \
    --pass forward > "$OUT/kernels-1024-fp32.log" 2>&1
for n in 256 1024; do
    timeout -s INT "${LIM_HOST:-40}" python3 gpu_diagnostics/profile_call.py "$n" bf16 triton \
        --pass forward --host-states > "$OUT/host-states-$n.log" 2>&1
done
grid=$(mktemp --suffix .toml)
printf '[base]\nmodes = ["eager", "graph"]\nseeds = 2\nbudget_s = 0.5\n
[[slice]]\nlength = [256, 1024]\n' > "$grid"
timeout -s INT "${LIM_SWEEP:-100}" python3 -m harness.cli sweep --grid "$grid" --device cuda \
    -o "$OUT/sweep" --no-plots --no-progress --variant triton > "$OUT/sweep.log" 2>&1
rm -f "$OUT/sweep/.ipa-bench.lock"
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    echo "## GPU tests"; grep -E "^(PASSED|FAILED|ERROR|XFAIL)|passed|failed" "$OUT/gpu-tests.log"
    for n in 256 1024 4096; do
        echo "## A/B replayed, fp32 N = $n"; grep -E "LINEAR|linear_3xtf32" "$OUT/ab-linear-$n.log"
    done
    echo "## kernels, fp32 N = 1024"
    sed -n '/Self CUDA %/,/Self CUDA time total/p' "$OUT/kernels-1024-fp32.log" | head -16 \
        | cut -c1-60,150-200
    for n in 256 1024; do echo "## host states, bf16 N = $n"; cat "$OUT/host-states-$n.log"; done
    echo "## sweep"
    python3 -c 'import sys; from harness.results import read_results
df = read_results(sys.argv[1])
print(df[["dtype", "mode", "length", "median_ms", "host_ms", "status", "err_ratio",
          "kernel"]].to_string(index=False, max_colwidth=70))' "$OUT/sweep/results.csv"
} > "$OUT/summary.md" 2>&1
cat "$OUT/summary.md"
