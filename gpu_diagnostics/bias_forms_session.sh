#!/usr/bin/env bash
# One device call for cuda-fused's af2 pair-bias forms (twenty-eighth session, issue #17): the
# tensor-core forms' oracle tests (tests/test_cuda.py -k tensor_core_bias), `check` of the
# variant under each form (bf16: pair rows, head rows; fp32: head rows as 3xTF32) at N = 97 and
# 1000, then the forms' A/B at N = 4096 and 1024 (profile_call.py --ab, CUDA-graph replay, one
# process), and triton-grouped's GPU oracle tests at its G = 2 default. Logs under $OUT.
#
#   OUT=DIR bash gpu_diagnostics/bias_forms_session.sh
source gpu_diagnostics/session_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
timeout "${LIM_TEST:-240}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py \
    -k tensor_core_bias -rfE --tb=short > "$OUT/tensor-core-tests.log" 2>&1
tail -12 "$OUT/tensor-core-tests.log"
for form in BF16_BIAS=1 BF16_BIAS=2 FP32_BIAS=2; do
    dtype=$([ "${form%%_*}" = BF16 ] && echo bf16 || echo fp32)
    for length in 97 1000; do
        echo "== $form $dtype N = $length"
        timeout 60 python3 -c "
import sys, variants.cuda_fused as c
c.${form}
from harness.cli import main
sys.exit(main(['check', '--variant', 'cuda-fused', '--device', 'cuda', '--dtype', '$dtype',
               '--length', '$length', '--no-progress']))" 2>&1 | tail -4
    done
done | tee "$OUT/check.log"
m=variants.cuda_fused
for cell in "4096 bf16 BF16" "1024 bf16 BF16" "4096 fp32 FP32" "1024 fp32 FP32"; do
    set -- $cell
    forms="$m:$3_BIAS=0 $m:$3_BIAS=2"
    [ "$3" = BF16 ] && forms="$forms $m:$3_BIAS=1"
    echo "== A/B N = $1 $2 (replayed ms)"
    # shellcheck disable=SC2086
    timeout 90 python3 gpu_diagnostics/profile_call.py "$1" "$2" cuda-fused --pass forward \
        --graph --ab $forms 2>&1 | tail -5
done | tee "$OUT/ab.log"
timeout "${LIM_GROUPED:-120}" python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_variants.py -k triton-grouped -rfE --tb=short > "$OUT/grouped-tests.log" 2>&1
tail -6 "$OUT/grouped-tests.log"
