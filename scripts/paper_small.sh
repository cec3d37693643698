#!/usr/bin/env bash
# The paper's grid at small scale on one GPU node (issue 25, docs/results.md), end to end:
#   1. the LR ladder (paper-small-lr.yaml), FPA at 128k tokens/step, runs side by side;
#   2. the LR it picks (experiments.lr_ladder) written into base/paper-small.yaml;
#   3. the grid (paper-small.yaml: Figure 1 with 3 seeds, the smoothing ablation, the token
#      contract), runs side by side;
#   4. Table 2: layer 7 of the two 128k K-smoothing s0 checkpoints (QK-norm on and off),
#      captured and traced;
#   5. the comparisons of the ladder and the grid (tables, PNGs, report.md under runs/compare/).
# Usage, from the repository root of a GPU node with the suite installed and the corpus in
# .cache/data/pd-english (`python -m data_prep prepare-corpus pd-english`; copy it over if the
# node has no network):
#   bash scripts/paper_small.sh            # NODE=h100-1 PARALLEL=5 by default
# Everything is logged to the MLflow store the trainer uses ($MLFLOW_TRACKING_URI, else
# .cache/mlflow.db); each run's output is in runs/<manifest>/<run>/local.log.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
NODE="${NODE:-h100-1}"
PARALLEL="${PARALLEL:-5}"   # 5 x ~12 GB fit an 80 GB H100; 7 ran out of memory
OUT="${RESULTS_DIR:-runs/paper-small-results}"
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=1
mkdir -p "$OUT"
stage() { echo "[paper_small] $(date -u +%H:%M:%S) $*"; }

[ -f .cache/data/pd-english/meta.json ] || "$PY" -m data_prep prepare-corpus pd-english

stage "1/5 the LR ladder"
"$PY" -m experiments run paper-small-lr --node "$NODE" --parallel "$PARALLEL" --keep-going || true
stage "2/5 the LR"
"$PY" -m experiments.lr_ladder --manifest paper-small-lr --node "$NODE" --write | tee "$OUT/lr-ladder.md"

stage "3/5 the grid"
"$PY" -m experiments run paper-small --node "$NODE" --parallel "$PARALLEL" --keep-going || true

stage "4/5 Table 2 (layer 7 of the 128k K-smoothing s0 runs)"
for qk in qknorm noqknorm; do
  run="runs/paper-small/paper-small-tps128k-sagebwd-$qk-k-s0"
  norm=$([ "$qk" = qknorm ] && echo true || echo false)
  "$PY" -m launcher.capture --config experiments/manifests/base/paper-small.yaml \
    --set model.attention=sagebwd --set model.smoothing=k --set model.qk_norm="$norm" \
    --checkpoint "$run/checkpoints" --layer 7 --out "$run/layer7.pt"
  "$PY" -m sagebwd.trace tensors --input "$run/layer7.pt" --causal | tee "$OUT/table2-$qk.md"
done

stage "5/5 the comparisons"
"$PY" -m experiments compare --manifest paper-small-lr --node "$NODE" --out "$OUT/lr-ladder"
"$PY" -m experiments compare --manifest paper-small --node "$NODE" --out "$OUT/grid"
stage "done: $OUT"
