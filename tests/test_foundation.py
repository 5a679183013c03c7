"""The problem definition, input checks, registry, reference and the correctness protocol."""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F

from harness.cli import build_parser
from harness.cli import main as cli_main
from harness.correctness import check_variant
from harness.grid import grid_from_dict
from harness.problems import PROBLEMS
from harness.results import read_results
from harness.runner import rigid_motion
from harness.sweep import Sweep
from tests.planted import InverseFrameBug
from variants.problem import (
    CA_STEP_ANGSTROM,
    IPAConfig,
    IPAInputError,
    get_precision,
    make_inputs,
    math_mode,
    validate_inputs,
)
from variants.reference import IPAReference, init_state_dict, make_module
from variants.registry import ENTRY_POINT_GROUP, all_variants, baseline, get_variant

SMALL = IPAConfig(node_dim=16, pair_dim=8, heads=2, query_points=3, value_points=2)


# ---- configuration -------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"heads": 5}, "heads: expected a divisor of node_dim=384, got 5"),
        ({"node_dim": 0}, "node_dim: expected a positive integer, got 0"),
        ({"query_points": -1}, "query_points: expected a positive integer, got -1"),
        ({"pair_dim": 2.5}, "pair_dim: expected a positive integer, got 2.5"),
    ],
)
def test_config_rejects_bad_sizes(kwargs, fragment):
    with pytest.raises(IPAInputError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        IPAConfig(**kwargs)


def test_config_defaults_are_alphafold2_sizes():
    c = IPAConfig()
    assert (c.node_dim, c.pair_dim, c.heads, c.query_points, c.value_points) == (384, 128, 12, 4, 8)
    assert c.head_dim == 32


def test_unknown_precision_lists_known_ones():
    with pytest.raises(IPAInputError, match="dtype: expected one of .*'bf16'.*got 'fp8'"):
        get_precision("fp8")


def test_math_mode_restores_tf32_switch():
    before = torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(RuntimeError), math_mode("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32
        raise RuntimeError("boom")
    assert torch.backends.cuda.matmul.allow_tf32 == before


# ---- inputs --------------------------------------------------------------------------------

def test_inputs_follow_spec():
    inputs = make_inputs(SMALL, 2, 50, dtype=torch.float64, seed=3, origin_offset=100.0)
    r = inputs.rotations
    eye = torch.eye(3, dtype=torch.float64)
    assert (r @ r.transpose(-1, -2) - eye).abs().max() < 1e-12
    assert torch.allclose(torch.linalg.det(r), torch.ones(2, 50, dtype=torch.float64))
    assert not torch.allclose(r, eye.expand_as(r))
    steps = inputs.translations.diff(dim=1).norm(dim=-1)
    assert torch.allclose(steps, torch.full_like(steps, CA_STEP_ANGSTROM))
    centre = inputs.translations.mean(dim=1).norm(dim=-1)
    assert torch.allclose(centre, torch.full_like(centre, 100.0))
    assert inputs.node_repr.std().item() == pytest.approx(1.0, abs=0.1)


def test_inputs_are_seeded_and_fresh_per_seed():
    a = make_inputs(SMALL, 1, 9, seed=1)
    b = make_inputs(SMALL, 1, 9, seed=1)
    c = make_inputs(SMALL, 1, 9, seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.as_tuple(), b.as_tuple(), strict=True))
    assert not torch.equal(a.pair_repr, c.pair_repr)


def test_inputs_in_low_precision_are_quantised_copies():
    fp32 = make_inputs(SMALL, 1, 5, dtype=torch.float32, seed=4)
    bf16 = make_inputs(SMALL, 1, 5, dtype=torch.bfloat16, seed=4)
    assert bf16.node_repr.dtype == torch.bfloat16
    for low, high in zip(bf16.as_tuple(), fp32.as_tuple(), strict=True):
        assert torch.equal(low, high.to(torch.bfloat16))


def _valid(b=2, n=5, config=SMALL):
    return make_inputs(config, b, n, seed=0).as_tuple()


@pytest.mark.parametrize(
    "argument, tamper, fragment",
    [
        ("node_repr", lambda t: t[..., :-1], r"node_repr: expected shape \(2, 5, 16\)"),
        ("pair_repr", lambda t: t[:, :, :4], r"pair_repr: expected shape \(2, 5, 5, 8\)"),
        ("pair_repr", lambda t: t[:1], r"pair_repr: expected shape \(2, 5, 5, 8\).*got \(1,"),
        ("translations", lambda t: t[:, :4], r"translations: expected shape \(2, 5, 3\)"),
        ("rotations", lambda t: t[..., :2], r"rotations: expected shape \(2, 5, 3, 3\)"),
        ("translations", lambda t: t.double(), "translations: expected dtype torch.float32"),
        ("rotations", lambda t: t * 1.1, "rotations: expected orthonormal"),
        ("rotations", lambda t: -t, r"rotations: expected proper rotations \(det \+1\)"),
        ("rotations", lambda t: torch.full_like(t, math.nan),
         "rotations: expected finite values, got 90 NaN/Inf of 90"),
        ("pair_repr", lambda t: t.index_fill(1, torch.tensor([2]), math.inf),
         "pair_repr: expected finite values, got 80 NaN/Inf"),
        ("node_repr", lambda t: t[0], "node_repr: expected 3 dims"),
        ("pair_repr", lambda t: t.numpy(), "pair_repr: expected a torch.Tensor, got ndarray"),
    ],
)
def test_validation_names_argument_expected_and_actual(argument, tamper, fragment):
    names = ("node_repr", "pair_repr", "translations", "rotations")
    args = dict(zip(names, _valid(), strict=True))
    args[argument] = tamper(args[argument])
    with pytest.raises(IPAInputError, match=fragment):
        validate_inputs(SMALL, **args)


def test_validation_checks_device_dtype_and_contiguity():
    args = _valid()
    with pytest.raises(IPAInputError, match="node_repr: expected device cuda, got cpu"):
        validate_inputs(SMALL, *args, device="cuda")
    with pytest.raises(IPAInputError, match=r"node_repr: expected dtype in \[torch.bfloat16\]"):
        validate_inputs(SMALL, *args, dtypes=(torch.bfloat16,))
    node, pair, trans, rot = args
    pair_t = pair.transpose(1, 2)
    validate_inputs(SMALL, node, pair_t, trans, rot)  # fine unless contiguity is required
    with pytest.raises(IPAInputError, match="pair_repr: expected a contiguous tensor"):
        validate_inputs(SMALL, node, pair_t, trans, rot, require_contiguous=True)


def test_validation_accepts_bf16_rotations():
    inputs = make_inputs(IPAConfig(), 1, 64, dtype=torch.bfloat16, seed=0)
    validate_inputs(IPAConfig(), *inputs.as_tuple())


# ---- reference -----------------------------------------------------------------------------

def _loop_ipa(sd, config, node, pair, trans, rot):
    """IPA written with explicit loops and no einsum, straight from SPEC's formulas."""
    H, d, Qp, Vp = config.heads, config.head_dim, config.query_points, config.value_points
    B, N, _ = node.shape
    x = F.layer_norm(node, (config.node_dim,), sd["layer_norm.weight"], sd["layer_norm.bias"])

    def lin(name, v):
        return v @ sd[name + ".weight"].T

    out = torch.zeros(B, N, config.node_dim, dtype=torch.float64)
    for b in range(B):
        def to_global(name, i, P, b=b):
            local = lin(name, x[b, i]).view(H, P, 3)
            return local @ rot[b, i] + trans[b, i]

        q = [lin("q_proj", x[b, i]).view(H, d) for i in range(N)]
        k = [lin("k_proj", x[b, i]).view(H, d) for i in range(N)]
        v = [lin("v_proj", x[b, i]).view(H, d) for i in range(N)]
        qp = [to_global("q_pts", i, Qp) for i in range(N)]
        kp = [to_global("k_pts", i, Qp) for i in range(N)]
        vp = [to_global("v_pts", i, Vp) for i in range(N)]
        for i in range(N):
            scalar_out, point_out = [], []
            for h in range(H):
                w = math.log1p(math.exp(sd["head_weights"][h].item()))
                logits = torch.zeros(N, dtype=torch.float64)
                for j in range(N):
                    dist = ((qp[i][h] - kp[j][h]) ** 2).sum()
                    bias = (pair[b, i, j] * sd["pair_bias.weight"][h]).sum()
                    logits[j] = (q[i][h] * k[j][h]).sum() / math.sqrt(d) - w / 2 * dist + bias
                a = torch.exp(logits - logits.max())
                a = a / a.sum()
                scalar_out.append(sum(a[j] * v[j][h] for j in range(N)))
                g = sum(a[j] * vp[j][h] for j in range(N))
                point_out.append((g - trans[b, i]) @ rot[b, i].T)
            feats = torch.cat([torch.cat(scalar_out), torch.cat(point_out).reshape(-1)])
            out[b, i] = feats @ sd["out_proj.weight"].T + sd["out_proj.bias"]
    return out


def test_reference_matches_independent_loop_computation():
    config = IPAConfig(node_dim=12, pair_dim=5, heads=3, query_points=2, value_points=3)
    sd = {k: v.double() for k, v in init_state_dict(config, seed=7).items()}
    inputs = make_inputs(config, 2, 3, dtype=torch.float64, seed=11, origin_offset=20.0)
    expected = _loop_ipa(sd, config, *inputs.as_tuple())
    got = make_module(sd, config, "cpu", torch.float64)(*inputs.as_tuple())
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_reference_state_dict_keys_are_the_spec_interchange_format():
    keys = set(IPAReference(*SMALL.module_args()).state_dict())
    assert keys == {
        "layer_norm.weight", "layer_norm.bias", "q_proj.weight", "k_proj.weight",
        "v_proj.weight", "q_pts.weight", "k_pts.weight", "v_pts.weight", "pair_bias.weight",
        "head_weights", "out_proj.weight", "out_proj.bias",
    }


def test_weights_have_random_head_weights():
    sd = init_state_dict(IPAConfig(), seed=0)
    assert sd["head_weights"].std() > 0.1
    assert torch.equal(sd["q_proj.weight"], init_state_dict(IPAConfig(), seed=0)["q_proj.weight"])


def test_rigid_motion_leaves_fp64_reference_unchanged():
    inputs = make_inputs(SMALL, 2, 6, dtype=torch.float64, seed=0)
    module = make_module(init_state_dict(SMALL), SMALL, "cpu", torch.float64)
    moved = rigid_motion(inputs, seed=0)
    assert not torch.allclose(moved.translations, inputs.translations)
    torch.testing.assert_close(module(*moved.as_tuple()), module(*inputs.as_tuple()))


# ---- registry ------------------------------------------------------------------------------

def test_registry_has_one_baseline_named_reference():
    assert baseline().name == "reference"
    assert {"reference", "torch-compile"} <= set(all_variants())


def test_unknown_variant_lists_known_ones():
    with pytest.raises(IPAInputError,
                       match="unknown name 'nope' for problem 'simplified'; known variants: "
                             "reference, "):
        get_variant("nope")


def test_not_supported_reasons_are_explained():
    reasons = get_variant("reference").not_supported_reasons(IPAConfig(), "cpu", "tf32")
    assert reasons == ["tf32 is a CUDA math mode"]
    if not torch.cuda.is_available():
        for name in ("cuda-hybrid", "cuda-fused"):
            reasons = get_variant(name).not_supported_reasons(IPAConfig(), "cuda", "fp32")
            assert reasons and all(isinstance(r, str) and r for r in reasons)


PLUGIN = """
import torch
from variants.reference import Reference

torch.ipa_bench_plugin_imported = True  # import-time code, as a hostile plugin's could be


class Plugged(Reference):
    name = "plugged-reference"
    description = "the reference, installed by another package"
    is_baseline = False
    precisions = ("fp32",)
"""


def _install_plugin(tmp_path, monkeypatch, target: str, module_text: str = PLUGIN) -> None:
    dist = tmp_path / "ipa_bench_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ipa-bench-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nplugged = {target}\n")
    (tmp_path / "ipa_bench_plugin_mod.py").write_text(module_text)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_third_party_variant_plugs_in_through_entry_point(tmp_path, monkeypatch):
    # Listed by its declared metadata, never imported into this process; built and run in a
    # worker process (a sweep), where its import-time code cannot reach the oracle.
    _install_plugin(tmp_path, monkeypatch, "ipa_bench_plugin_mod:Plugged")
    variant = get_variant("plugged-reference")
    assert list(all_variants())[-1] == "plugged-reference"
    assert "ipa_bench_plugin_mod" not in sys.modules
    assert not hasattr(torch, "ipa_bench_plugin_imported")
    assert variant.description == "the reference, installed by another package"
    assert variant.not_supported_reasons(IPAConfig(), "cpu", "bf16") == [
        "precision 'bf16' not supported (supports ['fp32'])"]
    assert variant.code_digest()  # from its declared files, read, not imported
    grid = grid_from_dict({"base": {"node_dim": 24, "pair_dim": 8, "heads": 3,
                                    "query_points": 3, "value_points": 5, "dtypes": ["fp32"],
                                    "modes": ["eager"], "seeds": 1, "budget_s": 0.05},
                           "slice": [{"length": [7]}]})
    path = Sweep([variant], grid, "cpu", tmp_path / "out", show_progress=False).run()
    (row,) = read_results(path).to_dict("records")
    assert (row["variant"], row["status"]) == ("plugged-reference", "ok")
    assert "ipa_bench_plugin_mod" not in sys.modules
    assert type(variant.real()).__name__ == "Plugged"  # what a worker builds


def test_an_entry_point_that_is_not_a_variant_is_named(tmp_path, monkeypatch):
    _install_plugin(tmp_path, monkeypatch, "ipa_bench_plugin_mod:NOT_A_CLASS",
                    "NOT_A_CLASS = 3\n")
    with pytest.raises(TypeError, match="entry point 'plugged'.*expected a Variant subclass"):
        all_variants()


# ---- correctness protocol ------------------------------------------------------------------

def test_planted_inverse_frame_bug_is_caught_with_its_error_figure():
    result = check_variant(InverseFrameBug(), IPAConfig(), batch=2, length=33, seeds=2)
    assert not result.passed
    assert result.rel_l2 > 100 * result.tol
    assert result.err_ratio > 100
    assert any("rel_l2" in f for f in result.failures)
    assert any("invariance" in f for f in result.failures)


@pytest.mark.parametrize("name", ["reference", "torch-compile"])
def test_reference_and_compile_check_their_inputs_before_running(name):
    fn = get_variant(name).build(init_state_dict(SMALL), SMALL, "cpu", "fp32")
    node, pair, trans, rot = _valid()
    with pytest.raises(IPAInputError, match=r"pair_repr: expected shape \(2, 5, 5, 8\)"):
        fn(node, pair[:, :4], trans, rot)
    with pytest.raises(IPAInputError, match="translations: expected dtype torch.float32"):
        fn(node, pair, trans.double(), rot)


@pytest.mark.parametrize("wrap", [lambda out: (out,), lambda out: None], ids=["tuple", "None"])
def test_output_that_is_not_a_tensor_fails(wrap):
    class NotATensor(InverseFrameBug):
        name = "not-a-tensor"

        def build(self, *args):
            fn = get_variant("reference").build(*args)
            return lambda *inputs: wrap(fn(*inputs))

    result = check_variant(NotATensor(), SMALL, batch=1, length=4, seeds=1)
    assert not result.passed and math.isinf(result.rel_l2)
    kind = "tuple" if wrap(0) is not None else "NoneType"
    assert any(f"output is a {kind}, expected a torch.Tensor" in f for f in result.failures)


def test_a_reused_output_buffer_cannot_hide_an_invariance_failure():
    """A kernel that writes every result into one cached tensor returns the same object for
    the unmoved and the moved inputs; the check must compare two values, not one buffer."""

    class ReusesOutput(InverseFrameBug):  # not SE(3)-invariant (R where R^T belongs)
        name = "reuses-output"

        def build(self, *args):
            fn = super().build(*args)
            cache = {}

            def forward(*inputs):
                out = fn(*inputs)
                buffer = cache.setdefault("out", torch.empty_like(out))
                return buffer.copy_(out)

            return forward

    result = check_variant(ReusesOutput(), SMALL, batch=1, length=6, seeds=1)
    assert result.invariance_err > result.invariance_tol
    assert any("invariance" in f for f in result.failures)


def test_nan_output_fails():
    class NaNVariant(InverseFrameBug):
        name = "nan"

        def build(self, *args):
            fn = get_variant("reference").build(*args)
            return lambda *inputs: fn(*inputs) * math.nan

    result = check_variant(NaNVariant(), SMALL, batch=1, length=4, seeds=1)
    assert not result.passed and math.isinf(result.rel_l2)
    assert any("NaN/Inf" in f for f in result.failures)


@pytest.mark.parametrize("pass_name", ["forward", "forward+backward"])
def test_variant_modifying_its_inputs_fails(pass_name):
    class Mutating(InverseFrameBug):
        name = "mutating"
        supports_backward = True

        def build(self, *args):
            fn = get_variant("reference").build(*args)

            def mutate(node, pair, trans, rot):
                out = fn(node, pair, trans, rot)
                node.data.mul_(2)  # .data: unseen by autograd in a training step too
                return out

            return mutate

    result = check_variant(Mutating(), SMALL, batch=1, length=4, seeds=1, pass_name=pass_name)
    assert any("modified its input node_repr" in f for f in result.failures)


def test_wrong_output_dtype_fails():
    class Upcasting(InverseFrameBug):
        name = "upcasting"

        def build(self, *args):
            fn = get_variant("reference").build(*args)
            return lambda *inputs: fn(*inputs).double()

    result = check_variant(Upcasting(), SMALL, batch=1, length=4, seeds=1)
    assert any("output dtype torch.float64 != torch.float32" in f for f in result.failures)


def test_bf16_tolerance_comes_from_reference_error():
    result = check_variant(get_variant("reference"), SMALL, batch=1, length=16,
                           precision="bf16", seeds=2)
    assert result.passed
    assert result.tol == pytest.approx(max(2 * result.reference_rel_l2, 5e-2))
    assert result.err_ratio == pytest.approx(1.0)


# ---- CLI -----------------------------------------------------------------------------------

def test_cli_list_shows_baseline_and_reasons(capsys):
    assert cli_main(["list", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "torch-compile" in out and "no:" in out


def test_cli_check_passes_reference_and_exits_nonzero_on_unknown(capsys):
    code = cli_main(["check", "--device", "cpu", "--variant", "reference", "--length", "9",
                     "--seeds", "2", "--node-dim", "32", "--heads", "4"])
    out = capsys.readouterr().out
    assert code == 0 and "pass" in out and "rel_l2" in out
    assert cli_main(["check", "--variant", "nope"]) == 2
    assert "known variants" in capsys.readouterr().err


def test_cli_check_bad_config_is_a_clear_error(capsys):
    assert cli_main(["check", "--variant", "reference", "--heads", "5"]) == 2
    assert "heads: expected a divisor of node_dim=384, got 5" in capsys.readouterr().err


def test_cli_requested_unsupported_variant_is_not_a_pass(capsys):
    assert cli_main(["check", "--device", "cpu", "--variant", "reference", "--dtype", "tf32",
                     "--length", "4", "--seeds", "1"]) == 1
    assert "tf32 is a CUDA math mode" in capsys.readouterr().out


def _commands():
    (subparsers,) = [a for a in build_parser()._actions if a.choices and a.dest == "command"]
    return list(subparsers.choices)


@pytest.mark.parametrize("command", _commands())
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: ipa-bench " + command in capsys.readouterr().out


def test_chunked_reference_equals_whole_forward(monkeypatch):
    import harness.correctness as correctness

    config = IPAConfig(node_dim=32, pair_dim=8, heads=4, query_points=2, value_points=3)
    module = make_module(init_state_dict(config), config, "cpu", torch.float64)
    inputs = make_inputs(config, 2, 11, dtype=torch.float64, seed=5)
    whole = module(*inputs.as_tuple())
    monkeypatch.setattr(correctness, "CHUNK_ELEMENTS", 2 * 11 * 4 * 2 * 3 * 3)  # 3 rows
    assert correctness.rows_per_chunk(config, 2, 11) == 3
    torch.testing.assert_close(correctness.chunked_forward(module, inputs), whole)


def test_gradient_chunks_hold_the_oracle_step_to_a_quarter_of_the_forward_chunk():
    """The float64 oracle's training step at the default config, fp32 N = 4096, ran an 80 GB
    H100 out of memory with the forward's chunk (2026-12-06: 64.7 GiB allocated); a gradient
    chunk's point difference is at most 2 GiB in float64, and the forward's is unchanged."""
    import harness.correctness as correctness

    config = IPAConfig()
    forward = correctness.rows_per_chunk(config, 1, 4096)
    training = correctness.rows_per_chunk(config, 1, 4096, training=True)
    point_difference_bytes = training * 4096 * config.heads * config.query_points * 3 * 8
    assert forward == 1820 and training == 455 and point_difference_bytes <= 2 << 30
    assert correctness.rows_per_chunk(config, 1, 256, training=True) == 256  # one pass


def test_chunked_reference_gradients_equal_whole(monkeypatch):
    """The oracle's gradients summed over chunks of query rows (in place) are the whole
    step's, and the inputs and grad_out are left as they were."""
    import harness.correctness as correctness

    config = IPAConfig(node_dim=32, pair_dim=8, heads=4, query_points=2, value_points=3)
    module = make_module(init_state_dict(config), config, "cpu", torch.float64)
    inputs = make_inputs(config, 2, 11, dtype=torch.float64, seed=5)
    pristine = [t.clone() for t in inputs.as_tuple()]
    grad_out = torch.randn(2, 11, module(*inputs.as_tuple()).shape[-1], dtype=torch.float64,
                           generator=torch.Generator().manual_seed(3))
    grad_copy = grad_out.clone()
    names = PROBLEMS["simplified"].grad_inputs
    whole = correctness.reference_gradients(module, config, inputs, grad_out, names)
    monkeypatch.setattr(correctness, "CHUNK_ELEMENTS", 2 * 11 * 4 * 2 * 3 * 3)  # 3 rows
    chunked = correctness.reference_gradients(module, config, inputs, grad_out, names)
    assert whole.keys() == chunked.keys() and "pair_repr" in whole
    for name in whole:
        torch.testing.assert_close(chunked[name], whole[name], msg=name)
    for before, after in zip(pristine, inputs.as_tuple(), strict=True):
        assert torch.equal(before, after)
    assert torch.equal(grad_out, grad_copy)


@pytest.mark.parametrize("problem_name", ["simplified", "openfold"])
def test_chunked_gradients_take_the_pair_input_a_chunk_of_rows_at_a_time(monkeypatch,
                                                                         problem_name):
    """Chunked, the module gets the pair input's rows alone (its gradient rows-sized: a
    whole-input leaf gave each chunk an N x N x C gradient, 16 GiB in float64 at N = 4096),
    and the gradients still equal the unchunked step's, in both problems."""
    import harness.correctness as correctness

    problem = PROBLEMS[problem_name]
    config = problem.config_class()
    module = problem.make_module(problem.init_state_dict(config), config, "cpu", torch.float64)
    inputs = problem.make_inputs(config, 2, 7, dtype=torch.float64, device="cpu", seed=4)
    grad_out = torch.randn(2, 7, config.columns()["node_dim"], dtype=torch.float64,
                           generator=torch.Generator().manual_seed(1))
    whole = correctness.reference_gradients(module, config, inputs, grad_out,
                                            problem.grad_inputs)
    pair_rows = []
    forward = module.forward

    def spy(*args, query_rows=None):
        pair_rows.append(args[1].shape[1])
        return forward(*args, query_rows=query_rows)

    monkeypatch.setattr(module, "forward", spy)
    monkeypatch.setattr(correctness, "CHUNK_ELEMENTS", 1)  # one row a chunk
    chunked = correctness.reference_gradients(module, config, inputs, grad_out,
                                              problem.grad_inputs)
    assert pair_rows == [1] * 7
    assert list(chunked) == list(whole)
    for name in whole:
        torch.testing.assert_close(chunked[name], whole[name], msg=name)
