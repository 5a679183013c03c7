#!/usr/bin/env bash
# One device call for `triton-pairdot` (issue #17, deliverable 2): its GPU tests and those of
# the openfold triton kernel it shares, every autotune config's kernel time and the forward at
# N = 1024 / 2048 / 4096 in fp32 and bf16 (the autotuner's best recorded), then a sweep of triton-pairdot against triton and cuda-fused
# along N (256..4096, eager, and CUDA-graph replay to N = 512) and its report. Each stage
# runs under its own limit (LIM_TEST, LIM_BENCH, LIM_SWEEP seconds; 100 + 150 + 240 s): the
# sweep is resumable and fsyncs each cell, so a cut one still reports what finished.
# Writes gpu-tests.log, bench.log, sweep.log, report.md, results.csv, metadata.json in $OUT:
# 6 files, under the device's 8.
#
#   OUT=DIR bash gpu_diagnostics/pairdot_session.sh
#
# CPU dry run of the timing stage (the kernel under the interpreter, tiny N, no autotuning):
#   PD_DRY=1 OUT=/tmp/pd bash gpu_diagnostics/pairdot_session.sh
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
export IPA_BENCH_CACHE=${IPA_BENCH_CACHE:-/tmp/ipa-cache}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
if [ -n "${PD_DRY:-}" ]; then
    export TRITON_INTERPRET=1 PD_DEVICE=cpu PD_LENGTHS=${PD_LENGTHS:-40}
else
    timeout -s INT "${LIM_TEST:-100}" python3 -m pytest -q -m gpu tests/test_variants.py \
        tests/test_openfold_triton.py -k "pairdot or openfold" -p no:cacheprovider -rfE \
        --tb=short 2>&1 | tail -30 > "$OUT/gpu-tests.log"
fi
timeout -s INT "${LIM_BENCH:-150}" python3 - <<'PY' 2>&1 | grep -v Warn > "$OUT/bench.log"
"""triton-pairdot at the default config, B = 1: per N and dtype each autotune config's kernel
time, the forward's median, its O(N) part (kernel stubbed) and the chosen config."""
import os
import time

import torch

from variants.openfold import triton_kernel as tk
from variants.problem import IPAConfig, make_inputs, math_mode
from variants.reference import init_state_dict
from variants.triton.variants import TritonPairDot

dev = os.environ.get("PD_DEVICE", "cuda")
lengths = [int(n) for n in os.environ.get("PD_LENGTHS", "1024,2048,4096").split(",")]


def timed(fn, rep_ms):
    if dev == "cuda":
        from triton.testing import do_bench
        return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


cfg = IPAConfig()
sd = init_state_dict(cfg)
for prec in ("fp32", "bf16"):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[prec]
    tuned = tk._bias_kernel_fp32 if prec == "fp32" else tk._bias_kernel_16bit
    with math_mode(prec):
        fn = TritonPairDot().build(sd, cfg, dev, prec)
        for n in lengths:
            args = make_inputs(cfg, 1, n, dtype=dtype, device=dev, seed=4).as_tuple()
            fn(*args)  # autotunes this N bucket
            if dev == "cuda":
                torch.cuda.synchronize()
            timings = getattr(tuned, "configs_timings", None) or {}
            for c, t in sorted(timings.items(), key=lambda kv: kv[1][0]):
                print(f"  {prec} N{n} config {c}: {t[0]:.3f} ms", flush=True)
            t_full = timed(lambda: fn(*args), 200)
            real = tk.launch
            tk.launch = lambda *a, **k: None
            t_on = timed(lambda: fn(*args), 100)
            tk.launch = real
            best = getattr(tuned, "best_config", None) or getattr(tuned, "meta", None)
            print(f"{prec} N{n} forward {t_full:.3f} ms (O(N) part {t_on:.3f} ms, kernel "
                  f"~{t_full - t_on:.3f}); best {best}", flush=True)
print("interpreted:", tk._bias_kernel_fp32.__class__.__name__ == "_FixedConfig")
PY
if [ -z "${PD_DRY:-}" ]; then
    grid=$(mktemp --suffix .toml)
    printf '[base]\nmodes = ["eager", "graph"]\nseeds = 2\nbudget_s = 0.5\n\n[[slice]]\nlength = [256, 1024, 2048, 4096]\n' > "$grid"
    timeout -s INT "${LIM_SWEEP:-240}" python3 -m harness.cli sweep --grid "$grid" \
        --device cuda -o "$OUT/sweep" --no-plots --no-progress --variant triton-pairdot \
        --variant triton --variant cuda-fused > "$OUT/sweep.log" 2>&1
    timeout -s INT 20 python3 -m harness.cli report "$OUT/sweep/results.csv" > "$OUT/report.md" 2>&1
    mv "$OUT/sweep/results.csv" "$OUT/sweep/metadata.json" "$OUT/" 2>/dev/null
    rm -rf "$OUT/sweep"
    tail -5 "$OUT/gpu-tests.log"
fi
cat "$OUT/bench.log"
[ -f "$OUT/report.md" ] && head -60 "$OUT/report.md"
exit 0
