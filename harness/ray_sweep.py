"""`sweep --ray`: the cells of a sweep on Ray actors, one per GPU; the driver writes the CSV.

Each actor (`CellActor`, holding `num_gpus=1`, or one CPU on CPU) owns a `CellRunner`: the
environment facts of its device, the oracle of its current cell, and the variants' worker
processes (started once per actor and kept warm, so builds and CUDA contexts are reused).
Its oracle and its workers share its GPU and nothing else does: a cell never shares a GPU,
and the timing protocol is the serial sweep's.

The driver (`run_on_ray`) sends whole cells (every variant still to do at one cell, baseline
first, with the medians already on disk for that cell, so `speedup_vs_baseline` and the
`review` flag come out as in a serial sweep), and writes each (cell, variant)'s rows to the
`ResultsFile` as the cell comes back (one fsync'ed write each): resumption, the lock and
the file's checks are the serial sweep's. An actor that dies (`ray.kill`, a lost node, a
crash of the actor itself) is replaced and its cell requeued, up to `RayOptions.retries`
times; then the cell's rows are `error` rows naming the reason. A cell is recorded only
from the one task that finished it, so never twice. Ctrl-C cancels what is queued, kills
the actors and leaves the CSV resumable.

`import ray` happens only here, and only for `--ray`.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.cells import (
    CellRunner,
    Environment,
    SweepSpec,
    cell_key,
    describe_environment,
    label,
    short_reason,
)
from harness.errors import RunFailure
from harness.grid import Cell
from harness.results import Medians, ResultsFile, cell_of_key
from variants.problem import IPAInputError

RETRIES = 2  # an actor that dies running a cell: the cell is requeued this many times
START_TIMEOUT_S = 600.0  # an actor that cannot start (no GPU left in the cluster) in this long
MISSING = "--ray: Ray is not installed; pip install 'ipa-bench[ray]'"


@dataclass
class RayOptions:
    """How `sweep --ray` runs. `address`: None starts a local Ray instance; `auto` or
    HOST:PORT joins a cluster. `workers`: how many actors (default: the cluster's GPUs on
    cuda, its CPUs on cpu). `resource`: a custom resource each actor holds instead of a GPU
    or CPU (the tests mark CPU actors as GPUs with it). `init_kwargs`: more `ray.init`
    arguments. `on_dispatch(actor, cell, attempt)`: called after each cell is sent (tests
    kill actors with it)."""

    address: str | None = None
    workers: int | None = None
    retries: int = RETRIES
    resource: str | None = None
    init_kwargs: dict = field(default_factory=dict)
    on_dispatch: Callable | None = None


def import_ray():
    """The `ray` module, or a usage error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise IPAInputError(MISSING) from None
    return ray


class CellActor:
    """A `CellRunner` on the device Ray gave this actor (wrapped by `ray.remote` in
    `_actor_class`, so this module imports without Ray)."""

    def __init__(self, spec: SweepSpec):
        import ray

        # Ray starts its workers at nice 15, and the timed worker processes this actor
        # spawns would inherit it: back to 0 where allowed (root, as on the GPU machine)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        device = torch.device(spec.device)
        if spec.threads:
            torch.set_num_threads(spec.threads)
        node_id = ray.get_runtime_context().get_node_id()
        env, self.meta = describe_environment(device, node=f"{socket.gethostname()}/{node_id[:8]}")
        self.meta.update(ray_node_id=node_id, pid=os.getpid())
        self.spec = spec
        self.cells = CellRunner(spec, env)

    def facts(self) -> dict:
        """The environment of this actor's device (its metadata.json entry)."""
        return self.meta

    def run(self, cell: Cell, names: list[str], medians: Medians) -> list[tuple[list, list]]:
        """Every named variant at `cell`, in order: per variant its rows and gradient
        records."""
        variants = [v for v in self.spec.variants if v.name in names]
        variants.sort(key=lambda v: names.index(v.name))
        self.cells.prestart([(cell, v) for v in variants])  # in parallel; running ones stay
        done = []
        for variant in variants:
            rows = self.cells.run(cell, variant, medians)
            medians.remember_rows(rows)  # the baseline's median for the variants after it
            done.append((rows, list(self.cells.gradient_records)))
            self.cells.gradient_records.clear()
        return done

    def close(self) -> None:
        self.cells.close()


def _actor_class(ray, device: str, options: RayOptions):
    resources = {"num_cpus": 1, "max_restarts": 0, "max_task_retries": 0}
    if options.resource:
        resources["resources"] = {options.resource: 1}
    elif device == "cuda":
        resources["num_gpus"] = 1
    return ray.remote(**resources)(CellActor)


def _resource(device: str, options: RayOptions) -> str:
    """The resource each actor holds one of."""
    return options.resource or ("GPU" if device == "cuda" else "CPU")


def _slot_count(ray, device: str, options: RayOptions, cells: int) -> int:
    name = _resource(device, options)
    have = int(ray.cluster_resources().get(name, 0))
    if have < 1:
        raise IPAInputError(f"--ray: the Ray cluster has no {name} resource for --device "
                            f"{device} (it has {sorted(ray.cluster_resources())})")
    if options.workers and options.workers > have:
        raise IPAInputError(f"--ray-workers {options.workers}: the Ray cluster has {have} "
                            f"{name}; each actor holds one")
    return max(1, min(options.workers or have, cells))


def _error_env(spec: SweepSpec, facts: dict) -> Environment:
    return Environment(torch.device(spec.device), facts["device_name"],
                       facts["copy_bandwidth_gbps"], None, node=facts["node"], gpu=facts["gpu"])


def run_on_ray(sweep, todo: list[tuple[Cell, object]], results: ResultsFile, advance,
               meta: dict) -> None:
    """Run `todo` ((cell, variant) pairs, cell-major, baseline first) of `sweep` on Ray
    actors, writing rows into `results` as cells finish; `meta` (this invocation's
    metadata.json entry) gets the actors' facts under `ray`."""
    ray = import_ray()
    from ray.exceptions import GetTimeoutError, RayActorError

    options, spec = sweep.ray, sweep.spec
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=options.address, include_dashboard=False, log_to_driver=False,
                 **options.init_kwargs)
    groups: dict[Cell, list] = {}
    for cell, variant in todo:
        groups.setdefault(cell, []).append(variant)
    info = {"address": options.address or "local", "actors": [], "requeued": [],
            "gave_up": []}
    meta["ray"] = info
    actors: list = []
    pending: dict = {}
    try:
        if not groups:
            return
        actor_class = _actor_class(ray, spec.device, options)
        slots = _slot_count(ray, spec.device, options, len(groups))
        facts: list[dict] = []

        def start(slot: int):
            actor = actor_class.remote(spec)
            try:
                fact = ray.get(actor.facts.remote(), timeout=START_TIMEOUT_S)
            except GetTimeoutError:
                ray.kill(actor)
                raise RunFailure(
                    f"Ray: no actor could start within {START_TIMEOUT_S:g} s (the cluster has "
                    f"no free {_resource(spec.device, options)}?); every finished row is in "
                    f"{results.path}: rerun the same command to resume") from None
            info["actors"].append({"slot": slot, **fact})
            return actor, fact

        for slot in range(slots):
            actor, fact = start(slot)
            actors.append(actor)
            facts.append(fact)
        meta["device_name"] = ", ".join(dict.fromkeys(f["device_name"] for f in facts))
        queue = deque((cell, variants, 0) for cell, variants in groups.items())
        idle = list(range(slots))
        while queue or pending:
            while queue and idle:
                slot = idle.pop(0)
                cell, variants, attempt = queue.popleft()
                modes = spec.grid.modes_for(cell, spec.device)
                medians = results.of_cell({cell_of_key(cell_key("", cell, m, spec.device))
                                           for m in modes})
                ref = actors[slot].run.remote(cell, [v.name for v in variants], medians)
                pending[ref] = (slot, cell, variants, attempt)
                if options.on_dispatch:
                    options.on_dispatch(actors[slot], cell, attempt)
            [ref], _ = ray.wait(list(pending), num_returns=1)
            slot, cell, variants, attempt = pending.pop(ref)
            try:
                done = ray.get(ref)
            except RayActorError as exc:
                reason = (f"the Ray actor on {facts[slot]['node']} (GPU "
                          f"{facts[slot]['gpu'] or '-'}) died: {short_reason(exc, limit=300)}")
                ray.kill(actors[slot])
                actors[slot], facts[slot] = start(slot)
                if attempt < options.retries:
                    info["requeued"].append({"cell": repr(cell), "reason": reason})
                    queue.appendleft((cell, variants, attempt + 1))
                else:
                    info["gave_up"].append({"cell": repr(cell), "reason": reason})
                    rows_of = CellRunner(spec, _error_env(spec, facts[slot]))
                    for variant in variants:
                        why = f"{reason}; gave up after {attempt + 1} attempts"
                        sweep.record(results, rows_of.error_rows(cell, variant, why), [])
                        advance(label(cell, variant))
                idle.append(slot)
                continue
            for variant, (rows, gradients) in zip(variants, done, strict=True):
                sweep.record(results, rows, gradients)
                advance(label(cell, variant))
            idle.append(slot)
    finally:
        for ref in pending:  # Ctrl-C or a failure: nothing more is recorded
            ray.cancel(ref)
        if not pending:
            try:
                ray.get([actor.close.remote() for actor in actors], timeout=30)
            except Exception:  # noqa: BLE001 - the actors are killed next in any case
                pass
        for actor in actors:
            ray.kill(actor)
        if started_here:
            ray.shutdown()

