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
