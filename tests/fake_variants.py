"""Variants that misbehave on purpose, for the sweep's failure handling."""

from __future__ import annotations

import torch

from variants.base import Variant
from variants.reference import Reference


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


class WrongTranslationGradient(Reference):
    """The reference's forward exactly; the gradient of `translations` is 1 % too large."""

    name = "wrong-translation-gradient"
    is_baseline = False

    def build(self, *args):
        fn = super().build(*args)

        def forward(node_repr, pair_repr, translations, rotations):
            return fn(node_repr, pair_repr, _ScaledGradient.apply(translations, 1.01), rotations)

        forward.module = fn.module
        return forward


class DetachedPairGradient(Reference):
    """The reference's forward exactly, with `pair_repr` detached: no gradient reaches it (a
    backward that never writes d pair_repr)."""

    name = "detached-pair-gradient"
    is_baseline = False

    def build(self, *args):
        fn = super().build(*args)

        def forward(node_repr, pair_repr, translations, rotations):
            return fn(node_repr, pair_repr.detach(), translations, rotations)

        forward.module = fn.module
        return forward
