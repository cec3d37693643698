"""The numbers behind tests/test_distributed.py's BF16_Optimizer tolerances (twenty-fifth session, 2026-11-29, this
2-core CPU machine, gloo): the loss and pre-clip grad norm curves of bf16 runs with fp32 gradient accumulation
(DeepSpeed's BF16_Optimizer) as one process, DP=2 and SP=2, of one process on half the batch (what a rank's share of
the gradient left out would look like), and of the default ZeRO-1 optimizer for comparison.

    PYTHONPATH=. python docs/measurements/bf16-optimizer-worlds-cpu.py      (about 5 min; prints one line a run)

Printed that day: the DP=2 and SP=2 losses within 3e-5 relative of one process's, grad norms within 2e-3; half the
batch moved the norm by 27-49% per step.
"""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.test_distributed import curves, run_world  # noqa: E402

FP32_ACC = ["--set", "train.precision=bf16", "--set", "train.grad_accum_dtype=fp32"]
RUNS = [(1, "one-process", ["--set", "train.micro_batch_size=4", *FP32_ACC]),
        (2, "dp2", ["--set", "train.micro_batch_size=2", *FP32_ACC]),
        (2, "sp2", ["--set", "train.micro_batch_size=4", "--set", "parallel.sp=2", *FP32_ACC]),
        (1, "half-batch", ["--set", "train.micro_batch_size=2", "--set", "train.tokens_per_step=128", *FP32_ACC]),
        (1, "zero1-default", ["--set", "train.micro_batch_size=4", "--set", "train.precision=bf16"])]

if __name__ == "__main__":
    store = Path(tempfile.mkdtemp(prefix="bf16-worlds-"))
    ref = None
    for n, name, extra in RUNS:
        run_world(n, name, store, extra)
        c = curves(store, name)
        loss, norm = [v for _, v in c["loss"]], [v for _, v in c["grad_norm"]]
        ref = ref or (loss, norm)
        worst_loss = max(abs(a / b - 1) for a, b in zip(loss, ref[0]))
        worst_norm = max(abs(a / b - 1) for a, b in zip(norm, ref[1]))
        print(f"{name}: loss {[round(v, 5) for v in loss]} grad norm {[round(v, 4) for v in norm]}; against one "
              f"process: loss {worst_loss:.1e}, grad norm {worst_norm:.1e} (largest relative)", flush=True)
