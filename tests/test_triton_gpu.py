"""The Triton kernels on a CUDA GPU: vs the simulation, all outputs written, deterministic, compiled.

Skipped without CUDA (CI). Sizes are real but small enough for the simulation's N x N tensors;
``python -m benchmarks.attention --check`` runs the larger set and prints the numbers; both take
their reference checks from tests/kernel_checks.py. Kernel choices are sagebwd.triton.registry's.
"""
from __future__ import annotations

import pytest
import torch
from kernel_checks import captured, check_case, graph_and_compiled

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOLERANCE = {torch.bfloat16: 5e-3, torch.float16: 2e-3}


@pytest.mark.parametrize("quant", ["block", "token"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal,smooth_q", [(False, False), (True, False), (True, True)])
def test_matches_simulation(dtype, head_dim, causal, smooth_q, quant):
    r = check_case((1, 4, 2048, head_dim), dtype, causal, smooth_q, reruns=5, quant=quant)
    assert r["all_written"], "an output element was left unwritten (NaN from the poisoned allocator)"
    assert r["identical_over_5_reruns"], "reruns differ: a race"
    for name, err in r["rel_l2_vs_sim"].items():
        assert err <= TOLERANCE[dtype], f"{name}: kernel vs simulation {err:.2e}"


@pytest.mark.parametrize("shape", [(4, 12, 4096, 64), (1, 3, 16384 + 64, 128)])
def test_sequence_mean_kernel_matches_torch(shape):
    """The K-smoothing mean on a GPU (quantize.sequence_mean: a split reduction whose last program adds
    the partial sums in a fixed order) against PyTorch's mean, in the model's layout; the same bits over
    reruns."""
    from sagebwd.triton import quantize

    gen = torch.Generator(device="cuda").manual_seed(1)
    b, h, n, d = shape
    k = (torch.randn(b, n, h, d, device="cuda", generator=gen) * 2 + 3).bfloat16().transpose(1, 2)
    mean = quantize.sequence_mean(k)
    torch.testing.assert_close(mean, k.mean(dim=2, dtype=torch.float32).reshape(b * h, d), rtol=2e-6, atol=1e-6)
    assert all(torch.equal(mean, quantize.sequence_mean(k)) for _ in range(5)), "reruns differ: a race"


@pytest.mark.parametrize("shape,token", [((4, 12, 4096, 64), True), ((8, 16, 4096, 64), False),
                                         ((1, 3, 16384, 128), True), ((2, 8, 4096, 128), False)])
@pytest.mark.parametrize("lag", [0, None])
def test_k_mean_in_the_quantise_launch(shape, token, lag):
    """K's mean taken inside the quantise launch (quantize._quantize_qkv_with_mean: programs take tickets and K's
    tiles wait for their head's mean): the mean is PyTorch's to fp32 rounding, Q^, K^, V^ and their scales are
    quantize_qkv's with that mean bit for bit, and reruns give the same bits (a K tile that read its mean early
    would differ), in the model's layout, with K tiles right after their head's mean (lag 0) or the default lag."""
    from sagebwd.triton import quantize

    gen = torch.Generator(device="cuda").manual_seed(2)
    b, h, n, d = shape
    q, k, v = [(torch.randn(b, n, h, d, device="cuda", generator=gen) * 2 + 3).bfloat16().transpose(1, 2)
               for _ in range(3)]
    quantize_q = not token   # the token forward quantises Q itself
    out = quantize._quantize_qkv_with_mean(q, k, v, 128, 64, smooth_q=False, cols=True, token=token,
                                           quantize_q=quantize_q, lag=lag)
    torch.testing.assert_close(out[9], k.mean(dim=2, dtype=torch.float32).reshape(b * h, d), rtol=2e-6, atol=1e-6)
    ref = quantize.quantize_qkv(q, k, v, 128, 64, k_mean=out[9], smooth_q=False, cols=True, token=token,
                                quantize_q=quantize_q)
    written = range(9) if quantize_q else (4, 5, 6, 7, 8)
    for i in written:
        if ref[i] is not None:
            assert torch.equal(out[i], ref[i]), f"output {i} differs from quantize_qkv's with the same mean"
    for _ in range(3):
        again = quantize._quantize_qkv_with_mean(q, k, v, 128, 64, smooth_q=False, cols=True, token=token,
                                                 quantize_q=quantize_q, lag=lag)
        assert all(torch.equal(out[i], again[i]) for i in (*written, 9) if out[i] is not None), "reruns differ: a race"


@pytest.mark.parametrize("quant", ["token", "block"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_forward_as_a_programmatic_dependent_changes_no_bit(quant, head_dim):
    """The forward kernel launched as a programmatic dependent of the quantise launch (the token contract's default
    on Hopper, launch.forward_pdl; the Tuning override "pdl" for the block contract): the same O, LSE and quantised
    operands as launched plainly, eagerly and replayed from a CUDA graph."""
    from sagebwd.triton import ops
    from sagebwd.triton.launch import Tuning

    gen = torch.Generator(device="cuda").manual_seed(4)
    qkv = (torch.randn(2, 4096, 3, 8, head_dim, device="cuda", generator=gen) * 2 + 1).bfloat16()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    pdl = Tuning(overrides={"pdl": True})

    def run(tuning):
        return ops._forward_impl(q, k, v, True, True, False, 128, 64, quant == "token", True, "default", tuning)
    plain = run(Tuning(overrides={"pdl": False}))
    assert all(torch.equal(a, b) for a, b in zip(plain, run(pdl))), "the PDL launch changed an output"
    assert all(torch.equal(a, b) for a, b in zip(plain, run(None))), "the default launch changed an output"
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run(pdl)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(pdl)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(plain, captured)), "the PDL launch changed an output in a graph"


def test_compiled_model_matches_eager():
    from sagebwd.triton import attention

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 3 * 64, device="cuda", dtype=torch.bfloat16)

        def forward(self, x):   # x (B, N, 64) -> one head
            q, k, v = self.proj(x).unsqueeze(1).chunk(3, dim=-1)
            return attention(q, k, v, True, True, False, 128, 64).sum()

    model = Block()
    x = torch.randn(2, 512, 64, device="cuda", dtype=torch.bfloat16)
    eager = torch.autograd.grad(model(x), model.proj.weight)[0]
    compiled = torch.autograd.grad(torch.compile(model, fullgraph=True)(x), model.proj.weight)[0]
    assert torch.allclose(eager.float(), compiled.float(), rtol=1e-2, atol=1e-2)


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _model_layout(q, k, v, do):
    """q, k, v as views of a (B, N, 3, H, D) qkv projection, dO as a (B, N, H, D) gradient transposed."""
    b, h, n, d = v.shape
    qkv = torch.zeros(b, n, 3, h, d, device=v.device, dtype=v.dtype)
    for i, t in enumerate((q, k, v)):
        qkv[:, :, i] = t.transpose(1, 2)
    return (*qkv.permute(2, 0, 3, 1, 4), do.transpose(1, 2).contiguous().transpose(1, 2))


def _forward_backward(shape, causal, kernels, layout="contiguous", quant="block"):
    from sagebwd.triton import attention
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v, do = [torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4)]
    # q and k matter to the token contract's backward (dK's and dQ's 16-bit operands, read in place as v is)
    if layout == "misaligned":   # contiguous, but 2 bytes past a 16-byte boundary (TMA needs 16)
        q, k, v, do = [torch.cat([t.new_zeros(1), t.flatten()])[1:].view(shape) for t in (q, k, v, do)]
    elif layout == "ulysses":     # DeepSpeed's (seq, batch, heads, dim) permuted to (batch, heads, seq, dim)
        q, k, v, do = [t.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3) for t in (q, k, v, do)]
    elif layout == "model":       # q, k, v from the model's qkv projection, dO the transpose of the output's grad
        q, k, v, do = _model_layout(q, k, v, do)
    q, k, v = [t.requires_grad_() for t in (q, k, v)]
    o = attention(q, k, v, causal, quant=quant, kernels=kernels)
    return [o.detach(), *torch.autograd.grad(o, (q, k, v), do)]


TRITON = "triton"                                     # the Triton kernels everywhere (the reference)
GLUON_DKDV, GLUON_DQ = "triton,dkdv=gluon-ws", "triton,dq=gluon-ws"
DEFAULT = "default"                                   # Gluon dK/dV, and dQ at d=128 (registry)
GLUON_FORWARD = "triton,forward=gluon,dkdv=gluon-ws"  # the experimental Gluon forward
ALL = "default,forward=gluon,fused"                   # every Gluon kernel where it applies


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("shape", [(1, 4, 2048, 64), (2, 3, 384, 64), (1, 4, 1024, 128), (2, 3, 384, 128),
                                   (1, 2, 128, 128), (1, 2, 4224, 64), (1, 2, 4224, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_kernels_match_the_triton_kernels(shape, causal):
    """The Gluon kernels (registry choices) against the Triton ones on the same inputs. dK/dV does the same
    arithmetic in the same order (exact INT8 sums, chained in int32): bit-identical. The forward
    applies each tile's O update one iteration later: within an output rounding of it. dQ
    likewise (and the tile scales it writes for dK/dV): bit-identical.
    (384 rows: causal kv tiles that start in the middle of a q block, and an odd number of q
    blocks; 128 rows: one q block, whose only kv tiles are the diagonal ones; 4224 rows: 33 q
    blocks, one more than the Gluon dK/dV stages scales for at a time.)"""
    ref = _forward_backward(shape, causal, TRITON)
    for kernels in (GLUON_DKDV, GLUON_DQ, DEFAULT):
        got = _forward_backward(shape, causal, kernels)
        for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
            assert torch.equal(a, b), f"{name}: the Gluon {kernels} changed {int((a != b).sum())} elements"
    both = _forward_backward(shape, causal, GLUON_FORWARD)
    assert all(bool(torch.isfinite(t).all()) for t in both)
    assert all(torch.equal(a, b) for a, b in zip(both, _forward_backward(shape, causal, GLUON_FORWARD)))
    for name, a, b in zip(("o", "dq", "dk", "dv"), both, ref):
        err = float((a.double() - b.double()).norm() / b.double().norm())
        assert err <= 1e-3, f"{name}: Gluon forward vs Triton forward {err:.2e}"


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("shape", [(2, 3, 384, 64), (2, 3, 384, 128), (1, 2, 4224, 64), (1, 2, 4224, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_warp_specialised_kernels_match_their_references(shape, causal):
    """The warp-specialised Gluon dK/dV and dQ (the defaults) against the same Gluon kernels
    issuing their own loads, which stay the reference and the fallback: bit-identical."""
    got = _forward_backward(shape, causal, DEFAULT)
    ref = _forward_backward(shape, causal, "default,dkdv=gluon,dq=gluon")
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
        assert torch.equal(a, b), f"{name}: warp specialisation changed {int((a != b).sum())} elements"


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("layout", ["misaligned", "ulysses", "model"])
def test_gluon_backward_takes_any_layout_of_v_and_do(layout, head_dim):
    ref = _forward_backward((2, 3, 384, head_dim), True, TRITON)
    got = _forward_backward((2, 3, 384, head_dim), True, DEFAULT, layout)
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
        assert torch.equal(a, b), f"{name} differs with {layout} v/dO"


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_kernels_match_simulation(causal, head_dim):
    r = check_case((1, 4, 2048, head_dim), torch.bfloat16, causal, False, reruns=5, kernels=ALL)
    # every output bit-identical over the reruns, except dQ where the fused backward (its atomics) ran
    assert r["all_written"] and r["reproducible"]
    for name, err in r["rel_l2_vs_sim"].items():
        assert err <= TOLERANCE[torch.bfloat16], f"{name}: Gluon kernels vs simulation {err:.2e}"


def _assert_token_kernels_match_triton(shape, causal, choices):
    """Each kernel choice against the Triton token kernels on the same inputs: finite, within a rel.
    L2 of 1e-3 (checked first, so that a failure says how far apart), then bit-identical."""
    ref = _forward_backward(shape, causal, TRITON, quant="token")
    for kernels in choices:
        got = _forward_backward(shape, causal, kernels, quant="token")
        for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
            assert bool(torch.isfinite(a).all()), f"{name}: {kernels} left non-finite values"
            err = float((a.double() - b.double()).norm() / b.double().norm())
            assert err <= 1e-3, f"{name}: {kernels} vs the Triton token kernel {err:.2e}"
            assert torch.equal(a, b), (f"{name}: {kernels} changed {int((a != b).sum())} of {a.numel()} elements "
                                       f"(rel. L2 {err:.2e})")


TOKEN_GLUON_DKDV = ("triton,dkdv=gluon-ws", "triton,dkdv=gluon")   # the token contract's Gluon dK/dV (opt-in)


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("shape", [(1, 4, 2048, 64), (2, 3, 384, 64), (1, 4, 1024, 128), (2, 3, 384, 128),
                                   (1, 2, 128, 128), (1, 2, 4224, 64), (1, 2, 4224, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_token_gluon_dkdv_matches_the_triton_kernel(shape, causal):
    """The Gluon dK/dV with TOKEN (warp-specialised and not) against the Triton token kernel on the
    same inputs: backward.py's TOKEN arithmetic in its order (the same roundings; integer dots exact,
    a q block's two slices chained in int32), so dK and dV are expected bit-identical; O and dQ come
    from the same Triton kernels. The rel. L2 bound first, so that a failure says how far apart."""
    _assert_token_kernels_match_triton(shape, causal, TOKEN_GLUON_DKDV)


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("shape", [(1, 4, 1024, 128), (2, 3, 384, 128), (1, 2, 128, 128), (1, 2, 4224, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_token_dkdv_by_role_matches_the_triton_kernel(shape, causal):
    """The experimental one-launch d=128 dK/dV (experimental/dkdv_roles_hopper: P^T made by one warpgroup
    and read from shared memory by the other) does _q_block_token's arithmetic element by element:
    dK and dV bit-identical to the Triton token kernel's."""
    _assert_token_kernels_match_triton(shape, causal, ("triton,dkdv=gluon-roles",))


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_token_gluon_dkdv_matches_simulation(causal, head_dim):
    r = check_case((1, 4, 2048, head_dim), torch.bfloat16, causal, False, reruns=5, quant="token",
                   kernels=TOKEN_GLUON_DKDV[0])
    assert r["all_written"] and r["reproducible"], r
    for name, err in r["rel_l2_vs_sim"].items():
        assert err <= TOLERANCE[torch.bfloat16], f"{name}: token Gluon dK/dV vs simulation {err:.2e}"


@pytest.mark.parametrize("kernels,head_dim", [(DEFAULT, 64), (DEFAULT, 128), (TRITON, 64), (TRITON, 128),
                                               ("triton,dkdv=gluon", 64), ("triton,dkdv=gluon", 128),
                                               ("triton,dkdv=gluon-roles", 128)])
def test_token_kernels_keep_dk_in_fp16_with_small_gradients(kernels, head_dim):
    """fp16, dO ~ 1e-5: every token kernel takes dS to bf16 (fp32's exponent range) for dQ's and dK's products, as
    the simulation does (whose dK there is as accurate as bf16's, test_sagebwd_simulation), so the gradients stay
    with the simulation. They are ~1e-5 here, fp16 subnormals (spacing 6e-8), so the bound is bf16's, not fp16's;
    O does not see dO."""
    if kernels != TRITON and not _hopper():
        pytest.skip("the Gluon kernels are built for Hopper (sm_90)")
    r = check_case((1, 4, 2048, head_dim), torch.float16, True, False, reruns=1, quant="token", kernels=kernels,
                   do_scale=1e-5)
    print(kernels, head_dim, r["rel_l2_vs_sim"])
    assert r["all_written"], r
    for name, err in r["rel_l2_vs_sim"].items():
        assert err <= TOLERANCE[torch.bfloat16], f"{name}: kernel vs simulation {err:.2e}"


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("layout", ["misaligned", "model"])
def test_token_gluon_dkdv_takes_any_layout_of_v_and_do(layout, head_dim):
    ref = _forward_backward((2, 3, 384, head_dim), True, TRITON, quant="token")
    got = _forward_backward((2, 3, 384, head_dim), True, TOKEN_GLUON_DKDV[0], layout, quant="token")
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
        assert torch.equal(a, b), f"{name} differs with {layout} v/dO"


TOKEN_GLUON_DQ = ("triton,dq=gluon-ws", "triton,dq=gluon", "triton,dq=gluon-ws2")   # the token contract's
# Gluon dQ (d=64 and 128): warp-specialised, not, and on two consumer warpgroups of half a block each


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("shape", [(1, 4, 2048, 128), (2, 3, 384, 128), (1, 2, 128, 128), (1, 2, 4224, 128),
                                   (2, 2, 256, 128), (1, 4, 2048, 64), (2, 3, 384, 64), (1, 2, 4224, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_token_gluon_dq_matches_the_triton_kernel(shape, causal):
    """The Gluon dQ with TOKEN (warp-specialised and not) against the Triton token dQ on the same inputs:
    backward.py's TOKEN arithmetic in its order (S = int * s_K * (s_Q qk_const) - LSE one fma, dS = P (dP -
    delta), dQ += bf16(dS) K16 chained on the tensor cores, tiles in the same order), so dQ is expected
    bit-identical; O, dK and dV come from
    the same Triton kernels. The rel. L2 bound first, so that a failure says how far apart."""
    _assert_token_kernels_match_triton(shape, causal, TOKEN_GLUON_DQ)


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("kernels", ["dq=gluon-ws", "dq=gluon", "dq=gluon-ws2"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_token_gluon_dq_matches_simulation(causal, kernels, head_dim):
    """With the default token dK/dV (Gluon WS) beside it: the whole token backward on Gluon kernels."""
    r = check_case((1, 4, 2048, head_dim), torch.bfloat16, causal, False, reruns=5, quant="token", kernels=kernels)
    assert r["all_written"] and r["reproducible"], r
    for name, err in r["rel_l2_vs_sim"].items():
        assert err <= TOLERANCE[torch.bfloat16], f"{name}: token Gluon dQ vs simulation {err:.2e}"


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("layout", ["misaligned", "model"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_token_gluon_dq_takes_any_layout_of_v_and_do(layout, head_dim):
    ref = _forward_backward((2, 3, 384, head_dim), True, TRITON, quant="token")
    for kernels in TOKEN_GLUON_DQ:
        got = _forward_backward((2, 3, 384, head_dim), True, kernels, layout, quant="token")
        for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
            assert torch.equal(a, b), f"{name} differs with {layout} v/dO ({kernels})"


FUSED = "default,fused"


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("shape", [(2, 3, 384, 64), (1, 2, 4224, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_backward_matches_simulation_and_the_two_kernels(shape, causal):
    """The opt-in one-kernel backward (fused_hopper) against the simulation, and against the default
    two-kernel backward on the same inputs: the same contract, with tile scales from the other
    orientation's dP sums (last bits) and dQ summed by atomics in any order. O, dK, dV rerun
    bit-identical; dQ within kernel_checks.DQ_RERUN_TOLERANCE. (384 rows: an odd number of q blocks, the
    causal diagonal block after the loop; 4224: 33 q blocks, the ring wrapping many times.)"""
    r = check_case(shape, torch.bfloat16, causal, False, reruns=5, kernels=FUSED)
    assert r["fused_backward"] and r["all_written"] and r["reproducible"], r
    for name, err in r["rel_l2_vs_sim"].items():
        assert err <= TOLERANCE[torch.bfloat16], f"{name}: fused backward vs simulation {err:.2e}"
    fused, ref = _forward_backward(shape, causal, FUSED), _forward_backward(shape, causal, DEFAULT)
    assert torch.equal(fused[0], ref[0])   # the forward is the same
    for name, a, b in zip(("dq", "dk", "dv"), fused[1:], ref[1:]):
        err = float((a.double() - b.double()).norm() / b.double().norm())
        assert err <= 1e-3, f"{name}: fused vs two-kernel backward {err:.2e}"


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels are built for Hopper (sm_90)")
@pytest.mark.parametrize("layout", ["misaligned", "model"])
def test_fused_backward_takes_any_layout_of_v_and_do(layout):
    ref = _forward_backward((2, 3, 384, 64), True, FUSED)
    got = _forward_backward((2, 3, 384, 64), True, FUSED, layout)
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
        err = float((a.double() - b.double()).norm() / b.double().norm())
        assert err <= 1e-5, f"{name} differs with {layout} v/dO: {err:.2e}"


@pytest.mark.parametrize("quant", ["block", "token"])
def test_cuda_graph_replay_matches_eager(quant):
    """One fwd+bwd captured in a CUDA graph (the remedy where the op is launch-bound) replays to
    the eager outputs bit for bit: no host synchronisation, nothing read back on the host. The token
    contract's backward forks a side stream (backward.SIDE_STREAM), which the capture takes in."""
    rows = [graph_and_compiled(shape, quant=quant) for shape in [(1, 2, 512, 64), (1, 2, 384, 128)]]
    assert all(r["identical"] for r in rows)
    # eager calls skip the custom ops' dispatch (ops._EagerAttention), compiled ones run the ops
    assert all(r["compiled_identical"] for r in rows)


@pytest.mark.parametrize("impl", ["sage", "sage-token"])
def test_the_benchmarks_replayed_fwd_bwd_writes_the_eager_gradients(impl):
    """The benchmark's "fwd+bwd graph" rows time a whole fwd+bwd: its replayed graph writes the gradients that
    the eager step writes, bit for bit (the token contract's side stream included)."""
    from benchmarks import attention as bench
    from benchmarks.baselines import AutogradRunner
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = [torch.randn(1, 2, 512, 64, device="cuda", generator=gen).bfloat16() for _ in range(4)]
    runner = AutogradRunner(bench.attention_fn(impl, True), q, k, v, do)
    runner.step()
    eager = [t.grad.clone() for t in runner.leaves]
    graph, _ = captured(runner.step, runner.leaves)
    for t in runner.leaves:
        t.grad.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(t.grad, g) for t, g in zip(runner.leaves, eager))


@pytest.mark.parametrize("quant", ["block", "token"])
@pytest.mark.parametrize("layout", ["contiguous", "model"])
def test_backward_allocates_only_the_gradients_and_the_quantised_do(layout, quant):
    """The backward's new memory: dQ, dK, dV and dO^ (sequence-contiguous INT8, or FP8 in the token
    contract), plus row and tile scalars, in either contract (the token contract wrote dO s_Q in dO's dtype too
    until the twentieth session). Autograd must not fill zero gradients for the op's other outputs (four of them
    INT8 the size of Q/K: +16 MiB here, 43 us at (8,8,4096,128) before v20), and the model's
    permuted v and transposed dO are read in place (before v21: a copy per kernel, +8 MiB each)."""
    from sagebwd.triton import attention
    shape = (1, 8, 4096, 128)
    q, k, v = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    do = torch.randn_like(q)
    if layout == "model":
        q, k, v, do = _model_layout(q, k, v, do)
    q, k, v = [t.requires_grad_() for t in (q, k, v)]
    o = attention(q, k, v, True, quant=quant)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = torch.autograd.grad(o, (q, k, v), do)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    bf16, int8 = q.numel() * 2, q.numel()
    allowed = 3 * bf16 + 2 * int8
    assert extra <= allowed, f"the backward allocated {extra / 2**20:.1f} MiB"
    assert all(bool(torch.isfinite(g).all()) for g in grads)


def _causal_fwd_bwd(q, k, v, do, quant):
    """(O, dQ, dK, dV) of one causal fwd+bwd of the op with K-smoothing, blocks 128 x 64, in `quant`."""
    from sagebwd.triton import attention
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = attention(q, k, v, True, True, False, 128, 64, quant)
    o.backward(do)
    return [t.clone() for t in (o, q.grad, k.grad, v.grad)]


@pytest.mark.parametrize("quant", ["block", "token"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_direct_launches_match_the_jit_launches(quant, head_dim, monkeypatch):
    """launch() runs a kernel compiled for an earlier launch of the same signature without Triton's
    JITFunction.run: a second fwd+bwd must launch none through it and give the first's bits; a tensor
    that is not 16-byte aligned is a new signature, so its launches go through Triton again."""
    from triton.runtime.jit import JITFunction

    from sagebwd.triton import launch
    launch._COMPILED.clear()
    jit_runs = []
    run = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **k: jit_runs.append(self) or run(self, *a, **k))

    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, 4, 1024, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    first = _causal_fwd_bwd(q, k, v, do, quant)
    assert jit_runs and len(launch._COMPILED) == len(jit_runs)   # each launch of a fwd+bwd its own signature
    jit_runs.clear()
    second = _causal_fwd_bwd(q, k, v, do, quant)
    assert jit_runs == [], f"launched through JITFunction.run again: {[k.fn.__name__ for k in jit_runs]}"
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    v_unaligned = torch.empty(v.numel() + 1, device="cuda", dtype=v.dtype)[1:].view(v.shape)   # 2 bytes past 16
    v_unaligned.copy_(v)
    third = _causal_fwd_bwd(q, k, v_unaligned, do, quant)
    assert jit_runs, "an unaligned v reused a kernel compiled for aligned tensors"
    for a, b in zip(first, third):
        assert torch.equal(a, b)


@pytest.mark.parametrize("quant", ["block", "token"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_sections_of_heads_change_no_bit(quant, head_dim, monkeypatch):
    """The forward's and dQ's programs start in schedule.py's order; a tile's arithmetic does not depend
    on it. Five heads, causal, in one section of five (the default at this size) and in narrower ones (an
    L2 budget of two heads' dQ operands: dQ 2, 2, 1 and forward 3, 2) give the same bits."""
    from sagebwd.triton import schedule

    torch.manual_seed(0)
    n = 1024
    q, k, v, do = (torch.randn(1, 5, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    one_section = _causal_fwd_bwd(q, k, v, do, quant)
    # the dQ's kv side per head: K^, K^T (1 byte an element) and V (2 bytes); the forward's K^ and V^
    monkeypatch.setattr(schedule, "L2_SECTION_BYTES", 2 * 4 * n * head_dim + 1)
    assert schedule.heads_per_section(True, 5, (torch.empty(5, 4 * n * head_dim, dtype=torch.int8),)) == 2
    assert schedule.heads_per_section(True, 5, (torch.empty(5, 2 * n * head_dim, dtype=torch.int8),)) == 3
    sections_of_two = _causal_fwd_bwd(q, k, v, do, quant)
    for name, a, b in zip(("O", "dQ", "dK", "dV"), one_section, sections_of_two):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_token_backward_on_two_streams_matches_one_stream(causal, head_dim, monkeypatch):
    """The token backward's dQ kernel beside its dK/dV kernel on a side stream gives the bits of the two one after
    the other, and the caller's stream waits for both (read right after, with no synchronisation)."""
    from sagebwd.triton import backward as kb
    got = _forward_backward((2, 3, 1024, head_dim), causal, "default", quant="token")
    monkeypatch.setattr(kb, "SIDE_STREAM", False)
    ref = _forward_backward((2, 3, 1024, head_dim), causal, "default", quant="token")
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
        assert torch.equal(a, b), f"{name} differs on two streams"


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_token_forward_quantises_q_as_the_quantise_pass_would(causal, head_dim):
    """The token forward quantises Q itself (no Q-smoothing): Q^ and its scales equal the quantise pass's
    (quantize_blocks) bit for bit, for Q in the model's layout (a view of (B, N, H, D)); no transposed copy."""
    from sagebwd.triton import ops, quantize as kq

    gen = torch.Generator(device="cuda").manual_seed(3)
    b, h, n = 2, 3, 2048
    q, k, v = [(torch.randn(b, n, h, head_dim, device="cuda", generator=gen) * 2).bfloat16().transpose(1, 2)
               for _ in range(3)]
    o, _, q8, q8t, s_q = ops._forward_impl(q, k, v, causal, True, False, 128, 64, True, True)[:5]
    rows, _, scale, _ = kq.quantize_blocks(q, 128, token=True)
    assert torch.equal(q8, rows) and torch.equal(s_q, scale) and q8t.numel() == 0
    assert torch.equal(o, ops._forward_impl(q, k, v, causal, True, False, 128, 64, True, False)[0]), \
        "inference (no transposed copy) changed O"
