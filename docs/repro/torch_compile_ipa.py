# torch.compile (Inductor) miscompiles an IPA forward in float64 on CUDA; eager and aot_eager agree.
# torch 2.11.0+cu130, triton 3.6.0, NVIDIA H200 (2026-12-03): B=2 N=97 rel_l2 3.3e6; B=1 N=3000
# an illegal memory access; B=1 N=1000 1e-15. Run: python3 torch_compile_ipa.py [B N]
import math
import sys

import torch
import torch.nn.functional as F

H, D, QP, VP, C, Z = 12, 32, 4, 8, 384, 128
g = torch.Generator("cuda").manual_seed(0)
rand = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=torch.float64)  # noqa: E731
W = {n: rand(o, C) / math.sqrt(C) for n, o in [("q", H * D), ("k", H * D), ("v", H * D),
     ("qp", H * QP * 3), ("kp", H * QP * 3), ("vp", H * VP * 3)]}
W.update(b=rand(H, Z) / math.sqrt(Z), hw=rand(H), o=rand(C, H * D + H * VP * 3) / 20)

def frame(p, r, t):
    return torch.einsum("bnpc,bncd->bnpd", p, r) + t.unsqueeze(2)

def ipa(x, z, t, r):
    B, N, _ = x.shape
    x = F.layer_norm(x, (C,))
    q, k, v = (F.linear(x, W[n]).view(B, N, H, D) for n in "qkv")
    qp, kp = (frame(F.linear(x, W[n]).view(B, N, H * QP, 3), r, t).view(B, N, H, QP, 3)
              for n in ("qp", "kp"))
    vp = frame(F.linear(x, W["vp"]).view(B, N, H * VP, 3), r, t).view(B, N, H, VP, 3)
    a = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(D)
    dist = ((qp.unsqueeze(2) - kp.unsqueeze(1)) ** 2).sum(dim=(-1, -2))
    a = a - (F.softplus(W["hw"]).view(1, 1, 1, H) * dist).permute(0, 3, 1, 2) / 2
    a = (a + F.linear(z, W["b"]).permute(0, 3, 1, 2)).softmax(-1)
    o = torch.einsum("bhij,bjhd->bihd", a, v).reshape(B, N, H * D)
    op = torch.einsum("bhij,bjhpc->bihpc", a, vp).reshape(B, N, H * VP, 3)
    op = torch.einsum("bnpc,bndc->bnpd", op - t.unsqueeze(2), r).reshape(B, N, -1)
    return F.linear(torch.cat([o, op], -1), W["o"])

B, N = map(int, sys.argv[1:3]) if len(sys.argv) > 2 else (2, 97)
args = rand(B, N, C), rand(B, N, N, Z), 100 * rand(B, N, 3), torch.linalg.qr(rand(B, N, 3, 3))[0]
with torch.no_grad():
    eager, compiled = ipa(*args), torch.compile(ipa, dynamic=False)(*args)
    aot = torch.compile(ipa, backend="aot_eager", dynamic=False)(*args)
rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
print(f"torch {torch.__version__} B={B} N={N}: inductor rel_l2 {rel(compiled, eager):.3e}, "
      f"aot_eager {rel(aot, eager):.3e}")
