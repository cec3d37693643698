"""A real `mlflow server` on 127.0.0.1 as a test helper: start, wait until it answers, stop,
and start again on the same port (the tracking-outage tests stop it mid-run)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    """One sqlite store and artifact folder under `folder`; the same port across restarts."""

    def __init__(self, folder: Path, port: int | None = None):
        self.folder, self.port = folder, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True, timeout_s: float = 240) -> "MlflowServer":
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"}
        with open(self.log, "a") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                 "--port", str(self.port),
                 "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
                 "--artifacts-destination", str(self.folder / "artifacts"), "--workers", "1"],
                cwd=self.folder, env=env, stdout=sink, stderr=subprocess.STDOUT)
        if wait:
            self.wait_until_up(timeout_s)
        return self

    def wait_until_up(self, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"mlflow server exited with {self.proc.returncode}:\n"
                            f"{self.log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2).close()
                return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"mlflow server did not answer within {timeout_s} s:\n"
                    f"{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
