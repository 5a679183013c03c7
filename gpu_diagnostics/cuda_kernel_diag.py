"""Kernel-level diagnostics for the CUDA variants (docs/perf-notes.md): environment and build
time, and each kernel's output against a float64 recomputation from the same operands (which
isolates the kernel from the PyTorch steps around it). Timing is the harness's job:
`ipa-bench sweep --grid benchmarks/grids/headline.toml --variant cuda-fused ...`.

Run from the repository root on the GPU machine:
    PYTHONPATH=. python3 gpu_diagnostics/cuda_kernel_diag.py env diag [--out DIR]
`ab` times the cuda-fused kernel alone (prepared operands) in each kernel class that takes the
default config, and the whole variant beside it, with the sweep's timer (`harness.measure`:
CUDA events, L2 flushed before every sample, warm-up, samples until the median is quiet);
`ncu-target` runs the kernel once (`--klass`, `--length`, `--precision`) for `ncu`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time

import torch

from harness.measure import L2Flusher, TimingPolicy, time_cuda
from variants.base2 import LOG2E, base2_units
from variants.cuda_ext import Weights, Widths, build_seconds, load_extension, project
from variants.cuda_fused import AF2, LANES, SMALL, CudaFused, kernel_class
from variants.cuda_hybrid import attention_probabilities
from variants.problem import IPAConfig, make_inputs
from variants.reference import init_state_dict

OUT = os.environ.get("OUT", "gpu-out")


def env_report() -> dict:
    props = torch.cuda.get_device_properties(0)
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    info = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nvcc": nvcc.strip().splitlines()[-1] if nvcc else None,
        "python": platform.python_version(),
    }
    t0 = time.perf_counter()
    load_extension()
    info["extension_load_s"] = round(time.perf_counter() - t0, 2)
    info["extension_build_s"] = build_seconds()
    return info


def _reference_attended(ops, pair, pair_weight, point_weight, widths, log2_units: bool):
    """float64 recomputation of softmax-weighted [v | points] (B, N, H, dv) from the operands."""
    q, k, v = ops.q.double(), ops.k.double(), ops.v.double()
    d = widths.dqp
    s = q[..., :d] @ k[..., :d].transpose(-1, -2)
    qp, kp = q[..., d:], k[..., d:]
    dist = ((qp.unsqueeze(3) - kp.unsqueeze(2)) ** 2).sum(-1)
    bias = (pair.double() @ pair_weight.double().T).permute(0, 3, 1, 2)
    logits = s + point_weight.double().view(1, -1, 1, 1) * dist + bias
    if log2_units:
        logits = logits / LOG2E  # base-2 units back to natural ones
    p = torch.softmax(logits, dim=-1)
    return (p @ v).permute(0, 2, 1, 3)[..., : widths.dv], p


def diag(lengths=(1, 16, 37, 130, 300), configs=None) -> list[dict]:
    """Kernel-only errors per (config, N, dtype, splits), with the worst head / feature."""
    rows = []
    configs = configs or [IPAConfig(), IPAConfig(heads=16), IPAConfig(heads=3),
                          IPAConfig(query_points=16, value_points=16)]
    for config in configs:
        weights = Weights(init_state_dict(config), config, "cuda")
        klass = kernel_class(config)
        for dtype in (torch.float32, torch.bfloat16):
            for n in lengths:
                inputs = make_inputs(config, 2, n, dtype=dtype, device="cuda", seed=1)
                widths = Widths.for_lanes(config, LANES[klass])
                units = base2_units(weights.pair_bias, weights.head_weights, config.head_dim)
                wb, pw = units.pair_weight, units.point_weight
                ops = project(weights, inputs.node_repr, inputs.translations, inputs.rotations,
                              widths=widths, q_scale=units.q_scale)
                ref, _ = _reference_attended(ops, inputs.pair_repr, wb, pw, widths, True)
                for splits in (1, 0):
                    out = torch.full((2, n, config.heads, widths.dv), float("nan"), device="cuda")
                    plan = load_extension().fused_forward(
                        ops.q, ops.k, ops.v, inputs.pair_repr, wb, pw, out, klass, widths.dqp,
                        widths.dv, splits, None)
                    err = (out.double() - ref).abs()
                    finite = bool(torch.isfinite(out).all())
                    rel = ((out.double() - ref).norm() / ref.norm()).item() if finite else math.inf
                    per_head = err.amax(dim=(0, 1, 3)) if finite else None
                    per_feat = err.amax(dim=(0, 1, 2)) if finite else None
                    row = {
                        "kernel": "fused", "config": str(config), "N": n, "dtype": str(dtype),
                        "klass": klass, "plan": list(plan), "finite": finite, "rel_l2": rel,
                        "max_abs": err.max().item() if finite else math.inf,
                        "worst_head": int(per_head.argmax()) if finite else None,
                        "worst_feature": int(per_feat.argmax()) if finite else None,
                        "nan_count": int((~torch.isfinite(out)).sum()),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                # hybrid probabilities from its own (natural-unit) operands
                hw = Widths.for_lanes(config, 1)
                hops = project(weights, inputs.node_repr, inputs.translations, inputs.rotations,
                               widths=hw, q_scale=1.0 / config.head_dim**0.5)
                bias = torch.nn.functional.linear(inputs.pair_repr, weights.pair_bias.to(dtype))
                bias = bias.permute(0, 3, 1, 2).contiguous()
                probs = torch.full((2, config.heads, n, n), float("nan"), device="cuda")
                attention_probabilities(hops.q, hops.k, bias, weights.point_weight, dqp=hw.dqp,
                                        out=probs)
                _, pref = _reference_attended(hops, inputs.pair_repr, weights.pair_bias,
                                              weights.point_weight, hw, False)
                finite = bool(torch.isfinite(probs).all())
                row = {"kernel": "hybrid", "config": str(config), "N": n, "dtype": str(dtype),
                       "finite": finite,
                       "max_abs": (probs.double() - pref).abs().max().item() if finite else None}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def timing_inputs(n: int, precision: str):
    """The default config's four inputs at B = 1 (seeded), with pair_repr drawn on the GPU: the
    float64 CPU draw of (N, N, 128) takes tens of seconds at N = 4096."""
    config = IPAConfig()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    small = IPAConfig(config.node_dim, 8, config.heads, config.query_points, config.value_points)
    inputs = make_inputs(small, 1, n, dtype=dtype, device="cuda", seed=3)
    gen = torch.Generator(device="cuda").manual_seed(3)
    pair = torch.randn(1, n, n, config.pair_dim, generator=gen, device="cuda", dtype=dtype)
    return inputs.node_repr, pair, inputs.translations, inputs.rotations


def fused_operands(inputs, klass: int | None = None):
    """The cuda-fused kernel's prepared operands for `timing_inputs`, in the layout of kernel
    class `klass` (None: the class the variant picks)."""
    config = IPAConfig()
    node_repr, pair, translations, rotations = inputs
    weights = Weights(init_state_dict(config), config, "cuda")
    klass = kernel_class(config) if klass is None else klass
    widths = Widths.for_lanes(config, LANES[klass])
    units = base2_units(weights.pair_bias, weights.head_weights, config.head_dim)
    ops = project(weights, node_repr, translations, rotations, widths=widths,
                  q_scale=units.q_scale)
    out = torch.empty(1, pair.shape[1], config.heads, widths.dv, device="cuda")
    return (ops.q, ops.k, ops.v, pair, units.pair_weight, units.point_weight, out, klass,
            widths.dqp, widths.dv)


def _timed(fn, args, policy: TimingPolicy, flusher: L2Flusher) -> dict:
    """`fn(*args)` timed by the sweep's timer: median, p20, p80 (ms), samples, relative noise."""
    timing = time_cuda(lambda: fn(*args), policy, flusher)
    return {"median_ms": round(timing.median_ms, 4), "p20_ms": round(timing.p20_ms, 4),
            "p80_ms": round(timing.p80_ms, 4), "samples": timing.n_samples,
            "rel_noise": round(timing.rel_noise, 4)}


def kernel_ab(lengths, policy: TimingPolicy) -> list[dict]:
    """The cuda-fused kernel alone in each class that takes the default config, then the whole
    variant (PyTorch steps around the kernel included) on the same pair_repr."""
    ext = load_extension()
    flusher = L2Flusher(torch.device("cuda"))
    config = IPAConfig()
    rows = []
    for precision in ("fp32", "bf16"):
        forward = CudaFused().build(init_state_dict(config), config, "cuda", precision)
        for n in lengths:
            inputs = timing_inputs(n, precision)
            for klass in (AF2, SMALL):
                operands = fused_operands(inputs, klass)
                plan = ext.fused_forward(*operands)
                rows.append({"what": "kernel", "klass": klass, "precision": precision, "N": n,
                             "plan": list(plan), **_timed(ext.fused_forward, operands, policy,
                                                          flusher)})
                print(json.dumps(rows[-1]), flush=True)
                del operands
            with torch.no_grad():
                timing = _timed(forward, inputs, policy, flusher)
            rows.append({"what": "variant", "klass": kernel_class(config),
                         "precision": precision, "N": n, **timing})
            print(json.dumps(rows[-1]), flush=True)
            del inputs
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", nargs="+", choices=["env", "diag", "ab", "ncu-target"])
    parser.add_argument("--lengths", default="1024,4096", help="ab: comma-separated N")
    parser.add_argument("--min-samples", type=int, default=TimingPolicy.min_samples,
                        help="ab: at least this many timed samples per row")
    parser.add_argument("--budget", type=float, default=TimingPolicy.budget_s,
                        help="ab: seconds of sampling per row once --min-samples are taken")
    parser.add_argument("--length", type=int, default=4096, help="ncu-target: N")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--klass", type=int, default=None,
                        help="ncu-target: kernel class (0 small, 1 generic, 2 af2; default: the "
                        "variant's)")
    parser.add_argument("--out", default=OUT)
    opts = parser.parse_args()
    os.makedirs(opts.out, exist_ok=True)
    results = {}
    if "env" in opts.steps:
        results["env"] = env_report()
        print(json.dumps(results["env"]), flush=True)
    if "diag" in opts.steps:
        results["diag"] = diag()
    if "ab" in opts.steps:
        policy = TimingPolicy(min_samples=opts.min_samples, budget_s=opts.budget)
        results["ab"] = kernel_ab([int(x) for x in opts.lengths.split(",")], policy)
    if "ncu-target" in opts.steps:
        operands = fused_operands(timing_inputs(opts.length, opts.precision), opts.klass)
        load_extension().fused_forward(*operands)
        torch.cuda.synchronize()
    if results:
        with open(os.path.join(opts.out, f"measure-{'-'.join(opts.steps)}.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
