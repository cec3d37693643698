"""The SageBwd simulation: formulas, quantisation, smoothing, masking and input errors."""
import math

import pytest
import torch

import sagebwd
from sagebwd.fpa import fpa_attention
from sagebwd.quant import quantize_row_blocks, quantize_tiles, dequantize_row_blocks, dequantize_tiles
from sagebwd.simulate import SageConfig, backward, forward

SMALL = dict(block_q=32, block_kv=16)


def rand(*shape, seed=0, dtype=torch.float64, scale=1.0, mean=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + mean).to(dtype)


def qkvdo(b=2, h=2, n=64, d=64, dtype=torch.float64, scale=1.0, q_mean=0.0, k_mean=0.0):
    return (rand(b, h, n, d, seed=1, dtype=dtype, scale=scale, mean=q_mean),
            rand(b, h, n, d, seed=2, dtype=dtype, scale=scale, mean=k_mean),
            rand(b, h, n, d, seed=3, dtype=dtype), rand(b, h, n, d, seed=4, dtype=dtype))


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# --- full-precision reference -------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_fpa_intermediates_match_autograd_float64(causal):
    q, k, v, do = qkvdo()
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    mask = torch.ones(64, 64, dtype=torch.bool).tril() if causal else None
    s = qa @ ka.transpose(-1, -2) / math.sqrt(64)
    if causal:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = p @ va
    o.backward(do)
    r = fpa_attention(q, k, v, do, causal=causal)
    torch.testing.assert_close(r.o, o.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(r.p, p.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(r.dq, qa.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(r.dk, ka.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(r.dv, va.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(r.lse, torch.logsumexp(s, -1).detach(), rtol=1e-12, atol=1e-12)


# --- the simulation's formulas, quantisation switched off ---------------------------------------

@pytest.mark.parametrize("quant", ["block", "token"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("smooth_k,smooth_q", [(False, False), (True, False), (True, True), (False, True)])
def test_backward_equals_autograd_of_forward_without_quantisation(causal, smooth_k, smooth_q, quant):
    # Nonzero means make the smoothing terms matter.
    # (the token contract's forward tiles are 128 keys: a sequence of 128 holds one)
    q, k, v, do = qkvdo(n=128 if quant == "token" else 64, q_mean=0.7, k_mean=-0.5)
    cfg = SageConfig(causal=causal, smooth_k=smooth_k, smooth_q=smooth_q, quantize=False, quant=quant, **SMALL)
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    o_auto, _ = forward(qa, ka, va, cfg)
    o_auto.backward(do)
    o, saved = forward(q, k, v, cfg)
    dq, dk, dv = backward(saved, do, cfg)
    torch.testing.assert_close(o, o_auto.detach(), rtol=0, atol=0)
    torch.testing.assert_close(dq, qa.grad, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(dk, ka.grad, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(dv, va.grad, rtol=1e-9, atol=1e-11)
    # and it is plain attention
    ref = fpa_attention(q, k, v, do, causal=causal)
    for got, want in ((o, ref.o), (dq, ref.dq), (dk, ref.dk), (dv, ref.dv)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


def test_dq_unchanged_by_k_smoothing():
    q, k, v, do = qkvdo(k_mean=3.0)
    grads = {}
    for smooth_k in (False, True):
        cfg = SageConfig(smooth_k=smooth_k, quantize=False, **SMALL)
        o, saved = forward(q, k, v, cfg)
        grads[smooth_k] = backward(saved, do, cfg)[0]
    # dS rows sum to zero, so dS (1 mean(K)^T) vanishes: dQ = dS K = dS K_sm.
    torch.testing.assert_close(grads[True], grads[False], rtol=1e-9, atol=1e-11)
    assert grads[True].abs().max() > 1e-3  # not trivially zero


def test_q_smoothing_needs_its_dk_bias_branch():
    q, k, v, do = qkvdo(q_mean=2.0)
    cfg = SageConfig(smooth_q=True, quantize=False, **SMALL)
    o, saved = forward(q, k, v, cfg)
    _, dk, _ = backward(saved, do, cfg)
    ref = fpa_attention(q, k, v, do)
    torch.testing.assert_close(dk, ref.dk, rtol=1e-9, atol=1e-11)
    # Without the branch (the centred term alone) dK would be wrong by (dS^T 1) mu_Q^T.
    no_bias = saved._replace(mu_q=torch.zeros_like(saved.mu_q))
    _, dk_center, _ = backward(no_bias, do, cfg)
    assert rel(dk_center, ref.dk) > 0.1


def test_q_smoothing_with_quantisation_tracks_fpa():
    q, k, v, do = qkvdo(n=128, dtype=torch.float32, q_mean=2.0)
    for smooth_q in (False, True):
        cfg = SageConfig(smooth_q=smooth_q, **SMALL)
        o, saved = forward(q, k, v, cfg)
        dq, dk, dv = backward(saved, do, cfg)
        ref = fpa_attention(q, k, v, do)
        assert rel(o, ref.o) < 0.05 and rel(dk, ref.dk) < 0.15 and rel(dq, ref.dq) < 0.15


# --- quantisers --------------------------------------------------------------------------------

def test_row_block_quantiser_properties():
    x = rand(2, 3, 64, 64, dtype=torch.float32, scale=5.0)
    x[0, 0, :16] = 0.0    # an all-zero block
    q, s = quantize_row_blocks(x, 16)
    assert s.shape == (2, 3, 4)
    assert torch.equal(q, q.round()) and q.abs().max() <= 127
    blocks = q.reshape(2, 3, 4, 16 * 64).abs().amax(-1)
    assert torch.all((blocks == 127) | (s == 0))          # every nonzero block reaches 127
    assert s[0, 0, 0] == 0 and torch.all(q[0, 0, :16] == 0)
    err = (dequantize_row_blocks(q, s, 16) - x).abs()
    assert torch.all(err <= s.repeat_interleave(16, -1).unsqueeze(-1) / 2 * (1 + 1e-5))


def test_e4m3_block_quantiser_properties():
    """The token contract's dO^ for dV: e4m3 values (round to nearest even, saturating at 448), one
    scale amax / 448 per block; each nonzero block's largest entry lands on 448; all-zero blocks give 0."""
    from sagebwd.quant import E4M3_MAX, quantize_row_blocks_e4m3, round_to_e4m3
    x = rand(2, 3, 64, 64, dtype=torch.float32, scale=5.0)
    x[0, 0, :16] = 0.0
    q, s = quantize_row_blocks_e4m3(x, 16)
    assert s.shape == (2, 3, 4) and torch.equal(q, round_to_e4m3(q)) and q.abs().max() <= E4M3_MAX
    blocks = q.reshape(2, 3, 4, 16 * 64).abs().amax(-1)
    assert torch.all((blocks == E4M3_MAX) | (s == 0)) and s[0, 0, 0] == 0 and torch.all(q[0, 0, :16] == 0)
    rel = ((q * s.repeat_interleave(16, -1).unsqueeze(-1) - x).abs() / x.abs().clamp_min(1e-30))[x.abs() > s.max()]
    assert rel.max() <= 2.0 ** -4 * (1 + 1e-5)   # 3 mantissa bits: half a step of 1/8 at worst
    ties = torch.tensor([1.0625, 1.1875, 2.0 ** -10, 3 * 2.0 ** -10, 500.0, -1.9375])
    assert round_to_e4m3(ties).tolist() == [1.0, 1.25, 0.0, 2.0 ** -8, 448.0, -2.0]


def test_quantiser_divisions_are_ieee_rounded():
    # The contract says scale = amax/127 and inv = 127/amax as correctly rounded fp32 divisions
    # (what a kernel's div_rn gives); float64 division rounded to fp32 is the correctly rounded one.
    from sagebwd.quant import _quantize
    x = torch.rand(4096, 1, dtype=torch.float32) * torch.logspace(-3, 3, 4096).unsqueeze(1)
    q, scale = _quantize(x, (-1,), True)
    torch.testing.assert_close(scale, (x.double() / 127).float(), rtol=0, atol=0)
    inv = (127 / x.double()).float()
    torch.testing.assert_close(q, torch.round(x * inv).clamp(-127, 127), rtol=0, atol=0)


def test_quantiser_rounds_half_to_even_and_tiles():
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 3.0, 0.0]]).repeat(16, 2)
    q, s = quantize_tiles(x, 16, 16)
    assert s.shape == (1, 1) and s.item() == 1.0
    assert q.reshape(16, 16)[0, :8].tolist() == [127, 0, 2, 2, -0, -2, 3, 0]
    torch.testing.assert_close(dequantize_tiles(q, s), x.round())


def test_integer_matmul_is_exact_in_float32():
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (256, 128), generator=g)
    b = torch.randint(-127, 128, (256, 128), generator=g)
    a[0], b[0] = 127, 127   # worst case 127*127*128 = 2,064,512 < 2**24
    exact = a @ b.T
    assert torch.equal((a.float() @ b.float().T).long(), exact)


# --- the simulated INT8 attention ---------------------------------------------------------------

def test_forward_saves_integers_and_lse():
    q, k, v, do = qkvdo(dtype=torch.float32)
    o, saved = forward(q, k, v, SageConfig(**SMALL))
    for t in (saved.q_hat, saved.k_hat):
        assert torch.equal(t, t.round()) and t.abs().max() == 127
    # K-smoothing shifts each row's logits by q.mean(K): the LSE is that of the smoothed K.
    ref = fpa_attention(q, k - k.mean(-2, keepdim=True), v)
    assert rel(saved.lse, ref.lse) < 1e-3
    assert rel(o, ref.o) < 0.03


@pytest.mark.parametrize("causal", [False, True])
def test_quantised_attention_is_close_to_fpa_and_autograd_wires_it(causal):
    q, k, v, do = qkvdo(n=128, dtype=torch.bfloat16)
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    o = sagebwd.attention(qa, ka, va, causal=causal, backend="simulate", **SMALL)
    o.backward(do)
    assert o.dtype == torch.bfloat16 and qa.grad.dtype == torch.bfloat16
    ref = fpa_attention(q, k, v, do, causal=causal)
    assert rel(o, ref.o) < 0.03
    for g, r in ((qa.grad, ref.dq), (ka.grad, ref.dk), (va.grad, ref.dv)):
        assert 0 < rel(g, r) < 0.1
    cfg = SageConfig(causal=causal, **SMALL)
    _, saved = forward(q, k, v, cfg)
    direct = backward(saved, do, cfg)
    for g, d in zip((qa.grad, ka.grad, va.grad), direct):
        assert torch.equal(g, d)


def test_causal_rows_ignore_future_keys_exactly():
    q, k, v, do = qkvdo(n=64, dtype=torch.float32)
    cfg = SageConfig(causal=True, smooth_k=False, **SMALL)   # K-smoothing's mean sees the whole sequence
    o1, s1 = forward(q, k, v, cfg)
    k2, v2 = k.clone(), v.clone()
    k2[..., 32:, :] = torch.randn_like(k2[..., 32:, :]) * 10
    v2[..., 32:, :] = torch.randn_like(v2[..., 32:, :]) * 10
    o2, _ = forward(q, k2, v2, cfg)
    assert torch.equal(o1[..., :32, :], o2[..., :32, :])     # first q block sees kv blocks 0 and 1 only
    assert not torch.equal(o1[..., 32:, :], o2[..., 32:, :])
    _, inter = backward(s1, do, cfg, return_intermediates=True)
    future = ~torch.ones(64, 64, dtype=torch.bool).tril()
    assert torch.all(inter.p[..., future] == 0) and torch.all(inter.ds[..., future] == 0)


def test_error_grows_with_sigma_at_small_seq():
    from sagebwd.trace import sigma_sweep
    rows = sigma_sweep([1, 3, 5, 8], seq=128, head_dim=64, heads=2, cfg=SageConfig(**SMALL))
    for name in ("o", "dq", "dk", "dv"):
        errs = [rows[s][name].rel_l2 for s in (1, 3, 5, 8)]
        assert errs == sorted(errs), (name, errs)
    assert rows[8]["dq"].rel_l2 > 3 * rows[1]["dq"].rel_l2
    assert rows[1]["dp"].rel_l2 == 0.0                    # dP is unquantised and dO shared: the control


# --- the "token" contract ---------------------------------------------------------------------

def test_token_contract_scales_q_and_k_per_token():
    q, k, v, _ = qkvdo(n=128, dtype=torch.float32, scale=2.0)
    _, saved = forward(q, k, v, SageConfig(quant="token", **SMALL))
    assert saved.s_q.shape == saved.s_k.shape == (2, 2, 128)
    k_sm = k - k.mean(-2, keepdim=True)
    torch.testing.assert_close(saved.s_k, k_sm.abs().amax(-1) / 127, rtol=1e-6, atol=0)
    assert saved.q_hat.abs().amax(-1).eq(127).all() and saved.k_hat.abs().amax(-1).eq(127).all()


def test_token_contract_keeps_rows_independent():
    """A q row's O and dQ depend on no other q row (block scales couple the rows of a block)."""
    q, k, v, do = qkvdo(n=128, dtype=torch.float32)
    q2, do2 = q.clone(), do.clone()
    q2[..., 40:, :] *= 30      # another q row of the same 32-row block, far larger
    do2[..., 40:, :] *= 30
    changed = {}
    for quant in ("block", "token"):
        cfg = SageConfig(quant=quant, **SMALL)
        (o1, s1), (o2, s2) = forward(q, k, v, cfg), forward(q2, k, v, cfg)
        dq1, dq2 = backward(s1, do, cfg)[0], backward(s2, do2, cfg)[0]
        changed[quant] = (not torch.equal(o1[..., 32:40, :], o2[..., 32:40, :]),
                          not torch.equal(dq1[..., 32:40, :], dq2[..., 32:40, :]))
    assert changed["token"] == (False, False)
    assert changed["block"] == (True, True)


@pytest.mark.parametrize("smooth_q", [False, True])
def test_token_contracts_dq_and_dk_are_bf16_products_of_ds(smooth_q):
    """dQ = sm_scale bf16(dS) K16 and dK = sm_scale bf16(dS)^T Q16 (simulate.token_dq, token_dk): dS as both see it is
    dS rounded to bf16, K16 and Q16 are K and Q as given rounded to bf16 (not the smoothed Q: with Q-smoothing dS^T Q
    holds the bias branch, which the block contract adds apart). In fp64 inputs the roundings are visible: dQ and dK
    are exactly those products, and within the contract's error of FPA's."""
    q, k, v, do = qkvdo(n=256, dtype=torch.float64)
    cfg = SageConfig(quant="token", block_q=128, block_kv=64, smooth_q=smooth_q)
    _, saved = forward(q, k, v, cfg)
    (dq, dk, _), inter = backward(saved, do, cfg, return_intermediates=True)
    assert saved.dq_k.dtype == torch.bfloat16 and torch.equal(saved.dq_k, k.bfloat16())
    assert saved.dk_q.dtype == torch.bfloat16 and torch.equal(saved.dk_q, q.bfloat16())
    seen = inter.ds   # bf16(dS), as dQ and dK saw it
    assert torch.equal(seen, seen.bfloat16().double())
    assert torch.allclose(dq.double(), (seen @ k.bfloat16().double()) / math.sqrt(64), rtol=1e-12, atol=1e-14)
    assert torch.allclose(dk.double(), (seen.transpose(-1, -2) @ q.bfloat16().double()) / math.sqrt(64),
                          rtol=1e-12, atol=1e-14)
    ref = fpa_attention(q, k, v, do)
    for name, got in (("dq", dq), ("dk", dk)):
        want = getattr(ref, name)
        rel = ((got - want).norm() / want.norm()).item()
        assert rel < 0.03, (name, rel)


def test_token_contract_is_more_accurate_than_block():
    from sagebwd.trace import sigma_sweep
    # 8 heads: at sigma 8 one head's dQ error swings by +-30% with the draw (a few peaked rows)
    rows = {quant: sigma_sweep([1, 8], seq=256, head_dim=64, heads=8, cfg=SageConfig(causal=True, quant=quant))
            for quant in ("block", "token")}
    for sigma in (1, 8):
        for name in ("o", "dq", "dk", "dv"):
            assert rows["token"][sigma][name].rel_l2 < rows["block"][sigma][name].rel_l2, (sigma, name)
    assert rows["token"][1]["dq"].rel_l2 < 0.5 * rows["block"][1]["dq"].rel_l2


def test_token_dk_keeps_its_accuracy_in_fp16_with_small_gradients():
    """fp16 inputs with small output gradients (dO ~ 1e-5, as in fp16 training without loss scaling) must keep
    dK's error near bf16's at the same inputs: every scale of the contract is relative, so only fp16's range can
    move it. dS takes bf16 (fp32's exponent range) into dK's product, so nothing underflows (when the contract
    multiplied dO by s_Q in dO's dtype, fp16 lost dK: 0.098 against bf16's 0.019)."""
    from sagebwd.simulate import SimulatedSageBwd
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 256, 64, generator=gen) for _ in range(4))
    do = do * 1e-5
    cfg = SageConfig(causal=True, quant="token")
    err = {}
    for dtype in (torch.bfloat16, torch.float16):
        qq, kk, vv = (t.to(dtype).requires_grad_() for t in (q, k, v))
        SimulatedSageBwd.apply(qq, kk, vv, cfg).backward(do.to(dtype))
        ref = fpa_attention(q.double(), k.double(), v.double(), do.to(dtype).double(), causal=True)
        err[dtype] = ((kk.grad.double() - ref.dk).norm() / ref.dk.norm()).item()
    assert err[torch.float16] < 1.5 * err[torch.bfloat16], err


def test_tiny_groups_quantise_to_zero_not_nan():
    from sagebwd.quant import MIN_AMAX, quantize_groups
    x = torch.tensor([[1e-38, -5e-39, 0.0, 0.0], [1.0, -0.5, 0.25, 0.0]])
    q, scale = quantize_groups(x, 2, -1)
    assert torch.isfinite(q).all() and torch.equal(q[0], torch.zeros(4))
    assert q[1].tolist() == [127.0, -64.0, 127.0, 0.0] and MIN_AMAX > 0


# --- bad input ------------------------------------------------------------------------------------

def _bad(match, *args, **kw):
    with pytest.raises(sagebwd.SageBwdInputError, match=match):
        sagebwd.attention(*args, backend=kw.pop("backend", "simulate"), **kw)


def test_bad_inputs_are_rejected_with_a_fix():
    x = torch.randn(1, 2, 128, 64)
    _bad("not a multiple of block_q=128 and block_kv=64.*384", *(torch.randn(1, 2, 300, 64),) * 3)
    # the token contract's forward quantises P and V per 128 keys, whatever the blocks
    _bad("not a multiple of 128: the 'token' contract's forward.*e.g. 256.*quant='block'",
         *(torch.randn(1, 2, 192, 64),) * 3, block_q=64, block_kv=64, quant="token")
    _bad("head_dim 96 is not supported", *(torch.randn(1, 2, 128, 96),) * 3)
    _bad("same shape", x, x, torch.randn(1, 2, 128, 128))
    _bad("expected 4 dims", x[0], x[0], x[0])
    _bad("share one dtype", x, x.half(), x)
    _bad("one device", x, x.to("meta"), x)
    nan = x.clone()
    nan[0, 0, 3, 5] = float("nan")
    _bad("k contains NaN or Inf", x, nan, x)
    _bad("backend='cuda' is not one of", x, x, x, backend="cuda")
    _bad("power of two", x, x, x, block_q=100)
    _bad("quant='fp8' is not a quantisation contract.*'block'.*'token'", x, x, x, quant="fp8")
    with pytest.raises(sagebwd.SageBwdInputError, match="needs CUDA tensors"):
        sagebwd.attention(x, x, x, backend="triton")
    _bad("dtype torch.int32 is not supported", *(torch.ones(1, 2, 128, 64, dtype=torch.int32),) * 3)


def test_kernel_choice_check_traces_without_dynamo_warnings():
    """The op checks `kernels=` inside the model's compiled graph: Dynamo traces the check without
    warning about the registry's lru_cache (the trainer's logs showed one per compiled model), and a
    bad choice still raises there."""
    import warnings
    from sagebwd import validate

    def checked(x, kernels):
        validate.check_kernels(kernels)
        return x * 2

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(lambda x: checked(x, "triton,dkdv=gluon-ws"), backend="eager", fullgraph=True)(torch.ones(3))
    assert not [w for w in caught if "lru_cache" in str(w.message)], [str(w.message) for w in caught]
    with pytest.raises(Exception, match="glon"):
        torch.compile(lambda x: checked(x, "dkdv=glon"), backend="eager", fullgraph=True)(torch.ones(3))


def test_token_backward_without_its_16bit_operands_is_refused_with_a_fix():
    """The token contract's dQ and dK are bf16 products with K and Q themselves: the simulation's backward refuses a
    Saved without either (simulate.with_dq_k, with_dk_q add them), and the kernels' backward refuses a call without
    k or q, or with an INT8 tensor in q's place, each saying what to pass."""
    from sagebwd.triton import backward as kb
    q, k, v, do = qkvdo(1, 1, 128, 64, dtype=torch.float32)
    cfg = SageConfig(causal=True, quant="token")
    _, saved = forward(q, k, v, cfg)
    with pytest.raises(ValueError, match="needs K in bf16.*with_dq_k"):
        backward(saved._replace(dq_k=None), do, cfg)
    with pytest.raises(ValueError, match="needs Q in bf16.*with_dk_q"):
        backward(saved._replace(dk_q=None), do, cfg)
    x = torch.zeros(1, 1, 128, 64)
    common = dict(causal=True, smooth_k=True, block_q=128, block_kv=64, quant="token")
    with pytest.raises(ValueError, match=r"dQ = bf16\(dS\) K16.*pass k=.*got None"):
        kb.backward(x, None, None, None, x, None, None, None, None, None, x, None, q=x, **common)
    q8 = torch.zeros(1, 1, 128, 64, dtype=torch.int8)   # Q^, not Q
    with pytest.raises(ValueError, match=r"dK = bf16\(dS\^T\) Q16.*pass q= \(fp16 or bf16, \(1, 1, 128, 64\)\); "
                                         r"got torch.int8"):
        kb.backward(x, None, None, None, x, None, None, None, None, None, x, None, k=x.bfloat16(), q=q8, **common)
