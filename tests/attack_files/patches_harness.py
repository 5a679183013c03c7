"""Attack: patch the harness so every check passes, then return zeros."""

import torch

import harness.correctness
from variants.reference import IPAReference

harness.correctness.CheckResult.passed = property(lambda self: True)
harness.correctness.tolerance = lambda reference_err, precision: float("inf")


class ModelNew(IPAReference):
    def forward(self, node_repr, pair_repr, translations, rotations):
        return torch.zeros_like(node_repr)
