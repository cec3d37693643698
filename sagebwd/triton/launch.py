"""Launching a kernel: the one place that calls kernel[grid](...), and the hooks the tools pass in.

A call runs with its launch settings as the kernels' host code sets them. The benchmark's sweep,
its kernel report, the offline compiler and the interpreter tests change that through a
:class:`Tuning` passed explicitly to the op (``sagebwd.triton.attention(..., tuning=...)``), never
through module state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ._common import interpreting

# Keyword arguments of a launch that are compiler options rather than kernel arguments.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg", "enable_fp_fusion")


@dataclass
class Tuning:
    """What a tool changes about one call of the op.

    overrides: compiler options by launch name (``{"dq": {"num_warps": 8}}``, the benchmark's sweep),
        and the block shapes ``"forward_rows"`` (q rows per forward program, forward.forward_rows)
        and ``"dkdv_blocks"`` (the keys of backward.dkdv_blocks);
    compiled: where the last compiled kernel of each launch name is kept (the benchmark's kernel
        report of registers, spills and wgmma use), if given;
    recorded: where launches are appended as (name, kernel, args, kwargs) instead of being run (the
        offline compiler: every kernel built with exactly the GPU path's arguments), if given;
    arch: the registry's architecture to choose kernels for, instead of the device's (the offline
        compiler builds the sm90 kernels on a CPU).
    """
    overrides: dict = field(default_factory=dict)
    compiled: dict | None = None
    recorded: list | None = None
    arch: str | None = None


# Pipeline depth that fitted, per (kernel name, compile-time arguments, device): a cache. The
# defaults are tuned on an H200 (227 KB of shared memory per block); smaller parts (an RTX 4090
# has 99 KB) or large blocks get fewer stages instead of an error.
_FITTED_STAGES: dict = {}


def launch(name: str, kernel, grid, *args, tuning: Tuning | None = None, **kwargs):
    """kernel[grid](*args, **kwargs), retried with one pipeline stage fewer while the compiled
    kernel needs more shared memory than the device has; recorded instead where `tuning` says."""
    from triton.runtime.errors import OutOfResources
    if tuning is not None and tuning.recorded is not None:
        tuning.recorded.append((name, kernel, args, kwargs))
        return None
    key = (name, tuple(sorted((k, v) for k, v in kwargs.items() if not hasattr(v, "data_ptr"))),
           getattr(args[0], "device", None))
    if key in _FITTED_STAGES:
        kwargs = {**kwargs, "num_stages": _FITTED_STAGES[key]}
    while True:
        try:
            compiled = kernel[grid](*args, **kwargs)
            break
        except OutOfResources as err:
            stages = kwargs.get("num_stages", 3)
            if "shared memory" not in str(err) or stages <= 1:
                raise
            kwargs = {**kwargs, "num_stages": stages - 1}
            _FITTED_STAGES[key] = stages - 1
    if tuning is not None and tuning.compiled is not None:
        tuning.compiled[name] = compiled
    return compiled


def arch_for(device, tuning: Tuning | None) -> str:
    """The registry's architecture to choose kernels for: the tool's (Tuning.arch), else the device's."""
    from .registry import arch_of
    return tuning.arch if tuning is not None and tuning.arch else arch_of(device)


def overrides(tuning: Tuning | None) -> dict:
    """The tool's overrides of a call (none without a Tuning)."""
    return tuning.overrides if tuning is not None else {}


def launch_settings(name: str, default: dict, tuning: Tuning | None = None) -> dict:
    """The compiler options of kernel `name`: its defaults, with a tool's overrides."""
    if interpreting():
        return dict(num_warps=1, num_stages=1)
    override = overrides(tuning).get(name, {})
    merged = {**default, **(override if isinstance(override, dict) else {})}
    return {k: v for k, v in merged.items() if k in LAUNCH_OPTIONS and v is not None}   # None: the compiler's
