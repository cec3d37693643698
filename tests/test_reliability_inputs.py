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
