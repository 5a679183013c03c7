#!/usr/bin/env bash
# One device call for where the `triton` forward and the triton-train step spend their time
# (issues #17 item 6 and #16), each stage under its own limit (LIM_TEST, LIM_NCU per profile,
# LIM_PROF per profile; 200, 90, 100 s):
#   1. the fp32 gradient tests of the training variants not reached by the ninth session's
#      first call (tests/test_triton_backward.py: N = 33 at H = 16, N = 1000, memory): the
#      backward's fp32 dots became tf32x3 (NCU_TESTS overrides the -k expression);
#   2. Nsight Compute on one forward of NCU_VARIANT (default `triton`; `triton-grouped` too) per
#      (N, dtype) in NCU_CELLS (the call inside the NVTX range `ipa`, after two warm-ups; the
#      bias, attention, merge and grouped kernels only, or the NCU_KERNELS regex, e.g.
#      `ipa_fused_af2` for cuda-fused; NCU_SET: one profile_call.py --set, e.g. a cuda-fused form;
#      NCU_PROBLEM: the problem, e.g. `openfold` with NCU_KERNELS=ipa_openfold):
#      speed of light, memory and compute workload, occupancy, launch statistics, and the
#      warp-stall breakdown and pipe utilisation as metrics; with NCU_SOURCE=1 also the
#      per-SASS-instruction counters (sass-N-DTYPE.csv.gz) and ncu_stalls.py's summary of them
#      (which loop's warps wait, on what, at which instruction);
#   3. torch.profiler on a triton-train training step at N = 4096 and 1024, fp32: the
#      kernels by device time.
# Writes train-tests.log, ncu-forward.txt, train-profile.log (and sass-*.csv.gz) in $OUT.
# LIM_TEST=0 or LIM_PROF=0 skips a stage.
#
#   OUT=DIR bash gpu_diagnostics/ncu_session.sh
source gpu_diagnostics/session_env.sh
if [ "${LIM_TEST:-200}" -gt 0 ]; then
    timeout -s INT "${LIM_TEST:-200}" python3 -m pytest -q -m gpu tests/test_triton_backward.py \
        -k "${NCU_TESTS:-fp32 and (N33 or N1000 or memory)}" -p no:cacheprovider -rfE \
        --tb=short 2>&1 | tail -30 > "$OUT/train-tests.log"
fi
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section WarpStateStats --section Occupancy --section LaunchStats"
metrics="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active$,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active$"
[ -n "${NCU_SOURCE:-}" ] && sections="$sections --section SourceCounters"
for cell in ${NCU_CELLS:-4096:fp32 4096:bf16 1024:fp32 1024:bf16}; do
    echo "=== ${cell%:*} ${cell#*:} ${NCU_VARIANT:-triton}"
    rep=/tmp/ncu-${cell%:*}-${cell#*:}
    timeout -s INT "${LIM_NCU:-90}" ncu --nvtx --nvtx-include "ipa/" \
        --kernel-name regex:"${NCU_KERNELS:-_attention_kernel|_pair_bias_kernel|_merge_kernel|_grouped_kernel}" \
        $sections --metrics "$metrics" ${NCU_SOURCE:+--import-source no -f -o "$rep"} \
        python3 gpu_diagnostics/profile_call.py "${cell%:*}" \
        "${cell#*:}" "${NCU_VARIANT:-triton}" --pass forward --nvtx ${NCU_SET:+--set "$NCU_SET"} \
        ${NCU_PROBLEM:+--problem "$NCU_PROBLEM"} 2>&1 \
        | grep -v "^==PROF==\|Warn"
    if [ -n "${NCU_SOURCE:-}" ] && [ -f "$rep.ncu-rep" ]; then
        ncu -i "$rep.ncu-rep" --page details $sections --metrics "$metrics" 2>&1 | grep -v "^==PROF==\|Warn"
        ncu -i "$rep.ncu-rep" --page source --csv --print-source sass \
            | gzip > "$OUT/sass-${cell%:*}-${cell#*:}.csv.gz"
        python3 gpu_diagnostics/ncu_stalls.py "$OUT/sass-${cell%:*}-${cell#*:}.csv.gz" --groups 4 --top 6
    fi
done > "$OUT/ncu-forward.txt"
for n in 4096 1024; do
    [ "${LIM_PROF:-100}" -gt 0 ] || break
    timeout -s INT "${LIM_PROF:-100}" python3 gpu_diagnostics/profile_call.py "$n" fp32 \
        triton-train 2>&1 | grep -v Warn
done > "$OUT/train-profile.log"
tail -5 "$OUT/train-tests.log" 2>/dev/null
grep -E "^===|^  _[a-z_]+kernel|Duration|DRAM Throughput|Compute \(SM\) Throughput" \
    "$OUT/ncu-forward.txt"
head -40 "$OUT/train-profile.log"
exit 0
