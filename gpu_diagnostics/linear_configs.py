"""GPU: `variants/triton/linear.py`'s 3xTF32 GEMM under each of CONFIGS (the autotuner's list
and candidates), bypassing the autotuner, at the simplified forward's two GEMMs (the projection
M x 384 -> 1152 and out_proj M x 480 -> 384, default layer) for M = N (B = 1), with cuBLAS's
fp32 SGEMM and its bf16 GEMM of the same shape beside them. Each figure: median us per launch of
a CUDA graph of 20 launches, replayed 30 times (no host overhead: the kernels' time). Issue #17,
small N: where one GEMM of a 256-row forward took ~10 us of latency.

    PYTHONPATH=. python gpu_diagnostics/linear_configs.py [N ...]
"""

from __future__ import annotations

import statistics
import sys

import torch
import triton

from harness.measure import capture_cuda_graph
from variants.triton import linear

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
CONFIGS = [(32, 64, 32, 4, 3), (64, 64, 32, 4, 3), (64, 128, 32, 4, 3), (128, 64, 32, 4, 3),
           (128, 128, 32, 8, 3), (64, 32, 64, 4, 3), (32, 32, 64, 4, 4),
           (32, 64, 64, 4, 3), (32, 32, 128, 4, 2), (32, 64, 128, 4, 2), (16, 64, 128, 4, 2),
           (16, 32, 128, 4, 2), (64, 64, 64, 4, 3), (32, 128, 64, 4, 3), (16, 64, 64, 4, 3)]
SHAPES = {"projection": (384, 1152), "out_proj": (480, 384)}


def replayed_us(launch, launches: int = 20, replays: int = 30) -> float:
    """Median us per launch of `launch` captured `launches` times in one CUDA graph (the
    harness's capture, after its warm-up calls)."""
    replay = capture_cuda_graph(lambda: [launch() for _ in range(launches)])
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / launches)
    return statistics.median(times)


def time_shape(n: int, k: int, n_out: int) -> dict[str, float]:
    """label: us per launch, for cuBLAS (fp32, bf16) and each of CONFIGS at (n x k) @ (k x n_out);
    a config's label carries its CTA count and its rel_l2 error against float64."""
    x = torch.randn(n, k, device="cuda")
    w = torch.randn(n_out, k, device="cuda")
    b = torch.randn(n_out, device="cuda")
    out = torch.empty(n, n_out, device="cuda")
    want = torch.nn.functional.linear(x.double(), w.double(), b.double()).float()
    xb, wb = x.bfloat16(), w.bfloat16()
    row = {"cuBLAS fp32": replayed_us(lambda: torch.nn.functional.linear(x, w, b)),
           "cuBLAS bf16": replayed_us(lambda: torch.nn.functional.linear(xb, wb))}
    for bm, bn, bk, warps, stages in CONFIGS:
        grid = (triton.cdiv(n, bm), triton.cdiv(n_out, bn))

        def launch(bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, grid=grid):
            linear._linear_kernel[grid](x, w, b, out, n, n_out, k, 0, k, 1, 0, k, 1, 64,
                                        HAS_BIAS=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                        num_warps=warps, num_stages=stages)
        label = f"{bm}x{bn}x{bk} w{warps} s{stages} ({grid[0] * grid[1]} CTAs"
        try:
            us = replayed_us(launch)
        except Exception as exc:  # noqa: BLE001 - a config that fails is data
            row[f"{label}, failed: {type(exc).__name__})"] = float("inf")
            continue
        row[f"{label}, rel {((out - want).norm() / want.norm()).item():.1e})"] = us
    return row


def main(argv: list[str]) -> int:
    torch.backends.cuda.matmul.allow_tf32 = False
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for n in [int(a) for a in argv] or [256, 1024, 4096]:
        for name, (k, n_out) in SHAPES.items():
            row = time_shape(n, k, n_out)
            print(f"== N={n} {name} (M={n}, K={k}, N_OUT={n_out}), us per launch:")
            for label, us in sorted(row.items(), key=lambda item: item[1]):
                print(f"  {us:7.2f}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
