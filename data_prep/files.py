"""File helpers shared by assets, prepare and verify: hashing and write-then-rename."""

from __future__ import annotations

import hashlib
import json
import os
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
