"""fp32 `x @ W^T + b` on tensor cores as 3xTF32: the `triton` forward's two projections (all six
input projections in one GEMM, and out_proj) and problem openfold's fp32 GEMMs (`linear_3xtf32`);
the same with a backward, as a custom op (`linear_3xtf32_op`); and batched, any strides
(`bmm_3xtf32`). The last two serve triton-train's fp32 projections and its sums of dS
(`sums.gemm_ds_sums`).

cuBLAS runs an fp32 GEMM as an SIMT SGEMM (no tensor cores unless TF32 is allowed, which
fp32 "ieee" forbids). At the forward's shapes (M = B N rows, K = 384 or 672, 384-1728 outputs)
that was 37 us of the 90 us `triton` fp32 forward at N = 256 on an H100, and 68 of 397 us at
N = 1024, against 10.5 us for the same two GEMMs in bf16 (2026-12-06,
`gpu_diagnostics/profile_call.py 1024 fp32 triton --pass forward`). Here each product is three
TF32 dots of split operands (`tf32.dot_split_tf32`, split by `tf32_hi`: two integer
instructions an element), accurate to about fp32 like the attention kernel's dots (the rows'
math mode says `fp32-3xtf32`).

Each K block's three dots start from zero, and their sum is added to the fp32 accumulator by
an ordinary FADD. Chained straight into the accumulator (`acc = tl.dot(a, b, acc)`) the
products of all K went through the tensor cores' own accumulation, which truncates where an
FADD rounds to nearest: a bias that grows with the number of chained steps. Measured on an H100
(2026-12-06, B N = 1-4096 rows, float64 reference, `gpu_diagnostics/linear_accuracy.py` at
1ba8bd3): chained, rel_l2 2.5-2.6e-6 (K = 384) and 4.3-4.7e-6 (K = 672), 7-50x cuBLAS's IEEE
SGEMM (0.9-4.6e-7); summed per block of 32, 1.4-1.6e-7, below cuBLAS's; the replayed forward's
time unchanged. With the chained form the `triton` fp32 forward's err_ratio rose from 0.42-0.45
to 1.41-1.66 (N = 256 and 1024); summed per block it is 0.44-0.59.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from variants.custom_ops import custom_op
from variants.triton.common import autotuned, block_configs, cdiv, pow2
from variants.triton.tf32 import dot_split_tf32, tf32_hi

Tensor = torch.Tensor


@triton.jit(do_not_specialize=["M", "M_KEY"])
def _linear_kernel(
    X,  # (BATCH, M, K) fp32, strides (stride_xb, stride_xm, stride_xk)
    W,  # (BATCH, N_OUT, K) fp32, strides (stride_wb, stride_wn, stride_wk)
    BIAS,  # (N_OUT,) fp32 when HAS_BIAS
    OUT,  # (BATCH, M, N_OUT) fp32, contiguous
    M,
    N_OUT,
    K,
    stride_xb, stride_xm, stride_xk,  # (a stride of 1 is specialised on: unit K strides)
    stride_wb, stride_wn, stride_wk,
    M_KEY,  # autotune bucket, unused in the body
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    batch = tl.program_id(2).to(tl.int64)
    X += batch * stride_xb
    W += batch * stride_wb
    OUT += batch * M * N_OUT
    m_ok = offs_m < M
    n_ok = offs_n < N_OUT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(X + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(W + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                    mask=n_ok[None, :] & k_ok[:, None], other=0.0)  # (BLOCK_K, BLOCK_N): W^T
        x_hi, w_hi = tf32_hi(x), tf32_hi(w)
        # summed from zero, then added on the CUDA cores (round to nearest): not chained into
        # `acc` by the tensor cores, whose accumulation truncates (module doc)
        acc += dot_split_tf32(x_hi, x - x_hi, w_hi, w - w_hi,
                              tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32))
    if HAS_BIAS:
        acc += tl.load(BIAS + offs_n, mask=n_ok, other=0.0)[None, :]
    tl.store(OUT + offs_m[:, None] * N_OUT + offs_n[None, :], acc,
             mask=m_ok[:, None] & n_ok[None, :])


_linear = autotuned(
    "linear_3xtf32",
    _linear_kernel,
    configs=block_configs([(32, 64, 32, 4, 3), (64, 64, 32, 4, 3), (64, 128, 32, 4, 3),
                           (128, 64, 32, 4, 3), (128, 128, 32, 8, 3), (64, 32, 64, 4, 3),
                           (32, 32, 64, 4, 4)], names=("BLOCK_M", "BLOCK_N", "BLOCK_K")),
    # the strides: the backward's transposed operands (`linear_3xtf32_op`) tune on their own
    key=["M_KEY", "N_OUT", "K", "HAS_BIAS", "stride_xm", "stride_xk", "stride_wn", "stride_wk"],
    interpreted={"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32},
)


def linear_3xtf32(x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for fp32 tensors on one device, unchecked (the forward built
    them), not differentiable (`linear_3xtf32_op` is): x (..., K) whose leading dimensions
    merge into one (a contiguous tensor, a slice along K, a transpose of a 2-D one), weight
    (N_OUT, K) any strides, bias (N_OUT,) contiguous or None -> (..., N_OUT) contiguous."""
    k = x.shape[-1]
    rows = x.reshape(-1, k)  # a view for the inputs the forwards pass
    m, n_out = rows.shape[0], weight.shape[0]
    out = torch.empty(*x.shape[:-1], n_out, dtype=torch.float32, device=x.device)
    grid = lambda meta: (cdiv(m, meta["BLOCK_M"]), cdiv(n_out, meta["BLOCK_N"]))
    _linear[grid](rows, weight, out if bias is None else bias, out, m, n_out, k,
                  0, *rows.stride(), 0, *weight.stride(), pow2(m, 64), HAS_BIAS=bias is not None)
    return out


def bmm_3xtf32(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`torch.bmm(a, b, out=out)` for fp32 tensors, unchecked: a (BATCH, M, K) and b (BATCH,
    K, N) any strides (a transposed operand is read in place), out (BATCH, M, N) contiguous."""
    batch, m, k = a.shape
    n = b.shape[2]
    grid = lambda meta: (cdiv(m, meta["BLOCK_M"]), cdiv(n, meta["BLOCK_N"]), batch)
    _linear[grid](a, b, out, out, m, n, k, *a.stride(), b.stride(0), b.stride(2), b.stride(1),
                  pow2(m, 64), HAS_BIAS=False)
    return out


# ---- the differentiable form: a custom op (torch.compile keeps it whole; opcheck tests it) ----

@custom_op("ipa_bench::linear_3xtf32")
def linear_3xtf32_op(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """`linear_3xtf32` with a backward of the same GEMMs: dx = dy W, dW = dy^T x (the rows
    summed in blocks of BLOCK_K, each block's sum added by an FADD), db = dy summed."""
    return linear_3xtf32(x, weight, bias)


@linear_3xtf32_op.register_fake
def _linear_fake(x, weight, bias):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


@custom_op("ipa_bench::linear_3xtf32_backward")
def _linear_backward(grad: Tensor, x: Tensor, weight: Tensor, has_bias: bool
                     ) -> tuple[Tensor, Tensor, Tensor]:
    n_out, k = weight.shape
    dy, rows = grad.reshape(-1, n_out), x.reshape(-1, k)
    dx = linear_3xtf32(dy, weight.t()).view(x.shape)
    dw = linear_3xtf32(dy.t(), rows.t())
    db = dy.sum(0) if has_bias else dy.new_empty(0)  # a custom op returns no None
    return dx, dw, db


@_linear_backward.register_fake
def _linear_backward_fake(grad, x, weight, has_bias):
    return (x.new_empty(x.shape), weight.new_empty(weight.shape),
            weight.new_empty(weight.shape[0] if has_bias else 0))


def _linear_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _linear_grads(ctx, grad):
    dx, dw, db = _linear_backward(grad, *ctx.saved_tensors, ctx.has_bias)
    return dx, dw, db if ctx.has_bias else None


linear_3xtf32_op.register_autograd(_linear_grads, setup_context=_linear_setup)
