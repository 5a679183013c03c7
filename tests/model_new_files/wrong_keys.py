"""A ModelNew whose parameter names differ from SPEC's: q/k/v fused into one `qkv` Linear
and the LayerNorm called `norm`. Its arithmetic is right; its weights cannot be loaded."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, node_dim, pair_dim, num_heads, num_query_points, num_value_points):
        super().__init__()
        self.heads, self.head_dim = num_heads, node_dim // num_heads
        self.qp, self.vp = num_query_points, num_value_points
        self.norm = nn.LayerNorm(node_dim)
        self.qkv = nn.Linear(node_dim, 3 * node_dim, bias=False)
        self.q_pts = nn.Linear(node_dim, num_heads * num_query_points * 3, bias=False)
        self.k_pts = nn.Linear(node_dim, num_heads * num_query_points * 3, bias=False)
        self.v_pts = nn.Linear(node_dim, num_heads * num_value_points * 3, bias=False)
        self.pair_bias = nn.Linear(pair_dim, num_heads, bias=False)
        self.head_weights = nn.Parameter(torch.zeros(num_heads))
        self.out_proj = nn.Linear(node_dim + num_heads * num_value_points * 3, node_dim)

    def forward(self, node_repr, pair_repr, translations, rotations):
        B, N, _ = node_repr.shape
        H, d = self.heads, self.head_dim
        t = translations.unsqueeze(2)
        x = self.norm(node_repr)
        q, k, v = (y.reshape(B, N, H, d).transpose(1, 2) for y in self.qkv(x).chunk(3, -1))

        def to_global(y, points):
            g = y.reshape(B, N, H * points, 3) @ rotations + t
            return g.reshape(B, N, H, points * 3).transpose(1, 2)

        qp, kp = to_global(self.q_pts(x), self.qp), to_global(self.k_pts(x), self.qp)
        vp = to_global(self.v_pts(x), self.vp)
        dist = (qp.unsqueeze(3) - kp.unsqueeze(2)).square().sum(-1)
        logits = (q @ k.transpose(-1, -2)) * d**-0.5
        logits = logits - 0.5 * F.softplus(self.head_weights).view(1, H, 1, 1) * dist
        a = (logits + self.pair_bias(pair_repr).permute(0, 3, 1, 2)).softmax(-1)
        o_s = (a @ v).transpose(1, 2).reshape(B, N, H * d)
        o_p = (a @ vp).transpose(1, 2).reshape(B, N, H * self.vp, 3)
        o_p = (o_p - t) @ rotations.transpose(-1, -2)
        return self.out_proj(torch.cat([o_s, o_p.reshape(B, N, -1)], dim=-1))
