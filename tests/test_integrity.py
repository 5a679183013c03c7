"""Planted attacks on the measurement (issue #14): each attack file in tests/attack_files/
is a KernelBench-style ModelNew that fakes its speed or its correctness, or harms the
others. Each must end non-`ok` with a reason (or a scan flag) that names it, while the honest
variants in the same sweep stay `ok` with their usual numbers."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.grid import grid_from_dict
from harness.model_new import model_new_variant
from harness.sweep import Sweep
from variants.registry import get_variant

REPO = Path(__file__).resolve().parents[1]
ATTACKS = REPO / "tests" / "attack_files"
HONEST = REPO / "tests" / "model_new_files" / "ipa_standalone.py"
GRID = {"base": {"node_dim": 32, "pair_dim": 8, "heads": 2, "query_points": 2,
                 "value_points": 2, "dtypes": ["fp32"], "modes": ["eager"], "seeds": 2,
                 "budget_s": 0.05},
        "slice": [{"length": [6, 9]}]}
CPU_ATTACKS = ["memo_by_address", "poison_softmax", "exit_on_third_call", "oracle_from_frames",
               "timer_aware", "patches_harness", "low_precision", "segfault"]


@pytest.fixture(scope="module")
def attacked_sweep(tmp_path_factory) -> dict[tuple[str, str], dict]:
    """One sweep of the reference, an honest ModelNew file and every CPU attack: rows by
    (variant, length)."""
    out = tmp_path_factory.mktemp("attacked")
    variants = [get_variant("reference"), model_new_variant(HONEST),
                *(model_new_variant(ATTACKS / f"{name}.py") for name in CPU_ATTACKS)]
    path = Sweep(variants, grid_from_dict(GRID), "cpu", out, show_progress=False).run()
    with path.open(newline="") as f:
        return {(r["variant"], r["length"]): r for r in csv.DictReader(f)}


def _rows(rows: dict, attack: str) -> list[dict]:
    found = [row for (variant, _), row in rows.items()
             if variant == f"model-new:{attack}.py"]
    assert len(found) == 2, sorted(rows)
    return found


def test_honest_variants_stay_ok_beside_the_attacks(attacked_sweep):
    for name in ("reference", f"model-new:{HONEST.name}"):
        for length in ("6", "9"):
            row = attacked_sweep[name, length]
            assert row["status"] == "ok", (name, length, row["reason"])
            assert float(row["err_ratio"]) < 3 or name == "reference"


@pytest.mark.parametrize("attack, statuses, named", [
    # The timed calls return the output of other inputs once those are refilled in place.
    ("memo_by_address", {"suspect", "mismatch"}, "stale, memoised or unwritten output"),
    # Its own softmax is broken (in its own worker only): a mismatch, nothing more.
    ("poison_softmax", {"mismatch"}, "rel_l2"),
    ("exit_on_third_call", {"error"}, "ended without answering (exit code 0)"),
    # No oracle on the worker's stack: zeros, and the scan names the frame walking.
    ("oracle_from_frames", {"mismatch"}, "scan:introspection"),
    # Honest when checked, a cached output when timed: the refilled timed call shows it.
    ("timer_aware", {"suspect"}, "stale, memoised or unwritten output"),
    # The patched CheckResult lives in the worker; the verdict is made in the parent.
    ("patches_harness", {"mismatch"}, "scan:patching"),
    ("low_precision", {"mismatch"}, "scan:low-precision"),
    ("segfault", {"error"}, "killed by SIGSEGV"),
])
def test_each_attack_ends_non_ok_and_is_named(attacked_sweep, attack, statuses, named):
    for row in _rows(attacked_sweep, attack):
        assert row["status"] in statuses, (attack, row["status"], row["reason"])
        assert named in row["reason"] + " " + row["flags"], (attack, row["reason"], row["flags"])


def test_poisoning_softmax_does_not_reach_the_reference_or_the_oracle(attacked_sweep):
    """The poisoner was imported before the second cell; in one shared interpreter the
    reference's rows (and the oracle) after it would use uniform attention weights."""
    for length in ("6", "9"):
        reference = attacked_sweep["reference", length]
        assert reference["status"] == "ok"
        assert float(reference["rel_l2"]) < 1e-5


def test_a_hanging_variant_is_killed_at_the_timeout_and_the_sweep_goes_on(tmp_path):
    variants = [get_variant("reference"), model_new_variant(ATTACKS / "infinite_loop.py")]
    path = Sweep(variants, grid_from_dict(GRID), "cpu", tmp_path, show_progress=False,
                 timeout_s=20).run()
    with path.open(newline="") as f:
        rows = {(r["variant"], r["length"]): r for r in csv.DictReader(f)}
    for length in ("6", "9"):  # each cell gets a fresh worker, which hangs again
        row = rows["model-new:infinite_loop.py", length]
        assert row["status"] == "error"
        assert "no answer within 20 s (--timeout); killed it" in row["reason"]
        assert rows["reference", length]["status"] == "ok"


def test_check_names_a_process_exit_instead_of_ending_silently():
    command = [sys.executable, "-m", "harness.cli", "check", "--device", "cpu", "--variant",
               "reference", "--model-new", str(ATTACKS / "exit_on_third_call.py"),
               "--node-dim", "32", "--pair-dim", "8", "--heads", "2", "--length", "7",
               "--seeds", "3", "--json", "--no-progress"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1, proc.stderr
    results = {r["variant"]: r for r in json.loads(proc.stdout)["results"]}
    assert results["reference"]["status"] == "pass"
    failure = results["model-new:exit_on_third_call.py"]
    assert failure["status"] == "fail"
    assert "ended without answering (exit code 0)" in failure["failures"][0]


@pytest.mark.gpu
def test_work_on_a_side_stream_is_named(tmp_path):
    # N = 2048: the reference's GPU time (ms) is well above its host launch time, the regime
    # where work the events do not see would shorten the median.
    grid = grid_from_dict({"base": {"dtypes": ["fp32"], "modes": ["eager"], "seeds": 2,
                                    "budget_s": 0.2}, "slice": [{"length": [2048]}]})
    variants = [get_variant("reference"), model_new_variant(ATTACKS / "side_stream.py")]
    path = Sweep(variants, grid, "cuda", tmp_path, show_progress=False).run()
    with path.open(newline="") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert rows["reference"]["status"] == "ok", rows["reference"]["reason"]
    row = rows["model-new:side_stream.py"]
    assert row["status"] != "ok"
    assert ("work outside the timed stream" in row["reason"]
            or "below the memory floor" in row["reason"]), row["reason"]
    assert "scan:streams" in row["flags"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_cuda_fault_is_an_error_row_and_the_next_cell_gets_a_fresh_worker(tmp_path, device):
    # On the CPU the attack raises the error (and message) PyTorch raises after the fault.
    grid = grid_from_dict({"base": {**GRID["base"], "dtypes": ["fp32"]},
                           "slice": [{"length": [64, 96]}]})
    variants = [get_variant("reference"), model_new_variant(ATTACKS / "cuda_fault.py")]
    path = Sweep(variants, grid, device, tmp_path, show_progress=False).run()
    with path.open(newline="") as f:
        rows = {(r["variant"], r["length"]): r for r in csv.DictReader(f)}
    faulted = rows["model-new:cuda_fault.py", "64"]
    assert faulted["status"] == "error"
    assert "a CUDA fault: its worker was ended" in faulted["reason"], faulted["reason"]
    assert rows["model-new:cuda_fault.py", "96"]["status"] == "ok"  # a fresh CUDA context
    assert rows["reference", "96"]["status"] == "ok"
    # host_ms: the host's issue time of a CUDA call, empty on the CPU (where all is host)
    host_ms = rows["reference", "96"]["host_ms"]
    assert host_ms == "" if device == "cpu" else float(host_ms) > 0, host_ms
    # host_op_us: the worker's host speed just before the row's samples (CUDA only)
    host_op = rows["reference", "96"]["host_op_us"]
    assert host_op == "" if device == "cpu" else float(host_op) > 0, host_op


def test_device_busy_after_the_end_event_is_named_work_outside_the_timed_stream():
    # The verdict alone (the GPU test above plants the side stream): each sample's device-wide
    # synchronize after its end event took 4 ms against 1 ms by the events.
    from harness.cells import CellRunner
    from harness.measure import Timing

    hidden = Timing(1.0, 0.9, 1.1, 20, 0.01, trailing_ms=4.0)
    reasons = CellRunner._unseen_work(None, "eager", hidden)
    assert reasons and reasons[0].startswith("work outside the timed stream"), reasons


class _BatchClock:
    """A worker stand-in whose back-to-back batches take the given ms per call, in turn."""

    def __init__(self, *per_call_ms: float):
        self.per_call_ms = list(per_call_ms)

    def ping(self) -> None:
        pass

    def wall(self, mode: str, calls: int) -> None:
        time.sleep(self.per_call_ms.pop(0) * calls / 1e3)


@pytest.mark.parametrize(("batches", "suspect"), [((6.0, 1.0), False), ((6.0, 6.0), True)])
def test_one_slow_batch_is_measured_again_before_it_accuses(batches, suspect):
    # Events say 1 ms a call. A batch at 6 ms a call is hidden work only if a second batch
    # is slow too: a host hiccup during one batch does not make an honest row suspect.
    from harness.cells import CellRunner
    from harness.measure import Timing

    reasons = CellRunner._unseen_work(_BatchClock(*batches), "eager",
                                      Timing(1.0, 0.9, 1.1, 20, 0.01, trailing_ms=0.0))
    assert bool(reasons) == suspect, reasons
    if suspect:
        assert reasons[0].startswith("work outside the timed stream"), reasons


@pytest.mark.parametrize(("host_ms", "bound"),
                         [(0.95, True), (0.8, True), (0.2, False), (float("nan"), False)])
def test_a_row_is_host_bound_when_issuing_its_call_took_most_of_its_median(host_ms, bound):
    # Events say 1 ms a call; NaN is a CPU row, where host_ms is not measured.
    from harness.measure import Timing, host_bound

    assert host_bound(Timing(1.0, 0.9, 1.1, 20, 0.01, host_ms=host_ms)) is bound


@pytest.mark.parametrize(("before", "bound_slow"),
                         [(1.31, True), (1.29, False), (0.5, False), (float("nan"), False)])
def test_a_row_is_on_a_slow_host_when_ops_issued_slower_than_at_the_runs_start(before,
                                                                               bound_slow):
    # 1 us a small op at the run's start; NaN: not measured (CPU rows, older files)
    from harness.results import slow_host

    assert slow_host(before, 1.0) is bound_slow
    assert slow_host(before, float("nan")) is False


def test_the_slow_host_reference_is_the_fastest_host_the_run_has_seen():
    # A run that starts on a slowed host (10 us a small op) and speeds up (7 us): a later
    # host-bound row back at 10 us is slow against the 7 us seen since, not against the start;
    # a row that is not host-bound is never slow; unknown speeds (CPU) judge nothing.
    import math

    import torch

    from harness.cells import Environment

    env = Environment(torch.device("cuda"), "GPU", 1.0, None, host_op_us=10.0)
    assert env.judge_host_speed(9.8, True) == (False, 10.0)
    assert env.judge_host_speed(7.0, True) == (False, 9.8)
    assert env.judge_host_speed(10.3, False) == (False, 7.0)
    assert env.judge_host_speed(10.3, True) == (True, 7.0)
    cpu = Environment(torch.device("cpu"), "CPU", 1.0, None)
    slow, fastest = cpu.judge_host_speed(math.nan, True)
    assert slow is False and math.isnan(fastest)



@pytest.mark.gpu
def test_every_cuda_sample_is_issued_by_a_busy_host(monkeypatch):
    import torch

    from harness import measure

    spins, calls = [], []
    monkeypatch.setattr(measure, "spin_host", lambda ms: spins.append((ms, len(calls))))
    x = torch.zeros(16, device="cuda")
    policy = measure.TimingPolicy(min_warmup=2, warmup_s=0.0, min_samples=5, max_samples=5,
                                  host_spin_ms=1.5)
    timing = measure.time_cuda(lambda: calls.append(x.add_(1)), policy,
                               measure.L2Flusher(torch.device("cuda")))
    # one spin before each call (warm-up and samples), none skipped or doubled
    assert timing.n_samples == 5 and len(calls) == 7
    assert spins == [(1.5, i) for i in range(7)]


@pytest.mark.gpu
def test_many_tiny_launches_are_host_bound_and_their_graph_replay_is_not():
    import torch

    from harness.measure import (
        L2Flusher,
        TimingPolicy,
        capture_cuda_graph,
        host_bound,
        time_cuda,
    )

    x = torch.zeros(16, device="cuda")

    def tiny_launches():
        for _ in range(200):
            x.add_(1)

    policy, flusher = TimingPolicy(budget_s=0.3), L2Flusher(torch.device("cuda"))
    eager = time_cuda(tiny_launches, policy, flusher)
    replay = time_cuda(capture_cuda_graph(tiny_launches), policy, flusher)
    assert host_bound(eager), eager
    assert not host_bound(replay), replay
