"""A checkpoint's manifest: every file's size and sha256, plus the identity of the run that
wrote it; written before `latest` moves, verified before anything is loaded.

    step00000040/MANIFEST.json   {"format": 1, "tag": ..., "step": ..., "world_size": ...,
                                  "files": {name: {"size": n, "sha256": hex}},
                                  "identity": {"mlflow_run_id", "run_name", "checkpoint_dir",
                                               "config_sha256", "config": {flat key: value}}}

The manifest is the last file of a checkpoint: a step folder without one is a save that did
not finish (or a checkpoint from before manifests, which only loads if `latest` names it).

Hashing is shared out: file i is hashed by rank i % world, and the verdicts are gathered, so
every rank holds the same answer and reads about 1/world of the bytes. Sizes are checked by
every rank for every file (a truncation seen from any node counts).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

MANIFEST = "MANIFEST.json"
FORMAT = 1
CHUNK = 8 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(mine: dict) -> dict:
    """Union of every rank's dict (one all_gather_object); every rank gets the result."""
    _, world = _world()
    if world == 1:
        return dict(mine)
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, mine)
    merged: dict = {}
    for part in parts:
        merged.update(part)
    return merged


def checkpoint_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()
                  if p.is_file() and p.name != MANIFEST and not p.name.startswith("."))


def write(folder: Path, *, tag: str, step: int, identity: dict[str, Any]) -> dict[str, Any]:
    """Collective (after every rank's files are on disk): hash the folder's files, shared out
    over the ranks; rank 0 writes MANIFEST.json atomically. Returns the manifest."""
    me, world = _world()
    names = checkpoint_files(folder)
    mine = {name: {"size": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)}
            for name in names[me::world]}
    files = _gather(mine)
    manifest = {"format": FORMAT, "tag": tag, "step": step, "world_size": world,
                "files": {name: files[name] for name in names}, "identity": identity}
    if me == 0:
        tmp = folder / f".{MANIFEST}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / MANIFEST)
    return manifest


@dataclass
class Verdict:
    ok: bool
    reason: str = ""                       # why not, naming the file
    manifest: dict[str, Any] | None = None  # None: no (readable) manifest


def read(folder: Path) -> tuple[dict[str, Any] | None, str]:
    path = folder / MANIFEST
    if not path.is_file():
        return None, f"{path} is missing (the save did not finish, or it predates manifests)"
    try:
        manifest = json.loads(path.read_text())
        if not isinstance(manifest.get("files"), dict):
            raise ValueError("no 'files' table")
    except (OSError, ValueError) as err:
        return None, f"{path} is unreadable ({type(err).__name__}: {err})"
    return manifest, ""


def verify(folder: Path) -> Verdict:
    """Collective: every rank calls it for the same folder and gets the same verdict."""
    me, world = _world()
    manifest, reason = read(folder)
    problems: dict[str, str] = {}
    if manifest is not None:
        names = sorted(manifest["files"])
        for name in names:   # sizes: every rank, every file (cheap)
            want = manifest["files"][name]["size"]
            try:
                got = (folder / name).stat().st_size
            except OSError:
                problems[name] = f"{folder / name} is missing"
                continue
            if got != want:
                problems[name] = (f"{folder / name} has {got:,} bytes, the manifest says "
                                  f"{want:,} (truncated or rewritten)")
        for name in names[me::world]:   # contents: shared out
            if name in problems:
                continue
            if sha256_file(folder / name) != manifest["files"][name]["sha256"]:
                problems[name] = (f"{folder / name} fails its sha256 check (its bytes changed "
                                  "after the save)")
    else:
        problems[MANIFEST] = reason
    problems = _gather({f"{me}:{k}": v for k, v in problems.items()})
    if problems:   # the same text on every rank: the first problem by file name
        first = sorted(problems.items(), key=lambda kv: kv[0].split(":", 1)[1])[0][1]
        more = len({k.split(":", 1)[1] for k in problems}) - 1
        return Verdict(False, first + (f" (and {more} more file(s))" if more else ""), manifest)
    return Verdict(True, "", manifest)
