"""The backwards' O(N) row terms as single launches: the softmax's row term D (`row_delta`) and
the sums of dS as two batched 3xTF32 GEMMs (`gemm_ds_sums`) with the operands they read and the
gradients they give written by one Triton kernel each.

Spelled in PyTorch these were ~20 small kernels of a training step (D: two products, two sums
and an add, and casts for 16-bit inputs; the sums: four to build the GEMMs' operands, eight to
turn their results into dq, dk and the points' gradients, two casts). At N = 1024 the step's
O(N) kernels took ~0.45 ms of ~1.5 on an H100 (docs/perf-notes.md, seventeenth session), against
issue #16's 1.0 ms target, and each launch costs the host time of an eager call.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from variants.triton.common import cdiv, direct, pow2
from variants.triton.linear import bmm_3xtf32

LN2_F = math.log(2.0)
_ROWS = 32  # rows of (b, n, h) or of N per program: a few KB of operands each


@triton.jit
def _row_dots(A, B, rows64, r_ok, W: tl.constexpr, W_PAD: tl.constexpr):
    """sum_c A[r, c] B[r, c] in fp32 for rows r of W contiguous elements."""
    c = tl.arange(0, W_PAD)[None, :]
    ok = r_ok[:, None] & (c < W)
    return tl.sum(tl.load(A + rows64 * W + c, mask=ok, other=0.0).to(tl.float32)
                  * tl.load(B + rows64 * W + c, mask=ok, other=0.0).to(tl.float32), 1)


@direct
@triton.jit
def _delta_kernel(GS, OS, GP, OP, GZ, OZ, DELTA, ROWS,
                  D: tl.constexpr, D_PAD: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr,
                  Z: tl.constexpr, Z_PAD: tl.constexpr, HAS_P: tl.constexpr,
                  HAS_Z: tl.constexpr, BLOCK: tl.constexpr):
    """DELTA[r] = GS[r] . OS[r] (+ GP[r] . OP[r]) (+ GZ[r] . OZ[r]) over rows r of (b, n, h),
    in fp32; every operand contiguous, rows of D, P (and Z) elements."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    r_ok = rows < ROWS
    rows64 = rows.to(tl.int64)[:, None]
    acc = _row_dots(GS, OS, rows64, r_ok, D, D_PAD)
    if HAS_P:
        acc += _row_dots(GP, OP, rows64, r_ok, P, P_PAD)
    if HAS_Z:
        acc += _row_dots(GZ, OZ, rows64, r_ok, Z, Z_PAD)
    tl.store(DELTA + rows, acc, mask=r_ok)


def row_delta(grad_s: torch.Tensor, out_s: torch.Tensor, grad_p: torch.Tensor | None = None,
              out_p: torch.Tensor | None = None, grad_z: torch.Tensor | None = None,
              out_z: torch.Tensor | None = None) -> torch.Tensor:
    """The softmax's row term D_i = sum_j P_ij dP_ij = dO . O per (b, n, h), or the terms of it
    given, in fp32, in one launch: grad_s, out_s (B, N, H, D) any float dtype; the points
    grad_p, out_p (B, N, H, 3 Vp) (the training key kernel adds their term itself, centred:
    `bias_backward._key_kernel`); problem openfold's pair values grad_z, out_z (B, N, H, c_z).
    Returns (B, N, H) fp32."""
    b, n, h, d = grad_s.shape
    has_p, has_z = grad_p is not None, grad_z is not None
    p = grad_p.shape[3] if has_p else 1
    z = grad_z.shape[3] if has_z else 1
    ops = [t.contiguous() for t in (grad_s, out_s)]
    ops += [grad_p.contiguous(), out_p.contiguous()] if has_p else [ops[0], ops[0]]
    zs = [grad_z.contiguous(), out_z.contiguous()] if has_z else [ops[0], ops[0]]
    delta = torch.empty(b, n, h, dtype=torch.float32, device=grad_s.device)
    rows = b * n * h
    _delta_kernel[(cdiv(rows, _ROWS),)](
        *ops, *zs, delta, rows, D=d, D_PAD=pow2(d, 2), P=p, P_PAD=pow2(p, 2), Z=z,
        Z_PAD=pow2(z, 2), HAS_P=has_p, HAS_Z=has_z, BLOCK=_ROWS)
    return delta


@direct
@triton.jit
def _operand_kernel(Q, K, Q_PTS, K_PTS, OUT, N, H, stride_qb, stride_qn, stride_kb, stride_kn,
                    D: tl.constexpr, P3: tl.constexpr, WIDTH: tl.constexpr,
                    W_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """OUT[side, b * H + h, n] = [X[b, n, h] | X_pts[b, h, :, n] | 1] in fp32, X = k for side 0
    (the queries' GEMM reads the keys), q for side 1; X (B, N, H, D) with unit innermost
    stride and head stride D, the points (B, H, P3, N) contiguous."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bh, side = tl.program_id(1), tl.program_id(2)
    b, h = (bh // H).to(tl.int64), bh % H
    col = tl.arange(0, W_PAD)[None, :]
    r = rows[:, None]
    r_ok = r < N
    in_x, in_p = r_ok & (col < D), r_ok & (col >= D) & (col < D + P3)
    pts_at = (b * H + h) * P3 * N + (col - D) * N + r
    if side == 0:
        x = tl.load(K + b * stride_kb + r * stride_kn + h * D + col, mask=in_x, other=0.0)
        pts = tl.load(K_PTS + pts_at, mask=in_p, other=0.0)
    else:
        x = tl.load(Q + b * stride_qb + r * stride_qn + h * D + col, mask=in_x, other=0.0)
        pts = tl.load(Q_PTS + pts_at, mask=in_p, other=0.0)
    value = tl.where(col < D, x.to(tl.float32), tl.where(col < D + P3, pts, 1.0))
    out = OUT + ((side * tl.num_programs(1) + bh).to(tl.int64) * N + r) * WIDTH + col
    tl.store(out, value, mask=r_ok & (col < WIDTH))


@direct
@triton.jit
def _gradients_kernel(SUMS, Q_PTS, K_PTS, POINT_WEIGHT, DQ, DK, DQ_PTS, DK_PTS, N, H, scale,
                      pts_scale, D: tl.constexpr, D_PAD: tl.constexpr, P3: tl.constexpr,
                      P3_PAD: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """From the GEMMs' results SUMS[side, b * H + h, n] = dS-sums of [X | X_pts | 1]: side 0
    (queries) dq = scale S[:D] into DQ (B, N, H, D) contiguous, in its dtype, and dq_pts =
    pts_scale w (q_pts rowsum - S[D:D+P3]) into DQ_PTS (B, H, P3, N) fp32; side 1 the keys'."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bh, side = tl.program_id(1), tl.program_id(2)
    b, h = (bh // H).to(tl.int64), bh % H
    r = rows[:, None]
    r_ok = rows < N
    line = SUMS + ((side * tl.num_programs(1) + bh).to(tl.int64) * N + r) * WIDTH
    cd = tl.arange(0, D_PAD)[None, :]
    grad = tl.load(line + cd, mask=r_ok[:, None] & (cd < D), other=0.0) * scale
    grad_at = ((b * N + r) * H + h) * D + cd
    cp = tl.arange(0, P3_PAD)[None, :]
    p_ok = r_ok[:, None] & (cp < P3)
    dots = tl.load(line + D + cp, mask=p_ok, other=0.0)
    rowsum = tl.load(line + D + P3, mask=r_ok[:, None], other=0.0)
    pts_at = (b * H + h) * P3 * N + cp * N + r
    weight = tl.load(POINT_WEIGHT + h) * pts_scale
    if side == 0:
        tl.store(DQ + grad_at, grad.to(DQ.dtype.element_ty), mask=r_ok[:, None] & (cd < D))
        own = tl.load(Q_PTS + pts_at, mask=p_ok, other=0.0)
        tl.store(DQ_PTS + pts_at, (own * rowsum - dots) * weight, mask=p_ok)
    else:
        tl.store(DK + grad_at, grad.to(DK.dtype.element_ty), mask=r_ok[:, None] & (cd < D))
        own = tl.load(K_PTS + pts_at, mask=p_ok, other=0.0)
        tl.store(DK_PTS + pts_at, (own * rowsum - dots) * weight, mask=p_ok)


def gemm_ds_sums(ds: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_pts: torch.Tensor,
                 k_pts: torch.Tensor, point_weight: torch.Tensor, q_scale: float
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sums of dS (B, H, N, N) fp32 as two batched fp32 GEMMs, one read of dS per side:
    dS [k | kp | 1] for the queries and dS^T [q | qp | 1] for the keys give dq = dS k / sqrt(d),
    dqp = 2 w (qp rowsum(dS) - dS kp), and dk, dkp alike, with the row (column) sums. The GEMMs
    are `linear.bmm_3xtf32` (dS^T read in place), as accurate as an IEEE SGEMM: on an H100 they
    took the fp32 N = 4096 step from 16.20 to 16.01 ms against cuBLAS's SIMT SGEMMs, with the
    same gradient errors (2026-12-06, twenty-fourth session).

    The points are in the layer's centred frame (centred on the mean frame origin per batch
    element, as the prologue writes them). The cancellation in qp rowsum - dS kp then gives
    that sum 1.3-2.9e-6 relative error on the suite's chains at N = 1024-4096 (fp32 emulation
    against float64), 1.5-2.4x the reference's per-pair difference form. Moving the points near
    each row's in the GEMM (a centre per 128-row group, fdf5cb2) took it to 1.1-1.5e-6, and
    left every gradient's error on the H100 within 1 % of before (N = 1024 and 4096; q_pts
    1.77x the reference's at 4096, pair_repr 1.40x): dS's own error dominates, so it was
    reverted (docs/perf-notes.md, twenty-fourth session). One kernel writes both sides'
    operands into one buffer, one turns both GEMMs' results into the gradients: four launches
    in all.

    q, k (B, N, H, D) views with unit innermost stride and head stride D, any float dtype;
    q_pts, k_pts (B, H, 3Qp, N) fp32; point_weight (H,) fp32 (base-2 units, `variants.base2`);
    `q_scale` the forward's q.k factor (base 2). Returns dq, dk (B, N, H, D) in q's and k's
    dtypes and dq_pts, dk_pts (B, H, 3Qp, N) fp32, contiguous."""
    b, h, n, _ = ds.shape
    d, p3 = q.shape[3], q_pts.shape[2]
    width = d + p3 + 1
    q_pts, k_pts = q_pts.contiguous(), k_pts.contiguous()
    operand = ds.new_empty(2, b * h, n, width)
    grid = (cdiv(n, _ROWS), b * h, 2)
    _operand_kernel[grid](q, k, q_pts, k_pts, operand, n, h, q.stride(0), q.stride(1),
                          k.stride(0), k.stride(1), D=d, P3=p3, WIDTH=width,
                          W_PAD=pow2(width, 2), BLOCK=_ROWS)
    sums = ds.new_empty(2, b * h, n, width)
    ds = ds.view(b * h, n, n)
    bmm_3xtf32(ds, operand[0], sums[0])
    bmm_3xtf32(ds.transpose(1, 2), operand[1], sums[1])
    dq, dk = q.new_empty(b, n, h, d), k.new_empty(b, n, h, d)
    dq_pts, dk_pts = q_pts.new_empty(q_pts.shape), k_pts.new_empty(k_pts.shape)
    _gradients_kernel[grid](sums, q_pts, k_pts, point_weight.contiguous(), dq, dk, dq_pts,
                            dk_pts, n, h, q_scale * LN2_F, 2.0 * LN2_F, D=d, D_PAD=pow2(d, 2),
                            P3=p3, P3_PAD=pow2(p3, 2), WIDTH=width, BLOCK=_ROWS)
    return dq, dk, dq_pts, dk_pts
