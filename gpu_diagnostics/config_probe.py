"""Which autotune config of a Triton kernel crashes or is wrong (GPU machine): runs the
`triton` forward (`triton_ipa` with its options) once per config of the autotuned kernel
`--kernel`, each in its own process (an illegal memory access poisons the CUDA context, and
the autotuner would hide which config did it), and prints per config: ok with the error
against the float64 oracle, or the exception. A kernel of triton-train's backward (a name
starting `bias_backward_`) runs a training step of `triton-train` instead, judged by the
harness's gradient protocol (one seed): pass or fail, with the worst gradient's rel_l2, its
tolerance and its name. `--extra-config M,N,WARPS,STAGES` adds a config to the kernel's list
first (one the list does not offer yet: try it here before it goes into the autotuner's).

    PYTHONPATH=. python3 gpu_diagnostics/config_probe.py --kernel attention_split \
        --length 130 --heads 4 --query-points 8 --value-points 12 --fp32-dots 3xtf32
    PYTHONPATH=. python3 gpu_diagnostics/config_probe.py \
        --kernel bias_backward_keys_3xtf32 --length 1000 --extra-config 16,128,8,1

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


def configs(args) -> list:
    """The kernel's autotune configs, with `--extra-config` appended."""
    import triton

    listed = list(getattr(TUNED[args.kernel], "configs", []))  # none under the interpreter
    if args.extra_config:
        m, n, warps, stages = (int(x) for x in args.extra_config.split(","))
        listed.append(triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps,
                                    num_stages=stages))
    return listed


def run_one(args, index: int) -> str:
    config = IPAConfig(heads=args.heads, query_points=args.query_points,
                       value_points=args.value_points)
    state_dict = init_state_dict(config, seed=9)
    dtype = get_precision(args.precision).dtype
    if args.kernel.startswith("bias_backward_"):
        import variants.triton.bias_backward  # noqa: F401  (defines the backward's kernels)
    tuned = TUNED[args.kernel]
    tuned.configs = [configs(args)[index]]  # one config: launched without benchmarking
    if args.kernel.startswith("bias_backward_"):
        return training_step(args, config, state_dict)
    weights = TritonIPAWeights.from_state_dict(state_dict, config, "cuda", dtype)
    # the oracle sees the inputs the kernel sees (rounded to 16 bits), as the harness's does
    inputs = make_inputs(config, args.batch, args.length, seed=1, device="cuda").to(dtype=dtype)
    out = triton_ipa(weights, *inputs.as_tuple(), split=args.split,
                     fp32_dots=args.fp32_dots, half_points=args.half_points)
    torch.cuda.synchronize()
    return f"ok, rel_l2 {rel_l2(out, oracle_forward(state_dict, config, inputs)):.2e}"


def training_step(args, config: IPAConfig, state_dict) -> str:
    """triton-train's training step in this process, through the harness's protocol."""
    from harness.correctness import check_variant
    from variants.registry import get_variant

    result = check_variant(get_variant("triton-train"), config, batch=args.batch,
                           length=args.length, device=args.device, precision=args.precision,
                           seeds=1, state_dict=state_dict, pass_name="forward+backward")
    if args.device == "cuda":
        torch.cuda.synchronize()
    verdict = "ok" if result.passed else "FAIL"
    return (f"{verdict}, worst gradient {result.grad_worst}: rel_l2 {result.grad_rel_l2:.2e} "
            f"(tol {result.grad_tol:.2e}); output rel_l2 {result.rel_l2:.2e}")


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
    parser.add_argument("--device", default="cuda",
                        help="cpu with TRITON_INTERPRET=1: a dry run (backward kernels)")
    parser.add_argument("--extra-config", default=None,
                        help="BLOCK_M,BLOCK_N,WARPS,STAGES: a config to try besides the list")
    parser.add_argument("--config-index", type=int, default=None)
    args = parser.parse_args()
    if args.config_index is not None:
        print(run_one(args, args.config_index))
        return
    if args.kernel.startswith("bias_backward_"):
        import variants.triton.bias_backward  # noqa: F401
    for index, config in enumerate(configs(args)):
        child = subprocess.run([sys.executable, *sys.argv, "--config-index", str(index)],
                               capture_output=True, text=True)
        lines = (child.stdout + child.stderr).strip().splitlines()
        errors = [line for line in lines if "Error" in line]
        print(f"{config}: {(errors or lines or ['no output'])[-1]}", flush=True)


if __name__ == "__main__":
    main()
