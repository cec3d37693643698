"""Launching a kernel: the one place that calls kernel[grid](...), and the hooks the tools pass in.

A call runs with its launch settings as the kernels' host code sets them. The benchmark's sweep,
its kernel report, the offline compiler and the interpreter tests change that through a
:class:`Tuning` passed explicitly to the op (``sagebwd.triton.attention(..., tuning=...)``), never
through module state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ._common import interpreting

# Keyword arguments of a launch that are compiler options rather than kernel arguments.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg", "enable_fp_fusion", "launch_pdl")


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


# Compiled kernels by launch signature (launch_signature): (kernel, compiled kernel, the values of its parameters
# after the positional arguments), what a repeated launch needs to skip JITFunction.run.
_COMPILED: dict = {}
# Constexpr values keyed exactly by (type, value) only for these types (a float's == would take -0.0 for 0.0,
# which Triton's key, by str, tells apart); a launch with another constexpr type goes through JITFunction.run.
_EXACT_TYPES = frozenset((int, bool, str, type(None)))


def _descriptor_types() -> frozenset:
    types = []
    for module in ("triton.experimental.gluon.nvidia.hopper", "triton.tools.tensor_descriptor"):
        try:
            types.append(__import__(module, fromlist=["TensorDescriptor"]).TensorDescriptor)
        except (ImportError, AttributeError):
            pass
    return frozenset(types)


_DESCRIPTORS = _descriptor_types()
_CONSTEXPR_POSITIONS: dict = {}   # id(kernel) -> (kernel, indices of its constexpr parameters)


def _constexpr_positions(kernel) -> tuple:
    known = _CONSTEXPR_POSITIONS.get(id(kernel))
    if known is None or known[0] is not kernel:   # (an id is only unique while its object lives)
        known = _CONSTEXPR_POSITIONS[id(kernel)] = (kernel, tuple(i for i, p in enumerate(kernel.params)
                                                                   if p.is_constexpr))
    return known[1]


def _compile_settings() -> tuple:
    """What JITFunction.run reads from Triton's knobs into its cache key, besides the arguments."""
    from triton import knobs
    return (knobs.runtime.debug, knobs.compilation.instrumentation_mode,
            getattr(knobs.runtime, "add_stages_inspection_hook", None))


def launch_signature(kernel, args, kwargs, device: int) -> tuple | None:
    """What JITFunction.run specialises a launch on, at least as finely, in cheap Python: per tensor its
    dtype and 16-byte alignment; per integer whether it is 1, a multiple of 16, 32-bit or unsigned 64-bit;
    per TMA descriptor its tensor's dtype and alignment, box and layout (the launcher encodes its shape
    and strides on every call); constexprs, positional or keyword, and compiler options by type and value;
    the knobs Triton's key reads; the CUDA device. None where an argument or a constexpr is of another
    kind: such a launch always goes through JITFunction.run. Two launches with one signature run the same
    compiled kernel (tests/test_triton_launch.py checks this against Triton's own binder)."""
    key = [id(kernel), device, _compile_settings()]
    append = key.append
    for a in args:
        t = type(a)
        if t is int:
            append((a == 1) | (a & 15 == 0) << 1 | (-2**31 <= a < 2**31) << 2 | (a >= 2**63) << 3)
        elif t is torch.Tensor:
            append((a.dtype, a.data_ptr() & 15 == 0))
        elif t in _DESCRIPTORS:
            base = a.base
            append((t, base.dtype, base.data_ptr() & 15 == 0, *a.block_shape, getattr(a, "layout", None),
                    a.padding, getattr(a, "round_f32_to_tf32", None)))
        elif t is float:
            append(float)
        elif t is bool or a is None:
            append(a)
        elif isinstance(a, torch.Tensor):   # a subclass (nn.Parameter)
            append((a.dtype, a.data_ptr() & 15 == 0))
        else:
            return None
    for i in _constexpr_positions(kernel):   # a constexpr passed by position: its value, not its flags
        if i >= len(args):
            break
        a = args[i]
        if type(a) not in _EXACT_TYPES:
            return None
        key[3 + i] = (type(a), a)
    for v in kwargs.values():
        if type(v) not in _EXACT_TYPES:
            return None
    append(tuple(kwargs.items()))
    append(tuple(map(type, kwargs.values())))   # True and 1 compare equal; Triton compiles them apart
    return tuple(key)


def _remember(signature, kernel, args, kwargs, compiled) -> None:
    """Keep a launch's compiled kernel for launches of its signature, with its trailing parameters'
    values (keyword arguments, else defaults) in the order JITFunction.run passes them."""
    from triton.compiler import CompiledKernel
    if signature is None or not isinstance(compiled, CompiledKernel) or kernel.pre_run_hooks:
        return
    tail = tuple(kwargs[p.name] if p.name in kwargs else p.default for p in kernel.params[len(args):])
    _COMPILED[signature] = (kernel, compiled, tail)


def launch(name: str, kernel, grid, *args, tuning: Tuning | None = None, **kwargs):
    """kernel[grid](*args, **kwargs), retried with one pipeline stage fewer while the compiled
    kernel needs more shared memory than the device has; recorded instead where `tuning` says.

    A launch whose signature (launch_signature) has run before goes to the compiled kernel directly
    (CompiledKernel[grid]), as Inductor's launchers do: JITFunction.run binds and specialises every
    argument and looks up its cache on each call, 69-107 us a launch on an H100's host, which a training
    step in the default compile mode waits for (docs/benchmarks.md, "Launching compiled kernels
    directly"). One entry per signature: a handful per run, whatever its shapes; no tensor is kept."""
    from triton.runtime.errors import OutOfResources
    from triton.runtime.jit import JITFunction
    if tuning is not None and tuning.recorded is not None:
        tuning.recorded.append((name, kernel, args, kwargs))
        return None
    direct = isinstance(kernel, JITFunction) and not callable(grid) and not interpreting()
    signature = launch_signature(kernel, args, kwargs, torch.cuda.current_device()) if direct else None
    try:
        known = _COMPILED.get(signature) if signature is not None else None
    except TypeError:   # a keyword argument that cannot be hashed
        signature = known = None
    if known is not None and known[0] is kernel and not kernel.pre_run_hooks:
        _, compiled, tail = known
        compiled[tuple(grid) + (1,) * (3 - len(grid))](*args, *tail)
    else:
        key = (name, tuple(sorted((k, v) for k, v in kwargs.items() if not hasattr(v, "data_ptr"))),
               getattr(args[0], "device", None))
        fitted = {**kwargs, "num_stages": _FITTED_STAGES[key]} if key in _FITTED_STAGES else kwargs
        while True:
            try:
                compiled = kernel[grid](*args, **fitted)
                break
            except OutOfResources as err:
                stages = fitted.get("num_stages", 3)
                if "shared memory" not in str(err) or stages <= 1:
                    raise
                fitted = {**fitted, "num_stages": stages - 1}
                _FITTED_STAGES[key] = stages - 1
        if direct:
            _remember(signature, kernel, args, kwargs, compiled)
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


def forward_pdl(device, q_in_forward: bool, tuning: Tuning | None) -> bool:
    """Whether the op launches its forward kernel as a programmatic dependent (PDL) of the quantise launch: on
    Hopper where the forward quantises Q itself (the token contract without Q-smoothing). Its Q prologue reads and
    writes nothing of the quantise launch's, so it runs while that launch's last programs do; H100: the op's
    forward 0.1-2% faster at all three benchmark shapes in two runs (docs/kernel-notes.md, "Fourteenth
    session"). A tool's Tuning override "pdl" (True or False) decides instead."""
    choice = overrides(tuning).get("pdl")
    if choice is not None:
        return bool(choice)
    return q_in_forward and arch_for(device, tuning) == "sm90"


def launch_settings(name: str, default: dict, tuning: Tuning | None = None) -> dict:
    """The compiler options of kernel `name`: its defaults, with a tool's overrides."""
    if interpreting():
        return dict(num_warps=1, num_stages=1)
    override = overrides(tuning).get(name, {})
    merged = {**default, **(override if isinstance(override, dict) else {})}
    return {k: v for k, v in merged.items() if k in LAUNCH_OPTIONS and v is not None}   # None: the compiler's
