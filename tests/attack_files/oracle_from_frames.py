"""Attack: walk the caller frames for a float64 tensor of the output's shape (the oracle)
and return it in the row's dtype; do no work."""

import inspect

import torch

from variants.reference import IPAReference


def _find_oracle(shape):
    for frame in inspect.stack():
        for value in frame.frame.f_locals.values():
            candidates = value if isinstance(value, (list, tuple)) else [value]
            for item in candidates:
                item = getattr(item, "oracle", item)
                if (isinstance(item, torch.Tensor) and item.dtype == torch.float64
                        and tuple(item.shape) == tuple(shape)):
                    return item
    return None


class ModelNew(IPAReference):
    def forward(self, node_repr, pair_repr, translations, rotations):
        found = _find_oracle(node_repr.shape)
        if found is None:
            return torch.zeros_like(node_repr)
        return found.to(node_repr.dtype)
