"""No GPU: where triton-train's fp32 dS error comes from, in an fp32 emulation against float64 (CPU;
N = 1024 takes seconds a head, 4096 minutes). For one head of the default layer (the suite's inputs
and state_dict; a random pair bias of z W_b's size) it computes dS = P (dP - D) three ways:

- the reference's: torch's softmax of natural-base fp32 logits in the global frame, and its
  backward, D_i = sum_j P_ij dP_ij over the same rounded dP;
- triton-train's scheme: base-2 logits in the layer's centred frame, the row statistics from an
  online softmax over 32-key blocks, P = exp2((s - m) - log2 l) recomputed, dP's point term on
  points centred on each 64-key block's first key point c, and D_i from the forward's output
  (flash-attention's row term): as dO . O - dO_p . c (the key kernel until the twenty-fourth
  session), or as dO_s . O_s + dO_p . (O_p - c) (since);
- dP's point term and D both on the batch centroid alone (no per-block centre: D's points' term
  then a per-row scalar, with no out_p tile in the key kernel);
- the same with D_i = sum_j P_ij dP_ij from the backward's own P and dP.

Prints each one's rel_l2 against float64, and P's. (The emulation does fp32 matmuls where the
kernels run 3xTF32 dots; it does not model the kernels' summation order.)

    PYTHONPATH=. python3 gpu_diagnostics/ds_emulation.py N [HEAD ...]
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

from harness.correctness import rel_l2 as rel
from variants.base2 import LOG2E
from variants.problem import IPAConfig, make_inputs
from variants.reference import init_state_dict

F32, F64 = torch.float32, torch.float64
KEY_BLOCK = 32  # the forward's online softmax
KEY_PROGRAM = 64  # the key kernel's keys per program (BLOCK_N), centred on the first's point


def emulate(length: int, heads: list[int]) -> None:
    cfg = IPAConfig()
    h_all, d, qp_n, vp_n = cfg.heads, cfg.head_dim, cfg.query_points, cfg.value_points
    sd = {k: v.double() for k, v in init_state_dict(cfg).items()}
    inputs = make_inputs(cfg, 1, length, dtype=F64, seed=0)
    x = F.layer_norm(inputs.node_repr[0], (cfg.node_dim,), sd["layer_norm.weight"],
                     sd["layer_norm.bias"])
    rot, t = inputs.rotations[0], inputs.translations[0]

    def points(name: str, count: int) -> torch.Tensor:  # global, (N, H, count, 3)
        local = (x @ sd[f"{name}.weight"].T).view(length, h_all, count, 3)
        return torch.einsum("nhpc,ncd->nhpd", local, rot) + t[:, None, None]

    qp, kp, vp = points("q_pts", qp_n), points("k_pts", qp_n), points("v_pts", vp_n)
    q, k, v = ((x @ sd[f"{n}.weight"].T).view(length, h_all, d)
               for n in ("q_proj", "k_proj", "v_proj"))
    g = torch.Generator().manual_seed(1)
    d_o = torch.randn(length, h_all, d, generator=g, dtype=F64)
    d_op = torch.randn(length, h_all, vp_n * 3, generator=g, dtype=F64)
    w = F.softplus(sd["head_weights"])
    centre = t.mean(0)

    def logits(h, dtype, qq, kk, qpp, kpp, b, scale=1.0):  # (N, N) for head h
        s = (qq[:, h].to(dtype) @ kk[:, h].to(dtype).T) * (scale / math.sqrt(d))
        dist = torch.zeros(length, length, dtype=dtype)
        for p in range(qp_n):
            diff = qpp[:, h, p].to(dtype)[:, None] - kpp[:, h, p].to(dtype)[None]
            dist += (diff ** 2).sum(-1)
        return s + (-w[h] / 2 * scale).to(dtype) * dist + b

    def values(h, dtype, points):
        return v[:, h].to(dtype), points[:, h].reshape(length, -1).to(dtype)

    def row_term(p_, dp):
        return (p_ * dp).sum(-1, keepdim=True)

    for h in heads:
        bias = (torch.randn(length, length, generator=g, dtype=F64)
                * sd["pair_bias.weight"][h].norm())
        # float64
        p64 = torch.softmax(logits(h, F64, q, k, qp, kp, bias), -1)
        v64, vp64 = values(h, F64, vp)
        dp64 = d_o[:, h] @ v64.T + d_op[:, h] @ vp64.T
        ds64 = p64 * (dp64 - row_term(p64, dp64))
        # the reference in fp32
        p_ref = torch.softmax(logits(h, F32, q, k, qp, kp, bias.float()), -1)
        v32, vp32 = values(h, F32, vp)
        dp = d_o[:, h].float() @ v32.T + d_op[:, h].float() @ vp32.T
        ds_ref = p_ref * (dp - row_term(p_ref, dp))
        # triton-train's scheme
        qc, kc, vc = ((a - centre).float() for a in (qp, kp, vp))
        s2 = logits(h, F32, q, k, qc, kc, (bias * LOG2E).float(), LOG2E)
        v32, vpc = values(h, F32, vc)
        m = torch.full((length,), -math.inf)
        l_sum, acc = torch.zeros(length), torch.zeros(length, d)
        acc_p = torch.zeros(length, vpc.shape[1])
        for j in range(0, length, KEY_BLOCK):
            block = s2[:, j:j + KEY_BLOCK]
            m_new = torch.maximum(m, block.max(-1).values)
            alpha, p_blk = torch.exp2(m - m_new), torch.exp2(block - m_new[:, None])
            l_sum = l_sum * alpha + p_blk.sum(-1)
            acc = acc * alpha[:, None] + p_blk @ v32[j:j + KEY_BLOCK]
            acc_p = acc_p * alpha[:, None] + p_blk @ vpc[j:j + KEY_BLOCK]
            m = m_new
        out, out_p = acc / l_sum[:, None], acc_p / l_sum[:, None]
        p2 = torch.exp2((s2 - m[:, None]) - torch.log2(l_sum)[:, None])
        d_o32, d_op32 = d_o[:, h].float(), d_op[:, h].float()
        dp_s = d_o32 @ v32.T  # dP's scalar term
        delta_s = (d_o32 * out).sum(-1, keepdim=True)
        delta = delta_s + (d_op32 * out_p).sum(-1, keepdim=True)
        ds_before, ds_now = torch.empty_like(p2), torch.empty_like(p2)
        for j in range(0, length, KEY_PROGRAM):  # the key kernel's blocks and their centres
            c = kc[j, h, 0].float().repeat(vp_n)
            dp_j = dp_s[:, j:j + KEY_PROGRAM] + d_op32 @ (vpc[j:j + KEY_PROGRAM] - c).T
            before = delta - (d_op32 * c).sum(-1, keepdim=True)
            now = delta_s + (d_op32 * (out_p - c)).sum(-1, keepdim=True)
            ds_before[:, j:j + KEY_PROGRAM] = p2[:, j:j + KEY_PROGRAM] * (dp_j - before)
            ds_now[:, j:j + KEY_PROGRAM] = p2[:, j:j + KEY_PROGRAM] * (dp_j - now)
        dp2 = dp_s + d_op32 @ vpc.T  # dP's point term on the batch centroid alone
        ds_centroid = p2 * (dp2 - delta)
        ds_rows = p2 * (dp2 - row_term(p2, dp2))
        print(f"N = {length}, head {h} (w {w[h]:.2f}): P rel_l2 reference {rel(p_ref, p64):.3g}, "
              f"triton-train {rel(p2, p64):.3g}; dS rel_l2 reference {rel(ds_ref, ds64):.3g}, "
              f"triton-train with D - dO_p . c {rel(ds_before, ds64):.3g}, "
              f"with D_s + dO_p . (O_p - c) {rel(ds_now, ds64):.3g}, "
              f"dP and D on the batch centroid {rel(ds_centroid, ds64):.3g}, "
              f"with D = sum_j P dP {rel(ds_rows, ds64):.3g}", flush=True)


if __name__ == "__main__":
    emulate(int(sys.argv[1]) if len(sys.argv) > 1 else 1024,
            [int(a) for a in sys.argv[2:]] or [0, 5])
