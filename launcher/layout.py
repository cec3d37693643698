"""How a run's world is shaped: data-parallel x sequence-parallel, and how the tokens per
step (TPS) split into micro-batch x grad-accum x DP. The one home of that rule: the trainer
(resolve_layout, below) and the manifest planner (experiments.grid.layout) both call
split_tokens_per_step and word its failures in their own keys.

    world = dp * sp                          (each SP group: sp consecutive ranks, one sample)
    global batch = micro_batch * grad_accum * dp
    TPS = global batch * seq_len             (the paper: 2.1M = 512 x 4096, 260K = 64 x 4096)

Integer arithmetic only: a TPS that does not split evenly is an error, never rounded.
check_static_layout runs while the run config is validated (no world size needed);
resolve_layout runs once the world size is known, before any model or engine exists, so
every rank fails with the same message instead of one rank hanging in a collective. Both
take a launcher.config.RunConfig (read, not imported: the config imports this module).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from launcher.overrides import ConfigError


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


# Which division of the rule failed (LayoutError.reason).
SP_WORLD = "sp does not divide the world"
WHOLE_SEQUENCES = "TPS is not a whole number of sequences"
OVER_DP = "the global batch does not split over the DP ranks"
MICRO_BATCH = "the micro-batch does not divide the sequences per rank"


class LayoutError(ValueError):
    """A TPS that does not split; `reason` says which division failed, the other attributes
    hold the numbers reached so far, for the caller's message."""

    def __init__(self, reason: str, *, dp: int | None = None, global_batch: int | None = None,
                 per_rank: int | None = None):
        super().__init__(reason)
        self.reason, self.dp, self.global_batch, self.per_rank = reason, dp, global_batch, per_rank


def sp_misfits(sp: int, **sizes: int) -> dict[str, int]:
    """The sizes `sp` does not divide. Ulysses gives each rank of an SP group seq_len/sp
    tokens and num_heads/sp whole heads (gloo cannot do uneven all-to-all), and the world
    is made of whole SP groups."""
    return {name: size for name, size in sizes.items() if size % sp}


def largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def split_tokens_per_step(tokens_per_step: int, *, seq_len: int, world: int, sp: int,
                          micro_batch: int | None = None,
                          max_micro_batch: int | None = None) -> Layout:
    """The rule: TPS -> micro x accum x DP. Without a micro_batch, the largest divisor of the
    sequences per rank up to max_micro_batch (what fits in memory; a smaller divisor keeps
    TPS exact). Raises LayoutError."""
    if world % sp:
        raise LayoutError(SP_WORLD)
    dp = world // sp
    if tokens_per_step % seq_len:
        raise LayoutError(WHOLE_SEQUENCES, dp=dp)
    global_batch = tokens_per_step // seq_len
    if global_batch % dp:
        raise LayoutError(OVER_DP, dp=dp, global_batch=global_batch)
    per_rank = global_batch // dp
    if micro_batch is None:
        micro_batch = largest_divisor_at_most(per_rank, max_micro_batch or per_rank)
    if per_rank % micro_batch:
        raise LayoutError(MICRO_BATCH, dp=dp, global_batch=global_batch, per_rank=per_rank)
    return Layout(world, dp, sp, micro_batch, per_rank // micro_batch, seq_len)


def check_static_layout(config) -> None:
    """The rules that do not depend on the world size (raised as ValueError: the config
    validator reports them with the rest)."""
    m, sp, tps = config.model, config.parallel.sp, config.train.tokens_per_step
    problems = []   # all of them at once
    misfits = sp_misfits(sp, num_heads=m.num_heads, seq_len=m.seq_len)
    if "num_heads" in misfits:
        problems.append(
            f"model.num_heads ({m.num_heads}) must be divisible by parallel.sp ({sp}): Ulysses "
            f"gives each rank of an SP group num_heads/sp whole heads (gloo cannot do uneven "
            f"all-to-all); choose parallel.sp from the divisors of {m.num_heads}")
    if "seq_len" in misfits:
        problems.append(f"model.seq_len ({m.seq_len}) must be divisible by parallel.sp ({sp}): "
                         "each rank of an SP group holds seq_len/sp tokens of a sample")
    if tps is not None and tps % m.seq_len:
        problems.append(
            f"train.tokens_per_step ({tps}) must be a whole number of sequences of "
            f"model.seq_len ({m.seq_len}); e.g. {max(1, tps // m.seq_len) * m.seq_len}")
    if problems:
        raise ValueError("\n  ".join(problems))


def resolve_layout(config, world_size: int) -> Layout:
    """micro x accum x DP for this world; ConfigError names the keys and the fix."""
    sp, micro, seq = config.parallel.sp, config.train.micro_batch_size, config.model.seq_len
    if sp_misfits(sp, world=world_size):
        raise ConfigError(
            f"parallel.sp ({sp}) must divide the world size ({world_size} processes); launch a "
            f"multiple of {sp} processes or change parallel.sp")
    dp = world_size // sp
    accum = config.train.grad_accum_steps
    target = config.train.tokens_per_step
    if target is None:
        return Layout(world_size, dp, sp, micro, accum or 1, seq)
    try:
        layout = split_tokens_per_step(target, seq_len=seq, world=world_size, sp=sp,
                                       micro_batch=micro)
    except LayoutError:   # the static check made TPS whole sequences: DP or micro is off
        global_batch, per_accum = target // seq, micro * dp
        raise ConfigError(
            f"train.tokens_per_step ({target:,} = {global_batch} sequences of {seq}) cannot be "
            f"met with train.micro_batch_size ({micro}) x {dp} data-parallel ranks "
            f"(world {world_size} / parallel.sp {sp}) = {per_accum} sequences per accumulation "
            f"step: {global_batch} is not a multiple of {per_accum}. Pick a micro batch that "
            f"divides {global_batch // dp if global_batch % dp == 0 else global_batch} per rank, "
            "or change the number of processes") from None
    if accum is not None and accum != layout.grad_accum:
        raise ConfigError(
            f"train.grad_accum_steps ({accum}) contradicts train.tokens_per_step ({target:,}): "
            f"{micro} x {accum} x {dp} DP ranks x {seq} = {micro * accum * dp * seq:,} tokens; "
            f"the target needs grad_accum_steps={layout.grad_accum}. Drop one of the two keys")
    return layout
