"""The kernels' base-2 units: one definition for every kernel whose softmax runs on exp2.

A flash-style softmax computes 2^(x - m) instead of e^(x - m): every logit term is
multiplied by log2(e) once, outside the key loop, so the kernel never multiplies per pair.
The Triton and CUDA variants and their tests and diagnostics take these units from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class Base2Units:
    """Logit factors in base-2 units, for one layer's weights."""

    q_scale: float  # log2(e) / sqrt(head_dim), applied to q (or to q . k)
    pair_weight: torch.Tensor  # (H, pair_dim): pair_bias.weight * log2(e)
    point_weight: torch.Tensor  # (H,): -softplus(head_weights) / 2 * log2(e) (negative)


def base2_units(
    pair_bias_weight: torch.Tensor, head_weights: torch.Tensor, head_dim: int
) -> Base2Units:
    """The base-2 factors from `pair_bias.weight` (H, pair_dim) and `head_weights` (H,),
    computed in float64 and returned in float32 on the weights' device, contiguous."""
    pair = (pair_bias_weight.detach().double() * LOG2E).float().contiguous()
    point = (-F.softplus(head_weights.detach().double()) / 2.0 * LOG2E).float().contiguous()
    return Base2Units(LOG2E / math.sqrt(head_dim), pair, point)
