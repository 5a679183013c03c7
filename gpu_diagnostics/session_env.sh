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

# sharded_pytest SHARDS LIMIT LOG PYTEST_ARGS...: the tests PYTEST_ARGS select, run in SHARDS
# processes at once on the one GPU, each under LIMIT seconds; LOG gets each shard's tests by
# outcome (PASSED, XFAIL, FAILED, ERROR, and NOT RUN where the limit cut the shard) and summary.
# A GPU test's time is mostly compiling its kernels' autotune configs, one core per process:
# shards divide it. Concurrent processes make the autotuner's trial timings noisy, so a shard may
# check a different config than a lone run picks; every config must match the oracle anyway.
# Memory bounds SHARDS: the training tests at N = 1000-2048 hold float64 oracles and their
# gradients, and 8 shards of the Triton tests ran the H200's 140 GB out (tenth session); 4 fit.
sharded_pytest() {
    local shards=$1 limit=$2 log=$3 ids tests
    shift 3
    ids=$(mktemp -d)
    python3 -m pytest --collect-only -q -p no:cacheprovider "$@" 2>/dev/null | grep '::' \
        > "$ids/all"
    if [ ! -s "$ids/all" ]; then
        echo "sharded_pytest: no tests selected by: $*" | tee "$log"
        return 1
    fi
    split -n "r/$shards" "$ids/all" "$ids/shard."
    for shard in "$ids"/shard.*; do
        # one argument per line: a test id may hold spaces (a config's repr)
        mapfile -t tests < "$shard"
        timeout -s INT "$limit" python3 -m pytest -q -p no:cacheprovider -rfEpxX --tb=short \
            "${tests[@]}" > "$shard.log" 2>&1 &
    done
    wait
    for shard in "$ids"/shard.*.log; do
        echo "== $(basename "$shard" .log): $(wc -l < "${shard%.log}") tests"
        # by name: what passed, then what its limit cut (no outcome line), then the summary
        grep -E "^(PASSED|XFAIL|XPASS) " "$shard"
        sed -nE "s/^(PASSED|FAILED|ERROR|XFAIL|XPASS) (.*)$/\2/p" "$shard" | sed "s/ - .*$//" \
            | grep -vxFf - "${shard%.log}" | sed "s/^/NOT RUN /"
        grep -vE "^(PASSED|XFAIL|XPASS) " "$shard" | tail -15
    done > "$log"
    grep -hE "passed|failed|error" "$ids"/shard.*.log | grep -E "^[=0-9 ]" | tail -n "$shards"
}
