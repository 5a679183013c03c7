"""The Triton variants, `triton`, `triton-fullfuse`, `triton-pairdot`, `triton-grouped` and the
training variants `triton-train` and `triton-fullfuse-train` (design and caveats: `variants.py`).

variants.py       the `Variant` classes; imports no Triton (kernels are imported by `build`)
pipeline.py       the checked public forwards `triton_ipa`, `triton_fullfuse_ipa`,
                  `triton_grouped_ipa`, `triton_pairdot_ipa` and `triton_train_ipa`, their
                  weights and the O(N) work around the kernels
frames.py         that work's frame transforms as two kernels (prologue, epilogue), used where
                  no autograd is needed
pair_bias.py      the (B, H, N, N) pair-bias GEMM: Triton kernel, cuBLAS form, `pair_bias`
attention.py      the streamed per-head flash kernel over that bias: `ipa_attention`
bias_backward.py  its backward: per-head key and query kernels (dS written over the saved
                  bias), d pair_repr and dW_b in one pass over pair_repr
grouped.py        the pair bias of a group of heads on tensor cores in the key loop of
                  `attention.py`'s per-head step (z read from DRAM once)
fullfuse.py       the fully fused kernel (bias computed in the key loop, split-key merge):
                  `ipa_fullfuse_attention`
backward.py       the fully fused kernel's backward (logits recomputed from pair_repr tile by
                  tile, d pair_repr written once, dW_b by partial sums)
merge.py          the merge of key ranges split over programs (flash-decoding), one launch
core_op.py        both forwards with their backwards as torch custom ops with autograd:
                  `triton_ipa_core`
common.py         argument checks, dot modes, ranges split over programs, autotuning versus the
                  interpreter's fixed config
tf32.py           3xTF32: an fp32 operand split into TF32 parts, a product as three TF32 dots

`interpreter_mismatch` (here, importing no Triton) is every Triton variant's reason not to run
when the interpreter was switched on too late.
"""

import os
import sys

import torch


def interpreter_mismatch(device) -> list[str]:
    """A reason not to run on the CPU when TRITON_INTERPRET=1 was set after the kernel modules
    were imported: `common.py` fixes interpretation at that import, so the kernels would be
    compiled for a GPU. Reads the module table only (imports no Triton)."""
    common = sys.modules.get("variants.triton.common")
    if (common is not None and torch.device(device).type == "cpu" and not common.INTERPRET
            and os.environ.get("TRITON_INTERPRET") == "1"):
        return ["the Triton kernels were defined before TRITON_INTERPRET=1 was set "
                "(set it before variants.triton's kernel modules are imported)"]
    return []
