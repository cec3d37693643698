"""tools/host_profile.py on the CPU: the op's own host path to its sm90 launches (recorded, not run),
profiled per stage; bad arguments refused with the fix."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("triton")
from tools import host_profile  # noqa: E402


@pytest.mark.skipif(__import__("torch").cuda.is_available(),
                    reason="the CPU path (Triton's launcher stubbed); on CUDA the tool times the GPU path, "
                           "tested below")
@pytest.mark.parametrize("quant", ["token", "block"])
def test_cpu_profile_reports_the_launches_and_stages(tmp_path, capsys, quant):
    out = tmp_path / "host.json"
    assert host_profile.main(["--quant", quant, "--shape", "1,2,256,64", "--calls", "2", "--top", "5",
                              "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    # d=64 on sm90: one quantise launch, the forward, the preprocess, dQ and the one-launch dK/dV
    assert report["launches"] == ["quantize", "forward", "backward_preprocess", "dq", "dkdv"]
    assert report["device"].startswith("cpu") and report["host_ms_per_call"] > 0
    stages = report["stages_ms"]
    assert stages["backward (preprocess + dQ + dK/dV)"] > stages["TMA descriptors (Gluon)"] > 0
    assert len(report["top"]) == 5
    # the autograd paths with Triton's launcher stubbed: eager, the custom ops, and compiled (aot_eager)
    assert len(report["breakdown_ms"]) == 3 and all(ms > 0 for ms in report["breakdown_ms"].values())
    text = capsys.readouterr().out
    assert f"{quant} contract, causal fwd+bwd at (1, 2, 256, 64)" in text and "| TMA descriptors (Gluon) |" in text


@pytest.mark.parametrize("argv, message", [
    (["--shape", "1,2,256"], "--shape takes B,H,N,D"),
    (["--shape", "1,2,200,64"], "a multiple of 128"),
    (["--shape", "1,2,256,96"], "head dim 64 or 128"),
    (["--calls", "0"], "at least 1"),
    (["--busy-ms", "-1"], "0 or more"),
    (["--busy-ms", "soon"], "a number of milliseconds"),
])
def test_bad_arguments_say_what_to_fix(argv, message, capsys):
    with pytest.raises(SystemExit):
        host_profile.main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_launch_costs_name_every_launch_and_none_goes_through_the_jit():
    """On CUDA, after warm-up every launch of a fwd+bwd is timed by its name and goes to its compiled kernel
    directly: no JITFunction.run row (launch.launch's direct path)."""
    costs = host_profile.launch_costs((1, 2, 256, 64), "token", calls=3)
    for name in ("quantize", "forward", "backward_preprocess", "dq", "dkdv"):
        assert costs[f"launch {name}"] > 0
    assert costs["launch signatures (launch.launch_signature)"] > 0
    assert not [name for name in costs if name.startswith("JITFunction.run")], costs
    busy = host_profile.busy_breakdown((1, 2, 256, 64), "token", calls=2, busy_ms=5.0)
    assert set(busy) == set(host_profile.breakdown_calls((1, 2, 256, 64), "token")) and min(busy.values()) > 0


def test_host_ms_runs_the_before_hook_untimed_before_every_call():
    """benchmarks.attention.host_ms's `before` (host_profile's busy GPU) runs once before each timed call."""
    from benchmarks.attention import host_ms
    order = []
    assert host_ms(lambda: order.append("call"), n=4, repeats=2, before=lambda: order.append("before")) >= 0
    assert order == ["call"] * 3 + ["before", "call"] * 8   # three warm-up calls, then 2 x 4 timed
