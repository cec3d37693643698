"""The GPT-2 BPE encoding (the paper's tokenizer), loadable offline and checked by sha256.

tiktoken.get_encoding("gpt2") downloads its ranks on first use, which fails without
internet. The same ranks ship as a file (`gpt2.tiktoken`, byte-identical to tiktoken's
r50k_base ranks); `python -m data_prep fetch-assets` obtains it. Whatever the source, the
ranks are hashed in tiktoken's own file format, so meta.json records one hash for all of them.
"""

from __future__ import annotations

import base64
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import tiktoken

from .errors import DataPrepError
from .files import sha256_bytes

log = logging.getLogger(__name__)

ENCODING_NAME = "gpt2"
EOT_TOKEN = 50256
N_VOCAB = 50257
# tiktoken's expected_hash for r50k_base.tiktoken (tiktoken_ext/openai_public.py); the gpt2
# encoding uses the same ranks. tests/test_data_tokenizer.py checks it against the installed tiktoken.
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
RANKS_ENV_VAR = "SAGEBWD_GPT2_RANKS"
ASSETS_ENV_VAR = "SAGEBWD_ASSETS_DIR"
RANKS_FILE_NAME = "gpt2.tiktoken"

# tiktoken's r50k/gpt2 split pattern, copied so that building the encoding does not depend on
# a private module layout; the tokenizer test checks it equals tiktoken's.
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""

HOW_TO_GET_RANKS = (
    "Get the GPT-2 ranks file with `python -m data_prep fetch-assets` (it takes them from the PyPI "
    "sdist of openai-whisper, checked by sha256), or point the "
    f"{RANKS_ENV_VAR} environment variable / the --ranks flag at a copy of "
    f"r50k_base.tiktoken (sha256 {GPT2_RANKS_SHA256})."
)


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def default_assets_dir() -> Path:
    """Where fetch-assets puts its files: $SAGEBWD_ASSETS_DIR, else <repo>/.cache/assets."""
    env = os.environ.get(ASSETS_ENV_VAR)
    return Path(env) if env else repo_root() / ".cache" / "assets"


def parse_ranks(data: bytes, origin: str) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line_no, line in enumerate(data.splitlines(), start=1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
        except ValueError as e:
            raise DataPrepError(f"{origin}:{line_no} is not a tiktoken ranks line: {line[:60]!r}. "
                                + HOW_TO_GET_RANKS) from e
    return ranks


def serialize_ranks(ranks: dict[bytes, int]) -> bytes:
    """tiktoken's file format (base64 token, space, rank; by rank), whose sha256 tiktoken pins."""
    return b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n"
                    for token, rank in sorted(ranks.items(), key=lambda item: item[1]))


def ranks_sha256(encoding: tiktoken.Encoding) -> str:
    return sha256_bytes(serialize_ranks(encoding._mergeable_ranks))


def verify_ranks_file(path: Path) -> bytes:
    """The file's bytes, after checking they are the GPT-2 ranks."""
    if not path.is_file():
        raise DataPrepError(f"GPT-2 ranks file {path} does not exist. " + HOW_TO_GET_RANKS)
    data = path.read_bytes()
    digest = sha256_bytes(data)
    if digest != GPT2_RANKS_SHA256:
        raise DataPrepError(
            f"{path} has sha256 {digest}, not the GPT-2 ranks' {GPT2_RANKS_SHA256}: it is a "
            "different or damaged file. Delete it. " + HOW_TO_GET_RANKS)
    return data


def encoding_from_ranks_file(path: str | os.PathLike) -> tiktoken.Encoding:
    path = Path(path)
    ranks = parse_ranks(verify_ranks_file(path), str(path))
    return tiktoken.Encoding(
        name=ENCODING_NAME,
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": EOT_TOKEN},
        explicit_n_vocab=N_VOCAB,
    )


@dataclass(frozen=True)
class RanksSource:
    """Where gpt2_encoding found the ranks: a file path, or tiktoken's own download (path None)."""

    path: Path | None

    def describe(self) -> str:
        return str(self.path) if self.path else "tiktoken.get_encoding('gpt2')"

    def load(self) -> tiktoken.Encoding:
        if self.path is not None:
            return encoding_from_ranks_file(self.path)
        encoding = tiktoken.get_encoding(ENCODING_NAME)
        digest = ranks_sha256(encoding)
        if digest != GPT2_RANKS_SHA256:
            raise DataPrepError(f"tiktoken's gpt2 ranks hash to {digest}, not {GPT2_RANKS_SHA256}; "
                                "a corrupt tiktoken cache? Clear $TIKTOKEN_CACHE_DIR. " + HOW_TO_GET_RANKS)
        return encoding


def resolve_ranks(ranks_path: str | os.PathLike | None = None) -> RanksSource:
    """Pick the ranks: explicit path, then $SAGEBWD_GPT2_RANKS, then the fetched asset, then tiktoken.

    An explicit path or env var that is wrong is an error (not a silent fall-through), since
    someone asked for that file on purpose.
    """
    if ranks_path is not None:
        verify_ranks_file(Path(ranks_path))
        return RanksSource(Path(ranks_path))
    env = os.environ.get(RANKS_ENV_VAR)
    if env:
        verify_ranks_file(Path(env))
        return RanksSource(Path(env))
    fetched = default_assets_dir() / RANKS_FILE_NAME
    if fetched.is_file():
        verify_ranks_file(fetched)
        return RanksSource(fetched)
    try:
        tiktoken.get_encoding(ENCODING_NAME)
    except Exception as e:  # tiktoken raises requests/urllib/OS errors when offline
        raise DataPrepError(
            f"No GPT-2 ranks found: no --ranks path, ${RANKS_ENV_VAR} unset, no {fetched}, and "
            f"tiktoken could not download them ({type(e).__name__}: {str(e)[:200]}). "
            + HOW_TO_GET_RANKS) from e
    return RanksSource(None)


def gpt2_encoding(ranks_path: str | os.PathLike | None = None) -> tiktoken.Encoding:
    """The GPT-2 encoding, with its ranks checked by sha256. See resolve_ranks for the search order."""
    source = resolve_ranks(ranks_path)
    log.debug("GPT-2 ranks from %s", source.describe())
    return source.load()
