"""`ipa-bench list` and `ipa-bench check`: what is registered, and whether it is right.

`check` runs the correctness protocol (`harness.correctness.check_variant`) for each selected
variant and precision. A variant that raises while building or running is a FAIL row with
its exception, never a usage error: only bad arguments exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses

from rich.markup import escape
from rich.table import Table

from harness import options
from harness.correctness import (
    DEFAULT_SEEDS,
    CheckResult,
    ReferenceCache,
    check_variant,
    require_pass_for_problem,
)
from harness.model_new import ModelNewError
from harness.problems import problem_of
from harness.results import ERR_RATIO_LABEL, format_err_ratio
from harness.runner import PASSES
from harness.scan import scan_variant
from harness.version import __version__
from harness.worker import WorkerFailure, WorkerPool, exception_name
from variants.problem import get_precision
from variants.registry import all_variants

LIST_SCHEMA = "ipa-bench.list/1"
CHECK_SCHEMA = "ipa-bench.check/1"


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def run_list(args: argparse.Namespace) -> int:
    config = options.config_from_args(args)
    entries = []
    for variant in all_variants(args.problem).values():
        reasons = variant.not_supported_reasons(config, args.device, "fp32")
        entries.append({
            "name": variant.name, "description": variant.description,
            "is_baseline": variant.is_baseline, "devices": list(variant.devices),
            "precisions": list(variant.precisions),
            "supports_backward": variant.supports_backward, "requires": list(variant.requires),
            "problems": list(variant.problems),
            "runnable": not reasons, "reasons": reasons,
        })
    if args.json:
        options.print_json({"schema": LIST_SCHEMA, "ipa_bench_version": __version__,
                            "problem": args.problem, "device": args.device, "precision": "fp32",
                            "config": dataclasses.asdict(config), "variants": entries})
        return options.EXIT_OK
    table = Table(title=f"IPA variants of problem {args.problem} (runnable on {args.device}, "
                  f"fp32, {config})")
    for column in ("variant", "baseline", "devices", "precisions", "backward", "runnable here",
                   "description"):
        table.add_column(column, overflow="fold")
    for e in entries:
        table.add_row(
            e["name"], _yes_no(e["is_baseline"]), ", ".join(e["devices"]),
            ", ".join(e["precisions"]), _yes_no(e["supports_backward"]),
            "yes" if e["runnable"] else "no: " + "; ".join(e["reasons"]), e["description"],
        )
    options.wide_console().print(table)
    return options.EXIT_OK


def print_check_table(results: list[CheckResult], console=None) -> None:
    training = any(r.pass_name != "forward" for r in results)
    table = Table(title="Correctness against the float64 oracle"
                  + (" (training step: output and every gradient)" if training else ""))
    columns = ["variant", "dtype", "device", "B", "N", "rel_l2", "tol", ERR_RATIO_LABEL,
               "max_abs", "invariance (tol)"]
    if training:
        columns += ["worst gradient", "grad rel_l2 (tol)", f"grad {ERR_RATIO_LABEL}"]
    for column in [*columns, "result"]:
        table.add_column(column, overflow="fold")
    for r in results:
        if r.skipped or r.seeds == 0:
            figures = ["-"] * (len(columns) - 5)
        else:
            figures = [f"{r.rel_l2:.3e}", f"{r.tol:.3e}", format_err_ratio(r.err_ratio),
                       f"{r.max_abs:.3e}", f"{r.invariance_err:.2e} ({r.invariance_tol:.1e})"]
            if training:
                figures += [r.grad_worst, f"{r.grad_rel_l2:.3e} ({r.grad_tol:.1e})",
                            format_err_ratio(r.grad_err_ratio)]
        if r.skipped:
            verdict = "unsupported: " + "; ".join(r.skipped)
        else:
            verdict = "pass" if r.passed else "FAIL: " + "; ".join(r.failures)
        table.add_row(r.variant, r.precision, r.device, str(r.batch), str(r.length),
                      *figures, escape(verdict))
    (console or options.wide_console()).print(table)


def check_result_json(r: CheckResult) -> dict:
    n = options.json_number
    return {
        "variant": r.variant, "dtype": r.precision, "device": r.device, "batch": r.batch,
        "length": r.length, "status": {"pass": "pass", "FAIL": "fail"}.get(r.status, r.status),
        "seeds": r.seeds, "rel_l2": n(r.rel_l2), "max_abs": n(r.max_abs),
        "reference_rel_l2": n(r.reference_rel_l2), "tol": n(r.tol),
        "err_ratio": n(r.err_ratio), "invariance_err": n(r.invariance_err),
        "invariance_tol": n(r.invariance_tol), "failures": list(r.failures),
        "unsupported_reasons": list(r.skipped), "pass": r.pass_name,
        "grad_rel_l2": n(r.grad_rel_l2), "grad_tol": n(r.grad_tol),
        "grad_worst": r.grad_worst or None, "grad_err_ratio": n(r.grad_err_ratio),
        "gradients": {name: {k: n(v) for k, v in figures.items()}
                      for name, figures in r.gradients.items()},
    }


def _failure_message(exc: Exception) -> str:
    """A ModelNewError or a dead worker says what happened itself; others get their type."""
    if isinstance(exc, WorkerFailure) or exception_name(exc) == ModelNewError.__name__:
        return str(exc)
    return f"raised {exception_name(exc)}: {exc}"


def run_check(args: argparse.Namespace) -> int:
    config = options.config_from_args(args)
    require_pass_for_problem(args.pass_name, args.problem)  # before anything runs
    options.require_inputs_fit(config, args.batch, args.length, args.device)
    variants = options.selected_variants(args)
    precisions = options.selected_precisions(args)
    state_dict = problem_of(config).init_state_dict(config, seed=args.weights_seed)
    references = ReferenceCache(state_dict)
    results = []
    show = not (args.no_progress or args.json)
    with (options.progress_bar("check", len(variants) * len(precisions),
                               enabled=show) as advance,
          WorkerPool(timeout_s=args.timeout) as workers):
        for variant in variants:
            for precision in precisions:
                advance(f"{variant.name} {precision}")
                try:
                    results.append(check_variant(
                        variant, config, batch=args.batch, length=args.length,
                        device=args.device, precision=get_precision(precision),
                        seeds=args.seeds, state_dict=state_dict, references=references,
                        runner=workers.get(variant, args.device, precision),
                        pass_name=args.pass_name,
                    ))
                except Exception as exc:  # noqa: BLE001 - the variant's failure is its row
                    results.append(CheckResult(
                        variant.name, precision, args.device, args.batch, args.length, config,
                        pass_name=args.pass_name, failures=[_failure_message(exc)]))
    scan = {v.name: scan_variant(v) for v in variants}
    # A variant asked for by name that cannot run is not a pass either.
    failed = [r for r in results if r.failures or (r.skipped and args.variant)]
    code = options.EXIT_FAILED if failed else options.EXIT_OK
    if args.json:
        options.print_json({"schema": CHECK_SCHEMA, "ipa_bench_version": __version__,
                            "problem": args.problem, "device": args.device,
                            "config": dataclasses.asdict(config),
                            "weights_seed": args.weights_seed, "passed": not failed,
                            "results": [check_result_json(r) for r in results],
                            "scan": {name: [dataclasses.asdict(f) for f in found]
                                     for name, found in scan.items() if found}})
    else:
        print_check_table(results)
        for found in scan.values():
            for finding in found:
                print(f"scan warning: {finding}")
    return code


def add_list_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "list", help="table of registered variants and whether they run here",
        description="List every registered variant: baseline or not, devices, precisions, "
        "and whether it runs here (with the reasons when it does not).")
    options.add_device_option(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON document instead of the table (docs/cli-json.md)")
    options.add_problem_option(p)
    options.add_config_options(p)
    p.set_defaults(run=run_list)


def add_check_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "check", help="correctness protocol: error vs the float64 oracle, SE(3) invariance",
        description="Run SPEC's correctness protocol for each variant and precision: rel_l2 "
        "against the float64 oracle over several seeds, the tolerance derived from the "
        "reference's own error, SE(3) invariance. Exit status 1 if any variant fails.")
    options.add_selection_options(p)
    p.add_argument("--batch", type=options.positive_int, default=2, help="B (default 2)")
    p.add_argument("--length", type=options.positive_int, default=97,
                   help="N (default 97: ragged on purpose)")
    p.add_argument("--seeds", type=options.positive_int, default=DEFAULT_SEEDS,
                   help=f"fresh input draws per check (default {DEFAULT_SEEDS})")
    p.add_argument("--weights-seed", type=int, default=0, help="seed of the weights (default 0)")
    p.add_argument("--pass", dest="pass_name", choices=PASSES, default="forward",
                   help="forward (default), or forward+backward: every call a training step, "
                   "and every input's and parameter's gradient judged against the float64 "
                   "oracle's autograd, with a tolerance from the reference's own gradient error")
    options.add_output_options(p)
    options.add_problem_option(p)
    options.add_config_options(p)
    options.add_timeout_option(p)
    p.set_defaults(run=run_check)
