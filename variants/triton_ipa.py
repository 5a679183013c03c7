"""Triton IPA: a flash-attention-style kernel for the IPA attention core (issue #4).

What it is. LayerNorm, the six projections (one fused GEMM), the frame transforms and
`out_proj` stay in PyTorch: they are O(N) work. The O(N^2) part, logits + softmax +
aggregation of the scalar values and of the global-frame value points, is one Triton kernel
in the style of FlashAttention-2 (Dao 2023; the Triton fused-attention tutorial): a program
owns a block of queries, loops over key blocks, keeps a running max and sum in fp32 (online
softmax, base-2 exponentials) and never writes the (B, H, N, N) logits or attention.

Two registered variants, differing only in where the pair bias z . W_b comes from:

* `triton`: one GEMM reads `pair_repr` once and writes the bias as a (B, H, N, N) tensor
  (input dtype): a small Triton kernel (`_pair_bias_kernel`) for bf16/fp16, cuBLAS for
  fp32/tf32 (IEEE fp32 in Triton means CUDA-core FMA dots, measured 1.4x slower than
  cuBLAS there). The attention kernel, one program per (query block, batch, head), streams
  its head's rows. Extra memory is one N x N x H tensor (768 MiB at N = 4096 in fp32), the
  rest is O(N). This is the fast one.
* `triton-fullfuse`: one kernel computes the bias inside the key loop, so `pair_repr` is
  read exactly once and no N x N tensor is ever written (extra memory O(N): 118 MiB at
  N = 4096). Because every head needs the same z tile, a program owns a query block for
  *all* heads: logits, accumulators and dots are 3-D (heads padded to 16, batched
  `tl.dot`), the bias tile is z(BM*BN, C) @ W_b^T(C, 16). For small grids the key range is
  split across programs (flash-decoding) and the partial results merged by their
  log-sum-exp in PyTorch. Triton compiles these 3-D tiles with heavy register spills, so
  it is 2.5x (bf16) to 1.8x (fp32) slower than `triton` at N = 4096: kept for its memory
  and as the measured record (docs/perf-notes.md).

What differs from the reference (all of it on purpose, none of it changes the function):
* Point distances. fp32 (IEEE) mode computes them directly, sum_{p,c} (q - k)^2. The other
  modes (tf32, bf16, fp16) use one 3xTF32 dot of coordinates centred on the query block's
  first frame origin: |q'|^2 + |k'|^2 - 2 q'.k' in fp32-accurate arithmetic. Never the
  uncentred expanded form (SPEC: it cancels catastrophically at 100 A offsets). The
  centred form costs about 2-3e-5 rel_l2 against the oracle (CPU emulation, N = 512-1024),
  which is why fp32 keeps the direct form (its floor is 2e-5) and which is negligible
  against the tf32 (2e-3) and bf16/fp16 (1e-2, 5e-2) tolerances.
* Global-frame points are always fp32, also for bf16/fp16 inputs (the reference rounds
  100 A coordinates to bf16, i.e. to 0.5 A), and translations are centred on their
  per-batch mean before the frame transform (the output is invariant to that shift).
  That is most of why bf16 errors are 0.04-0.05 of the bf16 reference's.
* Value points are aggregated relative to the first query's frame origin of each block
  (keys that carry weight lie near the queries, so the summands are small); in bf16/fp16
  and tf32 modes that aggregation runs as a TF32 dot, in fp32 (IEEE) mode as an IEEE dot.
* Dots: fp32 mode uses `input_precision="ieee"` everywhere, `tf32` mode uses TF32 for the
  scalar dots and the bias; bf16/fp16 inputs use tensor cores with fp32 accumulation. The
  softmax and all accumulators are fp32 in every mode.
* softplus(head_weights) and the 1/sqrt(d) scale are applied in fp32.

Caveats. No backward. Heads 1..16, points 1..16, head_dim 8..128 (padded to powers of
two, so e.g. d = 48 does 64-wide dots). fp32 (IEEE) is slow: Triton lowers IEEE fp32 dots
to CUDA-core FMAs at ~13 % of FP32 peak here, so N = 4096 takes 11 ms, not the 4 ms
target (docs/perf-notes.md). At N <= 1024 the forward is bound by host-side launch
overhead (~20 PyTorch ops and two Triton launches), not by the GPU. Under the CPU
interpreter (`TRITON_INTERPRET=1`) every dot runs in fp32 (the interpreter's bf16 `tl.dot`
is wrong) and a single block-size config is used instead of autotuning. Inputs that are
not contiguous are made contiguous (a copy, which for `pair_repr` costs a full read+write).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from variants.base import IPAFunction, Variant
from variants.problem import (
    IPAConfig,
    IPAInputError,
    Precision,
    get_precision,
    validate_inputs,
)

LOG2E = 1.4426950408889634
HEADS_PAD = 16  # the fully fused kernel's head axis (tl.dot needs >= 16 rows)

# Filled in by `_kernels()`: Triton is imported lazily so that this module imports without it.
triton = None
tl = None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _pow2(x: int, at_least: int = 16) -> int:
    return max(at_least, 1 << (max(1, x) - 1).bit_length())


@functools.cache
def _kernels(interpret: bool) -> SimpleNamespace:
    """Define (and on the GPU autotune-wrap) the kernels; cached per interpreter mode,
    because `triton.jit` decides at definition time whether to interpret."""
    global triton, tl
    import triton
    import triton.language as tl

    # Sizes that vary per call are not specialised on (divisibility by 16), so that one
    # compile per config serves every N: compiles, not launches, dominate short runs.
    @triton.jit(do_not_specialize=["ROWS", "NN", "ROWS_KEY"])
    def _pair_bias_kernel(
        Z,  # (B*N*N, C) pair_repr rows
        WB,  # (H, C) pair_bias.weight
        OUT,  # (B, H, N, N) bias, input dtype
        ROWS,  # B*N*N
        NN,  # N*N
        C,
        ROWS_KEY,  # autotune bucket, unused in the body
        H: tl.constexpr,
        H_PAD: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        CAST_F32: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        # read BLOCK_R * C elements of z, write BLOCK_R * H: memory-bound (C = 128, H = 12).
        offs_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        offs_h = tl.arange(0, H_PAD)
        r_ok = offs_r < ROWS
        h_ok = offs_h < H
        acc = tl.zeros([BLOCK_R, H_PAD], dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            c_ok = offs_c < C
            z = tl.load(
                Z + offs_r[:, None] * C + offs_c[None, :],
                mask=r_ok[:, None] & c_ok[None, :], other=0.0,
            )
            w = tl.load(
                WB + offs_h[None, :] * C + offs_c[:, None],
                mask=h_ok[None, :] & c_ok[:, None], other=0.0,
            )
            if CAST_F32:
                z = z.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(z, w, acc, input_precision=DOT_PRECISION)
        b = offs_r // NN
        rem = offs_r - b * NN
        out = OUT + (b * H)[:, None] * NN + offs_h[None, :] * NN + rem[:, None]
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=r_ok[:, None] & h_ok[None, :])

    @triton.jit(do_not_specialize=["N", "N_KEY"])
    def _ipa_attn_kernel(
        Q, K, V,  # (B, N, H, D) views: strides (sb, sn, D, 1), input dtype
        QP, KP,  # (B, H, 3*Qp, N) fp32 global-frame query / key points
        VP,  # (B, H, N, 3*Vp) fp32 global-frame value points
        TC,  # (B, N, 3) fp32 centred translations
        BIAS,  # (B, H, N, N) pair bias, input dtype
        HW,  # (H,) fp32: softplus(head_weights) / 2 * log2(e)
        OS,  # (B, N, H, D) view: strides (sb, sn, D, 1), input dtype
        OP,  # (B, N, H, 3*Vp) fp32 aggregated global-frame value points
        N,
        sm_scale_log2,  # log2(e) / sqrt(D)
        stride_qb, stride_qn, stride_kb, stride_kn,
        stride_vb, stride_vn, stride_ob, stride_on,
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
        CAST_F32: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
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

        q = tl.load(
            Q + b * stride_qb + h * D + offs_m[:, None] * stride_qn + offs_d[None, :],
            mask=m_ok[:, None] & d_ok[None, :], other=0.0,
        )
        if CAST_F32:
            q = q.to(tl.float32)
        hw = tl.load(HW + h)
        # Value points are summed relative to this block's first frame origin (small summands).
        centre = tl.load(TC + (b * N + i0) * 3 + offs_e % 3)
        qp_base = QP + bh * P3 * N
        kp_base = KP + bh * P3 * N
        vp_base = VP + bh * N * VP3
        bias_rows = BIAS + bh * N * N + offs_m[:, None].to(tl.int64) * N
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
            q_norm = tl.sum(q_pts * q_pts, 1)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc_s = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
        acc_p = tl.zeros([BLOCK_M, VP3_PAD], dtype=tl.float32)
        for j0 in range(0, N, BLOCK_N):
            offs_n = j0 + tl.arange(0, BLOCK_N)
            n_ok = offs_n < N
            # scalar term: q . k / sqrt(d), in log2 units
            kt = tl.load(
                K + b * stride_kb + h * D + offs_n[None, :] * stride_kn + offs_d[:, None],
                mask=d_ok[:, None] & n_ok[None, :], other=0.0,
            )
            if CAST_F32:
                kt = kt.to(tl.float32)
            s = tl.dot(q, kt, input_precision=DOT_PRECISION) * sm_scale_log2
            if POINTS_DOT:
                k_pts = tl.load(
                    kp_base + offs_c[:, None] * N + offs_n[None, :],
                    mask=c_ok[:, None] & n_ok[None, :], other=0.0,
                )
                k_pts = tl.where(c_ok[:, None], k_pts - centre_c[:, None], 0.0)
                cross = tl.dot(q_pts, k_pts, input_precision="tf32x3")
                dist = q_norm[:, None] + tl.sum(k_pts * k_pts, 0)[None, :] - 2.0 * cross
                dist = tl.maximum(dist, 0.0)
            else:
                # squared distances computed directly (IEEE fp32 mode)
                dist = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for c in tl.static_range(P3):
                    qc = tl.load(qp_base + c * N + offs_m, mask=m_ok, other=0.0)
                    kc = tl.load(kp_base + c * N + offs_n, mask=n_ok, other=0.0)
                    diff = qc[:, None] - kc[None, :]
                    dist += diff * diff
            bias = tl.load(
                bias_rows + offs_n[None, :], mask=m_ok[:, None] & n_ok[None, :], other=0.0
            ).to(tl.float32)
            s = s + bias * 1.4426950408889634 - hw * dist
            s = tl.where(n_ok[None, :], s, float("-inf"))
            # online softmax (fp32)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                V + b * stride_vb + h * D + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=n_ok[:, None] & d_ok[None, :], other=0.0,
            )
            if CAST_F32:
                pv = tl.dot(p, v.to(tl.float32), input_precision=DOT_PRECISION)
            else:
                pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            acc_s = acc_s * alpha[:, None] + pv
            vp = tl.load(
                vp_base + offs_n[:, None] * VP3 + offs_e[None, :],
                mask=n_ok[:, None] & e_ok[None, :], other=0.0,
            )
            vp = tl.where(n_ok[:, None], vp - centre[None, :], 0.0)
            acc_p = acc_p * alpha[:, None] + tl.dot(p, vp, input_precision=PTS_PRECISION)
            m_i = m_new

        acc_s = acc_s / l_i[:, None]
        acc_p = acc_p / l_i[:, None] + centre[None, :]
        tl.store(
            OS + b * stride_ob + h * D + offs_m[:, None] * stride_on + offs_d[None, :],
            acc_s.to(OS.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :],
        )
        tl.store(
            OP + ((b * N + offs_m[:, None]) * H + h) * VP3 + offs_e[None, :],
            acc_p, mask=m_ok[:, None] & e_ok[None, :],
        )

    @triton.jit(do_not_specialize=["N", "split_len", "N_KEY"])
    def _ipa_fullfuse_kernel(
        Q, K, V,  # (B, N, H, D) views: strides (sb, sn, D, 1), input dtype
        QP, KP,  # (B, H, 3*Qp, N) fp32 global-frame query / key points
        VP,  # (B, H, N, 3*Vp) fp32 global-frame value points
        TC,  # (B, N, 3) fp32 centred translations
        Z,  # (B, N, N, C) pair_repr, contiguous, input dtype
        WB,  # (H, C) pair_bias.weight, input dtype
        HW,  # (H,) fp32: softplus(head_weights) / 2 * log2(e)
        OS,  # (S, B, N, H, D) view: strides (ss, sb, sn, D, 1)
        OP,  # (S, B, N, H, 3*Vp) fp32
        LSE,  # (S, B, N, H) fp32 log2-sum-exp per split (written when WRITE_LSE)
        N,
        C,
        split_len,  # keys per split (a multiple of every BLOCK_N)
        sm_scale_log2,
        stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
        stride_os, stride_ob, stride_on,
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
        hw = tl.load(HW + offs_h, mask=offs_h < H, other=0.0)
        centre = tl.load(TC + (b * N + i0) * 3 + offs_e % 3)
        bh3 = b * H + h3
        z_base = Z + b * N * N * C

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
            s = tl.dot(q, kt, input_precision=DOT_PRECISION) * sm_scale_log2
            # point term, direct squared distances
            dist = tl.zeros([H_PAD, BLOCK_M, BLOCK_N], dtype=tl.float32)
            for c in tl.static_range(P3):
                qc = tl.load(QP + (bh3 * P3 + c) * N + m3, mask=h_ok3 & m_ok3, other=0.0)
                kc = tl.load(KP + (bh3 * P3 + c) * N + n3, mask=h_ok3 & n_ok3, other=0.0)
                diff = qc - kc
                dist += diff * diff
            # pair bias, all heads at once: z(BM*BN, C) @ W_b^T(C, H_PAD)
            rows = tl.reshape(offs_m[:, None].to(tl.int64) * N + offs_n[None, :],
                              [BLOCK_M * BLOCK_N])
            rows_ok = tl.reshape((offs_m[:, None] < N) & n_ok[None, :], [BLOCK_M * BLOCK_N])
            bias = tl.zeros([BLOCK_M * BLOCK_N, H_PAD], dtype=tl.float32)
            for c0 in tl.static_range(0, C_PAD, BLOCK_C):
                offs_c = c0 + tl.arange(0, BLOCK_C)
                c_ok = offs_c < C
                z = tl.load(
                    z_base + rows[:, None] * C + offs_c[None, :],
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
            s = s + bias * 1.4426950408889634 - hw[:, None, None] * dist
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

    kernels = SimpleNamespace(
        pair_bias=_pair_bias_kernel, attn=_ipa_attn_kernel, attn_fp32=_ipa_attn_kernel,
        fullfuse=_ipa_fullfuse_kernel, fullfuse_fp32=_ipa_fullfuse_kernel,
        fixed={}, interpret=interpret,
    )
    if interpret:
        # One config, and no autotuner: the interpreter cannot run several. Large blocks:
        # the interpreter's cost is per op and per program, not per element.
        kernels.fixed = {
            "pair_bias": {"BLOCK_R": 1024, "BLOCK_C": 64},
            "attn": {"BLOCK_M": 64, "BLOCK_N": 64},
            "fullfuse": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_C": 64},
        }
        return kernels

    # Config lists from compiling for sm_90 and reading register/stack use (cuobjdump):
    # only configs without large spills. fp32 IEEE dots run on CUDA cores (FMA), whose
    # Triton lowering holds whole operand slices in registers, hence the smaller tiles.
    cfg = triton.Config
    kernels.pair_bias = triton.autotune(
        configs=[
            cfg({"BLOCK_R": r, "BLOCK_C": c}, num_warps=w, num_stages=s)
            for r, c, w, s in [
                (64, 64, 4, 3), (128, 32, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3),
                (256, 32, 8, 3), (256, 64, 8, 2), (128, 128, 8, 2), (64, 128, 4, 2),
            ]
        ],
        key=["ROWS_KEY", "C", "H_PAD", "DOT_PRECISION"],
    )(_pair_bias_kernel)
    attn_key = ["N_KEY", "H", "D_PAD", "P3", "VP3_PAD", "DOT_PRECISION", "PTS_PRECISION",
                "POINTS_DOT"]
    kernels.attn_fp32 = triton.autotune(
        configs=[
            cfg({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
            for m, n, w, s in [
                (64, 16, 8, 2), (32, 16, 8, 2), (32, 16, 4, 2), (32, 32, 8, 2),
                (16, 32, 4, 2), (64, 16, 8, 3),
            ]
        ],
        key=attn_key,
    )(_ipa_attn_kernel)
    kernels.attn = triton.autotune(  # distances as a dot: bf16/fp16, tf32
        configs=[
            cfg({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=st)
            for m, n, w, st in [
                (64, 16, 4, 2), (64, 32, 4, 2), (64, 32, 8, 2), (128, 32, 8, 2),
                (64, 64, 8, 2), (128, 32, 8, 3),
            ]
        ],
        key=attn_key,
    )(_ipa_attn_kernel)
    fuse_key = ["N_KEY", "C", "D_PAD", "P3", "VP3_PAD", "DOT_PRECISION", "WRITE_LSE"]
    kernels.fullfuse_fp32 = triton.autotune(
        configs=[
            cfg({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_C": c}, num_warps=8, num_stages=1)
            for c in (32,)
        ],
        key=fuse_key,
    )(_ipa_fullfuse_kernel)
    kernels.fullfuse = triton.autotune(
        configs=[
            cfg({"BLOCK_M": m, "BLOCK_N": 16, "BLOCK_C": c}, num_warps=8, num_stages=1)
            for m, c in ((16, 64),)
        ],
        key=fuse_key,
    )(_ipa_fullfuse_kernel)
    return kernels


# ---- launchers: check, allocate, launch ----------------------------------------------------


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise IPAInputError(message)


def _check_tensor(name, t, shape, *, dtype=None, device=None, contiguous=False):
    _require(
        isinstance(t, torch.Tensor), f"{name}: expected a torch.Tensor, got {type(t).__name__}"
    )
    _require(
        tuple(t.shape) == tuple(shape),
        f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}",
    )
    _require(dtype is None or t.dtype == dtype, f"{name}: expected dtype {dtype}, got {t.dtype}")
    _require(
        device is None or t.device == device, f"{name}: expected device {device}, got {t.device}"
    )
    _require(
        not contiguous or t.is_contiguous(),
        f"{name}: expected a contiguous tensor, got strides {t.stride()}",
    )


def _check_heads_view(name, t, shape, device):
    """(B, N, H, D) views into a wider row: innermost strides (D, 1) are what the kernels assume."""
    _check_tensor(name, t, shape, device=device)
    _require(
        t.stride(3) == 1 and t.stride(2) == shape[3],
        f"{name}: expected strides (*, *, {shape[3]}, 1) (heads packed in a row), got {t.stride()}",
    )


@dataclass(frozen=True)
class _Modes:
    """How each dot of the kernels runs for one (dtype, math mode)."""

    dot: str  # q.k, p.v and the pair bias
    points: str  # p.v_pts (fp32 operands)
    points_dot: bool  # distances as a centred 3xTF32 dot (else computed directly)
    cublas_bias: bool  # the (B, H, N, N) bias by cuBLAS rather than the Triton GEMM


def _modes(dtype: torch.dtype, math_mode: str) -> _Modes:
    """fp32 "ieee": IEEE dots everywhere, distances computed directly; the bias GEMM by cuBLAS
    (measured faster than Triton's FMA dot for it). fp32 "tf32": TF32 tensor cores, distances
    as a centred 3xTF32 dot. bf16/fp16: tensor cores, value points in TF32, distances as a
    centred 3xTF32 dot. (Every dot as 3xTF32 in fp32 was tried: on triton 3.6 / H200 the
    per-head kernel with q.k and p.v in 3xTF32 hit an illegal memory access while
    autotuning, so that mode is not offered; see docs/perf-notes.md.)
    """
    _require(math_mode in ("ieee", "tf32"),
             f"math_mode: expected 'ieee' or 'tf32', got {math_mode!r}")
    if dtype == torch.float32:
        if math_mode == "ieee":
            return _Modes("ieee", "ieee", False, True)
        return _Modes("tf32", "tf32", True, True)
    _require(math_mode == "ieee", f"math_mode: {math_mode!r} applies to fp32 inputs only")
    return _Modes("ieee", "tf32", True, False)


def pair_bias(pair_repr: torch.Tensor, weight: torch.Tensor, *, math_mode: str = "ieee"):
    """bias[b, h, i, j] = sum_c pair_repr[b, i, j, c] * weight[h, c], by the Triton GEMM.

    pair_repr (B, N, N, C), weight (H, C) -> (B, H, N, N) in pair_repr's dtype (fp32 accumulation).
    """
    _require(
        pair_repr.dim() == 4, f"pair_repr: expected 4 dims (B, N, N, C), got {pair_repr.dim()}"
    )
    b, n, _, c = pair_repr.shape
    h = weight.shape[0]
    _check_tensor("pair_repr", pair_repr, (b, n, n, c), contiguous=True)
    _check_tensor("weight", weight, (h, c), dtype=pair_repr.dtype, device=pair_repr.device,
                  contiguous=True)
    _require(1 <= h <= HEADS_PAD, f"weight: expected 1..{HEADS_PAD} heads, got {h}")
    return _launch_pair_bias(pair_repr, weight, _modes(pair_repr.dtype, math_mode).dot)


def _launch_pair_bias(pair_repr, weight, precision):
    kernels = _kernels(_interpreting())
    b, n, _, c = pair_repr.shape
    h = weight.shape[0]
    out = torch.empty(b, h, n, n, dtype=pair_repr.dtype, device=pair_repr.device)
    rows = b * n * n
    grid = lambda meta: (triton.cdiv(rows, meta["BLOCK_R"]),)
    kernels.pair_bias[grid](
        pair_repr, weight, out, rows, n * n, c, _pow2(rows, 1 << 16),
        H=h, H_PAD=HEADS_PAD, DOT_PRECISION=precision,
        CAST_F32=kernels.interpret and pair_repr.dtype != torch.float32,
        **kernels.fixed.get("pair_bias", {}),
    )
    return out


def _cublas_pair_bias(pair_repr, weight, tf32: bool):
    """The same bias by cuBLAS: W (H, C) @ z^T, written straight in (B, H, N, N) order.
    TF32 is set for the call and restored (fp32 'ieee' must not inherit a global TF32 switch)."""
    b, n, _, c = pair_repr.shape
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_tf32
    matmul.allow_tf32 = tf32
    try:
        out = torch.matmul(weight, pair_repr.view(b, n * n, c).transpose(1, 2))
    finally:
        matmul.allow_tf32 = saved
    return out.view(b, -1, n, n)


def _check_attention_args(q, k, v, q_pts, k_pts, v_pts, centred_t, head_scale, out_s):
    _require(q.dim() == 4, f"q: expected 4 dims (B, N, H, D), got {q.dim()}")
    b, n, h, d = q.shape
    dev = q.device
    for name, t in (("q", q), ("k", k), ("v", v), ("out_s", out_s)):
        _check_heads_view(name, t, (b, n, h, d), dev)
    _require(k.dtype == q.dtype and v.dtype == q.dtype and out_s.dtype == q.dtype,
             f"k, v, out_s: expected dtype {q.dtype} (as q), got {k.dtype}, {v.dtype}, "
             f"{out_s.dtype}")
    _require(q_pts.dim() == 4, f"q_pts: expected 4 dims (B, H, 3*Qp, N), got {q_pts.dim()}")
    p3 = q_pts.shape[2]
    _require(p3 % 3 == 0, f"q_pts: expected 3*Qp point coordinates in dim 2, got {p3}")
    _check_tensor("q_pts", q_pts, (b, h, p3, n), dtype=torch.float32, device=dev, contiguous=True)
    _check_tensor("k_pts", k_pts, (b, h, p3, n), dtype=torch.float32, device=dev, contiguous=True)
    _require(v_pts.dim() == 4, f"v_pts: expected 4 dims (B, H, N, 3*Vp), got {v_pts.dim()}")
    vp3 = v_pts.shape[3]
    _require(vp3 % 3 == 0, f"v_pts: expected 3*Vp point coordinates in dim 3, got {vp3}")
    _check_tensor("v_pts", v_pts, (b, h, n, vp3), dtype=torch.float32, device=dev,
                  contiguous=True)
    _check_tensor("centred_t", centred_t, (b, n, 3), dtype=torch.float32, device=dev,
                  contiguous=True)
    _check_tensor("head_scale", head_scale, (h,), dtype=torch.float32, device=dev,
                  contiguous=True)
    _require(1 <= h <= HEADS_PAD, f"q: expected 1..{HEADS_PAD} heads, got {h}")
    _require(8 <= d <= 128, f"q: expected head_dim in [8, 128], got {d}")


def ipa_attention(
    q, k, v, q_pts, k_pts, v_pts, centred_t, head_scale, out_s, *,
    bias=None, pair_repr=None, pair_weight=None, math_mode="ieee", split=None,
):
    """The IPA attention core. Give either `bias` (streamed) or `pair_repr` + `pair_weight`
    (fully fused: the bias is computed in the kernel).

    q, k, v      (B, N, H, D) views with strides (*, *, D, 1), one dtype (fp32/bf16/fp16)
    q_pts, k_pts (B, H, 3*Qp, N) fp32, global frame (centred)
    v_pts        (B, H, N, 3*Vp) fp32, global frame (centred)
    centred_t    (B, N, 3) fp32, the frame origins in the same centred frame
    head_scale   (H,) fp32: softplus(head_weights) / 2 * log2(e)
    out_s        (B, N, H, D) view, q's dtype: receives sum_j a_ij v_j
    bias         (B, H, N, N) contiguous, q's dtype
    pair_repr    (B, N, N, C) contiguous, q's dtype; pair_weight (H, C)
    split        fully fused form only: number of key ranges (None: chosen from the grid)
    returns      (B, N, H, 3*Vp) fp32: sum_j a_ij v_pts_j, global (centred) frame
    """
    _check_attention_args(q, k, v, q_pts, k_pts, v_pts, centred_t, head_scale, out_s)
    _require((bias is None) != (pair_repr is None), "bias, pair_repr: expected exactly one")
    b, n, h, _ = q.shape
    dev, dtype = q.device, q.dtype
    modes = _modes(dtype, math_mode)
    if bias is not None:
        _check_tensor("bias", bias, (b, h, n, n), dtype=dtype, device=dev, contiguous=True)
        return _launch_attention(q, k, v, q_pts, k_pts, v_pts, centred_t, head_scale, out_s,
                                 bias, modes)
    _require(
        pair_repr.dim() == 4, f"pair_repr: expected 4 dims (B, N, N, C), got {pair_repr.dim()}"
    )
    c = pair_repr.shape[3]
    _check_tensor("pair_repr", pair_repr, (b, n, n, c), dtype=dtype, device=dev, contiguous=True)
    _check_tensor("pair_weight", pair_weight, (h, c), dtype=dtype, device=dev, contiguous=True)
    _require(split is None or (isinstance(split, int) and split >= 1),
             f"split: expected None or an int >= 1, got {split!r}")
    return _launch_fullfuse(q, k, v, q_pts, k_pts, v_pts, centred_t, head_scale, out_s,
                            pair_repr, pair_weight, modes, split)


def _launch_attention(q, k, v, q_pts, k_pts, v_pts, centred_t, head_scale, out_s, bias, modes):
    kernels = _kernels(_interpreting())
    b, n, h, d = q.shape
    p3, vp3 = q_pts.shape[2], v_pts.shape[3]
    out_p = torch.empty(b, n, h, vp3, dtype=torch.float32, device=q.device)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), b * h)
    kernel = kernels.attn if modes.points_dot else kernels.attn_fp32
    kernel[grid](
        q, k, v, q_pts, k_pts, v_pts, centred_t, bias, head_scale, out_s, out_p,
        n, LOG2E / math.sqrt(d),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), out_s.stride(0), out_s.stride(1),
        _pow2(n, 64), H=h, D=d, D_PAD=_pow2(d), P3=p3, P3_PAD=_pow2(p3), VP3=vp3,
        VP3_PAD=_pow2(vp3), DOT_PRECISION=modes.dot, PTS_PRECISION=modes.points,
        POINTS_DOT=modes.points_dot,
        CAST_F32=kernels.interpret and q.dtype != torch.float32,
        **kernels.fixed.get("attn", {}),
    )
    return out_p


def _launch_fullfuse(q, k, v, q_pts, k_pts, v_pts, centred_t, head_scale, out_s,
                     pair_repr, pair_weight, modes, split):
    kernels = _kernels(_interpreting())
    b, n, h, d = q.shape
    p3, vp3, c = q_pts.shape[2], v_pts.shape[3], pair_repr.shape[3]
    dev = q.device
    if split is None:
        split = _default_split(b, n, dev)
    # Each split covers a multiple of 64 keys (every BLOCK_N divides it) and none is empty.
    split_len = 64 * triton.cdiv(triton.cdiv(n, split), 64)
    split = triton.cdiv(n, split_len)
    out_p = torch.empty(split, b, n, h, vp3, dtype=torch.float32, device=dev)
    if split == 1:
        os_buf, lse = out_s.unsqueeze(0), out_p  # lse unused
    else:
        os_buf = torch.empty(split, b, n, h, d, dtype=torch.float32, device=dev)
        lse = torch.empty(split, b, n, h, dtype=torch.float32, device=dev)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), split, b)
    kernel = kernels.fullfuse_fp32 if q.dtype == torch.float32 else kernels.fullfuse
    kernel[grid](
        q, k, v, q_pts, k_pts, v_pts, centred_t, pair_repr, pair_weight, head_scale,
        os_buf, out_p, lse, n, c, split_len, LOG2E / math.sqrt(d),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        os_buf.stride(0), os_buf.stride(1), os_buf.stride(2),
        _pow2(n, 64), H=h, H_PAD=HEADS_PAD, D=d, D_PAD=_pow2(d), P3=p3, VP3=vp3,
        VP3_PAD=_pow2(vp3), C_PAD=_pow2(c), DOT_PRECISION=modes.dot,
        PTS_PRECISION=modes.points, CAST_F32=kernels.interpret and q.dtype != torch.float32,
        WRITE_LSE=split > 1, **kernels.fixed.get("fullfuse", {}),
    )
    if split == 1:
        return out_p[0]
    # Merge the key ranges by their log-sum-exp (flash-decoding): O(S * N * H * (D + 3Vp)).
    weights = torch.softmax(lse * math.log(2.0), dim=0).unsqueeze(-1)  # (S, B, N, H, 1)
    out_s.copy_((weights * os_buf).sum(0))
    return (weights * out_p).sum(0)


def _default_split(batch: int, length: int, device: torch.device) -> int:
    """Key ranges per query block so that the grid has about two programs per SM."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    query_blocks = batch * -(-length // 32)
    want = -(-2 * sms // query_blocks)
    return max(1, min(want, length // 256))


# ---- the public function --------------------------------------------------------------------


@dataclass
class TritonIPAWeights:
    """The SPEC state_dict, rearranged once for the forward pass."""

    config: IPAConfig
    ln_weight: torch.Tensor  # (node_dim,)
    ln_bias: torch.Tensor  # (node_dim,)
    w_in: torch.Tensor  # (3*H*d + 3*H*(2*Qp + Vp), node_dim): q, k, v, q_pts, k_pts, v_pts
    w_pair: torch.Tensor  # (H, pair_dim)
    head_scale: torch.Tensor  # (H,) fp32: softplus(head_weights) / 2 * log2(e)
    w_out: torch.Tensor  # (node_dim, H*d + 3*H*Vp)
    b_out: torch.Tensor  # (node_dim,)

    @classmethod
    def from_state_dict(cls, state_dict, config: IPAConfig, device, dtype) -> TritonIPAWeights:
        sd = {k: v.detach() for k, v in state_dict.items()}
        put = lambda t: t.to(device=device, dtype=dtype).contiguous()
        w_in = torch.cat([sd[f"{n}.weight"] for n in ("q_proj", "k_proj", "v_proj", "q_pts",
                                                       "k_pts", "v_pts")])
        head_scale = F.softplus(sd["head_weights"].to(torch.float64)) / 2 * LOG2E
        return cls(
            config, put(sd["layer_norm.weight"]), put(sd["layer_norm.bias"]), put(w_in),
            put(sd["pair_bias.weight"]),
            head_scale.to(device=device, dtype=torch.float32).contiguous(),
            put(sd["out_proj.weight"]), put(sd["out_proj.bias"]),
        )


def _frames(pts, rotations, centred_t):
    """Local -> global: p @ R + t, elementwise in fp32 (no TF32). pts (B, N, P, 3)."""
    return (pts.unsqueeze(-1) * rotations.unsqueeze(2)).sum(-2) + centred_t.unsqueeze(2)


def _inverse_frames(pts, rotations, centred_t):
    """Global -> local: (g - t) @ R^T, elementwise in fp32. pts (B, N, P, 3)."""
    return ((pts - centred_t.unsqueeze(2)).unsqueeze(-2) * rotations.unsqueeze(2)).sum(-1)


def triton_ipa(
    weights: TritonIPAWeights,
    node_repr: torch.Tensor,
    pair_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
    *,
    fuse_pair_bias: bool = False,
    math_mode: str = "ieee",
    split: int | None = None,
) -> torch.Tensor:
    """IPA forward (SPEC.md) with the Triton attention core.

    node_repr (B, N, node_dim), pair_repr (B, N, N, pair_dim), translations (B, N, 3),
    rotations (B, N, 3, 3), all in `weights`' dtype and device -> (B, N, node_dim) in that dtype.
    `fuse_pair_bias` selects the fully fused kernel (`triton-fullfuse`); `math_mode` is
    "ieee" or "tf32" (tf32: fp32 inputs only); `split` is passed to the fully fused launcher.
    """
    cfg = weights.config
    validate_inputs(
        cfg, node_repr, pair_repr, translations, rotations,
        dtypes=(weights.w_in.dtype,), device=weights.w_in.device, check_rotations=False,
    )
    _require(split is None or (isinstance(split, int) and split >= 1),
             f"split: expected None or an int >= 1, got {split!r}")
    modes = _modes(node_repr.dtype, math_mode)
    bsz, n, _ = node_repr.shape
    h, d, qp, vp = cfg.heads, cfg.head_dim, cfg.query_points, cfg.value_points
    hd = h * d
    dtype = node_repr.dtype

    # O(N) prologue in PyTorch: LayerNorm, one GEMM for all six projections, frames in fp32.
    x = F.layer_norm(node_repr, (cfg.node_dim,), weights.ln_weight, weights.ln_bias)
    proj = F.linear(x, weights.w_in)  # (B, N, 3*H*d + 3*H*(2Qp+Vp))
    q, k, v = (proj[..., i * hd:(i + 1) * hd].view(bsz, n, h, d) for i in range(3))
    rot = rotations.float()
    trans = translations.float()
    centred_t = (trans - trans.mean(dim=1, keepdim=True)).contiguous()
    pts = _frames(proj[..., 3 * hd:].float().reshape(bsz, n, -1, 3), rot, centred_t)
    q_pts = pts[:, :, : h * qp].reshape(bsz, n, h, 3 * qp).permute(0, 2, 3, 1).contiguous()
    k_pts = pts[:, :, h * qp: 2 * h * qp].reshape(bsz, n, h, 3 * qp).permute(0, 2, 3, 1)
    k_pts = k_pts.contiguous()
    v_pts = pts[:, :, 2 * h * qp:].reshape(bsz, n, h, 3 * vp).transpose(1, 2).contiguous()

    cat = torch.empty(bsz, n, hd + 3 * h * vp, dtype=dtype, device=node_repr.device)
    out_s = cat[..., :hd].view(bsz, n, h, d)
    z = pair_repr.contiguous()
    # The launchers' argument checks are skipped here: every tensor below is built above.
    if fuse_pair_bias:
        out_p = _launch_fullfuse(
            q, k, v, q_pts, k_pts, v_pts, centred_t, weights.head_scale, out_s,
            z, weights.w_pair, modes, split,
        )
    else:
        if modes.cublas_bias and z.is_cuda:
            bias = _cublas_pair_bias(z, weights.w_pair, tf32=modes.dot == "tf32")
        else:
            bias = _launch_pair_bias(z, weights.w_pair, modes.dot)
        out_p = _launch_attention(
            q, k, v, q_pts, k_pts, v_pts, centred_t, weights.head_scale, out_s, bias, modes
        )
        del bias
    local = _inverse_frames(out_p.view(bsz, n, h * vp, 3), rot, centred_t)
    cat[..., hd:] = local.reshape(bsz, n, 3 * h * vp)
    return F.linear(cat, weights.w_out, weights.b_out)


# ---- the variants ---------------------------------------------------------------------------


class Triton(Variant):
    name = "triton"
    description = "Triton flash-style IPA core; pair bias by one GEMM, streamed as (B,H,N,N)"
    devices = ("cpu", "cuda")
    precisions = ("fp32", "tf32", "bf16", "fp16")
    requires = ("triton",)
    limits = {"heads": (1, 16), "query_points": (1, 16), "value_points": (1, 16),
              "head_dim": (8, 128)}
    fuse_pair_bias = False

    def build(self, state_dict, config, device, precision: str | Precision) -> IPAFunction:
        precision = get_precision(precision)
        reasons = self.not_supported_reasons(config, device, precision)
        if reasons:
            raise IPAInputError(f"{self.name}: cannot run here: {'; '.join(reasons)}")
        _kernels(_interpreting())  # import Triton and define the kernels now, not when timed
        weights = TritonIPAWeights.from_state_dict(state_dict, config, device, precision.dtype)
        fuse, mode = self.fuse_pair_bias, precision.math_mode

        def forward(node_repr, pair_repr, translations, rotations):
            return triton_ipa(weights, node_repr, pair_repr, translations, rotations,
                              fuse_pair_bias=fuse, math_mode=mode)

        return forward


class TritonFullFuse(Triton):
    name = "triton-fullfuse"
    description = "Triton IPA core with the pair bias computed in-kernel (z read once, O(N) memory)"
    fuse_pair_bias = True
    # The fp32 (IEEE) kernel's one config exceeds the H200's shared memory above this.
    fp32_max_head_dim = 64

    def not_supported_reasons(self, config, device, precision):
        reasons = super().not_supported_reasons(config, device, precision)
        if (torch.device(device).type == "cuda" and get_precision(precision).name == "fp32"
                and config.head_dim > self.fp32_max_head_dim):
            reasons.append(
                f"head_dim={config.head_dim} > {self.fp32_max_head_dim} in fp32: the IEEE "
                "kernel's one config needs 287 KB of shared memory at head_dim 96 (padded to "
                "128), over the H200's 227 KB per block (measured 2026-12-02)")
        return reasons
