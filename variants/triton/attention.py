"""The `triton` variant's attention kernel: flash-style, one program per (query block, batch,
head), streaming that head's rows of the (B, H, N, N) pair bias written by `pair_bias.py`.

Idea: FlashAttention-2 (Dao 2023) as in the Triton fused-attention tutorial. A program owns
BLOCK_M queries of one head, loops over key blocks, keeps a running max and sum in fp32 (online
softmax in base 2: log2(e) is folded into the q scale and the point weight, `variants/base2.py`,
and applied to the bias here) and accumulates the scalar values and the global-frame value
points; the (B, H, N, N) logits and attention are never written. Per key block it reads
BLOCK_M * BLOCK_N bias elements, BLOCK_N rows of k, v, key and value points. With `split` > 1
the keys are cut into that many ranges, a program each, whose normalised outputs and
log-sum-exps are merged after (flash-decoding): more programs where N / BLOCK_M x B x H is
short of the SMs. Forward only (the training forward saves one set of row statistics).

Point distances: fp32 (IEEE) computes them directly, sum_{p,c} (q - k)^2; the other modes
(tf32, bf16, fp16) use one 3xTF32 dot of coordinates centred on the query block's first frame
origin, |q'|^2 + |k'|^2 - 2 q'.k', never the uncentred expansion (SPEC: it cancels
catastrophically at 100 A offsets). Value points are summed relative to the same origin (keys
that carry weight lie near the queries, so the summands are small). With `Modes.split_bf16`
(16-bit inputs; `triton_ipa`'s default, `half_points="3xbf16"`) that cross term and the
value-point sum run as three bf16 dots of split operands (`tf32.py`, 16 significant bits)
instead of 3xTF32 and TF32: every dot of the score tile then shares the bf16 tensor-core layout,
where the TF32 dots' own layout costs two conversions of the 64 x 32 fp32 tile through shared
memory per key block (the TTGIR of triton 3.6 for sm_90; Nsight Compute, ninth session:
L1/shared 82 % busy).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from variants import base2
from variants.triton.common import (
    TUNED,
    Modes,
    aligned,
    autotuned,
    block_configs,
    cast_f32,
    cdiv,
    check_attention_args,
    check_runnable,
    check_tensor,
    dot_modes,
    largest_meta,
    multiple_of_16,
    pow2,
    sm_count,
    split_for_sms,
    split_range,
)
from variants.triton.merge import KeyRanges, merge_key_ranges
from variants.triton.tf32 import bf16_split, dot_split_bf16, dot_split_tf32, tf32_hi

LOG2E = tl.constexpr(base2.LOG2E)  # the bias's factor to base-2 units, inside the kernel


@triton.jit
def query_coordinates(qp_base, offs_m, m_ok, N, P3: tl.constexpr):
    """One head's 3 Qp query coordinates of the rows offs_m from its (3 Qp, N) points at
    qp_base: a tuple of (BLOCK_M,) fp32, loaded once before a key loop. (Loaded inside the
    loop, they are hoisted by the compiler only while the loop stores nothing: a loop that
    writes the logits reloaded all of them every key block, through shared memory.)"""
    coords = ()
    for c in tl.static_range(P3):
        coords = coords + (tl.load(qp_base + c * N + offs_m, mask=m_ok, other=0.0),)
    return coords


@triton.jit
def squared_distances(q_coords, kp_base, offs_n, n_ok, N, P3: tl.constexpr):
    """(BLOCK_M, BLOCK_N) fp32 sum over the 3 Qp coordinates of (q - k)^2, computed directly,
    from `query_coordinates` and one head's (3 Qp, N) key points at kp_base."""
    kc = tl.load(kp_base + offs_n, mask=n_ok, other=0.0)
    diff = q_coords[0][:, None] - kc[None, :]
    dist = diff * diff
    for c in tl.static_range(1, P3):
        kc = tl.load(kp_base + c * N + offs_n, mask=n_ok, other=0.0)
        diff = q_coords[c][:, None] - kc[None, :]
        dist += diff * diff
    return dist


@triton.jit
def query_operands(Q, QP, TC, b, h, i0, offs_m, m_ok, N, stride_qb, stride_qn, H: tl.constexpr,
                   D: tl.constexpr, D_PAD: tl.constexpr, P3: tl.constexpr,
                   P3_PAD: tl.constexpr, POINTS_DOT: tl.constexpr, SPLIT_DOTS: tl.constexpr,
                   SPLIT_BF16: tl.constexpr, CAST_F32: tl.constexpr, VP3_PAD: tl.constexpr):
    """One head's query side, loaded once before its key loop (loaded inside a loop that
    stores, they are reloaded every key block): (q, q_hi, q_lo, points, centre) for the rows
    offs_m of head h of batch element b (block start i0). q_hi, q_lo: with SPLIT_DOTS q's TF32
    parts, else q. points: with POINTS_DOT (q', |q'|^2, q' hi, q' lo, the origin per
    coordinate) of the coordinates centred on the block's first frame origin (hi, lo:
    `bf16_split` parts with SPLIT_BF16, else q'), else `query_coordinates`. centre: that origin
    per value-point coordinate, (VP3_PAD,)."""
    offs_d = tl.arange(0, D_PAD)
    q = tl.load(
        Q + b * stride_qb + h * D + offs_m[:, None] * stride_qn + offs_d[None, :],
        mask=m_ok[:, None] & (offs_d < D)[None, :], other=0.0,
    )
    if CAST_F32:
        q = q.to(tl.float32)
    q_hi = q
    q_lo = q
    if SPLIT_DOTS:
        q_hi = tf32_hi(q)
        q_lo = q - q_hi
    qp_base = QP + (b * H + h) * P3 * N
    if POINTS_DOT:
        # Points relative to this block's first frame origin, so that the expanded
        # |q'|^2 + |k'|^2 - 2 q'.k' (one 3xTF32 dot) does not cancel at 100 A offsets.
        offs_c = tl.arange(0, P3_PAD)
        c_ok = offs_c < P3
        centre_c = tl.load(TC + (b * N + i0) * 3 + offs_c % 3)
        q_pts = tl.load(
            qp_base + offs_c[None, :] * N + offs_m[:, None],
            mask=m_ok[:, None] & c_ok[None, :], other=0.0,
        )
        q_pts = tl.where(c_ok[None, :], q_pts - centre_c[None, :], 0.0)
        qp_hi = q_pts
        qp_lo = q_pts
        if SPLIT_BF16:
            qp_hi, qp_lo = bf16_split(q_pts, CAST_F32)
        points = (q_pts, tl.sum(q_pts * q_pts, 1), qp_hi, qp_lo, centre_c)
    else:
        points = query_coordinates(qp_base, offs_m, m_ok, N, P3)
    centre = tl.load(TC + (b * N + i0) * 3 + tl.arange(0, VP3_PAD) % 3)
    return q, q_hi, q_lo, points, centre


@triton.jit
def initial_state(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
                  VP3_PAD: tl.constexpr):
    """One head's online-softmax state before its first key block: (running max m, the
    softmax denominators summed per element and reduced over keys after the loop (a per-block
    row sum made triton 3.6 carry l and m in a second layout, computing the exponentials twice:
    sm_90 TTGIR), sum p v, sum p v_pts, sum p dist (for STORE_STATS))."""
    return (tl.full([BLOCK_M], float("-inf"), dtype=tl.float32),
            tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32),
            tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32),
            tl.zeros([BLOCK_M, VP3_PAD], dtype=tl.float32),
            tl.zeros([BLOCK_M], dtype=tl.float32))


@triton.jit
def key_terms(j0, query, K, KP, b, h, N, q_scale, stride_kb, stride_kn, H: tl.constexpr,
              D: tl.constexpr, D_PAD: tl.constexpr, P3: tl.constexpr, P3_PAD: tl.constexpr,
              DOT_PRECISION: tl.constexpr, POINTS_DOT: tl.constexpr, SPLIT_DOTS: tl.constexpr,
              SPLIT_BF16: tl.constexpr, CAST_F32: tl.constexpr, BLOCK_N: tl.constexpr):
    """One head's key block [j0, j0 + BLOCK_N), `query` from `query_operands`: (q.k in log2
    units, the squared point distances), each (BLOCK_M, BLOCK_N) fp32. The logits are
    q.k + bias + point_weight * dist (the caller adds the bias: its loads and, in a kernel that
    writes the logits, the store stay in the caller's order)."""
    q, q_hi, q_lo, points, centre = query
    offs_n = j0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    n_ok = offs_n < N
    kp_base = KP + (b * H + h) * P3 * N
    # scalar term: q . k / sqrt(d), in log2 units
    kt = tl.load(
        K + b * stride_kb + h * D + offs_n[None, :] * stride_kn + offs_d[:, None],
        mask=(offs_d < D)[:, None] & n_ok[None, :], other=0.0,
    )
    if CAST_F32:
        kt = kt.to(tl.float32)
    if SPLIT_DOTS:
        kt_hi = tf32_hi(kt)
        s = dot_split_tf32(q_hi, q_lo, kt_hi, kt - kt_hi,
                           tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32)) * q_scale
    else:
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * q_scale
    if POINTS_DOT:
        q_pts, q_norm, qp_hi, qp_lo, centre_c = points
        offs_c = tl.arange(0, P3_PAD)
        c_ok = offs_c < P3
        k_pts = tl.load(
            kp_base + offs_c[:, None] * N + offs_n[None, :],
            mask=c_ok[:, None] & n_ok[None, :], other=0.0,
        )
        k_pts = tl.where(c_ok[:, None], k_pts - centre_c[:, None], 0.0)
        if SPLIT_BF16:
            kp_hi, kp_lo = bf16_split(k_pts, CAST_F32)
            cross = dot_split_bf16(qp_hi, qp_lo, kp_hi, kp_lo,
                                   tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32))
        else:
            cross = tl.dot(q_pts, k_pts, input_precision="tf32x3")
        dist = q_norm[:, None] + tl.sum(k_pts * k_pts, 0)[None, :] - 2.0 * cross
        dist = tl.maximum(dist, 0.0)
    else:
        # squared distances computed directly (IEEE fp32 mode)
        dist = squared_distances(points, kp_base, offs_n, n_ok, N, P3)
    return s, dist


@triton.jit
def softmax_update(s, dist, j0, state, query, V, VP, b, h, N, stride_vb, stride_vn,
                   H: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, VP3: tl.constexpr,
                   VP3_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   PTS_PRECISION: tl.constexpr, SPLIT_DOTS: tl.constexpr,
                   SPLIT_BF16: tl.constexpr, CAST_F32: tl.constexpr,
                   STORE_STATS: tl.constexpr, BLOCK_N: tl.constexpr):
    """The online softmax's update of one head's `state` (`initial_state`) with the base-2
    logits s of its key block [j0, j0 + BLOCK_N) (-inf past N) and their distances: the new
    state, after rescaling and adding p v and p v_pts."""
    m_i, l_acc, acc_s, acc_p, acc_d = state
    centre = query[4]
    offs_n = j0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    offs_e = tl.arange(0, VP3_PAD)
    n_ok = offs_n < N
    # online softmax (fp32)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_acc = l_acc * alpha[:, None] + p
    if STORE_STATS:
        acc_d = acc_d * alpha + tl.sum(p * dist, 1)
    v = tl.load(
        V + b * stride_vb + h * D + offs_n[:, None] * stride_vn + offs_d[None, :],
        mask=n_ok[:, None] & (offs_d < D)[None, :], other=0.0,
    )
    # Value points are summed relative to this block's first frame origin (small summands).
    vp = tl.load(
        VP + (b * H + h) * N * VP3 + offs_n[:, None] * VP3 + offs_e[None, :],
        mask=n_ok[:, None] & (offs_e < VP3)[None, :], other=0.0,
    )
    vp = tl.where(n_ok[:, None], vp - centre[None, :], 0.0)
    if SPLIT_DOTS:
        p_hi = tf32_hi(p)
        p_lo = p - p_hi
        v_hi, vp_hi = tf32_hi(v), tf32_hi(vp)
        acc_s = dot_split_tf32(p_hi, p_lo, v_hi, v - v_hi, acc_s * alpha[:, None])
        acc_p = dot_split_tf32(p_hi, p_lo, vp_hi, vp - vp_hi, acc_p * alpha[:, None])
    else:
        if CAST_F32:
            pv = tl.dot(p, v.to(tl.float32), input_precision=DOT_PRECISION)
        else:
            pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc_s = acc_s * alpha[:, None] + pv
        if SPLIT_BF16:
            p_hi, p_lo = bf16_split(p, CAST_F32)
            vp_hi, vp_lo = bf16_split(vp, CAST_F32)
            acc_p = dot_split_bf16(p_hi, p_lo, vp_hi, vp_lo, acc_p * alpha[:, None])
        else:
            acc_p = acc_p * alpha[:, None] + tl.dot(p, vp, input_precision=PTS_PRECISION)
    return m_new, l_acc, acc_s, acc_p, acc_d


@triton.jit
def normalised(state, query):
    """A head's outputs after its last key block: (sum_j a_ij v_j, sum_j a_ij v_pts_j in the
    global (centred) frame, l_i = sum_j 2^(s_ij - m_i))."""
    m_i, l_acc, acc_s, acc_p, acc_d = state
    centre = query[4]
    l_i = tl.sum(l_acc, 1)
    return acc_s / l_i[:, None], acc_p / l_i[:, None] + centre[None, :], l_i


@triton.jit(do_not_specialize=["N", "split_len", "N_KEY"])
def _attention_kernel(
    Q, K, V,  # (B, N, H, D) views: strides (sb, sn, D, 1), input dtype
    QP, KP,  # (B, H, 3*Qp, N) fp32 global-frame query / key points
    VP,  # (B, H, N, 3*Vp) fp32 global-frame value points
    TC,  # (B, N, 3) fp32 centred translations
    BIAS,  # (B, H, N, N) pair bias, input dtype or fp32 (natural units); WRITE_LOGITS: fp32,
    # overwritten with the base-2 logits (bias included)
    PW,  # (H,) fp32 point weight: -softplus(head_weights) / 2 * log2(e) (negative)
    OS,  # (S, B, N, H, D): strides (ss, sb, sn, D, 1), input dtype (S = 1) or fp32
    OP,  # (S, B, N, H, 3*Vp) fp32 aggregated global-frame value points
    STATS,  # (B, N, H, 3) fp32, when STORE_STATS: each row's max m and log2-sum log2(l) of
    # its base-2 logits, and its attention-weighted mean squared point distance; with
    # WRITE_LSE, (S, B, N, H) fp32: each row's log2-sum-exp2 over its key range
    N,
    split_len,  # keys per range (a multiple of every BLOCK_N); range pid_s of S
    q_scale,  # log2(e) / sqrt(D)
    stride_qb, stride_qn, stride_kb, stride_kn,
    stride_vb, stride_vn, stride_os, stride_ob, stride_on,
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
    POINTS_DOT: tl.constexpr,
    SPLIT_DOTS: tl.constexpr,  # fp32: q.k, p.v and p.v_pts as 3xTF32 (`tf32.py`), not IEEE
    SPLIT_BF16: tl.constexpr,  # 16-bit: the points' cross term and p.v_pts as 3xBF16, not TF32
    CAST_F32: tl.constexpr,
    STORE_STATS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    WRITE_LOGITS: tl.constexpr,
    ALIGNED: tl.constexpr,  # N and split_len multiples of 16 (`common.multiple_of_16`)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # aligned rows and key masks constant over 16 keys: 8- and 16-byte tile copies (sm_90
    # proxy, N = 4096: fp32 2.62 -> 2.25 instructions per pair, the training form 2.72 -> 2.32
    # and no spills, bf16 1.34 -> 1.22)
    N = multiple_of_16(N, ALIGNED)
    split_len = multiple_of_16(split_len, ALIGNED)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2).to(tl.int64)  # key range
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    bh = b * H + h
    i0 = pid_m * BLOCK_M
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    offs_e = tl.arange(0, VP3_PAD)
    m_ok = offs_m < N
    d_ok = offs_d < D
    e_ok = offs_e < VP3

    query = query_operands(Q, QP, TC, b, h, i0, offs_m, m_ok, N, stride_qb, stride_qn, H, D,
                           D_PAD, P3, P3_PAD, POINTS_DOT, SPLIT_DOTS, SPLIT_BF16, CAST_F32,
                           VP3_PAD)
    pw = tl.load(PW + h)
    # Query rows past N read row N - 1 of the bias (computed, never stored), so that its loads
    # need only the key mask, whose -inf fill masks the logits of keys past N.
    bias_rows = BIAS + bh * N * N + tl.minimum(offs_m, N - 1)[:, None].to(tl.int64) * N
    state = initial_state(BLOCK_M, BLOCK_N, D_PAD, VP3_PAD)
    j_start = pid_s * split_len
    for j0 in range(j_start, tl.minimum(j_start + split_len, N), BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        s, dist = key_terms(j0, query, K, KP, b, h, N, q_scale, stride_kb, stride_kn, H, D,
                            D_PAD, P3, P3_PAD, DOT_PRECISION, POINTS_DOT, SPLIT_DOTS,
                            SPLIT_BF16, CAST_F32, BLOCK_N)
        bias = tl.load(bias_rows + offs_n[None, :], mask=n_ok[None, :], other=float("-inf"))
        s = s + bias.to(tl.float32) * LOG2E + pw * dist  # -inf past N
        if WRITE_LOGITS:  # each (row, key) belongs to this program alone: read, then written
            tl.store(bias_rows + offs_n[None, :], s, mask=m_ok[:, None] & n_ok[None, :])
        state = softmax_update(s, dist, j0, state, query, V, VP, b, h, N, stride_vb, stride_vn,
                               H, D, D_PAD, VP3, VP3_PAD, DOT_PRECISION, PTS_PRECISION,
                               SPLIT_DOTS, SPLIT_BF16, CAST_F32, STORE_STATS, BLOCK_N)

    out_s, out_p, l_i = normalised(state, query)
    m_i = state[0]
    rows = pid_s * tl.num_programs(1) * N  # the (b, i, h) rows of the ranges before this one
    tl.store(
        OS + pid_s * stride_os + b * stride_ob + h * D + offs_m[:, None] * stride_on
        + offs_d[None, :],
        out_s.to(OS.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :],
    )
    tl.store(
        OP + rows * VP3 + ((b * N + offs_m[:, None]) * H + h) * VP3 + offs_e[None, :],
        out_p, mask=m_ok[:, None] & e_ok[None, :],
    )
    if WRITE_LSE:  # this range's log2-sum-exp2, for the merge
        tl.store(STATS + rows + (b * N + offs_m) * H + h, m_i + tl.log2(l_i), mask=m_ok)
    if STORE_STATS:  # saved for the backward (`bias_backward.py`)
        stats = STATS + ((b * N + offs_m) * H + h) * 3
        tl.store(stats, m_i, mask=m_ok)
        tl.store(stats + 1, tl.log2(l_i), mask=m_ok)
        tl.store(stats + 2, state[4] / l_i, mask=m_ok)


# Config lists from compiling for sm_90 and reading register/stack use (cuobjdump): only
# configs without large spills. fp32 IEEE dots run on CUDA cores (FMA), whose Triton lowering
# holds whole operand slices in registers, hence the smaller tiles.
_ATTENTION_KEY = ["N_KEY", "H", "D_PAD", "P3", "VP3_PAD", "DOT_PRECISION", "PTS_PRECISION",
                  "POINTS_DOT", "SPLIT_BF16"]
_INTERPRETED = {"BLOCK_M": 64, "BLOCK_N": 64}


def _tuned(name: str, blocks: list[tuple[int, ...]]):
    """The kernel autotuned over (BLOCK_M, BLOCK_N, warps, stages[, register cap]) `blocks`,
    and its twin that writes the logits over its bias (`_LOGITS_TWIN`)."""
    configs = block_configs(blocks)
    tuned = autotuned(name, _attention_kernel, key=_ATTENTION_KEY, interpreted=_INTERPRETED,
                      configs=configs)
    # The autotuner's trial runs would read each other's logits as the bias: it restores it.
    _LOGITS_TWIN[name] = autotuned(f"{name}_logits", _attention_kernel, key=_ATTENTION_KEY,
                                   interpreted=_INTERPRETED, configs=configs,
                                   restore_value=["BIAS"])
    return tuned


_LOGITS_TWIN: dict = {}  # form name -> the same form autotuned with WRITE_LOGITS


# Register caps (`maxnreg`): uncapped, the 16-bit and 3xTF32 forms take 200-255 registers, so an
# SM holds two 4-warp programs (8 warps) and the kernel is latency-bound (Nsight Compute, ninth
# session: 30-34 % of issue slots busy). Capped at 168 an SM holds three (12 warps), at 128 four,
# for some spilled words and more instructions per pair (`gpu_diagnostics/attention_proxy.py`
# prints both). Measured on the H200 (ninth session): the 168 cap won by 4-6 % at N = 4096 in
# both forms and at N = 1024 in bf16; the 128 caps lost everywhere.


# fp32 IEEE: distances computed directly
_attention_direct = _tuned("attention_direct", [(64, 16, 8, 2), (32, 16, 8, 2), (32, 16, 4, 2),
                                                (32, 32, 8, 2), (16, 32, 4, 2), (64, 16, 8, 3)])
# distances as a dot: bf16/fp16, tf32
_attention_dot = _tuned("attention_dot", [(64, 16, 4, 2), (64, 32, 4, 2), (64, 32, 8, 2),
                                          (128, 32, 8, 2), (64, 64, 8, 2), (128, 32, 8, 3),
                                          (64, 32, 4, 2, 168), (64, 32, 4, 2, 128)])
# 16-bit with the point dots as 3xBF16: the same but (64, 64, 8, 2), which hits an illegal memory
# access at B = 2, N = 97 on triton 3.6 / H200 (gpu_diagnostics/config_probe.py, tenth session;
# it runs at B = 1, N = 97 and B = 2, N = 256: a compiler fault, not an index the kernel gets
# wrong at these shapes).
_attention_bf16_split = _tuned("attention_bf16_split", [
    (64, 16, 4, 2), (64, 32, 4, 2), (64, 32, 8, 2), (128, 32, 8, 2), (128, 32, 8, 3),
    (64, 32, 4, 2, 168), (64, 32, 4, 2, 128)])
# fp32 IEEE with q.k, p.v and p.v_pts as 3xTF32 on tensor cores, distances direct. Not
# (64, 16, 8, 2): on triton 3.6 / H200 it hits an illegal memory access at D = 96, 3Vp = 36
# (gpu_diagnostics/config_probe.py; every other config here runs and matches the oracle).
_attention_split = _tuned("attention_split", [(64, 16, 4, 2), (64, 32, 4, 2), (64, 32, 8, 2),
                                              (128, 16, 8, 2), (128, 32, 8, 2),
                                              (64, 32, 4, 2, 168), (64, 32, 4, 2, 128),
                                              (128, 32, 8, 2, 128)])


def default_split(batch: int, heads: int, length: int, device: torch.device) -> int:
    """Key ranges per query block. A grid of 64-row query blocks that fills two programs per SM
    is not split (the merge would cost more than the fuller waves gain); a smaller one is split
    to about five programs per SM, ranges of at least 64 keys. Measured on the H200 (B = 1,
    H = 12, replayed forward; docs/perf-notes.md, tenth session): N = 256 and 1024 gain 4-10 %
    from 4 ranges, N = 2048 (384 programs) loses 2 % (fp32) to 7-8 % (bf16) from 2, N = 4096
    gains nothing."""
    programs = batch * heads * cdiv(length, 64)
    if device.type == "cuda" and programs >= 2 * sm_count(device):
        return 1
    return split_for_sms(programs, length, device, per_sm=5, min_range=64)


def launch_attention(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s, bias,
                     modes: Modes, stats: torch.Tensor | None = None, split: int = 1, *,
                     q_scale: float | None = None, write_logits: bool = False,
                     merge: bool = True):
    """The kernel, unchecked (callers check; shapes in `ipa_attention`). Returns out_p; with
    `stats` ((B, N, H, 3) fp32) also writes each row's softmax statistics there (see the
    kernel's STATS). `split` > 1 (not with `stats`): that many key ranges per query block, each
    its own program, merged after (`merge.merge_key_ranges`): more programs at moderate N;
    with `merge` False, not merged: the ranges are returned as `merge.KeyRanges` instead of
    out_p, and out_s is left unwritten (the frames epilogue merges them, `frames.epilogue`).
    `modes.split_dots`: q.k, p.v and p.v_pts as 3xTF32 on tensor cores (fp32 IEEE);
    `modes.split_bf16`: 16-bit inputs' point cross term and p.v_pts as 3xBF16. `q_scale`: the
    q.k factor in base-2 units (default log2(e) / sqrt(D)). `write_logits` (an fp32 `bias`):
    each row's base-2 logits, bias included, overwrite the bias (problem openfold's
    `triton-bias`, whose pair values read them)."""
    b, n, h, d = q.shape
    p3, vp3 = q_pts.shape[2], v_pts.shape[3]
    split_dots = modes.split_dots and q.dtype == torch.float32
    split_bf16 = modes.split_bf16 and q.dtype != torch.float32
    form = ("attention_split" if split_dots else "attention_bf16_split" if split_bf16 else
            "attention_dot" if modes.points_dot else "attention_direct")
    kernel = _LOGITS_TWIN[form] if write_logits else TUNED[form]
    split, split_len = split_range(n, split, largest_meta(kernel, "BLOCK_N"))
    assert split == 1 or stats is None, "the training forward's statistics are not merged"
    out_p = torch.empty(split, b, n, h, vp3, dtype=torch.float32, device=q.device)
    if split == 1:
        os_buf, lse_buf = out_s.unsqueeze(0), stats
    else:
        os_buf = torch.empty(split, b, n, h, d, dtype=torch.float32, device=q.device)
        lse_buf = torch.empty(split, b, n, h, dtype=torch.float32, device=q.device)
    grid = lambda meta: (cdiv(n, meta["BLOCK_M"]), b * h, split)
    kernel[grid](
        q, k, v, q_pts, k_pts, v_pts, centred_t, bias, point_weight, os_buf, out_p,
        out_p if lse_buf is None else lse_buf, n, split_len,
        base2.LOG2E / math.sqrt(d) if q_scale is None else q_scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), os_buf.stride(0), os_buf.stride(1), os_buf.stride(2),
        pow2(n, 64), H=h, D=d, D_PAD=pow2(d), P3=p3, P3_PAD=pow2(p3), VP3=vp3,
        VP3_PAD=pow2(vp3), DOT_PRECISION=modes.dot, PTS_PRECISION=modes.points,
        POINTS_DOT=modes.points_dot, SPLIT_DOTS=split_dots, CAST_F32=cast_f32(q.dtype),
        SPLIT_BF16=split_bf16,
        STORE_STATS=stats is not None, WRITE_LSE=split > 1, WRITE_LOGITS=write_logits,
        ALIGNED=aligned(n, split_len),
    )
    if split == 1:
        return out_p[0]
    if not merge:
        return KeyRanges(os_buf, out_p, lse_buf)
    return merge_key_ranges(os_buf, out_p, lse_buf, out_s)


def launch_logits_attention(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s,
                            bias, modes: Modes, *, q_scale: float | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training forward's attention: `bias`, the pair bias as a (B, H, N, N) fp32 tensor
    in every dtype (`launch_pair_bias` with `modes.bias` and dtype fp32; problem openfold's
    with its mask and scale), is read by the attention kernel, which overwrites it with the
    base-2 logits and saves each row's softmax statistics. Returns (out_p, stats (B, N, H, 3)
    fp32, logits), what the backwards read instead of recomputing them (`bias_backward.py`)."""
    b, n, h, _ = q.shape
    stats = torch.empty(b, n, h, 3, dtype=torch.float32, device=q.device)
    out_p = launch_attention(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s,
                             bias, modes, stats=stats, q_scale=q_scale, write_logits=True)
    return out_p, stats, bias


def ipa_attention(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s, bias, *,
                  math_mode: str = "ieee") -> torch.Tensor:
    """The IPA attention core with the pair bias given as a tensor.

    q, k, v       (B, N, H, D) views with strides (*, *, D, 1), one dtype (fp32/bf16/fp16);
                  1 <= H <= 16, 8 <= D <= 128
    q_pts, k_pts  (B, H, 3*Qp, N) fp32, global frame (centred)
    v_pts         (B, H, N, 3*Vp) fp32, global frame (centred)
    centred_t     (B, N, 3) fp32, the frame origins in the same centred frame
    point_weight  (H,) fp32: -softplus(head_weights) / 2 * log2(e) (`variants.base2`)
    out_s         (B, N, H, D) view, q's dtype: receives sum_j a_ij v_j
    bias          (B, H, N, N) contiguous, q's dtype: the pair bias (natural units)
    math_mode     "ieee" or "tf32" (fp32 only)
    returns       (B, N, H, 3*Vp) fp32: sum_j a_ij v_pts_j, global (centred) frame
    """
    check_attention_args(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s)
    modes = dot_modes(q.dtype, math_mode)
    b, n, h, _ = q.shape
    check_tensor("bias", bias, (b, h, n, n), dtype=q.dtype, device=q.device, contiguous=True)
    check_runnable("q", q)
    return launch_attention(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s, bias,
                            modes)
