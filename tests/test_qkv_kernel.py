"""model/qkv.py's fused split + QK-norm + RoPE kernels against the plain torch formula (model/layers.py).

The kernels run in Triton's CPU interpreter in one subprocess (this file run as a script; TRITON_INTERPRET=1
must be set before Triton is first imported), which prints one JSON line per case; the last test runs the same
comparison on a GPU at the trainer's size (skipped without one). `python -m benchmarks.qkv` times them.

What must hold (_check): RoPE alone is the plain formula bit for bit (the same products and sums, rounded singly).
With the norm the sum of squares is added in another order (and on a GPU torch's rsqrt is not correctly rounded),
so rare outputs differ in the last bit, and after RoPE's cancellations by more than one unit of a small output:
each result's error against the formula in fp64 must then be within 5% of the plain formula's own.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model.config import ModelConfig
from model.qkv import qkv_norm_rope

REPO = Path(__file__).resolve().parents[1]
EPS = 1e-6


def _plain(qkv, heads, q_weight, k_weight, rope, positions):
    """The reference: the plain formula (model.qkv.plain_qkv), the model's own RMSNorm holding the weights."""
    from model.layers import RMSNorm
    from model.qkv import plain_qkv
    norms = [None, None]
    if q_weight is not None:
        norms = [RMSNorm(qkv.shape[-1] // 3 // heads, EPS) for _ in range(2)]
        norms[0].weight, norms[1].weight = q_weight, k_weight
    return plain_qkv(qkv, heads, *norms, rope, positions)


def _reference(qkv, heads, q_weight, k_weight, cos, sin, grads):
    """The formula in fp64 without intermediate rounding, and its gradients: what both impls approximate."""
    batch, seq, width = qkv.shape
    head_dim = width // 3 // heads
    x = qkv.detach().double().requires_grad_(True)
    ws = [w.detach().double().requires_grad_(True) for w in (q_weight, k_weight)] if q_weight is not None else []
    c, s = cos.double()[:, None], sin.double()[:, None]   # (seq, 1, head_dim/2) against (batch, seq, heads, .)
    outs = []
    for i, t in enumerate(x.split(width // 3, dim=-1)):
        t = t.view(batch, seq, heads, head_dim)
        if i < 2:
            if ws:
                t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + EPS) * ws[i]
            t1, t2 = t.chunk(2, dim=-1)
            t = torch.cat((t1 * c - t2 * s, t2 * c + t1 * s), dim=-1)
        outs.append(t.transpose(1, 2))
    torch.autograd.backward(outs, [g.double() for g in grads])
    return outs + [x.grad] + [w.grad for w in ws]


def _compare(qkv, heads, weights, rope, positions, grads, reruns: int = 1) -> dict:
    """plain and fused (run `reruns` times) on the same inputs, against each other and against the fp64 reference:
    q, k, v, the projection's gradient and, with the norm, the weights' gradients."""
    seq = qkv.shape[1]
    norm = weights[0] is not None
    runs = []
    for impl in ["plain"] + ["fused"] * reruns:
        x = qkv.detach().clone().requires_grad_(True)
        ws = [torch.nn.Parameter(w.clone()) if w is not None else None for w in weights]
        if impl == "plain":
            outs = _plain(x, heads, ws[0], ws[1], rope, positions)
        else:
            outs = qkv_norm_rope(x, heads, ws[0], ws[1], *rope.tables(seq, positions), EPS)
        torch.autograd.backward(outs, grads)
        runs.append([t.detach() for t in outs] + [x.grad] + ([w.grad for w in ws] if norm else []))
    ref = _reference(qkv, heads, weights[0], weights[1], *rope.tables(seq, positions), grads)
    names = ["q", "k", "v", "dqkv"] + (["dq_weight", "dk_weight"] if norm else [])

    def err(a, b):
        return float((a.double() - b.detach()).norm() / b.detach().norm())
    plain, fused = runs[0], runs[1]
    return {"norm": norm,
            "equal": {n: bool(torch.equal(a, b)) for n, a, b in zip(names, fused, plain)},
            "reruns_equal": all(torch.equal(a, b) for again in runs[2:] for a, b in zip(fused, again)),
            "err_plain": {n: err(a, r) for n, a, r in zip(names, plain, ref)},
            "err_fused": {n: err(a, r) for n, a, r in zip(names, fused, ref)},
            "q_dense_bnhd": fused[0].transpose(1, 2).is_contiguous()}


def _check(r: dict) -> None:
    """RoPE alone: bit for bit. With the norm: v copied, and each output's and gradient's error against the fp64
    reference within 5% of the plain formula's own (bf16 or fp16 rounding; the two differ in rare last bits)."""
    assert r["equal"]["v"], "v must be a copy"
    assert r["q_dense_bnhd"], "q must be dense as (batch, seq, heads, head_dim), as the plain path's views are"
    if not r["norm"]:   # the same products and sums, rounded singly: bit for bit, forward and backward
        assert all(r["equal"].values()), r
        return
    for name, plain in r["err_plain"].items():
        assert r["err_fused"][name] <= 1.05 * plain + 1e-6, (name, r)


def _formula_case(dtype_name: str, norm: bool, seq: int, positions: bool, strided: bool,
                  grads_layout: str, block_tokens: int = 64) -> dict:
    """Values and gradients of the kernels against the plain formula. seq not a multiple of the kernels' 64-row
    tiles; strided: qkv a slice of a wider projection output; grads_layout: dq, dk, dv dense as (batch, heads,
    seq, dim) ("bhnd") or as (batch, seq, heads, dim) views ("bnhd"); block_tokens: the launch's tokens a program."""
    from model import qkv as mq
    from model.layers import RotaryEmbedding

    mq.LAUNCH = mq.Launch(block_tokens=block_tokens)

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(3)
    batch, heads, head_dim = 2, 3, 64
    width = 3 * heads * head_dim
    wide = (torch.randn(batch, seq, width + (64 if strided else 0), generator=gen) * 2).to(dtype)
    rope = RotaryEmbedding(head_dim, 512, 10000.0)
    weights = [(1 + 0.3 * torch.randn(head_dim, generator=gen)).to(dtype) for _ in range(2)] if norm else [None] * 2
    grads = [torch.randn(batch, heads, seq, head_dim, generator=gen).to(dtype) for _ in range(3)]
    if grads_layout == "bnhd":
        grads = [g.transpose(1, 2).contiguous().transpose(1, 2) for g in grads]
    r = _compare(wide[..., :width], heads, weights, rope, torch.arange(100, 100 + seq) if positions else None, grads)
    mq.LAUNCH = mq.Launch()
    return {"name": _case_name(dtype_name, norm, seq, positions, strided, grads_layout, block_tokens), **r}


def _case_name(dtype_name, norm, seq, positions, strided, grads_layout, block_tokens=64) -> str:
    return (f"formula-{dtype_name}-{'norm' if norm else 'rope'}-{seq}-{grads_layout}" + ("-positions" if positions
            else "") + ("-strided" if strided else "") + (f"-block{block_tokens}" if block_tokens != 64 else ""))


def _model_case() -> dict:
    """A tiny Llama with QK-norm, model.qkv_impl fused against plain (the same weights): loss and gradients."""
    from model.llama import Llama

    losses, grads = {}, {}
    for impl in ("plain", "fused"):
        torch.manual_seed(0)
        model = Llama(ModelConfig(preset="micro", qk_norm=True, qkv_impl=impl)).to(torch.bfloat16)
        tokens = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1))
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.roll(-1, 1).flatten())
        loss.backward()
        losses[impl] = float(loss)
        grads[impl] = {n: p.grad.float() for n, p in model.named_parameters()}
    worst = max(float((grads["fused"][n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in grads["plain"].items())
    return {"name": "model", "losses": losses, "worst_grad_rel": worst,
            "norm_weight_grads": all(grads["fused"][n].abs().sum() > 0 for n in grads["fused"] if "q_norm" in n)}


def _compile_case() -> dict:
    """fullgraph torch.compile over the op (aot_eager: tracing and the autograd formula, no codegen) against the
    eager path (a plain autograd.Function over the same functions), with and without the norm: the same bits."""
    from model.layers import RotaryEmbedding

    rope = RotaryEmbedding(64, 128, 10000.0)
    w = [torch.nn.Parameter(torch.ones(64) + 0.1 * torch.randn(64)) for _ in range(2)]
    equal, eager_nodes = [], set()
    for norm in (True, False):
        def layer(qkv):
            q, k, v = qkv_norm_rope(qkv * 1.0, 2, w[0] if norm else None, w[1] if norm else None,
                                    *rope.tables(64), EPS if norm else 0.0)
            if not torch.compiler.is_compiling():   # the node under q's transpose: which autograd path ran
                eager_nodes.add(type(q.grad_fn.next_functions[0][0]).__name__)
            return (q * k).sum() + v.sum()

        qkv = torch.randn(1, 64, 3 * 2 * 64).to(torch.bfloat16).requires_grad_(True)
        inputs = (qkv, *w) if norm else (qkv,)
        eager = torch.autograd.grad(layer(qkv), inputs)
        compiled = torch.autograd.grad(torch.compile(layer, backend="aot_eager", fullgraph=True)(qkv), inputs)
        equal.append(all(bool(torch.equal(a, b)) for a, b in zip(eager, compiled)))
    return {"name": "compile", "equal": all(equal), "eager_nodes": sorted(eager_nodes)}


def _opcheck_case() -> dict:
    """torch.library.opcheck: the fake (meta) implementations, the schema and the autograd registration."""
    from model import qkv as mq
    from model.layers import RotaryEmbedding

    rope = RotaryEmbedding(64, 128, 10000.0)
    qkv = torch.randn(1, 64, 3 * 2 * 64).to(torch.bfloat16).requires_grad_(True)
    w = [torch.ones(64, requires_grad=True) for _ in range(2)]
    failures = {}
    for name, args in (("norm", (qkv, w[0], w[1], *rope.tables(64), 2, EPS)),
                       ("rope", (qkv, None, None, *rope.tables(64), 2, 0.0))):
        report = torch.library.opcheck(mq._forward_op, args)
        failures[name] = [k for k, v in report.items() if v != "SUCCESS"]
    return {"name": "opcheck", "failures": failures}


FORMULA_CASES = [("bfloat16", True, 130, True, False, "bnhd"), ("bfloat16", False, 130, False, True, "bhnd"),
                 ("float16", True, 64, False, True, "bhnd"), ("float16", False, 96, True, False, "bnhd"),
                 ("bfloat16", True, 130, False, False, "bhnd", 32), ("bfloat16", False, 100, True, True, "bnhd", 128),
                 ("float32", True, 64, True, False, "bhnd")]


@pytest.fixture(scope="module")
def results() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {r["name"]: r for r in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}


@pytest.mark.parametrize("case", FORMULA_CASES, ids=lambda c: "-".join(map(str, c)))
def test_kernels_are_the_plain_formula(results, case):
    r = results[_case_name(*case)]
    _check(r)


def test_the_model_trains_the_same_with_either_impl(results):
    r = results["model"]
    assert abs(r["losses"]["fused"] - r["losses"]["plain"]) <= 1e-3 * abs(r["losses"]["plain"]), r
    assert r["worst_grad_rel"] < 2e-2, r   # bf16 weights: one output ulp moves later layers' gradients this much
    assert r["norm_weight_grads"], r


def test_compiles_fullgraph(results):
    assert results["compile"]["equal"]


def test_eager_calls_skip_the_custom_ops_dispatch(results):
    """Uncompiled, qkv_norm_rope runs a plain autograd.Function over the op's functions, without the op's dispatch
    (docs/measurements/qkv-host-eager.py), and gives the same bits as the compiled op (test_compiles_fullgraph)."""
    assert results["compile"]["eager_nodes"] == ["_EagerQkvBackward"], results["compile"]


def test_opcheck(results):
    assert results["opcheck"]["failures"] == {"norm": [], "rope": []}


def test_bad_inputs_are_named(monkeypatch):
    from model import qkv as mq
    from model.layers import RotaryEmbedding
    rope = RotaryEmbedding(64, 128, 10000.0)
    qkv = torch.randn(1, 64, 3 * 2 * 64)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        qkv_norm_rope(qkv, 2, None, None, *rope.tables(64), EPS)
    monkeypatch.setattr(mq, "runs_kernel", lambda t: True)   # the checks below come before any launch
    with pytest.raises(ValueError, match="power-of-two head dim"):
        qkv_norm_rope(torch.randn(1, 64, 3 * 2 * 48), 2, None, None, *RotaryEmbedding(48, 64, 1e4).tables(64), EPS)
    with pytest.raises(ValueError, match="both q_weight and k_weight"):
        qkv_norm_rope(qkv, 2, torch.ones(64), None, *rope.tables(64), EPS)
    with pytest.raises(ValueError, match=r"3 \* heads \* head_dim"):
        qkv_norm_rope(qkv[..., :-1], 2, None, None, *rope.tables(64), EPS)
    with pytest.raises(ValueError, match="cos must be a contiguous floating"):
        qkv_norm_rope(qkv, 2, None, None, *rope.tables(32), EPS)
    with pytest.raises(ValueError, match="power-of-two head dim"):
        ModelConfig(preset="tiny", hidden_size=96, num_heads=2, qkv_impl="fused")
    with pytest.raises(ValueError, match=r"(?s)qkv_impl.*'plain' or 'fused'"):
        ModelConfig(preset="tiny", qkv_impl="triton")


def test_fused_runs_the_plain_formula_on_cpu():
    """Without CUDA (and outside the interpreter) model.qkv_impl=fused computes what plain does, bit for bit."""
    from model.llama import Llama
    assert os.environ.get("TRITON_INTERPRET", "0") != "1"
    tokens = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1))
    logits = {}
    for impl in ("plain", "fused"):
        torch.manual_seed(0)
        logits[impl] = Llama(ModelConfig(preset="micro", qk_norm=True, qkv_impl=impl))(tokens)
    assert torch.equal(logits["plain"], logits["fused"])


def test_benchmark_needs_a_gpu_and_counts_the_bytes(capsys):
    from benchmarks import qkv as bench
    unit = 4 * 12 * 4096 * 64 * 2
    assert bench.pass_bytes((4, 12, 4096, 64), True, True, fused=True) == 14 * unit
    assert bench.pass_bytes((4, 12, 4096, 64), True, False, fused=False) == 4 * unit
    assert bench.pass_bytes((4, 12, 4096, 64), False, True, fused=False) == 10 * unit
    if not torch.cuda.is_available():
        assert bench.main(["--shapes", "1,2,128,64"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--launches", "64x3"])
    assert "tokens a power of two, warps 1, 2, 4, 8 or 16" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("norm", [True, False], ids=["norm", "rope"])
def test_gpu_kernels_are_the_plain_formula_at_the_trainers_size(norm):
    """(4, 4096, 12 heads, 64) bf16 with positions: the GPU's kernels against the plain formula run eagerly, as the
    interpreter cases above, and the same bits when run again (the weights' partial sums in a fixed order)."""
    from model.layers import RotaryEmbedding

    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, seq, heads, head_dim = 4, 4096, 12, 64
    qkv = (torch.randn(batch, seq, 3 * heads * head_dim, device="cuda", generator=gen) * 2).bfloat16()
    rope = RotaryEmbedding(head_dim, 2 * seq, 10000.0).cuda()
    pos = torch.arange(seq, 2 * seq, device="cuda")
    weights = [(1 + 0.3 * torch.randn(head_dim, device="cuda", generator=gen)).bfloat16() for _ in range(2)]
    grads = [torch.randn(batch, heads, seq, head_dim, device="cuda", generator=gen).bfloat16() for _ in range(3)]
    r = _compare(qkv, heads, weights if norm else [None, None], rope, pos, grads, reruns=2)
    assert r["reruns_equal"], "a rerun changed a bit"
    _check(r)


if __name__ == "__main__":
    for case in FORMULA_CASES:
        print(json.dumps(_formula_case(*case)), flush=True)
    print(json.dumps(_model_case()), flush=True)
    print(json.dumps(_compile_case()), flush=True)
    print(json.dumps(_opcheck_case()), flush=True)
