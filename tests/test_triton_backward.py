"""Tests of the Triton training variants `triton-train` and `triton-fullfuse-train`: the
attention core as a custom op with an exact backward (`variants/triton/core_op.py`,
`bias_backward.py`, `backward.py`). Every variant-level test runs for both.

CPU, under the Triton interpreter (`TRITON_INTERPRET=1`, as `make test` sets it without a GPU),
at small awkward sizes (B = 2; N = 1, 17, 45; H = 3, Qp = 3, Vp = 5, pair_dim 40 so that the
channel chunks are ragged): every gradient (node_repr, pair_repr, translations, rotations and
each parameter by its state_dict name) against the float64 reference's autograd, within the
suite's tolerance, max(2 x the eager fp32 reference's own error, the fp32 floor 2e-5), per
tensor; bf16 the same way (the interpreter's dots in fp32); the forward's key ranges and the
backward's query ranges against the whole range; pair_repr read through its strides; nothing
N x N x H allocated in the forward or the backward of `triton-fullfuse-train`, and only the
saved fp32 bias in `triton-train`'s (it becomes the logits, then dS); the cuBLAS sums of dS
against float64 at N = 300 (no interpreter); `torch.library.opcheck` of all four custom ops;
`torch.compile(fullgraph=True)` of the whole layer (AOTAutograd, the `aot_eager` backend:
Inductor's CPU compile takes ~30 s here) with gradients equal to eager's; the callable's
`parameters()`. GPU (marker `gpu`): the same gradients at N up to 1000 in fp32, bf16 and tf32,
Inductor without a graph break (its gradients judged against the oracle), and the extra peak
memory of a training step at N = 4096 against the size of d pair_repr.

Run as a script on the GPU machine for the training-step numbers in docs/perf-notes.md
("triton backward"):
    PYTHONPATH=. python3 tests/test_triton_backward.py [--lengths N ...] [--precisions ...]
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from harness.correctness import check_variant, rel_l2
from harness.runner import INPUT_NAMES, InputRecipe, trainable_parameters, training_step
from tests.test_triton import (
    HAS_CUDA,
    HAS_TRITON,
    in_nan_buffer,
    needs_interpreter,
    needs_triton,
    transposed_storage,
)
from variants.problem import (
    IPAConfig,
    IPAInputError,
    get_precision,
    math_mode,
)
from variants.reference import init_state_dict
from variants.triton.variants import Triton, TritonFullFuse, TritonFullFuseTrain, TritonTrain

if HAS_TRITON:
    from variants.triton.backward import launch_backward
    from variants.triton.bias_backward import launch_bias_backward
    from variants.triton.common import dot_modes
    from variants.triton.core_op import bias_core_op, core_op, triton_ipa_core
    from variants.triton.fullfuse import launch_fullfuse
    from variants.triton.pipeline import PARAMETER_NAMES

SMALL = IPAConfig(node_dim=48, pair_dim=40, heads=3, query_points=3, value_points=5)
needs_gpu = pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA),
                               reason="needs a CUDA device and triton")
TRAINING = [TritonTrain, TritonFullFuseTrain]
BIAS_BACKWARD_RESULTS = ("dq", "dk", "dv", "dq_pts", "dk_pts", "dv_pts", "d pair_repr",
                         "d pair_weight", "d point_weight", "dS")
each_variant = pytest.mark.parametrize("variant", TRAINING, ids=lambda v: v.name)


def recipe(batch: int, length: int, precision: str = "fp32", device: str = "cpu",
           seed: int = 0, config: IPAConfig = SMALL) -> InputRecipe:
    """The harness's seeded inputs and fixed random grad_out of a training step."""
    return InputRecipe(config, batch, length, precision, device, seed)


def train(fn, inputs: InputRecipe, params: dict[str, torch.Tensor] | None = None):
    """One training step by the harness's own `training_step` on fresh leaves of `inputs`:
    the output and the gradient of every input and parameter by name. `params` default to
    `fn.parameters()`."""
    args = tuple(t.requires_grad_(True) for t in inputs.values().as_tuple())
    params = trainable_parameters(fn) if params is None else params
    for p in params.values():
        p.requires_grad_(True)
    return training_step(fn, args, params, inputs.grad_output())


def check_gradients(variant, precision: str, batch: int, length: int, config: IPAConfig,
                    device: str, seed: int = 0, wrap=None) -> dict[str, tuple[float, float]]:
    """The suite's training-step protocol (`check_variant`, pass forward+backward): every
    gradient of `variant` (a class) against the float64 oracle's autograd, each within
    max(2 x the eager reference's own error in `precision`, the floor); the output and SE(3)
    invariance too. `wrap`: checks `wrap(built variant)` instead (a compiled form). Returns
    name -> (rel_l2, tolerance)."""
    state_dict = init_state_dict(config, seed=seed)
    fn = None if wrap is None else wrap(variant().build(state_dict, config, device, precision))
    result = check_variant(variant(), config, batch=batch, length=length, device=device,
                           precision=precision, seeds=1, first_seed=seed, fn=fn,
                           state_dict=state_dict, pass_name="forward+backward")
    assert result.passed, result.failures
    assert set(result.gradients) == set(INPUT_NAMES) | set(state_dict)
    return {name: (f["rel_l2"], f["tol"]) for name, f in result.gradients.items()}


# ---- CPU, under the interpreter -------------------------------------------------------------


@needs_interpreter
@each_variant
@pytest.mark.parametrize("length", [1, 17, 45, 48, 70])
def test_fp32_gradients_match_float64_oracle(variant, length):
    # N = 70: more than one key and query block of every kernel, the last ragged; N = 48: a
    # multiple of 16, the kernels' aligned path (`common.multiple_of_16`)
    check_gradients(variant, "fp32", 2, length, SMALL, "cpu")


@needs_interpreter
def test_fp32_training_gemms_run_as_3xtf32(monkeypatch):
    # triton-train's fp32 projections (forward and backward) go through `linear_3xtf32_op` and
    # the sums of dS through `bmm_3xtf32`, not cuBLAS's SGEMMs, and the gradients still pass
    from variants.triton import pipeline, sums

    calls = []
    for module, name in ((pipeline, "linear_3xtf32_op"), (sums, "bmm_3xtf32")):
        fn = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    check_gradients(TritonTrain, "fp32", 2, 17, SMALL, "cpu")
    assert {"linear_3xtf32_op", "bmm_3xtf32"} <= set(calls)


@needs_interpreter
@each_variant
def test_bf16_gradients_match_float64_oracle_interpreted(variant):
    figures = check_gradients(variant, "bf16", 2, 17, SMALL, "cpu")
    # fp32 points and softmax: well inside the bf16 reference's own error
    assert all(err < 0.25 * tol for err, tol in figures.values()), figures


@needs_interpreter
def test_split_ranges_match_the_whole():
    # N = 70: two ranges of 64 rows (the second ragged). The forward's key ranges merge their
    # log-sum-exps; the backward's query ranges sum their key-side partial results. The same for
    # the backward of the bias form.
    b, n = 1, 70
    operands = _core_operands(b, n)
    q, k, v, q_pts, k_pts, v_pts, centre, pair, weight, point = operands
    modes = dot_modes(torch.float32, "ieee")
    forwards = []
    for split in (1, 2):
        out_s, lse = torch.empty(b, n, *q.shape[2:]), torch.empty(b, n, q.shape[2])
        out_p = launch_fullfuse(q, k, v, q_pts, k_pts, v_pts, centre, point, out_s, pair, weight,
                                modes, split, lse=lse)
        forwards.append((out_s, out_p, lse))
    for whole, parts in zip(*forwards, strict=True):
        assert rel_l2(parts, whole) < 1e-6
    out_s, out_p, lse = forwards[0]
    g = torch.Generator().manual_seed(1)
    args = (torch.randn(out_s.shape, generator=g), torch.randn(out_p.shape, generator=g),
            *operands[:6], *operands[7:], out_s, out_p, lse, modes)
    # Only the order of the sums differs: d point_weight, a sum over every (i, j) of dS times
    # (dist - dbar), came out 1.4e-6 apart (CPU). The oracle tests judge the values themselves.
    for whole, parts in zip(launch_backward(*args, split=1), launch_backward(*args, split=2),
                            strict=True):
        assert rel_l2(parts, whole) < 1e-5
    # triton-train's key kernel: query ranges of 48 rows (the interpreter's BLOCK_M, 16, divides
    # them), each writing its own tiles of dS over the bias and partial key-side sums.
    out_s, out_p, stats, bias = bias_core_op(*operands, "ieee")
    backwards = []
    for split in (1, 2):
        ds = bias.clone()
        backwards.append((*launch_bias_backward(*args[:2], *operands[:6], *operands[7:], out_s,
                                                out_p, stats, ds, modes, split=split), ds))
    for name, whole, parts in zip(BIAS_BACKWARD_RESULTS, *backwards, strict=True):
        assert rel_l2(parts, whole) < 1e-5, name


@needs_interpreter
def test_point_weight_gradient_is_centred():
    # triton-train sums d point_weight over dist - dbar (each row's attention-weighted mean
    # distance): equal to the sum over dist, since every row of dS sums to zero, but a rounding
    # that scales a row of dS no longer meets hundreds of A^2. Default layer, N = 97: 0.37 of the
    # tolerance before, 0.023 after (CPU, interpreter); the H200 sweep had found 2.17x the
    # reference's error at N = 1024 before.
    figures = check_gradients(TritonTrain, "fp32", 1, 97, IPAConfig(), "cpu")
    error, tol = figures["head_weights"]
    assert error < 0.15 * tol, (error, tol)


@needs_interpreter
def test_fp32_ds_is_more_accurate_than_the_references():
    # The key kernel takes D's points' term as dO_p . (out_p - c), centred as dP's, not
    # D - dO_p . c: for a peaked row's dominant key dP - D then cancels between small numbers.
    # The gradients that depend on dS alone (pair_repr, pair_bias.weight, q_proj, k_proj)
    # against the float64 oracle, as a fraction of the eager reference's own error, at the
    # default layer, N = 130, seed 0: 0.27-0.28 with it, 0.33-0.36 with D - dO_p . c (the form
    # before 2026-12-06; on an H100 1.05x at N = 1024 and 1.40x at 4096)
    config = IPAConfig()
    result = check_variant(TritonTrain(), config, batch=1, length=130, device="cpu",
                           precision="fp32", seeds=1, state_dict=init_state_dict(config),
                           pass_name="forward+backward")
    ratios = {name: result.gradients[name]["rel_l2"] / result.gradients[name]["reference_rel_l2"]
              for name in ("pair_repr", "pair_bias.weight", "q_proj.weight", "k_proj.weight")}
    assert max(ratios.values()) < 0.32, ratios


@needs_interpreter
def test_gemm_ds_sums_match_float64_in_the_centred_frame():
    # The sums of dS for dq, dk and the points' gradients run as fp32 GEMMs on points in the
    # layer's centred frame (one centre per batch element, not per block as a kernel would
    # use): against float64 on a protein-like chain (3.8 A steps, ~30 A across) and a
    # softmax-shaped dS, each result must stay far inside the fp32 floor (2e-5); 100 A off the
    # origin the point sums cancel visibly (the reason the frame is centred). q and k are
    # strided views, as the projection's split gives them; dS^T is read in place.
    from variants.triton.sums import LN2_F, gemm_ds_sums

    g = torch.Generator().manual_seed(3)
    b, h, n, d, qp = 2, 3, 300, 16, 4
    steps = torch.randn(b, n, 3, generator=g, dtype=torch.float64)
    chain = torch.cumsum(3.8 * steps / steps.norm(dim=-1, keepdim=True), 1) * 0.4
    chain = chain - chain.mean(1, keepdim=True)
    pts = [(chain[:, None, None] + 2 * torch.randn(b, h, qp, n, 3, generator=g,
                                                   dtype=torch.float64))
           for _ in range(2)]  # (B, H, Qp, N, 3): points near their residue
    q_pts, k_pts = (p.permute(0, 1, 3, 2, 4).reshape(b, h, n, 3 * qp).transpose(2, 3)
                    for p in pts)  # (B, H, 3Qp, N), xyz triples
    dist = ((q_pts[..., :, None] - k_pts[..., None, :]) ** 2).sum(2)  # (B, H, N, N)
    attn = torch.softmax(-0.05 * dist + torch.randn(dist.shape, generator=g,
                                                    dtype=torch.float64), -1)
    dp = torch.randn(dist.shape, generator=g, dtype=torch.float64)
    ds = attn * (dp - (attn * dp).sum(-1, keepdim=True))
    qk = torch.randn(b, n, 2 * h * d + 5, generator=g, dtype=torch.float64)
    q, k = (qk[..., i * h * d:(i + 1) * h * d].view(b, n, h, d) for i in range(2))
    point_weight = -torch.rand(h, generator=g, dtype=torch.float64)
    scale = 0.3

    def want(offset):
        qo, ko = q_pts + offset, k_pts + offset
        w = (point_weight * 2 * LN2_F).view(1, h, 1, 1)
        return (torch.einsum("bhij,bjhd->bihd", ds, k) * scale * LN2_F,
                torch.einsum("bhij,bihd->bjhd", ds, q) * scale * LN2_F,
                w * (qo * ds.sum(-1)[:, :, None] - torch.einsum("bhij,bhcj->bhci", ds, ko)),
                w * (ko * ds.sum(-2)[:, :, None] - torch.einsum("bhij,bhci->bhcj", ds, qo)))

    def errors(offset):
        got = gemm_ds_sums(ds.float(), *(x.float().view(b, n, h, d) for x in (
            qk[..., :h * d], qk[..., h * d:2 * h * d])), (q_pts + offset).float(),
            (k_pts + offset).float(), point_weight.float(), scale)
        return [rel_l2(x.double(), y) for x, y in zip(got, want(offset), strict=True)]

    centred = errors(0.0)
    assert max(centred) < 2e-6, centred
    off_origin = errors(100.0)
    assert max(off_origin[2:]) > 4 * max(centred[2:]), (centred, off_origin)


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("terms", ["s", "s+p", "s+z", "s+p+z"])
def test_row_delta_is_the_rows_dot_products(dtype, terms):
    # D = dO . O per (b, n, h), the softmax's row term, in fp32 from any input dtype, over the
    # terms given: the scalar values' always, the points' (the training key kernel adds those
    # itself, centred) and problem openfold's pair values' when passed; awkward widths (D = 24,
    # 3 Vp = 9, c_z = 20) and a row count that is no multiple of the block.
    from variants.triton.sums import row_delta

    g = torch.Generator().manual_seed(8)
    b, n, h = 2, 13, 3
    widths = {"s": (24, dtype), "p": (9, torch.float32), "z": (20, torch.float32)}
    ops = {t: [torch.randn(b, n, h, widths[t][0], generator=g).to(widths[t][1])
               for _ in range(2)] for t in terms.split("+")}
    want = sum((x.double() * y.double()).sum(-1) for x, y in ops.values())
    named = {"p": ("grad_p", "out_p"), "z": ("grad_z", "out_z")}
    got = row_delta(*ops["s"], **{name: t for key, pair in ops.items() if key != "s"
                                  for name, t in zip(named[key], pair, strict=True)})
    assert got.dtype == torch.float32 and got.shape == (b, n, h)
    assert rel_l2(got.double(), want) < 1e-6


@needs_interpreter
@pytest.mark.parametrize("b, n, c", [
    (2, 16, 32),  # whole tiles, no padded channels: the unmasked loads and stores
    (1, 16, 40),  # whole tiles, channels padded to 64
    (2, 17, 32),  # a partial last tile
    (1, 72, 16),  # 81 tiles over 64 programs: two tiles each, the last programs none
])
def test_pair_gradients_match_float64(b, n, c):
    # The pair kernel's d pair_repr = dS^T W_b and dW_b = sum dS z, against float64, on every
    # tiling path of its loop (under the interpreter a tile is 64 pairs).
    from variants.triton.bias_backward import pair_gradients

    g = torch.Generator().manual_seed(n)
    h = 3
    ds = torch.randn(b, h, n, n, generator=g, dtype=torch.float64)
    z = torch.randn(b, n, n, c, generator=g, dtype=torch.float64)
    w = torch.randn(h, c, generator=g, dtype=torch.float64)
    d_pair, d_weight = pair_gradients(ds.float(), z.float(), w.float())
    assert rel_l2(d_pair.double(), torch.einsum("bhij,hc->bijc", ds, w)) < 1e-6
    assert rel_l2(d_weight.double(), torch.einsum("bhij,bijc->hc", ds, z)) < 1e-6


@needs_interpreter
@each_variant
@pytest.mark.parametrize("layout", ["crop", "transposed"])
def test_strided_pair_repr_gradients(variant, layout):
    # pair_repr read through its strides in both kernels (NaN in the crop's gaps), and its
    # gradient is that of the contiguous input.
    fn = variant().build(init_state_dict(SMALL, seed=2), SMALL, "cpu", "fp32")
    inputs = recipe(2, 17, seed=3)
    out, grads = train(fn, inputs)
    node, pair, trans, rot = inputs.values().as_tuple()
    strided = {"crop": in_nan_buffer, "transposed": transposed_storage}[layout](pair)
    assert not strided.is_contiguous()
    args = tuple(t.requires_grad_(True) for t in (node, strided, trans, rot))
    out2, grads2 = training_step(fn, args, trainable_parameters(fn), inputs.grad_output())
    torch.testing.assert_close(out2, out, rtol=1e-6, atol=1e-6)
    for name, grad in grads.items():
        assert torch.isfinite(grads2[name]).all(), name
        torch.testing.assert_close(grads2[name], grad, rtol=1e-5, atol=1e-6, msg=name)


class AllocationWatch(TorchDispatchMode):
    """Shapes of every tensor an op allocates (outputs in memory none of its arguments own)."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        owned = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                 if isinstance(t, torch.Tensor)}
        self.shapes += [tuple(t.shape) for t in tree_flatten(out)[0]
                        if isinstance(t, torch.Tensor)
                        and t.untyped_storage().data_ptr() not in owned]
        return out


@needs_interpreter
@each_variant
def test_only_the_expected_n_by_n_tensors_are_allocated(variant):
    # The training step, and the kernels' launchers on their own (the custom ops hide their
    # insides from a dispatch mode): `triton-fullfuse-train` allocates one N x N tensor,
    # d pair_repr; `triton-train` also the forward's (B, H, N, N) bias, which becomes the
    # logits, which its backward overwrites with dS (no second one).
    b, n = 2, 43  # N = 43 is no other size of the layer (3 H Vp = 45 is one)
    fn = variant().build(init_state_dict(SMALL), SMALL, "cpu", "fp32")
    inputs = recipe(b, n)
    args = tuple(t.requires_grad_(True) for t in inputs.values().as_tuple())
    params = {name: p.requires_grad_(True) for name, p in fn.parameters()}
    grad_out = inputs.grad_output()
    with AllocationWatch() as step:
        training_step(fn, args, params, grad_out)
    operands = _core_operands(b, n)
    fused = variant is TritonFullFuseTrain
    op, backward = (core_op, launch_backward) if fused else (bias_core_op, launch_bias_backward)
    with torch.no_grad():
        saved = op(*operands, "ieee")
    with AllocationWatch() as kernels:
        op(*operands, "ieee")
        backward(torch.randn_like(saved[0]), torch.randn_like(saved[1]), *operands[:6],
                 *operands[7:], *saved, dot_modes(torch.float32, "ieee"))
    expected = [(b, n, n, SMALL.pair_dim)] if fused else [(b, SMALL.heads, n, n),
                                                          (b, n, n, SMALL.pair_dim)]
    for watch in (step, kernels):
        square = [s for s in watch.shapes if s.count(n) >= 2 or n * n in s]
        assert square == expected, square


@needs_interpreter
def test_bias_backward_overwrites_the_saved_bias_once():
    # dS lands in the forward's logits buffer, so a second backward through one graph must fail
    # loudly (autograd's saved-tensor version check), never read dS as the bias.
    fn = TritonTrain().build(init_state_dict(SMALL), SMALL, "cpu", "fp32")
    args = tuple(t.requires_grad_(True) for t in recipe(1, 9).values().as_tuple())
    out = fn(*args)
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def _core_operands(b, n, config=SMALL, dtype=torch.float32, device="cpu", seed=0):
    """Random operands of `core_op` in the layouts the pipeline builds (q, k, v as views of one
    projection row), without math_mode; drawn on `device`."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, d = config.heads, config.head_dim
    p3, vp3, c = 3 * config.query_points, 3 * config.value_points, config.pair_dim
    rand = lambda *shape: torch.randn(*shape, generator=g, device=device)
    proj = rand(b, n, 3 * h * d).to(dtype)
    q, k, v = (proj[..., i * h * d:(i + 1) * h * d].view(b, n, h, d) for i in range(3))
    return (q, k, v, rand(b, h, p3, n) * 3, rand(b, h, p3, n) * 3, rand(b, h, n, vp3) * 3,
            rand(b, n, 3), rand(b, n, n, c).to(dtype), (rand(h, c) * 0.2).to(dtype),
            -torch.rand(h, generator=g, device=device))


@needs_interpreter
@pytest.mark.parametrize("fused", [True, False], ids=["fullfuse", "bias"])
def test_opcheck_forward_and_backward_ops(fused):
    op, backward = ((core_op, torch.ops.ipa_bench.triton_ipa_core_backward) if fused else
                    (bias_core_op, torch.ops.ipa_bench.triton_ipa_core_bias_backward))
    operands = _core_operands(2, 17)
    grads = [True] * 6 + [False] + [True] * 3  # every operand but the centre
    args = [t.clone().requires_grad_(r) for t, r in zip(operands, grads, strict=True)]
    # The bias form's backward writes dS over the forward's saved bias output; opcheck's
    # standalone AOT test of the forward op then trips AOTAutograd's partitioner ("Node ... was
    # invalid, but is output", torch 2.13). The layer compiles and differentiates under
    # Inductor with static and dynamic shapes (test_compiles_without_a_graph_break and the
    # GPU test), which is what that opcheck stage stands for; every other stage runs here.
    stages = ("test_schema", "test_autograd_registration", "test_faketensor",
              *(["test_aot_dispatch_dynamic"] if fused else []))
    results = torch.library.opcheck(op.op, (*args, "ieee"), test_utils=stages)
    assert set(results.values()) == {"SUCCESS"}, results
    with torch.no_grad():
        saved = op(*operands, "ieee")
    backward_args = (torch.randn_like(saved[0]), torch.randn_like(saved[1]), *operands[:6],
                     *operands[7:], *saved, "ieee")
    results = torch.library.opcheck(backward, backward_args)
    assert set(results.values()) == {"SUCCESS"}, results


@needs_interpreter
@each_variant
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiles_without_a_graph_break(variant, dynamic):
    # fullgraph=True raises on any graph break; AOTAutograd traces the backward through the
    # backward op. Gradients equal eager's.
    fn = variant().build(init_state_dict(SMALL, seed=4), SMALL, "cpu", "fp32")
    inputs = recipe(2, 17, seed=4)
    out, grads = train(fn, inputs)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    out2, grads2 = train(compiled, inputs, trainable_parameters(fn))
    torch.testing.assert_close(out2, out, rtol=0, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grads2[name], grad, rtol=0, atol=0, msg=name)


@needs_interpreter
@each_variant
def test_parameters_are_the_state_dict_and_live(variant):
    sd = init_state_dict(SMALL)
    fn = variant().build(sd, SMALL, "cpu", "fp32")
    params = dict(fn.parameters())
    assert list(params) == list(PARAMETER_NAMES) and set(params) == set(sd)
    for name, p in params.items():
        assert p.is_leaf and not p.requires_grad and p.shape == sd[name].shape, name
        assert p.untyped_storage().data_ptr() != sd[name].untyped_storage().data_ptr(), name
    inputs = recipe(1, 5).values().as_tuple()
    out = fn(*inputs)
    with torch.no_grad():
        params["out_proj.bias"] += 1.0  # an optimizer step is seen by the next call
    torch.testing.assert_close(fn(*inputs), out + 1.0)


@needs_triton
def test_bad_input_names_the_argument():
    q, k, v, qp, kp, vp, centre, pair, weight, point = _core_operands(1, 5)
    call = lambda **change: triton_ipa_core(**{
        "q": q, "k": k, "v": v, "q_pts": qp, "k_pts": kp, "v_pts": vp, "centre": centre,
        "pair_repr": pair, "pair_weight": weight, "point_weight": point, **change})
    with pytest.raises(IPAInputError, match="pair_weight"):
        call(pair_weight=weight.double())
    with pytest.raises(IPAInputError, match="pair_repr"):
        call(pair_repr=pair[:, :, :-1])
    with pytest.raises(IPAInputError, match="centre"):
        call(centre=centre[:, :-1])
    with pytest.raises(IPAInputError, match="k_pts"):
        call(k_pts=kp.double())
    with pytest.raises(IPAInputError, match="math_mode"):
        call(math_mode="tf32x3")
    for variant in TRAINING:
        with pytest.raises(IPAInputError, match="state_dict"):
            variant().build({}, SMALL, "cpu", "fp32")


def test_only_the_training_variants_declare_a_backward():
    assert all(variant.supports_backward for variant in TRAINING)
    assert not Triton.supports_backward and not TritonFullFuse.supports_backward


@needs_triton  # an installed Triton, or the reasons say it is missing
def test_fullfuse_train_declares_its_shared_memory_limits():
    # Cells whose backward kernel would need more than the H200's 227 KB per block.
    train = TritonFullFuseTrain()
    over = [(IPAConfig(heads=6), "tf32"), (IPAConfig(heads=4, value_points=12), "bf16"),
            (IPAConfig(heads=3, value_points=16), "fp16")]
    for config, precision in over:
        assert any("shared memory" in r and "backward" in r
                   for r in train.not_supported_reasons(config, "cuda", precision))
    fits = [(IPAConfig(), p) for p in ("fp32", "tf32", "bf16", "fp16")] + [
        (IPAConfig(heads=3), "bf16"), (IPAConfig(heads=6, value_points=12), "bf16")]
    for config, precision in fits:
        assert train.not_supported_reasons(config, "cuda", precision) == []


# ---- GPU ------------------------------------------------------------------------------------

GPU_CASES = [  # (batch, length, config)
    (1, 1, IPAConfig()),
    (2, 97, IPAConfig()),
    (1, 33, IPAConfig(node_dim=128, pair_dim=24, heads=16, query_points=2, value_points=2)),
    (1, 1000, IPAConfig()),
]


@pytest.mark.gpu
@needs_gpu
@each_variant
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"B{c[0]}-N{c[1]}-H{c[2].heads}")
def test_gradients_match_float64_oracle_gpu(variant, case, precision):
    check_gradients(variant, precision, *case, "cuda")


@pytest.mark.gpu
@needs_gpu
@each_variant
@pytest.mark.xfail(strict=True, reason=(
    "known: in tf32 mode both training variants' gradients exceed the tolerance (H200, "
    "2026-12-03, B = 2 N = 97: triton-train rel_l2 1.6-2.8e-2 against 2e-3, with the backward's "
    "dots in TF32 and again in IEEE): the forward's TF32 logits and outputs feed "
    "dS = P (dP - D), which cancels; the sweep's tf32 training rows say mismatch"))
def test_tf32_gradients_match_float64_oracle_gpu(variant):
    check_gradients(variant, "tf32", 2, 97, IPAConfig(), "cuda")


@pytest.mark.gpu
@needs_gpu
@each_variant
def test_inductor_compiles_without_a_graph_break_gpu(variant):
    # fullgraph=True raises on a graph break. Inductor fuses and reorders the PyTorch ops
    # around the custom ops (the frames run in PyTorch under torch.compile), so its gradients
    # are not eager's to the bit (q_pts.weight and k_pts.weight differed by 1.7e-5 relative on
    # the H200): they are judged as any variant's, against the float64 oracle.
    torch._dynamo.reset()
    check_gradients(variant, "fp32", 1, 97, IPAConfig(), "cuda", wrap=_Compiled)


class _Compiled:
    """A built variant compiled whole by Inductor (`fullgraph`: a graph break raises), its
    parameters still named."""

    def __init__(self, fn):
        self.compiled = torch.compile(fn, fullgraph=True)
        self.parameters = fn.parameters

    def __call__(self, *args):
        return self.compiled(*args)


@pytest.mark.gpu
@needs_gpu
@each_variant
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_step_memory_gpu(variant, precision):
    # Extra peak memory of forward + backward over the inputs: d pair_repr plus O(N) (~130 MiB
    # predicted: saved activations, partial sums, dq), plus for `triton-train` one (B, H, N, N)
    # fp32 buffer (768 MiB here, in every dtype: the bias, then the logits, then dS), never a
    # second one.
    config, n = IPAConfig(), 4096
    fn = variant().build(init_state_dict(config), config, "cuda", precision)
    inputs = recipe(1, n, precision, "cuda", config=config)
    args = tuple(t.requires_grad_(True) for t in inputs.values().as_tuple())
    params = {name: p.requires_grad_(True) for name, p in fn.parameters()}
    grad_out = inputs.grad_output()
    step = lambda: training_step(fn, args, params, grad_out)[1]
    step()  # compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    grads = step()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    element = grads["pair_repr"].element_size()
    pair_grad = grads["pair_repr"].numel() * element
    bias = 0 if variant is TritonFullFuseTrain else config.heads * n * n * 4
    assert extra < pair_grad + bias + 256 * 2**20, (extra / 2**20, pair_grad / 2**20)


# ---- the numbers for docs/perf-notes.md (run as a script on the GPU machine) ----------------


def _bench_main(argv: list[str]) -> None:  # pragma: no cover - GPU only
    """Median ms (harness.measure: device events, L2 flushed) and extra peak MiB of one
    training step (forward, then backward of a fixed grad_out) at the default config, B = 1,
    for the training variants and the baselines; then each forward op and backward op alone."""
    import argparse
    import time

    import triton

    from harness.measure import L2Flusher, TimingPolicy, peak_memory_mib, time_cpu, time_cuda
    from variants.compiled import Compiled
    from variants.reference import Reference

    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="*", default=[1024, 2048, 4096])
    parser.add_argument("--precisions", nargs="*", default=["fp32", "bf16"])
    parser.add_argument("--variants", nargs="*", default=[v.name for v in TRAINING])
    parser.add_argument("--baselines", nargs="*", default=["torch-compile"])
    parser.add_argument("--budget", type=float, default=1e9)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run under the interpreter")
    opts = parser.parse_args(argv)
    start = time.time()
    config, dev = IPAConfig(), torch.device(opts.device)
    cuda = dev.type == "cuda"
    print(f"# {torch.cuda.get_device_name(dev) if cuda else 'cpu'}, torch {torch.__version__}, "
          f"triton {triton.__version__}, {time.strftime('%Y-%m-%d')}", flush=True)
    sd = init_state_dict(config)
    policy = TimingPolicy()
    flusher = L2Flusher(dev) if cuda else None

    def timed(call):
        """Median ms as the sweep times, and extra peak MiB (CUDA only)."""
        if not cuda:
            return time_cpu(call, policy).median_ms, float("nan")
        peak = peak_memory_mib(call, dev)
        return time_cuda(call, policy, flusher).median_ms, peak

    builders = {v.name: v() for v in (*TRAINING, Reference, Compiled)}
    for precision in opts.precisions:
        dtype = get_precision(precision).dtype
        for n in opts.lengths:
            inputs = recipe(1, n, precision, dev.type, seed=1, config=config)
            args = tuple(t.requires_grad_(True) for t in inputs.values().as_tuple())
            grad_out = inputs.grad_output()
            for label in [*opts.variants, *opts.baselines]:
                if time.time() - start > opts.budget:
                    continue
                with math_mode(precision):
                    fn = builders[label].build(sd, config, dev.type, precision)
                    params = {name: p.requires_grad_(True)
                              for name, p in trainable_parameters(fn).items()}
                    step = lambda fn=fn, params=params, args=args, grad_out=grad_out: (
                        training_step(fn, args, params, grad_out))
                    t0 = time.time()
                    step()
                    if cuda:
                        torch.cuda.synchronize()
                    first = time.time() - t0
                    ms, peak = timed(step)
                print(f"{label:22s} {precision} N={n:5d} fwd+bwd {ms:8.3f} ms {peak:8.0f} MiB "
                      f"(first call {first:.1f}s)", flush=True)
                del fn, params, step
                if cuda:
                    torch.cuda.empty_cache()
            if time.time() - start > opts.budget:
                continue
            operands = _core_operands(1, n, config, dtype, dev, seed=1)
            modes = dot_modes(dtype, "ieee")
            ops = [("bias", bias_core_op, launch_bias_backward, "triton-train"),
                   ("fullfuse", core_op, launch_backward, "triton-fullfuse-train")]
            for label, op, backward, _ in (o for o in ops if o[3] in opts.variants):
                with torch.no_grad():
                    saved = op(*operands, "ieee")
                    fwd, _ = timed(lambda ops=operands, op=op: op(*ops, "ieee"))
                    args = (torch.randn_like(saved[0]), torch.randn_like(saved[1]),
                            *operands[:6], *operands[7:], *saved, modes)
                    # (the bias form's backward overwrites the saved bias: its repeated calls
                    # read dS as the bias, which changes the values, not the work)
                    bwd, bwd_peak = timed(lambda a=args, backward=backward: backward(*a))
                print(f"  {label} core alone {precision} N={n}: forward op {fwd:.3f} ms, "
                      f"backward op {bwd:.3f} ms, {bwd_peak:.0f} MiB", flush=True)
                del saved, args
    print(f"# done in {time.time() - start:.0f}s")


if __name__ == "__main__":  # pragma: no cover
    _bench_main(sys.argv[1:])
