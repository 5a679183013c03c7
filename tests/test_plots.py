"""`ipa-bench plot` and `ipa-bench report`: styles fixed per variant, figures that say what
they skip, the latency floor and bands, the Pareto front, honest report summaries (CPU)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_hex

from harness.plots import (
    FLOOR_LABEL,
    figures,
    length_slice,
    metric_figure,
    pareto_figure,
    pareto_front,
    plot_results,
    run_plot,
    shapes_figure,
    variant_style,
)
from harness.report import markdown_table, report, run_report
from harness.results import COLUMNS, ERR_RATIO_LABEL, read_results
from variants.problem import IPAInputError
from variants.registry import BUILTIN

SMOKE_CSV = Path(__file__).parent / "data" / "smoke-cpu" / "results.csv"


@pytest.fixture
def smoke() -> pd.DataFrame:
    return read_results(SMOKE_CSV)


def _line_colors(fig) -> dict[str, str]:
    """Legend label -> colour of every labelled line of the figure's first axes."""
    return {line.get_label(): to_hex(line.get_color()) for line in fig.axes[0].get_lines()
            if not line.get_label().startswith("_")}


def test_builtin_variants_get_distinct_styles_and_none_is_red():
    styles = [variant_style(name) for name in dict.fromkeys(cls.name for cls in BUILTIN)]
    assert len({s["color"] for s in styles}) == len(styles)
    assert len({s["marker"] for s in styles}) == len(styles)
    assert "#d62728" not in {s["color"] for s in styles}  # red means MISMATCH only


def test_other_names_hash_into_their_own_palette_the_same_way_every_time():
    builtin_colors = {variant_style(cls.name)["color"] for cls in BUILTIN}
    style = variant_style("model-new:foo.py")
    assert style == variant_style("model-new:foo.py")
    assert style["color"] not in builtin_colors
    # Pinned: sha256 of the name, not Python's per-process salted hash().
    assert style == {"color": "#e6ab02", "marker": "H"}


def test_a_variant_keeps_its_colour_whatever_else_is_in_the_csv(smoke):
    both = length_slice(smoke)
    alone = both[both["variant"] == "torch-compile"]
    with_new = pd.concat([alone, alone.assign(variant="model-new:foo.py")])
    colors = []
    for frame in (both, alone, with_new):
        fig = metric_figure(frame, "latency", "fp32")
        colors.append(_line_colors(fig))
        plt.close(fig)
    expected = variant_style("torch-compile")["color"]
    assert {c["torch-compile"] for c in colors} == {expected}
    assert colors[0]["reference"] == variant_style("reference")["color"]
    assert colors[2]["model-new:foo.py"] == variant_style("model-new:foo.py")["color"]


def test_cpu_csv_draws_no_memory_figure_and_says_why(tmp_path, capsys):
    written = plot_results(SMOKE_CSV, tmp_path)
    names = {p.name for p in written}
    assert names == {f"{m}_fp32.png" for m in
                     ("latency", "speedup", "pct_of_floor", "error_vs_latency")}
    assert all(p.exists() and p.with_suffix(".svg").exists() for p in written)
    assert not list(tmp_path.glob("memory_*"))
    (skipped,) = written.skipped
    assert skipped.startswith("memory_fp32: not drawn") and "not measured on CPU" in skipped

    assert run_plot(argparse.Namespace(results=str(SMOKE_CSV), output=tmp_path / "cli",
                                       force=False)) == 0
    out = capsys.readouterr().out
    assert "memory_fp32: not drawn" in out and str(tmp_path / "cli" / "latency_fp32.png") in out


def test_latency_figure_has_the_memory_floor_and_p20_p80_bands(smoke):
    nslice = length_slice(smoke)
    fig = metric_figure(nslice, "latency", "fp32")
    ax = fig.axes[0]
    (floor,) = [line for line in ax.get_lines() if line.get_label() == FLOOR_LABEL]
    assert floor.get_linestyle() == "--" and to_hex(floor.get_color()) == "#000000"
    expected = nslice.groupby("length")["floor_ms"].median()
    assert list(floor.get_xdata()) == list(expected.index)
    assert np.allclose(floor.get_ydata(), expected.values)
    assert FLOOR_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    timed = nslice[nslice["status"] == "ok"]
    assert len(bands) == timed["variant"].nunique() == 2  # one per variant (eager only here)
    ref = nslice[nslice["variant"] == "reference"]
    (band,) = [b for b in bands if to_hex(b.get_facecolor()[0]) ==
               variant_style("reference")["color"]]
    y = band.get_paths()[0].vertices[:, 1]
    assert np.isclose(y.min(), ref["p20_ms"].min()) and np.isclose(y.max(), ref["p80_ms"].max())
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    plt.close(fig)


def test_pareto_front_of_a_hand_made_set():
    points = pd.DataFrame({
        "variant": ["a", "b", "c", "d", "e", "f"],
        "median_ms": [1.0, 2.0, 3.0, 2.5, 4.0, 1.0],
        "err_ratio": [5.0, 1.0, 0.5, 2.0, 0.5, 6.0],
    })
    # d is beaten by b (faster and more accurate); e ties c's error but is slower; f ties a's
    # latency with a larger error.
    front = pareto_front(points)
    assert list(front["variant"]) == ["a", "b", "c"]


def test_pareto_figure_draws_the_front_and_flags_mismatches(smoke):
    rows = length_slice(smoke)
    wrong = rows[rows["variant"] == "torch-compile"].assign(
        variant="planted-bug", status="mismatch", rel_l2=np.inf, err_ratio=np.inf)
    fig = pareto_figure(pd.concat([rows, wrong], ignore_index=True), "fp32")
    for ax in fig.axes:
        labels = [line.get_label() for line in ax.get_lines()]
        assert any(label.startswith("Pareto front") for label in labels)
        assert "infinite or zero error not drawn" in " ".join(t.get_text() for t in ax.texts)
    assert ERR_RATIO_LABEL in fig.axes[0].get_ylabel()
    plt.close(fig)


def test_pareto_figure_falls_back_to_rel_l2_where_err_ratio_is_undefined(smoke):
    fig = pareto_figure(smoke.assign(dtype="fp64", err_ratio=np.nan), "fp64")
    assert fig.axes[0].get_ylabel().startswith("rel_l2")
    plt.close(fig)


def test_every_figure_of_an_all_error_csv_is_skipped_or_marks_the_errors(smoke):
    failed = smoke.assign(status="error", reason="RuntimeError: planted")
    failed[["median_ms", "p20_ms", "p80_ms", "rel_l2", "err_ratio", "pct_of_floor",
            "speedup_vs_baseline"]] = np.nan
    for stem, fig in figures(failed):
        assert isinstance(fig, str), stem
        assert "not measured on CPU" in fig if stem.startswith("memory") else "error" in fig


def test_report_on_a_header_only_csv_raises(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text(",".join(COLUMNS) + "\n")
    with pytest.raises(IPAInputError, match="no rows"):
        run_report(argparse.Namespace(results=[str(path)]))
    with pytest.raises(IPAInputError, match="no rows"):
        report(pd.DataFrame(columns=COLUMNS))


def test_report_on_all_error_rows_does_not_say_every_cell_passed(tmp_path, smoke, capsys):
    failed = smoke.assign(status="error", reason="RuntimeError: planted | second line")
    failed[["median_ms", "p20_ms", "p80_ms", "rel_l2", "err_ratio"]] = np.nan
    path = tmp_path / "results.csv"
    failed.to_csv(path, index=False)
    assert run_report(argparse.Namespace(results=[str(path)])) == 0
    text = capsys.readouterr().out
    assert "every cell passed" not in text
    assert "none passed" in text and f"Rows: {len(failed)} ({len(failed)} error)" in text
    assert "RuntimeError: planted \\| second line" in text  # one cell, not two


def test_report_of_several_csvs_is_one_table_and_a_repeated_cell_counts_by_the_last_file(
        tmp_path, smoke, capsys):
    is_anchor = smoke["variant"] == "reference"
    kernels, anchors = smoke[~is_anchor], smoke[is_anchor]
    remeasured = kernels[kernels["status"] == "ok"].head(1).assign(median_ms=1234.5)
    paths = [tmp_path / f"{name}.csv" for name in ("kernels", "anchors", "again")]
    for frame, path in zip((kernels, anchors, remeasured), paths, strict=True):
        frame.to_csv(path, index=False)
    assert run_report(argparse.Namespace(results=[str(p) for p in paths])) == 0
    text = capsys.readouterr().out
    assert f"Rows: {len(smoke)} (" in text  # every cell once, the remeasured one included
    assert "1234" in text and text == report(pd.concat(
        [kernels.drop(remeasured.index), anchors, remeasured], ignore_index=True))


def test_report_says_every_cell_passed_only_when_it_did(smoke):
    ok = smoke[smoke["status"] == "ok"]
    assert "None: every cell passed." in report(ok)
    assert "every cell passed" not in report(smoke)  # unsupported rows are listed
    assert "every cell passed" not in report(ok.assign(median_ms=np.nan))


def test_report_tables_use_the_err_ratio_label(smoke):
    assert f"| {ERR_RATIO_LABEL}" in report(smoke)


def test_markdown_table_is_a_valid_github_table():
    text = markdown_table(["variant", "reason"], [["a", "x | y"], ["long-name", ""]])
    lines = text.splitlines()
    assert len(lines) == 4 and re.fullmatch(r"\|(-+\|)+", lines[1])
    # Every line has the same number of unescaped cell separators.
    assert {len(re.findall(r"(?<!\\)\|", line)) for line in lines} == {3}
    assert markdown_table(["a", "b"], []).count("\n") == 1


def _default_layer(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` moved to the simplified problem's default layer (H = 12, C = 32) at B = 1."""
    return rows.assign(batch=1, heads=12, head_dim=32, node_dim=384, pair_dim=128,
                       query_points=4, value_points=8)


def test_the_n_slice_among_shapes_of_as_many_lengths_is_the_default_layer(smoke):
    # The smoke rows (H = 4) sort before the default layer (H = 12): the tie-break, not the
    # order, must pick it.
    both = pd.concat([smoke, _default_layer(smoke)], ignore_index=True)
    assert set(length_slice(both)["heads"]) == {12}
    # More lengths still win over the default layer.
    longer = pd.concat([smoke, smoke.assign(length=smoke["length"] + 1000)], ignore_index=True)
    assert set(length_slice(pd.concat([longer, _default_layer(smoke)]))["heads"]) == {4}


def test_report_ranks_every_shape_of_a_sweep_of_slices(smoke):
    slower = _default_layer(smoke)
    slower.loc[slower["variant"] == "reference", "median_ms"] *= 10
    text = report(pd.concat([smoke, slower], ignore_index=True))
    lines = [line for line in text.splitlines() if line.startswith("| 12 ")]
    assert "Every shape" in text and len(lines) == 2  # default layer, N = 16 and 45
    # N = 16 at H = 12: torch-compile 0.178 ms is fastest, reference 4.457 / 0.178 = 25.06.
    table = text.splitlines()
    header_line = next(line for line in reversed(table[:table.index(lines[0])])
                       if "| fastest " in line)
    header = [c.strip() for c in header_line.strip("|").split("|")]
    row = dict(zip(header, [c.strip() for c in lines[0].strip("|").split("|")], strict=True))
    assert (row["H"], row["C"], row["N"], row["fastest"]) == ("12", "32", "16", "torch-compile")
    assert row["torch-compile"] == "1.00" and row["reference"] == "25.06"
    assert row["triton"] == "unsupported"
    assert "Every shape" not in report(smoke)  # one shape: the N slice's tables say it all


def test_report_marks_host_bound_rows_and_says_what_it_means(smoke):
    flagged = smoke.copy()
    first_ok = flagged.index[flagged["status"] == "ok"][0]
    flagged.loc[first_ok, "flags"] = "host-bound"
    text = report(flagged)
    assert text.count(" (host)") == 1 and "1 timed row(s) are marked `(host)`" in text
    assert "(host)" not in report(smoke) and "slow host" not in text
    flagged.loc[first_ok, "flags"] = "host-bound;slow-host"
    text = report(flagged)
    assert text.count(" (slow host)") == 1 and " (host)" not in text
    assert "1 of them are marked `(slow host)`" in text


def test_a_sweep_of_slices_gets_a_shapes_figure_and_one_shape_none(smoke):
    slower = _default_layer(smoke)
    slower.loc[slower["variant"] == "reference", "median_ms"] *= 10
    drawn = dict(figures(pd.concat([smoke, slower], ignore_index=True)))
    fig = drawn["shapes_fp32"]
    assert not isinstance(fig, str)
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"1.00", "25.06", "unsupported"} <= texts  # the ratios of the report's table
    plt.close(fig)
    assert "shapes_fp32" not in dict(figures(smoke))
    assert "one shape" in shapes_figure(smoke, "fp32")
