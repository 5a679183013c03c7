"""Attack (or a buggy kernel): an out-of-bounds index on the GPU at N = 64 only. The
device-side assert poisons the process's CUDA context for good: every later CUDA call in it
fails, so the next cell needs a fresh worker. On the CPU it raises the error PyTorch raises
then (its message, as long as the real one), so CI checks how the harness reports it."""

import torch

from variants.reference import IPAReference

CUDA_ASSERT_MESSAGE = (
    "CUDA error: device-side assert triggered\nSearch for `cudaErrorAssert' in "
    "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more "
    "information.\nCUDA kernel errors might be asynchronously reported at some other API call, "
    "so the stacktrace below might be incorrect.\nFor debugging consider passing "
    "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
    "assertions.\n")


class ModelNew(IPAReference):
    def forward(self, node_repr, pair_repr, translations, rotations):
        if node_repr.shape[1] == 64:
            if node_repr.device.type != "cuda":
                raise torch.AcceleratorError(CUDA_ASSERT_MESSAGE)
            table = torch.zeros(4, device=node_repr.device)
            table[torch.tensor([1 << 40], device=node_repr.device)].sum().item()
        return super().forward(node_repr, pair_repr, translations, rotations)
