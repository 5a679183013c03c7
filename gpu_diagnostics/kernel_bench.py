"""The fused Triton kernel of a problem at its default layer, B = 1 (GPU machine): per N and
dtype each autotune config's kernel time (the autotuner's own `do_bench`), the forward's median,
its O(N) part (the kernel stubbed out), the kernels one forward launches, the z-read floor and
the chosen config; last, registers and spills of every compiled kernel. Problem `openfold`:
its `triton` variant (and first its accuracy at B = 2, N = 97 against the float64 oracle and
the eager reference); `simplified`: `triton-pairdot`, the same kernel without pair values.

    PYTHONPATH=. python3 gpu_diagnostics/kernel_bench.py openfold|simplified
        [--lengths 1024 2048 4096] [--precisions fp32 bf16] [--device cuda|cpu]

`--device cpu` with TRITON_INTERPRET=1 and a small length (`--lengths 40`): a dry run. Lines
on stdout; the session scripts (`openfold_session.sh`, `pairdot_session.sh`) keep them.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from harness.problems import PROBLEMS
from variants.openfold import triton_kernel as tk
from variants.problem import math_mode
from variants.registry import get_variant

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
HBM_BYTES_PER_S = 4.3e12  # the H200's measured device copy (../shared/GPU.md)
VARIANT = {"openfold": "triton", "simplified": "triton-pairdot"}
TUNED = {"openfold": {"fp32": "_kernel_fp32", "bf16": "_kernel_16bit"},
         "simplified": {"fp32": "_bias_kernel_fp32", "bf16": "_bias_kernel_16bit"}}


def timed(fn, device: str, rep_ms: int) -> float:
    """Median ms by `triton.testing.do_bench` on the GPU; one wall-clock call on the CPU."""
    if device == "cuda":
        from triton.testing import do_bench
        return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def kernels_per_call(fn, device: str) -> int:
    """How many kernels one call launches (torch.profiler's device events; 0 on the CPU)."""
    if device != "cuda":
        return 0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def openfold_accuracy(fn, state_dict, config, dtype, device: str) -> str:
    from variants.openfold.problem import make_inputs
    from variants.openfold.reference import make_module, oracle_forward

    rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()  # noqa: E731
    xs = make_inputs(config, 2, 97, dtype=dtype, device=device, seed=3)
    out, orc = fn(*xs.as_tuple()), oracle_forward(state_dict, config, xs)
    ref = make_module(state_dict, config, device, dtype)(*xs.as_tuple())
    m = xs.mask.bool()
    return (f"B2 N97 rel_l2 present {rel(out[m], orc[m]):.3e} (reference "
            f"{rel(ref[m], orc[m]):.3e}) masked {rel(out[~m], orc[~m]):.3e} (reference "
            f"{rel(ref[~m], orc[~m]):.3e})")


def compiled_kernels() -> list[str]:
    lines = []
    for cache in getattr(tk._openfold_kernel, "device_caches", {}).values():
        for k in cache[0].values():
            consts = getattr(getattr(k, "src", None), "constants", None) or {}
            names = tk._openfold_kernel.arg_names
            consts = {(names[a[0]] if isinstance(a, tuple) else str(a)): v
                      for a, v in consts.items()}
            picked = {a: consts[a] for a in ("BLOCK_M", "BLOCK_N", "ZCH", "SPLIT",
                                             "Z_PRECISION", "PAIR_VALUES") if a in consts}
            lines.append(f"compiled: {getattr(k, 'n_regs', '?')} regs, "
                         f"{getattr(k, 'n_spills', '?')} spills, {k.metadata.num_warps} warps, "
                         f"{k.metadata.num_stages} stages, {k.metadata.shared} B shared {picked}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problem", choices=sorted(VARIANT))
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=DTYPES)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    problem, dev = PROBLEMS[args.problem], args.device
    config = problem.config_class()
    state_dict = problem.init_state_dict(config)
    for prec in args.precisions:
        dtype = DTYPES[prec]
        tuned = getattr(tk, TUNED[args.problem][prec])
        with math_mode(prec):
            fn = get_variant(VARIANT[args.problem], args.problem).build(state_dict, config, dev,
                                                                        prec)
            if args.problem == "openfold":
                print(f"{prec} {openfold_accuracy(fn, state_dict, config, dtype, dev)}",
                      flush=True)
            for n in args.lengths:
                x = problem.make_inputs(config, 1, n, dtype=dtype, device=dev, seed=4)
                call_args = x.as_tuple()

                def call(fn=fn, call_args=call_args):
                    fn(*call_args)

                call()  # autotunes this N bucket
                if dev == "cuda":
                    torch.cuda.synchronize()
                timings = getattr(tuned, "configs_timings", None) or {}
                for c, t in sorted(timings.items(), key=lambda kv: kv[1][0]):
                    print(f"  {prec} N{n} config {c}: {t[0]:.3f} ms", flush=True)
                t_full = timed(call, dev, 200)
                launches = kernels_per_call(call, dev)
                real = tk.launch
                tk.launch = lambda *a, **k: None
                t_on = timed(call, dev, 100)
                tk.launch = real
                z = call_args[1]
                floor = z.numel() * z.element_size() / HBM_BYTES_PER_S * 1e3
                best = getattr(tuned, "best_config", None) or getattr(tuned, "meta", None)
                print(f"{prec} N{n} forward {t_full:.3f} ms (O(N) part {t_on:.3f} ms, kernel "
                      f"~{t_full - t_on:.3f}; {launches} kernels a forward); z floor "
                      f"{floor:.3f} ms; best {best}", flush=True)
    for line in compiled_kernels():
        print(line, flush=True)
    print("interpreted:", tk._kernel_fp32.__class__.__name__ == "_FixedConfig")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
