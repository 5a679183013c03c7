"""No GPU: compiles `triton-grouped`'s kernel (`variants/triton/grouped.py`: the pair bias of G
heads per program on tensor cores in the key loop) for sm_90 here, with the GPU machine's
triton 3.6.0, specialised as its launcher launches it at the default layer, for every config
of its autotune list and the group sizes asked for: registers, spilled words, shared bytes,
and the key loop's warp-instructions per (query, key, head) (`sm90_proxy.key_loop`) with its
spill loads and stores. Needs the proxy venv (`sm90_proxy.py`).

    PYTHONPATH=. build/sm90-proxy-venv/bin/python gpu_diagnostics/grouped_proxy.py \
        [N] [--dtype fp32|bf16] [--groups 2,3,4,6] [--heads H] [--query-points Qp]
        [--value-points Vp]

Before the kernel existed (2026-12-05, seventeenth session), a probe of the same design (bf16,
no masks, N = 2048, one stage, (64, 16) blocks with 8 warps) measured these warp-instructions
per (pair, head), the bias dot included, and spilled words:

| | G = 12 | G = 6 | G = 4 | G = 3 | G = 2 |
|---|---|---|---|---|---|
| scalar terms only | 1.20, 54 spilled | 1.45, none | 1.81, none | | |
| with points | | 2.43, 96 | 2.79, 46 | 3.14, 24 | 3.74, 8 |

The `triton` bf16 forward's two kernels take ~1.2 (attention) + ~2.4 (bias GEMM) per (pair,
head), plus the bias's N x N round trip.
"""

from __future__ import annotations

import argparse

import torch

import variants.triton.common as common
import variants.triton.frames as frames
import variants.triton.grouped as grouped
import variants.triton.linear as linear
import variants.triton.pipeline as pipeline
from gpu_diagnostics.sm90_proxy import Recorder, compile_config, key_loop, sass_stats, standing_in
from variants import problem
from variants.reference import init_state_dict

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def launch_args(dtype: torch.dtype, n: int, group: int, cfg: problem.IPAConfig
                ) -> tuple[tuple, dict, list]:
    """The arguments `triton_grouped_ipa` passes the kernel for layer `cfg`, B = 1, and the
    autotune configs of the form it launches."""
    name = "_grouped_fp32" if dtype == torch.float32 else "_grouped_16bit"
    rec = Recorder()
    rec.configs = getattr(grouped, name).configs
    stand_ins = [(grouped, name, rec), (frames, "_prologue_kernel", Recorder()),
                 (frames, "_epilogue_kernel", Recorder()), (linear, "_linear", Recorder()),
                 (common, "check_runnable", lambda *a: None),
                 (pipeline, "check_runnable", lambda *a: None)]
    weights = pipeline.TritonIPAWeights.from_state_dict(init_state_dict(cfg), cfg, "cpu", dtype)
    inputs = problem.make_inputs(cfg, 1, n, dtype=dtype, device="cpu", seed=1)
    with standing_in(stand_ins), torch.no_grad():
        pipeline.triton_grouped_ipa(weights, *inputs.as_tuple(), heads_per_program=group)
    return rec.args, rec.kwargs, rec.configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=1024)
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--groups", default="4")
    parser.add_argument("--heads", type=int, default=12, help="(node_dim stays 384)")
    parser.add_argument("--query-points", type=int, default=4)
    parser.add_argument("--value-points", type=int, default=8)
    opts = parser.parse_args()
    cfg = problem.IPAConfig(heads=opts.heads, query_points=opts.query_points,
                            value_points=opts.value_points)
    for group in map(int, opts.groups.split(",")):
        args, kwargs, configs = launch_args(DTYPES[opts.dtype], opts.n, group, cfg)
        for config in configs:
            kernel = compile_config(args, kwargs, config, fn=grouped._grouped_kernel)
            regs, stack, sass = sass_stats(kernel.asm["cubin"])
            loop = key_loop(sass)
            per = (loop["common"] * config.num_warps
                   / (config.kwargs["BLOCK_M"] * config.kwargs["BLOCK_N"] * group))
            print(f"{opts.dtype} G {group} {config.kwargs} warps {config.num_warps} stages "
                  f"{config.num_stages}: {regs} registers, {stack // 4} spilled, "
                  f"{kernel.metadata.shared} B shared; {per:.2f} instructions per (pair, head), "
                  f"LDL {loop['ops']['LDL']} STL {loop['ops']['STL']}", flush=True)


if __name__ == "__main__":
    main()
