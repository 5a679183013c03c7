"""flex-attention: IPA as one compiled FlexAttention call, the anchor users would pick.

What it is. The reference's LayerNorm, projections, frame transforms and `out_proj` (eager
PyTorch, `variants/expanded.py`) around ONE `torch.nn.attention.flex_attention.flex_attention`
call: the point-distance term expanded into dot products (features [q / sqrt(d) | w qp |
-w/2 |qp|^2 | 1] against [k | kp | 1 | -w/2 |kp|^2]), the pair bias z . W_b computed outside
as a (B, H, N, N) tensor and added by a `score_mod`, and the values [v | global-frame value
points] aggregated by the same call. Feature widths are zero-padded to a power of two of at
least 16 (flex's Triton kernels need >= 16 and tile by powers of two; the zeros add nothing).
The flex call is compiled with `torch.compile` (static shapes), which is how FlexAttention is
meant to run: eager `flex_attention` materialises the scores. Each build starts from a reset
Dynamo cache, as `torch-compile` does, so a sweep never reaches the recompile limit past which
Dynamo silently runs eager. Compilation happens on the first call (build time).

Where it loses accuracy. The expanded distance subtracts terms as large as |qp|^2 to get
|qp - kp|^2; their rounding error (size x eps) lands in the logits. The translations are
centred on their per-batch mean first (the output is invariant to a global shift), so the
terms are as large as the structure (its radius), not its distance from the origin (PDB
coordinates sit 50-150 A away): the error does not grow with that offset (fp32, N = 45:
1.7e-6 at 100 A, 2.4e-6 at 1000 A, where the uncentred `sdpa-decomposition` goes from 2.4e-4
to 2.5e-2; tests/test_anchors.py). It grows with the radius squared instead, and the suite's
inputs are a random-walk chain (radius ~ 3.8 A x sqrt(N / 6)): in fp32 it passes up to
N ~ 100 and misses the 2e-5 floor from N ~ 128 (5.9e-5 at N = 512); in bf16/fp16, where the
features, norm columns included, are rounded to the input dtype before the call as a user's
code would, it is 2.5-3x the reference's own error at N = 128 and 6-9x at N = 512 (CPU,
torch 2.13). `known_issues` declares those cells with these figures.

Devices and precisions: CPU (Inductor's C++ flex template) and CUDA (Triton); fp32, tf32
(CUDA), fp16, bf16. Not fp64: Inductor's CPU flex rejects it (CUDA fp64 untried). Backward:
flex attention has one on CUDA only (torch raises NotImplementedError on CPU).
"""

from __future__ import annotations

import torch

from variants.base import requirement_reason
from variants.expanded import ExpandedVariant


def flex_attend(query, key, value, bias):
    """softmax(query @ key^T + bias) @ value in one flex_attention call, the bias added by the
    score_mod. (B, H, N, E), (B, H, N, E), (B, H, N, Ev), (B, H, N, N) -> (B, H, N, Ev)."""
    from torch.nn.attention.flex_attention import flex_attention

    def add_bias(score, b, h, q_idx, kv_idx):
        return score + bias[b, h, q_idx, kv_idx]

    return flex_attention(query, key, value, score_mod=add_bias, scale=1.0)


class FlexAttention(ExpandedVariant):
    name = "flex-attention"
    description = ("one compiled flex_attention call: pair bias in a score_mod, centred points, "
                   "expanded distance")
    precisions = ("fp32", "tf32", "fp16", "bf16")
    supports_backward = True  # on CUDA; flex attention has no CPU backward
    centre = True
    # The docstring's figures (CPU, torch 2.13, AlphaFold2's layer, B = 1 and 2, 3-5 seeds):
    # N <= 97 passes on every seed, N >= 128 fails on some or all. tf32: not measured.
    known_from_length = 128
    known_wrong = {
        "fp32": "centred expanded distance: rel_l2 2.2e-5 at N=128, 3.4e-5 at N=256, 5.9e-5 "
                "at N=512 against the 2e-5 fp32 floor (CPU, B=1; reference 4-5e-6): the error "
                "grows with the structure's radius squared",
        "fp16": "centred expanded distance, norms rounded to fp16: 2.9x the reference's own "
                "error at N=128, 9.1x at N=512 (CPU, B=1)",
        "bf16": "centred expanded distance, norms rounded to bf16: 2.5x the reference's own "
                "error at N=128, 5.6x at N=512 (CPU, B=1)",
    }

    def backward_reasons(self, device):
        if torch.device(device).type == "cpu":
            return ["FlexAttention has no CPU backward in torch (NotImplementedError)"]
        return super().backward_reasons(device)

    @staticmethod
    def padded_width(width: int) -> int:
        """The next power of two >= max(width, 16)."""
        return max(16, 1 << (width - 1).bit_length())

    def not_supported_reasons(self, config, device, precision):
        reasons = super().not_supported_reasons(config, device, precision)
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError:
            reasons.append(f"torch {torch.__version__} has no flex_attention (needs >= 2.5)")
        if torch.device(device).type == "cuda":
            reason = requirement_reason("triton", "cuda")  # Inductor writes flex in Triton
            if reason:
                reasons.append(reason)
        return reasons

    def attention(self):
        """`flex_attend` compiled with static shapes and no graph break allowed, from a reset
        Dynamo cache (one compile per build and shape, never the recompile limit)."""
        torch._dynamo.reset()
        return torch.compile(flex_attend, dynamic=False, fullgraph=True)
