"""sm_90 compile-time probe (no GPU) of one design for issue #17's fused pair bias: the bias of
every head as one tensor-core dot z(BLOCK_M * BLOCK_N, C) @ W_b^T(C, 16) per key block, split
into the heads' 2-D (BLOCK_M, BLOCK_N) tiles by a tree of `tl.split`s, each head's online softmax
and p.v as 2-D dots, the per-head state (q, m, l, acc) carried through the key loop as tuples.
`triton-fullfuse` does the same with 3-D (heads, rows, keys) tiles and spills. The probe kernel
has the scalar terms only: no points, masks or fp32 splits (bf16 operands), so its registers
are a lower bound for the real kernel's. Prints, per config, registers, spilled words, shared
bytes and the key loop's warp-instructions per (pair, head) (`sm90_proxy.key_loop`).

    PYTHONPATH=. build/sm90-proxy-venv/bin/python gpu_diagnostics/headsplit_probe.py

Result (2026-12-05, triton 3.6.0, N = 2048, H = 12, D = 16, C = 128): it compiles, at 1.19-2.4
warp-instructions per (pair, head) with the bias GEMM included (the `triton` bf16 attention
kernel alone: 1.22-1.34), but at 255 registers with 50-156 words spilled in every config, before
the point terms' 12 x 3 Vp accumulators and 12 x 3 Qp query coordinates a row are added.
"""

import torch
import triton
import triton.language as tl

from gpu_diagnostics import sm90_proxy as sp


@triton.jit
def split16(x):
    """(BM, BN, 16) -> 16 tensors (BM, BN), head order 0..15."""
    BM: tl.constexpr = x.shape[0]
    BN: tl.constexpr = x.shape[1]
    x = tl.reshape(x, [BM, BN, 2, 2, 2, 2])
    a, b = tl.split(x)          # last axis: head bit 0
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    a00, a01 = tl.split(a0)
    a10, a11 = tl.split(a1)
    b00, b01 = tl.split(b0)
    b10, b11 = tl.split(b1)
    # reshape [.., h3, h2, h1, h0] splits h0 first: a = h0=0, b = h0=1 ...
    p0, q0 = tl.split(a00)
    p1, q1 = tl.split(a10)
    p2, q2 = tl.split(a01)
    p3, q3 = tl.split(a11)
    p4, q4 = tl.split(b00)
    p5, q5 = tl.split(b10)
    p6, q6 = tl.split(b01)
    p7, q7 = tl.split(b11)
    return (p0, q0, p1, q1, p2, q2, p3, q3, p4, q4, p5, q5, p6, q6, p7, q7)


@triton.jit
def _probe(Q, K, V, Z, W, OUT, N, H: tl.constexpr, D: tl.constexpr, C: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
           PREC: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_h = tl.arange(0, 16)
    qs = ()
    ms = ()
    ls = ()
    accs = ()
    for h in tl.static_range(H):
        qs = qs + (tl.load(Q + offs_m[:, None] * (H * D) + h * D + offs_d[None, :]),)
        ms = ms + (tl.full([BLOCK_M], -1e30, tl.float32),)
        ls = ls + (tl.zeros([BLOCK_M], tl.float32),)
        accs = accs + (tl.zeros([BLOCK_M, D], tl.float32),)
    rows = tl.reshape(offs_m[:, None] * N + tl.arange(0, BLOCK_N)[None, :], [BLOCK_M * BLOCK_N])
    for j0 in range(0, N, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        bias = tl.zeros([BLOCK_M * BLOCK_N, 16], tl.float32)
        for c0 in tl.static_range(0, C, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            z = tl.load(Z + (rows[:, None] + j0).to(tl.int64) * C + offs_c[None, :])
            w = tl.load(W + offs_h[None, :] * C + offs_c[:, None], mask=offs_h[None, :] < H,
                        other=0.0)
            bias = tl.dot(z, w, bias, input_precision=PREC)
        heads = split16(tl.reshape(bias, [BLOCK_M, BLOCK_N, 16]))
        new_ms = ()
        new_ls = ()
        new_accs = ()
        for h in tl.static_range(H):
            k = tl.load(K + offs_n[None, :] * (H * D) + h * D + offs_d[:, None])  # (D, BN)
            v = tl.load(V + offs_n[:, None] * (H * D) + h * D + offs_d[None, :])  # (BN, D)
            s = tl.dot(qs[h], k, input_precision=PREC) + heads[h]
            m_new = tl.maximum(ms[h], tl.max(s, 1))
            alpha = tl.exp2(ms[h] - m_new)
            p = tl.exp2(s - m_new[:, None])
            new_ls = new_ls + (ls[h] * alpha + tl.sum(p, 1),)
            pv = tl.dot(p.to(v.dtype), v, input_precision=PREC)
            new_accs = new_accs + (accs[h] * alpha[:, None] + pv,)
            new_ms = new_ms + (m_new,)
        ms = new_ms
        ls = new_ls
        accs = new_accs
    for h in tl.static_range(H):
        tl.store(OUT + offs_m[:, None] * (H * D) + h * D + offs_d[None, :],
                 accs[h] / ls[h][:, None])


def run(bm, bn, bc, warps, stages, dtype, prec, n=2048, h=12, d=16, c=128):
    """Compile one config of `_probe` for sm_90 and print its figures."""
    q, k, v = (torch.empty(n, h * d, dtype=dtype) for _ in range(3))
    z = torch.empty(n * n * c, dtype=dtype)
    w = torch.empty(h * c, dtype=dtype)
    o = torch.empty(n, h * d, dtype=torch.float32)
    args = (q, k, v, z, w, o, n)
    kwargs = dict(H=h, D=d, C=c, PREC=prec)
    cfg = triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_C": bc}, num_warps=warps,
                        num_stages=stages)
    kern = sp.compile_config(args, kwargs, cfg, fn=_probe)
    regs, stack, sass = sp.sass_stats(kern.asm["cubin"])
    loop = sp.key_loop(sass)
    ipp = loop["common"] * warps / (bm * bn) / h
    print(f"{dtype} {prec} BM{bm} BN{bn} BC{bc} w{warps} s{stages}: {regs} regs, {stack // 4} "
          f"spilled, shared {kern.metadata.shared}, {ipp:.2f} warp-instr per (pair, head), "
          f"top ops {loop['ops'].most_common(6)}")


if __name__ == "__main__":
    for cfg in [(32, 16, 32, 4, 1), (32, 16, 64, 4, 1), (32, 16, 32, 8, 1), (64, 16, 32, 8, 1),
                (32, 16, 128, 8, 1), (16, 16, 64, 4, 1)]:
        run(*cfg, torch.bfloat16, "ieee")
