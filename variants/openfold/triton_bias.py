"""Problem `openfold`'s `triton-bias` variant: the layer's O(N^2) part as three Triton kernels
with the logits held as a (B, H, N, N) fp32 tensor, z read twice. The design problem
simplified's `triton` and `triton-train` use, and the forward a fused backward of this problem
will build on (issue #18, deliverable 6).

Why a second design. The fused `triton` (`triton_fused.py`) reads z once and writes nothing
N x N, but its one kernel carries every per-pair term of every head at once and runs at 255
registers: in fp32 (3xTF32 z dots) with 250-370 words spilled and ~184 warp-instructions per
pair, 5.4 ms at N = 2048 on the H200 against torch.compile's 4.15 for the whole forward
(docs/perf-notes.md, sixth and eighth sessions). Here each kernel does one thing:

1. the pair bias, sqrt(1/3) z.W_b^T plus the mask term, by the Triton GEMM of
   `variants/triton/pair_bias.py` (3xTF32 in fp32, memory-bound), written in fp32;
2. the attention kernel of `variants/triton/attention.py` (one program per query block and
   head; 3xTF32 dots in fp32), which reads that bias, overwrites it with each row's base-2
   logits and saves the rows' softmax statistics, and writes o and the global o_pt;
3. the pair values o_pair = sum_j a_ij z_ij (`pair_values.py`), which turns the logits into the
   final probabilities and reads z a second time.

Cost: z twice (the fused kernel: once), the logits written twice and read twice (H / c_z of z's
bytes each, at fp32: 9 % of fp32 z, 19 % of bf16 z), and B H N^2 x 4 bytes of extra memory
(192 MiB at N = 2048, B = 1, H = 12): O(N^2), where the fused kernel's is O(N). The sweep says
which wins where.

Deviations from the reference (none changes the function): linear_b's bias is dropped (a
constant per head, the same for every (i, j): the softmax cancels it); the mask adds
m_i * inf * (m_j - 1), as the fused kernel does (`triton_fused.py`, "Deviations"); points in
fp32, centred per batch element, value points relative to each query block's first frame
origin (`attention.py`). Dots: fp32 `ieee` rows run every dot as 3xTF32 on tensor cores (the
row says `fp32-3xtf32`, judged by the fp32 tolerance), distances directly; `tf32` rows TF32;
16-bit inputs bf16/fp16 tensor cores with fp32 accumulation, the point terms as 3xBF16, the
probabilities rounded to the input dtype for the pair values as the reference's are.

This module imports no Triton at import time: `build` imports the kernels, and a missing
Triton is a reason (`requires`), not an ImportError.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from variants.openfold.reference import OpenFoldIPA
from variants.openfold.triton_fused import OpenFoldTriton, Projections


class BiasForward(Projections):
    """The callable `triton-bias`'s build returns: the projections and frames as `triton`'s,
    then the bias, attention and pair-value kernels, then the epilogue and linear_out."""

    def __init__(self, module: OpenFoldIPA, device: torch.device, dtype: torch.dtype,
                 math_mode: str):
        from variants.triton.common import dot_modes

        super().__init__(module, device, dtype)
        modes = dot_modes(dtype, math_mode)
        # 16-bit inputs: the point cross term and p.v_pts as 3xBF16 (`triton_ipa`'s default)
        self.modes = dataclasses.replace(modes, split_bf16=dtype != torch.float32)
        self.value_precision = modes.bias  # the pair values' dot: as the bias GEMM's
        self.w_b = module.linear_b.weight.detach().contiguous()

    @torch.no_grad()
    def __call__(self, s, z, translations, rotations, mask):
        from variants.openfold.pair_values import launch_pair_values
        from variants.triton import frames
        from variants.triton.attention import launch_attention
        from variants.triton.pair_bias import launch_pair_bias

        cfg = self.config
        q, k, v, pts, cat = self.project(s, z, translations, rotations, mask, frames.OPERANDS)
        B, N = s.shape[:2]
        H, C = cfg.no_heads, cfg.c_hidden
        logits = launch_pair_bias(z, self.w_b, self.modes.bias, mask=mask.float().contiguous(),
                                  scale=math.sqrt(1.0 / 3), mask_inf=cfg.inf,
                                  dtype=torch.float32)
        stats = torch.empty(B, N, H, 3, dtype=torch.float32, device=s.device)
        o = cat[..., :H * C].view(B, N, H, C)
        o_pt = launch_attention(q, k, v, pts.q_pts, pts.k_pts, pts.v_pts, pts.centred_t,
                                self.point_weight, o, logits, self.modes, stats=stats,
                                q_scale=self.q_scale, write_logits=True)
        o_pair = cat[..., cat.shape[2] - H * cfg.c_z:].view(B, N, H, cfg.c_z)
        launch_pair_values(logits, stats, z, o_pair, self.value_precision)
        return self.finish(o_pt, rotations, pts, cat)


class OpenFoldTritonBias(OpenFoldTriton):
    name = "triton-bias"
    description = ("pair bias, attention and pair values as three Triton kernels: z read "
                   "twice, the logits as a (B, H, N, N) fp32 tensor")
    forward_class = BiasForward

    def code_paths(self):
        here = Path(__file__).resolve().parent
        return [here / "triton_bias.py", here / "pair_values.py", here / "triton_fused.py",
                *(here.parent / "triton" / f for f in ("attention.py", "pair_bias.py",
                                                       "common.py", "frames.py", "tf32.py")),
                here.parent / "base2.py"]

    def import_kernels(self) -> None:
        from variants.openfold import pair_values  # noqa: F401
        from variants.triton import attention, pair_bias  # noqa: F401
