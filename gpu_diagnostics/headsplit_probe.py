"""sm_90 compile-time probe (no GPU) of one design for issue #17's fused pair bias: the bias of
every head as one tensor-core dot z(BLOCK_M * BLOCK_N, C) @ W_b^T(C, 16) per key block, split
into the heads' 2-D (BLOCK_M, BLOCK_N) tiles by a tree of `tl.split`s, each head's online softmax
and p.v as 2-D dots, the per-head state (q, m, l, acc) carried through the key loop as tuples.
`triton-fullfuse` does the same with 3-D (heads, rows, keys) tiles and spills. A program owns G
heads of one query block (H / G programs read the same z tile, through L2 after the first), so
the dot's 16 columns serve G heads. With POINTS, the squared distances are one 16-wide TF32 dot
of augmented coordinates per head (the attention kernel's `points_dot` form) and p.vp another.
bf16 operands, no masks: the registers are a lower bound for a real kernel's. Prints, per
config, registers, spilled words, shared bytes, and the key loop's warp-instructions per (pair,
head) with its LDL / STL (`sm90_proxy.key_loop`).

    PYTHONPATH=. build/sm90-proxy-venv/bin/python gpu_diagnostics/headsplit_probe.py

Results (2026-12-05, triton 3.6.0, N = 2048, H = 12, D = 16, C = 128, one stage):

| | G = 12 | G = 6 | G = 4 | G = 3 | G = 2 |
|---|---|---|---|---|---|
| scalar terms, (64, 16, 8 warps) | 1.20, 54 spilled | **1.45, none** | 1.81, none | | |
| with points, (64, 16, 8 warps) | | 2.43, 96 | **2.79, 46** | 3.14, 24 | 3.74, 8 |

The `triton` bf16 forward today: the attention kernel 1.22 per (pair, head) plus the bias GEMM
(~2.4 per (pair, head)) and the bias's N x N round trip. Wider key blocks (BN 32) and 128-row
blocks spill hundreds of words.
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
    # h = 8 h3 + 4 h2 + 2 h1 + h0 on axes [.., h3, h2, h1, h0]: each split takes the last bit
    p0, q0 = tl.split(a00)
    p1, q1 = tl.split(a10)
    p2, q2 = tl.split(a01)
    p3, q3 = tl.split(a11)
    p4, q4 = tl.split(b00)
    p5, q5 = tl.split(b10)
    p6, q6 = tl.split(b01)
    p7, q7 = tl.split(b11)
    # p0 is head 0, p4 head 1, p1 head 2, ..., q0 head 8 (q: h3 = 1)
    return (p0, p4, p1, p5, p2, p6, p3, p7, q0, q4, q1, q5, q2, q6, q3, q7)


@triton.jit
def _probe(Q, K, V, QP, KP, VP, Z, W, OUT, OUTP, N, H: tl.constexpr, G: tl.constexpr,
           D: tl.constexpr, C: tl.constexpr, P3: tl.constexpr, VP3: tl.constexpr,
           POINTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_C: tl.constexpr, PREC: tl.constexpr):
    """G heads of one query block (group program_id(1)); with POINTS the squared distances as
    one 16-wide TF32 dot of augmented coordinates (the `points_dot` form) and the value points'
    p.vp (a TF32 dot)."""
    pid = tl.program_id(0)
    h0 = tl.program_id(1) * G
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_h = tl.arange(0, 16)
    offs_e = tl.arange(0, 32)
    qs = ()
    ms = ()
    ls = ()
    accs = ()
    accps = ()
    qcs = ()
    for t in tl.static_range(G):
        h = h0 + t
        qs = qs + (tl.load(Q + offs_m[:, None] * (H * D) + h * D + offs_d[None, :]),)
        ms = ms + (tl.full([BLOCK_M], -1e30, tl.float32),)
        ls = ls + (tl.zeros([BLOCK_M], tl.float32),)
        accs = accs + (tl.zeros([BLOCK_M, D], tl.float32),)
        if POINTS:  # the query side of the distance dot: [-2 q' | |q'|^2 | 1 | 0] per row
            accps = accps + (tl.zeros([BLOCK_M, 32], tl.float32),)
            qcs = qcs + (tl.load(QP + (h * N + offs_m[:, None]) * 16 + offs_h[None, :]),)
    rows = tl.reshape(offs_m[:, None] * N + tl.arange(0, BLOCK_N)[None, :], [BLOCK_M * BLOCK_N])
    for j0 in range(0, N, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        bias = tl.zeros([BLOCK_M * BLOCK_N, 16], tl.float32)
        for c0 in tl.static_range(0, C, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            z = tl.load(Z + (rows[:, None] + j0).to(tl.int64) * C + offs_c[None, :])
            w = tl.load(W + (h0 + offs_h[None, :]) * C + offs_c[:, None],
                        mask=offs_h[None, :] < G, other=0.0)
            bias = tl.dot(z, w, bias, input_precision=PREC)
        heads = split16(tl.reshape(bias, [BLOCK_M, BLOCK_N, 16]))
        new_ms = ()
        new_ls = ()
        new_accs = ()
        new_accps = ()
        for t in tl.static_range(G):
            h = h0 + t
            k = tl.load(K + offs_n[None, :] * (H * D) + h * D + offs_d[:, None])  # (D, BN)
            v = tl.load(V + offs_n[:, None] * (H * D) + h * D + offs_d[None, :])  # (BN, D)
            s = tl.dot(qs[t], k, input_precision=PREC) + heads[t]
            if POINTS:  # key side [k' | 1 | |k'|^2 | 0], (16, BN): one TF32 dot
                ka = tl.load(KP + (h * 16 + offs_h[:, None]) * N + offs_n[None, :])
                s = s - 0.1 * tl.dot(qcs[t], ka, input_precision="tf32")
            m_new = tl.maximum(ms[t], tl.max(s, 1))
            alpha = tl.exp2(ms[t] - m_new)
            p = tl.exp2(s - m_new[:, None])
            new_ls = new_ls + (ls[t] * alpha + tl.sum(p, 1),)
            pv = tl.dot(p.to(v.dtype), v, input_precision=PREC)
            new_accs = new_accs + (accs[t] * alpha[:, None] + pv,)
            if POINTS:
                vp = tl.load(VP + (h * N + offs_n[:, None]) * VP3 + offs_e[None, :],
                             mask=offs_e[None, :] < VP3, other=0.0)
                pvp = tl.dot(p, vp, input_precision="tf32")
                new_accps = new_accps + (accps[t] * alpha[:, None] + pvp,)
            new_ms = new_ms + (m_new,)
        ms = new_ms
        ls = new_ls
        accs = new_accs
        accps = new_accps
    for t in tl.static_range(G):
        h = h0 + t
        tl.store(OUT + offs_m[:, None] * (H * D) + h * D + offs_d[None, :],
                 accs[t] / ls[t][:, None])
        if POINTS:
            tl.store(OUTP + (offs_m[:, None] * H + h) * 32 + offs_e[None, :],
                     accps[t] / ls[t][:, None])


def run(bm, bn, bc, warps, g, points, dtype=torch.bfloat16, prec="ieee", n=2048, h=12, d=16,
        c=128, p3=12, vp3=24):
    """Compile one config of `_probe` (one stage) for sm_90 and print its figures."""
    q, k, v = (torch.empty(n, h * d, dtype=dtype) for _ in range(3))
    qp, kp = (torch.empty(h * 16 * n) for _ in range(2))
    vp = torch.empty(h * n * vp3)
    z = torch.empty(n * n * c, dtype=dtype)
    w = torch.empty(h * c, dtype=dtype)
    o, op = torch.empty(n, h * d), torch.empty(n * h * 32)
    args = (q, k, v, qp, kp, vp, z, w, o, op, n)
    kwargs = dict(H=h, G=g, D=d, C=c, P3=p3, VP3=vp3, POINTS=points, PREC=prec)
    cfg = triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_C": bc}, num_warps=warps,
                        num_stages=1)
    kern = sp.compile_config(args, kwargs, cfg, fn=_probe)
    regs, stack, sass = sp.sass_stats(kern.asm["cubin"])
    loop = sp.key_loop(sass)
    ipp = loop["common"] * warps / (bm * bn) / g
    print(f"{'points' if points else 'scalar'} G{g} BM{bm} BN{bn} BC{bc} w{warps}: {regs} regs, "
          f"{stack // 4} spilled, shared {kern.metadata.shared}, {ipp:.2f} warp-instr per "
          f"(pair, head), LDL {loop['ops']['LDL']} STL {loop['ops']['STL']}")


if __name__ == "__main__":
    for points in (False, True):
        for g in (12, 6, 4):
            for bm, bn, bc, warps in [(32, 16, 32, 4), (64, 16, 32, 8), (32, 16, 32, 8)]:
                run(bm, bn, bc, warps, g, points)
