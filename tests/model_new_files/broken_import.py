"""A ModelNew file that cannot be imported: it needs a compiled extension that was never
built (the usual state of a kernel file copied to a machine without its build)."""

import torch.nn as nn
from ipa_fused_extension_never_built import ipa_forward  # noqa: F401  (fails on purpose)


class ModelNew(nn.Module):
    pass
