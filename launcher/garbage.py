"""Python's garbage collection in the training loop: on a schedule instead of whenever allocations pass a threshold.

CPython's automatic collector runs whenever the count of new container objects passes a threshold, and now and then
a full collection walks every object the process holds (a compiled model's graphs and caches among them). A pause
holds the host, and where the host decides the step (DeepSpeed's optimizer step waits on the device, then issues its
kernels one by one) the device waits through it. The field's trainers switch the automatic collector off and collect
the young generations every N steps (torchtitan's `training.gc_freq`, Megatron-LM's `--manual-gc`); `train.gc_every`
does that here, opt-in: on the CPU 20 timed steps of cpu-tiny saw no collection with the manual engine and one of
generation 0 with DeepSpeed's, and the GPU trainer's A/B is prepared (docs/measurements/gpu-next-1204.sh).
"""
from __future__ import annotations

import gc
import time


class ScheduledCollection:
    """A context for the training loop: with `every` > 0 the automatic collector is off inside it and `step(i)`
    collects generations 0 and 1 after every `every`-th step (a full collection first, so the loop starts clean);
    with 0 Python collects as it would. The collector's state before is restored after."""

    def __init__(self, every: int):
        if every < 0:
            raise ValueError(f"gc every {every} steps: give 0 (Python's automatic collection) or a positive count")
        self.every = every
        self._was_enabled = True

    def __enter__(self) -> "ScheduledCollection":
        self._was_enabled = gc.isenabled()
        if self.every:
            gc.collect()
            gc.disable()
        return self

    def step(self, step: int) -> None:
        if self.every and step % self.every == 0:
            gc.collect(1)

    def __exit__(self, *exc) -> None:
        if self._was_enabled:
            gc.enable()


class CollectionPauses:
    """The collector's pauses while inside: {"collections": [gen 0, gen 1, gen 2 counts], "ms": total}, from
    gc.callbacks (both automatic and explicit collections)."""

    def __init__(self):
        self.collections = [0, 0, 0]
        self.ms = 0.0
        self._started = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.collections[info["generation"]] += 1
            self.ms += (time.perf_counter() - self._started) * 1000.0
            self._started = None

    def __enter__(self) -> "CollectionPauses":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self, steps: int) -> dict:
        return {"collections": list(self.collections), "ms_per_step": self.ms / steps if steps else 0.0}
