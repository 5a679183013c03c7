"""The `problem` through the harness (issue #18, docs/problems.md "CLI, grids, CSV"): grids
and presets that name a problem, the CSV's `problem` and `head_dim` columns (old files read
as `simplified`), resume keyed on the problem, report/compare/plots that never mix problems,
openfold training steps judged on every gradient but the mask's, pytest-benchmark's
`--problem` and the notebook (CPU)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness import options
from harness.cells import min_bytes
from harness.cli import main as cli_main
from harness.compare import compare, load
from harness.correctness import check_variant
from harness.grid import PRESETS, grid_from_dict, make_config, preset_grid
from harness.plots import figures
from harness.problems import PROBLEMS
from harness.report import report
from harness.results import COLUMNS, KEY_COLUMNS, read_gradients, read_results
from harness.runner import InputRecipe
from harness.sweep import Sweep
from variants.base import Variant
from variants.openfold.problem import OpenFoldConfig, init_state_dict
from variants.openfold.reference import make_module
from variants.problem import IPAConfig, IPAInputError
from variants.registry import get_variant

REPO = Path(__file__).resolve().parents[1]
SMOKE_CSV = REPO / "tests" / "data" / "smoke-cpu" / "results.csv"
# One layer both problems can be: simplified derives head_dim = 24 / 2 = 12, openfold is given
# it, so the two problems' rows have the same shape columns and differ only in `problem`.
SHARED = {"node_dim": 24, "pair_dim": 8, "heads": 2, "head_dim": 12, "query_points": 2,
          "value_points": 3}
BASE = {**SHARED, "batch": 2, "dtypes": ["fp32"], "modes": ["eager"], "seeds": 1,
        "budget_s": 0.02}


def _grid_toml(path: Path, problem: str | None, lengths: list[int],
               training: list[int] = ()) -> Path:
    base = {**BASE, **({"problem": problem} if problem else {})}
    lines = ["[base]"] + [f"{k} = {json.dumps(v)}" for k, v in base.items()]
    lines += ["[[slice]]", f"length = {json.dumps(lengths)}"]
    if training:
        lines += ["[[slice]]", f"length = {json.dumps(list(training))}",
                  'passes = ["forward+backward"]']
    path.write_text("\n".join(lines) + "\n")
    return path


def _sweep(grid: Path, out: Path, *extra: str) -> int:
    return cli_main(["sweep", "--grid", str(grid), "--device", "cpu", "-o", str(out),
                     "--variant", "reference", "--no-plots", "--no-progress", *extra])


@pytest.fixture(scope="module")
def openfold_run(tmp_path_factory) -> Path:
    """An openfold sweep on CPU: B = 2 (a padded batch), N = 5 and 13, and a training step at
    N = 7, reference only; the grid names its problem."""
    folder = tmp_path_factory.mktemp("openfold")
    grid = _grid_toml(folder / "grid.toml", "openfold", [5, 13], training=[7])
    assert _sweep(grid, folder / "out") == 0
    return folder / "out" / "results.csv"


# ---- grids and presets -----------------------------------------------------------------------

def test_grid_problem_picks_the_config_class_and_its_defaults():
    fp32 = {"dtypes": ["fp32"]}
    grid = grid_from_dict({"base": {"problem": "openfold", **fp32}, "slice": [{"length": [97]}]})
    (cell,) = grid.cells
    assert grid.problem == "openfold" and cell.config == OpenFoldConfig()  # c_hidden 16
    grid = grid_from_dict({"base": {"problem": "openfold", "head_dim": 8, **fp32},
                           "slice": [{"length": [7], "heads": [3, 5]}]})
    assert [c.config.columns()["heads"] for c in grid.cells] == [3, 5]
    assert {c.config.c_hidden for c in grid.cells} == {8}
    # A grid naming no problem takes the one it is given (presets serve both problems).
    unnamed = {"base": fp32, "slice": [{"length": [9]}]}
    (cell,) = grid_from_dict(unnamed, problem="openfold").cells
    assert isinstance(cell.config, OpenFoldConfig)
    (cell,) = grid_from_dict(unnamed).cells
    assert cell.config == IPAConfig()


@pytest.mark.parametrize(("data", "problem", "fragment"), [
    ({"base": {"problem": "alphafold3"}}, None, r"base.problem: expected one of \['openfold'"),
    ({"base": {"problem": "openfold"}}, "simplified", "is for problem 'openfold'"),
    ({"base": {}, "slice": [{"length": [4], "problem": ["openfold"]}]}, None,
     r"unknown key\(s\) \['problem'\]"),
    ({"base": {"head_dim": 16}}, None, "derives it as node_dim / heads = 32, got 16"),
])
def test_grid_problem_errors_name_the_key(data, problem, fragment):
    data = {"slice": [{"length": [4]}], **data}
    with pytest.raises(IPAInputError, match=fragment):
        grid_from_dict(data, problem=problem)


def test_openfold_presets():
    smoke = preset_grid("openfold-smoke")
    assert smoke.problem == "openfold" and {c.batch for c in smoke.cells} == {2}
    assert {c.pass_name for c in smoke.cells} == {"forward", "forward+backward"}
    gpu = preset_grid("openfold-default")
    assert sorted({c.length for c in gpu.cells}) == [256, 512, 1024, 2048, 4096]
    assert {c.precision for c in gpu.cells} == {"fp32", "bf16"}
    assert {c.config for c in gpu.cells} == {OpenFoldConfig()}
    assert {c.batch for c in gpu.cells} == {1}
    assert all("problem" not in PRESETS[p].get("base", {}) for p in ("smoke", "quick", "default"))


def test_sweep_refuses_a_problem_the_grid_contradicts(tmp_path, capsys):
    assert cli_main(["sweep", "--preset", "openfold-smoke", "--problem", "simplified",
                     "--device", "cpu", "-o", str(tmp_path / "x")]) == 2
    assert "is for problem 'openfold'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_require_inputs_fit_asks_the_problems_min_bytes(monkeypatch):
    config = OpenFoldConfig()
    need = 3 * PROBLEMS["openfold"].min_bytes(config, 2, 1000, 4)
    monkeypatch.setattr(options, "device_memory_bytes", lambda device: need)
    options.require_inputs_fit(config, 2, 1000, "cpu")  # exactly fits
    monkeypatch.setattr(options, "device_memory_bytes", lambda device: need - 1)
    with pytest.raises(IPAInputError, match="float64 copy for the oracle"):
        options.require_inputs_fit(config, 2, 1000, "cpu")
    simplified = IPAConfig()
    need = 3 * PROBLEMS["simplified"].min_bytes(simplified, 1, 999, 4)
    monkeypatch.setattr(options, "device_memory_bytes", lambda device: need - 1)
    with pytest.raises(IPAInputError, match="--length 999"):
        options.require_inputs_fit(simplified, 1, 999, "cpu")


# ---- the CSV ---------------------------------------------------------------------------------

def test_openfold_sweep_writes_the_problem_and_reads_it_back(openfold_run):
    assert KEY_COLUMNS[0] == "problem" and "head_dim" in KEY_COLUMNS
    df = read_results(openfold_run)
    assert set(df["problem"]) == {"openfold"} and set(df["head_dim"]) == {12}
    assert sorted(zip(df["length"], df["pass"], strict=True)) == [
        (5, "forward"), (7, "forward+backward"), (13, "forward")]
    assert (df["status"] == "ok").all() and (df["batch"] == 2).all()
    config = make_config("openfold", SHARED)
    row = df[df["length"] == 13].iloc[0]  # the floor is the openfold cost model's
    bandwidth = json.loads((openfold_run.parent / "metadata.json").read_text())["runs"][0][
        "copy_bandwidth_gbps"]
    assert row["floor_ms"] == pytest.approx(min_bytes(config, 2, 13, 4) / bandwidth / 1e6)
    meta = json.loads((openfold_run.parent / "metadata.json").read_text())
    assert meta["runs"][0]["problem"] == "openfold"
    gradients = read_gradients(openfold_run)
    assert set(gradients["problem"]) == {"openfold"} and "mask" not in set(gradients["tensor"])


def test_an_old_csv_and_its_gradients_read_as_the_simplified_problem(tmp_path):
    header = SMOKE_CSV.read_text().splitlines()[0].split(",")
    assert "problem" not in header and "head_dim" not in header
    old = read_results(SMOKE_CSV)
    assert (old["problem"] == "simplified").all()
    assert (old["head_dim"] == old["node_dim"] // old["heads"]).all()
    assert old["head_dim"].dtype.kind == "i"
    # gradients.jsonl records from before the columns: the key is completed the same way.
    (tmp_path / "results.csv").write_text(SMOKE_CSV.read_text())
    key = {"variant": "reference", "batch": 1, "length": 16, "heads": 4, "node_dim": 64,
           "pair_dim": 16, "query_points": 4, "value_points": 8, "dtype": "fp32",
           "mode": "eager", "pass": "forward+backward", "device": "cpu"}
    record = {"key": key, "gradients": {"node_repr": {"rel_l2": 1e-6, "tol": 2e-5,
                                                      "reference_rel_l2": 1e-6}}}
    (tmp_path / "gradients.jsonl").write_text(json.dumps(record) + "\n")
    (row,) = read_gradients(tmp_path / "results.csv").to_dict("records")
    assert row["problem"] == "simplified" and row["head_dim"] == 16


def _keys(path: Path) -> list[tuple[str, ...]]:
    with path.open(newline="") as f:
        return [tuple(r[k] for k in KEY_COLUMNS) for r in csv.DictReader(f)]


def test_resume_after_a_cut_is_keyed_on_the_problem(tmp_path):
    """Both problems' rows in one folder, same shape columns: the openfold sweep is not taken
    as done by the simplified rows, and after a cut only the cut cell is measured again."""
    out = tmp_path / "out"
    assert _sweep(_grid_toml(tmp_path / "s.toml", None, [3, 6]), out) == 0
    openfold = _grid_toml(tmp_path / "o.toml", "openfold", [3, 6])
    assert _sweep(openfold, out) == 0
    csv_path = out / "results.csv"
    keys = _keys(csv_path)
    assert sorted(k[0] for k in keys) == ["openfold"] * 2 + ["simplified"] * 2
    assert {k[1:] for k in keys if k[0] == "openfold"} == {
        k[1:] for k in keys if k[0] == "simplified"}  # the same cells but for the problem
    lines = csv_path.read_text().splitlines(keepends=True)
    cut = lines[-1]
    csv_path.write_text("".join(lines[:-1]) + cut[: len(cut) // 2])  # a torn last row
    grid = grid_from_dict({"base": {**BASE, "problem": "openfold"},
                           "slice": [{"length": [3, 6]}]})
    sweep = Sweep([get_variant("reference", "openfold")], grid, "cpu", out,
                  show_progress=False)
    from harness.results import ResultsFile, known_run_ids

    todo = sweep._todo(ResultsFile(csv_path, known_run_ids(out / "metadata.json")))
    assert [(cell.length, v.name) for cell, v in todo] == [(6, "reference")]
    assert _sweep(openfold, out) == 0
    after = _keys(csv_path)
    assert sorted(after) == sorted(keys) and len(set(after)) == 4


# ---- report, compare, plots ------------------------------------------------------------------

def _as_simplified(df: pd.DataFrame) -> pd.DataFrame:
    """`df`'s rows relabelled as the simplified problem's (same shapes, slower)."""
    other = df.copy()
    other["problem"] = "simplified"
    for column in ("median_ms", "p20_ms", "p80_ms"):
        other[column] = other[column] * 3
    return other


def test_compare_never_pairs_rows_across_problems(openfold_run, tmp_path, capsys):
    df = read_results(openfold_run)
    # Tight spreads, so that a 3x slowdown is outside the noise (CPU samples here are not).
    df["p20_ms"], df["p80_ms"] = 0.99 * df["median_ms"], 1.01 * df["median_ms"]
    simplified = tmp_path / "simplified.csv"
    _as_simplified(df).to_csv(simplified, index=False)
    result = compare(load(openfold_run, "OLD.csv"), load(simplified, "NEW.csv"))
    assert result.cells.empty and len(result.only_old) == len(result.only_new) == len(df)
    assert cli_main(["compare", str(openfold_run), str(simplified)]) == 2
    assert "different problems are never compared" in capsys.readouterr().err
    # Both problems in both files: each row meets its own problem's, and only it.
    both = tmp_path / "both.csv"
    pd.concat([df, _as_simplified(df)]).to_csv(both, index=False)
    slower = tmp_path / "slower.csv"
    changed = pd.concat([_as_simplified(df), df])
    changed.loc[changed["problem"] == "openfold", ["median_ms", "p20_ms", "p80_ms"]] *= 3
    changed.to_csv(slower, index=False)
    result = compare(load(both, "OLD.csv"), load(slower, "NEW.csv"))
    assert len(result.cells) == 2 * len(df)
    by_problem = result.cells.groupby("problem")["latency_ratio"]
    assert by_problem.min()["openfold"] == pytest.approx(3.0)
    assert by_problem.max()["simplified"] == pytest.approx(1.0)
    assert cli_main(["compare", str(both), str(slower), "--markdown"]) == 1
    assert "openfold:reference" in capsys.readouterr().out


def test_report_gives_each_problem_its_own_tables(openfold_run):
    df = read_results(openfold_run)
    alone = report(df)
    assert "Problem: openfold" in alone and "problem openfold," not in alone
    text = report(pd.concat([_as_simplified(df), df], ignore_index=True))
    titles = [line for line in text.splitlines() if line.startswith("## ")]
    assert "## problem simplified: fp32, eager: B=2 H=2 Qp=2 Vp=3 node=24 pair=8" in titles
    assert "## problem openfold: fp32, eager: B=2 H=2 Qp=2 Vp=3 node=24 pair=8" in titles
    assert any(t.startswith("## problem openfold: fp32, training step") for t in titles)


def test_plots_draw_each_problem_apart(openfold_run):
    df = read_results(openfold_run)
    both = pd.concat([_as_simplified(df), df], ignore_index=True)
    drawn = dict(figures(both))
    try:
        assert {"latency_fp32", "latency_fp32_openfold", "latency_fp32_training_openfold",
                "error_vs_latency_fp32_openfold"} <= set(drawn)
        fig = drawn["latency_fp32_openfold"]
        assert "problem openfold" in fig.axes[0].get_title()
        # Each figure holds its own problem's medians only.
        ax = drawn["latency_fp32"].axes[0]
        ys = {round(float(y), 9) for line in ax.get_lines() for y in line.get_ydata()}
        fast = set(df[df["pass"] == "forward"]["median_ms"].round(9))
        assert not ys & fast
    finally:
        import matplotlib.pyplot as plt

        for fig in drawn.values():
            if not isinstance(fig, str):
                plt.close(fig)


def test_a_shape_with_a_free_head_dim_names_it():
    config = make_config("openfold", {"node_dim": 24, "heads": 2, "head_dim": 5})
    assert config.columns()["head_dim"] == 5
    from harness.plots import shape_label

    row = {**config.columns(), "batch": 1}
    assert "C=5" in shape_label(pd.DataFrame([row]))
    assert "C=" not in shape_label(pd.DataFrame([{**IPAConfig().columns(), "batch": 1}]))


# ---- training steps of the openfold problem --------------------------------------------------

OPENFOLD_SMALL = OpenFoldConfig(c_s=24, c_z=8, c_hidden=4, no_heads=3, no_qk_points=2,
                                no_v_points=3)


def test_openfold_grad_out_is_zero_on_the_masked_rows():
    recipe = InputRecipe(OPENFOLD_SMALL, 3, 11, "fp32", "cpu", seed=4)
    values = recipe.values()
    grad = recipe.grad_output(values)
    masked = values.mask == 0
    assert masked.any() and (grad[masked] == 0).all() and (grad[~masked] != 0).all()
    assert torch.equal(grad, recipe.grad_output())  # drawn the same without the values


@pytest.mark.parametrize("variant", ["reference", "torch-compile"])
def test_openfold_training_step_judges_every_gradient_but_the_masks(variant):
    state_dict = init_state_dict(OPENFOLD_SMALL, seed=1)
    result = check_variant(get_variant(variant, "openfold"), OPENFOLD_SMALL, batch=3,
                           length=11, seeds=2, state_dict=state_dict,
                           pass_name="forward+backward")
    assert result.passed, result.failures
    assert set(result.gradients) == {"s", "z", "translations", "rotations"} | set(state_dict)
    # linear_b.bias: zero in exact arithmetic (the softmax cancels a per-row shift), so its
    # relative error means nothing; judged, never the row's figure while it passes.
    assert result.gradients["linear_b.bias"]["reference_rel_l2"] > 1
    assert result.grad_worst != "linear_b.bias" and result.grad_rel_l2 < result.grad_tol


class _NoPairGradient(Variant):
    """Planted backward bug: the forward is exact, z gets no gradient (detached)."""

    name = "planted-z-detached"
    problems = ("openfold",)
    supports_backward = True

    def build(self, state_dict, config, device, precision):
        module = make_module(state_dict, config, device, torch.float32)

        def forward(s, z, translations, rotations, mask):
            return module(s, z.detach(), translations, rotations, mask)

        forward.module = module
        return forward


def test_a_planted_openfold_backward_bug_is_named():
    result = check_variant(_NoPairGradient(), OPENFOLD_SMALL, batch=2, length=9, seeds=1,
                           pass_name="forward+backward")
    assert not result.passed and result.rel_l2 <= result.tol  # the forward is right
    assert result.grad_worst == "z"
    assert any(f.startswith("gradient of z:") or f == "no gradient for z"
               for f in result.failures), result.failures


def test_check_runs_openfold_training_steps(capsys):
    assert cli_main(["check", "--problem", "openfold", "--pass", "forward+backward",
                     "--device", "cpu", "--variant", "reference", "--batch", "2", "--length",
                     "6", "--node-dim", "16", "--pair-dim", "4", "--heads", "2", "--head-dim",
                     "4", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["results"]
    assert row["variant"] == "reference" and row["pass"] == "forward+backward"


# ---- pytest-benchmark and the notebook ---------------------------------------------------------

def test_benchmark_suite_takes_the_problem(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    report_json = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "benchmarks", "--problem", "openfold", "-q",
         "-p", "no:cacheprovider", "-k", "reference", "--benchmark-json", str(report_json)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    benchmarks = json.loads(report_json.read_text())["benchmarks"]
    infos = [b["extra_info"] for b in benchmarks if b["extra_info"]]
    assert {i["pass"] for i in infos} == {"forward", "forward+backward"}
    assert all(i["problem"] == "openfold" and i["status"] == "ok" and i["batch"] == 2
               and set(i) <= set(COLUMNS) for i in infos)


def test_notebook_reads_both_problems(openfold_run, monkeypatch):
    from tests.test_notebook import _execute_notebook

    text, images = _execute_notebook(monkeypatch, f"{SMOKE_CSV}{os.pathsep}{openfold_run}")
    run = openfold_run.parent.name
    assert "2 file(s)" in text and f"{run} [openfold]" in text
    assert f"gradient error / tolerance, {run} [openfold] fp32 N = 7" in text
    assert "smoke-cpu, fp32: no peak memory recorded" in text
    # Per run: latency+speedup, Pareto, % of floor; openfold: training time and gradients.
    assert images >= 3 + 3 + 2
