"""The merge of attention computed over S key ranges (flash-decoding), one launch: each range's
output is normalised over its own keys and comes with its rows' log2-sum-exp2 L_s; the whole's
output is sum_s w_s out_s with w_s = 2^(L_s - L), L = log2 sum_s 2^L_s (its log2-sum-exp2).

Used by the `triton-fullfuse` forward, and by `triton`'s under autograd, when they split the
keys of a query block over several programs; the `triton` forward without autograd leaves its
`KeyRanges` to the frames epilogue, which merges them with this arithmetic on the way
(`frames.epilogue`: one launch fewer). A program merges BLOCK_R rows (b, i, h) and walks the S
ranges twice (their maximum, then the weighted sums); it reads and writes
O(S * B * N * H * (D + 3Vp)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from variants.triton.common import cdiv, direct, pow2

BLOCK_R = 32


@dataclass(frozen=True)
class KeyRanges:
    """The attention over S key ranges, not yet merged: each range's outputs, normalised over
    its own keys, os_parts (S, B, N, H, D) and op_parts (S, B, N, H, 3 Vp), and its rows'
    log2-sum-exp2 lse_parts (S, B, N, H), all fp32 contiguous."""

    os_parts: torch.Tensor
    op_parts: torch.Tensor
    lse_parts: torch.Tensor

    def merge(self, out_s: torch.Tensor) -> torch.Tensor:
        """`merge_key_ranges` of these into out_s; returns the point output."""
        return merge_key_ranges(self.os_parts, self.op_parts, self.lse_parts, out_s)


@triton.jit
def merged_ranges(PARTS, LSE_PARTS, S, per_range, rows, row_ok, cols, ok,
                  WIDTH: tl.constexpr):
    """One output of the S key ranges merged, for rows `rows` (BLOCK, 1) of the ranges'
    (B, N, H) (`per_range` rows a range): sum_s w_s PARTS[s, row, cols] / sum_s w_s, with
    w_s = 2^(L_s - top) and top = max_s L_s, summed s = 0, 1, ... in order; PARTS's rows are
    WIDTH elements, `ok` masks the (BLOCK, C) tile. Returns the merged tile, top and the sum
    of the weights ((BLOCK, 1) each). The merge kernel and the frames epilogue both merge
    through this, so their values agree to the bit."""
    top = tl.full(rows.shape, float("-inf"), dtype=tl.float32)
    for s in range(S):
        top = tl.maximum(top, tl.load(LSE_PARTS + s * per_range + rows, mask=row_ok, other=0.0))
    total = tl.zeros(rows.shape, dtype=tl.float32)
    acc = tl.zeros(ok.shape, dtype=tl.float32)
    for s in range(S):
        at = s * per_range + rows
        w = tl.exp2(tl.load(LSE_PARTS + at, mask=row_ok, other=0.0) - top)
        total += w
        acc += w * tl.load(PARTS + at * WIDTH + cols, mask=ok, other=0.0)
    return acc / total, top, total


@direct
@triton.jit(do_not_specialize=["ROWS", "N", "S"])
def _merge_kernel(
    OS_PARTS,  # (S, B, N, H, D) fp32 contiguous
    OP_PARTS,  # (S, B, N, H, VP3) fp32 contiguous
    LSE_PARTS,  # (S, B, N, H) fp32 contiguous
    OS,  # (B, N, H, D) view, strides (sb, sn, D, 1), any float dtype
    OP,  # (B, N, H, VP3) fp32 contiguous
    LSE,  # (B, N, H) fp32 contiguous, written when WRITE_LSE
    ROWS,  # B * N * H
    N,
    S,
    stride_ob, stride_on,
    H: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    VP3: tl.constexpr,
    VP3_PAD: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    rows = (tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R))[:, None]
    r_ok = rows < ROWS
    offs_d = tl.arange(0, D_PAD)[None, :]
    offs_e = tl.arange(0, VP3_PAD)[None, :]
    d_ok = r_ok & (offs_d < D)
    e_ok = r_ok & (offs_e < VP3)
    out_s, top, total = merged_ranges(OS_PARTS, LSE_PARTS, S, ROWS, rows, r_ok, offs_d, d_ok, D)
    out_p, _, _ = merged_ranges(OP_PARTS, LSE_PARTS, S, ROWS, rows, r_ok, offs_e, e_ok, VP3)
    b = rows // (N * H)
    i = (rows // H) % N
    h = rows % H
    tl.store(OS + b * stride_ob + i * stride_on + h * D + offs_d,
             out_s.to(OS.dtype.element_ty), mask=d_ok)
    tl.store(OP + rows * VP3 + offs_e, out_p, mask=e_ok)
    if WRITE_LSE:
        tl.store(LSE + rows, top + tl.log2(total), mask=r_ok)


def merge_key_ranges(out_s_parts: torch.Tensor, out_p_parts: torch.Tensor,
                     lse_parts: torch.Tensor, out_s: torch.Tensor,
                     lse: torch.Tensor | None = None) -> torch.Tensor:
    """Merges `*_parts` (S, B, N, H, ...) fp32 contiguous and their log2-sum-exp2s `lse_parts`
    (S, B, N, H): writes the scalar output into `out_s` ((B, N, H, D), strides (*, *, D, 1),
    its own dtype) and, when given, the rows' log2-sum-exp2 into `lse` ((B, N, H) fp32
    contiguous); returns the point output (B, N, H, 3*Vp) fp32."""
    s, b, n, h, d = out_s_parts.shape
    vp3 = out_p_parts.shape[-1]
    out_p = torch.empty(out_p_parts.shape[1:], dtype=torch.float32, device=out_p_parts.device)
    rows = b * n * h
    _merge_kernel[(cdiv(rows, BLOCK_R),)](
        out_s_parts, out_p_parts, lse_parts, out_s, out_p, out_p if lse is None else lse,
        rows, n, s, out_s.stride(0), out_s.stride(1), H=h, D=d, D_PAD=pow2(d, 1), VP3=vp3,
        VP3_PAD=pow2(vp3, 1), WRITE_LSE=lse is not None, BLOCK_R=BLOCK_R,
    )
    return out_p
