"""The variant registry: the built-in list plus third-party entry points.

Third-party packages register a `Variant` subclass under the entry-point group
`ipa_bench.variants`, e.g. in their pyproject.toml:

    [project.entry-points."ipa_bench.variants"]
    my-kernel = "my_package.my_module:MyVariant"
"""

from __future__ import annotations

from importlib.metadata import entry_points

from variants.base import Variant
from variants.compiled import Compiled
from variants.cuda_fused import CudaFused
from variants.cuda_hybrid import CudaHybrid
from variants.flex_attention import FlexAttention
from variants.problem import IPAInputError
from variants.reference import Reference
from variants.sdpa_decomposition import SdpaDecomposition
from variants.triton.variants import Triton, TritonFullFuse, TritonFullFuseTrain, TritonTrain

ENTRY_POINT_GROUP = "ipa_bench.variants"

# The built-in variants, in display order. Adding a variant: one file, one line here, at the
# end (a variant's colour and marker in every figure are its place in this list).
BUILTIN: list[type[Variant]] = [
    Reference,
    Compiled,
    Triton,
    TritonFullFuse,
    CudaHybrid,
    CudaFused,
    FlexAttention,
    SdpaDecomposition,
    TritonTrain,
    TritonFullFuseTrain,
]


class UnknownVariantError(IPAInputError):
    """A variant name that is not registered (a usage error, not a variant's bug)."""


def _entry_point_variants() -> list[type[Variant]]:
    found = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        if not (isinstance(cls, type) and issubclass(cls, Variant)):
            raise TypeError(
                f"entry point {ep.name!r} in group {ENTRY_POINT_GROUP!r}: expected a "
                f"Variant subclass, got {cls!r}"
            )
        found.append(cls)
    return found


def all_variants() -> dict[str, Variant]:
    """Every registered variant by name: built-ins first, then entry points."""
    registry: dict[str, Variant] = {}
    for cls in BUILTIN + _entry_point_variants():
        if cls.name in registry:
            raise ValueError(f"variant name {cls.name!r} registered twice")
        registry[cls.name] = cls()
    return registry


def get_variant(name: str) -> Variant:
    """The variant called `name`; an unknown name is an error listing the known ones."""
    registry = all_variants()
    if name not in registry:
        raise UnknownVariantError(
            f"variant: unknown name {name!r}; known variants: {', '.join(registry)}"
        )
    return registry[name]


def baseline() -> Variant:
    (base,) = [v for v in all_variants().values() if v.is_baseline]
    return base
