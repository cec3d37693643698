"""benchmarks/pairs.py: side-by-side trainer processes in alternating order, the ratio with its error (CPU: a stand-in
trainer benchmark)."""
import json

import pytest

from benchmarks.pairs import main, pair_ratios, summary

# A stand-in for benchmarks.train_throughput: the step times of the attentions it is given, in that order, moved by a
# per-process offset (the n-th process of the test: a count in COUNT), one row failed; it logs its arguments.
STAND_IN = '''
import json, os, sys
from pathlib import Path
here = Path(os.environ["PAIRS_STAND_IN_DIR"])
count = here / "COUNT"
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
with open(here / "LOG", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
i = sys.argv.index("--attention")
attentions = sys.argv[i + 1:i + 3]
step = {"fpa": 54.0, "sagebwd-token": 56.0}
row = {"config": "experiments/configs/gpu-124m.yaml", "seq_len": 4096, "micro_batch": 4, "compile": "reduce-overhead",
       "loss": "chunked", "engine": "deepspeed", "error": None}
rows = [{**row, "attention": a, "step_ms": step[a] * (1 + 0.01 * n * (a == "sagebwd-token"))} for a in attentions]
rows.append({**row, "loss": "plain", "attention": attentions[0], "step_ms": None, "error": "OOM"})
json.dump({"environment": {"device": "stand-in"}, "args": {"attention": attentions}, "rows": rows},
          open(sys.argv[sys.argv.index("--out") + 1], "w"))
'''


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    (tmp_path / "standin_pairs.py").write_text(STAND_IN)
    monkeypatch.setenv("PAIRS_STAND_IN_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def test_pairs_alternate_the_order_and_give_the_ratio_with_its_error(stand_in, capsys):
    out = stand_in / "pairs.json"
    assert main(["--pairs", "3", "--module", "standin_pairs", "--json", str(out), "--", "--steps", "20"]) == 0
    log = (stand_in / "LOG").read_text().splitlines()
    assert [line.split("--attention ")[1].split(" --out")[0] for line in log] == \
        ["fpa sagebwd-token", "sagebwd-token fpa", "fpa sagebwd-token"]
    assert all(line.startswith("--steps 20 ") for line in log)
    result = json.loads(out.read_text())
    (name, row), = result["rows"].items()   # the failed "plain" row is left out
    assert name == "gpu-124m 4096x4 compile=reduce-overhead loss=chunked engine=deepspeed"
    expected = [54.0 / (56.0 * (1 + 0.01 * n)) for n in range(3)]
    assert row["ratios"] == pytest.approx(expected)
    assert row["summary"]["mean"] == pytest.approx(sum(expected) / 3)
    assert row["summary"]["low"] < row["summary"]["mean"] < row["summary"]["high"]
    printed = capsys.readouterr().out
    assert "| 2 (sagebwd-token first) |" in printed and "**mean of 3**" in printed


def test_summary_is_students_interval():
    s = summary([0.98, 0.94, 0.96, 0.95])
    assert s["mean"] == pytest.approx(0.9575) and s["se"] == pytest.approx(s["sd"] / 2)
    assert s["high"] - s["mean"] == pytest.approx(3.182 * s["se"])   # t at 97.5%, 3 degrees of freedom


def test_a_row_missing_in_one_pair_is_left_out(capsys):
    row = {"config": "c.yaml", "seq_len": 1, "micro_batch": 1, "compile": "none", "loss": "plain", "engine": "manual",
           "error": None}
    good = {"rows": [{**row, "attention": "fpa", "step_ms": 2.0},
                     {**row, "attention": "sagebwd-token", "step_ms": 4.0}]}
    failed = {"rows": [{**row, "attention": "fpa", "step_ms": 2.0},
                       {**row, "attention": "sagebwd-token", "step_ms": None, "error": "OOM"}]}
    assert pair_ratios([good, good], "fpa", "sagebwd-token")["c 1x1 compile=none loss=plain engine=manual"][
        "ratios"] == [0.5, 0.5]
    assert pair_ratios([good, failed], "fpa", "sagebwd-token") == {}
    assert "left out" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--pairs", "1"], "at least 2"),
    (["--baseline", "fpa", "--candidate", "fpa"], "give two attentions"),
    (["--", "--attention", "fpa"], "--attention after --"),
    (["--", "--out", "x.json"], "--out after --"),
    (["--candidate", "flash"], "invalid choice"),
])
def test_bad_arguments_are_refused_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_combine_summarises_earlier_runs_pairs_together(stand_in, capsys):
    """--combine: the pairs of two earlier runs (3 + 2) in one table, each pair's order from its own arguments."""
    first, second = stand_in / "a.json", stand_in / "b.json"
    assert main(["--pairs", "3", "--module", "standin_pairs", "--json", str(first), "--", "--steps", "20"]) == 0
    assert main(["--pairs", "2", "--module", "standin_pairs", "--json", str(second), "--", "--steps", "20"]) == 0
    capsys.readouterr()
    both = stand_in / "both.json"
    assert main(["--combine", str(first), str(second), "--json", str(both)]) == 0
    runs = [json.loads(p.read_text())["rows"] for p in (first, second)]
    (name, row), = json.loads(both.read_text())["rows"].items()
    assert row["ratios"] == runs[0][name]["ratios"] + runs[1][name]["ratios"]
    assert row["summary"] == pytest.approx(summary(row["ratios"]))
    printed = capsys.readouterr().out
    assert "| 4 (fpa first) |" in printed and "| 5 (sagebwd-token first) |" in printed and "**mean of 5**" in printed
    again = stand_in / "again.json"   # a combined file combines again, to the same pairs
    assert main(["--combine", str(both), "--json", str(again)]) == 0
    assert json.loads(again.read_text())["rows"] == json.loads(both.read_text())["rows"]


def test_combine_refuses_runs_of_another_comparison_or_unreadable_files(stand_in, capsys):
    first, other = stand_in / "a.json", stand_in / "other.json"
    assert main(["--pairs", "2", "--module", "standin_pairs", "--json", str(first), "--", "--steps", "20"]) == 0
    assert main(["--pairs", "2", "--module", "standin_pairs", "--json", str(other), "--", "--steps", "40"]) == 0
    with pytest.raises(SystemExit, match="benchmark_args differ .* combine runs of one comparison only"):
        main(["--combine", str(first), str(other)])
    with pytest.raises(SystemExit, match="not a readable benchmarks.pairs --json file"):
        main(["--combine", str(first), str(stand_in / "missing.json")])
    (stand_in / "plain.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a benchmarks.pairs --json file"):
        main(["--combine", str(stand_in / "plain.json")])
    with pytest.raises(SystemExit):
        main(["--combine", str(first), "--", "--steps", "20"])
    assert "runs nothing" in capsys.readouterr().err
