"""The variant registry: the built-in list plus third-party entry points.

Third-party packages register a `Variant` subclass under the entry-point group
`ipa_bench.variants`, e.g. in their pyproject.toml:

    [project.entry-points."ipa_bench.variants"]
    my-kernel = "my_package.my_module:MyVariant"

Such a module is code from outside this project, and importing it runs it: it could patch
torch for everyone in the process. The harness's own process therefore never imports it. A
one-off probe process does (`_probe_entry_points`) and reports each class's declared metadata
(name, devices, precisions, limits, requirements, backward, code paths); the registry holds an
`EntryPointVariant` built from that, and only the worker process that builds the variant
imports the module again (issue #14: nothing a variant imports can change the reference's or
another variant's numbers).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

from variants.base import Variant
from variants.compiled import Compiled
from variants.cuda_fused import CudaFused
from variants.cuda_hybrid import CudaHybrid
from variants.flex_attention import FlexAttention
from variants.openfold.cuda_fused import OpenFoldCudaFused
from variants.openfold.reference import Compiled as OpenFoldCompiled
from variants.openfold.reference import Reference as OpenFoldReference
from variants.openfold.triton_bias import OpenFoldTritonBias
from variants.openfold.triton_fused import OpenFoldTriton
from variants.problem import IPAInputError
from variants.reference import Reference
from variants.sdpa_decomposition import SdpaDecomposition
from variants.triton.variants import (
    Triton,
    TritonFullFuse,
    TritonFullFuseTrain,
    TritonGrouped,
    TritonPairDot,
    TritonTrain,
)

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
    OpenFoldReference,
    OpenFoldCompiled,
    OpenFoldTriton,
    TritonPairDot,
    OpenFoldTritonBias,
    TritonGrouped,
    OpenFoldCudaFused,
]


class UnknownVariantError(IPAInputError):
    """A variant name that is not registered (a usage error, not a variant's bug)."""


# What the probe reads of each entry point's class: the attributes `Variant`'s own checks use.
_METADATA = ("name", "description", "devices", "precisions", "supports_backward", "problems",
             "requires", "limits")
PROBE_TIMEOUT_S = 120


class EntryPointVariant(Variant):
    """A third-party variant, known here by the metadata its class declares (read by the probe
    process); `build` imports its module, which only a worker process does. The base class's
    checks (device, precision, requirements, limits) use the declared metadata; a class that
    adds its own reasons reports them when its worker builds it. `known_issues` of such a class
    are not consulted."""

    is_baseline = False

    def __init__(self, target: str, metadata: dict):
        self.target = target  # "module:attribute"
        for key in _METADATA:
            value = metadata[key]
            setattr(self, key, tuple(value) if isinstance(value, list) else value)
        self.limits = {k: tuple(v) for k, v in metadata["limits"].items()}
        self._code_paths = [Path(p) for p in metadata["code_paths"]]
        self._real: Variant | None = None

    def real(self) -> Variant:
        """The class itself, imported here (a worker's business, or a test's)."""
        if self._real is None:
            self._real = _load(self.target)()
        return self._real

    def build(self, state_dict, config, device, precision):
        return self.real().build(state_dict, config, device, precision)

    def code_paths(self) -> list[Path]:
        return self._code_paths

    def __getstate__(self):  # a worker imports the class afresh
        return {**self.__dict__, "_real": None}


def _load(target: str) -> type[Variant]:
    module, _, attribute = target.partition(":")
    cls = importlib.import_module(module)
    for part in attribute.split("."):
        cls = getattr(cls, part)
    return cls


def _describe(target: str) -> dict:
    cls = _load(target)
    if not (isinstance(cls, type) and issubclass(cls, Variant)):
        raise TypeError(f"expected a Variant subclass, got {cls!r}")
    instance = cls()
    described = {key: getattr(cls, key) for key in _METADATA}
    described["limits"] = {k: list(v) for k, v in cls.limits.items()}
    described["code_paths"] = [str(p) for p in instance.code_paths()]
    return described


def _probe_main() -> None:
    """The probe process: every entry point of the group described as JSON on stdout."""
    described = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            described.append({"target": ep.value, **_describe(ep.value)})
        except Exception as exc:  # reported by the parent, naming the entry point
            described.append({"target": ep.value, "entry_point": ep.name,
                              "error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(described))


@cache
def _probe_entry_points(targets: tuple[str, ...], path: tuple[str, ...]) -> tuple[dict, ...]:
    if not targets:
        return ()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from variants.registry import _probe_main; _probe_main()"],
            capture_output=True, text=True, env=env, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"entry points {list(targets)}: importing them took more than "
                           f"{PROBE_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"entry points {list(targets)}: the process importing them exited "
                           f"with {done.returncode}: {tail}")
    described = json.loads(done.stdout.strip().splitlines()[-1])
    for entry in described:
        if "error" in entry:
            raise TypeError(f"entry point {entry['entry_point']!r} ({entry['target']}) in group "
                            f"{ENTRY_POINT_GROUP!r}: {entry['error']}")
    return tuple(described)


def _entry_point_variants() -> list[Variant]:
    targets = tuple(ep.value for ep in entry_points(group=ENTRY_POINT_GROUP))
    return [EntryPointVariant(d["target"], d)
            for d in _probe_entry_points(targets, tuple(sys.path))]


def all_variants(problem: str = "simplified") -> dict[str, Variant]:
    """Every registered variant of `problem` by name: built-ins first, then entry points.
    Names are unique within a problem (`reference` is in each)."""
    registry: dict[str, Variant] = {}
    for variant in [cls() for cls in BUILTIN] + _entry_point_variants():
        if problem not in variant.problems:
            continue
        if variant.name in registry:
            raise ValueError(f"variant name {variant.name!r} registered twice")
        registry[variant.name] = variant
    return registry


def get_variant(name: str, problem: str = "simplified") -> Variant:
    """The variant of `problem` called `name`; an unknown name is an error listing the known
    ones."""
    registry = all_variants(problem)
    if name not in registry:
        raise UnknownVariantError(
            f"variant: unknown name {name!r} for problem {problem!r}; known variants: "
            f"{', '.join(registry)}"
        )
    return registry[name]


def baseline(problem: str = "simplified") -> Variant:
    (base,) = [v for v in all_variants(problem).values() if v.is_baseline]
    return base
