"""The static scan of untrusted variant code (harness/scan.py): each rule on a planted
snippet, honest files clean, and the findings carried by rows and by `check`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from harness.cli import main as cli_main
from harness.grid import grid_from_dict
from harness.model_new import model_new_variant
from harness.scan import RULES, row_flags, scan_file, scan_source, scan_variant
from harness.sweep import Sweep
from variants.registry import all_variants, get_variant

FILES = Path(__file__).parent / "model_new_files"

PLANTED = {
    "streams": "side = torch.cuda.Stream()\nwith torch.cuda.stream(side):\n    pass\n",
    "concurrency": "import threading\n",
    "introspection": "import sys\nframe = sys._getframe(1)\ncaller = frame.f_back\n",
    "patching": "import torch\ntorch.softmax = slow_softmax\n",
    "address-keyed": "key = tuple(t.data_ptr() for t in inputs)\n",
    "process-exit": "import os\nos._exit(0)\n",
    "low-precision": "out = x.half() @ w.half()\n",
}


def test_every_rule_has_a_planted_case():
    assert set(PLANTED) == set(RULES)


@pytest.mark.parametrize("rule", list(PLANTED))
def test_each_rule_finds_its_pattern(rule):
    found = scan_source(PLANTED[rule], "planted.py")
    assert rule in {f.rule for f in found}
    assert all(f.path == "planted.py" and f.line >= 1 and f.code for f in found)


def test_comments_and_strings_do_not_match():
    text = '"""This module never calls sys._getframe or os._exit."""\n# data_ptr, threading\n'
    assert scan_source(text) == []


@pytest.mark.parametrize("path", sorted(FILES.glob("*.py")), ids=lambda p: p.name)
def test_the_honest_example_files_are_clean(path):
    assert scan_file(path) == []


def test_built_in_variants_are_not_scanned():
    assert all(scan_variant(v) == [] for v in all_variants().values())


def test_low_precision_is_flagged_on_full_precision_rows_only():
    found = scan_source(PLANTED["low-precision"] + PLANTED["process-exit"])
    assert row_flags(found, "fp32") == ["scan:low-precision", "scan:process-exit"]
    assert row_flags(found, "bf16") == ["scan:process-exit"]


MEMOISING = '''
from variants.reference import IPAReference


class ModelNew(IPAReference):
    """Right once, then the output cached by the inputs' addresses."""

    def forward(self, *inputs):
        key = tuple(t.data_ptr() for t in inputs)
        cache = self.__dict__.setdefault("_cache", {})
        if key not in cache:
            cache[key] = super().forward(*inputs)
        return cache[key]
'''


def test_rows_and_check_carry_the_findings(tmp_path, capsys):
    path = tmp_path / "memo.py"
    path.write_text(MEMOISING)
    variant = model_new_variant(path)
    grid = grid_from_dict({"base": {"node_dim": 32, "pair_dim": 8, "heads": 2,
                                    "query_points": 2, "value_points": 2, "dtypes": ["fp32"],
                                    "modes": ["eager"], "seeds": 1, "budget_s": 0.01},
                           "slice": [{"length": [48]}]})
    out = Sweep([get_variant("reference"), variant], grid, "cpu", tmp_path / "out",
                show_progress=False).run()
    rows = {r["variant"]: r for r in csv.DictReader(out.open())}
    assert "scan:address-keyed" in rows["model-new:memo.py"]["flags"].split(";")
    assert rows["model-new:memo.py"]["status"] == "suspect"  # and physics catches it
    assert "scan:" not in rows["reference"]["flags"]

    argv = ["check", "--model-new", str(path), "--device", "cpu", "--node-dim", "32",
            "--pair-dim", "8", "--heads", "4", "--length", "5", "--seeds", "1"]
    cli_main(argv)
    assert "scan warning: " in capsys.readouterr().out
    cli_main([*argv, "--json"])
    (finding,) = json.loads(capsys.readouterr().out)["scan"]["model-new:memo.py"]
    assert finding["rule"] == "address-keyed" and finding["line"] == 9
