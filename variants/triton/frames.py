"""The frame transforms around the Triton IPA kernels as two Triton kernels, and their two
backward kernels: the simplified problem's (`pipeline._around_kernels`; the PyTorch form that
defines them is kept in tests/test_frames.py: these compute the same elementwise fp32
arithmetic, in the same order) and problem openfold's (`triton_fused.FusedForward`, and
`triton_bias.BiasForward`'s training step; their PyTorch definitions are kept in
tests/test_openfold_frames.py and tests/test_frame_ops.py). Training steps call them through
`frames_op.py`'s custom ops.

Why. Spelled in PyTorch, the work around the attention kernels of one forward was 15 ops
(`triton`, `triton-fullfuse` in fp32; 18 in bf16: the casts) and 23 (fp32) to 42 (bf16) for
`triton-pairdot` (`FusedCore`'s padding, distance rows and TF32 splits on top), each one or
more kernels: on the H200 that was 0.4-0.9 ms of host launches per forward at N = 1024-4096
for a few microseconds of bytes. Now it is LayerNorm, the input GEMM, the mean translation,
the prologue, (the attention kernels,) the epilogue and out_proj: 6 launches; 5 for the fp32
`triton` forward, whose 3xTF32 GEMM normalises its rows itself, and its key ranges' merge is
the epilogue's too (`epilogue` given `merge.KeyRanges`). Problem
openfold's forward had 29 (fp32) and 48 (bf16) ops around its kernel (0.73-1.99 ms per forward
on the H200): now the two GEMMs, the mean, the prologue, the epilogue and linear_out (bf16:
three casts more), 6 and 9.

The two problems differ in `Convention`: the simplified problem's points are xyz triples and
its frames map p to p @ R + t (`SIMPLIFIED`); OpenFold's point projections write [X | Y | Z]
blocks, its frames map p to R p + t, and its out_proj input holds the local value points as
[X | Y | Z] blocks followed by their norms (`OPENFOLD`). The kernels take the column layout as
a constexpr and the column convention as R's strides swapped (R p = p @ R^T).

* `prologue`: the local points (the last columns of `proj`: the simplified problem's one input
  GEMM's output, or openfold's point GEMM's), rotations, translations and the per-batch mean
  translation -> the global points g = p @ R + (t - mean) (or R p + (t - mean)) in the layouts
  the kernels read, and the centred translations. `OPERANDS` is `Operands`' (q_pts, k_pts
  (B, H, 3Qp, N), v_pts (B, H, N, 3Vp)); `FusedCore.operand_layout` the ones problem openfold's
  fused kernel reads (`triton_kernel.launch`), distance rows and TF32 splits included, so that
  `FusedCore` prepares nothing.
* `epilogue`: the kernels' value points (B, N, H, 3Vp) fp32 -> (g - ct) @ R^T (or
  R^T (g - ct)), cast to the output dtype, written into the out_proj input's columns; for
  openfold as [X | Y | Z] blocks, then the norms sqrt(x^2 + y^2 + z^2 + eps).

* `prologue_backward`, `epilogue_backward`: their gradients, for the training steps
  (`frames_op.py` joins each pair as a custom op): the local points', the rotations', the
  translations' (less the mean's part, which `frames_op` adds) and the value points'. One
  program per (block of rows, batch element) loops over the heads, so the frames' gradients,
  sums over every head's points, need no atomics.

One program per (block of BLOCK_ROWS rows, head, batch element); its tiles are a head's points
of those rows (the prologue's: coordinates padded to a power of two, so that every output
layout is a plain strided store; the epilogue's: points, one tile per coordinate). The bytes
are tiny (the default layer, B = 1, N = 4096: 9 MiB written), the point is the launch count.
Math: fp32 elementwise (no dots, so no TF32), products summed in `_frames`' and
`_inverse_frames`' order (the module's einsums': the same); on the GPU the compiler contracts a
product and a sum into one FMA, so the two forms can differ by an ulp or two. Under the
interpreter (numpy, no FMA) they agree to the bit, but for the distance rows' |q|^2 and |k|^2
(summed in another order than `point_rows`' torch sum: an ulp) and openfold's norms (a
correctly rounded root, sqrt.rn on the GPU as torch's CUDA sqrt, where torch's CPU sqrt is an
ulp off for some values). The epilogue rounds to bf16 by integer ops (to nearest, ties to even,
as torch), because the interpreter's own conversion truncates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from variants.openfold.triton_kernel import KEY_PAD
from variants.triton.common import cdiv, direct, pow2, sm_count
from variants.triton.merge import KeyRanges, merged_ranges
from variants.triton.tf32 import tf32_hi, to_bf16_rn

BLOCK_ROWS = 32  # rows (residues) per program: N = 1024, 12 heads -> 384 programs
NUM_WARPS = 4

# How `Layout.v_split` splits the value points into TF32 parts (`triton_fused.tf32_split`).
V_WHOLE, V_HI_LO, V_VALUE_LO = 0, 1, 2


@dataclass(frozen=True)
class Layout:
    """What `prologue` writes. The default: `Operands`' layouts (attention, fullfuse)."""

    point_rows: bool = False  # q, k as `triton_fused.point_rows`' distance rows
    split_k: bool = False  # the k rows as TF32 high part + low part
    v_padded: bool = False  # v_pts (B, H, VP3_PAD, NP), coordinates x keys, zero-padded
    v_split: int = V_WHOLE  # V_HI_LO: v_pts the high part + low part; V_VALUE_LO: values + low
    v_low: bool = False  # the scalar values v too: a contiguous (B, N, H, d) copy + low part


OPERANDS = Layout()  # `pipeline.Operands`' layouts


@dataclass(frozen=True)
class Convention:
    """How a problem holds its points: where `prologue` finds them, how a frame maps them, what
    `epilogue` writes. The default: problem simplified's."""

    xyz_blocks: bool = False  # OpenFold's column layouts: the local points as PointProjection's
    # [X | Y | Z] blocks, and out_proj's input [X | Y | Z | norms] blocks (SPEC-openfold.md
    # steps 2, 9, 10); else xyz triples, and no norms
    column: bool = False  # frames map local p to R p + t (OpenFold), else p @ R + t


SIMPLIFIED = Convention()
OPENFOLD = Convention(xyz_blocks=True, column=True)


@dataclass
class Points:
    """`prologue`'s outputs; `lows` the low parts (k_pts, v_pts, v), None where not written."""

    q_pts: torch.Tensor
    k_pts: torch.Tensor
    v_pts: torch.Tensor
    centred_t: torch.Tensor
    v: torch.Tensor | None
    lows: tuple


@triton.jit
def _to_global(p_rows, base, cs, x, r_rows, ct, stride_rr, stride_rc, ok):
    """Global coordinates x of the (BLOCK, W) tile's points, whose coordinates 0, 1, 2 are at
    proj columns base, base + cs, base + 2 cs: sum_r p_r R[r, x] + ct_x, as `pipeline._frames`
    (products summed over r in order, then the translation). The column convention's R p is
    this with R's strides swapped (`prologue`)."""
    r_x = r_rows + x * stride_rc
    g = (tl.load(p_rows + base, mask=ok, other=0.0).to(tl.float32)
         * tl.load(r_x, mask=ok, other=0.0).to(tl.float32))
    g += (tl.load(p_rows + base + cs, mask=ok, other=0.0).to(tl.float32)
          * tl.load(r_x + stride_rr, mask=ok, other=0.0).to(tl.float32))
    g += (tl.load(p_rows + base + 2 * cs, mask=ok, other=0.0).to(tl.float32)
          * tl.load(r_x + 2 * stride_rr, mask=ok, other=0.0).to(tl.float32))
    return g + ct


@triton.jit
def _point(e, XYZ_BLOCKS: tl.constexpr):
    """The column offset of point e // 3 (of a tile's coordinates e = 3 p + x) from point 0's
    coordinate 0: p in [X | Y | Z] blocks, 3 p in triples."""
    if XYZ_BLOCKS:
        return e // 3
    else:
        return e - e % 3


@triton.jit
def _centred(t_rows, MEAN, b, x, ok, x_ok, stride_tx):
    """t_x - mean_x in fp32 for the tile's coordinates x."""
    return (tl.load(t_rows + x * stride_tx, mask=ok, other=0.0).to(tl.float32)
            - tl.load(MEAN + b * 3 + x, mask=x_ok, other=0.0))


@direct
@triton.jit
def _prologue_kernel(
    PROJ,  # (B, N, ncols) innermost stride 1: the (point) projections' output
    VALS,  # (B, N, H, D) innermost stride 1: the scalar values (V_LOW)
    ROT,  # (B, N, 3, 3) input dtype, any strides (the column convention's: R transposed)
    TRANS,  # (B, N, 3) input dtype, any strides
    MEAN,  # (B, 3) fp32 contiguous: each batch element's mean translation
    PW,  # (H,) fp32 point weight (POINT_ROWS)
    QP, KP, KPL,  # q, k points; KPL k rows' low parts (SPLIT_K)
    VP, VPL,  # value points; VPL their low parts (V_SPLIT)
    V, VL,  # (B, N, H, D) contiguous copy of the scalar values and its low part (V_LOW)
    CT,  # (B, N, 3) fp32 contiguous: the centred translations
    N,
    NP,  # VP's key axis with V_PADDED (rows N..NP are zeros; the grid covers them), else N
    pts_col,  # proj's first point column (simplified: 3 H d; openfold: 0)
    stride_pb, stride_pn,
    stride_vb, stride_vn, stride_vh,
    stride_rb, stride_rn, stride_rr, stride_rc,
    stride_tb, stride_tn, stride_tx,
    H: tl.constexpr,
    P3: tl.constexpr,  # 3 Qp
    QK_W: tl.constexpr,  # the q/k tile's width: pow2(P3), or with POINT_ROWS the rows' P_PAD
    VP3: tl.constexpr,  # 3 Vp
    VP3_PAD: tl.constexpr,  # the v tile's width, and VP's coordinate axis with V_PADDED
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    POINT_ROWS: tl.constexpr,  # q (B, H, QK_W, N) rows [-2 pw q | pw | pw |q|^2 | 0],
    # k (B, H, N, QK_W) rows [k | |k|^2 | 1 | 0]; else q, k (B, H, P3, N) coordinates
    SPLIT_K: tl.constexpr,
    V_PADDED: tl.constexpr,  # VP (B, H, VP3_PAD, NP) zero-padded; else (B, H, N, VP3)
    V_SPLIT: tl.constexpr,  # V_WHOLE, V_HI_LO or V_VALUE_LO (module constants)
    V_LOW: tl.constexpr,
    XYZ_BLOCKS: tl.constexpr,  # PROJ's points as `Convention.xyz_blocks` says, else triples
    BLOCK: tl.constexpr,
):
    pid_n = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    rows = (pid_n * BLOCK + tl.arange(0, BLOCK))[:, None]  # (BLOCK, 1)
    row_ok = rows < N
    p_rows = PROJ + b * stride_pb + rows * stride_pn
    r_rows = ROT + b * stride_rb + rows * stride_rn
    t_rows = TRANS + b * stride_tb + rows * stride_tn
    bh = b * H + h

    # The column of coordinate 0 of head h's point 0, per kind (q, k, v), and the columns
    # between a point's coordinates (Q_CS, KV_CS); `_point` adds point e // 3's offset.
    if XYZ_BLOCKS:
        # OpenFold: q's projection, then kv's, each [X | Y | Z] blocks of H P columns
        # h P + p; a head's kv points are its Qp key then its Vp value points
        KV = (P3 + VP3) // 3
        Q_CS = H * (P3 // 3)
        KV_CS = H * KV
        q_col = pts_col + h * (P3 // 3)
        k_col = pts_col + H * P3 + h * KV
        v_col = k_col + P3 // 3
    else:
        # simplified: xyz triples, H Qp query, H Qp key, H Vp value points, head-major
        Q_CS = 1
        KV_CS = 1
        q_col = pts_col + h * P3
        k_col = pts_col + (H + h) * P3
        v_col = pts_col + 2 * H * P3 + h * VP3

    # The centred translations, once per row (head 0's programs).
    if h == 0:
        x3 = tl.arange(0, 4)[None, :]
        ok3 = row_ok & (x3 < 3)
        tl.store(CT + (b * N + rows) * 3 + x3,
                 _centred(t_rows, MEAN, b, x3, ok3, x3 < 3, stride_tx), mask=ok3)

    # Query and key points of head h: coordinates e = 3 p + x, p < Qp.
    e = tl.arange(0, QK_W)[None, :]
    e_ok = e < P3
    ok = row_ok & e_ok
    x = e % 3
    ct = _centred(t_rows, MEAN, b, x, ok, e_ok, stride_tx)
    pnt = _point(e, XYZ_BLOCKS)
    q = _to_global(p_rows, q_col + pnt, Q_CS, x, r_rows, ct, stride_rr, stride_rc, ok)
    k = _to_global(p_rows, k_col + pnt, KV_CS, x, r_rows, ct, stride_rr, stride_rc, ok)
    if POINT_ROWS:
        # `triton_fused.point_rows`: their dot over the row is pw |q - k|^2
        pw = tl.load(PW + h)
        q = tl.where(e_ok, q, 0.0)
        k = tl.where(e_ok, k, 0.0)
        q_sq = tl.sum(q * q, axis=1)[:, None]
        k_sq = tl.sum(k * k, axis=1)[:, None]
        q = tl.where(e_ok, -2.0 * pw * q,
                     tl.where(e == P3, pw, tl.where(e == P3 + 1, pw * q_sq, 0.0)))
        k = tl.where(e_ok, k, tl.where(e == P3, k_sq, tl.where(e == P3 + 1, 1.0, 0.0)))
        tl.store(QP + (bh * QK_W + e) * N + rows, q, mask=row_ok)
        k_offs = (bh * N + rows) * QK_W + e
        if SPLIT_K:
            k_hi = tf32_hi(k)
            tl.store(KP + k_offs, k_hi, mask=row_ok)
            tl.store(KPL + k_offs, k - k_hi, mask=row_ok)
        else:
            tl.store(KP + k_offs, k, mask=row_ok)
    else:
        qk_offs = (bh * P3 + e) * N + rows
        tl.store(QP + qk_offs, q, mask=ok)
        tl.store(KP + qk_offs, k, mask=ok)

    # Value points of head h: coordinates e = 3 p + x, p < Vp.
    e = tl.arange(0, VP3_PAD)[None, :]
    e_ok = e < VP3
    ok = row_ok & e_ok
    x = e % 3
    ct = _centred(t_rows, MEAN, b, x, ok, e_ok, stride_tx)
    v = _to_global(p_rows, v_col + _point(e, XYZ_BLOCKS), KV_CS, x, r_rows, ct, stride_rr,
                   stride_rc, ok)
    if V_PADDED:
        # coordinates x keys, zeros beyond VP3 and beyond key N (up to NP)
        v = tl.where(ok, v, 0.0)
        v_offs = (bh * VP3_PAD + e) * NP + rows
        v_ok = rows < NP
        if V_SPLIT == 1:
            v_hi = tf32_hi(v)
            tl.store(VP + v_offs, v_hi, mask=v_ok)
            tl.store(VPL + v_offs, v - v_hi, mask=v_ok)
        else:
            tl.store(VP + v_offs, v, mask=v_ok)
            if V_SPLIT == 2:
                tl.store(VPL + v_offs, v - tf32_hi(v), mask=v_ok)
    else:
        tl.store(VP + (bh * N + rows) * VP3 + e, v, mask=ok)

    if V_LOW:
        # the scalar values of head h, contiguous, and their TF32 low parts (fp32 only)
        c = tl.arange(0, D_PAD)[None, :]
        ok = row_ok & (c < D)
        val = tl.load(VALS + b * stride_vb + rows * stride_vn + h * stride_vh + c, mask=ok,
                      other=0.0)
        offs = ((b * N + rows) * H + h) * D + c
        tl.store(V + offs, val, mask=ok)
        tl.store(VL + offs, val - tf32_hi(val), mask=ok)


@triton.jit
def _to_local(d0, d1, d2, r_row, stride_rc, row_ok):
    """Local coordinate r of the (BLOCK, W) tile's points, d_c = g_c - ct_c:
    sum_c d_c R[r, c] (r_row: the rows' R[r, 0]), as `pipeline._inverse_frames` (products
    summed over c in order). The column convention's R^T (g - t) is this with R's strides
    swapped (`epilogue`)."""
    local = d0 * tl.load(r_row, mask=row_ok, other=0.0).to(tl.float32)
    local += d1 * tl.load(r_row + stride_rc, mask=row_ok, other=0.0).to(tl.float32)
    local += d2 * tl.load(r_row + 2 * stride_rc, mask=row_ok, other=0.0).to(tl.float32)
    return local


@triton.jit
def _store(CAT, offs, x, ok):
    """fp32 x into CAT at offs, cast to CAT's dtype (bf16 by `to_bf16_rn`)."""
    if CAT.dtype.element_ty == tl.bfloat16:
        x = to_bf16_rn(x)
    tl.store(CAT + offs, x.to(CAT.dtype.element_ty), mask=ok)


@direct
@triton.jit
def _epilogue_kernel(
    OUT_P,  # (B, N, H, 3 VP) fp32, innermost stride 1: the kernels' global value points
    OS_PARTS,  # MERGE: (S, B, N, H, D) fp32 contiguous, the key ranges' scalar outputs
    OP_PARTS,  # MERGE: (S, B, N, H, 3 VP) fp32 contiguous, their value points (not OUT_P)
    LSE_PARTS,  # MERGE: (S, B, N, H) fp32 contiguous, their rows' log2-sum-exp2
    ROT,  # (B, N, 3, 3) input dtype, any strides (the column convention's: R transposed)
    CT,  # (B, N, 3) fp32 contiguous
    CAT,  # (B, N, W) output dtype, innermost stride 1: out_proj's input
    N,
    S,  # MERGE: the key ranges
    col,  # CAT's first value-point column (H d)
    eps,  # the norms' (XYZ_BLOCKS)
    stride_ob, stride_on, stride_oh,
    stride_rb, stride_rn, stride_rr, stride_rc,
    stride_cb, stride_cn,
    H: tl.constexpr,
    VP: tl.constexpr,  # value points per head
    VP_PAD: tl.constexpr,
    D: tl.constexpr,  # MERGE: the scalar head dim, whose output goes to CAT's columns h D
    D_PAD: tl.constexpr,
    XYZ_BLOCKS: tl.constexpr,  # CAT's columns [X | Y | Z | norms] blocks of H VP (OpenFold),
    # else xyz triples, head-major
    MERGE: tl.constexpr,  # the attention's key ranges merged here first
    # (`merge.merged_ranges`), the scalar output written into CAT too
    BLOCK: tl.constexpr,
):
    pid_n = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    rows = (pid_n * BLOCK + tl.arange(0, BLOCK))[:, None]
    row_ok = rows < N
    p = tl.arange(0, VP_PAD)[None, :]  # the head's value points
    ok = row_ok & (p < VP)
    cat_rows = b * stride_cb + rows * stride_cn
    if MERGE:  # `merge.merged_ranges`, as the merge kernel merges
        r = (b * N + rows) * H + h  # the rows' (b, n, h) in the ranges' (B, N, H)
        per_range = tl.num_programs(2).to(tl.int64) * N * H
        c = tl.arange(0, D_PAD)[None, :]
        c_ok = row_ok & (c < D)
        o_s, _, _ = merged_ranges(OS_PARTS, LSE_PARTS, S, per_range, r, row_ok, c, c_ok, D)
        _store(CAT, cat_rows + h * D + c, o_s, c_ok)
        g0, _, _ = merged_ranges(OP_PARTS, LSE_PARTS, S, per_range, r, row_ok, 3 * p, ok,
                                 3 * VP)
        g1, _, _ = merged_ranges(OP_PARTS, LSE_PARTS, S, per_range, r, row_ok, 3 * p + 1, ok,
                                 3 * VP)
        g2, _, _ = merged_ranges(OP_PARTS, LSE_PARTS, S, per_range, r, row_ok, 3 * p + 2, ok,
                                 3 * VP)
    else:
        g_pts = OUT_P + b * stride_ob + rows * stride_on + h * stride_oh + 3 * p
        g0 = tl.load(g_pts, mask=ok, other=0.0)
        g1 = tl.load(g_pts + 1, mask=ok, other=0.0)
        g2 = tl.load(g_pts + 2, mask=ok, other=0.0)
    ct_rows = CT + (b * N + rows) * 3
    d0 = g0 - tl.load(ct_rows, mask=row_ok, other=0.0)
    d1 = g1 - tl.load(ct_rows + 1, mask=row_ok, other=0.0)
    d2 = g2 - tl.load(ct_rows + 2, mask=row_ok, other=0.0)
    r_rows = ROT + b * stride_rb + rows * stride_rn
    x = _to_local(d0, d1, d2, r_rows, stride_rc, row_ok)
    y = _to_local(d0, d1, d2, r_rows + stride_rr, stride_rc, row_ok)
    z = _to_local(d0, d1, d2, r_rows + 2 * stride_rr, stride_rc, row_ok)
    cat_rows += col
    if XYZ_BLOCKS:
        # SPEC-openfold.md steps 9-10: X, Y, Z, then the norms sqrt(x^2 + y^2 + z^2 + eps)
        # (summed in that order as torch sums; the root correctly rounded, as torch's CUDA
        # sqrt)
        offs = cat_rows + h * VP + p
        _store(CAT, offs, x, ok)
        _store(CAT, offs + H * VP, y, ok)
        _store(CAT, offs + 2 * H * VP, z, ok)
        _store(CAT, offs + 3 * H * VP, tl.sqrt_rn(x * x + y * y + z * z + eps), ok)
    else:
        offs = cat_rows + h * 3 * VP + 3 * p
        _store(CAT, offs, x, ok)
        _store(CAT, offs + 1, y, ok)
        _store(CAT, offs + 2, z, ok)


def _row_grid(rows: int, heads: int, batch: int) -> tuple[int, int, int]:
    return cdiv(rows, BLOCK_ROWS), heads, batch


def prologue(proj: torch.Tensor, rotations: torch.Tensor, translations: torch.Tensor,
             mean: torch.Tensor, *, heads: int, head_dim: int, query_points: int,
             value_points: int, layout: Layout = OPERANDS,
             point_weight: torch.Tensor | None = None, convention: Convention = SIMPLIFIED,
             values: torch.Tensor | None = None) -> Points:
    """Global points and centred translations in one launch, unchecked (the caller builds
    every argument).

    proj          (B, N, ncols), innermost stride 1, the local points in its last
                  3 H (2 Qp + Vp) columns. simplified: the one input GEMM's output
                  [q | k | v | points], the points xyz triples, H Qp query, H Qp key, H Vp
                  value points, each head-major; openfold (`Convention.xyz_blocks`): the two
                  point projections' output, each [X | Y | Z] blocks (SPEC-openfold.md step 2)
    rotations     (B, N, 3, 3), translations (B, N, 3): any strides, any float dtype; applied
                  as `convention.column` says
    mean          (B, 3) fp32 contiguous: the mean translation of each batch element
    layout        what to write (`Layout`); `point_weight` (H,) fp32 with `point_rows`
    values        with `layout.v_low`, the scalar values (B, N, H, d), innermost stride 1;
                  None: proj's columns [2 H d, 3 H d) (simplified)
    returns       fp32 contiguous tensors: by default q_pts, k_pts (B, H, 3 Qp, N), v_pts
                  (B, H, N, 3 Vp) and centred_t (B, N, 3) (`pipeline.Operands`); with
                  `layout`'s options those of `triton_kernel.launch`
    """
    bsz, n, ncols = proj.shape
    h, d, p3, vp3 = heads, head_dim, 3 * query_points, 3 * value_points
    dev, f32 = proj.device, torch.float32
    if convention.column:
        rotations = rotations.transpose(2, 3)  # R p = p @ R^T
    qk_w = pow2(p3 + 2) if layout.point_rows else pow2(p3, 1)
    vp3_pad = pow2(vp3) if layout.v_padded else pow2(vp3, 1)
    np_ = n + (-n % KEY_PAD) if layout.v_padded else n
    new = lambda *shape: torch.empty(*shape, dtype=f32, device=dev)
    if layout.point_rows:
        q_pts, k_pts = new(bsz, h, qk_w, n), new(bsz, h, n, qk_w)
    else:
        q_pts, k_pts = new(bsz, h, p3, n), new(bsz, h, p3, n)
    v_pts = new(bsz, h, vp3_pad, np_) if layout.v_padded else new(bsz, h, n, vp3)
    centred_t = new(bsz, n, 3)
    kp_lo = torch.empty_like(k_pts) if layout.split_k else None
    vp_lo = torch.empty_like(v_pts) if layout.v_split != V_WHOLE else None
    v = v_lo = None
    if layout.v_low:
        if values is None:
            values = proj[..., 2 * h * d:3 * h * d].view(bsz, n, h, d)
        v = torch.empty(bsz, n, h, d, dtype=values.dtype, device=dev)
        v_lo = torch.empty_like(v)
    some = lambda t: q_pts if t is None else t  # a pointer for an argument the kernel skips
    _prologue_kernel[_row_grid(np_, h, bsz)](
        proj, some(values), rotations, translations, mean, some(point_weight),
        q_pts, k_pts, some(kp_lo), v_pts, some(vp_lo), some(v), some(v_lo), centred_t,
        n, np_, ncols - h * (2 * p3 + vp3), proj.stride(0), proj.stride(1),
        *(values.stride()[:3] if values is not None else (0, 0, 0)), *rotations.stride(),
        *translations.stride(),
        H=h, P3=p3, QK_W=qk_w, VP3=vp3, VP3_PAD=vp3_pad, D=d, D_PAD=pow2(d, 1),
        POINT_ROWS=layout.point_rows, SPLIT_K=layout.split_k, V_PADDED=layout.v_padded,
        V_SPLIT=layout.v_split, V_LOW=layout.v_low, XYZ_BLOCKS=convention.xyz_blocks,
        BLOCK=BLOCK_ROWS, num_warps=NUM_WARPS,
    )
    return Points(q_pts, k_pts, v_pts, centred_t, v, (kp_lo, vp_lo, v_lo))


def epilogue(out_p: torch.Tensor | KeyRanges, rotations: torch.Tensor,
             centred_t: torch.Tensor, cat: torch.Tensor, col: int, *,
             convention: Convention = SIMPLIFIED, eps: float = 0.0) -> None:
    """Value points back to each query's frame, into out_proj's input, in one launch,
    unchecked: out_p (B, N, H, 3 Vp) fp32 (innermost stride 1), rotations (B, N, 3, 3) any
    strides, centred_t (B, N, 3) fp32 contiguous; writes the local points, cast to cat's
    dtype, into cat (B, N, W) (innermost stride 1) from column col. simplified: (g - ct) @ R^T
    as xyz triples, cat[..., col:col + 3 H Vp]; openfold (`Convention.xyz_blocks`, `column`):
    R^T (g - ct) as [X | Y | Z] blocks of H Vp, then the norms sqrt(x^2 + y^2 + z^2 + eps),
    cat[..., col:col + 4 H Vp] (SPEC-openfold.md steps 8-10).

    out_p may instead be the attention's key ranges, not yet merged (`merge.KeyRanges`,
    simplified only): they are merged first, as `merge.merge_key_ranges` merges them (the same
    values, one launch and one round trip of the merged outputs fewer), and the merged scalar
    output (B, N, H, d) goes into cat[..., :H d] as well."""
    ranges = out_p if isinstance(out_p, KeyRanges) else None
    if ranges is not None:
        s, bsz, n, h, d = ranges.os_parts.shape
        vp3 = ranges.op_parts.shape[4]
        out_p = ranges.op_parts  # (a pointer for the argument MERGE skips)
    else:
        bsz, n, h, vp3 = out_p.shape
        s, d = 0, 1
        if out_p.stride(3) != 1:
            out_p = out_p.contiguous()
    if convention.column:
        rotations = rotations.transpose(2, 3)  # R^T (g - t) = (g - t) @ R
    parts = (ranges.os_parts, ranges.op_parts, ranges.lse_parts) if ranges else (out_p,) * 3
    _epilogue_kernel[_row_grid(n, h, bsz)](
        out_p, *parts, rotations, centred_t, cat, n, s, col, eps, out_p.stride(0),
        out_p.stride(1), out_p.stride(2), *rotations.stride(), cat.stride(0), cat.stride(1),
        H=h, VP=vp3 // 3, VP_PAD=pow2(vp3 // 3, 1), D=d, D_PAD=pow2(d, 1),
        XYZ_BLOCKS=convention.xyz_blocks, MERGE=ranges is not None,
        BLOCK=BLOCK_ROWS, num_warps=NUM_WARPS,
    )


# ---- the backward: gradients of the two transforms, for training ----------------------------
#
# Tiles (BLOCK, P_PAD, 4): rows x a head's points x their coordinates (padded to 4), and the
# rows' frames (BLOCK, 4, 4) R'[r, c] (R, or R^T under the column convention: the forward's
# strides). One program per (block of rows, batch element) loops over the heads, so the sums
# over every head's points that the frames' gradients need stay in its registers: no atomics.


@triton.jit
def _row_tiles(pid_n, N, P: tl.constexpr, P_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """(rows (BLOCK, 1, 1), points (1, P_PAD, 1), coordinates (1, 1, 4), rows < N, and the
    mask of the (BLOCK, P_PAD, 4) tile's real coordinates)."""
    rows = (pid_n * BLOCK + tl.arange(0, BLOCK))[:, None, None]
    p = tl.arange(0, P_PAD)[None, :, None]
    x = tl.arange(0, 4)[None, None, :]
    row_ok = rows < N
    return rows, p, x, row_ok, row_ok & (p < P) & (x < 3)


@triton.jit
def _frame_tile(ROT, b, rows, row_ok, stride_rb, stride_rn, stride_rr, stride_rc):
    """The rows' R'[r, c] (BLOCK, 4, 4) in fp32, zero outside 3 x 3."""
    r = tl.arange(0, 4)[None, :, None]
    c = tl.arange(0, 4)[None, None, :]
    return tl.load(ROT + b * stride_rb + rows * stride_rn + r * stride_rr + c * stride_rc,
                   mask=row_ok & (r < 3) & (c < 3), other=0.0).to(tl.float32)


@triton.jit
def _store_frame_grads(DROT, DT, b, rows, row_ok, d_rot, d_t, N, stride_db, stride_dn,
                       stride_dr, stride_dc):
    """d R' (BLOCK, 4, 4) through DROT's (R', i.e. transposed) strides and d t (BLOCK, 4) into
    (B, N, 3) contiguous, each cast to its tensor's dtype."""
    r = tl.arange(0, 4)[None, :, None]
    c = tl.arange(0, 4)[None, None, :]
    _store(DROT, b * stride_db + rows * stride_dn + r * stride_dr + c * stride_dc, d_rot,
           row_ok & (r < 3) & (c < 3))
    rows2 = tl.reshape(rows, (rows.shape[0], 1))
    x = tl.arange(0, 4)[None, :]
    _store(DT, (b * N + rows2) * 3 + x, d_t, (rows2 < N) & (x < 3))


@triton.jit
def _local_point_grads(DG, dg_offs, p_rows, d_rows, cols, rot, ok, d_rot, d_t):
    """One kind of a head's points, g = p @ R' + t: from the global points' gradient
    (BLOCK, P_PAD, 4) at DG + dg_offs, stores d p_r = sum_c dg_c R'[r, c] at d_rows + cols (the
    local points' columns, cast to their dtype), and returns d R' + sum_p p_r dg_c and
    d t + sum_p dg_c."""
    dg = tl.load(DG + dg_offs, mask=ok, other=0.0)
    _store(d_rows, cols, tl.sum(dg[:, :, None, :] * rot[:, None, :, :], axis=3), ok)
    p = tl.load(p_rows + cols, mask=ok, other=0.0).to(tl.float32)
    d_rot += tl.sum(p[:, :, :, None] * dg[:, :, None, :], axis=1)
    return d_rot, d_t + tl.sum(dg, axis=1)


@direct
@triton.jit
def _prologue_backward_kernel(
    DQP, DKP,  # (B, H, 3Qp, N) fp32 contiguous: the gradients of q_pts, k_pts
    DVP,  # (B, H, N, 3Vp) fp32 contiguous: of v_pts
    DCT,  # (B, N, 3) fp32 contiguous: of the centred translations
    PROJ,  # (B, N, 3 H (2Qp + Vp)) innermost stride 1: the local points (the forward's PROJ
    # at its point columns)
    ROT,  # (B, N, 3, 3) any strides (the column convention's: R transposed)
    DPROJ,  # like PROJ, contiguous: the local points' gradient
    DROT,  # (B, N, 3, 3) rotations' dtype, strides as ROT's
    DT,  # (B, N, 3) contiguous, fp32: the gradient of the translations less their mean's
    N,
    stride_pb, stride_pn,
    stride_rb, stride_rn, stride_rr, stride_rc,
    stride_db, stride_dn, stride_dr, stride_dc,
    H: tl.constexpr,
    QP: tl.constexpr,  # query (and key) points per head
    VP: tl.constexpr,  # value points per head
    P_PAD: tl.constexpr,  # pow2(max(QP, VP))
    XYZ_BLOCKS: tl.constexpr,  # PROJ's points as `Convention.xyz_blocks` says, else triples
    BLOCK: tl.constexpr,
):
    pid_n = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    rows, p, x, row_ok, q_ok = _row_tiles(pid_n, N, QP, P_PAD, BLOCK)
    v_ok = row_ok & (p < VP) & (x < 3)
    rot = _frame_tile(ROT, b, rows, row_ok, stride_rb, stride_rn, stride_rr, stride_rc)
    p_rows = PROJ + b * stride_pb + rows * stride_pn
    d_rows = DPROJ + (b * N + rows) * (H * 3 * (2 * QP + VP))
    d_rot = tl.zeros([BLOCK, 4, 4], dtype=tl.float32)
    d_t = tl.zeros([BLOCK, 4], dtype=tl.float32)
    for h in tl.static_range(H):  # unrolled: each head's loads issue before the last's sums
        # the columns of head h's points, as `_prologue_kernel` reads them
        if XYZ_BLOCKS:
            q_cols = h * QP + p + x * (H * QP)
            kv_cols = 3 * H * QP + h * (QP + VP) + p + x * (H * (QP + VP))
            v_cols = kv_cols + QP
        else:
            q_cols = h * 3 * QP + 3 * p + x
            kv_cols = (H + h) * 3 * QP + 3 * p + x
            v_cols = 2 * H * 3 * QP + h * 3 * VP + 3 * p + x
        bh = b * H + h
        qk_offs = (bh * 3 * QP + 3 * p + x) * N + rows
        d_rot, d_t = _local_point_grads(DQP, qk_offs, p_rows, d_rows, q_cols, rot, q_ok, d_rot,
                                        d_t)
        d_rot, d_t = _local_point_grads(DKP, qk_offs, p_rows, d_rows, kv_cols, rot, q_ok, d_rot,
                                        d_t)
        d_rot, d_t = _local_point_grads(DVP, (bh * N + rows) * 3 * VP + 3 * p + x, p_rows,
                                        d_rows, v_cols, rot, v_ok, d_rot, d_t)
    rows2 = tl.reshape(rows, (BLOCK, 1))
    x2 = tl.arange(0, 4)[None, :]
    d_t += tl.load(DCT + (b * N + rows2) * 3 + x2, mask=(rows2 < N) & (x2 < 3), other=0.0)
    _store_frame_grads(DROT, DT, b, rows, row_ok, d_rot, d_t, N, stride_db, stride_dn,
                       stride_dr, stride_dc)


@direct
@triton.jit
def _epilogue_backward_kernel(
    DLOC,  # (B, N, W) innermost stride 1: the gradient of the epilogue's columns (its
    # output's dtype): xyz triples, or [X | Y | Z | norms] blocks (XYZ_BLOCKS)
    OUT_P,  # (B, N, H, 3 VP) fp32, innermost stride 1: the kernels' global value points
    ROT,  # (B, N, 3, 3) any strides (the column convention's: R transposed)
    CT,  # (B, N, 3) fp32 contiguous
    DOUT_P,  # (B, N, H, 3 VP) fp32 contiguous: OUT_P's gradient
    DROT,  # (B, N, 3, 3) rotations' dtype, strides as ROT's
    DCT,  # (B, N, 3) fp32 contiguous: CT's gradient
    N,
    eps,  # the norms' (XYZ_BLOCKS)
    stride_lb, stride_ln,
    stride_ob, stride_on, stride_oh,
    stride_rb, stride_rn, stride_rr, stride_rc,
    stride_db, stride_dn, stride_dr, stride_dc,
    H: tl.constexpr,
    VP: tl.constexpr,
    VP_PAD: tl.constexpr,
    XYZ_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid_n = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    rows, p, x, row_ok, ok = _row_tiles(pid_n, N, VP, VP_PAD, BLOCK)
    rot = _frame_tile(ROT, b, rows, row_ok, stride_rb, stride_rn, stride_rr, stride_rc)
    ct = tl.load(CT + (b * N + rows) * 3 + x, mask=row_ok & (x < 3), other=0.0)
    l_rows = DLOC + b * stride_lb + rows * stride_ln
    d_rot = tl.zeros([BLOCK, 4, 4], dtype=tl.float32)
    d_t = tl.zeros([BLOCK, 4], dtype=tl.float32)
    for h in tl.static_range(H):  # unrolled: each head's loads issue before the last's sums
        g_offs = b * stride_ob + rows * stride_on + h * stride_oh + 3 * p + x
        d = tl.where(ok, tl.load(OUT_P + g_offs, mask=ok, other=0.0) - ct, 0.0)
        if XYZ_BLOCKS:
            # local_r = sum_c d_c R'[r, c]; norm = sqrt(|local|^2 + eps) adds d norm local / norm
            d_local = tl.load(l_rows + h * VP + p + x * (H * VP), mask=ok, other=0.0)
            d_local = d_local.to(tl.float32)
            local = tl.sum(d[:, :, None, :] * rot[:, None, :, :], axis=3)
            norm = tl.sqrt(tl.sum(local * local, axis=2) + eps)[:, :, None]
            d_norm = tl.load(l_rows + 3 * H * VP + h * VP + p, mask=row_ok & (p < VP),
                             other=0.0).to(tl.float32)
            d_local += d_norm * local / norm
        else:
            d_local = tl.load(l_rows + h * 3 * VP + 3 * p + x, mask=ok, other=0.0)
            d_local = d_local.to(tl.float32)
        d_g = tl.sum(d_local[:, :, :, None] * rot[:, None, :, :], axis=2)
        tl.store(DOUT_P + ((b * N + rows) * H + h) * 3 * VP + 3 * p + x, d_g, mask=ok)
        d_t -= tl.sum(d_g, axis=1)
        d_rot += tl.sum(d_local[:, :, :, None] * d[:, :, None, :], axis=1)
    _store_frame_grads(DROT, DCT, b, rows, row_ok, d_rot, d_t, N, stride_db, stride_dn,
                       stride_dr, stride_dc)


def _backward_rows(length: int, batch: int, device: torch.device) -> int:
    """Rows per program of the two backward kernels (each loops over the heads): 16, or fewer
    while that leaves under two programs per SM (at N = 1024 on the H200: 4 rows, 256
    programs; the kernels are latency-bound, 0.1 ms with 64 programs of 16 rows). Off the GPU,
    as if on 4 SMs, so that small tests take the smaller blocks."""
    target = 2 * (sm_count(device) if device.type == "cuda" else 4)
    rows = 16
    while rows > 4 and cdiv(length, rows) * batch < target:
        rows //= 2
    return rows


def _frame_grad(rotations: torch.Tensor, convention: Convention
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """(R' as the kernels read it, an empty gradient for `rotations`, and that gradient's
    strides as R''s)."""
    d_rot = torch.empty(rotations.shape, dtype=rotations.dtype, device=rotations.device)
    if convention.column:
        return rotations.transpose(2, 3), d_rot, d_rot.transpose(2, 3).stride()
    return rotations, d_rot, d_rot.stride()


def prologue_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, grad_v: torch.Tensor,
                      grad_centred_t: torch.Tensor, local: torch.Tensor,
                      rotations: torch.Tensor, *, heads: int, query_points: int,
                      value_points: int, convention: Convention = SIMPLIFIED
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of `prologue` (default layout) in one launch, unchecked: from those of
    its outputs q_pts, k_pts (B, H, 3 Qp, N), v_pts (B, H, N, 3 Vp) and centred_t (B, N, 3),
    fp32 contiguous, and its inputs `local` (B, N, 3 H (2 Qp + Vp)) (the local point columns:
    innermost stride 1) and `rotations` -> (d local in local's dtype, contiguous; d rotations
    in theirs; d centred_t + the points' sum over heads and points (B, N, 3) fp32: the
    translations' gradient before the mean's part, which the caller adds)."""
    bsz, n, _ = local.shape
    rot, d_rot, d_strides = _frame_grad(rotations, convention)
    d_local = torch.empty(local.shape, dtype=local.dtype, device=local.device)
    d_t = torch.empty(bsz, n, 3, dtype=torch.float32, device=local.device)
    rows = _backward_rows(n, bsz, local.device)
    _prologue_backward_kernel[(cdiv(n, rows), bsz)](
        grad_q, grad_k, grad_v, grad_centred_t, local, rot, d_local, d_rot, d_t, n,
        local.stride(0), local.stride(1), *rot.stride(), *d_strides,
        H=heads, QP=query_points, VP=value_points,
        P_PAD=pow2(max(query_points, value_points), 1), XYZ_BLOCKS=convention.xyz_blocks,
        BLOCK=rows, num_warps=NUM_WARPS,
    )
    return d_local, d_rot, d_t


def epilogue_backward(grad_local: torch.Tensor, out_p: torch.Tensor, rotations: torch.Tensor,
                      centred_t: torch.Tensor, *, convention: Convention = SIMPLIFIED,
                      eps: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of `epilogue` in one launch, unchecked: from that of the columns it wrote,
    `grad_local` (B, N, 3 H Vp) (openfold: 4 H Vp, with the norms; innermost stride 1), and its
    inputs out_p (B, N, H, 3 Vp) fp32 (innermost stride 1), rotations, centred_t (B, N, 3) fp32
    contiguous -> (d out_p fp32 contiguous, d rotations in their dtype, d centred_t fp32)."""
    bsz, n, h, vp3 = out_p.shape
    rot, d_rot, d_strides = _frame_grad(rotations, convention)
    d_out_p = torch.empty(bsz, n, h, vp3, dtype=torch.float32, device=out_p.device)
    d_ct = torch.empty(bsz, n, 3, dtype=torch.float32, device=out_p.device)
    rows = _backward_rows(n, bsz, out_p.device)
    _epilogue_backward_kernel[(cdiv(n, rows), bsz)](
        grad_local, out_p, rot, centred_t, d_out_p, d_rot, d_ct, n, eps,
        grad_local.stride(0), grad_local.stride(1), *out_p.stride()[:3], *rot.stride(),
        *d_strides, H=h, VP=vp3 // 3, VP_PAD=pow2(vp3 // 3, 1),
        XYZ_BLOCKS=convention.xyz_blocks, BLOCK=rows, num_warps=NUM_WARPS,
    )
    return d_out_p, d_rot, d_ct
