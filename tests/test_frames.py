"""The frame kernels around the Triton IPA kernels (`variants/triton/frames.py`) against the
PyTorch form that defines them (`frames_definition`, `inverse_frames_definition` below: what
`pipeline._around_kernels` spelled in PyTorch before), in both of its routes: grad mode off
(the kernels, writing the attention kernels' layouts and into out_proj's input) and autograd
(the same kernels as the custom ops of `frames_op.py`).

CPU, under the Triton interpreter (`TRITON_INTERPRET=1`, as `make test` sets it without a GPU),
at awkward sizes (B = 2, N = 37, H = 3, Qp = 2, Vp = 5: nothing a power of two, one partial
row block) and the default layer at a small N, fp32 and bf16 projections: the prologue's point
operands and centred translations equal the definition's in both routes (through strided
frames too); the layouts it writes for `triton-pairdot` equal those `FusedCore` builds (every
argument of the openfold kernel's launch); the epilogue equals the inverse definition cast into
out_proj's input and writes nothing else; the whole forward of `triton`, `triton-fullfuse`,
`triton-pairdot` and the training forward is the same in both routes; a training step runs the
two kernels forward and their two backward kernels. The ops' gradients against autograd
through the definition: tests/test_frame_ops.py; the training variants' gradients against the
float64 oracle: tests/test_triton_backward.py and tests/test_training.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.test_triton import HAS_TRITON, needs_interpreter
from variants.problem import IPAConfig, make_inputs
from variants.reference import init_state_dict

if HAS_TRITON:
    from variants.openfold import triton_kernel
    from variants.triton import frames, pipeline
    from variants.triton.pipeline import (
        TritonIPAWeights,
        pairdot_core,
        training_parameters,
        triton_fullfuse_ipa,
        triton_ipa,
        triton_pairdot_ipa,
        triton_train_ipa,
    )

pytestmark = [needs_interpreter, pytest.mark.usefixtures("one_thread")]

AWKWARD = IPAConfig(node_dim=24, pair_dim=8, heads=3, query_points=2, value_points=5)
CASES = {"awkward": (2, 37, AWKWARD), "default": (1, 12, IPAConfig())}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TIGHT = dict(rtol=1e-6, atol=1e-6)


def frames_definition(pts, rotations, centred_t):
    """Local -> global: p @ R + t, elementwise in fp32 (no TF32). pts (B, N, P, 3)."""
    return (pts.unsqueeze(-1) * rotations.unsqueeze(2)).sum(-2) + centred_t.unsqueeze(2)


def inverse_frames_definition(pts, rotations, centred_t):
    """Global -> local: (g - t) @ R^T, elementwise in fp32. pts (B, N, P, 3)."""
    return ((pts - centred_t.unsqueeze(2)).unsqueeze(-2) * rotations.unsqueeze(2)).sum(-1)


def operands_definition(local, rotations, translations, heads, query_points, value_points):
    """The prologue's outputs by the definition: local (B, N, 3 H (2 Qp + Vp)) in any dtype
    -> {q_pts, k_pts (B, H, 3 Qp, N), v_pts (B, H, N, 3 Vp), centred_t (B, N, 3)}, fp32."""
    b, n, _ = local.shape
    h, qp, vp = heads, query_points, value_points
    centred_t = translations.float() - translations.mean(dim=1, dtype=torch.float32)[:, None]
    pts = frames_definition(local.float().reshape(b, n, -1, 3), rotations.float(), centred_t)
    q_pts, k_pts, v_pts = pts.split([h * qp, h * qp, h * vp], dim=2)
    q_pts, k_pts = (t.reshape(b, n, h, 3 * qp).permute(0, 2, 3, 1) for t in (q_pts, k_pts))
    return dict(q_pts=q_pts, k_pts=k_pts, v_pts=v_pts.reshape(b, n, h, 3 * vp).transpose(1, 2),
                centred_t=centred_t)


def definition_of(weights, inputs) -> dict:
    """`operands_definition` of the layer's own local points (LayerNorm and the input GEMM as
    `_around_kernels` computes them)."""
    node, _, trans, rot = inputs
    cfg = weights.config
    x = torch.nn.functional.layer_norm(node, (cfg.node_dim,), weights.ln_weight, weights.ln_bias)
    local = torch.nn.functional.linear(x, weights.w_in)[..., 3 * cfg.heads * cfg.head_dim:]
    return operands_definition(local, rot, trans, cfg.heads, cfg.query_points,
                               cfg.value_points)


def setup(case: str, precision: str, seed: int = 0):
    """(config, weights, inputs (node_repr, pair_repr, translations, rotations))."""
    b, n, cfg = CASES[case]
    dtype = DTYPES[precision]
    weights = TritonIPAWeights.from_state_dict(init_state_dict(cfg, seed=seed), cfg, "cpu",
                                               dtype)
    x = make_inputs(cfg, b, n, dtype=dtype, seed=seed)
    return cfg, weights, (x.node_repr, x.pair_repr, x.translations, x.rotations)


def strided(t: torch.Tensor) -> torch.Tensor:
    """t's values with the batch and residue axes' storage swapped (B > 1: not contiguous)."""
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def around(weights, inputs, *, autograd: bool, layout=None, out_p=None):
    """`_around_kernels` with a stand-in core that records its operands and returns `out_p`
    (zeros by default): (operands, output). `autograd`: translations require grad (the
    PyTorch form), else grad mode is off (the kernels)."""
    node, pair, trans, rot = inputs
    seen = {}

    def kernels(ops):
        seen["ops"] = ops
        ops.out_s.copy_(ops.q)  # (the other output; anything defined)
        b, n, h, _ = ops.q.shape
        vp3 = 3 * weights.config.value_points
        return ops.out_s, torch.zeros(b, n, h, vp3) if out_p is None else out_p

    layout = frames.OPERANDS if layout is None else layout
    with torch.set_grad_enabled(autograd):
        trans = trans.detach().clone().requires_grad_(autograd)
        out = pipeline._around_kernels(weights, node, pair, trans, rot, kernels, layout)
    assert out.requires_grad == autograd
    return seen["ops"], out.detach()


# ---- the prologue ---------------------------------------------------------------------------


ROUTES = {"kernels": False, "ops": True}  # `around`'s autograd flag per route


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
def test_prologue_equals_the_pytorch_form(case, precision, route):
    _, weights, inputs = setup(case, precision)
    ops, _ = around(weights, inputs, autograd=ROUTES[route])
    want = definition_of(weights, inputs)
    assert ops.lows is None
    for name in ("q_pts", "k_pts", "v_pts", "centred_t"):
        got = getattr(ops, name)
        assert got.dtype == torch.float32 and got.is_contiguous(), name
        torch.testing.assert_close(got.detach(), want[name], **TIGHT, msg=name)


@pytest.mark.parametrize("precision", list(DTYPES))
def test_both_routes_give_the_kernels_the_same_views(precision):
    _, weights, inputs = setup("awkward", precision)
    kernels, _ = around(weights, inputs, autograd=False)
    ops, _ = around(weights, inputs, autograd=True)
    for name in ("q", "k", "v", "out_s"):  # views of the GEMM's output and of cat
        got, want = getattr(kernels, name), getattr(ops, name)
        assert got.shape == want.shape and got.stride() == want.stride(), name


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("precision", list(DTYPES))
def test_prologue_reads_frames_through_their_strides(precision, route):
    _, weights, (node, pair, trans, rot) = setup("awkward", precision)
    s_trans, s_rot = strided(trans), strided(rot.transpose(2, 3)).transpose(2, 3)
    assert not s_trans.is_contiguous() and not s_rot.is_contiguous()
    got, _ = around(weights, (node, pair, s_trans, s_rot), autograd=ROUTES[route])
    want = definition_of(weights, (node, pair, s_trans, s_rot))
    contiguous, _ = around(weights, (node, pair, trans, rot), autograd=False)
    for name in ("q_pts", "k_pts", "v_pts", "centred_t"):
        torch.testing.assert_close(getattr(got, name).detach(), want[name], **TIGHT, msg=name)
        # (the mean of strided translations may be summed in another order: an ulp of 100 A)
        torch.testing.assert_close(getattr(got, name).detach(), getattr(contiguous, name),
                                   rtol=1e-6, atol=1e-5, msg=name)


class LaunchRecorder:
    """Stands in for the openfold kernel's `launch`: records its arguments, runs nothing."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        for out in args[LAUNCH_ARGS.index("out"):]:  # defined outputs for what reads them next
            out.zero_()


# launch's positional arguments, by name
LAUNCH_ARGS = ("q", "k", "v", "q_pts", "k_pts", "v_pts", "mask", "z", "w_b", "b_b",
               "point_weight", "out", "o_pt")
EXACT = dict(rtol=0, atol=0)


def named_operands(call) -> dict:
    """{name: argument} of one recorded launch; its TF32 low parts as `low of NAME`."""
    args, kw = call
    return {**dict(zip(LAUNCH_ARGS, args, strict=True)),
            **{f"low of {n}": t for n, t in zip(("k_pts", "v_pts", "w_b", "v"), kw["lows"],
                                                strict=True)}}


def assert_same_operands(fused: dict, want: dict, layout) -> None:
    """The fused prologue's launch operands (`named_operands`) against those FusedCore builds
    from the PyTorch form's points: shapes, strides and dtypes of every one; without distance
    rows every value to the bit; with them, the |k|^2 sums may differ by an ulp (summed in
    another order), and TF32 splits of such values by the rounding that ulp moves."""
    for name, t in want.items():
        got = fused[name]
        if not isinstance(t, torch.Tensor):
            assert got is t, name
            continue
        t = t.detach()
        assert got.shape == t.shape and got.stride() == t.stride(), name
        assert got.dtype == t.dtype, name
        if name in ("out", "o_pt"):  # outputs: only where they are
            continue
        if not layout.point_rows:
            torch.testing.assert_close(got, t, **EXACT, msg=name)
        elif name.startswith("low of "):
            # (a low part of a value that differs by an ulp differs by an ulp of that value)
            bound = 2.0 ** -10 * want[name[len("low of "):]].detach().abs().max().item()
            torch.testing.assert_close(got, t, rtol=0, atol=bound, msg=name)
        elif (name, True) in (("k_pts", layout.split_k),
                              ("v_pts", layout.v_split == frames.V_HI_LO)):
            # TF32 high parts: an ulp of |k|^2 can move a TF32 rounding; the parts still add up
            low, want_low = fused[f"low of {name}"], want[f"low of {name}"].detach()
            assert (got.view(torch.int32) & 0x1FFF == 0).all(), name
            torch.testing.assert_close(got + low, t + want_low, **TIGHT, msg=name)
            torch.testing.assert_close(got, t, rtol=2.0 ** -10, atol=1e-6, msg=name)
        else:
            torch.testing.assert_close(got, t, **TIGHT, msg=name)


@pytest.mark.parametrize("precision,math_mode",
                         [("fp32", "ieee"), ("fp32", "tf32"), ("bf16", "ieee")])
@pytest.mark.parametrize("case", list(CASES))
def test_pairdot_layouts_equal_what_fused_core_builds(case, precision, math_mode, monkeypatch):
    # Every operand of the openfold kernel's launch: from the fused prologue, and as
    # FusedCore builds them (distance rows, padding, splits) from the default layouts' points
    # (the autograd route's, which equal the definition's: test_prologue_equals_...).
    _, weights, (node, pair, trans, rot) = setup(case, precision)
    core = pairdot_core(weights, math_mode)
    recorder = LaunchRecorder()
    monkeypatch.setattr(triton_kernel, "launch", recorder)
    with torch.no_grad():
        triton_pairdot_ipa(weights, core, node, pair, trans, rot)
    with torch.enable_grad():
        triton_pairdot_ipa(weights, core, node, pair, trans.clone().requires_grad_(True), rot)
    (fused_args, fused_kw), (torch_args, torch_kw) = recorder.calls
    layout = core.operand_layout()
    assert layout.point_rows == (precision != "fp32")
    assert (layout.v_split != frames.V_WHOLE) == (math_mode == "ieee")
    assert_same_operands(named_operands(recorder.calls[0]), named_operands(recorder.calls[1]),
                         layout)
    assert {k: v for k, v in fused_kw.items() if k != "lows"} == {
        k: v for k, v in torch_kw.items() if k != "lows"}


# ---- the epilogue ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("case", list(CASES))
def test_epilogue_equals_inverse_frames(case, dtype):
    # Written into out_proj's input (cast to its dtype, rounded to nearest even as torch
    # rounds) at its columns, nothing else touched.
    b, n, cfg = CASES[case]
    h, vp, hd = cfg.heads, cfg.value_points, cfg.node_dim
    x = make_inputs(cfg, b, n, dtype=dtype, seed=3)
    rot = strided(x.rotations)
    g = torch.Generator().manual_seed(3)
    centred_t = torch.randn(b, n, 3, generator=g) * 30
    out_p = centred_t.repeat(1, 1, h * vp).view(b, n, h, 3 * vp)
    out_p = out_p + torch.randn(b, n, h, 3 * vp, generator=g) * 5
    cat = torch.full((b, n, hd + 3 * h * vp + 5), 7.0, dtype=dtype)
    frames.epilogue(out_p, rot, centred_t, cat, hd)
    local = inverse_frames_definition(out_p.view(b, n, h * vp, 3), rot.float(), centred_t)
    want = local.reshape(b, n, 3 * h * vp).to(dtype)
    torch.testing.assert_close(cat[..., hd:hd + 3 * h * vp], want, rtol=0, atol=0)
    assert (cat[..., :hd] == 7).all() and (cat[..., hd + 3 * h * vp:] == 7).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_epilogue_merges_key_ranges(dtype):
    # Given the attention's key ranges unmerged, the epilogue writes what merge_key_ranges then
    # the epilogue write: the same points to the bit, and the merged scalar output, rounded to
    # nearest as torch rounds, into cat's first H d columns. S = 3 ranges, one almost
    # weightless; N = 37 ragged; d = 24 and Vp = 5 padded.
    from variants.triton.merge import KeyRanges, merge_key_ranges

    g = torch.Generator().manual_seed(1)
    s, b, n, h, d, vp = 3, 2, 37, 5, 24, 5
    lse = torch.randn(s, b, n, h, generator=g) * 4
    lse[1] -= 50
    ranges = KeyRanges(torch.randn(s, b, n, h, d, generator=g),
                       torch.randn(s, b, n, h, 3 * vp, generator=g) * 20, lse)
    rot = strided(torch.linalg.qr(torch.randn(b, n, 3, 3, generator=g))[0])
    centred_t = torch.randn(b, n, 3, generator=g) * 10
    hd, width = h * d, h * d + 3 * h * vp
    out_s = torch.empty(b, n, h, d)
    out_p = merge_key_ranges(ranges.os_parts, ranges.op_parts, ranges.lse_parts, out_s)
    want = torch.full((b, n, width + 5), 7.0, dtype=dtype)
    frames.epilogue(out_p, rot, centred_t, want, hd)
    want[..., :hd] = out_s.reshape(b, n, hd).to(dtype)
    cat = torch.full((b, n, width + 5), 7.0, dtype=dtype)
    frames.epilogue(ranges, rot, centred_t, cat, hd)
    torch.testing.assert_close(cat, want, rtol=0, atol=0)


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
def test_both_epilogue_routes_agree(case, precision):
    # written into out_proj's input (grad mode off), or by the op and concatenated after o_s
    _, weights, inputs = setup(case, precision)
    b, n, cfg = CASES[case]
    vp3 = 3 * cfg.value_points
    g = torch.Generator().manual_seed(5)
    out_p = torch.randn(b, n, cfg.heads, vp3, generator=g) * 20
    _, fused = around(weights, inputs, autograd=False, out_p=out_p)
    _, want = around(weights, inputs, autograd=True, out_p=out_p)
    torch.testing.assert_close(fused, want, rtol=0, atol=0)


# ---- whole forwards -------------------------------------------------------------------------


def _forwards(weights, cfg, precision):
    params = training_parameters(init_state_dict(cfg, seed=0), cfg, "cpu", DTYPES[precision])
    core = pairdot_core(weights, "ieee")
    return {
        "triton": lambda *x: triton_ipa(weights, *x),
        "triton-fullfuse": lambda *x: triton_fullfuse_ipa(weights, *x),
        "triton-fullfuse-split": lambda *x: triton_fullfuse_ipa(weights, *x, split=2),
        "triton-pairdot": lambda *x: triton_pairdot_ipa(weights, core, *x),
        "triton-train": lambda *x: triton_train_ipa(params, cfg, *x),
        "triton-fullfuse-train": lambda *x: triton_train_ipa(params, cfg, *x, fused=True),
    }


FORWARDS = ["triton", "triton-fullfuse", "triton-fullfuse-split", "triton-pairdot",
            "triton-train", "triton-fullfuse-train"]


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("name", FORWARDS)
def test_forward_without_autograd_equals_it_with_autograd(name, precision):
    # The kernels' route (grad mode off) against the ops' (translations require grad); the
    # attention kernels are the same in both. Under the interpreter the two agree to the bit
    # but for sums of squares in another order (triton-pairdot's distance rows in bf16, which
    # FusedCore builds from the ops' default layouts).
    cfg, weights, (node, pair, trans, rot) = setup("awkward", precision)
    forward = _forwards(weights, cfg, precision)[name]
    with torch.no_grad():
        fused = forward(node, pair, trans, rot)
    with torch.enable_grad():
        want = forward(node, pair, trans.clone().requires_grad_(True), rot)
    assert want.requires_grad and not fused.requires_grad
    exact = not (name == "triton-pairdot" and precision == "bf16")
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=2.0 ** -7, atol=2.0 ** -7)  # a bf16 ulp
    torch.testing.assert_close(fused, want.detach(), **tol)


@pytest.mark.parametrize("fused", [False, True], ids=["triton-train", "triton-fullfuse-train"])
def test_a_training_step_runs_the_frame_kernels_and_their_backwards(fused, monkeypatch):
    # With autograd: the two kernels forward, their two backward kernels, and the frames get
    # gradients (whose values tests/test_frame_ops.py and tests/test_triton_backward.py check);
    # without it, the two kernels once.
    cfg, _, (node, pair, trans, rot) = setup("awkward", "fp32")
    params = training_parameters(init_state_dict(cfg), cfg, "cpu", torch.float32)
    calls = []

    def spy(name):
        real = getattr(frames, name)

        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return call

    for name in ("prologue", "epilogue", "prologue_backward", "epilogue_backward"):
        monkeypatch.setattr(frames, name, spy(name))
    trans, rot = trans.clone().requires_grad_(True), rot.clone().requires_grad_(True)
    triton_train_ipa(params, cfg, node, pair, trans, rot, fused=fused).sum().backward()
    assert calls == ["prologue", "epilogue", "epilogue_backward", "prologue_backward"]
    assert trans.grad is not None and rot.grad is not None
    assert trans.grad.abs().sum() > 0 and rot.grad.abs().sum() > 0
    for grad_mode in (False, True):  # grad mode on, but nothing requires grad: the same
        calls.clear()
        with torch.set_grad_enabled(grad_mode):
            triton_train_ipa(params, cfg, node, pair, trans.detach(), rot.detach(), fused=fused)
        assert calls == ["prologue", "epilogue"]
