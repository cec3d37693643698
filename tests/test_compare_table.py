"""The comparison as a pure function of run records: exact numbers, the FPA match rule,
the table text, which figures a grid gets, and the tag names shared with the trainer."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from experiments.compare.figures import (ALL_CELLS_VIEW, QK_NORM_VIEW, SMOOTHING_VIEW, ema,
                                         views_for, write_figures)
from experiments.compare.records import (PARAM_SEED, PARAM_TOTAL_STEPS, PENDING, TAG_ATTENTION,
                                         TAG_QK_NORM, TAG_SMOOTHING, TAG_TOKENS_PER_STEP,
                                         CellAxes, RunRecord)
from experiments.compare.table import compare, format_table, matching_fpa
from experiments.paths import REPO_ROOT

TPS_BIG, TPS_SMALL = 2097152, 262144


def axes(attention="sagebwd", qk_norm=True, smoothing="k", tps=TPS_BIG, variant=None,
         label=None, seed_replica=False) -> CellAxes:
    return CellAxes(attention, qk_norm, smoothing if attention == "sagebwd" else "none", tps,
                    label, variant, seed_replica=seed_replica)


def line(start: float, slope: float, steps: range) -> tuple[tuple[int, float], ...]:
    """Losses that are exact in binary floating point, so sums and means compare with ==."""
    return tuple((s, start + slope * s) for s in steps)


def record(name, cell_axes, *, status="FINISHED", loss=(), eval_loss=(), tokens_per_s=(),
           mfu=(), total=16, diverged_at=None, seed=None) -> RunRecord:
    return RunRecord(name, cell_axes, status, run_id=None if status == PENDING else name,
                     total_steps=total, loss=loss, eval_loss=eval_loss,
                     tokens_per_s=tokens_per_s, mfu=mfu, diverged_at=diverged_at, seed=seed)


def grid() -> list[RunRecord]:
    """A main-like grid; listed out of order on purpose."""
    return [
        record("small-sage", axes(tps=TPS_SMALL), status="RUNNING",
               loss=line(5.0, -0.125, range(1, 9)), total=32),
        record("big-sage-noqk", axes(qk_norm=False), status="FAILED",
               loss=line(4.0, -0.125, range(1, 10)) + ((10, math.nan),)),
        record("big-sage", axes(), loss=line(4.25, -0.125, range(1, 17)),
               eval_loss=((8, 3.5), (16, math.nan))),
        record("big-fpa", axes("fpa"), loss=line(4.0, -0.125, range(1, 17)),
               eval_loss=((8, 3.25), (16, 2.5)), tokens_per_s=((1, 10.0), (2, 4000.0), (3, 2000.0)),
               mfu=((1, 0.5), (2, 0.25))),
        record("small-fpa", axes("fpa", tps=TPS_SMALL), status="RUNNING",
               loss=line(5.0, -0.25, range(1, 13)), total=32),
        record("small-sage-noqk", axes(qk_norm=False, tps=TPS_SMALL), status=PENDING, total=32),
    ]


def test_rows_are_in_paper_order_with_exact_numbers():
    rows = {row.record.name: row for row in compare(grid(), last_k=4)}
    assert list(rows) == ["big-fpa", "big-sage", "big-sage-noqk", "small-fpa", "small-sage",
                          "small-sage-noqk"]
    fpa, sage, noqk = rows["big-fpa"], rows["big-sage"], rows["big-sage-noqk"]
    assert fpa.final_loss == 4.0 - 0.125 * (13 + 14 + 15 + 16) / 4 == 2.1875
    assert (fpa.best_eval_loss, fpa.baseline, fpa.gap) == (2.5, None, None)
    assert (fpa.tokens_per_s, fpa.mfu, fpa.steps_done) == (2000.0, 0.375, 16)
    assert sage.final_loss == 2.4375 and sage.gap == 0.25 and sage.baseline.name == "big-fpa"
    assert sage.best_eval_loss == 3.5                    # the NaN eval is skipped
    assert math.isnan(noqk.final_loss) and math.isnan(noqk.gap)
    assert (noqk.diverged_at, noqk.steps_done) == (10, 10)


def test_gap_uses_the_steps_both_runs_have_logged():
    rows = {row.record.name: row for row in compare(grid(), last_k=4)}
    # small-sage logged steps 1-8 and small-fpa 1-12: compare at steps 5-8 only
    sage_mean = 5.0 - 0.125 * (5 + 6 + 7 + 8) / 4
    fpa_mean = 5.0 - 0.25 * (5 + 6 + 7 + 8) / 4
    assert rows["small-sage"].gap == sage_mean - fpa_mean == 0.8125
    assert rows["small-sage"].final_loss == sage_mean
    pending = rows["small-sage-noqk"]
    assert (pending.final_loss, pending.gap, pending.steps_done, pending.diverged_at) == (
        None, None, None, None)


def test_trainer_tag_marks_divergence_without_a_nan_in_the_history():
    rows = compare([record("a", axes("fpa"), status="FAILED", loss=line(4.0, 0.5, range(1, 4)),
                           diverged_at=4)])
    assert rows[0].diverged_at == 4 and rows[0].final_loss == 5.0


def test_table_text():
    table = format_table(compare(grid(), last_k=4)).splitlines()
    assert table[0] == ("| cell | TPS | attention | QK-norm | smoothing | status | steps | "
                        "train loss | best eval | Δ vs FPA | diverged | tokens/s | MFU |")
    assert table[2:] == [
        "| big-fpa | 2.1M | FPA | on | — | finished | 16/16 | 2.1875 | 2.5000 | baseline | no | 2,000 | 37.5% |",
        "| big-sage | 2.1M | SageBwd | on | k | finished | 16/16 | 2.4375 | 3.5000 | +0.2500 | no | — | — |",
        "| big-sage-noqk | 2.1M | SageBwd | off | k | failed | 10/16 | nan | — | nan | yes, step 10 | — | — |",
        "| small-fpa | 262K | FPA | on | — | running | 12/32 | 2.3750 | — | baseline | no | — | — |",
        "| small-sage | 262K | SageBwd | on | k | running | 8/32 | 4.1875 | — | +0.8125 | no | — | — |",
        "| small-sage-noqk | 262K | SageBwd | off | k | pending | 0/32 | — | — | — | — | — | — |",
    ]


def test_fpa_match_rule():
    fpa_on, fpa_off = record("fpa-on", axes("fpa")), record("fpa-off", axes("fpa", qk_norm=False))
    fpa_small = record("fpa-small", axes("fpa", tps=TPS_SMALL))
    fpa_variant = record("fpa-lr2", axes("fpa", variant="lr2"))
    cells = [fpa_on, fpa_off, fpa_small, fpa_variant]
    # same TPS and variant; the same qk_norm wins over grid order
    assert matching_fpa(record("s", axes(qk_norm=False)), cells) is fpa_off
    assert matching_fpa(record("s", axes(qk_norm=True)), cells) is fpa_on
    assert matching_fpa(record("s", axes(tps=TPS_SMALL, qk_norm=False)), cells) is fpa_small
    assert matching_fpa(record("s", axes(variant="lr2")), cells) is fpa_variant
    assert matching_fpa(record("s", axes(variant="lr3")), cells) is None
    assert matching_fpa(fpa_on, cells) is None
    no_fpa = format_table(compare([record("s", axes(), loss=line(1.0, 0.0, range(1, 3)))]))
    assert "| no FPA cell |" in no_fpa


def test_seed_replicas_match_the_fpa_cell_of_their_seed():
    def replica(attention, seed, **kw):
        return record(f"{attention}-s{seed}", axes(attention, variant=f"s{seed}", seed_replica=True,
                                                   **kw), seed=seed)
    fpa = [replica("fpa", seed) for seed in (0, 1, 2)]
    # seeds given by other labels in another block still pair by the seed itself
    other_label = record("sage-a1", axes(variant="a1", seed_replica=True), seed=1)
    assert matching_fpa(other_label, fpa) is fpa[1]
    assert matching_fpa(replica("sagebwd", 2, smoothing="qk"), fpa) is fpa[2]
    # runs without a variant (an experiment's runs) pair by their logged seed as well
    plain = [record(f"fpa-{seed}", axes("fpa"), seed=seed) for seed in (7, 8)]
    assert matching_fpa(record("sage-8", axes(), seed=8), plain) is plain[1]
    # a variant that sets more than the seed is a cell of its own: no FPA cell to match
    assert matching_fpa(record("sage-lr", axes(variant="lr2"), seed=1), fpa) is None
    assert axes(variant="s1", seed_replica=True).without_seed == axes()
    assert axes(variant="lr2").without_seed == axes(variant="lr2")


def test_a_variant_is_a_seed_replica_only_if_it_sets_nothing_but_the_seed():
    from experiments.compare.store import is_seed_replica

    assert is_seed_replica((("seed", 1),))
    assert not is_seed_replica((("seed", 1), ("optimizer.lr", 0.002)))
    assert not is_seed_replica((("optimizer.lr", 0.002),))
    assert not is_seed_replica(())


def test_paper_small_grid_knows_its_seeds():
    """The plan gives every cell its seed and what its variant sets (paper-small: s0-s2)."""
    from experiments.compare.store import _plan_axes
    from experiments.grid.plan import plan_manifest

    runs = plan_manifest("paper-small", check_paths=False).runs
    assert all(_plan_axes(run).seed_replica for run in runs)
    seeds = {run.name: run.seed for run in runs}
    assert seeds["paper-small-tps128k-fpa-qknorm-s2"] == 2
    assert seeds["paper-small-tps16k-sagebwd-qknorm-qk-s0"] == 0
    cells = {_plan_axes(run).without_seed for run in runs}
    assert len(runs) == 25 and len(cells) == 11


def test_tps_is_written_like_the_paper():
    assert axes(label="2.1m").tps == "2.1M"
    assert axes(tps=TPS_SMALL).tps == "262K"
    assert axes(tps=None, label="128").tps == "128"
    assert axes(tps=None).tps == "?"


def test_last_k_must_be_positive():
    with pytest.raises(ValueError, match="last_k must be at least 1, got 0"):
        compare(grid(), last_k=0)


def test_each_grid_gets_the_figures_it_varies():
    main = [axes("fpa"), axes(qk_norm=True), axes(qk_norm=False)]
    ablation = [axes("fpa"), axes(smoothing="none"), axes(smoothing="k"), axes(smoothing="qk")]
    demo = [axes("fpa"), axes()]
    as_records = lambda cells: [record(str(i), a) for i, a in enumerate(cells)]  # noqa: E731
    assert views_for(as_records(main)) == [QK_NORM_VIEW]
    assert views_for(as_records(ablation)) == [SMOOTHING_VIEW]
    assert views_for(as_records(main + ablation)) == [QK_NORM_VIEW, SMOOTHING_VIEW]
    assert views_for(as_records(demo)) == [ALL_CELLS_VIEW]
    labels = [SMOOTHING_VIEW.label(r) for r in as_records(ablation)]
    assert labels == ["FPA", "SageBwd, no smoothing", "SageBwd, K-smoothing",
                      "SageBwd, QK-smoothing"]
    assert [QK_NORM_VIEW.label(r) for r in as_records(main)] == [
        "FPA", "SageBwd + QK-norm", "SageBwd w/o QK-norm"]


def test_ema_has_one_time_constant_in_steps_and_skips_non_finite():
    smooth = ema(((1, 4.0), (2, 2.0), (3, math.nan), (5, 2.0)), window=1.0)
    after_one = 4.0 - 2.0 * (1 - math.exp(-1))
    assert smooth[:3] == [4.0, after_one, after_one]
    # the gap from step 2 to 5 is three time constants
    assert smooth[3] == pytest.approx(after_one + (2.0 - after_one) * (1 - math.exp(-3)))


def test_figures_are_written_for_partial_grids(tmp_path):
    paths = write_figures(compare(grid(), last_k=4), tmp_path, title="test grid")
    assert [p.name for p in paths] == ["loss-qk-norm.png"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tag_names_match_the_trainer():
    """The comparison reads what launcher.train writes; a rename there must fail here."""
    from launcher.config import load_run_config
    from launcher.tracking import flatten
    from launcher.train import grid_tags

    config = load_run_config(REPO_ROOT / "experiments" / "configs" / "cpu-tiny.yaml")
    names = {TAG_ATTENTION, TAG_QK_NORM, TAG_SMOOTHING, TAG_TOKENS_PER_STEP}
    assert names <= set(grid_tags(config))
    assert grid_tags(config)[TAG_QK_NORM] == "true"
    params = flatten(config.to_dict())
    assert PARAM_TOTAL_STEPS in params and params[PARAM_SEED] == str(config.seed)


def test_the_token_contract_is_its_own_cell_matched_to_the_same_fpa():
    from dataclasses import replace
    token = record("big-sage-token", replace(axes(), quant="token"), loss=line(4.125, -0.125, range(1, 17)))
    block = record("big-sage", replace(axes(), quant="block"), loss=line(4.25, -0.125, range(1, 17)))
    fpa = record("big-fpa", axes("fpa"), loss=line(4.0, -0.125, range(1, 17)))
    rows = {row.record.name: row for row in compare([token, fpa, block], last_k=4)}
    assert list(rows) == ["big-fpa", "big-sage", "big-sage-token"]
    assert rows["big-sage-token"].baseline is fpa and rows["big-sage-token"].gap == 0.125
    text = format_table(list(rows.values()))
    assert "| SageBwd token |" in text and "| SageBwd |" in text


# --- over seeds ----------------------------------------------------------------------------

def seed_run(prefix, attention, seed, final, *, tps=TPS_BIG, qk_norm=True, smoothing="k",
             status="FINISHED", diverged=False):
    """One seed of a cell, as a manifest's seed-only variant s<seed> makes it: eval loss
    final - 0.125 at step 8 and `final` at step 16 (so best eval = final - 0.125)."""
    loss = line(4.0, -0.125, range(1, 10)) + ((10, math.nan),) if diverged else \
        line(4.0, -0.125, range(1, 17))
    return record(f"{prefix}-s{seed}", axes(attention, qk_norm=qk_norm, smoothing=smoothing,
                                            tps=tps, variant=f"s{seed}", seed_replica=True),
                  status=status, loss=loss, seed=seed,
                  eval_loss=((8, final - 0.125),) if diverged else ((8, final - 0.125), (16, final)))


def seed_grid() -> list[RunRecord]:
    """paper-small's shape: 3 seeds of FPA and SageBwd K at both TPS, 3 of SageBwd without
    QK-norm (seed 2 diverges), one seed of SageBwd without smoothing; at the small TPS
    FPA's seed 2 is still running."""
    big, small = dict(tps=TPS_BIG), dict(tps=TPS_SMALL)
    return [
        *[seed_run("big-fpa", "fpa", s, v, **big) for s, v in enumerate([3.0, 3.25, 3.5])],
        *[seed_run("big-sage", "sagebwd", s, v, **big) for s, v in enumerate([3.125, 3.5, 3.5])],
        seed_run("big-sage-noqk", "sagebwd", 0, 3.5, qk_norm=False, **big),
        seed_run("big-sage-noqk", "sagebwd", 1, 3.875, qk_norm=False, **big),
        seed_run("big-sage-noqk", "sagebwd", 2, 3.0, qk_norm=False, status="FAILED",
                 diverged=True, **big),
        seed_run("big-sage-none", "sagebwd", 0, 3.25, smoothing="none", **big),
        seed_run("small-fpa", "fpa", 0, 3.5, **small), seed_run("small-fpa", "fpa", 1, 3.75, **small),
        seed_run("small-fpa", "fpa", 2, 4.0, status="RUNNING", **small),
        *[seed_run("small-sage", "sagebwd", s, v, **small) for s, v in enumerate([3.75, 4.0, 4.5])],
    ]


def sd(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_over_seeds_pairs_each_seed_with_fpa_on_the_same_seed():
    from experiments.compare.over_seeds import seed_cells

    cells = {c.name: c for c in seed_cells(compare(seed_grid(), last_k=4))}
    assert list(cells) == ["big-fpa", "big-sage-none", "big-sage", "big-sage-noqk", "small-fpa",
                           "small-sage"]
    fpa, sage = cells["big-fpa"].final_eval, cells["big-sage"].final_eval
    assert (fpa.seeds, fpa.mean, fpa.gap) == (3, 3.25, None)
    assert fpa.sd == pytest.approx(sd([3.0, 3.25, 3.5])) == pytest.approx(0.25)
    # by hand: gaps 3.125-3.0, 3.5-3.25, 3.5-3.5 = 0.125, 0.25, 0; mean 0.125; their sd is
    # sqrt((0 + 0.125² + 0.125²) / 2) = 0.125, so s.e. = 0.125 / sqrt(3)
    assert sage.mean == pytest.approx((3.125 + 3.5 + 3.5) / 3)
    assert sage.sd == pytest.approx(sd([3.125, 3.5, 3.5]))
    assert (sage.gap, sage.paired_seeds) == (0.125, 3)
    assert sage.gap_se == pytest.approx(0.125 / math.sqrt(3))
    assert cells["big-sage"].best_eval == pytest.approx(sage.mean - 0.125)


def test_over_seeds_leaves_a_diverged_seed_out_and_flags_it():
    from experiments.compare.over_seeds import format_seed_table, seed_cells

    cells = seed_cells(compare(seed_grid(), last_k=4))
    noqk = next(c for c in cells if c.name == "big-sage-noqk")
    assert [r.record.seed for r in noqk.diverged] == [2] and len(noqk.counted) == 2
    # seeds 0 and 1 only: gaps 3.5-3.0 and 3.875-3.25 = 0.5 and 0.625
    assert noqk.final_eval.gap == 0.5625 and noqk.final_eval.mean == (3.5 + 3.875) / 2
    assert noqk.final_eval.gap_se == pytest.approx(sd([0.5, 0.625]) / math.sqrt(2)) == 0.0625
    lines = format_seed_table(cells).splitlines()
    assert lines[0] == ("| cell | TPS | attention | QK-norm | smoothing | seeds | final eval | sd | "
                        "best eval | Δ vs FPA | s.e. | Δ / s.e. | diverged |")
    assert lines[2:] == [
        "| big-fpa | 2.1M | FPA | on | — | 3/3 | 3.2500 | 0.2500 | 3.1250 | baseline | — | — | no |",
        "| big-sage-none | 2.1M | SageBwd | on | none | 1/1 | 3.2500 | — | 3.1250 | +0.2500 | — | — | no |",
        "| big-sage | 2.1M | SageBwd | on | k | 3/3 | 3.3750 | 0.2165 | 3.2500 | +0.1250 | 0.0722 | +1.7 | no |",
        "| big-sage-noqk | 2.1M | SageBwd | off | k | 2/3 | 3.6875 | 0.2652 | 3.5625 | +0.5625 | 0.0625 | +9.0 | "
        "**yes**, 1 of 3: seed 2 at step 10 (left out) |",
        "| small-fpa | 262K | FPA | on | — | 2/3 | 3.6250 | 0.1768 | 3.5000 | baseline | — | — | no |",
        "| small-sage | 262K | SageBwd | on | k | 3/3 | 4.0833 | 0.3819 | 3.9583 | +0.2500 (2 of 3 seeds "
        "paired) | 0.0000 | — | no |",
    ]


def test_single_seed_cells_show_the_gap_without_a_standard_error():
    from experiments.compare.over_seeds import has_several_seeds, seed_cells

    cells = {c.name: c for c in seed_cells(compare(seed_grid(), last_k=4))}
    none = cells["big-sage-none"].final_eval
    assert (none.seeds, none.gap, none.gap_se, none.sd) == (1, 0.25, None, None)
    assert has_several_seeds(list(cells.values()))
    # the demo: one run per cell, nothing to pool
    demo = [record("fpa", axes("fpa"), loss=line(1.0, 0.0, range(1, 3)), seed=1337),
            record("sage", axes(), loss=line(1.0, 0.0, range(1, 3)), seed=1337)]
    assert not has_several_seeds(seed_cells(compare(demo)))


def test_runs_without_a_variant_pool_by_their_logged_seed():
    """An experiment's runs (the seed study's): no variant, one `seed` param each."""
    from experiments.compare.over_seeds import seed_cells

    runs = [record(f"{name}-seed{seed}", axes(attention), seed=seed,
                   loss=line(1.0, 0.0, range(1, 3)), eval_loss=((2, value),))
            for name, attention, values in (("fpa", "fpa", (2.0, 2.5)), ("sagebwd-k", "sagebwd", (2.25, 2.5)))
            for seed, value in zip((1337, 1338), values)]
    duplicate = record("sagebwd-k-seed1338-retry", axes(), seed=1338, loss=line(1.0, 0.0, range(1, 3)),
                       eval_loss=((2, 9.0),))
    cells = {c.name: c for c in seed_cells(compare(runs + [duplicate]))}
    assert list(cells) == ["fpa-seed", "sagebwd-k-seed"]
    sage = cells["sagebwd-k-seed"]
    assert (sage.final_eval.gap, sage.final_eval.paired_seeds) == (0.125, 2)
    assert sage.notes == ("sagebwd-k-seed1338-retry has seed 1338 like sagebwd-k-seed1338: left out of "
                          "the over-seeds table",)


def test_figures_draw_one_curve_per_cell_over_its_seeds(tmp_path):
    from experiments.compare.figures import _band, _seeds_suffix

    rows = compare(seed_grid(), last_k=4)
    # seeds share a label (so a colour and a curve); a seed-only variant is not named
    labels = {QK_NORM_VIEW.label(row.record) for row in rows if QK_NORM_VIEW.selects(row.record)}
    assert labels == {"FPA", "SageBwd + QK-norm", "SageBwd w/o QK-norm"}
    assert SMOOTHING_VIEW.label(record("x", axes(variant="lr2"))) == "SageBwd, K-smoothing [lr2]"
    noqk = [row for row in rows if row.record.name.startswith("big-sage-noqk")]
    assert _seeds_suffix(noqk) == " (mean of 2 seeds; seed 2 diverged at step 10)"
    small_fpa = [row for row in rows if row.record.name.startswith("small-fpa")]
    assert _seeds_suffix(small_fpa) == " (mean of 3 seeds, 1 running)"
    assert _band([{1: 1.0, 2: 2.0, 3: 5.0}, {2: 4.0, 3: math.nan}]) == ([2], [3.0], [2.0], [4.0])
    # both views of the paper's grid: Figure 1 and the smoothing ablation, its own PNG
    paths = write_figures(rows, tmp_path, title="seeds")
    assert [p.name for p in paths] == ["loss-qk-norm.png", "loss-smoothing.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


# --- the export -----------------------------------------------------------------------------

def long_grid() -> list[RunRecord]:
    """Long noisy curves (so thinning matters), runs at different progress, a diverged seed,
    a pending cell and the medians, on top of the seed grid."""
    def noisy(start, steps, seed):
        return tuple((s, start - s / 1000 + ((s * 7919 + seed * 104729) % 1000) / 4096)
                     for s in steps)
    runs = [replace(r, loss=noisy(4.0 + i / 8, range(1, 2049), i),
                    tokens_per_s=tuple((s, 1000.0 + s % 7) for s in range(1, 50)),
                    mfu=((1, 0.5), (2, 0.25), (3, 0.375)))
            for i, r in enumerate(seed_grid())]
    runs[-1] = replace(runs[-1], loss=runs[-1].loss[:1500], status="RUNNING")   # behind its FPA
    noqk = next(i for i, r in enumerate(runs) if r.name == "big-sage-noqk-s2")
    runs[noqk] = replace(runs[noqk], loss=runs[noqk].loss[:999] + ((1000, math.nan),), diverged_at=None)
    return runs + [record("small-sage-noqk", axes(qk_norm=False, tps=TPS_SMALL), status=PENDING)]


def test_export_round_trip_gives_the_same_tables(tmp_path):
    from experiments.compare.export import MAX_CURVE_POINTS, read_export, write_export
    from experiments.compare.over_seeds import format_seed_table, seed_cells

    rows = compare(long_grid(), last_k=20)
    path = write_export(rows, tmp_path / "grid.json", scope="grid test@cpu",
                        source={"tracking_uri": "sqlite:///x.db", "experiment": "e"}, last_k=20,
                        notes=["a note"])
    data = read_export(path)
    assert (data.scope, data.last_k, data.notes) == ("grid test@cpu", 20, ["a note"])
    assert all(len(r.loss) <= MAX_CURVE_POINTS + 2 * 20 for r in data.records)
    assert max(len(r.loss) for r in data.records) >= MAX_CURVE_POINTS - 10
    again = compare(data.records, last_k=20)
    assert format_table(again) == format_table(rows)
    assert format_seed_table(seed_cells(again)) == format_seed_table(seed_cells(rows))
    assert [r.seed for r in data.records] == [row.record.seed for row in rows]
    assert format_table(compare(data.records, last_k=5)) == format_table(compare(long_grid(), last_k=5))
    import json
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} is not strict JSON"))
    assert path.stat().st_size < 150_000
