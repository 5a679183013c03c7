"""sdpa-decomposition: IPA as one scaled_dot_product_attention call, the naive decomposition.

What it is. The reference's LayerNorm, projections, frame transforms and `out_proj` (eager
PyTorch, `variants/expanded.py`) around ONE `torch.nn.functional.scaled_dot_product_attention`
call: the point-distance term expanded, ||q - k||^2 = ||q||^2 + ||k||^2 - 2 q.k, into features
[q / sqrt(d) | w qp | -w/2 |qp|^2 | 1] against [k | kp | 1 | -w/2 |kp|^2], the pair bias
z . W_b as an additive float `attn_mask` of shape (B, H, N, N), and the values [v | global-frame
value points] aggregated by the same call. Feature widths are zero-padded to a multiple of 8
(the alignment SDPA's fused CUDA kernels want; the zeros add nothing). Points are NOT centred:
this is the decomposition users write (SPEC, "Measured anchors"), kept as the anchor it is.

Where it loses accuracy, on purpose. The global points sit where the frames are, 50-150 A
from the origin in PDB coordinates, so |qp|^2, |kp|^2 and 2 qp.kp are each about Qp x 1e4 A^2
while their sum, |qp - kp|^2, is a few A^2 between the neighbours that carry the attention:
the rounding error of the big terms (size x eps) swamps the logits. Measured on CPU (torch
2.13, B = 2, N = 97, 100 A): fp32 rel_l2 6.2e-4, 139x the reference's own error and 30x the
2e-5 floor; bf16 2.5 (18x) and fp16 36 (2000x): the softmax attends to the wrong keys; fp64
1e-12, at its floor. The error does not depend on N but on the offset squared (fp32, N = 45:
2.4e-4 at 100 A, 2.5e-2 at 1000 A). `known_issues` declares every cell but N = 1 (a single
key: the softmax is exact) and tf32 (not measured; its floor is above the fp32 error), so its
`mismatch` rows carry the evidence: they are the finding, not a bug to fix.
`flex-attention` centres the points first and has no such offset error.

Devices and precisions: CPU and CUDA, every precision SDPA takes (fp64, fp32, tf32 on CUDA,
fp16, bf16). Backward: SDPA's.
"""

from __future__ import annotations

import torch.nn.functional as F

from variants.expanded import ExpandedVariant


def sdpa_attend(query, key, value, bias):
    """softmax(query @ key^T + bias) @ value in one SDPA call with `bias` as the float mask.
    (B, H, N, E), (B, H, N, E), (B, H, N, Ev), (B, H, N, N) -> (B, H, N, Ev)."""
    return F.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=1.0)


class SdpaDecomposition(ExpandedVariant):
    name = "sdpa-decomposition"
    description = ("one scaled_dot_product_attention call: expanded, uncentred distance; pair "
                   "bias as a float mask")
    supports_backward = True
    centre = False
    # The docstring's figures, for every cell from N = 2 up (`ipa-bench check --device cpu
    # --variant sdpa-decomposition --dtype ...`, 5 seeds). tf32: not measured.
    known_from_length = 2
    known_wrong = {
        "fp64": "uncentred expanded distance: rel_l2 1.0e-12 at the 1e-12 fp64 floor (CPU, "
                "B=2, N=97), failing on some seeds: terms of ~1e4 A^2 x 1.1e-16",
        "fp32": "uncentred expanded distance: rel_l2 6.2e-4, 139x the reference's own error, "
                "against the 2e-5 fp32 floor (CPU, B=2, N=97): terms of ~1e4 A^2 x 6e-8",
        "fp16": "uncentred expanded distance: rel_l2 36, 2000x the reference's own error (CPU, "
                "B=2, N=97): catastrophic cancellation",
        "bf16": "uncentred expanded distance: rel_l2 2.5, 18x the reference's own error (CPU, "
                "B=2, N=97): catastrophic cancellation",
    }

    @staticmethod
    def padded_width(width: int) -> int:
        """The next multiple of 8 >= width."""
        return -(-width // 8) * 8

    def attention(self):
        return sdpa_attend
