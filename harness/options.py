"""Options and conventions every `ipa-bench` command shares: layer configuration, variant,
device and dtype selection, `--json`, progress bars, and the exit codes."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from contextlib import contextmanager

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from harness.worker import DEFAULT_TIMEOUT_S
from variants.base import Variant
from variants.problem import PRECISIONS, IPAConfig, IPAInputError
from variants.registry import all_variants, baseline, get_variant

# One exit-code convention for every command (README "CLI").
EXIT_OK = 0  # done, and everything checked passed
EXIT_FAILED = 1  # done, and something checked failed: a FAIL, a mismatch, a regression
EXIT_USAGE = 2  # bad arguments or input files; nothing was run (argparse uses 2 as well)
EXIT_INTERNAL = 3  # an unexpected exception: a bug, reported with its traceback
EXIT_INTERRUPTED = 130  # Ctrl-C (finished sweep rows are on disk)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_argument(text: str) -> str:
    """`--device`: cpu or cuda, and cuda only where torch sees a GPU."""
    if text not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu or cuda, got {text!r}")
    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            f"cuda: torch.cuda.is_available() is False on this machine (torch "
            f"{torch.__version__}); use --device cpu")
    return text


def add_device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", type=device_argument, default=default_device(),
                        metavar="{cpu,cuda}", help="(default: cuda if present, else cpu)")


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """--node-dim, --pair-dim, --heads, --head-dim, --query-points, --value-points (SPEC
    defaults; the names every problem's config maps to, docs/problems.md)."""
    defaults = IPAConfig()
    group = parser.add_argument_group("layer configuration")
    for field in ("node_dim", "pair_dim", "heads", "query_points", "value_points"):
        flag = "--" + field.replace("_", "-")
        group.add_argument(flag, type=int, default=getattr(defaults, field),
                           help=f"(default {getattr(defaults, field)})")
    group.add_argument("--head-dim", type=int, default=None,
                       help="per-head width: derived (node_dim / heads) in the simplified "
                       "problem, where another value is an error; c_hidden in openfold "
                       "(default 16)")


def add_problem_option(parser: argparse.ArgumentParser, *, default: str | None = "") -> None:
    """--problem; `default=None` leaves it None when not given (sweep: the grid may name it)."""
    from harness.problems import DEFAULT, PROBLEMS

    parser.add_argument("--problem", choices=sorted(PROBLEMS),
                        default=DEFAULT if default == "" else default,
                        help=f"the function under test (default {DEFAULT}: SPEC.md; openfold: "
                        "SPEC-openfold.md, docs/problems.md)")


def problem_name(args: argparse.Namespace) -> str:
    return getattr(args, "problem", None) or "simplified"


def config_from_args(args: argparse.Namespace):
    """The layer configuration of the selected problem from the shared size options."""
    from harness.grid import make_config

    columns = dict(node_dim=args.node_dim, pair_dim=args.pair_dim, heads=args.heads,
                   query_points=args.query_points, value_points=args.value_points)
    if args.head_dim is not None:
        columns["head_dim"] = args.head_dim
    try:
        return make_config(problem_name(args), columns)
    except IPAInputError as exc:
        text = str(exc)
        raise IPAInputError(f"--{text.replace('_', '-', 1)}" if text.startswith("head_dim")
                            else text) from None


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    """--variant (repeatable), --model-new (repeatable), --device, --dtype (repeatable)."""
    parser.add_argument("--variant", action="append", metavar="NAME",
                        help="variant to run (repeatable; default: every registered variant)")
    parser.add_argument("--model-new", action="append", metavar="FILE", default=[],
                        help="a KernelBench-style Python file defining ModelNew (repeatable)")
    add_device_option(parser)
    parser.add_argument("--dtype", action="append", choices=sorted(PRECISIONS), metavar="DTYPE",
                        help=f"precision, one of {sorted(PRECISIONS)} (repeatable; "
                        "default fp32, plus bf16 on cuda)")


def add_output_options(parser: argparse.ArgumentParser, *, json_output: bool = True) -> None:
    """--json (machine-readable output on stdout, docs/cli-json.md) and --no-progress."""
    if json_output:
        parser.add_argument("--json", action="store_true",
                            help="print one JSON document on stdout instead of tables "
                            "(schema: docs/cli-json.md)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (it goes to stderr, and only to a terminal)")


def selected_variants(args: argparse.Namespace, *, with_baseline: bool = False) -> list[Variant]:
    """The variants named by --variant plus the --model-new files; every registered variant
    when neither is given. Files given alone run alone, or beside the baseline when
    `with_baseline` (sweeps need it for speedups)."""
    from harness.model_new import model_new_variant

    problem = problem_name(args)
    if args.variant:
        chosen = [get_variant(n, problem) for n in args.variant]
    elif args.model_new:
        chosen = [baseline(problem)] if with_baseline else []
    else:
        chosen = list(all_variants(problem).values())
    files = [model_new_variant(path) for path in args.model_new]
    basenames = [v.name for v in files]
    for variant, path in zip(files, args.model_new, strict=True):
        if basenames.count(variant.name) > 1:  # same file name in two folders: keep both
            variant.name = f"model-new:{path}"
    return chosen + files


def selected_precisions(args: argparse.Namespace) -> list[str]:
    if args.dtype:
        return args.dtype
    return ["fp32", "bf16"] if args.device == "cuda" else ["fp32"]


def device_memory_bytes(device: str) -> int:
    """Total memory of `device`: the GPU's, or the machine's physical memory."""
    if device == "cuda":
        return torch.cuda.mem_get_info()[1]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def require_inputs_fit(config, batch: int, length: int, device: str) -> None:
    """Refuse (a usage error, before anything runs) a size whose inputs alone cannot be held:
    the problem's minimum bytes (`min_bytes`: inputs, output, weights) in float32, plus their
    float64 copy for the oracle, 3 x the float32 figure."""
    from harness.problems import problem_of

    need = 3 * problem_of(config).min_bytes(config, batch, length, 4)
    have = device_memory_bytes(device)
    if need > have:
        raise IPAInputError(
            f"--batch {batch}, --length {length}: this size needs {need / 2**30:.1f} GiB, the "
            f"inputs, output and weights in float32 ({need / 3 / 2**30:.1f} GiB) plus their "
            f"float64 copy for the oracle, more than the {have / 2**30:.1f} GiB of this "
            f"{device} device")


def wide_console() -> Console:
    return Console(width=max(Console().width, 160))


@contextmanager
def progress_bar(description: str, total: int, *, enabled: bool = True):
    """A rich progress bar on stderr; yields `advance(label)`. Shown only on a terminal, so
    logs and `--json` output stay clean."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), console=Console(stderr=True), transient=True,
                        disable=not enabled)
    with progress:
        task = progress.add_task(description, total=total)

        def advance(label: str | None = None) -> None:
            if label is not None:
                progress.update(task, description=f"{description}: {label}")
            progress.advance(task)

        yield advance


def json_number(value: float | int | None) -> float | int | None:
    """JSON has no NaN or Infinity: undefined or non-finite figures become null (the
    failures or the status say why)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def print_json(document: dict) -> None:
    json.dump(document, sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def add_timeout_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="S",
        help=f"seconds a variant's worker process may take for one step (a build, the "
        f"correctness calls, a cell's timing) before it is killed and the step recorded as an "
        f"error (default {DEFAULT_TIMEOUT_S:g}: covers a first CUDA build)")
