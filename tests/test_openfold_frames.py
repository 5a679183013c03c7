"""Problem `openfold`'s `triton` forward (`triton_fused.FusedForward`) with its frame work as
`variants/triton/frames.py`'s two kernels (convention `frames.OPENFOLD`), against the PyTorch
formulation it replaced (`pytorch_forward` below: the previous `FusedForward.__call__`, kept
here as the definition; `FusedCore` still prepares the points itself when given none).

CPU, under the Triton interpreter (`TRITON_INTERPRET=1`), at awkward sizes (B = 2 with a
padded tail, N = 37, H = 3, Pq = 2, Pv = 5, c_hidden = 8: nothing a power of two, a partial
row block) and the default layer at a small N, fp32 and bf16: every operand of the fused
kernel's launch equals what `FusedCore` builds from the PyTorch form's points (fp32: to the
bit; through strided frames too); the prologue applies OpenFold's frames in the default layout
too; the epilogue equals the module's `to_local`, the [X | Y | Z] permute and the norms (their
roots correctly rounded, which torch's CPU sqrt is not quite), and writes nothing else; the
whole forward equals the PyTorch formulation's (fp32: to the bit with that root); and it is
the handful of launches it should be. The variant against the float64 oracle:
tests/test_openfold_triton.py and tests/test_openfold.py's generated tests.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.test_frames import EXACT, LaunchRecorder, assert_same_operands, named_operands
from tests.test_openfold_triton import needs_interpreter
from variants.openfold.problem import OpenFoldConfig, init_state_dict, make_inputs
from variants.openfold.reference import local_points, make_module

pytestmark = [needs_interpreter, pytest.mark.usefixtures("one_thread")]

AWKWARD = OpenFoldConfig(c_s=24, c_z=12, c_hidden=8, no_heads=3, no_qk_points=2,
                         no_v_points=5)
CASES = {"awkward": (AWKWARD, [37, 23]), "default": (OpenFoldConfig(), [12])}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TIGHT = dict(rtol=1e-6, atol=1e-6)


def setup(case: str, precision: str, seed: int = 0):
    """(the forward, inputs (s, z, translations, rotations, mask))."""
    from variants.openfold.triton_fused import FusedForward

    cfg, lengths = CASES[case]
    dtype = DTYPES[precision]
    module = make_module(init_state_dict(cfg, seed=seed), cfg, "cpu", dtype)
    forward = FusedForward(module, torch.device("cpu"), dtype, "ieee")
    x = make_inputs(cfg, len(lengths), max(lengths), dtype=dtype, seed=seed, lengths=lengths)
    return forward, x.as_tuple()


def strided(t: torch.Tensor) -> torch.Tensor:
    """t's values with the batch and residue axes' storage swapped (B > 1: not contiguous)."""
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def correctly_rounded_sqrt(x: torch.Tensor) -> torch.Tensor:
    """fp32 x's root rounded to nearest (the GPU's sqrt.rn, numpy's; torch's CPU sqrt is an ulp
    off for some values)."""
    return x.double().sqrt().float()


def frame_product(matrix: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """sum_y M[..., x, y] v[..., y] for frames M (B, N, 3, 3) and points v (B, N, H, P, 3), the
    products added y = 0, 1, 2 in order by elementwise ops: what the frame kernels compute, to
    the bit under the interpreter. (torch's CPU einsum, the module's form, may fuse a product
    and a sum into an FMA on some CPUs: an ulp apart on an AVX-512 machine, 2026-12-06.)"""
    m = matrix[:, :, None, None]
    return v[..., 0:1] * m[..., 0] + v[..., 1:2] * m[..., 1] + v[..., 2:3] * m[..., 2]


def pytorch_forward(forward, s, z, translations, rotations, mask, sqrt=torch.sqrt):
    """The previous `FusedForward.__call__` (inputs unchecked): the frames, the [X | Y | Z]
    permute and the norms in PyTorch, the module's `to_global` and `to_local` (as
    `frame_product`s), `FusedCore` preparing the kernel's operands from (B, N, H, 3P) points.
    `sqrt`: the norms' root."""
    cfg, mod = forward.config, forward.module
    B, N, _ = s.shape
    H, C, Pq, Pv = cfg.no_heads, cfg.c_hidden, cfg.no_qk_points, cfg.no_v_points
    with torch.no_grad():
        # the forward's own GEMMs (`Projections.linear`: 3xTF32 for fp32 operands)
        qkv = forward.linear(s, forward.w_qkv, forward.b_qkv)  # [q | k | v] (`Projections`)
        q, k, v = (qkv[..., i * H * C:(i + 1) * H * C].view(B, N, H, C) for i in range(3))
        rot = rotations.float()
        trans = translations.float()
        trans = trans - trans.mean(dim=1, keepdim=True)
        s_pts = s if forward.dtype == torch.float32 else s.float()
        y = forward.linear(s_pts, forward.w_points, forward.b_points)
        local = torch.cat([local_points(part, H) for part in
                           (y[..., :3 * H * Pq], y[..., 3 * H * Pq:])], dim=3)
        pts = frame_product(rot, local) + trans[:, :, None, None, :]
        q_pts = pts[..., :Pq, :].reshape(B, N, H, 3 * Pq)
        k_pts = pts[..., Pq:2 * Pq, :].reshape(B, N, H, 3 * Pq)
        v_pts = pts[..., 2 * Pq:, :].reshape(B, N, H, 3 * Pv)
        hc, hp = H * C, H * Pv
        cat = torch.empty(B, N, cfg.out_in_features, dtype=torch.float32)
        o_pt = torch.empty(B, N, H, 3 * Pv, dtype=torch.float32)
        forward.core(q, k, v, q_pts, k_pts, v_pts, z, mask.float().contiguous(), cat, o_pt)
        centred = o_pt.view(B, N, H, Pv, 3) - trans[:, :, None, None, :]
        local = frame_product(rot.transpose(2, 3), centred).reshape(B, N, hp, 3)
        cat[..., hc:hc + 3 * hp] = local.permute(0, 1, 3, 2).reshape(B, N, 3 * hp)
        cat[..., hc + 3 * hp:hc + 4 * hp] = sqrt((local ** 2).sum(dim=-1) + cfg.eps)
        return forward.linear(cat.to(forward.dtype), mod.linear_out.weight, mod.linear_out.bias)


# ---- the prologue: every operand of the kernel's launch --------------------------------------


def recorded_launches(forward, inputs, monkeypatch):
    """{name: argument} of the kernel's launch, from the forward and from `pytorch_forward`."""
    from variants.openfold import triton_kernel

    recorder = LaunchRecorder()
    monkeypatch.setattr(triton_kernel, "launch", recorder)
    forward(*inputs)
    pytorch_forward(forward, *inputs)
    (_, fused_kw), (_, torch_kw) = recorder.calls
    assert {k: v for k, v in fused_kw.items() if k != "lows"} == {
        k: v for k, v in torch_kw.items() if k != "lows"}
    return named_operands(recorder.calls[0]), named_operands(recorder.calls[1])


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
def test_launch_operands_equal_what_fused_core_builds(case, precision, monkeypatch):
    forward, inputs = setup(case, precision)
    layout = forward.layout
    assert layout.v_padded and layout.point_rows == (precision != "fp32")
    assert layout.v_low == (precision == "fp32")  # fp32 IEEE dots: the TC configs' low parts
    fused, want = recorded_launches(forward, inputs, monkeypatch)
    assert_same_operands(fused, want, layout)


@pytest.mark.parametrize("precision", list(DTYPES))
def test_prologue_reads_frames_through_their_strides(precision, monkeypatch):
    forward, (s, z, trans, rot, mask) = setup("awkward", precision)
    s_trans, s_rot = strided(trans), strided(rot.transpose(2, 3)).transpose(2, 3)
    assert not s_trans.is_contiguous() and not s_rot.is_contiguous()
    fused, want = recorded_launches(forward, (s, z, s_trans, s_rot, mask), monkeypatch)
    assert_same_operands(fused, want, forward.layout)
    contiguous, _ = recorded_launches(forward, (s, z, trans, rot, mask), monkeypatch)
    for name in ("q_pts", "k_pts", "v_pts"):
        # (the mean of strided translations may be summed in another order: an ulp of 100 A)
        torch.testing.assert_close(fused[name], contiguous[name], rtol=1e-6, atol=1e-5,
                                   msg=name)


@pytest.mark.parametrize("precision", list(DTYPES))
def test_prologue_applies_openfolds_frames_in_any_layout(precision):
    # The default layout (`Operands`', which no openfold forward uses) with OpenFold's points:
    # R p + (t - mean) of PointProjection's [X | Y | Z] columns, q, k and v, and the centred
    # translations, as the module's einsum computes them.
    from variants.triton import frames

    forward, (s, _, trans, rot, _) = setup("awkward", precision)
    cfg = forward.config
    H, Pq, Pv = cfg.no_heads, cfg.no_qk_points, cfg.no_v_points
    y = F.linear(s.float(), forward.w_points, forward.b_points)
    mean = trans.mean(dim=1, dtype=torch.float32)
    pts = frames.prologue(y, rot, trans, mean, heads=H, head_dim=cfg.c_hidden,
                          query_points=Pq, value_points=Pv, convention=frames.OPENFOLD)
    centred = trans.float() - mean[:, None]
    torch.testing.assert_close(pts.centred_t, centred, **EXACT)
    local = torch.cat([local_points(part, H) for part in
                       (y[..., :3 * H * Pq], y[..., 3 * H * Pq:])], dim=3)
    glob = frame_product(rot.float(), local) + centred[:, :, None, None]  # (B, N, H, 2Pq+Pv, 3)
    torch.testing.assert_close(glob - centred[:, :, None, None],  # the module's form
                               torch.einsum("bnxy,bnhpy->bnhpx", rot.float(), local), **TIGHT)
    per_head = lambda first, count: glob[..., first:first + count, :].flatten(3)
    torch.testing.assert_close(pts.q_pts, per_head(0, Pq).permute(0, 2, 3, 1), **EXACT)
    torch.testing.assert_close(pts.k_pts, per_head(Pq, Pq).permute(0, 2, 3, 1), **EXACT)
    torch.testing.assert_close(pts.v_pts, per_head(2 * Pq, Pv).transpose(1, 2), **EXACT)


# ---- the epilogue ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_epilogue_equals_to_local_and_norms(case):
    # Into linear_out's input at [X | Y | Z | norms] (SPEC steps 8-10), nothing else touched.
    from variants.triton import frames

    cfg, lengths = CASES[case]
    b, n = len(lengths), max(lengths)
    h, c, pv = cfg.no_heads, cfg.c_hidden, cfg.no_v_points
    hc, hp = h * c, h * pv
    module = make_module(init_state_dict(cfg), cfg, "cpu", torch.float32)
    x = make_inputs(cfg, b, n, seed=3, lengths=lengths)
    rot = strided(x.rotations.transpose(2, 3)).transpose(2, 3)
    g = torch.Generator().manual_seed(3)
    centred_t = torch.randn(b, n, 3, generator=g) * 30
    o_pt = centred_t.repeat(1, 1, hp).view(b, n, h, 3 * pv)
    o_pt = o_pt + torch.randn(b, n, h, 3 * pv, generator=g) * 5
    o_pt[0, 0, 0, :3] = centred_t[0, 0]  # a point at its frame's origin: the norm is sqrt(eps)
    cat = torch.full((b, n, cfg.out_in_features), 7.0)
    frames.epilogue(o_pt, rot, centred_t, cat, hc, convention=frames.OPENFOLD, eps=cfg.eps)
    points = o_pt.view(b, n, h, pv, 3)
    local = frame_product(rot.transpose(2, 3), points - centred_t[:, :, None, None])
    torch.testing.assert_close(local, module.to_local(points, rot, centred_t), **TIGHT)
    local = local.reshape(b, n, hp, 3)
    torch.testing.assert_close(cat[..., hc:hc + 3 * hp],
                               local.permute(0, 1, 3, 2).reshape(b, n, 3 * hp), **EXACT)
    # The norms: the same fp32 sum, and its root correctly rounded (sqrt.rn on the GPU, as
    # torch's CUDA sqrt; numpy's under the interpreter), which torch's CPU sqrt is not (an ulp
    # off for ~17 % of these values)
    squares = (local ** 2).sum(dim=-1) + cfg.eps
    got = cat[..., hc + 3 * hp:hc + 4 * hp]
    torch.testing.assert_close(got, correctly_rounded_sqrt(squares), **EXACT)
    torch.testing.assert_close(got, torch.sqrt(squares), rtol=2.0 ** -23, atol=0)
    assert cat[0, 0, hc + 3 * hp] == correctly_rounded_sqrt(torch.tensor(cfg.eps))
    assert (cat[..., :hc] == 7).all() and (cat[..., hc + 4 * hp:] == 7).all()


# ---- the whole forward ----------------------------------------------------------------------


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
def test_forward_equals_the_pytorch_formulation(case, precision):
    # The same kernel on the same operands. fp32: to the bit once the norms' roots are
    # correctly rounded in both (torch's CPU sqrt is not: `test_epilogue_equals_to_local...`),
    # an ulp or two as it was. bf16: a bf16 ulp, where the distance rows' sums |q|^2, |k|^2
    # (added in another order by the prologue) or a norm's ulp move a rounding.
    forward, inputs = setup(case, precision)
    got = forward(*inputs)
    want = pytorch_forward(forward, *inputs)
    assert got.dtype == want.dtype == DTYPES[precision] and not got.requires_grad
    if precision == "fp32":
        rounded = pytorch_forward(forward, *inputs, sqrt=correctly_rounded_sqrt)
        torch.testing.assert_close(got, rounded, **EXACT)
        torch.testing.assert_close(got, want, **TIGHT)
    else:
        torch.testing.assert_close(got, want, rtol=2.0 ** -7, atol=2.0 ** -7)


def _kernel_ops(fn, *args) -> list[str]:
    """The ATen ops `fn(*args)` runs that compute something (views, allocations and no-op
    conversions left out), and its Triton launches as 'triton:<kernel>', in order."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.interpreter import InterpretedFunction

    skipped = {"view", "_unsafe_view", "slice", "select", "permute", "transpose", "t",
               "expand", "unsqueeze", "squeeze", "split", "detach", "alias", "as_strided",
               "empty", "empty_like", "empty_strided", "new_empty", "lift_fresh"}
    ops: list[str] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in skipped:
                ops.append(name)
            return func(*args, **(kwargs or {}))

    run = InterpretedFunction.run

    def counted(self, *a, **k):
        ops.append(f"triton:{self.fn.__name__}")
        with torch.utils._python_dispatch._disable_current_modes():
            return run(self, *a, **k)

    InterpretedFunction.run = counted
    try:
        with Recorder():
            fn(*args)
    finally:
        InterpretedFunction.run = run
    return ops


@pytest.mark.parametrize("precision", list(DTYPES))
def test_a_forward_is_a_handful_of_launches(precision):
    # GEMM q|kv, (bf16: s upcast,) GEMM points, the mean, the prologue, (bf16: the mask
    # upcast, as before,) the kernel, the epilogue, (bf16: the cast,) linear_out: FusedCore
    # prepares nothing. The fp32 GEMMs are 3xTF32 Triton kernels (`Projections.linear`), the
    # bf16 ones cuBLAS's. The PyTorch formulation: 38 (fp32) and 57 (bf16), its frame
    # products spelled elementwise (`frame_product`; as the module's einsums, 30 and 49).
    forward, inputs = setup("awkward", precision)
    bf16 = precision == "bf16"
    cast = ["_to_copy"] if bf16 else []
    gemm16 = "addmm" if bf16 else "triton:_linear_kernel"
    assert _kernel_ops(forward, *inputs) == [
        gemm16, *cast, "triton:_linear_kernel", "mean", "triton:_prologue_kernel", *cast,
        "triton:_openfold_kernel", "triton:_epilogue_kernel", *cast, gemm16]
    assert len(_kernel_ops(pytorch_forward, forward, *inputs)) == (
        38 if precision == "fp32" else 57)
