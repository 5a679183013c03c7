"""Variants with one deliberate mistake each, for proving that the checks catch bugs.

Each is the reference module with one method overridden; `planted_variant(module_cls)`
wraps such a module class as a registry `Variant`.
"""

from __future__ import annotations

import torch

from variants.base import Variant
from variants.problem import get_precision
from variants.reference import IPAReference


class InverseFrameWithR(IPAReference):
    """Bug: the inverse frame multiplies by R instead of R^T."""

    def _apply_inv_frame(self, pts, rotations, translations):
        centered = pts - translations.unsqueeze(2)
        return torch.einsum("bnpc,bncd->bnpd", centered, rotations)


def planted_variant(module_cls: type[IPAReference], name: str) -> type[Variant]:
    """A Variant class that builds `module_cls` with the given weights."""

    class Planted(Variant):
        description = f"planted bug: {module_cls.__doc__.strip()}"

        def build(self, state_dict, config, device, precision):
            module = module_cls(*config.module_args())
            module.load_state_dict(state_dict)
            return module.to(device, get_precision(precision).dtype).eval()

    Planted.name = name
    Planted.__qualname__ = Planted.__name__ = f"Planted_{module_cls.__name__}"
    return Planted


InverseFrameBug = planted_variant(InverseFrameWithR, "planted-inverse-frame")
