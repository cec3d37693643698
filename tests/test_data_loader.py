"""The loader: windows, determinism, epochs, DP/SP partitions, exact resume, the val loader.

The data set here has token value = position (three shards, so windows cross shard ends):
a window's first token names it, and any misread shows up as a wrong value.
"""

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from data_prep.errors import DataPrepError
from data_prep.files import write_json_atomically
from data_prep.loader import BatchLoader, TokenDataset, ValLoader, data_parallel_coords
from data_prep.meta import EncodingRecord, Meta, ShardRecord, SplitRecord

SHARD_TOKENS = {"train": [7001, 5003, 9000], "val": [3001]}
SEQ = 16


def write_position_data(root: Path) -> Path:
    splits = {}
    for split, sizes in SHARD_TOKENS.items():
        shards, start = [], 0
        for i, n in enumerate(sizes):
            tokens = np.arange(start, start + n, dtype=np.uint16)
            (root / f"{split}-{i:06d}.bin").write_bytes(tokens.tobytes())
            shards.append(ShardRecord(file=f"{split}-{i:06d}.bin", tokens=n, documents=1,
                                      sha256=hashlib.sha256(tokens.tobytes()).hexdigest()))
            start += n
        splits[split] = SplitRecord(documents=len(sizes), tokens=start, shards=shards)
    meta = Meta(encoding=EncodingRecord(name="positions", ranks_sha256="-", n_vocab=2**16, eot_token=0),
                source={"kind": "test"}, settings={}, splits=splits, counts={}, plan_sha256="-", created_utc="-")
    write_json_atomically(root / "meta.json", meta.model_dump())
    return root


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_position_data(tmp_path_factory.mktemp("positions"))


@pytest.fixture(scope="module")
def train(data_dir) -> TokenDataset:
    return TokenDataset(data_dir, "train")


def starts_of(batch) -> list[int]:
    return batch[0][:, 0].tolist()


def take(loader, n) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [loader.next_batch() for _ in range(n)]


def test_windows_are_contiguous_shifted_pairs(train):
    loader = BatchLoader(train, SEQ, batch_size=4, seed=0)
    for inputs, targets in take(loader, 50):
        assert inputs.shape == targets.shape == (4, SEQ) and inputs.dtype == torch.int64
        expected = inputs[:, :1] + torch.arange(SEQ)
        assert torch.equal(inputs, expected) and torch.equal(targets, expected + 1)


def test_same_seed_same_stream_other_seed_other_stream(train):
    a, b, c = (BatchLoader(train, SEQ, 4, seed=s) for s in (7, 7, 8))
    batches_a, batches_b, batches_c = take(a, 20), take(b, 20), take(c, 20)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(batches_a, batches_b, strict=True))
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(batches_a, batches_c, strict=True))


def test_an_epoch_visits_every_window_once_then_reshuffles(train):
    loader = BatchLoader(train, SEQ, batch_size=8, seed=1)
    steps = loader.steps_per_epoch
    epoch0 = [s for b in take(loader, steps) for s in starts_of(b)]
    assert loader.epoch == 0
    offset = epoch0[0] % SEQ
    n_windows = (len(train) - 1 - offset) // SEQ
    assert len(set(epoch0)) == len(epoch0) == steps * 8 > n_windows - 8
    assert all(s % SEQ == offset and s + SEQ < len(train) for s in epoch0)
    epoch1 = starts_of(loader.next_batch())
    assert loader.epoch == 1 and loader.position == 8
    assert epoch1 != epoch0[:8]


def test_dp_ranks_partition_the_global_batch(train):
    whole = BatchLoader(train, SEQ, batch_size=6, seed=2)
    ranks = [BatchLoader(train, SEQ, batch_size=3, seed=2, dp_rank=r, dp_world=2) for r in range(2)]
    seen: set[int] = set()
    for _ in range(whole.steps_per_epoch):
        global_batch = starts_of(whole.next_batch())
        parts = [starts_of(r.next_batch()) for r in ranks]
        assert parts[0] + parts[1] == global_batch  # rank r gets the r-th slice of the same stream
        assert not set(parts[0]) & set(parts[1])
        assert not seen & set(global_batch)
        seen |= set(global_batch)


def test_sp_group_shares_a_sample_and_dp_groups_do_not(train):
    coords = [data_parallel_coords(rank, world_size=4, sp_size=2) for rank in range(4)]
    assert coords == [(0, 2), (0, 2), (1, 2), (1, 2)]
    loaders = [BatchLoader(train, SEQ, 4, seed=3, dp_rank=d, dp_world=w) for d, w in coords]
    for _ in range(30):
        batches = [loader.next_batch() for loader in loaders]
        assert torch.equal(batches[0][0], batches[1][0]) and torch.equal(batches[2][1], batches[3][1])
        assert not set(starts_of(batches[0])) & set(starts_of(batches[2]))
    with pytest.raises(DataPrepError, match="not a multiple"):
        data_parallel_coords(0, world_size=3, sp_size=2)


@pytest.mark.parametrize("world_size,sp_size", [(2, 1), (2, 2), (4, 2)], ids=["DP=2", "SP=2", "DP=2xSP=2"])
def test_resume_is_exact(train, world_size, sp_size):
    """Batches before a save + batches after a load == the uninterrupted stream, on every rank,
    with the save just before an epoch boundary so that the resumed run crosses it."""
    for rank in range(world_size):
        dp_rank, dp_world = data_parallel_coords(rank, world_size, sp_size)

        def make(dp_rank=dp_rank, dp_world=dp_world):
            return BatchLoader(train, SEQ, batch_size=5, seed=11, dp_rank=dp_rank, dp_world=dp_world)

        uninterrupted = make()
        before_save = uninterrupted.steps_per_epoch - 3
        reference = take(uninterrupted, before_save + 10)
        first_run = make()
        head = take(first_run, before_save)
        state = first_run.state_dict()
        resumed = make()
        resumed.load_state_dict(dict(state))
        tail = take(resumed, 10)
        assert resumed.epoch == 1
        for got, want in zip(head + tail, reference, strict=True):
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_resume_refuses_another_seed_seq_len_or_data(train, data_dir, tmp_path):
    state = BatchLoader(train, SEQ, 4, seed=0).state_dict()
    with pytest.raises(DataPrepError, match="seed=0 but this loader has 1"):
        BatchLoader(train, SEQ, 4, seed=1).load_state_dict(state)
    with pytest.raises(DataPrepError, match="seq_len"):
        BatchLoader(train, SEQ * 2, 4, seed=0).load_state_dict(state)
    with pytest.raises(DataPrepError, match="dataset"):
        BatchLoader(TokenDataset(data_dir, "val"), SEQ, 4, seed=0).load_state_dict(state)


def test_val_loader_is_fixed_and_partitioned(data_dir):
    val = TokenDataset(data_dir, "val")
    full = ValLoader(val, SEQ, batch_size=4)
    assert len(full) == ((3001 - 1) // SEQ) // 4
    first_pass = [starts_of(b) for b in full]
    assert first_pass == [starts_of(b) for b in full]  # the same windows every time
    assert first_pass[0] == [0, SEQ, 2 * SEQ, 3 * SEQ]
    capped = ValLoader(val, SEQ, batch_size=4, max_batches=3)
    capped_starts = [s for b in capped for s in starts_of(b)]
    assert len(capped) == 3 and capped_starts[-1] > len(val) / 2  # spread over the split
    ranks = [ValLoader(val, SEQ, 2, dp_rank=r, dp_world=2, max_batches=3) for r in range(2)]
    for r0, r1, whole in zip(*ranks, capped, strict=True):
        assert starts_of(r0) + starts_of(r1) == starts_of(whole)


def test_too_little_data_and_bad_ranks_are_clear(train, data_dir):
    with pytest.raises(DataPrepError, match="fewer than one step needs"):
        BatchLoader(train, seq_len=4000, batch_size=4, seed=0, dp_world=2)
    with pytest.raises(DataPrepError, match="dp_rank=2 is outside"):
        BatchLoader(train, SEQ, 4, seed=0, dp_rank=2, dp_world=2)
    with pytest.raises(DataPrepError, match="fewer than one batch"):
        ValLoader(TokenDataset(data_dir, "val"), seq_len=1000, batch_size=4)
    with pytest.raises(DataPrepError, match="not a prepared data set"):
        TokenDataset(data_dir / "missing", "train")


def test_dataset_reads_across_shard_ends(train):
    assert len(train) == sum(SHARD_TOKENS["train"])
    for start in (0, 6990, 7001, 12000, 21000):
        assert train.read(start, 4).tolist() == list(range(start, start + 4))
    with pytest.raises(IndexError):
        train.read(len(train) - 2, 4)
