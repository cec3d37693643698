"""`python -m launcher.train --config FILE [--set key=value ...]`: one training run.

Flow: YAML -> RunConfig (validated) -> process group -> Llama -> DeepSpeed engine ->
train/eval loop -> MLflow run (params, tags, per-step metrics).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from launcher import checkpoint, run_identity
from launcher.config import RunConfig, load_run_config
from launcher.cpu_memory import reuse_freed_memory
from launcher.data import Batch, build_batches
from launcher.distributed import (any_rank, broadcast_object, exit_after_run, init_process_group, rank,
                                  sequence_parallel_group, world_size)
from launcher.engine import build_engine
from launcher.garbage import ScheduledCollection
from launcher.job_env import ENV_NODE
from launcher.layout import Layout, resolve_layout
from launcher.logs import configure_logging
from launcher.overrides import ConfigError
from launcher.signals import StopRequest
from launcher.step_metrics import (PendingStep, as_float64, is_read_point, read_metrics,
                                   world_mean)
from launcher.throughput import device_peak_tflops, memory_gib, mfu, train_flops_per_token
from launcher.journal import default_journal_dir
from launcher.journaled_run import JournaledRun
from launcher.tracking import config_to_yaml, resolve_tracking_uri
from model import Llama, count_parameters

# Exit status of a run stopped by SIGTERM/SIGUSR1 after saving its checkpoint: 0, as the
# Slurm job script expects (it requeues by itself; `--resume auto` continues the run).
# Measured on the test cluster: with a non-zero status torchrun fails the srun step and the
# requeued job ends FAILED instead of starting again. The MLflow run says KILLED.
EXIT_STOPPED = 0


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
    resumed_from: int | None = None   # the checkpoint's step
    stopped_by: str | None = None     # "SIGTERM"/"SIGUSR1": checkpointed and stopped early
    last_checkpoint: str | None = None


def default_run_name(config: RunConfig, tokens_per_step: int | None = None) -> str:
    m = config.model
    quant = f"-quant_{m.quant}" if m.attention == "sagebwd" and m.quant != "block" else ""
    return (f"{m.attention}-smooth_{m.smoothing}{quant}-qknorm_{'on' if m.qk_norm else 'off'}"
            f"-tps{tokens_per_step or config.tokens_per_step}")


def grid_tags(config: RunConfig, tokens_per_step: int | None = None) -> dict[str, str]:
    """The paper's grid axes, as tags so runs can be filtered and grouped in MLflow."""
    m = config.model
    tags = {"attention": m.attention, "smoothing": m.smoothing,
            "quant": m.quant if m.attention == "sagebwd" else "none",
            "qk_norm": str(m.qk_norm).lower(),
            "tokens_per_step": str(tokens_per_step or config.tokens_per_step),
            "model_preset": str(m.preset)}
    if config.tracking.tps_label:
        tags["tps"] = config.tracking.tps_label
    if os.environ.get(ENV_NODE):  # the node profile a grid job runs on
        tags["node"] = os.environ[ENV_NODE]
    return tags


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def micro_batch_loss(model, x: torch.Tensor, y: torch.Tensor, loss_impl: str, start_pos: int = 0) -> torch.Tensor:
    """The trainer's mean loss of one micro-batch, by `model.loss_impl`: "plain" (the reference)
    takes the logits out of the model; "chunked" has the model compute its LM head and loss
    without whole-batch logits (model/loss.py). `model` is the module, its engine or its
    compiled form (the trainer, launcher.profile_step and benchmarks.train_throughput)."""
    if loss_impl == "plain":
        return lm_loss(model(x, start_pos=start_pos), y)
    return model(x, start_pos=start_pos, targets=y)


def compile_model(model: Llama, mode: str = "default", backend: str = "inductor") -> None:
    """train.compile: nn.Module.compile in place (parameter names, and so checkpoints, unchanged), in
    train.compile_mode (the trainer and benchmarks.train_throughput)."""
    model.compile(backend=backend, **({} if mode == "default" else {"mode": mode}))


def uses_cuda_graphs(config: RunConfig) -> bool:
    return config.train.compile and config.train.compile_mode == "reduce-overhead"


class Shard:
    """This rank's slice of every sample: tokens [sp_rank * L/sp, (sp_rank+1) * L/sp)."""

    def __init__(self, layout: Layout, sp_rank: int, device: torch.device,
                 loss_impl: str = "plain", cuda_graphs: bool = False):
        self.start = sp_rank * layout.local_seq_len
        self.stop = self.start + layout.local_seq_len
        self.device = device
        self.loss_impl = loss_impl
        self.cuda_graphs = cuda_graphs   # train.compile_mode reduce-overhead

    def to_device(self, tokens: torch.Tensor) -> torch.Tensor:
        """A blocking host-to-GPU copy waits for all the work queued on the device (a stream
        sync per micro-batch: with gradient accumulation the GPU idles while the host launches
        the next forward). From pinned memory the copy is queued instead, and the caching host
        allocator keeps the pinned buffer until the copy is done. The same values either way."""
        if self.device.type == "cuda":
            return tokens.pin_memory().to(self.device, non_blocking=True)
        return tokens.to(self.device)

    def loss(self, engine, batch: Batch) -> torch.Tensor:
        """Mean loss over this rank's tokens. The SP ranks' losses average to the sample's
        loss, and their partial gradients sum to its gradient (see launcher.engine)."""
        x, y = (self.to_device(t[:, self.start:self.stop]) for t in batch)
        if self.cuda_graphs:
            # Each micro-batch is a new iteration for Inductor's CUDA graphs: the previous replay's
            # outputs may be overwritten (the callers copy what they keep: loss_sum, eval's total)
            torch.compiler.cudagraph_mark_step_begin()
        return micro_batch_loss(engine, x, y, self.loss_impl, self.start)


def _plain_grad_norm(engine) -> torch.Tensor | None:
    """Pre-clip global grad norm when DeepSpeed will not report one.

    With fp32 and no ZeRO the engine clips module grads in place but leaves
    get_global_grad_norm() as None; its ZeRO/bf16 optimizers do report it. The grads are
    already averaged over the world here, so every rank computes the same norm.
    """
    if engine.zero_optimization() or engine.bfloat16_enabled() or engine.fp16_enabled():
        return None
    norms = [p.grad.norm() for p in engine.module.parameters() if p.grad is not None]
    return torch.stack(norms).norm() if norms else torch.zeros((), device=engine.device)


def evaluate(engine, batches: list[Batch], shard: Shard) -> float:
    """The world's mean loss over the eval batches; the host reads it once, at the end."""
    engine.eval()
    total = torch.zeros((), dtype=torch.float64, device=shard.device)
    with torch.no_grad():
        for batch in batches:   # float64 sums, in order: the sum of the batches' float() values
            total += shard.loss(engine, batch).double()
    engine.train()
    return world_mean(total / len(batches)).item()


def train_step(engine, batches: Iterator[Batch], accum_steps: int,
               shard: Shard) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over `accum_steps` micro-batches -> (this rank's mean loss,
    pre-clip grad norm), float64 scalars on the device: nothing here waits for the device
    (launcher/step_metrics.py says why; the loop reads them at its read points).

    engine.step() is called after every micro-batch; DeepSpeed only updates the weights (and
    the lr schedule) at the accumulation boundary, and scales the loss by 1/accum_steps.
    """
    loss_sum = torch.zeros((), device=engine.device)
    grad_norm = None
    for _ in range(accum_steps):
        loss = shard.loss(engine, next(batches))
        engine.backward(loss)
        if engine.is_gradient_accumulation_boundary():
            grad_norm = _plain_grad_norm(engine)
        engine.step()
        loss_sum += loss.detach()
    if grad_norm is None:
        grad_norm = engine.get_global_grad_norm()
    return loss_sum.double() / accum_steps, as_float64(grad_norm, engine.device)


def step_metrics(done: PendingStep, loss: float, grad_norm: float, step_s: float,
                 layout: Layout, peak: float | None, flops_per_token: float) -> dict[str, float]:
    """One step's logged metrics. step_s: the mean step time of the steps read together (the
    host does not see when each one finished on the device)."""
    per_device = layout.tokens_per_step / step_s / layout.world
    metrics = {"loss": loss, "lr": done.lr, "grad_norm": grad_norm,
               "tokens_per_s": layout.tokens_per_step / step_s,
               "tokens_per_s_per_gpu": per_device, "tokens_seen": done.tokens_seen,
               "memory_gib": done.memory_gib}
    if peak:
        metrics["mfu"] = mfu(per_device, flops_per_token, peak)
    return metrics


def say_now(line: str) -> None:
    print(line, flush=True)  # progress must show up live in piped CI/demo logs


def start_tracking(config: RunConfig, name: str, model: Llama, layout: Layout,
                   state: checkpoint.TrainerState | None,
                   resumed: run_identity.ResumeCheck | None, checkpoint_path: str | None,
                   say: Callable[[str], None]) -> JournaledRun:
    """Create the run (or continue the one the checkpoint's journal names); rank 0 only.
    Metrics go through a journal next to the checkpoints (launcher.journal)."""
    t = config.tracking
    uri = resolve_tracking_uri(t.tracking_uri)
    folder = default_journal_dir(config.checkpoint.dir, t.experiment, name)
    if state and resumed.same_run:
        run = JournaledRun.resume(folder, step=state.step, tracking_uri=uri, say=say,
                                  legacy_run_id=state.mlflow_run_id,
                                  system_metrics=t.system_metrics)
        if run is not None:
            if resumed.changed:
                say(f"[{name}] resuming with changed keys (safe to change, logged on the run as "
                    "resume.changed.*): " + ", ".join(
                        f"{k} {a} -> {b}" for k, (a, b) in resumed.changed.items()))
                run.set_tags({f"resume.changed.{k}": f"{a} -> {b} at step {state.step}"
                              for k, (a, b) in resumed.changed.items()})
            return run
    counts = count_parameters(model)
    params = {**config.to_dict(), "derived": {
        **layout.as_dict(), "world_size": layout.world, "n_params": counts["total"],
        "n_params_non_embedding": counts["non_embedding"],
        "flops_per_token": train_flops_per_token(config.model)}}
    tags = grid_tags(config, layout.tokens_per_step)
    if state:   # a checkpoint of another run: continue it in a new MLflow run
        say(f"[{name}] checkpoint {checkpoint_path} continues in a new MLflow run, not in "
            f"run {state.mlflow_run_id}: {resumed.why_new_run or 'its journal is missing'}")
        tags.update({"sagebwd.forked_from_run": str(state.mlflow_run_id),
                     "sagebwd.forked_from_checkpoint": str(checkpoint_path),
                     "sagebwd.forked_at_step": str(state.step)})
    return JournaledRun.start(folder, experiment=t.experiment, run_name=name, params=params,
                              tags=tags, config_yaml=config_to_yaml(config.to_dict()),
                              tracking_uri=uri, say=say, system_metrics=t.system_metrics,
                              previous="other-run" if state else "earlier-run")


def train(config: RunConfig, *, resume: str = "none",
          say: Callable[[str], None] = say_now) -> RunResult:
    """Run one training run to completion (or divergence, or a stop signal)."""
    stop = StopRequest().install()
    if not torch.cuda.is_available():
        reuse_freed_memory()  # before threads start; faster CPU steps: see cpu_memory.py
    init_process_group()
    # Every check that can fail does so here, on every rank alike, before any collective.
    layout = resolve_layout(config, world_size())
    resume_from = checkpoint.resolve_resume(resume, config.checkpoint.dir,
                                            say=say if rank() == 0 else lambda _: None)
    name = config.tracking.run_name or default_run_name(config, layout.tokens_per_step)
    tracking_uri = resolve_tracking_uri(config.tracking.tracking_uri)
    resumed = run_identity.check_resume(
        checkpoint.read_identity(*resume_from), config, run_name=name, tracking_uri=tracking_uri,
        checkpoint=resume_from[0] / resume_from[1]) if resume_from else None

    sp_group, sp_rank = sequence_parallel_group(layout.sp)
    torch.manual_seed(config.seed)
    model = Llama(config.model)
    if layout.sp > 1:
        from model.sequence_parallel import enable_ulysses

        enable_ulysses(model, sp_group)
    if config.train.compile:
        compile_model(model, config.train.compile_mode)
    engine = build_engine(model, config, layout)
    from data_prep.loader import data_parallel_coords

    dp_rank, dp_world = data_parallel_coords(rank(), layout.world, layout.sp)
    train_batches, eval_batches = build_batches(config, dp_rank, dp_world)
    shard = Shard(layout, sp_rank, engine.device, config.model.loss_impl, uses_cuda_graphs(config))

    state = None
    if resume_from:
        state = checkpoint.load(engine, *resume_from)
        train_batches.load_state_dict(state.loader)
    start_step = state.step if state else 0
    result = RunResult(name=name, run_id=None, tracking_uri=None,
                       resumed_from=state.step if state else None)
    if start_step >= config.train.steps:
        say(f"[{name}] already finished ({start_step} steps in {resume_from[0]}); nothing to do")
        result.run_id = state.mlflow_run_id
        return result

    flops_per_token = train_flops_per_token(config.model)
    peak = device_peak_tflops(config.train.peak_tflops)
    where_from = str(resume_from[0] / resume_from[1]) if resume_from else None
    # From here on every way out goes through the `finally` below or leaves no run behind.
    tracker = (start_tracking(config, name, model, layout, state, resumed, where_from, say)
               if rank() == 0 else None)
    result.run_id = broadcast_object(tracker and tracker.run_id)  # one run for all ranks
    result.tracking_uri = tracking_uri
    if tracker:
        what = f"resumed at step {start_step} from {where_from}" if state else "started"
        say(f"[{name}] {what}: {count_parameters(model)['total']:,} params, "
            f"{layout.tokens_per_step:,} tokens/step = {layout.micro_batch} micro x "
            f"{layout.grad_accum} accum x {layout.dp} DP x {layout.seq_len} seq (SP {layout.sp}, "
            f"ZeRO {config.parallel.zero_stage}), MLflow run "
            f"{tracker.run_id or '(created when the server answers)'} in {tracking_uri}")

    tokens_seen = state.tokens_seen if state else 0
    saved_step = start_step if state else None

    def save_checkpoint(step: int) -> None:
        nonlocal saved_step
        if config.checkpoint.dir is None or saved_step == step:
            return
        if tracker:
            tracker.sync_to_disk()  # the journal holds every metric up to the checkpoint
        run_id = tracker.run_id if tracker else result.run_id   # rank 0's is the one written
        where = checkpoint.save(engine, config.checkpoint.dir, checkpoint.TrainerState(
            step=step, tokens_seen=tokens_seen, mlflow_run_id=run_id,
            loader=train_batches.state_dict(), rng=checkpoint.capture_rng()),
            config.checkpoint.keep_last, identity=run_identity.identity(
                config, run_name=name, run_id=run_id, tracking_uri=tracking_uri))
        saved_step, result.last_checkpoint = step, str(where)
        if tracker:
            say(f"[{name}] checkpoint saved at step {step}: {where}")

    def stop_diverged(done: PendingStep, metrics: dict[str, float]) -> None:
        result.diverged_at = done.step
        kept = (f"the last good checkpoint is step {saved_step} in "
                f"{config.checkpoint.dir}" if saved_step else "no checkpoint was saved")
        say(f"[{name}] loss {metrics['loss']}, grad norm {metrics['grad_norm']} at step "
            f"{done.step}: stopping (diverged); {kept}. Lower optimizer.lr or raise "
            "schedule.warmup_steps before resuming")
        if tracker:
            tracker.log_metrics(done.step, metrics, done.time_ms)
            tracker.set_tags({"diverged_at_step": str(done.step)})

    def take_in(read: list[PendingStep], values: list[tuple[float, float]],
                step_s: float) -> dict[str, float] | None:
        """Record and log the steps just read, in order, but for the last one, whose metrics
        come back for its eval and progress line. The first non-finite step stops the run:
        it is logged and reported as before, the steps after it are dropped (None back)."""
        for done, (loss, grad_norm) in zip(read, values):
            metrics = step_metrics(done, loss, grad_norm, step_s, layout, peak, flops_per_token)
            result.train_loss.append((done.step, loss))
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                stop_diverged(done, metrics)
                return None
            if done is not read[-1] and tracker:
                tracker.log_metrics(done.step, metrics, done.time_ms)
        return metrics

    status = "FAILED"
    started = time.perf_counter()
    step_seconds, timed_steps = 0.0, 0
    pending: list[PendingStep] = []   # steps whose values are still on the device
    try:
        with ScheduledCollection(config.train.gc_every) as collection:
            for step in range(start_step + 1, config.train.steps + 1):
                if not pending:
                    interval_start = time.perf_counter()
                lr = engine.get_lr()[0]  # the lr this step's update uses
                loss, grad_norm = train_step(engine, train_batches, layout.grad_accum, shard)
                collection.step(step)   # while the device works through the step just queued
                tokens_seen += layout.tokens_per_step
                pending.append(PendingStep(step, loss, grad_norm, lr, tokens_seen, memory_gib(),
                                           time_ms=int(time.time() * 1000)))
                # Every step, whether any rank got a signal: a vote in host memory (no device wait),
                # so a stop still comes at the end of the step it was asked in.
                stop_voted = any_rank(stop.requested)
                if not (stop_voted or is_read_point(config, step, start_step + 1)):
                    continue
                # The NaN guard sees the steps since the last read point only now: a non-finite step
                # stops the run here, at most one read interval after it, and is reported as the
                # step it happened at. No checkpoint is saved in between (checkpoints are read points).
                read, pending = pending, []
                values = read_metrics(read)   # the host waits for the device here, once for them all
                dt = time.perf_counter() - interval_start
                if read[0].step > start_step + 1:  # the first step of a process includes warm-up
                    step_seconds, timed_steps = step_seconds + dt, timed_steps + len(read)
                metrics = take_in(read, values, dt / len(read))
                if metrics is None:
                    break

                is_last = step == config.train.steps
                if step % config.eval.every == 0 or is_last:
                    metrics["eval_loss"] = evaluate(engine, eval_batches, shard)
                    result.eval_loss.append((step, metrics["eval_loss"]))
                if tracker:
                    tracker.log_metrics(step, metrics, read[-1].time_ms)
                    if step % config.tracking.flush_every == 0:
                        tracker.flush()
                if tracker and (step == start_step + 1 or step % config.train.log_every == 0
                                or is_last):
                    say(progress_line(name, step, config.train.steps, metrics))
                if stop_voted:
                    save_checkpoint(step)
                    result.stopped_by = stop.signal_name or "a peer rank's signal"
                    if tracker:
                        say(f"[{name}] {result.stopped_by}: stopped after step {step}; continue "
                            "with --resume auto")
                    break
                if is_last or (config.checkpoint.every and step % config.checkpoint.every == 0):
                    save_checkpoint(step)
        status = ("FAILED" if result.diverged_at else
                  "KILLED" if result.stopped_by else "FINISHED")
    finally:
        result.wall_s = time.perf_counter() - started
        if timed_steps:
            result.tokens_per_s = timed_steps * layout.tokens_per_step / step_seconds
        if tracker:
            if status != "KILLED":
                tracker.log_json(run_summary(result, layout, peak, flops_per_token, status),
                                 "summary.json")
            tracker.finish(status)
            result.run_id = tracker.run_id   # created late if the server was away at the start
        # Its gradient hooks would keep the engine, the model and the optimizer state alive after
        # train() returns (the demo and the tests train several runs in one process).
        engine.destroy()
    return result


def run_summary(result: RunResult, layout: Layout, peak: float | None,
                flops_per_token: float, status: str) -> dict:
    per_device = result.tokens_per_s / layout.world
    return {"status": status, "layout": layout.as_dict(),
            "final_train_loss": result.train_loss[-1][1] if result.train_loss else None,
            "final_eval_loss": result.eval_loss[-1][1] if result.eval_loss else None,
            "tokens_per_s": result.tokens_per_s, "tokens_per_s_per_gpu": per_device,
            "mfu": mfu(per_device, flops_per_token, peak) if peak else None,
            "peak_tflops": peak, "wall_s": result.wall_s, "diverged_at": result.diverged_at,
            "resumed_from": result.resumed_from}


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
    parser.add_argument("--resume", default="none", metavar="auto|none|PATH",
                        help="auto: continue from the newest checkpoint in checkpoint.dir if "
                        "there is one (else start fresh); PATH: a checkpoint folder")
    # The `deepspeed` launcher appends --local_rank=N (it also sets LOCAL_RANK, which we read).
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--traceback", action="store_true",
                        default=os.environ.get(TRACEBACK_ENV, "") not in ("", "0"),
                        help="on an error, print the full traceback on every rank (default: one "
                        f"line from rank 0; also ${TRACEBACK_ENV}=1)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config value, e.g. "
                        "--set model.attention=sagebwd (repeatable)")
    return parser.parse_args(argv)


TRACEBACK_ENV = "SAGEBWD_TRACEBACK"


def report_error(err: Exception, full: bool) -> int:
    """The message of a run that could not go on: one line (plus the message's own lines) on
    rank 0; the other ranks, which check the same things, stay quiet unless their error is
    of another kind. -> the exit status: 2 for a config/input problem, 1 otherwise."""
    from data_prep.errors import DataPrepError
    from launcher.journal import JournalError

    expected = isinstance(err, (ConfigError, DataPrepError, JournalError))
    if full:
        import traceback

        traceback.print_exception(err, file=sys.stderr)
    elif rank() == 0 or not expected:
        where = "" if rank() == 0 else f"[rank {rank()}] "
        kind = "" if expected else f"{type(err).__name__}: "
        hint = "" if expected else f" (--traceback or {TRACEBACK_ENV}=1 for the traceback)"
        print(f"{where}error: {kind}{err}{hint}", file=sys.stderr, flush=True)
    return 2 if expected else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    try:
        config = load_run_config(args.config, args.overrides)
        result = train(config, resume=args.resume)
    except Exception as err:  # noqa: BLE001 - one line per failure, the traceback on request
        return report_error(err, args.traceback)
    if result.diverged_at:
        return 1
    return EXIT_STOPPED if result.stopped_by else 0


if __name__ == "__main__":
    exit_after_run(main())
