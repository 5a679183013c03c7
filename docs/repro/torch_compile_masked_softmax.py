# Does torch.compile (Inductor) turn OpenFold's additive-mask softmax into NaN in bf16 on CUDA?
# OpenFold IPA adds inf * (m_i m_j - 1) with inf = 1e5 to the logits (SPEC-openfold.md step
# 5), so a masked query row's logits all sit near -1e5, where a bf16 ulp is 512. Eager bf16
# gives finite (uniform) rows there. If a fused softmax takes the row max from one rounding
# of those logits and the exponents from another, every exponent can underflow (e^-256 = 0 in
# fp32) and the row becomes 0 / 0. Three ever larger pieces, each eager vs compiled, bf16:
#   softmax:  softmax(logit + inf * (mask_i mask_j - 1))
#   qk:       the same with logit = q.k^T / sqrt(c) + bias, computed inside the compiled graph
#   einsum:   OpenFold's order: the logit as an einsum, the bias and the mask added, softmax,
#             then the weighted sum of v (what the layer does next)
# Prints the NaN count of masked and present query rows per piece. Needs only torch (and a GPU:
# without one it runs on the CPU, whose Inductor was clean for the whole layer).
# Run: python3 torch_compile_masked_softmax.py [B N]
import sys

import torch

INF, H, C = 1e5, 12, 16
B, N = map(int, sys.argv[1:3]) if len(sys.argv) > 2 else (2, 97)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator(DEV).manual_seed(0)
rand = lambda *s: torch.randn(*s, generator=g, device=DEV).bfloat16()  # noqa: E731
mask = torch.ones(B, N, device=DEV, dtype=torch.bfloat16)
for b in range(1, B):  # padded batch: element b has its last N // (b + 2) residues masked
    mask[b, N - N // (b + 2):] = 0
q, k, v, bias = rand(B, N, H, C), rand(B, N, H, C), rand(B, N, H, C), rand(B, H, N, N)
logit = rand(B, H, N, N) * 4


def masked(x):
    return x + INF * (mask[:, :, None] * mask[:, None, :] - 1)[:, None]


def softmax(logit):
    return torch.softmax(masked(logit), dim=-1)


def qk(q, k, bias):
    return torch.softmax(masked(torch.einsum("bihc,bjhc->bhij", q, k) * C ** -0.5 + bias), -1)


def einsum(q, k, v, bias):
    a = torch.softmax(masked(torch.einsum("bihc,bjhc->bhij", q, k) * C ** -0.5 + bias), -1)
    return torch.einsum("bhij,bjhc->bihc", a, v).transpose(1, 2)  # (B, H, N, C) as `a`'s rows


def nans(out):
    rows = out.isnan().any(-1)  # (B, H, N): query rows with a NaN
    present = mask.bool()[:, None, :].expand_as(rows)
    return int(rows[~present].sum()), int(rows[present].sum())


where = torch.cuda.get_device_name() if DEV == "cuda" else DEV
print(f"torch {torch.__version__}, {where}, B = {B}, N = {N}, "
      f"{int((mask == 0).sum())} masked residues; NaN rows (masked, present):")
with torch.no_grad():
    for name, fn, args in (("softmax", softmax, (logit,)), ("qk", qk, (q, k, bias)),
                           ("einsum", einsum, (q, k, v, bias))):
        eager = fn(*args)
        compiled = torch.compile(fn, dynamic=False)(*args)
        print(f"  {name:8} eager {nans(eager)}  compiled {nans(compiled)}", flush=True)
        torch._dynamo.reset()
