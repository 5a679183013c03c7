"""One device's share of a sweep: `CellRunner` measures (cell, variant) pairs into rows.

It owns what a cell needs on one device: the environment facts (device name, copy
bandwidth, the L2 flusher, where it runs), the float64 oracle of the current cell
(`ReferenceCache`, in this process) and the variants' worker processes (`WorkerPool`). A
serial sweep (`harness.sweep.Sweep`) runs one in the driver; a Ray sweep
(`harness.ray_sweep`) one in each actor, one actor per GPU, so that a cell's oracle and its
variants' workers share that GPU and nothing else does. The caller writes the rows.

Per cell: unsupported -> a row with the reasons; otherwise, in the variant's worker process,
build (build and first-call time recorded as `build_s`), the correctness protocol against
the float64 oracle (computed here), timing for each mode, peak memory. Timed calls are
verified (docs/integrity.md): refilled inputs' outputs against the oracle, the host clock
against the device events, the median against the memory floor.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import socket
import time
from dataclasses import dataclass, field

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
from harness.grid import Cell, Grid
from harness.measure import (
    TRAINING_BYTES_FACTOR,
    TRAINING_FLOPS_FACTOR,
    L2Flusher,
    Timing,
    TimingPolicy,
    copy_bandwidth_gbps,
    host_bound,
    host_op_us,
)
from harness.problems import DEFAULT, problem_of
from harness.results import (
    KEY_COLUMNS,
    NOISY_REL_NOISE,
    REVIEW_SPEEDUP,
    Medians,
    cell_of_key,
    row_key,
    slow_host,
    variant_of_key,
)
from harness.runner import BuildSpec, InputRecipe, free_device_memory
from harness.scan import row_flags
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
from variants.problem import get_precision
from variants.registry import BUILTIN

_RANDOM = random.SystemRandom()  # refill seeds and sample indices no variant can predict
BUILTIN_NAMES = frozenset(cls.name for cls in BUILTIN)
# Wall-clock cross-check: a batch of about WALL_BATCH_S seconds of back-to-back calls; each
# may take up to WALL_SLACK x the event median plus WALL_ALLOWANCE_MS by the host clock, and
# the device may stay busy after a sample's end event (WALL_SLACK - 1) x the median plus it.
WALL_BATCH_S = 0.05
WALL_SLACK = 1.5
WALL_ALLOWANCE_MS = 0.05
# A slow batch is measured again before the row is called suspect: once, on the H200, a
# host-bound honest cell's batch ran at 2x its sampled time (torch-compile, openfold bf16
# N = 256), which hidden work would repeat and a host hiccup would not.
WALL_BATCHES = 2


def cell_key(variant: str, cell: Cell, mode: str, device: str) -> tuple[str, ...]:
    return row_key(dict(problem=problem_of(cell.config).name, variant=variant,
                        batch=cell.batch, length=cell.length, **cell.config.columns(),
                        dtype=cell.precision, mode=mode, device=device,
                        **{"pass": cell.pass_name}))


def min_bytes(config, batch: int, length: int, element_size: int,
              pass_name: str = "forward") -> int:
    """The problem's cost model: the bytes a call must move (a training step: three times
    the forward's, `measure.TRAINING_BYTES_FACTOR`)."""
    factor = 1 if pass_name == "forward" else TRAINING_BYTES_FACTOR
    return factor * problem_of(config).min_bytes(config, batch, length, element_size)


def flops(config, batch: int, length: int, pass_name: str = "forward") -> int:
    """The problem's cost model: the FLOPs of a call (a training step: three times)."""
    factor = 1 if pass_name == "forward" else TRAINING_FLOPS_FACTOR
    return factor * problem_of(config).flops(config, batch, length)


def label(cell: Cell, variant: Variant) -> str:
    """The progress bar's name of a (cell, variant)."""
    problem = problem_of(cell.config).name
    return (f"{'' if problem == DEFAULT else problem + ' '}{variant.name} {cell.precision} "
            f"B={cell.batch} N={cell.length} H={cell.config.columns()['heads']}")


def short_reason(exc: BaseException | str, limit: int = 400) -> str:
    """An exception (or its text) on one line of at most `limit` characters."""
    text = exc if isinstance(exc, str) else f"{exception_name(exc)}: {exc}"
    text = text.strip().replace("\n", " | ")
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


def this_gpu(device: torch.device) -> str:
    """The GPU this process runs on, as the machine numbers it: the first entry of
    CUDA_VISIBLE_DEVICES (Ray sets it per actor) or torch's current device; '' on CPU."""
    if device.type != "cuda":
        return ""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or str(torch.cuda.current_device())


@dataclass
class Environment:
    """What every row of one device says about where it ran."""

    device: torch.device
    device_name: str
    bandwidth_gbps: float
    flusher: L2Flusher | None
    node: str = field(default_factory=socket.gethostname)
    gpu: str = ""
    # the host's speed (`measure.host_op_us`): at the run's start, then the fastest of that and
    # every row's since (a run that starts on a slowed host still flags its slow rows)
    host_op_us: float = math.nan

    def judge_host_speed(self, speed_us: float, bound: bool) -> tuple[bool, float]:
        """(whether a row timed with the host at `speed_us` is `slow-host`: host-bound and
        `SLOW_HOST` times slower than the fastest host seen, that fastest); then `speed_us`
        joins what was seen. NaN (unknown) on either side judges nothing slow."""
        reference = self.host_op_us
        if speed_us < reference or math.isnan(reference):
            self.host_op_us = speed_us
        return bound and slow_host(speed_us, reference), reference


def describe_environment(device: torch.device, node: str | None = None,
                         gpu: str | None = None) -> tuple[Environment, dict]:
    """Device facts for every row, and the metadata JSON for this invocation."""
    meta = environment.describe(device)
    flusher = L2Flusher(device) if device.type == "cuda" else None
    bandwidth = copy_bandwidth_gbps(device, nbytes=(1 << 30) if device.type == "cuda" else 1 << 27)
    meta["copy_bandwidth_gbps"] = bandwidth
    meta["host_op_us"] = host_op_us(device)
    env = Environment(device, meta["device_name"], bandwidth, flusher,
                      node=node or socket.gethostname(),
                      gpu=this_gpu(device) if gpu is None else gpu,
                      host_op_us=meta["host_op_us"])
    meta.update(node=env.node, gpu=env.gpu)
    return env, meta


@dataclass
class SweepSpec:
    """What every CellRunner of one sweep invocation shares (picklable: a Ray actor gets a
    copy). `variants` are in the sweep's order, baseline first."""

    variants: list[Variant]
    grid: Grid
    device: str
    run_id: str
    started_at: str
    scan: dict
    digests: dict[str, str]
    timeout_s: float = DEFAULT_TIMEOUT_S
    threads: int | None = None

    def reasons(self, cell: Cell, variant: Variant) -> list[str]:
        """Why `variant` cannot run `cell` here (a forward-only variant's training rows)."""
        return pass_reasons(variant, cell.pass_name, self.device) or (
            variant.not_supported_reasons(cell.config, self.device, cell.precision))

    def worker_groups(self, pairs) -> list[tuple[Variant, str, str]]:
        """The (variant, device, dtype) worker groups that the (cell, variant) pairs need."""
        return sorted({(variant, self.device, cell.precision) for cell, variant in pairs
                       if not self.reasons(cell, variant)}, key=str)


class CellRunner:
    """Measures (cell, variant) pairs on one device: `run(cell, variant, medians)` returns
    the rows of every timing mode (never raises for a variant's failure). `medians` holds
    the medians already known for the cell (the baseline's for `speedup_vs_baseline`, the
    built-in `ok` rows' for the `review` flag): the `ResultsFile` in a serial sweep, a
    `Medians` of the cell in a Ray actor. Training cells leave their per-tensor gradient
    figures in `gradient_records` for the caller to write."""

    def __init__(self, spec: SweepSpec, env: Environment):
        self.spec, self.env = spec, env
        self.device = torch.device(spec.device)
        self.workers = WorkerPool(timeout_s=spec.timeout_s, threads=spec.threads)
        self.gradient_records: list[dict] = []
        self._state_dicts: dict = {}
        self._references: tuple[Cell, ReferenceCache] | None = None
        self._refill_seeds: dict[Cell, int] = {}

    def prestart(self, pairs) -> None:
        """Start the worker processes that `pairs` ((cell, variant)) need, in parallel."""
        self.workers.prestart(self.spec.worker_groups(pairs))

    def close(self) -> None:
        self.workers.close()

    def references(self, cell: Cell) -> ReferenceCache:
        """The oracle of `cell`, computed once per cell (the variants of a cell share it)."""
        if self._references is None or self._references[0] != cell:
            if cell.config not in self._state_dicts:
                self._state_dicts.clear()
                self._state_dicts[cell.config] = problem_of(cell.config).init_state_dict(
                    cell.config)
            self._references = (cell, ReferenceCache(self._state_dicts[cell.config]))
        return self._references[1]

    def run(self, cell: Cell, variant: Variant, medians: Medians) -> list[dict]:
        return self._run_cell(cell, variant, self.references(cell), self.env, medians,
                              self.workers)

    def error_rows(self, cell: Cell, variant: Variant, reason: str) -> list[dict]:
        """`error` rows for every mode of (cell, variant): a failure outside the variant."""
        return [self._row(cell, variant, mode, self.env, status="error", reason=reason)
                for mode in self.spec.grid.modes_for(cell, self.device.type)]

    def _row(self, cell: Cell, variant: Variant, mode: str, env: Environment, **values) -> dict:
        c, precision = cell.config, get_precision(cell.precision)
        row = {
            "run_id": self.spec.run_id, "started_at": self.spec.started_at,
            "problem": problem_of(c).name, "variant": variant.name,
            "is_baseline": variant.is_baseline, "batch": cell.batch, "length": cell.length,
            **c.columns(), "dtype": precision.name,
            "math_mode": variant.math_mode_label(precision, c), "mode": mode,
            "pass": cell.pass_name, "device": self.device.type, "device_name": env.device_name,
            "code_digest": self.spec.digests[variant.name],
            "node": env.node, "gpu": env.gpu,
        }
        floor_ms = (min_bytes(c, cell.batch, cell.length, precision.dtype.itemsize,
                              cell.pass_name) / (env.bandwidth_gbps * 1e9) * 1e3)
        row["floor_ms"] = floor_ms
        row.update(values)
        scan_flags = row_flags(self.spec.scan[variant.name], row["dtype"])
        row["flags"] = ";".join(filter(None, [row.get("flags", ""), *scan_flags]))
        return row

    def _run_cell(self, cell: Cell, variant: Variant, references: ReferenceCache,
                  env: Environment, medians: Medians, workers: WorkerPool) -> list[dict]:
        modes = self.spec.grid.modes_for(cell, self.device.type)
        device = self.device.type
        reasons = self.spec.reasons(cell, variant)
        if reasons:
            return [self._row(cell, variant, m, env, status="unsupported",
                              reason="; ".join(reasons)) for m in modes]
        precision = get_precision(cell.precision)
        worker = workers.get(variant, device, precision.name)
        try:
            return self._measure(cell, variant, references, env, modes, precision, medians,
                                 worker)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a row
            status = "oom" if is_oom(exc) else "error"
            return [self._row(cell, variant, m, env, status=status, reason=short_reason(exc))
                    for m in modes]
        finally:
            try:
                worker.release()
            except (VariantRaised, WorkerFailure):
                pass  # a broken worker is replaced at its next call
            free_device_memory()

    def _measure(self, cell, variant, references, env, modes, precision, medians,
                 worker: Worker) -> list[dict]:
        device = self.device.type
        build = BuildSpec(("cell", cell.config), references.state_dict, cell.config,
                          precision.name)
        # The timed inputs are the first correctness draw, whose oracle is already computed.
        timing_inputs = correctness_recipes(cell.config, cell.batch, cell.length, device,
                                            precision, seeds=1)[0]
        build_s = worker.build(build, first_call=timing_inputs)
        check = check_variant(variant, cell.config, batch=cell.batch, length=cell.length,
                              device=device, precision=precision, seeds=self.spec.grid.seeds,
                              references=references, runner=worker, build=build,
                              pass_name=cell.pass_name)
        if check.gradients:
            self._write_gradients(cell, variant, check)
        free_device_memory()
        notes = variant.known_issues(cell.config, cell.batch, cell.length, device,
                                     precision.name)
        known = "known-issue" if notes else ""
        chunk = rows_per_chunk(cell.config, cell.batch, cell.length)
        if chunk < cell.length:
            notes.append(f"oracle and reference error computed in chunks of {chunk} query rows")
        if cell.pass_name != "forward":
            grad_chunk = rows_per_chunk(cell.config, cell.batch, cell.length, training=True)
            if grad_chunk < cell.length:
                notes.append(f"oracle and reference gradients computed in chunks of "
                             f"{grad_chunk} query rows")
        untimed = variant.untimed_reason(device)
        if untimed:
            kernel = worker.kernel(build)
            return [{**self._untimed_row(cell, variant, mode, env, check, build_s, untimed,
                                         notes, known), "kernel": kernel} for mode in modes]
        if device != "cuda":
            notes.append("peak memory not measured on CPU")
        policy = TimingPolicy(budget_s=self.spec.grid.budget_s,
                              host_spin_ms=self.spec.grid.host_spin_ms)
        refills = self._refills(cell, policy, timing_inputs)
        timed = worker.time(build, timing_inputs, modes, policy, refills, cell.pass_name)
        kernel = worker.kernel(build)
        rows = []
        for mode in modes:
            if mode in timed.failures:  # the eager check passed or failed on its own
                rows.append(self._row(
                    cell, variant, mode, env, status="error", build_s=build_s, kernel=kernel,
                    reason=short_reason(f"CUDA-graph capture failed: {timed.failures[mode]}"),
                    **_correctness_columns(check), notes="; ".join(notes)))
                continue
            row = self._timed_row(cell, variant, mode, env, timed.timings[mode], check,
                                  build_s, timed.peak_mib, notes, medians, known,
                                  timed.host_op_us.get(mode, math.nan))
            suspicions = self._verify_refills(refills, timed.refill_outputs[mode], references,
                                              precision)
            if device == "cuda":
                suspicions += self._unseen_work(worker, mode, timed.timings[mode])
            if suspicions and row["status"] == "ok":
                row["status"] = "suspect"
            row["reason"] = "; ".join(filter(None, [row["reason"], *suspicions]))
            row["kernel"] = kernel
            rows.append(row)
        if timed.failures:  # an invalidated capture can leave the worker's CUDA state unusable
            worker.close()
        return rows

    def _write_gradients(self, cell: Cell, variant: Variant, check: CheckResult) -> None:
        """Keep the per-tensor gradient figures of a training cell for gradients.jsonl (each
        tensor's worst seed; the row carries the worst tensor)."""
        self.gradient_records.append({
            "run_id": self.spec.run_id, "code_digest": self.spec.digests[variant.name],
            "key": dict(zip(KEY_COLUMNS, cell_key(variant.name, cell, "eager",
                                                  self.device.type), strict=True)),
            "gradients": check.gradients})

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
            judgement = judge_output(output, figures.oracle, figures.reference_err, precision,
                                     figures.parts, figures.part_errs)
            if not judgement.passed:
                return [f"timed call {index} after its inputs were refilled in place with "
                        f"fresh values does not match the oracle of those values "
                        f"({'; '.join(judgement.failures)}): a stale, memoised or unwritten "
                        "output"]
        return []

    @staticmethod
    def _unseen_work(worker: Worker, mode: str, timing: Timing) -> list[str]:
        """Work on another stream (or a patched timer): the device still busy after each
        sample's end event, and the host wall clock over a batch of back-to-back calls between
        two device-wide synchronisations, each against the event median."""
        trailing_limit_ms = (WALL_SLACK - 1) * timing.median_ms + WALL_ALLOWANCE_MS
        if timing.trailing_ms > trailing_limit_ms:
            return [f"work outside the timed stream: after each timed call's end event the "
                    f"device stayed busy for {timing.trailing_ms:.4g} ms (median, host clock "
                    f"around a device-wide synchronize), the device events "
                    f"{timing.median_ms:.4g} ms (limit {trailing_limit_ms:.4g} ms)"]
        calls = max(3, min(200, math.ceil(WALL_BATCH_S * 1e3 / timing.median_ms)))
        round_trip = min(_seconds(worker.ping) for _ in range(3))
        limit_ms = WALL_SLACK * timing.median_ms + WALL_ALLOWANCE_MS
        per_call_ms = math.inf
        for _ in range(WALL_BATCHES):
            per_call_ms = min(per_call_ms, (_seconds(lambda: worker.wall(mode, calls))
                                            - round_trip) / calls * 1e3)
            if per_call_ms <= limit_ms:
                return []
        return [f"work outside the timed stream: {calls} back-to-back calls took "
                f"{per_call_ms:.4g} ms each by the host clock around a device-wide "
                f"synchronize (the faster of {WALL_BATCHES} batches), the device events "
                f"{timing.median_ms:.4g} ms (limit {limit_ms:.4g} ms)"]

    def _untimed_row(self, cell, variant, mode, env, check: CheckResult, build_s,
                     why: str, notes: list[str], known: str) -> dict:
        return self._row(
            cell, variant, mode, env, status="interpreted" if check.passed else "mismatch",
            reason="; ".join([*check.failures, why]), build_s=build_s,
            **_correctness_columns(check), notes="; ".join(notes), flags=known)

    def _timed_row(self, cell, variant, mode, env, timing: Timing, check: CheckResult,
                   build_s, peak, notes, medians: Medians, known: str,
                   host_speed: float) -> dict:
        status = "ok" if check.passed else "mismatch"
        key = cell_key(variant.name, cell, mode, self.device.type)
        cell_part = cell_of_key(key)
        base_ms = (timing.median_ms if variant.is_baseline
                   else medians.baseline_ms.get(cell_part))
        best_builtin = min((ms for k, ms in medians.ok_ms.items()
                            if cell_of_key(k) == cell_part and variant_of_key(k) in BUILTIN_NAMES),
                           default=None)
        review = (variant.name not in BUILTIN_NAMES and best_builtin is not None
                  and timing.median_ms * REVIEW_SPEEDUP < best_builtin)
        host = host_bound(timing)
        slow, fastest = env.judge_host_speed(host_speed, host)
        host_notes = [f"host-bound: the host took {timing.host_ms:.4g} ms to issue the call, "
                      f"the device events {timing.median_ms:.4g} ms"] if host else []
        if slow:
            host_notes.append(f"slow host: {host_speed:.3g} us a small torch op just before "
                              f"the samples, {fastest:.3g} us the fastest of the run")
        row = self._row(
            cell, variant, mode, env, status=status, reason="; ".join(check.failures),
            build_s=build_s, median_ms=timing.median_ms, p20_ms=timing.p20_ms,
            p80_ms=timing.p80_ms, n_samples=timing.n_samples, rel_noise=timing.rel_noise,
            host_ms="" if math.isnan(timing.host_ms) else timing.host_ms,
            host_op_us="" if math.isnan(host_speed) else host_speed,
            peak_mem_mib="" if peak is None else peak, **_correctness_columns(check),
            speedup_vs_baseline=(base_ms / timing.median_ms) if base_ms else "",
            tflops=flops(cell.config, cell.batch, cell.length, cell.pass_name)
            / (timing.median_ms * 1e-3) / 1e12,
            notes="; ".join([*notes, *host_notes]),
            flags=";".join(f for f in (known, "noisy" if timing.rel_noise > NOISY_REL_NOISE
                                       else "", "review" if review else "",
                                       "host-bound" if host else "",
                                       "slow-host" if slow else "") if f),
        )
        row["pct_of_floor"] = 100.0 * row["floor_ms"] / timing.median_ms
        if timing.median_ms < row["floor_ms"]:  # physics: faster than reading the inputs once
            if row["status"] == "ok":  # a mismatch stays a mismatch, with this reason too
                row["status"] = "suspect"
            row["reason"] = "; ".join(filter(None, [row["reason"], (
                f"median {timing.median_ms:.4g} ms is below the memory floor "
                f"{row['floor_ms']:.4g} ms (min bytes over the measured copy bandwidth): the "
                "work cannot all have been done in the timed call")]))
        return row
