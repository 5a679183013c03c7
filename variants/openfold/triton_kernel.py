"""The fused O(N^2) kernel of problem `openfold`'s `triton` variant (the design, the register
budget and the deviations from the reference: `variants/openfold/triton_fused.py`).

One program per (query block of BLOCK_M rows, batch element), all heads. Per key block of
BLOCK_N keys it loads the z tile (BLOCK_M, BLOCK_N, c_z) once and uses it twice: for the pair
bias of every head (one batched dot with W_b, before the softmax) and for the pair values
o_pair (one batched dot with the attention, after it). Nothing N x N is written.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from variants import base2
from variants.triton.common import autotuned, cast_f32, cdiv, pow2
from variants.triton.tf32 import dot_split_tf32, tf32_hi


@triton.jit
def _w_tiles(WB, WBL, offs_h, h_ok, offs_c, c_ok, CZ: tl.constexpr, BLOCK_M: tl.constexpr,
             Z_PRECISION: tl.constexpr, SPLIT: tl.constexpr, CAST_F32: tl.constexpr,
             BT: tl.constexpr):
    """W_b's columns offs_c, (BLOCK_M, H_PAD, len(offs_c)) with BT, else W_b^T's rows
    (BLOCK_M, len(offs_c), H_PAD), and its low part (W_b again where there is none)."""
    if BT:
        w_offs = offs_h[:, None] * CZ + offs_c[None, :]
        w_ok = h_ok[:, None] & c_ok[None, :]
    else:
        w_offs = offs_h[None, :] * CZ + offs_c[:, None]
        w_ok = h_ok[None, :] & c_ok[:, None]
    w = tl.load(WB + w_offs, mask=w_ok, other=0.0)
    if CAST_F32:
        w = w.to(tl.float32)
    w_lo = w
    if Z_PRECISION == "tf32x3":
        w_lo = tl.load(WBL + w_offs, mask=w_ok, other=0.0)
        if not SPLIT:
            w = w + w_lo
    w = tl.broadcast_to(w[None, :, :], (BLOCK_M, w.shape[0], w.shape[1]))
    w_lo = tl.broadcast_to(w_lo[None, :, :], (BLOCK_M, w.shape[1], w.shape[2]))
    return w, w_lo


@triton.jit
def _bias_dot(z, w, acc, precision: tl.constexpr, BT: tl.constexpr):
    """acc + the pair bias of a z tile (BM, BN, c): W_b z_i^T (BM, H_PAD, BN) with BT, else
    z_i W_b^T (BM, BN, H_PAD)."""
    if BT:
        acc = tl.dot(w, tl.permute(z, (0, 2, 1)), acc, input_precision=precision)
    else:
        acc = tl.dot(z, w, acc, input_precision=precision)
    return acc


@triton.jit
def _z_bias(zt, w, w_lo, Z_PRECISION: tl.constexpr, SPLIT: tl.constexpr, BT: tl.constexpr):
    """The pair bias of one z tile (BM, BN, c) (c_z channels or a chunk), logits' layout
    (BM, H_PAD, BN) with BT (p's dot accumulator then feeds the o_pair dot as its A operand
    without a shuffle), else (BM, BN, H_PAD); and the tile's TF32 halves for the o_pair dot
    (the tile itself twice where unused)."""
    if BT:
        bias = tl.zeros([zt.shape[0], w.shape[1], zt.shape[1]], dtype=tl.float32)
    else:
        bias = tl.zeros([zt.shape[0], zt.shape[1], w.shape[2]], dtype=tl.float32)
    if Z_PRECISION == "tf32x3" and SPLIT:
        z_hi = tf32_hi(zt)
        z_lo = zt - z_hi
        bias = _bias_dot(z_lo, w, bias, "tf32", BT)
        bias = _bias_dot(z_hi, w_lo, bias, "tf32", BT)
        bias = _bias_dot(z_hi, w, bias, "tf32", BT)
    else:
        z_hi = zt
        z_lo = zt
        bias = _bias_dot(zt, w, bias, Z_PRECISION, BT)
    return bias, z_hi, z_lo


@triton.jit
def _z_pair(acc, p, p_hi, p_lo, zt, z_hi, z_lo, Z_PRECISION: tl.constexpr,
            SPLIT: tl.constexpr):
    """acc (BM, H_PAD, c) + p (BM, H_PAD, BN) @ the z tile (BM, BN, c)."""
    if Z_PRECISION == "tf32x3" and SPLIT:
        acc = dot_split_tf32(p_hi, p_lo, z_hi, z_lo, acc)
    else:
        acc += tl.dot(p.to(zt.dtype), zt, input_precision=Z_PRECISION)
    return acc


@triton.jit(do_not_specialize=["N"])
def _openfold_kernel(
    Q, K, V,  # (B, N, H, C) views, input dtype, strides (sb, sn, sh, 1)
    VL,  # with TC (fp32 IEEE dots): the low part v - tf32(v), V's strides; else unused
    QP, KP,  # fp32 point rows, contiguous: (B, H, P3, N) coordinates, or with POINTS_DOT
    # (B, H, P3, N) and (B, H, N, P3) rows of `triton_fused.point_rows` (KP: the TF32 high
    # parts when PTS_PRECISION is tf32x3; QP is split here, once)
    KPL,  # with POINTS_DOT and PTS_PRECISION tf32x3: KP's low parts (x - hi), else unused
    VP,  # (B, H, VP3_PAD, NP) fp32 value points, coordinates x keys, zero-padded (keys to NP,
    # a multiple of every BLOCK_N), contiguous (TF32 high parts when PTS_PRECISION is tf32x3)
    VPL,  # the low parts with PTS_PRECISION tf32x3 (VP the high parts) or with TC (VP the
    # points themselves), else unused
    MASK,  # (B, N) fp32, 1 = present
    Z,  # (B, N, N, c_z) input dtype, any strides
    WB,  # (H, c_z) linear_b.weight, input dtype, contiguous (TF32 high part when Z_PRECISION
    # is tf32x3)
    WBL,  # with Z_PRECISION tf32x3: W_b's low part, else unused
    BB,  # (H,) fp32 linear_b.bias * sqrt(1/3) * log2(e)
    PW,  # (H,) fp32 -w_h / 2 * log2(e): the point-distance factor
    OUT,  # (B, N, W) fp32 rows of linear_out's input: o at column 0, o_pair at PAIR_COL
    OPT,  # (B, N, H, 3*Pv) fp32: sum_j a_ij v_pts_j (global frame)
    N,
    NP,  # VP's padded key axis: keys are loaded unclamped, so contiguous (wide copies)
    q_scale,  # sqrt(1/(3C)) * log2(e)
    bias_scale,  # sqrt(1/3) * log2(e)
    mask_inf,  # inf * log2(e)
    stride_qb, stride_qn, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_zb, stride_zi, stride_zj, stride_zc,
    stride_ob, stride_on,
    N_KEY,  # autotune bucket, unused in the body
    H: tl.constexpr,
    H_PAD: tl.constexpr,
    C: tl.constexpr,
    C_PAD: tl.constexpr,
    CZ: tl.constexpr,
    CZ_PAD: tl.constexpr,
    P3: tl.constexpr,  # rows of QP / KP
    VP3: tl.constexpr,
    VP3_PAD: tl.constexpr,
    PAIR_COL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # q.k and p.v
    Z_PRECISION: tl.constexpr,  # the two z dots (pair bias, o_pair)
    PTS_PRECISION: tl.constexpr,  # p.v_pts and the distance dot (fp32 operands)
    POINTS_DOT: tl.constexpr,
    CAST_F32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TC: tl.constexpr,  # fp32 inputs, IEEE dots: 1 = p.v and p.v_pts as three TF32 dots of
    # split operands (tensor cores) instead of FMA; 0 = FMA (q.k that way too spilled: left out)
    BT: tl.constexpr,  # the pair bias dot as W_b z^T, in the logits' (BM, H_PAD, BN) layout
    LAZY: tl.constexpr,  # rescale the accumulators only when a running max grew by > 2^8
    ZCH: tl.constexpr,  # 1 or 2: the z tile in ZCH chunks of channels, each with its own
    # loads, bias dot and o_pair accumulator (the live dot operands shrink with the chunk)
    SPLIT: tl.constexpr,  # tf32x3 dots as three TF32 dots of operands split by tf32_hi (key
    # side and W_b split by the host), else Triton's tf32x3 (which splits both operands of
    # every dot in the loop); the same products either way
    PAIR_VALUES: tl.constexpr,  # o_pair accumulated and stored (problem openfold); else the
    # z tile serves the pair bias alone (problem simplified: `variants/triton/pairdot.py`)
    HAS_MASK: tl.constexpr,  # MASK read (openfold); else every residue present
):
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, H_PAD)
    offs_c = tl.arange(0, C_PAD)
    offs_e = tl.arange(0, VP3_PAD)
    m_ok = offs_m < N
    h_ok = offs_h < H
    c_ok = offs_c < C
    e_ok = offs_e < VP3
    # Two layouts of the (query, head, key) logits. Row-major (BLOCK_M, H_PAD, BLOCK_N) for the
    # z terms (pair bias, o_pair: dots batched over query rows, each row's z_i. from the one
    # tile) and the softmax. Head-major with keys before queries, (H_PAD, BLOCK_N, BLOCK_M), for
    # the per-head terms (q.k, distances, p.v, p.v_pts: dots batched over heads, the key axis
    # as M, so that a small BLOCK_M costs no padding of M).
    hh = offs_h[:, None, None]
    hh_ok = hh < H
    # Loads in the key loop clamp their indices into range instead of masking (padded heads,
    # channels, keys and rows read real, finite data): the zero padding that matters is in the
    # loop-invariant operands (q, the point rows, W_b), keys j >= N get -inf logits, and
    # padded rows, heads and channels are never stored.
    hc = tl.minimum(offs_h, H - 1)[:, None, None]
    # (a clamp hides contiguity from the compiler: channels are clamped only when padded)
    kc_c = offs_c if C == C_PAD else tl.minimum(offs_c, C - 1)
    bhc = b * H + hc
    mq = offs_m[None, None, :]  # queries on the last axis
    mq_ok = mq < N
    bh = b * H + hh

    q_t = tl.load(Q + b * stride_qb + mq * stride_qn + hh * stride_qh + offs_c[None, :, None],
                  mask=hh_ok & mq_ok & c_ok[None, :, None], other=0.0)  # (H_PAD, C_PAD, BM)
    if CAST_F32:
        q_t = q_t.to(tl.float32)
    TC_ON: tl.constexpr = TC > 0 and DOT_PRECISION == "ieee" and Q.dtype.element_ty == tl.float32
    if POINTS_DOT:
        # QP rows [-2 pw q | pw | pw |q|^2 | 0], KP rows [k | |k|^2 | 1 | 0]: their dot is
        # pw * |q - k|^2 (see triton_fused.point_rows)
        offs_p = tl.arange(0, P3)
        qp_t = tl.load(QP + (bh * P3 + offs_p[None, :, None]) * N + mq,
                       mask=hh_ok & mq_ok, other=0.0)  # (H_PAD, P3, BM)
        if PTS_PRECISION == "tf32x3" and SPLIT:
            qp_lo = qp_t - tf32_hi(qp_t)
            qp_t = qp_t - qp_lo
    else:
        pw = tl.load(PW + hh, mask=hh_ok, other=0.0)
    # W_b per channel chunk, hoisted: (BM, H_PAD, CZH) with BT, else W_b^T (BM, CZH, H_PAD)
    tl.static_assert(ZCH == 1 or ZCH == 2)  # (more chunks would need more accumulators)
    CZH: tl.constexpr = CZ_PAD // ZCH
    offs_z0 = tl.arange(0, CZH)
    zc0 = offs_z0 if CZ == CZ_PAD else tl.minimum(offs_z0, CZ - 1)
    wb, wb_lo = _w_tiles(WB, WBL, offs_h, h_ok, offs_z0, offs_z0 < CZ, CZ, BLOCK_M,
                         Z_PRECISION, SPLIT, CAST_F32, BT)
    if ZCH == 2:
        offs_z1 = CZH + offs_z0
        zc1 = offs_z1 if CZ == CZ_PAD else tl.minimum(offs_z1, CZ - 1)
        wb1, wb1_lo = _w_tiles(WB, WBL, offs_h, h_ok, offs_z1, offs_z1 < CZ, CZ, BLOCK_M,
                               Z_PRECISION, SPLIT, CAST_F32, BT)
    bb = tl.load(BB + offs_h, mask=h_ok, other=0.0)
    if HAS_MASK:
        mask_i = tl.load(MASK + b * N + offs_m, mask=m_ok, other=0.0)
        # m_i * inf * (m_j - 1) (log2 units): the SPEC's inf * (m_i m_j - 1) less inf on
        # every key of a masked query row, a shift the softmax cancels (triton_fused.py,
        # "Deviations").
        row_inf = mask_i * mask_inf
    z_rows = Z + b * stride_zb + tl.minimum(offs_m, N - 1)[:, None, None].to(tl.int64) * stride_zi

    kp_rows = KP + b * (H * P3) * N  # this batch element's (H, N, P3) block (POINTS_DOT)
    kpl_rows = KPL + b * (H * P3) * N
    vp_rows = VP + b * (H * VP3_PAD) * NP  # this batch element's (H, VP3_PAD, NP) block
    vpl_rows = VPL + b * (H * VP3_PAD) * NP

    m_run = tl.full([BLOCK_M, H_PAD], float("-inf"), dtype=tl.float32)
    l_run = tl.zeros([BLOCK_M, H_PAD], dtype=tl.float32)
    if PAIR_VALUES:
        acc_z = tl.zeros([BLOCK_M, H_PAD, CZH], dtype=tl.float32)
        acc_z1 = tl.zeros([BLOCK_M, H_PAD, CZH], dtype=tl.float32)  # ZCH = 2: channels CZH..
    acc_v = tl.zeros([H_PAD, C_PAD, BLOCK_M], dtype=tl.float32)
    acc_p = tl.zeros([H_PAD, VP3_PAD, BLOCK_M], dtype=tl.float32)
    for j0 in range(0, N, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        offs_nv = tl.max_contiguous(tl.multiple_of(offs_n, BLOCK_N), BLOCK_N)
        n_ok = offs_n < N
        n_in = tl.minimum(offs_n, N - 1)
        nk = n_in[None, :, None]  # keys on the middle axis
        # -- per-head terms (H_PAD, BN, BM): q.k / sqrt(3C) - w_h/2 sum_p |q_p - k_p|^2
        k_offs = b * stride_kb + nk * stride_kn + hc * stride_kh + kc_c[None, None, :]
        k = tl.load(K + k_offs)  # (H_PAD, BN, C_PAD)
        if CAST_F32:
            k = k.to(tl.float32)
        s_head = tl.dot(k, q_t, input_precision=DOT_PRECISION) * q_scale
        if POINTS_DOT:
            # (H_PAD, BN, P3); int32 offsets from this batch element's block
            kp_offs = (hc * N + nk) * P3 + offs_p[None, None, :]
            kp = tl.load(kp_rows + kp_offs)
            if PTS_PRECISION == "tf32x3":
                kp_lo = tl.load(kpl_rows + kp_offs)
                if SPLIT:
                    s_head = dot_split_tf32(kp, kp_lo, qp_t, qp_lo, s_head)
                else:
                    s_head += tl.dot(kp + kp_lo, qp_t, input_precision="tf32x3")
            else:
                s_head += tl.dot(kp, qp_t, input_precision=PTS_PRECISION)
        else:
            # direct squared differences; the query coordinates are loaded in the loop (the
            # mask names the loop index) so that they are not hoisted into P3 register tiles
            dist = tl.zeros([H_PAD, BLOCK_N, BLOCK_M], dtype=tl.float32)
            in_loop = tl.full([1, 1, BLOCK_M], j0, tl.int32) < N
            for c in tl.static_range(P3):
                qc = tl.load(QP + (bh * P3 + c) * N + mq, mask=hh_ok & mq_ok & in_loop,
                             other=0.0)
                kc = tl.load(KP + (bhc * P3 + c) * N + nk)
                diff = kc - qc
                dist += diff * diff
            s_head += pw * dist
        # -- the z tile, read once: (BM, BN, CZ_PAD); pair bias of every head (BM, BN, H_PAD)
        z_keys = z_rows + n_in[None, :, None].to(tl.int64) * stride_zj
        zt = tl.load(z_keys + zc0[None, None, :] * stride_zc)
        if CAST_F32:
            zt = zt.to(tl.float32)
        # (with SPLIT the tile's TF32 halves feed both z dots)
        bias, z_hi, z_lo = _z_bias(zt, wb, wb_lo, Z_PRECISION, SPLIT, BT)
        if ZCH == 2:
            zt1 = tl.load(z_keys + zc1[None, None, :] * stride_zc)
            if CAST_F32:
                zt1 = zt1.to(tl.float32)
            bias1, z1_hi, z1_lo = _z_bias(zt1, wb1, wb1_lo, Z_PRECISION, SPLIT, BT)
            bias += bias1
        if not BT:
            bias = tl.permute(bias, (0, 2, 1))
        s = tl.permute(s_head, (2, 0, 1)) + bias * bias_scale + bb[None, :, None]
        if HAS_MASK:
            mask_j = tl.load(MASK + b * N + n_in)
            s += (row_inf[:, None] * (mask_j[None, :] - 1.0))[:, None, :]
        s = tl.where(n_ok[None, None, :], s, float("-inf"))
        # -- online softmax over keys (axis 2), fp32, base 2; the accumulators rescaled here
        m_new = tl.maximum(m_run, tl.max(s, 2))
        if LAZY:
            # only when some running max grew by more than 2^8 (else the stale max stays,
            # p <= 2^8: exact in fp32 and bf16's range); the first block always rescales
            rescale = tl.max(tl.max(m_new - m_run, 1), 0) > 8.0
        else:
            rescale = True
        if rescale:
            alpha = tl.exp2(m_run - m_new)
            l_run = l_run * alpha
            if PAIR_VALUES:
                acc_z = acc_z * alpha[:, :, None]
                if ZCH == 2:
                    acc_z1 = acc_z1 * alpha[:, :, None]
            alpha_head = tl.permute(alpha, (1, 0))[:, None, :]
            acc_v = acc_v * alpha_head
            acc_p = acc_p * alpha_head
            m_run = m_new
        p = tl.exp2(s - m_run[:, :, None])
        l_run = l_run + tl.sum(p, 2)
        if PAIR_VALUES:
            # -- o_pair: a_i (H_PAD, BN) @ z_i (BN, c_z), batched over rows i (the same tile)
            p_hi = p
            p_lo = p
            if Z_PRECISION == "tf32x3" and SPLIT:
                p_hi = tf32_hi(p)
                p_lo = p - p_hi
            acc_z = _z_pair(acc_z, p, p_hi, p_lo, zt, z_hi, z_lo, Z_PRECISION, SPLIT)
            if ZCH == 2:
                acc_z1 = _z_pair(acc_z1, p, p_hi, p_lo, zt1, z1_hi, z1_lo, Z_PRECISION, SPLIT)
        # -- scalar and point values, head-major: v^T (C, BN) @ a^T (BN, BM) per head
        p_head = tl.permute(p, (1, 2, 0))  # (H_PAD, BN, BM)
        ph_hi = p_head
        ph_lo = p_head
        if (PTS_PRECISION == "tf32x3" and SPLIT) or TC_ON:
            ph_hi = tf32_hi(p_head)
            ph_lo = p_head - ph_hi
        v_offs = b * stride_vb + n_in[None, None, :] * stride_vn + hc * stride_vh \
            + kc_c[None, :, None]
        v_t = tl.load(V + v_offs)  # (H_PAD, C_PAD, BN)
        if CAST_F32:
            v_t = v_t.to(tl.float32)
        if TC_ON:
            v_lo = tl.load(VL + v_offs)
            v_t = v_t - v_lo
            acc_v = dot_split_tf32(v_t, v_lo, ph_hi, ph_lo, acc_v)
        else:
            acc_v = tl.dot(v_t, p_head.to(v_t.dtype), acc_v, input_precision=DOT_PRECISION)
        # (H_PAD, VP3_PAD, BN), the dot's A operand with K (keys) contiguous, as ldmatrix
        # wants it for 32-bit operands (keys padded to NP: no clamp, 16-byte copies)
        vp_offs = (hc * VP3_PAD + offs_e[None, :, None]) * NP + offs_nv[None, None, :]
        vp_t = tl.load(vp_rows + vp_offs)
        if PTS_PRECISION == "tf32x3":
            vp_lo = tl.load(vpl_rows + vp_offs)
            if SPLIT:
                acc_p = dot_split_tf32(vp_t, vp_lo, ph_hi, ph_lo, acc_p)
            else:
                acc_p += tl.dot(vp_t + vp_lo, p_head, input_precision="tf32x3")
        elif TC_ON:  # VP holds the unsplit points here
            vp_lo = tl.load(vpl_rows + vp_offs)
            vp_t = vp_t - vp_lo
            acc_p = dot_split_tf32(vp_t, vp_lo, ph_hi, ph_lo, acc_p)
        else:
            acc_p += tl.dot(vp_t, p_head, input_precision=PTS_PRECISION)

    # -- epilogue: normalise and store (rows i >= N, padded heads and channels are not stored)
    out_rows = OUT + b * stride_ob + offs_m.to(tl.int64) * stride_on
    if PAIR_VALUES:
        acc_z = acc_z / l_run[:, :, None]
        tl.store(out_rows[:, None, None] + PAIR_COL + offs_h[None, :, None] * CZ
                 + offs_z0[None, None, :], acc_z,
                 mask=m_ok[:, None, None] & h_ok[None, :, None] & (offs_z0 < CZ)[None, None, :])
        if ZCH == 2:
            acc_z1 = acc_z1 / l_run[:, :, None]
            tl.store(out_rows[:, None, None] + PAIR_COL + offs_h[None, :, None] * CZ
                     + offs_z1[None, None, :], acc_z1,
                     mask=(m_ok[:, None, None] & h_ok[None, :, None]
                           & (offs_z1 < CZ)[None, None, :]))
    l_head = tl.permute(l_run, (1, 0))[:, None, :]
    acc_v = acc_v / l_head
    tl.store(out_rows[None, None, :] + hh * C + offs_c[None, :, None], acc_v,
             mask=hh_ok & mq_ok & c_ok[None, :, None])
    acc_p = acc_p / l_head
    tl.store(OPT + ((b * N + mq) * H + hh) * VP3 + offs_e[None, :, None], acc_p,
             mask=hh_ok & mq_ok & e_ok[None, :, None])


KEY_PAD = 64  # v_pts's key axis is padded to a multiple of this: of every BLOCK_N
_KEY = ["N_KEY", "H_PAD", "C_PAD", "CZ_PAD", "P3", "VP3_PAD", "DOT_PRECISION", "Z_PRECISION",
        "PTS_PRECISION", "POINTS_DOT"]
_INTERPRETED = {"BLOCK_M": 16, "BLOCK_N": 16, "SPLIT": True, "ZCH": 2, "LAZY": True,
                "TC": 1, "BT": True}
# Autotune configs: (BLOCK_M, BLOCK_N, warps, stages, ZCH, SPLIT, LAZY, TC, BT). First chosen
# with an sm_90 compile-time proxy on triton 3.9 (docs/perf-notes.md, "2026-12-03: openfold
# `triton` forward, compile-time measurements"), then revised with one on triton 3.6, the GPU
# machine's, which reproduces its registers and spills exactly, calibrated against the H200's
# per-config times (perf-notes, fifth session). Triton 3.6 puts every warp on the query-row
# axis of the kernel's 3-D dots, so BLOCK_M < num_warps computes the z dots and o_pair twice
# or more: fp32 adds BLOCK_M 8 with 8 warps and BLOCK_M 4 with 4. Dropped: the configs that
# lost at N = 1024, 2048 and 4096 on the H200 (fp32 BM 2 and BM 4 LAZY; 16-bit BM 4, one
# stage, BM 8 without BT). The last of each list is the first kernel's code path (Triton's
# tf32x3, eager rescaling), kept as the control.
_FP32 = [(4, 16, 8, 2, 2, True, False, 0, False), (4, 16, 8, 2, 2, True, False, 1, False),
         (8, 16, 8, 2, 2, True, False, 1, False), (8, 16, 8, 2, 2, True, True, 1, False),
         (8, 16, 8, 2, 2, True, False, 0, False), (4, 16, 4, 2, 2, True, False, 1, False),
         (4, 16, 8, 2, 1, False, False, 0, False)]
_16BIT = [(8, 16, 8, 2, 2, True, False, 0, True), (8, 16, 8, 2, 2, True, True, 0, True),
          (4, 16, 8, 2, 1, False, False, 0, False)]


# The pair bias alone (PAIR_VALUES off: the simplified problem's `triton-pairdot`, head_dim 32
# by default). Chosen on the sm_90 proxy (triton 3.6, `sm90_proxy.py --problem simplified`):
# at two stages only BLOCK_M 8 x BLOCK_N 16 fits in 227 KiB of shared memory (the 2-stage
# BLOCK_M 16 configs need 280-725 KiB); one stage brings BLOCK_M 16 to 98 KiB (fp32) and
# 115 KiB (bf16). Predicted at N = 2048, outside the fits' range: bf16 ~1.2 ms, fp32 3.4-4.3
# ms (255 registers, 120-320 spills); measured on the H200 (seventh session): bf16 at N = 2048
# 1.16-1.40 ms, N = 4096 4.65-5.57 ms; fp32 4.2-7.2 and 16.7-28.6 ms (perf-notes). The last
# 16-bit config (one stage, BLOCK_M 8: 74 KiB at the default layer) is there for layers with
# many points: at H = 4, Qp = 8, Vp = 12 every other 16-bit config needs 232-372 KiB of shared
# memory and fails to launch, this one 148 KiB (the fp32 list's last fits at 208 KiB).
_BIAS_FP32 = [(8, 16, 8, 2, 2, True, False, 0, False), (16, 16, 8, 1, 2, True, False, 1, False),
              (8, 16, 8, 1, 2, True, False, 1, False)]
_BIAS_16BIT = [(8, 16, 8, 2, 2, True, False, 0, True), (16, 16, 8, 1, 2, True, False, 0, True),
               (16, 32, 8, 1, 2, True, False, 0, True), (8, 16, 4, 2, 2, True, False, 0, True),
               (8, 16, 8, 1, 2, True, False, 0, True)]


def _configs(table):
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "ZCH": zch, "SPLIT": split,
                           "LAZY": lazy, "TC": tc, "BT": bt}, num_warps=w, num_stages=s)
            for m, n, w, s, zch, split, lazy, tc, bt in table]


_kernel_fp32 = autotuned("openfold_fused_fp32", _openfold_kernel, configs=_configs(_FP32),
                         key=_KEY, interpreted=_INTERPRETED)
_kernel_16bit = autotuned("openfold_fused_16bit", _openfold_kernel, configs=_configs(_16BIT),
                          key=_KEY, interpreted=_INTERPRETED)
_bias_kernel_fp32 = autotuned("pairdot_fp32", _openfold_kernel, configs=_configs(_BIAS_FP32),
                              key=_KEY, interpreted=_INTERPRETED)
_bias_kernel_16bit = autotuned("pairdot_16bit", _openfold_kernel,
                               configs=_configs(_BIAS_16BIT), key=_KEY,
                               interpreted=_INTERPRETED)


def launch(q, k, v, q_pts, k_pts, v_pts, mask, z, w_b, b_b, point_weight, out, o_pt, *,
           lows: tuple, q_scale: float, inf: float, precisions: tuple[str, str, str],
           points_dot: bool, pair_values: bool = True,
           bias_scale: float = math.sqrt(1.0 / 3.0)) -> None:
    """The kernel, unchecked (`triton_fused.FusedForward` builds every operand):

    q, k, v        (B, N, H, C) views, innermost stride 1, input dtype
    q_pts, k_pts   fp32 contiguous: the 3*Pq coordinates as (B, H, 3*Pq, N) each, or with
                   `points_dot` the rows of `triton_fused.point_rows`, (B, H, P, N) and
                   (B, H, N, P)
    v_pts          (B, H, VP3_PAD, NP) fp32 contiguous, zero beyond 3*Pv and beyond key N;
                   NP a multiple of 64 (`KEY_PAD`)
    mask           (B, N) fp32 contiguous, or None: every residue present
    z              (B, N, N, c_z) input dtype, any strides
    w_b            (H, c_z) input dtype, contiguous (natural units)
    b_b            (H,) fp32: linear_b.bias * sqrt(1/3) * log2(e)
    point_weight   (H,) fp32: -w_h / 2 * log2(e)
    out            (B, N, W) fp32, innermost stride 1: receives o (B, N, H*C) at column 0
                   and, with `pair_values`, o_pair (B, N, H*c_z) at column W - H*c_z
    o_pt           (B, N, H, 3*Pv) fp32 contiguous: receives sum_j a_ij v_pts_j
    lows           (k_pts, v_pts, w_b, v)'s low parts (`triton_fused.tf32_split`, shaped
                   and strided as those), None where not used: k_pts's with `points_dot`,
                   v_pts's and w_b's where their dots are tf32x3 (k_pts, v_pts and w_b then
                   hold the TF32 high parts), and for fp32 IEEE dots (the TC configs) those of
                   v and v_pts (which hold the values themselves)
    pair_values    accumulate and store o_pair (openfold), else z serves the pair bias alone
    bias_scale     the pair bias's factor in the logits (openfold: sqrt(1/3); simplified: 1)
    """
    b, n, h, c = q.shape
    cz = z.shape[3]
    p3, vp3 = q_pts.shape[2], o_pt.shape[3]
    if pair_values:
        kernel = _kernel_fp32 if q.dtype == torch.float32 else _kernel_16bit
    else:
        kernel = _bias_kernel_fp32 if q.dtype == torch.float32 else _bias_kernel_16bit
    grid = lambda meta: (cdiv(n, meta["BLOCK_M"]), b)  # noqa: E731
    kp_lo, vp_lo, wb_lo, v_lo = (lo if lo is not None else hi for lo, hi in
                                 zip(lows, (k_pts, v_pts, w_b, v), strict=True))
    kernel[grid](
        q, k, v, v_lo, q_pts, k_pts, kp_lo, v_pts, vp_lo, q_pts if mask is None else mask, z,
        w_b, wb_lo, b_b, point_weight, out, o_pt,
        n, v_pts.shape[3], q_scale, bias_scale * base2.LOG2E, inf * base2.LOG2E,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), *z.stride(), out.stride(0), out.stride(1),
        pow2(n, 64), H=h, H_PAD=pow2(h), C=c, C_PAD=pow2(c), CZ=cz, CZ_PAD=pow2(cz), P3=p3,
        VP3=vp3, VP3_PAD=v_pts.shape[2], PAIR_COL=out.shape[2] - h * cz if pair_values else 0,
        DOT_PRECISION=precisions[0], Z_PRECISION=precisions[1], PTS_PRECISION=precisions[2],
        POINTS_DOT=points_dot,
        CAST_F32=cast_f32(q.dtype), PAIR_VALUES=pair_values, HAS_MASK=mask is not None,
    )
