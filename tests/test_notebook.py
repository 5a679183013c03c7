"""Reading results: notebooks/analysis.ipynb is stored without outputs and runs top to bottom
(nbclient) on the committed CPU smoke CSV plus a synthetic CUDA-like CSV with known memory
scaling; results/README.md documents every CSV column."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "analysis.ipynb"
SMOKE_CSV = REPO / "tests" / "data" / "smoke-cpu" / "results.csv"
LENGTHS = (64, 128, 256, 512, 1024)


def _synthetic_gpu_csv(path: Path) -> Path:
    """CUDA-like rows built from the smoke CSV's: `reference` memory grows as N^2, the other
    variant's as N; a bf16 copy for the Pareto plot, one mismatch and one oom."""
    smoke = pd.read_csv(SMOKE_CSV)
    templates = smoke[(smoke["status"] == "ok") & (smoke["length"] == smoke["length"].min())]
    rows = []
    for _, template in templates.iterrows():
        quadratic = bool(template["is_baseline"])
        for dtype, speed, error in (("fp32", 1.0, 1.0), ("bf16", 0.5, 1e3)):
            for n in LENGTHS:
                row = template.copy()
                row["device"], row["device_name"], row["dtype"], row["length"] = (
                    "cuda", "Synthetic GPU", dtype, n)
                row["median_ms"] = speed * (1e-5 * n * n if quadratic else 4e-6 * n * n)
                row["p20_ms"], row["p80_ms"] = 0.99 * row["median_ms"], 1.01 * row["median_ms"]
                row["peak_mem_mib"] = 2e-4 * n * n if quadratic else 0.05 * n
                row["rel_l2"] = error * row["rel_l2"]
                row["pct_of_floor"] = 100.0 * row["floor_ms"] / row["median_ms"]
                rows.append(row)
    frame = pd.DataFrame(rows).reset_index(drop=True)
    frame["speedup_vs_baseline"] = frame["is_baseline"].map({True: 1.0, False: 2.5})
    last = frame.iloc[-1].copy()
    last["length"], last["status"], last["reason"] = 2048, "oom", "OutOfMemoryError: planted"
    last[["median_ms", "p20_ms", "p80_ms", "peak_mem_mib", "rel_l2"]] = float("nan")
    wrong = frame.iloc[0].copy()
    wrong["variant"], wrong["status"], wrong["rel_l2"] = "planted-bug", "mismatch", 0.5
    wrong["reason"] = "rel_l2 5.000e-01 > tol 2.000e-05 (seeds [0] of 2)"
    frame = pd.concat([frame, last.to_frame().T, wrong.to_frame().T], ignore_index=True)
    path.parent.mkdir(parents=True)
    frame.to_csv(path, index=False)
    return path


def test_every_csv_column_is_documented():
    from harness.sweep import COLUMNS

    text = (REPO / "results" / "README.md").read_text()
    assert [c for c in COLUMNS if f"| `{c}`" not in text and f", `{c}`" not in text] == []


def test_notebook_is_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(c.outputs == [] and c.execution_count is None for c in code)


def test_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    synthetic = _synthetic_gpu_csv(tmp_path / "gpu-synthetic" / "results.csv")
    monkeypatch.setenv("IPA_BENCH_RESULTS", f"{SMOKE_CSV}{os.pathsep}{synthetic}")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()

    text, images = [], 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error"
            if output.output_type == "stream":
                text.append(output.text)
            elif "data" in output:
                text.append(output.data.get("text/plain", ""))
                images += "image/png" in output.data
    text = "\n".join(text)
    assert "2 file(s)" in text and "showing the CI sample" not in text
    # The CPU run has no memory column; the synthetic run's exponents are recovered.
    assert "smoke-cpu, fp32: no peak memory recorded" in text
    exponents = {m[0]: float(m[1]) for m in
                 re.findall(r"memory exponent gpu-synthetic fp32 (\S+): ([-\d.]+)", text)}
    assert exponents.keys() == {"reference", "torch-compile"}
    assert exponents["reference"] == pytest.approx(2.0, abs=0.01)
    assert exponents["torch-compile"] == pytest.approx(1.0, abs=0.01)
    assert "Pareto front" in text and "planted-bug" in text and "OutOfMemoryError" in text
    # latency+speedup, memory (GPU only), Pareto and % of floor for each run and dtype.
    assert images >= 2 + 2 + 1 + 2 + 3
