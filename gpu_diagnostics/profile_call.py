"""Where one call of a variant spends its time (GPU machine): a forward, or a training step
(forward and every gradient), of the problem's default layer at B = 1 under torch.profiler,
after two warm-up calls. Prints the CUDA kernels by total device time, then the host side:
the operators by self CPU time (launch and dispatch overhead), and each autotuned Triton
kernel's fastest configs with their times.

    PYTHONPATH=. python3 gpu_diagnostics/profile_call.py [N] [fp32|bf16] [variant]
        [--problem simplified|openfold] [--pass forward|forward+backward] [--device cuda|cpu]
        [--nvtx | --host | --host-states]

With `--set SETTING` one setting (as below) applies to the whole run, before the build: how an
Nsight Compute run (`--nvtx`) profiles a form other than the default. With `--ab SETTING
[SETTING ...]` the call is timed instead under each SETTING in turn (seven
rounds of five calls each, the host clock around five back-to-back calls and a synchronise,
or with `--latency` device events around each call alone after an L2 flush, as the sweep
times an eager row (host overhead in front of the kernels counts); with `--graph` each
setting's call is captured in a CUDA graph and its replays timed; medians in ms): an A/B of
one change in one process, behind module-level switches that the change adds for the
experiment. A SETTING is `MODULE:NAME=VALUE[,MODULE:NAME=VALUE...]` (VALUE a Python literal);
a lone `MODULE:NAME` (a boolean) stands for its two settings, off and on. The eighteenth
session's: `--ab variants.triton.bias_backward:SUMS_BESIDE_PAIR_PASS=False
variants.triton.bias_backward:SUMS_BESIDE_PAIR_PASS=True,variants.triton.bias_backward:PAIR_PROGRAMS_PER_SM=1`.

With `--nvtx` the measured call runs inside an NVTX range named `ipa` and the CUDA profiler
range (cudaProfilerStart / Stop) instead of under torch.profiler, for Nsight Compute to
profile that call's kernels alone (the warm-ups and the autotuner's launches fall outside
it). Autograd runs the backward on a thread of its own, outside the NVTX range, which is per
thread: for a training step's kernels use `--profile-from-start off` instead. With `--host`,
20 calls run without a profiler, the host's time to issue one printed, then 20 under cProfile
(the Python functions by own time: where an eager call's host overhead goes), then each Triton
kernel's launches by path (`DirectLaunch`).

Nsight Compute:

    ncu --nvtx --nvtx-include "ipa/" --section SpeedOfLight --section WarpStateStats \
        python3 gpu_diagnostics/profile_call.py 4096 bf16 triton-pairdot --pass forward --nvtx
    ncu --profile-from-start off --kernel-name regex:"_key_kernel|_pair_kernel" \
        --section SpeedOfLight --section WarpStateStats \
        python3 gpu_diagnostics/profile_call.py 4096 fp32 triton-train --nvtx

Defaults: N = 4096, fp32, `triton-train`, problem simplified, pass forward+backward, cuda
(`--device cpu` with TRITON_INTERPRET=1 and a small N: a dry run of this script).
"""

from __future__ import annotations

import argparse
import ast
import cProfile
import importlib
import pstats
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from harness.measure import L2Flusher, TimingPolicy, capture_cuda_graph, time_cuda
from harness.problems import PROBLEMS
from harness.runner import (
    InputRecipe,
    input_names,
    leaf_inputs,
    trainable_parameters,
    training_step,
)
from variants.problem import math_mode
from variants.registry import get_variant


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("length", nargs="?", type=int, default=4096)
    parser.add_argument("precision", nargs="?", default="fp32")
    parser.add_argument("variant", nargs="?", default="triton-train")
    parser.add_argument("--problem", default="simplified", choices=sorted(PROBLEMS))
    parser.add_argument("--pass", dest="pass_name", default="forward+backward",
                        choices=("forward", "forward+backward"))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--nvtx", action="store_true",
                        help="run the measured call in an NVTX range `ipa` (for ncu)")
    parser.add_argument("--host", action="store_true",
                        help="cProfile 20 calls instead: where the host's time goes")
    parser.add_argument("--host-states", action="store_true",
                        help="the host's issue time of one call back to back, and under the "
                        "sweep's timing after a busy wait, nothing, or a sleep")
    parser.add_argument("--set", dest="setting", metavar="SETTING",
                        help="MODULE:NAME=VALUE[,...] applied before the variant is built (e.g. "
                        "a form for --nvtx: variants.cuda_fused:BF16_BIAS=3)")
    parser.add_argument("--ab", nargs="+", metavar="SETTING",
                        help="time the call under each MODULE:NAME=VALUE[,...] setting in turn")
    parser.add_argument("--latency", action="store_true",
                        help="--ab: each call alone after an L2 flush, by device events (an "
                        "eager row's latency), instead of back-to-back calls")
    parser.add_argument("--graph", action="store_true",
                        help="--ab: each setting's call captured in a CUDA graph and replayed "
                        "(with --latency: a graph row's time; the kernels alone)")
    args = parser.parse_args(argv)
    for (module_name, name), value in (parse_settings([args.setting])[0]
                                       if args.setting else {}).items():
        setattr(importlib.import_module(module_name), name, value)
    problem = PROBLEMS[args.problem]
    config = problem.config_class()
    fn = get_variant(args.variant, args.problem).build(
        problem.init_state_dict(config), config, args.device, args.precision)
    recipe = InputRecipe(config, 1, args.length, args.precision, args.device, 0)
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with math_mode(args.precision):
        inputs = recipe.presented(recipe.values())
        if args.pass_name == "forward":
            call_args = inputs.as_tuple()

            def call():
                with torch.no_grad():
                    fn(*call_args)
        else:
            call_args, names = leaf_inputs(inputs), input_names(inputs)
            params = {k: p.requires_grad_(True) for k, p in trainable_parameters(fn).items()}
            grad_out = recipe.grad_output()

            def call():
                training_step(fn, call_args, params, grad_out, names)

        for _ in range(2):
            call()
        sync()
        if args.nvtx:
            torch.cuda.profiler.start()
            with torch.cuda.nvtx.range("ipa"):
                call()
                sync()
            torch.cuda.profiler.stop()
            return 0
        if args.host_states:
            print_host_states(call, sync, cuda)
            return 0
        if args.ab:
            print_tuning()  # first: the A/B's medians end the output, where a log's tail keeps them
            print_ab(args.ab, call, sync, latency=args.latency, graph=args.graph)
            return 0
        if args.host:
            start = time.perf_counter()
            for _ in range(20):
                call()
            issue_ms = (time.perf_counter() - start) / 20 * 1e3
            sync()
            print(f"host: {issue_ms:.3f} ms to issue one call (20 calls, no profiler)")
            host = cProfile.Profile()
            host.enable()
            for _ in range(20):
                call()
            sync()
            host.disable()
            pstats.Stats(host).sort_stats("tottime").print_stats(25)
            print_launch_paths()
            return 0
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        with profile(activities=activities) as prof:
            call()
            sync()
    where = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"# {args.problem} {args.variant} {args.precision} {args.pass_name} N={args.length}, "
          f"{where}, torch {torch.__version__}")
    table = prof.key_averages()
    if cuda:
        print(table.table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
    print(table.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))
    print_tuning()
    return 0


def parse_settings(specs: list[str]) -> list[dict[tuple[str, str], object]]:
    """`--ab`'s settings: each maps (module, name) to a value; a lone boolean `MODULE:NAME`
    becomes two settings, False and True. A module or name that does not exist fails here."""
    settings = []
    for spec in specs:
        if "=" not in spec:
            specs_of_flag = [f"{spec}=False", f"{spec}=True"]
            settings += parse_settings(specs_of_flag)
            continue
        setting = {}
        for assignment in spec.split(","):
            target, value = assignment.split("=", 1)
            module_name, name = target.split(":")
            getattr(importlib.import_module(module_name), name)  # a typo fails here
            setting[module_name, name] = ast.literal_eval(value)
        settings.append(setting)
    return settings


def print_ab(specs: list[str], call, sync, rounds: int = 7, calls: int = 5,
             latency: bool = False, graph: bool = False) -> None:
    """Median ms of `call` under each setting (`parse_settings`), alternating by rounds so that
    drift in the device's clocks hits every setting alike; the switches are restored after.
    By default back-to-back calls by the host clock (throughput: one call's host work overlaps
    the last one's kernels); `latency`: each call alone as the sweep times an eager row (an L2
    flush, then device events around the call, synchronised after), the round's median.
    `graph`: each setting's call is captured once in a CUDA graph, under that setting, and its
    replay timed instead (no host overhead: the kernels' time)."""
    settings = parse_settings(specs)
    cuda = torch.cuda.is_available()
    flush = L2Flusher(torch.device("cuda")) if latency and cuda else None

    def timed_round(call) -> float:
        if not latency:
            start = time.perf_counter()
            for _ in range(calls):
                call()
            sync()
            return (time.perf_counter() - start) * 1e3 / calls
        samples = []
        for _ in range(calls):
            if not cuda:  # a dry run on the CPU: the host clock
                start = time.perf_counter()
                call()
                samples.append((time.perf_counter() - start) * 1e3)
                continue
            begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            flush()
            begin.record()
            call()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end))
        return sorted(samples)[len(samples) // 2]

    originals = {key: getattr(importlib.import_module(key[0]), key[1])
                 for setting in settings for key in setting}

    def apply(values: dict) -> None:
        for (module_name, name), value in values.items():
            setattr(importlib.import_module(module_name), name, value)

    calls_of = [call] * len(settings)
    if graph and cuda:
        for i, setting in enumerate(settings):
            apply(originals)
            apply(setting)
            calls_of[i] = capture_cuda_graph(call)
    times: list[list[float]] = [[] for _ in settings]
    for _ in range(rounds):
        for setting, samples, timed in zip(settings, times, calls_of, strict=True):
            apply(originals)
            apply(setting)
            timed()
            sync()
            samples.append(timed_round(timed))
    apply(originals)
    for setting, samples in zip(settings, times, strict=True):
        samples.sort()
        label = ", ".join(f"{name}={value!r}" for (_, name), value in setting.items())
        print(f"{label}: median {samples[len(samples) // 2]:.3f} ms "
              f"(min {samples[0]:.3f}, max {samples[-1]:.3f}, {rounds} x {calls} calls)")


def print_host_states(call, sync, cuda: bool) -> None:
    """Why an eager row's host_ms can exceed the host's issue time back to back: the same call
    issued back to back (20 calls without a synchronisation), then under the sweep's timing
    (`harness.measure.time_cuda`: an L2 flush, device events, a synchronisation after each
    sample) with, before each sample: nothing; a 2 ms sleep; a 2 ms busy wait
    (`TimingPolicy.host_spin_ms`, off by default); a sleep and then that busy wait. A
    host-bound call issued slower after an idle wait than after a busy one times the host's
    state, not the code."""
    def sleep(_: int) -> None:
        time.sleep(2e-3)

    start = time.perf_counter()
    for _ in range(20):
        call()
    print(f"back to back: {(time.perf_counter() - start) / 20 * 1e3:.3f} ms to issue one call")
    sync()
    if not cuda:
        return
    flusher = L2Flusher(torch.device("cuda"))
    spin = 2.0
    for label, before, spin_ms in (("nothing", None, 0.0), ("a sleep", sleep, 0.0),
                                   (f"a {spin} ms busy wait", None, spin),
                                   (f"a sleep and a {spin} ms busy wait", sleep, spin)):
        timing = time_cuda(call, TimingPolicy(host_spin_ms=spin_ms), flusher, before)
        print(f"sweep timing after {label}: host {timing.host_ms:.3f} ms, "
              f"device median {timing.median_ms:.3f} ms ({timing.n_samples} samples)")


def print_launch_paths() -> None:
    """Each Triton kernel launched through `DirectLaunch`: its calls by the direct path and by
    Triton's (after warm-up, a kernel that keeps taking Triton's path has a call signature that
    changes from call to call)."""
    from variants.triton.launch import INSTANCES

    for launcher in INSTANCES:
        if launcher.direct_launches or launcher.triton_launches:
            print(f"  {launcher.name}: {launcher.direct_launches} direct, "
                  f"{launcher.triton_launches} through Triton")


def print_tuning() -> None:
    """Each autotuned Triton kernel that ran: every config's time at its last key, best first
    (what the autotuner chose from, and by how much)."""
    from variants.triton.common import TUNED

    for name, tuned in TUNED.items():
        timings = getattr(tuned, "configs_timings", None) or {}
        for config, t in sorted(timings.items(), key=lambda kv: kv[1][0])[:6]:
            print(f"  {name}: {config}: {t[0]:.3f} ms")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
