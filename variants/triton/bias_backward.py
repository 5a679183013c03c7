"""The backward of the `triton` forward (the pair bias as a (B, H, N, N) tensor, then the streamed
attention kernel of `attention.py`): per-head kernels and one pass over pair_repr.

Idea: FlashAttention-2's backward (Dao 2023, section 3.2), per (batch, head) as the forward,
with the bias read from the tensor the forward wrote rather than recomputed from pair_repr. The
forward saves each row's statistics (base-2 units as in `variants/base2.py`): its max m and
log2 l of its softmax, so that P = 2^((s - m) - log2 l) is recomputed, never stored, and its
attention-weighted mean squared point distance dbar. With D_i = dO_i . O_i precomputed:

  key kernel (a program owns BLOCK_N keys of one (b, h) and walks the query blocks of one
  query range; at moderate N several ranges (`key_split`) fill the SMs, and their key-side
  partial sums are added after)
      s  = q.k log2(e)/sqrt(d) + log2(e) bias + pw |qp - kp|^2      (the forward's logits)
      P  = 2^((s - m) - log2 l);  dP = dO_s . v + dO_p . vp;  dS = P (dP - D)  (d / d logit)
      dv += P^T dO_s, dvp += P^T dO_p,
      d pw += ln 2 sum dS (|qp - kp|^2 - dbar) with w = pw ln 2 = -softplus(head_weights) / 2
      (a sum per key, summed by PyTorch);
      dS is written over the bias tile it was computed from: every tile belongs to exactly
      one program, which reads it before it writes it, so the (B, H, N, N) buffer the forward
      saved becomes the bias gradient and no second N x N x H tensor is allocated. Its tiles
      are keys x queries (S^T, P^T, dS^T, as the Triton tutorial's backward): the key-side
      dots take them as computed, and only loaded tiles are transposed.
  sums of dS, read back once per side: by rows for the queries, dq = dS k / sqrt(d),
      dqp = 2 w (qp rowsum(dS) - dS kp), and by columns for the keys, dk = dS^T q / sqrt(d),
      dkp = 2 w (kp colsum(dS) - dS^T qp): no atomics, no recomputation. A 16-bit dS goes to
      `_ds_sums_kernel` (a program owns BLOCK_M rows of one (b, h)); an fp32 dS to one cuBLAS
      SGEMM per side (`gemm_ds_sums`), because Triton's TF32 dots cannot read dS's transposed
      tile from shared memory (its key-side sums took 2.4 ms at N = 4096 on the H200) and its
      IEEE dots run as FMA loops. Keeping dk and dkp out of the key kernel is what lets it
      run: with their accumulators it spilled (sm_90 proxy, 32 x 64 tiles: bf16 156 -> 4
      words, fp32 244 -> 56 without) and took 5.9 ms at N = 4096 in fp32 against 4.6 without.
  pair kernel (a program owns a run of (i, j) pairs of one batch element) reads each dS and
      z tile once: d pair_repr = dS^T W_b written once (the only N x N x C tensor of the step)
      and dW_b = sum dS z into a partial sum per program (no atomic hot spot), summed by
      PyTorch. fp32 dots as 3xTF32: cuBLAS ran both products as SIMT sgemm (K = H = 12).

fp32 dots run as 3xTF32 from operands split once (`tf32.tf32_parts`, `dot_parts`): Triton's own
tf32x3 splits both operands of every dot again, in five instructions per element.

Two choices are for accuracy, found by emulating the backward in fp32 against float64 at
N = 1024 (docs/perf-notes.md): P from (s - m) - log2 l rather than s - LSE, whose rounding at
|LSE| scales each row's P and made the point-weight gradients 6-10x the reference's error; and
d pw summed over dist - dbar rather than dist: the two are equal because every row of dS sums to
zero, but any error that scales a row of dS is then multiplied by the spread of the distances
around their mean instead of by the distances themselves (hundreds of A^2).

The point products (dP's point half, dvp, dkp, dqp) run on coordinates centred on the
program's first key (key kernel, key sums) or query (query sums) point: dS kp is subtracted from
qp rowsum(dS), and dO_p . vp from D, which at the 10-100 A of the global frame would cancel;
D takes dO_p . centre off to match. They run as 3xTF32 for fp32 inputs and in TF32 for
16-bit ones; the squared distances are recomputed directly in fp32.

The forward's buffer is mutated: the op declares it (`mutates_args`), and autograd's version
counter turns a second backward through the same graph (retain_graph) into PyTorch's in-place
error rather than a wrong gradient.

Problem openfold's `triton-bias` reuses the key kernel and the sums (`attention_gradients`)
with two constexpr paths: LOGITS, the buffer holds the forward's base-2 logits (its attention
kernel wrote them; nothing to recompute but the distances that d point_weight needs), which
stay; HAS_G, a second (B, H, N, N) fp32 buffer brings the pair values' term of dP and
receives dS (`variants/openfold/bias_backward.py`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from variants import base2
from variants.problem import math_mode
from variants.triton.backward import single_key_gradients
from variants.triton.common import (
    INTERPRET,
    Modes,
    autotuned,
    block_configs,
    cast_f32,
    largest_meta,
    pow2,
    sm_count,
    split_for_sms,
    split_range,
)
from variants.triton.tf32 import dot_parts, tf32_parts

LOG2E = tl.constexpr(base2.LOG2E)
LN2_F = math.log(2.0)
LN2 = tl.constexpr(LN2_F)


@triton.jit
def _add_ds_sums(ds, other_hi, other_lo, other_p, acc, acc_p, rowsum, SPLIT: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, PTS_PRECISION: tl.constexpr):
    """One block's sums of an fp32 dS tile (rows x other side): acc + dS other (from
    `tf32_parts`), acc_p + dS other_p (centred points), rowsum + its row sums. dS is split once
    for both dots."""
    ds_hi, ds_lo = tf32_parts(ds, SPLIT)
    acc = dot_parts(ds_hi.to(other_hi.dtype), ds_lo.to(other_hi.dtype), other_hi, other_lo, acc,
                    DOT_PRECISION)
    other_p_hi, other_p_lo = tf32_parts(other_p, SPLIT)
    acc_p = dot_parts(ds_hi, ds_lo, other_p_hi, other_p_lo, acc_p, PTS_PRECISION)
    return acc, acc_p, rowsum + tl.sum(ds, 1)


@triton.jit(do_not_specialize=["N", "split_len", "N_KEY"])
def _key_kernel(
    Q, K, V,  # (B, N, H, D) views: strides (sb, sn, D, 1), input dtype
    QP, KP,  # (B, H, 3*Qp, N) fp32 global-frame query / key points
    VP,  # (B, H, N, 3*Vp) fp32 global-frame value points
    BIAS,  # (B, H, N, N) input dtype: the pair bias (natural units) in; with LOGITS fp32,
    # the forward's base-2 logits, bias, mask and all (problem openfold's `triton-bias`)
    DS,  # with HAS_G, (B, H, N, N) fp32: G in, a term of dP per (row, key) besides the
    # values' (openfold's pair values, do_pair_i . z_ij), dS out (each tile read, then
    # written); else unused and dS goes over BIAS
    PW,  # (H,) fp32 point weight: -softplus(head_weights) / 2 * log2(e) (negative)
    DOS,  # (B, N, H, D) contiguous, input dtype: d loss / d out_s
    DOP,  # (B, N, H, 3*Vp) fp32 contiguous: d loss / d out_p
    STATS,  # (B, N, H, 3) fp32, the forward's: row max m, log2 l, mean distance dbar
    DELTA,  # (B, N, H) fp32: D_i = dO_s . out_s + dO_p . out_p
    DV,  # (S, B, N, H, D) fp32: one partial sum per query range
    DVP,  # (S, B, H, N, 3*Vp) fp32
    DPW,  # (S, B, H, N) fp32: each key's sum over the range's queries of d point_weight
    N,
    split_len,  # queries per range (a multiple of every BLOCK_M)
    q_scale,  # log2(e) / sqrt(D)
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
    N_KEY,  # autotune bucket, unused in the body
    H: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    P3: tl.constexpr,
    P3_PAD: tl.constexpr,
    VP3: tl.constexpr,
    VP3_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PTS_PRECISION: tl.constexpr,
    CAST_F32: tl.constexpr,
    LOGITS: tl.constexpr,
    HAS_G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2).to(tl.int64)  # query range
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    bh = b * H + h
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    offs_e = tl.arange(0, VP3_PAD)
    n_ok = offs_n < N
    d_ok = offs_d < D
    e_ok = offs_e < VP3
    nd_ok = n_ok[:, None] & d_ok[None, :]

    pw = tl.load(PW + h)
    k = tl.load(K + b * stride_kb + h * D + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=nd_ok, other=0.0)  # (BN, D_PAD)
    v = tl.load(V + b * stride_vb + h * D + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=nd_ok, other=0.0)
    if CAST_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    SPLIT: tl.constexpr = DOT_PRECISION == "tf32x3"  # fp32: every dot as 3xTF32 (`tf32.py`)
    k_hi, k_lo = tf32_parts(k, SPLIT)
    v_hi, v_lo = tf32_parts(v, SPLIT)
    # Point products run on coordinates centred on this block's first key point (small
    # numbers: the sums they enter cancel at the 10-100 A of the global frame otherwise).
    n0 = pid_n * BLOCK_N
    centre_e = tl.load(KP + (bh * P3 + offs_e % 3) * N + n0)  # (VP3_PAD,)
    vp = tl.load(VP + (bh * N + offs_n[:, None]) * VP3 + offs_e[None, :],
                 mask=n_ok[:, None] & e_ok[None, :], other=0.0)  # (BN, VP3_PAD)
    vp = tl.where(n_ok[:, None] & e_ok[None, :], vp - centre_e[None, :], 0.0)
    vp_hi, vp_lo = tf32_parts(vp, SPLIT)

    acc_dv = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    acc_dvp = tl.zeros([BLOCK_N, VP3_PAD], dtype=tl.float32)
    acc_dpw = tl.zeros([BLOCK_N], dtype=tl.float32)
    bias_rows = BIAS + bh * N * N + offs_n[:, None]  # tiles keys x queries: dS^T in place
    i_start = pid_s * split_len
    for i0 in range(i_start, tl.minimum(i_start + split_len, N), BLOCK_M):
        # Keys x queries, as the Triton tutorial's FlashAttention-2 backward: the tiles computed
        # here (P^T, dS^T) are the A operands of the key-side dots as they are, and only loaded
        # tiles are transposed (shared-memory views), none computed in registers.
        offs_m = i0 + tl.arange(0, BLOCK_M)
        m_ok = offs_m < N
        tile_ok = n_ok[:, None] & m_ok[None, :]
        row_h = (b * N + offs_m) * H + h  # (B, N, H) row index

        # The forward's base-2 logits, recomputed (distances directly, in fp32) or read.
        if not LOGITS:
            q = tl.load(Q + b * stride_qb + h * D + offs_m[:, None] * stride_qn
                        + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :],
                        other=0.0)  # (BM, D_PAD)
            if CAST_F32:
                q = q.to(tl.float32)
            q_hi, q_lo = tf32_parts(q, SPLIT)
            st = dot_parts(k_hi, k_lo, tl.trans(q_hi), tl.trans(q_lo),
                           tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32),
                           DOT_PRECISION) * q_scale
        dist = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for c in tl.static_range(P3):
            qc = tl.load(QP + (bh * P3 + c) * N + offs_m, mask=m_ok, other=0.0)
            kc = tl.load(KP + (bh * P3 + c) * N + offs_n, mask=n_ok, other=0.0)
            diff = kc[:, None] - qc[None, :]
            dist += diff * diff
        tile = bias_rows + offs_m[None, :].to(tl.int64) * N
        bias = tl.load(tile, mask=tile_ok, other=0.0).to(tl.float32)
        if LOGITS:
            st = bias
        else:
            st = st + bias * LOG2E + pw * dist
        row_max = tl.load(STATS + row_h * 3, mask=m_ok, other=0.0)
        log_sum = tl.load(STATS + row_h * 3 + 1, mask=m_ok, other=0.0)
        pt = tl.where(tile_ok, tl.exp2((st - row_max[None, :]) - log_sum[None, :]), 0.0)

        # dP and the values' gradients.
        dos = tl.load(DOS + row_h[:, None] * D + offs_d[None, :],
                      mask=m_ok[:, None] & d_ok[None, :], other=0.0)  # (BM, D_PAD)
        if CAST_F32:
            dos = dos.to(tl.float32)
        dop = tl.load(DOP + row_h[:, None] * VP3 + offs_e[None, :],
                      mask=m_ok[:, None] & e_ok[None, :], other=0.0)  # (BM, VP3_PAD)
        pt_hi, pt_lo = tf32_parts(pt, SPLIT)
        dos_hi, dos_lo = tf32_parts(dos, SPLIT)
        dop_hi, dop_lo = tf32_parts(dop, SPLIT)
        acc_dv = dot_parts(pt_hi.to(dos.dtype), pt_lo.to(dos.dtype), dos_hi, dos_lo, acc_dv,
                           DOT_PRECISION)
        acc_dvp = dot_parts(pt_hi, pt_lo, dop_hi, dop_lo, acc_dvp, PTS_PRECISION)
        dpt = dot_parts(v_hi, v_lo, tl.trans(dos_hi), tl.trans(dos_lo),
                        tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), DOT_PRECISION)
        # centred vp: dP - c.dO_p
        dpt = dot_parts(vp_hi, vp_lo, tl.trans(dop_hi), tl.trans(dop_lo), dpt, PTS_PRECISION)
        delta = tl.load(DELTA + row_h, mask=m_ok, other=0.0) - tl.sum(dop * centre_e[None, :], 1)
        if HAS_G:  # dS goes over G, the logits stay
            ds_tile = DS + bh * N * N + offs_n[:, None] + offs_m[None, :].to(tl.int64) * N
            dpt += tl.load(ds_tile, mask=tile_ok, other=0.0)
            dst = pt * (dpt - delta[None, :])  # d loss / d logit (natural units), transposed
            tl.store(ds_tile, dst, mask=tile_ok)
        else:  # dS goes over the bias
            dst = pt * (dpt - delta[None, :])
            tl.store(tile, dst.to(BIAS.dtype.element_ty), mask=tile_ok)

        dbar = tl.load(STATS + row_h * 3 + 2, mask=m_ok, other=0.0)
        acc_dpw += tl.sum(dst * (dist - dbar[None, :]), 1)

    # This range's partial sums, in slice pid_s of each output (B * H = programs along axis 1).
    rows = pid_s * tl.num_programs(1) * N  # key rows (b, h, j) before this slice
    DV, DVP, DPW = DV + rows * D, DVP + rows * VP3, DPW + rows
    key_h = (b * N + offs_n) * H + h
    tl.store(DV + key_h[:, None] * D + offs_d[None, :], acc_dv, mask=nd_ok)
    tl.store(DVP + (bh * N + offs_n[:, None]) * VP3 + offs_e[None, :], acc_dvp,
             mask=n_ok[:, None] & e_ok[None, :])
    tl.store(DPW + bh * N + offs_n, acc_dpw * LN2, mask=n_ok)


@triton.jit(do_not_specialize=["N", "N_KEY"])
def _ds_sums_kernel(
    OTHER,  # (B, N, H, D) view, strides (sb, sn, D, 1), input dtype: k (query side) or q
    OWN_P, OTHER_P,  # (B, H, 3*Qp, N) fp32: this side's points and the other side's
    DS,  # (B, H, N, N) input dtype: dS[b, h, query, key], from the key kernel
    PW,  # (H,) fp32
    OUT,  # (B, N, H, D) fp32: dq (query side) or dk
    OUT_P,  # (B, H, 3*Qp, N) fp32: dqp or dkp
    N,
    q_scale,
    stride_ob, stride_on,
    N_KEY,
    H: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    P3: tl.constexpr,
    P3_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PTS_PRECISION: tl.constexpr,
    CAST_F32: tl.constexpr,
    KEY_SIDE: tl.constexpr,  # rows are keys (dS read transposed) instead of queries
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The sums of dS along one side: a program owns BLOCK_M rows (queries, or keys with
    KEY_SIDE) of one (b, h) and walks the other side's blocks, BLOCK_N at a time:
    dq = dS k / sqrt(d), dqp = 2 w (qp rowsum(dS) - dS kp), and with KEY_SIDE the same sums
    of dS^T, dk = dS^T q / sqrt(d), dkp = 2 w (kp colsum(dS) - dS^T qp). No atomics and no
    recomputation; the point products run on coordinates centred on the program's first row
    point."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    bh = b * H + h
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    offs_p = tl.arange(0, P3_PAD)
    m_ok = offs_m < N
    d_ok = offs_d < D
    p_ok = offs_p < P3

    SPLIT: tl.constexpr = DOT_PRECISION == "tf32x3"  # fp32: every dot as 3xTF32 (`tf32.py`)
    centre = tl.load(OWN_P + (bh * P3 + offs_p % 3) * N + pid_m * BLOCK_M)  # (P3_PAD,)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    acc_p = tl.zeros([BLOCK_M, P3_PAD], dtype=tl.float32)  # sum dS (other points - centre)
    rowsum = tl.zeros([BLOCK_M], dtype=tl.float32)
    if KEY_SIDE:  # dS^T: a row is a column of dS
        ds_rows = DS + bh * N * N + offs_m[:, None]
    else:
        ds_rows = DS + bh * N * N + offs_m[:, None].to(tl.int64) * N
    for j0 in range(0, N, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        if KEY_SIDE:
            ds_tile = ds_rows + offs_n[None, :].to(tl.int64) * N
        else:
            ds_tile = ds_rows + offs_n[None, :]
        ds = tl.load(ds_tile, mask=m_ok[:, None] & n_ok[None, :], other=0.0)
        other = tl.load(OTHER + b * stride_ob + h * D + offs_n[:, None] * stride_on
                        + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        if CAST_F32:
            other = other.to(tl.float32)
        other_hi, other_lo = tf32_parts(other, SPLIT)
        other_p = tl.load(OTHER_P + (bh * P3 + offs_p[None, :]) * N + offs_n[:, None],
                          mask=n_ok[:, None] & p_ok[None, :], other=0.0)  # (BN, P3_PAD)
        other_p = tl.where(n_ok[:, None] & p_ok[None, :], other_p - centre[None, :], 0.0)
        acc, acc_p, rowsum = _add_ds_sums(ds.to(tl.float32), other_hi, other_lo, other_p, acc,
                                          acc_p, rowsum, SPLIT, DOT_PRECISION, PTS_PRECISION)

    pw = tl.load(PW + h)
    row_h = (b * N + offs_m) * H + h
    tl.store(OUT + row_h[:, None] * D + offs_d[None, :], acc * (q_scale * LN2),
             mask=m_ok[:, None] & d_ok[None, :])
    own_p = tl.load(OWN_P + (bh * P3 + offs_p[None, :]) * N + offs_m[:, None],
                    mask=m_ok[:, None] & p_ok[None, :], other=0.0)
    own_p = tl.where(m_ok[:, None] & p_ok[None, :], own_p - centre[None, :], 0.0)
    out_p = pw * (own_p * rowsum[:, None] - acc_p) * (2.0 * LN2)
    tl.store(OUT_P + (bh * P3 + offs_p[None, :]) * N + offs_m[:, None], out_p,
             mask=m_ok[:, None] & p_ok[None, :])


@triton.jit(do_not_specialize=["PAIRS", "PAIRS_KEY"])
def _pair_kernel(
    DS,  # (B, H, PAIRS) dS, the bias's dtype
    Z,  # (B, PAIRS, C) pair_repr
    W,  # (H, C) the pair-bias weight W_b
    DZ,  # (B, PAIRS, C) d pair_repr, written once
    DW,  # (B, programs, H_PAD, C_PAD) fp32 partial sums of dW_b, summed by PyTorch
    PAIRS,  # N * N
    PAIRS_KEY,  # autotune bucket, unused in the body
    H: tl.constexpr,
    H_PAD: tl.constexpr,
    C: tl.constexpr,
    C_PAD: tl.constexpr,
    PRECISION: tl.constexpr,
    CAST_F32: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """A program owns an equal run of whole BLOCK_P tiles of (i, j) pairs of one batch
    element (the last ones may own none and write a zero partial): per tile of
    BLOCK_P pairs it reads dS (H values a pair) and z once, writes d pair_repr = dS^T W_b and
    adds dS z to its own (H, C) partial dW_b (no atomics; one partial per program)."""
    pid, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    h = tl.arange(0, H_PAD)
    c = tl.arange(0, C_PAD)
    w = tl.load(W + h[:, None] * C + c[None, :], mask=(h[:, None] < H) & (c[None, :] < C),
                other=0.0)
    if CAST_F32:
        w = w.to(tl.float32)
    SPLIT: tl.constexpr = PRECISION == "tf32x3"  # fp32: both dots as 3xTF32 (`tf32.py`)
    w_hi, w_lo = tf32_parts(w, SPLIT)
    acc = tl.zeros((H_PAD, C_PAD), dtype=tl.float32)
    per_program = tl.cdiv(tl.cdiv(PAIRS, BLOCK_P), tl.num_programs(0)) * BLOCK_P
    start = pid * per_program
    for p0 in range(start, start + per_program, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        in_p = p < PAIRS
        ds = tl.load(DS + b * H * PAIRS + h[:, None] * PAIRS + p[None, :],
                     mask=(h[:, None] < H) & in_p[None, :], other=0.0)
        zc = (b * PAIRS + p[:, None]) * C + c[None, :]
        in_z = in_p[:, None] & (c[None, :] < C)
        z = tl.load(Z + zc, mask=in_z, other=0.0)
        if CAST_F32:
            ds, z = ds.to(tl.float32), z.to(tl.float32)
        ds_hi, ds_lo = tf32_parts(ds, SPLIT)  # split once for both dots
        dz = dot_parts(tl.trans(ds_hi), tl.trans(ds_lo), w_hi, w_lo,
                       tl.zeros((BLOCK_P, C_PAD), dtype=tl.float32), PRECISION)
        tl.store(DZ + zc, dz.to(DZ.dtype.element_ty), mask=in_z)
        z_hi, z_lo = tf32_parts(z, SPLIT)
        acc = dot_parts(ds_hi, ds_lo, z_hi, z_lo, acc, PRECISION)
    dw = DW + ((b * tl.num_programs(0) + pid) * H_PAD + h[:, None]) * C_PAD + c[None, :]
    tl.store(dw, acc)


_KEY = ["N_KEY", "H", "D_PAD", "P3_PAD", "DOT_PRECISION", "PTS_PRECISION"]
_KEY_KERNEL = [*_KEY, "LOGITS"]
_INTERPRETED = {"BLOCK_M": 16, "BLOCK_N": 16}

# The key kernel writes dS over its input (or over G): the autotuner restores both after every
# trial run.
# fp32: one stage. At N = 1024 on the H200 (BLOCK_M, BLOCK_N, warps) (32, 32, 4) took 1.05 ms
# in one stage, 5.70 in two and 1.78 in three; (64, 64, 8) and (32, 64, 4) 5.9-7.3 ms.
_key_fp32 = autotuned(
    "bias_backward_keys_fp32", _key_kernel,
    configs=block_configs([(16, 32, 4, 1), (16, 64, 4, 1), (32, 32, 4, 1), (32, 64, 8, 1),
                          (16, 128, 4, 1), (32, 128, 8, 1)]),
    key=_KEY_KERNEL, interpreted=_INTERPRETED, restore_value=["BIAS", "DS"],
)


# fp32 with every dot as 3xTF32 (`Modes.split_dots`): tensor-core tiles. The one-stage configs
# issue the fewest instructions per pair (sm_90 proxy, `gpu_diagnostics/attention_proxy.py
# 4096 keys_3xtf32`, at N = 4096: (32, 64, 4, 1) 4.54 with 56 spilled words, (16, 64, 4, 1)
# 4.87 with 16, two-stage ones 6.6-8.1). Every uncapped config takes 255 registers, two 4-warp
# programs per SM; capped at 168 (`maxnreg`) an SM holds three, for more spills ((16, 64, 4, 1)
# 76 words, 5.01 per pair), as the forward's attention kernel gained 4-6 % from.
_key_3xtf32 = autotuned(
    "bias_backward_keys_3xtf32", _key_kernel,
    configs=block_configs([(32, 32, 4, 1), (32, 64, 4, 1), (32, 64, 4, 2), (64, 64, 4, 2),
                          (64, 64, 8, 2), (64, 32, 4, 2), (32, 128, 8, 2), (16, 64, 4, 1),
                          (16, 128, 4, 1), (16, 64, 4, 1, 168), (32, 64, 4, 1, 168)]),
    key=_KEY_KERNEL, interpreted=_INTERPRETED, restore_value=["BIAS", "DS"],
)
# 16-bit: one stage as in fp32 issues 25-35 % fewer instructions per pair than two (proxy,
# `keys_16bit`: (16, 64, 2, 1) 3.5, (16, 128, 4, 1) 3.6, (32, 64, 4, 1) 4.2 against 6.7-8.6),
# and the same two register caps (168: (16, 64, 4, 1) 34 spilled words, 4.26 per pair).
_key_16bit = autotuned(
    "bias_backward_keys_16bit", _key_kernel,
    configs=block_configs([(16, 64, 4, 2), (32, 64, 4, 2), (64, 64, 4, 2), (64, 64, 8, 2),
                          (32, 128, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (32, 32, 4, 2),
                          (16, 64, 4, 1), (32, 64, 4, 1), (16, 128, 4, 1), (16, 64, 2, 1),
                          (16, 64, 4, 1, 168), (32, 64, 4, 1, 168)]),
    key=_KEY_KERNEL, interpreted=_INTERPRETED, restore_value=["BIAS", "DS"],
)
# The sums of dS read it only: trials are harmless. One autotuned form per side (the key
# side reads dS transposed).
_SUMS_CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
                 for m, n, w, s in [(64, 64, 4, 2), (64, 32, 4, 3), (128, 64, 8, 2),
                                    (32, 64, 4, 2)]]
_query = autotuned("bias_backward_queries", _ds_sums_kernel, configs=_SUMS_CONFIGS,
                   key=_KEY, interpreted=_INTERPRETED)
_key_sums = autotuned("bias_backward_key_sums", _ds_sums_kernel, configs=_SUMS_CONFIGS,
                      key=_KEY, interpreted=_INTERPRETED)

_pair = autotuned(
    "bias_backward_pairs", _pair_kernel,
    configs=[triton.Config({"BLOCK_P": p}, num_warps=w, num_stages=st)
             for p, w, st in [(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 3), (32, 4, 3),
                              (256, 8, 2)]],
    key=["PAIRS_KEY", "H_PAD", "C_PAD", "PRECISION"], interpreted={"BLOCK_P": 64},
)


def launch_bias_backward(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, pair_repr, pair_weight,
                         point_weight, out_s, out_p, stats, bias, modes: Modes,
                         split: int | None = None):
    """The two kernels and the pair GEMMs, unchecked (the custom op's operands; shapes in
    `core_op.triton_ipa_core_bias`). `bias` is overwritten with dS. `split`: query ranges per
    key block of the key kernel (None: `key_split`'s choice), whose partial sums are then
    added. Returns the gradients of q, k, v (their dtype), q_pts, k_pts, v_pts (fp32),
    pair_repr, pair_weight (their dtype) and point_weight (fp32)."""
    if q.shape[1] == 1:
        return single_key_gradients(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, pair_repr,
                                    pair_weight, point_weight)
    # D_i = sum_j P_ij dP_ij, per row and head: reads 2 * B*N*H*(D + 3Vp) elements.
    delta = (grad_s.float() * out_s.float()).sum(-1) + (grad_p * out_p).sum(-1)
    dq, dk, dv, dq_pts, dk_pts, dv_pts, d_point = attention_gradients(
        grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, point_weight, stats, bias, delta, modes,
        split=split)
    d_pair, d_weight = pair_gradients(bias, pair_repr, pair_weight)  # bias now holds dS
    return (dq, dk, dv, dq_pts, dk_pts, dv_pts, d_pair, d_weight.to(pair_weight.dtype),
            d_point)


def attention_gradients(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, point_weight, stats,
                        bias, delta, modes: Modes, *, split: int | None = None,
                        q_scale: float | None = None, ds: torch.Tensor | None = None):
    """The per-head kernels of the backward (the key kernel, then the sums of dS), unchecked:
    the gradients of q, k, v (their dtype), q_pts, k_pts, v_pts and point_weight (fp32); dS is
    left in `ds`. `delta` (B, N, H) fp32: D_i = sum_j P_ij dP_ij. `q_scale`: the forward's
    (default log2(e) / sqrt(D)). `ds` None: `bias` holds the pair bias and is overwritten with
    dS; else `bias` holds the forward's base-2 logits (problem openfold's `triton-bias`), kept,
    and `ds` (B, H, N, N) fp32 a term of dP per (row, key) (its pair values' do_pair . z),
    overwritten with dS."""
    b, n, h, d = q.shape
    p3, vp3 = q_pts.shape[2], v_pts.shape[3]
    dev, f32 = q.device, torch.float32
    grad_s, grad_p = grad_s.contiguous(), grad_p.contiguous()
    fp32 = q.dtype == torch.float32
    key_kernel = (_key_16bit if not fp32 else _key_3xtf32 if modes.split_dots else _key_fp32)
    split, split_len = split_range(n, key_split(b * h, n, dev) if split is None else split,
                                   largest_meta(key_kernel, "BLOCK_M"))
    dv = torch.empty(split, b, n, h, d, dtype=f32, device=dev)
    dv_pts = torch.empty(split, *v_pts.shape, dtype=f32, device=dev)
    d_point = torch.empty(split, b, h, n, dtype=f32, device=dev)
    # fp32 inputs run every dot fp32-accurate: as 3xTF32 in "ieee" mode (`modes.split_dots`),
    # as IEEE FMAs in tf32 mode (dS = P (dP - D) subtracts nearly equal numbers; tf32 gradients
    # miss their tolerance either way, docs/perf-notes.md). 16-bit inputs: the scalar dots on
    # tensor cores, the point products (fp32 operands, centred coordinates) in TF32, whose 1e-3
    # is well inside a bf16/fp16 gradient tolerance.
    dots = "tf32x3" if modes.split_dots else "ieee"
    shared = dict(H=h, D=d, D_PAD=pow2(d), P3=p3, P3_PAD=pow2(p3), DOT_PRECISION=dots,
                  PTS_PRECISION=dots if fp32 else "tf32", CAST_F32=cast_f32(q.dtype))
    q_scale = base2.LOG2E / math.sqrt(d) if q_scale is None else q_scale
    key_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), b * h, split)](
        # (without G a one-element stand-in for DS: the autotuner's restore copies each)
        q, k, v, q_pts, k_pts, v_pts, bias, bias.new_empty(1) if ds is None else ds,
        point_weight, grad_s, grad_p, stats, delta, dv, dv_pts, d_point, n, split_len, q_scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        pow2(n, 64), VP3=vp3, VP3_PAD=pow2(vp3), LOGITS=ds is not None, HAS_G=ds is not None,
        **shared,
    )
    ds = bias if ds is None else ds  # dS, written by the key kernel
    sides = [(k, q_pts, k_pts, False), (q, k_pts, q_pts, True)]  # queries' sums, then keys'
    if ds.dtype == torch.float32:
        (dq, dq_pts), (dk, dk_pts) = (
            gemm_ds_sums(ds, other, own_p, other_p, point_weight, q_scale, key_side)
            for other, own_p, other_p, key_side in sides)
    else:
        (dq, dq_pts), (dk, dk_pts) = (
            _triton_ds_sums(ds, other, own_p, other_p, point_weight, q_scale, key_side, shared)
            for other, own_p, other_p, key_side in sides)
    dv, dv_pts = (t[0] if t.shape[0] == 1 else t.sum(0) for t in (dv, dv_pts))
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dq_pts, dk_pts, dv_pts,
            d_point.sum((0, 1, 3)))


def _triton_ds_sums(ds, other, own_p, other_p, point_weight, q_scale, key_side, shared):
    """One side's sums of a 16-bit dS by `_ds_sums_kernel` (the key side reads dS transposed,
    which 16-bit dots take from shared memory as they are): (d other side's features (B, N, H,
    D) fp32, d own points (B, H, 3Qp, N) fp32)."""
    b, n, h, d = other.shape
    out = torch.empty(b, n, h, d, dtype=torch.float32, device=ds.device)
    out_p = torch.empty_like(own_p)
    sums = _key_sums if key_side else _query
    sums[lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), b * h)](
        other, own_p, other_p, ds, point_weight, out, out_p, n, q_scale, other.stride(0),
        other.stride(1), pow2(n, 64), KEY_SIDE=key_side, **shared,
    )
    return out, out_p


def gemm_ds_sums(ds: torch.Tensor, other: torch.Tensor, own_p: torch.Tensor,
                 other_p: torch.Tensor, point_weight: torch.Tensor, q_scale: float,
                 key_side: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One side's sums of an fp32 dS (B, H, N, N) as one batched IEEE fp32 GEMM (cuBLAS on the
    GPU): dS [other | other_p - c | 1] for the queries, dS^T [...] for the keys (`key_side`),
    giving d q = dS k / sqrt(d) (or d k), the points' 2 w (own_p rowsum - dS other_p) and the
    row sums in one read of dS. Triton's fp32 dots cannot take dS's transposed tile from shared
    memory (its key-side sums took 2.4 ms at N = 4096 on the H200) and its IEEE dots run on FMA
    loops; the cuBLAS SGEMM reads a transposed operand for free. The points are centred on
    their batch element's centroid c (the kernels centre on a block's first point: a tighter
    centre, but one per block): the cancellation this leaves in own_p rowsum - dS other_p costs
    ~7e-6 relative at N = 4096 and a 77 A radius, against gradient tolerances of 2e-5 and more.
    Returns (B, N, H, D) and (B, H, 3Qp, N), fp32."""
    b, h, n, _ = ds.shape
    d, p3 = other.shape[3], own_p.shape[2]
    centre = other_p.unflatten(2, (-1, 3)).mean((1, 2, 4)).repeat(1, p3 // 3)[:, None, :, None]
    operand = torch.cat([other.permute(0, 2, 1, 3).float(), (other_p - centre).transpose(2, 3),
                         ds.new_ones(b, h, n, 1)], 3).reshape(b * h, n, d + p3 + 1)
    ds = ds.reshape(b * h, n, n)
    with math_mode("fp32"):  # IEEE SGEMM whatever the caller's TF32 switch
        sums = torch.bmm(ds.transpose(1, 2) if key_side else ds, operand).view(b, h, n, -1)
    out = (sums[..., :d] * (q_scale * LN2_F)).transpose(1, 2).contiguous()
    out_p = point_weight.view(1, h, 1, 1) * (2.0 * LN2_F) * (
        (own_p - centre) * sums[..., -1].unsqueeze(2) - sums[..., d:d + p3].transpose(2, 3))
    return out, out_p.contiguous()


def key_split(programs_per_block: int, length: int, device: torch.device) -> int:
    """Query ranges for the key kernel: with 64-key blocks, about four programs per SM (one
    (key block, head) program per SM leaves most of its issue slots idle: at N = 1024 fp32, 192
    programs on 132 SMs), each range at least 256 queries long."""
    return split_for_sms(programs_per_block * triton.cdiv(length, 64), length, device,
                         per_sm=4)


def pair_gradients(ds: torch.Tensor, pair_repr: torch.Tensor, pair_weight: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair bias's backward in one pass over z: d pair_repr[b] = dS[b]^T W_b (the
    pair_repr's dtype) and dW_b = sum_b dS[b] z[b] (fp32), from dS (B, H, N, N). fp32 dots run
    as 3xTF32 (`tf32.dot_parts`; under the interpreter too), 16-bit ones on tensor cores with fp32
    accumulation."""
    b, h, n, _ = ds.shape
    c = pair_repr.shape[3]
    pairs = n * n
    programs = min(triton.cdiv(pairs, 64), 64 if INTERPRET else 4 * sm_count(ds.device))
    h_pad, c_pad = max(16, pow2(h)), max(16, pow2(c))
    pair_repr = pair_repr.contiguous()
    d_pair = torch.empty(pair_repr.shape, dtype=pair_repr.dtype, device=pair_repr.device)
    partial = torch.empty(b, programs, h_pad, c_pad, dtype=torch.float32, device=ds.device)
    fp32 = ds.dtype == torch.float32
    _pair[(programs, b)](  # every trial writes the same d_pair and partials: no restore
        ds, pair_repr, pair_weight.contiguous(), d_pair, partial, pairs, pow2(pairs, 4096),
        H=h, H_PAD=h_pad, C=c, C_PAD=c_pad,
        PRECISION="tf32x3" if fp32 else "ieee", CAST_F32=cast_f32(ds.dtype),
    )
    return d_pair, partial.sum((0, 1))[:h, :c].contiguous()

