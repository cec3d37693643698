"""tools.ncu_source attributes ncu's warp-state samples to SASS instructions (the source page's CSV).

The fixture is an excerpt of a real profile: the token dQ at (4,12,4096,64) on an H100 before s_K was
read ahead of the tile's products, where S's first multiplies wait on that shared-memory read, and one
of the producer's idle NOPs."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools import ncu_source

FIXTURE = Path(__file__).parent / "golden" / "ncu-source-dq-token-h100.csv"


def test_the_short_scoreboard_wait_is_found_at_its_multiply():
    s = ncu_source.summary(ncu_source.read(str(FIXTURE)), top=3)
    assert s["kernel"] == "_dq_kernel"
    assert max(s["reasons"], key=s["reasons"].get) == "short_sb"
    assert s["reason_opcodes"]["short_sb"] == {"FMUL": pytest.approx(s["reasons"]["short_sb"])}
    hottest = s["hottest"][0]
    assert hottest["source"] == "FMUL R104, R90, R83" and hottest["reasons"]["short_sb"] > 0.95
    assert sum(s["reasons"].values()) == pytest.approx(1.0)
    table = ncu_source.markdown(s)
    assert "| short_sb | 83.6% | FMUL 83.6% |" in table and "`FMUL R104, R90, R83`" in table


def test_idle_lines_are_left_out_unless_asked_for():
    busy = ncu_source.read(str(FIXTURE))
    everything = ncu_source.read(str(FIXTURE), include_idle=True)
    assert all(line["opcode"] != "NOP" for line in busy["lines"])
    nops = [line for line in everything["lines"] if line["opcode"] == "NOP"]
    assert len(nops) == 1 and nops[0]["reasons"]["barrier"] > 0
    assert len(everything["lines"]) == len(busy["lines"]) + 1


def test_opcode_skips_the_predicate():
    assert ncu_source.opcode("@!P0  BRA 0x7f3d2f8222d0") == "BRA"
    assert ncu_source.opcode("      FFMA R1, R2, R3, -R4") == "FFMA"


def test_a_details_page_or_a_profile_without_samples_says_what_to_do(tmp_path, capsys):
    details = tmp_path / "details.csv"
    details.write_text('"ID","Process ID","Kernel Name"\n"0","1","_dq_kernel"\n')
    with pytest.raises(SystemExit):
        ncu_source.main([str(details)])
    assert "--page source --csv --print-source sass" in capsys.readouterr().err
    unsampled = tmp_path / "unsampled.csv"
    unsampled.write_text('"Kernel Name","_dq_kernel",\n"Address","Source","Instructions Executed"\n'
                         '"0x1","FFMA R1, R2, R3, R4","8"\n')
    with pytest.raises(SystemExit):
        ncu_source.main([str(unsampled)])
    assert "--section SourceCounters" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ncu_source.main([str(FIXTURE), "--top", "0"])
    assert "--top must be at least 1" in capsys.readouterr().err


def test_consumers_groups_a_waiting_opcode_by_what_reads_its_result(tmp_path, capsys):
    """--consumers FFMA short_sb: each FFMA's short-scoreboard samples go to the opcode of the first later
    instruction that reads its destination register (modifiers, negation and |abs| stripped), here an FMUL for one
    and an exp2 for the other, as in the token dK/dV's Y^T and P^T (docs/kernel-notes.md, "Fourteenth session")."""
    csv = tmp_path / "dkdv.csv"
    rows = [("0x10", "FFMA R1, R2, R3, -R4", 10, 10), ("0x20", "FMUL R5, R6, R7", 3, 0),
            ("0x30", "FMUL R8, R1.reuse, R9", 2, 0), ("0x40", "FFMA R10, R2, R3, -R4", 5, 5),
            ("0x50", "MUFU.EX2 R11, |R10|", 4, 0), ("0x60", "FFMA R12, R2, R3, R4", 6, 0)]
    csv.write_text('"Kernel Name","_dkdv_ws_kernel",\n'
                   '"Address","Source","Warp Stall Sampling (All Samples)","stall_short_sb","stall_selected"\n'
                   + "".join(f'"{a}","{src}","{n}","{sb}","{n - sb}"\n' for a, src, n, sb in rows))
    profile = ncu_source.read(str(csv))
    assert ncu_source.destination("@P0 FFMA R1, R2, R3, -R4") == "R1" and ncu_source.destination("BAR.SYNC 0x0") is None
    assert ncu_source.consumers(profile, "FFMA", "short_sb") == {"FMUL": pytest.approx(10 / 30),
                                                                "MUFU.EX2": pytest.approx(5 / 30)}
    assert ncu_source.main([str(csv), "--consumers", "FFMA", "short_sb"]) == 0
    assert "| FMUL | 33.3% |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ncu_source.main([str(csv), "--consumers", "FMUL", "short_sb"])
    assert "no FMUL line has short_sb samples" in capsys.readouterr().err


def test_a_kept_profile_is_read_compressed(tmp_path):
    import gzip
    packed = tmp_path / "dq.csv.gz"
    packed.write_bytes(gzip.compress(FIXTURE.read_bytes()))
    assert ncu_source.read(str(packed)) == ncu_source.read(str(FIXTURE))
