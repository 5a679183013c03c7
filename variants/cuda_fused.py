"""cuda-fused: flash-style IPA in one CUDA kernel that reads pair_repr once and writes no N x N
tensor.

Idea: FlashAttention's tiling and online softmax (Dao et al. 2022) applied to IPA, with the
pair-bias projection pulled into the kernel so that the (B, N, N, pair_dim) input, the only
O(N^2) tensor, streams through once. A CTA owns a few queries of one batch element for all
heads (one warp per head); per key tile each warp first turns 8 (query, key) rows of pair_repr,
staged in shared memory by cp.async two tiles ahead, into H biases, then scores its queries
against the tile (scalar q.k, the softplus-weighted squared point distance computed directly,
the bias), updates an fp32 online softmax and accumulates [v | value points] in one pass.
`variants/csrc/ipa_fused.cu` documents the design and names the file of each kernel class;
`docs/perf-notes.md` has the measurements.

Differences from the reference: LayerNorm, projections and frame transforms run around the
kernel (`variants.cuda_ext`): the frames and every kernel operand in float32; the two GEMMs on
tensor cores, in bf16 for bf16 inputs (the projection accumulated and returned in float32) and
as 3xTF32 for float32 where the kernel's own products are (the rows that say `fp32-3xtf32`);
pair_repr is read in bf16 by the kernel, with fp32 accumulation; the softmax runs in base 2
with log2(e) folded into q, the point weight and the pair-bias weight; summation orders differ.
Extra memory is O(N): the (B, N, H, d + 3 Vp) output and, when the key range is split across
CTAs to fill the GPU at small N, partials of that order.

Caveats: forward only; float32 (IEEE) and bfloat16; heads <= 16, head_dim 8..128, Qp and Vp
1..16, pair_dim a multiple of 8 up to 128. Three kernel classes: `af2` (AlphaFold2's sizes
exactly: head_dim 32, Qp 4, Vp 8, pair_dim 128, even heads <= 12; every width a compile-time
constant, whole dot products per lane, pair bias without cross-lane reductions), `small` (even
heads <= 12, head_dim <= 32, d + 3 Vp <= 80) and `generic` (the rest; slower: 4 queries per
CTA, key/value rows read through L1). The first call of a process builds or loads the extension
(`variants.cuda_ext`). docs/perf-notes.md has the measurements of each version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from variants.base import IPAFunction, Variant
from variants.base2 import base2_units
from variants.cuda_ext import (
    CODE_PATHS,
    Weights,
    Widths,
    check_call_inputs,
    finish_on_gpu,
    gemms_label,
    load_extension,
    local_dtype,
    output_projection,
    project_on_gpu,
)
from variants.problem import IPAConfig, IPAInputError, Precision, get_precision

SMALL, GENERIC, AF2 = 0, 1, 2  # kernel classes, as in variants/csrc/ipa_kernels.h
MAX_PAIR_DIM = 128  # kMaxPairDim
# The `af2` class's pair-bias forms (FusedBias of ipa_kernels.h): FFMA, or tensor cores (mma.sync,
# W_b as hi + lo parts) with a warp's pairs (bf16 pair_repr only) or W_b's heads as the rows of
# the A operand; fp32 pair_repr in the head-rows form is 3xTF32 (`variants/csrc/ipa_fused_af2.cu`).
# TENSOR_CORES is a kernel of its own, `variants/csrc/ipa_fused_af2_tc.cu`: the head-rows bias on
# four extra warps, and the attention's q.k (3xTF32) and p.v on TF32 mma (bf16 pair_repr: p.v's
# operands rounded to TF32, relative 2^-11; fp32: 3xTF32; points, distances, softmax stay fp32).
FFMA_BIAS, MMA_PAIR_ROWS, MMA_HEAD_ROWS, TENSOR_CORES = 0, 1, 2, 3
BIAS_NAMES = {FFMA_BIAS: "FFMA", MMA_PAIR_ROWS: "mma, pair rows", MMA_HEAD_ROWS: "mma, head rows",
              TENSOR_CORES: "mma on bias warps, q.k (3xTF32) and p.v on TF32 mma"}
# The forms the af2 class takes for bf16 and fp32 pair_repr, read at each call, chosen by
# `gpu_diagnostics/bias_forms_session.sh`'s A/B (H100, CUDA-graph replay, one process, default
# layer, 2026-12-06; ms FFMA / pair rows / head rows): bf16 N = 4096 4.357 / 4.159 / 3.984,
# N = 1024 0.395 / 0.384 / 0.376; fp32 (3xTF32) N = 4096 5.254 -> 5.414, N = 1024 0.438 -> 0.453.
# Every form passes `check` (bf16 rel_l2 as FFMA's, fp32 3xTF32 err/ref 1.06-1.08).
# TENSOR_CORES (H100, replayed, 2026-12-07): bf16 N = 4096 4.029 (head rows) -> 2.095, fp32 5.397
# (FFMA) -> 3.639; its kernel-math tests hold bf16 at rel_l2 1.9e-4 (the TF32 emulation's) and fp32
# at 0.8-1.9e-7 against float64. The default for both. `check` at N = 1000 then gave bf16 rel_l2
# 1.39e-2 (err/ref 0.09) and fp32 err/ref 2.92; the fixes since (q.k 3xTF32 in bf16, each tile's
# P V added by an FFMA) ran on an H100 in the thirty-second session: fp32 err/ref 1.34, bf16 0.09.
BF16_BIAS = TENSOR_CORES
FP32_BIAS = TENSOR_CORES
# Key-range splits of a call, read at each call (an A/B switch): 0 lets the launch plan choose
# (enough CTAs to fill the SMs: at B = 1, 2 at N = 1024 and 8 at N = 256 for the af2 class).
KEY_SPLITS = 0
# Whether a call ends in finish_frames' launch inside the binding call (`fused_attention`'s
# `local`), read at each call (an A/B switch): one binding call fewer, and with two key-range
# splits the partials merged in finish's launch (one launch fewer than the combine then the
# finish; past two splits the combine runs first: `kFinishMergesUpTo`, ipa_fused.cu). H100,
# replayed (thirty-sixth session): fp32 N = 1024 0.287 -> 0.281 ms, bf16 0.171 -> 0.171; the GPU
# test holds it to the combine-then-finish's bits.
MERGED_FINISH = True


def bias_forms(klass: int, z_dtype: torch.dtype) -> list[int]:
    """The pair-bias forms kernel class `klass` has kernels for, for pair_repr of `z_dtype`."""
    if klass != AF2:
        return [FFMA_BIAS]
    if z_dtype == torch.bfloat16:
        return [FFMA_BIAS, MMA_PAIR_ROWS, MMA_HEAD_ROWS, TENSOR_CORES]
    return [FFMA_BIAS, MMA_HEAD_ROWS, TENSOR_CORES]


def splits_fp32(klass: int, form: int, dtype: torch.dtype) -> bool:
    """Whether a call in `dtype` of kernel class `klass` in pair-bias form `form` runs float32
    products as 3xTF32, and so its GEMMs around the kernel too (`split_gemms`)."""
    return dtype == torch.float32 and klass == AF2 and form in (MMA_HEAD_ROWS, TENSOR_CORES)


def bias_form(klass: int, z_dtype: torch.dtype) -> int:
    """The pair-bias form a call of kernel class `klass` on pair_repr of `z_dtype` takes now."""
    if klass != AF2:
        return FFMA_BIAS
    return BF16_BIAS if z_dtype == torch.bfloat16 else FP32_BIAS


@dataclass(frozen=True)
class ClassLimits:
    """One kernel class's limits, FusedClassLimits of ipa_kernels.h field for field (widths in
    floats, after padding; tests/test_cuda.py compares them with the C++ values)."""

    lanes_per_row: int  # operand rows are padded to multiples of 4 * lanes_per_row floats
    queries_per_cta: int
    max_heads: int
    even_heads: bool
    max_dqp: int  # head_dim, padded
    max_pqp: int  # 3 * query_points, padded
    max_wv: int  # head_dim + 3 * value_points, padded
    exact: bool  # the widths must equal the maxima (compile-time sizes)
    pair_dim: int  # the only pair_dim the class takes; 0: any multiple of 8 <= MAX_PAIR_DIM


CLASS_LIMITS = {
    SMALL: ClassLimits(lanes_per_row=2, queries_per_cta=16, max_heads=12, even_heads=True,
                       max_dqp=32, max_pqp=48, max_wv=80, exact=False, pair_dim=0),
    GENERIC: ClassLimits(lanes_per_row=8, queries_per_cta=4, max_heads=16, even_heads=False,
                         max_dqp=128, max_pqp=64, max_wv=192, exact=False, pair_dim=0),
    AF2: ClassLimits(lanes_per_row=1, queries_per_cta=16, max_heads=12, even_heads=True,
                     max_dqp=32, max_pqp=12, max_wv=56, exact=True, pair_dim=128),
}
LANES = {klass: limits.lanes_per_row for klass, limits in CLASS_LIMITS.items()}
PREFERENCE = (AF2, SMALL, GENERIC)  # a layer runs the first class that fits it


def class_fits(klass: int, config: IPAConfig) -> bool:
    """Whether kernel class `klass` takes `config` (fused_class_fits in ipa_fused.cu)."""
    lim = CLASS_LIMITS[klass]
    w = Widths.for_lanes(config, lim.lanes_per_row)
    c = config.pair_dim
    return (
        config.heads <= lim.max_heads
        and not (lim.even_heads and config.heads % 2)
        and 8 <= c <= MAX_PAIR_DIM
        and c % 8 == 0
        and lim.pair_dim in (0, c)
        and w.dqp <= lim.max_dqp
        and w.pqp <= lim.max_pqp
        and w.wv <= lim.max_wv
        and (not lim.exact or (w.dqp, w.pqp, w.wv) == (lim.max_dqp, lim.max_pqp, lim.max_wv))
    )


def kernel_class(config: IPAConfig) -> int:
    """The kernel class that runs `config`: the first of af2, small, generic that fits it
    (fused_kernel_class in ipa_fused.cu). ValueError when none does (outside `CudaFused.limits`)."""
    for klass in PREFERENCE:
        if class_fits(klass, config):
            return klass
    raise ValueError(f"no cuda-fused kernel class takes {config}")


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pair_repr: torch.Tensor,
    pair_weight: torch.Tensor,
    point_weight: torch.Tensor,
    *,
    klass: int,
    dqp: int,
    dv: int,
    out: torch.Tensor | None = None,
    splits: int = 0,
    workspace: torch.Tensor | None = None,
    bias: int = FFMA_BIAS,
    local: torch.Tensor | None = None,
    frames: tuple[torch.Tensor, torch.Tensor] | None = None,
    value_points: int = 0,
) -> torch.Tensor:
    """The kernel alone: softmax-weighted [v | value points] per (batch, query, head).

    q, k: (B, H, N, wq) float32 rows [q * log2(e)/sqrt(d) (resp. k), zero pad to dqp | points
    (global frame), zero pad]; v: (B, H, N, wv) float32 rows [v | value points | zero pad];
    pair_repr: (B, N, N, C) float32 or bfloat16, contiguous; pair_weight: (H, C) float32
    pair_bias.weight * log2(e); point_weight: (H,) float32 -softplus(w)/2 * log2(e).
    Returns out: (B, N, H, dv) float32, every element written (pass `out` to reuse or poison a
    buffer). splits: key-range splits (0 = chosen from the GPU's size); workspace: optional
    float32 buffer for the split partials (allocated when absent or too small). bias: the `af2`
    class's pair-bias form (FFMA_BIAS, MMA_HEAD_ROWS, TENSOR_CORES, or for bf16 pair_repr
    MMA_PAIR_ROWS).

    local: the call ends in finish_frames' output instead (`variants.cuda_ext.finish_on_gpu`),
    written there and returned: (B, N, H * head_dim + 3 * H * value_points) float32 or the
    frames' dtype, with `frames` = (rotations (B, N, 3, 3), translations (B, N, 3)) and
    `value_points` (head_dim = dv - 3 value_points). A call of two splits then merges its
    partials in finish's launch and leaves `out` unwritten.
    """
    # The binding refuses these too; here the refusal lists the forms that fit.
    forms = bias_forms(klass, pair_repr.dtype)
    if bias not in forms:
        raise IPAInputError(
            f"fused_attention: argument 'bias': expected one of {forms} (FusedBias) for kernel "
            f"class {klass} and pair_repr {pair_repr.dtype}, got {bias!r}")
    b, h, n, _ = q.shape
    if out is None:
        out = torch.empty(b, n, h, dv, device=q.device, dtype=torch.float32)
    rotations, translations = frames if frames is not None else (None, None)
    load_extension().fused_forward(
        q, k, v, pair_repr, pair_weight, point_weight, out, klass, dqp, dv, splits, workspace,
        bias, rotations, translations, value_points, local,
    )
    return out if local is None else local


class CudaFused(Variant):
    name = "cuda-fused"
    description = "flash-style CUDA kernel: pair bias, point distances, online softmax fused"
    devices = ("cuda",)
    precisions = ("fp32", "bf16")
    requires = ("cuda", "nvcc", "ninja", "triton")  # triton: the 3xTF32 GEMMs (`cuda_ext`)
    # Every config inside these limits (and pair_dim a multiple of 8) fits a kernel class: the
    # C++ dispatch says so at the corners (tests/test_cuda.py).
    limits = {
        "query_points": (1, 16),
        "value_points": (1, 16),
        "head_dim": (8, 128),
        "heads": (1, 16),
        "pair_dim": (8, 128),
    }

    def code_paths(self):
        triton_dir = Path(__file__).resolve().parent / "triton"
        return [*super().code_paths(), *CODE_PATHS, triton_dir / "linear.py",
                triton_dir / "tf32.py"]

    def math_mode_label(self, precision, config=None):
        """The af2 class's forms that run fp32 products on TF32 say so: fp32 `fp32-3xtf32`
        (MMA_HEAD_ROWS, TENSOR_CORES; the GEMMs around the kernel then are 3xTF32 too), bf16
        `bf16-tf32` (TENSOR_CORES: p.v on TF32)."""
        precision = get_precision(precision)
        af2 = isinstance(config, IPAConfig) and class_fits(AF2, config)
        if not af2 or precision.math_mode != "ieee":
            return precision.math_mode
        form = bias_form(AF2, precision.dtype)
        if precision.name == "fp32" and splits_fp32(AF2, form, precision.dtype):
            return "fp32-3xtf32"
        if precision.name == "bf16" and form == TENSOR_CORES:
            return "bf16-tf32"
        return precision.math_mode

    def not_supported_reasons(self, config, device, precision):
        reasons = super().not_supported_reasons(config, device, precision)
        if config.pair_dim % 8:
            reasons.append(f"pair_dim={config.pair_dim} is not a multiple of 8 (16-byte rows)")
        return reasons

    def build(self, state_dict, config, device, precision: str | Precision) -> IPAFunction:
        precision = get_precision(precision)
        dtype = precision.dtype
        load_extension()  # the build time is paid here, never in a timed call
        weights = Weights(state_dict, config, device, dtype)
        klass = kernel_class(config)
        widths = Widths.for_lanes(config, LANES[klass])
        units = base2_units(weights.pair_bias, weights.head_weights, config.head_dim)
        device = weights.device

        def forward(node_repr, pair_repr, translations, rotations):
            check_call_inputs(config, device, dtype, node_repr, pair_repr, translations, rotations)
            form = bias_form(klass, dtype)
            split = splits_fp32(klass, form, dtype)
            ops = project_on_gpu(weights, node_repr, translations, rotations, widths=widths,
                                 q_scale=units.q_scale, split_gemms=split)
            kernel = dict(klass=klass, dqp=widths.dqp, dv=widths.dv, bias=form,
                          splits=KEY_SPLITS)
            operands = (ops.q, ops.k, ops.v, pair_repr, units.pair_weight, units.point_weight)
            if not MERGED_FINISH:
                return finish_on_gpu(weights, fused_attention(*operands, **kernel), ops, dtype,
                                     split_gemms=split)
            b, n, _ = node_repr.shape
            local = torch.empty(b, n, config.heads * widths.dv, device=device,
                                dtype=local_dtype(weights, dtype))
            fused_attention(*operands, **kernel, local=local,
                            frames=(ops.rotations, ops.translations),
                            value_points=config.value_points)
            return output_projection(weights, local, dtype, split)

        def kernel_info() -> str:
            form = bias_form(klass, dtype)
            split = splits_fp32(klass, form, dtype)
            return (f"kernel class {klass} (dqp={widths.dqp}, dv={widths.dv}), "
                    f"pair bias {BIAS_NAMES[form]}, GEMMs {gemms_label(weights, split)}")

        forward.kernel_info = kernel_info
        return forward
