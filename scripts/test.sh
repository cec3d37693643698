#!/usr/bin/env bash
# README command 2: set everything up from nothing, then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=1
exec .venv/bin/python -m pytest "$@"
