"""`python -m slurm SUBCOMMAND ...`: submit experiment manifests to Slurm and follow them.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`main(args) -> int`; this file only dispatches.
"""
from __future__ import annotations

import sys

from launcher.subcommands import dispatch

SUBCOMMANDS = {
    "submit": "slurm.submit",
    "status": "slurm.status",
    "cancel": "slurm.cancel",
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m slurm", __doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
