"""Reference IPA: the seed's einsum module, unchanged, and the baseline of every comparison.

`IPAReference` is the readable eager definition of the function in SPEC.md; in float64 it
is the oracle every variant is checked against. It is deliberately naive about memory:
besides the (B, H, N, N) logits, attention and bias tensors it materialises the
(B, N, N, H, Qp, 3) query-key point-difference tensor, so extra memory grows as
N^2 * H * (3 * Qp + a few) elements (about 20 GB at N = 4096 in fp32, SPEC's anchors).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from variants.base import IPAFunction, Variant
from variants.problem import IPAConfig, Precision, get_precision, validate_inputs


class IPAReference(nn.Module):
    """Simplified Invariant Point Attention, KernelBench `Model` style.

    Constructor: (node_dim, pair_dim, num_heads, num_query_points, num_value_points).
    forward(node_repr (B,N,node_dim), pair_repr (B,N,N,pair_dim), translations (B,N,3),
    rotations (B,N,3,3)) -> (B, N, node_dim).
    """

    def __init__(self, node_dim, pair_dim, num_heads, num_query_points, num_value_points):
        super().__init__()
        assert node_dim % num_heads == 0
        self.num_heads = num_heads
        self.head_dim = node_dim // num_heads
        self.num_query_points = num_query_points
        self.num_value_points = num_value_points

        d = self.head_dim
        self.q_proj = nn.Linear(node_dim, num_heads * d, bias=False)
        self.k_proj = nn.Linear(node_dim, num_heads * d, bias=False)
        self.v_proj = nn.Linear(node_dim, num_heads * d, bias=False)
        self.q_pts = nn.Linear(node_dim, num_heads * num_query_points * 3, bias=False)
        self.k_pts = nn.Linear(node_dim, num_heads * num_query_points * 3, bias=False)
        self.v_pts = nn.Linear(node_dim, num_heads * num_value_points * 3, bias=False)
        self.pair_bias = nn.Linear(pair_dim, num_heads, bias=False)
        self.head_weights = nn.Parameter(torch.zeros(num_heads))
        self.out_proj = nn.Linear(num_heads * d + num_heads * num_value_points * 3, node_dim)
        self.layer_norm = nn.LayerNorm(node_dim)

    def _apply_frame(self, pts, rotations, translations):
        """Local -> global: p @ R + t."""
        return torch.einsum("bnpc,bncd->bnpd", pts, rotations) + translations.unsqueeze(2)

    def _apply_inv_frame(self, pts, rotations, translations):
        """Global -> local: (g - t) @ R^T."""
        centered = pts - translations.unsqueeze(2)
        return torch.einsum("bnpc,bndc->bnpd", centered, rotations)

    def forward(self, node_repr, pair_repr, translations, rotations, query_rows=None):
        """`query_rows` (a slice, default all) computes only those query rows' outputs in
        rows x N memory; the harness uses it to evaluate the oracle in chunks at large N.
        With it, `pair_repr` may be those rows alone ((B, rows, N, C): their gradient is
        then rows-sized)."""
        B, N, _ = node_repr.shape
        h, d = self.num_heads, self.head_dim
        Qp, Vp = self.num_query_points, self.num_value_points
        rows = slice(None) if query_rows is None else query_rows

        x = self.layer_norm(node_repr)
        x_q, rot_q, trans_q = x[:, rows], rotations[:, rows], translations[:, rows]
        M = x_q.shape[1]
        q = self.q_proj(x_q).view(B, M, h, d)
        k = self.k_proj(x).view(B, N, h, d)
        v = self.v_proj(x).view(B, N, h, d)

        q_pts = self._apply_frame(self.q_pts(x_q).view(B, M, h * Qp, 3), rot_q, trans_q)
        k_pts = self._apply_frame(self.k_pts(x).view(B, N, h * Qp, 3), rotations, translations)
        v_pts = self._apply_frame(self.v_pts(x).view(B, N, h * Vp, 3), rotations, translations)
        q_pts = q_pts.view(B, M, h, Qp, 3)
        k_pts = k_pts.view(B, N, h, Qp, 3)
        v_pts = v_pts.view(B, N, h, Vp, 3)

        attn_scalar = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(d)
        # (B, M, N, h, Qp, 3): the tensor that dominates this module's memory.
        pt_dist = ((q_pts.unsqueeze(2) - k_pts.unsqueeze(1)) ** 2).sum(dim=(-1, -2))
        w = F.softplus(self.head_weights)
        pt_attn = -(w.view(1, 1, 1, h) * pt_dist) / 2.0
        pair_q = pair_repr[:, rows] if pair_repr.shape[1] == N else pair_repr
        pair_bias = self.pair_bias(pair_q).permute(0, 3, 1, 2)

        attn = attn_scalar + pt_attn.permute(0, 3, 1, 2) + pair_bias
        attn = F.softmax(attn, dim=-1)

        out_scalar = torch.einsum("bhij,bjhd->bihd", attn, v).reshape(B, M, h * d)
        out_pts = torch.einsum("bhij,bjhpc->bihpc", attn, v_pts).reshape(B, M, h * Vp, 3)
        out_pts = self._apply_inv_frame(out_pts, rot_q, trans_q).reshape(B, M, -1)
        return self.out_proj(torch.cat([out_scalar, out_pts], dim=-1))


def make_module(
    state_dict: dict[str, torch.Tensor],
    config: IPAConfig,
    device: str | torch.device,
    dtype: torch.dtype,
) -> IPAReference:
    """An `IPAReference` holding `state_dict`, on `device` in `dtype`, in eval mode."""
    module = IPAReference(*config.module_args())
    module.load_state_dict(state_dict)
    return module.to(device=device, dtype=dtype).eval().requires_grad_(False)


class Reference(Variant):
    name = "reference"
    description = "the seed's eager einsum module (baseline; float64 copy is the oracle)"
    is_baseline = True
    supports_backward = True

    def build(self, state_dict, config, device, precision: str | Precision) -> IPAFunction:
        dtype = get_precision(precision).dtype
        return checked(make_module(state_dict, config, device, dtype), config, device, dtype)


def checked(module: torch.nn.Module, config: IPAConfig, device, dtype) -> IPAFunction:
    """`module` as the timed callable, with the metadata checks every variant runs before
    any kernel (shapes, dtype, device: `IPAInputError`, a few microseconds); `.module` is the
    module itself."""
    device = torch.device(device)

    def forward(node_repr, pair_repr, translations, rotations):
        validate_inputs(config, node_repr, pair_repr, translations, rotations, dtypes=(dtype,),
                        device=device, check_values=False)
        return module(node_repr, pair_repr, translations, rotations)

    forward.module = module
    return forward


def init_state_dict(config: IPAConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights for every variant: the reference's default init (seeded) with random
    `head_weights` (SPEC: zeros would leave the softplus path untested), float32 on CPU."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = IPAReference(*config.module_args())
        with torch.no_grad():
            module.head_weights.normal_(0.0, 1.0)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}
