"""Data for the SageBwd pre-training suite: GPT-2 tokenisation into verified shards, and a loader.

Commands (python -m data_prep ...):
  fetch-assets                  GPT-2 ranks + Shakespeare demo corpus into .cache/assets (idempotent)
  prepare --source {dir,hf} --input IN --out OUT [--val-fraction 0.05 --seed 0 --text-field text
          --shard-mb 128 --workers N --on-bad-utf8 {error,replace} --ranks FILE --max-chunks K
          --hf-split train --hf-config NAME --hf-revision REV]
                                dir: .txt/.jsonl/.parquet under IN; hf: a hub dataset or a save_to_disk
                                folder. Parallel, resumable (re-run the same command), bounded shards.
  prepare-demo [--out .cache/data/shakespeare]
  verify OUT                    every shard against meta.json; names the bad ones, exit 1
python -m data_prep.bench       tokens/s of prepare here, and a projection for OpenWebText (docs/data.md)

Loader API (data_prep.loader; imports torch, so it is not imported here):

    from data_prep.loader import TokenDataset, BatchLoader, ValLoader, data_parallel_coords

    dp_rank, dp_world = data_parallel_coords(rank, world_size, sp_size)  # SP group shares a sample
    train = TokenDataset(".cache/data/shakespeare", "train")      # checks shards against meta.json
    loader = BatchLoader(train, seq_len=256, batch_size=8, seed=0, dp_rank=dp_rank, dp_world=dp_world)
    inputs, targets = loader.next_batch()       # int64 (8, 256) each; targets = inputs shifted by one
    for inputs, targets in loader: ...          # endless; loader.epoch, loader.steps_per_epoch
    state = loader.state_dict()                 # small dict of ints/strings: put it in the checkpoint
    loader.load_state_dict(state)               # then the next batches are exactly those that would have come
    val = ValLoader(TokenDataset(path, "val"), seq_len=256, batch_size=8, dp_rank=dp_rank,
                    dp_world=dp_world, max_batches=20)
    for inputs, targets in val: ...             # the same fixed windows on every pass

Errors about data or set-up are DataPrepError (data_prep.errors) with a message saying how to fix them.
Layout of a prepared folder: train-NNNNNN.bin / val-NNNNNN.bin (uint16, np.memmap-able, EOT 50256
after each document), meta.json (see data_prep.meta), .progress/ (plan and per-chunk manifests).
"""

from .errors import DataPrepError
from .tokenizer import EOT_TOKEN, gpt2_encoding

__all__ = ["DataPrepError", "EOT_TOKEN", "gpt2_encoding"]
