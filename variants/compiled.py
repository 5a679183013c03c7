"""torch.compile(reference): what a user tries first.

The reference module under `torch.compile` (Inductor, static shapes). Inductor fuses the
point-difference reduction, so the (B, N, N, H, Qp, 3) tensor is never written, but the
(B, H, N, N) logits/attention still are. Compilation happens on the first call, which the
harness times separately as build time; each new shape recompiles. Every build starts from
a reset Dynamo cache: each (config, shape, dtype) gets its own static-shape compile, and a
sweep never reaches Dynamo's recompile limit, past which it would silently run eager.
"""

from __future__ import annotations

import torch

from variants.base import IPAFunction, Variant
from variants.problem import Precision, get_precision
from variants.reference import make_module


class Compiled(Variant):
    name = "torch-compile"
    description = "torch.compile(reference), Inductor, static shapes"

    def not_supported_reasons(self, config, device, precision):
        reasons = super().not_supported_reasons(config, device, precision)
        if torch.device(device).type == "cpu" and get_precision(precision).name == "fp16":
            reasons.append("Inductor's CPU backend does not handle fp16 matmuls reliably")
        return reasons

    def build(self, state_dict, config, device, precision: str | Precision) -> IPAFunction:
        module = make_module(state_dict, config, device, get_precision(precision).dtype)
        torch._dynamo.reset()
        return torch.compile(module, dynamic=False)
