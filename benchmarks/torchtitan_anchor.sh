#!/usr/bin/env bash
# torchtitan 0.2.2's Llama trainer on gpu-124m's shape (seq 4096, 4 sequences = 16,384 tokens
# per step, bf16 autocast, one GPU, compiled), offline; prints its tokens/s (tps) and MFU.
# On the GPU machine, with `.whl` carried (benchmarks/fetch_wheels.sh --torchtitan, 4.5 MB):
#   bash benchmarks/torchtitan_anchor.sh [STEPS] [extra torchtitan flags]
# Compare its steady `tps` with benchmarks/train_throughput.py's gpu-124m@4096x4 rows.
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-40}"; shift || true
if [ -d .whl ] && ! python3 -c "import torchtitan" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
python3 -c "import torch, torchtitan; print('torch', torch.__version__, 'torchtitan', torchtitan.__version__)"
exec torchrun --standalone --nproc_per_node=1 benchmarks/torchtitan_anchor.py \
  --model.name llama3 --model.flavor sagebwd_124m \
  --training.seq_len 4096 --training.local_batch_size 4 --training.steps "$STEPS" \
  --training.mixed_precision_param bfloat16 \
  --lr_scheduler.warmup_steps 10 --optimizer.lr 6e-4 --optimizer.implementation fused \
  --activation_checkpoint.mode none \
  --compile.enable --compile.components model,loss \
  --metrics.log_freq 10 --checkpoint.no-enable \
  --job.dump_folder /tmp/tt-anchor/out "$@"
