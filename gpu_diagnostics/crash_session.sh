#!/usr/bin/env bash
# One device call after the twenty-eighth session's first (bias_forms_session.sh): the
# tensor-core bias tests (oracle first; the refusal case, which segfaulted there, alone after);
# triton-grouped, which hit an illegal address at N = 130, H = 4, Qp 8, Vp 12 (its G = 2
# default): `check` by group size, shape and dtype, each in its own process with
# CUDA_LAUNCH_BLOCKING (so each crash is its own), then memcheck on the first cell; last, a
# sweep of cuda-fused (bf16 now with the tensor-core bias) and `triton` at N = 1024 and 4096.
source gpu_diagnostics/session_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py -rfE --tb=short \
    -k "tensor_core_bias" > "$OUT/tensor-core-tests.log" 2>&1
tail -6 "$OUT/tensor-core-tests.log"
timeout 60 python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py \
    -rfE --tb=short -k "refused" > "$OUT/refusal-tests.log" 2>&1
head -6 "$OUT/refusal-tests.log"; tail -4 "$OUT/refusal-tests.log"
grouped_check() {  # G DTYPE N HEADS QP VP [wrapper...]
    local g=$1 dtype=$2 n=$3 heads=$4 qp=$5 vp=$6
    shift 6
    echo "== triton-grouped G=$g $dtype N=$n H=$heads Qp=$qp Vp=$vp $*"
    CUDA_LAUNCH_BLOCKING=1 timeout "${LIM:-150}" "$@" python3 -c "
import sys, variants.triton.grouped as g
g.group_size = lambda heads: $g
from harness.cli import main
sys.exit(main(['check', '--variant', 'triton-grouped', '--device', 'cuda', '--dtype', '$dtype',
               '--length', '$n', '--batch', '1', '--heads', '$heads', '--query-points', '$qp',
               '--value-points', '$vp', '--seeds', '1', '--no-progress']))" 2>&1 | tail -"${TAIL:-3}"
}
{
    grouped_check 2 fp32 130 4 8 12
    grouped_check 4 fp32 130 4 8 12
    grouped_check 2 fp32 130 4 4 8
    grouped_check 2 bf16 130 4 8 12
    grouped_check 2 fp32 1000 12 4 8
} 2>&1 | tee "$OUT/grouped-checks.log"
LIM=100 TAIL=40 grouped_check 2 fp32 130 4 8 12 compute-sanitizer --tool memcheck \
    --print-limit 5 > "$OUT/grouped-memcheck.log" 2>&1
grep -E "Invalid|at 0x|by thread|Address|ERROR SUMMARY" "$OUT/grouped-memcheck.log" | head -12
printf '[base]\nmodes = ["eager", "graph"]\ngraph_max_length = 1024\nseeds = 2\nbudget_s = 0.5\n
[[slice]]\nlength = [1024, 4096]\n' > /tmp/grid.toml
# the sweep's folder outside $OUT (the device returns at most 8 files): its CSV copied back
timeout -s INT 150 python3 -m harness.cli sweep --grid /tmp/grid.toml --device cuda \
    -o /tmp/sweep --no-plots --no-progress --variant cuda-fused --variant triton \
    > "$OUT/sweep.log" 2>&1
cp /tmp/sweep/results.csv "$OUT/results.csv"
timeout 20 python3 -m harness.cli report /tmp/sweep/results.csv > "$OUT/sweep-report.md" 2>&1
grep -E "^\| (cuda-fused|triton) " "$OUT/sweep-report.md" | head -20
