"""The probes and verdict rules of `ipa-bench diagnose`, as data.

A probe is an experiment on the inputs, the weights or the sizes that switches one part of
IPA off, makes it dominate, or isolates it. A rule names a suspect part from which probes
fail and which pass. `harness.diagnose` runs the probes through the oracle comparison and
applies the rules; `docs/diagnose.md` explains each; the planted-bug tests keep every rule
honest.

Each problem has its own (`probe_set(problem)`): the simplified problem's are below
(`PROBES`, `RULES`, and the gradient terms and rules of `--pass forward+backward`:
`GRADIENT_TERMS`, `GRADIENT_RULES`); another problem brings them as data on its problem
object (`probes`, `rules`, `gradient_terms`, `gradient_rules`: keyword dicts of `Probe`,
`Rule` and `GradientRule`, and a dict gradient name -> term; openfold's are in
`variants/openfold/probes.py`). A problem with several output parts (openfold: present
residues, masked query rows) also gets an outcome per part, `PROBE:PART`, that its rules may
name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from variants.problem import IPAConfig, IPAInputs

StateDict = dict[str, torch.Tensor]

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


DEFAULT_SIZES = Sizes()


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
    """One experiment: a config, a (batch, length), an inputs and a weights transform (of
    the problem's config, inputs dataclass and state_dict; the annotations name the
    simplified problem's)."""

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
    `PROBE:PART` names one output part of a probe (a problem with several parts: openfold's
    `baseline:masked` is the masked query rows alone).
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
    Rule("point-weight", ("baseline", "point-term-off", "identity-frames"),
         ("qk-points-at-origin",),
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
    # forward+backward: the gradients that fail somewhere, and the matching gradient rules
    wrong_gradients: list[WrongGradient] = dataclasses.field(default_factory=list)
    gradient_suspects: list[GradientRule] = dataclasses.field(default_factory=list)

    @property
    def exit_status(self) -> int:
        """0: checked and clean; 1: a mismatch, or nothing checked (as `check` does for a
        requested variant that cannot run)."""
        return 1 if self.mismatch or not self.ran else 0

    @property
    def terms(self) -> list[str]:
        """The terms of the wrong gradients, the prime backward suspect's first."""
        terms = [r.term for r in self.gradient_suspects[:1]]
        return list(dict.fromkeys(terms + [w.term for w in self.wrong_gradients]))


def verdict(
    outcomes: dict[str, str],
    errors: dict[str, str] | None = None,
    unsupported: dict[str, str] | None = None,
    gradient_failures: dict[str, list[str]] | None = None,
    probes: ProbeSet | None = None,
) -> Verdict:
    """The verdict for probe outcomes ("pass", "fail", or anything else for did-not-run).

    `outcomes` judge the output (by probe name, and by `PROBE:PART` for a problem with
    several output parts). `errors` maps probes that raised to their message; a raise
    at the baseline is the whole verdict (with the probes that did run), since the rules
    read arithmetic, not exceptions. `unsupported` maps probes the variant cannot run to
    its reasons. `gradient_failures` (forward+backward only) maps every probe whose training
    step ran to the gradients that fail in it (`gradient_verdict` reads them). `probes`: the
    problem's probes and rules, forward and backward (default: the simplified problem's).
    """
    probes = probes or SIMPLIFIED_PROBES
    errors, unsupported = errors or {}, unsupported or {}
    if "baseline" in unsupported:
        return Verdict(False, [], [f"nothing checked: the variant cannot run the baseline "
                                   f"probe here: {unsupported['baseline']}"], ran=False)
    training = gradient_failures is not None
    wrong, gradient_rules, gradient_lines = gradient_verdict(gradient_failures or {}, probes)
    failed = [p for p in probes.names if outcomes.get(p) == "fail"]
    if not failed and not wrong:
        return Verdict(False, [], [
            "no mismatch: every probe agrees with the oracle within its tolerance"
            + (" (the output and every gradient)" if training else "")])
    passed = [p for p in probes.names if outcomes.get(p) == "pass"]
    if "baseline" in errors:  # the rules read arithmetic, not exceptions
        lines = [f"the variant raises at the baseline probe: {errors['baseline']}"]
        if passed:
            lines.append(f"it runs in: {', '.join(passed)}")
        return Verdict(True, [], lines)
    suspects = [rule for rule in probes.rules if rule.matches(outcomes)]
    lines = []
    if suspects:
        lines.append(f"suspect: {suspects[0].sentence()}")
        lines += [f"also consistent: {rule.sentence()}" for rule in suspects[1:]]
    elif failed:
        lines.append(
            f"mismatch in {', '.join(failed)}; no rule isolates it"
            + (f" (clean: {', '.join(passed)})" if passed else " (no probe is clean: a part "
               f"every probe uses, e.g. {probes.everywhere})"))
    if wrong:
        lines.append("the output is wrong too: fix the forward first, the gradients follow it"
                     if failed else "the output is right in every probe: the backward is wrong")
    lines += gradient_lines
    return Verdict(True, suspects, lines, wrong_gradients=wrong,
                   gradient_suspects=gradient_rules)


# ---- gradients (diagnose --pass forward+backward) ----------------------------------------------

SHARED_TERM = "shared (input projections)"
# The simplified problem's: which term of IPA each gradient belongs to: an input by name, a
# parameter by its whole state_dict key or else the module before the first '.'. A wrong
# backward in one term shows in its own tensors' gradients and, through the chain rule, in
# the shared ones upstream (layer_norm, node_repr), so the shared term is named only when no
# other is wrong.
GRADIENT_TERMS: dict[str, str] = {
    "pair_repr": "pair bias",
    "pair_bias": "pair bias",
    "head_weights": "point distance",
    "q_pts": "point distance",
    "k_pts": "point distance",
    "q_proj": "scalar dot",
    "k_proj": "scalar dot",
    "v_proj": "value aggregation",
    "v_pts": "value aggregation",
    "out_proj": "value aggregation",
    "translations": "frame",
    "rotations": "frame",
    "layer_norm": SHARED_TERM,
    "node_repr": SHARED_TERM,
}
TERMS: tuple[str, ...] = tuple(dict.fromkeys(GRADIENT_TERMS.values()))
LOGIT_TERMS = ("scalar dot", "point distance", "pair bias")


def gradient_term(name: str, terms: dict[str, str] | None = None) -> str:
    """The term of the gradient of input or parameter `name` in `terms` (default: the
    simplified problem's `GRADIENT_TERMS`): by the whole name, else by the module before the
    first '.'; 'unknown' if neither."""
    terms = GRADIENT_TERMS if terms is None else terms
    return terms.get(name) or terms.get(name.split(".")[0], "unknown")


@dataclass(frozen=True)
class GradientRule:
    """A suspect in the backward, named when at least one gradient of every term in `wrong`
    fails (in some probe), every gradient of every term in `right` passes (in every probe that
    ran), and for the probes: in every one of `fails` some gradient fails, in every one of
    `passes` every gradient passes. `right=None`: every other term of the problem but its
    shared ones (`ProbeSet.shared_terms`), i.e. 'only the `wrong` terms are wrong'. `term` is
    what the verdict names (a term of the problem, or a part of the layer no one gradient
    belongs to, e.g. the softmax)."""

    name: str
    term: str
    wrong: tuple[str, ...]
    right: tuple[str, ...] | None
    fails: tuple[str, ...]
    passes: tuple[str, ...]
    observation: str
    suspect: str

    def right_terms(self, terms: tuple[str, ...] = TERMS,
                    shared: tuple[str, ...] = (SHARED_TERM,)) -> tuple[str, ...]:
        """The terms that must be right, `right=None` resolved against the problem's `terms`
        (default: the simplified problem's)."""
        if self.right is not None:
            return self.right
        return tuple(t for t in terms if t not in self.wrong and t not in shared)

    def matches(self, wrong_terms: set[str], outcomes: dict[str, str],
                terms: tuple[str, ...] = TERMS,
                shared: tuple[str, ...] = (SHARED_TERM,)) -> bool:
        return (all(t in wrong_terms for t in self.wrong)
                and not any(t in wrong_terms for t in self.right_terms(terms, shared))
                and all(outcomes.get(p) == "fail" for p in self.fails)
                and all(outcomes.get(p) == "pass" for p in self.passes))

    def sentence(self) -> str:
        return f"{self.observation}: {self.suspect}"


# Most specific first: the probe-confirmed readings, then one term alone, then combinations.
GRADIENT_RULES: tuple[GradientRule, ...] = (
    GradientRule("pair-bias-weight-grad", "pair bias", ("pair bias",), None,
                 ("baseline",), ("pair-off",),
                 "only pair-bias gradients are wrong, and they are right with pair_repr = 0 "
                 "(where d pair_bias.weight = 0)",
                 "the pair bias backward: d pair_bias.weight = sum_ij z_ij (x) d bias_ij "
                 "(the (i, j) index or the head layout)"),
    GradientRule("pair-bias-grad", "pair bias", ("pair bias",), None, (), (),
                 "only pair-bias gradients are wrong",
                 "the pair bias backward: d pair_repr = d bias . W or d pair_bias.weight (the "
                 "(i, j) index, the (B, H, N, N) layout, a missing write)"),
    GradientRule("point-weight-grad", "point distance", ("point distance",), None,
                 ("baseline", "point-term-off"), ("qk-points-at-origin",),
                 "only point-distance gradients are wrong, and they are right when the "
                 "distances are 0",
                 "the point term backward: d head_weights (softplus' = sigmoid, the factor "
                 "1/2) or d q_pts / k_pts from the squared distance"),
    GradientRule("point-distance-grad", "point distance", ("point distance",), None, (), (),
                 "only point-distance gradients are wrong",
                 "the point term backward: d head_weights or d q_pts / k_pts (2 (q - k) per "
                 "point, the weight softplus(w) / 2)"),
    GradientRule("scalar-dot-grad", "scalar dot", ("scalar dot",), None, (), (),
                 "only scalar-dot gradients are wrong",
                 "the scalar q.k backward: dq = dS . k, dk = dS^T . q, the 1/sqrt(d) scale"),
    GradientRule("frame-grad", "frame", ("frame",), None, (), (),
                 "only the frames' gradients are wrong",
                 "the frame backward: d translations / d rotations of the frame transform or "
                 "the inverse frame"),
    GradientRule("value-aggregation-grad", "value aggregation", ("value aggregation",),
                 LOGIT_TERMS, (), (),
                 "value-path gradients are wrong, the logit terms' right",
                 "the value path backward: dV = P^T dO, d v_pts through the inverse frame, "
                 "out_proj"),
    GradientRule("softmax-grad", "attention weights (softmax)", LOGIT_TERMS,
                 ("value aggregation",), (), (),
                 "every logit term's gradients are wrong, the value path's right",
                 "the softmax backward: d logits = P * (dP - sum_j P dP), or dP = dO . V^T"),
    GradientRule("shared-grad", SHARED_TERM, (SHARED_TERM,), None, (), (),
                 "only the shared gradients (LayerNorm, node_repr) are wrong",
                 "the LayerNorm backward, or the sum of the projections' input gradients "
                 "(d x = the q, k, v and point projections' W^T dy)"),
    GradientRule("logits-grad", "attention logits", (), ("value aggregation", "frame"),
                 ("baseline",), ("single-key",),
                 "gradient errors vanish with a single key (softmax constant, d logits = 0) "
                 "and the value path's and the frames' gradients are right",
                 "the backward of the attention logits, before the softmax"),
)


# ---- the probes of each problem ----------------------------------------------------------------

@dataclass(frozen=True)
class ProbeSet:
    """One problem's probes and rules. `everywhere` names what every probe uses (the verdict
    when none is clean). For `diagnose --pass forward+backward`: `gradient_terms` (gradient
    name -> term, `gradient_term`; empty: the backward is not diagnosed for this problem),
    `gradient_rules`, and `shared_terms`: the terms a rule's `right=None` leaves out and the
    wrong list puts last (a shared input's, upstream of every other term; openfold's also
    the rounding-only linear_b.bias)."""

    problem: str
    probes: tuple[Probe, ...]
    rules: tuple[Rule, ...]
    everywhere: str = "LayerNorm, the projections or out_proj"
    gradient_terms: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)
    gradient_rules: tuple[GradientRule, ...] = ()
    shared_terms: tuple[str, ...] = (SHARED_TERM,)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.probes)

    @property
    def gradients(self) -> bool:
        """Whether the backward is diagnosed for this problem (its gradient terms written)."""
        return bool(self.gradient_terms)

    @property
    def terms(self) -> tuple[str, ...]:
        """The problem's gradient terms, in table order."""
        return tuple(dict.fromkeys(self.gradient_terms.values()))

    def gradient_term(self, name: str) -> str:
        return gradient_term(name, self.gradient_terms)

    def key(self, probe: Probe) -> str:
        """The probe's name as an `InputRecipe` carries it to a worker (`probe_named`):
        `problem/name`, or the bare name for the simplified problem."""
        return probe.name if self.problem == "simplified" else f"{self.problem}/{probe.name}"


SIMPLIFIED_PROBES = ProbeSet("simplified", PROBES, RULES, gradient_terms=GRADIENT_TERMS,
                             gradient_rules=GRADIENT_RULES)
_PROBE_SETS: dict[str, ProbeSet] = {SIMPLIFIED_PROBES.problem: SIMPLIFIED_PROBES}


def probe_set(problem: str) -> ProbeSet:
    """The probes and rules of `problem` (a name in `harness.problems.PROBLEMS`), built from
    its problem object's `probes`, `rules` and `gradient_rules` (keyword dicts of `Probe`,
    `Rule`, `GradientRule`), `gradient_terms` and `gradient_shared_terms`."""
    if problem not in _PROBE_SETS:
        from harness.problems import PROBLEMS  # imported here: the probes import no harness

        spec = PROBLEMS[problem]
        probes = tuple(p if isinstance(p, Probe) else Probe(**p)
                       for p in getattr(spec, "probes", ()))
        if not probes:
            raise ValueError(f"problem {problem!r} has no diagnose probes")
        rules = tuple(r if isinstance(r, Rule) else Rule(**r) for r in getattr(spec, "rules", ()))
        everywhere = getattr(spec, "probes_everywhere", None) or ProbeSet.everywhere
        gradient_rules = tuple(r if isinstance(r, GradientRule) else GradientRule(**r)
                               for r in getattr(spec, "gradient_rules", ()))
        shared = tuple(getattr(spec, "gradient_shared_terms", None) or (SHARED_TERM,))
        _PROBE_SETS[problem] = ProbeSet(problem, probes, rules, everywhere,
                                        dict(getattr(spec, "gradient_terms", None) or {}),
                                        gradient_rules, shared)
    return _PROBE_SETS[problem]


def probe_named(key: str) -> Probe:
    """The probe an `InputRecipe` names (`ProbeSet.key`: `problem/name`, or a simplified
    probe's bare name); a worker gets probes by name, their functions stay with the problem."""
    problem, _, name = key.rpartition("/")
    probes = probe_set(problem or SIMPLIFIED_PROBES.problem)
    return probes.probes[probes.names.index(name)]


# ---- the backward's verdict ----------------------------------------------------------------------

@dataclass(frozen=True)
class WrongGradient:
    """A gradient that fails in at least one probe: its name, term, and the probes."""

    name: str
    term: str
    probes: tuple[str, ...]


def gradient_verdict(failing: dict[str, list[str]], probes: ProbeSet | None = None
                     ) -> tuple[list[WrongGradient], list[GradientRule], list[str]]:
    """The backward's reading of `failing` (probe -> the gradients that fail in it, for
    every probe whose training step ran and was judged) with `probes`' gradient terms and
    rules (default: the simplified problem's): the wrong gradients (the shared ones last,
    else most probes first), the matching gradient rules (prime suspect first; per term only
    the first, most specific, that matches), and the verdict lines."""
    probes = probes or SIMPLIFIED_PROBES
    by_name: dict[str, list[str]] = {}
    for probe in probes.names:
        for name in failing.get(probe, ()):
            by_name.setdefault(name, []).append(probe)
    if not by_name:
        return [], [], []
    shared = probes.shared_terms
    wrong = sorted((WrongGradient(n, probes.gradient_term(n), tuple(p))
                    for n, p in by_name.items()),
                   key=lambda w: (w.term in shared, -len(w.probes), w.name))
    outcomes = {p: "fail" if names else "pass" for p, names in failing.items()}
    wrong_terms = {w.term for w in wrong}
    rules: list[GradientRule] = []
    for rule in probes.gradient_rules:  # one reading per term: the most specific that matches
        if (rule.matches(wrong_terms, outcomes, probes.terms, shared)
                and rule.term not in {r.term for r in rules}):
            rules.append(rule)
    ran = len(failing)

    def where(w: WrongGradient) -> str:
        if len(w.probes) == ran:
            return f"all {ran} probes"
        clean = [p for p in probes.names if p in failing and p not in w.probes]
        return f"{len(w.probes)} of {ran} probes, right in {', '.join(clean)}"

    lines = ["wrong gradients: " + ", ".join(f"{w.name} ({w.term}; {where(w)})"
                                             for w in wrong)]
    if rules:
        lines.append(f"backward suspect: {rules[0].term}: {rules[0].sentence()}")
        lines += [f"also consistent (backward): {r.term}: {r.sentence()}" for r in rules[1:]]
    else:
        terms = list(dict.fromkeys(w.term for w in wrong))
        lines.append(f"backward: wrong gradients in {', '.join(terms)}; no rule isolates them")
    return wrong, rules, lines
