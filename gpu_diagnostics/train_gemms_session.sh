#!/usr/bin/env bash
# One device call deciding the twenty-third session's two switched-off changes to triton-train's
# fp32 step (docs/perf-notes.md): the sums of dS as batched 3xTF32 Triton GEMMs
# (`sums.SUMS_3XTF32`) and the projections with their gradients as 3xTF32 GEMMs
# (`pipeline.TRAIN_SPLIT_GEMMS`). An A/B of each in one process (the N = 4096 step by device
# events, LIM_AB_BIG; the N = 1024 step replayed, LIM_AB), then the training protocol's gradient
# figures against the float64 oracle at N = 1024 with both off and both on (LIM_CHECK). Writes
# ab-sums-4096.log, ab-gemms-1024.log, check.log and summary.md under $OUT.
#
#   OUT=DIR bash gpu_diagnostics/train_gemms_session.sh
source gpu_diagnostics/session_env.sh
timeout -s INT "${LIM_AB_BIG:-200}" python3 gpu_diagnostics/profile_call.py 4096 fp32 triton-train \
    --ab variants.triton.sums:SUMS_3XTF32 --latency > "$OUT/ab-sums-4096.log" 2>&1
timeout -s INT "${LIM_AB:-120}" python3 gpu_diagnostics/profile_call.py 1024 fp32 triton-train \
    --ab variants.triton.pipeline:TRAIN_SPLIT_GEMMS variants.triton.pipeline:TRAIN_SPLIT_GEMMS=True,variants.triton.sums:SUMS_3XTF32=True \
    --graph --latency > "$OUT/ab-gemms-1024.log" 2>&1
timeout -s INT "${LIM_CHECK:-200}" python3 - > "$OUT/check.log" 2>&1 <<'PY'
from harness.correctness import check_variant
from variants.problem import IPAConfig
from variants.reference import init_state_dict
from variants.triton import pipeline, sums
from variants.triton.variants import TritonTrain

config = IPAConfig()
for on in (False, True):
    pipeline.TRAIN_SPLIT_GEMMS = sums.SUMS_3XTF32 = on
    result = check_variant(TritonTrain(), config, batch=1, length=1024, device="cuda",
                           precision="fp32", seeds=1, state_dict=init_state_dict(config),
                           pass_name="forward+backward")
    ratios = {n: f["rel_l2"] / max(f["reference_rel_l2"], 1e-30)
              for n, f in result.gradients.items()}
    worst = max(ratios, key=ratios.get)
    print(f"3xTF32 GEMMs {'on' if on else 'off'}: passed {result.passed}, worst {worst} "
          f"{ratios[worst]:.2f}x the reference's error; "
          + ", ".join(f"{n} {r:.2f}" for n, r in sorted(ratios.items())))
PY
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    echo "## sums of dS, fp32 step N = 4096 (device events)"; grep -E "SUMS|Error" "$OUT/ab-sums-4096.log"
    echo "## projections (then both), fp32 step N = 1024 replayed"
    grep -E "TRAIN_SPLIT|Error" "$OUT/ab-gemms-1024.log"
    echo "## gradients against float64, N = 1024"; tail -4 "$OUT/check.log"
} > "$OUT/summary.md" 2>&1
cat "$OUT/summary.md"
