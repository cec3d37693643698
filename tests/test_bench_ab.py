"""benchmarks/ab.py: two trees run alternately, one table of their times (CPU: a stand-in benchmark)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.ab import compare, main, measurements, source_tree

REPO = Path(__file__).resolve().parent.parent

# A stand-in for benchmarks.attention in each tree: its kernel and table times come from the tree's
# own TIMES file, and every run appends to the tree's LOG so the test can see the order.
STAND_IN = '''
import json, sys
from pathlib import Path
here = Path(__file__).parent
scale = float((here / "TIMES").read_text())
with open(here / "LOG", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
out = sys.argv[sys.argv.index("--json") + 1]
json.dump({"kernel_times": [{"impl": "sage-token", "shape": [8, 16, 4096, 64], "causal": True,
                             "ms": {"_dkdv_ws_kernel": 1.2 * scale, "_dq_kernel": 1.0}}],
           "bench": [{"shape": [8, 16, 4096, 64], "causal": True, "mode": "fwd+bwd",
                      "sage-token": {"ms": 3.3 * scale}, "CUDNN": {"ms": 2.5}, "FA4": {"ms": None}}]},
          open(out, "w"))
'''


def tree(tmp_path: Path, name: str, scale: float) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "standin_bench.py").write_text(STAND_IN)
    (d / "TIMES").write_text(str(scale))
    return d


def test_alternates_the_trees_and_reports_heads_change(tmp_path, capsys):
    base, head = tree(tmp_path, "base", 1.0), tree(tmp_path, "head", 0.9)
    out = tmp_path / "ab.json"
    code = main([str(base), "--head", str(head), "--rounds", "2", "--module", "standin_bench", "--json", str(out),
                 "--", "--no-bench", "--kernel-times"])
    assert code == 0
    printed = capsys.readouterr().out
    # base first in odd rounds, head first in even ones
    assert printed.index("round 1/2: base") < printed.index("round 1/2: head") < printed.index("round 2/2: head") \
        < printed.index("round 2/2: base")
    for d in (base, head):   # each tree ran twice, with the benchmark's arguments and its own --json
        runs = (d / "LOG").read_text().splitlines()
        assert len(runs) == 2 and all(r.startswith("--no-bench --kernel-times --json ") for r in runs)
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    dkdv = rows["sage-token (8, 16, 4096, 64) causal _dkdv_ws_kernel"]
    assert dkdv["base"] == [1.2, 1.2] and dkdv["change"] == pytest.approx(-0.1)
    assert rows["sage-token (8, 16, 4096, 64) causal _dq_kernel"]["change"] == pytest.approx(0.0)
    assert rows["sage-token (8, 16, 4096, 64) causal all kernels"]["base"] == [pytest.approx(2.2)] * 2
    assert rows["sage-token (8, 16, 4096, 64) causal all kernels"]["change"] == pytest.approx(-0.12 / 2.2)
    assert rows["sage-token (8, 16, 4096, 64) causal fwd+bwd"]["change"] == pytest.approx(-0.1)
    assert "CUDNN (8, 16, 4096, 64) causal fwd+bwd" in rows and not any(n.startswith("FA4") for n in rows)
    assert "| sage-token (8, 16, 4096, 64) causal _dkdv_ws_kernel | 1.200, 1.200 | 1.080, 1.080 | -10.0% |" in printed


def test_reads_a_real_benchmark_json():
    m = measurements(json.loads((REPO / "docs/measurements/bench-exp2fold-h100.json").read_text()))
    assert m["sage-token (8, 16, 4096, 64) causal _dkdv_ws_kernel"] == pytest.approx(1.170, abs=5e-4)
    assert m["sage-token (8, 16, 4096, 64) causal fwd+bwd"] == pytest.approx(3.253, abs=5e-4)
    assert m["CUDNN (8, 8, 4096, 128) full fwd+bwd"] == pytest.approx(4.100, abs=5e-4)


def test_a_revision_is_extracted_with_git_archive(tmp_path):
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    d = source_tree("HEAD", tmp_path, "base")
    assert (d / "benchmarks" / "ab.py").is_file() or (d / "benchmarks" / "attention.py").is_file()
    assert not (d / ".git").exists()
    with pytest.raises(SystemExit, match="neither a directory nor a git revision"):
        source_tree("no-such-revision-xyz", tmp_path, "bad")


def test_compare_keeps_only_rows_every_run_has(capsys):
    rows = compare([{"a": 1.0, "b": 2.0}], [{"a": 0.5, "c": 1.0}])
    assert [r["name"] for r in rows] == ["a"] and rows[0]["change"] == pytest.approx(-0.5)
    assert "not in every run, left out: b; c" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["HEAD", "--rounds", "0", "--", "--kernel-times"], "--rounds 0: at least 1"),
    (["HEAD", "--", "--kernel-times", "--json", "x.json"], "give --json before --"),
    (["HEAD", "--benchmark", "trainer", "--"], "argument --benchmark: invalid choice: 'trainer'"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_cli_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "benchmarks.ab", "--help"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and "git revisions or directories" in out.stdout


def test_a_failing_benchmark_is_reported_with_its_tree_and_output(tmp_path):
    base = tree(tmp_path, "base", 1.0)
    (base / "TIMES").write_text("not a number")   # the stand-in then fails with a ValueError
    with pytest.raises(SystemExit, match=r"(?s)the benchmark failed in .*base \(exit 1\).*ValueError"):
        main([str(base), "--head", str(tree(tmp_path, "head", 1.0)), "--module", "standin_bench", "--",
              "--kernel-times"])


# A stand-in for benchmarks.train_throughput: one good row scaled by the tree's TIMES, one failed row.
TRAINER_STAND_IN = '''
import json, sys
from pathlib import Path
scale = float((Path(__file__).parent / "TIMES").read_text())
out = sys.argv[sys.argv.index("--out") + 1]
row = {"config": "experiments/configs/gpu-124m.yaml", "seq_len": 4096, "micro_batch": 4, "attention": "sagebwd-token",
       "compile": "default", "loss": "chunked", "engine": "deepspeed", "step_ms": 60.0 * scale, "error": None}
json.dump({"rows": [row, {**row, "attention": "fpa", "step_ms": None, "error": "OOM"}]}, open(out, "w"))
'''


def test_a_trainer_ab_compares_step_times(tmp_path, capsys):
    """--benchmark train_throughput hands each run --out and compares the rows' step times (a failed row
    left out); the trainer's own --out after -- is refused like --json."""
    base, head = tree(tmp_path, "base", 1.0), tree(tmp_path, "head", 0.95)
    for d in (base, head):
        (d / "standin_trainer.py").write_text(TRAINER_STAND_IN)
    out = tmp_path / "ab.json"
    assert main([str(base), "--head", str(head), "--rounds", "1", "--benchmark", "train_throughput",
                 "--module", "standin_trainer", "--json", str(out), "--", "--compile", "default"]) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    step = rows["gpu-124m 4096x4 sagebwd-token compile=default loss=chunked engine=deepspeed step"]
    assert step["base"] == [60.0] and step["change"] == pytest.approx(-0.05) and len(rows) == 1
    assert json.loads(out.read_text())["benchmark"] == "train_throughput"
    with pytest.raises(SystemExit):
        main(["HEAD", "--benchmark", "train_throughput", "--", "--out", "x.json"])
    assert "--out after --" in capsys.readouterr().err


def test_reads_a_real_trainer_json():
    m = measurements(json.loads((REPO / "docs/measurements/trainer-h100-1127d-ab2-direct.json").read_text()))
    assert m["gpu-124m 4096x4 sagebwd-token compile=default loss=chunked engine=deepspeed step"] == \
        pytest.approx(61.91, abs=5e-3)
