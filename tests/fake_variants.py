"""Variants that misbehave on purpose, for the sweep's failure handling."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.planted import HookedReference, SoftmaxWithoutRowSum
from variants.base import Variant
from variants.problem import get_precision
from variants.reference import Reference, checked


class Raising(Variant):
    name = "raising"
    description = "raises on every call"

    def build(self, state_dict, config, device, precision):
        def fn(*inputs):
            raise RuntimeError("kernel exploded\nsecond line")

        return fn


class FakeOOM(Variant):
    name = "fake-oom"
    description = "raises CUDA's out-of-memory error"

    def build(self, state_dict, config, device, precision):
        def fn(*inputs):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

        return fn


class KnownWrongAt4(Reference):
    """The reference, declaring a known wrong result at N = 4 (as data, like torch-compile)."""

    name = "known-wrong-at-4"
    is_baseline = False

    def known_issues(self, config, batch, length, device, precision):
        return ["wrong at N=4 (planted)"] if length == 4 else []


class Memoising(Reference):
    """Right once, then the cached output by input address: the timed calls do no work."""

    name = "memoising"
    is_baseline = False

    def build(self, *args):
        fn = super().build(*args)
        cache = {}

        def forward(*inputs):
            key = tuple(t.data_ptr() for t in inputs)
            if key not in cache:
                cache[key] = fn(*inputs)
            return cache[key]

        return forward


class _ScaledGradient(torch.autograd.Function):
    """Identity forward; the backward scales the gradient (a wrong backward kernel)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class _WrappedInputs(Reference):
    """The reference with its inputs passed through `wrap` first: the forward values stay
    exact, only what autograd sees changes (a wrong backward kernel)."""

    is_baseline = False

    @staticmethod
    def wrap(node_repr, pair_repr, translations, rotations):
        raise NotImplementedError

    def build(self, *args):
        fn = super().build(*args)
        wrap = self.wrap

        def forward(*inputs):
            return fn(*wrap(*inputs))

        forward.module = fn.module
        return forward


class WrongTranslationGradient(_WrappedInputs):
    """The reference's forward exactly; the gradient of `translations` is 1 % too large."""

    name = "wrong-translation-gradient"

    @staticmethod
    def wrap(node_repr, pair_repr, translations, rotations):
        return node_repr, pair_repr, _ScaledGradient.apply(translations, 1.01), rotations


class DetachedPairGradient(_WrappedInputs):
    """The reference's forward exactly, with `pair_repr` detached: no gradient reaches it (a
    backward that never writes d pair_repr)."""

    name = "detached-pair-gradient"

    @staticmethod
    def wrap(node_repr, pair_repr, translations, rotations):
        return node_repr, pair_repr.detach(), translations, rotations


# ---- backward bugs for `diagnose --pass forward+backward` ------------------------------------
# Each is the reference's forward exactly, with one wrong gradient inside the backward (a
# `torch.autograd.Function` whose forward is the identity or the true op). Module-level
# classes, so a worker process can unpickle them.

BACKWARD_BUG_SCALE = 1.05  # 5 %: far above the reference's own fp32 gradient error


class WrongPairGradient(_WrappedInputs):
    """The reference's forward exactly; the gradient of `pair_repr` is 5 % too large."""

    name = "wrong-pair-gradient"

    @staticmethod
    def wrap(node_repr, pair_repr, translations, rotations):
        return (node_repr, _ScaledGradient.apply(pair_repr, BACKWARD_BUG_SCALE), translations,
                rotations)


class _GradScaledLinear(torch.nn.Linear):
    """nn.Linear (same state_dict keys) whose backward scales either the gradient reaching
    its weight or the gradient arriving at its output (then every upstream one is off too)."""

    def __init__(self, linear: torch.nn.Linear, where: str):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None)
        self.where = where

    def forward(self, x):
        if self.where == "weight":
            return F.linear(x, _ScaledGradient.apply(self.weight, BACKWARD_BUG_SCALE), self.bias)
        return _ScaledGradient.apply(super().forward(x), BACKWARD_BUG_SCALE)


class PairWeightGradientModule(HookedReference):
    """d pair_bias.weight 5 % too large (the pair bias projection's weight gradient)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.pair_bias = _GradScaledLinear(self.pair_bias, "weight")


class ValueGradientModule(HookedReference):
    """dV (the gradient arriving at v_proj's output, P^T dO) 5 % too large: v_proj.weight
    and, upstream, LayerNorm and node_repr are off."""

    def __init__(self, *args):
        super().__init__(*args)
        self.v_proj = _GradScaledLinear(self.v_proj, "output")


class HeadWeightGradientModule(HookedReference):
    """The gradient flowing into softplus(head_weights) 5 % too large: only d head_weights."""

    def _point_weight(self):
        return _ScaledGradient.apply(F.softplus(self.head_weights), BACKWARD_BUG_SCALE)


class SoftmaxGradientModule(HookedReference):
    """The softmax backward without its row-sum term (every logit gradient off)."""

    def _softmax(self, logits):
        return SoftmaxWithoutRowSum.apply(logits)


class _ModuleBackwardBug(Variant):
    """Builds `module_cls` (a reference module with one backward bug) with the weights."""

    is_baseline = False
    supports_backward = True
    module_cls: type[torch.nn.Module]

    def build(self, state_dict, config, device, precision):
        dtype = get_precision(precision).dtype
        module = self.module_cls(*config.module_args())
        module.load_state_dict(state_dict)
        return checked(module.to(device, dtype).eval(), config, device, dtype)


class WrongPairWeightGradient(_ModuleBackwardBug):
    name = "wrong-pair-weight-gradient"
    description = PairWeightGradientModule.__doc__
    module_cls = PairWeightGradientModule


class WrongValueGradient(_ModuleBackwardBug):
    name = "wrong-value-gradient"
    description = ValueGradientModule.__doc__
    module_cls = ValueGradientModule


class WrongHeadWeightGradient(_ModuleBackwardBug):
    name = "wrong-head-weight-gradient"
    description = HeadWeightGradientModule.__doc__
    module_cls = HeadWeightGradientModule


class WrongSoftmaxGradient(_ModuleBackwardBug):
    name = "wrong-softmax-gradient"
    description = SoftmaxGradientModule.__doc__
    module_cls = SoftmaxGradientModule


class SlowToExit(Reference):
    """A reference whose worker process takes EXIT_S to exit (as one with a CUDA context and
    Inductor's compile workers does): the worker unpickles it through `_slow_to_exit`."""

    name = "slow-to-exit"
    EXIT_S = 2.0

    def __reduce__(self):
        return _slow_to_exit, ()


def _slow_to_exit() -> SlowToExit:
    import atexit
    import time

    atexit.register(time.sleep, SlowToExit.EXIT_S)
    return SlowToExit()
