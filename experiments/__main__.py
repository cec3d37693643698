"""`python -m experiments SUBCOMMAND ...`: expand and run experiment manifests.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`main(args) -> int`; this file only dispatches, so a new subcommand is one line below.
"""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "expand": "experiments.manifest_expand",
    "run": "experiments.manifest_run",
    "compare": "experiments.compare",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=module.__doc__.strip().splitlines()[0],
                                  description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
