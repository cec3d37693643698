"""meta.json: what a prepared data set holds, and the checks of its shards against it.

meta.json is written last, atomically, once every shard is in place; its presence is what
marks a prepared folder as complete.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import DataPrepError
from .files import sha256_file

META_FILE = "meta.json"
FORMAT = "sagebwd-tokens-v1"
TOKEN_BYTES = 2  # uint16
SPLITS = ("train", "val")


class ShardRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    file: str
    tokens: int
    documents: int
    sha256: str


class SplitRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    documents: int
    tokens: int
    shards: list[ShardRecord]


class EncodingRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    ranks_sha256: str
    n_vocab: int
    eot_token: int


class Meta(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["sagebwd-tokens-v1"] = FORMAT
    dtype: Literal["uint16"] = "uint16"
    encoding: EncodingRecord
    source: dict[str, Any]
    settings: dict[str, Any]
    splits: dict[str, SplitRecord]
    counts: dict[str, int]  # documents read, empty ones skipped, ones with bad UTF-8 replaced...
    plan_sha256: str
    created_utc: str

    def split(self, name: str) -> SplitRecord:
        if name not in self.splits or not self.splits[name].shards:
            raise DataPrepError(f"the prepared data has no {name!r} tokens (splits with data: "
                                f"{[k for k, v in self.splits.items() if v.shards]}). Prepare again with "
                                "a --val-fraction above 0 if you need a validation split.")
        return self.splits[name]


def load_meta(data_dir: str | Path) -> Meta:
    data_dir = Path(data_dir)
    path = data_dir / META_FILE
    if not path.is_file():
        hint = ("a prepare run into it did not finish; run the same prepare command again to resume"
                if (data_dir / ".progress").is_dir() else
                "prepare it with `python -m data_prep prepare ...` (or `prepare-demo` for the demo corpus)")
        raise DataPrepError(f"{path} does not exist: {data_dir} is not a prepared data set; {hint}.")
    try:
        return Meta.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as e:
        raise DataPrepError(f"{path} is not a valid meta.json ({str(e)[:300]}). Delete the folder and "
                            "prepare it again.") from e


def shard_problem(data_dir: Path, shard: ShardRecord, check_hash: bool) -> str | None:
    """None if the shard matches its record, else what is wrong with it."""
    path = data_dir / shard.file
    if not path.is_file():
        return f"{shard.file}: missing"
    size = path.stat().st_size
    if size != shard.tokens * TOKEN_BYTES:
        kind = "truncated" if size < shard.tokens * TOKEN_BYTES else "longer than recorded"
        return (f"{shard.file}: {kind}: {size} bytes = {size / TOKEN_BYTES:g} tokens, "
                f"meta.json says {shard.tokens} tokens")
    if check_hash:
        digest = sha256_file(path)
        if digest != shard.sha256:
            return f"{shard.file}: altered: sha256 {digest}, meta.json says {shard.sha256}"
    return None


def verify_data_dir(data_dir: str | Path, check_hash: bool = True) -> list[str]:
    """Every shard checked against meta.json; returns the problems (empty when all is well)."""
    data_dir = Path(data_dir)
    meta = load_meta(data_dir)
    return [problem for split in meta.splits.values() for shard in split.shards
            if (problem := shard_problem(data_dir, shard, check_hash))]


def corruption_error(data_dir: Path, problems: list[str]) -> DataPrepError:
    listing = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
    return DataPrepError(f"{data_dir} does not match its meta.json:\n  {listing}\n"
                         "Re-run the prepare command that made it: it rebuilds the damaged shards "
                         "(delete meta.json first so that it looks again).")
