"""Correctness and invariance for every registered variant, generated from the registry.

A variant added to `variants.registry.BUILTIN` is checked here without edits: on CPU at
awkward sizes in fp32 and fp64, and (marker `gpu`) on CUDA up to N = 2048 in fp32 and bf16.
Cases a variant does not support are skipped with the variant's own reasons; cases it declares
wrong (`known_issues`, with evidence) still run and are expected to fail.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.correctness import ReferenceCache, check_variant
from variants.problem import IPAConfig
from variants.reference import init_state_dict
from variants.registry import all_variants

VARIANTS = all_variants()

# (batch, length, config): ragged lengths, one head, single points, non-default dims.
CPU_CASES = [
    (1, 1, IPAConfig(node_dim=64, pair_dim=16, heads=4, query_points=1, value_points=1)),
    (2, 7, IPAConfig()),
    # head_dim 96 (padded to 128 in the kernels) and 24 query-point coordinates
    (1, 33, IPAConfig(node_dim=96, pair_dim=8, heads=1, query_points=8, value_points=3)),
    (2, 97, IPAConfig(node_dim=96, pair_dim=32, heads=4, query_points=3, value_points=5)),
    (1, 97, IPAConfig(heads=12, query_points=4, value_points=8)),
]
GPU_CASES = [
    (1, 1, IPAConfig()),
    (2, 97, IPAConfig()),
    (1, 130, IPAConfig(heads=4, query_points=8, value_points=12)),
    (1, 1000, IPAConfig()),
    (1, 2048, IPAConfig()),
]


def case_id(case) -> str:
    b, n, c = case
    return f"B{b}-N{n}-H{c.heads}-Qp{c.query_points}-Vp{c.value_points}-D{c.node_dim}"


# One oracle per case, precision and seed, shared by every variant's test of that case.
_REFERENCES: dict[str, ReferenceCache] = {}


def expect_known_issues(request, name, case, device, precision):
    """The variant's own data: a cell it declares wrong (`Variant.known_issues`, with the
    evidence) is expected to fail. Not strict: an XPASS says the cell no longer fails."""
    batch, length, config = case
    known = VARIANTS[name].known_issues(config, batch, length, device, precision)
    if known:
        request.applymarker(pytest.mark.xfail(reason="; ".join(known)))


def run_check(name, case, device, precision, seeds, *, must_run=False):
    """check_variant for registered variant `name` on `case`, asserting it passes; a case the
    variant does not support is skipped with its reasons, or fails when `must_run`."""
    batch, length, config = case
    variant = VARIANTS[name]
    reasons = variant.not_supported_reasons(config, device, precision)
    assert not (must_run and reasons), reasons
    if reasons:
        pytest.skip("; ".join(reasons))
    references = _REFERENCES.setdefault(
        case_id(case), ReferenceCache(init_state_dict(config, seed=batch * 1000 + length)))
    result = check_variant(
        variant, config, batch=batch, length=length, device=device, precision=precision,
        seeds=seeds, state_dict=references.state_dict, references=references,
    )
    assert result.passed, (
        f"{name} {precision} {case_id(case)}: {result.failures} "
        f"(rel_l2 {result.rel_l2:.3e}, tol {result.tol:.3e}, err/ref {result.err_ratio:.2f})"
    )
    assert math.isfinite(result.invariance_err)
    return result


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
@pytest.mark.parametrize("case", CPU_CASES, ids=case_id)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_oracle_cpu(name, case, precision, request):
    expect_known_issues(request, name, case, "cpu", precision)
    run_check(name, case, "cpu", precision, seeds=3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_oracle_gpu(name, case, precision, request):
    expect_known_issues(request, name, case, "cuda", precision)
    run_check(name, case, "cuda", precision, seeds=3)

