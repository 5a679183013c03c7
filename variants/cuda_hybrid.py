"""cuda-hybrid: a CUDA kernel for the attention probabilities, PyTorch for everything else.

The seed's first design, done right: PyTorch computes the pair bias (`pair_repr @ W^T`, then
permuted to (B, H, N, N)); one CUDA kernel computes, per (batch, head, query row),
softmax_j(q.k/sqrt(d) - softplus(w)/2 * |qp_i - kp_j|^2 + bias) with the squared point distance
computed directly (no |q|^2 + |k|^2 - 2 q.k expansion, which cancels catastrophically at
Angstrom-scale coordinates) and writes the probabilities (B, H, N, N) in float32; PyTorch then
aggregates [v | value points] with one batched matmul and finishes as the reference does.
It is the straightforward point of comparison for cuda-fused, and its N x N memory (bias,
permuted bias, probabilities) shows in the memory column on purpose.

Differences from the reference: frame transforms and the aggregation run in float32; LayerNorm
and the projections in float32 for float32 inputs, in bf16 on tensor cores for bf16 ones (the
projection returned in float32, `variants.cuda_ext`); the pair bias is computed in the input
dtype, as the reference does; probabilities are float32 for both dtypes; the softmax runs in base 2.

Caveats: forward only; float32 (IEEE) and bfloat16; O(B H N^2) memory (about 2.4 GB at
N = 4096, B = 1, H = 12 in float32). The first call of a process builds or loads the extension
(`variants.cuda_ext`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from variants.base import IPAFunction, Variant
from variants.cuda_ext import (
    CODE_PATHS,
    Weights,
    Widths,
    check_call_inputs,
    finish_on_gpu,
    load_extension,
    project_on_gpu,
)
from variants.problem import Precision, get_precision


def attention_probabilities(
    q: torch.Tensor,
    k: torch.Tensor,
    bias: torch.Tensor,
    point_weight: torch.Tensor,
    *,
    dqp: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernel alone. q, k: (B, H, N, wq) float32 rows [q / sqrt(d) (resp. k), zero pad to
    dqp | points (global frame), zero pad]; bias: (B, H, N, N) float32 or bfloat16;
    point_weight: (H,) float32 -softplus(w)/2. Returns probs (B, H, N, N) float32, every
    element written (pass `out` to reuse or poison a buffer)."""
    b, h, n, _ = q.shape
    if out is None:
        out = torch.empty(b, h, n, n, device=q.device, dtype=torch.float32)
    load_extension().hybrid_probs(q, k, bias, point_weight, out, dqp)
    return out


class CudaHybrid(Variant):
    name = "cuda-hybrid"
    description = "CUDA kernel for the (B,H,N,N) attention probabilities; PyTorch around it"
    devices = ("cuda",)
    precisions = ("fp32", "bf16")
    requires = ("cuda", "nvcc", "ninja")
    limits = {"query_points": (1, 16), "value_points": (1, 16), "head_dim": (8, 128)}

    def code_paths(self):
        return [*super().code_paths(), *CODE_PATHS]

    def build(self, state_dict, config, device, precision: str | Precision) -> IPAFunction:
        precision = get_precision(precision)
        dtype = precision.dtype
        load_extension()  # the build time is paid here, never in a timed call
        weights = Weights(state_dict, config, device, dtype)
        widths = Widths.for_lanes(config, 1)
        q_scale = 1.0 / config.head_dim**0.5
        pair_weight = weights.pair_bias.to(dtype)  # the bias GEMM runs in the input dtype
        device = weights.device

        def forward(node_repr, pair_repr, translations, rotations):
            check_call_inputs(config, device, dtype, node_repr, pair_repr, translations, rotations)
            ops = project_on_gpu(weights, node_repr, translations, rotations, widths=widths,
                                 q_scale=q_scale)
            # (B, N, N, H) -> (B, H, N, N): rows of one (b, h, i) contiguous for the kernel.
            bias = F.linear(pair_repr, pair_weight).permute(0, 3, 1, 2).contiguous()
            probs = attention_probabilities(
                ops.q, ops.k, bias, weights.point_weight, dqp=widths.dqp
            )
            del bias
            attended = torch.matmul(probs, ops.v)  # (B, H, N, wv), float32
            return finish_on_gpu(weights, attended.permute(0, 2, 1, 3).contiguous(), ops, dtype)

        return forward
