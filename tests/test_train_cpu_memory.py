"""The CPU allocator setting really stops big tensors from being re-faulted every step."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

# Run in a fresh interpreter: glibc binds threads to malloc arenas, and after other tests'
# thread pools have run, the pytest main thread may sit on an arena the setting cannot help.
PROBE = """
import resource, sys, torch
from launcher.cpu_memory import reuse_freed_memory

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(50_000_000)  # 200 MB, ~49k pages
    t.fill_(1.0)                 # touch every page
    del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

applied = reuse_freed_memory() if sys.argv[1] == "on" else False
faults()                         # the first one grows the heap
print(applied, faults())
"""


def second_allocation_faults(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    return out[0] == "True", int(out[1])


def test_freed_memory_is_reused_without_page_faults():
    applied, faults = second_allocation_faults("on")
    assert applied and faults < 1000


def test_without_it_every_large_tensor_is_faulted_in_again():
    applied, faults = second_allocation_faults("off")
    assert not applied and faults > 40_000  # the control: what the setting saves
