"""The subcommand dispatcher of `python -m experiments` and `python -m slurm`.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`main(args) -> int`; a CLI is then a dict of names to module paths. It lives here, in the
lowest layer both CLIs import, so neither borrows from the other.
"""
from __future__ import annotations

import argparse
import importlib
from typing import Callable

from launcher.logs import configure_logging


def build_parser(prog: str, description: str, subcommands: dict[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, module_name in subcommands.items():
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=module.__doc__.strip().splitlines()[0],
                                  description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.main)
    return parser


def dispatch(prog: str, description: str, subcommands: dict[str, str], argv: list[str] | None) -> int:
    args = build_parser(prog, description, subcommands).parse_args(argv)
    configure_logging()
    return args.run(args)


def command_line(prog: str, description: str,
                 subcommands: dict[str, str]) -> Callable[[list[str] | None], int]:
    """A CLI's `main(argv=None) -> exit code`."""
    return lambda argv=None: dispatch(prog, description, subcommands, argv)
