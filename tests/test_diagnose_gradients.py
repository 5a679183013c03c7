"""`ipa-bench diagnose --pass forward+backward` (issue #16): every probe a training step, and
the verdict names the wrong gradient and its term. Planted backward bugs (the forward exact,
one wrong gradient inside the backward) must each be named with the right tensor and term;
the reference must come out clean; every gradient rule has a case that makes it prime."""

from __future__ import annotations

import json

import pytest
import torch

from harness.cli import main as cli_main
from harness.diagnose import diagnose
from harness.probes import (
    GRADIENT_RULES,
    GRADIENT_TERMS,
    LOGIT_TERMS,
    PROBE_NAMES,
    PROBES,
    SHARED_TERM,
    SIMPLIFIED_PROBES,
    TERMS,
    Sizes,
    gradient_term,
    verdict,
)
from harness.runner import INPUT_NAMES
from tests.fake_variants import (
    DetachedPairGradient,
    WrongHeadWeightGradient,
    WrongPairGradient,
    WrongPairWeightGradient,
    WrongSoftmaxGradient,
    WrongTranslationGradient,
    WrongValueGradient,
    _ModuleBackwardBug,
)
from tests.planted import HookedExact, PairBiasTransposed
from variants.problem import IPAConfig
from variants.reference import Reference, init_state_dict

TRAIN = "forward+backward"
SMALL = IPAConfig(node_dim=32, pair_dim=8, heads=4, query_points=2, value_points=3)
SIZES = Sizes(batch=2, length=13, aligned_length=16)
TENSORS = set(INPUT_NAMES) | set(init_state_dict(SMALL))
SHARED = {"node_repr", "layer_norm.weight", "layer_norm.bias"}
VALUE = {"v_proj.weight", "v_pts.weight", "out_proj.weight", "out_proj.bias"}


pytestmark = pytest.mark.usefixtures("one_thread")




def _diagnose(variant, oracles):
    return diagnose(variant, SMALL, sizes=SIZES, cache=oracles, pass_name=TRAIN)


def test_the_reference_is_clean_with_every_gradient_judged(oracles):
    diagnosis = _diagnose(Reference(), oracles)
    assert [r.status for r in diagnosis.results] == ["pass"] * len(PROBES)
    assert all(set(r.gradients) == TENSORS for r in diagnosis.results)
    found = diagnosis.verdict
    assert not found.mismatch and found.exit_status == 0
    assert not found.wrong_gradients and not found.gradient_suspects
    assert found.lines == ["no mismatch: every probe agrees with the oracle within its "
                           "tolerance (the output and every gradient)"]


# variant -> (the gradients that must be named, the term named first, the prime rule)
BACKWARD_BUGS = {
    WrongTranslationGradient: ({"translations"}, "frame", "frame-grad"),
    DetachedPairGradient: ({"pair_repr"}, "pair bias", "pair-bias-grad"),
    WrongPairGradient: ({"pair_repr"}, "pair bias", "pair-bias-grad"),
    WrongPairWeightGradient: ({"pair_bias.weight"}, "pair bias", "pair-bias-weight-grad"),
    WrongHeadWeightGradient: ({"head_weights"}, "point distance", "point-weight-grad"),
    WrongValueGradient: ({"v_proj.weight"} | SHARED, "value aggregation",
                         "value-aggregation-grad"),
    WrongSoftmaxGradient: (TENSORS - VALUE - {"v_pts.weight"}, "attention weights (softmax)",
                           "softmax-grad"),
}


@pytest.mark.parametrize("variant_cls", list(BACKWARD_BUGS), ids=lambda c: c.name)
def test_planted_backward_bug_is_named_with_its_tensor_and_term(variant_cls, oracles):
    tensors, term, rule = BACKWARD_BUGS[variant_cls]
    diagnosis = _diagnose(variant_cls(), oracles)
    assert all(r.output_passed for r in diagnosis.results)  # the forward is exact
    found = diagnosis.verdict
    assert found.mismatch and found.exit_status == 1
    assert not found.suspects, found.lines  # no forward rule: the output is right
    assert {w.name for w in found.wrong_gradients} == tensors
    assert found.terms[0] == term
    assert found.gradient_suspects[0].name == rule, found.lines
    assert found.lines[0] == "the output is right in every probe: the backward is wrong"
    assert found.lines[2].startswith(f"backward suspect: {term}: ")
    for name in tensors - SHARED:
        assert f"{name} ({gradient_term(name)}; " in found.lines[1]


def test_a_wrong_pair_weight_gradient_is_right_where_pair_repr_is_zero(oracles):
    """The issue's example: wrong everywhere but pair-off implicates the bias path."""
    (wrong,) = _diagnose(WrongPairWeightGradient(), oracles).verdict.wrong_gradients
    assert wrong.name == "pair_bias.weight" and "pair-off" not in wrong.probes
    assert "baseline" in wrong.probes


def test_a_missing_gradient_says_so_in_the_probe_row(oracles):
    baseline = _diagnose(DetachedPairGradient(), oracles).results[0]
    assert baseline.status == "FAIL" and baseline.failing_gradients == ["pair_repr"]
    assert "no gradient for pair_repr" in baseline.message


class PairTransposedTrainable(_ModuleBackwardBug):
    name = "pair-transposed-trainable"
    module_cls = PairBiasTransposed


def test_a_forward_bug_is_named_first_and_its_gradients_follow(oracles):
    found = _diagnose(PairTransposedTrainable(), oracles).verdict
    assert found.suspects[0].name == "pair-bias"
    assert found.lines[0].startswith("suspect: error vanishes with pair_repr = 0")
    assert "the output is wrong too: fix the forward first, the gradients follow it" \
        in found.lines
    assert found.wrong_gradients


def test_a_forward_only_variant_is_unsupported_in_every_probe(oracles):
    diagnosis = _diagnose(HookedExact(), oracles)  # a module without supports_backward
    assert {r.status for r in diagnosis.results} == {"unsupported"}
    assert {r.message for r in diagnosis.results} == {"forward only: the variant has no backward"}
    found = diagnosis.verdict
    assert not found.ran and found.exit_status == 1
    assert found.lines == ["nothing checked: the variant cannot run the baseline probe here: "
                           "forward only: the variant has no backward"]


class _RaisingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward kernel: illegal memory access (planted)")


class RaisingBackward(Reference):
    name = "raising-backward"
    is_baseline = False

    def build(self, *args):
        fn = super().build(*args)

        def forward(node_repr, pair_repr, translations, rotations):
            return fn(_RaisingBackward.apply(node_repr), pair_repr, translations, rotations)

        forward.module = fn.module
        return forward


def test_a_backward_that_raises_is_an_error_row(oracles):
    diagnosis = _diagnose(RaisingBackward(), oracles)
    baseline = diagnosis.results[0]
    assert baseline.status == "error"
    assert baseline.message.startswith("training step: RuntimeError: backward kernel")
    assert diagnosis.verdict.lines[0].startswith("the variant raises at the baseline probe: "
                                                 "training step: ")


# ---- the table and the rules ------------------------------------------------------------------

def test_every_input_and_parameter_has_a_term():
    assert {gradient_term(name) for name in TENSORS} <= set(GRADIENT_TERMS.values())
    assert "unknown" not in {gradient_term(name) for name in TENSORS}
    assert gradient_term("out_proj.bias") == "value aggregation"
    assert gradient_term("something_else") == "unknown"


EVERY = set(PROBE_NAMES)
# For each gradient rule: the failing gradients per probe of a backward bug of that kind.
ONLY = {"pair bias": ["pair_repr"], "point distance": ["head_weights"],
        "scalar dot": ["q_proj.weight"], "frame": ["translations"]}
GRADIENT_RULE_CASES: dict[str, dict[str, list[str]]] = {
    "pair-bias-weight-grad": {p: [] if p == "pair-off" else ["pair_bias.weight"] for p in EVERY},
    "pair-bias-grad": {p: ONLY["pair bias"] for p in EVERY},
    "point-weight-grad": {p: [] if p == "qk-points-at-origin" else ["head_weights"]
                          for p in EVERY},
    "point-distance-grad": {p: ONLY["point distance"] for p in EVERY},
    "scalar-dot-grad": {p: ONLY["scalar dot"] for p in EVERY},
    "frame-grad": {p: ONLY["frame"] for p in EVERY},
    "value-aggregation-grad": {p: ["v_pts.weight", "rotations", "node_repr"] for p in EVERY},
    "softmax-grad": {p: ["pair_repr", "q_proj.weight", "head_weights", "rotations"]
                     for p in EVERY},
    "shared-grad": {p: ["layer_norm.weight"] for p in EVERY},
    "logits-grad": {p: [] if p == "single-key" else ["pair_repr", "q_proj.weight"]
                    for p in EVERY},
}


@pytest.mark.parametrize("rule", GRADIENT_RULES, ids=lambda r: r.name)
def test_gradient_rule_is_the_prime_backward_suspect_for_its_case(rule):
    outcomes = dict.fromkeys(PROBE_NAMES, "pass")
    found = verdict(outcomes, gradient_failures=GRADIENT_RULE_CASES[rule.name])
    assert found.mismatch and not found.suspects
    assert found.gradient_suspects[0] is rule, found.lines
    assert found.terms[0] == rule.term
    assert f"backward suspect: {rule.term}: {rule.sentence()}" in found.lines


def test_gradient_rules_name_known_terms_and_probes_and_cases_cover_every_rule():
    assert set(GRADIENT_RULE_CASES) == {r.name for r in GRADIENT_RULES}
    assert len({r.name for r in GRADIENT_RULES}) == len(GRADIENT_RULES)
    terms = set(GRADIENT_TERMS.values())
    assert set(LOGIT_TERMS) <= terms and SHARED_TERM in terms
    for rule in GRADIENT_RULES:
        assert set(rule.wrong) | set(rule.right_terms()) <= terms, rule.name
        assert not set(rule.wrong) & set(rule.right_terms()), rule.name
        assert set(rule.fails) | set(rule.passes) <= EVERY, rule.name


def test_right_none_is_every_other_term_but_the_shared_one():
    """A rule's 'only these are wrong' reads the problem's own terms (here the simplified
    problem's, `SIMPLIFIED_PROBES`), not a list written into the rule."""
    assert SIMPLIFIED_PROBES.gradient_rules is GRADIENT_RULES
    assert SIMPLIFIED_PROBES.terms == TERMS and SIMPLIFIED_PROBES.shared_terms == (SHARED_TERM,)
    pair = next(r for r in GRADIENT_RULES if r.name == "pair-bias-grad")
    assert pair.right is None
    assert set(pair.right_terms()) == set(TERMS) - {"pair bias", SHARED_TERM}
    shared = next(r for r in GRADIENT_RULES if r.name == "shared-grad")
    assert set(shared.right_terms()) == set(TERMS) - {SHARED_TERM}


def test_unmatched_wrong_gradients_are_listed_by_term():
    failing = {p: ["out_proj.weight", "q_proj.weight"] for p in EVERY}  # no rule: two paths
    found = verdict(dict.fromkeys(PROBE_NAMES, "pass"), gradient_failures=failing)
    assert not found.gradient_suspects
    assert found.lines[-1] == ("backward: wrong gradients in value aggregation, scalar dot; "
                               "no rule isolates them")


# ---- the command --------------------------------------------------------------------------------

SMALL_ARGS = ["--batch", "2", "--length", "13", "--aligned-length", "16", "--seeds", "1",
              "--device", "cpu", "--node-dim", "32", "--pair-dim", "8", "--heads", "4",
              "--query-points", "2", "--value-points", "3", "--pass", TRAIN]


def test_cli_diagnose_training_reference_exits_zero(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert cli_main(["diagnose", "reference", *SMALL_ARGS]) == 0
    out = capsys.readouterr().out
    assert "(forward+backward)" in out and "worst gradient" in out
    assert "no mismatch" in out and "(the output and every gradient)" in out


def test_cli_diagnose_training_names_the_gradient_of_a_model_new_file(tmp_path, capsys):
    path = tmp_path / "head_weight_grad.py"
    path.write_text("from tests.fake_variants import HeadWeightGradientModule as ModelNew"
                    "  # noqa: F401\n")
    assert cli_main(["diagnose", "--model-new", str(path), "--json", *SMALL_ARGS]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["pass"] == TRAIN
    found = doc["verdict"]
    assert [w["name"] for w in found["wrong_gradients"]] == ["head_weights"]
    assert found["wrong_gradients"][0]["term"] == "point distance"
    assert found["terms"][0] == "point distance"
    assert found["gradient_suspects"][0] == "point-weight-grad"
    assert found["suspects"] == []
    baseline = doc["probes"][0]
    assert baseline["status"] == "fail" and baseline["output_status"] == "pass"
    assert baseline["failing_gradients"] == ["head_weights"]
    assert baseline["grad_worst"] == "head_weights"


def test_cli_diagnose_training_of_a_forward_only_variant(capsys):
    assert cli_main(["diagnose", "cuda-fused", *SMALL_ARGS]) == 1
    out = capsys.readouterr().out
    assert "nothing checked: the variant cannot run the baseline probe here: forward only: " \
        "the variant has no backward" in out
