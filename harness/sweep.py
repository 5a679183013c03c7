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

The per-cell work is `harness.cells.CellRunner`'s: one in this process for a serial sweep,
one per Ray actor (one per GPU) with `--ray` (`harness.ray_sweep`, docs/distributed.md).
Either way this process alone writes the CSV.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

import torch

from harness import environment
from harness.cells import CellRunner, SweepSpec, cell_key, describe_environment, label
from harness.errors import RunFailure
from harness.grid import PRESETS, Cell, Grid, load_grid_file, preset_grid
from harness.options import (
    EXIT_FAILED,
    EXIT_OK,
    add_output_options,
    add_problem_option,
    add_selection_options,
    add_timeout_option,
    positive_int,
    progress_bar,
    selected_variants,
)
from harness.plots import plot_results
from harness.problems import DEFAULT
from harness.results import (
    GRADIENTS_JSONL,
    METADATA_JSON,
    RESULTS_CSV,
    ResultsFile,
    SweepLock,
    has_flag,
    known_run_ids,
    read_results,
)
from harness.runner import PASSES
from harness.scan import scan_variant
from harness.worker import DEFAULT_TIMEOUT_S
from variants.base import Variant
from variants.problem import IPAInputError

__all__ = ["Sweep", "cell_key", "run_sweep", "add_parser"]


class Sweep:
    """Runs `variants` over `grid` on one device into `out_dir`, resuming what is there.
    With `ray` (a `harness.ray_sweep.RayOptions`) the cells run on Ray actors, one per GPU
    (or CPU slot); this process still writes every row."""

    def __init__(self, variants: list[Variant], grid: Grid, device: str, out_dir: str | Path,
                 *, show_progress: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S,
                 threads: int | None = None, ray=None):
        self.variants = sorted(variants, key=lambda v: not v.is_baseline)  # baseline first
        self.digests = {v.name: v.code_digest() for v in self.variants}
        self.grid = grid
        self.device = torch.device(device)
        self.out_dir = Path(out_dir)
        self.show_progress = show_progress
        self.ray = ray
        self.run_id = uuid.uuid4().hex[:12]
        self.started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.spec = SweepSpec(self.variants, grid, self.device.type, self.run_id,
                              self.started_at, {v.name: scan_variant(v) for v in self.variants},
                              self.digests, timeout_s, threads)

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
        if self.ray is None:
            env, meta = describe_environment(self.device)
        else:  # the devices are the actors'; each describes its own (meta["ray"])
            env, meta = None, environment.describe(torch.device("cpu"))
            meta["device_name"] = None
        runs = json.loads(meta_path.read_text())["runs"] if meta_path.exists() else []
        meta.update(run_id=self.run_id, started_at=self.started_at, grid=self.grid.source,
                    problem=self.grid.problem, host_spin_ms=self.grid.host_spin_ms,
                    cells_todo=len(todo), finished=False)
        runs.append(meta)
        self._write_meta(meta_path, runs)
        finished = False
        try:
            with progress_bar("sweep", len(todo), enabled=self.show_progress) as advance:
                if self.ray is None:
                    self._run_serial(todo, env, results, advance)
                else:
                    from harness.ray_sweep import run_on_ray

                    run_on_ray(self, todo, results, advance, meta)
            finished = True
        except KeyboardInterrupt:
            print(f"\ninterrupted: finished rows are in {results.path}; rerun the same command "
                  "to resume", file=sys.stderr)
            raise
        finally:
            meta["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat(
                timespec="seconds")
            meta["finished"] = finished  # False after a crash or Ctrl-C: rerun to resume
            if self.device.type == "cuda" and self.ray is None:
                meta["clocks_at_end"] = environment.gpu_clocks()
            self._write_meta(meta_path, runs)
        return results.path

    def _run_serial(self, todo, env, results: ResultsFile, advance) -> None:
        cells = CellRunner(self.spec, env)
        try:
            cells.prestart(todo)
            for cell, variant in todo:
                rows = cells.run(cell, variant, results)
                self.record(results, rows, cells.gradient_records)
                cells.gradient_records.clear()
                advance(label(cell, variant))
        finally:
            cells.close()

    def record(self, results: ResultsFile, rows: list[dict], gradients: list[dict]) -> None:
        """Write one (cell, variant)'s gradient records and rows (fsync'ed)."""
        if gradients:
            with (self.out_dir / GRADIENTS_JSONL).open("a") as f:
                for record in gradients:
                    f.write(json.dumps(record, default=float) + "\n")
        results.append(rows)

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


def default_preset(device: str, problem: str = DEFAULT) -> str:
    """`smoke` on CPU (seconds), `quick` on a GPU (about a minute on the H200); a problem with
    presets of its own uses `<problem>-smoke` and `<problem>-default` (openfold)."""
    own = f"{problem}-{'default' if device == 'cuda' else 'smoke'}"
    return own if own in PRESETS else ("quick" if device == "cuda" else "smoke")


def run_sweep(args) -> int:
    # The problem: the grid's own (`problem` in its [base]), else --problem, else the default;
    # a --problem that contradicts the grid is a usage error.
    if args.grid:
        grid = load_grid_file(args.grid, args.problem)
    else:
        grid = preset_grid(args.preset or default_preset(args.device, args.problem or DEFAULT),
                           args.problem)
    args.problem = grid.problem
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
    ray = None
    if args.ray is not None:
        from harness.ray_sweep import RayOptions, import_ray

        import_ray()  # a usage error, before anything runs, when Ray is missing
        ray = RayOptions(address=args.ray or None, workers=args.ray_workers)
    elif args.ray_workers:
        raise IPAInputError("--ray-workers: only with --ray")
    variants = selected_variants(args, with_baseline=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    path = Sweep(variants, grid, args.device, output, show_progress=not args.no_progress,
                 timeout_s=args.timeout, threads=args.threads, ray=ray).run()
    print(f"results: {path}")
    if not args.no_plots:
        plots = plot_results(path, output / "plots")
        for png in plots:
            print(f"plot: {png}")
        for message in plots.skipped:
            print(f"plot: {message}")
    rows = read_results(path)
    statuses = rows["status"].value_counts()
    print("rows: " + ", ".join(f"{n} {status}" for status, n in statuses.items()))
    failed = rows["status"].isin(["mismatch", "error"])
    declared = failed & has_flag(rows, "known-issue")
    if declared.any():
        print(f"{int(declared.sum())} of them the variants declare as known issues (flag "
              "known-issue, evidence in notes): not counted in the exit status")
    return EXIT_FAILED if (failed & ~declared).any() else EXIT_OK


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="run variants over a grid into a resumable CSV, then plot",
        description="Run every selected variant over a grid (a preset or a TOML file): "
        "correctness against the float64 oracle, latency, peak memory, cost model. Each "
        "finished cell is fsync'ed to DIR/results.csv; rerunning the same command resumes. "
        "Exit status 1 when a row is a mismatch or an error that its variant does not "
        "declare as a known issue.")
    p.add_argument("--preset", choices=list(PRESETS),
                   help="built-in grid (default: quick on cuda, smoke on cpu; with --problem "
                   "openfold: openfold-default, openfold-smoke)")
    add_problem_option(p, default=None)
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
    p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run the cells on Ray actors, one per GPU (one per CPU on cpu), the "
                   "CSV still written here: without ADDRESS a local Ray instance, with one "
                   "(`auto`, or HOST:PORT) that cluster (pip install 'ipa-bench[ray]'; "
                   "docs/distributed.md)")
    p.add_argument("--ray-workers", type=positive_int, metavar="N",
                   help="with --ray: how many actors (default: the cluster's GPUs on cuda, "
                   "its CPUs on cpu)")
    add_output_options(p, json_output=False)
    add_selection_options(p)
    add_timeout_option(p)
    p.set_defaults(run=run_sweep)
