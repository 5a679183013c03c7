"""What a variant is: capabilities as data, reasons it cannot run, and a build step.

A variant is a class with class attributes describing what it supports and a `build`
method that turns a set of weights (the SPEC state_dict) into the callable the harness
times: `fn(node_repr, pair_repr, translations, rotations) -> out`. Subclasses extend
`not_supported_reasons` with `super()` (the xformers pattern) and never fall back to
another implementation.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar

import torch

from variants.problem import IPAConfig, IPAInputError, Precision, get_precision

# What `Variant.build` returns. It may carry `kernel_info`, a callable returning which kernel
# the last call ran (a kernel class, the autotuner's choice); rows record it in `kernel`.
IPAFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".h", ".cpp")


def source_digest(roots: Iterable[Path], suffixes: tuple[str, ...] = SOURCE_SUFFIXES) -> str:
    """Short sha256 of the source files under `roots`, folders or single files (names and
    contents; build folders and caches skipped): identifies the code that ran where git cannot
    (a copied tree)."""
    digest = hashlib.sha256()
    for root in roots:
        root = Path(root)
        if root.is_file():
            digest.update(root.name.encode())
            digest.update(root.read_bytes())
            continue
        for path in sorted(root.rglob("*")):
            parts = path.relative_to(root).parts
            if path.suffix in suffixes and not {"build", "__pycache__"} & set(parts):
                digest.update("/".join(parts).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


# Requirement names a variant may list in `requires`, each with the check that explains it.
REQUIREMENTS = ("cuda", "nvcc", "ninja", "triton")


@functools.cache
def _nvcc_path() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        return os.path.join(cuda_home, "bin", "nvcc")
    return shutil.which("nvcc")


def requirement_reason(requirement: str, device: str) -> str | None:
    """Why `requirement` is not met on `device` here, or None when it is."""
    if requirement == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device (torch.cuda.is_available() is False)"
        return None
    if requirement == "nvcc":
        if _nvcc_path() is None:
            return "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
        if torch.version.cuda is None:
            return f"this torch ({torch.__version__}) is a CPU build without CUDA headers"
        return None
    if requirement == "ninja":
        if shutil.which("ninja") is None and importlib.util.find_spec("ninja") is None:
            return "ninja not found (torch builds CUDA extensions with it: pip install ninja)"
        return None
    if requirement == "triton":
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed"
        if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            return "triton runs on CPU only under the interpreter (set TRITON_INTERPRET=1)"
        return None
    raise ValueError(f"requirement: expected one of {REQUIREMENTS}, got {requirement!r}")


class Variant:
    """Base class of every IPA implementation in the registry."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    is_baseline: ClassVar[bool] = False
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    precisions: ClassVar[tuple[str, ...]] = ("fp64", "fp32", "tf32", "fp16", "bf16")
    supports_backward: ClassVar[bool] = False
    # The problems it implements (`harness.problems`: "simplified", "openfold").
    problems: ClassVar[tuple[str, ...]] = ("simplified",)
    requires: ClassVar[tuple[str, ...]] = ()
    # Limits on the config, checked by the base class: name -> (min, max), inclusive.
    limits: ClassVar[dict[str, tuple[int, int]]] = {}

    def not_supported_reasons(
        self, config: IPAConfig, device: str, precision: str | Precision
    ) -> list[str]:
        """Every reason this variant cannot run `config` on `device` in `precision` here.

        Empty means runnable. Subclasses call `super()` and append their own.
        """
        precision = get_precision(precision)
        device = torch.device(device).type
        reasons = []
        if device not in self.devices:
            reasons.append(f"device {device!r} not supported (supports {list(self.devices)})")
        if precision.name not in self.precisions:
            reasons.append(
                f"precision {precision.name!r} not supported (supports {list(self.precisions)})"
            )
        if precision.math_mode == "tf32" and device != "cuda":
            reasons.append("tf32 is a CUDA math mode")
        for requirement in self.requires:
            reason = requirement_reason(requirement, device)
            if reason:
                reasons.append(reason)
        sizes = {**vars(config), "head_dim": config.head_dim}
        for key, (low, high) in self.limits.items():
            if not low <= sizes[key] <= high:
                reasons.append(f"{key}={sizes[key]} outside the supported range [{low}, {high}]")
        return reasons

    def require_supported(self, config: IPAConfig, device: str, precision: str | Precision) -> None:
        """Raise `IPAInputError` naming every reason (`not_supported_reasons`) this variant
        cannot run `config` on `device` in `precision`; a `build` calls it first."""
        reasons = self.not_supported_reasons(config, device, precision)
        if reasons:
            raise IPAInputError(f"{self.name}: cannot run here: {'; '.join(reasons)}")

    def math_mode_label(self, precision: str | Precision, config=None) -> str:
        """The row's `math_mode`: the precision's (ieee, tf32), or the scheme a variant runs
        instead, named (`fp32-3xtf32`: fp32 inputs whose dots run as three TF32 products of
        split operands), for `config` where the scheme depends on it. The tolerance is the
        precision's either way."""
        return get_precision(precision).math_mode

    def backward_reasons(self, device: str) -> list[str]:
        """Why this variant cannot run a training step (forward+backward) on `device`; empty
        when it can. Default: `supports_backward`."""
        return [] if self.supports_backward else ["forward only: the variant has no backward"]

    def code_paths(self) -> list[Path]:
        """The files and folders whose contents decide what this variant computes; their
        digest (`code_digest`) goes into every row, and a sweep re-measures a cell whose
        digest changed. Default: the module that defines the class."""
        return [Path(inspect.getsourcefile(type(self)))]

    def code_digest(self) -> str:
        return source_digest(self.code_paths())

    def known_issues(
        self, config: IPAConfig, batch: int, length: int, device: str, precision: str
    ) -> list[str]:
        """Wrong results this variant is known to give at this cell here, each with its
        evidence (data, not a hidden xfail: rows carry them in `notes` and flag
        `known-issue`; tests expect the failure). Empty by default."""
        return []

    def untimed_reason(self, device: str) -> str | None:
        """Why a latency of this variant on `device` would mean nothing (None: it is timed).
        The sweep then checks it for correctness and records it `interpreted`, untimed."""
        if "triton" in self.requires and torch.device(device).type == "cpu":
            return ("Triton on CPU runs under its interpreter (TRITON_INTERPRET=1): checked for "
                    "correctness, not timed")
        return None

    def build(
        self,
        state_dict: dict[str, torch.Tensor],
        config: IPAConfig,
        device: str,
        precision: str | Precision,
    ) -> IPAFunction:
        """Return the callable that is timed, holding `state_dict`'s weights on `device`
        in `precision`'s dtype. Slow one-time work (compilation, extension builds) belongs
        here or in the first call, never in later calls."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<variant {self.name}>"
