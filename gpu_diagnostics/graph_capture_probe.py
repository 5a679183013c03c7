"""Why a training step fails to capture as a CUDA graph (GPU machine; issue #16).

The sweep's `graph` mode captures the whole step (forward and `torch.autograd.grad`) after two
warm-up steps on a side stream (`harness.measure.capture_cuda_graph`); on the H200 that failed
for triton-train and torch-compile alike with "operation failed due to a previous error during
capture", which hides the first error. This script tries the capture of one variant's step in
several ways, each in a fresh process (a failed capture can leave the CUDA context unusable),
and prints one line per way: ok with the replay's time against an eager step, or the error.

    PYTHONPATH=. python3 gpu_diagnostics/graph_capture_probe.py [variant ...] [--length N]
        [--precision fp32|bf16]

Ways: `harness` (the sweep's own capture), `same-stream` (captured on the warm-up stream),
`thread-local` (capture_error_mode="thread_local": only the capturing thread's unsafe calls
invalidate it, not the autograd engine's), `relaxed`, `forward-only` (the forward alone, which
captures in the forward sweeps: the control), and `graphed-callables`
(`torch.cuda.make_graphed_callables` around the forward, PyTorch's own recipe for training).
Default variants: reference, triton-train, torch-compile; N = 256, fp32.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue as queue_module
import sys
import traceback

WAYS = ("forward-only", "harness", "same-stream", "thread-local", "relaxed", "graphed-callables")


def _step(variant: str, length: int, precision: str):
    """The variant's training step on fixed inputs, as the sweep times it: (step, forward)."""
    import torch

    from harness.runner import (
        InputRecipe,
        input_names,
        leaf_inputs,
        trainable_parameters,
        training_step,
    )
    from variants.problem import IPAConfig
    from variants.reference import init_state_dict
    from variants.registry import get_variant

    config = IPAConfig()
    fn = get_variant(variant).build(init_state_dict(config), config, "cuda", precision)
    recipe = InputRecipe(config, 1, length, precision, "cuda", 0)
    inputs = recipe.presented(recipe.values())
    args, names = leaf_inputs(inputs), input_names(inputs)
    params = {k: p.requires_grad_(True) for k, p in trainable_parameters(fn).items()}
    grad_out = recipe.grad_output()

    def step():
        return training_step(fn, args, params, grad_out, names)[0]

    def forward():
        with torch.no_grad():
            return fn(*args)

    return step, forward, fn, args, grad_out


def _try(way: str, variant: str, length: int, precision: str, queue) -> None:
    try:
        import torch
        from triton.testing import do_bench

        from harness.measure import capture_cuda_graph
        from variants.problem import math_mode

        with math_mode(precision):
            step, forward, fn, args, grad_out = _step(variant, length, precision)
            step()
            torch.cuda.synchronize()
            if way == "forward-only":
                replay, eager = capture_cuda_graph(forward), forward
            elif way == "harness":
                replay, eager = capture_cuda_graph(step), step
            elif way == "graphed-callables":
                module = getattr(fn, "module", None)
                if not isinstance(module, torch.nn.Module):
                    raise TypeError("the built function has no torch.nn.Module to graph")
                graphed = torch.cuda.make_graphed_callables(module, tuple(args))

                def replay():
                    torch.autograd.backward(graphed(*args), grad_out)
                eager = step
            else:
                mode = {"thread-local": "thread_local", "relaxed": "relaxed"}.get(way, "global")
                replay = capture_cuda_graph(step, on_warmup_stream=way == "same-stream",
                                            capture_error_mode=mode)
                eager = step
            replay()
            torch.cuda.synchronize()
            queue.put(f"ok: replay {do_bench(replay, rep=200):.3f} ms, eager "
                      f"{do_bench(eager, rep=200):.3f} ms")
    except Exception as exc:  # noqa: BLE001 - the probe reports every failure
        first = traceback.format_exception_only(type(exc), exc)[-1].strip()
        queue.put(f"FAILED: {first[:300]}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", default=["reference", "triton-train",
                                                        "torch-compile"])
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args(argv)
    context = multiprocessing.get_context("spawn")
    for variant in args.variants:
        for way in WAYS:
            queue = context.Queue()
            process = context.Process(target=_try, args=(way, variant, args.length,
                                                         args.precision, queue))
            process.start()
            try:
                result = queue.get(timeout=300)
            except queue_module.Empty:
                result = f"no answer within 300 s (exit code {process.exitcode})"
            process.kill()
            process.join()
            print(f"{variant:14s} {args.precision} N={args.length} {way:18s} {result}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
