"""The trainer's MLflow run, through the journal (launcher.journal): the same calls as
launcher.tracking.MlflowRun, but nothing here waits on the tracking server.

start/resume probe the tracking URI (a few seconds at most) and create or reopen the run
right away when it answers; otherwise they warn and the run is created once it does.
finish() uploads what is pending (bounded), ends the run FINISHED/FAILED/KILLED, and says
how to upload the rest later when the server is still away.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable

from launcher.journal import BackgroundUpload, Journal, Uploader, lock_journal, set_fast_fail_env
from launcher.tracking import (_artifact_root, _start_system_metrics, flatten, nesting_tags,
                              probe_tracking_uri)

DRAIN_S = 60.0   # at most this long at the end of a run to upload what is pending


def _now_ms() -> int:
    return int(time.time() * 1000)


def set_aside(folder: Path, why: str, say: Callable[[str], None]) -> None:
    """Move a journal that belongs to another run out of the way (it is kept)."""
    if folder.is_dir() and any(folder.iterdir()):
        aside = folder.with_name(f"{folder.name}.{why}-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.move(str(folder), str(aside))
        say(f"[tracking] {folder} belongs to another run ({why}); kept as {aside}")


class JournaledRun:
    def __init__(self, journal: Journal, tracking_uri: str, say: Callable[[str], None],
                 logged_through: int = 0):
        set_fast_fail_env()
        self.journal, self.tracking_uri, self.say = journal, tracking_uri, say
        self._lock = lock_journal(journal.folder)
        self.uploader = Uploader(journal, tracking_uri)
        self.background = BackgroundUpload(self.uploader, say)
        # Steps at or below this are in the journal already (a resumed run replays them).
        self.logged_through = logged_through
        self._monitor = None
        self.offline_at_start: str | None = None

    @property
    def run_id(self) -> str | None:
        return self.uploader.run_id

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def start(cls, folder: Path, *, experiment: str, run_name: str, params: dict[str, Any],
              tags: dict[str, str], config_yaml: str, tracking_uri: str,
              say: Callable[[str], None], system_metrics: bool = False,
              previous: str = "earlier-run") -> "JournaledRun":
        set_aside(folder, previous, say)
        journal = Journal(folder)
        journal.append({"op": "create", "ts": _now_ms(), "experiment": experiment,
                        "run_name": run_name, "tags": {**tags, **nesting_tags()},
                        "params": flatten(params),
                        "config_yaml": config_yaml,
                        "artifact_location": _artifact_root(tracking_uri)})
        run = cls(journal, tracking_uri, say)
        run._connect(system_metrics)
        return run

    @classmethod
    def resume(cls, folder: Path, *, step: int, tracking_uri: str, say: Callable[[str], None],
               legacy_run_id: str | None = None,
               system_metrics: bool = False) -> "JournaledRun | None":
        """Continue the run the journal (or, for a checkpoint from before journals,
        legacy_run_id) names. None: there is neither (the caller starts a new run)."""
        journal = Journal(folder)
        if journal.count == 0:
            if not legacy_run_id:
                return None
            journal.append({"op": "attach", "ts": _now_ms(), "run_id": legacy_run_id})
            logged = _legacy_logged_through(legacy_run_id, tracking_uri, step)
        else:
            logged = journal.max_step("loss")
        journal.append({"op": "resume", "ts": _now_ms(), "step": step})
        run = cls(journal, tracking_uri, say, logged_through=logged)
        run._connect(system_metrics)
        return run

    def _connect(self, system_metrics: bool) -> None:
        problem = probe_tracking_uri(self.tracking_uri)
        if problem is None and self.background.attempt():
            if system_metrics and self.run_id:
                self._monitor = _start_system_metrics(self.run_id, self.tracking_uri)
        else:
            self.offline_at_start = problem or self.background.last_error
            if problem is not None:   # attempt() has said it otherwise
                self.background.offline_since = time.monotonic()
                self.say(f"warning: MLflow tracking URI {self.tracking_uri} is not reachable "
                         f"({problem}); training goes on, metrics go to {self.journal.path} and "
                         "are uploaded when it answers")
        self.background.start()

    # -- the MlflowRun calls ------------------------------------------------------------------
    def log_metrics(self, step: int, metrics: dict[str, float], ts_ms: int | None = None) -> None:
        """ts_ms: when the step ran, if it is logged later (the trainer reads its steps' values
        in batches); now by default."""
        if step <= self.logged_through:
            return
        self.journal.append({"op": "metrics", "step": step, "ts": ts_ms or _now_ms(),
                             "values": {k: float(v) for k, v in metrics.items()}})

    def flush(self) -> None:
        """Wake the uploader; returns at once."""
        self.background.notify()

    def sync_to_disk(self) -> None:
        """fsync the journal (before a checkpoint names its steps) and wake the uploader."""
        self.journal.sync_to_disk()
        self.background.notify()

    def set_tags(self, tags: dict[str, str]) -> None:
        self.journal.append({"op": "tags", "ts": _now_ms(),
                             "tags": {k: str(v) for k, v in tags.items()}})

    def log_json(self, data: dict[str, Any], name: str) -> None:
        self.journal.append({"op": "json", "ts": _now_ms(), "name": name, "data": data})

    def finish(self, status: str = "FINISHED", drain_s: float = DRAIN_S) -> int:
        """End the run; -> the number of records MLflow does not hold yet."""
        self.journal.append({"op": "end", "ts": _now_ms(), "status": status})
        self.journal.sync_to_disk()
        if self._monitor is not None:
            self._monitor.finish()
        self.background.stop(drain_s)
        self.journal.close()
        pending = self.journal.count - self.uploader.cursor["applied"]
        if pending:
            run = (f"its MLflow run {self.run_id} shows RUNNING" if self.run_id
                   else "its MLflow run is not created yet")
            self.say(f"warning: the run ended {status} but MLflow at {self.tracking_uri} is away "
                     f"({self.background.last_error or 'no answer'}): {pending} records are only "
                     f"in {self.journal.path}, and {run}. Upload them when it is back: "
                     f"python -m launcher.sync {self.journal.folder}")
        self._lock.close()
        return pending


def _legacy_logged_through(run_id: str, tracking_uri: str, step: int) -> int:
    """For a checkpoint from before journals: how far the store's loss history goes."""
    try:
        from launcher.tracking import mlflow_client

        history = mlflow_client(tracking_uri).get_metric_history(run_id, "loss")
        return max((m.step for m in history), default=0)
    except Exception:
        return step
