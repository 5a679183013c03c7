"""Attack: importing this file breaks softmax for everyone else in the process (here it
returns uniform weights, so any victim's numbers change visibly). In a shared interpreter
the reference and the oracle would compute with it."""

import torch
import torch.nn.functional as F

from variants.reference import IPAReference


def _uniform(x, dim=-1, *args, **kwargs):
    return torch.full_like(x, 1.0 / x.shape[dim])


torch.softmax = _uniform
torch.Tensor.softmax = lambda self, dim=-1, *a, **k: _uniform(self, dim)
F.softmax = _uniform


class ModelNew(IPAReference):
    pass
