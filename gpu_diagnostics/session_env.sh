# Sourced by the one-call session scripts (`*_session.sh`), from the repository root: the
# output folder ($OUT, default gpu-out/, created), the repository on the import path, and
# the caches of ipa-bench (CUDA builds) and Triton (compiled kernels) outside the working tree,
# so that later calls on the same warm machine reuse them; a wide terminal for pytest, whose
# short summary cuts each failure's message at the width (a log tail then loses it).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
export IPA_BENCH_CACHE=${IPA_BENCH_CACHE:-/tmp/ipa-cache}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
export COLUMNS=${COLUMNS:-240}
