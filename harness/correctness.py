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

from harness.runner import (
    PASSES,
    BuildSpec,
    InputRecipe,
    LocalRunner,
    RunOutput,
    free_device_memory,
    input_names,
    leaf_inputs,
)
from harness.worker import Worker
from variants.base import IPAFunction, Variant
from variants.problem import (
    ForwardInputs,
    IPAConfig,
    IPAInputError,
    IPAInputs,
    Precision,
    get_precision,
    math_mode,
)
from variants.reference import IPAReference, make_module

DEFAULT_SEEDS = 5


# Elements per pass of the error figures: their float64 temporaries stay ~0.1 GiB each
# however big the tensor (the fp32 N = 4096 d pair_repr, 8 GiB, beside its float64 oracle's
# 16 GiB: whole-tensor temporaries took the harness ~40 GiB more, with the variant's worker
# on the same 80 GB card).
ERROR_CHUNK = 1 << 24


# Oracle tensors bigger than this are kept in host memory once computed (the fp32 N = 4096
# oracle's d pair_repr is 16 GiB, one per seed, cached for every variant of the cell): the
# GPU's memory is the variant's while it runs and is timed.
PARK_BYTES = 1 << 30


def _parked(t: torch.Tensor) -> torch.Tensor:
    """`t`, moved to the CPU if it is a CUDA tensor of more than PARK_BYTES."""
    return t.cpu() if t.is_cuda and t.numel() * t.element_size() > PARK_BYTES else t


def _chunk_pairs(out: torch.Tensor, ref: torch.Tensor, device=None):
    """(out, ref) a chunk at a time, both float64 on `device` (default: `ref`'s). Only a
    chunk crosses at a time: `out` may come from a worker, on the CPU, and `ref` be parked
    there."""
    flat_out, flat_ref = out.detach().reshape(-1), ref.detach().reshape(-1)
    device = flat_ref.device if device is None else device
    for start in range(0, flat_ref.numel(), ERROR_CHUNK):
        stop = start + ERROR_CHUNK
        yield (flat_out[start:stop].to(device, torch.float64),
               flat_ref[start:stop].to(device, torch.float64))


def error_figures(out: torch.Tensor, ref: torch.Tensor, device=None) -> tuple[float, float]:
    """(||out - ref|| / ||ref||, max |out - ref|) in float64 on `device` (default: `ref`'s),
    in one pass over the chunks; inf when `out` holds NaN or Inf or has another shape."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
        return math.inf, math.inf
    diff_sq = ref_sq = 0.0
    worst = []
    for o, r in _chunk_pairs(out, ref, device):
        diff = o - r
        diff_sq = diff_sq + diff.square().sum()  # tensors: one synchronisation at the end
        ref_sq = ref_sq + r.square().sum()
        worst.append(diff.abs().max())
    diff_sq, ref_sq = float(diff_sq), float(ref_sq)
    largest = float(torch.stack(worst).max()) if worst else 0.0  # NaN propagates
    # NaN or Inf in `out` (the relative error also where a square goes beyond float64)
    rel = math.sqrt(diff_sq) / max(math.sqrt(ref_sq), 1e-300) if math.isfinite(diff_sq) \
        else math.inf
    return rel, largest if math.isfinite(largest) else math.inf


def rel_l2(out: torch.Tensor, ref: torch.Tensor, device=None) -> float:
    """||out - ref|| / ||ref|| as `error_figures`."""
    return error_figures(out, ref, device)[0]


def max_abs(out: torch.Tensor, ref: torch.Tensor, device=None) -> float:
    """max |out - ref| as `error_figures`."""
    return error_figures(out, ref, device)[1]


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
    result: RunOutput, oracle: torch.Tensor, reference_err: float, precision: Precision,
    parts: dict[str, torch.Tensor] | None = None,
    part_errs: dict[str, float] | None = None,
) -> OutputJudgement:
    """Judge one call's `result` against the float64 `oracle` of its inputs.

    Fails outright: not a tensor, a wrong shape or dtype, NaN/Inf, an input modified in
    place. Otherwise the error fails when `rel_l2 > tolerance(reference_err, precision)`.
    With `parts` (a problem's row groups, bool (B, N), first the one the figures report) each
    part is judged on its rows against its own reference error (`part_errs`); a part other
    than the first that fails adds a failure naming it.
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
    judged, judged_oracle = out, oracle  # the figures' rows: the first part's, or all
    if parts and not failures:
        (_, rows), *others = parts.items()
        judged, judged_oracle = out[rows], oracle[rows]
        for name, rows in others:
            if rows.any():
                part_tol = tolerance(part_errs[name], precision)
                part_err = rel_l2(out[rows], oracle[rows])
                if not part_err <= part_tol:
                    failures.append(f"{name} rows: rel_l2 {part_err:.3e} > tol {part_tol:.3e}")
    err, largest = error_figures(judged, judged_oracle)
    if not err <= tol and not failures:
        failures.append(f"rel_l2 {err:.3e} > tol {tol:.3e}")
    return OutputJudgement(err, largest, reference_err, tol, failures)


# Largest (B, rows, N, H, Qp, 3) point-difference tensor the chunked reference materialises.
CHUNK_ELEMENTS = 2**30
# A gradient chunk's share of that: autograd holds several such tensors at once (the saved
# difference, the square's backward and its temporaries) beside the rows' pair gradient. At
# CHUNK_ELEMENTS, the float64 oracle's step at fp32 N = 4096 took the harness to 64.7 GiB
# allocated and ran an 80 GB H100 out of memory (2026-12-06); a quarter holds a chunk to ~8 GiB.
GRADIENT_CHUNK_SHARE = 4


def rows_per_chunk(config, batch: int, length: int, training: bool = False) -> int:
    """Query rows per chunk so the reference's biggest tensor stays under CHUNK_ELEMENTS (any
    problem's config: its point differences are (B, rows, N, H, Qp, 3) in both), and under
    a GRADIENT_CHUNK_SHARE of it for a `training` step."""
    sizes = config.columns()
    per_row = batch * length * sizes["heads"] * sizes["query_points"] * 3
    elements = CHUNK_ELEMENTS // (GRADIENT_CHUNK_SHARE if training else 1)
    return max(1, min(length, elements // per_row))


def reference_config(module: IPAReference) -> IPAConfig:
    return IPAConfig(
        module.layer_norm.normalized_shape[0], module.pair_bias.in_features,
        module.num_heads, module.num_query_points, module.num_value_points,
    )


def chunked_forward(module: IPAReference, inputs: IPAInputs) -> torch.Tensor:
    """`module(*inputs)`, computed in chunks of query rows when N x N would be too big."""
    chunk = rows_per_chunk(reference_config(module), inputs.batch, inputs.length)
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
    pass_name: str = "forward"
    # forward+backward: the worst gradient (by rel_l2 / tol over tensors and seeds), and
    # every tensor's worst seed by name: {"rel_l2", "tol", "reference_rel_l2"}.
    grad_rel_l2: float = math.nan
    grad_tol: float = math.nan
    grad_worst: str = ""
    grad_err_ratio: float = math.nan
    gradients: dict[str, dict[str, float]] = field(default_factory=dict)
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
    # The problem's row groups judged apart (bool (B, N); the first is the figures'), the
    # reference's error on each, and the rows invariance is judged on.
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    part_errs: dict[str, float] = field(default_factory=dict)
    invariance_rows: torch.Tensor | None = None


@dataclass(frozen=True)
class GradientFigures:
    """The float64 oracle's gradients of one training step, and the reference's own error
    per gradient in the checked precision, by input or parameter name; `device`: where the
    recipe ran, and where gradients are compared (an oracle tensor may be parked on the
    CPU: `_parked`)."""

    oracle: dict[str, torch.Tensor]
    reference_errs: dict[str, float]
    device: str = "cpu"


def reference_gradients(module: torch.nn.Module, config, inputs: ForwardInputs,
                        grad_out: torch.Tensor,
                        grad_inputs: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Gradients of `grad_out . module(inputs)` for the inputs named in `grad_inputs` (the
    problem's differentiable ones) and every parameter, by name, accumulated over chunks of
    query rows when N x N would be too big (the oracle's way; `module` takes `query_rows`).

    Chunked, the pair input (the (B, N, N, C) one) goes in as a leaf of the chunk's rows
    alone, which the modules accept with `query_rows`: its gradient is then rows x N x C a
    chunk, written into its rows of the result, where a whole-input leaf would give each
    chunk a whole N x N x C gradient (fp32 N = 4096: 8 GiB a chunk, 16 GiB in float64)."""
    args = leaf_inputs(inputs, grad_inputs)
    names = input_names(inputs)
    params = {name: p.requires_grad_(True) for name, p in module.named_parameters()}
    chunk = rows_per_chunk(config, inputs.batch, inputs.length, training=True)
    n = inputs.length
    pair = next((name for name, a in zip(names, args, strict=True) if a.requires_grad
                 and a.dim() == 4 and tuple(a.shape[1:3]) == (n, n)), None)
    if chunk >= n:
        pair = None  # one pass: the whole input is the chunk
    total: dict[str, torch.Tensor] = {}
    if pair is not None:
        total[pair] = torch.empty_like(args[names.index(pair)])
    with torch.enable_grad():
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            call = dict(zip(names, args, strict=True))
            if pair is not None:  # a view of the input's rows: no copy
                call[pair] = call[pair].detach()[:, rows].requires_grad_(True)
            leaves = {k: a for k, a in call.items() if a.requires_grad} | params
            out = module(*call.values(), query_rows=rows if chunk < n else None)
            grads = torch.autograd.grad(out, list(leaves.values()), grad_out[:, rows])
            del out
            for name, grad in zip(leaves, grads, strict=True):
                if name == pair:
                    total[name][:, rows] = grad
                elif name not in total:  # own copies (autograd may hand out views)
                    total[name] = grad.clone() if chunk < n else grad
                else:
                    total[name] += grad
            del grads, leaves, call
    order = [k for k, a in zip(names, args, strict=True) if a.requires_grad] + list(params)
    return {name: total[name] for name in order}


class ReferenceCache:
    """Builds each (config, device, precision) reference once, and computes the oracle and
    reference figures of each recipe's inputs once, for every variant checked with it (the
    inputs a recipe describes are the same for every variant)."""

    def __init__(self, state_dict: dict[str, torch.Tensor]):
        self.state_dict = state_dict
        self._built: dict[tuple, IPAReference] = {}
        self._figures: dict[tuple, ReferenceFigures] = {}
        self._gradients: dict[InputRecipe, GradientFigures] = {}

    def get(self, config, device: str, precision: Precision) -> torch.nn.Module:
        from harness.problems import problem_of

        key = (config, device, precision.name)
        if key not in self._built:
            self._built[key] = problem_of(config).make_module(self.state_dict, config, device,
                                                              precision.dtype)
        return self._built[key]

    def figures(self, recipe: InputRecipe, motion_seed: int | None = None) -> ReferenceFigures:
        """The oracle's output and the reference's error on `recipe`'s inputs, and with
        `motion_seed` the reference's own invariance error under that rigid motion."""
        from harness.problems import problem_of

        key = (recipe, motion_seed)
        if key not in self._figures:
            problem = problem_of(recipe.config)
            precision = get_precision(recipe.precision)
            inputs = recipe.values()
            problem.validate_inputs(recipe.config, *inputs.as_tuple())
            parts = problem.output_parts(inputs)
            rows = problem.invariance_rows(inputs)
            with math_mode(precision), torch.no_grad():
                oracle = problem.oracle(self.state_dict, recipe.config, inputs)
                reference = self.get(recipe.config, recipe.device, precision)
                ref_out = problem.reference_forward(reference, inputs)
                invariance = math.nan
                if motion_seed is not None:
                    moved = problem.reference_forward(
                        reference, problem.rigid_motion(inputs, motion_seed))
                    invariance = rel_l2(moved[rows], ref_out[rows])
            part_errs = {name: rel_l2(ref_out[r], oracle[r]) for name, r in parts.items()
                         if r.any()}
            self._figures[key] = ReferenceFigures(
                oracle, part_errs[next(iter(parts))], invariance, parts, part_errs, rows)
            del inputs, ref_out
            free_device_memory(collect=False)  # the variant's worker allocates next
        return self._figures[key]

    def gradient_figures(self, recipe: InputRecipe) -> GradientFigures:
        """The oracle's gradients of a training step on `recipe`'s inputs (float64
        autograd of the reference on the upcast inputs and `grad_out`), and the reference's
        own error per gradient in the recipe's precision and math mode."""
        from harness.problems import problem_of

        if recipe not in self._gradients:
            problem, config = problem_of(recipe.config), recipe.config
            precision = get_precision(recipe.precision)
            inputs = recipe.values()
            grad_out = recipe.grad_output(inputs)
            upcast = inputs.to(dtype=torch.float64)
            del inputs  # the float64 pass holds only the upcast inputs (drawn again after it)
            oracle_module = problem.make_module(self.state_dict, config, recipe.device,
                                                torch.float64)
            oracle = reference_gradients(oracle_module, config, upcast, grad_out.double(),
                                         problem.grad_inputs)
            del upcast
            # parked before the reference's own pass, which then has the GPU to itself
            oracle = {name: _parked(t) for name, t in oracle.items()}
            inputs = recipe.values()
            reference = problem.make_module(self.state_dict, config, recipe.device,
                                            precision.dtype)
            del oracle_module
            free_device_memory(collect=False)
            with math_mode(precision):
                own = reference_gradients(reference, config, inputs, grad_out,
                                          problem.grad_inputs)
            own_errs = {name: rel_l2(own[name], oracle[name], recipe.device) for name in oracle}
            del own, reference, inputs, grad_out
            self._gradients[recipe] = GradientFigures(oracle, own_errs, recipe.device)
            free_device_memory(collect=False)  # the variant's worker allocates next
        return self._gradients[recipe]


# A gradient that is zero in exact arithmetic (openfold's linear_b.bias: the softmax cancels a
# per-row logit shift) carries rounding alone: the reference gets no digit of it right
# (reference rel_l2 >= 1), and the size of that rounding depends on the order of a sum over
# N^2 terms, which may differ between correct kernels by far more than 2x (openfold's
# torch-compile: 1.2x twice the reference's in heads-1). Such a gradient is held to this many
# times the usual tolerance; a backward bug puts it at the scale of the other gradients
# (the softmax backward without its row sum: 1e7 times).
ROUNDING_ONLY_MARGIN = 100.0


def rounding_only(reference_err: float) -> bool:
    """Whether a gradient's reference has no correct digit (zero in exact arithmetic)."""
    return reference_err >= 1


def judge_gradients(grads: dict[str, torch.Tensor | None] | None, figures: GradientFigures,
                    precision: Precision) -> dict[str, OutputJudgement]:
    """Each gradient against the oracle's, with the output's rules: a missing gradient, a
    wrong shape, NaN/Inf fail outright; otherwise rel_l2 against 2 x the reference's own
    error for that tensor (or the precision's floor), `ROUNDING_ONLY_MARGIN` times that for
    a gradient that is zero in exact arithmetic."""
    grads = grads or {}
    judged = {}
    for name, oracle in figures.oracle.items():
        reference_err = figures.reference_errs[name]
        tol = tolerance(reference_err, precision)
        if rounding_only(reference_err):
            tol *= ROUNDING_ONLY_MARGIN
        grad = grads.get(name)
        if grad is None:
            judged[name] = OutputJudgement(math.inf, math.inf, reference_err, tol,
                                           [f"no gradient for {name}"])
            continue
        # (compared a chunk at a time, wherever the gradient is: d pair_repr may be 8 GiB)
        (err, largest), failures = error_figures(grad, oracle, figures.device), []
        if tuple(grad.shape) != tuple(oracle.shape):
            failures.append(f"gradient of {name}: shape {tuple(grad.shape)} != "
                            f"{tuple(oracle.shape)}")
        elif not math.isfinite(err):
            failures.append(f"gradient of {name}: NaN/Inf values (or errors past float64)")
        if not err <= tol and not failures:
            failures.append(f"gradient of {name}: rel_l2 {err:.3e} > tol {tol:.3e}")
        judged[name] = OutputJudgement(err, largest, reference_err, tol, failures)
    return judged


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
    pass_name: str = "forward",
) -> CheckResult:
    """Run the correctness protocol for `variant` and return its figures.

    The variant runs through `runner` (a `harness.worker.Worker` keeps it out of this
    process; default: in this process), built from `build` (default: `state_dict`, itself
    defaulting to `init_state_dict(config)`). `fn` passes an already built callable to the
    in-process runner. The oracle and the verdict are always computed here. With
    `pass_name="forward+backward"` every call is a training step and every gradient is
    judged too (`judge_gradients`).
    """
    from harness.problems import problem_of

    problem = problem_of(config)
    precision = get_precision(precision)
    result = CheckResult(variant.name, precision.name, device, batch, length, config,
                         pass_name=pass_name)
    if problem.name not in variant.problems:
        raise IPAInputError(f"variant {variant.name!r} implements {list(variant.problems)}, "
                            f"not problem {problem.name!r}")
    require_pass_for_problem(pass_name, problem.name)
    result.skipped = pass_reasons(variant, pass_name, device) or (
        variant.not_supported_reasons(config, device, precision))
    if result.skipped:
        return result
    if build is None:
        state_dict = problem.init_state_dict(config) if state_dict is None else state_dict
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
    runs = [*runner.outputs(build, recipes, pass_name),
            *runner.outputs(build, [recipes[0].moved(first_seed)], pass_name, gradients=False)]
    judged = [(r.seed, judge_output(run, f.oracle, f.reference_err, precision, f.parts,
                                    f.part_errs))
              for r, f, run in zip(recipes, figures, runs, strict=False)]
    rows = figures[0].invariance_rows
    first, moved = (_rows_of(run.out, rows) for run in (runs[0], runs[-1]))
    result.invariance_err = (rel_l2(moved, first) if first is not None and moved is not None
                             and first.shape == moved.shape else math.inf)
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
    if pass_name != "forward":
        _judge_training(result, recipes, runs, references, precision)
    return result


def _rows_of(out: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    """`out`'s rows where `rows` (bool (B, N)) is set; None when `out` is not a (B, N, ...)
    tensor."""
    if out is None or tuple(out.shape[:2]) != tuple(rows.shape):
        return None
    return out[rows.to(out.device)]


def require_pass_for_problem(pass_name: str, problem: str) -> None:
    """A training step needs the problem to name its differentiable inputs (`grad_inputs`);
    a problem without them is a usage error for any pass but the forward."""
    from harness.problems import PROBLEMS

    if pass_name != "forward" and not getattr(PROBLEMS[problem], "grad_inputs", None):
        raise IPAInputError(f"pass {pass_name!r}: problem {problem!r} declares no "
                            "differentiable inputs (grad_inputs); only the forward is judged")


def pass_reasons(variant: Variant, pass_name: str, device: str) -> list[str]:
    """Why `variant` cannot run `pass_name` on `device` (a forward-only variant's backward
    rows say `forward only`)."""
    if pass_name not in PASSES:
        raise IPAInputError(f"pass: expected one of {list(PASSES)}, got {pass_name!r}")
    return variant.backward_reasons(device) if pass_name != "forward" else []


def _headline(judgement: OutputJudgement) -> tuple[bool, bool, float]:
    """How a gradient ranks for the row's one figure: failing first, then those whose
    relative error means something, then by rel_l2 / tol. A gradient that is zero in exact
    arithmetic (`rounding_only`) is judged (`judge_gradients`), but its huge rel_l2 is not the
    row's figure while it passes."""
    return (not judgement.passed, not rounding_only(judgement.reference_rel_l2),
            judgement.err_over_tol)


def _judge_training(result: CheckResult, recipes, runs, references, precision) -> None:
    """Fill the gradient figures of `result`: per tensor its worst seed, overall the worst
    tensor (`_headline`); every failing tensor is named in `failures`."""
    worst_by_name: dict[str, OutputJudgement] = {}
    for recipe, run in zip(recipes, runs, strict=False):
        figures = references.gradient_figures(recipe)
        for name, judgement in judge_gradients(run.grads, figures, precision).items():
            if name not in worst_by_name or (judgement.err_over_tol
                                             > worst_by_name[name].err_over_tol):
                worst_by_name[name] = judgement
    name, worst = max(worst_by_name.items(), key=lambda item: _headline(item[1]))
    result.grad_worst, result.grad_rel_l2, result.grad_tol = name, worst.rel_l2, worst.tol
    result.grad_err_ratio = (worst.rel_l2 / worst.reference_rel_l2
                             if worst.reference_rel_l2 > 0 else math.nan)
    result.gradients = {n: {"rel_l2": j.rel_l2, "tol": j.tol,
                            "reference_rel_l2": j.reference_rel_l2}
                        for n, j in worst_by_name.items()}
    result.failures += [f for j in worst_by_name.values() for f in j.failures]
