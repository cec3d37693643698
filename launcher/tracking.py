"""MLflow logging for one run: resolved config as params, grid axes as tags, batched metrics."""
from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from launcher.job_env import ENV_PARENT_RUN_ID

REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_PARAMS_PER_BATCH = 100   # MLflow's log_batch limits
MAX_METRICS_PER_BATCH = 1000


def resolve_tracking_uri(configured: str | None = None) -> str:
    """Config value, else $MLFLOW_TRACKING_URI, else a sqlite file under <repo>/.cache."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    db = REPO_ROOT / ".cache" / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def _artifact_root(tracking_uri: str) -> str | None:
    """Keep artifacts next to a sqlite store instead of MLflow's cwd-relative ./mlruns."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///")).resolve()
        return (db.parent / "mlflow-artifacts").as_uri()
    return None


STORE_LOCK_WAIT_S = 60.0   # past this, store_lock warns and goes on without the lock
_held = threading.local()    # sqlite paths this thread holds the lock of (store_lock is re-entrant)


@contextmanager
def store_lock(tracking_uri: str):
    """Hold `<db>.lock` (flock) while this process touches a sqlite store first or finds-or-creates
    in it: MLflow creates and migrates a new store's tables on a client's first request, and two
    processes doing that at once fail ("table experiments already exists", "duplicate column name:
    step": two `experiments run` started side by side on a fresh store), as two find-or-creates of
    one experiment or grid run would both create. Other stores (servers) need no lock here.
    Re-entrant within a thread. Never a reason to stop: where the lock file cannot be made (a
    read-only store, which no one migrates) or is held past STORE_LOCK_WAIT_S (a stopped holder),
    the caller goes on without it, with a warning in the second case."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    db = str(Path(tracking_uri.removeprefix("sqlite:///")).resolve())
    held = getattr(_held, "paths", None)
    if held is None:
        held = _held.paths = set()
    if db in held:
        yield
        return
    try:
        Path(db).parent.mkdir(parents=True, exist_ok=True)
        handle = open(f"{db}.lock", "a")
    except OSError:
        yield
        return
    with handle:
        locked = _flock_within(handle, STORE_LOCK_WAIT_S)
        if not locked:
            print(f"warning: {db}.lock has been held for {STORE_LOCK_WAIT_S:.0f} s (a stopped process?); "
                  "going on without it", file=sys.stderr, flush=True)
        held.add(db)
        try:
            yield
        finally:
            held.discard(db)
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _flock_within(handle, seconds: float) -> bool:
    """An exclusive flock on handle, waiting up to `seconds`; False if it was not had (or the file
    system has no locks)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        except OSError:   # ENOLCK and the like: a file system without flock
            return False


def mlflow_client(tracking_uri: str):
    """An MlflowClient of `tracking_uri`, made under store_lock: making one creates and migrates a
    new sqlite store. Every client of the project's stores comes from here."""
    # Runs happen on offline clusters and CI; no usage pings unless a user opts in.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    with store_lock(tracking_uri):
        return MlflowClient(tracking_uri)


def experiment_id(client, name: str, tracking_uri: str, artifact_location: str | None = None) -> str:
    """The id of MLflow experiment `name`, created if missing (artifacts next to a sqlite store
    unless `artifact_location` says otherwise), under store_lock."""
    from mlflow.exceptions import MlflowException

    with store_lock(tracking_uri):
        found = client.get_experiment_by_name(name)
        if found:
            return found.experiment_id
        try:
            return client.create_experiment(name, artifact_location=artifact_location or _artifact_root(tracking_uri))
        except MlflowException:   # a server's store (no lock here): another process created it first
            found = client.get_experiment_by_name(name)
            if found:
                return found.experiment_id
            raise


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{'a': {'b': 1}} -> {'a.b': '1'}; MLflow params are flat strings."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = str(value)
    return flat


PARENT_RUN_TAG = "mlflow.parentRunId"     # MLflow's own tag: the UI nests the run under it


def nesting_tags() -> dict[str, str]:
    """MLflow's parent tag when a grid started this run ($SAGEBWD_PARENT_RUN_ID): the UI then
    folds the run under the grid's parent run, and `experiments compare` finds it there."""
    parent = os.environ.get(ENV_PARENT_RUN_ID)
    return {PARENT_RUN_TAG: parent} if parent else {}


class MlflowRun:
    """One MLflow run, created by rank 0 (or reopened on resume). Metrics are buffered and
    written with log_batch, because each sqlite write costs ~20 ms, which would dominate a
    tiny CPU step."""

    def __init__(self, client, run_id: str, tracking_uri: str, system_metrics: bool,
                 logged_through: int = 0):
        from mlflow.entities import RunTag

        self.client, self.run_id, self.tracking_uri = client, run_id, tracking_uri
        # Steps at or below this are in the store already (a resumed run replays them).
        self.logged_through = logged_through
        self._pending: list = []
        self._tag_cls = RunTag
        self._monitor = _start_system_metrics(run_id, tracking_uri) if system_metrics else None

    @classmethod
    def create(cls, *, experiment: str, run_name: str | None, params: dict[str, Any],
               tags: dict[str, str], config_yaml: str, tracking_uri: str | None = None,
               system_metrics: bool = False) -> "MlflowRun":
        client, uri = _client(tracking_uri)
        run_id = client.create_run(experiment_id(client, experiment, uri), run_name=run_name,
                                   tags={**tags, **nesting_tags()}).info.run_id
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in flatten(params).items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            client.log_batch(run_id, params=items[i:i + MAX_PARAMS_PER_BATCH])
        client.log_text(run_id, config_yaml, "config.yaml")
        return cls(client, run_id, uri, system_metrics)

    @classmethod
    def reopen(cls, run_id: str, tracking_uri: str | None = None,
               system_metrics: bool = False, step_key: str = "loss") -> "MlflowRun":
        """A resumed run logs into the run it started (params are already there).

        A run killed after its last checkpoint has logged steps past it; the resumed run
        replays those steps bit-identically, so they are not logged a second time (the
        latest step of `step_key` in the store says how far the first attempt got; its
        timing metrics for those steps are kept)."""
        client, uri = _client(tracking_uri)
        client.update_run(run_id, status="RUNNING")
        logged = max((m.step for m in client.get_metric_history(run_id, step_key)), default=0)
        return cls(client, run_id, uri, system_metrics, logged_through=logged)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        if step <= self.logged_through:
            return
        now = int(time.time() * 1000)
        self._pending.extend(Metric(k, float(v), now, step) for k, v in metrics.items())

    def flush(self) -> None:
        for i in range(0, len(self._pending), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=self._pending[i:i + MAX_METRICS_PER_BATCH])
        self._pending.clear()

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[self._tag_cls(k, str(v)) for k, v in tags.items()])

    def log_json(self, data: dict[str, Any], name: str) -> None:
        self.client.log_dict(self.run_id, data, name)

    def finish(self, status: str = "FINISHED") -> None:
        self.flush()
        if self._monitor is not None:
            self._monitor.finish()
        self.client.set_terminated(self.run_id, status=status)


def _client(tracking_uri: str | None):
    uri = resolve_tracking_uri(tracking_uri)
    return mlflow_client(uri), uri


def _start_system_metrics(run_id: str, tracking_uri: str):
    """MLflow's sampler thread (CPU, memory, GPU where pynvml is there) logging into run_id."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        # resume_logging: a resumed run continues the system metrics' step count
        monitor = SystemMetricsMonitor(run_id, resume_logging=True, tracking_uri=tracking_uri)
        monitor.start()
        return monitor
    except Exception as err:  # a sampler is not worth stopping a training run for
        print(f"warning: MLflow system metrics are off ({type(err).__name__}: {err})", flush=True)
        return None


def config_to_yaml(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False)


def probe_tracking_uri(uri: str, timeout_s: float = 3.0) -> str | None:
    """None if the tracking store answers within seconds, else why not (one line).

    For an http(s) server: a TCP connect, then GET /health. Local stores (sqlite, file) are
    not probed: their failures show up on the first write, which the journal absorbs."""
    from urllib.parse import urlparse

    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return None
    import socket
    import urllib.error
    import urllib.request

    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout_s):
            pass
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as reply:
            reply.read(64)
    except urllib.error.HTTPError:
        return None    # it answers (a server without /health, or behind a proxy)
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return None
