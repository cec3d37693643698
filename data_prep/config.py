"""The settings of `prepare`, typed and validated in one place."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import DataPrepError

DEFAULT_HF_DATASET = "Skylion007/openwebtext"  # the hub's copy of OpenWebText (the paper's data)


class PrepareConfig(BaseModel):
    """What to tokenise, into where, and how.

    The fields in `identity()` define the output: resuming with any of them changed would mix
    two different data sets, so prepare refuses that. `workers` and `max_chunks` only say how
    the work is done and may change between runs.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["dir", "hf"]
    input: str = Field(description="dir: folder of .txt/.jsonl/.parquet; hf: dataset name or save_to_disk folder")
    out: Path
    val_fraction: float = Field(0.05, ge=0.0, le=0.5,
                                description="share of documents held out for validation (0.0005 suits OpenWebText)")
    seed: int = Field(0, ge=0)
    text_field: str = Field("text", min_length=1)
    shard_mb: float = Field(128.0, gt=0, description="MiB of source text per shard (a shard holds at most "
                                                     "that many tokens plus one EOT per document)")
    on_bad_utf8: Literal["error", "replace"] = "error"
    hf_split: str = "train"
    hf_config: str | None = None
    hf_revision: str | None = None
    ranks: Path | None = None
    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    max_chunks: int | None = Field(None, ge=1, description="stop after this many chunks (resume later)")

    @field_validator("input")
    @classmethod
    def _input_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is empty; pass a folder (--source dir) or a dataset name/path (--source hf)")
        return value

    @property
    def shard_bytes(self) -> int:
        return max(1, int(self.shard_mb * 2**20))

    def identity(self) -> dict:
        """The settings that define the prepared data (see the class docstring)."""
        resolved_input = str(Path(self.input).resolve()) if self.source == "dir" else self.input
        return {"source": self.source, "input": resolved_input, "text_field": self.text_field,
                "val_fraction": self.val_fraction, "seed": self.seed, "shard_bytes": self.shard_bytes,
                "on_bad_utf8": self.on_bad_utf8, "hf_split": self.hf_split, "hf_config": self.hf_config,
                "hf_revision": self.hf_revision}


def make_prepare_config(**kwargs) -> PrepareConfig:
    """PrepareConfig(**kwargs), with pydantic's errors turned into one readable DataPrepError."""
    try:
        return PrepareConfig(**{k: v for k, v in kwargs.items() if v is not None})
    except ValidationError as e:
        problems = "; ".join(f"--{'-'.join(str(p) for p in err['loc']).replace('_', '-')}: {err['msg']}"
                             for err in e.errors())
        raise DataPrepError(f"invalid prepare settings: {problems}") from e
