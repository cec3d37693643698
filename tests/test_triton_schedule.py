"""The order in which the attention kernels' programs start (sagebwd/triton/schedule.py): every (tile rank,
head) exactly once, rank-major within a section of heads, sections of equal size within the L2 budget.

program_tile runs in Triton's CPU interpreter, in a subprocess (TRITON_INTERPRET=1 must be set before Triton
is first imported; see test_triton_interpreter.py), on a kernel that writes each program's (rank, head).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sagebwd.triton import schedule  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# (tiles per head, heads, heads per section): ragged last sections, one head per section, one section
GRIDS = [(4, 5, 2), (3, 7, 3), (5, 4, 1), (2, 6, 6), (6, 10, 4)]

_SCRIPT = """
import json, sys
import torch, triton, triton.language as tl
from sagebwd.triton._common import program_tile

@triton.jit
def where(OUT, TILES, SECTION):
    rank, bh = program_tile(TILES, SECTION)
    tl.store(OUT + 2 * tl.program_id(0), rank)
    tl.store(OUT + 2 * tl.program_id(0) + 1, bh)

for tiles, heads, section in json.loads(sys.argv[1]):
    out = torch.full((tiles * heads, 2), -1, dtype=torch.int32)
    where[(tiles * heads,)](out, tiles, section)
    print(json.dumps(out.tolist()))
"""


@pytest.fixture(scope="module")
def orders():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(GRIDS)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("case", range(len(GRIDS)))
def test_every_tile_of_every_head_runs_once_rank_major_within_a_section(orders, case):
    tiles, heads, section = GRIDS[case]
    order = [tuple(p) for p in orders[case]]
    assert sorted(order) == [(r, h) for r in range(tiles) for h in range(heads)]
    expected = []
    for first in range(0, heads, section):
        members = range(first, min(heads, first + section))
        expected += [(r, h) for r in range(tiles) for h in members]
    assert order == expected
    if section == 1:   # one head per section: head-major, what the kernels ran before
        assert order == [(r, h) for h in range(heads) for r in range(tiles)]


def test_sections_fill_the_l2_budget_in_equal_parts():
    mib = 2**20
    per_head = torch.empty(48, 2 * mib, dtype=torch.int8)   # 2 MiB a head: 8 heads in 16 MiB
    assert schedule.heads_per_section(True, 48, (per_head,)) == 8
    # 33 heads, at most 8 a section: 5 sections of 7 (7, 7, 7, 7, 5), not 8, 8, 8, 8 and a last one of 1
    assert schedule.heads_per_section(True, 33, (torch.empty(33, 2 * mib, dtype=torch.int8),)) == 7
    assert schedule.heads_per_section(True, 12, (torch.empty(12, 1024, dtype=torch.int8),)) == 12   # all fit
    big = torch.empty(3, 40 * mib, dtype=torch.int8)   # a head larger than the budget: one per section
    assert schedule.heads_per_section(True, 3, (big,)) == 1
    assert schedule.heads_per_section(False, 48, (per_head,)) == 1   # no mask: equal tiles, head-major
    assert schedule.heads_per_section(True, 48, (per_head, None)) == 8   # placeholders are not read
    assert schedule.tile_grid(32, 48) == (32 * 48,)
