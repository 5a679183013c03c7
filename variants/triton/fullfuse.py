"""The `triton-fullfuse` variant's kernel: the pair bias computed inside the key loop, so that
`pair_repr` is read exactly once and no N x N tensor is ever written (extra memory O(N)).

Idea: FlashAttention-2's loop (see `attention.py`) with the bias GEMM pulled in. Every head needs
the same z tile, so a program owns a query block for *all* heads: logits, accumulators and dots
are 3-D (heads padded to 16, batched `tl.dot`), and per key block the bias tile is
z(BLOCK_M * BLOCK_N, C) @ W_b^T(C, 16), reading BLOCK_M * BLOCK_N * C elements of z through its
strides. Distances are computed directly in every mode. For small grids the key range is
split across programs (flash-decoding) and the partial results are merged by
their log-sum-exp in PyTorch.

Caveats: Triton compiles these 3-D tiles with heavy register spills, so this is 2.5x (bf16) to
1.8x (fp32) slower than `triton` at N = 4096 (docs/perf-notes.md). The fp32 (IEEE) config needs
more shared memory than the H200 has per block at head_dim > 64 (`TritonFullFuse` declares it).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from variants import base2
from variants.triton.common import (
    HEADS_PAD,
    Modes,
    autotuned,
    cast_f32,
    cdiv,
    check_attention_args,
    check_fused_pair_args,
    check_runnable,
    check_split,
    dot_modes,
    pow2,
    split_for_sms,
    split_range,
)
from variants.triton.merge import merge_key_ranges

LOG2E = tl.constexpr(base2.LOG2E)  # the bias's factor to base-2 units, inside the kernel


@triton.jit
def pair_rows(offs_m, offs_n, stride_zi, stride_zj, z_pitch, Z_PITCHED: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The rows (i, j) of pair_repr for i in `offs_m`, j in `offs_n`, flattened to
    (BLOCK_M * BLOCK_N,) in (i, j) order, and the stride that scales them: row (i, j) starts at
    rows * row_stride, i.e. at i * stride_zi + j * stride_zj. The usual layouts (contiguous,
    cropped, channel slices) index it as (i * z_pitch + j) * stride_zj, scaled after the
    reshape: that keeps the loads vectorised on triton 3.6 (its reshape forgets that a product
    of strides is 16-aligned) and adds no live values to kernels that spill already. Measured
    on the H200 at N = 4096 (fully fused forward): the general form is 7 % (fp32) and 60 %
    (bf16) slower, three other forms 17-30 %; this one as fast as before strides."""
    if Z_PITCHED:
        rows = offs_m[:, None].to(tl.int64) * z_pitch + offs_n[None, :]
        row_stride = stride_zj
    else:
        rows = (offs_m[:, None].to(tl.int64) * stride_zi
                + offs_n[None, :].to(tl.int64) * stride_zj)
        row_stride = 1
    return tl.reshape(rows, [BLOCK_M * BLOCK_N]), row_stride


def pair_pitch(pair_repr: torch.Tensor) -> tuple[bool, int]:
    """`pair_rows`' Z_PITCHED and z_pitch for `pair_repr`: whether stride_zi is a multiple of
    stride_zj, and their ratio (0 when not)."""
    _, stride_zi, stride_zj, _ = pair_repr.stride()
    pitched = stride_zj > 0 and stride_zi % stride_zj == 0
    return pitched, stride_zi // stride_zj if pitched else 0


@triton.jit(do_not_specialize=["N", "split_len", "z_pitch", "N_KEY"])
def _fullfuse_kernel(
    Q, K, V,  # (B, N, H, D) views: strides (sb, sn, D, 1), input dtype
    QP, KP,  # (B, H, 3*Qp, N) fp32 global-frame query / key points
    VP,  # (B, H, N, 3*Vp) fp32 global-frame value points
    TC,  # (B, N, 3) fp32 centred translations
    Z,  # (B, N, N, C) pair_repr, strides (stride_zb, stride_zi, stride_zj, stride_zc)
    WB,  # (H, C) pair_bias.weight, input dtype
    PW,  # (H,) fp32 point weight: -softplus(head_weights) / 2 * log2(e) (negative)
    OS,  # (S, B, N, H, D) view: strides (ss, sb, sn, D, 1)
    OP,  # (S, B, N, H, 3*Vp) fp32
    LSE,  # (S, B, N, H) fp32 log2-sum-exp per split (written when WRITE_LSE)
    N,
    C,
    split_len,  # keys per split (a multiple of every BLOCK_N)
    q_scale,  # log2(e) / sqrt(D)
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
    stride_os, stride_ob, stride_on,
    stride_zb, stride_zi, stride_zj, stride_zc,
    z_pitch,  # stride_zi // stride_zj when Z_PITCHED (N for a contiguous pair_repr)
    N_KEY,  # autotune bucket, unused in the body
    H: tl.constexpr,
    H_PAD: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    P3: tl.constexpr,
    VP3: tl.constexpr,
    VP3_PAD: tl.constexpr,
    C_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PTS_PRECISION: tl.constexpr,
    CAST_F32: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    Z_PITCHED: tl.constexpr,  # stride_zi is a multiple of stride_zj
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    i0 = pid_m * BLOCK_M
    offs_h = tl.arange(0, H_PAD)
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    offs_e = tl.arange(0, VP3_PAD)
    h3 = offs_h[:, None, None]  # (H_PAD, 1, 1)
    m3 = offs_m[None, :, None]  # (1, BLOCK_M, 1)
    h_ok3 = h3 < H
    m_ok3 = m3 < N
    d_ok = offs_d < D
    e_ok = offs_e < VP3

    q = tl.load(
        Q + b * stride_qb + m3 * stride_qn + h3 * D + offs_d[None, None, :],
        mask=h_ok3 & m_ok3 & d_ok[None, None, :], other=0.0,
    )  # (H_PAD, BLOCK_M, D_PAD)
    if CAST_F32:
        q = q.to(tl.float32)
    pw = tl.load(PW + offs_h, mask=offs_h < H, other=0.0)
    centre = tl.load(TC + (b * N + i0) * 3 + offs_e % 3)
    bh3 = b * H + h3
    z_base = Z + b * stride_zb

    m_i = tl.full([H_PAD, BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([H_PAD, BLOCK_M], dtype=tl.float32)
    acc_s = tl.zeros([H_PAD, BLOCK_M, D_PAD], dtype=tl.float32)
    acc_p = tl.zeros([H_PAD, BLOCK_M, VP3_PAD], dtype=tl.float32)
    j_start = pid_s * split_len
    j_end = tl.minimum(j_start + split_len, N)
    for j0 in range(j_start, j_end, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < j_end
        n3 = offs_n[None, None, :]  # (1, 1, BLOCK_N)
        n_ok3 = n3 < j_end
        # scalar term, batched over heads: (H, M, D) @ (H, D, N)
        kt = tl.load(
            K + b * stride_kb + n3 * stride_kn + h3 * D + offs_d[None, :, None],
            mask=h_ok3 & n_ok3 & d_ok[None, :, None], other=0.0,
        )
        if CAST_F32:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * q_scale
        # point term, direct squared distances
        dist = tl.zeros([H_PAD, BLOCK_M, BLOCK_N], dtype=tl.float32)
        for c in tl.static_range(P3):
            qc = tl.load(QP + (bh3 * P3 + c) * N + m3, mask=h_ok3 & m_ok3, other=0.0)
            kc = tl.load(KP + (bh3 * P3 + c) * N + n3, mask=h_ok3 & n_ok3, other=0.0)
            diff = qc - kc
            dist += diff * diff
        # pair bias, all heads at once: z(BM*BN, C) @ W_b^T(C, H_PAD)
        rows, row_stride = pair_rows(offs_m, offs_n, stride_zi, stride_zj, z_pitch, Z_PITCHED,
                                     BLOCK_M, BLOCK_N)
        rows_ok = tl.reshape((offs_m[:, None] < N) & n_ok[None, :], [BLOCK_M * BLOCK_N])
        bias = tl.zeros([BLOCK_M * BLOCK_N, H_PAD], dtype=tl.float32)
        for c0 in tl.static_range(0, C_PAD, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            c_ok = offs_c < C
            z = tl.load(
                z_base + rows[:, None] * row_stride + offs_c[None, :] * stride_zc,
                mask=rows_ok[:, None] & c_ok[None, :], other=0.0,
            )
            w = tl.load(
                WB + offs_h[None, :] * C + offs_c[:, None],
                mask=(offs_h < H)[None, :] & c_ok[:, None], other=0.0,
            )
            if CAST_F32:
                z = z.to(tl.float32)
                w = w.to(tl.float32)
            bias = tl.dot(z, w, bias, input_precision=DOT_PRECISION)
        bias = tl.permute(tl.reshape(bias, [BLOCK_M, BLOCK_N, H_PAD]), [2, 0, 1])
        s = s + bias * LOG2E + pw[:, None, None] * dist
        s = tl.where(n_ok3, s, float("-inf"))
        # online softmax over keys (axis 2), fp32
        m_new = tl.maximum(m_i, tl.max(s, 2))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, :, None])
        l_i = l_i * alpha + tl.sum(p, 2)
        v = tl.load(
            V + b * stride_vb + offs_n[None, :, None] * stride_vn + h3 * D
            + offs_d[None, None, :],
            mask=h_ok3 & (offs_n < j_end)[None, :, None] & d_ok[None, None, :], other=0.0,
        )  # (H_PAD, BLOCK_N, D_PAD)
        if CAST_F32:
            pv = tl.dot(p, v.to(tl.float32), input_precision=DOT_PRECISION)
        else:
            pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc_s = acc_s * alpha[:, :, None] + pv
        vp = tl.load(
            VP + (bh3 * N + offs_n[None, :, None]) * VP3 + offs_e[None, None, :],
            mask=h_ok3 & n_ok[None, :, None] & e_ok[None, None, :], other=0.0,
        )  # (H_PAD, BLOCK_N, VP3_PAD)
        vp = tl.where(n_ok[None, :, None], vp - centre[None, None, :], 0.0)
        acc_p = acc_p * alpha[:, :, None] + tl.dot(p, vp, input_precision=PTS_PRECISION)
        m_i = m_new

    acc_s = acc_s / l_i[:, :, None]
    acc_p = acc_p / l_i[:, :, None] + centre[None, None, :]
    out_ok = h_ok3 & m_ok3
    tl.store(
        OS + pid_s * stride_os + b * stride_ob + m3 * stride_on + h3 * D
        + offs_d[None, None, :],
        acc_s.to(OS.dtype.element_ty), mask=out_ok & d_ok[None, None, :],
    )
    row3 = (pid_s * tl.num_programs(2) + b) * N + m3  # (S, B, N) row index
    tl.store(
        OP + (row3 * H + h3) * VP3 + offs_e[None, None, :],
        acc_p, mask=out_ok & e_ok[None, None, :],
    )
    if WRITE_LSE:
        row2 = (pid_s * tl.num_programs(2) + b) * N + offs_m[None, :]
        tl.store(
            LSE + row2 * H + offs_h[:, None], m_i + tl.log2(l_i),
            mask=(offs_h < H)[:, None] & (offs_m < N)[None, :],
        )


_FULLFUSE_KEY = ["N_KEY", "C", "D_PAD", "P3", "VP3_PAD", "DOT_PRECISION", "WRITE_LSE"]
_INTERPRETED = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_C": 64}
_fullfuse_fp32 = autotuned(  # fp32 and tf32
    "fullfuse_fp32",
    _fullfuse_kernel,
    configs=[
        triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_C": c}, num_warps=8, num_stages=1)
        for c in (32,)
    ],
    key=_FULLFUSE_KEY,
    interpreted=_INTERPRETED,
)
_fullfuse_16bit = autotuned(  # bf16 and fp16
    "fullfuse_16bit",
    _fullfuse_kernel,
    configs=[
        triton.Config({"BLOCK_M": m, "BLOCK_N": 16, "BLOCK_C": c}, num_warps=8, num_stages=1)
        for m, c in ((16, 64),)
    ],
    key=_FULLFUSE_KEY,
    interpreted=_INTERPRETED,
)


def default_split(batch: int, length: int, device: torch.device) -> int:
    """Key ranges per query block so that the grid has about two programs per SM."""
    return split_for_sms(batch * cdiv(length, 32), length, device, per_sm=2)


def launch_fullfuse(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s, pair_repr,
                    pair_weight, modes: Modes, split: int | None,
                    lse: torch.Tensor | None = None):
    """The kernel, unchecked (callers check; shapes in `ipa_fullfuse_attention`), then the merge
    of the key ranges. Returns out_p. `lse`, a (B, N, H) fp32 contiguous tensor, receives each
    row's log2-sum-exp2 of the base-2 logits when given (what a backward pass needs)."""
    b, n, h, d = q.shape
    p3, vp3, c = q_pts.shape[2], v_pts.shape[3], pair_repr.shape[3]
    dev = q.device
    split, split_len = split_range(n, default_split(b, n, dev) if split is None else split)
    out_p = torch.empty(split, b, n, h, vp3, dtype=torch.float32, device=dev)
    if split == 1:
        os_buf = out_s.unsqueeze(0)
        lse_buf = out_p if lse is None else lse.unsqueeze(0)  # out_p: a pointer, unused
    else:
        os_buf = torch.empty(split, b, n, h, d, dtype=torch.float32, device=dev)
        lse_buf = torch.empty(split, b, n, h, dtype=torch.float32, device=dev)
    pitched, z_pitch = pair_pitch(pair_repr)
    grid = lambda meta: (cdiv(n, meta["BLOCK_M"]), split, b)
    kernel = _fullfuse_fp32 if q.dtype == torch.float32 else _fullfuse_16bit
    kernel[grid](
        q, k, v, q_pts, k_pts, v_pts, centred_t, pair_repr, pair_weight, point_weight,
        os_buf, out_p, lse_buf, n, c, split_len, base2.LOG2E / math.sqrt(d),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        os_buf.stride(0), os_buf.stride(1), os_buf.stride(2), *pair_repr.stride(), z_pitch,
        pow2(n, 64), H=h, H_PAD=HEADS_PAD, D=d, D_PAD=pow2(d), P3=p3, VP3=vp3,
        VP3_PAD=pow2(vp3), C_PAD=pow2(c), DOT_PRECISION=modes.dot,
        PTS_PRECISION=modes.points, CAST_F32=cast_f32(q.dtype),
        WRITE_LSE=split > 1 or lse is not None,
        Z_PITCHED=pitched,
    )
    if split == 1:
        return out_p[0]
    return merge_key_ranges(os_buf, out_p, lse_buf, out_s, lse)


def ipa_fullfuse_attention(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s,
                           pair_repr, pair_weight, *, math_mode: str = "ieee",
                           split: int | None = None) -> torch.Tensor:
    """The IPA attention core with the pair bias computed in the kernel.

    q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s: as `attention.ipa_attention`
    pair_repr     (B, N, N, C), any strides, q's dtype and device
    pair_weight   (H, C) contiguous, q's dtype: pair_bias.weight (natural units)
    math_mode     "ieee" or "tf32" (fp32 only)
    split         number of key ranges (None: chosen from the grid, about two programs per SM)
    returns       (B, N, H, 3*Vp) fp32: sum_j a_ij v_pts_j, global (centred) frame
    """
    check_attention_args(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s)
    modes = dot_modes(q.dtype, math_mode)
    check_fused_pair_args(q, pair_repr, pair_weight)
    check_split(split)
    check_runnable("q", q)
    return launch_fullfuse(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s,
                           pair_repr, pair_weight, modes, split)
