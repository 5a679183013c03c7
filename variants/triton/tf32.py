"""Split-precision products for the Triton kernels. 3xTF32: an fp32 operand split into a TF32
high part and an exact remainder, and a product of split operands as three TF32 tensor-core
dots, accurate to about fp32 (rows that use it say `fp32-3xtf32`). 3xBF16: the same with bf16
parts (16 of fp32's 24 significant bits), for kernels whose other dots are 16-bit, so that
every dot of a tile shares one tensor-core layout."""

import triton
import triton.language as tl


@triton.jit
def tf32_hi(x):
    """fp32 x rounded to TF32 (10 mantissa bits, to nearest, ties away from zero): the value
    of cvt.rna.tf32.f32 for finite x, in two integer instructions (Triton's own tf32x3 split
    also tests for inf/NaN: five instructions per element on sm_90). x - tf32_hi(x) is exact."""
    return ((x.to(tl.int32, bitcast=True) + 0x1000) & -0x2000).to(tl.float32, bitcast=True)


@triton.jit
def dot_split_tf32(a_hi, a_lo, b_hi, b_lo, acc):
    """acc + a @ b as three TF32 dots of split operands (x = x_hi + x_lo, `tf32_hi`), the
    small products first, as Triton's tf32x3 orders them."""
    acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")
    acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")
    return tl.dot(a_hi, b_hi, acc, input_precision="tf32")


@triton.jit
def tf32_parts(x, SPLIT: tl.constexpr):
    """(hi, lo) of fp32 x for `dot_parts`: with SPLIT its `tf32_hi` and the exact remainder,
    else (x, 0) (lo then unused). Split once, an operand serves every dot it enters."""
    hi = x
    if SPLIT:
        hi = tf32_hi(x)
    return hi, x - hi


@triton.jit
def dot_parts(a_hi, a_lo, b_hi, b_lo, acc, PRECISION: tl.constexpr):
    """acc + a @ b from `tf32_parts`: for PRECISION "tf32x3" as `dot_split_tf32` (Triton's own
    tf32x3 splits both operands of every dot again, five instructions per element), else one
    dot of the high parts (the operands themselves) in PRECISION."""
    if PRECISION == "tf32x3":
        acc = dot_split_tf32(a_hi, a_lo, b_hi, b_lo, acc)
    else:
        acc = tl.dot(a_hi, b_hi, acc, input_precision=PRECISION)
    return acc


@triton.jit
def bf16_split(x, AS_F32: tl.constexpr):
    """fp32 x as (hi, lo), both bf16: hi = x rounded to bf16, lo = the remainder rounded. With
    AS_F32 (`common.cast_f32`: the interpreter, whose 16-bit dots are wrong) both come back as
    the fp32 values of those bf16 numbers, whose IEEE fp32 products are as exact."""
    hi = x.to(tl.bfloat16)
    lo = (x - hi.to(tl.float32)).to(tl.bfloat16)
    if AS_F32:
        hi = hi.to(tl.float32)
        lo = lo.to(tl.float32)
    return hi, lo


@triton.jit
def dot_split_bf16(a_hi, a_lo, b_hi, b_lo, acc):
    """acc + a @ b as three dots of `bf16_split` operands (fp32 accumulation), the small
    products first (IEEE precision: what fp32 operands under the interpreter need; bf16 dots
    on the GPU ignore it)."""
    acc = tl.dot(a_lo, b_hi, acc, input_precision="ieee")
    acc = tl.dot(a_hi, b_lo, acc, input_precision="ieee")
    return tl.dot(a_hi, b_hi, acc, input_precision="ieee")


@triton.jit
def to_bf16_rn(x):
    """fp32 -> bf16 rounded to nearest, ties to even (torch's rounding, and the GPU's
    cvt.rn.bf16.f32) by integer ops, so that the interpreter, whose own conversion truncates,
    computes it too; NaN stays NaN."""
    bits = x.to(tl.int32, bitcast=True)
    bits += 0x7FFF + ((bits >> 16) & 1)
    rounded = (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return tl.where(x == x, rounded, x.to(tl.bfloat16))
