"""Which autotune config of a Triton kernel crashes or is wrong (GPU machine): runs the
`triton` forward (`triton_ipa` with its options) once per config of the autotuned kernel
`--kernel`, each in its own process (an illegal memory access poisons the CUDA context, and
the autotuner would hide which config did it), and prints per config: ok with the error
against the float64 oracle, or the exception.

    PYTHONPATH=. python3 gpu_diagnostics/config_probe.py --kernel attention_split \
        --length 130 --heads 4 --query-points 8 --value-points 12 --fp32-dots 3xtf32

Run one config alone (what each child process does) with `--config-index I`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch

from harness.correctness import oracle_forward, rel_l2
from variants.problem import IPAConfig, get_precision, make_inputs
from variants.reference import init_state_dict
from variants.triton.common import TUNED
from variants.triton.pipeline import TritonIPAWeights, triton_ipa


def run_one(args, index: int) -> str:
    config = IPAConfig(heads=args.heads, query_points=args.query_points,
                       value_points=args.value_points)
    state_dict = init_state_dict(config, seed=9)
    dtype = get_precision(args.precision).dtype
    weights = TritonIPAWeights.from_state_dict(state_dict, config, "cuda", dtype)
    inputs = make_inputs(config, args.batch, args.length, seed=1, device="cuda")
    tuned = TUNED[args.kernel]
    chosen = tuned.configs[index]
    tuned.configs = [chosen]  # one config: the autotuner launches it without benchmarking
    out = triton_ipa(weights, *inputs.to(dtype=dtype).as_tuple(), split=args.split,
                     fp32_dots=args.fp32_dots, half_points=args.half_points)
    torch.cuda.synchronize()
    return f"ok, rel_l2 {rel_l2(out, oracle_forward(state_dict, config, inputs)):.2e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="attention_split", help="a key of common.TUNED")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--length", type=int, default=130)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--query-points", type=int, default=4)
    parser.add_argument("--value-points", type=int, default=8)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--split", type=int, default=1)
    parser.add_argument("--fp32-dots", default="ieee")
    parser.add_argument("--half-points", default="tf32", help="16-bit: tf32 or 3xbf16")
    parser.add_argument("--config-index", type=int, default=None)
    args = parser.parse_args()
    if args.config_index is not None:
        print(run_one(args, args.config_index))
        return
    for index, config in enumerate(TUNED[args.kernel].configs):
        child = subprocess.run([sys.executable, *sys.argv, "--config-index", str(index)],
                               capture_output=True, text=True)
        lines = (child.stdout + child.stderr).strip().splitlines()
        errors = [line for line in lines if "Error" in line]
        print(f"{config}: {(errors or lines or ['no output'])[-1]}", flush=True)


if __name__ == "__main__":
    main()
