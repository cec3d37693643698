"""The GPT-2 encoding: the pinned hash is tiktoken's, the offline encoding is tiktoken's gpt2,
and a missing or wrong ranks file is refused with a message that says how to get it."""

import re
from pathlib import Path

import pytest
import tiktoken_ext.openai_public as openai_public

from data_prep.assets import fetch_gpt2_ranks
from data_prep.errors import DataPrepError
from data_prep.tokenizer import (EOT_TOKEN, GPT2_PAT_STR, GPT2_RANKS_SHA256, RANKS_ENV_VAR, default_assets_dir,
                                 gpt2_encoding, ranks_sha256, resolve_ranks)


@pytest.fixture(scope="module")
def ranks_file() -> Path:
    assets = default_assets_dir()
    return fetch_gpt2_ranks(assets, assets / "downloads")  # no download when set-up already fetched it


def test_pinned_hash_and_pattern_are_tiktokens_own():
    source = Path(openai_public.__file__).read_text()
    r50k = source[source.index("def r50k_base"):source.index("def p50k_base")]
    assert re.search(r'expected_hash="([0-9a-f]{64})"', r50k).group(1) == GPT2_RANKS_SHA256
    assert openai_public.r50k_pat_str == GPT2_PAT_STR


def test_offline_encoding_is_gpt2(ranks_file):
    enc = gpt2_encoding(ranks_file)
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257 and enc.eot_token == EOT_TOKEN == 50256
    assert enc.decode(enc.encode_ordinary("To be, or not to be")) == "To be, or not to be"
    assert ranks_sha256(enc) == GPT2_RANKS_SHA256


def test_env_var_is_used(ranks_file, monkeypatch):
    monkeypatch.setenv(RANKS_ENV_VAR, str(ranks_file))
    assert resolve_ranks().path == ranks_file


def test_altered_ranks_file_is_refused(ranks_file, tmp_path):
    bad = tmp_path / "gpt2.tiktoken"
    data = bytearray(ranks_file.read_bytes())
    data[100] ^= 1
    bad.write_bytes(bytes(data))
    with pytest.raises(DataPrepError, match="sha256"):
        gpt2_encoding(bad)


@pytest.mark.parametrize("via", ["argument", "env"])
def test_missing_ranks_file_says_how_to_get_it(tmp_path, monkeypatch, via):
    missing = tmp_path / "nowhere" / "gpt2.tiktoken"
    if via == "env":
        monkeypatch.setenv(RANKS_ENV_VAR, str(missing))
    with pytest.raises(DataPrepError, match="does not exist.*fetch-assets"):
        gpt2_encoding(missing if via == "argument" else None)
