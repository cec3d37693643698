"""`python -m slurm SUBCOMMAND ...`: submit experiment manifests to Slurm and follow them.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`main(args) -> int`; this file only dispatches.
"""
from __future__ import annotations

import sys

from launcher.subcommands import command_line

SUBCOMMANDS = {
    "submit": "slurm.submit",
    "status": "slurm.status",
    "cancel": "slurm.cancel",
}
main = command_line("python -m slurm", __doc__, SUBCOMMANDS)

if __name__ == "__main__":
    sys.exit(main())
