#!/usr/bin/env bash
# Creates ./.venv and installs the suite with its test extras; fetches the offline assets
# (GPT-2 ranks, demo corpus). Idempotent: a second run only checks the stamp.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
stamp="$VENV/.installed-$(sha256sum setup.cfg pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[setup] creating $VENV and installing the suite (about 1.5 min on 2 cores)"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e '.[test]'
  rm -f "$VENV"/.installed-*
  touch "$stamp"
else
  echo "[setup] $VENV is up to date"
fi
# Offline assets: GPT-2 BPE ranks (checked by sha256) and the demo corpus.
"$VENV/bin/python" -m data_prep fetch-assets
