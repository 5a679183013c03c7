"""`triton-pairdot`: problem openfold's fused kernel without pair values, serving the
simplified problem (issue #17). The registry's generated tests check its default interpreted
config; these check every constexpr path its GPU configs select, and what its rows say."""

from __future__ import annotations

import pytest

from harness.correctness import check_variant
from tests.test_openfold_triton import needs_interpreter
from variants.problem import IPAConfig
from variants.registry import get_variant

SMALL = dict(node_dim=24, pair_dim=8, heads=3, query_points=3, value_points=5)


@needs_interpreter
@pytest.mark.parametrize("meta", [
    {"TC": 1, "BT": False, "LAZY": False},
    {"TC": 0, "BT": False, "LAZY": False, "BLOCK_M": 8},
    {"TC": 0, "BT": True, "LAZY": False, "ZCH": 1, "SPLIT": False}],
    ids=["tc1", "fma-bm8", "bt-zch1-tf32x3"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_code_path_its_configs_select(precision, meta, monkeypatch):
    # The interpreter runs one config: the GPU configs' other constexpr paths are patched in.
    from variants.openfold import triton_kernel as tk

    for tuned in (tk._bias_kernel_fp32, tk._bias_kernel_16bit):
        monkeypatch.setattr(tuned, "meta", {**tuned.meta, **meta})
    result = check_variant(get_variant("triton-pairdot"), IPAConfig(heads=6, query_points=3,
                                                                      value_points=6),
                           batch=2, length=21, precision=precision, seeds=2)
    assert result.passed, result.failures


def test_rows_name_a_split_precision_scheme_in_math_mode(tmp_path):
    # The fused kernels' fp32 rows run their z dots as 3xTF32: the row says so, and the fp32
    # tolerance still judges it (issue #17). The reference's rows keep the precision's mode.
    import csv

    from harness.grid import grid_from_dict
    from harness.sweep import Sweep

    pairdot = get_variant("triton-pairdot")
    reasons = pairdot.not_supported_reasons(IPAConfig(**SMALL), "cpu", "fp32")
    if reasons:
        pytest.skip("; ".join(reasons))
    grid = grid_from_dict({"base": {**SMALL, "dtypes": ["fp32"], "modes": ["eager"],
                                    "seeds": 1, "budget_s": 0.02},
                           "slice": [{"length": [9]}]})
    path = Sweep([get_variant("reference"), pairdot], grid, "cpu", tmp_path,
                 show_progress=False).run()
    with path.open(newline="") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert rows["reference"]["math_mode"] == "ieee"
    assert rows["triton-pairdot"]["math_mode"] == "fp32-3xtf32"
    # (under the interpreter: checked, not timed)
    assert rows["triton-pairdot"]["status"] == "interpreted", rows["triton-pairdot"]["reason"]
    assert float(rows["triton-pairdot"]["tol"]) == float(rows["reference"]["tol"])
