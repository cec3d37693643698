"""The ledger: which run was submitted as which Slurm job, so that a second submit of the
same manifest skips runs that are queued, running or finished.

One JSON line per submission in <runs_dir>/slurm-ledger.jsonl; a run's latest line is the
one that counts. A file lock makes check-then-submit atomic across concurrent submits.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from slurm.commands import ACTIVE_STATES, UNKNOWN
from slurm.render import EXIT_FILE

LEDGER_FILE = "slurm-ledger.jsonl"


@dataclass(frozen=True)
class Entry:
    run: str            # run name (unique across node types: it names the run folder)
    grid: str           # manifest name
    node: str
    job_id: str         # "123", or "123_4" for task 4 of array 123
    script: str
    log: str
    run_dir: str
    submitted_at: str


class Ledger:
    def __init__(self, runs_dir: Path):
        self.path = Path(runs_dir) / LEDGER_FILE

    @contextlib.contextmanager
    def locked(self) -> Iterator["Ledger"]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield self

    def entries(self) -> list[Entry]:
        if not self.path.is_file():
            return []
        entries = []
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    entries.append(Entry(**json.loads(line)))
                except (json.JSONDecodeError, TypeError) as err:
                    raise ValueError(f"{self.path}:{number}: not a ledger entry ({err}); fix or "
                                     "delete that line") from None
        return entries

    def latest(self, grid: str | None = None) -> dict[str, Entry]:
        """run name -> its most recent submission (optionally only runs of one manifest)."""
        return {e.run: e for e in self.entries() if grid is None or e.grid == grid}

    def append(self, entries: list[Entry]) -> None:
        with open(self.path, "a") as f:
            for entry in entries:
                f.write(json.dumps(asdict(entry)) + "\n")


def exit_status(entry: Entry) -> int | None:
    """The status the job script recorded at its end, if this job wrote one."""
    path = Path(entry.run_dir) / EXIT_FILE
    try:
        job_id, status = path.read_text().split()
    except (OSError, ValueError):
        return None
    return int(status) if job_id == entry.job_id else None


def blocking_reason(entry: Entry, state: str) -> str | None:
    """Why this run must not be submitted again, or None if a resubmit is fine (it failed,
    was cancelled or timed out; a resubmitted run resumes from its checkpoint)."""
    if state in ACTIVE_STATES:
        return f"job {entry.job_id} is {state}"
    if state == "COMPLETED":
        return f"finished: job {entry.job_id} COMPLETED"
    if state == UNKNOWN:
        status = exit_status(entry)
        if status == 0:
            return f"finished: job {entry.job_id} exited 0"
        if status is None:
            return (f"job {entry.job_id} is unknown to Slurm and left no exit status in "
                    f"{entry.run_dir}; pass --force to submit it anyway")
    return None
