"""The logging every command of the suite starts with: the project's own progress lines
(INFO, bare messages) and only warnings and errors from the libraries underneath.

MLflow logs its database set-up and its system-metrics sampler at INFO to the same stream
as the training progress; it reads MLFLOW_LOGGING_LEVEL when it is first imported (and
child processes inherit it), so the level is set there and on its logger in case it was
imported already. DeepSpeed's logger stays at warnings; its "unable to detect" accelerator
warning on CPU-only machines is answered at its source, launcher.distributed, which tells
DeepSpeed that a CPU world is meant.
"""
from __future__ import annotations

import logging
import os


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    logging.getLogger("mlflow").setLevel(os.environ["MLFLOW_LOGGING_LEVEL"].upper())
