"""Triton launches at the compiled kernel's own cost after the first call (#17's eager rows).

`kernel[grid](*args)` in triton 3.6 binds and specialises every argument on each call (a
tensor's dtype and 16-byte alignment; an integer's value 1, divisibility by 16 and width),
builds a cache key from the result and looks the compiled kernel up; an autotuned kernel first
looks its configuration up the same way. On the H100 that is the largest share of the `triton`
forward's ~0.5 ms of host time at N <= 1024 (five launches; `gpu_diagnostics/profile_call.py
--host`). `DirectLaunch` goes through that path once per *call signature* and keeps what it
returned: the compiled kernel and the full argument list's order. Later calls with the same
signature go straight to the compiled kernel's launcher.

The signature is stricter than Triton's specialisation, so it never reuses a kernel Triton
would not: the current device, every tensor's dtype and whether its address is a multiple of
16, and the exact value and type of every other argument (integers, floats, bools, constexprs,
None). A call with a tuple, a list or an unhashable value (a tensor descriptor) is not cached,
nor a configuration with a `pre_hook`, nor a kernel under `triton.heuristics`: those take
Triton's path every time. Not done on the direct path: Triton's check that the kernel's global
variables did not change since it was compiled, and `JITFunction.pre_run_hooks` (none here).

Measured on an H100 host (2026-12-06, `gpu_diagnostics/launch_overhead.py`): 19 us a launch,
against 23 (plain) and 28 (autotuned) through Triton and 9 for the compiled launcher alone;
the eager `triton` forward at N = 256 0.54 -> 0.42-0.44 ms (docs/perf-notes.md).
"""

from __future__ import annotations

import inspect

import torch
from triton import knobs
from triton.runtime.autotuner import Heuristics
from triton.runtime.jit import JITFunction

try:  # what Triton's own launch path asks for the stream (a Stream object costs ~1 us more)
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # a build without CUDA
    def _raw_stream(device: int) -> int:
        return torch.cuda.current_stream(device).cuda_stream


def device_and_stream() -> tuple[int, int]:
    """The current CUDA device's index and its current stream's handle (a graph capture's,
    while capturing)."""
    device = torch.cuda.current_device()
    return device, _raw_stream(device)


_UNCACHED = object()  # a call signature with a value the direct path does not key on
_MAX_SIGNATURES = 256  # per kernel: more (a ragged sweep) start the table again
_SCALARS = (float, str)
_TRUE, _FALSE, _NONE = object(), object(), object()  # equal to no int (True == 1)
INSTANCES: list[DirectLaunch] = []  # every DirectLaunch made in this process
ENABLED = True  # False: every launch takes Triton's path (`profile_call.py --ab` of the two)


def call_signature(device: int, args: tuple, kwargs: dict):
    """What a launch's compiled kernel and configuration depend on, or `_UNCACHED`: flat, a
    tensor giving its dtype, an int itself, a bool or None a sentinel, any other value (its
    type, the value), so that 1, True and 1.0 differ (no two layouts collide); then a
    bit per value, set where a tensor's address is not a multiple of 16 (what Triton
    specialises a pointer on besides its dtype; the launcher itself rejects a pointer the
    device cannot read), and the keyword names. A hot path: ~0.1 us a value."""
    key = [device]
    append = key.append
    misaligned = 0
    for i, value in enumerate((*args, *kwargs.values())):
        cls = type(value)
        if cls is int:
            append(value)
        elif cls is bool:
            append(_TRUE if value else _FALSE)
        elif cls is torch.Tensor or isinstance(value, torch.Tensor):
            append(value.dtype)
            if value.data_ptr() & 15:
                misaligned |= 1 << i
        elif value is None:
            append(_NONE)
        else:
            if cls is tuple or cls is list:  # of tensors, possibly: keyed by identity
                return _UNCACHED
            if cls not in _SCALARS:
                try:
                    hash(value)  # a tl.dtype or tl.constexpr
                except TypeError:
                    return _UNCACHED
            append((cls, value))
    append(misaligned)
    key.extend(kwargs)  # the names, in the call's order
    return tuple(key)


class _Plan:
    """One call signature's compiled kernel, the autotuner's configuration for it, and how
    to build the kernel's full argument list (every parameter, constexprs included, in order)
    from a call's positional and keyword arguments."""

    __slots__ = ("compiled", "config", "tail", "constants")

    def __init__(self, compiled, config, tail: list[tuple[str, bool, object]]):
        self.compiled, self.config, self.tail = compiled, config, tail
        # what a grid function usually reads: the meta-parameters (and defaults)
        self.constants = {name: value for name, from_call, value in tail if not from_call}

    def arguments(self, args: tuple, kwargs: dict) -> list:
        full = list(args)
        full.extend(kwargs[name] if from_call else value for name, from_call, value in self.tail)
        return full


class DirectLaunch:
    """`kernel` (a `triton.jit` function or a `triton.autotune` of one), launched as
    `direct[grid](*args, **kwargs)`, through Triton's own path the first time each call
    signature is seen and through the compiled kernel's launcher after. Every other attribute
    is the wrapped kernel's (`configs`, `cache`); `best_config` is the configuration of the
    last launch."""

    def __init__(self, kernel):
        self.kernel = kernel
        jit, heuristics = kernel, False
        while not isinstance(jit, JITFunction):
            heuristics |= isinstance(jit, Heuristics)
            jit = jit.fn
        # `triton.heuristics` may compute a meta-parameter from anything (a tensor's shape):
        # such a kernel always takes Triton's path
        self._cacheable = not heuristics
        self._names = list(jit.arg_names)
        self._defaults = {name: p.default for name, p in jit.signature.parameters.items()
                          if p.default is not inspect.Parameter.empty}
        self.name = jit.fn.__name__
        self._plans: dict[tuple, _Plan] = {}
        self._last: _Plan | None = None
        self.direct_launches = 0  # calls that took the direct path,
        self.triton_launches = 0  # and Triton's (`profile_call.py --host` prints both)
        INSTANCES.append(self)

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    @property
    def best_config(self):
        if self._last is not None:
            return self._last.config
        return getattr(self.kernel, "best_config", None)  # the last call was not cacheable

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    @property
    def configs(self) -> list:
        return self.kernel.configs

    @configs.setter
    def configs(self, configs: list) -> None:  # a probe narrows the autotuner's list
        self.kernel.configs = configs
        self._plans.clear()

    def _launch(self, grid, args: tuple, kwargs: dict) -> None:
        if not ENABLED:
            self.triton_launches += 1
            self.kernel[grid](*args, **kwargs)
            return
        device, stream = device_and_stream()
        signature = call_signature(device, args, kwargs)
        plan = self._plans.get(signature) if signature is not _UNCACHED else None
        if plan is None:
            self.triton_launches += 1
            compiled = self.kernel[grid](*args, **kwargs)
            plan = None if signature is _UNCACHED else self._plan(compiled, args, kwargs)
            if plan is not None:
                if len(self._plans) >= _MAX_SIGNATURES:
                    self._plans.clear()
                self._plans[signature] = plan
            self._last = plan
            return
        self._last = plan
        self.direct_launches += 1
        full = plan.arguments(args, kwargs)
        if callable(grid):
            try:
                grid = grid({**plan.constants, **kwargs} if kwargs else plan.constants)
            except KeyError:  # it reads a positional argument as well
                grid = grid(dict(zip(self._names, full, strict=True)))
        compiled = plan.compiled
        compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                     stream, compiled.function, compiled.packed_metadata,
                     compiled.launch_metadata(grid, stream, *full),
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *full)

    def _plan(self, compiled, args: tuple, kwargs: dict) -> _Plan | None:
        """The plan of a call that went through Triton's path; None where later calls must
        take that path too: no compiled kernel came back, a `triton.heuristics` kernel, a
        configuration whose `pre_hook` must run before each launch, or a parameter whose
        value neither the call, the config nor a default gives."""
        config = getattr(self.kernel, "best_config", None)
        if (compiled is None or not self._cacheable
                or getattr(config, "pre_hook", None) is not None):
            return None
        meta = config.kwargs if config is not None else {}
        tail = []
        for name in self._names[len(args):]:
            if name in kwargs:
                tail.append((name, True, None))
            elif name in meta:
                tail.append((name, False, meta[name]))
            elif name in self._defaults:
                tail.append((name, False, self._defaults[name]))
            else:
                return None
        return _Plan(compiled, config, tail)
