"""A ModelNew file whose C++ does not compile: `load_inline` runs at import time, as in
KernelBench submissions, and its compiler output must reach the user."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = """
torch::Tensor scale(torch::Tensor x) {
    return x * 2  // missing semicolon, on purpose
}
"""

ext = load_inline(name="ipa_bench_compile_error_fixture", cpp_sources=CPP_SOURCE,
                  functions=["scale"], verbose=False)


class ModelNew(nn.Module):
    pass
