"""sagebwd.attention stops bad inputs before anything reads them (issue 26)."""
from __future__ import annotations

import pytest
import torch

import sagebwd
from sagebwd.validate import SageBwdInputError

GOOD = torch.zeros(1, 1, 128, 64)


@pytest.mark.parametrize("q, k, v, message", [
    ([[1.0]], GOOD, GOOD, "q must be a torch.Tensor, got list"),
    (GOOD, None, GOOD, "k must be a torch.Tensor, got NoneType"),
    (torch.zeros(1, 1, 0, 64), torch.zeros(1, 1, 0, 64), torch.zeros(1, 1, 0, 64),
     "sequence length 0: q, k, v hold no tokens"),
    (torch.zeros(0, 1, 128, 64), torch.zeros(0, 1, 128, 64), torch.zeros(0, 1, 128, 64),
     "are empty"),
])
def test_bad_inputs_raise_sagebwd_input_error(q, k, v, message):
    with pytest.raises(SageBwdInputError, match=message):
        sagebwd.attention(q, k, v, causal=True)


def test_resume_may_change_how_the_model_is_computed_not_what_it_is(tmp_path):
    """The kernel choice and the loss's chunking compute the same model (to rounding), and when Python collects
    garbage changes no number, so a resume may change them; the quantisation contract changes the model, so it is
    refused."""
    from launcher.config import build_run_config
    from launcher.overrides import ConfigError
    from launcher.run_identity import check_resume, identity

    def run(gc_every=0, **model):
        # seq 128: the token contract's forward tiles are 128 keys
        return build_run_config({"model": {"preset": "micro", "attention": "sagebwd", "smoothing": "k", "seq_len": 128,
                                           **model},
                                 "train": {"steps": 4, "micro_batch_size": 2, "tokens_per_step": 256,
                                           "gc_every": gc_every}})
    saved = identity(run(), run_name="r", run_id="x", tracking_uri="sqlite:///m.db")
    ok = check_resume(saved, run(sagebwd_kernels="triton", loss_impl="chunked", gc_every=50), run_name="r",
                      tracking_uri="sqlite:///m.db", checkpoint=tmp_path)
    assert set(ok.changed) == {"model.sagebwd_kernels", "model.loss_impl", "train.gc_every"}
    with pytest.raises(ConfigError, match="model.quant: block in the checkpoint, now token"):
        check_resume(saved, run(quant="token"), run_name="r", tracking_uri="sqlite:///m.db", checkpoint=tmp_path)
