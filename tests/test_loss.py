"""model/loss.py: the chunked LM head + cross-entropy against the plain (reference) path.

Same loss and gradients: equal up to fp32 rounding in fp32, within bf16 rounding in bf16 (and
no further from an fp64 reference than plain itself). Covers a tied LM head (the gradient
reaches the embedding through both uses), padded vocabulary rows that are never targets,
ignore_index, several chunk sizes (one chunk, uneven chunks), no_grad evaluation and the model
with `loss_impl: chunked` under torch.compile."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model import Llama, ModelConfig
from model.loss import chunked_lm_head_loss, lm_head_loss, plain_lm_head_loss

VOCAB, PADDED, HIDDEN = 1000, 1024, 64   # 24 padded rows, never targets


def inputs(dtype, tokens=(3, 50), seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(*tokens, HIDDEN, generator=g) * scale).to(dtype)
    weight = (torch.randn(PADDED, HIDDEN, generator=g) * 0.3).to(dtype)
    targets = torch.randint(0, VOCAB, tokens, generator=g)
    return hidden, weight, targets


def loss_and_grads(fn, hidden, weight, targets, **kw):
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    loss = fn(h, w, targets, **kw)
    (loss * 0.7).backward()   # a non-unit incoming gradient, as DeepSpeed's 1/accum scaling
    return loss.detach(), h.grad, w.grad


def max_diffs(a, b):
    a, b = a.double(), b.double()
    abs_diff = (a - b).abs().max().item()
    return abs_diff, abs_diff / b.abs().max().item()


@pytest.mark.parametrize("chunk", [7, 64, 150, 4096])   # uneven, even, one chunk
def test_fp32_matches_plain_to_fp32_rounding(chunk):
    hidden, weight, targets = inputs(torch.float32)
    ref = loss_and_grads(plain_lm_head_loss, hidden, weight, targets)
    got = loss_and_grads(chunked_lm_head_loss, hidden, weight, targets, chunk_tokens=chunk)
    assert got[0].dtype == torch.float32
    for name, g, r in zip(("loss", "dhidden", "dweight"), got, ref):
        _, rel = max_diffs(g, r)
        assert rel < 1e-5, (name, rel)
    # the padded rows are never targets: their only gradient is the softmax's, as in plain
    assert got[2][VOCAB:].abs().max() > 0
    torch.testing.assert_close(got[2][VOCAB:], ref[2][VOCAB:], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("chunk", [16, 4096])
def test_bf16_within_bf16_rounding_of_plain(chunk):
    hidden, weight, targets = inputs(torch.bfloat16, tokens=(4, 64), scale=2.0)
    ref = loss_and_grads(plain_lm_head_loss, hidden, weight, targets)
    got = loss_and_grads(chunked_lm_head_loss, hidden, weight, targets, chunk_tokens=chunk)
    exact = loss_and_grads(plain_lm_head_loss, hidden.double(), weight.double(), targets)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.bfloat16
    # the loss: fp32 math on the same bf16 logits
    assert abs(got[0].item() - ref[0].item()) <= 1e-5 * abs(ref[0].item())
    for name, g, r, e in zip(("dhidden", "dweight"), got[1:], ref[1:], exact[1:]):
        _, rel = max_diffs(g, r)
        assert rel < 2 ** -7, (name, rel)   # bf16 keeps 8 significant bits
        # and no further from the fp64 truth than the plain path is
        err_chunked, err_plain = max_diffs(g, e)[1], max_diffs(r, e)[1]
        assert err_chunked <= 1.5 * err_plain + 2 ** -9, (name, err_chunked, err_plain)


def test_ignore_index_tokens_add_nothing_and_do_not_count():
    hidden, weight, targets = inputs(torch.float32)
    targets[0, :10] = -100
    targets[2, 5] = -100
    ref = loss_and_grads(plain_lm_head_loss, hidden, weight, targets)
    got = loss_and_grads(chunked_lm_head_loss, hidden, weight, targets, chunk_tokens=32)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7)
    assert got[1][0, :10].abs().max() == 0   # ignored tokens get no gradient


def test_no_grad_gives_the_loss_only():
    hidden, weight, targets = inputs(torch.float32)
    with torch.no_grad():
        loss = chunked_lm_head_loss(hidden, weight, targets, chunk_tokens=40)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, plain_lm_head_loss(hidden, weight, targets))


def test_unknown_impl_and_bad_chunk_are_errors():
    hidden, weight, targets = inputs(torch.float32)
    with pytest.raises(ValueError, match="unknown loss impl"):
        lm_head_loss(hidden, weight, targets, impl="liger")
    with pytest.raises(ValueError, match="positive"):
        chunked_lm_head_loss(hidden, weight, targets, chunk_tokens=0)
    with pytest.raises(ValueError, match="loss_chunk_tokens must be positive"):
        ModelConfig(preset="micro", loss_chunk_tokens=0)
    with pytest.raises(ValueError):
        ModelConfig(preset="micro", loss_impl="fused")


def model_grads(dtype, tie: bool, impl: str, compile_backend: str | None = None):
    config = ModelConfig(preset="micro", qk_norm=True, tie_embeddings=tie, loss_impl=impl,
                         loss_chunk_tokens=48)   # 2 x 64 tokens: 3 chunks, the last one short
    torch.manual_seed(0)
    model = Llama(config).to(dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, config.vocab_size, (2, config.seq_len), generator=g)
    y = torch.randint(0, config.vocab_size, (2, config.seq_len), generator=g)
    forward = model if compile_backend is None else torch.compile(model, backend=compile_backend)
    if impl == "plain":   # the trainer's reference: logits out of the model, loss outside
        loss = F.cross_entropy(forward(x).float().flatten(0, 1), y.flatten())
    else:
        loss = forward(x, targets=y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_model_trains_the_same_with_either_loss(dtype, tie):
    ref_loss, ref = model_grads(dtype, tie, "plain")
    loss, got = model_grads(dtype, tie, "chunked")
    assert ("lm_head.weight" in got) == (not tie)
    tol = 1e-5 if dtype == torch.float32 else 1e-5   # the loss is fp32 on the same logits
    assert abs(loss.item() - ref_loss.item()) <= tol * ref_loss.item()
    worst = 0.0
    for name, r in ref.items():
        _, rel = max_diffs(got[name], r)
        worst = max(worst, rel)
        # bf16: the gradient flows back through every layer's bf16 matmuls, so the first
        # rounding difference at the head is seen (not amplified) at the embedding
        assert rel < (1e-5 if dtype == torch.float32 else 2 ** -6), (name, rel)


def test_the_chunked_model_compiles():
    # aot_eager: dynamo traces the autograd.Function (its chunk loop) without code generation
    ref_loss, ref = model_grads(torch.float32, True, "chunked")
    loss, got = model_grads(torch.float32, True, "chunked", compile_backend="aot_eager")
    torch.testing.assert_close(loss, ref_loss)
    for name, r in ref.items():
        torch.testing.assert_close(got[name], r, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_fused_and_in_place_logits_gradients_are_bit_identical(dtype):
    """model.loss.logits_grad: the elementwise form (what torch.compile fuses) against the in-place
    form (eager), on the same fp32 logits, targets at the first and last columns included."""
    from model.loss import logits_grad

    g = torch.Generator().manual_seed(5)
    z = torch.randn(37, PADDED, generator=g) * 4.0
    lse = torch.logsumexp(z, dim=-1)
    t = torch.randint(0, VOCAB, (37, 1), generator=g)
    t[0, 0], t[1, 0] = 0, PADDED - 1
    keep = (torch.rand(37, generator=g) > 0.2).to(torch.float32) / 29.0
    fused = logits_grad(z.clone(), lse, t, keep, dtype, elementwise=True)
    in_place = logits_grad(z.clone(), lse, t, keep, dtype, elementwise=False)
    assert fused.dtype == in_place.dtype == dtype
    assert torch.equal(fused, in_place)
