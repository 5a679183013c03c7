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
from tests.test_variants import case_id, run_check
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


def test_unknown_math_mode_is_rejected(small_fn):
    weights = TritonIPAWeights.from_state_dict(init_state_dict(SMALL), SMALL, "cpu",
                                               torch.float32)
    with pytest.raises(IPAInputError, match="math_mode"):
        triton_ipa(weights, *make_inputs(SMALL, 1, 5).as_tuple(), math_mode="tf32x3")


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
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_oracle_gpu(name, case, precision):
    fullfuse_limit = VARIANTS["triton-fullfuse"].fp32_max_head_dim
    declared_limit = (name == "triton-fullfuse" and precision == "fp32"
                      and case[2].head_dim > fullfuse_limit)
    run_check(name, case, "cuda", precision, seeds=3, must_run=not declared_limit)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("case", [GPU_CASES[1], GPU_CASES[4]], ids=case_id)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_tf32_matches_oracle_gpu(name, case):
    run_check(name, case, "cuda", "tf32", seeds=3, must_run=True)


# ---- the numbers for docs/perf-notes.md (run as a script on the GPU machine) ----------------


def _bench_main(argv: list[str]) -> None:  # pragma: no cover - GPU only
    """Sections, each skipped once `--budget` seconds have passed: correctness, latency and
    peak memory of the variants, a per-kernel breakdown of `triton`."""
    import argparse
    import time

    import triton
    from triton.testing import do_bench

    from variants.compiled import Compiled
    from variants.problem import math_mode
    from variants.reference import Reference

    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="*", default=[1024, 4096])
    parser.add_argument("--sections", nargs="*", default=["check", "time", "breakdown"])
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

    def timed(fn, args):
        if not cuda:
            t0 = time.perf_counter()
            fn(*args)
            return (time.perf_counter() - t0) * 1e3, float("nan")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn(*args)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        ms = do_bench(lambda: fn(*args), warmup=25, rep=200, return_mode="median")
        return ms, peak

    builders = {"reference": Reference(), "torch-compile": Compiled(), **VARIANTS}
    if "time" in opts.sections:
        print("## latency: median ms (do_bench, L2 flushed), extra peak MiB; B=1, default config")
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
        from variants import triton_ipa as T
        for precision in opts.precisions:
            for n in opts.lengths:
                if not left():
                    continue
                dtype = dtypes[precision]
                w = TritonIPAWeights.from_state_dict(sd, config, dev, dtype)
                args = make_inputs(config, 1, n, dtype=dtype, device=dev, seed=1).as_tuple()
                with math_mode(precision), torch.no_grad():
                    ms_all, ms_bias, ms_cublas, ms_attn, ms_proj = _breakdown(w, args, timed)
                print(f"{precision} N={n:5d}: total {ms_all:.3f}  bias used {ms_bias:.3f} "
                      f"(other {ms_cublas:.3f})  attention {ms_attn:.3f}  qkv GEMM {ms_proj:.3f}"
                      f"  rest {ms_all - ms_bias - ms_attn:.3f} ms", flush=True)
                for k in ("pair_bias", "attn", "attn_fp32", "fullfuse", "fullfuse_fp32"):
                    kern = getattr(T._kernels(T._interpreting()), k)
                    for key, best in getattr(kern, "cache", {}).items():
                        print(f"   {k} {key[:3]}... best {best}")

    print(f"# done in {time.time() - start:.0f}s")


def _breakdown(w, args, timed):  # pragma: no cover - GPU only
    """Median ms of: the whole `triton` forward, the Triton pair-bias kernel, the same bias by
    cuBLAS (fp32 uses cuBLAS), the attention kernel (on random q/k/v/points of the right
    sizes), the qkv GEMM."""
    import torch.nn.functional as F

    cfg = w.config
    _, n, _ = args[0].shape
    dev, dtype = args[0].device, args[0].dtype
    z = args[1]
    ms_all, _ = timed(lambda *a: triton_ipa(w, *a), args)
    ms_bias, _ = timed(lambda z: pair_bias(z, w.w_pair), (z,))
    ms_cublas, _ = timed(
        lambda z: torch.matmul(w.w_pair, z.view(1, n * n, -1).transpose(1, 2)), (z,)
    )
    bias = pair_bias(z, w.w_pair)
    h, d = cfg.heads, cfg.head_dim
    q = torch.randn(1, n, h, d, device=dev, dtype=dtype)
    pts = torch.randn(1, h, 3 * cfg.query_points, n, device=dev) * 10
    vpts = torch.randn(1, h, n, 3 * cfg.value_points, device=dev) * 10
    t = torch.randn(1, n, 3, device=dev) * 10
    out_s = torch.empty_like(q)
    ms_attn, _ = timed(
        lambda: ipa_attention(q, q, q, pts, pts, vpts, t, w.head_scale, out_s, bias=bias), ()
    )
    if dtype == torch.float32:
        ms_bias, ms_cublas = ms_cublas, ms_bias  # fp32 forward uses cuBLAS; report the other
    x = F.layer_norm(args[0], (cfg.node_dim,), w.ln_weight, w.ln_bias)
    ms_proj, _ = timed(lambda x: F.linear(x, w.w_in), (x,))
    return ms_all, ms_bias, ms_cublas, ms_attn, ms_proj


if __name__ == "__main__":  # pragma: no cover
    _bench_main(sys.argv[1:])


def test_fullfuse_declares_its_fp32_shared_memory_limit():
    fullfuse = VARIANTS["triton-fullfuse"]
    assert any("head_dim=96 > 64" in r
               for r in fullfuse.not_supported_reasons(IPAConfig(heads=4), "cuda", "fp32"))
    for config, precision in [(IPAConfig(), "fp32"), (IPAConfig(heads=4), "bf16")]:
        assert not any("head_dim" in r
                       for r in fullfuse.not_supported_reasons(config, "cuda", precision))
