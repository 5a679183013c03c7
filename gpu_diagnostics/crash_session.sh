#!/usr/bin/env bash
# One device call after the twenty-eighth session's first (bias_forms_session.sh): triton-grouped
# hit an illegal address at N = 130, H = 4, Qp 8, Vp 12 (its G = 2 default), and the tensor-core
# bias test's refusal case segfaulted. Here: `check` of triton-grouped by group size, shape and
# dtype, each in its own process with CUDA_LAUNCH_BLOCKING (so each crash is its own), memcheck
# on the first failing cell, then the tensor-core bias tests (oracle first, refusals after).
source gpu_diagnostics/session_env.sh
export CUDA_LAUNCH_BLOCKING=1
grouped_check() {  # G DTYPE N HEADS QP VP [wrapper...]
    local g=$1 dtype=$2 n=$3 heads=$4 qp=$5 vp=$6
    shift 6
    echo "== triton-grouped G=$g $dtype N=$n H=$heads Qp=$qp Vp=$vp $*"
    timeout 150 "$@" python3 -c "
import sys, variants.triton.grouped as g
g.group_size = lambda heads: $g
from harness.cli import main
sys.exit(main(['check', '--variant', 'triton-grouped', '--device', 'cuda', '--dtype', '$dtype',
               '--length', '$n', '--batch', '1', '--heads', '$heads', '--query-points', '$qp',
               '--value-points', '$vp', '--seeds', '1', '--no-progress']))" 2>&1 | tail -"${TAIL:-4}"
}
{
    grouped_check 2 fp32 130 4 8 12
    grouped_check 4 fp32 130 4 8 12
    grouped_check 1 fp32 130 4 8 12
    grouped_check 2 fp32 130 4 4 8
    grouped_check 2 fp32 130 12 8 12
    grouped_check 2 bf16 130 4 8 12
    grouped_check 2 fp32 1000 12 4 8
    grouped_check 2 bf16 2048 12 4 8
} 2>&1 | tee "$OUT/grouped-checks.log"
TAIL=40 grouped_check 2 fp32 130 4 8 12 compute-sanitizer --tool memcheck --print-limit 5 \
    > "$OUT/grouped-memcheck.log" 2>&1
grep -E "Invalid|at 0x|by thread|Address|ERROR SUMMARY" "$OUT/grouped-memcheck.log" | head -12
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py -rfE --tb=short \
    -k "tensor_core_bias" > "$OUT/tensor-core-tests.log" 2>&1
tail -8 "$OUT/tensor-core-tests.log"
timeout 60 python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py \
    -rfE --tb=short -k "refused" > "$OUT/refusal-tests.log" 2>&1
head -12 "$OUT/refusal-tests.log"; tail -5 "$OUT/refusal-tests.log"
