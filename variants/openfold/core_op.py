"""Problem openfold's `triton-bias` core as PyTorch custom ops with an exact backward, for
training: `ipa_bench::openfold_bias_core` (forward: the pair bias with the mask, the attention
kernel leaving the logits and row statistics, the pair values; `triton_bias.py`) and
`ipa_bench::openfold_bias_core_backward` (`bias_backward.py`), joined by
`torch.library.register_autograd` (`variants.custom_ops.Op`s: eager calls skip the
dispatcher), with fake (meta) implementations so that autograd,
`torch.compile` and `torch.library.opcheck` understand them. `triton_bias.BiasForward` runs
the O(N) work around them in PyTorch (differentiated by autograd) when a gradient is needed.
"""

from __future__ import annotations

import torch

from variants.custom_ops import custom_op
from variants.triton.common import dot_modes

Tensor = torch.Tensor


@custom_op("ipa_bench::openfold_bias_core")
def bias_core_op(q: Tensor, k: Tensor, v: Tensor, q_pts: Tensor, k_pts: Tensor, v_pts: Tensor,
                 centre: Tensor, z: Tensor, w_b: Tensor, b_b: Tensor, point_weight: Tensor,
                 mask: Tensor, math_mode: str, q_scale: float, bias_scale: float, inf: float
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """o (B, N, H, C) in q's dtype, o_pt (B, N, H, 3 Pv) fp32 (global, centred frame), o_pair
    (B, N, H, c_z) fp32, and what the backward reads: the row statistics (B, N, H, 3) and the
    base-2 logits (B, H, N, N), fp32. Operands as `triton_bias.BiasForward.core` takes them;
    b_b (linear_b's bias, (H,)) does not change the result (the softmax cancels a per-head
    constant): it is an input only to receive its exact gradient, zero."""
    b, n, h, c = q.shape
    o = torch.empty(b, n, h, c, dtype=q.dtype, device=q.device)
    o_pair = torch.empty(b, n, h, z.shape[3], dtype=torch.float32, device=q.device)
    o_pt, stats, logits = run_core(q, k, v, q_pts, k_pts, v_pts, centre, z, w_b, point_weight,
                                   mask, o, o_pair, math_mode=math_mode, q_scale=q_scale,
                                   bias_scale=bias_scale, inf=inf)
    return o, o_pt, o_pair, stats, logits


def run_core(q, k, v, q_pts, k_pts, v_pts, centre, z, w_b, point_weight, mask, o, o_pair, *,
             math_mode: str, q_scale: float, bias_scale: float, inf: float,
             bias: Tensor | None = None):
    """The three kernels, unchecked: o into `o` ((B, N, H, C) view, head stride C, unit
    innermost stride), o_pair into `o_pair` (the same for c_z); returns o_pt (B, N, H, 3 Pv)
    fp32, the row statistics and the logits.

    q, k, v        (B, N, H, C) views, head stride C, unit innermost stride
    q_pts, k_pts   (B, H, 3 Pq, N) fp32, global frame, centred per batch element, xyz triples
    v_pts          (B, H, N, 3 Pv) fp32, the same frame; centre (B, N, 3): its frame origins
    z              (B, N, N, c_z) any strides; w_b (H, c_z) linear_b.weight, z's dtype
    point_weight   (H,) fp32: -w_h / 2 * log2(e); mask (B, N) fp32 contiguous
    q_scale        the q.k factor in base-2 units; bias_scale the bias's (natural units)
    bias           `pair_bias(z, w_b, mask, ...)`, launched by the caller ahead of the O(N)
                   work; None: launched here
    """
    from variants.openfold.pair_values import launch_pair_values
    from variants.triton.attention import launch_logits_attention

    modes = dot_modes(q.dtype, math_mode)
    if bias is None:
        bias = pair_bias(z, w_b, mask, math_mode=math_mode, bias_scale=bias_scale, inf=inf)
    o_pt, stats, logits = launch_logits_attention(q, k, v, q_pts, k_pts, v_pts, centre,
                                                  point_weight, o, bias, modes,
                                                  q_scale=q_scale)
    launch_pair_values(logits, stats, z, o_pair, modes.bias)
    return o_pt, stats, logits


def pair_bias(z, w_b, mask, *, math_mode: str, bias_scale: float, inf: float) -> Tensor:
    """The core's first kernel, unchecked: bias_scale z.W_b^T and the mask term as a (B, H, N,
    N) fp32 tensor (`pair_bias.launch_pair_bias`), which the attention kernel then overwrites
    with the logits. It reads only z and the mask: a caller launches it before the O(N)
    projections, so that the GPU runs it while the host issues them."""
    from variants.triton.pair_bias import launch_pair_bias

    return launch_pair_bias(z, w_b, dot_modes(z.dtype, math_mode).bias, dtype=torch.float32,
                            mask=mask, scale=bias_scale, mask_inf=inf)


@bias_core_op.register_fake
def _bias_core_fake(q, k, v, q_pts, k_pts, v_pts, centre, z, w_b, b_b, point_weight, mask,
                    math_mode, q_scale, bias_scale, inf):
    b, n, h, _ = q.shape
    f32 = dict(dtype=torch.float32)
    return (q.new_empty(q.shape), q_pts.new_empty(b, n, h, v_pts.shape[3]),
            z.new_empty(b, n, h, z.shape[3], **f32), q.new_empty(b, n, h, 3, **f32),
            q.new_empty(b, h, n, n, **f32))


@custom_op("ipa_bench::openfold_bias_core_backward")
def _bias_core_backward(grad_o: Tensor, grad_o_pt: Tensor, grad_o_pair: Tensor, q: Tensor,
                        k: Tensor, v: Tensor, q_pts: Tensor, k_pts: Tensor, v_pts: Tensor,
                        z: Tensor, w_b: Tensor, b_b: Tensor, point_weight: Tensor, o: Tensor,
                        o_pt: Tensor, o_pair: Tensor, stats: Tensor, logits: Tensor,
                        math_mode: str, q_scale: float, bias_scale: float
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                   Tensor, Tensor, Tensor]:
    from variants.openfold.bias_backward import launch_backward

    grads = launch_backward(grad_o, grad_o_pt, grad_o_pair, q, k, v, q_pts, k_pts, v_pts, z,
                            w_b, point_weight, o, o_pt, o_pair, stats, logits,
                            dot_modes(q.dtype, math_mode), q_scale=q_scale,
                            bias_scale=bias_scale)
    # b_b's gradient is zero exactly: every row of dS sums to zero
    return (*grads[:8], torch.zeros_like(b_b), grads[8])


@_bias_core_backward.register_fake
def _bias_core_backward_fake(grad_o, grad_o_pt, grad_o_pair, q, k, v, q_pts, k_pts, v_pts, z,
                             w_b, b_b, point_weight, o, o_pt, o_pair, stats, logits, math_mode,
                             q_scale, bias_scale):
    return tuple(t.new_empty(t.shape) for t in (q, k, v, q_pts, k_pts, v_pts, z, w_b, b_b,
                                                point_weight))


def _setup_context(ctx, inputs, output):
    (q, k, v, q_pts, k_pts, v_pts, _, z, w_b, b_b, point_weight, _, math_mode, q_scale,
     bias_scale, _) = inputs
    o, o_pt, o_pair, stats, logits = output
    ctx.save_for_backward(q, k, v, q_pts, k_pts, v_pts, z, w_b, b_b, point_weight, o, o_pt,
                          o_pair, stats, logits)
    ctx.options = (math_mode, q_scale, bias_scale)
    ctx.mark_non_differentiable(stats, logits)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_o, grad_o_pt, grad_o_pair, _grad_stats, _grad_logits):
    saved = ctx.saved_tensors
    o, o_pt, o_pair = saved[10:13]
    zeros = lambda t: torch.zeros(t.shape, dtype=t.dtype, device=t.device)
    grad_o = zeros(o) if grad_o is None else grad_o
    grad_o_pt = zeros(o_pt) if grad_o_pt is None else grad_o_pt
    grad_o_pair = zeros(o_pair) if grad_o_pair is None else grad_o_pair
    dq, dk, dv, dq_pts, dk_pts, dv_pts, dz, dw, db, dpw = _bias_core_backward(
        grad_o, grad_o_pt, grad_o_pair, *saved, *ctx.options)
    # no gradient for the kernel's origins (the result does not depend on them), the mask
    # (data) and the options
    return (dq, dk, dv, dq_pts, dk_pts, dv_pts, None, dz, dw, db, dpw, None, None, None, None,
            None)


bias_core_op.register_autograd(_backward, setup_context=_setup_context)
