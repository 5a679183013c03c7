"""The IPA attention core as PyTorch custom ops with exact backwards, for training, in two
forms:

- `ipa_bench::triton_ipa_core` (forward: the fully fused kernel of `fullfuse.py`, which also
  writes each row's log-sum-exp) and `ipa_bench::triton_ipa_core_backward` (the fused kernel of
  `backward.py`): nothing N x N x H is written (`triton-fullfuse-train`);
- `ipa_bench::triton_ipa_core_bias` (forward: the `triton` forward, the pair bias as a
  (B, H, N, N) fp32 tensor by one GEMM, then the attention kernel of `attention.py`, which
  overwrites it with the base-2 logits and saves each row's softmax statistics) and
  `ipa_bench::triton_ipa_core_bias_backward` (`bias_backward.py`, which reads the logits and
  overwrites them with dS) (`triton-train`);

each pair joined by `torch.library.register_autograd`.

Both are `torch.library.custom_op`s (as `variants.custom_ops.Op`s: eager calls skip the
dispatcher's host cost) with fake (meta) implementations, so autograd,
`torch.compile` (the ops are opaque nodes: no graph break, AOTAutograd traces the backward
through the second op) and `torch.library.opcheck` understand them. `core_op` and
`bias_core_op` are unchecked (for callers that built their operands); `triton_ipa_core` is the
checked public function over both; `pipeline.triton_train_ipa` is the whole layer around them
(the projections, frames and out_proj in PyTorch, differentiated by autograd).
"""

from __future__ import annotations

import torch

from variants.custom_ops import custom_op
from variants.triton.attention import launch_logits_attention
from variants.triton.backward import launch_backward
from variants.triton.bias_backward import launch_bias_backward
from variants.triton.common import (
    check_attention_args,
    check_fused_pair_args,
    check_runnable,
    dot_modes,
)
from variants.triton.fullfuse import launch_fullfuse
from variants.triton.pair_bias import launch_pair_bias

Tensor = torch.Tensor


@custom_op("ipa_bench::triton_ipa_core")
def core_op(q: Tensor, k: Tensor, v: Tensor, q_pts: Tensor, k_pts: Tensor, v_pts: Tensor,
          centre: Tensor, pair_repr: Tensor, pair_weight: Tensor, point_weight: Tensor,
          math_mode: str) -> tuple[Tensor, Tensor, Tensor]:
    modes = dot_modes(q.dtype, math_mode)
    b, n, h, d = q.shape
    out_s = torch.empty(b, n, h, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, n, h, dtype=torch.float32, device=q.device)
    out_p = launch_fullfuse(q, k, v, q_pts, k_pts, v_pts, centre, point_weight, out_s,
                            pair_repr, pair_weight, modes, None, lse=lse)
    return out_s, out_p, lse


@core_op.register_fake
def _core_fake(q, k, v, q_pts, k_pts, v_pts, centre, pair_repr, pair_weight, point_weight,
               math_mode):
    b, n, h, d = q.shape
    return (q.new_empty(b, n, h, d), q_pts.new_empty(b, n, h, v_pts.shape[3]),
            q_pts.new_empty(b, n, h))


@custom_op("ipa_bench::triton_ipa_core_backward")
def _core_backward(grad_s: Tensor, grad_p: Tensor, q: Tensor, k: Tensor, v: Tensor,
                   q_pts: Tensor, k_pts: Tensor, v_pts: Tensor, pair_repr: Tensor,
                   pair_weight: Tensor, point_weight: Tensor, out_s: Tensor, out_p: Tensor,
                   lse: Tensor, math_mode: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor,
                                                         Tensor, Tensor, Tensor, Tensor]:
    return launch_backward(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, pair_repr,
                           pair_weight, point_weight, out_s, out_p, lse,
                           dot_modes(q.dtype, math_mode))


@_core_backward.register_fake
def _core_backward_fake(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, pair_repr, pair_weight,
                        point_weight, out_s, out_p, lse, math_mode):
    return _gradients_like(q, k, v, q_pts, k_pts, v_pts, pair_repr, pair_weight, point_weight)


def _gradients_like(*tensors):
    return tuple(t.new_empty(t.shape) for t in tensors)


def _setup_context(ctx, inputs, output):
    q, k, v, q_pts, k_pts, v_pts, _, pair_repr, pair_weight, point_weight, math_mode = inputs
    out_s, out_p, lse = output
    ctx.save_for_backward(q, k, v, q_pts, k_pts, v_pts, pair_repr, pair_weight, point_weight,
                          out_s, out_p, lse)
    ctx.math_mode = math_mode
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_s, grad_p, _grad_lse):
    dq, dk, dv, dq_pts, dk_pts, dv_pts, d_pair, d_weight, d_point = _core_backward(
        grad_s, grad_p, *ctx.saved_tensors, ctx.math_mode)
    # No gradient for `centre` (the result does not depend on it) nor for math_mode.
    return dq, dk, dv, dq_pts, dk_pts, dv_pts, None, d_pair, d_weight, d_point, None


core_op.register_autograd(_backward, setup_context=_setup_context)


@custom_op("ipa_bench::triton_ipa_core_bias")
def bias_core_op(q: Tensor, k: Tensor, v: Tensor, q_pts: Tensor, k_pts: Tensor, v_pts: Tensor,
                 centre: Tensor, pair_repr: Tensor, pair_weight: Tensor, point_weight: Tensor,
                 math_mode: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    out_s = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    modes = dot_modes(q.dtype, math_mode)
    bias = launch_pair_bias(pair_repr, pair_weight, modes.bias, dtype=torch.float32)
    out_p, stats, logits = launch_logits_attention(q, k, v, q_pts, k_pts, v_pts, centre,
                                                   point_weight, out_s, bias, modes)
    return out_s, out_p, stats, logits


@bias_core_op.register_fake
def _bias_core_fake(q, k, v, q_pts, k_pts, v_pts, centre, pair_repr, pair_weight, point_weight,
                    math_mode):
    b, n, h, _ = q.shape
    out_s, out_p, _ = _core_fake(q, k, v, q_pts, k_pts, v_pts, centre, pair_repr, pair_weight,
                                 point_weight, math_mode)
    return out_s, out_p, q_pts.new_empty(b, n, h, 3), q_pts.new_empty(b, h, n, n)


@custom_op("ipa_bench::triton_ipa_core_bias_backward", mutates_args=("logits",))
def _bias_core_backward(grad_s: Tensor, grad_p: Tensor, q: Tensor, k: Tensor, v: Tensor,
                        q_pts: Tensor, k_pts: Tensor, v_pts: Tensor, pair_repr: Tensor,
                        pair_weight: Tensor, point_weight: Tensor, out_s: Tensor, out_p: Tensor,
                        stats: Tensor, logits: Tensor, math_mode: str
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                   Tensor]:
    return launch_bias_backward(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, pair_repr,
                                pair_weight, point_weight, out_s, out_p, stats, logits,
                                dot_modes(q.dtype, math_mode))


@_bias_core_backward.register_fake
def _bias_core_backward_fake(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, pair_repr,
                             pair_weight, point_weight, out_s, out_p, stats, logits, math_mode):
    return _gradients_like(q, k, v, q_pts, k_pts, v_pts, pair_repr, pair_weight, point_weight)


def _bias_setup_context(ctx, inputs, output):
    q, k, v, q_pts, k_pts, v_pts, _, pair_repr, pair_weight, point_weight, math_mode = inputs
    out_s, out_p, stats, logits = output
    ctx.save_for_backward(q, k, v, q_pts, k_pts, v_pts, pair_repr, pair_weight, point_weight,
                          out_s, out_p, stats, logits)
    ctx.math_mode = math_mode
    ctx.mark_non_differentiable(stats, logits)
    # No zero-filled (B, H, N, N) gradient for the logits output: unused gradients arrive as None.
    ctx.set_materialize_grads(False)


def _bias_backward(ctx, grad_s, grad_p, _grad_stats, _grad_logits):
    # The saved logits become dS: a second backward through this graph fails autograd's
    # saved-tensor version check instead of reading it.
    out_s, out_p = ctx.saved_tensors[9:11]
    grad_s = torch.zeros_like(out_s) if grad_s is None else grad_s
    grad_p = torch.zeros_like(out_p) if grad_p is None else grad_p
    dq, dk, dv, dq_pts, dk_pts, dv_pts, d_pair, d_weight, d_point = _bias_core_backward(
        grad_s, grad_p, *ctx.saved_tensors, ctx.math_mode)
    return dq, dk, dv, dq_pts, dk_pts, dv_pts, None, d_pair, d_weight, d_point, None


bias_core_op.register_autograd(_bias_backward, setup_context=_bias_setup_context)


def triton_ipa_core(q, k, v, q_pts, k_pts, v_pts, centre, pair_repr, pair_weight, point_weight,
                    *, math_mode: str = "ieee", bias_tensor: bool = False
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """The IPA attention core with a backward: softmax over keys of the base-2 logits
    q.k log2(e)/sqrt(D) + log2(e) pair_repr.pair_weight^T + point_weight |q_pts - k_pts|^2,
    aggregating v and v_pts. Differentiable in every argument but `centre`.

    q, k, v       (B, N, H, D) views with strides (*, *, D, 1), one dtype (fp32/bf16/fp16);
                  1 <= H <= 16, 8 <= D <= 128
    q_pts, k_pts  (B, H, 3*Qp, N) fp32, global frame (centred)
    v_pts         (B, H, N, 3*Vp) fp32, global frame (centred)
    centre        (B, N, 3) fp32: an origin per query row for the kernel's sums (frame origins
                  in the same frame); the result does not depend on it
    pair_repr     (B, N, N, C), any strides, q's dtype and device
    pair_weight   (H, C) contiguous, q's dtype: pair_bias.weight (natural units)
    point_weight  (H,) fp32: -softplus(head_weights) / 2 * log2(e) (`variants.base2`)
    math_mode     "ieee" or "tf32" (fp32 only)
    bias_tensor   False: the fully fused pair (`core_op`); True: the bias as a (B, H, N, N)
                  fp32 tensor, which becomes the logits, kept for the backward, which turns
                  them into dS (`bias_core_op`)
    returns       out_s (B, N, H, D) in q's dtype: sum_j a_ij v_j; out_p (B, N, H, 3*Vp) fp32:
                  sum_j a_ij v_pts_j; and what the backward reads of each row, not
                  differentiable: the fused form's lse (B, N, H) fp32, the log2-sum-exp2 of its
                  logits, or the bias form's stats (B, N, H, 3) fp32 (`bias_backward.py`)
    """
    check_attention_args(q, k, v, q_pts, k_pts, v_pts, centre, point_weight)
    check_fused_pair_args(q, pair_repr, pair_weight)
    dot_modes(q.dtype, math_mode)
    check_runnable("q", q)
    op = bias_core_op if bias_tensor else core_op
    return op(q, k, v, q_pts, k_pts, v_pts, centre, pair_repr, pair_weight, point_weight,
              math_mode)[:3]
