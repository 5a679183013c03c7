"""The IPA problem: configuration, inputs, precisions, a seeded input generator, input checks.

Everything here follows `SPEC.md`. Variants and the harness both import this module; it
imports neither of them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

import torch


class IPAInputError(ValueError):
    """Bad argument to a public entry point; the message names it, what was expected and given."""


@dataclass(frozen=True)
class IPAConfig:
    """Sizes of one IPA layer (AlphaFold2 structure-module defaults)."""

    node_dim: int = 384
    pair_dim: int = 128
    heads: int = 12
    query_points: int = 4
    value_points: int = 8

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise IPAInputError(f"{f.name}: expected a positive integer, got {value!r}")
        if self.node_dim % self.heads:
            raise IPAInputError(
                f"heads: expected a divisor of node_dim={self.node_dim}, got {self.heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.node_dim // self.heads

    def module_args(self) -> tuple[int, int, int, int, int]:
        """Positional arguments of the reference / KernelBench `ModelNew` constructor."""
        return (self.node_dim, self.pair_dim, self.heads, self.query_points, self.value_points)

    def columns(self) -> dict[str, int]:
        """The sizes under the results CSV's column names, shared by every problem
        (docs/problems.md)."""
        return {"node_dim": self.node_dim, "pair_dim": self.pair_dim, "heads": self.heads,
                "head_dim": self.head_dim, "query_points": self.query_points,
                "value_points": self.value_points}

    @classmethod
    def from_columns(cls, head_dim: int | None = None, **sizes: int) -> IPAConfig:
        """The inverse of `columns()`, each size defaulting to the class's own; head_dim is
        derived (node_dim // heads), so a given `head_dim` that disagrees is an
        `IPAInputError`."""
        config = cls(**sizes)
        if head_dim is not None and head_dim != config.head_dim:
            raise IPAInputError(f"head_dim: the simplified problem derives it as node_dim / "
                                f"heads = {config.head_dim}, got {head_dim}")
        return config


@dataclass(frozen=True)
class Precision:
    """A dtype plus a matmul math mode, and the tolerance floor SPEC gives for it."""

    name: str
    dtype: torch.dtype
    math_mode: str  # "ieee" or "tf32"
    tol_floor: float

    def __str__(self) -> str:
        return self.name


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp64", torch.float64, "ieee", 1e-12),
        Precision("fp32", torch.float32, "ieee", 2e-5),
        Precision("tf32", torch.float32, "tf32", 2e-3),
        Precision("fp16", torch.float16, "ieee", 1e-2),
        Precision("bf16", torch.bfloat16, "ieee", 5e-2),
    )
}


def get_precision(name: str | Precision) -> Precision:
    if isinstance(name, Precision):
        return name
    aliases = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
    key = aliases.get(name, name)
    if key not in PRECISIONS:
        raise IPAInputError(f"dtype: expected one of {sorted(PRECISIONS)}, got {name!r}")
    return PRECISIONS[key]


class ForwardInputs:
    """What a problem's inputs dataclass shares: its fields are the forward's tensors in
    argument order, the first one (B, N, ...)."""

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def to(self, device=None, dtype=None):
        return type(self)(*(t.to(device=device, dtype=dtype) for t in self.as_tuple()))

    def clone(self):
        return type(self)(*(t.clone() for t in self.as_tuple()))

    @property
    def batch(self) -> int:
        return self.as_tuple()[0].shape[0]

    @property
    def length(self) -> int:
        return self.as_tuple()[0].shape[1]


@dataclass
class IPAInputs(ForwardInputs):
    """The four forward inputs (SPEC 'Inputs'), all on one device in one dtype."""

    node_repr: torch.Tensor  # (B, N, node_dim)
    pair_repr: torch.Tensor  # (B, N, N, pair_dim)
    translations: torch.Tensor  # (B, N, 3), Angstrom
    rotations: torch.Tensor  # (B, N, 3, 3), proper rotations, row-vector convention


def random_rotations(count: int, generator: torch.Generator) -> torch.Tensor:
    """Uniformly random proper rotations (float64, (count, 3, 3)) from random unit quaternions."""
    quat = torch.randn(count, 4, generator=generator, dtype=torch.float64)
    w, x, y, z = (quat / quat.norm(dim=-1, keepdim=True)).unbind(-1)
    return torch.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    ).view(count, 3, 3)


CA_STEP_ANGSTROM = 3.8


def random_rigid_motion(seed: int, shift_angstrom: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded global rigid motion for invariance checks (float64, CPU): a uniformly random
    rotation R_g and a translation t_g of length `shift_angstrom` in a random direction."""
    g = torch.Generator().manual_seed(10_007 + seed)
    r_g = random_rotations(1, g)[0]
    t_g = torch.randn(3, generator=g, dtype=torch.float64)
    return r_g, shift_angstrom * t_g / t_g.norm()


def make_inputs(
    config: IPAConfig,
    batch: int,
    length: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    origin_offset: float = 100.0,
) -> IPAInputs:
    """Seeded inputs following SPEC: random rotations, a C-alpha-like chain of 3.8 A steps
    centred and then moved `origin_offset` Angstrom from the origin in a random direction
    (PDB coordinates sit 50-150 A away), standard-normal features.

    Frames are drawn in float64 on the CPU; the features (the bulk: pair_repr is
    B x N x N x pair_dim) are drawn on `device` in float32 (float64 when `dtype` is), so
    large inputs cost no host time. Everything is then cast to `dtype`; upcast the result
    for the oracle so every path sees the same quantised values. Values depend on the seed
    and on the device type (CPU and CUDA generators differ).
    """
    if batch < 1 or length < 1:
        raise IPAInputError(f"batch, length: expected >= 1, got batch={batch}, length={length}")
    device = torch.device(device)
    f64 = torch.float64
    g = torch.Generator().manual_seed(seed)
    rotations = random_rotations(batch * length, g).view(batch, length, 3, 3)
    steps = torch.randn(batch, length, 3, generator=g, dtype=f64)
    steps = CA_STEP_ANGSTROM * steps / steps.norm(dim=-1, keepdim=True)
    chain = steps.cumsum(dim=1)
    chain = chain - chain.mean(dim=1, keepdim=True)
    direction = torch.randn(batch, 1, 3, generator=g, dtype=f64)
    translations = chain + origin_offset * direction / direction.norm(dim=-1, keepdim=True)

    feature_dtype = f64 if dtype == f64 else torch.float32
    gd = torch.Generator(device=device).manual_seed(seed)
    node = torch.randn(batch, length, config.node_dim, generator=gd, dtype=feature_dtype,
                       device=device)
    pair = torch.randn(batch, length, length, config.pair_dim, generator=gd,
                       dtype=feature_dtype, device=device)
    return IPAInputs(
        node.to(dtype), pair.to(dtype), translations.to(device, dtype), rotations.to(device, dtype)
    )


def expect_tensors(named: dict[str, object]) -> None:
    """Raise `IPAInputError` naming the first of the named inputs that is not a tensor."""
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise IPAInputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def expect_shape(name: str, tensor: torch.Tensor, expected: tuple, meaning: str) -> None:
    """Raise `IPAInputError` unless `tensor` has shape `expected` (`meaning` names its axes)."""
    if tuple(tensor.shape) != tuple(expected):
        raise IPAInputError(
            f"{name}: expected shape {tuple(expected)} ({meaning}), got {tuple(tensor.shape)}"
        )


def expect_one_dtype_and_device(
    named: dict[str, torch.Tensor],
    *,
    dtypes: tuple[torch.dtype, ...] | None,
    device: str | torch.device | None,
    require_contiguous: bool,
) -> None:
    """Raise `IPAInputError` unless the named inputs share the first one's floating dtype (one
    of `dtypes` if given) and one device (`device` if given), and, if asked, are contiguous.
    A problem's `validate_inputs` calls it after the shapes."""
    anchor, first = next(iter(named.items()))
    dtype = first.dtype
    if not dtype.is_floating_point:
        raise IPAInputError(f"{anchor}: expected a floating dtype, got {dtype}")
    if dtypes is not None and dtype not in dtypes:
        raise IPAInputError(f"{anchor}: expected dtype in {list(dtypes)}, got {dtype}")
    want_device = torch.device(device) if device is not None else first.device
    for name, t in named.items():
        if t.dtype != dtype:
            raise IPAInputError(f"{name}: expected dtype {dtype} (as {anchor}), got {t.dtype}")
        if t.device.type != want_device.type or (
            want_device.index is not None and t.device != want_device
        ):
            raise IPAInputError(f"{name}: expected device {want_device}, got {t.device}")
        if require_contiguous and not t.is_contiguous():
            raise IPAInputError(
                f"{name}: expected a contiguous tensor, got strides {t.stride()} "
                f"for shape {tuple(t.shape)} (call .contiguous())"
            )


def rotation_tolerance(dtype: torch.dtype) -> float:
    """How far from orthonormal / det +1 a rotation stored in `dtype` may be."""
    return max(1e-4, 10 * torch.finfo(dtype).eps)


def validate_inputs(
    config: IPAConfig,
    node_repr: torch.Tensor,
    pair_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
    *,
    dtypes: tuple[torch.dtype, ...] | None = None,
    device: str | torch.device | None = None,
    require_contiguous: bool = False,
    check_values: bool = True,
) -> None:
    """Raise `IPAInputError` unless the four inputs fit `config` and each other.

    Checks shapes (B and N agree across inputs, feature sizes match the config), that all
    share one dtype (one of `dtypes` if given) and one device (`device` if given),
    contiguity if asked, and, if `check_values`, the values (`check_input_values`). The
    metadata checks cost microseconds and every variant's callable runs them; the value
    checks read every element and are left to `check`, `diagnose` and library callers.
    """
    named = {
        "node_repr": node_repr,
        "pair_repr": pair_repr,
        "translations": translations,
        "rotations": rotations,
    }
    expect_tensors(named)
    if node_repr.dim() != 3:
        raise IPAInputError(
            f"node_repr: expected 3 dims (B, N, node_dim), got shape {tuple(node_repr.shape)}"
        )
    b, n, _ = node_repr.shape
    expect_shape("node_repr", node_repr, (b, n, config.node_dim), "B, N, node_dim")
    expect_shape("pair_repr", pair_repr, (b, n, n, config.pair_dim), "B, N, N, pair_dim")
    expect_shape("translations", translations, (b, n, 3), "B, N, 3")
    expect_shape("rotations", rotations, (b, n, 3, 3), "B, N, 3, 3")
    expect_one_dtype_and_device(named, dtypes=dtypes, device=device,
                                require_contiguous=require_contiguous)
    if check_values:
        check_input_values(node_repr, pair_repr, translations, rotations)


def check_input_values(
    node_repr: torch.Tensor,
    pair_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
) -> None:
    """Raise `IPAInputError` unless every input is finite and the rotations are proper
    rotations (R R^T = I and det R = +1 within `rotation_tolerance` of their dtype).

    The one place for value checks. It reads every element and synchronises with the device
    (at N = 4096 a finiteness scan of pair_repr costs about as much as a fused kernel), so it
    stays out of timed paths: `check`, `diagnose` and `validate_inputs(check_values=True)`
    call it.
    """
    named = {"node_repr": node_repr, "pair_repr": pair_repr, "translations": translations,
             "rotations": rotations}
    for name, t in named.items():
        bad = t.numel() - torch.isfinite(t).sum().item()
        if bad:
            raise IPAInputError(f"{name}: expected finite values, got {bad} NaN/Inf of "
                                f"{t.numel()}")
    if not rotations.numel():
        return
    r = rotations.detach().to(torch.float64)
    eye = torch.eye(3, dtype=torch.float64, device=r.device)
    ortho_err = (r @ r.transpose(-1, -2) - eye).abs().amax().item()
    det_min = torch.linalg.det(r).amin().item()
    tol = rotation_tolerance(rotations.dtype)
    if ortho_err > tol:
        raise IPAInputError(
            f"rotations: expected orthonormal matrices (|R R^T - I| <= {tol:.1e}), "
            f"got max deviation {ortho_err:.3e} (a scaled or sheared matrix?)"
        )
    if det_min < 1 - 3 * tol:
        raise IPAInputError(
            f"rotations: expected proper rotations (det +1), got det as low as {det_min:.4f} "
            "(a reflection?)"
        )


@contextlib.contextmanager
def math_mode(precision: str | Precision):
    """Set torch's CUDA matmul TF32 switch for `precision` (on for tf32, off otherwise),
    restoring the previous state on exit."""
    precision = get_precision(precision)
    matmul = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32)
    tf32 = precision.math_mode == "tf32"
    matmul.allow_tf32, cudnn.allow_tf32 = tf32, tf32
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved
