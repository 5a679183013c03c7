"""pytest-benchmark suite: every registered variant over a small grid, generated from the registry.

    pytest benchmarks --benchmark-only --benchmark-json out.json
    pytest benchmarks --benchmark-only --problem openfold   # the OpenFold layer's variants

Cases (one device and one problem per run, `--ipa-device`, default cuda if present, and
`--problem`, default simplified): on CPU a single tiny shape in fp32 (torch.compile recompiles
per shape, ~25 s each on a small machine; openfold: B = 2, a padded batch); on CUDA N = 256
and 1024 at the problem's default config (AlphaFold2's) in fp32 and bf16. Each case is a
pytest-benchmark group, so the default `--benchmark-group-by=group` table puts the variants of
one config side by side. A variant that cannot run a case is skipped with its own
`not_supported_reasons`; Triton variants are skipped on CPU, where they run under the
interpreter and a timing means nothing (tests/test_variants.py checks them there).

Before timing, each case runs the correctness protocol (one seed, `harness.correctness`):
the first call (compilation, autotuning) happens there, untimed, and the figures go into
`extra_info` with the config, dtype and (CUDA) peak memory, under the names of the sweep's
CSV columns (`harness.results.COLUMNS`). A variant outside its tolerance
is still timed, then the test fails (an expected failure where the variant declares the cell
in `known_issues`). `ipa-bench sweep` is the publishing path; this suite
is for quick side-by-side tables and `--benchmark-compare` between commits.

`test_training_step` times the same cases as a training step (forward plus the gradients of
every input and parameter, `harness.runner.training_step`), with the gradient figures in
`extra_info`; variants without a backward are skipped with `forward only`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

from harness.correctness import check_variant, pass_reasons
from harness.environment import device_name
from harness.grid import make_config
from harness.measure import peak_memory_mib
from harness.problems import problem_of
from harness.results import COLUMNS
from harness.runner import (
    InputRecipe,
    input_names,
    leaf_inputs,
    trainable_parameters,
    training_step,
)
from variants.problem import get_precision, math_mode
from variants.registry import all_variants

TIMING_SEED = 10_000  # timed inputs apart from the correctness seeds 0, 1, ...


@dataclass(frozen=True)
class Case:
    device: str
    batch: int
    length: int
    config: object  # the problem's config: it names the problem
    precision: str
    rounds: int
    warmup_rounds: int

    @property
    def problem(self) -> str:
        return problem_of(self.config).name

    @property
    def id(self) -> str:
        return f"{self.device}-{self.precision}-B{self.batch}-N{self.length}"

    @property
    def group(self) -> str:
        c = self.config.columns()
        problem = "" if self.problem == "simplified" else f"{self.problem} "
        return (f"{problem}{self.device} {self.precision} B={self.batch} N={self.length} "
                f"H={c['heads']} C={c['head_dim']} Qp={c['query_points']} "
                f"Vp={c['value_points']} node={c['node_dim']} pair={c['pair_dim']}")


TINY = {"node_dim": 64, "pair_dim": 16, "heads": 4, "query_points": 4, "value_points": 8}


def cases(problem: str, device: str) -> list[Case]:
    """The cases of `problem` on `device`: a tiny layer on CPU (openfold: a padded batch of
    two), the problem's default layer at N = 256 and 1024 in fp32 and bf16 on CUDA."""
    if device == "cpu":
        batch = 1 if problem == "simplified" else 2
        return [Case("cpu", batch, 32, make_config(problem, TINY), "fp32", rounds=30,
                     warmup_rounds=3)]
    return [Case("cuda", 1, n, make_config(problem, {}), p, rounds=50, warmup_rounds=5)
            for p in ("fp32", "bf16") for n in (256, 1024)]


def pytest_generate_tests(metafunc):
    problem = metafunc.config.getoption("--problem")
    if "case" in metafunc.fixturenames:
        device = metafunc.config.getoption("--ipa-device") or (
            "cuda" if torch.cuda.is_available() else "cpu")
        chosen = cases(problem, device)
        metafunc.parametrize("case", chosen, ids=[c.id for c in chosen])
    if "variant_name" in metafunc.fixturenames:
        metafunc.parametrize("variant_name", list(all_variants(problem)))


def test_forward(benchmark, timed, case: Case, variant_name: str, request):
    variant = all_variants(case.problem)[variant_name]
    _benchmark_case(benchmark, timed, case, variant, request, "forward")


def test_training_step(benchmark, timed, case: Case, variant_name: str, request):
    """Forward plus every input's and parameter's gradient (the sweep's forward+backward)."""
    variant = all_variants(case.problem)[variant_name]
    _benchmark_case(benchmark, timed, case, variant, request, "forward+backward")


def _benchmark_case(benchmark, timed, case: Case, variant, request, pass_name: str) -> None:
    config, device = case.config, case.device
    precision = get_precision(case.precision)
    reasons = pass_reasons(variant, pass_name, device) or variant.not_supported_reasons(
        config, device, precision)
    if reasons:
        pytest.skip("; ".join(reasons))
    known = variant.known_issues(config, case.batch, case.length, device, precision.name)
    if known:  # the variant's own evidence: timed all the same, its failure expected
        request.applymarker(pytest.mark.xfail(reason="; ".join(known)))
    if variant.untimed_reason(device):
        pytest.skip(variant.untimed_reason(device))
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")

    benchmark.group = f"{case.group} {pass_name}"
    state_dict = problem_of(config).init_state_dict(config)
    with math_mode(precision), torch.no_grad():
        fn = variant.build(state_dict, config, device, precision)
        check = check_variant(variant, config, batch=case.batch, length=case.length,
                              device=device, precision=precision, seeds=1,
                              state_dict=state_dict, fn=fn, pass_name=pass_name)
        recipe = InputRecipe(config, case.batch, case.length, precision.name, device,
                             seed=TIMING_SEED)
        values = recipe.values()
        if pass_name == "forward":
            args = values.as_tuple()

            def call():
                return fn(*args)
        else:
            args, names = leaf_inputs(values), input_names(values)
            grad_out = recipe.grad_output(values)
            params = {n: p.requires_grad_(True) for n, p in trainable_parameters(fn).items()}

            def call():
                return training_step(fn, args, params, grad_out, names)
        benchmark.extra_info.update(
            problem=case.problem, variant=variant.name, is_baseline=variant.is_baseline,
            device=device, device_name=device_name(torch.device(device)), dtype=precision.name,
            math_mode=variant.math_mode_label(precision, config), batch=case.batch,
            length=case.length,
            **config.columns(), **{"pass": pass_name},
            rel_l2=check.rel_l2, max_abs=check.max_abs, reference_rel_l2=check.reference_rel_l2,
            tol=check.tol, err_ratio=check.err_ratio, correctness_seeds=check.seeds,
            grad_rel_l2=check.grad_rel_l2, grad_tol=check.grad_tol, grad_worst=check.grad_worst,
            grad_err_ratio=check.grad_err_ratio,
            status="ok" if check.passed else "mismatch", reason="; ".join(check.failures),
            peak_mem_mib=(peak_memory_mib(call, torch.device(device))
                          if device == "cuda" else None),
        )
        assert set(benchmark.extra_info) <= set(COLUMNS), "extra_info: the CSV's column names"
        timed(call, device, rounds=case.rounds, warmup_rounds=case.warmup_rounds)
    assert check.passed, f"{variant.name} {case.group}: {'; '.join(check.failures)}"


def test_flush_precedes_every_timed_call(benchmark, timed):
    """The timing helper's contract, checkable on any device: one flush before every call."""
    benchmark.group = "harness self-check"
    events: list[str] = []
    timed(lambda: events.append("call"), "cpu", rounds=5, warmup_rounds=1,
          flush=lambda: events.append("flush"))
    assert events and events == ["flush", "call"] * (len(events) // 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_timing_waits_for_the_device(benchmark, timed):
    """A kernel that spins for a known time (`torch.cuda._sleep`, measured with device
    events) must be timed at no less than that time; launching it without a synchronisation
    returns far sooner, so the test would catch a timer that forgot to wait."""
    if benchmark.disabled:
        pytest.skip("timing is disabled (--benchmark-disable)")
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def device_ms(cycles: int) -> float:
        begin.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return begin.elapsed_time(end)

    device_ms(1000)  # warm up the events and the sleep kernel
    cycles = int(1_000_000 * 20.0 / device_ms(1_000_000))  # about 20 ms
    known_ms = min(device_ms(cycles) for _ in range(3))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    launch_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    assert launch_ms < 0.5 * known_ms, "the launch alone waited: this test has no teeth here"

    benchmark.group = "harness self-check"
    benchmark.extra_info.update(known_ms=known_ms, launch_ms=launch_ms)
    timed(lambda: torch.cuda._sleep(cycles), "cuda", rounds=5, warmup_rounds=1)
    # 5 % slack for the SM clock moving between the calibration and the rounds.
    assert benchmark.stats["min"] * 1e3 >= 0.95 * known_ms, (
        f"timed {benchmark.stats['min'] * 1e3:.3f} ms for a {known_ms:.3f} ms kernel")
