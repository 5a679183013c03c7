"""The frame transforms around the Triton attention core as custom ops with exact backwards, for
the training steps: `prologue` (local points -> global, in the kernels' layouts, and the
centred translations) and `epilogue` (the kernels' global value points -> each query's frame).
Forward and backward are each one launch of `frames.py`'s kernels (and the backward of the
translations' mean: two small ops), where autograd through their PyTorch form was ~30
launches and ~60 autograd nodes a step (`docs/perf-notes.md`, thirteenth session).

Both are `torch.library.custom_op`s (`variants.custom_ops.Op`s: eager calls skip the
dispatcher) with fake implementations and their backwards custom ops too, so `torch.compile`
keeps them as opaque nodes and traces the backward (tests/test_frame_ops.py runs `opcheck` on
them). The translations' gradient is exact, the mean's part included (the layer's output does
not depend on the mean, so that part is rounding noise there). `convention` picks the
problem: "simplified" (xyz triples, p @ R + t) or "openfold" ([X | Y | Z] blocks, R p + t, and
the epilogue's norms: `frames.Convention`).
"""

from __future__ import annotations

import torch

from variants.custom_ops import custom_op
from variants.triton import frames

Tensor = torch.Tensor
CONVENTIONS = {"simplified": frames.SIMPLIFIED, "openfold": frames.OPENFOLD}


@custom_op("ipa_bench::frames_prologue")
def _prologue(local: Tensor, rotations: Tensor, translations: Tensor, heads: int,
              query_points: int, value_points: int, convention: str
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    mean = translations.mean(dim=1, dtype=torch.float32)
    pts = frames.prologue(local, rotations, translations, mean, heads=heads, head_dim=1,
                          query_points=query_points, value_points=value_points,
                          convention=CONVENTIONS[convention])
    return pts.q_pts, pts.k_pts, pts.v_pts, pts.centred_t


@_prologue.register_fake
def _prologue_fake(local, rotations, translations, heads, query_points, value_points,
                   convention):
    b, n, _ = local.shape
    new = lambda *shape: local.new_empty(*shape, dtype=torch.float32)
    return (new(b, heads, 3 * query_points, n), new(b, heads, 3 * query_points, n),
            new(b, heads, n, 3 * value_points), new(b, n, 3))


@custom_op("ipa_bench::frames_prologue_backward")
def _prologue_backward(grad_q: Tensor, grad_k: Tensor, grad_v: Tensor, grad_centred_t: Tensor,
                       local: Tensor, rotations: Tensor, translations: Tensor, heads: int,
                       query_points: int, value_points: int, convention: str
                       ) -> tuple[Tensor, Tensor, Tensor]:
    d_local, d_rot, d_t = frames.prologue_backward(
        grad_q.contiguous(), grad_k.contiguous(), grad_v.contiguous(),
        grad_centred_t.contiguous(), local, rotations, heads=heads, query_points=query_points,
        value_points=value_points, convention=CONVENTIONS[convention])
    # centred_t = t - mean(t) over the residues: the mean's part of the gradient
    d_t = d_t - d_t.mean(dim=1, keepdim=True)
    return d_local, d_rot, d_t.to(translations.dtype)


@_prologue_backward.register_fake
def _prologue_backward_fake(grad_q, grad_k, grad_v, grad_centred_t, local, rotations,
                            translations, heads, query_points, value_points, convention):
    return local.new_empty(local.shape), rotations.new_empty(rotations.shape), \
        translations.new_empty(translations.shape)


def _prologue_setup(ctx, inputs, output):
    local, rotations, translations, *ctx.sizes = inputs
    ctx.save_for_backward(local, rotations, translations)


def _prologue_grads(ctx, grad_q, grad_k, grad_v, grad_centred_t):
    grads = _prologue_backward(grad_q, grad_k, grad_v, grad_centred_t, *ctx.saved_tensors,
                               *ctx.sizes)
    return *grads, None, None, None, None


_prologue.register_autograd(_prologue_grads, setup_context=_prologue_setup)


@custom_op("ipa_bench::frames_epilogue")
def _epilogue(out_p: Tensor, rotations: Tensor, centred_t: Tensor, dtype: torch.dtype,
              convention: str, eps: float) -> Tensor:
    local = torch.empty(_epilogue_shape(out_p, convention), dtype=dtype, device=out_p.device)
    frames.epilogue(out_p, rotations, centred_t, local, 0, convention=CONVENTIONS[convention],
                    eps=eps)
    return local


@_epilogue.register_fake
def _epilogue_fake(out_p, rotations, centred_t, dtype, convention, eps):
    return out_p.new_empty(_epilogue_shape(out_p, convention), dtype=dtype)


def _epilogue_shape(out_p: Tensor, convention: str) -> tuple[int, int, int]:
    """(B, N, 3 H Vp) local value points; openfold's [X | Y | Z | norms]: (B, N, 4 H Vp)."""
    b, n, h, vp3 = out_p.shape
    per_point = 4 if CONVENTIONS[convention].xyz_blocks else 3
    return b, n, per_point * h * vp3 // 3


@custom_op("ipa_bench::frames_epilogue_backward")
def _epilogue_backward(grad_local: Tensor, out_p: Tensor, rotations: Tensor, centred_t: Tensor,
                       convention: str, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return frames.epilogue_backward(grad_local.contiguous(), out_p, rotations, centred_t,
                                    convention=CONVENTIONS[convention], eps=eps)


@_epilogue_backward.register_fake
def _epilogue_backward_fake(grad_local, out_p, rotations, centred_t, convention, eps):
    return out_p.new_empty(out_p.shape), rotations.new_empty(rotations.shape), \
        centred_t.new_empty(centred_t.shape)


def _epilogue_setup(ctx, inputs, output):
    out_p, rotations, centred_t, _, ctx.convention, ctx.eps = inputs
    ctx.save_for_backward(out_p, rotations, centred_t)


def _epilogue_grads(ctx, grad_local):
    grads = _epilogue_backward(grad_local, *ctx.saved_tensors, ctx.convention, ctx.eps)
    return *grads, None, None, None


_epilogue.register_autograd(_epilogue_grads, setup_context=_epilogue_setup)


def prologue(local: Tensor, rotations: Tensor, translations: Tensor, *, heads: int,
             query_points: int, value_points: int, convention: str = "simplified"
             ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Differentiable `frames.prologue` (default layout), unchecked: local (B, N,
    3 H (2 Qp + Vp)) the local points (innermost stride 1: e.g. the input GEMM's columns),
    rotations (B, N, 3, 3), translations (B, N, 3) -> q_pts, k_pts (B, H, 3 Qp, N),
    v_pts (B, H, N, 3 Vp) and centred_t (B, N, 3), fp32, centred on each batch element's mean
    translation. Gradients reach local, rotations and translations."""
    return _prologue(local, rotations, translations, heads, query_points, value_points,
                     convention)


def epilogue(out_p: Tensor, rotations: Tensor, centred_t: Tensor, dtype: torch.dtype, *,
             convention: str = "simplified", eps: float = 0.0) -> Tensor:
    """Differentiable `frames.epilogue`, unchecked, into a tensor of its own: out_p
    (B, N, H, 3 Vp) fp32, rotations (B, N, 3, 3), centred_t (B, N, 3) fp32 -> the local value
    points (B, N, 3 H Vp) in `dtype` (openfold: (B, N, 4 H Vp), [X | Y | Z | norms])."""
    return _epilogue(out_p, rotations, centred_t, dtype, convention, eps)
