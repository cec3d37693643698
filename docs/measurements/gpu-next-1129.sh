# The next GPU session's first calls, prepared in the twenty-second (2026-11-29; none run yet). From the repository
# root:
#   run(command="bash docs/measurements/gpu-next-1129.sh pairs", carry=[".whl", ".cache"])   two more trainer pairs
#     (on main; `bash ../shared/device/fetch_wheels.sh` first; the twenty-second session's two pairs are
#     trainer-pairs-h200-1128l.json, `python -m benchmarks.pairs --combine` joins them)
#   run(command="bash docs/measurements/gpu-next-1129.sh defer-dk")   where the deferred dK product's race begins
#     (after `git apply docs/measurements/trial-token-dkdv-defer-dk16.patch` here: the device copies the tree)
set -u
case "${1:-}" in
  pairs)
    bash docs/measurements/gpu-calls-h200-1128l.sh pairs trainer-pairs-h200-next ;;
  defer-dk)   # one small causal fwd+bwd per sequence length, each in its own process (a failure poisons the
    # process's CUDA context); 256 passed and 1024 failed in the twenty-second session
    for n in 384 512 640 768; do
      timeout 60 python3 -c "
import torch
from sagebwd.triton import attention
q, k, v, do = [torch.randn(1, 2, $n, 64, device='cuda').bfloat16() for _ in range(4)]
q, k, v = [t.requires_grad_() for t in (q, k, v)]
o = attention(q, k, v, True, True, False, 128, 64, 'token')
torch.autograd.grad(o, (q, k, v), do)
torch.cuda.synchronize()
print('seq $n: ok')" 2>&1 | tail -1
    done ;;
  *) echo "usage: bash $0 pairs|defer-dk" >&2; exit 2 ;;
esac
