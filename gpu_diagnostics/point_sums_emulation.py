"""No GPU: why triton-train's point gradients carried 1.2-1.9x the reference's error, in an fp32
emulation against float64 (CPU, a few seconds a length). The sum dq_pts_i ~ sum_j dS_ij
(qp_i - kp_j) over one head is computed four ways from the same dS rounded to fp32:

- the reference's form: the differences per pair, in the global frame (the suite's chains sit
  100 A off the origin), summed by torch;
- as a GEMM, qp_i rowsum_i - dS kp, on points centred once per batch element (triton-train's
  sums of dS until the twenty-fourth session);
- the same, with the keys moved by c, the query point at the start of i's group of 64 or 128
  rows (`sums.gemm_ds_sums` since then: CENTRE_GROUP).

Prints each form's rel_l2 against float64, with the chain's radius.

    PYTHONPATH=. python3 gpu_diagnostics/point_sums_emulation.py [N ...]
"""

from __future__ import annotations

import sys

import torch

from variants.problem import IPAConfig, make_inputs

QUERY_POINTS = 4
POINT_WEIGHT = 0.163  # softplus(0) sqrt(2 / (9 Qp)): the default layer's, as initialised


def emulate(length: int) -> dict[str, float]:
    inputs = make_inputs(IPAConfig(), 1, length, dtype=torch.float64, seed=1)
    t, rot = inputs.translations[0], inputs.rotations[0]
    g = torch.Generator().manual_seed(2)

    def points():  # global points near their residue, (N, 3 Qp)
        local = 1.5 * torch.randn(length, QUERY_POINTS, 3, generator=g, dtype=torch.float64)
        return (torch.einsum("nij,npj->npi", rot, local) + t[:, None]).reshape(length, -1)

    qp, kp = points(), points()
    dist = torch.cdist(qp, kp) ** 2
    noise = torch.randn(length, length, generator=g, dtype=torch.float64)
    attn = torch.softmax(-POINT_WEIGHT / 2 * dist + noise, -1)
    dp = torch.randn(length, length, generator=g, dtype=torch.float64)
    ds = attn * (dp - (attn * dp).sum(-1, keepdim=True))
    want = qp * ds.sum(-1, keepdim=True) - ds @ kp

    def rel(got: torch.Tensor) -> float:
        return ((got.double() - want).norm() / want.norm()).item()

    ds32, qp32, kp32 = ds.float(), qp.float(), kp.float()
    reference = torch.empty(length, qp.shape[1])
    for i in range(0, length, 256):  # per pair, as autograd of |qp_i - kp_j|^2 sums it
        reference[i:i + 256] = (ds32[i:i + 256, :, None]
                                * (qp32[i:i + 256, None] - kp32[None])).sum(1)
    mean = t.float().mean(0).repeat(QUERY_POINTS)
    qc, kc = qp32 - mean, kp32 - mean
    figures = {"radius (A)": (t - t.mean(0)).norm(dim=-1).max().item(),
               "reference form": rel(reference),
               "GEMM, centred per batch element": rel(qc * ds32.sum(-1, keepdim=True) - ds32 @ kc)}
    for group in (64, 128):
        got = torch.empty_like(qc)
        for i in range(0, length, group):
            c, rows = qc[i], ds32[i:i + group]
            got[i:i + group] = (qc[i:i + group] - c) * rows.sum(-1, keepdim=True) - rows @ (kc - c)
        figures[f"GEMM, centred per {group}-row group"] = rel(got)
    return figures


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [1024, 2048, 4096]:
        print(f"N = {n}: " + ", ".join(f"{k} {v:.3g}" for k, v in emulate(n).items()))
