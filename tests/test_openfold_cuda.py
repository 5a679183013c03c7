"""Problem `openfold`'s `cuda-fused` (`variants/openfold/cuda_fused.py`, kernel
`variants/csrc/ipa_openfold.cu`): one CUDA kernel, OpenFold's sizes exactly. CPU: registration,
the sizes it refuses with reasons (CI compiles the kernel with ptxas in test_cuda_sources.py),
and its operand rows (`cuda_rows.py`, under the Triton interpreter) equal to the bit the PyTorch
form that defines them (`torch_rows` below).
GPU (marker `gpu`): the harness's protocol at ragged lengths and padded batches, odd and small
head counts (the attention warps stack two heads; an odd H leaves the last warp one), the mask
semantics the Triton variants are held to, z refused when strided, O(N) extra memory, and the
fp32 form whose pair warps share W_b's loads (`PAIR_HALVES`) held to the protocol and to the
default form."""

from __future__ import annotations

import pytest
import torch

from harness.correctness import check_variant, rel_l2
from tests.test_openfold_triton import (
    _with_mask,
    assert_within_protocol,
    built,
    extra_peak_bytes,
    needs_interpreter,
    run,
)
from variants.openfold.problem import OpenFoldConfig, make_inputs
from variants.problem import IPAInputError
from variants.registry import all_variants, get_variant

NAME = "cuda-fused"
AF2 = OpenFoldConfig()
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_registered_for_openfold_with_its_sizes():
    variant = get_variant(NAME, "openfold")
    assert variant.problems == ("openfold",) and NAME in all_variants("openfold")
    assert variant.precisions == ("fp32", "bf16")
    assert variant.math_mode_label("fp32") == "fp32-3xtf32"
    assert variant.math_mode_label("bf16") == "bf16-tf32"


@pytest.mark.parametrize("change, reason", [
    ({"c_hidden": 8}, "c_hidden=8 outside the supported range [16, 16]"),
    ({"no_heads": 13}, "no_heads=13 outside the supported range [1, 12]"),
    ({"no_qk_points": 3}, "no_qk_points=3 outside the supported range [4, 4]"),
    ({"no_v_points": 6}, "no_v_points=6 outside the supported range [8, 8]"),
    ({"c_z": 64}, "c_z=64 outside the supported range [128, 128]"),
])
def test_other_sizes_are_refused_with_a_reason(change, reason):
    config = OpenFoldConfig(**change)
    reasons = get_variant(NAME, "openfold").not_supported_reasons(config, "cuda", "fp32")
    assert reason in reasons
    with pytest.raises(IPAInputError, match="cannot run here"):
        get_variant(NAME, "openfold").build({}, config, "cuda", "fp32")


def torch_rows(q, k, v, q_pts, k_pts, v_pts, *, split_k: bool, round_v: bool):
    """The operand rows in PyTorch (`cuda_rows.py`'s definition): cat, zero padding to whole
    8-row key tiles, and for bf16 z k's TF32 parts and v rounded to TF32."""
    from variants.openfold.triton_fused import tf32_split

    N = q.shape[1]
    n_pad = -(-N // 8) * 8

    def rows(parts, width, length):
        cat = torch.cat(parts, dim=-1)
        return torch.nn.functional.pad(cat, (0, width - cat.shape[-1], 0, length - N))

    def heads_first(x):  # (B, N, H, C) -> (B, H, N, C) fp32
        return x.transpose(1, 2).float()

    k, v = heads_first(k), heads_first(v)
    if split_k:
        k_hi, k_lo = tf32_split(k)
        k_rows = rows([k_hi, tf32_split(k_lo)[0], k_pts.transpose(2, 3)], 44, n_pad)
    else:
        k_rows = rows([k, k_pts.transpose(2, 3)], 28, n_pad)
    if round_v:
        v = tf32_split(v)[0]
    return (rows([heads_first(q), q_pts.transpose(2, 3)], 28, N), k_rows,
            rows([v, v_pts], 44, n_pad))


@needs_interpreter
@pytest.mark.parametrize("dtype, split", [(torch.float32, False), (torch.bfloat16, True),
                                          (torch.float32, True)])
@pytest.mark.parametrize("batch, length, heads", [(2, 13, 3), (1, 40, 12), (1, 1, 1)])
def test_operand_rows_equal_their_pytorch_definition(dtype, split, batch, length, heads):
    from variants.openfold.cuda_rows import operand_rows

    gen = torch.Generator().manual_seed(length)
    # q, k, v as the projections give them: (B, N, H, 16) views of one (B, N, 3 H 16) GEMM output
    qkv = torch.randn(batch, length, 3 * heads * 16, generator=gen).to(dtype)
    q, k, v = (t.view(batch, length, heads, 16) for t in qkv.split(heads * 16, dim=-1))
    q_pts = torch.randn(batch, heads, 12, length, generator=gen) * 30
    k_pts = torch.randn(batch, heads, 12, length, generator=gen) * 30
    v_pts = torch.randn(batch, heads, length, 24, generator=gen) * 30
    got = operand_rows(q, k, v, q_pts, k_pts, v_pts, split_k=split, round_v=split)
    want = torch_rows(q, k, v, q_pts, k_pts, v_pts, split_k=split, round_v=split)
    for name, g, w in zip("qkv", got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype == torch.float32, name
        assert torch.equal(g, w), name


# ---- GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("config, batch, length", [
    (AF2, 1, 1), (AF2, 3, 8), (AF2, 2, 97), (AF2, 1, 1000),
    (OpenFoldConfig(no_heads=5), 2, 33), (OpenFoldConfig(no_heads=2), 2, 17),
    (OpenFoldConfig(no_heads=1), 1, 9)],
    ids=["n1", "n8-b3", "n97-b2", "n1000", "h5", "h2", "h1"])
def test_protocol_on_the_gpu(precision, config, batch, length):
    """The harness's protocol (seeds, padded batches with different true lengths, SE(3)
    invariance) against the float64 oracle."""
    result = check_variant(get_variant(NAME, "openfold"), config, batch=batch, length=length,
                           device="cuda", precision=precision, seeds=3)
    assert result.passed, (result.failures, result.rel_l2, result.tol)


@pytest.mark.gpu
@needs_cuda
def test_mask_semantics_on_the_gpu():
    """As the Triton variants' CPU tests: a fully masked batch element is computed as if
    unmasked and leaves the other unchanged; masked query rows attend to every key."""
    x = make_inputs(AF2, 2, 19, dtype=torch.float64, device="cuda", seed=5, lengths=[19, 12])
    mask = x.mask.clone()
    mask[1] = 0
    out, ref, oracle, xm = run(AF2, _with_mask(x, mask), device="cuda", name=NAME)
    assert_within_protocol(out, ref, oracle, xm.mask, "fp32")
    unmasked, _, _, _ = run(AF2, _with_mask(x, torch.ones_like(mask)), device="cuda", name=NAME)
    assert rel_l2(out[1], unmasked[1]) < 1e-5
    y = make_inputs(AF2, 2, 21, dtype=torch.float64, device="cuda", seed=6, lengths=[21, 13])
    out, _, _, _ = run(AF2, y, device="cuda", name=NAME)
    masked = y.mask == 0
    as_if, _, _, _ = run(AF2, _with_mask(y, torch.ones_like(y.mask)), device="cuda", name=NAME)
    assert rel_l2(out[masked], as_if[masked]) < 1e-5
    assert rel_l2(out[~masked], as_if[~masked]) > 1e-2


@pytest.mark.gpu
@needs_cuda
def test_inf_comes_from_the_config_on_the_gpu():
    """inf = 2: masked keys keep a weight of about e^-2; the oracle uses the config's inf too."""
    config = OpenFoldConfig(inf=2.0)
    x = make_inputs(config, 2, 17, dtype=torch.float64, device="cuda", seed=8,
                    lengths=[17, 8])
    out, ref, oracle, xm = run(config, x, device="cuda", name=NAME)
    assert_within_protocol(out, ref, oracle, xm.mask, "fp32")
    big, _, _, _ = run(AF2, x, device="cuda", name=NAME)
    assert rel_l2(out[xm.mask != 0], big[xm.mask != 0]) > 1e-3


@pytest.mark.gpu
@needs_cuda
def test_strided_z_is_refused_before_any_launch():
    _, fn, _ = built(AF2, "fp32", "cuda", NAME)
    x = make_inputs(AF2, 1, 9, device="cuda", seed=10)
    with pytest.raises(IPAInputError, match="z: expected a contiguous tensor"):
        fn(x.s, x.z.transpose(1, 2), x.translations, x.rotations, x.mask)


@pytest.mark.gpu
@needs_cuda
def test_extra_memory_is_linear_in_n():
    """No N x N tensor: at N = 1536 the (B, H, N, N) fp32 logits alone would be 108 MiB."""
    extra = extra_peak_bytes(NAME, 1536)
    assert extra < 40 * 2**20, extra / 2**20


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("config, batch, length", [
    (AF2, 1, 1), (AF2, 3, 8), (AF2, 2, 97), (AF2, 1, 1000), (OpenFoldConfig(no_heads=5), 2, 33)],
    ids=["n1", "n8-b3", "n97-b2", "n1000", "h5"])
def test_pair_halves_on_the_gpu(monkeypatch, config, batch, length):
    """fp32 with the pair warps sharing W_b's loads (`PAIR_HALVES`: each pair computes both
    queries' biases over half the channels each and swaps the partial sums): the protocol holds,
    and the output is the default form's but for the bias's summation order. Odd N and an odd
    batch tail leave a pair's second query outside N (zero-filled rows)."""
    from variants.openfold import cuda_fused

    result = None
    for halves in (False, True):
        monkeypatch.setattr(cuda_fused, "PAIR_HALVES", halves)
        result = check_variant(get_variant(NAME, "openfold"), config, batch=batch, length=length,
                               device="cuda", precision="fp32", seeds=2)
        assert result.passed, (halves, result.failures, result.rel_l2, result.tol)
    x = make_inputs(config, batch, length, dtype=torch.float32, device="cuda", seed=3)
    outs = []
    for halves in (False, True):
        monkeypatch.setattr(cuda_fused, "PAIR_HALVES", halves)
        _, fn, _ = built(config, "fp32", "cuda", NAME)
        outs.append(fn(x.s, x.z, x.translations, x.rotations, x.mask))
    assert rel_l2(outs[1], outs[0]) < 1e-5, rel_l2(outs[1], outs[0])


@pytest.mark.gpu
@needs_cuda
def test_pair_halves_refused_for_bf16_z():
    from variants.cuda_ext import load_extension

    dev, f32 = "cuda", torch.float32
    z = torch.zeros(1, 8, 8, 128, device=dev, dtype=torch.bfloat16)
    args = (torch.zeros(1, 1, 8, 28, device=dev), torch.zeros(1, 1, 8, 44, device=dev),
            torch.zeros(1, 1, 8, 44, device=dev), z, torch.zeros(1, 128, device=dev),
            torch.zeros(1, device=dev), torch.ones(1, 8, device=dev, dtype=f32),
            torch.zeros(1, 8, 16 + 24 + 128, device=dev), torch.zeros(1, 8, 1, 24, device=dev),
            0.25, 1e5)
    with pytest.raises(RuntimeError, match="argument 'pair_halves': expected false for z of "
                                           "dtype bfloat16"):
        load_extension().openfold_forward(*args, True, True)
    load_extension().openfold_forward(*args, True, False)  # the same call without it runs
