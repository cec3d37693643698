"""prepare: counts, EOT, meta.json and its hashes, the split, parallel = serial, resume after
--max-chunks or SIGKILL, verify, and clear errors on bad input."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken

from data_prep.assets import fetch_gpt2_ranks
from data_prep.cli import main as cli_main
from data_prep.config import make_prepare_config
from data_prep.errors import DataPrepError
from data_prep.files import sha256_file
from data_prep.loader import TokenDataset
from data_prep.meta import load_meta
from data_prep.prepare import check_fits_uint16, prepare
from data_prep.tokenizer import EOT_TOKEN, default_assets_dir, gpt2_encoding

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ranks() -> Path:
    assets = default_assets_dir()
    return fetch_gpt2_ranks(assets, assets / "downloads")


@pytest.fixture(scope="module")
def enc(ranks):
    return gpt2_encoding(ranks)


def make_corpus(root: Path, n_txt: int = 6, n_jsonl: int = 5) -> list[str]:
    """A small mixed corpus; returns its documents in source order (sorted paths, then lines)."""
    root.mkdir(parents=True, exist_ok=True)
    docs = {}
    for i in range(n_txt):
        docs[f"a{i:02d}.txt"] = [f"Document {i}. " + "Some words that repeat. " * (i + 1) + "\nÄ second line ünïcode."]
    lines = [f"Line document {j}: " + "more text " * j for j in range(n_jsonl)]
    docs["b.jsonl"] = lines
    (root / "b.jsonl").write_text("".join(json.dumps({"text": t, "id": j}) + "\n" for j, t in enumerate(lines)))
    for name, (text,) in ((k, v) for k, v in docs.items() if k.endswith(".txt")):
        (root / name).write_text(text)
    rows = ["Parquet row one.", "Parquet row two, a bit longer than the first."]
    pq.write_table(pa.table({"text": rows}), root / "c.parquet")
    docs["c.parquet"] = rows
    (root / "notes.md").write_text("not a document")  # ignored, with a count in the log
    return [d for name in sorted(docs) for d in docs[name]]


def run_prepare(src: Path, out: Path, ranks: Path, **kwargs):
    config = make_prepare_config(source="dir", input=str(src), out=out, ranks=ranks,
                                 workers=kwargs.pop("workers", 1), **kwargs)
    return prepare(config)


def split_documents(out: Path, split: str) -> list[list[int]]:
    tokens = np.concatenate([np.fromfile(out / s.file, dtype=np.uint16)
                             for s in load_meta(out).splits[split].shards]).tolist()
    assert tokens[-1] == EOT_TOKEN
    docs, current = [], []
    for t in tokens:
        if t == EOT_TOKEN:
            docs.append(current)
            current = []
        else:
            current.append(t)
    return docs


def test_prepare_counts_eot_meta_and_split(tmp_path, ranks, enc):
    docs = make_corpus(tmp_path / "src")
    meta = run_prepare(tmp_path / "src", tmp_path / "out", ranks, val_fraction=0.25, seed=3)
    out = tmp_path / "out"
    train, val = meta.splits["train"], meta.splits["val"]
    assert train.documents + val.documents == len(docs) == 13 and val.documents == round(13 * 0.25)
    assert meta.counts["documents_read"] == 13 and meta.counts["files_ignored"] == 1
    assert meta.encoding.ranks_sha256 == "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
    # Every document appears exactly once, in one split, tokenised exactly, followed by EOT.
    got = split_documents(out, "train") + split_documents(out, "val")
    assert sorted(map(tuple, got)) == sorted(tuple(enc.encode_ordinary(d)) for d in docs)
    for split in (train, val):
        for shard in split.shards:
            path = out / shard.file
            assert path.stat().st_size == 2 * shard.tokens and sha256_file(path) == shard.sha256
        assert split.tokens == sum(s.tokens for s in split.shards)
    on_disk = json.loads((out / "meta.json").read_text())
    assert on_disk["splits"]["val"]["tokens"] == val.tokens and on_disk["source"]["kind"] == "dir"
    # Same seed, same split; another seed, another split.
    again = run_prepare(tmp_path / "src", tmp_path / "out2", ranks, val_fraction=0.25, seed=3)
    other = run_prepare(tmp_path / "src", tmp_path / "out3", ranks, val_fraction=0.25, seed=4)
    assert again.splits["val"].shards[0].sha256 == val.shards[0].sha256
    assert other.splits["val"].shards[0].sha256 != val.shards[0].sha256


def test_shards_are_bounded_and_parallel_equals_serial(tmp_path, ranks):
    make_corpus(tmp_path / "src", n_txt=12, n_jsonl=30)
    serial = run_prepare(tmp_path / "src", tmp_path / "serial", ranks, shard_mb=400 / 2**20)
    parallel = run_prepare(tmp_path / "src", tmp_path / "parallel", ranks, shard_mb=400 / 2**20, workers=2)
    assert len(serial.splits["train"].shards) > 5
    assert serial.splits == parallel.splits
    assert serial.plan_sha256 == parallel.plan_sha256
    plan = json.loads((tmp_path / "serial" / ".progress" / "plan.json").read_text())
    chunks = {c["index"]: c for c in plan["chunks"]}
    for shard in serial.splits["train"].shards + serial.splits["val"].shards:
        chunk = chunks[int(shard.file.split("-")[1].split(".")[0])]
        assert chunk["n_docs"] == 1 or chunk["n_bytes"] <= 400  # only a lone large document exceeds the bound
        # A token covers at least one byte: at most the chunk's bytes plus one EOT per document.
        assert shard.tokens <= chunk["n_bytes"] + chunk["n_docs"]


def test_rerun_is_idempotent_and_max_chunks_resumes_exactly(tmp_path, ranks, caplog):
    make_corpus(tmp_path / "src", n_txt=10, n_jsonl=20)
    whole = run_prepare(tmp_path / "src", tmp_path / "whole", ranks, shard_mb=300 / 2**20)
    n_chunks = whole.counts["chunks"]
    assert n_chunks >= 4
    out = tmp_path / "parts"
    assert run_prepare(tmp_path / "src", out, ranks, shard_mb=300 / 2**20, max_chunks=2) is None
    assert not (out / "meta.json").exists()  # not complete, so nothing can mistake it for a data set
    with pytest.raises(DataPrepError, match="did not finish"):
        TokenDataset(out, "train")
    caplog.set_level("INFO", logger="data_prep")
    resumed = run_prepare(tmp_path / "src", out, ranks, shard_mb=300 / 2**20)
    assert f"2 of {n_chunks} chunks already done" in caplog.text
    assert resumed.splits == whole.splits
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.glob("*.bin")}
    caplog.clear()
    run_prepare(tmp_path / "src", out, ranks, shard_mb=300 / 2**20)
    assert "already prepared and verified" in caplog.text
    assert mtimes == {p.name: p.stat().st_mtime_ns for p in out.glob("*.bin")}


def test_killed_run_resumes_and_never_counts_a_partial_shard(tmp_path, ranks):
    make_corpus(tmp_path / "src", n_txt=40, n_jsonl=300)
    args = ["prepare", "--source", "dir", "--input", str(tmp_path / "src"), "--ranks", str(ranks),
            "--shard-mb", str(200 / 2**20), "--workers", "1"]
    assert cli_main(args + ["--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "data_prep", "-q"] + args + ["--out", str(out)], cwd=REPO)
    deadline = time.time() + 30
    while not list((out / ".progress").glob("chunk-*.json")) and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # What a kill can leave: a temp file, and a renamed shard whose manifest was never written.
    (out / ".train-999999.bin.tmp-1").write_bytes(b"\0" * 10)
    done = {p.stem.split("-")[1] for p in (out / ".progress").glob("chunk-*.json")}
    orphan = next((p for p in sorted(out.glob("train-*.bin")) if p.stem.split("-")[1] not in done), None)
    if orphan is not None:
        orphan.write_bytes(orphan.read_bytes()[:-2])  # truncated, and no manifest: must be redone
    assert cli_main(args + ["--out", str(out)]) == 0
    assert load_meta(out).splits == load_meta(tmp_path / "whole").splits
    assert not list(out.glob(".*.tmp-*"))


def test_verify_names_the_bad_shard_and_loader_refuses_it(tmp_path, ranks, capsys):
    make_corpus(tmp_path / "src", n_txt=8, n_jsonl=10)
    meta = run_prepare(tmp_path / "src", tmp_path / "out", ranks, shard_mb=300 / 2**20)
    out = tmp_path / "out"
    assert cli_main(["verify", str(out)]) == 0
    first, second = meta.splits["train"].shards[:2]
    data = bytearray((out / first.file).read_bytes())
    data[4] ^= 0xFF
    (out / first.file).write_bytes(bytes(data))  # same size, other content
    with open(out / second.file, "r+b") as f:
        f.truncate(second.tokens * 2 - 2)
    capsys.readouterr()
    assert cli_main(["verify", str(out)]) == 1
    report = capsys.readouterr().out
    assert f"BAD {first.file}: altered" in report and f"BAD {second.file}: truncated" in report
    assert cli_main(["verify", "--size-only", str(out)]) == 1
    with pytest.raises(DataPrepError, match=f"{first.file}: altered"):
        TokenDataset(out, "train")
    with pytest.raises(DataPrepError, match=f"{second.file}: truncated"):
        TokenDataset(out, "train", verify="size")
    # prepare rebuilds exactly the damaged shards.
    repaired = run_prepare(tmp_path / "src", out, ranks, shard_mb=300 / 2**20)
    assert repaired.splits == meta.splits and cli_main(["verify", str(out)]) == 0


def test_no_documents_is_an_error(tmp_path, ranks):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "readme.md").write_text("not a document")
    with pytest.raises(DataPrepError, match="found no documents.*1 other file"):
        run_prepare(tmp_path / "src", tmp_path / "out", ranks)
    (tmp_path / "src" / "a.txt").write_text("")
    (tmp_path / "src" / "b.txt").write_text("")
    with pytest.raises(DataPrepError, match="none with text.*2 empty"):
        run_prepare(tmp_path / "src", tmp_path / "out2", ranks)


def test_empty_documents_are_skipped_with_a_count(tmp_path, ranks):
    make_corpus(tmp_path / "src", n_txt=3, n_jsonl=2)
    (tmp_path / "src" / "a99.txt").write_text("")
    with open(tmp_path / "src" / "b.jsonl", "a") as f:
        f.write("\n")
    meta = run_prepare(tmp_path / "src", tmp_path / "out", ranks, val_fraction=0)
    assert meta.counts["empty_documents_skipped"] == 2
    assert meta.splits["train"].documents == meta.counts["documents_read"] - 2


def test_bad_utf8_is_an_error_or_replaced_with_a_count(tmp_path, ranks, capsys):
    make_corpus(tmp_path / "src", n_txt=3, n_jsonl=2)
    (tmp_path / "src" / "a01.txt").write_bytes(b"fine text \xff\xfe then more")
    with open(tmp_path / "src" / "b.jsonl", "ab") as f:
        f.write(b'{"text": "json with a bad byte \xc3 here"}\n')
    with pytest.raises(DataPrepError, match=r"a01.txt: not UTF-8 at position 10.*--on-bad-utf8 replace"):
        run_prepare(tmp_path / "src", tmp_path / "out", ranks)
    assert cli_main(["prepare", "--source", "dir", "--input", str(tmp_path / "src"), "--out",
                     str(tmp_path / "out_cli"), "--ranks", str(ranks)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    meta = run_prepare(tmp_path / "src", tmp_path / "out2", ranks, on_bad_utf8="replace", val_fraction=0)
    assert meta.counts["bad_utf8_documents_replaced"] == 2
    enc = gpt2_encoding(ranks)
    texts = [enc.decode(d) for d in split_documents(tmp_path / "out2", "train")]
    assert "fine text \ufffd\ufffd then more" in texts and "json with a bad byte \ufffd here" in texts


def test_missing_text_field_and_bad_settings_are_clear(tmp_path, ranks):
    make_corpus(tmp_path / "src", n_txt=1, n_jsonl=2)
    with pytest.raises(DataPrepError, match=r"c.parquet has no column 'body' \(columns: \['text'\]\).*--text-field"):
        run_prepare(tmp_path / "src", tmp_path / "out", ranks, text_field="body")
    (tmp_path / "src" / "c.parquet").unlink()
    with pytest.raises(DataPrepError, match=r"b.jsonl \(line at byte 0\) has no field 'body' \(it has \['text', 'id'"):
        run_prepare(tmp_path / "src", tmp_path / "out1", ranks, text_field="body")
    with pytest.raises(DataPrepError, match="--val-fraction: Input should be less than or equal to 0.5"):
        run_prepare(tmp_path / "src", tmp_path / "out", ranks, val_fraction=0.9)
    with pytest.raises(DataPrepError, match="is not a directory"):
        run_prepare(tmp_path / "nope", tmp_path / "out", ranks)


def test_resuming_with_other_settings_is_refused(tmp_path, ranks):
    make_corpus(tmp_path / "src", n_txt=2, n_jsonl=2)
    run_prepare(tmp_path / "src", tmp_path / "out", ranks, seed=1)
    with pytest.raises(DataPrepError, match="seed: was 1, now 2"):
        run_prepare(tmp_path / "src", tmp_path / "out", ranks, seed=2)
    (tmp_path / "src" / "new.txt").write_text("a new document")
    with pytest.raises(DataPrepError, match="input files changed"):
        run_prepare(tmp_path / "src", tmp_path / "out", ranks, seed=1)


def test_vocabulary_that_does_not_fit_uint16_is_refused(enc):
    check_fits_uint16(enc)
    wide = tiktoken.Encoding(name="wide", pat_str=enc._pat_str, mergeable_ranks=enc._mergeable_ranks,
                             special_tokens={"<|endoftext|>": 70000})
    with pytest.raises(DataPrepError, match="up to 70000.*uint16"):
        check_fits_uint16(wide)


def test_parquet_chunks_cut_inside_and_across_row_groups(tmp_path, ranks, enc):
    rows = [f"Row {i} " + "of parquet text " * (i % 4 + 1) for i in range(11)]
    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({"text": rows, "n": list(range(11))}), tmp_path / "src" / "rows.parquet", row_group_size=3)
    meta = run_prepare(tmp_path / "src", tmp_path / "out", ranks, shard_mb=90 / 2**20, val_fraction=0)
    assert len(meta.splits["train"].shards) >= 5
    assert split_documents(tmp_path / "out", "train") == [enc.encode_ordinary(r) for r in rows]


def test_concurrent_prepares_of_one_folder_wait_for_each_other(tmp_path, ranks):
    """As when every rank of a job prepares the demo corpus at once."""
    make_corpus(tmp_path / "src", n_txt=20, n_jsonl=200)
    args = [sys.executable, "-m", "data_prep", "-q", "prepare", "--source", "dir", "--input", str(tmp_path / "src"),
            "--out", str(tmp_path / "out"), "--ranks", str(ranks), "--shard-mb", str(500 / 2**20), "--workers", "1"]
    procs = [subprocess.Popen(args, cwd=REPO, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    assert [p.wait() for p in procs] == [0, 0], [p.stderr.read() for p in procs]
    assert cli_main(["verify", str(tmp_path / "out")]) == 0


def test_parallel_prepare_after_training_in_the_same_process(tmp_path, ranks):
    """Workers are not forked from a process whose thread pools may hold locks: a training run
    in the same process (torch's pools, tiktoken's) once left a forked worker waiting forever."""
    script = f"""
import torch
from launcher.config import build_run_config
from launcher.train import train
train(build_run_config({{"model": {{"preset": "micro"}}, "schedule": {{"warmup_steps": 1}},
      "train": {{"steps": 2, "micro_batch_size": 2}}, "eval": {{"every": 2, "batches": 1}},
      "tracking": {{"experiment": "fork-check", "system_metrics": False,
                    "tracking_uri": "sqlite:///{tmp_path / 'mlflow.db'}"}}}}))
torch.randn(256, 256) @ torch.randn(256, 256)
from pathlib import Path
from tests.test_data_prepare import make_corpus, run_prepare
make_corpus(Path({str(tmp_path / 'src')!r}), n_txt=6, n_jsonl=10)
meta = run_prepare(Path({str(tmp_path / 'src')!r}), Path({str(tmp_path / 'out')!r}), Path({str(ranks)!r}),
                   shard_mb=400 / 2**20, workers=2)
print("prepared", meta.splits["train"].tokens)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "prepared" in done.stdout
