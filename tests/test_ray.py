"""`sweep --ray` (issue #19): the cells on Ray actors, the CSV written by the driver alone.

One local Ray instance for the module, with 2 CPUs and a fake resource `fake_gpu` (2) that
marks CPU actors as GPUs, so the GPU path's scheduling and bookkeeping run on CPU in CI.
"""

from __future__ import annotations

import builtins
import csv
import json
import math
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from harness.cli import main as cli_main
from harness.grid import grid_from_dict, preset_grid
from harness.results import KEY_COLUMNS, read_results
from harness.sweep import Sweep
from tests.fake_variants import Raising
from variants.problem import IPAInputError
from variants.registry import get_variant

ray = pytest.importorskip("ray")
from harness.ray_sweep import MISSING, RayOptions  # noqa: E402 - after the skip

REPO = Path(__file__).resolve().parents[1]
TINY = {"base": {"node_dim": 32, "pair_dim": 8, "heads": 2, "query_points": 2,
                 "value_points": 2, "dtypes": ["fp32"], "modes": ["eager"], "seeds": 1,
                 "budget_s": 0.01},
        "slice": [{"length": [3, 4, 5, 6]}]}


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # Actors unpickle this module's variants (tests.fake_variants): the repository on their path.
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), path]))
    ray.init(num_cpus=2, resources={"fake_gpu": 2}, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
    if path is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = path


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _key(row: dict) -> tuple[str, ...]:
    return tuple(row[k] for k in KEY_COLUMNS)


def _meta(out: Path) -> dict:
    return json.loads((out / "metadata.json").read_text())["runs"][-1]


def test_smoke_grid_on_ray_matches_the_serial_sweep(tmp_path, monkeypatch):
    """Same cells, statuses and correctness figures (deterministic) as a serial sweep, and
    timings in range; every row says where it ran."""
    variants = [get_variant("reference"), get_variant("sdpa-decomposition"), Raising(),
                get_variant("cuda-fused")]
    # Ray starts a one-CPU actor with OMP_NUM_THREADS=1 (docs/distributed.md); fp32
    # gradients' rounding depends on the threads, so the serial sweep gets the same.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        serial = {_key(r): r for r in _rows(Sweep(variants, preset_grid("smoke"), "cpu",
                                                  tmp_path / "serial", show_progress=False,
                                                  threads=1).run())}
    finally:
        torch.set_num_threads(threads)
    on_ray = _rows(Sweep(variants, preset_grid("smoke"), "cpu", tmp_path / "ray",
                         show_progress=False, threads=1, ray=RayOptions(workers=2)).run())
    assert Counter(map(_key, on_ray)) == Counter(list(serial))  # every cell exactly once
    assert {r["status"] for r in on_ray} == {"ok", "mismatch", "error", "unsupported"}
    for row in on_ray:
        twin = serial[_key(row)]
        assert row["status"] == twin["status"], _key(row)
        for column in ("rel_l2", "max_abs", "reference_rel_l2", "tol", "grad_rel_l2"):
            if twin[column] not in ("", "nan"):
                assert math.isclose(float(row[column]), float(twin[column]), rel_tol=1e-12,
                                    abs_tol=0.0), (column, _key(row))
        if twin["median_ms"]:
            ratio = float(row["median_ms"]) / float(twin["median_ms"])
            assert 0.1 < ratio < 10, (_key(row), ratio)  # two actors share 2 CPUs
        assert row["node"].count("/") == 1 and row["gpu"] == ""
        assert row["device_name"] == twin["device_name"]
        if row["variant"] == "sdpa-decomposition" and row["status"] == "mismatch":
            assert row["speedup_vs_baseline"]  # the baseline's median reached the actor
    meta = _meta(tmp_path / "ray")
    assert meta["finished"] and len(meta["ray"]["actors"]) == 2
    assert meta["device_name"] == serial[_key(on_ray[0])]["device_name"]


def test_a_killed_actor_is_replaced_and_its_cell_requeued_up_to_the_limit(tmp_path):
    """N = 4: its actor is killed once, the cell runs again on the replacement. N = 5: its
    actor is killed at every attempt; after the retry limit its rows are errors saying so.
    Every cell is on disk exactly once."""
    killed = []

    def kill(actor, cell, attempt):
        if (cell.length == 4 and attempt == 0) or cell.length == 5:
            killed.append(cell.length)
            ray.kill(actor)

    path = Sweep([get_variant("reference")], grid_from_dict(TINY), "cpu", tmp_path,
                 show_progress=False,
                 ray=RayOptions(workers=2, retries=1, on_dispatch=kill)).run()
    rows = {r["length"]: r for r in _rows(path)}
    assert len(_rows(path)) == 4 and sorted(killed) == [4, 5, 5]
    assert all(rows[n]["status"] == "ok" for n in "346")
    assert rows["5"]["status"] == "error"
    assert "died" in rows["5"]["reason"] and "gave up after 2 attempts" in rows["5"]["reason"]
    meta = _meta(tmp_path)["ray"]
    assert [r["cell"] for r in meta["requeued"]].count(repr(grid_from_dict(TINY).cells[1])) == 1
    assert len(meta["requeued"]) == 2 and len(meta["gave_up"]) == 1
    assert len(meta["actors"]) == 2 + 3  # two, then a replacement for each killed one


def test_fake_gpus_schedule_one_actor_each_and_resume_records_nothing_twice(tmp_path):
    """The GPU path's scheduling: each actor holds one `fake_gpu` (2 in the cluster), so no
    more than two actors exist whatever the CPU count; a rerun finds nothing to do."""
    options = RayOptions(resource="fake_gpu")
    variants = [get_variant("reference")]
    path = Sweep(variants, grid_from_dict(TINY), "cpu", tmp_path, show_progress=False,
                 ray=options).run()
    assert Counter(r["length"] for r in _rows(path)) == Counter("3456")
    assert len(_meta(tmp_path)["ray"]["actors"]) == 2
    Sweep(variants, grid_from_dict(TINY), "cpu", tmp_path, show_progress=False,
          ray=options).run()
    assert len(_rows(path)) == 4 and _meta(tmp_path)["cells_todo"] == 0
    with pytest.raises(IPAInputError, match="--ray-workers 3: the Ray cluster has 2 fake_gpu"):
        Sweep(variants, grid_from_dict(TINY), "cpu", tmp_path / "more", show_progress=False,
              ray=RayOptions(resource="fake_gpu", workers=3)).run()


def test_ctrl_c_cancels_and_leaves_the_csv_resumable(tmp_path):
    dispatched = []

    def interrupt_third(actor, cell, attempt):
        dispatched.append(cell)
        if len(dispatched) == 3:
            raise KeyboardInterrupt

    grid = grid_from_dict(TINY)
    with pytest.raises(KeyboardInterrupt):
        Sweep([get_variant("reference")], grid, "cpu", tmp_path, show_progress=False,
              ray=RayOptions(workers=2, on_dispatch=interrupt_third)).run()
    assert _meta(tmp_path)["finished"] is False
    before = _rows(tmp_path / "results.csv")
    assert len(before) <= 2
    Sweep([get_variant("reference")], grid, "cpu", tmp_path, show_progress=False,
          ray=RayOptions(workers=2)).run()
    assert Counter(r["length"] for r in _rows(tmp_path / "results.csv")) == Counter("3456")
    assert len(read_results(tmp_path / "results.csv")) == 4


def test_the_cli_flag_runs_on_ray(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text('[base]\nnode_dim = 32\npair_dim = 8\nheads = 2\nquery_points = 2\n'
                    'value_points = 2\ndtypes = ["fp32"]\nseeds = 1\nbudget_s = 0.01\n'
                    '[[slice]]\nlength = [5, 7]\n')
    assert cli_main(["sweep", "--ray", "--ray-workers", "1", "--grid", str(grid), "--device",
                     "cpu", "--variant", "reference", "-o", str(tmp_path / "out"),
                     "--no-plots", "--no-progress"]) == 0
    assert "rows: 2 ok" in capsys.readouterr().out
    assert len(_meta(tmp_path / "out")["ray"]["actors"]) == 1


def test_missing_ray_is_a_usage_error(tmp_path, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    assert cli_main(["sweep", "--ray", "--device", "cpu", "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == f"ipa-bench sweep: error: {MISSING}"
    assert not (tmp_path / "out").exists()
    assert cli_main(["sweep", "--ray-workers", "2", "--device", "cpu",
                     "-o", str(tmp_path / "out")]) == 2
    assert "--ray-workers: only with --ray" in capsys.readouterr().err
