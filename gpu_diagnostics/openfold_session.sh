#!/usr/bin/env bash
# One device call for problem `openfold`'s fused Triton forward (issue #18): its GPU tests,
# the variant timed at N = 1024 / 2048 / 4096 in fp32 and bf16 with every autotune config's
# time (the best one recorded), the compiled kernels' registers and spills (no ncu), then the
# `openfold-default` sweep for triton and torch-compile and its report. Each stage runs under
# its own limit (LIM_TEST, LIM_BENCH, LIM_SWEEP seconds; 130 + 170 + 180 + 20 s < 9 min:
# the sweep is resumable and fsyncs each cell, so a cut one still reports what finished).
# Writes gpu-tests.log, bench.log, sweep.log, report.md and the sweep (results.csv,
# metadata.json) in $OUT/openfold: 6 files, under the device's 8.
#
#   OUT=DIR bash gpu_diagnostics/openfold_session.sh
#
# CPU dry run of the timing stage (the kernel under the interpreter, tiny N, no autotuning):
#   OF_DRY=1 OUT=/tmp/of bash gpu_diagnostics/openfold_session.sh
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
export IPA_BENCH_CACHE=${IPA_BENCH_CACHE:-/tmp/ipa-cache}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
if [ -n "${OF_DRY:-}" ]; then
    export TRITON_INTERPRET=1 OF_DEVICE=cpu OF_LENGTHS=${OF_LENGTHS:-40}
fi

if [ -z "${OF_DRY:-}" ]; then
    timeout -s INT "${LIM_TEST:-130}" python3 -m pytest -q -m gpu tests/test_openfold_triton.py \
        -p no:cacheprovider -rfE --tb=short 2>&1 | tail -40 > "$OUT/gpu-tests.log"
fi
timeout -s INT "${LIM_BENCH:-170}" python3 - <<'PY' 2>&1 | grep -v Warn > "$OUT/bench.log"
"""The variant at the default layer, B = 1: accuracy at B = 2 N = 97, then per N and dtype each
autotune config's kernel time, the forward's median, its O(N) part (kernel stubbed), the z-read
floor and the chosen config; last, registers and spills of every compiled kernel."""
import os
import time

import torch

from variants.openfold import triton_kernel as tk
from variants.openfold.problem import OpenFoldConfig, init_state_dict, make_inputs
from variants.openfold.reference import make_module, oracle_forward
from variants.openfold.triton_fused import OpenFoldTriton
from variants.problem import math_mode

dev = os.environ.get("OF_DEVICE", "cuda")
lengths = [int(n) for n in os.environ.get("OF_LENGTHS", "1024,2048,4096").split(",")]


def timed(fn, rep_ms):
    if dev == "cuda":
        from triton.testing import do_bench
        return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


cfg = OpenFoldConfig()
sd = init_state_dict(cfg)
rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()  # noqa: E731
for prec in ("fp32", "bf16"):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[prec]
    tuned = tk._kernel_fp32 if prec == "fp32" else tk._kernel_16bit
    with math_mode(prec):
        fn = OpenFoldTriton().build(sd, cfg, dev, prec)
        xs = make_inputs(cfg, 2, 97, dtype=dtype, device=dev, seed=3)
        out, orc = fn(*xs.as_tuple()), oracle_forward(sd, cfg, xs)
        ref = make_module(sd, cfg, dev, dtype)(*xs.as_tuple())
        m = xs.mask.bool()
        print(f"{prec} B2 N97 rel_l2 present {rel(out[m], orc[m]):.3e} (reference "
              f"{rel(ref[m], orc[m]):.3e}) masked {rel(out[~m], orc[~m]):.3e} (reference "
              f"{rel(ref[~m], orc[~m]):.3e})", flush=True)
        for n in lengths:
            x = make_inputs(cfg, 1, n, dtype=dtype, device=dev, seed=4)
            args = x.as_tuple()
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
            floor = x.z.numel() * x.z.element_size() / 4.3e12 * 1e3
            best = getattr(tuned, "best_config", None) or getattr(tuned, "meta", None)
            print(f"{prec} N{n} forward {t_full:.3f} ms (O(N) part {t_on:.3f} ms, kernel "
                  f"~{t_full - t_on:.3f}); z floor {floor:.3f} ms; best {best}", flush=True)
for d, cache in getattr(tk._openfold_kernel, "device_caches", {}).items():
    for key, k in cache[0].items():
        consts = getattr(getattr(k, "src", None), "constants", None) or {}
        names = tk._openfold_kernel.arg_names
        consts = {(names[a[0]] if isinstance(a, tuple) else str(a)): v
                  for a, v in consts.items()}
        picked = {a: consts[a] for a in ("BLOCK_M", "BLOCK_N", "ZCH", "SPLIT", "Z_PRECISION")
                  if a in consts}
        print(f"compiled: {getattr(k, 'n_regs', '?')} regs, {getattr(k, 'n_spills', '?')} "
              f"spills, {k.metadata.num_warps} warps, {k.metadata.num_stages} stages, "
              f"{k.metadata.shared} B shared {picked}", flush=True)
print("interpreted:", tk._kernel_fp32.__class__.__name__ == "_FixedConfig")
PY
if [ -z "${OF_DRY:-}" ]; then
    timeout -s INT "${LIM_SWEEP:-180}" python3 -m harness.cli sweep --preset openfold-default \
        --problem openfold --device cuda -o "$OUT/openfold" --no-plots --no-progress \
        --variant triton --variant torch-compile > "$OUT/sweep.log" 2>&1
    timeout -s INT 20 python3 -m harness.cli report "$OUT/openfold/results.csv" \
        > "$OUT/report.md" 2>&1
    rm -f "$OUT/openfold/.ipa-bench.lock"
    tail -5 "$OUT/gpu-tests.log"
fi
cat "$OUT/bench.log"
[ -f "$OUT/report.md" ] && head -40 "$OUT/report.md"
exit 0
