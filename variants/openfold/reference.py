"""Reference for problem `openfold`: an eager module that mirrors SPEC-openfold.md's forward
step by step, and the float64 oracle.

`OpenFoldIPA` is written from the SPEC text (OpenFold is not a dependency); its state_dict
keys are exactly OpenFold v2's. Each step of `forward` carries the SPEC's step number. Like
the simplified reference it is naive about memory: it materialises the (B, H, N, N) logits
and attention and the (B, N, N, H, Pq, 3) query-key point differences (the distance is
computed directly, never expanded as |q|^2 + |k|^2 - 2 q.k, which cancels at 100 A).

The oracle is this same module in float64 on the upcast inputs (`oracle_forward`), not a
second formula: one definition cannot drift from the reference it judges. What guards the
definition itself is `tests/test_openfold.py`, whose independent loop implementation (raw
state_dict rows indexed by the SPEC's formulas, explicit 3x3 frame algebra) agrees with it to
1e-12 in float64.

Precision: the module runs wholly in the dtype it is given. In bf16 that includes the logits,
so masked query rows (logits near -1e5, a bf16 ulp of 512 there) come out as uniform
attention; AF2/OpenFold keep the logits in fp32 under autocast. `output_parts` judges those
rows apart from the present residues (docs/problems.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from variants.base import Variant
from variants.compiled import InductorCompiled
from variants.openfold.problem import (
    OpenFoldConfig,
    OpenFoldInputs,
    init_state_dict,
    not_supported_reasons,
    validate_inputs,
)
from variants.problem import Precision, get_precision


def local_points(y: torch.Tensor, heads: int) -> torch.Tensor:
    """A point projection's output (B, N, 3*H*P), blocks [X | Y | Z] each H*P wide (index
    h*P + p), as local points (B, N, H, P, 3)."""
    B, N, width = y.shape
    return torch.stack(torch.split(y, width // 3, dim=-1), dim=-1).view(B, N, heads, -1, 3)


class PointProjection(nn.Module):
    """OpenFold v2's wrapper of the point projections: its Linear sits under `.linear`, so the
    keys are `linear_q_points.linear.weight` (v1: `linear_q_points.weight`)."""

    def __init__(self, c_in: int, points: int, heads: int):
        super().__init__()
        self.points, self.heads = points, heads
        self.linear = nn.Linear(c_in, 3 * heads * points)

    def forward(self, s: torch.Tensor, rotations: torch.Tensor, translations: torch.Tensor
                ) -> torch.Tensor:
        """Global points (B, N, H, P, 3) of features s (B, N, c_in) in frames (R, t)."""
        local = local_points(self.linear(s), self.heads)
        # Column convention: (R p)_x = sum_y R[x, y] p_y, then + t.
        return (torch.einsum("bnxy,bnhpy->bnhpx", rotations, local)
                + translations[:, :, None, None, :])


class OpenFoldIPA(nn.Module):
    """OpenFold Invariant Point Attention (monomer), KernelBench `Model` style.

    Constructor: (c_s, c_z, c_hidden, no_heads, no_qk_points, no_v_points, inf=1e5, eps=1e-8).
    forward(s (B,N,c_s), z (B,N,N,c_z), translations (B,N,3), rotations (B,N,3,3),
    mask (B,N)) -> (B, N, c_s), the update (the caller adds the residual).
    Parameters start at `init_state_dict(config, seed=0)` (the benchmark init).
    """

    def __init__(self, c_s, c_z, c_hidden, no_heads, no_qk_points, no_v_points, inf=1e5,
                 eps=1e-8):
        super().__init__()
        config = OpenFoldConfig(c_s, c_z, c_hidden, no_heads, no_qk_points, no_v_points, inf,
                                eps)
        self.config = config
        H, C, Pq, Pv = no_heads, c_hidden, no_qk_points, no_v_points
        self.linear_q = nn.Linear(c_s, H * C)
        self.linear_kv = nn.Linear(c_s, 2 * H * C)
        self.linear_q_points = PointProjection(c_s, Pq, H)
        self.linear_kv_points = PointProjection(c_s, Pq + Pv, H)
        self.linear_b = nn.Linear(c_z, H)
        self.head_weights = nn.Parameter(torch.zeros(H))
        self.linear_out = nn.Linear(config.out_in_features, c_s)
        self.load_state_dict(init_state_dict(config, seed=0))

    def to_local(self, o_pt_g: torch.Tensor, rotations: torch.Tensor,
                 translations: torch.Tensor) -> torch.Tensor:
        """Global -> local, column convention: R_i^T (g - t_i). (B, M, H, Pv, 3)."""
        centred = o_pt_g - translations[:, :, None, None, :]
        # (R^T v)_x = sum_y R[y, x] v_y
        return torch.einsum("bmyx,bmhpy->bmhpx", rotations, centred)

    def forward(self, s, z, translations, rotations, mask, query_rows=None):
        """`query_rows` (a slice, default all) computes only those query rows' outputs in
        rows x N memory (the oracle at large N is evaluated in chunks of rows). With it, `z`
        may be those rows alone ((B, rows, N, c_z): their gradient is then rows-sized)."""
        cfg = self.config
        B, N, _ = s.shape
        H, C, Pq, Pv = cfg.no_heads, cfg.c_hidden, cfg.no_qk_points, cfg.no_v_points
        rows = slice(None) if query_rows is None else query_rows
        s_q, rot_q, trans_q, mask_q = (s[:, rows], rotations[:, rows], translations[:, rows],
                                       mask[:, rows])
        z_q = z[:, rows] if z.shape[1] == N else z
        M = s_q.shape[1]

        # 1. q per head; k and v interleave per head: kv viewed (B, N, H, 2C), k = [..., :C].
        q = self.linear_q(s_q).view(B, M, H, C)
        kv = self.linear_kv(s).view(B, N, H, 2 * C)
        k, v = kv[..., :C], kv[..., C:]

        # 2. Points: [X | Y | Z] blocks, row c*H*P + h*P + p, frame applied (R p + t);
        #    kv points split within each head: the first Pq are keys, the next Pv values.
        q_pts = self.linear_q_points(s_q, rot_q, trans_q)  # (B, M, H, Pq, 3)
        kv_pts = self.linear_kv_points(s, rotations, translations)  # (B, N, H, Pq+Pv, 3)
        k_pts, v_pts = kv_pts[..., :Pq, :], kv_pts[..., Pq:, :]

        # 3. Pair bias b[i, j, h].
        b = self.linear_b(z_q)  # (B, M, N, H)

        # 4. logit = (q_i . k_j) sqrt(1/(3C)) + sqrt(1/3) b_ijh - 0.5 w_h sum_p |q_p - k_p|^2,
        #    w_h = softplus(head_weights_h) (threshold 20) * sqrt(1/(3 (Pq * 9/2))).
        logit = torch.einsum("bihc,bjhc->bhij", q, k) * math.sqrt(1.0 / (3 * C))
        logit = logit + math.sqrt(1.0 / 3) * b.permute(0, 3, 1, 2)
        diff = q_pts[:, :, None] - k_pts[:, None, :]  # (B, M, N, H, Pq, 3)
        dist2 = (diff ** 2).sum(dim=-1).sum(dim=-1)  # (B, M, N, H), summed over xyz and p
        w = F.softplus(self.head_weights, beta=1, threshold=20) * math.sqrt(
            1.0 / (3 * (Pq * 9.0 / 2)))
        logit = logit - 0.5 * (w * dist2).permute(0, 3, 1, 2)

        # 5. Additive mask inf * (m_i m_j - 1): a masked query row is shifted equally for
        #    every key, so it comes out as if unmasked (never zeroed, never uniform).
        square_mask = mask_q[:, :, None] * mask[:, None, :]  # (B, M, N)
        logit = logit + cfg.inf * (square_mask - 1)[:, None]

        # 6. Softmax over keys j.
        a = torch.softmax(logit, dim=-1)  # (B, H, M, N)

        # 7. o[i, h] = sum_j a v_j, head-major (B, M, H*C).
        o = torch.einsum("bhij,bjhc->bihc", a, v).reshape(B, M, H * C)

        # 8. o_pt in the global frame, then back to residue i's frame: R_i^T (g - t_i).
        o_pt_g = torch.einsum("bhij,bjhpx->bihpx", a, v_pts)  # (B, M, H, Pv, 3)
        o_pt = self.to_local(o_pt_g, rot_q, trans_q)

        # 9. Norms, eps inside the sqrt: (B, M, H*Pv).
        o_pt_norm = torch.sqrt((o_pt ** 2).sum(dim=-1) + cfg.eps).reshape(B, M, H * Pv)

        # 10. o_pt viewed (B, M, H*Pv, 3), split into X, Y, Z, each (B, M, H*Pv).
        o_x, o_y, o_z = o_pt.reshape(B, M, H * Pv, 3).unbind(dim=-1)

        # 11. o_pair[i, h] = sum_j a z_ij, head-major (B, M, H*c_z).
        o_pair = torch.einsum("bhij,bijc->bihc", a, z_q).reshape(B, M, H * cfg.c_z)

        # 12. out = linear_out(cat[o, X, Y, Z, o_pt_norm, o_pair]), width H (C + 4 Pv + c_z).
        return self.linear_out(torch.cat([o, o_x, o_y, o_z, o_pt_norm, o_pair], dim=-1))


def make_module(state_dict: dict[str, torch.Tensor], config: OpenFoldConfig,
                device: str | torch.device, dtype: torch.dtype) -> OpenFoldIPA:
    """An `OpenFoldIPA` of `config` holding `state_dict` (v2 keys), on `device` in `dtype`,
    in eval mode without gradients."""
    module = OpenFoldIPA(*config.module_args(), inf=config.inf, eps=config.eps)
    module.load_state_dict(state_dict)
    return module.to(device=device, dtype=dtype).eval().requires_grad_(False)


# Largest (B, rows, N, H, Pq, 3) point-difference tensor one chunk materialises.
CHUNK_ELEMENTS = 2**30


def chunked_forward(module: OpenFoldIPA, inputs: OpenFoldInputs,
                    max_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """`module(*inputs)`, in chunks of query rows when the point differences would exceed
    `max_elements` elements."""
    cfg = module.config
    per_row = inputs.batch * inputs.length * cfg.no_heads * cfg.no_qk_points * 3
    chunk = max(1, min(inputs.length, max_elements // per_row))
    if chunk >= inputs.length:
        return module(*inputs.as_tuple())
    return torch.cat([module(*inputs.as_tuple(), query_rows=slice(i, i + chunk))
                      for i in range(0, inputs.length, chunk)], dim=1)


def oracle_forward(state_dict: dict[str, torch.Tensor], config: OpenFoldConfig,
                   inputs: OpenFoldInputs, max_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """The float64 oracle: `OpenFoldIPA` in float64 on the upcast inputs, on their device."""
    module = make_module(state_dict, config, inputs.s.device, torch.float64)
    with torch.no_grad():
        return chunked_forward(module, inputs.to(dtype=torch.float64), max_elements)


class Reference(Variant):
    """The eager module as a variant of problem `openfold` (its baseline)."""

    name = "reference"
    description = "eager OpenFold IPA from the SPEC (baseline; float64 copy is the oracle)"
    problems = ("openfold",)
    is_baseline = True
    supports_backward = True

    def not_supported_reasons(self, config, device, precision):
        return (super().not_supported_reasons(config, device, precision)
                + not_supported_reasons(config, precision))

    def build(self, state_dict, config: OpenFoldConfig, device, precision: str | Precision):
        dtype = get_precision(precision).dtype
        module = make_module(state_dict, config, device, dtype)
        device = torch.device(device)

        def forward(s, z, translations, rotations, mask):
            validate_inputs(config, s, z, translations, rotations, mask, dtypes=(dtype,),
                            device=device, check_values=False)
            return module(s, z, translations, rotations, mask)

        forward.module = module
        return forward


class Compiled(InductorCompiled, Reference):
    """`torch.compile` of the eager module (Inductor, static shapes), as problem `simplified`'s
    `torch-compile`: what a user tries first."""

    name = "torch-compile"
    description = "torch.compile(OpenFold reference), Inductor, static shapes"
    is_baseline = False

    def build(self, state_dict, config: OpenFoldConfig, device, precision: str | Precision):
        eager = super().build(state_dict, config, device, precision)
        compiled = self.compile(eager.module)

        def forward(s, z, translations, rotations, mask):
            validate_inputs(config, s, z, translations, rotations, mask,
                            dtypes=(eager.module.linear_b.weight.dtype,),
                            device=torch.device(device), check_values=False)
            return compiled(s, z, translations, rotations, mask)

        forward.module = eager.module
        forward.parameters = eager.module.named_parameters
        return forward
