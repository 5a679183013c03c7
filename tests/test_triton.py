"""Tests specific to the Triton variants (`triton`, `triton-fullfuse`, `triton-grouped`;
`variants/triton/`).

CPU: the kernels under the Triton interpreter (`TRITON_INTERPRET=1`, which `make test` sets on
machines without a GPU) at small, ragged sizes, in fp32 and (with the interpreter's dots in
fp32) bf16/fp16; the split-key paths of both kernels; non-contiguous inputs, and a
strided pair_repr read in place (NaN in its gaps, no copy); bad input naming the argument at
every public entry point (these need Triton installed, not the interpreter); the variants
without Triton. GPU (marker `gpu`): the correctness protocol up to N = 2048 in fp32 and bf16,
tf32, and strided pair_repr (the cuBLAS bias included) without a copy.

Run as a script on the GPU machine for the numbers in docs/perf-notes.md ("## triton"):
    PYTHONPATH=. python3 tests/test_triton.py [--lengths N ...] [--sections ...]
(sections: check, time, breakdown, and split: the forward replayed per key split 1-4).
prints correctness figures, then latency and extra peak memory for the Triton variants against
the reference and torch.compile, measured as the sweep measures (`harness.measure`: device
events, L2 flushed before every sample, noise-adaptive sample count), and a per-kernel
breakdown of `triton`.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from harness.correctness import check_variant, oracle_forward, rel_l2
from tests.test_variants import GPU_CASES, case_id, run_check
from variants.problem import IPAConfig, IPAInputError, get_precision, make_inputs, math_mode
from variants.reference import init_state_dict
from variants.triton.variants import Triton, TritonFullFuse, TritonGrouped

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parents[1]

if HAS_TRITON:  # the kernel modules import Triton
    from variants.triton import common
    from variants.triton.attention import default_split, ipa_attention
    from variants.triton.fullfuse import ipa_fullfuse_attention
    from variants.triton.pair_bias import cublas_pair_bias, launch_pair_bias, pair_bias
    from variants.triton.pipeline import (
        TritonIPAWeights,
        triton_fullfuse_ipa,
        triton_grouped_ipa,
        triton_ipa,
    )

    PIPELINES = {"triton": triton_ipa, "triton-fullfuse": triton_fullfuse_ipa,
                 "triton-grouped": triton_grouped_ipa}

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
needs_interpreter = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET),
    reason="CPU tests of the Triton kernels need triton and TRITON_INTERPRET=1 "
    "(`make test` sets it where there is no GPU)",
)

VARIANTS = {v.name: v for v in (Triton(), TritonFullFuse(), TritonGrouped())}

# Non-default dims on purpose: d = 16 (node 64 / 4 heads), d = 48 (one head: padded to 64),
# 16 heads of d = 8, pair_dim 8 (< one 16-wide dot step), single points.
SMALL = IPAConfig(node_dim=64, pair_dim=16, heads=4, query_points=3, value_points=5)
ONE_HEAD = IPAConfig(node_dim=48, pair_dim=8, heads=1, query_points=1, value_points=1)
MANY_HEADS = IPAConfig(node_dim=128, pair_dim=24, heads=16, query_points=2, value_points=2)

CPU_CASES = [  # (batch, length, config)
    (1, 1, SMALL),
    (2, 7, ONE_HEAD),
    (1, 33, MANY_HEADS),
    (2, 97, SMALL),
    (1, 128, IPAConfig()),
]


def in_nan_buffer(pair: torch.Tensor) -> torch.Tensor:
    """`pair`'s values as a crop (offset in every dim) of a larger buffer filled with NaN:
    rows (i, j) that do not merge, and NaN wherever a kernel that ignored the strides would
    read."""
    b, n, _, c = pair.shape
    buffer = torch.full((b, n + 3, n + 2, c + 5), float("nan"), dtype=pair.dtype,
                        device=pair.device)
    crop = buffer[:, 1:n + 1, 2:n + 2, 3:c + 3]
    crop.copy_(pair)
    return crop


def transposed_storage(pair: torch.Tensor) -> torch.Tensor:
    """`pair`'s values stored with i and j swapped."""
    return pair.transpose(1, 2).contiguous().transpose(1, 2)


class CopyWatch(TorchDispatchMode):
    """Records every op that reads `source`'s memory and returns a tensor at least its size in
    other memory: a copy of it (`.contiguous()`, `.reshape` that cannot view, `.to`, ...)."""

    def __init__(self, source: torch.Tensor):
        super().__init__()
        self.storage = source.untyped_storage().data_ptr()
        self.numel = source.numel()
        self.copies: list[str] = []

    def _reads_source(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == self.storage

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(self._reads_source(t) for t in tree_flatten((args, kwargs))[0]):
            self.copies += [
                str(func) for t in tree_flatten(out)[0]
                if isinstance(t, torch.Tensor) and t.numel() >= self.numel
                and not self._reads_source(t)
            ]
        return out


# ---- CPU, under the interpreter -------------------------------------------------------------


@needs_interpreter
@pytest.mark.parametrize("case", CPU_CASES, ids=case_id)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_fp32_matches_oracle_interpreted(name, case):
    result = run_check(name, case, "cpu", "fp32", seeds=2, must_run=True)
    # IEEE fp32 throughout: no worse than the fp32 reference itself (up to noise).
    assert result.rel_l2 <= max(2.0 * result.reference_rel_l2, 1e-6)


@needs_interpreter
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_half_precision_interpreted(name, precision):
    # The interpreter computes the dots in fp32; the rest (fp32 points, fp32 softmax, the
    # input-dtype projections) is what runs on the GPU.
    result = run_check(name, (2, 97, SMALL), "cpu", precision, seeds=2, must_run=True)
    assert result.rel_l2 < 0.25 * result.reference_rel_l2  # points in fp32 beat the reference


@needs_interpreter
@pytest.mark.parametrize("split", [2, 3])
@pytest.mark.parametrize("name", ["triton-fullfuse", "triton"])
def test_split_keys_merge_exactly(name, split):
    # N = 161 with split_len rounded to 64-key multiples (every BLOCK_N divides it): 3 ranges,
    # the last one ragged, merged by their log-sum-exps.
    sd = init_state_dict(SMALL, seed=3)
    weights = TritonIPAWeights.from_state_dict(sd, SMALL, "cpu", torch.float32)
    inputs = make_inputs(SMALL, 1, 161, seed=11)
    oracle = oracle_forward(sd, SMALL, inputs)
    forward = PIPELINES[name]
    whole = forward(weights, *inputs.as_tuple(), split=1)
    parts = forward(weights, *inputs.as_tuple(), split=split)
    assert rel_l2(parts, oracle) < 2e-6
    assert rel_l2(parts, whole) < 1e-6


def check_triton_options(device: str, batch: int, length: int, config: IPAConfig,
                         precision: str = "fp32", **options):
    """`triton_ipa` with `options` (split, fp32_dots, half_points) other than the registered
    `triton`'s defaults, through the suite's correctness protocol, judged by the precision's
    tolerance."""
    state_dict = init_state_dict(config, seed=9)
    dtype = get_precision(precision).dtype
    weights = TritonIPAWeights.from_state_dict(state_dict, config, device, dtype)
    fn = lambda *args: triton_ipa(weights, *args, **options)  # noqa: E731
    result = check_variant(Triton(), config, batch=batch, length=length, device=device,
                           precision=precision, seeds=2, state_dict=state_dict, fn=fn)
    assert result.passed, (result.failures, result.rel_l2, result.tol)


@needs_interpreter
@pytest.mark.parametrize("split", [1, 2])
def test_fp32_ieee_dots_interpreted(split):
    # The default fp32 attention dots are 3xTF32 (the registered variant's tests); the IEEE
    # FMA form stays an option, for comparison.
    check_triton_options("cpu", 2, 70, SMALL, split=split, fp32_dots="ieee")


@needs_interpreter
@pytest.mark.parametrize("half_points", ["3xbf16", "tf32"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_points_interpreted(precision, half_points):
    # The points' cross term and the value-point sum as three bf16 dots (the default) or as
    # 3xTF32 and TF32 dots (the registry's CPU cases are fp32 and fp64: both forms here).
    check_triton_options("cpu", 2, 70, SMALL, precision, half_points=half_points)


@needs_triton
def test_default_split_on_an_h200(monkeypatch):
    # The rule as measured on the H200 (132 SMs; docs/perf-notes.md, tenth session): B = 1,
    # H = 12 splits N = 256, 512, 1024 into 4, 7, 4 key ranges and leaves N >= 2048 (two
    # programs per SM or more) whole; off the GPU nothing is split.
    monkeypatch.setattr(common, "sm_count", lambda device: 132)
    monkeypatch.setattr("variants.triton.attention.sm_count", lambda device: 132)
    cuda = torch.device("cuda")
    assert [default_split(1, 12, n, cuda) for n in (256, 512, 1024, 2048, 4096)] == [4, 7, 4, 1, 1]
    assert default_split(4, 12, 1024, cuda) == 1  # 768 programs
    assert default_split(1, 12, 1024, torch.device("cpu")) == 1


@needs_interpreter
def test_merge_of_key_ranges_matches_float64():
    # S = 3 ranges, one of them almost weightless; D = 24 and 3Vp = 15 padded; out_s a bf16
    # view into a wider row, as the forward's out_proj input is.
    from variants.triton.merge import merge_key_ranges

    g = torch.Generator().manual_seed(5)
    s, b, n, h, d, vp3 = 3, 2, 7, 3, 24, 15
    os_parts, op_parts = torch.randn(s, b, n, h, d, generator=g), torch.randn(s, b, n, h, vp3,
                                                                              generator=g)
    lse_parts = torch.randn(s, b, n, h, generator=g) * 4
    lse_parts[2] -= 60
    row = torch.full((b, n, h * d + 5), float("nan"), dtype=torch.bfloat16)
    out_s, lse = row[..., :h * d].view(b, n, h, d), torch.empty(b, n, h)
    out_p = merge_key_ranges(os_parts, op_parts, lse_parts, out_s, lse)
    weights = torch.softmax(lse_parts.double() * math.log(2), 0).unsqueeze(-1)
    torch.testing.assert_close(out_p.double(), (weights * op_parts.double()).sum(0))
    torch.testing.assert_close(out_s.double(), (weights * os_parts.double()).sum(0),
                               rtol=8e-3, atol=8e-3)  # bf16 rounding of the result
    torch.testing.assert_close(lse.double(), torch.logsumexp(lse_parts.double() * math.log(2),
                                                             0) / math.log(2))
    assert row[..., h * d:].isnan().all()  # the rest of the row untouched


@needs_interpreter
@pytest.mark.parametrize("name", list(VARIANTS))
def test_non_contiguous_inputs(name):
    forward = PIPELINES[name]
    sd = init_state_dict(SMALL, seed=5)
    weights = TritonIPAWeights.from_state_dict(sd, SMALL, "cpu", torch.float32)
    inputs = make_inputs(SMALL, 2, 19, seed=2)
    node, pair, trans, rot = inputs.as_tuple()
    expected = forward(weights, node, pair, trans, rot)
    # Same values, other memory layouts: transposed storage and strided slices.
    node_t = node.transpose(0, 1).contiguous().transpose(0, 1)
    pair_t = transposed_storage(pair)
    trans_s = torch.cat([trans, trans], dim=-1)[..., :3]
    rot_t = rot.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not any(t.is_contiguous() for t in (node_t, pair_t, trans_s, rot_t))
    out = forward(weights, node_t, pair_t, trans_s, rot_t)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


@needs_interpreter
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_strided_pair_repr_is_read_in_place(name, precision):
    # NaN in every gap of the crop: a kernel that ignored a stride would read one. And no op
    # may copy pair_repr first (a hidden full read + write).
    forward = PIPELINES[name]
    dtype = get_precision(precision).dtype
    weights = TritonIPAWeights.from_state_dict(init_state_dict(SMALL, seed=6), SMALL, "cpu",
                                               dtype)
    node, pair, trans, rot = make_inputs(SMALL, 2, 21, dtype=dtype, seed=4).as_tuple()
    expected = forward(weights, node, pair, trans, rot)
    crop = in_nan_buffer(pair)
    with CopyWatch(crop) as watch:
        out = forward(weights, node, crop, trans, rot)
    assert watch.copies == []
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_copy_watch_sees_a_copy():
    # The no-copy test above is only as good as its detector.
    crop = in_nan_buffer(torch.randn(1, 4, 4, 3))
    with CopyWatch(crop) as watch:
        crop.contiguous()
        crop.reshape(-1)
    assert len(watch.copies) == 2, watch.copies


@needs_interpreter
@pytest.mark.parametrize("wide", [False, True], ids=["int32-rows", "int64-rows"])
@pytest.mark.parametrize("layout", ["contiguous", "crop", "transposed"])
def test_pair_bias_kernel_matches_einsum(layout, wide, monkeypatch):
    # `wide`: the row indices in int64, as past 2^31 rows (B N^2), forced at this size
    import variants.triton.pair_bias as pair_bias_module

    monkeypatch.setattr(pair_bias_module, "wide_rows", lambda rows: wide)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, 37, 37, 24, generator=g)
    w = torch.randn(5, 24, generator=g)
    expected = torch.einsum("bijc,hc->bhij", z.double(), w.double())
    z = {"contiguous": z, "crop": in_nan_buffer(z), "transposed": transposed_storage(z)}[layout]
    torch.testing.assert_close(pair_bias(z, w).double(), expected, rtol=1e-5, atol=1e-5)


@needs_interpreter
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("layout", ["contiguous", "slice"])
def test_linear_3xtf32_matches_float64(layout, with_bias):
    # awkward sizes: no dimension a multiple of a block; "slice": rows 50 apart, K = 45
    from variants.triton.linear import linear_3xtf32

    g = torch.Generator().manual_seed(0)
    wide = torch.randn(2, 37, 50, generator=g)
    x = wide[..., :45] if layout == "slice" else wide[..., :45].contiguous()
    w, b = torch.randn(70, 45, generator=g), torch.randn(70, generator=g)
    bias = b if with_bias else None
    expected = torch.nn.functional.linear(x.double(), w.double(),
                                          bias.double() if with_bias else None)
    out = linear_3xtf32(x, w, bias)
    assert out.shape == (2, 37, 70) and out.is_contiguous()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@needs_interpreter
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_linear_3xtf32_op_gradients_match_float64(with_bias):
    # dx = dy W and dW = dy^T x run through the same kernel on transposed (strided) operands
    from variants.triton.linear import linear_3xtf32_op

    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 29, 45, generator=g)[:, :, :37].requires_grad_(True)  # rows 45 apart
    w = torch.randn(70, 37, generator=g).requires_grad_(True)
    b = torch.randn(70, generator=g).requires_grad_(True) if with_bias else None
    leaves = [x, w] + ([b] if with_bias else [])
    grad_out = torch.randn(3, 29, 70, generator=g)
    out = linear_3xtf32_op(x, w, b)
    got = torch.autograd.grad(out, leaves, grad_out)
    exact = [t.detach().double().requires_grad_(True) for t in leaves]
    want_out = torch.nn.functional.linear(exact[0], exact[1], exact[2] if with_bias else None)
    want = torch.autograd.grad(want_out, exact, grad_out.double())
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
    for name, a, e in zip(("x", "weight", "bias")[:len(got)], got, want, strict=True):
        assert a.shape == e.shape and a.dtype == torch.float32, name
        torch.testing.assert_close(a.double(), e, rtol=1e-5, atol=1e-5, msg=name)


@needs_interpreter
def test_linear_3xtf32_ops_pass_opcheck():
    from variants.triton import linear

    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 9, 12, generator=g, requires_grad=True)
    w = torch.randn(5, 12, generator=g, requires_grad=True)
    b = torch.randn(5, generator=g, requires_grad=True)
    torch.library.opcheck(linear.linear_3xtf32_op.op, (x, w, b))
    torch.library.opcheck(linear.linear_3xtf32_op.op, (x, w, None))
    grad = torch.randn(2, 9, 5, generator=g)
    torch.library.opcheck(linear._linear_backward.op, (grad, x.detach(), w.detach(), True))


@needs_triton
@pytest.mark.parametrize("layout", ["contiguous", "crop", "transposed"])
def test_cublas_pair_bias_forms_match_einsum(layout):
    # The GPU's fp32 bias: one GEMM over the view where rows (i, j) merge, else a
    # strided-batched GEMM per batch element written in place. torch runs both on the CPU too.
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2, 19, 19, 16, generator=g)
    w = torch.randn(3, 16, generator=g)
    expected = torch.einsum("bijc,hc->bhij", z.double(), w.double())
    z = {"contiguous": z, "crop": in_nan_buffer(z), "transposed": transposed_storage(z)}[layout]
    with CopyWatch(z) as watch:
        bias = cublas_pair_bias(z, w, tf32=False)
    assert watch.copies == []
    assert bias.shape == (2, 3, 19, 19) and bias.is_contiguous()
    torch.testing.assert_close(bias.double(), expected, rtol=1e-5, atol=1e-5)


# ---- bad input ------------------------------------------------------------------------------

BAD_SHAPES = [
    ("node_repr", lambda x: x[..., :-1]),
    ("pair_repr", lambda x: x[:, :, :-1]),
    ("translations", lambda x: x[..., :2]),
    ("rotations", lambda x: x[..., :2, :]),
]


@pytest.fixture(scope="module", params=list(VARIANTS))
def small_fn(request):
    if not (HAS_TRITON and INTERPRET):
        pytest.skip("needs triton and TRITON_INTERPRET=1")
    return VARIANTS[request.param].build(init_state_dict(SMALL), SMALL, "cpu", "fp32")


@pytest.mark.parametrize("argument, corrupt", BAD_SHAPES)
def test_bad_shape_names_the_argument(small_fn, argument, corrupt):
    inputs = make_inputs(SMALL, 1, 5)
    names = ("node_repr", "pair_repr", "translations", "rotations")
    args = dict(zip(names, inputs.as_tuple(), strict=True))
    args[argument] = corrupt(args[argument])
    with pytest.raises(IPAInputError, match=argument):
        small_fn(*args.values())


def test_bad_dtype_names_the_argument(small_fn):
    node, pair, trans, rot = make_inputs(SMALL, 1, 5).as_tuple()
    with pytest.raises(IPAInputError, match="node_repr"):
        small_fn(node.double(), pair.double(), trans.double(), rot.double())
    with pytest.raises(IPAInputError, match="pair_repr"):
        small_fn(node, pair.half(), trans, rot)


@needs_triton
@pytest.mark.parametrize("name", list(VARIANTS))
def test_public_forwards_check_their_arguments(name):
    # Checked before any kernel runs: needs Triton installed, not the interpreter.
    forward = PIPELINES[name]
    weights = TritonIPAWeights.from_state_dict(init_state_dict(SMALL), SMALL, "cpu",
                                               torch.float32)
    inputs = make_inputs(SMALL, 1, 5)
    names = ("node_repr", "pair_repr", "translations", "rotations")
    for argument, corrupt in BAD_SHAPES:
        args = dict(zip(names, inputs.as_tuple(), strict=True))
        args[argument] = corrupt(args[argument])
        with pytest.raises(IPAInputError, match=argument):
            forward(weights, *args.values())
    with pytest.raises(IPAInputError, match="math_mode"):
        forward(weights, *inputs.as_tuple(), math_mode="tf32x3")
    bf16 = TritonIPAWeights.from_state_dict(init_state_dict(SMALL), SMALL, "cpu",
                                            torch.bfloat16)
    with pytest.raises(IPAInputError, match="math_mode"):
        forward(bf16, *inputs.to(dtype=torch.bfloat16).as_tuple(), math_mode="tf32")
    if name in ("triton", "triton-fullfuse"):
        for split in (0, 1.5, True):
            with pytest.raises(IPAInputError, match="split"):
                forward(weights, *inputs.as_tuple(), split=split)
    if name == "triton":
        with pytest.raises(IPAInputError, match="fp32_dots"):
            forward(weights, *inputs.as_tuple(), fp32_dots="tf32")


@needs_triton
def test_weights_reject_what_the_kernels_cannot_run():
    config = IPAConfig(node_dim=136, heads=17)
    with pytest.raises(IPAInputError, match="heads"):
        TritonIPAWeights.from_state_dict(init_state_dict(config), config, "cpu", torch.float32)


@needs_interpreter
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_grouped_heads_per_program_change_nothing(precision):
    # triton-grouped's bias dot gives each head its own columns: every group size of the 12
    # heads computes the same output, to the bit; a size that does not divide them is refused
    # before any launch. Ragged N, B = 2.
    config = IPAConfig(node_dim=96, pair_dim=20, heads=12, query_points=2, value_points=3)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    weights = TritonIPAWeights.from_state_dict(init_state_dict(config), config, "cpu", dtype)
    inputs = make_inputs(config, 2, 21, dtype=dtype, seed=5).as_tuple()
    outputs = [triton_grouped_ipa(weights, *inputs, heads_per_program=g) for g in (1, 2, 3, 4, 6)]
    assert all(torch.equal(out, outputs[0]) for out in outputs[1:])
    with pytest.raises(IPAInputError, match=r"heads_per_program: expected .* heads=12.* got 5"):
        triton_grouped_ipa(weights, *inputs, heads_per_program=5)


@needs_triton
def test_launchers_check_their_arguments():
    z = torch.randn(1, 4, 4, 8)
    with pytest.raises(IPAInputError, match="weight"):
        pair_bias(z, torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(IPAInputError, match="pair_repr"):
        pair_bias(z[0], torch.randn(2, 8))
    with pytest.raises(IPAInputError, match="weight"):
        pair_bias(z, torch.randn(17, 8))
    b, n, h, d = 1, 4, 2, 8
    q = torch.randn(b, n, h, d)
    pts = torch.randn(b, h, 3, n)
    vpts = torch.randn(b, h, n, 3)
    t = torch.randn(b, n, 3)
    weight = -torch.ones(h)
    bias = torch.zeros(b, h, n, n)
    with pytest.raises(IPAInputError, match="q_pts"):
        ipa_attention(q, q, q, pts.double(), pts, vpts, t, weight, q.clone(), bias)
    with pytest.raises(IPAInputError, match="bias"):
        ipa_attention(q, q, q, pts, pts, vpts, t, weight, q.clone(), bias[..., :-1])
    with pytest.raises(IPAInputError, match="k"):
        ipa_attention(q, q.transpose(2, 3).contiguous().transpose(2, 3), q, pts, pts, vpts, t,
                      weight, q.clone(), bias)
    with pytest.raises(IPAInputError, match="point_weight"):
        ipa_attention(q, q, q, pts, pts, vpts, t, weight.double(), q.clone(), bias)

    pair, pair_weight = torch.randn(b, n, n, 8), torch.randn(h, 8)
    fused = lambda *extra, **kwargs: ipa_fullfuse_attention(
        q, q, q, pts, pts, vpts, t, weight, q.clone(), *extra, **kwargs)
    with pytest.raises(IPAInputError, match="pair_repr"):
        fused(pair[:, :, :-1], pair_weight)
    with pytest.raises(IPAInputError, match="pair_repr"):
        fused(pair.double(), pair_weight)
    with pytest.raises(IPAInputError, match="pair_weight"):
        fused(pair, pair_weight.double())
    with pytest.raises(IPAInputError, match="pair_weight"):
        fused(pair, torch.randn(h + 1, 8))
    with pytest.raises(IPAInputError, match="split"):
        fused(pair, pair_weight, split=0)
    with pytest.raises(IPAInputError, match="math_mode"):
        fused(pair, pair_weight, math_mode="tf32x3")
    with pytest.raises(IPAInputError, match="q_pts"):
        ipa_fullfuse_attention(q, q, q, pts[..., :-1], pts, vpts, t, weight, q.clone(), pair,
                               pair_weight)


# ---- what the variants declare --------------------------------------------------------------


def test_declared_limits_become_reasons():
    v = Triton()
    assert any("heads" in r for r in v.not_supported_reasons(
        IPAConfig(node_dim=136, heads=17), "cuda", "fp32"))
    assert any("head_dim" in r for r in v.not_supported_reasons(
        IPAConfig(node_dim=64, heads=16), "cuda", "fp32"))
    assert any("fp64" in r for r in v.not_supported_reasons(IPAConfig(), "cuda", "fp64"))
    assert any("tf32" in r for r in v.not_supported_reasons(IPAConfig(), "cpu", "tf32"))


def test_fullfuse_declares_its_fp32_shared_memory_limit():
    fullfuse = VARIANTS["triton-fullfuse"]
    assert any("head_dim=96 > 64" in r
               for r in fullfuse.not_supported_reasons(IPAConfig(heads=4), "cuda", "fp32"))
    for config, precision in [(IPAConfig(), "fp32"), (IPAConfig(heads=4), "bf16")]:
        assert not any("head_dim" in r
                       for r in fullfuse.not_supported_reasons(config, "cuda", precision))


def test_variants_import_and_explain_without_triton():
    # The registry imports the variant classes, never Triton; a missing Triton is a reason.
    code = (
        "import sys\n"
        "sys.modules['triton'] = None  # import triton now fails\n"
        "from variants.problem import IPAConfig\n"
        "from variants.registry import get_variant\n"
        "for name in ('triton', 'triton-fullfuse', 'triton-train'):\n"
        "    print(get_variant(name).not_supported_reasons(IPAConfig(), 'cuda', 'bf16'))\n"
        "    try:\n"
        "        get_variant(name).build({}, IPAConfig(), 'cuda', 'bf16')\n"
        "    except ValueError as error:\n"
        "        print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("triton is not installed") == 6, result.stdout


@needs_triton
def test_kernels_defined_without_the_interpreter_say_so(monkeypatch):
    # As if the kernel modules had been imported before TRITON_INTERPRET=1 was set.
    monkeypatch.setattr(common, "INTERPRET", False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert any("before TRITON_INTERPRET=1" in r
               for r in Triton().not_supported_reasons(SMALL, "cpu", "fp32"))
    weights = TritonIPAWeights.from_state_dict(init_state_dict(SMALL), SMALL, "cpu",
                                               torch.float32)
    for forward in PIPELINES.values():
        with pytest.raises(IPAInputError, match="node_repr: expected a CUDA tensor"):
            forward(weights, *make_inputs(SMALL, 1, 5).as_tuple())


# ---- GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_oracle_gpu(name, precision):
    """tests/test_variants.py checks every variant on its GPU cases but skips the ones a variant
    declines: these must run (not be declined), and 16 heads of 128 dims must match too."""
    def declared_limit(config):
        return (name == "triton-fullfuse" and precision == "fp32"
                and config.head_dim > VARIANTS[name].fp32_max_head_dim)

    declined = {case_id(case): VARIANTS[name].not_supported_reasons(case[2], "cuda", precision)
                for case in GPU_CASES if not declared_limit(case[2])}
    assert not any(declined.values()), declined
    run_check(name, (1, 33, MANY_HEADS), "cuda", precision, seeds=3,
              must_run=not declared_limit(MANY_HEADS))


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("case", [GPU_CASES[1], GPU_CASES[3]], ids=case_id)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_tf32_matches_oracle_gpu(name, case):
    run_check(name, case, "cuda", "tf32", seeds=3, must_run=True)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("rows", [1, 97, 1024])
def test_linear_3xtf32_is_as_accurate_as_cublas_fp32_gpu(rows):
    # the forward's two projections (default layer): error against float64 at most 2x cuBLAS's
    # IEEE SGEMM's (3xTF32 drops the lo x lo products)
    from variants.triton.linear import linear_3xtf32

    g = torch.Generator().manual_seed(0)
    for k, n_out, with_bias in ((384, 1728, False), (672, 384, True)):
        x = torch.randn(rows, k, generator=g).cuda()
        w = (torch.randn(n_out, k, generator=g) / k**0.5).cuda()
        b = torch.randn(n_out, generator=g).cuda() if with_bias else None
        expected = torch.nn.functional.linear(x.double(), w.double(),
                                              None if b is None else b.double())
        with math_mode("fp32"):
            cublas = rel_l2(torch.nn.functional.linear(x, w, b), expected)
        ours = rel_l2(linear_3xtf32(x, w, b), expected)
        assert ours <= 2 * cublas + 1e-7, (k, n_out, ours, cublas)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("case", [GPU_CASES[1], GPU_CASES[2], GPU_CASES[3]], ids=case_id)
def test_fp32_ieee_dots_match_oracle_gpu(case):
    check_triton_options("cuda", *case, fp32_dots="ieee")


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("case", [GPU_CASES[1], GPU_CASES[2], GPU_CASES[3]], ids=case_id)
def test_half_points_as_tf32_match_oracle_gpu(case, precision):
    # The default, 3xBF16, is the registry's bf16 GPU tests (tests/test_variants.py).
    check_triton_options("cuda", *case, precision, half_points="tf32")


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("split", [2, 3])
def test_split_keys_match_oracle_gpu(split, precision):
    check_triton_options("cuda", *GPU_CASES[3], precision, split=split)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_strided_pair_repr_gpu(name, precision):
    # Strided pair_repr on the GPU paths (the bias kernel and the fused kernel read it through
    # its strides): same output as the contiguous input, and no copy of it (extra peak memory
    # well under its size; the bias is H / pair_dim of it).
    from harness.measure import peak_memory_mib

    config, device = IPAConfig(), torch.device("cuda")
    dtype = get_precision(precision).dtype
    with math_mode(precision), torch.no_grad():
        fn = VARIANTS[name].build(init_state_dict(config, seed=4), config, "cuda", precision)
        node, pair, trans, rot = make_inputs(config, 2, 257, dtype=dtype, device=device,
                                             seed=5).as_tuple()
        expected = fn(node, pair, trans, rot)
        pair_mib = pair.numel() * pair.element_size() / 2**20
        for strided in (in_nan_buffer(pair), transposed_storage(pair)):
            out = fn(node, strided, trans, rot)
            assert torch.isfinite(out).all()
            assert rel_l2(out, expected) < {"fp32": 1e-5, "tf32": 1e-4, "bf16": 1e-3}[precision]
            peak = peak_memory_mib(lambda s=strided: fn(node, s, trans, rot), device)
            assert peak < 0.5 * pair_mib, (peak, pair_mib)


# ---- the numbers for docs/perf-notes.md (run as a script on the GPU machine) ----------------


def _bench_main(argv: list[str]) -> None:  # pragma: no cover - GPU only
    """Sections, each skipped once `--budget` seconds have passed: correctness, latency and
    peak memory of the variants, a per-kernel breakdown of `triton`."""
    import argparse
    import time
    from functools import partial

    import triton

    from harness.measure import (
        L2Flusher,
        TimingPolicy,
        capture_cuda_graph,
        peak_memory_mib,
        time_cpu,
        time_cuda,
    )
    from variants.compiled import Compiled
    from variants.reference import Reference

    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="*", default=[1024, 4096])
    parser.add_argument("--sections", nargs="*", default=["check", "time", "breakdown"],
                        help="any of check, time, breakdown, split")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--baselines", nargs="*", default=["reference", "torch-compile"])
    parser.add_argument("--check-lengths", type=int, nargs="*", default=[97, 130, 33, 1000, 2048])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--precisions", nargs="*", default=["fp32", "bf16", "tf32"])
    parser.add_argument("--budget", type=float, default=1e9)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run under the interpreter")
    opts = parser.parse_args(argv)
    start = time.time()

    def left() -> bool:
        return time.time() - start < opts.budget

    config = IPAConfig()
    dev = torch.device(opts.device)
    cuda = dev.type == "cuda"
    dtypes = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
    print(f"# {torch.cuda.get_device_name(dev) if cuda else 'cpu'}, torch {torch.__version__}, "
          f"triton {triton.__version__}, {time.strftime('%Y-%m-%d')}", flush=True)
    sd = init_state_dict(config)

    if "check" in opts.sections:
        print("## correctness: worst seed rel_l2, the reference's, err/ref, max_abs, invariance")
        cases = [c for c in GPU_CASES if c[1] in opts.check_lengths]
        for precision in opts.precisions:
            for name in opts.variants:
                for case in cases:
                    if not left():
                        continue
                    t0 = time.time()
                    r = check_variant(
                        VARIANTS[name], case[2], batch=case[0], length=case[1], device=dev.type,
                        precision=precision, seeds=opts.seeds,
                        state_dict=init_state_dict(case[2], seed=7 + case[1]),
                    )
                    print(f"{name:16s} {precision} {case_id(case):30s} {r.status:5s} "
                          f"rel_l2 {r.rel_l2:.2e} ref {r.reference_rel_l2:.2e} "
                          f"err/ref {r.err_ratio:.2f} max_abs {r.max_abs:.1e} "
                          f"inv {r.invariance_err:.1e} ({time.time() - t0:.0f}s) {r.failures}",
                          flush=True)

    policy = TimingPolicy()
    flusher = L2Flusher(dev) if cuda else None

    def timed(fn, args):
        """Median ms as the sweep times (harness.measure) and extra peak MiB (CUDA only)."""
        call = lambda: fn(*args)
        if not cuda:
            return time_cpu(call, policy).median_ms, float("nan")
        peak = peak_memory_mib(call, dev)
        return time_cuda(call, policy, flusher).median_ms, peak

    builders = {"reference": Reference(), "torch-compile": Compiled(), **VARIANTS}
    if "time" in opts.sections:
        print("## latency: median ms (harness.measure: device events, L2 flushed), extra peak "
              "MiB; B=1, default config")
        for precision in opts.precisions:
            for n in opts.lengths:
                args = make_inputs(config, 1, n, dtype=dtypes[precision], device=dev,
                                   seed=1).as_tuple()
                for label in opts.variants + opts.baselines:
                    if not left() or (label == "torch-compile" and precision != "fp32"):
                        continue
                    with math_mode(precision), torch.no_grad():
                        t0 = time.time()
                        fn = builders[label].build(sd, config, dev.type, precision)
                        fn(*args)
                        if cuda:
                            torch.cuda.synchronize()
                        first = time.time() - t0
                        ms, peak = timed(fn, args)
                    print(f"{label:16s} {precision} N={n:5d} {ms:8.3f} ms {peak:8.0f} MiB "
                          f"(build+first call {first:.1f}s)", flush=True)
                    del fn
                    if cuda:
                        torch.cuda.empty_cache()

    if "breakdown" in opts.sections:
        print("## triton breakdown: pair-bias kernel, cuBLAS bias for comparison, attention kernel")
        for precision in opts.precisions:
            for n in opts.lengths:
                if not left():
                    continue
                dtype = dtypes[precision]
                w = TritonIPAWeights.from_state_dict(sd, config, dev, dtype)
                args = make_inputs(config, 1, n, dtype=dtype, device=dev, seed=1).as_tuple()
                with math_mode(precision), torch.no_grad():
                    ms = _breakdown(w, args, timed)
                rest = ms["total"] - ms["bias"] - ms["attention"]
                print(f"{precision} N={n:5d}: " + "  ".join(f"{k} {v:.3f}" for k, v in ms.items())
                      + f"  rest {rest:.3f} ms", flush=True)
                for name, kern in common.TUNED.items():  # autotuned so far: their choices
                    for key, best in getattr(kern, "cache", {}).items():
                        print(f"   {name} {key[:3]}... best {best}")

    if "split" in opts.sections:
        print("## triton's key split and dot options (fp32: attention dots IEEE or 3xTF32; "
              "16-bit: point dots TF32 or 3xBF16): the forward replayed as a CUDA graph (GPU "
              "time), median ms")
        for precision in opts.precisions:
            dtype = dtypes[precision]
            w = TritonIPAWeights.from_state_dict(sd, config, dev, dtype)
            forms = ({"ieee": {"fp32_dots": "ieee"}, "3xtf32": {}} if dtype == torch.float32
                     else {"tf32 points": {"half_points": "tf32"}, "3xbf16 points": {}})
            for n in opts.lengths:
                args = make_inputs(config, 1, n, dtype=dtype, device=dev, seed=1).as_tuple()
                row = []
                default = default_split(1, config.heads, n, dev)
                for form, options in forms.items():
                    for split in (1, 2, 3, 4, None):
                        if not left():
                            continue
                        with math_mode(precision), torch.no_grad():
                            call = partial(triton_ipa, w, *args, split=split, **options)
                            replay = capture_cuda_graph(call) if cuda else call
                            label = split or f"default={default}"
                            row.append(f"{form} split {label} {timed(replay, ())[0]:.4f}")
                print(f"{precision} N={n:5d}: {'  '.join(row)}", flush=True)

    print(f"# done in {time.time() - start:.0f}s")


def _breakdown(w, args, timed) -> dict[str, float]:  # pragma: no cover - GPU only
    """Median ms of: the whole `triton` forward, the Triton pair-bias kernel (the one used), the
    same bias by cuBLAS and, in fp32, by the kernel with Triton's own tf32x3 split, the
    attention kernel (on random q/k/v/points of the right sizes), the qkv GEMM."""
    import torch.nn.functional as F

    cfg = w.config
    _, n, _ = args[0].shape
    dev, dtype = args[0].device, args[0].dtype
    z = args[1]
    ms_all, _ = timed(lambda *a: triton_ipa(w, *a), args)
    ms_bias, _ = timed(lambda z: pair_bias(z, w.w_pair), (z,))
    tf32 = torch.backends.cuda.matmul.allow_tf32  # as math_mode set it
    ms_cublas, _ = timed(lambda z: cublas_pair_bias(z, w.w_pair, tf32=tf32), (z,))
    ms_tf32x3 = float("nan")
    if dtype == torch.float32 and not tf32:
        ms_tf32x3, _ = timed(lambda z: launch_pair_bias(z, w.w_pair, "tf32x3", own_split=False),
                             (z,))
    bias = pair_bias(z, w.w_pair)
    h, d = cfg.heads, cfg.head_dim
    q = torch.randn(1, n, h, d, device=dev, dtype=dtype)
    pts = torch.randn(1, h, 3 * cfg.query_points, n, device=dev) * 10
    vpts = torch.randn(1, h, n, 3 * cfg.value_points, device=dev) * 10
    t = torch.randn(1, n, 3, device=dev) * 10
    out_s = torch.empty_like(q)
    ms_attn, _ = timed(
        lambda: ipa_attention(q, q, q, pts, pts, vpts, t, w.point_weight, out_s, bias), ()
    )
    x = F.layer_norm(args[0], (cfg.node_dim,), w.ln_weight, w.ln_bias)
    ms_proj, _ = timed(lambda x: F.linear(x, w.w_in), (x,))
    return {"total": ms_all, "bias": ms_bias, "bias cuBLAS": ms_cublas,
            "bias Triton tf32x3": ms_tf32x3, "attention": ms_attn, "qkv GEMM": ms_proj}


if __name__ == "__main__":  # pragma: no cover
    _bench_main(sys.argv[1:])

