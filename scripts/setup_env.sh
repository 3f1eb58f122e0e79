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
# The project itself, editable, so `python -m moss_tts…` and `python -m client…` run from .venv
# without PYTHONPATH. Offline and fast: no build isolation (torch already pulled setuptools into
# .venv), no dependencies (installed above); skipped while this checkout's pyproject.toml is the
# one installed.
if ! .venv/bin/python -c "
import json, sys
from importlib.metadata import distribution
from pathlib import Path
url = json.loads(distribution('moss-tts-triton').read_text('direct_url.json'))
same = Path('pyproject.toml').read_text() == Path('.venv/.installed-pyproject.toml').read_text()
sys.exit(0 if url['dir_info'].get('editable') and url['url'] == Path.cwd().as_uri() and same else 1)" 2>/dev/null; then
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
  cp pyproject.toml .venv/.installed-pyproject.toml
fi
scripts/setup_triton.sh
