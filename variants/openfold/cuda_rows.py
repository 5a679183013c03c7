"""The operand rows of problem openfold's CUDA kernel (`cuda_fused.py`, `ipa_openfold.cu`) in one
Triton launch, from the projections' q, k, v (B, N, H, 16) and the frame prologue's points.

    q rows (B, H, N, 28)        [q | q points]
    k rows (B, H, n_pad, 28)    [k | k points]; with split_k (bf16 z) (B, H, n_pad, 44)
                                [k hi | k lo | k points], q.k's TF32 parts (`tf32_hi` of k, then
                                of the remainder)
    v rows (B, H, n_pad, 44)    [v | v points | 0 0 0 0]; with round_v (bf16 z) v rounded to TF32

fp32, n_pad = N rounded up to the kernel's key tile (8), rows past N zero. The PyTorch form it
replaced (three `torch.cat`, `F.pad` and `tf32_split`, 6 launches in fp32 and ~18 in bf16) is
kept in tests/test_openfold_cuda.py as its definition; they agree to the bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from variants.triton.common import cdiv, direct
from variants.triton.tf32 import tf32_hi

Q_WIDTH, K_WIDTH_SPLIT, V_PITCH, KEY_TILE = 28, 44, 44, 8
C, P3, VP3 = 16, 12, 24  # OpenFold's c_hidden, 3 x query points, 3 x value points
BLOCK_ROWS = 32


@direct
@triton.jit
def _rows_kernel(Q, K, V, QP, KP, VP, QR, KR, VR, N, N_PAD,
                 stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
                 stride_vb, stride_vn, stride_vh,
                 H: tl.constexpr, SPLIT_K: tl.constexpr, ROUND_V: tl.constexpr,
                 BLOCK: tl.constexpr, C: tl.constexpr, P3: tl.constexpr, VP3: tl.constexpr,
                 Q_WIDTH: tl.constexpr, K_WIDTH_SPLIT: tl.constexpr, V_PITCH: tl.constexpr,
                 V_BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h, b = tl.program_id(1), tl.program_id(2)
    bh = b * H + h
    r = rows[:, None]
    in_n, in_pad = r < N, r < N_PAD
    c = tl.arange(0, C)[None, :]  # C columns: the values, or the P3 query / key points
    pt = c < P3
    cv = tl.arange(0, V_BLOCK)[None, :]  # the VP3 value points and the zeros up to V_PITCH
    # q rows
    q = tl.load(Q + b * stride_qb + r * stride_qn + h * stride_qh + c, mask=in_n).to(tl.float32)
    q_row = QR + (bh * N + r) * Q_WIDTH
    tl.store(q_row + c, q, mask=in_n)
    tl.store(q_row + C + c, tl.load(QP + (bh * P3 + c) * N + r, mask=in_n & pt), mask=in_n & pt)
    # k rows (zero past N)
    k = tl.load(K + b * stride_kb + r * stride_kn + h * stride_kh + c, mask=in_n,
                other=0.0).to(tl.float32)
    k_pts = tl.load(KP + (bh * P3 + c) * N + r, mask=in_n & pt, other=0.0)
    if SPLIT_K:
        k_row = KR + (bh * N_PAD + r) * K_WIDTH_SPLIT
        k_hi = tf32_hi(k)
        tl.store(k_row + c, k_hi, mask=in_pad)
        tl.store(k_row + C + c, tf32_hi(k - k_hi), mask=in_pad)
        tl.store(k_row + 2 * C + c, k_pts, mask=in_pad & pt)
    else:
        k_row = KR + (bh * N_PAD + r) * Q_WIDTH
        tl.store(k_row + c, k, mask=in_pad)
        tl.store(k_row + C + c, k_pts, mask=in_pad & pt)
    # v rows (zero past N and after the points)
    v = tl.load(V + b * stride_vb + r * stride_vn + h * stride_vh + c, mask=in_n,
                other=0.0).to(tl.float32)
    if ROUND_V:
        v = tf32_hi(v)
    v_row = VR + (bh * N_PAD + r) * V_PITCH
    tl.store(v_row + c, v, mask=in_pad)
    v_pts = tl.load(VP + (bh * N + r) * VP3 + cv, mask=in_n & (cv < VP3), other=0.0)
    tl.store(v_row + C + cv, v_pts, mask=in_pad & (cv < V_PITCH - C))


def operand_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pts: torch.Tensor,
                 k_pts: torch.Tensor, v_pts: torch.Tensor, *, split_k: bool,
                 round_v: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, N, H, 16), innermost stride 1, any float dtype; q_pts, k_pts (B, H, 12, N)
    and v_pts (B, H, N, 24) fp32 contiguous (`frames.prologue`'s default layout) -> the q, k,
    v rows above. Unchecked: the caller (`CudaFusedForward`) builds every argument."""
    B, N, H, _ = q.shape
    n_pad = cdiv(N, KEY_TILE) * KEY_TILE
    new = lambda rows, width: torch.empty(B, H, rows, width, dtype=torch.float32,
                                          device=q.device)
    q_rows, v_rows = new(N, Q_WIDTH), new(n_pad, V_PITCH)
    k_rows = new(n_pad, K_WIDTH_SPLIT if split_k else Q_WIDTH)
    _rows_kernel[(cdiv(n_pad, BLOCK_ROWS), H, B)](
        q, k, v, q_pts, k_pts, v_pts, q_rows, k_rows, v_rows, N, n_pad,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        H=H, SPLIT_K=split_k, ROUND_V=round_v, BLOCK=BLOCK_ROWS, C=C, P3=P3, VP3=VP3,
        Q_WIDTH=Q_WIDTH, K_WIDTH_SPLIT=K_WIDTH_SPLIT, V_PITCH=V_PITCH,
        V_BLOCK=triton.next_power_of_2(V_PITCH - C), num_warps=4)
    return q_rows, k_rows, v_rows
