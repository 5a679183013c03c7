"""`ipa-bench`: the command-line entry point. Each command lives in its own module and
contributes a subparser through `add_parser(subparsers)`; this module only assembles them."""

from __future__ import annotations

import argparse
import sys

from harness import commands
from variants.problem import IPAInputError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ipa-bench",
        description="Benchmark and check Invariant Point Attention implementations "
        "against a float64 oracle.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in commands.modules():
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (IPAInputError, KeyError, FileNotFoundError) as exc:
        print(f"ipa-bench {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
