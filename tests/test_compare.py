"""`ipa-bench compare`: planted regressions are flagged, noise is not, unmatched cells listed."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main as cli_main
from harness.compare import compare, load, parse_threshold
from harness.results import COLUMNS

SMOKE_CSV = Path(__file__).parent / "data" / "smoke-cpu" / "results.csv"


def _row(variant="reference", length=256, median=10.0, spread=0.01, status="ok", peak=100.0,
         rel_l2=1e-6, reason="", mode="eager") -> dict:
    """One COLUMNS row; `spread` puts p20 and p80 that far (relative) below and above."""
    row = dict.fromkeys(COLUMNS, "")
    row.update(
        run_id="r", started_at="2026-12-02T00:00:00+00:00", problem="simplified",
        variant=variant, is_baseline=variant == "reference", batch=1, length=length, heads=12,
        head_dim=32, node_dim=384,
        pair_dim=128, query_points=4, value_points=8, dtype="fp32", math_mode="ieee",
        mode=mode, device="cuda", device_name="NVIDIA H200", status=status, reason=reason,
    )
    if status in ("ok", "mismatch"):
        row.update(median_ms=median, p20_ms=median * (1 - spread), p80_ms=median * (1 + spread),
                   n_samples=50, rel_noise=spread / 5, peak_mem_mib=peak, rel_l2=rel_l2, tol=2e-5)
    return row


def _write(path: Path, rows: list[dict]) -> str:
    pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)
    return str(path)


def _run(tmp_path, old_rows, new_rows, *extra) -> int:
    old = _write(tmp_path / "old.csv", old_rows)
    new = _write(tmp_path / "new.csv", new_rows)
    return cli_main(["compare", old, new, "--markdown", *extra])


def _out(capsys) -> str:
    """Captured stdout with runs of spaces squeezed (markdown cells are padded to width)."""
    return "\n".join(re.sub(" +", " ", line) if line.startswith("|") else line
                     for line in capsys.readouterr().out.splitlines())


def _table_lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and needle in line]


def test_planted_20_percent_slowdown_is_flagged(tmp_path, capsys):
    old = [_row("reference", n) for n in (256, 1024)] + [_row("triton", n, 2.0) for n in (256,)]
    new = [_row("reference", 256), _row("reference", 1024, 12.0), _row("triton", 256, 2.0)]
    assert _run(tmp_path, old, new, "--threshold", "5%") == 1
    out = _out(capsys)
    table = [line for line in out.splitlines() if line.startswith("| ")]
    # Worst first: the slowed cell heads the table.
    assert "| reference |" in table[1] and " N1024 " in table[1]
    assert "1.200x" in table[1] and "SLOWER" in table[1]
    assert len(_table_lines_with(out, "SLOWER")) == 1
    assert "REGRESSION: 1 cell(s)" in out


def test_a_slowdown_on_a_slowed_host_is_not_judged_but_memory_is(tmp_path, capsys):
    # The same 20 % slowdown, in a host-bound row whose host had slowed (`slow-host`): no
    # latency verdict either way; 2x the memory still fails the comparison.
    old = [_row("triton", 256, 2.0), _row("triton", 1024, 2.0)]
    new = [{**_row("triton", 256, 2.4), "flags": "host-bound;slow-host"},
           {**_row("triton", 1024, 2.4, peak=200.0), "flags": "host-bound;slow-host"}]
    assert _run(tmp_path, old, new, "--threshold", "5%") == 1
    out = _out(capsys)
    assert "SLOWER" not in out
    assert len(_table_lines_with(out, "slow host (NEW): latency not judged")) == 1
    assert len(_table_lines_with(out, "MORE MEMORY")) == 1


def test_host_bound_cells_on_hosts_of_different_speeds_are_not_judged(tmp_path, capsys):
    # Two runs whose hosts issued a small op in 7.0 and 10.3 us (an H100 A/B of 2026-12-06):
    # a host-bound cell 1.65x slower times the hosts, so no latency verdict; a replayed
    # (not host-bound) cell on the same hosts is judged, and so is a host-bound one whose
    # hosts ran alike.
    def row(length, median, host_us, mode="eager", bound=True):
        return {**_row("triton", length, median, mode=mode), "host_op_us": host_us,
                "flags": "host-bound" if bound else ""}

    old = [row(256, 0.42, 7.0), row(256, 0.20, 7.0, "graph", False), row(1024, 0.40, 7.0)]
    new = [row(256, 0.70, 10.3), row(256, 0.30, 10.3, "graph", False), row(1024, 0.60, 7.2)]
    assert _run(tmp_path, old, new, "--threshold", "5%") == 1
    out = _out(capsys)
    assert len(_table_lines_with(out, "host speed 7 -> 10.3 us/op: latency not judged")) == 1
    assert len(_table_lines_with(out, "SLOWER")) == 2  # the replayed one and N = 1024


def test_difference_inside_the_noise_is_ignored(tmp_path, capsys):
    # 10 % slower median, but each run's p20-p80 spread is +-15 %: the bands overlap.
    old = [_row("reference", 256, 10.0, spread=0.15)]
    new = [_row("reference", 256, 11.0, spread=0.15)]
    assert _run(tmp_path, old, new, "--threshold", "5%") == 0
    out = _out(capsys)
    assert "SLOWER" not in out and "no regression" in out and "| same |" in out


def test_significant_change_below_the_threshold_is_ignored(tmp_path, capsys):
    old = [_row("reference", 256, 10.0, spread=0.001)]
    new = [_row("reference", 256, 10.3, spread=0.001)]
    assert _run(tmp_path, old, new, "--threshold", "5%") == 0
    assert _run(tmp_path, old, new, "--threshold", "0.02") == 1
    capsys.readouterr()


def test_pass_to_fail_is_flagged_first(tmp_path, capsys):
    old = [_row("triton", 256, 2.0), _row("reference", 256, 10.0)]
    new = [_row("triton", 256, 2.0, status="mismatch", rel_l2=1e-2,
                reason="rel_l2 1.000e-02 > tol 2.000e-05 (seeds [0] of 3)"),
           _row("reference", 256, 10.0)]
    assert _run(tmp_path, old, new) == 1
    out = _out(capsys)
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert "| triton |" in table[1] and "PASS->FAIL" in table[1]
    assert "ok -> mismatch: rel_l2 1.000e-02 > tol" in table[1]
    assert "1.00e-02 (1e+04x)" in table[1]


def test_an_error_or_oom_after_a_pass_is_a_failure_and_a_fix_is_not(tmp_path, capsys):
    old = [_row("a", 256), _row("b", 256), _row("c", 256, status="error", reason="boom")]
    new = [_row("a", 256, status="oom", reason="OutOfMemoryError"), _row("b", 256),
           _row("c", 256)]
    result = compare(load(_write(tmp_path / "o.csv", old), "OLD"),
                     load(_write(tmp_path / "n.csv", new), "NEW"))
    verdicts = dict(zip(result.cells["variant"], result.cells["verdict"], strict=True))
    assert verdicts == {"a": "PASS->FAIL", "b": "same", "c": "fixed"}
    assert list(result.failed["variant"]) == ["a"]


def test_memory_growth_is_flagged_and_tiny_growth_is_not(tmp_path, capsys):
    old = [_row("reference", 256, peak=100.0), _row("reference", 16, peak=0.1)]
    new = [_row("reference", 256, peak=150.0), _row("reference", 16, peak=0.5)]
    assert _run(tmp_path, old, new) == 1
    out = _out(capsys)
    (line,) = _table_lines_with(out, "MORE MEMORY")
    assert " N256 " in line and "1.500x" in line
    assert " N16 " in _table_lines_with(out, "| same |")[0]


def test_faster_and_smaller_cells_are_reported_not_failed(tmp_path, capsys):
    old = [_row("reference", 256, 10.0, peak=100.0)]
    new = [_row("reference", 256, 5.0, peak=40.0)]
    assert _run(tmp_path, old, new) == 0
    assert "faster, less memory" in _out(capsys)


def test_unmatched_cells_are_reported_not_crashed_on(tmp_path, capsys):
    old = [_row("reference", 256), _row("reference", 4096), _row("old-variant", 256)]
    new = [_row("reference", 256), _row("new-variant", 256), _row("reference", 256, mode="graph")]
    assert _run(tmp_path, old, new) == 0
    out = _out(capsys)
    assert "2 cell(s) only in OLD" in out and "3 cell(s)" not in out
    assert "  old-variant fp32 eager cuda B1 N256" in out and " N4096 " in out
    assert "2 cell(s) only in NEW" in out and "  new-variant fp32" in out
    assert "  reference fp32 graph cuda B1 N256" in out
    assert "1 matched cell(s)" in out


def test_nothing_matched_is_a_usage_error(tmp_path, capsys):
    old = [_row("reference", 256)]
    new = [dict(_row("reference", 512), device_name="NVIDIA A100")]
    assert _run(tmp_path, old, new) == 2
    assert "no cell in common (1 only in OLD, 1 only in NEW)" in capsys.readouterr().err


def test_different_devices_are_noted(tmp_path, capsys):
    old = [_row("reference", 256)]
    new = [dict(_row("reference", 256), device_name="NVIDIA A100")]
    assert _run(tmp_path, old, new) == 0
    assert "the devices differ" in _out(capsys)


def test_real_sweep_csv_against_itself_is_clean(capsys):
    """The committed CPU smoke sweep (empty peak memory, unsupported rows) parses and
    compares to itself without a regression; the rich table path runs too."""
    assert cli_main(["compare", str(SMOKE_CSV), str(SMOKE_CSV)]) == 0
    out = _out(capsys)
    assert "no regression" in out and "still unsupported" in out


def test_two_h200_runs_of_the_same_code_agree_in_graph_mode(capsys):
    """An A/A comparison on real data: the published quick and default H200 runs (same
    commit, same machine, half an hour apart). CUDA-graph rows all agree; the launch-bound
    eager rows drift between processes by more than their within-run spread, which is why
    `--mode graph` exists for gates across processes."""
    runs = Path(__file__).parents[1] / "results"
    quick, default = (runs / f"h200-2026-12-02-{name}" / "results.csv"
                      for name in ("quick", "default"))
    assert cli_main(["compare", str(quick), str(default), "--mode", "graph", "--markdown"]) == 0
    out = _out(capsys)
    assert "12 matched cell(s), threshold 5.0%: 12 same" in out and "no regression" in out
    eager = compare(load(quick, "OLD.csv"), load(default, "NEW.csv"))
    eager = eager.cells[eager.cells["mode"] == "eager"]
    assert (eager["verdict"] == "SLOWER").any()  # A/A drift of eager rows, documented


def test_slowdown_in_a_real_sweep_csv(tmp_path, capsys):
    df = pd.read_csv(SMOKE_CSV)
    slow = df.copy()
    target = (slow["variant"] == "reference") & (slow["length"] == slow["length"].max())
    # Shift the whole distribution past the old p80 (CPU samples are noisy: a bare 20 %
    # would rightly stay inside the noise there).
    for column in ("median_ms", "p20_ms", "p80_ms"):
        slow.loc[target, column] += 1.5 * df.loc[target, "p80_ms"]
    new = tmp_path / "new.csv"
    slow.to_csv(new, index=False)
    assert cli_main(["compare", str(SMOKE_CSV), str(new), "--markdown"]) == 1
    (line,) = _table_lines_with(_out(capsys), "SLOWER")
    assert "| reference |" in line


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125)])
def test_threshold_parsing(text, value):
    assert parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text, fragment", [("5", "did you mean 5%"), ("fast", "percentage"),
                                            ("-5%", "positive"), ("0", "positive")])
def test_threshold_errors_are_clear(text, fragment):
    with pytest.raises(argparse.ArgumentTypeError, match=fragment):
        parse_threshold(text)


def test_bad_inputs_are_usage_errors(tmp_path, capsys):
    assert cli_main(["compare", str(tmp_path / "missing.csv"), str(SMOKE_CSV)]) == 2
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    assert cli_main(["compare", str(tmp_path / "other.csv"), str(SMOKE_CSV)]) == 2
    err = capsys.readouterr().err
    assert "OLD.csv: no such file" in err and "missing columns" in err


def test_cells_run_on_another_gpu_model_are_not_judged(tmp_path, capsys):
    # A mixed-GPU Ray run: one cell moved from an H200 to an A100 between the two runs and is
    # 2x slower; that compares machines, not code. The H200 cell's slowdown still counts.
    old = [_row("reference", 256), _row("reference", 1024)]
    new = [dict(_row("reference", 256, 20.0), device_name="NVIDIA A100"),
           _row("reference", 1024, 12.0)]
    assert _run(tmp_path, old, new) == 1
    out = _out(capsys)
    moved = _table_lines_with(out, " N256 ")
    assert len(moved) == 1 and "other GPU (NVIDIA H200 -> NVIDIA A100): not judged" in moved[0]
    assert "2.000x" in moved[0] and "SLOWER" not in moved[0]
    assert "SLOWER" in _table_lines_with(out, " N1024 ")[0]


def _run_beside_metadata(tmp_path, old_rows, new_rows, old_run: dict | None,
                         new_run: dict | None) -> int:
    """`_run`, each file in a folder of its own with a metadata.json whose one run records
    `old_run` / `new_run`'s keys (None: no metadata.json at all)."""
    import json

    paths = []
    for name, rows, keys in (("old", old_rows, old_run), ("new", new_rows, new_run)):
        folder = tmp_path / name
        folder.mkdir()
        if keys is not None:
            (folder / "metadata.json").write_text(json.dumps({"runs": [{"run_id": "r"} | keys]}))
        paths.append(_write(folder / "results.csv", rows))
    return cli_main(["compare", *paths, "--markdown"])


def _hosts(host: float | None) -> dict:
    return {} if host is None else {"host_op_us": host}


def test_hosts_of_different_speed_are_noted_with_their_host_bound_cells(tmp_path, capsys):
    old = [dict(_row("reference", 256), flags="host-bound"), _row("reference", 1024)]
    new = [dict(_row("reference", 256), flags="host-bound"), _row("reference", 1024)]
    assert _run_beside_metadata(tmp_path, old, new, _hosts(6.0), _hosts(9.6)) == 0
    out = _out(capsys)
    assert ("note: the hosts differ (OLD issues a small torch op in 6.0 us, NEW in 9.6 us): "
            "1 matched cell(s) flagged host-bound") in out


@pytest.mark.parametrize("hosts", [(6.0, 6.6), (6.0, None), (None, None)])
def test_hosts_are_noted_only_when_both_are_known_and_differ(tmp_path, capsys, hosts):
    rows = [dict(_row("reference", 256), flags="host-bound")]
    assert _run_beside_metadata(tmp_path, rows, rows, *map(_hosts, hosts)) == 0
    assert "the hosts differ" not in _out(capsys)


def test_a_run_before_the_busy_host_is_noted_against_one_after(tmp_path, capsys):
    # metadata.json from before 2026-12-06 has no host_spin_ms: its samples had no busy wait
    rows = [dict(_row("reference", 256), flags="host-bound"), _row("reference", 1024)]
    assert _run_beside_metadata(tmp_path, rows, rows, {"host_op_us": 6.0},
                                {"host_op_us": 6.0, "host_spin_ms": 2.0}) == 0
    assert ("note: the timings differ (the host busy for 0 ms before each OLD sample, 2 ms "
            "before each NEW one): 1 matched cell(s) flagged host-bound") in _out(capsys)


@pytest.mark.parametrize("runs", [({"host_spin_ms": 2.0}, {"host_spin_ms": 2.0}),
                                  (None, {"host_spin_ms": 2.0}), (None, None)])
def test_timings_are_noted_only_when_both_are_known_and_differ(tmp_path, capsys, runs):
    rows = [dict(_row("reference", 256), flags="host-bound")]
    assert _run_beside_metadata(tmp_path, rows, rows, *runs) == 0
    assert "the timings differ" not in _out(capsys)
