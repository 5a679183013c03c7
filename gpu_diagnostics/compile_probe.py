"""Is torch.compile's disagreement at some shapes the compiler's? (GPU machine.)

The H200 sweep of 2026-12-02 found torch.compile(reference) wrong (rel_l2 ~1-2, NaN rows) at
B = 2, N = 97 and B = 1, N = 3000 while eager is right. This compares the compiled module
with the same module run eagerly, in float64 (so no precision can explain a difference):
through Dynamo and AOTAutograd alone (`aot_eager`), then through Inductor with its defaults
and with one reduction option switched off at a time.

    PYTHONPATH=. python3 gpu_diagnostics/compile_probe.py
"""

from __future__ import annotations

import sys

import torch

from harness.correctness import rel_l2
from variants.problem import IPAConfig, make_inputs
from variants.reference import init_state_dict, make_module

# (B, N); N = 1000 passed in the sweep (the control); N = 3000 last: it may fault
SHAPES = [(2, 97), (1, 1000), (1, 3000)]
COMPILERS = {
    "aot_eager (no Inductor)": {"backend": "aot_eager"},
    "inductor defaults": {},
    "inductor, split_reductions off": {"options": {"split_reductions": False}},
    "inductor, persistent off": {"options": {"triton.persistent_reductions": False}},
}


def main() -> int:
    config = IPAConfig()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, default config, float64")
    print(f"{'B':>2} {'N':>5}  {'compiler':<31} rel_l2(compiled, eager)  NaN/Inf")
    module = make_module(init_state_dict(config), config, "cuda", torch.float64)
    for batch, length in SHAPES:
        inputs = make_inputs(config, batch, length, dtype=torch.float64, device="cuda", seed=2)
        with torch.no_grad():
            eager = module(*inputs.as_tuple())
            for label, kwargs in COMPILERS.items():
                torch._dynamo.reset()
                compiled = torch.compile(module, dynamic=False, **kwargs)
                out = compiled(*inputs.as_tuple())
                bad = (~torch.isfinite(out)).sum().item()
                print(f"{batch:>2} {length:>5}  {label:<31} {rel_l2(out, eager):.3e}"
                      f"{'':>14}{bad}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
