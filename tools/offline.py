"""Compile the SageBwd kernels for a GPU without one: registers, spills, shared memory, and
whether the INT8 dots are Hopper wgmma (no mma.sync fallback).

    python -m tools.offline [--head-dim 64 128] [--arch 90] [--kernels CHOICE] [--json PATH]
    python -m tools.offline --loop-mix [--measured docs/measurements/bench-h200.json]
    python -m tools.offline --ptx-digest [--quant token] [--instructions-only] --json digests.json  (in two trees)

The host code runs on CPU tensors with launches recorded instead of run (a
``sagebwd.triton.launch.Tuning`` with ``recorded`` and ``arch="sm90"``: the registry's sm90
kernels), so every kernel is compiled with exactly the compile-time arguments,
warps, stages and register caps the GPU path would use for that shape. Each launch is then
compiled by Triton's own compiler for ``cuda:<arch>`` (ptxas comes with Triton), specialised as
the JIT would (integer arguments equal to 1 become constants, pointers and multiples of 16 get
the divisibility hint). Register and spill counts are the assembler's, read with the bundled
cuobjdump; they are what the GPU run's kernel report prints, up to Triton version differences.
No timing: speed comes only from ``python -m benchmarks.attention`` on a GPU. ``--loop-mix``
counts the SASS instructions each kernel's main loop issues per score element and the time floors
that sets (``sass_mix``); with ``--measured`` (a ``benchmarks.attention --kernel-times`` JSON) it
divides the measured kernel times into them. ``--ptx-digest`` prints a hash of each launch's PTX,
line and debug information left out, over causal or not and with or without Q-smoothing: run it in two
trees (a ``git archive`` of the other commit) and compare the JSONs to show that a change leaves the
kernels it should not touch identical.
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int8: "i8",
          torch.float8_e4m3fn: "fp8e4nv",
          torch.int32: "i32", torch.int64: "i64"}


def record_launches(shape, dtype=torch.bfloat16, causal=True, smooth_q=False, block_q=128, block_kv=64,
                    kernels: str = "default", quant: str = "block", overrides: dict | None = None) -> list:
    """(name, kernel, args, kwargs) of every kernel launch of one forward and one backward on an
    sm90 GPU, with the registry's kernels for `kernels` and the contract `quant`
    (sagebwd.triton.registry); `overrides` as Tuning.overrides (launch settings, block shapes)."""
    b, h, n, d = shape
    q, k, v, do = [torch.randn(b, h, n, d).to(dtype) for _ in range(4)]
    return recorded_fwd_bwd(q, k, v, do, causal=causal, smooth_q=smooth_q, block_q=block_q, block_kv=block_kv,
                            kernels=kernels, quant=quant, overrides=overrides)


def recorded_fwd_bwd(q, k, v, do, *, causal=True, smooth_q=False, block_q=128, block_kv=64, kernels="default",
                     quant="block", overrides: dict | None = None) -> list:
    """One forward and backward of the op (K-smoothing on) through its own host path, its sm90
    launches recorded instead of run: [(name, kernel, args, kwargs)] (record_launches, and
    tools.host_profile's CPU mode)."""
    from sagebwd.triton import ops
    from sagebwd.triton.launch import Tuning
    tuning = Tuning(recorded=[], arch="sm90", overrides=dict(overrides or {}))
    token = quant == "token"
    o, lse, q8, q8t, s_q, k8, k8t, s_k, mu_q, k_mean = ops._forward_impl(q, k, v, causal, True, smooth_q, block_q,
                                                                         block_kv, token, True, kernels, tuning)
    ops._backward_impl(do, o, lse, q8, q8t, s_q, k8, k8t, s_k, v, q, k, mu_q, k_mean, causal, True, smooth_q,
                       block_q, block_kv, token, kernels, tuning)
    return tuning.recorded


def _signature(kernel, args, kwargs):
    """Triton's signature, constants and divisibility hints for a recorded launch."""
    names = kernel.arg_names
    constexprs = {names.index(k): v for k, v in kwargs.items() if k in names}
    for i, param in enumerate(kernel.params[len(args):], start=len(args)):   # a constexpr left at its default
        if param.is_constexpr and i not in constexprs and param.default is not inspect.Parameter.empty:
            constexprs[i] = param.default
    signature, attrs = {}, {}
    for i, (name, value) in enumerate(zip(names, args)):
        if type(value).__name__ == "TensorDescriptor":   # a Gluon kernel's TMA descriptor
            from triton.runtime.jit import mangle_type
            signature[name] = mangle_type(value)
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1:   # the JIT specialises 1 into a constant
                signature[name] = "constexpr"
                constexprs[i] = 1
                continue
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{name}: cannot type {type(value).__name__} for offline compilation")
    for i in constexprs:
        signature[names[i]] = "constexpr"
    return signature, {(i,): v for i, v in constexprs.items()}, attrs


def _resource_usage(cubin: bytes) -> dict:
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    return {"regs": int(re.search(r"REG:(\d+)", text).group(1)),
            "spill_bytes": int(re.search(r"STACK:(\d+)", text).group(1))}


def compile_recorded(kernel, args, kwargs, arch: int = 90):
    """Triton's compiled kernel for one recorded launch, built for cuda:<arch>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sagebwd.triton.launch import LAUNCH_OPTIONS
    signature, constexprs, attrs = _signature(kernel, args, kwargs)
    options = {k: v for k, v in kwargs.items() if k in LAUNCH_OPTIONS}
    source = ASTSource
    if getattr(kernel, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton.compile(source(kernel, signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", arch, 128 if arch >= 90 else 64), options=options)


def compile_launch(name, kernel, args, kwargs, arch: int = 90) -> dict:
    from sagebwd.triton.launch import LAUNCH_OPTIONS
    options = {k: v for k, v in kwargs.items() if k in LAUNCH_OPTIONS}
    compiled = compile_recorded(kernel, args, kwargs, arch)
    ptx = compiled.asm["ptx"]
    return {"kernel": name, **_resource_usage(compiled.asm["cubin"]), "shared": compiled.metadata.shared,
            "num_warps": options.get("num_warps"), "num_stages": options.get("num_stages"),
            "maxnreg": options.get("maxnreg"),
            "wgmma_s8": len(re.findall(r"wgmma\.mma_async[^\n]*\.s8\.s8", ptx)),
            "wgmma_16bit": len(re.findall(r"wgmma\.mma_async[^\n]*\.(?:bf16|f16)\.(?:bf16|f16)", ptx)),
            "mma_sync": len(re.findall(r"\bmma\.sync", ptx)),
            # waits that leave wgmma groups in flight: the tensor cores run while the warp works
            "wgmma_overlapped_waits": len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+[1-9]", ptx)),
            "constexprs": {k: v for k, v in kwargs.items() if k.isupper()}}


def report(head_dims=(64, 128), arch: int = 90, seq: int = 4096, blocks=(128, 64), kernels="default",
           quant="block", overrides: dict | None = None) -> list[dict]:
    rows = []
    for d in head_dims:
        seen = set()
        for name, kernel, args, kwargs in record_launches((1, 2, seq, d), block_q=blocks[0], block_kv=blocks[1],
                                                          kernels=kernels, quant=quant, overrides=overrides):
            key = (name, tuple(sorted((k, str(v)) for k, v in kwargs.items())))
            if key in seen:   # e.g. the quantiser runs for Q, K and V with the same settings
                continue
            seen.add(key)
            rows.append({"head_dim": d, "blocks": list(blocks), "quant": quant,
                         **compile_launch(name, kernel, args, kwargs, arch)})
    return rows


def ptx_digest(ptx: str, instructions_only: bool = False) -> str:
    """A hash of the code in `ptx`: line information, debug sections and their labels left out, so that
    moving code within a file or renaming a helper changes nothing. instructions_only: the hash of the
    instructions as a multiset, parameter declarations left out and registers and parameters renumbered,
    so that a kernel that gained parameters it does not read (and loads the others in another order)
    hashes as before, while any other instruction added, removed or changed still shows."""
    debug = re.compile(r"^\s*(\.loc|\.file|//|\.b8|\.b16|\.b32|\.b64|\.section)|L__tmp|debug")
    lines = [line for line in ptx.splitlines() if not debug.search(line)]
    if instructions_only:
        lines = sorted(re.sub(r"%(rd|rs|r|fd|f|p|h)[0-9]+", r"%\1", re.sub(r"_param_[0-9]+", "_param", line))
                       for line in lines if not re.match(r"\s*\.param\b", line))
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:16]


def ptx_digests(head_dims=(64, 128), arch: int = 90, blocks=(128, 64), kernels="default", quant="block",
                overrides: dict | None = None, seq: int = 512, instructions_only: bool = False) -> dict[str, str]:
    """{"d=.. causal=.. smooth_q=.. #i name": ptx_digest} of every launch of one forward and backward,
    causal or not, with or without Q-smoothing."""
    out = {}
    for d in head_dims:
        for causal in (True, False):
            for smooth_q in (False, True):
                launches = record_launches((1, 2, seq, d), causal=causal, smooth_q=smooth_q, block_q=blocks[0],
                                           block_kv=blocks[1], kernels=kernels, quant=quant, overrides=overrides)
                for i, (name, kernel, args, kwargs) in enumerate(launches):
                    key = f"d={d} causal={causal} smooth_q={smooth_q} #{i} {name}"
                    out[key] = ptx_digest(compile_recorded(kernel, args, kwargs, arch).asm["ptx"], instructions_only)
    return out


LOOP_KERNELS = ("forward", "dq", "dkdv", "dv", "dk", "fused")
BENCH_SHAPES = {64: (8, 16, 4096, 64), 128: (8, 8, 4096, 128)}   # the causal targets


def loop_mix_report(head_dims=(64, 128), arch: int = 90, blocks=(128, 64), kernels="default",
                    quant="block", overrides: dict | None = None) -> list[dict]:
    """Per head dim, the main-loop mix of forward, dQ and dK/dV (non-causal launches: the
    unmasked steady-state loop) with their floors at the benchmark shape, causal; and the causal
    build's spill loads and stores inside its loops (causal_loop_local_ops)."""
    from . import sass_mix
    rows = []
    for d in head_dims:
        for name, kernel, args, kwargs in record_launches((1, 2, 1024, d), causal=False, block_q=blocks[0],
                                                          block_kv=blocks[1], kernels=kernels, quant=quant,
                                                          overrides=overrides):
            if name not in LOOP_KERNELS or any(r["kernel"] == name and r["head_dim"] == d for r in rows):
                continue
            compiled = compile_recorded(kernel, args, kwargs, arch)
            constexprs = {k: v for k, v in kwargs.items() if k.isupper()}
            role_loops = getattr(sys.modules[kernel.fn.__module__], "ROLE_LOOPS", 1)
            mix = sass_mix.loop_mix(sass_mix.disassemble(compiled.asm["cubin"]), name, constexprs,
                                    kwargs.get("num_warps", 4), role_loops)
            floors = sass_mix.floors_ms(name, mix["per_element"], BENCH_SHAPES[d], True, *blocks, quant=quant)
            rows.append({"head_dim": d, "shape": list(BENCH_SHAPES[d]), "function": kernel.fn.__name__,
                         "quant": quant, **mix, **floors})
        # The counts above are the unmasked loops; the targets are causal, whose builds differ
        # (a peeled or masked diagonal block): their spill traffic inside loops, checked apart.
        for name, kernel, args, kwargs in record_launches((1, 2, 1024, d), causal=True, block_q=blocks[0],
                                                          block_kv=blocks[1], kernels=kernels, quant=quant,
                                                          overrides=overrides):
            row = next((r for r in rows if r["kernel"] == name and r["head_dim"] == d), None)
            if row is None or "causal_loop_local_ops" in row:
                continue
            sass = sass_mix.disassemble(compile_recorded(kernel, args, kwargs, arch).asm["cubin"])
            row["causal_loop_local_ops"] = sass_mix.local_memory_in_loops(sass)
    return rows


def print_loop_mix(rows: list[dict], measured: dict | None = None) -> None:
    """Markdown table; `measured` is a benchmarks.attention JSON with kernel_times (efficiency column)."""
    times = {}
    for entry in (measured or {}).get("kernel_times", []):
        if entry.get("causal"):
            times[tuple(entry["shape"])] = entry["ms"]
    print("| d | kernel | thread instr. / score element | top opcodes (per element) | issue floor ms | "
          "tensor floor ms | measured ms | issue efficiency | causal build: LDL/STL in loops |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        top = ", ".join(f"{op} {n:.2f}" for op, n in list(r["by_opcode"].items())[:8])
        function = r["function"]   # the profiler's name (dv and dk are two launches of one function)
        ms = times.get(tuple(r["shape"]), {}).get(function)
        # launches of one function share its measured time: report it on the last of them
        group = [g for g in rows if g["head_dim"] == r["head_dim"] and g["function"] == function]
        if ms and r is group[-1]:
            label = " (" + " + ".join(g["kernel"] for g in group) + ")" if len(group) > 1 else ""
            tail = f"{ms:.3f}{label} | {sum(g['issue_ms'] for g in group) / ms:.0%}"
        else:
            tail = "— | —"
        count = f"{r['per_element']:.1f}"
        if r["per_element_branches_taken"] < r["per_element"]:
            count += f" ({r['per_element_branches_taken']:.1f} with its branches taken)"
        print(f"| {r['head_dim']} | {r['kernel']} | {count} | {top} | {r['issue_ms']:.3f} | "
              f"{r['tensor_ms']:.3f} | {tail} | {r.get('causal_loop_local_ops', '—')} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x10 (90 = Hopper)")
    ap.add_argument("--blocks", type=int, nargs=2, default=[128, 64], metavar=("BLOCK_Q", "BLOCK_KV"))
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--loop-mix", action="store_true",
                    help="SASS instructions per score element of each main loop, and the floors they set")
    ap.add_argument("--measured", help="with --loop-mix: a benchmarks.attention --kernel-times JSON for efficiency")
    ap.add_argument("--ptx-digest", action="store_true",
                    help="a hash of each launch's PTX (no line or debug information), to compare two trees")
    ap.add_argument("--instructions-only", action="store_true",
                    help="with --ptx-digest: hash each launch's instructions as a multiset, blind to parameters it "
                         "does not read and to register numbering (for a change that adds kernel parameters)")
    ap.add_argument("--kernels", default="default", metavar="CHOICE",
                    help="which kernels to build (sagebwd.triton.registry: default, triton, fused or PASS=NAME "
                         "items; python -m sagebwd.triton.registry lists them); default: what an H100/H200 runs")
    ap.add_argument("--quant", choices=("block", "token"), default="block",
                    help="the quantisation contract whose kernels to build (docs/sagebwd.md)")
    ap.add_argument("--tuning", default="{}", metavar="JSON",
                    help='launch settings and block shapes to build instead of the defaults, as the '
                         'benchmark\'s sweep sets them, e.g. \'{"dkdv_blocks": {"separate": true}}\' '
                         '(sagebwd.triton.launch.Tuning.overrides)')
    args = ap.parse_args(argv)
    from sagebwd.triton.registry import KernelChoiceError, parse
    try:
        parse(args.kernels)
    except KernelChoiceError as err:
        ap.error(str(err))
    bad = [d for d in args.head_dim if d not in (64, 128)]
    if bad:
        ap.error(f"--head-dim {bad}: the kernels take head_dim 64 or 128")
    for name, block in zip(("BLOCK_Q", "BLOCK_KV"), args.blocks):
        if not (16 <= block <= 256 and block & (block - 1) == 0):
            ap.error(f"--blocks {name}={block}: a power of two in [16, 256]")
    if args.arch < 90:
        ap.error(f"--arch {args.arch}: the INT8 kernels are built for Hopper and later (90+)")
    try:
        overrides = json.loads(args.tuning)
        if not isinstance(overrides, dict):
            raise ValueError("not a JSON object")
    except ValueError as err:
        ap.error(f"--tuning {args.tuning!r}: {err}; give a JSON object such as "
                 '\'{"dkdv_blocks": {"separate": true}}\'')
    if args.measured and not args.loop_mix:
        ap.error("--measured goes with --loop-mix")
    if args.ptx_digest and args.loop_mix:
        ap.error("--ptx-digest and --loop-mix are two reports: ask for one")
    if args.instructions_only and not args.ptx_digest:
        ap.error("--instructions-only goes with --ptx-digest")
    if args.ptx_digest:
        digests = ptx_digests(tuple(args.head_dim), args.arch, tuple(args.blocks), args.kernels, args.quant, overrides,
                              instructions_only=args.instructions_only)
        for key, digest in digests.items():
            print(f"{digest}  {key}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(digests, f, indent=1)
        return 0
    if args.loop_mix:
        measured = None
        if args.measured:
            try:
                with open(args.measured) as f:
                    measured = json.load(f)
            except (OSError, ValueError) as err:
                ap.error(f"--measured {args.measured}: {err}")
        rows = loop_mix_report(tuple(args.head_dim), args.arch, tuple(args.blocks), args.kernels, args.quant,
                               overrides)
        print_loop_mix(rows, measured)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    rows = report(tuple(args.head_dim), args.arch, blocks=tuple(args.blocks), kernels=args.kernels, quant=args.quant,
                  overrides=overrides)
    print("| d | kernel | warps | stages | maxnreg | regs | spill bytes | shared KB | wgmma s8 | wgmma 16-bit | "
          "mma.sync | overlapped waits |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['head_dim']} | {r['kernel']} | {r['num_warps']} | {r['num_stages']} | {r['maxnreg'] or '-'} | "
              f"{r['regs']} | {r['spill_bytes']} | {r['shared'] / 1024:.0f} | {r['wgmma_s8']} | {r['wgmma_16bit']} | "
              f"{r['mma_sync']} | {r['wgmma_overlapped_waits']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
