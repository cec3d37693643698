"""`python -m launcher.capture --config FILE --layer L --out FILE [--checkpoint PATH] [--set k=v]`

Captures what one layer's core attention sees in a training step: q, k, v as it gets them
(after QK-norm and RoPE; (batch, heads, seq, head_dim)) and dO, the gradient of its output.
`python -m sagebwd.trace tensors --input FILE` then traces every SageBwd intermediate against
FPA on them: the paper's intermediate-error trace on a trained model's layer (manifest
`intermediate-trace`).

Weights: a run's checkpoint (`--checkpoint`: a step folder, or a checkpoint dir with a
`latest` marker), read from DeepSpeed's module states (ZeRO 0-2 write the whole module there),
or the config's seeded init without one. The batch is the first micro-batch of the run's
seeded train order. One process, the run's attention backend, bf16 on a GPU as in training.
The file is written atomically (a partial file never has the final name).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from launcher.checkpoint import resolve_resume
from launcher.config import RunConfig, load_run_config
from launcher.overrides import ConfigError

MODULE_STATES = "mp_rank_00_model_states.pt"   # DeepSpeed's file of the module weights


def load_module_weights(model: torch.nn.Module, checkpoint: str) -> str:
    """Load a launcher checkpoint's module weights into model; returns the step folder."""
    directory, tag = resolve_resume(checkpoint, None)
    states = directory / tag / MODULE_STATES
    if not states.is_file():
        raise ConfigError(f"{states} is missing: --checkpoint must name a launcher checkpoint "
                          "(a step folder, or a folder with a `latest` marker); ZeRO-3 runs "
                          "keep partitioned weights, gather them with DeepSpeed's zero_to_fp32.py")
    module = torch.load(states, map_location="cpu", weights_only=False)["module"]
    try:
        model.load_state_dict(module)
    except RuntimeError as err:
        raise ConfigError(f"{states} does not fit this config's model ({str(err).splitlines()[0]}); "
                          "pass the run's own config") from None
    return str(directory / tag)


def capture(config: RunConfig, layer: int, checkpoint: str | None = None) -> dict:
    """{q, k, v, do} (fp32, CPU) of layer `layer` for one micro-batch, plus a `meta` dict."""
    from launcher.data import build_batches
    from launcher.train import lm_loss
    from model import Llama

    layers = config.model.num_layers
    if not 0 <= layer < layers:
        raise ConfigError(f"--layer {layer}: the model has layers 0..{layers - 1}")
    torch.manual_seed(config.seed)
    model = Llama(config.model)
    source = load_module_weights(model, checkpoint) if checkpoint else "seeded init"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model.to(device=device, dtype=dtype)
    x, y = (t.to(device) for t in next(iter(build_batches(config)[0])))

    captured: dict[str, torch.Tensor] = {}

    def keep(name: str, tensor: torch.Tensor) -> None:
        captured[name] = tensor.detach().float().cpu()

    def on_forward(module, inputs, output):
        for name, tensor in zip(("q", "k", "v"), inputs):
            keep(name, tensor)
        output.register_hook(lambda grad: keep("do", grad))

    handle = model.blocks[layer].attn.core.register_forward_hook(on_forward)
    try:
        lm_loss(model(x), y).backward()
    finally:
        handle.remove()
    meta = {"layer": layer, "weights": source, "attention": config.model.attention,
            "smoothing": config.model.smoothing, "qk_norm": config.model.qk_norm,
            "dtype": str(dtype).removeprefix("torch."), "seed": config.seed,
            "block_q": config.model.block_q, "block_kv": config.model.block_kv}
    return {**captured, "meta": meta}


def save_atomically(data: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save(data, partial)
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.capture", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the run's config YAML")
    parser.add_argument("--layer", type=int, required=True, help="0-based layer index")
    parser.add_argument("--out", required=True, help="the .pt file to write")
    parser.add_argument("--checkpoint", help="a step folder or a checkpoint dir with `latest`")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        config = load_run_config(args.config, args.overrides)
        data = capture(config, args.layer, args.checkpoint)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    save_atomically(data, Path(args.out))
    shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in data.items() if k != "meta")
    print(f"wrote {args.out}: layer {args.layer} of {data['meta']['weights']} ({shapes}); trace it with "
          f"python -m sagebwd.trace tensors --input {args.out} --causal", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
