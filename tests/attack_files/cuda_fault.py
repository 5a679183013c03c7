"""Attack (or a buggy kernel): an out-of-bounds index on the GPU at N = 64 only. The
device-side assert poisons the process's CUDA context for good: every later CUDA call in it
fails, so the next cell needs a fresh worker."""

import torch

from variants.reference import IPAReference


class ModelNew(IPAReference):
    def forward(self, node_repr, pair_repr, translations, rotations):
        if node_repr.shape[1] == 64:
            table = torch.zeros(4, device=node_repr.device)
            table[torch.tensor([1 << 40], device=node_repr.device)].sum().item()
        return super().forward(node_repr, pair_repr, translations, rotations)
