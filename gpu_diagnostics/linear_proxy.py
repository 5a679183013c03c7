"""No GPU: compiles `variants/triton/linear.py`'s 3xTF32 GEMM kernel for sm_90 on the CPU machine
(the GPU machine's triton 3.6.0, `sm90_proxy.py`'s venv) in each operand layout it is launched
with, at the default layer, and prints per config registers, stack bytes, and the SASS's shared
loads and stores and tensor-core instructions (HGMMA: warpgroup MMAs; HMMA: per-warp ones). The
layouts: the forward's projection (both operands K-contiguous); triton-train's sums of dS
(`sums.gemm_ds_sums`: dS and the transposed dS^T against [k | kp | 1]); the projections' backward
(`linear_3xtf32_op`: dx = dy W, dW = dy^T x). A layout that does not compile, or spills, shows
here before any GPU run.

    PYTHONPATH=. build/sm90-proxy-venv/bin/python gpu_diagnostics/linear_proxy.py [N]
"""

from __future__ import annotations

import sys

import torch
import triton

from gpu_diagnostics.sm90_proxy import compile_config, sass_stats
from variants.triton import linear

CONFIGS = [(64, 64, 32, 4, 3), (32, 64, 32, 4, 3), (128, 64, 32, 4, 3)]


def layouts(n: int) -> dict[str, tuple]:
    """name: (M, N_OUT, K, X's (batch, row, k) strides, W's (batch, row, k) strides) as the
    launchers pass them at the default layer (node_dim 384, six projections 1728 wide, 45
    columns of [k | kp | 1] per head)."""
    width, proj = 45, 1728
    return {
        "forward x W^T": (n, proj, 384, (0, 384, 1), (0, 384, 1)),
        "sums: dS op": (n, width, n, (n * n, n, 1), (n * width, 1, width)),
        "sums: dS^T op": (n, width, n, (n * n, 1, n), (n * width, 1, width)),
        "backward: dx = dy W": (n, 384, proj, (0, proj, 1), (0, 1, 384)),
        "backward: dW = dy^T x": (proj, 384, n, (0, 1, proj), (0, 1, 384)),
    }


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 1024
    stand_in = torch.zeros(16, 16)  # the binder reads dtypes and alignment, not sizes
    for name, (m, n_out, k, x_strides, w_strides) in layouts(n).items():
        args = (stand_in, stand_in, stand_in, stand_in, m, n_out, k, *x_strides, *w_strides,
                1024)
        for bm, bn, bk, warps, stages in CONFIGS:
            config = triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk},
                                   num_warps=warps, num_stages=stages)
            label = f"{name:24s} ({bm}, {bn}, {bk}, {warps} warps, {stages} stages)"
            try:
                kernel = compile_config(args, {"HAS_BIAS": False}, config,
                                        fn=linear._linear_kernel)
            except Exception as exc:  # noqa: BLE001 - a layout that does not compile is data
                print(f"{label}: does not compile: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            regs, stack, sass = sass_stats(kernel.asm["cubin"])
            counts = {op: sum(f" {op}" in line for line in sass.splitlines())
                      for op in ("LDS", "STS", "HGMMA", "HMMA")}
            print(f"{label}: {regs} registers, {stack} B stack, "
                  + ", ".join(f"{op} {c}" for op, c in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
