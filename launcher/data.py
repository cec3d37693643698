"""Training and evaluation batches for a run, from data_prep's prepared token shards."""
from __future__ import annotations

from pathlib import Path

import torch

from launcher.config import RunConfig

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), int64 (micro_batch, seq_len)
DEMO_CORPUS = "shakespeare-demo"


def resolve_data_dir(path: str) -> Path:
    """The demo corpus is prepared on first use (seconds); any other path must already hold
    the output of `python -m data_prep prepare`, or DataPrepError says how to make it."""
    if path == DEMO_CORPUS:
        from data_prep.demo_corpus import default_demo_dir, prepare_demo

        out = default_demo_dir()
        prepare_demo(out)  # idempotent: verifies and returns if already prepared
        return out
    return Path(path)


def build_batches(config: RunConfig, dp_rank: int = 0, dp_world: int = 1):
    """(endless train loader, fixed list of eval batches), both of micro_batch_size x seq_len.

    The train order depends only on the seed, so runs that differ only in attention see
    exactly the same batches; eval uses the same windows at every evaluation.
    """
    from data_prep.loader import BatchLoader, TokenDataset, ValLoader

    data_dir = resolve_data_dir(config.data.path)
    seq, batch = config.model.seq_len, config.train.micro_batch_size
    train = BatchLoader(TokenDataset(data_dir, "train", verify=config.data.verify), seq_len=seq,
                        batch_size=batch, seed=config.seed, dp_rank=dp_rank, dp_world=dp_world)
    val = ValLoader(TokenDataset(data_dir, "val", verify=config.data.verify), seq_len=seq,
                    batch_size=batch, dp_rank=dp_rank, dp_world=dp_world,
                    max_batches=config.eval.batches)
    return train, list(val)
