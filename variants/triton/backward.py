"""The backward of the fully fused attention core (`fullfuse.py`): one kernel that recomputes the
logits, pair bias included, from `pair_repr` tile by tile and writes d pair_repr once.

Idea: FlashAttention-2's backward (Dao 2023, section 3.2) with the pair bias pulled in, as the
forward pulls it in. The forward saves each row's log2-sum-exp2 (LSE, base-2 units as in
`variants/base2.py`); here P = 2^(s - LSE) is recomputed, never stored. A program owns BLOCK_N
keys of one batch element for *all* heads (d pair_repr[i, j, :] = sum_h dS[h, i, j] W_b[h, :]
needs every head's dS of a pair at once) and walks the query blocks of its query range. Per
(query block, key block) tile, with D_i = sum_j P_ij dP_ij = dO_i . O_i precomputed:

    s      = q.k * log2(e)/sqrt(d) + log2(e) z.W_b^T + pw * |qp - kp|^2   (as the forward)
    P      = 2^(s - LSE);  dP = dO_s . v + dO_p . vp;  dS = P (dP - D)   (dS: d loss / d logit)
    keys   dv += P^T dO_s, dvp += P^T dO_p, dk += dS^T q / sqrt(d),
           dkp = 2 w (kp colsum(dS) - dS^T qp) with w = pw ln 2 = -softplus(head_weights) / 2
    query  dq += dS k / sqrt(d), dqp += 2 w (qp rowsum(dS) - dS kp): atomic adds (FA2's dQ)
    pair   d pair_repr[tile] = dS W_b (written once: every pair belongs to one tile), and
           dW_b += dS^T z, d pw += ln 2 sum dS |qp - kp|^2: partial sums per program, in
           registers, summed by PyTorch afterwards (no atomic hot spot on the (H, C) weight)

z is read once per tile for the bias and once more (from L2, just read) for dW_b; nothing of
size N x N x H is written, the only N x N output is d pair_repr. Key-side gradients stay in
registers for the whole walk; when a grid of key blocks is too small to fill the GPU the query
range is split across programs (`default_split`), whose key-side results are partial sums.

Caveats: the all-heads 3-D tiles are the forward's (heads padded to 16, batched `tl.dot`), which
Triton compiles with register spills; every dot operand is staged in shared memory, 112-128 KB
per program at the default config, past the H200's 227 KB for wide heads with many value points
in bf16/fp16 and for head_dim > 32 in tf32 (`TritonTrain` declares those; docs/perf-notes.md,
"triton backward"). dq and the query points' gradients are summed by fp32 atomics, so they are
not bitwise deterministic on the GPU. One config per dtype family: a second one would need the
atomically summed buffers zeroed between the autotuner's trial runs.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from variants import base2
from variants.triton.common import HEADS_PAD, Modes, autotuned, cast_f32, cdiv, pow2, split_range
from variants.triton.fullfuse import default_split, pair_pitch, pair_rows
from variants.triton.sums import row_delta

LOG2E = tl.constexpr(base2.LOG2E)
LN2 = tl.constexpr(math.log(2.0))
MIN_BLOCK_N = 16  # the smallest key block of any config (tl.dot needs 16)


@triton.jit(do_not_specialize=["N", "NJ", "split_len", "z_pitch"])
def _backward_kernel(
    Q, K, V,  # (B, N, H, D) views: strides (sb, sn, D, 1), input dtype
    QP, KP,  # (B, H, 3*Qp, N) fp32 global-frame query / key points
    VP,  # (B, H, N, 3*Vp) fp32 global-frame value points
    Z,  # (B, N, N, C) pair_repr, strides (stride_zb, stride_zi, stride_zj, stride_zc)
    WB,  # (H, C) pair_bias.weight, input dtype
    PW,  # (H,) fp32 point weight: -softplus(head_weights) / 2 * log2(e) (negative)
    DOS,  # (B, N, H, D) contiguous, input dtype: d loss / d out_s
    DOP,  # (B, N, H, 3*Vp) fp32 contiguous: d loss / d out_p
    LSE,  # (B, N, H) fp32: log2-sum-exp2 of each row's base-2 logits (the forward's)
    DELTA,  # (B, N, H) fp32: D_i = dO_s . out_s + dO_p . out_p
    DQ,  # (B, N, H, D) fp32, zeroed: atomic sums
    DQP,  # (B, H, 3*Qp, N) fp32, zeroed: atomic sums
    DK, DV,  # (S, B, N, H, D) fp32, one slice per query range
    DKP,  # (S, B, H, 3*Qp, N) fp32
    DVP,  # (S, B, H, N, 3*Vp) fp32
    DZ,  # (B, N, N, C) contiguous, pair_repr's dtype: d loss / d pair_repr
    DWB,  # (S, B, NJ, H, C) fp32, zeroed: partial sums of d pair_bias.weight
    DPW,  # (S, B, NJ, H) fp32, zeroed: partial sums of d point_weight
    N,
    C,
    NJ,  # key-block rows of DWB / DPW per (S, B): cdiv(N, MIN_BLOCK_N)
    split_len,  # queries per range (a multiple of every BLOCK_M)
    q_scale,  # log2(e) / sqrt(D)
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
    stride_zb, stride_zi, stride_zj, stride_zc,
    z_pitch,  # stride_zi // stride_zj when Z_PITCHED
    H: tl.constexpr,
    H_PAD: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    P3: tl.constexpr,
    P3_PAD: tl.constexpr,
    VP3: tl.constexpr,
    VP3_PAD: tl.constexpr,
    C_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PTS_PRECISION: tl.constexpr,
    CAST_F32: tl.constexpr,
    Z_PITCHED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    N_CHUNKS: tl.constexpr = (C_PAD + BLOCK_C - 1) // BLOCK_C  # channel chunks of BLOCK_C
    pid_j = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    sb = pid_s * tl.num_programs(2) + b  # (S, B) index of this program's partial results
    offs_h = tl.arange(0, H_PAD)
    offs_n = pid_j * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    offs_p = tl.arange(0, P3_PAD)
    offs_e = tl.arange(0, VP3_PAD)
    offs_k = tl.arange(0, N_CHUNKS)[:, None, None]  # channel chunk of the dW_b accumulator
    n_ok = offs_n < N
    h3 = offs_h[:, None, None]  # (H_PAD, 1, 1)
    h_ok3 = h3 < H
    bh3 = b * H + h3
    key_rows = offs_n[None, :, None]  # keys on axis 1: (H, BN, x) tiles
    key_cols = offs_n[None, None, :]  # keys on axis 2: (H, x, BN) tiles
    krow_ok = h_ok3 & (key_rows < N)
    kcol_ok = h_ok3 & (key_cols < N)
    d_row = offs_d[None, None, :]
    d_col = offs_d[None, :, None]
    p_row = offs_p[None, None, :]
    e_row = offs_e[None, None, :]
    d_ok = d_row < D
    p_ok = p_row < P3
    e_ok = e_row < VP3

    pw = tl.load(PW + offs_h, mask=offs_h < H, other=0.0)[:, None, None]
    k_base = K + b * stride_kb + h3 * D
    v_base = V + b * stride_vb + h3 * D
    z_base = Z + b * stride_zb

    acc_dk = tl.zeros([H_PAD, BLOCK_N, D_PAD], dtype=tl.float32)
    acc_dv = tl.zeros([H_PAD, BLOCK_N, D_PAD], dtype=tl.float32)
    acc_dvp = tl.zeros([H_PAD, BLOCK_N, VP3_PAD], dtype=tl.float32)
    acc_dkp = tl.zeros([H_PAD, BLOCK_N, P3_PAD], dtype=tl.float32)  # sum_i dS qp_i
    colsum = tl.zeros([H_PAD, BLOCK_N], dtype=tl.float32)
    acc_dw = tl.zeros([N_CHUNKS, H_PAD, BLOCK_C], dtype=tl.float32)
    acc_dpw = tl.zeros([H_PAD], dtype=tl.float32)
    i_start = pid_s * split_len
    i_end = tl.minimum(i_start + split_len, N)
    # Every all-heads operand tile is loaded right before the dot that reads it (the key block's
    # from L1/L2 again on every step) and dies at once: each is staged in shared memory for its
    # dot, and held together they would need more than the 227 KB an H200 block has.
    for i0 in range(i_start, i_end, BLOCK_M):
        offs_m = i0 + tl.arange(0, BLOCK_M)
        q_rows = offs_m[None, :, None]  # (1, BM, 1)
        q_ok = h_ok3 & (q_rows < i_end)
        row_h = (b * N + q_rows) * H + h3  # (B, N, H) row index, (H, BM, 1)
        q_ptrs = Q + b * stride_qb + q_rows * stride_qn + h3 * D + d_row

        # The forward's base-2 logits, recomputed: scalar, point and pair-bias terms.
        q = tl.load(q_ptrs, mask=q_ok & d_ok, other=0.0)  # (H, BM, D_PAD)
        kt = tl.load(k_base + key_cols * stride_kn + d_col, mask=kcol_ok & (d_col < D),
                     other=0.0)  # (H, D_PAD, BN)
        if CAST_F32:
            q = q.to(tl.float32)
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * q_scale  # (H, BM, BN)
        dist = tl.zeros([H_PAD, BLOCK_M, BLOCK_N], dtype=tl.float32)
        for c in tl.static_range(P3):
            qc = tl.load(QP + (bh3 * P3 + c) * N + q_rows, mask=q_ok, other=0.0)
            kc = tl.load(KP + (bh3 * P3 + c) * N + key_cols, mask=kcol_ok, other=0.0)
            diff = qc - kc
            dist += diff * diff
        # z(BM*BN, C) @ W_b^T(C, H_PAD); the tile is read again below, from L2.
        rows, row_stride = pair_rows(offs_m, offs_n, stride_zi, stride_zj, z_pitch, Z_PITCHED,
                                     BLOCK_M, BLOCK_N)
        rows_ok = tl.reshape((offs_m[:, None] < i_end) & n_ok[None, :], [BLOCK_M * BLOCK_N])
        bias = tl.zeros([BLOCK_M * BLOCK_N, H_PAD], dtype=tl.float32)
        for c0 in tl.static_range(0, C_PAD, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            c_ok = offs_c < C
            z = tl.load(z_base + rows[:, None] * row_stride + offs_c[None, :] * stride_zc,
                        mask=rows_ok[:, None] & c_ok[None, :], other=0.0)
            w = tl.load(WB + offs_h[None, :] * C + offs_c[:, None],
                        mask=(offs_h < H)[None, :] & c_ok[:, None], other=0.0)
            if CAST_F32:
                z = z.to(tl.float32)
                w = w.to(tl.float32)
            bias = tl.dot(z, w, bias, input_precision=DOT_PRECISION)
        bias = tl.permute(tl.reshape(bias, [BLOCK_M, BLOCK_N, H_PAD]), [2, 0, 1])
        s = s + bias * LOG2E + pw * dist
        lse = tl.load(LSE + row_h, mask=q_ok, other=0.0)
        p = tl.where(q_ok & (key_cols < N), tl.exp2(s - lse), 0.0)  # zero outside the tile
        pt = tl.permute(p, [0, 2, 1])  # (H, BN, BM)

        # dP = dO_s . v + dO_p . vp, and the values' gradients, dv += P^T dO_s, dvp += P^T dO_p.
        dos = tl.load(DOS + row_h * D + d_row, mask=q_ok & d_ok, other=0.0)
        vt = tl.load(v_base + key_cols * stride_vn + d_col, mask=kcol_ok & (d_col < D),
                     other=0.0)  # (H, D_PAD, BN)
        if CAST_F32:
            dos = dos.to(tl.float32)
            vt = vt.to(tl.float32)
        dp = tl.dot(dos, vt, input_precision=DOT_PRECISION)
        acc_dv += tl.dot(pt.to(dos.dtype), dos, input_precision=DOT_PRECISION)
        dop = tl.load(DOP + row_h * VP3 + e_row, mask=q_ok & e_ok, other=0.0)
        vpt = tl.load(VP + (bh3 * N + key_cols) * VP3 + offs_e[None, :, None],
                      mask=kcol_ok & (offs_e[None, :, None] < VP3), other=0.0)
        dp += tl.dot(dop, vpt, input_precision=PTS_PRECISION)
        acc_dvp += tl.dot(pt, dop, input_precision=PTS_PRECISION)
        delta = tl.load(DELTA + row_h, mask=q_ok, other=0.0)
        ds = p * (dp - delta)  # d loss / d logit (natural units)

        # Keys: dk += dS^T q, the point sums, dS's column sums; d pw.
        dst = tl.permute(ds, [0, 2, 1])
        q = tl.load(q_ptrs, mask=q_ok & d_ok, other=0.0)
        if CAST_F32:
            q = q.to(tl.float32)
        acc_dk += tl.dot(dst.to(q.dtype), q, input_precision=DOT_PRECISION)
        qp = tl.load(QP + (bh3 * P3 + p_row) * N + q_rows, mask=q_ok & p_ok, other=0.0)
        acc_dkp += tl.dot(dst, qp, input_precision=PTS_PRECISION)
        colsum += tl.sum(ds, 1)
        acc_dpw += tl.sum(tl.sum(ds * dist, 2), 1)

        # Queries, summed over key blocks by atomic adds (relaxed: only the sums are read, after
        # the kernel): dq = dS k / sqrt(d), dqp = 2 w (qp rowsum(dS) - dS kp).
        kp = tl.load(KP + (bh3 * P3 + p_row) * N + key_rows, mask=krow_ok & p_ok, other=0.0)
        dqp = qp * tl.sum(ds, 2)[:, :, None] - tl.dot(ds, kp, input_precision=PTS_PRECISION)
        tl.atomic_add(DQP + (bh3 * P3 + p_row) * N + q_rows, pw * dqp * (2.0 * LN2),
                      mask=q_ok & p_ok, sem="relaxed")
        kr = tl.load(k_base + key_rows * stride_kn + d_row, mask=krow_ok & d_ok, other=0.0)
        if CAST_F32:
            kr = kr.to(tl.float32)
        dq = tl.dot(ds.to(kr.dtype), kr, input_precision=DOT_PRECISION) * (q_scale * LN2)
        tl.atomic_add(DQ + row_h * D + d_row, dq, mask=q_ok & d_ok, sem="relaxed")

        # Pairs: d pair_repr = dS W_b for this tile's pairs (each written once), dW_b += dS^T z.
        ds_flat = tl.reshape(tl.permute(ds, [1, 2, 0]), [BLOCK_M * BLOCK_N, H_PAD])
        dz_rows = tl.reshape((b * N + offs_m[:, None]) * N + offs_n[None, :],
                             [BLOCK_M * BLOCK_N])
        for c0 in tl.static_range(0, C_PAD, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            c_ok = offs_c < C
            w = tl.load(WB + offs_h[:, None] * C + offs_c[None, :],
                        mask=(offs_h < H)[:, None] & c_ok[None, :], other=0.0)
            if CAST_F32:
                w = w.to(tl.float32)
            dz = tl.dot(ds_flat.to(w.dtype), w, input_precision=DOT_PRECISION)
            tl.store(DZ + dz_rows[:, None] * C + offs_c[None, :], dz.to(DZ.dtype.element_ty),
                     mask=rows_ok[:, None] & c_ok[None, :])
            z = tl.load(z_base + rows[:, None] * row_stride + offs_c[None, :] * stride_zc,
                        mask=rows_ok[:, None] & c_ok[None, :], other=0.0)
            if CAST_F32:
                z = z.to(tl.float32)
            dw = tl.dot(tl.trans(ds_flat).to(z.dtype), z, input_precision=DOT_PRECISION)
            acc_dw += tl.where(offs_k == c0 // BLOCK_C, dw[None, :, :], 0.0)

    # This program's keys: final when the query range is whole, else partial sums.
    kp = tl.load(KP + (bh3 * P3 + p_row) * N + key_rows, mask=krow_ok & p_ok, other=0.0)
    key_h = (sb * N + key_rows) * H + h3  # (S, B, N, H) row index, (H, BN, 1)
    tl.store(DK + key_h * D + d_row, acc_dk * (q_scale * LN2), mask=krow_ok & d_ok)
    tl.store(DV + key_h * D + d_row, acc_dv, mask=krow_ok & d_ok)
    sbh3 = sb * H + h3
    dkp = pw * (kp * colsum[:, :, None] - acc_dkp) * (2.0 * LN2)
    tl.store(DKP + (sbh3 * P3 + p_row) * N + key_rows, dkp, mask=krow_ok & p_ok)
    tl.store(DVP + (sbh3 * N + key_rows) * VP3 + e_row, acc_dvp, mask=krow_ok & e_ok)
    part = sb * NJ + pid_j
    chan = offs_k * BLOCK_C + tl.arange(0, BLOCK_C)[None, None, :]
    tl.store(DWB + (part * H + offs_h[None, :, None]) * C + chan, acc_dw,
             mask=(offs_h < H)[None, :, None] & (chan < C))
    tl.store(DPW + part * H + offs_h, acc_dpw * LN2, mask=offs_h < H)


# The forward's tiles (`fullfuse.py`); register use on sm_90 in docs/perf-notes.md.
_BACKWARD_KEY = ["C", "D_PAD", "P3", "VP3_PAD", "DOT_PRECISION"]
_INTERPRETED = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_C": 32}
_backward_fp32 = autotuned(  # fp32 and tf32
    "backward_fp32",
    _backward_kernel,
    configs=[triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_C": 32}, num_warps=8,
                           num_stages=1)],
    key=_BACKWARD_KEY,
    interpreted=_INTERPRETED,
)
_backward_16bit = autotuned(  # bf16 and fp16
    "backward_16bit",
    _backward_kernel,
    configs=[triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_C": 64}, num_warps=8,
                           num_stages=1)],
    key=_BACKWARD_KEY,
    interpreted=_INTERPRETED,
)


def single_key_gradients(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, pair_repr, pair_weight,
                         point_weight):
    """The attention core's gradients at N = 1, without a kernel: with one key the softmax is
    the constant 1 and every logit gradient is exactly zero (the oracle's too), where a kernel's
    P (dP - D) would leave rounding noise; the values' gradients are the outputs'."""
    zero = lambda t: torch.zeros(t.shape, dtype=t.dtype, device=t.device)
    copy = lambda t: t.clone(memory_format=torch.contiguous_format)  # never the input
    return (zero(q), zero(k), copy(grad_s.to(v.dtype)), zero(q_pts), zero(k_pts),
            copy(grad_p.permute(0, 2, 1, 3)), zero(pair_repr), zero(pair_weight),
            zero(point_weight))


def launch_backward(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, pair_repr, pair_weight,
                    point_weight, out_s, out_p, lse, modes: Modes, split: int | None = None):
    """The kernel, unchecked (the custom op's operands; shapes in `core_op.triton_ipa_core`),
    then the sums of its partial results. `split`: query ranges per key block (None:
    `fullfuse.default_split`'s choice, a few programs per SM). Returns the gradients of q, k, v
    (their dtype), q_pts, k_pts, v_pts (fp32), pair_repr, pair_weight (their dtype) and
    point_weight (fp32)."""
    b, n, h, d = q.shape
    p3, vp3, c = q_pts.shape[2], v_pts.shape[3], pair_repr.shape[3]
    dev, f32 = q.device, torch.float32
    if n == 1:
        return single_key_gradients(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, pair_repr,
                                    pair_weight, point_weight)
    split, split_len = split_range(n, default_split(b, n, dev) if split is None else split)
    grad_s, grad_p = grad_s.contiguous(), grad_p.contiguous()
    # D_i = sum_j P_ij dP_ij, per row and head: reads 2 * B*N*H*(D + 3Vp) elements.
    delta = row_delta(grad_s, out_s, grad_p, out_p)
    dq = torch.zeros(b, n, h, d, dtype=f32, device=dev)
    dq_pts = torch.zeros(b, h, p3, n, dtype=f32, device=dev)
    dk = torch.empty(split, b, n, h, d, dtype=f32, device=dev)
    dv = torch.empty_like(dk)
    dk_pts = torch.empty(split, b, h, p3, n, dtype=f32, device=dev)
    dv_pts = torch.empty(split, b, h, n, vp3, dtype=f32, device=dev)
    d_pair = torch.empty(b, n, n, c, dtype=pair_repr.dtype, device=dev)
    nj = cdiv(n, MIN_BLOCK_N)
    d_weight = torch.zeros(split, b, nj, h, c, dtype=f32, device=dev)
    d_point = torch.zeros(split, b, nj, h, dtype=f32, device=dev)
    pitched, z_pitch = pair_pitch(pair_repr)
    grid = lambda meta: (cdiv(n, meta["BLOCK_N"]), split, b)
    kernel = _backward_fp32 if q.dtype == torch.float32 else _backward_16bit
    kernel[grid](
        q, k, v, q_pts, k_pts, v_pts, pair_repr, pair_weight, point_weight, grad_s, grad_p,
        lse, delta, dq, dq_pts, dk, dv, dk_pts, dv_pts, d_pair, d_weight, d_point,
        n, c, nj, split_len, base2.LOG2E / math.sqrt(d),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *pair_repr.stride(), z_pitch,
        H=h, H_PAD=HEADS_PAD, D=d, D_PAD=pow2(d), P3=p3, P3_PAD=pow2(p3), VP3=vp3,
        VP3_PAD=pow2(vp3), C_PAD=pow2(c), DOT_PRECISION=modes.dot, PTS_PRECISION=modes.points,
        CAST_F32=cast_f32(q.dtype), Z_PITCHED=pitched,
    )
    # The reductions: query ranges (O(S * N)), and the (S, B, NJ) partial sums of the weights.
    return (dq.to(q.dtype), dk.sum(0).to(k.dtype), dv.sum(0).to(v.dtype), dq_pts,
            dk_pts.sum(0), dv_pts.sum(0), d_pair, d_weight.sum((0, 1, 2)).to(pair_weight.dtype),
            d_point.sum((0, 1, 2)))
