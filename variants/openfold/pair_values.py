"""Problem openfold's pair values, o_pair[b, i, h, :] = sum_j a[b, h, i, j] z[b, i, j, :]
(SPEC-openfold.md step 11), from logits already computed: the third kernel of `triton-bias`
(`triton_bias.py`), after the pair bias and the attention kernel, which leaves each row's
base-2 logits and softmax statistics behind.

One program per (BLOCK_M query rows, BLOCK_C channels of z, batch element), all heads; it
walks the key blocks: a (BLOCK_M, H_PAD, BLOCK_N) tile of logits becomes the final
probabilities a = 2^((s - m) - log2 l) (no online rescaling: the statistics are final) and meets
the (BLOCK_M, BLOCK_N, BLOCK_C) tile of z in one dot batched over the query rows, (H_PAD,
BLOCK_N) @ (BLOCK_N, BLOCK_C) per row, on tensor cores: 3xTF32 for fp32 inputs (fp32-accurate,
both operands split by `tf32.py`), TF32 in math mode tf32, and for 16-bit inputs the
probabilities rounded to z's dtype as the reference's softmax output is (fp32 accumulation).
Reads z once (in BLOCK_C-wide column slices) and the logits c_z / BLOCK_C times (H of every c_z
elements z has per pair: 9 % more traffic per slice at the default layer); writes o_pair in
fp32 into linear_out's input.

Register budget: the accumulator is BLOCK_M x 16 x BLOCK_C fp32 (at 8, 64 and 8 warps: 32 a
thread), the z tile BLOCK_M x BLOCK_N x BLOCK_C (with its TF32 halves, twice that). Compiled
for sm_90 (triton 3.6) the configs below take 96-204 registers without spills (one: 12 words):
~41-48 warp-instructions per (query, key) pair in fp32 and 12-20 in bf16, against the fused kernel's
~184 with 250-370 words spilled (fp32) and ~33 (bf16), which do everything else as well.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from variants.triton.common import HEADS_PAD, autotuned, cast_f32, cdiv, pow2
from variants.triton.tf32 import tf32_hi, to_bf16_rn


@triton.jit(do_not_specialize=["N", "N_KEY"])
def _pair_values_kernel(
    LOGITS,  # (B, H, N, N) fp32 base-2 logits, mask and bias included
    STATS,  # (B, N, H, 3) fp32: each row's max m and log2-sum log2(l) (then a third, unused)
    Z,  # (B, N, N, C) pair_repr, strides (stride_zb, stride_zi, stride_zj, stride_zc)
    OUT,  # (B, N, H, C) view, strides (stride_ob, stride_on, C, 1): receives o_pair
    N,
    stride_zb, stride_zi, stride_zj, stride_zc,
    stride_ob, stride_on,
    N_KEY,  # autotune bucket, unused in the body
    H: tl.constexpr,
    H_PAD: tl.constexpr,
    C: tl.constexpr,
    PRECISION: tl.constexpr,  # "tf32x3" (split here), "tf32", or "ieee" (16-bit z)
    CAST_F32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_c = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, H_PAD)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    m_ok = offs_m < N
    h_ok = offs_h < H
    c_ok = offs_c < C
    row_ok = m_ok[:, None] & h_ok[None, :]  # (BM, H_PAD)

    # a = 2^((s - m) - log2 l), not 2^(s - (m + log2 l)): the rounding of m + log2 l at large
    # |m| would scale whole rows (`variants/triton/bias_backward.py`)
    stats = STATS + ((b * N + offs_m[:, None]) * H + offs_h[None, :]) * 3
    row_max = tl.load(stats, mask=row_ok, other=0.0)[:, :, None]
    log_sum = tl.load(stats + 1, mask=row_ok, other=0.0)[:, :, None]
    s_rows = LOGITS + ((b * H + offs_h[None, :, None]) * N + offs_m[:, None, None]) * N
    s_ok = row_ok[:, :, None]
    z_rows = (Z + b * stride_zb + offs_m[:, None, None] * stride_zi
              + offs_c[None, None, :] * stride_zc)
    z_ok = m_ok[:, None, None] & c_ok[None, None, :]
    acc = tl.zeros([BLOCK_M, H_PAD, BLOCK_C], dtype=tl.float32)
    for j0 in range(0, N, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        s = tl.load(s_rows + offs_n[None, None, :], mask=s_ok & n_ok[None, None, :],
                    other=float("-inf"))
        a = tl.exp2((s - row_max) - log_sum)  # (BM, H_PAD, BN); 0 past N and in padded heads
        z = tl.load(z_rows + offs_n[None, :, None] * stride_zj,
                    mask=z_ok & n_ok[None, :, None], other=0.0)  # (BM, BN, BC)
        if CAST_F32:
            z = z.to(tl.float32)
        if PRECISION == "tf32x3":  # `tf32.dot_split_tf32`'s products, inline: through the
            # helper ptxas spills 30 words instead of 12 in (8, 16, 128, 4 warps) (sm_90 proxy)
            a_hi, z_hi = tf32_hi(a), tf32_hi(z)
            acc = tl.dot(a - a_hi, z_hi, acc, input_precision="tf32")
            acc = tl.dot(a_hi, z - z_hi, acc, input_precision="tf32")
            acc = tl.dot(a_hi, z_hi, acc, input_precision="tf32")
        elif CAST_F32:  # 16-bit z under the interpreter: a rounded as on the GPU, fp32 dot
            if Z.dtype.element_ty == tl.bfloat16:
                a = to_bf16_rn(a)
            acc = tl.dot(a.to(Z.dtype.element_ty).to(tl.float32), z, acc,
                         input_precision="ieee")
        elif PRECISION == "tf32":
            acc = tl.dot(a, z, acc, input_precision="tf32")
        else:
            acc = tl.dot(a.to(z.dtype), z, acc)
    out = (OUT + b * stride_ob + offs_m[:, None, None] * stride_on + offs_h[None, :, None] * C
           + offs_c[None, None, :])
    tl.store(out, acc, mask=s_ok & c_ok[None, None, :])


# BLOCK_M >= num_warps: triton 3.6 puts every warp of a batched dot on its batch axis (the
# query rows), so fewer rows than warps would compute each row more than once
# (docs/perf-notes.md, fifth session). Chosen on the sm_90 proxy (`attention_proxy.py`,
# `openfold_pair_values_*`; triton 3.6): 128-204 registers, no spills, 41-48 warp-instructions
# per pair in fp32 (12-20 in bf16), from one 8-warp program per SM to four 4-warp ones; and
# (8, 16, 128, 4 warps), 35 in fp32 with 12 words spilled. Dropped there: BLOCK_N 64 and
# (4, 32, 128) spill 110-116 words in fp32; (16, 16, 128) and (16, 32, 64) 8-26 words at
# 164-197 KiB of shared memory.
_pair_values = autotuned(
    "pair_values",
    _pair_values_kernel,
    configs=[
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_C": c}, num_warps=w, num_stages=s)
        for m, n, c, w, s in [
            (4, 32, 64, 4, 2), (8, 32, 64, 8, 2), (8, 16, 128, 8, 2), (4, 16, 128, 4, 2),
            (8, 16, 64, 8, 2), (4, 16, 64, 4, 3), (8, 16, 128, 4, 2), (16, 16, 64, 8, 2),
        ]
    ],
    key=["N_KEY", "H_PAD", "C", "PRECISION"],
    interpreted={"BLOCK_M": 8, "BLOCK_N": 32, "BLOCK_C": 64},
)


def launch_pair_values(logits: torch.Tensor, stats: torch.Tensor, pair_repr: torch.Tensor,
                       out: torch.Tensor, precision: str) -> None:
    """o_pair into `out`, unchecked (`triton_bias.BiasForward` builds every operand).

    logits     (B, H, N, N) fp32 contiguous: the attention kernel's base-2 logits
    stats      (B, N, H, 3) fp32 contiguous: its row statistics (max, log2 of the sum)
    pair_repr  (B, N, N, C) any strides
    out        (B, N, H, C) fp32 view with unit channel stride and head stride C
    precision  "tf32x3" (fp32 inputs), "tf32" (fp32, math mode tf32) or "ieee" (16-bit)
    """
    b, h, n, _ = logits.shape
    c = pair_repr.shape[3]
    grid = lambda meta: (cdiv(n, meta["BLOCK_M"]), cdiv(c, meta["BLOCK_C"]), b)
    _pair_values[grid](
        logits, stats, pair_repr, out, n, *pair_repr.stride(), out.stride(0), out.stride(1),
        pow2(n, 64), H=h, H_PAD=HEADS_PAD, C=c, PRECISION=precision,
        CAST_F32=cast_f32(pair_repr.dtype),
    )
