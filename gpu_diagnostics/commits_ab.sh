#!/usr/bin/env bash
# One device call that A/Bs two commits on one machine: the same sweep grid run from snapshot A
# (the old code) and then snapshot B (the new), each in its own processes, then
# `harness.cli compare` of the two (all rows, then CUDA-graph rows alone: replayed cells move by
# ~1 % between processes, launch-bound eager cells by up to 1.9x). For a change with no switch
# to flip in one process (`profile_call.py --ab` is for those). Make the snapshots here with
# `git archive COMMIT | tar -x -C build/snapA` (and B), carry both, run from the repository root:
#
#   OUT=$OUT A=build/snapA B=build/snapB bash gpu_diagnostics/commits_ab.sh
#
# VARIANT (default triton), LENGTHS (default "256, 1024, 4096"), DTYPES (default fp32 and
# bf16) and PROBLEM (default simplified) set the grid: eager and replayed (to N = 1024), two
# seeds; LIM_SWEEP (default 200) limits each sweep. Writes a.csv, b.csv, compare.md and the
# sweeps' logs under $OUT. (CPU dry run: DEVICE=cpu TRITON_INTERPRET=1 LENGTHS=16 DTYPES='"fp32"'.)
here=$(pwd)
source gpu_diagnostics/session_env.sh
out=$(cd "$OUT" && pwd)
grid=$(mktemp --suffix .toml)
# (the default's quotes set apart: inside the here-document `${DTYPES:-"fp32", ...}` loses them)
dtypes=${DTYPES:-'"fp32", "bf16"'}
cat > "$grid" <<EOF
[base]
problem = "${PROBLEM:-simplified}"
modes = ["eager", "graph"]
graph_max_length = 1024
dtypes = [$dtypes]
seeds = 2
budget_s = 0.5

[[slice]]
length = [${LENGTHS:-256, 1024, 4096}]
EOF
nvidia-smi --query-gpu=name --format=csv,noheader
for side in A B; do
    dir=${!side}
    rm -rf "/tmp/ab-$side"
    (cd "$dir" && PYTHONPATH=. timeout -s INT "${LIM_SWEEP:-200}" python3 -m harness.cli sweep \
        --grid "$grid" --device "${DEVICE:-cuda}" -o "/tmp/ab-$side" --no-plots --no-progress \
        --variant "${VARIANT:-triton}" > "$out/sweep-$side.log" 2>&1)
    cp "/tmp/ab-$side/results.csv" "$out/$(echo "$side" | tr AB ab).csv"
    echo "$side ($dir): $(tail -1 "$out/sweep-$side.log")"
done
cd "$here"
{
    echo "# $A -> $B, all rows"
    python3 -m harness.cli compare "$out/a.csv" "$out/b.csv"
    echo
    echo "# CUDA-graph rows"
    python3 -m harness.cli compare "$out/a.csv" "$out/b.csv" --mode graph
} > "$out/compare.md" 2>&1
cat "$out/compare.md"
