"""`python -m launcher.train --config FILE [--set key=value ...]`: one training run.

Flow: YAML -> RunConfig (validated) -> process group -> Llama -> DeepSpeed engine ->
train/eval loop -> MLflow run (params, tags, per-step metrics).
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

from launcher.config import RunConfig, load_run_config
from launcher.cpu_memory import reuse_freed_memory
from launcher.data import Batch, build_batches
from launcher.distributed import init_process_group, rank
from launcher.engine import build_engine
from launcher.overrides import ConfigError
from launcher.tracking import MlflowRun, config_to_yaml
from model import Llama, count_parameters


@dataclass
class RunResult:
    """What a finished run reports back to its caller (the demo, tests, sweeps)."""

    name: str
    run_id: str | None
    tracking_uri: str | None
    train_loss: list[tuple[int, float]] = field(default_factory=list)  # (step, loss)
    eval_loss: list[tuple[int, float]] = field(default_factory=list)
    tokens_per_s: float = 0.0    # mean over steps, eval excluded
    wall_s: float = 0.0
    diverged_at: int | None = None


def default_run_name(config: RunConfig) -> str:
    m = config.model
    return (f"{m.attention}-smooth_{m.smoothing}-qknorm_{'on' if m.qk_norm else 'off'}"
            f"-tps{config.tokens_per_step}")


def grid_tags(config: RunConfig) -> dict[str, str]:
    """The paper's grid axes, as tags so runs can be filtered and grouped in MLflow."""
    m = config.model
    return {"attention": m.attention, "smoothing": m.smoothing,
            "qk_norm": str(m.qk_norm).lower(), "tokens_per_step": str(config.tokens_per_step),
            "model_preset": str(m.preset)}


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def _plain_grad_norm(engine) -> float | None:
    """Pre-clip global grad norm when DeepSpeed will not report one.

    With fp32 and no ZeRO the engine clips module grads in place but leaves
    get_global_grad_norm() as None; its ZeRO/bf16 optimizers do report it.
    """
    if engine.zero_optimization() or engine.bfloat16_enabled() or engine.fp16_enabled():
        return None
    norms = [p.grad.norm() for p in engine.module.parameters() if p.grad is not None]
    return torch.stack(norms).norm().item() if norms else 0.0


def evaluate(engine, batches: Iterable[Batch]) -> float:
    engine.eval()
    with torch.no_grad():
        losses = [lm_loss(engine(x.to(engine.device)), y.to(engine.device)).item()
                  for x, y in batches]
    engine.train()
    return sum(losses) / len(losses)


def train_step(engine, batches: Iterator[Batch], accum_steps: int) -> tuple[float, float]:
    """One optimizer step over `accum_steps` micro-batches -> (mean loss, pre-clip grad norm).

    engine.step() is called after every micro-batch; DeepSpeed only updates the weights (and
    the lr schedule) at the accumulation boundary, and scales the loss by 1/accum_steps.
    """
    loss_sum = torch.zeros((), device=engine.device)
    grad_norm = None
    for _ in range(accum_steps):
        x, y = next(batches)
        loss = lm_loss(engine(x.to(engine.device)), y.to(engine.device))
        engine.backward(loss)
        if engine.is_gradient_accumulation_boundary():
            grad_norm = _plain_grad_norm(engine)
        engine.step()
        loss_sum += loss.detach()
    if grad_norm is None:
        grad_norm = float(engine.get_global_grad_norm() or float("nan"))
    return loss_sum.item() / accum_steps, grad_norm


def say_now(line: str) -> None:
    print(line, flush=True)  # progress must show up live in piped CI/demo logs


def start_tracking(config: RunConfig, name: str, model: Llama, world_size: int) -> MlflowRun:
    counts = count_parameters(model)
    params = {**config.to_dict(), "derived": {
        "tokens_per_step": config.tokens_per_step, "world_size": world_size,
        "n_params": counts["total"], "n_params_non_embedding": counts["non_embedding"]}}
    return MlflowRun(experiment=config.tracking.experiment, run_name=name, params=params,
                     tags=grid_tags(config), config_yaml=config_to_yaml(config.to_dict()),
                     tracking_uri=config.tracking.tracking_uri)


def train(config: RunConfig, *, say: Callable[[str], None] = say_now) -> RunResult:
    """Run one training run to completion (or divergence) and return its curves."""
    if not torch.cuda.is_available():
        reuse_freed_memory()  # before threads start; faster CPU steps: see cpu_memory.py
    init_process_group()
    torch.manual_seed(config.seed)
    model = Llama(config.model)
    engine = build_engine(model, config)
    train_batches, eval_batches = build_batches(config)
    tokens_per_step = config.tokens_per_step * engine.world_size

    name = config.tracking.run_name or default_run_name(config)
    tracker = start_tracking(config, name, model, engine.world_size) if rank() == 0 else None
    if tracker:
        say(f"[{name}] {count_parameters(model)['total']:,} params, {tokens_per_step:,} "
            f"tokens/step, MLflow run {tracker.run_id} in {tracker.tracking_uri}")
    result = RunResult(name=name, run_id=tracker and tracker.run_id,
                       tracking_uri=tracker and tracker.tracking_uri)
    status = "FAILED"
    started = time.perf_counter()
    step_seconds = 0.0
    try:
        for step in range(1, config.train.steps + 1):
            lr = engine.get_lr()[0]  # the lr this step's update uses
            t0 = time.perf_counter()
            train_loss, grad_norm = train_step(engine, train_batches,
                                               config.train.grad_accum_steps)
            dt = time.perf_counter() - t0
            step_seconds += dt
            metrics = {"loss": train_loss, "lr": lr, "grad_norm": grad_norm,
                       "tokens_per_s": tokens_per_step / dt,
                       "tokens_seen": step * tokens_per_step}
            result.train_loss.append((step, train_loss))

            if not math.isfinite(train_loss):
                result.diverged_at = step
                say(f"[{name}] loss is {train_loss} at step {step}: stopping (diverged)")
                if tracker:
                    tracker.log_metrics(step, metrics)
                    tracker.set_tags({"diverged_at_step": str(step)})
                break

            is_last = step == config.train.steps
            if step % config.eval.every == 0 or is_last:
                metrics["eval_loss"] = evaluate(engine, eval_batches)
                result.eval_loss.append((step, metrics["eval_loss"]))
            if tracker:
                tracker.log_metrics(step, metrics)
                if step % config.tracking.flush_every == 0:
                    tracker.flush()
            if step == 1 or step % config.train.log_every == 0 or is_last:
                say(progress_line(name, step, config.train.steps, metrics))
        status = "FAILED" if result.diverged_at else "FINISHED"
    finally:
        result.wall_s = time.perf_counter() - started
        if step_seconds:
            result.tokens_per_s = len(result.train_loss) * tokens_per_step / step_seconds
        if tracker:
            tracker.finish(status)
    return result


def progress_line(name: str, step: int, steps: int, metrics: dict[str, float]) -> str:
    line = (f"[{name}] step {step}/{steps} loss {metrics['loss']:.4f} lr {metrics['lr']:.2e} "
            f"grad_norm {metrics['grad_norm']:.3f} {metrics['tokens_per_s']:,.0f} tok/s")
    if "eval_loss" in metrics:
        line += f" eval_loss {metrics['eval_loss']:.4f}"
    return line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launcher.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="run config YAML")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config value, e.g. "
                        "--set model.attention=sagebwd (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    try:
        config = load_run_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = train(config)
    return 1 if result.diverged_at else 0


if __name__ == "__main__":
    sys.exit(main())
