"""The statistics over seeds, written once: the seed study (experiments.seeds) and the
comparison's over-seeds table (experiments.compare.over_seeds) both use `summarise`.

A value per seed (a run's final eval loss), and optionally the baseline's value per seed
(FPA's on the same seed: same initialisation, same data order). The gap is paired: the
mean over seeds of (value - baseline) on the seeds both have, with its standard error
sd / sqrt(n), so the noise the two runs of one seed share cancels.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping


@dataclass(frozen=True)
class SeedSummary:
    seeds: int                  # values counted
    mean: float | None          # mean over seeds (None: no value)
    sd: float | None            # sample standard deviation over seeds (None below two)
    gap: float | None           # mean paired difference to the baseline (None: no pair)
    gap_se: float | None        # its standard error (None below two pairs)
    paired_seeds: int           # seeds with both a value and a baseline value


def mean_sd(values: Iterable[float]) -> tuple[float | None, float | None]:
    values = list(values)
    return (statistics.fmean(values) if values else None,
            statistics.stdev(values) if len(values) > 1 else None)


def summarise(by_seed: Mapping[Hashable, float],
              baseline: Mapping[Hashable, float] | None = None) -> SeedSummary:
    """Mean and sd of the values over seeds; with a baseline, the paired gap and its s.e."""
    mean, sd = mean_sd(by_seed.values())
    gaps = [value - baseline[s] for s, value in by_seed.items() if s in baseline] \
        if baseline is not None else []
    gap, gap_sd = mean_sd(gaps)
    return SeedSummary(seeds=len(by_seed), mean=mean, sd=sd, gap=gap,
                       gap_se=gap_sd / math.sqrt(len(gaps)) if gap_sd is not None else None,
                       paired_seeds=len(gaps))
