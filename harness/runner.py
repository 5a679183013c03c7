"""Running one variant: build it, call it on recipes of inputs, time it.

`LocalRunner` does this in the calling process. `harness.worker.Worker` runs a `LocalRunner`
in a worker process, so that the harness (inputs' seeds, the float64 oracle, the tolerance,
the verdict) never shares an interpreter with a variant's code. Everything that crosses
between them is picklable: a `BuildSpec` and `InputRecipe`s go in (the worker draws the
tensors from the recipe's seed), and outputs (on the CPU), timings and failures come back.

The timed calls are verified (`LocalRunner.time`): at sample indices the caller draws and the
variant cannot predict, the inputs are refilled in place (same storage, fresh values) and
that sample's output is sent back, for the caller to judge against the oracle of the new
values. A variant that memoises by address or leaves its output unwritten fails there.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass, field

import torch

from harness.measure import (
    L2Flusher,
    Timing,
    TimingPolicy,
    capture_cuda_graph,
    host_op_us,
    peak_memory_mib,
    time_cpu,
    time_cuda,
)
from variants.base import IPAFunction, Variant
from variants.problem import (
    ForwardInputs,
    IPAConfig,
    IPAInputs,
    get_precision,
    math_mode,
    random_rigid_motion,
)

INPUT_NAMES = ("node_repr", "pair_repr", "translations", "rotations")
PASSES = ("forward", "forward+backward")
GRAD_OUT_SEED = 31_337


def rigid_motion(inputs: IPAInputs, seed: int, shift_angstrom: float = 50.0) -> IPAInputs:
    """Apply one global rigid motion (R_g, t_g) to every frame: R_i -> R_i R_g,
    t_i -> t_i R_g + t_g (computed in float64, then stored in the inputs' dtype)."""
    r_g, t_g = random_rigid_motion(seed, shift_angstrom)
    device, dtype = inputs.node_repr.device, inputs.node_repr.dtype
    r_g, t_g = r_g.to(device), t_g.to(device)
    rot = inputs.rotations.double() @ r_g
    trans = inputs.translations.double() @ r_g + t_g
    return IPAInputs(
        inputs.node_repr, inputs.pair_repr, trans.to(dtype), rot.to(dtype)
    )


@dataclass(frozen=True)
class InputRecipe:
    """How to draw one set of inputs: the seeded generator's arguments, an optional rigid
    motion of the frames, and an optional `diagnose` probe (by name) that changes the values
    and the memory layout the variant sees."""

    config: IPAConfig
    batch: int
    length: int
    precision: str
    device: str
    seed: int
    origin_offset: float = 100.0
    motion_seed: int | None = None
    probe: str | None = None

    def _probe(self):
        from harness.probes import probe_named  # the probes import nothing of the harness

        return probe_named(self.probe) if self.probe else None

    def values(self) -> ForwardInputs:
        """The input values (the oracle sees these, upcast), drawn by the problem of
        `config` (`harness.problems`)."""
        from harness.problems import problem_of

        problem = problem_of(self.config)
        inputs = problem.make_inputs(self.config, self.batch, self.length,
                                     dtype=get_precision(self.precision).dtype,
                                     device=self.device, seed=self.seed,
                                     origin_offset=self.origin_offset)
        probe = self._probe()
        if probe and probe.inputs:
            inputs = probe.inputs(inputs)
        if self.motion_seed is not None:
            inputs = problem.rigid_motion(inputs, self.motion_seed)
        return inputs

    def presented(self, values: IPAInputs) -> IPAInputs:
        """A copy of `values` as the variant gets them (in the probe's layout, if any)."""
        probe = self._probe()
        copy = values.clone()
        return probe.layout(copy) if probe and probe.layout else copy

    def moved(self, motion_seed: int) -> InputRecipe:
        return dataclasses.replace(self, motion_seed=motion_seed)

    def grad_output(self, values: ForwardInputs | None = None) -> torch.Tensor:
        """The fixed random `grad_out` of a training step on these inputs (drawn in float64,
        stored in the recipe's dtype; the oracle upcasts the same values), zero outside the
        rows of the problem's first output part (openfold: on the masked rows, whose outputs
        a model discards, as its loss would). `values`: this recipe's `values()`, drawn here
        when not given."""
        from harness.problems import problem_of

        values = self.values() if values is None else values
        g = torch.Generator().manual_seed(GRAD_OUT_SEED + self.seed)
        grad = torch.randn(self.batch, self.length, self.config.columns()["node_dim"],
                           generator=g, dtype=torch.float64)
        rows = next(iter(problem_of(self.config).output_parts(values).values()))
        grad = grad * rows.to("cpu", torch.float64)[:, :, None]
        return grad.to(self.device, get_precision(self.precision).dtype)


@dataclass(frozen=True)
class BuildSpec:
    """What to build: `key` names the built function within one runner."""

    key: tuple
    state_dict: dict[str, torch.Tensor]
    config: IPAConfig
    precision: str


@dataclass
class RunOutput:
    """One call's result: the output (detached copy; on the CPU when it crossed from a
    worker), the type of what was returned, the inputs the call modified in place, and for a
    training step the gradient of every input and parameter by name (None: no gradient)."""

    out: torch.Tensor | None
    returned: str
    modified: list[str]
    grads: dict[str, torch.Tensor | None] | None = None


@dataclass
class TimedRun:
    """`LocalRunner.time`: a Timing per mode, the peak memory (MiB, CUDA only), per mode the
    outputs of the refilled samples (in the order of the refills asked for), and the modes
    that could not run, with the exception (a CUDA graph that failed to capture)."""

    timings: dict[str, Timing]
    peak_mib: float | None
    refill_outputs: dict[str, list[RunOutput]]
    failures: dict[str, str] = field(default_factory=dict)
    # CUDA: per mode, the worker's host speed just before its samples (`measure.host_op_us`)
    host_op_us: dict[str, float] = field(default_factory=dict)


def input_names(inputs: ForwardInputs) -> tuple[str, ...]:
    """The forward's argument names of a problem's inputs, in order."""
    return tuple(f.name for f in dataclasses.fields(inputs))


def modified_inputs(after: ForwardInputs, before: ForwardInputs) -> list[str]:
    return [name for name, now, then in zip(input_names(after), after.as_tuple(),
                                            before.as_tuple(), strict=True)
            if not torch.equal(now, then)]


def free_device_memory(collect: bool = True) -> None:
    """Hand the CUDA caching allocator's free blocks back to the device, so that the other
    process on the GPU (the harness and its variant's worker take turns) can allocate them;
    first collect garbage unless `collect` is False (where what was freed held no reference
    cycle: a collection costs ~0.13 s in a process that has imported the harness)."""
    if collect:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _copy(t: torch.Tensor, to_cpu: bool) -> torch.Tensor:
    t = t.detach()
    return t.cpu() if to_cpu else t.clone()


def _run_output(out: object, modified: list[str], to_cpu: bool, grads=None) -> RunOutput:
    if grads is not None:
        grads = {name: None if g is None else _copy(g, to_cpu) for name, g in grads.items()}
    if not isinstance(out, torch.Tensor):
        return RunOutput(None, type(out).__name__, modified, grads)
    return RunOutput(_copy(out, to_cpu), "Tensor", modified, grads)


def trainable_parameters(fn: IPAFunction) -> dict[str, torch.Tensor]:
    """The built function's parameters by state_dict name: `fn.parameters()` ((name,
    tensor) pairs) where the variant says, else those of `fn.module` (a torch.nn.Module with
    the reference's names), else none (its parameter gradients are then missing)."""
    parameters = getattr(fn, "parameters", None)
    if callable(parameters):
        return dict(parameters())
    module = getattr(fn, "module", None)
    return dict(module.named_parameters()) if isinstance(module, torch.nn.Module) else {}


def training_step(fn: IPAFunction, args: tuple, params: dict[str, torch.Tensor],
                  grad_out: torch.Tensor,
                  names: tuple[str, ...] = INPUT_NAMES) -> tuple[object, dict]:
    """Forward, then the gradients of `grad_out . output` for every input in `args` that
    requires grad (by its name in `names`, the forward's argument names; a problem's mask
    does not) and every parameter (by name; None where autograd found no path). Those inputs
    and `params` must be leaves."""
    leaves = {n: a for n, a in zip(names, args, strict=True) if a.requires_grad} | params
    with torch.enable_grad():
        out = fn(*args)
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            return out, dict.fromkeys(leaves)
        grads = torch.autograd.grad(out, list(leaves.values()), grad_out, allow_unused=True)
    return out, dict(zip(leaves, grads, strict=True))


def _detached(out: object) -> object:
    """`out` without its autograd graph. A kept training output whose graph is alive holds its
    leaves' AccumulateGrad nodes, bound to the stream they ran on; a CUDA-graph capture on
    another stream then syncs with that stream and is invalidated (PyTorch warns of this)."""
    if isinstance(out, torch.Tensor):
        return out.detach()
    if isinstance(out, (tuple, list)):
        return type(out)(_detached(o) for o in out)
    return out


def leaf_inputs(inputs: ForwardInputs,
                grad_inputs: tuple[str, ...] | None = None) -> tuple[torch.Tensor, ...]:
    """The inputs as fresh leaves (a training step's arguments), those named in
    `grad_inputs` (default: the problem's differentiable inputs) requiring grad."""
    if grad_inputs is None:
        grad_inputs = _grad_inputs(inputs)
    return tuple(t.detach().requires_grad_(name in grad_inputs)
                 for name, t in zip(input_names(inputs), inputs.as_tuple(), strict=True))


def _grad_inputs(inputs: ForwardInputs) -> tuple[str, ...]:
    """The differentiable inputs of the problem whose inputs class `inputs` is."""
    from harness.problems import PROBLEMS

    for problem in PROBLEMS.values():
        if isinstance(inputs, problem.inputs_class):
            return problem.grad_inputs
    raise TypeError(f"inputs: expected one of the problems' inputs, got {type(inputs).__name__}")


class LocalRunner:
    """Builds and runs one variant on one device in this process. `to_cpu` moves outputs to
    the CPU (a worker sends them across a pipe); otherwise they are copies on the device."""

    def __init__(self, variant: Variant, device: str, *, to_cpu: bool = False):
        self.variant = variant
        self.device = torch.device(device).type
        self.to_cpu = to_cpu
        self._built: dict[tuple, IPAFunction] = {}
        self._timed: tuple[tuple, dict] | None = None  # (build key, mode -> timed callable)
        self._flusher: L2Flusher | None = None

    def adopt(self, key: tuple, fn: IPAFunction) -> None:
        """Use an already built `fn` under `key`."""
        self._built[key] = fn

    def _function(self, spec: BuildSpec) -> IPAFunction:
        if spec.key not in self._built:
            self._built[spec.key] = self.variant.build(spec.state_dict, spec.config, self.device,
                                                       get_precision(spec.precision))
        return self._built[spec.key]

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def build(self, spec: BuildSpec, first_call: InputRecipe | None = None) -> float:
        """Build (if not built yet) and make one call on `first_call`'s inputs; returns the
        seconds both took (a CUDA build, Triton compilation, lazy initialisation)."""
        with math_mode(spec.precision), torch.no_grad():
            t0 = time.perf_counter()
            fn = self._function(spec)
            if first_call is not None:
                fn(*first_call.presented(first_call.values()).as_tuple())
            self._sync()
            return time.perf_counter() - t0

    def outputs(self, spec: BuildSpec, recipes: list[InputRecipe], pass_name: str = "forward",
                gradients: bool = True) -> list[RunOutput]:
        """One call per recipe, each on fresh tensors, with the inputs it modified; for
        `forward+backward`, a training step with every gradient (with `gradients=False` the
        step runs whole but only its output comes back: the invariance run, whose d pair_repr
        would cross from a worker for nothing, 8 GiB at fp32 N = 4096).

        Only the presented inputs live during the call: the pristine values the inputs are
        compared with afterwards are drawn again from the seeded recipe then, so a call holds
        one copy of pair_repr, not two (fp32 N = 4096: 8 GiB; a training check there ran an
        80 GB H100 out of memory beside the parent's float64 oracle gradients)."""
        results = []
        with math_mode(spec.precision), torch.no_grad():
            fn = self._function(spec)
            params = self._trainable(fn) if pass_name != "forward" else {}
            for recipe in recipes:
                inputs = recipe.presented(recipe.values())
                grads = None
                if pass_name == "forward":
                    out = fn(*inputs.as_tuple())
                else:
                    grad_out = recipe.grad_output(inputs)
                    args = leaf_inputs(inputs)
                    out, grads = training_step(fn, args, params, grad_out, input_names(inputs))
                    inputs = type(inputs)(*(t.detach() for t in args))
                    del args, grad_out
                output = _run_output(out, [], self.to_cpu, grads if gradients else None)
                del out, grads
                output.modified = modified_inputs(inputs, recipe.values())
                results.append(output)
                del inputs
        if self.to_cpu:  # a worker: its caching allocator's blocks go back to the device for
            free_device_memory(collect=False)  # the parent's oracle (N = 4096 training: 33 GiB)
        return results

    @staticmethod
    def _trainable(fn: IPAFunction) -> dict[str, torch.Tensor]:
        params = trainable_parameters(fn)
        for p in params.values():
            p.requires_grad_(True)
        return params

    def time(self, spec: BuildSpec, recipe: InputRecipe, modes: list[str],
             policy: TimingPolicy, refills: list[tuple[int, InputRecipe]],
             pass_name: str = "forward") -> TimedRun:
        """Time each mode on `recipe`'s inputs: a forward call, or a training step (forward
        and every gradient). Before sample `i` of each `(i, r)` in `refills` the inputs are
        refilled in place with `r`'s values, and sample i's output is kept (copied after the
        sample, outside the timed region)."""
        with math_mode(spec.precision), torch.no_grad():
            fn = self._function(spec)
            holder: list = [None]
            if pass_name == "forward":
                args = recipe.presented(recipe.values()).as_tuple()

                def call():
                    holder[0] = fn(*args)
            else:
                values = recipe.values()
                presented = recipe.presented(values)
                args, names = leaf_inputs(presented), input_names(presented)
                params, grad_out = self._trainable(fn), recipe.grad_output(values)
                del values, presented

                def call():  # the output's values only: its autograd graph is let go
                    holder[0] = _detached(training_step(fn, args, params, grad_out, names)[0])

            refill_at = dict(refills)
            timings, kept, callables, failures, host_speed = {}, {}, {}, {}, {}
            peak = None
            if self.device == "cuda":
                self._flusher = self._flusher or L2Flusher(torch.device("cuda"))
                peak = peak_memory_mib(call, torch.device("cuda"))
                holder[0] = None
            for mode in modes:
                outputs: list[RunOutput] = []
                pending = [False]

                def before_sample(i: int, outputs=outputs, pending=pending) -> None:
                    if pending[0]:  # the previous sample ran on refilled inputs
                        self._sync()
                        outputs.append(_run_output(holder[0], [], self.to_cpu))
                        pending[0] = False
                    if i in refill_at:
                        for target, fresh in zip(args, refill_at[i].values().as_tuple(),
                                                 strict=True):
                            target.copy_(fresh)
                        self._sync()
                        pending[0] = True

                if mode == "graph":
                    try:
                        timed = capture_cuda_graph(call)
                    except Exception as exc:  # noqa: BLE001 - the other modes still run
                        failures[mode] = f"{type(exc).__name__}: {exc}"
                        holder[0] = None
                        continue
                else:
                    timed = call
                callables[mode] = timed
                if self.device == "cuda":
                    host_speed[mode] = host_op_us(torch.device("cuda"))
                    timings[mode] = time_cuda(timed, policy, self._flusher, before_sample)
                else:
                    timings[mode] = time_cpu(timed, policy, before_sample)
                kept[mode] = outputs
            self._timed = (spec.key, callables)
            return TimedRun(timings, peak, kept, failures, host_speed)

    def wall(self, mode: str, calls: int) -> None:
        """`calls` back-to-back calls of the last timed `mode`, between two device-wide
        synchronisations: the caller times this with its own clock."""
        if self._timed is None:
            raise RuntimeError("wall() before time()")
        timed = self._timed[1][mode]
        with torch.no_grad():
            self._sync()
            for _ in range(calls):
                timed()
            self._sync()

    def kernel(self, spec: BuildSpec) -> str:
        """Which kernel the built function's last call ran (its `kernel_info`), or ''."""
        info = getattr(self._function(spec), "kernel_info", None)
        return str(info()) if info else ""

    def ping(self) -> None:
        """Nothing: the caller measures the round trip."""

    def release(self) -> None:
        """Drop every built function and timed input, and return memory to the device."""
        self._built.clear()
        self._timed = None
        free_device_memory()

