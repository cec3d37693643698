"""launcher.garbage: Python's collector on the training loop's schedule, and its pauses counted."""
from __future__ import annotations

import gc

import pytest

from launcher.garbage import CollectionPauses, ScheduledCollection


def test_the_schedule_turns_the_collector_off_and_collects_young_generations_every_n_steps():
    assert gc.isenabled()
    with CollectionPauses() as pauses, ScheduledCollection(3) as collection:
        assert not gc.isenabled()
        assert pauses.collections[1:] == [0, 1]   # a full collection first: the loop starts clean
        for step in range(1, 8):
            collection.step(step)
            assert pauses.collections[1] == step // 3, (step, pauses.collections)
    assert gc.isenabled()
    assert pauses.collections[1:] == [2, 1] and pauses.ms > 0   # generation 0: Python's own, once it is back on
    assert pauses.summary(7) == {"collections": pauses.collections, "ms_per_step": pytest.approx(pauses.ms / 7)}


def test_zero_leaves_python_to_collect():
    with CollectionPauses() as pauses, ScheduledCollection(0) as collection:
        assert gc.isenabled()
        for step in range(1, 5):
            collection.step(step)
    assert gc.isenabled() and pauses.collections[1:] == [0, 0]


def test_a_collector_off_before_stays_off():
    gc.disable()
    try:
        with ScheduledCollection(2):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_negative_interval_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="give 0"):
        ScheduledCollection(-1)
