#!/usr/bin/env bash
# One device call for issues #14 and #19: (1) the worker harness's overhead, A/B on one warmed
# machine against the in-process harness of commit e4b9a52 (same grid: N = 1024 and 4096,
# fp32 and bf16, eager, seeds 2, budget 0.5 s, six built-ins; each tree's caches filled first by
# a `check` at N = 64); (2) the GPU integrity tests
# (cuda_fault and friends); (3) the same grid through `sweep --ray` on this one GPU, compared
# with the serial run. Run from a clean snapshot of HEAD, with e4b9a52's in $OLD:
#
#   OLD=build/snap-old OUT=DIR bash gpu_diagnostics/integrity_session.sh
# Writes ab-inprocess.csv, ab-workers.csv, ab-ray.csv, compare-ab.md, compare-ray.md,
# session.log (wall times, test summary): 6 files.
set -uo pipefail
OUT=${OUT:-gpu-out}
OLD=${OLD:-}  # unset: the workers' run only, against the recorded A/B
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 IPA_BENCH_CACHE=${IPA_BENCH_CACHE:-/tmp/ipa-cache}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
grid=$(mktemp --suffix .toml)
printf '[base]\nmodes = ["eager"]\nseeds = 2\nbudget_s = 0.5\n\n[[slice]]\nlength = [1024, 4096]\n' > "$grid"
variants=(--variant reference --variant torch-compile --variant triton --variant triton-fullfuse
          --variant cuda-hybrid --variant cuda-fused)
log=$OUT/session.log
sweep() {  # sweep DIR TREE LABEL [extra args...]
    local dir=$1 tree=$2 label=$3; shift 3
    local t0=$SECONDS
    (cd "$tree" && PYTHONPATH=.${EXTRA_PATH:+:$EXTRA_PATH} timeout -s INT "${LIM_SWEEP:-150}" \
        python3 -m harness.cli sweep --grid "$grid" --device cuda -o "$dir" --no-plots \
        --no-progress "${variants[@]}" "$@") > "$dir.log" 2>&1
    echo "$label: rc $? wall $((SECONDS - t0)) s" | tee -a "$log"
}
warm() {  # warm TREE LABEL: build the CUDA extension and fill the compile caches of TREE
    local t0=$SECONDS
    (cd "$1" && PYTHONPATH=. timeout -s INT "${LIM_WARM:-120}" python3 -m harness.cli check \
        --device cuda --length 64 --seeds 1 --dtype fp32 --dtype bf16 --no-progress \
        "${variants[@]}") > "/tmp/warm-$2.log" 2>&1
    echo "warm-up $2 (check at N = 64): rc $? wall $((SECONDS - t0)) s" | tee -a "$log"
}
# Each tree's caches filled first (a cut-short cold sweep once left the CUDA build to the
# timed pair), then each tree swept back to back: that pair is the A/B.
[[ -n $OLD ]] && warm "$OLD" old
warm . new
[[ -n $OLD ]] && sweep /tmp/ab-old "$OLD" "in-process e4b9a52, warm"
sweep /tmp/ab-new . "workers HEAD, warm"
cp /tmp/ab-new/results.csv "$OUT/ab-workers.csv"
if [[ -n $OLD ]]; then
    cp /tmp/ab-old/results.csv "$OUT/ab-inprocess.csv"
    PYTHONPATH=. python3 -m harness.cli compare "$OUT/ab-inprocess.csv" "$OUT/ab-workers.csv" \
        --markdown > "$OUT/compare-ab.md" 2>&1
fi
timeout -s INT "${LIM_TEST:-120}" env PYTHONPATH=. python3 -m pytest -q -m gpu tests/test_integrity.py \
    tests/test_faults.py -p no:cacheprovider -rfE --tb=short 2>&1 | tail -15 >> "$log"
if [[ -d build/ray-bundle ]]; then
    bash gpu_diagnostics/ray_bundle.sh --install /tmp/raylib >> "$log" 2>&1
    EXTRA_PATH=/tmp/raylib sweep /tmp/ab-ray . "ray (one actor, this GPU)" --ray
    cp /tmp/ab-ray/results.csv "$OUT/ab-ray.csv"
    PYTHONPATH=. python3 -m harness.cli compare "$OUT/ab-workers.csv" "$OUT/ab-ray.csv" --markdown \
        > "$OUT/compare-ray.md" 2>&1
    tail -20 /tmp/ab-ray.log >> "$log"
fi
cat "$log"; head -30 "$OUT/compare-ab.md" "$OUT/compare-ray.md" 2>/dev/null
