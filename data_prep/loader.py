"""Training and validation batches from prepared token shards: memory-mapped, seeded, resumable.

Windows. The token stream of a split (its shards end to end; documents separated by EOT) is
cut into windows of seq_len + 1 tokens that start seq_len apart, so consecutive windows share
one token and no token is a target twice in an epoch (all are, but for fewer than seq_len at
each end and the windows of a last, incomplete global batch). A window gives inputs = its
first seq_len tokens and targets = its last seq_len.

Why a seeded permutation of window starts per epoch, not random offsets nor a strided scan:
  * an epoch visits every window exactly once (random offsets repeat some text and miss some);
  * a batch mixes windows from all over the corpus (a strided scan puts neighbouring windows
    of one document into one batch, correlating the gradients);
  * the whole position in the stream is two integers (epoch, windows consumed), so a resumed
    run continues exactly, and ranks partition the stream by slicing it.
Each epoch also shifts all window starts by a seeded offset in [0, seq_len), so that text cut
at a window boundary in one epoch is seen whole in the next.

Data parallelism. Step s of an epoch takes the global batch permutation[s*G:(s+1)*G], with
G = batch_size * dp_world, and data-parallel rank r takes the r-th batch_size slice of it:
ranks never share a window, and all ranks take the same number of steps per epoch (the
permutation's last len % G windows wait for another epoch). Ranks of one sequence-parallel
(or tensor-parallel) group must see the same sample: give them the same dp_rank, e.g. with
data_parallel_coords(rank, world_size, sp_size).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any, Iterator, Literal

import numpy as np
import torch

from .errors import DataPrepError
from .meta import corruption_error, load_meta, shard_problem

log = logging.getLogger(__name__)

STATE_FORMAT = "sagebwd-batchloader-v1"


class TokenDataset:
    """One split of a prepared folder, seen as one token array over its memory-mapped shards.

    verify="sha256" hashes every shard against meta.json on opening (about 1 s per GB);
    verify="size" only checks lengths, for very large data sets already checked with
    `python -m data_prep verify`.
    """

    def __init__(self, data_dir: str | Path, split: str = "train", verify: Literal["sha256", "size"] = "sha256"):
        if verify not in ("sha256", "size"):
            raise DataPrepError(f"verify={verify!r}: use 'sha256' (full check) or 'size' (lengths only)")
        self.data_dir = Path(data_dir)
        self.split = split
        self.meta = load_meta(self.data_dir)
        record = self.meta.split(split)
        problems = [p for shard in record.shards if (p := shard_problem(self.data_dir, shard, verify == "sha256"))]
        if problems:
            raise corruption_error(self.data_dir, problems)
        self._shards = [np.memmap(self.data_dir / shard.file, dtype=np.uint16, mode="r") for shard in record.shards]
        self._ends = np.cumsum([len(s) for s in self._shards])
        self.n_documents = record.documents
        # Names this exact token stream, so that a loader state is never applied to other data.
        self.fingerprint = hashlib.sha256(
            (split + "".join(shard.sha256 for shard in record.shards)).encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return int(self._ends[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) as int64, across shard boundaries if need be."""
        if start < 0 or start + length > len(self):
            raise IndexError(f"tokens [{start}, {start + length}) outside a {len(self)}-token split")
        pieces = []
        shard = int(np.searchsorted(self._ends, start, side="right"))
        while length > 0:
            shard_start = int(self._ends[shard - 1]) if shard else 0
            local = start - shard_start
            take = min(length, len(self._shards[shard]) - local)
            pieces.append(self._shards[shard][local:local + take])
            start, length, shard = start + take, length - take, shard + 1
        return np.concatenate(pieces).astype(np.int64) if len(pieces) > 1 else pieces[0].astype(np.int64)


def _check_layout(seq_len: int, batch_size: int, dp_rank: int, dp_world: int) -> None:
    for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("dp_world", dp_world)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise DataPrepError(f"{name}={value!r}: must be a positive integer")
    if not 0 <= dp_rank < dp_world:
        raise DataPrepError(f"dp_rank={dp_rank} is outside [0, dp_world={dp_world})")


def _to_batch(windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.from_numpy(windows)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class BatchLoader:
    """Endless training batches (inputs, targets), int64 tensors of shape (batch_size, seq_len).

    See the module docstring for how windows are ordered and split across ranks.
    """

    def __init__(self, dataset: TokenDataset, seq_len: int, batch_size: int, seed: int,
                 dp_rank: int = 0, dp_world: int = 1):
        _check_layout(seq_len, batch_size, dp_rank, dp_world)
        self.dataset, self.seq_len, self.batch_size, self.seed = dataset, seq_len, batch_size, seed
        self.dp_rank, self.dp_world = dp_rank, dp_world
        self.global_batch = batch_size * dp_world
        fewest_windows = (len(dataset) - 1 - (seq_len - 1)) // seq_len  # with the largest epoch offset
        if fewest_windows < self.global_batch:
            raise DataPrepError(
                f"the {dataset.split!r} split has {len(dataset)} tokens: {max(fewest_windows, 0)} windows of "
                f"{seq_len + 1} tokens, fewer than one step needs ({batch_size} x {dp_world} ranks = "
                f"{self.global_batch}). Use a smaller seq_len or batch size, or more data.")
        self.epoch = 0
        self.position = 0  # windows of the global stream consumed in this epoch
        self._layout_epoch = -1
        self._offset = 0
        self._order = np.empty(0, dtype=np.int64)

    def _layout(self) -> None:
        """This epoch's window offset and window order (cached: one permutation per epoch)."""
        if self._layout_epoch == self.epoch:
            return
        rng = np.random.default_rng([self.seed, self.epoch])
        self._offset = int(rng.integers(self.seq_len))
        n_windows = (len(self.dataset) - 1 - self._offset) // self.seq_len
        dtype = np.uint32 if n_windows < 2**32 else np.int64  # 4 bytes a window: 2M windows = 8 MB
        self._order = np.arange(n_windows, dtype=dtype)
        rng.shuffle(self._order)
        self._layout_epoch = self.epoch

    @property
    def steps_per_epoch(self) -> int:
        self._layout()
        return len(self._order) // self.global_batch

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._layout()
        if self.position + self.global_batch > len(self._order):
            self.epoch, self.position = self.epoch + 1, 0
            self._layout()
            log.debug("data epoch %d starts", self.epoch)
        first = self.position + self.dp_rank * self.batch_size
        starts = self._offset + self._order[first:first + self.batch_size].astype(np.int64) * self.seq_len
        self.position += self.global_batch
        return _to_batch(np.stack([self.dataset.read(int(s), self.seq_len + 1) for s in starts]))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "dataset": self.dataset.fingerprint, "seq_len": self.seq_len,
                "seed": self.seed, "epoch": self.epoch, "position": self.position,
                "batch_size": self.batch_size, "dp_world": self.dp_world}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` stopped. Exact (the same batches as an uninterrupted run) when
        batch_size and dp_world are unchanged; with a new global batch the stream still goes on
        from the same window, so no window of the epoch is repeated or skipped."""
        if state.get("format") != STATE_FORMAT:
            raise DataPrepError(f"not a BatchLoader state (format {state.get('format')!r}, expected {STATE_FORMAT!r})")
        for key, mine in (("dataset", self.dataset.fingerprint), ("seq_len", self.seq_len), ("seed", self.seed)):
            if state[key] != mine:
                raise DataPrepError(f"the saved loader state has {key}={state[key]!r} but this loader has "
                                    f"{mine!r}; resume with the same data, seq_len and seed as the saved run.")
        if (state["batch_size"], state["dp_world"]) != (self.batch_size, self.dp_world):
            log.warning("resuming with batch_size x dp_world = %d x %d (saved: %d x %d): the stream goes on "
                        "from the same window, but batches differ from the uninterrupted run",
                        self.batch_size, self.dp_world, state["batch_size"], state["dp_world"])
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class ValLoader:
    """A fixed list of validation batches: the same windows on every pass, for comparable evals.

    Windows are not shuffled and do not depend on a seed; when max_batches caps their number,
    they are spread evenly over the split rather than taken from its start. Ranks partition
    each global batch as in BatchLoader.
    """

    def __init__(self, dataset: TokenDataset, seq_len: int, batch_size: int, dp_rank: int = 0,
                 dp_world: int = 1, max_batches: int | None = None):
        _check_layout(seq_len, batch_size, dp_rank, dp_world)
        self.dataset, self.seq_len, self.batch_size = dataset, seq_len, batch_size
        self.dp_rank, self.global_batch = dp_rank, batch_size * dp_world
        n_windows = (len(dataset) - 1) // seq_len
        self.n_batches = n_windows // self.global_batch
        if max_batches is not None:
            self.n_batches = min(self.n_batches, max_batches)
        if self.n_batches < 1:
            raise DataPrepError(f"the {dataset.split!r} split has {len(dataset)} tokens: {n_windows} windows of "
                                f"{seq_len + 1} tokens, fewer than one batch of {self.global_batch}. Use a smaller "
                                "seq_len or batch size, or prepare with a larger --val-fraction.")
        total = self.n_batches * self.global_batch
        self._windows = (np.arange(total, dtype=np.int64) * n_windows) // total

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch in range(self.n_batches):
            first = batch * self.global_batch + self.dp_rank * self.batch_size
            starts = self._windows[first:first + self.batch_size] * self.seq_len
            yield _to_batch(np.stack([self.dataset.read(int(s), self.seq_len + 1) for s in starts]))


def data_parallel_coords(rank: int, world_size: int, sp_size: int = 1) -> tuple[int, int]:
    """(dp_rank, dp_world) of a global rank when each sequence-parallel group is a block of
    sp_size consecutive ranks (ranks 0..sp_size-1 share one sample, and so on)."""
    if sp_size < 1 or world_size % sp_size:
        raise DataPrepError(f"world_size={world_size} is not a multiple of sp_size={sp_size}")
    if not 0 <= rank < world_size:
        raise DataPrepError(f"rank={rank} is outside [0, world_size={world_size})")
    return rank // sp_size, world_size // sp_size
