"""Latency, peak memory and the cost model (bytes, FLOPs, floor).

Timing on CUDA follows nvbench/KernelBench practice: device events around each call, the
L2 flushed before every sample by writing a buffer twice the L2 size, warm-up until both a
minimum count and a minimum time are reached, and noise-adaptive stopping: sample until
the median's relative standard error is under `target_noise` (with at least `min_samples`
samples) or the time budget is spent. On CPU the same statistics use `time.perf_counter`.

`host_spin_ms` (default 0, none) makes the host busy-wait before each CUDA sample. A host-bound
call (an eager call at small N) may issue slower after the synchronize that ends each sample
lets the host's core go idle. On one H100 host a 2 ms busy wait before each sample made it
faster (2026-12-06, `gpu_diagnostics/profile_call.py --host-states`: bf16 N = 256 0.71 ms after
nothing, 0.38 after the busy wait); on a second start it was ~10 % slower than nothing, and in
an A/B on a third (six sweep processes, 0 and 2 alternately) it had no consistent effect and
did not narrow the spread. So it is off by default (docs/reliability.md).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from variants.problem import IPAConfig

MIB = 2**20


@dataclass(frozen=True)
class TimingPolicy:
    min_warmup: int = 3
    warmup_s: float = 0.05
    min_samples: int = 10
    max_samples: int = 500
    budget_s: float = 1.0
    target_noise: float = 0.01
    host_spin_ms: float = 0.0  # CUDA: the host's busy wait before each sample (module doc)


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    n_samples: int
    rel_noise: float  # relative standard error of the median
    # CUDA: median host ms of the device-wide synchronize after each sample's end event, i.e.
    # work still running on other streams when the timed stream had finished
    trailing_ms: float = 0.0
    # CUDA: median host ms from the call's start to its return, without synchronising: the
    # time the host takes to issue the call's work. Near median_ms, the device waited for the
    # host (`host_bound`). NaN on CPU, where the call is all host.
    host_ms: float = math.nan


def summarize(samples_ms: list[float]) -> Timing:
    """Median, p20, p80 and the median's relative standard error (robust: from the IQR)."""
    n = len(samples_ms)
    median = statistics.median(samples_ms)
    if n >= 2:
        q = statistics.quantiles(samples_ms, n=20, method="inclusive")
        p20, p80 = q[3], q[15]
        q1, _, q3 = statistics.quantiles(samples_ms, n=4, method="inclusive")
        sigma = (q3 - q1) / 1.349
    else:
        p20 = p80 = median
        sigma = math.inf
    rel_noise = 1.2533 * sigma / math.sqrt(n) / median if median > 0 else math.inf
    return Timing(median, p20, p80, n, rel_noise)


class L2Flusher:
    """Writes a buffer of twice the device's L2 size, so each sample starts with a cold L2."""

    def __init__(self, device: torch.device):
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        l2_bytes = l2_bytes or 64 * MIB
        self.buffer = torch.empty(2 * l2_bytes // 4, dtype=torch.float32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


# Called with a sample's index before that sample (untimed): the integrity checks refill the
# inputs and read the previous sample's output there (harness.runner).
BeforeSample = Callable[[int], None]


def _sample_until_quiet(run_once: Callable[[], float], policy: TimingPolicy,
                        before_sample: BeforeSample | None = None) -> Timing:
    """Warm up, then collect samples from `run_once` (returns ms) until quiet or out of time."""
    start = time.perf_counter()
    count = 0
    while count < policy.min_warmup or time.perf_counter() - start < policy.warmup_s:
        run_once()
        count += 1
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < policy.max_samples:
        if before_sample:
            before_sample(len(samples))
        samples.append(run_once())
        if len(samples) >= policy.min_samples:
            if summarize(samples).rel_noise < policy.target_noise:
                break
            if time.perf_counter() - start > policy.budget_s:
                break
    return summarize(samples)


def spin_host(ms: float) -> None:
    """Keep the host's core busy for `ms` milliseconds (a loop on the clock; no sleep)."""
    until = time.perf_counter() + ms * 1e-3
    while time.perf_counter() < until:
        pass


def time_cuda(fn: Callable[[], object], policy: TimingPolicy, flusher: L2Flusher,
              before_sample: BeforeSample | None = None) -> Timing:
    """Device-event timing of `fn()` with an L2 flush before every sample. After each
    sample's end event the whole device is synchronized, so no sample overlaps the next, and
    the host time that synchronize takes is kept: work the events did not see (another
    stream) shows up there as `trailing_ms`."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    trailing: list[float] = []
    issue: list[float] = []

    def run_once() -> float:
        spin_host(policy.host_spin_ms)
        flusher()
        begin.record()
        start = time.perf_counter()
        fn()
        issue.append((time.perf_counter() - start) * 1e3)
        end.record()
        end.synchronize()
        start = time.perf_counter()
        torch.cuda.synchronize()
        trailing.append((time.perf_counter() - start) * 1e3)
        return begin.elapsed_time(end)

    timing = _sample_until_quiet(run_once, policy, before_sample)
    return dataclasses.replace(timing,
                               trailing_ms=statistics.median(trailing[-timing.n_samples:]),
                               host_ms=statistics.median(issue[-timing.n_samples:]))


# A timed call whose host issue time is at least this share of its device-event median kept
# the device waiting for its launches: the row measures the host (flag `host-bound`).
HOST_BOUND_SHARE = 0.8


def host_bound(timing: Timing) -> bool:
    """Whether the host took at least `HOST_BOUND_SHARE` of the median to issue the call, so
    that the device mostly waited for launches (an eager call of small kernels; a CUDA-graph
    replay measures the kernels instead). False where `host_ms` was not measured (CPU)."""
    return timing.host_ms >= HOST_BOUND_SHARE * timing.median_ms


def capture_cuda_graph(fn: Callable[[], object], *, on_warmup_stream: bool = False,
                       capture_error_mode: str = "global") -> Callable[[], None]:
    """`fn()` captured in a CUDA graph (after two warm-up calls on a side stream); returns the
    graph's replay. What `fn` returned during capture is rewritten by every replay. The
    keywords (capture on the warm-up stream rather than the graph's own; torch.cuda.graph's
    `capture_error_mode`) are for `gpu_diagnostics/graph_capture_probe.py`."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream if on_warmup_stream else None,
                          capture_error_mode=capture_error_mode):
        fn()
    return graph.replay


def time_cpu(fn: Callable[[], object], policy: TimingPolicy,
             before_sample: BeforeSample | None = None) -> Timing:
    def run_once() -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return _sample_until_quiet(run_once, policy, before_sample)


def peak_memory_mib(fn: Callable[[], object], device: torch.device) -> float:
    """Peak memory allocated during one call of `fn()` minus what was allocated before it
    (inputs and weights excluded; the output is included), in MiB. CUDA only: it reads
    PyTorch's caching allocator, so memory a kernel gets from cudaMalloc directly is missed."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return peak / MIB


def copy_bandwidth_gbps(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device copy bandwidth in GB/s (bytes read plus bytes written), median of a few copies."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    policy = TimingPolicy(min_samples=5, max_samples=20, budget_s=0.5)
    if device.type == "cuda":
        timing = time_cuda(lambda: dst.copy_(src), policy, flusher=lambda: None)
    else:
        timing = time_cpu(lambda: dst.copy_(src), policy)
    return 2 * nbytes / (timing.median_ms * 1e-3) / 1e9


def host_op_us(device: torch.device, ops: int = 200, rounds: int = 5) -> float:
    """The host's time to issue one small torch op on `device` (an in-place add to one
    element, `ops` back to back), median of `rounds`, in us. Eager rows below ~1 ms measure it
    as much as their kernels, and it differs between machines whose CPU model a VM hides: two
    H100 hosts of 2026-12-06 issued Triton launches 1.6x apart (docs/perf-notes.md)."""
    x = torch.zeros(1, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    per_op = []
    for _ in range(rounds + 1):  # the first round warms up
        sync()
        start = time.perf_counter()
        for _ in range(ops):
            x.add_(1.0)
        per_op.append((time.perf_counter() - start) / ops * 1e6)
    sync()
    return statistics.median(per_op[1:])


# A training step reads every input and weight twice (forward, backward) and writes one
# gradient of each (issue #16: pair_repr read forward, read backward, d pair_repr written);
# its backward does about twice the forward's FLOPs.
TRAINING_BYTES_FACTOR = 3
TRAINING_FLOPS_FACTOR = 3


def min_bytes(config: IPAConfig, batch: int, length: int, element_size: int) -> int:
    """SPEC cost model of the forward: every input read once, the output written once, plus
    the weights (a training step: `TRAINING_BYTES_FACTOR` times, applied by the caller)."""
    c, b, n = config, batch, length
    h, d, qp, vp = c.heads, c.head_dim, c.query_points, c.value_points
    weights = (
        2 * c.node_dim  # layer norm
        + 3 * h * d * c.node_dim  # q, k, v
        + 3 * h * (2 * qp + vp) * c.node_dim  # q, k, v points
        + h * c.pair_dim + h  # pair bias, head weights
        + (h * d + 3 * h * vp + 1) * c.node_dim  # out_proj
    )
    activations = b * n * c.node_dim + b * n * n * c.pair_dim + 12 * b * n + b * n * c.node_dim
    return element_size * (activations + weights)


def flops(config: IPAConfig, batch: int, length: int) -> int:
    """SPEC cost model of the forward, dominant terms: pair bias, logits, aggregation,
    projections (a training step: `TRAINING_FLOPS_FACTOR` times, applied by the caller)."""
    c, b, n = config, batch, length
    h, d, qp, vp = c.heads, c.head_dim, c.query_points, c.value_points
    pair_bias = 2 * b * n * n * c.pair_dim * h
    logits = 2 * b * h * n * n * (d + 3 * qp)
    aggregation = 2 * b * h * n * n * (d + 3 * vp)
    projections = 2 * b * n * c.node_dim * (3 * h * d + 3 * h * (2 * qp + vp))
    out_proj = 2 * b * n * (h * d + 3 * h * vp) * c.node_dim
    return pair_bias + logits + aggregation + projections + out_proj
