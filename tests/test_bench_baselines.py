"""benchmarks/baselines.py on the CPU: which columns run, what a missing package or an unsupported
head dim puts in the table, FA4's layout adapters, and the FP8 column's scale bookkeeping against
a stand-in for cuDNN's graph API that computes in float64."""
from __future__ import annotations

import math
import sys
import types

import pytest
import torch

pytest.importorskip("triton")   # benchmarks.attention imports tests.kernel_checks, which needs it

from benchmarks import attention, baselines  # noqa: E402
from sagebwd import fpa_attention  # noqa: E402


def _sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _inputs(shape=(1, 2, 32, 16), seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=dtype) for _ in range(4)]


# ---------------------------------------------------------------------------------------------
# which columns


def test_default_is_every_column_sdpa_first_then_the_optional_ones():
    assert baselines.DEFAULT == ("FLASH", "CUDNN", "EFFICIENT", "FA4", "CUDNN-FP8")
    assert baselines.OPTIONAL == ("FA4", "CUDNN-FP8")
    assert attention.BASELINES == baselines.DEFAULT
    assert not any(baselines.BASELINES[b].module for b in baselines.SDPA)


@pytest.mark.parametrize("names,expected", [
    (["fa4", "cudnn-fp8"], ("FA4", "CUDNN-FP8")),
    (["CUDNN-FP8", "flash", "Cudnn"], ("FLASH", "CUDNN", "CUDNN-FP8")),   # the registry's order
    (["fa4,FLASH", "fa4"], ("FLASH", "FA4")),                               # commas, repeats
    (["all"], baselines.DEFAULT),
    (["fp8"], ("CUDNN-FP8",)),
])
def test_selection_reads_names_in_any_case_and_keeps_the_registry_order(names, expected):
    assert baselines.parse_selection(names) == expected


@pytest.mark.parametrize("names", [["fa5"], ["FLASH", "cudnn-fp16"], [","]])
def test_selection_rejects_what_it_cannot_read(names):
    with pytest.raises(ValueError, match="--baselines"):
        baselines.parse_selection(names)


def test_bench_rejects_an_unknown_column_before_looking_for_a_gpu(capsys):
    with pytest.raises(SystemExit) as exit_info:
        attention.main(["--baselines", "FLASH", "fa5"])
    assert exit_info.value.code == 2
    assert "unknown column 'fa5'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# "not installed" and "unsupported"


def _absent(module):
    raise ModuleNotFoundError(f"No module named {module!r}")


def test_a_missing_package_makes_its_cells_say_not_installed():
    cell = baselines.skip_cell("FA4", (8, 8, 4096, 128), (9, 0), importer=_absent)
    assert cell["ms"] is None and cell["status"] == baselines.NOT_INSTALLED
    assert "flash-attn-4" in cell["error"] and "ModuleNotFoundError" in cell["error"]
    assert baselines.cell_text(cell) == "not installed"
    # a package that imports but fails while loading (no libcudnn, say) is as absent
    cell = baselines.skip_cell("CUDNN-FP8", (8, 8, 4096, 128), (9, 0),
                               importer=lambda m: (_ for _ in ()).throw(OSError("libcudnn.so.9: cannot open")))
    assert cell["status"] == baselines.NOT_INSTALLED and "nvidia-cudnn-frontend: OSError" in cell["error"]


def test_sdpa_columns_import_nothing():
    def importer(module):
        raise AssertionError("imported " + module)
    for name in baselines.SDPA:
        assert baselines.skip_cell(name, (8, 8, 4096, 64), (9, 0), importer=importer) is None


def test_fa4_here_is_reported_not_installed_unless_it_is():
    try:
        import flash_attn.cute  # noqa: F401
    except Exception:  # noqa: BLE001
        assert "flash-attn-4" in baselines.missing("FA4")
        assert baselines.describe(["FA4"])["FA4"]["status"] == baselines.NOT_INSTALLED
    else:
        pytest.skip("flash-attn-4 imports here")


@pytest.mark.parametrize("shape,capability,expected", [
    ((8, 16, 4096, 64), (9, 0), True),    # Hopper: D=128 only
    ((2, 16, 16384, 64), (9, 0), True),
    ((8, 8, 4096, 128), (9, 0), False),
    ((8, 16, 4096, 64), None, True),       # unknown GPU: taken for Hopper
    ((8, 16, 4096, 64), (10, 0), False),   # elsewhere: built, and a decline reported as it comes
])
def test_cudnn_fp8_is_unsupported_at_head_dim_64_on_hopper(shape, capability, expected):
    why = baselines.unsupported("CUDNN-FP8", shape, capability)
    assert bool(why) == expected
    if expected:
        assert "128" in why and str(shape[-1]) in why
    assert baselines.unsupported("FA4", shape, capability) is None


def test_the_benchmark_puts_the_skip_in_the_cell_without_touching_the_gpu(monkeypatch):
    """time_impl returns an optional column's skip before it makes any CUDA tensor."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(baselines, "missing", lambda name, importer=None: None)
    cell = attention.time_impl("CUDNN-FP8", (8, 16, 4096, 64), True, "fwd+bwd")
    assert cell["status"] == baselines.UNSUPPORTED and cell["ms"] is None
    monkeypatch.setattr(baselines, "missing", lambda name, importer=None: f"{name}: ModuleNotFoundError")
    for name in baselines.OPTIONAL:
        cell = attention.time_impl(name, (8, 8, 4096, 128), False, "bwd")
        assert cell["status"] == baselines.NOT_INSTALLED


def test_a_declined_graph_reads_unsupported_and_any_other_failure_n_a():
    declined = type("cudnnGraphNotSupportedError", (RuntimeError,), {})("no engine proposed a plan")
    assert baselines.failed_cell(declined)["status"] == baselines.UNSUPPORTED
    assert baselines.failed_cell(RuntimeError("[cudnn_frontend] Error: head dim not supported"))["status"] == \
        baselines.UNSUPPORTED
    cell = baselines.failed_cell(AssertionError("q shape mismatch"))
    assert cell["status"] == baselines.ERROR and "AssertionError: q shape mismatch" in cell["error"]
    assert baselines.cell_text(cell) == "n/a"
    assert baselines.cell_text({"ms": 1.23456}) == "1.235"


def test_the_table_says_why_a_cell_is_empty_and_keeps_its_columns():
    def timed(ms, peak=None):
        return {"ms": ms, "tflops": 300.0, **({"peak_mib": peak} if peak else {})}
    rows = []
    for mode in attention.MODES:
        fb = mode == "fwd+bwd"
        rows.append({"shape": [8, 16, 4096, 64], "causal": True, "mode": mode,
                     "sage": timed(2.0, 426.0 if fb else None), "sage-token": timed(3.0, 426.0 if fb else None),
                     "FLASH": timed(4.0, 516.0 if fb else None), "CUDNN": timed(2.5, 388.0 if fb else None),
                     "EFFICIENT": timed(9.0), "FA4": baselines.skip_cell("FA4", (8, 16, 4096, 64), importer=_absent),
                     "CUDNN-FP8": {"ms": None, "status": baselines.UNSUPPORTED, "error": "D=128 only"}})
    table = attention.markdown_table(rows).splitlines()
    head = [c.strip() for c in table[0].strip("|").split("|")]
    assert head[:7] == ["(B,H,N,D)", "mask", "pass", "SageBwd block ms", "TFLOPS", "SageBwd token ms", "TFLOPS"]
    assert head[7:12] == ["FLASH ms", "CUDNN ms", "EFFICIENT ms", "FA4 ms", "CUDNN-FP8 ms"]
    assert "SageBwd block ×FLASH" in head and "×CUDNN-FP8" in head and "×EFFICIENT" not in head
    assert {line.count("|") for line in table} == {len(head) + 1}
    fwd_bwd = table[2 + attention.MODES.index("fwd+bwd")]
    cells = dict(zip(head, (c.strip() for c in fwd_bwd.strip("|").split("|"))))
    assert cells["FA4 ms"] == "not installed" and cells["CUDNN-FP8 ms"] == "unsupported"
    assert cells["SageBwd block ×FLASH"] == "2.00" and cells["×FA4"] == "n/a"
    assert cells[head[-1]] == "426 / 426 / 516 / 388 / n/a / n/a"
    assert "FA4      not installed" in attention._format_row(rows[0])
    graph_row = [c.strip() for c in table[-1].strip("|").split("|")]
    assert graph_row[2] == "fwd+bwd graph" and graph_row[-1] == ""   # peak memory: the fwd+bwd row's only


# ---------------------------------------------------------------------------------------------
# FA4's layout


def test_the_fa4_layout_adapters_give_the_same_values_back():
    x = torch.arange(2 * 3 * 5 * 4, dtype=torch.float32).reshape(2, 3, 5, 4)   # (B, H, N, D)
    y = baselines.to_bnhd(x)
    assert y.shape == (2, 5, 3, 4) and y.is_contiguous()
    assert y.data_ptr() != x.data_ptr()   # a copy: made once, before the timing
    for b, h, n, d in [(0, 0, 0, 0), (1, 2, 4, 3), (0, 1, 3, 2)]:
        assert y[b, n, h, d] == x[b, h, n, d]
    back = baselines.from_bnhd(y)
    assert back.shape == x.shape and torch.equal(back, x)
    assert back.data_ptr() == y.data_ptr()   # a view


@pytest.mark.parametrize("causal", [True, False])
def test_the_fa4_runner_feeds_bnhd_and_returns_bhnd_outputs_and_gradients(monkeypatch, causal):
    """A stand-in flash_attn.cute.flash_attn_func that checks FA4's contract ((B, N, H, D), causal=,
    returns (out, lse)): the runner's O, dQ, dK, dV equal SDPA's on the (B, H, N, D) inputs."""
    calls = []

    def flash_attn_func(q, k, v, causal=False, softmax_scale=None):
        assert q.dim() == 4 and q.is_contiguous() and q.shape == (1, 32, 2, 16)   # (B, N, H, D)
        calls.append(causal)
        o = _sdpa(*(t.transpose(1, 2) for t in (q, k, v)), causal).transpose(1, 2)
        return o, torch.zeros(q.shape[0], q.shape[2], q.shape[1])
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    q, k, v, do = _inputs()
    runner = baselines.make_runner("FA4", q, k, v, do, causal)
    reference = baselines.AutogradRunner(lambda a, b, c: _sdpa(a, b, c, causal), q, k, v, do)
    for got, want in zip(runner.outputs(), reference.outputs()):
        assert got.shape == q.shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert runner.forward().shape == (1, 32, 2, 16)
    assert set(calls) == {causal}


# ---------------------------------------------------------------------------------------------
# FP8 scales


@pytest.mark.parametrize("amax", [1e-3, 0.37, 1.0, 4.9, 448.0, 3000.0])
def test_fp8_scale_is_the_largest_power_of_two_that_fits(amax):
    s = baselines.fp8_scale(amax)
    assert math.log2(s) == int(math.log2(s))
    assert amax * s <= 448.0 < amax * s * 2


@pytest.mark.parametrize("amax", [0.0, float("nan"), float("inf")])
def test_fp8_scale_of_nothing_to_measure_is_one(amax):
    assert baselines.fp8_scale(amax) == 1.0


def test_quantize_fp8_round_trips_within_e4m3_rounding():
    x = torch.randn(4, 64, 32, generator=torch.Generator().manual_seed(3)) * 3
    x8, scale, amax = baselines.quantize_fp8(x)
    assert x8.dtype == torch.float8_e4m3fn and amax == float(x.abs().max())
    back = x8.float() / scale
    assert torch.isfinite(back).all()
    normal = x.abs() * scale >= 2.0 ** -6
    assert ((back - x).abs()[normal] <= x.abs()[normal] * 2.0 ** -4).all()   # 3 mantissa bits: half an ulp


@pytest.mark.parametrize("causal", [True, False])
def test_backward_amax_bounds_bound_the_real_values(causal):
    q, k, v, do = _inputs((1, 2, 64, 16), seed=5)
    ref = fpa_attention(q, k, v, do, causal=causal)
    bounds = baselines.backward_amax_bounds(q.shape, *(float(t.abs().max()) for t in (q, k, v, do)))
    real = {"o": ref.o, "dp": ref.dp, "dq": ref.dq, "dk": ref.dk, "dv": ref.dv}
    for name, t in real.items():
        assert float(t.abs().max()) <= bounds[name], name


# ---------------------------------------------------------------------------------------------
# the FP8 column against a stand-in for cuDNN's graph API


class _FakeTensor:
    def __init__(self, uid=None, dim=None, data_type=None):
        self.uid, self.dim, self.data_type, self.output = uid, dim, data_type, False

    def set_uid(self, uid):
        self.uid = uid
        return self

    def set_output(self, value):
        self.output = value
        return self

    def set_dim(self, dim):
        self.dim = tuple(dim)
        return self

    def set_stride(self, stride):
        return self

    def set_data_type(self, data_type):
        self.data_type = data_type
        return self


class _FakeGraph:
    """sdpa_fp8 / sdpa_fp8_backward computed in float64 from the dequantised inputs, the outputs
    cast to e4m3 with their scales, the amaxes those of the unscaled values (as cuDNN reports)."""
    built = []

    def __init__(self, io_data_type=None, intermediate_data_type=None, compute_data_type=None):
        assert io_data_type == "FP8_E4M3" and compute_data_type == "FLOAT"
        self.op = None

    def tensor(self, uid, dim, stride, data_type):
        assert len(dim) == len(stride) == 4
        return _FakeTensor(uid, tuple(dim), data_type)

    def _node(self, op, kwargs, n_out):
        assert self.op is None
        self.op, self.kw, self.outs = op, kwargs, [_FakeTensor() for _ in range(n_out)]
        causal = kwargs.get("right_bound") == 0
        assert causal == ("diagonal_alignment" in kwargs)
        if causal:
            assert kwargs["diagonal_alignment"] == "TOP_LEFT"
        return self.outs

    def sdpa_fp8(self, **kw):
        return self._node("fwd", kw, 4)

    def sdpa_fp8_backward(self, **kw):
        assert kw["use_padding_mask"] is False
        return self._node("bwd", kw, 7)

    def validate(self):
        pass

    def build_operation_graph(self):
        pass

    def create_execution_plans(self, heuristics):
        assert heuristics == ["A", "FALLBACK"]

    def check_support(self):
        pass

    def build_plans(self):
        _FakeGraph.built.append(self.op)

    def get_workspace_size(self):
        return 16

    def execute(self, pack, workspace, handle=None):
        assert handle == "handle"
        inputs = {name: t for name, t in self.kw.items() if isinstance(t, _FakeTensor)}
        needed = {t.uid for t in inputs.values()} | {t.uid for t in self.outs if t.output}
        assert needed == set(pack), "the variant pack holds exactly the graph's tensors"
        x = {name: pack[t.uid].double() for name, t in inputs.items()}

        def deq(name):
            return x[name] * x["descale_" + name]

        def put(out, value, scale):
            pack[out.uid].copy_((value * scale).to(torch.float8_e4m3fn))

        causal = self.kw.get("right_bound") == 0
        q, k, v = deq("q"), deq("k"), deq("v")
        assert self.kw["attn_scale"] == pytest.approx(1 / math.sqrt(q.shape[-1]))
        if self.op == "fwd":
            ref = fpa_attention(q, k, v, causal=causal)
            o, stats, _amax_s, amax_o = self.outs
            put(o, ref.o, x["scale_o"])
            if stats.output:
                pack[stats.uid].copy_(ref.lse.unsqueeze(-1))
            pack[amax_o.uid].fill_(float(ref.o.abs().max()))
            return
        ref = fpa_attention(q, k, v, x["dO"] * x["descale_dO"], causal=causal)
        assert torch.allclose(x["o"] * x["descale_o"], ref.o, rtol=0.07, atol=1e-3), "O and its descale agree"
        dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp = self.outs
        for out, value, scale in ((dq, ref.dq, "scale_dQ"), (dk, ref.dk, "scale_dK"), (dv, ref.dv, "scale_dV")):
            put(out, value, x[scale])
        for out, value in ((amax_dq, ref.dq), (amax_dk, ref.dk), (amax_dv, ref.dv), (amax_dp, ref.dp)):
            pack[out.uid].fill_(float(value.abs().max()))


@pytest.fixture
def fake_cudnn(monkeypatch):
    cudnn = types.ModuleType("cudnn")
    cudnn.data_type = types.SimpleNamespace(FP8_E4M3="FP8_E4M3", FLOAT="FLOAT")
    cudnn.diagonal_alignment = types.SimpleNamespace(TOP_LEFT="TOP_LEFT")
    cudnn.heur_mode = types.SimpleNamespace(A="A", FALLBACK="FALLBACK")
    cudnn.pygraph = _FakeGraph
    cudnn.create_handle = lambda: "handle"
    cudnn.set_stream = lambda handle, stream: None
    monkeypatch.setitem(sys.modules, "cudnn", cudnn)
    _FakeGraph.built = []
    return cudnn


@pytest.mark.parametrize("causal", [True, False])
def test_the_fp8_runner_wires_scales_so_its_outputs_dequantise_to_attention(fake_cudnn, causal):
    shape = (1, 2, 128, 128)
    q, k, v, do = (t.bfloat16() for t in _inputs(shape, seed=2))
    runner = baselines.make_runner("CUDNN-FP8", q, k, v, do, causal)
    assert _FakeGraph.built == ["fwd", "bwd"] and runner.notes == []
    ref = fpa_attention(*(t.double() for t in (q, k, v, do)), causal=causal)
    outs = runner.outputs()
    for name, got, want in zip(("o", "dq", "dk", "dv"), outs, (ref.o, ref.dq, ref.dk, ref.dv)):
        assert got.shape == shape
        err = float((got.double() - want).norm() / want.norm())
        assert err < 0.1, (name, err)   # e4m3 rounding of inputs and outputs, not a scale error
        check = runner.amax_check[name]
        assert check["dequantised"] == pytest.approx(check["graph"], rel=2.0 ** -3)
    # the scales come from the calibration run's amaxes, not from the bounds
    assert runner.amax["o"] < runner.bounds["o"] and runner.amax["dp"] < runner.bounds["dp"]
    assert runner.peak_mib() > 0
    runner.step()   # the timed calls run as they are
    runner.backward_step()()


def test_the_fp8_forward_column_builds_the_inference_graph_only(fake_cudnn):
    q, k, v, do = (t.bfloat16() for t in _inputs((1, 2, 64, 128), seed=4))
    runner = baselines.make_runner("CUDNN-FP8", q, k, v, do, True, mode="fwd")
    assert _FakeGraph.built == ["fwd"] and not runner.fwd.outs[1].output   # no softmax stats
    runner.forward()


def test_make_runner_knows_only_the_optional_columns():
    with pytest.raises(ValueError, match="not an optional column"):
        baselines.make_runner("FLASH", *_inputs(), causal=True)


def test_the_accuracy_table_says_what_each_row_is():
    rows = [{"impl": "sage", "shape": [1, 8, 4096, 128], "causal": True, "tolerance": None, "passed": True,
             "rel_l2": {"o": 0.017, "dq": 0.045, "dk": 0.045, "dv": 0.05}},
            {"impl": "CUDNN-FP8", "shape": [1, 8, 4096, 128], "causal": False, "tolerance": 0.25, "passed": False,
             "rel_l2": {"o": 0.04, "dq": 1.4, "dk": 0.1, "dv": 0.05}},
            {"impl": "CUDNN-FP8", "shape": [1, 8, 4096, 64], "causal": True, "ms": None, "passed": None,
             "status": baselines.UNSUPPORTED, "error": "D=128 only"}]
    lines = attention.accuracy_table(rows).splitlines()
    assert lines[2] == ("| SageBwd block | (1, 8, 4096, 128) | causal | 1.7e-02 | 4.5e-02 | 4.5e-02 | 5.0e-02 "
                        "| - | reported |")
    assert lines[3].endswith("| 4.0e-02 | 1.4e+00 | 1.0e-01 | 5.0e-02 | 0.25 | FAIL |")
    assert lines[4].endswith("| unsupported | - | unsupported |")


def test_the_fp8_runner_reports_its_engines_and_amaxes(fake_cudnn):
    _FakeGraph.get_plan_name_at_index = lambda self, i: f"eng{i}_{self.op}"
    try:
        q, k, v, do = (t.bfloat16() for t in _inputs((1, 2, 64, 128), seed=6))
        info = baselines.make_runner("CUDNN-FP8", q, k, v, do, False).info()
    finally:
        del _FakeGraph.get_plan_name_at_index
    assert info["engines"] == ["eng0_fwd", "eng0_bwd"]
    assert set(info["amax"]) == {"q", "k", "v", "do", "o", "dq", "dk", "dv", "dp"} and "notes" not in info


def test_bench_shapes_are_read_before_looking_for_a_gpu(capsys):
    with pytest.raises(SystemExit) as exit_info:
        attention.main(["--shapes", "8,8,4096,128", "8,8,4096"])
    assert exit_info.value.code == 2
    assert "'8,8,4096': expected four positive integers B,H,N,D" in capsys.readouterr().err
