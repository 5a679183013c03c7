"""sm_90 compile-time proxy of problem openfold's fused Triton kernel (no GPU needed); also
of `triton-pairdot`, the same kernel without pair values (`--problem simplified`).

Compiles `variants/openfold/triton_kernel.py`'s `_openfold_kernel` for sm_90 on the CPU
machine, specialised exactly as the real launch does: the variant's own host code
(`FusedForward`, B = 1, default layer, CPU tensors) runs with the autotuned kernels replaced by
a recorder, and each autotune config goes through triton's own binder and `_pack_args` into
`triton.compile` for GPUTarget('cuda', 90, 32). Per config it prints registers, spills (stack
bytes / 4: the GPU's `n_spills`), shared bytes (`!`: over sm_90's 227 KiB per block, the
launch would fail), the key loop's SASS instructions per warp and key block (`loop`; `common`:
less the conditional forward branches longer than 32 instructions inside it, i.e. LAZY's
rescale block when skipped), ipp = common x warps / (BLOCK_M x BLOCK_N) (warp-instructions per
query-key pair), the loop's LDL + STL, and `dup`: how many times the 3-D (batched) dots'
warpsPerCTA repeats their work on the batch axis (more warps there than rows: triton 3.6 puts
every warp on it, so BLOCK_M < num_warps duplicates), with that warpsPerCTA.
On triton 3.6.0 (the H200's) this reproduced the GPU's registers, n_spills and shared bytes
of all 14 configs of 2026-12-03 exactly. Other triton versions describe another compiler.

Setup, once, from the repository root (the GPU machine's triton; ptxas and cuobjdump, CUDA
12.8, come with its wheel):

    python3 -m venv build/sm90-proxy-venv
    build/sm90-proxy-venv/bin/pip install torch==2.13.0 numpy triton==3.6.0

Run, from the repository root:

    PYTHONPATH=. build/sm90-proxy-venv/bin/python gpu_diagnostics/sm90_proxy.py
        [--problem openfold|simplified] [--config "fp32:8,16,8,2,2,1,0,1,0" ...]
        [--predict N] [--layer heads=4,value_points=12] [--json FILE] [--dump DIR]

Without --config: every config of `_FP32` and `_16BIT` (`--problem simplified`: of
`_BIAS_FP32` and `_BIAS_16BIT`, compiled for `triton-pairdot`'s launch). A --config is DTYPE
(fp32 or bf16) and the lists' tuple BLOCK_M, BLOCK_N, warps, stages, ZCH, SPLIT, LAZY, TC,
BT. --layer changes fields of the default layer (the config class's names). --json writes the
rows, --dump the SASS and TTGIR of each config. Compiles go through triton's cache.

--predict N specialises the launch at N (default 2048; N matters only where an int argument
outgrows int32: from N = 4096 z's batch stride is i64) and adds ms, a time predicted from
G = N^2 x ipp / 1e9 (G warp-instructions in the key loops) and S = N^2 x (LDL + STL) x warps
/ (BLOCK_M x BLOCK_N) / 1e9, with fits to the H200's timings at N = 2048 of 2026-12-03
(results/h200-2026-12-03-openfold-triton/bench.log, triton 3.6.0, B = 1):
    fp32: ms = 5.50 x (G + 3.4 x S)   6 configs, BLOCK_M 2-4, 8 warps, 2 stages; R^2 0.94,
                                      max error 7%
    bf16: ms = 3.19 x G + 0.83        6 configs, BLOCK_M 4-8, 8 warps, 2 stages; R^2 0.90,
                                      max error 16% (its 1-stage configs ran up to 2x slower)
Valid near those configs and N = 2048 only; a prediction outside them is marked `*`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from unittest import mock

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

import variants.openfold.triton_kernel as tk
import variants.triton.common as common
from variants.openfold.problem import OpenFoldConfig, init_state_dict, make_inputs
from variants.openfold.reference import make_module
from variants.openfold.triton_fused import FusedForward
from variants.problem import get_precision, math_mode

GPU_TRITON = "3.6.0"
TARGET = GPUTarget("cuda", 90, 32)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# dtype: (a, b, c, fitted (BLOCK_M, warps, stages)): ms = a * (G + b * S) + c
FITS = {"fp32": (5.50, 3.4, 0.0, {(2, 8, 2), (4, 8, 2)}),
        "bf16": (3.19, 0.0, 0.83, {(4, 8, 2), (8, 8, 2)})}
LAZY_MIN_SPAN = 32
SHARED_MAX = 232448  # sm_90: 227 KiB of shared memory per block
INSTR = re.compile(r"\s+/\*([0-9a-f]{4,5})\*/\s+(.*)")
BRANCH = re.compile(r"BRA(?:\.\w+)?\s+(?:\w+,\s*)?(0x[0-9a-f]+)")


class Recorder:
    """Stands in for an autotuned kernel: keeps the arguments of its launch."""

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.args, self.kwargs = args, kwargs
        return record


def _forward(problem: str, dtype: str, layer: dict):
    """The variant's forward on the CPU and its inputs' maker (B = 1, the default layer with
    `layer`'s fields changed): openfold's `triton`, or simplified's `triton-pairdot` (the
    kernel without pair values)."""
    if problem == "openfold":
        cfg = OpenFoldConfig(**layer)
        mod = make_module(init_state_dict(cfg), cfg, "cpu", DTYPES[dtype])
        fwd = FusedForward(mod, torch.device("cpu"), DTYPES[dtype],
                           get_precision(dtype).math_mode)
        return fwd, lambda n: make_inputs(cfg, 1, n, dtype=DTYPES[dtype], device="cpu", seed=4)
    from variants import problem as simplified
    from variants.reference import init_state_dict as simplified_state_dict
    from variants.triton.variants import TritonPairDot

    cfg = simplified.IPAConfig(**layer)
    fwd = TritonPairDot()._forward(simplified_state_dict(cfg), cfg, "cpu", get_precision(dtype))
    return fwd, lambda n: simplified.make_inputs(cfg, 1, n, dtype=DTYPES[dtype], device="cpu",
                                                 seed=4)


def launch_args(problem: str, dtype: str, n: int, layer: dict) -> tuple[tuple, dict]:
    """The arguments the variant's `launch` passes to the autotuned kernel."""
    from variants.triton import frames, linear

    rec = Recorder()
    # The fused kernel records its launch; the frame kernels around it (no driver here) only
    # stand still: the kernel is specialised on its operands' shapes and strides, not values.
    stand_ins = [(tk, name, rec) for name in ("_kernel_fp32", "_kernel_16bit",
                                               "_bias_kernel_fp32", "_bias_kernel_16bit")]
    stand_ins += [(frames, name, Recorder()) for name in ("_prologue_kernel",
                                                          "_epilogue_kernel")]
    stand_ins += [(linear, "_linear", Recorder()), (common, "check_runnable", lambda *a: None)]
    with standing_in(stand_ins), torch.no_grad(), math_mode(dtype):
        fwd, inputs = _forward(problem, dtype, layer)
        fwd(*inputs(n).as_tuple())
    return rec.args, rec.kwargs


@contextlib.contextmanager
def standing_in(stand_ins: list[tuple[object, str, object]]):
    """Each (module, name, stand_in) in place of module.name for the block, restored after."""
    with contextlib.ExitStack() as stack:
        for module, name, stand_in in stand_ins:
            stack.enter_context(mock.patch.object(module, name, stand_in))
        yield


def compile_config(args: tuple, kwargs: dict, config: triton.Config, fn=None):
    """What `JITFunction.run` does for one autotune config of `fn` (default: the openfold
    kernel), minus the driver."""
    fn = tk._openfold_kernel if fn is None else fn
    backend = make_backend(TARGET)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kw = dict(kwargs, **config.all_kwargs(), debug=False,
              instrumentation_mode=triton.knobs.compilation.instrumentation_mode)
    bound, spec, opts = binder(*args, **kw)
    options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, opts)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET,
                          options=options.__dict__)


def sass_stats(cubin: bytes) -> tuple[int, int, str]:
    """Registers, stack bytes and SASS of a cubin (the wheel's cuobjdump)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        tool = triton.knobs.nvidia.cuobjdump.path
        res = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True,
                             check=True).stdout
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True,
                              check=True).stdout
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    stack = int(re.search(r"STACK:(\d+)", res).group(1))
    return regs, stack, sass


def key_loop(sass: str) -> dict:
    """The key loop (the longest backward branch before the first EXIT): its instruction count,
    that less the instructions skipped by conditional forward branches over more than
    LAZY_MIN_SPAN instructions (LAZY's rescale block; triton 3.6's short `@P BRA` hops around
    pipelined copies do run), and its opcode counts."""
    instrs = [(int(m.group(1), 16), m.group(2)) for m in map(INSTR.match, sass.splitlines()) if m]
    exits = [a for a, text in instrs if re.search(r"\bEXIT\b", text)]
    first_exit = min(exits, default=1 << 30)
    branches = [(a, int(m.group(1), 16), text.startswith("@"))
                for a, text in instrs if (m := BRANCH.search(text))]
    back = [(t, s) for s, t, _ in branches if t < s < first_exit]
    lo, hi = max(back, key=lambda b: b[1] - b[0])
    skipped = sum((t - s) // 16 - 1 for s, t, cond in branches
                  if cond and lo <= s < t <= hi and (t - s) // 16 > LAZY_MIN_SPAN)
    ops = collections.Counter(text.split()[1 if text.startswith("@") else 0].split(".")[0]
                              for a, text in instrs if lo <= a <= hi)
    loop = sum(ops.values())
    return dict(loop=loop, common=loop - skipped, ops=ops)


def batch_duplication(ttgir: str) -> tuple[int, list[int]]:
    """The largest factor by which a 3-D dot's warps repeat work on its batch axis (warps
    there beyond the rows they can cover), and that dot's warpsPerCTA (without any: the
    smallest batch's, the dots over BLOCK_M rows)."""
    def field(body: str, key: str) -> list[int]:
        return [int(x) for x in re.search(key + r" = \[([\d, ]+)\]", body).group(1).split(",")]

    layouts = {}
    for name, kind, body in re.findall(r"^(#\w+) = #ttg\.(nvidia_mma|blocked)<\{(.*)\}>", ttgir,
                                       re.M):
        rows = (field(body, "instrShape")[0] if kind == "nvidia_mma"
                else field(body, "sizePerThread")[0] * field(body, "threadsPerWarp")[0])
        layouts[name] = field(body, "warpsPerCTA"), rows
    dots = []
    for batch, name in re.findall(r"= tt\.dot .* -> tensor<(\d+)x\d+x\d+x\w+, (#\w+)>", ttgir):
        warps, rows = layouts[name]
        dots.append((max(1, warps[0] // math.ceil(int(batch) / rows)), -int(batch), warps))
    dup, _, warps = max(dots, default=(1, 0, []))
    return dup, warps


def parse_config(text: str) -> tuple[str, tuple]:
    """`fp32:8,16,8,2,2,1,0,1,0` -> (dtype, the lists' tuple)."""
    dtype, _, rest = text.partition(":")
    values = [int(x) for x in rest.split(",")]
    if dtype not in DTYPES or len(values) != 9:
        raise argparse.ArgumentTypeError(f"expected DTYPE:BM,BN,warps,stages,ZCH,SPLIT,LAZY,TC,BT"
                                         f" with DTYPE in {sorted(DTYPES)}, got {text!r}")
    m, bn, w, s, zch, split, lazy, tc, bt = values
    return dtype, (m, bn, w, s, zch, bool(split), bool(lazy), tc, bool(bt))


def parse_layer(text: str) -> dict[str, int]:
    """`heads=4,value_points=12` -> {"heads": 4, "value_points": 12}."""
    try:
        return {k.strip(): int(v) for k, v in (kv.split("=") for kv in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected FIELD=INT[,FIELD=INT...], got {text!r}") from None


def predict(row: dict, n: int) -> str:
    """Sets row["ms"] from the H200 fits; `*` outside the configs they were fitted on."""
    a, b, c, fitted = FITS[row["dtype"]]
    pairs = row["BM"] * row["BN"]
    g = n * n * row["ipp"] / 1e9
    s = n * n * (row["LDL"] + row["STL"]) * row["warps"] / pairs / 1e9
    row["ms"] = a * (g + b * s) + c
    inside = (row["BM"], row["warps"], row["stages"]) in fitted
    return f"{row['ms']:6.2f}{' ' if inside else '*'}"


def warn_version() -> None:
    if triton.__version__ != GPU_TRITON:
        print(f"WARNING: triton {triton.__version__} is not the GPU machine's {GPU_TRITON}: these "
              f"numbers describe another compiler (see this script's docstring for the venv)",
              file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", type=parse_config, default=[],
                        help="DTYPE:BM,BN,warps,stages,ZCH,SPLIT,LAZY,TC,BT (repeatable)")
    parser.add_argument("--predict", type=int, metavar="N", help="add a predicted ms at N")
    parser.add_argument("--problem", choices=("openfold", "simplified"), default="openfold",
                        help="simplified: triton-pairdot's launch (no pair values, no mask)")
    parser.add_argument("--layer", type=parse_layer, default={}, metavar="FIELD=INT,...",
                        help="the layer's config fields to change, e.g. heads=4,value_points=12")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--dump", metavar="DIR", help="keep each config's SASS and TTGIR")
    opts = parser.parse_args(argv)
    tables = ((tk._FP32, tk._16BIT) if opts.problem == "openfold"
              else (tk._BIAS_FP32, tk._BIAS_16BIT))
    configs = opts.config or ([("fp32", t) for t in tables[0]] + [("bf16", t) for t in tables[1]])
    n = opts.predict or 2048
    warn_version()
    print(f"# triton {triton.__version__}, ptxas {triton.knobs.nvidia.ptxas.path}, sm_90, "
          f"launch at B = 1, N = {n}; config = BM,BN,warps,stages,ZCH,SPLIT,LAZY,TC,BT")
    print(f"{'dtype':5} {'config':22} {'regs':>4} {'spills':>6} {'shared':>6}  {'loop':>5} "
          f"{'common':>6} {'ipp':>6} {'LDL+STL':>7}  dup" + ("  ms" if opts.predict else ""))
    launches, rows = {}, []
    for dtype, t in configs:
        if dtype not in launches:
            launches[dtype] = launch_args(opts.problem, dtype, n, opts.layer)
        k = compile_config(*launches[dtype], tk._configs([t])[0])
        regs, stack, sass = sass_stats(k.asm["cubin"])
        loop = key_loop(sass)
        dup, dot_warps = batch_duplication(k.asm["ttgir"])
        m, bn, w, s, zch, split, lazy, tc, bt = t
        cfg = ",".join(str(int(x)) for x in t)
        row = dict(dtype=dtype, config=cfg, BM=m, BN=bn, warps=w, stages=s, ZCH=zch,
                   SPLIT=split, LAZY=lazy, TC=tc, BT=bt, regs=regs, spills=stack // 4,
                   shared=k.metadata.shared, loop=loop["loop"], common=loop["common"],
                   ipp=loop["common"] * w / (m * bn), LDL=loop["ops"]["LDL"],
                   STL=loop["ops"]["STL"], dup=dup, dot_warps=dot_warps,
                   triton=triton.__version__, N=n)
        dup_text = f"{dup}x {dot_warps}" if dup > 1 else f"no {dot_warps}"
        ms = f"  {predict(row, n)}" if opts.predict else ""
        over = "!" if row["shared"] > SHARED_MAX else " "
        print(f"{dtype:5} {cfg:22} {regs:4} {row['spills']:6} {row['shared']:6}{over}"
              f"{row['loop']:5} {row['common']:6} {row['ipp']:6.1f} "
              f"{row['LDL'] + row['STL']:7}  {dup_text}{ms}", flush=True)
        rows.append(row)
        if opts.dump:
            os.makedirs(opts.dump, exist_ok=True)
            tag = os.path.join(opts.dump, f"{dtype}_{cfg.replace(',', '_')}")
            for ext, text in (("sass", sass), ("ttgir", k.asm["ttgir"])):
                with open(f"{tag}.{ext}", "w") as f:
                    f.write(text)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)
    warn_version()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
