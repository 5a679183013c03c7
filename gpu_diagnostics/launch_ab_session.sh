#!/usr/bin/env bash
# One device call on the twenty-second session's open questions (docs/perf-notes.md):
# 1. did DirectLaunch cost triton-train's N = 4096 step 4-12 % on the H100? An A/B in one
#    process, `launch.ENABLED` off and on, fp32 and bf16 (LIM_AB seconds each);
# 2. why does the eager `triton` forward's host time grow from N = 256 to 1024? `--host` at both
#    (LIM_HOST each);
# 3. where the fp32 forward at N = 256 spends its GPU time, against bf16's (#17's 2.0x miss at
#    N = 256 in fp32): the kernels under torch.profiler (LIM_PROF each).
# Each stage writes its log under $OUT; summary.md collects the headlines.
#
#   OUT=DIR bash gpu_diagnostics/launch_ab_session.sh
source gpu_diagnostics/session_env.sh
profile() {  # profile NAME LIMIT ARGS...
    local name=$1 limit=$2
    shift 2
    timeout -s INT "$limit" python3 gpu_diagnostics/profile_call.py "$@" > "$OUT/$name.log" 2>&1
    echo "$name rc=$?"
}
for dtype in fp32 bf16; do
    profile "ab-train-4096-$dtype" "${LIM_AB:-150}" 4096 "$dtype" triton-train \
        --ab variants.triton.launch:ENABLED --latency
done
for n in 256 1024; do
    profile "host-$n-bf16" "${LIM_HOST:-40}" "$n" bf16 triton --pass forward --host
done
for dtype in fp32 bf16; do
    profile "kernels-256-$dtype" "${LIM_PROF:-30}" 256 "$dtype" triton --pass forward
done
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    for dtype in fp32 bf16; do
        echo "## A/B, triton-train step, N = 4096, $dtype"; tail -8 "$OUT/ab-train-4096-$dtype.log"
    done
    for n in 256 1024; do
        echo "## host, triton bf16 forward, N = $n"
        grep -B2 -A25 "Ordered by" "$OUT/host-$n-bf16.log" | cut -c1-150
        grep -iE "direct|per call|host" "$OUT/host-$n-bf16.log" | tail -12
    done
    for dtype in fp32 bf16; do
        echo "## kernels, triton forward, N = 256, $dtype"
        grep -E "Self CUDA|kernel|gemm|Kernel" "$OUT/kernels-256-$dtype.log" | head -20
    done
} > "$OUT/summary.md" 2>&1
cat "$OUT/summary.md"
