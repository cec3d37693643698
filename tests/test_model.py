"""Model: shapes, causality, RoPE, QK-norm/smoothing wiring, 325M count, config checks."""
from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from model import Llama, ModelConfig, count_parameters, model_config_from_preset
from model.attention import CoreAttention
from model.layers import RotaryEmbedding

MICRO = dict(vocab_size=512, pad_vocab_to_multiple_of=64, seq_len=64, hidden_size=128,
             num_layers=2, num_heads=2, ffn_hidden_size=256, block_q=32, block_kv=32)


def micro(**overrides) -> ModelConfig:
    return ModelConfig(**{**MICRO, **overrides})


def test_forward_shape_and_padded_vocab():
    cfg = micro(vocab_size=500)
    assert cfg.padded_vocab_size == 512
    logits = Llama(cfg)(torch.randint(0, 500, (3, 64)))
    assert logits.shape == (3, 64, 512)
    assert torch.isfinite(logits).all()


def test_model_is_causal():
    torch.manual_seed(0)
    model = Llama(micro(qk_norm=True)).eval()
    ids = torch.randint(0, 512, (1, 64))
    changed = ids.clone()
    changed[0, 40:] = (changed[0, 40:] + 1) % 512
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :40], b[:, :40])
    assert not torch.allclose(a[:, 40:], b[:, 40:])


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=64, max_seq_len=128, theta=10000.0)
    q, k = torch.randn(64), torch.randn(64)

    def score(m: int, n: int) -> torch.Tensor:
        rq = rope(q.view(1, 1, 1, 64), positions=torch.tensor([m]))
        rk = rope(k.view(1, 1, 1, 64), positions=torch.tensor([n]))
        return (rq * rk).sum()

    base = score(10, 3)
    for shift in (1, 7, 50, 110):
        torch.testing.assert_close(score(10 + shift, 3 + shift), base, rtol=1e-4, atol=1e-4)
    # and it really is position dependent
    assert not torch.allclose(score(10, 3), score(10, 9), atol=1e-3)
    # rotation keeps the vector norm (QK-norm before RoPE stays meaningful)
    rotated = rope(q.view(1, 1, 1, 64), positions=torch.tensor([37]))
    torch.testing.assert_close(rotated.norm(), q.norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_is_the_rotate_half_formula_bit_for_bit(dtype):
    """RotaryEmbedding computes x cos + flip(x) sin on the (2, head_dim/2) view of the channels (an index remap
    under torch.compile, where torch.cat of the halves made a slow kernel): the values and the gradients must be
    the Llama/HF rotate-half formula's, bit for bit, with and without positions (a sequence-parallel shard's)."""
    torch.manual_seed(0)
    head_dim, max_len, theta = 64, 512, 10000.0
    rope = RotaryEmbedding(head_dim=head_dim, max_seq_len=max_len, theta=theta)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)

    def rotate_half(x, positions):
        cos, sin = angles.cos().float(), angles.sin().float()
        cos, sin = (cos[:x.shape[-2]], sin[:x.shape[-2]]) if positions is None else (cos[positions], sin[positions])
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)

    for positions in (None, torch.arange(100, 357)):
        x = torch.randn(2, 3, 257, head_dim, dtype=dtype, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_(True)
        out, ref = rope(x, positions), rotate_half(x_ref, positions)
        grad = torch.randn_like(out)
        out.backward(grad)
        ref.backward(grad)
        assert torch.equal(out, ref)
        assert torch.equal(x.grad, x_ref.grad)


def _capture_core_inputs(model: Llama, monkeypatch) -> list[tuple]:
    seen = []
    core_cls = type(model.blocks[0].attn.core)
    original = core_cls.forward

    def spy(self, q, k, v):
        seen.append((q.detach(), k.detach(), v.detach()))
        return original(self, q, k, v)

    monkeypatch.setattr(core_cls, "forward", spy)
    return seen


@pytest.mark.parametrize("qk_norm", [True, False])
def test_qk_norm_normalises_what_the_attention_call_sees(qk_norm, monkeypatch):
    torch.manual_seed(0)
    model = Llama(micro(qk_norm=qk_norm, init_std=0.5))
    seen = _capture_core_inputs(model, monkeypatch)
    model(torch.randint(0, 512, (2, 64)))
    assert len(seen) == 2  # one call per layer, in (batch, heads, seq, head_dim)
    q, k, v = seen[0]
    assert q.shape == k.shape == v.shape == (2, 2, 64, 64)
    rms_q = q.pow(2).mean(-1).sqrt()
    rms_k = k.pow(2).mean(-1).sqrt()
    ones = torch.ones_like(rms_q)
    if qk_norm:  # learned scale starts at 1 and RoPE preserves the norm
        torch.testing.assert_close(rms_q, ones, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(rms_k, ones, rtol=1e-3, atol=1e-3)
    else:
        assert not torch.allclose(rms_q, ones, atol=0.1)
    names = {n for n, _ in model.named_parameters()}
    assert ("blocks.0.attn.q_norm.weight" in names) == qk_norm
    assert ("blocks.0.attn.k_norm.weight" in names) == qk_norm


@pytest.mark.parametrize("quant", ["block", "token"])
@pytest.mark.parametrize("smoothing,smooth_q,smooth_k",
                         [("none", False, False), ("k", False, True), ("qk", True, True)])
def test_smoothing_and_blocks_reach_sagebwd_call(smoothing, smooth_q, smooth_k, quant, monkeypatch):
    calls = []

    def recording_attention(q, k, v, **kwargs):
        calls.append(kwargs)
        return F.scaled_dot_product_attention(q, k, v, is_causal=kwargs["causal"])

    fake = types.ModuleType("sagebwd")
    fake.attention = recording_attention
    monkeypatch.setitem(sys.modules, "sagebwd", fake)
    # (the token contract's forward tiles are 128 keys: a sequence of 128)
    model = Llama(micro(attention="sagebwd", smoothing=smoothing, block_q=32, block_kv=16, quant=quant, seq_len=128))
    model(torch.randint(0, 512, (1, 128)))
    assert calls == [dict(causal=True, smooth_k=smooth_k, smooth_q=smooth_q,
                          block_q=32, block_kv=16, quant=quant, check_finite=False)] * 2


def test_fpa_never_calls_sagebwd(monkeypatch):
    fake = types.ModuleType("sagebwd")
    fake.attention = lambda *a, **k: pytest.fail("fpa must use SDPA, not sagebwd")
    monkeypatch.setitem(sys.modules, "sagebwd", fake)
    Llama(micro())(torch.randint(0, 512, (1, 64)))


def test_llama_325m_parameter_count():
    cfg = model_config_from_preset("llama-325m")
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.head_dim,
            cfg.ffn_hidden_size, cfg.seq_len) == (24, 1024, 16, 64, 3072, 4096)
    assert cfg.padded_vocab_size == 50304 and cfg.norm_eps == 1e-6
    with torch.device("meta"):  # count without allocating 1.5 GB
        counts = count_parameters(Llama(cfg))
    h, f, L, V = 1024, 3072, 24, 50304
    per_layer = 4 * h * h + 3 * h * f + 2 * h
    assert counts["non_embedding"] == L * per_layer + h == 327_205_888
    assert counts["embedding"] == V * h == 51_511_296
    assert counts["total"] == 378_717_184  # tied input/output embeddings


def test_untied_embeddings_add_an_lm_head():
    tied = count_parameters(Llama(micro()))
    untied_model = Llama(micro(tie_embeddings=False))
    untied = count_parameters(untied_model)
    assert untied["total"] - tied["total"] == 512 * 128
    assert untied_model.lm_head.weight is not untied_model.embed.weight


@pytest.mark.parametrize("overrides,message", [
    (dict(attention="sagebwd", smoothing="k", seq_len=96, block_q=64), "multiple of model.block_q"),
    (dict(attention="sagebwd", smoothing="k", seq_len=96, block_q=32, block_kv=64),
     "multiple of model.block_kv"),
    (dict(attention="sagebwd", hidden_size=96, num_heads=3), "head dim"),
    (dict(smoothing="k"), "only applies to attention='sagebwd'"),
    (dict(quant="token"), "model.quant='token' only applies to attention='sagebwd'"),
    (dict(attention="sagebwd", quant="int4"), "quant"),
    (dict(attention="sagebwd", quant="token", seq_len=192, block_q=64), "multiple of 128 for model.quant='token'"),
    (dict(hidden_size=100, num_heads=3), "divisible by model.num_heads"),
    (dict(num_layers=0), "num_layers must be positive"),
    (dict(attention="flash"), "attention"),
    (dict(n_layers=2), "n_layers"),
])
def test_invalid_model_configs_say_what_is_wrong(overrides, message):
    with pytest.raises(ValueError, match=message):
        micro(**overrides)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(ValueError, match="llama-325m"):
        model_config_from_preset("llama-7b")


@pytest.mark.parametrize("attention,smoothing", [("fpa", "none"), ("sagebwd", "k")])
def test_loss_drops_over_30_steps(attention, smoothing):
    """Both backends must learn: fit one fixed batch with plain AdamW."""
    torch.manual_seed(0)
    model = Llama(micro(attention=attention, smoothing=smoothing, qk_norm=True))
    ids = torch.randint(0, 512, (4, 65))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(6.24, abs=0.3)  # ~ln(512): uniform at init
    assert losses[-1] < 0.5 * losses[0], losses


def test_bf16_autocast_hands_the_attention_call_one_dtype(monkeypatch):
    """Mixed precision: q, k (through QK-norm's fp32 scale) and v must all arrive as bf16."""
    model = Llama(micro(qk_norm=True))
    seen = _capture_core_inputs(model, monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randint(0, 512, (1, 64)))
    assert {t.dtype for t in seen[0]} == {torch.bfloat16}


def test_fpa_kernel_pins_the_sdpa_backend():
    """A named SDPA kernel is the one that runs: math matches auto, and a kernel this
    device lacks (cuDNN on the CPU) fails instead of silently falling back."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    auto, math = CoreAttention(micro()), CoreAttention(micro(fpa_kernel="math"))
    torch.testing.assert_close(math(q, k, v), auto(q, k, v), rtol=1e-5, atol=1e-5)
    assert "fpa_kernel=math" in repr(math)
    if not torch.cuda.is_available():
        cudnn = CoreAttention(micro(fpa_kernel="cudnn"))
        with pytest.raises(RuntimeError, match="No (available kernel|viable backend)"):
            cudnn(q, k, v)


def test_sagebwd_kernels_reach_the_call_and_are_checked(monkeypatch):
    """model.sagebwd_kernels picks the kernels (sagebwd.triton.registry) and is read there: a typo or
    a choice for an FPA model fails when the config is built."""
    calls = []

    def recording_attention(q, k, v, **kwargs):
        calls.append(kwargs)
        return F.scaled_dot_product_attention(q, k, v, is_causal=kwargs["causal"])

    config = micro(attention="sagebwd", block_q=32, block_kv=16, sagebwd_kernels="triton")
    fake = types.ModuleType("sagebwd")
    fake.attention = recording_attention
    monkeypatch.setitem(sys.modules, "sagebwd", fake)
    Llama(config)(torch.randint(0, 512, (1, 64)))
    assert [c["kernels"] for c in calls] == ["triton"] * 2
    monkeypatch.undo()
    with pytest.raises(ValueError, match="dkdv has no kernel 'glon'"):
        micro(attention="sagebwd", block_q=32, block_kv=16, sagebwd_kernels="dkdv=glon")
    with pytest.raises(ValueError, match="only applies to attention='sagebwd'"):
        micro(sagebwd_kernels="triton")
