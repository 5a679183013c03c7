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
H200_DEFAULT = REPO / "results" / "h200-2026-12-02-default" / "results.csv"


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
    from harness.results import COLUMNS

    text = (REPO / "results" / "README.md").read_text()
    assert [c for c in COLUMNS if f"| `{c}`" not in text and f", `{c}`" not in text] == []


def test_notebook_is_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(c.outputs == [] and c.execution_count is None for c in code)


def _execute_notebook(monkeypatch, results: str) -> tuple[str, int]:
    """Run the notebook on `results` (IPA_BENCH_RESULTS); its text output and image count."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("IPA_BENCH_RESULTS", results)
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
    return "\n".join(text), images


def _memory_exponents(text: str, run: str, dtype: str) -> dict[str, float]:
    return {m[0]: float(m[1]) for m in
            re.findall(rf"memory exponent {run} {dtype} (\S+): ([-\d.]+)", text)}


def test_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    synthetic = _synthetic_gpu_csv(tmp_path / "gpu-synthetic" / "results.csv")
    text, images = _execute_notebook(monkeypatch, f"{SMOKE_CSV}{os.pathsep}{synthetic}")
    assert "2 file(s)" in text and "showing the CI sample" not in text
    # The CPU run has no memory column; the synthetic run's exponents are recovered.
    assert "smoke-cpu, fp32: no peak memory recorded" in text
    exponents = _memory_exponents(text, "gpu-synthetic", "fp32")
    assert exponents.keys() == {"reference", "torch-compile"}
    assert exponents["reference"] == pytest.approx(2.0, abs=0.01)
    assert exponents["torch-compile"] == pytest.approx(1.0, abs=0.01)
    assert "Pareto front" in text and "planted-bug" in text and "OutOfMemoryError" in text
    # latency+speedup, memory (GPU only), Pareto and % of floor for each run and dtype.
    assert images >= 2 + 2 + 1 + 2 + 3


def test_notebook_on_the_published_h200_default_run(monkeypatch):
    """The real run: the reference materialises N x N tensors (memory exponent about 2);
    the fused kernels keep O(N) extra memory beyond their O(N) buffers."""
    text, images = _execute_notebook(monkeypatch, str(H200_DEFAULT))
    assert "1 file(s)" in text and images >= 7
    exponents = _memory_exponents(text, H200_DEFAULT.parent.name, "fp32")
    assert exponents["reference"] == pytest.approx(2.0, abs=0.1)
    assert exponents["cuda-fused"] < 1.2 and exponents["triton-fullfuse"] < 1.3
    assert exponents["triton"] > 1.6 and exponents["cuda-hybrid"] > 1.8  # an N x N x H tensor
    assert "torch-compile" in text and "mismatch" in text  # the Inductor miscompile at N=3000


def test_notebook_training_section_on_the_published_h200_training_run(monkeypatch):
    """Training rows get their own section: time and memory vs N, beside the same cells'
    forward rows from another run on the same GPU, and the error of every gradient tensor."""
    training = REPO / "results" / "h200-2026-12-03-training" / "results.csv"
    quick = REPO / "results" / "h200-2026-12-03-workers" / "quick.csv"
    text, images = _execute_notebook(monkeypatch, f"{training}{os.pathsep}{quick}")
    assert "No training rows" not in text
    assert "training step beside the forward" in text and "torch-compile" in text
    worst = re.search(r"gradient error / tolerance, h200-2026-12-03-training bf16 N = 1024; "
                      r"worst per variant:\n(.*?)(\n\n|$)", text, re.S)
    assert worst and "triton-train" in worst.group(1) and "sdpa-decomposition" in worst.group(1)
    assert images >= 7 + 2 + 2  # forward sections, training time/memory, gradients per dtype
