"""Where a `triton-train` training step spends its time, kernel by kernel (GPU machine).

One training step of the layer at the default config, B = 1, under torch.profiler, after a
warm-up step; prints the CUDA kernels by total time.

    PYTHONPATH=. python3 gpu_diagnostics/train_profile.py [N] [fp32|bf16] [variant]
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from harness.runner import InputRecipe, trainable_parameters, training_step
from variants.problem import IPAConfig
from variants.reference import init_state_dict
from variants.registry import get_variant


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 4096
    precision = argv[1] if len(argv) > 1 else "fp32"
    name = argv[2] if len(argv) > 2 else "triton-train"
    config = IPAConfig()
    fn = get_variant(name).build(init_state_dict(config), config, "cuda", precision)
    recipe = InputRecipe(config, 1, n, precision, "cuda", 0)
    args = tuple(t.requires_grad_(True) for t in recipe.values().as_tuple())
    params = {k: p.requires_grad_(True) for k, p in trainable_parameters(fn).items()}
    grad_out = recipe.grad_output()
    for _ in range(2):
        training_step(fn, args, params, grad_out)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        training_step(fn, args, params, grad_out)
        torch.cuda.synchronize()
    print(f"# {name} {precision} N={n}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14,
                                    max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
