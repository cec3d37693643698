"""The kernels compiled for Hopper (sm_90) on this CPU machine, with the launch settings the GPU
path would use: the INT8 dots must be wgmma (s8), never an mma.sync fallback, and every
default must fit an H100/H200's shared memory without the launcher's fewer-stages retry.
Register and spill counts are printed (they move with the Triton version; the GPU benchmark is
where their cost is measured)."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from sagebwd.triton import offline  # noqa: E402

HOPPER_SHARED_BYTES = 232448   # per block, opt-in maximum of H100 and H200


@pytest.mark.parametrize("head_dim,blocks", [(64, (128, 64)), (128, (128, 64)), (128, (128, 128)), (64, (64, 64))])
def test_kernels_compile_to_int8_wgmma_and_fit_hopper(head_dim, blocks):
    rows = offline.report((head_dim,), arch=90, seq=1024, blocks=blocks)
    by_kernel = {r["kernel"]: r for r in rows}
    for r in rows:
        print(r["kernel"], {k: r[k] for k in ("regs", "spill_bytes", "shared", "num_warps", "num_stages",
                                              "wgmma_s8", "wgmma_16bit", "mma_sync")})
    assert {"quantize", "forward", "backward_preprocess", "dq", "dkdv"} <= set(by_kernel)
    for name in ("forward", "dq", "dkdv"):
        assert by_kernel[name]["wgmma_s8"] > 0, f"{name}: INT8 dots did not compile to wgmma"
        assert by_kernel[name]["mma_sync"] == 0, f"{name}: an mma.sync fallback is in the PTX"
    for name in ("dq", "dkdv"):   # dP = dO V^T stays 16-bit on the tensor cores
        assert by_kernel[name]["wgmma_16bit"] > 0
    for r in rows:
        assert r["shared"] <= HOPPER_SHARED_BYTES, f"{r['kernel']} needs {r['shared']} B of shared memory"


@pytest.mark.parametrize("argv,message", [(["--head-dim", "96"], "head_dim 64 or 128"),
                                          (["--blocks", "128", "48"], "BLOCK_KV=48"),
                                          (["--arch", "80"], "Hopper")])
def test_offline_cli_rejects_what_the_kernels_do_not_take(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        offline.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
