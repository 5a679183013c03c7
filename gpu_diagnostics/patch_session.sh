#!/usr/bin/env bash
# One device call for a kernel change with no switch to flip in one process, kept as a patch
# (a session's prepared experiment: `git diff > change.patch`): the replayed forward of VARIANT at
# CELLS with the tree as it is, then with PATCH applied, alternating ROUNDS times on one machine
# (each tree's extension build is cached by its sources, so only the first switch each way
# builds), and between them, on the patched tree, the GPU tests selected by TESTS (pytest -k).
# The patch is reverted at the end, whatever happened. From the repository root:
#
#   OUT=$OUT PATCH=results/.../change.patch TESTS="sanitizer and fused" \
#       bash gpu_diagnostics/patch_session.sh
#
# VARIANT (default cuda-fused), CELLS (default "256:fp32 1024:fp32 4096:fp32 1024:bf16 4096:bf16",
# N:DTYPE), ROUNDS (default 2), LIM_TEST (default 300 s, 0 skips the tests), LIM_CELL (default 80 s
# a cell). Writes ab.log (one line a cell and round: tree, cell, the replayed median) and
# tests.log under $OUT.
source gpu_diagnostics/session_env.sh
: "${PATCH:?PATCH=the patch to A/B}"
git apply --check "$PATCH" || exit 1
trap 'git apply -R "$PATCH" 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"

replay() {  # TREE: each cell's replayed median under the tree as it is now
    for cell in ${CELLS:-256:fp32 1024:fp32 4096:fp32 1024:bf16 4096:bf16}; do
        median=$(timeout "${LIM_CELL:-80}" python3 gpu_diagnostics/profile_call.py "${cell%:*}" \
            "${cell#*:}" "${VARIANT:-cuda-fused}" --pass forward --graph \
            --ab variants.cuda_ext:TENSOR_CORE_GEMMS=True 2>&1 | grep -E "median|rror" | tail -1)
        echo "$1 N=${cell%:*} ${cell#*:}: $median"
    done
}

for round in $(seq "${ROUNDS:-2}"); do
    replay "round $round, as is" | tee -a "$OUT/ab.log"
    git apply "$PATCH"
    if [ "$round" = 1 ] && [ "${LIM_TEST:-300}" -gt 0 ]; then
        timeout "${LIM_TEST:-300}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/ \
            -k "${TESTS:?TESTS=a pytest -k selection}" -rfE --tb=short > "$OUT/tests.log" 2>&1
        grep -E "passed|failed|SUMMARY" "$OUT/tests.log" | tail -8
    fi
    replay "round $round, patched" | tee -a "$OUT/ab.log"
    git apply -R "$PATCH"
done
