"""--source hf on a local dataset in the HuggingFace format (save_to_disk, a `text` column, as
OpenWebText has): same shards as the same documents read from .jsonl, in parallel too."""

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from data_prep.assets import fetch_gpt2_ranks
from data_prep.config import make_prepare_config
from data_prep.errors import DataPrepError
from data_prep.loader import BatchLoader, TokenDataset
from data_prep.prepare import prepare
from data_prep.tokenizer import default_assets_dir

DOCS = [f"Web page {i}: " + "an ordinary sentence of web text. " * (1 + i % 7) for i in range(3000)] + [""]


@pytest.fixture(scope="module")
def ranks() -> Path:
    assets = default_assets_dir()
    return fetch_gpt2_ranks(assets, assets / "downloads")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("owt_like") / "dataset"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": DOCS}),
        "other": datasets.Dataset.from_dict({"text": ["x"]}),
    }).save_to_disk(str(path))
    return path


def run(ranks, **kwargs):
    return prepare(make_prepare_config(ranks=ranks, val_fraction=0.01, seed=5, **kwargs))


def test_hf_source_matches_the_same_documents_from_jsonl(tmp_path, ranks, hf_dir):
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    from_hf = run(ranks, source="hf", input=str(hf_dir), out=tmp_path / "hf", workers=1)
    from_jsonl = run(ranks, source="dir", input=str(tmp_path / "jsonl"), out=tmp_path / "dir", workers=1)
    assert from_hf.splits == from_jsonl.splits
    assert from_hf.counts["empty_documents_skipped"] == 1
    assert from_hf.splits["val"].documents == 30 and from_hf.source["rows"] == len(DOCS)
    loader = BatchLoader(TokenDataset(tmp_path / "hf", "train"), seq_len=64, batch_size=4, seed=0)
    assert loader.next_batch()[0].shape == (4, 64)


def test_hf_source_in_parallel_bounded_shards(tmp_path, ranks, hf_dir):
    serial = run(ranks, source="hf", input=str(hf_dir), out=tmp_path / "serial", workers=1, shard_mb=0.02)
    parallel = run(ranks, source="hf", input=str(hf_dir), out=tmp_path / "parallel", workers=2, shard_mb=0.02)
    assert len(serial.splits["train"].shards) >= 4
    assert serial.splits == parallel.splits


def test_hf_source_errors_are_clear(tmp_path, ranks, hf_dir):
    with pytest.raises(DataPrepError, match=r"has splits \['train', 'other'\], not 'validation'"):
        run(ranks, source="hf", input=str(hf_dir), out=tmp_path / "a", hf_split="validation")
    with pytest.raises(DataPrepError, match=r"no column 'body' \(columns: \['text'\]\)"):
        run(ranks, source="hf", input=str(hf_dir), out=tmp_path / "b", text_field="body")

def test_hub_dataset_that_cannot_be_loaded_says_what_to_do(tmp_path, ranks):
    # HF_HUB_OFFLINE: the same failure as a machine without internet, without 25 s of retries.
    result = subprocess.run(
        [sys.executable, "-m", "data_prep", "prepare", "--source", "hf", "--input", "sagebwd-tests/no-such-dataset",
         "--out", str(tmp_path / "out"), "--ranks", str(ranks)],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2
    assert "error: could not load the dataset 'sagebwd-tests/no-such-dataset'" in result.stderr
    assert "save_to_disk" in result.stderr and "Traceback" not in result.stderr
