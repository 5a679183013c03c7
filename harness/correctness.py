"""The correctness protocol of SPEC.md, with figures rather than booleans.

For each of several fresh seeds: inputs are drawn in the variant's dtype, the oracle is the
reference module in float64 on the upcast inputs, and the variant's relative L2 error is
compared with `max(2 x the reference's own error in that precision, the precision floor)`.
NaN/Inf, a wrong shape or dtype, or an input modified in place fail outright. SE(3)
invariance is judged the same way: against twice the reference's own invariance error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from variants.base import IPAFunction, Variant
from variants.problem import (
    IPAConfig,
    IPAInputs,
    Precision,
    get_precision,
    make_inputs,
    math_mode,
    random_rotations,
    validate_inputs,
)
from variants.reference import IPAReference, init_state_dict, make_module

DEFAULT_SEEDS = 5


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||, in float64; inf when `out` holds NaN or Inf or has another
    shape."""
    if not isinstance(out, torch.Tensor):
        return math.inf
    out64, ref64 = out.detach().double(), ref.detach().double()
    if out64.shape != ref64.shape or not torch.isfinite(out64).all():
        return math.inf
    return ((out64 - ref64).norm() / ref64.norm().clamp_min(1e-300)).item()


def max_abs(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not isinstance(out, torch.Tensor):
        return math.inf
    out64 = out.detach().double()
    if out64.shape != ref.shape or not torch.isfinite(out64).all():
        return math.inf
    return (out64 - ref.detach().double()).abs().max().item()


def tolerance(reference_err: float, precision: Precision) -> float:
    """SPEC: pass when err <= max(2 x the reference's own error, the precision's floor)."""
    return max(2.0 * reference_err, precision.tol_floor)


INPUT_NAMES = ("node_repr", "pair_repr", "translations", "rotations")


@dataclass
class OutputJudgement:
    """One output against the oracle: the error figures and every failure, by one routine
    (`judge_output`) that `check`, the sweep, the registry tests and `diagnose` share."""

    rel_l2: float
    max_abs: float
    reference_rel_l2: float
    tol: float
    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def err_over_tol(self) -> float:
        return self.rel_l2 / self.tol if math.isfinite(self.rel_l2) else math.inf


def judge_output(
    out: object,
    oracle: torch.Tensor,
    reference_err: float,
    precision: Precision,
    *,
    inputs: IPAInputs,
    pristine: IPAInputs,
) -> OutputJudgement:
    """Judge a variant's `out` for `inputs` against the float64 `oracle`.

    Fails outright: not a tensor, a wrong shape or dtype, NaN/Inf, an input modified in place
    (`inputs` after the call against `pristine`, a copy taken before it). Otherwise the error
    fails when `rel_l2 > tolerance(reference_err, precision)`.
    """
    tol = tolerance(reference_err, precision)
    failures = []
    if not isinstance(out, torch.Tensor):
        failures.append(f"output is a {type(out).__name__}, expected a torch.Tensor")
        return OutputJudgement(math.inf, math.inf, reference_err, tol, failures)
    if tuple(out.shape) != tuple(oracle.shape):
        failures.append(f"output shape {tuple(out.shape)} != {tuple(oracle.shape)}")
    if out.dtype != precision.dtype:
        failures.append(f"output dtype {out.dtype} != {precision.dtype}")
    bad = (~torch.isfinite(out)).sum().item()
    if bad:
        failures.append(f"{bad} NaN/Inf values in the output")
    for name, now, before in zip(INPUT_NAMES, inputs.as_tuple(), pristine.as_tuple(),
                                 strict=True):
        if not torch.equal(now, before):
            failures.append(f"the variant modified its input {name}")
    err = rel_l2(out, oracle)
    if not err <= tol and not failures:
        failures.append(f"rel_l2 {err:.3e} > tol {tol:.3e}")
    return OutputJudgement(err, max_abs(out, oracle), reference_err, tol, failures)


# Largest (B, rows, N, H, Qp, 3) point-difference tensor the chunked reference materialises.
CHUNK_ELEMENTS = 2**30


def rows_per_chunk(config: IPAConfig, batch: int, length: int) -> int:
    """Query rows per chunk so the reference's biggest tensor stays under CHUNK_ELEMENTS."""
    per_row = batch * length * config.heads * config.query_points * 3
    return max(1, min(length, CHUNK_ELEMENTS // per_row))


def chunked_forward(module: IPAReference, inputs: IPAInputs) -> torch.Tensor:
    """`module(*inputs)`, computed in chunks of query rows when N x N would be too big."""
    config = IPAConfig(
        module.layer_norm.normalized_shape[0], module.pair_bias.in_features,
        module.num_heads, module.num_query_points, module.num_value_points,
    )
    chunk = rows_per_chunk(config, inputs.batch, inputs.length)
    if chunk >= inputs.length:
        return module(*inputs.as_tuple())
    return torch.cat(
        [module(*inputs.as_tuple(), query_rows=slice(i, i + chunk))
         for i in range(0, inputs.length, chunk)],
        dim=1,
    )


def oracle_forward(
    state_dict: dict[str, torch.Tensor], config: IPAConfig, inputs: IPAInputs
) -> torch.Tensor:
    """The reference in float64 on the upcast inputs, on the inputs' device (in chunks of
    query rows at large N, see `chunked_forward`)."""
    device = inputs.node_repr.device
    module = make_module(state_dict, config, device, torch.float64)
    with torch.no_grad():
        return chunked_forward(module, inputs.to(dtype=torch.float64))


def rigid_motion(inputs: IPAInputs, seed: int, shift_angstrom: float = 50.0) -> IPAInputs:
    """Apply one global rigid motion (R_g, t_g) to every frame: R_i -> R_i R_g,
    t_i -> t_i R_g + t_g (computed in float64, then stored in the inputs' dtype)."""
    g = torch.Generator().manual_seed(10_007 + seed)
    r_g = random_rotations(1, g)[0]
    t_g = torch.randn(3, generator=g, dtype=torch.float64)
    t_g = shift_angstrom * t_g / t_g.norm()
    device, dtype = inputs.node_repr.device, inputs.node_repr.dtype
    r_g, t_g = r_g.to(device), t_g.to(device)
    rot = inputs.rotations.double() @ r_g
    trans = inputs.translations.double() @ r_g + t_g
    return IPAInputs(
        inputs.node_repr, inputs.pair_repr, trans.to(dtype), rot.to(dtype)
    )


@dataclass
class CheckResult:
    """Correctness figures of one variant on one (config, batch, length, precision)."""

    variant: str
    precision: str
    device: str
    batch: int
    length: int
    config: IPAConfig
    seeds: int = 0
    rel_l2: float = math.nan  # worst over seeds
    max_abs: float = math.nan  # worst over seeds
    reference_rel_l2: float = math.nan  # the reference's own error at the worst seed
    tol: float = math.nan
    err_ratio: float = math.nan  # rel_l2 / reference_rel_l2: the honest figure
    invariance_err: float = math.nan
    invariance_tol: float = math.nan
    failures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # not-supported reasons

    @property
    def passed(self) -> bool:
        return not self.failures and not self.skipped

    @property
    def status(self) -> str:
        return "unsupported" if self.skipped else ("pass" if self.passed else "FAIL")


@dataclass(frozen=True)
class ReferenceFigures:
    """What the oracle and the reference give on one seed's inputs."""

    oracle: torch.Tensor  # the float64 oracle's output
    reference_err: float  # rel_l2 of the reference (in the checked precision) vs the oracle
    reference_invariance_err: float = math.nan  # of the reference under a rigid motion


class ReferenceCache:
    """Builds each (config, device, precision) reference once, and computes the oracle and
    reference figures of each seed's inputs once, for every variant checked with this cache.

    Entries are keyed by (config, precision, batch, length, seed, origin offset): the inputs
    those describe must be the same for every variant, as `check_variant` draws them."""

    def __init__(self, state_dict: dict[str, torch.Tensor]):
        self.state_dict = state_dict
        self._built: dict[tuple, IPAReference] = {}
        self._figures: dict[tuple, ReferenceFigures] = {}

    def get(self, config: IPAConfig, device: str, precision: Precision) -> IPAReference:
        key = (config, device, precision.name)
        if key not in self._built:
            self._built[key] = make_module(self.state_dict, config, device, precision.dtype)
        return self._built[key]

    def figures(self, key: tuple, config: IPAConfig, precision: Precision, inputs: IPAInputs,
                moved: IPAInputs | None) -> ReferenceFigures:
        """The oracle's output and the reference's errors on `inputs` (and on `moved`, the
        same inputs under a rigid motion, when given)."""
        device = str(inputs.node_repr.device)
        key = (config, device, precision.name, *key, moved is not None)
        if key not in self._figures:
            oracle = oracle_forward(self.state_dict, config, inputs)
            reference = self.get(config, device, precision)
            ref_out = chunked_forward(reference, inputs)
            invariance = (rel_l2(chunked_forward(reference, moved), ref_out)
                          if moved is not None else math.nan)
            self._figures[key] = ReferenceFigures(oracle, rel_l2(ref_out, oracle), invariance)
        return self._figures[key]


def check_variant(
    variant: Variant,
    config: IPAConfig,
    *,
    batch: int,
    length: int,
    device: str = "cpu",
    precision: str | Precision = "fp32",
    seeds: int = DEFAULT_SEEDS,
    first_seed: int = 0,
    state_dict: dict[str, torch.Tensor] | None = None,
    fn: IPAFunction | None = None,
    references: ReferenceCache | None = None,
    origin_offset: float = 100.0,
) -> CheckResult:
    """Run the correctness protocol for `variant` and return its figures.

    `fn` may pass an already-built callable (the harness builds once and times it too);
    `state_dict` defaults to `init_state_dict(config)`.
    """
    precision = get_precision(precision)
    result = CheckResult(variant.name, precision.name, device, batch, length, config)
    result.skipped = variant.not_supported_reasons(config, device, precision)
    if result.skipped:
        return result
    if state_dict is None:
        state_dict = init_state_dict(config)
    references = references or ReferenceCache(state_dict)
    if fn is None:
        fn = variant.build(state_dict, config, device, precision)

    judged: list[tuple[int, OutputJudgement]] = []
    with math_mode(precision), torch.no_grad():
        for seed in range(first_seed, first_seed + seeds):
            inputs = make_inputs(
                config, batch, length, dtype=precision.dtype, device=device, seed=seed,
                origin_offset=origin_offset,
            )
            validate_inputs(config, *inputs.as_tuple())
            moved = rigid_motion(inputs, seed) if seed == first_seed else None
            figures = references.figures((batch, length, seed, origin_offset), config,
                                         precision, inputs, moved)
            pristine = inputs.clone()
            out = fn(*inputs.as_tuple())
            judgement = judge_output(out, figures.oracle, figures.reference_err, precision,
                                     inputs=inputs, pristine=pristine)
            del pristine
            judged.append((seed, judgement))
            if moved is not None:
                # The first output is copied: a variant that returns one reused buffer must
                # not compare that buffer with itself.
                first = out.detach().clone() if isinstance(out, torch.Tensor) else out
                result.invariance_err = rel_l2(fn(*moved.as_tuple()), first)
                result.invariance_tol = tolerance(figures.reference_invariance_err, precision)

    worst = max((j for _, j in judged), key=lambda j: j.err_over_tol)
    result.seeds = len(judged)
    result.rel_l2, result.reference_rel_l2 = worst.rel_l2, worst.reference_rel_l2
    result.max_abs = max(j.max_abs for _, j in judged)
    result.tol = worst.tol
    # Undefined in fp64, where the reference is the oracle and its own error is zero.
    result.err_ratio = (worst.rel_l2 / worst.reference_rel_l2 if worst.reference_rel_l2 > 0
                        else math.nan)
    for seed, judgement in judged:  # failures no error figure shows, per seed
        result.failures += [f"seed {seed}: {f}" for f in judgement.failures
                            if not f.startswith("rel_l2")]
    failing = [seed for seed, j in judged if not j.rel_l2 <= j.tol]
    if failing:
        result.failures.append(
            f"rel_l2 {worst.rel_l2:.3e} > tol {worst.tol:.3e} (seeds {failing} of {result.seeds})"
        )
    if not result.invariance_err <= result.invariance_tol:
        result.failures.append(
            f"SE(3) invariance error {result.invariance_err:.3e} > {result.invariance_tol:.3e}"
        )
    return result

