"""One chunk of documents -> one uint16 shard per split, written then renamed, plus a manifest.

Runs in worker processes. A chunk is finished when its manifest (OUT/.progress/chunk-N.json)
exists: it is written after the shards are renamed into place, so a run killed at any point
leaves either a finished chunk or one that the next run redoes. Temp files carry a leading dot
and the pid, and are never read.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataPrepError
from .files import write_json_atomically
from .meta import SPLITS, TOKEN_BYTES
from .plan import PROGRESS_DIR, Chunk
from .sources import SourceSpec, read_segment
from .tokenizer import EOT_TOKEN, RanksSource, ranks_sha256

UTF8_HELP = ("Fix the file, or pass --on-bad-utf8 replace to substitute U+FFFD for the bad bytes "
             "(each such document is counted in the log and in meta.json).")


def shard_name(split: str, chunk_index: int) -> str:
    return f"{split}-{chunk_index:06d}.bin"


def manifest_path(out: Path, chunk_index: int) -> Path:
    return out / PROGRESS_DIR / f"chunk-{chunk_index:06d}.json"


def to_valid_text(content: str | bytes, where: str, on_bad_utf8: str) -> tuple[str, bool]:
    """(text, whether bad bytes were replaced). Strings may hold lone surrogates (bytes that
    were not UTF-8 in a .jsonl line, or escaped surrogates); they get the same policy."""
    try:
        if isinstance(content, bytes):
            return content.decode("utf-8"), False
        content.encode("utf-8")
        return content, False
    except (UnicodeDecodeError, UnicodeEncodeError) as e:
        if on_bad_utf8 == "error":
            raw = e.object[e.start:e.start + 8]
            raise DataPrepError(f"{where}: not UTF-8 at position {e.start} ({raw!r}). {UTF8_HELP}") from e
    if isinstance(content, str):
        try:  # surrogate escapes back to the file's bytes: one U+FFFD per bad byte, as for .txt
            content = content.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # an escaped lone surrogate (JSON "\ud800") has no original bytes
            content = content.encode("utf-8", "surrogatepass")
    return content.decode("utf-8", "replace"), True


@dataclass
class WorkerContext:
    spec: SourceSpec
    out: Path
    ranks: RanksSource
    ranks_sha256: str
    val_docs: np.ndarray  # sorted global indices of validation documents
    on_bad_utf8: str
    plan_sha256: str


_context: WorkerContext | None = None
_encoding = None


def init_worker(context: WorkerContext) -> None:
    """Pool initializer: load the encoding once per process (about 0.2 s)."""
    global _context, _encoding
    _context = context
    _encoding = context.ranks.load()
    if ranks_sha256(_encoding) != context.ranks_sha256:
        raise DataPrepError("the worker's GPT-2 ranks differ from the planned ones; is the ranks file changing?")


def _write_shard(path: Path, tokens: np.ndarray) -> str:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    view = memoryview(tokens).cast("B")
    with open(tmp, "wb") as f:
        f.write(view)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return hashlib.sha256(view).hexdigest()


def tokenize_chunk(chunk_row: dict[str, Any]) -> dict[str, Any]:
    """Tokenise one chunk and write its shards and manifest; returns the manifest."""
    assert _context is not None and _encoding is not None, "init_worker was not called"
    ctx, chunk = _context, Chunk.from_json(chunk_row)
    parts: dict[str, list[np.ndarray]] = {split: [] for split in SPLITS}
    docs = {split: 0 for split in SPLITS}
    counts = {"documents_read": 0, "empty_documents_skipped": 0, "bad_utf8_documents_replaced": 0}
    eot = np.array([EOT_TOKEN], dtype=np.uint16)
    lo, hi = np.searchsorted(ctx.val_docs, [chunk.first_doc, chunk.first_doc + chunk.n_docs])
    val_here = set(ctx.val_docs[lo:hi].tolist())
    doc_index = chunk.first_doc
    for segment in chunk.segments:
        for doc in read_segment(ctx.spec, segment):
            split = "val" if doc_index in val_here else "train"
            doc_index += 1
            counts["documents_read"] += 1
            if not doc.content:
                counts["empty_documents_skipped"] += 1
                continue
            text, replaced = to_valid_text(doc.content, doc.where, ctx.on_bad_utf8)
            counts["bad_utf8_documents_replaced"] += replaced
            # disallowed_special=() with no allowed specials: "<|endoftext|>" inside a document
            # is ordinary text, so only our separators are EOT tokens.
            tokens = _encoding.encode_to_numpy(text, disallowed_special=())
            parts[split] += [tokens.astype(np.uint16), eot]
            docs[split] += 1
    if counts["documents_read"] != chunk.n_docs:
        raise DataPrepError(f"chunk {chunk.index} should hold {chunk.n_docs} documents but reading it gave "
                            f"{counts['documents_read']}: the input changed after planning. Delete "
                            f"{ctx.out / PROGRESS_DIR} and prepare again.")
    shards = {}
    for split in SPLITS:
        if not parts[split]:
            continue
        tokens = np.concatenate(parts[split])
        name = shard_name(split, chunk.index)
        sha = _write_shard(ctx.out / name, tokens)
        shards[split] = {"file": name, "tokens": int(tokens.size), "documents": docs[split], "sha256": sha}
    manifest = {"plan_sha256": ctx.plan_sha256, "chunk": chunk.index, "bytes": chunk.n_bytes,
                "shards": shards, "counts": counts}
    write_json_atomically(manifest_path(ctx.out, chunk.index), manifest)
    return manifest


def finished_manifest(out: Path, chunk_index: int, plan_sha256: str) -> dict[str, Any] | None:
    """The chunk's manifest if the chunk is finished for this plan (shards present, right size)."""
    path = manifest_path(out, chunk_index)
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except ValueError:
        return None
    if manifest.get("plan_sha256") != plan_sha256:
        return None
    for shard in manifest["shards"].values():
        file = out / shard["file"]
        if not file.is_file() or file.stat().st_size != shard["tokens"] * TOKEN_BYTES:
            return None
    return manifest
