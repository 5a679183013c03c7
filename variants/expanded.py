"""The point-distance term expanded into dot products: the shared half of the two anchor
variants users would otherwise pick, `flex-attention` and `sdpa-decomposition`.

Not a registered variant. Per head, with w = softplus(head_weights[h]),

    -w/2 |qp_i - kp_j|^2 = w qp_i . kp_j - w/2 |qp_i|^2 - w/2 |kp_j|^2,

so the whole logit is one dot product of concatenated features plus the pair bias,

    Q_i = [q_i / sqrt(d) | w qp_i | -w/2 |qp_i|^2 | 1            | 0 ...]   (width d + 3 Qp + 2)
    K_j = [k_j           | kp_j   | 1             | -w/2 |kp_j|^2 | 0 ...]
    logit_ij = Q_i . K_j + bias_ij,

and one attention call (scale 1) aggregates V_j = [v_j | vp_j | 0 ...] (width d + 3 Vp): its
first d columns are o_s, the next 3 Vp the global-frame o_p. Zero columns pad both widths to
what the attention kernel accepts; they add exact zeros. `ExpandedIPA` runs the reference's
own LayerNorm, projections, frame transforms and `out_proj` (it holds an `IPAReference` and
calls its layers) around that call; only the attention differs. `ExpandedVariant` is the two
anchors' base class: the build, the code paths, the cells declared wrong.

Where it loses accuracy: the expansion adds three terms each as large as |qp|^2 (about
Qp x 1e4 A^2 at 100 A from the origin) to get a difference the size of |qp - kp|^2 (a few
A^2 between neighbours): the rounding error of the big terms (their size x the dtype's eps)
lands in the logits. Centring the translations on their per-batch mean first (`centre=True`;
the output is invariant to a global shift, so the function is unchanged) shrinks the big terms
to the size of the structure itself (tens of A), not its distance from the origin.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from variants import reference
from variants.base import IPAFunction, Variant
from variants.problem import Precision, get_precision
from variants.reference import IPAReference, checked, make_module

# (query, key, value, bias) -> out: (B, H, N, E), (B, H, N, E), (B, H, N, Ev), (B, H, N, N)
# -> (B, H, N, Ev), softmax(query @ key^T + bias) @ value with scale 1.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class ExpandedIPA(nn.Module):
    """IPA as the reference's layers around one attention call on expanded-distance features.

    `attend` is the attention call; `padded_width(width)` the feature width it accepts
    (>= width); `centre` subtracts each batch element's mean translation before the frames
    are applied. forward(node_repr (B,N,node_dim), pair_repr (B,N,N,pair_dim), translations
    (B,N,3), rotations (B,N,3,3)) -> (B, N, node_dim), as the reference.
    """

    def __init__(self, module: IPAReference, attend: Attend,
                 padded_width: Callable[[int], int], *, centre: bool):
        super().__init__()
        self.reference = module
        self.attend = attend
        self.padded_width = padded_width
        self.centre = centre

    def _pad(self, features: torch.Tensor) -> torch.Tensor:
        """(B, N, H, width) -> (B, H, N, padded_width(width)), zero columns appended."""
        width = features.shape[-1]
        return F.pad(features, (0, self.padded_width(width) - width)).transpose(1, 2)

    def forward(self, node_repr, pair_repr, translations, rotations):
        ref = self.reference
        B, N, _ = node_repr.shape
        h, d = ref.num_heads, ref.head_dim
        Qp, Vp = ref.num_query_points, ref.num_value_points
        if self.centre:  # a global shift: the output is unchanged, the expanded terms shrink
            translations = translations - translations.mean(dim=1, keepdim=True)

        x = ref.layer_norm(node_repr)
        q = ref.q_proj(x).view(B, N, h, d)
        k = ref.k_proj(x).view(B, N, h, d)
        v = ref.v_proj(x).view(B, N, h, d)
        q_pts = ref._apply_frame(ref.q_pts(x).view(B, N, h * Qp, 3), rotations, translations)
        k_pts = ref._apply_frame(ref.k_pts(x).view(B, N, h * Qp, 3), rotations, translations)
        v_pts = ref._apply_frame(ref.v_pts(x).view(B, N, h * Vp, 3), rotations, translations)
        q_pts = q_pts.reshape(B, N, h, Qp * 3)  # feature order: point, xyz (as the reference)
        k_pts = k_pts.reshape(B, N, h, Qp * 3)
        v_pts = v_pts.reshape(B, N, h, Vp * 3)

        w = F.softplus(ref.head_weights).view(1, 1, h, 1)
        q_norm = -(w * q_pts.square().sum(dim=-1, keepdim=True)) / 2.0  # (B, N, H, 1)
        k_norm = -(w * k_pts.square().sum(dim=-1, keepdim=True)) / 2.0
        one = torch.ones_like(q_norm)
        query = self._pad(torch.cat([q / math.sqrt(d), w * q_pts, q_norm, one], dim=-1))
        key = self._pad(torch.cat([k, k_pts, one, k_norm], dim=-1))
        value = self._pad(torch.cat([v, v_pts], dim=-1))
        # (B, H, N, N) with contiguous rows: SDPA's fused kernels need stride(-1) == 1, and
        # flex attention's score_mod then reads the bias row by row.
        bias = ref.pair_bias(pair_repr).permute(0, 3, 1, 2).contiguous()

        out = self.attend(query, key, value, bias).transpose(1, 2)  # (B, N, H, Ev)
        out_scalar = out[..., :d].reshape(B, N, h * d)
        out_pts = out[..., d:d + 3 * Vp].reshape(B, N, h * Vp, 3)
        out_pts = ref._apply_inv_frame(out_pts, rotations, translations).reshape(B, N, -1)
        return ref.out_proj(torch.cat([out_scalar, out_pts], dim=-1))


class ExpandedVariant(Variant):
    """A variant that is `ExpandedIPA` around its own attention call: subclasses give
    `attention()`, `padded_width`, `centre`, and the cells they are known to get wrong
    (`known_wrong`: precision -> evidence, from N = `known_from_length` up)."""

    centre: ClassVar[bool]
    known_wrong: ClassVar[dict[str, str]] = {}
    known_from_length: ClassVar[int] = 2

    def attention(self) -> Attend:
        """The attention call of one build."""
        raise NotImplementedError

    @staticmethod
    def padded_width(width: int) -> int:
        raise NotImplementedError

    def code_paths(self):
        return [*super().code_paths(), Path(__file__).resolve(), Path(reference.__file__)]

    def known_issues(self, config, batch, length, device, precision) -> list[str]:
        known = self.known_wrong.get(get_precision(precision).name)
        return [known] if known and length >= self.known_from_length else []

    def build(self, state_dict, config, device, precision: str | Precision) -> IPAFunction:
        dtype = get_precision(precision).dtype
        module = ExpandedIPA(make_module(state_dict, config, device, dtype), self.attention(),
                             self.padded_width, centre=self.centre)
        fn = checked(module, config, device, dtype)
        fn.parameters = module.reference.named_parameters  # state_dict names, for gradients
        return fn
