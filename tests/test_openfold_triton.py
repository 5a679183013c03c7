"""Problem `openfold`'s Triton variants: the fused `triton` (`variants/openfold/triton_fused.py`)
and `triton-bias` (`triton_bias.py`: pair bias, attention and pair values as three kernels,
and a training step through `core_op.py` and `bias_backward.py`); every test of the forward
runs on both (`NAMES`).

What the generated tests do not cover: awkward lengths (N = 1, 17, 33, 70, single and
multiple key blocks, partial last blocks), padded batches with B > 1 and different lengths, a
batch element with every residue masked, masked query rows computed as if unmasked, `inf` taken
from the config (a small one lets masked keys keep weight), padded tails that must not matter,
z read through its strides, fp32 against the float64 oracle and better than the reference, bad
input refused before any kernel launches. CPU: the kernel under the Triton interpreter
(`TRITON_INTERPRET=1`, which `make test` sets where there is no GPU), bf16/fp16 with the
interpreter's dots in fp32. GPU (marker `gpu`): the correctness protocol in fp32 and bf16 up
to N = 1000, and the extra memory is O(N).
"""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch

from harness.correctness import check_variant, rel_l2, tolerance
from variants.openfold.problem import OpenFoldConfig, OpenFoldInputs, init_state_dict, make_inputs
from variants.openfold.reference import make_module, oracle_forward
from variants.openfold.triton_fused import OpenFoldTriton, kernel_precisions
from variants.problem import IPAInputError, get_precision
from variants.registry import get_variant

pytestmark = pytest.mark.usefixtures("one_thread")

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()
needs_interpreter = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET),
    reason="CPU tests of the Triton kernel need triton and TRITON_INTERPRET=1 "
    "(`make test` sets it where there is no GPU)")
needs_cuda = pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA),
                                reason="needs a CUDA device and triton")

NAMES = ["triton", "triton-bias"]
# Awkward sizes: nothing a power of two (every padded axis of the kernel is exercised).
SMALL = OpenFoldConfig(c_s=24, c_z=20, c_hidden=6, no_heads=5, no_qk_points=3, no_v_points=2)
# The AF2 layer's heads and points with narrower features (the interpreter's cost is in z).
AF2ISH = OpenFoldConfig(c_s=32, c_z=32, c_hidden=16, no_heads=12, no_qk_points=4,
                        no_v_points=8)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_BUILT: dict = {}


def built(config: OpenFoldConfig, precision: str = "fp32", device: str = "cpu",
          name: str = "triton"):
    """(state_dict, variant `name`'s callable, the reference module), once per
    configuration."""
    key = (config, precision, device, name)
    if key not in _BUILT:
        sd = init_state_dict(config, seed=7)
        _BUILT[key] = (sd, get_variant(name, "openfold").build(sd, config, device, precision),
                       make_module(sd, config, device, DTYPES[precision]))
    return _BUILT[key]


def parts_errors(out, ref, oracle, mask) -> dict[str, tuple[float, float]]:
    """{part: (the variant's rel_l2, the reference's)} against the oracle, present rows and
    masked rows judged apart (as `harness.correctness.judge_output` does)."""
    present = mask != 0
    errors = {"present": (rel_l2(out[present], oracle[present]),
                          rel_l2(ref[present], oracle[present]))}
    if (~present).any():
        errors["masked"] = (rel_l2(out[~present], oracle[~present]),
                            rel_l2(ref[~present], oracle[~present]))
    return errors


def assert_within_protocol(out, ref, oracle, mask, precision: str):
    """The harness's rule per part: rel_l2 <= max(2 x the reference's own, the floor)."""
    assert torch.isfinite(out).all()
    for part, (err, ref_err) in parts_errors(out, ref, oracle, mask).items():
        tol = tolerance(ref_err, get_precision(precision))
        assert err <= tol, f"{part} rows: rel_l2 {err:.3e} > tol {tol:.3e} (ref {ref_err:.3e})"


def extra_peak_bytes(name: str, length: int) -> int:
    """Peak CUDA memory of variant `name`'s fp32 forward of the AF2 layer at B = 1 over what was
    allocated before it (after a warm-up call)."""
    config = OpenFoldConfig()
    _, fn, _ = built(config, "fp32", "cuda", name)
    x = make_inputs(config, 1, length, device="cuda", seed=12)
    fn(*x.as_tuple())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn(*x.as_tuple())
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def run(config, inputs: OpenFoldInputs, precision="fp32", device="cpu", name="triton"):
    sd, fn, module = built(config, precision, device, name)
    x = inputs.to(device=device, dtype=DTYPES[precision])
    with torch.no_grad():
        return fn(*x.as_tuple()), module(*x.as_tuple()), oracle_forward(sd, config, x), x


# ---- registration and capabilities --------------------------------------------------------

def test_registered_for_openfold_only_with_its_capabilities():
    variant = get_variant("triton", "openfold")
    assert isinstance(variant, OpenFoldTriton) and variant.problems == ("openfold",)
    assert not variant.is_baseline and not variant.supports_backward
    assert variant.requires == ("triton",)
    for precision in ("fp64", "tf32"):
        assert any(f"precision {precision!r} not supported" in r
                   for r in variant.not_supported_reasons(SMALL, "cuda", precision))
    # fp16: the problem's own reason (inf = 1e5 overflows), none at OpenFold's low-precision inf
    assert any(r.startswith("inf=100000 overflows torch.float16")
               for r in variant.not_supported_reasons(SMALL, "cuda", "fp16"))
    low = OpenFoldConfig(inf=1e4)
    assert not any("overflows" in r for r in variant.not_supported_reasons(low, "cuda", "fp16"))
    wide = OpenFoldConfig(no_heads=17, c_z=256)
    reasons = " | ".join(variant.not_supported_reasons(wide, "cuda", "fp32"))
    assert "heads=17 outside" in reasons and "pair_dim=256 outside" in reasons


def test_triton_bias_is_registered_with_its_math_mode():
    """fp32 `ieee` rows run every dot as 3xTF32 and say so; the rest as `triton`'s."""
    variant = get_variant("triton-bias", "openfold")
    assert variant.problems == ("openfold",) and variant.supports_backward
    assert variant.math_mode_label(get_precision("fp32")) == "fp32-3xtf32"
    wide = OpenFoldConfig(no_heads=17)
    assert any("heads=17 outside" in r
               for r in variant.not_supported_reasons(wide, "cuda", "fp32"))


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pair_values_kernel_matches_einsum(dtype):
    """o_pair[b, i, h] = sum_j 2^(s - m - log2 l) z[b, i, j] from logits and row statistics,
    through strided z and into a strided output; padded heads and keys contribute nothing."""
    from variants.openfold.pair_values import launch_pair_values

    gen = torch.Generator().manual_seed(13)
    b, h, n, c = 2, 5, 37, 20
    logits = torch.randn(b, h, n, n, generator=gen) * 4
    m = logits.amax(-1)
    l_sum = torch.exp2(logits - m[..., None]).sum(-1)
    stats = torch.stack([m, l_sum.log2(), torch.zeros_like(m)], -1).permute(0, 2, 1, 3)
    z = torch.randn(b, n, n, c + 3, generator=gen)[..., 1:1 + c].to(dtype)
    out = torch.zeros(b, n, h * c + 7)
    launch_pair_values(logits, stats.contiguous(), z, out[..., 7:].view(b, n, h, c),
                       "tf32x3" if dtype == torch.float32 else "ieee")
    a = torch.softmax(logits.double() * math.log(2), -1)
    got = out[..., 7:].double()
    if dtype == torch.float32:
        expect = torch.einsum("bhij,bijc->bihc", a, z.double()).reshape(b, n, h * c)
        assert rel_l2(got, expect) < 1e-6
    else:
        # The probabilities rounded to bf16 as the reference's are. The kernel rounds its own
        # fp32 2^(s - m - log2 l), which lies within an fp32 ulp or two of the exact value: where
        # that straddles a bf16 rounding boundary, one bf16 ulp (<= 2^-7 p) either way is as
        # right, and which side depends on the machine's exp2. So each output is held to the
        # exactly rounded sum within those flips (a wrong index or mask is off by O(1)).
        expect = torch.einsum("bhij,bijc->bihc", a.float().to(dtype).double(),
                              z.double()).reshape(b, n, h * c)
        flips = torch.einsum("bhij,bijc->bihc", a * 2.0**-7,
                             z.double().abs()).reshape(b, n, h * c)
        assert ((got - expect).abs() <= flips + 1e-6).all()
        assert rel_l2(got, expect) < 1e-4
    assert (out[..., :7] == 0).all()


def test_dot_precisions_keep_fp32_accurate():
    """fp32: the z dots in 3xTF32 (never plain TF32), IEEE elsewhere; 16-bit: tensor cores,
    the fp32 point dots in 3xTF32."""
    assert kernel_precisions(torch.float32, "ieee") == ("ieee", "tf32x3", "ieee")
    assert kernel_precisions(torch.bfloat16, "ieee")[2] == "tf32x3"
    with pytest.raises(IPAInputError, match="math_mode"):
        kernel_precisions(torch.bfloat16, "tf32")


# ---- against the float64 oracle (interpreter) -----------------------------------------------

# c_z = 64: the pair values' z tiles whole in channels too (under the interpreter 64 wide)
AF2ISH_Z64 = OpenFoldConfig(c_s=32, c_z=64, c_hidden=16, no_heads=12, no_qk_points=4,
                            no_v_points=8)
CASES = [  # (config, lengths): N = max(lengths)
    (SMALL, [1]),
    (SMALL, [17, 9]),
    (SMALL, [33, 33, 5]),
    (SMALL, [70, 41]),
    (AF2ISH, [33, 20]),
    (SMALL, [32, 20]),  # N = 32: whole query and key blocks (the kernels' EVEN paths)
    (AF2ISH_Z64, [32, 20]),
]
CONFIG_NAMES = {id(SMALL): "small", id(AF2ISH): "af2ish", id(AF2ISH_Z64): "af2ish-z64"}


@needs_interpreter
@pytest.mark.parametrize("config, lengths", CASES,
                         ids=[f"{CONFIG_NAMES[id(c)]}-{'-'.join(map(str, n))}"
                              for c, n in CASES])
@pytest.mark.parametrize("name", NAMES)
def test_fp32_matches_oracle_and_beats_the_reference(config, lengths, name):
    inputs = make_inputs(config, len(lengths), max(lengths), dtype=torch.float64, seed=3,
                         lengths=lengths)
    out, ref, oracle, x = run(config, inputs, name=name)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert_within_protocol(out, ref, oracle, x.mask, "fp32")
    errors = parts_errors(out, ref, oracle, x.mask)
    # IEEE dots, a centred frame and fp32 logits: no worse than the fp32 reference
    assert errors["present"][0] <= errors["present"][1], errors
    if "masked" in errors:  # the mask term does not shift a masked row by -inf, see Deviations
        assert errors["masked"][0] < 0.1 * errors["masked"][1], errors


@needs_interpreter
@pytest.mark.parametrize("precision, config", [("bf16", SMALL), ("fp16", OpenFoldConfig(
    c_s=24, c_z=20, c_hidden=6, no_heads=5, no_qk_points=3, no_v_points=2, inf=1e4))])
@pytest.mark.parametrize("name", NAMES)
def test_16bit_matches_oracle(precision, config, name):
    inputs = make_inputs(config, 2, 17, dtype=torch.float64, seed=4, lengths=[17, 11])
    out, ref, oracle, x = run(config, inputs, precision, name=name)
    assert out.dtype == DTYPES[precision]
    assert_within_protocol(out, ref, oracle, x.mask, precision)
    assert parts_errors(out, ref, oracle, x.mask)["present"][0] < 0.2 * rel_l2(
        ref[x.mask != 0], oracle[x.mask != 0])


@needs_interpreter
@pytest.mark.parametrize("meta", [
    {"SPLIT": False, "ZCH": 1, "LAZY": False, "TC": 0, "BT": False},
    {"SPLIT": True, "ZCH": 1, "LAZY": False, "TC": 1, "BT": False},
    {"SPLIT": False, "ZCH": 2, "LAZY": True, "TC": 0, "BT": True, "BLOCK_M": 4}],
    ids=["tf32x3-zch1-eager-fma", "split-zch1-eager-tc1", "tf32x3-zch2-lazy-fma-bt-bm4"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_code_path_the_autotuner_may_pick(precision, meta, monkeypatch):
    """The constexpr paths the GPU configs select (SPLIT: the tf32x3 dots split by the host and
    `tf32.tf32_hi`, or Triton's tf32x3; ZCH: z in one or two channel chunks; LAZY: the online
    softmax's rescaling skipped while no running max grows by more than 2^8; TC: fp32's IEEE
    dots as split TF32; BT: the bias dot as W_b z^T) agree with the oracle (the interpreter
    runs one config, SPLIT ZCH=2 LAZY TC=1 BT: the others are patched in). The interpreter's
    dots are numpy fp32: what TF32 truncation does to the low parts is left to the GPU tests."""
    from variants.openfold import triton_kernel as tk

    for tuned in (tk._kernel_fp32, tk._kernel_16bit):
        monkeypatch.setattr(tuned, "meta", {**tuned.meta, **meta})
    inputs = make_inputs(AF2ISH, 2, 33, dtype=torch.float64, seed=5, lengths=[33, 20])
    out, ref, oracle, x = run(AF2ISH, inputs, precision)
    assert_within_protocol(out, ref, oracle, x.mask, precision)
    if precision == "fp32":
        assert parts_errors(out, ref, oracle, x.mask)["present"][0] <= rel_l2(
            ref[x.mask != 0], oracle[x.mask != 0])


def test_tf32_split_is_exact_and_rounds_to_nearest():
    """hi has 10 mantissa bits (round to nearest, ties away from zero: cvt.rna.tf32.f32),
    hi + lo == x exactly, |lo| <= ulp_tf32(x) / 2."""
    from variants.openfold.triton_fused import tf32_split

    x = torch.randn(4096, dtype=torch.float64).mul(100).float()
    x[:3] = torch.tensor([1.0 + 2.0 ** -11, 1.0 + 2.0 ** -11 + 2.0 ** -20, -3.0])
    hi, lo = tf32_split(x)
    assert ((hi.view(torch.int32) & 0x1FFF) == 0).all()
    assert torch.equal(hi + lo, x)
    assert (lo.abs() <= hi.abs() * 2.0 ** -11).all()
    assert hi[0] == 1.0 + 2.0 ** -10 and hi[1] == 1.0 + 2.0 ** -10 and hi[2] == -3.0


# ---- the mask -------------------------------------------------------------------------------

def _with_mask(x: OpenFoldInputs, mask: torch.Tensor) -> OpenFoldInputs:
    return OpenFoldInputs(x.s, x.z, x.translations, x.rotations, mask)


@needs_interpreter
@pytest.mark.parametrize("name", NAMES)
def test_fully_masked_batch_element(name):
    """Every residue of element 1 masked: all its rows are masked query rows, computed as if
    unmasked (softmax over every key, no NaN); element 0 is unaffected by it."""
    x = make_inputs(SMALL, 2, 19, dtype=torch.float64, seed=5, lengths=[19, 12])
    mask = x.mask.clone()
    mask[1] = 0
    out, ref, oracle, xm = run(SMALL, _with_mask(x, mask), name=name)
    assert torch.isfinite(out).all()
    assert_within_protocol(out, ref, oracle, xm.mask, "fp32")
    unmasked, _, _, _ = run(SMALL, _with_mask(x, torch.ones_like(mask)), name=name)
    assert rel_l2(out[1], unmasked[1]) < 1e-5
    alone, _, _, _ = run(SMALL, OpenFoldInputs(*(t[:1] for t in x.as_tuple())), name=name)
    assert rel_l2(out[0], alone[0]) < 1e-5


@needs_interpreter
@pytest.mark.parametrize("name", NAMES)
def test_masked_query_rows_come_out_as_if_unmasked(name):
    """SPEC step 5: a masked query row attends to every key, the masked ones included."""
    x = make_inputs(SMALL, 2, 21, dtype=torch.float64, seed=6, lengths=[21, 13])
    out, _, _, _ = run(SMALL, x, name=name)
    masked = x.mask == 0
    as_if, _, _, _ = run(SMALL, _with_mask(x, torch.ones_like(x.mask)), name=name)
    assert rel_l2(out[masked], as_if[masked]) < 1e-5
    assert rel_l2(out[~masked], as_if[~masked]) > 1e-2  # present rows do see the mask


@needs_interpreter
@pytest.mark.parametrize("name", NAMES)
def test_inf_comes_from_the_config(name):
    """inf = 2: masked keys keep a weight of about e^-2, which -inf or a hard-coded 1e5 would
    remove; the oracle (the reference in float64) uses the config's inf too."""
    config = OpenFoldConfig(c_s=24, c_z=20, c_hidden=6, no_heads=5, no_qk_points=3,
                            no_v_points=2, inf=2.0)
    x = make_inputs(config, 2, 17, dtype=torch.float64, seed=8, lengths=[17, 8])
    out, ref, oracle, xm = run(config, x, name=name)
    assert_within_protocol(out, ref, oracle, xm.mask, "fp32")
    big, _, _, _ = run(SMALL, x, name=name)  # the same layer and weights at inf = 1e5
    present = xm.mask != 0
    assert rel_l2(out[present], big[present]) > 1e-3


@needs_interpreter
@pytest.mark.parametrize("name", NAMES)
def test_padded_tails_do_not_matter(name):
    """Finite junk in every masked residue's s, z rows and columns (1e3) and translations
    (+40 A) leaves the present rows unchanged, up to the rounding of the frame the kernel
    centres on each element's mean translation: masked keys get no weight."""
    x = make_inputs(SMALL, 2, 18, dtype=torch.float64, seed=9, lengths=[18, 7])
    pad = x.mask == 0
    s, z, t = x.s.clone(), x.z.clone(), x.translations.clone()
    s[pad] = 1e3
    t[pad] += 40.0
    z[pad] = 1e3
    z.transpose(1, 2)[pad] = 1e3
    out, _, _, _ = run(SMALL, x, name=name)
    spoiled, _, _, _ = run(SMALL, OpenFoldInputs(s, z, t, x.rotations, x.mask), name=name)
    assert rel_l2(spoiled[~pad], out[~pad]) < 2e-6


# ---- inputs ---------------------------------------------------------------------------------

@needs_interpreter
@pytest.mark.parametrize("name", NAMES)
def test_z_is_read_through_its_strides(name):
    """z as a strided view (a channel slice of a wider tensor, and a transposed one): the
    same result as its contiguous copy."""
    x = make_inputs(SMALL, 2, 17, seed=10, lengths=[17, 10])
    _, fn, _ = built(SMALL, name=name)
    wide = torch.randn(2, 17, 17, SMALL.c_z + 5)
    wide[..., 2:2 + SMALL.c_z] = x.z
    transposed = x.z.transpose(1, 2).contiguous().transpose(1, 2)
    expect = fn(*x.as_tuple())
    for z in (wide[..., 2:2 + SMALL.c_z], transposed):
        assert not z.is_contiguous()
        got = fn(x.s, z, x.translations, x.rotations, x.mask)
        assert torch.equal(got, expect) or rel_l2(got, expect) < 1e-6


def _spoil(name, fn):
    def spoil(fields):
        fields[name] = fn(fields[name])
        return fields
    return spoil


BAD = [
    (_spoil("s", lambda t: t.double()), r"s: expected dtype in \[torch.float32\]"),
    (_spoil("z", lambda t: t[:, :, :-1]), r"z: expected shape \(2, 9, 9, 20\)"),
    (_spoil("mask", lambda t: t.bool()), r"mask: expected dtype torch.float32"),
    (_spoil("rotations", lambda t: t[..., :2]), r"rotations: expected shape"),
]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("spoil, message", BAD, ids=[m.split(":")[0] for _, m in BAD])
@pytest.mark.parametrize("name", NAMES)
def test_bad_input_is_refused_before_any_launch(spoil, message, name, monkeypatch):
    from variants.openfold import triton_kernel
    from variants.openfold.triton_bias import BiasForward
    from variants.openfold.triton_fused import FusedForward
    from variants.triton import frames, pair_bias

    launches = []
    monkeypatch.setattr(triton_kernel, "launch", lambda *a, **k: launches.append(a))
    monkeypatch.setattr(frames, "prologue", lambda *a, **k: launches.append(a))
    monkeypatch.setattr(pair_bias, "launch_pair_bias", lambda *a, **k: launches.append(a))
    module = make_module(init_state_dict(SMALL), SMALL, "cpu", torch.float32)
    forward = FusedForward if name == "triton" else BiasForward
    fn = forward(module, torch.device("cpu"), torch.float32, "ieee")
    x = make_inputs(SMALL, 2, 9, seed=11)
    fields = dict(zip(("s", "z", "translations", "rotations", "mask"), x.as_tuple(),
                      strict=True))
    with pytest.raises(IPAInputError, match=message):
        fn(**spoil(fields))
    assert launches == []


@needs_interpreter
@pytest.mark.parametrize("name", NAMES)
def test_build_refuses_what_it_cannot_run(name):
    with pytest.raises(IPAInputError, match="precision 'fp64' not supported"):
        get_variant(name, "openfold").build(init_state_dict(SMALL), SMALL, "cpu", "fp64")


# ---- triton-bias's training step --------------------------------------------------------------

@needs_interpreter
@pytest.mark.parametrize("config, lengths, precision", [
    (SMALL, [17, 9], "fp32"), (SMALL, [1], "fp32"), (AF2ISH, [33, 20], "fp32"),
    (AF2ISH, [32, 20], "fp32"), (SMALL, [17, 9], "bf16"), (SMALL, [32, 9], "bf16"),
    (AF2ISH, [21, 21], "bf16")],
    # N = 32: whole key blocks in the pair pass (unmasked z tiles where c_z needs no padding)
    ids=["small-17-9-fp32", "small-1-fp32", "af2ish-33-20-fp32", "af2ish-32-20-fp32",
         "small-17-9-bf16", "small-32-9-bf16", "af2ish-21-bf16"])
def test_triton_bias_gradients_match_the_oracle(config, lengths, precision):
    """The harness's gradient protocol (every input but the mask, every parameter; masked tails,
    padded batches) on the custom op's backward (`bias_backward.py`). fp32 gradients stay
    under the reference's own error: the interpreter's dots are fp32, so TF32's truncation of
    the split parts is the GPU test's to judge."""
    result = check_variant(get_variant("triton-bias", "openfold"), config, batch=len(lengths),
                           length=max(lengths), precision=precision, seeds=1,
                           pass_name="forward+backward")
    assert result.passed, (result.failures, result.grad_worst, result.grad_rel_l2)
    assert "linear_b.bias" in result.gradients  # exactly zero: the softmax cancels it
    if precision == "fp32" and max(lengths) > 1:
        worst = max(g["rel_l2"] / g["reference_rel_l2"] for name, g in result.gradients.items()
                    if name not in ("linear_b.bias", "linear_out.bias"))
        assert worst < 1.0, result.gradients


@needs_interpreter
def test_triton_bias_ops_pass_opcheck():
    """torch.library.opcheck of the forward and the backward custom op (schema, autograd
    registration, fake tensors, AOT dispatch)."""
    from variants.openfold import core_op

    gen = torch.Generator().manual_seed(5)
    b, n, h, c, pq, pv, cz = 2, 17, 3, 8, 2, 3, 20
    rand = lambda *shape: torch.randn(*shape, generator=gen)
    mask = torch.ones(b, n)
    mask[1, 12:] = 0
    operands = [rand(b, n, h, c), rand(b, n, h, c), rand(b, n, h, c), rand(b, h, 3 * pq, n),
                rand(b, h, 3 * pq, n), rand(b, h, n, 3 * pv), rand(b, n, 3), rand(b, n, n, cz),
                rand(h, cz), rand(h), -rand(h).abs(), mask]
    grads = [True] * 6 + [False] + [True] * 4 + [False]  # not the centre, not the mask
    args = [t.clone().requires_grad_(r) for t, r in zip(operands, grads, strict=True)]
    options = ("ieee", 0.2, 0.577, 1e5)
    results = torch.library.opcheck(core_op.bias_core_op.op, (*args, *options))
    assert set(results.values()) == {"SUCCESS"}, results
    with torch.no_grad():
        saved = core_op.bias_core_op(*operands, *options)
    backward_args = (rand(*saved[0].shape), rand(*saved[1].shape), rand(*saved[2].shape),
                     *operands[:6], *operands[7:11], *saved, *options[:3])
    results = torch.library.opcheck(torch.ops.ipa_bench.openfold_bias_core_backward,
                                    backward_args)
    assert set(results.values()) == {"SUCCESS"}, results


@needs_interpreter
def test_triton_bias_reads_its_parameters_on_every_call():
    """An in-place parameter update (an optimizer step) reaches the next no-grad forward, which
    then agrees with the differentiable path and with the reference module."""
    sd = init_state_dict(SMALL, seed=7)
    fn = get_variant("triton-bias", "openfold").build(sd, SMALL, "cpu", "fp32")
    x = make_inputs(SMALL, 2, 11, seed=12, lengths=[11, 6])
    before = fn(*x.as_tuple())
    with torch.no_grad():
        for name, p in fn.module.named_parameters():
            if name in ("linear_q.weight", "linear_kv.bias", "linear_b.weight"):
                p.add_(0.3 * torch.randn_like(p))
    after = fn(*x.as_tuple())
    assert rel_l2(after, before) > 1e-3
    ref = fn.module(*x.as_tuple())
    present = x.mask != 0
    assert rel_l2(after[present], ref[present]) < 2e-5
    for p in fn.module.parameters():
        p.requires_grad_(True)
    differentiable = fn(*x.as_tuple())
    assert differentiable.requires_grad
    assert rel_l2(differentiable.detach(), after) < 1e-6


# ---- GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch, length", [(2, 97), (1, 1000)])
@pytest.mark.parametrize("name", NAMES)
def test_protocol_on_the_gpu(precision, batch, length, name):
    """The harness's protocol (5 seeds, padded batches, invariance) at the AF2 layer."""
    config = OpenFoldConfig()
    result = check_variant(get_variant(name, "openfold"), config, batch=batch, length=length,
                           device="cuda", precision=precision, seeds=3)
    assert result.passed, (result.failures, result.rel_l2, result.tol)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch, length", [(2, 97), (1, 1000)])
def test_triton_bias_training_protocol_on_the_gpu(precision, batch, length):
    """triton-bias's gradients at the AF2 layer against the float64 oracle (TF32 truncation of
    the 3xTF32 parts included, which the interpreter cannot show)."""
    result = check_variant(get_variant("triton-bias", "openfold"), OpenFoldConfig(),
                           batch=batch, length=length, device="cuda", precision=precision,
                           seeds=2, pass_name="forward+backward")
    assert result.passed, (result.failures, result.grad_worst, result.grad_rel_l2)


@pytest.mark.gpu
@needs_cuda
def test_extra_memory_is_linear_in_n():
    """No N x N tensor: at N = 1536 the (B, H, N, N) fp32 logits alone would be 108 MiB; the
    forward's extra peak over its inputs stays under 40 MiB."""
    extra = extra_peak_bytes("triton", 1536)
    assert extra < 40 * 2**20, extra / 2**20
