"""torch.compile(reference): what a user tries first.

The reference module under `torch.compile` (Inductor, static shapes). Inductor fuses the
point-difference reduction, so the (B, N, N, H, Qp, 3) tensor is never written, but the
(B, H, N, N) logits/attention still are. Compilation happens on the first call, which the
harness times separately as build time; each new shape recompiles. Every build starts from
a reset Dynamo cache: each (config, shape, dtype) gets its own static-shape compile, and a
sweep never reaches Dynamo's recompile limit, past which it would silently run eager.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from variants import reference
from variants.base import IPAFunction, Variant
from variants.problem import IPAConfig, Precision, get_precision
from variants.reference import checked, make_module


@dataclass(frozen=True)
class KnownWrong:
    """A cell where Inductor's code for the reference is wrong, with what showed it."""

    torch_version: str  # major.minor the finding holds for
    device: str
    batch: int
    length: int
    evidence: str
    config: IPAConfig = IPAConfig()  # AlphaFold2's layer

    def matches(self, config: IPAConfig, batch: int, length: int, device: str) -> bool:
        return (torch.__version__.startswith(self.torch_version + ".")
                and (self.config, self.device, self.batch, self.length)
                == (config, device, batch, length))


# Found by the registry tests and the H200 sweep (torch 2.11.0+cu130, 2026-12-02), at the
# default AlphaFold2 layer: compiled vs eager in float64 differs, `aot_eager` is exact
# (gpu_diagnostics/compile_probe.py; docs/perf-notes.md); standalone, torch only:
# docs/repro/torch_compile_ipa.py (docs/reliability.md).
KNOWN_WRONG = (
    KnownWrong("2.11", "cuda", 2, 97, "Inductor (torch 2.11) miscompiles the reference at "
               "B=2, N=97: compiled vs eager rel_l2 3e5 in float64, aot_eager exact"),
    KnownWrong("2.11", "cuda", 1, 3000, "Inductor (torch 2.11) miscompiles the reference at "
               "N=3000: compiled vs eager rel_l2 95 in float64, aot_eager exact"),
)


class InductorCompiled:
    """What every problem's `torch-compile` variant shares (a mixin before its `Variant`):
    Inductor's limits, and a static-shape compile from a reset Dynamo cache, so that each
    build is compiled afresh and a sweep never reaches Dynamo's recompile limit, past which it
    would silently run eager."""

    supports_backward = True

    def not_supported_reasons(self, config, device, precision):
        reasons = super().not_supported_reasons(config, device, precision)
        if torch.device(device).type == "cpu" and get_precision(precision).name == "fp16":
            reasons.append("Inductor's CPU backend does not handle fp16 matmuls reliably")
        return reasons

    @staticmethod
    def compile(module: torch.nn.Module):
        torch._dynamo.reset()
        return torch.compile(module, dynamic=False)


class Compiled(InductorCompiled, Variant):
    name = "torch-compile"
    description = "torch.compile(reference), Inductor, static shapes"

    def code_paths(self):
        return [*super().code_paths(), Path(reference.__file__)]  # it compiles the reference

    def known_issues(self, config, batch, length, device, precision) -> list[str]:
        device = torch.device(device).type
        return [k.evidence for k in KNOWN_WRONG if k.matches(config, batch, length, device)]

    def build(self, state_dict, config, device, precision: str | Precision) -> IPAFunction:
        dtype = get_precision(precision).dtype
        module = make_module(state_dict, config, device, dtype)
        fn = checked(self.compile(module), config, device, dtype)
        fn.parameters = module.named_parameters  # state_dict names, for gradients
        return fn
