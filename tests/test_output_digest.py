"""tools/output_digest.py: two dumps compared bit for bit, and the errors it says (no GPU needed)."""
import subprocess
import sys

import torch

from tools.output_digest import CASES, compare

SCRIPT = "tools/output_digest.py"


def _dump(path, tweak=None):
    outputs = {str(case): [torch.full((2, 3), float(i)) for i in range(4)] for case in CASES}
    if tweak:
        outputs[str(CASES[0])][1][0, 0] += 1e-3
    torch.save({"sagebwd": "here", "outputs": outputs}, path)


def test_identical_dumps_pass_and_one_changed_element_fails(tmp_path, capsys):
    _dump(tmp_path / "a.pt")
    _dump(tmp_path / "b.pt")
    _dump(tmp_path / "c.pt", tweak=True)
    assert compare(str(tmp_path / "a.pt"), str(tmp_path / "b.pt")) == 0
    assert compare(str(tmp_path / "a.pt"), str(tmp_path / "c.pt")) == 1
    assert "dQ DIFFERS" in capsys.readouterr().out


def test_a_missing_dump_is_named():
    r = subprocess.run([sys.executable, SCRIPT, "compare", "missing-a.pt", "missing-b.pt"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "missing-a.pt: no such file" in r.stderr
