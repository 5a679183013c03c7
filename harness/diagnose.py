"""`ipa-bench diagnose`: localise a mismatch against the oracle from the outside.

A kernel that disagrees with the reference (the seed's fused kernel was off by 0.04-0.08)
is probed with inputs and weights that switch one part of the function off, or make it
dominate, or isolate it: identity frames, no point term, no pair bias, one key, one batch
element, an N that fills every tile, one head, one point, non-contiguous inputs. Each probe
goes through the same oracle comparison as `check` (float64 reference on the same inputs;
tolerance from the reference's own error in that probe; `harness.correctness.judge_output`).
Where the error appears and where it vanishes names the suspect; that logic is data
(`harness.probes.RULES`), one rule per suspect, each with a test. With
`--pass forward+backward` each probe is a training step and every gradient is judged too;
the verdict names the wrong gradients and their term (the problem's gradient terms and
rules: `ProbeSet.gradient_terms`, `.gradient_rules`; the simplified problem's are
`harness.probes.GRADIENT_TERMS`, `GRADIENT_RULES`).

Each problem has its own probes and rules (`--problem`; `harness.probes.probe_set`):
openfold's (`variants/openfold/probes.py`) add the mask, the pair-value output, the point
norms and the frame convention, judge the present residues and the masked query rows
apart (outcomes `PROBE:present`, `PROBE:masked`), as `check` does, and bring their own
gradient terms and rules.

Probes are cheap at the default sizes (B = 2, N = 97 and 128, default layer): a few seconds
on a CPU for the whole table (openfold's 25 probes at its default layer: about a minute on two
cores, seconds on a GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness import options
from harness.correctness import (
    OutputJudgement,
    ReferenceCache,
    judge_gradients,
    judge_output,
    pass_reasons,
    rel_l2,
    require_pass_for_problem,
    rounding_only,
    tolerance,
)
from harness.model_new import model_new_variant
from harness.probes import (
    DEFAULT_SIZES,
    Probe,
    ProbeSet,
    Sizes,
    StateDict,
    Verdict,
    probe_set,
    verdict,
)
from harness.problems import problem_of
from harness.results import ERR_RATIO_LABEL, format_err_ratio
from harness.runner import PASSES, BuildSpec, InputRecipe, LocalRunner, RunOutput
from harness.version import __version__
from harness.worker import Worker, exception_name
from variants.base import Variant
from variants.problem import PRECISIONS, IPAConfig, IPAInputError, Precision, get_precision
from variants.registry import get_variant

DIAGNOSE_SCHEMA = "ipa-bench.diagnose/1"

# ---- running the probes ----------------------------------------------------------------------

@dataclass
class ProbeResult:
    probe: Probe
    config: IPAConfig
    batch: int
    length: int
    status: str = "pass"  # pass, FAIL, error, unsupported
    rel_l2: float = math.nan  # worst seed (by err / tol)
    reference_rel_l2: float = math.nan
    tol: float = math.nan
    message: str = ""
    output_passed: bool = True  # the output alone (status FAIL may be a gradient's)
    # a problem with several output parts (openfold: present, masked): each part's outcome,
    # "pass" or "fail" (failing on some seed); empty for one part or a probe that did not run
    parts: dict[str, str] = field(default_factory=dict)
    # forward+backward: every gradient's worst seed by name, the worst gradient (by
    # rel_l2 / tol), and the gradients that fail in this probe
    gradients: dict[str, OutputJudgement] = field(default_factory=dict)
    grad_worst: str = ""
    failing_gradients: list[str] = field(default_factory=list)

    @property
    def err_ratio(self) -> float:
        """rel_l2 over the reference's own error (nan where undefined, as in fp64)."""
        return _ratio(self.rel_l2, self.reference_rel_l2)

    @property
    def worst_gradient(self) -> OutputJudgement | None:
        return self.gradients.get(self.grad_worst)

    @property
    def outcome(self) -> str:
        """For the rules (they read the output): pass, fail (FAIL or error), or skip."""
        if self.status == "FAIL":
            return "pass" if self.output_passed else "fail"
        return {"pass": "pass", "error": "fail"}.get(self.status, "skip")


def _ratio(err: float, reference_err: float) -> float:
    if math.isnan(err) or not reference_err > 0:
        return math.nan
    return err / reference_err


@dataclass
class Diagnosis:
    variant: str
    device: str
    precision: str
    config: IPAConfig
    sizes: Sizes
    results: list[ProbeResult] = field(default_factory=list)
    pass_name: str = "forward"
    probes: ProbeSet | None = None  # the problem's rules (default: the simplified problem's)

    @property
    def training(self) -> bool:
        return self.pass_name != "forward"

    @property
    def verdict(self) -> Verdict:
        by_status = {status: {r.probe.name: r.message for r in self.results
                              if r.status == status} for status in ("error", "unsupported")}
        gradient_failures = None
        if self.training:  # every probe whose training step ran and was judged
            gradient_failures = {r.probe.name: r.failing_gradients for r in self.results
                                 if r.status in ("pass", "FAIL")}
        outcomes = {r.probe.name: r.outcome for r in self.results}
        outcomes |= {f"{r.probe.name}:{part}": outcome for r in self.results
                     for part, outcome in r.parts.items()}
        return verdict(outcomes, by_status["error"], by_status["unsupported"],
                       gradient_failures, self.probes)


class OracleCache:
    """A `ReferenceCache` per probe weights: the inputs, oracle outputs and reference errors
    do not depend on the variant, so diagnosing several variants computes them once."""

    def __init__(self):
        self._caches: dict[tuple, ReferenceCache] = {}

    def get(self, key: tuple, make_weights: Callable[[], StateDict]) -> ReferenceCache:
        if key not in self._caches:
            self._caches[key] = ReferenceCache(make_weights())
        return self._caches[key]


def _message(exc: BaseException) -> str:
    """The exception as the table shows it (a compiler log can be long: cut at 2000)."""
    text = f"{exception_name(exc)}: {exc}".strip()
    return text if len(text) <= 2000 else text[:2000] + " ..."


def diagnose(
    variant: Variant,
    config: IPAConfig | None = None,
    *,
    device: str = "cpu",
    precision: str | Precision = "fp32",
    sizes: Sizes = DEFAULT_SIZES,
    seeds: int = 2,
    weights_seed: int = 0,
    probes: tuple[Probe, ...] | None = None,
    cache: OracleCache | None = None,
    on_probe: Callable[[str], None] | None = None,
    runner: LocalRunner | Worker | None = None,
    pass_name: str = "forward",
) -> Diagnosis:
    """Run every probe on `variant` and return the figures; `.verdict` names the suspect.

    The variant runs through `runner` (a `harness.worker.Worker`, or by default in this
    process). An exception from the variant's build or forward (a kernel that fails to
    compile, a `view` on non-contiguous input), or its worker dying, makes that probe an
    `error`, which counts as a failure. With `pass_name="forward+backward"` every call is
    a training step and every gradient is judged too (`judge_gradients`); the verdict then
    also names the wrong gradients and their term (`harness.probes.gradient_verdict`). A
    variant without a backward is `unsupported` in every probe (nothing checked).

    The problem is `config`'s (default: the simplified problem's default layer); its probes
    and rules come from `harness.probes.probe_set` (`probes` runs a subset of them). A
    variant that does not implement the problem is an `IPAInputError`.
    """
    config = config or IPAConfig()
    problem = problem_of(config).name
    if problem not in variant.problems:
        raise IPAInputError(f"variant {variant.name!r} implements {list(variant.problems)}, "
                            f"not problem {problem!r}")
    probe_kinds = _probes_for_pass(problem, pass_name)
    precision = get_precision(precision)
    cache = cache or OracleCache()
    runner = runner or LocalRunner(variant, device)
    diagnosis = Diagnosis(variant.name, device, precision.name, config, sizes,
                          pass_name=pass_name, probes=probe_kinds)
    failed_builds: dict[tuple, str] = {}
    no_backward = pass_reasons(variant, pass_name, device)
    for probe in probe_kinds.probes if probes is None else probes:
        diagnosis.results.append(_run_probe(
            variant, probe, config, device, precision, sizes, seeds, weights_seed,
            cache, runner, failed_builds, pass_name, no_backward, probe_kinds.key(probe)))
        if on_probe:
            on_probe(probe.name)
    return diagnosis


def _probes_for_pass(problem: str, pass_name: str) -> ProbeSet:
    """`problem`'s probes, or an `IPAInputError` for a training step where the problem
    brings no gradient terms (`ProbeSet.gradient_terms`)."""
    probes = probe_set(problem)
    if pass_name != "forward" and not probes.gradients:
        raise IPAInputError(f"--pass {pass_name}: problem {problem!r} has no gradient terms "
                            "and rules for diagnose (only the forward is diagnosed)")
    return probes


def _run_probe(variant, probe, base_config, device, precision, sizes, seeds, weights_seed,
               cache, runner, failed_builds, pass_name="forward",
               no_backward=(), key=None) -> ProbeResult:
    config = probe.config(base_config) if probe.config else base_config
    batch, length = probe.batch(sizes), probe.length(sizes)
    result = ProbeResult(probe, config, batch, length)
    reasons = list(no_backward) or variant.not_supported_reasons(config, device, precision)
    if reasons:
        result.status, result.message = "unsupported", "; ".join(reasons)
        return result

    def make_weights():
        weights = problem_of(config).init_state_dict(config, seed=weights_seed)
        return probe.weights(weights) if probe.weights else weights

    references = cache.get((config, probe.weights, weights_seed), make_weights)
    build = BuildSpec((config, probe.weights and probe.name), references.state_dict, config,
                      precision.name)
    if build.key not in failed_builds:
        try:
            runner.build(build)
        except Exception as exc:  # recorded as this probe's error row, never dropped
            failed_builds[build.key] = f"build: {_message(exc)}"
    if build.key in failed_builds:
        result.status, result.message = "error", failed_builds[build.key]
        return result

    recipes = [InputRecipe(config, batch, length, precision.name, device, seed,
                           probe=key or probe.name) for seed in range(seeds)]
    figures = [references.figures(recipe) for recipe in recipes]
    training = pass_name != "forward"
    try:
        runs = runner.outputs(build, recipes, pass_name) if training else (
            runner.outputs(build, recipes))
    except Exception as exc:  # recorded as this probe's error row, never dropped
        step = "training step" if training else "forward"
        result.status, result.message = "error", f"{step}: {_message(exc)}"
        return result
    worst = None
    for run, figure in zip(runs, figures, strict=True):
        judgement = judge_output(run, figure.oracle, figure.reference_err, precision,
                                 figure.parts, figure.part_errs)
        if worst is None or judgement.err_over_tol > worst.err_over_tol:
            worst = judgement
        if not judgement.passed:
            result.status, result.output_passed = "FAIL", False
            result.message = result.message or "; ".join(
                f for f in judgement.failures if not f.startswith("rel_l2"))
        for part, passed in _part_outcomes(run, figure, precision).items():
            if not passed or part not in result.parts:
                result.parts[part] = "pass" if passed else "fail"
    result.rel_l2, result.reference_rel_l2, result.tol = (
        worst.rel_l2, worst.reference_rel_l2, worst.tol)
    if training:
        _judge_gradients(result, recipes, runs, references, precision)
    return result


def _part_outcomes(run: RunOutput, figure, precision: Precision) -> dict[str, bool]:
    """Whether each output part (a problem with several: openfold's present residues and
    masked query rows) is within its own tolerance on this seed, NaN in one part failing
    that part alone; {} for a problem with one part."""
    if len(figure.parts) < 2:
        return {}
    out = run.out
    usable = out is not None and tuple(out.shape) == tuple(figure.oracle.shape)
    outcomes = {}
    for part, rows in figure.parts.items():
        if not rows.any():
            continue
        err = rel_l2(out.to(figure.oracle.device)[rows], figure.oracle[rows]) if usable \
            else math.inf
        outcomes[part] = err <= tolerance(figure.part_errs[part], precision)
    return outcomes


def _judge_gradients(result: ProbeResult, recipes, runs, references, precision) -> None:
    """Every gradient against the oracle's on each seed: per tensor its worst seed, the
    worst tensor (failing first, then those whose relative error means something: not a
    rounding-only one, as `check` ranks them), and the failing ones (by name, in the
    oracle's order)."""
    worst: dict[str, OutputJudgement] = {}
    for recipe, run in zip(recipes, runs, strict=True):
        judged = judge_gradients(run.grads, references.gradient_figures(recipe), precision)
        for name, judgement in judged.items():
            if name not in worst or judgement.err_over_tol > worst[name].err_over_tol:
                worst[name] = judgement
    result.gradients = worst
    result.grad_worst = max(worst, key=lambda n: (not worst[n].passed,
                                                  not rounding_only(worst[n].reference_rel_l2),
                                                  worst[n].err_over_tol))
    result.failing_gradients = [n for n, j in worst.items() if not j.passed]
    if result.failing_gradients:
        result.status = "FAIL"
        outright = [f for n in result.failing_gradients for f in worst[n].failures
                    if "rel_l2" not in f]  # a missing gradient, NaN, a wrong shape
        wrong = "wrong gradient: " + ", ".join(result.failing_gradients)
        result.message = "; ".join(m for m in (result.message, wrong, *outright) if m)


# ---- output and command ----------------------------------------------------------------------

def _figure(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3e}"


def print_diagnosis(diagnosis: Diagnosis, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 150))
    s, c = diagnosis.sizes, diagnosis.config.columns()
    training = " (forward+backward)" if diagnosis.training else ""
    problem = problem_of(diagnosis.config).name
    layer = (f"node_dim={c['node_dim']}, pair_dim={c['pair_dim']}, H={c['heads']}, "
             f"Qp={c['query_points']}, Vp={c['value_points']}")
    if problem != "simplified":
        layer = f"problem {problem}, {layer}, head_dim={c['head_dim']}"
    table = Table(title=f"diagnose {diagnosis.variant}{training}: {diagnosis.precision} on "
                  f"{diagnosis.device}, B={s.batch}, N={s.length}, {layer}")
    columns = ["probe", "what it changes", "B", "N", "rel_l2", "tol", ERR_RATIO_LABEL]
    if diagnosis.training:
        columns += ["worst gradient", "grad rel_l2", "grad tol"]
    for column in (*columns, "result"):
        table.add_column(column, overflow="fold")
    for r in diagnosis.results:
        ratio = r.err_ratio
        result = escape(r.status + (f": {r.message}" if r.message else ""))
        style = {"FAIL": "bold red", "error": "bold red", "unsupported": "dim"}.get(r.status)
        cells = [r.probe.name, r.probe.isolates, str(r.batch), str(r.length),
                 _figure(r.rel_l2), _figure(r.tol), format_err_ratio(ratio)]
        if diagnosis.training:
            worst = r.worst_gradient
            cells += [r.grad_worst or "-", _figure(worst.rel_l2 if worst else math.nan),
                      _figure(worst.tol if worst else math.nan)]
        table.add_row(*cells, result, style=style)
    console.print(table)
    for line in diagnosis.verdict.lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def diagnosis_json(diagnosis: Diagnosis) -> dict:
    n = options.json_number
    verdict = diagnosis.verdict
    return {
        "schema": DIAGNOSE_SCHEMA, "ipa_bench_version": __version__,
        "variant": diagnosis.variant, "device": diagnosis.device, "dtype": diagnosis.precision,
        "config": dataclasses.asdict(diagnosis.config),
        "sizes": dataclasses.asdict(diagnosis.sizes), "pass": diagnosis.pass_name,
        "probes": [{
            "name": r.probe.name, "changes": r.probe.isolates, "batch": r.batch,
            "length": r.length, "status": r.status.lower(), "rel_l2": n(r.rel_l2),
            "reference_rel_l2": n(r.reference_rel_l2), "tol": n(r.tol),
            "err_ratio": n(r.err_ratio), "message": r.message,
            **_probe_gradients_json(r),
        } for r in diagnosis.results],
        "verdict": {"mismatch": verdict.mismatch, "ran": verdict.ran,
                    "suspects": [rule.name for rule in verdict.suspects],
                    "lines": verdict.lines,
                    "wrong_gradients": [{"name": w.name, "term": w.term,
                                         "probes": list(w.probes)}
                                        for w in verdict.wrong_gradients],
                    "gradient_suspects": [rule.name for rule in verdict.gradient_suspects],
                    "terms": verdict.terms},
    }


def _probe_gradients_json(r: ProbeResult) -> dict:
    """A probe's gradient figures (null and empty for the forward pass)."""
    n, worst = options.json_number, r.worst_gradient
    return {
        "output_status": ("pass" if r.output_passed else "fail")
        if r.status in ("pass", "FAIL") else r.status,
        "grad_worst": r.grad_worst or None,
        "grad_rel_l2": n(worst.rel_l2) if worst else None,
        "grad_tol": n(worst.tol) if worst else None,
        "grad_err_ratio": n(_ratio(worst.rel_l2, worst.reference_rel_l2)) if worst else None,
        "failing_gradients": list(r.failing_gradients),
        "gradients": {name: {"rel_l2": n(j.rel_l2), "tol": n(j.tol),
                             "reference_rel_l2": n(j.reference_rel_l2)}
                      for name, j in r.gradients.items()},
    }


def run_diagnose(args: argparse.Namespace) -> int:
    if (args.variant is None) == (args.model_new is None):
        raise IPAInputError("VARIANT, --model-new: expected exactly one of them, got "
                            + ("both" if args.variant else "neither"))
    problem = options.problem_name(args)
    require_pass_for_problem(args.pass_name, problem)
    _probes_for_pass(problem, args.pass_name)  # usage errors before anything runs
    if args.model_new is not None:
        variant = model_new_variant(args.model_new)
    else:
        variant = get_variant(args.variant, problem)
    sizes = Sizes(args.batch, args.length, args.aligned_length)
    config = options.config_from_args(args)
    options.require_inputs_fit(config, args.batch, max(args.length, args.aligned_length),
                               args.device)
    worker = Worker(variant, args.device, timeout_s=args.timeout)
    try:
        with options.progress_bar("diagnose", len(probe_set(problem).probes),
                                  enabled=not (args.no_progress or args.json)) as advance:
            diagnosis = diagnose(variant, config, device=args.device,
                                 precision=args.dtype, sizes=sizes, seeds=args.seeds,
                                 weights_seed=args.weights_seed, on_probe=advance,
                                 runner=worker, pass_name=args.pass_name)
    finally:
        worker.close()
    if args.json:
        options.print_json(diagnosis_json(diagnosis))
    else:
        print_diagnosis(diagnosis)
    return diagnosis.verdict.exit_status


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "diagnose", help="localise a mismatch: probes that switch parts of IPA off",
        description="Run probes that switch one part of the function off or isolate it "
        "(identity frames, no point term, no pair bias, one key, B = 1, aligned N, one head, "
        "one point, non-contiguous inputs; for --problem openfold also the mask, the "
        "pair-value output, the point norms and the frame convention) through the oracle "
        "comparison, and name the suspect part; with --pass forward+backward judge every "
        "gradient too and name the wrong ones and their term. Exit "
        "status 1 when a mismatch is found or the variant cannot run here.")
    p.add_argument("variant", nargs="?", metavar="VARIANT", help="a registered variant")
    p.add_argument("--model-new", metavar="FILE",
                   help="a KernelBench-style Python file defining ModelNew (instead of VARIANT)")
    options.add_device_option(p)
    p.add_argument("--dtype", choices=sorted(PRECISIONS), default="fp32",
                   help="precision (default fp32)")
    defaults = DEFAULT_SIZES
    p.add_argument("--batch", type=options.positive_int, default=defaults.batch,
                   help=f"B of the probes with B > 1 (default {defaults.batch})")
    p.add_argument("--length", type=options.positive_int, default=defaults.length,
                   help=f"ragged N of the probes (default {defaults.length})")
    p.add_argument("--aligned-length", type=options.positive_int,
                   default=defaults.aligned_length,
                   help=f"N of the aligned-N probe (default {defaults.aligned_length})")
    p.add_argument("--seeds", type=options.positive_int, default=2,
                   help="input draws per probe (default 2)")
    p.add_argument("--weights-seed", type=int, default=0, help="seed of the weights (default 0)")
    p.add_argument("--pass", dest="pass_name", choices=PASSES, default="forward",
                   help="forward (default), or forward+backward: every probe a training step, "
                   "every gradient judged, and the verdict names the wrong gradients and "
                   "their term (pair bias, point distance, scalar dot, value aggregation, "
                   "frame, ...)")
    options.add_output_options(p)
    options.add_problem_option(p)
    options.add_config_options(p)
    options.add_timeout_option(p)
    p.set_defaults(run=run_diagnose)
