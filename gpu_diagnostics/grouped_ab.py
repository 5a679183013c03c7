"""One device call's A/B of `triton-grouped` (the pair bias of G heads per program in the key
loop, `variants/triton/grouped.py`) against `triton` (bias GEMM, then the attention kernel), in
one process on one GPU: for each (N, dtype), the forward's median time by CUDA-graph replay
(`triton.testing.do_bench_cudagraph`, so no host time) for `triton` and for `triton-grouped` at
each group size that divides the heads, and each one's rel_l2 against the float64 reference at
N <= 2048. Default config, B = 1.

    PYTHONPATH=. python3 gpu_diagnostics/grouped_ab.py [N ...] [--dtypes fp32,bf16]
        [--groups 2,3,4,6]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import triton.testing

from harness.correctness import rel_l2
from variants.problem import IPAConfig, make_inputs
from variants.reference import init_state_dict, make_module
from variants.triton.common import chosen_configs
from variants.triton.pipeline import TritonIPAWeights, triton_grouped_ipa, triton_ipa

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lengths", nargs="*", type=int, default=[1024, 4096])
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--groups", default="2,3,4,6")
    opts = parser.parse_args()
    cfg = IPAConfig()
    state = init_state_dict(cfg)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for n in opts.lengths:
        for name in opts.dtypes.split(","):
            dtype = DTYPES[name]
            weights = TritonIPAWeights.from_state_dict(state, cfg, "cuda", dtype)
            inputs = make_inputs(cfg, 1, n, dtype=dtype, device="cuda", seed=0).as_tuple()
            oracle = None
            if n <= 2048:
                module = make_module(state, cfg, "cuda", torch.float64)
                with torch.no_grad():
                    oracle = module(*(t.double() for t in inputs))
                del module
            runs = {"triton": partial(triton_ipa, weights, *inputs)}
            for g in map(int, opts.groups.split(",")):
                if cfg.heads % g == 0:
                    runs[f"grouped G={g}"] = partial(triton_grouped_ipa, weights, *inputs,
                                                     heads_per_program=g)
            for label, run in runs.items():
                with torch.no_grad():
                    try:
                        out = run()
                        ms = triton.testing.do_bench_cudagraph(run, rep=200)
                    except Exception as exc:  # noqa: BLE001 - a config that fails is data
                        print(f"N={n} {name} {label}: FAILED {type(exc).__name__}: "
                              f"{str(exc)[:200]}", flush=True)
                        continue
                err = f"rel_l2 {rel_l2(out, oracle):.2e}" if oracle is not None else ""
                print(f"N={n} {name} {label}: {ms:.4f} ms {err}", flush=True)
            del runs, inputs, oracle
            torch.cuda.empty_cache()
    print(chosen_configs())


if __name__ == "__main__":
    main()
