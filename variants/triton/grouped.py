"""The `triton-grouped` variant's kernel (issue #17, deliverable 2): the pair bias computed in the
attention's key loop on tensor cores, for a group of G heads per program, so that `pair_repr`
is read from DRAM once and no N x N tensor is written.

Why groups. `triton` writes the bias as a (B, H, N, N) tensor with one GEMM and streams it back
in the attention kernel: the two run one after the other (at N = 4096 on the H100, 2.1 + 1.6 ms
in fp32), and the bias makes a round trip through DRAM. A kernel that computes the bias where it
is used can overlap the z stream with the attention's arithmetic. `triton-fullfuse` and
`triton-pairdot` do it with every head in one program: their (heads, rows, keys) state spills
or fits one 8-warp program per SM, and they are latency-bound (docs/perf-notes.md, sixth and
seventh sessions). Here a program owns G heads of one query block, so its state is G heads'
2-D tiles, and the H / G programs of one query block are adjacent in the grid (head group
fastest): the second and later read the same z rows from L2, not DRAM (z's rows of one query
block, BLOCK_M x N x C, are 4 MiB in fp32 at N = 4096 with 64-row blocks; the L2 is 50 MiB).

Per key block the z tile (BLOCK_M * BLOCK_N, C) times a (C, 16) matrix of the group's W_b rows
is one tensor-core dot; its (BLOCK_M, BLOCK_N, 16) result is split into 2-D tiles by a tree of
`tl.split`s (`split16`, free: a register relabelling), and each head's key block then runs as
in `triton`'s attention kernel (`attention.key_terms` and `softmax_update`, shared with it). In
fp32 (3xTF32, rows say `fp32-3xtf32`) the 16 columns hold W_hi for the G heads and W_lo beside
them, so that two TF32 dots (z_lo W_hi, then z_hi [W_hi | W_lo]) give the three products; the
tf32 mode and 16-bit inputs need one dot. The dot's columns past 2G (G in 16-bit) are zeros:
tensor-core work spent to keep the group's state small (at G = 4 in bf16, 0.2 TFLOP at
N = 4096, ~0.3 ms of the H200's tensor cores, under the z stream if the overlap works).

Measured: correct, and 3-6x slower than `triton`. The seventeenth session's sm_90 probe of the
design (its figures are in `gpu_diagnostics/grouped_proxy.py`) counted ~2.8 warp-instructions
per (pair, head) in bf16 at G = 4, 25 % fewer than `triton`'s two kernels, with 46 words
spilled. This kernel, with masks, strides and the attention kernel's own key step, compiles to
3.6 instructions with 136 words spilled at G = 4 (4.3-4.6 with 26-42 at G = 2), 8.4-10.6 with
430-660 in fp32, at 255 registers: one program per SM. H100, CUDA-graph replay, default layer
(`gpu_diagnostics/grouped_ab.py`, 2026-12-06; ms, `triton` then G = 2 and G = 4): bf16
N = 4096 2.26, 7.18, 8.77; fp32 N = 4096 4.58, 27.3, 29.0; bf16 N = 1024 0.192, 0.582, 0.986;
fp32 N = 1024 0.371, 2.13, 2.87. The overlap the design needs does not happen: the kernel is
latency-bound on its spills and its one program per SM, as `triton-fullfuse` and
`triton-pairdot` were (docs/perf-notes.md). Forward only, no key-range split. The default G is 4
(`group_size`): G = 2 crashed on the GPU at one shape.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from variants import base2
from variants.triton.attention import (
    initial_state,
    key_terms,
    normalised,
    query_operands,
    softmax_update,
)
from variants.triton.common import (
    Modes,
    aligned,
    autotuned,
    block_configs,
    cast_f32,
    cdiv,
    multiple_of_16,
    pow2,
    require,
)
from variants.triton.tf32 import tf32_hi

LOG2E = tl.constexpr(base2.LOG2E)
MAX_GROUP = 8  # fp32's W_hi | W_lo columns: 2G <= 16


@triton.jit
def split16(x):
    """(BM, BN, 16) -> the 16 (BM, BN) tiles x[:, :, e], as a tuple in column order (reshaped
    to (BM, BN, 2, 2, 2, 2), each `tl.split` takes the last bit of e)."""
    BM: tl.constexpr = x.shape[0]
    BN: tl.constexpr = x.shape[1]
    x = tl.reshape(x, [BM, BN, 2, 2, 2, 2])
    a, b = tl.split(x)  # e's bit 0: a even, b odd
    a0, a1 = tl.split(a)  # bit 1
    b0, b1 = tl.split(b)
    a00, a01 = tl.split(a0)  # bit 2
    a10, a11 = tl.split(a1)
    b00, b01 = tl.split(b0)
    b10, b11 = tl.split(b1)
    p0, q0 = tl.split(a00)  # bit 3: p0 = e 0, q0 = e 8
    p1, q1 = tl.split(a10)  # e 2, 10
    p2, q2 = tl.split(a01)  # e 4, 12
    p3, q3 = tl.split(a11)  # e 6, 14
    p4, q4 = tl.split(b00)  # e 1, 9
    p5, q5 = tl.split(b10)  # e 3, 11
    p6, q6 = tl.split(b01)  # e 5, 13
    p7, q7 = tl.split(b11)  # e 7, 15
    return (p0, p4, p1, p5, p2, p6, p3, p7, q0, q4, q1, q5, q2, q6, q3, q7)


@triton.jit
def group_weights(WB, h0, offs_c, c_ok, C, G: tl.constexpr, SPLIT_Z: tl.constexpr,
                  CAST_F32: tl.constexpr):
    """The (len(offs_c), 16) right-hand sides of the group's bias dot, W_b's rows h0 .. h0+G-1
    in columns 0 .. G-1: (for z_lo, for z_hi). With SPLIT_Z (3xTF32) the first has W_hi there
    and zeros after, the second W_hi and then W_lo in columns G .. 2G-1; otherwise both are W
    in columns 0 .. G-1 and zeros after."""
    e = tl.arange(0, 16)
    used = e < (2 * G if SPLIT_Z else G)
    w = tl.load(WB + (h0 + e % G)[None, :] * C + offs_c[:, None],
                mask=c_ok[:, None] & used[None, :], other=0.0)
    if CAST_F32:
        w = w.to(tl.float32)
    w_lo_side = w
    w_hi_side = w
    if SPLIT_Z:
        first = (e < G)[None, :]
        w_hi = tf32_hi(w)
        w_lo_side = tl.where(first, w_hi, 0.0)
        w_hi_side = tl.where(first, w_hi, w - w_hi)
    return w_lo_side, w_hi_side


@triton.jit(do_not_specialize=["N", "N_KEY"])
def _grouped_kernel(
    Q, K, V,  # (B, N, H, D) views: strides (sb, sn, D, 1), input dtype
    QP, KP,  # (B, H, 3*Qp, N) fp32 global-frame query / key points
    VP,  # (B, H, N, 3*Vp) fp32 global-frame value points
    TC,  # (B, N, 3) fp32 centred translations
    Z,  # (B, N, N, C) pair_repr, input dtype, any strides
    WB,  # (H, C) pair_bias.weight, input dtype, contiguous
    PW,  # (H,) fp32 point weight: -softplus(head_weights) / 2 * log2(e) (negative)
    OS,  # (B, N, H, D): strides (sb, sn, D, 1), input dtype
    OP,  # (B, N, H, 3*Vp) fp32 aggregated global-frame value points
    N,
    q_scale,  # log2(e) / sqrt(D)
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn, stride_ob, stride_on,
    stride_zb, stride_zi, stride_zj, stride_zc,
    N_KEY,  # autotune bucket, unused in the body
    H: tl.constexpr,
    G: tl.constexpr,  # heads per program; H is a multiple
    C: tl.constexpr,
    C_PAD: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    P3: tl.constexpr,
    P3_PAD: tl.constexpr,
    VP3: tl.constexpr,
    VP3_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PTS_PRECISION: tl.constexpr,
    BIAS_PRECISION: tl.constexpr,  # the bias dot's; "tf32x3": two TF32 dots of split z
    POINTS_DOT: tl.constexpr,
    SPLIT_DOTS: tl.constexpr,
    SPLIT_BF16: tl.constexpr,
    CAST_F32: tl.constexpr,
    ALIGNED: tl.constexpr,  # N a multiple of 16 (`common.multiple_of_16`)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    N = multiple_of_16(N, ALIGNED)
    h0 = tl.program_id(0) * G
    i0 = tl.program_id(1) * BLOCK_M
    b = tl.program_id(2).to(tl.int64)
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_bn = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    offs_e = tl.arange(0, VP3_PAD)
    m_ok = offs_m < N
    SPLIT_Z: tl.constexpr = BIAS_PRECISION == "tf32x3"

    queries = ()
    states = ()
    weights = ()
    for t in tl.static_range(G):
        queries = queries + (query_operands(
            Q, QP, TC, b, h0 + t, i0, offs_m, m_ok, N, stride_qb, stride_qn, H, D, D_PAD, P3,
            P3_PAD, POINTS_DOT, SPLIT_DOTS, SPLIT_BF16, CAST_F32, VP3_PAD),)
        states = states + (initial_state(BLOCK_M, BLOCK_N, D_PAD, VP3_PAD),)
        weights = weights + (tl.load(PW + h0 + t),)
    # z's (row, key) pairs of a key block, flattened row-major: rows past N read row N - 1
    # (computed, never stored), keys past N load zeros and their logits are set to -inf. The
    # strides multiply after the flattening: a reshape drops what the compiler knows of its
    # operand's divisibility, and the z loads need it to be 16-byte copies (sm_90 proxy: before,
    # one 2-byte load per element and hundreds of spilled words).
    rows = tl.reshape(tl.minimum(offs_m, N - 1)[:, None] + offs_bn[None, :] * 0,
                      [BLOCK_M * BLOCK_N]).to(tl.int64) * stride_zi
    keys = tl.reshape(offs_m[:, None] * 0 + offs_bn[None, :], [BLOCK_M * BLOCK_N])
    z_base = Z + b * stride_zb
    for j0 in range(0, N, BLOCK_N):
        key_ok = (j0 + keys) < N
        pairs = rows + (j0 + keys).to(tl.int64) * stride_zj
        acc = tl.zeros([BLOCK_M * BLOCK_N, 16], dtype=tl.float32)
        # a loop, not unrolled: unrolled, every chunk's z tile was loaded up front and all
        # were live at once (sm_90 proxy: hundreds of words more spilled)
        for c0 in range(0, C_PAD, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            c_ok = offs_c < C
            z = tl.load(z_base + pairs[:, None] + offs_c[None, :] * stride_zc,
                        mask=key_ok[:, None] & c_ok[None, :], other=0.0)
            w_lo_side, w_hi_side = group_weights(WB, h0, offs_c, c_ok, C, G, SPLIT_Z, CAST_F32)
            if CAST_F32:
                z = z.to(tl.float32)
            if SPLIT_Z:
                z_hi = tf32_hi(z)
                acc = tl.dot(z - z_hi, w_lo_side, acc, input_precision="tf32")
                acc = tl.dot(z_hi, w_hi_side, acc, input_precision="tf32")
            else:
                acc = tl.dot(z, w_hi_side, acc, input_precision=BIAS_PRECISION)
        tiles = split16(tl.reshape(acc, [BLOCK_M, BLOCK_N, 16]))
        n_ok = (j0 + offs_bn) < N
        new_states = ()
        for t in tl.static_range(G):
            bias = tiles[t]
            if SPLIT_Z:
                bias = bias + tiles[G + t]
            s, dist = key_terms(j0, queries[t], K, KP, b, h0 + t, N, q_scale, stride_kb,
                                stride_kn, H, D, D_PAD, P3, P3_PAD, DOT_PRECISION, POINTS_DOT,
                                SPLIT_DOTS, SPLIT_BF16, CAST_F32, BLOCK_N)
            s = tl.where(n_ok[None, :], s + bias * LOG2E + weights[t] * dist, float("-inf"))
            new_states = new_states + (softmax_update(
                s, dist, j0, states[t], queries[t], V, VP, b, h0 + t, N, stride_vb, stride_vn,
                H, D, D_PAD, VP3, VP3_PAD, DOT_PRECISION, PTS_PRECISION, SPLIT_DOTS,
                SPLIT_BF16, CAST_F32, False, BLOCK_N),)
        states = new_states

    for t in tl.static_range(G):
        h = h0 + t
        out_s, out_p, _ = normalised(states[t], queries[t])
        tl.store(
            OS + b * stride_ob + h * D + offs_m[:, None] * stride_on + offs_d[None, :],
            out_s.to(OS.dtype.element_ty), mask=m_ok[:, None] & (offs_d < D)[None, :],
        )
        tl.store(
            OP + ((b * N + offs_m[:, None]) * H + h) * VP3 + offs_e[None, :],
            out_p, mask=m_ok[:, None] & (offs_e < VP3)[None, :],
        )


# (BLOCK_M, BLOCK_N, BLOCK_C, warps, stages), per operand width: compiled for sm_90
# (`gpu_diagnostics/grouped_proxy.py`, N = 1024, G = 4; spilled words and warp-instructions per
# (pair, head)): 16-bit (64, 16, 32, 8, 1) 136 and 3.6, (32, 16, 32, 4, 2) 172 and 3.9; fp32
# (3xTF32) 430-660 and 8.4-10.6, its best BLOCK_C 16. Every one spills at G = 4; at G = 2 the
# 16-bit ones spill 26-42 words for 4.3-4.6 instructions.
_KEY = ["N_KEY", "H", "G", "C", "D_PAD", "P3", "VP3_PAD", "DOT_PRECISION", "BIAS_PRECISION",
        "SPLIT_BF16"]
_NAMES = ("BLOCK_M", "BLOCK_N", "BLOCK_C")
_INTERPRETED = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_C": 32}
_grouped_16bit = autotuned(
    "grouped_16bit", _grouped_kernel, key=_KEY, interpreted=_INTERPRETED,
    configs=block_configs([(64, 16, 32, 8, 1), (64, 16, 32, 8, 2), (32, 16, 32, 4, 2)], _NAMES))
_grouped_fp32 = autotuned(
    "grouped_fp32", _grouped_kernel, key=_KEY, interpreted=_INTERPRETED,
    configs=block_configs([(32, 16, 16, 4, 2), (64, 16, 16, 8, 2), (32, 16, 32, 4, 2)], _NAMES))


def group_size(heads: int) -> int:
    """Heads per program by default: the largest divisor of `heads` up to 4. G = 2 measured
    faster than G = 4 at H = 12 (H100, N = 1024 and 4096, fp32 and bf16: by 1.06-1.7x, fewer
    spills), but as the default it hit an illegal address on the H100 at N = 130, H = 4, Qp 8,
    Vp 12 (fp32; twenty-eighth session, cause not yet isolated: `gpu_diagnostics/crash_session.sh`
    splits it by autotune config), where G = 4 passed every GPU oracle test (twenty-seventh)."""
    return max(g for g in range(1, 5) if heads % g == 0)


def check_group(heads_per_program: int | None, heads: int) -> None:
    """A `heads_per_program` the kernel can run: None (`group_size`) or a divisor of the heads
    up to `MAX_GROUP`."""
    require(heads_per_program is None or (
        isinstance(heads_per_program, int) and 1 <= heads_per_program <= MAX_GROUP
        and heads % heads_per_program == 0),
        f"heads_per_program: expected None or a divisor of heads={heads} in 1..{MAX_GROUP}, "
        f"got {heads_per_program!r}")


def launch_grouped(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s, pair_repr,
                   pair_weight, modes: Modes, heads_per_program: int | None = None
                   ) -> torch.Tensor:
    """The kernel, unchecked (shapes as `attention.ipa_attention`; pair_repr (B, N, N, C) any
    strides, pair_weight (H, C) contiguous, q's dtype). Writes out_s; returns out_p."""
    b, n, h, d = q.shape
    c = pair_repr.shape[-1]
    p3, vp3 = q_pts.shape[2], v_pts.shape[3]
    g = heads_per_program or group_size(h)
    out_p = torch.empty(b, n, h, vp3, dtype=torch.float32, device=q.device)
    grid = lambda meta: (h // g, cdiv(n, meta["BLOCK_M"]), b)
    kernel = _grouped_fp32 if q.dtype == torch.float32 else _grouped_16bit
    kernel[grid](
        q, k, v, q_pts, k_pts, v_pts, centred_t, pair_repr, pair_weight, point_weight, out_s,
        out_p, n, base2.LOG2E / math.sqrt(d),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out_s.stride(0), out_s.stride(1), *pair_repr.stride(), pow2(n, 64),
        H=h, G=g, C=c, C_PAD=pow2(c, 32), D=d, D_PAD=pow2(d), P3=p3, P3_PAD=pow2(p3), VP3=vp3,
        VP3_PAD=pow2(vp3), DOT_PRECISION=modes.dot, PTS_PRECISION=modes.points,
        BIAS_PRECISION=modes.bias, POINTS_DOT=modes.points_dot, SPLIT_DOTS=modes.split_dots,
        SPLIT_BF16=modes.split_bf16, CAST_F32=cast_f32(q.dtype), ALIGNED=aligned(n),
    )
    return out_p
