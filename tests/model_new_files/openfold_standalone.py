"""A correct KernelBench-style ModelNew for SPEC-openfold's IPA, written without the project's
code.

Standalone on purpose (it imports torch only), as a kernel author's file would be: heads moved
ahead of residues for batched matmuls, the squared point distance computed directly (never as
|q|^2 + |k|^2 - 2 q.k). The interchange is the SPEC's: `ModelNew(c_s, c_z, c_hidden, no_heads,
no_qk_points, no_v_points)`, `forward(s, z, translations, rotations, mask)`, OpenFold v2's
parameter names (the point projections' Linear under `.linear`). Frames in the column
convention: a local point p is R p + t globally.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class PointLinear(nn.Module):
    """OpenFold v2 keeps the point projections' Linear under `.linear`."""

    def __init__(self, c_in, c_out):
        super().__init__()
        self.linear = nn.Linear(c_in, c_out)

    def forward(self, x):
        return self.linear(x)


class ModelNew(nn.Module):
    def __init__(self, c_s, c_z, c_hidden, no_heads, no_qk_points, no_v_points, inf=1e5,
                 eps=1e-8):
        super().__init__()
        self.c_z, self.C, self.H = c_z, c_hidden, no_heads
        self.Pq, self.Pv = no_qk_points, no_v_points
        self.inf, self.eps = inf, eps
        H, C, Pq, Pv = no_heads, c_hidden, no_qk_points, no_v_points
        self.linear_q = nn.Linear(c_s, H * C)
        self.linear_kv = nn.Linear(c_s, 2 * H * C)
        self.linear_q_points = PointLinear(c_s, 3 * H * Pq)
        self.linear_kv_points = PointLinear(c_s, 3 * H * (Pq + Pv))
        self.linear_b = nn.Linear(c_z, H)
        self.head_weights = nn.Parameter(torch.zeros(H))
        self.linear_out = nn.Linear(H * (C + 4 * Pv + c_z), c_s)

    def global_points(self, projection, s, points, rotations, translations):
        """(B, N, H, P, 3): the projection's rows are [X | Y | Z] blocks (row c*H*P + h*P + p),
        each local point p mapped to R p + t."""
        B, N = s.shape[:2]
        local = projection(s).view(B, N, 3, self.H, points).permute(0, 1, 3, 4, 2)
        return (torch.einsum("bnxy,bnhpy->bnhpx", rotations, local)
                + translations[:, :, None, None, :])

    def split_xyz(self, o_pt):
        """o_pt (B, N, H, Pv, 3) -> X, Y, Z, each (B, N, H*Pv)."""
        B, N, H, Pv, _ = o_pt.shape
        return o_pt.reshape(B, N, H * Pv, 3).unbind(dim=-1)

    def forward(self, s, z, translations, rotations, mask):
        B, N, _ = s.shape
        H, C, Pq = self.H, self.C, self.Pq
        q = self.linear_q(s).view(B, N, H, C).transpose(1, 2)  # (B, H, N, C)
        k, v = self.linear_kv(s).view(B, N, H, 2 * C).transpose(1, 2).split(C, dim=-1)
        q_pts = self.global_points(self.linear_q_points, s, Pq, rotations, translations)
        kv_pts = self.global_points(self.linear_kv_points, s, Pq + self.Pv, rotations,
                                    translations)
        k_pts, v_pts = kv_pts[..., :Pq, :], kv_pts[..., Pq:, :]

        logits = (q @ k.transpose(-1, -2)) * math.sqrt(1.0 / (3 * C))
        logits = logits + math.sqrt(1.0 / 3) * self.linear_b(z).permute(0, 3, 1, 2)
        dist2 = (q_pts[:, :, None] - k_pts[:, None]).square().sum(dim=(-1, -2))  # (B, N, N, H)
        weight = F.softplus(self.head_weights) * math.sqrt(1.0 / (3 * (Pq * 9.0 / 2)))
        logits = logits - 0.5 * (weight * dist2).permute(0, 3, 1, 2)
        pair_mask = mask[:, :, None] * mask[:, None, :]  # (B, N, N)
        logits = logits + self.inf * (pair_mask[:, None] - 1)
        a = logits.softmax(dim=-1)  # (B, H, N, N)

        o = (a @ v).transpose(1, 2).reshape(B, N, H * C)
        o_pt_global = torch.einsum("bhij,bjhpx->bihpx", a, v_pts)
        centred = o_pt_global - translations[:, :, None, None, :]
        o_pt = torch.einsum("bnyx,bnhpy->bnhpx", rotations, centred)  # R^T (g - t)
        norms = torch.sqrt(o_pt.square().sum(dim=-1) + self.eps).reshape(B, N, H * self.Pv)
        o_x, o_y, o_z = self.split_xyz(o_pt)
        o_pair = (a.transpose(1, 2) @ z).reshape(B, N, H * self.c_z)  # sum_j a_hij z_ij
        return self.linear_out(torch.cat([o, o_x, o_y, o_z, norms, o_pair], dim=-1))
