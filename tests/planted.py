"""Variants with one deliberate mistake each, for proving that the checks catch bugs.

Each is a reference module with one method overridden; `planted_variant(module_cls, name)`
wraps such a module class as a registry `Variant`. `IPAReference.forward` is one method, so
the bugs inside it override a hook of `HookedReference`: the reference's forward split into
the steps a kernel author writes separately (scalar logits, point weight, pair bias,
softmax). `HookedReference` itself is exact (a test holds it bit for bit to the reference).

The bugs are issue 7's list plus the forward-frame twin of the first, each a mistake a
hand-written kernel makes:

| variant | mistake | what `diagnose` should name |
|---|---|---|
| `planted-inverse-frame` | inverse frame multiplies by R, not R^T | inverse frame |
| `planted-frame-transposed` | frame transform multiplies by R^T, not R | frame rotation |
| `planted-softplus` | point weight is head_weights, not softplus(head_weights) | point weight |
| `planted-pair-transposed` | pair bias read at (j, i) instead of (i, j) | pair bias |
| `planted-batch-frames` | frames read without the batch stride (every b uses b = 0) | batch |
| `planted-no-sqrt-d` | scalar scores not divided by sqrt(d) | scalar term |
| `planted-ragged-tail` | keys past the last full block of 16 are dropped | tail |
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from variants.base import Variant
from variants.problem import get_precision
from variants.reference import IPAReference

RAGGED_BLOCK = 16  # key block of `DropsRaggedKeyBlock`: small, so small N shows it


class InverseFrameWithR(IPAReference):
    """Bug: the inverse frame multiplies by R instead of R^T."""

    def _apply_inv_frame(self, pts, rotations, translations):
        centered = pts - translations.unsqueeze(2)
        return torch.einsum("bnpc,bncd->bnpd", centered, rotations)


class FrameWithRT(IPAReference):
    """Bug: the frame transform multiplies by R^T instead of R (column-vector habit)."""

    def _apply_frame(self, pts, rotations, translations):
        return torch.einsum("bnpc,bndc->bnpd", pts, rotations) + translations.unsqueeze(2)


class HookedReference(IPAReference):
    """The reference's forward, split into overridable steps (no bug)."""

    def _scalar_logits(self, q, k):
        """q, k: (B, N, H, d) -> (B, H, N, N)."""
        return torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(self.head_dim)

    def _point_weight(self):
        """(H,) weight of each head's squared point distance (halved in forward)."""
        return F.softplus(self.head_weights)

    def _pair_bias(self, pair_repr):
        """pair_repr (B, N, N, pair_dim) -> bias (B, H, N, N), bias[b, h, i, j] from z[b, i, j]."""
        return self.pair_bias(pair_repr).permute(0, 3, 1, 2)

    def _softmax(self, logits):
        """Softmax over keys (last dim) of (B, H, N, N) logits."""
        return F.softmax(logits, dim=-1)

    def forward(self, node_repr, pair_repr, translations, rotations):
        B, N, _ = node_repr.shape
        h, d = self.num_heads, self.head_dim
        Qp, Vp = self.num_query_points, self.num_value_points

        x = self.layer_norm(node_repr)
        q = self.q_proj(x).view(B, N, h, d)
        k = self.k_proj(x).view(B, N, h, d)
        v = self.v_proj(x).view(B, N, h, d)
        q_pts = self._apply_frame(self.q_pts(x).view(B, N, h * Qp, 3), rotations, translations)
        k_pts = self._apply_frame(self.k_pts(x).view(B, N, h * Qp, 3), rotations, translations)
        v_pts = self._apply_frame(self.v_pts(x).view(B, N, h * Vp, 3), rotations, translations)
        q_pts = q_pts.view(B, N, h, Qp, 3)
        k_pts = k_pts.view(B, N, h, Qp, 3)
        v_pts = v_pts.view(B, N, h, Vp, 3)

        pt_dist = ((q_pts.unsqueeze(2) - k_pts.unsqueeze(1)) ** 2).sum(dim=(-1, -2))
        pt_attn = -(self._point_weight().view(1, 1, 1, h) * pt_dist) / 2.0
        attn = self._scalar_logits(q, k) + pt_attn.permute(0, 3, 1, 2) + self._pair_bias(pair_repr)
        attn = self._softmax(attn)

        out_scalar = torch.einsum("bhij,bjhd->bihd", attn, v).reshape(B, N, h * d)
        out_pts = torch.einsum("bhij,bjhpc->bihpc", attn, v_pts).reshape(B, N, h * Vp, 3)
        out_pts = self._apply_inv_frame(out_pts, rotations, translations).reshape(B, N, -1)
        return self.out_proj(torch.cat([out_scalar, out_pts], dim=-1))


class SoftplusMissing(HookedReference):
    """Bug: the point weight is head_weights itself, softplus missing."""

    def _point_weight(self):
        return self.head_weights


class PairBiasTransposed(HookedReference):
    """Bug: the pair bias of (i, j) is read from pair_repr[b, j, i]."""

    def _pair_bias(self, pair_repr):
        return self.pair_bias(pair_repr).permute(0, 3, 2, 1)


class FramesWithoutBatchStride(HookedReference):
    """Bug: frames are read without the batch stride, so every batch uses batch 0's."""

    def forward(self, node_repr, pair_repr, translations, rotations):
        return super().forward(
            node_repr, pair_repr,
            translations[:1].expand_as(translations), rotations[:1].expand_as(rotations),
        )


class ScoresNotScaled(HookedReference):
    """Bug: the scalar scores q.k are not divided by sqrt(d)."""

    def _scalar_logits(self, q, k):
        return torch.einsum("bihd,bjhd->bhij", q, k)


class DropsRaggedKeyBlock(HookedReference):
    """Bug: keys past the last full block of 16 are dropped (the ragged tail tile is skipped)."""

    def _softmax(self, logits):
        n = logits.shape[-1]
        covered = (n // RAGGED_BLOCK) * RAGGED_BLOCK  # 0 when N < 16: every key is dropped
        keep = torch.arange(n, device=logits.device) < covered
        return F.softmax(logits.masked_fill(~keep, -math.inf), dim=-1)


def planted_variant(module_cls: type[IPAReference], name: str) -> type[Variant]:
    """A Variant class that builds `module_cls` with the given weights."""

    class Planted(Variant):
        description = f"planted bug: {module_cls.__doc__.strip()}"

        def build(self, state_dict, config, device, precision):
            module = module_cls(*config.module_args())
            module.load_state_dict(state_dict)
            return module.to(device, get_precision(precision).dtype).eval()

    Planted.name = name
    Planted.__qualname__ = Planted.__name__ = f"Planted_{module_cls.__name__}"
    globals()[Planted.__name__] = Planted  # found by name when pickled for a worker process
    return Planted


InverseFrameBug = planted_variant(InverseFrameWithR, "planted-inverse-frame")
FrameTransposedBug = planted_variant(FrameWithRT, "planted-frame-transposed")
SoftplusBug = planted_variant(SoftplusMissing, "planted-softplus")
PairTransposedBug = planted_variant(PairBiasTransposed, "planted-pair-transposed")
BatchFramesBug = planted_variant(FramesWithoutBatchStride, "planted-batch-frames")
NoSqrtDBug = planted_variant(ScoresNotScaled, "planted-no-sqrt-d")
RaggedTailBug = planted_variant(DropsRaggedKeyBlock, "planted-ragged-tail")
HookedExact = planted_variant(HookedReference, "planted-none")

# Every planted bug, with the suspect `diagnose` must name first (a rule name in
# harness.probes.RULES).
PLANTED_BUGS: dict[type[Variant], str] = {
    InverseFrameBug: "inverse-frame",
    FrameTransposedBug: "frame-rotation",
    SoftplusBug: "point-weight",
    PairTransposedBug: "pair-bias",
    BatchFramesBug: "batch",
    NoSqrtDBug: "scalar-term",
    RaggedTailBug: "tail",
}
