"""The `list` and `check` commands, the options they share with other commands, and the
list of command modules the CLI assembles."""

from __future__ import annotations

import argparse
import importlib

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.correctness import DEFAULT_SEEDS, CheckResult, ReferenceCache, check_variant
from harness.model_new import ModelNewError
from variants.base import Variant
from variants.problem import PRECISIONS, IPAConfig, get_precision
from variants.reference import init_state_dict
from variants.registry import all_variants, baseline, get_variant

# Modules that define `add_parser(subparsers)`, in the order `--help` lists them.
COMMAND_MODULES = [
    "harness.commands", "harness.sweep", "harness.plots", "harness.report", "harness.diagnose",
    "harness.compare",
]


def modules():
    return [importlib.import_module(name) for name in COMMAND_MODULES]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """--node-dim, --pair-dim, --heads, --query-points, --value-points (SPEC defaults)."""
    defaults = IPAConfig()
    group = parser.add_argument_group("layer configuration")
    for field in ("node_dim", "pair_dim", "heads", "query_points", "value_points"):
        flag = "--" + field.replace("_", "-")
        group.add_argument(flag, type=int, default=getattr(defaults, field),
                           help=f"(default {getattr(defaults, field)})")


def config_from_args(args: argparse.Namespace) -> IPAConfig:
    return IPAConfig(args.node_dim, args.pair_dim, args.heads, args.query_points,
                     args.value_points)


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    """--variant (repeatable), --model-new (repeatable), --device, --dtype (repeatable)."""
    parser.add_argument("--variant", action="append", metavar="NAME",
                        help="variant to run (repeatable; default: every registered variant)")
    parser.add_argument("--model-new", action="append", metavar="FILE", default=[],
                        help="a KernelBench-style Python file defining ModelNew (repeatable)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=default_device(),
                        help="(default: cuda if present, else cpu)")
    parser.add_argument("--dtype", action="append", choices=sorted(PRECISIONS), metavar="DTYPE",
                        help=f"precision, one of {sorted(PRECISIONS)} (repeatable; "
                        "default fp32, plus bf16 on cuda)")


def selected_variants(args: argparse.Namespace, *, with_baseline: bool = False) -> list[Variant]:
    """The variants named by --variant plus the --model-new files; every registered variant
    when neither is given. Files given alone run alone, or beside the baseline when
    `with_baseline` (sweeps need it for speedups)."""
    if args.variant:
        chosen = [get_variant(n) for n in args.variant]
    elif args.model_new:
        chosen = [baseline()] if with_baseline else []
    else:
        chosen = list(all_variants().values())
    if args.model_new:
        from harness.model_new import model_new_variant

        chosen += [model_new_variant(path) for path in args.model_new]
    return chosen


def selected_precisions(args: argparse.Namespace) -> list[str]:
    if args.dtype:
        return args.dtype
    return ["fp32", "bf16"] if args.device == "cuda" else ["fp32"]


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def run_list(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    table = Table(title=f"IPA variants (runnable on {args.device}, fp32, {config})")
    for column in ("variant", "baseline", "devices", "precisions", "backward", "runnable here",
                   "description"):
        table.add_column(column, overflow="fold")
    for variant in all_variants().values():
        reasons = variant.not_supported_reasons(config, args.device, "fp32")
        table.add_row(
            variant.name, _yes_no(variant.is_baseline), ", ".join(variant.devices),
            ", ".join(variant.precisions), _yes_no(variant.supports_backward),
            "yes" if not reasons else "no: " + "; ".join(reasons), variant.description,
        )
    Console(width=max(Console().width, 160)).print(table)
    return 0


def print_check_table(results: list[CheckResult], console: Console | None = None) -> None:
    table = Table(title="Correctness against the float64 oracle")
    for column in ("variant", "dtype", "device", "B", "N", "rel_l2", "tol", "err/ref",
                   "max_abs", "invariance (tol)", "result"):
        table.add_column(column, overflow="fold")
    for r in results:
        if r.skipped:
            figures = ["-"] * 5
            verdict = "unsupported: " + "; ".join(r.skipped)
        else:
            figures = [f"{r.rel_l2:.3e}", f"{r.tol:.3e}", f"{r.err_ratio:.2f}",
                       f"{r.max_abs:.3e}", f"{r.invariance_err:.2e} ({r.invariance_tol:.1e})"]
            verdict = "pass" if r.passed else "FAIL: " + "; ".join(r.failures)
        table.add_row(r.variant, r.precision, r.device, str(r.batch), str(r.length),
                      *figures, escape(verdict))
    (console or Console(width=max(Console().width, 160))).print(table)


def run_check(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    variants = selected_variants(args)
    state_dict = init_state_dict(config, seed=args.weights_seed)
    references = ReferenceCache(state_dict)
    results = []
    for variant in variants:
        for precision in selected_precisions(args):
            try:
                results.append(check_variant(
                    variant, config, batch=args.batch, length=args.length, device=args.device,
                    precision=get_precision(precision), seeds=args.seeds,
                    state_dict=state_dict, references=references,
                ))
            except ModelNewError as exc:  # a --model-new file that does not build or run
                results.append(CheckResult(
                    variant.name, precision, args.device, args.batch, args.length, config,
                    failures=[str(exc)]))
    print_check_table(results)
    failed = [r for r in results if r.failures]
    # A variant asked for by name that cannot run is not a pass either.
    explicitly_skipped = [r for r in results if r.skipped and args.variant]
    return 1 if failed or explicitly_skipped else 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "list", help="table of registered variants and whether they run here",
        description="List every registered variant: baseline or not, devices, precisions, "
        "and whether it runs here (with the reasons when it does not).")
    p.add_argument("--device", choices=("cpu", "cuda"), default=default_device())
    add_config_options(p)
    p.set_defaults(run=run_list)

    p = subparsers.add_parser(
        "check", help="correctness protocol: error vs the float64 oracle, SE(3) invariance",
        description="Run SPEC's correctness protocol for each variant and precision: rel_l2 "
        "against the float64 oracle over several seeds, the tolerance derived from the "
        "reference's own error, SE(3) invariance. Exit status 1 if any variant fails.")
    add_selection_options(p)
    p.add_argument("--batch", type=int, default=2, help="B (default 2)")
    p.add_argument("--length", type=int, default=97, help="N (default 97: ragged on purpose)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help=f"fresh input draws per check (default {DEFAULT_SEEDS})")
    p.add_argument("--weights-seed", type=int, default=0, help="seed of the weights (default 0)")
    add_config_options(p)
    p.set_defaults(run=run_check)
