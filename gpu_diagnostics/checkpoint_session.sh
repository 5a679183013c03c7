#!/usr/bin/env bash
# One device call that checks the open issues' main cells at once, for a session that may get a
# single machine start: with LIM_TEST set, the GPU tests (`gpu_tests_session.sh`, better run in
# a call of their own); a sweep of each issue's headline cells (their rows carry err_ratio /
# grad_err_ratio against the float64 oracle, so they check as well as time): triton-train's
# step at N = 1024 (eager and replayed), then at 4096 (eager) in a stage of its own, the
# cuda-fused and `triton` forwards at N = 256, 1024, 4096 (replayed to 1024), openfold's
# cuda-fused and triton-bias forwards at N = 2048 and triton-bias's training step at N = 1024;
# then torch.profiler on one fp32 training step at N = 4096. With LIM_HOST and LIM_LAUNCH (off by
# default; measured 2026-12-06), cProfile of 20 eager `triton` forwards at N = 1024 in bf16 with
# each kernel's launches by path, and `launch_overhead.py` (the host's time
# per torch op, GEMM and Triton launch, direct or not). fp32 and bf16 throughout. Each stage runs
# under its own limit (LIM_TRAIN, LIM_TRAIN_BIG, LIM_FWD, LIM_OF, LIM_PROF seconds; 100 + 170 +
# 140 + 110 + 30 s, of a call's 600) and every sweep cell is fsync'ed, so a cut
# stage still reports what finished. Everything lands in one archive, $OUT/checkpoint.tgz (the
# device returns at most 8 files), with summary.md beside it.
#
#   OUT=DIR bash gpu_diagnostics/checkpoint_session.sh
source gpu_diagnostics/session_env.sh
work=$(mktemp -d)
# The GPU tests only with a limit (LIM_TEST seconds a shard): at 110 s they finished 8 of 44 on
# 2026-12-06, so they have a call of their own, `gpu_tests_session.sh`.
if [ "${LIM_TEST:-0}" -gt 0 ]; then
    OUT=$work bash gpu_diagnostics/gpu_tests_session.sh > /dev/null
fi

# sweep NAME LIMIT VARIANT GRID_TOML [sweep args...]: one sweep and its report under $work/NAME.
sweep() {
    local name=$1 limit=$2 variant=$3 grid=$work/$1.toml
    printf '%b' "$4" > "$grid"
    shift 4
    timeout -s INT "$limit" python3 -m harness.cli sweep --grid "$grid" --device cuda \
        -o "$work/$name" --no-plots --no-progress --variant "$variant" "$@" \
        > "$work/$name.log" 2>&1
    timeout -s INT 20 python3 -m harness.cli report "$work/$name/results.csv" \
        > "$work/$name-report.md" 2>&1
}
base='[base]\nmodes = ["eager", "graph"]\ngraph_max_length = 1024\nseeds = 2\nbudget_s = 0.5\n'
# #16's 1.0 ms cell (N = 1024, eager and replayed), then its headline (N = 4096, eager only:
# graph_max_length) in a stage of its own: in one stage, N = 1024's autotuning took the whole limit
# on the twenty-second session's H100, and the N = 4096 cell takes ~100-160 s a dtype there.
sweep training "${LIM_TRAIN:-100}" triton-train \
    "${base}passes = [\"forward+backward\"]\n\n[[slice]]\nlength = [1024]\n"
sweep training-4096 "${LIM_TRAIN_BIG:-170}" triton-train \
    "${base}passes = [\"forward+backward\"]\n\n[[slice]]\nlength = [4096]\n"
# cuda-fused first: the fastest forward of both problems since the thirty-second session (H100);
# it has no backward, so the openfold training slice gives it `forward only` rows, no timing.
sweep forward "${LIM_FWD:-140}" cuda-fused "${base}\n[[slice]]\nlength = [256, 1024, 4096]\n" \
    --variant triton
sweep openfold "${LIM_OF:-110}" cuda-fused "${base}problem = \"openfold\"\n\n[[slice]]\nlength = [2048]\n
[[slice]]\nlength = [1024]\npasses = [\"forward+backward\"]\n" --variant triton-bias
timeout -s INT "${LIM_PROF:-30}" python3 gpu_diagnostics/profile_call.py 4096 fp32 triton-train \
    > "$work/train-profile.log" 2>&1
# off unless given a limit: measured on 2026-12-06 (results/h100-2026-12-06-twenty-*-session/)
if [ "${LIM_HOST:-0}" -gt 0 ]; then
    timeout -s INT "$LIM_HOST" python3 gpu_diagnostics/profile_call.py 1024 bf16 triton \
        --pass forward --host > "$work/triton-host.log" 2>&1
fi
if [ "${LIM_LAUNCH:-0}" -gt 0 ]; then
    timeout -s INT "$LIM_LAUNCH" python3 gpu_diagnostics/launch_overhead.py \
        > "$work/launch-overhead.log" 2>&1
fi

{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
    if [ -f "$work/gpu-tests.log" ]; then
        echo "## GPU tests"; grep -hE "passed|failed|error" "$work/gpu-tests.log" | grep -E "^[=0-9 ]"
        grep -hE "^(FAILED|ERROR|NOT RUN)" "$work/gpu-tests.log"
    fi
    for name in training training-4096 forward openfold; do
        echo "## $name"; head -30 "$work/$name-report.md"
    done
    echo "## every timed row: median and host issue time (ms)"
    python3 -c 'import sys; from harness.results import read_results
for path in sys.argv[1:]:
    df = read_results(path)
    print(df[df.median_ms.notna()][["problem", "variant", "pass", "dtype", "mode", "length",
        "median_ms", "host_ms", "status"]].to_string(index=False))' \
        "$work"/{training,training-4096,forward,openfold}/results.csv
    echo "## training rows: each gradient's error over the reference's (gradients.jsonl)"
    python3 -c 'import sys; from harness.results import read_gradients
for path in sys.argv[1:]:
    df = read_gradients(path)
    df = df[df.reference_rel_l2 > 0].assign(ratio=lambda d: d.rel_l2 / d.reference_rel_l2)
    for key, cell in df.groupby(["problem", "variant", "dtype", "mode", "length"], sort=False):
        print(*key[:4], "N =", key[4],
              " ".join(f"{t} {r:.2f}" for t, r in sorted(zip(cell.tensor, cell.ratio))))' \
        "$work"/{training,training-4096,openfold}/results.csv
    echo "## training step, fp32 N = 4096, kernels"; grep -E "_kernel |gemm" "$work/train-profile.log"
    echo "## triton bf16 N = 1024 eager forward, host (cProfile of 20 calls, by own time; then"
    echo "## each kernel's launches by path)"
    grep -A45 "Ordered by" "$work/triton-host.log" 2>/dev/null | cut -c1-160
    echo "## host time per launch (us)"; cat "$work/launch-overhead.log" 2>/dev/null
} > "$OUT/summary.md" 2>&1
rm -f "$work"/*/.ipa-bench.lock
tar -czf "$OUT/checkpoint.tgz" -C "$work" .
cat "$OUT/summary.md"
exit 0
