"""SIGTERM and SIGUSR1 ask the run to checkpoint and exit at the end of the current step.

The handler only sets a flag: saving inside a handler could interrupt a collective. Ranks
agree on stopping through a per-step vote in host memory (launcher.distributed.any_rank; a
signal may reach only some ranks).
"""
from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    def __init__(self) -> None:
        self.signal_name: str | None = None

    def install(self) -> "StopRequest":
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may install handlers (e.g. a caller's worker)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        self.signal_name = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self.signal_name is not None
