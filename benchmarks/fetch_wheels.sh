#!/usr/bin/env bash
# Wheels the GPU machine lacks, for benchmarks/train_throughput.py (its image has torch 2.11,
# triton 3.6, Python 3.12, pyyaml and typing-extensions, but not pydantic), into .whl/
# (git-ignored). With `--torchtitan`, also torchtitan 0.2.2 and the packages it needs there
# (benchmarks/torchtitan_anchor.sh). Run here (with network), then carry `.whl` to the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-/work/main/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
mkdir -p .whl
fetch() {
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "$@"
}
# the versions this repo's venv runs (pydantic 2.14 and its compiled core)
fetch pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
if [ "${1:-}" = "--torchtitan" ]; then
  # torchtitan 0.2.2 (Feb 2026, the release before torch 2.11; 0.3.0 pairs with torch 2.14).
  # Its needs missing on the GPU image: torchdata, datasets (+ dill, multiprocess), tomli,
  # tyro (+ docstring-parser, typeguard). The rest (tokenizers, tensorboard, einops, pillow,
  # fsspec, pyarrow, pandas, huggingface-hub, requests, tqdm, xxhash, aiohttp) is there.
  fetch torchtitan==0.2.2 torchdata==0.11.0 datasets==4.4.1 dill==0.4.0 multiprocess==0.70.18 \
    tomli==2.3.0 tyro==1.0.17 docstring-parser==0.17.0 typeguard==4.4.4
fi
ls -la .whl
du -sh .whl
