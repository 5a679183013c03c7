"""`custom_op`: a `torch.library.custom_op` that eager calls reach without the dispatcher.

The Triton variants' training steps are custom ops (the attention cores, the frame
transforms), so that `torch.compile` keeps them as opaque nodes and traces their backwards, and
`torch.library.opcheck` can test them. But a custom op's Python dispatch is slow on the host:
on this project's CPU machine, kernels stubbed, one frame op took 83-90 us forward and 205-210
us forward and backward, against 29 and 117-131 us through `Op`; a whole `triton-train` step
(three op pairs; tiny layer, one thread, interleaved in one process) 1.93 ms against 1.43 ms.
Eager steps at N <= 1024 are host-bound on the H200 (docs/perf-notes.md). `Op` keeps the custom
op for compilation, tracing and opcheck (`Op.op`) and runs plain eager calls through an
`autograd.Function` built from the same implementation, setup_context and backward; the
backward's own ops are `Op`s too, so eager backwards call their implementations directly. The
eager tests run the fast path; opcheck and the torch.compile tests the op.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode


class Op:
    """A custom op (`op`) and its implementation (`impl`). Calling it runs `op` while
    torch.compile traces, else `impl` (through an `autograd.Function` once a backward is
    registered). The implementation's in-place writes to `mutates_args` bump those tensors'
    version counters on either path, so autograd still refuses to read a saved tensor that
    an eager call overwrote."""

    def __init__(self, name: str, impl: Callable, mutates_args: tuple[str, ...]):
        self.name = name
        self.op = torch.library.custom_op(name, impl, mutates_args=mutates_args)
        self.impl = impl
        params = list(inspect.signature(impl).parameters)
        self._mutated = [params.index(arg) for arg in mutates_args]
        self._function: type[torch.autograd.Function] | None = None

    def register_fake(self, fake: Callable) -> Callable:
        self.op.register_fake(fake)
        return fake

    def register_autograd(self, backward: Callable, *, setup_context: Callable) -> None:
        self.op.register_autograd(backward, setup_context=setup_context)
        impl = self.impl

        def forward(ctx, *args):
            # (ctx in forward: with a separate setup_context, `apply` binds the arguments to
            # forward's signature by `inspect` on every call, ~50 us)
            out = impl(*args)
            setup_context(ctx, args, out)
            return out

        self._function = type(self.name.replace("::", "_"), (torch.autograd.Function,), {
            "forward": staticmethod(forward), "backward": staticmethod(backward)})

    def __call__(self, *args):
        if _traced(args):
            return self.op(*args)
        out = self.impl(*args) if self._function is None else self._function.apply(*args)
        for i in self._mutated:
            torch.autograd.graph.increment_version(args[i])
        return out


def _traced(args: tuple) -> bool:
    """Whether a call may not run the implementation itself: under torch.compile, a dispatch
    mode (FakeTensorMode, make_fx's tracing, a user's) or with a tensor subclass (fake or
    functional tensors) among the arguments."""
    return (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None
            or any(type(a) not in _PLAIN for a in args if isinstance(a, torch.Tensor)))


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def custom_op(name: str, *, mutates_args: tuple[str, ...] = ()) -> Callable[[Callable], Op]:
    """Decorator: `torch.library.custom_op(name, mutates_args=...)`, as an `Op`."""
    return lambda impl: Op(name, impl, mutates_args)
