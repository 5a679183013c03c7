"""The `--json` documents of `list`, `check` and `diagnose` keep the schemas of docs/cli-json.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.cli import main as cli_main
from harness.probes import PROBE_NAMES, RULES
from harness.version import __version__
from variants.registry import all_variants

DOC = (Path(__file__).resolve().parents[1] / "docs" / "cli-json.md").read_text()
TINY = ["--device", "cpu", "--node-dim", "32", "--pair-dim", "8", "--heads", "4"]


def _json(capsys, argv: list[str]) -> tuple[int, dict]:
    code = cli_main(argv)
    captured = capsys.readouterr()
    return code, json.loads(captured.out)


def _documented_keys(schema: str) -> set[str]:
    """Every key the doc's table for `schema` names (`results[].rel_l2` -> rel_l2)."""
    section = DOC.split(f"(`{schema}`)")[1].split("\n## ")[0]
    return {name.split(".")[-1].split("[]")[-1] for name in re.findall(r"`([\w.\[\]]+)`", section)}


def _check_header(doc: dict, schema: str) -> None:
    assert doc["schema"] == schema and doc["ipa_bench_version"] == __version__


def test_list_json(capsys):
    code, doc = _json(capsys, ["list", "--json", *TINY])
    assert code == 0
    _check_header(doc, "ipa-bench.list/1")
    assert [v["name"] for v in doc["variants"]] == list(all_variants())
    keys = {"name", "description", "is_baseline", "devices", "precisions", "requires",
            "supports_backward", "problems", "runnable", "reasons"}
    for entry in doc["variants"]:
        assert set(entry) == keys
        assert entry["runnable"] == (entry["reasons"] == [])
    assert set(doc) - {"schema", "ipa_bench_version"} | keys <= _documented_keys(
        "ipa-bench.list/1")
    cuda = {v["name"]: v for v in doc["variants"]}["cuda-fused"]
    assert not cuda["runnable"] and any("device 'cpu'" in r for r in cuda["reasons"])


def test_check_json_pass_and_unsupported(capsys):
    code, doc = _json(capsys, ["check", "--json", "--variant", "reference", "--dtype", "fp32",
                               "--dtype", "tf32", "--length", "9", "--seeds", "2", *TINY])
    assert code == 1 and doc["passed"] is False  # tf32 on CPU, asked for by name
    _check_header(doc, "ipa-bench.check/1")
    passed, skipped = doc["results"]
    assert passed["status"] == "pass" and passed["failures"] == [] and passed["seeds"] == 2
    assert 0 < passed["rel_l2"] <= passed["tol"] and passed["err_ratio"] == 1.0
    assert skipped["status"] == "unsupported" and skipped["rel_l2"] is None
    assert skipped["unsupported_reasons"] == ["tf32 is a CUDA math mode"]
    documented = _documented_keys("ipa-bench.check/1")
    assert set(passed) <= documented and set(doc) - {"schema", "ipa_bench_version"} <= documented


def test_check_json_nan_output_is_null_and_a_failure(capsys, tmp_path):
    path = tmp_path / "nan_model.py"
    path.write_text(
        "import torch\nfrom variants.reference import IPAReference\n\n"
        "class ModelNew(IPAReference):\n"
        "    def forward(self, *args):\n"
        "        return super().forward(*args) * float('nan')\n")
    code, doc = _json(capsys, ["check", "--json", "--model-new", str(path), "--length", "5",
                               "--seeds", "1", *TINY])
    (result,) = doc["results"]
    assert code == 1 and result["status"] == "fail" and result["rel_l2"] is None
    assert any("NaN/Inf" in f for f in result["failures"])


def test_diagnose_json(capsys):
    code, doc = _json(capsys, ["diagnose", "reference", "--json", "--batch", "2", "--length",
                               "13", "--aligned-length", "16", "--seeds", "1", *TINY])
    assert code == 0
    _check_header(doc, "ipa-bench.diagnose/1")
    assert [p["name"] for p in doc["probes"]] == list(PROBE_NAMES)
    assert {p["status"] for p in doc["probes"]} == {"pass"}
    assert doc["verdict"] == {"mismatch": False, "ran": True, "suspects": [],
                              "lines": doc["verdict"]["lines"], "wrong_gradients": [],
                              "gradient_suspects": [], "terms": []}
    assert doc["sizes"] == {"batch": 2, "length": 13, "aligned_length": 16}
    documented = _documented_keys("ipa-bench.diagnose/1")
    assert set(doc["probes"][0]) <= documented and set(doc["verdict"]) <= documented
    assert set(doc) - {"schema", "ipa_bench_version", "verdict"} <= documented
    assert doc["pass"] == "forward" and doc["probes"][0]["gradients"] == {}


def test_diagnose_json_forward_backward_names_the_gradient_and_its_term(capsys, tmp_path):
    path = tmp_path / "pair_grad_bug.py"
    path.write_text("from tests.fake_variants import PairWeightGradientModule as ModelNew"
                    "  # noqa: F401\n")
    code, doc = _json(capsys, ["diagnose", "--json", "--model-new", str(path), "--batch", "2",
                               "--length", "13", "--aligned-length", "16", "--seeds", "1",
                               "--pass", "forward+backward", *TINY])
    assert code == 1 and doc["pass"] == "forward+backward"
    found = doc["verdict"]
    assert found["mismatch"] and found["suspects"] == []
    assert found["wrong_gradients"][0]["name"] == "pair_bias.weight"
    assert "pair-off" not in found["wrong_gradients"][0]["probes"]
    assert found["terms"][0] == "pair bias"
    assert found["gradient_suspects"][0] == "pair-bias-weight-grad"
    documented = _documented_keys("ipa-bench.diagnose/1")
    for probe in doc["probes"]:
        assert set(probe) <= documented
    assert set(found) | set(found["wrong_gradients"][0]) <= documented
    assert set(doc["probes"][0]["gradients"]["head_weights"]) <= documented


def test_diagnose_json_names_the_suspect_rule(capsys, tmp_path):
    path = tmp_path / "inverse_frame_bug.py"
    path.write_text("from tests.planted import InverseFrameWithR as ModelNew  # noqa: F401\n")
    code, doc = _json(capsys, ["diagnose", "--json", "--model-new", str(path), "--batch", "2",
                               "--length", "13", "--aligned-length", "16", "--seeds", "1",
                               *TINY])
    assert code == 1 and doc["verdict"]["mismatch"]
    assert doc["verdict"]["suspects"][0] == "inverse-frame"
    assert {rule.name for rule in RULES} >= set(doc["verdict"]["suspects"])
