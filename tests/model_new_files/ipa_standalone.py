"""A correct KernelBench-style ModelNew for SPEC's IPA, written without the project's code.

Standalone on purpose (it imports torch only), as a kernel author's file would be: batched
matmuls instead of einsums, heads moved ahead of residues, the squared distance computed
directly (never as |q|^2 + |k|^2 - 2 q.k). Parameter names are SPEC's state_dict names.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, node_dim, pair_dim, num_heads, num_query_points, num_value_points):
        super().__init__()
        self.heads = num_heads
        self.head_dim = node_dim // num_heads
        self.qp = num_query_points
        self.vp = num_value_points
        hd = num_heads * self.head_dim
        self.layer_norm = nn.LayerNorm(node_dim)
        self.q_proj = nn.Linear(node_dim, hd, bias=False)
        self.k_proj = nn.Linear(node_dim, hd, bias=False)
        self.v_proj = nn.Linear(node_dim, hd, bias=False)
        self.q_pts = nn.Linear(node_dim, num_heads * num_query_points * 3, bias=False)
        self.k_pts = nn.Linear(node_dim, num_heads * num_query_points * 3, bias=False)
        self.v_pts = nn.Linear(node_dim, num_heads * num_value_points * 3, bias=False)
        self.pair_bias = nn.Linear(pair_dim, num_heads, bias=False)
        self.head_weights = nn.Parameter(torch.zeros(num_heads))
        self.out_proj = nn.Linear(hd + num_heads * num_value_points * 3, node_dim)

    def forward(self, node_repr, pair_repr, translations, rotations):
        B, N, _ = node_repr.shape
        H, d = self.heads, self.head_dim
        t = translations.unsqueeze(2)  # (B, N, 1, 3)

        def heads_first(y, width):  # (B, N, H * width) -> (B, H, N, width)
            return y.reshape(B, N, H, width).transpose(1, 2)

        def to_global(y, points):  # local (B, N, H*P*3) -> global (B, H, N, P*3): p @ R + t
            g = y.reshape(B, N, H * points, 3) @ rotations + t
            return heads_first(g, points * 3)

        x = self.layer_norm(node_repr)
        q, k, v = (heads_first(p(x), d) for p in (self.q_proj, self.k_proj, self.v_proj))
        qp = to_global(self.q_pts(x), self.qp)
        kp = to_global(self.k_pts(x), self.qp)
        vp = to_global(self.v_pts(x), self.vp)

        dist = (qp.unsqueeze(3) - kp.unsqueeze(2)).square().sum(-1)  # (B, H, N, N)
        weight = F.softplus(self.head_weights).view(1, H, 1, 1)
        logits = (q @ k.transpose(-1, -2)) * d**-0.5 - 0.5 * weight * dist
        logits = logits + self.pair_bias(pair_repr).permute(0, 3, 1, 2)
        a = logits.softmax(dim=-1)

        o_s = (a @ v).transpose(1, 2).reshape(B, N, H * d)
        o_p = (a @ vp).transpose(1, 2).reshape(B, N, H * self.vp, 3)
        o_p = (o_p - t) @ rotations.transpose(-1, -2)  # back to the local frame
        return self.out_proj(torch.cat([o_s, o_p.reshape(B, N, -1)], dim=-1))
