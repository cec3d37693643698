"""tools.ncu_stalls reads ncu's --csv metrics output (one row per metric) into a table."""
from __future__ import annotations

import pytest

from tools import ncu_stalls

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _row(launch, kernel, metric, value):
    return (f'"{launch}","541","python3.12","host","{kernel}","1","7","(128, 1, 1)","(64, 128, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","inst","{value}"')


def test_stall_table_per_launch(tmp_path):
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    lines = ["==PROF== Connected to process 541", "some stdout of the profiled program", HEADER,
             _row(0, "_dkdv_kernel", stall.format("wait"), "0.80"),
             _row(0, "_dkdv_kernel", stall.format("long_scoreboard"), "0.77"),
             _row(0, "_dkdv_kernel", stall.format("selected"), "1.00"),
             _row(0, "_dkdv_kernel", "sm__inst_issued.avg.pct_of_peak_sustained_active", "50.0"),
             _row(0, "_dkdv_kernel", "sm__warps_active.avg.per_cycle_active", "7.9"),
             _row(1, "_dq_kernel", stall.format("barrier"), "0.85"),
             _row(1, "_dq_kernel", stall.format("gmma"), "n/a")]
    path = tmp_path / "ncu.csv"
    path.write_text("\n".join(lines) + "\n")
    launches = ncu_stalls.read(str(path))
    assert [x["kernel"] for x in launches] == ["_dkdv_kernel", "_dq_kernel"]
    assert launches[0]["stalls"] == {"wait": 0.80, "long_scoreboard": 0.77, "selected": 1.00}
    assert launches[0]["issue_pct"] == 50.0 and launches[0]["warps_per_sm"] == 7.9
    table = ncu_stalls.markdown(launches, top=2)
    assert "| _dkdv_kernel | (64, 128, 1) | (128, 1, 1) | 50.0% | 7.9 | 2.57 | selected 1.00, wait 0.80 |" in table
    assert "barrier 0.85" in table.splitlines()[-1]


def test_not_an_ncu_csv_says_so(tmp_path, capsys):
    path = tmp_path / "report.txt"
    path.write_text("Section: GPU Speed Of Light Throughput\n")
    with pytest.raises(SystemExit) as exit_info:
        ncu_stalls.main([str(path)])
    assert exit_info.value.code == 2
    assert "no ncu CSV header" in capsys.readouterr().err
