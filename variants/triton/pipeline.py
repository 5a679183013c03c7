"""The Triton IPA forwards, each a checked public function: `triton_ipa` (the bias GEMM, then the
streamed attention kernel), `triton_fullfuse_ipa` (the fully fused kernel),
`triton_pairdot_ipa` (the openfold problem's fused kernel with its pair bias alone) and
`triton_train_ipa` (either of the first two as a custom op with a backward, `core_op.py`).

All share the O(N) work around their kernels: LayerNorm, one GEMM for all six projections, the
frame transforms in fp32 (translations centred on their per-batch mean first: the output is
invariant to that shift, and the kernels' points stay small), and after the kernels the
inverse frame transform of the value points and `out_proj`. The forward-only variants
rearrange the weights once, at build time (`TritonIPAWeights.from_state_dict`); the training
forward rearranges live parameters on every call, differentiably
(`TritonIPAWeights.from_parameters`), so that autograd carries their gradients.

The frame transforms are `frames.py`'s Triton kernels in every form: where nothing needs
autograd (grad mode off, or no input and no weight requiring grad: every forward-only call,
and the training variants' too then) two launches write every point operand in the layouts the
attention kernels read (for `triton-pairdot` those of the openfold kernel, distance rows,
padding and TF32 splits included) and the local value points straight into out_proj's input;
where autograd is needed (training, and under `torch.compile`), the same kernels as custom ops
with backward kernels (`frames_op.py`), the default layouts, and the local value points
concatenated after o_s. Spelled in PyTorch they were ~15-40 small kernels per forward, 0.4-0.9
ms of host launches on the H200 at N = 1024-4096, and ~60 autograd nodes per training step.
tests/test_frames.py holds the kernels to the PyTorch form that defines them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from variants.base2 import LOG2E, base2_units
from variants.problem import IPAConfig, validate_inputs
from variants.triton import frames, frames_op
from variants.triton.attention import default_split, launch_attention
from variants.triton.common import (
    HEADS_PAD,
    check_runnable,
    check_split,
    dot_modes,
    require,
)
from variants.triton.core_op import bias_core_op, core_op
from variants.triton.fullfuse import launch_fullfuse
from variants.triton.grouped import check_group, launch_grouped
from variants.triton.linear import linear_3xtf32, linear_3xtf32_op
from variants.triton.merge import KeyRanges
from variants.triton.pair_bias import bias_tensor

# The SPEC state_dict's names; the six projections in the order of the one input GEMM.
IN_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "q_pts", "k_pts", "v_pts")
PARAMETER_NAMES = ("layer_norm.weight", "layer_norm.bias",
                   *(f"{p}.weight" for p in IN_PROJECTIONS), "pair_bias.weight", "head_weights",
                   "out_proj.weight", "out_proj.bias")


def _check_config(config: IPAConfig) -> None:
    require(config.heads <= HEADS_PAD,
            f"heads: expected 1..{HEADS_PAD} (the kernels' head axis), got {config.heads}")
    require(8 <= config.head_dim <= 128, f"head_dim: expected 8..128, got {config.head_dim}")


@dataclass
class TritonIPAWeights:
    """The SPEC state_dict, rearranged once for the forward pass."""

    config: IPAConfig
    ln_weight: torch.Tensor  # (node_dim,)
    ln_bias: torch.Tensor  # (node_dim,)
    w_in: torch.Tensor  # (3*H*d + 3*H*(2*Qp + Vp), node_dim): q, k, v, q_pts, k_pts, v_pts
    w_pair: torch.Tensor  # (H, pair_dim): pair_bias.weight (natural units, input dtype)
    point_weight: torch.Tensor  # (H,) fp32: -softplus(head_weights) / 2 * log2(e)
    w_out: torch.Tensor  # (node_dim, H*d + 3*H*Vp)
    b_out: torch.Tensor  # (node_dim,)

    @classmethod
    def from_state_dict(cls, state_dict, config: IPAConfig, device, dtype) -> TritonIPAWeights:
        _check_config(config)
        sd = {k: v.detach() for k, v in state_dict.items()}
        put = lambda t: t.to(device=device, dtype=dtype).contiguous()
        w_in = torch.cat([sd[f"{n}.weight"] for n in IN_PROJECTIONS])
        units = base2_units(sd["pair_bias.weight"], sd["head_weights"], config.head_dim)
        return cls(
            config, put(sd["layer_norm.weight"]), put(sd["layer_norm.bias"]), put(w_in),
            put(sd["pair_bias.weight"]), units.point_weight.to(device=device).contiguous(),
            put(sd["out_proj.weight"]), put(sd["out_proj.bias"]),
        )

    @classmethod
    def from_parameters(cls, params: dict[str, torch.Tensor],
                        config: IPAConfig) -> TritonIPAWeights:
        """The same arrangement from `training_parameters`, by differentiable ops (one
        concatenation, the softplus in fp32), so gradients reach `params`."""
        w_in = torch.cat([params[f"{n}.weight"] for n in IN_PROJECTIONS])
        # (-LOG2E / 2 scales LOG2E by -2^-1, exactly: bit for bit -softplus / 2 * LOG2E, in two
        # kernels forward and two backward instead of four each)
        point_weight = F.softplus(params["head_weights"].float()) * (-0.5 * LOG2E)
        return cls(config, params["layer_norm.weight"], params["layer_norm.bias"], w_in,
                   params["pair_bias.weight"], point_weight, params["out_proj.weight"],
                   params["out_proj.bias"])


def training_parameters(state_dict, config: IPAConfig, device, dtype) -> dict[str, torch.Tensor]:
    """The SPEC state_dict as fresh leaf tensors by name, on `device` in `dtype`, not requiring
    grad (a caller that trains switches it on): what `triton_train_ipa` reads on every call."""
    _check_config(config)
    require(set(state_dict) == set(PARAMETER_NAMES),
            f"state_dict: expected the keys {sorted(PARAMETER_NAMES)}, got {sorted(state_dict)}")
    return {name: state_dict[name].detach().to(device=device, dtype=dtype).clone()
            for name in PARAMETER_NAMES}


# ---- the O(N) work around the kernels ------------------------------------------------------


@dataclass
class Operands:
    """What the attention kernels read and write, built by the prologue (shapes as
    `attention.ipa_attention`; with `lows`, those of `triton_kernel.launch`)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_pts: torch.Tensor
    k_pts: torch.Tensor
    v_pts: torch.Tensor
    centred_t: torch.Tensor
    point_weight: torch.Tensor
    out_s: torch.Tensor  # where the kernels may write o_s: a view of out_proj's input
    # The TF32 low parts (k_pts, v_pts, v) when the fused prologue wrote the points in a
    # `frames.Layout` other than the default (`FusedCore`'s), else None.
    lows: tuple | None = None


def _check(weights: TritonIPAWeights, node_repr, pair_repr, translations, rotations):
    validate_inputs(
        weights.config, node_repr, pair_repr, translations, rotations,
        dtypes=(weights.w_in.dtype,), device=weights.w_in.device, check_values=False,
    )


def _needs_autograd(weights: TritonIPAWeights, *inputs: torch.Tensor) -> bool:
    """Whether the frame transforms must be differentiable (`frames_op`): grad mode on and
    some input or weight requiring grad (or tracing by torch.compile)."""
    if torch.compiler.is_compiling():
        return True
    if not torch.is_grad_enabled():
        return False
    tensors = (*inputs, *(getattr(weights, f.name) for f in fields(weights)))
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _around_kernels(
    weights: TritonIPAWeights,
    node_repr: torch.Tensor,
    pair_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
    kernels: Callable[[Operands], tuple[torch.Tensor, torch.Tensor]],
    layout: frames.Layout = frames.OPERANDS,
    split_gemms: bool = False,
) -> torch.Tensor:
    """The forward with `kernels(operands) -> (o_s, out_p)` as its attention core: o_s
    (B, N, H, d) `operands.out_s` (written in place) or a tensor of the kernels' own (the
    training op's), out_p (B, N, H, 3*Vp) fp32. Arguments are checked by the caller. Without
    autograd the frame transforms are `frames.py`'s two kernels, the points in `layout` (the
    default: `Operands`'); with it, the same kernels as differentiable custom ops
    (`frames_op`), the points in the default layout whatever `layout` says. `split_gemms`
    (fp32 "ieee"): the two projections as 3xTF32 Triton GEMMs (`linear.py`, a custom op with
    its backward under autograd), else cuBLAS's."""
    check_runnable("node_repr", node_repr)
    cfg = weights.config
    bsz, n, _ = node_repr.shape
    h, d, qp, vp = cfg.heads, cfg.head_dim, cfg.query_points, cfg.value_points
    hd = h * d
    fused = not _needs_autograd(weights, node_repr, pair_repr, translations, rotations)
    linear = F.linear
    if split_gemms:
        linear = linear_3xtf32 if fused else linear_3xtf32_op

    # Prologue: LayerNorm, one GEMM for all six projections (B, N, 3*H*d + 3*H*(2Qp+Vp)),
    # frames in fp32. (The LayerNorm inside the fp32 3xTF32 GEMM, one launch fewer, lost on an
    # H100: replayed N = 256 0.073 -> 0.077 ms, N = 1024 0.374 -> 0.386; docs/perf-notes.md.)
    x = F.layer_norm(node_repr, (cfg.node_dim,), weights.ln_weight, weights.ln_bias)
    proj = linear(x, weights.w_in, None)
    # Split, not sliced: under autograd one split's backward is one concatenation, where each
    # slice's is a zero fill and a copy, added up (14 launches more per training step).
    q, k, v, local_pts = proj.split([hd, hd, hd, proj.shape[-1] - 3 * hd], dim=-1)
    q, k, v = (t.view(bsz, n, h, d) for t in (q, k, v))
    if fused:
        # One launch: the global points in the kernels' layouts, and the centred translations
        # (the frames' origin: each batch element's mean translation).
        mean = translations.mean(dim=1, dtype=torch.float32)
        pts = frames.prologue(proj, rotations, translations, mean, heads=h, head_dim=d,
                              query_points=qp, value_points=vp, layout=layout,
                              point_weight=weights.point_weight)
        q_pts, k_pts, v_pts, centred_t = pts.q_pts, pts.k_pts, pts.v_pts, pts.centred_t
        lows = pts.lows if layout != frames.OPERANDS else None
        if pts.v is not None:
            v = pts.v
    else:
        q_pts, k_pts, v_pts, centred_t = frames_op.prologue(
            local_pts, rotations, translations, heads=h, query_points=qp, value_points=vp)
        lows = None
    cat = torch.empty(bsz, n, hd + 3 * h * vp, dtype=node_repr.dtype, device=node_repr.device)
    out_s = cat[..., :hd].view(bsz, n, h, d)

    ops = Operands(q, k, v, q_pts, k_pts, v_pts, centred_t, weights.point_weight, out_s, lows)
    o_s, out_p = kernels(ops)

    # Epilogue: value points back to each query's frame, out_proj of [o_s | o_p local]. The
    # kernels may return their key ranges unmerged (`merge.KeyRanges`): the frames epilogue
    # merges them on the way, o_s included.
    if fused:
        if o_s is not out_s:  # the kernels returned o_s in a tensor of their own
            out_s.copy_(o_s)
        frames.epilogue(out_p, rotations, centred_t, cat, hd)  # one launch
    else:  # concatenated, not written into `cat`: a copy's backward is several launches
        if isinstance(out_p, KeyRanges):
            out_p = out_p.merge(out_s)
        local = frames_op.epilogue(out_p, rotations, centred_t, node_repr.dtype)
        cat = torch.cat([o_s.reshape(bsz, n, hd), local], dim=-1)
    return linear(cat, weights.w_out, weights.b_out)


# ---- the public forwards -------------------------------------------------------------------

def triton_ipa(
    weights: TritonIPAWeights,
    node_repr: torch.Tensor,
    pair_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
    *,
    math_mode: str = "ieee",
    split: int | None = None,
    fp32_dots: str = "3xtf32",
    half_points: str = "3xbf16",
) -> torch.Tensor:
    """IPA forward (SPEC.md), `triton` variant: the pair bias by one GEMM into a (B, H, N, N)
    tensor, then the streamed flash-style attention kernel.

    node_repr (B, N, node_dim), pair_repr (B, N, N, pair_dim), translations (B, N, 3),
    rotations (B, N, 3, 3), all in `weights`' dtype and device, any strides (pair_repr is read
    in place) -> (B, N, node_dim) in that dtype. `math_mode` is "ieee" or "tf32" (tf32: fp32
    inputs only). `split`: key ranges per query block of the attention kernel, merged after
    (None: chosen from the grid, `attention.default_split`). `fp32_dots` (fp32 "ieee" mode):
    the attention kernel's q.k, p.v and p.v_pts, and the two projections (`linear.py`), as
    "3xtf32" tensor-core dots (default), or the attention's as "ieee" FMAs (1.5-1.8x slower on
    the H200 at N >= 1024, as accurate; for comparison) and the projections by cuBLAS.
    `half_points` (bf16/fp16 inputs): the point distances' cross term and the value-point sum
    as three bf16 dots of split operands ("3xbf16", default: one tensor-core layout for the
    whole score tile; 2-4 % faster than "tf32" at N >= 1024 on the H200, as accurate) or as
    3xTF32 and TF32 dots ("tf32").
    """
    _check(weights, node_repr, pair_repr, translations, rotations)
    modes = dot_modes(node_repr.dtype, math_mode)
    check_split(split)
    require(fp32_dots in ("ieee", "3xtf32"),
            f"fp32_dots: expected 'ieee' or '3xtf32', got {fp32_dots!r}")

    require(half_points in ("tf32", "3xbf16"),
            f"half_points: expected 'tf32' or '3xbf16', got {half_points!r}")

    if fp32_dots == "ieee":
        modes = replace(modes, split_dots=False)
    modes = replace(modes, split_bf16=half_points == "3xbf16")
    batch, length = node_repr.shape[:2]
    if split is None:
        split = default_split(batch, weights.config.heads, length, node_repr.device)
    check_runnable("node_repr", node_repr)
    # The bias GEMM reads only pair_repr, so it goes first: the GPU runs it (the forward's
    # largest kernel from N ~ 1024) while the host issues the O(N) prologue. Outputs are the
    # same in either order; eager latency on the H100 (2026-12-05, twentieth session): bf16
    # N = 1024 0.529 -> 0.523 ms (host-bound either way).
    bias = bias_tensor(pair_repr, weights.w_pair, modes)

    def kernels(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
        # The launchers' own checks are skipped: every operand is built by the prologue.
        return ops.out_s, launch_attention(
            ops.q, ops.k, ops.v, ops.q_pts, ops.k_pts, ops.v_pts, ops.centred_t,
            ops.point_weight, ops.out_s, bias, modes, split=split, merge=False)

    # fp32 "ieee": the projections on tensor cores as well (3xTF32, `linear.py`; H100,
    # replayed: N = 256 0.099 -> 0.073 ms, N = 1024 0.399 -> 0.372, N = 4096 4.633 -> 4.545)
    return _around_kernels(weights, node_repr, pair_repr, translations, rotations, kernels,
                           split_gemms=modes.split_dots)


def triton_fullfuse_ipa(
    weights: TritonIPAWeights,
    node_repr: torch.Tensor,
    pair_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
    *,
    math_mode: str = "ieee",
    split: int | None = None,
) -> torch.Tensor:
    """IPA forward (SPEC.md), `triton-fullfuse` variant: one kernel computes the pair bias
    inside its key loop (pair_repr read once, extra memory O(N)).

    Arguments and result as `triton_ipa`; `split` is the number of key ranges per query block
    (None: chosen from the grid, about two programs per SM; see `fullfuse.default_split`).
    """
    _check(weights, node_repr, pair_repr, translations, rotations)
    check_split(split)
    modes = dot_modes(node_repr.dtype, math_mode)

    def kernels(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
        # The launcher's own checks are skipped: every operand is built by the prologue.
        return ops.out_s, launch_fullfuse(ops.q, ops.k, ops.v, ops.q_pts, ops.k_pts, ops.v_pts,
                                          ops.centred_t, ops.point_weight, ops.out_s, pair_repr,
                                          weights.w_pair, modes, split)

    return _around_kernels(weights, node_repr, pair_repr, translations, rotations, kernels)


def triton_grouped_ipa(
    weights: TritonIPAWeights,
    node_repr: torch.Tensor,
    pair_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
    *,
    math_mode: str = "ieee",
    heads_per_program: int | None = None,
) -> torch.Tensor:
    """IPA forward (SPEC.md), `triton-grouped` variant: one kernel computes the pair bias of a
    group of heads on tensor cores inside its key loop (`grouped.py`; pair_repr read from DRAM
    once, no N x N tensor). Arguments and result as `triton_ipa`; `heads_per_program`: the group
    size (None: `grouped.group_size`)."""
    _check(weights, node_repr, pair_repr, translations, rotations)
    modes = dot_modes(node_repr.dtype, math_mode)
    check_group(heads_per_program, weights.config.heads)

    def kernels(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
        # The launcher's own checks are skipped: every operand is built by the prologue.
        return ops.out_s, launch_grouped(ops.q, ops.k, ops.v, ops.q_pts, ops.k_pts, ops.v_pts,
                                         ops.centred_t, ops.point_weight, ops.out_s, pair_repr,
                                         weights.w_pair, modes, heads_per_program)

    return _around_kernels(weights, node_repr, pair_repr, translations, rotations, kernels,
                           split_gemms=modes.split_dots)


def pairdot_core(weights: TritonIPAWeights, math_mode: str):
    """`triton_pairdot_ipa`'s kernel with its weights split once (`openfold.FusedCore`): the
    simplified problem's logits in the openfold kernel's terms, base 2: q.k log2(e)/sqrt(d)
    + log2(e) z.W_b + point_weight |q_pts - k_pts|^2; no bias term, no mask, no pair values."""
    from variants.openfold.triton_fused import FusedCore

    h = weights.config.heads
    return FusedCore(weights.w_pair, torch.zeros(h, device=weights.w_pair.device),
                     weights.point_weight, dtype=weights.w_pair.dtype, math_mode=math_mode,
                     q_scale=LOG2E / weights.config.head_dim ** 0.5, bias_scale=1.0, inf=0.0,
                     pair_values=False)


def triton_pairdot_ipa(
    weights: TritonIPAWeights,
    core,
    node_repr: torch.Tensor,
    pair_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
) -> torch.Tensor:
    """IPA forward (SPEC.md), `triton-pairdot` variant: problem openfold's fused kernel
    (`variants/openfold/triton_kernel.py`) without its pair values and mask, `core` from
    `pairdot_core`. pair_repr read once; per key block its tile times W_b^T for every head is
    a tensor-core dot (3xTF32 in fp32); nothing N x N is written.

    Arguments and result as `triton_ipa` (the math mode is `core`'s).
    """
    _check(weights, node_repr, pair_repr, translations, rotations)
    vp3 = 3 * weights.config.value_points

    def kernels(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
        bsz, n, h, _ = ops.q.shape
        out_p = torch.empty(bsz, n, h, vp3, dtype=torch.float32, device=ops.q.device)
        if ops.lows is not None:
            # the fused prologue wrote the points (and v) as the kernel reads them
            core(ops.q, ops.k, ops.v, ops.q_pts, ops.k_pts, ops.v_pts, pair_repr, None,
                 ops.out_s.flatten(2), out_p, lows=ops.lows)
            return ops.out_s, out_p
        # (the default layouts' points, viewed as (B, N, H, 3P): FusedCore's)
        core(ops.q, ops.k, ops.v, ops.q_pts.permute(0, 3, 1, 2), ops.k_pts.permute(0, 3, 1, 2),
             ops.v_pts.transpose(1, 2), pair_repr, None, ops.out_s.flatten(2), out_p)
        return ops.out_s, out_p

    return _around_kernels(weights, node_repr, pair_repr, translations, rotations, kernels,
                           core.operand_layout())


def triton_train_ipa(
    params: dict[str, torch.Tensor],
    config: IPAConfig,
    node_repr: torch.Tensor,
    pair_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
    *,
    math_mode: str = "ieee",
    fused: bool = False,
) -> torch.Tensor:
    """IPA forward (SPEC.md) with an exact backward, the training variants: the attention core
    is a custom op (`core_op.py`), the O(N) work around it PyTorch, differentiated by autograd.
    `fused=False` (`triton-train`): `triton`'s forward (the pair bias as a (B, H, N, N) tensor,
    then the attention kernel) and the backward of `bias_backward.py`; `fused=True`
    (`triton-fullfuse-train`): the fully fused kernel and the fused backward of `backward.py`.
    Gradients reach every input and every tensor of `params` (`training_parameters`: the SPEC
    state_dict by name) that requires grad.

    Arguments and result as `triton_ipa`, all in `params`' dtype and device.
    """
    weights = TritonIPAWeights.from_parameters(params, config)
    _check(weights, node_repr, pair_repr, translations, rotations)
    op = core_op if fused else bias_core_op
    # fp32 "ieee", triton-train: the projections and their gradients as 3xTF32 GEMMs, against
    # cuBLAS's SIMT SGEMMs 1.415 -> 1.362 ms for the N = 1024 step replayed on an H100, the
    # gradient errors unchanged (2026-12-06)
    split_gemms = not fused and dot_modes(node_repr.dtype, math_mode).split_dots

    def kernels(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
        # The result does not depend on the kernel's origins: no gradient through them. o_s is
        # the op's own tensor (autograd's).
        return op(ops.q, ops.k, ops.v, ops.q_pts, ops.k_pts, ops.v_pts, ops.centred_t.detach(),
                  pair_repr, weights.w_pair, ops.point_weight, math_mode)[:2]

    return _around_kernels(weights, node_repr, pair_repr, translations, rotations, kernels,
                           split_gemms=split_gemms)
