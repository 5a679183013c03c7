"""Problem `openfold`'s `cuda-fused` variant: the layer's O(N^2) core (SPEC-openfold.md steps 3-8
and 11) as one CUDA kernel that reads z once, computes the pair bias and the pair values from the
same staged tile, and writes nothing N x N; every product on tensor cores
(`variants/csrc/ipa_openfold.cu`, whose header gives the design and the register budget of the
o_pair accumulators). Issue #18's exact fused kernel in CUDA, built on cuda-fused's af2 tensor-core
kernel (`ipa_fused_af2_tc.cu`).

Around the kernel it is `triton`'s forward (`triton_fused.Projections`): the projections as two
GEMMs, the frame prologue (global points centred per batch element), and after the kernel the
epilogue (inverse frame, norms) and linear_out, all Triton or cuBLAS. Between them one Triton
launch writes the kernel's operand rows (`cuda_rows.py`: fp32, k and v zero-padded to whole key
tiles; for bf16 z k split into TF32 parts and v rounded to TF32).

Math: fp32 inputs run every product (q.k, p.v, the pair bias, the pair values) as 3xTF32 (the rows
say `fp32-3xtf32`; the fp32 tolerance judges them); bf16 inputs run q.k and the value points' sums
as 3xTF32 (points stay fp32 in every dtype), p.v on TF32, the pair bias with W_b as bf16 hi + lo
parts, exact products of bf16 z, and the pair values with the probabilities rounded to bf16 as
the eager bf16 reference rounds them (`bf16-tf32`).
Distances, softmax and accumulators are fp32. Deviations from the reference, none changing the
function: linear_b's bias is dropped (the softmax cancels it), the mask term is
m_i * inf * (m_j - 1) (as the Triton kernels'), points are centred.

Sizes: OpenFold's exactly (c_hidden 16, 4 query and 8 value points, c_z 128; the kernel's widths
are compile-time constants), 1 to 12 heads; fp32 and bf16. No split of the key range: at B = 1
the grid is ceil(N / 8) CTAs, one per SM, so N below ~1000 leaves SMs idle. Forward only.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from variants.base import IPAFunction, Variant
from variants.base2 import LOG2E
from variants.cuda_ext import CODE_PATHS, load_extension
from variants.openfold.problem import OpenFoldConfig, not_supported_reasons
from variants.openfold.reference import OpenFoldIPA, make_module
from variants.openfold.triton_fused import Projections
from variants.problem import IPAInputError, Precision, get_precision

# The kernel's warp roles dealt over the SM's four schedulers to even out their instructions
# (`openfold_roles` in ipa_openfold.cu); False: in warp order (for A/B, e.g. profile_call.py --ab
# variants.openfold.cuda_fused:BALANCED_ROLES=False).
BALANCED_ROLES = True
# fp32 z: the pair warps share W_b's loads in pairs, each computing both queries' biases over half
# the channels and swapping partial sums through shared memory (`kHalves` in ipa_openfold.cu),
# which halves the W_b traffic that was 48 % of the kernel's shared-memory wavefronts (thirty-second
# session). Read at each call (an A/B switch). H100, replayed forward (thirty-sixth session):
# N = 1024 0.430 -> 0.418 ms, 2048 1.492 -> 1.449, 4096 5.570 -> 5.381.
PAIR_HALVES = True


class CudaFusedForward(Projections):
    """The callable `cuda-fused`'s build returns: `Projections`' projections and frames, the
    operand rows, the kernel (o and o_pair into linear_out's input, o_pt), then the epilogue
    and linear_out."""

    def __init__(self, module: OpenFoldIPA, device: torch.device, dtype: torch.dtype,
                 math_mode: str):
        super().__init__(module, device, dtype, math_mode)
        with torch.no_grad():  # sqrt(1/3) z . W_b in base 2 (SPEC step 3)
            self.pair_weight = (module.linear_b.weight.double() * math.sqrt(1.0 / 3)
                                * LOG2E).float().contiguous()

    @torch.no_grad()
    def __call__(self, s, z, translations, rotations, mask):
        from variants.openfold.cuda_rows import operand_rows  # Triton: imported when run
        from variants.triton import frames

        cfg = self.config
        self.check(s, z, translations, rotations, mask)
        if not z.is_contiguous():  # the kernel copies z's rows as 16-byte chunks
            raise IPAInputError(f"z: expected a contiguous tensor, got strides {z.stride()} for "
                                f"shape {tuple(z.shape)} (call .contiguous())")
        q, k, v, pts, cat = self.project(s, translations, rotations, frames.OPERANDS)
        B, N, H = s.shape[0], s.shape[1], cfg.no_heads

        bf16 = self.dtype != torch.float32  # q.k's 3xTF32 parts; p.v on TF32 (points 3xTF32)
        q_rows, k_rows, v_rows = operand_rows(q, k, v, pts.q_pts, pts.k_pts, pts.v_pts,
                                              split_k=bf16, round_v=bf16)
        o_pt = torch.empty(B, N, H, 3 * cfg.no_v_points, dtype=torch.float32, device=s.device)
        load_extension().openfold_forward(
            q_rows, k_rows, v_rows, z, self.pair_weight, self.point_weight,
            mask.float().contiguous(), cat, o_pt, self.q_scale, cfg.inf, BALANCED_ROLES,
            PAIR_HALVES and not bf16)
        return self.finish(o_pt, rotations, pts, cat)


class OpenFoldCudaFused(Variant):
    name = "cuda-fused"
    description = ("one CUDA kernel on tensor cores: z read once for the pair bias and the pair "
                   "values, no N x N tensor")
    problems = ("openfold",)
    devices = ("cuda",)
    precisions = ("fp32", "bf16")
    # the projections, frames and epilogue around the kernel are `triton`'s
    requires = ("cuda", "nvcc", "ninja", "triton")
    limits = {"no_heads": (1, 12), "c_hidden": (16, 16), "no_qk_points": (4, 4),
              "no_v_points": (8, 8), "c_z": (128, 128)}

    def code_paths(self):
        here = Path(__file__).resolve().parent
        triton_dir = here.parent / "triton"
        return [Path(__file__).resolve(), *CODE_PATHS, here / "triton_fused.py",
                here / "cuda_rows.py",
                *(triton_dir / f for f in ("frames.py", "linear.py", "common.py", "tf32.py")),
                here.parent / "base2.py"]

    def math_mode_label(self, precision, config=None):
        return "fp32-3xtf32" if get_precision(precision).name == "fp32" else "bf16-tf32"

    def not_supported_reasons(self, config: OpenFoldConfig, device, precision):
        return (super().not_supported_reasons(config, device, precision)
                + not_supported_reasons(config, precision))

    def build(self, state_dict, config: OpenFoldConfig, device,
              precision: str | Precision) -> IPAFunction:
        precision = get_precision(precision)
        self.require_supported(config, device, precision)
        load_extension()  # the build time is paid here, never in a timed call
        module = make_module(state_dict, config, device, precision.dtype)
        return CudaFusedForward(module, torch.device(device), precision.dtype,
                                precision.math_mode)
