#!/usr/bin/env bash
# Idempotent environment set-up: .venv/ with the pinned requirements. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import sys; sys.exit(0 if open('requirements.txt').read() == open('.venv/.installed-requirements').read() else 1)" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  cp requirements.txt .venv/.installed-requirements
fi
scripts/setup_triton.sh
