"""The pair bias of the `triton` variant: bias[b, h, i, j] = sum_c z[b, i, j, c] W_b[h, c],
written once as a (B, H, N, N) tensor in the input dtype for the attention kernel to stream.

A small Triton GEMM computes it, on tensor cores in every dtype: fp32 as 3xTF32 (`dot_modes`;
cuBLAS ran it as a SIMT sgemm at half of the memory bandwidth, and Triton's IEEE dot on FMAs
1.4x slower still), by default with z split in two integer instructions per element
(`tf32.py`), not Triton's own tf32x3 split (five; Nsight Compute, ninth session: the ALU pipe
46 % busy and DRAM 55 % at N = 4096, so the split, not the memory, set the pace). It reads
`pair_repr` once, through its strides: a non-contiguous pair_repr is never copied first.
`cublas_pair_bias` is the same bias by cuBLAS, kept for comparison. Problem openfold's
`triton-bias` adds its residue mask here (`mask`) and has the bias written in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from variants import problem
from variants.triton.common import (
    HEADS_PAD,
    Modes,
    aligned,
    autotuned,
    cast_f32,
    cdiv,
    check_pair_repr,
    check_runnable,
    dot_modes,
    multiple_of_16,
    pow2,
)
from variants.triton.tf32 import dot_split_tf32, tf32_hi


# Sizes that vary per call are not specialised on (divisibility by 16), so that one compile
# per config serves every N: compiles, not launches, dominate short runs. The strides are:
# their divisibility keeps the z loads aligned and the unit channel stride vectorised.
@triton.jit(do_not_specialize=["ROWS", "NN", "N", "ROWS_KEY"])
def _pair_bias_kernel(
    Z,  # (B, N, N, C) pair_repr, strides (stride_zb, stride_zi, stride_zj, stride_zc)
    WB,  # (H, C) pair_bias.weight, contiguous
    OUT,  # (B, H, N, N) bias, contiguous, input dtype or fp32
    MASK,  # (B, N) fp32 residue mask when HAS_MASK (1 = present)
    ROWS,  # B*N*N
    NN,  # N*N
    N,
    C,
    stride_zb, stride_zi, stride_zj, stride_zc,
    scale,  # the bias is scale * z.W_b^T (fp32)
    mask_inf,  # HAS_MASK: plus mask_i * mask_inf * (mask_j - 1)
    ROWS_KEY,  # autotune bucket, unused in the body
    H: tl.constexpr,
    H_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    CAST_F32: tl.constexpr,
    SPLIT_Z: tl.constexpr,  # with DOT_PRECISION "tf32x3": split by `tf32.py`, not by Triton
    HAS_MASK: tl.constexpr,
    ROWS_I64: tl.constexpr,  # `wide_rows`: the row indices in int64
    ALIGNED: tl.constexpr,  # N a multiple of 16 (`common.multiple_of_16`)
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # read BLOCK_R * C elements of z, write BLOCK_R * H: memory-bound (C = 128, H = 12).
    N = multiple_of_16(N, ALIGNED)
    NN = multiple_of_16(NN, ALIGNED)
    ROWS = multiple_of_16(ROWS, ALIGNED)
    pid = tl.program_id(0)
    if ROWS_I64:
        pid = pid.to(tl.int64)
    # Rows (b, i, j) divided in int32 unless there are 2^31 of them (an int64 division is a
    # long software sequence: a third of the kernel's instructions, sm_90 proxy: 46.8 -> 30.5
    # warp-instructions per row), then indices in int64 for the addresses.
    offs_r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_h = tl.arange(0, H_PAD)
    r_ok = offs_r < ROWS
    h_ok = offs_h < H
    b = offs_r // NN
    rem = offs_r - b * NN  # i * N + j
    i = rem // N
    j = rem - i * N
    b, rem, i, j = b.to(tl.int64), rem.to(tl.int64), i.to(tl.int64), j.to(tl.int64)
    z_rows = Z + b * stride_zb + i * stride_zi + j * stride_zj
    acc = tl.zeros([BLOCK_R, H_PAD], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        c_ok = offs_c < C
        z = tl.load(
            z_rows[:, None] + offs_c[None, :] * stride_zc,
            mask=r_ok[:, None] & c_ok[None, :], other=0.0,
        )
        w = tl.load(
            WB + offs_h[None, :] * C + offs_c[:, None],
            mask=h_ok[None, :] & c_ok[:, None], other=0.0,
        )
        if CAST_F32:
            z = z.to(tl.float32)
            w = w.to(tl.float32)
        if SPLIT_Z:
            z_hi, w_hi = tf32_hi(z), tf32_hi(w)
            acc = dot_split_tf32(z_hi, z - z_hi, w_hi, w - w_hi, acc)
        else:
            acc = tl.dot(z, w, acc, input_precision=DOT_PRECISION)
    acc *= scale  # one FMUL an output element (1.0 but for openfold's sqrt(1/3))
    if HAS_MASK:
        mask_i = tl.load(MASK + b * N + i, mask=r_ok, other=1.0)
        mask_j = tl.load(MASK + b * N + j, mask=r_ok, other=1.0)
        acc += (mask_i * mask_inf * (mask_j - 1.0))[:, None]
    out = OUT + (b * H)[:, None] * NN + offs_h[None, :] * NN + rem[:, None]
    tl.store(out, acc.to(OUT.dtype.element_ty), mask=r_ok[:, None] & h_ok[None, :])


# Config lists from compiling for sm_90 and reading register/stack use (cuobjdump): only
# configs without large spills. Under the interpreter, large blocks: its cost is per op and
# per program, not per element.
_pair_bias = autotuned(
    "pair_bias",
    _pair_bias_kernel,
    configs=[
        triton.Config({"BLOCK_R": r, "BLOCK_C": c}, num_warps=w, num_stages=s)
        for r, c, w, s in [
            (64, 64, 4, 3), (128, 32, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3),
            (256, 32, 8, 3), (256, 64, 8, 2), (128, 128, 8, 2), (64, 128, 4, 2),
        ]
    ],
    key=["ROWS_KEY", "C", "H_PAD", "DOT_PRECISION", "SPLIT_Z", "HAS_MASK"],
    interpreted={"BLOCK_R": 1024, "BLOCK_C": 64},
)


def wide_rows(rows: int) -> bool:
    """Whether the bias GEMM's row indices (B N^2 of them, plus a block) pass int32."""
    return rows + 1024 >= 2**31


def launch_pair_bias(pair_repr: torch.Tensor, weight: torch.Tensor, precision: str, *,
                     own_split: bool = True, mask: torch.Tensor | None = None,
                     scale: float = 1.0, mask_inf: float = 0.0,
                     dtype: torch.dtype | None = None):
    """The Triton bias GEMM, unchecked (callers check): (B, N, N, C) any strides, (H, C)
    -> (B, H, N, N) contiguous in `dtype` (default pair_repr's). `own_split` (precision
    "tf32x3"): the operands split by `tf32.py` (default), else by Triton's tf32x3 (for
    comparison). The bias is scaled by `scale`; `mask` ((B, N) fp32 contiguous) adds
    mask_i * mask_inf * (mask_j - 1), problem
    openfold's inf * (mask_i mask_j - 1) less a shift uniform over a masked query row's keys,
    which the softmax cancels (`variants/openfold/triton_fused.py`, "Deviations")."""
    b, n, _, c = pair_repr.shape
    h = weight.shape[0]
    out = torch.empty(b, h, n, n, dtype=dtype or pair_repr.dtype, device=pair_repr.device)
    rows = b * n * n
    grid = lambda meta: (cdiv(rows, meta["BLOCK_R"]),)
    _pair_bias[grid](
        pair_repr, weight, out, out if mask is None else mask, rows, n * n, n, c,
        *pair_repr.stride(), scale, mask_inf, pow2(rows, 1 << 16),
        H=h, H_PAD=HEADS_PAD, DOT_PRECISION=precision, CAST_F32=cast_f32(pair_repr.dtype),
        SPLIT_Z=own_split and precision == "tf32x3", HAS_MASK=mask is not None,
        ROWS_I64=wide_rows(rows), ALIGNED=aligned(n),
    )
    return out


def bias_tensor(pair_repr: torch.Tensor, weight: torch.Tensor, modes: Modes) -> torch.Tensor:
    """The (B, H, N, N) bias as the `triton` forward computes it, unchecked: the Triton GEMM
    in the modes' bias precision."""
    return launch_pair_bias(pair_repr, weight, modes.bias)


def cublas_pair_bias(pair_repr: torch.Tensor, weight: torch.Tensor, *, tf32: bool):
    """The same bias by cuBLAS (torch.matmul / bmm), unchecked: W (H, C) @ z^T, written
    straight in (B, H, N, N) order. TF32 is set for the call and restored (fp32 'ieee' must
    not inherit a global TF32 switch).

    When the rows (i, j) of pair_repr merge (contiguous input, or a slice along the channels),
    one GEMM per batch element covers all N*N rows, through a view. Otherwise (a crop z[:, :n,
    :n], transposed i and j) one strided-batched GEMM per batch element, batched over i, writes
    rows (h, i) of the output in place: no copy either. cuBLAS needs a unit stride in one of the
    two matrix dimensions: a pair_repr whose channel stride is not 1 is copied by torch inside
    the call.
    """
    b, n, _, c = pair_repr.shape
    h = weight.shape[0]
    with problem.math_mode("tf32" if tf32 else "fp32"):
        if n == 1 or pair_repr.stride(1) == n * pair_repr.stride(2):
            # (H, C) @ (B, C, N*N): one GEMM over every row
            return torch.matmul(weight, pair_repr.view(b, n * n, c).transpose(1, 2)).view(
                b, h, n, n)
        out = torch.empty(b, h, n, n, dtype=pair_repr.dtype, device=pair_repr.device)
        w = weight.expand(n, h, c)  # batch stride 0
        for bi in range(b):
            # (N_i batches) (H, C) @ (C, N_j) -> out[bi, :, i, :]
            torch.bmm(w, pair_repr[bi].transpose(1, 2), out=out[bi].transpose(0, 1))
        return out


def pair_bias(pair_repr: torch.Tensor, weight: torch.Tensor, *, math_mode: str = "ieee"):
    """bias[b, h, i, j] = sum_c pair_repr[b, i, j, c] * weight[h, c], by the Triton GEMM.

    pair_repr (B, N, N, C), any strides; weight (H, C) contiguous, H <= 16, same dtype and
    device -> (B, H, N, N) contiguous in pair_repr's dtype (fp32 accumulation).
    """
    check_pair_repr(pair_repr, weight, weight_name="weight")
    precision = dot_modes(pair_repr.dtype, math_mode).bias
    check_runnable("pair_repr", pair_repr)
    return launch_pair_bias(pair_repr, weight, precision)
