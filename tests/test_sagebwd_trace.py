"""The tracer CLI: the sigma table and captured-tensor traces."""
import json
import subprocess
import sys

import pytest
import torch

from sagebwd.trace import main


def test_sigma_table_cli_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sigma.json"
    assert main(["sigma", "--seq", "128", "--head-dim", "64", "--sigmas", "1", "8", "--block-q", "32",
                 "--block-kv", "16", "--causal", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| sigma_QK | O cos | O rel-L2 | dQ cos" in text and "\n| 8 |" in text
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"1.0", "8.0"}
    assert rows["8.0"]["dq"]["rel_l2"] > rows["1.0"]["dq"]["rel_l2"] > 0
    assert rows["1.0"]["dp"]["rel_l2"] == 0.0


def test_sigma_table_for_the_token_contract(capsys):
    assert main(["sigma", "--seq", "128", "--head-dim", "64", "--sigmas", "1", "--block-q", "32",
                 "--block-kv", "16", "--causal", "--quant", "token"]) == 0
    text = capsys.readouterr().out
    assert "quant=token" in text and "\n| 1 |" in text
    with pytest.raises(SystemExit):
        main(["sigma", "--seq", "128", "--head-dim", "64", "--quant", "fp8"])


def test_tensors_trace_from_a_saved_dict(tmp_path, capsys):
    path = tmp_path / "layer.pt"
    g = torch.Generator().manual_seed(0)
    torch.save({n: torch.randn(1, 2, 128, 64, generator=g) * 3 for n in ("q", "k", "v", "do")}, path)
    assert main(["tensors", "--input", str(path), "--block-q", "64", "--block-kv", "64"]) == 0
    text = capsys.readouterr().out
    assert "| metric | delta | P | dP | dS | O | dQ | dK | dV |" in text


def test_cli_rejects_bad_input_clearly(tmp_path, capsys):
    assert main(["sigma", "--seq", "100", "--head-dim", "64"]) == 2
    assert "not a multiple of block_q=128" in capsys.readouterr().err
    assert main(["sigma", "--seq", "192", "--head-dim", "64", "--block-q", "64", "--quant", "token"]) == 2
    assert "the 'token' contract's forward quantises P and V per 128-key tile" in capsys.readouterr().err
    assert main(["sigma", "--seq", "128", "--head-dim", "80"]) == 2
    assert "--head-dim 80 is not supported" in capsys.readouterr().err
    assert main(["tensors", "--input", str(tmp_path / "missing.pt")]) == 2
    assert "no such file" in capsys.readouterr().err
    torch.save({"q": torch.zeros(1)}, tmp_path / "partial.pt")
    assert main(["tensors", "--input", str(tmp_path / "partial.pt")]) == 2
    assert "lacks ['k', 'v', 'do']" in capsys.readouterr().err


def test_module_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "sagebwd.trace", "sigma", "--seq", "128", "--head-dim", "64",
                        "--sigmas", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| 1 |" in r.stdout
