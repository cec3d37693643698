"""Which kernel runs: one table from (GPU architecture, head dim, pass, quantisation contract) to
the kernel that runs by default, and the others a call may choose.

    python -m sagebwd.triton.registry     # the table, as docs/kernel-notes.md shows it

A call chooses with ``kernels`` (``sagebwd.attention(..., kernels=...)``,
``ModelConfig.sagebwd_kernels``; ``benchmarks.attention --kernels``, ``tools.offline --kernels``): a
comma list read left to right, each item

- ``default``: every pass runs its row's default (the list starts so);
- ``triton``: every pass runs the portable Triton kernel (the reference, tested in the CPU interpreter);
- ``fused``: the experimental one-kernel backward (``dq=fused,dkdv=fused``);
- ``PASS=NAME``: that pass runs kernel NAME (or its row's ``default``), e.g. ``triton,dkdv=gluon-ws``.

Where a row does not list the chosen kernel (another GPU, head dim or contract) its default runs;
where a call lies outside a kernel's limits (block sizes, Q-smoothing, sequence length) the
kernel's fallback runs, down to the Triton kernel, which takes every call. Nothing else chooses:
no environment variable, no module state. Experimental kernels (``sagebwd/triton/experimental/``,
measured slower, never a default) are imported only where a choice names them.

Each quantisation contract has its rows (``quant``: "block", the paper's; "token", per-token
scales, run by the Triton kernels with TOKEN, and on Hopper by the Gluon dK/dV and dQ with TOKEN);
a new contract or kernel adds rows here and entries
to ``KERNELS``, and ``select`` and the printed table take them as they are.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

ARCHES = {"sm90": "Hopper: H100, H200", "generic": "any other CUDA GPU, and Triton's CPU interpreter"}
HEAD_DIMS = (64, 128)
PASSES = ("forward", "dq", "dkdv")
QUANTS = ("block", "token")
SETS = ("default", "triton", "fused")


class KernelChoiceError(ValueError):
    """A `kernels` value this table cannot read; the message lists what it takes."""


@dataclass(frozen=True)
class Limits:
    """The calls a kernel takes (None: any); outside them its fallback runs."""
    block_q: tuple | None = None
    block_kv: tuple | None = None
    smooth_q: bool = True          # whether it takes Q-smoothing
    seq_multiple: int = 1

    def cover(self, *, block_q: int, block_kv: int, smooth_q: bool, seq: int) -> bool:
        return ((self.block_q is None or block_q in self.block_q)
                and (self.block_kv is None or block_kv in self.block_kv)
                and (self.smooth_q or not smooth_q) and seq % self.seq_multiple == 0)

    def __str__(self) -> str:
        parts = [f"{name} {'/'.join(map(str, v))}" for name, v in (("block_q", self.block_q),
                                                                    ("block_kv", self.block_kv)) if v]
        parts += [] if self.smooth_q else ["no Q-smoothing"]
        parts += [f"seq a multiple of {self.seq_multiple}"] if self.seq_multiple > 1 else []
        return ", ".join(parts) or "any"


@dataclass(frozen=True)
class Kernel:
    """One kernel of one pass. `run` names its host function (module:function under sagebwd.triton),
    which `load` imports on first use and which is called with `params`."""
    pass_: str
    name: str
    run: str
    function: str                    # the GPU kernel it launches (module.function)
    limits: Limits = Limits()
    fallback: str | None = None      # runs where a call is outside the limits ("default": the row's)
    params: tuple = ()
    experimental: bool = False


_GLUON = Limits(block_q=(128,), block_kv=(64,), smooth_q=False)

KERNELS = {(k.pass_, k.name): k for k in (
    Kernel("forward", "triton", "forward:run", "forward._forward_kernel"),
    Kernel("forward", "gluon", "experimental.forward_hopper:run", "experimental.forward_hopper._forward_kernel",
           Limits(block_q=(64, 128, 256), block_kv=(64,), smooth_q=False), "triton", experimental=True),
    Kernel("dq", "triton", "backward:run_dq", "backward._dq_kernel"),
    Kernel("dq", "gluon", "hopper:run_dq", "dq_hopper._dq_kernel", _GLUON, "triton", (("ws", False),)),
    Kernel("dq", "gluon-ws", "hopper:run_dq", "dq_hopper._dq_kernel (WS)", _GLUON, "triton", (("ws", True),)),
    # the token contract only (its row scales stay within a warpgroup): each half block on its own warpgroup
    Kernel("dq", "gluon-ws2", "hopper:run_dq", "dq_hopper._dq_kernel (WS, SPLIT)", _GLUON, "triton",
           (("ws", True), ("split", True))),
    Kernel("dkdv", "triton", "backward:run_dkdv", "backward._dkdv_kernel"),
    Kernel("dkdv", "gluon", "hopper:run_dkdv", "dkdv_hopper._dkdv_kernel", _GLUON, "triton", (("ws", False),)),
    Kernel("dkdv", "gluon-ws", "hopper:run_dkdv", "dkdv_ws_hopper._dkdv_ws_kernel",
           Limits(block_q=(128,), block_kv=(64,), smooth_q=False, seq_multiple=128), "gluon", (("ws", True),)),
    # d=128 token: one launch, one kv tile shared by a warpgroup for P^T and dV and one for dS^T and dK
    Kernel("dkdv", "gluon-roles", "experimental.dkdv_roles_hopper:run",
           "experimental.dkdv_roles_hopper._dkdv_roles_kernel",
           Limits(block_q=(128,), block_kv=(64,), smooth_q=False, seq_multiple=128), "default", experimental=True),
    # one kernel for dQ, dK and dV: chosen for both passes, run once (backward.backward)
    Kernel("dq", "fused", "experimental.fused_hopper:run", "experimental.fused_hopper._fused_kernel",
           Limits(block_q=(128,), block_kv=(64,), smooth_q=False, seq_multiple=128), "default", experimental=True),
    Kernel("dkdv", "fused", "experimental.fused_hopper:run", "experimental.fused_hopper._fused_kernel",
           Limits(block_q=(128,), block_kv=(64,), smooth_q=False, seq_multiple=128), "default", experimental=True),
)}


@dataclass(frozen=True)
class Row:
    default: str
    others: tuple = ()
    why: str = ""
    unmasked: str | None = None   # the default of calls without the causal mask, where another kernel wins there


# (arch, head dim, pass, quant) -> the default and the other kernels a choice may name. Measurements
# behind each default: docs/kernel-notes.md (H200, H100) and docs/benchmarks.md.
TABLE = {
    ("sm90", 64, "forward", "block"): Row("triton", ("gluon",), "the Gluon forward was not faster (+5% causal)"),
    ("sm90", 64, "dq", "block"): Row("triton", ("fused",), "the Gluon dQ is slower at d=64 (one program per SM)"),
    ("sm90", 64, "dkdv", "block"): Row("gluon-ws", ("gluon", "triton", "fused"),
                                       "Gluon -11%, warp-specialised -5..-12% more; fused +27-31%"),
    ("sm90", 128, "forward", "block"): Row("triton", ("gluon",),
                                          "the Gluon forward: -2.5% causal at best, O not bit-identical"),
    ("sm90", 128, "dq", "block"): Row("gluon-ws", ("gluon", "triton"), "Gluon -8..-14%, warp-specialised -1..-3% more"),
    ("sm90", 128, "dkdv", "block"): Row("gluon-ws", ("gluon", "triton"),
                                        "Gluon -8..-24%, warp-specialised -5..-12% more"),
    **{("generic", d, p, "block"): Row("triton") for d in HEAD_DIMS for p in PASSES},
    # the "token" contract: the Triton kernels with TOKEN, on every GPU; on Hopper the Gluon dK/dV and dQ
    **{(arch, d, p, "token"): Row("triton") for arch in ARCHES for d in HEAD_DIMS for p in PASSES},
    ("sm90", 64, "dkdv", "token"): Row("gluon-ws", ("gluon", "triton"),
                                       "H100: -17% causal, -10% full vs Triton (which spills)"),
    ("sm90", 128, "dkdv", "token"): Row("gluon-ws", ("gluon", "triton", "gluon-roles"),
                                        "H100: -28% causal and full vs Triton; gluon-roles +6% causal, +10% full "
                                        "(with dK's INT8 Y^ and a two-entry ring; one entry since)"),
    # (the plain Gluon comparisons measured with the dQ's INT8 X^; with Y in bf16 the Triton dQ is +19-42% on an H200)
    ("sm90", 64, "dq", "token"): Row("gluon-ws2", ("gluon", "triton", "gluon-ws"),
                                     "H200, dS K16 with S first: gluon-ws2 -3% causal, +7% full (so gluon-ws there); "
                                     "H100: plain Gluon +12% causal, +21% full", unmasked="gluon-ws"),
    ("sm90", 128, "dq", "token"): Row("gluon-ws2", ("gluon", "triton", "gluon-ws"),
                                      "H200, dS K16: gluon-ws2 -5.7% causal (H100, INT8 X^: +9%), -3% full (H100); "
                                      "plain Gluon +15% causal (it spills), +24% full (H100)"),
}


@dataclass(frozen=True)
class Choice:
    """A parsed `kernels` value: per pass, a kernel name or "default"."""
    forward: str = "default"
    dq: str = "default"
    dkdv: str = "default"

    def of(self, pass_: str) -> str:
        return getattr(self, pass_)


@functools.lru_cache(maxsize=64)
def parse(kernels: str) -> Choice:
    """The Choice a `kernels` string names, or a KernelChoiceError that says what is accepted."""
    if not isinstance(kernels, str):
        raise KernelChoiceError(f"kernels={kernels!r} must be a string such as 'default' or 'triton,dkdv=gluon-ws'")
    picked = dict.fromkeys(PASSES, "default")
    names = {p: sorted({n for (q, n) in KERNELS if q == p}) for p in PASSES}
    for item in (t.strip() for t in kernels.strip().lower().split(",")):
        if item in ("default", "triton"):
            picked = dict.fromkeys(PASSES, item)
        elif item == "fused":
            picked.update(dq="fused", dkdv="fused")
        elif item.count("=") == 1 and item.split("=")[0].strip() in PASSES:
            pass_, name = (t.strip() for t in item.split("="))
            if name != "default" and name not in names[pass_]:
                raise KernelChoiceError(f"kernels={kernels!r}: {pass_} has no kernel {name!r}; "
                                        f"choose default or one of {', '.join(names[pass_])}")
            picked[pass_] = name
        else:
            raise KernelChoiceError(
                f"kernels={kernels!r}: cannot read {item!r}; use a comma list of default, triton, fused or "
                f"PASS=NAME with PASS in {', '.join(PASSES)} (python -m sagebwd.triton.registry lists the names)")
    if (picked["dq"] == "fused") != (picked["dkdv"] == "fused"):
        raise KernelChoiceError(f"kernels={kernels!r}: the fused kernel computes dQ, dK and dV in one; "
                                "choose it for both passes (the item 'fused')")
    return Choice(**picked)


def select(arch: str, head_dim: int, pass_: str, quant: str = "block", kernels: str = "default",
           causal: bool | None = None) -> Kernel:
    """The kernel of row (arch, head_dim, pass_, quant) that `kernels` names, else the row's default: its
    `unmasked` one for a call known to run without the causal mask (causal False), where the row has one."""
    try:
        row = TABLE[(arch, head_dim, pass_, quant)]
    except KeyError:
        raise KernelChoiceError(f"no kernel for arch={arch!r}, head_dim={head_dim}, pass={pass_!r}, "
                                f"quant={quant!r}: python -m sagebwd.triton.registry lists them") from None
    name = parse(kernels).of(pass_)
    if name in row.others or name == row.default:
        return KERNELS[(pass_, name)]
    return KERNELS[(pass_, row.unmasked if causal is False and row.unmasked else row.default)]


def resolve(arch: str, head_dim: int, pass_: str, quant: str = "block", kernels: str = "default", *,
            block_q: int, block_kv: int, smooth_q: bool, seq: int, causal: bool | None = None) -> Kernel:
    """The kernel that runs a call: select's, or the first of its fallbacks whose limits cover it."""
    kernel = select(arch, head_dim, pass_, quant, kernels, causal)
    while not kernel.limits.cover(block_q=block_q, block_kv=block_kv, smooth_q=smooth_q, seq=seq):
        fallback = TABLE[(arch, head_dim, pass_, quant)].default if kernel.fallback == "default" else kernel.fallback
        kernel = KERNELS[(pass_, fallback)]
    return kernel


def load(kernel: Kernel):
    """The kernel's host function with its params bound (its module imported on first use)."""
    module, function = kernel.run.split(":")
    run = getattr(importlib.import_module(f"{__package__}.{module}"), function)
    return functools.partial(run, **dict(kernel.params)) if kernel.params else run


def arch_of(device) -> str:
    """The table's architecture for a device: sm90 for a CUDA device of compute capability 9.x (not under
    the interpreter, for Gluon has none), else generic."""
    from ._common import interpreting
    if interpreting() or getattr(device, "type", None) != "cuda":
        return "generic"
    return "sm90" if _capability(device.index)[0] == 9 else "generic"


@functools.lru_cache(maxsize=None)
def _capability(index) -> tuple:
    import torch
    return torch.cuda.get_device_capability(index)


def table() -> str:
    """The table as Markdown: rows, then the kernels with their limits and fallbacks."""
    lines = ["| arch | head dim | pass | quant | runs by default | may be chosen | why this default |",
             "|---|---|---|---|---|---|---|"]
    for (arch, d, pass_, quant), row in TABLE.items():
        default = KERNELS[(pass_, row.default)]
        others = ", ".join(f"{n}{' (experimental)' if KERNELS[(pass_, n)].experimental else ''}" for n in row.others)
        unmasked = f"; without the mask {row.unmasked}: `{KERNELS[(pass_, row.unmasked)].function}`" \
            if row.unmasked else ""
        lines.append(f"| {arch} | {d} | {pass_} | {quant} | {row.default}: `{default.function}`{unmasked} | "
                     f"{others or '-'} | {row.why or 'the only kernel'} |")
    lines += ["", "| pass | kernel | GPU kernel | limits | else |", "|---|---|---|---|---|"]
    for (pass_, name), k in KERNELS.items():
        lines.append(f"| {pass_} | {name}{' (experimental)' if k.experimental else ''} | `{k.function}` | "
                     f"{k.limits} | {k.fallback or '-'} |")
    arches = "; ".join(f"{a}: {what}" for a, what in ARCHES.items())
    return "\n".join([f"Architectures: {arches}. Quantisation contracts: {', '.join(QUANTS)}.", ""] + lines)


if __name__ == "__main__":
    print(table())
