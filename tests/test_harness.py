"""Sweeps, timing statistics, the cost model, grids, plots and the report (CPU)."""

from __future__ import annotations

import csv
import json
import re
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main as cli_main
from harness.grid import grid_from_dict, load_grid_file, preset_grid
from harness.measure import flops, min_bytes, spin_host, summarize
from harness.report import report
from harness.results import COLUMNS, read_results
from harness.sweep import Sweep
from tests.fake_variants import FakeOOM, Raising
from variants.base import source_digest
from variants.problem import IPAConfig, IPAInputError
from variants.registry import get_variant

REPO = Path(__file__).resolve().parents[1]
TINY = {"base": {"node_dim": 32, "pair_dim": 8, "heads": 2, "query_points": 2,
                 "value_points": 2, "dtypes": ["fp32"], "modes": ["eager"], "seeds": 1,
                 "budget_s": 0.02}}


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_summarize_gives_median_percentiles_and_noise():
    t = summarize([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0])
    assert t.median_ms == 6.0 and t.n_samples == 11
    assert t.p20_ms == pytest.approx(3.0) and t.p80_ms == pytest.approx(9.0)
    assert 0 < t.rel_noise < 1
    assert summarize([2.0] * 20).rel_noise == 0.0


def test_spin_host_keeps_the_core_busy_for_the_time_asked():
    # a busy wait, not a sleep: the process's CPU time advances with the clock
    wall, cpu = time.perf_counter(), time.process_time()
    spin_host(30.0)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert wall >= 0.030
    assert cpu >= 0.5 * wall, (cpu, wall)


def test_cost_model_matches_spec_floor():
    config = IPAConfig()
    pair_bytes = 4 * 4096 * 4096 * 128
    total = min_bytes(config, 1, 4096, 4)
    assert pair_bytes < total < 1.01 * pair_bytes
    assert total / 4.3e12 * 1e3 == pytest.approx(2.0, rel=0.03)  # SPEC: 2.00 ms at N = 4096
    quadratic = 2 * 4096**2 * (128 * 12 + 12 * (32 + 12) + 12 * (32 + 24))
    linear = 2 * 4096 * 384 * (3 * 384 + 3 * 12 * (2 * 4 + 8)) + 2 * 4096 * (384 + 288) * 384
    assert flops(config, 1, 4096) == quadratic + linear


def test_presets_cover_the_published_grid():
    default = preset_grid("default")
    lengths = {c.length for c in default.cells}
    assert min(lengths) == 64 and max(lengths) == 4096 and 1000 in lengths
    assert {c.batch for c in default.cells} == {1, 4}
    assert {c.config.heads for c in default.cells} == {4, 8, 12, 16}
    assert {c.config.query_points for c in default.cells} == {4, 8}
    assert {c.config.value_points for c in default.cells} == {8, 12}
    assert {c.precision for c in default.cells} == {"fp32", "bf16"}
    assert max(c.length for c in preset_grid("long").cells) >= 8192
    assert len(default.cells) == len(set(default.cells))


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"slice": [{"length": [8], "colour": [1]}]}, r"slice\[0\]: unknown key\(s\) \['colour'\]"),
        ({"slice": [{"length": [0]}]}, r"slice\[0\].length: expected positive integers, got 0"),
        ({"slice": [{"length": 8}]}, "slice.0..length: expected a non-empty list"),
        ({"base": {"dtypes": ["fp8"]}, "slice": [{"length": [8]}]}, "base.dtypes: expected"),
        ({"base": {"speed": 1}, "slice": [{"length": [8]}]}, r"base: unknown key\(s\) \['speed'\]"),
        ({"base": {}}, "at least one"),
        ({"problem": "openfold", "slice": [{"length": [8]}]},  # a setting above [base]
         r"entries \['problem'\].*settings such as \['problem'\] go under \[base\]"),
        ({"slices": [{"length": [8]}]},
         r"unknown top-level entries \['slices'\]; expected the tables"),
        ({"slice": [{"length": [8], "heads": [5]}]}, "heads: expected a divisor"),
        ({"base": {"host_spin_ms": -1}, "slice": [{"length": [8]}]},
         r"base.host_spin_ms: expected a number of milliseconds >= 0, got -1"),
    ],
)
def test_grid_validation_errors_are_clear(data, fragment):
    with pytest.raises(IPAInputError, match=fragment):
        grid_from_dict(data)


def test_grid_file_is_read(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text('[base]\ndtypes = ["bf16"]\n[[slice]]\nlength = [10, 20]\nheads = [4, 8]\n')
    grid = load_grid_file(path)
    assert len(grid.cells) == 4 and {c.precision for c in grid.cells} == {"bf16"}
    path.write_text('[base]\nhost_spin_ms = 0\n[[slice]]\nlength = [10]\n')
    assert load_grid_file(path).host_spin_ms == 0.0
    path.write_text("[[slice]\n")
    with pytest.raises(IPAInputError, match="invalid TOML"):
        load_grid_file(path)


def test_failures_become_rows_and_the_sweep_goes_on(tmp_path):
    grid = grid_from_dict({**TINY, "slice": [{"length": [5, 9]}]})
    variants = [get_variant("reference"), Raising(), FakeOOM(), get_variant("cuda-fused")]
    path = Sweep(variants, grid, "cpu", tmp_path, show_progress=False).run()
    rows = _rows(path)
    status = {(r["variant"], r["length"]): r for r in rows}
    assert len(rows) == 8
    for n in ("5", "9"):
        assert status[("reference", n)]["status"] == "ok"
        assert float(status[("reference", n)]["median_ms"]) > 0
        assert float(status[("reference", n)]["rel_l2"]) <= float(status[("reference", n)]["tol"])
        assert status[("raising", n)]["status"] == "error"
        assert "RuntimeError: kernel exploded | second line" in status[("raising", n)]["reason"]
        assert status[("fake-oom", n)]["status"] == "oom"
        assert status[("cuda-fused", n)]["status"] == "unsupported"
        assert status[("cuda-fused", n)]["reason"]
    meta = json.loads((tmp_path / "metadata.json").read_text())["runs"][0]
    for key in ("torch", "python", "git_commit", "git_dirty", "source_digest", "command",
                "copy_bandwidth_gbps", "host_op_us"):
        assert key in meta
    assert 0 < meta["host_op_us"] < 1000  # us to issue one small op
    assert meta["host_spin_ms"] == 0.0  # the grid's default: none
    assert meta["finished"] is True


def test_mismatch_keeps_timing_and_is_flagged(tmp_path):
    from tests.planted import InverseFrameBug

    grid = grid_from_dict({**TINY, "slice": [{"length": [6]}]})
    rows = _rows(Sweep([InverseFrameBug()], grid, "cpu", tmp_path, show_progress=False).run())
    (row,) = rows
    assert row["status"] == "mismatch" and float(row["median_ms"]) > 0
    assert float(row["rel_l2"]) > float(row["tol"]) and "rel_l2" in row["reason"]


def test_smoke_sweep_writes_csv_metadata_plots_and_resumes(tmp_path, capsys):
    start = time.perf_counter()
    assert cli_main(["sweep", "--preset", "smoke", "--device", "cpu", "-o", str(tmp_path),
                     "--variant", "reference", "--variant", "torch-compile",
                     "--no-progress"]) == 0
    assert time.perf_counter() - start < 60
    rows = _rows(tmp_path / "results.csv")
    assert list(rows[0]) == COLUMNS
    assert {r["status"] for r in rows} == {"ok"}
    compiled = [r for r in rows if r["variant"] == "torch-compile"]
    assert all(float(r["speedup_vs_baseline"]) > 0 and float(r["build_s"]) > 0 for r in compiled)
    assert all(r["peak_mem_mib"] == "" and "not measured on CPU" in r["notes"] for r in rows)
    for name in ("latency", "speedup", "pct_of_floor", "error_vs_latency"):
        assert (tmp_path / "plots" / f"{name}_fp32.png").stat().st_size > 10_000
        assert (tmp_path / "plots" / f"{name}_fp32.svg").exists()
    assert not (tmp_path / "plots" / "memory_fp32.png").exists()  # not measured on CPU
    capsys.readouterr()
    # A rerun into the same directory resumes: nothing left to do, no duplicates.
    assert cli_main(["sweep", "--preset", "smoke", "--device", "cpu", "-o", str(tmp_path),
                     "--variant", "reference", "--variant", "torch-compile", "--no-progress",
                     "--no-plots"]) == 0
    assert len(_rows(tmp_path / "results.csv")) == len(rows)
    assert len(json.loads((tmp_path / "metadata.json").read_text())["runs"]) == 2

    text = report(read_results(tmp_path / "results.csv"))
    assert "| N | fastest passing |" in re.sub(" +", " ", text)
    assert "None: every cell passed." in text


def test_report_shows_cuda_graph_rows_in_their_own_sections():
    """The published H200 quick run has CUDA-graph rows at N = 256: the report gives them
    latency tables of their own (no memory table: a replay's memory is the eager call's)."""
    text = report(read_results(REPO / "results" / "h200-2026-12-02-quick" / "results.csv"))
    assert "## fp32, eager" in text and "## fp32, CUDA-graph replay" in text
    graph = text.split("## bf16, CUDA-graph replay")[1].split("\n## ")[0]
    assert "| 256 | triton | 0.08429 |" in re.sub(" +", " ", graph)
    assert "Extra peak memory" not in graph


def test_report_keeps_gpu_models_apart():
    """A run whose cells ran on two GPU models (a Ray sweep over a mixed cluster) gets one set
    of tables per model, named, and never ranks a variant of one against the other's."""
    rows = read_results(REPO / "results" / "h200-2026-12-02-quick" / "results.csv")
    other = rows[rows["variant"] == "reference"].assign(device_name="NVIDIA A100",
                                                        median_ms=lambda r: r["median_ms"] / 100)
    text = report(pd.concat([rows[rows["variant"] != "reference"], other], ignore_index=True))
    assert "## NVIDIA H200: fp32, eager" in text and "## NVIDIA A100: fp32, eager" in text
    h200 = text.split("## NVIDIA H200: fp32, eager")[1].split("\n## ")[0]
    assert "reference" not in h200  # the 100x-faster A100 rows are not in the H200's tables


def test_torn_last_line_is_repaired_on_resume(tmp_path):
    grid = grid_from_dict({**TINY, "slice": [{"length": [4, 5]}]})
    path = Sweep([get_variant("reference")], grid, "cpu", tmp_path, show_progress=False).run()
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:25])  # as if killed mid-write
    Sweep([get_variant("reference")], grid, "cpu", tmp_path, show_progress=False).run()
    rows = _rows(path)
    assert sorted(r["length"] for r in rows) == ["4", "5"]
    assert all(r["status"] == "ok" for r in rows)


def test_source_digest_follows_sources_not_build_outputs(tmp_path):
    (tmp_path / "kernel.cu").write_text("// v1")
    before = source_digest([tmp_path])
    for junk in ("build/ext.cpp", "__pycache__/kernel.py"):
        (tmp_path / junk).parent.mkdir(exist_ok=True)
        (tmp_path / junk).write_text("generated")
    assert source_digest([tmp_path]) == before
    (tmp_path / "kernel.cu").write_text("// v2")
    assert source_digest([tmp_path]) != before
