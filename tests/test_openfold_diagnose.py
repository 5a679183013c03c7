"""`ipa-bench diagnose --problem openfold`: each planted openfold bug gets the right suspect,
the reference a clean bill, every rule has a case that makes it the prime suspect, and the
probes do what they say to the reference (variants/openfold/probes.py). With `--pass
forward+backward`: each planted backward bug gets the right term and gradient rule, the
reference and torch-compile a clean bill, every gradient rule a case."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from harness.cli import main as cli_main
from harness.correctness import ROUNDING_ONLY_MARGIN, GradientFigures, judge_gradients
from harness.diagnose import diagnose
from harness.probes import (
    GradientRule,
    Probe,
    Rule,
    Sizes,
    probe_named,
    probe_set,
    verdict,
)
from tests.planted import (
    PLANTED_OPENFOLD_BACKWARD_BUGS,
    PLANTED_OPENFOLD_BUGS,
    HookedOpenFold,
    HookedOpenFoldExact,
    HookedOpenFoldTrainable,
    PairValuesTransposedTrainable,
)
from variants.openfold import PROBLEM
from variants.openfold import probes as of_probes
from variants.openfold.problem import (
    INPUT_NAMES,
    OpenFoldConfig,
    init_state_dict,
    make_inputs,
)
from variants.openfold.reference import Compiled, Reference, make_module
from variants.problem import IPAInputError, get_precision
from variants.registry import get_variant

FILES = Path(__file__).parent / "model_new_files"
# Awkward sizes, as tests/test_openfold.py: nothing a power of two, C != c_s / H, Pq != Pv.
CFG = OpenFoldConfig(c_s=11, c_z=7, c_hidden=5, no_heads=3, no_qk_points=2, no_v_points=3)
SIZES = Sizes(batch=2, length=21, aligned_length=32)
PROBES = probe_set("openfold")
NAMES = set(PROBES.names)
F64 = torch.float64

pytestmark = pytest.mark.usefixtures("one_thread")




# ---- end to end on planted bugs ---------------------------------------------------------------

@pytest.mark.parametrize("variant_cls", [Reference, HookedOpenFoldExact], ids=lambda c: c.name)
def test_correct_implementations_get_a_clean_bill(variant_cls, oracles):
    diagnosis = diagnose(variant_cls(), CFG, sizes=SIZES, cache=oracles)
    assert [r.probe.name for r in diagnosis.results] == list(PROBES.names)
    assert [r.status for r in diagnosis.results] == ["pass"] * len(PROBES.probes)
    assert not diagnosis.verdict.mismatch
    # both parts were judged wherever the probe pads, and only the present one where not
    by_name = {r.probe.name: r for r in diagnosis.results}
    assert by_name["baseline"].parts == {"present": "pass", "masked": "pass"}
    assert by_name["no-padding"].parts == by_name["single-key"].parts == {"present": "pass"}


def test_hooked_openfold_is_the_reference_bit_for_bit():
    state_dict = init_state_dict(CFG)
    inputs = make_inputs(CFG, 3, 9, seed=5, lengths=[9, 5, 1]).as_tuple()
    hooked = HookedOpenFold(*CFG.module_args())
    hooked.load_state_dict(state_dict)
    with torch.no_grad():
        assert torch.equal(hooked(*inputs), make_module(state_dict, CFG, "cpu",
                                                        torch.float32)(*inputs))


@pytest.mark.parametrize("variant_cls", list(PLANTED_OPENFOLD_BUGS), ids=lambda c: c.name)
def test_planted_bug_is_named(variant_cls, oracles):
    diagnosis = diagnose(variant_cls(), CFG, sizes=SIZES, cache=oracles)
    found = diagnosis.verdict
    assert found.mismatch
    assert found.suspects, found.lines
    assert found.suspects[0].name == PLANTED_OPENFOLD_BUGS[variant_cls], found.lines
    assert found.lines[0].startswith("suspect: ")


def test_a_variant_of_another_problem_is_refused():
    with pytest.raises(IPAInputError, match=r"implements \['simplified'\], not problem "
                                            r"'openfold'"):
        diagnose(get_variant("reference"), CFG, sizes=SIZES)


# ---- the rules, one case each -----------------------------------------------------------------

# For each rule: the probes whose output fails in a bug of that kind (the others pass), and
# the probes where only the masked query rows fail. Several are the planted bugs' measured
# tables (tests above); the rest are what such a bug does to each probe.
EVERY = NAMES
NO_MASKED_ROWS = {"no-padding", "single-key"}
RULE_CASES: dict[str, tuple[set[str], set[str]]] = {
    "non-contiguous": ({"non-contiguous"}, set()),
    "batch": (EVERY - {"batch-1", "single-key", "no-padding", "norms-at-origin"}, set()),
    "tail": (EVERY - {"aligned-N"}, set()),
    "masked-rows": (set(), EVERY - NO_MASKED_ROWS),
    "mask": (EVERY - {"no-padding", "single-key", "norms-at-origin"}, set()),
    "mask-inf": ({"padding-bias-large"}, set()),
    "one-residue": ({"one-residue"}, set()),
    "frame-convention": (EVERY - {"identity-frames", "translations-only", "single-key",
                                  "norms-at-origin", "points-symmetric"}, set()),
    "inverse-frame": (EVERY - {"identity-frames", "translations-only", "v-points-at-origin",
                               "norms-at-origin", "points-symmetric"}, set()),
    "point-norms": (EVERY - {"norms-off", "norms-at-origin", "v-points-at-origin"}, set()),
    "o-pt-layout": (EVERY - {"v-points-at-origin", "norms-at-origin", "points-symmetric"},
                    set()),
    "point-norm-eps": ({"norms-at-origin", "v-points-at-origin"}, set()),
    "pair": (EVERY - {"pair-off", "norms-at-origin", "single-key"}, set()),
    "pair-values": (EVERY - {"pair-off", "pair-values-off", "norms-at-origin"}, set()),
    "pair-bias": (EVERY - {"pair-off", "pair-bias-off", "single-key", "norms-at-origin"},
                  set()),
    "heads": (EVERY - {"heads-1", "points-symmetric", "norms-at-origin"}, set()),
    "points": (EVERY - {"points-1", "norms-at-origin"}, set()),
    "point-layout": (EVERY - {"points-symmetric"}, set()),
    "point-weight": (EVERY - {"qk-points-at-origin", "single-key", "norms-at-origin"}, set()),
    "scalar-term": (EVERY - {"scalar-term-off", "single-key", "norms-at-origin"}, set()),
    "point-term": (EVERY - {"point-term-off", "qk-points-at-origin", "single-key",
                            "norms-at-origin"}, set()),
    "frame-rotation": (EVERY - {"identity-frames", "translations-only", "points-symmetric",
                                "norms-at-origin"}, set()),
    "frame-translation": (EVERY - {"identity-frames", "rotations-only", "points-symmetric",
                                   "norms-at-origin", "qk-points-at-origin",
                                   "v-points-at-origin"}, set()),  # every probe with t = 0
    "frames": (EVERY - {"identity-frames", "points-symmetric", "norms-at-origin"}, set()),
    "value-path": (EVERY, set()),
    "logits": (EVERY - {"single-key"}, set()),
    "point-dominant": ({"point-term-dominant"}, set()),
    "pair-dominant": ({"pair-dominant"}, set()),
    "single-key-only": ({"single-key"}, set()),
}


def _outcomes(failing: set[str], masked_only: set[str] = frozenset()) -> dict[str, str]:
    """Probe outcomes, and per part where the probe has masked rows."""
    outcomes = {}
    for p in NAMES:
        outcomes[p] = "fail" if p in failing | masked_only else "pass"
        outcomes[f"{p}:present"] = "fail" if p in failing else "pass"
        if p not in NO_MASKED_ROWS:
            outcomes[f"{p}:masked"] = "fail" if p in failing | masked_only else "pass"
    return outcomes


@pytest.mark.parametrize("rule", PROBES.rules, ids=lambda r: r.name)
def test_rule_is_the_prime_suspect_for_its_case(rule):
    found = verdict(_outcomes(*RULE_CASES[rule.name]), probes=PROBES)
    assert found.mismatch
    assert found.suspects[0] is rule, found.lines
    assert found.lines[0] == f"suspect: {rule.observation}: {rule.suspect}"


def test_rules_name_only_known_probes_and_parts_and_cases_cover_every_rule():
    assert set(RULE_CASES) == {r.name for r in PROBES.rules}
    assert len({r.name for r in PROBES.rules}) == len(PROBES.rules)
    assert len(NAMES) == len(PROBES.probes)
    for rule in PROBES.rules:
        for name in (*rule.fails, *rule.passes):
            probe, _, part = name.partition(":")
            assert probe in NAMES and part in ("", "present", "masked"), (rule.name, name)
        assert not set(rule.fails) & set(rule.passes), rule.name


def test_unmatched_failures_name_what_every_probe_uses():
    found = verdict(_outcomes(EVERY) | {"single-key": "skip"}, probes=PROBES)
    assert found.mismatch and not found.suspects
    assert found.lines[0].endswith(f"(no probe is clean: a part every probe uses, e.g. "
                                   f"{of_probes.EVERYWHERE})")


def test_the_problem_object_carries_the_probes_as_data():
    assert PROBLEM.probes is of_probes.PROBES and PROBLEM.rules is of_probes.RULES
    assert all(isinstance(p, Probe) for p in PROBES.probes)
    assert all(isinstance(r, Rule) for r in PROBES.rules)
    # a worker finds a probe by the name its recipe carries
    assert PROBES.key(PROBES.probes[1]) == "openfold/identity-frames"
    assert probe_named("openfold/identity-frames") is PROBES.probes[1]
    assert probe_named("identity-frames") is probe_set("simplified").probes[1]


# ---- the probes do what they say ---------------------------------------------------------------

def _apply(name: str, seed: int = 0, batch: int = 2, length: int = 9):
    """(state_dict, inputs in float64) of probe `name` on CFG, as diagnose draws them."""
    probe = probe_named(f"openfold/{name}")
    config = probe.config(CFG) if probe.config else CFG
    sd = init_state_dict(config)
    sd = probe.weights(sd) if probe.weights else sd
    inputs = make_inputs(config, batch, length, dtype=F64, seed=seed)
    inputs = probe.inputs(inputs) if probe.inputs else inputs
    return config, sd, inputs


def _run(config, sd, inputs) -> torch.Tensor:
    with torch.no_grad():
        return make_module(sd, config, "cpu", F64)(*inputs.as_tuple())


@pytest.mark.parametrize("name", sorted(NAMES))
def test_probe_inputs_stay_valid(name):
    config, _, inputs = _apply(name)
    PROBLEM.validate_inputs(config, *inputs.as_tuple())


def test_point_term_probes_switch_the_distances_off():
    """With query/key points at the origin the head weights no longer matter; with the value
    points there, X, Y, Z are 0 and the norms sqrt(eps)."""
    config, sd, inputs = _apply("qk-points-at-origin")
    other = dict(sd, head_weights=sd["head_weights"] + 3.0)
    torch.testing.assert_close(_run(config, sd, inputs), _run(config, other, inputs))

    config, sd, inputs = _apply("norms-at-origin")
    w = sd["linear_out.weight"].double()
    h, c, pv = config.no_heads, config.c_hidden, config.no_v_points
    norms = w[:, h * (c + 3 * pv):h * (c + 4 * pv)]
    expected = (norms.sum(dim=1) * math.sqrt(config.eps)).expand(2, 9, -1)
    torch.testing.assert_close(_run(config, sd, inputs), expected)


def test_pair_probes_switch_one_term_each():
    """pair-bias-off and pair-values-off together make the output independent of z; either
    alone leaves the other term reading it."""
    config, sd, inputs = _apply("pair-values-off")
    other_z = torch.randn(inputs.z.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    shifted = type(inputs)(inputs.s, other_z, *inputs.as_tuple()[2:])
    both_off = of_probes.pair_bias_off(sd)
    torch.testing.assert_close(_run(config, both_off, inputs), _run(config, both_off, shifted))
    for one_off in (sd, of_probes.pair_bias_off(init_state_dict(config))):
        assert not torch.allclose(_run(config, one_off, inputs), _run(config, one_off, shifted))


def test_padding_bias_large_leaves_the_present_rows_to_the_mask():
    """The padded keys' logits sit near +7e4 - 1e5: weight 0 at inf = 1e5, dominant at 1e4."""
    config, sd, inputs = _apply("padding-bias-large")
    present = inputs.mask != 0
    out = _run(config, sd, inputs)
    unspoiled = _apply("baseline")[2]
    base = _run(config, sd, unspoiled)
    torch.testing.assert_close(out[present], base[present], rtol=1e-12, atol=1e-12)
    small_inf = OpenFoldConfig(*config.module_args(), inf=1e4)
    assert not torch.allclose(_run(small_inf, sd, inputs)[present], out[present], atol=1e-3)


# ---- the command --------------------------------------------------------------------------------

SMALL = ["--problem", "openfold", "--node-dim", "11", "--pair-dim", "7", "--heads", "3",
         "--head-dim", "5", "--query-points", "2", "--value-points", "3", "--batch", "2",
         "--length", "21", "--aligned-length", "32", "--seeds", "1", "--device", "cpu"]


def test_cli_diagnose_openfold_reference_exits_zero(capsys):
    assert cli_main(["diagnose", "reference", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "padding-bias-large" in out and "problem openfold" in out and "no mismatch" in out


def test_cli_diagnose_openfold_json_names_the_rule(capsys):
    path = FILES / "openfold_o_pt_interleaved.py"
    assert cli_main(["diagnose", "--json", "--model-new", str(path), *SMALL]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in doc["probes"]] == list(PROBES.names)
    assert doc["config"]["c_hidden"] == 5
    assert doc["verdict"]["suspects"][0] == "o-pt-layout"


def test_cli_diagnose_openfold_usage_errors(capsys):
    assert cli_main(["diagnose", "nope", *SMALL]) == 2
    assert "unknown name 'nope' for problem 'openfold'" in capsys.readouterr().err


def test_cli_diagnose_openfold_names_a_v1_v2_key_mix(tmp_path, capsys, monkeypatch):
    """A module with OpenFold v1's name for one point projection and v2's for the other is a
    build error at every probe; the verdict says which names are v1's. (All v1 names load:
    tests/test_model_new.py.)"""
    monkeypatch.setenv("COLUMNS", "2000")
    source = (FILES / "openfold_standalone.py").read_text()
    mixed = source.replace("self.linear_q_points = PointLinear(",
                           "self.linear_q_points = nn.Linear(")
    assert mixed != source
    path = tmp_path / "mixed_names.py"
    path.write_text(mixed)
    assert cli_main(["diagnose", "--model-new", str(path), *SMALL]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "the variant raises at the baseline probe: build: ModelNewError:" in out
    assert "linear_q_points.bias, linear_q_points.weight: OpenFold v1 names" in out


# ---- the backward: --pass forward+backward ---------------------------------------------------

TRAIN = "forward+backward"
TENSORS = set(INPUT_NAMES[:4]) | set(init_state_dict(CFG))  # s, z, frames; the mask is data


def _train(variant, oracles, probes=None):
    return diagnose(variant, CFG, sizes=SIZES, cache=oracles, pass_name=TRAIN, probes=probes)


@pytest.mark.parametrize("variant_cls", [Reference, HookedOpenFoldTrainable],
                         ids=lambda c: c.name)
def test_correct_implementations_get_a_clean_bill_with_every_gradient_judged(variant_cls,
                                                                             oracles):
    diagnosis = _train(variant_cls(), oracles)
    assert [r.status for r in diagnosis.results] == ["pass"] * len(PROBES.probes)
    assert all(set(r.gradients) == TENSORS for r in diagnosis.results)
    # linear_b.bias is zero in exact arithmetic: judged, never a row's worst while it passes
    assert "linear_b.bias" not in {r.grad_worst for r in diagnosis.results}
    found = diagnosis.verdict
    assert not found.mismatch and not found.wrong_gradients
    assert found.lines == ["no mismatch: every probe agrees with the oracle within its "
                           "tolerance (the output and every gradient)"]


def test_torch_compile_gets_a_clean_bill_with_the_backward(oracles):
    """Its own rounding: at heads-1 and points-1 its linear_b.bias (zero in exact arithmetic)
    is 1.2x the tolerance `check` holds it to; diagnose reads that as rounding (a subset of
    the probes: each compiles afresh, the whole table takes minutes on a CPU)."""
    subset = [p for p in PROBES.probes if p.name in ("baseline", "heads-1", "points-1")]
    found = _train(Compiled(), oracles, subset).verdict
    assert not found.mismatch, found.lines


@pytest.mark.parametrize("variant_cls", list(PLANTED_OPENFOLD_BACKWARD_BUGS),
                         ids=lambda c: c.name)
def test_planted_backward_bug_is_named_with_its_term(variant_cls, oracles):
    tensors, term, rule = PLANTED_OPENFOLD_BACKWARD_BUGS[variant_cls]
    diagnosis = _train(variant_cls(), oracles)
    assert all(r.output_passed for r in diagnosis.results)  # the forward is exact
    found = diagnosis.verdict
    assert found.mismatch and not found.suspects, found.lines
    if tensors is not None:
        assert {w.name for w in found.wrong_gradients} == tensors, found.lines
    assert found.terms[0] == term, found.lines
    assert found.gradient_suspects[0].name == rule, found.lines
    assert found.lines[0] == "the output is right in every probe: the backward is wrong"
    assert found.lines[2].startswith(f"backward suspect: {term}: ")


def test_a_detached_gradient_is_a_missing_one_in_the_probe_row(oracles):
    (bug,) = [v for v in PLANTED_OPENFOLD_BACKWARD_BUGS if v.name.endswith("head-weights-"
                                                                          "detached")]
    baseline = _train(bug(), oracles).results[0]
    assert baseline.failing_gradients == ["head_weights"]
    assert "no gradient for head_weights" in baseline.message


def test_a_forward_bug_is_named_first_and_its_gradients_follow(oracles):
    found = _train(PairValuesTransposedTrainable(), oracles).verdict
    assert found.suspects[0].name == "pair-values", found.lines
    assert "the output is wrong too: fix the forward first, the gradients follow it" \
        in found.lines
    assert "z" in {w.name for w in found.wrong_gradients}


def test_a_forward_only_variant_is_unsupported_in_every_probe(oracles):
    diagnosis = _train(HookedOpenFoldExact(), oracles)
    assert {r.status for r in diagnosis.results} == {"unsupported"}
    assert not diagnosis.verdict.ran and diagnosis.verdict.exit_status == 1


def test_a_rounding_only_gradient_is_held_to_the_margin_everywhere():
    """linear_b.bias: no correct digit in the reference (reference rel_l2 > 1). One rule for
    check, sweep and diagnose (`judge_gradients`): wrong only past ROUNDING_ONLY_MARGIN x
    the usual tolerance; an ordinary gradient keeps 2 x the reference's error."""
    oracle = {"linear_b.bias": torch.full((4,), 1e-12), "z": torch.ones(4)}
    figures = GradientFigures(oracle, {"linear_b.bias": 1e9, "z": 1e-6})
    fp32 = get_precision("fp32")

    def judge(bias_ratio: float, z_err: float = 0.0):
        bias = oracle["linear_b.bias"] * (1 + bias_ratio * 2e9)  # rel_l2 = ratio x 2 x ref
        z = oracle["z"] * (1 + z_err)
        return judge_gradients({"linear_b.bias": bias, "z": z}, figures, fp32)

    assert judge(1.2)["linear_b.bias"].passed  # torch-compile's rounding at heads-1
    assert judge(0.9 * ROUNDING_ONLY_MARGIN)["linear_b.bias"].passed
    assert not judge(2 * ROUNDING_ONLY_MARGIN)["linear_b.bias"].passed
    assert not judge(1e7)["linear_b.bias"].passed  # the softmax without its row sum
    assert not judge(0, z_err=3e-5)["z"].passed  # an ordinary gradient: 2 x 1e-6 floor 2e-5
    assert not judge_gradients({"z": oracle["z"]}, figures, fp32)["linear_b.bias"].passed


# ---- the gradient terms and rules, as data ---------------------------------------------------

TERMS = set(PROBES.terms)
SHARED = set(PROBES.shared_terms)


def test_every_input_and_parameter_has_a_term():
    assert PROBES.gradients and PROBLEM.gradient_terms is of_probes.GRADIENT_TERMS
    assert all(isinstance(r, GradientRule) for r in PROBES.gradient_rules)
    terms = {name: PROBES.gradient_term(name) for name in TENSORS}
    assert "unknown" not in terms.values() and set(terms.values()) == TERMS
    assert terms["s"] == of_probes.SHARED_TERM and terms["z"] == of_probes.PAIR_Z
    assert terms["linear_b.weight"] == "pair bias"
    assert terms["linear_b.bias"] == of_probes.ROW_SUMS  # zero in exact arithmetic
    assert terms["linear_kv_points.linear.weight"] == of_probes.KV_POINTS
    assert terms["linear_out.bias"] == "value aggregation"
    # every key of the table names an input, a parameter or a module of one
    modules = {n.split(".")[0] for n in TENSORS}
    assert set(of_probes.GRADIENT_TERMS) <= TENSORS | modules


ONLY_Z = ["z"]
KV_POINTS_AND_FRAMES = ["s", "translations", "rotations", "linear_kv_points.linear.weight"]
ALL_BUT_VALUE = sorted(TENSORS - {"linear_out.weight", "linear_out.bias"})


def _everywhere(failing: list[str], clean: set[str] = frozenset()) -> dict[str, list[str]]:
    return {p: [] if p in clean else list(failing) for p in NAMES}


# For each gradient rule: the failing gradients per probe of a backward bug of that kind
# (several are the planted bugs' measured tables, above).
GRADIENT_RULE_CASES: dict[str, dict[str, list[str]]] = {
    "pair-bias-weight-grad": _everywhere(["linear_b.weight"], {"pair-off"}),
    "pair-bias-z-grad": _everywhere(ONLY_Z, {"pair-bias-off", "single-key"}),
    "pair-values-grad": _everywhere(ONLY_Z, {"pair-values-off"}),
    "pair-bias-grad": _everywhere(["z", "linear_b.weight"]),
    "pair-bias-only-grad": _everywhere(["linear_b.weight"]),
    "pair-z-grad": _everywhere(ONLY_Z),
    "point-weight-grad": _everywhere(["head_weights"], {"qk-points-at-origin"}),
    "point-distance-grad": _everywhere(["head_weights"]),
    "key-points-grad": _everywhere(KV_POINTS_AND_FRAMES, {"qk-points-at-origin",
                                                          "point-term-off"}),
    "value-points-grad": _everywhere(KV_POINTS_AND_FRAMES, {"norms-at-origin"}),
    "query-points-grad": _everywhere(["s", "translations", "linear_q_points.linear.weight"]),
    "kv-points-grad": _everywhere(["linear_kv_points.linear.bias"]),
    "k-grad": _everywhere(["linear_kv.weight", "s"], {"scalar-term-off"}),
    "v-grad": _everywhere(["linear_kv.weight", "s"]),
    "scalar-dot-grad": _everywhere(["linear_q.weight"]),
    "qk-grad": _everywhere(["linear_q.weight", "linear_kv.weight"], {"single-key"}),
    "kv-grad": _everywhere(["linear_kv.weight"], {"single-key"}),
    "frame-grad": _everywhere(["translations", "rotations"]),
    "value-aggregation-grad": _everywhere(["linear_out.weight", "linear_kv.weight",
                                           "translations", "s"]),
    "softmax-grad": _everywhere(ALL_BUT_VALUE, {"norms-at-origin"}),
    "row-sums-grad": _everywhere(["linear_b.bias"], {"single-key"}),
    "shared-grad": _everywhere(["s"]),
    "logits-grad": _everywhere(["linear_q.weight", "head_weights"], {"single-key"}),
}


@pytest.mark.parametrize("rule", PROBES.gradient_rules, ids=lambda r: r.name)
def test_gradient_rule_is_the_prime_backward_suspect_for_its_case(rule):
    outcomes = _outcomes(set())
    found = verdict(outcomes, gradient_failures=GRADIENT_RULE_CASES[rule.name], probes=PROBES)
    assert found.mismatch and not found.suspects
    assert found.gradient_suspects[0] is rule, found.lines
    assert found.terms[0] == rule.term
    assert f"backward suspect: {rule.term}: {rule.sentence()}" in found.lines


def test_gradient_rules_name_known_terms_and_probes_and_cases_cover_every_rule():
    rules = PROBES.gradient_rules
    assert set(GRADIENT_RULE_CASES) == {r.name for r in rules}
    assert len({r.name for r in rules}) == len(rules)
    assert set(of_probes.LOGIT_TERMS) <= TERMS and SHARED <= TERMS
    for rule in rules:
        right = rule.right_terms(PROBES.terms, PROBES.shared_terms)
        assert set(rule.wrong) | set(right) <= TERMS, rule.name
        assert not set(rule.wrong) & set(right), rule.name
        assert set(rule.fails) | set(rule.passes) <= NAMES, rule.name


def test_right_none_is_every_other_term_of_the_problem_but_the_shared_ones():
    rule = next(r for r in PROBES.gradient_rules if r.name == "frame-grad")
    assert rule.right is None
    assert set(rule.right_terms(PROBES.terms, PROBES.shared_terms)) == TERMS - SHARED - {"frame"}
    # the wrong list puts the shared terms (s, the rounding-only linear_b.bias) last
    failing = _everywhere(["s", "linear_b.bias", "translations"])
    found = verdict(_outcomes(set()), gradient_failures=failing, probes=PROBES)
    assert [w.name for w in found.wrong_gradients] == ["translations", "linear_b.bias", "s"]
    assert found.gradient_suspects[0] is rule


def test_cli_diagnose_openfold_training(capsys):
    assert cli_main(["diagnose", "reference", "--json", "--pass", TRAIN, *SMALL]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["pass"] == TRAIN and not doc["verdict"]["mismatch"]
    assert set(doc["probes"][0]["gradients"]) == TENSORS
