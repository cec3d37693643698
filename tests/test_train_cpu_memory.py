"""The CPU allocator setting really stops big tensors from being re-faulted every step."""
from __future__ import annotations

import resource
import sys

import pytest
import torch

from launcher.cpu_memory import reuse_freed_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")


def page_faults_of_a_fresh_200mb_tensor() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(50_000_000)
    t.fill_(1.0)  # touch every page
    del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_freed_memory_is_reused_without_page_faults():
    assert reuse_freed_memory()
    page_faults_of_a_fresh_200mb_tensor()  # grows the heap once
    # 200 MB is ~49k pages; reused heap memory needs (almost) none of them faulted again.
    assert page_faults_of_a_fresh_200mb_tensor() < 1000
