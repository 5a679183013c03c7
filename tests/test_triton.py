"""Tests specific to the Triton variants (`triton`, `triton-fullfuse`).

CPU: the kernels under the Triton interpreter (`TRITON_INTERPRET=1`, which `make test` sets on
machines without a GPU) at small, ragged sizes, in fp32 and (with the interpreter's dots in
fp32) bf16/fp16; the split-key path of the fully fused kernel; non-contiguous inputs; bad
input naming the argument. GPU (marker `gpu`): the correctness protocol up to N = 2048 in
fp32 and bf16.

Run as a script on the GPU machine for the numbers in docs/perf-notes.md ("## triton"):
    PYTHONPATH=. python3 tests/test_triton.py [N ...]
prints correctness figures, then median latency (triton.testing.do_bench, L2 flushed) and
extra peak memory for the Triton variants against the reference and torch.compile.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

from harness.correctness import check_variant, oracle_forward, rel_l2
from variants.problem import IPAConfig, IPAInputError, make_inputs
from variants.reference import init_state_dict
from variants.triton_ipa import (
    Triton,
    TritonFullFuse,
    TritonIPAWeights,
    ipa_attention,
    pair_bias,
    triton_ipa,
)

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()

needs_interpreter = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET),
    reason="CPU tests of the Triton kernels need triton and TRITON_INTERPRET=1 "
    "(`make test` sets it where there is no GPU)",
)

VARIANTS = {v.name: v for v in (Triton(), TritonFullFuse())}

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


def _case_id(case) -> str:
    b, n, c = case
    return f"B{b}-N{n}-H{c.heads}-Qp{c.query_points}-Vp{c.value_points}-D{c.node_dim}"


def _check(name, case, device, precision, seeds):
    batch, length, config = case
    result = check_variant(
        VARIANTS[name], config, batch=batch, length=length, device=device,
        precision=precision, seeds=seeds, state_dict=init_state_dict(config, seed=7 + length),
    )
    assert not result.skipped, result.skipped
    assert result.passed, (
        f"{name} {precision} {_case_id(case)}: {result.failures} (rel_l2 {result.rel_l2:.3e}, "
        f"tol {result.tol:.3e}, err/ref {result.err_ratio:.2f})"
    )
    return result


# ---- CPU, under the interpreter -------------------------------------------------------------


@needs_interpreter
@pytest.mark.parametrize("case", CPU_CASES, ids=_case_id)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_fp32_matches_oracle_interpreted(name, case):
    result = _check(name, case, "cpu", "fp32", seeds=2)
    # IEEE fp32 throughout: no worse than the fp32 reference itself (up to noise).
    assert result.rel_l2 <= max(2.0 * result.reference_rel_l2, 1e-6)


@needs_interpreter
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_half_precision_interpreted(name, precision):
    # The interpreter computes the dots in fp32; the rest (fp32 points, fp32 softmax, the
    # input-dtype projections) is what runs on the GPU.
    result = _check(name, (2, 97, SMALL), "cpu", precision, seeds=2)
    assert result.rel_l2 < 0.25 * result.reference_rel_l2  # points in fp32 beat the reference


@needs_interpreter
@pytest.mark.parametrize("split", [2, 3])
def test_fullfuse_split_keys_merge_exactly(split):
    # N = 161 with split_len rounded to 64-key multiples: 3 ranges (the last one ragged).
    sd = init_state_dict(SMALL, seed=3)
    weights = TritonIPAWeights.from_state_dict(sd, SMALL, "cpu", torch.float32)
    inputs = make_inputs(SMALL, 1, 161, seed=11)
    oracle = oracle_forward(sd, SMALL, inputs)
    whole = triton_ipa(weights, *inputs.as_tuple(), fuse_pair_bias=True, split=1)
    parts = triton_ipa(weights, *inputs.as_tuple(), fuse_pair_bias=True, split=split)
    assert rel_l2(parts, oracle) < 2e-6
    assert rel_l2(parts, whole) < 1e-6


@needs_interpreter
@pytest.mark.parametrize("fuse", [False, True], ids=["triton", "triton-fullfuse"])
def test_non_contiguous_inputs(fuse):
    sd = init_state_dict(SMALL, seed=5)
    weights = TritonIPAWeights.from_state_dict(sd, SMALL, "cpu", torch.float32)
    inputs = make_inputs(SMALL, 2, 19, seed=2)
    node, pair, trans, rot = inputs.as_tuple()
    expected = triton_ipa(weights, node, pair, trans, rot, fuse_pair_bias=fuse)
    # Same values, other memory layouts: transposed storage and strided slices.
    node_t = node.transpose(0, 1).contiguous().transpose(0, 1)
    pair_t = pair.transpose(1, 2).contiguous().transpose(1, 2)
    trans_s = torch.cat([trans, trans], dim=-1)[..., :3]
    rot_t = rot.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not any(t.is_contiguous() for t in (node_t, pair_t, trans_s, rot_t))
    out = triton_ipa(weights, node_t, pair_t, trans_s, rot_t, fuse_pair_bias=fuse)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


@needs_interpreter
def test_pair_bias_kernel_matches_einsum():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, 37, 37, 24, generator=g)
    w = torch.randn(5, 24, generator=g)
    expected = torch.einsum("bijc,hc->bhij", z.double(), w.double())
    torch.testing.assert_close(pair_bias(z, w).double(), expected, rtol=1e-5, atol=1e-5)


# ---- bad input ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_fn():
    if not (HAS_TRITON and INTERPRET):
        pytest.skip("needs triton and TRITON_INTERPRET=1")
    return Triton().build(init_state_dict(SMALL), SMALL, "cpu", "fp32")


@pytest.mark.parametrize(
    "argument, corrupt",
    [
        ("node_repr", lambda x: x[..., :-1]),
        ("pair_repr", lambda x: x[:, :, :-1]),
        ("translations", lambda x: x[..., :2]),
        ("rotations", lambda x: x[..., :2, :]),
    ],
)
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


@needs_interpreter
def test_launchers_check_their_arguments():
    z = torch.randn(1, 4, 4, 8)
    with pytest.raises(IPAInputError, match="weight"):
        pair_bias(z, torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(IPAInputError, match="pair_repr"):
        pair_bias(z.transpose(1, 2), torch.randn(2, 8))
    b, n, h, d = 1, 4, 2, 8
    q = torch.randn(b, n, h, d)
    pts = torch.randn(b, h, 3, n)
    vpts = torch.randn(b, h, n, 3)
    t = torch.randn(b, n, 3)
    scale = torch.ones(h)
    with pytest.raises(IPAInputError, match="q_pts"):
        ipa_attention(q, q, q, pts.double(), pts, vpts, t, scale, q.clone(),
                      bias=torch.zeros(b, h, n, n))
    with pytest.raises(IPAInputError, match="bias, pair_repr"):
        ipa_attention(q, q, q, pts, pts, vpts, t, scale, q.clone())
    with pytest.raises(IPAInputError, match="k"):
        ipa_attention(q, q.transpose(2, 3).contiguous().transpose(2, 3), q, pts, pts, vpts, t,
                      scale, q.clone(), bias=torch.zeros(b, h, n, n))


def test_declared_limits_become_reasons():
    v = Triton()
    assert any("heads" in r for r in v.not_supported_reasons(
        IPAConfig(node_dim=136, heads=17), "cuda", "fp32"))
    assert any("head_dim" in r for r in v.not_supported_reasons(
        IPAConfig(node_dim=64, heads=16), "cuda", "fp32"))
    assert any("fp64" in r for r in v.not_supported_reasons(IPAConfig(), "cuda", "fp64"))
    assert any("tf32" in r for r in v.not_supported_reasons(IPAConfig(), "cpu", "tf32"))


# ---- GPU ------------------------------------------------------------------------------------

GPU_CASES = [
    (1, 1, IPAConfig()),
    (2, 97, IPAConfig()),
    (1, 130, IPAConfig(heads=4, query_points=8, value_points=12)),
    (1, 33, MANY_HEADS),
    (1, 1000, IPAConfig()),
    (1, 2048, IPAConfig()),
]


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("case", GPU_CASES, ids=_case_id)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_oracle_gpu(name, case, precision):
    _check(name, case, "cuda", precision, seeds=3)


# ---- the numbers for docs/perf-notes.md (run as a script on the GPU machine) ----------------


def _bench_main(lengths: list[int]) -> None:  # pragma: no cover - GPU only
    import time

    import triton
    from triton.testing import do_bench

    from variants.compiled import Compiled
    from variants.problem import math_mode
    from variants.reference import Reference

    config = IPAConfig()
    dev = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
          f"triton {triton.__version__}, {time.strftime('%Y-%m-%d')}")
    sd = init_state_dict(config)
    print("## correctness (3 seeds; rel_l2 worst seed; err/ref; invariance)")
    for name in VARIANTS:
        for precision in ("fp32", "bf16", "tf32"):
            for case in GPU_CASES[1:]:
                if precision == "tf32" and case[1] != 1000:
                    continue
                t0 = time.time()
                r = check_variant(VARIANTS[name], case[2], batch=case[0], length=case[1],
                                  device="cuda", precision=precision, seeds=3,
                                  state_dict=init_state_dict(case[2], seed=7 + case[1]))
                print(f"{name:16s} {precision} {_case_id(case):32s} {r.status:5s} "
                      f"rel_l2 {r.rel_l2:.2e} ref {r.reference_rel_l2:.2e} "
                      f"err/ref {r.err_ratio:.2f} max_abs {r.max_abs:.1e} "
                      f"inv {r.invariance_err:.1e} ({time.time() - t0:.0f}s) {r.failures}",
                      flush=True)
    print("## latency (median ms, do_bench with L2 flush) / extra peak MiB, B=1 default config")
    for precision in ("fp32", "bf16"):
        for n in lengths:
            inputs = make_inputs(config, 1, n, dtype=torch.float32, device=dev, seed=1)
            inputs = inputs.to(dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[precision])
            args = inputs.as_tuple()
            rows = [("triton", Triton(), {}), ("triton-fullfuse", TritonFullFuse(), {}),
                    ("reference", Reference(), {})]
            if precision == "fp32":
                rows.append(("torch-compile", Compiled(), {}))
            for label, variant, _ in rows:
                if label == "reference" and n > 4096:
                    continue
                with math_mode(precision), torch.no_grad():
                    t0 = time.time()
                    fn = variant.build(sd, config, "cuda", precision)
                    fn(*args)
                    torch.cuda.synchronize()
                    first = time.time() - t0
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    fn(*args)
                    torch.cuda.synchronize()
                    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                    ms = do_bench(lambda fn=fn, args=args: fn(*args), warmup=50, rep=300,
                                  return_mode="median")
                print(f"{label:16s} {precision} N={n:5d} {ms:8.3f} ms  {peak:8.0f} MiB "
                      f"(first call {first:.1f}s)", flush=True)
                del fn
                torch.cuda.empty_cache()


if __name__ == "__main__":  # pragma: no cover
    _bench_main([int(a) for a in sys.argv[1:]] or [1024, 4096])
