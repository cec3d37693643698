"""How a run's world is shaped: data-parallel x sequence-parallel, and how the tokens per
step (TPS) split into micro-batch x grad-accum x DP.

    world = dp * sp                          (each SP group: sp consecutive ranks, one sample)
    global batch = micro_batch * grad_accum * dp
    TPS = global batch * seq_len             (the paper: 2.1M = 512 x 4096, 260K = 64 x 4096)

check_static_layout runs while the config is validated (no world size needed);
resolve_layout runs once the world size is known, before any model or engine exists, so
every rank fails with the same message instead of one rank hanging in a collective.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from launcher.overrides import ConfigError

if TYPE_CHECKING:
    from launcher.config import RunConfig


@dataclass(frozen=True)
class Layout:
    world: int
    dp: int
    sp: int
    micro_batch: int
    grad_accum: int
    seq_len: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def local_seq_len(self) -> int:
        """Tokens of each sample one rank holds outside attention."""
        return self.seq_len // self.sp

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "global_batch": self.global_batch,
                "tokens_per_step": self.tokens_per_step}


def check_static_layout(config: "RunConfig") -> None:
    """The rules that do not depend on the world size (raised as ValueError: the config
    validator reports them with the rest)."""
    m, sp, tps = config.model, config.parallel.sp, config.train.tokens_per_step
    problems = []   # all of them at once
    if m.num_heads % sp:
        problems.append(
            f"model.num_heads ({m.num_heads}) must be divisible by parallel.sp ({sp}): Ulysses "
            f"gives each rank of an SP group num_heads/sp whole heads (gloo cannot do uneven "
            f"all-to-all); choose parallel.sp from the divisors of {m.num_heads}")
    if m.seq_len % sp:
        problems.append(f"model.seq_len ({m.seq_len}) must be divisible by parallel.sp ({sp}): "
                         "each rank of an SP group holds seq_len/sp tokens of a sample")
    if tps is not None and tps % m.seq_len:
        problems.append(
            f"train.tokens_per_step ({tps}) must be a whole number of sequences of "
            f"model.seq_len ({m.seq_len}); e.g. {max(1, tps // m.seq_len) * m.seq_len}")
    if problems:
        raise ValueError("\n  ".join(problems))


def resolve_layout(config: "RunConfig", world_size: int) -> Layout:
    """micro x accum x DP for this world; ConfigError names the keys and the fix."""
    sp, micro, seq = config.parallel.sp, config.train.micro_batch_size, config.model.seq_len
    if world_size % sp:
        raise ConfigError(
            f"parallel.sp ({sp}) must divide the world size ({world_size} processes); launch a "
            f"multiple of {sp} processes or change parallel.sp")
    dp = world_size // sp
    accum = config.train.grad_accum_steps
    target = config.train.tokens_per_step
    if target is None:
        return Layout(world_size, dp, sp, micro, accum or 1, seq)
    global_batch = target // seq
    per_accum = micro * dp
    if global_batch % per_accum:
        raise ConfigError(
            f"train.tokens_per_step ({target:,} = {global_batch} sequences of {seq}) cannot be "
            f"met with train.micro_batch_size ({micro}) x {dp} data-parallel ranks "
            f"(world {world_size} / parallel.sp {sp}) = {per_accum} sequences per accumulation "
            f"step: {global_batch} is not a multiple of {per_accum}. Pick a micro batch that "
            f"divides {global_batch // dp if global_batch % dp == 0 else global_batch} per rank, "
            "or change the number of processes")
    derived = global_batch // per_accum
    if accum is not None and accum != derived:
        raise ConfigError(
            f"train.grad_accum_steps ({accum}) contradicts train.tokens_per_step ({target:,}): "
            f"{micro} x {accum} x {dp} DP ranks x {seq} = {micro * accum * dp * seq:,} tokens; "
            f"the target needs grad_accum_steps={derived}. Drop one of the two keys")
    return Layout(world_size, dp, sp, micro, derived, seq)
