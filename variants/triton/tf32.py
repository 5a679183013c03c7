"""3xTF32 arithmetic for the Triton kernels: an fp32 operand split into a TF32 high part and
an exact remainder, and a product of split operands as three TF32 tensor-core dots, accurate
to about fp32 (rows that use it say `fp32-3xtf32`)."""

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
