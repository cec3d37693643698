"""The typed run config: one YAML file (+ `--set` overrides) -> one validated RunConfig.

All checks live here, so a bad config fails before any process group, engine or MLflow
run is created. Sections map one-to-one onto the parts of the trainer that read them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from launcher.layout import check_static_layout
from launcher.overrides import ConfigError, apply_overrides
from model import ModelConfig


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataConfig(Section):
    """Which tokenised corpus to read."""

    # A folder written by `python -m data_prep prepare`, or "shakespeare-demo": the demo
    # corpus, prepared on first use under .cache/data/shakespeare.
    path: str = "shakespeare-demo"
    # "sha256" hashes every shard on open (~1 s/GB); "size" only checks lengths.
    verify: Literal["sha256", "size"] = "sha256"


class OptimizerConfig(Section):
    """AdamW; weight decay applies to matrices only (not norm scales)."""

    lr: float = Field(3e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    grad_clip: float = Field(1.0, ge=0, description="max global grad norm; 0 disables")


class ScheduleConfig(Section):
    """Linear warmup to optimizer.lr, then cosine decay to min_lr_ratio * lr."""

    kind: Literal["warmup_cosine"] = "warmup_cosine"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)


class TrainConfig(Section):
    steps: int = Field(gt=0, description="optimizer steps")
    micro_batch_size: int = Field(gt=0, description="sequences per data-parallel rank per forward")
    # None: derived from tokens_per_step (or 1 without a target); see launcher.layout.
    grad_accum_steps: int | None = Field(None, gt=0)
    # The paper's TPS: global batch x seq_len. None: whatever micro x accum x DP gives.
    tokens_per_step: int | None = Field(None, gt=0)
    # auto: bf16 on GPU (the paper), fp32 on CPU (bf16 matmuls are slow there).
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    # DeepSpeed's bf16 overflow check (`bf16.check_grad_overflow`), read by its ZeRO-1/2
    # optimizer only (fp32 runs have no check; ZeRO 0's bf16 optimizer always checks the grad
    # norm; ZeRO 3 checks fp16 only). On (DeepSpeed's default): every step runs an amax and an
    # amin over every gradient tensor and reads the result on the host (one `.item()`, plus one
    # `bool()` of the grad norm), so the host waits for the device mid-step; a non-finite
    # gradient skips the step. Off by default here: on an H100 (gpu-124m, seq 4096, compiled) the
    # check cost 8.9 of the real engine's 62.8 ms per step (docs/benchmarks.md, "The real
    # DeepSpeed engine"). Off, a non-finite gradient reaches the weights instead, and the
    # trainer's NaN guard stops the run at its next read point, before any checkpoint, as it does
    # with the check on (DeepSpeed reports a skipped step's grad norm as inf); no finite step
    # changes. The clipping's two reads stay while optimizer.grad_clip > 0.
    check_grad_overflow: bool = False
    # The dtype DeepSpeed accumulates gradients in with bf16 (`data_types.grad_accum_dtype`).
    # "bf16" (DeepSpeed's default at ZeRO 1-2 with bf16): its ZeRO optimizer, whose hooks and step
    # loop over every parameter tensor in Python (tools.zero_step_ops: 21 aten ops and 47 Python
    # calls a tensor a step on the CPU). "fp32": DeepSpeed's BF16_Optimizer at ZeRO 1 (9 ops, 1 call
    # a tensor), with an fp32 gradient buffer (4 bytes a parameter) and the gradients summed in
    # fp32: the numbers change in the last bits, so a resumed run keeps its value. Not yet timed
    # on a GPU; the A/B: docs/benchmarks.md, "Where DeepSpeed's step spends host work".
    grad_accum_dtype: Literal["bf16", "fp32"] = "bf16"
    log_every: int = Field(10, gt=0, description="print a progress line every N steps")
    # Python's garbage collection during training (launcher/garbage.py): N > 0 turns the automatic collector off and
    # collects generations 0-1 after every N-th step, as torchtitan (training.gc_freq, default 50) and Megatron-LM
    # (--manual-gc) do; 0 (the default until a GPU A/B decides: docs/measurements/gpu-next-1204.sh) leaves Python's
    # automatic collection. A pause holds the host, which decides the step where DeepSpeed's optimizer step waits on
    # the device and then issues its kernels (docs/kernel-notes.md, "Twenty-eighth session"). Numbers are unchanged
    # either way. benchmarks.train_throughput records each row's pauses.
    gc_every: int = Field(0, ge=0, description="collect Python's young garbage every N steps (0: automatic)")
    # Dense bf16 peak per device for MFU; None: looked up from the GPU's name.
    peak_tflops: float | None = Field(None, gt=0)
    # torch.compile the model (Inductor's default mode; nn.Module.compile, so the state dict and
    # checkpoints keep their names). Fuses the elementwise layers (norms, RoPE, SwiGLU): about
    # half the step time of the eager model on an H200 at seq 4096 (docs/benchmarks.md, "A
    # training step under torch.compile"); the first steps pay the compilation. SageBwd stays
    # one opaque op in the graph; under Ulysses SP the attention wrapper runs eagerly
    # (model/sequence_parallel.py says why).
    compile: bool = False
    # Inductor's mode with train.compile. "reduce-overhead" also replays the model's forward and
    # backward from CUDA graphs (Inductor's cudagraph trees; a no-op on the CPU): the host no
    # longer launches each kernel, which matters where it cannot keep up with the GPU. SageBwd's
    # op issues ~2 ms of host work per forward + backward (docs/benchmarks.md, "Host time"), so
    # with it the trainer can be host-bound: on an H100 (gpu-124m, seq 4096, real engine) token
    # 73.3 -> 60.4 ms per step, FPA 60.1 -> 55.4 (docs/benchmarks.md, "CUDA graphs in the
    # trainer"). Opt-in: the losses are not bit-identical to the default mode's (neither are two
    # default runs on a GPU; 40 steps of gpu-124m stayed within 0.08% for token, 3.7% for FPA in
    # its spiky warm-up, against 0.015% / 0.7% between two default runs); each new input shape
    # (eval) records its own graph, whose memory pool stays reserved. SP 1 only.
    compile_mode: Literal["default", "reduce-overhead"] = "default"


class ParallelConfig(Section):
    """World = data-parallel x sequence-parallel; DP is whatever the world leaves after SP."""

    sp: int = Field(1, gt=0, description="DeepSpeed-Ulysses sequence-parallel group size")
    zero_stage: int = Field(1, ge=0, le=3)


class CheckpointConfig(Section):
    """DeepSpeed checkpoints plus the trainer's own state; resume with --resume auto."""

    dir: str | None = None          # None: no checkpoints (and nothing to resume)
    every: int = Field(0, ge=0, description="save every N steps; 0: only on signals and at the end")
    keep_last: int = Field(2, gt=0)


class EvalConfig(Section):
    every: int = Field(100, gt=0, description="eval loss every N steps (and after the last)")
    batches: int = Field(4, gt=0, description="validation batches per eval")


class TrackingConfig(Section):
    experiment: str = "sagebwd"
    run_name: str | None = None
    # None -> $MLFLOW_TRACKING_URI, else sqlite:///<repo>/.cache/mlflow.db
    tracking_uri: str | None = None
    # Metrics are buffered and written with one log_batch call per flush (~20 ms each on sqlite).
    flush_every: int = Field(50, gt=0)
    # The manifest's TPS label ("2.1m"), logged as the `tps` tag; None: no tag.
    tps_label: str | None = None
    # MLflow's CPU/GPU/memory sampler thread for the run.
    system_metrics: bool = True


class RunConfig(Section):
    """Everything one training run needs. Checks that need the world size (TPS vs DP) are in
    launcher.layout; everything else is checked here."""

    seed: int = 1337
    model: ModelConfig
    data: DataConfig = DataConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    train: TrainConfig
    parallel: ParallelConfig = ParallelConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    tracking: TrackingConfig = TrackingConfig()

    @property
    def tokens_per_step(self) -> int:
        """The TPS target, or (without one) the tokens of one data-parallel replica's step;
        launcher.layout.resolve_layout gives the world's actual number."""
        if self.train.tokens_per_step:
            return self.train.tokens_per_step
        return self.train.micro_batch_size * (self.train.grad_accum_steps or 1) * self.model.seq_len

    @model_validator(mode="after")
    def _check_cross_section(self) -> "RunConfig":
        problems = cross_section_problems(self)
        if problems:
            raise ValueError("\n  ".join(problems))
        return self

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved config (presets expanded), as plain YAML-able data."""
        return self.model_dump(mode="json")


def cross_section_problems(config: RunConfig) -> list[str]:
    """Every rule across sections, all at once (also run when other keys failed: see
    build_run_config)."""
    problems = []
    if config.schedule.warmup_steps > config.train.steps:
        problems.append(f"schedule.warmup_steps ({config.schedule.warmup_steps}) exceeds "
                        f"train.steps ({config.train.steps}); lower the warmup")
    if config.train.grad_accum_dtype == "fp32" and config.parallel.zero_stage != 1:
        problems.append(f"train.grad_accum_dtype fp32 needs parallel.zero_stage 1 (DeepSpeed's BF16_Optimizer), "
                        f"not {config.parallel.zero_stage}; set the stage to 1 or the dtype to bf16")
    if config.train.compile_mode != "default" and not config.train.compile:
        problems.append(f"train.compile_mode {config.train.compile_mode} needs train.compile: true; set it, "
                        f"or leave compile_mode at default")
    if config.train.compile_mode == "reduce-overhead" and config.parallel.sp > 1:
        problems.append(f"train.compile_mode reduce-overhead runs with parallel.sp 1 only (Ulysses' all-to-alls "
                        f"run eagerly between the compiled parts; CUDA graphs around them are untested), not "
                        f"{config.parallel.sp}; use compile_mode default with sequence parallelism")
    try:
        check_static_layout(config)
    except ValueError as err:
        problems.append(str(err))
    return problems


def _cross_section_despite(raw: dict[str, Any]) -> list[str]:
    """The cross-section problems of a config whose other keys failed validation: each
    section the rules read is validated on its own, unknown keys dropped (they are reported
    already); a section that still fails hides the rules that read it."""
    parts: dict[str, Any] = {}
    for key in ("model", "train", "schedule", "parallel"):
        section_type = RunConfig.model_fields[key].annotation
        given = raw.get(key, {}) if isinstance(raw, dict) else {}
        if not isinstance(given, dict):
            return []
        known = set(section_type.model_fields) | {"preset"}
        try:
            parts[key] = section_type.model_validate({k: v for k, v in given.items() if k in known})
        except ValidationError:
            return []
    return cross_section_problems(RunConfig.model_construct(**parts))


def _describe(error: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "<top level>"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key (check the spelling; see launcher/config.py for the fields)"
    if error["type"] == "missing":
        return f"{where}: required but not set"
    if error["type"] == "value_error":  # our own cross-field checks name their keys already
        return error["msg"].removeprefix("Value error, ")
    return f"{where}: {error['msg']} (got {error.get('input')!r})"


def build_run_config(raw: dict[str, Any], source: str = "config") -> RunConfig:
    """Validate a nested dict; every problem is reported at once with its key path."""
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        described = [_describe(e) for e in err.errors()]
        if not any(e["type"] == "value_error" and not e["loc"] for e in err.errors()):
            described += _cross_section_despite(raw)
        lines = "\n  ".join(described)
        raise ConfigError(f"invalid run config ({source}):\n  {lines}") from None


def load_run_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read YAML, apply `key.path=value` overrides, validate."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass --config with a YAML file "
                          "such as experiments/configs/cpu-tiny.yaml")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, got {type(raw).__name__}")
    return build_run_config(apply_overrides(raw, overrides or []), source=str(path))
