"""`ipa-bench diagnose`: each planted bug gets the right suspect, the reference a clean bill,
and every verdict rule has a case that makes it the prime suspect."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.cli import main as cli_main
from harness.diagnose import diagnose
from harness.probes import PROBE_NAMES, PROBES, RULES, Sizes, verdict
from tests.planted import PLANTED_BUGS, HookedExact, HookedReference, planted_variant
from variants.problem import IPAConfig, make_inputs
from variants.reference import Reference, init_state_dict, make_module

FILES = Path(__file__).parent / "model_new_files"
# Smaller than the command's defaults (97 and 128) to keep the suite quick; still ragged for
# every block size up to 32 and aligned for 64.
SIZES = Sizes(batch=2, length=45, aligned_length=64)


pytestmark = pytest.mark.usefixtures("one_thread")




# ---- end to end on planted bugs ---------------------------------------------------------------

@pytest.mark.parametrize("variant_cls", [Reference, HookedExact], ids=lambda c: c.name)
def test_correct_implementations_get_a_clean_bill(variant_cls, oracles):
    diagnosis = diagnose(variant_cls(), sizes=SIZES, cache=oracles)
    assert [r.status for r in diagnosis.results] == ["pass"] * len(PROBES)
    assert not diagnosis.verdict.mismatch
    assert diagnosis.verdict.lines[0].startswith("no mismatch")


def test_hooked_reference_is_the_reference_bit_for_bit():
    config = IPAConfig(node_dim=32, pair_dim=8, heads=4, query_points=2, value_points=3)
    state_dict = init_state_dict(config)
    inputs = make_inputs(config, 2, 11, seed=5).as_tuple()
    hooked = HookedReference(*config.module_args())
    hooked.load_state_dict(state_dict)
    with torch.no_grad():
        assert torch.equal(hooked(*inputs), make_module(state_dict, config, "cpu",
                                                        torch.float32)(*inputs))


@pytest.mark.parametrize("variant_cls", list(PLANTED_BUGS), ids=lambda c: c.name)
def test_planted_bug_is_named(variant_cls, oracles):
    diagnosis = diagnose(variant_cls(), sizes=SIZES, cache=oracles)
    found = diagnosis.verdict
    assert found.mismatch
    assert found.suspects, found.lines
    assert found.suspects[0].name == PLANTED_BUGS[variant_cls], found.lines
    assert found.lines[0].startswith("suspect: ")


class ReadsRotationsAsContiguous(HookedReference):
    """Bug: the rotations' buffer is read with contiguous strides whatever its layout."""

    def forward(self, node_repr, pair_repr, translations, rotations):
        flat = torch.as_strided(rotations, rotations.shape,
                                torch.empty(rotations.shape).stride())
        return super().forward(node_repr, pair_repr, translations, flat)


class RaisesOnNonContiguous(HookedReference):
    """Not a wrong answer but a refusal: a launcher that demands contiguous inputs."""

    def forward(self, node_repr, pair_repr, translations, rotations):
        if not pair_repr.is_contiguous():
            raise ValueError("pair_repr: expected a contiguous tensor")
        return super().forward(node_repr, pair_repr, translations, rotations)


@pytest.mark.parametrize("module_cls", [ReadsRotationsAsContiguous, RaisesOnNonContiguous])
def test_contiguity_assumption_is_named(module_cls, oracles):
    variant = planted_variant(module_cls, "contiguity")()
    diagnosis = diagnose(variant, sizes=SIZES, cache=oracles)
    assert diagnosis.verdict.suspects[0].name == "non-contiguous"
    failed = [r.probe.name for r in diagnosis.results if r.status != "pass"]
    assert failed == ["non-contiguous"]


def test_a_variant_that_cannot_build_is_an_error_in_every_probe(oracles):
    class Broken(Reference):
        name = "broken"

        def build(self, *args):
            raise RuntimeError("Error building extension 'ipa': nvcc fatal")

    diagnosis = diagnose(Broken(), sizes=SIZES, cache=oracles)
    assert {r.status for r in diagnosis.results} == {"error"}
    assert "nvcc fatal" in diagnosis.results[0].message
    assert diagnosis.verdict.mismatch and not diagnosis.verdict.suspects
    assert diagnosis.verdict.lines == [
        "the variant raises at the baseline probe: build: RuntimeError: Error building "
        "extension 'ipa': nvcc fatal"]


def test_unsupported_probes_are_shown_not_judged(oracles):
    class NoSingleHead(Reference):
        name = "no-single-head"
        limits = {"heads": (2, 64)}

    diagnosis = diagnose(NoSingleHead(), sizes=SIZES, cache=oracles)
    by_name = {r.probe.name: r for r in diagnosis.results}
    assert by_name["heads-1"].status == "unsupported"
    assert "heads=1 outside" in by_name["heads-1"].message
    assert not diagnosis.verdict.mismatch


def test_a_variant_that_cannot_run_here_is_not_a_clean_bill(oracles):
    class CudaOnly(Reference):
        name = "cuda-only"
        devices = ("cuda",)

    diagnosis = diagnose(CudaOnly(), sizes=SIZES, cache=oracles)
    assert {r.status for r in diagnosis.results} == {"unsupported"}
    found = diagnosis.verdict
    assert not found.mismatch and not found.ran and found.exit_status == 1
    assert found.lines == ["nothing checked: the variant cannot run the baseline probe here: "
                           "device 'cpu' not supported (supports ['cuda'])"]


# ---- the rules, one case each ---------------------------------------------------------------

# For each rule: the probes that fail in a bug of that kind (the others pass). Several come
# from the planted bugs' measured tables; the rest are what such a bug does to each probe.
EVERY = set(PROBE_NAMES)
RULE_CASES: dict[str, set[str]] = {
    "non-contiguous": {"non-contiguous"},
    "batch": EVERY - {"batch-1", "identity-frames", "single-key"},
    "tail": EVERY - {"aligned-N"},
    "heads": EVERY - {"heads-1"},
    "points": EVERY - {"points-1"},
    "point-weight": EVERY - {"qk-points-at-origin", "single-key"},
    "pair-bias": EVERY - {"pair-off", "single-key"},
    "scalar-term": EVERY - {"scalar-term-off", "single-key"},
    "point-term": EVERY - {"point-term-off", "qk-points-at-origin", "single-key"},
    "inverse-frame": EVERY - {"identity-frames", "translations-only", "v-points-at-origin"},
    "frame-rotation": EVERY - {"identity-frames", "translations-only"},
    "frame-translation": EVERY - {"identity-frames", "rotations-only"},
    "frames": EVERY - {"identity-frames"},
    "value-path": EVERY,
    "logits": EVERY - {"single-key"},
    "point-dominant": {"point-term-dominant"},
    "pair-dominant": {"pair-dominant"},
    "single-key-only": {"single-key"},
}


def _outcomes(failing: set[str]) -> dict[str, str]:
    return {p: "fail" if p in failing else "pass" for p in PROBE_NAMES}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rule_is_the_prime_suspect_for_its_case(rule):
    found = verdict(_outcomes(RULE_CASES[rule.name]))
    assert found.mismatch
    assert found.suspects[0] is rule, found.lines
    assert found.lines[0] == f"suspect: {rule.observation}: {rule.suspect}"


def test_rules_name_only_known_probes_and_cases_cover_every_rule():
    assert set(RULE_CASES) == {r.name for r in RULES}
    assert len({r.name for r in RULES}) == len(RULES)
    for rule in RULES:
        assert set(rule.fails) | set(rule.passes) <= EVERY, rule.name
        assert not set(rule.fails) & set(rule.passes), rule.name


def test_clean_outcomes_are_no_mismatch_and_unmatched_failures_are_listed():
    assert not verdict(_outcomes(set())).mismatch
    # Every probe that ran failed, and the aligned-N probe could not run: no rule matches.
    outcomes = _outcomes(EVERY) | {"aligned-N": "skip"}
    found = verdict(outcomes)
    assert found.mismatch and not found.suspects
    assert found.lines[0].startswith("mismatch in baseline, identity-frames, ")
    assert "no rule isolates it (no probe is clean" in found.lines[0]


def test_a_probe_that_did_not_run_satisfies_no_rule():
    outcomes = _outcomes(RULE_CASES["batch"]) | {"batch-1": "skip"}
    assert "batch" not in {r.name for r in verdict(outcomes).suspects}


# ---- the command --------------------------------------------------------------------------------

SMALL_SIZES = ["--batch", "2", "--length", "37", "--aligned-length", "64", "--seeds", "1",
               "--device", "cpu"]


def test_cli_diagnose_reference_exits_zero(capsys):
    assert cli_main(["diagnose", "reference", *SMALL_SIZES]) == 0
    out = capsys.readouterr().out
    assert "non-contiguous" in out and "no mismatch" in out


def test_cli_diagnose_model_new_file_names_the_inverse_frame(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    source = (FILES / "ipa_standalone.py").read_text()
    buggy = source.replace("(o_p - t) @ rotations.transpose(-1, -2)", "(o_p - t) @ rotations")
    assert buggy != source
    path = tmp_path / "my_kernel.py"
    path.write_text(buggy)
    assert cli_main(["diagnose", "--model-new", str(path), *SMALL_SIZES]) == 1
    out = capsys.readouterr().out
    assert "diagnose model-new:my_kernel.py" in out
    assert "suspect: error needs rotations and vanishes when the inverse frame gets only zeros" \
        in out


def test_cli_diagnose_correct_model_new_file_exits_zero(capsys):
    path = FILES / "ipa_standalone.py"
    assert cli_main(["diagnose", "--model-new", str(path), *SMALL_SIZES]) == 0
    assert "no mismatch" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["diagnose"], ["diagnose", "reference", "--model-new", "x.py"]])
def test_cli_diagnose_needs_exactly_one_subject(argv, capsys):
    assert cli_main(argv) == 2
    assert "VARIANT, --model-new: expected exactly one of them" in capsys.readouterr().err


def test_cli_diagnose_unknown_variant_is_a_usage_error(capsys):
    assert cli_main(["diagnose", "nope"]) == 2
    assert "unknown name 'nope'" in capsys.readouterr().err
