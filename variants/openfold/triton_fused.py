"""Problem `openfold`'s `triton` variant: the O(N^2) part of OpenFold IPA (SPEC-openfold.md
steps 3-8 and 11) as one fused Triton kernel that reads z exactly once and writes nothing
N x N (issue #18, deliverable 3). The kernel is `variants/openfold/triton_kernel.py`.

What it is. The O(N) work uses the reference module's weights (`make_module`): its projections
(SPEC steps 1-2) as two GEMMs of concatenated weights (q | kv, and the point projections in
fp32) and its linear_out (step 12) in PyTorch; the frames around the kernel are the two
kernels of `variants/triton/frames.py` (convention `frames.OPENFOLD`: PointProjection's
[X | Y | Z] columns, R p + t), as for the simplified problem's Triton forwards. The prologue
reads the point GEMM's output and writes every point operand as the fused kernel reads it
(`FusedCore.operand_layout`: distance rows, padding, TF32 splits), the epilogue the module's
`to_local` (step 8) and the norms (steps 9-10) into linear_out's input. A forward is GEMM q|kv,
GEMM points, the mean translation, the prologue, the kernel, the epilogue and linear_out (bf16:
three casts more: s and the mask to fp32, linear_out's input to bf16): 7 launches in fp32, 10 in
bf16, where the PyTorch form of the frames, the [X | Y | Z] permute, the norms and
`FusedCore`'s preparation made them 30 and 49 (counted on the CPU; tests/test_openfold_frames.py
holds the two to the same result, to an ulp). The kernel is FlashAttention-2's loop (online
softmax in fp32, base 2: `variants/base2.py`) with the pair terms pulled in, as
`triton-fullfuse` does for the simplified problem, plus the pair values o_pair that the
simplified problem lacks.

Design. One program per (query block of BLOCK_M rows, batch element), all heads; it loops over
key blocks of BLOCK_N keys. Per key block it loads the z tile (BLOCK_M, BLOCK_N, c_z) once (the
pipeliner copies it into shared memory asynchronously) and feeds that one buffer to two dots
batched over the query rows i: the pair bias of every head, z_i (BN, c_z) @ W_b^T (c_z, 16),
before the softmax, and the pair values, a_i (16, BN) @ z_i (BN, c_z), after it. Heads are
padded 12 -> 16. The per-head terms (q.k, point distances, p.v, p.v_pts) are dots batched over
heads instead, in a head-major (16, BN, BLOCK_M) layout with the keys as M, so that a small
BLOCK_M pads nothing; the logits and probabilities are permuted between the two layouts once
each per key block. The accumulators live in registers: o_pair (BLOCK_M, 16, c_z), o
(16, C, BLOCK_M), o_pt (16, 3Pv, BLOCK_M), all fp32, rescaled by the online softmax.

Register budget of the o_pair accumulator (default layer: H = 12 -> 16, c_z = 128, C = 16,
Pq = 4, Pv = 8; sm_90: 64 Ki 32-bit registers = 256 KiB per SM, at most 255 per thread).
One query row needs 16 x 128 fp32 = 8 KiB (6 KiB of real heads); a block of BLOCK_M rows
needs BLOCK_M x 8 KiB, held by every thread of the program: at 8 warps (256 threads) that is
8 x BLOCK_M registers per thread: 32 at BLOCK_M = 4, 64 at 8, 128 at 16 (half of each thread's
255 before anything else). Triton 3.9 gives the batched dots' warps to the rows first ([4, 1,
2] for 4 rows and 8 warps: a warp holds 16 heads x 64 channels of one row); triton 3.6, the GPU
machine's, puts every warp on the rows ([8, 1, 1]), so BLOCK_M < num_warps computes the z dots
and o_pair twice or more (the configs added with that knowledge keep BLOCK_M >= num_warps).
What else holds
registers, per thread at BLOCK_M = 4, BLOCK_N = 16, 8 warps, bf16: W_b^T as the bias dot's
operand (c_z x 8 heads per warp, hoisted: 16), the z tile as that dot's other operand (16 keys x
128 channels per warp: 32, transient) and as o_pair's (16 x 64: 16), the head-major tiles
(16 heads x 16 keys x 8 padded queries over 256 threads: 8 each for logits, distances,
probabilities), o and o_pt (8 + 16), the point operands in 3xTF32 (hi and lo halves). ptxas
(sm_90, compiled on the CPU machine with triton 3.9; every config's numbers in
docs/perf-notes.md, "2026-12-03: openfold `triton` forward, compile-time measurements"): bf16
at BLOCK_M = 4 uses 240 registers and no spills, BLOCK_M = 8 255 and 24-104 bytes of stack;
fp32 doubles every operand and 3xTF32 doubles the z operands again: 255 registers plus 64-344
bytes of stack at BLOCK_M = 2 or 4. Triton 3.6 (the H200's; a proxy on it reproduces the GPU's
counts exactly): fp32 BLOCK_M = 4 at 8 warps spills 1-1.4 KiB, bf16 BLOCK_M = 8 0-40 bytes.
Shared memory: the z tile is 16 KiB (bf16) or 32 KiB (fp32) per pipeline stage, the key-side
tiles (k, v, point rows and value points with their TF32 low parts) ~70 KiB in bf16; 148 KiB at
two stages (sm_90 allows 227). So BLOCK_M is capped at 4-8 by the accumulator, and the price is
paid on the key side: every program re-reads the per-key operands (k, v and 36 point coordinates
per head: 2.5 KiB per key in bf16) N / BLOCK_M times, 2.6 GB of L2 traffic at N = 2048, BLOCK_M
= 4, against z's 1.07 GB. Not tried: o_pair in shared memory (Triton has no explicit shared
accumulators), heads or c_z split over programs (z would be read more than once), fp16/bf16
accumulation.

Instruction budget (the kernel is issue-bound: one 8-warp program per SM at 255 registers).
The autotuner chooses among code paths as well as block sizes (constexprs of the configs):
* SPLIT: every tf32x3 dot as three TF32 dots of operands split into TF32 high and low parts
  (`tf32_split`: round to nearest, ties away, as cvt.rna.tf32.f32) once where that is cheap:
  the key side (point rows, value points) and W_b by the host, the query side once per
  program, the z tile and the probabilities in the loop by two integer ops (Triton's own
  tf32x3 splits both operands of every dot in the loop, 5 instructions an element, which was
  half of the bf16 loop). The products and their order are tf32x3's.
* v_pts is stored coordinates x keys, keys zero-padded to a multiple of 64 (`KEY_PAD`), so that
  the 32-bit A operand of p.v_pts is K-contiguous (ldmatrix) and its copies need no clamp.
* ZCH = 2: the z tile in two channel halves, each with its own load, bias dot and o_pair
  accumulator (fewer live operand registers; fp32 spills less).
* LAZY: the accumulators are rescaled only when some running max grew by more than 2^8
  (probabilities then stay <= 2^8, exact in fp32 and within bf16's range): FlashAttention-4's
  trick, exact; it costs a block-wide max per key block.
* TC = 1: fp32 inputs with IEEE dots run p.v and p.v_pts as split TF32 dots on tensor cores
  (the host splits v and v_pts) instead of FMAs. q.k that way too was tried and removed: the
  dot's layout doubles the direct distances' work at BLOCK_M = 4 (docs/perf-notes.md).
* BT: the pair bias dot as W_b z_i^T, (BLOCK_M, H_PAD, BLOCK_N), the logits' own layout (no
  permute); fewer instructions and spills at BLOCK_M = 8 in bf16, but Triton then copies the
  z tile synchronously, and fp32 spills more.
The last config of each list is the previous kernel (Triton's tf32x3, eager rescaling), kept
as the control. Per (query, key) pair, warp-instructions in the key loop: bf16 99 -> 36-62,
fp32 228 -> 164-187 (with spills).

Deviations from the reference (none changes the function):
* Mask: the kernel adds m_i * inf * (m_j - 1), the SPEC's inf * (m_i m_j - 1) less inf on every
  key of a masked query row (m_i = 0), a shift that is uniform over that row's keys, which the
  softmax cancels: equal in exact arithmetic for any inf (taken from the config, never -inf).
  Masked query rows then keep full fp32 precision (the reference's logits at -1e5 keep 1e-3).
* Points are fp32 in every dtype, in a frame centred on each batch element's mean translation
  (the output is invariant to that shift). fp32 computes distances directly, sum (q - k)^2;
  16-bit inputs compute them as one 3xTF32 dot (see SPLIT) of the rows [-2 pw q | pw |
  pw |q|^2] and [k | |k|^2 | 1] (`point_rows`) of the centred points, never the uncentred
  expansion: with
  coordinates within ~70 A of the centre that costs ~1e-4 in the logits, negligible against the
  bf16 tolerance, not against fp32's (measured under the interpreter at N = 70: 3.2e-6 against
  6.2e-7 direct). Value points are summed in fp32 (IEEE, or 3xTF32 for 16-bit inputs).
* Dots (`kernel_precisions`): fp32 inputs use IEEE dots for q.k and p.v and 3xTF32 for the two
  z dots (fp32-accurate on tensor cores; IEEE fp32 dots run on CUDA cores at ~13 % of peak and
  the z dots are 2 x 16 x c_z FMA per pair; with TC the configs may run p.v and p.v_pts as
  3xTF32 too); bf16/fp16 use tensor cores with fp32 accumulation.
  The logits, softmax and every accumulator are fp32; o_pair is rounded to the input dtype only
  where linear_out reads it.

Caveats. Forward only. Heads 1..16, c_z, c_hidden <= 128, points <= 16 (`MAX_SIZES`). Speed
on the H200 (N = 2048, B = 1, default layer; results/h200-2026-12-03-openfold-triton/): the
kernel 1.10 ms in bf16 and 9.64 ms in fp32 (the first version: 6.8 and 28 ms), the forward
2.20 and 10.7 ms with the frames still in PyTorch; docs/perf-notes.md says what bounds each.
Under the interpreter (`TRITON_INTERPRET=1`, read when the kernel module is first imported)
every dot runs in numpy fp32 and one block-size config is used.

`FusedCore` holds the kernel's weights and, given (B, N, H, 3P) points, prepares its operands
(point layouts, TF32 splits); both forwards that use it (this one, and problem simplified's
`triton-pairdot`, the same core with the pair values and the mask switched off:
`variants/triton/pipeline.py`) have `frames.prologue` write them instead where no autograd is
needed, which for this forward is always.

This module imports no Triton: `build` imports the kernel module, and a missing Triton is a
reason (`requires`), not an ImportError.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from variants.base import IPAFunction, Variant
from variants.base2 import LOG2E
from variants.openfold.problem import OpenFoldConfig, not_supported_reasons, validate_inputs
from variants.openfold.reference import OpenFoldIPA, make_module
from variants.problem import Precision, get_precision
from variants.triton import interpreter_mismatch

# The kernel's padded axes: heads to 16 (a power of two, >= the 16 a tensor-core dot needs),
# c_hidden, c_z and 3 * Pv to powers of two >= 16. Past these the register budget of the
# docstring does not hold (c_z) or the kernels' shared helpers refuse (heads).
MAX_SIZES = {"heads": 16, "head_dim": 128, "query_points": 16, "value_points": 16,
             "pair_dim": 128}


def kernel_precisions(dtype: torch.dtype, math_mode: str) -> tuple[str, str, str]:
    """The `input_precision` of the kernel's dots for one dtype: (q.k and p.v, the two z dots,
    the fp32 point dots p.v_pts and distances).

    `dot_modes` (the simplified kernels' table) checks the arguments and gives bf16/fp16 their
    tensor-core dots with fp32 accumulation. Its fp32 mode ("ieee" everywhere) is kept for
    q.k and p.v but not for the two z dots: Triton lowers IEEE fp32 dots to CUDA-core FMAs at
    ~13 % of peak (docs/perf-notes.md), and the z dots are 2 * 16 * c_z FMA per pair, 8x the
    z read; 3xTF32 keeps them fp32-accurate on tensor cores. The point dots (fp32 operands in
    every dtype) are IEEE in fp32 and 3xTF32 for 16-bit inputs, never plain TF32 (a TF32
    rounding of 70 A coordinates is 0.03 A). The interpreter computes every dot in numpy fp32.
    """
    from variants.triton.common import dot_modes

    modes = dot_modes(dtype, math_mode)
    if dtype == torch.float32:
        return modes.dot, "tf32x3", modes.points
    return modes.dot, modes.dot, "tf32x3"


def z_math_mode_label(precision: Precision) -> str:
    """`math_mode` of the fused kernel's rows: fp32 IEEE runs its z dots as 3xTF32."""
    if precision.name == "fp32" and precision.math_mode == "ieee":
        return "fp32-3xtf32"
    return precision.math_mode


def point_rows(q_pts: torch.Tensor, k_pts: torch.Tensor, point_weight: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The distance term as one dot (16-bit inputs): q_pts, k_pts (B, N, H, P) fp32, centred
    coordinates, point_weight (H,) -> query rows (B, H, P_PAD, N) and key rows
    (B, H, N, P_PAD) whose dot over P_PAD is
    point_weight * |q - k|^2: [-2 pw q | pw | pw |q|^2 | 0 ...] and [k | |k|^2 | 1 | 0 ...],
    P_PAD = the power of two >= max(16, P + 2)."""
    from variants.triton.common import pow2

    B, N, H, P = q_pts.shape
    pw = point_weight.view(1, 1, H, 1)
    rows = pow2(P + 2)
    qa = q_pts.new_zeros(B, N, H, rows)
    ka = k_pts.new_zeros(B, N, H, rows)
    qa[..., :P] = -2.0 * pw * q_pts
    qa[..., P] = pw[..., 0]
    qa[..., P + 1] = pw[..., 0] * (q_pts * q_pts).sum(-1)
    ka[..., :P] = k_pts
    ka[..., P] = (k_pts * k_pts).sum(-1)
    ka[..., P + 1] = 1.0
    return qa.permute(0, 2, 3, 1).contiguous(), ka.transpose(1, 2).contiguous()


def tf32_split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 x -> (hi, lo): hi = x rounded to TF32 (10 mantissa bits, to nearest, ties away from
    zero: cvt.rna.tf32.f32 for finite x), lo = x - hi, exact. The kernel's tf32x3 dots take
    the key-side operands and W_b split here, once, instead of per key block."""
    hi = ((x.contiguous().view(torch.int32) + 0x1000) & -0x2000).view(torch.float32)
    return hi, x - hi


class FusedCore:
    """The fused kernel with its weights split once: the O(N^2) core that problem `openfold`'s
    `triton` (pair bias, pair values, mask) and problem `simplified`'s `triton-pairdot` (pair
    bias alone) share. Its logits, base 2: q.k * q_scale + bias_scale * z.W_b + b_b
    + point_weight * |q_pts - k_pts|^2 (+ the mask's -inf terms)."""

    def __init__(self, w_b: torch.Tensor, b_b: torch.Tensor, point_weight: torch.Tensor, *,
                 dtype: torch.dtype, math_mode: str, q_scale: float, bias_scale: float,
                 inf: float, pair_values: bool):
        """w_b (H, c_z) in `dtype`; b_b and point_weight (H,) fp32, base-2 units (b_b with
        bias_scale applied, point_weight = -w_h / 2 * log2(e)); q_scale in base-2 units,
        bias_scale natural."""
        self.precisions = kernel_precisions(dtype, math_mode)
        self.dtype, self.points_dot = dtype, dtype != torch.float32
        self.w_b, self.w_b_lo = w_b.detach().contiguous(), None
        if self.precisions[1] == "tf32x3":
            self.w_b, self.w_b_lo = tf32_split(self.w_b)
        self.b_b, self.point_weight = b_b.contiguous(), point_weight.contiguous()
        self.q_scale, self.bias_scale, self.inf = q_scale, bias_scale, inf
        self.pair_values = pair_values

    def operand_layout(self):
        """The operand layouts `__call__` builds from (B, N, H, 3P) points, for the fused frame
        prologue (`variants/triton/frames.py`) to write instead (`triton_kernel.launch`
        documents them): distance rows for 16-bit inputs (k's split into TF32 parts), v_pts
        coordinates x keys zero-padded, split where the point dots are 3xTF32, and for fp32
        IEEE dots (the TC configs) the low parts of v_pts and of a contiguous copy of v.
        Mirrors `__call__`'s choices; tests/test_frames.py holds the two to the same result."""
        from variants.triton import frames

        pts_split = self.precisions[2] == "tf32x3"
        tc = self.dtype == torch.float32 and self.precisions[0] == "ieee"
        v_split = (frames.V_HI_LO if pts_split
                   else frames.V_VALUE_LO if tc else frames.V_WHOLE)
        return frames.Layout(point_rows=self.points_dot, split_k=pts_split and self.points_dot,
                             v_padded=True, v_split=v_split, v_low=tc)

    def __call__(self, q, k, v, q_pts, k_pts, v_pts, z, mask, out, o_pt, *,
                 lows: tuple | None = None) -> None:
        """q, k, v (B, N, H, C) views (innermost stride 1); q_pts, k_pts (B, N, H, 3 Pq) and
        v_pts (B, N, H, 3 Pv): global points, fp32, centred per batch element; z
        (B, N, N, c_z) any strides; mask (B, N) fp32 or None. Writes o into out[..., :H C]
        (and o_pair into its last H c_z columns with pair values) and sum_j a_ij v_pts_j
        into o_pt (B, N, H, 3 Pv) fp32.

        `lows`: None, or the points (and v) already in `launch`'s layouts, split into TF32
        parts where this core's dots need it, and this tuple their low parts (k_pts, v_pts,
        v), None where unused: passed on as they are (`FusedForward` and problem simplified's
        `triton-pairdot`, whose fused prologue writes them, `variants/triton/frames.py`)."""
        from variants.openfold.triton_kernel import KEY_PAD, launch
        from variants.triton.common import pow2

        if lows is not None:
            kp_lo, vp_lo, v_lo = lows
        else:
            kp_lo, vp_lo, v_lo = None, None, None
            N, Pv3 = q.shape[1], v_pts.shape[3]
            # (B, H, VP3_PAD, NP): coordinates x keys, both zero-padded (the kernel's key
            # blocks read v_pts unclamped)
            v_pts = F.pad(v_pts.permute(0, 2, 3, 1), (0, -N % KEY_PAD, 0, pow2(Pv3) - Pv3))
            v_pts = v_pts.contiguous()
            if self.points_dot:
                q_pts, k_pts = point_rows(q_pts, k_pts, self.point_weight)
            else:
                q_pts = q_pts.permute(0, 2, 3, 1).contiguous()
                k_pts = k_pts.permute(0, 2, 3, 1).contiguous()
            # TF32 splits of the key side, once here (the query side in the kernel): the
            # operands of tf32x3 dots, and for fp32 IEEE dots those of the TC configs
            if self.precisions[2] == "tf32x3":
                v_pts, vp_lo = tf32_split(v_pts)
                if self.points_dot:
                    k_pts, kp_lo = tf32_split(k_pts)
            if self.dtype == torch.float32 and self.precisions[0] == "ieee":
                # the kernel reads VL with V's strides: v alone, contiguous (splitting all of
                # qkv cost 7 MiB more peak at N = 1536)
                v = v.contiguous()
                v_lo = tf32_split(v)[1]
                if vp_lo is None:
                    vp_lo = tf32_split(v_pts)[1]
        launch(q, k, v, q_pts, k_pts, v_pts, mask, z, self.w_b, self.b_b, self.point_weight,
               out, o_pt, lows=(kp_lo, vp_lo, self.w_b_lo, v_lo), q_scale=self.q_scale,
               inf=self.inf, precisions=self.precisions, points_dot=self.points_dot,
               pair_values=self.pair_values, bias_scale=self.bias_scale)


def point_weight(head_weights: torch.Tensor, query_points: int) -> torch.Tensor:
    """The distance term's factor per head in base-2 units (the kernels' softmax runs on exp2):
    -w_h / 2 * log2(e), w_h = softplus(head_weights_h) * sqrt(1 / (3 Pq 9/2)) (SPEC step 4),
    in head_weights' dtype; differentiable."""
    w = F.softplus(head_weights) * math.sqrt(1.0 / (3 * (query_points * 9.0 / 2)))
    return -0.5 * LOG2E * w


class Projections:
    """What the Triton forwards of this problem share around their O(N^2) kernels: the
    module's four input projections as two GEMMs, the logit factors in base-2 units, the frame
    prologue (global points, centred per batch element) and the epilogue (the inverse frame
    and the norms, then linear_out)."""

    def __init__(self, module: OpenFoldIPA, device: torch.device, dtype: torch.dtype,
                 math_mode: str):
        self.module, self.config, self.device, self.dtype = module, module.config, device, dtype
        self.math_mode = math_mode
        C = module.config.c_hidden
        self.q_scale = math.sqrt(1.0 / (3 * C)) * LOG2E
        self.take_weights()

    def take_weights(self) -> None:
        """The weights as the no-grad forward reads them, from the module's parameters now."""
        with torch.no_grad():
            self.w_qkv, self.b_qkv = self.qkv_weights()
            self.w_points, self.b_points = self.point_projection_weights()
            # from float64: the softplus and the factors in the precision the oracle has
            self.point_weight = point_weight(self.module.head_weights.double(),
                                             self.config.no_qk_points).float()

    def qkv_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The three input projections as one GEMM's weight and bias, in the module's dtype
        (concatenated weights: the same dot products, two fewer cuBLAS calls on the host),
        output [q | k | v]. Differentiable in the module's parameters.

        linear_kv's rows interleave k and v per head (SPEC step 1): as a (H, 2, C) grid of rows
        transposed to (2, H, C) they are [k | v], so that q, k and v are (B, N, H, C) views with
        head stride C. One concatenation of those strided views per tensor, whose backward is
        views: an index of the rows was a gather forward and a zero fill and a scatter back."""
        m, cfg = self.module, self.config
        H, C = cfg.no_heads, cfg.c_hidden

        def q_kv(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            rest = q.shape[1:]
            return torch.cat([q.view(1, H, C, *rest),
                              kv.view(H, 2, C, *rest).transpose(0, 1)]).view(3 * H * C, *rest)

        return (q_kv(m.linear_q.weight, m.linear_kv.weight),
                q_kv(m.linear_q.bias, m.linear_kv.bias))

    def point_projection_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The two point projections as one GEMM's weight and bias, output [q_pts | kv_pts],
        each [X | Y | Z] blocks (PointProjection's layout), upcast to fp32 in every dtype, so
        that global coordinates at 100 A are not rounded to the input dtype (a bf16 ulp there
        is 0.5 A). Differentiable in the module's parameters."""
        points = (self.module.linear_q_points.linear, self.module.linear_kv_points.linear)
        return (torch.cat([p.weight for p in points]).float(),
                torch.cat([p.bias for p in points]).float())

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """`F.linear` for the no-grad forwards: where `dot_modes` splits fp32 dots (fp32 operands
        in "ieee" math: every fp32 input, and the point projection in every dtype) as 3xTF32 on
        tensor cores (`variants/triton/linear.py`: as accurate as cuBLAS's IEEE SGEMM, which
        runs without them), anything else by cuBLAS."""
        from variants.triton.common import dot_modes

        if dot_modes(x.dtype, self.math_mode).split_dots:
            from variants.triton.linear import linear_3xtf32

            return linear_3xtf32(x, weight, bias)
        return F.linear(x, weight, bias)

    def check(self, s, z, translations, rotations, mask) -> None:
        """The inputs' checks before any launch: `validate_inputs` (no value scan), and CUDA
        tensors where the kernels are compiled."""
        from variants.triton.common import check_runnable

        validate_inputs(self.config, s, z, translations, rotations, mask, dtypes=(self.dtype,),
                        device=self.device, check_values=False)
        check_runnable("s", s)

    def project(self, s, translations, rotations, layout):
        """SPEC steps 1-2 on checked inputs (`check`): returns q, k, v (B, N, H, C) views, the
        prologue's `frames.Points` in `layout`, and linear_out's input `cat` (B, N, H (C + 4 Pv
        + c_z)) fp32, uninitialised."""
        from variants.triton import frames

        cfg = self.config
        B, N, _ = s.shape
        H, C, Pq, Pv = cfg.no_heads, cfg.c_hidden, cfg.no_qk_points, cfg.no_v_points
        # Points in fp32, in a frame centred on each batch element's mean translation (the
        # output is invariant to that shift, and the kernels' point sums stay small).
        qkv = self.linear(s, self.w_qkv, self.b_qkv)  # (B, N, 3 H C): [q | k | v]
        # Split, not sliced: under autograd one split's backward is one concatenation, where each
        # slice's is a zero fill and a copy, added up.
        q, k, v = (t.view(B, N, H, C) for t in qkv.split(H * C, dim=-1))
        s_pts = s if self.dtype == torch.float32 else s.float()
        # Each projection's output is [X | Y | Z] blocks of H * P (PointProjection's layout)
        y = self.linear(s_pts, self.w_points, self.b_points)
        mean = translations.mean(dim=1, dtype=torch.float32)  # (B, 3)
        # One launch: R p + (t - mean) of every point, in the kernel's layouts, and the
        # centred translations.
        pts = frames.prologue(y, rotations, translations, mean, heads=H, head_dim=C,
                              query_points=Pq, value_points=Pv, layout=layout,
                              point_weight=self.point_weight, convention=frames.OPENFOLD,
                              values=v)
        # linear_out's input: [o | X | Y | Z | o_pt_norm | o_pair] (SPEC step 12).
        cat = torch.empty(B, N, cfg.out_in_features, dtype=torch.float32, device=s.device)
        return q, k, v, pts, cat

    def finish(self, o_pt, rotations, pts, cat):
        """Epilogue, O(N), one launch: o_pt (B, N, H, 3 Pv) back to each residue's frame (as
        the module's to_local), X | Y | Z and the norms into cat; then linear_out."""
        from variants.triton import frames

        cfg = self.config
        frames.epilogue(o_pt, rotations, pts.centred_t, cat, cfg.no_heads * cfg.c_hidden,
                        convention=frames.OPENFOLD, eps=cfg.eps)
        out = self.module.linear_out
        return self.linear(cat.to(self.dtype), out.weight, out.bias)


class FusedForward(Projections):
    """The callable `triton`'s build returns: the projections (O(N), two GEMMs), the frames
    by `frames.prologue`, the fused kernel (O(N^2)), the inverse frame and the norms by
    `frames.epilogue`, then the reference's linear_out."""

    def __init__(self, module: OpenFoldIPA, device: torch.device, dtype: torch.dtype,
                 math_mode: str):
        super().__init__(module, device, dtype, math_mode)
        with torch.no_grad():
            b_b = (module.linear_b.bias.double() * math.sqrt(1.0 / 3) * LOG2E).float()
            self.core = FusedCore(
                module.linear_b.weight, b_b, self.point_weight, dtype=dtype,
                math_mode=math_mode, q_scale=self.q_scale, bias_scale=math.sqrt(1.0 / 3),
                inf=self.config.inf, pair_values=True)
        # What the frame prologue writes: every point operand as the kernel reads it
        # (`FusedCore.__call__`'s preparation, which it then skips)
        self.layout = self.core.operand_layout()

    @torch.no_grad()
    def __call__(self, s, z, translations, rotations, mask):
        cfg = self.config
        self.check(s, z, translations, rotations, mask)
        q, k, v, pts, cat = self.project(s, translations, rotations, self.layout)
        B, N, H, Pv = s.shape[0], s.shape[1], cfg.no_heads, cfg.no_v_points
        o_pt = torch.empty(B, N, H, 3 * Pv, dtype=torch.float32, device=s.device)
        self.core(q, k, v if pts.v is None else pts.v, pts.q_pts, pts.k_pts, pts.v_pts, z,
                  mask.float().contiguous(), cat, o_pt, lows=pts.lows)
        return self.finish(o_pt, rotations, pts, cat)


class OpenFoldTriton(Variant):
    name = "triton"
    description = ("fused Triton kernel: z read once for the pair bias and the pair values, "
                   "no N x N tensor")
    problems = ("openfold",)
    devices = ("cpu", "cuda")
    precisions = ("fp32", "bf16", "fp16")
    requires = ("triton",)
    forward_class = FusedForward  # what `build` returns, given the module

    def code_paths(self):
        here = Path(__file__).resolve().parent  # the kernel, and the modules it reuses
        triton_dir = here.parent / "triton"
        reused = ("common.py", "frames.py", "launch.py", "linear.py", "merge.py", "pipeline.py",
                  "tf32.py")
        return [here, *(triton_dir / f for f in reused), here.parent / "base2.py",
                here.parent / "custom_ops.py"]  # linear.py's op

    def math_mode_label(self, precision, config=None):
        return z_math_mode_label(get_precision(precision))

    def not_supported_reasons(self, config: OpenFoldConfig, device, precision):
        reasons = (super().not_supported_reasons(config, device, precision)
                   + not_supported_reasons(config, precision))
        columns = config.columns()
        for key, high in MAX_SIZES.items():
            if columns[key] > high:
                reasons.append(f"{key}={columns[key]} outside the supported range [1, {high}]")
        reasons += interpreter_mismatch(device)
        return reasons

    def build(self, state_dict, config: OpenFoldConfig, device,
              precision: str | Precision) -> IPAFunction:
        precision = get_precision(precision)
        self.require_supported(config, device, precision)
        self.import_kernels()
        from variants.triton.common import chosen_configs

        module = make_module(state_dict, config, device, precision.dtype)
        forward = self.forward_class(module, torch.device(device), precision.dtype,
                                     precision.math_mode)
        forward.kernel_info = chosen_configs
        return forward

    def import_kernels(self) -> None:
        """Imports Triton and defines the kernels now, not when timed."""
        from variants.openfold import triton_kernel  # noqa: F401
