"""`prepare`: a source -> verified uint16 token shards and meta.json, in parallel, resumably.

Steps: load the GPT-2 encoding (checked by sha256) -> plan chunks (or reuse the saved plan)
-> tokenise the unfinished chunks in a process pool -> assemble meta.json from the chunk
manifests. Re-running skips finished chunks, and a finished data set is only re-checked.
"""

from __future__ import annotations

import fcntl
import json
import logging
import multiprocessing
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import tiktoken
from tqdm import tqdm

from .config import PrepareConfig
from .errors import DataPrepError
from .files import write_json_atomically
from .meta import (META_FILE, SPLITS, EncodingRecord, Meta, ShardRecord, SplitRecord, load_meta,
                   verify_data_dir)
from .plan import PROGRESS_DIR, Plan, load_or_make_plan, source_spec
from .shard_writer import WorkerContext, finished_manifest, init_worker, manifest_path, tokenize_chunk
from .sources import SourceSpec
from .split import val_document_indices
from .tokenizer import ENCODING_NAME, EOT_TOKEN, N_VOCAB, ranks_sha256, resolve_ranks

log = logging.getLogger(__name__)

UINT16_LIMIT = 2**16


def check_fits_uint16(encoding: tiktoken.Encoding) -> None:
    """Shards store uint16: refuse an encoding whose largest token id would wrap around."""
    if encoding.max_token_value >= UINT16_LIMIT:
        raise DataPrepError(f"encoding {encoding.name!r} has token ids up to {encoding.max_token_value}, "
                            f"which do not fit the uint16 shards (ids below {UINT16_LIMIT}). Use the GPT-2 "
                            "encoding (50257 tokens), or widen the shard dtype for a larger vocabulary.")


@contextmanager
def exclusive_lock(out: Path) -> Iterator[None]:
    """One prepare per output folder at a time. A second one (say, every rank of a job
    preparing the demo corpus at once) waits, then finds the work done and only verifies it."""
    (out / PROGRESS_DIR).mkdir(parents=True, exist_ok=True)
    with open(out / PROGRESS_DIR / "lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another prepare is writing to %s; waiting for it", out)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _remove_stale_temp_files(out: Path) -> None:
    """Temp files of a killed run: never read, so only clutter (and disk) to reclaim."""
    for tmp in [*out.glob(".*.tmp-*"), *(out / PROGRESS_DIR).glob(".*.tmp-*")]:
        tmp.unlink()


def _assemble_meta(config: PrepareConfig, spec: SourceSpec, plan: Plan,
                   manifests: list[dict[str, Any]]) -> Meta:
    splits: dict[str, SplitRecord] = {}
    for split in SPLITS:
        shards = [ShardRecord(**m["shards"][split]) for m in manifests if split in m["shards"]]
        splits[split] = SplitRecord(documents=sum(s.documents for s in shards),
                                    tokens=sum(s.tokens for s in shards), shards=shards)
    counts: dict[str, int] = {}
    for manifest in manifests:
        for key, value in manifest["counts"].items():
            counts[key] = counts.get(key, 0) + value
    if splits["train"].documents == 0:
        raise DataPrepError(f"{config.input} has {plan.n_docs} documents but none with text for training "
                            f"({counts.get('empty_documents_skipped', 0)} empty). Check --text-field and the input.")
    if plan.n_val and splits["val"].documents == 0:
        raise DataPrepError(f"all {plan.n_val} validation documents are empty; use another --seed or "
                            "remove the empty documents.")
    source: dict[str, Any] = {"kind": config.source, "input": plan.identity["input"],
                              "text_field": config.text_field, "files": len(plan.units)}
    if config.source == "hf":
        source.update(hf_split=config.hf_split, hf_config=config.hf_config, rows=plan.units[0]["rows"],
                      fingerprint=plan.units[0]["fingerprint"])
    provenance = Path(config.input) / "SOURCE.json"
    if config.source == "dir" and provenance.is_file():
        source["provenance"] = {k: v for k, v in json.loads(provenance.read_text()).items() if k != "works"}
    return Meta(
        encoding=EncodingRecord(name=ENCODING_NAME, ranks_sha256=plan.ranks_sha256, n_vocab=N_VOCAB,
                                eot_token=EOT_TOKEN),
        source=source,
        settings={"val_fraction": config.val_fraction, "seed": config.seed, "shard_bytes": config.shard_bytes,
                  "on_bad_utf8": config.on_bad_utf8, "split": "by document, seeded permutation"},
        splits=splits,
        counts={**counts, "files_ignored": len(plan.ignored_files), "chunks": len(plan.chunks)},
        plan_sha256=plan.sha256,
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def _existing_meta_is_valid(out: Path, plan: Plan) -> bool:
    """A finished data set for this plan whose shards all match their sha256."""
    if not (out / META_FILE).is_file():
        return False
    meta = load_meta(out)
    if meta.plan_sha256 != plan.sha256:
        return False
    problems = verify_data_dir(out)
    if not problems:
        return True
    log.warning("%d shard(s) do not match meta.json; rebuilding them:\n  %s", len(problems), "\n  ".join(problems))
    bad_files = {p.split(":")[0] for p in problems}
    for split in meta.splits.values():
        for shard in split.shards:
            if shard.file in bad_files:
                manifest_path(out, int(shard.file.split("-")[1].split(".")[0])).unlink(missing_ok=True)
    (out / META_FILE).unlink()
    return False


class _Progress:
    """A tqdm bar on a terminal; in a batch job's log, where tqdm stays silent, a line a minute."""

    LOG_EVERY_S = 60.0

    def __init__(self, total_bytes: int, done_bytes: int):
        self.bar = tqdm(total=total_bytes, initial=done_bytes, unit="B", unit_scale=True, desc="tokenising",
                        disable=None, smoothing=0.1)
        self.total, self.done, self.started = total_bytes, done_bytes, time.perf_counter()
        self.start_bytes, self.last_log = done_bytes, self.started

    def update(self, manifest: dict[str, Any]) -> None:
        self.bar.update(manifest["bytes"])
        self.done += manifest["bytes"]
        now = time.perf_counter()
        if self.bar.disable and now - self.last_log >= self.LOG_EVERY_S:
            rate = (self.done - self.start_bytes) / (now - self.started)
            log.info("tokenised %.0f of %.0f MiB (%.0f%%), %.1f MiB/s, about %.0f min left", self.done / 2**20,
                     self.total / 2**20, 100 * self.done / self.total, rate / 2**20,
                     (self.total - self.done) / max(rate, 1) / 60)
            self.last_log = now


def _start_method() -> str:
    """How pool workers start. A forked child of a process whose other threads hold locks
    (torch's thread pools after a training step in the same process, tiktoken's) can wait on
    them forever: forkserver children come from a clean single-threaded server instead (each
    opens its source itself; a HuggingFace dataset is memory-mapped Arrow, so that is cheap)."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _run_chunks(pending: list[dict[str, Any]], context: WorkerContext, workers: int,
                total_bytes: int, done_bytes: int) -> Iterator[dict[str, Any]]:
    progress = _Progress(total_bytes, done_bytes)
    try:
        if workers <= 1:
            init_worker(context)
            results: Iterator[dict[str, Any]] = map(tokenize_chunk, pending)
            for manifest in results:
                progress.update(manifest)
                yield manifest
        else:
            mp = multiprocessing.get_context(_start_method())
            with mp.Pool(workers, initializer=init_worker, initargs=(context,)) as pool:
                for manifest in pool.imap_unordered(tokenize_chunk, pending):
                    progress.update(manifest)
                    yield manifest
    finally:
        progress.bar.close()


def prepare(config: PrepareConfig) -> Meta | None:
    """Prepare `config.out`; returns its Meta, or None when --max-chunks stopped it early."""
    out = Path(config.out)
    ranks = resolve_ranks(config.ranks)
    encoding = ranks.load()
    check_fits_uint16(encoding)
    ranks_digest = ranks_sha256(encoding)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out):
        _remove_stale_temp_files(out)
        spec = source_spec(config)
        plan = load_or_make_plan(config, spec, ranks_digest)
        if _existing_meta_is_valid(out, plan):
            log.info("%s is already prepared and verified (%s)", out, META_FILE)
            return load_meta(out)
        manifests = {c.index: m for c in plan.chunks if (m := finished_manifest(out, c.index, plan.sha256))}
        pending = [c.to_json() for c in plan.chunks if c.index not in manifests]
        if manifests:
            log.info("resuming: %d of %d chunks already done", len(manifests), len(plan.chunks))
        if config.max_chunks is not None:
            pending = pending[:config.max_chunks]
        context = WorkerContext(spec=spec, out=out, ranks=ranks, ranks_sha256=ranks_digest,
                                val_docs=val_document_indices(plan.n_docs, config.val_fraction, config.seed),
                                on_bad_utf8=config.on_bad_utf8, plan_sha256=plan.sha256)
        started = time.perf_counter()
        done_bytes = sum(m["bytes"] for m in manifests.values())
        new_tokens = 0
        for manifest in _run_chunks(pending, context, min(config.workers, len(pending)), plan.n_bytes, done_bytes):
            manifests[manifest["chunk"]] = manifest
            new_tokens += sum(s["tokens"] for s in manifest["shards"].values())
        elapsed = time.perf_counter() - started
        if pending:
            log.info("tokenised %d chunk(s): %d tokens in %.1f s (%.0f tokens/s)",
                     len(pending), new_tokens, elapsed, new_tokens / max(elapsed, 1e-9))
        if len(manifests) < len(plan.chunks):
            log.info("stopped as asked by --max-chunks: %d of %d chunks done; run the same command to go on",
                     len(manifests), len(plan.chunks))
            return None
        meta = _assemble_meta(config, spec, plan, [manifests[c.index] for c in plan.chunks])
        write_json_atomically(out / META_FILE, meta.model_dump())
    _log_summary(out, meta)
    return meta


def _log_summary(out: Path, meta: Meta) -> None:
    for name, split in meta.splits.items():
        log.info("%s: %d documents, %d tokens, %d shard(s)", name, split.documents, split.tokens, len(split.shards))
    dropped = {k: v for k, v in meta.counts.items() if k not in ("documents_read", "chunks") and v}
    log.info("%s written (documents read: %d; %s)", out / META_FILE, meta.counts.get("documents_read", 0),
             ", ".join(f"{k}: {v}" for k, v in dropped.items()) or "nothing skipped or replaced")
