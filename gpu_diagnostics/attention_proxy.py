"""No GPU: compiles the `triton` forward's attention kernel (`variants/triton/attention.py`)
and triton-train's backward kernels (`variants/triton/bias_backward.py`) for sm_90 here, on the
CPU machine, with the GPU machine's triton 3.6.0, specialised as their launchers launch them at
the default layer (--layer: with those `IPAConfig` fields changed; not problem openfold's
forms), for every config of each of their autotuned forms:
registers, spills (stack bytes / 4) and shared bytes, as `sm90_proxy.py` does for the openfold
kernel (whose venv it needs: see there). Configs that spill are the ones to drop.

    PYTHONPATH=. build/sm90-proxy-venv/bin/python gpu_diagnostics/attention_proxy.py [N] [FORM...]
        [--layer heads=4,value_points=12]

Forms: fp32 with 3xTF32 dots (`_attention_split`, the default), fp32 IEEE (`_attention_direct`,
`triton_ipa(fp32_dots="ieee")`), bf16 with its point dots as 3xBF16 (`_attention_bf16_split`, the
default) and as 3xTF32/TF32 (`_attention_dot`, `triton_ipa(half_points="tf32")`); triton-train's
forward, the same kernel writing the logits and the row statistics (`TRAIN_FORMS`); the backward's
key, query and pair kernels in fp32 (3xTF32) and 16-bit (`BACKWARD_FORMS`); problem openfold's
`triton-bias` kernels, its attention kernel writing the logits and its pair values
(`OPENFOLD_BIAS_FORMS`), and its backward's (`OPENFOLD_BACKWARD_FORMS`). FORM names the labels to
compile (default: all). One line per config on stdout: registers, spills, shared bytes, and the main
loop's warp-instructions per (query, key) pair (the pair kernel's: per (i, j) pair) with its
shared-memory loads and stores (LDS, STS) and its spill loads and stores (LDL, STL) per warp and
block. Memory: the N^2-sized operands are left uninitialised (never touched), but problem openfold's
forward forms draw real inputs, z alone N^2 x 128 x 4 bytes (8.6 GB at N = 4096): compile those at N
<= 2048 on this 23 GB machine.
"""

from __future__ import annotations

import sys

import torch

import variants.triton.attention as att
import variants.triton.bias_backward as bb
import variants.triton.common as common
import variants.triton.linear as linear
import variants.triton.pipeline as pipeline
import variants.triton.sums as sums
from gpu_diagnostics.sm90_proxy import (
    Recorder,
    compile_config,
    key_loop,
    parse_layer,
    sass_stats,
    standing_in,
    warn_version,
)
from variants import problem
from variants.reference import init_state_dict
from variants.triton import frames, pair_bias

# label: (autotuned kernel, input dtype, `triton_ipa` options)
FORMS = {"attention_direct": ("_attention_direct", torch.float32, {"fp32_dots": "ieee"}),
         "attention_split": ("_attention_split", torch.float32, {}),
         "attention_dot": ("_attention_dot", torch.bfloat16, {"half_points": "tf32"}),
         "attention_bf16_split": ("_attention_bf16_split", torch.bfloat16, {})}


# triton-train's backward: the key kernel (`bias_backward._key_kernel`), d point_weight's sums
# (`_point_weight_kernel`) and the pair kernel (`_pair_kernel`, d pair_repr and dW_b; the sums
# of dS run on cuBLAS), label: (autotuned form, input dtype)
KERNELS = {"_point_weight": "_point_weight_kernel",
           "_pair": "_pair_kernel", "_pair_narrow": "_pair_kernel"}  # else the key kernel
BACKWARD_FORMS = {"keys_3xtf32": ("_key_3xtf32", torch.float32),
                  "keys_16bit": ("_key_16bit", torch.bfloat16),
                  "point_weight": ("_point_weight", torch.float32),
                  "pairs_3xtf32": ("_pair", torch.float32),
                  "pairs_16bit": ("_pair", torch.bfloat16),
                  "pairs_narrow_3xtf32": ("_pair_narrow", torch.float32),
                  "pairs_narrow_16bit": ("_pair_narrow", torch.bfloat16)}


# The backwards' O(N) row terms (`variants/triton/sums.py`), standing still: D from its operands'
# shapes, the sums of dS returning its inputs.
SUMS_STAND_INS = [
    (bb, "row_delta", lambda grad_s, *a: torch.zeros(grad_s.shape[:3])),
    (sums, "row_delta", lambda grad_s, *a: torch.zeros(grad_s.shape[:3])),
    (bb, "gemm_ds_sums", lambda ds, q, k, q_pts, k_pts, *a: (q, k, q_pts, k_pts)),
]


def backward_launch_args(name: str, dtype: torch.dtype, n: int, layer: dict
                         ) -> tuple[tuple, dict]:
    """The arguments `bias_backward.launch_bias_backward` passes to the backward kernel's
    autotuned form `name` at the default layer with `layer`'s fields changed (operands of the
    right shapes and dtypes; their values do not matter to the compiler); the other kernels only
    stand still."""
    cfg = problem.IPAConfig(**layer)
    b, h, d, p3, vp3 = 1, cfg.heads, cfg.head_dim, 3 * cfg.query_points, 3 * cfg.value_points
    rec = Recorder()
    rec.configs = getattr(bb, name).configs
    logits = torch.empty(b, h, n, n)  # N^2-sized operands: empty, never touched
    pair_weight = torch.zeros(h, cfg.pair_dim, dtype=dtype)
    pair_forms = ("_pair", "_pair_narrow")
    if name in pair_forms:  # each stands for the one pair_gradients launches
        with standing_in([*((bb, form, rec) for form in pair_forms),
                          (bb, "sm_count", lambda device: 132)]):
            bb.pair_gradients(logits, torch.empty(b, n, n, cfg.pair_dim, dtype=dtype), pair_weight)
        return rec.args, rec.kwargs
    f32 = torch.float32
    q, k, v, grad_s, out_s = (torch.zeros(b, n, h, d, dtype=dtype) for _ in range(5))
    q_pts, k_pts = (torch.zeros(b, h, p3, n, dtype=f32) for _ in range(2))
    v_pts = torch.zeros(b, h, n, vp3, dtype=f32)
    grad_p, out_p = (torch.zeros(b, n, h, vp3, dtype=f32) for _ in range(2))
    stats = torch.zeros(b, n, h, 3, dtype=f32)
    key_kernel = "_key_3xtf32" if dtype == torch.float32 else "_key_16bit"
    key_rec = Recorder()
    key_rec.configs = getattr(bb, key_kernel).configs
    stand_ins = [(bb, key_kernel, key_rec), (bb, "_point_weight", Recorder()), (bb, name, rec),
                 (bb, "pair_gradients", lambda *a: (None, torch.zeros(1))), *SUMS_STAND_INS]
    with standing_in(stand_ins), torch.no_grad():
        bb.launch_bias_backward(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, None, pair_weight,
                                torch.zeros(h), out_s, out_p, stats, logits,
                                common.dot_modes(dtype, "ieee"))
    return rec.args, rec.kwargs


def launch_args(name: str, dtype: torch.dtype, options: dict, n: int, layer: dict
                ) -> tuple[tuple, dict]:
    """The arguments the forward (with `options`, at the default layer with `layer`'s fields
    changed) passes to the attention kernel's autotuned form `name`; the other kernels only
    stand still (no driver here)."""
    tuned = getattr(att, name)
    rec = Recorder()
    rec.configs = tuned.configs  # the launcher reads the block sizes it may get
    # the launcher looks its form up in `common.TUNED` (by the name without its underscore)
    stand_ins = [(att, "TUNED", {**att.TUNED, name[1:]: rec}),
                 (frames, "_prologue_kernel", Recorder()),
                 (frames, "_epilogue_kernel", Recorder()), (pair_bias, "_pair_bias", Recorder()),
                 (linear, "_linear", Recorder()),
                 (common, "check_runnable", lambda *a: None),
                 (pipeline, "check_runnable", lambda *a: None)]
    cfg = problem.IPAConfig(**layer)
    weights = pipeline.TritonIPAWeights.from_state_dict(init_state_dict(cfg), cfg, "cpu", dtype)
    inputs = problem.make_inputs(cfg, 1, n, dtype=dtype, device="cpu", seed=1)
    with standing_in(stand_ins), torch.no_grad():
        pipeline.triton_ipa(weights, *inputs.as_tuple(), **options)
    return rec.args, rec.kwargs


# triton-train's forward (`attention.launch_logits_attention`): the attention kernel writing the
# logits over its bias and saving the row statistics, label: input dtype
TRAIN_FORMS = {"train_logits_fp32": torch.float32, "train_logits_bf16": torch.bfloat16}


def train_launch_args(dtype: torch.dtype, n: int, layer: dict) -> tuple[object, tuple, dict]:
    """(the autotuned form, the arguments triton-train's forward passes it) at the default layer
    with `layer`'s fields changed, B = 1 (its bias an empty stand-in)."""
    cfg = problem.IPAConfig(**layer)
    b, h, d, p3, vp3 = 1, cfg.heads, cfg.head_dim, 3 * cfg.query_points, 3 * cfg.value_points
    f32 = torch.float32
    q, k, v, out_s = (torch.zeros(b, n, h, d, dtype=dtype) for _ in range(4))
    q_pts, k_pts = (torch.zeros(b, h, p3, n, dtype=f32) for _ in range(2))
    recorders = {form: Recorder() for form in att._LOGITS_TWIN}
    for form, rec in recorders.items():
        rec.configs = att._LOGITS_TWIN[form].configs
    with standing_in([(att, "_LOGITS_TWIN", recorders)]), torch.no_grad():
        att.launch_logits_attention(q, k, v, q_pts, k_pts, torch.zeros(b, h, n, vp3),
                                    torch.zeros(b, n, 3), torch.zeros(h), out_s,
                                    torch.empty(b, h, n, n), common.dot_modes(dtype, "ieee"))
    form, rec = next((f, r) for f, r in recorders.items() if hasattr(r, "args"))
    return att._LOGITS_TWIN[form], rec.args, rec.kwargs


# problem openfold's `triton-bias` (`variants/openfold/triton_bias.py`): its attention kernel
# writing the logits, and its pair-value kernel, label: (kernel, input dtype)
OPENFOLD_BIAS_FORMS = {"openfold_logits_fp32": ("logits", torch.float32),
                       "openfold_logits_bf16": ("logits", torch.bfloat16),
                       "openfold_pair_values_fp32": ("pair_values", torch.float32),
                       "openfold_pair_values_bf16": ("pair_values", torch.bfloat16)}


def openfold_bias_launch_args(kernel: str, dtype: torch.dtype, n: int
                              ) -> tuple[object, tuple, dict]:
    """(the autotuned kernel, the arguments `triton-bias`'s forward passes it) at the default
    openfold layer; the other kernels only stand still."""
    from variants.openfold import pair_values as pv
    from variants.openfold.problem import OpenFoldConfig, make_inputs
    from variants.openfold.problem import init_state_dict as openfold_state_dict
    from variants.openfold.reference import make_module
    from variants.openfold.triton_bias import BiasForward

    cfg = OpenFoldConfig()
    fwd = BiasForward(make_module(openfold_state_dict(cfg), cfg, "cpu", dtype),
                      torch.device("cpu"), dtype, "ieee")
    recorders = {form: Recorder() for form in att._LOGITS_TWIN}
    for form, rec in recorders.items():
        rec.configs = att._LOGITS_TWIN[form].configs
    values = Recorder()
    values.configs = pv._pair_values.configs  # the launcher reads the block sizes it may get
    stand_ins = [(att, "_LOGITS_TWIN", recorders), (pv, "_pair_values", values),
                 (pair_bias, "_pair_bias", Recorder()),
                 (frames, "_prologue_kernel", Recorder()),
                 (frames, "_epilogue_kernel", Recorder()), (linear, "_linear", Recorder()),
                 (common, "check_runnable", lambda *a: None)]
    inputs = make_inputs(cfg, 1, n, dtype=dtype, device="cpu", seed=1)
    with standing_in(stand_ins), torch.no_grad():
        fwd(*inputs.as_tuple())
    if kernel == "pair_values":
        return pv._pair_values, values.args, values.kwargs
    form, rec = next((f, r) for f, r in recorders.items() if hasattr(r, "args"))
    return att._LOGITS_TWIN[form], rec.args, rec.kwargs


# problem openfold's `triton-bias` backward (`variants/openfold/bias_backward.py`): the pair
# terms (G), the key kernel on the saved logits, the pair pass (d z, dW_b), label: (kernel
# module attribute, input dtype)
OPENFOLD_BACKWARD_FORMS = {"openfold_pair_terms_fp32": ("_pair_terms", torch.float32),
                           "openfold_pair_terms_bf16": ("_pair_terms", torch.bfloat16),
                           "openfold_keys_fp32": ("_key_3xtf32", torch.float32),
                           "openfold_keys_bf16": ("_key_16bit", torch.bfloat16),
                           "openfold_pair_backward_fp32": ("_pair_backward", torch.float32),
                           "openfold_pair_backward_bf16": ("_pair_backward", torch.bfloat16)}


def openfold_backward_launch_args(name: str, dtype: torch.dtype, n: int
                                  ) -> tuple[object, tuple, dict]:
    """(the autotuned kernel, the arguments `bias_backward.launch_backward` of problem openfold
    passes it) at the default layer, B = 1; the other kernels only stand still."""
    from variants.openfold import bias_backward as ob
    from variants.openfold.problem import OpenFoldConfig

    cfg = OpenFoldConfig()
    b, h, c, p3, vp3 = 1, cfg.no_heads, cfg.c_hidden, 3 * cfg.no_qk_points, 3 * cfg.no_v_points
    f32 = torch.float32
    q, k, v, grad_o, o = (torch.zeros(b, n, h, c, dtype=dtype) for _ in range(5))
    q_pts, k_pts = (torch.zeros(b, h, p3, n, dtype=f32) for _ in range(2))
    v_pts = torch.zeros(b, h, n, vp3, dtype=f32)
    grad_o_pt, o_pt = (torch.zeros(b, n, h, vp3, dtype=f32) for _ in range(2))
    grad_o_pair, o_pair = (torch.zeros(b, n, h, cfg.c_z, dtype=f32) for _ in range(2))
    z = torch.empty(b, n, n, cfg.c_z, dtype=dtype)  # N^2-sized: empty, never touched
    w_b = torch.zeros(h, cfg.c_z, dtype=dtype)
    stats, logits = torch.zeros(b, n, h, 3), torch.empty(b, h, n, n)
    recorders = {}
    stand_ins = []
    for module, attr in [(ob, "_pair_terms"), (ob, "_pair_backward"), (bb, "_key_3xtf32"),
                         (bb, "_key_16bit"), (bb, "_point_weight")]:
        rec = Recorder()
        rec.configs = getattr(module, attr).configs
        recorders[attr] = (getattr(module, attr), rec)
        stand_ins.append((module, attr, rec))
    stand_ins += SUMS_STAND_INS
    with standing_in(stand_ins), torch.no_grad():
        ob.launch_backward(grad_o, grad_o_pt, grad_o_pair, q, k, v, q_pts, k_pts, v_pts, z,
                           w_b, torch.zeros(h), o, o_pt, o_pair, stats, logits,
                           common.dot_modes(dtype, "ieee"), q_scale=0.2, bias_scale=0.577)
    tuned, rec = recorders[name]
    return tuned, rec.args, rec.kwargs


def main(argv: list[str]) -> int:
    warn_version()
    layer = {}
    if "--layer" in argv:
        i = argv.index("--layer")
        layer, argv = parse_layer(argv[i + 1]), argv[:i] + argv[i + 2:]
    n = int(argv[0]) if argv else 1024
    chosen = set(argv[1:]) or (set(FORMS) | set(BACKWARD_FORMS) | set(TRAIN_FORMS)
                               | set(OPENFOLD_BIAS_FORMS) | set(OPENFOLD_BACKWARD_FORMS))
    forms = [(label, getattr(att, name), att._attention_kernel,
              launch_args(name, dtype, options, n, layer))
             for label, (name, dtype, options) in FORMS.items() if label in chosen]
    forms += [(label, getattr(bb, name), getattr(bb, KERNELS.get(name, "_key_kernel")),
               backward_launch_args(name, dtype, n, layer))
              for label, (name, dtype) in BACKWARD_FORMS.items() if label in chosen]
    for label, dtype in TRAIN_FORMS.items():
        if label in chosen:
            tuned, args, kwargs = train_launch_args(dtype, n, layer)
            forms.append((label, tuned, tuned.fn, (args, kwargs)))
    for label, (kernel, dtype) in OPENFOLD_BIAS_FORMS.items():
        if label in chosen:
            tuned, args, kwargs = openfold_bias_launch_args(kernel, dtype, n)
            forms.append((label, tuned, tuned.fn, (args, kwargs)))
    for label, (name, dtype) in OPENFOLD_BACKWARD_FORMS.items():
        if label in chosen:
            tuned, args, kwargs = openfold_backward_launch_args(name, dtype, n)
            forms.append((label, tuned, tuned.fn, (args, kwargs)))
    for label, tuned, fn, (args, kwargs) in forms:
        for config in tuned.configs:
            kernel = compile_config(args, kwargs, config, fn=fn)
            regs, stack, sass = sass_stats(kernel.asm["cubin"])
            loop = key_loop(sass)
            # (query, key) pairs a loop trip covers (one query row without BLOCK_M)
            tile = config.kwargs.get("BLOCK_P") or (config.kwargs.get("BLOCK_M", 1)
                                                     * config.kwargs["BLOCK_N"])
            if "BLOCK_C" in config.kwargs:  # the pair values: per pair and channel slice
                tile *= config.kwargs["BLOCK_C"] / kwargs["C"]
            per_pair = loop["loop"] * config.num_warps / tile
            cap = f" maxnreg {config.maxnreg}" if config.maxnreg else ""
            print(f"{label} {config.kwargs} warps {config.num_warps} stages "
                  f"{config.num_stages}{cap}: {regs} registers, {stack // 4} spilled, "
                  f"{kernel.metadata.shared} B shared; {per_pair:.2f} instructions per pair, "
                  f"LDS {loop['ops']['LDS']} STS {loop['ops']['STS']} LDL {loop['ops']['LDL']} "
                  f"STL {loop['ops']['STL']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
