"""The plan of a prepare run: the source's documents cut into chunks, one shard per split each.

A chunk is a run of consecutive documents with at most `shard_bytes` bytes of text (a single
larger document gets a chunk of its own). A BPE token covers at least one byte, so a chunk's
shard holds at most shard_bytes tokens plus one EOT per document: bounded shards, known
before any tokenising. The plan is saved in OUT/.progress/plan.json; a resumed run reuses it
when the settings and the input files are unchanged, so chunk i always means the same documents.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from .config import PrepareConfig
from .errors import DataPrepError, OtherPrepareError
from .files import sha256_bytes, write_json_atomically
from .sources import Segment, SourceSpec, describe_units, list_units, plan_pieces
from .split import count_val_documents

log = logging.getLogger(__name__)

PROGRESS_DIR = ".progress"
PLAN_FILE = "plan.json"


@dataclass
class Chunk:
    index: int
    first_doc: int
    n_docs: int = 0
    n_bytes: int = 0
    segments: list[Segment] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "first_doc": self.first_doc, "n_docs": self.n_docs,
                "n_bytes": self.n_bytes, "segments": [s.to_json() for s in self.segments]}

    @staticmethod
    def from_json(row: dict[str, Any]) -> Chunk:
        return Chunk(row["index"], row["first_doc"], row["n_docs"], row["n_bytes"],
                     [Segment.from_json(s) for s in row["segments"]])


@dataclass
class Plan:
    identity: dict[str, Any]
    ranks_sha256: str
    units: list[dict[str, Any]]
    n_docs: int
    n_val: int
    chunks: list[Chunk]
    ignored_files: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"identity": self.identity, "ranks_sha256": self.ranks_sha256, "units": self.units,
                "n_docs": self.n_docs, "n_val": self.n_val, "ignored_files": self.ignored_files,
                "chunks": [c.to_json() for c in self.chunks]}

    @property
    def sha256(self) -> str:
        return sha256_bytes(json.dumps(self.to_json(), sort_keys=True).encode())

    @property
    def n_bytes(self) -> int:
        return sum(c.n_bytes for c in self.chunks)

    @staticmethod
    def from_json(row: dict[str, Any]) -> Plan:
        return Plan(row["identity"], row["ranks_sha256"], row["units"], row["n_docs"], row["n_val"],
                    [Chunk.from_json(c) for c in row["chunks"]], row["ignored_files"])


def source_spec(config: PrepareConfig) -> SourceSpec:
    return SourceSpec(kind=config.source, input=config.input, text_field=config.text_field,
                      hf_split=config.hf_split, hf_config=config.hf_config, hf_revision=config.hf_revision,
                      load_workers=config.workers)


def pack_chunks(spec: SourceSpec, shard_bytes: int, on_chunk: Callable[[Chunk], None] = lambda c: None) -> list[Chunk]:
    chunks: list[Chunk] = []
    current = Chunk(index=0, first_doc=0)
    for piece in plan_pieces(spec, shard_bytes):
        if current.n_docs and current.n_bytes + piece.n_bytes > shard_bytes:
            on_chunk(current)
            chunks.append(current)
            current = Chunk(index=len(chunks), first_doc=current.first_doc + current.n_docs)
        last = current.segments[-1] if current.segments else None
        if last and last.unit == piece.unit and last.stop == piece.start:
            current.segments[-1] = Segment(last.unit, last.start, piece.stop)
        else:
            current.segments.append(Segment(piece.unit, piece.start, piece.stop))
        current.n_docs += piece.n_docs
        current.n_bytes += piece.n_bytes
    if current.n_docs:
        on_chunk(current)
        chunks.append(current)
    return chunks


def make_plan(config: PrepareConfig, spec: SourceSpec, ranks_sha256: str) -> Plan:
    ignored = list_units(spec)
    if ignored:
        shown = ", ".join(ignored[:5]) + (f" and {len(ignored) - 5} more" if len(ignored) > 5 else "")
        log.info("ignoring %d file(s) that are not .txt/.jsonl/.parquet or are hidden: %s", len(ignored), shown)
    log.info("planning: %s", describe_units(spec))
    # Planning reads every .jsonl line once (to count documents and find chunk ends): minutes at 40 GB.
    total = sum(u["size"] for u in spec.units) if spec.kind == "dir" else None
    with tqdm(total=total, unit="B", unit_scale=True, desc="planning", disable=None) as bar:
        chunks = pack_chunks(spec, config.shard_bytes, on_chunk=lambda chunk: bar.update(chunk.n_bytes))
    n_docs = sum(c.n_docs for c in chunks)
    if n_docs == 0:
        raise DataPrepError(f"found no documents in {config.input} ({describe_units(spec)}; "
                            f"{len(ignored)} other file(s) ignored). A dir source reads .txt files (one "
                            "document each) and .jsonl/.parquet files (one per line/row) under --input.")
    return Plan(config.identity(), ranks_sha256, spec.units, n_docs,
                count_val_documents(n_docs, config.val_fraction), chunks, ignored)


def load_or_make_plan(config: PrepareConfig, spec: SourceSpec, ranks_sha256: str) -> Plan:
    """The saved plan if it is for these settings and unchanged input files, else a new one.

    A saved plan with other settings or changed input means OUT holds (part of) a different
    data set: that is an error, not something to overwrite silently.
    """
    path = Path(config.out) / PROGRESS_DIR / PLAN_FILE
    if not path.is_file():
        plan = make_plan(config, spec, ranks_sha256)
        write_json_atomically(path, plan.to_json())
        return plan
    saved = Plan.from_json(json.loads(path.read_text()))
    list_units(spec)
    differences = [f"{key}: was {saved.identity.get(key)!r}, now {value!r}"
                   for key, value in config.identity().items() if saved.identity.get(key) != value]
    if saved.ranks_sha256 != ranks_sha256:
        differences.append(f"tokenizer ranks sha256: was {saved.ranks_sha256}, now {ranks_sha256}")
    if saved.units != spec.units:
        differences.append("the input files changed (names, sizes or modification times)")
    if differences:
        raise OtherPrepareError(f"{config.out} holds a prepare run with other settings or input:\n  "
                            + "\n  ".join(differences)
                            + f"\nUse a new --out, or delete {config.out} to start over.")
    spec.units = saved.units
    return saved
