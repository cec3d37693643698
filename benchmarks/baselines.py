"""The baseline columns of benchmarks/attention.py: PyTorch SDPA's backends and two optional ones.

    FLASH, CUDNN, EFFICIENT  torch SDPA with that backend, bf16 (always there).
    FA4        FlashAttention-4 (PyPI flash-attn-4, written in CuTe DSL): `flash_attn.cute.flash_attn_func`,
               bf16, on contiguous (B, N, H, D) copies of the benchmark's (B, H, N, D) inputs, made
               before the timing (`to_bnhd`); its outputs are read back through `from_bnhd`.
    CUDNN-FP8  cuDNN's FP8 attention through nvidia-cudnn-frontend's graph API (Python package `cudnn`):
               `sdpa_fp8` forward and `sdpa_fp8_backward`, Q, K, V, O, dO, dQ, dK, dV in float8_e4m3fn
               with per-tensor scales (what Transformer Engine's FP8 attention runs). The casts to FP8
               and the graph builds happen before the timing; the timed region is the graphs'
               execution. On Hopper cuDNN takes head dim 128 only for the FP8 backward: other head
               dims say "unsupported" without trying.

An optional column whose package does not import says "not installed" in every cell (the JSON says
why); a graph cuDNN declines says "unsupported"; any other failure "n/a" with the error in the JSON.
Nothing here needs a GPU until a runner is built, so the selection, the skip rules, the layout
adapters and the FP8 scale rule are tested on the CPU (tests/test_bench_baselines.py).
"""
from __future__ import annotations

import enum
import importlib
import math
from dataclasses import dataclass

import torch

NOT_INSTALLED = "not installed"
UNSUPPORTED = "unsupported"
ERROR = "error"

# --check: rel-L2 against fp64 attention on the same bf16 inputs. bf16 attention sits near 3e-3
# there; FP8 e4m3 (3 mantissa bits, P quantised too) near 3e-2..1e-1. The bounds catch a wrong
# layout, mask or scale (rel-L2 0.5 and up), not the rounding: the table reports the numbers.
BF16_TOLERANCE = 2e-2
FP8_TOLERANCE = 0.25


@dataclass(frozen=True)
class Baseline:
    name: str                       # the column's key in the rows and the JSON
    description: str
    module: str | None = None       # the import that decides whether an optional column runs
    package: str | None = None      # its PyPI name, for the JSON and the "not installed" note
    tolerance: float | None = None  # --check bound on each output's rel-L2; None: reported only
    ratio: bool = True              # SageBwd's speed-up over it in the markdown table


BASELINES = {
    "FLASH": Baseline("FLASH", "torch SDPA, FLASH_ATTENTION backend (FlashAttention-2), bf16",
                      tolerance=BF16_TOLERANCE),
    "CUDNN": Baseline("CUDNN", "torch SDPA, CUDNN_ATTENTION backend, bf16", tolerance=BF16_TOLERANCE),
    "EFFICIENT": Baseline("EFFICIENT", "torch SDPA, EFFICIENT_ATTENTION backend, bf16",
                          tolerance=BF16_TOLERANCE, ratio=False),
    "FA4": Baseline("FA4", "FlashAttention-4 (flash_attn.cute.flash_attn_func), bf16, (B, N, H, D) inputs",
                    module="flash_attn.cute", package="flash-attn-4", tolerance=BF16_TOLERANCE),
    "CUDNN-FP8": Baseline("CUDNN-FP8", "cuDNN FP8 attention (nvidia-cudnn-frontend sdpa_fp8 / sdpa_fp8_backward), "
                          "e4m3 with per-tensor scales", module="cudnn", package="nvidia-cudnn-frontend",
                          tolerance=FP8_TOLERANCE),
}
SDPA = ("FLASH", "CUDNN", "EFFICIENT")
OPTIONAL = tuple(name for name, b in BASELINES.items() if b.module)
# Every column by default: an optional one whose package is missing shows "not installed".
DEFAULT = tuple(BASELINES)
_ALIASES = {"fa4": "FA4", "flash-attn-4": "FA4", "flashattention-4": "FA4", "cudnn-fp8": "CUDNN-FP8",
            "cudnn_fp8": "CUDNN-FP8", "fp8": "CUDNN-FP8", "flash": "FLASH", "fa2": "FLASH", "cudnn": "CUDNN",
            "efficient": "EFFICIENT"}


def parse_selection(names) -> tuple[str, ...]:
    """The columns for `--baselines NAME...` (any case; fa4, cudnn-fp8, ...; `all` for every one), in
    the registry's order. Raises ValueError naming what it cannot read."""
    chosen = set()
    for raw in names:
        for name in str(raw).split(","):
            name = name.strip()
            if not name:
                continue
            if name.lower() == "all":
                chosen.update(BASELINES)
                continue
            key = _ALIASES.get(name.lower(), name.upper())
            if key not in BASELINES:
                raise ValueError(f"--baselines: unknown column {name!r}; known: {', '.join(BASELINES)} "
                                 f"(or fa4, cudnn-fp8, all)")
            chosen.add(key)
    if not chosen:
        raise ValueError("--baselines: name at least one column")
    return tuple(name for name in BASELINES if name in chosen)


_MISSING: dict = {}


def missing(name: str, importer=None) -> str | None:
    """Why an optional column cannot run here ("flash-attn-4: ModuleNotFoundError: ..."), or None.
    Any exception at import counts (a package that imports but cannot load its libraries is as
    absent as one never installed). Cached per column unless `importer` (tests) is given."""
    baseline = BASELINES[name]
    if baseline.module is None:
        return None
    if importer is None and name in _MISSING:
        return _MISSING[name]
    try:
        (importer or importlib.import_module)(baseline.module)
        why = None
    except Exception as err:  # noqa: BLE001
        why = f"{baseline.package}: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
    if importer is None:
        _MISSING[name] = why
    return why


def unsupported(name: str, shape, capability=None) -> str | None:
    """Why a column does not take this shape on this GPU (capability (major, minor); None: assume
    Hopper), or None. cuDNN's FP8 backward on Hopper takes head dim 128 only; elsewhere the graph
    is built and a decline reported as it comes."""
    if name == "CUDNN-FP8" and shape[-1] != 128 and (capability is None or capability[0] == 9):
        return f"cuDNN FP8 attention (fwd+bwd) on Hopper takes head dim 128 only, not {shape[-1]}"
    return None


def skip_cell(name: str, shape, capability=None, importer=None) -> dict | None:
    """The cell of a column that will not run at this shape ({"ms": None, "status": ...,
    "error": why}), or None when it runs."""
    why = missing(name, importer)
    if why:
        return {"ms": None, "status": NOT_INSTALLED, "error": why}
    why = unsupported(name, shape, capability)
    if why:
        return {"ms": None, "status": UNSUPPORTED, "error": why}
    return None


def failed_cell(err: BaseException) -> dict:
    """The cell of a run that raised: "unsupported" for a graph cuDNN declines
    (cudnnGraphNotSupportedError, or "not supported" in the message), else "error"."""
    text = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
    declined = type(err).__name__ == "cudnnGraphNotSupportedError" or "not supported" in str(err).lower()
    return {"ms": None, "status": UNSUPPORTED if declined else ERROR, "error": f"{type(err).__name__}: {text}"}


def cell_text(r: dict) -> str:
    """A column's ms in the markdown table: the time, "not installed", "unsupported", or "n/a"."""
    if r.get("ms"):
        return f"{r['ms']:.3f}"
    return r["status"] if r.get("status") in (NOT_INSTALLED, UNSUPPORTED) else "n/a"


def describe(names) -> dict:
    """The JSON's record of each chosen column: installed or not (why), and its version."""
    from importlib import metadata
    out = {}
    for name in names:
        baseline = BASELINES[name]
        entry = {"description": baseline.description}
        if baseline.module:
            why = missing(name)
            entry["status"] = NOT_INSTALLED if why else "installed"
            if why:
                entry["why"] = why
            else:
                try:
                    entry["version"] = metadata.version(baseline.package)
                except metadata.PackageNotFoundError:
                    entry["version"] = None
                if name == "CUDNN-FP8":
                    import cudnn
                    try:
                        entry["cudnn_backend"] = cudnn.backend_version_string()
                    except Exception as err:  # noqa: BLE001
                        entry["cudnn_backend"] = f"unknown ({err})"
        out[name] = entry
    return out


# ---------------------------------------------------------------------------------------------
# layout adapters (FA4 takes (batch, seqlen, heads, headdim))


def to_bnhd(t: torch.Tensor) -> torch.Tensor:
    """(B, H, N, D) -> (B, N, H, D), a contiguous copy: FA4's own layout, made before any timing."""
    return t.transpose(1, 2).contiguous()


def from_bnhd(t: torch.Tensor) -> torch.Tensor:
    """(B, N, H, D) -> (B, H, N, D), a view: FA4's outputs in the benchmark's layout."""
    return t.transpose(1, 2)


# ---------------------------------------------------------------------------------------------
# runners: one column's fwd, bwd and fwd+bwd on one set of inputs


class AutogradRunner:
    """fn(q, k, v) -> o through autograd, on leaves in fn's layout (`to_layout` of the benchmark's
    (B, H, N, D) tensors; `from_layout` takes its outputs back)."""

    def __init__(self, fn, q, k, v, do, to_layout=None, from_layout=None):
        self.fn = fn
        self._to = to_layout or (lambda t: t)
        self._from = from_layout or (lambda t: t)
        self.leaves = tuple(self._to(t.detach()).requires_grad_() for t in (q, k, v))
        self.do = self._to(do)

    def _call(self):
        return self.fn(*self.leaves)

    def forward(self):
        """Inference: what a forward alone costs."""
        with torch.no_grad():
            return self._call()

    def step(self):
        """One forward+backward."""
        self._call().backward(self.do)

    def backward_step(self):
        """A callable that runs the backward of one kept forward."""
        o = self._call()
        return lambda: o.backward(self.do, retain_graph=True)

    def peak_mib(self) -> float:
        """Memory allocated during one fwd+bwd above what was allocated before."""
        for t in self.leaves:
            t.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        self.step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20

    def outputs(self):
        """O, dQ, dK, dV in (B, H, N, D)."""
        o = self._call()
        grads = torch.autograd.grad(o, self.leaves, self.do)
        return [self._from(t) for t in (o, *grads)]


def fa4_runner(q, k, v, do, causal: bool) -> AutogradRunner:
    from flash_attn.cute import flash_attn_func

    def fn(q, k, v):
        out = flash_attn_func(q, k, v, causal=causal)   # returns (out, lse)
        return out[0] if isinstance(out, tuple) else out
    return AutogradRunner(fn, q, k, v, do, to_layout=to_bnhd, from_layout=from_bnhd)


FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def fp8_scale(amax: float) -> float:
    """Per-tensor FP8 scale: the largest power of two s with amax * s <= 448 (e4m3's largest value),
    so that x * s is cast without overflow and the descale 1/s is exact. NVIDIA's samples also use
    a power of two, with a further factor 2-4 of headroom for the next step's amax; here the amax
    is of the very tensor being cast. 1 for an amax of 0 or one that is not finite."""
    if not math.isfinite(amax) or amax <= 0:
        return 1.0
    return 2.0 ** math.floor(math.log2(FP8_MAX / amax))


def quantize_fp8(t: torch.Tensor):
    """(t * s in float8_e4m3fn, s, amax) with s = fp8_scale(amax of t)."""
    amax = float(t.detach().abs().max())
    scale = fp8_scale(amax)
    return (t.detach().float() * scale).to(FP8), scale, amax


def backward_amax_bounds(shape, amax_q: float, amax_k: float, amax_v: float, amax_do: float) -> dict:
    """Bounds on |O|, |dP|, |dQ|, |dK|, |dV| from the inputs' amaxes (P rows sum to 1, columns to
    at most N; |dS| <= P |dP - delta| <= 2 P max|dP|): the scales of the calibration run, which
    then cannot overflow; the timed runs use the amaxes that run reports. The "dp" bound is
    2 max|dP|, which also bounds dS, should cuDNN's dP scale be the one it casts dS with."""
    _, _, n, d = shape
    attn_scale = 1.0 / math.sqrt(d)
    dp = d * amax_do * amax_v
    return {"o": amax_v, "dp": 2 * dp, "dq": attn_scale * 2 * dp * amax_k, "dk": attn_scale * 2 * dp * amax_q * n,
            "dv": n * amax_do}


class _Uid(enum.IntEnum):
    """Tensor uids of the FP8 graphs (the forward and backward graphs are separate)."""
    Q = 1
    K = 2
    V = 3
    O = 4  # noqa: E741
    STATS = 5
    DO = 6
    DQ = 7
    DK = 8
    DV = 9
    DESCALE_Q = 10
    DESCALE_K = 11
    DESCALE_V = 12
    DESCALE_O = 13
    DESCALE_DO = 14
    DESCALE_S = 15
    DESCALE_DP = 16
    SCALE_S = 17
    SCALE_O = 18
    SCALE_DQ = 19
    SCALE_DK = 20
    SCALE_DV = 21
    SCALE_DP = 22
    AMAX_O = 23
    AMAX_DQ = 24
    AMAX_DK = 25
    AMAX_DV = 26
    AMAX_DP = 27


_FWD_UIDS = (_Uid.Q, _Uid.K, _Uid.V, _Uid.DESCALE_Q, _Uid.DESCALE_K, _Uid.DESCALE_V, _Uid.DESCALE_S,
             _Uid.SCALE_S, _Uid.SCALE_O, _Uid.O, _Uid.AMAX_O)
_BWD_UIDS = (_Uid.Q, _Uid.K, _Uid.V, _Uid.O, _Uid.DO, _Uid.STATS, _Uid.DESCALE_Q, _Uid.DESCALE_K,
             _Uid.DESCALE_V, _Uid.DESCALE_O, _Uid.DESCALE_DO, _Uid.DESCALE_S, _Uid.DESCALE_DP, _Uid.SCALE_S,
             _Uid.SCALE_DQ, _Uid.SCALE_DK, _Uid.SCALE_DV, _Uid.SCALE_DP, _Uid.DQ, _Uid.DK, _Uid.DV,
             _Uid.AMAX_DQ, _Uid.AMAX_DK, _Uid.AMAX_DV, _Uid.AMAX_DP)
# P = softmax(S) <= 1: its scale is fixed (the cuDNN docs: leave Amax_S virtual, take the bound)
S_AMAX = 1.0
_HANDLE = {}


class CudnnFp8Runner:
    """cuDNN FP8 attention on the benchmark's bf16 (B, H, N, D) inputs, in that layout.

    Q, K, V and dO are cast to e4m3 with per-tensor scales (`quantize_fp8`) here, outside any
    timing; O and the gradients come out in e4m3 with the scales of their own amaxes, set the way
    Transformer Engine's delayed scaling does: one calibration run with safe scales
    (`backward_amax_bounds`) reports the amaxes of O, dP, dQ, dK, dV, from which the scales of
    every later run follow. training=False builds the forward without softmax stats (the "fwd"
    column: inference); training=True the forward with stats and the backward.
    """
    leaves = ()

    def __init__(self, q, k, v, do, causal: bool, training: bool = True):
        import cudnn
        self.cudnn = cudnn
        self.shape = tuple(q.shape)
        b, h, n, d = self.shape
        self.causal, self.training = causal, training
        self.attn_scale = 1.0 / math.sqrt(d)
        dev = self.device = q.device
        key = (cudnn, str(dev))
        if key not in _HANDLE:
            _HANDLE[key] = cudnn.create_handle()
        self.handle = _HANDLE[key]
        if dev.type == "cuda":   # the handle runs on the stream do_bench times
            cudnn.set_stream(self.handle, torch.cuda.current_stream(dev).cuda_stream)
        self.notes, self.engines = [], []
        self.amax = {}
        t = self.t = {}

        def scalar(value=float("nan")):
            return torch.full((1, 1, 1, 1), value, dtype=torch.float32, device=dev)

        for uid, descale, name, x in ((_Uid.Q, _Uid.DESCALE_Q, "q", q), (_Uid.K, _Uid.DESCALE_K, "k", k),
                                      (_Uid.V, _Uid.DESCALE_V, "v", v), (_Uid.DO, _Uid.DESCALE_DO, "do", do)):
            t[uid], scale, self.amax[name] = quantize_fp8(x)
            t[descale] = scalar(1.0 / scale)
        s_scale = fp8_scale(S_AMAX)
        t[_Uid.SCALE_S], t[_Uid.DESCALE_S] = scalar(s_scale), scalar(1.0 / s_scale)
        for uid in (_Uid.SCALE_O, _Uid.DESCALE_O, _Uid.SCALE_DQ, _Uid.SCALE_DK, _Uid.SCALE_DV, _Uid.SCALE_DP,
                    _Uid.DESCALE_DP, _Uid.AMAX_O, _Uid.AMAX_DQ, _Uid.AMAX_DK, _Uid.AMAX_DV, _Uid.AMAX_DP):
            t[uid] = scalar()
        for uid in (_Uid.O, _Uid.DQ, _Uid.DK, _Uid.DV):
            t[uid] = torch.empty(self.shape, dtype=FP8, device=dev)
        t[_Uid.STATS] = torch.empty((b, h, n, 1), dtype=torch.float32, device=dev)
        self.bounds = backward_amax_bounds(self.shape, self.amax["q"], self.amax["k"], self.amax["v"],
                                           self.amax["do"])
        self.fwd, self.fwd_ws = self._build(self._forward_graph(stats=training))
        self.fwd_pack = {int(u): t[u] for u in _FWD_UIDS + ((_Uid.STATS,) if training else ())}
        self._calibrate(self._run_fwd, (("o", _Uid.AMAX_O, _Uid.SCALE_O, _Uid.DESCALE_O),))
        if training:
            self.bwd, self.bwd_ws = self._build(self._backward_graph())
            self.bwd_pack = {int(u): t[u] for u in _BWD_UIDS}
            self._calibrate(self._run_bwd, (("dq", _Uid.AMAX_DQ, _Uid.SCALE_DQ, None),
                                            ("dk", _Uid.AMAX_DK, _Uid.SCALE_DK, None),
                                            ("dv", _Uid.AMAX_DV, _Uid.SCALE_DV, None),
                                            ("dp", _Uid.AMAX_DP, _Uid.SCALE_DP, _Uid.DESCALE_DP)))

    # -- graphs -------------------------------------------------------------------------------

    def _graph(self):
        dt = self.cudnn.data_type
        return self.cudnn.pygraph(io_data_type=dt.FP8_E4M3, intermediate_data_type=dt.FLOAT,
                                  compute_data_type=dt.FLOAT)

    def _tensors(self, g):
        """(bhsd(uid, dtype), scalar(uid)): graph tensors in the inputs' (B, H, N, D) layout."""
        dt = self.cudnn.data_type
        b, h, n, d = self.shape
        stride = (h * n * d, n * d, d, 1)

        def bhsd(uid, data_type=dt.FP8_E4M3):
            return g.tensor(uid=int(uid), dim=self.shape, stride=stride, data_type=data_type)

        def scalar(uid):
            return g.tensor(uid=int(uid), dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=dt.FLOAT)
        return bhsd, scalar, stride

    def _mask(self) -> dict:
        # causal, top-left aligned (N_q == N_kv): keys j <= i, the frontend's preferred form
        return {"diagonal_alignment": self.cudnn.diagonal_alignment.TOP_LEFT, "right_bound": 0} if self.causal else {}

    def _output(self, tensor, uid, dim, stride, data_type):
        tensor.set_uid(int(uid)).set_output(True).set_dim(dim).set_stride(stride).set_data_type(data_type)

    def _forward_graph(self, stats: bool):
        dt = self.cudnn.data_type
        b, h, n, d = self.shape
        g = self._graph()
        bhsd, scalar, stride = self._tensors(g)
        U = _Uid
        o, lse, _amax_s, amax_o = g.sdpa_fp8(
            q=bhsd(U.Q), k=bhsd(U.K), v=bhsd(U.V), descale_q=scalar(U.DESCALE_Q), descale_k=scalar(U.DESCALE_K),
            descale_v=scalar(U.DESCALE_V), descale_s=scalar(U.DESCALE_S), scale_s=scalar(U.SCALE_S),
            scale_o=scalar(U.SCALE_O), generate_stats=stats, attn_scale=self.attn_scale, **self._mask())
        self._output(o, U.O, self.shape, stride, dt.FP8_E4M3)
        if stats:
            self._output(lse, U.STATS, (b, h, n, 1), (h * n, n, 1, 1), dt.FLOAT)
        self._output(amax_o, U.AMAX_O, (1, 1, 1, 1), (1, 1, 1, 1), dt.FLOAT)
        return g

    def _backward_graph(self):
        dt = self.cudnn.data_type
        b, h, n, d = self.shape
        g = self._graph()
        bhsd, scalar, stride = self._tensors(g)
        U = _Uid
        stats = g.tensor(uid=int(U.STATS), dim=(b, h, n, 1), stride=(h * n, n, 1, 1), data_type=dt.FLOAT)
        dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp = g.sdpa_fp8_backward(
            q=bhsd(U.Q), k=bhsd(U.K), v=bhsd(U.V), o=bhsd(U.O), dO=bhsd(U.DO), stats=stats,
            descale_q=scalar(U.DESCALE_Q), descale_k=scalar(U.DESCALE_K), descale_v=scalar(U.DESCALE_V),
            descale_o=scalar(U.DESCALE_O), descale_dO=scalar(U.DESCALE_DO), descale_s=scalar(U.DESCALE_S),
            descale_dP=scalar(U.DESCALE_DP), scale_s=scalar(U.SCALE_S), scale_dQ=scalar(U.SCALE_DQ),
            scale_dK=scalar(U.SCALE_DK), scale_dV=scalar(U.SCALE_DV), scale_dP=scalar(U.SCALE_DP),
            attn_scale=self.attn_scale, use_padding_mask=False, **self._mask())
        for tensor, uid in ((dq, U.DQ), (dk, U.DK), (dv, U.DV)):
            self._output(tensor, uid, self.shape, stride, dt.FP8_E4M3)
        for tensor, uid in ((amax_dq, U.AMAX_DQ), (amax_dk, U.AMAX_DK), (amax_dv, U.AMAX_DV), (amax_dp, U.AMAX_DP)):
            self._output(tensor, uid, (1, 1, 1, 1), (1, 1, 1, 1), dt.FLOAT)
        return g

    def _build(self, g):
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([self.cudnn.heur_mode.A, self.cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        try:   # which engine serves it (the backend's plan name, or a python engine's), for the JSON
            self.engines.append(g.get_plan_name_at_index(getattr(g, "_plan_index", 0)))
        except Exception as err:  # noqa: BLE001
            self.engines.append(f"unknown ({type(err).__name__})")
        workspace = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=self.device)
        return g, workspace

    # -- scales -------------------------------------------------------------------------------

    def _set_scale(self, scale_uid, descale_uid, amax: float):
        s = fp8_scale(amax)
        self.t[scale_uid].fill_(s)
        if descale_uid is not None:
            self.t[descale_uid].fill_(1.0 / s)

    def _calibrate(self, run, entries):
        """One run at the bounds' scales, then every scale from the amax that run reported."""
        for name, _, scale_uid, descale_uid in entries:
            self._set_scale(scale_uid, descale_uid, self.bounds[name])
        run()
        self._sync()
        for name, amax_uid, scale_uid, descale_uid in entries:
            amax = float(self.t[amax_uid].item())
            if math.isfinite(amax) and amax > 0:
                self.amax[name] = amax
                self._set_scale(scale_uid, descale_uid, amax)
            else:
                self.notes.append(f"amax of {name} read {amax}: kept the bound's scale")
        run()
        self._sync()

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- the timed calls ----------------------------------------------------------------------

    def _run_fwd(self):
        self.fwd.execute(self.fwd_pack, self.fwd_ws, handle=self.handle)

    def _run_bwd(self):
        self.bwd.execute(self.bwd_pack, self.bwd_ws, handle=self.handle)

    def forward(self):
        self._run_fwd()

    def step(self):
        self._run_fwd()
        self._run_bwd()

    def backward_step(self):
        self._run_fwd()
        return self._run_bwd

    def peak_mib(self) -> float:
        """What the graphs write besides their inputs: O, stats, dQ, dK, dV and the workspaces
        (allocated once, here, so a run allocates nothing to measure)."""
        t = self.t
        held = [t[_Uid.O], t[_Uid.STATS], t[_Uid.DQ], t[_Uid.DK], t[_Uid.DV], self.fwd_ws]
        if self.training:
            held.append(self.bwd_ws)
        return sum(x.numel() * x.element_size() for x in held) / 2**20

    def info(self) -> dict:
        """For the JSON: the engines that serve the graphs, the amaxes the scales come from, notes."""
        return {"engines": self.engines, "amax": dict(self.amax), **({"notes": self.notes} if self.notes else {})}

    def descale(self, uid) -> float:
        return 1.0 / float(self.t[{_Uid.O: _Uid.SCALE_O, _Uid.DQ: _Uid.SCALE_DQ, _Uid.DK: _Uid.SCALE_DK,
                                   _Uid.DV: _Uid.SCALE_DV}[uid]].item())

    def outputs(self):
        """O, dQ, dK, dV dequantised to float32, (B, H, N, D); also records, per output, the amax the
        graph reported next to the largest dequantised value (they should agree within e4m3's
        rounding: a factor apart would mean the amaxes are not what the scales assume)."""
        self.step()
        self._sync()
        outs = []
        self.amax_check = {}
        for name, uid in (("o", _Uid.O), ("dq", _Uid.DQ), ("dk", _Uid.DK), ("dv", _Uid.DV)):
            x = self.t[uid].float() * self.descale(uid)
            self.amax_check[name] = {"graph": self.amax.get(name), "dequantised": float(x.abs().max())}
            outs.append(x)
        return outs


def make_runner(name: str, q, k, v, do, causal: bool, mode: str = "fwd+bwd"):
    """The runner of an optional column (FA4, CUDNN-FP8) on these (B, H, N, D) bf16 inputs."""
    if name == "FA4":
        return fa4_runner(q, k, v, do, causal)
    if name == "CUDNN-FP8":
        return CudnnFp8Runner(q, k, v, do, causal, training=mode != "fwd")
    raise ValueError(f"{name!r} is not an optional column ({', '.join(OPTIONAL)})")
