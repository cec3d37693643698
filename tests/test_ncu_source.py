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
