"""Tracking that never stops training: a local append-only journal, uploaded to MLflow in the
background.

    <checkpoint.dir>/tracking/journal.jsonl   one JSON record a line, in order: create / resume
                                               / metrics / tags / json / end
    <checkpoint.dir>/tracking/cursor.json     how many records MLflow holds, and the run id
    <checkpoint.dir>/tracking/lock            held (flock) by the one process uploading

The trainer only appends to the journal (a write and a flush per step: microseconds, see
docs/reliability.md); a thread (`Uploader`) replays the records that MLflow does not hold
yet, in order, batched (up to 1000 metrics per log_batch), and retries with backoff while the
tracking server is away. Records carry their own timestamps, so a gap filled later has the
times of the steps, and a record sent twice (a crash between a send and the cursor update)
holds the same values. A run that ends with records still pending says so, and
`python -m launcher.sync DIR` uploads them later (W&B's offline sync, for MLflow).

Runs without checkpoint.dir keep their journal under <repo>/.cache/journal/.
"""
from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

JOURNAL, CURSOR, LOCK = "journal.jsonl", "cursor.json", "lock"
MAX_METRICS_PER_BATCH = 1000   # MLflow's log_batch limits
MAX_PARAMS_PER_BATCH = 100
# One attempt per upload, ~seconds to fail: the uploader retries by itself, on its own clock.
# (MLflow's defaults, 7 retries with backoff factor 2 and a 120 s timeout, held the trainer
# for 263 s before step 1 with no server; see docs/reliability.md.)
MLFLOW_FAST_FAIL = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


class JournalError(RuntimeError):
    """A journal that cannot be used (unreadable, or another process is uploading it)."""


def set_fast_fail_env() -> None:
    for key, value in MLFLOW_FAST_FAIL.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


class Journal:
    """The append-only record file of one run, and its upload cursor."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / JOURNAL
        self._seek = (0, 0)   # (line index, byte offset) of a known line start
        self._repair_tail()
        self.count = sum(1 for _ in self._lines())
        self._file = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def _repair_tail(self) -> None:
        """Drop a torn last line (a process killed mid-write), so appends start clean."""
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)

    def _lines(self, start: int = 0) -> Iterator[bytes]:
        """Complete lines from index `start` (a cached offset skips the ones before it)."""
        if not self.path.is_file():
            return
        index, offset = self._seek if start >= self._seek[0] else (0, 0)
        with open(self.path, "rb") as f:
            f.seek(offset)
            for line in f:
                if not line.endswith(b"\n"):
                    return
                if index >= start:
                    if index == start:
                        self._seek = (index, offset)
                    yield line
                index, offset = index + 1, offset + len(line)

    def append(self, record: dict[str, Any]) -> int:
        """Write one record (flushed to the OS: it survives a killed process). -> its index."""
        with self._lock:
            record = {"i": self.count, **record}
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._file.flush()
            self.count += 1
            return self.count - 1

    def sync_to_disk(self) -> None:
        """fsync: the records survive a lost node too (at checkpoints and at the end)."""
        with self._lock:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()

    def records(self, start: int = 0) -> Iterator[dict[str, Any]]:
        for line in self._lines(start):
            yield json.loads(line)

    def max_step(self, key: str = "loss") -> int:
        """The last step whose `key` the journal holds (0 if none): a resumed run replays the
        steps past its checkpoint bit for bit and does not log them a second time."""
        best = 0
        for record in self.records():
            if record.get("op") == "metrics" and key in record.get("values", {}):
                best = max(best, record["step"])
        return best

    # -- the cursor ---------------------------------------------------------------------
    def read_cursor(self) -> dict[str, Any]:
        path = self.folder / CURSOR
        if not path.is_file():
            return {"applied": 0, "run_id": None}
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise JournalError(f"{path} is unreadable ({err}); delete it to upload the whole "
                               "journal again (MLflow keeps one copy of a re-sent metric)") from err

    def write_cursor(self, cursor: dict[str, Any]) -> None:
        path = self.folder / CURSOR
        tmp = path.with_name(f".{CURSOR}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(cursor))
        os.replace(tmp, path)

    def pending(self) -> int:
        return self.count - self.read_cursor()["applied"]


def lock_journal(folder: Path):
    """An exclusive lock on the journal's uploads (one uploader at a time), or JournalError."""
    handle = open(folder / LOCK, "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise JournalError(f"{folder} is being uploaded by another process (a running trainer "
                           "or launcher.sync); wait for it to end") from None
    return handle


class Uploader:
    """Replays a journal's pending records into MLflow, in order."""

    def __init__(self, journal: Journal, tracking_uri: str):
        from launcher.tracking import mlflow_client

        set_fast_fail_env()
        self.journal, self.tracking_uri = journal, tracking_uri
        self.client = mlflow_client(tracking_uri)
        self.cursor = journal.read_cursor()
        if not self.cursor.get("tracking_uri"):   # where the records go (launcher.sync reads it)
            self._save(tracking_uri=tracking_uri)

    @property
    def run_id(self) -> str | None:
        return self.cursor.get("run_id")

    def _save(self, applied: int | None = None, **extra) -> None:
        if applied is not None:
            self.cursor["applied"] = applied
        self.cursor.update(extra)
        self.journal.write_cursor(self.cursor)

    def upload(self, limit: int | None = None) -> int:
        """Apply the pending records (raises on the first failure, keeping what went in).
        -> the number applied."""
        done, batch, batch_end = 0, [], None
        for record in self.journal.records(self.cursor["applied"]):
            if limit is not None and done >= limit:
                break
            if record["op"] == "metrics":
                batch.extend(_metrics(record))
                batch_end = record["i"] + 1
                done += 1
                if len(batch) >= MAX_METRICS_PER_BATCH:
                    self._log_metrics(batch, batch_end)
                    batch, batch_end = [], None
                continue
            if batch:
                self._log_metrics(batch, batch_end)
                batch, batch_end = [], None
            self._apply(record)
            self._save(record["i"] + 1)
            done += 1
        if batch:
            self._log_metrics(batch, batch_end)
        return done

    def _log_metrics(self, metrics: list, applied: int) -> None:
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self._need_run(), metrics=metrics[i:i + MAX_METRICS_PER_BATCH])
        self._save(applied)

    def _need_run(self) -> str:
        if not self.run_id:
            raise JournalError(f"{self.journal.path} logs to a run before creating it (its first "
                               "record is not 'create'); the journal is damaged")
        return self.run_id

    def _apply(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Param, RunTag

        from launcher.tracking import experiment_id
        op, client = record["op"], self.client
        if op == "create":
            if not self.run_id:   # a retry after create_run went through keeps that run
                exp_id = experiment_id(client, record["experiment"], self.tracking_uri,
                                       record.get("artifact_location"))
                run = client.create_run(exp_id, run_name=record["run_name"],
                                        tags=record["tags"], start_time=record["ts"])
                self._save(run_id=run.info.run_id)
            params = [Param(k, v) for k, v in record["params"].items()]
            for i in range(0, len(params), MAX_PARAMS_PER_BATCH):
                client.log_batch(self.run_id, params=params[i:i + MAX_PARAMS_PER_BATCH])
            client.log_text(self.run_id, record["config_yaml"], "config.yaml")
        elif op == "attach":      # a run created before journals (a legacy checkpoint)
            self._save(run_id=record["run_id"])
            client.update_run(record["run_id"], status="RUNNING")
        elif op == "resume":
            client.update_run(self._need_run(), status="RUNNING")
        elif op == "tags":
            client.log_batch(self._need_run(),
                             tags=[RunTag(k, str(v)) for k, v in record["tags"].items()])
        elif op == "json":
            client.log_dict(self._need_run(), record["data"], record["name"])
        elif op == "end":
            client.set_terminated(self._need_run(), status=record["status"],
                                  end_time=record["ts"])
        else:
            raise JournalError(f"{self.journal.path}: record {record['i']} has unknown op "
                               f"{op!r}")


def _metrics(record: dict[str, Any]) -> list:
    from mlflow.entities import Metric

    return [Metric(k, float(v), record["ts"], record["step"]) for k, v in record["values"].items()]


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:160] if text else ''}"


class BackgroundUpload:
    """The uploader on a thread: wakes on notify() or every `interval` s; while MLflow is
    away it retries with backoff (1 s doubling to 30 s) and says so once per outage."""

    def __init__(self, uploader: Uploader, say: Callable[[str], None], interval: float = 5.0):
        self.uploader, self.say, self.interval = uploader, say, interval
        self.offline_since: float | None = None
        self.last_error = ""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlflow-journal-upload",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def notify(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        backoff = 1.0
        while True:
            self._wake.wait(backoff if self.offline_since else self.interval)
            self._wake.clear()
            stopping = self._stop.is_set()
            self.attempt()
            backoff = 1.0 if self.offline_since is None else min(backoff * 2, 30.0)
            if stopping:
                return

    def attempt(self) -> bool:
        try:
            pending = self.uploader.journal.count - self.uploader.cursor["applied"]
            if pending:
                self.uploader.upload()
            if self.offline_since is not None:
                self.say(f"MLflow at {self.uploader.tracking_uri} is reachable again after "
                         f"{time.monotonic() - self.offline_since:.0f} s: uploaded the "
                         f"{pending} journal records it missed, in order")
            self.offline_since, ok = None, True
        except Exception as err:   # any failure of the store: keep training, keep the journal
            self.last_error = _one_line(err)
            if self.offline_since is None:
                self.offline_since = time.monotonic()
                self.say(f"warning: MLflow at {self.uploader.tracking_uri} failed "
                         f"({self.last_error}); training goes on, metrics stay in "
                         f"{self.uploader.journal.path} and are uploaded when it is back")
            ok = False
        return ok

    def stop(self, timeout: float) -> None:
        """Upload what is pending (one more attempt at least), then end the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        else:
            self.attempt()


def default_journal_dir(checkpoint_dir: str | None, experiment: str, run_name: str) -> Path:
    if checkpoint_dir:
        return Path(checkpoint_dir) / "tracking"
    from launcher.tracking import REPO_ROOT

    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{experiment}-{run_name}")
    return REPO_ROOT / ".cache" / "journal" / f"{safe}-{stamp}-{os.getpid()}"
