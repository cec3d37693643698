"""sagebwd.triton's launcher retries with fewer pipeline stages when shared memory runs out; the
kernel registry reads a choice or says what it takes.

The defaults are tuned on an H200 (227 KB per block); an RTX 4090 has 99 KB. Triton raises
OutOfResources only where a driver loads the kernel, so a stand-in kernel raises it here.
"""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
from triton.runtime.errors import OutOfResources  # noqa: E402

from sagebwd.triton import launch, registry  # noqa: E402


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
    report = launch.Tuning(compiled={})   # the benchmark's kernel report
    assert launch.launch("standin-a", kernel, (1,), 0, BLOCK=64, num_warps=4, num_stages=3, tuning=report) == \
        "compiled with 1 stages"
    assert kernel.tried == [3, 2, 1]
    assert report.compiled["standin-a"] == "compiled with 1 stages"
    launch.launch("standin-a", kernel, (1,), 0, BLOCK=64, num_warps=4, num_stages=3)
    assert kernel.tried[3:] == [1]                     # the fitted depth is reused
    launch.launch("standin-a", kernel, (1,), 0, BLOCK=32, num_warps=4, num_stages=3)
    assert kernel.tried[4:] == [3, 2, 1]               # other compile-time arguments: tried afresh


def test_launch_reraises_what_fewer_stages_cannot_fix():
    with pytest.raises(OutOfResources):
        launch.launch("standin-b", _StandInKernel(fits_at=0), (1,), 0, num_warps=4, num_stages=2)
    with pytest.raises(OutOfResources):   # registers, not shared memory: no retry
        launch.launch("standin-c", _StandInKernel(fits_at=1, error="registers"), (1,), 0, num_stages=3)


def test_a_tool_can_lift_a_default_register_cap(monkeypatch):
    """The sweep's maxnreg 0 ("the compiler's choice") must remove a kernel's default cap, not keep it:
    a variant that silently kept it once read as a 2% gain that the change then lost on the GPU."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    default = dict(num_warps=4, num_stages=3, maxnreg=128)
    assert launch.launch_settings("forward", default) == default
    lifted = launch.Tuning({"forward": dict(num_warps=4, num_stages=3, maxnreg=None)})
    assert launch.launch_settings("forward", default, lifted) == dict(num_warps=4, num_stages=3)
    capped = launch.Tuning({"forward": dict(maxnreg=168)})
    assert launch.launch_settings("forward", default, capped)["maxnreg"] == 168


def test_kernel_choice_is_validated_and_never_leaves_sm90():
    """The registry reads `kernels`: a typo fails with what is accepted, and off Hopper (here: the
    CPU, as under the interpreter) the Triton kernels always run, whatever was chosen."""
    import torch
    import sagebwd
    assert registry.parse("triton") == registry.Choice("triton", "triton", "triton")
    assert registry.parse(" Triton , dkdv=Gluon-WS ") == registry.Choice("triton", "triton", "gluon-ws")
    assert registry.parse("default") == registry.Choice()
    assert registry.parse("default,fused") == registry.Choice("default", "fused", "fused")   # a set plus one
    assert registry.parse("dq=triton,default") == registry.Choice()                          # left to right
    with pytest.raises(registry.KernelChoiceError, match=r"kernels='forward=gluon,dkvd=gluon': cannot read "
                                                         r"'dkvd=gluon'; use a comma list of default, triton, fused"):
        registry.parse("forward=gluon,dkvd=gluon")
    with pytest.raises(registry.KernelChoiceError, match=r"dkdv has no kernel 'glon'; choose default or one of "
                                                         r"fused, gluon, gluon-roles, gluon-ws, triton"):
        registry.parse("dkdv=glon")
    with pytest.raises(registry.KernelChoiceError, match="choose it for both passes"):
        registry.parse("dq=fused")
    with pytest.raises(sagebwd.SageBwdInputError, match="cannot read 'all'"):
        sagebwd.attention(*[torch.zeros(1, 1, 128, 64)] * 3, backend="simulate", kernels="all")
    assert registry.arch_of(torch.device("cpu")) == "generic"
    for pass_ in registry.PASSES:
        for d in registry.HEAD_DIMS:
            assert registry.select("generic", d, pass_, "block", "default,forward=gluon,fused").name == "triton"
    # what an H100/H200 runs by default: the Gluon dK/dV, and the Gluon dQ at d=128 only
    assert [registry.select("sm90", d, p).name for d in (64, 128) for p in registry.PASSES] == [
        "triton", "triton", "gluon-ws", "triton", "gluon-ws", "gluon-ws"]
    # outside a kernel's limits its fallback runs: Q-smoothing, or a sequence the 128-row programs do not tile
    shape = dict(block_q=128, block_kv=64, smooth_q=False, seq=4096)
    assert registry.resolve("sm90", 64, "dkdv", **{**shape, "smooth_q": True}).name == "triton"
    assert registry.resolve("sm90", 64, "dkdv", **{**shape, "seq": 192}).name == "gluon"
    assert registry.resolve("sm90", 64, "dq", "block", "fused", **{**shape, "seq": 192}).name == "triton"
    # the token contract on Hopper: its Gluon dK/dV by default (Triton's elsewhere and outside its limits)
    for d in registry.HEAD_DIMS:
        assert registry.select("sm90", d, "dkdv", "token").name == "gluon-ws"
        assert registry.select("sm90", d, "dkdv", "token", "triton").name == "triton"
        assert registry.resolve("sm90", d, "dkdv", "token", **{**shape, "smooth_q": True}).name == "triton"
        assert registry.resolve("sm90", d, "dkdv", "token", **{**shape, "seq": 192}).name == "gluon"
        assert registry.select("sm90", d, "dkdv", "token", "fused").name == "gluon-ws"   # fused is block's only
        assert registry.select("generic", d, "dkdv", "token", "dkdv=gluon-ws").name == "triton"
    # ... and its Gluon dQ (H200: warp-specialised on two consumers, at d=64 one without the mask), Triton's where
    # chosen and outside its limits (Q-smoothing, blocks) and off Hopper
    defaults = {64: "gluon-ws2", 128: "gluon-ws2"}
    for d in registry.HEAD_DIMS:
        assert registry.select("sm90", d, "dq", "token").name == defaults[d]
        assert registry.select("sm90", d, "dq", "token", "triton").name == "triton"
        assert registry.select("sm90", d, "dq", "token", "fused").name == defaults[d]   # fused is block's only
        # the two-consumer dQ: on the token rows only (the block contract's tile maxima span the block), and not
        # the d=64 token default without the causal mask (a call that names a kernel gets that kernel)
        unmasked = {64: "gluon-ws", 128: "gluon-ws2"}[d]
        assert registry.select("sm90", d, "dq", "token", causal=False).name == unmasked
        assert registry.select("sm90", d, "dq", "token", causal=True).name == defaults[d]
        assert registry.select("sm90", d, "dq", "token", "dq=gluon", causal=False).name == "gluon"
        assert registry.select("sm90", d, "dq", "token", "fused", causal=False).name == unmasked
        assert registry.resolve("sm90", d, "dq", "token", causal=False, **shape).name == unmasked
        assert registry.resolve("sm90", d, "dq", "token", causal=False, **{**shape, "smooth_q": True}).name \
            == "triton"
        assert registry.select("sm90", d, "dq", "block", causal=False).name == registry.select("sm90", d, "dq").name
        assert registry.select("sm90", d, "dq", "block", "dq=gluon-ws2").name == registry.select("sm90", d, "dq").name
        for name in ("gluon-ws", "gluon", "gluon-ws2"):
            assert registry.select("sm90", d, "dq", "token", f"dq={name}").name == name
            assert registry.resolve("sm90", d, "dq", "token", f"dq={name}", **shape).name == name
            assert registry.resolve("sm90", d, "dq", "token", f"dq={name}", **{**shape, "smooth_q": True}).name \
                == "triton"
            assert registry.resolve("sm90", d, "dq", "token", f"dq={name}", **{**shape, "block_kv": 128}).name \
                == "triton"
            assert registry.select("generic", d, "dq", "token", f"dq={name}").name == "triton"


def test_the_two_consumer_dq_refuses_the_block_contract_and_the_plain_kernel():
    """hopper.dq_launch_args(split=True) outside what SPLIT computes: a clear error before any descriptor."""
    import torch
    hopper = pytest.importorskip("sagebwd.triton.hopper")
    q8 = torch.zeros(1, 1, 128, 64, dtype=torch.int8)
    for token, ws in ((False, True), (True, False)):
        with pytest.raises(ValueError, match="needs the token contract .* and the warp-specialised kernel"):
            hopper.dq_launch_args(q8, q8, q8, None, None, None, None, None, None, None, None, causal=True, ws=ws,
                                  token=token, split=True)


@pytest.mark.parametrize("argv,message", [
    (["--kernels", "dkdv,fwd"], "kernels='dkdv,fwd': cannot read 'dkdv'"),
    (["--kernel-times", "--kernel-shapes", "8,8,4096"], "'8,8,4096': expected four positive integers B,H,N,D"),
    (["--kernel-times", "--kernel-masks", "sliding"], "invalid choice: 'sliding'"),
    (["--kernel-times", "--kernel-layout", "rows"], "invalid choice: 'rows'"),
    (["--once", "--quant", "token", "--shapes", "4,12,4096"], "'4,12,4096': expected four positive integers B,H,N,D"),
    (["--once", "--quant", "int4"], "invalid choice: 'int4'"),
])
def test_bench_rejects_bad_flags_before_looking_for_a_gpu(argv, message, capsys):
    """The benchmark's new flags fail on any machine, with what was wrong, before it asks for CUDA."""
    from benchmarks import attention
    with pytest.raises(SystemExit) as exit_info:
        attention.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


_SHAPE_ERRORS = [
    (["--shapes", "8,8,4096"], "'8,8,4096': expected four positive integers B,H,N,D"),
    (["--shapes", "8,8,4096,96"], "head dim 64 or 128 and a sequence that is a multiple of 128"),
    (["--shapes", "8,8,4160,64"], "head dim 64 or 128 and a sequence that is a multiple of 128"),
]


@pytest.mark.parametrize("module,argv,message", [("forward_tiles", *e) for e in _SHAPE_ERRORS] + [
    ("sections", *e) for e in _SHAPE_ERRORS] + [("prepass", *e) for e in _SHAPE_ERRORS] + [
    ("prepass", ["--lags", "-1"], "--lags must be >= 0"),
    ("prepass", ["--quant", "int4"], "invalid choice: 'int4'"),
    ("prepass", ["--iters", "0"], "--iters and --repeats >= 1"),
    ("prepass", ["--repeats", "0"], "--iters and --repeats >= 1"),
    ("prepass", ["--layouts", "diagonal"], "invalid choice: 'diagonal'"),
    ("preprocess", ["--shapes", "8,8,4096,96"], "head dim 64 or 128 and a sequence that is a multiple of 128"),
    ("preprocess", ["--warps", "4", "3"], "each a power of two from 1 to 32"),
    ("preprocess", ["--quant", "int4"], "invalid choice: 'int4'"),
    ("preprocess", ["--repeats", "0"], "--iters and --repeats >= 1"),
    ("sections", ["--budgets-mib", "16", "0"], "each budget is a positive number of MiB"),
    ("sections", ["--rounds", "0"], "--rounds 0: at least 1"),
])
def test_token_forward_benchmarks_reject_bad_arguments_before_looking_for_a_gpu(module, argv, message, capsys):
    import importlib
    bench = importlib.import_module(f"benchmarks.{module}")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("module", ["forward_tiles", "sections", "prepass", "preprocess"])
def test_token_forward_benchmarks_say_they_need_a_gpu(module, monkeypatch, capsys):
    import importlib

    import torch
    bench = importlib.import_module(f"benchmarks.{module}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--shapes", "1,2,256,64"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_dq_add_bench_says_it_needs_a_gpu(monkeypatch, capsys):
    """The fused-backward cost benchmark is GPU-only: without CUDA it says so and exits 2."""
    import torch

    from tools import dq_add_bench
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dq_add_bench.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["8,8,4096", "8,8,4000,128", "8,8,4096,96", "a,b,c,d"])
def test_dq_add_bench_rejects_a_bad_shape(bad, capsys):
    """A shape the adds cannot tile is refused with what is wrong, before any GPU work."""
    from tools import dq_add_bench
    with pytest.raises(SystemExit):
        dq_add_bench.main(["--shapes", bad])
    err = capsys.readouterr().err
    assert "--shapes" in err and ("B,H,N,D" in err or "multiple of 128" in err), err


def test_dq_add_bench_rejects_other_kv_rows(capsys):
    """Only the kv tile heights a backward program holds (64, 128) are timed; another is refused by name."""
    from tools import dq_add_bench
    with pytest.raises(SystemExit):
        dq_add_bench.main(["--kv-rows", "96"])
    err = capsys.readouterr().err
    assert "--kv-rows" in err and "96" in err, err


def _misaligned(t):
    """t's values at an address one element past a 16-byte boundary (what an offset view hands a kernel)."""
    import torch
    out = torch.empty(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape)
    out.copy_(t)
    return out


def test_a_launch_signature_is_at_least_as_fine_as_tritons_specialisation():
    """launch() runs the kernel compiled for an earlier launch of the same launch_signature without asking
    Triton, so two launches Triton would compile differently must never share a signature: every
    launch of every kernel of both contracts, and variants of each (tensors one element off 16-byte
    alignment, integers 1, 17 and past 32 bits), against JITFunction's own binder for sm_90."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import compute_cache_key, create_function_from_signature

    import torch
    from tools.offline import record_launches
    backend = make_backend(GPUTarget("cuda", 90, 128))
    binders, triton_key_of = {}, {}
    for n, d in ((256, 64), (256, 128), (512, 64), (512, 128)):   # two lengths: other descriptor shapes
        for quant in ("block", "token"):
            for causal in (True, False):
                for kernels in ("default", "triton"):
                    for name, kernel, args, kwargs in record_launches((1, 2, n, d), causal=causal, quant=quant,
                                                                      kernels=kernels):
                        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.numel()]
                        ints = [i for i, a in enumerate(args) if type(a) is int]
                        variants = [args]
                        for i in tensors[:3]:
                            variants.append(args[:i] + (_misaligned(args[i]),) + args[i + 1:])
                        for i in ints:
                            variants += [args[:i] + (v,) + args[i + 1:] for v in (1, 17, 2**32 + 16)]
                        if kernel not in binders:
                            binders[kernel] = create_function_from_signature(kernel.signature, kernel.params, backend)
                        for variant in variants:
                            _, specialization, options = binders[kernel](*variant, **kwargs)
                            triton_key = compute_cache_key({}, specialization, options)
                            signature = launch.launch_signature(kernel, variant, kwargs, 0)
                            assert signature is not None, f"{name}: a launch the direct path cannot key"
                            assert triton_key_of.setdefault(signature, triton_key) == triton_key, \
                                f"{name}: one launch signature for two of Triton's specialisations"
    assert len(set(triton_key_of.values())) > 100   # the variants did specialise differently
    kernel = next(iter(binders))
    signature_of = lambda value: launch.launch_signature(kernel, (), {"CAUSAL": value}, 0)  # noqa: E731
    assert signature_of(True) != signature_of(1)
    assert launch.launch_signature(binders and next(iter(binders)), (object(),), {}, 0) is None


@triton.jit
def _standin_kernel(X, n, N: triton.language.constexpr, SCALE: triton.language.constexpr = 1.0):
    pass


def test_a_launch_signature_keys_constexprs_by_value_and_refuses_what_it_cannot():
    """A constexpr passed by position is keyed by its value (N=64 and N=128 are two kernels), a float
    constexpr (Triton tells -0.0 from 0.0) and an argument of an unknown kind take JITFunction.run (None),
    and a triton.tools TensorDescriptor, which has no layout, is keyed without one."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    x = torch.zeros(64, 64)
    sig = lambda *args, **kwargs: launch.launch_signature(_standin_kernel, args, kwargs, 0)  # noqa: E731
    assert sig(x, 3, 64) != sig(x, 3, 128)
    assert sig(x, 3, 64) == sig(x, 5, 64)                      # a runtime int: by its flags only
    assert sig(x, 3, N=64) != sig(x, 3, N=True)
    assert sig(x, 3, 64, 0.5) is None and sig(x, 3, 64, SCALE=-0.0) is None
    assert sig(x, 3, object()) is None and sig([x], 3, 64) is None
    assert sig(TensorDescriptor.from_tensor(x, [16, 16]), 3, 64) is not None


def test_dq_add_bench_beside_mode_says_it_needs_a_gpu(monkeypatch, capsys):
    """--dq-beside-dkdv (the two token backward kernels on two streams) is GPU-only like the rest of the tool."""
    import torch

    from tools import dq_add_bench
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dq_add_bench.main(["--dq-beside-dkdv", "--shapes", "4,12,4096,64"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


@pytest.mark.parametrize("layout", ["model", "contiguous"])
def test_prepass_times_bf16_inputs_and_the_quantise_launches_refuse_fp32(layout):
    """benchmarks.prepass's inputs are bf16 (B, H, N, D) views in both layouts (an fp32 offset once made them fp32,
    which the kernels quantised without complaint at twice the bytes); quantize's launches now refuse fp32."""
    import torch

    from benchmarks.prepass import prepass_inputs
    from sagebwd.triton import quantize
    q, k, v = prepass_inputs((1, 2, 256, 64), layout, "cpu")
    assert q.dtype == k.dtype == v.dtype == torch.bfloat16 and q.shape == (1, 2, 256, 64)
    assert (q.stride(1), q.stride(2)) == ((64, 3 * 2 * 64) if layout == "model" else (256 * 64, 64))
    with pytest.raises(AssertionError, match="fp16/bf16, got torch.float32"):
        quantize.quantize_qkv(q.float(), k, v, 128, 64, k_mean=None, smooth_q=False, cols=True)
    with pytest.raises(AssertionError, match="fp16/bf16, got torch.float32"):
        quantize._quantize_qkv_with_mean(q.float(), k.float(), v.float(), 128, 64, smooth_q=False, cols=True,
                                         token=True, quantize_q=False)


def test_preprocess_benchmark_times_model_layout_bf16_and_counts_its_bytes():
    """benchmarks.preprocess: dO and O bf16 views of (B, N, H, D) storage; the bytes: dO and O read, dO^ written
    (one byte in either contract)."""
    import torch

    from benchmarks.preprocess import preprocess_bytes, preprocess_inputs
    do, o, lse = preprocess_inputs((1, 2, 256, 64), "cpu")
    assert do.dtype == o.dtype == torch.bfloat16 and do.shape == o.shape == (1, 2, 256, 64)
    assert (do.stride(1), do.stride(2)) == (64, 2 * 64)
    assert lse.shape == (1, 2, 256)
    assert preprocess_bytes((1, 2, 256, 64)) == 2 * 256 * 64 * 5


def test_prepass_counts_the_bytes_the_pass_must_move():
    """benchmarks.prepass's bandwidth column: K read twice, V once (and Q in the block contract) in bf16, and the
    int8 copies written (K^, V^T; in the block contract K^T, Q^, Q^T too)."""
    from benchmarks.prepass import prepass_bytes
    elements = 2 * 3 * 256 * 64
    assert prepass_bytes((2, 3, 256, 64), "token") == elements * (2 * 3 + 2)
    assert prepass_bytes((2, 3, 256, 64), "block") == elements * (2 * 4 + 5)


@pytest.mark.parametrize("quant", ["token", "block"])
def test_the_token_forward_is_the_quantise_launchs_programmatic_dependent_on_hopper(quant):
    """launch.forward_pdl: on Hopper the token forward (it quantises Q itself) is launched as a programmatic dependent
    (launch_pdl, and its PDL wait) of the quantise launch (its PDL trigger); the block forward is not; a tool's
    Tuning override "pdl" decides either way; and only those two launches change."""
    import torch

    from sagebwd.triton.launch import Tuning, forward_pdl
    from tools.offline import recorded_fwd_bwd
    q, k, v, do = [torch.randn(1, 2, 256, 64).bfloat16() for _ in range(4)]
    on = {name: kw for name, _, _, kw in recorded_fwd_bwd(q, k, v, do, quant=quant, overrides={"pdl": True})}
    off = {name: kw for name, _, _, kw in recorded_fwd_bwd(q, k, v, do, quant=quant, overrides={"pdl": False})}
    default = {name: kw for name, _, _, kw in recorded_fwd_bwd(q, k, v, do, quant=quant)}
    assert default == (on if quant == "token" else off)
    assert not any("PDL" in kw or "launch_pdl" in kw for kw in off.values())
    assert on["forward"]["PDL"] and on["forward"]["launch_pdl"] and on["quantize"]["PDL"]
    assert "launch_pdl" not in on["quantize"]   # the quantise launch itself waits for everything before it
    assert all(on[name] == off[name] for name in off if name not in ("forward", "quantize"))
    # not on another architecture, nor under the interpreter (a CPU tensor), unless a tool asks
    assert not forward_pdl(q.device, True, None) and not forward_pdl(q.device, True, Tuning(arch="generic"))
    assert forward_pdl(q.device, True, Tuning(arch="sm90")) and not forward_pdl(q.device, False, Tuning(arch="sm90"))
    assert forward_pdl(q.device, False, Tuning(overrides={"pdl": True}))


def test_probe_inputs_put_every_querys_largest_score_at_key_0_with_a_sink():
    """benchmarks.forward_tiles.probe_inputs: the forward probes' inputs; with sink=True every query's largest
    score is at key 0 (an online softmax's running maximum never rises after the first tile), without it almost
    none is."""
    import torch

    from benchmarks.forward_tiles import probe_inputs
    for sink in (True, False):
        q, k, v = probe_inputs((1, 2, 1024, 64), sink, device="cpu")
        assert q.dtype == k.dtype == v.dtype == torch.bfloat16 and q.shape == (1, 2, 1024, 64)
        first = ((q.float() @ k.float().transpose(-1, -2)).argmax(dim=-1) == 0).float().mean().item()
        assert first == 1.0 if sink else first < 0.01, (sink, first)
