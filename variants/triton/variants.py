"""Triton IPA: a flash-attention-style kernel for the IPA attention core (issue #4).

What it is. LayerNorm, the six projections (one fused GEMM) and `out_proj` stay in PyTorch:
they are O(N) work (`pipeline.py`); the frame transforms around the kernels are two small
Triton kernels where no autograd is needed (`frames.py`), PyTorch where it is. The O(N^2) part,
logits + softmax + aggregation of the scalar values and of the global-frame value points, is
Triton in the style of FlashAttention-2 (Dao 2023; the Triton fused-attention tutorial): a
program owns a block of queries, loops over key blocks, keeps a running max and sum in fp32
(online softmax, base-2 exponentials) and never writes the (B, H, N, N) logits or attention.

Five registered variants; the first two differ in where the pair bias z . W_b comes from:

* `triton`: one GEMM reads `pair_repr` once and writes the bias as a (B, H, N, N) tensor
  (input dtype; `pair_bias.py`, a Triton GEMM on tensor cores, 3xTF32 in fp32), then the
  attention kernel (`attention.py`), one program per (query block, batch, head), streams its
  head's rows. Extra memory is one N x N x H tensor (768 MiB at N = 4096 in fp32), the rest is
  O(N). This is the fast one.
* `triton-fullfuse`: one kernel (`fullfuse.py`) computes the bias inside the key loop, so
  `pair_repr` is read exactly once and no N x N tensor is ever written (extra memory O(N): 118
  MiB at N = 4096); a program owns a query block for all heads. Triton compiles its 3-D tiles
  with heavy register spills, so it is 2.5x (bf16) to 1.8x (fp32) slower than `triton` at
  N = 4096: kept for its memory and as the measured record (docs/perf-notes.md).
* `triton-pairdot`: problem openfold's fused kernel (`variants/openfold/triton_kernel.py`)
  with its pair values and mask switched off: per key block the z tile times W_b^T for every
  head as a tensor-core dot (3xTF32 in fp32, judged by the fp32 tolerance), pair_repr read
  once, O(N) memory. On the H200 slower than `triton` at every N (latency-bound: one 8-warp
  program per SM; docs/perf-notes.md, seventh session).
* Two training variants, each the forward of one of the above as a torch custom op
  (`core_op.py`) with an exact FlashAttention-2-style backward; the O(N) work around it is
  PyTorch when gradients are wanted, differentiated by autograd, from live parameters (the
  callable's `parameters()` are the trainable tensors by state_dict name); both compile under
  `torch.compile(fullgraph=True)` (under Inductor the gradients are not eager's to the bit,
  ~2e-5 apart in the point weights: the GPU test judges them against the oracle):
  - `triton-train`: `triton`'s forward with an fp32 bias, which its attention kernel
    overwrites with the base-2 logits, saving each row's softmax statistics; the backward
    (`bias_backward.py`) recomputes P per (batch, head) from them, writes dS over the logits
    (no second N x N x H tensor), sums dS for dq, dk and the points' gradients as 3xTF32 GEMMs,
    and writes d pair_repr and partial sums of dW_b in one pass over z. Extra memory:
    d pair_repr + the fp32 buffer + O(N).
  - `triton-fullfuse-train`: `triton-fullfuse`'s kernel; the backward (`backward.py`)
    recomputes the logits, pair bias included, from pair_repr tile by tile, writes d pair_repr
    once and sums dW_b by partial sums; nothing N x N x H is written in either pass.

What differs from the reference (all of it on purpose, none of it changes the function):
* Point distances. fp32 (IEEE) mode computes them directly, sum_{p,c} (q - k)^2. The other
  modes of `triton` (tf32, bf16, fp16) use one 3xTF32 dot of coordinates centred on the query
  block's first frame origin: |q'|^2 + |k'|^2 - 2 q'.k' in fp32-accurate arithmetic. Never the
  uncentred expanded form (SPEC: it cancels catastrophically at 100 A offsets). The centred
  form costs about 2-3e-5 rel_l2 against the oracle (CPU emulation, N = 512-1024), which is
  why fp32 keeps the direct form (its floor is 2e-5) and which is negligible against the tf32
  (2e-3) and bf16/fp16 (1e-2, 5e-2) tolerances. `triton-fullfuse` computes them directly in
  every mode.
* Global-frame points are always fp32, also for bf16/fp16 inputs (the reference rounds 100 A
  coordinates to bf16, i.e. to 0.5 A), and translations are centred on their per-batch mean
  before the frame transform (the output is invariant to that shift). That is most of why
  bf16 errors are 0.04-0.05 of the bf16 reference's.
* Value points are aggregated relative to the first query's frame origin of each block (keys
  that carry weight lie near the queries, so the summands are small); in bf16/fp16 and tf32
  modes that aggregation runs as a TF32 dot (in the attention kernel of `triton` and
  `triton-train` for bf16/fp16, with the distances' cross term, as three bf16 dots of split
  operands: `triton_ipa`'s `half_points="3xbf16"`), in fp32 (IEEE) mode as 3xTF32 in
  `triton`'s attention kernel and as an IEEE dot in the fused kernels.
* Dots: fp32 mode uses 3xTF32 (three TF32 tensor-core products of split operands, about fp32
  accurate; rows say `fp32-3xtf32`) for the (B, H, N, N) bias GEMM, `triton`'s and
  `triton-train`'s attention q.k, p.v and p.v_pts, and the backward kernels' dots, and
  `input_precision="ieee"` FMAs in the other kernels; `tf32` mode uses TF32
  for the scalar dots and the bias; bf16/fp16 inputs use tensor cores with fp32 accumulation. The
  softmax and all accumulators are fp32 in every mode.
* softplus(head_weights) and the 1/sqrt(d) scale are applied in fp32, in base-2 units
  (`variants/base2.py`).

Caveats. Only the two training variants have a backward. Heads 1..16, points 1..16, head_dim
8..128 (padded to powers of two, so e.g. d = 48 does 64-wide dots). IEEE fp32 dots are slow:
Triton lowers them to CUDA-core FMAs at ~13 % of FP32 peak here (docs/perf-notes.md), hence the
3xTF32 forms above. At N <= 1024 the eager forward is bound by the host's time to issue it
(~10 PyTorch ops and five Triton launches), not by the GPU; every Triton kernel here launches
through `launch.DirectLaunch`, which skips Triton's per-call argument binding and autotuner
lookup once a call signature has been seen. Under the CPU interpreter
(`TRITON_INTERPRET=1`, read when the kernel modules are first imported) every dot runs in fp32
(the interpreter's bf16 `tl.dot` is wrong) and a single block-size config is used instead of
autotuning. Inputs may have any strides: the kernels read `pair_repr` through its strides (no
copy), the other inputs go through PyTorch ops.

This module imports no Triton: the kernel modules are imported by `build`, and a missing
Triton is a reason (`requires`), not an ImportError.
"""

from __future__ import annotations

from pathlib import Path

import torch

from variants.base import IPAFunction, Variant
from variants.problem import Precision, get_precision
from variants.triton import interpreter_mismatch


class Triton(Variant):
    name = "triton"
    description = "Triton flash-style IPA core; pair bias by one GEMM, streamed as (B,H,N,N)"
    devices = ("cpu", "cuda")
    precisions = ("fp32", "tf32", "bf16", "fp16")
    requires = ("triton",)
    limits = {"heads": (1, 16), "query_points": (1, 16), "value_points": (1, 16),
              "head_dim": (8, 128)}

    def code_paths(self):
        # the kernels live beside this module; the frames' layouts read openfold's key padding
        variants_dir = Path(__file__).resolve().parent.parent
        return [variants_dir / "triton", variants_dir / "base2.py", variants_dir / "custom_ops.py",
                variants_dir / "openfold" / "triton_kernel.py"]

    def math_mode_label(self, precision, config=None):
        # fp32 IEEE: the pair bias's z dots run as 3xTF32 (`common.dot_modes`)
        from variants.openfold.triton_fused import z_math_mode_label

        return z_math_mode_label(get_precision(precision))

    def not_supported_reasons(self, config, device, precision):
        return (super().not_supported_reasons(config, device, precision)
                + interpreter_mismatch(device))

    @staticmethod
    def _forward_function():
        from variants.triton.pipeline import triton_ipa

        return triton_ipa

    def build(self, state_dict, config, device, precision: str | Precision) -> IPAFunction:
        precision = get_precision(precision)
        self.require_supported(config, device, precision)
        # Imports Triton and defines the kernels now, not when timed.
        forward = self._forward(state_dict, config, device, precision)
        from variants.triton.common import chosen_configs

        forward.kernel_info = chosen_configs
        return forward

    def _forward(self, state_dict, config, device, precision: Precision) -> IPAFunction:
        from variants.triton.pipeline import TritonIPAWeights

        forward_function = self._forward_function()
        weights = TritonIPAWeights.from_state_dict(state_dict, config, device, precision.dtype)
        mode = precision.math_mode

        def forward(node_repr, pair_repr, translations, rotations):
            return forward_function(weights, node_repr, pair_repr, translations, rotations,
                                    math_mode=mode)

        return forward


class TritonFullFuse(Triton):
    name = "triton-fullfuse"
    description = "Triton IPA core with the pair bias computed in-kernel (z read once, O(N) memory)"
    # The fp32 (IEEE) kernel's one config exceeds the H200's shared memory above this.
    fp32_max_head_dim = 64
    math_mode_label = Variant.math_mode_label  # every dot as the precision says

    def not_supported_reasons(self, config, device, precision):
        reasons = super().not_supported_reasons(config, device, precision)
        if (torch.device(device).type == "cuda" and get_precision(precision).name == "fp32"
                and config.head_dim > self.fp32_max_head_dim):
            reasons.append(
                f"head_dim={config.head_dim} > {self.fp32_max_head_dim} in fp32: the IEEE "
                "kernel's one config needs 287 KB of shared memory at head_dim 96 (padded to "
                "128), over the H200's 227 KB per block (measured 2026-12-02)")
        return reasons

    @staticmethod
    def _forward_function():
        from variants.triton.pipeline import triton_fullfuse_ipa

        return triton_fullfuse_ipa


class TritonGrouped(Triton):
    """The pair bias of a group of heads on tensor cores inside the attention's key loop
    (`grouped.py`, issue #17 deliverable 2): z read from DRAM once, O(N) memory. Correct and
    3-6x slower than `triton` on an H100 (spills, one program per SM; `grouped.py` has the
    numbers): kept as the measured record of the design."""

    name = "triton-grouped"
    description = ("Triton IPA core with the pair bias of G heads per program on tensor cores "
                   "in the key loop (z read once, O(N) memory)")

    @staticmethod
    def _forward_function():
        from variants.triton.pipeline import triton_grouped_ipa

        return triton_grouped_ipa


class TritonPairDot(Triton):
    """Problem openfold's fused kernel (`variants/openfold/triton_kernel.py`) run without its
    pair values and mask: per key block the z tile times W_b^T, every head at once, on tensor
    cores (issue #17, deliverable 2)."""

    name = "triton-pairdot"
    description = ("the openfold kernel without pair values: z tile x W_b^T on tensor cores "
                   "(3xTF32 in fp32), z read once, O(N) memory")
    precisions = ("fp32", "bf16", "fp16")
    limits = {**Triton.limits, "pair_dim": (1, 128)}

    def code_paths(self):
        return [*super().code_paths(), Path(__file__).resolve().parent.parent / "openfold"
                / "triton_fused.py"]

    def _forward(self, state_dict, config, device, precision: Precision) -> IPAFunction:
        from variants.triton.pipeline import TritonIPAWeights, pairdot_core, triton_pairdot_ipa

        weights = TritonIPAWeights.from_state_dict(state_dict, config, device, precision.dtype)
        core = pairdot_core(weights, precision.math_mode)

        def forward(node_repr, pair_repr, translations, rotations):
            return triton_pairdot_ipa(weights, core, node_repr, pair_repr, translations,
                                      rotations)

        return forward


def _training_forward(state_dict, config, device, precision: Precision, fused: bool):
    """The training variants' callable: `triton_train_ipa` over fresh parameter tensors, which
    its `parameters()` gives, (name, tensor) pairs named as the SPEC state_dict; they do not
    require grad until the caller says so, and every call reads them (an optimizer step is seen
    by the next call)."""
    from variants.triton.pipeline import training_parameters, triton_train_ipa

    params = training_parameters(state_dict, config, device, precision.dtype)
    mode = precision.math_mode

    def forward(node_repr, pair_repr, translations, rotations):
        return triton_train_ipa(params, config, node_repr, pair_repr, translations, rotations,
                                math_mode=mode, fused=fused)

    forward.parameters = params.items
    return forward


class _TrainingStep:
    """What the training variants add to their forward's class: a backward."""

    supports_backward = True


class TritonTrain(_TrainingStep, Triton):
    """`triton`'s forward as a custom op with an exact backward (`core_op.py`,
    `bias_backward.py`): the forward keeps its (B, H, N, N) fp32 logits, the backward's key
    kernel overwrites them with dS, and one Triton pass over z turns dS into d pair_repr and
    dW_b."""

    name = "triton-train"
    description = ("triton's forward with a flash backward (the saved (B,H,N,N) logits become "
                   "dS; d pair_repr and dW_b in one pass over z): training")

    def _forward(self, state_dict, config, device, precision: Precision) -> IPAFunction:
        return _training_forward(state_dict, config, device, precision, fused=False)


class TritonFullFuseTrain(_TrainingStep, TritonFullFuse):
    """`triton-fullfuse`'s kernel as a custom op with an exact fused backward (`core_op.py`,
    `backward.py`): nothing N x N x H is written in either pass."""

    name = "triton-fullfuse-train"
    description = ("triton-fullfuse's kernel as a custom op with a fused Triton backward "
                   "(training; nothing N x N x H is ever written)")
    # The largest head_dim whose backward kernel fits the H200's 227 KB of shared memory per
    # block, by precision, for value points padded to <= 32 coordinates (Vp <= 10) and beyond:
    # compiled for sm_90 on the CPU machine at every padded head_dim and point width (triton
    # 3.9, docs/perf-notes.md). fp32 past 64 is the forward's limit already.
    backward_max_head_dim = {"tf32": (32, 32), "bf16": (128, 64), "fp16": (128, 64)}

    def not_supported_reasons(self, config, device, precision):
        reasons = super().not_supported_reasons(config, device, precision)
        name = get_precision(precision).name
        wide = 3 * config.value_points > 32
        limit = self.backward_max_head_dim.get(name, (128, 128))[wide]
        if torch.device(device).type == "cuda" and config.head_dim > limit:
            points = f" with value_points={config.value_points} > 10" if wide else ""
            reasons.append(
                f"head_dim={config.head_dim} > {limit} in {name}{points}: the backward kernel "
                "needs more than the H200's 227 KB of shared memory per block (compiled for "
                "sm_90, 2026-12-03)")
        return reasons

    def _forward(self, state_dict, config, device, precision: Precision) -> IPAFunction:
        return _training_forward(state_dict, config, device, precision, fused=True)
