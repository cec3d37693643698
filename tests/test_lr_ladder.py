"""experiments.lr_ladder: the rule that picks the small grid's learning rate (docs/results.md)."""
import shutil

import yaml

from experiments.lr_ladder import Rung, first_spike, pick, write_lr
from experiments.paths import REPO_ROOT


def rung(lr, final, status="FINISHED", diverged=None, spike=None):
    return Rung(lr=lr, name=f"lr{lr}", status=status, final_eval=final, best_eval=final,
                diverged_at=diverged, spike_at=spike)


def test_a_spike_is_a_rise_over_the_running_minimum_after_warmup():
    loss = ((0, 11.0), (8, 12.0), (16, 6.0), (24, 6.4), (32, 5.0), (40, 5.6), (48, 4.0))
    assert first_spike(loss, warmup_steps=12) == 40        # 5.6 > 5.0 + 0.5; step 8's rise is warmup
    assert first_spike(loss[:5], warmup_steps=12) is None
    assert first_spike(((0, 5.0), (16, float("nan"))), warmup_steps=8) == 16


def test_pick_takes_the_largest_stable_lr_near_the_best():
    rungs = [rung(5e-4, 4.30), rung(1e-3, 4.10), rung(2e-3, 4.00), rung(4e-3, 4.015),
             rung(8e-3, 3.99, spike=40), rung(1.6e-2, None, status="FAILED", diverged=30)]
    assert pick(rungs).lr == 4e-3            # within 0.02 of 4.00 (8e-3 spiked, 1.6e-2 diverged)
    assert pick([*rungs[:3], rung(4e-3, 4.03)]).lr == 2e-3    # 4e-3 is stable but 0.03 worse
    assert pick([rung(1e-3, None, status="FAILED")]) is None


def test_write_lr_replaces_the_base_configs_lr_and_its_comment(tmp_path):
    base = tmp_path / "paper-small.yaml"
    shutil.copy(REPO_ROOT / "experiments/manifests/base/paper-small.yaml", base)
    before = yaml.safe_load(base.read_text())
    write_lr(base, 0.004, "chosen by the ladder\nsecond line")
    after = yaml.safe_load(base.read_text())
    assert after["optimizer"]["lr"] == 0.004
    assert {k: v for k, v in after.items() if k != "optimizer"} == \
        {k: v for k, v in before.items() if k != "optimizer"}
    text = base.read_text()
    assert "  # chosen by the ladder\n  # second line\n  lr: 0.004\n" in text and "PROVISIONAL" not in text


def test_the_command_names_a_missing_manifest_or_store(tmp_path, capsys):
    from experiments.lr_ladder import main

    assert main(["--manifest", "no-such-ladder"]) == 2
    assert "no-such-ladder.yaml does not exist" in capsys.readouterr().err
    assert main(["--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert "there is no MLflow store" in capsys.readouterr().err
