#!/usr/bin/env bash
# One device call after the twenty-eighth session's first (bias_forms_session.sh): the
# tensor-core bias tests (oracle first; the refusal case, which segfaulted there, alone after);
# triton-grouped, which hit an illegal address at N = 130, H = 4, Qp 8, Vp 12 (its G = 2
# default): `check` by autotune config, shape and dtype, each in its own process with
# CUDA_LAUNCH_BLOCKING (so each crash is its own); last, a
# sweep of cuda-fused (bf16 now with the tensor-core bias) and `triton` at N = 1024 and 4096.
# Trims for a short call: GROUPED_CONFIGS="0 1 2" (the fp32 cell by config only; "none" skips
# the checks), LIM_GROUPED=0 (skips triton-grouped's GPU oracle tests at its default G),
# LIM_SWEEP=0, LIM_TEST, LIM (one check's limit); FORMS sets cuda-fused's forms for the sweep.
source gpu_diagnostics/session_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${LIM_TEST:-150}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py -rfE --tb=short \
    -k "tensor_core_bias" > "$OUT/tensor-core-tests.log" 2>&1
tail -6 "$OUT/tensor-core-tests.log"
timeout 45 python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py \
    -rfE --tb=short -k "refusals_raise" > "$OUT/refusal-tests.log" 2>&1
head -6 "$OUT/refusal-tests.log"; tail -4 "$OUT/refusal-tests.log"
if [ "${LIM_GROUPED:-150}" -gt 0 ]; then
    timeout -s INT "${LIM_GROUPED:-150}" python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/test_variants.py -k triton-grouped -rfE --tb=short > "$OUT/grouped-tests.log" 2>&1
    tail -4 "$OUT/grouped-tests.log"
fi
grouped_check() {  # G DTYPE N HEADS QP VP [CONFIG: an index into the autotune list, alone]
    local g=$1 dtype=$2 n=$3 heads=$4 qp=$5 vp=$6 config=${7:-all}
    echo "== triton-grouped G=$g $dtype N=$n H=$heads Qp=$qp Vp=$vp config $config"
    CUDA_LAUNCH_BLOCKING=1 timeout "${LIM:-120}" python3 -c "
import sys, variants.triton.grouped as g
g.group_size = lambda heads: $g
for tuned in (g._grouped_fp32, g._grouped_16bit):
    if '$config' != 'all':
        tuned.kernel.configs = [tuned.kernel.configs[int('$config')]]
    print(tuned.name, [str(c) for c in tuned.kernel.configs])
from harness.cli import main
sys.exit(main(['check', '--variant', 'triton-grouped', '--device', 'cuda', '--dtype', '$dtype',
               '--length', '$n', '--batch', '1', '--heads', '$heads', '--query-points', '$qp',
               '--value-points', '$vp', '--seeds', '1', '--no-progress']))" 2>&1 \
        | grep -E "^_grouped|triton-grouped|Error|error" | tail -4
}
[ "${GROUPED_CONFIGS:-}" = none ] || {
    for config in ${GROUPED_CONFIGS:-all 0 1 2}; do grouped_check 2 fp32 130 4 8 12 "$config"; done
    if [ -z "${GROUPED_CONFIGS:-}" ]; then
        grouped_check 2 bf16 130 4 8 12
        grouped_check 2 fp32 1000 12 4 8
    fi
} 2>&1 | tee "$OUT/grouped-checks.log"
[ "${LIM_SWEEP:-120}" -gt 0 ] || exit 0
printf '[base]\nmodes = ["eager", "graph"]\ngraph_max_length = 1024\nseeds = 2\nbudget_s = 0.5\n
[[slice]]\nlength = [1024, 4096]\n' > /tmp/grid.toml
# the sweep's folder outside $OUT (the device returns at most 8 files): its CSV copied back.
# FORMS: cuda-fused's forms for the sweep (e.g. "BF16_BIAS=3 FP32_BIAS=3"; rows name theirs).
forms=""
for f in ${FORMS:-}; do forms="${forms}c.$f; "; done
timeout -s INT "${LIM_SWEEP:-120}" python3 -c "
import sys, variants.cuda_fused as c
$forms
from harness.cli import main
sys.exit(main(['sweep', '--grid', '/tmp/grid.toml', '--device', 'cuda', '-o', '/tmp/sweep',
               '--no-plots', '--no-progress', '--variant', 'cuda-fused', '--variant', 'triton']))" \
    > "$OUT/sweep.log" 2>&1
cp /tmp/sweep/results.csv "$OUT/results.csv"
timeout 20 python3 -m harness.cli report /tmp/sweep/results.csv > "$OUT/sweep-report.md" 2>&1
grep -E "^\| (cuda-fused|triton) " "$OUT/sweep-report.md" | head -20
