"""pytest-benchmark plumbing for ipa-bench: the `--ipa-device` and `--problem` options and
honest timing.

`timed(fn, device, rounds=..., warmup_rounds=...)` (a fixture) runs `benchmark.pedantic` with
one call per round. On CUDA every round is

    setup (untimed):  flush the L2 (harness.measure.L2Flusher), torch.cuda.synchronize()
    target (timed):   fn(); torch.cuda.synchronize()

so a round measures the kernel work from a cold L2, not the microseconds a launch takes to
return, and the flush never leaks into the timed region. pytest-benchmark's timer is the
host's `time.perf_counter`, so a round also includes the launch overhead eager PyTorch pays
(`ipa-bench sweep` uses device events instead; its numbers are the ones to publish).
`test_gpu_timing_waits_for_the_device` proves the synchronisation with `torch.cuda._sleep`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from harness.measure import L2Flusher


def pytest_addoption(parser):
    from harness.problems import DEFAULT, PROBLEMS

    parser.addoption(
        "--ipa-device", choices=("cpu", "cuda"), default=None,
        help="ipa-bench: device whose cases are benchmarked (default: cuda if present, else "
        "cpu)")
    parser.addoption(
        "--problem", choices=sorted(PROBLEMS), default=DEFAULT,
        help=f"ipa-bench: the problem whose variants are benchmarked (default {DEFAULT}; "
        "openfold: SPEC-openfold.md)")


def time_honestly(
    benchmark,
    fn: Callable[[], object],
    device: str | torch.device,
    *,
    rounds: int,
    warmup_rounds: int,
    flush: Callable[[], object] | None = None,
):
    """`benchmark.pedantic(fn)`, one call per round; on CUDA the L2 is flushed before each
    round (untimed) and the timed call ends with a device synchronisation. `flush` replaces
    the L2 flush (tests use it to watch the order of events); on CPU it runs only if given."""
    device = torch.device(device)
    if device.type == "cuda":
        flush = flush or L2Flusher(device)

        def setup() -> None:
            flush()
            torch.cuda.synchronize(device)  # the flush is done before the clock starts

        def target() -> None:
            fn()
            torch.cuda.synchronize(device)  # the clock stops when the work is done
    else:
        setup = None
        if flush is not None:
            def setup() -> None:
                flush()

        target = fn
    return benchmark.pedantic(target, setup=setup, rounds=rounds, warmup_rounds=warmup_rounds,
                              iterations=1)


@pytest.fixture
def timed(benchmark):
    """`time_honestly` bound to this test's `benchmark` fixture."""

    def run(fn, device, *, rounds: int, warmup_rounds: int = 2, flush=None):
        return time_honestly(benchmark, fn, device, rounds=rounds, warmup_rounds=warmup_rounds,
                             flush=flush)

    return run
