"""Problem `openfold`'s `triton-bias` variant: the layer's O(N^2) part as three Triton kernels
with the logits held as a (B, H, N, N) fp32 tensor, z read twice, and a training step: the same
kernels as a custom op (`core_op.py`) with an exact backward (`bias_backward.py`, two more
passes over z). The design problem simplified's `triton` and `triton-train` use (issue #18,
deliverables 3 and 6).

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
which wins where. A training step keeps the logits and adds a second buffer of that size (G,
then dS) to d z; it reads z four times and writes d z once (`bias_backward.py`).

Deviations from the reference (none changes the function): linear_b's bias is dropped (a
constant per head, the same for every (i, j): the softmax cancels it; its gradient is exactly
zero, and the training step returns that); the mask adds
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

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from variants.openfold.problem import validate_inputs
from variants.openfold.reference import OpenFoldIPA
from variants.openfold.triton_fused import OpenFoldTriton, Projections, point_weight


class BiasForward(Projections):
    """The callable `triton-bias`'s build returns. Without autograd: the projections and frames
    as `triton`'s (two GEMMs, the frame prologue), the core's three kernels writing into
    linear_out's input, the epilogue and linear_out. When a gradient is needed (an input or
    the module's parameters require grad): the same core as a custom op with an exact backward
    (`core_op.py`), the frames as `frames_op`'s custom ops (the same kernels, with backward
    kernels), the rest of the O(N) work in PyTorch from the module's parameters, differentiated
    by autograd. `module` holds the parameters (`harness.runner` finds them there), read on
    every call."""

    def __init__(self, module: OpenFoldIPA, device: torch.device, dtype: torch.dtype,
                 math_mode: str):
        self.bias_scale = math.sqrt(1.0 / 3)
        super().__init__(module, device, dtype, math_mode)

    def take_weights(self) -> None:
        super().take_weights()
        self._taken_at = self._versions()

    def _versions(self) -> tuple[int, ...]:
        return tuple(p._version for p in self.module.parameters())

    def _current_weights(self) -> None:
        """The no-grad path's concatenated weights (`Projections`), taken again after any
        in-place change of the module's parameters (an optimizer step)."""
        if self._versions() != self._taken_at:
            self.take_weights()

    def __call__(self, s, z, translations, rotations, mask):
        if torch.is_grad_enabled() and (
                any(t.requires_grad for t in (s, z, translations, rotations))
                or any(p.requires_grad for p in self.module.parameters())):
            return self._differentiable(s, z, translations, rotations, mask)
        return self._no_grad(s, z, translations, rotations, mask)

    @torch.no_grad()
    def _no_grad(self, s, z, translations, rotations, mask):
        from variants.openfold.core_op import pair_bias, run_core
        from variants.triton import frames

        self._current_weights()
        cfg = self.config
        self.check(s, z, translations, rotations, mask)
        mask = mask.float().contiguous()
        # The bias reads only z and the mask, so it goes first: the GPU runs it (a full read
        # of z) while the host issues the projections and frames. Eager latency on the H100,
        # fp32 N = 2048 (2026-12-05, twentieth session): 2.493 ms after them, 2.381 first.
        scales = dict(math_mode=self.math_mode, bias_scale=self.bias_scale, inf=cfg.inf)
        bias = pair_bias(z, self.module.linear_b.weight, mask, **scales)
        q, k, v, pts, cat = self.project(s, translations, rotations, frames.OPERANDS)
        B, N = s.shape[:2]
        H, C = cfg.no_heads, cfg.c_hidden
        o = cat[..., :H * C].view(B, N, H, C)
        o_pair = cat[..., cat.shape[2] - H * cfg.c_z:].view(B, N, H, cfg.c_z)
        o_pt, _, _ = run_core(q, k, v, pts.q_pts, pts.k_pts, pts.v_pts, pts.centred_t, z,
                              self.module.linear_b.weight, self.point_weight, mask, o, o_pair,
                              q_scale=self.q_scale, bias=bias, **scales)
        return self.finish(o_pt, rotations, pts, cat)

    def _differentiable(self, s, z, translations, rotations, mask):
        """SPEC steps 1-3 and 8-12 around `core_op.bias_core_op`: the frames by `frames_op`,
        the rest in PyTorch."""
        from variants.openfold.core_op import bias_core_op
        from variants.triton import frames_op
        from variants.triton.common import check_runnable

        cfg, mod = self.config, self.module
        validate_inputs(cfg, s, z, translations, rotations, mask, dtypes=(self.dtype,),
                        device=self.device, check_values=False)
        check_runnable("s", s)
        B, N, _ = s.shape
        H, C, Pq, Pv = cfg.no_heads, cfg.c_hidden, cfg.no_qk_points, cfg.no_v_points
        qkv = F.linear(s, *self.qkv_weights())  # [q | k | v]
        # Split, not sliced: under autograd one split's backward is one concatenation, where each
        # slice's is a zero fill and a copy, added up.
        q, k, v = (t.view(B, N, H, C) for t in qkv.split(H * C, dim=-1))
        y = F.linear(s.float(), *self.point_projection_weights())  # [q_pts | kv_pts]
        # Points in fp32, in a frame centred on each batch element's mean translation.
        q_pts, k_pts, v_pts, centred_t = frames_op.prologue(
            y, rotations, translations, heads=H, query_points=Pq, value_points=Pv,
            convention="openfold")
        o, o_pt, o_pair, _, _ = bias_core_op(
            q, k, v, q_pts, k_pts, v_pts, centred_t.detach(), z, mod.linear_b.weight,
            mod.linear_b.bias, point_weight(mod.head_weights.float(), Pq),
            mask.float().contiguous(), self.math_mode, self.q_scale, self.bias_scale, cfg.inf)
        # SPEC steps 8-10: o_pt to each query's frame, [X | Y | Z | norms]
        local = frames_op.epilogue(o_pt, rotations, centred_t, torch.float32,
                                   convention="openfold", eps=cfg.eps)
        cat = torch.cat([o.reshape(B, N, H * C).float(), local,
                         o_pair.reshape(B, N, H * cfg.c_z)], dim=-1)
        return mod.linear_out(cat.to(self.dtype))


class OpenFoldTritonBias(OpenFoldTriton):
    name = "triton-bias"
    supports_backward = True
    description = ("pair bias, attention and pair values as three Triton kernels: z read "
                   "twice, the logits as a (B, H, N, N) fp32 tensor")
    forward_class = BiasForward

    def code_paths(self):
        here = Path(__file__).resolve().parent  # the kernels it shares: all of triton/
        return [*(here / f for f in ("triton_bias.py", "pair_values.py", "triton_fused.py",
                                     "triton_kernel.py", "core_op.py", "bias_backward.py")),
                here.parent / "triton", here.parent / "base2.py", here.parent / "custom_ops.py"]

    def import_kernels(self) -> None:
        from variants.openfold import pair_values  # noqa: F401
        from variants.triton import attention, pair_bias  # noqa: F401
