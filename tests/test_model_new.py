"""`--model-new FILE`: KernelBench-style ModelNew files checked like any variant; a file that
does not import, compile, take the weights or run is a FAIL row with the message. With
`--problem openfold` the file follows SPEC-openfold's interchange (constructor, forward
order, OpenFold v2 or v1 parameter names) and is checked, diagnosed and swept."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from harness.cli import main as cli_main
from harness.correctness import check_variant
from harness.model_new import ModelNewError, model_new_variant
from variants.openfold.problem import OpenFoldConfig
from variants.openfold.problem import init_state_dict as of_init_state_dict
from variants.problem import IPAConfig, make_inputs
from variants.reference import init_state_dict

FILES = Path(__file__).parent / "model_new_files"
CPU_CHECK = ["check", "--device", "cpu", "--variant", "reference", "--dtype", "fp32",
             "--batch", "2", "--length", "33", "--seeds", "2"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Rich folds long cells at the terminal width; a wide one keeps messages on one line."""
    monkeypatch.setenv("COLUMNS", "2000")


def _check(path: Path, capsys) -> tuple[int, str]:
    code = cli_main([*CPU_CHECK, "--model-new", str(path)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out


def test_standalone_model_new_passes_check(capsys):
    code, out = _check(FILES / "ipa_standalone.py", capsys)
    assert code == 0, out
    row = next(line for line in out.splitlines() if "model-new:ipa_standalone.py" in line)
    assert "pass" in row


def test_wrong_state_dict_keys_are_listed(capsys):
    code, out = _check(FILES / "wrong_keys.py", capsys)
    assert code == 1
    assert "missing keys (in ModelNew, not in the reference): norm.bias, norm.weight, qkv.weight" \
        in out
    assert ("unexpected keys (in the reference, not in ModelNew): k_proj.weight, "
            "layer_norm.bias, layer_norm.weight, q_proj.weight, v_proj.weight") in out


def test_file_that_fails_to_import_is_a_fail_row(capsys):
    code, out = _check(FILES / "broken_import.py", capsys)
    assert code == 1
    row = next(line for line in out.splitlines() if "model-new:broken_import.py" in line)
    assert "FAIL: model-new:broken_import.py: import failed" in row
    assert "ModuleNotFoundError: No module named 'ipa_fused_extension_never_built'" in row
    # The reference beside it still ran.
    assert any("reference" in line and "pass" in line for line in out.splitlines())


def test_missing_file_is_a_usage_error(capsys):
    assert cli_main([*CPU_CHECK, "--model-new", str(FILES / "nope.py")]) == 2
    assert "--model-new: no such file" in capsys.readouterr().err


def test_forward_error_is_a_fail_row_with_the_message(tmp_path, capsys):
    path = tmp_path / "raises.py"
    path.write_text((FILES / "ipa_standalone.py").read_text().replace(
        "        B, N, _ = node_repr.shape\n",
        "        B, N, _ = node_repr.shape\n"
        "        raise ValueError('kernel supports N <= 16 only')\n"))
    code, out = _check(path, capsys)
    assert code == 1
    assert "model-new:raises.py: forward raised ValueError: kernel supports N <= 16 only" in out


@pytest.mark.slow
def test_compile_error_reaches_the_user_with_the_compiler_output(capsys):
    """load_inline at import time with C++ that does not compile (g++: ~10-30 s)."""
    code, out = _check(FILES / "compile_error.py", capsys)
    assert code == 1
    row = next(line for line in out.splitlines() if "model-new:compile_error.py" in line)
    assert "import failed" in row and "Error building extension" in row
    # The compiler's own words lead (rows elsewhere are cut short), the full log follows.
    assert "first errors: main.cpp:4:17: error: expected" in row
    assert "full message:" in out and "ninja: build stopped" in out


def test_variant_api(tmp_path):
    variant = model_new_variant(FILES / "ipa_standalone.py")
    assert variant.name == "model-new:ipa_standalone.py"
    assert variant.not_supported_reasons(IPAConfig(), "cpu", "fp32") == []
    config = IPAConfig(node_dim=32, pair_dim=8, heads=4, query_points=2, value_points=3)
    state_dict = init_state_dict(config)
    fn = variant.build(state_dict, config, "cpu", "fp64")
    assert fn.module.training is False
    assert fn.module.head_weights.dtype == torch.float64
    assert torch.equal(fn.module.head_weights, state_dict["head_weights"].double())
    out = fn(*make_inputs(config, 1, 5, dtype=torch.float64).as_tuple())
    assert out.shape == (1, 5, 32)
    result = check_variant(variant, config, batch=2, length=9, seeds=2, precision="fp64")
    assert result.passed, result.failures

    # Two variants of one file are separate modules; a failed import is not retried.
    assert model_new_variant(FILES / "ipa_standalone.py").load_module() is not \
        variant.load_module()
    broken = model_new_variant(FILES / "broken_import.py")
    with pytest.raises(ModelNewError) as first:
        broken.build(state_dict, config, "cpu", "fp32")
    with pytest.raises(ModelNewError) as second:
        broken.build(state_dict, config, "cpu", "fp32")
    assert first.value is second.value

    no_class = tmp_path / "no_class.py"
    no_class.write_text("X = 1\n")
    with pytest.raises(ModelNewError, match="defines no class ModelNew"):
        model_new_variant(no_class).build(state_dict, config, "cpu", "fp32")

    bad_ctor = tmp_path / "bad_ctor.py"
    bad_ctor.write_text("class ModelNew:\n    def __init__(self, node_dim):\n        pass\n")
    with pytest.raises(ModelNewError, match=r"ModelNew\(32, 8, 4, 2, 3\) raised TypeError"):
        model_new_variant(bad_ctor).build(state_dict, config, "cpu", "fp32")


def test_wrong_shapes_are_a_model_new_error(tmp_path):
    path = tmp_path / "wrong_shape.py"
    path.write_text((FILES / "ipa_standalone.py").read_text().replace(
        "self.pair_bias = nn.Linear(pair_dim, num_heads, bias=False)",
        "self.pair_bias = nn.Linear(pair_dim + 1, num_heads, bias=False)"))
    config = IPAConfig(node_dim=32, pair_dim=8, heads=4, query_points=2, value_points=3)
    message = r"(?s)loading the weights failed.*size mismatch for pair_bias.weight"
    with pytest.raises(ModelNewError, match=message):
        model_new_variant(path).build(init_state_dict(config), config, "cpu", "fp32")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_load_inline_model_new_passes_check_and_diagnose(capsys):
    """A ModelNew whose inverse frame is a CUDA kernel compiled by load_inline at import."""
    path = FILES / "cuda_inverse_frame.py"
    code = cli_main(["check", "--device", "cuda", "--variant", "reference", "--model-new",
                     str(path), "--dtype", "fp32", "--dtype", "bf16", "--batch", "2",
                     "--length", "97"])
    out = capsys.readouterr().out
    print(out)  # the row goes into the GPU log
    assert code == 0, out
    rows = [line for line in out.splitlines() if "model-new:cuda_inverse_frame.py" in line]
    assert len(rows) == 2 and all("pass" in row for row in rows), out
    code = cli_main(["diagnose", "--model-new", str(path), "--device", "cuda"])
    out = capsys.readouterr().out
    print(out)
    assert code == 0, out


# ---- problem `openfold`: the SPEC-openfold interchange -----------------------------------------

OPENFOLD = ["--problem", "openfold", "--node-dim", "11", "--pair-dim", "7", "--heads", "3",
            "--head-dim", "5", "--query-points", "2", "--value-points", "3"]
OPENFOLD_CHECK = ["check", "--device", "cpu", "--variant", "reference", "--dtype", "fp32",
                  "--batch", "2", "--length", "13", "--seeds", "2", *OPENFOLD]
OF_CFG = OpenFoldConfig(c_s=11, c_z=7, c_hidden=5, no_heads=3, no_qk_points=2, no_v_points=3)


def _openfold_check(path: Path, capsys) -> tuple[int, str]:
    code = cli_main([*OPENFOLD_CHECK, "--model-new", str(path)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out


def _row(out: str, path: Path) -> str:
    return next(line for line in out.splitlines() if f"model-new:{path.name}" in line)


@pytest.mark.parametrize("name", ["openfold_standalone.py", "openfold_reference_wrapper.py"])
def test_openfold_model_new_passes_check(name, capsys):
    code, out = _openfold_check(FILES / name, capsys)
    assert code == 0, out
    assert _row(out, FILES / name).rstrip(" │").endswith("pass")


def test_openfold_model_new_with_the_reshape_trap_fails_check(capsys):
    path = FILES / "openfold_o_pt_interleaved.py"
    code, out = _openfold_check(path, capsys)
    assert code == 1
    assert "FAIL: " in _row(out, path) and "masked rows: rel_l2" in out


def _v1_file(tmp_path: Path, replace_all: bool = True) -> Path:
    """The standalone file with OpenFold v1's point projections (plain Linear layers)."""
    source = (FILES / "openfold_standalone.py").read_text()
    old = "self.linear_q_points = PointLinear("
    v1 = (source.replace("PointLinear(c_s", "nn.Linear(c_s") if replace_all
          else source.replace(old, "self.linear_q_points = nn.Linear("))
    assert v1 != source
    path = tmp_path / ("openfold_v1.py" if replace_all else "openfold_mixed.py")
    path.write_text(v1)
    return path


def test_openfold_model_new_with_v1_names_gets_the_weights_renamed(tmp_path, capsys):
    path = _v1_file(tmp_path)
    code, out = _openfold_check(path, capsys)
    assert code == 0, out
    variant = model_new_variant(path)
    state_dict = of_init_state_dict(OF_CFG)
    fn = variant.build(state_dict, OF_CFG, "cpu", "fp32")
    assert "linear_q_points.weight" in fn.module.state_dict()
    assert torch.equal(fn.module.linear_q_points.weight,
                       state_dict["linear_q_points.linear.weight"])
    # gradients are reported under the harness's (v2) names
    assert sorted(name for name, _ in fn.parameters()) == sorted(state_dict)


def test_openfold_model_new_with_mixed_names_is_told_which(tmp_path, capsys):
    path = _v1_file(tmp_path, replace_all=False)
    code, out = _openfold_check(path, capsys)
    assert code == 1
    row = " ".join(out.split())
    assert ("state_dict keys differ from the reference's (SPEC-openfold 'Constructor and "
            "parameters'): missing keys (in ModelNew, not in the reference): "
            "linear_q_points.bias, linear_q_points.weight;") in row
    assert ("(linear_q_points.bias, linear_q_points.weight: OpenFold v1 names; ModelNew takes "
            "the reference's names or all of OpenFold v1's, not a mix)") in row


def test_a_simplified_model_new_under_openfold_names_the_constructor(capsys):
    code, out = _openfold_check(FILES / "ipa_standalone.py", capsys)
    assert code == 1
    assert "ModelNew(11, 7, 5, 3, 2, 3) raised TypeError" in out


def test_openfold_model_new_reasons():
    variant = model_new_variant(FILES / "openfold_standalone.py")
    assert "openfold" in variant.problems and "simplified" in variant.problems
    assert variant.not_supported_reasons(OF_CFG, "cpu", "fp32") == []
    low_inf = OpenFoldConfig(*OF_CFG.module_args(), inf=1e4)
    (reason,) = variant.not_supported_reasons(low_inf, "cpu", "fp32")
    assert reason.startswith("ModelNew(11, 7, 5, 3, 2, 3) builds") and "sizes only" in reason
    assert any("overflows" in r for r in variant.not_supported_reasons(OF_CFG, "cpu", "fp16"))


def test_openfold_model_new_diagnose(capsys):
    sizes = ["--batch", "2", "--length", "21", "--aligned-length", "32", "--seeds", "1",
             "--device", "cpu", *OPENFOLD]
    assert cli_main(["diagnose", "--model-new", str(FILES / "openfold_standalone.py"),
                     *sizes]) == 0
    assert "no mismatch" in capsys.readouterr().out
    assert cli_main(["diagnose", "--model-new", str(FILES / "openfold_o_pt_interleaved.py"),
                     *sizes]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "suspect: error needs value points, stays with identity frames and a single key, " \
        "and vanishes when every point is (u, u, u): o_pt's X | Y | Z split (SPEC step 10)" in out


TINY_OPENFOLD_GRID = """
[base]
problem = "openfold"
batch = 2
node_dim = 11
pair_dim = 7
heads = 3
head_dim = 5
query_points = 2
value_points = 3
dtypes = ["fp32"]
modes = ["eager"]
seeds = 1
budget_s = 0.02

[[slice]]
length = [9]
"""


def test_openfold_model_new_sweep(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_OPENFOLD_GRID)
    code = cli_main(["sweep", "--problem", "openfold", "--grid", str(grid), "--device", "cpu",
                     "--model-new", str(FILES / "openfold_standalone.py"),
                     "--model-new", str(FILES / "openfold_o_pt_interleaved.py"),
                     "-o", str(tmp_path / "out"), "--no-plots", "--no-progress"])
    capsys.readouterr()
    assert code == 1  # the planted bug's mismatch
    with open(tmp_path / "out" / "results.csv") as f:
        rows = {row["variant"]: row for row in csv.DictReader(f)}
    assert {name: row["status"] for name, row in rows.items()} == {
        "reference": "ok", "model-new:openfold_standalone.py": "ok",
        "model-new:openfold_o_pt_interleaved.py": "mismatch"}
    assert {row["problem"] for row in rows.values()} == {"openfold"}
