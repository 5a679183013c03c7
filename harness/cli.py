"""`ipa-bench`: the command-line entry point. Each command's module contributes its subparser;
this module assembles them and applies the exit-code convention (`harness.options`):

    0  done, everything checked passed        2  bad arguments or input; nothing ran
    1  done, something checked failed          3  an unexpected exception (a bug): traceback
  130  interrupted (a sweep's finished rows are on disk; rerun to resume)
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from harness import check, compare, diagnose, options, plots, report, sweep
from harness.errors import RunFailure
from harness.version import __version__
from variants.problem import IPAInputError


class OneLineParser(argparse.ArgumentParser):
    """argparse with usage errors as one line (`prog: error: ...`) and exit status 2; the
    usage stays in `--help`. Subcommand parsers inherit the class."""

    def error(self, message: str):
        self.exit(options.EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ipa-bench",
        description="Benchmark and check Invariant Point Attention implementations "
        "against a float64 oracle.",
        epilog="Exit status: 0 passed, 1 something checked failed, 2 usage error, "
        "3 internal error (a bug; traceback printed), 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"ipa-bench {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check.add_list_parser(subparsers)
    check.add_check_parser(subparsers)
    sweep.add_parser(subparsers)
    plots.add_parser(subparsers)
    report.add_parser(subparsers)
    diagnose.add_parser(subparsers)
    compare.add_parser(subparsers)
    return parser


def _one_line(exc: BaseException) -> str:
    return " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except IPAInputError as exc:  # raised by argument and input-file checks, before any run
        print(f"ipa-bench {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return options.EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`ipa-bench list --json | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return options.EXIT_OK
    except RunFailure as exc:  # stopped by its environment (a full disk), results intact
        print(f"ipa-bench {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return options.EXIT_FAILED
    except KeyboardInterrupt:
        print(f"ipa-bench {args.command}: interrupted", file=sys.stderr)
        return options.EXIT_INTERRUPTED
    except Exception:  # noqa: BLE001 - a bug: show where, with the convention's exit code
        traceback.print_exc()
        print(f"ipa-bench {args.command}: internal error (the traceback above); please report "
              "it with the command line", file=sys.stderr)
        return options.EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
