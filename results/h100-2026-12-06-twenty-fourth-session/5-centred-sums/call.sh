#!/usr/bin/env bash
# Twenty-fourth session, last call (code fdf5cb2): triton-train's fp32 step with the point sums
# centred per 128-row group (grad_err_ratio and time at N = 1024 replayed and eager, 4096 eager),
# the GPU tests of the backward and the 3xTF32 GEMM, then an A/B of the busy host before each
# sample (host_spin_ms 0 then 2, one process each, eager `triton` at N = 256 and 1024).
source gpu_diagnostics/session_env.sh
work=$(mktemp -d)
sweep() {  # NAME LIMIT VARIANT GRID
    printf '%b' "$4" > "$work/$1.toml"
    timeout -s INT "$2" python3 -m harness.cli sweep --grid "$work/$1.toml" --device cuda \
        -o "$work/$1" --no-plots --no-progress --variant "$3" > "$work/$1.log" 2>&1
}
train='[base]\nmodes = ["eager", "graph"]\ngraph_max_length = 1024\nseeds = 2\nbudget_s = 0.5\ndtypes = ["fp32"]\npasses = ["forward+backward"]\n\n[[slice]]\nlength = ['
sweep train-1024 100 triton-train "${train}1024]\n"
sweep train-4096 160 triton-train "${train}4096]\n"
sharded_pytest 5 190 "$work/gpu-tests.log" -m gpu tests/test_triton_backward.py tests/test_triton.py \
    tests/test_openfold_triton.py \
    -k "(triton-train or gemm_ds or linear_3xtf32 or test_triton_bias_training) and not fullfuse"
fwd='[base]\nmodes = ["eager"]\nseeds = 2\nbudget_s = 0.5\nhost_spin_ms = '
for spin in 0 2; do
    sweep "spin-$spin" 40 triton "${fwd}${spin}\n\n[[slice]]\nlength = [256, 1024]\n"
done
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    grep -hE "passed|failed" "$work/gpu-tests.log" | grep -E "^[=0-9 ]"
    grep -hE "^(FAILED|ERROR|NOT RUN)" "$work/gpu-tests.log"
    python3 -c 'import sys, json; from harness.results import read_results
for path in sys.argv[1:]:
    df = read_results(path + "/results.csv")
    spin = json.load(open(path + "/metadata.json")).get("host_spin_ms")
    cols = [c for c in ("variant", "dtype", "mode", "length", "median_ms", "host_ms", "err_ratio",
                        "grad_err_ratio", "grad_worst", "status") if c in df.columns]
    print(path.rsplit("/", 1)[1], "host_spin_ms", spin); print(df[cols].to_string(index=False))' \
        $(ls -d "$work"/*/ | sed 's:/$::')
} > "$OUT/summary.md" 2>&1
rm -f "$work"/*/.ipa-bench.lock
tar -czf "$OUT/call.tgz" -C "$work" .
cat "$OUT/summary.md"
