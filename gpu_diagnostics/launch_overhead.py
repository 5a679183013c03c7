"""Host time per launch on the GPU machine (#17's eager rows): how long the host takes to issue
one small PyTorch op, one cuBLAS GEMM, and one Triton kernel of ~30 arguments launched plainly,
through `triton.autotune` (one config), and through the compiled kernel's own launcher
(`CompiledKernel[grid](*args)`: no binder, no specialisation, no cache lookup), and through
`variants.triton.launch.DirectLaunch` (the kernels' own launch path since the twenty-first
session: that launcher after a call-signature lookup), each issued `CALLS` times back to back
without synchronising (the GPU work is tiny, so the queue never fills). A variant's whole eager
call: `profile_call.py --host`.

    PYTHONPATH=. python3 gpu_diagnostics/launch_overhead.py
"""

from __future__ import annotations

import time

import torch
import triton
import triton.language as tl

from variants.triton.launch import DirectLaunch

CALLS = 2000


@triton.jit
def _many_args(X, Y, A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15, A16,
               n, s1, s2, s3, s4, s5, s6, s7, s8,
               C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n, other=0.0) * (C1 + C2 + C3),
             mask=offs < n)


_tuned = triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4)],
                         key=["n", "C1"])(_many_args)


def per_call_us(fn, calls: int = CALLS) -> float:
    """Median over five rounds of the host's microseconds to issue `fn()` once."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return sorted(rounds)[2]


def main() -> None:
    dev = torch.device("cuda")
    x, y = torch.randn(128, device=dev), torch.empty(128, device=dev)
    args = [torch.empty(64, device=dev) for _ in range(16)]
    ints = [1, 2, 3, 4, 5, 6, 7, 8]
    a, b = torch.randn(256, 384, device=dev), torch.randn(1152, 384, device=dev)
    compiled = _many_args[(1,)](x, y, *args, 100, *ints, C1=1, C2=2, C3=3, BLOCK=128)
    every_arg = (x, y, *args, 100, *ints, 1, 2, 3, 128)  # constexprs too, as JITFunction.run
    stream = torch.cuda.current_stream().cuda_stream
    launcher = compiled[(1, 1, 1)]
    direct_plain, direct_tuned = DirectLaunch(_many_args), DirectLaunch(_tuned)
    rows = {
        "torch.empty": lambda: torch.empty(1024, device=dev),
        "torch.add (small)": lambda: torch.add(x, 1.0, out=y),
        "F.linear (cuBLAS)": lambda: torch.nn.functional.linear(a, b),
        "triton, plain launch": lambda: _many_args[(1,)](x, y, *args, 100, *ints, C1=1, C2=2,
                                                          C3=3, BLOCK=128),
        "triton, autotuned (1 config)": lambda: _tuned[(1,)](x, y, *args, 100, *ints, C1=1, C2=2,
                                                              C3=3),
        "triton, compiled kernel's launcher": lambda: launcher(*every_arg, stream=stream),
        "triton, DirectLaunch of the plain": lambda: direct_plain[(1,)](
            x, y, *args, 100, *ints, C1=1, C2=2, C3=3, BLOCK=128),
        "triton, DirectLaunch of the autotuned": lambda: direct_tuned[(1,)](
            x, y, *args, 100, *ints, C1=1, C2=2, C3=3),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for name, fn in rows.items():
        try:
            print(f"{name:36s} {per_call_us(fn):8.1f} us")
        except Exception as exc:  # noqa: BLE001 - an internal API may differ: the other rows stand
            print(f"{name:36s} failed: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
