"""No GPU: compiles the `triton` forward's attention kernel (`variants/triton/attention.py`)
for sm_90 here, on the CPU machine, with the GPU machine's triton 3.6.0, specialised as the
forward launches it at the default layer, for every config of each of its autotuned forms:
registers, spills (stack bytes / 4) and shared bytes, as `sm90_proxy.py` does for the openfold
kernel (whose venv it needs: see there). Configs that spill are the ones to drop.

    PYTHONPATH=. build/sm90-proxy-venv/bin/python gpu_diagnostics/attention_proxy.py [N]

Forms: fp32 with 3xTF32 dots (`_attention_split`, the default), fp32 IEEE (`_attention_direct`,
`triton_ipa(fp32_dots="ieee")`), bf16 (`_attention_dot`). One line per config on stdout.
"""

from __future__ import annotations

import sys

import torch

import variants.triton.attention as att
import variants.triton.common as common
import variants.triton.pipeline as pipeline
from gpu_diagnostics.sm90_proxy import (
    Recorder,
    compile_config,
    sass_stats,
    standing_in,
    warn_version,
)
from variants import problem
from variants.reference import init_state_dict
from variants.triton import frames, pair_bias

FORMS = {"_attention_direct": (torch.float32, "ieee"),
         "_attention_split": (torch.float32, "3xtf32"),
         "_attention_dot": (torch.bfloat16, "ieee")}


def launch_args(name: str, dtype: torch.dtype, dots: str, n: int) -> tuple[tuple, dict]:
    """The arguments the forward passes to the attention kernel's autotuned form `name`; the
    other kernels only stand still (no driver here)."""
    tuned = getattr(att, name)
    rec = Recorder()
    rec.configs = tuned.configs  # the launcher reads the block sizes it may get
    stand_ins = [(att, name, rec), (frames, "_prologue_kernel", Recorder()),
                 (frames, "_epilogue_kernel", Recorder()), (pair_bias, "_pair_bias", Recorder()),
                 (common, "check_runnable", lambda *a: None),
                 (pipeline, "check_runnable", lambda *a: None)]
    cfg = problem.IPAConfig()
    weights = pipeline.TritonIPAWeights.from_state_dict(init_state_dict(cfg), cfg, "cpu", dtype)
    inputs = problem.make_inputs(cfg, 1, n, dtype=dtype, device="cpu", seed=1)
    with standing_in(stand_ins), torch.no_grad():
        pipeline.triton_ipa(weights, *inputs.as_tuple(), fp32_dots=dots)
    return rec.args, rec.kwargs


def main(argv: list[str]) -> int:
    warn_version()
    n = int(argv[0]) if argv else 1024
    for name, (dtype, dots) in FORMS.items():
        args, kwargs = launch_args(name, dtype, dots, n)
        for config in getattr(att, name).configs:
            kernel = compile_config(args, kwargs, config, fn=att._attention_kernel)
            regs, stack, _ = sass_stats(kernel.asm["cubin"])
            cap = f" maxnreg {config.maxnreg}" if config.maxnreg else ""
            print(f"{name[1:]} {config.kwargs} warps {config.num_warps} stages "
                  f"{config.num_stages}{cap}: {regs} registers, {stack // 4} spilled, "
                  f"{kernel.metadata.shared} B shared", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
