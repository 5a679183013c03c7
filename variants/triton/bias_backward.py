"""The backward of the `triton` forward (the pair bias as a (B, H, N, N) tensor, then the streamed
attention kernel of `attention.py`): per-head kernels, GEMM sums and one pass over pair_repr.

Idea: FlashAttention-2's backward (Dao 2023, section 3.2), per (batch, head) as the forward,
with the logits read from the tensor the forward wrote rather than recomputed. In training the
bias tensor is fp32 and the forward's attention kernel overwrites it with the base-2 logits
(bias, q.k and point term; `variants/base2.py`) and saves each row's statistics: its max m and
log2 l of its softmax, so that P = 2^((s - m) - log2 l) is recomputed, never stored, and its
attention-weighted mean squared point distance dbar. With D_i = dO_i . O_i precomputed:

  key kernel (a program owns BLOCK_N keys of one (b, h) and walks the query blocks of one
  query range; at moderate N several ranges (`key_split`) fill the SMs, and their key-side
  partial sums are added after)
      P  = 2^((s - m) - log2 l);  dP = dO_s . v + dO_p . vp;  dS = P (dP - D)  (d / d logit)
      dv += P^T dO_s, dvp += P^T dO_p;
      dS is written over the logits tile it was computed from: every tile belongs to exactly
      one program, which reads it before it writes it, so the (B, H, N, N) buffer the forward
      saved becomes the logits' gradient and no second N x N x H tensor is allocated. Its
      tiles are keys x queries (S^T, P^T, dS^T, as the Triton tutorial's backward): the
      key-side dots take them as computed, and only loaded tiles are transposed. Reading the
      logits instead of recomputing them takes q, k, the q.k dot and the squared distances out
      of the kernel: on the sm_90 proxy (fp32, 32 x 64 tiles) 4.54 -> 2.42 instructions per
      pair and 56 -> 12 spilled words, for one more write of the buffer in the forward.
  point weight (`_point_weight_kernel`, a program per BLOCK_M rows of one (b, h)):
      d pw = ln 2 sum_ij dS_ij (|qp_i - kp_j|^2 - dbar_i), the distances recomputed directly
      in fp32, with w = pw ln 2 = -softplus(head_weights) / 2.
  sums of dS (`gemm_ds_sums`: one batched 3xTF32 GEMM per side, dS read once by rows for the
      queries and once by columns for the keys): dq = dS k / sqrt(d), dqp = 2 w (qp rowsum(dS)
      - dS kp), dk = dS^T q / sqrt(d), dkp = 2 w (kp colsum(dS) - dS^T qp). Keeping dk and
      dkp out of the key kernel is what lets it run: with their accumulators it spilled
      (proxy, 32 x 64 tiles: fp32 240 words) and took 5.9 ms at N = 4096 in fp32.
  pair kernel (a program owns a run of (i, j) pairs of one batch element) reads each dS and
      z tile once: d pair_repr = dS^T W_b written once (the only N x N x C tensor of the step)
      and dW_b = sum dS z into a partial sum per program (no atomic hot spot), summed by
      PyTorch. fp32 dots as 3xTF32: cuBLAS ran both products as SIMT sgemm (K = H = 12). One
      4-warp program per SM, so that the point weight and the sums of dS run beside it on a
      side stream (`PAIR_PROGRAMS_PER_SM`, `SUMS_BESIDE_PAIR_PASS`).

fp32 dots run as 3xTF32 from operands split once (`tf32.tf32_parts`, `dot_parts`): Triton's own
tf32x3 splits both operands of every dot again, in five instructions per element.

Two choices are for accuracy, found by emulating the backward in fp32 against float64 at
N = 1024 (docs/perf-notes.md): P from (s - m) - log2 l rather than s - LSE, whose rounding at
|LSE| scales each row's P and made the point-weight gradients 6-10x the reference's error; and
d pw summed over dist - dbar rather than dist: the two are equal because every row of dS sums to
zero, but any error that scales a row of dS is then multiplied by the spread of the distances
around their mean instead of by the distances themselves (hundreds of A^2). (The same sum from
the GEMMs' outputs, |qp|^2 rowsum + |kp|^2 colsum - 2 qp . dS kp, cancels at the global frame's
R^2: 8e-5 relative in an fp32 emulation at N = 4096, against 1e-6 direct.)

The key kernel's point products (dP's point half, dvp) run on coordinates centred on the
program's first key point c, and D's points' term is dO_p . (out_p - c), computed there from the
forward's out_p (D - dO_p . c, as before the twenty-fourth session, rounds at the coordinates'
size, and for the dominant key of a peaked row dP - D then kept that rounding: dS carried up to
1.6x the reference's error in an fp32 emulation, 0.6-0.65x this way,
`gpu_diagnostics/ds_emulation.py`). The products run as 3xTF32 for fp32 inputs and in TF32 for
16-bit ones. The sums centre the points on each batch element's centroid
(`gemm_ds_sums`).

The forward's buffer is mutated: the op declares it (`mutates_args`), and autograd's version
counter turns a second backward through the same graph (retain_graph) into PyTorch's in-place
error rather than a wrong gradient.

Problem openfold's `triton-bias` reuses the key kernel, the point weight and the sums
(`attention_gradients`) with the HAS_G path: a second (B, H, N, N) fp32 buffer brings the pair
values' term of dP and receives dS, and the logits stay (its pair values read them;
`variants/openfold/bias_backward.py`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from variants import base2
from variants.triton.attention import query_coordinates, squared_distances
from variants.triton.backward import single_key_gradients
from variants.triton.common import (
    INTERPRET,
    Modes,
    SideStream,
    aligned,
    autotuned,
    block_configs,
    cast_f32,
    cdiv,
    largest_meta,
    multiple_of_16,
    pow2,
    sm_count,
    split_for_sms,
    split_range,
    whole_blocks,
)
from variants.triton.sums import LN2_F, gemm_ds_sums, row_delta
from variants.triton.tf32 import dot_parts, tf32_parts

LOG2E = tl.constexpr(base2.LOG2E)
LN2 = tl.constexpr(LN2_F)


@triton.jit(do_not_specialize=["N", "split_len", "N_KEY"])
def _key_kernel(
    V,  # (B, N, H, D) view: strides (sb, sn, D, 1), input dtype
    KP,  # (B, H, 3*Qp, N) fp32 global-frame key points (a block's first is its centre)
    VP,  # (B, H, N, 3*Vp) fp32 global-frame value points
    LOGITS,  # (B, H, N, N) fp32: the forward's base-2 logits, bias (and mask) included; with
    # HAS_G they stay, else each tile is read, then overwritten with dS
    DS,  # with HAS_G, (B, H, N, N) fp32: G in, a term of dP per (row, key) besides the
    # values' (openfold's pair values, do_pair_i . z_ij), dS out (each tile read, then
    # written); else unused
    DOS,  # (B, N, H, D) contiguous, input dtype: d loss / d out_s
    DOP,  # (B, N, H, 3*Vp) fp32 contiguous: d loss / d out_p
    OP,  # (B, N, H, 3*Vp) fp32 contiguous: the forward's out_p
    STATS,  # (B, N, H, 3) fp32, the forward's: row max m, log2 l (and mean distance dbar)
    DELTA,  # (B, N, H) fp32: D_i less its points' term, dO_s . out_s (+ openfold's pairs')
    DV,  # (S, B, N, H, D) fp32: one partial sum per query range
    DVP,  # (S, B, H, N, 3*Vp) fp32
    N,
    split_len,  # queries per range (a multiple of every BLOCK_M)
    stride_vb, stride_vn,
    N_KEY,  # autotune bucket, unused in the body
    H: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    P3: tl.constexpr,
    VP3: tl.constexpr,
    VP3_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PTS_PRECISION: tl.constexpr,
    CAST_F32: tl.constexpr,
    HAS_G: tl.constexpr,
    ALIGNED: tl.constexpr,  # N and split_len multiples of 16 (`common.multiple_of_16`)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # aligned rows: 16-byte tile copies (sm_90 proxy, fp32 N = 4096, (32, 64, 4 warps):
    # 2.15 -> 1.27 instructions per pair, no spills)
    N = multiple_of_16(N, ALIGNED)
    split_len = multiple_of_16(split_len, ALIGNED)
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

    v = tl.load(V + b * stride_vb + h * D + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=nd_ok, other=0.0)
    if CAST_F32:
        v = v.to(tl.float32)
    SPLIT: tl.constexpr = DOT_PRECISION == "tf32x3"  # fp32: every dot as 3xTF32 (`tf32.py`)
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
    logit_rows = LOGITS + bh * N * N + offs_n[:, None]  # tiles keys x queries: dS^T in place
    i_start = pid_s * split_len
    for i0 in range(i_start, tl.minimum(i_start + split_len, N), BLOCK_M):
        # Keys x queries, as the Triton tutorial's FlashAttention-2 backward: the tiles computed
        # here (P^T, dS^T) are the A operands of the key-side dots as they are, and only loaded
        # tiles are transposed (shared-memory views), none computed in registers.
        offs_m = i0 + tl.arange(0, BLOCK_M)
        m_ok = offs_m < N
        tile_ok = n_ok[:, None] & m_ok[None, :]
        row_h = (b * N + offs_m) * H + h  # (B, N, H) row index
        tile = logit_rows + offs_m[None, :].to(tl.int64) * N
        st = tl.load(tile, mask=tile_ok, other=0.0)
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
        # D's points' term, centred alike: dO_p . (out_p - c), small where dP's is, so that
        # dP - D cancels between small numbers (D - dO_p . c rounded at the coordinates' size,
        # and dS carried up to 1.6x the reference's error: docs/perf-notes.md, twenty-fourth
        # session)
        op = tl.load(OP + row_h[:, None] * VP3 + offs_e[None, :],
                     mask=m_ok[:, None] & e_ok[None, :], other=0.0)
        delta = (tl.load(DELTA + row_h, mask=m_ok, other=0.0)
                 + tl.sum(dop * (op - centre_e[None, :]), 1))
        if HAS_G:  # dS goes over G, the logits stay
            tile = DS + bh * N * N + offs_n[:, None] + offs_m[None, :].to(tl.int64) * N
            dpt += tl.load(tile, mask=tile_ok, other=0.0)
        # d loss / d logit (natural units), transposed, over the tile it came from
        tl.store(tile, pt * (dpt - delta[None, :]), mask=tile_ok)

    # This range's partial sums, in slice pid_s of each output (B * H = programs along axis 1).
    rows = pid_s * tl.num_programs(1) * N  # key rows (b, h, j) before this slice
    DV, DVP = DV + rows * D, DVP + rows * VP3
    key_h = (b * N + offs_n) * H + h
    tl.store(DV + key_h[:, None] * D + offs_d[None, :], acc_dv, mask=nd_ok)
    tl.store(DVP + (bh * N + offs_n[:, None]) * VP3 + offs_e[None, :], acc_dvp,
             mask=n_ok[:, None] & e_ok[None, :])


@triton.jit(do_not_specialize=["N", "N_KEY"])
def _point_weight_kernel(
    DS,  # (B, H, N, N) fp32: dS[b, h, query, key]
    QP, KP,  # (B, H, 3*Qp, N) fp32 global-frame query / key points
    STATS,  # (B, N, H, 3) fp32, the forward's: third, each row's mean distance dbar
    OUT,  # (B, H, N) fp32: each row's sum_j dS_ij (|qp_i - kp_j|^2 - dbar_i)
    N,
    N_KEY,  # autotune bucket, unused in the body
    H: tl.constexpr,
    P3: tl.constexpr,
    ALIGNED: tl.constexpr,  # N a multiple of 16
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """d point_weight's sums, per query row: a program owns BLOCK_M rows of one (b, h) and
    walks the key blocks, recomputing the squared distances directly in fp32. dbar makes it a
    sum over the spread of the distances around the row's mean (equal, since a row of dS sums
    to zero, but an error that scales a row of dS then costs less)."""
    N = multiple_of_16(N, ALIGNED)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    bh = b * H + h
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < N
    dbar = tl.load(STATS + ((b * N + offs_m) * H + h) * 3 + 2, mask=m_ok, other=0.0)
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    ds_rows = DS + bh * N * N + offs_m[:, None].to(tl.int64) * N
    q_coords = query_coordinates(QP + bh * P3 * N, offs_m, m_ok, N, P3)
    for j0 in range(0, N, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        dist = squared_distances(q_coords, KP + bh * P3 * N, offs_n, n_ok, N, P3)
        ds = tl.load(ds_rows + offs_n[None, :], mask=m_ok[:, None] & n_ok[None, :], other=0.0)
        acc += tl.sum(ds * (dist - dbar[:, None]), 1)
    tl.store(OUT + bh * N + offs_m, acc, mask=m_ok)


@triton.jit(do_not_specialize=["PAIRS", "PAIRS_KEY"])
def _pair_kernel(
    DS,  # (B, H, PAIRS) dS, fp32
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
    EVEN: tl.constexpr,  # PAIRS a multiple of every BLOCK_P: no partial tile
    BLOCK_P: tl.constexpr,
):
    """A program owns an equal run of whole BLOCK_P tiles of (i, j) pairs of one batch
    element (the last ones may own none and write a zero partial): per tile of
    BLOCK_P pairs it reads dS (H values a pair) and z once, writes d pair_repr = dS^T W_b and
    adds dS z to its own (H, C) partial dW_b (no atomics; one partial per program)."""
    PAIRS = multiple_of_16(PAIRS, EVEN)  # aligned rows of dS (`common.multiple_of_16`)
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
    start = pid.to(tl.int64) * per_program  # int64: p0 * C passes 2^31 at N = 4096
    # Addresses: a base pointer per tile plus loop-invariant offsets within it (a tile is
    # BLOCK_P * C contiguous elements of z and d pair_repr, BLOCK_P of each head's row of dS);
    # masks only where a tile can be partial or padded. Per-element int64 addresses and masks
    # were a third of the loop (sm_90 proxy: 66 -> 47 instructions per pair in fp32).
    offs_p = tl.arange(0, BLOCK_P)
    z_tile = offs_p[:, None] * C + c[None, :]
    ds_tile = h[:, None] * PAIRS + offs_p[None, :]
    h_ok = h[:, None] < H
    c_ok = (offs_p[:, None] < BLOCK_P) & (c[None, :] < C)  # (BLOCK_P, C_PAD)
    UNMASKED: tl.constexpr = EVEN and C == C_PAD  # z and d pair_repr tiles need no mask
    z_rows, dz_rows, ds_rows = Z + b * PAIRS * C, DZ + b * PAIRS * C, DS + b * H * PAIRS
    for p0 in range(start, tl.minimum(start + per_program, PAIRS), BLOCK_P):
        if EVEN:  # every tile whole
            ds_ok, z_ok = h_ok, c_ok
        else:
            in_p = (p0 + offs_p) < PAIRS
            ds_ok, z_ok = h_ok & in_p[None, :], c_ok & in_p[:, None]
        ds = tl.load(ds_rows + p0 + ds_tile, mask=ds_ok, other=0.0)
        if UNMASKED:
            z = tl.load(z_rows + p0 * C + z_tile)
        else:
            z = tl.load(z_rows + p0 * C + z_tile, mask=z_ok, other=0.0)
        if CAST_F32:
            ds, z = ds.to(tl.float32), z.to(tl.float32)
        elif not SPLIT:  # 16-bit z: dS rounded to its dtype, for tensor-core dots
            ds = ds.to(Z.dtype.element_ty)
        ds_hi, ds_lo = tf32_parts(ds, SPLIT)  # split once for both dots
        dz = dot_parts(tl.trans(ds_hi), tl.trans(ds_lo), w_hi, w_lo,
                       tl.zeros((BLOCK_P, C_PAD), dtype=tl.float32), PRECISION)
        if UNMASKED:
            tl.store(dz_rows + p0 * C + z_tile, dz.to(DZ.dtype.element_ty))
        else:
            tl.store(dz_rows + p0 * C + z_tile, dz.to(DZ.dtype.element_ty), mask=z_ok)
        z_hi, z_lo = tf32_parts(z, SPLIT)
        acc = dot_parts(ds_hi, ds_lo, z_hi, z_lo, acc, PRECISION)
    dw = DW + ((b * tl.num_programs(0) + pid) * H_PAD + h[:, None]) * C_PAD + c[None, :]
    tl.store(dw, acc)


_KEY_KERNEL = ["N_KEY", "H", "D_PAD", "VP3_PAD", "DOT_PRECISION", "PTS_PRECISION", "HAS_G"]
_INTERPRETED = {"BLOCK_M": 16, "BLOCK_N": 16}

# The key kernel writes dS over its input (the logits, or G): the autotuner restores both after
# every trial run.
# fp32: one stage. At N = 1024 on the H200 (BLOCK_M, BLOCK_N, warps) (32, 32, 4) took 1.05 ms
# in one stage, 5.70 in two and 1.78 in three; (64, 64, 8) and (32, 64, 4) 5.9-7.3 ms.
_key_fp32 = autotuned(
    "bias_backward_keys_fp32", _key_kernel,
    configs=block_configs([(16, 32, 4, 1), (16, 64, 4, 1), (32, 32, 4, 1), (32, 64, 8, 1),
                           (16, 128, 4, 1), (32, 128, 8, 1)]),
    key=_KEY_KERNEL, interpreted=_INTERPRETED, restore_value=["LOGITS", "DS"],
)
# fp32 with every dot as 3xTF32 (`Modes.split_dots`): tensor-core tiles. On the sm_90 proxy
# (`gpu_diagnostics/attention_proxy.py 4096 keys_3xtf32`, instructions per pair, spilled words):
# (16, 128, 4, 1) 1.99, 16; (32, 64, 4, 1) 2.14, 4; (16, 64, 4, 1) 2.29 at 164 registers (three
# 4-warp programs per SM), none; two-stage tiles 2.9-3.1. Left out as dominated: (32, 32, 4, 1)
# 4.98, (64, 32, 4, 2) 4.00 and (64, 64, 4, 2) 3.13, with 44-148 spilled words.
_key_3xtf32 = autotuned(
    "bias_backward_keys_3xtf32", _key_kernel,
    configs=block_configs([(32, 64, 4, 1), (16, 64, 4, 1), (16, 128, 4, 1), (32, 64, 4, 2),
                           (32, 128, 8, 2)]),
    key=_KEY_KERNEL, interpreted=_INTERPRETED, restore_value=["LOGITS", "DS"],
)
# 16-bit: one stage as in fp32 (proxy, `keys_16bit`: (16, 128, 4, 1) 1.43, (32, 64, 4, 1) 1.55 at
# 228 registers, 1.67 capped at 168 (`maxnreg`: three programs per SM instead of two),
# (16, 64, 4, 1) 1.57 at 164, (16, 64, 2, 1) 1.57, none spilled; two stages 1.95-2.52). Left out
# as dominated: (64, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2) and
# (32, 32, 4, 2), 2.6-3.2 per pair, most of them spilling.
_key_16bit = autotuned(
    "bias_backward_keys_16bit", _key_kernel,
    configs=block_configs([(16, 128, 4, 1), (32, 64, 4, 1), (16, 64, 4, 1), (16, 64, 2, 1),
                           (32, 64, 4, 1, 168), (16, 64, 4, 2), (32, 64, 4, 2), (32, 128, 4, 2),
                           (64, 64, 8, 2)]),
    key=_KEY_KERNEL, interpreted=_INTERPRETED, restore_value=["LOGITS", "DS"],
)
# Reads dS only: trials are harmless. Spill-free on the proxy (1.4-1.6 instructions per pair;
# 64 x 64 tiles spill 600 words: the twelve coordinates' loads are hoisted).
_point_weight = autotuned(
    "bias_backward_point_weight", _point_weight_kernel,
    configs=block_configs([(32, 32, 4, 1), (64, 32, 8, 1), (32, 64, 8, 1), (16, 64, 4, 1),
                           (32, 32, 4, 2)]),
    key=["N_KEY", "H", "P3"], interpreted=_INTERPRETED,
)


_PAIR_KEY = ["PAIRS_KEY", "H_PAD", "C_PAD", "PRECISION"]
_pair = autotuned(
    "bias_backward_pairs", _pair_kernel,
    configs=block_configs([(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 3), (32, 4, 3),
                           (256, 8, 2)], names=("BLOCK_P",)),
    key=_PAIR_KEY, interpreted={"BLOCK_P": 64},
)
# The pair pass at one program per SM (`PAIR_PROGRAMS_PER_SM`): configs that hold at most half
# an SM's registers (4 warps at ~253 a thread, or 8 capped at 128), so that the sums of dS on the
# side stream can run beside it. fp32: 4-warp configs only (8 warps capped at 128 registers
# spill, 84-89 instructions per pair against 46 on the sm_90 proxy).
_pair_narrow = autotuned(
    "bias_backward_pairs_narrow", _pair_kernel,
    configs=block_configs([(64, 4, 2), (64, 4, 3), (32, 4, 3), (32, 4, 4), (128, 4, 2)],
                          names=("BLOCK_P",)),
    key=_PAIR_KEY, interpreted={"BLOCK_P": 64},
)
# Programs of the pair pass per SM. 4 is two waves of two resident 4-warp programs at ~253
# registers, which hold every SM's register file for the whole pass (Nsight Compute,
# 2026-12-05): the sums of dS wait for it. 1 (`_pair_narrow`) leaves half of each SM to them.
# H100, N = 4096, training step (docs/perf-notes.md, eighteenth session): the narrow pass alone
# is slower (fp32 16.10 -> 16.84 ms), beside the sums faster (15.49; bf16 9.83 -> 9.43).
PAIR_PROGRAMS_PER_SM = 1


def launch_bias_backward(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, pair_repr, pair_weight,
                         point_weight, out_s, out_p, stats, logits, modes: Modes,
                         split: int | None = None):
    """The kernels and GEMMs of the backward, unchecked (the custom op's operands; shapes in
    `core_op.triton_ipa_core_bias`). `logits` (B, H, N, N) fp32, the forward's, is overwritten
    with dS. `split`: query ranges per key block of the key kernel (None: `key_split`'s
    choice), whose partial sums are then added. Returns the gradients of q, k, v (their dtype),
    q_pts, k_pts, v_pts (fp32), pair_repr, pair_weight (their dtype) and point_weight (fp32)."""
    if q.shape[1] == 1:
        return single_key_gradients(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, pair_repr,
                                    pair_weight, point_weight)
    # D_i = sum_j P_ij dP_ij, per row and head, less its points' term (the key kernel's):
    # reads 2 * B*N*H*D elements. (grad_s made contiguous once: the key kernel reads it so too.)
    grad_s = grad_s.contiguous()
    delta = row_delta(grad_s, out_s)
    dq, dk, dv, dq_pts, dk_pts, dv_pts, d_point, (d_pair, d_weight) = attention_gradients(
        grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, point_weight, stats, logits, delta,
        out_p, modes, lambda ds: pair_gradients(ds, pair_repr, pair_weight), split=split)
    return (dq, dk, dv, dq_pts, dk_pts, dv_pts, d_pair, d_weight.to(pair_weight.dtype),
            d_point)


# The sums of dS (the point-weight kernel and the two GEMMs: latency- and compute-bound) run
# on a side stream beside the pair pass (memory-bound); all of them only read dS. The side
# stream must fork before the pair pass is queued: forked after it (the seventeenth session's
# form), it waited for the pass and the A/B measured nothing.
SUMS_BESIDE_PAIR_PASS = True


def attention_gradients(grad_s, grad_p, q, k, v, q_pts, k_pts, v_pts, point_weight, stats,
                        logits, delta, out_p, modes: Modes, pair_pass, *,
                        split: int | None = None,
                        q_scale: float | None = None, ds: torch.Tensor | None = None):
    """The per-head work of the backward (the key kernel, then the sums of dS), unchecked: the
    gradients of q, k, v (their dtype), q_pts, k_pts, v_pts and point_weight (fp32), and last
    `pair_pass(dS)`'s result: it is launched on the caller's stream right after the key kernel,
    and the sums run beside it (`SUMS_BESIDE_PAIR_PASS`). `logits` (B, H, N, N) fp32: the
    forward's base-2 logits. `delta` (B, N, H) fp32: D_i = sum_j P_ij dP_ij less the points'
    term dO_p . out_p, which the key kernel adds centred; out_p (B, N, H, 3 Vp) fp32, the
    forward's. `q_scale`: the
    forward's q.k factor (default log2(e) / sqrt(D)). `ds` None: dS overwrites `logits`; else
    (B, H, N, N) fp32, a term of dP per (row, key) (problem openfold's pair values,
    do_pair . z), overwritten with dS, and the logits stay."""
    b, n, h, d = q.shape
    p3, vp3 = q_pts.shape[2], v_pts.shape[3]
    dev, f32 = q.device, torch.float32
    grad_s, grad_p, out_p = grad_s.contiguous(), grad_p.contiguous(), out_p.contiguous()
    fp32 = q.dtype == torch.float32
    key_kernel = (_key_16bit if not fp32 else _key_3xtf32 if modes.split_dots else _key_fp32)
    split, split_len = split_range(n, key_split(b * h, n, dev) if split is None else split,
                                   largest_meta(key_kernel, "BLOCK_M"))
    dv = torch.empty(split, b, n, h, d, dtype=f32, device=dev)
    dv_pts = torch.empty(split, *v_pts.shape, dtype=f32, device=dev)
    # fp32 inputs run every dot fp32-accurate: as 3xTF32 in "ieee" mode (`modes.split_dots`),
    # as IEEE FMAs in tf32 mode (dS = P (dP - D) subtracts nearly equal numbers; tf32 gradients
    # miss their tolerance either way, docs/perf-notes.md). 16-bit inputs: the scalar dots on
    # tensor cores, the point products (fp32 operands, centred coordinates) in TF32, whose 1e-3
    # is well inside a bf16/fp16 gradient tolerance.
    dots = "tf32x3" if modes.split_dots else "ieee"
    key_kernel[lambda meta: (cdiv(n, meta["BLOCK_N"]), b * h, split)](
        # (without G a one-element stand-in for DS: the autotuner's restore copies each)
        v, k_pts, v_pts, logits, logits.new_empty(1) if ds is None else ds, grad_s, grad_p,
        out_p, stats, delta, dv, dv_pts, n, split_len, v.stride(0), v.stride(1), pow2(n, 64),
        H=h, D=d, D_PAD=pow2(d), P3=p3, VP3=vp3, VP3_PAD=pow2(vp3), DOT_PRECISION=dots,
        PTS_PRECISION=dots if fp32 else "tf32", CAST_F32=cast_f32(q.dtype),
        HAS_G=ds is not None, ALIGNED=aligned(n, split_len),
    )
    ds = logits if ds is None else ds  # dS, written by the key kernel
    side = SideStream(dev, SUMS_BESIDE_PAIR_PASS)  # after the key kernel, before the pair pass
    pair_grads = pair_pass(ds)
    q_scale = base2.LOG2E / math.sqrt(d) if q_scale is None else q_scale
    with side:
        d_point = torch.empty(b, h, n, dtype=f32, device=dev)
        _point_weight[lambda meta: (cdiv(n, meta["BLOCK_M"]), b * h)](
            ds, q_pts, k_pts, stats, d_point, n, pow2(n, 64), H=h, P3=p3, ALIGNED=aligned(n))
        dq, dk, dq_pts, dk_pts = gemm_ds_sums(ds, q, k, q_pts, k_pts, point_weight, q_scale)
        d_point = d_point.sum((0, 2)) * LN2_F
    side.join(dq, dk, dq_pts, dk_pts, d_point)
    dv, dv_pts = (t[0] if t.shape[0] == 1 else t.sum(0) for t in (dv, dv_pts))
    return dq, dk, dv.to(v.dtype), dq_pts, dk_pts, dv_pts, d_point, pair_grads


def key_split(programs_per_block: int, length: int, device: torch.device) -> int:
    """Query ranges for the key kernel: with 64-key blocks, about four programs per SM (one
    (key block, head) program per SM leaves most of its issue slots idle: at N = 1024 fp32, 192
    programs on 132 SMs), each range at least 256 queries long."""
    return split_for_sms(programs_per_block * cdiv(length, 64), length, device,
                         per_sm=4)


def pair_gradients(ds: torch.Tensor, pair_repr: torch.Tensor, pair_weight: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair bias's backward in one pass over z: d pair_repr[b] = dS[b]^T W_b (the
    pair_repr's dtype) and dW_b = sum_b dS[b] z[b] (fp32), from dS (B, H, N, N) fp32. For fp32
    z the dots run as 3xTF32 (`tf32.dot_parts`; under the interpreter too); for 16-bit z, dS
    rounded to its dtype, on tensor cores with fp32 accumulation."""
    b, h, n, _ = ds.shape
    c = pair_repr.shape[3]
    pairs = n * n
    per_sm = PAIR_PROGRAMS_PER_SM
    programs = min(cdiv(pairs, 64), 64 if INTERPRET else per_sm * sm_count(ds.device))
    fp32 = pair_repr.dtype == torch.float32
    kernel = _pair if per_sm != 1 else _pair_narrow
    h_pad, c_pad = max(16, pow2(h)), max(16, pow2(c))
    pair_repr = pair_repr.contiguous()
    d_pair = torch.empty(pair_repr.shape, dtype=pair_repr.dtype, device=pair_repr.device)
    partial = torch.empty(b, programs, h_pad, c_pad, dtype=torch.float32, device=ds.device)
    kernel[(programs, b)](  # every trial writes the same d_pair and partials: no restore
        ds, pair_repr, pair_weight.contiguous(), d_pair, partial, pairs, pow2(pairs, 4096),
        H=h, H_PAD=h_pad, C=c, C_PAD=c_pad,
        PRECISION="tf32x3" if fp32 else "ieee", CAST_F32=cast_f32(pair_repr.dtype),
        EVEN=whole_blocks(pairs, kernel, "BLOCK_P"),
    )
    return d_pair, partial.sum((0, 1))[:h, :c].contiguous()

