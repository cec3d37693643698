"""Benchmark of `prepare` (not a test): tokens/s on this machine, and a projection for OpenWebText.

    python -m data_prep.bench [--mb 64] [--workers 1 2]

The corpus is web-page-sized documents (about 5 KB, OpenWebText's mean) cut from the demo
Shakespeare works and written as .jsonl, the path OpenWebText takes through `prepare`. Each run
is end to end: planning, tokenising, writing and hashing shards, meta.json. The projection
assumes that throughput per worker holds at 64 workers (chunks are independent; each worker
reads and writes about 3 bytes per token, well within a node's disk bandwidth), and uses both
the measured tokens/s and the measured bytes/s, since Early Modern English tokenises into more
tokens per byte than web text does.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .assets import SHAKESPEARE_DIR, fetch_assets
from .config import make_prepare_config
from .plan import make_plan, source_spec
from .prepare import prepare
from .tokenizer import GPT2_RANKS_SHA256, RANKS_FILE_NAME, default_assets_dir

OWT_TOKENS = 9.0e9  # GPT-2 tokens in OpenWebText (nanoGPT's prepare.py reports ~9.0 B)
OWT_BYTES = 40.0e9  # bytes of its text (the HF card: 41.7 GB of Arrow data for 8.0 M documents)
TARGET_NODE_CORES = 64
DOC_BYTES = 5000


def build_corpus(root: Path, corpus_dir: Path, megabytes: float, files: int = 8) -> int:
    """Write about `megabytes` MiB of ~5 KB documents as `files` .jsonl files; returns the byte count."""
    works = [p.read_text() for p in sorted(corpus_dir.glob("*.txt"))]
    docs, current = [], []
    for work in works:
        for line in work.splitlines(keepends=True):
            current.append(line)
            if sum(map(len, current)) >= DOC_BYTES:
                docs.append("".join(current))
                current = []
    target, written, i = int(megabytes * 2**20), 0, 0
    root.mkdir(parents=True, exist_ok=True)
    handles = [open(root / f"part-{k:02d}.jsonl", "w") for k in range(files)]
    try:
        while written < target:
            doc = docs[i % len(docs)]
            handles[i % files].write(json.dumps({"text": doc}) + "\n")
            written += len(doc.encode())
            i += 1
    finally:
        for handle in handles:
            handle.close()
    return written


@dataclass
class BenchResult:
    runs: list[dict]  # one per worker count
    planning_bytes_per_s: float
    load_before: str  # the machine's load average before the runs: other jobs slow them down


def run(megabytes: float, worker_counts: list[int], keep: Path | None, repeat: int) -> BenchResult:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    assets = default_assets_dir()
    fetch_assets(assets)
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="data_prep_bench_"))
    corpus = work / "corpus"
    text_bytes = build_corpus(corpus, assets / SHAKESPEARE_DIR, megabytes)
    rows = []
    for workers in worker_counts:
        timings = []
        for attempt in range(repeat):  # the fastest of `repeat` runs: other load only slows a run down
            out = work / f"out-w{workers}-{attempt}"
            config = make_prepare_config(source="dir", input=str(corpus), out=out, workers=workers,
                                         ranks=assets / RANKS_FILE_NAME, val_fraction=0.0005,
                                         shard_mb=max(megabytes / (8 * max(worker_counts)), 0.5))
            started = time.perf_counter()
            meta = prepare(config)
            timings.append(time.perf_counter() - started)
        seconds = min(timings)
        tokens = sum(s.tokens for s in meta.splits.values())
        rows.append({"workers": workers, "MiB": text_bytes / 2**20, "tokens": tokens, "seconds": seconds,
                     "tok_per_s": tokens / seconds, "MiB_per_s": text_bytes / 2**20 / seconds,
                     "chunks": meta.counts["chunks"]})
    started = time.perf_counter()
    make_plan(config, source_spec(config), GPT2_RANKS_SHA256)
    plan_rate = text_bytes / (time.perf_counter() - started)
    if not keep:
        shutil.rmtree(work)
    return BenchResult(rows, plan_rate, load)


def report(result: BenchResult) -> str:
    runs, plan_rate = result.runs, result.planning_bytes_per_s
    lines = [f"machine: {platform.node()} ({os.cpu_count()} cores, {platform.processor() or platform.machine()}), "
             f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, load average {result.load_before} before",
             "",
             "| workers | text MiB | tokens | chunks | seconds | tokens/s | MiB/s | tokens/s per worker |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        lines.append(f"| {r['workers']} | {r['MiB']:.0f} | {r['tokens']:,} | {r['chunks']} | {r['seconds']:.1f} | "
                     f"{r['tok_per_s'] / 1e6:.2f} M | {r['MiB_per_s']:.1f} | "
                     f"{r['tok_per_s'] / r['workers'] / 1e6:.2f} M |")
    plan_min = OWT_BYTES / plan_rate / 60
    lines += ["",
              f"planning (serial, reads every .jsonl line once): {plan_rate / 2**20:.0f} MiB/s "
              f"-> {plan_min:.1f} min for OpenWebText's {OWT_BYTES / 1e9:.0f} GB",
              f"projection for OpenWebText ({OWT_TOKENS / 1e9:.0f} B tokens, {OWT_BYTES / 1e9:.0f} GB) with "
              f"{TARGET_NODE_CORES} workers on a {TARGET_NODE_CORES}-core node (+ {plan_min:.0f} min planning):"]
    for r in runs:
        by_tokens = OWT_TOKENS / (r["tok_per_s"] / r["workers"] * TARGET_NODE_CORES) / 60
        by_bytes = OWT_BYTES / (r["MiB_per_s"] * 2**20 / r["workers"] * TARGET_NODE_CORES) / 60
        lines.append(f"  from the {r['workers']}-worker rate: {by_tokens:.1f} min by tokens/s, "
                     f"{by_bytes:.1f} min by bytes/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_prep.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=64, help="MiB of text to tokenise per run")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--repeat", type=int, default=2, help="runs per worker count; the fastest counts")
    parser.add_argument("--keep", type=Path, help="keep the corpus and outputs in this folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[data_prep] %(message)s")
    print(report(run(args.mb, sorted(set(args.workers)), args.keep, args.repeat)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
