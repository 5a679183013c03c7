"""Attack: compute in bfloat16 and cast back, whatever precision the row asks for."""

import torch

from variants.reference import IPAReference


class ModelNew(IPAReference):
    def forward(self, node_repr, pair_repr, translations, rotations):
        dtype = node_repr.dtype
        self.to(torch.bfloat16)
        out = super().forward(node_repr.bfloat16(), pair_repr.bfloat16(),
                              translations.bfloat16(), rotations.bfloat16())
        self.to(dtype)
        return out.to(dtype)
