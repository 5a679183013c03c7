"""`ipa-bench diagnose`: localise a mismatch against the oracle from the outside.

A kernel that disagrees with the reference (the seed's fused kernel was off by 0.04-0.08)
is probed with inputs and weights that switch one part of the function off, or make it
dominate, or isolate it: identity frames, no point term, no pair bias, one key, one batch
element, an N that fills every tile, one head, one point, non-contiguous inputs. Each probe
goes through the same oracle comparison as `check` (float64 reference on the same inputs;
tolerance from the reference's own error in that probe; `harness.correctness.judge_output`).
Where the error appears and where it vanishes names the suspect; that logic is data
(`RULES`), one rule per suspect, each with a test.

Probes are cheap at the default sizes (B = 2, N = 97 and 128, default layer): a few seconds
on a CPU for the whole table.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness import options
from harness.correctness import judge_output, oracle_forward, rel_l2
from harness.model_new import model_new_variant
from harness.results import ERR_RATIO_LABEL
from harness.version import __version__
from variants.base import IPAFunction, Variant
from variants.problem import (
    PRECISIONS,
    IPAConfig,
    IPAInputError,
    IPAInputs,
    Precision,
    get_precision,
    make_inputs,
    math_mode,
)
from variants.reference import init_state_dict, make_module
from variants.registry import get_variant

StateDict = dict[str, torch.Tensor]
DIAGNOSE_SCHEMA = "ipa-bench.diagnose/1"

# Very negative head weight: softplus(-40) = 4e-18, so the point term is ~0 at any distance.
POINT_TERM_OFF_WEIGHT = -40.0
# softplus(6) ~ 6: about ten times the usual weight, so the point term drowns the others.
POINT_TERM_DOMINANT_WEIGHT = 6.0
# pair_bias.weight scale: the bias's std goes from ~0.6 to ~60, above the other logits.
PAIR_DOMINANT_SCALE = 100.0


# ---- probes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sizes:
    """The probe sizes: baseline batch, a ragged length, and a length that fills 64-tiles."""

    batch: int = 2
    length: int = 97
    aligned_length: int = 128


def _identity_frames(x: IPAInputs) -> IPAInputs:
    eye = torch.eye(3, dtype=x.rotations.dtype, device=x.rotations.device)
    return IPAInputs(x.node_repr, x.pair_repr, torch.zeros_like(x.translations),
                     eye.expand_as(x.rotations).contiguous())


def _rotations_only(x: IPAInputs) -> IPAInputs:
    return IPAInputs(x.node_repr, x.pair_repr, torch.zeros_like(x.translations), x.rotations)


def _translations_only(x: IPAInputs) -> IPAInputs:
    eye = torch.eye(3, dtype=x.rotations.dtype, device=x.rotations.device)
    return IPAInputs(x.node_repr, x.pair_repr, x.translations,
                     eye.expand_as(x.rotations).contiguous())


def _pair_zero(x: IPAInputs) -> IPAInputs:
    return IPAInputs(x.node_repr, torch.zeros_like(x.pair_repr), x.translations, x.rotations)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values with stride 2 in the last dim; the gaps hold NaN, so a kernel that
    reads the buffer as if it were contiguous gets NaN into its output."""
    buffer = torch.full((*t.shape[:-1], 2 * t.shape[-1]), math.nan, dtype=t.dtype,
                        device=t.device)
    view = buffer[..., ::2]
    view.copy_(t)
    return view


def _non_contiguous(x: IPAInputs) -> IPAInputs:
    return IPAInputs(*(_strided(t) for t in x.as_tuple()))


def _with(state_dict: StateDict, **values: Callable[[torch.Tensor], torch.Tensor]) -> StateDict:
    out = dict(state_dict)
    for key, fn in values.items():
        key = key.replace("__", ".")
        out[key] = fn(state_dict[key])
    return out


def _point_term_off(sd: StateDict) -> StateDict:
    return _with(sd, head_weights=lambda w: torch.full_like(w, POINT_TERM_OFF_WEIGHT))


def _point_term_dominant(sd: StateDict) -> StateDict:
    return _with(sd, head_weights=lambda w: torch.full_like(w, POINT_TERM_DOMINANT_WEIGHT))


def _qk_points_zero(sd: StateDict) -> StateDict:
    return _with(sd, q_pts__weight=torch.zeros_like, k_pts__weight=torch.zeros_like)


def _v_points_zero(sd: StateDict) -> StateDict:
    return _with(sd, v_pts__weight=torch.zeros_like)


def _scalar_term_off(sd: StateDict) -> StateDict:
    return _with(sd, q_proj__weight=torch.zeros_like)


def _pair_dominant(sd: StateDict) -> StateDict:
    return _with(sd, pair_bias__weight=lambda w: w * PAIR_DOMINANT_SCALE)


@dataclass(frozen=True)
class Probe:
    """One experiment: a config, a (batch, length), an inputs and a weights transform."""

    name: str
    isolates: str  # what the probe changes, as the table shows it
    batch: Callable[[Sizes], int] = lambda s: s.batch
    length: Callable[[Sizes], int] = lambda s: s.length
    config: Callable[[IPAConfig], IPAConfig] | None = None
    inputs: Callable[[IPAInputs], IPAInputs] | None = None  # value change (cached, shared)
    layout: Callable[[IPAInputs], IPAInputs] | None = None  # same values, other memory
    weights: Callable[[StateDict], StateDict] | None = None


PROBES: tuple[Probe, ...] = (
    Probe("baseline", "everything random (B > 1, ragged N)"),
    Probe("identity-frames", "R = I, t = 0", inputs=_identity_frames),
    Probe("rotations-only", "random R, t = 0", inputs=_rotations_only),
    Probe("translations-only", "R = I, random t", inputs=_translations_only),
    Probe("point-term-off", f"head_weights = {POINT_TERM_OFF_WEIGHT:g} (softplus ~ 0)",
          weights=_point_term_off),
    Probe("point-term-dominant", f"head_weights = {POINT_TERM_DOMINANT_WEIGHT:g} (softplus ~ 6)",
          weights=_point_term_dominant),
    Probe("qk-points-at-origin", "q_pts = k_pts = 0 and t = 0: point distances 0",
          inputs=_rotations_only, weights=_qk_points_zero),
    Probe("v-points-at-origin", "v_pts = 0 and t = 0: the inverse frame gets zeros",
          inputs=_rotations_only, weights=_v_points_zero),
    Probe("scalar-term-off", "q_proj = 0: scalar q.k logits 0", weights=_scalar_term_off),
    Probe("pair-off", "pair_repr = 0: pair bias 0", inputs=_pair_zero),
    Probe("pair-dominant", f"pair_bias.weight x {PAIR_DOMINANT_SCALE:g}", weights=_pair_dominant),
    Probe("single-key", "N = 1: softmax trivial, value path only", length=lambda s: 1),
    Probe("batch-1", "B = 1", batch=lambda s: 1),
    Probe("aligned-N", "N a multiple of 64 (no ragged tile)", length=lambda s: s.aligned_length),
    Probe("heads-1", "one head", config=lambda c: dataclasses.replace(c, heads=1)),
    Probe("points-1", "one query point, one value point",
          config=lambda c: dataclasses.replace(c, query_points=1, value_points=1)),
    Probe("non-contiguous", "inputs strided (NaN in the gaps)", layout=_non_contiguous),
)
PROBE_NAMES = tuple(p.name for p in PROBES)


# ---- verdict rules ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """A suspect, named when every probe in `fails` fails and every one in `passes` passes.

    Rules are tried in order; the first that matches is the prime suspect, later matches are
    listed as consistent with it. A probe that did not run (unsupported) matches neither.
    """

    name: str
    fails: tuple[str, ...]
    passes: tuple[str, ...]
    observation: str
    suspect: str

    def matches(self, outcomes: dict[str, str]) -> bool:
        return (all(outcomes.get(p) == "fail" for p in self.fails)
                and all(outcomes.get(p) == "pass" for p in self.passes))

    def sentence(self) -> str:
        return f"{self.observation}: {self.suspect}"


RULES: tuple[Rule, ...] = (
    Rule("non-contiguous", ("non-contiguous",), ("baseline",),
         "only with non-contiguous inputs",
         "stride handling: the kernel reads an input as if it were contiguous "
         "(honour its strides or call .contiguous())"),
    Rule("batch", ("baseline",), ("batch-1",),
         "only with B > 1",
         "batch indexing: a missing or wrong batch stride (frames, pair_repr, "
         "node_repr or the output)"),
    Rule("tail", ("baseline",), ("aligned-N",),
         "only with ragged N (a multiple of 64 is clean)",
         "tail handling: the last partial block of keys or queries "
         "(loop bound, bounds check or mask)"),
    Rule("heads", ("baseline",), ("heads-1",),
         "only with several heads",
         "head indexing: a head stride, or the (head, dim) order of the q/k/v features"),
    Rule("points", ("baseline",), ("points-1",),
         "only with several query/value points",
         "point indexing: the (head, point, xyz) order of the q_pts/k_pts/v_pts features"),
    Rule("point-weight", ("baseline", "point-term-off"), ("qk-points-at-origin",),
         "very negative head_weights do not switch the point term off, zero query/key "
         "points do",
         "the point weight: softplus(head_weights) missing or wrong"),
    Rule("pair-bias", ("baseline",), ("pair-off",),
         "error vanishes with pair_repr = 0",
         "pair bias: pair_repr read at (j, i) instead of (i, j), the pair_bias projection, "
         "or the bias layout (B, H, N, N) vs (B, N, N, H)"),
    Rule("scalar-term", ("baseline",), ("scalar-term-off",),
         "error vanishes with the scalar q.k term off",
         "scalar logits: the 1/sqrt(d) scale or the q/k layout"),
    Rule("point-term", ("baseline",), ("point-term-off",),
         "error vanishes with the point term off",
         "point logits: query/key points, their frame transform, the squared distance "
         "or its factor softplus(w) / 2"),
    Rule("inverse-frame", ("baseline", "rotations-only"),
         ("identity-frames", "translations-only", "v-points-at-origin"),
         "error needs rotations and vanishes when the inverse frame gets only zeros",
         "the inverse frame (g - t_i) @ R_i^T: R where R^T belongs, or another residue's "
         "frame"),
    Rule("frame-rotation", ("baseline", "rotations-only"), ("identity-frames", "translations-only"),
         "error vanishes with identity frames and with translations only, stays with "
         "rotations only",
         "rotation in the frame transform or the inverse frame (R where R^T belongs, "
         "or row- vs column-vector convention)"),
    Rule("frame-translation", ("baseline", "translations-only"),
         ("identity-frames", "rotations-only"),
         "error vanishes with identity frames and with rotations only, stays with "
         "translations only",
         "translation in the frame transform or the inverse frame (+ t, - t_i, or another "
         "residue's t)"),
    Rule("frames", ("baseline",), ("identity-frames",),
         "error vanishes with identity frames",
         "frame transform or inverse frame"),
    Rule("value-path", ("single-key", "aligned-N"), (),
         "fails even with a single key, where softmax is trivial",
         "value path: LayerNorm, the v / v_pts projections, the inverse frame, the concat "
         "order or out_proj"),
    Rule("logits", ("baseline",), ("single-key",),
         "clean with a single key (value path and out_proj are right)",
         "attention logits or softmax"),
    Rule("point-dominant", ("point-term-dominant",), ("baseline",),
         "only when the point term dominates",
         "precision of the squared distance (|q|^2 + |k|^2 - 2 q.k cancels at "
         "Angstrom-scale coordinates) or a saturated softmax"),
    Rule("pair-dominant", ("pair-dominant",), ("baseline",),
         "only when the pair bias dominates",
         "precision or scale of the pair bias (accumulated in low precision, or scaled)"),
    Rule("single-key-only", ("single-key",), ("baseline",),
         "only with N = 1",
         "the N = 1 edge case (an empty tile, a loop that assumes N > 1)"),
)


@dataclass
class Verdict:
    mismatch: bool
    suspects: list[Rule]  # matching rules, prime suspect first
    lines: list[str]  # the plain-language verdict
    ran: bool = True  # False when the baseline probe could not run here

    @property
    def exit_status(self) -> int:
        """0: checked and clean; 1: a mismatch, or nothing checked (as `check` does for a
        requested variant that cannot run)."""
        return 1 if self.mismatch or not self.ran else 0


def verdict(
    outcomes: dict[str, str],
    errors: dict[str, str] | None = None,
    unsupported: dict[str, str] | None = None,
) -> Verdict:
    """The verdict for probe outcomes ("pass", "fail", or anything else for did-not-run).

    `errors` maps probes that raised to their message; a raise at the baseline is the whole
    verdict (with the probes that did run), since the rules read arithmetic, not exceptions.
    `unsupported` maps probes the variant cannot run to its reasons.
    """
    errors, unsupported = errors or {}, unsupported or {}
    if "baseline" in unsupported:
        return Verdict(False, [], [f"nothing checked: the variant cannot run the baseline "
                                   f"probe here: {unsupported['baseline']}"], ran=False)
    failed = [p for p in PROBE_NAMES if outcomes.get(p) == "fail"]
    if not failed:
        return Verdict(False, [], ["no mismatch: every probe agrees with the oracle within "
                                   "its tolerance"])
    passed = [p for p in PROBE_NAMES if outcomes.get(p) == "pass"]
    if "baseline" in errors:  # the rules read arithmetic, not exceptions
        lines = [f"the variant raises at the baseline probe: {errors['baseline']}"]
        if passed:
            lines.append(f"it runs in: {', '.join(passed)}")
        return Verdict(True, [], lines)
    suspects = [rule for rule in RULES if rule.matches(outcomes)]
    lines = []
    if suspects:
        lines.append(f"suspect: {suspects[0].sentence()}")
        lines += [f"also consistent: {rule.sentence()}" for rule in suspects[1:]]
    else:
        lines.append(
            f"mismatch in {', '.join(failed)}; no rule isolates it"
            + (f" (clean: {', '.join(passed)})" if passed else " (no probe is clean: a part "
               "every probe uses, e.g. LayerNorm, the projections or out_proj)"))
    return Verdict(True, suspects, lines)


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

    @property
    def err_ratio(self) -> float:
        """rel_l2 over the reference's own error (nan where undefined, as in fp64)."""
        if math.isnan(self.rel_l2) or not self.reference_rel_l2 > 0:
            return math.nan
        return self.rel_l2 / self.reference_rel_l2

    @property
    def outcome(self) -> str:
        """For the rules: pass, fail (FAIL or error), or skip."""
        return {"pass": "pass", "FAIL": "fail", "error": "fail"}.get(self.status, "skip")


@dataclass
class Diagnosis:
    variant: str
    device: str
    precision: str
    config: IPAConfig
    sizes: Sizes
    results: list[ProbeResult] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        by_status = {status: {r.probe.name: r.message for r in self.results
                              if r.status == status} for status in ("error", "unsupported")}
        return verdict({r.probe.name: r.outcome for r in self.results},
                       by_status["error"], by_status["unsupported"])


class OracleCache:
    """Inputs, oracle output and the reference's own error per (probe inputs, seed): they do
    not depend on the variant, so diagnosing several variants computes them once."""

    def __init__(self):
        self._entries: dict[tuple, tuple[IPAInputs, torch.Tensor, float]] = {}

    def get(self, key: tuple, make: Callable[[], tuple[IPAInputs, torch.Tensor, float]]):
        if key not in self._entries:
            self._entries[key] = make()
        return self._entries[key]


def _message(exc: BaseException) -> str:
    """The exception as the table shows it (a compiler log can be long: cut at 2000)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 2000 else text[:2000] + " ..."


def diagnose(
    variant: Variant,
    config: IPAConfig | None = None,
    *,
    device: str = "cpu",
    precision: str | Precision = "fp32",
    sizes: Sizes = Sizes(),
    seeds: int = 2,
    weights_seed: int = 0,
    probes: tuple[Probe, ...] = PROBES,
    cache: OracleCache | None = None,
    on_probe: Callable[[str], None] | None = None,
) -> Diagnosis:
    """Run every probe on `variant` and return the figures; `.verdict` names the suspect.

    An exception from the variant's build or forward (a kernel that fails to compile, a
    `view` on non-contiguous input) makes that probe an `error`, which counts as a failure.
    """
    config = config or IPAConfig()
    precision = get_precision(precision)
    cache = cache or OracleCache()
    diagnosis = Diagnosis(variant.name, device, precision.name, config, sizes)
    built: dict[tuple, IPAFunction | Exception] = {}
    with math_mode(precision), torch.no_grad():
        for probe in probes:
            diagnosis.results.append(_run_probe(
                variant, probe, config, device, precision, sizes, seeds, weights_seed,
                cache, built))
            if on_probe:
                on_probe(probe.name)
    return diagnosis


def _run_probe(variant, probe, base_config, device, precision, sizes, seeds, weights_seed,
               cache, built) -> ProbeResult:
    config = probe.config(base_config) if probe.config else base_config
    batch, length = probe.batch(sizes), probe.length(sizes)
    result = ProbeResult(probe, config, batch, length)
    reasons = variant.not_supported_reasons(config, device, precision)
    if reasons:
        result.status, result.message = "unsupported", "; ".join(reasons)
        return result
    weights = init_state_dict(config, seed=weights_seed)
    if probe.weights:
        weights = probe.weights(weights)

    build_key = (config, probe.weights)
    if build_key not in built:
        try:
            built[build_key] = variant.build(weights, config, device, precision)
        except Exception as exc:  # recorded as this probe's error row, never dropped
            built[build_key] = exc
    fn = built[build_key]
    if isinstance(fn, Exception):
        result.status, result.message = "error", f"build: {_message(fn)}"
        return result

    def make_entry(seed):
        inputs = make_inputs(config, batch, length, dtype=precision.dtype, device=device,
                             seed=seed)
        if probe.inputs:
            inputs = probe.inputs(inputs)
        oracle = oracle_forward(weights, config, inputs)
        reference = make_module(weights, config, device, precision.dtype)
        return inputs, oracle, rel_l2(reference(*inputs.as_tuple()), oracle)

    worst = None
    for seed in range(seeds):
        key = (config, batch, length, probe.inputs, probe.weights, weights_seed, seed,
               device, precision.name)
        inputs, oracle, ref_err = cache.get(key, lambda seed=seed: make_entry(seed))
        pristine = inputs  # cached; the variant gets a copy, so it can spoil no cache entry
        inputs = inputs.clone()
        if probe.layout:
            inputs = probe.layout(inputs)
        try:
            out = fn(*inputs.as_tuple())
        except Exception as exc:  # recorded as this probe's error row, never dropped
            result.status, result.message = "error", f"forward: {_message(exc)}"
            return result
        judgement = judge_output(out, oracle, ref_err, precision, inputs=inputs,
                                 pristine=pristine)
        if worst is None or judgement.err_over_tol > worst.err_over_tol:
            worst = judgement
        if not judgement.passed:
            result.status = "FAIL"
            result.message = result.message or "; ".join(
                f for f in judgement.failures if not f.startswith("rel_l2"))
    result.rel_l2, result.reference_rel_l2, result.tol = (
        worst.rel_l2, worst.reference_rel_l2, worst.tol)
    return result


# ---- output and command ----------------------------------------------------------------------

def _figure(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3e}"


def print_diagnosis(diagnosis: Diagnosis, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 150))
    s, c = diagnosis.sizes, diagnosis.config
    table = Table(title=f"diagnose {diagnosis.variant}: {diagnosis.precision} on "
                  f"{diagnosis.device}, B={s.batch}, N={s.length}, node_dim={c.node_dim}, "
                  f"pair_dim={c.pair_dim}, H={c.heads}, Qp={c.query_points}, "
                  f"Vp={c.value_points}")
    for column in ("probe", "what it changes", "B", "N", "rel_l2", "tol", ERR_RATIO_LABEL,
                   "result"):
        table.add_column(column, overflow="fold")
    for r in diagnosis.results:
        ratio = r.err_ratio
        result = escape(r.status + (f": {r.message}" if r.message else ""))
        style = {"FAIL": "bold red", "error": "bold red", "unsupported": "dim"}.get(r.status)
        table.add_row(r.probe.name, r.probe.isolates, str(r.batch), str(r.length),
                      _figure(r.rel_l2), _figure(r.tol),
                      "-" if math.isnan(ratio) else f"{ratio:.3g}", result, style=style)
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
        "sizes": dataclasses.asdict(diagnosis.sizes),
        "probes": [{
            "name": r.probe.name, "changes": r.probe.isolates, "batch": r.batch,
            "length": r.length, "status": r.status.lower(), "rel_l2": n(r.rel_l2),
            "reference_rel_l2": n(r.reference_rel_l2), "tol": n(r.tol),
            "err_ratio": n(r.err_ratio), "message": r.message,
        } for r in diagnosis.results],
        "verdict": {"mismatch": verdict.mismatch, "ran": verdict.ran,
                    "suspects": [rule.name for rule in verdict.suspects],
                    "lines": verdict.lines},
    }


def run_diagnose(args: argparse.Namespace) -> int:
    if (args.variant is None) == (args.model_new is None):
        raise IPAInputError("VARIANT, --model-new: expected exactly one of them, got "
                            + ("both" if args.variant else "neither"))
    if args.model_new is not None:
        variant = model_new_variant(args.model_new)
    else:
        variant = get_variant(args.variant)
    sizes = Sizes(args.batch, args.length, args.aligned_length)
    with options.progress_bar("diagnose", len(PROBES),
                              enabled=not (args.no_progress or args.json)) as advance:
        diagnosis = diagnose(variant, options.config_from_args(args), device=args.device,
                             precision=args.dtype, sizes=sizes, seeds=args.seeds,
                             weights_seed=args.weights_seed, on_probe=advance)
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
        "one point, non-contiguous inputs) through the oracle comparison, and name the "
        "suspect part. Exit status 1 when a mismatch is found or the variant cannot run "
        "here.")
    p.add_argument("variant", nargs="?", metavar="VARIANT", help="a registered variant")
    p.add_argument("--model-new", metavar="FILE",
                   help="a KernelBench-style Python file defining ModelNew (instead of VARIANT)")
    options.add_device_option(p)
    p.add_argument("--dtype", choices=sorted(PRECISIONS), default="fp32",
                   help="precision (default fp32)")
    defaults = Sizes()
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
    options.add_output_options(p)
    options.add_config_options(p)
    p.set_defaults(run=run_diagnose)
