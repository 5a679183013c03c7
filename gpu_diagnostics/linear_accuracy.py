"""GPU: the error of `variants/triton/linear.py`'s 3xTF32 GEMM against float64, beside cuBLAS's
fp32 SGEMM, with the split products accumulated straight into the tensor cores' accumulator
(PROMOTE False) or each K block's products summed from zero and added to an fp32 accumulator
on the CUDA cores (PROMOTE True), at the `triton` forward's two projection shapes.

    PYTHONPATH=. python3 gpu_diagnostics/linear_accuracy.py
"""

import torch

from harness.correctness import rel_l2
from variants.problem import math_mode
from variants.triton import linear
from variants.triton.common import cdiv

g = torch.Generator().manual_seed(0)
for rows in (1, 97, 1024, 4096):
    for k, n_out in ((384, 1728), (672, 384)):
        x = torch.randn(rows, k, generator=g).cuda()
        w = (torch.randn(n_out, k, generator=g) / k**0.5).cuda()
        exp = torch.nn.functional.linear(x.double(), w.double())
        with math_mode("fp32"):
            cub = rel_l2(torch.nn.functional.linear(x, w), exp)
        res = []
        for promote in (False, True):
            for bk in (32, 64):
                out = torch.empty(rows, n_out, device="cuda")
                linear._linear_kernel[(cdiv(rows, 64), cdiv(n_out, 64))](
                    x, w, out, out, rows, n_out, k, k, 0, HAS_BIAS=False, BLOCK_M=64,
                    BLOCK_N=64, BLOCK_K=bk, PROMOTE=promote, num_warps=4, num_stages=3)
                res.append(f"promote={promote} bk={bk}: {rel_l2(out, exp):.2e}")
        print(f"rows {rows} K {k} N {n_out}: cublas {cub:.2e}; " + "; ".join(res))
