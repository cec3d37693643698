"""tools/zero_step_ops.py on the CPU at its smallest size (1 layer): the real DeepSpeed engine's
per-step op counts, host reads and device syncs, one table line per variant."""
from __future__ import annotations

import json

import pytest
import torch

from tools import zero_step_ops

VARIANTS = ["manual", "zero1", "zero1-noclip", "zero1-fp32acc", "zero1-timer"]


def cells(text: str) -> dict[str, list[str]]:
    """The markdown table's lines -> {variant: its cells}."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        values = [c.strip() for c in line.strip("|").split("|")]
        rows[values[0]] = dict(zip(head, values))
    return rows


def test_one_layer_table(tmp_path, capsys):
    out = tmp_path / "ops.json"
    argv = ["--layers", "1", "--variants", *VARIANTS, "--time-steps", "1", "--json", str(out)]
    threads = torch.get_num_threads()
    assert zero_step_ops.main(argv) == 0
    assert torch.get_num_threads() == threads   # left as found (tests/test_train_host_sync.py's golden)
    table = cells(capsys.readouterr().out)
    assert list(table) == VARIANTS
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert all(r["error"] is None and r["params"] == 11 for r in rows.values())
    for name, r in rows.items():   # the table prints the rows' counts
        assert table[name]["step: engine ops"] == str(r["step_engine"])
        assert table[name]["host reads"] == str(r["host_reads"])
    manual, zero1 = rows["manual"], rows["zero1"]
    # the stand-in: no hooks, no reads, no DeepSpeed; one grad cast per parameter in its step
    assert manual["backward_engine"] == 0 and manual["host_reads"] == 0 and manual["python_calls"] == 0
    assert manual["top_ops"]["_to_copy"] == 11 and manual["top_ops"]["_fused_adamw_"] == 2
    # DeepSpeed's ZeRO-1: work in its gradient hooks, the clipping's two reads (as
    # tests/test_train_host_sync.py counts them), no device sync (DeepSpeed's throughput timer off;
    # on, as DeepSpeed's default, it syncs twice a step)
    assert zero1["optimizer"] == "DeepSpeedZeroOptimizer"
    assert zero1["backward_engine"] > 0 and zero1["step_engine"] > manual["step_engine"]
    assert zero1["host_reads"] == 2 and zero1["reads_at"] == {"step:__bool__": 2}
    assert zero1["device_syncs"] == 0
    timer = rows["zero1-timer"]
    assert timer["device_syncs"] == 2 and set(timer["syncs_at"]) == {
        "forward:deepspeed.utils.timer.start", "step:deepspeed.utils.timer.stop"}
    assert rows["zero1-noclip"]["host_reads"] == 0
    assert rows["zero1-fp32acc"]["optimizer"] == "BF16_Optimizer"
    # the model's backward is the same whatever the engine
    assert abs(zero1["backward_autograd"] - manual["backward_autograd"]) <= 2


@pytest.mark.parametrize("argv,message", [
    (["--layers", "0"], "--layers 0: give a count of at least 1"),
    (["--steps", "0"], "--steps 0: give a count of at least 1"),
    (["--warmup", "-1"], "--warmup -1: give a count of at least 0"),
])
def test_rejects_counts_below_their_least(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        zero_step_ops.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
