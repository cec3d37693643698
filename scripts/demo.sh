#!/usr/bin/env bash
# README command 1: set everything up from nothing, then run the FPA vs SageBwd demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=1
exec .venv/bin/python -m experiments.demo "$@"
