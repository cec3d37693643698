#!/usr/bin/env bash
# Wheels of the benchmark's optional columns (benchmarks/attention.py, benchmarks/baselines.py)
# for the GPU machine (Python 3.12, manylinux x86-64, no package index). Run here, with network,
# from anywhere in the repository:
#   bash benchmarks/fetch_baseline_wheels.sh          CUDNN-FP8: nvidia-cudnn-frontend into .whl/
#                                                     (git-ignored; 11.6 MB for 1.32.0)
#   bash benchmarks/fetch_baseline_wheels.sh --fa4    also FA4: runs ../shared/device/fetch_cute_wheels.sh
#                                                     (flash-attn-4 4.0.0b36 and CuTe DSL, into .cute1 and
#                                                     .cute2, which travel in two calls: docs/benchmarks.md)
# The frontend (Python package `cudnn`) loads the cuDNN 9 library of the machine's torch
# (nvidia-cudnn-cu13) and imports cuda-bindings, both in the GPU image; its declared needs
# nvidia-cutlass-dsl and apache-tvm-ffi come with FA4's wheels and are not used by the FP8 graphs.
# CUDNN_FRONTEND_VERSION=1.31.0 picks another release.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
VERSION="${CUDNN_FRONTEND_VERSION:-1.32.0}"
mkdir -p .whl
rm -f .whl/nvidia_cudnn_frontend-*.whl   # one version: two stop the install
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "nvidia-cudnn-frontend==$VERSION"
ls -la .whl/nvidia_cudnn_frontend-*.whl
if [ "${1:-}" = "--fa4" ]; then
  [ -f ../shared/device/fetch_cute_wheels.sh ] || { echo "../shared/device/fetch_cute_wheels.sh not found" >&2; exit 1; }
  bash ../shared/device/fetch_cute_wheels.sh
fi
