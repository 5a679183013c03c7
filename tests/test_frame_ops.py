"""The differentiable frame transforms of the training steps (`variants/triton/frames_op.py`:
`frames.py`'s kernels forward and backward as custom ops) against autograd through the
PyTorch form that defines them, for both problems' conventions.

CPU, under the Triton interpreter, at awkward sizes (B = 2, N = 37: one partial row block of
the backward's 16; H = 3, Qp = 2, Vp = 5), fp32 and bf16 local points, frames read through
strides (B > 1, not contiguous): every output and every gradient (local points, rotations,
translations, the kernels' value points, the centred translations' path from the epilogue back
to the prologue), and `torch.library.opcheck` on the four ops.
"""

from __future__ import annotations

import pytest
import torch

from tests.test_frames import (
    inverse_frames_definition,
    operands_definition,
    strided,
)
from tests.test_triton import HAS_TRITON, needs_interpreter

if HAS_TRITON:
    from variants.triton import frames, frames_op

pytestmark = [needs_interpreter, pytest.mark.usefixtures("one_thread")]

B, N, H, QP, VP = 2, 37, 3, 2, 5
EPS = 1e-8  # openfold's norms
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def openfold_definition(local, rotations, translations):
    """OpenFold's frames (SPEC-openfold.md step 3): local (B, N, 3 H Qp + 3 H (Qp + Vp)), the
    two point projections' [X | Y | Z] blocks, to R p + (t - mean t), as `operands_definition`'s
    dict."""
    from variants.openfold.reference import local_points

    centred_t = translations.float() - translations.mean(dim=1, dtype=torch.float32)[:, None]
    pts = torch.cat([local_points(part, H) for part in
                     local.float().split([3 * H * QP, 3 * H * (QP + VP)], dim=-1)], dim=3)
    pts = torch.einsum("bnxy,bnhpy->bnhpx", rotations.float(), pts)
    pts = pts + centred_t[:, :, None, None, :]
    q_pts, k_pts, v_pts = pts.split([QP, QP, VP], dim=3)
    rows = lambda p: p.reshape(B, N, H, -1).permute(0, 2, 3, 1)
    return dict(q_pts=rows(q_pts), k_pts=rows(k_pts),
                v_pts=v_pts.reshape(B, N, H, 3 * VP).transpose(1, 2), centred_t=centred_t)


def inverse_definition(convention, out_p, rotations, centred_t, dtype):
    """The epilogue's columns by the definitions: simplified (g - t) @ R^T as xyz triples;
    openfold R^T (g - t) as [X | Y | Z] blocks, then the norms (SPEC-openfold.md steps 8-10)."""
    if convention == "simplified":
        local = inverse_frames_definition(out_p.view(B, N, H * VP, 3), rotations.float(),
                                          centred_t)
        return local.reshape(B, N, 3 * H * VP).to(dtype)
    g = out_p.view(B, N, H * VP, 3) - centred_t[:, :, None, :]
    local = torch.einsum("bnyx,bnpy->bnpx", rotations.float(), g)
    norms = torch.sqrt((local ** 2).sum(dim=-1) + EPS)
    return torch.cat([*local.unbind(dim=-1), norms], dim=-1).to(dtype)


def case(convention: str, dtype: torch.dtype, seed: int = 0):
    """(local points (a column slice of a wider tensor, as the projections' output is),
    rotations and translations through strides, the kernels' value points near the frames)."""
    g = torch.Generator().manual_seed(seed)
    width = 3 * H * (2 * QP + VP)
    local = (torch.randn(B, N, width + 7, generator=g) * 3).to(dtype)[..., 7:]
    rotations = strided(torch.linalg.qr(torch.randn(B, N, 3, 3, generator=g))[0].to(dtype))
    translations = strided((torch.randn(B, N, 3, generator=g) * 20 + 60).to(dtype))
    out_p = torch.randn(B, N, H, 3 * VP, generator=g) * 10
    return local, rotations, translations, out_p


def forward(convention, dtype, local, rotations, translations, out_p, ops: bool):
    """The prologue's four outputs and the epilogue's columns (from the prologue's centred
    translations): by the ops, or by the definitions."""
    if ops:
        q, k, v, ct = frames_op.prologue(local, rotations, translations, heads=H,
                                         query_points=QP, value_points=VP,
                                         convention=convention)
        local_out = frames_op.epilogue(out_p, rotations, ct, dtype, convention=convention,
                                       eps=EPS)
        return q, k, v, ct, local_out
    define = (openfold_definition if convention == "openfold" else
              lambda *x: operands_definition(*x, H, QP, VP))
    pts = define(local, rotations, translations)
    local_out = inverse_definition(convention, out_p, rotations, pts["centred_t"], dtype)
    return pts["q_pts"], pts["k_pts"], pts["v_pts"], pts["centred_t"], local_out


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("convention", ["simplified", "openfold"])
def test_outputs_and_gradients_equal_autograd_through_the_definition(convention, precision):
    dtype = DTYPES[precision]
    if convention == "openfold":
        # (OpenFold's point projections run in fp32 in every dtype; its frames are fp32)
        base = case(convention, torch.float32)
    else:
        base = case(convention, dtype)
    results = {}
    for ops in (True, False):
        leaves = [t.detach().clone().requires_grad_(True) for t in base]
        outs = forward(convention, dtype, *leaves, ops=ops)
        grads_out = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i))
                     for i, o in enumerate(outs)]
        loss = sum((o.float() * w).sum() for o, w in zip(outs, grads_out, strict=True))
        results[ops] = ([o.detach() for o in outs],
                        torch.autograd.grad(loss, leaves))
    (outs, grads), (want_outs, want_grads) = results[True], results[False]
    for name, got, want in zip(("q_pts", "k_pts", "v_pts", "centred_t", "local"), outs,
                               want_outs, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        if name == "local" and dtype == torch.bfloat16:
            # (rounded once from fp32 in both; a product summed in another order can move it)
            torch.testing.assert_close(got, want, rtol=2.0 ** -8, atol=1e-3, msg=name)
        else:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5, msg=name)
    # Gradients: fp32 sums in another order (fp32 rounding), then each cast to its input's
    # dtype once (bf16: the definition's autograd rounds the translations' gradient twice).
    bound = 1e-6 if base[0].dtype == torch.float32 else 2.0 ** -8
    for name, got, want in zip(("local", "rotations", "translations", "out_p"), grads,
                               want_grads, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        assert rel(got, want) <= bound, (name, rel(got, want))
    # and the centred translations' gradient reaches the translations from both ops: without
    # the epilogue's part the translations' gradient would differ
    assert want_grads[2].abs().max() > 0


@pytest.mark.parametrize("convention", ["simplified", "openfold"])
def test_opcheck(convention):
    local, rotations, translations, out_p = case(convention, torch.float32)
    local = local.detach().requires_grad_(True)
    sizes = (H, QP, VP, convention)
    torch.library.opcheck(frames_op._prologue.op, (local, rotations, translations, *sizes))
    q, k, v, ct = frames_op._prologue(local, rotations, translations, *sizes)
    torch.library.opcheck(frames_op._prologue_backward.op,
                          (torch.ones_like(q), torch.ones_like(k), torch.ones_like(v),
                           torch.ones_like(ct), local.detach(), rotations, translations, *sizes))
    torch.library.opcheck(frames_op._epilogue.op,
                          (out_p.requires_grad_(True), rotations, ct.detach(), torch.float32,
                           convention, EPS))
    width = (4 if convention == "openfold" else 3) * H * VP
    torch.library.opcheck(frames_op._epilogue_backward.op,
                          (torch.ones(B, N, width), out_p.detach(), rotations, ct.detach(),
                           convention, EPS))



def test_eager_calls_skip_the_dispatcher_and_traced_calls_do_not(monkeypatch):
    # `variants.custom_ops.Op`: a plain eager call runs the implementation through an
    # autograd.Function; under a dispatch mode (as FakeTensorMode or make_fx trace) the op.
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []
    op = frames_op._epilogue.op
    monkeypatch.setattr(frames_op._epilogue, "op", lambda *a: calls.append(a) or op(*a))
    local, rotations, translations, out_p = case("simplified", torch.float32)
    _, _, _, ct = frames_op.prologue(local, rotations, translations, heads=H, query_points=QP,
                                     value_points=VP)
    out_p.requires_grad_(True)
    eager = frames_op.epilogue(out_p, rotations, ct, torch.float32)
    assert calls == [] and eager.grad_fn is not None

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough():
        traced = frames_op.epilogue(out_p, rotations, ct, torch.float32)
    assert len(calls) == 1
    torch.testing.assert_close(traced, eager, rtol=0, atol=0)


@pytest.mark.parametrize("rows", [4, 16])
@pytest.mark.parametrize("convention", ["simplified", "openfold"])
def test_backward_kernels_at_every_row_block(convention, rows, monkeypatch):
    """The backward kernels' other row blocks (the test above takes 8 rows at B = 2, N = 37)."""
    monkeypatch.setattr(frames, "_backward_rows", lambda *args: rows)
    test_outputs_and_gradients_equal_autograd_through_the_definition(convention, "fp32")


def test_backward_row_blocks_fill_the_gpu(monkeypatch):
    monkeypatch.setattr(frames, "sm_count", lambda device: 132)
    gpu = torch.device("cuda")  # (only its type is read)
    assert [frames._backward_rows(n, b, gpu) for n, b in [(4096, 1), (2048, 1), (1024, 1),
                                                          (1024, 4), (256, 1)]] == [8, 4, 4, 8, 4]
    assert frames._backward_rows(37, 2, torch.device("cpu")) == 8  # as if on 4 SMs
