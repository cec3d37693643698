"""sagebwd.triton's launcher retries with fewer pipeline stages when shared memory runs out.

The defaults are tuned on an H200 (227 KB per block); an RTX 4090 has 99 KB. Triton raises
OutOfResources only where a driver loads the kernel, so a stand-in kernel raises it here.
"""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
from triton.runtime.errors import OutOfResources  # noqa: E402

from sagebwd.triton import _common  # noqa: E402


class _StandInKernel:
    """kernel[grid](...) that fits in shared memory only at `fits_at` stages or fewer."""

    def __init__(self, fits_at: int, error: str = "shared memory"):
        self.fits_at, self.error, self.tried = fits_at, error, []

    def __getitem__(self, grid):
        def run(*args, num_stages, **kwargs):
            self.tried.append(num_stages)
            if num_stages > self.fits_at:
                raise OutOfResources(64 * 1024 * num_stages, 99 * 1024, self.error)
            return f"compiled with {num_stages} stages"
        return run


def test_launch_drops_stages_until_the_kernel_fits_and_remembers():
    kernel = _StandInKernel(fits_at=1)
    assert _common.launch("standin-a", kernel, (1,), 0, BLOCK=64, num_warps=4, num_stages=3) == \
        "compiled with 1 stages"
    assert kernel.tried == [3, 2, 1]
    assert _common.COMPILED["standin-a"] == "compiled with 1 stages"
    _common.launch("standin-a", kernel, (1,), 0, BLOCK=64, num_warps=4, num_stages=3)
    assert kernel.tried[3:] == [1]                     # the fitted depth is reused
    _common.launch("standin-a", kernel, (1,), 0, BLOCK=32, num_warps=4, num_stages=3)
    assert kernel.tried[4:] == [3, 2, 1]               # other compile-time arguments: tried afresh


def test_launch_reraises_what_fewer_stages_cannot_fix():
    with pytest.raises(OutOfResources):
        _common.launch("standin-b", _StandInKernel(fits_at=0), (1,), 0, num_warps=4, num_stages=2)
    with pytest.raises(OutOfResources):   # registers, not shared memory: no retry
        _common.launch("standin-c", _StandInKernel(fits_at=1, error="registers"), (1,), 0, num_stages=3)


def test_gluon_selection_is_validated_and_never_leaves_sm90(monkeypatch):
    """SAGEBWD_GLUON picks the Gluon (Hopper) kernels; a typo fails with the accepted names, and
    off a CUDA device (here: the CPU, as under the interpreter) the Triton kernels always run."""
    import torch
    assert _common.parse_gluon("all", "x") == _common.GLUON_KERNELS
    assert _common.parse_gluon(" Forward , dkdv ", "x") == ("forward", "dkdv")
    assert _common.parse_gluon("none", "x") == ()
    assert _common.parse_gluon("default", "x") == _common.GLUON_DEFAULT == ("dkdv", "dq")
    assert _common.parse_gluon("default,fused", "x") == ("dkdv", "dq", "fused")   # a set plus one
    assert _common.parse_gluon("dq,default", "x") == ("dq", "dkdv")
    monkeypatch.setenv("SAGEBWD_GLUON", "forward,dkvd")
    with pytest.raises(ValueError, match=r"SAGEBWD_GLUON='forward,dkvd': unknown kernel\(s\) \['dkvd'\]; "
                                         r"use a comma list of forward, dkdv, dq, fused \(where 'all' and "
                                         r"'default' stand for their sets\), or 'none'"):
        _common.gluon_kernels(torch.device("cpu"))
    monkeypatch.setenv("SAGEBWD_GLUON", "all")
    assert _common.gluon_kernels(torch.device("cpu")) == frozenset()
    monkeypatch.delenv("SAGEBWD_GLUON")
    _common.RECORDED = []   # what the offline compiler builds: the defaults
    try:
        assert _common.gluon_kernels(torch.device("cpu")) == frozenset({"dkdv", "dq"})
    finally:
        _common.RECORDED = None


@pytest.mark.parametrize("argv,message", [
    (["--gluon", "dkdv,fwd"], "--gluon='dkdv,fwd': unknown kernel(s) ['fwd']"),
    (["--kernel-times", "--kernel-shapes", "8,8,4096"], "'8,8,4096': expected four positive integers B,H,N,D"),
    (["--kernel-times", "--kernel-masks", "sliding"], "invalid choice: 'sliding'"),
    (["--kernel-times", "--kernel-layout", "rows"], "invalid choice: 'rows'"),
])
def test_bench_rejects_bad_flags_before_looking_for_a_gpu(argv, message, capsys):
    """The benchmark's new flags fail on any machine, with what was wrong, before it asks for CUDA."""
    from sagebwd import bench
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_dq_add_bench_says_it_needs_a_gpu(monkeypatch, capsys):
    """The fused-backward cost benchmark is GPU-only: without CUDA it says so and exits 2."""
    import torch

    from sagebwd.triton import dq_add_bench
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dq_add_bench.main() == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
