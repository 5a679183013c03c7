"""The backward of problem openfold's `triton-bias` core (`core_op.py`): the simplified problem's
per-head kernels (`variants/triton/bias_backward.py`) with the pair values' two extra terms, and
two passes over z.

The forward left the (B, H, N, N) fp32 base-2 logits s (bias and mask included) and each row's
statistics. With P = 2^((s - m) - log2 l), the gradients of the outputs dO (o), dO_p (o_pt,
global frame) and dO_z (o_pair), and D_i = dO . o + dO_p . o_pt + dO_z . o_pair per row and
head (the softmax's row term, o_pair's included; the key kernel adds the points' term itself,
centred as dP's):

  pair terms (`_pair_terms_kernel`, pass 1 over z): G[h, i, j] = dO_z[i, h] . z[i, j], the
      pair values' part of dP, into a (B, H, N, N) fp32 buffer;
  key kernel, point weight and sums of dS (`variants/triton/bias_backward.
      attention_gradients`, its HAS_G path): P from the saved logits (nothing recomputed),
      dP = dO . v + dO_p . v_pts + G, dS = P (dP - D) written over G; dv, dv_pts; then
      d point_weight, and dq, dk and the points' gradients (3xTF32 GEMMs) from dS;
  pair pass (`_pair_backward_kernel`, pass 2 over z): d z[i, j] = bias_scale dS[:, i, j] W_b
      + P[:, i, j] dO_z[i] (written once), and dW_b = bias_scale sum dS z as one partial sum
      per program, added by PyTorch (no atomics).

So the step reads z four times (forward: the bias and the pair values; backward: the two
passes) and writes d z once, against a floor of two reads and a write; it holds the logits and
the G / dS buffer, 2 B H N^2 x 4 bytes, besides d z. linear_b's bias gets its exact gradient,
zero: a per-head constant in every logit of a row, which the softmax cancels.

Both passes own one query row of one batch element per program (and its key blocks in turn):
every (2-D) dot is one tensor-core product, (H, c_z) @ (c_z, BLOCK_N) for G, (BLOCK_N, H) @
(H, c_z) twice for d z and (H, BLOCK_N) @ (BLOCK_N, c_z) for dW_b; fp32 runs them as 3xTF32
of operands split once (`tf32.py`), 16-bit inputs in their dtype with fp32 accumulation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from variants.triton.common import (
    HEADS_PAD,
    Modes,
    autotuned,
    block_configs,
    cast_f32,
    pow2,
    whole_blocks,
)
from variants.triton.tf32 import dot_parts, tf32_parts


@triton.jit
def _operand(x, SPLIT: tl.constexpr, CAST_F32: tl.constexpr, DTYPE: tl.constexpr):
    """(hi, lo) of a dot operand: fp32 split for 3xTF32 (SPLIT), else x in the dot's dtype
    (fp32 under the interpreter) and lo unused."""
    if SPLIT:
        hi, lo = tf32_parts(x.to(tl.float32), True)
    elif CAST_F32:
        hi = x.to(tl.float32)
        lo = hi
    else:
        hi = x.to(DTYPE)
        lo = hi
    return hi, lo


@triton.jit
def _row_setup(DOZ, b, i, N, H: tl.constexpr, H_PAD: tl.constexpr, C: tl.constexpr,
               C_PAD: tl.constexpr, SPLIT: tl.constexpr, CAST_F32: tl.constexpr, DTYPE):
    """Query row i of batch element b, as both passes start it: the head and channel offsets
    and masks, and the row's d loss / d o_pair (H_PAD, C_PAD) as a dot operand (`_operand`)."""
    offs_h = tl.arange(0, H_PAD)
    offs_c = tl.arange(0, C_PAD)
    h_ok = offs_h < H
    c_ok = offs_c < C
    doz = tl.load(DOZ + ((b * N + i) * H + offs_h[:, None]) * C + offs_c[None, :],
                  mask=h_ok[:, None] & c_ok[None, :], other=0.0)
    doz_hi, doz_lo = _operand(doz, SPLIT, CAST_F32, DTYPE)
    return offs_h, offs_c, h_ok, c_ok, doz_hi, doz_lo


@triton.jit(do_not_specialize=["N"])
def _pair_terms_kernel(
    Z,  # (B, N, N, C) pair_repr, strides (stride_zb, stride_zi, stride_zj, stride_zc)
    DOZ,  # (B, N, H, C) fp32 contiguous: d loss / d o_pair
    G,  # (B, H, N, N) fp32: receives G[b, h, i, j] = DOZ[b, i, h] . Z[b, i, j]
    N,
    stride_zb, stride_zi, stride_zj, stride_zc,
    H: tl.constexpr,
    H_PAD: tl.constexpr,
    C: tl.constexpr,
    C_PAD: tl.constexpr,
    PRECISION: tl.constexpr,
    CAST_F32: tl.constexpr,
    EVEN: tl.constexpr,  # N a multiple of every BLOCK_N
    BLOCK_N: tl.constexpr,
):
    i = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    SPLIT: tl.constexpr = PRECISION == "tf32x3"
    offs_h, offs_c, h_ok, c_ok, doz_hi, doz_lo = _row_setup(
        DOZ, b, i, N, H, H_PAD, C, C_PAD, SPLIT, CAST_F32, Z.dtype.element_ty)
    z_row = Z + b * stride_zb + i * stride_zi + offs_c[:, None] * stride_zc
    g_row = G + (b * H + offs_h[:, None]) * N * N + i * N
    whole_n = tl.arange(0, BLOCK_N) < BLOCK_N  # masks as in `_pair_backward_kernel`
    for j0 in range(0, N, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        n_ok = whole_n if EVEN else offs_n < N
        if EVEN and C == C_PAD:
            zt = tl.load(z_row + offs_n[None, :] * stride_zj)  # (C_PAD, BN): z_i^T
        else:
            zt = tl.load(z_row + offs_n[None, :] * stride_zj,
                         mask=c_ok[:, None] & n_ok[None, :], other=0.0)
        zt_hi, zt_lo = _operand(zt, SPLIT, CAST_F32, Z.dtype.element_ty)
        g = dot_parts(doz_hi, doz_lo, zt_hi, zt_lo,
                      tl.zeros([H_PAD, BLOCK_N], dtype=tl.float32), PRECISION)
        tl.store(g_row + offs_n[None, :], g, mask=h_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["N"])
def _pair_backward_kernel(
    DS,  # (B, H, N, N) fp32: dS (natural units)
    LOGITS,  # (B, H, N, N) fp32: the forward's base-2 logits
    STATS,  # (B, N, H, 3) fp32: row max m, log2 l (, mean distance)
    Z,  # (B, N, N, C) pair_repr, strides (stride_zb, stride_zi, stride_zj, stride_zc)
    DOZ,  # (B, N, H, C) fp32 contiguous: d loss / d o_pair
    W,  # (H, C) linear_b.weight, contiguous, z's dtype
    DZ,  # (B, N, N, C) contiguous, z's dtype: d loss / d z, written once
    DW,  # (B, N, H_PAD, C_PAD) fp32: each program's partial sum of dS z (one row i)
    N,
    bias_scale,
    stride_zb, stride_zi, stride_zj, stride_zc,
    H: tl.constexpr,
    H_PAD: tl.constexpr,
    C: tl.constexpr,
    C_PAD: tl.constexpr,
    PRECISION: tl.constexpr,
    CAST_F32: tl.constexpr,
    EVEN: tl.constexpr,  # N a multiple of every BLOCK_N
    BLOCK_N: tl.constexpr,
):
    i = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    SPLIT: tl.constexpr = PRECISION == "tf32x3"
    offs_h, offs_c, h_ok, c_ok, doz_hi, doz_lo = _row_setup(
        DOZ, b, i, N, H, H_PAD, C, C_PAD, SPLIT, CAST_F32, Z.dtype.element_ty)
    w = tl.load(W + offs_h[:, None] * C + offs_c[None, :], mask=h_ok[:, None] & c_ok[None, :],
                other=0.0)
    if SPLIT:  # fp32: bias_scale folded into W_b once (one rounding, as scaling d z would be)
        w = w * bias_scale
    w_hi, w_lo = _operand(w, SPLIT, CAST_F32, Z.dtype.element_ty)
    stats = STATS + ((b * N + i) * H + offs_h) * 3
    row_max = tl.load(stats, mask=h_ok, other=0.0)[:, None]
    log_sum = tl.load(stats + 1, mask=h_ok, other=0.0)[:, None]
    rows = (b * H + offs_h[:, None]) * N * N + i * N  # (H_PAD, 1): row i of each head
    z_row = Z + b * stride_zb + i * stride_zi + offs_c[None, :] * stride_zc
    dz_row = DZ + ((b * N + i) * N) * C + offs_c[None, :]
    acc_w = tl.zeros([H_PAD, C_PAD], dtype=tl.float32)
    # Masks only where a key block can be partial (not EVEN) or channels padded: per-element
    # masks were a fifth of the loop (sm_90 proxy, fp32: 94.6 -> 77.3 instructions per pair
    # with the scale folded into W_b).
    whole_n = tl.arange(0, BLOCK_N) < BLOCK_N
    heads_ok = h_ok[:, None] & whole_n[None, :]  # (H_PAD, BN)
    channels_ok = whole_n[:, None] & c_ok[None, :]  # (BN, C_PAD)
    UNMASKED: tl.constexpr = EVEN and C == C_PAD  # z and d z tiles need no mask
    for j0 in range(0, N, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        if EVEN:  # every key block whole
            tile_ok, z_ok = heads_ok, channels_ok
        else:
            n_ok = offs_n < N
            tile_ok, z_ok = heads_ok & n_ok[None, :], channels_ok & n_ok[:, None]
        ds = tl.load(DS + rows + offs_n[None, :], mask=tile_ok, other=0.0)  # (H_PAD, BN)
        s = tl.load(LOGITS + rows + offs_n[None, :], mask=tile_ok, other=float("-inf"))
        p = tl.exp2((s - row_max) - log_sum)  # 0 past N and in padded heads
        if UNMASKED:
            z = tl.load(z_row + offs_n[:, None] * stride_zj)  # (BN, C_PAD)
        else:
            z = tl.load(z_row + offs_n[:, None] * stride_zj, mask=z_ok, other=0.0)
        ds_hi, ds_lo = _operand(ds, SPLIT, CAST_F32, Z.dtype.element_ty)
        p_hi, p_lo = _operand(p, SPLIT, CAST_F32, Z.dtype.element_ty)
        z_hi, z_lo = _operand(z, SPLIT, CAST_F32, Z.dtype.element_ty)
        dz = dot_parts(tl.trans(ds_hi), tl.trans(ds_lo), w_hi, w_lo,
                       tl.zeros([BLOCK_N, C_PAD], dtype=tl.float32), PRECISION)
        if not SPLIT:
            dz = dz * bias_scale
        dz = dot_parts(tl.trans(p_hi), tl.trans(p_lo), doz_hi, doz_lo, dz, PRECISION)
        if UNMASKED:
            tl.store(dz_row + offs_n[:, None] * C, dz.to(DZ.dtype.element_ty))
        else:
            tl.store(dz_row + offs_n[:, None] * C, dz.to(DZ.dtype.element_ty), mask=z_ok)
        acc_w = dot_parts(ds_hi, ds_lo, z_hi, z_lo, acc_w, PRECISION)
    tl.store(DW + ((b * N + i) * H_PAD + offs_h[:, None]) * C_PAD + offs_c[None, :], acc_w)


_pair_terms = autotuned(
    "openfold_pair_terms", _pair_terms_kernel,
    configs=block_configs([(32, 4, 2), (64, 4, 2), (64, 4, 3), (128, 8, 2), (32, 2, 3)],
                          names=("BLOCK_N",)),
    key=["H_PAD", "C_PAD", "PRECISION"], interpreted={"BLOCK_N": 32},
)
_pair_backward = autotuned(
    "openfold_pair_backward", _pair_backward_kernel,
    configs=block_configs([(16, 4, 2), (32, 4, 2), (32, 4, 3), (64, 8, 2), (16, 2, 3)],
                          names=("BLOCK_N",)),
    key=["H_PAD", "C_PAD", "PRECISION"], interpreted={"BLOCK_N": 32},
)


def launch_backward(grad_o, grad_o_pt, grad_o_pair, q, k, v, q_pts, k_pts, v_pts, z, w_b,
                    point_weight, o, o_pt, o_pair, stats, logits, modes: Modes, *,
                    q_scale: float, bias_scale: float):
    """The backward, unchecked (the custom op's operands, `core_op.bias_core_op`). Returns the
    gradients of q, k, v (their dtype), q_pts, k_pts, v_pts (fp32), z and w_b (their dtype)
    and point_weight (fp32)."""
    from variants.triton.bias_backward import attention_gradients
    from variants.triton.sums import row_delta

    b, n, h, _ = q.shape
    c = z.shape[3]
    if n == 1:
        return _single_key_gradients(grad_o, grad_o_pt, grad_o_pair, q, k, v, q_pts, k_pts,
                                     v_pts, z, w_b, point_weight)
    f32 = torch.float32
    grad_o_pair = grad_o_pair.float().contiguous()
    grad_o = grad_o.contiguous()  # once: row_delta and the key kernel read it so
    # D less its points' term, which the key kernel adds (centred)
    delta = row_delta(grad_o, o, grad_z=grad_o_pair, out_z=o_pair)
    precision = modes.bias  # the pair dots: as the forward's bias GEMM
    shared = dict(H=h, H_PAD=pow2(h, HEADS_PAD), C=c, C_PAD=pow2(c), PRECISION=precision,
                  CAST_F32=cast_f32(z.dtype))
    g = torch.empty(b, h, n, n, dtype=f32, device=z.device)
    _pair_terms[(n, b)](z, grad_o_pair, g, n, *z.stride(), **shared,
                        EVEN=whole_blocks(n, _pair_terms, "BLOCK_N"))

    def pair_pass(ds):
        dz = torch.empty(z.shape, dtype=z.dtype, device=z.device)
        partial = torch.empty(b, n, shared["H_PAD"], shared["C_PAD"], dtype=f32,
                              device=z.device)
        _pair_backward[(n, b)](ds, logits, stats, z, grad_o_pair, w_b.contiguous(), dz,
                               partial, n, bias_scale, *z.stride(), **shared,
                               EVEN=whole_blocks(n, _pair_backward, "BLOCK_N"))
        return dz, (partial.sum((0, 1))[:h, :c] * bias_scale).to(w_b.dtype)

    dq, dk, dv, dq_pts, dk_pts, dv_pts, d_point, (dz, dw) = attention_gradients(
        grad_o, grad_o_pt, q, k, v, q_pts, k_pts, v_pts, point_weight, stats, logits, delta,
        o_pt, modes, pair_pass, q_scale=q_scale, ds=g)
    return dq, dk, dv, dq_pts, dk_pts, dv_pts, dz, dw, d_point


def _single_key_gradients(grad_o, grad_o_pt, grad_o_pair, q, k, v, q_pts, k_pts, v_pts, z,
                          w_b, point_weight):
    """N = 1, without a kernel: the simplified problem's (`backward.single_key_gradients`:
    every logit gradient exactly zero, the values' gradients the outputs'), with
    d z = sum_h dO_z[h] (the one probability is 1)."""
    from variants.triton.backward import single_key_gradients

    grads = single_key_gradients(grad_o, grad_o_pt, q, k, v, q_pts, k_pts, v_pts, z, w_b,
                                 point_weight)
    dz = grad_o_pair.float().sum(2).view(z.shape).to(z.dtype)
    return (*grads[:6], dz, *grads[7:])
