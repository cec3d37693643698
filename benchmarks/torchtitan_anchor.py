"""torchtitan's Llama trainer on gpu-124m's shape, offline: the anchor for issue 27's tokens/s.

Run through benchmarks/torchtitan_anchor.sh (torchrun, one GPU). What it does:
- registers a llama3 flavor `sagebwd_124m` with gpu-124m's shape: dim 768, 12 layers, 12 heads
  of 64, SwiGLU 2048 (llama3's 4*dim*2/3 rounded to 256), vocab 50,304, RoPE theta 10,000;
  torchtitan's own model otherwise (untied output layer, no QK-norm, SDPA attention);
- writes offline assets under $TT_ASSETS (default /tmp/tt-anchor): a word-level tokenizer.json
  of 50,000 words plus BOS/EOS, and a local JSON dataset of random words, read by torchtitan's
  `c4_test` loader through --training.dataset_path (no hub, no network);
- calls torchtitan.train.main(Trainer) (0.2.2) with the arguments given (the .sh passes the shape, seq 4096,
  4 sequences per step, bf16 autocast on one device with fp32 weights and fused AdamW, no
  activation checkpointing, torch.compile of the model and loss).
torchtitan prints `tps` (tokens/s per device) and `mfu` every --metrics.log_freq steps.
"""
from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

WORDS = 50_000


def write_assets(root: Path) -> None:
    tok_dir, data_dir = root / "tokenizer", root / "data"
    if (tok_dir / "tokenizer.json").exists() and (data_dir / "train.json").exists():
        return
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    vocab = {"<|bos|>": 0, "<|eos|>": 1, "<|unk|>": 2}
    vocab.update({f"w{i}": i + 3 for i in range(WORDS)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tok_dir / "tokenizer.json"))
    special = {"0": {"content": "<|bos|>", "special": True}, "1": {"content": "<|eos|>", "special": True}}
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "added_tokens_decoder": special}))
    rng = random.Random(0)
    with open(data_dir / "train.json", "w") as f:   # 10M tokens: 600 steps of 16,384, no wrap
        for _ in range(5_000):
            f.write(json.dumps({"text": " ".join(f"w{rng.randrange(WORDS)}" for _ in range(2000))}) + "\n")


def register_flavor() -> None:
    from torchtitan.models.llama3 import TransformerModelArgs, llama3_args

    llama3_args["sagebwd_124m"] = TransformerModelArgs(
        dim=768, n_layers=12, n_heads=12, vocab_size=50304, multiple_of=256, norm_eps=1e-6,
        rope_theta=10000)


def main() -> None:
    root = Path(os.environ.get("TT_ASSETS", "/tmp/tt-anchor"))
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        write_assets(root)
    register_flavor()
    from torchtitan.train import Trainer, main as torchtitan_main

    sys.argv = [sys.argv[0], *sys.argv[1:], "--model.hf_assets_path", str(root / "tokenizer"),
                "--training.dataset", "c4_test", "--training.dataset_path", str(root / "data")]
    torchtitan_main(Trainer)   # torchtitan 0.2.2's entry (0.3.0's takes no argument)


if __name__ == "__main__":
    main()
