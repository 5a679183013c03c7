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

from harness.runner import BuildSpec, InputRecipe, LocalRunner, RunOutput, rigid_motion
from harness.worker import Worker
from variants.base import IPAFunction, Variant
from variants.problem import (
    IPAConfig,
    IPAInputs,
    Precision,
    get_precision,
    math_mode,
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
    result: RunOutput, oracle: torch.Tensor, reference_err: float, precision: Precision
) -> OutputJudgement:
    """Judge one call's `result` against the float64 `oracle` of its inputs.

    Fails outright: not a tensor, a wrong shape or dtype, NaN/Inf, an input modified in
    place. Otherwise the error fails when `rel_l2 > tolerance(reference_err, precision)`.
    """
    tol = tolerance(reference_err, precision)
    failures = []
    out = result.out
    if out is None:
        failures.append(f"output is a {result.returned}, expected a torch.Tensor")
        return OutputJudgement(math.inf, math.inf, reference_err, tol, failures)
    out = out.to(oracle.device)
    if tuple(out.shape) != tuple(oracle.shape):
        failures.append(f"output shape {tuple(out.shape)} != {tuple(oracle.shape)}")
    if out.dtype != precision.dtype:
        failures.append(f"output dtype {out.dtype} != {precision.dtype}")
    bad = (~torch.isfinite(out)).sum().item()
    if bad:
        failures.append(f"{bad} NaN/Inf values in the output")
    failures += [f"the variant modified its input {name}" for name in result.modified]
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
    reference figures of each recipe's inputs once, for every variant checked with it (the
    inputs a recipe describes are the same for every variant)."""

    def __init__(self, state_dict: dict[str, torch.Tensor]):
        self.state_dict = state_dict
        self._built: dict[tuple, IPAReference] = {}
        self._figures: dict[tuple, ReferenceFigures] = {}

    def get(self, config: IPAConfig, device: str, precision: Precision) -> IPAReference:
        key = (config, device, precision.name)
        if key not in self._built:
            self._built[key] = make_module(self.state_dict, config, device, precision.dtype)
        return self._built[key]

    def figures(self, recipe: InputRecipe, motion_seed: int | None = None) -> ReferenceFigures:
        """The oracle's output and the reference's error on `recipe`'s inputs, and with
        `motion_seed` the reference's own invariance error under that rigid motion."""
        key = (recipe, motion_seed)
        if key not in self._figures:
            precision = get_precision(recipe.precision)
            inputs = recipe.values()
            validate_inputs(recipe.config, *inputs.as_tuple())
            with math_mode(precision), torch.no_grad():
                oracle = oracle_forward(self.state_dict, recipe.config, inputs)
                reference = self.get(recipe.config, recipe.device, precision)
                ref_out = chunked_forward(reference, inputs)
                invariance = math.nan
                if motion_seed is not None:
                    moved = chunked_forward(reference, rigid_motion(inputs, motion_seed))
                    invariance = rel_l2(moved, ref_out)
            self._figures[key] = ReferenceFigures(oracle, rel_l2(ref_out, oracle), invariance)
        return self._figures[key]


def correctness_recipes(config: IPAConfig, batch: int, length: int, device: str,
                        precision: Precision, seeds: int, first_seed: int = 0,
                        origin_offset: float = 100.0) -> list[InputRecipe]:
    """The inputs of the correctness protocol: one fresh draw per seed."""
    return [InputRecipe(config, batch, length, precision.name, torch.device(device).type, seed,
                        origin_offset) for seed in range(first_seed, first_seed + seeds)]


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
    runner: LocalRunner | Worker | None = None,
    build: BuildSpec | None = None,
) -> CheckResult:
    """Run the correctness protocol for `variant` and return its figures.

    The variant runs through `runner` (a `harness.worker.Worker` keeps it out of this
    process; default: in this process), built from `build` (default: `state_dict`, itself
    defaulting to `init_state_dict(config)`). `fn` passes an already built callable to the
    in-process runner. The oracle and the verdict are always computed here.
    """
    precision = get_precision(precision)
    result = CheckResult(variant.name, precision.name, device, batch, length, config)
    result.skipped = variant.not_supported_reasons(config, device, precision)
    if result.skipped:
        return result
    if build is None:
        state_dict = init_state_dict(config) if state_dict is None else state_dict
        build = BuildSpec(("check", config), state_dict, config, precision.name)
    references = references or ReferenceCache(build.state_dict)
    if runner is None:
        runner = LocalRunner(variant, device)
        if fn is not None:
            runner.adopt(build.key, fn)

    recipes = correctness_recipes(config, batch, length, device, precision, seeds, first_seed,
                                  origin_offset)
    figures = [references.figures(r, motion_seed=first_seed if i == 0 else None)
               for i, r in enumerate(recipes)]
    # One more call on the first inputs under a rigid motion; every output is its own copy,
    # so a variant that returns one reused buffer cannot compare that buffer with itself.
    runs = runner.outputs(build, [*recipes, recipes[0].moved(first_seed)])
    judged = [(r.seed, judge_output(run, f.oracle, f.reference_err, precision))
              for r, f, run in zip(recipes, figures, runs, strict=False)]
    first, moved = runs[0].out, runs[-1].out
    result.invariance_err = rel_l2(moved, first) if first is not None else math.inf
    result.invariance_tol = tolerance(figures[0].reference_invariance_err, precision)

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
