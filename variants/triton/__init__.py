"""The Triton variants, `triton` and `triton-fullfuse` (design and caveats: `variants.py`).

variants.py   the two `Variant` classes; imports no Triton (kernels are imported by `build`)
pipeline.py   the checked public forwards `triton_ipa` and `triton_fullfuse_ipa`, their weights
              and the O(N) PyTorch work around the kernels
pair_bias.py  the (B, H, N, N) pair-bias GEMM: Triton kernel, cuBLAS form, `pair_bias`
attention.py  the streamed per-head flash kernel over that bias: `ipa_attention`
fullfuse.py   the fully fused kernel (bias computed in the key loop, split-key merge):
              `ipa_fullfuse_attention`
common.py     argument checks, dot modes, autotuning versus the interpreter's fixed config
"""
