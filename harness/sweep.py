"""Resumable sweeps: every variant over a grid, one tidy CSV row per
variant x config x dtype x mode, written and fsync'ed as each cell finishes.

Per cell: unsupported -> a row with the reasons; otherwise, in the variant's worker process
(`harness.worker`), build (build and first-call time recorded as `build_s`), the
correctness protocol against the float64 oracle (computed here), timing for each mode, peak
memory. Out of memory -> `oom` (the sweep goes on); an exception, or a worker that dies or
hangs past `--timeout` -> `error` with its message; numbers outside tolerance -> `mismatch`
(timing still recorded). Timed calls are verified (docs/integrity.md): refilled inputs'
outputs against the oracle, the host clock against the device events, the median against
the memory floor; a row that fails one is `suspect`. A rerun into the same directory skips
every cell already on disk for the same code.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import math
import os
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from harness import environment
from harness.correctness import (
    CheckResult,
    ReferenceCache,
    check_variant,
    correctness_recipes,
    judge_output,
    pass_reasons,
    rows_per_chunk,
)
from harness.errors import RunFailure
from harness.grid import PRESETS, Cell, Grid, load_grid_file, preset_grid
from harness.measure import (
    L2Flusher,
    Timing,
    TimingPolicy,
    copy_bandwidth_gbps,
    flops,
    min_bytes,
)
from harness.options import (
    EXIT_FAILED,
    EXIT_OK,
    add_output_options,
    add_selection_options,
    add_timeout_option,
    positive_int,
    progress_bar,
    selected_variants,
)
from harness.plots import plot_results
from harness.results import (
    GRADIENTS_JSONL,
    KEY_COLUMNS,
    METADATA_JSON,
    NOISY_REL_NOISE,
    RESULTS_CSV,
    REVIEW_SPEEDUP,
    ResultsFile,
    SweepLock,
    known_run_ids,
    read_results,
    row_key,
)
from harness.runner import PASSES, BuildSpec, InputRecipe
from harness.scan import row_flags, scan_variant
from harness.worker import (
    DEFAULT_TIMEOUT_S,
    VariantRaised,
    Worker,
    WorkerFailure,
    WorkerPool,
    exception_name,
    is_oom,
)
from variants.base import Variant
from variants.problem import IPAInputError, get_precision
from variants.reference import init_state_dict
from variants.registry import BUILTIN


def cell_key(variant: str, cell: Cell, mode: str, device: str) -> tuple[str, ...]:
    c = cell.config
    return row_key(dict(variant=variant, batch=cell.batch, length=cell.length, heads=c.heads,
                        node_dim=c.node_dim, pair_dim=c.pair_dim, query_points=c.query_points,
                        value_points=c.value_points, dtype=cell.precision, mode=mode,
                        device=device, **{"pass": cell.pass_name}))


_RANDOM = random.SystemRandom()  # refill seeds and sample indices no variant can predict
BUILTIN_NAMES = frozenset(cls.name for cls in BUILTIN)
# Wall-clock cross-check: a batch of about WALL_BATCH_S seconds of back-to-back calls; each
# may take up to WALL_SLACK x the event median plus WALL_ALLOWANCE_MS by the host clock.
WALL_BATCH_S = 0.05
WALL_SLACK = 1.5
WALL_ALLOWANCE_MS = 0.05


def _short(exc: BaseException, limit: int = 400) -> str:
    text = f"{exception_name(exc)}: {exc}".strip().replace("\n", " | ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _correctness_columns(check: CheckResult) -> dict:
    """The row's correctness figures (the gradient ones only for a training step)."""
    columns = dict(
        rel_l2=check.rel_l2, max_abs=check.max_abs, reference_rel_l2=check.reference_rel_l2,
        tol=check.tol, err_ratio=check.err_ratio, invariance_err=check.invariance_err,
        invariance_tol=check.invariance_tol, correctness_seeds=check.seeds)
    if check.pass_name != "forward":
        columns.update(grad_rel_l2=check.grad_rel_l2, grad_tol=check.grad_tol,
                       grad_worst=check.grad_worst, grad_err_ratio=check.grad_err_ratio)
    return columns


def _seconds(fn) -> float:
    """Seconds `fn()` takes by this process's clock."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class Environment:
    device: torch.device
    device_name: str
    bandwidth_gbps: float
    flusher: L2Flusher | None


def describe_environment(device: torch.device) -> tuple[Environment, dict]:
    """Device facts for every row, and the metadata JSON for this invocation."""
    meta = environment.describe(device)
    flusher = L2Flusher(device) if device.type == "cuda" else None
    bandwidth = copy_bandwidth_gbps(device, nbytes=(1 << 30) if device.type == "cuda" else 1 << 27)
    meta["copy_bandwidth_gbps"] = bandwidth
    return Environment(device, meta["device_name"], bandwidth, flusher), meta


class Sweep:
    """Runs `variants` over `grid` on one device into `out_dir`, resuming what is there."""

    def __init__(self, variants: list[Variant], grid: Grid, device: str, out_dir: str | Path,
                 *, show_progress: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S,
                 threads: int | None = None):
        self.variants = sorted(variants, key=lambda v: not v.is_baseline)  # baseline first
        self.scan = {v.name: scan_variant(v) for v in self.variants}
        self.digests = {v.name: v.code_digest() for v in self.variants}
        self.grid = grid
        self.device = torch.device(device)
        self.out_dir = Path(out_dir)
        self.show_progress = show_progress
        self.timeout_s, self.threads = timeout_s, threads
        self._refill_seeds: dict[Cell, int] = {}
        self.run_id = uuid.uuid4().hex[:12]
        self.started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")

    def _todo(self, results: ResultsFile) -> list[tuple[Cell, Variant]]:
        todo = []
        for cell in self.grid.cells:
            modes = self.grid.modes_for(cell, self.device.type)
            for variant in self.variants:
                keys = [cell_key(variant.name, cell, m, self.device.type) for m in modes]
                # A cell counts as done only for the code that measured it.
                if not all(results.done.get(k) == self.digests[variant.name] for k in keys):
                    todo.append((cell, variant))
        return todo

    def run(self) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with SweepLock(self.out_dir):
            return self._run_locked()

    def _run_locked(self) -> Path:
        meta_path = self.out_dir / METADATA_JSON
        results = ResultsFile(self.out_dir / RESULTS_CSV, known_run_ids(meta_path))
        todo = self._todo(results)
        env, meta = describe_environment(self.device)
        runs = json.loads(meta_path.read_text())["runs"] if meta_path.exists() else []
        meta.update(run_id=self.run_id, started_at=self.started_at, grid=self.grid.source,
                    cells_todo=len(todo), finished=False)
        runs.append(meta)
        self._write_meta(meta_path, runs)
        state_dicts: dict = {}
        references_cell, references = None, None
        finished = False
        workers = WorkerPool(timeout_s=self.timeout_s, threads=self.threads)
        try:
            workers.prestart(sorted({
                (variant, self.device.type, cell.precision) for cell, variant in todo
                if not self._reasons(cell, variant)}, key=str))
            with progress_bar("sweep", len(todo), enabled=self.show_progress) as advance:
                for cell, variant in todo:
                    advance_label = (f"{variant.name} {cell.precision} B={cell.batch} "
                                     f"N={cell.length} H={cell.config.heads}")
                    if cell.config not in state_dicts:
                        state_dicts.clear()
                        state_dicts[cell.config] = init_state_dict(cell.config)
                    if references_cell != cell:  # the oracle is computed once per cell
                        references_cell = cell
                        references = ReferenceCache(state_dicts[cell.config])
                    rows = self._run_cell(cell, variant, references, env, results, workers)
                    results.append(rows)
                    advance(advance_label)
            finished = True
        except KeyboardInterrupt:
            print(f"\ninterrupted: finished rows are in {results.path}; rerun the same command "
                  "to resume", file=sys.stderr)
            raise
        finally:
            workers.close()
            meta["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat(
                timespec="seconds")
            meta["finished"] = finished  # False after a crash or Ctrl-C: rerun to resume
            if self.device.type == "cuda":
                meta["clocks_at_end"] = environment.gpu_clocks()
            self._write_meta(meta_path, runs)
        return results.path

    @staticmethod
    def _write_meta(path: Path, runs: list[dict]) -> None:
        """Replace `path` atomically through a fresh temporary file (never a fixed name that
        could be a symbolic link planted beside it)."""
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".metadata-", suffix=".tmp")
        try:
            os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the metadata from other users
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({"runs": runs}, indent=2, default=str))
            os.replace(tmp, path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise RunFailure(f"{path}: writing the run's metadata failed ({exc}); the results "
                             "on disk are intact: fix the cause and rerun the same command to "
                             "resume") from exc

    def _row(self, cell: Cell, variant: Variant, mode: str, env: Environment, **values) -> dict:
        c, precision = cell.config, get_precision(cell.precision)
        row = {
            "run_id": self.run_id, "started_at": self.started_at, "variant": variant.name,
            "is_baseline": variant.is_baseline, "batch": cell.batch, "length": cell.length,
            "heads": c.heads, "node_dim": c.node_dim, "pair_dim": c.pair_dim,
            "query_points": c.query_points, "value_points": c.value_points,
            "dtype": precision.name, "math_mode": precision.math_mode, "mode": mode,
            "pass": cell.pass_name, "device": self.device.type, "device_name": env.device_name,
            "code_digest": self.digests[variant.name],
        }
        floor_ms = (min_bytes(c, cell.batch, cell.length, precision.dtype.itemsize,
                              cell.pass_name) / (env.bandwidth_gbps * 1e9) * 1e3)
        row["floor_ms"] = floor_ms
        row.update(values)
        row["flags"] = ";".join(filter(None, [row.get("flags", ""),
                                              *row_flags(self.scan[variant.name], row["dtype"])]))
        return row

    def _reasons(self, cell: Cell, variant: Variant) -> list[str]:
        """Why `variant` cannot run `cell` here (a forward-only variant's training rows)."""
        device = self.device.type
        return pass_reasons(variant, cell.pass_name, device) or (
            variant.not_supported_reasons(cell.config, device, cell.precision))

    def _run_cell(self, cell: Cell, variant: Variant, references: ReferenceCache,
                  env: Environment, results: ResultsFile, workers: WorkerPool) -> list[dict]:
        modes = self.grid.modes_for(cell, self.device.type)
        device = self.device.type
        reasons = self._reasons(cell, variant)
        if reasons:
            return [self._row(cell, variant, m, env, status="unsupported",
                              reason="; ".join(reasons)) for m in modes]
        precision = get_precision(cell.precision)
        worker = workers.get(variant, device, precision.name)
        try:
            return self._measure(cell, variant, references, env, modes, precision, results,
                                 worker)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a row
            status = "oom" if is_oom(exc) else "error"
            return [self._row(cell, variant, m, env, status=status, reason=_short(exc))
                    for m in modes]
        finally:
            try:
                worker.release()
            except (VariantRaised, WorkerFailure):
                pass  # a broken worker is replaced at its next call
            _free_memory()

    def _measure(self, cell, variant, references, env, modes, precision, results,
                 worker: Worker) -> list[dict]:
        device = self.device.type
        build = BuildSpec(("cell", cell.config), references.state_dict, cell.config,
                          precision.name)
        # The timed inputs are the first correctness draw, whose oracle is already computed.
        timing_inputs = correctness_recipes(cell.config, cell.batch, cell.length, device,
                                            precision, seeds=1)[0]
        build_s = worker.build(build, first_call=timing_inputs)
        check = check_variant(variant, cell.config, batch=cell.batch, length=cell.length,
                              device=device, precision=precision, seeds=self.grid.seeds,
                              references=references, runner=worker, build=build,
                              pass_name=cell.pass_name)
        if check.gradients:
            self._write_gradients(cell, variant, check)
        _free_memory()
        notes = variant.known_issues(cell.config, cell.batch, cell.length, device,
                                     precision.name)
        known = "known-issue" if notes else ""
        chunk = rows_per_chunk(cell.config, cell.batch, cell.length)
        if chunk < cell.length:
            notes.append(f"oracle and reference error computed in chunks of {chunk} query rows")
        untimed = variant.untimed_reason(device)
        if untimed:
            kernel = worker.kernel(build)
            return [{**self._untimed_row(cell, variant, mode, env, check, build_s, untimed,
                                         notes, known), "kernel": kernel} for mode in modes]
        if device != "cuda":
            notes.append("peak memory not measured on CPU")
        policy = TimingPolicy(budget_s=self.grid.budget_s)
        refills = self._refills(cell, policy, timing_inputs)
        timed = worker.time(build, timing_inputs, modes, policy, refills, cell.pass_name)
        kernel = worker.kernel(build)
        rows = []
        for mode in modes:
            row = self._timed_row(cell, variant, mode, env, timed.timings[mode], check,
                                  build_s, timed.peak_mib, notes, results, known)
            suspicions = self._verify_refills(refills, timed.refill_outputs[mode], references,
                                              precision)
            if device == "cuda":
                suspicions += self._cross_check_wall_clock(worker, mode, timed.timings[mode])
            if suspicions and row["status"] == "ok":
                row["status"] = "suspect"
            row["reason"] = "; ".join(filter(None, [row["reason"], *suspicions]))
            row["kernel"] = kernel
            rows.append(row)
        return rows

    def _write_gradients(self, cell: Cell, variant: Variant, check: CheckResult) -> None:
        """Append the per-tensor gradient figures of a training cell to gradients.jsonl
        (each tensor's worst seed; the row carries the worst tensor)."""
        record = {"run_id": self.run_id, "code_digest": self.digests[variant.name],
                  "key": dict(zip(KEY_COLUMNS, cell_key(variant.name, cell, "eager",
                                                        self.device.type), strict=True)),
                  "gradients": check.gradients}
        with (self.out_dir / GRADIENTS_JSONL).open("a") as f:
            f.write(json.dumps(record, default=float) + "\n")

    def _refills(self, cell: Cell, policy: TimingPolicy,
                 timing_inputs: InputRecipe) -> list[tuple[int, InputRecipe]]:
        """Two samples, drawn now from the OS's randomness, before which the timed inputs
        are refilled in place: first with fresh values (a seed drawn once per cell, so its
        oracle is computed once for every variant of the cell), then back to the timed
        inputs' own values."""
        if cell not in self._refill_seeds:
            self._refill_seeds = {cell: _RANDOM.randrange(1 << 40)}
        fresh = dataclasses.replace(timing_inputs, seed=self._refill_seeds[cell])
        first = _RANDOM.randrange(policy.min_samples - 3)
        second = _RANDOM.randrange(first + 2, policy.min_samples - 1)
        return [(first, fresh), (second, timing_inputs)]

    @staticmethod
    def _verify_refills(refills, outputs, references: ReferenceCache,
                        precision) -> list[str]:
        """Judge the outputs of the refilled timed calls against the oracle of the new
        values: a memoised, stale or unwritten output fails here."""
        if len(outputs) != len(refills):
            return [f"{len(outputs)} of {len(refills)} refilled timed calls came back"]
        for (index, recipe), output in zip(refills, outputs, strict=True):
            figures = references.figures(recipe)
            judgement = judge_output(output, figures.oracle, figures.reference_err, precision)
            if not judgement.passed:
                return [f"timed call {index} after its inputs were refilled in place with "
                        f"fresh values does not match the oracle of those values "
                        f"({'; '.join(judgement.failures)}): a stale, memoised or unwritten "
                        "output"]
        return []

    @staticmethod
    def _cross_check_wall_clock(worker: Worker, mode: str, timing: Timing) -> list[str]:
        """Host wall clock over a batch of back-to-back calls between two device-wide
        synchronisations, against the event median: work on another stream (or a patched
        timer) shows up as calls that take longer than the timer said."""
        calls = max(3, min(200, math.ceil(WALL_BATCH_S * 1e3 / timing.median_ms)))
        round_trip = min(_seconds(worker.ping) for _ in range(3))
        per_call_ms = (_seconds(lambda: worker.wall(mode, calls)) - round_trip) / calls * 1e3
        limit_ms = WALL_SLACK * timing.median_ms + WALL_ALLOWANCE_MS
        if per_call_ms > limit_ms:
            return [f"work outside the timed stream: {calls} back-to-back calls took "
                    f"{per_call_ms:.4g} ms each by the host clock around a device-wide "
                    f"synchronize, the device events {timing.median_ms:.4g} ms (limit "
                    f"{limit_ms:.4g} ms)"]
        return []

    def _untimed_row(self, cell, variant, mode, env, check: CheckResult, build_s,
                     why: str, notes: list[str], known: str) -> dict:
        return self._row(
            cell, variant, mode, env, status="interpreted" if check.passed else "mismatch",
            reason="; ".join([*check.failures, why]), build_s=build_s,
            **_correctness_columns(check), notes="; ".join(notes), flags=known)

    def _timed_row(self, cell, variant, mode, env, timing: Timing, check: CheckResult,
                   build_s, peak, notes, results: ResultsFile, known: str) -> dict:
        status = "ok" if check.passed else "mismatch"
        key = cell_key(variant.name, cell, mode, self.device.type)
        base_ms = timing.median_ms if variant.is_baseline else results.baseline_ms.get(key[1:])
        best_builtin = min((ms for k, ms in results.ok_ms.items()
                            if k[1:] == key[1:] and k[0] in BUILTIN_NAMES), default=None)
        review = (variant.name not in BUILTIN_NAMES and best_builtin is not None
                  and timing.median_ms * REVIEW_SPEEDUP < best_builtin)
        row = self._row(
            cell, variant, mode, env, status=status, reason="; ".join(check.failures),
            build_s=build_s, median_ms=timing.median_ms, p20_ms=timing.p20_ms,
            p80_ms=timing.p80_ms, n_samples=timing.n_samples, rel_noise=timing.rel_noise,
            peak_mem_mib="" if peak is None else peak, **_correctness_columns(check),
            speedup_vs_baseline=(base_ms / timing.median_ms) if base_ms else "",
            tflops=flops(cell.config, cell.batch, cell.length, cell.pass_name)
            / (timing.median_ms * 1e-3) / 1e12,
            notes="; ".join(notes),
            flags=";".join(f for f in (known, "noisy" if timing.rel_noise > NOISY_REL_NOISE
                                       else "", "review" if review else "") if f),
        )
        row["pct_of_floor"] = 100.0 * row["floor_ms"] / timing.median_ms
        if timing.median_ms < row["floor_ms"]:  # physics: faster than reading the inputs once
            row["status"] = "suspect"
            row["reason"] = "; ".join(filter(None, [row["reason"], (
                f"median {timing.median_ms:.4g} ms is below the memory floor "
                f"{row['floor_ms']:.4g} ms (min bytes over the measured copy bandwidth): the "
                "work cannot all have been done in the timed call")]))
        return row


def default_preset(device: str) -> str:
    """`smoke` on CPU (seconds), `quick` on a GPU (about a minute on the H200)."""
    return "quick" if device == "cuda" else "smoke"


def run_sweep(args) -> int:
    grid = load_grid_file(args.grid) if args.grid else preset_grid(
        args.preset or default_preset(args.device))
    every_cell = list(grid.cells)
    if args.dtype:
        grid.cells = [c for c in grid.cells if c.precision in args.dtype]
    if args.max_length:
        grid.cells = [c for c in grid.cells if c.length <= args.max_length]
    if args.pass_name:
        grid.cells = [c for c in grid.cells if c.pass_name in args.pass_name]
    if not grid.cells:
        raise IPAInputError(
            f"--dtype {args.dtype or '(any)'}, --max-length {args.max_length or '(none)'}, "
            f"--pass {args.pass_name or '(any)'}: no cell of {grid.source} is left (it has "
            f"dtypes {sorted({c.precision for c in every_cell})}, lengths "
            f"{sorted({c.length for c in every_cell})} and passes "
            f"{sorted({c.pass_name for c in every_cell})})")
    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise IPAInputError(f"-o/--output: expected a folder (new or a sweep's, to resume), got "
                            f"the existing file {str(output)!r}")
    variants = selected_variants(args, with_baseline=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    path = Sweep(variants, grid, args.device, output, show_progress=not args.no_progress,
                 timeout_s=args.timeout, threads=args.threads).run()
    print(f"results: {path}")
    if not args.no_plots:
        plots = plot_results(path, output / "plots")
        for png in plots:
            print(f"plot: {png}")
        for message in plots.skipped:
            print(f"plot: {message}")
    statuses = read_results(path)["status"].value_counts()
    print("rows: " + ", ".join(f"{n} {status}" for status, n in statuses.items()))
    return EXIT_FAILED if statuses.get("mismatch", 0) or statuses.get("error", 0) else EXIT_OK


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="run variants over a grid into a resumable CSV, then plot",
        description="Run every selected variant over a grid (a preset or a TOML file): "
        "correctness against the float64 oracle, latency, peak memory, cost model. Each "
        "finished cell is fsync'ed to DIR/results.csv; rerunning the same command resumes. "
        "Exit status 1 when a row is a mismatch or an error.")
    p.add_argument("--preset", choices=list(PRESETS),
                   help="built-in grid (default: quick on cuda, smoke on cpu)")
    p.add_argument("--grid", metavar="FILE.toml", help="grid file (see harness/grid.py)")
    p.add_argument("--max-length", type=positive_int, help="drop cells with N above this")
    p.add_argument("--pass", dest="pass_name", action="append", choices=PASSES,
                   help="keep only the grid's cells of this pass (repeatable; default: every "
                   "pass the grid has; the `training` preset times forward+backward)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="output folder")
    p.add_argument("--no-plots", action="store_true", help="skip plotting at the end")
    p.add_argument("--threads", type=positive_int,
                   help="torch CPU threads (default: torch's own choice; recorded in "
                   "metadata.json as torch_threads)")
    add_output_options(p, json_output=False)
    add_selection_options(p)
    add_timeout_option(p)
    p.set_defaults(run=run_sweep)
