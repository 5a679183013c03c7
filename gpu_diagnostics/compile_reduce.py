"""Reduce the torch.compile (Inductor) miscompile of the reference IPA (GPU machine).

`compile_probe.py` showed Inductor's code for `IPAReference` wrong at B = 2, N = 97 and
N = 3000 (aot_eager exact). This runs a ladder of ever smaller pure-torch functions, each
compiled with Inductor's defaults (static shapes) and compared with eager in float64 at
the failing shapes and a passing control, so that the smallest failing rung becomes the
standalone repro in docs/torch-compile-repro.py.

    PYTHONPATH=. python3 gpu_diagnostics/compile_reduce.py
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

H, D, QP, VP, C, Z = 12, 32, 4, 8, 384, 128  # AlphaFold2's layer
SHAPES = [(2, 97), (1, 3000), (1, 1000)]


def weights(dev, dtype):
    g = torch.Generator(device=dev).manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=dtype) / math.sqrt(shape[-1])

    return dict(q=w(H * D, C), k=w(H * D, C), v=w(H * D, C), qp=w(H * QP * 3, C),
                kp=w(H * QP * 3, C), vp=w(H * VP * 3, C), b=w(H, Z), hw=w(H, 1)[:, 0],
                o=w(C, H * D + H * VP * 3))


def inputs(B, N, dev, dtype):
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(B, N, C, generator=g, device=dev, dtype=dtype)
    z = torch.randn(B, N, N, Z, generator=g, device=dev, dtype=dtype)
    t = 100 * torch.randn(B, N, 3, generator=g, device=dev, dtype=dtype)
    r = torch.linalg.qr(torch.randn(B, N, 3, 3, generator=g, device=dev, dtype=dtype))[0]
    return x, z, t, r


def frame(p, r, t):
    return torch.einsum("bnpc,bncd->bnpd", p, r) + t.unsqueeze(2)


def full_ipa(W, x, z, t, r):
    """The reference's forward as plain functions (no LayerNorm weights, no biases)."""
    B, N, _ = x.shape
    x = F.layer_norm(x, (C,))
    q, k, v = (F.linear(x, W[n]).view(B, N, H, D) for n in "qkv")
    qp = frame(F.linear(x, W["qp"]).view(B, N, H * QP, 3), r, t).view(B, N, H, QP, 3)
    kp = frame(F.linear(x, W["kp"]).view(B, N, H * QP, 3), r, t).view(B, N, H, QP, 3)
    vp = frame(F.linear(x, W["vp"]).view(B, N, H * VP, 3), r, t).view(B, N, H, VP, 3)
    a = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(D)
    dist = ((qp.unsqueeze(2) - kp.unsqueeze(1)) ** 2).sum(dim=(-1, -2))
    a = a - (F.softplus(W["hw"]).view(1, 1, 1, H) * dist).permute(0, 3, 1, 2) / 2
    a = (a + F.linear(z, W["b"]).permute(0, 3, 1, 2)).softmax(-1)
    o = torch.einsum("bhij,bjhd->bihd", a, v).reshape(B, N, H * D)
    op = torch.einsum("bhij,bjhpc->bihpc", a, vp).reshape(B, N, H * VP, 3)
    op = torch.einsum("bnpc,bndc->bnpd", op - t.unsqueeze(2), r).reshape(B, N, -1)
    return F.linear(torch.cat([o, op], -1), W["o"])


def value_points_path(W, x, z, t, r):
    """Only the value points: frame, attention-weighted sum, inverse frame."""
    B, N, _ = x.shape
    vp = frame(F.linear(x, W["vp"]).view(B, N, H * VP, 3), r, t).view(B, N, H, VP, 3)
    a = F.linear(z, W["b"]).permute(0, 3, 1, 2).softmax(-1)
    op = torch.einsum("bhij,bjhpc->bihpc", a, vp).reshape(B, N, H * VP, 3)
    return torch.einsum("bnpc,bndc->bnpd", op - t.unsqueeze(2), r)


def value_points_frame(W, x, z, t, r):
    """Only the lead from the N = 3000 fault: the value points' frame (einsum + t)."""
    B, N, _ = x.shape
    return frame(F.linear(x, W["vp"]).view(B, N, H * VP, 3), r, t)


def frame_einsum_only(W, x, z, t, r):
    B, N, _ = x.shape
    return torch.einsum("bnpc,bncd->bnpd", F.linear(x, W["vp"]).view(B, N, H * VP, 3), r)


def query_key_distance(W, x, z, t, r):
    """The point-distance logits alone."""
    B, N, _ = x.shape
    qp = frame(F.linear(x, W["qp"]).view(B, N, H * QP, 3), r, t).view(B, N, H, QP, 3)
    kp = frame(F.linear(x, W["kp"]).view(B, N, H * QP, 3), r, t).view(B, N, H, QP, 3)
    return ((qp.unsqueeze(2) - kp.unsqueeze(1)) ** 2).sum(dim=(-1, -2))


LADDER = [full_ipa, value_points_path, query_key_distance, value_points_frame,
          frame_einsum_only]


def run_one(name: str, batch: int, length: int) -> str:
    fn = {f.__name__: f for f in LADDER}[name]
    dev, dtype = "cuda", torch.float64
    W = weights(dev, dtype)
    args = inputs(batch, length, dev, dtype)
    with torch.no_grad():
        eager = fn(W, *args)
        out = torch.compile(fn, dynamic=False)(W, *args)
        err = ((out - eager).norm() / eager.norm()).item()
    return f"rel_l2 {err:.3e}  nonfinite {(~out.isfinite()).sum().item()}"


def main() -> int:
    """Each (rung, shape) in its own process: an illegal memory access poisons the context."""
    if sys.argv[1:2] == ["--one"]:
        print(run_one(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
        return 0
    import subprocess

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, float64, "
          "Inductor defaults, dynamic=False")
    for fn in LADDER:
        for batch, length in SHAPES:
            run = subprocess.run([sys.executable, __file__, "--one", fn.__name__, str(batch),
                                  str(length)], capture_output=True, text=True, timeout=300)
            lines = (run.stdout + run.stderr).strip().splitlines()
            errors = [line for line in lines if "Error" in line]
            result = lines[-1] if run.returncode == 0 else (errors or lines or ["?"])[-1]
            print(f"{fn.__name__:<22} B={batch} N={length:<5} {result[:160]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
