"""Bad invocations of every command: one line on stderr that names the argument, exit status
2 (usage) or 1 (a run failure), never a traceback. One row per case: add a row to add a case.

Each case is (id, argv, expected exit status, a phrase the message must hold). `{tmp}` in an
argument is the test's temporary folder, where `_files` has written the inputs named below.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from harness.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "tests" / "data" / "smoke-cpu"
TINY = ["--device", "cpu", "--node-dim", "32", "--pair-dim", "8", "--heads", "4"]


def _files(tmp: Path) -> None:
    header = (SMOKE / "results.csv").read_text().splitlines()[0]
    lines = (SMOKE / "results.csv").read_text().splitlines()
    (tmp / "header-only.csv").write_text(header + "\n")
    (tmp / "truncated.csv").write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])
    (tmp / "foreign.csv").write_text("name,value\nx,1\n")
    (tmp / "binary.csv").write_bytes(bytes(range(256)) * 4)
    # Every timed figure blanked: rows that claim `ok` without a latency.
    blank = [header] + [",".join(f if i < 16 or i in (16, 17) else "" for i, f in
                                 enumerate(line.split(",")[:len(header.split(","))]))
                        for line in lines[1:]]
    (tmp / "nan-filled.csv").write_text("\n".join(blank) + "\n")
    (tmp / "a-file").write_text("not a folder\n")
    foreign_dir = tmp / "foreign-out"
    foreign_dir.mkdir()
    shutil.copy(tmp / "foreign.csv", foreign_dir / "results.csv")
    (tmp / "seeds0.toml").write_text("[base]\nseeds = 0\n[[slice]]\nlength = [4]\n")
    (tmp / "bad.toml").write_text("[base\nseeds = 1\n")
    (tmp / "no_model.py").write_text("x = 1\n")
    (tmp / "published-plots").mkdir()
    (tmp / "published-plots" / "latency_fp32.png").write_bytes(b"a published figure")


CASES = [
    ("check-unknown-variant", ["check", "--variant", "nope"], 2, "unknown name 'nope'"),
    ("check-length-0", ["check", "--length", "0"], 2, "expected a positive integer, got 0"),
    ("check-seeds-0", ["check", "--seeds", "0"], 2, "expected a positive integer, got 0"),
    ("check-heads-not-divisor", ["check", "--heads", "5"], 2, "heads: expected a divisor"),
    ("check-bad-dtype", ["check", "--dtype", "fp8"], 2, "invalid choice: 'fp8'"),
    ("check-length-too-big", ["check", "--length", "200000", *TINY], 2,
     "needs"),
    ("check-model-new-missing", ["check", "--model-new", "{tmp}/missing.py"], 2,
     "--model-new: no such file"),
    ("sweep-no-output", ["sweep"], 2, "-o/--output"),
    ("sweep-output-is-file", ["sweep", "--device", "cpu", "-o", "{tmp}/a-file"], 2,
     "expected a folder"),
    ("sweep-empty-selection", ["sweep", "--device", "cpu", "--preset", "smoke", "--dtype",
                               "bf16", "-o", "{tmp}/out"], 2, "no cell of preset:smoke"),
    ("sweep-max-length-0", ["sweep", "--max-length", "0", "-o", "{tmp}/out"], 2,
     "expected a positive integer, got 0"),
    ("sweep-grid-missing", ["sweep", "--device", "cpu", "--grid", "{tmp}/missing.toml", "-o",
                            "{tmp}/out"], 2, "--grid: no such file"),
    ("sweep-grid-seeds-0", ["sweep", "--device", "cpu", "--grid", "{tmp}/seeds0.toml", "-o",
                            "{tmp}/out"], 2, "base.seeds: expected positive integers"),
    ("sweep-grid-bad-toml", ["sweep", "--device", "cpu", "--grid", "{tmp}/bad.toml", "-o",
                             "{tmp}/out"], 2, "invalid TOML"),
    ("sweep-into-foreign-csv", ["sweep", "--device", "cpu", "--preset", "smoke", "--variant",
                                "reference", "-o", "{tmp}/foreign-out"], 2,
     "not written by this version"),
    ("plot-missing", ["plot", "{tmp}/missing.csv"], 2, "no such file"),
    ("plot-header-only", ["plot", "{tmp}/header-only.csv", "-o", "{tmp}/plots"], 2, "no rows"),
    ("plot-would-overwrite", ["plot", str(SMOKE / "results.csv"), "-o", "{tmp}/published-plots"],
     2, "Pass --force to replace them"),
    ("report-foreign", ["report", "{tmp}/foreign.csv"], 2, "not an ipa-bench results CSV"),
    ("report-truncated", ["report", "{tmp}/truncated.csv"], 2, "truncated.csv"),
    ("report-binary", ["report", "{tmp}/binary.csv"], 2, "binary.csv"),
    ("report-nan-filled", ["report", "{tmp}/nan-filled.csv"], 2, "no finite median_ms"),
    ("compare-missing", ["compare", "{tmp}/missing.csv", "{tmp}/foreign.csv"], 2,
     "OLD.csv: no such file"),
    ("compare-nan-filled", ["compare", "{tmp}/nan-filled.csv", str(SMOKE / "results.csv")], 2,
     "no finite median_ms"),
    ("compare-header-only", ["compare", "{tmp}/header-only.csv", str(SMOKE / "results.csv")],
     2, "no rows"),
    ("compare-bad-threshold", ["compare", "a.csv", "b.csv", "--threshold", "5"], 2,
     "did you mean 5%"),
    ("diagnose-neither", ["diagnose", "--device", "cpu"], 2, "expected exactly one of them"),
    ("diagnose-both", ["diagnose", "reference", "--model-new", "{tmp}/no_model.py", "--device",
                       "cpu"], 2, "expected exactly one of them"),
    ("diagnose-unknown", ["diagnose", "nope", "--device", "cpu"], 2, "unknown name 'nope'"),
    ("no-command", [], 2, "COMMAND"),
    ("unknown-command", ["bench"], 2, "invalid choice: 'bench'"),
]
if not torch.cuda.is_available():
    CASES.append(("check-cuda-without-gpu", ["check", "--device", "cuda"], 2,
                  "torch.cuda.is_available() is False"))


def _run(argv: list[str]) -> int:
    try:
        return cli_main(argv)
    except SystemExit as exc:  # argparse's own exit (usage errors, --help)
        return exc.code


@pytest.mark.parametrize(("argv", "code", "phrase"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_invocation_is_one_clear_line(tmp_path, capsys, argv, code, phrase):
    _files(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert _run(argv) == code
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert "Traceback" not in captured.err + captured.out
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("ipa-bench") and "error:" in lines[0]
    assert phrase in lines[0]


def test_plot_force_replaces_and_nothing_is_written_without_it(tmp_path, capsys):
    _files(tmp_path)
    figure = tmp_path / "published-plots" / "latency_fp32.png"
    argv = ["plot", str(SMOKE / "results.csv"), "-o", str(tmp_path / "published-plots")]
    assert _run(argv) == 2
    assert figure.read_bytes() == b"a published figure"
    assert sorted(p.name for p in figure.parent.iterdir()) == ["latency_fp32.png"]
    assert _run([*argv, "--force"]) == 0
    assert figure.read_bytes().startswith(b"\x89PNG")


def test_version(capsys):
    assert _run(["--version"]) == 0
    assert capsys.readouterr().out.startswith("ipa-bench ")


def test_a_bug_is_a_traceback_with_exit_3(monkeypatch, capsys):
    """An unexpected exception is not dressed up as a usage error."""
    import harness.check

    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(harness.check, "run_list", broken)
    assert _run(["list", "--device", "cpu"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error" in err
