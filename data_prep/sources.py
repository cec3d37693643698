"""Where documents come from: a folder of .txt/.jsonl/.parquet files, or a HuggingFace dataset.

A source is read twice. Planning (`plan_pieces`) walks it once, cheaply, to count documents
and bytes and to find positions where a chunk may end (a line of a .jsonl file, a row of a
.parquet file or of a dataset). Tokenising (`read_segment`) then reads back one
contiguous segment of one unit, in any worker, in any order. Both walks use the same
document order, which fixes each document's global index and so the train/val split.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataPrepError

log = logging.getLogger(__name__)

DIR_SUFFIXES = (".txt", ".jsonl", ".parquet")
HOW_TO_INSTALL_DATA_EXTRA = "Install the data extra: `.venv/bin/python -m pip install -e '.[data]'`."


@dataclass(frozen=True)
class Piece:
    """The smallest run of documents a chunk boundary may not split: [start, stop) in unit units."""

    unit: int
    start: int
    stop: int
    n_docs: int
    n_bytes: int


@dataclass(frozen=True)
class Segment:
    """A contiguous run of documents of one unit, as stored in the plan."""

    unit: int
    start: int
    stop: int

    def to_json(self) -> list[int]:
        return [self.unit, self.start, self.stop]

    @staticmethod
    def from_json(row: list[int]) -> Segment:
        return Segment(*row)


@dataclass
class RawDocument:
    """One document as read: text (str) or undecoded bytes, and where it came from for errors."""

    where: str
    content: str | bytes | None


@dataclass
class SourceSpec:
    """What prepare reads. kind 'dir': a folder; kind 'hf': a dataset name or a saved-dataset path."""

    kind: str
    input: str
    text_field: str = "text"
    hf_split: str = "train"
    hf_config: str | None = None
    hf_revision: str | None = None
    load_workers: int = 1  # processes for the hub's download and Arrow conversion
    units: list[dict[str, Any]] = field(default_factory=list)  # filled by list_units


# ---------------------------------------------------------------- folder of files

def _list_dir_units(root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    if not root.is_dir():
        raise DataPrepError(f"--input {root} is not a directory. Pass the folder that holds the "
                            f".txt/.jsonl/.parquet files, or use --source hf for a HuggingFace dataset.")
    units, ignored = [], []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            if path.is_file():
                ignored.append(rel)
            continue
        if not path.is_file():
            continue
        if path.suffix not in DIR_SUFFIXES:
            ignored.append(rel)
            continue
        stat = path.stat()
        units.append({"path": rel, "format": path.suffix[1:], "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return units, ignored


def _jsonl_pieces(unit: int, path: Path) -> Iterator[Piece]:
    offset = 0
    with open(path, "rb") as f:
        for line in f:
            yield Piece(unit, offset, offset + len(line), 1, len(line))
            offset += len(line)


def greedy_pieces(unit: int, lengths: np.ndarray, max_bytes: int) -> Iterator[Piece]:
    """Pieces of consecutive rows, each the longest run from its first row that fits max_bytes
    (or one row alone if it is larger): the cuts pack_chunks would make row by row, found by
    binary search instead of a Python loop over millions of rows."""
    ends = np.cumsum(lengths, dtype=np.int64)
    start = 0
    while start < len(lengths):
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + max_bytes, side="right")))
        yield Piece(unit, start, stop, stop - start, int(ends[stop - 1]) - before)
        start = stop


def _text_lengths(column) -> np.ndarray:
    """UTF-8 byte length of every value of an Arrow string column (nulls count 0)."""
    pc = _import("pyarrow.compute")
    return pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False)


def _parquet_pieces(unit: int, path: Path, text_field: str, max_bytes: int) -> Iterator[Piece]:
    pq = _import("pyarrow.parquet")
    parquet = pq.ParquetFile(path)
    names = parquet.schema_arrow.names
    if text_field not in names:
        raise DataPrepError(f"{path} has no column {text_field!r} (columns: {names}). "
                            "Pass --text-field with the column that holds the text.")
    column = parquet.read(columns=[text_field]).column(text_field)
    yield from greedy_pieces(unit, _text_lengths(column), max_bytes)


def _read_parquet_rows(path: Path, start: int, stop: int, text_field: str) -> list:
    """Rows [start, stop) of the text column, reading only the row groups that hold them."""
    pq = _import("pyarrow.parquet")
    parquet = pq.ParquetFile(path)
    group_ends = np.cumsum([parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)])
    first = int(np.searchsorted(group_ends, start, side="right"))
    last = int(np.searchsorted(group_ends, stop - 1, side="right"))
    first_row = int(group_ends[first - 1]) if first else 0
    table = parquet.read_row_groups(list(range(first, last + 1)), columns=[text_field])
    return table.column(text_field).slice(start - first_row, stop - start).to_pylist()


def _read_dir_segment(root: Path, unit: dict[str, Any], seg: Segment, text_field: str) -> Iterator[RawDocument]:
    path = root / unit["path"]
    if unit["format"] == "txt":
        yield RawDocument(unit["path"], path.read_bytes())
    elif unit["format"] == "jsonl":
        with open(path, "rb") as f:
            f.seek(seg.start)
            data = f.read(seg.stop - seg.start)
        # Split on b"\n" only, as planning's `for line in file` did, so the documents match.
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        offset = seg.start
        for line in lines:
            where = f"{unit['path']} (line at byte {offset})"
            yield RawDocument(where, _jsonl_text(line, where, text_field))
            offset += len(line) + 1
    elif unit["format"] == "parquet":
        for i, text in enumerate(_read_parquet_rows(path, seg.start, seg.stop, text_field)):
            where = f"{unit['path']} (row {seg.start + i})"
            yield RawDocument(where, _check_text_value(text, where, text_field))
    else:
        raise AssertionError(unit["format"])


def _jsonl_text(line: bytes, where: str, text_field: str) -> str | None:
    """The text field of one JSON line. Bytes that are not UTF-8 survive as surrogate escapes,
    so that the UTF-8 policy (error or replace, counted) decides about them, not the JSON parser."""
    if not line.strip():
        return None  # a blank line: counted as an empty document
    try:
        record = json.loads(line.decode("utf-8", "surrogateescape"))
    except json.JSONDecodeError as e:
        raise DataPrepError(f"{where} is not valid JSON ({e.msg} at column {e.colno}): {line[:80]!r}. "
                            "Fix or remove the line.") from e
    if not isinstance(record, dict) or text_field not in record:
        keys = list(record) if isinstance(record, dict) else type(record).__name__
        raise DataPrepError(f"{where} has no field {text_field!r} (it has {keys}). "
                            "Pass --text-field with the name of the field that holds the text.")
    return _check_text_value(record[text_field], where, text_field)


def _check_text_value(text: Any, where: str, text_field: str) -> str | None:
    if text is None or isinstance(text, str):
        return text
    raise DataPrepError(f"{where}: field {text_field!r} holds a {type(text).__name__}, not text. "
                        "Pass --text-field with the field that holds the document text.")


# ---------------------------------------------------------------- HuggingFace datasets

_OPEN_DATASETS: dict[tuple, Any] = {}


# The hub's automatic Parquet export: how `datasets` 4+, which no longer runs loading scripts,
# reads datasets that still ship one (OpenWebText did, in 2025).
PARQUET_EXPORT_REVISION = "refs/convert/parquet"


def open_hf_dataset(spec: SourceSpec):
    """The dataset for `spec`: a local `save_to_disk` folder if the input is a path, else the hub.

    Cached per process: each pool worker opens it once (memory-mapped Arrow files).
    """
    key = (spec.input, spec.hf_split, spec.hf_config, spec.hf_revision)
    if key not in _OPEN_DATASETS:
        loaded = _load_hf_dataset(spec)
        _OPEN_DATASETS[key] = loaded
        # Also under the revision actually read (the Parquet fallback changes it), which is
        # what the workers' copy of the spec will ask for.
        _OPEN_DATASETS[(spec.input, spec.hf_split, spec.hf_config, spec.hf_revision)] = loaded
    loaded = _OPEN_DATASETS[key]
    if spec.text_field not in loaded.column_names:
        raise DataPrepError(f"dataset {spec.input} has no column {spec.text_field!r} (columns: "
                            f"{loaded.column_names}). Pass --text-field with the column that holds the text.")
    return loaded


def _load_hf_dataset(spec: SourceSpec):
    datasets = _import("datasets")
    if Path(spec.input).exists():
        loaded = datasets.load_from_disk(spec.input)
        if isinstance(loaded, datasets.DatasetDict):
            if spec.hf_split not in loaded:
                raise DataPrepError(f"{spec.input} has splits {list(loaded)}, not {spec.hf_split!r}; pass --hf-split.")
            loaded = loaded[spec.hf_split]
    else:
        loaded = _load_from_hub(datasets, spec)
    if getattr(loaded, "_indices", None) is not None:
        loaded = loaded.flatten_indices()  # reading rows by Arrow offset needs rows in table order
    return loaded


def _load_from_hub(datasets, spec: SourceSpec):
    """load_dataset where the hub is reachable, e.g. Skylion007/openwebtext (8M documents, ~40 GB)."""
    kwargs = {"split": spec.hf_split, "num_proc": spec.load_workers if spec.load_workers > 1 else None}
    try:
        try:
            return datasets.load_dataset(spec.input, spec.hf_config, revision=spec.hf_revision, **kwargs)
        except RuntimeError as e:
            if "scripts are no longer supported" not in str(e) or spec.hf_revision is not None:
                raise
            log.warning("%s ships a loading script, which this `datasets` does not run; reading the hub's "
                        "Parquet export (revision %s) instead", spec.input, PARQUET_EXPORT_REVISION)
            spec.hf_revision = PARQUET_EXPORT_REVISION
            return datasets.load_dataset(spec.input, spec.hf_config, revision=spec.hf_revision, **kwargs)
    except Exception as e:  # network, missing dataset, bad config: all end here for one clear message
        raise DataPrepError(
            f"could not load the dataset {spec.input!r} (config {spec.hf_config!r}, split {spec.hf_split!r}, "
            f"revision {spec.hf_revision!r}) from the HuggingFace hub: {type(e).__name__}: {str(e)[:300]}\n"
            "Check the name (OpenWebText is Skylion007/openwebtext) and the network; offline, pass --input "
            "a folder written by Dataset.save_to_disk, or use --source dir on its .parquet/.jsonl files.") from e


def _hf_units(spec: SourceSpec) -> list[dict[str, Any]]:
    ds = open_hf_dataset(spec)
    return [{"path": spec.input, "format": "hf", "rows": ds.num_rows, "revision": spec.hf_revision,
             "fingerprint": getattr(ds, "_fingerprint", "")}]


def _hf_pieces(spec: SourceSpec, max_bytes: int) -> Iterator[Piece]:
    ds = open_hf_dataset(spec)
    yield from greedy_pieces(0, _text_lengths(ds.data.column(spec.text_field)), max_bytes)


def _read_hf_segment(spec: SourceSpec, seg: Segment) -> Iterator[RawDocument]:
    ds = open_hf_dataset(spec)
    texts = ds.data.column(spec.text_field).slice(seg.start, seg.stop - seg.start).to_pylist()
    for i, text in enumerate(texts):
        where = f"{spec.input} row {seg.start + i}"
        yield RawDocument(where, _check_text_value(text, where, spec.text_field))


# ---------------------------------------------------------------- one interface for both

def list_units(spec: SourceSpec) -> list[str]:
    """Fill spec.units (files, or the dataset); returns the paths that were ignored, for the log."""
    if spec.kind == "dir":
        spec.units, ignored = _list_dir_units(Path(spec.input))
        return ignored
    if spec.kind == "hf":
        spec.units = _hf_units(spec)
        return []
    raise DataPrepError(f"unknown source {spec.kind!r}; use 'dir' or 'hf'.")


def plan_pieces(spec: SourceSpec, max_bytes: int) -> Iterator[Piece]:
    """The source's documents as pieces; a piece is at most max_bytes unless it is one document."""
    if spec.kind == "hf":
        yield from _hf_pieces(spec, max_bytes)
        return
    root = Path(spec.input)
    for index, unit in enumerate(spec.units):
        path = root / unit["path"]
        if unit["format"] == "txt":
            yield Piece(index, 0, unit["size"], 1, unit["size"])
        elif unit["format"] == "jsonl":
            yield from _jsonl_pieces(index, path)
        else:
            yield from _parquet_pieces(index, path, spec.text_field, max_bytes)


def read_segment(spec: SourceSpec, seg: Segment) -> Iterator[RawDocument]:
    if spec.kind == "hf":
        return _read_hf_segment(spec, seg)
    return _read_dir_segment(Path(spec.input), spec.units[seg.unit], seg, spec.text_field)


def _import(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise DataPrepError(f"{module} is not installed; it is needed for .parquet files and --source hf. "
                            + HOW_TO_INSTALL_DATA_EXTRA) from e


def describe_units(spec: SourceSpec) -> str:
    if spec.kind == "hf":
        return f"dataset {spec.input} ({spec.units[0]['rows']} rows)"
    counts: dict[str, int] = {}
    for unit in spec.units:
        counts[unit["format"]] = counts.get(unit["format"], 0) + 1
    return f"{os.fspath(spec.input)}: " + ", ".join(f"{n} .{fmt}" for fmt, n in sorted(counts.items()))
