"""`python -m experiments SUBCOMMAND ...`: expand, run and compare experiment manifests.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`main(args) -> int`; this file only dispatches, so a new subcommand is one line below.
"""
from __future__ import annotations

import sys

from launcher.subcommands import command_line

SUBCOMMANDS = {
    "expand": "experiments.grid.expand",
    "run": "experiments.grid.run",
    "compare": "experiments.compare.command",
}
main = command_line("python -m experiments", __doc__, SUBCOMMANDS)

if __name__ == "__main__":
    sys.exit(main())
