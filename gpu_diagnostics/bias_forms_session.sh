#!/usr/bin/env bash
# One device call for cuda-fused's af2 forms (FusedBias: FFMA 0, mma pair rows 1, mma head rows 2,
# tensor cores throughout 3; issue #17): the forms' oracle tests (tests/test_cuda.py -k TESTS),
# `check` of the variant under each of CHECK_FORMS at CHECK_LENGTHS (97 1000), the A/B of
# AB_FORMS_BF16 / AB_FORMS_FP32 at AB_CELLS (profile_call.py --ab, CUDA-graph replay, one
# process; with AB_SETTINGS, profile_call.py's --ab settings instead of the forms), and with NCU_FORM set Nsight Compute on that form's kernel at bf16 N = 4096 (ncu_session.sh's sections).
# Logs under $OUT. Each stage has a limit: LIM_TEST, LIM_CHECK (one check), LIM_AB (one cell),
# LIM_NCU; 0 skips a stage.
#   twenty-eighth session: CHECK_FORMS="BF16_BIAS=1 BF16_BIAS=2 FP32_BIAS=2" and the A/B of 0/2/1
#   twenty-ninth session (the defaults): the tensor-core kernel (3) against bf16's default (head
#   rows, 2) and fp32's (FFMA, 0), both dtypes
#   thirty-third session: TESTS="frames or tensor_core_gemms or tensor_core_kernel"
#   AB_SETTINGS=variants.cuda_ext:TENSOR_CORE_GEMMS (the GEMMs around the kernel, off and on)
#
#   OUT=DIR bash gpu_diagnostics/bias_forms_session.sh
source gpu_diagnostics/session_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    | tee -a "$OUT/gpu.txt"
if [ "${LIM_TEST:-240}" -gt 0 ]; then
    timeout "${LIM_TEST:-240}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py \
        -k "${TESTS:-tensor_core_kernel or refusals_raise}" -rfE --tb=short -s \
        > "$OUT/tensor-core-tests.log" 2>&1
    grep -E "rel_l2|passed|failed|Error" "$OUT/tensor-core-tests.log" | tail -16
fi
for form in ${CHECK_FORMS:-BF16_BIAS=3 FP32_BIAS=3}; do
    [ "${LIM_CHECK:-60}" -gt 0 ] || break
    dtype=$([ "${form%%_*}" = BF16 ] && echo bf16 || echo fp32)
    for length in ${CHECK_LENGTHS:-97 1000}; do
        echo "== $form $dtype N = $length"
        timeout "${LIM_CHECK:-60}" python3 -c "
import sys, variants.cuda_fused as c
c.${form}
from harness.cli import main
sys.exit(main(['check', '--variant', 'cuda-fused', '--device', 'cuda', '--dtype', '$dtype',
               '--length', '$length', '--no-progress']))" 2>&1 | tail -4
    done
done | tee "$OUT/check.log"
m=variants.cuda_fused
for cell in ${AB_CELLS:-4096:bf16 4096:fp32 1024:bf16 1024:fp32}; do
    [ "${LIM_AB:-90}" -gt 0 ] || break
    n=${cell%:*} dtype=${cell#*:}
    if [ "$dtype" = bf16 ]; then prefix=BF16 choices=${AB_FORMS_BF16:-2 3}
    else prefix=FP32 choices=${AB_FORMS_FP32:-0 3}; fi
    forms=${AB_SETTINGS:-}
    [ -n "$forms" ] || for f in $choices; do forms="$forms $m:${prefix}_BIAS=$f"; done
    echo "== A/B N = $n $dtype (replayed ms):$forms"
    # shellcheck disable=SC2086
    timeout "${LIM_AB:-90}" python3 gpu_diagnostics/profile_call.py "$n" "$dtype" cuda-fused \
        --pass forward --graph --ab $forms 2>&1 | tail -5
done | tee "$OUT/ab.log"
if [ -n "${NCU_FORM:-}" ] && [ "${LIM_NCU:-150}" -gt 0 ]; then
    NCU_SET="variants.cuda_fused:BF16_BIAS=$NCU_FORM" NCU_VARIANT=cuda-fused NCU_KERNELS=ipa_fused \
        NCU_CELLS="4096:bf16" LIM_TEST=0 LIM_PROF=0 bash gpu_diagnostics/ncu_session.sh
fi
